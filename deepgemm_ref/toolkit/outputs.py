"""Checks of what a kernel writes: its outputs and its accumulator input ``c``.

Every kernel calls :func:`check_out` for each output buffer and :func:`resolve_c` for ``c``,
after its other arguments are validated and before anything is computed or written: these are
the one place where output contracts (shape, dtype, row-major, writeable, aliasing) are stated.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import dryrun
from ..errors import arg_error
from .args import as_array, elem_stride

__all__ = ["check_out", "check_compact_groups", "resolve_c", "snapshot_c"]


def check_compact_groups(x: np.ndarray, func: str, arg: str) -> None:
    """DeepGEMM's major check of a 3-D C/D: groups packed back to back (stride(0) == M * N)."""
    if x.ndim == 3 and x.size and x.shape[0] > 1 and elem_stride(x, 0) != x.shape[1] * x.shape[2]:
        raise arg_error(func, arg, f"compact groups (stride(0) == {x.shape[1] * x.shape[2]})", x)


def check_out(d: np.ndarray, func: str, shape: tuple[int, ...], dtypes: tuple[np.dtype, ...], arg: str = "d") -> None:
    """Output checks: shape, dtype, row-major (stride(-1) == 1), compact groups, writeable."""
    if tuple(d.shape) != tuple(shape):
        raise arg_error(func, arg, f"shape {tuple(shape)}", d)
    if d.dtype not in dtypes:
        raise arg_error(func, arg, "dtype " + " or ".join(str(t) for t in dtypes), d)
    if d.size and d.shape[-1] > 1 and elem_stride(d, -1) != 1:
        raise arg_error(func, arg, "a row-major array (stride(-1) == 1)", d)
    check_compact_groups(d, func, arg)
    if not d.flags.writeable:
        raise arg_error(func, arg, "a writeable array", d)


def resolve_c(c: Any, d: np.ndarray, func: str) -> tuple[np.ndarray | None, bool]:
    """(a snapshot of C or None, whether c is d): :func:`snapshot_c` of a given ``c``."""
    if c is None:
        return None, False
    return snapshot_c(c, d, func)


def snapshot_c(c: Any, d: np.ndarray, func: str) -> tuple[np.ndarray, bool]:
    """(a snapshot of C, whether c is d): DeepGEMM's checks on ``c`` (same sizes and strides as
    d when it is d; d's dtype and shape; row-major; compact groups)."""
    ca = as_array(c, func, "c")
    same = np.shares_memory(ca, d) and ca.__array_interface__["data"][0] == d.__array_interface__["data"][0]
    if same and (ca.shape != d.shape or ca.strides != d.strides):
        raise arg_error(func, "c", f"the same sizes and strides as d when c is d ({d.shape}, {d.strides})", ca)
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
