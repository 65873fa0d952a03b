"""``deepgemm_ref.utils.dist``: DeepGEMM's distributed helpers.

The emulator runs every expert-parallel rank in one process, so there is no process group to
initialise or gather over; ``init_dist`` and ``uneven_all_gather`` raise ``NotImplementedError``
saying so (see ``deepgemm_ref.mega_moe`` for the emulated groups).
"""

from __future__ import annotations

from typing import Any

__all__ = ["init_dist", "uneven_all_gather", "dist_print"]


def init_dist(local_rank: int, num_local_ranks: int) -> Any:
    """Not implemented: multi-process NCCL initialisation is not emulated."""
    raise NotImplementedError(
        "init_dist: multi-process NCCL initialisation is not emulated; deepgemm_ref runs every "
        "expert-parallel rank in one process (see deepgemm_ref.mega_moe)"
    )


def uneven_all_gather(tensor: Any, dim: int = 0, group: Any = None) -> Any:
    """Not implemented: there is no process group to gather over."""
    raise NotImplementedError(
        "uneven_all_gather: there is no torch.distributed process group in the emulator; every "
        "rank's tensors live in one process"
    )


def dist_print(s: str = "", once_in_node: bool = False) -> None:
    """Print ``s`` (one process holds every rank, so there is no barrier)."""
    print(s, flush=True)
