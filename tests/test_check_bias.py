"""The checker's systematic-error (bias) test (deepgemm_ref.golden.bias, docs/numerics.md).

Broken devices whose every element may be inside its bound but whose errors lean one way fail
naming the bias; correct float32 devices in other summation orders pass at K >= 4096; the
options are recorded in every report form; the p-value never underflows."""

from __future__ import annotations

import json
import math
from fractions import Fraction
from math import comb

import ml_dtypes
import numpy as np
import pytest

from deepgemm_ref import formats as fm
from deepgemm_ref.cli import build_parser
from deepgemm_ref.golden import bias as bm
from deepgemm_ref.golden.case import Case
from deepgemm_ref.golden.check import CheckOptions, format_report, reports_json
from deepgemm_ref.golden.html import html_report
from deepgemm_ref.golden.junit import junit_xml
from deepgemm_ref.testing import assert_matches_golden

K = 4096


def _case(m: int, n: int, seed: int, values: str = "normal", out: str = "bf16") -> Case:
    return Case.from_spec({"id": f"bias-{m}-{n}-{seed}-{values}-{out}", "kernel": "fp8_gemm_nt", "profile": "sm100",
                           "m": m, "n": n, "k": K, "seed": seed, "values": values, "out": out})


def _truncated(acc: np.ndarray) -> np.ndarray:
    """bf16 rounded toward zero, written independently of the package: float64 -> float32 is
    exact enough here (|acc| is far from float32's limits) and dropping the low 16 bits of a
    float32 truncates its bf16 rounding; float32 rounding first can only round up across a bf16
    step where the float64 value is within 2^-24 relative of it (none at these values)."""
    x = np.asarray(acc, np.float64).astype(np.float32)
    return (x.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32).astype(ml_dtypes.bfloat16)


def _scaled(case: Case) -> tuple[np.ndarray, np.ndarray]:
    inp = case.inputs
    a = fm.decode(np.asarray(inp["a"]).view(np.uint8), fm.E4M3)
    b = fm.decode(np.asarray(inp["b"]).view(np.uint8), fm.E4M3)
    sa = np.repeat(np.asarray(inp["a_sf"], np.float64), 128, axis=1)
    sb = np.repeat(np.asarray(inp["b_sf"], np.float64), 128, axis=1)
    return a * sa, b * sb


def _fp32_device(case: Case, order: str) -> np.ndarray:
    """A correct float32 device: products rounded once to float32, summed in float32 in
    ``order``, then one rounding to the output dtype."""
    a, b = _scaled(case)
    acc = np.zeros((a.shape[0], b.shape[0]), np.float32)
    ks = range(K - 1, -1, -1) if order == "reversed" else range(K)
    part = np.zeros_like(acc)
    block = int(order.split("-")[1]) if order.startswith("blocked") else 0
    with np.errstate(all="ignore"):
        for i, k in enumerate(ks):
            p = np.multiply.outer(a[:, k], b[:, k]).astype(np.float32)
            if block:
                part += p
                if (i + 1) % block == 0:
                    acc += part
                    part[...] = 0
            else:
                acc += p
    dtype = case.golden()["d"].dtype
    return acc.astype(dtype)


@pytest.fixture(scope="module")
def trunc_case() -> tuple[Case, np.ndarray]:
    case = _case(256, 512, 3)
    return case, _truncated(case.golden()["acc"])


def test_truncated_output_fails_naming_the_bias(trunc_case: tuple[Case, np.ndarray]) -> None:
    case, dev = trunc_case
    cmp = case.compare({"d": dev})
    rep = cmp.reports[0]
    assert rep.status == "fail" and rep.bias is not None and rep.bias["failed"]
    assert rep.bias["direction"] == "toward_zero"
    g = case.golden()["d"].astype(np.float64)
    d = dev.astype(np.float64)
    assert rep.bias["counts"]["differing"] == int(np.count_nonzero(d != g))
    assert rep.bias["counts"]["toward_zero"] == rep.bias["counts"]["differing"]  # every error toward zero
    assert rep.bias["null"] == "model" and rep.bias["model_counts"] is not None  # the fp32 model ran
    assert math.isfinite(rep.bias["log10_p"]) and rep.bias["log10_p"] < -1000
    text = format_report(cmp.reports)
    assert "the errors lean one way (bias test)" in text and "differing elements are toward zero; log10 p =" in text
    with pytest.raises(AssertionError, match="the errors lean one way: bias: "):
        assert_matches_golden(case, {"d": dev})


def test_no_bias_test_turns_it_off(trunc_case: tuple[Case, np.ndarray]) -> None:
    case, dev = trunc_case
    rep = case.compare({"d": dev}, bias_test=False).reports[0]
    assert rep.bias is None
    assert rep.status == ("fail" if rep.failed else ("warn" if rep.warned else "pass"))
    assert "bias test off (--no-bias-test)" in format_report([rep]) or rep.status != "fail"
    args = build_parser().parse_args(["check", "b", "--outputs", "o", "--no-bias-test", "--bias-threshold", "-20",
                                      "--accumulation", "limited(13, 128)"])
    assert args.no_bias_test and args.bias_threshold == -20 and args.accumulation == "limited(13, 128)"


def test_biased_scale_fails() -> None:
    """Scales applied with a bias (times 1 + 2^-10) at K = 4096: every element is one rounding
    of a value 2^-10 too large, so the errors point away from zero."""
    case = _case(128, 256, 4)
    acc = np.asarray(case.golden()["acc"], np.float64) * (1 + 2.0**-10)
    rep = case.compare({"d": acc.astype(np.float32).astype(ml_dtypes.bfloat16)}).reports[0]
    assert rep.status == "fail" and rep.bias is not None and rep.bias["failed"]
    assert rep.bias["direction"] == "away_from_zero"


