"""SwiGLU with the top-k weight, and the FP8 re-quantisation of its output, for every target.

Notation: ``g`` (gate) and ``u`` (up) are the bf16 L1 outputs of one row and channel after the
clamp, ``w`` the float32 route weight (absent for DeepGEMM-Ascend's shared experts), and

    v* = g * u * w / (1 + exp(-g))          (the exact real SwiGLU value)

Accumulation models
-------------------
``exact`` (golden values): ``v = RN_f32(v*)``, one correct rounding of the exact value, done by
:func:`swiglu_exact` (proof in its docstring).  This is the only rounding between the bf16 L1
output and the FP8 re-quantisation (or the bf16 rounding of the BF16 path); ``fast_math`` has
no effect.

``fp32`` (the kernels' float32 order, step by step, on DeepGEMM and DeepGEMM-Ascend)::

    e = RN_f32(exp(-g))            correctly rounded expf (the devices' __expf / expf / vector exp
                                   are not reproducible; this is the canonical choice)
    d = f32(1 + e)
    s = f32(g * f32(1 / d))        DeepGEMM's fused kernel with fast_math (rcp.approx modelled as
                                   the correctly rounded reciprocal)
    s = f32(g / d)                 every other case (IEEE division)
    v = f32(f32(s * u) * w)        two separate roundings, no FMA

Clamp (``c`` = ``activation_clamp``, None: no clamp)
    fused kernels (both targets): ``cb = bf16(f32(c))``; ``g = min(g, cb)``, ``u = min(max(u, -cb), cb)``
    TileLang baseline: ``cf = f32(c)``; ``u = min(cf, max(-cf, u))``, ``g = min(cf, g)``

Re-quantisation of ``v`` per 32 channels (amax over the group, ``sf = 2^k``, ``q = e4m3(v * 2^-k)``
with RN and saturation, one float32 multiply): the power of two and its UE8M0 byte follow each
implementation's bit recipe literally (:func:`requantize`):

    ``"cuda"``     DeepGEMM's fused kernel: k = ceil2(f32(amax * f32(1/448))) from the float32
                   bits (exponent field - 127, +1 if any mantissa bit), no floor; amax 0 gives
                   k = -127, byte 0
    ``"ascend"``   DeepGEMM-Ascend: amax floored at f32(1e-4) (bits 0x38D1B717), exponent of
                   amax + [significand > 1.75] - 8, capped at 2^127
    ``"tilelang"`` the baseline's ``swiglu_apply_weight_to_fp8``: amax floored at f32(1e-4),
                   k = ceil2(f32(amax / 448)) (IEEE division), byte k + 127
"""

from __future__ import annotations

import math
from collections.abc import Callable
from decimal import Decimal, localcontext
from fractions import Fraction
from typing import Literal

import numpy as np

from .. import formats as fm
from ..certified import Points, round_certified

__all__ = [
    "EXP_REL_ERR",
    "CERT_REL",
    "swiglu_exact",
    "swiglu_fp32",
    "exp_neg_f32",
    "clamp",
    "requantize",
    "swiglu_reference_scalar",
    "ScaleRule",
]

ScaleRule = Literal["cuda", "ascend", "tilelang"]

#: Assumed bound on the relative error of NumPy's float64 ``exp`` (8 ulps; glibc and NumPy's SIMD
#: kernels are documented and measured well below 1 ulp; ``tests/test_mega_moe.py`` checks it
#: against ``decimal`` on every bf16 input).
EXP_REL_ERR = 2.0**-50
#: Half-width of the certificate interval (relative): four times the worst total error of the
#: float64 evaluation (<= EXP_REL_ERR + 3 * 2^-53 < 2^-49.5, see :func:`swiglu_exact`).
CERT_REL = 2.0**-48
#: Results below this magnitude are certainly below half the smallest float32 subnormal.
_TINY = 2.0**-160
_F32_INV448 = np.float32(1.0 / 448.0)  # what DeepGEMM's fused kernel multiplies by
_AMAX_FLOOR_BITS = np.uint32(0x38D1B717)  # float32(1e-4)
_AMAX_FLOOR = np.uint32(0x38D1B717).view(np.float32)


