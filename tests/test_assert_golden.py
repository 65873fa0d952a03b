"""deepgemm_ref.testing.assert_matches_golden and the Case it checks: silent on correct outputs,
a readable AssertionError on wrong ones, bundle cases and to_spec round trips."""

from __future__ import annotations

import json
import re

import ml_dtypes
import numpy as np
import pytest

from deepgemm_ref import DGArgumentError, golden, numerics
from deepgemm_ref.golden.case import Case
from deepgemm_ref.golden.check import element_bounds, output_golden
from deepgemm_ref.strategies import Case as StrategiesCase
from deepgemm_ref.testing import assert_matches_golden

BF16 = np.dtype(ml_dtypes.bfloat16)
GEMM = {"id": "g", "kernel": "fp8_gemm_nt", "profile": "sm100", "m": 64, "n": 160, "k": 256, "seed": 3}


@pytest.fixture(scope="module")
def gemm() -> Case:
    return Case.from_spec(GEMM)


def _bf16(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float32).astype(BF16)


def test_case_is_the_strategies_case_and_describes_itself(gemm):
    assert StrategiesCase is Case
    assert (gemm.kernel, gemm.profile, gemm.seed, gemm.values) == ("fp8_gemm_nt", "sm100", 3, "normal")
    assert gemm.shape == {"m": 64, "n": 160, "k": 256}
    assert set(gemm.inputs) == {"a", "a_sf", "b", "b_sf"} and not gemm.inputs["a"].flags.writeable
    assert gemm.to_spec() == {"id": "g", "kernel": "fp8_gemm_nt", "profile": "sm100", "seed": 3, "m": 64, "n": 160,
                              "k": 256}
    assert eval(repr(gemm), {"Case": Case}).to_spec() == gemm.to_spec()  # the repr rebuilds the case


def test_golden_has_what_the_checker_needs(gemm):
    g = gemm.golden()
    assert {"d", "acc", "S", "defined"} <= set(g)
    assert g.main == "d" and g.outputs == ("d",) and g.check["n"] == 256
    assert g["d"].dtype == BF16 and g["acc"].dtype == np.float64
    assert gemm.golden() is g  # computed once


def test_passes_silently_on_the_emulators_outputs(gemm):
    out = gemm.call()
    assert np.array_equal(out["d"].view(np.uint16), gemm.golden()["d"].view(np.uint16))
    assert_matches_golden(gemm, out)
    assert_matches_golden(gemm, out["d"])  # one array: the main output


@pytest.mark.parametrize("spec", [
    {"kernel": "fp8_gemm_nt", "profile": "sm90", "out": "f32", "c": "separate"},
    {"kernel": "fp8_fp4_gemm_tn", "profile": "sm100", "b": "fp4", "out": "f32", "k": 1024},
    {"kernel": "bf16_gemm_nn", "profile": "sm100", "out": "f32", "k": 2048},
    {"kernel": "fp8_gemm_nt", "profile": "ascend950", "out": "f32", "alpha": 0.5},
    {"kernel": "k_grouped_fp8_gemm_tn_contiguous", "profile": "sm100"},
    {"kernel": "tf32_hc_prenorm_gemm", "profile": "sm100"},
    {"kernel": "m_grouped_fp8_gemm_nt_contiguous", "profile": "sm100", "psum": False},
])
def test_passes_on_the_fp32_accumulation_model(spec):
    """A float32 accumulator (any order) lies within the checker's bound on normal values."""
    case = Case.from_spec({"id": "fp32", **spec})
    out = case.call(accumulation="fp32")
    main = case.main_output
    if case.golden()[main].dtype == np.float32:  # the fp32 model really differs from the exact golden
        assert not np.array_equal(out[main].view(np.uint32), case.golden()[main].view(np.uint32))
    assert_matches_golden(case, out)


def test_passes_on_torch_outputs(gemm):
    torch = pytest.importorskip("torch")
    out = gemm.call(device="cpu")
    assert_matches_golden(gemm, {"d": torch.from_numpy(out["d"].view(np.int16)).view(torch.bfloat16)})


def test_message_names_the_case_the_worst_elements_and_the_bounds(gemm):
    d = gemm.golden()["d"].astype(np.float32)
    d[3, 130] *= 1.01
    d[7, 7] = np.nan
    with pytest.raises(AssertionError) as err:
        assert_matches_golden(gemm, {"d": _bf16(d)})
    msg = str(err.value)
    assert msg.startswith("fp8_gemm_nt under sm100 does not match its golden values")
    assert "m=64 n=160 k=256" in msg and "seed 3" in msg and "case 'g'" in msg
    assert "a (64, 256) float8_e4m3fn" in msg  # the inputs' shapes
    assert "2 of 10240 checked elements fail" in msg and "1 NaN/inf class mismatch;" in msg
    nan_line = next(line for line in msg.splitlines() if "at (7, 7)" in line)
    assert "class mismatch (NaN where the golden value is finite)" in nan_line
    line = next(line for line in msg.splitlines() if "at (3, 130)" in line)
    assert "128x128 tile (0, 1)" in line
    gd = float(gemm.golden()["d"][3, 130])
    assert f"golden {gd:.9g}" in line and "allowed [" in line and "ULPs" in line
    lo, hi = (float(x) for x in re.search(r"allowed \[([^,]+), ([^\]]+)\]", line).groups())
    b = element_bounds(output_golden(gemm.golden(), "d", "d"), gemm.golden().check, gemm.inputs, golden.CheckOptions(),
                       (3, 130))
    assert (lo, hi) == pytest.approx(b["pass"], rel=1e-8) and lo <= gd <= hi
    dev = float(_bf16(d)[3, 130])
    assert not lo <= dev <= hi  # the reported element is outside what is allowed
    assert "bound: " in msg and "lambda 8" in msg and "u_acc 2^-24" in msg and "n 256" in msg
    spec = json.loads(re.search(r"echo '(\[.*\])' > case.json", msg).group(1))
    assert spec == [gemm.to_spec()]


