"""Grouped GEMMs in check -> tasks -> execute form.

Every path of the family (runs of m-grouped rows, masked groups, K groups, empty groups and the
early returns) runs through :func:`deepgemm_ref.executor.execute`: the call's one trace record
lists the executor tasks it ran (one matmul per run / group, a fill per empty k-group or empty-K
early return), and the kernels use the profile the dispatcher hands them, never the global one.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from unittest import mock

import ml_dtypes
import numpy as np
import pytest

import deepgemm_ref as dg
from deepgemm_ref import api, profiles, trace
from deepgemm_ref import grouped as G

BF16 = ml_dtypes.bfloat16
E4M3 = ml_dtypes.float8_e4m3fn


def _rand(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _codes(x):
    return np.ascontiguousarray(x).view({1: np.uint8, 2: np.uint16, 4: np.uint32}[x.dtype.itemsize])


@contextlib.contextmanager
def _dispatcher_profile_only() -> Iterator[None]:
    """Reading the global profile below the dispatcher fails (``get_profile()``, and through it
    ``runtime.current_mk_alignment()`` and ``executor.active_accumulation()`` without a profile)."""
    with mock.patch.object(profiles, "get_profile", side_effect=AssertionError("the global profile was read")):
        yield


def _call(arch, fn, *args, **kwargs):
    """Run ``fn`` under ``arch`` with a full trace capture; return the call's one record."""
    with dg.numerics(arch=arch), trace.capture(want_acc=True, want_S=True) as cap, _dispatcher_profile_only():
        fn(*args, **kwargs)
    assert len(cap.records) == 1
    return cap.last


# ---------------------------------------------------------------------------------------------
# the implementations take the dispatcher's profile; the public signatures do not show it
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", G.__all__)
def test_implementations_take_the_dispatchers_profile(name):
    fn = getattr(G, name)
    for impl in fn.__wrapped_impls__.values():
        assert api.takes_profile(impl), (name, impl)
    for arch in ("sm100", "ascend950"):
        with dg.numerics(arch=arch):
            if fn.impl_for() is not None:
                assert "profile" not in inspect.signature(fn).parameters


# ---------------------------------------------------------------------------------------------
# m-grouped contiguous: one task per run, zero rows by the request, early returns as requests
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("psum", [True, False])
def test_m_grouped_runs_are_executor_tasks(psum):
    # groups of 3, 0 and 5 rows, alignment 128: group 0 owns rows [0, 3), group 2 rows [128, 133)
    m, n, k = 256, 8, 64
    x, w = _rand((m, k), 1).astype(BF16), _rand((3, n, k), 2).astype(BF16)
    if psum:
        layout = np.array([3, 128, 133], np.int32)
    else:
        layout = np.full(m, -1, np.int32)
        layout[0:3], layout[128:133] = 0, 2
    d = np.full((m, n), 4.0, BF16)
    rec = _call("sm100", G.m_grouped_bf16_gemm_nt_contiguous, x, w, d, layout, use_psum_layout=psum)
    assert rec.func == "m_grouped_bf16_gemm_nt_contiguous"
    assert rec.tasks == ("group 0: d[0:3]", "group 2: d[128:133]")
    defined = np.zeros(m, bool)
    defined[0:3] = defined[128:133] = True
    assert np.array_equal(rec.defined, np.broadcast_to(defined[:, None], d.shape))
    for g, r0, r1 in ((0, 0, 3), (2, 128, 133)):
        dense = np.zeros((r1 - r0, n), BF16)
        dg.bf16_gemm_nt(x[r0:r1], w[g], dense)
        assert np.array_equal(_codes(d[r0:r1]), _codes(dense))
        assert np.all(rec.S[r0:r1] > 0)
    # the padding policy's zero rows (-1 rows; psum gaps with ensure_zero_padding): +0.0, not computed
    assert np.all(_codes(d[~defined]) == 0) and np.all(rec.acc[~defined] == 0)


