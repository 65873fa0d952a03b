"""MQA logits (plain and paged, FP8 and FP4, DeepGEMM and DeepGEMM-Ascend).

Expected values come from outside the implementation: exact rationals (``Fraction``) of the
spec's formula on the dequantised inputs, scalar transcriptions of each device's reduction order
(every float32 / bf16 operation is an exact rational rounded by ``formats.encode_scalar``),
schedules re-derived from the spec's text, KV caches assembled byte by byte, and relations
between kernels (paged = plain on the same tokens, block permutations, chunking).
"""

from __future__ import annotations

import tracemalloc
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import deepgemm_ref as dg
from deepgemm_ref import attention as att
from deepgemm_ref import formats as fm
from deepgemm_ref import trace
from deepgemm_ref.errors import DGArgumentError
from deepgemm_ref.testing import calc_diff

from . import reference as ref

F = Fraction
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
BF16 = np.dtype(ml_dtypes.bfloat16)
OUT = {np.dtype(np.float32): fm.F32, BF16: fm.BF16}


# ---------------------------------------------------------------------------------------------
# input builders (DeepGEMM's test recipes, and exact hand-made values)
# ---------------------------------------------------------------------------------------------

def _e4m3(x) -> np.ndarray:
    """float -> E4M3 the way torch's ``.to(float8_e4m3fn)`` does (RNE, saturating)."""
    return fm.cast(np.asarray(x, np.float32), fm.E4M3, fm.SATURATING_RNE)


def _bf16(x) -> np.ndarray:
    return fm.cast(np.asarray(x, np.float32), fm.BF16, fm.IEEE_RNE)


def _rand(shape, seed, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32).astype(dtype)


def _fp8_inputs(seq, seq_kv, heads, d, seed):
    """DeepGEMM's FP8 recipe: bf16 randn, q cast to e4m3, kv per-token (amax / 448) scales."""
    q = _rand((seq, heads, d), seed, BF16)
    kv = _rand((seq_kv, d), seed + 1, BF16)
    q8 = _e4m3(q.astype(np.float32))
    kv8, sf = dg.per_custom_dims_cast_to_fp8(kv, (0,), False)
    return q, kv, q8, (kv8, sf.reshape(seq_kv))  # squeeze() gives a 0-d scale for one token (trap 12)


