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
import re
from dataclasses import dataclass

from ..errors import DGArgumentError
from ..toolkit.sizes import default_memory_limit, format_size, physical_memory

__all__ = ["Estimate", "ResourceError", "default_memory_limit", "physical_memory", "parse_size", "format_size",
           "format_seconds", "WORK_PER_SECOND", "CASE_WORK", "BYTE_WORK", "tensor_bytes",
           "HEADER_BYTES_PER_TENSOR"]

#: Work units per second on a reference core (two shared cores, measured on the smoke and
#: deepgemm-tests-small presets): the plan's time estimate is rough; the ETA during a run uses the
#: measured rate.  A unit is about one multiply-add of the exact model of a dense GEMM; families
#: with slower exact models weigh their multiply-adds more, and every case adds a fixed cost and
#: one per byte written and hashed (:data:`CASE_WORK`, :data:`BYTE_WORK`).
WORK_PER_SECOND = 1.0e10
#: The fixed work of one case (about 10 ms: building, the call, the file).
CASE_WORK = 1.0e8
#: The work per byte of a case's file (about 1 GB/s to write and hash).
BYTE_WORK = 10.0
#: A generous bound of one tensor's share of a safetensors header (name, dtype, shape, offsets)
#: plus its manifest entry's sha256.
HEADER_BYTES_PER_TENSOR = 160


class ResourceError(DGArgumentError):
    """A case (or bundle) that would need more memory or disk than allowed."""


@dataclass(frozen=True)
class Estimate:
    """file_bytes: the case's file; peak_bytes: peak memory of generating it; work: cost units."""

    file_bytes: int
    peak_bytes: int
    work: float

    @property
    def seconds(self) -> float:
        return self.work / WORK_PER_SECOND

    @staticmethod
    def of(file_bytes: float, peak_bytes: float, madds: float) -> Estimate:
        """An estimate whose work is ``madds`` plus the per-case and per-byte work."""
        return Estimate(int(file_bytes), int(peak_bytes), float(madds) + CASE_WORK + BYTE_WORK * file_bytes)


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
