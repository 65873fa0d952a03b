"""Torch CPU tensors in and out, without copies where possible; torch is never imported here.

Every public function of the package takes NumPy arrays (ml_dtypes dtypes for the narrow
formats) and, when torch is already imported by the caller, torch CPU tensors.  Inputs are
turned into NumPy views of the same memory (same strides, so layout checks see what the
device would see); outputs written into a caller's tensor go through such a view, so they
land in place; returned arrays are converted back to the caller's kind.

Packed FP4 comes as int8 bytes (DeepGEMM's storage), uint8 bytes, or a ``torch.float4_e2m1fn_x2``
tensor: all three are the same bytes, two E2M1 codes per byte, and all become an int8 view here
(uint8 NumPy arrays are reinterpreted where a kernel expects packed FP4, see
:func:`deepgemm_ref.toolkit.operands.fp4_bytes`).

Under DeepGEMM-Ascend's dry run (:mod:`deepgemm_ref.dryrun`) ``meta`` tensors are accepted: each
becomes a stand-in array of its shape, dtype and strides, and what a call on them returns comes
back as meta tensors (kind ``"meta"``).
"""

from __future__ import annotations

import sys
from typing import Any, Literal

import ml_dtypes
import numpy as np

from . import dryrun
from .errors import DGArgumentError

__all__ = ["Kind", "is_tensor", "to_numpy", "from_numpy", "caller_kind", "torch_dtype_name", "TORCH_TO_NUMPY",
           "count_bytes"]

Kind = Literal["numpy", "torch", "meta"]

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
    back); a ``meta`` tensor is accepted inside a dry call only (:func:`deepgemm_ref.dryrun.phantom`).
    """
    if not is_tensor(x):
        return x
    torch = _torch()
    if x.layout != torch.strided:  # sparse (COO, CSR, ...) or mkldnn: no strided memory to view
        raise DGArgumentError(f"{func}: {arg}: expected a dense (strided) tensor; got a tensor of layout {x.layout}")
    t = x.detach()
    name = torch_dtype_name(t.dtype)
    if x.device.type == "meta":
        np_dtype = TORCH_TO_NUMPY[name][1] if name in TORCH_TO_NUMPY else _numpy_dtype_of(t, func, arg)
        storage = t.untyped_storage()
        stand_in = dryrun.phantom(t, np_dtype, int(storage._cdata), int(storage.nbytes()))
        if stand_in is None:
            raise DGArgumentError(
                f"{func}: {arg}: expected a CPU tensor; got a tensor on meta (meta tensors are accepted only "
                "under DeepGEMM-Ascend's dry run: deepgemm_ref.testing.par_compile.dry_run() under ascend950)")
        return stand_in
    if x.device.type != "cpu":
        raise DGArgumentError(f"{func}: {arg}: expected a CPU tensor; got a tensor on {x.device}")
    if name in TORCH_TO_NUMPY:
        view_name, np_dtype = TORCH_TO_NUMPY[name]
        return t.view(getattr(torch, view_name)).numpy().view(np_dtype)
    try:
        return t.numpy()
    except TypeError as e:  # pragma: no cover - dtypes numpy cannot hold
        raise DGArgumentError(f"{func}: {arg}: unsupported tensor dtype {t.dtype}") from e


def _numpy_dtype_of(t: Any, func: str, arg: str) -> np.dtype:
    """The NumPy dtype a CPU tensor of ``t``'s dtype would have (without touching ``t``'s data)."""
    torch = _torch()
    try:
        return np.dtype(torch.empty(0, dtype=t.dtype).numpy().dtype)
    except TypeError as e:  # pragma: no cover - dtypes numpy cannot hold
        raise DGArgumentError(f"{func}: {arg}: unsupported tensor dtype {t.dtype}") from e


def from_numpy(arr: Any, kind: Kind) -> Any:
    """Convert a result to the caller's kind (a torch CPU tensor sharing memory when possible;
    for kind ``"meta"`` a meta tensor of the same shape, dtype and strides)."""
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
    if kind == "meta":
        strides = tuple(s // arr.itemsize for s in arr.strides) if arr.size else None
        empty = from_numpy(np.empty(0, arr.dtype), "torch")
        if strides is None or any(s < 0 for s in strides):
            return torch.empty(arr.shape, dtype=empty.dtype, device="meta")
        return torch.empty_strided(arr.shape, strides, dtype=empty.dtype, device="meta")
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
    """'torch' when any argument (or an element of a tuple argument) is a torch tensor; 'meta'
    when one of them is a meta tensor (dry run)."""
    kind: Kind = "numpy"
    for a in args:
        k = caller_kind(*a) if isinstance(a, (tuple, list)) else (
            ("meta" if a.device.type == "meta" else "torch") if is_tensor(a) else "numpy")
        if k == "meta":
            return "meta"
        if k == "torch":
            kind = "torch"
    return kind


def count_bytes(*tensors: Any) -> int:
    """Total bytes of the arrays or tensors given (recursing into tuples and lists; None skipped).

    DeepGEMM's ``testing.count_bytes`` and DeepEP's ``utils.math.count_bytes`` (the same function)."""
    total = 0
    for t in tensors:
        if isinstance(t, (tuple, list)):
            total += count_bytes(*t)
        elif t is not None:
            if is_tensor(t):
                total += int(t.numel() * t.element_size())
            else:
                a = np.asarray(t)
                total += int(a.size * a.dtype.itemsize)
    return total