def test_m_grouped_fp8_runs_share_the_group_operand():
    m, n, k = 256, 16, 128
    x, w = _rand((m, k), 3), _rand((2, n, k), 4)
    qa, sa = dg.per_token_cast_to_fp8(x, use_ue8m0=True)
    qb, sb = np.empty((2, n, k), E4M3), np.empty((2, 1, 1), np.float32)
    for g in range(2):
        qb[g], sb[g] = dg.per_block_cast_to_fp8(w[g], use_ue8m0=True)
    layout = np.full(m, -1, np.int32)
    layout[0:7], layout[128:200] = 1, 0
    d = np.full((m, n), 4.0, BF16)
    rec = _call("sm100", G.m_grouped_fp8_fp4_gemm_nt_contiguous, (qa, sa), (qb, sb), d, layout)
    assert rec.tasks == ("group 1: d[0:7]", "group 0: d[128:200]")
    assert rec.stats and np.all(_codes(d[7:128]) == 0) and np.all(d[200:] == 0)


def test_m_grouped_early_returns_are_requests():
    # DeepGEMM-Ascend's K == 0 clears all of d: a fill, recorded as one
    d = np.full((256, 4), 3.0, np.float32)
    rec = _call("ascend950", G.m_grouped_bf16_gemm_nt_contiguous, np.zeros((256, 0), BF16), np.zeros((1, 4, 0), BF16),
                d, np.array([10], np.int32))
    assert rec.tasks == ("empty K: d = 0 (the early return clears d)",)
    assert not d.any() and rec.defined.all() and not rec.acc.any() and not rec.S.any()
    # N == 0 (DeepGEMM-Ascend returns early) and M == 0: nothing to run, still one record
    d0 = np.zeros((256, 0), np.float32)
    rec = _call("ascend950", G.m_grouped_bf16_gemm_nt_contiguous, np.zeros((256, 64), BF16), np.zeros((1, 0, 64), BF16),
                d0, np.array([10], np.int32))
    assert rec.tasks == () and rec.defined.shape == (256, 0)
    rec = _call("sm100", G.m_grouped_bf16_gemm_nt_contiguous, np.zeros((0, 64), BF16), np.zeros((1, 8, 64), BF16),
                np.zeros((0, 8), BF16), np.zeros(0, np.int32))
    assert rec.tasks == () and rec.defined.shape == (0, 8)


# ---------------------------------------------------------------------------------------------
# masked: one task per non-empty group
# ---------------------------------------------------------------------------------------------

def test_masked_groups_are_executor_tasks():
    g, max_m, n, k = 3, 8, 16, 64
    x, w = _rand((g, max_m, k), 5).astype(BF16), _rand((g, n, k), 6).astype(BF16)
    d = np.full((g, max_m, n), 2.0, BF16)
    mm = np.array([2, 0, 8], np.int32)
    rec = _call("sm100", G.m_grouped_bf16_gemm_nt_masked, x, w, d, mm, 4)
    assert rec.tasks == ("group 0: d[0, :2]", "group 2: d[2, :8]")
    assert np.array_equal(rec.defined[:, :, 0], np.arange(max_m)[None, :] < mm[:, None])
    assert np.all(d[0, 2:] == 2.0) and np.all(d[1] == 2.0)
    dense = np.zeros((2, n), BF16)
    dg.bf16_gemm_nt(x[0, :2], w[0], dense)
    assert np.array_equal(_codes(d[0, :2]), _codes(dense))


# ---------------------------------------------------------------------------------------------
# k-grouped: one task per group, fills for empty groups (before the tasks) and for SUM_K == 0
# ---------------------------------------------------------------------------------------------

