"""The core's buffer pool (:func:`deepgemm_ref.core.reusing_buffers`): GEMMs of one shape in a row
share their float64 buffers, GEMMs alive at the same time never do, and the m-grouped GEMM and
Mega MoE (which run inside it) give the same bytes as without it."""

from __future__ import annotations

import contextlib

import ml_dtypes
import numpy as np

import deepgemm_ref as dg
from deepgemm_ref import core, trace
from deepgemm_ref import grouped as G

BF16 = ml_dtypes.bfloat16


def _op(rows: int, k: int, seed: int) -> core.Operand:
    return core.Operand(np.random.default_rng(seed).standard_normal((rows, k)).astype(np.float32).astype(BF16))


def test_pool_reuses_freed_buffers_and_never_shares_live_ones():
    a, b = _op(8, 64, 1), _op(16, 64, 2)
    with core.reusing_buffers():
        g1 = core._Gemm(a, b, False, 8)
        g2 = core._Gemm(a, b, False, 8)  # alive together: distinct buffers
        assert not np.shares_memory(g1.b64, g2.b64)
        first = g1.b64
        del g1
        g3 = core._Gemm(a, b, False, 8)  # g1's buffer went back to the pool
        assert g3.b64 is first
        del g2, g3
    g4 = core._Gemm(a, b, False, 8)  # outside the block: fresh
    assert g4.b64 is not first


def _grouped_call() -> tuple[bytes, bytes, dict[str, int]]:
    rng = np.random.default_rng(7)
    groups, n, k = 3, 96, 256
    ends = np.array([100, 256 + 60, 512 + 128], np.int32)
    m = 640
    a = rng.standard_normal((m, k), dtype=np.float32).astype(BF16)
    a[::7, :2] = [2.0**40, -(2.0**40)]  # cancelling pairs: rows that need the exact tiers
    b = rng.standard_normal((groups, n, k), dtype=np.float32).astype(BF16)
    b[:, ::5, :2] = 1.0
    d = np.zeros((m, n), BF16)
    with dg.numerics(arch="sm100"), trace.capture(want_acc=True, want_S=True) as cap:
        G.m_grouped_bf16_gemm_nt_contiguous(a, b, d, ends, use_psum_layout=True)
    rec = cap.last
    return d.tobytes(), np.asarray(rec.acc).tobytes() + np.asarray(rec.S).tobytes(), dict(rec.stats)


def test_m_grouped_same_bytes_with_and_without_the_pool(monkeypatch):
    with_pool = _grouped_call()
    monkeypatch.setattr(core, "reusing_buffers", contextlib.nullcontext)
    without = _grouped_call()
    assert with_pool == without
    assert with_pool[2].get("bounded", 0) < sum(with_pool[2].values())  # some elements took the exact tiers


def test_mega_moe_same_bytes_with_and_without_the_pool(monkeypatch):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import bench_mega_moe as bm

    def layer_bytes() -> bytes:
        layer, _ = bm.build(2, 4, 16, 2, 512, 512, seed=3)
        captured: list[np.ndarray] = []
        real = bm.mega.fp8_fp4_mega_moe

        def spy(y, *args, **kwargs):
            real(y, *args, **kwargs)
            captured.append(y)  # a rank's y is complete once every rank has called (the collective)

        monkeypatch.setattr(bm.mega, "fp8_fp4_mega_moe", spy)
        try:
            layer()
        finally:
            monkeypatch.setattr(bm.mega, "fp8_fp4_mega_moe", real)
        assert len(captured) == 2
        return b"".join(np.asarray(y).tobytes() for y in captured)

    with_pool = layer_bytes()
    monkeypatch.setattr(core, "reusing_buffers", contextlib.nullcontext)
    assert layer_bytes() == with_pool