# ----------------------------------------------------------------------------------------------
# correctly rounded float32 results of transcendental expressions
# ----------------------------------------------------------------------------------------------

class _F32Cast:
    """float64 -> float32 as the IEEE cast does it (RNE; NaN payloads kept as the cast keeps them)."""

    def block(self, x: np.ndarray) -> np.ndarray:
        return x.astype(np.float32).view(np.uint32)

    def points(self, x: np.ndarray, at: Points) -> np.ndarray:
        return self.block(x)


def _certified(v64: np.ndarray, final: np.ndarray | None,
               exact: Callable[[int], float]) -> tuple[np.ndarray, int]:
    """RN_f32 of the reals known to lie within ``v64 * (1 +- CERT_REL)``: (float32 values, fallbacks).

    ``v64`` is flattened; ``exact(i)`` gives the correctly rounded value of element i where the
    interval straddles a float32 rounding boundary.  Non-finite values (and ``final`` ones) are
    passed through (IEEE semantics).
    """
    flat = v64.reshape(-1)
    keep = ~np.isfinite(flat) if final is None else ~np.isfinite(flat) | final.reshape(-1)
    with np.errstate(over="ignore", invalid="ignore"):  # IEEE casts: inf and NaN are the results
        codes = _F32Cast().block(flat)
    # The margin certificate first (one pass of integer tests); the few elements it leaves open
    # take the interval test of round_certified, which decides exactly the elements it decided
    # over the whole array (a margin-certified element passes the interval test too).
    open_ = np.flatnonzero(~(_far_from_f32_midpoints(flat) | keep))
    if open_.size == 0:
        return codes.view(np.float32).reshape(v64.shape), 0
    sub = flat[open_]

    def bound(at: Points | None) -> np.ndarray:
        return np.abs(sub if at is None else sub[at]) * CERT_REL

    def fallback(at: Points) -> np.ndarray:
        return np.array([exact(i) for i in open_[at[0]].tolist()], np.float32).view(np.uint32)

    sub_codes, pending = round_certified(sub, bound, _F32Cast(), fallback=fallback)
    codes[open_] = sub_codes
    return codes.view(np.float32).reshape(v64.shape), int(np.count_nonzero(pending))


#: float64 bits below float32's 23 fraction bits, and their value at a float32 midpoint
_LOW29 = np.uint64((1 << 29) - 1)
_MID29 = 1 << 28
#: float64 ulps between an estimate and a float32 midpoint that the certificate interval never
#: spans: ``|v64| CERT_REL`` is below 2^5 ulps of ``v64`` (|v64| < 2^(e+1), ulp = 2^(e-52)),
#: and its ends are rounded outward by one ulp each; twice that for room
_MIDPOINT_ULPS = 2 * (2**5 + 2)


def _far_from_f32_midpoints(x: np.ndarray) -> np.ndarray:
    """bool: every real within ``|x| CERT_REL`` of float64 ``x`` rounds to float32 like ``x``.

    For ``2^-126 <= |x| < 2^127`` (float32's normal range with room below overflow) a float32
    rounding boundary is a midpoint between consecutive float32 values (a power of two is itself
    a float32 value), that is, a float64 whose 29 bits below float32's fraction are exactly
    ``2^28``; the interval cannot reach one when those bits are more than
    :data:`_MIDPOINT_ULPS` from it.  False outside that range (the interval test decides).
    """
    bits = x.view(np.uint64)
    # unsigned wrap-around: the low bits within _MIDPOINT_ULPS of 2^28 map to [0, 2 _MIDPOINT_ULPS]
    t = bits & _LOW29
    t -= np.uint64(_MID29 - _MIDPOINT_ULPS)
    ok = t > np.uint64(2 * _MIDPOINT_ULPS)
    # the biased exponent in [1023 - 126, 1023 + 127), the same way
    np.bitwise_and(bits, np.uint64(0x7FF << 52), out=t)
    t -= np.uint64((1023 - 126) << 52)
    ok &= t < np.uint64(253 << 52)
    return ok


def _rn_f32_fraction(x: Fraction) -> float:
    return fm.decode_scalar(fm.encode_scalar(x, fm.F32, fm.IEEE_RNE), fm.F32)