def test_missing_wrong_shape_and_wrong_dtype_outputs_fail(gemm):
    good = gemm.call()["d"]
    for outputs, text in (({}, "output 'd' is missing"),
                          ({"d": good[:-1]}, "output 'd': shape (63, 160)"),
                          ({"d": good.astype(np.float32)}, "dtype float32; expected shape (64, 160) and dtype bfloat16"),
                          ({"d": good, "e": good}, "outputs ['e'] are not outputs of fp8_gemm_nt")):
        with pytest.raises(AssertionError, match=re.escape(text)):
            assert_matches_golden(gemm, outputs)


def test_bad_arguments_are_argument_errors(gemm):
    with pytest.raises(DGArgumentError, match="assert_matches_golden: case: expected a deepgemm_ref.strategies.Case"):
        assert_matches_golden({"d": 1}, {})
    with pytest.raises(DGArgumentError, match="unknown checker options \\['rtol'\\]"):
        assert_matches_golden(gemm, gemm.call(), rtol=1e-3)
    with pytest.raises(DGArgumentError, match="lambda"):
        assert_matches_golden(gemm, gemm.call(), lam=-1)
    with pytest.raises(DGArgumentError, match="computes on the host"):
        gemm.call(device="cuda")


def test_strict_fails_elements_between_the_bounds():
    case = Case.from_spec({"id": "s", "kernel": "bf16_gemm_nt", "profile": "sm100", "m": 8, "n": 8, "k": 4096,
                           "out": "f32"})
    g = case.golden()
    b = element_bounds(output_golden(g, "d", "d"), g.check, case.inputs, golden.CheckOptions(), (2, 5))
    assert b["warn"][1] > b["pass"][1]
    d = np.array(g["d"], copy=True)
    d[2, 5] = np.nextafter(np.float32(b["pass"][1]), np.float32(np.inf))  # just past the probabilistic bound
    assert_matches_golden(case, {"d": d})  # a warning, not a failure
    with pytest.raises(AssertionError, match="1 of 64 checked elements fails"):
        assert_matches_golden(case, {"d": d}, strict=True)
    assert_matches_golden(case, {"d": d}, lam=64)  # a wider bound takes it


def test_special_class_mismatch_in_a_special_case():
    case = Case.from_spec({"id": "sp", "kernel": "bf16_gemm_nt", "profile": "sm100", "m": 16, "n": 16, "k": 64,
                           "values": "special"})
    g = case.golden()["d"].astype(np.float32)
    assert np.isnan(g).any() or np.isinf(g).any()
    assert_matches_golden(case, case.call())
    flushed = np.where(np.isfinite(g), g, 0).astype(BF16)
    with pytest.raises(AssertionError, match="class mismatch"):
        assert_matches_golden(case, {"d": flushed})


@pytest.mark.parametrize("spec", [
    GEMM,
    {"id": "adv", "kernel": "fp8_fp4_gemm_nt", "profile": "ascend950", "b": "fp4", "values": "adversarial", "seed": 7},
    {"id": "spc", "kernel": "m_grouped_fp8_gemm_nt_contiguous", "profile": "sm100", "values": "special", "psum": False},
    {"id": "mqa", "kernel": "fp8_fp4_paged_mqa_logits", "profile": "sm100", "values": "adversarial"},
    {"id": "moe", "kernel": "bf16_mega_moe", "profile": "sm100", "tokens": 4, "hidden": 128, "intermediate": 128,
     "values": "special"},
])
def test_to_spec_regenerates_the_same_bytes(tmp_path, spec):
    case = Case.from_spec(spec)
    golden.generate([case.to_spec()], tmp_path / "b")
    data = golden.load_bundle(tmp_path / "b").case(case.id)
    stored_in, stored_gold = data.inputs(), data.golden()
    assert set(stored_in) == set(case.inputs)
    for name, x in case.inputs.items():
        assert np.asarray(stored_in[name]).tobytes() == x.tobytes() and stored_in[name].dtype == x.dtype, name
    mine = case.golden()
    assert set(stored_gold) == set(mine)
    for name, x in mine.items():
        assert np.asarray(stored_gold[name]).tobytes() == np.ascontiguousarray(x).tobytes(), name
    # and the bundle's case is the same Case
    again = Case.from_bundle(data)
    assert again.to_spec() == case.to_spec() and again.golden().check == mine.check
    assert_matches_golden(again, case.call())


def test_bundle_cases_replay_and_check(tmp_path):
    golden.generate(golden.preset("smoke")[:3], tmp_path / "b")
    bundle = golden.load_bundle(tmp_path / "b")
    for case_id in bundle.cases:
        case = Case.load(tmp_path / "b", case_id)
        with numerics(arch="sm90"):  # the case's own profile is used, whatever is active
            out = case.call()
        assert_matches_golden(case, out)
