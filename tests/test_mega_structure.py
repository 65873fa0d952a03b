"""Mega MoE's structure: check -> (join) -> tasks -> execute, every stage an executor task or fill.

The fused kernels' pipeline stages (dispatch, L1 GEMM, SwiGLU, L2 GEMM, to the combine, the
shared expert, the outputs) run through :func:`deepgemm_ref.executor.execute` and are listed, by
label, in each rank's trace record; the stage functions' records come from the executor too.
"""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest

import deepgemm_ref as dg
from deepgemm_ref import executor, mega, runtime, trace
from deepgemm_ref import formats as fm
from deepgemm_ref.mega import _kernels

from .test_mega_moe import Problem, run_ascend, run_cuda

BF16 = ml_dtypes.bfloat16
_STAGES = ("dispatch", "L1 GEMM", "SwiGLU", "L2 GEMM", "to the combine")


def _experts_with_rows(rec: trace.KernelRecord) -> list[int]:
    """The local experts that received rows, from the record's dispatch.psum (END offsets)."""
    ends = np.asarray(rec.extra["dispatch.psum"], np.int64)
    return [i for i in range(ends.size) if ends[i] > (ends[i - 1] if i else 0)]


def _expected_expert_labels(rank: int, experts: list[int]) -> list[str]:
    return [f"rank {rank} expert {i}: {stage}" for i in experts for stage in _STAGES]


@pytest.fixture
def gemm_labels(monkeypatch):
    """The label of every task the executor's core call runs (its ``run``), in order."""
    seen: list[str] = []
    real = executor.run

    def spy(task, *args, **kwargs):
        seen.append(task.label)
        return real(task, *args, **kwargs)

    monkeypatch.setattr(executor, "run", spy)
    return seen


def test_fused_sm100_stages_are_labelled_executor_tasks_in_each_rank_record(gemm_labels):
    p = Problem(2, 4, 8, 2, 512, 512, seed=31, masked_ratio=0.2)
    with trace.capture(want_acc=True, want_S=True) as cap:
        ys, stats, _ = run_cuda(p)
    assert [rec.stats["rank"] for rec in cap.records] == [0, 1]
    gemms = []
    for r, rec in enumerate(cap.records):
        experts = _experts_with_rows(rec)
        assert experts, "the problem routes rows to every rank"
        want = _expected_expert_labels(r, experts) + [f"rank {r}: combine into y",
                                                      f"rank {r}: cumulative_local_expert_recv_stats += received"]
        assert list(rec.tasks) == want
        gemms += [t for t in rec.tasks if t.endswith("GEMM")]
        # the record's contents are the layer's: acc rounds to y, S bounds the combine, stage arrays
        assert np.array_equal(fm.round_f64(rec.acc, fm.BF16).view(np.uint16), ys[r].view(np.uint16))
        comb = rec.extra["combine.input"].astype(np.float64)
        assert np.array_equal(rec.acc, comb.sum(axis=1)) and np.all(rec.S >= np.abs(comb).sum(axis=1))
        assert rec.extra["l1.acc"].shape == rec.extra["l1.output"].shape
        assert rec.defined is None and rec.func == "fp8_fp4_mega_moe"
    # every GEMM of the records ran through the executor's core call (and nothing else did)
    assert sorted(gemm_labels) == sorted(gemms)


def test_fused_ascend950_shared_expert_is_an_executor_task(gemm_labels):
    p = Problem(2, 4, 6, 2, 512, 512, seed=13, shared=1)
    with dg.numerics(arch="ascend950"), trace.capture() as cap:
        run_ascend(p)
    assert len(cap.records) == 2
    for r, rec in enumerate(cap.records):
        shared = [f"rank {r} shared expert: {stage}" for stage in _STAGES]
        want = (_expected_expert_labels(r, _experts_with_rows(rec)) + shared
                + [f"rank {r}: combine into y", f"rank {r}: cumulative_local_expert_recv_stats += received",
                   f"rank {r}: expert_recv_count"])
        assert list(rec.tasks) == want
        # the shared expert's stage goldens are the ones its tasks computed
        assert rec.extra["shared.output"].shape == (6, 512)
        assert np.array_equal(rec.extra["combine.input"][:, 2].view(np.uint16),
                              rec.extra["shared.output"].view(np.uint16))
    assert "rank 1 shared expert: L1 GEMM" in gemm_labels and "rank 0 shared expert: L2 GEMM" in gemm_labels


