"""The numeric core's public contract: Operand, OutputStage, Accumulation, scaled_matmul,
exact_accumulator, dot_products; against exact rationals and slow float32 references."""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import deepgemm_ref as dg
from deepgemm_ref import core
from deepgemm_ref import formats as fm
from deepgemm_ref.profiles import PROFILES

from . import reference as ref

BF16 = ml_dtypes.bfloat16
E4M3 = ml_dtypes.float8_e4m3fn


def _codes(x):
    return np.ascontiguousarray(x).view({2: np.uint16, 4: np.uint32}[x.dtype.itemsize])


def _fp8(x, gran_k=128):
    return dg.per_token_cast_to_fp8(x, use_ue8m0=True, gran_k=gran_k)


def _rand(shape, seed, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def _fp8_operands(m, n, k, seed, gran=128):
    qa, sa = _fp8(_rand((m, k), seed), gran)
    qb, sb = _fp8(_rand((n, k), seed + 1), gran)
    return (core.Operand(qa, sa.astype(np.float64), gran), core.Operand(qb, sb.astype(np.float64), gran),
            ref.dequant(qa.view(np.uint8), sa, gran, fm.E4M3), ref.dequant(qb.view(np.uint8), sb, gran, fm.E4M3))


# ---------------------------------------------------------------------------------------------
# Operand
# ---------------------------------------------------------------------------------------------

def test_operand_rows_are_elements_times_their_block_scales():
    vals = np.arange(-20, 20, dtype=np.float32).reshape(4, 10).astype(E4M3)
    scales = np.exp2(np.arange(12).reshape(4, 3).astype(np.float64) - 6)
    op = core.Operand(vals, scales, 4)
    want = vals.astype(np.float64) * np.repeat(scales, 4, axis=1)[:, :10]
    assert np.array_equal(op.rows(0, 4), want)
    assert np.array_equal(op.rows(1, 3, scaled=False), vals[1:3].astype(np.float64))
    assert np.array_equal(op.take_rows(np.array([3, 0])), want[[3, 0]])
    assert np.array_equal(op.block_scales(0, 4, 2), np.repeat(scales, 2, axis=1)[:, :5])
    assert op.pow2_scales and op.fixed_quantum == -9 and op.shape == (4, 10)
    assert not core.Operand(vals, scales * 3, 4).pow2_scales
    codes = core.Operand(np.arange(16, dtype=np.uint8).reshape(2, 8), None, 0, codes_fmt=fm.E2M1)
    assert np.array_equal(codes.rows(0, 2), fm.decode(np.arange(16), fm.E2M1).reshape(2, 8))
    assert codes.fixed_quantum == -1 and core.Operand(vals.astype(BF16)).fixed_quantum is None


# ---------------------------------------------------------------------------------------------
# OutputStage: the vectorised epilogue against its rational specification
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("out", [fm.BF16, fm.F32])
@pytest.mark.parametrize("alpha", [None, 0.75, -3.0])
@pytest.mark.parametrize("c_mode", [None, "kernel", "fused", "rounded"])
def test_output_stage_apply_equals_apply_exact(out, alpha, c_mode):
    rng = np.random.default_rng(3)
    x = rng.standard_normal(400) * np.exp2(rng.integers(-30, 30, 400))
    c = None if c_mode is None else (rng.standard_normal((1, 400)) * 4).astype(out.storage).astype(np.float64)
    ep = core.OutputStage(out, alpha, c, c_mode or "kernel")
    got = ep.apply(x[None, :], 0, 1)[0]
    for j in range(0, 400, 3):
        want = ref.ref_epilogue(ref.F(float(x[j])), out, alpha, None if c is None else float(c[0, j]), c_mode or "kernel")
        assert int(got[j]) == want == int(ep.apply_exact(ref.F(float(x[j])), 0, j)), j
        assert int(ep.apply_points(x[j:j + 1], np.array([0]), np.array([j]))[0]) == want


def test_epilogue_alias_is_the_output_stage_with_a_warning():
    with pytest.warns(DeprecationWarning, match="OutputStage"):
        assert core.Epilogue is core.OutputStage
    with pytest.raises(AttributeError):
        core.NoSuchThing  # noqa: B018


# ---------------------------------------------------------------------------------------------
# scaled_matmul, exact model: every tier against rationals
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("out", [fm.BF16, fm.F32])
def test_exact_scaled_matmul_against_rationals(out):
    a, b, av, bv = _fp8_operands(7, 6, 384, 10)
    res = core.scaled_matmul(a, b, core.OutputStage(out), want_acc=True, want_S=True)
    assert np.array_equal(_codes(res.out), ref.ref_gemm(av, bv, out))
    for i in range(7):
        for j in range(6):
            exact = ref.exact_dot(av[i], bv[j])
            assert abs(ref.F(float(res.acc[i, j])) - exact) <= abs(exact) * ref.F(2) ** -52
            assert ref.F(float(res.S[i, j])) >= ref.exact_dot(np.abs(av[i]), np.abs(bv[j]))
    assert sum(res.stats.values()) == 7 * 6


def test_exact_tiers_decide_ties_and_cancellations():
    """bf16 ties with a tiny tie-breaker and large cancelling pairs: the GEMM bound cannot decide
    them; the pairwise, double-double and Fraction tiers must, and the result is exact."""
    k = 64
    a = np.zeros((6, k))
    b = np.zeros((5, k))
    a[:, 0], b[:, 0] = 1.0, 1.0 + 2.0**-8  # 1 + 2^-8: a bf16 midpoint
    a[:, 1], b[:, 1] = 2.0**60, 1.0  # cancelled by column 2
    a[:, 2], b[:, 2] = -(2.0**60), 1.0
    a[:, 3] = np.array([2.0**-70, -(2.0**-70), 0, 2.0**-140, -(2.0**-140), 0])  # tie-breakers
    b[:, 3] = 1.0
    A, B = core.Operand(a.astype(BF16)), core.Operand(b.astype(BF16))
    res = core.scaled_matmul(A, B, core.OutputStage(fm.BF16), want_acc=True)
    av, bv = a.astype(BF16).astype(np.float64), b.astype(BF16).astype(np.float64)
    assert np.array_equal(_codes(res.out), ref.ref_gemm(av, bv, fm.BF16))
    assert res.stats.get("exact", 0) + res.stats.get("bounded", 0) < 30  # the tiers did the work


def test_exact_scaled_matmul_non_power_of_two_scales_float32_output():
    rng = np.random.default_rng(4)
    qa = rng.standard_normal((5, 256)).clip(-448, 448).astype(E4M3)
    qb = rng.standard_normal((4, 256)).clip(-448, 448).astype(E4M3)
    sa = rng.uniform(0.5, 3.0, (5, 2)).astype(np.float32).astype(np.float64)
    sb = rng.uniform(0.5, 3.0, (4, 2)).astype(np.float32).astype(np.float64)
    res = core.scaled_matmul(core.Operand(qa, sa, 128), core.Operand(qb, sb, 128), core.OutputStage(fm.F32))
    want = ref.ref_gemm(ref.dequant(qa.view(np.uint8), sa, 128, fm.E4M3), ref.dequant(qb.view(np.uint8), sb, 128, fm.E4M3),
                        fm.F32)
    assert np.array_equal(_codes(res.out), want)


def test_empty_shapes():
    a = core.Operand(np.zeros((3, 0), BF16))
    b = core.Operand(np.zeros((2, 0), BF16))
    res = core.scaled_matmul(a, b, core.OutputStage(fm.F32), want_acc=True, want_S=True)
    assert res.out.shape == (3, 2) and not np.any(res.out) and not np.any(res.acc) and not np.any(res.S)
    res = core.scaled_matmul(core.Operand(np.zeros((0, 4), BF16)), core.Operand(np.zeros((2, 4), BF16)),
                             core.OutputStage(fm.BF16))
    assert res.out.shape == (0, 2) and res.acc is None


@given(st.integers(0, 2**31 - 1), st.integers(-30, 30), st.integers(0, 1))
def test_scaling_one_block_scales_its_contribution(seed, e, blk):
    """Multiplying one scale block by 2^e multiplies exactly that block's contribution."""
    m, n, k = 3, 4, 256
    a, b, av, bv = _fp8_operands(m, n, k, seed % 1000)
    sa2 = a.scales.copy()
    sa2[:, blk] *= 2.0**e
    out2 = _codes(core.scaled_matmul(core.Operand(a.values, sa2, 128), b, core.OutputStage(fm.F32)).out)
    in_blk = (np.arange(k) // 128) == blk
    for i in range(m):
        for j in range(n):
            acc = ref.exact_dot(av[i], bv[j])
            part = ref.exact_dot(av[i][in_blk], bv[j][in_blk])
            assert out2[i, j] == ref.ref_epilogue(acc + (ref.F(2) ** e - 1) * part, fm.F32)


def test_exact_accumulator_bounds_and_dot_products():
    a, b, av, bv = _fp8_operands(4, 5, 256, 20)
    acc = core.exact_accumulator(a, b, want_S=True)
    for i in range(4):
        for j in range(5):
            exact = ref.exact_dot(av[i], bv[j])
            assert abs(ref.F(float(acc.acc[i, j])) - exact) <= ref.F(float(acc.err[i, j]))
    assert acc.all_exact and not np.any(acc.err)  # FP8 x FP8 with UE8M0 scales at K = 256: exact
    prod = core.dot_products(a, b, core.Accumulation(), want_S=True)
    assert prod.exact and prod.err is None and np.array_equal(prod.values, acc.acc)
    assert np.array_equal(prod.S, acc.S)
    model = core.dot_products(a, b, core.Accumulation("fp32", 128), want_S=False)
    assert not model.exact and model.values.dtype == np.float32 and model.S is None
    ref32 = core.scaled_matmul(a, b, core.OutputStage(fm.F32), model="fp32", fp32_block=128)
    assert np.array_equal(model.values, ref32.out)


# ---------------------------------------------------------------------------------------------
# the core reads no global state
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ["sm90", "sm100", "ascend950"])
@pytest.mark.parametrize("accumulation", ["exact", "fp32"])
def test_results_depend_only_on_the_arguments(arch, accumulation):
    a, b, _, _ = _fp8_operands(5, 4, 256, 30, gran=32)
    ep = core.OutputStage(fm.F32)
    base = core.scaled_matmul(a, b, ep, model="fp32", fp32_block=32, mma_block_scaling=True, want_acc=True)
    exact = core.scaled_matmul(a, b, ep, want_acc=True)
    with dg.numerics(arch=arch, accumulation=accumulation):
        again = core.scaled_matmul(a, b, ep, model="fp32", fp32_block=32, mma_block_scaling=True, want_acc=True)
        default = core.scaled_matmul(a, b, ep, want_acc=True)  # the default model is exact, whatever is active
    assert again.out.tobytes() == base.out.tobytes() and np.array_equal(again.acc, base.acc)
    assert default.out.tobytes() == exact.out.tobytes()


# ---------------------------------------------------------------------------------------------
# the fp32 and limited models
# ---------------------------------------------------------------------------------------------

def test_fp32_model_within_bound_and_deterministic():
    a, b, _, _ = _fp8_operands(16, 24, 1024, 40)
    exact = core.scaled_matmul(a, b, core.OutputStage(fm.F32), model="exact", want_acc=True, want_S=True)
    r1 = core.scaled_matmul(a, b, core.OutputStage(fm.F32), model="fp32", fp32_block=128, want_acc=True)
    r2 = core.scaled_matmul(a, b, core.OutputStage(fm.F32), model="fp32", fp32_block=128, want_acc=True)
    assert np.array_equal(_codes(r1.out), _codes(r2.out))
    nb = 1024 // 128
    u = 2.0**-24
    n_ops = 2 * nb + 1  # block rounding, then per block one fused multiply-add
    bound = n_ops * u / (1 - n_ops * u) * exact.S
    assert np.all(np.abs(r1.acc - exact.acc) <= bound)
    assert np.mean(_codes(r1.out) != _codes(exact.out)) < 0.2  # mostly equal; differences are real rounding


def _fp32_promotion_reference(a: core.Operand, b: core.Operand, block: int) -> np.ndarray:
    """The fp32 model without MMA block scaling, step by step: per K block the exact block sum
    rounded to float32, times f32(f32(sa) * f32(sb)) in float32, added to a float32 accumulator."""
    k = a.shape[1]
    av, bv = a.rows(0, a.shape[0], scaled=False), b.rows(0, b.shape[0], scaled=False)
    sa = a.block_scales(0, a.shape[0], block).astype(np.float32)
    sb = b.block_scales(0, b.shape[0], block).astype(np.float32)
    out = np.zeros((a.shape[0], b.shape[0]), np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        for i in range(a.shape[0]):
            for j in range(b.shape[0]):
                acc = np.float32(0)
                for q in range(-(-k // block)):
                    ks = slice(q * block, (q + 1) * block)
                    part = np.float32(fm.decode_scalar(fm.encode_scalar(ref.exact_dot(av[i, ks], bv[j, ks]), fm.F32,
                                                                        fm.IEEE_RNE), fm.F32))
                    acc = np.float32(acc + np.float32(part * np.float32(sa[i, q] * sb[j, q])))
                out[i, j] = acc
    return out


def test_fp32_model_promotion_multiply_against_a_step_by_step_reference():
    """sm90's model (scales applied by a float32 promotion multiply), with scales near the ends
    of float32's range, overflow to inf and FP4 operands: bytes of a step-by-step float32
    reference.  (The core takes a faster path with pre-scaled operands where that gives the same
    bytes; the random exponent ranges put cases on both sides of that condition.)"""
    rng = np.random.default_rng(77)
    for _ in range(40):
        m, n, k = int(rng.integers(1, 5)), int(rng.integers(1, 5)), int(rng.integers(1, 200))
        blk = int(rng.choice([32, 128]))

        def operand(rows: int, k: int = k, blk: int = blk) -> core.Operand:
            if rng.random() < 0.5:
                v = rng.standard_normal((rows, k)) * np.exp2(rng.integers(-12, 9, (rows, k)))
                vals, codes = v.clip(-448, 448).astype(E4M3), None
            else:
                vals, codes = rng.integers(0, 16, (rows, k)).astype(np.uint8), fm.E2M1
            lo, hi = sorted(rng.integers(-127, 128, 2) if rng.random() < 0.5 else rng.integers(-20, 10, 2))
            return core.Operand(vals, np.exp2(rng.integers(lo, hi + 1, (rows, -(-k // blk)))), blk, codes)

        a, b = operand(m), operand(n)
        res = core.scaled_matmul(a, b, core.OutputStage(fm.F32), model="fp32", fp32_block=128, want_acc=True)
        want = _fp32_promotion_reference(a, b, blk)
        assert res.out.tobytes() == want.tobytes()
        assert np.array_equal(res.acc.astype(np.float32), want, equal_nan=True)


@pytest.mark.parametrize("arch", ["sm100", "ascend950"])
def test_fp32_model_with_mma_block_scaling_against_rationals(arch):
    """sm100 and ascend950 apply UE8M0 block scales inside the MMA: each block partial is
    RN_f32(exact block sum * 2^(ea + eb)), then added in float32 in K order.  Scale products far
    beyond float32's range (2^70 * 2^70 on a zero block, 2^-120 * 2^-120) stay finite and exact
    where a float32 scale product would give NaN or flush to zero."""
    rng = np.random.default_rng(5)
    k, blk = 96, 32
    vals_a = rng.standard_normal((3, k)).clip(-448, 448).astype(E4M3)
    vals_b = rng.standard_normal((2, k)).clip(-448, 448).astype(E4M3)
    vals_a[0, 32:64] = 0  # a zero block under a huge scale product
    ea = np.array([[70, 70, 0], [-120, -3, 5], [10, 127, -127]])
    eb = np.array([[70, 70, 1], [-120, 2, -9]])
    a = core.Operand(vals_a, np.exp2(ea.astype(np.float64)), blk)
    b = core.Operand(vals_b, np.exp2(eb.astype(np.float64)), blk)
    p = PROFILES[arch]
    res = core.scaled_matmul(a, b, core.OutputStage(fm.F32), model="fp32", fp32_block=p.fp32_block,
                             mma_block_scaling=p.mma_block_scaling, want_acc=True)
    fa, fb = vals_a.astype(np.float64), vals_b.astype(np.float64)
    for i in range(3):
        for j in range(2):
            acc = np.float32(0)
            for q in range(k // blk):
                ks = slice(q * blk, (q + 1) * blk)
                exact = ref.exact_dot(fa[i, ks], fb[j, ks]) * ref.F(2) ** int(ea[i, q] + eb[j, q])
                part = np.float32(fm.decode_scalar(fm.encode_scalar(exact, fm.F32, fm.IEEE_RNE), fm.F32))
                acc = np.float32(acc + part)
            assert np.float32(res.acc[i, j]).tobytes() == acc.tobytes(), (i, j)
    assert not np.isnan(res.acc).any()  # a float32 scale product inf times a zero block gave NaN


@pytest.mark.parametrize("blk", [32, 128])
def test_fp32_model_tiles_give_the_bytes_of_the_untiled_model(blk, monkeypatch):
    """The pre-scaled fp32 model runs in output tiles (sizes by block, edge tiles of any shape,
    a contiguous accumulator per tile, scratch buffers reused across calls): the same bytes as
    the block-by-block model on whole rows (``prescale=False``, the definition), for several tile
    sizes, with NaN / inf elements, zero blocks and scales that overflow the float32 sums."""
    rng = np.random.default_rng(blk)
    m, n, k = 37, 29, 3 * blk + blk // 2
    av = rng.standard_normal((m, k)) * np.exp2(rng.integers(-10, 9, (m, k)))
    bv = rng.standard_normal((n, k)) * np.exp2(rng.integers(-10, 9, (n, k)))
    av[3, 5], bv[4, 7], av[6, :blk] = np.nan, np.inf, 0.0
    ea = rng.integers(-20, 60, (m, -(-k // blk))).astype(np.float64)
    eb = rng.integers(-20, 60, (n, -(-k // blk))).astype(np.float64)
    a = core.Operand(av.clip(-448, 448).astype(E4M3), np.exp2(ea), blk)
    b = core.Operand(bv.clip(-448, 448).astype(E4M3), np.exp2(eb), blk)
    ep = core.OutputStage(fm.BF16)
    with np.errstate(all="ignore"):
        want = core._fp32_model(a, b, ep, blk, True, prescale=False)
        for tile, rows in ((1 << 16, 256), (64, 4), (100, 7), (1 << 10, 16)):
            monkeypatch.setattr(core, "_FP32_TILE", tile)
            monkeypatch.setattr(core, "_FP32_TILE_ROWS", rows)
            for want_acc in (True, False):
                got = core._fp32_model(a, b, ep, blk, True, want_acc=want_acc)
                assert got.out.tobytes() == want.out.tobytes()
                if want_acc:
                    assert got.acc.tobytes() == want.acc.tobytes()
                else:
                    assert got.acc is None


def test_scratch_memory_is_reused_and_never_shared():
    """The core keeps float64 scratch between calls: a later call of another shape gets the same
    bytes as with fresh memory, results never alias the scratch, and release_scratch frees it."""
    rng = np.random.default_rng(3)
    shapes = [(40, 300, 512), (30, 290, 300), (40, 300, 512)]  # float64 copies of b over 1 MiB (kept)
    ops = [(core.Operand(rng.standard_normal((m, k)).astype(BF16)), core.Operand(rng.standard_normal((n, k)).astype(BF16)))
           for m, n, k in shapes]
    ep = core.OutputStage(fm.F32)
    core.release_scratch()
    fresh = []
    for a, b in ops:
        fresh.append(core.scaled_matmul(a, b, ep, want_acc=True, want_S=True))
        core.release_scratch()
    kept = [core.scaled_matmul(a, b, ep, want_acc=True, want_S=True) for a, b in ops]
    assert core._scratch  # something was kept
    for f, g in zip(fresh, kept, strict=True):
        for x, y in ((f.out, g.out), (f.acc, g.acc), (f.acc_lo, g.acc_lo), (f.S, g.S)):
            assert x.tobytes() == y.tobytes()
            assert not any(np.shares_memory(x, buf) for buf in core._scratch)
    core.release_scratch()
    assert not core._scratch


def test_fp32_model_nan_in_one_row_leaves_the_others_alone():
    """MMA block scaling with a NaN element elsewhere: the other rows keep their exact scaled
    values (a float32 scale product 2^140 used to turn their zero blocks into NaN)."""
    k = 128
    a = np.zeros((2, k), np.float32)
    a[0, 0] = 2.0**-9
    a[1, 5] = np.nan
    b = np.zeros((1, k), np.float32)
    b[0, 0] = 2.0**-9
    A = core.Operand(a.astype(E4M3), np.full((2, k // 32), 2.0**70), 32)
    B = core.Operand(b.astype(E4M3), np.full((1, k // 32), 2.0**70), 32)
    res = core.scaled_matmul(A, B, core.OutputStage(fm.F32), model="fp32", fp32_block=32, mma_block_scaling=True)
    out = np.asarray(res.out, np.float32)
    assert out[0, 0] == np.float32(2.0**122) and np.isnan(out[1, 0])


def test_limited_model_loses_bits_and_is_deterministic():
    a, b, _, _ = _fp8_operands(8, 8, 512, 50)
    exact = core.scaled_matmul(a, b, core.OutputStage(fm.F32), model="exact", want_acc=True, want_S=True)
    lim = core.scaled_matmul(a, b, core.OutputStage(fm.F32), model=dg.Limited(13, 128), want_acc=True)
    lim2 = core.scaled_matmul(a, b, core.OutputStage(fm.F32), model=dg.Limited(13, 128), want_acc=True)
    wide = core.scaled_matmul(a, b, core.OutputStage(fm.F32), model=dg.Limited(40, 128), want_acc=True)
    assert np.array_equal(lim.acc, lim2.acc)
    err13 = np.abs(lim.acc - exact.acc) / exact.S
    err40 = np.abs(wide.acc - exact.acc) / exact.S
    assert err13.max() > 2.0**-16 and err13.max() < 2.0**-8
    assert err40.max() < 2.0**-20
    # truncation is biased toward zero for all-positive data
    pos = core.Operand(np.abs(a.values.astype(np.float32)).astype(E4M3), a.scales, 128)
    pex = core.scaled_matmul(pos, pos, core.OutputStage(fm.F32), model="exact", want_acc=True)
    plim = core.scaled_matmul(pos, pos, core.OutputStage(fm.F32), model=dg.Limited(13, 128), want_acc=True)
    assert np.all(plim.acc <= pex.acc)


def test_no_warnings_from_the_public_names():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        core.OutputStage(fm.BF16)
        core.Accumulation()


def test_bf16_decode_gives_the_bits_of_widening_the_top_half_of_a_float32():
    """Every bf16 code (NaN payloads, -0, subnormals, infinities) through the core's decode (issue
    30: ml_dtypes' cast) has the float64 bits of the previous path: the code shifted into the top
    half of a float32, widened."""
    codes = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).reshape(256, 256)
    out = np.empty((256, 256))
    with np.errstate(invalid="ignore"):
        core._decode_into(core.Operand(codes.view(ml_dtypes.bfloat16)), 0, 256, out)
        want = (codes.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    assert np.array_equal(out.view(np.uint64), want.view(np.uint64))


@pytest.mark.parametrize("fmt", [fm.E4M3, fm.E5M2, fm.E2M1])
def test_byte_decode_two_codes_at_a_time_gives_the_bits_of_one_at_a_time(fmt):
    """The pair table (two adjacent codes per lookup) against the 256-entry table, bit for bit
    (NaN payloads, -0, infinities, E2M1's ignored high nibble), for every pair of codes, and the
    odd-K / strided operands that keep the one-code path."""
    pairs = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).reshape(256, 256)
    codes = pairs.view(np.uint8).reshape(256, 512)  # rows of code pairs: every (lo, hi) once
    values = codes if fmt is fm.E2M1 else codes.view({fm.E4M3: E4M3, fm.E5M2: ml_dtypes.float8_e5m2}[fmt])
    op = core.Operand(values, None, 0, codes_fmt=fmt if fmt is fm.E2M1 else None)
    want = np.take(core._decode_table(fmt), codes)
    got = np.empty((256, 512))
    core._decode_into(op, 0, 256, got)
    assert np.array_equal(got.view(np.uint64), want.view(np.uint64))
    odd = core.Operand(values[:, :511], None, 0, codes_fmt=op.codes_fmt)  # odd K, strided rows
    got_odd = np.empty((256, 511))
    core._decode_into(odd, 0, 256, got_odd)
    assert np.array_equal(got_odd.view(np.uint64), want[:, :511].view(np.uint64))


@pytest.mark.parametrize("fmt", [fm.E4M3, fm.E5M2, fm.E2M1])
def test_norm_bounds_from_the_scales_bound_every_finite_row(fmt):
    """|row|_2 of the scaled finite values <= the bound from the scales alone, with the largest
    magnitudes everywhere (the bound's worst case), random codes and partial last blocks."""
    rng = np.random.default_rng(5)
    k, blk = 200, 32  # 7 blocks, the last one of 8 elements
    table = core._decode_table(fmt)
    finite = np.flatnonzero(np.isfinite(table[:16] if fmt is fm.E2M1 else table))
    top = finite[np.argmax(np.abs(table[finite]))]
    codes = rng.choice(finite, (6, k)).astype(np.uint8)
    codes[0] = top
    scales = np.exp2(rng.integers(-40, 40, (6, -(-k // blk)))).astype(np.float64)
    values = codes if fmt is fm.E2M1 else codes.view({fm.E4M3: E4M3, fm.E5M2: ml_dtypes.float8_e5m2}[fmt])
    op = core.Operand(values, scales, blk, codes_fmt=fmt if fmt is fm.E2M1 else None)
    bound = core._scale_norm_bounds(op, 0, 6)
    for i in range(6):
        exact = sum(ref.F(float(v)) ** 2 for v in op.rows(i, i + 1)[0])
        assert ref.F(float(bound[i])) ** 2 >= exact
    # the all-largest row is within a few ulps of its bound: the bound is not loose by construction
    assert float(bound[0]) <= np.sqrt(np.sum(op.rows(0, 1) ** 2)) * 1.5
    assert core._scale_norm_bounds(core.Operand(rng.standard_normal((2, 8)).astype(BF16)), 0, 2) is None


@pytest.mark.parametrize("nan_row", [None, 3])
def test_exactness_from_the_scales_gives_the_codes_of_the_norm_pass(nan_row, monkeypatch):
    """FP8 with UE8M0 scales: the certificate from the scales alone (no norm pass) and the one
    from the values' norms give the same bytes (codes, accumulator, S) and the same finiteness,
    NaN rows included; with scales too far apart the scales' bound does not certify and the
    values' norms are used."""
    a, b, _, _ = _fp8_operands(40, 24, 256, 21)
    if nan_row is not None:
        vals = a.values.copy()
        vals.view(np.uint8)[nan_row, 17] = 0x7F  # E4M3 NaN
        a = core.Operand(vals, a.scales, a.block)
    assert core._exact_by_scales(a, b, core._Quanta(a), core._Quanta(b)) is not None
    out = core.OutputStage(fm.BF16)
    fast = core.scaled_matmul(a, b, out, want_acc=True, want_S=True)
    fast_acc = core.exact_accumulator(a, b)
    monkeypatch.setattr(core, "_exact_by_scales", lambda *args: None)
    slow = core.scaled_matmul(a, b, out, want_acc=True, want_S=True)
    slow_acc = core.exact_accumulator(a, b)
    for x, y in ((fast.out, slow.out), (fast.acc, slow.acc), (fast.S, slow.S), (fast_acc.acc, slow_acc.acc),
                 (fast_acc.err, slow_acc.err), (fast_acc.finite, slow_acc.finite)):
        assert np.array_equal(np.ascontiguousarray(x).view(np.uint8), np.ascontiguousarray(y).view(np.uint8))
    assert fast_acc.all_exact == slow_acc.all_exact == (nan_row is None)
    wide = core.Operand(a.values, a.scales * np.exp2(np.arange(2)[None, :] * 30), a.block)
    assert core._exact_by_scales(wide, b, core._Quanta(wide), core._Quanta(b)) is None


# ---------------------------------------------------------------------------------------------
# The thread pool's chunks
# ---------------------------------------------------------------------------------------------

@pytest.fixture
def blas_count():
    """The BLAS's thread count, put back after the test."""
    from deepgemm_ref import _parallel

    lib = _parallel._openblas()
    before = int(lib[1]()) if lib is not None else None
    yield before
    if before is not None:
        _parallel.limit_blas_threads(before)


@pytest.mark.parametrize("blas_threads", [1, 2])
def test_parallel_chunks_run_every_chunk_once_on_the_pool_and_raise_the_first_error(monkeypatch, blas_threads,
                                                                                   blas_count):
    """One task per thread takes chunks from a shared counter: every chunk runs exactly once, on
    a pool thread (nested calls inline), and the error of the lowest failing chunk is raised after
    every task stopped.  Three threads are more than the BLAS runs here: the package's pool."""
    import threading

    from deepgemm_ref import _parallel

    _parallel.limit_blas_threads(blas_threads)
    monkeypatch.setenv("DEEPGEMM_REF_NUM_THREADS", "3")
    seen: list[tuple[int, int]] = []
    lock = threading.Lock()
    main = threading.get_ident()
    nested: list[bool] = []

    def fn(t0: int, t1: int) -> None:
        assert threading.get_ident() != main
        inner: list[int] = []
        _parallel.parallel_chunks(4, 1, lambda u0, u1: inner.append(threading.get_ident()))
        with lock:
            seen.append((t0, t1))
            nested.append(set(inner) == {threading.get_ident()})

    _parallel.parallel_chunks(103, 10, fn)
    assert sorted(seen) == [(i, min(103, i + 10)) for i in range(0, 103, 10)] and all(nested)

    started: list[int] = []

    def failing(t0: int, t1: int) -> None:
        with lock:
            started.append(t0)
        if t0 in (30, 50):
            raise ValueError(f"chunk {t0}")

    with pytest.raises(ValueError, match="chunk 30"):
        _parallel.parallel_chunks(1000, 10, failing)
    assert len(started) < 100  # no chunk starts once one has failed (at most one per thread after it)
    monkeypatch.setenv("DEEPGEMM_REF_NUM_THREADS", "1")
    order: list[int] = []
    _parallel.parallel_chunks(5, 2, lambda t0, t1: order.append(t0))
    assert order == [0, 2, 4]


def _on_blas_threads_available() -> bool:
    from deepgemm_ref import _parallel

    if _parallel._pthread is None:
        _parallel._pthread = _parallel._find_pthread()
    return bool(_parallel._pthread)


def test_parallel_chunks_on_openblas_threads_where_the_blas_runs_two(monkeypatch, blas_count):
    """With the BLAS at two threads, two tasks run at once on this thread and an OpenBLAS worker
    (not a pool thread), every BLAS call inside single-threaded; the count is put back, errors
    are raised in chunk order, nested calls run inline, a second caller meanwhile takes the pool,
    and with the BLAS at one thread the pool runs them."""
    import threading

    from deepgemm_ref import _parallel

    if not _on_blas_threads_available():
        pytest.skip("no pthreads OpenBLAS with gotoblas_pthread in this process")
    get = _parallel._openblas()[1]
    monkeypatch.setenv("DEEPGEMM_REF_NUM_THREADS", "2")
    _parallel.limit_blas_threads(2)
    main = threading.get_ident()
    meet = threading.Barrier(2, timeout=30)  # both tasks at once, or BrokenBarrierError (never a hang)
    seen: list[tuple[int, str, int, bool]] = []
    lock = threading.Lock()

    def fn(t0: int, t1: int) -> None:
        meet.wait()
        inner: list[int] = []
        _parallel.parallel_chunks(3, 1, lambda u0, u1: inner.append(threading.get_ident()))
        x = np.ones((64, 64)) @ np.ones((64, 64))
        with lock:
            seen.append((threading.get_ident(), threading.current_thread().name, int(get()),
                         set(inner) == {threading.get_ident()} and bool(np.all(x == 64.0))))

    _parallel.parallel_chunks(2, 1, fn)
    assert len(seen) == 2 and len({s[0] for s in seen}) == 2 and main in {s[0] for s in seen}
    assert not any(name.startswith("deepgemm_ref") for _, name, _, _ in seen)  # no pool thread
    assert all(count == 1 and ok for _, _, count, ok in seen)
    assert int(get()) == 2

    def failing(t0: int, t1: int) -> None:
        if t0 in (3, 5):
            raise ValueError(f"chunk {t0}")

    with pytest.raises(ValueError, match="chunk 3"):
        _parallel.parallel_chunks(8, 1, failing)
    assert int(get()) == 2

    # two callers at once: one region on the BLAS's threads, the other on the pool
    names: dict[int, set[str]] = {0: set(), 1: set()}
    gate = threading.Barrier(2, timeout=30)

    def caller(c: int) -> None:
        def chunk(t0: int, t1: int) -> None:
            if t0 == 0:
                gate.wait()  # the two callers' regions overlap
            with lock:
                names[c].add(threading.current_thread().name)
        _parallel.parallel_chunks(2, 1, chunk)

    threads = [threading.Thread(target=caller, args=(c,)) for c in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert sum(any(n.startswith("deepgemm_ref") for n in names[c]) for c in range(2)) >= 1
    assert int(get()) == 2

    _parallel.limit_blas_threads(1)
    pool_names: list[str] = []
    _parallel.parallel_chunks(2, 1, lambda t0, t1: pool_names.append(threading.current_thread().name))
    assert pool_names and all(n.startswith("deepgemm_ref") for n in pool_names)


@pytest.mark.parametrize("blas_threads", [1, 2])
def test_parallel_chunks_tasks_take_the_callers_numpy_error_state(monkeypatch, blas_threads, blas_count):
    """NumPy's error state is per thread: every task (on the pool or OpenBLAS's threads) runs
    under the caller's, so an ``np.errstate`` around a call covers its chunks."""
    import warnings

    from deepgemm_ref import _parallel

    _parallel.limit_blas_threads(blas_threads)
    monkeypatch.setenv("DEEPGEMM_REF_NUM_THREADS", "2")
    inf = np.full(4, np.inf)

    def chunk(t0: int, t1: int) -> None:
        inf[t0:t1] - inf[t0:t1]  # invalid: inf - inf

    with np.errstate(invalid="raise"), pytest.raises(FloatingPointError):
        _parallel.parallel_chunks(4, 1, chunk)
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("error")
        _parallel.parallel_chunks(4, 1, chunk)
