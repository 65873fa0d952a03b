"""Checks of what a kernel writes: its outputs and its accumulator input ``c``.

Every kernel calls :func:`check_out` (or, for outputs whose shape it checks itself,
:func:`check_written`) for each output buffer and :func:`resolve_c` for ``c``, after its other
arguments are validated and before anything is computed or written: these are the one place
where output contracts (shape, dtype, row-major, writeable, aliasing) are stated.

Aliasing: an output must be writeable, must not overlap itself (two indices at one address) and
must share no memory with any input (``numpy.shares_memory``): the kernels read their inputs
while they write, so an output over an input gives a wrong result.  The one exception is the
documented in-place accumulation ``c is d`` (the same memory, shape and strides), which
:func:`snapshot_c` accepts; a ``c`` that only partly overlaps ``d`` is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import dryrun
from ..errors import DGArgumentError, arg_error
from ..interop import to_numpy
from .args import as_array, elem_stride

__all__ = ["Inputs", "input_view", "check_out", "check_written", "check_disjoint", "overlaps_itself", "shares_memory",
           "check_compact_groups", "resolve_c", "snapshot_c"]

#: The arrays a kernel reads, by argument name (None entries are skipped).
Inputs = Sequence[tuple[str, "np.ndarray | None"]]

# np.shares_memory solves a small integer program for overlapping bounds; beyond this much work
# the answer counts as "shared" (a refusal is safe, a missed overlap is not).
_MAX_WORK = 1 << 20


def input_view(x: Any) -> np.ndarray | None:
    """The NumPy view of an array or torch CPU tensor argument for the aliasing checks, or None for
    anything else (never an error: the argument's own check reports what is wrong with it)."""
    try:
        v = to_numpy(x)
    except DGArgumentError:
        return None
    return v if isinstance(v, np.ndarray) else None


def shares_memory(x: np.ndarray, y: np.ndarray) -> bool:
    """Whether two arrays have an element at a common address (exact up to a bounded search;
    beyond it, True)."""
    if x.size == 0 or y.size == 0:
        return False
    try:
        return bool(np.shares_memory(x, y, max_work=_MAX_WORK))  # type: ignore[arg-type]  # (stub: -1 / 0 only)
    except np.exceptions.TooHardError:
        return True


def overlaps_itself(x: np.ndarray) -> bool:
    """Whether two indices of ``x`` may address one element: a zero stride on a dimension of size
    > 1, or strides that do not nest (each at least the extent of the smaller ones).  An empty
    array has no elements to overlap."""
    if x.size == 0:
        return False
    dims = sorted((abs(s), n) for n, s in zip(x.shape, x.strides, strict=True) if n > 1)
    extent = x.itemsize
    for stride, n in dims:
        if stride < extent:
            return True
        extent = stride * n
    return False


def check_disjoint(func: str, arg: str, out: np.ndarray, inputs: Inputs) -> None:
    """The argument error unless ``out`` shares no memory with any of ``inputs``."""
    # Note: neither library checks aliasing (the device computes a wrong d); here an output that
    # shares memory with an input, or overlaps itself, is refused (c is d excepted).
    for name, x in inputs:
        if x is not None and shares_memory(out, x):
            raise arg_error(func, arg, f"an output that shares no memory with {name} (the kernel reads {name} "
                            f"while it writes {arg})", f"{arg} overlapping {name}")


def check_written(d: np.ndarray, func: str, arg: str = "d", inputs: Inputs = ()) -> None:
    """What every output must be: writeable, not overlapping itself, sharing no memory with an input."""
    if not d.flags.writeable:
        raise arg_error(func, arg, "a writeable array", d)
    if overlaps_itself(d):
        raise arg_error(func, arg, "an array whose elements do not overlap in memory (no zero or "
                        "overlapping strides)", d)
    check_disjoint(func, arg, d, inputs)


def check_compact_groups(x: np.ndarray, func: str, arg: str) -> None:
    """DeepGEMM's major check of a 3-D C/D: groups packed back to back (stride(0) == M * N)."""
    if x.ndim == 3 and x.size and x.shape[0] > 1 and elem_stride(x, 0) != x.shape[1] * x.shape[2]:
        raise arg_error(func, arg, f"compact groups (stride(0) == {x.shape[1] * x.shape[2]})", x)


def check_out(d: np.ndarray, func: str, shape: tuple[int, ...], dtypes: tuple[np.dtype, ...], arg: str = "d",
              inputs: Inputs = ()) -> None:
    """Output checks: shape, dtype, row-major (stride(-1) == 1), compact groups, then
    :func:`check_written` (writeable, no self-overlap, no memory shared with ``inputs``)."""
    if tuple(d.shape) != tuple(shape):
        raise arg_error(func, arg, f"shape {tuple(shape)}", d)
    if d.dtype not in dtypes:
        raise arg_error(func, arg, "dtype " + " or ".join(str(t) for t in dtypes), d)
    if d.size and d.shape[-1] > 1 and elem_stride(d, -1) != 1:
        raise arg_error(func, arg, "a row-major array (stride(-1) == 1)", d)
    check_compact_groups(d, func, arg)
    check_written(d, func, arg, inputs)


def resolve_c(c: Any, d: np.ndarray, func: str) -> tuple[np.ndarray | None, bool]:
    """(a snapshot of C or None, whether c is d): :func:`snapshot_c` of a given ``c``."""
    if c is None:
        return None, False
    return snapshot_c(c, d, func)


def snapshot_c(c: Any, d: np.ndarray, func: str) -> tuple[np.ndarray, bool]:
    """(a snapshot of C, whether c is d): DeepGEMM's checks on ``c`` (same sizes and strides as
    d when it is d; d's dtype and shape; row-major; compact groups; no partial overlap with d)."""
    ca = as_array(c, func, "c")
    shared = shares_memory(ca, d)
    same = shared and ca.__array_interface__["data"][0] == d.__array_interface__["data"][0]
    if same and (ca.shape != d.shape or ca.strides != d.strides):
        raise arg_error(func, "c", f"the same sizes and strides as d when c is d ({d.shape}, {d.strides})", ca)
    if shared and not same:
        raise arg_error(func, "c", "d itself (the same memory, shape and strides) or an array sharing no memory "
                        "with d", "c partly overlapping d")
    if ca.dtype != d.dtype:
        raise arg_error(func, "c", f"dtype {d.dtype} (d's dtype)", ca)
    if ca.shape != d.shape:
        raise arg_error(func, "c", f"shape {d.shape} (d's shape)", ca)
    if ca.size and ca.shape[-1] > 1 and elem_stride(ca, -1) != 1:
        raise arg_error(func, "c", "a row-major array (stride(-1) == 1)", ca)
    check_compact_groups(ca, func, "c")
    if dryrun.active():  # a dry call computes nothing: no snapshot needed
        return ca, same
    return np.array(ca, copy=True), same
