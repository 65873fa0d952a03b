"""Slow, obviously-correct references built from the specification with exact rationals.

Nothing here uses NumPy arithmetic on the values: every float32 operation is the exact rational
result rounded by ``formats.encode_scalar`` (the scalar specification), so these references are
independent of the vectorised code they check.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from deepgemm_ref import formats as fm

F = Fraction


def rn(x: Fraction | float, fmt: fm.Format = fm.F32) -> float:
    """Round an exact value to ``fmt`` with RNE (IEEE overflow) and return it as a Python float."""
    return fm.decode_scalar(fm.encode_scalar(x if isinstance(x, Fraction) else x, fmt, fm.IEEE_RNE), fmt)


def f32_mul(a: float, b: float) -> float:
    return rn(F(a) * F(b))


def f32_div(a: float, b: float) -> float:
    return rn(F(a) / F(b))


INV448 = rn(F(1) / 448)  # float32(1 / 448), what CUDA multiplies by
INV6 = rn(F(1) / 6)
AMAX_FLOOR = rn(F(1e-4))  # float32(1e-4)


def scale_from_amax(amax: float, divisor: int, division: str) -> float:
    if division == "cuda":
        return f32_mul(amax, INV448 if divisor == 448 else INV6)
    return f32_div(amax, float(divisor))


def ceil_pow2_f32(sf: float) -> float:
    """DeepGEMM's ceil_to_ue8m0 on a positive finite float32 value, from its definition."""
    if sf == 0:
        return 2.0**-126
    e = math.frexp(sf)[1] - 1  # floor(log2 sf) for a positive float
    if F(sf) != F(2) ** e:
        e += 1
    return 2.0 ** min(max(e, -126), 127)


def quantise_group(values: list[float], divisor: int, use_ue8m0: bool, division: str, wide64: bool = False):
    """Scale and scaled values of one group, by the spec's float32 sequence.

    values: the group's elements as Python floats (already the widened input values).
    Returns (sf, [scaled values as exact floats]).
    """
    amax = max((rn(F(abs(v))) if wide64 else abs(v)) for v in values)
    amax = max(amax, AMAX_FLOOR)
    sf = scale_from_amax(amax, divisor, division)
    if use_ue8m0:
        sf = ceil_pow2_f32(sf)
    inv = f32_div(1.0, sf)
    if wide64:
        scaled = [rn(F(v) * F(inv), _F64) for v in values]
    else:
        scaled = [f32_mul(v, inv) for v in values]
    return sf, scaled


# float64 rounding for the float64-input path (torch keeps the product in float64)
_F64 = fm.Format(name="f64", exponent_bits=11, mantissa_bits=52, bias=1023, signed=True, has_inf=True, has_nan=True,
                 storage=np.dtype(np.float64))


def e4m3_code(v: float) -> int:
    """torch >= 2.12's float32 -> E4M3 cast (float64 values are first rounded to float32)."""
    v32 = rn(F(v)) if not (math.isnan(v) or math.isinf(v)) else v
    return fm.encode_scalar(v32, fm.E4M3, fm.SATURATING_RNE)


def fp4_code(v: float) -> int:
    return fm.encode_scalar(v, fm.E2M1, fm.DEEPGEMM_FP4)


