"""The golden-value workflow: bundles, replay, the checker catching real port bugs, the CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import deepgemm_ref as dg
from deepgemm_ref import core, golden
from deepgemm_ref import formats as fm
from deepgemm_ref.cli import main
from deepgemm_ref.errors import DGArgumentError
from deepgemm_ref.golden import safetensors as st

BF16 = ml_dtypes.bfloat16

CASES = [
    {"id": "fp8-256", "kernel": "fp8_gemm_nt", "profile": "sm100", "m": 256, "n": 256, "k": 512, "out": "bf16"},
    {"id": "fp8-c-f32", "kernel": "fp8_gemm_nt", "profile": "sm100", "m": 64, "n": 128, "k": 384, "out": "f32",
     "c": "is_d"},
    {"id": "fp4", "kernel": "fp8_fp4_gemm_nt", "profile": "sm100", "m": 32, "n": 64, "k": 256, "a": "fp4", "b": "fp4",
     "gran_k_a": 32, "gran_k_b": 32, "out": "bf16"},
    {"id": "sm90-1d2d", "kernel": "fp8_gemm_nt", "profile": "sm90", "m": 32, "n": 512, "k": 512, "gran_n": 128,
     "out": "bf16"},
    {"id": "ascend-alpha", "kernel": "fp8_gemm_nt", "profile": "ascend950", "m": 16, "n": 32, "k": 128,
     "out": "bf16", "alpha": -1.5, "c": "separate"},
]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    root = tmp_path_factory.mktemp("golden") / "b"
    golden.generate(CASES, root)
    return root


def _outputs_from_golden(b: golden.Bundle) -> dict[str, np.ndarray]:
    out = {}
    for cid in b.cases:
        case = b.case(cid)
        for name in case.entry["outputs"]:
            out[f"{cid}/{name}"] = np.array(case.golden()[name], copy=True)
    return out


def test_generate_replay_check_round_trip(bundle, tmp_path):
    outs = tmp_path / "out.safetensors"
    golden.replay(bundle, outs)
    reports = golden.check(bundle, outs)
    assert [r.status for r in reports] == ["pass"] * len(CASES)
    assert all(r.max_normalised_error == 0 for r in reports)
    # replay with torch tensors too (when torch is installed)
    pytest.importorskip("torch")
    outs2 = tmp_path / "out2.safetensors"
    golden.replay(bundle, outs2, use_torch=True)
    assert [r.status for r in golden.check(bundle, outs2)] == ["pass"] * len(CASES)


def test_manifest_records_what_the_issue_asks(bundle):
    m = json.loads((bundle / "manifest.json").read_text())
    assert m["version"] == 2 and m["format"] == "deepgemm-ref-golden"
    assert m["manifest_sha256"] == golden.bundle.manifest_digest(m)
    for key in ("deepgemm_ref", "numpy", "ml_dtypes", "python", "blas_thread_env"):
        assert key in m["created_by"]
    for key in ("accumulation", "scale_division", "e4m3_overflow", "fp4_rounding", "output_rounding"):
        assert key in m["numerics"]
    c = m["cases"][0]
    for key in ("function", "args", "kwargs", "outputs", "transforms", "check", "seed", "generator", "tensors",
                "file_sha256", "profile"):
        assert key in c
    assert set(c["tensors"]) >= {"input.a", "input.a_sf", "input.b", "input.b_sf", "golden.d", "golden.acc",
                                  "golden.S", "golden.defined"}
    assert all(len(t["sha256"]) == 64 for t in c["tensors"].values())
    f32 = next(x for x in m["cases"] if x["id"] == "fp8-c-f32")
    assert "golden.acc_lo" in f32["tensors"]


def _run_side_by_side(*runs: tuple[list[str], dict[str, str]]) -> None:
    """Run the commands at the same time, each with its environment (separate processes: a BLAS
    reads its thread count once), and wait for all; each must exit 0."""
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for cmd, env in runs]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]


def test_generation_is_deterministic_across_threads(tmp_path):
    env = dict(os.environ, DEEPGEMM_REF_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    code = ("import sys, deepgemm_ref.golden as g, json; "
            "g.generate(json.loads(sys.argv[2]), sys.argv[1])")
    spec = json.dumps(CASES[:3])
    env2 = dict(os.environ, DEEPGEMM_REF_NUM_THREADS="2", OPENBLAS_NUM_THREADS="2")
    _run_side_by_side(([sys.executable, "-c", code, str(tmp_path / "one"), spec], env),
                      ([sys.executable, "-c", code, str(tmp_path / "two"), spec], env2))
    for case in CASES[:3]:
        a = (tmp_path / "one" / "cases" / f"{case['id']}.safetensors").read_bytes()
        b = (tmp_path / "two" / "cases" / f"{case['id']}.safetensors").read_bytes()
        assert a == b


@pytest.mark.torch
def test_torch_safetensors_reads_every_file(bundle):
    torch = pytest.importorskip("torch")
    sttorch = pytest.importorskip("safetensors.torch")
    for f in sorted((bundle / "cases").glob("*.safetensors")):
        loaded = sttorch.load_file(str(f))
        ours = st.load_file(f)
        assert set(loaded) == set(ours)
        for name, t in loaded.items():
            o = ours[name].data if isinstance(ours[name], st.PackedFP4) else ours[name]
            assert t.view(torch.uint8).numpy().tobytes() == np.ascontiguousarray(o).view(np.uint8).tobytes()
        assert loaded["input.a"].dtype in (torch.float8_e4m3fn, torch.int8)
        assert loaded["golden.d"].dtype in (torch.bfloat16, torch.float32)


# ---------------------------------------------------------------------------------------------
# the checker catches the bugs real ports make
# ---------------------------------------------------------------------------------------------

def _check_one(bundle, case_id, device):
    b = golden.load_bundle(bundle)
    return golden.check_outputs(b, {f"{case_id}/d": device}, cases=[case_id])[0]


def _rerun(bundle, case_id, **replace_inputs):
    """Run the emulator on a case with some inputs replaced (what a buggy port would compute)."""
    from deepgemm_ref.golden.call import call_kernel
    from deepgemm_ref.golden.call import fresh_outputs as _fresh_outputs

    case = golden.load_bundle(bundle).case(case_id)
    inputs = {k: (v.data if isinstance(v, st.PackedFP4) else v) for k, v in case.inputs().items()}
    inputs.update(replace_inputs)
    outs = _fresh_outputs(case.entry["outputs"], case.inputs())
    with dg.numerics(arch=case.entry["profile"]):
        call_kernel(dg, case.entry["function"], case.args, case.kwargs, inputs, outs)
    return outs["d"], case


def test_catches_zeroed_tile(bundle):
    d = golden.load_bundle(bundle).case("fp8-256").golden()["d"].copy()
    d[128:256, 0:128] = 0
    rep = _check_one(bundle, "fp8-256", d)
    assert rep.status == "fail" and rep.tiles["failing_tiles"] == 1 and rep.tiles["failed"][0][1][0] > 10000
    # calc_diff alone would have let it through DeepGEMM's 1e-3 threshold (numerics 4.4)
    assert rep.calc_diff is not None


def test_catches_one_wrong_scale_byte(bundle):
    case = golden.load_bundle(bundle).case("fp8-256")
    sf = case.inputs()["a_sf"].copy()
    sf[7, 2] *= 2  # one UE8M0 byte off by one in one block
    d, _ = _rerun(bundle, "fp8-256", a_sf=sf)
    rep = _check_one(bundle, "fp8-256", d)
    assert rep.status == "fail" and all(w["index"][0] == 7 for w in rep.worst)


def test_catches_truncation_instead_of_rne(bundle):
    case = golden.load_bundle(bundle).case("fp8-256")
    acc = case.golden()["acc"]
    trunc = (fm.f64_to_f32_round_odd(acc).view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
    rep = _check_one(bundle, "fp8-256", trunc.astype(BF16))
    assert rep.status == "fail" and rep.failed > 0.1 * rep.checked


def test_catches_swapped_fp4_nibbles(bundle):
    case = golden.load_bundle(bundle).case("fp4")
    b = case.inputs()["b"]
    b = b.data if isinstance(b, st.PackedFP4) else b
    u = b.view(np.uint8)
    swapped = ((u >> 4) | (u << 4)).astype(np.uint8).view(np.int8)
    d, _ = _rerun(bundle, "fp4", b=swapped)
    assert _check_one(bundle, "fp4", d).status == "fail"


def test_catches_transposed_scale_layout(bundle):
    case = golden.load_bundle(bundle).case("sm90-1d2d")
    sfb = case.inputs()["b_sf"]
    assert sfb.shape[0] == sfb.shape[1]
    d, _ = _rerun(bundle, "sm90-1d2d", b_sf=np.ascontiguousarray(sfb.T))
    assert _check_one(bundle, "sm90-1d2d", d).status == "fail"


def test_catches_one_nan(bundle):
    d = golden.load_bundle(bundle).case("fp8-c-f32").golden()["d"].copy()
    d[3, 5] = np.nan
    rep = _check_one(bundle, "fp8-c-f32", d)
    assert rep.status == "fail" and rep.special_mismatches == 1 and rep.worst[0]["index"] == [3, 5]


def test_float32_accumulation_in_any_order_passes(bundle):
    """A correct device: float32 accumulation of the scaled products in a random order per row,
    then the epilogue with float32 arithmetic.  It must pass (never fail)."""
    rng = np.random.default_rng(0)
    for case_id in ("fp8-256", "fp8-c-f32", "fp4", "sm90-1d2d", "ascend-alpha"):
        case = golden.load_bundle(bundle).case(case_id)
        g = case.golden()
        spec = case.entry["spec"]
        # the exact products, as float64 (exact), summed in float32 in a random order
        from deepgemm_ref.golden.cases import build_case

        built = build_case(golden.CaseSpec.from_dict(spec))
        with dg.numerics(arch=case.entry["profile"]):
            with dg.trace.capture(want_acc=True) as cap:
                from deepgemm_ref.golden.call import call_kernel
                from deepgemm_ref.golden.call import fresh_outputs as _fresh_outputs

                outs = _fresh_outputs(built.outputs, built.inputs)
                call_kernel(dg, built.function, built.args, built.kwargs, built.inputs, outs)
        acc64 = cap.last.acc
        # perturb like a float32 accumulator would: relative noise ~ sqrt(K) * 2^-24 on the terms
        S = g["S"]
        k = case.entry["check"]["n"]
        noise = rng.uniform(-1, 1, acc64.shape) * np.sqrt(k) * 2.0**-24 * S * 0.5
        acc_dev = (acc64 + noise).astype(np.float32).astype(np.float64)
        ep_desc = case.entry["check"]["epilogue"]
        c = case.inputs().get(ep_desc["c"]) if ep_desc["c"] else None
        ep = core.OutputStage(fm.BF16 if g["d"].dtype == BF16 else fm.F32, ep_desc["alpha"], c, ep_desc["c_mode"])
        dev = ep.apply(acc_dev, 0, acc_dev.shape[0]).view(g["d"].dtype)
        rep = _check_one(bundle, case_id, dev)
        assert rep.status in ("pass", "warn") and rep.failed == 0, case_id


def test_limited_accumulator_is_flagged_not_passed(tmp_path):
    """A Hopper-like truncating 13-bit accumulator: outside the probabilistic bound (warn or fail)."""
    root = tmp_path / "b"
    golden.generate([{"id": "big-k", "kernel": "fp8_gemm_nt", "profile": "sm100", "m": 64, "n": 64, "k": 4096,
                      "out": "f32"}], root)
    b = golden.load_bundle(root)
    case = b.case("big-k")
    inputs = case.inputs()
    d = np.zeros((64, 64), np.float32)
    with dg.numerics(accumulation=dg.Limited(13, 128)):
        dg.fp8_gemm_nt((inputs["a"], inputs["a_sf"]), (inputs["b"], inputs["b_sf"]), d, recipe=(1, 1, 128))
    rep = golden.check_outputs(b, {"big-k/d": d})[0]
    assert rep.status in ("warn", "fail") and rep.passed < rep.checked


# ---------------------------------------------------------------------------------------------
# bad input: clear message, exit 2, nothing half-written or overwritten
# ---------------------------------------------------------------------------------------------

def test_altered_tensor_is_detected(bundle, tmp_path):
    copy = tmp_path / "b"
    shutil.copytree(bundle, copy)
    f = copy / "cases" / "fp8-256.safetensors"
    data = bytearray(f.read_bytes())
    data[-5] ^= 0xFF
    f.write_bytes(bytes(data))
    with pytest.raises(golden.BundleError, match="sha256"):
        golden.load_bundle(copy).case("fp8-256")
    assert main(["verify", str(copy)]) == 1
    golden.replay(bundle, tmp_path / "o.safetensors")
    assert main(["check", str(copy), "--outputs", str(tmp_path / "o.safetensors")]) == 2


def test_missing_tensor_and_unknown_version(bundle, tmp_path):
    copy = tmp_path / "b"
    shutil.copytree(bundle, copy)
    (copy / "cases" / "fp4.safetensors").unlink()
    with pytest.raises(golden.BundleError, match="missing"):
        golden.load_bundle(copy).case("fp4")
    m = json.loads((copy / "manifest.json").read_text())
    m["version"] = 99
    (copy / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(golden.BundleError, match="version 99"):
        golden.load_bundle(copy)
    assert main(["verify", str(copy)]) == 2


def test_outputs_of_wrong_shape_or_dtype(bundle, tmp_path):
    b = golden.load_bundle(bundle)
    outs = _outputs_from_golden(b)
    outs["fp8-256/d"] = outs["fp8-256/d"].astype(np.float32)
    st.save_file(outs, tmp_path / "bad.safetensors")
    assert main(["check", str(bundle), "--outputs", str(tmp_path / "bad.safetensors")]) == 2
    outs = _outputs_from_golden(b)
    outs["fp8-256/d"] = outs["fp8-256/d"][:10]
    st.save_file(outs, tmp_path / "bad2.safetensors")
    assert main(["check", str(bundle), "--outputs", str(tmp_path / "bad2.safetensors")]) == 2


def test_no_overwrite_without_force_and_unknown_preset(bundle, tmp_path):
    before = (bundle / "manifest.json").read_bytes()
    assert main(["golden", "--preset", "smoke", "--out", str(bundle)]) == 2
    assert (bundle / "manifest.json").read_bytes() == before
    assert main(["golden", "--preset", "no-such-preset", "--out", str(tmp_path / "x")]) == 2
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps([{"id": "x", "kernel": "no_such_kernel", "profile": "sm100"}]))
    assert main(["golden", "--spec", str(spec), "--out", str(tmp_path / "y")]) == 2


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write into read-only directories")
def test_unwritable_directory(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        assert main(["golden", "--preset", "smoke", "--out", str(ro / "b")]) == 2
    finally:
        ro.chmod(0o700)


def test_unwritable_target_file_reports_cleanly(tmp_path):
    target = tmp_path / "file-not-dir"
    target.write_text("x")
    assert main(["golden", "--preset", "smoke", "--out", str(target)]) == 2


def test_cli_end_to_end_and_json_report(tmp_path, capsys):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"cases": CASES[:2]}))
    out = tmp_path / "b"
    assert main(["golden", "--spec", str(spec), "--out", str(out)]) == 0
    assert main(["replay", str(out), "--out", str(tmp_path / "o.safetensors")]) == 0
    capsys.readouterr()
    assert main(["check", str(out), "--outputs", str(tmp_path / "o.safetensors"), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert [r["status"] for r in rep] == ["pass", "pass"]
    assert main(["verify", str(out), "--regenerate"]) == 0
    # a .npy output for a one-case check
    np.save(tmp_path / "d_f32.npy", golden.load_bundle(out).case("fp8-c-f32").golden()["d"])
    assert main(["check", str(out), "--outputs", str(tmp_path / "d_f32.npy"), "--case", "fp8-c-f32"]) == 0


def test_smoke_preset_covers_every_implemented_dense_kernel_family():
    kernels = {c["kernel"] for c in golden.preset("smoke")}
    assert {"fp8_gemm_nt", "fp8_fp4_gemm_nn", "fp8_fp4_gemm_tt", "bf16_gemm_nt", "bf16_gemm_tn",
            "aclnn_fp8_fp4_gemm_nt", "cublaslt_gemm_nt"} <= kernels
    profiles = {c["profile"] for c in golden.preset("smoke")}
    assert profiles == {"sm90", "sm100", "ascend950"}
    # every registered case family (the probes have their own preset) is in the main job's bundle
    from deepgemm_ref.golden.cases import FAMILIES, family_of

    families = {c.get("family") or family_of(c["kernel"]) for c in golden.preset("smoke")}
    assert families == set(FAMILIES) - {"probe"}
    _ = Path


# ---------------------------------------------------------------------------------------------
# parallel and distributed generation, failures and resume (issue 9)
# ---------------------------------------------------------------------------------------------

def _bundle_bytes(root: Path) -> dict[str, bytes]:
    """Every file of a bundle but its (empty) lock file."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != ".lock"}


