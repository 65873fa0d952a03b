"""deepgemm_ref.ep.Buffer: DeepEP's legacy (V1) buffer in the in-process form, and over gloo.

Every output is compared bitwise with an independent model written here: Python loops over every
rank's tokens and slots, float32 arithmetic on NumPy float32 rows, bf16 rounding by integer bit
operations (:func:`bf16_bits`), the FP8 cast by a search over the 256 E4M3 codes, and the
low-latency FMA chain resolved with exact rationals wherever a float64 sum lands on a float32
midpoint.  Neither the layout code (``deepgemm_ref.ep.routing``), the reductions nor the cast
module are trusted by the checks.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import deepgemm_ref as dg
import deepgemm_ref.ep as deep_ep
from deepgemm_ref.ep import cast, reduction, routing
from deepgemm_ref.errors import DGArgumentError, DGUtilityError

from .ep_model import align_up, bf16_bits, f32_of, run_rank_processes, wide_bf16

BF16 = np.dtype(ml_dtypes.bfloat16)
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
ROOT = Path(__file__).resolve().parent.parent
NVL = 1 << 28  # a num_nvl_bytes that fits the test configs (a multiple of 128)


# ----------------------------------------------------------------------------------------------
# independent helpers
# ----------------------------------------------------------------------------------------------

def _bits(a: Any) -> np.ndarray:
    a = np.ascontiguousarray(np.asarray(a))
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.itemsize])


def same(a: Any, b: Any) -> bool:
    return np.shape(a) == np.shape(b) and np.asarray(a).dtype == np.asarray(b).dtype and np.array_equal(
        _bits(a), _bits(b))


_CODES = np.arange(256, dtype=np.uint8)
_CODE_VALS = _CODES.view(E4M3).astype(np.float64)
_FINITE = ~np.isnan(_CODE_VALS)


def e4m3_rn_satfinite(v: np.ndarray) -> np.ndarray:
    """float32 values -> E4M3 codes: the nearest finite code (ties: even mantissa; the sign of a
    zero kept), NaN -> NaN.  Beyond 448 the nearest finite code is +-448 (satfinite)."""
    v = np.asarray(v, np.float64).ravel()
    out = np.empty(v.size, np.uint8)
    with np.errstate(invalid="ignore"):
        d = np.abs(np.clip(v, -1e6, 1e6)[:, None] - np.where(_FINITE, _CODE_VALS, np.inf)[None, :])
    best = d.min(axis=1)
    for i in range(v.size):
        if np.isnan(v[i]):
            out[i] = 0x7F  # a NaN code (its sign is not compared)
            continue
        cand = np.flatnonzero(d[i] == best[i])
        if cand.size > 1:
            even = cand[(cand & 1) == 0]
            cand = even if even.size else cand
            if cand.size > 1:
                cand = cand[np.signbit(_CODE_VALS[cand]) == np.signbit(v[i])]
        out[i] = cand[0]
    return out


def fp8_cast_model(x: np.ndarray, round_scale: bool) -> tuple[np.ndarray, np.ndarray]:
    """DeepEP's low-latency cast of one row (H,), block by block (contract 11.5)."""
    xf = f32_of(x)
    h = xf.size
    q = np.empty(h, np.uint8)
    sinv = np.empty(h // 128, np.float32)
    for b in range(h // 128):
        blk = xf[128 * b:128 * (b + 1)]
        mag = np.abs(blk[~np.isnan(blk)])
        amax = np.float32(max(np.float32(1e-4), mag.max() if mag.size else np.float32(0)))
        v = np.float32(amax * np.float32(np.float32(1) / np.float32(448)))
        if round_scale:
            bits = int(np.array([v], np.float32).view(np.uint32)[0])
            e = ((bits >> 23) & 0xFF) - 127 + (1 if bits & 0x7FFFFF else 0)

            def pow2(n: int) -> np.float32:  # the kernel builds 2^n from the bits (n + 127) << 23 (32-bit)
                return np.array([((n + 127) << 23) & 0xFFFFFFFF], np.uint32).view(np.float32)[0]

            scale, s_inv = pow2(-e), pow2(e)
        else:
            s_inv = v
            scale = np.float32(np.float32(448) / amax)
        with np.errstate(invalid="ignore", over="ignore"):
            q[128 * b:128 * (b + 1)] = e4m3_rn_satfinite((blk * scale).astype(np.float32))
        sinv[b] = s_inv
    return q, sinv


def f32_round_fraction(v: Fraction) -> np.float32:
    """The float32 nearest to a rational (ties to even), by comparing neighbouring candidates."""
    f = np.float32(float(v))  # within one ulp of the answer
    best, best_d = None, None
    for cand in (np.nextafter(f, np.float32(-np.inf)), f, np.nextafter(f, np.float32(np.inf))):
        d = abs(Fraction(float(cand)) - v)
        even = int(np.array([cand], np.float32).view(np.uint32)[0]) % 2 == 0
        if best_d is None or d < best_d or (d == best_d and even):
            best, best_d = cand, d
    assert best is not None
    return np.float32(best)


def fma_model(acc: np.ndarray, x: np.ndarray, w: float) -> np.ndarray:
    """RN32(acc + x * w) elementwise: the float64 sum rounded to float32, except where that sum
    is exactly a float32 midpoint and inexact, which is resolved with rationals."""
    acc = np.asarray(acc, np.float32)
    p = np.asarray(x, np.float32).astype(np.float64) * np.float64(np.float32(w))
    s = acc.astype(np.float64) + p
    with np.errstate(over="ignore"):
        out = s.astype(np.float32)
    for i in range(acc.size):
        si = float(s.flat[i])
        ri = out.flat[i]
        if not np.isfinite(si) or float(ri) == si:
            continue
        other = np.nextafter(ri, np.float32(np.inf) if float(ri) < si else np.float32(-np.inf))
        if (float(ri) + float(other)) / 2 == si:  # a midpoint: the float64 sum may have rounded onto it
            exact = Fraction(float(acc.flat[i])) + Fraction(float(x.flat[i])) * Fraction(float(np.float32(w)))
            out.flat[i] = f32_round_fraction(exact)
    return out


# ----------------------------------------------------------------------------------------------
# cases and the intranode model
# ----------------------------------------------------------------------------------------------

@dataclass
class Case:
    R: int
    E: int
    K: int
    H: int
    xs: list[np.ndarray]
    idx: list[np.ndarray]
    ws: list[np.ndarray]
    sfs: list[np.ndarray] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def E_l(self) -> int:
        return self.E // self.R


def make_case(R: int, *, E: int | None = None, K: int = 3, H: int = 256, T: int = 7, fp8: bool = False,
              sf_dtype: Any = np.float32, seed: int = 0, masked: float = 0.25) -> Case:
    rng = np.random.default_rng(seed + 100 * R)
    E = E or 4 * R
    xs, idx, ws, sfs = [], [], [], []
    for s in range(R):
        t = max(1, T - s)  # ranks hold different token counts
        rows = np.array([rng.permutation(E)[:K] for _ in range(t)], np.int64).reshape(t, K)
        rows[rng.random(rows.shape) < masked] = -1
        if t > 2:
            rows[1] = -1  # a token that selects nothing
        idx.append(rows)
        ws.append(rng.standard_normal((t, K), dtype=np.float32))
        if fp8:
            xs.append(rng.integers(0, 256, (t, H), dtype=np.uint8).view(E4M3))
            sfs.append(rng.integers(-2**31, 2**31 - 1, (t, H // 128), dtype=np.int64).astype(np.int32).view(sf_dtype))
        else:
            xs.append(rng.standard_normal((t, H), dtype=np.float32).astype(BF16))
    return Case(R, E, K, H, xs, idx, ws, sfs if fp8 else None)


def owner_ranks(c: Case, s: int, t: int) -> list[int]:
    return sorted({int(e) // c.E_l for e in c.idx[s][t] if e >= 0})


def model_layout(c: Case, s: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    T = len(c.idx[s])
    in_rank = np.zeros((T, c.R), bool)
    per_expert = np.zeros(c.E, np.int32)
    for t in range(T):
        for q in owner_ranks(c, s, t):
            in_rank[t, q] = True
        for e in c.idx[s][t]:
            if e >= 0:
                per_expert[e] += 1
    return in_rank.sum(axis=0).astype(np.int32), per_expert, in_rank


def model_received(c: Case, r: int) -> list[tuple[int, int]]:
    return [(s, t) for s in range(c.R) for t in range(len(c.idx[s])) if r in owner_ranks(c, s, t)]


def model_channels(in_rank: np.ndarray, nc: int) -> tuple[np.ndarray, np.ndarray]:
    """(channel_prefix_matrix (R, C), send_head (T, R)) by loops over the channels' token ranges."""
    T, R = in_rank.shape
    per = -(-T // nc)
    prefix = np.zeros((R, nc), np.int32)
    head = np.full((T, R), -1, np.int32)
    for d in range(R):
        total = 0
        for ch in range(nc):
            lo, hi = min(per * ch, T), min(per * ch + per, T)
            n = 0
            for t in range(lo, hi):
                if in_rank[t, d]:
                    head[t, d] = n
                    n += 1
            total += n
            prefix[d, ch] = total
    return prefix, head


def run_intranode(c: Case, *, topk: bool = True, A: int = 1, num_bias: int = 0, worst: int = 0, cached: bool = False,
                  config: Any = None, col_major_sf: bool = False, combine: bool = True, seed: int = 5) -> list[dict]:
    rng = np.random.default_rng(seed)
    biases = []
    for s in range(c.R):
        t = len(c.idx[s])
        bs = [rng.standard_normal((t, c.H), dtype=np.float32).astype(BF16) for _ in range(num_bias)]
        biases.append(tuple(bs))

    def fn(g: Any) -> dict:
        r = g.rank()
        buf = deep_ep.Buffer(g, NVL)
        ntr, ntrd, nte, itr, ev = buf.get_dispatch_layout(c.idx[r], c.E)
        res: dict[str, Any] = dict(layout=(ntr, ntrd, nte, itr), layout_event=ev)
        if c.sfs is not None:
            sf = np.asfortranarray(c.sfs[r]) if col_major_sf else c.sfs[r]
            x = (c.xs[r], sf)
        else:
            x = c.xs[r]
        kw = dict(num_tokens_per_rank=ntr, is_token_in_rank=itr, num_tokens_per_expert=nte, expert_alignment=A,
                  config=config)
        if topk:
            kw.update(topk_idx=c.idx[r], topk_weights=c.ws[r])
        out = buf.dispatch(x, **kw)
        res["dispatch"] = out
        if worst:
            res["worst"] = buf.dispatch(x, num_worst_tokens=worst, **kw)
        if cached:
            x2 = c.extra["x2"][r]
            res["cached"] = buf.dispatch((x2, x[1]) if c.sfs is not None else x2, handle=out[4], config=config)
        if combine:
            recv = out[0][0] if isinstance(out[0], tuple) else out[0]
            y = recv if recv.dtype == BF16 else np.random.default_rng(seed + r).standard_normal(
                (recv.shape[0], c.H), dtype=np.float32).astype(BF16)
            if "y_fn" in c.extra:
                y = c.extra["y_fn"](r, recv.shape[0])
            res["y"] = y
            b = biases[r]
            bias = None if not b else (b[0] if len(b) == 1 else b)
            res["combined"] = buf.combine(y, out[4], topk_weights=out[2], bias=bias, config=config)
        res["bias"] = biases[r]
        return res

    return deep_ep.run_emulated(fn, c.R)


def check_intranode(c: Case, res: list[dict], *, topk: bool, A: int, nc: int) -> None:
    for r, out in enumerate(res):
        ntr, ntrd, nte, itr = out["layout"]
        m_ntr, m_nte, m_itr = model_layout(c, r)
        assert same(ntr, m_ntr) and ntrd is None and same(nte, m_nte) and same(itr, m_itr)
        recv_x, recv_idx, recv_w, lst, handle, ev = out["dispatch"]
        rec = model_received(c, r)
        n = len(rec)
        if c.sfs is not None:
            data, sf = recv_x
            assert same(sf, np.array([c.sfs[s][t] for s, t in rec], c.sfs[0].dtype).reshape(n, -1))
            assert sf.flags.c_contiguous
        else:
            data = recv_x
        assert same(data, np.array([c.xs[s][t] for s, t in rec], c.xs[0].dtype).reshape(n, c.H))
        if topk:
            want_idx = np.array([[e - r * c.E_l if e >= 0 and e // c.E_l == r else -1 for e in c.idx[s][t]]
                                 for s, t in rec], np.int64).reshape(n, c.K)
            want_w = np.array([[c.ws[s][t, k] if want_idx[i, k] >= 0 else 0.0 for k in range(c.K)]
                               for i, (s, t) in enumerate(rec)], np.float32).reshape(n, c.K)
            assert same(recv_idx, want_idx) and same(recv_w, want_w)
        else:
            assert recv_idx is None and recv_w is None
        counts = [sum(int((c.idx[s] == r * c.E_l + j).sum()) for s in range(c.R)) for j in range(c.E_l)]
        assert lst == [align_up(v, A) for v in counts]
        prefix, chan, recv_chan, src_idx, in_rank_h, head = handle
        cnt = np.array([[sum(1 for t in range(len(c.idx[s])) if d in owner_ranks(c, s, t)) for d in range(c.R)]
                        for s in range(c.R)])
        assert same(prefix, np.cumsum(cnt, axis=0).astype(np.int32))
        assert same(src_idx, np.array([t for _, t in rec], np.int32))
        assert in_rank_h is itr
        m_chan, m_head = model_channels(m_itr, nc)
        assert same(chan, m_chan) and same(head, m_head)
        for s in range(c.R):  # the receiver's copy of each source's channel starts
            src_prefix, _ = model_channels(model_layout(c, s)[2], nc)
            want = np.concatenate([[0], src_prefix[r, :-1]]).astype(np.int32)
            assert same(recv_chan[s], want)
        assert ev.event is None


def model_combine(c: Case, res: list[dict]) -> list[tuple[np.ndarray, np.ndarray]]:
    """F = f32(bias0 or +0) + f32(bias1 or +0), then + each holding rank's row in rank order."""
    outs = []
    for s in range(c.R):
        T = len(c.idx[s])
        bias = res[s]["bias"]
        xo = np.zeros((T, c.H), np.uint16)
        wo = np.zeros((T, c.K), np.float32)
        for t in range(T):
            b0 = f32_of(bias[0][t]) if len(bias) >= 1 else np.zeros(c.H, np.float32)
            b1 = f32_of(bias[1][t]) if len(bias) == 2 else np.zeros(c.H, np.float32)
            F = (b0 + b1).astype(np.float32)
            W = np.zeros(c.K, np.float32)
            for q in owner_ranks(c, s, t):
                n = model_received(c, q).index((s, t))
                F = (F + f32_of(res[q]["y"][n])).astype(np.float32)
                recv_w = res[q]["dispatch"][2]
                if recv_w is not None:
                    W = (W + recv_w[n]).astype(np.float32)
            xo[t] = bf16_bits(F)
            wo[t] = W
        outs.append((xo, wo))
    return outs


# ----------------------------------------------------------------------------------------------
# intranode: layout, dispatch, combine
# ----------------------------------------------------------------------------------------------

MATRIX = [
    # (R, fp8, topk, A, num_bias)
    (1, False, True, 1, 0),
    (1, True, True, 4, 2),
    (2, False, True, 1, 1),
    (2, False, False, 1, 0),
    (2, True, True, 8, 2),
    (4, False, True, 1, 2),
    (4, True, False, 4, 1),
    (4, False, True, 3, 0),
]


@pytest.mark.parametrize(("R", "fp8", "topk", "A", "num_bias"), MATRIX)
def test_intranode_dispatch_and_combine(R, fp8, topk, A, num_bias):
    c = make_case(R, fp8=fp8, sf_dtype=np.int32 if R == 4 else np.float32, seed=R + 3 * A + num_bias)
    res = run_intranode(c, topk=topk, A=A, num_bias=num_bias, col_major_sf=fp8 and R == 2)
    nc = deep_ep.Buffer.get_dispatch_config(R).num_sms // 2 if R in (2, 4) else deep_ep.Buffer.num_sms // 2
    check_intranode(c, res, topk=topk, A=A, nc=nc)
    want = model_combine(c, res)
    for s, out in enumerate(res):
        cx, cw, ev = out["combined"]
        assert same(cx, want[s][0].view(BF16)) and cx.dtype == BF16
        if topk:
            assert same(cw, want[s][1])
            # the weights round trip: each slot's weight comes back once (0.0 for masked slots)
            assert same(cw, np.where(c.idx[s] >= 0, c.ws[s], np.float32(0)).astype(np.float32))
        else:
            assert cw is None
        assert ev.event is None


def test_pure_layout_and_rdma_counts():
    rng = np.random.default_rng(3)
    R, E, T, K = 16, 64, 9, 4
    idx = np.stack([rng.permutation(E)[:K] for _ in range(T)]).astype(np.int64)
    idx[rng.random(idx.shape) < 0.3] = -1
    lay = routing.dispatch_layout(idx, E, R)
    for t in range(T):
        for q in range(R):
            assert lay.is_token_in_rank[t, q] == any(e >= 0 and e // 4 == q for e in idx[t])
    assert same(lay.num_tokens_per_rank, lay.is_token_in_rank.sum(axis=0).astype(np.int32))
    want = [sum(1 for t in range(T) if any(e >= 0 and e // 32 == g for e in idx[t])) for g in range(2)]
    assert lay.num_tokens_per_rdma_rank is not None and lay.num_tokens_per_rdma_rank.tolist() == want
    assert lay.num_tokens_per_expert.tolist() == [int((idx == e).sum()) for e in range(E)]


def test_wide_range_combine_where_rank_order_and_bias_matter():
    """Magnitudes 2^-24 .. 2^30: only the kernel's order (biases first, then ranks ascending) gives
    these bytes; owners by master slot (the V2 order) or biases last give others."""
    R = 4
    c = make_case(R, K=4, E=8, seed=17, T=9, masked=0.0)

    def wide(r: int, rows: int) -> np.ndarray:
        return wide_bf16(99 + r, rows, c.H)

    c.extra["y_fn"] = wide
    res = run_intranode(c, num_bias=2)
    want = model_combine(c, res)
    differs = 0
    for s, out in enumerate(res):
        assert same(out["combined"][0], want[s][0].view(BF16))
        for t in range(len(c.idx[s])):  # the same terms, biases last
            F = np.zeros(c.H, np.float32)
            for q in owner_ranks(c, s, t):
                F = (F + f32_of(res[q]["y"][model_received(c, q).index((s, t))])).astype(np.float32)
            for b in res[s]["bias"]:
                F = (F + f32_of(b[t])).astype(np.float32)
            differs += int((bf16_bits(F) != want[s][0][t]).sum())
    assert differs > 0


def test_combine_sign_of_zero_follows_the_kernel():
    """F = bias0 + bias1 in one addition: -0 + -0 = -0, so every -0 term keeps -0 (the V2 start
    +0 + bias0 + bias1 gives +0)."""
    neg = np.full((2, 256), -0.0, np.float32).astype(BF16)
    y = np.full((3, 2, 256), -0.0, np.float32).astype(BF16)
    present = np.array([[True, True], [False, False]])
    got = reduction.rank_order_combine(y[:2], present, (neg, neg))
    assert np.all(got.view(np.uint16) == 0x8000)
    v2 = reduction.sum_pieces([y[0]], np.zeros((2, 1), np.int64), np.zeros((2, 1), np.int64), neg, neg)
    assert np.all(v2.view(np.uint16) == 0)
    one = reduction.rank_order_combine(y[:2], present, neg)  # -0 + (+0): +0
    assert np.all(one.view(np.uint16) == 0)


def test_cached_dispatch_and_worst_tokens():
    R = 4
    c = make_case(R, fp8=True, seed=21)
    rng = np.random.default_rng(8)
    c.extra["x2"] = [rng.integers(0, 256, x.shape, dtype=np.uint8).view(E4M3) for x in c.xs]
    worst = 4 * 7
    res = run_intranode(c, worst=worst, cached=True, combine=False)
    for r, out in enumerate(res):
        rec = model_received(c, r)
        n = len(rec)
        recv_x, recv_idx, recv_w, lst, handle, _ = out["dispatch"]
        # DeepEP's num_worst_tokens idiom: the same rows, -1 past them, an empty list
        wx, widx, ww, wlst, wh, _ = out["worst"]
        assert wlst == [] and wx[0].shape == (worst, c.H) and widx.shape == (worst, c.K)
        assert same(wx[0][:n], recv_x[0]) and same(wx[1][:n], recv_x[1]) and same(widx[:n], recv_idx)
        assert same(ww[:n], recv_w) and np.all(widx[n:] == -1)
        assert not wx[0][n:].view(np.uint8).any() and not ww[n:].any() and np.all(wh[3][n:] == -1)
        # cached: the new x placed by the cached layout, no top-k outputs
        cx, a, b, lst2, h2, _ = out["cached"]
        assert a is None and b is None and lst2 is None and h2 is None
        assert same(cx[0], np.array([c.extra["x2"][s][t] for s, t in rec], E4M3).reshape(n, c.H))
        assert same(cx[1], recv_x[1])


def test_deepep_intranode_idioms():
    """tests/legacy/test_intranode.py's checks: x = rank everywhere, weights = rank; each received
    block is its source rank; combine gives x times the number of ranks holding the token."""
    R, T, H, K, E = 4, 12, 512, 4, 16
    rng = np.random.default_rng(0)
    scores = [np.abs(rng.standard_normal((T, E))) + 1 for _ in range(R)]

    def fn(g: Any) -> tuple:
        r = g.rank()
        buf = deep_ep.Buffer(g, NVL)
        x = np.full((T, H), r, np.float32).astype(BF16)
        topk = np.argsort(-scores[r], axis=1)[:, :K].astype(np.int64)
        w = np.full((T, K), r, np.float32)
        ntr, _, nte, itr, _ = buf.get_dispatch_layout(topk, E)
        cfg = deep_ep.Config(24, 8, 256)
        prev = buf.capture()
        recv_x, recv_idx, recv_w, lst, handle, ev = buf.dispatch(
            x, num_tokens_per_rank=ntr, is_token_in_rank=itr, num_tokens_per_expert=nte, topk_idx=topk,
            topk_weights=w, config=cfg, previous_event=prev, async_finish=True)
        ev.current_stream_wait()
        prefix = handle[0]
        start = 0
        for i in range(R):  # check_data
            end = int(prefix[i][r])
            assert (recv_x[start:end].astype(np.float32) == i).all()
            start = end
        for i, cnt in enumerate(lst):
            assert int((recv_idx == i).sum()) == cnt
        # the other ranks' slots carry 0.0; DeepEP's test fills them with the row's max (the
        # source rank), after which each received block holds its source rank again
        recv_w[recv_idx == -1] = np.broadcast_to(recv_w.max(axis=1, keepdims=True), recv_w.shape)[recv_idx == -1]
        start = 0
        for i in range(R):
            end = int(prefix[i][r])
            assert (recv_w[start:end] == i).all()
            start = end
        cx, cw, _ = buf.combine(recv_x, handle, recv_w, config=cfg)
        holders = itr.sum(axis=1)[:, None]
        assert deep_ep.utils.math.calc_diff(cx.astype(np.float32) / holders, x.astype(np.float32)) < 5e-6
        assert deep_ep.utils.math.calc_diff(cw / holders, w) < 1e-9
        return int(recv_x.shape[0])

    totals = deep_ep.run_emulated(fn, R)
    owners = [np.argsort(-s, axis=1)[:, :K] // (E // R) for s in scores]
    assert sum(totals) == sum(len(set(row.tolist())) for o in owners for row in o)


def test_configs_and_static_helpers():
    assert deep_ep.Buffer.num_sms == 20 and deep_ep.Buffer.is_sm90_compiled()
    cfg = deep_ep.Buffer.get_dispatch_config(8)
    assert repr(cfg) == repr(deep_ep.Config(20, 6, 256, 6, 128))
    assert cfg.num_max_rdma_chunked_recv_tokens == 132  # 128 rounded up to a multiple of 6
    assert repr(deep_ep.Buffer.get_combine_config(160)) == repr(deep_ep.Config(20, 2, 720, 8, 128))
    with pytest.raises(DGUtilityError, match="num_ranks"):
        deep_ep.Buffer.get_dispatch_config(3)
    try:
        deep_ep.Buffer.set_num_sms(24)
        assert deep_ep.Buffer.get_combine_config(4).num_sms == 24
        with pytest.raises(DGUtilityError, match="new_num_sms"):
            deep_ep.Buffer.set_num_sms(23)
    finally:
        deep_ep.Buffer.set_num_sms(20)
    for bad in ((20, 256, 256), (20, 6, 256, 200, 128), (-2,)):
        with pytest.raises(DGArgumentError):
            deep_ep.Config(*bad)
    # DeepEP's low-latency layout by hand (T_max 128, H 7168, E 288): messages of 16 + 14336 and
    # 224 + 14336 bytes; send max(128 * 14352, 288 * 128 * 14560), recv max of the two with 288 * 128
    # dispatch messages, signalling align(288 * 4, 128); the hint adds 128 and rounds down to 128.
    send = max(128 * 14352, 288 * 128 * 14560)
    recv = max(288 * 128 * 14352, 288 * 128 * 14560)
    total = 2 * (send + recv + 1152)
    assert deep_ep.Buffer.get_low_latency_rdma_size_hint(128, 7168, 8, 288) == (total + 128) // 128 * 128
    ev = deep_ep.Buffer.capture()
    assert isinstance(ev, deep_ep.EventOverlap) and ev.event is not None


def test_buffer_construction_checks_and_local_tensors():
    def fn(g: Any) -> None:
        with pytest.raises(DGArgumentError, match="num_nvl_bytes"):
            deep_ep.Buffer(g, 100)
        with pytest.raises(DGArgumentError, match="num_rdma_bytes"):
            deep_ep.Buffer(g, 0, 1 << 20)  # RDMA bytes need low-latency mode on one host
        with pytest.raises(DGArgumentError, match="group"):
            deep_ep.Buffer(None)
        with pytest.raises(NotImplementedError, match="comm"):
            deep_ep.Buffer(None, comm=object())
        buf = deep_ep.Buffer(g, 4096, explicitly_destroy=True)
        assert (buf.rank, buf.group_size, buf.num_nvl_bytes, buf.low_latency_mode) == (g.rank(), 2, 4096, False)
        assert not hasattr(buf, "nvshmem_qp_depth")
        t = buf.get_local_buffer_tensor(np.int32, (4, 8), offset=64)
        assert t.shape == (4, 8) and t.dtype == np.int32 and not t.any()
        t[0, 0] = 7
        assert buf.get_local_buffer_tensor(np.int32, offset=64)[0] == 7
        assert buf.get_local_buffer_tensor(np.uint8).size == 4096
        with pytest.raises(DGUtilityError, match="size"):
            buf.get_local_buffer_tensor(np.int32, (2000,))
        with pytest.raises(NotImplementedError, match="one host"):
            buf.internode_dispatch(np.zeros((1, 256), BF16))
        buf.destroy()
        with pytest.raises(DGArgumentError, match="destroyed"):
            buf.get_dispatch_layout(np.zeros((1, 1), np.int64), 2)
        with pytest.raises(DGUtilityError, match="explicitly_destroy"):
            deep_ep.Buffer(g, 0).destroy()

    deep_ep.run_emulated(fn, 2)


def test_internode_sizes_raise_not_implemented():
    def fn(g: Any) -> None:
        buf = deep_ep.Buffer(g, NVL)
        ntr, ntrd, nte, itr, _ = buf.get_dispatch_layout(np.array([[g.rank() * 2]], np.int64), 32)
        assert ntrd is not None and ntrd.shape == (2,)
        with pytest.raises(NotImplementedError, match="one host"):
            buf.dispatch(np.zeros((1, 256), BF16), num_tokens_per_rank=ntr, is_token_in_rank=itr,
                         num_tokens_per_expert=nte)

    deep_ep.run_emulated(fn, 16)


def test_ascend950_has_no_legacy_buffer():
    def fn(g: Any) -> None:
        with pytest.raises(DGArgumentError, match="not provided by DeepEP-Ascend"):
            deep_ep.Buffer(g, NVL)

    with dg.numerics(arch="ascend950"):
        deep_ep.run_emulated(fn, 2)
        assert deep_ep.Config(20).num_sms == 20  # the config and the static helpers stay available
        assert deep_ep.Buffer.get_low_latency_rdma_size_hint(8, 2048, 2, 4) > 0


# ----------------------------------------------------------------------------------------------
# argument errors: before anything is written, on every rank, without a hang
# ----------------------------------------------------------------------------------------------

def _every_rank(R: int, call: Any, **buffer_kw: Any) -> list[BaseException | None]:
    def fn(g: Any) -> BaseException | None:
        buf = deep_ep.Buffer(g, NVL, **buffer_kw)
        try:
            call(buf, g.rank())
        except BaseException as e:  # noqa: BLE001 - returned for inspection
            return e
        return None

    return deep_ep.run_emulated(fn, R, timeout_s=20.0)


def _layout(idx: np.ndarray, E: int, R: int) -> dict:
    lay = routing.dispatch_layout(idx, E, R)
    return dict(num_tokens_per_rank=lay.num_tokens_per_rank, is_token_in_rank=lay.is_token_in_rank,
                num_tokens_per_expert=lay.num_tokens_per_expert)


BAD_DISPATCH = {
    "topk id out of range": (lambda x, i, w: dict(x=x, topk_idx=np.where(i == i[0, 0], 16, i), topk_weights=w,
                                                   **_layout(i, 16, 2)), "topk_idx"),
    "an expert twice": (lambda x, i, w: dict(x=x, topk_idx=np.concatenate([i[:, :1], i[:, :1], i[:, 2:]], 1),
                                              topk_weights=w, **_layout(i, 16, 2)), "topk_idx"),
    "weights without ids": (lambda x, i, w: dict(x=x, topk_weights=w, **_layout(i, 16, 2)), "topk_idx"),
    "float32 x": (lambda x, i, w: dict(x=x.astype(np.float32), topk_idx=i, topk_weights=w, **_layout(i, 16, 2)),
                  "x"),
    "layout mismatch": (lambda x, i, w: dict(x=x, topk_idx=i, topk_weights=w, **dict(
        _layout(i, 16, 2), is_token_in_rank=~_layout(i, 16, 2)["is_token_in_rank"],
        num_tokens_per_rank=(~_layout(i, 16, 2)["is_token_in_rank"]).sum(0).astype(np.int32))), "is_token_in_rank"),
    "counts mismatch": (lambda x, i, w: dict(x=x, topk_idx=i, topk_weights=w, **dict(
        _layout(i, 16, 2), num_tokens_per_rank=np.zeros(2, np.int32))), "num_tokens_per_rank"),
    "odd num_sms": (lambda x, i, w: dict(x=x, topk_idx=i, topk_weights=w, config=deep_ep.Config(21),
                                         **_layout(i, 16, 2)), "config"),
    "comm stream without event": (lambda x, i, w: dict(x=x, topk_idx=i, topk_weights=w, allocate_on_comm_stream=True,
                                                       async_finish=True, **_layout(i, 16, 2)),
                                  "allocate_on_comm_stream"),
    "worst without top-k": (lambda x, i, w: dict(x=x, num_worst_tokens=64, **_layout(i, 16, 2)), "topk_idx"),
    "too few worst tokens": (lambda x, i, w: dict(x=x, topk_idx=i, topk_weights=w, num_worst_tokens=1,
                                                  **_layout(i, 16, 2)), "num_worst_tokens"),
}


@pytest.mark.parametrize("name", sorted(BAD_DISPATCH))
def test_bad_dispatch_raises_on_every_rank(name):
    make, arg = BAD_DISPATCH[name]
    R = 2
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((6, 256), dtype=np.float32).astype(BF16) for _ in range(R)]
    idx = [np.stack([rng.permutation(16)[:4] for _ in range(6)]).astype(np.int64) for _ in range(R)]

    def call(buf: Any, r: int) -> None:
        buf.dispatch(**make(xs[r], idx[r], np.ones((6, 4), np.float32)))

    for e in _every_rank(R, call):
        assert isinstance(e, DGArgumentError), repr(e)
        assert f": {arg}: expected" in str(e), str(e)


def test_ranks_that_disagree_raise_together():
    def call(buf: Any, r: int) -> None:
        h = 256 if r == 0 else 512
        idx = np.array([[0, 1]], np.int64)
        buf.dispatch(np.zeros((1, h), BF16), **_layout(idx, 4, 2))

    errs = _every_rank(2, call)
    assert all(isinstance(e, DGArgumentError) and "x (hidden)" in str(e) for e in errs), errs


def test_bad_combine_and_handles():
    c = make_case(2, seed=4)

    def fn(g: Any) -> list[str]:
        r = g.rank()
        buf = deep_ep.Buffer(g, NVL)
        lay = _layout(c.idx[r], c.E, 2)
        recv_x, _, recv_w, _, h, _ = buf.dispatch(c.xs[r], topk_idx=c.idx[r], topk_weights=c.ws[r], **lay)
        msgs = []
        T = len(c.idx[r])
        for call in (lambda: buf.combine(recv_x[:-1], h),
                     lambda: buf.combine(recv_x, h[:5]),
                     lambda: buf.combine(recv_x.astype(np.float32), h),
                     lambda: buf.combine(recv_x, h, bias=(np.zeros((T, c.H), BF16),)),
                     lambda: buf.combine(recv_x, h, bias=[np.zeros((T, c.H), BF16)]),
                     lambda: buf.combine(recv_x, h, bias=np.zeros((T + 1, c.H), BF16)),
                     lambda: buf.combine(recv_x, h, topk_weights=recv_w[:, :1].copy()[:-1]),
                     lambda: buf.dispatch(c.xs[r], handle=h, topk_idx=c.idx[r]),
                     lambda: buf.dispatch(c.xs[r], handle=h, config=deep_ep.Config(12))):
            with pytest.raises(DGArgumentError) as ei:
                call()
            msgs.append(str(ei.value))
        # a handle of another rank's dispatch: every rank raises in the collective's header
        other = tuple(h)
        swapped = (other[0], other[1], other[2], other[3], other[4], np.roll(other[5], 1, axis=1))
        with pytest.raises(DGArgumentError, match="handle"):
            buf.combine(recv_x, swapped)
        return msgs

    msgs = deep_ep.run_emulated(fn, 2, timeout_s=20.0)[0]
    for m, arg in zip(msgs, ("x", "handle", "x", "bias", "bias", "bias", "topk_weights", "topk_idx", "handle[1]"),
                      strict=True):
        assert f": {arg}: expected" in m, m


# ----------------------------------------------------------------------------------------------
# low-latency mode
# ----------------------------------------------------------------------------------------------

def ll_case(R: int, *, E: int | None = None, K: int = 3, H: int = 2048, T_max: int = 8, seed: int = 0,
            wide: bool = False) -> Case:
    rng = np.random.default_rng(seed + 7 * R)
    E = E or max(2, 2 * R)
    xs, idx, ws = [], [], []
    for s in range(R):
        t = T_max - (s % 3)
        rows = np.array([rng.permutation(E)[:min(K, E)] for _ in range(t)], np.int64).reshape(t, min(K, E))
        rows[rng.random(rows.shape) < 0.2] = -1
        idx.append(rows)
        ws.append(np.abs(rng.standard_normal((t, rows.shape[1]), dtype=np.float32)))
        if wide:
            mag = np.exp2(rng.integers(-20, 20, (t, H))).astype(np.float32)
            x = mag * rng.choice([-1.0, 1.0], (t, H)) * (1 + rng.integers(0, 128, (t, H)) / 128)
        else:
            x = rng.standard_normal((t, H), dtype=np.float32) * np.exp2(rng.integers(-6, 6, (t, 1)))
        xs.append(x.astype(np.float32).astype(BF16))
    c = Case(R, E, rows.shape[1], H, xs, idx, ws)
    c.extra["T_max"] = T_max
    return c


def ll_model(c: Case, r: int, blocked: np.ndarray | None = None) -> list[list[tuple[int, int]]]:
    """Per local expert of rank r: the (source rank, token) rows, sources then tokens ascending."""
    out = []
    for j in range(c.E_l):
        e = r * c.E_l + j
        rows = []
        for s in range(c.R):
            if blocked is not None and (blocked[r, s] or blocked[s, r]):
                continue
            rows += [(s, t) for t in range(len(c.idx[s])) if e in c.idx[s][t]]
        out.append(rows)
    return out


def run_ll(c: Case, *, use_fp8: bool, round_scale: bool = False, use_ue8m0: bool = False, combine: str | None = None,
           masks: list[int] | None = None, return_recv_hook: bool = False, seed: int = 3) -> list[dict]:
    T_max = c.extra["T_max"]
    hint = deep_ep.Buffer.get_low_latency_rdma_size_hint(T_max, c.H, c.R, c.E)

    def fn(g: Any) -> dict:
        r = g.rank()
        buf = deep_ep.Buffer(g, 0, hint, low_latency_mode=True, num_qps_per_rank=c.E_l, enable_shrink=masks is not None)
        for q in masks or []:
            buf.low_latency_update_mask_buffer(q, True)
        stats = np.full(c.E_l, 5, np.int32)
        wait = np.zeros(c.R, np.int64)
        out = buf.low_latency_dispatch(c.xs[r], c.idx[r], T_max, c.E, cumulative_local_expert_recv_stats=stats,
                                       dispatch_wait_recv_cost_stats=wait, use_fp8=use_fp8, round_scale=round_scale,
                                       use_ue8m0=use_ue8m0, async_finish=not return_recv_hook,
                                       return_recv_hook=return_recv_hook)
        res: dict[str, Any] = dict(dispatch=out, stats=stats, wait=wait)
        if masks is not None:
            status = np.zeros(c.R, np.int32)
            buf.low_latency_query_mask_buffer(status)
            res["mask"] = status
        if combine:
            recv = out[0][0] if use_fp8 else out[0]
            y = np.random.default_rng(seed + r).standard_normal(recv.shape, dtype=np.float32)
            y = (y * np.exp2(np.random.default_rng(seed).integers(-30, 30, recv.shape))).astype(BF16)
            if "y_fn" in c.extra:
                y = c.extra["y_fn"](r, recv)
            res["y"] = y
            handle = out[2]
            outbuf = np.full((len(c.idx[r]), c.H), 7, np.float32).astype(BF16)
            if combine == "zero_copy":
                zb = buf.get_next_low_latency_combine_buffer(handle)
                zb[...] = y
                res["combined"] = buf.low_latency_combine(np.zeros_like(y), c.idx[r], c.ws[r], handle,
                                                          zero_copy=True, out=outbuf)
            else:
                res["combined"] = buf.low_latency_combine(y, c.idx[r], c.ws[r], handle, out=outbuf)
            res["out"] = outbuf
        return res

    return deep_ep.run_emulated(fn, c.R)


def check_ll_dispatch(c: Case, res: list[dict], *, use_fp8: bool, round_scale: bool, use_ue8m0: bool,
                      blocked: np.ndarray | None = None) -> None:
    T_max = c.extra["T_max"]
    slots = c.R * T_max
    for r, out in enumerate(res):
        recv_x, count, handle, ev, hook = out["dispatch"]
        src_info, ranges, t_max, hidden, e = handle
        assert (t_max, hidden, e) == (T_max, c.H, c.E)
        model = ll_model(c, r, blocked)
        data = recv_x[0] if use_fp8 else recv_x
        assert data.shape == (c.E_l, slots, c.H) and data.dtype == (E4M3 if use_fp8 else BF16)
        if use_fp8:
            sc = recv_x[1]
            G = c.H // 512 if use_ue8m0 else c.H // 128
            assert sc.shape == (c.E_l, slots, G) and sc.dtype == (np.int32 if use_ue8m0 else np.float32)
            assert tuple(v // 4 for v in sc.strides) == (G * slots, 1, slots)  # column-major per expert
        for j, rows in enumerate(model):
            assert int(count[j]) == len(rows)
            begin = 0
            for s in range(c.R):
                n = sum(1 for q, _ in rows if q == s)
                assert int(ranges[j, s]) == (begin << 32) | n
                begin += n
            assert same(src_info[j], np.array([t for _, t in rows] + [-1] * (slots - len(rows)), np.int32))
            for i, (s, t) in enumerate(rows):
                if use_fp8:
                    q, sinv = fp8_cast_model(c.xs[s][t], round_scale)
                    assert np.array_equal(data[j, i].view(np.uint8), q), (r, j, i)
                    if use_ue8m0:
                        b = ((sinv.view(np.uint32) >> 23) & 0xFF).astype(np.uint8)
                        assert np.array_equal(np.ascontiguousarray(recv_x[1][j, i]).view(np.uint8), b)
                    else:
                        assert same(recv_x[1][j, i], sinv)
                else:
                    assert same(data[j, i], c.xs[s][t])
            assert not data[j, len(rows):].view(np.uint8).any()
        assert same(out["stats"], (5 + np.array([len(v) for v in model])).astype(np.int32))
        assert not out["wait"].any()
        assert (ev.event is None) == (hook is not None)


LL_MATRIX = [
    # (R, use_fp8, round_scale, use_ue8m0)
    (1, False, False, False),
    (1, True, True, True),
    (2, True, False, False),
    (2, False, False, False),
    (4, True, True, False),
    (4, True, True, True),
]


@pytest.mark.parametrize(("R", "use_fp8", "round_scale", "use_ue8m0"), LL_MATRIX)
def test_low_latency_dispatch_matches_the_model(R, use_fp8, round_scale, use_ue8m0):
    c = ll_case(R, seed=R + 10 * use_fp8 + 20 * round_scale)
    res = run_ll(c, use_fp8=use_fp8, round_scale=round_scale, use_ue8m0=use_ue8m0, return_recv_hook=R == 2)
    check_ll_dispatch(c, res, use_fp8=use_fp8, round_scale=round_scale, use_ue8m0=use_ue8m0)


def ll_combine_model(c: Case, res: list[dict], s: int, blocked: np.ndarray | None = None) -> np.ndarray:
    """acc = +0; acc = RN32(acc + y * w) per valid slot in top-k order; bf16 of acc."""
    models = [ll_model(c, q, blocked) for q in range(c.R)]
    T = len(c.idx[s])
    out = np.zeros((T, c.H), np.uint16)
    for t in range(T):
        acc = np.zeros(c.H, np.float32)
        for k in range(c.K):
            e = int(c.idx[s][t, k])
            if e < 0:
                continue
            q = e // c.E_l
            if blocked is not None and (blocked[s, q] or blocked[q, s]):
                continue
            row = models[q][e - q * c.E_l].index((s, t))
            acc = fma_model(acc, f32_of(res[q]["y"][e - q * c.E_l, row]), float(c.ws[s][t, k]))
        out[t] = bf16_bits(acc)
    return out


@pytest.mark.parametrize(("R", "mode"), [(1, "plain"), (2, "zero_copy"), (4, "plain")])
def test_low_latency_combine_is_the_fma_chain(R, mode):
    c = ll_case(R, K=4 if R > 1 else 2, E=4 * R if R > 1 else 2, seed=40 + R)
    res = run_ll(c, use_fp8=False, combine=mode)
    for s, out in enumerate(res):
        cx, ev, hook = out["combined"]
        assert cx is out["out"]  # out= is written and returned
        assert same(cx, ll_combine_model(c, res, s).view(BF16)), (s, mode)
        assert ev.event is None and hook is None  # a synchronous call


def test_low_latency_combine_fma_is_visible():
    """Two slots of one token with equal weights and opposite rows: the fused chain leaves the
    rounding error of the first product (RN32(RN32(y w) - y w) != 0), a separate multiply and add
    leave exactly 0.  The outputs match the model and are not all zero."""
    R, E = 2, 4
    rng = np.random.default_rng(6)
    c = ll_case(R, K=2, E=E, seed=1)
    for s in range(R):
        t = len(c.idx[s])
        even = rng.integers(0, 2, t) * 2
        c.idx[s] = np.stack([even, 3 - even], axis=1).astype(np.int64)  # one even, one odd expert
        w = rng.standard_normal(t, dtype=np.float32)
        c.ws[s] = np.stack([w, w], axis=1)
    c.extra["y_fn"] = lambda r, recv: np.stack([recv[j] if (r * 2 + j) % 2 == 0 else -recv[j].astype(np.float32)
                                                for j in range(2)]).astype(BF16)
    res = run_ll(c, use_fp8=False, combine="plain")
    nonzero = 0
    for s, out in enumerate(res):
        cx = out["combined"][0]
        assert same(cx, ll_combine_model(c, res, s).view(BF16))
        nonzero += int(np.count_nonzero(cx.view(np.uint16) & 0x7FFF))
    assert nonzero > 0


def test_low_latency_shrink_masks():
    """Shrink mode: every rank masks rank 1 (DeepEP's test simulates its failure); nothing moves
    between rank 1 and the others, counts and stats skip it, combine skips its experts, and the
    masks read back (rank 1 ends up masking everybody, as its timeouts would)."""
    R = 4
    c = ll_case(R, K=4, E=8, seed=77)
    res = run_ll(c, use_fp8=True, combine="plain", masks=[1])
    blocked = np.zeros((R, R), bool)
    blocked[:, 1] = True
    check_ll_dispatch(c, res, use_fp8=True, round_scale=False, use_ue8m0=False, blocked=blocked)
    for s, out in enumerate(res):
        assert same(out["combined"][0], ll_combine_model(c, res, s, blocked).view(BF16))
        want = np.ones(R, np.int32) if s == 1 else np.eye(R, dtype=np.int32)[1]
        assert same(out["mask"], want)


def test_clean_buffer_and_mask_api():
    """clean_low_latency_buffer is a barrier of the group; in shrink mode a rank masked by a peer
    masks it back (DeepEP's clean_low_latency_buffer masks ranks whose barrier times out)."""
    R, T, H, E = 4, 8, 2048, 8
    hint = deep_ep.Buffer.get_low_latency_rdma_size_hint(T, H, R, E)

    def fn(g: Any) -> list[int]:
        r = g.rank()
        buf = deep_ep.Buffer(g, 0, hint, low_latency_mode=True, num_qps_per_rank=2, enable_shrink=True)
        assert buf.get_comm_stream() is not None
        if r == 0:
            buf.low_latency_update_mask_buffer(3, True)
        buf.clean_low_latency_buffer(T, H, E)
        status = np.full(R, 9, np.int32)
        buf.low_latency_query_mask_buffer(status)
        seen = status.tolist()
        buf.low_latency_clean_mask_buffer()
        buf.low_latency_query_mask_buffer(status)
        assert not status.any()
        with pytest.raises(DGArgumentError, match="rank_to_mask"):
            buf.low_latency_update_mask_buffer(R, True)
        with pytest.raises(DGArgumentError, match="mask_status"):
            buf.low_latency_query_mask_buffer(np.zeros(R, np.int64))
        with pytest.raises(DGArgumentError, match="num_experts"):
            buf.clean_low_latency_buffer(T, H, 1 << 30)  # signalling past the buffer
        return seen

    masks = deep_ep.run_emulated(fn, R)
    assert masks == [[0, 0, 0, 1], [0, 0, 0, 0], [0, 0, 0, 0], [1, 0, 0, 0]]


def test_deepep_low_latency_idioms():
    """tests/legacy/test_low_latency.py's checks: x = rank - 128 with the token index in the last 128
    channels; per-source blocks hold that source's value; combine of the cast-back data with the
    weights is within calc_diff 1e-5 (BF16) / 9e-4 (FP8) of x * sum(weights)."""
    R, T, H, K, E = 2, 8, 2048, 4, 8
    rng = np.random.default_rng(1)
    hint = deep_ep.Buffer.get_low_latency_rdma_size_hint(T, H, R, E)

    def fn(g: Any) -> list[float]:
        r = g.rank()
        buf = deep_ep.Buffer(g, 0, hint, low_latency_mode=True, num_qps_per_rank=E // R, explicitly_destroy=True)
        x = np.full((T, H), r - 128, np.float32)
        x[:, -128:] = np.arange(T, dtype=np.float32)[:, None]
        x = x.astype(BF16)
        topk = np.argsort(-(np.abs(rng.standard_normal((T, E))) + 1), axis=1)[:, :K].astype(np.int64)
        topk[1, 2] = -1
        w = np.abs(rng.standard_normal((T, K))).astype(np.float32)
        diffs = []
        for use_fp8 in (False, True):
            stats = np.zeros(E // R, np.int32)
            px, cnt, handle, ev, hook = buf.low_latency_dispatch(x, topk, T, E, stats, use_fp8=use_fp8)
            if use_fp8:
                sim = deep_ep.utils.math.per_token_cast_back(px[0].reshape(-1, H), np.ascontiguousarray(px[1]).reshape(
                    -1, H // 128)).reshape(px[0].shape)
            else:
                sim = px.copy()
            for i in range(E // R):
                n = int(cnt[i])
                assert int(stats[i]) == n == int((handle[1][i] & 0xFFFFFFFF).sum())
                rx = sim[i, :n].astype(np.float32)
                assert (rx[:, -128:] == (handle[0][i, :n] % T)[:, None]).all()
                for j in range(R):
                    b, m = int(handle[1][i, j] >> 32), int(handle[1][i, j] & 0xFFFFFFFF)
                    assert (rx[b:b + m, :-128] == j - 128).all()
            cx, _, _ = buf.low_latency_combine(sim, topk, w, handle)
            ref = x.astype(np.float32) * np.where(topk >= 0, w, 0).sum(axis=1, keepdims=True)
            diffs.append(deep_ep.utils.math.calc_diff(ref, cx.astype(np.float32)))
        buf.destroy()
        return diffs

    for bf16_diff, fp8_diff in deep_ep.run_emulated(fn, R):
        assert bf16_diff < 1e-5 and fp8_diff < 9e-4


BAD_LL = {
    "hidden not compiled": (lambda x, i, s: dict(x=x[:, :1024].copy(), topk_idx=i, num_max_dispatch_tokens_per_rank=8,
                                                 num_experts=8, cumulative_local_expert_recv_stats=s), "x"),
    "too many tokens": (lambda x, i, s: dict(x=x, topk_idx=i, num_max_dispatch_tokens_per_rank=4, num_experts=8,
                                             cumulative_local_expert_recv_stats=s), "x"),
    "ue8m0 without round_scale": (lambda x, i, s: dict(x=x, topk_idx=i, num_max_dispatch_tokens_per_rank=8,
                                                       num_experts=8, use_ue8m0=True,
                                                       cumulative_local_expert_recv_stats=s), "use_ue8m0"),
    "too many top-k": (lambda x, i, s: dict(x=x, topk_idx=np.tile(np.arange(12, dtype=np.int64) - 12, (6, 1)),
                                            num_max_dispatch_tokens_per_rank=8, num_experts=8,
                                            cumulative_local_expert_recv_stats=s), "topk_idx"),
    "stats dtype": (lambda x, i, s: dict(x=x, topk_idx=i, num_max_dispatch_tokens_per_rank=8, num_experts=8,
                                         cumulative_local_expert_recv_stats=s.astype(np.int64)),
                    "cumulative_local_expert_recv_stats"),
    "layout past the buffer": (lambda x, i, s: dict(x=x, topk_idx=i, num_max_dispatch_tokens_per_rank=64,
                                                    num_experts=8, cumulative_local_expert_recv_stats=s),
                               "num_max_dispatch_tokens_per_rank"),
    "hook and async": (lambda x, i, s: dict(x=x, topk_idx=i, num_max_dispatch_tokens_per_rank=8, num_experts=8,
                                            async_finish=True, return_recv_hook=True,
                                            cumulative_local_expert_recv_stats=s), "return_recv_hook"),
    "odd R * T_max": (lambda x, i, s: dict(x=x[:5].copy(), topk_idx=i[:5].copy(), num_max_dispatch_tokens_per_rank=7,
                                           num_experts=8, cumulative_local_expert_recv_stats=s),
                      "num_max_dispatch_tokens_per_rank"),
}


@pytest.mark.parametrize("name", sorted(BAD_LL))
def test_bad_low_latency_dispatch_writes_nothing(name):
    make, arg = BAD_LL[name]
    R = 2
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((6, 2048), dtype=np.float32).astype(BF16) for _ in range(R)]
    idx = [np.stack([rng.permutation(8)[:3] for _ in range(6)]).astype(np.int64) for _ in range(R)]
    stats = [np.full(4, 9, np.int32) for _ in range(R)]
    hint = deep_ep.Buffer.get_low_latency_rdma_size_hint(8, 2048, R, 8)

    def call(buf: Any, r: int) -> None:
        buf.low_latency_dispatch(**make(xs[r], idx[r], stats[r]))

    for e in _every_rank(R, call, num_rdma_bytes=hint, low_latency_mode=True, num_qps_per_rank=4):
        assert isinstance(e, DGArgumentError), repr(e)
        assert f": {arg}: expected" in str(e), str(e)
    assert all(same(s, np.full(4, 9, np.int32)) for s in stats)


def test_bad_low_latency_combine_writes_nothing():
    R, T, H, E = 2, 8, 2048, 4
    hint = deep_ep.Buffer.get_low_latency_rdma_size_hint(T, H, R, E)
    idx = [np.array([[0, 3]] * T, np.int64), np.array([[1, 2]] * T, np.int64)]
    w = np.ones((T, 2), np.float32)

    def fn(g: Any) -> None:
        r = g.rank()
        buf = deep_ep.Buffer(g, NVL, hint, low_latency_mode=True, num_qps_per_rank=2)
        x = np.ones((T, H), np.float32).astype(BF16)
        px, _, handle, _, _ = buf.low_latency_dispatch(x, idx[r], T, E, use_fp8=False)
        out = np.full((T, H), 3, np.float32).astype(BF16)
        for kw, arg in ((dict(use_logfmt=True, zero_copy=True), "zero_copy"),
                        (dict(out=np.zeros((T, H), np.float32)), "out"),
                        (dict(out=out, topk_weights=w[:, :1].copy()), "topk_weights"),
                        (dict(out=out, x=px[:, :-4].copy()), "x"),
                        (dict(out=out, topk_idx=np.array([[0, 9]] * T, np.int64)), "topk_idx")):
            args = dict(x=px, topk_idx=idx[r], topk_weights=w, handle=handle)
            args.update(kw)
            with pytest.raises(DGArgumentError, match=f": {arg}: expected"):
                buf.low_latency_combine(**args)
            assert (out.astype(np.float32) == 3).all()
        with pytest.raises(NotImplementedError, match="LogFMT"):
            buf.low_latency_combine(px, idx[r], w, handle, use_logfmt=True, out=out)
        assert (out.astype(np.float32) == 3).all()
        with pytest.raises(DGArgumentError, match="low_latency_mode"):
            deep_ep.Buffer(g, NVL).low_latency_dispatch(x, idx[r], T, E)
        with pytest.raises(DGArgumentError, match="enable_shrink"):
            buf.low_latency_update_mask_buffer(0, True)
        # a routing other than the dispatched one: no row for some slot (every rank raises after
        # the exchange, so the group stays in step)
        with pytest.raises(DGArgumentError, match="topk_idx"):
            buf.low_latency_combine(px, idx[1 - r], w, handle, out=out)

    deep_ep.run_emulated(fn, R, timeout_s=30.0)


# ----------------------------------------------------------------------------------------------
# the pure layer: cast, FMA, packed layout
# ----------------------------------------------------------------------------------------------

def test_cast_matches_the_model_on_edge_values():
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((3, 512), dtype=np.float32) * np.exp2(rng.integers(-40, 40, (3, 4)).repeat(128, 1)))
    x[0, :128] = 0  # amax floor
    x[1, 5] = np.nan  # ignored by the amax (fmaxf), NaN in the output
    x[2, 300] = np.inf  # amax inf: the whole block's scale is 0 / inf
    xb = x.astype(BF16)
    for rounded in (False, True):
        q, sinv = cast.low_latency_cast_fp8(xb, rounded)
        for t in range(3):
            mq, ms = fp8_cast_model(xb[t], rounded)
            got = q[t].view(np.uint8)
            nan = (got & 0x7F) == 0x7F
            assert np.array_equal(nan, mq == 0x7F) and np.array_equal(got[~nan], mq[~nan]), (t, rounded)
            assert same(sinv[t], ms), (t, rounded)
    packed = cast.pack_ue8m0(sinv)
    assert packed.shape == (3, 1) and packed.dtype == np.int32
    assert np.array_equal(packed.view(np.uint8).reshape(3, 4), ((sinv.view(np.uint32) >> 23) & 0xFF).astype(np.uint8))
    assert same(cast.unpack_ue8m0(packed)[:2, 1:], sinv[:2, 1:])


def _double_rounding_cases() -> list[tuple[np.float32, np.float32, np.float32]]:
    """(acc, x, w) whose float64 sum rounds onto a float32 midpoint the exact sum is not on:
    acc = 1 + odd 2^-23, x w = (2j + 1) 2^-24 +- 2^-54 (half an ulp of acc and a bit below half
    a float64 ulp) with x bf16 and w float32 (found by search)."""
    cases = []
    for j in range(2):
        for sgn in (1, -1):
            m = (2 * j + 1) * 2**30 + sgn  # x w = m 2^-54
            for xm in range(3, 256, 2):
                if m % xm == 0 and m // xm < 2**24:
                    x = np.float32(xm * 2.0**-6)  # at most 8 significant bits: a bf16 value
                    w = np.float32((m // xm) * 2.0**-48)
                    for odd in (1, 3, 5):
                        cases.append((np.float32(1 + odd * 2.0**-23), x, w))
                    break
    return cases


def test_fma_is_exact_without_double_rounding():
    cases = _double_rounding_cases()
    assert cases, "no double-rounding case found"
    naive_wrong = 0
    for acc, x, w in cases:
        assert float(np.float32(x).astype(BF16)) == float(x)
        exact = Fraction(float(acc)) + Fraction(float(x)) * Fraction(float(w))
        want = f32_round_fraction(exact)
        got = reduction.fma_f32(np.array([acc]), np.array([x], np.float32).astype(BF16), np.array([w]))[0]
        assert got == want and np.float32(got).view(np.uint32) == want.view(np.uint32)
        naive = np.float32(np.float64(acc) + np.float64(x) * np.float64(w))
        naive_wrong += int(naive != want)
    assert naive_wrong > 0  # the float64-then-float32 shortcut is wrong on some of them
    # random wide-range values: the model (midpoints resolved with rationals) agrees everywhere
    rng = np.random.default_rng(2)
    acc = (rng.standard_normal(4000) * np.exp2(rng.integers(-60, 60, 4000))).astype(np.float32)
    xb = (rng.standard_normal(4000) * np.exp2(rng.integers(-60, 60, 4000))).astype(np.float32).astype(BF16)
    w = np.float32(rng.standard_normal())
    got = reduction.fma_f32(acc, xb, np.full(4000, w, np.float32))
    assert same(got, fma_model(acc, xb.astype(np.float32), float(w)))
    for i in range(0, 4000, 97):  # and the rationals themselves on a sample
        exact = Fraction(float(acc[i])) + Fraction(float(xb[i])) * Fraction(float(w))
        assert got[i] == f32_round_fraction(exact)


def test_pure_packed_layout_of_a_whole_case():
    c = ll_case(4, K=4, E=8, seed=9)
    lays = routing.case_packed_layouts(c.idx, c.E, c.extra["T_max"])
    for r, lay in enumerate(lays):
        model = ll_model(c, r)
        assert lay.recv_count.tolist() == [len(v) for v in model]
        for j, rows in enumerate(model):
            assert lay.src_info()[j, :len(rows)].tolist() == [t for _, t in rows]


# ----------------------------------------------------------------------------------------------
# torch tensors, and gloo processes
# ----------------------------------------------------------------------------------------------

@pytest.mark.torch
def test_torch_tensors_in_and_out():
    torch = pytest.importorskip("torch")
    R, T, H, E = 2, 8, 2048, 4
    hint = deep_ep.Buffer.get_low_latency_rdma_size_hint(T, H, R, E)

    def fn(g: Any) -> None:
        r = g.rank()
        buf = deep_ep.Buffer(g, NVL, hint, low_latency_mode=True, num_qps_per_rank=2)
        x = torch.randn((T, H), generator=torch.Generator().manual_seed(r)).to(torch.bfloat16)
        idx = torch.tensor([[0, 3]] * T, dtype=torch.int64) if r == 0 else torch.tensor([[1, 2]] * T)
        w = torch.ones((T, 2), dtype=torch.float32)
        ntr, _, nte, itr, _ = buf.get_dispatch_layout(idx, E)
        assert isinstance(ntr, torch.Tensor) and itr.dtype == torch.bool
        recv_x, recv_idx, recv_w, lst, h, _ = buf.dispatch(x, num_tokens_per_rank=ntr, is_token_in_rank=itr,
                                                           num_tokens_per_expert=nte, topk_idx=idx, topk_weights=w)
        assert recv_x.dtype == torch.bfloat16 and h[4] is itr
        cx, cw, _ = buf.combine(recv_x, h, recv_w)
        assert torch.equal(cx, x * 2) and torch.equal(cw, w)  # every token is on both ranks
        stats = torch.zeros(2, dtype=torch.int32)
        px, cnt, hh, _, _ = buf.low_latency_dispatch(x, idx, T, E, stats, use_fp8=True, round_scale=True,
                                                     use_ue8m0=True)
        assert px[0].dtype == torch.float8_e4m3fn and px[1].dtype == torch.int32 and px[1].stride()[1] == 1
        assert torch.equal(stats, cnt)
        zb = buf.get_next_low_latency_combine_buffer(hh)
        assert isinstance(zb, torch.Tensor) and zb.stride() == (R * T * (H + H // 64), H + H // 64, 1)
        out = torch.empty((T, H), dtype=torch.bfloat16)
        y = torch.zeros((2, R * T, H), dtype=torch.bfloat16)
        got, _, _ = buf.low_latency_combine(y, idx, w, hh, out=out)
        assert got is out and not out.any()

    deep_ep.run_emulated(fn, R)


def scenario(group: Any) -> dict[str, np.ndarray]:
    """One rank's outputs of a fixed scenario (both paths), as raw bytes keyed by name."""
    R, r = group.size(), group.rank()
    c = make_case(R, seed=11, fp8=False)
    lc = ll_case(R, K=3, E=2 * R, seed=12)
    T_max = lc.extra["T_max"]
    hint = deep_ep.Buffer.get_low_latency_rdma_size_hint(T_max, lc.H, R, lc.E)
    buf = deep_ep.Buffer(group, NVL, hint, low_latency_mode=True, num_qps_per_rank=lc.E_l)
    out: dict[str, np.ndarray] = {}
    lay = _layout(c.idx[r], c.E, R)
    recv_x, recv_idx, recv_w, lst, h, _ = buf.dispatch(c.xs[r], topk_idx=c.idx[r], topk_weights=c.ws[r], **lay)
    bias = (c.xs[r] * 2, c.xs[r])
    cx, cw, _ = buf.combine(recv_x, h, recv_w, bias=bias)
    for name, a in (("recv_x", recv_x), ("recv_idx", recv_idx), ("recv_w", recv_w), ("cx", cx), ("cw", cw),
                    *((f"handle{i}", np.asarray(v)) for i, v in enumerate(h))):
        out[name] = np.ascontiguousarray(np.asarray(a)).view(np.uint8).ravel()
    px, cnt, hh, _, _ = buf.low_latency_dispatch(lc.xs[r], lc.idx[r], T_max, lc.E, use_fp8=True, round_scale=True)
    y = np.random.default_rng(r).standard_normal(px[0].shape, dtype=np.float32).astype(BF16)
    lx, _, _ = buf.low_latency_combine(y, lc.idx[r], lc.ws[r], hh)
    for name, a in (("px", px[0]), ("ps", np.ascontiguousarray(px[1])), ("cnt", cnt), ("src_info", hh[0]),
                    ("ranges", hh[1]), ("lx", lx)):
        out[name] = np.ascontiguousarray(np.asarray(a)).view(np.uint8).ravel()
    return out


_CHILD = textwrap.dedent("""
    import sys
    import numpy as np
    import torch.distributed as dist
    rank, R, store, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    sys.path.insert(0, {tests!r})
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=R)
    from tests import test_ep_legacy as t
    np.savez(out, **t.scenario(dist.group.WORLD))
    dist.barrier()
    dist.destroy_process_group()
""")


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.parametrize("R", [2, 4])
def test_gloo_processes_give_the_in_process_bytes(tmp_path, R):
    pytest.importorskip("torch")
    script = tmp_path / "child.py"
    script.write_text(_CHILD.format(tests=str(ROOT / "tests")))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    run_rank_processes(lambda r: [sys.executable, str(script), str(r), str(R), str(tmp_path / "store"),
                                  str(tmp_path / f"out{r}.npz")], R, env)
    local = deep_ep.run_emulated(scenario, R)
    for r in range(R):
        with np.load(tmp_path / f"out{r}.npz") as got:
            assert sorted(got.files) == sorted(local[r])
            for name in got.files:
                assert np.array_equal(got[name], local[r][name]), (r, name)
    assert json.dumps(sorted(local[0])) != "[]"
