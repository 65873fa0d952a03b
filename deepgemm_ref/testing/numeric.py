"""``deepgemm_ref.testing.numeric``: ``deep_gemm.testing.numeric`` (calc_diff, count_bytes,
assert_bitwise_equal) and a ULP-distance helper; NumPy arrays and torch CPU tensors."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from ..errors import arg_error
from ..interop import caller_kind, count_bytes, to_numpy

__all__ = ["calc_diff", "count_bytes", "assert_bitwise_equal", "ulp_distance"]


def _as_f64(x: Any, func: str, arg: str) -> np.ndarray:
    xa = to_numpy(x, func, arg)
    xa = np.asarray(xa)
    if xa.dtype.kind not in "fiub" and xa.dtype.itemsize > 2 and xa.dtype != ml_dtypes.bfloat16:
        raise arg_error(func, arg, "a real numeric array", xa)
    return xa.astype(np.float64)


def calc_diff(x: Any, y: Any) -> Any:
    """DeepGEMM's similarity metric: ``1 - 2 sum(x y) / sum(x^2 + y^2)`` in float64.

    Equal to ``|x - y|^2 / (|x|^2 + |y|^2)``.  Returns the Python float ``0.0`` when both inputs
    are all zeros, else a 0-d float64 (a NumPy scalar, or a 0-d tensor for torch inputs).
    Thresholds used by DeepGEMM's tests: 1e-5 (BF16), 1e-3 (FP8), 1e-2 (one FP4 operand),
    2e-2 (FP4 x FP4).
    """
    xd = _as_f64(x, "calc_diff", "x")
    yd = _as_f64(y, "calc_diff", "y")
    denominator = (xd * xd + yd * yd).sum()
    if denominator == 0:
        return 0.0
    sim = 2 * (xd * yd).sum() / denominator
    result = np.float64(1 - sim)
    if caller_kind(x, y) == "torch":
        import torch  # the caller passed a tensor, so torch is already imported

        return torch.tensor(float(result), dtype=torch.float64)
    return result


def _raw_bytes(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x).reshape(-1).view(np.uint8)


def assert_bitwise_equal(x: Any, y: Any, label: str = "") -> None:
    """Assert that ``x`` and ``y`` have equal shapes, dtypes and bytes.

    On a mismatch raises ``AssertionError`` naming the label, the number of bytes and of
    mismatching bytes, the first mismatching byte, its element index and coordinate, the byte
    within the element, both byte values and both element values (as DeepGEMM does).
    """
    xa = np.asarray(to_numpy(x, "assert_bitwise_equal", "x"))
    ya = np.asarray(to_numpy(y, "assert_bitwise_equal", "y"))
    assert xa.shape == ya.shape, f"shape mismatch: {xa.shape} vs {ya.shape}"
    assert xa.dtype == ya.dtype, f"dtype mismatch: {xa.dtype} vs {ya.dtype}"
    xb, yb = _raw_bytes(xa), _raw_bytes(ya)
    if np.array_equal(xb, yb):
        return
    mismatch = xb != yb
    first = int(np.flatnonzero(mismatch)[0])
    itemsize = xa.dtype.itemsize
    elem = first // itemsize
    coord = tuple(int(v) for v in np.unravel_index(elem, xa.shape)) if xa.ndim else ()
    xv = xa.reshape(-1)[elem]
    yv = ya.reshape(-1)[elem]
    raise AssertionError(
        f"bitwise mismatch{f' ({label})' if label else ''}: "
        f"num_bytes={mismatch.size}, num_mismatch={int(mismatch.sum())}, "
        f"first_byte={first}, elem={elem}, coord={coord}, byte_in_elem={first % itemsize}, "
        f"x_byte={int(xb[first])}, y_byte={int(yb[first])}, x_val={float(xv)!r}, y_val={float(yv)!r}"
    )


def _ordered(bits: np.ndarray, nbits: int) -> np.ndarray:
    """Map sign-magnitude float bits to integers ordered like the values (+0 and -0 both 0)."""
    b = bits.astype(np.int64)
    sign = (b >> (nbits - 1)) & 1
    mag = b & ((1 << (nbits - 1)) - 1)
    return np.where(sign == 1, -mag, mag)


def ulp_distance(x: Any, y: Any) -> np.ndarray:
    """Number of representable values between ``x`` and ``y`` (same float dtype), as int64.

    Works for float64, float32, float16, bfloat16 and the ml_dtypes 8-bit floats.  +0 and -0 are
    0 apart.  Where exactly one side is NaN the distance is ``iinfo(int64).max``; two NaNs are
    0 apart (NaN is compared by class, never by bits).
    """
    xa = np.asarray(to_numpy(x, "ulp_distance", "x"))
    ya = np.asarray(to_numpy(y, "ulp_distance", "y"))
    if xa.dtype != ya.dtype:
        raise arg_error("ulp_distance", "y", f"dtype {xa.dtype} (the dtype of x)", ya)
    if xa.shape != ya.shape:
        raise arg_error("ulp_distance", "y", f"shape {xa.shape} (the shape of x)", ya)
    size = xa.dtype.itemsize
    if size not in (1, 2, 4, 8) or xa.dtype.kind in "iub":
        raise arg_error("ulp_distance", "x", "a floating-point dtype", xa)
    udt = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[size]
    if size == 8:
        # int64 arithmetic on the ordered bits would overflow for opposite signs; use float64 diff
        # of the ordered integers split into high and low halves instead.
        xb = np.ascontiguousarray(xa).view(udt)
        yb = np.ascontiguousarray(ya).view(udt)
        ox = _ordered64(xb)
        oy = _ordered64(yb)
        dist = np.abs(ox.astype(object) - oy.astype(object)).astype(np.float64)
        dist = np.minimum(dist, float(np.iinfo(np.int64).max)).astype(np.int64)
    else:
        ox = _ordered(np.ascontiguousarray(xa).view(udt), 8 * size)
        oy = _ordered(np.ascontiguousarray(ya).view(udt), 8 * size)
        dist = np.abs(ox - oy)
    xn = np.isnan(xa.astype(np.float64))
    yn = np.isnan(ya.astype(np.float64))
    dist = np.where(xn & yn, 0, dist)
    dist = np.where(xn ^ yn, np.iinfo(np.int64).max, dist)
    return dist.astype(np.int64)


def _ordered64(bits: np.ndarray) -> np.ndarray:
    sign = (bits >> np.uint64(63)).astype(bool)
    mag = (bits & np.uint64(0x7FFFFFFFFFFFFFFF)).astype(np.int64)
    return np.where(sign, -mag, mag)
