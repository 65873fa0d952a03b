"""``deepgemm_ref.utils.dist``: DeepGEMM's distributed helpers.

The emulator runs every expert-parallel rank in one process, so there is no process group to
initialise or gather over; ``init_dist`` and ``uneven_all_gather`` raise ``NotImplementedError``
saying so (``deepgemm_ref.mega.EmulatedGroup`` holds every rank of a Mega MoE call instead).
"""

from __future__ import annotations

from typing import Any

from ..api import not_implemented

__all__ = ["init_dist", "uneven_all_gather", "dist_print"]


@not_implemented("multi-process NCCL initialisation is not emulated; deepgemm_ref runs every expert-parallel "
                 "rank in one process (use deepgemm_ref.mega.EmulatedGroup(num_ranks).rank(r) as the group)")
def init_dist(local_rank: int, num_local_ranks: int) -> Any:
    """Not implemented: multi-process NCCL initialisation is not emulated."""


@not_implemented("there is no torch.distributed process group in the emulator; every rank's tensors live in "
                 "one process")
def uneven_all_gather(tensor: Any, dim: int = 0, group: Any = None) -> Any:
    """Not implemented: there is no process group to gather over."""


def dist_print(s: str = "", once_in_node: bool = False) -> None:
    """Print ``s`` (one process holds every rank, so there is no barrier)."""
    print(s, flush=True)
