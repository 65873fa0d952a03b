"""Dense GEMMs against exact rational arithmetic and the spec's roundings; properties; bad input."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import deepgemm_ref as dg
from deepgemm_ref import core, gemm, trace
from deepgemm_ref import formats as fm
from deepgemm_ref.errors import DGArgumentError

from . import reference as ref

BF16 = ml_dtypes.bfloat16
E4M3 = ml_dtypes.float8_e4m3fn
OUT = {np.dtype(BF16): fm.BF16, np.dtype(np.float32): fm.F32}


def _codes(x):
    return np.ascontiguousarray(x).view({2: np.uint16, 4: np.uint32}[x.dtype.itemsize])


def _fp8(x, gran_k=128, ue8m0=True):
    return dg.per_token_cast_to_fp8(x, use_ue8m0=ue8m0, gran_k=gran_k)


def _fp8_vals(q, sf, gran_k):
    return ref.dequant(q.view(np.uint8), sf, gran_k, fm.E4M3)


def _fp4_vals(p, sf, gran_k):
    return ref.dequant(fm.unpack_fp4(p), sf, gran_k, fm.E2M1)


def _rand(shape, seed, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# exact against Fractions, all operand kinds, outputs, c and alpha
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("out_dtype", [BF16, np.float32])
@pytest.mark.parametrize("c_kind", [None, "separate", "is_d"])
@pytest.mark.parametrize("gran", [(128, 128), (128, 32), (32, 32)])
def test_fp8_sm100_exact_vs_fractions(out_dtype, c_kind, gran):
    m, n, k = 6, 5, 300
    ga, gb = gran
    x, w = _rand((m, k), 1), _rand((n, k), 2)
    qa, sa = _fp8(x, ga)
    qb, sb = _fp8(w, gb)
    c = _rand((m, n), 3).astype(out_dtype) if c_kind else None
    d = np.zeros((m, n), out_dtype) if c_kind != "is_d" else c.copy()
    c_arg = d if c_kind == "is_d" else c
    gemm.fp8_fp4_gemm_nt((qa, sa), (qb, sb), d, c=c_arg, recipe_a=(1, ga), recipe_b=(1, gb))
    expect = ref.ref_gemm(_fp8_vals(qa, sa, ga), _fp8_vals(qb, sb, gb), OUT[np.dtype(out_dtype)], c=c)
    assert np.array_equal(_codes(d), expect)


@pytest.mark.parametrize("out_dtype", [BF16, np.float32])
def test_fp8_x_fp4_and_fp4_x_fp4_exact(out_dtype):
    m, n, k = 4, 6, 256
    x, w = _rand((m, k), 4), _rand((n, k), 5)
    qa, sa = _fp8(x, 128)
    pa, s4a = dg.per_token_cast_to_fp4(x, use_ue8m0=True, gran_k=32)
    pb, s4b = dg.per_token_cast_to_fp4(w, use_ue8m0=True, gran_k=32)
    d = np.zeros((m, n), out_dtype)
    gemm.fp8_fp4_gemm_nt((qa, sa), (pb, s4b), d, recipe_a=(1, 128), recipe_b=(1, 32))
    assert np.array_equal(_codes(d), ref.ref_gemm(_fp8_vals(qa, sa, 128), _fp4_vals(pb, s4b, 32), OUT[np.dtype(out_dtype)]))
    gemm.fp8_fp4_gemm_nt((pa, s4a), (pb, s4b), d, recipe=(1, 1, 32))
    assert np.array_equal(_codes(d), ref.ref_gemm(_fp4_vals(pa, s4a, 32), _fp4_vals(pb, s4b, 32), OUT[np.dtype(out_dtype)]))


@pytest.mark.parametrize("out_dtype", [BF16, np.float32])
def test_sm90_fp32_scales_exact(out_dtype):
    """SM90 recipes: FP32 (non-power-of-two) scales; 1D2D (bf16, no c) and 1D1D (f32 with c)."""
    m, n, k = 5, 130, 384
    x, w = _rand((m, k), 6, 3.0), _rand((n, k), 7, 0.01)
    with dg.numerics(arch="sm90"):
        qa, sa = _fp8(x, 128, ue8m0=False)
        if out_dtype is BF16:
            qb, sb = dg.per_block_cast_to_fp8(w, use_ue8m0=False)
            d = np.zeros((m, n), BF16)
            gemm.fp8_fp4_gemm_nt((qa, sa), (qb, sb), d)
            b_vals = fm.decode(qb.view(np.uint8), fm.E4M3) * np.repeat(np.repeat(sb.astype(np.float64), 128, 0), 128, 1)[:n, :k]
            assert np.array_equal(_codes(d), ref.ref_gemm(_fp8_vals(qa, sa, 128), b_vals, fm.BF16))
        else:
            qb, sb = _fp8(w, 128, ue8m0=False)
            c = _rand((m, n), 8)
            d = c.copy()
            gemm.fp8_fp4_gemm_nt((qa, sa), (qb, sb), d, c=d, recipe=(1, 1, 128))
            assert np.array_equal(_codes(d), ref.ref_gemm(_fp8_vals(qa, sa, 128), _fp8_vals(qb, sb, 128), fm.F32, c=c))


def test_ascend_alpha_and_c():
    m, n, k = 4, 5, 320  # K not a multiple of 64: the kernel zero-pads the tail
    x, w = _rand((m, k), 9), _rand((n, k), 10)
    with dg.numerics(arch="ascend950"):
        qa, sa = _fp8(x, 32)
        qb, sb = _fp8(w, 32)
        for out_dtype in (BF16, np.float32):
            c = _rand((m, n), 11).astype(out_dtype)
            d = c.copy()
            gemm.fp8_fp4_gemm_nt((qa, sa), (qb, sb), d, c=d, alpha=0.3)
            expect = ref.ref_gemm(_fp8_vals(qa, sa, 32), _fp8_vals(qb, sb, 32), OUT[np.dtype(out_dtype)], alpha=0.3, c=c)
            assert np.array_equal(_codes(d), expect)
            d2 = np.zeros((m, n), out_dtype)
            gemm.fp8_fp4_gemm_nt((qa, sa), (qb, sb), d2, epilogue=dg.epilogue.Alpha(0.3))
            assert np.array_equal(_codes(d2), ref.ref_gemm(_fp8_vals(qa, sa, 32), _fp8_vals(qb, sb, 32),
                                                         OUT[np.dtype(out_dtype)], alpha=0.3))


@pytest.mark.parametrize("out_dtype", [BF16, np.float32])
def test_bf16_gemm_exact_with_wide_exponents(out_dtype):
    rng = np.random.default_rng(12)
    m, n, k = 5, 4, 200
    a = (rng.standard_normal((m, k)) * np.exp2(rng.integers(-40, 40, (m, k)))).astype(np.float32).astype(BF16)
    b = (rng.standard_normal((n, k)) * np.exp2(rng.integers(-40, 40, (n, k)))).astype(np.float32).astype(BF16)
    c = _rand((m, n), 13).astype(out_dtype)
    d = np.zeros((m, n), out_dtype)
    gemm.bf16_gemm_nt(a, b, d, c=c)
    assert np.array_equal(_codes(d), ref.ref_gemm(a.astype(np.float64), b.astype(np.float64), OUT[np.dtype(out_dtype)], c=c))


# ---------------------------------------------------------------------------------------------
# adversarial accumulators
# ---------------------------------------------------------------------------------------------

def _bf16_pair(avals, bvals):
    return np.array([avals], np.float32).astype(BF16), np.array([bvals], np.float32).astype(BF16)


def test_exact_tie_and_tie_broken_by_2_pow_minus_40():
    """acc = 1 + 2^-8 is a bf16 tie (-> 1.0); one more product of 2^-40 breaks it upward.
    Through float32 the 2^-40 would vanish (numerics D1)."""
    a, b = _bf16_pair([1.0, 2.0**-8, 0.0], [1.0, 1.0, 1.0])
    d = np.zeros((1, 1), BF16)
    gemm.bf16_gemm_nt(a, b, d)
    assert float(d[0, 0]) == 1.0
    a, b = _bf16_pair([1.0, 2.0**-8, 2.0**-20], [1.0, 1.0, 2.0**-20])
    gemm.bf16_gemm_nt(a, b, d)
    assert float(d[0, 0]) == 1.0078125
    # float32 output: 1 + 2^-24 is an f32 tie; 2^-64 more breaks it
    d32 = np.zeros((1, 1), np.float32)
    a, b = _bf16_pair([1.0, 2.0**-12, 2.0**-32], [1.0, 2.0**-12, 2.0**-32])
    gemm.bf16_gemm_nt(a, b, d32)
    assert d32[0, 0] == np.float32(1 + 2.0**-23)  # 1 + 2^-24 + 2^-64 rounds up
    a, b = _bf16_pair([1.0, 2.0**-12], [1.0, 2.0**-12])
    gemm.bf16_gemm_nt(a, b, d32)
    assert d32[0, 0] == np.float32(1.0)


def test_long_k_float32_output_tiers_against_fractions():
    """K > 2048 with a float32 output: the K-blocked GEMM bound, the pairwise tier and the
    double-double tier each decide some elements, and all agree with exact rationals.

    Row 0 holds random normals (most elements certified by the GEMM bound, some by the pairwise
    sum); rows 1 and 2 hold an f32 tie 1 + 2^-24 (and the tie broken by 2^-64) buried under
    K - 3 products that cancel exactly in pairs, so only an exact tier can round them.
    """
    rng = np.random.default_rng(41)
    m, n, k = 3, 24, 4099
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((n, k), dtype=np.float32)
    half = (k - 3) // 2
    for i, tail in ((1, 0.0), (2, 2.0**-32)):
        a[i, 0], a[i, 1], a[i, 2] = 1.0, 2.0**-12, tail
        a[i, 3:3 + 2 * half:2] = a[i, 4:4 + 2 * half:2]  # equal neighbours ...
    b[:, :3] = [1.0, 2.0**-12, 2.0**-32]
    b[:, 4:4 + 2 * half:2] = -b[:, 3:3 + 2 * half:2]  # ... against opposite ones: pairs cancel
    a16, b16 = a.astype(BF16), b.astype(BF16)
    d = np.zeros((m, n), np.float32)
    with trace.capture() as cap:
        gemm.bf16_gemm_nt(a16, b16, d)
    stats = cap.records[-1].stats
    # rows 1 and 2 need an exact tier: the GEMM-based one (or the per-element double-double)
    assert stats.get("sliced", 0) + stats.get("double_double", 0) >= 2 * n and stats.get("bounded", 0) > 0
    expect = ref.ref_gemm(a16.astype(np.float64), b16.astype(np.float64), fm.F32)
    assert np.array_equal(_codes(d), expect)
    assert np.all(d[1] == np.float32(1.0)) and np.all(d[2] == np.float32(1 + 2.0**-23))


def test_pairwise_tier_decides_what_the_gemm_bound_leaves():
    """Random normals at K = 8192, float32 output: the a priori bound leaves elements open and
    the pairwise float64 sum (error <= gamma(log2 K) sum |t|) settles them, matching rationals."""
    rng = np.random.default_rng(43)
    m, n, k = 2, 256, 8192
    a16 = rng.standard_normal((m, k), dtype=np.float32).astype(BF16)
    b16 = rng.standard_normal((n, k), dtype=np.float32).astype(BF16)
    d = np.zeros((m, n), np.float32)
    with trace.capture() as cap:
        gemm.bf16_gemm_nt(a16, b16, d)
    stats = cap.records[-1].stats
    tiers = {key: v for key, v in stats.items() if key != "exact" and key != "bounded"}
    assert sum(stats.values()) == m * n and sum(tiers.values()) > 0, stats
    a64, b64 = a16.astype(np.float64), b16.astype(np.float64)
    expect = [[ref.exact_dot_f32_code(a64[i], b64[j]) for j in range(n)] for i in range(m)]
    assert np.array_equal(_codes(d), np.array(expect, np.uint32))


def test_ties_through_fp32_scales_use_the_exact_fallback():
    """Non-power-of-two scales disable the exactness certificate; ties must still round exactly."""
    k = 256
    qa = np.zeros((1, k), np.float32)
    qb = np.zeros((1, k), np.float32)
    qa[0, 0], qb[0, 0] = 1.0, 1.0
    qa[0, 128], qb[0, 128] = 1.0, 1.0
    qa8, qb8 = qa.astype(E4M3), qb.astype(E4M3)
    # block 0 scale product 1, block 1 scale product 2^-8 * 3 / 3 ... choose sa * sb = 2^-8 exactly
    sa = np.array([[1.5, 1.5 * 2.0**-4]], np.float32)
    sb = np.array([[1 / np.float32(1.5), 2.0**-4 / np.float32(1.5)]], np.float32)
    acc = ref.exact_dot(ref.dequant(qa8.astype(np.float64), sa, 128)[0], ref.dequant(qb8.astype(np.float64), sb, 128)[0])
    d = np.zeros((1, 1), BF16)
    with dg.numerics(arch="sm90"):
        gemm.fp8_fp4_gemm_nt((qa8, sa), (qb8, np.repeat(sb, 1, 0)), d, recipe=(1, 128, 128))
    assert _codes(d)[0, 0] == ref.ref_epilogue(acc, fm.BF16)


def test_scales_far_apart_cancellation_and_subnormal_scales():
    k = 96
    a = np.zeros((3, k), np.float32)
    b = np.zeros((2, k), np.float32)
    a[0, 0], a[0, 32], a[0, 64] = 1.0, 1.0, -1.0
    b[0, 0], b[0, 32], b[0, 64] = 1.0, 1.0, 1.0
    a[1, :] = 1.0
    a[2, 5], a[2, 40] = 448.0, -448.0
    b[1, :] = 0.5
    qa, qb = a.astype(E4M3), b.astype(E4M3)
    sa = np.array([[2.0**100, 2.0**-100, 2.0**-100], [2.0**-126, 1.0, 2.0**-126], [1.0, 1.0, 1.0]], np.float32)
    sb = np.array([[1.0, 1.0, 1.0], [2.0**-20, 2.0**-20, 1.0]], np.float32)
    for out_dtype in (BF16, np.float32):
        d = np.zeros((3, 2), out_dtype)
        gemm.fp8_fp4_gemm_nt((qa, sa), (qb, sb), d, recipe=(1, 1, 32))
        expect = ref.ref_gemm(ref.dequant(a.astype(np.float64), sa, 32), ref.dequant(b.astype(np.float64), sb, 32),
                              OUT[np.dtype(out_dtype)])
        assert np.array_equal(_codes(d), expect)
    # UE8M0 byte 0 is 2^-127 to the hardware: a float32 scale 0.0 packs to byte 0
    sa0 = np.array([[0.0, 2.0**-126, 1.0]] * 3, np.float32)
    d = np.zeros((3, 2), np.float32)
    gemm.fp8_fp4_gemm_nt((qa, sa0), (qb, sb), d, recipe=(1, 1, 32))
    sa0_hw = np.array([[2.0**-127, 2.0**-126, 1.0]] * 3)
    expect = ref.ref_gemm(ref.dequant(a.astype(np.float64), sa0_hw, 32), ref.dequant(b.astype(np.float64), sb, 32), fm.F32)
    assert np.array_equal(_codes(d), expect)


@pytest.mark.parametrize("out_dtype", [BF16, np.float32])
def test_k_not_multiple_of_block(out_dtype):
    m, n, k = 3, 4, 200  # 200 = 128 + 72
    x, w = _rand((m, k), 20), _rand((n, k), 21)
    qa, sa = _fp8(x, 128)
    qb, sb = _fp8(w, 128)
    d = np.zeros((m, n), out_dtype)
    gemm.fp8_fp4_gemm_nt((qa, sa), (qb, sb), d, recipe=(1, 1, 128))
    assert np.array_equal(_codes(d), ref.ref_gemm(_fp8_vals(qa, sa, 128), _fp8_vals(qb, sb, 128), OUT[np.dtype(out_dtype)]))


# ---------------------------------------------------------------------------------------------
# accumulation models (the core's own tests are in tests/test_core.py)
# ---------------------------------------------------------------------------------------------

def test_numerics_option_selects_model():
    x, w = _rand((4, 256), 34), _rand((4, 256), 35)
    qa, sa = _fp8(x, 128)
    qb, sb = _fp8(w, 128)
    d1 = np.zeros((4, 4), np.float32)
    d2 = np.zeros((4, 4), np.float32)
    gemm.fp8_fp4_gemm_nt((qa, sa), (qb, sb), d1, recipe=(1, 1, 128))
    with dg.numerics(accumulation="limited(8, 128)"):
        gemm.fp8_fp4_gemm_nt((qa, sa), (qb, sb), d2, recipe=(1, 1, 128))
    assert not np.array_equal(d1, d2)


# ---------------------------------------------------------------------------------------------
# properties
# ---------------------------------------------------------------------------------------------

dims = st.tuples(st.integers(1, 6), st.integers(1, 6), st.sampled_from([64, 128, 200, 256]))


@given(dims, st.integers(0, 2**31 - 1), st.sampled_from([BF16, np.float32]))
def test_four_layouts_agree(shape, seed, out_dtype):
    m, n, k = shape
    x, w = _rand((m, k), seed), _rand((n, k), seed + 1)
    qa, sa = _fp8(x, 128)
    qb, sb = _fp8(w, 128)
    outs = []
    for layout in ("nt", "nn", "tn", "tt"):
        a = (qa, sa) if layout[0] == "n" else (np.ascontiguousarray(qa.T), np.ascontiguousarray(sa.T))
        b = (qb, sb) if layout[1] == "t" else (np.ascontiguousarray(qb.T), np.ascontiguousarray(sb.T))
        d = np.zeros((m, n), out_dtype)
        getattr(dg, f"fp8_fp4_gemm_{layout}")(a, b, d, recipe=(1, 1, 128))
        outs.append(_codes(d))
        xb, wb = x.astype(BF16), w.astype(BF16)
        a2 = xb if layout[0] == "n" else np.ascontiguousarray(xb.T)
        b2 = wb if layout[1] == "t" else np.ascontiguousarray(wb.T)
        d2 = np.zeros((m, n), out_dtype)
        getattr(dg, f"bf16_gemm_{layout}")(a2, b2, d2)
        outs.append(_codes(d2))
    for o in outs[2::2]:
        assert np.array_equal(o, outs[0])
    for o in outs[3::2]:
        assert np.array_equal(o, outs[1])


@given(dims, st.integers(0, 2**31 - 1))
def test_user_form_and_required_layout_same_bytes(shape, seed):
    m, n, k = shape
    x, w = _rand((m, k), seed), _rand((n, k), seed + 3)
    qa, sa = _fp8(x, 32)
    qb, sb = _fp8(w, 32)
    d1 = np.zeros((m, n), BF16)
    d2 = np.zeros((m, n), BF16)
    gemm.fp8_fp4_gemm_nt((qa, sa), (qb, sb), d1, recipe=(1, 1, 32))
    ta = dg.transform_sf_into_required_layout(sa, m, k, (1, 1, 32), is_sfa=True)
    tb = dg.transform_sf_into_required_layout(sb, n, k, (1, 1, 32), is_sfa=False)
    assert ta.dtype == np.int32
    gemm.fp8_fp4_gemm_nt((qa, ta), (qb, tb), d2, recipe=(1, 1, 32))
    assert np.array_equal(_codes(d1), _codes(d2))
    with dg.numerics(arch="ascend950"):
        d3 = np.zeros((m, n), BF16)
        d4 = np.zeros((m, n), BF16)
        gemm.fp8_fp4_gemm_nt((qa, sa), (qb, sb), d3)
        ta = dg.transform_sf_into_required_layout(sa, m, k, (1, 1, 32), is_sfa=True)
        tb = dg.transform_sf_into_required_layout(sb, n, k, (1, 1, 32), is_sfa=False)
        assert ta.dtype == np.int16
        gemm.fp8_fp4_gemm_nt((qa, ta), (qb, tb), d4)
        assert np.array_equal(_codes(d3), _codes(d4))
        assert np.array_equal(_codes(d1), _codes(d3))


@given(dims, st.integers(0, 2**31 - 1), st.floats(-4, 4, allow_nan=False).filter(lambda v: v != 0))
def test_alpha_and_c_formulas(shape, seed, alpha):
    m, n, k = shape
    x, w = _rand((m, k), seed), _rand((n, k), seed + 5)
    qa, sa = _fp8(x, 32)
    qb, sb = _fp8(w, 32)
    with dg.numerics(arch="ascend950"):
        for out_dtype in (BF16, np.float32):
            plain = np.zeros((m, n), np.float32)
            dg.fp8_fp4_gemm_nt((qa, sa), (qb, sb), plain)  # f32(acc)
            c = _rand((m, n), seed + 9).astype(out_dtype)
            d = c.copy()
            dg.fp8_fp4_gemm_nt((qa, sa), (qb, sb), d, c=d, alpha=alpha)
            # exact acc is certified in float64 here, so the formula can be evaluated on it
            a = core.Operand(qa, dg.layout.sf_values(sa, m, k, 1, 32, func="t", arg="a"), 32)
            b = core.Operand(qb, dg.layout.sf_values(sb, n, k, 1, 32, func="t", arg="b"), 32)
            acc = core.scaled_matmul(a, b, core.OutputStage(fm.F32), want_acc=True).acc
            z = fm.round_f64(np.float64(np.float32(alpha)) * acc if False else acc, fm.F32)
            z = fm.round_dd(*fm.two_prod(np.float64(np.float32(alpha)), acc), fm.F32).astype(np.float64)
            if out_dtype is BF16:
                z = fm.round_f64(z, fm.BF16).astype(np.float64)
            s, e = fm.two_sum(c.astype(np.float64), z)
            assert np.array_equal(_codes(d), _codes(fm.round_dd(s, e, OUT[np.dtype(out_dtype)])))


# ---------------------------------------------------------------------------------------------
# DeepGEMM-style check: calc_diff against the unquantised product under its thresholds
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind,threshold", [("fp8", 1e-3), ("fp8xfp4", 1e-2), ("fp4", 2e-2), ("bf16", 1e-5)])
def test_deepgemm_style_calc_diff(kind, threshold):
    rng = np.random.default_rng(40)
    m, n, k = 128, 256, 1024
    a = rng.standard_normal((m, k)).astype(np.float32).astype(BF16)
    b = rng.standard_normal((n, k)).astype(np.float32).astype(BF16)
    ref_d = a.astype(np.float32) @ b.astype(np.float32).T
    d = np.zeros((m, n), BF16)
    if kind == "bf16":
        dg.bf16_gemm_nt(a, b, d)
    elif kind == "fp8":
        dg.fp8_gemm_nt(_fp8(a, 128), _fp8(b, 128), d, recipe=(1, 1, 128))
    elif kind == "fp8xfp4":
        dg.fp8_fp4_gemm_nt(_fp8(a, 128), dg.per_token_cast_to_fp4(b, use_ue8m0=True, gran_k=32), d,
                           recipe_a=(1, 128), recipe_b=(1, 32))
    else:
        dg.fp8_fp4_gemm_nt(dg.per_token_cast_to_fp4(a, use_ue8m0=True, gran_k=32),
                           dg.per_token_cast_to_fp4(b, use_ue8m0=True, gran_k=32), d, recipe=(1, 1, 32))
    assert dg.testing.calc_diff(d, ref_d) < threshold


# ---------------------------------------------------------------------------------------------
# zero-sized problems, c semantics, bad input
# ---------------------------------------------------------------------------------------------

def test_c_epilogue_overflow_and_infinite_c_follow_ieee():
    """bf16(acc) overflowing to inf, then + c, stays inf (not NaN); an infinite c gives inf
    (or NaN against the opposite infinity), in the vectorised and the exact-rational epilogue."""
    big_a, four = np.array([[2.0**127]], BF16), np.array([[4.0]], BF16)
    d = np.zeros((1, 1), BF16)
    gemm.bf16_gemm_nt(big_a, four, d, c=np.array([[1.0]], BF16))
    assert _codes(d)[0, 0] == 0x7F80
    gemm.bf16_gemm_nt(-big_a, four, d, c=np.array([[np.inf]], BF16))
    assert np.isnan(d.astype(np.float32)[0, 0])
    d32 = np.zeros((1, 1), np.float32)
    gemm.bf16_gemm_nt(np.ones((1, 1), BF16), np.ones((1, 1), BF16), d32, c=np.array([[-np.inf]], np.float32))
    assert d32[0, 0] == -np.inf
    with dg.numerics(arch="ascend950"):
        d32[...] = 0
        gemm.bf16_gemm_nt(big_a, four, d32, c=np.array([[2.0]], np.float32), alpha=2.0**100)
        assert d32[0, 0] == np.inf  # f32(alpha * acc) overflows; inf + 2 = inf
    # the rational specification used by the last-resort tier
    acc = ref.F(2) ** 129
    for out, c, want in ((fm.BF16, 1.0, 0x7F80), (fm.F32, np.inf, 0x7F800000)):
        ep = core.OutputStage(out, None, np.array([[c]], np.float64))
        assert int(ep.apply_exact(acc, 0, 0)) == want
    ep = core.OutputStage(fm.F32, 2.0, np.array([[1.0]], np.float64))
    assert int(ep.apply_exact(acc, 0, 0)) == 0x7F800000
    ep = core.OutputStage(fm.BF16, None, np.array([[-np.inf]], np.float64))
    assert np.isnan(fm.decode_scalar(int(ep.apply_exact(acc, 0, 0)), fm.BF16))


def test_alpha_overflowing_float32_is_rejected_before_d_is_touched():
    """The kernel multiplies by a float32 alpha: 1e40 would be inf (inf * 0 = NaN everywhere), so
    it is the argument error, like an infinite alpha; the largest float32 alpha is accepted."""
    from deepgemm_ref.epilogue import Alpha

    a, b = np.ones((1, 32), BF16), np.ones((2, 32), BF16)
    with dg.numerics(arch="ascend950"):
        d = np.full((1, 2), 3.0, np.float32)
        for bad in (1e40, float.fromhex("0x1.ffffffp127")):
            with pytest.raises(DGArgumentError, match="alpha"):
                gemm.bf16_gemm_nt(a, b, d, alpha=bad)
            with pytest.raises(DGArgumentError, match="alpha"):
                Alpha(bad)
        assert np.all(d == 3.0)
        gemm.bf16_gemm_nt(a, b, d, alpha=float(np.finfo(np.float32).max))
        assert np.all(d == np.inf)  # 32 * max overflows in the output rounding, as IEEE does


def test_alpha_times_infinite_accumulator_and_signed_zeros():
    """f32(alpha * inf) is inf (Dekker's error term would be NaN); f32(-1 * +0) is -0; bf16 with
    c = -0 and acc rounding to -0 gives -0 + -0 = -0: in the vectorised and the rational tier."""
    a = np.array([[np.inf, 2.0**100, 0, 0]], BF16)
    b = np.array([[1, 2.0**100, 0, 0]], BF16)
    d32 = np.zeros((1, 1), np.float32)
    gemm.bf16_gemm_nt(a, b, d32, alpha=3.0)
    assert _codes(d32)[0, 0] == 0x7F800000
    gemm.bf16_gemm_nt(np.zeros((1, 4), BF16), np.ones((1, 4), BF16), d32, alpha=-1.0)
    assert _codes(d32)[0, 0] == 0x80000000
    d16 = np.zeros((1, 1), BF16)
    gemm.bf16_gemm_nt(np.zeros((1, 4), BF16), np.ones((1, 4), BF16), d16, alpha=-1.0)
    assert _codes(d16)[0, 0] == 0x8000
    gemm.bf16_gemm_nt(np.array([[-(2.0**-67)]], BF16), np.array([[2.0**-67]], BF16), d16,
                      c=np.array([[-0.0]], BF16))
    assert _codes(d16)[0, 0] == 0x8000
    # the rational specification
    zero = ref.F(0)
    assert int(core.OutputStage(fm.F32, -1.0).apply_exact(zero, 0, 0)) == 0x80000000
    ep = core.OutputStage(fm.BF16, None, np.array([[-0.0]]))
    assert int(ep.apply_exact(-ref.F(2) ** -134, 0, 0)) == 0x8000
    assert int(ep.apply_exact(ref.F(2) ** -134, 0, 0)) == 0x0000  # -0 + +0 = +0


def test_zero_k_copies_c_or_zeroes():
    a = np.zeros((3, 0), BF16)
    b = np.zeros((2, 0), BF16)
    d = np.full((3, 2), 7, np.float32)
    dg.bf16_gemm_nt(a, b, d)
    assert not d.any()
    c = np.full((3, 2), 2.5, np.float32)
    dg.bf16_gemm_nt(a, b, d, c=c)
    assert np.all(d == 2.5)
    d0 = np.full((0, 2), 1, np.float32)
    dg.bf16_gemm_nt(np.zeros((0, 4), BF16), np.zeros((2, 4), BF16), d0)


def _fp8_case():
    x, w = _rand((4, 256), 50), _rand((3, 256), 51)
    return _fp8(x, 128), _fp8(w, 128)


BAD = [
    ("fp8 b shape", lambda a, b, d: dg.fp8_fp4_gemm_nt(a, (b[0][:, :128], b[1]), d, recipe=(1, 1, 128))),
    ("d dtype", lambda a, b, d: dg.fp8_fp4_gemm_nt(a, b, d.astype(np.float16), recipe=(1, 1, 128))),
    ("d shape", lambda a, b, d: dg.fp8_fp4_gemm_nt(a, b, d[:, :2], recipe=(1, 1, 128))),
    ("both recipes", lambda a, b, d: dg.fp8_fp4_gemm_nt(a, b, d, recipe=(1, 1, 128), recipe_a=(1, 128), recipe_b=(1, 128))),
    ("non pow2 on sm100", lambda a, b, d: dg.fp8_fp4_gemm_nt(a, (b[0], b[1] * np.float32(1.5)), d, recipe=(1, 1, 128))),
    ("sf shape", lambda a, b, d: dg.fp8_fp4_gemm_nt(a, (b[0], b[1][:, :1]), d, recipe=(1, 1, 128))),
    ("gran_k 64", lambda a, b, d: dg.fp8_fp4_gemm_nt(a, b, d, recipe=(1, 1, 64))),
    ("c dtype", lambda a, b, d: dg.fp8_fp4_gemm_nt(a, b, d, c=np.zeros((4, 3), BF16), recipe=(1, 1, 128))),
]


@pytest.mark.parametrize("name,call", BAD, ids=[n for n, _ in BAD])
def test_bad_input_leaves_d_untouched(name, call):
    a, b = _fp8_case()
    d = np.full((4, 3), 3.0, np.float32)
    before = d.copy()
    with pytest.raises(DGArgumentError) as info:
        call(a, b, d)
    assert "fp8_fp4_gemm_nt" in str(info.value)
    assert np.array_equal(d, before)


def test_profile_matrix():
    a, b = _fp8_case()
    d = np.zeros((4, 3), BF16)
    p4a = dg.per_token_cast_to_fp4(_rand((4, 256), 52), use_ue8m0=True, gran_k=32)
    with dg.numerics(arch="sm90"):
        with pytest.raises(DGArgumentError, match="int8"):
            dg.fp8_fp4_gemm_nt(p4a, b, d, recipe_a=(1, 32), recipe_b=(1, 128))
        with pytest.raises(DGArgumentError, match="K-major"):
            dg.fp8_fp4_gemm_nt((np.ascontiguousarray(a[0].T).T, a[1]), b, d, recipe=(1, 128, 128))
        with pytest.raises(DGArgumentError, match="1D1D"):
            dg.fp8_fp4_gemm_nt(a, b, d, recipe=(1, 1, 128))
    with dg.numerics(arch="ascend950"):
        with pytest.raises(DGArgumentError, match="gran_k 32"):
            dg.fp8_fp4_gemm_nt(a, b, d, recipe=(1, 1, 128))
        with pytest.raises(DGArgumentError, match="not provided"):
            gemm.fp8_gemm_nt_skip_head_mid(a, b, d, (128, 64, 128))
        with pytest.raises(DGArgumentError, match="Unsupported operand dtypes"):
            dg.fp8_fp4_gemm_nt(p4a, _fp8(_rand((3, 256), 1), 32), d)
    with pytest.raises(DGArgumentError, match="not provided"):
        gemm.aclnn_bf16_gemm_nt(np.zeros((2, 2), BF16), np.zeros((2, 2), BF16), np.zeros((2, 2), BF16))


def test_skip_head_mid():
    left, mid, right = 64, 32, 64
    heads = 2
    n, k, m = heads * (left + right), 256, 4
    x, w = _rand((m, k), 60), _rand((n, k), 61)
    qa, sa = _fp8(x, 128)
    qb, sb = _fp8(w, 128)
    d = np.full((m, n + heads * mid), -1.0, BF16)
    dg.fp8_gemm_nt_skip_head_mid((qa, sa), (qb, sb), d, (left, mid, right), recipe=(1, 1, 128))
    full = np.zeros((m, n), BF16)
    dg.fp8_gemm_nt((qa, sa), (qb, sb), full, recipe=(1, 1, 128))
    width = left + mid + right
    for h in range(heads):
        assert np.array_equal(_codes(d[:, h * width:h * width + left]), _codes(full[:, h * 128:h * 128 + left]))
        assert np.all(d[:, h * width + left:h * width + left + mid] == -1.0)
        assert np.array_equal(_codes(d[:, h * width + left + mid:(h + 1) * width]), _codes(full[:, h * 128 + left:(h + 1) * 128]))


def test_cublaslt_rounds_c_once_and_aclnn_addmm():
    a, b = _bf16_pair([1.0, 2.0**-9], [1.0, 1.0])
    c = np.array([[2.0**-9]], BF16)
    d = np.zeros((1, 1), BF16)
    dg.bf16_gemm_nt(a, b, d, c=c)  # bf16(c + bf16(1 + 2^-9)) = bf16(2^-9 + 1) = 1
    assert float(d[0, 0]) == 1.0
    dg.cublaslt_gemm_nt(a, b, d, c=c)  # bf16(1 + 2^-9 + 2^-9) = 1 + 2^-8 -> tie -> 1.0? no: 1 + 2^-8 is a tie -> 1
    exact = ref.ref_epilogue(ref.F(1) + ref.F(2.0**-9), fm.BF16, c=float(c[0, 0]), c_mode="fused")
    assert _codes(d)[0, 0] == exact
    with dg.numerics(arch="ascend950"):
        cc = np.array([[0.5]], np.float32)
        d32 = np.zeros((1, 1), np.float32)
        dg.aclnn_bf16_gemm_nt(a, b, d32, c=cc)
        assert d32[0, 0] == 0.5 and cc[0, 0] == np.float32(1.5 + 2.0**-9)
        assert dg.cublaslt_gemm_nt is not dg.aclnn_bf16_gemm_nt  # distinct names, same implementation
