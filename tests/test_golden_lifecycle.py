"""A golden run's lifecycle (issue 29, group A): workers die with their parent, one run per bundle
(an advisory lock that a SIGKILL cannot leave behind), ``--force`` keeps the user's files and
cleans the siblings interrupted runs left, temporary names within the file-name limit, ``--out ''``
refused, the Ctrl-C message counts what is on disk, ``generate`` in several threads at once, the
stable memory-limit default and a dry run that always shows the plan."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from deepgemm_ref import golden, profiles
from deepgemm_ref.golden.bundle import BundleError
from deepgemm_ref.golden.lifecycle import LOCK_NAME, BundleLock, sibling_name
from deepgemm_ref.golden.resources import ResourceError
from deepgemm_ref.toolkit import sizes

if sys.platform == "win32":  # pragma: no cover
    pytest.skip("POSIX processes and locks", allow_module_level=True)

CLI = [sys.executable, "-m", "deepgemm_ref.cli"]
ONE = [{"id": "c0", "kernel": "bf16_gemm_nt", "profile": "sm100", "m": 16, "n": 16, "k": 64, "out": "bf16"}]


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is not running
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


# ----------------------------------------------------------------------------------------------
# workers die with their parent
# ----------------------------------------------------------------------------------------------

@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_PDEATHSIG) is Linux's")
def test_a_worker_dies_when_its_parent_is_killed():
    from deepgemm_ref.golden.lifecycle import die_with_parent

    r, w = os.pipe()
    run = os.fork()
    if run == 0:  # a run (forked: nothing to import) that starts a worker as the pool does
        try:
            os.close(r)
            parent = os.getpid()
            worker = os.fork()
            if worker == 0:
                die_with_parent(parent)  # the pool worker's first call
                time.sleep(30)
                os._exit(0)
            os.write(w, str(worker).encode())
            time.sleep(30)
        finally:
            os._exit(0)
    os.close(w)
    worker = int(os.read(r, 32))
    os.close(r)
    try:
        assert _alive(worker)
        time.sleep(0.2)  # the worker has made its call
        os.kill(run, signal.SIGKILL)  # the run alone
        os.waitpid(run, 0)
        deadline = time.monotonic() + 5
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not _alive(worker), "the worker outlived its killed parent"
    finally:
        for pid in (run, worker):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_pool_workers_are_told_their_parent(monkeypatch):
    from deepgemm_ref.golden import generation

    seen: list[int] = []
    monkeypatch.setattr(generation, "die_with_parent", seen.append)

    class Conn:  # the parent closed the pipe: the worker returns at once
        def recv_bytes(self) -> bytes:
            raise EOFError

    generation._pool_worker(Conn(), 1, 12345)
    assert seen == [12345]
    import multiprocessing as mp

    started: list[tuple[object, tuple[object, ...]]] = []

    class Ctx:  # the pool's context, recording what its workers are started with
        Pipe = staticmethod(mp.Pipe)

        @staticmethod
        def Process(target: object, args: tuple[object, ...], daemon: bool) -> object:  # noqa: N802
            started.append((target, args))
            return type("P", (), {"start": lambda self: None})()

    generation._Worker(Ctx(), 1)
    assert started[0][0] is generation._pool_worker and started[0][1][2] == os.getpid()


@pytest.mark.slow  # a CLI subprocess killed with SIGKILL, then --resume (several seconds)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and PR_SET_PDEATHSIG")
def test_sigkill_of_the_main_process_leaves_no_worker_writing(tmp_path):
    specs = [{"id": f"c{i}", "kernel": "fp8_gemm_nt", "profile": "sm100", "m": 384, "n": 384, "k": 8192 + 256 * i}
             for i in range(8)]
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(specs))
    out = tmp_path / "B"
    proc = subprocess.Popen([*CLI, "golden", "--spec", str(spec), "--out", str(out), "--jobs", "2"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    workers: list[int] = []
    while time.monotonic() < deadline and len(workers) < 2:
        workers = [int(x) for t in Path(f"/proc/{proc.pid}/task").glob("*")
                   for x in (t / "children").read_text().split()] if _alive(proc.pid) else []
        time.sleep(0.05)
    assert len(workers) == 2
    time.sleep(0.5)
    proc.kill()  # the main process alone
    proc.wait()
    deadline = time.monotonic() + 10
    while any(_alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(w) for w in workers), "a worker outlived the killed run"
    r = subprocess.run([*CLI, "golden", "--spec", str(spec), "--out", str(out), "--resume"], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    before = _files(out)
    time.sleep(2)
    assert _files(out) == before
    assert golden.verify(out)["ok"]


# ----------------------------------------------------------------------------------------------
# one run per bundle
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["resume", "force"])
def test_a_locked_bundle_is_refused_at_once(tmp_path, mode):
    out = tmp_path / "B"
    golden.generate(ONE, out)
    before = _files(out)
    with BundleLock(out):  # another run (here: another open file description) holds it
        t0 = time.monotonic()
        with pytest.raises(BundleError, match="another golden run holds this bundle") as e:
            golden.generate(ONE, out, **{mode: True})
        assert time.monotonic() - t0 < 5
        assert str(out) in str(e.value)
    assert _files(out) == before
    # the kernel released the lock with its holder: nothing is left that blocks the next run
    golden.generate(ONE, out, resume=True)


def test_the_cli_refuses_a_locked_bundle_in_one_line(tmp_path, capsys):
    from deepgemm_ref.cli import main

    out = tmp_path / "B"
    golden.generate(ONE, out)
    spec = tmp_path / "s.json"
    spec.write_text(json.dumps(ONE))
    with BundleLock(out):
        assert main(["golden", "--spec", str(spec), "--out", str(out), "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(out) in err and "another golden run holds" in err


def test_workers_inherit_the_lock_and_keep_it_while_they_live(tmp_path):
    from deepgemm_ref.golden.lifecycle import is_locked

    out = tmp_path / "B"
    out.mkdir()
    lock = BundleLock(out).acquire()
    child = os.fork()
    if child == 0:  # a worker (forked, as the pool's are) whose run is gone
        time.sleep(30)
        os._exit(0)
    try:
        lock.release()  # the run ends (or is killed): its worker still holds the lock
        assert is_locked(out)
        with pytest.raises(BundleError, match="another golden run"):
            BundleLock(out).acquire()
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
    assert not is_locked(out)  # the kernel released it with its last holder
    BundleLock(out).acquire().release()


def test_a_lock_left_by_a_killed_holder_does_not_block(tmp_path):
    out = tmp_path / "B"
    golden.generate(ONE, out)
    # a holder (as BundleLock takes it: flock LOCK_EX on B/.lock) killed with SIGKILL
    code = f"import fcntl, os; fd = os.open({str(out / LOCK_NAME)!r}, os.O_RDWR | os.O_CREAT); " \
           "fcntl.flock(fd, fcntl.LOCK_EX); os.kill(os.getpid(), 9)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == -signal.SIGKILL
    assert (out / LOCK_NAME).exists()  # the file stays; the lock went with the process
    golden.generate(ONE, out, resume=True)
    golden.generate(ONE, out, force=True)


# ----------------------------------------------------------------------------------------------
# --force: the user's files, stale siblings, long names
# ----------------------------------------------------------------------------------------------

def test_force_keeps_user_files_and_removes_stale_siblings(tmp_path):
    out = tmp_path / "B"
    golden.generate(ONE, out)
    (out / "cases" / "NOTES.txt").write_text("mine")
    (out / "README.txt").write_text("also mine")
    stale = tmp_path / ".B.new-0123456789ab"  # what a SIGKILL during --force leaves
    (stale / "cases").mkdir(parents=True)
    (stale / "cases" / "c0.safetensors").write_bytes(b"x" * 100)
    held = sibling_name(out, "new")  # a sibling a live run holds is left alone
    held.mkdir()
    other = tmp_path / ".Bx.new-0123456789ab"  # another bundle's sibling: not this run's business
    other.mkdir()
    with BundleLock(held):
        golden.generate(ONE, out, force=True)
        assert held.exists()
    assert (out / "cases" / "NOTES.txt").read_text() == "mine"
    assert (out / "README.txt").read_text() == "also mine"
    assert not stale.exists()
    assert other.exists()
    assert golden.verify(out)["ok"]


def test_force_with_a_240_character_bundle_name(tmp_path):
    out = tmp_path / ("b" * 240)
    golden.generate(ONE, out)
    golden.generate(ONE, out, force=True)
    assert golden.verify(out)["ok"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b" * 240]
    assert len(os.fsencode(sibling_name(Path("/x") / ("é" * 127), "new").name)) <= 255


# ----------------------------------------------------------------------------------------------
# --out '', the Ctrl-C message
# ----------------------------------------------------------------------------------------------

def test_empty_out_is_refused(tmp_path, monkeypatch, capsys):
    with pytest.raises(BundleError, match="--out"):
        golden.generate(ONE, "")
    from deepgemm_ref.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["golden", "--preset", "smoke", "--case", "sm100-fp8-nt-bf16", "--out", ""]) == 2
    err = capsys.readouterr().err
    assert "--out" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_interrupted_message_counts_the_case_files_on_disk(tmp_path):
    from deepgemm_ref.golden import generation

    specs = ONE + [dict(ONE[0], id="c1"), dict(ONE[0], id="c2")]
    plan = generation.plan_generation(specs, tmp_path / "B")
    work = tmp_path / "B"
    (work / "cases").mkdir(parents=True)
    entry = golden.generate(specs[:1], tmp_path / "A")["cases"]
    for c in plan.cases[:2]:  # two files on disk, one of them in the manifest
        (work / c.file).write_bytes((tmp_path / "A" / plan.cases[0].file).read_bytes())
    finished = {"c0": entry[0] if isinstance(entry, list) else next(iter(entry.values()))}
    msg = generation._stopped(plan, work, finished, [c.spec.id for c in plan.cases], signal.SIGINT, lambda: None)
    assert "1 of 3 cases finished and kept" in msg
    assert "holds 2 case files" in msg and "1 not in the manifest" in msg


# ----------------------------------------------------------------------------------------------
# generate in several threads at once
# ----------------------------------------------------------------------------------------------

def test_generate_in_threads_with_different_profiles_gives_the_serial_bytes(tmp_path):
    ids = ["sm90-fp8-1d1d-c", "sm100-fp8-nt-bf16", "ascend950-fp8-nt-bf16"]
    specs = {i: [s for s in golden.preset("smoke") if s["id"] == i] for i in ids}
    serial = {}
    for i in ids:
        golden.generate(specs[i], tmp_path / f"serial-{i}")
        serial[i] = _files(tmp_path / f"serial-{i}")
    arch = profiles.get_profile().name
    errors: list[BaseException] = []
    done = threading.Event()
    foreign: list[str] = []  # what a user's thread saw of the golden runs' profiles

    def run(i: str) -> None:
        try:
            for n in range(2):
                golden.generate(specs[i], tmp_path / f"thread-{i}-{n}")
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    def user() -> None:  # a user's own thread switching the process-wide profile meanwhile
        k = 0
        while not done.is_set():
            want = ("sm90", "ascend950")[k % 2]
            profiles.set_arch(want)
            time.sleep(0)  # let the other threads run
            if profiles.get_arch() != want:
                foreign.append(profiles.get_arch())
            k += 1

    threads = [threading.Thread(target=run, args=(i,)) for i in ids]
    switcher = threading.Thread(target=user)
    switcher.start()
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        done.set()
        switcher.join()
        profiles.set_arch(arch)
    assert not errors, errors
    for i in ids:
        for n in range(2):
            assert _files(tmp_path / f"thread-{i}-{n}") == serial[i], i
    assert not foreign  # the runs never changed what another thread sees


def test_set_arch_stays_process_wide_for_new_threads():
    before = profiles.get_profile().name
    try:
        profiles.set_arch("sm90")
        seen: list[str] = []
        t = threading.Thread(target=lambda: seen.append(profiles.get_profile().name))
        t.start()
        t.join()
        assert seen == ["sm90"]
    finally:
        profiles.set_arch(before)


# ----------------------------------------------------------------------------------------------
# the memory limit's default and the dry run
# ----------------------------------------------------------------------------------------------

def test_default_memory_limit_is_half_the_total_physical_memory(monkeypatch):
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    cg = sizes.cgroup_memory_limit()
    want = max(1 << 28, min(total, cg or total) // 2)
    assert sizes.default_memory_limit() == want
    # not the memory available at the moment: it does not move when that does
    monkeypatch.setattr(sizes, "available_memory", lambda: 1 << 30)
    assert sizes.default_memory_limit() == want
    # the limit lives in the base layer (deepgemm_ref._memory; toolkit.sizes re-exports it)
    from deepgemm_ref import _memory

    monkeypatch.setattr(_memory, "cgroup_memory_limit", lambda: 4 << 30)
    assert sizes.default_memory_limit() == min(want, 2 << 30)


def test_dry_run_shows_the_plan_and_marks_cases_over_the_limit(tmp_path, capsys):
    from deepgemm_ref.cli import main

    big = [dict(ONE[0], id="big", m=4096, n=4096, k=4096), ONE[0]]
    spec = tmp_path / "s.json"
    spec.write_text(json.dumps(big))
    with pytest.raises(ResourceError):
        golden.generate(big, tmp_path / "B", max_memory=64 << 20)
    plan = golden.generate(big, tmp_path / "B", max_memory=64 << 20, dry_run=True)
    assert [c["over_limit"] for c in plan["cases"]] == [True, False]
    assert main(["golden", "--spec", str(spec), "--out", str(tmp_path / "B"), "--max-memory", "64M",
                 "--jobs", "2", "--dry-run"]) == 0
    out = capsys.readouterr().out
    big_line = next(line for line in out.splitlines() if line.startswith("big "))
    assert "OVER the limit of 32.0 MiB" in big_line
    assert "1 case over the memory limit" in out
    assert not (tmp_path / "B").exists()
    # a target that a run would refuse: still the plan, with the reason
    golden.generate(big[1:], tmp_path / "B")
    assert main(["golden", "--spec", str(spec), "--out", str(tmp_path / "B"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "plan: 2 of 2 cases" in out and "note: a run would be refused" in out and "already holds a bundle" in out
