"""Torch CPU tensors in and out, without copies where possible; torch is never imported here.

Every public function of the package takes NumPy arrays (ml_dtypes dtypes for the narrow
formats) and, when torch is already imported by the caller, torch CPU tensors.  Inputs are
turned into NumPy views of the same memory (same strides, so layout checks see what the
device would see); outputs written into a caller's tensor go through such a view, so they
land in place; returned arrays are converted back to the caller's kind.
"""

from __future__ import annotations

import sys
from typing import Any, Literal

import ml_dtypes
import numpy as np

from .errors import DGArgumentError

__all__ = ["Kind", "is_tensor", "to_numpy", "from_numpy", "caller_kind", "torch_dtype_name", "TORCH_TO_NUMPY"]

Kind = Literal["numpy", "torch"]

# torch dtype name -> (torch dtype used for the zero-copy view, numpy dtype of the result)
TORCH_TO_NUMPY: dict[str, tuple[str, np.dtype]] = {
    "bfloat16": ("int16", np.dtype(ml_dtypes.bfloat16)),
    "float8_e4m3fn": ("uint8", np.dtype(ml_dtypes.float8_e4m3fn)),
    "float8_e5m2": ("uint8", np.dtype(ml_dtypes.float8_e5m2)),
    "float8_e8m0fnu": ("uint8", np.dtype(ml_dtypes.float8_e8m0fnu)),
    # Packed FP4 in torch's own dtype becomes DeepGEMM's storage: int8, two codes per byte.
    "float4_e2m1fn_x2": ("int8", np.dtype(np.int8)),
}
_NUMPY_TO_TORCH: dict[str, tuple[str, str]] = {
    "bfloat16": ("int16", "bfloat16"),
    "float8_e4m3fn": ("uint8", "float8_e4m3fn"),
    "float8_e5m2": ("uint8", "float8_e5m2"),
    "float8_e8m0fnu": ("uint8", "float8_e8m0fnu"),
}


def _torch() -> Any:
    return sys.modules.get("torch")


def is_tensor(x: Any) -> bool:
    """True for a torch tensor (only possible when the caller has imported torch)."""
    torch = _torch()
    return torch is not None and isinstance(x, torch.Tensor)


def torch_dtype_name(dtype: Any) -> str:
    """'torch.bfloat16' -> 'bfloat16'."""
    return str(dtype).rsplit(".", 1)[-1]


def to_numpy(x: Any, func: str = "deepgemm_ref", arg: str = "x") -> Any:
    """A NumPy view of a torch CPU tensor (same memory, same strides); other inputs unchanged.

    ``None``, Python scalars, tuples and NumPy arrays pass through.  A tensor on another device
    or with ``requires_grad`` set is an argument error (we never move data behind the caller's
    back).
    """
    if not is_tensor(x):
        return x
    if x.device.type != "cpu":
        raise DGArgumentError(f"{func}: {arg}: expected a CPU tensor; got a tensor on {x.device}")
    t = x.detach()
    name = torch_dtype_name(t.dtype)
    torch = _torch()
    if name in TORCH_TO_NUMPY:
        view_name, np_dtype = TORCH_TO_NUMPY[name]
        return t.view(getattr(torch, view_name)).numpy().view(np_dtype)
    try:
        return t.numpy()
    except TypeError as e:  # pragma: no cover - dtypes numpy cannot hold
        raise DGArgumentError(f"{func}: {arg}: unsupported tensor dtype {t.dtype}") from e


def from_numpy(arr: Any, kind: Kind) -> Any:
    """Convert a result to the caller's kind (a torch CPU tensor sharing memory when possible)."""
    if kind == "numpy" or arr is None:
        return arr
    if isinstance(arr, tuple):
        return tuple(from_numpy(a, kind) for a in arr)
    if isinstance(arr, np.generic):  # a NumPy scalar from a 0-d computation: a 0-d tensor
        arr = np.array(arr)
    if not isinstance(arr, np.ndarray):
        return arr
    torch = _torch()
    if torch is None:  # pragma: no cover - kind "torch" implies torch is imported
        raise DGArgumentError("from_numpy: torch is not imported")
    if any(s < 0 for s in arr.strides) or not arr.flags.writeable or _degenerate_contiguous(arr):
        arr = arr.copy()
    name = arr.dtype.name
    if name in _NUMPY_TO_TORCH:
        storage, tname = _NUMPY_TO_TORCH[name]
        return torch.from_numpy(arr.view(np.dtype(storage))).view(getattr(torch, tname))
    if arr.dtype == ml_dtypes.float4_e2m1fn:
        raise DGArgumentError("from_numpy: unpacked float4 arrays have no torch dtype; pack them first")
    return torch.from_numpy(arr)


def _degenerate_contiguous(arr: np.ndarray) -> bool:
    """C-contiguous by NumPy's rules but with other strides on size-1 dimensions (a transposed
    (n, 1) array): torch would keep those strides, and DeepGEMM checks e.g. stride(0) == mn."""
    if not arr.flags.c_contiguous or arr.ndim < 2:
        return False
    canonical, step = [], arr.itemsize
    for dim in reversed(arr.shape):
        canonical.append(step)
        step *= max(dim, 1)
    return tuple(reversed(canonical)) != arr.strides


def caller_kind(*args: Any) -> Kind:
    """'torch' when any argument (or an element of a tuple argument) is a torch tensor."""
    for a in args:
        if isinstance(a, (tuple, list)):
            if caller_kind(*a) == "torch":
                return "torch"
        elif is_tensor(a):
            return "torch"
    return "numpy"
