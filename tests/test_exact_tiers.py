"""The exact model's fast paths against the slow ones, bit for bit, on adversarial inputs.

The margin certificate (certified.within_half_gap, OutputStage.margin), the exponent-window slices
(exact.split_windows), the GEMM-based exact tier (core._sliced_tier) and the float32 error scale
(core.error_scale) are each checked against the per-element double-double / Fraction tiers
(core._exact_tiers) and against tests/reference.py (Fractions only).
"""

from __future__ import annotations

import math
import os
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import deepgemm_ref as dg
from deepgemm_ref import _parallel, certified, core, exact
from deepgemm_ref import formats as fm
from deepgemm_ref.config import Limited

from . import reference as ref
from .adversarial import tie_cancel_breaker

BF16 = ml_dtypes.bfloat16
E4M3 = ml_dtypes.float8_e4m3fn
F = Fraction


def _codes(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x).view({2: np.uint16, 4: np.uint32}[x.dtype.itemsize])


def _bf16_op(x: np.ndarray) -> core.Operand:
    return core.Operand(x.astype(np.float32).astype(BF16))


# ---------------------------------------------------------------------------------------------
# exponent-window slices
# ---------------------------------------------------------------------------------------------

def test_slice_bits():
    assert [exact.slice_bits(k) for k in (1, 2, 4096, 4097, 8192, 16384, 16385)] == [26, 26, 20, 20, 20, 19, 19]
    for k in (1, 3, 100, 4096, 16385, 10**6):
        b = exact.slice_bits(k)
        assert 2 * b + math.ceil(math.log2(k)) <= 53 < 2 * (b + 1) + math.ceil(math.log2(k))


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 40), st.integers(8, 26))
def test_split_windows_is_an_exact_split_into_narrow_parts(seed, k, bits):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((5, k)) * np.exp2(rng.integers(-300, 300, (5, k)))
    x[rng.random((5, k)) < 0.3] = 0.0
    x[0] = 0.0
    x[1, : k // 2] = -0.0
    s = exact.split_windows(x, bits)
    assert s is not None
    total = [[F(0)] * k for _ in range(5)]
    for p, low, cols, norms in zip(s.parts, s.low, s.columns, s.norms, strict=True):
        for i in range(5):
            q = p[i] / 2.0 ** float(low[i]) if low[i] > -1000 else p[i]
            assert np.all(q == np.trunc(q)) and np.all(np.abs(q) < 2.0**bits)
            assert F(float(norms[i])) ** 2 >= ref.exact_dot(p[i], p[i])
            for j in range(k):
                total[i][j] += F(float(p[i, j]))
        assert np.array_equal(cols, np.any(p != 0, axis=0))
    assert all(total[i][j] == F(float(x[i, j])) for i in range(5) for j in range(k))
    for s0 in range(len(s.parts) - 1):  # every later part lies below the window of the earlier one
        later = np.abs(sum(s.parts[s0 + 1:]))
        live = s.norms[s0] > 0
        assert np.all(later[live] < np.exp2(s.low[s0][live].astype(float))[:, None])
    assert exact.split_windows(np.array([[1.0, np.nan]]), 20) is None
    assert exact.split_windows(np.array([[2.0**1010]]), 20) is None


@pytest.mark.parametrize("fill", ["cancel", "random"])
def test_split_windows_in_row_blocks_gives_the_whole_matrix_split(fill, monkeypatch):
    """The dense passes of split_windows run row block by row block: every part, window, norm,
    column set and sparse entry list is that of the whole matrix at once, bit for bit (blocks of
    one row, of a few rows and one block of all rows)."""
    av, _ = tie_cancel_breaker(37, 3, 301, seed=4, fill=fill)
    x = av * np.exp2(np.random.default_rng(4).integers(-40, 40, av.shape))

    def split(block: int) -> exact.Slices:
        monkeypatch.setattr(exact, "SPLIT_BLOCK", block)
        s = exact.split_windows(x, 12)
        assert s is not None
        return s

    whole = split(1 << 30)
    for block in (1, 5 * 301, 1 << 15):
        got = split(block)
        assert len(got.parts) == len(whole.parts) >= 3
        for name in ("parts", "low", "columns", "norms"):
            for u, v in zip(getattr(got, name), getattr(whole, name), strict=True):
                assert np.array_equal(np.ascontiguousarray(u).view(np.uint8), np.ascontiguousarray(v).view(np.uint8))
        for u, v in zip(got.entries, whole.entries, strict=True):
            assert (u is None) == (v is None)
            if u is not None and v is not None:
                assert all(np.array_equal(p, q) for p, q in zip(u, v, strict=True))


def test_slice_products_are_exact_gemms():
    """The class invariant: a slice-pair GEMM is exact (against Fractions), even at K = 16385."""
    rng = np.random.default_rng(3)
    k = 16385
    a = rng.standard_normal((3, k)).astype(np.float32).astype(np.float64) * np.exp2(rng.integers(-40, 40, (3, k)))
    b = rng.standard_normal((2, k)).astype(np.float32).astype(np.float64)
    sa, sb = exact.split_windows(a, exact.slice_bits(k)), exact.split_windows(b, exact.slice_bits(k))
    assert sa is not None and sb is not None and sa.products_exact(sb, k)
    for s in range(len(sa.parts)):
        for t in range(len(sb.parts)):
            c = sa.parts[s] @ sb.parts[t].T
            for i in range(3):
                for j in range(2):
                    assert F(float(c[i, j])) == ref.exact_dot(sa.parts[s][i], sb.parts[t][j])


# ---------------------------------------------------------------------------------------------
# the margin certificate
# ---------------------------------------------------------------------------------------------

def _rn_code(v: Fraction, fmt: fm.Format) -> int:
    return fm.encode_scalar(v, fmt, fm.IEEE_RNE)


@pytest.mark.parametrize("fmt", [fm.BF16, fm.F32])
def test_half_gap_bounds_the_distance_to_every_rounding_boundary(fmt):
    rng = np.random.default_rng(7)
    codes = rng.integers(0, 1 << fmt.bits, 3000).astype(fmt.code_dtype)
    codes = np.concatenate([codes, np.array([0, 1, 0x80, 0x7F7F if fmt is fm.BF16 else 0x7F7FFFFF,
                                             0x3F80 if fmt is fm.BF16 else 0x3F800000], fmt.code_dtype)])
    exp_field = (codes.astype(np.uint64) >> np.uint64(fmt.mantissa_bits)) & np.uint64((1 << fmt.exponent_bits) - 1)
    codes = codes[exp_field != (1 << fmt.exponent_bits) - 1]  # finite codes only
    codes = codes[(codes & ~np.array(fmt.sign_bit, fmt.code_dtype)) != 0]  # -0 is +0's value
    r = certified.decode_codes(codes, fmt)
    hg = certified.half_gap(r, fmt)
    inside = F(1) - F(1, 2**20)
    for v, h, c in zip(r.tolist(), hg.tolist(), codes.tolist(), strict=True):
        # every real strictly closer than h rounds to v (midpoints are at least h away) ...
        assert _rn_code(F(v) + F(h) * inside, fmt) == c == _rn_code(F(v) - F(h) * inside, fmt)
        # ... and h is the distance to a boundary (or half of it, below a power of two)
        assert _rn_code(F(v) + 2 * F(h), fmt) != c or _rn_code(F(v) - 2 * F(h), fmt) != c


@pytest.mark.parametrize("fmt", [fm.BF16, fm.F32])
def test_margin_certificate_never_certifies_a_straddling_interval(fmt):
    rng = np.random.default_rng(8)
    n = 4000
    x = rng.standard_normal(n) * np.exp2(rng.integers(-140, 120, n))
    # put a quarter of them on or next to a rounding boundary (midpoints)
    near = fm.round_f64(x[: n // 4], fmt).astype(np.float64)
    ulp = np.abs(np.nextafter(near.astype(fmt.storage), np.array(np.inf, fmt.storage)).astype(np.float64) - near)
    x[: n // 4] = near + ulp / 2 * rng.choice([-1.0, 1.0], n // 4) + rng.choice([0.0, 1.0, -1.0], n // 4) * ulp * 2.0**-30
    err = np.abs(x) * np.exp2(rng.integers(-60, -fmt.mantissa_bits - 3, n).astype(float))
    err[::7] = 0.0
    codes, ok = certified.FormatRounding(fmt).margin(x, err)
    assert np.array_equal(codes, fm.round_f64(x, fmt).view(fmt.code_dtype))
    for i in np.flatnonzero(ok):
        lo, hi = F(float(x[i])) - F(float(err[i])), F(float(x[i])) + F(float(err[i]))
        assert _rn_code(lo, fmt) == _rn_code(hi, fmt) == int(codes[i]), (x[i], err[i])
    assert ok.mean() > 0.6  # it decides most: the test is not vacuous


@pytest.mark.parametrize("fmt", [fm.BF16, fm.F32])
def test_margin_certificate_sound_around_powers_of_two(fmt):
    """Values just beyond a power of two r (in magnitude) with bounds that reach back past r: the
    interval must also stay above the finer boundary a quarter gap below r (checked with
    Fractions), in the generic test and in the bf16 output stage's own ones."""
    rng = np.random.default_rng(44)
    n = 3000
    m = fmt.mantissa_bits
    r = np.exp2(rng.integers(-100, 100, n).astype(float)) * rng.choice([-1.0, 1.0], n)
    x = r * (1 + rng.choice([0.0, 1.0], n) * np.exp2(rng.integers(-50, -m - 1, n).astype(float)))
    err = np.abs(r) * np.exp2(-m - 2.0) * rng.uniform(0.5, 4.0, n)  # around the quarter gap below r
    x[0], err[0], r[0] = 2.0**75 * (1 + 2.0**-(m + 23)), 2.0**75 * (2.0**-(m + 2) + 2.0**-(m + 13)), 2.0**75
    assert np.array_equal(fm.round_f64(x, fmt), r.astype(fmt.storage))  # every x rounds to its r
    decided = {"generic": certified.FormatRounding(fmt).margin(x, err)[1]}
    if fmt is fm.BF16:
        decided["f64 path"] = core._bf16_margin_f64(x[None, :], err[None, :])[1][0]
        decided["f32 path"] = core._bf16_margin_f32(x[None, :], err[None, :])[1][0]
    for name, ok in decided.items():
        assert not ok[0], name  # x - err is below the boundary a quarter gap below 2^75
        for i in np.flatnonzero(ok):
            lo, hi = F(float(x[i])) - F(float(err[i])), F(float(x[i])) + F(float(err[i]))
            assert _rn_code(lo, fmt) == _rn_code(hi, fmt), (name, x[i], err[i])
        assert 0.1 < ok.mean() < 0.9, name  # decides some, and some reach past the boundary


def test_bf16_margin_fast_path_decides_what_the_generic_margin_decides():
    """A plain bf16 output stage takes core._bf16_margin / _bf16_codes (float32 -> bf16 casts, the half gap from
    the exponent's bits): the codes of formats.round_f64 and exactly the elements the generic
    margin test (certified.within_half_gap) decides, so the elements left to the exact tiers are
    the same.  Random bit patterns (every exponent, NaN, inf), values on and next to bf16
    midpoints and float32 ties (the double rounding), zeros, subnormals and powers of two."""
    rng = np.random.default_rng(41)
    shape = (24, 257)
    xs = [rng.integers(0, 2**64, size=shape, dtype=np.uint64).view(np.float64),
          rng.standard_normal(shape) * np.exp2(rng.integers(-150, 130, shape).astype(float))]
    mid = (rng.standard_normal(shape).astype(np.float32).view(np.uint32) & np.uint32(0xFFFF0000)) | np.uint32(0x8000)
    xs.append(mid.view(np.float32).astype(np.float64)
              + rng.choice([-1.0, 0.0, 1.0], shape) * np.exp2(rng.integers(-80, -20, shape).astype(float)))
    pw = np.exp2(rng.integers(-140, 128, shape).astype(float)) * rng.choice([-1.0, 1.0], shape)
    xs.append(pw * (1 + rng.choice([-1.0, 0.0, 1.0], shape) * np.exp2(rng.integers(-12, -7, shape).astype(float))))
    z = rng.standard_normal(shape)
    z[::3], z[1::5] = 0.0, -0.0
    z[2, :6] = [np.inf, -np.inf, np.nan, 3.4e38, -3.39e38, 2.0**-126]
    xs.append(z)
    ep = core.OutputStage(fm.BF16)
    with np.errstate(all="ignore"):
        for x in xs:
            for scale in (0.0, 2.0**-40, 2.0**-12, 2.0**-9, 2.0**-7):
                err = np.where(np.isfinite(x), np.abs(x), 0.0).max(axis=1, keepdims=True) * scale
                codes, ok = ep.margin(x, 0, x.shape[0], err)
                want = fm.round_f64(x, fm.BF16).view(np.uint16)
                assert np.array_equal(codes, want)
                assert np.array_equal(ep.apply(x, 0, x.shape[0]), want)  # the same casts without the margin
                assert np.array_equal(ok, certified.within_half_gap(x, None, certified.decode_codes(want, fm.BF16),
                                                                    err, fm.BF16))


def _f32_domain_tiles(rng: np.random.Generator) -> list[np.ndarray]:
    """Tiles whose every value has |f32(x)| in [2^-103, 2^128) (core._bf16_margin_f32's domain):
    many binades, values on and one or two float32 units from bf16 midpoints (float32 ties: the
    double rounding), next to powers of two on both sides, and next to bf16's overflow threshold."""
    shape = (24, 257)
    wide = rng.uniform(-2.0, 2.0, shape) * np.exp2(rng.integers(-101, 126, shape).astype(float))
    wide[np.abs(wide) < 2.0**-102] = 1.0
    mid = (rng.standard_normal(shape).astype(np.float32).view(np.uint32) & np.uint32(0xFFFF0000)) | np.uint32(0x8000)
    mid = (mid.astype(np.int64) + rng.integers(-2, 3, shape)).astype(np.uint32).view(np.float32).astype(np.float64)
    mid += rng.choice([-1.0, 0.0, 1.0], shape) * np.abs(mid) * np.exp2(rng.integers(-52, -22, shape).astype(float))
    pw = np.exp2(rng.integers(-100, 127, shape).astype(float)) * rng.choice([-1.0, 1.0], shape)
    pw *= 1 + rng.choice([-1.0, 1.0], shape) * np.exp2(rng.integers(-40, -6, shape).astype(float))
    top = float(np.finfo(BF16).max) * (1 + rng.choice([-1.0, 1.0], shape) * np.exp2(rng.integers(-20, -7, shape).astype(float)))
    return [wide, mid, pw, top]


def test_bf16_margin_f32_path_leaves_open_what_the_generic_margin_leaves_open():
    """The float32-bits margin (core._bf16_margin_f32) on its domain: the codes of formats.round_f64,
    sound (checked with Fractions), a subset of what the generic margin decides, and after
    round_certified's per-element test the same elements left open as the generic path."""
    rng = np.random.default_rng(43)
    for x in _f32_domain_tiles(rng):
        absmax = np.abs(x).max(axis=1, keepdims=True)
        errs = [absmax * scale for scale in (0.0, 2.0**-60, 2.0**-30, 2.0**-12, 2.0**-9)]
        errs.append(np.abs(x) * np.exp2(rng.integers(-40, -6, x.shape).astype(float)))  # one per element
        want = fm.round_f64(x, fm.BF16).view(np.uint16)
        for err in errs:
            fast = core._bf16_margin_f32(x, err)
            assert fast is not None  # the tile is in the fast path's domain
            codes, ok = fast
            assert np.array_equal(codes, want)
            r = certified.decode_codes(want, fm.BF16)
            generic = certified.within_half_gap(x, None, r, err, fm.BF16)
            # (the generic test leaves every overflow to inf open; the bits decide those beyond the
            # overflow boundary by more than err, and the per-element test below agrees)
            assert not (ok & ~generic & np.isfinite(r)).any()
            full = np.broadcast_to(err, x.shape)
            for i, j in zip(*np.nonzero(ok), strict=True):
                if (i * 7 + j) % 23 == 0:
                    lo, hi = F(float(x[i, j])) - F(float(full[i, j])), F(float(x[i, j])) + F(float(full[i, j]))
                    assert _rn_code(lo, fm.BF16) == _rn_code(hi, fm.BF16) == int(codes[i, j])
            c1, p1 = certified.round_certified(x, full, core._RowsRounding(core.OutputStage(fm.BF16), 0, x.shape[0]),
                                               margin=err)
            c2, p2 = certified.round_certified(x, full, certified.FormatRounding(fm.BF16), margin=err)
            assert np.array_equal(c1, want) and np.array_equal(c2, want)
            assert np.array_equal(p1, p2)


def test_bf16_codes_and_margin_in_any_layout():
    """The plain bf16 output's codes (the float32 bits' RNE with the double-rounding fix at float32
    ties) are formats.round_f64's for C, Fortran, transposed and strided arrays, ties included."""
    rng = np.random.default_rng(45)
    mid = (rng.standard_normal((300, 64)).astype(np.float32).view(np.uint32) & np.uint32(0xFFFF0000)) | np.uint32(0x8000)
    x = mid.view(np.float32).astype(np.float64) * (1 + rng.choice([-1.0, 0.0, 1.0], (300, 64)) * 2.0**-40)
    x[::5] *= rng.standard_normal((60, 64))  # and ordinary values
    for v in (x, x.T, np.asfortranarray(x), x[::2, ::3], x[:, 1:-1]):
        want = fm.round_f64(v, fm.BF16).view(np.uint16)
        assert np.array_equal(core._bf16_codes(v), want)
        assert np.array_equal(core._bf16_margin(v, 0.0)[0], want)
        assert np.array_equal(core._bf16_margin(v, 1.0)[0], want)


def test_bf16_margin_f32_path_declines_outside_its_domain():
    """Zeros, values below 2^-103, infinities and NaN send the whole tile to the float64 test."""
    x = np.full((2, 8), 3.0)
    for v in (0.0, -0.0, 2.0**-104, np.inf, np.nan, 2.0**128):
        y = x.copy()
        y[1, 3] = v
        with np.errstate(over="ignore"):
            assert core._bf16_margin_f32(y, 0.0) is None
    assert core._bf16_margin_f32(x, 0.0) is not None


@pytest.mark.parametrize("out", [fm.BF16, fm.F32])
@pytest.mark.parametrize("alpha", [None, 0.75, -3.0])
@pytest.mark.parametrize("c_mode", [None, "kernel", "fused", "rounded"])
def test_output_stage_margin_is_apply_and_is_sound(out, alpha, c_mode):
    rng = np.random.default_rng(9)
    n = 600
    x = rng.standard_normal(n) * np.exp2(rng.integers(-20, 20, n))
    c = None if c_mode is None else (rng.standard_normal((1, n)) * 4).astype(out.storage).astype(np.float64)
    ep = core.OutputStage(out, alpha, c, c_mode or "kernel")
    err = np.abs(x) * np.exp2(rng.integers(-50, -8, n).astype(float))
    codes, ok = ep.margin(x[None, :], 0, 1, err[None, :])
    assert np.array_equal(codes, ep.apply(x[None, :], 0, 1))
    pc, pok = ep.margin_points(x, np.zeros(n, np.int64), np.arange(n), err)
    assert np.array_equal(pc, codes[0]) and np.array_equal(pok, ok[0])
    for j in np.flatnonzero(ok[0])[::3]:
        for end in (F(float(x[j])) - F(float(err[j])), F(float(x[j])) + F(float(err[j]))):
            want = ref.ref_epilogue(end, out, alpha, None if c is None else float(c[0, j]), c_mode or "kernel")
            assert want == int(codes[0, j])
    assert ok.mean() > 0.5


def test_round_certified_with_margin_and_callable_final():
    est = np.array([1.0, 1.0 + 2.0**-8, 3.0, np.nan])
    asked = []

    def bound(at):
        asked.append(at[0].tolist())
        return np.full(at[0].size, 2.0**-30)

    def final(at):
        return np.isnan(est[at])

    codes, pending = certified.round_certified(est, bound, certified.FormatRounding(fm.BF16), final=final,
                                               margin=np.full(4, 2.0**-30))
    # the margin leaves 1 (a tie) and 3 (NaN) open; the bound is asked for those two only
    assert pending.tolist() == [False, True, False, False] and asked == [[1, 3]]
    assert np.array_equal(codes, fm.round_f64(est, fm.BF16).view(np.uint16))
    with pytest.raises(TypeError):
        certified.round_certified(est, bound, certified.FormatRounding(fm.BF16), final=final)


# ---------------------------------------------------------------------------------------------
# the GEMM-based exact tier against the per-element tiers and Fractions
# ---------------------------------------------------------------------------------------------

def _all_points(m: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    r, c = np.meshgrid(np.arange(m), np.arange(n), indexing="ij")
    return r.reshape(-1), c.reshape(-1)


def _tiers_agree(a: core.Operand, b: core.Operand, ep: core.OutputStage, av: np.ndarray, bv: np.ndarray,
                 want: np.ndarray | None = None) -> dict[str, int]:
    m, n = a.shape[0], b.shape[0]
    rows, cols = _all_points(m, n)
    stats: dict[str, int] = {}
    acc = np.full((m, n), np.nan)
    lo = np.full((m, n), np.nan)
    sliced, done = core._sliced_tier(a, b, ep, rows, cols, acc, lo, stats)
    assert done.all()
    stats2: dict[str, int] = {}
    per_element = core._exact_tiers(a, b, ep, rows, cols, 0, None, None, stats2)
    assert np.array_equal(sliced, per_element)
    if want is None:
        c = ep.c
        want = ref.ref_gemm(av, bv, ep.out, ep.alpha, c, ep.c_mode).reshape(-1)
    assert np.array_equal(sliced, want.reshape(-1))
    # with acc asked for, every pair is summed: acc is the exact dot product's nearest float64
    # and acc + lo the exact value to about 106 bits (exactly, where it fits)
    for i, j in zip(rows[::5].tolist(), cols[::5].tolist(), strict=True):
        ex = ref.exact_dot(av[i], bv[j])
        assert acc[i, j] == float(ex)
        assert abs(F(float(acc[i, j])) + F(float(lo[i, j])) - ex) <= abs(ex) * F(2) ** -104
    # and without it the tier stops at the first level that certifies, with the same codes
    early, _ = core._sliced_tier(a, b, ep, rows, cols, None, None, {})
    assert np.array_equal(early, sliced)
    return stats


@pytest.mark.parametrize("fill", ["cancel", "zero", "random"])
@pytest.mark.parametrize("out", [fm.BF16, fm.F32])
def test_sliced_tier_on_ties_cancelling_pairs_and_tie_breakers(fill, out):
    av, bv = tie_cancel_breaker(6, 5, 301, seed=1, out_bits=8 if out is fm.BF16 else 24, fill=fill)
    stats = _tiers_agree(_bf16_op(av), _bf16_op(bv), core.OutputStage(out), av, bv)
    assert stats.get("sliced", 0) > 0


@pytest.mark.parametrize("alpha", [None, 0.75])
@pytest.mark.parametrize("c_mode", ["kernel", "fused", "rounded"])
def test_sliced_tier_with_alpha_and_c(alpha, c_mode):
    av, bv = tie_cancel_breaker(4, 5, 64, seed=2)
    rng = np.random.default_rng(2)
    c = (rng.standard_normal((4, 5)) * 2).astype(BF16).astype(np.float64)
    _tiers_agree(_bf16_op(av), _bf16_op(bv), core.OutputStage(fm.BF16, alpha, c, c_mode), av, bv)


def test_sliced_tier_fp8_with_ue8m0_scales_across_the_whole_range():
    rng = np.random.default_rng(4)
    m, n, k, blk = 4, 3, 300, 32  # K not a multiple of the block
    qa = rng.standard_normal((m, k)).clip(-448, 448).astype(E4M3)
    qb = rng.standard_normal((n, k)).clip(-448, 448).astype(E4M3)
    nb = -(-k // blk)
    sa = np.exp2(rng.integers(-127, 128, (m, nb)).astype(np.float64))
    sb = np.exp2(rng.integers(-127, 128, (n, nb)).astype(np.float64))
    a, b = core.Operand(qa, sa, blk), core.Operand(qb, sb, blk)
    av = ref.dequant(qa.view(np.uint8), sa, blk, fm.E4M3)
    bv = ref.dequant(qb.view(np.uint8), sb, blk, fm.E4M3)
    for out in (fm.BF16, fm.F32):
        _tiers_agree(a, b, core.OutputStage(out), av, bv)


def test_sliced_tier_fp32_scales_and_subnormal_results():
    rng = np.random.default_rng(5)
    m, n, k, blk = 3, 4, 256, 128
    qa = rng.standard_normal((m, k)).clip(-448, 448).astype(E4M3)
    qb = rng.standard_normal((n, k)).clip(-448, 448).astype(E4M3)
    sa = rng.uniform(0.5, 3, (m, 2)).astype(np.float32).astype(np.float64) * 2.0**-70
    sb = rng.uniform(0.5, 3, (n, 2)).astype(np.float32).astype(np.float64) * 2.0**-70
    a, b = core.Operand(qa, sa, blk), core.Operand(qb, sb, blk)
    av = ref.dequant(qa.view(np.uint8), sa, blk, fm.E4M3)
    bv = ref.dequant(qb.view(np.uint8), sb, blk, fm.E4M3)
    for out in (fm.BF16, fm.F32):  # results near 2^-135: bf16 / float32 subnormals
        _tiers_agree(a, b, core.OutputStage(out), av, bv)


def test_sliced_tier_near_saturation_and_signed_zeros():
    av = np.zeros((3, 8))
    bv = np.zeros((4, 8))
    big = float(np.float32(BF16(3.3e38)))
    av[0, :2], bv[:, :2] = [1.0, 1.0], [[big, 2.0**120], [big, -big], [-(2.0**127), -(2.0**127)], [big, 2.0**119]]
    av[1, :3] = [-0.0, 0.0, -0.0]
    bv[:, 2] = [-1.0, 1.0, 0.0, -0.0]
    av[2, 3:5], bv[:, 3:5] = [2.0**-70, -(2.0**-70)], [[2.0**-70, 2.0**-70]] * 4
    a, b = _bf16_op(av), _bf16_op(bv)
    want = ref.ref_gemm(av, bv, fm.BF16)
    _tiers_agree(a, b, core.OutputStage(fm.BF16), av, bv, want)


@pytest.mark.slow
def test_sliced_tier_long_k_16385():
    av, bv = tie_cancel_breaker(3, 3, 16385, seed=6, fill="random")
    _tiers_agree(_bf16_op(av), _bf16_op(bv), core.OutputStage(fm.BF16), av, bv)


# ---------------------------------------------------------------------------------------------
# scaled_matmul end to end on adversarial inputs (every tier on the way)
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fill", ["cancel", "zero", "random"])
@pytest.mark.parametrize("out", [fm.BF16, fm.F32])
def test_scaled_matmul_adversarial_against_rationals(fill, out):
    av, bv = tie_cancel_breaker(5, 7, 777, seed=11, out_bits=8 if out is fm.BF16 else 24, fill=fill)
    res = core.scaled_matmul(_bf16_op(av), _bf16_op(bv), core.OutputStage(out), want_acc=True, want_S=True)
    assert np.array_equal(_codes(res.out), ref.ref_gemm(av, bv, out))
    for i in range(5):
        for j in range(7):
            ex = ref.exact_dot(av[i], bv[j])
            assert res.acc[i, j] == float(ex)  # the tier's accumulator is the exact sum's float64
            assert F(float(res.S[i, j])) >= ref.exact_dot(np.abs(av[i]), np.abs(bv[j]))
    assert res.stats.get("sliced", 0) > 0


def test_scaled_matmul_long_k_not_a_multiple_of_the_block():
    rng = np.random.default_rng(12)
    m, n, k, blk = 3, 4, 16385, 128
    qa = rng.standard_normal((m, k)).clip(-448, 448).astype(E4M3)
    qb = rng.standard_normal((n, k)).clip(-448, 448).astype(E4M3)
    sa = np.exp2(rng.integers(-127, 128, (m, -(-k // blk))).astype(np.float64))
    sb = np.exp2(rng.integers(-127, 128, (n, -(-k // blk))).astype(np.float64))
    a, b = core.Operand(qa, sa, blk), core.Operand(qb, sb, blk)
    av = ref.dequant(qa.view(np.uint8), sa, blk, fm.E4M3)
    bv = ref.dequant(qb.view(np.uint8), sb, blk, fm.E4M3)
    res = core.scaled_matmul(a, b, core.OutputStage(fm.F32), want_S=True)
    assert np.array_equal(_codes(res.out), ref.ref_gemm(av, bv, fm.F32))
    for i in range(m):
        for j in range(n):
            assert F(float(res.S[i, j])) >= ref.exact_dot(np.abs(av[i]), np.abs(bv[j]))


def test_scaled_matmul_nan_and_inf_follow_ieee():
    rng = np.random.default_rng(13)
    av = rng.standard_normal((6, 64)).astype(BF16).astype(np.float64)
    bv = rng.standard_normal((5, 64)).astype(BF16).astype(np.float64)
    av[1, 3], av[2, 7], bv[3, 9] = np.nan, np.inf, -np.inf
    av[4, 0], bv[4, 0] = 2.0**100, 2.0**100  # a finite row with large products
    res = core.scaled_matmul(_bf16_op(av), _bf16_op(bv), core.OutputStage(fm.BF16))
    with np.errstate(invalid="ignore", over="ignore"):
        ieee = fm.round_f64(av @ bv.T, fm.BF16).view(np.uint16)
    got = _codes(res.out)
    nonfin = ~(np.isfinite(av).all(axis=1)[:, None] & np.isfinite(bv).all(axis=1)[None, :])
    assert np.array_equal(got[nonfin], ieee[nonfin])
    fin = ~nonfin
    want = np.zeros_like(got)
    for i, j in zip(*np.nonzero(fin), strict=True):
        want[i, j] = ref.ref_epilogue(ref.exact_dot(av[i], bv[j]), fm.BF16)
    assert np.array_equal(got[fin], want[fin])


# ---------------------------------------------------------------------------------------------
# the error scale S
# ---------------------------------------------------------------------------------------------

def _S_factor(k: int) -> float:
    g = exact.gamma(k + 2, exact.U32)
    return (1 + g) / (1 - g) * (1 + 2.0**-40) ** 2


def _assert_S_bounds(S: np.ndarray, av: np.ndarray, bv: np.ndarray, points) -> None:
    """s <= S[i, j] <= s G(K) at each point, s the exact sum of magnitudes (Fractions)."""
    factor = F(_S_factor(av.shape[1]))
    for i, j in points:
        s = ref.exact_dot(np.abs(av[i]), np.abs(bv[j]))
        assert s <= F(float(S[i, j])) <= s * factor, (i, j)


@pytest.mark.parametrize("case", ["bf16", "fp8-wide-scales", "fp32-scales", "tiny", "zero-rows"])
def test_error_scale_is_an_upper_bound_within_the_documented_factor(case):
    rng = np.random.default_rng(21)
    m, n, k = 4, 5, 2049
    if case == "fp8-wide-scales" or case == "fp32-scales":
        blk = 128
        qa = rng.standard_normal((m, k)).clip(-448, 448).astype(E4M3)
        qb = rng.standard_normal((n, k)).clip(-448, 448).astype(E4M3)
        nb = -(-k // blk)
        if case == "fp8-wide-scales":
            sa = np.exp2(rng.integers(-127, 128, (m, nb)).astype(np.float64))
            sb = np.exp2(rng.integers(-127, 128, (n, nb)).astype(np.float64))
            sa[0] = 2.0 ** rng.integers(-3, 3, nb)  # a row inside float32's range: the float32 path
            sb[0] = 2.0 ** rng.integers(-3, 3, nb)
        else:
            sa = rng.uniform(0.5, 3, (m, nb)).astype(np.float32).astype(np.float64)
            sb = rng.uniform(0.5, 3, (n, nb)).astype(np.float32).astype(np.float64)
        a, b = core.Operand(qa, sa, blk), core.Operand(qb, sb, blk)
        av = ref.dequant(qa.view(np.uint8), sa, blk, fm.E4M3)
        bv = ref.dequant(qb.view(np.uint8), sb, blk, fm.E4M3)
    else:
        av = rng.standard_normal((m, k)).astype(BF16).astype(np.float64)
        bv = rng.standard_normal((n, k)).astype(BF16).astype(np.float64)
        if case == "tiny":  # normalised magnitudes below 2^-62: float32 products would underflow
            av[1, ::2] *= 2.0**-100
            bv[2, 5] = 2.0**120
        if case == "zero-rows":
            av[2] = 0.0
            bv[1] = 0.0
        a, b = _bf16_op(av), _bf16_op(bv)
    S = core.error_scale(a, b)
    for i in range(m):
        for j in range(n):
            s = ref.exact_dot(np.abs(av[i]), np.abs(bv[j]))
            assert F(float(S[i, j])) >= s
            assert F(float(S[i, j])) <= s * F(_S_factor(k)) + F(2.0**-999)
            if s == 0:
                assert S[i, j] == 2.0**-1000  # the floor of old, unchanged


@pytest.mark.slow
def test_error_scale_long_k():
    rng = np.random.default_rng(22)
    k = 16385
    av = np.abs(rng.standard_normal((2, k))).astype(BF16).astype(np.float64)  # no cancellation in S
    bv = np.abs(rng.standard_normal((2, k))).astype(BF16).astype(np.float64)
    S = core.error_scale(_bf16_op(av), _bf16_op(bv))
    _assert_S_bounds(S, av, bv, [(i, j) for i in range(2) for j in range(2)])


# ---------------------------------------------------------------------------------------------
# determinism: bytes independent of chunking, the pool size and the BLAS thread count
# ---------------------------------------------------------------------------------------------

def test_bytes_do_not_depend_on_chunks_pool_or_blas_threads(monkeypatch):
    """Codes, acc and acc_lo are exact functions of the inputs: the same bytes under any chunking,
    pool size and BLAS thread count.  S comes from a float32 GEMM whose summation order is the
    BLAS's: with the chunking the shape fixes (``_chunk_rows``), its bytes do not depend on the pool
    or the BLAS threads; under another chunking the BLAS may pick another kernel (OpenBLAS does
    for small M), so S is then another upper bound within the documented factor of the sum."""
    av, bv = tie_cancel_breaker(40, 24, 300, seed=31, fill="random")
    rng = np.random.default_rng(31)
    av[:20] = rng.standard_normal((20, 300)).astype(BF16).astype(np.float64)  # half certified, half tiers
    a, b = _bf16_op(av), _bf16_op(bv)
    chunk_rows = core._chunk_rows
    runs, scales = [], []
    for step, threads, blas in ((None, "1", 1), (None, "2", 2), (None, "3", 1), (7, "2", 2), (16, "3", 1)):
        monkeypatch.setattr(core, "_chunk_rows", chunk_rows if step is None else (lambda m, n, k, s=step: min(m, s)))
        monkeypatch.setenv("DEEPGEMM_REF_NUM_THREADS", threads)
        _parallel.limit_blas_threads(blas)
        out = []
        for want in (False, True):
            r = core.scaled_matmul(a, b, core.OutputStage(fm.F32), want_acc=want, want_S=want)
            out.append(r.out.tobytes() + (b"" if not want else r.acc.tobytes() + r.acc_lo.tobytes()))
            if want:
                scales.append((step, r.S))
        runs.append(out)
    _parallel.limit_blas_threads(os.cpu_count() or 1)
    assert all(run == runs[0] for run in runs)
    assert all(S.tobytes() == scales[0][1].tobytes() for step, S in scales if step is None)
    for _, S in scales:  # at points of certified rows and of tier rows
        _assert_S_bounds(S, av, bv, [(0, 0), (5, 17), (19, 23), (20, 0), (33, 11), (39, 23)])


def test_swapped_operands_give_the_same_bytes(monkeypatch):
    """A GEMM with N much larger than M keeps a whole and streams b (core._swap_operands): the same
    output bytes as the plain orientation.  (The swap is a function of the shape, so a given GEMM
    always takes the same orientation; S, a float32 GEMM in the BLAS's summation order, is then
    another upper bound of the same sum, within the documented factor.)"""
    rng = np.random.default_rng(32)
    av = rng.standard_normal((9, 200)).astype(BF16).astype(np.float64)
    bv = rng.standard_normal((30, 200)).astype(BF16).astype(np.float64)
    av[0, :5], bv[:, :5] = tie_cancel_breaker(1, 30, 5, seed=3)[0], tie_cancel_breaker(1, 30, 5, seed=3)[1]
    c = rng.standard_normal((9, 30)).astype(np.float32).astype(np.float64)
    ep = core.OutputStage(fm.BF16, 0.5, c, "fused")
    plain = core.scaled_matmul(_bf16_op(av), _bf16_op(bv), ep, want_acc=True, want_S=True)
    monkeypatch.setattr(core, "_swap_operands", lambda m, n, k: True)
    swapped = core.scaled_matmul(_bf16_op(av), _bf16_op(bv), ep, want_acc=True, want_S=True)
    assert plain.out.tobytes() == swapped.out.tobytes()
    for S in (plain.S, swapped.S):
        _assert_S_bounds(S, av, bv, [(0, 0), (0, 29), (4, 13), (8, 29)])
    assert np.array_equal(_codes(plain.out), ref.ref_gemm(av, bv, fm.BF16, 0.5, c, "fused"))


def test_gemm_kernels_through_the_tiers():
    """A public kernel on adversarial inputs: DeepGEMM's bf16_gemm_nt gives the exact bytes."""
    av, bv = tie_cancel_breaker(8, 6, 96, seed=41)
    d = np.zeros((8, 6), BF16)
    dg.bf16_gemm_nt(av.astype(np.float32).astype(BF16), bv.astype(np.float32).astype(BF16), d)
    assert np.array_equal(_codes(d), ref.ref_gemm(av, bv, fm.BF16))


# ---------------------------------------------------------------------------------------------
# the GEMM-based tier against the per-element tiers through scaled_matmul (specials included)
# ---------------------------------------------------------------------------------------------

def _per_element_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the GEMM-based tier decide nothing: every open element goes to the per-element tiers."""
    def nothing(a, b, ep, rows, cols, acc, acc_lo, stats):
        return np.zeros(rows.size, ep.out.code_dtype), np.zeros(rows.size, bool)

    monkeypatch.setattr(core, "_sliced_tier", nothing)


def _same_bytes_and_acc_at_least_as_exact(fast: core.MatmulResult, slow: core.MatmulResult, av: np.ndarray,
                                          bv: np.ndarray) -> None:
    """Codes and S byte-identical; the stored accumulator may differ only where the per-element
    tier's was not the exact sum's nearest float64, and the GEMM-based tier's always is."""
    assert fast.out.tobytes() == slow.out.tobytes()
    assert fast.S.tobytes() == slow.S.tobytes()
    differ = ~((fast.acc == slow.acc) | (np.isnan(fast.acc) & np.isnan(slow.acc)))
    for i, j in zip(*np.nonzero(differ), strict=True):
        ex = float(ref.exact_dot(av[i], bv[j]))
        assert fast.acc[i, j] == ex != slow.acc[i, j], (i, j)


def _mixed_adversarial(m: int, n: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """bf16-valued rows: ties with cancelling pairs and tiny tie-breakers, rows whose results are
    subnormal, signed zeros, NaN and +-inf entries."""
    av, bv = tie_cancel_breaker(m, n, k, seed=seed, fill="cancel")
    av[1] *= 2.0**-70  # results of about 2^-133: bf16 / float32 subnormals
    bv[1] *= 2.0**-70
    av[2, :] = -0.0
    av[3, 7], bv[2, 9], bv[3, 11] = np.nan, np.inf, -np.inf
    return av, bv


@pytest.mark.parametrize("out", [fm.BF16, fm.F32])
def test_sliced_tier_bytes_equal_the_per_element_tiers_end_to_end(out, monkeypatch):
    av, bv = _mixed_adversarial(8, 6, 203, seed=51)
    a, b = _bf16_op(av), _bf16_op(bv)
    ep = core.OutputStage(out)
    fast = core.scaled_matmul(a, b, ep, want_acc=True, want_S=True)
    assert fast.stats.get("sliced", 0) > 0
    _per_element_only(monkeypatch)
    slow = core.scaled_matmul(a, b, ep, want_acc=True, want_S=True)
    assert slow.stats.get("sliced", 0) == 0
    _same_bytes_and_acc_at_least_as_exact(fast, slow, av, bv)
    with np.errstate(invalid="ignore", over="ignore"):
        ieee = fm.round_f64(av @ bv.T, out).view(out.code_dtype)
    fin = np.isfinite(av).all(axis=1)[:, None] & np.isfinite(bv).all(axis=1)[None, :]
    assert np.array_equal(_codes(fast.out)[~fin], ieee[~fin])  # non-finite: IEEE arithmetic
    for i, j in zip(*np.nonzero(fin), strict=True):
        assert int(_codes(fast.out)[i, j]) == ref.ref_epilogue(ref.exact_dot(av[i], bv[j]), out), (i, j)


def test_sliced_tier_bytes_equal_the_per_element_tiers_fp8_ue8m0_extremes(monkeypatch):
    rng = np.random.default_rng(52)
    m, n, k, blk = 5, 4, 300, 128
    qa = rng.standard_normal((m, k)).clip(-448, 448).astype(E4M3)
    qb = rng.standard_normal((n, k)).clip(-448, 448).astype(E4M3)
    qa[0, :2], qb[:, :2] = E4M3(448), np.array([[448, -448]] * n, np.float32).astype(E4M3)  # cancelling pair
    nb = -(-k // blk)
    sa = np.exp2(rng.integers(-127, 128, (m, nb)).astype(np.float64))
    sb = np.exp2(rng.integers(-127, 128, (n, nb)).astype(np.float64))
    a, b = core.Operand(qa, sa, blk), core.Operand(qb, sb, blk)
    ep = core.OutputStage(fm.BF16)
    fast = core.scaled_matmul(a, b, ep, want_acc=True, want_S=True)
    _per_element_only(monkeypatch)
    slow = core.scaled_matmul(a, b, ep, want_acc=True, want_S=True)
    av = ref.dequant(qa.view(np.uint8), sa, blk, fm.E4M3)
    bv = ref.dequant(qb.view(np.uint8), sb, blk, fm.E4M3)
    assert fast.stats.get("sliced", 0) > 0
    _same_bytes_and_acc_at_least_as_exact(fast, slow, av, bv)
    assert np.array_equal(_codes(fast.out), ref.ref_gemm(av, bv, fm.BF16))


# ---------------------------------------------------------------------------------------------
# the cheap certificate at the edge of its bound: never a wrong rounding (Fractions decide)
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("tiny", [-30, -44, -50, -54, -58])
@pytest.mark.parametrize("out", [fm.BF16, fm.F32])
def test_certificate_near_ties_never_certifies_a_wrong_rounding(tiny, out):
    """Ties broken by 2^tiny (no cancelling pair: the float64 GEMM's bound is small, so the margin
    certificate and the per-element test decide most elements right at their bound's edge)."""
    av, bv = tie_cancel_breaker(12, 10, 257, seed=53 - tiny, out_bits=8 if out is fm.BF16 else 24, big=-300,
                                tiny=tiny, fill="random")
    res = core.scaled_matmul(_bf16_op(av), _bf16_op(bv), core.OutputStage(out))
    assert np.array_equal(_codes(res.out), ref.ref_gemm(av, bv, out))
    if tiny >= -44:  # the breaker is far above the GEMM's error: the certificates decide
        assert res.stats.get("bounded", 0) > 0


# ---------------------------------------------------------------------------------------------
# S at long K with block scales across the whole UE8M0 range (the float64 fallback) and inside
# float32's range (the float32 GEMM), against Fraction sums
# ---------------------------------------------------------------------------------------------

def test_error_scale_long_k_wide_scales_against_fractions():
    rng = np.random.default_rng(54)
    m, n, k, blk = 2, 3, 16385, 128
    nb = -(-k // blk)
    qa = rng.standard_normal((m, k)).clip(-448, 448).astype(E4M3)
    qb = rng.standard_normal((n, k)).clip(-448, 448).astype(E4M3)
    sa = np.exp2(rng.integers(-4, 5, (m, nb)).astype(np.float64))  # row 0: float32 range suffices
    sb = np.exp2(rng.integers(-4, 5, (n, nb)).astype(np.float64))
    sa[1] = np.exp2(rng.integers(-127, 128, nb).astype(np.float64))  # products beyond float32's range
    sb[2] = np.exp2(rng.integers(-127, 128, nb).astype(np.float64))
    a, b = core.Operand(qa, sa, blk), core.Operand(qb, sb, blk)
    av = ref.dequant(qa.view(np.uint8), sa, blk, fm.E4M3)
    bv = ref.dequant(qb.view(np.uint8), sb, blk, fm.E4M3)
    S = core.error_scale(a, b)
    for i in range(m):
        for j in range(n):
            s = ref.exact_dot(np.abs(av[i]), np.abs(bv[j]))
            assert s <= F(float(S[i, j])) <= s * F(_S_factor(k)) + F(2.0**-999), (i, j)


@pytest.mark.parametrize("zero_side", ["a", "b"])
def test_sliced_tier_with_one_operand_zero_and_many_slices_on_the_other(zero_side):
    """One operand's rows all zero (no slices) and the other's split into several windows (the
    levels then have no pairs): every point is decided, as an exact +0, with or without the
    stored accumulator."""
    rng = np.random.default_rng(13)
    k = 200
    wide = (rng.standard_normal((6, k)) * np.exp2(rng.integers(-80, 80, (6, k)))).astype(BF16).astype(np.float64)
    zero = np.zeros((5, k))
    av, bv = (zero, wide) if zero_side == "a" else (wide, zero)
    a, b = _bf16_op(av), _bf16_op(bv)
    rows, cols = np.nonzero(np.ones((av.shape[0], bv.shape[0]), bool))
    for out in (fm.BF16, fm.F32):
        for full in (False, True):
            acc = np.full((av.shape[0], bv.shape[0]), np.nan) if full else None
            acc_lo = np.full_like(acc, np.nan) if full else None
            stats: dict[str, int] = {}
            codes, done = core._sliced_tier(a, b, core.OutputStage(out), rows, cols, acc, acc_lo, stats)
            assert done.all() and not codes.any() and stats == {"sliced": rows.size}
            if full:
                assert not np.signbit(acc).any() and not acc.any() and not acc_lo.any()


def _dense_slices_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sliced tier as before its shortcuts: dense splits and pair GEMMs, a margin test at every
    level, the groups in order."""
    monkeypatch.setattr(exact, "SPARSE_PART", 1 << 62)
    monkeypatch.setattr(core, "_SPARSE_GAIN", 0.0)
    monkeypatch.setattr(core, "_PROBE_MIN", 1 << 62)
    monkeypatch.setattr(core, "_groups_on_pool", lambda starts, fn, stats: [fn(h0, stats) for h0 in starts])


@pytest.mark.parametrize("fill", ["cancel", pytest.param("random", marks=pytest.mark.slow)])
def test_sliced_tier_shortcuts_give_the_bytes_of_the_dense_tier(fill, monkeypatch):
    """The sliced tier's shortcuts (sparse remainders split value by value, pair products of sparse
    parts value by value, a level's margin test skipped when a sample of the points says it
    decides few, groups of ``b`` on the pool) against the dense tier, bit for bit: codes, acc and
    its low part, stats, and the slices themselves; the adversarial rows leave a few low bits per
    row below the main window (sparse parts on both sides)."""
    m, n, k = 136, 130, 384
    av, bv = tie_cancel_breaker(m, n, k, seed=7, fill=fill)
    rng = np.random.default_rng(7)
    av[:, 5::7] *= np.exp2(-rng.integers(10, 30, av[:, 5::7].shape))  # values whose low bits need a third window
    a, b = _bf16_op(av), _bf16_op(bv)
    rows, cols = _all_points(m, n)
    x = core._gather(a, np.arange(m))
    fast_split = exact.split_windows(x, exact.slice_bits(k))
    assert fast_split is not None and any(e is not None for e in fast_split.entries)
    used = {"sparse": 0, "probe": 0}

    def count(name, fn):
        def wrapped(*args):
            r = fn(*args)
            used[name] += r is not None if name == "sparse" else 1
            return r
        return wrapped

    def run(out):
        results = []
        for want_acc in (True, False):
            acc, lo = (np.zeros((m, n)), np.zeros((m, n))) if want_acc else (None, None)
            st: dict[str, int] = {}
            codes, done = core._sliced_tier(a, b, core.OutputStage(out), rows, cols, acc, lo, st)
            assert done.all()
            results.append((codes.tobytes(), None if acc is None else acc.tobytes() + lo.tobytes(), st))
        return results

    for out in (fm.BF16, fm.F32):
        with monkeypatch.context() as mp:
            mp.setattr(core, "_SLICE_BUDGET", 8 * k * 3 * 48)  # groups of 48 rows: three groups of b
            mp.setenv("DEEPGEMM_REF_NUM_THREADS", "2")
            mp.setattr(core, "_PROBE_MIN", 256)
            mp.setattr(core, "_SPARSE_GAIN", 1e6)  # value by value wherever a part is sparse
            mp.setattr(core, "_sparse_pair", count("sparse", core._sparse_pair))
            mp.setattr(core, "_level_decides", count("probe", core._level_decides))
            got = run(out)
            with mp.context() as slow:
                _dense_slices_only(slow)
                want = run(out)
                dense_split = exact.split_windows(x, exact.slice_bits(k))
        assert got == want
        assert got[0][0] == got[1][0]
        for i, j in zip(rows[::97].tolist(), cols[::97].tolist(), strict=True):
            code = int(np.frombuffer(got[1][0], core.OutputStage(out).out.code_dtype)[i * n + j])
            assert code == ref.ref_epilogue(ref.exact_dot(av[i], bv[j]), out), (i, j)
    assert used["sparse"] > 0 and used["probe"] > 0
    assert dense_split is not None and len(dense_split.parts) == len(fast_split.parts) >= 3
    for field_ in ("parts", "low", "columns", "norms"):
        for p, q in zip(getattr(fast_split, field_), getattr(dense_split, field_), strict=True):
            assert np.array_equal(p, q), field_


@pytest.mark.parametrize("fill", ["cancel", "random"])
def test_codes_alone_skip_the_per_element_test_where_a_probe_says_it_decides_few(fill, monkeypatch):
    """Codes without an accumulator: where the margin test leaves most elements open and a probe
    of the per-element test decides few of them, all go to the exact tier untested; the codes
    are those of every element tested (bit for bit), and with an accumulator nothing changes."""
    av, bv = tie_cancel_breaker(64, 48, 301, seed=3, fill=fill)
    a, b = _bf16_op(av), _bf16_op(bv)
    ep = core.OutputStage(fm.BF16)
    probed = core.scaled_matmul(a, b, ep)
    with_acc = core.scaled_matmul(a, b, ep, want_acc=True)
    calls: list[bool] = []
    real = certified._decides_some

    def spy(*args: object) -> bool:
        calls.append(real(*args))  # type: ignore[arg-type]
        return True  # as if the probe said the per-element test pays: every open element tested

    monkeypatch.setattr(certified, "_decides_some", spy)
    tested = core.scaled_matmul(a, b, ep)
    assert np.array_equal(_codes(probed.out), _codes(tested.out))
    assert np.array_equal(_codes(probed.out), _codes(with_acc.out))
    if fill == "cancel":  # every element open after the margin test: the probe ran and said "few"
        assert calls and not any(calls)
        assert probed.stats.get("bounded", 0) <= tested.stats.get("bounded", 0)
    probes = len(calls)
    again = core.scaled_matmul(a, b, ep, want_acc=True)  # no probe with an accumulator
    assert np.array_equal(again.acc.view(np.uint64), with_acc.acc.view(np.uint64))
    assert len(calls) == probes


@pytest.mark.parametrize("fill", ["cancel", "random"])
@pytest.mark.parametrize("epilogue", ["plain", "alpha_c"])
def test_codes_alone_skip_the_float64_gemm_where_a_probe_block_says_it_decides_little(fill, epilogue, monkeypatch):
    """Codes-only GEMMs of at least _GEMM_PROBE_MIN_ROWS rows: where the certificates decide under
    an eighth of a probe block, every element goes to the exact tier without the float64 GEMM;
    the codes are those of the full path bit for bit (with alpha and c too), benign inputs keep
    the GEMM, and with an accumulator there is no probe."""
    rows = core._GEMM_PROBE_MIN_ROWS
    av, bv = tie_cancel_breaker(rows, core._GEMM_PROBE_COLS + 16, 61, seed=5, fill=fill)
    if fill == "random":  # benign: plain random values, which the GEMM's certificates decide
        rng = np.random.default_rng(5)
        av, bv = rng.standard_normal(av.shape), rng.standard_normal(bv.shape)
    a, b = _bf16_op(av), _bf16_op(bv)
    c = None
    if epilogue == "alpha_c":
        c = (np.random.default_rng(6).standard_normal((av.shape[0], bv.shape[0])) * 4).astype(BF16).astype(np.float64)
    ep = core.OutputStage(fm.BF16, 0.75 if c is not None else None, c, "kernel")
    multiplied: list[int] = []
    real = core._Gemm._multiply

    def spy(self: core._Gemm, a64: np.ndarray, r0: int, r1: int, y: np.ndarray) -> int:
        multiplied.append(r1 - r0)
        return real(self, a64, r0, r1, y)

    monkeypatch.setattr(core._Gemm, "_multiply", spy)
    probed = core.scaled_matmul(a, b, ep)
    skipped = not multiplied
    monkeypatch.setattr(core, "_GEMM_PROBE_MIN_ROWS", 1 << 40)
    full = core.scaled_matmul(a, b, ep)
    assert multiplied  # the full path ran the GEMM
    assert np.array_equal(_codes(probed.out), _codes(full.out))
    assert skipped == (fill == "cancel")
    monkeypatch.setattr(core, "_GEMM_PROBE_MIN_ROWS", rows)
    multiplied.clear()
    with_acc = core.scaled_matmul(a, b, ep, want_acc=True)
    assert multiplied and np.array_equal(_codes(with_acc.out), _codes(full.out))


def test_no_gemm_probe_where_the_scales_certify_every_element(monkeypatch):
    """FP8 with power-of-two scales whose bound from the scales certifies every element exact:
    no probe block is computed (it would be wasted work)."""
    calls: list[int] = []
    monkeypatch.setattr(core, "_gemm_decides_little", lambda *args: calls.append(1) or False)
    rng = np.random.default_rng(8)
    x = rng.standard_normal((core._GEMM_PROBE_MIN_ROWS, 256), dtype=np.float32)
    w = rng.standard_normal((core._GEMM_PROBE_COLS, 256), dtype=np.float32)
    (qa, sa), (qb, sb) = dg.per_token_cast_to_fp8(x, True, 128), dg.per_token_cast_to_fp8(w, True, 128)
    a, b = core.Operand(qa, sa.astype(np.float64), 128), core.Operand(qb, sb.astype(np.float64), 128)
    core.scaled_matmul(a, b, core.OutputStage(fm.BF16))
    assert not calls
    core.scaled_matmul(_bf16_op(x.astype(np.float64)), _bf16_op(w.astype(np.float64)), core.OutputStage(fm.BF16))
    assert calls == [1]


@pytest.mark.parametrize("nan_scale", [False, True])
@pytest.mark.parametrize("model", ["exact", "fp32", Limited(13, 32)])
def test_packed_fp4_operand_is_the_unpacked_one(model, nan_scale):
    """An E2M1 operand given two codes a byte (Operand.packed: Mega MoE's weights) decodes and
    multiplies exactly as the same codes one a byte: its rows, row subsets and block scales, and
    the codes, accumulator and error scale of every accumulation model; with power-of-two scales
    decoded and scaled in one lookup (core._packed_scaled_into), with a NaN scale the other way."""
    rng = np.random.default_rng(46)
    m, n, k = 24, 40, 272  # K: eight whole 32-blocks and a half one
    codes_b = rng.integers(0, 16, (n, k)).astype(np.uint8)
    sb = np.exp2(rng.integers(-20, 20, (n, -(-k // 32))).astype(float))
    if nan_scale:
        sb[3, 2] = np.nan
    a = core.Operand(rng.standard_normal((m, k)).astype(np.float32).astype(E4M3),
                     np.exp2(rng.integers(-4, 4, (m, -(-k // 128))).astype(float)), 128)
    plain = core.Operand(codes_b, sb, 32, codes_fmt=fm.E2M1)
    packed = core.Operand(fm.pack_fp4(codes_b).view(np.uint8), sb, 32, codes_fmt=fm.E2M1, packed=True)
    assert packed.shape == plain.shape == (n, k)
    idx = np.array([5, 0, 39, 5])
    assert np.array_equal(packed.rows(3, 17), plain.rows(3, 17), equal_nan=True)
    assert np.array_equal(packed.take_rows(idx), plain.take_rows(idx), equal_nan=True)
    assert np.array_equal(packed.take_block_scales(idx, 32), plain.take_block_scales(idx, 32), equal_nan=True)
    out = np.empty((7, k))
    core._decode_into(packed, 2, 9, out)
    assert np.array_equal(out, plain.element_rows(2, 9))
    assert core._packed_scaled_into(packed, 2, 9, out) is not nan_scale
    if not nan_scale:
        assert np.array_equal(out.view(np.uint64), plain.rows(2, 9).view(np.uint64))
    core._decode_into(packed, 2, 9, out[:, ::-1].T.T[:, ::-1])  # a non-contiguous destination: unpacked first
    ep = core.OutputStage(fm.BF16)
    for x, y in ((a, packed), (packed, a)):
        want = core.scaled_matmul(*((a, plain) if x is a else (plain, a)), ep, model=model, want_acc=True, want_S=True)
        got = core.scaled_matmul(x, y, ep, model=model, want_acc=True, want_S=True)
        assert np.array_equal(_codes(got.out), _codes(want.out))
        for name in ("acc", "S"):
            w, g = getattr(want, name), getattr(got, name)
            assert (w is None) == (g is None)
            if w is not None:
                assert np.array_equal(w.view(np.uint64), g.view(np.uint64))