@pytest.mark.parametrize("values,out,order", [("normal", "f32", "sequential"), ("adversarial", "f32", "reversed"),
                                              ("normal", "bf16", "blocked-128")])
def test_correct_fp32_orders_pass(values: str, out: str, order: str) -> None:
    case = _case(32, 128, 11, values, out)
    cmp = case.compare({"d": _fp32_device(case, order)})
    rep = cmp.reports[0]
    assert rep.bias is not None and not rep.bias["failed"], format_report(cmp.reports)
    if out == "f32" and values == "normal":
        assert rep.bias["counts"]["differing"] >= 1000  # the test had something to see
    if values == "normal":  # adversarial values may overflow a float32 accumulator (the range class's business)
        assert rep.status != "fail", format_report(cmp.reports)


@pytest.mark.slow
@pytest.mark.parametrize("values", ["normal", "adversarial", "special"])
@pytest.mark.parametrize("order", ["sequential", "reversed", "blocked-32", "blocked-256", "blocked-512"])
def test_correct_fp32_orders_pass_slow(values: str, order: str) -> None:
    case = _case(128, 256, 21, values, "f32")
    rep = case.compare({"d": _fp32_device(case, order)}).reports[0]
    assert rep.bias is not None and not rep.bias["failed"], bm.describe_bias(rep.bias)


@pytest.mark.slow
def test_truncating_accumulator_fails() -> None:
    """A float32 accumulator that truncates each addition toward zero (sequential)."""
    case = _case(64, 256, 5, out="f32")
    a, b = _scaled(case)
    acc = np.zeros((64, 256), np.float32)
    for k in range(K):
        s = acc.astype(np.float64) + np.multiply.outer(a[:, k], b[:, k]).astype(np.float32)
        t = s.astype(np.float32)
        acc = np.where(np.abs(t.astype(np.float64)) > np.abs(s), np.nextafter(t, np.float32(0)), t)
    rep = case.compare({"d": acc}).reports[0]
    assert rep.status == "fail" and rep.bias is not None and rep.bias["failed"], rep.bias


def test_options_recorded_in_every_report(trunc_case: tuple[Case, np.ndarray]) -> None:
    case, dev = trunc_case
    reports = case.compare({"d": dev}, lam=10.0, bias_threshold=-20.0).reports
    text = format_report(reports)
    assert text.startswith("NOTE: not the default checker: checker options: lambda 10")
    assert "threshold log10 p < -20" in text
    j = json.loads(reports_json(reports))[0]
    assert j["options"]["bias_threshold"] == -20.0 and j["options"]["lambda"] == 10.0
    assert j["options"]["bias_test"] is True and j["options"]["accumulation"] == "fp32"
    assert j["bias"]["threshold"] == -20.0
    xml = junit_xml(reports)
    assert '<property name="deepgemm_ref.check.bias_threshold" value="-20.0"' in xml
    assert '<property name="deepgemm_ref.check.lambda" value="10.0"' in xml
    assert "the errors lean one way" in xml
    page = html_report(reports)
    assert "threshold log10 p &lt; -20" in page and "NOT the defaults" in page and "class=bias" in page
    off = case.compare({"d": dev}, bias_test=False).reports
    assert "bias test off (--no-bias-test)" in format_report(off) or off[0].status != "fail"
    assert '"deepgemm_ref.check.bias_test" value="false"' in junit_xml(off)
    assert json.loads(reports_json(off))[0]["options"]["bias_test"] is False
    # the defaults: no header line; a model given by u_acc
    assert not format_report(case.compare({"d": case.golden()["d"]}).reports).startswith("NOTE")
    assert CheckOptions(u_acc=2.0**-13).model() == "limited(13, 128)"
    assert CheckOptions(accumulation="limited(13, 128)").u_acc == 2.0**-13


def test_tail_matches_exact_sums() -> None:
    for k, n, q in ((60, 100, 0.5), (30, 40, 0.6), (7, 7, 0.55), (200, 300, 0.6)):
        exact = sum(Fraction(comb(n, j)) * Fraction(q) ** j * (1 - Fraction(q)) ** (n - j) for j in range(k, n + 1))
        want = math.log10(exact.numerator) - math.log10(exact.denominator)
        assert bm.log10_binomial_tail(k, n, q) == pytest.approx(want, rel=1e-9, abs=1e-12)
    assert bm.log10_binomial_tail(40, 100, 0.5) == 0.0  # not above the mean: p capped at 1


def test_extreme_log10_p_is_finite() -> None:
    n = 10**8
    lp = bm.log10_binomial_tail(n, n, 0.6)
    assert math.isfinite(lp) and lp == pytest.approx(n * math.log10(0.6), rel=1e-12)
    res = bm.sign_test({"differing": n, "toward_zero": n, "away_from_zero": 0, "up": n // 2, "down": n - n // 2},
                       threshold=-12, margin=0.1, model="fp32")
    assert res.failed and math.isfinite(res.log10_p) and res.log10_p < -2e7
    want = f"{n * math.log10(0.6) + math.log10(4):,.0f}"  # the tail's only term, times 4 directions
    assert f"100,000,000 of 100,000,000 differing elements are toward zero; log10 p = {want}" in \
        bm.describe_bias(res.to_json())
