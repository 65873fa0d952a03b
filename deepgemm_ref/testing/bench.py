"""Timing helpers of DeepGEMM (``bench``, ``bench_kineto``) and DeepGEMM-Ascend (``bench_msprof``,
``KernelProfile``, ``close_persistent_profiler``), and both libraries' ``suppress_stdout_stderr``.

There is no device and no profiler: every time is CPU wall-clock time, and a "kernel" is one
public call of this package (a call made by another public function counts as part of its
caller).  Under the ``ascend950`` profile a kernel is named as DeepGEMM-Ascend's device kernel
would be in an msprof capture (``fp8_gemm_impl``, ``mqa_logits_impl``, ...; see
:data:`DEVICE_KERNELS`), followed by the public name in parentheses, so that DeepGEMM-Ascend's
substring queries (``kernel_names='gemm_impl'``) and queries by public name both find it.

``from deepgemm_ref.testing.bench import bench_msprof`` imports this module; the attribute
``deepgemm_ref.testing.bench`` is DeepGEMM's function ``bench`` (DeepGEMM's star import shadows
its module the same way), which also carries this module's DeepGEMM-Ascend names as attributes.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..api import log_calls
from ..errors import DGArgumentError
from ..profiles import get_profile

__all__ = [
    "KernelProfile",
    "bench_msprof",
    "close_persistent_profiler",
    "NOT_MEASURED",
    "DEVICE_KERNELS",
    "bench",
    "bench_kineto",
    "empty_suppress",
    "suppress_stdout_stderr",
]

#: The value of a :class:`KernelProfile` pipe-utilisation field that was not measured (NaN: the
#: emulator has no hardware counters; NaN compares false and prints as ``nan``).  The cycle
#: counts of such a profile are 0, DeepGEMM-Ascend's value for a core type with no records.
NOT_MEASURED = math.nan

#: DeepGEMM-Ascend's device kernel behind each public function (the JIT kernels of its
#: ``csrc/jit_kernels``); functions not listed (ACLNN, TileLang, Mega MoE) are named by their
#: public name alone.
DEVICE_KERNELS: dict[str, str] = {
    **{f"{p}_gemm_{t}": "fp8_gemm_impl" for p in ("fp8_fp4", "fp8") for t in ("nt", "nn", "tn", "tt")},
    **{f"bf16_gemm_{t}": "bf16_gemm_impl" for t in ("nt", "nn", "tn", "tt")},
    "m_grouped_fp8_fp4_gemm_nt_contiguous": "fp8_gemm_impl",
    "m_grouped_fp8_fp4_gemm_nn_contiguous": "fp8_gemm_impl",
    "m_grouped_fp8_gemm_nt_contiguous": "fp8_gemm_impl",
    "m_grouped_fp8_gemm_nn_contiguous": "fp8_gemm_impl",
    "k_grouped_fp8_gemm_nt_contiguous": "fp8_gemm_impl",
    "k_grouped_fp8_gemm_tn_contiguous": "fp8_gemm_impl",
    "m_grouped_bf16_gemm_nt_contiguous": "bf16_gemm_impl",
    "m_grouped_bf16_gemm_nn_contiguous": "bf16_gemm_impl",
    "k_grouped_bf16_gemm_tn_contiguous": "bf16_gemm_impl",
    "fp8_einsum": "fp8_gemm_impl",
    "fp8_bmm": "fp8_gemm_impl",
    "einsum": "bf16_gemm_impl",
    "bf16_bmm": "bf16_gemm_impl",
    "fp8_fp4_mqa_logits": "mqa_logits_impl",
    "fp8_fp4_paged_mqa_logits": "paged_mqa_logits_impl",
    "get_paged_mqa_logits_metadata": "paged_mqa_logits_metadata_simt_impl",
    "transform_sf_into_required_layout": "transform_sf",
    "transform_k_grouped_sf_into_required_layout": "transform_sf",
}


@dataclass
class KernelProfile:
    """DeepGEMM-Ascend's profile of one kernel: its duration and its AIC / AIV pipe utilisation.

    dur_ns:            mean duration per call in nanoseconds (here: CPU wall-clock time).
    aic_total_cycles:  Cube (AIC) cycles; aic_mad, aic_scalar, aic_mte1 (L1 -> L0), aic_mte2
                       (GM -> L1), aic_mte3 (UB -> GM), aic_fixpipe (L0C -> out): ratios of them.
    aiv_total_cycles:  vector (AIV) cycles; aiv_vec, aiv_scalar, aiv_mte2 (GM -> UB), aiv_mte3
                       (UB -> GM): ratios of them.
    The defaults are DeepGEMM-Ascend's; :func:`bench_msprof` sets every ratio to
    :data:`NOT_MEASURED` (NaN) and the cycle counts to 0, since no counter exists on the CPU.
    """

    dur_ns: float
    aic_total_cycles: int = 0
    aic_mad: float = 0.0
    aic_scalar: float = 0.0
    aic_mte1: float = 0.0
    aic_mte2: float = 0.0
    aic_mte3: float = 0.0
    aic_fixpipe: float = 0.0
    aiv_total_cycles: int = 0
    aiv_vec: float = 0.0
    aiv_scalar: float = 0.0
    aiv_mte2: float = 0.0
    aiv_mte3: float = 0.0

    @property
    def dur_us(self) -> float:
        """Duration in microseconds."""
        return self.dur_ns / 1000

    def tflops(self, flops: float) -> float:
        """``flops`` per call as TFLOP/s at this duration."""
        return flops / self.dur_ns / 1000

    def gbps(self, bytes_moved: float) -> float:
        """``bytes_moved`` per call as GB/s at this duration."""
        return bytes_moved / self.dur_ns

    def __repr__(self) -> str:
        shown = [f"{self.dur_ns / 1000:.1f}us"]
        for label, v in (("mad", self.aic_mad), ("aic_mte2", self.aic_mte2), ("aic_mte1", self.aic_mte1),
                         ("aic_fix", self.aic_fixpipe), ("aiv_vec", self.aiv_vec), ("aiv_mte2", self.aiv_mte2),
                         ("aiv_mte3", self.aiv_mte3)):
            if v > 0.001:  # NaN (not measured) and zero are left out
                shown.append(f"{label}={v * 100:.1f}%")
        shown += [f"{n}={c}" for n, c in (("aic_cycles", self.aic_total_cycles),
                                          ("aiv_cycles", self.aiv_total_cycles)) if c]
        return f"KernelProfile({', '.join(shown)})"


def _unmeasured(dur_ns: float) -> KernelProfile:
    """A profile with a duration and no counters (ratios NOT_MEASURED, cycle counts 0)."""
    nan = NOT_MEASURED
    return KernelProfile(dur_ns, aic_mad=nan, aic_scalar=nan, aic_mte1=nan, aic_mte2=nan, aic_mte3=nan,
                         aic_fixpipe=nan, aiv_vec=nan, aiv_scalar=nan, aiv_mte2=nan, aiv_mte3=nan)


# Note: one kernel per public call, timed by the CPU wall clock; no counters (NOT_MEASURED).
def kernel_name(public: str) -> str:
    """The name a public call's kernel has in :func:`bench_msprof`'s results (see the module docstring)."""
    device = DEVICE_KERNELS.get(public) if get_profile().is_ascend else None
    return public if device is None else f"{device} ({public})"


_BACKENDS = ("slow", "fast", "persistent")


def bench_msprof(
    fn: Callable[[], Any],
    kernel_names: str | Iterable[str] | None = None,
    num_warmups: int = 10,
    num_tests: int = 30,
    flush_l2: bool = True,
    barrier_comm_profiling: bool = False,
    barrier: Callable[[], Any] | None = None,
    return_all_kernels: bool = False,
    suppress_verbose_output: bool = True,
    backend: str = "persistent",
) -> Any:
    """DeepGEMM-Ascend's msprof profile of the kernels ``fn`` launches, timed on the CPU.

    ``fn`` runs ``num_warmups`` times, then ``num_tests`` times while every public call is timed
    (wall clock; ``barrier()`` before each run with ``barrier_comm_profiling``, unless
    ``EP_DISABLE_BARRIER_PROFILING`` is set).  Each kernel's :class:`KernelProfile` has its mean
    duration per call; the pipe fields are :data:`NOT_MEASURED`.  Returns

    * ``kernel_names`` a str: the profile of the one kernel whose name contains it (RuntimeError,
      listing the kernels seen, when none or several do);
    * a list (any iterable) of str: a list with each query's first match or None;
    * ``return_all_kernels=True``: ``{name: profile}`` of every kernel seen.

    ``flush_l2``, ``suppress_verbose_output`` and ``backend`` (``slow``, ``fast``, ``persistent``:
    checked) change nothing on the CPU.  Bad arguments raise the package's argument error (a
    ``ValueError``, as DeepGEMM-Ascend's).
    """
    func = "bench_msprof"
    if kernel_names is None and not return_all_kernels:
        raise DGArgumentError(f"{func}: kernel_names: expected a str or a list of str unless "
                              "return_all_kernels=True; got None")
    if backend not in _BACKENDS:
        raise DGArgumentError(f"{func}: backend: expected one of {_BACKENDS}; got {backend!r}")
    if num_warmups < 0 or num_tests <= 0:
        raise DGArgumentError(f"{func}: num_warmups / num_tests: expected num_warmups >= 0 and num_tests > 0; "
                              f"got {num_warmups} and {num_tests}")
    with_barrier = barrier_comm_profiling and int(os.environ.get("EP_DISABLE_BARRIER_PROFILING", 0)) == 0
    for _ in range(num_warmups):
        fn()
    samples: dict[str, list[int]] = defaultdict(list)
    for _ in range(num_tests):
        if with_barrier and barrier is not None:
            barrier()
        with log_calls() as log:
            fn()
        for name, ns in log.calls:
            samples[kernel_name(name)].append(ns)
    profiles = {name: _unmeasured(float(np.mean(ns))) for name, ns in samples.items()}
    if return_all_kernels:
        return profiles
    if isinstance(kernel_names, str):
        matched = [p for name, p in profiles.items() if kernel_names in name]
        if len(matched) != 1:
            seen = "\n".join(f"  - {name}" for name in profiles) or "  (none)"
            raise RuntimeError(f"No unique kernel matching '{kernel_names}':\n{seen}")
        return matched[0]
    assert kernel_names is not None
    return [next((p for name, p in profiles.items() if q in name), None) for q in kernel_names]


def close_persistent_profiler() -> None:
    """Close DeepGEMM-Ascend's process-resident profiler session: there is none (idempotent)."""
    return None


