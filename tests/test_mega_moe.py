"""Mega MoE (deepgemm_ref.mega): layouts, weight transforms, SwiGLU numerics, the fused kernels of both
targets against an independent per-token reference, stage goldens, properties and bad input.

The reference here (``_ref_layer``) is written from the specification's sentences only: E2M1 and
E4M3 values from their definitions, float64 dot products whose exactness is checked (every
product is a multiple of 2^q and sum |products| < 2^(53 + q)), bf16 rounding by frexp/rint,
SwiGLU in float64 with an interval check and a ``decimal`` fallback, scales by exact rational
ceil(log2(.)), and a combine that is DeepGEMM's float32 running sum in top-k order (the order
its test asserts bitwise) or, for DeepGEMM-Ascend, a float64 sum checked exact the same way.
"""

from __future__ import annotations

import inspect
import math
import os
from decimal import Decimal, localcontext
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import deepgemm_ref as dg
from deepgemm_ref import formats as fm
from deepgemm_ref import mega, trace
from deepgemm_ref.mega import _swiglu as sw
from deepgemm_ref.mega._weights import ascend_l1_rows, interleave8_rows, utccp_rows

from . import reference as ref

BF16 = ml_dtypes.bfloat16
E4M3 = ml_dtypes.float8_e4m3fn
E2M1_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


# ---------------------------------------------------------------------------------------------
# problem builders
# ---------------------------------------------------------------------------------------------

def _pairs(sf32: np.ndarray) -> np.ndarray:
    """float32 power-of-two scales (..., G) -> int16 UE8M0 pairs (..., G / 2) (low byte = even group)."""
    b = (sf32.view(np.uint32) >> 23).astype(np.uint16)
    return (b[..., 0::2] | (b[..., 1::2] << 8)).view(np.int16)


