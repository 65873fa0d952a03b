"""Argument checks shared by the kernel families: operand pairs, majors, dtypes, recipes, outputs.

Every check raises :class:`DGArgumentError` naming the function, the argument, what was expected
and what came, and runs before any caller-owned buffer is written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from . import formats as fm
from .core import Operand
from .errors import DGArgumentError, arg_error
from .interop import to_numpy

__all__ = [
    "E4M3",
    "BF16",
    "as_array",
    "as_pair",
    "major_of",
    "check_out",
    "OperandSpec",
    "ab_operand",
    "fp4_codes",
    "check_compiled_dims",
    "resolve_c",
]

E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = np.dtype(np.float32)
I8 = np.dtype(np.int8)


def as_array(x: Any, func: str, arg: str, *, allow_none: bool = False) -> np.ndarray | None:
    """A NumPy view of an array or torch CPU tensor argument."""
    if x is None:
        if allow_none:
            return None
        raise arg_error(func, arg, "an array", "None")
    xa = to_numpy(x, func, arg)
    if not isinstance(xa, np.ndarray):
        raise arg_error(func, arg, "a NumPy array or torch CPU tensor", xa)
    return xa


def as_pair(x: Any, func: str, arg: str, *, sf_optional: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
    """``(data, sf)`` tuple (or 2-list) of arrays."""
    if not isinstance(x, (tuple, list)) or len(x) != 2:
        raise arg_error(func, arg, "a (data, scale factor) pair", f"{type(x).__name__}")
    data = as_array(x[0], func, f"{arg}[0]")
    sf = as_array(x[1], func, f"{arg}[1]", allow_none=sf_optional)
    assert data is not None
    return data, sf


def is_contiguous(x: np.ndarray) -> bool:
    """torch's ``is_contiguous()``: row-major strides ignoring size-1 dims; empty is contiguous."""
    if x.size == 0:
        return True
    expected = x.itemsize
    for size, st in zip(reversed(x.shape), reversed(x.strides), strict=True):
        if size != 1 and st != expected:
            return False
        expected *= size
    return True


def elem_stride(x: np.ndarray, axis: int) -> int:
    s = x.strides[axis]
    return s // x.itemsize if s % x.itemsize == 0 else s / x.itemsize  # type: ignore[return-value]


def major_of(x: np.ndarray, func: str, arg: str) -> str:
    """'K' when the last dimension is contiguous (stride 1), else 'MN' when the one before is.

    DeepGEMM's rule: stride(-1) == 1 wins; otherwise stride(-2) must be 1; a 3-D operand needs
    stride(0) == size(1) * size(2).
    """
    if x.ndim not in (2, 3):
        raise arg_error(func, arg, "a 2-D or 3-D array", x)
    if x.ndim == 3 and x.shape[0] > 1 and elem_stride(x, 0) != x.shape[1] * x.shape[2]:
        raise arg_error(func, arg, "a 3-D array with stride(0) == size(1) * size(2)", x)
    if x.size == 0 or elem_stride(x, -1) == 1 or x.shape[-1] == 1 and elem_stride(x, -2) != 1:
        return "K"
    if elem_stride(x, -2) == 1 or x.shape[-2] == 1:
        return "MN"
    raise arg_error(func, arg, "stride(-1) == 1 (K-major) or stride(-2) == 1 (MN-major)", x)


def _check_compact_groups(x: np.ndarray, func: str, arg: str) -> None:
    """DeepGEMM's major check of a 3-D C/D: groups packed back to back (stride(0) == M * N)."""
    if x.ndim == 3 and x.size and x.shape[0] > 1 and elem_stride(x, 0) != x.shape[1] * x.shape[2]:
        raise arg_error(func, arg, f"compact groups (stride(0) == {x.shape[1] * x.shape[2]})", x)


def check_out(d: np.ndarray, func: str, shape: tuple[int, ...], dtypes: tuple[np.dtype, ...], arg: str = "d") -> None:
    """Output checks: shape, dtype, row-major (stride(-1) == 1), writeable."""
    if tuple(d.shape) != tuple(shape):
        raise arg_error(func, arg, f"shape {tuple(shape)}", d)
    if d.dtype not in dtypes:
        raise arg_error(func, arg, "dtype " + " or ".join(str(t) for t in dtypes), d)
    if d.size and d.shape[-1] > 1 and elem_stride(d, -1) != 1:
        raise arg_error(func, arg, "a row-major array (stride(-1) == 1)", d)
    _check_compact_groups(d, func, arg)
    if not d.flags.writeable:
        raise arg_error(func, arg, "a writeable array", d)


