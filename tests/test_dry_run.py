"""DeepGEMM-Ascend's dry run: ``_C.set_dry_run`` / ``testing.par_compile``, meta tensors, nothing computed.

Under ``ascend950`` with the dry-run flag set, every kernel validates its arguments as in a real call
(argument errors are raised), computes nothing (the core is never reached: the tests replace it by a
function that fails) and writes nothing (every output keeps its bytes); functions returning an
output return it allocated.  ``meta`` torch tensors are accepted only there.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest

import deepgemm_ref as dg
from deepgemm_ref import core, dryrun, mega
from deepgemm_ref import formats as fm
from deepgemm_ref.testing import par_compile as pc

from .test_mega_moe import Problem, _pairs

BF16 = ml_dtypes.bfloat16
E4M3 = ml_dtypes.float8_e4m3fn


@pytest.fixture
def no_compute(monkeypatch):
    """The core fails if reached: a dry call must end before any product is computed."""
    def fail(*args, **kwargs):
        raise AssertionError("the core was reached under dry run")

    monkeypatch.setattr(core, "scaled_matmul", fail)
    monkeypatch.setattr(core, "dot_products", fail)


@contextmanager
def _dry():
    with dg.numerics(arch="ascend950"):
        dg._C.set_dry_run(True)
        try:
            yield
        finally:
            dg._C.set_dry_run(False)


def _q(shape, seed, gran_k=32):
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return dg.per_token_cast_to_fp8(x, use_ue8m0=True, gran_k=gran_k)


def _snap(*arrays):
    return [np.array(a, copy=True).tobytes() for a in arrays]


# ---------------------------------------------------------------------------------------------
# real arrays: validated, nothing computed, nothing written
# ---------------------------------------------------------------------------------------------

def test_gemms_validate_and_write_nothing(no_compute):
    a, b = _q((64, 128), 1), _q((32, 128), 2)
    a4 = dg.per_token_cast_to_fp4(np.ones((64, 128), np.float32), use_ue8m0=True, gran_k=32)
    d = np.full((64, 32), 7.0, np.float32)
    db = np.full((64, 32), 3.0, BF16)
    x16, w16 = np.ones((64, 128), BF16), np.ones((32, 128), BF16)
    before = _snap(d, db)
    with _dry():
        assert dg.fp8_fp4_gemm_nt(a, b, d) is None
        dg.fp8_fp4_gemm_nt(a, b, d, c=d, alpha=0.5)
        dg.fp8_fp4_gemm_nt(a, (a4[0][:32], a4[1][:32]), d)  # FP8 x FP4
        dg.fp8_fp4_gemm_tn((a[0].T, a[1].T), (b[0].T, b[1].T), d)
        dg.bf16_gemm_nt(x16, w16, db)
        dg.bf16_gemm_nt(x16[:, :0], w16[:, :0], d)  # K == 0 would write d := 0
        dg.aclnn_bf16_gemm_nt(x16, w16, db, db)
        dg.cublaslt_gemm_nt(x16, w16, d)
        dg._C.bf16_bmm(x16[None], w16[None], d[None])  # a public function calling another
        with pytest.raises(dg.DGArgumentError, match="d"):  # the argument errors are the real ones
            dg.fp8_fp4_gemm_nt(a, b, np.zeros((64, 33), np.float32))
        with pytest.raises(dg.DGArgumentError, match="gran_k 32"):
            dg.fp8_fp4_gemm_nt(a, b, d, recipe=(1, 1, 128))
        with pytest.raises(dg.DGArgumentError, match="powers of two"):
            dg.fp8_fp4_gemm_nt((a[0], a[1] * 0.75), b, d)  # data-dependent checks of real arrays run too
    assert _snap(d, db) == before


def test_grouped_and_einsum_validate_and_write_nothing(no_compute):
    a, b = _q((512, 128), 3), _q((2 * 32, 128), 4)
    b3 = (b[0].reshape(2, 32, 128), b[1].reshape(2, 32, 4))
    d = np.full((512, 32), 5.0, BF16)
    ends = np.array([100, 400], np.int32)
    c = np.random.default_rng(5).standard_normal((2, 4, 6)).astype(np.float32)
    kd = c.copy()
    xa, xb = _q((4, 512), 6), _q((6, 512), 7)
    e = np.full((3, 4, 8), 1.0, np.float32)
    before = _snap(d, kd, e)
    with _dry():
        dg.m_grouped_fp8_fp4_gemm_nt_contiguous(a, b3, d, ends)
        dg.m_grouped_bf16_gemm_nt_contiguous(np.ones((512, 128), BF16), np.ones((2, 32, 128), BF16), d, ends)
        dg.k_grouped_fp8_gemm_tn_contiguous((np.ascontiguousarray(xa[0].T), np.ascontiguousarray(xa[1].T)),
                                            (np.ascontiguousarray(xb[0].T), np.ascontiguousarray(xb[1].T)), kd,
                                            None, np.array([200, 512], np.int32), c=kd)
        dg.einsum("bhr,hdr->bhd", np.ones((4, 3, 16), BF16), np.ones((3, 8, 16), BF16), e.transpose(1, 0, 2))
        with pytest.raises(dg.DGArgumentError):
            dg.m_grouped_fp8_fp4_gemm_nt_contiguous(a, b3, d, np.array([300, 100], np.int32))  # decreasing ends
    assert _snap(d, kd, e) == before


def _mqa_inputs(seq=4, seq_kv=40, heads=8, d=64):
    """DeepGEMM-Ascend's MQA operands: FP8 with int16 UE8M0 pairs for q and kv, bf16 weights."""
    q = _q((seq * heads, d), 8)
    kv = _q((seq_kv, d), 9)
    qpairs = fm.pack_ue8m0_int16(fm.ue8m0_encode(q[1], "ceil"))
    kpairs = fm.pack_ue8m0_int16(fm.ue8m0_encode(kv[1], "ceil"))
    return (q[0].reshape(seq, heads, d), qpairs), (kv[0], kpairs), np.ones((seq, heads), BF16)