# ----------------------------------------------------------------------------------------------
# DeepGEMM's timing helpers
# ----------------------------------------------------------------------------------------------

# Note: wall-clock timing on the CPU instead of CUDA events with an L2 flush.
def bench(fn: Callable[[], Any], num_warmups: int = 5, num_tests: int = 10, high_precision: bool = False) -> float:
    """Seconds per call of ``fn`` (wall clock, median of ``num_tests`` after ``num_warmups``).

    DeepGEMM times CUDA events and flushes the L2 cache; on the CPU we take the median
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

    DeepGEMM reads per-kernel CUDA times from the profiler; here every name gets the wall-clock
    time of the whole call.  With ``DG_USE_NVIDIA_TOOLS`` set it returns 1 (or a tuple of 1), as
    DeepGEMM does.
    """
    names = kernel_names if isinstance(kernel_names, tuple) else (kernel_names,)
    if os.environ.get("DG_USE_NVIDIA_TOOLS"):
        t = 1.0
    else:
        t = bench(fn, num_warmups=1, num_tests=num_tests)
    return tuple(t for _ in names) if isinstance(kernel_names, tuple) else t


class empty_suppress:  # noqa: N801 - DeepGEMM's name
    """A context manager that does nothing (DeepGEMM's ``empty_suppress``)."""

    def __enter__(self) -> empty_suppress:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