# Cases whose stored float64 accumulator and error scale are not exact (FP32 scales, 56 K blocks):
# a multi-threaded BLAS would change their last bits with the thread count.
_INEXACT = [c for c in golden.preset("smoke") if c["id"] in ("sm90-grouped-mindices-fp8",)] + [
    {"id": "sm90-fp32-scales-k7168", "kernel": "fp8_gemm_nt", "profile": "sm90", "m": 96, "n": 160, "k": 7168,
     "gran_k_a": 128, "gran_k_b": 128, "gran_n": 128, "out": "bf16"}]


def test_jobs_give_identical_bundles(tmp_path):
    specs = CASES[:4] + _INEXACT
    golden.generate(specs, tmp_path / "serial")
    golden.generate(specs, tmp_path / "jobs", jobs=2)
    assert _bundle_bytes(tmp_path / "serial") == _bundle_bytes(tmp_path / "jobs")


def test_bundle_bytes_do_not_depend_on_the_blas_thread_count(tmp_path):
    code = ("import sys; from deepgemm_ref import golden; import json; "
            "golden.generate(json.loads(sys.argv[1]), sys.argv[2])")
    _run_side_by_side(*(([sys.executable, "-c", code, json.dumps(_INEXACT), str(tmp_path / threads)],
                          dict(os.environ, OPENBLAS_NUM_THREADS=threads, OMP_NUM_THREADS=threads))
                         for threads in ("1", "2")))
    b1, b2 = _bundle_bytes(tmp_path / "1"), _bundle_bytes(tmp_path / "2")
    m1, m2 = (json.loads(b.pop("manifest.json")) for b in (b1, b2))  # the manifests record the env
    assert len(b1) == 2 and b1 == b2 and m1["cases"] == m2["cases"]
    # the stored accumulators are really inexact here (else this test could not fail)
    case = golden.load_bundle(tmp_path / "1").case("sm90-fp32-scales-k7168")
    assert case.entry["golden_stats"].get("exact", 0) < case.golden()["d"].size


