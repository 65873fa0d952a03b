"""Bit-level helpers of the DeepEP tests' independent model (integer arithmetic on bit patterns,
no package code): shared by tests/test_ep.py, tests/test_ep_legacy.py and tests/test_ep_refs.py."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import ml_dtypes
import numpy as np
import pytest


def bf16_bits(f: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns (uint16), round to nearest even, by integer arithmetic."""
    u = np.asarray(f, np.float32).view(np.uint32).astype(np.uint64)
    nan = np.isnan(np.asarray(f, np.float32))
    r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return np.where(nan, (u >> 16) | 0x40, r).astype(np.uint16)


def f32_of(b: np.ndarray) -> np.ndarray:
    """bf16 -> float32 (exact), by shifting the bits."""
    return (np.asarray(b).view(np.uint16).astype(np.uint32) << 16).view(np.float32)


def align_up(a: int, b: int) -> int:
    return -(-a // b) * b


def wide_bf16(seed: int, rows: int, cols: int) -> np.ndarray:
    """bf16 values of magnitudes 2^-24 .. 2^30, random signs and 7-bit mantissas: float32 sums of
    them round, so only one summation order gives a combine's bytes."""
    g = np.random.default_rng(seed)
    mag = np.exp2(g.integers(-24, 31, (rows, cols))).astype(np.float32)
    v = mag * g.choice([-1.0, 1.0], (rows, cols)) * (1 + g.integers(0, 128, (rows, cols)) / 128)
    return v.astype(np.float32).astype(ml_dtypes.bfloat16)


def run_rank_processes(argv: Callable[[int], list[str]], ranks: int, env: dict[str, str],
                       timeout_s: float = 300) -> list[str]:
    """Start ``argv(r)`` for every rank, wait for all (killing all past ``timeout_s``), assert every
    one exited 0; their combined stdout / stderr, rank by rank."""
    procs = [subprocess.Popen(argv(r), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(ranks)]
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=timeout_s)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"gloo ranks did not finish within {timeout_s:g} s")
    assert all(p.returncode == 0 for p in procs), "\n".join(log[-3000:] for log in logs)
    return logs
