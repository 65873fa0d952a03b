"""The second round of hostile inputs (issue 29, group C): every file a command reads is a regular
file read with a bound (a FIFO, a device, a directory, a symlink loop, a huge sparse file, a
truncated file, invalid UTF-8, lone surrogates, deep nesting in its place: exit 2 and one line
naming the file, within seconds); numbers range-checked; sizes checked before allocation; any
string printed; a module's sys.exit() never an exit 0; bad plugin options a usage error; argument
errors that name the argument, the function called and the tensor."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import stat
import struct
import subprocess
import sys
import textwrap
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

import deepgemm_ref as dg
from deepgemm_ref import golden
from deepgemm_ref.cli import main
from deepgemm_ref.errors import DGArgumentError
from deepgemm_ref.golden.bundle import manifest_digest

pytest_plugins = ["pytester"]

SPECS = [{"id": "g", "kernel": "fp8_gemm_nt", "profile": "sm100", "m": 16, "n": 32, "k": 128}]


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A one-case bundle, its replayed outputs and its specification file."""
    root = tmp_path_factory.mktemp("hostile")
    spec = root / "spec.json"
    spec.write_text(json.dumps(SPECS))
    golden.generate(SPECS, root / "b")
    golden.replay(root / "b", root / "outs.safetensors")
    return root


class _Hung(BaseException):
    """Raised by the watchdog: the command did not return in time (main() re-raises BaseException)."""


