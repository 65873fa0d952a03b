"""The fused exact MQA-logits path (the core's row chunks reduced over heads in cache) against the
sink's path over the materialised dot products: the same logits, trace accumulators and stats, byte
for byte, on random, tie-crafted (Fraction fallback) and uncertifiable (far-apart FP4 scales) inputs,
for every head reduction (sm100 with float32 / bf16 weights, sm90, ascend950) and plain / paged keys.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import deepgemm_ref as dg
from deepgemm_ref import attention as att
from deepgemm_ref import formats as fm
from deepgemm_ref import trace
from deepgemm_ref.attention import logits as L

from . import test_attention as ta
from . import test_mqa_rounding as tr

BF16 = np.dtype(ml_dtypes.bfloat16)
_FUSED = L._fused_exact


def _both(monkeypatch, call):
    """(fused result, sink-path result): each (logits bytes, acc bytes, stats); the fused run in row
    chunks of one query row (several chunks per task), counting the chunks that stayed fused."""
    fused_calls = {"fused": 0, "declined": 0}

    def counting(*a, **k):
        got = _FUSED(*a, **k)
        fused_calls["fused" if got is not None else "declined"] += 1
        return got

    def run() -> tuple[bytes, bytes, dict[str, int]]:
        with trace.capture(want_acc=True, want_S=False) as cap:
            out = call()
        rec = cap.last
        return np.ascontiguousarray(out).tobytes(), np.ascontiguousarray(rec.acc).tobytes(), dict(rec.stats)

    monkeypatch.setattr(L, "_FUSED_CHUNK_BYTES", 1)
    monkeypatch.setattr(L, "_fused_exact", counting)
    fused = run()
    monkeypatch.setattr(L, "_fused_exact", lambda *a, **k: None)
    old = run()
    return fused, old, fused_calls


@pytest.mark.parametrize("arch,wdtype", [("sm100", np.float32), ("sm100", BF16), ("sm90", np.float32)])
def test_fused_equals_sink_path_fp8(monkeypatch, arch, wdtype):
    seq, seq_kv, heads, d = 6, 300, 32, 64
    _, _, q8, (kv8, sf) = ta._fp8_inputs(seq, seq_kv, heads, d, 71)
    w = ta._rand((seq, heads), 72).astype(wdtype)
    ks = np.array([0, 5, 100, 299, 30, 0], np.int32)
    ke = np.array([300, 5, 250, 300, 31, 1], np.int32)
    out = BF16 if wdtype == BF16 else np.float32
    with dg.numerics(arch=arch):
        fused, old, calls = _both(monkeypatch, lambda: att.fp8_fp4_mqa_logits((q8, None), (kv8, sf), w, ks, ke,
                                                                              logits_dtype=out))
    assert calls["fused"] >= 1 and calls["declined"] == 0
    assert fused == old


@pytest.mark.parametrize("fp4", [False, True])
def test_fused_equals_sink_path_ascend(monkeypatch, fp4):
    seq, seq_kv, heads, d = 4, 70, 8, 128
    q = ta._rand((seq, heads, d), 81)
    kv = ta._rand((seq_kv, d), 82) * np.exp2(np.random.default_rng(83).integers(-6, 6, (seq_kv, 1))).astype(np.float32)
    qd, qpairs, _ = ta._ascend_quant(q, fp4)
    kd, kpairs, _ = ta._ascend_quant(kv, fp4)
    w = ta._rand((seq, heads), 84, BF16)
    ks = np.array([0, 4, 10, 60], np.int32)
    ke = np.array([70, 4, 31, 70], np.int32)
    with dg.numerics(arch="ascend950"):
        fused, old, calls = _both(monkeypatch, lambda: att.fp8_fp4_mqa_logits(
            (qd, qpairs.reshape(seq, heads, -1)), (kd, kpairs), w, ks, ke, 80))
    assert calls["fused"] >= 1
    assert fused == old


@pytest.mark.parametrize("arch,wdtype", [("sm100", np.float32), ("sm100", BF16), ("ascend950", BF16)])
def test_fused_equals_sink_path_on_ties(monkeypatch, arch, wdtype):
    """Head scores and logits on bf16 rounding ties: the Fraction fallback decides, from head
    scores the fused path recomputes per pair."""
    q, k = tr._queries(), tr._keys()
    n = k.shape[0]
    fractions = 0
    ks, ke = np.zeros(1, np.int32), np.full(1, n, np.int32)
    q_pairs = np.full((1, tr.HEADS, 1), tr.ONE_PAIR, np.int16)
    k_pairs = np.full((n, 1), tr.ONE_PAIR, np.int16)
    out = BF16 if wdtype == BF16 else np.float32
    for row in tr.WEIGHTS:
        w = np.array([row], np.float32).astype(wdtype)
        if arch == "ascend950":
            call = lambda w=w: att.fp8_fp4_mqa_logits((q, q_pairs), (k, k_pairs), w, ks, ke, n)  # noqa: E731
        else:
            call = lambda w=w: att.fp8_fp4_mqa_logits(  # noqa: E731
                (q, None), (k, np.ones(n, np.float32)), w, ks, ke, logits_dtype=out)
        with dg.numerics(arch=arch):
            fused, old, calls = _both(monkeypatch, call)
        assert calls["fused"] >= 1 and calls["declined"] == 0
        assert fused == old
        fractions += fused[2].get("fraction", 0)
    if wdtype == BF16:  # bf16 logits sit on ties: the fallback ran on the recomputed head scores
        assert fractions > 0


def test_far_apart_scales_decline_the_fused_path(monkeypatch):
    """FP4 scales 2^-100 .. 2^100 inside a row: no chunk-wide certificate, the sink's path runs."""
    seq, seq_kv, heads, d = 3, 9, 8, 64
    rng = np.random.default_rng(41)
    qp = fm.pack_fp4(rng.integers(0, 16, (seq, heads, d))).astype(np.int8)
    kp = fm.pack_fp4(rng.integers(0, 16, (seq_kv, d))).astype(np.int8)
    pad = lambda b: np.concatenate([b, np.full(b.shape[:-1] + (2,), 127, np.uint8)], axis=-1)  # noqa: E731
    qs = fm.pack_ue8m0_int32(pad(rng.choice([27, 127, 227], size=(seq, heads, 2)).astype(np.uint8)))[..., 0]
    ksf = fm.pack_ue8m0_int32(pad(rng.choice([27, 127, 227], size=(seq_kv, 2)).astype(np.uint8)))[..., 0]
    w = ta._rand((seq, heads), 42)
    ks, ke = np.zeros(seq, np.int32), np.full(seq, seq_kv, np.int32)
    fused, old, calls = _both(monkeypatch, lambda: att.fp8_fp4_mqa_logits((qp, qs), (kp, ksf), w, ks, ke,
                                                                          clean_logits=False))
    assert calls["declined"] >= 1
    assert fused == old


