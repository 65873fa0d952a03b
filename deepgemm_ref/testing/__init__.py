"""DeepGEMM's testing helpers (``deep_gemm.testing``), DeepGEMM-Ascend's, a ULP-distance helper and
``assert_matches_golden`` (a device's outputs of a golden case against its goldens).

``calc_diff``, ``count_bytes`` and ``assert_bitwise_equal`` keep DeepGEMM's names, signatures
and results; they accept NumPy arrays and torch CPU tensors.  Timing helpers measure wall-clock
time on the CPU (there is no device).  DeepGEMM-Ascend's additions (``bench_msprof``,
``KernelProfile``, ``close_persistent_profiler`` and the ``envs``, ``par_compile``,
``disable_fallback`` sub-modules) are here too, as is ``bench.suppress_stdout_stderr``.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import numeric, utils  # noqa: F401  (sub-modules)
from .assertions import assert_matches_golden
from .numeric import assert_bitwise_equal, calc_diff, count_bytes, ulp_distance
from .utils import get_arch_major, ignore_env, test_filter

__all__ = [
    "calc_diff",
    "count_bytes",
    "assert_bitwise_equal",
    "ulp_distance",
    "assert_matches_golden",
    "bench",
    "empty_suppress",
    "suppress_stdout_stderr",
    "get_arch_major",
    "test_filter",
    "ignore_env",
    "bench_kineto",
    "bench_msprof",
    "KernelProfile",
    "close_persistent_profiler",
]


# ----------------------------------------------------------------------------------------------
# Benchmarking helpers with DeepGEMM's names (wall clock on the CPU)
# ----------------------------------------------------------------------------------------------

# Note: wall-clock timing on the CPU instead of CUDA events with an L2 flush.
def bench(fn: Callable[[], Any], num_warmups: int = 5, num_tests: int = 10, high_precision: bool = False) -> float:
    """Seconds per call of ``fn`` (wall clock, median of ``num_tests`` after ``num_warmups``).

    Note: DeepGEMM times CUDA events and flushes the L2 cache; on the CPU we take the median
    wall-clock time.  ``high_precision`` is accepted for signature compatibility.
    """
    for _ in range(num_warmups):
        fn()
    times = []
    for _ in range(max(num_tests, 1)):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def bench_kineto(
    fn: Callable[[], Any],
    kernel_names: str | tuple[str, ...],
    num_tests: int = 30,
    suppress_kineto_output: bool = False,
    trace_path: str | None = None,
    flush_l2: bool = True,
    with_multiple_kernels: bool = False,
    barrier: Any = None,
) -> float | tuple[float, ...]:
    """Seconds per call of ``fn``, reported for each kernel name (a tuple for a tuple of names).

    Note: DeepGEMM reads per-kernel CUDA times from the profiler; the emulator has one "kernel" per
    call, so every name gets the wall-clock time of the whole call.  With ``DG_USE_NVIDIA_TOOLS``
    set it returns 1 (or a tuple of 1), as DeepGEMM does.
    """
    names = kernel_names if isinstance(kernel_names, tuple) else (kernel_names,)
    if os.environ.get("DG_USE_NVIDIA_TOOLS"):
        t = 1.0
    else:
        t = bench(fn, num_warmups=1, num_tests=num_tests)
    return tuple(t for _ in names) if isinstance(kernel_names, tuple) else t


@dataclass
class KernelProfile:
    """DeepGEMM-Ascend's profile record of one kernel (duration in nanoseconds)."""

    dur_ns: float


def bench_msprof(
    fn: Callable[[], Any],
    kernel_names: str | tuple[str, ...] | None = None,
    num_warmups: int = 10,
    num_tests: int = 30,
    flush_l2: bool = True,
    barrier_comm_profiling: bool = False,
    barrier: Any = None,
    return_all_kernels: bool = False,
    suppress_verbose_output: bool = True,
    backend: str = "persistent",
) -> Any:
    """DeepGEMM-Ascend's msprof-based timing, as wall clock: seconds per call for each kernel name.

    ``return_all_kernels=True`` gives ``{"fn": KernelProfile(ns)}``; the profiling options are
    accepted and have no effect on the CPU.
    """
    t = bench(fn, num_warmups=num_warmups, num_tests=num_tests)
    if return_all_kernels:
        return {"fn": KernelProfile(t * 1e9)}
    if kernel_names is None:
        return t
    return tuple(t for _ in kernel_names) if isinstance(kernel_names, tuple) else t


def close_persistent_profiler() -> None:
    """Nothing to close on the CPU."""
    return None


@contextlib.contextmanager
def _suppress_stdout_stderr_ascend(suppress: bool) -> Iterator[None]:
    """DeepGEMM-Ascend's ``testing.bench.suppress_stdout_stderr(suppress)``."""
    if not suppress:
        yield
        return
    with suppress_stdout_stderr():
        yield


class empty_suppress:  # noqa: N801 - DeepGEMM's name
    """A context manager that does nothing (DeepGEMM's ``empty_suppress``)."""

    def __enter__(self) -> empty_suppress:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


class suppress_stdout_stderr:  # noqa: N801 - DeepGEMM's name
    """A context manager that redirects file descriptors 1 and 2 to /dev/null."""

    def __enter__(self) -> suppress_stdout_stderr:
        sys.stdout.flush()
        sys.stderr.flush()
        self._null = os.open(os.devnull, os.O_WRONLY)
        self._saved = (os.dup(1), os.dup(2))
        os.dup2(self._null, 1)
        os.dup2(self._null, 2)
        return self

    def __exit__(self, *exc: Any) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(self._saved[0], 1)
        os.dup2(self._saved[1], 2)
        for fd in (*self._saved, self._null):
            os.close(fd)


# DeepGEMM-Ascend's ``deep_gemm.testing.bench`` is a module holding suppress_stdout_stderr(suppress);
# DeepGEMM's is the function bench (its star import shadows the module).  Both work here.
bench.suppress_stdout_stderr = _suppress_stdout_stderr_ascend  # type: ignore[attr-defined]

from . import disable_fallback, envs, par_compile  # noqa: E402, F401  (sub-modules)