@contextlib.contextmanager
def _watchdog(seconds: float):
    def fire(signum, frame):
        raise _Hung(f"no answer within {seconds} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _run(argv, capsys, seconds=8.0):
    """main(argv) in this process under a watchdog: (exit code, stdout, stderr, seconds taken)."""
    capsys.readouterr()
    t0 = time.monotonic()
    with _watchdog(seconds):
        rc = main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out, out.err, time.monotonic() - t0


# ----------------------------------------------------------------------------------------------
# special and oversized input files in place of every input of every command that reads
# ----------------------------------------------------------------------------------------------

KINDS = ("fifo", "device", "directory", "symlink-loop", "huge-sparse", "truncated", "invalid-utf8",
         "lone-surrogates", "deep-nesting")

# (command, the input replaced): "arg" is a file named on the command line, "manifest" / "case"
# a bundle's own file
SLOTS = (("golden-spec", "arg"), ("golden-resume", "manifest"), ("golden-resume", "case"),
         ("verify", "manifest"), ("verify", "case"), ("replay", "manifest"), ("replay", "case"),
         ("check-outputs", "arg"), ("check-thresholds", "arg"), ("check", "manifest"), ("check", "case"),
         ("diagnose-outputs", "arg"), ("probe", "arg"), ("export-outputs", "arg"), ("export", "manifest"))


def _place(kind: str, path: Path, original: bytes) -> None:
    """Put a special or oversized file of ``kind`` at ``path`` (nothing there yet)."""
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        try:
            os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 5))  # /dev/zero's numbers
        except OSError:  # not root: a symlink to /dev/zero (refused as a device or as a symlink)
            os.symlink("/dev/zero", path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "symlink-loop":
        os.symlink(path.name, path)
    elif kind == "huge-sparse":
        with open(path, "wb") as f:
            f.truncate(1 << 40)  # 1 TiB, no blocks
    elif kind == "truncated":
        path.write_bytes(original[: max(1, len(original) // 2)])
    elif kind == "invalid-utf8":
        path.write_bytes(b'{"cases": "\xff\xfe\xc3\x28"}')
    elif kind == "lone-surrogates":
        path.write_bytes(b'{"cases": [{"id": "\\ud800", "kernel": "\\udfff"}], "\\ud800": 1}')
    elif kind == "deep-nesting":
        path.write_bytes(b"[" * 200_000 + b"]" * 200_000)
    else:  # pragma: no cover
        raise AssertionError(kind)


def _argv(slot: str, small: Path, work: Path) -> tuple[list[str], Path]:
    """The command line of ``slot`` reading from a copy in ``work``, and the file to replace."""
    bundle = work / "b"
    shutil.copytree(small / "b", bundle)
    outs = work / "outs.safetensors"
    shutil.copy(small / "outs.safetensors", outs)
    spec = work / "spec.json"
    shutil.copy(small / "spec.json", spec)
    target = work / "input.json"
    case = next((bundle / "cases").iterdir())
    command, what = slot
    if what == "manifest":
        target = bundle / "manifest.json"
    elif what == "case":
        target = case
    argv = {
        "golden-spec": ["golden", "--spec", target, "--out", work / "new"],
        "golden-resume": ["golden", "--spec", spec, "--out", bundle, "--resume"],
        "verify": ["verify", bundle],
        "replay": ["replay", bundle, "--out", work / "o2.safetensors"],
        "check-outputs": ["check", bundle, "--outputs", target],
        "check-thresholds": ["check", bundle, "--outputs", outs, "--thresholds", target],
        "check": ["check", bundle, "--outputs", outs],
        "diagnose-outputs": ["diagnose", bundle, "--outputs", target],
        "probe": ["probe", "analyse", target],
        "export-outputs": ["export", bundle, "--format", "npy", "--out", work / "exp", "--outputs", target],
        "export": ["export", bundle, "--format", "npy", "--out", work / "exp"],
    }[command]
    return [str(a) for a in argv], target


def _one_input(slot, kind, small, work, capsys):
    argv, target = _argv(slot, small, work)
    original = target.read_bytes() if target.exists() else b"[]"
    if target.exists():
        target.unlink()
    _place(kind, target, original)
    rc, out, err, took = _run(argv, capsys)
    assert "Traceback" not in err and "internal error" not in err, (slot, kind, err)
    assert took < 8, (slot, kind, took)
    if rc == 2:  # refused: one line naming the file
        lines = [ln for ln in err.splitlines() if ln.startswith("deepgemm-ref")]
        assert len(lines) == 1, (slot, kind, err)
        assert target.name in lines[0], (slot, kind, err)
    elif rc == 0:  # golden --resume: a case file that does not verify is generated again
        assert slot == ("golden-resume", "case") and stat.S_ISREG(os.lstat(target).st_mode), (slot, kind, out, err)
    else:  # a clean verdict: a problem found and named (a truncated case file: its sha256 differs)
        assert rc == 1, (slot, kind, rc, out, err)
        assert target.name in out + err, (slot, kind, out, err)


@settings(max_examples=12, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(slot=hs.sampled_from(SLOTS), kind=hs.sampled_from(KINDS))
def test_special_input_files_are_refused_naming_the_file(small, tmp_path_factory, capsys, slot, kind):
    _one_input(slot, kind, small, tmp_path_factory.mktemp("w"), capsys)


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("slot", SLOTS, ids=lambda s: "-".join(s))
def test_every_special_input_file_in_every_slot(small, tmp_path, capsys, slot, kind):
    _one_input(slot, kind, small, tmp_path, capsys)


def test_a_fifo_manifest_and_dev_zero_spec_never_block(small, tmp_path, capsys):
    """The listed instances: a FIFO in place of manifest.json or a case file, /dev/zero and
    /dev/urandom as --spec (refused by kind, without reading them)."""
    for argv in (["golden", "--spec", "/dev/zero", "--out", tmp_path / "x"],
                 ["golden", "--spec", "/dev/urandom", "--out", tmp_path / "x"],
                 ["check", small / "b", "--outputs", small / "outs.safetensors", "--thresholds", "/dev/zero"]):
        rc, _, err, took = _run(argv, capsys, seconds=5)
        assert rc == 2 and "character device" in err and took < 5, err
    for which in ("manifest", "case"):
        work = tmp_path / which
        verify, target = _argv(("verify", which), small, work)
        target.unlink()
        os.mkfifo(target)
        for argv in (verify, ["replay", work / "b", "--out", work / "o.safetensors"],
                     ["check", work / "b", "--outputs", work / "outs.safetensors"],
                     ["golden", "--spec", work / "spec.json", "--out", work / "b", "--resume"]):
            rc, out, err, took = _run(argv, capsys, seconds=5)
            assert took < 5 and "Traceback" not in err, (argv, err)
            if rc == 0:  # golden --resume generates a case whose file does not verify again
                assert argv[0] == "golden" and which == "case" and stat.S_ISREG(os.lstat(target).st_mode)
                continue
            # refused (exit 2), or a problem found and listed (verify), the case failed (replay): exit 1
            assert rc in (1, 2) and "FIFO" in out + err and target.name in out + err, (argv, out, err)


# ----------------------------------------------------------------------------------------------
# numbers and sizes
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("option,value", [
    ("--u-acc", "2^5000"), ("--u-acc", "2**-5000"), ("--u-acc", "1e999"), ("--u-acc", "nan"), ("--u-acc", "2"),
    ("--lambda", "inf"), ("--lambda", "-1"), ("--lambda", "1e400"), ("--lambda", "0"), ("--n", "0"), ("--n", "9" * 30),
    ("--bias-threshold", "nan"), ("--bias-threshold", "5"), ("--max-memory", "1e400G"), ("--max-memory", "-1")])
@pytest.mark.parametrize("command", ["check", "diagnose"])
def test_number_options_are_range_checked(small, capsys, command, option, value):
    rc, _, err, _ = _run([command, small / "b", "--outputs", small / "outs.safetensors", option, value], capsys)
    assert rc == 2 and f"argument {option}" in err and "Traceback" not in err, err


@pytest.mark.parametrize("argv", [["golden", "--preset", "smoke", "--out", "x", "--jobs", "100000000"],
                                  ["golden", "--preset", "smoke", "--out", "x", "--jobs", "0"],
                                  ["golden", "--preset", "smoke", "--out", "x", "--ranks-per-case", "99999"],
                                  ["demo", "--m", "-1"], ["demo", "--n", "100000000000"], ["demo", "--seed", "-1"]])
def test_other_number_options_are_range_checked(capsys, argv):
    rc, _, err, _ = _run(argv, capsys)
    assert rc == 2 and f"argument {argv[-2]}" in err, err


def _safetensors(path: Path, header: dict, data: bytes = b"") -> None:
    body = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(body)) + body + data)


@pytest.mark.parametrize("shape", [[0, 2**62], [2**64, 0], [0] * 65, [0] * 33, [2**40, 2**40, 0]])
def test_zero_size_tensors_of_impossible_shapes_are_refused_before_allocation(small, tmp_path, capsys, shape):
    bad = tmp_path / "outs.safetensors"
    _safetensors(bad, {"g/d": {"dtype": "BF16", "shape": shape, "data_offsets": [0, 0]}})
    for argv in (["check", small / "b", "--outputs", bad], ["diagnose", small / "b", "--outputs", bad],
                 ["probe", "analyse", bad]):
        rc, _, err, _ = _run(argv, capsys)
        assert rc == 2 and "internal error" not in err and "'g/d'" in err and str(bad) in err, err
    # the same in a bundle's case file (verify reads it): refused naming the file and tensor
    from deepgemm_ref.golden import safetensors as st

    with pytest.raises(st.SafetensorsError, match=r"tensor 'g/d'"):
        st.load_file(bad)


# ----------------------------------------------------------------------------------------------
# any string printed
# ----------------------------------------------------------------------------------------------

SURROGATE = "\ud800"


def _surrogate_bundle(small: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the bundle whose manifest lists an incomplete case with a lone surrogate in its
    id, and outputs holding an output name with one (valid JSON both)."""
    root = tmp_path / "b"
    shutil.copytree(small / "b", root)
    m = json.loads((root / "manifest.json").read_text())
    m["incomplete"] = [f"x{SURROGATE}y"]
    m["manifest_sha256"] = manifest_digest(m)
    (root / "manifest.json").write_text(json.dumps(m))  # ensure_ascii: the surrogate as \ud800
    from deepgemm_ref.golden import safetensors as st

    outs = st.load_file(small / "outs.safetensors")
    header = {}
    data = b""
    for name, arr in outs.items():
        raw = np.ascontiguousarray(arr).view(np.uint8).tobytes()
        header[name] = {"dtype": "BF16", "shape": list(arr.shape), "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    raw = np.zeros(2, np.float32).tobytes()
    header[f"{SURROGATE}/o"] = {"dtype": "F32", "shape": [2], "data_offsets": [len(data), len(data) + len(raw)]}
    data += raw
    o = tmp_path / "outs.safetensors"
    _safetensors(o, header, data)
    return root, o


def test_lone_surrogates_are_printed_escaped_in_every_report(small, tmp_path, capsys):
    root, outs = _surrogate_bundle(small, tmp_path)
    junit, html = tmp_path / "r.xml", tmp_path / "r.html"
    rc, out, err, _ = _run(["check", root, "--outputs", outs, "--junit", junit, "--html", html], capsys)
    assert rc == 1 and "internal error" not in err, err
    assert "x\\ud800y" in out and "\\ud800/o" in out
    names = {tc.get("name") for tc in ET.parse(junit).getroot().iter("testcase")}
    assert "x\\ud800y" in names and "\\ud800/o" in names
    assert "x\\ud800y" in html.read_text(encoding="utf-8")
    rc, out, err, _ = _run(["check", root, "--outputs", outs, "--json"], capsys)
    assert rc == 1 and {r["id"] for r in json.loads(out)} >= {f"x{SURROGATE}y", f"{SURROGATE}/o"}
    rc, out, err, _ = _run(["diagnose", root, "--outputs", outs], capsys)
    assert rc == 1 and "internal error" not in err and "x\\ud800y" in out, (out, err)
    # an error message naming such a case
    rc, out, err, _ = _run(["check", root, "--outputs", outs, "--case", f"z{SURROGATE}"], capsys)
    assert rc == 2 and "z\\ud800" in err, err


def test_lone_surrogates_in_the_plugins_items_and_junit_xml(small, tmp_path, pytester):
    root, _ = _surrogate_bundle(small, tmp_path)
    xml = tmp_path / "j.xml"
    result = pytester.runpytest("--dg-bundle", str(root), f"--junitxml={xml}")
    assert result.ret == 1  # the incomplete case fails; nothing errors
    result.assert_outcomes(passed=1, failed=1)
    names = {tc.get("name") for tc in ET.parse(xml).getroot().iter("testcase")}
    assert "x\\ud800y" in names


# ----------------------------------------------------------------------------------------------
# a module's sys.exit() and bad plugin options
# ----------------------------------------------------------------------------------------------

def test_a_module_calling_sys_exit_fails_the_replay(small, tmp_path, capsys, monkeypatch):
    (tmp_path / "exits_in_kernel.py").write_text(textwrap.dedent('''
        import sys
        from deepgemm_ref import *  # noqa: F401,F403

        def fp8_gemm_nt(*args, **kwargs):
            sys.exit(0)
    '''))
    (tmp_path / "exits_on_import.py").write_text("import sys\nsys.exit(0)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "o.safetensors"
    rc, stdout, err, _ = _run(["replay", small / "b", "--module", "exits_in_kernel", "--no-torch", "--out", out],
                              capsys)
    assert rc == 1 and out.is_file() and "sys.exit(0)" in err, (stdout, err)
    from deepgemm_ref.golden.replay import read_replay_record

    assert "sys.exit(0)" in read_replay_record(out)[0]["g"]
    out2 = tmp_path / "o2.safetensors"
    rc, stdout, err, _ = _run(["replay", small / "b", "--module", "exits_on_import", "--no-torch", "--out", out2],
                              capsys)
    assert rc == 2 and "sys.exit(0)" in err and not out2.exists(), err


@pytest.mark.parametrize("args,env", [(["--dg-u-acc", "abc"], {}), (["--dg-u-acc", "2^5000"], {}),
                                      (["--dg-lambda", "nan"], {}), (["--dg-bias-threshold", "3"], {}),
                                      (["--dg-accumulation", "bogus"], {}), ([], {"DG_BACKEND": "garbage"}),
                                      ([], {"DG_RANKS": "x"}), ([], {"DG_ARCH": "sm999"}),
                                      ([], {"DG_MODULE": "1bad"}), ([], {"DG_DEVICE": "cpu;rm"})])
def test_bad_plugin_options_are_a_usage_error(pytester, monkeypatch, args, env):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    pytester.makepyfile("def test_it():\n    pass\n")
    result = pytester.runpytest("-q", *args)  # -q: no report header (where the backend was checked before)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.outlines + result.errlines
    name = args[0] if args else next(iter(env))
    assert any(name in line for line in result.errlines), result.errlines


# ----------------------------------------------------------------------------------------------
# argument errors
# ----------------------------------------------------------------------------------------------

F8 = ml_dtypes.float8_e4m3fn


def _fp8(m=16, n=32, k=128):
    return np.zeros((m, k), F8), np.zeros((n, k), F8), np.zeros((m, n), ml_dtypes.bfloat16)


@pytest.mark.parametrize("bad", ["sfa", "sfb"])
def test_a_bad_float64_scale_names_its_own_argument(bad):
    a, b, d = _fp8()
    sfa, sfb = np.ones((16, 1), np.float32), np.ones((1, 1), np.float32)
    if bad == "sfa":
        sfa = sfa.astype(np.float64)
    else:
        sfb = sfb.astype(np.float64)
    with dg.numerics(arch="sm90"), pytest.raises(DGArgumentError) as e:
        dg.fp8_gemm_nt((a, sfa), (b, sfb), d)
    assert str(e.value).startswith(f"fp8_gemm_nt: {bad}"), str(e.value)


def test_an_aliases_errors_name_the_function_called():
    a, b, d = _fp8()
    for f, name in ((dg.fp8_gemm_nt, "fp8_gemm_nt"), (dg.fp8_fp4_gemm_nt, "fp8_fp4_gemm_nt"),
                    (dg.fp8_gemm_nn, "fp8_gemm_nn")):
        with pytest.raises(DGArgumentError) as e:
            f((a, np.ones((16, 1), np.float64)), (b, np.ones((1, 1), np.float32)), d)
        assert str(e.value).startswith(f"{name}:"), str(e.value)


def test_unaligned_m_indices_names_the_offending_row():
    with dg.numerics(arch="sm100"):
        align = dg.get_mk_alignment_for_contiguous_layout()
        m, k, n = 2 * align, 128, 32
        gl = np.zeros(m, np.int32)
        gl[align:] = 1
        gl[align + 37] = 0  # row align + 37 of group 0 inside group 1's block
        a = np.zeros((m, k), np.float32).astype(ml_dtypes.bfloat16)
        b = np.zeros((2, n, k), np.float32).astype(ml_dtypes.bfloat16)
        d = np.zeros((m, n), ml_dtypes.bfloat16)
        with pytest.raises(DGArgumentError) as e:
            dg.m_grouped_bf16_gemm_nt_contiguous(a, b, d, gl)
    assert f"grouped_layout[{align + 37}] = 0" in str(e.value), str(e.value)


@pytest.mark.torch
def test_torch_argument_errors_say_tensor_and_refuse_sparse():
    torch = pytest.importorskip("torch")
    a = torch.zeros(16, 128, dtype=torch.bfloat16)
    b = torch.zeros(32, 128, dtype=torch.bfloat16)
    d = torch.zeros(16, 32, dtype=torch.bfloat16)
    with pytest.raises(DGArgumentError, match=r"bf16_gemm_nt: a: expected a dense \(strided\) tensor"):
        dg.bf16_gemm_nt(a.to_sparse(), b, d)
    with pytest.raises(DGArgumentError, match=r"bf16_gemm_nt: d: expected a dense \(strided\) tensor"):
        dg.bf16_gemm_nt(a, b, d.to_sparse())
    with pytest.raises(DGArgumentError) as e:
        dg.bf16_gemm_nt(a.float(), b, d)
    assert "got tensor of dtype" in str(e.value) and "array" not in str(e.value), str(e.value)


# ----------------------------------------------------------------------------------------------
# the real console script: its own stdout encoding, no watchdog of ours
# ----------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_console_script_on_special_files_and_surrogates(small, tmp_path):
    root, outs = _surrogate_bundle(small, tmp_path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    for argv, want in ((["check", root, "--outputs", outs], 1), (["golden", "--spec", fifo, "--out", tmp_path / "x"], 2),
                       (["golden", "--spec", "/dev/zero", "--out", tmp_path / "x"], 2),
                       (["check", root, "--outputs", outs, "--u-acc", "2^5000"], 2)):
        p = subprocess.run([sys.executable, "-m", "deepgemm_ref.cli", *map(str, argv)], capture_output=True,
                           timeout=60, env=env)
        assert p.returncode == want and b"Traceback" not in p.stderr, (argv, p.stderr)