def test_fused_equals_sink_path_paged(monkeypatch):
    batch, heads, d, page = 3, 8, 64, 64
    rng = np.random.default_rng(91)
    ctx_last = np.array([70, 130, 5])
    pages = -(-ctx_last // page)
    total = int(pages.sum())
    table = np.zeros((batch, int(pages.max())), np.int32)
    perm = rng.permutation(total).astype(np.int32)
    o = 0
    for b in range(batch):
        table[b, :pages[b]] = perm[o:o + pages[b]]
        o += pages[b]
    kv = ta._rand((total * page, d), 92, BF16)
    kv8, sf = dg.per_custom_dims_cast_to_fp8(kv, (0,), False)
    blocks = np.concatenate([kv8.view(np.uint8).reshape(total, page * d), sf.view(np.uint8).reshape(total, -1)], axis=1)
    cache = blocks.reshape(total, page, 1, d + 4)
    q8 = ta._e4m3(ta._rand((batch, 1, heads, d), 93))
    w = ta._rand((batch, heads), 94)
    ctx = ctx_last.reshape(batch, 1).astype(np.int32)
    meta = att.get_paged_mqa_logits_metadata(ctx, page, dg.get_num_sms())
    fused, old, calls = _both(monkeypatch, lambda: att.fp8_fp4_paged_mqa_logits(
        (q8, None), cache, w, ctx, table, meta, int(pages.max()) * page))
    assert calls["fused"] >= 1
    assert fused == old


@pytest.mark.parametrize("far_apart", [False, True])
def test_fused_spans_equal_the_sink_paths_chunks(monkeypatch, far_apart):
    """The fused path's larger tasks (FUSED_TASK_ELEMENTS), accepted (FP8) or declined into the
    sink path over TASK_ELEMENTS key spans (far-apart FP4 scales), against the previous code path
    (a trace that asks for error scales: the sink's tasks of TASK_ELEMENTS): logits, accumulators
    and stats byte for byte."""
    seq, seq_kv, heads, d = 7, 260, 8, 64
    rng = np.random.default_rng(43)
    if far_apart:
        qp = fm.pack_fp4(rng.integers(0, 16, (seq, heads, d))).astype(np.int8)
        kp = fm.pack_fp4(rng.integers(0, 16, (seq_kv, d))).astype(np.int8)
        pad = lambda b: np.concatenate([b, np.full(b.shape[:-1] + (2,), 127, np.uint8)], axis=-1)  # noqa: E731
        qs = fm.pack_ue8m0_int32(pad(rng.choice([27, 127, 227], size=(seq, heads, 2)).astype(np.uint8)))[..., 0]
        ksf = fm.pack_ue8m0_int32(pad(rng.choice([27, 127, 227], size=(seq_kv, 2)).astype(np.uint8)))[..., 0]
        q, kv = (qp, qs), (kp, ksf)
    else:
        _, _, q8, kv = ta._fp8_inputs(seq, seq_kv, heads, d, 44)
        q = (q8, None)
    w = ta._rand((seq, heads), 45)
    ks = np.array([0, 3, 30, 259, 0, 100, 0], np.int32)
    ke = np.array([260, 3, 200, 260, 1, 220, 180], np.int32)
    monkeypatch.setattr(L, "TASK_ELEMENTS", 600)
    monkeypatch.setattr(L, "FUSED_TASK_ELEMENTS", 5000)
    spans = []
    task = L._task

    def counting(req, r0, r1, k0, k1, fused_span=False):
        spans.append((k1 - k0, fused_span))
        return task(req, r0, r1, k0, k1, fused_span)

    monkeypatch.setattr(L, "_task", counting)

    def run(want_S):
        spans.clear()
        with trace.capture(want_acc=True, want_S=want_S) as cap:
            out = att.fp8_fp4_mqa_logits(q, kv, w, ks, ke, clean_logits=False)
        rec = cap.last
        return (np.ascontiguousarray(out).tobytes(), np.ascontiguousarray(rec.acc).tobytes(), dict(rec.stats)), \
            list(spans)

    new, new_spans = run(False)
    old, old_spans = run(True)
    assert new == old
    assert all(f for _, f in new_spans[:1]) and not any(f for _, f in old_spans)
    # the fused tasks span more keys than the sink's; declined, they ran the sink's spans
    assert max(n for n, f in new_spans if f) > max(n for n, _ in old_spans)
    assert any(not f for _, f in new_spans) == far_apart
