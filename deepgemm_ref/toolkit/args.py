"""Argument coercion shared by every public function: arrays, pairs, ints, bools, strides, dtypes.

Each function checks one argument and raises :class:`DGArgumentError` naming the function, the
argument, what was expected and what came (``arg_error``'s format).  Nothing here allocates more
than the argument's own view, so every check can run before any output is touched.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, overload

import numpy as np

from ..dtypes import BF16, E4M3, F32, I8, I16, I32, U8, dtype_name  # re-exported for the kernels
from ..errors import DGArgumentError, arg_error
from ..exact import align, ceil_div  # re-exported for the kernels
from ..interop import to_numpy
from .sizes import INT_MAX, check_backed, size_arg

__all__ = [
    "E4M3",
    "BF16",
    "F32",
    "I8",
    "U8",
    "I16",
    "I32",
    "dtype_name",
    "packed_fp4",
    "as_array",
    "as_pair",
    "int_arg",
    "opt_int_arg",
    "bool_arg",
    "opt_bool_arg",
    "int_tuple",
    "int32_vector",
    "ks_list",
    "check",
    "check_compiled_dims",
    "unsupported",
    "strides",
    "elem_stride",
    "is_contiguous",
    "unit_stride",
    "major_of",
    "transposed",
    "transposed_pair",
    "ceil_div",
    "align",
]

def packed_fp4(x: np.ndarray) -> np.ndarray:
    """Packed FP4 in uint8 bytes as DeepGEMM's int8 storage (a view of the same bytes); other
    dtypes unchanged.  Where a kernel takes packed FP4 it takes int8, uint8 and (through
    :func:`deepgemm_ref.interop.to_numpy`) ``torch.float4_e2m1fn_x2`` tensors: the same bytes."""
    # Note: uint8 (and torch.float4_e2m1fn_x2) packed FP4 is accepted where the libraries take int8.
    return x.view(I8) if x.dtype == U8 else x


# ----------------------------------------------------------------------------------------------
# arrays
# ----------------------------------------------------------------------------------------------

@overload
def as_array(x: Any, func: str, arg: str, *, allow_none: Literal[False] = ...) -> np.ndarray: ...


@overload
def as_array(x: Any, func: str, arg: str, *, allow_none: Literal[True]) -> np.ndarray | None: ...


def as_array(x: Any, func: str, arg: str, *, allow_none: bool = False) -> np.ndarray | None:
    """A NumPy view of an array or torch CPU tensor argument (None only with ``allow_none``);
    a broadcast too large to work on is refused (:func:`.sizes.check_backed`)."""
    if x is None:
        if allow_none:
            return None
        raise arg_error(func, arg, "an array", "None")
    xa = to_numpy(x, func, arg)
    if not isinstance(xa, np.ndarray):
        raise arg_error(func, arg, "a NumPy array or torch CPU tensor", xa)
    check_backed(func, arg, xa)
    return xa


@overload
def as_pair(x: Any, func: str, arg: str, *, sf_optional: Literal[False] = ...) -> tuple[np.ndarray, np.ndarray]: ...


@overload
def as_pair(x: Any, func: str, arg: str, *, sf_optional: Literal[True]) -> tuple[np.ndarray, np.ndarray | None]: ...


def as_pair(x: Any, func: str, arg: str, *, sf_optional: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
    """A ``(data, scale factor)`` tuple (or 2-list) of arrays; the scale may be None with ``sf_optional``."""
    if not isinstance(x, (tuple, list)) or len(x) != 2:
        raise arg_error(func, arg, "a (data, scale factor) pair", f"{type(x).__name__}")
    data = as_array(x[0], func, f"{arg}[0]")
    sf = as_array(x[1], func, f"{arg}[1]", allow_none=True)
    if sf is None and not sf_optional:
        raise arg_error(func, f"{arg}[1]", "an array", "None")
    return data, sf


def transposed(x: Any, func: str, arg: str, axes: tuple[int, int]) -> np.ndarray:
    """``x`` with ``axes`` swapped (the NN / TN / TT layouts are transposed views of NT)."""
    xa = as_array(x, func, arg)
    nd = max(axes) + 1
    if xa.ndim != nd:
        raise arg_error(func, arg, f"a {nd}-D array", xa)
    return np.swapaxes(xa, *axes)


def transposed_pair(x: Any, func: str, arg: str, axes: tuple[int, int]) -> tuple[np.ndarray, np.ndarray | None]:
    """A (data, sf) pair with both swapped on ``axes``; the scale factor may be None."""
    if not isinstance(x, (tuple, list)) or len(x) != 2:
        raise arg_error(func, arg, "a (data, scale factor) pair", f"{type(x).__name__}")
    data = transposed(x[0], func, f"{arg}[0]", axes)
    sf = as_array(x[1], func, f"{arg}[1]", allow_none=True)
    nd = max(axes) + 1
    if sf is not None and sf.ndim != nd:
        raise arg_error(func, f"{arg}[1]", f"a {nd}-D scale-factor array", sf)
    return data, (None if sf is None else np.swapaxes(sf, *axes))


# ----------------------------------------------------------------------------------------------
# scalars and small sequences
# ----------------------------------------------------------------------------------------------

def int_arg(func: str, arg: str, v: Any, minimum: int | None = None) -> int:
    """A Python or NumPy integer (not a bool), at least ``minimum`` when given (no upper bound;
    size arguments the targets take as a C++ ``int`` use :func:`.sizes.size_arg`)."""
    return size_arg(func, arg, v, minimum, None)


def opt_int_arg(func: str, arg: str, v: Any, minimum: int | None = None) -> int | None:
    """None, or :func:`int_arg`."""
    return None if v is None else int_arg(func, arg, v, minimum)


def bool_arg(func: str, arg: str, v: Any) -> bool:
    """A Python or NumPy bool."""
    if not isinstance(v, (bool, np.bool_)):
        raise arg_error(func, arg, "a bool", f"{type(v).__name__} {v!r}")
    return bool(v)


def opt_bool_arg(func: str, arg: str, v: Any) -> bool | None:
    """None, or a Python or NumPy bool."""
    if v is None or isinstance(v, (bool, np.bool_)):
        return None if v is None else bool(v)
    raise arg_error(func, arg, "a bool or None", f"{type(v).__name__} {v!r}")


def int_tuple(func: str, arg: str, v: Any, lengths: tuple[int, ...]) -> tuple[int, ...]:
    """A tuple (or list) of one of the ``lengths``, of ints in [1, INT_MAX] (a C++ ``std::tuple``
    of ``int``; each checked by name)."""
    want = " or ".join(f"a {n}-tuple" for n in lengths) + " of positive ints"
    if not isinstance(v, (tuple, list)) or len(v) not in lengths:
        raise arg_error(func, arg, want, repr(v))
    return tuple(size_arg(func, f"{arg}[{i}]", g, minimum=1) for i, g in enumerate(v))


def int32_vector(func: str, arg: str, x: Any, n: int, what: str) -> np.ndarray:
    """An int32 contiguous 1-D array of ``n`` entries (``what`` names them); values as int64."""
    a = as_array(x, func, arg)
    if a.dtype != I32:
        raise arg_error(func, arg, "an int32 array", a)
    if a.ndim != 1:
        raise arg_error(func, arg, f"a 1-D array of {what}", a)
    if a.size > 1 and elem_stride(a, 0) != 1:
        raise arg_error(func, arg, "a contiguous array", a)
    if a.size != n:
        raise arg_error(func, arg, f"{n} entries ({what})", a)
    return a.astype(np.int64)


def ks_list(func: str, ks_cpu: Any) -> list[int] | None:
    """DeepGEMM's host-side K sizes: None, or a list (sequence, 1-D array) of ints."""
    if ks_cpu is None:
        return None
    ks_cpu = to_numpy(ks_cpu, func, "ks_cpu")
    if isinstance(ks_cpu, np.ndarray):
        if ks_cpu.ndim != 1:
            raise arg_error(func, "ks_cpu", "a list of ints, None or []", ks_cpu)
        ks_cpu = ks_cpu.tolist()
    if isinstance(ks_cpu, (str, bytes)) or not isinstance(ks_cpu, Sequence):
        raise arg_error(func, "ks_cpu", "a list of ints, None or []", f"{type(ks_cpu).__name__} {ks_cpu!r}")
    # DeepGEMM's host takes std::vector<int>: each entry a C++ int
    return [size_arg(func, f"ks_cpu[{i}]", k, minimum=None, maximum=INT_MAX) for i, k in enumerate(ks_cpu)]