def ref_per_token_cast_to_fp8(x: np.ndarray, use_ue8m0: bool, gran_k: int, division: str):
    """(codes uint8 (m, n), sf float32 (m, groups)) for a float32/bf16 input x (m, n)."""
    m, n = x.shape
    groups = -(-n // gran_k)
    wide64 = x.dtype == np.float64
    codes = np.zeros((m, n), np.uint8)
    sfs = np.zeros((m, groups), np.float32)
    for i in range(m):
        for g in range(groups):
            cols = list(range(g * gran_k, min(n, (g + 1) * gran_k)))
            vals = [float(x[i, j]) for j in cols] + [0.0] * (gran_k - len(cols))
            sf, scaled = quantise_group(vals, 448, use_ue8m0, division, wide64)
            sfs[i, g] = sf
            for j, s in zip(cols, scaled, strict=False):
                codes[i, j] = e4m3_code(s)
    return codes, sfs


def ref_per_token_cast_to_fp4(x: np.ndarray, use_ue8m0: bool, gran_k: int, division: str):
    """(codes uint8 (m, n) unpacked, sf float32 (m, groups))."""
    m, n = x.shape
    groups = -(-n // gran_k)
    wide64 = x.dtype == np.float64
    codes = np.zeros((m, n), np.uint8)
    sfs = np.zeros((m, groups), np.float32)
    for i in range(m):
        for g in range(groups):
            cols = list(range(g * gran_k, min(n, (g + 1) * gran_k)))
            vals = [float(x[i, j]) for j in cols] + [0.0] * (gran_k - len(cols))
            sf, scaled = quantise_group(vals, 6, use_ue8m0, division, wide64)
            sfs[i, g] = sf
            for j, s in zip(cols, scaled, strict=False):
                codes[i, j] = fp4_code(s)
    return codes, sfs


# ---------------------------------------------------------------------------------------------
# GEMMs: exact rational accumulators and the spec's epilogue roundings
# ---------------------------------------------------------------------------------------------

def exact_dot(a: np.ndarray, b: np.ndarray) -> Fraction:
    """sum_k a[k] * b[k] over exactly-representable float64 values, as an exact rational.

    In integers: each float is n / 2^p exactly (``float.as_integer_ratio``), so each product is
    an integer over a power of two and the sum is one integer over the largest of them (the same
    rational as summing Fractions, without a gcd per term).
    """
    xs, ys = np.asarray(a, np.float64).tolist(), np.asarray(b, np.float64).tolist()
    if len(xs) != len(ys):
        raise ValueError(f"exact_dot: lengths {len(xs)} and {len(ys)} differ")
    terms = []
    for x, y in zip(xs, ys, strict=True):
        nx, dx = x.as_integer_ratio()
        ny, dy = y.as_integer_ratio()
        terms.append((nx * ny, dx.bit_length() + dy.bit_length() - 2))
    top = max((p for _, p in terms), default=0)
    return F(sum(n << (top - p) for n, p in terms), 1 << top)


def exact_dot_f32_code(a: np.ndarray, b: np.ndarray) -> int:
    """float32 code of RN(sum_k a[k] b[k]) for float64 rows whose products are exact in float64.

    math.fsum rounds the exact sum once to float64; a second rounding to float32 can only differ
    from the direct one when the float64 result is exactly a float32 midpoint (midpoints are
    float64 values and rounding is monotone), and then the sum is redone in rationals.  Fast
    enough for long K, independent of the package's tiers.
    """
    import math

    s = math.fsum((a * b).tolist())
    f = np.float32(s)
    if math.isfinite(s) and float(f) != s:
        lo, hi = (f, np.nextafter(f, np.float32(np.inf))) if float(f) < s else (np.nextafter(f, np.float32(-np.inf)), f)
        if (F(float(lo)) + F(float(hi))) / 2 == F(s):
            return fm.encode_scalar(exact_dot(a, b), fm.F32, fm.IEEE_RNE)
    return int(np.array([f], np.float32).view(np.uint32)[0])


def ref_epilogue(acc: Fraction, out: fm.Format, alpha: float | None = None, c: float | None = None,
                 c_mode: str = "kernel") -> int:
    """Spec 6.1 / port 2.3, on an exact accumulator; returns the output code.

    alpha: z = f32(float32(alpha) * acc).  c (kernel): bf16 d -> bf16(c + bf16(z)), float32 d ->
    f32(c + z); c (fused): out(c + z); c (rounded): out(c + out(z)).
    """
    z = acc
    if alpha is not None:
        z = F(rn(F(float(np.float32(alpha))) * acc, fm.F32))
    if c is not None:
        if c_mode == "rounded" or (c_mode == "kernel" and out is fm.BF16):
            z = F(rn(z, out))
        z = F(c) + z
    return fm.encode_scalar(z, out, fm.IEEE_RNE)


def ref_gemm(a_vals: np.ndarray, b_vals: np.ndarray, out: fm.Format, alpha: float | None = None,
             c: np.ndarray | None = None, c_mode: str = "kernel") -> np.ndarray:
    """Codes of epilogue(a_vals @ b_vals.T) with exact accumulation; a_vals (M, K), b_vals (N, K)
    hold the dequantised values (element times scale, exact in float64)."""
    m, n = a_vals.shape[0], b_vals.shape[0]
    codes = np.zeros((m, n), out.code_dtype)
    for i in range(m):
        for j in range(n):
            cv = None if c is None else float(c[i, j])
            codes[i, j] = ref_epilogue(exact_dot(a_vals[i], b_vals[j]), out, alpha, cv, c_mode)
    return codes


def dequant(codes_or_values: np.ndarray, scales: np.ndarray | None, block: int, fmt: fm.Format | None = None) -> np.ndarray:
    """float64 element values times per-block scales: values (MN, K), scales (MN, ceil(K / block))."""
    v = fm.decode(codes_or_values, fmt) if fmt is not None else codes_or_values.astype(np.float64)
    if scales is None:
        return v
    return v * np.repeat(np.asarray(scales, np.float64), block, axis=1)[:, : v.shape[1]]
