"""``deep_ep.utils.envs``: process-group set-up, seeds and printing for DeepEP's scripts.

``init_dist`` is DeepEP's (contract 14.1) on ``gloo``: the default device stays the CPU.  Seeds
follow DeepEP: the local seed is the global seed plus the rank (rank 0 when no process group is
initialised, e.g. the in-process form, whose ranks are threads).
"""

from __future__ import annotations

import os
import random
from typing import Any

__all__ = ["init_dist", "init_seed", "get_global_seed", "get_local_seed", "dist_print"]

_local_rank: int | None = None
_local_seed = 0
_global_seed = 0


def _dist() -> Any:
    """``torch.distributed`` when torch is installed and a process group is initialised, else None."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    return dist if dist.is_available() and dist.is_initialized() else None


# Note: without a process group (the in-process form) the rank of the seeds is 0.
def init_seed(global_seed: int) -> None:
    """Seed ``random`` (and torch, when installed) with ``global_seed + rank``."""
    global _local_seed, _global_seed
    dist = _dist()
    _local_seed = int(global_seed) + (dist.get_rank() if dist is not None else 0)
    _global_seed = int(global_seed)
    random.seed(_local_seed)
    try:
        import torch
    except ImportError:
        return
    torch.manual_seed(_local_seed)


def get_local_seed() -> int:
    """The local seed (global seed + rank)."""
    return _local_seed


def get_global_seed() -> int:
    """The global seed."""
    return _global_seed


def dist_print(s: str = "", once_in_node: bool = False) -> None:
    """Print ``s`` (with ``once_in_node``, only local rank 0 prints), then a barrier of the default
    process group when one is initialised."""
    if not once_in_node or (_local_rank or 0) == 0:
        print(s, flush=True)
    dist = _dist()
    if dist is not None:
        dist.barrier()


def init_dist(local_rank: int, num_local_ranks: int, seed: int = 0) -> tuple[int, int, Any]:
    """Initialise the default process group on gloo from ``MASTER_ADDR`` (127.0.0.1),
    ``MASTER_PORT`` (8361), ``WORLD_SIZE`` (nodes, 1) and ``RANK`` (node, 0); set the default
    dtype to bf16 and the seeds; returns ``(rank, world size, a group of every rank)``."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError as e:  # pragma: no cover - exercised only without torch
        raise ImportError("init_dist: needs torch (torch.distributed with the gloo backend)") from e
    global _local_rank
    ip = os.getenv("MASTER_ADDR", "127.0.0.1")
    port = int(os.getenv("MASTER_PORT", "8361"))
    num_nodes = int(os.getenv("WORLD_SIZE", 1))
    node_rank = int(os.getenv("RANK", 0))
    _local_rank = local_rank
    # Note: gloo instead of NCCL and no device_id; the default device stays the CPU (contract 14.1).
    dist.init_process_group(backend="gloo", init_method=f"tcp://{ip}:{port}", world_size=num_nodes * num_local_ranks,
                            rank=node_rank * num_local_ranks + local_rank)
    torch.set_default_dtype(torch.bfloat16)
    init_seed(seed)
    return dist.get_rank(), dist.get_world_size(), dist.new_group(list(range(num_local_ranks * num_nodes)))