def check_compiled_dims(func: str, compiled_dims: Any) -> None:
    """``compiled_dims`` is a JIT hint without numeric effect: any string is accepted."""
    if not isinstance(compiled_dims, str):
        raise arg_error(func, "compiled_dims", "a string such as 'nk'", repr(compiled_dims))


def fp4_codes(x: np.ndarray, major: str) -> np.ndarray:
    """Packed FP4 (int8) operand -> uint8 E2M1 codes of logical shape (MN, K) (or (G, MN, K)).

    K-major: bytes along K hold (even, odd) K elements in (low, high) nibbles; MN-major: bytes
    along MN hold (even, odd) MN elements.
    """
    if major == "K":
        return fm.unpack_fp4(x)
    codes = fm.unpack_fp4(np.swapaxes(x, -1, -2))  # pack axis last
    return np.swapaxes(codes, -1, -2)


@dataclass
class OperandSpec:
    """An A/B operand in logical (MN, K) orientation after shape inference."""

    data: np.ndarray  # the user's array, transposed into (G?, MN, K') orientation
    major: str
    is_fp4: bool
    mn: int
    k: int
    groups: int | None = None


def ab_operand(x: np.ndarray, func: str, arg: str, *, grouped: bool = False,
               allowed: tuple[np.dtype, ...] = (E4M3, I8)) -> OperandSpec:
    """Shape inference of DeepGEMM's ``check_ab_fp8_fp4``: an int8 (packed FP4) operand doubles
    its K extent when K-major and its MN extent when MN-major."""
    ndim = 3 if grouped else 2
    if x.ndim != ndim:
        raise arg_error(func, arg, f"a {ndim}-D array", x)
    if x.dtype not in allowed:
        raise arg_error(func, arg, "dtype " + " or ".join(_dtype_name(t) for t in allowed), x)
    major = major_of(x, func, arg)
    is_fp4 = x.dtype == I8
    mn, k = int(x.shape[-2]), int(x.shape[-1])
    if is_fp4:
        if major == "K":
            k *= 2
        else:
            mn *= 2
    return OperandSpec(x, major, is_fp4, mn, k, int(x.shape[0]) if grouped else None)


def _dtype_name(t: np.dtype) -> str:
    return {E4M3: "float8_e4m3fn", I8: "int8 (packed FP4)", BF16: "bfloat16"}.get(t, str(t))


def make_operand(spec: OperandSpec, scales: np.ndarray | None, block: int, group: int | None = None) -> Operand:
    """A core Operand for one (MN, K) matrix (one group of a grouped operand)."""
    data = spec.data if group is None else spec.data[group]
    if spec.is_fp4:
        return Operand(fp4_codes(data, spec.major), scales, block, codes_fmt=fm.E2M1)
    return Operand(data, scales, block)


def resolve_c(c: Any, d: np.ndarray, func: str) -> tuple[np.ndarray | None, bool]:
    """(a snapshot of C, whether c is d): DeepGEMM's early_return checks on ``c``."""
    if c is None:
        return None, False
    ca = as_array(c, func, "c")
    assert ca is not None
    same = np.shares_memory(ca, d) and ca.__array_interface__["data"][0] == d.__array_interface__["data"][0]
    if same and (ca.shape != d.shape or ca.strides != d.strides):
        raise arg_error(func, "c", f"the same sizes and strides as d when c is d ({d.shape}, {d.strides})", ca)
    if ca.dtype != d.dtype:
        raise arg_error(func, "c", f"dtype {d.dtype} (d's dtype)", ca)
    if ca.shape != d.shape:
        raise arg_error(func, "c", f"shape {d.shape} (d's shape)", ca)
    if ca.size and ca.shape[-1] > 1 and elem_stride(ca, -1) != 1:
        raise arg_error(func, "c", "a row-major array (stride(-1) == 1)", ca)
    _check_compact_groups(ca, func, "c")
    return np.array(ca, copy=True), same


def unsupported(func: str, what: str) -> DGArgumentError:
    return DGArgumentError(f"{func}: {what}")
