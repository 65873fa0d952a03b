"""Size guards: size arguments in the range the targets take, derived allocations within a limit.

Every kernel and utility checks its sizes here before it copies or allocates anything:

* :func:`size_arg`: an integer size argument (``num_sms``, ``max_context_len``, ``mn``, ``k``,
  ``gran_k``, Mega MoE sizes, ...) within the range of the C++ ``int`` the targets' host code
  takes (DeepGEMM's pybind bindings refuse anything outside it with a ``TypeError``).
* :func:`check_alloc`: the bytes of an allocation derived from the arguments (an output, a padded
  copy, a layout) against :func:`allocation_limit`, or, for a lazily paged buffer, against the
  machine's physical memory.
* :func:`check_backed`: an array argument whose elements overlap in memory (a zero-stride
  broadcast) may describe far more elements than it occupies; the kernels' working copies grow
  with the elements, so such an array is refused when its float64 working copy would exceed the
  limit.

The limit defaults to half of this machine's total physical memory, or of the cgroup's memory
limit when that is lower (the golden workflow's ``--max-memory`` default; stable from run to
run); :func:`limit_allocations` sets another one for a block of code.  Nothing here allocates.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from .._memory import (
    allocation_limit,
    cgroup_memory_limit,
    default_memory_limit,
    limit_allocations,
    limit_work,
    physical_memory,
    work_budget,
)
from ..errors import arg_error

__all__ = [
    "INT_MAX",
    "size_arg",
    "opt_size_arg",
    "nbytes",
    "physical_memory",
    "available_memory",
    "cgroup_memory_limit",
    "default_memory_limit",
    "allocation_limit",
    "limit_allocations",
    "work_budget",
    "limit_work",
    "check_alloc",
    "check_backed",
    "check_matmul",
    "format_size",
]

#: The largest C++ ``int``: DeepGEMM's and DeepGEMM-Ascend's host functions take sizes as ``int``.
INT_MAX = 2**31 - 1
#: Allocations up to this size are never refused (checking them would cost more than they do).
_SMALL = 64 << 20


def size_arg(func: str, arg: str, v: Any, minimum: int | None = 0, maximum: int | None = INT_MAX) -> int:
    """An integer size (not a bool) in ``[minimum, maximum]`` (None: unbounded): by default a
    non-negative C++ ``int``."""
    # Note: past INT_MAX pybind's conversion raises TypeError; this is DGArgumentError.
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise arg_error(func, arg, "an int", f"{type(v).__name__} {v!r}")
    if minimum is not None and v < minimum:
        raise arg_error(func, arg, f"an int >= {minimum}", repr(int(v)))
    if maximum is not None and v > maximum:
        what = " (the C++ int the target takes)" if maximum == INT_MAX else ""
        raise arg_error(func, arg, f"an int <= {maximum}{what}", repr(int(v)))
    return int(v)


def opt_size_arg(func: str, arg: str, v: Any, minimum: int | None = 0, maximum: int = INT_MAX) -> int | None:
    """None, or :func:`size_arg`."""
    return None if v is None else size_arg(func, arg, v, minimum, maximum)


def nbytes(shape: Iterable[int], itemsize: int) -> int:
    """The bytes of an array of ``shape`` and ``itemsize``, as a Python int (no overflow)."""
    n = int(itemsize)
    for s in shape:
        n *= max(int(s), 0)
    return n


# ----------------------------------------------------------------------------------------------
# the limit
# ----------------------------------------------------------------------------------------------

def available_memory() -> int | None:
    """Available memory in bytes (``MemAvailable`` of ``/proc/meminfo``), or None where unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def format_size(n: float) -> str:
    """``n`` bytes as ``"1.5 GiB"``."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


# ----------------------------------------------------------------------------------------------
# the guards
# ----------------------------------------------------------------------------------------------

def check_alloc(func: str, arg: str, size: int, what: str, *, lazy: bool = False, utility: bool = False) -> None:
    """Refuse an allocation of ``size`` bytes that ``arg`` asks for (``what`` names it) when it
    exceeds :func:`allocation_limit`; ``lazy`` (a buffer whose pages are mapped on first touch):
    when it exceeds the physical memory instead.  ``utility``: the error is also an
    ``AssertionError`` (DeepGEMM's Python utilities)."""
    if size <= _SMALL:
        return
    # Note: the libraries try the allocation (and fail with an out-of-memory error on the device);
    # here it is refused before anything is allocated.
    if lazy:
        limit = physical_memory() or default_memory_limit()
        bound = "the physical memory"
    else:
        limit = allocation_limit()
        bound = "the allocation limit"
    if size > limit:
        raise arg_error(func, arg, f"sizes for which {what} fits in {bound} ({format_size(limit)}"
                        + ("" if lazy else "; toolkit.sizes.limit_allocations sets another") + ")",
                        f"{format_size(size)} ({size} bytes)", utility=utility)


def check_matmul(func: str, arg: str, m: int, n: int, k: int) -> None:
    """Refuse a product of an (m, k) and an (n, k) operand whose float64 working copies cannot fit:
    at least one operand decoded whole and the (m, n) accumulator, 8 * (min(m, n) * k + m * n)
    bytes (a lower bound of what the core allocates for one task)."""
    check_alloc(func, arg, 8 * (min(m, n) * k + m * n),
                f"the float64 working copies of an ({m} x {k}) by ({n} x {k}) product")


def _span(x: np.ndarray) -> int:
    """Bytes between the first and one past the last byte ``x`` addresses."""
    return x.itemsize + sum((n - 1) * abs(s) for n, s in zip(x.shape, x.strides, strict=True) if n > 1)


def check_backed(func: str, arg: str, x: np.ndarray, *, utility: bool = False) -> None:
    """Refuse an array whose elements overlap in memory (zero or overlapping strides, as a
    broadcast) when its float64 working copy (8 bytes per element) exceeds the limit."""
    # Note: the devices read a broadcast operand in place; the emulator's float64 working copies
    # grow with its elements, so a broadcast too large for them is refused.
    work = 8 * x.size
    if work <= _SMALL or _span(x) >= x.nbytes:
        return
    check_alloc(func, arg, work, f"the float64 working copy of this broadcast (zero-stride) array of {x.size} "
                "elements", utility=utility)
