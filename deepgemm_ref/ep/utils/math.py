"""``deep_ep.utils.math``: DeepEP's FP8 cast and cast back, ``calc_diff`` and small helpers.

These take NumPy arrays (ml_dtypes ``bfloat16`` / ``float8_e4m3fn``) or torch CPU tensors and
return the caller's kind.  ``per_token_cast_to_fp8`` is DeepEP's (contract 12), *not* DeepGEMM's:
per 128 channels ``amax = max(1e-4, max |x|)`` in float32, ``q = e4m3_RN(float(x) * m)`` with the
multiplier ``m = float32(float32(1 / amax) * 448)`` and the product rounded to float32, and
``sf = amax / 448`` (a float32 division).  DeepEP writes the multiplier ``448.0 / x_amax``: torch
evaluates a Python number divided by a tensor as the tensor's reciprocal times the number (two
roundings; measured on CPU, where it differs from the correctly rounded quotient for e.g.
``amax = 3``).  DeepGEMM's cast multiplies by ``1 / sf`` instead: the two are not interchangeable.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ... import formats as fm
from ...dtypes import BF16, E4M3, F32, I32
from ...errors import arg_error
from ...exact import align, ceil_div
from ...interop import caller_kind, count_bytes, from_numpy, is_tensor
from ...toolkit.args import as_array

__all__ = [
    "calc_diff",
    "safe_div",
    "ceil_div",
    "align",
    "per_token_cast_to_fp8",
    "per_token_cast_back",
    "inplace_unique",
    "create_grouped_scores",
    "hash_tensor",
    "hash_tensors",
    "count_bytes",
]

_FLOATS = (BF16, np.dtype(np.float16), F32)


def calc_diff(x: Any, y: Any) -> float:
    """DeepEP's difference measure: with ``x' = x + 1`` and ``y' = y + 1`` in float64,
    ``1 - 2 sum(x' y') / sum(x'^2 + y'^2)`` (the +1 on both sides is DeepEP's, unlike DeepGEMM's)."""
    if is_tensor(x) and is_tensor(y):
        xd, yd = x.double() + 1, y.double() + 1
        return float((1 - 2 * (xd * yd).sum() / (xd * xd + yd * yd).sum()).item())
    xa = np.asarray(as_array(x, "calc_diff", "x"), np.float64) + 1
    ya = np.asarray(as_array(y, "calc_diff", "y"), np.float64) + 1
    return float(1 - 2 * (xa * ya).sum() / (xa * xa + ya * ya).sum())


def safe_div(a: Any, b: Any) -> float:
    """``a / b``; ``0 / 0`` is 0 (any other division by zero raises ``ZeroDivisionError``)."""
    try:
        return a / b
    except ZeroDivisionError:
        if a == 0:
            return 0
        raise


def _floats(func: str, x: Any, arg: str = "x") -> np.ndarray:
    xa = as_array(x, func, arg)
    if xa.ndim != 2:
        raise arg_error(func, arg, "a 2-D array", xa, utility=True)
    if xa.dtype not in _FLOATS:
        raise arg_error(func, arg, "a bfloat16, float16 or float32 array", xa, utility=True)
    return xa


def per_token_cast_to_fp8(x: Any) -> Any:
    """DeepEP's per-token FP8 cast of a 2-D (m, n) array (see the module docstring).

    Returns ``(q, sf)``: ``q`` float8_e4m3fn (m, n) contiguous, ``sf`` float32 (m, ceil(n / 128))
    with ``q * sf`` approximating ``x`` per 128-channel block (the last block zero-padded).
    """
    func = "per_token_cast_to_fp8"
    xa = _floats(func, x)
    m, n = xa.shape
    an = align(n, 128)
    xp = np.zeros((m, an), F32)
    xp[:, :n] = xa  # exact: every accepted dtype widens exactly
    blocks = xp.reshape(m, an // 128, 128)
    amax = np.maximum(np.abs(blocks).max(axis=2, initial=np.float32(0)), np.float32(1e-4))  # NaN propagates
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        mult = (np.float32(1.0) / amax) * np.float32(448.0)  # torch's scalar / tensor: reciprocal, then multiply
        y = blocks * mult[:, :, None]
        sf = amax / np.float32(448.0)
    q = fm.encode_f32(y.reshape(m, an), fm.E4M3, fm.SATURATING_RNE).view(E4M3)[:, :n]
    kind = caller_kind(x)
    return from_numpy(np.ascontiguousarray(q), kind), from_numpy(sf.astype(F32), kind)


def per_token_cast_back(x_fp8: Any, x_scales: Any) -> Any:
    """DeepEP's cast back: ``bf16(float32(float(q) * s))`` per 128-channel block, ``s`` the float32
    scale or, for int32 scales, one UE8M0 byte per block (byte ``b`` is ``2^(b - 127)``, read as
    ``b << 23``).  Returns bf16 (m, n)."""
    func = "per_token_cast_back"
    q = as_array(x_fp8, func, "x_fp8")
    kind = caller_kind(x_fp8, x_scales)
    if q.size == 0:
        return from_numpy(q.astype(np.float32).astype(BF16), kind)
    if q.ndim != 2 or q.dtype != E4M3:
        raise arg_error(func, "x_fp8", "a 2-D float8_e4m3fn array", q, utility=True)
    s = as_array(x_scales, func, "x_scales")
    m, n = q.shape
    an = align(n, 128)
    xp = np.zeros((m, an), F32)
    xp[:, :n] = q.astype(F32)
    if s.dtype == I32:
        s = (np.ascontiguousarray(s).view(np.uint8).astype(np.int32) << 23).view(F32)
    elif s.dtype != F32:
        raise arg_error(func, "x_scales", "float32 scales or int32 packed UE8M0 bytes", s, utility=True)
    if s.size % max(m, 1) or (s.size // max(m, 1)) not in (1, an // 128):
        raise arg_error(func, "x_scales", f"{an // 128} scales per row (one per 128 channels)", s, utility=True)
    y = (xp.reshape(m, -1, 128) * np.asarray(s, F32).reshape(m, -1, 1)).reshape(m, an)
    return from_numpy(np.ascontiguousarray(y.astype(BF16)[:, :n]), kind)


def inplace_unique(x: Any, num_slots: int) -> None:
    """Rewrite each row of an integer (rows, w) array in place: its distinct values in
    ``[0, num_slots)`` in descending order, then -1 (negative entries are ignored)."""
    func = "inplace_unique"
    xa = as_array(x, func, "x")
    if xa.ndim != 2 or xa.dtype.kind not in "iu":
        raise arg_error(func, "x", "a 2-D integer array", xa, utility=True)
    if xa.size and int(xa.max()) >= num_slots:
        raise arg_error(func, "x", f"values below num_slots ({num_slots})", str(int(xa.max())), utility=True)
    rows = xa.shape[0]
    present = np.zeros((rows, num_slots + 1), bool)
    present[np.arange(rows)[:, None], np.where(xa < 0, num_slots, xa)] = True
    vals = np.where(present[:, :num_slots], np.arange(num_slots), -1)
    vals = -np.sort(-vals, axis=1)
    xa[:] = -1
    width = min(num_slots, xa.shape[1])
    xa[:, :width] = vals[:, :width]


def create_grouped_scores(scores: Any, group_idx: Any, num_groups: int) -> Any:
    """``scores`` (T, E) with the experts outside each token's selected groups multiplied by 0
    (``group_idx`` (T, G') int: the selected groups of ``num_groups`` equal expert groups)."""
    func = "create_grouped_scores"
    s = as_array(scores, func, "scores")
    g = np.asarray(as_array(group_idx, func, "group_idx"), np.int64)
    t, e = s.shape
    mask = np.zeros((t, num_groups), bool)
    mask[np.arange(t)[:, None], g] = True
    out = (s.reshape(t, num_groups, -1) * mask[:, :, None].astype(s.dtype)).reshape(t, e)
    return from_numpy(out, caller_kind(scores, group_idx))


def hash_tensor(t: Any) -> int:
    """The sum of a tensor's bytes read as int32 words (DeepEP's cheap checksum)."""
    a = np.ascontiguousarray(as_array(t, "hash_tensor", "t"))
    return int(a.view(np.int32).sum(dtype=np.int64))


def hash_tensors(*tensors: Any) -> int:
    """XOR of :func:`hash_tensor` over the tensors (nested tuples / lists included, None skipped)."""
    value = 0
    for t in tensors:
        if isinstance(t, (tuple, list)):
            value ^= hash_tensors(*t)
        elif t is not None:
            value ^= hash_tensor(t)
    return value


# re-exported as DeepEP's module has them
ceil_div = ceil_div
align = align
