"""The compare table beside the bound's verdict and threshold tables (issue 28, items 4 and 5):
msprobe's columns on hand-derived small arrays, against the real ``msprobe compare`` (optional),
threshold verdicts and the CLI (``--compare-table``, ``--thresholds``, ``--verdict thresholds``)."""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from deepgemm_ref import golden
from deepgemm_ref.cli import main
from deepgemm_ref.errors import DGArgumentError
from deepgemm_ref.golden import compare_table as ct
from deepgemm_ref.golden import safetensors as st

BF16 = ml_dtypes.bfloat16


def metrics(n, b):
    return ct.msprobe_metrics(ct.msprobe_read(np.asarray(n)), ct.msprobe_read(np.asarray(b)))


# ---------------------------------------------------------------------------------------------
# msprobe's columns, derived by hand
# ---------------------------------------------------------------------------------------------

def test_columns_of_a_small_float32_pair_by_hand():
    m = metrics(np.array([1, 2, 3, 4], np.float32), np.array([1, 2, 3, 5], np.float32))
    assert m["Cosine"] == pytest.approx(34 / math.sqrt(30 * 39), abs=1e-12)  # x.y / (|x| |y|)
    assert m["EucDist"] == 1.0 and m["MaxAbsErr"] == 1.0
    # |4 - 5| / 5 in float32 arithmetic, rounded to 12 decimals
    assert m["MaxRelativeErr"] == float(f"{float(np.float32(1) / np.float32(5)):.12f}") != 0.2
    assert m["One Thousandth Err Ratio"] == m["Five Thousandths Err Ratio"] == 0.75  # 3 of 4 agree


def test_bf16_is_read_as_float32_and_the_ratios_count_what_agrees():
    b = np.array([1.0, 2.0, 255.0, 8.0], BF16)
    n = b.copy()
    n[3] = BF16(8.0625)  # relative error 1/128: agrees within neither 0.001 nor 0.005
    n[2] = BF16(256.0)  # 1/255: within 0.005 only
    assert float(n[3]) == 8.0625 and float(n[2]) == 256.0  # bf16 holds them
    m = metrics(n, b)
    assert m["One Thousandth Err Ratio"] == 0.5 and m["Five Thousandths Err Ratio"] == 0.75
    assert m["MaxAbsErr"] == 1.0 and m["MaxRelativeErr"] == 0.0078125
    assert m["EucDist"] == pytest.approx(math.hypot(1.0, 0.0625), rel=1e-15)


def test_zeros_epsilon_and_zero_norms():
    # bench 0 where npu is 0: epsilon on both sides, relative error 0; npu 1e-3 there: huge
    m = metrics(np.array([0, 1], np.float32), np.array([0, 1], np.float32))
    assert m["MaxRelativeErr"] == 0.0 and m["One Thousandth Err Ratio"] == 1.0
    m = metrics(np.array([1e-3, 1], np.float32), np.array([0, 1], np.float32))
    eps = np.finfo(np.float32).eps
    want = float((np.float32(1e-3) + eps - eps) / eps)
    assert m["MaxRelativeErr"] == pytest.approx(want, rel=1e-6) and m["One Thousandth Err Ratio"] == 0.5
    assert metrics(np.zeros(5, np.float32), np.zeros(5, np.float32))["Cosine"] == 1.0  # both norms zero
    assert metrics(np.zeros(5, np.float32), np.ones(5, np.float32))["Cosine"] == "Nan"  # one norm zero
    # float64 data: float64 relative error and epsilon
    m = metrics(np.array([1e-20, 1.0]), np.array([0.0, 1.0]))
    assert m["MaxRelativeErr"] == pytest.approx((1e-20 + np.finfo(np.float64).eps) / np.finfo(np.float64).eps - 1,
                                                rel=1e-6)


