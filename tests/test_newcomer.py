"""What a newcomer hit (issue 29, group D): the simplest specification of every kernel is valid,
every problem of a case is reported at once, replay finds a module in the current directory and
names the profile a case was generated for, the text of the reports."""

from __future__ import annotations

import json

import pytest

from deepgemm_ref.cli import main
from deepgemm_ref.golden.cases import FAMILIES, build_case, validate_spec
from deepgemm_ref.golden.schema import SpecError


def _minimal_specs() -> list[dict]:
    """Every (kernel, profile) pair a schema provides, as its simplest specification: the kernel,
    the profile and small shapes (the family only where it is chosen explicitly)."""
    out = []
    for fam in FAMILIES.values():
        assert fam.schema is not None
        for kernel, profiles in fam.schema.kernels.items():
            for profile in profiles:
                d = {"id": f"{fam.name}-{kernel}-{profile}", "kernel": kernel, "profile": profile}
                if fam.explicit:
                    d["family"] = fam.name
                out.append(d)
    return out


def test_the_simplest_case_of_every_kernel_under_every_profile_is_valid_and_builds():
    specs = _minimal_specs()
    assert len(specs) > 50
    for d in specs:
        spec = validate_spec(d)  # raises SpecError naming the keys if the defaults do not fit
        built = build_case(spec)
        assert built.inputs and built.outputs, d


def test_the_first_sm90_fp8_case_a_hopper_user_writes_is_valid():
    spec = validate_spec({"id": "h", "kernel": "fp8_gemm_nt", "profile": "sm90", "m": 256, "n": 384, "k": 1024})
    r = spec.resolved
    # sm90's two FP8 recipes (DeepGEMM's sm90 kernels): 1D2D writes bf16 without C, 1D1D writes f32 with C.
    assert (r["gran_n"], r["out"], r["c"]) == (128, "bf16", "none")
    one_d = validate_spec({"id": "h", "kernel": "fp8_gemm_nt", "profile": "sm90", "gran_n": 1}).resolved
    assert (one_d["gran_n"], one_d["out"], one_d["c"]) == (1, "f32", "is_d")
    f32 = validate_spec({"id": "h", "kernel": "fp8_gemm_nt", "profile": "sm90", "out": "f32"}).resolved
    assert (f32["gran_n"], f32["c"]) == (1, "is_d")
    sep = validate_spec({"id": "h", "kernel": "fp8_gemm_nt", "profile": "sm90", "c": "separate"}).resolved
    assert (sep["gran_n"], sep["out"]) == (1, "f32")
    # other profiles keep their defaults
    sm100 = validate_spec({"id": "h", "kernel": "fp8_gemm_nt", "profile": "sm100"}).resolved
    assert (sm100["gran_n"], sm100["out"], sm100["c"]) == (1, "bf16", "none")


def test_every_problem_of_a_case_is_reported_at_once():
    with pytest.raises(SpecError) as exc:
        validate_spec({"id": "x", "kernel": "fp8_gemm_nt", "profile": "sm100", "m": -4, "seed": "abc",
                       "gran_n": 7, "bogus": 1}, "s.json")
    lines = str(exc.value).splitlines()
    assert exc.value.problems == lines  # type: ignore[attr-defined]
    for key in ("'m'", "'seed'", "'gran_n'", "'bogus'"):
        assert sum(key in line for line in lines) == 1, (key, lines)
    assert all(line.startswith("s.json: case 'x': ") for line in lines)
    # without a usable kernel the common keys are still all checked
    with pytest.raises(SpecError) as exc:
        validate_spec({"kernel": 3, "seed": -1, "values": "nrmal"}, "s.json", 2)
    text = str(exc.value)
    for words in ("missing key 'id'", "key 'kernel'", "missing key 'profile'", "key 'seed'", "'normal'"):
        assert words in text, (words, text)


