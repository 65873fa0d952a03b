"""Memory, disk and time estimates of golden cases, and the limits they are held to.

Each family estimates, from a case's resolved keys alone (nothing is allocated), the bytes of its
file, the peak memory of building it and computing its golden, and its work (a cost in
arbitrary units, about one per multiply-add of the exact model).  Generation refuses a case whose
estimate is over the memory limit before anything is allocated, prints the bundle's estimated
size and time, and weighs its progress and ETA by the work.

The default limit is half of this machine's total physical memory (``os.sysconf``), or of this
process's cgroup memory limit when that is lower: a number that does not change from run to run
(the memory available at the moment does); ``--max-memory`` overrides it.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass

from ..errors import DGArgumentError
from ..toolkit.sizes import default_memory_limit, format_size, physical_memory

__all__ = ["Estimate", "ResourceError", "default_memory_limit", "physical_memory", "parse_size", "format_size",
           "format_seconds", "WORK_PER_SECOND", "CASE_WORK", "BYTE_WORK", "tensor_bytes", "HEADER_BYTES_PER_TENSOR",
           "PEAK_FIXED", "OWN_SHARE", "FILL_SHARE", "row_block", "work_room", "blas_rate", "work_per_second",
           "EXACT_COST"]

#: Work units per second of a reference core, where the BLAS cannot be timed (the plan's times
#: are calibrated by :func:`blas_rate` at first use; the ETA during a run uses the measured
#: rate).  A unit is one float64 multiply-add of the BLAS on one thread: a case's work is the
#: BLAS-equivalent multiply-adds of its exact model (about two per multiply-add of a dense GEMM:
#: the float64 GEMM and the error scale's float32 one) plus its per-element passes, a fixed cost
#: and one per byte written and hashed (:data:`CASE_WORK`, :data:`BYTE_WORK`), fitted to the CPU
#: times measured on every preset (benchmarks/estimates.md).
WORK_PER_SECOND = 2.5e10
#: The fixed work of one case (about 2.4 ms at the reference rate: building, the call, the file;
#: refitted on an idle machine, where the first fit's loaded one had given 4.6 ms).
CASE_WORK = 6.0e7
#: The work per byte of a case's file (about 1 ms per MB to draw, write and hash it; 1.8 ms on the
#: loaded machine of the first fit).
BYTE_WORK = 24.0
#: The bytes every case allocates beside its tensors and work (the call's and the file's
#: bookkeeping, small temporaries; measured with tracemalloc on the smoke preset's cases).
PEAK_FIXED = 1 << 20
#: A generous bound of one tensor's share of a safetensors header (name, dtype, shape, offsets)
#: plus its manifest entry's sha256.
HEADER_BYTES_PER_TENSOR = 160


class ResourceError(DGArgumentError):
    """A case (or bundle) that would need more memory or disk than allowed."""


#: Seconds per work unit relative to one float64 multiply-add of this machine's BLAS on one
#: thread (the golden BLAS is pinned to one thread); the families' work is already in these units.
EXACT_COST = 1.0
_RATE: list[float] = []


def blas_rate() -> float:
    """Float64 multiply-adds per second of this machine's BLAS on one thread: a 384 x 384 x 384
    matmul timed (this thread's CPU time, best of 5, a few milliseconds in all), once per process.
    ``DEEPGEMM_REF_BLAS_RATE`` (multiply-adds per second) overrides the measurement."""
    if _RATE:
        return _RATE[0]
    env = os.environ.get("DEEPGEMM_REF_BLAS_RATE")
    rate = 0.0
    if env:
        try:
            rate = float(env)
        except ValueError:
            rate = 0.0
    if not (math.isfinite(rate) and rate > 0):
        import time

        import numpy as np

        from .._parallel import single_threaded_blas

        n = 384
        x = np.random.default_rng(0).standard_normal((n, n))
        best = math.inf
        with single_threaded_blas():
            x @ x  # warm-up (the BLAS's buffers)
            for _ in range(5):
                t0 = time.thread_time()  # this thread's CPU time: what a loaded machine leaves of it
                x @ x
                best = min(best, time.thread_time() - t0)
        rate = n**3 / best if best > 0 else WORK_PER_SECOND
    _RATE.append(rate)
    return rate


def work_per_second() -> float:
    """Work units per second on this machine: :func:`blas_rate` / :data:`EXACT_COST`."""
    return blas_rate() / EXACT_COST


@dataclass(frozen=True)
class Estimate:
    """file_bytes: the case's file; peak_bytes: peak memory of generating it; work: cost units."""

    file_bytes: int
    peak_bytes: int
    work: float
    #: the case's own tensors (inputs, outputs, goldens; what cannot stream): the rest of the
    #: peak is work that streams within the limit (0: not told apart, all of the peak is own)
    own_bytes: int = 0
    #: the rows per block of a case whose golden is computed and written in blocks of its main
    #: output's rows (:func:`row_block`; 0: the whole case at once)
    row_block: int = 0

    @property
    def seconds(self) -> float:
        """Estimated seconds on this machine (:func:`work_per_second`, calibrated at first use)."""
        return self.work / work_per_second()

    @property
    def own(self) -> int:
        """The bytes that must fit in memory at once (:attr:`own_bytes`, else the peak)."""
        return self.own_bytes or self.peak_bytes

    @staticmethod
    def of(file_bytes: float, peak_bytes: float, madds: float, own_bytes: float = 0, *,
           case_work: float = CASE_WORK, byte_work: float = BYTE_WORK, row_block: int = 0) -> Estimate:
        """An estimate whose work is ``madds`` (BLAS-equivalent multiply-adds) plus the per-case
        and per-byte work (a family's own where its fit differs)."""
        return Estimate(int(file_bytes), int(peak_bytes), float(madds) + case_work + byte_work * file_bytes,
                        int(own_bytes), int(row_block))


#: The share of the limit a case's own tensors may take before its golden goes in row blocks
#: (the rest is the core's streaming float64 work).
OWN_SHARE = 0.5
#: The share of the limit the own tensors and the streaming work of a case fill at most: the rest
#: is a margin for what the estimates do not count (with the whole limit, the largest case's
#: measured peak RSS came to 0.98 of it, with 0.9 to 0.96: benchmarks/estimates.md).
FILL_SHARE = 0.8


def work_room(limit: int, own_bytes: float) -> int:
    """The core's work budget (:func:`deepgemm_ref._memory.limit_work`) of a case whose own
    tensors take ``own_bytes`` under the memory limit ``limit``: what they leave of
    :data:`FILL_SHARE` of it (at least :data:`deepgemm_ref._memory.MIN_WORK_BUDGET`).  Generation
    sets it and the estimates size the work with it."""
    from .._memory import MIN_WORK_BUDGET

    return int(max(MIN_WORK_BUDGET, FILL_SHARE * limit - own_bytes - PEAK_FIXED))


def row_block(rows: int, fixed_bytes: float, row_bytes: float, limit: int, align: int = 1) -> int:
    """Rows per block of a case whose outputs can be computed and written a block of rows at a
    time (:class:`.cases.Family` ``row_split``): 0 (the whole case at once) when its own tensors
    (``fixed_bytes`` held throughout, ``row_bytes`` per output row) take at most
    :data:`OWN_SHARE` of ``limit``; else the most rows that fit in that share, balanced over the
    blocks, a multiple of ``align`` (at least ``align``: a case whose fixed tensors leave no room
    is refused by its peak)."""
    room = OWN_SHARE * limit - PEAK_FIXED - fixed_bytes
    if rows <= align or row_bytes <= 0 or rows * row_bytes <= room:
        return 0
    most = max(1, int(room // row_bytes) // align) * align
    blocks = -(-rows // most)
    even = -(-rows // blocks)  # the rows of each block, balanced
    return -(-even // align) * align


def tensor_bytes(*sizes: tuple[float, float]) -> int:
    """Sum of element count x itemsize, plus a header share per tensor."""
    return int(sum(int(n) * b for n, b in sizes)) + HEADER_BYTES_PER_TENSOR * len(sizes)


_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20, "mb": 1000**2, "mib": 1 << 20,
          "g": 1 << 30, "gb": 1000**3, "gib": 1 << 30, "t": 1 << 40, "tb": 1000**4, "tib": 1 << 40}


def parse_size(text: str) -> int:
    """``"8G"``, ``"512MiB"``, ``"1.5GB"``, ``"1000000"`` -> bytes (K/M/G/T alone are binary)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", str(text))
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _UNITS:
        raise DGArgumentError(f"size: expected a number of bytes with an optional unit (K, M, G, T, KB, MiB, ...); "
                              f"got {text!r}")
    value = float(m.group(1)) * _UNITS[unit]
    if not math.isfinite(value) or value < 1:
        raise DGArgumentError(f"size: expected at least one byte; got {text!r}")
    return int(value)


def format_seconds(s: float) -> str:
    if not math.isfinite(s):
        return "--"
    if s < 60:
        return f"{s:.0f} s"
    if s < 3600:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"
