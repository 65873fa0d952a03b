"""Formats as data, casts against the scalar specification, packing, round-to-odd helpers."""

from __future__ import annotations

import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from deepgemm_ref import formats as fm
from deepgemm_ref.errors import DGArgumentError

NARROW = [fm.E4M3, fm.E5M2, fm.BF16]
ALL_BF16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(ml_dtypes.bfloat16)


def _codes_equal(a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == b.dtype
    bad = np.flatnonzero(a.reshape(-1) != b.reshape(-1))
    assert bad.size == 0, f"{bad.size} mismatches, first at {bad[0]}: {a.reshape(-1)[bad[0]]:#x} vs {b.reshape(-1)[bad[0]]:#x}"


# ---------------------------------------------------------------------------------------------
# the records
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", [fm.BF16, fm.F32, fm.E4M3, fm.E5M2, fm.E2M1])
def test_format_records_match_ml_dtypes_finfo(fmt):
    fi = ml_dtypes.finfo(fmt.storage)
    assert float(fi.max) == fmt.max
    assert float(fi.smallest_normal) == fmt.min_normal
    assert float(fi.smallest_subnormal) == fmt.min_subnormal
    assert fi.nmant == fmt.mantissa_bits
    assert fi.nexp == fmt.exponent_bits


def test_ue8m0_record():
    assert fm.UE8M0.max == 2.0**127 and fm.UE8M0.min_normal == 2.0**-127
    assert not fm.UE8M0.signed and fm.UE8M0.nan_code == 0xFF


@pytest.mark.parametrize("fmt", [fm.E4M3, fm.E5M2, fm.UE8M0, fm.E2M1])
def test_decode_table_matches_ml_dtypes(fmt):
    codes = np.arange(1 << fmt.bits, dtype=np.uint8)
    ours = fm.decode(codes, fmt)
    theirs = codes.view(fmt.storage).astype(np.float64)
    nan = np.isnan(theirs)
    assert np.array_equal(np.isnan(ours), nan)
    assert np.array_equal(ours[~nan], theirs[~nan])
    # sign of zero too
    assert np.array_equal(np.signbit(ours[~nan]), np.signbit(theirs[~nan]))


def test_decode_bf16_f32():
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    v = fm.decode(bits, fm.BF16)
    with np.errstate(invalid="ignore"):  # signalling NaNs come back quiet: no warning
        ref = bits.view(ml_dtypes.bfloat16).astype(np.float64)
    assert np.array_equal(v, ref, equal_nan=True)


# ---------------------------------------------------------------------------------------------
# exhaustive sweeps: vectorised == scalar specification
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", [fm.E4M3, fm.E5M2])
@pytest.mark.parametrize("policy", [fm.IEEE_RNE, fm.SATURATING_RNE])
def test_all_codes_round_trip(fmt, policy):
    codes = np.arange(256, dtype=np.uint8)
    vals = fm.decode(codes, fmt)
    back = fm.encode(vals, fmt, policy)
    expect = np.array([fm.encode_scalar(float(v), fmt, policy) for v in vals], np.uint8)
    _codes_equal(back, expect)
    finite = np.isfinite(vals)
    _codes_equal(back[finite], codes[finite])  # every finite code is its own rounding


def test_all_fp4_codes_round_trip():
    codes = np.arange(16, dtype=np.uint8)
    vals = fm.decode(codes, fm.E2M1)
    _codes_equal(fm.encode(vals, fm.E2M1, fm.RNE_FP4), codes)
    dg = fm.encode(vals, fm.E2M1, fm.DEEPGEMM_FP4)
    expect = codes.copy()
    expect[8] = 0  # DeepGEMM never produces -0
    _codes_equal(dg, expect)


def _bf16_patterns_around(fmt: fm.Format) -> np.ndarray:
    """The bf16 patterns where a cast into ``fmt`` rounds, flushes or overflows: every pattern whose
    exponent lies from 2 below ``fmt``'s smallest subnormal to 2 above its largest finite value,
    every zero, bf16 subnormal, infinity and NaN, and every 13th pattern besides (the others round
    to zero or overflow like their neighbours in the window)."""
    bits = ALL_BF16.view(np.uint16)
    field = (bits >> 7) & 0xFF
    exp = field.astype(np.int64) - 127
    lo = math.floor(math.log2(fmt.min_subnormal)) - 2
    hi = math.floor(math.log2(fmt.max)) + 2
    keep = ((exp >= lo) & (exp <= hi)) | (field == 0) | (field == 0xFF) | (np.arange(bits.size) % 13 == 0)
    return ALL_BF16[keep]


@pytest.mark.parametrize("every", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["around", "all"])
@pytest.mark.parametrize(
    "fmt,policy",
    [(fm.E4M3, fm.IEEE_RNE), (fm.E4M3, fm.SATURATING_RNE), (fm.E5M2, fm.IEEE_RNE), (fm.E5M2, fm.SATURATING_RNE),
     (fm.E2M1, fm.DEEPGEMM_FP4), (fm.E2M1, fm.RNE_FP4)],
    ids=lambda p: getattr(p, "name", None) or f"{p.rounding}-sat{int(p.saturate)}-{p.nan}-{p.negative_zero}",
)
def test_every_bf16_pattern_into_narrow_format(fmt, policy, every):
    """Against the scalar specification: all 65536 patterns in the slow run; the default run takes
    the patterns around the format's range (_bf16_patterns_around), where the cast is decided."""
    patterns = ALL_BF16 if every else _bf16_patterns_around(fmt)
    with np.errstate(invalid="ignore"):  # signalling NaNs come back quiet: no warning
        vals = patterns.astype(np.float32)
        vals64 = vals.astype(np.float64)
    ours = fm.encode(vals, fmt, policy)
    expect = np.array([fm.encode_scalar(float(v), fmt, policy) for v in vals64], np.uint8)
    _codes_equal(ours, expect)
    # also from float64 input (the round-to-odd path)
    _codes_equal(fm.encode(vals64, fmt, policy), expect)


def test_every_bf16_pattern_matches_ml_dtypes_on_finite_in_range():
    vals = ALL_BF16.astype(np.float32)
    for fmt in (fm.E4M3, fm.E5M2):
        ours = fm.encode(vals, fmt, fm.IEEE_RNE)
        theirs = vals.astype(fmt.storage).view(np.uint8)
        ok = np.isfinite(vals)
        _codes_equal(ours[ok], theirs[ok])


@pytest.mark.parametrize("fmt", [fm.BF16, fm.E4M3, fm.E5M2])
def test_float32_bit_sample_against_scalar(fmt):
    rng = np.random.default_rng(7)
    bits = rng.integers(0, 1 << 32, size=4000, dtype=np.uint64).astype(np.uint32)
    vals = bits.view(np.float32)
    with np.errstate(invalid="ignore"):  # signalling NaNs come back quiet: no warning
        vals64 = vals.astype(np.float64)
    for policy in (fm.IEEE_RNE, fm.SATURATING_RNE):
        ours = fm.encode(vals, fmt, policy)
        expect = np.array([fm.encode_scalar(float(v), fmt, policy) for v in vals64], fmt.code_dtype)
        _codes_equal(ours, expect)


def _tie_values(fmt: fm.Format) -> np.ndarray:
    """Exact midpoints between neighbours of ``fmt`` and values 2^-30 (relative) either side."""
    codes = np.arange(1 << fmt.bits, dtype=np.uint32).astype(fmt.code_dtype)
    vals = np.unique(fm.decode(codes, fmt))
    vals = vals[np.isfinite(vals) & (vals >= 0)]
    mids = (vals[:-1] + vals[1:]) / 2
    extra = [fmt.max + (fmt.max - vals[-2]) / 2]  # the overflow tie
    mids = np.concatenate([mids, extra])
    rel = np.maximum(np.abs(mids), fmt.min_subnormal) * 2.0**-30
    allv = np.concatenate([mids, mids + rel, mids - rel])
    return np.concatenate([allv, -allv])


@pytest.mark.parametrize("fmt", [fm.E4M3, fm.E5M2, fm.BF16, fm.E2M1])
def test_ties_and_near_ties_from_float64(fmt):
    vals = _tie_values(fmt)
    if fmt is fm.BF16:
        vals = vals[:: max(1, vals.size // 6000)]
    policies = [fm.DEEPGEMM_FP4, fm.RNE_FP4] if fmt is fm.E2M1 else [fm.IEEE_RNE, fm.SATURATING_RNE]
    for policy in policies:
        ours = fm.encode(vals, fmt, policy)
        expect = np.array([fm.encode_scalar(float(v), fmt, policy) for v in vals], fmt.code_dtype)
        _codes_equal(ours, expect)


def test_documented_e4m3_cases():
    """numerics.md 1.1: 1.0625 -> 1.0, 1.1875 -> 1.25, 464 -> 448, 464.01 -> NaN, 2^-10 -> 0."""
    x = np.array([1.0625, 1.1875, 464.0, 464.01, -500.0, 2.0**-10, 1.5 * 2.0**-9, -0.0], np.float32)
    got = fm.encode(x, fm.E4M3, fm.IEEE_RNE)
    assert [hex(int(c)) for c in got] == ["0x38", "0x3a", "0x7e", "0x7f", "0xff", "0x0", "0x2", "0x80"]
    sat = fm.encode(np.array([464.01, -500.0, np.inf, -np.inf, np.nan], np.float32), fm.E4M3, fm.SATURATING_RNE)
    assert [hex(int(c)) for c in sat] == ["0x7e", "0xfe", "0x7e", "0xfe", "0x7f"]


def test_bf16_double_rounding_probe():
    """numerics.md 1.2: 1 + 2^-8 + 2^-30 rounds (once) to 0x3f81, not via float32 to 0x3f80."""
    x = np.array([1 + 2.0**-8 + 2.0**-30, 1 + 2.0**-8, -431.99999999999994])
    assert hex(int(fm.encode(x[:1], fm.BF16, fm.IEEE_RNE)[0])) == "0x3f81"
    assert hex(int(fm.encode(x[1:2], fm.BF16, fm.IEEE_RNE)[0])) == "0x3f80"
    assert fm.decode(fm.encode(x[2:], fm.E4M3, fm.IEEE_RNE), fm.E4M3)[0] == -416.0


# ---------------------------------------------------------------------------------------------
# FP4 policies differ exactly where the spec says
# ---------------------------------------------------------------------------------------------

def test_fp4_policies_differ_exactly_at_documented_ties():
    x = np.concatenate([ALL_BF16.astype(np.float32), np.array([np.nan, -np.nan, -0.0], np.float32)])
    x = x[~np.isinf(x)]
    a = fm.encode(x, fm.E2M1, fm.DEEPGEMM_FP4)
    b = fm.encode(x, fm.E2M1, fm.RNE_FP4)
    va, vb = fm.decode(a, fm.E2M1), fm.decode(b, fm.E2M1)
    value_diff = va != vb
    assert set(np.unique(np.abs(x[value_diff])).tolist()) == {0.75, 1.75, 3.5}
    byte_only = (a != b) & ~value_diff
    # bytes differ without a value difference only where the result is zero: negative inputs
    # (and -0) that round to zero, where RNE keeps -0 and DeepGEMM writes +0
    sel = x[byte_only]
    assert np.all(np.signbit(sel) & (np.abs(sel) <= 0.25))
    assert np.all(a[byte_only] == 0) and np.all(b[byte_only] == 8)
    # NaN: DeepGEMM +0; our RNE_FP4 policy also +0 (E2M1 has no NaN): same byte.  ml_dtypes
    # would give 0x8 for +NaN; the NaN rule is part of the policy, not of the rounding.
    assert np.all(a[np.isnan(x)] == 0) and np.all(b[np.isnan(x)] == 0)


def test_fp4_examples_from_spec():
    x = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.01, 7.0, np.inf, -0.75, -1.75, -3.5, -0.25, -0.1, -0.0])
    dg = fm.decode(fm.encode(x, fm.E2M1, fm.DEEPGEMM_FP4), fm.E2M1)
    assert dg.tolist() == [0, 0.5, 1, 1.5, 2, 3, 4, 6, 6, 6, -0.5, -1.5, -3, 0, 0, 0]
    assert not np.any(np.signbit(dg[-3:]))
    rne = fm.decode(fm.encode(x, fm.E2M1, fm.RNE_FP4), fm.E2M1)
    assert rne.tolist() == [0, 1, 1, 2, 2, 4, 4, 6, 6, 6, -1, -2, -4, 0, 0, 0]
    assert np.all(np.signbit(rne[-3:]))


# ---------------------------------------------------------------------------------------------
# hypothesis: float32 and float64 inputs
# ---------------------------------------------------------------------------------------------

@given(st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True), min_size=1, max_size=32))
def test_hypothesis_float32(values):
    x = np.array(values, np.float32)
    for fmt, policies in ((fm.BF16, [fm.IEEE_RNE, fm.SATURATING_RNE]), (fm.E4M3, [fm.IEEE_RNE, fm.SATURATING_RNE]),
                          (fm.E5M2, [fm.IEEE_RNE, fm.SATURATING_RNE]), (fm.E2M1, [fm.DEEPGEMM_FP4, fm.RNE_FP4])):
        for policy in policies:
            expect = np.array([fm.encode_scalar(float(v), fmt, policy) for v in x.astype(np.float64)], fmt.code_dtype)
            _codes_equal(fm.encode(x, fmt, policy), expect)