def _decide(approx: Decimal, rel: Fraction) -> float | None:
    """RN_f32 of a real known to lie within approx * (1 +- rel), or None if that interval straddles."""
    a = Fraction(approx)
    lo, hi = a - abs(a) * rel, a + abs(a) * rel
    r_lo, r_hi = _rn_f32_fraction(lo), _rn_f32_fraction(hi)
    return r_lo if r_lo == r_hi else None


def _silu_mul_scalar(g: float, num: Fraction) -> float:
    """RN_f32(num / (1 + exp(-g))) for one element, exactly (``num`` = g * u * w, exact).

    For g > 60, exp(-g) / (1 + exp(-g)) < 2^-86 is far below the relative distance (>= 2^-72)
    between ``num`` (at most 72 significant bits) and any float32 or float32 midpoint it does
    not equal, so v* rounds like ``num`` except that an exact midpoint goes toward zero
    (|v*| < |num|).  Otherwise ``decimal`` evaluates exp with increasing precision; v* is
    transcendental for g != 0 (Lindemann), so it is never a midpoint and the loop ends.
    """
    if num == 0:
        return 0.0  # sign handled by the caller
    if g > 60.0:
        # Probes at 2^-80 relative: farther than v* is from num (2^-86), closer than any float32
        # or midpoint that num does not equal (num has at most 72 significant bits).
        down = _rn_f32_fraction(num - abs(num) * Fraction(1, 2**80))
        up = _rn_f32_fraction(num + abs(num) * Fraction(1, 2**80))
        if down == up:
            return down
        return down if num > 0 else up  # num is a midpoint; v* lies strictly toward zero
    prec = 60
    while prec <= 4000:
        with localcontext() as ctx:
            ctx.prec = prec
            e = (-Decimal(g)).exp()
            approx = Decimal(num.numerator) / Decimal(num.denominator) / (1 + e)
        # each decimal operation is correctly rounded: total relative error < 4 * 10^(1 - prec)
        out = _decide(approx, Fraction(4, 10 ** (prec - 1)))
        if out is not None:
            return out
        prec *= 2
    raise ArithmeticError(f"swiglu_exact: could not round g={g!r}, num={num!r} to float32")  # pragma: no cover


def _exp_scalar(x: float) -> float:
    """RN_f32(exp(x)) for one float, exactly (exp(x) is transcendental for x != 0)."""
    if x == 0:
        return 1.0
    prec = 60
    while prec <= 4000:
        with localcontext() as ctx:
            ctx.prec = prec
            approx = Decimal(x).exp()
        out = _decide(approx, Fraction(2, 10 ** (prec - 1)))
        if out is not None:
            return out
        prec *= 2
    raise ArithmeticError(f"exp_neg_f32: could not round exp({x!r}) to float32")  # pragma: no cover


