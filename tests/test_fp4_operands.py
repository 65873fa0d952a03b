"""Packed FP4 operands are the same bytes as int8, uint8 or ``torch.float4_e2m1fn_x2``, everywhere FP4 goes in.

DeepGEMM-Ascend's test generators make FP4 operands as int8 data with ``torch.float4_e2m1fn_x2`` as a
dtype tag; a caller may equally hold the bytes as uint8 or as a float4_e2m1fn_x2 tensor.  Every form
gives the same output bytes: dense and grouped GEMMs, MQA q / kv (plain and paged), Mega MoE weights.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import deepgemm_ref as dg
from deepgemm_ref import formats as fm
from deepgemm_ref import mega
from deepgemm_ref.interop import to_numpy

from .test_mega_moe import Problem, _pairs

BF16 = ml_dtypes.bfloat16


def _rand(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _fp4(x):
    return dg.per_token_cast_to_fp4(x, use_ue8m0=True, gran_k=32)


def _pairs_of(sf32):
    return fm.pack_ue8m0_int16(fm.ue8m0_encode(sf32, "ceil"))


def _forms(packed: np.ndarray) -> dict[str, object]:
    """The same packed bytes as int8 and uint8 arrays, and (with torch) the three tensor forms."""
    out: dict[str, object] = {"int8": packed, "uint8": packed.view(np.uint8)}
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is optional
        return out
    t = torch.from_numpy(np.ascontiguousarray(packed))
    out.update({"torch int8": t, "torch uint8": t.view(torch.uint8),
                "torch float4_e2m1fn_x2": t.view(torch.float4_e2m1fn_x2)})
    return out


def _bytes(x) -> bytes:
    return np.asarray(to_numpy(x)).tobytes()


@pytest.mark.parametrize("arch", ["sm100", "ascend950"])
def test_dense_gemm_takes_every_form(arch):
    a32, b32 = _rand((64, 128), 1), _rand((48, 128), 2)
    with dg.numerics(arch=arch):
        (pa, sa), (pb, sb) = _fp4(a32), _fp4(b32)
        if arch == "ascend950":
            sa, sb = _pairs_of(sa), _pairs_of(sb)
        kw = {} if arch == "ascend950" else {"recipe": (1, 1, 32)}
        results = {}
        for name, form in _forms(pb).items():
            fa = _forms(pa)[name]
            d = np.zeros((64, 48), np.float32)
            dg.fp8_fp4_gemm_nt((fa, sa), (form, sb), d, **kw)
            results[name] = d.tobytes()
        assert len(set(results.values())) == 1 and np.any(d), results.keys()


def test_ascend_fp8_x_fp4_and_m_grouped_take_every_form():
    with dg.numerics(arch="ascend950"):
        a8, sa = dg.per_token_cast_to_fp8(_rand((512, 128), 3), use_ue8m0=True, gran_k=32)
        pb, sb = _fp4(_rand((2 * 32, 128), 4))
        pb3, sb3 = pb.reshape(2, 32, 64), _pairs_of(sb).reshape(2, 32, 2)
        ends = np.array([100, 400], np.int32)
        dense, grouped = set(), set()
        for form in _forms(pb3).values():
            d = np.zeros((512, 32), BF16)
            dg.m_grouped_fp8_fp4_gemm_nt_contiguous((a8, _pairs_of(sa)), (form, sb3), d, ends)
            grouped.add(d.tobytes())
            d2 = np.zeros((512, 64), np.float32)
            flat = form.reshape(64, 64) if hasattr(form, "reshape") else form
            dg.fp8_fp4_gemm_nt((a8, _pairs_of(sa)), (flat, _pairs_of(sb)), d2)
            dense.add(d2.tobytes())
        assert len(grouped) == 1 and len(dense) == 1


def test_mqa_q_and_kv_take_every_form():
    seq, seq_kv, heads, d = 3, 30, 8, 128
    with dg.numerics(arch="ascend950"):
        qp, qs = _fp4(_rand((seq * heads, d), 5))
        kp, ks = _fp4(_rand((seq_kv, d), 6))
        w = _rand((seq, heads), 7).astype(BF16)
        lo, hi = np.zeros(seq, np.int32), np.full(seq, seq_kv, np.int32)
        outs = {_bytes(dg.fp8_fp4_mqa_logits((fq.reshape(seq, heads, d // 2), _pairs_of(qs)), (fk, _pairs_of(ks)),
                                             w, lo, hi, seq_kv))
                for fq, fk in zip(_forms(qp).values(), _forms(kp).values(), strict=True)}
        assert len(outs) == 1
        # paged: the cache is a byte container; q is the FP4 operand
        page = 64
        cache = np.zeros((1, page, 1, d // 2 + 2 * (d // 64)), np.uint8)
        flat = cache.reshape(1, -1)
        flat[0, :seq_kv * d // 2] = kp.view(np.uint8).reshape(-1)
        flat[0, page * d // 2:page * d // 2 + seq_kv * 4] = _pairs_of(ks).view(np.uint8).reshape(-1)
        ctx = np.full((seq, 1), seq_kv, np.int32)
        idx = np.arange(seq, dtype=np.int32)
        table = np.zeros((seq, 1), np.int32)
        meta = dg.get_paged_mqa_logits_metadata(ctx, heads, idx)
        paged = {_bytes(dg.fp8_fp4_paged_mqa_logits((fq.reshape(seq, 1, heads, d // 2), _pairs_of(qs)), cache, w, ctx,
                                                    table, meta, seq_kv, idx))
                 for fq in _forms(qp).values()}
        assert len(paged) == 1


def test_sm100_mqa_takes_every_form():
    seq, seq_kv, heads, d = 3, 20, 8, 64
    qp, qs = dg.per_token_cast_to_fp4(_rand((seq * heads, d), 8), use_ue8m0=True, gran_k=32, use_packed_ue8m0=True)
    kp, ks = dg.per_token_cast_to_fp4(_rand((seq_kv, d), 9), use_ue8m0=True, gran_k=32, use_packed_ue8m0=True)
    w = _rand((seq, heads), 10)
    lo, hi = np.zeros(seq, np.int32), np.full(seq, seq_kv, np.int32)
    outs = {_bytes(dg.fp8_fp4_mqa_logits((fq.reshape(seq, heads, d // 2), qs.reshape(seq, heads)),
                                         (fk, ks.reshape(seq_kv)), w, lo, hi, clean_logits=False))
            for fq, fk in zip(_forms(qp).values(), _forms(kp).values(), strict=True)}
    assert len(outs) == 1


def test_mega_moe_weights_take_every_form():
    with dg.numerics(arch="ascend950"):
        p = Problem(1, 2, 3, 2, 256, 512, seed=11)
        results = set()
        for name in _forms(p.w1q):
            w1 = _forms(p.w1q)[name]
            w2 = _forms(p.w2q)[name]
            l1, l2 = mega.transform_weights_for_mega_moe((w1, _pairs(p.w1sf)), (w2, _pairs(p.w2sf)))
            buf = mega.SymmBuffer(mega.EmulatedGroup(1).rank(0), p.E, 3, p.K, p.H, p.I)
            buf.x[:3], buf.x_sf[:3] = p.xq[0], _pairs(p.x_sf32[0])
            buf.topk_idx[:3], buf.topk_weights[:3] = p.idx[0], p.w[0]
            y = np.zeros((3, p.H), BF16)
            dg.fp8_fp4_mega_moe(y, l1, l2, buf)
            results.add(y.tobytes())
        assert len(results) == 1