def test_nan_and_inf_matched_positions_are_zeroed_mismatched_ones_give_na():
    n = np.array([np.nan, np.inf, 1.0, 2.0], np.float32)
    b = np.array([np.nan, -np.inf, 1.0, 3.0], np.float32)  # the sign of an infinity is not compared
    m = metrics(n, b)
    assert m["MaxAbsErr"] == 1.0 and m["Cosine"] == pytest.approx((1 + 6) / math.sqrt(5 * 10), abs=1e-12)
    assert m["One Thousandth Err Ratio"] == 0.75  # the zeroed pairs agree
    m = metrics(np.array([np.nan, 1, 2], np.float32), np.array([1, 1, 2], np.float32))
    assert set(m.values()) == {"N/A"} and ct.check_accuracy(m["Cosine"], m["MaxAbsErr"]) == "No"


def test_one_element_and_empty_tensors():
    m = metrics(np.array([[3.0]], np.float32), np.array([[2.0]], np.float32))  # squeezed to 0-d
    assert m["Cosine"] == m["EucDist"] == m["One Thousandth Err Ratio"] == "unsupported"
    assert m["MaxAbsErr"] == 1.0 and m["MaxRelativeErr"] == 0.5
    assert set(metrics(np.zeros((0, 4), np.float32), np.zeros((0, 4), np.float32)).values()) == {"unsupported"}


def test_cosine_rounding_above_0_9999():
    x = np.linspace(1, 2, 1000)
    y = x.copy()
    y[0] += 1e-4
    m = metrics(x, y)
    assert m["Cosine"] == round(float(f"{x @ y / np.linalg.norm(x) / np.linalg.norm(y):.12f}"), 6)


@pytest.mark.parametrize("cos, mae, want", [
    (0.995, 0.5, "Yes"), (0.98, 0.0005, "Yes"), (0.98, 0.002, "No"), (0.85, 0.0, "No"), (1.0, 1.5, "No"),
    (1.0, 1.0, "Yes"), ("N/A", "N/A", "No"), ("unsupported", 0.5, "None"), ("Nan", 0.5, "Yes"),
])
def test_check_accuracy_rule(cos, mae, want):
    assert ct.check_accuracy(cos, mae) == want


def test_undefined_elements_are_the_goldens_value_on_both_sides():
    g = np.array([1.0, np.inf, 3.0, 4.0], np.float32)
    d = np.array([1.0, 5.0, 9.0, 4.0], np.float32)
    n, b = ct.msprobe_values(d, g, np.array([True, False, False, True]))
    assert n.tolist() == [1.0, 0.0, 3.0, 4.0] and b.tolist() == [1.0, 0.0, 3.0, 4.0]
    assert ct.msprobe_values(d, g, None)[0] is d


def test_names_are_msprobes_and_reversible():
    assert ct.msprobe_api_name("fp8_gemm_nt", "sm100-m128") == "DeepGEMM.fp8_gemm_nt.sm100-m128.forward"
    from deepgemm_ref.golden.export import api_name, decode_name, encode_name

    assert ct.msprobe_api_name("k", "a b/c") == api_name("k", "a b/c")  # one definition of the name
    for text in ("a b", "x/y:z", "é\u00e9\U0001f600", "plain_1.2-3", ":", "a:3a:b"):
        enc = encode_name(text)
        assert all(ch.isascii() and (ch.isalnum() or ch in "_.:-") for ch in enc)
        assert decode_name(enc) == text
    with pytest.raises(ValueError):
        decode_name("a:zz:b")
    assert ct.torch_dtype_name(BF16) == "torch.bfloat16" and ct.torch_dtype_name(np.float32) == "torch.float32"


# ---------------------------------------------------------------------------------------------
# threshold tables
# ---------------------------------------------------------------------------------------------