def _flush_c_stdio() -> None:
    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):  # pragma: no cover - no C library to flush
        pass


class _Redirect:
    """Redirect file descriptors 1 and 2 (and ``sys.stdout`` / ``sys.stderr``) to /dev/null while
    entered, when ``suppress``; Python and C-level output are flushed before and after."""

    def __init__(self, suppress: bool = True) -> None:
        self.suppress = bool(suppress)
        self._stack: contextlib.ExitStack | None = None

    def __enter__(self) -> _Redirect:
        if not self.suppress:
            return self
        sys.stdout.flush()
        sys.stderr.flush()
        _flush_c_stdio()
        stack = contextlib.ExitStack()
        devnull = stack.enter_context(open(os.devnull, "w"))  # noqa: SIM115 - closed by the stack
        saved = (os.dup(1), os.dup(2))

        def restore() -> None:
            sys.stdout.flush()
            sys.stderr.flush()
            _flush_c_stdio()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])

        stack.callback(restore)
        os.dup2(devnull.fileno(), 1)
        os.dup2(devnull.fileno(), 2)
        stack.enter_context(contextlib.redirect_stdout(devnull))
        stack.enter_context(contextlib.redirect_stderr(devnull))
        self._stack = stack
        return self

    def __exit__(self, *exc: Any) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            stack.close()


def suppress_stdout_stderr(suppress: bool) -> contextlib.AbstractContextManager[Any]:
    """DeepGEMM-Ascend's ``testing.bench.suppress_stdout_stderr(suppress)``: a context in which
    stdout and stderr (file descriptors and Python streams) go to /dev/null when ``suppress``.

    DeepGEMM's argument-less class of the same name is ``deepgemm_ref.testing.suppress_stdout_stderr``.
    """
    return _Redirect(suppress)


class _SuppressStdoutStderr(_Redirect):
    """DeepGEMM's ``testing.suppress_stdout_stderr``: ``with suppress_stdout_stderr():`` sends
    stdout and stderr (file descriptors and Python streams) to /dev/null for the block."""

    def __init__(self) -> None:
        super().__init__(True)


_SuppressStdoutStderr.__name__ = _SuppressStdoutStderr.__qualname__ = "suppress_stdout_stderr"
