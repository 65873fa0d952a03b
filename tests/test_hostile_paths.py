"""Every path the CLI writes (issue 29, group B): checked before any work (a regular file or
nothing, never a device / FIFO / socket / directory / symlink, never one of the run's inputs,
never inside another bundle), written atomically with a temporary name within the file-name
limit, with the umask's mode, and a write error names the file.

The hypothesis test draws (command, path kind) pairs: derandomized with a few examples in the
default run, every pair under ``-m slow``.  The CLI is called in-process (``main``) to keep the
default run short."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import socket
import stat
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from deepgemm_ref import golden
from deepgemm_ref.cli import main
from deepgemm_ref.golden import paths

CASE = {"id": "g", "kernel": "fp8_gemm_nt", "profile": "sm100", "m": 16, "n": 32, "k": 128}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A one-case bundle B, its replayed outputs O and the spec file S (the inputs)."""
    top = tmp_path_factory.mktemp("paths")
    spec = top / "spec.json"
    spec.write_text(json.dumps([CASE]))
    bundle = top / "B"
    golden.generate([CASE], bundle)
    outs = top / "O.safetensors"
    golden.replay(bundle, outs)
    return bundle, outs, spec


def _digest(root: Path) -> dict[str, str]:
    """sha256 and type of every entry under root (the inputs must stay as they were)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            if stat.S_ISREG(st.st_mode):
                with open(p, "rb") as f:
                    out[p] = hashlib.sha256(f.read()).hexdigest()
            else:
                out[p] = stat.filemode(st.st_mode)[0]
    return out


def _inputs_state(bundle: Path, outs: Path, spec: Path) -> dict[str, str]:
    state = _digest(bundle)
    for f in (outs, spec):
        state[str(f)] = hashlib.sha256(f.read_bytes()).hexdigest()
    return state


def _temporaries(*dirs: Path) -> list[str]:
    found = []
    for d in dirs:
        if d.is_dir():
            found += [n for n in os.listdir(d) if n.startswith(".") and (n.endswith(".tmp") or ".new-" in n
                                                                         or ".export-" in n or ".old-" in n)]
    return found


def _one_line(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.strip()]


# (name, argv builder, expects a directory)
def _commands(bundle: Path, outs: Path, spec: Path) -> dict[str, tuple[list[str], bool]]:
    b, o = str(bundle), str(outs)
    return {
        "replay --out": (["replay", b, "--force", "--out"], False),
        "check --junit": (["check", b, "--outputs", o, "--quiet", "--junit"], False),
        "check --html": (["check", b, "--outputs", o, "--quiet", "--html"], False),
        "check --compare-table": (["check", b, "--outputs", o, "--quiet", "--compare-table"], False),
        "export --out": (["export", b, "--format", "npy", "--force", "--out"], True),
        "golden --out": (["golden", "--spec", str(spec), "--force", "--out"], True),
    }


KINDS = ["new", "existing", "device", "fifo", "socket", "link-file", "link-dir", "dangling", "input-outputs",
         "input-manifest", "input-spec", "directory", "inside-bundle", "long"]


def _make(kind: str, work: Path, bundle: Path, outs: Path, spec: Path) -> tuple[Path, str | None]:
    """A path of ``kind`` under ``work``; the file type it must keep when refused (or None)."""
    p = work / "target"
    if kind == "existing":
        p.write_text("old")
    elif kind == "device":
        try:
            os.mknod(p, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        except (PermissionError, OSError, AttributeError):
            pytest.skip("cannot create a device node here")
        return p, "c"
    elif kind == "fifo":
        os.mkfifo(p)
        return p, "p"
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        try:
            s.bind(str(p))
        except OSError:  # a path too long for AF_UNIX
            s.close()
            pytest.skip("cannot bind a socket here")
        s.close()
        return p, "s"
    elif kind == "link-file":
        (work / "real").write_text("real")
        p.symlink_to(work / "real")
        return p, "l"
    elif kind == "link-dir":
        (work / "realdir").mkdir()
        p.symlink_to(work / "realdir")
        return p, "l"
    elif kind == "dangling":
        p.symlink_to(work / "nowhere")
        return p, "l"
    elif kind == "input-outputs":
        return outs, None
    elif kind == "input-manifest":
        return bundle / "manifest.json", None
    elif kind == "input-spec":
        return spec, None
    elif kind == "directory":
        p.mkdir()
        (p / "keep.txt").write_text("mine")
        return p, "d"
    elif kind == "inside-bundle":
        return bundle / "cases" / "inside", None
    elif kind == "long":
        p = work / ("x" * 250)
    return p, None


def _expect_ok(command: str, kind: str, is_dir: bool) -> bool | None:
    """True: exit 0 with the output written; False: exit 2; None: either (a followed symlink)."""
    if kind in ("new", "long"):
        return True
    if kind == "existing":
        return not is_dir
    if is_dir and (kind == "directory" or (kind == "link-dir" and command == "golden --out")):
        return None  # golden follows a symlinked bundle; an existing directory: its own rules
    return False


def _try(run, command: str, kind: str, capsys) -> None:
    bundle, outs, spec = run
    argv, is_dir = _commands(bundle, outs, spec)[command]
    work = Path(tempfile.mkdtemp(prefix="hp-"))
    try:
        target, keep = _make(kind, work, bundle, outs, spec)
        before = _inputs_state(bundle, outs, spec)
        capsys.readouterr()
        code = main(argv + [str(target)])
        err = capsys.readouterr().err
        expected = _expect_ok(command, kind, is_dir)
        if expected is True or (expected is None and code == 0):
            assert code == 0, (command, kind, err)
            if is_dir:
                assert os.path.isdir(target) and os.listdir(target), (command, kind)
                if kind == "directory":  # the user's file is kept
                    assert (target / "keep.txt").read_text() == "mine"
            else:
                assert stat.S_ISREG(os.lstat(target).st_mode) and os.path.getsize(target) > 0, (command, kind)
        else:
            assert code == 2, (command, kind, code, err)
            lines = _one_line(err)
            assert len(lines) == 1 and "Traceback" not in err and "internal error" not in err, (command, kind, err)
            flag = command.split()[1]
            assert flag in lines[0] and str(target) in lines[0], (command, kind, err)
            if keep is not None:
                assert stat.filemode(os.lstat(target).st_mode)[0] == keep, (command, kind)
            if kind == "existing":
                assert target.read_text() == "old"
            if kind == "directory":
                assert sorted(os.listdir(target)) == ["keep.txt"]
        assert _inputs_state(bundle, outs, spec) == before, (command, kind)
        assert not _temporaries(work, bundle, bundle / "cases", outs.parent), (command, kind)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        leftover = bundle / "cases" / "inside"
        if leftover.exists():  # a failed expectation must not spoil the next example
            shutil.rmtree(leftover, ignore_errors=True)


# an input kind only where that file is an input of the command (replay may replace a file that is
# merely some other run's outputs, given --force)
_NOT_INPUTS = {("replay --out", "input-outputs"), ("replay --out", "input-spec"), ("check --junit", "input-spec"),
               ("check --html", "input-spec"), ("check --compare-table", "input-spec")}
_PAIRS = [(c, k) for c in ("replay --out", "check --junit", "check --html", "check --compare-table",
                           "export --out", "golden --out") for k in KINDS if (c, k) not in _NOT_INPUTS]


@settings(max_examples=20, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(pair=hs.sampled_from(_PAIRS))
def test_every_output_path_kind_is_written_or_refused(run, capsys, pair):
    _try(run, *pair, capsys)


@pytest.mark.slow
@pytest.mark.parametrize(("command", "kind"), _PAIRS)
def test_every_output_path_kind_every_command(run, capsys, command, kind):
    _try(run, command, kind, capsys)


# ---------------------------------------------------------------------------------------------
# the listed items
# ---------------------------------------------------------------------------------------------

def test_special_files_are_never_replaced(run, tmp_path, capsys):
    """check --junit / --html and replay --out --force on a FIFO or /dev/null: exit 2, the special
    file still what it was (before the fix both were replaced by a regular file)."""
    bundle, outs, _ = run
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for argv in (["check", str(bundle), "--outputs", str(outs), "--junit", str(fifo)],
                 ["check", str(bundle), "--outputs", str(outs), "--html", str(fifo)],
                 ["replay", str(bundle), "--out", str(fifo), "--force"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "FIFO" in err and str(fifo) in err and len(_one_line(err)) == 1, err
        assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_dev_null_is_never_replaced(run, capsys):
    """``check --junit /dev/null`` (run as root it used to replace the system's /dev/null)."""
    bundle, outs, _ = run
    if not stat.S_ISCHR(os.lstat("/dev/null").st_mode):
        pytest.skip("no character device /dev/null")
    for flag in ("--junit", "--html", "--compare-table"):
        assert main(["check", str(bundle), "--outputs", str(outs), flag, "/dev/null"]) == 2
        err = capsys.readouterr().err
        assert f"{flag} /dev/null: is a character device" in err and len(_one_line(err)) == 1, err
        assert stat.S_ISCHR(os.lstat("/dev/null").st_mode)
    assert main(["replay", str(bundle), "--out", "/dev/null", "--force"]) == 2
    assert stat.S_ISCHR(os.lstat("/dev/null").st_mode)


def test_an_output_that_is_an_input_is_refused_naming_both(run, tmp_path, capsys):
    bundle, outs, _ = run
    copy = tmp_path / "O.safetensors"
    shutil.copyfile(outs, copy)
    before = copy.read_bytes()
    assert main(["check", str(bundle), "--outputs", str(copy), "--junit", str(copy)]) == 2
    err = capsys.readouterr().err
    assert f"--junit {copy}" in err and f"--outputs {copy}" in err, err
    assert copy.read_bytes() == before
    manifest = bundle / "manifest.json"
    before = manifest.read_bytes()
    assert main(["check", str(bundle), "--outputs", str(outs), "--html", str(manifest)]) == 2
    err = capsys.readouterr().err
    assert f"--html {manifest}" in err and str(bundle) in err, err
    assert manifest.read_bytes() == before
    # two outputs of one run naming one file
    assert main(["check", str(bundle), "--outputs", str(outs), "--junit", str(tmp_path / "r"),
                 "--html", str(tmp_path / "r")]) == 2
    assert "the same file" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_long_output_names_work(run, tmp_path, capsys):
    """A 252-byte --out and a 245-byte --junit (the temporary names used to exceed NAME_MAX)."""
    bundle, outs, _ = run
    out = tmp_path / ("o" * 252)
    assert main(["replay", str(bundle), "--out", str(out)]) == 0, capsys.readouterr().err
    assert out.is_file()
    junit = tmp_path / ("j" * 245)
    assert main(["check", str(bundle), "--outputs", str(outs), "--quiet", "--junit", str(junit)]) == 0
    assert junit.is_file()
    assert sorted(os.listdir(tmp_path)) == sorted([out.name, junit.name])  # no temporary left
    name = paths.temp_name("é" * 200, 255)
    assert len(os.fsencode(name)) <= 255 and name.startswith(".") and name.endswith(".tmp")
    name.encode("utf-8")  # a cut multi-byte character is dropped whole


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_files_get_the_umask_mode(tmp_path, capsys, mask):
    """manifest.json, case files, the outputs file and the JUnit / HTML / CSV reports: 0o666 less
    the umask (before the fix manifest.json and the reports were 0600 whatever the umask)."""
    old = os.umask(mask)
    try:
        bundle = tmp_path / "B"
        golden.generate([CASE], bundle)
        outs = tmp_path / "O.safetensors"
        assert main(["replay", str(bundle), "--out", str(outs)]) == 0
        reports = [tmp_path / "r.xml", tmp_path / "r.html", tmp_path / "r.csv"]
        assert main(["check", str(bundle), "--outputs", str(outs), "--quiet", "--junit", str(reports[0]),
                     "--html", str(reports[1]), "--compare-table", str(reports[2])]) == 0
    finally:
        os.umask(old)
    want = 0o666 & ~mask
    for f in [bundle / "manifest.json", *sorted((bundle / "cases").iterdir()), outs, *reports]:
        assert stat.S_IMODE(os.stat(f).st_mode) == want, (f, oct(os.stat(f).st_mode))


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EFBIG])
def test_a_write_error_names_the_file(run, tmp_path, capsys, monkeypatch, code):
    """A full disk names the file it was writing (before: ``error: File too large``, no path)."""
    bundle, outs, _ = run

    def full(fd):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "fsync", full)
    junit = tmp_path / "r.xml"
    assert main(["check", str(bundle), "--outputs", str(outs), "--quiet", "--junit", str(junit)]) == 2
    err = capsys.readouterr().err
    assert f"error: {junit}: {os.strerror(code)}" in err, err
    out = tmp_path / "o.safetensors"
    assert main(["replay", str(bundle), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"error: {out}: {os.strerror(code)}" in err, err
    assert sorted(os.listdir(tmp_path)) == []  # neither the target nor a temporary file


def test_output_directories_in_another_bundle_are_refused(run, tmp_path, capsys):
    bundle, outs, spec = run
    for argv in (["golden", "--spec", str(spec), "--out", str(bundle / "cases" / "x")],
                 ["export", str(bundle), "--format", "npy", "--out", str(bundle / "sub")]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "--out" in err and str(bundle) in err and len(_one_line(err)) == 1, err
    assert not (bundle / "cases" / "x").exists() and not (bundle / "sub").exists()
    # a report beside, not in, the bundle is fine; one inside another bundle is not
    other = tmp_path / "B2"
    shutil.copytree(bundle, other)
    assert main(["check", str(bundle), "--outputs", str(outs), "--quiet", "--junit", str(other / "r.xml")]) == 2
    assert "lies inside the bundle" in capsys.readouterr().err


def test_export_write_error_names_the_file_under_out(run, tmp_path, capsys, monkeypatch):
    """A full disk during ``export`` names the file as it would be under --out (not the private
    temporary tree's name), and nothing is left behind."""
    bundle, _, _ = run
    real_open = open

    def full_open(path, mode="r", *args, **kwargs):
        if "x" in str(mode) and str(path).endswith(".npy"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr("builtins.open", full_open)
    out = tmp_path / "e"
    assert main(["export", str(bundle), "--format", "npy", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"error: {out}{os.sep}" in err and "No space left on device" in err and ".export-" not in err, err
    assert os.listdir(tmp_path) == []


def test_plot_directory_is_checked_first(run, tmp_path, capsys):
    """``check --plot DIR``: a file, FIFO, input or a directory inside a bundle is refused before
    any work (matplotlib is not needed for the refusal)."""
    bundle, outs, _ = run
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    afile = tmp_path / "file"
    afile.write_text("x")
    for target, words in ((fifo, "FIFO"), (afile, "not a directory"), (bundle / "plots", str(bundle)),
                          (bundle, "overlaps the input")):
        assert main(["check", str(bundle), "--outputs", str(outs), "--plot", str(target)]) == 2
        err = capsys.readouterr().err
        assert f"--plot {target}" in err and words in err and len(_one_line(err)) == 1, err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and afile.read_text() == "x"
    assert not (bundle / "plots").exists()


def test_library_writers_never_replace_special_files(run, tmp_path):
    """The same rules under the Python API: ``golden.replay`` checks its output path first, and
    every atomic writer (safetensors.save_file, the reports) refuses to replace a non-regular file."""
    from deepgemm_ref.golden import safetensors as st
    from deepgemm_ref.golden.junit import write_junit

    bundle, _, _ = run
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="FIFO"):
        golden.replay(bundle, fifo, force=True)
    with pytest.raises(ValueError, match="overlaps the input"):
        golden.replay(bundle, bundle / "o.safetensors")
    with pytest.raises(ValueError, match="FIFO"):
        st.save_file({"x": np.zeros(2, np.float32)}, fifo, overwrite=True)
    with pytest.raises(ValueError, match="FIFO"):
        write_junit(fifo, [])
    link = tmp_path / "link"
    (tmp_path / "real").write_text("real")
    link.symlink_to(tmp_path / "real")
    with pytest.raises(ValueError, match="symlink"):
        paths.atomic_write_text(link, "x")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and os.path.islink(link)
    assert (tmp_path / "real").read_text() == "real"
    assert not (bundle / "o.safetensors").exists()