def test_cann_default_rule_counts_elements_breaking_both_tolerances():
    g = np.ones(1000)
    rule = ct.CANN_DEFAULT.rule("float64")
    d = g.copy()
    d[0] += 2e-3  # breaks atol 1e-3 and rtol 1e-3 * 1: one of 1000 (0.1 %, not over): pass
    t = ct.threshold_verdict(d, g, None, rule)
    assert (t["status"], t["violating"], t["share"]) == ("pass", 1, 0.001)
    d[1] = np.nan
    assert ct.threshold_verdict(d, g, None, rule)["status"] == "fail"
    assert ct.threshold_verdict(d, g, np.arange(1000) != 1, rule)["violating"] == 1  # undefined: left out
    big = np.full(1000, 1e4)
    e = big + 5.0  # breaks atol but not rtol (5e-4 relative): no violation
    assert ct.threshold_verdict(e, big, None, rule)["violating"] == 0


def test_threshold_files_toml_and_json_strict(tmp_path):
    p = tmp_path / "t.toml"
    p.write_text('name = "team"\n[default]\nmax_share = 0.01\n[dtype.bfloat16]\natol = 1e-5\nrtol = 1e-5\n')
    t = ct.load_thresholds(p)
    assert t.name == "team" and t.rule("bfloat16") == ct.ThresholdRule(1e-5, 1e-5, 0.01)
    assert t.rule("float32") == ct.ThresholdRule(1e-3, 1e-3, 0.01)
    j = tmp_path / "t.json"
    j.write_text(json.dumps({"dtype": {"float8_e4m3fn": {"atol": 2e-3, "rtol": 2e-3}}}))
    assert ct.load_thresholds(j).rule("float8_e4m3fn").atol == 2e-3
    bad = {
        '[default]\natl = 1\n': "default.atl",
        '[default]\natol = -1\n': "default.atol",
        '[default]\nmax_share = 2\n': "default.max_share",
        '[dtype.bf17]\natol = 1\n': "dtype.bf17",
        'extra = 1\n': "extra",
        '[dtype.float32]\nrtol = "x"\n': "dtype.float32.rtol",
        '[default]\natol = inf\n': "default.atol",
        '[default]\natol = true\n': "default.atol",
    }
    for text, key in bad.items():
        p.write_text(text)
        with pytest.raises(DGArgumentError, match=f"{p}: {key}"):
            ct.load_thresholds(p)
    j.write_text('{"default": {"atol": NaN}}')
    with pytest.raises(DGArgumentError, match=str(j)):
        ct.load_thresholds(j)


def test_shipped_example_table_loads():
    root = Path(__file__).resolve().parents[1]
    t = ct.load_thresholds(root / "docs" / "thresholds-sgl-kernel-npu.toml")
    assert t.rule("bfloat16").atol == 1e-5 and t.rule("float8_e4m3fn").atol == 2e-3


# ---------------------------------------------------------------------------------------------
# the CLI
# ---------------------------------------------------------------------------------------------