def swiglu_exact(g: np.ndarray, u: np.ndarray, w: np.ndarray | None) -> tuple[np.ndarray, dict[str, int]]:
    """``RN_f32(g * u * w / (1 + exp(-g)))``, correctly rounded, elementwise.

    g, u: float32 arrays holding bf16 values (or float32 clamp values), same shape (n, c);
    w: float32 (n, 1) or None (no weight).  Returns (float32 (n, c), statistics).

    Proof of correct rounding.  ``num = g * u * w`` is computed as a double-double (TwoProduct),
    so ``num_hi = num (1 + d4)``, ``|d4| <= 2^-53``.  The float64 evaluation
    ``v64 = num_hi / fl(1 + fl(exp(-g)))`` has ``fl(exp(-g)) = exp(-g)(1 + d1)`` with
    ``|d1| <= EXP_REL_ERR = 2^-50`` (assumption, tested exhaustively on bf16 inputs), which
    perturbs ``1 + exp(-g)`` by a relative ``|d1| exp(-g) / (1 + exp(-g)) <= |d1|``; the addition
    and the division add ``2^-53`` each.  Hence ``v64 = v* (1 + d)`` with
    ``|d| <= 2^-50 + 3 * 2^-53 + O(2^-100) < 2^-49.5`` whenever no intermediate overflows or
    underflows.  If ``v64 * (1 - 2^-48)`` and ``v64 * (1 + 2^-48)`` (each computed with one more
    rounding of 2^-53) round to the same float32, so does v*: the element is certified.
    Exceptions: ``1 + exp(-g)`` overflows only for g < -709, where
    ``|v*| <= |num| e^g < 2^-600``; results with ``|v64| < 2^-160`` are certainly below half
    the smallest float32 subnormal (2^-150), so they round to zero (with the sign of ``num``).
    Uncertified elements (about 2^-24 of random inputs) are decided exactly by
    :func:`_silu_mul_scalar`.
    """
    g64 = g.astype(np.float64)
    u64 = u.astype(np.float64)
    # num = g * u * w: g * u is exact in float64 (at most 24 + 24 significant bits); the product
    # with w is rounded once (the 2^-53 of d4 above).
    w64 = None if w is None else np.broadcast_to(w.astype(np.float64), g64.shape)
    hi = g64 * u64 if w64 is None else (g64 * u64) * w64
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        d = 1.0 + np.exp(-g64)
        v64 = hi / d
    tiny = np.isfinite(v64) & (np.abs(v64) < _TINY)
    gf, uf = g64.reshape(-1), u64.reshape(-1)
    wf = None if w64 is None else w64.reshape(-1)

    def exact(j: int) -> float:
        num = Fraction(float(gf[j])) * Fraction(float(uf[j]))
        if wf is not None:
            num *= Fraction(float(wf[j]))
        return _silu_mul_scalar(float(gf[j]), num)

    r, fallbacks = _certified(v64, tiny, exact)
    r[tiny] = np.copysign(np.float32(0.0), v64[tiny]).astype(np.float32)
    return r, {"certified": int(r.size) - fallbacks, "exact_fallback": fallbacks}


def exp_neg_f32(g: np.ndarray) -> np.ndarray:
    """``RN_f32(exp(-g))`` correctly rounded (the fp32 model's expf); g float32, any shape."""
    x = -g.astype(np.float64)
    with np.errstate(over="ignore", under="ignore"):
        e64 = np.exp(x)
    xf = x.reshape(-1)
    # exp(x) < 2^-1074 (x < -745): zero in float32 as in float64 (a zero bound: certified)
    r, _ = _certified(e64, None, lambda j: _exp_scalar(float(xf[j])))
    return r


def swiglu_fp32(g: np.ndarray, u: np.ndarray, w: np.ndarray | None, reciprocal: bool) -> np.ndarray:
    """The kernels' float32 order (see the module docstring); g, u float32 (n, c), w (n, 1) or None."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        e = exp_neg_f32(g)
        d = (np.float32(1.0) + e).astype(np.float32)
        if reciprocal:
            s = g * (np.float32(1.0) / d)
        else:
            s = g / d
        v = (s * u).astype(np.float32)
        if w is not None:
            v = (v * w.astype(np.float32)).astype(np.float32)
    return v


def clamp(g: np.ndarray, u: np.ndarray, activation_clamp: float | None,
          bf16_clamp: bool) -> tuple[np.ndarray, np.ndarray]:
    """The activation clamp on float32 arrays holding bf16 values (see the module docstring)."""
    if activation_clamp is None:
        return g, u
    c32 = np.float32(activation_clamp)
    c = fm.cast(np.array([c32], np.float32), fm.BF16, fm.IEEE_RNE).astype(np.float32)[0] if bf16_clamp else c32
    # The devices' min / max return the other operand when one is NaN (CUDA __hmin2 / __hmax2 /
    # fminf, whose NaN-propagating forms are the separate *_nan intrinsics; Ascend's __hmin /
    # __hmax likewise): np.fmin / np.fmax, not np.minimum / np.maximum.
    if bf16_clamp:
        # fused kernels: min(g, c); min(max(u, -c), c) on bf16 values
        return np.fmin(g, c), np.fmin(np.fmax(u, -c), c)
    # TileLang: up = min(c, max(-c, up)); gate = min(c, gate)
    return np.fmin(c, g), np.fmin(c, np.fmax(-c, u))


# ----------------------------------------------------------------------------------------------
# re-quantisation
# ----------------------------------------------------------------------------------------------

def _ceil2_bits(x: np.ndarray) -> np.ndarray:
    """exponent field - 127 + (mantissa != 0) of float32 ``x`` (int64), DeepGEMM's fast_log2_ceil."""
    bits = x.view(np.uint32).astype(np.int64)
    return ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0)