@given(st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=1, max_size=32))
def test_hypothesis_float64(values):
    x = np.array(values, np.float64)
    for fmt, policies in ((fm.BF16, [fm.IEEE_RNE]), (fm.F32, [fm.IEEE_RNE, fm.SATURATING_RNE]),
                          (fm.E4M3, [fm.SATURATING_RNE]), (fm.E5M2, [fm.IEEE_RNE]), (fm.E2M1, [fm.RNE_FP4])):
        for policy in policies:
            expect = np.array([fm.encode_scalar(float(v), fmt, policy) for v in x], fmt.code_dtype)
            _codes_equal(fm.encode(x, fmt, policy), expect)


@given(st.floats(min_value=-1e6, max_value=1e6, allow_nan=False), st.integers(-40, 40))
def test_hypothesis_near_ties_float64(v, e):
    """Values placed on and a hair off bf16/e4m3 midpoints, scaled by powers of two."""
    base = float(np.float32(v)) * 2.0**e
    for fmt in (fm.BF16, fm.E4M3):
        q = fm.decode_scalar(fm.encode_scalar(base, fmt, fm.IEEE_RNE), fmt)
        if not math.isfinite(q) or q == 0:
            continue
        ulp = math.ldexp(1.0, math.frexp(q)[1] - 1 - fmt.mantissa_bits)
        for x in (q + ulp / 2, q + ulp / 2 + ulp * 2.0**-30, q + ulp / 2 - ulp * 2.0**-30, q - ulp / 2):
            for policy in (fm.IEEE_RNE, fm.SATURATING_RNE):
                assert fm.encode(np.array([x]), fmt, policy)[0] == fm.encode_scalar(x, fmt, policy)