def test_collective_false_records_only_the_calling_rank():
    p = Problem(2, 4, 6, 2, 512, 512, seed=41)
    group = mega.EmulatedGroup(2, collective=False)
    bufs = [mega.get_symm_buffer_for_mega_moe(group.rank(r), 4, 384, 2, 512, 512) for r in range(2)]
    for r in range(2):
        bufs[r].x[:6], bufs[r].x_sf[:6] = p.xq[r], p.x_sf_packed[r]
        bufs[r].topk_idx[:6], bufs[r].topk_weights[:6] = p.idx[r], p.w[r]
    group.bind(0, *p.cuda_weights(0), 6, activation_clamp=10.0)
    y1 = np.zeros((6, 512), BF16)
    with trace.capture() as cap:
        mega.fp8_fp4_mega_moe(y1, *p.cuda_weights(1), bufs[1], activation_clamp=10.0)
    assert [rec.stats["rank"] for rec in cap.records] == [1]
    tasks = cap.last.tasks
    assert tasks[-1] == "rank 1: combine into y" and all(t.startswith("rank 1") for t in tasks)


def test_a_call_that_only_joins_returns_after_its_check():
    p = Problem(2, 4, 6, 2, 512, 512, seed=43)
    group = mega.EmulatedGroup(2)
    bufs = [mega.get_symm_buffer_for_mega_moe(group.rank(r), 4, 384, 2, 512, 512) for r in range(2)]
    for r in range(2):
        bufs[r].x[:6], bufs[r].x_sf[:6] = p.xq[r], p.x_sf_packed[r]
        bufs[r].topk_idx[:6], bufs[r].topk_weights[:6] = p.idx[r], p.w[r]
    y = np.full((6, 512), 7, BF16)
    with trace.capture() as cap:
        mega.fp8_fp4_mega_moe(y, *p.cuda_weights(1), bufs[1])
    assert cap.records == [] and group.pending_ranks() == [1] and np.all(y.astype(np.float32) == 7)
    call = group.binding(1)
    assert isinstance(call, _kernels.RankRequest) and isinstance(call, executor.Request)
    assert call.d is y and call.rank == 1 and call.profile.name == "sm100" and not call.binding


def test_bind_gets_the_dispatchers_profile():
    """EmulatedGroup.bind validates under the profile the dispatcher hands it (Ascend: every AI core)."""
    p = Problem(2, 4, 6, 2, 512, 512, seed=5, shared=0)
    with dg.numerics(arch="ascend950"):
        group = mega.EmulatedGroup(2, collective=False)
        for r in range(2):
            mega.SymmBuffer(group.rank(r), 4, 6, 2, 512, 512)
        state = runtime.runtime_state()
        try:
            dg.set_num_sms(16)
            with pytest.raises(dg.DGArgumentError, match=re.escape("get_num_sms()")):
                group.bind(0, *p.ascend_weights(0), 6)
        finally:
            runtime.restore_runtime(state)
        group.bind(0, *p.ascend_weights(0), 6)
        bound = group.binding(0)
        assert bound.binding and bound.y is None and bound.profile.name == "ascend950"
        assert bound.func == "EmulatedGroup.bind"


def test_stage_functions_record_through_the_executor():
    p = Problem(2, 4, 8, 2, 512, 512, seed=3)
    with trace.capture() as cap:
        d = mega.mega_moe_dispatch([(p.xq[r], p.x_sf_packed[r]) for r in range(2)], p.idx, p.w, 4)
    assert cap.last.func == "mega_moe_dispatch" and set(cap.last.extra) == {"rank0.recv_x", "rank0.src",
                                                                             "rank1.recv_x", "rank1.src"}
    h = d[0]
    with trace.capture() as cap:
        out = mega.mega_moe_grouped_gemm((h.recv_x, h.recv_x_sf), (p.w1q[:2], p.w1sf[:2]),
                                         h.psum_num_recv_tokens_per_expert)
    ends = [int(e) for e in h.psum_num_recv_tokens_per_expert]
    starts = [0] + ends[:-1]
    want = [f"expert {g}: rows [{s}, {e})" for g, (s, e) in enumerate(zip(starts, ends, strict=True)) if e > s]
    assert list(cap.last.tasks) == want and cap.last.defined is not None
    assert cap.last.defined.shape == out.shape and cap.last.defined.all()
    with trace.capture() as cap:
        ys = mega.mega_moe_combine([np.ones((dd.recv_x.shape[0], 512), BF16) for dd in d], d)
    assert [rec.stats for rec in cap.records] == [{"rank": 0}, {"rank": 1}]
    for s, rec in enumerate(cap.records):
        assert np.array_equal(rec.acc, rec.extra["combine.input"].astype(np.float64).sum(axis=1))
        assert rec.acc.shape == ys[s].shape and rec.tasks == ()


