"""The rounding rule on MQA logits, in exact rational arithmetic (docs/numerics.md, "The rounding rule").

DeepGEMM-Ascend converts each head's ``ReLU(q_h . k)`` from the Cube's float32 to bf16 in the FIXPIPE
before the weighted head sum (port 2.5); DeepGEMM's sm100 kernel with bf16 weights converts
``relu(x_h)`` and the KV scale to bf16 for its bf16 FMA chain (spec 9.1).  Those conversions are
part of the golden: ``bf16(sum_h w_h * bf16(relu(q_h . k)))``, each head score rounded once from
its exact dot product, the weighted sum exact and rounded once.  sm100 with float32 weights has no
such conversion: its golden is the whole logit rounded once.

The inputs are hand-made so that the per-head rounding decides a bf16 tie: head scores of the form
``1 + 2^-8`` (a tie between 1 and 1 + 2^-7, to even: 1) and ``1 + 2^-8 + 2^-12`` (just above it:
1 + 2^-7).  Every expected value is computed here with Python ``Fraction`` s from the E4M3 element
values; two of them are also worked out by hand below.
"""

from __future__ import annotations

from fractions import Fraction as F

import ml_dtypes
import numpy as np
import pytest

import deepgemm_ref as dg
from deepgemm_ref import attention as att
from deepgemm_ref import formats as fm
from deepgemm_ref import trace

BF16 = np.dtype(ml_dtypes.bfloat16)
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
HEADS, D = 8, 64
ONE_PAIR = 0x7F7F  # two UE8M0 bytes 127: scale 1.0 for both 32-element blocks


def _rn(x: F, fmt: fm.Format = fm.BF16) -> F:
    return F(fm.decode_scalar(fm.encode_scalar(x, fmt, fm.IEEE_RNE), fmt))


def _queries() -> np.ndarray:
    """q (1, HEADS, D): slot 0 is 1 for heads 0 and 1; slots 1 / 3 perturb head 0 by 2^-4 / 2^-6
    times the key's value there, slots 2 / 4 head 1; slot 5 is -1 for heads 2.. (relu -> 0)."""
    q = np.zeros((1, HEADS, D), np.float32)
    q[0, :2, 0] = 1
    q[0, 0, 1], q[0, 1, 2] = 2.0**-4, 2.0**-4
    q[0, 0, 3], q[0, 1, 4] = 2.0**-6, 2.0**-6
    q[0, 2:, 5] = -1
    return q.astype(E4M3)


def _keys() -> np.ndarray:
    """Every combination of the head perturbations: x_0 = 1 + 2^-4 k1 + 2^-6 k3, x_1 = 1 + 2^-4 k2 + 2^-6 k4,
    with k1 in {0, 2^-4, 3 * 2^-4}, k2 in {0, 2^-4}, k3, k4 in {0, 2^-6}: 24 keys."""
    rows = []
    for k1 in (0.0, 2.0**-4, 3 * 2.0**-4):
        for k2 in (0.0, 2.0**-4):
            for k3 in (0.0, 2.0**-6):
                for k4 in (0.0, 2.0**-6):
                    k = np.zeros(D, np.float32)
                    k[0], k[1], k[2], k[3], k[4], k[5] = 1, k1, k2, k3, k4, 1
                    rows.append(k)
    return np.stack(rows).astype(E4M3)


def _heads(q: np.ndarray, k: np.ndarray) -> list[list[F]]:
    """relu(q_h . k_j) exactly: [key][head]."""
    qv = [[F(float(v)) for v in q[0, h].astype(np.float32)] for h in range(HEADS)]
    out = []
    for kj in k.astype(np.float32):
        kf = [F(float(v)) for v in kj]
        out.append([max(sum((a * b for a, b in zip(qv[h], kf, strict=True)), F(0)), F(0)) for h in range(HEADS)])
    return out


def _golden(x: list[F], w: list[F], per_head: bool) -> F:
    """bf16(sum_h w_h r_h), r_h = bf16(x_h) (per_head) or x_h (the whole logit rounded once)."""
    return _rn(sum((wh * (_rn(xh) if per_head else xh) for wh, xh in zip(w, x, strict=True)), F(0)))


