"""MQA logits read check -> tasks -> execute: every path runs through the executor and its one record.

The trace record of a call lists the executor tasks it ran (``KernelRecord.tasks``): the logits
tasks (built when they run, so listed as such), then DeepGEMM's clean pass as executor fills, with
the accumulator -inf and the error scale 0 where the fills wrote.  The kernels compute for the
profile the dispatcher hands them: the global profile is not read again, and the paged schedule's
SM count is the profile's (or the one recorded with ``set_num_sms``).
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import deepgemm_ref as dg
from deepgemm_ref import attention as att
from deepgemm_ref import profiles, trace

from .test_attention import BF16, _ascend_quant, _fp8_inputs, _paged_call, _paged_case, _rand

LAZY = "matmul (built when it runs)"
CLEAN = "clean logits"
CLEAN_PAD = "clean logits: allocation columns past the view"


def _plain(seq, seq_kv, ks, ke, **kw):
    _, _, q8, kv = _fp8_inputs(seq, seq_kv, 32, 64, 7)
    w = _rand((seq, 32), 8)
    return att.fp8_fp4_mqa_logits((q8, None), kv, w, np.asarray(ks, np.int32), np.asarray(ke, np.int32), **kw)


@pytest.mark.parametrize("arch", ["sm100", "sm90"])
def test_clean_pass_is_executor_fills_after_the_logits_tasks(arch, monkeypatch):
    monkeypatch.setattr(att, "TASK_ELEMENTS", 1 << 14)  # several logits tasks
    seq, seq_kv = 6, 700
    ks, ke = [0, 3, 100, 700, 0, 650], [500, 3, 700, 700, 1, 699]
    with dg.numerics(arch=arch), trace.capture(want_acc=True, want_S=True) as cap:
        out = _plain(seq, seq_kv, ks, ke)
    rec = cap.last
    n = rec.tasks.count(LAZY)
    assert n > 1 and rec.tasks == (LAZY,) * n + (CLEAN, CLEAN_PAD)
    cols = np.arange(seq_kv)[None, :]
    inside = (cols >= np.array(ks)[:, None]) & (cols < np.array(ke)[:, None])
    assert rec.defined is not None and rec.defined.all()  # cleaned logits are defined (-inf)
    assert np.isneginf(out[~inside]).all() and np.isfinite(out[inside]).all()
    assert rec.acc is not None and rec.S is not None
    assert np.isneginf(rec.acc[~inside]).all() and (rec.S[~inside] == 0).all()
    assert np.isfinite(rec.acc[inside]).all() and (rec.S[inside] > 0).all()
    # the clean kernel's 8192-column block reaches past the view, within the row stride
    alloc = out.base
    assert np.isneginf(alloc[:seq, seq_kv:8192]).all() and np.isnan(alloc[:seq, 8192:]).all()
    assert np.isnan(alloc[seq:]).all()


def test_clean_pass_without_keys_is_fills_only():
    seq, seq_kv = 3, 300
    with dg.numerics(arch="sm100"), trace.capture(want_acc=True, want_S=True) as cap:
        out = _plain(seq, seq_kv, [0, 5, 300], [0, 5, 300])
    rec = cap.last
    assert rec.tasks == (CLEAN, CLEAN_PAD) and rec.func == "fp8_fp4_mqa_logits"
    assert np.isneginf(out).all() and np.isneginf(rec.acc).all() and (rec.S == 0).all()


def test_no_clean_pass_leaves_undefined_elements_nan():
    seq, seq_kv = 3, 300
    ks, ke = [0, 10, 200], [100, 10, 300]
    with dg.numerics(arch="sm100"), trace.capture(want_acc=True) as cap:
        out = _plain(seq, seq_kv, ks, ke, clean_logits=False)
    rec = cap.last
    assert rec.tasks and set(rec.tasks) == {LAZY}
    cols = np.arange(seq_kv)[None, :]
    inside = (cols >= np.array(ks)[:, None]) & (cols < np.array(ke)[:, None])
    assert np.array_equal(rec.defined, inside)
    assert np.isnan(out[~inside]).all() and np.isnan(rec.acc[~inside]).all()
    # compressed logits: the same through the executor, no clean pass
    with dg.numerics(arch="sm100"), trace.capture() as cap:
        _plain(seq, seq_kv, ks, ke, clean_logits=False, max_seqlen_k=100)
    assert set(cap.last.tasks) == {LAZY} and cap.last.defined.shape == (seq, 100)


def test_paged_logits_run_through_the_executor(monkeypatch):
    monkeypatch.setattr(att, "TASK_ELEMENTS", 1 << 12)
    c = _paged_case(311, 4, 2, 64, False)
    with dg.numerics(arch="sm100"), trace.capture(want_acc=True) as cap:
        out = _paged_call(c, 64)
    rec = cap.last
    assert rec.func == "fp8_fp4_paged_mqa_logits" and len(rec.tasks) > 1 and set(rec.tasks) == {LAZY}
    ctx = c["ctx"].reshape(-1)
    defined = np.arange(c["max_len"])[None, :] < ctx[:, None]
    assert np.array_equal(rec.defined, defined)
    assert np.array_equal(np.isnan(rec.acc), ~defined) and np.array_equal(np.isnan(out), ~defined)


def _ascend_plain_args(rows=3, seq_kv=200, heads=8, d=64):
    q = _rand((rows, heads, d), 21)
    kv = _rand((seq_kv, d), 22)
    qd, qpairs, _ = _ascend_quant(q, False)
    kd, kpairs, _ = _ascend_quant(kv, False)
    w = _rand((rows, heads), 23, BF16)
    ks, ke = np.array([0, 50, 200], np.int32), np.array([120, 50, 200], np.int32)
    return (qd, qpairs.reshape(rows, heads, -1)), (kd, kpairs), w, ks, ke, 128


def test_ascend_logits_run_through_the_executor_and_a_dry_run_stops_before():
    args = _ascend_plain_args()
    with dg.numerics(arch="ascend950"), trace.capture(want_acc=True) as cap:
        out = att.fp8_fp4_mqa_logits(*args)
    rec = cap.last
    assert rec.tasks == (LAZY,) and out.dtype == BF16
    width = np.arange(128)[None, :]
    assert np.array_equal(rec.defined, width < (args[4] - args[3])[:, None])
    with dg.numerics(arch="ascend950"), trace.capture() as cap:
        dg._C.set_dry_run(True)
        try:
            dry = att.fp8_fp4_mqa_logits(*args)
        finally:
            dg._C.set_dry_run(False)
    assert cap.records == [] and dry.shape == out.shape and np.isnan(dry.astype(np.float32)).all()


def test_public_signatures_leave_the_profile_out():
    for name in ("fp8_fp4_mqa_logits", "fp8_mqa_logits", "fp8_fp4_paged_mqa_logits", "fp8_paged_mqa_logits",
                 "get_paged_mqa_logits_metadata"):
        assert "profile" not in inspect.signature(getattr(att, name)).parameters, name
    with dg.numerics(arch="ascend950"):
        for name in ("fp8_fp4_mqa_logits", "fp8_fp4_paged_mqa_logits", "get_paged_mqa_logits_metadata"):
            assert "profile" not in inspect.signature(getattr(att, name)).parameters, name


def test_kernels_compute_for_the_profile_they_are_handed(monkeypatch):
    """The dispatcher resolves the profile once; the kernels (and the paged schedule's SM count)
    never read the global profile again."""
    c = _paged_case(312, 3, 1, 64, False)
    with dg.numerics(arch="sm100"):
        want_plain = _plain(2, 300, [0, 7], [300, 100])
        meta = att.get_paged_mqa_logits_metadata(c["ctx"], 64, 148, c["idx"])
        want_paged = att.fp8_fp4_paged_mqa_logits(c["q"], c["cache"], c["w"], c["ctx"], c["table"], meta, c["max_len"])

        def no_global(*_: object) -> None:
            raise AssertionError("the global profile was read inside a kernel")

        monkeypatch.setattr(profiles, "get_profile", no_global)
        with trace.capture() as cap:
            got_plain = _plain(2, 300, [0, 7], [300, 100])
            meta2 = att.get_paged_mqa_logits_metadata(c["ctx"], 64, 148, c["idx"])
            got_paged = att.fp8_fp4_paged_mqa_logits(c["q"], c["cache"], c["w"], c["ctx"], c["table"], meta2,
                                                     c["max_len"])
        monkeypatch.undo()
    assert [r.func for r in cap.records] == ["fp8_fp4_mqa_logits", "fp8_fp4_paged_mqa_logits"]
    assert np.array_equal(got_plain, want_plain, equal_nan=True) and np.array_equal(meta2, meta)
    assert np.array_equal(got_paged, want_paged, equal_nan=True)


@pytest.mark.parametrize("arch,count", [("sm100", 20), ("sm90", 7), ("ascend950", 5)])
def test_schedule_uses_the_recorded_sm_count(arch, count):
    ctx = np.array([[300], [5], [1000]], np.int32)
    idx = np.arange(3, dtype=np.int32)
    with dg.numerics(arch=arch):
        dg.set_num_sms(count)
        if arch == "ascend950":
            meta = att.get_paged_mqa_logits_metadata(ctx, 8, idx)
        else:
            meta = att.get_paged_mqa_logits_metadata(ctx, 64, dg.get_num_sms(), None)
        assert meta.shape == (count + 1, 2)