def test_the_cli_lists_every_problem_naming_file_case_and_key(tmp_path, capsys):
    path = tmp_path / "spec.json"
    path.write_text(json.dumps([{"id": "a", "kernel": "fp8_gemm_nt", "profile": "sm100", "m": -4, "seed": "abc"}]))
    assert main(["golden", "--spec", str(path), "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert f"{path}: case 'a': key 'm'" in err and f"{path}: case 'a': key 'seed'" in err, err
    assert not (tmp_path / "b").exists()


def _sm90_bundle(tmp_path) -> str:
    spec = tmp_path / "s.json"
    spec.write_text(json.dumps([{"id": "h", "kernel": "fp8_gemm_nt", "profile": "sm90", "m": 64, "n": 128,
                                 "k": 128}]))
    assert main(["golden", "--spec", str(spec), "--out", str(tmp_path / "b")]) == 0
    return str(tmp_path / "b")


def test_replay_imports_a_module_from_the_current_directory_and_names_both_profiles(tmp_path, monkeypatch, capsys):
    import sys

    from deepgemm_ref.golden.replay import read_replay_record

    spec = tmp_path / "s.json"
    spec.write_text(json.dumps([{"id": "h", "kernel": "fp8_gemm_nt", "profile": "sm90", "m": 64, "n": 128, "k": 128},
                                {"id": "bf", "kernel": "bf16_gemm_nt", "profile": "sm90", "m": 64, "n": 64, "k": 64}]))
    assert main(["golden", "--spec", str(spec), "--out", str(tmp_path / "b")]) == 0
    bundle = str(tmp_path / "b")
    name = "dg_newcomer_mymod"
    # A user's wrapper of the emulator, running its default profile (sm100), as a device library would.
    (tmp_path / f"{name}.py").write_text("from deepgemm_ref import *  # noqa\nfrom deepgemm_ref import get_arch  # noqa\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, name, raising=False)
    path_before = list(sys.path)
    try:
        code = main(["replay", bundle, "--module", name, "--no-torch", "--out", str(tmp_path / "o.safetensors")])
    finally:
        sys.modules.pop(name, None)
    err = capsys.readouterr().err
    assert sys.path == path_before  # the current directory is on sys.path for the import only
    assert "cannot import" not in err, err
    assert code == 1
    errors, _ = read_replay_record(str(tmp_path / "o.safetensors"))
    assert "this case is sm90; the module reports sm100" in errors["h"], errors
    assert "this case is sm90; the module reports sm100" in err
    # a case that runs nonetheless gets a note: its outputs may differ for that reason alone
    assert "replay: note: case 'bf': this case is sm90; the module reports sm100" in err, err


def test_module_profile_asks_the_module_then_the_device():
    import types

    from deepgemm_ref.golden.replay import module_profile

    assert module_profile(types.SimpleNamespace(get_arch=lambda: "sm90")) == "sm90"
    assert module_profile(types.SimpleNamespace(get_arch_major=lambda: 10)) == "sm100"
    assert module_profile(types.SimpleNamespace(get_arch_major=lambda: 9)) == "sm90"
    assert module_profile(types.SimpleNamespace(), "npu:0") == "ascend950"
    assert module_profile(types.SimpleNamespace()) is None

    def broken() -> str:
        raise RuntimeError("no device")

    assert module_profile(types.SimpleNamespace(get_arch=broken)) is None


def test_counts_of_one_take_the_singular(tmp_path, capsys):
    import re

    from deepgemm_ref.golden.text import count, failing, plural

    assert (count(1, "case"), count(0, "case"), count(2, "case"), count(12345, "element")) == \
        ("1 case", "0 cases", "2 cases", "12345 elements")
    assert failing(1, 1) == "1 of 1 checked element fails" and failing(2, 64) == "2 of 64 checked elements fail"
    assert plural(1, "was") == "was" and plural(3, "was") == "were"
    bundle = _sm90_bundle(tmp_path)
    out = tmp_path / "o.safetensors"
    assert main(["replay", bundle, "--out", str(out)]) == 0
    assert main(["check", bundle, "--outputs", str(out)]) == 0
    assert main(["verify", bundle]) == 0
    text = capsys.readouterr()
    both = text.out + text.err
    assert "wrote 1 case to" in both and "wrote 1 output to" in both and "1 output: 1 pass" in both, both
    assert "1 case: OK" in both and "1/1 case (" in both, both
    assert not re.search(r"\b1 (cases|outputs|elements|files)\b", both), both


# Internal design-document references ("spec 9.2", "(spec section 13)", "port 1.10", "trap 17",
# "numerics.md section 5", "decision D1") that a user of the package cannot follow.
_INTERNAL_REF = r"\b(?:spec|port|trap)(?: section)? [0-9]|numerics\.md(?:``)?(?: section)? [0-9]|decision D[0-9]|spec trap"


def test_no_internal_references_a_user_cannot_follow():
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    pattern = re.compile(_INTERNAL_REF)
    found = []
    files = [*sorted((root / "deepgemm_ref").rglob("*.py")), *sorted((root / "docs").glob("*.md")), root / "README.md"]
    for path in files:
        for no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if pattern.search(line):
                found.append(f"{path.relative_to(root)}:{no}: {line.strip()}")
    assert not found, "\n".join(found[:20])
    # (``info`` prints deepgemm_ref.names' texts, scanned above; running it imports torch, seconds)


@pytest.mark.parametrize("argv", [
    ["golden", "--preset", "smoke", "--out", "B"],
    ["replay", "B", "--out", "O"],
    ["check", "B", "--outputs", "O"],
    ["diagnose", "B", "--outputs", "O"],
    ["export", "B", "--format", "npy", "--out", "D"],
])
def test_case_takes_several_ids_and_repeats_on_every_command(argv):
    from deepgemm_ref.cli import build_parser

    parser = build_parser()
    assert parser.parse_args([*argv, "--case", "a", "b"]).case == ["a", "b"]
    assert parser.parse_args([*argv, "--case", "a", "--case", "b"]).case == ["a", "b"]
    assert parser.parse_args([*argv, "--case", "a", "b", "--case", "c"]).case == ["a", "b", "c"]


def test_list_verbose_wraps_to_100_columns_and_json_has_the_full_text(capsys):
    import re

    assert main(["list", "-v"]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert len(lines) > 100 and max(len(line) for line in lines) <= 100, max(lines, key=len)
    assert main(["list", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    flat = re.sub(r"\s+", " ", text)  # the wrapped text, its line breaks undone
    for fam, info in data["families"].items():
        for d in info["keys"]:
            extra = f"; {d['only']}" if d["only"] else ""
            full = f"{d['name']}: {d['type']}; default {d['default']}; read by {d['read_by']}{extra}"
            assert re.sub(r"\s+", " ", full) in flat, (fam, full)  # nothing lost by the wrapping
    first = data["presets"]["smoke"][0]
    assert {"id", "kernel", "profile", "shape", "spec"} <= set(first)
    # the estimates list -v prints, from the same data
    from deepgemm_ref.golden.resources import format_size

    est = data["estimates"]["deepgemm-tests"]
    assert est["disk_bytes"] > 60 << 30 and 0 < est["peak_bytes"] < est["disk_bytes"] and est["seconds"] > 0
    assert f"deepgemm-tests: 125 cases; estimated disk {format_size(est['disk_bytes'])}" in flat


def test_list_wraps_to_the_terminal_width(capsys, monkeypatch):
    import sys

    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    monkeypatch.setenv("COLUMNS", "60")
    assert main(["list", "-v"]) == 0
    assert max(len(line) for line in capsys.readouterr().out.splitlines()) <= 60


def test_the_ulp_histogram_counts_non_finite_elements_in_their_own_bins():
    import numpy as np

    from deepgemm_ref.golden.check import CheckOptions, classify_output

    inf, nan = np.inf, np.nan
    golden = np.array([[1.0, nan, inf, -inf, 2.0, nan, 4.0, -inf]], np.float32)
    device = np.array([[1.0, nan, inf, inf, nan, 3.0, 4.0, -inf]], np.float32)
    rep, _ = classify_output("c", device, {"main": golden}, {}, {}, CheckOptions())
    h = rep.ulp_histogram
    # by hand: 1 and 4 equal (0 ulp); NaN = NaN and inf = inf, -inf = -inf matched; -inf vs inf an infinity
    # mismatch; 2 vs NaN and NaN vs 3 NaN mismatches
    assert (h["0"], h["NaN matched"], h["inf matched"], h["NaN mismatched"], h["inf mismatched"]) == (2, 1, 2, 2, 1)
    assert sum(h.values()) == rep.checked == 8


@pytest.fixture(scope="module")
def one_bad_element(tmp_path_factory):
    """A 128 x 128 bf16 output (one tile) whose element (3, 5) is 64 ulps off: one failure in 16,384."""
    import numpy as np

    from deepgemm_ref import golden
    from deepgemm_ref.golden import safetensors as st

    root = tmp_path_factory.mktemp("one-bad")
    bundle = root / "b"
    golden.generate([{"id": "one", "kernel": "bf16_gemm_nt", "profile": "sm100", "m": 128, "n": 128, "k": 64}],
                    bundle)
    good = root / "good.safetensors"
    golden.replay(bundle, good)
    outs = golden.load_outputs(good)
    d = outs["one/d"].copy()
    d.view(np.uint16)[3, 5] += 64
    outs["one/d"] = d
    bad = root / "bad.safetensors"
    st.save_file(outs, bad)
    [report] = golden.check(bundle, bad)
    assert report.failed == 1 and report.checked == 128 * 128
    return bundle, report


def test_a_tile_with_one_failing_element_is_clearly_visible_in_the_html_table(one_bad_element, monkeypatch):
    import re

    from deepgemm_ref.errors import DGArgumentError
    from deepgemm_ref.golden import plot
    from deepgemm_ref.golden.html import html_report

    def missing() -> None:
        raise DGArgumentError("heatmaps need matplotlib")

    monkeypatch.setattr(plot, "_matplotlib", missing)
    bundle, report = one_bad_element
    text = html_report([report])
    [cell] = re.findall(r'<td style="([^"]*)" title="tile \(0, 0\): 1 of 16384 failing">', text)
    level = int(re.search(r"rgb\(255,(\d+),\1\)", cell).group(1))
    assert level <= 170, cell  # at least a clear pink, not the near-white of a 1/16384 share
    assert "outline:" in cell


def test_the_worst_elements_tables_give_absolute_thresholds_next_to_the_absolute_error(one_bad_element):
    from deepgemm_ref.golden.check import format_report
    from deepgemm_ref.golden.html import html_report

    _, report = one_bad_element
    [w] = [w for w in report.worst if w["status"] == "fail"]
    assert w["index"] == [3, 5]
    # the thresholds are absolute errors: the failing element's error is above the fail threshold,
    # which is at least the warn threshold
    assert w["error"] == abs(w["device"] - w["golden"]) > w["allowed_error"] >= w["warn_error"] >= 0
    for v in report.worst:
        if v["status"] == "pass":
            assert v["error"] <= v["warn_error"]
    text = format_report([report])
    assert "|d - golden|" in text and "absolute error" in text
    row = next(line for line in text.splitlines() if line.strip().startswith("fail") and "(3, 5)" in line)
    assert f"{w['error']:.6g}" in row and f"{w['allowed_error']:.3g}" in row, row
    html = html_report([report])
    assert "<th>|d - golden|</th><th>warns above</th><th>fails above</th>" in html
    assert "absolute error" in html


def test_par_compile_works_whatever_torch_npu_is(monkeypatch):
    """Outside the NPU shim ``torch.npu`` may be absent or another library's partial stand-in (no
    ``current_stream``): par_compile still runs every callable under the dry run, on the caller's
    device where the stand-in has one."""
    import threading
    from contextlib import contextmanager
    from types import SimpleNamespace

    import deepgemm_ref as dg
    from deepgemm_ref.testing import par_compile as pc

    class _NPUShim:  # a device namespace without current_stream
        def __init__(self):
            self.local = threading.local()

        def current_device(self):
            return getattr(self.local, "device", 0)

        @contextmanager
        def device(self, index):
            prev, self.local.device = self.current_device(), index
            try:
                yield
            finally:
                self.local.device = prev

    partial = _NPUShim()
    for npu, want in ((partial, 3), (object(), None), (None, None)):
        monkeypatch.setattr(pc, "torch", SimpleNamespace(npu=npu))
        seen = []
        with dg.numerics(arch="ascend950"), (partial.device(3) if npu is partial else dg.numerics()):
            def probe(seen=seen, npu=npu):
                seen.append((dg._C.get_dry_run(), getattr(npu, "current_device", lambda: None)()))

            pc.par_compile([probe] * 3, max_workers=2, progress=False)
        assert seen == [(True, want)] * 3, (npu, seen)
