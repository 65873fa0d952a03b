"""``deepgemm-ref export`` (msprobe dumps, CANN-style .npy / .bin golden files) and device dumps
read back by ``check`` / ``diagnose`` (issue 28, items 1-3)."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from deepgemm_ref import golden
from deepgemm_ref.cli import main
from deepgemm_ref.golden import safetensors as st
from deepgemm_ref.golden.bundle import BundleError
from deepgemm_ref.golden.export import api_name, decode_name, encode_name, export, load_dump, parse_api_name

# one case of each shape of output: bf16 2-D, two float32 outputs, MQA logits with undefined
# (-inf) elements, DeepEP dispatch (FP8, int64, several outputs) and combine (3-D, undefined rows)
IDS = ["sm100-fp8-nt-bf16", "sm100-hc-prenorm", "sm100-paged-mqa-fp8", "sm100-ep-dispatch-fp8-expand",
       "sm100-ep-combine"]
ODD = "odd id/ä:x%"  # a case id with characters no path and no msprobe API name may hold


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    root = tmp_path_factory.mktemp("export") / "bundle"
    specs = [dict(s) for s in golden.preset("smoke") if s["id"] in IDS]
    odd = dict(next(s for s in golden.preset("smoke") if s["id"] == "sm100-bf16-nt-c"))
    odd["id"] = ODD
    golden.generate(specs + [odd], root)
    return root


def _device(bundle: Path) -> dict[str, np.ndarray]:
    """Device outputs: the goldens, with one output corrupted (its first half of rows negated)."""
    b = golden.load_bundle(bundle)
    out = {}
    for cid, entry in b.cases.items():
        g = b.case(cid).golden()
        for name in entry["outputs"]:
            out[f"{cid}/{name}"] = g[name].copy()
    bad = out["sm100-fp8-nt-bf16/d"]
    half = bad.shape[0] // 2
    bad[:half] = (-bad[:half].astype(np.float32)).astype(bad.dtype)
    return out


def _verdicts(reports):
    return [(r.id, r.status, r.checked, r.passed, r.warned, r.failed, r.special_mismatches, r.undefined, r.error)
            for r in reports]


def _raw(x) -> bytes:
    return x.data.tobytes() if isinstance(x, st.PackedFP4) else np.ascontiguousarray(x).tobytes()


def test_names_round_trip_and_use_only_msprobe_path_characters():
    import re

    for name in ["sm100-fp8-nt-bf16", ODD, "a:b", ":3a", "x.y_z-0", "  ", "日本", "a\\b", "%2f", "é"]:
        enc = encode_name(name)
        assert re.fullmatch(r"[A-Za-z0-9_.:-]+", enc), enc  # msprobe's set, without '/'
        assert decode_name(enc) == name
    assert encode_name("a/b c") == "a:2fb:20c"
    for bad in [":2", ":zz", "a b", ":2F", ":61"]:  # truncated, not hex, unescaped, upper-case, needless
        with pytest.raises(ValueError):
            decode_name(bad)
    assert parse_api_name("Functional.linear.0.forward") is None
    assert parse_api_name(api_name("k.v2", "c.1")) == ("k.v2", "c.1")
    assert parse_api_name(f"DeepGEMM.fp8_gemm_nt.{encode_name(ODD)}.forward") == ("fp8_gemm_nt", ODD)
    with pytest.raises(ValueError):
        parse_api_name("DeepGEMM.fp8_gemm_nt")


@pytest.mark.parametrize("fmt", ["npy", "bin"])
def test_npy_bin_round_trip_byte_for_byte(bundle, tmp_path, fmt):
    out = tmp_path / fmt
    assert main(["export", str(bundle), "--format", fmt, "--out", str(out)]) == 0
    b = golden.load_bundle(bundle)
    assert sorted(os.listdir(out)) == sorted([encode_name(c) for c in b.cases] + ["deepgemm-ref-export.json"])
    for cid, entry in b.cases.items():
        case_dir = out / encode_name(cid)
        tensors = b.case(cid).tensors
        seen = set()
        for key, x in tensors.items():
            kind, _, rest = key.partition(".")
            name = rest if kind == "golden" and rest in entry["outputs"] else key
            side = json.loads((case_dir / f"{encode_name(name)}.json").read_text())
            data = (case_dir / f"{encode_name(name)}.{fmt}").read_bytes()
            if fmt == "npy":
                arr = np.load(case_dir / f"{encode_name(name)}.npy", allow_pickle=False)
                assert arr.dtype.name == side["file_dtype"] and arr.dtype.kind in "iub" + "f"
                data = arr.tobytes()
            assert data == _raw(x), (cid, key)
            assert side["dtype"] == x.dtype.name and side["shape"] == list(x.shape)
            assert side["role"] == ("output" if name in entry["outputs"] else kind)
            assert side["byte_order"] == "little" and side["nbytes"] == len(data)
            seen.add(name)
        assert {n for n in entry["outputs"]} <= seen
        call = json.loads((case_dir / "_case.json").read_text())["case"]
        assert call["function"] == entry["function"] and call["args"] == entry["args"]
    # bf16 and FP8 are same-width unsigned bit patterns
    side = json.loads((out / "sm100-ep-dispatch-fp8-expand" / "recv_x.json").read_text())
    assert (side["dtype"], side["file_dtype"]) == ("float8_e4m3fn", "uint8")
    side = json.loads((out / "sm100-fp8-nt-bf16" / "d.json").read_text())
    assert (side["dtype"], side["file_dtype"]) == ("bfloat16", "uint16")


@pytest.mark.parametrize("fmt", ["npy", "bin"])
def test_device_dump_read_back_gives_the_safetensors_verdict(bundle, tmp_path, fmt, capsys):
    dev = _device(bundle)
    sfile = tmp_path / "outputs.safetensors"
    st.save_file(dev, sfile)
    want = _verdicts(golden.check(bundle, sfile))
    assert any(v[1] == "fail" for v in want) and any(v[1] == "pass" for v in want)
    out = tmp_path / "dev"
    assert main(["export", str(bundle), "--format", fmt, "--out", str(out), "--outputs", str(sfile)]) == 0
    assert not any(p.name.startswith(("input.", "golden.")) for p in out.rglob("*"))  # outputs only
    back = load_dump(out)
    assert set(back) == set(dev) and all(_raw(back[k]) == _raw(dev[k]) for k in dev)
    assert _verdicts(golden.check(bundle, out)) == want
    capsys.readouterr()
    assert main(["check", str(bundle), "--outputs", str(out), "--quiet", "--no-bias-test"]) == 1
    assert main(["diagnose", str(bundle), "--outputs", str(out), "--quiet", "--case", "sm100-fp8-nt-bf16"]) == 1
    # the goldens' own export read back as outputs passes
    gold = tmp_path / "gold"
    export(bundle, gold, fmt)
    assert all(v[1] == "pass" for v in _verdicts(golden.check(bundle, gold)))


def _one_line_error(capsys, argv, *needles):
    capsys.readouterr()
    assert main(argv) == 2
    text = capsys.readouterr().err
    lines = [ln for ln in text.splitlines() if ln.startswith("deepgemm-ref:")]  # the rest: progress lines
    assert len(lines) == 1 and "Traceback" not in text, text
    err = lines[0]
    for n in needles:
        assert n in err, (n, err)
    return err


def test_bad_dump_files_are_refused_by_name(bundle, tmp_path, capsys):
    src = tmp_path / "src"
    export(bundle, src, "bin", outputs=None)
    chk = ["check", str(bundle), "--outputs"]

    def fresh(name):
        d = tmp_path / name
        shutil.copytree(src, d)
        return d

    d = fresh("short")  # a .bin one element short
    f = d / "sm100-fp8-nt-bf16" / "d.bin"
    f.write_bytes(f.read_bytes()[:-2])
    _one_line_error(capsys, chk + [str(d)], str(f), "bytes")
    d = fresh("noside")  # a .bin without its sidecar
    (d / "sm100-fp8-nt-bf16" / "d.json").unlink()
    _one_line_error(capsys, chk + [str(d)], str(d / "sm100-fp8-nt-bf16" / "d.bin"), "sidecar")
    d = fresh("shape")  # the sidecar's shape fits the file, not the bundle's output
    side = d / "sm100-fp8-nt-bf16" / "d.json"
    meta = json.loads(side.read_text())
    meta["shape"] = [meta["shape"][1], meta["shape"][0]]
    side.write_text(json.dumps(meta))
    _one_line_error(capsys, chk + [str(d)], str(d / "sm100-fp8-nt-bf16" / "d.bin"), "expected shape")
    d = fresh("dtype")  # a sidecar naming a dtype the file cannot hold
    meta["shape"] = meta["shape"][::-1]
    meta["dtype"] = "float32"
    side = d / "sm100-fp8-nt-bf16" / "d.json"
    side.write_text(json.dumps(meta))
    _one_line_error(capsys, chk + [str(d)], str(d / "sm100-fp8-nt-bf16" / "d.bin"))
    d = fresh("link")  # a symlinked file
    f = d / "sm100-fp8-nt-bf16" / "d.bin"
    f.unlink()
    f.symlink_to(src / "sm100-fp8-nt-bf16" / "d.bin")
    _one_line_error(capsys, chk + [str(d)], str(f), "symlink")
    # npy: wrong element dtype for the sidecar, a pickled object array
    empty = tmp_path / "empty"
    empty.mkdir()
    _one_line_error(capsys, chk + [str(empty)], str(empty), "holds no outputs")
    npy = tmp_path / "npy"
    export(bundle, npy, "npy")
    f = npy / "sm100-fp8-nt-bf16" / "d.npy"
    arr = np.load(f)
    np.save(f, arr.view(np.int16))
    _one_line_error(capsys, chk + [str(npy)], str(f), "int16")
    np.save(f, np.array([{"x": 1}], dtype=object), allow_pickle=True)
    _one_line_error(capsys, chk + [str(npy)], str(f), "object")


def test_output_directory_rules(bundle, tmp_path, capsys):
    exp = ["export", str(bundle), "--format", "npy", "--out"]
    afile = tmp_path / "file"
    afile.write_text("x")
    _one_line_error(capsys, exp + [str(afile)], "not a directory")
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    _one_line_error(capsys, exp + [str(other), "--force"], "refused even with --force")
    assert (other / "keep.txt").read_text() == "mine"
    _one_line_error(capsys, exp + [str(bundle / "inside")], "overlaps the input")
    out = tmp_path / "out"
    assert main(exp + [str(out), "--case", "sm100-fp8-nt-bf16"]) == 0
    _one_line_error(capsys, exp + [str(out)], "--force")
    assert main(exp + [str(out), "--force", "--case", ODD]) == 0
    assert sorted(os.listdir(out)) == sorted([encode_name(ODD), "deepgemm-ref-export.json"])
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]  # no temporary directory left
    _one_line_error(capsys, exp + [str(tmp_path / "x"), "--case", "nope"], "'nope'")
    assert not (tmp_path / "x").exists()


def test_msprobe_format_without_torch_is_refused_in_one_line(bundle, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    _one_line_error(capsys, ["export", str(bundle), "--format", "msprobe", "--out", str(tmp_path / "m")],
                    "needs torch")
    assert not (tmp_path / "m").exists()


def _export_msprobe(bundle: Path, tmp_path: Path):
    dev = _device(bundle)
    sfile = tmp_path / "outputs.safetensors"
    st.save_file(dev, sfile)
    gold, target = tmp_path / "golden_dump", tmp_path / "device_dump"
    assert main(["export", str(bundle), "--format", "msprobe", "--out", str(gold)]) == 0
    assert main(["export", str(bundle), "--format", "msprobe", "--out", str(target), "--outputs", str(sfile)]) == 0
    return dev, sfile, gold, target


@pytest.mark.torch
def test_msprobe_dump_written_and_read_back(bundle, tmp_path):
    torch = pytest.importorskip("torch")
    dev, sfile, gold, target = _export_msprobe(bundle, tmp_path)
    b = golden.load_bundle(bundle)
    dump = json.loads((gold / "rank0" / "dump.json").read_text())
    assert (dump["task"], dump["level"], dump["framework"]) == ("tensor", "L1", "pytorch")
    n_out = sum(len(e["outputs"]) for e in b.cases.values())
    assert sum(len(v["output"]) for v in dump["data"].values()) == n_out
    for cid, entry in b.cases.items():
        api = f"DeepGEMM.{entry['kernel']}.{encode_name(cid)}.forward"
        g = b.case(cid).golden()
        main_out = entry.get("main_output")
        for name in entry["outputs"]:
            meta = dump["data"][api]["output"][encode_name(name)]
            t = torch.load(gold / "rank0" / "dump_tensor_data" / meta["data_name"], weights_only=True)
            assert meta["dtype"] == str(t.dtype) and meta["shape"] == list(t.shape)
            assert str(t.dtype) == {"bfloat16": "torch.bfloat16", "float8_e4m3fn": "torch.float8_e4m3fn"}.get(
                g[name].dtype.name, f"torch.{g[name].dtype.name}")
            v = t.double().numpy()
            if v.size:  # the statistics in float64 of the values written
                assert meta["Max"] == v.max() and meta["Min"] == v.min()
                assert meta["Mean"] == pytest.approx(v.mean(), rel=1e-12)
                assert meta["Norm"] == pytest.approx(np.sqrt((v * v).sum()), rel=1e-12)
            want = g[name].astype(np.float64)
            mask = g["defined"] if name == main_out and "defined" in g else np.ones(want.shape, bool)
            # defined elements as the golden, undefined ones as the golden's value or 0 where not finite
            expect = np.where(mask | np.isfinite(want), want, 0.0)
            assert np.array_equal(v, expect, equal_nan=True), (cid, name)
    g = b.case("sm100-paged-mqa-fp8").golden()  # the 0-for-non-finite rule was exercised
    assert (~g["defined"] & ~np.isfinite(g["logits"].astype(np.float64))).any()
    back = load_dump(target)
    assert set(back) == set(dev)
    assert _verdicts(golden.check(bundle, target)) == _verdicts(golden.check(bundle, sfile))
    # a .pt whose tensor does not fit dump.json is refused naming it
    pt = next((target / "rank0" / "dump_tensor_data").glob("DeepGEMM.fp8_gemm_nt.*"))
    torch.save(torch.zeros(3), pt)
    with pytest.raises(BundleError, match=str(pt).replace(".", r"\.")):
        load_dump(target)
    pt.write_bytes(b"not a zip")
    with pytest.raises(BundleError, match="weights_only"):
        load_dump(target)


@pytest.mark.torch
@pytest.mark.msprobe
def test_real_msprobe_compare_on_exports(bundle, tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("msprobe")
    script = Path(sys.executable).parent / "msprobe"
    if not script.exists():
        pytest.skip("no msprobe script beside this interpreter")
    _, _, gold, target = _export_msprobe(bundle, tmp_path)
    res = tmp_path / "result"
    proc = subprocess.run([str(script), "compare", "-tp", str(target), "-gp", str(gold), "-o", str(res)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (table,) = res.glob("compare_result_rank0_*.csv")
    rows = list(csv.DictReader(table.open(encoding="utf-8")))
    b = golden.load_bundle(bundle)
    names = sorted(f"DeepGEMM.{e['kernel']}.{encode_name(c)}.forward.output.{encode_name(n)}"
                   for c, e in b.cases.items() for n in e["outputs"])
    assert sorted(r["NPU Name"] for r in rows) == names  # one row per output
    bad = "DeepGEMM.fp8_gemm_nt.sm100-fp8-nt-bf16.forward.output.d"
    for r in rows:
        assert r["Bench Name"] == r["NPU Name"]
        if r["NPU Name"] == bad:
            assert float(r["Cosine"]) < 0.99 and float(r["MaxAbsErr"]) > 1  # a real compare happened
        else:
            assert float(r["Cosine"]) == 1.0 and float(r["MaxAbsErr"]) == 0.0, r


def test_a_harness_npy_without_sidecar(bundle, tmp_path, capsys):
    """A harness may write ``<case>/<output>.npy`` of a NumPy dtype alone; bf16 bit patterns
    without the sidecar naming bf16 are refused naming the file."""
    b = golden.load_bundle(bundle)
    d = tmp_path / "harness"
    (d / "sm100-hc-prenorm").mkdir(parents=True)
    g = b.case("sm100-hc-prenorm").golden()
    np.save(d / "sm100-hc-prenorm" / "d.npy", g["d"])
    np.save(d / "sm100-hc-prenorm" / "sqr_sum.npy", g["sqr_sum"])
    reps = golden.check(bundle, d, cases=["sm100-hc-prenorm"])
    assert [r.status for r in reps] == ["pass", "pass"]
    (d / "sm100-fp8-nt-bf16").mkdir()
    f = d / "sm100-fp8-nt-bf16" / "d.npy"
    np.save(f, b.case("sm100-fp8-nt-bf16").golden()["d"].view(np.uint16))
    _one_line_error(capsys, ["check", str(bundle), "--outputs", str(d)], str(f), "uint16")