def test_mqa_returns_the_allocated_logits_without_computing(no_compute):
    q, kv, w = _mqa_inputs()
    ks, ke = np.zeros(4, np.int32), np.array([10, 20, 30, 40], np.int32)
    with _dry():
        out = dg.fp8_fp4_mqa_logits(q, kv, w, ks, ke, 64)
        assert out.shape == (4, 64) and out.dtype == BF16 and out.strides == (256 * 2, 2)
        assert np.isnan(out.astype(np.float32)).all()  # allocated, not computed
        with pytest.raises(dg.DGArgumentError, match="cu_seq_len_k_end"):
            dg.fp8_fp4_mqa_logits(q, kv, w, ks, np.array([10, 20, 30, 41], np.int32), 64)


def test_mega_moe_neither_joins_nor_computes(no_compute):
    with dg.numerics(arch="ascend950"):
        p = Problem(2, 4, 3, 2, 256, 512, seed=3)
        group = mega.EmulatedGroup(2)
        bufs = [mega.SymmBuffer(group.rank(r), p.E, 3, p.K, p.H, p.I) for r in range(2)]
        ys = [np.full((3, p.H), 9.0, BF16) for _ in range(2)]
        stats = [np.arange(2, dtype=np.int32) for _ in range(2)]
        weights = [p.ascend_weights(r) for r in range(2)]
        for r in range(2):
            bufs[r].x[:3], bufs[r].x_sf[:3] = p.xq[r], _pairs(p.x_sf32[r])
            bufs[r].topk_idx[:3], bufs[r].topk_weights[:3] = p.idx[r], p.w[r]
        before = _snap(*ys, *stats)
        dg._C.set_dry_run(True)
        try:
            for r in range(2):
                dg.fp8_fp4_mega_moe(ys[r], weights[r][0], weights[r][1], bufs[r], None, None, stats[r])
            with pytest.raises(dg.DGArgumentError):
                dg.fp8_fp4_mega_moe(ys[0][:, :128], weights[0][0], weights[0][1], bufs[0], None, None, stats[0])
        finally:
            dg._C.set_dry_run(False)
        assert _snap(*ys, *stats) == before
        assert bufs[0]._registry.unbound_ranks() == [0, 1]  # no rank joined a collective