class Problem:
    """A global MoE problem: per rank tokens and routes, per expert raw (un-transformed) weights."""

    def __init__(self, R, E, N, K, H, I, seed=0, masked_ratio=0.0, num_tokens=None, shared=0, scale_w=0.05):
        rng = np.random.default_rng(seed)
        self.R, self.E, self.K, self.H, self.I, self.S = R, E, K, H, I, shared
        self.E_l = E // R
        self.N = list(num_tokens) if num_tokens is not None else [N] * R
        self.x, self.xq, self.x_sf32, self.x_sf_packed, self.idx, self.w = [], [], [], [], [], []
        for r in range(R):
            n = self.N[r]
            x = rng.standard_normal((n, H)).astype(BF16)
            self.x.append(x)
            q, sf = dg.per_token_cast_to_fp8(x, True, 32)
            self.xq.append(q)
            self.x_sf32.append(sf)
            self.x_sf_packed.append(dg.per_token_cast_to_fp8(x, True, 32, True)[1])
            scores = rng.standard_normal((n, E)).astype(np.float32)
            idx = np.argsort(-scores, axis=1, kind="stable")[:, :K].astype(np.int64)
            w = np.take_along_axis(scores, idx, 1)
            if masked_ratio:
                m = rng.random((n, K)) < masked_ratio
                idx[m] = -1
                w[m] = 0
            self.idx.append(idx)
            self.w.append(w.astype(np.float32))
        # per expert: L1 (2I, H) = [gate; up], L2 (H, I), bf16 then FP4 with per-32 UE8M0 scales
        self.w1_bf16 = (rng.standard_normal((E, 2 * I, H)) * scale_w).astype(BF16)
        self.w2_bf16 = (rng.standard_normal((E, H, I)) * scale_w).astype(BF16)
        self.w1q, self.w1sf = self._fp4(self.w1_bf16)
        self.w2q, self.w2sf = self._fp4(self.w2_bf16)
        if shared:
            si = shared * I
            self.ws1_bf16 = (rng.standard_normal((2 * si, H)) * scale_w).astype(BF16)
            self.ws2_bf16 = (rng.standard_normal((H, si)) * scale_w).astype(BF16)
            self.ws1q, self.ws1sf = dg.per_token_cast_to_fp8(self.ws1_bf16, True, 32)
            self.ws2q, self.ws2sf = dg.per_token_cast_to_fp8(self.ws2_bf16, True, 32)

    @staticmethod
    def _fp4(w):
        e, n, k = w.shape
        q = np.empty((e, n, k // 2), np.int8)
        sf = np.empty((e, n, k // 32), np.float32)
        for i in range(e):
            q[i], sf[i] = dg.per_token_cast_to_fp4(w[i], True, 32)
        return q, sf

    def experts_of(self, r, perm=None):
        ids = np.arange(r * self.E_l, (r + 1) * self.E_l)
        return ids if perm is None else perm[ids]

    # weights in each target's kernel layout, for rank r (perm: global slot -> physical expert id)
    def cuda_weights(self, r, perm=None):
        ids = self.experts_of(r, perm)
        n1, n2 = 2 * self.I, self.H
        s1 = dg.transform_sf_into_required_layout(self.w1sf[ids], n1, self.H, (1, 32), len(ids))
        s2 = dg.transform_sf_into_required_layout(self.w2sf[ids], n2, self.I, (1, 32), len(ids))
        return mega.transform_weights_for_mega_moe((self.w1q[ids], s1), (self.w2q[ids], s2))

    def ascend_weights(self, r, perm=None):
        ids = self.experts_of(r, perm)
        return mega.transform_weights_for_mega_moe((self.w1q[ids], _pairs(self.w1sf[ids])),
                                                   (self.w2q[ids], _pairs(self.w2sf[ids])))

    def ascend_shared(self):
        return mega.transform_weights_for_mega_moe((self.ws1q, _pairs(self.ws1sf)), (self.ws2q, _pairs(self.ws2sf)))


def run_cuda(p: Problem, ranks=None, perm=None, clamp=10.0, fast_math=True, bf16=False, masked_to=None):
    """The fused DeepGEMM kernel over R = p.R ranks (or ``ranks`` ranks re-partitioning the same global
    problem); perm relabels experts (token ids mapped through its inverse).  Returns (ys, stats, bufs)."""
    R = p.R if ranks is None else ranks
    if R != p.R:  # re-partition the same global tokens over R ranks
        assert R == 1
        xs, xq, sfp, idx, w = ([np.concatenate(a)] for a in (p.x, p.xq, p.x_sf_packed, p.idx, p.w))
        ns = [sum(p.N)]
    else:
        xs, xq, sfp, idx, w, ns = p.x, p.xq, p.x_sf_packed, p.idx, p.w, p.N
    E_l = p.E // R
    inv = None if perm is None else np.argsort(perm)
    group = mega.EmulatedGroup(R)
    t = -(-max(max(ns), 1) // 384) * 384
    bufs = [mega.get_symm_buffer_for_mega_moe(group.rank(r), p.E, t, p.K, p.H, p.I,
                                              mma_type="bf16xbf16" if bf16 else "fp8xfp4") for r in range(R)]
    ys, stats, weights = [], [], []
    for r in range(R):
        n = ns[r]
        if bf16:
            bufs[r].x[:n] = xs[r]
        else:
            bufs[r].x[:n], bufs[r].x_sf[:n] = xq[r], sfp[r]
        ids = idx[r] if inv is None else np.where(idx[r] >= 0, inv[np.maximum(idx[r], 0)], idx[r])
        bufs[r].topk_idx[:n] = ids
        bufs[r].topk_weights[:n] = w[r]
        ys.append(np.full((n, p.H), np.nan, BF16))
        stats.append(np.arange(E_l, dtype=np.int32))
        gids = np.arange(r * E_l, (r + 1) * E_l)
        phys = gids if perm is None else perm[gids]
        if bf16:
            w1 = mega.transform_weights_for_mega_moe(p.w1_bf16[phys], p.w2_bf16[phys])
            weights.append(w1)
        else:
            s1 = dg.transform_sf_into_required_layout(p.w1sf[phys], 2 * p.I, p.H, (1, 32), E_l)
            s2 = dg.transform_sf_into_required_layout(p.w2sf[phys], p.H, p.I, (1, 32), E_l)
            weights.append(mega.transform_weights_for_mega_moe((p.w1q[phys], s1), (p.w2q[phys], s2)))
    fn = mega.bf16_mega_moe if bf16 else mega.fp8_fp4_mega_moe
    for r in range(R):
        fn(ys[r], weights[r][0], weights[r][1], bufs[r], stats[r], activation_clamp=clamp, fast_math=fast_math)
    return ys, stats, bufs


def run_ascend(p: Problem, clamp=10.0, extra_idx=None):
    group = mega.EmulatedGroup(p.R)
    T = max(p.N)
    bufs = [mega.SymmBuffer(group.rank(r), p.E, T, p.K, p.H, p.I, num_shared_experts=p.S) for r in range(p.R)]
    ys, stats = [], []
    shared = p.ascend_shared() if p.S else (None, None)
    for r in range(p.R):
        n = p.N[r]
        bufs[r].x[:n], bufs[r].x_sf[:n] = p.xq[r], _pairs(p.x_sf32[r])
        bufs[r].topk_idx[:n] = p.idx[r] if extra_idx is None else extra_idx[r]
        bufs[r].topk_weights[:n] = p.w[r]
        ys.append(np.full((n, p.H), np.nan, BF16))
        stats.append(np.zeros(p.E_l, np.int32))
    for r in range(p.R):
        l1, l2 = p.ascend_weights(r)
        mega.fp8_fp4_mega_moe(ys[r], l1, l2, bufs[r], shared[0], shared[1], stats[r], activation_clamp=clamp)
    return ys, stats, bufs


# ---------------------------------------------------------------------------------------------
# the independent reference
# ---------------------------------------------------------------------------------------------

def _fp4_values(packed: np.ndarray) -> np.ndarray:
    b = packed.view(np.uint8)
    codes = np.stack([b & 0xF, b >> 4], axis=-1).reshape(*b.shape[:-1], b.shape[-1] * 2)
    mag = E2M1_VALUES[codes & 7]
    return np.where(codes & 8, -mag, mag)


def _bf16_rne(v: np.ndarray) -> np.ndarray:
    """Round float64 values to bf16 values (8 significant bits, RNE) by frexp and rint."""
    m, e = np.frexp(v)
    normal = np.ldexp(np.rint(np.ldexp(m, 8)), e - 8)
    sub = np.ldexp(np.rint(np.ldexp(v, 133)), -133)
    return np.where(np.abs(v) < 2.0**-126, sub, normal)


def _exact_dot(a: np.ndarray, qa: np.ndarray, b: np.ndarray, qb: np.ndarray) -> np.ndarray:
    """a @ b.T in float64, asserting it is exact: products are multiples of 2^(qa + qb)."""
    out = a @ b.T
    s = np.abs(a) @ np.abs(b).T
    assert np.all(s * (1 + 2.0**-40) < np.exp2(53.0 + qa[:, None] + qb[None, :])), "reference dot not exact"
    return out


def _swiglu_ref(g: np.ndarray, u: np.ndarray, w: float | None) -> np.ndarray:
    """RN_f32(g u w / (1 + exp(-g))): float64 with an interval check, decimal where it fails."""
    num = g * u * (1.0 if w is None else w)
    v = num / (1.0 + np.exp(-g))
    lo, hi = np.float32(v * (1 - 2.0**-45)), np.float32(v * (1 + 2.0**-45))
    out = v.astype(np.float32)
    for j in np.flatnonzero((lo != hi) & (v != 0)):
        with localcontext() as ctx:
            ctx.prec = 80
            val = Decimal(float(g[j])) * Decimal(float(u[j])) * Decimal(1.0 if w is None else w) / \
                (1 + (-Decimal(float(g[j]))).exp())
        out[j] = np.float32(ref.rn(Fraction(val)))  # the exact value is 1e-79 from val, never a tie
    return out


def _ceil_log2(x: Fraction) -> int:
    k = x.numerator.bit_length() - x.denominator.bit_length()
    while Fraction(2) ** k < x:
        k += 1
    while Fraction(2) ** (k - 1) >= x:
        k -= 1
    return k


def _requant_ref(v: np.ndarray, target: str) -> tuple[np.ndarray, np.ndarray]:
    """Per 32 channels: (dequantised FP8 values, scales), from the spec's sentences."""
    q = np.empty(v.shape)
    scales = np.empty(v.size // 32)
    inv448 = Fraction(float(np.float32(1 / 448)))
    for gi in range(v.size // 32):
        grp = v[32 * gi:32 * gi + 32]
        amax = float(np.max(np.abs(grp)))
        if target == "deepgemm":  # amax * f32(1/448) rounded to float32, then rounded up to 2^k
            scaled = Fraction(float(np.float32(float(Fraction(amax) * inv448))))
            k = -127 if scaled == 0 else _ceil_log2(scaled)
        else:  # floor 1e-4, exact ceil(log2(amax / 448))
            k = _ceil_log2(max(Fraction(amax), Fraction(float(np.float32(1e-4)))) / 448)
        scaled_vals = np.clip(grp * np.float32(2.0**-k), -448, 448).astype(np.float32)
        q[32 * gi:32 * gi + 32] = scaled_vals.astype(E4M3).astype(np.float64)
        scales[gi] = 2.0**k
    return q, scales


def _ref_layer(p: Problem, target: str, clamp: float | None):
    """y of every rank, token by token and slot by slot (plus the shared expert on ascend950)."""
    x_vals = [p.xq[r].astype(np.float64) * np.repeat(p.x_sf32[r].astype(np.float64), 32, axis=1) for r in range(p.R)]
    cb = None if clamp is None else float(_bf16_rne(np.array([float(np.float32(clamp))]))[0])
    w1 = {}
    w2 = {}

    def weight(e):
        if e not in w1:
            w1[e] = _fp4_values(p.w1q[e]) * np.repeat(p.w1sf[e].astype(np.float64), 32, axis=1)
            w2[e] = _fp4_values(p.w2q[e]) * np.repeat(p.w2sf[e].astype(np.float64), 32, axis=1)
        return w1[e], w2[e]

    def quantum(vals, block_scales, elem_q):
        return elem_q + np.log2(block_scales).min(axis=1)

    def expert_rows(xrows, xq_exp, W1, W1q, W2, W2q, wts, inter):
        h = _bf16_rne(_exact_dot(xrows, xq_exp, W1, W1q))
        out = []
        for j in range(h.shape[0]):
            g, u = h[j, :inter].copy(), h[j, inter:].copy()
            if cb is not None:
                g, u = np.minimum(g, cb), np.minimum(np.maximum(u, -cb), cb)
            v = _swiglu_ref(g, u, None if wts is None else float(wts[j]))
            q, sc = _requant_ref(v, target)
            qv = q * np.repeat(sc, 32)
            qq = np.array([-9 + np.log2(sc).min()])
            out.append(_bf16_rne(_exact_dot(qv[None, :], qq, W2, W2q))[0])
        return np.array(out)

    ys = []
    for s in range(p.R):
        n = p.N[s]
        xq_exp = quantum(None, p.x_sf32[s].astype(np.float64), -9)
        contrib = np.zeros((n, p.K + (1 if p.S else 0), p.H))
        for t in range(n):
            for k in range(p.K):
                e = int(p.idx[s][t, k])
                if not 0 <= e < p.E:
                    continue
                W1, W2 = weight(e)
                W1q = quantum(None, p.w1sf[e].astype(np.float64), -1)
                W2q = quantum(None, p.w2sf[e].astype(np.float64), -1)
                contrib[t, k] = expert_rows(x_vals[s][t:t + 1], xq_exp[t:t + 1], W1, W1q, W2, W2q,
                                            p.w[s][t:t + 1, k], p.I)[0]
        if p.S and n:
            Ws1 = p.ws1q.astype(np.float64) * np.repeat(p.ws1sf.astype(np.float64), 32, axis=1)
            Ws2 = p.ws2q.astype(np.float64) * np.repeat(p.ws2sf.astype(np.float64), 32, axis=1)
            qs1 = quantum(None, p.ws1sf.astype(np.float64), -9)
            qs2 = quantum(None, p.ws2sf.astype(np.float64), -9)
            contrib[:, p.K] = expert_rows(x_vals[s], xq_exp, Ws1, qs1, Ws2, qs2, None, p.S * p.I)
        if target == "deepgemm":  # the specified order: F = +0; F = f32(F + o_k) in increasing k
            ys.append(_bf16_rne(_f32_running_sum(contrib).astype(np.float64)))
            continue
        with np.errstate(divide="ignore"):
            lsb = np.where(contrib == 0, np.inf, np.log2(np.abs(contrib)) - 7)
        total = contrib.sum(axis=1)
        assert np.all(np.abs(contrib).sum(axis=1) < np.exp2(np.minimum(53 + np.floor(lsb.min(axis=1)), 1000))), \
            "reference combine not exact"
        ys.append(_bf16_rne(total))
    return ys


def _f32_running_sum(contrib: np.ndarray) -> np.ndarray:
    """float32 running sum from +0 over axis 1 of (n, J, H) values (one IEEE float32 add per term)."""
    acc = np.zeros((contrib.shape[0], contrib.shape[2]), np.float32)
    for k in range(contrib.shape[1]):
        acc = np.add(acc, contrib[:, k].astype(np.float32), dtype=np.float32)
    return acc


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint16)


# ---------------------------------------------------------------------------------------------
# names, signatures, profiles
# ---------------------------------------------------------------------------------------------

def test_names_missing_under_ascend_raise_saying_so():
    with dg.numerics(arch="ascend950"):
        for fn in (mega.bf16_mega_moe, mega.get_symm_buffer_for_mega_moe, mega.get_token_alignment_for_mega_moe,
                   mega.get_ring_limit_for_mega_moe):
            with pytest.raises(dg.DGArgumentError, match="not provided by DeepGEMM-Ascend"):
                fn()


def test_symm_buffer_is_a_class_dispatching_on_the_profile():
    g = mega.EmulatedGroup(1)
    with dg.numerics(arch="sm100"):
        b = mega.SymmBuffer(g.rank(0), 4, 384, 2, 512, 512, 384)
        assert isinstance(b, mega.SymmBuffer) and b.num_ring_tokens == 384
        assert "num_ring_tokens" in inspect.signature(mega.SymmBuffer).parameters
    with dg.numerics(arch="ascend950"):
        b = mega.SymmBuffer(g.rank(0), 4, 100, 2, 512, 512)
        assert isinstance(b, mega.SymmBuffer) and b.num_shared_experts == 0 and b.mma_type == "fp8xfp4"
        assert list(inspect.signature(mega.SymmBuffer).parameters)[-4:] == [
            "num_shared_experts", "mma_type", "activation", "base"]


# ---------------------------------------------------------------------------------------------
# _C helpers and buffer layouts
# ---------------------------------------------------------------------------------------------

def test_token_alignment_and_ring_limits():
    assert mega.get_token_alignment_for_mega_moe() == 384 == math.lcm(8, 16, 32, 64, 96, 128, 192)
    # spec 10.1: min = T R; max = T R if E_l == 1 else min(T R E_l, align(T R K + 383 E_l, 384))
    for t, e_l, k, r in [(384, 1, 6, 8), (8448, 48, 6, 8), (384, 4, 6, 8), (4224, 6, 6, 72), (768, 2, 8, 2)]:
        lo = t * r
        hi = lo if e_l == 1 else min(t * r * e_l, -(-(t * r * k + 383 * e_l) // 384) * 384)
        assert mega.get_ring_limit_for_mega_moe(t, e_l, k, r) == (lo, hi)
    assert mega.get_ring_limit_for_mega_moe(4224, 6, 6, 72)[1] == 1824768
    with pytest.raises(dg.DGArgumentError, match="multiple of 384"):
        mega.get_ring_limit_for_mega_moe(100, 4, 6, 8)


def _spec_cuda_bytes(R, E, T, K, H, I, N, fp8=True):
    """num_bytes of spec 10.2's size formula, written out independently."""
    E_l = E // R
    P = -(-(R * T * min(K, E_l) + E_l * 191) // 384) * 384
    ws = -(-(32 + E * 16 + E_l * 8 + 4 * (N // 8) * 4 + E_l * R * (R * T) * 4 + P * 12) // 16) * 16
    elem = 1 if fp8 else 2
    n_sf = 16 * N
    size = ws + T * H * elem + (T * H // 32 if fp8 else 0) + T * K * 8 + T * K * 4 + N * H * elem
    size += (n_sf * H // 32 if fp8 else 0) + N * 4 + N * I * elem + (n_sf * I // 32 if fp8 else 0) + K * T * H * 2
    return size, ws


def test_cuda_buffer_size_views_and_lazy_allocation():
    # DeepGEMM's test configuration: several GiB per rank, allocated lazily
    group = mega.EmulatedGroup(8)
    before = _rss()
    buf = mega.get_symm_buffer_for_mega_moe(group.rank(3), 384, 8192, 6, 7168, 3072)
    assert _rss() - before < 200 << 20
    t = 8448  # align(8192, 384)
    assert buf.num_max_tokens_per_rank == t
    lo, hi = mega.get_ring_limit_for_mega_moe(t, 48, 6, 8)
    assert buf.num_ring_tokens == min(max(786432, lo), hi) == min(t * 8 * 48, -(-(t * 8 * 6 + 48 * 383) // 384) * 384)
    size, ws = _spec_cuda_bytes(8, 384, t, 6, 7168, 3072, buf.num_ring_tokens)
    assert buf.buffer.nbytes == size > 4 << 30
    base = buf.buffer.__array_interface__["data"][0]
    assert buf.x.__array_interface__["data"][0] - base == ws
    assert buf.x.shape == (t, 7168) and buf.x.dtype == E4M3
    assert buf.x_sf.shape == (t, 7168 // 128) and buf.x_sf.dtype == np.int32
    assert buf.topk_idx.dtype == np.int64 and buf.topk_weights.dtype == np.float32
    n_sf = 16 * buf.num_ring_tokens
    assert buf.l1_acts_sf.shape == (n_sf, 56) and buf.l1_acts_sf.strides == (4, 4 * n_sf)
    assert buf.l2_acts_sf.shape == (n_sf, 24)
    buf.x[:2] = np.ones((2, 7168), E4M3)  # writable, and the rest stays zero
    assert np.count_nonzero(buf.topk_idx[:4]) == 0
    assert group.buffer(3) is buf and buf.handle.buffer_ptrs[3] == base and buf.handle.buffer_ptrs[0] == 0
    assert _rss() - before < 300 << 20
    # the _C helper gives the same size and views on any int8 buffer
    nbytes, slicer = mega.get_symm_buffer_size_for_mega_moe(8, 384, t, 6, 7168, 3072, "fp8xfp4", "swiglu",
                                                            buf.num_ring_tokens)
    assert nbytes == size
    views = slicer(buf.buffer)
    assert len(views) == 8 and np.shares_memory(views[0], buf.x)
    buf.destroy()
    assert buf.buffer is None and buf.x is None and buf.x_sf is None and buf.topk_idx is not None


def test_cuda_bf16_buffer_and_get_symm_buffer_heuristics():
    g = mega.EmulatedGroup(2)
    b = mega.get_symm_buffer_for_mega_moe(g.rank(0), 4, 100, 2, 256, 256, mma_type="bf16xbf16")
    assert b.num_max_tokens_per_rank == 384 and b.x.dtype == BF16 and b.x_sf is None and b.l1_acts_sf is None
    lo, hi = mega.get_ring_limit_for_mega_moe(384, 2, 2, 2)
    assert b.num_ring_tokens == min(max(1824768, lo), hi)
    assert b.buffer.nbytes == _spec_cuda_bytes(2, 4, 384, 2, 256, 256, b.num_ring_tokens, fp8=False)[0]
    with pytest.warns(DeprecationWarning):
        mega.get_symm_buffer_for_mega_moe(g.rank(1), 4, 100, 2, 512, 512, use_fp8_dispatch=True)
    with pytest.raises(AssertionError):
        mega.get_symm_buffer_for_mega_moe(g.rank(1), 4, 100, 2, 512, 512, use_fp8_dispatch=False)


def test_ascend_buffer_layout():
    with dg.numerics(arch="ascend950"):
        g = mega.EmulatedGroup(4)
        R, E, T, K, H, I, S = 4, 16, 100, 6, 512, 768, 2
        b = mega.SymmBuffer(g.rank(1), E, T, K, H, I, num_shared_experts=S)
        assert b.num_bytes % (2 << 20) == 0
        mb = -(-R * T * K // 256) + E // R
        ring = 256 * min(mb, 4 * 32)  # hidden / 256 = 2 <= 16: four windows of 32 blocks
        assert b.l1_acts.shape == (ring, H) and b.l1_acts_sf.shape == (ring, H // 64)
        assert b.l2_acts.shape == (ring, I) and b.l2_acts_sf.shape == (ring * I // 64,)
        assert b.x.shape == (T, H) and b.x_sf.shape == (T, H // 64) and b.x_sf.dtype == np.int16
        assert b.shared_l1_acts is not None and np.shares_memory(b.shared_l1_acts, b.x)
        assert b.shared_l2_acts.shape == (T, S * I) and b.shared_l2_acts_sf.shape == (256 * S * I // 64,)
        assert b.expert_recv_count.shape == (R, E // R) and b.expert_recv_count.dtype == np.int32
        base = b.buffer.__array_interface__["data"][0]
        offs = {n: getattr(b, n).__array_interface__["data"][0] - base for n in
                ("x", "x_sf", "topk_idx", "topk_weights", "l1_acts", "l1_acts_sf", "l2_acts", "l2_acts_sf",
                 "shared_l2_acts")}
        assert all(v % 512 == 0 for v in offs.values())
        order = ["x", "x_sf", "topk_idx", "topk_weights", "l1_acts", "l1_acts_sf", "l2_acts", "l2_acts_sf",
                 "shared_l2_acts"]
        assert [offs[n] for n in order] == sorted(offs[n] for n in order)
        nbytes, slicer = mega.get_symm_buffer_size_for_mega_moe(R, E, T, K, H, I, "fp8xfp4", "swiglu",
                                                                num_shared_experts=S)
        assert nbytes == b.num_bytes and len(slicer(b.buffer)) == 13
        # base: share another buffer's allocation, no zeroing
        b.x[0, 0] = np.float32(1.0)
        c = mega.SymmBuffer(g.rank(1), E, T, K, H, I, base=b)
        assert c.buffer is b.buffer and float(c.x[0, 0]) == 1.0 and c.shared_l1_acts_sf is None
        b.destroy()
        assert b.buffer is None and b.expert_recv_count is None and c.x is not None


# ---------------------------------------------------------------------------------------------
# weight transforms
# ---------------------------------------------------------------------------------------------

def test_cuda_transform_follows_the_spec_sentences():
    e_l, i, h = 2, 128, 256
    rng = np.random.default_rng(3)
    w1 = rng.integers(-128, 127, (e_l, 2 * i, h // 2), dtype=np.int8)
    w2 = rng.integers(-128, 127, (e_l, h, i // 2), dtype=np.int8)
    sf1 = np.exp2(rng.integers(-5, 5, (e_l, 2 * i, h // 32))).astype(np.float32)
    sf2 = np.exp2(rng.integers(-5, 5, (e_l, h, i // 32))).astype(np.float32)
    s1 = dg.transform_sf_into_required_layout(sf1, 2 * i, h, (1, 32), e_l)
    s2 = dg.transform_sf_into_required_layout(sf2, h, i, (1, 32), e_l)
    (t1, ts1), (t2, ts2) = mega.transform_weights_for_mega_moe((w1, s1), (w2, s2))
    assert t2 is w2 and ts1.strides == s1.strides and ts2.strides == s2.strides
    # interleave: output row 16b + 8s + j = input row s I + 8b + j
    for b in range(i // 8):
        for s in range(2):
            for j in range(8):
                assert np.array_equal(t1[:, 16 * b + 8 * s + j], w1[:, s * i + 8 * b + j])
    # UTCCP (after the interleave for S1): inside every 128 rows, output row 4j + i = input row 32i + j
    inter = s1[:, [s * i + 8 * b + j for b in range(i // 8) for s in range(2) for j in range(8)]]
    for c in range(2 * i // 128):
        for ii in range(4):
            for j in range(32):
                assert np.array_equal(ts1[:, 128 * c + 4 * j + ii], inter[:, 128 * c + 32 * ii + j])
                if c < h // 128:
                    assert np.array_equal(ts2[:, 128 * c + 4 * j + ii], s2[:, 128 * c + 32 * ii + j])
    assert np.array_equal(interleave8_rows(2 * i)[[0, 7, 8, i, i + 8]], [0, 7, 16, 8, 24])
    assert np.array_equal(utccp_rows(128)[[0, 1, 32, 127]], [0, 4, 1, 127])


@given(st.integers(1, 3), st.sampled_from([64, 128, 192]), st.sampled_from([128, 256]), st.booleans(),
       st.integers(0, 2**32 - 1))
def test_transform_then_inverse_is_identity_on_bytes(e_l, i, h, bf16_mode, seed):
    rng = np.random.default_rng(seed)
    if bf16_mode:
        w1 = rng.standard_normal((e_l, 2 * i, h)).astype(BF16)
        w2 = rng.standard_normal((e_l, h, i)).astype(BF16)
        t1, t2 = mega.transform_weights_for_mega_moe(w1, w2)
        b1, b2 = mega.inverse_transform_weights_for_mega_moe(t1, t2)
        assert b2 is w2 and _bits(b1).tobytes() == _bits(w1).tobytes()
        return
    w1 = rng.integers(-128, 127, (e_l, 2 * i, h // 2), dtype=np.int8)
    w2 = rng.integers(-128, 127, (e_l, h, i // 2), dtype=np.int8)
    s1 = dg.transform_sf_into_required_layout(np.exp2(rng.integers(-9, 9, (e_l, 2 * i, h // 32))).astype(np.float32),
                                              2 * i, h, (1, 32), e_l)
    s2 = dg.transform_sf_into_required_layout(np.exp2(rng.integers(-9, 9, (e_l, h, i // 32))).astype(np.float32),
                                              h, i, (1, 32), e_l)
    t1, t2 = mega.transform_weights_for_mega_moe((w1, s1), (w2, s2))
    (b1, c1), (b2, c2) = mega.inverse_transform_weights_for_mega_moe(t1, t2)
    assert b1.tobytes() == w1.tobytes() and b2 is w2
    assert c1.strides == s1.strides and np.array_equal(c1, s1) and np.array_equal(c2, s2)


@given(st.integers(1, 2), st.sampled_from([128, 256]), st.sampled_from([256, 512]), st.booleans(),
       st.integers(0, 2**32 - 1))
def test_ascend_transform_then_inverse_is_identity_on_bytes(e_l, i, h, shared, seed):
    rng = np.random.default_rng(seed)
    with dg.numerics(arch="ascend950"):
        if shared:
            w1 = rng.integers(0, 256, (2 * i, h), dtype=np.uint8).view(E4M3)
            w2 = rng.integers(0, 256, (h, i), dtype=np.uint8).view(E4M3)
            s1 = rng.integers(-2**15, 2**15, (2 * i, h // 64), dtype=np.int16)
            s2 = rng.integers(-2**15, 2**15, (h, i // 64), dtype=np.int16)
        else:
            w1 = rng.integers(-128, 127, (e_l, 2 * i, h // 2), dtype=np.int8)
            w2 = rng.integers(-128, 127, (e_l, h, i // 2), dtype=np.int8)
            sb = rng.integers(0, 249, (2, e_l, max(2 * i, h), max(h, i) // 32), dtype=np.uint8)
            sb[sb == 7] = 255
            s1 = np.ascontiguousarray(sb[0, :, :2 * i, :h // 32]).view(np.int16)
            s2 = np.ascontiguousarray(sb[1, :, :h, :i // 32]).view(np.int16)
        t1, t2 = mega.transform_weights_for_mega_moe((w1, s1), (w2, s2))
        (b1, c1), (b2, c2) = mega.inverse_transform_weights_for_mega_moe(t1, t2)
        for a, b in ((w1, b1), (w2, b2), (s1, c1), (s2, c2)):
            assert a.dtype == b.dtype and a.shape == b.shape
            assert a.view(np.uint8).tobytes() == b.view(np.uint8).tobytes()


def test_ascend_transform_follows_the_port_sentences():
    with dg.numerics(arch="ascend950"):
        e_l, i, h = 1, 256, 256
        rng = np.random.default_rng(5)
        w1 = rng.integers(-128, 127, (e_l, 2 * i, h // 2), dtype=np.int8)
        w2 = rng.integers(-128, 127, (e_l, h, i // 2), dtype=np.int8)
        b1 = rng.integers(0, 249, (e_l, 2 * i, h // 32), dtype=np.uint8)
        b2 = rng.integers(0, 249, (e_l, h, i // 32), dtype=np.uint8)
        (t1, ts1), (t2, ts2) = mega.transform_weights_for_mega_moe((w1, b1.view(np.int16)), (w2, b2.view(np.int16)))
        assert t1.shape == (e_l, 2 * i // 256, 256, h // 2) and ts1.shape == (e_l, 2 * i // 256, h // 64, 256)
        assert t2.shape == (e_l, h // 256, 256, i // 2) and ts2.shape == (e_l, h // 256, i // 64, 256)
        for blk in range(2 * i // 256):  # 128 gate rows then the matching 128 up rows
            assert np.array_equal(t1[:, blk, :128], w1[:, 128 * blk:128 * blk + 128])
            assert np.array_equal(t1[:, blk, 128:], w1[:, i + 128 * blk:i + 128 * blk + 128])
            # SF: same rows, transposed per block, bytes + 6
            got = ts1[:, blk].view(np.uint8).reshape(e_l, h // 64, 256, 2).transpose(0, 2, 1, 3).reshape(e_l, 256, -1)
            want = np.concatenate([b1[:, 128 * blk:128 * blk + 128], b1[:, i + 128 * blk:i + 128 * blk + 128]], axis=1)
            assert np.array_equal(got, want.astype(np.int64) + 6)
        assert np.array_equal(ascend_l1_rows(2 * i)[[0, 127, 128, i, i + 128]], [0, 127, 256, 128, 384])
        # e4m3 data: 32-byte NZ fragments, SF bytes unchanged
        w = rng.integers(0, 256, (256, 64), dtype=np.uint8).view(E4M3)
        sf = rng.integers(-2**15, 2**15, (256, 1), dtype=np.int16)
        (tw, tsf), _ = mega.transform_weights_for_mega_moe((np.concatenate([w, w]), np.concatenate([sf, sf])),
                                                           (w, sf))
        flat = tw.view(np.uint8).reshape(-1)
        u = w.view(np.uint8)
        # first 256-row block = gate rows 0..127 then up rows 0..127 (= the same w rows); its first
        # NZ fragment holds their columns 0..31, row after row
        assert np.array_equal(flat[:32 * 256].reshape(256, 32), np.concatenate([u[:128, :32], u[:128, :32]]))
        assert np.array_equal(flat[32 * 256:64 * 256].reshape(256, 32), np.concatenate([u[:128, 32:], u[:128, 32:]]))
        assert np.array_equal(tsf[0, 0], np.concatenate([sf[:128, 0], sf[:128, 0]]))
        # bytes 249..254 cannot be raised by 6
        bad = b2.copy()
        bad[0, 0, 0] = 250
        with pytest.raises(ValueError, match="0..248 or 255"):
            mega.transform_weights_for_mega_moe((w1, b1.view(np.int16)), (w2, bad.view(np.int16)))
        with pytest.raises(AssertionError):
            mega.transform_weights_for_mega_moe(w1, w2)


def _rss() -> int:
    if not os.path.exists("/proc/self/statm"):
        pytest.skip("resident memory is read from /proc (Linux)")
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# ---------------------------------------------------------------------------------------------
# SwiGLU and re-quantisation numerics
# ---------------------------------------------------------------------------------------------

def _all_bf16(lo: float, hi: float) -> np.ndarray:
    """Every finite bf16 value with lo <= |v| < hi."""
    v = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.uint16).view(BF16)
    v = v[np.isfinite(v)].astype(np.float64)
    return v[(np.abs(v) >= lo) & (np.abs(v) < hi)]


def test_numpy_exp_meets_the_assumed_bound_on_every_bf16_input():
    """The claim behind swiglu_exact's certificate: |fl(exp(x)) / exp(x) - 1| <= EXP_REL_ERR."""
    x = _all_bf16(0, 700)
    e = np.exp(-x)
    worst = Fraction(0)
    with localcontext() as ctx:
        ctx.prec = 40
        for xi, ei in zip(x[::3], e[::3], strict=True):
            if ei == 0:
                continue
            d = (-Decimal(float(xi))).exp()
            worst = max(worst, abs(Fraction(Decimal(float(ei)) - d) / Fraction(d)))
    assert worst <= Fraction(sw.EXP_REL_ERR)
    assert worst < Fraction(2, 2**53)  # in fact within about one ulp


def test_swiglu_exact_is_correctly_rounded():
    rng = np.random.default_rng(11)
    g = _all_bf16(0, 200).astype(np.float32)[::7]
    g = np.concatenate([g, -g, [0.0, -0.0, 61.0, 100.0, -150.0]]).astype(np.float32)
    u = rng.standard_normal(g.size).astype(BF16).astype(np.float32)
    u[-5:] = [1.0, -2.0, 3.0, 1.0, 1.0]
    w = rng.standard_normal((g.size, 1)).astype(np.float32)
    w[-3:] = [[1.0], [float(np.float32(1 + 2**-23))], [2.0]]
    got, stats = sw.swiglu_exact(g[:, None], u[:, None], w[:, None, 0])
    assert stats["certified"] + stats["exact_fallback"] == g.size
    for j in range(g.size):
        want = sw.swiglu_reference_scalar(float(g[j]), float(u[j]), float(w[j, 0]))
        assert np.float32(want).view(np.uint32) == got[j, 0].view(np.uint32), (g[j], u[j], w[j, 0])


def test_swiglu_exact_decides_float32_midpoints_exactly():
    # g > 60: v* = num (1 - tiny) with num = g u w an exact float32 midpoint: v* rounds toward zero,
    # while round-to-nearest-even of num itself would go up (the lower neighbour is odd).
    g, u, w = np.float32(64.0), np.float32(1 + 2**-7), np.float32(1 + 192 * 2**-23)
    num = Fraction(64) * (1 + Fraction(1, 2**7)) * (1 + Fraction(192, 2**23))
    lower = Fraction(64 * 8454337, 2**23)  # an odd float32 significand
    assert num - lower == Fraction(64, 2**24)  # half an ulp above it
    got, stats = sw.swiglu_exact(np.array([[g]]), np.array([[u]]), np.array([[w]]))
    assert stats["exact_fallback"] == 1 and Fraction(float(got[0, 0])) == lower
    assert ref.rn(num) != float(lower)
    got, _ = sw.swiglu_exact(np.array([[g]]), np.array([[-u]]), np.array([[w]]))
    assert Fraction(float(got[0, 0])) == -lower


def test_exp_neg_f32_is_correctly_rounded():
    """The fp32 model's expf: RN_f32(exp(-g)), checked against decimal on bf16 inputs."""
    g = np.concatenate([_all_bf16(0, 120)[::11], -_all_bf16(0, 88)[::11]]).astype(np.float32)
    got = sw.exp_neg_f32(g)
    with localcontext() as ctx:
        ctx.prec = 60
        want = [1.0 if gi == 0 else ref.rn(Fraction((-Decimal(float(gi))).exp())) for gi in g]
    assert np.array_equal(got, np.array(want, np.float32))


def _requant_scalar(v: np.ndarray, rule: str) -> tuple[list[int], int]:
    """One group by the spec sentences: (E4M3 codes, UE8M0 byte)."""
    amax = max(abs(float(x)) for x in v)
    if rule == "cuda":
        scaled = ref.f32_mul(amax, ref.INV448)
        k = -127 if scaled == 0 else _ceil_log2(Fraction(scaled))
    elif rule == "tilelang":
        k = _ceil_log2(Fraction(ref.f32_div(max(amax, ref.AMAX_FLOOR), 448.0)))
    else:
        k = _ceil_log2(Fraction(max(amax, ref.AMAX_FLOOR)) / 448)
    codes = [fm.encode_scalar(Fraction(float(x)) * Fraction(2) ** -k, fm.E4M3, fm.SATURATING_RNE) for x in v]
    return codes, k + 127


@pytest.mark.parametrize("rule", ["cuda", "tilelang", "ascend"])
def test_requantize_rules_match_the_spec(rule):
    rng = np.random.default_rng(2)
    v = (rng.standard_normal((6, 64)) * np.exp2(rng.integers(-30, 10, (6, 1)))).astype(np.float32)
    v[0, :32] = 0.0
    v[1, 32:] = np.float32(3e-6)  # amax below the 1e-4 floor
    v[2, :32] = np.float32(448 * 2.0**-3)  # exactly a power of two after / 448
    codes, sf = sw.requantize(v, rule)  # type: ignore[arg-type]
    for r in range(6):
        for gi in range(2):
            want_codes, want_byte = _requant_scalar(v[r, 32 * gi:32 * gi + 32], rule)
            assert codes[r, 32 * gi:32 * gi + 32].tolist() == want_codes
            assert sf[r, gi] == want_byte
    assert sf[0, 0] == (0 if rule == "cuda" else 105)


def test_fused_and_baseline_agree_above_the_floor_and_differ_below_it():
    rng = np.random.default_rng(4)
    v = (rng.standard_normal((500, 32)) * np.exp2(rng.integers(-24, 12, (500, 1)))).astype(np.float32)
    big = np.abs(v).max(axis=1) >= np.float32(1e-4)
    c1, s1 = sw.requantize(v, "cuda")
    c2, s2 = sw.requantize(v, "tilelang")
    c3, s3 = sw.requantize(v, "ascend")
    assert np.array_equal(c1[big], c2[big]) and np.array_equal(s1[big], s2[big]) and np.array_equal(s2, s3)
    assert np.array_equal(c2, c3)
    assert np.all(s1[~big] <= s2[~big]) and np.any(s1[~big] < s2[~big])  # amax < 1e-4: smaller scales


def test_swiglu_stage_fused_vs_baseline_on_inputs_where_they_differ():
    """spec 10.7: the fused kernel has no amax floor and clamps in bf16 with a bf16 clamp value."""
    rng = np.random.default_rng(6)
    m, i = 8, 64
    x = (rng.standard_normal((m, 2 * i)) * 0.1).astype(BF16)
    x[:, 0], x[:, i] = BF16(12.0), BF16(1.0)  # gate above the clamp, up = 1
    w = np.full(m, 1.0, np.float32)
    w[:4] = 1e-7  # amax far below 1e-4
    args = (x, w, None, 32, True, True, True)
    # clamp 10.52: bf16(10.52) = 10.5, silu(10.5) / 2^-5 = 335.99 -> e4m3 320, silu(10.52) / 2^-5 = 336.6 -> 352
    yf, sff = mega.swiglu_apply_weight_to_fp8(*args, clamp_value=10.52)
    yb, sfb = mega.swiglu_apply_weight_to_fp8(*args, clamp_value=10.52, semantics="baseline")
    bf = dg.unpack_ue8m0_from_int(np.ascontiguousarray(sff))
    bb = dg.unpack_ue8m0_from_int(np.ascontiguousarray(sfb))
    assert np.all(bf[:4, 0] < bb[:4, 0])  # smaller (unfloored) scales on the tiny rows
    assert np.all(bf[4:] == bb[4:]) and np.all(bf[4:, 0] == 2.0**-5)
    assert np.all(yf[4:, 0].astype(np.float32) == 320) and np.all(yb[4:, 0].astype(np.float32) == 352)
    assert np.array_equal(yf.view(np.uint8)[4:, 1:], yb.view(np.uint8)[4:, 1:])  # identical elsewhere
    f10 = mega.swiglu_apply_weight_to_fp8(*args, clamp_value=10.5)
    b10 = mega.swiglu_apply_weight_to_fp8(*args, clamp_value=10.5, semantics="baseline")
    assert np.array_equal(f10[0].view(np.uint8)[4:], b10[0].view(np.uint8)[4:])  # a bf16 clamp: the same
    with dg.numerics(arch="ascend950"):  # DeepGEMM-Ascend's fused kernel floors amax like the baseline
        ya, sfa = mega.swiglu_apply_weight_to_fp8(*args, clamp_value=10.5)
    assert np.array_equal(ya.view(np.uint8), b10[0].view(np.uint8)) and np.array_equal(sfa, b10[1])


# ---------------------------------------------------------------------------------------------
# the fused kernels against the independent reference
# ---------------------------------------------------------------------------------------------

def test_small_config_matches_the_plain_loop_reference():
    """8 ranks, 32 experts, top-6, hidden 512, intermediate 512 (spec 10.5, DeepGEMM)."""
    p = Problem(8, 32, 6, 6, 512, 512, seed=1, masked_ratio=0.1)
    ys, stats, _ = run_cuda(p, clamp=10.0)
    want = _ref_layer(p, "deepgemm", 10.0)
    for r in range(8):
        assert np.array_equal(ys[r].astype(np.float64), want[r]), r
    counts = np.bincount(np.concatenate([i[i >= 0] for i in p.idx]), minlength=32)
    for r in range(8):
        assert np.array_equal(stats[r], np.arange(4) + counts[4 * r:4 * r + 4])


def test_ascend_small_config_with_shared_experts_matches_the_reference():
    with dg.numerics(arch="ascend950"):
        p = Problem(4, 16, 5, 4, 512, 512, seed=7, shared=2, num_tokens=[5, 0, 3, 5])
        idx = [i.copy() for i in p.idx]
        idx[0][0, 1] = 16  # out of range: masked on DeepGEMM-Ascend
        idx[0][1, 0] = -3
        idx[3][2, :] = 99  # all slots masked: only the shared experts contribute
        p.idx = idx
        ys, stats, bufs = run_ascend(p, clamp=7.3, extra_idx=idx)
        want = _ref_layer(p, "deepgemm-ascend", 7.3)
        for r in range(4):
            assert np.array_equal(ys[r].astype(np.float64), want[r]), r
        valid = np.concatenate([i[(i >= 0) & (i < 16)] for i in idx])
        counts = np.bincount(valid, minlength=16)
        for r in range(4):
            assert np.array_equal(stats[r], counts[4 * r:4 * r + 4])
            for s in range(4):
                got = bufs[r].expert_recv_count[s]
                i_s = idx[s][(idx[s] >= 4 * r) & (idx[s] < 4 * r + 4)] - 4 * r
                assert np.array_equal(got, np.bincount(i_s, minlength=4))


def test_bf16_path_equals_a_plain_per_token_loop():
    p = Problem(2, 4, 5, 2, 256, 256, seed=9)
    ys, _, _ = run_cuda(p, bf16=True, clamp=None)
    for s in range(2):
        for t in range(p.N[s]):
            acc = np.zeros(p.H, np.float32)  # DeepGEMM's combine: float32 from +0 in top-k order
            for k in range(p.K):
                e = p.idx[s][t, k]
                xw = p.x[s][t].astype(np.float64)
                h = _bf16_rne(p.w1_bf16[e].astype(np.float64) @ xw)  # bf16 x bf16 products: exact sums here
                g, u = h[:p.I], h[p.I:]
                v = _swiglu_ref(g, u, float(p.w[s][t, k]))
                vb = _bf16_rne(v.astype(np.float64))
                acc = np.add(acc, _bf16_rne(p.w2_bf16[e].astype(np.float64) @ vb).astype(np.float32), dtype=np.float32)
            assert np.array_equal(ys[s][t].astype(np.float64), _bf16_rne(acc.astype(np.float64))), (s, t)


# ---------------------------------------------------------------------------------------------
# properties
# ---------------------------------------------------------------------------------------------

def test_ep1_and_ep8_give_identical_bytes():
    p = Problem(8, 32, 5, 6, 512, 512, seed=13, masked_ratio=0.2)
    ys8, st8, _ = run_cuda(p)
    ys1, st1, _ = run_cuda(p, ranks=1)
    assert _bits(np.concatenate(ys8)).tobytes() == _bits(ys1[0]).tobytes()
    assert np.array_equal(np.concatenate([s - np.arange(4) for s in st8]), st1[0] - np.arange(32))


def test_all_masked_tokens_give_positive_zeros():
    p = Problem(2, 4, 6, 3, 512, 512, seed=17)
    p.idx[0][2:4] = -1
    p.idx[1][0] = -7
    ys, _, _ = run_cuda(p)
    assert np.all(_bits(ys[0][2:4]) == 0) and np.all(_bits(ys[1][0]) == 0)
    assert np.all(np.isfinite(ys[0].astype(np.float32)))


def test_permuting_experts_across_ranks_changes_nothing():
    p = Problem(4, 16, 6, 4, 512, 512, seed=19)
    ys, _, _ = run_cuda(p)
    perm = np.random.default_rng(0).permutation(16)
    ys_p, _, _ = run_cuda(p, perm=perm)
    for a, b in zip(ys, ys_p, strict=True):
        assert _bits(a).tobytes() == _bits(b).tobytes()


@pytest.mark.parametrize("arch", ["sm100", "ascend950"])
def test_stage_functions_compose_to_the_fused_result(arch):
    with dg.numerics(arch=arch):
        ascend = arch == "ascend950"
        p = Problem(4, 16, 6, 4, 512, 512, seed=23, masked_ratio=0.15, shared=1 if ascend else 0)
        if ascend:
            ys, stats, _ = run_ascend(p, clamp=10.0)
            xs = [(p.xq[r], _pairs(p.x_sf32[r])) for r in range(4)]
            w1 = [(p.w1q[e], _pairs(p.w1sf[e])) for e in range(16)]
            w2 = [(p.w2q[e], _pairs(p.w2sf[e])) for e in range(16)]
        else:
            ys, stats, _ = run_cuda(p, clamp=10.0)
            xs = [(p.xq[r], p.x_sf_packed[r]) for r in range(4)]
            w1 = [(p.w1q[e], p.w1sf[e]) for e in range(16)]
            w2 = [(p.w2q[e], p.w2sf[e]) for e in range(16)]
        st0 = [np.zeros(4, np.int32) for _ in range(4)]
        disp = mega.mega_moe_dispatch(xs, p.idx, p.w, 16, expert_alignment=128,
                                      cumulative_local_expert_recv_stats=st0)
        l2_out = []
        for r, d in enumerate(disp):
            ids = range(4 * r, 4 * r + 4)
            b1 = (np.stack([w1[e][0] for e in ids]), np.stack([w1[e][1] for e in ids]))
            b2 = (np.stack([w2[e][0] for e in ids]), np.stack([w2[e][1] for e in ids]))
            psum = d.psum_num_recv_tokens_per_expert
            h = mega.mega_moe_grouped_gemm((d.recv_x, d.recv_x_sf), b1, psum, 128)
            q, qsf = mega.swiglu_apply_weight_to_fp8(h, d.recv_topk_weights, psum[-1], 32, True, True, True,
                                                     clamp_value=10.0)
            l2_out.append(mega.mega_moe_grouped_gemm((q, qsf), b2, psum, 128))
        shared = None
        if ascend:
            shared = []
            for r in range(4):
                hs = mega.mega_moe_grouped_gemm(xs[r], (p.ws1q[None], _pairs(p.ws1sf)[None]), [p.N[r]])
                qs, qssf = mega.swiglu_apply_weight_to_fp8(hs, None, None, 32, True, True, True, clamp_value=10.0)
                shared.append(mega.mega_moe_grouped_gemm((qs, qssf), (p.ws2q[None], _pairs(p.ws2sf)[None]), [p.N[r]]))
        y = mega.mega_moe_combine(l2_out, disp, shared)
        for r in range(4):
            assert _bits(y[r]).tobytes() == _bits(ys[r]).tobytes(), r
            assert np.array_equal(st0[r], stats[r] - (0 if ascend else np.arange(4)))


def test_grouped_stage_matches_the_m_grouped_psum_gemm():
    """The baseline's GEMM stage is DeepGEMM's m_grouped_fp8_fp4_gemm_nt_contiguous with use_psum_layout."""
    grouped = pytest.importorskip("deepgemm_ref.grouped")
    p = Problem(2, 4, 40, 2, 512, 512, seed=3)
    d = mega.mega_moe_dispatch([(p.xq[r], p.x_sf_packed[r]) for r in range(2)], p.idx, p.w, 4,
                               expert_alignment=128)[0]
    w1 = (p.w1q[:2], dg.transform_sf_into_required_layout(p.w1sf[:2], 1024, 512, (1, 32), 2))
    ours = mega.mega_moe_grouped_gemm((d.recv_x, d.recv_x_sf), w1, d.psum_num_recv_tokens_per_expert, 128)
    theirs = np.zeros_like(ours)
    grouped.m_grouped_fp8_fp4_gemm_nt_contiguous((d.recv_x, d.recv_x_sf), w1, theirs,
                                                 d.psum_num_recv_tokens_per_expert, recipe=(1, 1, 32),
                                                 use_psum_layout=True)
    assert _bits(ours).tobytes() == _bits(theirs).tobytes()


def test_stage_goldens_conditioned_on_a_device_output():
    """A flipped FP8 code in a device's L2 activations changes the L2 golden only in that row."""
    p = Problem(2, 4, 8, 2, 512, 512, seed=29)
    with trace.capture() as cap:
        run_cuda(p)
    rec = cap.records[0]
    acts, sf = rec.extra["l2.acts"], rec.extra["l2.acts_sf"]
    psum = rec.extra["dispatch.psum"]
    b2 = (p.w2q[:2], p.w2sf[:2])
    golden = mega.mega_moe_grouped_gemm((acts, sf), b2, psum)
    assert _bits(golden).tobytes() == _bits(rec.extra["l2.output"]).tobytes()
    device = acts.copy()
    device.view(np.uint8)[3, 5] ^= 1  # one FP8 rounding flip on the device
    cond = mega.mega_moe_grouped_gemm((device, sf), b2, psum)
    diff_rows = np.flatnonzero((_bits(cond) != _bits(golden)).any(axis=1))
    assert diff_rows.tolist() == [3]
    # and the L1 golden from the dispatched rows reproduces the recorded L1 output
    src = rec.extra["dispatch.src"]
    xs = np.stack([p.xq[s][t] for s, t, _ in src])
    sfs = np.stack([p.x_sf32[s][t] for s, t, _ in src])
    l1 = mega.mega_moe_grouped_gemm((xs, sfs), (p.w1q[:2], p.w1sf[:2]), psum)
    assert _bits(l1).tobytes() == _bits(rec.extra["l1.output"]).tobytes()


def test_trace_records_every_rank_with_the_combine_accumulator_and_error_scale():
    p = Problem(2, 4, 8, 3, 512, 512, seed=31, masked_ratio=0.2)
    with trace.capture(want_acc=True, want_S=True) as cap:
        ys, _, _ = run_cuda(p)
    assert [r.stats["rank"] for r in cap.records] == [0, 1]
    for r, rec in enumerate(cap.records):
        assert rec.func == "fp8_fp4_mega_moe"
        assert np.array_equal(fm.round_f64(rec.acc, fm.BF16).view(np.uint16), _bits(ys[r]))
        comb = rec.extra["combine.input"].astype(np.float64)
        # DeepGEMM: acc is the float32 running sum of the specified order, S has the order margin
        assert np.array_equal(rec.acc, _f32_running_sum(comb).astype(np.float64))
        assert np.all(rec.S >= np.abs(comb).sum(axis=1) * (1 + 2.0**-12))
        assert rec.extra["l1.acc"].shape == rec.extra["l1.output"].shape == rec.extra["l1.S"].shape
        assert np.array_equal(fm.round_f64(rec.extra["l2.acc"], fm.BF16).view(np.uint16),
                              _bits(rec.extra["l2.output"]))
        assert rec.extra["l2.acts_sf"].shape == (rec.extra["l2.acts"].shape[0], 512 // 32)


def test_swiglu_fp32_follows_the_kernel_order():
    """fp32 model: e = RN(exp(-g)), d = RN(1 + e), s = RN(g / d) or RN(g * RN(1 / d)), v = RN(RN(s u) w)."""
    rng = np.random.default_rng(71)
    g = (rng.standard_normal(300) * 4).astype(BF16).astype(np.float32)
    u = rng.standard_normal(300).astype(BF16).astype(np.float32)
    w = rng.standard_normal((300, 1)).astype(np.float32)
    for reciprocal in (False, True):
        got = sw.swiglu_fp32(g[:, None], u[:, None], w, reciprocal)[:, 0]
        for j in range(300):
            with localcontext() as ctx:
                ctx.prec = 60
                e = ref.rn(Fraction((-Decimal(float(g[j]))).exp()))
            d = ref.rn(Fraction(1) + Fraction(e))
            s_ = ref.f32_mul(float(g[j]), ref.f32_div(1.0, d)) if reciprocal else ref.f32_div(float(g[j]), d)
            v = ref.f32_mul(ref.f32_mul(s_, float(u[j])), float(w[j, 0]))
            assert np.float32(v) == got[j], (j, reciprocal)


def test_fp32_model_runs_the_kernel_order_and_fast_math_only_matters_there():
    p = Problem(2, 4, 8, 2, 512, 512, seed=37)
    exact, _, _ = run_cuda(p)
    exact_nf, _, _ = run_cuda(p, fast_math=False)
    assert all(_bits(a).tobytes() == _bits(b).tobytes() for a, b in zip(exact, exact_nf, strict=True))
    with dg.numerics(accumulation="fp32"):
        f32, _, _ = run_cuda(p)
        # the stage functions follow the same model: L1 of the fused record equals the grouped stage
        with trace.capture() as cap:
            run_cuda(p)
        rec = cap.records[0]
        l1 = mega.mega_moe_grouped_gemm(
            (np.stack([p.xq[s][t] for s, t, _ in rec.extra["dispatch.src"]]),
             np.stack([p.x_sf32[s][t] for s, t, _ in rec.extra["dispatch.src"]])),
            (p.w1q[:2], p.w1sf[:2]), rec.extra["dispatch.psum"])
        assert _bits(l1).tobytes() == _bits(rec.extra["l1.output"]).tobytes()
    for a, b in zip(exact, f32, strict=True):
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        assert np.all(np.abs(a64 - b64) <= 2.0**-5 * np.abs(a64) + 1e-2)  # an FP8 flip at most, per slot


def test_collective_semantics_and_one_rank_mode():
    p = Problem(4, 8, 6, 2, 512, 512, seed=41)
    full, _, _ = run_cuda(p)
    group = mega.EmulatedGroup(4, collective=False)
    bufs = [mega.get_symm_buffer_for_mega_moe(group.rank(r), 8, 384, 2, 512, 512) for r in range(4)]
    for r in range(4):
        bufs[r].x[:6], bufs[r].x_sf[:6] = p.xq[r], p.x_sf_packed[r]
        bufs[r].topk_idx[:6], bufs[r].topk_weights[:6] = p.idx[r], p.w[r]
    weights = [p.cuda_weights(r) for r in range(4)]
    y2 = np.zeros((6, 512), BF16)
    with pytest.raises(dg.DGArgumentError, match="ranks"):
        mega.fp8_fp4_mega_moe(y2, *weights[2], bufs[2], activation_clamp=10.0)
    for r in (0, 1, 3):
        group.bind(r, *weights[r], 6, activation_clamp=10.0)
    stats = np.zeros(2, np.int32)
    mega.fp8_fp4_mega_moe(y2, *weights[2], bufs[2], stats, activation_clamp=10.0)
    assert _bits(y2).tobytes() == _bits(full[2]).tobytes()
    assert stats.sum() == sum(int(((i >= 4) & (i < 6)).sum()) for i in p.idx)
    # collective: outputs appear when the last rank joins
    g2 = mega.EmulatedGroup(2)
    b2 = [mega.get_symm_buffer_for_mega_moe(g2.rank(r), 8, 384, 2, 512, 512) for r in range(2)]
    q = Problem(2, 8, 6, 2, 512, 512, seed=43)
    for r in range(2):
        b2[r].x[:6], b2[r].x_sf[:6] = q.xq[r], q.x_sf_packed[r]
        b2[r].topk_idx[:6], b2[r].topk_weights[:6] = q.idx[r], q.w[r]
    ys = [np.full((6, 512), 7, BF16) for _ in range(2)]
    mega.fp8_fp4_mega_moe(ys[1], *q.cuda_weights(1), b2[1])
    assert g2.pending_ranks() == [1] and np.all(ys[1].astype(np.float32) == 7)
    mega.fp8_fp4_mega_moe(ys[0], *q.cuda_weights(0), b2[0])
    assert g2.pending_ranks() == [] and not np.all(ys[1].astype(np.float32) == 7)


def test_stats_wrap_like_int32_atomics_and_debug_mode_zeroes_the_buffer(monkeypatch):
    p = Problem(1, 2, 6, 2, 512, 512, seed=47)
    g = mega.EmulatedGroup(1)
    b = mega.get_symm_buffer_for_mega_moe(g.rank(0), 2, 6, 2, 512, 512)
    b.x[:6], b.x_sf[:6], b.topk_idx[:6], b.topk_weights[:6] = p.xq[0], p.x_sf_packed[0], p.idx[0], p.w[0]
    stats = np.array([2**31 - 1, 0], np.int32)
    monkeypatch.setenv("DG_COMM_KERNEL_DEBUG", "1")
    mega.fp8_fp4_mega_moe(np.zeros((6, 512), BF16), *p.cuda_weights(0), b, stats)
    assert stats[0] < 0 and stats.astype(np.int64).sum() % 2**32 == (2**31 - 1 + 12) % 2**32
    assert not np.any(b.buffer)


# ---------------------------------------------------------------------------------------------
# bad input: DGArgumentError before anything is written
# ---------------------------------------------------------------------------------------------

def _one_rank(p):
    g = mega.EmulatedGroup(1)
    b = mega.get_symm_buffer_for_mega_moe(g.rank(0), p.E, 384, p.K, p.H, p.I)
    n = p.N[0]
    b.x[:n], b.x_sf[:n], b.topk_idx[:n], b.topk_weights[:n] = p.xq[0], p.x_sf_packed[0], p.idx[0], p.w[0]
    return b


def test_bad_input_raises_before_writing():
    p = Problem(1, 4, 6, 2, 512, 512, seed=53)
    b = _one_rank(p)
    (l1, l2) = p.cuda_weights(0)
    y = np.full((6, 512), 3, BF16)
    stats = np.ones(4, np.int32)

    def check(match, **kw):
        args = dict(y=y, l1_weights=l1, l2_weights=l2, sym_buffer=b, cumulative_local_expert_recv_stats=stats)
        args.update(kw)
        with pytest.raises(dg.DGArgumentError, match=match):
            mega.fp8_fp4_mega_moe(**args)
        assert np.all(y.astype(np.float32) == 3) and np.all(stats == 1)

    b.topk_idx[1, 0] = 4  # >= num_experts
    check("expert ids < num_experts")
    b.topk_idx[1, 0] = 2**32 + 1  # truncated to int32: a valid id 1
    mega.fp8_fp4_mega_moe(np.zeros((6, 512), BF16), l1, l2, b)
    b.topk_idx[1, 0] = p.idx[0][1, 0]
    check("tokens|rows", y=np.zeros((385, 512), BF16))
    check("recipe", recipe=(1, 1, 128))
    check("activation_clamp", activation_clamp=-1.0)
    check("activation", activation="gelu")
    k_major = (l1[0], np.ascontiguousarray(l1[1]))
    check("layout 2|MN-major", l1_weights=k_major)
    check("packed FP4", l1_weights=(l1[0].view(E4M3), l1[1]))
    check("K-major", l1_weights=(np.asfortranarray(l1[0]), l1[1]))
    padded = np.zeros(l1[0].shape[:2] + (2 * l1[0].shape[2],), np.int8)[:, :, :l1[0].shape[2]]
    padded[...] = l1[0]
    check("contiguous", l1_weights=(padded, l1[1]))
    check("cumulative_local_expert_recv_stats", cumulative_local_expert_recv_stats=np.ones(3, np.int32))
    check("bfloat16", y=np.zeros((6, 512), np.float32))
    with dg.numerics(arch="sm90"):
        check("sm100")
    with pytest.raises(dg.DGArgumentError, match="multiple of the rank count"):
        mega.get_symm_buffer_for_mega_moe(mega.EmulatedGroup(3).rank(0), 4, 384, 2, 512, 512)
    with pytest.raises(dg.DGArgumentError, match="hidden"):
        mega.get_symm_buffer_for_mega_moe(mega.EmulatedGroup(1).rank(0), 4, 384, 2, 640, 512)
    with pytest.raises(dg.DGArgumentError, match="intermediate_hidden"):
        mega.get_symm_buffer_for_mega_moe(mega.EmulatedGroup(1).rank(0), 4, 384, 2, 512, 768)
    with pytest.raises(dg.DGArgumentError, match="multiple of 384"):
        mega.SymmBuffer(mega.EmulatedGroup(1).rank(0), 4, 100, 2, 512, 512, 384)
    with pytest.raises(dg.DGArgumentError, match="group"):
        mega.get_symm_buffer_for_mega_moe(object(), 4, 384, 2, 512, 512)


def test_ascend_bad_input():
    with dg.numerics(arch="ascend950"):
        p = Problem(1, 4, 6, 2, 512, 512, seed=59)
        g = mega.EmulatedGroup(1)
        b = mega.SymmBuffer(g.rank(0), 4, 6, 2, 512, 512)
        b.x[:6], b.x_sf[:6], b.topk_idx[:6], b.topk_weights[:6] = p.xq[0], _pairs(p.x_sf32[0]), p.idx[0], p.w[0]
        l1, l2 = p.ascend_weights(0)
        y = np.full((6, 512), 3, BF16)
        with pytest.raises(dg.DGArgumentError, match="fast_math"):
            mega.fp8_fp4_mega_moe(y, l1, l2, b, fast_math=False)
        with pytest.raises(dg.DGArgumentError, match="transform_weights_for_mega_moe"):
            mega.fp8_fp4_mega_moe(y, (p.w1q[:4], _pairs(p.w1sf[:4])), l2, b)
        with pytest.raises(dg.DGArgumentError, match="shared"):
            mega.fp8_fp4_mega_moe(y, l1, l2, b, l1, l2)
        with pytest.raises(dg.DGArgumentError, match="y"):
            mega.fp8_fp4_mega_moe(np.zeros((7, 512), BF16), l1, l2, b)
        dg.set_num_sms(16)
        with pytest.raises(dg.DGArgumentError, match="get_num_sms"):
            mega.fp8_fp4_mega_moe(y, l1, l2, b)
        assert np.all(y.astype(np.float32) == 3)
        dg.set_num_sms(32)
        with pytest.raises(dg.DGArgumentError, match="multiple of 256"):
            mega.SymmBuffer(g.rank(0), 4, 6, 2, 384, 512)
        with pytest.raises(dg.DGArgumentError, match="at least 512"):
            mega.SymmBuffer(g.rank(0), 4, 6, 2, 512, 256)
        with pytest.raises(dg.DGArgumentError, match="multiple of the rank count"):
            mega.SymmBuffer(mega.EmulatedGroup(3).rank(0), 4, 6, 2, 512, 512)
        with pytest.raises(AssertionError):
            mega.SymmBuffer(g.rank(0), 4, 6, 2, 512, 512, mma_type="bf16xbf16")
        mega.fp8_fp4_mega_moe(y, l1, l2, b)  # ids stay in range: fine
        assert np.all(np.isfinite(y.astype(np.float32)))


def test_torch_tensors_are_accepted():
    torch = pytest.importorskip("torch")
    p = Problem(1, 2, 6, 2, 512, 512, seed=61)
    b = _one_rank(p)
    s1 = dg.transform_sf_into_required_layout(p.w1sf[:2], 1024, 512, (1, 32), 2)
    s2 = dg.transform_sf_into_required_layout(p.w2sf[:2], 512, 512, (1, 32), 2)
    (l1, l2) = mega.transform_weights_for_mega_moe((torch.from_numpy(p.w1q[:2]), torch.from_numpy(s1)),
                                                   (torch.from_numpy(p.w2q[:2]), torch.from_numpy(s2)))
    assert isinstance(l1[0], torch.Tensor) and l1[1].stride() == torch.from_numpy(s1).stride()
    y = torch.zeros((6, 512), dtype=torch.bfloat16)
    mega.fp8_fp4_mega_moe(y, l1, l2, b)
    want = np.zeros((6, 512), BF16)
    b2 = _one_rank(p)
    mega.fp8_fp4_mega_moe(want, *p.cuda_weights(0), b2)
    assert torch.equal(y.view(torch.int16), torch.from_numpy(_bits(want).view(np.int16)))


def test_buffer_views_take_torch_style_writes_without_torch():
    group = mega.EmulatedGroup(1)
    buf = mega.get_symm_buffer_for_mega_moe(group.rank(0), 4, 8, 2, 512, 512)
    x = np.random.default_rng(0).standard_normal((8, 512)).astype(BF16)
    q, sf = dg.per_token_cast_to_fp8(x, True, 32, True)
    assert buf.x[:8].copy_(q) is not None
    buf.x_sf[:8].copy_(sf)
    assert np.array_equal(buf.x[:8].view(np.uint8), q.view(np.uint8)) and np.array_equal(buf.x_sf[:8], sf)
    buf.topk_weights[:8] = np.arange(16, dtype=np.float32).reshape(8, 2)
    doubled = buf.topk_weights[:8] * 2  # arithmetic gives plain arrays, never views of the buffer
    assert type(doubled) is np.ndarray and doubled[7, 1] == 30
    buf.x[:8].zero_()
    assert not buf.x[:8].view(np.uint8).any()


def test_clamp_returns_the_other_operand_for_nan():
    """The devices' min / max (CUDA __hmin2 / __hmax2, Ascend __hmin / __hmax) return the non-NaN
    operand, so a NaN activation is clamped to the bound rather than propagated."""
    from deepgemm_ref.mega._swiglu import clamp

    g = np.array([np.nan, 1.0, 9.0], np.float32)
    u = np.array([np.nan, -9.0, 2.0], np.float32)
    for bf16_clamp in (True, False):
        gc, uc = clamp(g, u, 4.0, bf16_clamp)
        assert gc.tolist() == [4.0, 1.0, 4.0] and uc.tolist() == [-4.0, -4.0, 2.0]
    gc, uc = clamp(g, u, None, True)  # no clamp: NaN stays
    assert np.isnan(gc[0]) and np.isnan(uc[0])


def test_experts_on_the_pool_give_the_bytes_of_one_expert_after_the_other(monkeypatch):
    """The layer's experts run on the package's pool (issue 30); one pool thread, or a call a
    trace captures (the golden workflow), runs them one after the other.  The outputs are the same
    byte for byte, and so is every record (accumulators, error scales, stage goldens, stats, task
    labels) whatever the thread count (FP8 x FP4 and BF16)."""
    p = Problem(2, 4, 5, 3, 512, 512, seed=37, masked_ratio=0.2)

    def layer(threads, bf16):
        monkeypatch.setenv("DEEPGEMM_REF_NUM_THREADS", threads)
        ys, stats, _ = run_cuda(p, bf16=bf16)
        return [_bits(y).tobytes() for y in ys] + [s.tobytes() for s in stats]

    def captured(threads, bf16):
        with trace.capture(want_acc=True, want_S=True) as cap:
            got = layer(threads, bf16)
        for rec in cap.records:
            got += [np.ascontiguousarray(rec.acc).tobytes(), np.ascontiguousarray(rec.S).tobytes(),
                    repr(sorted(rec.stats.items())), repr(rec.tasks), repr(list(rec.extra))]
            got += [np.ascontiguousarray(v).tobytes() for v in rec.extra.values()]
        return got

    for bf16 in (False, True):
        pooled = layer("3", bf16)
        assert pooled == layer("1", bf16)
        with_trace = captured("3", bf16)
        assert with_trace[:len(pooled)] == pooled
        assert with_trace == captured("1", bf16)


def test_certified_f32_margin_decides_what_the_interval_test_decided():
    """SwiGLU's float32 certificate (issue 30: a margin test on the float64 bits first) against
    the interval test over the whole array (the previous code path): the same codes and the same
    elements sent to the exact fallback, on estimates at and around float32 midpoints, binade
    edges, float32's subnormal and overflow ranges, zeros and non-finite values."""
    from deepgemm_ref.certified import round_certified

    rng = np.random.default_rng(53)
    f32 = (rng.standard_normal(400) * np.exp2(rng.integers(-140, 127, 400))).astype(np.float32)
    mid = f32.astype(np.float64) + np.spacing(f32).astype(np.float64) / 2  # float32 midpoints
    offs = np.array([-200, -69, -68, -67, -40, -33, -1, 0, 1, 33, 40, 67, 68, 69, 200])
    near = (mid.view(np.int64)[:, None] + offs[None, :]).reshape(-1).view(np.float64)
    edges = np.ldexp(1.0, np.arange(-150, 130))
    edges = np.concatenate([edges, np.nextafter(edges, 0), np.nextafter(edges, np.inf), -edges])
    x = np.concatenate([near, -near, edges, rng.standard_normal(500), [0.0, -0.0, np.inf, -np.inf, np.nan,
                                                                      3.5e38, -3.4e38, 1e-46]])
    final = rng.random(x.size) < 0.05
    for fin in (None, final):
        called_new: list[int] = []
        called_old: list[int] = []

        def exact(i, called):
            called.append(i)
            return float(np.float32(x[i]))

        new, n_new = sw._certified(x, fin, lambda i, c=called_new: exact(i, c))
        keep = ~np.isfinite(x) if fin is None else ~np.isfinite(x) | fin
        old, pend = round_certified(x, lambda at: np.abs(x if at is None else x[at]) * sw.CERT_REL, sw._F32Cast(),
                                    final=keep, fallback=lambda at, c=called_old: np.array(
                                        [exact(i, c) for i in at[0].tolist()], np.float32).view(np.uint32))
        assert np.array_equal(new.view(np.uint32), old) and n_new == int(np.count_nonzero(pend))
        assert sorted(called_new) == sorted(called_old) and len(called_new) > 20
