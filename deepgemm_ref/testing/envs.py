"""DeepGEMM-Ascend's ``deep_gemm.testing.envs``: seeding and distributed set-up helpers.

``init_dist`` is DeepGEMM-Ascend's on gloo (one rank per process; the default device stays the
CPU); ``dist_print`` is :func:`deepgemm_ref.utils.dist.dist_print` (the same function) (DeepGEMM-Ascend moved it here
from ``deep_gemm.utils.dist``).  torch is imported when they run.
"""

from __future__ import annotations

import random
import sys
from typing import Any

import numpy as np

from ..comm.process import dist_print, process_group_from_env
from ..errors import arg_error

__all__ = ["init_dist", "init_seed", "dist_print"]


def init_seed(global_seed: int) -> None:
    """Seed Python's ``random``, NumPy's legacy global generator and (when imported) torch with
    ``global_seed + rank`` (the rank of the initialised default process group, else 0)."""
    torch = sys.modules.get("torch")
    dist = sys.modules.get("torch.distributed")
    # Note: rank 0 without an initialised process group (DeepGEMM-Ascend requires one); NumPy's
    # global generator is seeded too.
    rank = dist.get_rank() if dist is not None and dist.is_available() and dist.is_initialized() else 0
    local_seed = global_seed + rank
    random.seed(local_seed)
    np.random.seed(local_seed)  # noqa: NPY002 - mirrors the global seeding of the real helper
    if torch is not None:
        torch.manual_seed(local_seed)


def init_dist(local_rank: int, num_local_ranks: int, seed: int = 0) -> tuple[int, int, Any]:
    """Initialise ``torch.distributed`` for this process: DeepGEMM-Ascend's ``init_dist`` on gloo.

    local_rank, num_local_ranks: as :func:`deepgemm_ref.utils.dist.init_dist` (the same
    environment: ``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE`` nodes, ``RANK`` node).
    seed: the global seed; :func:`init_seed` seeds with ``seed + rank``.

    As DeepGEMM-Ascend's, sets the default dtype to bfloat16 and returns ``(rank, world size, the
    default group)``.  DeepGEMM-Ascend uses HCCL and makes the NPU the default device; here the
    backend is gloo and the default device stays the CPU.
    """
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise arg_error("init_dist", "seed", "an int", repr(seed))
    dist, _, _ = process_group_from_env("init_dist", local_rank, num_local_ranks)
    import torch

    torch.set_default_dtype(torch.bfloat16)
    init_seed(seed)
    return dist.get_rank(), dist.get_world_size(), dist.group.WORLD