# ---------------------------------------------------------------------------------------------
# the flag itself
# ---------------------------------------------------------------------------------------------

def test_flag_is_scoped_by_numerics_and_ignored_outside_ascend950():
    with dg.numerics(arch="ascend950"):
        with dg.numerics():
            dg._C.set_dry_run(True)
            assert dg._C.get_dry_run() and dryrun.enabled()
        assert not dg._C.get_dry_run()  # numerics() restores the dry-run flag like every setting
        dg._C.set_dry_run(True)
        with dg.numerics(arch="sm100"):
            # the flag stays set, but DeepGEMM's kernels have no dry run: they compute
            assert dryrun.enabled()
            x = np.ones((4, 64), BF16)
            d = np.zeros((4, 4), np.float32)
            dg.bf16_gemm_nt(x, x, d)
            assert np.all(d == 64)
    assert not dryrun.enabled()


def test_par_compile_dry_run_context_sets_and_resets_the_flag():
    with dg.numerics(arch="ascend950"):
        with pc.dry_run():
            assert dg._C.get_dry_run()
        assert not dg._C.get_dry_run()
        with pytest.raises(KeyError), pc.dry_run():
            raise KeyError("x")
        assert not dg._C.get_dry_run()
    with pytest.raises(dg.DGArgumentError, match="set_dry_run: not provided by DeepGEMM 2.6.1"):
        with pc.dry_run():
            pass


# ---------------------------------------------------------------------------------------------
# par_compile
# ---------------------------------------------------------------------------------------------

def test_par_compile_runs_every_callable_under_dry_run_in_threads_and_returns_none():
    seen = []
    lock = threading.Lock()

    def probe(i):
        with lock:
            seen.append((i, dg._C.get_dry_run(), threading.current_thread().name.startswith("deepgemm-compile")))
        return i

    with dg.numerics(arch="ascend950"):
        assert pc.par_compile([lambda i=i: probe(i) for i in range(6)], max_workers=3, progress=False) is None
        assert not dg._C.get_dry_run()
    assert sorted(seen) == [(i, True, True) for i in range(6)]


def test_par_compile_raises_the_first_failure_and_resets_dry_run():
    err = RuntimeError("compile failed")

    def fail():
        raise err

    with dg.numerics(arch="ascend950"):
        with pytest.raises(RuntimeError) as caught:
            pc.par_compile([fail], max_workers=1, progress=False)
        assert caught.value is err and not dg._C.get_dry_run()
        assert pc.par_compile([], max_workers=1, progress=False) is None and not dg._C.get_dry_run()


class _DeviceDouble:
    """A thread-local stand-in for torch.npu: current device, device(i) scopes, stream calls."""

    def __init__(self):
        self.local = threading.local()
        self.streams = []

    def current_device(self):
        return getattr(self.local, "device", 0)

    @contextmanager
    def device(self, index):
        prev = self.current_device()
        self.local.device = index
        try:
            yield
        finally:
            self.local.device = prev

    def current_stream(self):
        self.streams.append((threading.get_ident(), self.current_device()))


