"""Device reduction models of MQA logits: how each target turns per-head dot products into a logit.

Used under the ``fp32`` and ``limited`` accumulation models (the exact model rounds the exact
logit once instead; see :mod:`.logits`).  ``x`` is the float32 (rows, H, n) array of per-head dot
products the core computed in that model, ``w`` the (rows, H) weights, ``kvs`` DeepGEMM's
per-token FP8 KV scale (or None).  Every helper emulates one IEEE operation exactly (round-to-odd
float64, then one rounding), so the models are deterministic bit for bit.

:data:`REDUCTIONS` maps a target's reduction name (the plan's ``reduction``) to its model; a
target whose kernel rounds intermediate values differently gets its own entry here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .. import formats as fm
from ..exact import dd_to_f64_round_odd, two_sum
from ..toolkit.args import BF16

__all__ = ["ASCEND_BF16_MULA_FUSED", "REDUCTIONS", "model_logits", "DataFlowRoundings", "data_flow_roundings"]

# Note: DeepGEMM-Ascend's bf16 multiply-accumulate is modelled as fused (one rounding per head);
# the port's source does not say, and the choice only matters under the fp32 / limited models.
#: DeepGEMM-Ascend's head reduction uses the vector instruction ``asc_mula`` (bf16 registers,
#: ``acc += value * w``).  Modelled as fused: one rounding per step.  A bf16 x bf16 product is
#: exact in any multiplier wider than 16 significand bits, so the only rounding the instruction
#: needs is the write-back to its bf16 destination; DeepGEMM's own bf16 path (``__hfma2``) is fused
#: too.  The port's source does not say; ``False`` selects multiply-then-add.
ASCEND_BF16_MULA_FUSED = True


def _fma_f32(a: np.ndarray, w: np.ndarray, c: np.ndarray) -> np.ndarray:
    """float32 ``fma(a, w, c)``: RN_f32(a * w + c) with one rounding (a * w is exact in float64)."""
    s, e = two_sum(c.astype(np.float64), a.astype(np.float64) * w)
    return dd_to_f64_round_odd(s, e).astype(np.float32)


def _to_bf16_value(x: np.ndarray) -> np.ndarray:
    """RNE to bfloat16 of float32 or float64 values (correct rounding), returned as float64."""
    return fm.cast(x, fm.BF16, fm.IEEE_RNE).astype(np.float64)


def _fma_bf16(a: np.ndarray, w: np.ndarray, c: np.ndarray) -> np.ndarray:
    """bf16 fused multiply-add RN_bf16(a * w + c) on bf16 values held in float64."""
    s, e = two_sum(c, a * w)  # a * w: 8 + 8 significand bits, exact
    return _to_bf16_value(dd_to_f64_round_odd(s, e))


def _add_bf16(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    s, e = two_sum(a, b)
    return _to_bf16_value(dd_to_f64_round_odd(s, e))


# ----------------------------------------------------------------------------------------------
# head reductions of the device models (x: float32 (rows, H, n) per-head dot products)
# ----------------------------------------------------------------------------------------------

def _reduce_sm100_f32(x: np.ndarray, w: np.ndarray, kvs: np.ndarray | None) -> np.ndarray:
    """DeepGEMM sm100, float32 weights: float32 (rows, n) before the cast to logits_dtype.

    Lanes (A.x, A.y, B.x, B.y) take heads 4u, 4u+1, 4u+2, 4u+3; acc = fma(f32(x + |x|), w, acc).
    """
    rows, heads, n = x.shape
    with np.errstate(over="ignore", invalid="ignore"):
        a = x + np.abs(x)  # float32 add: 2x (or 0), one IEEE rounding (overflow to inf)
        acc = np.zeros((rows, 4, n), np.float32)
        w32 = w.astype(np.float32)
        for u in range(heads // 4):
            acc = _fma_f32(a[:, 4 * u:4 * u + 4], w32[:, 4 * u:4 * u + 4, None], acc)
        sx = acc[:, 0] + acc[:, 2]  # __fadd2_rn(A, B)
        sy = acc[:, 1] + acc[:, 3]
        red = (sx + sy) / np.float32(2)
        if kvs is not None:
            red = red * kvs.astype(np.float32)[None, :]
    return red


def _reduce_sm100_bf16(x: np.ndarray, w: np.ndarray, kvs: np.ndarray | None) -> np.ndarray:
    """DeepGEMM sm100, bfloat16 weights: bf16 values (as float64) (rows, n).

    r = bf16(relu(x)); lanes as the float32 path with fused bf16 FMAs (``__hfma2``); lane sums
    with bf16 adds; then bf16(reduced * bf16(kv_scale)) in FP8 mode.
    """
    rows, heads, n = x.shape
    with np.errstate(over="ignore", invalid="ignore"):
        r = _to_bf16_value(np.maximum(x, np.float32(0))).reshape(rows, heads, n)
        acc = np.zeros((rows, 4, n))
        w64 = w.astype(np.float64)
        for u in range(heads // 4):
            acc = _fma_bf16(r[:, 4 * u:4 * u + 4], w64[:, 4 * u:4 * u + 4, None], acc).reshape(rows, 4, n)
        sx = _add_bf16(acc[:, 0], acc[:, 2]).reshape(rows, n)
        sy = _add_bf16(acc[:, 1], acc[:, 3]).reshape(rows, n)
        red = _add_bf16(sx, sy).reshape(rows, n)
        if kvs is not None:
            red = _to_bf16_value(red * _to_bf16_value(kvs)[None, :]).reshape(rows, n)
    return red


def _reduce_sm90(x: np.ndarray, w: np.ndarray, kvs: np.ndarray | None) -> np.ndarray:
    """DeepGEMM sm90 (float32 weights): float32 (rows, n).

    Lane L = h mod 8 = 2c + p keeps acc_L = f32(relu(x_L) w_L), then fma(relu(x_h), w_h, acc_L)
    for h = L + 8, L + 16, ...; v_c = f32(f32(acc_2c + acc_2c+1) * s); (v0 + v1) + (v2 + v3).
    """
    rows, heads, n = x.shape
    with np.errstate(over="ignore", invalid="ignore"):
        r = np.where(x > 0, x, np.float32(0))  # fmaxf(x, 0): NaN -> 0
        # Note: sm90's ``sum += fmaxf(x, 0) * w`` is modelled with nvcc's default contraction into
        # an FMA (--fmad=true); the first term of each lane is a rounded product.
        w32 = w.astype(np.float32)
        acc = r[:, 0:8] * w32[:, 0:8, None]
        for g in range(1, heads // 8):
            acc = _fma_f32(r[:, 8 * g:8 * g + 8], w32[:, 8 * g:8 * g + 8, None], acc)
        pair = acc[:, 0::2] + acc[:, 1::2]  # (rows, 4, n): lane c
        if kvs is not None:
            pair = pair * kvs.astype(np.float32)[None, None, :]
        return (pair[:, 0] + pair[:, 1]) + (pair[:, 2] + pair[:, 3])


def _reduce_ascend(x: np.ndarray, w: np.ndarray, fused: bool) -> np.ndarray:
    """DeepGEMM-Ascend: r_h = bf16(relu(x_h)); acc = bf16(0); acc = bf16(acc + r_h w_h), h = 0..H-1.

    Returns bf16 values as float64 (rows, n).  ``fused=False``: bf16(acc + bf16(r_h w_h)).
    """
    rows, heads, n = x.shape
    with np.errstate(over="ignore", invalid="ignore"):
        r = _to_bf16_value(np.maximum(x, np.float32(0))).reshape(rows, heads, n)
        w64 = w.astype(np.float64)
        acc = np.zeros((rows, n))
        for h in range(heads):
            if fused:
                acc = _fma_bf16(r[:, h], w64[:, h, None], acc).reshape(rows, n)
            else:
                p = _to_bf16_value(r[:, h] * w64[:, h, None]).reshape(rows, n)
                acc = _add_bf16(acc, p).reshape(rows, n)
    return acc


def _sm100(x: np.ndarray, w: np.ndarray, kvs: np.ndarray | None) -> np.ndarray:
    if w.dtype == BF16:
        return _reduce_sm100_bf16(x, w, kvs)
    return _reduce_sm100_f32(x, w, kvs).astype(np.float64)


def _sm90(x: np.ndarray, w: np.ndarray, kvs: np.ndarray | None) -> np.ndarray:
    return _reduce_sm90(x, w, kvs).astype(np.float64)


def _ascend(x: np.ndarray, w: np.ndarray, kvs: np.ndarray | None) -> np.ndarray:
    return _reduce_ascend(x, w, ASCEND_BF16_MULA_FUSED)


#: The device model of every target: ``model(x, w, kvs)`` -> float64 values exactly representable
#: in the output format.
REDUCTIONS: dict[str, Callable[[np.ndarray, np.ndarray, np.ndarray | None], np.ndarray]] = {
    "sm100": _sm100,
    "sm90": _sm90,
    "ascend": _ascend,
}


def model_logits(reduction: str, x: np.ndarray, w: np.ndarray, kvs: np.ndarray | None) -> np.ndarray:
    """The target's head reduction: float64 values exactly representable in the output."""
    return REDUCTIONS[reduction](x, w, kvs)