def test_trace_capture_does_not_depend_on_the_blas_thread_count(tmp_path):
    """Outside golden bundles too: trace.capture's float64 acc and S (sm90 FP32 scales, where S
    comes from an inexact float64 GEMM) are the same bytes with 1 and 2 BLAS threads."""
    code = (
        "import sys, numpy as np, ml_dtypes, deepgemm_ref as dg\n"
        "rng = np.random.default_rng(1)\n"
        "x = rng.standard_normal((257, 1536), dtype=np.float32).astype(ml_dtypes.bfloat16)\n"
        "w = rng.standard_normal((384, 1536), dtype=np.float32).astype(ml_dtypes.bfloat16)\n"
        "with dg.numerics(arch='sm90'):\n"
        "    a = dg.per_token_cast_to_fp8(x, False); b = dg.per_token_cast_to_fp8(w, False)\n"
        "    d = np.zeros((257, 384), np.float32)\n"
        "    with dg.trace.capture(want_acc=True, want_S=True) as cap:\n"
        "        dg.fp8_gemm_nt(a, b, d, c=d, recipe=(1, 1, 128))\n"
        "np.save(sys.argv[1], np.stack([cap.last.S, cap.last.acc, d.astype(np.float64)]))\n"
    )
    _run_side_by_side(*(([sys.executable, "-c", code, str(tmp_path / f"{threads}.npy")],
                          dict(os.environ, OPENBLAS_NUM_THREADS=threads, OMP_NUM_THREADS=threads))
                         for threads in ("1", "2")))
    one, two = (np.load(tmp_path / f"{t}.npy", allow_pickle=False) for t in ("1", "2"))
    assert one.tobytes() == two.tobytes()