def test_par_compile_workers_run_on_the_callers_device(monkeypatch):
    npu = _DeviceDouble()
    monkeypatch.setattr(pc, "torch", SimpleNamespace(npu=npu))
    seen = []
    caller = threading.get_ident()
    with dg.numerics(arch="ascend950"):
        for index in (2, 5):
            with npu.device(index):
                pc.par_compile([lambda: seen.append(npu.current_device()) for _ in range(4)], max_workers=2,
                               progress=False)
                assert npu.current_device() == index
    assert seen == [2] * 4 + [5] * 4
    assert {dev for tid, dev in npu.streams if tid != caller} == {2, 5}  # each worker's stream on that device


# ---------------------------------------------------------------------------------------------
# meta tensors
# ---------------------------------------------------------------------------------------------

@pytest.mark.torch
def test_meta_tensors_are_accepted_under_dry_run_only(no_compute):
    torch = pytest.importorskip("torch")

    def meta(shape, dtype):
        return torch.empty(shape, dtype=dtype, device="meta")

    m, n, k = 256, 64, 128
    a = (meta((m, k), torch.float8_e4m3fn), meta((m, k // 64), torch.int16))
    b = (meta((n, k // 2), torch.float4_e2m1fn_x2), meta((n, k // 64), torch.int16))
    d = meta((m, n), torch.float32)
    with dg.numerics(arch="ascend950"):
        with pytest.raises(dg.DGArgumentError, match=r"fp8_fp4_gemm_nt: a\[0\]: expected a CPU tensor; got a tensor "
                                                     "on meta .*dry run"):
            dg.fp8_fp4_gemm_nt(a, b, d)
        pc.par_compile([lambda: dg.fp8_fp4_gemm_nt(a, b, d),
                        lambda: dg.fp8_fp4_gemm_nt(a, b, d, c=d),  # c is d: one storage, seen as one array
                        lambda: dg.m_grouped_fp8_fp4_gemm_nt_contiguous(
                            (meta((512, k), torch.float8_e4m3fn), meta((512, k // 64), torch.int16)),
                            (meta((2, n, k), torch.float8_e4m3fn), meta((2, n, k // 64), torch.int16)),
                            meta((512, n), torch.bfloat16), meta((2,), torch.int32))], progress=False)
        with pc.dry_run():
            with pytest.raises(dg.DGArgumentError, match="d"):  # shapes and dtypes are checked
                dg.fp8_fp4_gemm_nt(a, b, meta((m, n + 1), torch.float32))
            with pytest.raises(dg.DGArgumentError, match="c"):
                dg.fp8_fp4_gemm_nt(a, b, d, c=meta((m, n), torch.float32)[:, :1].expand(m, n))
            q = (meta((4, 8, 64), torch.float8_e4m3fn), meta((32, 1), torch.int16))
            kv = (meta((40, 64), torch.float8_e4m3fn), meta((40, 1), torch.int16))
            w = meta((4, 8), torch.bfloat16)
            lens = meta((4,), torch.int32)
            out = dg.fp8_fp4_mqa_logits(q, kv, w, lens, lens, 300)
            assert out.device.type == "meta" and tuple(out.shape) == (4, 300) and out.stride() == (512, 1)
            ctx = meta((4, 1), torch.int32)
            idx = meta((4,), torch.int32)
            sched = dg.get_paged_mqa_logits_metadata(ctx, 8, idx)
            assert sched.device.type == "meta" and tuple(sched.shape) == (dg.get_num_sms() + 1, 2)
            cache = meta((6, 64, 1, 64 + 2), torch.uint8)
            qp = (meta((4, 1, 8, 64), torch.float8_e4m3fn), meta((32, 1), torch.int16))
            out = dg.fp8_fp4_paged_mqa_logits(qp, cache, w, ctx, meta((4, 2), torch.int32), sched, 128, idx)
            assert out.device.type == "meta" and tuple(out.shape) == (4, 128)
    with dg.numerics(arch="sm100"), pytest.raises(dg.DGArgumentError, match="on meta"):
        dg.bf16_gemm_nt(meta((4, 64), torch.bfloat16), meta((4, 64), torch.bfloat16), meta((4, 4), torch.float32))