def _pow2_bits(k: np.ndarray) -> np.ndarray:
    """float32 with bits ``(k + 127) << 23`` (DeepGEMM's fast_pow2, two's complement wrap)."""
    return (((k + 127) << 23) & 0xFFFFFFFF).astype(np.uint32).view(np.float32)


def requantize(v: np.ndarray, rule: ScaleRule, gran: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """Per-``gran`` re-quantisation of float32 ``v`` (n, c): (E4M3 codes uint8 (n, c), UE8M0 bytes (n, c / gran)).

    ``q = e4m3_RN_satfinite(f32(v * sf_inv))`` with ``sf_inv`` the exact power of two of the
    rule (see the module docstring); the multiply is one float32 rounding (exact unless the
    product is a float32 subnormal).
    """
    n, c = v.shape
    groups = v.reshape(n, c // gran, gran)
    a = np.abs(groups)
    if rule == "ascend":
        bits = a.view(np.uint32).max(axis=2)  # max of the magnitudes' bit patterns
        bits = np.maximum(bits, _AMAX_FLOOR_BITS)
        bits = ((bits.astype(np.int64) + 0x1FFFFF) & 0x7F800000) - 0x04000000
        bits = np.minimum(bits & 0xFFFFFFFF, 0x7F000000)
        inv = (0x7F000000 - bits).astype(np.uint32).view(np.float32)
        sf_bytes = (bits >> 23).astype(np.uint8)
    else:
        amax = a.max(axis=2)
        if rule == "cuda":
            with np.errstate(over="ignore"):
                k = _ceil2_bits((amax * _F32_INV448).astype(np.float32))
            sf_bytes = ((((k + 127) << 23) & 0xFFFFFFFF) >> 23).astype(np.uint8)
        elif rule == "tilelang":
            amax = np.maximum(amax, _AMAX_FLOOR)
            with np.errstate(over="ignore"):
                k = _ceil2_bits((amax / np.float32(448.0)).astype(np.float32))
            sf_bytes = ((k + 127) & 0xFF).astype(np.uint8)
        else:  # pragma: no cover - validated by callers
            raise ValueError(f"unknown scale rule {rule!r}")
        inv = _pow2_bits(-k)
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        scaled = (groups * inv[:, :, None]).astype(np.float32).reshape(n, c)
    return fm.encode(scaled, fm.E4M3, fm.SATURATING_RNE), sf_bytes


def requantize_float_scale(v: np.ndarray, gran: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """TileLang with ``round_scale=False``: sf = f32(amax / 448), q = e4m3(v * f32(448 / amax))."""
    n, c = v.shape
    groups = v.reshape(n, c // gran, gran)
    amax = np.maximum(np.abs(groups).max(axis=2), _AMAX_FLOOR)
    sf = (amax / np.float32(448.0)).astype(np.float32)
    inv = (np.float32(448.0) / amax).astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        scaled = (groups * inv[:, :, None]).astype(np.float32).reshape(n, c)
    return fm.encode(scaled, fm.E4M3, fm.SATURATING_RNE), sf


# ----------------------------------------------------------------------------------------------
# the slow scalar specification (used by the tests)
# ----------------------------------------------------------------------------------------------

def swiglu_reference_scalar(g: float, u: float, w: float | None) -> float:
    """RN_f32(g * u * w / (1 + exp(-g))) for one element, with exact rationals and ``decimal`` only."""
    num = Fraction(g) * Fraction(u) * (Fraction(w) if w is not None else 1)
    if num == 0:
        sign = math.copysign(1.0, g) * math.copysign(1.0, u) * (math.copysign(1.0, w) if w is not None else 1.0)
        return math.copysign(0.0, sign)
    if g < -700:
        return math.copysign(0.0, float(num))
    return _silu_mul_scalar(g, num)
