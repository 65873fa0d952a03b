"""Range hooks of the GEMM-like families: where a correct accumulator can overflow inside a step
that the output's own ``S`` and ``acc`` do not show (docs/numerics.md, "The accumulator's range").

A block-scaled GEMM on a promoting device (DeepGEMM's sm90 kernels) multiplies each K block's
float32 partial sum by ``f32(sa * sb)``, the product of the two operands' scale factors.  That
product can overflow float32 while every term ``a_k b_k sa sb`` stays small (a small or zero
block against two large scales): ``partial * inf`` is then +-inf, and NaN for a zero partial.
:func:`scale_product_range` bounds the largest scale product of each output element from above by
``S1 = sum_k sa(k) sb(k)``: the error scale ``S`` of the same call with every data element
replaced by one (the package's exact model, the call regenerated through
:func:`.call.golden_of_call`), computed only when the case's scales can overflow at all and an
element's class differs from the golden.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import ml_dtypes
import numpy as np

from ..errors import DGArgumentError
from .call import entry_family, golden_of_call
from .cases import ArgRef
from .values import is_scale_name

__all__ = ["scale_product_range", "max_scale"]

_FLOAT_DATA = {np.dtype(ml_dtypes.bfloat16), np.dtype(np.float32), np.dtype(ml_dtypes.float8_e4m3fn)}
#: A byte of two packed E2M1 (FP4) ones: code 0b0010 in each nibble.
_FP4_ONES = np.int8(0x22)


def max_scale(x: Any) -> float:
    """The largest scale factor a scale tensor holds, as a float64 upper bound: the largest
    magnitude of a float tensor, ``2^(b - 127)`` for the largest byte ``b`` of a packed UE8M0 one."""
    arr = np.asarray(x.data if hasattr(x, "data") and not isinstance(x, np.ndarray) else x)
    if arr.size == 0:
        return 0.0
    if arr.dtype.kind == "f" or arr.dtype in _FLOAT_DATA:
        v = np.abs(arr.astype(np.float64))
        return float(np.nanmax(np.where(np.isnan(v), 0.0, v)))
    return float(2.0 ** (int(np.ascontiguousarray(arr).view(np.uint8).max()) - 127))


def _ones_like(name: str, x: Any) -> Any:
    """A data operand with every element one (scale factors, layouts and indices unchanged)."""
    arr = np.asarray(x)
    if is_scale_name(name):
        return x
    if arr.dtype in _FLOAT_DATA:
        return np.ones(arr.shape, arr.dtype)
    if arr.dtype == np.int8:  # packed FP4
        return np.full(arr.shape, _FP4_ONES)
    return x


def scale_product_range(entry: Mapping[str, Any], golden: Mapping[str, np.ndarray], inputs: Mapping[str, Any],
                        name: str) -> Any:
    """The range hook (:data:`.check.RangeHook`) of a block-scaled GEMM's main output: every
    class (+inf, -inf, NaN) is reachable where ``S1 >= acc_max`` (module docstring); None for a
    case with fewer than two scale tensors or another output."""
    main = entry.get("main_output") or next(iter(entry.get("outputs") or {}), None)
    scales = [v for k, v in inputs.items() if is_scale_name(k)]
    if name != main or len(scales) < 2 or "args" not in entry:
        return None
    top = 1.0
    for s in scales:
        top *= max_scale(s)
    cache: dict[str, np.ndarray | None] = {}

    def s1() -> np.ndarray | None:
        if "S1" not in cache:
            ones = {k: _ones_like(k, v) for k, v in inputs.items()}
            try:
                g, _ = golden_of_call(entry, [ArgRef.from_json(a) for a in entry["args"]],
                                      {k: ArgRef.from_json(v) for k, v in entry["kwargs"].items()}, ones,
                                      entry["outputs"], entry_family(entry))
                cache["S1"] = np.asarray(g["S"], np.float64).ravel() if "S" in g else None
            except (DGArgumentError, KeyError, ValueError):  # a layout that refuses ones: no allowance
                cache["S1"] = None
        return cache["S1"]

    def hook(flat: np.ndarray, u_acc: float, n: int, acc_max: float) -> Any:
        if top < acc_max:  # no scale product of this case can overflow
            return None
        s = s1()
        if s is None:
            return None
        reach = s[flat] >= acc_max
        return reach, reach, reach

    return hook