CASES = [{"id": "dense", "kernel": "fp8_gemm_nt", "profile": "sm100", "m": 64, "n": 96, "k": 256},
         {"id": "f32", "kernel": "bf16_gemm_nt", "profile": "sm100", "m": 16, "n": 32, "k": 64, "out": "f32"},
         {"id": "masked", "kernel": "m_grouped_fp8_gemm_nt_masked", "profile": "sm100", "groups": 2}]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A bundle, its correct outputs, and outputs with one wrong element in ``dense`` (the bound
    fails it; 1 of 6144 is under the CANN rule's 0.1 %) and a corrupted row in ``f32``."""
    root = tmp_path_factory.mktemp("cmp")
    bundle = root / "bundle"
    golden.generate(CASES, bundle)
    good = root / "good.safetensors"
    golden.replay(bundle, good)
    outs = golden.load_outputs(good)
    d = outs["dense/d"].copy()
    d[3, 3] = BF16(float(d[3, 3]) + 64)
    outs["dense/d"] = d
    one = root / "one.safetensors"
    st.save_file(outs, one)
    f = outs["f32/d"].copy()
    f[:4] = 7
    outs["f32/d"] = f
    bad = root / "bad.safetensors"
    st.save_file(outs, bad)
    return bundle, good, one, bad


def read_csv(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_compare_table_csv_has_msprobes_columns_and_ours(files, tmp_path, capsys):
    bundle, good, one, bad = files
    out = tmp_path / "t.csv"
    assert main(["check", str(bundle), "--outputs", str(bad), "--compare-table", str(out), "--quiet"]) == 1
    rows = {r["Output"]: r for r in read_csv(out)}
    assert set(rows) == {"dense", "f32", "masked"}
    assert list(read_csv(out)[0])[:len(ct.MSPROBE_COLUMNS)] == list(ct.MSPROBE_COLUMNS)
    f = rows["f32"]
    assert f["NPU Name"] == f["Bench Name"] == "DeepGEMM.bf16_gemm_nt.f32.forward.output.d"
    assert f["NPU Dtype"] == "torch.float32" and f["Bound Status"] == "fail" and int(f["Failing"]) >= 1
    assert float(f["Cosine"]) < 0.99 and f["Accuracy Reached or Not"] == "No" and f["Worst Element"].startswith("fail at (")
    m = rows["masked"]
    assert m["Bound Status"] == "pass" and int(m["Undefined"]) > 0 and m["Accuracy Reached or Not"] == "Yes"
    assert float(m["Cosine"]) == 1.0 and float(m["MaxAbsErr"]) == 0.0
    assert "Thresholds Status" not in f and "Diagnosis" not in f
    # --diagnose adds the diagnosis of a failing output
    assert main(["check", str(bundle), "--outputs", str(one), "--compare-table", str(out), "--quiet",
                 "--diagnose"]) == 1
    rows = {r["Output"]: r for r in read_csv(out)}
    assert rows["dense"]["Diagnosis"] and rows["f32"]["Diagnosis"] == ""
    # the exit code stays the bound's; a passing set passes
    assert main(["check", str(bundle), "--outputs", str(good), "--compare-table", str(out), "--quiet"]) == 0


def test_thresholds_are_a_separate_verdict_unless_asked_for(files, tmp_path, capsys):
    bundle, _, one, _ = files
    args = ["check", str(bundle), "--outputs", str(one), "--quiet", "--no-bias-test"]
    assert main(args) == 1  # the bound fails the wrong element
    capsys.readouterr()
    assert main([*args, "--thresholds", str(Path(__file__).resolve().parents[1] / "docs" /
                                             "thresholds-cann-default.toml")]) == 1  # still the bound's
    text = capsys.readouterr().out
    assert "thresholds: 3 pass, 0 fail" in text
    assert main([*args, "--verdict", "thresholds"]) == 0  # CANN rule: 1 of 6144 violates
    strict = tmp_path / "strict.json"
    strict.write_text(json.dumps({"default": {"max_share": 0.0}}))
    capsys.readouterr()
    assert main([*args, "--thresholds", str(strict), "--verdict", "thresholds"]) == 1
    assert "dense: thresholds FAIL: 1 of 6144 elements violate" in capsys.readouterr().out
    assert main([*args, "--thresholds", str(strict), "--json"]) == 1
    reports = json.loads(capsys.readouterr().out)
    by_id = {r["id"]: r for r in reports}
    assert by_id["dense"]["thresholds"]["status"] == "fail" and by_id["dense"]["thresholds"]["violating"] == 1
    assert by_id["f32"]["thresholds"]["status"] == "pass"
    out = tmp_path / "t.csv"
    assert main([*args, "--thresholds", str(strict), "--compare-table", str(out)]) == 1
    row = {r["Output"]: r for r in read_csv(out)}["dense"]
    assert row["Thresholds Status"] == "fail" and row["Thresholds Violating"].startswith("1 of 6144")


def test_bad_threshold_file_and_missing_openpyxl_exit_2(files, tmp_path, capsys, monkeypatch):
    bundle, good, _, _ = files
    bad = tmp_path / "bad.toml"
    bad.write_text("[dtype.bfloat16]\natol = -1e-5\n")
    assert main(["check", str(bundle), "--outputs", str(good), "--thresholds", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: dtype.bfloat16.atol" in err and len(err.strip().splitlines()) == 1
    monkeypatch.setattr(ct, "xlsx_available", lambda: False)
    out = tmp_path / "t.xlsx"
    assert main(["check", str(bundle), "--outputs", str(good), "--compare-table", str(out)]) == 2
    err = capsys.readouterr().err
    assert "openpyxl" in err and len(err.strip().splitlines()) == 1 and not out.exists()


def test_xlsx_and_html_show_the_table(files, tmp_path, capsys):
    bundle, _, _, bad = files
    page = tmp_path / "r.html"
    assert main(["check", str(bundle), "--outputs", str(bad), "--html", str(page), "--quiet"]) == 1
    text = page.read_text()
    assert 'id="compare-table"' in text and "DeepGEMM.bf16_gemm_nt.f32.forward.output.d" in text
    assert "Accuracy Reached or Not" in text
    openpyxl = pytest.importorskip("openpyxl")
    out = tmp_path / "t.xlsx"
    assert main(["check", str(bundle), "--outputs", str(bad), "--compare-table", str(out), "--quiet"]) == 1
    ws = openpyxl.load_workbook(out).active
    head = [c.value for c in ws[1]]
    assert head[:len(ct.MSPROBE_COLUMNS)] == list(ct.MSPROBE_COLUMNS) and ws.max_row == 4


# ---------------------------------------------------------------------------------------------
# against the real msprobe
# ---------------------------------------------------------------------------------------------

def _torch_tensor(torch, a):
    a = np.ascontiguousarray(a)
    if a.dtype == BF16:
        return torch.from_numpy(a.view(np.uint16).astype(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a.copy())


def _dump(torch, root, apis):
    """An msprobe PyTorch tensor dump of ``apis`` (api -> output name -> array), the statistics
    computed by torch in float64."""
    d = os.path.join(root, "rank0", "dump_tensor_data")
    os.makedirs(d, exist_ok=True)
    data = {}
    for api, outs in apis.items():
        o = {}
        for name, arr in outs.items():
            t = _torch_tensor(torch, arr)
            dn = f"{api}.output.{name}.pt"
            torch.save(t, os.path.join(d, dn))
            tf = t.double()
            o[name] = {"type": "torch.Tensor", "dtype": str(t.dtype), "shape": list(t.shape),
                       "Max": tf.max().item(), "Min": tf.min().item(), "Mean": tf.mean().item(),
                       "Norm": tf.norm().item(), "requires_grad": False, "data_name": dn}
        data[api] = {"input_args": [], "input_kwargs": {}, "output": o}
    with open(os.path.join(root, "rank0", "dump.json"), "w") as fh:
        json.dump({"task": "tensor", "level": "L1", "framework": "pytorch", "dump_data_dir": d, "data": data}, fh)
    return os.path.join(root, "rank0", "dump.json")


def _hand_pairs():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((64, 32)).astype(BF16)
    bad = x.copy()
    bad[0, :5] = 7
    f = rng.standard_normal((40, 24)).astype(np.float32)
    fn = (f * (1 + rng.standard_normal(f.shape).astype(np.float32) * 1e-3)).astype(np.float32)
    z = rng.standard_normal((16, 16)).astype(np.float32)
    z[::3] = 0
    zn = z.copy()
    zn[0, 1] = 1e-3  # where the golden is 0: msprobe's epsilon
    zn[1, :] += 1e-6
    s = rng.standard_normal((8, 32)).astype(BF16)
    s[0, 0], s[1, 1], s[2, 2] = np.nan, np.inf, -np.inf
    sn = s.copy()
    sn[3, 3] = BF16(float(sn[3, 3]) * 1.5)
    m = rng.standard_normal((8, 8)).astype(np.float32)
    mn = m.copy()
    mn[0, 0] = np.nan  # NaN where the golden has none: msprobe's N/A row
    return {"equal_bf16": (x, x.copy()), "corrupted_bf16": (bad, x), "float32": (fn, f), "zeros": (zn, z),
            "all_zero": (np.zeros((4, 4), np.float32), np.zeros((4, 4), np.float32)),
            "nan_inf": (sn, s), "nan_mismatch": (mn, m)}


WORDS = ("Nan", "N/A", "unsupported", "None")


def _agree(ours, theirs, where):
    if str(ours) in WORDS or theirs in WORDS:
        assert str(ours) == theirs, where
        return
    t = float(theirs)
    if math.isnan(t):
        assert math.isnan(float(ours)), where
    else:
        assert math.isclose(float(ours), t, rel_tol=1e-6, abs_tol=0.0), (where, ours, theirs)


@pytest.mark.torch
def test_columns_agree_with_msprobe_compare(files, tmp_path):
    pytest.importorskip("msprobe")
    torch = pytest.importorskip("torch")
    exe = shutil.which("msprobe", path=os.path.dirname(sys.executable)) or shutil.which("msprobe")
    if exe is None:
        pytest.skip("no msprobe command")
    # hand pairs
    npu_apis, bench_apis, ours = {}, {}, {}
    for key, (n, b) in _hand_pairs().items():
        api = ct.msprobe_api_name("hand", key)
        npu_apis[api], bench_apis[api] = {"d": n}, {"d": b}
        row = ct.msprobe_metrics(ct.msprobe_read(n), ct.msprobe_read(b))
        row.update(ct.statistics_columns(n, "NPU"))
        row.update(ct.statistics_columns(b, "Bench"))
        ours[f"{api}.output.d"] = row
    # a bundle's outputs through check --compare-table (undefined elements written as the export does)
    bundle, _, _, bad = files
    b = golden.load_bundle(bundle)
    outs = golden.load_outputs(bad)
    table = tmp_path / "t.csv"
    assert main(["check", str(bundle), "--outputs", str(bad), "--compare-table", str(table), "--quiet"]) == 1
    for row in read_csv(table):
        ours[row["NPU Name"]] = row
    for case_id, entry in b.cases.items():
        g = b.case(case_id).golden()
        api = ct.msprobe_api_name(entry["kernel"], case_id)
        gd = g["d"]
        defined = g.get("defined")
        keep = np.ones(gd.shape, bool) if defined is None else defined.astype(bool)
        fill = np.where(np.isfinite(gd.astype(np.float64)), gd, np.zeros_like(gd))
        npu_apis[api] = {"d": np.where(keep, outs[f"{case_id}/d"], fill).astype(gd.dtype)}
        bench_apis[api] = {"d": np.where(keep, gd, fill).astype(gd.dtype)}
    res = tmp_path / "msprobe"
    proc = subprocess.run([exe, "compare", "-tp", _dump(torch, str(tmp_path / "npu"), npu_apis),
                           "-gp", _dump(torch, str(tmp_path / "bench"), bench_apis), "-o", str(res)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (result,) = res.glob("compare_result*.csv")
    theirs = {r["NPU Name"]: r for r in read_csv(result)}
    assert set(theirs) == set(ours)
    numeric = [*ct.METRIC_COLUMNS, "NPU max", "NPU min", "NPU mean", "NPU l2norm", "Bench max", "Bench min",
               "Bench mean", "Bench l2norm"]
    for name, row in ours.items():
        for col in numeric:
            _agree(row[col], theirs[name][col], (name, col))
    # a real compare happened: the corrupted rows are not cosine 1
    assert float(theirs["DeepGEMM.hand.corrupted_bf16.forward.output.d"]["Cosine"]) < 0.99
    assert float(theirs["DeepGEMM.bf16_gemm_nt.f32.forward.output.d"]["Cosine"]) < 0.99
    assert theirs["DeepGEMM.hand.nan_mismatch.forward.output.d"]["Cosine"] == "N/A"
