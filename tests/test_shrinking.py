"""Shrinking reaches the minimal case: a property test of a broken stand-in device fails and
hypothesis' final falsifying example has the smallest shape that still fails (m = n = 1 where the
bug needs no more rows, the smallest K that shows it, found here independently by trying the K
sizes in order), because the strategies draw ``value_draw = "position"`` (an element's value
does not depend on the shape) and ``row_offsets`` (the shrinker can drop an operand's leading
rows), and the reproduce spec regenerates the same bytes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import deepgemm_ref as dg
from deepgemm_ref import golden
from deepgemm_ref.config import Limited
from deepgemm_ref.golden.case import Case
from deepgemm_ref.golden.cases import SpecError, build_case, validate_spec
from deepgemm_ref.strategies import cases
from deepgemm_ref.testing import assert_matches_golden

from .standin import standin

# ----------------------------------------------------------------------------------------------
# broken stand-ins, each a one-line bug on top of this package's kernels
# ----------------------------------------------------------------------------------------------


def _drops_last_k_block(a: Any, b: Any, d: Any, *args: Any, **kwargs: Any) -> None:
    """FP8 GEMM that never adds A's last 128-wide K block (every K shows it: K <= 128 has one block)."""
    x, sx = a
    x = np.array(x)
    x[:, (x.shape[1] - 1) // 128 * 128:] = 0
    dg.fp8_gemm_nt((x, sx), b, d, *args, **kwargs)


def _drops_third_k_block(a: Any, b: Any, d: Any, *args: Any, **kwargs: Any) -> None:
    """FP8 GEMM that skips K block 2 (K 256..383): only K >= 257 shows it."""
    x, sx = a
    x = np.array(x)
    x[:, 256:384] = 0
    dg.fp8_gemm_nt((x, sx), b, d, *args, **kwargs)


def _scales_doubled(a: Any, b: Any, d: Any, *args: Any, **kwargs: Any) -> None:
    """FP8 GEMM that reads A's float32 scale factors one power of two too high (sm90's scales)."""
    x, sx = a
    dg.fp8_gemm_nt((x, np.asarray(sx) * np.float32(2)), b, d, *args, **kwargs)


def _truncating_accumulator(a: Any, b: Any, d: Any, *args: Any, **kwargs: Any) -> None:
    """FP8 GEMM whose accumulator keeps 13 bits and truncates (checked with the float32 bound)."""
    with dg.numerics(accumulation=Limited(13, 128)):
        dg.fp8_gemm_nt(a, b, d, *args, **kwargs)


def _truncates_output(a: Any, b: Any, d: Any, *args: Any, **kwargs: Any) -> None:
    """BF16 GEMM that truncates its float32 result to bf16 instead of rounding to nearest."""
    tmp = np.zeros(np.shape(d), np.float32)
    dg.bf16_gemm_nt(a, b, tmp, *args, **kwargs)
    d[...] = (tmp.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32).astype(np.asarray(d).dtype)


DROPS_LAST_K_BLOCK = standin("shrink_drops_last_k_block", fp8_gemm_nt=_drops_last_k_block)
DROPS_THIRD_K_BLOCK = standin("shrink_drops_third_k_block", fp8_gemm_nt=_drops_third_k_block)
SCALES_DOUBLED = standin("shrink_scales_doubled", fp8_gemm_nt=_scales_doubled)
TRUNCATING_ACCUMULATOR = standin("shrink_truncating_accumulator", fp8_gemm_nt=_truncating_accumulator)
TRUNCATES_OUTPUT = standin("shrink_truncates_output", bf16_gemm_nt=_truncates_output)


# ----------------------------------------------------------------------------------------------
# running a property test to its falsifying example, and the independent minimum
# ----------------------------------------------------------------------------------------------

def _fails(case: Case, module: Any) -> bool:
    try:
        assert_matches_golden(case, case.call(module))
    except AssertionError:
        return True
    return False


def _shrunk(strategy: st.SearchStrategy[Case], module: Any, max_examples: int) -> Case:
    """The falsifying example hypothesis reports for ``@given(case=strategy)`` asserting that
    ``module`` matches the goldens (it runs it last; its spec is in the report's notes)."""
    seen: list[Case] = []

    @settings(max_examples=max_examples, deadline=None, database=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(case=strategy)
    def prop(case: Case) -> None:
        seen.append(case)
        assert_matches_golden(case, case.call(module))

    with pytest.raises(AssertionError) as err:
        prop()
    final = seen[-1]
    notes = "\n".join(getattr(err.value, "__notes__", []))
    assert f"'id': '{final.id}'" in notes, notes  # the example hypothesis reports is the last one run
    assert _fails(final, module)
    return final


def _smallest_failing_k(case: Case, module: Any) -> int:
    """The smallest K at which ``module`` fails with every other key of ``case`` kept: every
    valid K tried in order from 1 (the values do not depend on the id under value_draw
    'position', so the scanned cases keep the shrunk case's rows)."""
    spec = case.to_spec()
    for k in range(1, int(case.shape["k"]) + 1):
        try:
            trial = Case.from_spec(validate_spec({**spec, "k": k, "id": f"scan-k{k}"}))
        except SpecError:
            continue
        if _fails(trial, module):
            return k
    raise AssertionError(f"no K up to {case.shape['k']} fails: {spec}")


def _assert_minimal(case: Case, module: Any) -> None:
    shape = case.shape
    assert (shape["m"], shape["n"]) == (1, 1), case.to_spec()
    assert shape["k"] == _smallest_failing_k(case, module), case.to_spec()


#: Sizes of the default run's strategies (the slow run draws the strategies' whole ranges).
SMALL = {"m": st.integers(1, 24), "n": st.integers(1, 24)}
FULL = pytest.mark.parametrize("full", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["small", "full"])


def _sizes(full: bool, **extra: Any) -> dict[str, Any]:
    return {} if full else {**SMALL, **extra}


@FULL
def test_a_dropped_last_k_block_shrinks_to_one_element(full):
    case = _shrunk(cases("fp8_gemm_nt", profile="sm100", **_sizes(full, k=st.integers(1, 300))), DROPS_LAST_K_BLOCK,
                   10 if not full else 40)
    _assert_minimal(case, DROPS_LAST_K_BLOCK)
    assert case.shape["k"] == 1


@pytest.mark.slow
def test_a_dropped_middle_k_block_shrinks_to_the_first_k_that_has_it():
    case = _shrunk(cases("fp8_gemm_nt", profile="sm100", gran_k_a=128, gran_k_b=128), DROPS_THIRD_K_BLOCK, 40)
    _assert_minimal(case, DROPS_THIRD_K_BLOCK)
    assert case.shape["k"] == 257


@FULL
def test_scales_off_by_a_power_of_two_shrink_to_one_element(full):
    case = _shrunk(cases("fp8_gemm_nt", profile="sm90", **_sizes(full, k=st.integers(1, 300))), SCALES_DOUBLED,
                   10 if not full else 40)
    _assert_minimal(case, SCALES_DOUBLED)


@FULL
def test_a_truncated_output_shrinks_to_one_element(full):
    case = _shrunk(cases("bf16_gemm_nt", profile="sm100", out="bf16", c="none", alpha=None,
                         **_sizes(full, k=st.integers(1, 64))), TRUNCATES_OUTPUT, 10 if not full else 40)
    _assert_minimal(case, TRUNCATES_OUTPUT)


@FULL
def test_a_truncating_accumulator_shrinks_to_one_row_and_the_smallest_k(full):
    case = _shrunk(cases("fp8_gemm_nt", profile="sm100", out="f32", c="none", alpha=None,
                         **_sizes(full, k=st.integers(1, 300))), TRUNCATING_ACCUMULATOR, 10 if not full else 40)
    _assert_minimal(case, TRUNCATING_ACCUMULATOR)
    assert case.shape["k"] > 1  # one FP8 product is exact in 13 bits: the bug needs K terms


# ----------------------------------------------------------------------------------------------
# what makes it work: values that do not depend on the shape, and specs that reproduce them
# ----------------------------------------------------------------------------------------------

def _spec(**keys: Any) -> dict[str, Any]:
    return {"id": "p", "kernel": "fp8_gemm_nt", "profile": "sm100", "seed": 7, "value_draw": "position", **keys}


@pytest.mark.parametrize("values", ["normal", "adversarial", "special"])
def test_an_element_is_the_same_whatever_the_shape(values):
    big = Case.from_spec(_spec(m=9, n=6, k=256, values=values))
    small = Case.from_spec(_spec(id="q", m=2, n=3, k=256, values=values))
    for name, rows in (("a", 2), ("b", 3), ("a_sf", 2), ("b_sf", 3)):
        assert big.inputs[name][:rows].tobytes() == small.inputs[name].tobytes(), name
    # K: whole 128-wide blocks keep their codes and scales
    short = Case.from_spec(_spec(id="r", m=9, n=6, k=128, values=values))
    assert big.inputs["a"][:, :128].tobytes() == short.inputs["a"].tobytes()
    assert big.inputs["a_sf"][:, :1].tobytes() == short.inputs["a_sf"].tobytes()


def test_row_offsets_drop_an_operands_leading_rows():
    base = Case.from_spec(_spec(m=4, n=4, k=64))
    moved = Case.from_spec(_spec(id="o", m=3, n=4, k=64, row_offsets=[1]))
    assert moved.inputs["a"].tobytes() == base.inputs["a"][1:].tobytes()
    assert moved.inputs["b"].tobytes() == base.inputs["b"].tobytes()
    assert validate_spec(_spec(m=1, n=1, k=1, row_offsets=[0, 2, 0, 0])).to_dict()["row_offsets"] == [0, 2]
    assert "row_offsets" not in validate_spec(_spec(m=1, n=1, k=1, row_offsets=[0, 0])).to_dict()


def test_the_values_do_not_depend_on_the_id_under_position_and_do_under_stream():
    one = build_case(validate_spec(_spec(m=3, n=3, k=32)))
    two = build_case(validate_spec(_spec(id="other", m=3, n=3, k=32)))
    assert all(one.inputs[k].tobytes() == two.inputs[k].tobytes() for k in one.inputs)
    plain = {k: v for k, v in _spec(m=3, n=3, k=32).items() if k != "value_draw"}
    s1 = build_case(validate_spec(plain))
    s2 = build_case(validate_spec({**plain, "id": "other"}))
    assert s1.inputs["a"].tobytes() != s2.inputs["a"].tobytes()
    assert s1.inputs["a"].tobytes() != one.inputs["a"].tobytes()


@pytest.mark.parametrize("bad, message", [
    ({"value_draw": "positional"}, "key 'value_draw': expected one of 'stream', 'position'; got 'positional'; "
                                   "did you mean 'position'?"),
    ({"value_draw": 1}, "key 'value_draw': expected one of"),
    ({"row_offsets": [1]}, "key 'row_offsets': offsets rows of the positional draws; it needs value_draw 'position'"),
    ({"value_draw": "position", "row_offsets": [-1]}, "key 'row_offsets': expected a list of at most 16 integers"),
    ({"value_draw": "position", "row_offsets": 3}, "key 'row_offsets': expected a list"),
    ({"value_draw": "position", "row_offsets": [0] * 17}, "key 'row_offsets': expected a list of at most 16"),
])
def test_bad_value_draw_keys_are_refused(bad, message):
    with pytest.raises(SpecError, match="case 'p': " + message.replace("(", r"\(").replace(")", r"\)")):
        validate_spec({"id": "p", "kernel": "fp8_gemm_nt", "profile": "sm100", "m": 1, "n": 1, "k": 1, **bad})


def test_a_shrunk_example_regenerates_the_same_bytes_through_golden_spec(tmp_path):
    case = _shrunk(cases("bf16_gemm_nt", profile="sm100", out="bf16", c="none", alpha=None, m=st.integers(1, 8),
                         n=st.integers(1, 8), k=st.integers(1, 16)), TRUNCATES_OUTPUT, 10)
    spec = case.to_spec()
    assert spec["value_draw"] == "position"
    (tmp_path / "case.json").write_text(__import__("json").dumps([spec]))
    from deepgemm_ref.cli import main
    assert main(["golden", "--spec", str(tmp_path / "case.json"), "--out", str(tmp_path / "b")]) == 0
    stored = golden.load_bundle(tmp_path / "b").case(case.id)
    assert stored.entry["spec"] == spec
    for name, x in case.inputs.items():
        assert np.asarray(stored.inputs()[name]).tobytes() == x.tobytes(), name
    again = Case.load(tmp_path / "b", case.id)
    assert _fails(again, TRUNCATES_OUTPUT)