def test_k_grouped_empty_group_is_a_fill_before_the_tasks():
    m, n, ks = 4, 8, [128, 0, 256]
    x, y = _rand((sum(ks), m), 7).astype(BF16), _rand((sum(ks), n), 8).astype(BF16)
    c = _rand((3, m, n), 9)
    c[1, 0, 0] = -0.0  # an empty group keeps c bit for bit
    d = np.full((3, m, n), 5.0, np.float32)
    rec = _call("sm100", G.k_grouped_bf16_gemm_tn_contiguous, x, y, d, ks, np.array(ks, np.int32), c=c)
    assert rec.tasks == ("empty group 1: d[1] = c[1]", "group 0: K [0, 128)", "group 2: K [128, 384)")
    assert _codes(d[1]).tobytes() == _codes(c[1]).tobytes()
    # the fill is written, not computed: the trace arrays keep their fill value there
    assert not rec.acc[1].any() and not rec.S[1].any() and rec.defined.all()
    for g, (k0, k1) in ((0, (0, 128)), (2, (128, 384))):
        want = c[g].astype(np.float64) + x[k0:k1].T.astype(np.float64) @ y[k0:k1].astype(np.float64)
        assert np.allclose(rec.acc[g], want - c[g], rtol=0, atol=1e-9)
        assert np.allclose(d[g], want, rtol=1e-6)


def test_k_grouped_early_returns_are_requests():
    m, n = 4, 8
    c = _rand((2, m, n), 10)
    # SUM_K == 0: d = c, one fill
    d = np.full((2, m, n), 5.0, np.float32)
    rec = _call("sm100", G.k_grouped_bf16_gemm_tn_contiguous, np.zeros((0, m), BF16), np.zeros((0, n), BF16), d,
                [0, 0], np.zeros(2, np.int32), c=c)
    assert rec.tasks == ("empty K: d = c",) and d.tobytes() == c.tobytes()
    # M == 0: nothing to run, still one record
    rec = _call("sm100", G.k_grouped_bf16_gemm_tn_contiguous, np.zeros((128, 0), BF16), np.zeros((128, n), BF16),
                np.zeros((2, 0, n), np.float32), [128, 0], np.array([128, 0], np.int32), c=np.zeros((2, 0, n), np.float32))
    assert rec.tasks == ()


def test_k_grouped_ascend_empty_group_after_unaligned_end():
    m, n, ends = 4, 6, [100, 100, 400]  # group 1 is empty (ends equal), group 2 starts at 256
    x, y = _rand((512, m), 11), _rand((512, n), 12)
    qa, sa = dg.per_token_cast_to_fp8(np.ascontiguousarray(x.T), use_ue8m0=True, gran_k=32)
    qb, sb = dg.per_token_cast_to_fp8(np.ascontiguousarray(y.T), use_ue8m0=True, gran_k=32)
    c = _rand((3, m, n), 13)
    d = c.copy()
    rec = _call("ascend950", G.k_grouped_fp8_gemm_tn_contiguous, (np.ascontiguousarray(qa.T), sa.T),
                (np.ascontiguousarray(qb.T), sb.T), d, None, np.array(ends, np.int32), c=d,
                epilogue=dg.epilogue.Alpha(-1.5))
    assert rec.tasks == ("empty group 1: d[1] = c[1]", "group 0: K [0, 100)", "group 2: K [256, 400)")
    assert d[1].tobytes() == c[1].tobytes() and not rec.S[1].any() and np.all(rec.S[[0, 2]] > 0)


def test_k_grouped_sm90_flat_groups_are_executor_tasks():
    m, n, ks = 3, 4, [128, 256]
    xs = [_rand((m, kk), 40 + i) for i, kk in enumerate(ks)]
    ys = [_rand((n, kk), 50 + i) for i, kk in enumerate(ks)]
    pa = [dg.per_token_cast_to_fp8(v, use_ue8m0=False) for v in xs]
    pb = [dg.per_token_cast_to_fp8(v, use_ue8m0=False) for v in ys]
    flat_a, flat_b = np.concatenate([p[0].reshape(-1) for p in pa]), np.concatenate([p[0].reshape(-1) for p in pb])
    sfa, sfb = np.concatenate([p[1] for p in pa], axis=1), np.concatenate([p[1] for p in pb], axis=1)
    c = _rand((2, m, n), 60)
    d = c.copy()
    rec = _call("sm90", G.k_grouped_fp8_gemm_nt_contiguous, (flat_a, sfa), (flat_b, sfb), d, ks,
                np.array(ks, np.int32), c=d)
    assert rec.tasks == ("group 0: K [0, 128)", "group 1: K [128, 384)")
    assert np.all(rec.S > 0)