WEIGHTS = [
    [1.0, 1.0, 1, 1, 1, 1, 1, 1],
    [0.5, 1.5, 1, 1, 1, 1, 1, 1],
    [-1.0, 3.0, 1, 1, 1, 1, 1, 1],
]


def _ascend_plain(q, k, w):
    pairs_q = np.full((q.shape[0], HEADS, D // 64), ONE_PAIR, np.int16)
    pairs_k = np.full((k.shape[0], D // 64), ONE_PAIR, np.int16)
    n = k.shape[0]
    ks, ke = np.zeros(1, np.int32), np.full(1, n, np.int32)
    return att.fp8_fp4_mqa_logits((q, pairs_q), (k, pairs_k), w, ks, ke, n)


def _codes(x) -> list[int]:
    return np.asarray(x).reshape(-1).view(np.uint16).tolist()


def _bf16_codes(values: list[F]) -> list[int]:
    return [fm.encode_scalar(v, fm.BF16, fm.IEEE_RNE) for v in values]


def test_hand_worked_ties():
    """Two cases by hand (weights 1, 1).

    x_0 = 1 + 2^-8 -> bf16 1 (tie, to even); x_1 = 1 + 2^-8 + 2^-12 -> 1 + 2^-7.  Per head:
    1 + (1 + 2^-7) = 2 + 2^-7, a tie between 2 and 2 + 2^-6 -> 2.  The whole logit
    2 + 2^-7 + 2^-12 is above that tie -> 2 + 2^-6.
    x_0 = x_1 = 1 + 2^-8: per head 1 + 1 = 2; whole 2 + 2^-7, a tie -> 2 as well.
    """
    q, k = _queries(), _keys()
    w = _bf16_weights(WEIGHTS[0])
    with dg.numerics(arch="ascend950"):
        out = np.asarray(_ascend_plain(q, k, w), np.float64)[0]
    # key index = ((i1 * 2 + i2) * 2 + i3) * 2 + i4 with k1 = (0, 2^-4, 3 * 2^-4)[i1], ...
    a = ((1 * 2 + 1) * 2 + 0) * 2 + 1  # k1 = 2^-4, k2 = 2^-4, k3 = 0, k4 = 2^-6
    b = ((1 * 2 + 1) * 2 + 0) * 2 + 0  # k1 = k2 = 2^-4
    assert out[a] == 2.0
    assert out[b] == 2.0
    x = _heads(q, k)
    assert x[a][:2] == [1 + F(1, 2**8), 1 + F(1, 2**8) + F(1, 2**12)]
    assert _golden(x[a], [F(float(v)) for v in w[0].astype(np.float32)], per_head=False) == 2 + F(1, 64)


def _bf16_weights(row: list[float]) -> np.ndarray:
    return np.array([row], np.float32).astype(BF16)


@pytest.mark.parametrize("weights", WEIGHTS)
def test_ascend_plain_logits_round_each_head_first(weights):
    q, k = _queries(), _keys()
    w = _bf16_weights(weights)
    wf = [F(float(v)) for v in w[0].astype(np.float32)]
    x = _heads(q, k)
    per_head = _bf16_codes([_golden(xj, wf, True) for xj in x])
    whole = _bf16_codes([_golden(xj, wf, False) for xj in x])
    with dg.numerics(arch="ascend950"), trace.capture(want_acc=True) as cap:
        out = _ascend_plain(q, k, w)
    assert _codes(out) == per_head
    differ = sum(p != wh for p, wh in zip(per_head, whole, strict=True))
    assert differ > 0  # the inputs exercise the rule: the other reading would give other bytes
    # the recorded accumulator is the exact weighted sum of the rounded head scores
    acc = cap.last.acc[0]
    for j, xj in enumerate(x):
        assert F(float(acc[j])) == sum((wh * _rn(xh) for wh, xh in zip(wf, xj, strict=True)), F(0))


def test_ascend_paged_logits_round_each_head_first():
    """The same tokens in a paged cache (page 64, default layout): the same per-head reading."""
    q, k = _queries(), _keys()
    w = _bf16_weights(WEIGHTS[1])
    wf = [F(float(v)) for v in w[0].astype(np.float32)]
    n, page = k.shape[0], 64
    tokens = np.zeros((page, D), E4M3)
    tokens[:n] = k
    pairs = np.full((page, D // 64), ONE_PAIR, np.int16)
    cache = np.concatenate([tokens.view(np.uint8).reshape(1, -1), pairs.view(np.uint8).reshape(1, -1)], axis=1)
    cache = cache.reshape(1, page, 1, D + 2 * (D // 64))
    ctx = np.array([[n]], np.int32)
    table = np.zeros((1, 1), np.int32)
    idx = np.zeros(1, np.int32)
    qp = (q.reshape(1, 1, HEADS, D), np.full((1, 1, HEADS, D // 64), ONE_PAIR, np.int16))
    with dg.numerics(arch="ascend950"):
        meta = att.get_paged_mqa_logits_metadata(ctx, HEADS, idx)
        out = att.fp8_fp4_paged_mqa_logits(qp, cache, w, ctx, table, meta, n, idx)
    x = _heads(q, k)
    assert _codes(out) == _bf16_codes([_golden(xj, wf, True) for xj in x])


def test_ascend_uncertified_head_scores_are_rounded_from_the_exact_dot():
    """Block scales 2^50 and 2^-60 in one row defeat the float64 certificate of the dot products.
    Head 0 is 2^100 (1 + 2^-8) + 2^-120: above a bf16 tie by 2^-120, which its float64 estimate
    loses (it sits on the tie), so the head's rounding must come from the exact value: up."""
    q = np.zeros((1, HEADS, D), np.float32)
    k = np.zeros((1, D), np.float32)
    q[0, 0, 0], q[0, 0, 1], q[0, 0, 32] = 1, 2.0**-4, 1  # block 0 (scale 2^50) and block 1 (2^-60)
    k[0, 0], k[0, 1], k[0, 32] = 1, 2.0**-4, 1
    q[0, 1, 0] = 1  # head 1: exactly 2^100
    q[0, 2:, 5] = -1
    pair = np.array([(127 + 50) | ((127 - 60) << 8)], np.uint16).view(np.int16)[0]
    pq = np.full((1, HEADS, 1), pair, np.int16)
    pk = np.full((1, 1), pair, np.int16)
    w = _bf16_weights([1.0, 1.0, 1, 1, 1, 1, 1, 1])
    with dg.numerics(arch="ascend950"), trace.capture() as cap:
        out = att.fp8_fp4_mqa_logits((q.astype(E4M3), pq), (k.astype(E4M3), pk), w, np.zeros(1, np.int32),
                                     np.ones(1, np.int32), 1)
    x0 = F(2) ** 100 * (1 + F(1, 256)) + F(2) ** -120
    x1 = F(2) ** 100
    r0 = _rn(x0)
    assert r0 == F(2) ** 100 * (1 + F(1, 128))  # up: the exact value is above the tie
    assert _codes(out) == _bf16_codes([_rn(r0 + _rn(x1))])
    assert cap.last.stats.get("head_fraction", 0) >= 1


def test_sm100_bf16_weights_round_heads_and_the_kv_scale_float32_weights_do_not():
    q, k = _queries(), _keys()
    x = _heads(q, k)
    n = k.shape[0]
    ks, ke = np.zeros(1, np.int32), np.full(1, n, np.int32)
    s = np.full(n, 1.0, np.float32)
    s[::3] = 1 + 2.0**-9  # a KV scale that bf16 rounds to 1 (tie, to even)
    w16 = _bf16_weights(WEIGHTS[0])
    wf = [F(float(v)) for v in w16[0].astype(np.float32)]
    out = att.fp8_fp4_mqa_logits((q, None), (k, s), w16, ks, ke, logits_dtype=BF16)
    per_head = [_rn(_rn(F(float(s[j]))) * sum((wh * _rn(xh) for wh, xh in zip(wf, x[j], strict=True)), F(0)))
                for j in range(n)]
    assert _codes(out) == _bf16_codes(per_head)
    w32 = w16.astype(np.float32)
    out32 = att.fp8_fp4_mqa_logits((q, None), (k, s), w32, ks, ke, logits_dtype=BF16)
    whole = [_rn(F(float(s[j])) * sum((wh * xh for wh, xh in zip(wf, x[j], strict=True)), F(0))) for j in range(n)]
    assert _codes(out32) == _bf16_codes(whole)
    assert _bf16_codes(per_head) != _bf16_codes(whole)
