"""Bit-level helpers of the DeepEP tests' independent model (integer arithmetic on bit patterns,
no package code): shared by tests/test_ep.py and tests/test_ep_legacy.py."""

from __future__ import annotations

import numpy as np


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
