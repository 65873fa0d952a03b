"""Fuzzing case specifications (issue 14, items 1 and 5): any spec file gives exit 0 or 2 and never
a traceback; every spec the schema accepts generates (the schema refuses what the kernels refuse)."""

from __future__ import annotations

import json
import warnings

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as hs

from deepgemm_ref import golden
from deepgemm_ref.cli import main
from deepgemm_ref.golden.cases import FAMILIES, SpecError, validate_spec

_KEYS = sorted({k.name for f in FAMILIES.values() for k in f.schema.keys} | {"id", "kernel", "profile", "seed",
                                                                             "family"})
_KERNELS = sorted({k for f in FAMILIES.values() for k in f.kernels})
_SMALL_INTS = [0, 1, 2, 3, 4, 7, 8, 16, 24, 32, 33, 64, 96, 128, 130, 192, 256, 384, 512]

_json_value = hs.recursive(
    hs.none() | hs.booleans() | hs.integers(-2**70, 2**70) | hs.sampled_from(_SMALL_INTS)
    | hs.floats(allow_nan=False, allow_infinity=False) | hs.text(max_size=10)
    | hs.sampled_from(["fp8", "fp4", "bf16", "f32", "psum", "m_indices", "masked", "sm90", "sm100", "ascend950",
                       "none", "is_d", "separate", "probe", "accumulator"]),
    lambda children: hs.lists(children, max_size=3) | hs.dictionaries(hs.text(max_size=5), children, max_size=3),
    max_leaves=5)


@hs.composite
def _spec(draw):
    d = {}
    if draw(hs.integers(0, 9)):
        d["id"] = draw(hs.text(min_size=0, max_size=12) | hs.sampled_from(["a", "b/c", "x y", ".h"]) | _json_value)
    if draw(hs.integers(0, 9)):
        d["kernel"] = draw(hs.sampled_from(_KERNELS) | hs.text(max_size=12) | _json_value)
    if draw(hs.integers(0, 9)):
        d["profile"] = draw(hs.sampled_from(["sm90", "sm100", "ascend950", "sm101"]) | _json_value)
    for key in draw(hs.lists(hs.sampled_from(_KEYS) | hs.text(max_size=8), max_size=6)):
        d[key] = draw(hs.sampled_from(_SMALL_INTS) | hs.sampled_from([True, False, None, 0.5, 16.0, 16.5, -1])
                      | _json_value)
    return d


@pytest.mark.parametrize("examples", [100, pytest.param(300, marks=pytest.mark.slow)])
def test_fuzzed_spec_files_give_exit_0_or_2_and_no_traceback(tmp_path, capsys, examples):
    @settings(max_examples=examples, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(specs=hs.lists(_spec(), min_size=0, max_size=4) | _json_value)
    def run(specs):
        path = tmp_path / "spec.json"
        path.write_text(json.dumps(specs))
        rc = main(["golden", "--spec", str(path), "--out", str(tmp_path / "b"), "--dry-run"])
        cap = capsys.readouterr()
        assert rc in (0, 2), (rc, cap.err)
        assert "Traceback" not in cap.err and "internal error" not in cap.err, cap.err
        if rc == 2:
            assert cap.err.startswith("deepgemm-ref: error: ")
        else:
            assert "plan:" in cap.out
        assert not (tmp_path / "b").exists()  # a dry run writes nothing

    run()


# Small values for drawing specs the schema accepts.
_SMALL = {"m": [1, 2, 7, 16, 33, 64, 100], "n": [1, 8, 16, 24, 40, 64, 96, 130], "k": [1, 16, 32, 64, 96, 128, 200, 320],
          "groups": [1, 2, 3], "b": [1, 2, 3], "h": [1, 2], "r": [1, 32, 100, 128, 256], "d_dim": [1, 16, 100],
          "seq": [1, 3, 16], "seq_kv": [1, 16, 40, 96], "batch": [1, 2, 3], "max_m": [1, 64, 100, 128],
          "ranks": [1, 2], "experts": [1, 2, 4], "topk": [1, 2, 3], "hidden": [128, 256, 512],
          "intermediate": [128, 256, 512], "tokens": [1, 5, 16], "shared": [0, 1, 2], "masked": [0.0, 0.3, 1.0],
          "clamp": [None, 0.0, 10.0], "heads": [4, 8, 16, 32, 64], "alpha": [None, 0.5, -1.5],
          "head_splits": [[8, 4, 8], [16, 8, 16], [0, 8, 16]], "seed": [0, 1, 2**40]}


@hs.composite
def _valid_spec(draw):
    fam = draw(hs.sampled_from(list(FAMILIES.values())))
    kernel = draw(hs.sampled_from(sorted(fam.schema.kernels)))
    d = {"id": "case", "kernel": kernel, "profile": draw(hs.sampled_from(fam.schema.kernels[kernel]))}
    if fam.explicit:
        d["family"] = fam.name
    for key in fam.schema.keys:
        if draw(hs.booleans()):
            continue
        if key.choices is not None:
            d[key.name] = draw(hs.sampled_from(key.choices))
        elif key.kind == "bool":
            d[key.name] = draw(hs.booleans())
        elif key.name in _SMALL:
            d[key.name] = draw(hs.sampled_from(_SMALL[key.name]))
    try:
        validate_spec(d)
    except SpecError:
        assume(False)
    return d


def _generate_valid(spec, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the golden code prints no Python warnings
        golden.generate([spec], tmp_path / "b", force=True)
    assert golden.verify(tmp_path / "b")["ok"]


# 10 examples in the default run; the slow run's test_every_spec_the_schema_accepts_generates_many
# draws 400 (CI's slow step runs beside the optional-dependency step: their longer one sets its time).
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(spec=_valid_spec())
def test_every_spec_the_schema_accepts_generates(tmp_path, spec):
    _generate_valid(spec, tmp_path)


@pytest.mark.slow
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(spec=_valid_spec())
def test_every_spec_the_schema_accepts_generates_many(tmp_path, spec):
    _generate_valid(spec, tmp_path)