# ---------------------------------------------------------------------------------------------
# UE8M0
# ---------------------------------------------------------------------------------------------

def _dg_ceil_bits(x32: np.ndarray) -> np.ndarray:
    """DeepGEMM's formula, written out from the spec on raw bits."""
    bits = np.abs(x32).view(np.uint32).astype(np.int64)
    e = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0)
    return np.clip(e, 1, 254).astype(np.uint8)


def test_ue8m0_ceil_every_bf16_and_sampled_f32():
    rng = np.random.default_rng(1)
    x32 = np.concatenate([ALL_BF16.astype(np.float32),
                          rng.integers(0, 1 << 32, 20000, dtype=np.uint64).astype(np.uint32).view(np.float32)])
    _codes_equal(fm.ue8m0_encode(x32, "ceil"), _dg_ceil_bits(x32))
    finite = np.isfinite(x32)
    sample = x32[finite][::37]
    expect = np.array([fm.ue8m0_encode_scalar(float(v), "ceil") for v in sample], np.uint8)
    _codes_equal(fm.ue8m0_encode(sample, "ceil"), expect)


@pytest.mark.parametrize("rounding", ["floor", "nearest_ties_up"])
def test_ue8m0_floor_nearest_vs_scalar(rounding):
    rng = np.random.default_rng(2)
    bits = rng.integers(1, 0x7F800000, 20000, dtype=np.uint64).astype(np.uint32)  # positive, finite, non-zero
    x = bits.view(np.float32)
    expect = np.array([fm.ue8m0_encode_scalar(float(v), rounding) for v in x], np.uint8)
    _codes_equal(fm.ue8m0_encode(x, rounding), expect)
    _codes_equal(fm.ue8m0_encode(x.astype(np.float64), rounding), expect)


