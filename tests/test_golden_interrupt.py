"""Interruption-safe generation (issue 14, item 4), for real: a ``golden --jobs 2`` subprocess gets
SIGINT / SIGTERM; every worker stops within 2 seconds, the manifest lists the finished cases and
marks the rest incomplete, the exit code is 130 / 143 with a one-line message, and ``--resume``
computes only the missing cases and gives the bytes of an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deepgemm_ref import golden

if sys.platform == "win32":  # pragma: no cover
    pytest.skip("POSIX signals", allow_module_level=True)

# Six cases of about 0.3 s each here (two at a time with --jobs 2): a signal sent when the first case
# file appears finds both workers busy and cases not started.
SPECS = [{"id": f"c{i}", "kernel": "fp8_gemm_nt", "profile": "sm100", "m": 384, "n": 384, "k": 8192 + 256 * i}
         for i in range(6)]
CLI = [sys.executable, "-m", "deepgemm_ref.cli"]


def _bundle_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(x) for x in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by init) is not running
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _start(spec: Path, out: Path, *extra: str) -> subprocess.Popen[str]:
    env = dict(os.environ, DEEPGEMM_REF_PROGRESS_INTERVAL="0.5")
    return subprocess.Popen([*CLI, "golden", "--spec", str(spec), "--out", str(out), *extra], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def _wait_for_files(out: Path, n: int, proc: subprocess.Popen[str], timeout: float = 60) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if len(list((out / "cases").glob("*.safetensors"))) >= n:
            return
        if proc.poll() is not None:
            raise AssertionError(f"finished before the signal: {proc.communicate()}")
        time.sleep(0.05)
    raise AssertionError("no case finished in time")


@pytest.fixture(scope="module")
def spec_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("spec") / "spec.json"
    path.write_text(json.dumps(SPECS))
    return path


@pytest.fixture(scope="module")
def reference(spec_file, tmp_path_factory) -> dict[str, bytes]:
    out = tmp_path_factory.mktemp("ref") / "b"
    subprocess.run([*CLI, "golden", "--spec", str(spec_file), "--out", str(out), "--jobs", "2"], check=True,
                   capture_output=True)
    return _bundle_bytes(out)


def _interrupt(spec_file: Path, out: Path, sig: int, *extra: str, second: bool = False,
               files: int = 1) -> tuple[int, str, float, list[int]]:
    proc = _start(spec_file, out, "--jobs", "2", *extra)
    _wait_for_files(out, files, proc)
    workers = _children(proc.pid)
    t0 = time.monotonic()
    proc.send_signal(sig)
    if second:
        time.sleep(0.05)
        proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    return proc.returncode, err, time.monotonic() - t0, workers


@pytest.mark.slow  # a subprocess interrupted by a signal (default-run time)
@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_stops_every_worker_and_resume_gives_the_same_bytes(spec_file, reference, tmp_path, sig, code):
    out = tmp_path / "b"
    rc, err, took, workers = _interrupt(spec_file, out, sig)
    assert rc == code, err
    assert took < 2.0, f"took {took:.2f} s to stop"
    assert len(workers) == 2 and not any(_alive(w) for w in workers)
    last = err.strip().splitlines()[-1]
    assert last.startswith("deepgemm-ref: interrupted by " + signal.Signals(sig).name) and "--resume" in last
    assert "Traceback" not in err
    manifest = json.loads((out / "manifest.json").read_text())
    done = [c["id"] for c in manifest["cases"]]
    assert done and manifest["incomplete"] and sorted(done + manifest["incomplete"]) == sorted(s["id"] for s in SPECS)
    assert golden.verify(out)["problems"][:-1] == []  # every finished case verifies; the last problem: incomplete
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]
    # every case file written before the workers stopped is in the manifest
    assert sorted(p.stem for p in (out / "cases").glob("*.safetensors")) == sorted(done)
    kept = {c: (out / "cases" / f"{c}.safetensors").stat() for c in done}
    r = subprocess.run([*CLI, "golden", "--spec", str(spec_file), "--out", str(out), "--jobs", "2", "--resume"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert f"{len(SPECS) - len(done)} of {len(SPECS)} cases to generate" in r.stdout
    for c, st in kept.items():  # finished files untouched
        now = (out / "cases" / f"{c}.safetensors").stat()
        assert (now.st_ino, now.st_mtime_ns) == (st.st_ino, st.st_mtime_ns)
    assert _bundle_bytes(out) == reference


@pytest.mark.slow  # a subprocess interrupted by a signal (default-run time)
def test_second_ctrl_c_does_not_deadlock(spec_file, tmp_path):
    rc, err, took, workers = _interrupt(spec_file, tmp_path / "b", signal.SIGINT, second=True)
    assert rc == 130 and took < 2.0, (rc, took, err)
    assert not any(_alive(w) for w in workers)
    assert "incomplete" in json.loads((tmp_path / "b" / "manifest.json").read_text())


@pytest.mark.slow  # a subprocess interrupted by a signal (default-run time)
def test_interrupted_force_keeps_the_old_bundle(spec_file, reference, tmp_path):
    out = tmp_path / "b"
    old_specs = [dict(s, k=256) for s in SPECS]  # a different old bundle, fast to make
    golden.generate(old_specs, out)
    (out / "notes.txt").write_text("mine")
    before = _bundle_bytes(out)
    proc = _start(Path(spec_file), out, "--jobs", "2", "--force")
    # the new bundle is built in a sibling directory: wait until it holds a finished case
    t0 = time.monotonic()
    while not list(tmp_path.glob(".b.new-*/cases/*.safetensors")):
        assert time.monotonic() - t0 < 60 and proc.poll() is None
        time.sleep(0.05)
    assert _bundle_bytes(out) == before  # nothing touched while it works
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and "left as it was" in err
    assert _bundle_bytes(out) == before and golden.verify(out)["ok"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]  # no temporary directory outlives the run
    # an uninterrupted --force swaps the new bundle in, and keeps the user's own file
    r = subprocess.run([*CLI, "golden", "--spec", str(spec_file), "--out", str(out), "--jobs", "2", "--force"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    after = _bundle_bytes(out)
    assert after.pop("notes.txt") == b"mine" and after == reference
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]


@pytest.mark.slow  # a subprocess interrupted by a signal (default-run time)
def test_jobs_1_interrupt_keeps_the_finished_cases(spec_file, tmp_path):
    out = tmp_path / "b"
    proc = _start(spec_file, out)
    _wait_for_files(out, 1, proc)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and time.monotonic() - t0 < 2.0, err
    m = json.loads((out / "manifest.json").read_text())
    assert m["cases"] and m["incomplete"] and "Traceback" not in err


def test_resume_removes_stray_temporaries_and_keeps_verified_cases(tmp_path):
    specs = [dict(s, k=256) for s in SPECS[:3]]
    out = tmp_path / "b"
    golden.generate(specs, out)
    (out / "cases" / ".c9.safetensors.0123.tmp").write_bytes(b"partial")
    (out / ".manifest.json.x.tmp").write_text("{")
    # an altered case is regenerated; a case no longer asked for is dropped with its file
    (out / "cases" / "c1.safetensors").write_bytes(b"garbage")
    manifest = golden.generate(specs[:2] + [dict(specs[2], id="c3")], out, resume=True)
    assert [c["id"] for c in manifest["cases"]] == ["c0", "c1", "c3"]
    assert sorted(p.name for p in (out / "cases").iterdir()) == ["c0.safetensors", "c1.safetensors", "c3.safetensors"]
    assert not list(out.glob(".*.tmp")) and golden.verify(out)["ok"]


@pytest.mark.slow  # a CLI subprocess (default-run time)
def test_progress_lines_when_not_a_terminal(spec_file, tmp_path):
    """Not a terminal: a line every few seconds (here 0.5 s) with done/total, elapsed and ETA."""
    small = tmp_path / "s.json"
    small.write_text(json.dumps([dict(s, k=4096) for s in SPECS[:4]]))
    proc = _start(small, tmp_path / "b", "--jobs", "2")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "plan: 4 of 4 cases" in out and "estimated size" in out and "estimated time" in out
    lines = [x for x in err.splitlines() if x.startswith("golden: ")]
    assert lines[0].startswith("golden: 0/4 cases") and lines[-1].startswith("golden: 4/4 cases")
    assert all("elapsed" in x and "ETA" in x for x in lines)


@pytest.mark.dask
def test_dask_interrupt_cancels_tasks_and_late_tasks_write_nothing(spec_file, reference, tmp_path):
    distributed = pytest.importorskip("distributed", reason="dask.distributed is not installed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=None) as cluster:
        out = tmp_path / "b"
        proc = _start(spec_file, out, "--executor", "dask", "--scheduler", cluster.scheduler_address)
        _wait_for_files(out, 1, proc, timeout=120)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 130 and time.monotonic() - t0 < 2.5, err
        manifest = json.loads((out / "manifest.json").read_text())
        done = {c["id"] for c in manifest["cases"]}
        assert done and manifest["incomplete"]
        time.sleep(4)  # tasks that were running finish on the workers, see the run stopped, write nothing
        files = {p.stem for p in (out / "cases").glob("*.safetensors")}
        assert files <= done | set(manifest["incomplete"]) and not list(out.rglob("*.tmp"))
        r = subprocess.run([*CLI, "golden", "--spec", str(spec_file), "--out", str(out), "--resume", "--executor",
                            "dask", "--scheduler", cluster.scheduler_address], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    assert {k: v for k, v in _bundle_bytes(out).items() if k != "manifest.json"} == \
        {k: v for k, v in reference.items() if k != "manifest.json"}
