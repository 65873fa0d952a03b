"""Memory-bounded goldens (issue 30): the core's float64 work streams within the limit in force,
with the same bytes whatever the chunking; progress from inside one long case."""

from __future__ import annotations

import io
import re

import ml_dtypes
import numpy as np
import pytest

from deepgemm_ref import _memory, core
from deepgemm_ref import formats as fm
from deepgemm_ref.toolkit.sizes import limit_allocations

from .adversarial import tie_cancel_breaker
from .ordered import assert_ordered_close

BF16 = ml_dtypes.bfloat16
F8 = ml_dtypes.float8_e4m3fn


def _bytes_but_ordered(res: core.MatmulResult) -> list[bytes]:
    return [np.ascontiguousarray(x).tobytes() for x in (res.out, res.acc_lo) if x is not None]


def _operands(kind: str, m: int, n: int, k: int) -> tuple[core.Operand, core.Operand]:
    rng = np.random.default_rng(30)
    if kind == "bf16":  # random rows with adversarial rows among them (every exact tier runs)
        av = rng.standard_normal((m, k))
        bv = rng.standard_normal((n, k))
        ta, tb = tie_cancel_breaker(m, 3, k, seed=3, fill="random")
        av[::7] = ta[::7]
        bv[:3] = tb
        return core.Operand(av.astype(np.float32).astype(BF16)), core.Operand(bv.astype(np.float32).astype(BF16))
    # fp8 with power-of-two (UE8M0) per-128 scales
    va = (rng.standard_normal((m, k)) * 8).astype(F8)
    vb = (rng.standard_normal((n, k)) * 8).astype(F8)
    sa = np.exp2(rng.integers(-6, 6, (m, -(-k // 128)))).astype(np.float64)
    sb = np.exp2(rng.integers(-6, 6, (n, -(-k // 128)))).astype(np.float64)
    return core.Operand(va, sa, 128), core.Operand(vb, sb, 128)


@pytest.mark.parametrize("kind,out", [("bf16", fm.BF16), ("bf16", fm.F32), ("fp8", fm.BF16)])
def test_same_bytes_under_a_tiny_limit_as_unlimited(kind, out):
    m, n, k = 600, 150, 384
    a, b = _operands(kind, m, n, k)
    ep = core.OutputStage(out)
    whole = core.scaled_matmul(a, b, ep, want_acc=True, want_S=True)
    assert core._chunk_rows(m, n, k) == m  # the default limit: one chunk
    with limit_allocations(2 << 20):  # a work budget of 1 MiB: chunks of a few dozen rows
        step = core._chunk_rows(m, n, k)
        chunked = core.scaled_matmul(a, b, ep, want_acc=True, want_S=True)
    assert 16 <= step < m // 4, step
    # the outputs and acc_lo are the same bytes; S and acc follow the BLAS's summation order,
    # which for some kernels depends on the chunk's rows (docs/numerics.md): within their bound
    assert _bytes_but_ordered(chunked) == _bytes_but_ordered(whole)
    assert_ordered_close(whole.S, chunked.S, k, whole.acc, chunked.acc)
    if kind == "bf16":
        assert whole.stats.get("sliced", 0) + whole.stats.get("exact_tier", 0) + sum(
            v for key, v in whole.stats.items() if key not in ("exact", "bounded")) > 0


def test_chunk_rows_follow_the_limit():
    m, n, k = 100_000, 4096, 7168
    per_row = 8 * (n + k) + 2 * n
    for limit in (1 << 30, 4 << 30, 16 << 30):
        with limit_allocations(limit):
            rows = core._chunk_rows(m, n, k)
            # the chunks in flight (one per pool thread) and the copy of b fit in the work budget
            assert rows * per_row * core.num_threads() + 8 * n * k <= _memory.work_budget() or rows == 16


def test_work_progress_reports_shares_up_to_one():
    a, b = _operands("bf16", 2000, 64, 128)
    seen: list[float] = []
    with limit_allocations(2 << 20), _memory.work_progress(seen.append):
        core.scaled_matmul(a, b, core.OutputStage(fm.BF16), want_acc=True, want_S=True)
    assert len(seen) >= 8  # every chunk of the GEMM and of the error scale
    assert all(0 < s <= 1 for s in seen) and max(seen) == pytest.approx(1.0)
    assert _memory.work_reporter() is None


def test_progress_line_inside_a_long_case():
    from deepgemm_ref.golden.progress import Progress

    t = [0.0]
    buf = io.StringIO()
    p = Progress("golden", buf, tty=False, interval=2.0, clock=lambda: t[0])
    p.start(2, 200.0)
    p.case_started("case-a", 100.0)
    for share in (0.1, 0.2, 0.5, 0.9):
        t[0] += 2.5
        p.within(share)
    p.update(1, 100.0, "case-a")
    lines = buf.getvalue().splitlines()
    inside = [x for x in lines if "of case-a" in x]
    assert len(inside) == 4, lines
    assert "50% of case-a" in inside[2] and "(25% of the work)" in inside[2]


def test_generation_writes_lines_during_one_case_with_several_chunks(tmp_path):
    from deepgemm_ref.golden.generation import generate
    from deepgemm_ref.golden.progress import Progress

    buf = io.StringIO()
    spec = {"id": "chunky", "kernel": "bf16_gemm_nt", "profile": "sm100", "m": 1500, "n": 64, "k": 128,
            "out": "bf16"}
    # a small limit: the case streams in chunks of a few hundred rows; interval 0: every report is a line
    generate([spec], tmp_path / "b", max_memory=5632 << 10, progress=Progress("golden", buf, tty=False, interval=0.0))
    inside = [x for x in buf.getvalue().splitlines() if "of chunky" in x]
    assert len(inside) >= 4, buf.getvalue()
    shares = [int(x.rsplit("% of chunky", 1)[0].rsplit(" ", 1)[1]) for x in inside]
    assert shares == sorted(shares) and shares[-1] == 100


@pytest.mark.parametrize("shape,scale", [((3000, 7), 1.0), ((5, 3, 1001), 0.5), ((0, 4), 1.0), ((17,), 2.0),
                                         ((1, 5000), 1.0)])
def test_randn_bf16_in_blocks_is_one_draw(shape, scale, monkeypatch):
    from deepgemm_ref.golden import cases

    monkeypatch.setattr(cases, "_DRAW_BLOCK", 2000)  # many blocks (odd sizes: the last one short)

    def one_draw(seed: int) -> np.ndarray:
        rng = np.random.default_rng(seed)
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)).astype(BF16)

    got = cases.randn_bf16(np.random.default_rng(5), shape, scale)
    assert got.tobytes() == one_draw(5).tobytes()
    # and the generator is left where one draw leaves it
    rng = np.random.default_rng(5)
    cases.randn_bf16(rng, shape, scale)
    ref = np.random.default_rng(5)
    ref.standard_normal(shape, dtype=np.float32)
    assert rng.standard_normal(3).tobytes() == ref.standard_normal(3).tobytes()


def test_heartbeat_writes_while_a_chunk_runs_longer_than_the_interval():
    import time

    from deepgemm_ref.golden.progress import Progress

    buf = io.StringIO()
    p = Progress("golden", buf, tty=False, interval=0.05)  # the real clock: the heartbeat runs
    assert p.heartbeat
    p.start(1, 10.0)
    p.case_started("slow", 10.0)
    time.sleep(0.4)  # no report from the case at all: a chunk longer than the interval
    p.finish()
    beats = [x for x in buf.getvalue().splitlines() if "0% of slow" in x]
    assert len(beats) >= 3, buf.getvalue()
    n = len(buf.getvalue())
    time.sleep(0.15)
    assert len(buf.getvalue()) == n  # finished: the heartbeat has stopped


def test_heartbeat_writes_when_no_case_reports_at_all():
    """Dask tasks and rank processes report nothing until a case ends: the line still comes
    every interval from start to finish."""
    import time

    from deepgemm_ref.golden.progress import Progress

    buf = io.StringIO()
    p = Progress("golden", buf, tty=False, interval=0.05)
    p.start(2, 10.0)
    time.sleep(0.4)
    p.finish()
    assert len([x for x in buf.getvalue().splitlines() if x.startswith("golden: 0/2 cases")]) >= 4, buf.getvalue()


def test_pool_workers_report_the_share_of_their_cases(tmp_path, monkeypatch):
    """``--jobs 2``: the workers send the share of their case done, so the parent's lines name
    the cases in flight with their shares (a CI log is not silent during long cases)."""
    from deepgemm_ref.golden import generation
    from deepgemm_ref.golden.generation import generate
    from deepgemm_ref.golden.progress import Progress

    monkeypatch.setattr(generation, "_SHARE_SECONDS", 0.0)  # every chunk a message (inherited by the fork)
    buf = io.StringIO()
    specs = [{"id": f"chunky{i}", "kernel": "bf16_gemm_nt", "profile": "sm100", "m": 1500, "n": 64, "k": 128,
              "out": "bf16"} for i in range(2)]
    generate(specs, tmp_path / "b", max_memory=2 * (5632 << 10), jobs=2,
             progress=Progress("golden", buf, tty=False, interval=0.0))
    lines = buf.getvalue().splitlines()
    shares = [int(x) for x in re.findall(r"(\d+)% of chunky", buf.getvalue())]
    assert any(0 < x < 100 for x in shares), buf.getvalue()
    assert lines[-1].startswith("golden: 2/2 cases (100% of the work)"), lines[-1]


def test_progress_line_with_several_cases_in_flight():
    from deepgemm_ref.golden.progress import Progress

    buf = io.StringIO()
    p = Progress("golden", buf, tty=False, interval=0.0, clock=lambda: 1.0)
    p.start(4, 40.0)
    for name in ("a", "b", "c"):
        p.case_started(name, 8.0)
    p.within(0.5, "b")
    p.within(0.25)  # the case started last
    assert buf.getvalue().splitlines()[-1].endswith("0% of a, 50% of b and 1 other case")
    assert "(15% of the work)" in buf.getvalue().splitlines()[-1]  # 0.5 * 8 + 0.25 * 8 of 40
    p.update(1, 10.0, "b")
    assert p.line().endswith("0% of a, 25% of c")
    p.update(2, 20.0)
    assert p.cases == {}


def test_the_heartbeat_stops_when_a_run_fails(tmp_path, monkeypatch):
    import threading
    import time

    from deepgemm_ref.golden.bundle import Bundle
    from deepgemm_ref.golden.generation import generate, verify
    from deepgemm_ref.golden.progress import Progress

    generate([{"id": "x", "kernel": "bf16_gemm_nt", "profile": "sm100", "m": 8, "n": 8, "k": 32}], tmp_path / "b")

    def broken(self, case_id):
        raise RuntimeError("disk gone")

    monkeypatch.setattr(Bundle, "verify_case", broken)
    with pytest.raises(RuntimeError, match="disk gone"):
        verify(tmp_path / "b", progress=Progress("verify", io.StringIO(), tty=False, interval=0.05))
    time.sleep(0.1)
    assert not [t for t in threading.enumerate() if t.name == "deepgemm-ref-progress" and t.is_alive()]


def test_a_whole_output_task_hands_its_trace_arrays_over():
    """Collected.add: the first task covering the whole output gives its own acc / S (no second
    output-sized copy); a partial, strided or later task's values are copied in."""
    from deepgemm_ref.executor import Collected, _adoptable

    rng = np.random.default_rng(5)
    shape = (6, 5)
    whole = core.MatmulResult(np.zeros(shape, np.uint16), rng.standard_normal(shape), None, rng.standard_normal(shape))
    col = Collected(shape, True, True)
    col.add((), whole)
    assert col.acc is whole.acc and col.S is whole.S and col.acc_lo is None
    later = core.MatmulResult(np.zeros((2, 5), np.uint16), np.full((2, 5), 7.0), None, None)
    col.add((slice(4, 6),), later)  # a later task writes into the adopted array
    assert (col.acc[4:] == 7.0).all() and (col.acc[:4] == whole.acc[:4]).all()

    part = Collected(shape, True, False, fill=np.nan)
    top = core.MatmulResult(np.zeros((3, 5), np.uint16), np.ones((3, 5)), None, None)
    part.add((slice(0, 3),), top)
    assert part.acc is not top.acc and part.acc.shape == shape
    assert (part.acc[:3] == 1.0).all() and np.isnan(part.acc[3:]).all()

    full = np.ones(shape)
    assert _adoptable(full, (), shape) and _adoptable(full, (slice(None),), shape)
    assert _adoptable(full, (slice(0, 6), slice(None, None, 1)), shape)
    assert not _adoptable(full, (slice(None, None, -1),), shape)  # reversed rows
    assert not _adoptable(full, (slice(0, 6, 2),), (3, 5))  # a strided selection of a larger array
    assert not _adoptable(np.ones((5, 6)).T, (), shape)  # not C-contiguous (a transposed result)
    assert not _adoptable(full.astype(np.float32), (), shape)
    assert not _adoptable(np.ones((3, 5)), (), shape)
    ro = np.ones(shape)
    ro.flags.writeable = False
    assert not _adoptable(ro, (), shape)


def test_a_dense_golden_holds_its_acc_and_S_once(monkeypatch):
    """A traced dense GEMM (acc and S asked for) records the core's own acc and S: no second
    output-sized float64 copy of each is made while the call finishes."""
    import deepgemm_ref as dg
    from deepgemm_ref import executor, trace

    results: list[core.MatmulResult] = []
    real = executor.core.scaled_matmul

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        res = real(*args, **kwargs)
        results.append(res)
        return res

    monkeypatch.setattr(executor.core, "scaled_matmul", spy)
    m, n, k = 64, 96, 48
    rng = np.random.default_rng(7)
    a = rng.standard_normal((m, k), dtype=np.float32).astype(BF16)
    b = rng.standard_normal((n, k), dtype=np.float32).astype(BF16)
    d = np.empty((m, n), BF16)
    with trace.capture(want_acc=True, want_S=True) as cap:
        dg.bf16_gemm_nt(a, b, d)
    assert len(results) == 1 and results[0].acc is not None and results[0].S is not None
    assert cap.last.acc is results[0].acc and cap.last.S is results[0].S
    ref = a.astype(np.float64) @ b.astype(np.float64).T  # exact here: 48 bf16 products
    assert np.array_equal(cap.last.acc, ref)
