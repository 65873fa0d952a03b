"""einsum, fp8_einsum and tf32_hc_prenorm_gemm: exact rationals, relations, DeepGEMM-style checks, bad input."""

from __future__ import annotations

import importlib
import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import deepgemm_ref as dg
from deepgemm_ref import formats as fm
from deepgemm_ref import trace
from deepgemm_ref.errors import DGArgumentError

from . import reference as ref

# The module, not the function: once the package exports the function ``einsum`` under the same
# name, ``from deepgemm_ref import einsum`` gives the function.
E = importlib.import_module("deepgemm_ref.einsum")

BF16 = ml_dtypes.bfloat16
E4M3 = ml_dtypes.float8_e4m3fn
OUT = {np.dtype(BF16): fm.BF16, np.dtype(np.float32): fm.F32}
F = ref.F


def _codes(x):
    return np.ascontiguousarray(x).view({1: np.uint8, 2: np.uint16, 4: np.uint32}[x.dtype.itemsize])


def _rand(shape, seed, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def _f64(x):
    return x.astype(np.float64)


# ---------------------------------------------------------------------------------------------
# einsum (bf16): exact rationals
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("use_cublaslt", [False, True])
def test_einsum_bhr_hdr_bhd_exact_with_sliced_b(use_cublaslt):
    b, h, r, dd = 3, 2, 40, 5
    x = _rand((b, h, r), 1).astype(BF16)
    fy = _rand((h, dd, r + 16), 2).astype(BF16)
    y = fy[:, :, :r]  # a slice of a wider tensor: stride(-1) == 1 is all that is required
    z = np.full((b, h, dd), 7.0, BF16)
    with trace.capture(want_acc=True) as cap:
        E.einsum("bhr,hdr->bhd", x, y, z, use_cublaslt=use_cublaslt)
    for hh in range(h):
        assert np.array_equal(_codes(z[:, hh]), ref.ref_gemm(_f64(x[:, hh]), _f64(y[hh]), fm.BF16))
    rec = cap.last
    assert rec.acc.shape == z.shape and rec.defined.all()
    assert rec.acc[1, 1, 2] == float(ref.exact_dot(_f64(x[1, 1]), _f64(y[1, 2])))


def test_einsum_bhd_hdr_bhr_exact():
    b, h, dd, r = 4, 3, 24, 6
    x = _rand((b, h, dd), 3).astype(BF16)
    y = _rand((h, dd, r), 4).astype(BF16)
    z = np.zeros((b, h, r), BF16)
    E.einsum("bhd,hdr->bhr", x, y, z)
    for hh in range(h):
        assert np.array_equal(_codes(z[:, hh]), ref.ref_gemm(_f64(x[:, hh]), _f64(y[hh].T), fm.BF16))


@pytest.mark.parametrize("out_dtype", [np.float32, BF16])
def test_einsum_bmk_bnk_mn_exact(out_dtype):
    s, m, n, k = 5, 4, 3, 24
    a = _rand((s, m, k), 5).astype(BF16)
    b = _rand((s, n, k), 6).astype(BF16)
    a2 = _f64(a).transpose(1, 0, 2).reshape(m, s * k)  # one contraction over (s, k)
    b2 = _f64(b).transpose(1, 0, 2).reshape(n, s * k)
    if out_dtype is np.float32:
        c = _rand((m, n), 7, 8.0)
        d = c.copy()
        E.einsum("bmk,bnk->mn", a, b, d, c=d)
        assert np.array_equal(_codes(d), ref.ref_gemm(a2, b2, fm.F32, c=c))
    else:
        d = np.full((m, n), 3.0, BF16)
        E.einsum("bmk,bnk->mn", a, b, d)
        assert np.array_equal(_codes(d), _ref_via_f32_workspace(a2, b2))


def _ref_via_f32_workspace(a2, b2):
    """bf16 codes of bf16(f32(+0 + exact sum)): DeepGEMM's bf16 'bmk,bnk->mn' sums into a zeroed
    float32 workspace and copies it into d (csrc/apis/einsum.hpp), from exact rationals."""
    m, n = a2.shape[0], b2.shape[0]
    out = np.zeros((m, n), np.uint16)
    for i in range(m):
        for j in range(n):
            out[i, j] = fm.encode_scalar(F(ref.rn(ref.exact_dot(a2[i], b2[j]), fm.F32)), fm.BF16, fm.IEEE_RNE)
    return out


def test_einsum_bmk_bnk_mn_bf16_rounds_through_the_float32_workspace():
    # sums just past a bf16 midpoint by less than half a float32 ulp: one rounding to bf16 goes
    # up (away from the midpoint), the float32 workspace lands on the midpoint and ties to even
    mids = [(1.0, 2.0**-8, 2.0**-30), (-1.0, -(2.0**-8), -(2.0**-30)), (3.0, 2.0**-7, 2.0**-29),
            (1.0, 2.0**-8, -(2.0**-30)), (-0.0, -0.0, -0.0), (0.5, -0.5, 0.0)]
    s, k = 2, 2  # the three terms over the (s, k) contraction, one zero pad
    a = np.zeros((s, len(mids), k), np.float32)
    for i, t in enumerate(mids):
        flat = list(t) + [0.0]
        for q, v in enumerate(flat):
            a[q // k, i, q % k] = v
    b = np.ones((s, 1, k), np.float32)
    a, b = a.astype(BF16), b.astype(BF16)
    a2 = _f64(a).transpose(1, 0, 2).reshape(len(mids), s * k)
    b2 = _f64(b).transpose(1, 0, 2).reshape(1, s * k)
    d = np.full((len(mids), 1), 7.0, BF16)
    E.einsum("bmk,bnk->mn", a, b, d)
    want = _ref_via_f32_workspace(a2, b2)
    assert np.array_equal(_codes(d), want)
    once = ref.ref_gemm(a2, b2, fm.BF16)  # one rounding of the exact sum
    assert int(np.count_nonzero(want != once)) >= 3  # the test can tell the two data flows apart
    assert _codes(d)[4, 0] == 0  # (-0) terms: the +0 workspace gives +0


@pytest.mark.parametrize("expr", ["bhr,hdr->bhd", "bhd,hdr->bhr", "bhd,bhr->hdr"])
@pytest.mark.parametrize("out_dtype", [np.float32, BF16])
def test_einsum_ascend_exact_with_c_and_alpha(expr, out_dtype):
    bb, h, p, q = 3, 2, 32, 5  # bhr: r = p, d = q; bhd: d = p, r = q
    if expr == "bhr,hdr->bhd":
        x, y = _rand((bb, h, p), 8).astype(BF16), _rand((h, q, p), 9).astype(BF16)
        shape = (bb, h, q)
        pairs = [((slice(None), hh), _f64(x[:, hh]), _f64(y[hh])) for hh in range(h)]
    elif expr == "bhd,hdr->bhr":
        x, y = _rand((bb, h, p), 8).astype(BF16), _rand((h, p, q), 9).astype(BF16)
        shape = (bb, h, q)
        pairs = [((slice(None), hh), _f64(x[:, hh]), _f64(y[hh].T)) for hh in range(h)]
    else:
        x, y = _rand((bb, h, p), 8).astype(BF16), _rand((bb, h, q), 9).astype(BF16)
        shape = (h, p, q)
        pairs = [((hh,), _f64(x[:, hh].T), _f64(y[:, hh].T)) for hh in range(h)]
    c = _rand(shape, 10).astype(out_dtype)
    with dg.numerics(arch="ascend950"):
        d = c.copy()
        E.einsum(expr, x, y, d, c=d, epilogue=dg.epilogue.Alpha(0.75))
        d2 = np.zeros(shape, out_dtype)
        E.einsum(expr, x, y, d2, c=c)  # a separate c: copied into d first (the snapshot's behaviour)
    for idx, av, bv in pairs:
        assert np.array_equal(_codes(d[idx]), ref.ref_gemm(av, bv, OUT[np.dtype(out_dtype)], alpha=0.75, c=c[idx]))
        assert np.array_equal(_codes(d2[idx]), ref.ref_gemm(av, bv, OUT[np.dtype(out_dtype)], c=c[idx]))


# ---------------------------------------------------------------------------------------------
# fp8_einsum
# ---------------------------------------------------------------------------------------------

def _fp8_tokens(x, gran_k, ue8m0=True):
    """per_token_cast_to_fp8 over the last axis of a 3-D tensor."""
    lead = x.shape[:-1]
    q, s = dg.per_token_cast_to_fp8(x.reshape(-1, x.shape[-1]), use_ue8m0=ue8m0, gran_k=gran_k)
    return q.reshape(x.shape), s.reshape(lead + (-1,))


def _fp8_blocks(y, ue8m0=True):
    """per_block_cast_to_fp8 per head: y (H, P, Q) -> sf (H, ceil(P/128), ceil(Q/128))."""
    h = y.shape[0]
    q = np.empty(y.shape, E4M3)
    s = np.empty((h, -(-y.shape[1] // 128), -(-y.shape[2] // 128)), np.float32)
    for i in range(h):
        q[i], s[i] = dg.per_block_cast_to_fp8(y[i], use_ue8m0=ue8m0)
    return q, s


def _blk_vals(q, s):
    p, qq = q.shape
    return fm.decode(q.view(np.uint8), fm.E4M3) * np.repeat(np.repeat(_f64(s), 128, 0), 128, 1)[:p, :qq]


def test_fp8_einsum_sm100_three_expressions_exact():
    b, h, r, dd = 3, 2, 256, 128
    x, y = _rand((b, h, r), 11), _rand((h, dd, r), 12)
    qx, sx = _fp8_tokens(x, 128)
    qy, sy = _fp8_blocks(y)
    z = np.zeros((b, h, dd), np.float32)
    E.fp8_einsum("bhr,hdr->bhd", (qx, sx), (qy, sy), z)
    for hh in range(h):
        av = ref.dequant(qx[:, hh].view(np.uint8), sx[:, hh], 128, fm.E4M3)
        assert np.array_equal(_codes(z[:, hh]), ref.ref_gemm(av, _blk_vals(qy[hh], sy[hh]), fm.F32))
    # 'bhd,hdr->bhr': x (B, H, D) per token along D, y (H, D, R) per block, used MN-major
    x2 = _rand((b, h, dd), 13)
    qx2, sx2 = _fp8_tokens(x2, 128)
    z2 = np.zeros((b, h, r), BF16)
    y2, sy2 = _fp8_blocks(_rand((h, dd, r), 14))
    E.fp8_einsum("bhd,hdr->bhr", (qx2, sx2), (y2, sy2), z2)
    for hh in range(h):
        av = ref.dequant(qx2[:, hh].view(np.uint8), sx2[:, hh], 128, fm.E4M3)
        assert np.array_equal(_codes(z2[:, hh]), ref.ref_gemm(av, _blk_vals(y2[hh], sy2[hh]).T, fm.BF16))
    # 'bhd,bhr->hdr': per-channel scales along B (the contraction), d = c accumulated
    bb = 256
    xa, ya = _rand((bb, h, 8), 15), _rand((bb, h, 12), 16)
    qa = np.empty(xa.shape, E4M3)
    sa = np.empty((2, h, 8), np.float32)
    qb = np.empty(ya.shape, E4M3)
    sb = np.empty((2, h, 12), np.float32)
    for hh in range(h):
        qa[:, hh], sa[:, hh] = dg.per_channel_cast_to_fp8(xa[:, hh], use_ue8m0=True)
        qb[:, hh], sb[:, hh] = dg.per_channel_cast_to_fp8(ya[:, hh], use_ue8m0=True)
    c = _rand((h, 8, 12), 17, 10.0)
    d = c.copy()
    E.fp8_einsum("bhd,bhr->hdr", (qa, sa), (qb, sb), d, c=d, recipe=(1, 1, 128))
    for hh in range(h):
        av = ref.dequant(qa[:, hh].T.view(np.uint8), sa[:, hh].T, 128, fm.E4M3)
        bv = ref.dequant(qb[:, hh].T.view(np.uint8), sb[:, hh].T, 128, fm.E4M3)
        assert np.array_equal(_codes(d[hh]), ref.ref_gemm(av, bv, fm.F32, c=c[hh]))


def test_fp8_einsum_sm90_discards_c():
    b, h, r, dd = 4, 2, 256, 128
    with dg.numerics(arch="sm90"):
        qx, sx = _fp8_tokens(_rand((b, h, r), 18), 128, ue8m0=False)
        qy, sy = _fp8_blocks(_rand((h, dd, r), 19), ue8m0=False)
        z = np.zeros((b, h, dd), BF16)
        E.fp8_einsum("bhr,hdr->bhd", (qx, sx), (qy, sy), z)
        zc = np.zeros((b, h, dd), BF16)
        E.fp8_einsum("bhr,hdr->bhd", (qx, sx), (qy, sy), zc, c=np.full((b, h, dd), 100.0, BF16))
        assert np.array_equal(_codes(z), _codes(zc))
        for hh in range(h):
            av = ref.dequant(qx[:, hh].view(np.uint8), sx[:, hh], 128, fm.E4M3)
            assert np.array_equal(_codes(z[:, hh]), ref.ref_gemm(av, _blk_vals(qy[hh], sy[hh]), fm.BF16))
        with pytest.raises(DGArgumentError, match="bhd,hdr->bhr"):
            E.fp8_einsum("bhd,hdr->bhr", (qx, sx), (qy, sy), z)


def _fp8_output_reference(acc_rows):
    """Port 2.3 FP8Quantization from its definition: acc -> bf16 -> per 32 columns
    sf = 2^e, e = max(ceil(log2(amax / 448)), -22) -> e4m3(v / sf); returns (codes, bytes)."""
    rows, n = len(acc_rows), len(acc_rows[0])
    codes = np.zeros((rows, n), np.uint8)
    scale_bytes = np.zeros((rows, n // 32), np.uint8)
    for i in range(rows):
        v = [ref.rn(a, fm.BF16) for a in acc_rows[i]]
        for j in range(n // 32):
            grp = v[32 * j:32 * j + 32]
            amax = max(abs(t) for t in grp)
            e = -22
            while F(448) * F(2) ** e < F(amax):
                e += 1
            scale_bytes[i, j] = e + 127
            for t in range(32):
                codes[i, 32 * j + t] = ref.e4m3_code(float(F(grp[t]) / F(2) ** e))
    return codes, scale_bytes


@pytest.mark.parametrize("form", ["pair", "epilogue"])
def test_fp8_einsum_ascend_fp8_output_exact(form):
    b, h, r, dd = 3, 2, 96, 64
    x, y = _rand((b, h, r), 20), _rand((h, dd, r), 21, 1e-3)
    y[0, :, :] *= 1e-6  # head 0: tiny accumulators, exercises the 2^-22 scale floor
    with dg.numerics(arch="ascend950"):
        qx, sx = _fp8_tokens(x, 32)
        qy, sy = _fp8_tokens(y, 32)
        z = np.full((b, h, dd), 1.0, E4M3)
        sfd = np.zeros((h * dd // 64, b), np.int16).T  # (M, batch * N / 64), MN-major
        if form == "pair":
            E.fp8_einsum("bhr,hdr->bhd", (qx, sx), (qy, sy), (z, sfd))
        else:
            E.fp8_einsum("bhr,hdr->bhd", (qx, sx), (qy, sy), z, epilogue=dg.epilogue.FP8Quantization(sfd))
    scale_bytes = fm.unpack_ue8m0_int16(sfd)  # (B, H * D / 32)
    for hh in range(h):
        av = ref.dequant(qx[:, hh].view(np.uint8), sx[:, hh], 32, fm.E4M3)
        bv = ref.dequant(qy[hh].view(np.uint8), sy[hh], 32, fm.E4M3)
        acc = [[ref.exact_dot(av[i], bv[j]) for j in range(dd)] for i in range(b)]
        codes, sbytes = _fp8_output_reference(acc)
        assert np.array_equal(_codes(z[:, hh]), codes)
        assert np.array_equal(scale_bytes[:, hh * 2:(hh + 1) * 2], sbytes)
    assert (scale_bytes[:, :2] == 105).any()  # the floor 2^-22 was reached


def test_fp8_einsum_ascend_with_c_and_all_expressions():
    b, h, r, dd = 2, 2, 64, 32
    with dg.numerics(arch="ascend950"):
        x, y = _rand((b, h, dd), 22), _rand((h, dd, r), 23)
        qx, sx = _fp8_tokens(x, 32)
        qyt, syt = _fp8_tokens(np.ascontiguousarray(y.transpose(0, 2, 1)), 32)  # (H, R, D) per 32 along D
        qy, sy = np.ascontiguousarray(qyt.transpose(0, 2, 1)), np.ascontiguousarray(syt.transpose(0, 2, 1))
        c = _rand((b, h, r), 24).astype(BF16)
        z = c.copy()
        E.fp8_einsum("bhd,hdr->bhr", (qx, sx), (qy, sy), z, c=z)
        for hh in range(h):
            av = ref.dequant(qx[:, hh].view(np.uint8), sx[:, hh], 32, fm.E4M3)
            bv = ref.dequant(qyt[hh].view(np.uint8), syt[hh], 32, fm.E4M3)
            assert np.array_equal(_codes(z[:, hh]), ref.ref_gemm(av, bv, fm.BF16, c=c[:, hh]))


# ---------------------------------------------------------------------------------------------
# relations and DeepGEMM-style checks
# ---------------------------------------------------------------------------------------------

@settings(max_examples=20, deadline=None)
@given(st.integers(1, 5), st.integers(1, 3), st.integers(1, 40), st.integers(1, 9), st.integers(0, 2**31 - 1))
def test_einsum_equals_dense_gemm_per_head(b, h, r, dd, seed):
    x, y = _rand((b, h, r), seed).astype(BF16), _rand((h, dd, r), seed + 1).astype(BF16)
    z = np.zeros((b, h, dd), BF16)
    E.einsum("bhr,hdr->bhd", x, y, z)
    z2 = np.zeros((b, h, r), BF16)
    E.einsum("bhd,hdr->bhr", np.ascontiguousarray(z), np.ascontiguousarray(y.transpose(0, 1, 2)), z2)
    for hh in range(h):
        dense = np.zeros((b, dd), BF16)
        dg.bf16_gemm_nt(np.ascontiguousarray(x[:, hh]), y[hh], dense)
        assert np.array_equal(_codes(z[:, hh]), _codes(dense))
        dense2 = np.zeros((b, r), BF16)
        dg.bf16_gemm_nn(np.ascontiguousarray(z[:, hh]), y[hh], dense2)
        assert np.array_equal(_codes(z2[:, hh]), _codes(dense2))


def test_deepgemm_style_einsum_checks():
    rng = np.random.default_rng(3)
    b, h, r, dd = 32, 8, 512, 128
    x = rng.standard_normal((b, h, r)).astype(np.float32).astype(BF16)
    fy = rng.standard_normal((h, dd, r + 128)).astype(np.float32).astype(BF16)
    y = fy[:, :, :r]
    z = np.empty((b, h, dd), BF16)
    E.einsum("bhr,hdr->bhd", x, y, z)
    # torch.einsum in bf16, with a float64 accumulator rounded once (one bf16 ulp in one of these
    # 32768 outputs alone would cost about 5e-10: the threshold asks for the correctly rounded sum)
    ref_z = fm.round_f64(np.einsum("bhr,hdr->bhd", _f64(x), _f64(y)), fm.BF16)
    assert dg.testing.calc_diff(z, ref_z) < 1e-10
    # bmk,bnk->mn with float32 accumulation into d
    s, m, n, k = 129, 128, 64, 128
    a = rng.standard_normal((s, m, k)).astype(np.float32).astype(BF16)
    bb = rng.standard_normal((s, n, k)).astype(np.float32).astype(BF16)
    d = rng.standard_normal((m, n)).astype(np.float32)
    ref_d = _f64(d) + np.einsum("smk,snk->mn", _f64(a), _f64(bb))
    E.einsum("bmk,bnk->mn", a, bb, d, c=d)
    assert dg.testing.calc_diff(d, ref_d) < 1e-5
    # fp8_einsum 'bhr,hdr->bhd' like test_fp8_bhr_hdr_bhd (r = 4096 scaled down)
    xf = rng.standard_normal((b, h, 1024)).astype(np.float32).astype(BF16)
    yf = rng.standard_normal((h, 256, 1024)).astype(np.float32).astype(BF16)
    zf = np.empty((b, h, 256), BF16)
    E.fp8_einsum("bhr,hdr->bhd", _fp8_tokens(xf.astype(np.float32), 128), _fp8_blocks(yf.astype(np.float32)), zf)
    assert dg.testing.calc_diff(zf, np.einsum("bhr,hdr->bhd", _f64(xf), _f64(yf))) < 1e-3


# ---------------------------------------------------------------------------------------------
# bad input: argument errors before d is written
# ---------------------------------------------------------------------------------------------

def test_einsum_bad_input_leaves_d_untouched():
    x, y = _rand((2, 2, 32), 1).astype(BF16), _rand((2, 4, 32), 2).astype(BF16)
    a, b = _rand((3, 4, 8), 3).astype(BF16), _rand((3, 5, 8), 4).astype(BF16)
    z = np.full((2, 2, 4), 5.0, BF16)
    d32 = np.full((4, 5), 5.0, np.float32)
    cases = [
        (lambda: E.einsum("bhr,hdr->bhd", x, y, z, c=z), "c"),
        (lambda: E.einsum("bhr,hdr->bhd", x.astype(np.float32), y, z), "bfloat16"),
        (lambda: E.einsum("bhd,bhr->hdr", x, y, z), "Unsupported einsum expression"),
        (lambda: E.einsum("bhr,hdr->bhd", x, y[:, :3], z), "batched GEMM"),
        (lambda: E.einsum("bmk,bnk->mn", a, b, d32), "c"),  # float32 d: c must be d
        (lambda: E.einsum("bmk,bnk->mn", a, b, d32, c=d32.copy()), "c"),
        (lambda: E.einsum("bmk,bnk->mn", a, b, d32, c=d32, use_cublaslt=True), "use_cublaslt"),
        (lambda: E.einsum("bmk,bnk->mn", a, b[:, :, :4], d32, c=d32), "b"),
    ]
    for call, match in cases:
        zb, db = z.copy(), d32.copy()
        with pytest.raises(DGArgumentError, match=match):
            call()
        assert np.array_equal(_codes(z), _codes(zb)) and np.array_equal(d32, db)
    with dg.numerics(arch="ascend950"):
        for call, match in [
            (lambda: E.einsum("bmk,bnk->mn", a, b, d32, c=d32), "Unsupported einsum expression"),
            (lambda: E.einsum("bhr,hdr->bhd", x, y, z, use_cublaslt=True), "not implemented"),
            (lambda: E.einsum("bhr,hdr->bhd", x, y, z, epilogue=dg.epilogue.FP8Quantization(z)), "FP8Quantization"),
        ]:
            with pytest.raises(DGArgumentError, match=match):
                call()
            assert np.all(z == 5.0)


def test_fp8_einsum_bad_input_leaves_outputs_untouched():
    b, h, r, dd = 2, 2, 64, 64
    with dg.numerics(arch="ascend950"):
        qx, sx = _fp8_tokens(_rand((b, h, r), 1), 32)
        qy, sy = _fp8_tokens(_rand((h, dd, r), 2), 32)
        z = np.full((b, h, dd), 2.0, E4M3)
        sfd = np.full((h * dd // 64, b), 7, np.int16).T
        zb = np.full((b, h, dd), 2.0, BF16)
        cases = [
            (lambda: E.fp8_einsum("bhr,hdr->bhd", (qx, sx), (qy, sy), (z, sfd), c=zb), "c"),
            (lambda: E.fp8_einsum("bhr,hdr->bhd", (qx, sx), (qy, sy), (z, np.ascontiguousarray(sfd))), "sfd"),
            (lambda: E.fp8_einsum("bhr,hdr->bhd", (qx, sx), (qy, sy), (z, sfd[:, :1])), "sfd"),
            (lambda: E.fp8_einsum("bhr,hdr->bhd", (qx, sx), (qy, sy), z), "FP8Quantization"),
            (lambda: E.fp8_einsum("bhr,hdr->bhd", (qx, sx), (qy, sy), (z, sfd),
                                  epilogue=dg.epilogue.FP8Quantization(sfd)), "at most one"),
            (lambda: E.fp8_einsum("bhr,hdr->bhd", (qx, sx), (qy, sy), zb, epilogue=dg.epilogue.FP8Quantization(sfd)),
             "float8_e4m3fn"),
            (lambda: E.fp8_einsum("bhr,hdr->bhd", (qx, sx * np.float32(0.75)), (qy, sy), zb), "powers of two"),
            (lambda: E.fp8_einsum("bhr,hdr->bhd", (qx, sx), (qy, sy), zb, recipe=(1, 1, 128)), "gran_k 32"),
            (lambda: E.fp8_einsum("bhr,hdr->bhd", (qx.astype(np.float32).astype(BF16), sx), (qy, sy), zb),
             "float8_e4m3fn"),
        ]
        for call, match in cases:
            before = (_codes(z).copy(), _codes(sfd).copy(), _codes(zb).copy())
            with pytest.raises(DGArgumentError, match=match):
                call()
            assert all(np.array_equal(p, q) for p, q in zip(before, (_codes(z), _codes(sfd), _codes(zb)), strict=True))
        zn = np.zeros((b, h, 32), E4M3)
        with pytest.raises(DGArgumentError, match="64"):
            E.fp8_einsum("bhr,hdr->bhd", (qx, sx), (qy[:, :32], sy[:, :32]), (zn, np.zeros((1, b), np.int16).T))
        zr = np.zeros((b, h, dd), E4M3)
        with pytest.raises(DGArgumentError, match="pair"):
            E.fp8_einsum("bhd,hdr->bhr", (qx, sx), (qy, sy), (zr, sfd))


# ---------------------------------------------------------------------------------------------
# tf32_hc_prenorm_gemm and the TF32 / HF32 conversions
# ---------------------------------------------------------------------------------------------

def _tf32_ref(v: float, mantissa: int, rounding: str) -> float:
    """float32 value -> its value with `mantissa` stored bits, from the definition (Fractions)."""
    if v == 0 or not math.isfinite(v):
        return v
    binade = max(math.frexp(v)[1] - 1, -126)
    quantum = F(2) ** (binade - mantissa)
    q = F(v) / quantum
    n = int(q) if rounding == "trunc" else round(q)  # int(): toward zero; round(): ties to even
    out = n * quantum
    return math.copysign(math.inf, v) if abs(out) >= F(2) ** 128 else float(out)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_tf32_and_hf32_match_their_definitions(bits):
    x = np.array([bits], np.uint32).view(np.float32)
    v = float(x[0])
    t, hf = E.tf32_truncate(x)[0], E.hf32_round(x)[0]
    if math.isnan(v):
        assert np.isnan(t) and np.isnan(hf)
        return
    assert float(t) == _tf32_ref(v, 10, "trunc") and math.copysign(1, t) == math.copysign(1, v)
    assert float(hf) == _tf32_ref(v, E.HF32_MANTISSA_BITS, "rne")
    assert E.TF32_DROPPED_BITS == 13 and E.HF32_MANTISSA_BITS == 11


def test_hf32_ties_and_carry():
    one = 1.0
    ulp = 2.0**-11
    xs = np.array([one + ulp / 2, one + 3 * ulp / 2, 2 - ulp / 2, one + ulp / 2 + 2.0**-23], np.float32)
    assert E.hf32_round(xs).tolist() == [1.0, one + 2 * ulp, 2.0, one + ulp]
    assert E.tf32_truncate(np.array([1 + 2.0**-10 - 2.0**-23, -(1 + 2.0**-11)], np.float32)).tolist() == [1.0, -1.0]


def _split_blocks(k, splits):
    """Hand-derived from spec 8.3 for K = 320 (5 blocks of 64) and 3 splits: q = 1, r = 2."""
    return {(320, 3): [(0, 128), (128, 256), (256, 320)], (320, 1): [(0, 320)],
            (128, 4): [(0, 64), (64, 128), (128, 128), (128, 128)]}[(k, splits)]


@pytest.mark.parametrize("arch,k,splits", [("sm100", 320, None), ("sm100", 320, 3), ("sm90", 320, 1),
                                           ("sm100", 128, 4), ("ascend950", 512, None), ("ascend950", 512, 1)])
def test_hc_prenorm_exact(arch, k, splits):
    m, n = 3, 8
    rng = np.random.default_rng(k)
    a = (rng.standard_normal((m, k)) * np.exp2(rng.integers(-6, 6, (m, k)))).astype(np.float32).astype(BF16)
    b = rng.standard_normal((n, k)).astype(np.float32)
    s_count = splits or 1
    d = np.full((s_count, m, n) if splits else (m, n), 9.0, np.float32)
    s = np.full((s_count, m) if splits else (m,), 9.0, np.float32)
    with dg.numerics(arch=arch):
        E.tf32_hc_prenorm_gemm(a, b, d, s, num_splits=splits)
    mant, rounding = (11, "rne") if arch == "ascend950" else (10, "trunc")
    bconv = np.array([[_tf32_ref(float(v), mant, rounding) for v in row] for row in b])
    ranges = _split_blocks(k, s_count) if arch != "ascend950" else [(0, k)]
    d3, s2 = d.reshape(s_count, m, n), s.reshape(s_count, m)
    for si, (k0, k1) in enumerate(ranges):
        assert np.array_equal(_codes(d3[si]), ref.ref_gemm(_f64(a[:, k0:k1]), bconv[:, k0:k1], fm.F32))
        for i in range(m):
            exact = sum((F(float(v)) ** 2 for v in a[i, k0:k1]), F(0))
            assert _codes(s2[si, i:i + 1])[0] == fm.encode_scalar(exact, fm.F32, fm.IEEE_RNE)


def test_hc_prenorm_splits_sum_and_deepgemm_style_check():
    rng = np.random.default_rng(5)
    m, n, k = 37, 24, 7168
    a = rng.standard_normal((m, k)).astype(np.float32).astype(BF16)
    b = rng.standard_normal((n, k)).astype(np.float32)
    d = np.empty((m, n), np.float32)
    s = np.empty((m,), np.float32)
    E.tf32_hc_prenorm_gemm(a, b, d, s)
    d16 = np.empty((16, m, n), np.float32)
    s16 = np.empty((16, m), np.float32)
    E.tf32_hc_prenorm_gemm(a, b, d16, s16, num_splits=16)
    d1 = np.empty((1, m, n), np.float32)
    s1 = np.empty((1, m), np.float32)
    E.tf32_hc_prenorm_gemm(a, b, d1, s1, num_splits=1)
    assert np.array_equal(_codes(d1[0]), _codes(d)) and np.array_equal(_codes(s1[0]), _codes(s))
    # the reference the upstream test uses, with the same TF32 reading of b (trap 17)
    bt = E.tf32_truncate(b).astype(np.float64)
    ref_d = _f64(a) @ bt.T
    ref_s = np.square(_f64(a)).sum(-1)
    for got_d, got_s in ((d, s), (d16.sum(0), s16.sum(0))):
        assert max(dg.testing.calc_diff(got_d, ref_d), dg.testing.calc_diff(got_s, ref_s)) < 1e-8


def test_hc_prenorm_bad_input():
    a = np.zeros((4, 128), BF16)
    b = np.zeros((8, 128), np.float32)
    d = np.full((4, 8), 3.0, np.float32)
    s = np.full((4,), 3.0, np.float32)
    with dg.numerics(arch="sm90"), pytest.raises(DGArgumentError, match="N <= 32"):
        E.tf32_hc_prenorm_gemm(a, np.zeros((40, 128), np.float32), np.zeros((4, 40), np.float32), s)
    cases = [
        (lambda: E.tf32_hc_prenorm_gemm(a, b[:, :96], d, s), "d"),
        (lambda: E.tf32_hc_prenorm_gemm(a[:, :96], b[:, :96], d, s), "K % 64"),
        (lambda: E.tf32_hc_prenorm_gemm(a.astype(np.float32), b, d, s), "bfloat16"),
        (lambda: E.tf32_hc_prenorm_gemm(a, b, d, s, num_splits=2), "d"),
        (lambda: E.tf32_hc_prenorm_gemm(a, b, d, s, num_splits=0), "num_splits"),
        (lambda: E.tf32_hc_prenorm_gemm(a, np.asfortranarray(b), d, s), "K-major"),
    ]
    for call, match in cases:
        with pytest.raises(DGArgumentError, match=match):
            call()
        assert np.all(d == 3.0) and np.all(s == 3.0)
    with dg.numerics(arch="ascend950"):
        d1, s1 = np.zeros((1, 4, 8), np.float32), np.zeros((1, 4), np.float32)
        with pytest.raises(DGArgumentError, match="None or 1"):
            E.tf32_hc_prenorm_gemm(a, b, np.zeros((2, 4, 8), np.float32), np.zeros((2, 4), np.float32), num_splits=2)
        with pytest.raises(DGArgumentError, match="K % 256"):
            E.tf32_hc_prenorm_gemm(a, b, d1, s1, num_splits=1)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_einsum_bmk_bnk_mn_bf16_adversarial_values_exact(seed):
    from deepgemm_ref.golden.values import AdversarialGenerator

    rng = AdversarialGenerator(np.random.PCG64(seed))
    s, m, n, k = 2, 6, 5, 40
    a = rng.standard_normal((s, m, k), dtype=np.float32).astype(BF16)
    b = rng.standard_normal((s, n, k), dtype=np.float32).astype(BF16)
    d = np.zeros((m, n), BF16)
    with np.errstate(over="ignore", invalid="ignore"):
        E.einsum("bmk,bnk->mn", a, b, d)
    a2 = _f64(a).transpose(1, 0, 2).reshape(m, s * k)
    b2 = _f64(b).transpose(1, 0, 2).reshape(n, s * k)
    assert np.array_equal(_codes(d), _ref_via_f32_workspace(a2, b2))
