"""The default ``torch.distributed`` process group of one rank per process (gloo on a CPU machine).

What DeepGEMM's and DeepGEMM-Ascend's ``init_dist`` share (``deepgemm_ref.utils.dist.init_dist``,
``deepgemm_ref.testing.envs.init_dist``): the rendezvous from the environment, checked before
anything starts, and ``dist_print``, which both export.  torch is imported when a function runs.
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import arg_error

__all__ = ["process_group_from_env", "dist_print", "torch_dist"]

#: The local rank given to the last ``init_dist`` of this process (None before).
_local_rank: int | None = None


def torch_dist(func: str) -> tuple[Any, Any]:
    """``(torch, torch.distributed)``, imported now; ImportError naming ``func`` without them."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError as e:  # pragma: no cover - exercised only without torch
        raise ImportError(f"{func}: needs torch (torch.distributed with the gloo backend)") from e
    if not dist.is_available():  # pragma: no cover - torch builds without distributed support
        raise ImportError(f"{func}: this torch build has no torch.distributed")
    return torch, dist


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _env_int(func: str, name: str, default: str, lo: int, hi: int | None = None) -> int:
    """The integer environment variable ``name`` (``default`` when unset), in ``[lo, hi)``."""
    text = os.getenv(name, default)
    try:
        v = int(text)
    except ValueError:
        v = None
    if v is None or v < lo or (hi is not None and v >= hi):
        span = f"an integer >= {lo}" if hi is None else f"an integer in [{lo}, {hi})"
        raise arg_error(func, f"environment variable {name}", span, repr(text))
    return v


def process_group_from_env(func: str, local_rank: int, num_local_ranks: int) -> tuple[Any, int, int]:
    """Check ``local_rank`` / ``num_local_ranks`` and the environment, then initialise the default
    process group on gloo; returns ``(torch.distributed, global rank, world size)``.

    ``MASTER_ADDR`` (default ``127.0.0.1``) and ``MASTER_PORT`` (8361) give the TCP rendezvous,
    ``WORLD_SIZE`` the number of nodes (1) and ``RANK`` this node's index (0); the world is
    ``nodes * num_local_ranks`` ranks and this process is rank ``node * num_local_ranks +
    local_rank``.  Shared by DeepGEMM's and DeepGEMM-Ascend's ``init_dist``.
    """
    global _local_rank
    if not _is_int(num_local_ranks) or num_local_ranks <= 0:
        raise arg_error(func, "num_local_ranks", "a positive int", repr(num_local_ranks))
    if not _is_int(local_rank) or not 0 <= local_rank < num_local_ranks:
        raise arg_error(func, "local_rank", f"an int in [0, num_local_ranks) = [0, {num_local_ranks})",
                        repr(local_rank))
    ip = os.getenv("MASTER_ADDR", "127.0.0.1")
    port = _env_int(func, "MASTER_PORT", "8361", 1, 65536)
    num_nodes = _env_int(func, "WORLD_SIZE", "1", 1)
    node_rank = _env_int(func, "RANK", "0", 0, num_nodes)
    _, dist = torch_dist(func)
    _local_rank = local_rank
    # Note: gloo instead of NCCL, and no device_id: the emulator's tensors live on the CPU, so the
    # collectives are CPU ones (contract 14.1); the default device is left as it is.
    dist.init_process_group(backend="gloo", init_method=f"tcp://{ip}:{port}", world_size=num_nodes * num_local_ranks,
                            rank=node_rank * num_local_ranks + local_rank)
    return dist, num_nodes * num_local_ranks, node_rank * num_local_ranks + local_rank


def dist_print(s: str = "", once_in_node: bool = False) -> None:
    """Print ``s`` (with ``once_in_node``: only on local rank 0), then wait at a barrier of the default group.

    As DeepGEMM's, every rank calls it (the barrier is collective).  The local rank is the one
    given to ``init_dist`` (``deepgemm_ref.utils.dist`` or ``deepgemm_ref.testing.envs``); for a
    group initialised otherwise it is ``LOCAL_RANK`` from the environment, else the global rank.
    Without an initialised process group it only prints.
    """
    dist: Any = None
    try:
        import torch.distributed as _dist
    except ImportError:  # pragma: no cover - exercised only without torch
        pass
    else:
        if _dist.is_available() and _dist.is_initialized():
            dist = _dist
    if dist is None:
        # Note: without a process group (one process, no init_dist) dist_print just prints, where
        # DeepGEMM asserts that init_dist ran and calls a barrier.
        print(s, flush=True)
        return
    local = _local_rank if _local_rank is not None else int(os.getenv("LOCAL_RANK", dist.get_rank()))
    if not once_in_node or local == 0:
        print(s, flush=True)
    dist.barrier()