def check(cond: bool, func: str, arg: str, expected: str, got: Any) -> None:
    """Raise the argument error for ``arg`` unless ``cond``."""
    if not cond:
        raise arg_error(func, arg, expected, got)


def check_compiled_dims(func: str, compiled_dims: Any) -> None:
    """``compiled_dims`` is a JIT hint without numeric effect: any string is accepted."""
    if not isinstance(compiled_dims, str):
        raise arg_error(func, "compiled_dims", "a string such as 'nk'", repr(compiled_dims))


def unsupported(func: str, what: str) -> DGArgumentError:
    return DGArgumentError(f"{func}: {what}")


# ----------------------------------------------------------------------------------------------
# strides and majors
# ----------------------------------------------------------------------------------------------

def strides(x: np.ndarray) -> tuple[int, ...]:
    """Strides in elements."""
    return tuple(s // x.itemsize for s in x.strides)


def elem_stride(x: np.ndarray, axis: int) -> int:
    """The stride of ``axis`` in elements (a fraction where the byte stride is not a multiple)."""
    s = x.strides[axis]
    return s // x.itemsize if s % x.itemsize == 0 else s / x.itemsize  # type: ignore[return-value]


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


def unit_stride(x: np.ndarray, axis: int) -> bool:
    """stride(axis) == 1, as DeepGEMM's checks read it (size-1 axes and empty arrays pass)."""
    # Note: zero-size arrays pass stride checks (NumPy gives them arbitrary strides, often 0).
    return x.size == 0 or x.shape[axis] <= 1 or strides(x)[axis] == 1


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