def test_ascend_buffer_pointers_from_the_shared_helper():
    """The construction helpers SymmBuffer uses and _C.SymmBuffer can use: bytes (or a lease zeroed
    again) and every rank's address."""
    from deepgemm_ref.mega._buffer import buffer_ptrs, symm_bytes

    a = symm_bytes(64)
    assert a.dtype == np.int8 and a.size == 64 and not a.any()
    a[3] = 1
    assert symm_bytes(32, reuse=a) is a and not a.any()
    assert symm_bytes(128, reuse=a) is not a
    assert buffer_ptrs([None, a]) == [0, a.__array_interface__["data"][0]]
    with dg.numerics(arch="ascend950"):
        group = mega.EmulatedGroup(2)
        b0 = mega.SymmBuffer(group.rank(0), 4, 6, 2, 512, 512)
        assert b0.handle.buffer_ptrs == [b0.buffer.__array_interface__["data"][0], 0]


def test_family_reads_no_global_profile():
    """The family's code takes the dispatcher's profile: no get_profile, no legacy_execute, no
    direct trace.record, no active_accumulation() without a profile."""
    from pathlib import Path

    pat = re.compile(r"get_profile|legacy_execute|trace\.record|active_accumulation\(\)")
    root = Path(mega.__file__).parent
    hits = [f"{f.name}:{i}" for f in sorted(root.glob("*.py"))
            for i, line in enumerate(f.read_text().splitlines(), 1) if pat.search(line)]
    assert hits == []


@pytest.mark.parametrize("bf16", [False, True])
def test_transposed_tasks_asked_for_codes_alone_give_the_codes_of_the_transposed_product(bf16, monkeypatch):
    """A transposed task (an expert's activations against its weights) asked for the exact model's
    codes alone runs in its own orientation when the weights' float64 copy is small: the same
    codes, bit for bit, as the transposed product (FP8 x FP4 and BF16 operands, a bf16 output)."""
    from deepgemm_ref import core

    rng = np.random.default_rng(9)
    x = rng.standard_normal((40, 256), dtype=np.float32)
    w = rng.standard_normal((96, 256), dtype=np.float32)
    if bf16:
        a, b = core.Operand(x.astype(ml_dtypes.bfloat16)), core.Operand(w.astype(ml_dtypes.bfloat16))
    else:
        (qa, sa), (qb, sb) = dg.per_token_cast_to_fp8(x, True, 32), dg.per_token_cast_to_fp4(w, True, 32)
        a = core.Operand(qa, sa.astype(np.float64), 32)
        b = core.Operand(fm.unpack_fp4(qb), sb.astype(np.float64), 32, codes_fmt=fm.E2M1)
    task = executor.Task(a, b, core.OutputStage(fm.BF16), (slice(None),), transposed=True)
    exact = core.Accumulation("exact")
    seen: list[tuple[int, int]] = []
    real = core.scaled_matmul

    def spy(p: core.Operand, q: core.Operand, *args: object, **kwargs: object) -> core.MatmulResult:
        seen.append(p.shape)
        return real(p, q, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(core, "scaled_matmul", spy)
    own = executor.run(task, exact)
    with_acc = executor.run(task, exact, want_acc=True)
    assert seen == [(40, 256), (96, 256)]  # codes alone: its own orientation; with acc: transposed
    assert np.array_equal(np.ascontiguousarray(own.out).view(np.uint16),
                          np.ascontiguousarray(with_acc.out).view(np.uint16))
    assert own.out.shape == with_acc.out.shape == (40, 96)