def _fp4_inputs(seq, seq_kv, heads, d, seed):
    """DeepGEMM's FP4 recipe: per_token_cast_to_fp4(gran_k=32, packed UE8M0)."""
    q = _rand((seq, heads, d), seed, BF16)
    kv = _rand((seq_kv, d), seed + 1, BF16)
    qp, qs = dg.per_token_cast_to_fp4(q.reshape(-1, d), use_ue8m0=True, gran_k=32, use_packed_ue8m0=True)
    kp, ksf = dg.per_token_cast_to_fp4(kv, use_ue8m0=True, gran_k=32, use_packed_ue8m0=True)
    return q, kv, (qp.reshape(seq, heads, d // 2), qs.reshape(seq, heads)), (kp, ksf.reshape(seq_kv))


def _deq_fp8(codes, scale=None):
    v = fm.decode(np.asarray(codes).view(np.uint8), fm.E4M3)
    return v if scale is None else v * np.asarray(scale, np.float64)[..., None]


def _deq_fp4(packed, sf_int32, d):
    """Dequantised FP4 rows via DeepGEMM's own utility (float32, exact)."""
    flat = packed.reshape(-1, d // 2)
    return np.asarray(dg.cast_back_from_fp4(flat, sf_int32.reshape(-1, 1), gran_k=32, use_packed_ue8m0=True),
                      np.float64).reshape(*packed.shape[:-1], d)


def _ascend_pairs(scale_bytes):
    """UE8M0 bytes (..., D / 32) -> int16 pairs (..., D / 64)."""
    return fm.pack_ue8m0_int16(np.asarray(scale_bytes, np.uint8))


def _ascend_quant(x, fp4):
    """Per-32 MX quantisation for the Ascend kernels: (data, int16 pairs, dequantised float64)."""
    d = x.shape[-1]
    flat = x.reshape(-1, d).astype(np.float32)
    if fp4:
        packed, sf = dg.per_token_cast_to_fp4(flat, use_ue8m0=True, gran_k=32)
        deq = np.asarray(dg.cast_back_from_fp4(packed, sf, gran_k=32), np.float64)
        data = packed.reshape(*x.shape[:-1], d // 2)
    else:
        data, sf = dg.per_token_cast_to_fp8(flat, use_ue8m0=True, gran_k=32)
        deq = _deq_fp8(data) * np.repeat(sf.astype(np.float64), 32, axis=1)
        data = data.reshape(x.shape)
    pairs = _ascend_pairs(fm.ue8m0_encode(sf, "ceil"))
    return data, pairs, deq.reshape(*x.shape)


def _codes(x):
    x = np.asarray(x)
    return x.view({2: np.uint16, 4: np.uint32}[x.dtype.itemsize])


# ---------------------------------------------------------------------------------------------
# slow references: the spec's formula in exact arithmetic, and each device's order
# ---------------------------------------------------------------------------------------------

def exact_logit(qrows, krow, w, s=1.0, head_fmt=None) -> Fraction:
    """s * sum_h w_h * relu(q_h . k) as an exact rational (qrows (H, D), krow (D,) float64 exact).

    head_fmt: the format the data flow rounds each relu(q_h . k) and s to before the head sum
    (bf16 on ascend950 and on sm100 with bf16 weights: docs/numerics.md, the rounding rule).
    """
    tot = F(0)
    for h in range(qrows.shape[0]):
        x = ref.exact_dot(qrows[h], krow)
        if x > 0:
            tot += F(float(w[h])) * (x if head_fmt is None else F(ref.rn(x, head_fmt)))
    return tot * F(float(s) if head_fmt is None else ref.rn(F(float(s)), head_fmt))


def rn32(v) -> float:
    return ref.rn(F(v), fm.F32)


def rnb(v) -> float:
    return ref.rn(F(v), fm.BF16)


def ref_sm100_f32(x, w, s):
    """Spec 9.1, sm100 float32 weights: lanes (A.x, A.y, B.x, B.y) <- heads 4u + (0, 1, 2, 3)."""
    acc = [0.0, 0.0, 0.0, 0.0]
    for h in range(len(x)):
        a = rn32(F(float(x[h])) + abs(F(float(x[h]))))
        acc[h % 4] = rn32(F(a) * F(float(w[h])) + F(acc[h % 4]))
    sx, sy = rn32(F(acc[0]) + F(acc[2])), rn32(F(acc[1]) + F(acc[3]))
    red = rn32(F(rn32(F(sx) + F(sy))) / 2)
    return red if s is None else rn32(F(red) * F(float(s)))


def ref_sm100_bf16(x, w, s):
    acc = [0.0, 0.0, 0.0, 0.0]
    for h in range(len(x)):
        r = rnb(max(F(float(x[h])), F(0)))
        acc[h % 4] = rnb(F(r) * F(float(w[h])) + F(acc[h % 4]))
    sx, sy = rnb(F(acc[0]) + F(acc[2])), rnb(F(acc[1]) + F(acc[3]))
    red = rnb(F(sx) + F(sy))
    return red if s is None else rnb(F(red) * F(rnb(float(s))))


def ref_sm90(x, w, s):
    """Spec 9.1, sm90: lane c, parity p; first term a product, then FMAs; butterfly."""
    v = []
    for c in range(4):
        par = []
        for p in range(2):
            h = 2 * c + p
            acc = rn32(max(F(float(x[h])), F(0)) * F(float(w[h])))
            for g in range(1, len(x) // 8):
                h = 8 * g + 2 * c + p
                acc = rn32(max(F(float(x[h])), F(0)) * F(float(w[h])) + F(acc))
            par.append(acc)
        v.append(rn32(F(rn32(F(par[0]) + F(par[1]))) * F(float(s))))
    return rn32(F(rn32(F(v[0]) + F(v[1]))) + F(rn32(F(v[2]) + F(v[3]))))


def ref_ascend(x, w, fused=True):
    acc = 0.0
    for h in range(len(x)):
        r = rnb(max(F(float(x[h])), F(0)))
        if fused:
            acc = rnb(F(acc) + F(r) * F(float(w[h])))
        else:
            acc = rnb(F(acc) + F(rnb(F(r) * F(float(w[h])))))
    return acc


def _check_exact(out, qdeq, kdeq, w, ks, ke, compressed, s=None, fmt=None, head_fmt=None):
    """Every defined logit equals the exact formula (with the data flow's head roundings) rounded once (RNE)."""
    fmt = fmt or OUT[np.dtype(out.dtype)]
    n = 0
    for i in range(qdeq.shape[0]):
        for j in range(int(ks[i]), int(ke[i])):
            col = j - int(ks[i]) if compressed else j
            want = fm.encode_scalar(exact_logit(qdeq[i], kdeq[j], w[i], 1.0 if s is None else s[j], head_fmt), fmt,
                                    fm.IEEE_RNE)
            got = int(_codes(out[i:i + 1, col])[0])
            assert got == want, (i, j, got, want)
            n += 1
    return n


# ---------------------------------------------------------------------------------------------
# exact model against rationals
# ---------------------------------------------------------------------------------------------

KS = np.array([0, 3, 5, 0, 10, 20, 49], np.int32)
KE = np.array([10, 3, 50, 1, 30, 45, 50], np.int32)


@pytest.mark.parametrize("arch,heads", [("sm100", 8), ("sm90", 32)])
@pytest.mark.parametrize("logits_dtype", [np.float32, BF16])
@pytest.mark.parametrize("mode", ["clean", "compressed", "plain"])
def test_fp8_exact_vs_fractions(arch, heads, logits_dtype, mode):
    seq, seq_kv, d = 7, 50, 32
    _, _, q8, (kv8, sf) = _fp8_inputs(seq, seq_kv, heads, d, 11)
    w = _rand((seq, heads), 12)
    max_k = int((KE - KS).max()) if mode == "compressed" else 0
    with dg.numerics(arch=arch), trace.capture() as cap:
        out = att.fp8_fp4_mqa_logits((q8, None), (kv8, sf), w, KS, KE, clean_logits=mode == "clean",
                                     max_seqlen_k=max_k, logits_dtype=logits_dtype)
    assert out.dtype == np.dtype(logits_dtype)
    n = _check_exact(out, _deq_fp8(q8), _deq_fp8(kv8), w, KS, KE, mode == "compressed", s=sf)
    assert n == int((KE - KS).sum())
    rec = cap.last
    assert rec.stats.get("bounded", 0) + rec.stats.get("fraction", 0) >= n
    cols = np.arange(out.shape[1])[None, :]
    if mode == "clean":
        inside = (cols >= KS[:, None]) & (cols < KE[:, None])
        assert np.array_equal(np.isneginf(out.astype(np.float32)), ~inside)
        assert rec.defined.all()
    else:
        lo = np.zeros_like(KS) if mode == "compressed" else KS
        hi = KE - KS if mode == "compressed" else KE
        inside = (cols >= lo[:, None]) & (cols < hi[:, None])
        assert np.array_equal(rec.defined, inside)
        assert np.isnan(out.astype(np.float32)[~inside]).all() and np.isfinite(out.astype(np.float32)[inside]).all()


def test_fp8_bf16_weights_exact():
    seq, seq_kv, heads, d = 5, 40, 16, 64
    _, _, q8, (kv8, sf) = _fp8_inputs(seq, seq_kv, heads, d, 21)
    w = _rand((seq, heads), 22, BF16)
    ks, ke = np.zeros(seq, np.int32), np.arange(seq, dtype=np.int32) + seq_kv - seq
    out = att.fp8_fp4_mqa_logits((q8, None), (kv8, sf), w, ks, ke, logits_dtype=BF16)
    # bf16 weights: relu(x_h) and the KV scale reach the bf16 FMA chain as bf16 (the rounding rule)
    _check_exact(out, _deq_fp8(q8), _deq_fp8(kv8), w.astype(np.float64), ks, ke, False, s=sf, head_fmt=fm.BF16)
    with pytest.raises(DGArgumentError, match="logits_dtype: expected bfloat16 with bfloat16 weights"):
        att.fp8_fp4_mqa_logits((q8, None), (kv8, sf), w, ks, ke)
    q32 = np.zeros((seq, 32, d), E4M3)
    with dg.numerics(arch="sm90"), pytest.raises(DGArgumentError, match="weights: expected dtype float32"):
        att.fp8_fp4_mqa_logits((q32, None), (kv8, sf), np.zeros((seq, 32), BF16), ks, ke, logits_dtype=BF16)


@pytest.mark.parametrize("d", [64, 128])
def test_fp4_exact_on_dequantised_values(d):
    """FP4 inputs give the exact formula evaluated on their float64-dequantised values."""
    seq, seq_kv, heads = 6, 33, 8
    _, _, (qp, qs), (kp, ksf) = _fp4_inputs(seq, seq_kv, heads, d, 31)
    w = _rand((seq, heads), 32)
    ks = np.array([0, 1, 5, 9, 0, 32], np.int32)
    ke = np.array([33, 2, 20, 9, 33, 33], np.int32)
    out = att.fp8_fp4_mqa_logits((qp, qs), (kp, ksf), w, ks, ke, clean_logits=False)
    _check_exact(out, _deq_fp4(qp, qs, d), _deq_fp4(kp, ksf, d), w, ks, ke, False)
    with dg.numerics(arch="sm90"), pytest.raises(DGArgumentError, match=r"q\[1\]: expected None on sm90"):
        att.fp8_fp4_mqa_logits((qp, qs), (kp, ksf), w, ks, ke)


def test_fp4_scales_far_apart_use_the_uncertified_path():
    """Scales spanning 2^-100 .. 2^100 inside a row defeat the float64 certificate for the per-head
    dot products; the result is still the exact formula rounded once."""
    seq, seq_kv, heads, d = 3, 9, 8, 64
    rng = np.random.default_rng(41)
    qp = fm.pack_fp4(rng.integers(0, 16, (seq, heads, d))).astype(np.int8)
    kp = fm.pack_fp4(rng.integers(0, 16, (seq_kv, d))).astype(np.int8)
    qb = rng.choice([27, 127, 227], size=(seq, heads, 2)).astype(np.uint8)
    kb = rng.choice([27, 127, 227], size=(seq_kv, 2)).astype(np.uint8)
    pad = lambda b: np.concatenate([b, np.full(b.shape[:-1] + (2,), 127, np.uint8)], axis=-1)  # noqa: E731
    qs = fm.pack_ue8m0_int32(pad(qb))[..., 0]
    ksf = fm.pack_ue8m0_int32(pad(kb))[..., 0]
    w = _rand((seq, heads), 42)
    ks, ke = np.zeros(seq, np.int32), np.full(seq, seq_kv, np.int32)
    with trace.capture() as cap:
        out = att.fp8_fp4_mqa_logits((qp, qs), (kp, ksf), w, ks, ke, clean_logits=False)
    qdeq = fm.decode(fm.unpack_fp4(qp), fm.E2M1) * np.repeat(fm.ue8m0_decode(qb), 32, axis=-1)
    kdeq = fm.decode(fm.unpack_fp4(kp), fm.E2M1) * np.repeat(fm.ue8m0_decode(kb), 32, axis=-1)
    _check_exact(out, qdeq, kdeq, w, ks, ke, False)
    assert sum(cap.last.stats.values()) >= seq * seq_kv


@pytest.mark.parametrize("fp4", [False, True])
def test_ascend_exact_vs_fractions(fp4):
    seq, seq_kv, heads, d = 5, 37, 12, 128
    q = _rand((seq, heads, d), 51)
    kv = _rand((seq_kv, d), 52) * np.exp2(np.random.default_rng(53).integers(-6, 6, (seq_kv, 1))).astype(np.float32)
    qd, qpairs, qdeq = _ascend_quant(q, fp4)
    kd, kpairs, kdeq = _ascend_quant(kv, fp4)
    w = _rand((seq, heads), 54, BF16)
    ks = np.array([0, 4, 10, 36, 20], np.int32)
    ke = np.array([37, 4, 31, 37, 22], np.int32)
    with dg.numerics(arch="ascend950"), trace.capture() as cap:
        out = att.fp8_fp4_mqa_logits((qd, qpairs.reshape(seq, heads, -1)), (kd, kpairs), w, ks, ke, 40)
    assert out.dtype == BF16 and out.shape == (seq, 40) and out.strides == (256 * 2, 2)
    _check_exact(out, qdeq, kdeq, w.astype(np.float64), ks, ke, True, head_fmt=fm.BF16)
    assert np.array_equal(cap.last.defined, np.arange(40)[None, :] < (ke - ks)[:, None])
    assert np.isnan(out.astype(np.float32)[~cap.last.defined]).all()
    with dg.numerics(arch="ascend950"):  # (T * H, D / 64) form of the Q scales, transposed strides
        again = att.fp8_fp4_mqa_logits((qd, np.asfortranarray(qpairs.reshape(seq * heads, -1))), (kd, kpairs), w,
                                       ks, ke, 40)
    assert np.array_equal(_codes(again), _codes(out))


# ---------------------------------------------------------------------------------------------
# ties at the bf16 output rounding, also behind float64 cancellation
# ---------------------------------------------------------------------------------------------

def _tie_case(tail, w0):
    """Heads 0 and 1 cancel (w0 * 2^22 - w0 * 2^22), head 2 carries the tail.

    k = 256 (64 times), then 1, 2^-4, 2^-4, 2^-4; q_0 = q_1 = 256 (64 times); q_2 picks the tail.
    """
    heads, d = 8, 128
    k = np.zeros(d, np.float32)
    k[:64] = 256
    k[64:68] = [1, 2**-4, 2**-4, 2**-4]
    q = np.zeros((heads, d), np.float32)
    q[0, :64] = q[1, :64] = 256
    q[2, 64:64 + len(tail)] = tail
    q[3:, 0] = -1  # negative dot products: relu -> 0
    w = np.zeros(heads, np.float32)
    w[:3] = [w0, -w0, 1]
    return _e4m3(q[None]), _e4m3(k[None]), w[None]


@pytest.mark.parametrize("tail,want", [
    ([1, 2**-4], 1.0),                            # 1 + 2^-8: tie between 1 and 1 + 2^-7 -> even (1)
    ([1, 2**-4, 2**-4, 2**-4], 1 + 2**-6),       # 1 + 3 * 2^-8: tie -> even (1 + 2^-6)
    ([1, 2**-4, 2**-4], 1 + 2**-7),              # 1 + 2^-7: representable
])
@pytest.mark.parametrize("w0", [0.0, 2.0**41])
def test_bf16_ties(tail, want, w0):
    """With w0 = 2^41 the exact sum is 2^63 - 2^63 + tail: float64 loses the tail entirely, so only
    the exact fallback can find the tie."""
    q8, k8, w = _tie_case(tail, w0)
    one = np.ones(1, np.float32)
    ks, ke = np.zeros(1, np.int32), np.ones(1, np.int32)
    with trace.capture() as cap:
        out = att.fp8_fp4_mqa_logits((q8, None), (k8, one), w, ks, ke, logits_dtype=BF16)
    assert float(out[0, 0]) == want
    assert fm.encode_scalar(exact_logit(_deq_fp8(q8)[0], _deq_fp8(k8)[0], w[0]), fm.BF16, fm.IEEE_RNE) == \
        int(_codes(out[0:1, 0])[0])
    if w0:
        assert cap.last.stats.get("fraction") == 1
    with dg.numerics(arch="ascend950"):  # the same tie on DeepGEMM-Ascend (bf16 weights, scales 1.0)
        pairs = np.full((1, 8, 2), 0x7F7F, np.int16)
        out2 = att.fp8_fp4_mqa_logits((q8, pairs), (k8, np.full((1, 2), 0x7F7F, np.int16)), _bf16(w), ks, ke, 1)
    assert float(out2[0, 0]) == want


def test_f32_tie():
    """1 + 2^-24 (w = 2^-12 on x = 2^12 + 2^-12) rounds to 1.0 in float32; 1 + 3 * 2^-24 up."""
    heads, d = 8, 32
    for low, want in ((1, 1.0), (3, 1 + 2**-22)):
        k = np.zeros(d, np.float32)
        k[:2] = [64, 2**-6]
        q = np.zeros((1, heads, d), np.float32)
        q[0, 0, :2] = [64, low * 2**-6]
        w = np.zeros((1, heads), np.float32)
        w[0, 0] = 2**-12
        out = att.fp8_fp4_mqa_logits((_e4m3(q), None), (_e4m3(k[None]), np.ones(1, np.float32)), w,
                                     np.zeros(1, np.int32), np.ones(1, np.int32))
        assert float(out[0, 0]) == want


# ---------------------------------------------------------------------------------------------
# device models: each target's reduction order, against scalar transcriptions of the spec
# ---------------------------------------------------------------------------------------------

def _model_inputs(seq, seq_kv, heads, d, seed):
    """Values whose per-head dot products are exact in float32 (so the fp32 model's x is exact):
    e4m3 values with 4 significant bits in [1/8, 8]."""
    rng = np.random.default_rng(seed)
    vals = (rng.integers(8, 16, (seq, heads, d)) / 8 * np.exp2(rng.integers(-3, 3, (seq, heads, d)))
            * rng.choice([-1, 1], (seq, heads, d)))
    kv = rng.integers(8, 16, (seq_kv, d)) / 8 * np.exp2(rng.integers(-3, 3, (seq_kv, d))) * rng.choice([-1, 1], (seq_kv, d))
    return _e4m3(vals), _e4m3(kv)


@pytest.mark.parametrize("case,fp4", [("sm100_f32", False), ("sm100_f32", True), ("sm100_bf16", False),
                                      ("sm100_bf16", True), ("sm90", False)])  # FP4 is sm100 only
def test_cuda_models_follow_the_reduction_order(case, fp4):
    arch = "sm90" if case == "sm90" else "sm100"
    seq, seq_kv, heads, d = 3, 21, (32 if arch == "sm90" else 16), 64
    q8, k8 = _model_inputs(seq, seq_kv, heads, d, 61)
    w = _rand((seq, heads), 62, BF16 if case == "sm100_bf16" else np.float32)
    out_dtype = BF16 if case == "sm100_bf16" else np.float32
    rng = np.random.default_rng(63)
    if fp4:  # E2M1 values with per-32 power-of-two scales (the x_h stay exact in float32)
        qc, kc = rng.integers(0, 16, (seq, heads, d)), rng.integers(0, 16, (seq_kv, d))
        qb, kb = rng.integers(124, 130, (seq, heads, 4)), rng.integers(124, 130, (seq_kv, 4))
        q_in = (fm.pack_fp4(qc).astype(np.int8), fm.pack_ue8m0_int32(qb)[..., 0])
        kv_in = (fm.pack_fp4(kc).astype(np.int8), fm.pack_ue8m0_int32(kb)[..., 0])
        qdeq = fm.decode(qc, fm.E2M1) * np.repeat(fm.ue8m0_decode(qb[..., :d // 32]), 32, axis=-1)
        kdeq = fm.decode(kc, fm.E2M1) * np.repeat(fm.ue8m0_decode(kb[..., :d // 32]), 32, axis=-1)
        s = None
    else:
        sf = (np.random.default_rng(64).random(seq_kv) + 0.5).astype(np.float32)
        q_in, kv_in = (q8, None), (k8, sf)
        qdeq, kdeq, s = _deq_fp8(q8), _deq_fp8(k8), sf
    ks, ke = np.zeros(seq, np.int32), np.full(seq, seq_kv, np.int32)
    for model in ("fp32", dg.Limited(24, 128)):  # 24 bits of an exact-in-f32 sum lose nothing
        with dg.numerics(arch=arch, accumulation=model):
            out = att.fp8_fp4_mqa_logits(q_in, kv_in, w, ks, ke, logits_dtype=out_dtype)
        fn = {"sm100_f32": ref_sm100_f32, "sm100_bf16": ref_sm100_bf16, "sm90": ref_sm90}[case]
        for i in range(seq):
            for j in range(seq_kv):
                x = [float(ref.exact_dot(qdeq[i, h], kdeq[j])) for h in range(heads)]
                want = fn(x, w[i].astype(np.float64), None if s is None else s[j])
                want_code = fm.encode_scalar(F(want), OUT[np.dtype(out_dtype)], fm.IEEE_RNE)
                assert int(_codes(out[i:i + 1, j])[0]) == want_code, (model, i, j)


@pytest.mark.parametrize("fused", [True, False])
def test_ascend_model_follows_the_bf16_chain(fused, monkeypatch):
    seq, seq_kv, heads, d = 3, 19, 12, 64
    q8, k8 = _model_inputs(seq, seq_kv, heads, d, 71)
    w = _rand((seq, heads), 72, BF16)
    ones_q = np.full((seq, heads, 1), 0x7F7F, np.int16)
    ones_k = np.full((seq_kv, 1), 0x7F7F, np.int16)
    monkeypatch.setattr(att, "ASCEND_BF16_MULA_FUSED", fused)
    ks, ke = np.zeros(seq, np.int32), np.full(seq, seq_kv, np.int32)
    with dg.numerics(arch="ascend950", accumulation="fp32"):
        out = att.fp8_fp4_mqa_logits((q8, ones_q), (k8, ones_k), w, ks, ke, seq_kv)
    qdeq, kdeq = _deq_fp8(q8), _deq_fp8(k8)
    differs = 0
    for i in range(seq):
        for j in range(seq_kv):
            x = [float(ref.exact_dot(qdeq[i, h], kdeq[j])) for h in range(heads)]
            want = ref_ascend(x, w[i].astype(np.float64), fused)
            assert float(out[i, j]) == want, (i, j)
            differs += want != ref_ascend(x, w[i].astype(np.float64), not fused)
    assert differs  # the two conventions are distinguishable on these inputs


def test_models_differ_from_exact_but_stay_close():
    seq, seq_kv, heads, d = 8, 64, 32, 128
    _, _, q8, (kv8, sf) = _fp8_inputs(seq, seq_kv, heads, d, 81)
    w = _rand((seq, heads), 82)
    ks, ke = np.zeros(seq, np.int32), np.full(seq, seq_kv, np.int32)
    outs = {}
    for arch in ("sm90", "sm100"):
        for model in ("exact", "fp32", dg.Limited(13, 128)):
            with dg.numerics(arch=arch, accumulation=model):
                outs[arch, str(model)] = att.fp8_fp4_mqa_logits((q8, None), (kv8, sf), w, ks, ke).astype(np.float64)
    exact = outs["sm100", "exact"]
    assert np.array_equal(exact, outs["sm90", "exact"])
    for key, v in outs.items():
        assert calc_diff(v, exact) < (5e-6 if key[1].startswith("limited") else 1e-9), key
    assert calc_diff(outs["sm90", "limited(13, 128)"], exact) > 1e-9  # 13 bits do show
    assert not np.array_equal(outs["sm100", "fp32"], exact)
    assert not np.array_equal(outs["sm90", "fp32"], outs["sm100", "fp32"])


# ---------------------------------------------------------------------------------------------
# properties
# ---------------------------------------------------------------------------------------------

def test_weights_enter_linearly():
    """logit(w) = sum_h w_h * logit(e_h), checked in exact arithmetic: with small-integer data
    every single-head logit s_j relu(x_h) is exact in float32, so the weighted sum is computed
    from the kernel's own outputs in rationals and rounded once."""
    seq, seq_kv, heads, d = 2, 17, 8, 32
    q8, k8 = _model_inputs(seq, seq_kv, heads, d, 91)
    sf = np.exp2(np.random.default_rng(92).integers(-3, 3, seq_kv)).astype(np.float32)
    ks, ke = np.zeros(seq, np.int32), np.full(seq, seq_kv, np.int32)
    basis = []
    for h in range(heads):
        e = np.zeros((seq, heads), np.float32)
        e[:, h] = 1
        basis.append(np.asarray(att.fp8_fp4_mqa_logits((q8, None), (k8, sf), e, ks, ke), np.float64))
    for seed in range(3):
        w = _rand((seq, heads), 93 + seed) * np.float32(7.3)
        out = att.fp8_fp4_mqa_logits((q8, None), (k8, sf), w, ks, ke)
        for i in range(seq):
            for j in range(seq_kv):
                v = sum((F(float(w[i, h])) * F(basis[h][i, j]) for h in range(heads)), F(0))
                assert int(_codes(out[i:i + 1, j])[0]) == fm.encode_scalar(v, fm.F32, fm.IEEE_RNE)


@settings(max_examples=12)
@given(seed=st.integers(0, 2**16), heads=st.sampled_from([8, 16]), d=st.sampled_from([32, 64]),
       seq=st.integers(1, 4), seq_kv=st.integers(1, 24), bf16_out=st.booleans())
def test_property_exact_random_ranges(seed, heads, d, seq, seq_kv, bf16_out):
    rng = np.random.default_rng(seed)
    _, _, q8, (kv8, sf) = _fp8_inputs(seq, seq_kv, heads, d, seed)
    w = _rand((seq, heads), seed + 7) * np.float32(rng.choice([1e-3, 1.0, 1e3]))
    a = rng.integers(0, seq_kv + 1, seq)
    b = rng.integers(0, seq_kv + 1, seq)
    ks, ke = np.minimum(a, b).astype(np.int32), np.maximum(a, b).astype(np.int32)
    out = att.fp8_fp4_mqa_logits((q8, None), (kv8, sf), w, ks, ke, logits_dtype=BF16 if bf16_out else np.float32)
    _check_exact(out, _deq_fp8(q8), _deq_fp8(kv8), w, ks, ke, False, s=sf)


def test_results_do_not_depend_on_task_size(monkeypatch):
    seq, seq_kv, heads, d = 9, 700, 16, 64
    _, _, q8, (kv8, sf) = _fp8_inputs(seq, seq_kv, heads, d, 101)
    w = _rand((seq, heads), 102)
    ks = np.array([0, 0, 5, 100, 300, 0, 600, 650, 0], np.int32)
    ke = np.array([700, 1, 600, 101, 700, 350, 700, 651, 0], np.int32)
    runs = []
    for budget in (1 << 21, 4096, 777):
        monkeypatch.setattr(att, "TASK_ELEMENTS", budget)
        for model in ("exact", "fp32"):
            with dg.numerics(accumulation=model):
                runs.append((model, att.fp8_fp4_mqa_logits((q8, None), (kv8, sf), w, ks, ke, clean_logits=False)))
    for model in ("exact", "fp32"):
        got = [np.asarray(o).tobytes() for m, o in runs if m == model]
        assert got[0] == got[1] == got[2]


# ---------------------------------------------------------------------------------------------
# paged: KV caches assembled byte by byte
# ---------------------------------------------------------------------------------------------

def _pages_cuda(tokens_fp8, scales, fp4, block_kv, order):
    """DeepGEMM's fused cache: per block, block_kv tokens' value bytes, then block_kv scale words."""
    n_tok, width = tokens_fp8.shape
    num_blocks = n_tok // block_kv
    vals = np.ascontiguousarray(tokens_fp8).view(np.uint8).reshape(num_blocks, block_kv * width)
    sc = np.ascontiguousarray(scales).view(np.uint8).reshape(num_blocks, block_kv * 4)
    blocks = np.concatenate([vals, sc], axis=1)  # logical block b
    cache = np.empty_like(blocks)
    cache[order] = blocks  # logical block b lives in physical slot order[b]
    return cache.reshape(num_blocks, block_kv, 1, width + 4)


def _pages_ascend(data, pairs, page, order, nz):
    n_tok = data.shape[0]
    vb = data.shape[1]
    num = n_tok // page
    vals = np.ascontiguousarray(data).view(np.uint8).reshape(num, page, vb)
    sc = np.ascontiguousarray(pairs).view(np.uint8).reshape(num, page, -1)
    if nz:  # 32-byte column fragments of all tokens; pairs per 16 tokens
        vals = vals.reshape(num, page, vb // 32, 32).transpose(0, 2, 1, 3)
        p = sc.shape[2] // 2
        sc = sc.reshape(num, page // 16, 16, p, 2).transpose(0, 1, 3, 2, 4)
    blocks = np.concatenate([vals.reshape(num, -1), sc.reshape(num, -1)], axis=1)
    cache = np.empty_like(blocks)
    cache[order] = blocks
    return cache.reshape(num, page, 1, -1)


def _paged_case(seed, batch, next_n, block_kv, fp4, heads=8, d=64, varlen=False):
    rng = np.random.default_rng(seed)
    rows = batch * next_n
    ctx_last = rng.integers(0, 5 * block_kv, batch)
    if varlen:
        per = rng.integers(1, 4, batch)
        req = np.repeat(np.arange(batch), per)
        rows = req.size
        offs = np.concatenate([np.arange(n) for n in per])
        ctx_rows = ctx_last[req] + offs
        ctx = ctx_rows.reshape(rows, 1).astype(np.int32)
        pages = -(-(ctx_last + per - 1) // block_kv)
    else:
        ctx = (rng.random((batch, next_n)) * (ctx_last[:, None] + 1)).astype(np.int32)
        ctx[:, -1] = ctx_last
        pages = -(-ctx_last // block_kv)
    total_pages = int(pages.sum()) + 3
    maxp = int(pages.max()) + 2
    order = rng.permutation(total_pages)
    table = np.zeros((batch, maxp), np.int32)
    o = 0
    for b in range(batch):
        table[b, :pages[b]] = order[o:o + pages[b]]
        o += pages[b]
    kvf = _rand((total_pages * block_kv, d), seed + 1, BF16)
    if fp4:
        kp, ksf = dg.per_token_cast_to_fp4(kvf, use_ue8m0=True, gran_k=32, use_packed_ue8m0=True)
        token_bytes, token_sf = kp, ksf.reshape(-1)
    else:
        k8, sf = dg.per_custom_dims_cast_to_fp8(kvf, (0,), False)
        token_bytes, token_sf = k8, sf
    # logical page p of the pool is physical page p here; the table picks pages from the pool
    cache = _pages_cuda(token_bytes, token_sf, fp4, block_kv, np.arange(total_pages))
    if varlen:
        table = np.repeat(table, per, axis=0)
        idx = req.astype(np.int32)
    else:
        idx = None
    q = _rand((rows // (1 if varlen else next_n), 1 if varlen else next_n, heads, d), seed + 2, BF16)
    if fp4:
        qp, qs = dg.per_token_cast_to_fp4(q.reshape(-1, d), use_ue8m0=True, gran_k=32, use_packed_ue8m0=True)
        q_in = (qp.reshape(*q.shape[:3], d // 2), qs.reshape(q.shape[:3]))
    else:
        q_in = (_e4m3(q.astype(np.float32)), None)
    w = _rand((rows, heads), seed + 3)
    return dict(q=q_in, cache=cache, w=w, ctx=ctx, table=table, idx=idx, tokens=(token_bytes, token_sf),
                max_len=maxp * block_kv, q_bf16=q, kv_bf16=kvf)


def _paged_call(c, block_kv, **kw):
    meta = att.get_paged_mqa_logits_metadata(c["ctx"], block_kv, dg.get_num_sms(), c["idx"])
    return att.fp8_fp4_paged_mqa_logits(c["q"], c["cache"], c["w"], c["ctx"], c["table"], meta, c["max_len"],
                                        indices=c["idx"], **kw)


def _plain_equivalent(c, fp4, **kw):
    """The plain kernel on the same tokens: each request's pages concatenated, compressed rows."""
    table, ctx = c["table"], c["ctx"].reshape(-1)
    page = c["cache"].shape[1]
    rows = ctx.size
    nn = c["q"][0].shape[1]
    reqs = [(r, min(r + nn, rows)) for r in range(0, rows, nn)] if c["idx"] is None else \
        [(int(s), int(s + n)) for s, n in zip(*np.unique(c["idx"], return_index=True, return_counts=True)[1:],
                                               strict=True)]
    tok, sf = c["tokens"]
    parts, psf, ks, ke = [], [], np.zeros(rows, np.int32), np.zeros(rows, np.int32)
    base = 0
    for s, e in reqs:
        bt_row = s if c["idx"] is not None else s // nn
        L = int(ctx[e - 1])
        pages = table[bt_row, :-(-L // page)]
        ids = (pages[:, None] * page + np.arange(page)[None, :]).reshape(-1)[:L]
        parts.append(tok[ids])
        psf.append(sf[ids])
        ks[s:e] = base
        ke[s:e] = base + ctx[s:e]
        base += L
    kv = (np.concatenate(parts) if parts else tok[:0], np.concatenate(psf) if psf else sf[:0])
    qd, qs = c["q"]
    qd = qd.reshape(rows, *qd.shape[2:])
    qs = None if qs is None else qs.reshape(rows, -1)
    max_k = max(int((ke - ks).max(initial=0)), 1)
    return att.fp8_fp4_mqa_logits((qd, qs), kv, c["w"], ks, ke, clean_logits=False, max_seqlen_k=max_k, **kw)


@pytest.mark.parametrize("fp4,block_kv,next_n,varlen", [
    (False, 64, 1, False), (False, 32, 3, False), (True, 64, 2, False), (True, 32, 1, True), (False, 64, 1, True),
])
def test_paged_equals_plain_on_the_same_tokens(fp4, block_kv, next_n, varlen):
    c = _paged_case(111, 5, next_n, block_kv, fp4, varlen=varlen)
    with trace.capture() as cap:
        out = _paged_call(c, block_kv, logits_dtype=np.float32)
    ctx = c["ctx"].reshape(-1)
    rows = ctx.size
    assert out.shape == (rows, c["max_len"])
    assert out.strides[0] == 4 * _align(_align(c["max_len"], 256), 256)
    defined = np.arange(c["max_len"])[None, :] < ctx[:, None]
    assert np.array_equal(cap.last.defined, defined)
    assert np.isnan(out[~defined]).all() and np.isfinite(out[defined]).all()
    plain = _plain_equivalent(c, fp4)
    width = min(plain.shape[1], out.shape[1])
    mask = defined[:, :width]
    assert np.array_equal(_codes(out[:, :width])[mask], _codes(plain[:, :width])[mask])


def _align(a, b):
    return -(-a // b) * b


def test_paged_exact_vs_fractions_and_block_permutation():
    block_kv, fp4 = 32, False
    c = _paged_case(121, 3, 2, block_kv, fp4)
    out = _paged_call(c, block_kv)
    tok, sf = c["tokens"]
    ctx = c["ctx"].reshape(-1)
    qdeq = _deq_fp8(c["q"][0]).reshape(ctx.size, 8, 64)
    for i in range(ctx.size):
        b = i // 2
        for p in range(int(ctx[i])):
            t = int(c["table"][b, p // block_kv]) * block_kv + p % block_kv
            want = fm.encode_scalar(exact_logit(qdeq[i], _deq_fp8(tok[t]), c["w"][i], sf[t]), fm.F32, fm.IEEE_RNE)
            assert int(_codes(out[i:i + 1, p])[0]) == want
    # Permute the physical blocks and the table with them: nothing changes (NaN positions included).
    num = c["cache"].shape[0]
    perm = np.random.default_rng(122).permutation(num)
    cache2 = np.empty_like(c["cache"])
    cache2[perm] = c["cache"]
    c2 = dict(c, cache=cache2, table=perm[c["table"]].astype(np.int32))
    assert np.asarray(_paged_call(c2, block_kv)).tobytes() == np.asarray(out).tobytes()


@pytest.mark.parametrize("fp4", [False, True])
@pytest.mark.parametrize("page,nz", [(64, False), (64, True), (128, True), (128, False)])
def test_ascend_paged_layouts(fp4, page, nz):
    rng = np.random.default_rng(131)
    heads, d, batch = 8, 128, 4
    per = rng.integers(1, 3, batch)
    req = np.repeat(np.arange(batch), per)
    rows = req.size
    last = rng.integers(0, 3 * page, batch)
    ctx_rows = (last[req] + np.concatenate([np.arange(n) for n in per])).astype(np.int32)
    pages = -(-(last + per - 1) // page)
    total = int(pages.sum()) + 2
    tokens = _rand((total * page, d), 132) * np.float32(3)
    data, pairs, deq = _ascend_quant(tokens, fp4)
    order = rng.permutation(total)
    cache = _pages_ascend(data, pairs, page, order, nz)
    table = np.zeros((batch, int(pages.max()) + 1), np.int32)
    o = 0
    for b in range(batch):
        table[b, :pages[b]] = order[o:o + pages[b]]  # logical pool page o.. lives at order[o..]
        o += pages[b]
    logical = np.argsort(order)  # physical slot -> logical pool page
    table = np.repeat(table, per, axis=0)
    q = _rand((rows, 1, heads, d), 133)
    qd, qpairs, qdeq = _ascend_quant(q, fp4)
    w = _rand((rows, heads), 134, BF16)
    ctx = ctx_rows.reshape(rows, 1)
    idx = req.astype(np.int32)
    max_len = int(table.shape[1] * page)
    with dg.numerics(arch="ascend950"):
        meta = att.get_paged_mqa_logits_metadata(ctx, heads, idx)
        out = att.fp8_fp4_paged_mqa_logits((qd, qpairs.reshape(rows, 1, heads, -1)), cache, w, ctx, table, meta,
                                           max_len, idx, use_ascend_kv_layout=nz)
    assert out.dtype == BF16 and out.strides[0] == 2 * _align(max_len, 256)
    first = {int(r): int(np.flatnonzero(req == r)[0]) for r in range(batch)}
    for i in range(rows):
        brow = first[int(req[i])]
        L = int(ctx_rows[i])
        # every position is checked against the plain kernel below; the rational reference takes a
        # sample: page boundaries, the last position and a few others
        sample = {p for p in range(L) if p % page in (0, page - 1) or p == L - 1} | set(range(0, L, 37))
        for p in sorted(sample):
            t = int(logical[table[brow, p // page]]) * page + p % page
            want = fm.encode_scalar(exact_logit(qdeq[i, 0], deq[t], w[i].astype(np.float64), head_fmt=fm.BF16),
                                    fm.BF16, fm.IEEE_RNE)
            assert int(_codes(out[i:i + 1, p])[0]) == want, (i, p)
        assert np.isnan(out.astype(np.float32)[i, int(ctx_rows[i]):]).all()
    # the plain kernel on the same tokens (gathered through the table) agrees everywhere defined
    base, parts, ks, ke = 0, [], np.zeros(rows, np.int32), np.zeros(rows, np.int32)
    for b in range(batch):
        rr = np.flatnonzero(req == b)
        L = int(ctx_rows[rr[-1]])
        ids = np.array([int(logical[table[rr[0], p // page]]) * page + p % page for p in range(L)], np.int64)
        parts.append(ids)
        ks[rr], ke[rr] = base, base + ctx_rows[rr]
        base += L
    ids = np.concatenate(parts)
    with dg.numerics(arch="ascend950"):
        plain = att.fp8_fp4_mqa_logits((qd[:, 0], qpairs.reshape(rows, heads, -1)), (data[ids], pairs[ids]), w, ks, ke,
                                       max(int((ke - ks).max()), 1))
    mask = np.arange(plain.shape[1])[None, :] < ctx_rows[:, None]
    assert np.array_equal(_codes(out[:, :plain.shape[1]])[mask], _codes(plain)[mask])


# ---------------------------------------------------------------------------------------------
# schedules (get_paged_mqa_logits_metadata), re-derived from the spec's text
# ---------------------------------------------------------------------------------------------

def spec_sm100_schedule(ctx_rows, next_n, num_sms, indices=None):
    rows = len(ctx_rows)
    reqs = []
    if indices is None:
        reqs = [(s, next_n) for s in range(0, rows, next_n)]
    else:
        s = 0
        while s < rows:
            e = s
            while e + 1 < rows and indices[e + 1] == indices[s]:
                e += 1
            reqs.append((s, e - s + 1))
            s = e + 1
    work = [-(-int(ctx_rows[s + n - 1]) // 256) * n for s, n in reqs]
    total = sum(work)
    out = []
    for sm in range(num_sms + 1):
        unit = sm * (total // num_sms) + min(sm, total % num_sms)
        before, row = 0, (rows, 0)
        for (s, n), wk in zip(reqs, work, strict=True):
            if unit < before + wk:
                row = (s, (unit - before) // n)
                break
            before += wk
        out.append(row)
    return np.array(out, np.int32)


def spec_sm90_schedule(ctx2d, num_sms):
    batch, next_n = ctx2d.shape
    atoms = -(-next_n // (2 if next_n >= 2 else 1))
    segs = [-(-int(ctx2d[b, -1]) // 256) for b in range(batch)]
    total = sum(segs) * atoms
    q, r = divmod(total, num_sms)
    out = []
    for sm in range(num_sms):
        unit = sm * q + max(sm - (num_sms - r), 0)
        before, row = 0, (batch * atoms, 0)
        for b in range(batch):
            if unit < before + segs[b] * atoms:
                off = unit - before
                row = (b * atoms + off // segs[b], off % segs[b])
                break
            before += segs[b] * atoms
        out.append(row)
    out.append((batch * atoms, 0))
    return np.array(out, np.int32)


def spec_ascend_schedule(ctx_rows, indices, heads, cores):
    tile = 64 // heads
    reqs, s = [], 0
    while s < len(ctx_rows):
        e = s
        while e + 1 < len(ctx_rows) and indices[e + 1] == indices[s]:
            e += 1
        reqs.append((s, e - s + 1, int(ctx_rows[e])))
        s = e + 1

    def cost(nq, n):
        c0 = 2 + 2 * -(-nq // tile) if tile > 1 else -(-nq // tile)
        return -(-n // 128) * c0 + 2

    costs = [0 if L == 0 else (-(-L // 512) - 1) * cost(nq, 512) + cost(nq, L - 512 * (-(-L // 512) - 1))
             for _, nq, L in reqs]
    total = sum(costs)
    out = []
    for c in range(cores + 1):
        t = c * (total // cores) + min(c, total % cores)
        row = (len(ctx_rows), 0)
        before = 0
        if t < total:
            for (s0, nq, L), co in zip(reqs, costs, strict=True):
                if t < before + co:
                    row = (s0, min((t - before) // cost(nq, 512), -(-L // 512) - 1))
                    break
                before += co
        out.append(row)
    return np.array(out, np.int32)


@settings(max_examples=40)
@given(seed=st.integers(0, 10**6), batch=st.integers(0, 40), next_n=st.integers(1, 4), num_sms=st.integers(1, 148),
       scale=st.sampled_from([1, 300, 5000]))
def test_sm100_schedule_matches_spec(seed, batch, next_n, num_sms, scale):
    rng = np.random.default_rng(seed)
    ctx = rng.integers(0, scale + 1, (batch, next_n)).astype(np.int32)
    meta = att.get_paged_mqa_logits_metadata(ctx, 64, num_sms)
    assert meta.dtype == np.int32 and meta.shape == (num_sms + 1, 2)
    assert np.array_equal(meta, spec_sm100_schedule(ctx.reshape(-1), next_n, num_sms))
    if next_n == 1 and batch:
        idx = np.sort(rng.integers(0, max(1, batch // 3), batch)).astype(np.int32)
        meta = att.get_paged_mqa_logits_metadata(ctx, 32, num_sms, idx)
        assert np.array_equal(meta, spec_sm100_schedule(ctx.reshape(-1), 1, num_sms, idx))


@settings(max_examples=40)
@given(seed=st.integers(0, 10**6), batch=st.integers(0, 40), next_n=st.integers(1, 3), num_sms=st.integers(1, 132),
       scale=st.sampled_from([1, 300, 5000]))
def test_sm90_schedule_matches_spec(seed, batch, next_n, num_sms, scale):
    if batch % 32 == 0 and scale == 1:
        batch += 1  # (the all-empty, batch % 32 == 0 corner reads past the prefix sums on the device)
    ctx = np.random.default_rng(seed).integers(0, scale + 1, (batch, next_n)).astype(np.int32)
    with dg.numerics(arch="sm90"):
        meta = att.get_paged_mqa_logits_metadata(ctx, 64, num_sms)
    assert np.array_equal(meta, spec_sm90_schedule(ctx, num_sms))


@settings(max_examples=40)
@given(seed=st.integers(0, 10**6), rows=st.integers(0, 60), heads=st.sampled_from([4, 8, 12, 24, 48, 64]),
       cores=st.integers(1, 32), scale=st.sampled_from([1, 600, 5000]))
def test_ascend_schedule_matches_spec(seed, rows, heads, cores, scale):
    rng = np.random.default_rng(seed)
    ctx = rng.integers(0, scale + 1, (rows, 1)).astype(np.int32)
    idx = np.sort(rng.integers(0, max(1, rows // 2), rows)).astype(np.int32)
    with dg.numerics(arch="ascend950"):
        dg.set_num_sms(cores)
        meta = att.get_paged_mqa_logits_metadata(ctx, heads, idx)
    assert meta.shape == (cores + 1, 2)
    assert np.array_equal(meta, spec_ascend_schedule(ctx.reshape(-1), idx, heads, cores))


def test_schedule_spec_examples():
    """Hand-worked sm100 example: 2 requests of 2 rows, contexts 300 and 10 -> work 4 and 2 units."""
    ctx = np.array([[5, 300], [10, 10]], np.int32)
    meta = att.get_paged_mqa_logits_metadata(ctx, 64, 3)
    # units 0..5: SM0 starts at 0 (request 0, split 0), SM1 at 2 (request 0, split 1), SM2 at 4 (request 1, split 0)
    assert meta.tolist() == [[0, 0], [0, 1], [2, 0], [4, 0]]


def test_logits_do_not_depend_on_the_schedule():
    c = _paged_case(141, 4, 2, 64, False)
    first = np.asarray(_paged_call(c, 64)).tobytes()
    dg.set_num_sms(7)
    assert np.asarray(_paged_call(c, 64)).tobytes() == first


def test_malformed_schedule_is_rejected():
    c = _paged_case(151, 3, 1, 64, False)
    meta = att.get_paged_mqa_logits_metadata(c["ctx"], 64, dg.get_num_sms())
    args = lambda m: (c["q"], c["cache"], c["w"], c["ctx"], c["table"], m, c["max_len"])  # noqa: E731
    for bad, msg in ((meta[:-1], "shape"), (meta.astype(np.int64), "int32"),
                     (np.asfortranarray(np.repeat(meta, 2, axis=1))[:, ::2], "contiguous"),
                     (att.get_paged_mqa_logits_metadata(c["ctx"], 64, dg.get_num_sms() - 1), "shape")):
        with pytest.raises(DGArgumentError, match=f"schedule_meta: expected.*{msg}"):
            att.fp8_fp4_paged_mqa_logits(*args(bad))
    stale = meta.copy()
    stale[1, 1] += 1
    with pytest.raises(DGArgumentError, match="schedule_meta: expected the schedule get_paged_mqa_logits_metadata"):
        att.fp8_fp4_paged_mqa_logits(*args(stale))
    other = c["ctx"].copy()
    other[0, 0] += 256
    with pytest.raises(DGArgumentError, match="schedule_meta"):
        att.fp8_fp4_paged_mqa_logits(*args(att.get_paged_mqa_logits_metadata(other, 64, dg.get_num_sms())))


# ---------------------------------------------------------------------------------------------
# DeepGEMM's own checks on inputs made as its tests make them (scaled down)
# ---------------------------------------------------------------------------------------------

def ref_mqa_logits(q, kv, w, ks, ke):
    """tests/test_attention.py's ref_fp8_mqa_logits in NumPy float32: -inf outside [ks, ke)."""
    score = np.einsum("mhd,nd->hmn", q.astype(np.float32), kv.astype(np.float32))
    logits = np.einsum("hmn,hm->mn", np.maximum(score, 0), w.astype(np.float32).T)
    cols = np.arange(kv.shape[0])[None, :]
    mask = (cols >= ks[:, None]) & (cols < ke[:, None])
    return np.where(mask, logits, -np.inf)


def _ks_ke(seq, seq_kv, cp):
    if not cp:
        return np.zeros(seq, np.int32), (np.arange(seq) + seq_kv - seq).astype(np.int32)
    chunk, cp_size = seq // 2, seq_kv // seq
    cp_id = cp_size // 3
    ks, ke = np.zeros(seq, np.int32), np.zeros(seq, np.int32)
    for i in range(chunk):
        ke[i] = cp_id * chunk + i
        ke[i + chunk] = (cp_size * 2 - 1 - cp_id) * chunk + i
    return ks, ke


_DTYPES = [(np.float32, np.float32), (BF16, np.float32), (BF16, BF16)]
_STYLE_CASES = ([("sm100", 16, 64, fp4, *dt) for fp4 in (False, True) for dt in _DTYPES]
                + [("sm100", 8, 128, fp4, *dt) for fp4 in (False, True) for dt in _DTYPES[:2]]
                + [("sm90", 32, 64, False, *dt) for dt in _DTYPES[:2]])  # sm90: FP8, float32 weights


@pytest.mark.parametrize("arch,heads,d,fp4,logits_dtype,weights_dtype", _STYLE_CASES)
@pytest.mark.parametrize("compressed,cp", [(False, False), (True, True)])
def test_deepgemm_style_plain(arch, heads, d, fp4, logits_dtype, weights_dtype, compressed, cp):
    seq, seq_kv = 32, 256
    if fp4:
        q, kv, q_in, kv_in = _fp4_inputs(seq, seq_kv, heads, d, 161)
        q_sim = _deq_fp4(*q_in, d).astype(np.float32).astype(BF16)
        kv_sim = _deq_fp4(kv_in[0], kv_in[1], d).astype(np.float32).astype(BF16)
    else:
        q, kv, q8, kv_in = _fp8_inputs(seq, seq_kv, heads, d, 161)
        q_in = (q8, None)
        q_sim = q8.astype(np.float32).astype(BF16)
        kv_sim = (kv_in[0].astype(np.float32) * kv_in[1][:, None]).astype(BF16)
    weights = _rand((seq, heads), 162)
    kernel_w = weights.astype(weights_dtype)
    ks, ke = _ks_ke(seq, seq_kv, cp)
    ref_logits = ref_mqa_logits(q, kv, kernel_w, ks, ke)
    sim_logits = ref_mqa_logits(q_sim, kv_sim, kernel_w, ks, ke)
    max_k = int((ke - ks).max()) if compressed else 0
    with dg.numerics(arch=arch):
        logits = att.fp8_fp4_mqa_logits(q_in, kv_in, kernel_w, ks, ke, clean_logits=not compressed,
                                        max_seqlen_k=max_k, logits_dtype=logits_dtype)
    logits = np.asarray(logits, np.float32)
    if compressed:
        assert logits.shape == (seq, max_k)
        full = np.full((seq, seq_kv), -np.inf, np.float32)
        for i in range(seq):
            full[i, ks[i]:ke[i]] = logits[i, :ke[i] - ks[i]]
        logits = full
    neginf = ref_logits == -np.inf
    assert np.array_equal(logits == -np.inf, neginf)
    logits, ref_logits, sim_logits = (np.where(neginf, 0, x) for x in (logits, ref_logits, sim_logits))
    assert calc_diff(logits, ref_logits) < (0.02 if fp4 else 1e-3)
    has_bf16 = weights_dtype == BF16 or logits_dtype == BF16
    assert calc_diff(logits, sim_logits) < (3e-5 if has_bf16 else 5e-6)


@pytest.mark.parametrize("fp4,block_kv,next_n,varlen", [(False, 64, 2, False), (True, 32, 1, True),
                                                        (False, 32, 1, True), (True, 64, 3, False)])
def test_deepgemm_style_paged(fp4, block_kv, next_n, varlen):
    heads, d = 16, 64
    c = _paged_case(171, 6, next_n, block_kv, fp4, heads=heads, d=d, varlen=varlen)
    out = np.asarray(_paged_call(c, block_kv, logits_dtype=BF16), np.float32)
    ctx = c["ctx"].reshape(-1)
    rows = ctx.size
    tok, sf = c["tokens"]
    deq_tok = _deq_fp4(tok, sf, d) if fp4 else _deq_fp8(tok, sf)
    qdeq = (_deq_fp4(*c["q"], d) if fp4 else _deq_fp8(c["q"][0])).reshape(rows, heads, d)
    sim_logits, ref_logits = np.zeros_like(out), np.zeros_like(out)
    q_bf16 = c["q_bf16"].reshape(rows, heads, d)
    nn = 1 if varlen else next_n
    one = np.zeros(1, np.int32)
    for i in range(rows):
        brow = int(np.flatnonzero(c["idx"] == c["idx"][i])[0]) if varlen else i // nn
        L = int(ctx[i])
        ids = (c["table"][brow][:, None] * block_kv + np.arange(block_kv)).reshape(-1)[:L]
        sim_logits[i, :L] = ref_mqa_logits(qdeq[i:i + 1].astype(BF16), deq_tok[ids].astype(BF16), c["w"][i:i + 1],
                                           one, np.array([L], np.int32))[0]
        ref_logits[i, :L] = ref_mqa_logits(q_bf16[i:i + 1], c["kv_bf16"][ids], c["w"][i:i + 1], one,
                                           np.array([L], np.int32))[0]
    defined = np.arange(out.shape[1])[None, :] < ctx[:, None]  # compare only where defined
    got = np.where(defined, out, 0)
    assert calc_diff(got, np.where(defined, ref_logits, 0)) < (0.02 if fp4 else 1e-3)
    assert calc_diff(got, np.where(defined, sim_logits, 0)) < 3e-5  # bf16 logits


def test_sm90_paged_next_n_2():
    c = _paged_case(175, 4, 2, 64, False, heads=32, d=64)
    with dg.numerics(arch="sm90"):
        out = _paged_call(c, 64)
        plain = _plain_equivalent(c, False)
        meta = att.get_paged_mqa_logits_metadata(c["ctx"], 64, dg.get_num_sms())
    assert meta.shape == (133, 2)
    ctx = c["ctx"].reshape(-1)
    width = min(plain.shape[1], out.shape[1])
    mask = np.arange(width)[None, :] < ctx[:, None]
    assert np.array_equal(_codes(out[:, :width])[mask], _codes(plain[:, :width])[mask])
    with dg.numerics(arch="sm90"), pytest.raises(DGArgumentError, match="indices: expected None on sm90"):
        att.get_paged_mqa_logits_metadata(c["ctx"][:, :1].copy(), 64, 4, np.zeros(4, np.int32))


def test_trace_reports_value_error_scale_and_defined():
    """acc is the float64 logit (within the certified bound of the exact value) and S the error
    scale |s_j| sum_h |w_h| sum_d |q_hd k_d| rounded up; cleaned cells: acc -inf, S 0."""
    seq, seq_kv, heads, d = 3, 20, 8, 32
    _, _, q8, (kv8, sf) = _fp8_inputs(seq, seq_kv, heads, d, 177)
    w = _rand((seq, heads), 178)
    ks, ke = np.array([0, 5, 19], np.int32), np.array([20, 12, 19], np.int32)
    with trace.capture(want_acc=True, want_S=True) as cap:
        out = att.fp8_fp4_mqa_logits((q8, None), (kv8, sf), w, ks, ke)
    rec = cap.last
    assert rec.func == "fp8_fp4_mqa_logits" and rec.defined.all()
    assert rec.acc.shape == rec.S.shape == out.shape
    qdeq, kdeq = _deq_fp8(q8), _deq_fp8(kv8)
    for i in range(seq):
        for j in range(seq_kv):
            if not ks[i] <= j < ke[i]:
                assert rec.acc[i, j] == -np.inf and rec.S[i, j] == 0
                continue
            exact = exact_logit(qdeq[i], kdeq[j], w[i], sf[j])
            assert abs(F(rec.acc[i, j]) - exact) <= abs(exact) * F(2) ** -50
            s_ref = abs(F(float(sf[j]))) * sum((abs(F(float(w[i, h]))) * sum(
                (abs(F(float(a)) * F(float(b))) for a, b in zip(qdeq[i, h], kdeq[j], strict=True)), F(0))
                for h in range(heads)), F(0))
            # the per-head error scales come from a float32 GEMM: within (1 + 2 gamma_{d+2}(2^-24)) (docs/numerics.md)
            assert s_ref <= F(rec.S[i, j]) <= s_ref * (1 + F(3 * (d + 2), 2**24))
    with dg.numerics(accumulation="fp32"), trace.capture(want_acc=True) as cap:
        out = att.fp8_fp4_mqa_logits((q8, None), (kv8, sf), w, ks, ke, clean_logits=False)
    inside = cap.last.defined
    assert np.array_equal(cap.last.acc[inside], np.asarray(out, np.float64)[inside])  # the model's float32 value
    assert np.isnan(cap.last.acc[~inside]).all()


# ---------------------------------------------------------------------------------------------
# memory: bounded whatever the lengths
# ---------------------------------------------------------------------------------------------

def test_peak_memory_is_output_plus_a_bound(monkeypatch):
    """The naive float64 per-head score tensor here is 128 MiB; the call stays within the output
    plus a bound proportional to the task size (default size: output + 256 MiB)."""
    seq, seq_kv, heads, d = 32, 8192, 64, 64
    _, _, q8, (kv8, sf) = _fp8_inputs(seq, seq_kv, heads, d, 181)
    w = _rand((seq, heads), 182)
    ks, ke = np.zeros(seq, np.int32), np.full(seq, seq_kv, np.int32)
    naive = seq * heads * seq_kv * 8
    out_bytes = seq * _align(seq_kv + 256, 256) * 4
    monkeypatch.setattr(att, "TASK_ELEMENTS", 1 << 18)  # 2 MiB of float64 per-head scores per task
    tracemalloc.start()
    try:
        att.fp8_fp4_mqa_logits((q8, None), (kv8, sf), w, ks, ke)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= out_bytes + 32 * 2**20 < naive, (peak, out_bytes)


@pytest.mark.slow
def test_peak_memory_default_tasks_large():
    seq, seq_kv, heads, d = 64, 65536, 64, 128
    _, _, q8, (kv8, sf) = _fp8_inputs(seq, seq_kv, heads, d, 183)
    w = _rand((seq, heads), 184)
    ks, ke = np.zeros(seq, np.int32), np.full(seq, seq_kv, np.int32)
    tracemalloc.start()
    try:
        out = att.fp8_fp4_mqa_logits((q8, None), (kv8, sf), w, ks, ke)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= out.base.nbytes + 256 * 2**20


# ---------------------------------------------------------------------------------------------
# API surface: signatures, strides, profiles, bad input
# ---------------------------------------------------------------------------------------------



def test_legacy_names_do_not_exist_on_ascend():
    with dg.numerics(arch="ascend950"):
        for name in ("fp8_mqa_logits", "fp8_paged_mqa_logits"):
            with pytest.raises(DGArgumentError, match=f"{name}: not provided by DeepGEMM-Ascend"):
                getattr(att, name)(None, None, None, None, None)


def test_legacy_wrappers_equal_the_fp8_fp4_names():
    _, _, q8, (kv8, sf) = _fp8_inputs(4, 30, 8, 32, 191)
    w = _rand((4, 8), 192)
    ks, ke = np.array([0, 2, 4, 8], np.int32), np.array([30, 9, 4, 30], np.int32)
    a = att.fp8_mqa_logits(q8, (kv8, sf), w, ks, ke)
    b = att.fp8_fp4_mqa_logits((q8, None), (kv8, sf), w, ks, ke, logits_dtype=np.float32)
    assert a.dtype == np.float32 and a.tobytes() == b.tobytes() and a.strides == b.strides
    c = _paged_case(193, 3, 1, 64, False)
    meta = att.get_paged_mqa_logits_metadata(c["ctx"], 64, dg.get_num_sms())
    p1 = att.fp8_paged_mqa_logits(c["q"][0], c["cache"], c["w"], c["ctx"], c["table"], meta, c["max_len"])
    p2 = att.fp8_fp4_paged_mqa_logits(c["q"], c["cache"], c["w"], c["ctx"], c["table"], meta, c["max_len"])
    assert np.asarray(p1).tobytes() == np.asarray(p2).tobytes()


@pytest.mark.parametrize("heads,seq,seq_kv,max_k,dtype,rows_alloc,stride", [
    (8, 7, 50, 0, np.float32, 16, 512),        # align(7, 16), align(50 + 256, 256)
    (64, 7, 50, 0, BF16, 8, 512),              # align(7, 2), align(306, 512)
    (16, 9, 1000, 300, np.float32, 16, 512),   # align(align(300, 256), 256)
    (32, 5, 1000, 300, BF16, 8, 512),
])
def test_output_is_a_view_of_deepgemm_s_padded_allocation(heads, seq, seq_kv, max_k, dtype, rows_alloc, stride):
    _, _, q8, (kv8, sf) = _fp8_inputs(seq, seq_kv, heads, 32, 201)
    w = _rand((seq, heads), 202)
    ks = np.zeros(seq, np.int32)
    ke = np.minimum(np.arange(seq) + 10, seq_kv).astype(np.int32)
    out = att.fp8_fp4_mqa_logits((q8, None), (kv8, sf), w, ks, ke, clean_logits=max_k == 0, max_seqlen_k=max_k,
                                 logits_dtype=dtype)
    item = np.dtype(dtype).itemsize
    assert out.shape == (seq, max_k or seq_kv) and out.strides == (stride * item, item)
    assert out.base is not None and out.base.shape == (rows_alloc, stride)


def test_clean_writes_neg_inf_where_the_clean_kernel_does():
    """smxx_clean_logits writes up to min(ceil(seq_kv / 8192) * 8192, stride) in the padded row."""
    _, _, q8, (kv8, sf) = _fp8_inputs(3, 100, 8, 32, 211)
    w = _rand((3, 8), 212)
    ks, ke = np.array([0, 10, 40], np.int32), np.array([100, 20, 40], np.int32)
    out = att.fp8_fp4_mqa_logits((q8, None), (kv8, sf), w, ks, ke)
    row = np.asarray(out.base, np.float32)
    assert row.shape == (16, 512)  # align(3, 128 / 8) rows, align(100 + 256, 256) columns
    assert np.isneginf(row[1, :10]).all() and np.isfinite(row[1, 10:20]).all() and np.isneginf(row[1, 20:]).all()
    assert np.isneginf(row[2, :]).all() and np.isnan(row[3:]).all()


def _snapshot(args):
    """Bytes of every array argument (inside pairs too): bad input must leave them untouched."""
    flat = {}
    for k, v in args.items():
        for j, x in enumerate(v if isinstance(v, tuple) else (v,)):
            if isinstance(x, np.ndarray):
                flat[k, j] = x.tobytes()
    return flat


def _good_plain():
    _, _, q8, (kv8, sf) = _fp8_inputs(4, 40, 8, 32, 221)
    return dict(q=(q8, None), kv=(kv8, sf), weights=_rand((4, 8), 222),
                cu_seq_len_k_start=np.array([0, 1, 2, 3], np.int32), cu_seq_len_k_end=np.array([40, 9, 2, 30], np.int32))


@pytest.mark.parametrize("change,match", [
    (lambda a: a.update(cu_seq_len_k_start=np.array([0, 10, 2, 3], np.int32)), "cu_seq_len_k_start: expected 0 <="),
    (lambda a: a.update(cu_seq_len_k_end=np.array([41, 9, 2, 30], np.int32)), "cu_seq_len_k_end: expected ends <="),
    (lambda a: a.update(cu_seq_len_k_start=np.array([-1, 1, 2, 3], np.int32)), "cu_seq_len_k_start"),
    (lambda a: a.update(cu_seq_len_k_end=np.array([40, 9, 2, 30], np.int64)), "cu_seq_len_k_end: expected dtype int32"),
    (lambda a: a.update(max_seqlen_k=10, clean_logits=False), "max_seqlen_k: expected at least every end - start"),
    (lambda a: a.update(max_seqlen_k=40), "clean_logits: expected False with compressed logits"),
    (lambda a: a.update(weights=np.ones((4, 8), np.float64)), "weights: expected dtype float32"),
    (lambda a: a.update(weights=np.ones((8, 4), np.float32).T), r"weights: expected stride\(1\) == 1"),
    (lambda a: a.update(logits_dtype=np.float16), "logits_dtype: expected float32 or bfloat16"),
    (lambda a: a.update(q=(np.zeros((4, 12, 32), E4M3), None), weights=np.ones((4, 12), np.float32)),
     r"q\[0\]: expected num_heads in \(8, 16, 32, 64\) on sm100"),
    (lambda a: a.update(kv=(a["kv"][0], a["kv"][1].astype(np.float64))), r"kv\[1\]: expected a contiguous float32"),
    (lambda a: a.update(kv=(a["kv"][0][:, :16], a["kv"][1])), r"kv\[0\]: expected shape"),
])
def test_plain_bad_input(change, match):
    args = _good_plain()
    change(args)
    before = _snapshot(args)
    with pytest.raises(DGArgumentError, match=f"fp8_fp4_mqa_logits: {match}"):
        att.fp8_fp4_mqa_logits(**args)
    after = _snapshot(args)
    assert before == after


def test_paged_bad_input():
    c = _paged_case(231, 3, 2, 64, False)
    meta = att.get_paged_mqa_logits_metadata(c["ctx"], 64, dg.get_num_sms())
    f = "fp8_fp4_paged_mqa_logits"

    def call(**kw):
        a = dict(q=c["q"], kv_cache=c["cache"], weights=c["w"], context_lens=c["ctx"], block_table=c["table"],
                 schedule_meta=meta, max_context_len=c["max_len"])
        a.update(kw)
        return att.fp8_fp4_paged_mqa_logits(**a)

    table = c["table"].copy()
    table[0, 0] = c["cache"].shape[0]
    with pytest.raises(DGArgumentError, match=f"{f}: block_table: expected page indices in"):
        call(block_table=table)
    table = c["table"].copy()
    table[1, 0] = -1
    if int(c["ctx"][1, -1]) > 0:
        with pytest.raises(DGArgumentError, match=f"{f}: block_table: expected page indices"):
            call(block_table=table)
    short = np.ascontiguousarray(c["table"][:, :1])
    with pytest.raises(DGArgumentError, match=f"{f}: block_table: expected at least"):
        call(block_table=short)
    with pytest.raises(DGArgumentError, match=f"{f}: max_context_len: expected at least every context length"):
        call(max_context_len=int(c["ctx"].max()) - 1)
    bad_cache = np.zeros(c["cache"].shape[:3] + (64 + 8,), np.uint8)
    with pytest.raises(DGArgumentError, match=rf"{f}: kv_cache: expected shape \(num_blocks, 64, 1, 68\)"):
        call(kv_cache=bad_cache)
    with pytest.raises(DGArgumentError, match=f"{f}: context_lens: expected a 2-D array"):
        call(context_lens=np.ascontiguousarray(c["ctx"][:, -1]))
    with pytest.raises(DGArgumentError, match=f"{f}: clean_logits: expected False"):
        call(clean_logits=True)
    ctx = c["ctx"].copy()
    ctx[0, 0] = ctx[0, 1] + 1
    with pytest.raises(DGArgumentError, match="context_lens: expected every row's context length at most"):
        call(context_lens=ctx, schedule_meta=att.get_paged_mqa_logits_metadata(ctx, 64, dg.get_num_sms()))
    with pytest.raises(DGArgumentError, match="get_paged_mqa_logits_metadata: context_lens: expected a 2-D"):
        att.get_paged_mqa_logits_metadata(np.ascontiguousarray(c["ctx"][:, 0]), 64, 4)
    with pytest.raises(DGArgumentError, match="get_paged_mqa_logits_metadata: block_kv: expected 32 or 64"):
        att.get_paged_mqa_logits_metadata(c["ctx"], 128, 4)
    with dg.numerics(arch="sm90"), pytest.raises(DGArgumentError, match="block_kv: expected 64 on sm90"):
        att.get_paged_mqa_logits_metadata(c["ctx"], 32, 4)
    with pytest.raises(DGArgumentError, match="indices: expected None unless sm100 with next_n == 1"):
        call(indices=np.zeros(3, np.int32))


def test_paged_fp4_cache_width():
    c = _paged_case(241, 2, 1, 32, True)
    meta = att.get_paged_mqa_logits_metadata(c["ctx"], 32, dg.get_num_sms())
    wrong = np.zeros(c["cache"].shape[:3] + (64 + 4,), np.uint8)  # FP8 width for an FP4 q
    with pytest.raises(DGArgumentError, match=r"kv_cache: expected shape \(num_blocks, 32, 1, 36\)"):
        att.fp8_fp4_paged_mqa_logits(c["q"], wrong, c["w"], c["ctx"], c["table"], meta, c["max_len"])


def test_ascend_bad_input():
    heads, d, rows, page = 8, 64, 3, 64
    q = np.zeros((rows, 1, heads, d), E4M3)
    pairs = np.full((rows, 1, heads, 1), 0x7F7F, np.int16)
    w = np.ones((rows, heads), BF16)
    ctx = np.array([[3], [5], [64]], np.int32)
    idx = np.arange(rows, dtype=np.int32)
    table = np.arange(rows, dtype=np.int32).reshape(rows, 1)
    with dg.numerics(arch="ascend950"):
        meta = att.get_paged_mqa_logits_metadata(ctx, heads, idx)
        good = np.zeros((rows, page, 1, d + 2), np.uint8)
        att.fp8_fp4_paged_mqa_logits((q, pairs), good, w, ctx, table, meta, 64, idx)
        bad = np.zeros((rows, page, 1, d + 4), np.uint8)
        with pytest.raises(DGArgumentError, match=r"kv_cache: expected a uint8 array \(num_pages, 64, 1, 66\)"):
            att.fp8_fp4_paged_mqa_logits((q, pairs), bad, w, ctx, table, meta, 64, idx)
        with pytest.raises(DGArgumentError, match="indices: expected an int32 array"):
            att.fp8_fp4_paged_mqa_logits((q, pairs), good, w, ctx, table, meta, 64, None)
        with pytest.raises(DGArgumentError, match=r"context_lens: expected a contiguous 2-D array \(num_q_tokens, 1\)"):
            att.fp8_fp4_paged_mqa_logits((q, pairs), good, w, ctx[:, 0].copy(), table, meta, 64, idx)
        with pytest.raises(DGArgumentError, match="get_paged_mqa_logits_metadata: context_lens: expected a contiguous"):
            att.get_paged_mqa_logits_metadata(ctx[:, 0].copy(), heads, idx)
        with pytest.raises(DGArgumentError, match="max_context_len: expected at least every context length"):
            att.fp8_fp4_paged_mqa_logits((q, pairs), good, w, ctx, table, meta, 63, idx)
        short = table.copy()
        short[2, 0] = rows  # page index out of range for the third row (context 64 reads page 0)
        with pytest.raises(DGArgumentError, match=r"block_table: expected page indices in \[0, 3\)"):
            att.fp8_fp4_paged_mqa_logits((q, pairs), good, w, ctx, short, meta, 64, idx)
        with pytest.raises(DGArgumentError, match=r"q\[1\]: expected int16"):
            att.fp8_fp4_paged_mqa_logits((q, None), good, w, ctx, table, meta, 64, idx)
        with pytest.raises(DGArgumentError, match="weights: expected bfloat16"):
            att.fp8_fp4_paged_mqa_logits((q, pairs), good, w.astype(np.float32), ctx, table, meta, 64, idx)
        with pytest.raises(DGArgumentError, match="max_seqlen_k: expected a positive int"):
            att.fp8_fp4_mqa_logits((q[:, 0], pairs[:, 0]), (np.zeros((5, d), E4M3), np.zeros((5, 1), np.int16)),
                                   w, np.zeros(rows, np.int32), np.zeros(rows, np.int32), 0)
        with pytest.raises(DGArgumentError, match="num_heads: expected a multiple of 4"):
            att.get_paged_mqa_logits_metadata(ctx, 6, idx)
        with pytest.raises(DGArgumentError, match="cu_seq_len_k_end: expected ends <= seq_len_kv = 5"):
            att.fp8_fp4_mqa_logits((q[:, 0], pairs[:, 0]), (np.zeros((5, d), E4M3), np.zeros((5, 1), np.int16)),
                                   w, np.zeros(rows, np.int32), np.full(rows, 6, np.int32), 8)


@pytest.mark.torch
def test_torch_tensors_in_and_out():
    torch = pytest.importorskip("torch")
    _, _, q8, (kv8, sf) = _fp8_inputs(4, 40, 8, 64, 251)
    w = _rand((4, 8), 252)
    ks, ke = np.array([0, 3, 5, 0], np.int32), np.array([40, 9, 40, 0], np.int32)
    qt = torch.from_numpy(q8.view(np.uint8)).view(torch.float8_e4m3fn)
    kvt = torch.from_numpy(kv8.view(np.uint8)).view(torch.float8_e4m3fn)
    out = att.fp8_fp4_mqa_logits((qt, None), (kvt, torch.from_numpy(sf)), torch.from_numpy(w), torch.from_numpy(ks),
                                 torch.from_numpy(ke), clean_logits=True, logits_dtype=torch.bfloat16)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16
    assert out.shape == (4, 40) and out.stride() == (512, 1)
    want = att.fp8_fp4_mqa_logits((q8, None), (kv8, sf), w, ks, ke, logits_dtype=BF16)
    assert out.view(torch.int16).numpy().tobytes() == np.asarray(want).view(np.int16).tobytes()
