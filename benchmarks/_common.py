"""Small helpers shared by the benchmarks: timing and peak-memory measurement."""

from __future__ import annotations

import os
import sys
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def best_time(fn: Callable[[], Any], repeat: int = 3) -> float:
    """Best wall-clock seconds of ``repeat`` calls (after one warm-up call)."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def peak_bytes(fn: Callable[[], Any]) -> int:
    """Peak bytes allocated through NumPy (tracemalloc sees NumPy's data buffers) during ``fn``."""
    tracemalloc.start()
    tracemalloc.reset_peak()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def row(name: str, seconds: float, **ratios: float) -> str:
    parts = [f"{name:<48} {seconds * 1e3:10.1f} ms"]
    parts += [f"{k} {v:6.2f}x" for k, v in ratios.items()]
    return "  ".join(parts)
