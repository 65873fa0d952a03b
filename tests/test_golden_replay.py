"""Replay and check that survive one bad case, --device honoured or refused, strict JSON, progress
(issue 14, items 7 and 8), and a fuzz test of outputs files (item 5)."""

from __future__ import annotations

import io
import json
import math
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from deepgemm_ref import golden
from deepgemm_ref.cli import main
from deepgemm_ref.golden import safetensors as st
from deepgemm_ref.golden.progress import Progress

CASES = [
    {"id": "a", "kernel": "fp8_gemm_nt", "profile": "sm100", "m": 16, "n": 32, "k": 128},
    {"id": "b", "kernel": "bf16_gemm_nt", "profile": "sm100", "m": 16, "n": 16, "k": 64},
    {"id": "hc", "kernel": "tf32_hc_prenorm_gemm", "profile": "sm100", "m": 4, "n": 8, "k": 64},
]


def _strict_loads(text: str):
    def refuse(name):
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    root = tmp_path_factory.mktemp("replay") / "b"
    golden.generate(CASES, root)
    return root


@pytest.fixture()
def failing_module(tmp_path, monkeypatch):
    """A 'library' whose fp8_gemm_nt raises, like a device kernel that fails."""
    (tmp_path / "flaky_dg.py").write_text(textwrap.dedent("""
        from deepgemm_ref import *  # noqa: F401,F403
        import deepgemm_ref as _dg
        transform_sf_into_required_layout = _dg.transform_sf_into_required_layout

        def fp8_gemm_nt(*args, **kwargs):
            raise RuntimeError("device fault: illegal memory access")
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "flaky_dg"
    sys.modules.pop("flaky_dg", None)


def test_replay_records_a_failing_case_and_goes_on(bundle, tmp_path, capsys, failing_module):
    out = tmp_path / "o.safetensors"
    assert main(["replay", str(bundle), "--module", failing_module, "--no-torch", "--out", str(out)]) == 1
    cap = capsys.readouterr()
    assert "case 'a' failed" in cap.err and "illegal memory access" in cap.err and "Traceback" not in cap.err
    saved = st.load_file(out)
    assert set(saved) == {"b/d", "hc/d", "hc/sqr_sum"}
    errors = json.loads(st.read_metadata(out)["deepgemm_ref.errors"])
    assert list(errors) == ["a"] and "illegal memory access" in errors["a"]
    # check: the failed case is a failure (exit 1), not a refusal; the others pass
    assert main(["check", str(bundle), "--outputs", str(out), "--json"]) == 1
    reports = {r["id"]: r for r in _strict_loads(capsys.readouterr().out)}
    assert reports["a"]["status"] == "fail" and "replay failed" in reports["a"]["error"]
    assert all(reports[k]["status"] == "pass" for k in ("b", "hc/d", "hc/sqr_sum"))


def test_check_reports_missing_cases_and_unmatched_outputs(bundle, tmp_path, capsys):
    full = tmp_path / "o.safetensors"
    golden.replay(bundle, full)
    outs = golden.load_outputs(full)
    del outs["b/d"]
    outs["nonsense/d"] = np.zeros(3, np.float32)
    outs["a/extra"] = np.zeros(3, np.float32)
    st.save_file(outs, tmp_path / "partial.safetensors")
    assert main(["check", str(bundle), "--outputs", str(tmp_path / "partial.safetensors")]) == 1
    text = capsys.readouterr().out
    assert "b: FAIL  missing from the outputs" in text
    assert "nonsense/d: FAIL" in text and "a/extra: FAIL" in text and "matches no case" in text
    # only other bundles' outputs: nothing matches, every case is missing -> exit 1, not 0
    st.save_file({"zzz/d": np.zeros(2, np.float32)}, tmp_path / "other.safetensors")
    assert main(["check", str(bundle), "--outputs", str(tmp_path / "other.safetensors")]) == 1
    assert "summary" in capsys.readouterr().out


@pytest.mark.parametrize("argv,words", [
    (["--device", "npu"], ("--device npu", "host")),
    (["--device", "cuda:0", "--torch"], ("--device cuda:0",)),
])
def test_device_is_refused_on_the_numpy_module(bundle, tmp_path, capsys, argv, words):
    if "--torch" in argv:
        pytest.importorskip("torch")
    out = tmp_path / "o.safetensors"
    assert main(["replay", str(bundle), "--out", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert all(w in err for w in words) and not out.exists()
    assert main(["replay", str(bundle), "--out", str(out), "--device", "cpu"]) == 0


@pytest.mark.torch
def test_unavailable_torch_device_is_refused(bundle, tmp_path, capsys, failing_module):
    pytest.importorskip("torch")
    out = tmp_path / "o.safetensors"
    assert main(["replay", str(bundle), "--module", failing_module, "--device", "npu", "--out", str(out)]) == 2
    assert "--device npu" in capsys.readouterr().err and not out.exists()


def test_replay_refuses_an_existing_outputs_file_before_any_work(bundle, tmp_path, capsys):
    out = tmp_path / "o.safetensors"
    out.write_bytes(b"keep me")
    assert main(["replay", str(bundle), "--out", str(out)]) == 2
    assert "exists" in capsys.readouterr().err and out.read_bytes() == b"keep me"
    assert main(["replay", str(bundle), "--out", str(out), "--case", "nope"]) == 2


def test_check_json_is_strict_with_nan_and_infinities(bundle, tmp_path, capsys):
    full = tmp_path / "o.safetensors"
    golden.replay(bundle, full)
    outs = golden.load_outputs(full)
    d = np.array(outs["hc/d"], copy=True)
    d[0, 0], d[0, 1], d[1, 0] = np.nan, np.inf, -np.inf
    outs["hc/d"] = d
    st.save_file(outs, tmp_path / "bad.safetensors")
    assert main(["check", str(bundle), "--outputs", str(tmp_path / "bad.safetensors"), "--json"]) == 1
    reports = _strict_loads(capsys.readouterr().out)
    hc = next(r for r in reports if r["id"] == "hc/d")
    assert hc["status"] == "fail" and hc["special_mismatches"] == 3
    assert {w["device"] for w in hc["worst"]} >= {"NaN", "Infinity", "-Infinity"}
    from deepgemm_ref.golden.check import strict_json_value

    assert strict_json_value({"x": [math.nan, -math.inf, np.float32(np.inf), 1.5]}) == \
        {"x": ["NaN", "-Infinity", "Infinity", 1.5]}


def test_probe_analyse_json_is_strict(tmp_path, capsys):
    outs = {"probe-ue8m0_zero/d": np.full((1, 1), np.nan, np.float32)}
    st.save_file(outs, tmp_path / "p.safetensors")
    assert main(["probe", "analyse", str(tmp_path / "p.safetensors"), "--json"]) == 0
    assert "ue8m0_byte_0" in _strict_loads(capsys.readouterr().out)


def test_verify_regenerate_says_it_regenerated_and_shows_progress(bundle, capsys, monkeypatch):
    monkeypatch.setenv("DEEPGEMM_REF_PROGRESS_INTERVAL", "0.01")
    assert main(["verify", str(bundle), "--regenerate"]) == 0
    cap = capsys.readouterr()
    assert f"regenerated {len(CASES)} of {len(CASES)} cases" in cap.out
    lines = [x for x in cap.err.splitlines() if x.startswith("verify: ")]
    assert lines[0].startswith("verify: 0/3") and lines[-1].startswith("verify: 3/3") and "ETA" in lines[-1]
    assert main(["verify", str(bundle)]) == 0
    assert "regenerated" not in capsys.readouterr().out


def test_replay_and_check_show_progress(bundle, tmp_path, capsys):
    out = tmp_path / "o.safetensors"
    assert main(["replay", str(bundle), "--out", str(out)]) == 0
    assert main(["check", str(bundle), "--outputs", str(out)]) == 0
    err = capsys.readouterr().err
    assert "replay: 3/3 cases" in err and "check: 3/3 cases" in err


def test_eta_is_weighted_by_work_not_case_count():
    now = [0.0]
    p = Progress("x", stream=io.StringIO(), tty=False, interval=1e9, clock=lambda: now[0])
    p.start(4, 100.0)
    now[0] = 10.0
    p.update(1, 10.0, "small")  # one case of four, a tenth of the work: 90 s left, not 30 s
    assert p.eta() == pytest.approx(90.0)
    now[0] = 20.0
    p.update(3, 90.0, "big")
    assert p.eta() == pytest.approx(20.0 / 90.0 * 10.0)


def test_check_of_an_incomplete_bundle_reports_the_missing_cases(tmp_path, capsys, monkeypatch):
    from deepgemm_ref.golden import generation as gen

    real = gen.compute_golden

    def broken(built):
        if built.spec.id == "b":
            raise MemoryError
        return real(built)

    monkeypatch.setattr(gen, "compute_golden", broken)
    root = tmp_path / "b"
    with pytest.raises(golden.CaseFailures, match="MemoryError"):
        golden.generate(CASES, root)
    monkeypatch.setattr(gen, "compute_golden", real)
    out = tmp_path / "o.safetensors"
    assert main(["replay", str(root), "--out", str(out)]) == 0
    assert main(["check", str(root), "--outputs", str(out)]) == 1
    assert "b: FAIL  not generated" in capsys.readouterr().out
    assert main(["verify", str(root)]) == 1
    assert "incomplete" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# fuzz: outputs files
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def good_outputs(bundle, tmp_path_factory):
    out = tmp_path_factory.mktemp("outs") / "o.safetensors"
    golden.replay(bundle, out)
    return out.read_bytes()


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=hs.data())
def test_fuzzed_outputs_files_never_give_a_traceback(bundle, good_outputs, tmp_path, capsys, data):
    raw = bytearray(good_outputs)
    kind = data.draw(hs.sampled_from(["flip", "truncate", "garbage", "tensors", "metadata"]))
    if kind == "flip":
        for _ in range(data.draw(hs.integers(1, 8))):
            i = data.draw(hs.integers(0, len(raw) - 1))
            raw[i] = data.draw(hs.integers(0, 255))
    elif kind == "truncate":
        raw = raw[: data.draw(hs.integers(0, len(raw)))]
    elif kind == "garbage":
        raw = bytearray(data.draw(hs.binary(max_size=200)))
    elif kind == "tensors":
        names = data.draw(hs.lists(hs.sampled_from(["a/d", "b/d", "hc/d", "hc/sqr_sum", "x/d", "a", ""]), max_size=5))
        dtypes = [np.float32, np.float64, np.int8, np.bool_]
        tensors = {n: np.zeros(data.draw(hs.lists(hs.integers(0, 20), max_size=3)),
                               data.draw(hs.sampled_from(dtypes))) for n in names if n}
        raw = bytearray(st.save_bytes(tensors))
    else:
        meta = {"deepgemm_ref.errors": data.draw(hs.sampled_from(["{", "[]", '{"a": 1}', "null", '{"zz": "x"}'])),
                "deepgemm_ref.cases": data.draw(hs.sampled_from(["[", "{}", '["a"]', "5"]))}
        raw = bytearray(st.save_bytes(st.load_bytes(good_outputs), meta))
    path = tmp_path / "fuzz.safetensors"
    path.write_bytes(bytes(raw))
    rc = main(["check", str(bundle), "--outputs", str(path), "--json"])
    cap = capsys.readouterr()
    assert rc in (0, 1, 2) and "Traceback" not in cap.err and "internal error" not in cap.err, cap.err
    if rc in (0, 1):
        _strict_loads(cap.out)
