"""Grouped GEMMs: exact rationals, relations to the dense kernels, layouts, padding policy, bad input."""

from __future__ import annotations

import inspect
import warnings

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import deepgemm_ref as dg
from deepgemm_ref import formats as fm
from deepgemm_ref import grouped as G
from deepgemm_ref import trace
from deepgemm_ref.errors import DGArgumentError

from . import reference as ref
from .ordered import assert_ordered_close

BF16 = ml_dtypes.bfloat16
E4M3 = ml_dtypes.float8_e4m3fn
OUT = {np.dtype(BF16): fm.BF16, np.dtype(np.float32): fm.F32}
ARCHS = ["sm90", "sm100", "ascend950"]
FEW = settings(max_examples=20, deadline=None)


def _codes(x):
    return np.ascontiguousarray(x).view({1: np.uint8, 2: np.uint16, 4: np.uint32}[x.dtype.itemsize])


def _rand(shape, seed, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def _align(x, a):
    return -(-x // a) * a


def _layout(sizes, alignment):
    """Hand-built layouts for group row counts: (m_indices (M,), psum ends (G,), M)."""
    aligned = [_align(s, alignment) for s in sizes]
    m = sum(aligned)
    mi = np.full(m, -1, np.int32)
    ends, start = [], 0
    for g, (s, a) in enumerate(zip(sizes, aligned, strict=True)):
        mi[start:start + s] = g
        ends.append(start + s)
        start += a
    return mi, np.array(ends, np.int32), m


def _ranges(ends, alignment):
    out, prev = [], 0
    for g, e in enumerate(ends.tolist()):
        s = _align(prev, alignment) if g else 0
        out.append((s, e))
        prev = e
    return out


def _alignment(arch):
    return 256 if arch == "ascend950" else 128


# ---------------------------------------------------------------------------------------------
# operands per profile (quantised with the library's casts; expected values use ref.dequant)
# ---------------------------------------------------------------------------------------------

def _quant(arch, x, w, fp4_b=False):
    """x (M, K), w (G, N, K) float32 -> (a pair, b pair, recipe kwargs, a values, b values)."""
    g, n, k = w.shape
    if arch == "sm90":
        qa, sa = dg.per_token_cast_to_fp8(x, use_ue8m0=False)
        qb = np.empty(w.shape, E4M3)
        sb = np.empty((g, _align(n, 128) // 128, k // 128), np.float32)
        for i in range(g):
            qb[i], sb[i] = dg.per_block_cast_to_fp8(w[i], use_ue8m0=False)
        a_vals = ref.dequant(qa.view(np.uint8), sa, 128, fm.E4M3)
        blocks = np.repeat(np.repeat(sb.astype(np.float64), 128, 1), 128, 2)[:, :n, :k]
        b_vals = fm.decode(qb.view(np.uint8), fm.E4M3) * blocks
        return (qa, sa), (qb, sb), {}, a_vals, b_vals
    gk = 32 if arch == "ascend950" else 128
    qa, sa = dg.per_token_cast_to_fp8(x, use_ue8m0=True, gran_k=gk)
    a_vals = ref.dequant(qa.view(np.uint8), sa, gk, fm.E4M3)
    if fp4_b:
        qb = np.empty((g, n, k // 2), np.int8)
        sb = np.empty((g, n, k // 32), np.float32)
        for i in range(g):
            qb[i], sb[i] = dg.per_token_cast_to_fp4(w[i], use_ue8m0=True, gran_k=32)
        b_vals = np.stack([ref.dequant(fm.unpack_fp4(qb[i]), sb[i], 32, fm.E2M1) for i in range(g)])
        kw = {} if arch == "ascend950" else {"recipe_a": (1, gk), "recipe_b": (1, 32)}
        return (qa, sa), (qb, sb), kw, a_vals, b_vals
    qb = np.empty(w.shape, E4M3)
    sb = np.empty((g, n, k // gk), np.float32)
    for i in range(g):
        qb[i], sb[i] = dg.per_token_cast_to_fp8(w[i], use_ue8m0=True, gran_k=gk)
    b_vals = np.stack([ref.dequant(qb[i].view(np.uint8), sb[i], gk, fm.E4M3) for i in range(g)])
    kw = {} if arch == "ascend950" else {"recipe": (1, 1, 128)}
    return (qa, sa), (qb, sb), kw, a_vals, b_vals


# ---------------------------------------------------------------------------------------------
# names and signatures
# ---------------------------------------------------------------------------------------------



def test_aliases_share_the_implementations_and_name_themselves():
    # (issue 29: DeepGEMM registers one object under both names; here an alias shares the
    # implementations, so an argument error names the function the caller called)
    pairs = [(G.m_grouped_fp8_gemm_nt_contiguous, G.m_grouped_fp8_fp4_gemm_nt_contiguous),
             (G.m_grouped_fp8_gemm_nn_contiguous, G.m_grouped_fp8_fp4_gemm_nn_contiguous),
             (G.m_grouped_fp8_gemm_nt_masked, G.m_grouped_fp8_fp4_gemm_nt_masked),
             (G.fp8_m_grouped_gemm_nt_masked, G.m_grouped_fp8_fp4_gemm_nt_masked),
             (G.bf16_m_grouped_gemm_nt_masked, G.m_grouped_bf16_gemm_nt_masked)]
    for alias, target in pairs:
        assert alias._impls == target._impls and alias.__name__ != target.__name__
        assert str(inspect.signature(alias)) == str(inspect.signature(target))


def test_profile_matrix():
    z = np.zeros((1, 1, 1), BF16)
    with dg.numerics(arch="ascend950"):
        for f in (G.m_grouped_bf16_gemm_nt_masked, G.m_grouped_fp8_fp4_gemm_nt_masked):
            with pytest.raises(DGArgumentError, match="not provided by DeepGEMM-Ascend"):
                f(z, z, z, np.ones(1, np.int32), 1)
    a = np.zeros((128, 8), E4M3)
    sf = np.ones((1, 8), np.float32)
    d = np.zeros((1, 8, 8), np.float32)
    with dg.numerics(arch="sm90"), pytest.raises(DGArgumentError, match="sm100-only"):
        G.k_grouped_fp8_gemm_tn_contiguous((a, sf), (a, sf), d, [128], np.array([128], np.int32), c=d)
    with pytest.raises(DGArgumentError, match="sm90-only"):
        G.k_grouped_fp8_gemm_nt_contiguous((a, sf), (a, sf), d, [128], np.array([128], np.int32), c=d,
                                           recipe=(1, 1, 128))


# ---------------------------------------------------------------------------------------------
# exact rational results on small cases
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch,fp4_b,psum", [("sm100", False, False), ("sm100", True, True), ("sm90", False, False),
                                             ("sm90", False, True), ("ascend950", False, True), ("ascend950", True, True)])
def test_m_grouped_fp8_exact(arch, fp4_b, psum):
    with dg.numerics(arch=arch):
        sizes = [5, 0, 3]
        mi, ends, m = _layout(sizes, _alignment(arch))
        n, k = 6, 256
        x, w = _rand((m, k), 1), _rand((3, n, k), 2)
        a, b, kw, av, bv = _quant(arch, x, w, fp4_b)
        d = np.full((m, n), 3.0, BF16)
        G.m_grouped_fp8_fp4_gemm_nt_contiguous(a, b, d, ends if psum else mi, use_psum_layout=psum, **kw)
        for g, s in enumerate(sizes):
            rows = np.flatnonzero(mi == g)
            if s:
                assert np.array_equal(_codes(d[rows]), ref.ref_gemm(av[rows], bv[g], fm.BF16)), g
        assert np.all(_codes(d[mi < 0]) == 0)  # every padding row here is in a stored block


def test_m_grouped_bf16_ascend_alpha_float32_exact():
    with dg.numerics(arch="ascend950"):
        sizes = [3, 4]
        mi, ends, m = _layout(sizes, 256)
        x, w = _rand((m, 40), 3).astype(BF16), _rand((2, 5, 40), 4).astype(BF16)
        d = np.full((m, 5), 9.0, np.float32)
        G.m_grouped_bf16_gemm_nt_contiguous(x, w, d, ends, epilogue=dg.epilogue.Alpha(0.3))
        for g in range(2):
            rows = np.flatnonzero(mi == g)
            expect = ref.ref_gemm(x[rows].astype(np.float64), w[g].astype(np.float64), fm.F32, alpha=0.3)
            assert np.array_equal(_codes(d[rows]), expect)
        assert np.all(d[mi < 0] == 0)


def test_masked_bf16_and_fp8_exact():
    g, max_m, n, k = 3, 7, 5, 128
    mm = np.array([7, 0, 2], np.int32)
    x, w = _rand((g, max_m, k), 5).astype(BF16), _rand((g, n, k), 6).astype(BF16)
    d = np.full((g, max_m, n), -2.0, BF16)
    G.m_grouped_bf16_gemm_nt_masked(x, w, d, mm, 4)
    qa = np.empty((g, max_m, k), E4M3)
    sa = np.empty((g, max_m, 1), np.float32)
    qb = np.empty((g, n, k), E4M3)
    sb = np.empty((g, n, 1), np.float32)
    for i in range(g):
        qa[i], sa[i] = dg.per_token_cast_to_fp8(x[i].astype(np.float32), use_ue8m0=True)
        qb[i], sb[i] = dg.per_token_cast_to_fp8(w[i].astype(np.float32), use_ue8m0=True)
    d8 = np.full((g, max_m, n), -2.0, BF16)
    G.fp8_m_grouped_gemm_nt_masked((qa, sa), (qb, sb), d8, mm, 4, recipe=(1, 1, 128))
    for i in range(g):
        r = int(mm[i])
        assert np.array_equal(_codes(d[i, :r]), ref.ref_gemm(x[i, :r].astype(np.float64), w[i].astype(np.float64), fm.BF16))
        av = ref.dequant(qa[i, :r].view(np.uint8), sa[i, :r], 128, fm.E4M3)
        bv = ref.dequant(qb[i].view(np.uint8), sb[i], 128, fm.E4M3)
        assert np.array_equal(_codes(d8[i, :r]), ref.ref_gemm(av, bv, fm.BF16))
        assert np.all(d[i, r:] == -2.0) and np.all(d8[i, r:] == -2.0)  # untouched past masked_m


def _k_cast(x, ks, ends, gran_k):
    """DeepGEMM's k_grouped_per_channel_cast_to_fp8: each group cast on its zero-padded rows."""
    q = np.zeros(x.shape, E4M3)
    sfs = []
    for kk, e in zip(ks, ends, strict=True):
        if kk == 0:
            continue
        xg = np.zeros((_align(kk, gran_k), x.shape[1]), np.float32)
        xg[:kk] = x[e - kk:e]
        qq, ss = dg.per_channel_cast_to_fp8(xg, use_ue8m0=True, gran_k=gran_k)
        q[e - kk:e] = qq[:kk]
        sfs.append(ss)
    return q, (np.concatenate(sfs) if sfs else np.zeros((0, x.shape[1]), np.float32))


def _k_vals(q, sf, ks, ends, gran_k):
    """Per group (MN, k_g) dequantised values of a k-grouped operand (scales per group, compact)."""
    out, row = [], 0
    for kk, e in zip(ks, ends, strict=True):
        if kk == 0:
            out.append(None)
            continue
        nrow = -(-kk // gran_k)
        vals = fm.decode(q[e - kk:e].view(np.uint8), fm.E4M3) * np.repeat(sf[row:row + nrow].astype(np.float64), gran_k, 0)[:kk]
        out.append(vals.T)
        row += nrow
    return out


@pytest.mark.parametrize("out_dtype", [np.float32, BF16])
@pytest.mark.parametrize("psum,gran_k", [(False, 128), (True, 32), (True, 128)])
def test_k_grouped_fp8_sm100_exact(out_dtype, psum, gran_k):
    m, n = 8, 12  # DeepGEMM's k-grouped SF packer needs MN % 4 == 0
    real = [96, 0, 160]
    if psum:
        ends, prev = [], 0
        for kk in real:
            ends.append(_align(prev, 128) + kk)
            prev = ends[-1]
        total = _align(ends[-1], 128)
        ks_cpu = [_align(kk, 128) for kk in real]
        real_ks = real
    else:
        real_ks = [128, 0, 256]
        ends = list(np.cumsum(real_ks))
        total, ks_cpu = sum(real_ks), real_ks
    x, y = np.zeros((total, m), np.float32), np.zeros((total, n), np.float32)
    for g, (kk, e) in enumerate(zip(real_ks, ends, strict=True)):
        x[e - kk:e], y[e - kk:e] = _rand((kk, m), 10 + g), _rand((kk, n), 20 + g)
    qa, sa = _k_cast(x, real_ks, ends, gran_k)
    qb, sb = _k_cast(y, real_ks, ends, gran_k)
    c = _rand((3, m, n), 30).astype(out_dtype)
    c[1, 0, 0] = -0.0  # an empty group keeps c bit for bit
    d = c.copy()
    layout = np.array(ends if psum else ks_cpu, np.int32)
    G.k_grouped_fp8_gemm_tn_contiguous((qa, sa), (qb, sb), d, ks_cpu, layout, c=d, recipe=(1, 1, gran_k),
                                       use_psum_layout=psum)
    av, bv = _k_vals(qa, sa, real_ks, ends, gran_k), _k_vals(qb, sb, real_ks, ends, gran_k)
    for g in range(3):
        if av[g] is None:
            assert np.array_equal(_codes(d[g]), _codes(c[g]))
        else:
            assert np.array_equal(_codes(d[g]), ref.ref_gemm(av[g], bv[g], OUT[np.dtype(out_dtype)], c=c[g]))


def test_k_grouped_fp8_sm90_flat_nt_exact():
    m, n, ks = 3, 4, [128, 256]
    with dg.numerics(arch="sm90"):
        xs = [_rand((m, kk), 40 + i, 3.0) for i, kk in enumerate(ks)]
        ys = [_rand((n, kk), 50 + i, 0.1) for i, kk in enumerate(ks)]
        parts = [dg.per_token_cast_to_fp8(v, use_ue8m0=False) for v in xs]
        partsb = [dg.per_token_cast_to_fp8(v, use_ue8m0=False) for v in ys]
        flat_a = np.concatenate([p[0].reshape(-1) for p in parts])
        flat_b = np.concatenate([p[0].reshape(-1) for p in partsb])
        sfa = np.ascontiguousarray(np.concatenate([p[1] for p in parts], axis=1).T).T  # transposed storage
        sfb = np.concatenate([p[1] for p in partsb], axis=1)
        c = _rand((2, m, n), 60)
        d = c.copy()
        G.k_grouped_fp8_gemm_nt_contiguous((flat_a, sfa), (flat_b, sfb), d, ks, np.array(ks, np.int32), c=d)
        for g in range(2):
            av = ref.dequant(parts[g][0].view(np.uint8), parts[g][1], 128, fm.E4M3)
            bv = ref.dequant(partsb[g][0].view(np.uint8), partsb[g][1], 128, fm.E4M3)
            assert np.array_equal(_codes(d[g]), ref.ref_gemm(av, bv, fm.F32, c=c[g]))


@pytest.mark.parametrize("fp8", [True, False])
def test_k_grouped_ascend_exact_with_alpha(fp8):
    m, n = 4, 6
    ends = [100, 100, 400]  # group 1 is empty (ends equal), group 2 starts at 256
    ranges = [(0, 100), (100, 100), (256, 400)]
    total = 512
    x, y = _rand((total, m), 70), _rand((total, n), 71)  # gap rows hold data the kernels never read
    c = _rand((3, m, n), 72)
    d = c.copy()
    with dg.numerics(arch="ascend950"):
        if fp8:
            qa, sa = dg.per_token_cast_to_fp8(np.ascontiguousarray(x.T), use_ue8m0=True, gran_k=32)
            qb, sb = dg.per_token_cast_to_fp8(np.ascontiguousarray(y.T), use_ue8m0=True, gran_k=32)
            sa_bad = sa.copy()
            sa_bad[:, 4] = 0.75  # K block [128, 160) lies in the gap [100, 256): never read, never checked
            G.k_grouped_fp8_gemm_tn_contiguous((np.ascontiguousarray(qa.T), sa_bad.T), (np.ascontiguousarray(qb.T), sb.T),
                                               d, None, np.array(ends, np.int32), c=d, epilogue=dg.epilogue.Alpha(-1.5))
            av = ref.dequant(qa.view(np.uint8), sa, 32, fm.E4M3)
            bv = ref.dequant(qb.view(np.uint8), sb, 32, fm.E4M3)
        else:
            xb, yb = x.astype(BF16), y.astype(BF16)
            G.k_grouped_bf16_gemm_tn_contiguous(xb, yb, d, [100, 0, 144], np.array(ends, np.int32), c=d,
                                                epilogue=dg.epilogue.Alpha(-1.5))
            av, bv = xb.T.astype(np.float64), yb.T.astype(np.float64)
    for g, (k0, k1) in enumerate(ranges):
        if k1 == k0:
            assert np.array_equal(_codes(d[g]), _codes(c[g]))
        else:
            assert np.array_equal(_codes(d[g]), ref.ref_gemm(av[:, k0:k1], bv[:, k0:k1], fm.F32, alpha=-1.5, c=c[g]))


# ---------------------------------------------------------------------------------------------
# properties: grouped == loop of dense calls; padding cannot leak; layouts agree
# ---------------------------------------------------------------------------------------------

sizes_st = st.lists(st.integers(0, 140), min_size=1, max_size=4)


@FEW
@given(sizes_st, st.integers(0, 2**31 - 1), st.sampled_from(ARCHS), st.booleans(), st.booleans())
def test_m_grouped_equals_dense_loop(sizes, seed, arch, use_fp8, nn):
    n, k = 24, 256
    with dg.numerics(arch=arch):
        mi, ends, m = _layout(sizes, _alignment(arch))
        psum = arch == "ascend950" or seed % 2 == 0
        layout = ends if psum else mi
        x, w = _rand((m, k), seed), _rand((len(sizes), n, k), seed + 1)
        out = np.float32 if arch == "ascend950" and seed % 3 == 0 else BF16
        d = np.full((m, n), 5.0, out)
        if use_fp8:
            a, b, kw, _, _ = _quant(arch, x, w)
            if nn:
                bt = (np.swapaxes(b[0], 1, 2), np.swapaxes(b[1], 1, 2))
                G.m_grouped_fp8_fp4_gemm_nn_contiguous(a, bt, d, layout, use_psum_layout=psum, **kw)
            else:
                G.m_grouped_fp8_fp4_gemm_nt_contiguous(a, b, d, layout, use_psum_layout=psum, **kw)
        else:
            a, b = x.astype(BF16), w.astype(BF16)
            if nn:
                G.m_grouped_bf16_gemm_nn_contiguous(a, np.swapaxes(b, 1, 2), d, layout, use_psum_layout=psum)
            else:
                G.m_grouped_bf16_gemm_nt_contiguous(a, b, d, layout, use_psum_layout=psum)
        for g, s in enumerate(sizes):
            rows = np.flatnonzero(mi == g)
            if not s:
                continue
            dense = np.zeros((s, n), out)
            if use_fp8:
                dg.fp8_fp4_gemm_nt((a[0][rows], a[1][rows]), (b[0][g], b[1][g]), dense, **kw)
            else:
                dg.bf16_gemm_nt(a[rows], b[g], dense)
            assert np.array_equal(_codes(d[rows]), _codes(dense)), (g, s)


@FEW
@given(sizes_st, st.integers(0, 2**31 - 1), st.sampled_from(ARCHS))
def test_padding_rows_cannot_change_defined_outputs(sizes, seed, arch):
    """-1 rows and psum gaps: random A data there (and garbage SFA in psum gaps) changes nothing."""
    n, k = 16, 128
    rng = np.random.default_rng(seed)
    with dg.numerics(arch=arch):
        mi, ends, m = _layout(sizes, _alignment(arch))
        psum = arch == "ascend950" or seed % 2 == 0
        x, w = _rand((m, k), seed), _rand((len(sizes), n, k), seed + 1)
        x[mi < 0] = 0.0
        a, b, kw, _, _ = _quant(arch, x, w)
        pad = mi < 0
        qa2 = a[0].copy()
        qa2[pad] = rng.integers(0, 0x7E, (int(pad.sum()), k)).astype(np.uint8).view(E4M3)
        sa2 = a[1].copy()
        if psum:
            sa2[pad] = np.float32(np.nan) if seed % 3 else np.float32(0.3)  # unread, unchecked
        else:
            sa2[pad] = np.float32(2.0) ** rng.integers(-10, 10, (int(pad.sum()), 1))
        layout = ends if psum else mi
        d1 = np.full((m, n), 7.0, BF16)
        d2 = np.full((m, n), 7.0, BF16)
        with trace.capture() as cap:
            G.m_grouped_fp8_fp4_gemm_nt_contiguous(a, b, d1, layout, use_psum_layout=psum, **kw)
        G.m_grouped_fp8_fp4_gemm_nt_contiguous((qa2, sa2), b, d2, layout, use_psum_layout=psum, **kw)
        defined = cap.last.defined
        assert defined.shape == (m, n) and np.array_equal(defined[:, 0], mi >= 0)
        assert np.array_equal(_codes(d1)[mi >= 0], _codes(d2)[mi >= 0])
        assert np.all(_codes(d2[pad]) == 0)  # every pad row here lies in a stored block: the policy zeroes it


@FEW
@given(sizes_st, st.integers(0, 2**31 - 1), st.sampled_from(["sm90", "sm100"]), st.booleans())
def test_m_indices_and_psum_layouts_agree(sizes, seed, arch, use_fp8):
    n, k = 8, 128
    with dg.numerics(arch=arch):
        mi, ends, m = _layout(sizes, 128)
        x, w = _rand((m, k), seed), _rand((len(sizes), n, k), seed + 1)
        x[mi < 0] = 0.0
        d1 = np.full((m, n), 1.0, BF16)
        d2 = np.full((m, n), 1.0, BF16)
        if use_fp8:
            a, b, kw, _, _ = _quant(arch, x, w)
            G.m_grouped_fp8_gemm_nt_contiguous(a, b, d1, mi, **kw)
            G.m_grouped_fp8_gemm_nt_contiguous(a, b, d2, ends, use_psum_layout=True, **kw)
        else:
            G.m_grouped_bf16_gemm_nt_contiguous(x.astype(BF16), w.astype(BF16), d1, mi)
            G.m_grouped_bf16_gemm_nt_contiguous(x.astype(BF16), w.astype(BF16), d2, ends, use_psum_layout=True)
        assert np.array_equal(_codes(d1), _codes(d2))  # zero padding in both (ensure_zero_padding=True)


@FEW
@given(st.lists(st.integers(0, 9), min_size=1, max_size=4), st.integers(0, 2**31 - 1), st.booleans())
def test_masked_equals_dense_loop_and_leaves_the_rest(masked, seed, use_fp8):
    g, max_m, n, k = len(masked), 9, 16, 128
    mm = np.array(masked, np.int32)
    rng = np.random.default_rng(seed)
    x, w = _rand((g, max_m, k), seed), _rand((g, n, k), seed + 1)
    sentinel = np.asarray(rng.standard_normal((g, max_m, n)), np.float32).astype(BF16)
    d = sentinel.copy()
    if use_fp8:
        qa = np.empty((g, max_m, k), E4M3)
        sa = np.empty((g, max_m, 1), np.float32)
        qb = np.empty((g, n, k), E4M3)
        sb = np.empty((g, n, 1), np.float32)
        for i in range(g):
            qa[i], sa[i] = dg.per_token_cast_to_fp8(x[i], use_ue8m0=True)
            qb[i], sb[i] = dg.per_token_cast_to_fp8(w[i], use_ue8m0=True)
        G.m_grouped_fp8_gemm_nt_masked((qa, sa), (qb, sb), d, mm, max_m, recipe=(1, 1, 128))
    else:
        G.bf16_m_grouped_gemm_nt_masked(x.astype(BF16), w.astype(BF16), d, mm, max_m)
    for i in range(g):
        r = int(mm[i])
        dense = np.zeros((r, n), BF16)
        if use_fp8:
            dg.fp8_gemm_nt((qa[i, :r], sa[i, :r]), (qb[i], sb[i]), dense, recipe=(1, 1, 128))
        else:
            dg.bf16_gemm_nt(x[i, :r].astype(BF16), w[i].astype(BF16), dense)
        assert np.array_equal(_codes(d[i, :r]), _codes(dense))
        assert np.array_equal(_codes(d[i, r:]), _codes(sentinel[i, r:]))


@FEW
@given(st.lists(st.integers(0, 3), min_size=1, max_size=3), st.integers(0, 2**31 - 1), st.booleans())
def test_k_grouped_equals_sum_over_groups_plus_c(blocks, seed, out_f32):
    """d[g] == the dense GEMM of group g's K rows accumulating onto c[g] (same epilogue)."""
    m, n, gran_k = 8, 4, 128
    ks = [128 * b for b in blocks]
    ends = list(np.cumsum(ks))
    total = sum(ks)
    x, y = _rand((total, m), seed), _rand((total, n), seed + 1)
    qa, sa = _k_cast(x, ks, ends, gran_k)
    qb, sb = _k_cast(y, ks, ends, gran_k)
    out = np.float32 if out_f32 else BF16
    c = _rand((len(ks), m, n), seed + 2).astype(out)
    d = c.copy()
    G.k_grouped_fp8_gemm_tn_contiguous((qa, sa), (qb, sb), d, ks, np.array(ks, np.int32), c=c)
    row = 0
    for g, (kk, e) in enumerate(zip(ks, ends, strict=True)):
        dense = c[g].copy()
        if kk:
            nrow = kk // gran_k
            dg.fp8_gemm_nt((qa[e - kk:e].T, sa[row:row + nrow].T), (qb[e - kk:e].T, sb[row:row + nrow].T), dense,
                           c=dense, recipe=(1, 1, gran_k))
            row += nrow
        assert np.array_equal(_codes(d[g]), _codes(dense))
    # the bf16 version against bf16_gemm_tn group by group
    xb, yb = x.astype(BF16), y.astype(BF16)
    d2 = c.copy()
    G.k_grouped_bf16_gemm_tn_contiguous(xb, yb, d2, ks, np.array(ks, np.int32), c=d2)
    for g, (kk, e) in enumerate(zip(ks, ends, strict=True)):
        dense = c[g].copy()
        if kk:
            dg.bf16_gemm_tn(xb[e - kk:e], yb[e - kk:e], dense, c=dense)
        assert np.array_equal(_codes(d2[g]), _codes(dense))


# ---------------------------------------------------------------------------------------------
# the padding policy, target by target
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch,zero_pad,gap_zeroed", [("sm100", True, True), ("sm100", False, False),
                                                     ("sm90", False, True), ("ascend950", False, True)])
def test_psum_gap_policy(arch, zero_pad, gap_zeroed):
    al = _alignment(arch)
    with dg.numerics(arch=arch):
        mi, ends, m = _layout([3, 5], al)
        m_total = m + 40  # rows after the last group's aligned end are never written
        x, w = _rand((m_total, 64), 1).astype(BF16), _rand((2, 8, 64), 2).astype(BF16)
        d = np.full((m_total, 8), 4.0, BF16)
        with trace.capture(want_acc=True, want_S=True) as cap:
            G.m_grouped_bf16_gemm_nt_contiguous(x, w, d, ends, use_psum_layout=True, ensure_zero_padding=zero_pad)
        gap = np.zeros(m_total, bool)
        gap[:m] = mi < 0
        assert np.all(d[gap] == 0) if gap_zeroed else np.all(d[gap] == 4.0)
        assert np.all(d[m:] == 4.0)
        rec = cap.last
        defined = np.zeros(m_total, bool)
        defined[:m] = mi >= 0
        assert np.array_equal(rec.defined[:, 0], defined) and rec.defined.all(axis=1).sum() == 8
        assert rec.acc.shape == d.shape and np.all(rec.acc[~defined] == 0) and np.all(rec.S[defined] > 0)


def test_ascend_k_zero_clears_d_and_cuda_needs_k():
    with dg.numerics(arch="ascend950"):
        d = np.full((256, 4), 3.0, np.float32)
        G.m_grouped_bf16_gemm_nt_contiguous(np.zeros((256, 0), BF16), np.zeros((1, 4, 0), BF16), d,
                                            np.array([10], np.int32))
        assert not d.any()
    d = np.full((128, 4), 3.0, BF16)
    with pytest.raises(DGArgumentError, match="K > 0"):
        G.m_grouped_bf16_gemm_nt_contiguous(np.zeros((128, 0), BF16), np.zeros((1, 4, 0), BF16), d,
                                            np.zeros(128, np.int32))
    assert np.all(d == 3.0)


@pytest.mark.parametrize("fp8", [False, True])
def test_ascend_k_grouped_all_groups_empty_copies_c(fp8):
    """SUM_K = 0: no layout to check on the (0, M) operands; d := c (spec: early return)."""
    m, n = 4, 8
    if fp8:
        a = (np.zeros((0, m), E4M3), np.zeros((0, m), np.int16))
        b = (np.zeros((0, n), E4M3), np.zeros((0, n), np.int16))
        fn = G.k_grouped_fp8_gemm_tn_contiguous
    else:
        a, b, fn = np.zeros((0, m), BF16), np.zeros((0, n), BF16), G.k_grouped_bf16_gemm_tn_contiguous
    c = np.arange(2 * m * n, dtype=np.float32).reshape(2, m, n)
    d = np.full((2, m, n), 7.0, np.float32)
    with dg.numerics(arch="ascend950"):
        fn(a, b, d, [0, 0], np.array([0, 0], np.int32), c=c)
    assert d.tobytes() == c.tobytes()


def test_ascend_empty_group_after_unaligned_end():
    with dg.numerics(arch="ascend950"):
        x, w = _rand((512, 32), 3).astype(BF16), _rand((3, 4, 32), 4).astype(BF16)
        d = np.full((512, 4), 2.0, BF16)
        G.m_grouped_bf16_gemm_nt_contiguous(x, w, d, np.array([100, 100, 300], np.int32))
        dense = np.zeros((44, 4), BF16)
        dg.bf16_gemm_nt(x[256:300], w[2], dense)
        assert np.array_equal(_codes(d[256:300]), _codes(dense))
        assert np.all(d[100:256] == 0) and np.all(d[300:] == 0)
        with pytest.raises(DGArgumentError, match="end"):  # 100 < 200 < 256: neither a group nor empty
            G.m_grouped_bf16_gemm_nt_contiguous(x, w, d, np.array([100, 200, 300], np.int32))


def test_masked_to_psum_with_uninitialised_gaps():
    """DeepGEMM's masked-to-psum test: A and SFA gap rows are garbage; the psum call must not look at them."""
    g, max_m, n, k = 3, 40, 16, 256
    with dg.numerics(arch="sm100"):
        dg.set_mk_alignment_for_contiguous_layout(dg.get_theoretical_mk_alignment_for_contiguous_layout(24))
        al = dg.get_mk_alignment_for_contiguous_layout()
        masked = [17, 31, 5]
        x, w = _rand((g, max_m, k), 5), _rand((g, n, k), 6)
        qa = np.empty((g, max_m, k), E4M3)
        sa = np.empty((g, max_m, 2), np.float32)
        qb = np.empty((g, n, k), E4M3)
        sb = np.empty((g, n, 2), np.float32)
        for i in range(g):
            qa[i], sa[i] = dg.per_token_cast_to_fp8(x[i], use_ue8m0=True)
            qb[i], sb[i] = dg.per_token_cast_to_fp8(w[i], use_ue8m0=True)
        ends, last = [], 0
        for mm in masked:
            ends.append(_align(last, al) + mm if ends else mm)
            last = ends[-1]
        rows = g * max_m
        qa_p = np.frombuffer(np.random.default_rng(7).bytes(rows * k), np.uint8).reshape(rows, k).copy().view(E4M3)
        sa_p = np.full((rows, 2), np.nan, np.float32)
        d_p = np.full((rows, n), 9.0, BF16)
        for i, (s, e) in enumerate(_ranges(np.array(ends), al)):
            qa_p[s:e], sa_p[s:e] = qa[i, :masked[i]], sa[i, :masked[i]]
        G.m_grouped_fp8_fp4_gemm_nt_contiguous((qa_p, sa_p), (qb, sb), d_p, np.array(ends, np.int32),
                                               use_psum_layout=True, recipe=(1, 1, 128), expected_m_for_psum_layout=28)
        d_m = np.zeros((g, max_m, n), BF16)
        G.m_grouped_fp8_fp4_gemm_nt_masked((qa, np.where(np.arange(max_m)[None, :, None] < np.array(masked)[:, None, None],
                                                         sa, np.float32(1.0))),
                                           (qb, sb), d_m, np.array(masked, np.int32), 28, recipe=(1, 1, 128))
        for i, (s, e) in enumerate(_ranges(np.array(ends), al)):
            assert np.array_equal(_codes(d_p[s:e]), _codes(d_m[i, :masked[i]]))


# ---------------------------------------------------------------------------------------------
# DeepGEMM-style checks: calc_diff against the unquantised product, inputs made like its generators
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("psum", [False, True])
@pytest.mark.parametrize("fp4_b", [False, True])
def test_deepgemm_style_m_grouped_contiguous(psum, fp4_b):
    """generate_m_grouped_contiguous (scaled down): sm100, theoretical alignment, UE8M0, padding zeroed."""
    rng = np.random.default_rng(0)
    groups, expected_m, n, k = 4, 64, 256, 512
    dg.set_mk_alignment_for_contiguous_layout(dg.get_theoretical_mk_alignment_for_contiguous_layout())
    al = dg.get_mk_alignment_for_contiguous_layout()
    actual = [int(expected_m * rng.uniform(0.7, 1.3)) for _ in range(groups)]
    mi, ends, m = _layout(actual, al)
    a = rng.standard_normal((m, k)).astype(np.float32).astype(BF16)
    b = rng.standard_normal((groups, n, k)).astype(np.float32).astype(BF16)
    a[mi < 0] = 0
    ref_d = np.zeros((m, n))
    for g in range(groups):
        ref_d[mi == g] = a[mi == g].astype(np.float64) @ b[g].astype(np.float64).T
    qa = dg.per_token_cast_to_fp8(a, use_ue8m0=True)
    if fp4_b:
        qb = (np.empty((groups, n, k // 2), np.int8), np.empty((groups, n, k // 32), np.float32))
        for g in range(groups):
            qb[0][g], qb[1][g] = dg.per_token_cast_to_fp4(b[g], use_ue8m0=True, gran_k=32)
        kw, threshold = {"recipe_a": (1, 128), "recipe_b": (1, 32)}, 0.01
    else:
        qb = (np.empty((groups, n, k), E4M3), np.empty((groups, n // 128, k // 128), np.float32))
        for g in range(groups):
            qb[0][g], qb[1][g] = dg.per_block_cast_to_fp8(b[g], use_ue8m0=True)
        kw, threshold = {}, 0.001
    d = np.empty((m, n), BF16)
    dg_d = d if not psum else np.full((m, n), np.nan, BF16)
    G.m_grouped_fp8_fp4_gemm_nt_contiguous(qa, qb, dg_d, ends if psum else mi, use_psum_layout=psum, **kw)
    if psum:
        for s, e in _ranges(ends, al):
            assert dg.testing.calc_diff(dg_d[s:e], ref_d[s:e]) < threshold
        assert np.all(dg_d[mi < 0] == 0)  # check_fp8_fp4_psum_zero_padding
    else:
        assert dg.testing.calc_diff(dg_d, ref_d) < threshold
    db = np.empty((m, n), BF16)
    G.m_grouped_bf16_gemm_nt_contiguous(a, b, db, ends if psum else mi, use_psum_layout=psum)
    assert dg.testing.calc_diff(db[mi >= 0], ref_d[mi >= 0]) < 1e-5


def test_deepgemm_style_masked_and_k_grouped():
    rng = np.random.default_rng(1)
    groups, max_m, expected_m, n, k = 4, 64, 20, 128, 256
    a = rng.standard_normal((groups, max_m, k)).astype(np.float32).astype(BF16)
    b = rng.standard_normal((groups, n, k)).astype(np.float32).astype(BF16)
    ref_d = np.einsum("gmk,gnk->gmn", a.astype(np.float64), b.astype(np.float64))
    mm = np.array([int(expected_m * rng.uniform(0.7, 1.3)) for _ in range(groups)], np.int32)
    qa = (np.empty((groups, max_m, k), E4M3), np.empty((groups, max_m, 2), np.float32))
    qb = (np.empty((groups, n, k), E4M3), np.empty((groups, 1, 2), np.float32))
    for g in range(groups):
        qa[0][g], qa[1][g] = dg.per_token_cast_to_fp8(a[g], use_ue8m0=True)
        qb[0][g], qb[1][g] = dg.per_block_cast_to_fp8(b[g], use_ue8m0=True)
        qa[1][g, mm[g]:] = 0  # the test zeroes SFA rows beyond masked_m
    d = np.empty((groups, max_m, n), BF16)
    G.m_grouped_fp8_fp4_gemm_nt_masked(qa, qb, d, mm, int(expected_m * 1.2))
    for g in range(groups):
        assert dg.testing.calc_diff(d[g, :mm[g]], ref_d[g, :mm[g]]) < 0.001
    # k-grouped, psum with a non-aligned first group (generate_k_grouped_contiguous_psum)
    m2, n2, k_al, gran_k = 64, 96, 128, 128
    real = [int(256 * rng.uniform(0.7, 1.3)) for _ in range(3)]
    real[0] -= 37
    ends, prev = [], 0
    for kk in real:
        ends.append(_align(prev, k_al) + kk)
        prev = ends[-1]
    total = _align(ends[-1], k_al)
    x = np.zeros((total, m2), np.float32)
    y = np.zeros((total, n2), np.float32)
    c = rng.standard_normal((3, m2, n2)).astype(np.float32) * 32
    ref_k = c.astype(np.float64).copy()
    for g, (kk, e) in enumerate(zip(real, ends, strict=True)):
        x[e - kk:e] = rng.standard_normal((kk, m2)).astype(np.float32).astype(BF16)
        y[e - kk:e] = rng.standard_normal((kk, n2)).astype(np.float32).astype(BF16)
        ref_k[g] += x[e - kk:e].T.astype(np.float64) @ y[e - kk:e].astype(np.float64)
    qx, qy = _k_cast(x, real, ends, gran_k), _k_cast(y, real, ends, gran_k)
    for ks_cpu in ([_align(kk, k_al) for kk in real], None, []):
        d = c.copy()
        G.k_grouped_fp8_gemm_tn_contiguous(qx, qy, d, ks_cpu, np.array(ends, np.int32), c=d, use_psum_layout=True)
        assert dg.testing.calc_diff(d, ref_k) < 0.001
        d2 = c.copy()
        G.k_grouped_bf16_gemm_tn_contiguous(x.astype(BF16), y.astype(BF16), d2, ks_cpu, np.array(ends, np.int32),
                                            c=d2, use_psum_layout=True)
        assert dg.testing.calc_diff(d2, ref_k) < 1e-5


# ---------------------------------------------------------------------------------------------
# bad input: the argument error comes before d is touched
# ---------------------------------------------------------------------------------------------

def _case_m_grouped():
    mi, ends, m = _layout([5, 3], 128)
    x, w = _rand((m, 128), 1).astype(BF16), _rand((2, 8, 128), 2).astype(BF16)
    return mi, ends, m, x, w


def _bad_m_grouped():
    mi, ends, m, x, w = _case_m_grouped()
    misaligned = mi.copy()
    misaligned[:130] = 0  # group 0 spills into the second block, which belongs to group 1
    holes = mi.copy()
    holes[2] = -1  # a -1 row before the block's last group row
    return [
        ("misaligned", lambda d: G.m_grouped_bf16_gemm_nt_contiguous(x, w, d, misaligned)),
        ("hole", lambda d: G.m_grouped_bf16_gemm_nt_contiguous(x, w, d, holes)),
        ("id out of range", lambda d: G.m_grouped_bf16_gemm_nt_contiguous(x, w, d, np.where(mi == 1, 2, mi).astype(np.int32))),
        ("id below -1", lambda d: G.m_grouped_bf16_gemm_nt_contiguous(x, w, d, np.where(mi < 0, -2, mi).astype(np.int32))),
        ("int64 layout", lambda d: G.m_grouped_bf16_gemm_nt_contiguous(x, w, d, mi.astype(np.int64))),
        ("short layout", lambda d: G.m_grouped_bf16_gemm_nt_contiguous(x, w, d, mi[:-1])),
        ("ends decreasing", lambda d: G.m_grouped_bf16_gemm_nt_contiguous(x, w, d, np.array([5, 3], np.int32),
                                                                          use_psum_layout=True)),
        ("end inside gap", lambda d: G.m_grouped_bf16_gemm_nt_contiguous(x, w, d, np.array([5, 100], np.int32),
                                                                         use_psum_layout=True)),
        ("end past M", lambda d: G.m_grouped_bf16_gemm_nt_contiguous(x, w, d, np.array([5, m + 1], np.int32),
                                                                     use_psum_layout=True)),
        ("expected_m without psum", lambda d: G.m_grouped_bf16_gemm_nt_contiguous(x, w, d, mi,
                                                                                  expected_m_for_psum_layout=4)),
        ("d dtype", lambda d: G.m_grouped_bf16_gemm_nt_contiguous(x, w, d.view(np.int16), mi)),
        ("b K", lambda d: G.m_grouped_bf16_gemm_nt_contiguous(x, w[:, :, :64], d, mi)),
    ]


@pytest.mark.parametrize("name", [n for n, _ in _bad_m_grouped()])
def test_bad_m_grouped_input_leaves_d_untouched(name):
    call = dict(_bad_m_grouped())[name]
    d = np.full((256, 8), 3.0, BF16)
    before = d.copy()
    with pytest.raises(DGArgumentError, match="m_grouped_bf16_gemm_nt_contiguous"):
        call(d)
    assert np.array_equal(_codes(d), _codes(before))


def test_bad_fp8_and_masked_and_k_grouped_input_leaves_outputs_untouched():
    mi, ends, m, x, w = _case_m_grouped()
    a, b, kw, _, _ = _quant("sm100", x.astype(np.float32), w.astype(np.float32))
    d = np.full((m, 8), 3.0, BF16)
    bad_sf = (a[0], a[1] * np.float32(1.5))
    calls = [
        lambda: G.m_grouped_fp8_fp4_gemm_nt_contiguous(bad_sf, b, d, mi, **kw),  # not a power of two
        lambda: G.m_grouped_fp8_fp4_gemm_nt_contiguous(a, b, d, mi, recipe=(1, 1, 64)),
        lambda: G.m_grouped_fp8_fp4_gemm_nt_contiguous(a, (b[0], b[1][:1]), d, mi, **kw),
    ]
    with dg.numerics(arch="sm90"):
        a9, b9, _, _, _ = _quant("sm90", x.astype(np.float32), w.astype(np.float32))
        calls.append(lambda: G.m_grouped_fp8_fp4_gemm_nt_contiguous(a9, (b9[0], np.ones((2, 8, 1), np.float32)), d, mi,
                                                                    recipe=(1, 1, 128)))
        calls.append(lambda: G.m_grouped_fp8_fp4_gemm_nt_contiguous(a9, b9, d, np.pad(mi, (0, 0)), recipe=(1, 128, 128),
                                                                    use_psum_layout=3))
    for i, call in enumerate(calls):
        before = d.copy()
        arch = "sm90" if i >= 3 else "sm100"
        with dg.numerics(arch=arch), pytest.raises(DGArgumentError, match="m_grouped_fp8_fp4_gemm_nt_contiguous"):
            call()
        assert np.array_equal(_codes(d), _codes(before)), i
    # masked
    xm, wm = _rand((2, 4, 64), 3).astype(BF16), _rand((2, 8, 64), 4).astype(BF16)
    dm = np.full((2, 4, 8), 3.0, BF16)
    for mm, expected in ((np.array([5, 1], np.int32), 4), (np.array([-1, 1], np.int32), 4),
                         (np.array([1, 1], np.int64), 4), (np.array([1, 1], np.int32), 0), (np.array([1], np.int32), 4)):
        before = dm.copy()
        with pytest.raises(DGArgumentError, match="m_grouped_bf16_gemm_nt_masked"):
            G.m_grouped_bf16_gemm_nt_masked(xm, wm, dm, mm, expected)
        assert np.array_equal(_codes(dm), _codes(before))
    # k-grouped
    xk, yk = _rand((256, 4), 5).astype(BF16), _rand((256, 6), 6).astype(BF16)
    c = _rand((2, 4, 6), 7)
    dk = c.copy()
    kcalls = [
        lambda: G.k_grouped_bf16_gemm_tn_contiguous(xk, yk, dk, [128, 128], np.array([128, 128], np.int32)),  # no c
        lambda: G.k_grouped_bf16_gemm_tn_contiguous(xk, yk, dk, [128, 64], np.array([128, 64], np.int32), c=dk),
        lambda: G.k_grouped_bf16_gemm_tn_contiguous(xk, yk, dk, [128, 128], np.array([256, 0], np.int32), c=dk),
        lambda: G.k_grouped_bf16_gemm_tn_contiguous(xk, yk, dk, [128], np.array([128, 128], np.int32), c=dk),
        lambda: G.k_grouped_bf16_gemm_tn_contiguous(xk, yk, dk, None, np.array([128, 128], np.int32), c=dk),
        lambda: G.k_grouped_bf16_gemm_tn_contiguous(xk, yk, dk, [128, 256], np.array([100, 200], np.int32), c=dk,
                                                    use_psum_layout=True),  # ks_cpu != aligned sizes
        lambda: G.k_grouped_bf16_gemm_tn_contiguous(xk, yk, dk, None, np.array([100, 120], np.int32), c=dk,
                                                    use_psum_layout=True),  # end before the aligned start
        lambda: G.k_grouped_bf16_gemm_tn_contiguous(xk, yk, dk, None, np.array([100, 300], np.int32), c=dk,
                                                    use_psum_layout=True),  # end past SUM_K
        lambda: G.k_grouped_bf16_gemm_tn_contiguous(xk, yk, dk, [128, 128], np.array([128, 128], np.int32),
                                                    c=c.astype(BF16)),  # c dtype
    ]
    for i, call in enumerate(kcalls):
        before = dk.copy()
        with pytest.raises(DGArgumentError, match="k_grouped_bf16_gemm_tn_contiguous"):
            call()
        assert np.array_equal(dk, before), i


def test_bad_ascend_input():
    with dg.numerics(arch="ascend950"):
        x, w = _rand((256, 64), 1).astype(BF16), _rand((1, 8, 64), 2).astype(BF16)
        d = np.full((256, 8), 3.0, BF16)
        before = d.copy()
        for kwargs, match in (({"use_psum_layout": False}, "psum"), ({"epilogue": dg.epilogue.FP8Quantization(d)}, "Alpha")):
            with pytest.raises(DGArgumentError, match=match):
                G.m_grouped_bf16_gemm_nt_contiguous(x, w, d, np.array([10], np.int32), **kwargs)
        with pytest.raises(DGArgumentError, match="padded end"):  # the 256-row block would run past d
            G.m_grouped_bf16_gemm_nt_contiguous(x[:200], w, d[:200], np.array([10], np.int32))
        assert np.array_equal(_codes(d), _codes(before))
        c = _rand((1, 8, 8), 3)
        dk = c.copy()
        with pytest.raises(DGArgumentError, match="ks_cpu"):
            G.k_grouped_bf16_gemm_tn_contiguous(x[:, :8], x[:, :8], dk, [100], np.array([64], np.int32), c=dk)
        assert np.array_equal(dk, c)


def test_ascend_k_grouped_nt_is_a_deprecated_transposing_wrapper():
    m, n, k = 4, 6, 256
    x, y = _rand((k, m), 1), _rand((k, n), 2)
    c = _rand((1, m, n), 3)
    with dg.numerics(arch="ascend950"):
        qa, sa = dg.per_token_cast_to_fp8(np.ascontiguousarray(x.T), use_ue8m0=True, gran_k=32)
        qb, sb = dg.per_token_cast_to_fp8(np.ascontiguousarray(y.T), use_ue8m0=True, gran_k=32)
        a_tn, b_tn = (np.ascontiguousarray(qa.T), np.ascontiguousarray(sa.T)), (np.ascontiguousarray(qb.T), sb.T)
        d1, d2 = c.copy(), c.copy()
        G.k_grouped_fp8_gemm_tn_contiguous(a_tn, b_tn, d1, None, np.array([k], np.int32), c=d1)
        with pytest.warns(DeprecationWarning, match="k_grouped_fp8_gemm_tn_contiguous"):
            G.k_grouped_fp8_gemm_nt_contiguous((a_tn[0].T, a_tn[1].T), (b_tn[0].T, b_tn[1].T), d2, None,
                                               np.array([k], np.int32), c=d2)
        assert np.array_equal(d1, d2)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            with pytest.raises(DGArgumentError, match="row-major"):  # a K-major (M, K) a is (K, M) column-major
                G.k_grouped_fp8_gemm_nt_contiguous((qa, sa), (qb, sb), d2, None, np.array([k], np.int32), c=d2)


def test_torch_tensors_in_place():
    torch = pytest.importorskip("torch")
    mi, ends, m, x, w = _case_m_grouped()
    xt = torch.from_numpy(x.view(np.int16)).view(torch.bfloat16)
    wt = torch.from_numpy(w.view(np.int16)).view(torch.bfloat16)
    dt = torch.full((m, 8), 3.0, dtype=torch.bfloat16)
    G.m_grouped_bf16_gemm_nt_contiguous(xt, wt, dt, torch.from_numpy(ends), use_psum_layout=True)
    d = np.full((m, 8), 3.0, BF16)
    G.m_grouped_bf16_gemm_nt_contiguous(x, w, d, ends, use_psum_layout=True)
    assert np.array_equal(dt.view(torch.int16).numpy(), _codes(d).view(np.int16))


@pytest.mark.parametrize("model", ["fp32", "limited(13, 128)"])
def test_active_accumulation_model_is_used(model):
    """Under a non-exact model the grouped call still equals the dense loop, and differs from exact."""
    sizes = [130, 60]
    with dg.numerics(arch="ascend950"):
        mi, ends, m = _layout(sizes, 256)
        x, w = _rand((m, 512), 11), _rand((2, 16, 512), 12)
        a, b, _, _, _ = _quant("ascend950", x, w)
        d_exact = np.zeros((m, 16), np.float32)
        G.m_grouped_fp8_fp4_gemm_nt_contiguous(a, b, d_exact, ends)
        with dg.numerics(accumulation=model):
            d = np.zeros((m, 16), np.float32)
            with trace.capture(want_acc=True) as cap:
                G.m_grouped_fp8_fp4_gemm_nt_contiguous(a, b, d, ends)
            assert any(key.startswith(model.split("(")[0]) for key in cap.last.stats)
            for g, s in enumerate(sizes):
                rows = np.flatnonzero(mi == g)
                dense = np.zeros((s, 16), np.float32)
                dg.fp8_fp4_gemm_nt((a[0][rows], a[1][rows]), (b[0][g], b[1][g]), dense)
                assert np.array_equal(_codes(d[rows]), _codes(dense))
    assert not np.array_equal(_codes(d), _codes(d_exact))


def test_fp4_masked_and_k_grouped_trace_shapes():
    g, max_m, n, k = 2, 5, 8, 64
    x, w = _rand((g, max_m, k), 13), _rand((g, n, k), 14)
    qa = np.empty((g, max_m, k), E4M3)
    sa = np.empty((g, max_m, 1), np.float32)
    pb = np.empty((g, n, k // 2), np.int8)
    sb = np.empty((g, n, 2), np.float32)
    for i in range(g):
        qa[i], sa[i] = dg.per_token_cast_to_fp8(x[i], use_ue8m0=True)
        pb[i], sb[i] = dg.per_token_cast_to_fp4(w[i], use_ue8m0=True, gran_k=32)
    d = np.full((g, max_m, n), 2.0, BF16)
    mm = np.array([3, 5], np.int32)
    with trace.capture(want_acc=True, want_S=True) as cap:
        G.m_grouped_fp8_fp4_gemm_nt_masked((qa, sa), (pb, sb), d, mm, 4, recipe_a=(1, 128), recipe_b=(1, 32))
    rec = cap.last
    assert rec.acc.shape == rec.S.shape == rec.defined.shape == d.shape
    assert rec.defined[0, :3].all() and not rec.defined[0, 3:].any() and rec.defined[1].all()
    for i in range(g):
        r = int(mm[i])
        av = ref.dequant(qa[i, :r].view(np.uint8), sa[i, :r], 128, fm.E4M3)
        bv = ref.dequant(fm.unpack_fp4(pb[i]), sb[i], 32, fm.E2M1)
        assert np.array_equal(_codes(d[i, :r]), ref.ref_gemm(av, bv, fm.BF16))
        assert rec.acc[i, 0, 0] == float(ref.exact_dot(av[0], bv[0]))
    assert np.all(d[0, 3:] == 2.0)


def test_masked_d_with_gapped_groups_is_rejected():
    """DeepGEMM's major check of a 3-D D asserts stride(0) == M * N: a d sliced out of a wider
    buffer (groups not back to back) is the argument error, and is left untouched."""
    g, m, n, k = 2, 128, 256, 256
    a = np.ones((g, m, k), BF16)
    b = np.ones((g, n, k), BF16)
    wide = np.full((g, m, n + 64), 3.0, BF16)
    d = wide[:, :, :n]
    with pytest.raises(DGArgumentError, match="stride"):
        G.m_grouped_bf16_gemm_nt_masked(a, b, d, np.array([50, 70], np.int32), 64)
    assert np.all(wide == 3.0)


# ---------------------------------------------------------------------------------------------
# runs in column pieces on the pool (issue 30): the same bytes as one task per run, in order
# ---------------------------------------------------------------------------------------------

def _grouped_call(arch, a, b, ends, fp8_kw=None):
    """d, and the trace's acc, S, stats and task labels of one psum-layout m-grouped call (bf16
    out), and d of the same call without a trace (a captured call runs its tasks one after the
    other; an uncaptured one on the pool)."""
    m = a[0].shape[0] if fp8_kw is not None else a.shape[0]

    def call():
        d = np.full((m, (b[0] if fp8_kw is not None else b).shape[1]), 3.0, BF16)
        if fp8_kw is not None:
            G.m_grouped_fp8_fp4_gemm_nt_contiguous(a, b, d, ends, use_psum_layout=True, **fp8_kw)
        else:
            G.m_grouped_bf16_gemm_nt_contiguous(a, b, d, ends, use_psum_layout=True)
        return _codes(d)

    with dg.numerics(arch=arch):
        with trace.capture(want_acc=True, want_S=True) as cap:
            d = call()
        free = call()
    assert np.array_equal(d, free)
    rec = cap.last
    return d, rec.acc, rec.S, rec.stats, rec.tasks


def _same(x, y, k, tiers_decided=False):
    """d and the stats the same bytes; S (and acc, unless the exact tiers decided every element:
    then the same bytes) within the documented bounds of the BLAS's summation order, which for
    some kernels depends on the GEMM's shape (docs/numerics.md, tests/ordered.py)."""
    assert np.array_equal(x[0], y[0])  # d
    assert x[3] == y[3]  # stats
    if tiers_decided:
        assert np.array_equal(x[1].view(np.uint64), y[1].view(np.uint64))  # acc
        assert_ordered_close(x[2], y[2], k)
    else:
        assert_ordered_close(x[2], y[2], k, x[1], y[1])


def _unsplit(monkeypatch, threads):
    from deepgemm_ref.grouped import contiguous

    monkeypatch.setattr(contiguous, "_column_pieces", lambda a, b: [(0, b.shape[0])])
    monkeypatch.setenv("DEEPGEMM_REF_NUM_THREADS", threads)


@pytest.mark.parametrize("fill", ["cancel", "random"])
def test_m_grouped_column_pieces_keep_the_bytes_on_adversarial_inputs(monkeypatch, fill):
    """Small pieces (thresholds lowered): every element needs an exact tier ("cancel": rounding
    ties decided by a tiny term) or many do ("random"); d and the stats are those of one task per
    run computed in order, and so are the exact tiers' accumulators and the error scale."""
    from deepgemm_ref.grouped import contiguous

    from .adversarial import tie_cancel_breaker

    sizes, n, k = [5, 9, 3], 96, 40
    _, ends, m = _layout(sizes, 128)
    a64, _ = tie_cancel_breaker(m, n, k, seed=1, fill=fill)
    b64 = np.stack([tie_cancel_breaker(m, n, k, seed=2 + g, fill=fill)[1] for g in range(len(sizes))])
    a, b = a64.astype(BF16), b64.astype(BF16)
    monkeypatch.setattr(contiguous, "_PIECE_COLS", 16)
    monkeypatch.setattr(contiguous, "_PIECE_ALIGN", 8)
    monkeypatch.setattr(contiguous, "_PIECE_WORK", 1)
    monkeypatch.setenv("DEEPGEMM_REF_NUM_THREADS", "2")
    split = _grouped_call("sm100", a, b, ends)
    assert len(split[4]) == len(sizes) * 6 and split[4][1] == "group 0: d[0:5, 16:32]"
    with monkeypatch.context() as mp:
        _unsplit(mp, "1")
        whole = _grouped_call("sm100", a, b, ends)
    assert len(whole[4]) == len(sizes)
    assert np.array_equal(split[0], whole[0]) and split[3] == whole[3]
    # every element decided by an exact tier ("cancel"): its accumulator is the tier's, not the BLAS's
    if fill == "cancel":
        _same(split, whole, k, tiers_decided=True)
    # and the Fraction reference of every group
    for g, (r0, r1) in enumerate(_ranges(ends, 128)):
        assert np.array_equal(split[0][r0:r1], ref.ref_gemm(a64[r0:r1], b64[g], fm.BF16)), g


def test_m_grouped_column_pieces_at_their_default_size_keep_the_bytes(monkeypatch):
    """At the default piece size (N = 4096 in two pieces of 2048 columns) d and the stats keep
    their bytes, and the trace's S and inexact accumulators stay within the bounds of the BLAS's
    summation order (on OpenBLAS's SkylakeX kernel they kept their bits too; its Haswell kernel,
    which it takes on Zen 5, changes S's last bits with N); FP8 runs are never split (their
    chunk-wide exactness certificate labels the stats) but run on the pool too."""
    rng = np.random.default_rng(5)
    sizes, n, k = [16, 24], 4096, 512
    _, ends, m = _layout(sizes, 128)
    a = rng.standard_normal((m, k), dtype=np.float32).astype(BF16)
    b = rng.standard_normal((len(sizes), n, k), dtype=np.float32).astype(BF16)
    monkeypatch.setenv("DEEPGEMM_REF_NUM_THREADS", "2")
    split = _grouped_call("sm100", a, b, ends)
    assert len(split[4]) == 4
    with monkeypatch.context() as mp:
        _unsplit(mp, "1")
        whole = _grouped_call("sm100", a, b, ends)
    _same(split, whole, k)
    _, ends3, m3 = _layout([7, 1, 20], 128)
    qa, qb, kw, _, _ = _quant("sm100", _rand((m3, 256), 3), _rand((3, 256, 256), 4))
    par = _grouped_call("sm100", qa, qb, ends3, kw)
    assert len(par[4]) == 3
    with monkeypatch.context() as mp:
        mp.setenv("DEEPGEMM_REF_NUM_THREADS", "1")
        seq = _grouped_call("sm100", qa, qb, ends3, kw)
    _same(par, seq, 256)
