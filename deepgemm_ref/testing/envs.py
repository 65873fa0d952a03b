"""DeepGEMM-Ascend's ``deep_gemm.testing.envs``: seeding and distributed set-up helpers."""

from __future__ import annotations

import random
import sys
from typing import Any

import numpy as np

from ..api import not_implemented

__all__ = ["init_dist", "init_seed", "dist_print"]


@not_implemented("multi-process HCCL/NCCL initialisation is not emulated; deepgemm_ref runs every "
                 "expert-parallel rank in one process (use deepgemm_ref.mega.EmulatedGroup(num_ranks).rank(r))")
def init_dist(local_rank: int, num_local_ranks: int, seed: int = 0) -> Any:
    """Not implemented: the emulator runs every expert-parallel rank in one process.

    DeepGEMM-Ascend initialises HCCL process groups here; use the emulated groups of
    ``deepgemm_ref.mega`` instead.
    """


def init_seed(global_seed: int) -> None:
    """Seed Python's ``random``, NumPy's legacy global generator and (when imported) torch."""
    random.seed(global_seed)
    np.random.seed(global_seed)  # noqa: NPY002 - mirrors the global seeding of the real helper
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(global_seed)


def dist_print(s: str = "", once_in_node: bool = False) -> None:
    """Print ``s`` (one process holds every rank, so there is no barrier to wait for)."""
    print(s, flush=True)
