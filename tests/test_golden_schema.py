"""Case-specification schemas (issue 14, item 1): every key checked, every refusal names the case
and the key, the issue's silent failures either do what they say or are refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from deepgemm_ref import golden
from deepgemm_ref.cli import main
from deepgemm_ref.golden.cases import FAMILIES, build_case, validate_spec
from deepgemm_ref.golden.generation import validate_specs
from deepgemm_ref.golden.schema import SpecError, did_you_mean

ROOT = Path(__file__).resolve().parent.parent


def _refused(spec: dict, *words: str) -> str:
    with pytest.raises(SpecError) as exc:
        validate_spec(spec)
    text = str(exc.value)
    for w in words:
        assert w in text, (w, text)
    return text


def _cli_refuses(tmp_path, capsys, spec: dict, *words: str) -> str:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps([spec]))
    assert main(["golden", "--spec", str(path), "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and str(path) in err
    for w in words:
        assert w in err, (w, err)
    assert not (tmp_path / "b").exists()  # refused before anything is written
    return err


# ---------------------------------------------------------------------------------------------
# the examples, one test each
# ---------------------------------------------------------------------------------------------

def test_a_dtype_is_refused_with_did_you_mean_a(tmp_path, capsys):
    _cli_refuses(tmp_path, capsys, {"id": "c", "kernel": "fp8_fp4_gemm_nt", "profile": "sm100", "a_dtype": "fp4"},
                 "case 'c'", "'a_dtype'", "did you mean 'a'")
    # and what it meant does what it says: FP4 codes (int8, two per byte) and per-32 scales
    built = build_case(validate_spec({"id": "c", "kernel": "fp8_fp4_gemm_nt", "profile": "sm100", "a": "fp4",
                                      "gran_k_a": 32}))
    assert built.inputs["a"].dtype == np.int8 and built.inputs["a"].shape == (128, 128)


def test_num_groups_is_refused_and_groups_gives_that_many(tmp_path, capsys):
    _cli_refuses(tmp_path, capsys, {"id": "g", "kernel": "m_grouped_fp8_gemm_nt_contiguous", "profile": "sm100",
                                    "num_groups": 4}, "'num_groups'", "did you mean 'groups'")
    built = build_case(validate_spec({"id": "g", "kernel": "m_grouped_fp8_gemm_nt_contiguous", "profile": "sm100",
                                      "groups": 4}))
    assert built.inputs["b"].shape[0] == 4 and built.inputs["grouped_layout"].shape == (4,)


def test_max_m_does_what_it_says_for_masked_and_is_refused_elsewhere(tmp_path, capsys):
    built = build_case(validate_spec({"id": "mm", "kernel": "m_grouped_fp8_gemm_nt_masked", "profile": "sm100",
                                      "max_m": 128}))
    assert built.inputs["a"].shape[1] == 128 and built.outputs["d"]["shape"][1] == 128
    _cli_refuses(tmp_path, capsys, {"id": "mc", "kernel": "m_grouped_fp8_gemm_nt_contiguous", "profile": "sm100",
                                    "max_m": 128}, "'max_m'", "not read by m_grouped_fp8_gemm_nt_contiguous")
    _refused({"id": "small", "kernel": "m_grouped_fp8_gemm_nt_masked", "profile": "sm100", "m": 100, "max_m": 64},
             "max_m", "int(1.3 m)")


def test_layout_and_dtype_do_what_they_say_or_are_refused(tmp_path, capsys):
    _cli_refuses(tmp_path, capsys, {"id": "ld", "kernel": "m_grouped_fp8_gemm_nt_contiguous", "profile": "sm100",
                                    "layout": "m_indices", "dtype": "bf16"}, "'dtype'", "'fp8'")
    built = build_case(validate_spec({"id": "ld", "kernel": "m_grouped_bf16_gemm_nt_contiguous", "profile": "sm100",
                                      "layout": "m_indices", "dtype": "bf16"}))
    layout = built.inputs["grouped_layout"]
    assert layout.shape == (built.inputs["a"].shape[0],) and (layout == -1).any()  # per-row m_indices
    assert built.kwargs["use_psum_layout"].value is False
    assert str(built.inputs["a"].dtype) == "bfloat16"
    _refused({"id": "x", "kernel": "m_grouped_fp8_gemm_nt_contiguous", "profile": "sm100", "layout": "psum",
              "psum": False}, "disagree")
    _refused({"id": "x", "kernel": "m_grouped_fp8_gemm_nt_contiguous", "profile": "ascend950",
              "layout": "m_indices"}, "'layout'", "only 'psum'")


def test_non_integral_m_is_refused_and_integral_float_accepted(tmp_path, capsys):
    _cli_refuses(tmp_path, capsys, {"id": "f", "kernel": "fp8_gemm_nt", "profile": "sm100", "m": 16.7},
                 "'m'", "non-integral", "16.7")
    spec = validate_spec({"id": "f", "kernel": "fp8_gemm_nt", "profile": "sm100", "m": 16.0})
    assert spec.params["m"] == 16 and isinstance(spec.params["m"], int)


def test_fp3_is_refused_naming_the_allowed_formats(tmp_path, capsys):
    _cli_refuses(tmp_path, capsys, {"id": "a", "kernel": "fp8_gemm_nt", "profile": "sm100", "a": "fp3"},
                 "'a'", "'fp8', 'fp4', 'bf16'", "did you mean")


def test_kernel_typo_says_unknown_kernel_did_you_mean(tmp_path, capsys):
    err = _cli_refuses(tmp_path, capsys, {"id": "t", "kernel": "fp8_gemm_tn2", "profile": "sm100"},
                       "unknown kernel 'fp8_gemm_tn2'", "did you mean 'fp8_gemm_tn'")
    assert "resume" not in err


@pytest.mark.parametrize("spec,words", [
    ({"id": "x", "kernel": "fp8_gemm_nt", "profile": "sm100", "m": "abc"}, ("'m'", "a string")),
    ({"id": "x", "kernel": "fp8_gemm_nt", "profile": "sm100", "seed": -1}, ("'seed'",)),
    ({"id": "x", "kernel": "fp8_gemm_nt", "profile": "sm100", "m": -4}, ("'m'", "[1, 2^31 - 1]", "-4")),
    ({"id": "x", "kernel": "fp8_gemm_nt", "profile": "sm100", "m": True}, ("'m'", "boolean")),
    ({"id": "x", "kernel": "fp8_gemm_nt", "profile": "sm100", "out": "f16"}, ("'out'", "'bf16', 'f32'")),
    ({"id": "x", "kernel": "fp8_gemm_nt", "profile": "sm101"}, ("'profile'", "did you mean 'sm100'")),
    ({"kernel": "fp8_gemm_nt", "profile": "sm100"}, ("missing key 'id'",)),
    ({"id": 5, "kernel": "fp8_gemm_nt", "profile": "sm100"}, ("'id'", "a string")),
    ({"id": "x", "kernel": "fp8_fp4_gemm_nt", "profile": "sm90", "b": "fp4"}, ("'b'", "sm90", "'fp8'")),
    ({"id": "x", "kernel": "fp8_gemm_nn", "profile": "sm90"}, ("not generated under profile 'sm90'",)),
    ({"id": "x", "kernel": "m_grouped_fp8_gemm_nt_masked", "profile": "ascend950"}, ("not generated",)),
    ({"id": "x", "kernel": "fp8_fp4_mqa_logits", "profile": "ascend950", "fp4": True}, ("'fp4'", "not read")),
    ({"id": "x", "kernel": "fp8_fp4_mqa_logits", "profile": "sm90", "heads": 8}, ("'heads'", "32, 64")),
    ({"id": "x", "kernel": "fp8_gemm_nt", "profile": "sm100", "gran_k_a": 64}, ("'gran_k_a'", "32, 128")),
    ({"id": "x", "kernel": "fp8_gemm_nt", "profile": "ascend950", "gran_k_a": 128}, ("'gran_k_a'", "only 32")),
    ({"id": "x", "kernel": "fp8_gemm_nt", "profile": "sm90", "gran_n": 1, "out": "bf16"}, ("gran_n", "1D1D")),
    ({"id": "x", "kernel": "bf16_gemm_nt", "profile": "sm100", "gran_k_a": 128}, ("not read",)),
    ({"id": "x", "kernel": "cublaslt_gemm_nt", "profile": "sm100", "alpha": 2.0}, ("'alpha'", "null")),
    ({"id": "x", "kernel": "fp8_fp4_mega_moe", "profile": "sm100", "experts": 3}, ("multiple of ranks",)),
    ({"id": "x", "kernel": "fp8_fp4_mega_moe", "profile": "sm100", "shared": 1}, ("'shared'", "not read")),
    ({"id": "x", "kernel": "einsum", "profile": "sm100", "expr": "bhr,hrd->bhd"}, ("'expr'", "bhr,hdr->bhd")),
    ({"id": "x", "kernel": "fp8_gemm_nt", "profile": "sm100", "family": "probe", "probe": "accumulate"}, ("'probe'", "accumulator")),
    ({"id": "x", "kernel": "m_grouped_fp8_gemm_nn_contiguous", "profile": "sm100"}, ("no golden case builder",)),
    ({"id": ".hidden", "kernel": "fp8_gemm_nt", "profile": "sm100"}, ("'id'", "cannot name a file")),
    ({"id": "a\nb", "kernel": "fp8_gemm_nt", "profile": "sm100"}, ("control characters",)),
    ({"id": "x" * 201, "kernel": "fp8_gemm_nt", "profile": "sm100"}, ("at most 200 bytes",)),
])
def test_bad_values_are_refused_naming_case_and_key(spec, words):
    _refused(spec, *words)


def test_cli_names_the_file_and_never_shows_a_traceback(tmp_path, capsys):
    for text, words in (('{"cases": 5}', ("expected a list",)), ("[1, 2]", ("case #0", "table")),
                        ('[{"id": "a", "id": "b"}]', ("duplicate key",)), ("[NaN]", ("NaN",)), ("{", ("JSON",)),
                        ('{"cases": [], "extra": 1}', ("only 'cases'",)), ("[" * 100000, ("JSON",))):
        path = tmp_path / "s.json"
        path.write_text(text)
        assert main(["golden", "--spec", str(path), "--out", str(tmp_path / "b")]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and str(path) in err, err
        for w in words:
            assert w in err, (w, err)
    path.write_bytes(b"\xff\xfe[]")
    assert main(["golden", "--spec", str(path), "--out", str(tmp_path / "b")]) == 2
    assert "UTF-8" in capsys.readouterr().err
    assert main(["golden", "--spec", str(tmp_path / "missing.json"), "--out", str(tmp_path / "b")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_every_problem_of_a_file_is_reported_at_once():
    with pytest.raises(SpecError) as exc:
        validate_specs([{"id": "a", "kernel": "fp8_gemm_nt", "profile": "sm100", "m": 1.5},
                        {"id": "b", "kernel": "fp8_gemm_nt", "profile": "sm100", "z": 1}], "s.json")
    assert "case 'a'" in str(exc.value) and "case 'b'" in str(exc.value)


def test_toml_specs(tmp_path):
    pytest.importorskip("tomllib")
    path = tmp_path / "s.toml"
    path.write_text('[[cases]]\nid = "t"\nkernel = "bf16_gemm_nt"\nprofile = "sm100"\nm = 16\nn = 16\nk = 32\n')
    assert main(["golden", "--spec", str(path), "--out", str(tmp_path / "b")]) == 0
    path.write_text('[[cases]]\nid = "t"\nkernel = "bf16_gemm_nt"\nprofile = "sm100"\nm = 16.5\n')
    assert main(["golden", "--spec", str(path), "--out", str(tmp_path / "c")]) == 2


def test_did_you_mean():
    assert did_you_mean("a_dtype", ["a", "b", "m"]) == ["a"]
    assert did_you_mean("num_groups", ["groups", "m"]) == ["groups"]
    assert did_you_mean("grops", ["groups", "m"]) == ["groups"]
    assert did_you_mean("zzz", ["groups", "m"]) == []


# ---------------------------------------------------------------------------------------------
# presets, shapes, the docs page, list -v
# ---------------------------------------------------------------------------------------------

def test_every_preset_validates_and_every_family_has_a_schema():
    for name in golden.PRESETS:
        validate_specs(golden.preset(name))
    assert all(f.schema is not None and f.estimate is not None for f in FAMILIES.values())


def test_scaled_preset_ids_keep_their_names_and_show_the_real_shape(tmp_path, capsys):
    spec = next(s for s in golden.preset("deepgemm-tests-small") if s["id"] == "sm100-fp8-m1-n2112-k7168")
    assert validate_spec(spec).shape() == {"m": 1, "n": 132, "k": 448}
    assert main(["list", "-v"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "sm100-fp8-m1-n2112-k7168 " in x)
    assert "m=1 n=132 k=448" in line
    golden.generate([spec], tmp_path / "b")
    entry = json.loads((tmp_path / "b" / "manifest.json").read_text())["cases"][0]
    assert entry["id"] == "sm100-fp8-m1-n2112-k7168" and entry["shape"] == {"m": 1, "n": 132, "k": 448}
    assert entry["params"]["gran_k_a"] == 128 and entry["params"]["out"] == "bf16"


def test_list_verbose_shows_every_familys_keys(capsys):
    assert main(["list", "-v"]) == 0
    out = capsys.readouterr().out
    for fam in FAMILIES.values():
        assert f"family {fam.name}:" in out
        for key in fam.schema.keys:
            assert f"  {key.name}: " in out, (fam.name, key.name)


def test_case_spec_reference_is_up_to_date():
    r = subprocess.run([sys.executable, str(ROOT / "docs" / "gen_case_specs.py"), "--check"], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    text = (ROOT / "docs" / "case-specs.md").read_text()
    for fam in FAMILIES.values():
        assert f"## Family `{fam.name}`" in text
        for key in fam.schema.keys:
            assert f"| `{key.name}` |" in text


def test_defaults_are_the_builders_historic_ones():
    """The schema's defaults fill in exactly what the presets relied on (their bytes are pinned
    by /work/baseline); spot checks of derived defaults."""
    p = validate_spec({"id": "x", "kernel": "fp8_fp4_gemm_nt", "profile": "ascend950", "b": "fp4"}).resolved
    assert (p["gran_k_a"], p["gran_k_b"], p["ue8m0"], p["gran_n"]) == (32, 32, True, 1)
    p = validate_spec({"id": "x", "kernel": "fp8_gemm_nt", "profile": "sm90", "gran_n": 128}).resolved
    assert (p["gran_k_a"], p["gran_k_b"], p["ue8m0"]) == (128, 128, False)
    p = validate_spec({"id": "x", "kernel": "fp8_gemm_nt_skip_head_mid", "profile": "sm100", "n": 64}).resolved
    assert p["head_splits"] == [32, 8, 32]
    p = validate_spec({"id": "x", "kernel": "m_grouped_fp8_gemm_nt_masked", "profile": "sm100"}).resolved
    assert p["max_m"] == 64 and p["m"] == 40 and p["groups"] == 3