def test_ue8m0_nearest_matches_ml_dtypes_cast_on_normals():
    rng = np.random.default_rng(3)
    x = rng.integers(0x00800000, 0x7F000000, 20000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    _codes_equal(fm.ue8m0_encode(x, "nearest_ties_up"), x.astype(ml_dtypes.float8_e8m0fnu).view(np.uint8))


def test_ue8m0_ceil_from_float64_keeps_power_of_two_status():
    x = np.array([2.0**-5, 2.0**-5 * (1 + 2.0**-40), 256 * (1 + 2.0**-23), 3e38, 1e-300])
    got = fm.ue8m0_encode(x, "ceil").tolist()
    assert got == [122, 123, 136, 254, 1]


def test_ue8m0_decode():
    b = np.array([0, 1, 127, 254, 255], np.uint8)
    v = fm.ue8m0_decode(b)
    assert v[:4].tolist() == [2.0**-127, 2.0**-126, 1.0, 2.0**127] and math.isnan(v[4])
    assert fm.ue8m0_decode(b, zero_byte="zero")[0] == 0.0


# ---------------------------------------------------------------------------------------------
# packing
# ---------------------------------------------------------------------------------------------

def test_fp4_pack_nibble_order():
    codes = fm.encode(np.array([1.5, -2.0, 0.5, 6.0]), fm.E2M1, fm.RNE_FP4)
    packed = fm.pack_fp4(codes)
    assert packed.dtype == np.int8 and packed.view(np.uint8).tolist() == [0xC3, 0x71]
    assert fm.unpack_fp4(packed).tolist() == codes.tolist()


@given(st.lists(st.integers(0, 15), min_size=0, max_size=64).filter(lambda v: len(v) % 2 == 0))
def test_fp4_pack_round_trip(codes):
    c = np.array(codes, np.uint8).reshape(1, -1)
    assert np.array_equal(fm.unpack_fp4(fm.pack_fp4(c)), c)


def test_ue8m0_pack_bytes_by_hand():
    b = np.array([[0x01, 0x02, 0x03, 0x84, 0x7F, 0x00, 0x00, 0xFF]], np.uint8)
    w = fm.pack_ue8m0_int32(b)
    assert w.dtype == np.int32 and [int(v) & 0xFFFFFFFF for v in w[0]] == [0x84030201, 0xFF00007F]
    assert np.array_equal(fm.unpack_ue8m0_int32(w), b)
    h = fm.pack_ue8m0_int16(b)
    assert h.dtype == np.int16 and [int(v) & 0xFFFF for v in h[0]] == [0x0201, 0x8403, 0x007F, 0xFF00]
    assert np.array_equal(fm.unpack_ue8m0_int16(h), b)


def test_pack_rejects_bad_lengths():
    with pytest.raises(DGArgumentError):
        fm.pack_fp4(np.zeros(3, np.uint8))
    with pytest.raises(DGArgumentError):
        fm.pack_ue8m0_int32(np.zeros(6, np.uint8))
    with pytest.raises(DGArgumentError):
        fm.pack_ue8m0_int16(np.zeros(3, np.uint8))


def test_policy_checks():
    with pytest.raises(DGArgumentError):
        fm.encode(np.zeros(2), fm.E2M1, fm.IEEE_RNE)  # E2M1 must saturate, has no NaN
    with pytest.raises(DGArgumentError):
        fm.encode(np.zeros(2), fm.E4M3, fm.DEEPGEMM_FP4)  # ties toward zero only for E2M1 (vectorised)


# ---------------------------------------------------------------------------------------------
# round-to-odd and double-double rounding against Fractions
# ---------------------------------------------------------------------------------------------

def _nearest_even(exact: Fraction, fmt: fm.Format) -> int:
    return fm.encode_scalar(exact, fmt, fm.IEEE_RNE)


def test_round_dd_to_f32_and_bf16_against_fractions():
    rng = np.random.default_rng(5)
    hi = rng.standard_normal(3000) * 2.0 ** rng.integers(-20, 20, 3000)
    lo = hi * 2.0**-60 * rng.standard_normal(3000)
    # exact f32 ties plus a tiny lo either side
    t = rng.standard_normal(1000).astype(np.float32).astype(np.float64)
    tie = t + np.abs(t) * 2.0**-24 * np.sign(t) * 0 + np.spacing(t.astype(np.float32)).astype(np.float64) / 2
    hi = np.concatenate([hi, tie, tie, tie])
    lo = np.concatenate([lo, np.zeros(1000), np.abs(tie) * 2.0**-70, -np.abs(tie) * 2.0**-70])
    for fmt in (fm.F32, fm.BF16):
        got = fm.round_dd(hi, lo, fmt).view(fmt.code_dtype)
        expect = np.array([_nearest_even(Fraction(h) + Fraction(l), fmt) for h, l in zip(hi, lo, strict=False)], fmt.code_dtype)
        _codes_equal(got, expect)


def test_two_prod_two_sum_exact():
    rng = np.random.default_rng(6)
    a = rng.standard_normal(2000) * 1e3
    b = rng.standard_normal(2000) * 1e-3
    p, e = fm.two_prod(a, b)
    s, f = fm.two_sum(a, b)
    for i in range(0, 2000, 7):
        assert Fraction(p[i]) + Fraction(e[i]) == Fraction(a[i]) * Fraction(b[i])
        assert Fraction(s[i]) + Fraction(f[i]) == Fraction(a[i]) + Fraction(b[i])


@pytest.mark.parametrize("fmt,policy", [(fm.E4M3, fm.SATURATING_RNE), (fm.E4M3, fm.IEEE_RNE), (fm.E5M2, fm.IEEE_RNE),
                                        (fm.E5M2, fm.SATURATING_RNE), (fm.E2M1, fm.DEEPGEMM_FP4)])
def test_encode_f32_table_equals_encode_on_every_top_half(fmt, policy):
    """The lookup table indexes the top 16 bits and a sticky bit: every top half with the low
    halves that matter (zero, the lowest bit, a tie bit pattern, all ones) and random words."""
    rng = np.random.default_rng(11)
    top = np.arange(1 << 16, dtype=np.uint32) << np.uint32(16)
    words = [rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32)]
    words += [top | np.uint32(low) for low in (0, 1, 0x8000, 0x7FFF, 0xFFFF)]
    x = np.concatenate(words).view(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        want = fm.encode(x, fmt, policy)
        assert np.array_equal(fm.encode_f32(x, fmt, policy), want)
        # bf16 values (zero low halves) through the 16-bit table
        x16 = top.view(np.float32)
        assert np.array_equal(fm.encode_f32(x16, fmt, policy, low_bits_zero=True), fm.encode(x16, fmt, policy))
    assert fm.encode_f32(np.float32(3.0), fmt, policy).shape == ()
    with pytest.raises(fm.DGArgumentError):
        fm.encode_f32(x[:4], fm.BF16, fm.IEEE_RNE)