# ----------------------------------------------------------------------------------------------
# the roundings the data flow defines (part of the exact golden; docs/numerics.md, "The rounding rule")
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DataFlowRoundings:
    """What a target's MQA data flow converts before its head reduction consumes it.

    head_score: the format each head's score ``relu(x_h)`` is rounded to (RNE) on its way from
                the dot-product accumulator to the head reduction, or None (the reduction takes
                the accumulator's value);
    kv_scale:   the format the per-token KV scale is rounded to before it multiplies, or None.
    The exact model applies these to the exact values and rounds the exact weighted sum once;
    the reduction's own roundings (the head chain) are accumulation, covered by the checker.
    """

    head_score: fm.Format | None = None
    kv_scale: fm.Format | None = None


_NONE = DataFlowRoundings()
_BF16_HEADS = DataFlowRoundings(fm.BF16, fm.BF16)


# Note: the rounding rule: the data flow's conversions are in the exact golden, the head chain's
# roundings are not (the checker's bound covers them).
def data_flow_roundings(reduction: str, weights_dtype: np.dtype) -> DataFlowRoundings:
    """The data-flow roundings of a target's MQA logits.

    * ascend950: the FIXPIPE converts ``ReLU(x_h)`` from the Cube's float32 to bf16;
      there is no KV scale.
    * sm100 with bfloat16 weights: ``relu(x_h)`` is converted to bf16 (RN) for the bf16 FMA chain
      and the KV scale to bf16 before the bf16 multiply.
    * sm100 with float32 weights, sm90: the float32 accumulators feed float32 arithmetic: none.
    """
    if reduction == "ascend" or (reduction == "sm100" and weights_dtype == BF16):
        return _BF16_HEADS
    return _NONE
