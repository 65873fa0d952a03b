"""``golden --jobs`` that pays (issue 30, item 5): how many workers a run starts (the machine's
CPUs and load, the cases' estimated work), the order the cases are fed in (the largest first)
and the Dask executor's priorities and BLAS pinning; the bytes are those of a serial run."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from deepgemm_ref import golden
from deepgemm_ref.golden import generation as G
from deepgemm_ref.golden.cases import estimate_case, validate_spec

# Three tiny cases of clearly different work, the smallest first.
SPECS = [{"id": f"c{i}", "kernel": "fp8_gemm_nt", "profile": "sm100", "m": 32 * (i + 1), "n": 64, "k": 128 * (i + 1)}
         for i in range(3)]


def _bundle_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != ".lock"}


def _largest_first() -> list[str]:
    work = {s["id"]: estimate_case(validate_spec(s)).work for s in SPECS}  # type: ignore[union-attr]
    assert len(set(work.values())) == len(work)  # distinct, so the order is defined
    return sorted(work, key=lambda i: -work[i])


@pytest.fixture
def fallback_on(monkeypatch):
    monkeypatch.delenv(G.JOBS_FALLBACK_ENV, raising=False)


@pytest.mark.parametrize(("jobs", "cases", "seconds", "cpus", "load", "workers", "why"), [
    (2, 115, 8.6, 2, 0.3, 2, ""),  # an idle two-core machine, deepgemm-tests-small's work
    (2, 115, 8.6, 2, 1.5, 2, ""),  # half a CPU idle: the second worker still gets it (1 + ceil(0.5))
    (2, 115, 8.6, 2, 2.0, 1, "loaded (load average 2.00 on 2 CPUs)"),
    (2, 115, 8.6, 2, 6.21, 1, "loaded (load average 6.21 on 2 CPUs)"),
    (16, 500, 900.0, 16, 8.0, 9, "loaded"),  # 1 + ceil(16 - 8)
    (4, 115, 8.6, 2, 0.0, 2, "may run on 2 CPUs"),  # never more workers than CPUs
    (2, 46, 0.84, 2, 0.0, 1, "the cases are small"),  # smoke: under a second of work
    (4, 100, 2.5, 8, 0.0, 2, "the cases are small"),  # one worker per second of work
    (2, 1, 50.0, 2, 0.0, 1, ""),  # one case: no pool, nothing to say
    (3, 2, 50.0, 4, 0.0, 2, ""),  # never more workers than cases
])
def test_pool_workers_rules(fallback_on, jobs, cases, seconds, cpus, load, workers, why):
    n, note = G.pool_workers(jobs, cases, seconds, cpus=cpus, load=load)
    assert n == workers
    if why:
        assert why in note and note.startswith(f"--jobs {jobs}: ") and "\n" not in note
        assert ("in this process" in note) == (workers == 1)
        assert f"{G.JOBS_FALLBACK_ENV}=0" in note
    else:
        assert note == ""


def test_pool_workers_as_asked_when_the_fallback_is_off(monkeypatch):
    monkeypatch.setenv(G.JOBS_FALLBACK_ENV, "0")
    assert G.pool_workers(2, 115, 0.5, cpus=1, load=9.0) == (2, "")


def test_tiny_cases_run_in_this_process_with_a_note(fallback_on, monkeypatch, tmp_path):
    """A run whose estimated work is far below what starting workers costs starts none, says so in
    one line, and writes the serial bytes."""
    def no_pool(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a worker pool was started for tiny cases")

    monkeypatch.setattr(G, "_run_pool", no_pool)
    monkeypatch.setattr(G, "_load", lambda: 0.0)  # an idle machine: the size is the reason
    notes: list[str] = []
    golden.generate(SPECS, tmp_path / "jobs", jobs=2, on_note=notes.append)
    assert len(notes) == 1 and "running the cases in this process" in notes[0] and "small" in notes[0]
    golden.generate(SPECS, tmp_path / "serial")
    assert _bundle_bytes(tmp_path / "jobs") == _bundle_bytes(tmp_path / "serial")


def test_the_pool_is_fed_the_largest_case_first(monkeypatch, tmp_path):
    """The workers get the cases in decreasing estimated work (the fallback is off: conftest)."""
    fed: list[list[str]] = []
    real = G._run_pool

    def recording(todo: list[Any], *args: Any) -> Any:
        fed.append([s.id for s in todo])
        return real(todo, *args)

    monkeypatch.setattr(G, "_run_pool", recording)
    golden.generate(SPECS, tmp_path / "jobs", jobs=2)
    assert fed == [_largest_first()]
    golden.generate(SPECS, tmp_path / "serial")
    assert _bundle_bytes(tmp_path / "jobs") == _bundle_bytes(tmp_path / "serial")


class _Future:
    def __init__(self, fn: Any, args: tuple[Any, ...]) -> None:
        self.value = fn(*args)

    def done(self) -> bool:
        return True

    def result(self) -> Any:
        return self.value


def test_dask_tasks_in_cost_order_with_the_spec_as_json_and_the_blas_pinned(monkeypatch, tmp_path):
    """A stand-in ``distributed`` (the tasks run at submit): one task per case, priorities
    decreasing with the estimated work, the specification as JSON text, each task pinning its
    worker's BLAS and pool to the host's CPUs over the host's worker threads."""
    submitted: list[tuple[str, int]] = []
    pinned: list[int] = []

    class Client:
        def __init__(self, address: str, timeout: str = "") -> None:
            pass

        def scheduler_info(self) -> dict[str, Any]:  # two workers of 3 threads on one host
            return {"workers": {"tcp://10.0.0.7:4001": {"nthreads": 3}, "tcp://10.0.0.7:4002": {"nthreads": 3}}}

        def submit(self, fn: Any, *args: Any, key: str, pure: bool, retries: int, priority: int) -> _Future:
            assert isinstance(args[0], str)  # JSON text, built into inputs in the task
            submitted.append((json.loads(args[0])["id"], priority))
            return _Future(fn, args)

        def cancel(self, futures: Any, force: bool = False) -> None:
            pass

        def close(self, timeout: float = 0) -> None:
            pass

    worker = types.SimpleNamespace(address="tcp://10.0.0.7:4001", state=types.SimpleNamespace(nthreads=3))
    fake = types.ModuleType("distributed")
    fake.Client = Client  # type: ignore[attr-defined]
    fake.get_worker = lambda: worker  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "distributed", fake)
    monkeypatch.setattr(G, "limit_blas_threads", lambda n: pinned.append(n) or True)
    monkeypatch.setattr(G, "_cpus", lambda: 12)
    monkeypatch.setenv("DEEPGEMM_REF_NUM_THREADS", "12")  # restored after the test
    golden.generate(SPECS, tmp_path / "dask", executor="dask", scheduler="tcp://10.0.0.7:8786")
    assert [i for i, _ in submitted] == _largest_first()
    priorities = [p for _, p in submitted]
    assert priorities == sorted(priorities, reverse=True) and len(set(priorities)) == len(priorities)
    assert pinned == [12 // 6] * len(SPECS)  # 12 CPUs over 2 x 3 worker threads
    golden.generate(SPECS, tmp_path / "serial")
    assert _bundle_bytes(tmp_path / "dask") == _bundle_bytes(tmp_path / "serial")


def test_dask_threads_outside_a_worker_is_one(monkeypatch):
    def outside() -> Any:
        raise ValueError("No worker found")

    fake = types.ModuleType("distributed")
    fake.get_worker = outside  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "distributed", fake)
    assert G._dask_threads({"10.0.0.7": 2}) == 1


def test_each_worker_runs_its_blas_and_pool_on_its_share_of_the_cpus(monkeypatch, tmp_path):
    """Six CPUs, two workers: each case is computed with the BLAS (outside the golden computation's
    own one-thread blocks) and the package's pool at three threads (the workers are forked, so the
    stand-ins below run in them and write what they saw)."""
    from deepgemm_ref import _parallel

    if _parallel._openblas() is None:
        pytest.skip("no OpenBLAS found in this process")
    seen = tmp_path / "seen"
    seen.mkdir()
    real = G.generate_case

    def observing(spec: Any, *args: Any, **kwargs: Any) -> Any:
        blas = _parallel._openblas()
        assert blas is not None
        (seen / spec.id).write_text(f"{int(blas[1]())} {_parallel.num_threads()}")
        return real(spec, *args, **kwargs)

    monkeypatch.setattr(G, "_cpus", lambda: 6)
    monkeypatch.setattr(G, "generate_case", observing)
    golden.generate(SPECS, tmp_path / "b", jobs=2)
    assert {p.name: p.read_text() for p in seen.iterdir()} == {s["id"]: "3 3" for s in SPECS}