@pytest.mark.dask
def test_dask_local_cluster_gives_identical_bundle(tmp_path):
    distributed = pytest.importorskip("distributed", reason="dask.distributed is not installed")
    specs = CASES[:3]
    golden.generate(specs, tmp_path / "serial")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=None) as cluster:
        golden.generate(specs, tmp_path / "dask", executor="dask", scheduler=cluster.scheduler_address)
    assert _bundle_bytes(tmp_path / "serial") == _bundle_bytes(tmp_path / "dask")


@pytest.mark.dask
def test_unreachable_scheduler(tmp_path):
    pytest.importorskip("distributed", reason="dask.distributed is not installed")
    assert main(["golden", "--preset", "smoke", "--out", str(tmp_path / "b"), "--executor", "dask",
                 "--scheduler", "tcp://127.0.0.1:9"]) == 2


def test_failure_keeps_finished_cases_and_resume_finishes(tmp_path, monkeypatch):
    from deepgemm_ref.golden import bundle as bmod

    real_save = st.save_file
    calls = {"n": 0}

    def full_disk(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(28, "No space left on device")
        return real_save(*args, **kwargs)

    monkeypatch.setattr(bmod.st, "save_file", full_disk)
    root = tmp_path / "b"
    with pytest.raises(golden.CaseFailures, match="No space left") as exc:
        golden.generate(CASES, root)
    assert "--resume" in str(exc.value) and CASES[2]["id"] in str(exc.value)
    m = json.loads((root / "manifest.json").read_text())
    # the other cases went on: every case but the failing one is kept
    assert len(m["cases"]) == len(CASES) - 1 and m["incomplete"] == [CASES[2]["id"]]
    result = golden.verify(root)
    assert result["problems"][:-1] == [] and result["incomplete"] == [CASES[2]["id"]] and not result["ok"]
    assert not list((root / "cases").glob(".*tmp"))  # nothing half-written
    monkeypatch.setattr(bmod.st, "save_file", real_save)
    golden.generate(CASES, root, resume=True)
    m = json.loads((root / "manifest.json").read_text())
    assert "incomplete" not in m and len(m["cases"]) == len(CASES)
    fresh = tmp_path / "fresh"
    golden.generate(CASES, fresh)
    assert _bundle_bytes(root) == _bundle_bytes(fresh)


def test_failing_worker_reported(tmp_path, monkeypatch):
    """A case that raises in a worker process is reported by id; the other cases are kept."""
    from deepgemm_ref.golden import generation as gen

    real = gen.compute_golden

    def broken(built):
        if built.spec.id == "bad":
            raise RuntimeError("the emulator broke")
        return real(built)

    monkeypatch.setattr(gen, "compute_golden", broken)  # inherited by the forked workers
    bad = dict(CASES[0], id="bad")
    with pytest.raises(golden.CaseFailures, match="case 'bad': RuntimeError: the emulator broke") as exc:
        golden.generate([CASES[1], bad], tmp_path / "b", jobs=2)
    assert exc.value.internal
    m = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert [c["id"] for c in m["cases"]] == [CASES[1]["id"]] and m["incomplete"] == ["bad"]


# ---------------------------------------------------------------------------------------------
# heatmaps (issue 9)
# ---------------------------------------------------------------------------------------------

@pytest.mark.plot
def test_heatmaps_show_each_bug(bundle, tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed")
    from deepgemm_ref.golden.plot import plot_report

    b = golden.load_bundle(bundle)
    good = b.case("fp8-256").golden()["d"]
    tile = good.copy()
    tile[128:256, 0:128] = 0
    sf = b.case("fp8-256").inputs()["a_sf"].copy()
    sf[7, 2] *= 2
    scale_bug, _ = _rerun(bundle, "fp8-256", a_sf=sf)
    reports = {"tile": _check_one(bundle, "fp8-256", tile), "scale": _check_one(bundle, "fp8-256", scale_bug),
               "good": _check_one(bundle, "fp8-256", good.copy())}
    worst = {k: np.array(r.tiles["worst"][0]) for k, r in reports.items()}
    # the zeroed tile is the one hot tile
    assert worst["tile"][1, 0] > 1 and np.count_nonzero(worst["tile"] > 1) == 1
    # one wrong scale byte in row 7: only the tiles of the first 128 rows go hot
    assert np.all(worst["scale"][0] > 1) and np.all(worst["scale"][1] <= 1)
    assert np.all(worst["good"] == 0)
    for name, rep in reports.items():
        png = plot_report(rep, tmp_path / f"{name}.png")
        data = png.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 2000
    assert (tmp_path / "tile.png").read_bytes() != (tmp_path / "scale.png").read_bytes()


# ---------------------------------------------------------------------------------------------
# every kernel family through the workflow (issues 5, 6, 7 case types)
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    root = tmp_path_factory.mktemp("smoke") / "b"
    golden.generate(golden.preset("smoke"), root)
    return root


def test_smoke_preset_round_trip_every_family(smoke, tmp_path):
    kernels = {c["kernel"] for c in golden.preset("smoke")}
    for family_kernel in ("m_grouped_fp8_gemm_nt_contiguous", "m_grouped_fp8_gemm_nt_masked",
                          "k_grouped_fp8_gemm_tn_contiguous", "einsum", "fp8_einsum", "tf32_hc_prenorm_gemm",
                          "fp8_fp4_mqa_logits", "fp8_fp4_paged_mqa_logits", "fp8_fp4_mega_moe", "bf16_mega_moe"):
        assert family_kernel in kernels
    golden.replay(smoke, tmp_path / "o.safetensors")
    reports = golden.check(smoke, tmp_path / "o.safetensors")
    assert reports and all(r.status == "pass" for r in reports), [r.id for r in reports if r.status != "pass"]
    b = golden.load_bundle(smoke)
    masked = b.case("sm100-grouped-masked-fp8").golden()["defined"]
    assert masked.any() and not masked.all()  # rows past masked_m are excluded from checks


@pytest.mark.torch
def test_smoke_replay_with_torch_tensors(smoke, tmp_path):
    pytest.importorskip("torch")
    golden.replay(smoke, tmp_path / "o.safetensors", use_torch=True)
    reports = golden.check(smoke, tmp_path / "o.safetensors")
    assert all(r.status == "pass" for r in reports), [r.id for r in reports if r.status != "pass"]


def test_catches_group_boundary_off_by_one(smoke):
    """A port that ends a psum group one row early (or assigns a row to the next expert) fails."""
    case = golden.load_bundle(smoke).case("sm100-grouped-psum-fp8")
    layout = case.inputs()["grouped_layout"].copy()
    layout[0] -= 1  # the first group loses its last row
    d, _ = _rerun(smoke, "sm100-grouped-psum-fp8", grouped_layout=layout)
    rep = _check_one(smoke, "sm100-grouped-psum-fp8", d)
    assert rep.status == "fail" and rep.failed == d.shape[1]  # exactly that row, every column
    mind = golden.load_bundle(smoke).case("sm100-grouped-mindices-bf16")
    ids = mind.inputs()["grouped_layout"].copy()
    last0 = int(np.flatnonzero(ids == 0)[-1])
    ids[last0] = -1  # the boundary moved up by one row
    d2, _ = _rerun(smoke, "sm100-grouped-mindices-bf16", grouped_layout=ids)
    assert _check_one(smoke, "sm100-grouped-mindices-bf16", d2).status == "fail"


# ---------------------------------------------------------------------------------------------
# Mega MoE cases (issue 7 case types)
# ---------------------------------------------------------------------------------------------

def _rerun_mega(bundle, case_id, edit):
    """Drive the emulator on a Mega MoE case after ``edit(inputs)`` (what a buggy port computes)."""
    from deepgemm_ref.golden.call import fresh_outputs as _fresh_outputs
    from deepgemm_ref.golden.call import run_case_call

    case = golden.load_bundle(bundle).case(case_id)
    inputs = {k: np.array(v.data if isinstance(v, st.PackedFP4) else v) for k, v in case.inputs().items()}
    edit(inputs)
    outs = _fresh_outputs(case.entry["outputs"], inputs)
    with dg.numerics(arch=case.entry["profile"]):
        run_case_call(dg, case.entry, case.args, case.kwargs, inputs, outs)
    return outs


def test_mega_moe_cases_hold_every_rank_and_stage(smoke):
    b = golden.load_bundle(smoke)
    for case_id, ranks in (("sm100-mega-moe-fp8xfp4", 2), ("ascend950-mega-moe", 2)):
        case = b.case(case_id)
        g = case.golden()
        assert g["y"].shape[0] == ranks and g["acc"].shape == g["y"].shape == g["S"].shape
        # the golden y is the exact combine sum rounded once to bf16
        assert np.array_equal(fm.encode(g["acc"], fm.BF16, fm.IEEE_RNE).astype(np.uint16), g["y"].view(np.uint16))
        for r in range(ranks):
            for stage in ("dispatch.src", "l1.output", "swiglu.output", "l2.acts", "l2.acts_sf", "l2.output",
                          "combine.input"):
                assert f"extra.rank{r}.{stage}" in g, (case_id, r, stage)
            # the per-rank golden agrees with the stacked one
            assert np.array_equal(g[f"extra.rank{r}.y"].view(np.uint16), g["y"][r].view(np.uint16))
        # stats: every valid slot is received by exactly one expert
        n_valid = sum(int(np.count_nonzero(case.inputs()[f"topk_idx.{r}"] >= 0)) for r in range(ranks))
        assert int(g["stats"].sum()) == n_valid


def test_mega_moe_check_catches_wrong_weights_experts_and_routes(smoke):
    case_id = "sm100-mega-moe-fp8xfp4"
    b = golden.load_bundle(smoke)
    idx = b.case(case_id).inputs()["topk_idx.1"]
    t, k = map(int, np.argwhere(idx >= 0)[0])

    def reports(edit):
        outs = _rerun_mega(smoke, case_id, edit)
        reps = golden.check_outputs(b, {f"{case_id}/y": outs["y"], f"{case_id}/stats": outs["stats"]},
                                    cases=[case_id])
        return {r.id.rsplit("/", 1)[1]: r for r in reps}

    def scaled_weight(inp):
        inp["topk_weights.1"][t, k] *= 1.1  # a 10 % error on one slot's weight

    rep = reports(scaled_weight)["y"]
    assert rep.status != "pass"
    assert {tuple(w["index"][:2]) for w in rep.worst if w["status"] != "pass"} == {(1, t)}

    def wrong_expert(inp):
        inp["topk_idx.1"][t, k] = (idx[t, k] + 1) % 4  # the classic off-by-one expert id

    rep = reports(wrong_expert)
    assert rep["y"].status == "fail" and rep["stats"].status == "fail"

    def dropped(inp):
        inp["topk_idx.1"][t, k] = -1  # the port loses one route

    rep = reports(dropped)
    assert rep["y"].status == "fail" and rep["stats"].status == "fail"
    assert {tuple(w["index"][:2]) for w in rep["y"].worst if w["status"] == "fail"} == {(1, t)}


def test_mega_moe_fp32_model_device_passes_the_check(smoke, tmp_path):
    """A float32 device pipeline passes; where its activations land one rounding step away from the
    golden ones (upstream flips), the tokens they feed may warn, never fail (golden.moe bound)."""
    ids = ["sm100-mega-moe-fp8xfp4", "sm100-mega-moe-bf16", "ascend950-mega-moe"]
    golden.replay(smoke, tmp_path / "o.safetensors", cases=ids, accumulation="fp32")
    reports = golden.check(smoke, tmp_path / "o.safetensors", cases=ids)
    assert len(reports) == 6 and all(r.failed == 0 for r in reports), [(r.id, r.status) for r in reports]
    assert all(r.status == "pass" for r in reports if r.id.endswith("/stats"))


def test_mega_moe_real_library_replay_needs_one_rank_or_the_emulator():
    from deepgemm_ref.golden.moe import _group_of

    class FakeModule:  # a library without deepgemm_ref.mega.EmulatedGroup
        pass

    with pytest.raises(golden.BundleError, match="ranks = 1"):
        _group_of(FakeModule(), 2)


def test_blocked_check_matches_whole_array_statistics():
    """check_case classifies large outputs in row blocks; the report equals a whole-array one."""
    from deepgemm_ref.golden.check import _histogram, check_case
    from deepgemm_ref.testing import calc_diff, ulp_distance

    rng = np.random.default_rng(5)
    m, n = 1100, 1000  # three row blocks
    acc = rng.standard_normal((m, n)) * 4
    gd = fm.cast(acc, fm.BF16, fm.IEEE_RNE).astype(ml_dtypes.bfloat16)
    dev = gd.copy()
    bits = dev.view(np.uint16)
    bits[::97, ::89] += 1  # one-ulp differences spread over every block
    bits[1050, 7] += 300  # one far-off element in the last block
    golden_t = {"main": gd, "acc": acc, "S": np.abs(acc) * 16}
    check = {"n": 16, "epilogue": {"out": "bf16", "alpha": None, "c": None, "c_mode": "kernel"}, "c_epi": 0}
    rep = check_case("c", dev, golden_t, check, {}, golden.CheckOptions())
    assert rep.calc_diff == pytest.approx(float(calc_diff(dev.astype(np.float64), gd.astype(np.float64))), rel=1e-9)
    assert rep.ulp_histogram == _histogram(ulp_distance(dev, gd))
    assert rep.status == "fail" and rep.worst[0]["index"] == [1050, 7] and rep.checked == m * n


def test_jobs_work_from_a_script_without_a_main_guard(tmp_path):
    """Workers are forked on Linux, so ``python -c`` / notebook code can use jobs (spawn would
    re-import a main module that has no ``if __name__ == '__main__'`` guard)."""
    if sys.platform != "linux":
        pytest.skip("workers are spawned on this platform")
    code = ("import json, sys; from deepgemm_ref import golden; "
            "golden.generate(json.loads(sys.argv[1]), sys.argv[2], jobs=2)")
    r = subprocess.run([sys.executable, "-c", code, json.dumps(CASES[:3]), str(tmp_path / "b")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    golden.generate(CASES[:3], tmp_path / "serial")
    assert {k: v for k, v in _bundle_bytes(tmp_path / "b").items() if k != "manifest.json"} == \
        {k: v for k, v in _bundle_bytes(tmp_path / "serial").items() if k != "manifest.json"}


# ---------------------------------------------------------------------------------------------
# review findings: manifest integrity, accounting of matched non-finite values, CLI strictness
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("edit", ["bound", "function", "duplicate"])
def test_edited_manifest_is_refused(bundle, tmp_path, edit):
    """The manifest carries the sha256 of its own canonical JSON: widening a case's bound,
    changing its call or duplicating a case is caught by load, check and verify."""
    copy = tmp_path / "b"
    shutil.copytree(bundle, copy)
    m = json.loads((copy / "manifest.json").read_text())
    if edit == "bound":
        m["cases"][0]["check"]["n"] = 100000
    elif edit == "function":
        m["cases"][0]["function"] = "bf16_gemm_nt"
    else:
        m["cases"].append(m["cases"][0])
    (copy / "manifest.json").write_text(json.dumps(m, indent=1, sort_keys=True) + "\n")
    with pytest.raises(golden.BundleError, match="sha256 does not match"):
        golden.load_bundle(copy)
    outs = tmp_path / "out.safetensors"
    golden.replay(bundle, outs)
    assert main(["check", str(copy), "--outputs", str(outs)]) == 2
    assert main(["verify", str(copy)]) == 2
    if edit == "duplicate":  # re-hashed by hand: still refused, for the duplicate itself
        m["manifest_sha256"] = golden.bundle.manifest_digest(m)
        (copy / "manifest.json").write_text(json.dumps(m))
        with pytest.raises(golden.BundleError, match="duplicate"):
            golden.load_bundle(copy)


def test_matched_infinities_pass_and_no_tile_fails(tmp_path):
    """MQA goldens hold -inf outside each row's KV range: a device that matches them passes
    every element (checked = passed + warned + failed) and no tile is reported failing; one
    -inf turned into a finite value fails exactly one element and one tile."""
    root = tmp_path / "b"
    golden.generate([c for c in golden.preset("smoke") if c["id"] == "sm100-mqa-fp8"], root)
    outs = tmp_path / "o.safetensors"
    golden.replay(root, outs)
    (rep,) = golden.check(root, outs)
    gd = golden.load_bundle(root).case("sm100-mqa-fp8").golden()["logits"]
    assert np.isneginf(gd).any()  # the case does exercise -inf
    assert rep.status == "pass" and rep.checked == rep.passed + rep.warned + rep.failed
    assert rep.tiles["failing_tiles"] == 0
    bad = golden.load_outputs(outs)
    key = "sm100-mqa-fp8/logits"
    x = np.array(bad[key], copy=True)
    i = np.argwhere(np.isneginf(x))[0]
    x[tuple(i)] = 0.0
    bad[key] = x
    st.save_file(bad, tmp_path / "bad.safetensors")
    (rep,) = golden.check(root, tmp_path / "bad.safetensors")
    assert rep.failed == 1 and rep.special_mismatches == 1 and rep.tiles["failing_tiles"] == 1
    assert rep.checked == rep.passed + rep.warned + rep.failed


def test_cli_rejects_unknown_case_and_bad_check_options(bundle, tmp_path, capsys):
    assert main(["golden", "--preset", "smoke", "--out", str(tmp_path / "x"), "--case", "nope"]) == 2
    assert "nope" in capsys.readouterr().err and not (tmp_path / "x" / "manifest.json").exists()
    outs = tmp_path / "out.safetensors"
    golden.replay(bundle, outs)
    for opt in (["--lambda", "nan"], ["--lambda", "-1"], ["--u-acc", "0"], ["--n", "-5"]):
        assert main(["check", str(bundle), "--outputs", str(outs), *opt]) == 2
        assert opt[0].lstrip("-").replace("-", "_") in capsys.readouterr().err.replace("-", "_")
    with pytest.raises(DGArgumentError):
        golden.CheckOptions(lam=float("inf"))


@pytest.mark.plot
def test_check_json_with_plot_keeps_stdout_json(bundle, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    outs = tmp_path / "out.safetensors"
    golden.replay(bundle, outs)
    capsys.readouterr()
    assert main(["check", str(bundle), "--outputs", str(outs), "--json", "--plot", str(tmp_path / "p")]) == 0
    cap = capsys.readouterr()
    assert len(json.loads(cap.out)) == len(CASES) and "heatmap" in cap.err
