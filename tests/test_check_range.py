"""The accumulator's range in the checker's bound (docs/numerics.md, "The accumulator's range"):
correct float32 accumulators in several orders are never failed on adversarial and special
values; NaN / infinities that no correct accumulator can produce still fail."""

from __future__ import annotations

import warnings
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st

from deepgemm_ref.golden.case import Case
from deepgemm_ref.golden.check import F32_MAX, CheckOptions, check_case, format_report, overflow_reach
from deepgemm_ref.settings import numerics
from deepgemm_ref.strategies import cases

_BF16 = np.dtype(ml_dtypes.bfloat16)


def _gemm_terms(case: Case) -> np.ndarray:
    """float64 products (m, n, k) of a dense ``fp8_gemm_nt`` case with per-row 1x128 float32
    scales (decoded here from the inputs, independently of the package's model)."""
    a = np.asarray(case.inputs["a"]).astype(np.float64)
    b = np.asarray(case.inputs["b"]).astype(np.float64)
    k = a.shape[1]
    sa = np.repeat(np.asarray(case.inputs["a_sf"], np.float64), 128, axis=1)[:, :k]
    sb = np.asarray(case.inputs["b_sf"], np.float64)
    sb = np.repeat(np.repeat(sb, 128, axis=1), 128 if sb.shape[0] * 128 >= b.shape[0] > sb.shape[0] else 1,
                   axis=0)[:b.shape[0], :k]
    return (a * sa)[:, None, :] * (b * sb)[None, :, :]


def _f32_sum(terms: np.ndarray, order: str) -> np.ndarray:
    """Float32 sums over the last axis of float64 terms (each term rounded to float32 once)."""
    t = terms.astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        if order == "reversed":
            t = t[..., ::-1]
        if order in ("sequential", "reversed"):
            acc = np.zeros(t.shape[:-1], np.float32)
            for i in range(t.shape[-1]):
                acc = acc + t[..., i]
            return acc
        if order == "pairwise":
            while t.shape[-1] > 1:
                if t.shape[-1] % 2:
                    t = np.concatenate([t, np.zeros(t.shape[:-1] + (1,), np.float32)], axis=-1)
                t = t[..., 0::2] + t[..., 1::2]
            return t[..., 0] if t.shape[-1] else np.zeros(t.shape[:-1], np.float32)
        # blocked per 128 with promotion: each block summed in float32, then added to the total
        acc = np.zeros(t.shape[:-1], np.float32)
        for j in range(0, t.shape[-1], 128):
            part = np.zeros(t.shape[:-1], np.float32)
            for i in range(j, min(j + 128, t.shape[-1])):
                part = part + t[..., i]
            acc = acc + part
        return acc


_ORDERS = ("sequential", "reversed", "pairwise", "blocked")


@pytest.mark.slow  # seconds of adversarial cases in four summation orders: the slow step
@pytest.mark.parametrize("examples", [10])
def test_float32_orders_pass_on_adversarial(examples: int) -> None:
    @settings(max_examples=examples, deadline=None, derandomize=True, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(cases("fp8_gemm_nt", profile="sm100", values="adversarial"))
    def run(case: Case) -> None:
        _float32_orders_pass(case)

    run()


def _float32_orders_pass(case: Case) -> None:
    """Independent float32 sums of the case's exact products in every order of ``_ORDERS`` pass."""
    a, sa, sb = case.inputs["a"], case.inputs["a_sf"], case.inputs["b_sf"]
    k = a.shape[1]
    nb = -(-k // 128)
    ep = case.entry["check"]["epilogue"]
    assume(ep.get("out") == "bf16" and ep.get("alpha") is None and ep.get("c") is None)
    assume(np.asarray(sa).dtype == np.float32 and np.asarray(sb).dtype == np.float32)
    assume(sa.shape == (a.shape[0], nb) and sb.shape[1] == nb and a.shape[0] * a.shape[0] * k < 2_000_000)
    terms = _gemm_terms(case)
    for order in _ORDERS:
        with np.errstate(over="ignore", invalid="ignore"):
            out = _f32_sum(terms, order).astype(np.float64).astype(_BF16)
        cmp = case.compare({"d": out})
        assert cmp.ok, (order, cmp.message())


def _fp32_model_passes(kernel: str, values: str, examples: int, accumulation: object = "fp32",
                       sizes: dict[str, Any] | None = None, **options: object) -> None:
    @settings(max_examples=examples, deadline=None, derandomize=True, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(cases(kernel, values=values, **(sizes or {})))
    def run(case: Case) -> None:
        _assert_model_passes(case, accumulation, **options)

    run()


def _assert_model_passes(case: Case, accumulation: object = "fp32", **options: object) -> Any:
    """The emulator's ``accumulation`` model, run as the device on ``case``, passes its check."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with numerics(accumulation=accumulation):
            out = case.call()
    cmp = case.compare(out, **options)
    assert cmp.ok, cmp.message()
    return cmp


_FAST = ("fp8_gemm_nt", "bf16_gemm_tt", "m_grouped_fp8_gemm_nt_contiguous", "einsum", "tf32_hc_prenorm_gemm")
#: multi-stage families (their own range hooks: golden.ranges_mqa, golden.ranges_mega)
_MULTI_STAGE = ("fp8_fp4_mqa_logits", "fp8_fp4_paged_mqa_logits", "fp8_fp4_mega_moe", "bf16_mega_moe")


@pytest.mark.parametrize("kernel", _FAST)
def test_fp32_model_passes_on_adversarial(kernel: str) -> None:
    _fp32_model_passes(kernel, "adversarial", 4)


def test_repro_fp8_gemm_nt_sm100() -> None:
    """The issue's reproducer: the fp32 model on sm100 FP8 GEMMs with adversarial values."""

    @settings(max_examples=30, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(cases("fp8_gemm_nt", profile="sm100", values="adversarial"))
    def run(case: Case) -> None:
        _assert_model_passes(case)

    run()


def test_repro_mqa_sm100_seq9() -> None:
    """The issue's MQA reproducer: sm100, seq 9, seq_kv 9, heads 8, adversarial values (a head
    score overflows before its weight: device NaN / inf where the golden is finite or inf)."""
    # (fp4, seed): found by searching seeds with the hook off (each fails the single-stage rule alone)
    for fp4, dim, seed in ((True, 64, 5), (True, 128, 6), (False, 64, 0)):
        case = Case.from_spec({"id": f"mqa-repro-{seed}", "kernel": "fp8_fp4_mqa_logits", "profile": "sm100",
                               "seed": seed, "seq": 9, "seq_kv": 9, "heads": 8, "head_dim": dim, "fp4": fp4,
                               "values": "adversarial"})
        _assert_model_passes(case)


def test_mqa_nan_without_reachable_overflow_still_fails() -> None:
    """A NaN logit on normal values (no head score or head sum near the range) is a failure."""
    case = Case.from_spec({"id": "mqa-nan", "kernel": "fp8_fp4_mqa_logits", "profile": "sm100", "seed": 1,
                           "seq": 4, "seq_kv": 8, "heads": 8})
    out = np.array(case.golden()["logits"], copy=True)
    out[3, 2] = np.nan
    out[2, 1] = -np.inf
    cmp = case.compare({"logits": out})
    assert not cmp.ok


def test_mega_nan_without_reachable_overflow_still_fails() -> None:
    case = Case.from_spec({"id": "mega-nan", "kernel": "bf16_mega_moe", "profile": "sm100", "seed": 1,
                           "ranks": 2, "experts": 4, "topk": 2, "hidden": 256, "intermediate": 256, "tokens": 4})
    out = np.array(case.golden()["y"], copy=True)
    out[1, 2, 3] = np.nan
    cmp = case.compare({"y": out, "stats": np.array(case.golden()["stats"])})
    assert not cmp.ok


@pytest.mark.slow
@pytest.mark.parametrize("values", ["adversarial", "special"])
@pytest.mark.parametrize("kernel", __import__("deepgemm_ref.strategies", fromlist=["kernels"]).kernels())
def test_fp32_model_passes_every_family_slow(kernel: str, values: str) -> None:
    _fp32_model_passes(kernel, values, 4, sizes=_SURVEY_SIZES.get(kernel))


#: The slow survey's sizes for the kernels whose drawn cases take seconds (CI time: a Mega MoE case
#: is a whole layer; MQA's adversarial head scores fall back to exact rationals).
_SURVEY_SIZES: dict[str, dict[str, Any]] = {
    "fp8_fp4_mqa_logits": {"seq": st.integers(1, 8), "seq_kv": st.integers(1, 64)},
    "fp8_fp4_paged_mqa_logits": {"batch": st.integers(1, 2)},
    "bf16_mega_moe": {"ranks": st.integers(1, 2), "tokens": st.integers(1, 16)},
    "fp8_fp4_mega_moe": {"ranks": st.integers(1, 2), "tokens": st.integers(1, 16)},
}


# -- the rule itself, on hand-made elements --------------------------------------------------------

def _one(device: float, y: float, S: float, *, out: np.dtype = _BF16, n: int = 4) -> object:
    gd = np.array([[y]]).astype(out)
    golden = {"main": gd, "acc": np.array([[y]]), "S": np.array([[S]]), "defined": np.ones((1, 1), bool)}
    check = {"n": n, "epilogue": {"out": "bf16" if out == _BF16 else "f32"}}
    with np.errstate(over="ignore"):
        dev = np.array([[device]]).astype(out)
    return check_case("x", dev, golden, check, {}, CheckOptions())


def test_overflow_reach_from_S_and_y() -> None:
    y = np.array([0.0, 1e38, -3e38, 1.0])
    S = np.array([8e38, 1e38, 3e38, 1e39])
    up, dn = overflow_reach(y, S, 8, 2.0**-24, F32_MAX)
    assert up.tolist() == [True, False, False, True]
    assert dn.tolist() == [True, False, False, True]


def test_nan_allowed_only_where_both_overflows_are_reachable() -> None:
    rep = _one(np.nan, 0.0, 8e38)  # 4e38 of positive and of negative terms: inf - inf
    assert rep.status == "pass" and rep.range_allowed == 1 and rep.failed == 0
    assert "range: accumulator overflow allowed" in format_report([rep])
    rep = _one(np.nan, 2e38, 2.2e38)  # no -overflow reachable
    assert rep.status == "fail" and rep.special_mismatches == 1
    rep = _one(np.nan, 1.0, 3.0)  # nothing overflows
    assert rep.status == "fail"


def test_infinity_of_the_wrong_sign_fails() -> None:
    rep = _one(np.inf, 3.3e38, 3.6e38)  # 3.45e38 of positive terms: +inf allowed
    assert rep.status == "pass" and rep.range_allowed == 1
    rep = _one(-np.inf, 3.3e38, 3.6e38)  # only 1.5e37 of negative terms: -inf impossible
    assert rep.status == "fail" and rep.range_allowed == 0
    rep = _one(np.inf, 1.0, 2.0)  # no overflow anywhere
    assert rep.status == "fail"


def test_range_recorded_in_bound_and_json() -> None:
    rep = _one(np.nan, 0.0, 8e38)
    assert rep.bound["acc_max"] == F32_MAX
    assert rep.to_json()["range_allowed"] == 1
    rep = check_case("x", np.array([[np.nan]], _BF16),
                     {"main": np.array([[0.0]], _BF16), "acc": np.array([[0.0]]), "S": np.array([[8e38]]),
                      "defined": np.ones((1, 1), bool)},
                     {"n": 4, "epilogue": {"out": "bf16"}}, {}, CheckOptions(acc_max=1e39))
    assert rep.status == "fail"  # a wider accumulator cannot overflow there


def test_limited_13_128_passes_with_its_own_u_acc() -> None:
    """A Hopper-like 13-bit truncating accumulator, checked with u_acc = 2^-13 (docs/numerics.md)."""
    from deepgemm_ref.config import Limited

    @settings(max_examples=4, deadline=None, derandomize=True, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(cases("fp8_gemm_nt", profile="sm90", values="adversarial"))
    def run(case: Case) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            with numerics(accumulation=Limited(13, 128)):
                out = case.call()
        cmp = case.compare(out, u_acc=2.0**-13)
        assert cmp.ok, cmp.message()

    run()


# -- special values: the fp32 model and sm90's fmaxf ------------------------------------------------

def test_fp32_model_infinite_terms_follow_ieee() -> None:
    """A bf16 GEMM row whose block holds two +inf products (and finite ones): a float32 device sums
    +inf; the fp32 model's exact-block path once gave NaN (TwoSum of inf terms)."""
    from deepgemm_ref import core

    a = np.ones((1, 8), _BF16)
    b = np.full((1, 8), 0.5, _BF16)
    a[0, 2] = np.inf
    b[0, 5] = np.inf
    a[0, 3] = 3e38  # a finite product beyond 2^53 quanta: the non-certified path
    with np.errstate(invalid="ignore", over="ignore"):
        part = core._block_partials(a.astype(np.float64), b.astype(np.float64), False)
        assert part[0, 0] == np.inf
        b[0, 6] = -np.inf  # inf - inf
        assert np.isnan(core._block_partials(a.astype(np.float64), b.astype(np.float64), False)[0, 0])


def _sm90_nan_head_case() -> tuple[Case, np.ndarray, float]:
    """An sm90 MQA case with special values where a query head's score is NaN (an E4M3 NaN in q):
    the golden logit is NaN there; sm90's ``fmaxf(NaN, 0) = 0`` drops the head.  Returns the
    case, the fp32 model's logits and the logit without the NaN heads, computed here in float64."""
    case = Case.from_spec({"id": "mqa-sm90-nan", "kernel": "fp8_fp4_mqa_logits", "profile": "sm90", "seed": 0,
                           "seq": 1, "seq_kv": 1, "values": "special", "value_draw": "position"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with numerics(accumulation="fp32"):
            out = np.array(case.call()["logits"], copy=True)
        qq = np.asarray(case.inputs["q"]).astype(np.float64)[0]  # (H, D)
        kv = np.asarray(case.inputs["kv"]).astype(np.float64)[0]
        x = qq @ kv
    assert np.isnan(x).any() and np.isfinite(kv).all()
    s = float(np.asarray(case.inputs["kv_sf"], np.float64)[0])
    w = np.asarray(case.inputs["w"], np.float64)[0]
    r = np.where(np.isnan(x), 0.0, np.maximum(x, 0.0))
    return case, out, float(np.sum(w * r) * s)


def test_sm90_fmaxf_drops_a_nan_head() -> None:
    case, out, y_alt = _sm90_nan_head_case()
    g = np.asarray(case.golden()["logits"], np.float64)
    assert np.isnan(g[0, 0]) and np.isfinite(out[0, 0])
    assert abs(out[0, 0] - y_alt) <= 1e-5 * (1 + abs(y_alt))  # the independent float64 value
    cmp = case.compare({"logits": out})
    assert cmp.ok, cmp.message()


def test_sm90_wrong_value_where_golden_is_nan_fails() -> None:
    case, out, y_alt = _sm90_nan_head_case()
    out[0, 0] = np.float32(y_alt * 1.5 + 1.0)
    assert not case.compare({"logits": out}).ok



@pytest.mark.parametrize("spec", [
    {"kernel": "fp8_fp4_paged_mqa_logits", "seed": 1283766128, "batch": 5, "heads": 64, "head_dim": 32,
     "row_offsets": [204, 118, 967, 111]},  # NaN head dropped, another head -inf after the KV scale
    {"kernel": "fp8_fp4_mqa_logits", "seed": 1830, "seq": 31, "seq_kv": 171, "heads": 64,
     "row_offsets": [528, 618, 172, 375]},  # NaN head dropped, an infinite head left: +inf
])
def test_sm90_special_nan_heads_dropped(spec: dict) -> None:
    """Found by the slow every-family survey: sm90 drops a NaN head (``fmaxf``) and the other
    heads hold an infinity, so the device's logit is that infinity where the golden is NaN."""
    case = Case.from_spec({"id": "sm90-special", "profile": "sm90", "values": "special", "value_draw": "position",
                           **spec})
    cmp = _assert_model_passes(case)
    assert sum(r.range_allowed for r in cmp.reports) > 0


def _mega_scan_case(seed: int, **params: object) -> tuple[Case, dict]:
    """An sm100 FP8 Mega MoE case with adversarial values drawn by position, and the fp32 model's outputs."""
    case = Case.from_spec({"id": f"scan-{seed}", "kernel": "fp8_fp4_mega_moe", "profile": "sm100", "seed": seed,
                           "values": "adversarial", "value_draw": "position", **params})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with numerics(accumulation="fp32"):
            out = case.call()
    return case, out


@pytest.mark.parametrize("seed", [92, 174])
def test_mega_fp32_model_l1_cancellation(seed: int) -> None:
    """sm100 FP8 Mega MoE, default shape, adversarial values: seed 174 flips one E4M3 activation
    (11 -> 10) through a one-bf16-step L1 difference (|L1| 1.54, l1.S 176); seed 92 turns an L1
    output's sign (exact -2.27e7, float32 +6.29e6; clamped to -10 / +10 by SwiGLU's clamp).  Both
    fall outside E_hard and inside the stage-propagated bound: warnings, not failures."""
    case, out = _mega_scan_case(seed)
    cmp = case.compare(out)
    assert cmp.ok, cmp.message()
    y = next(r for r in cmp.reports if r.id.endswith("/y"))
    assert y.status == "warn" and y.stage_warned > 0 and y.failed == 0
    assert "within the stage-propagated bound" in format_report(cmp.reports)
    # without the allowance these elements fail (the hook is what lets them through)
    gold = case.golden()
    plain = check_case("y", out["y"], {"main": gold["y"], "acc": gold["acc"], "S": gold["S"],
                                       "S_hard": gold["S_hard"], "defined": gold["defined"]},
                       case.entry["check"], case.inputs, CheckOptions())
    assert plain.failed >= y.stage_warned


def test_mega_activation_deviation_covers_sampled_devices() -> None:
    """Independent check of the interval propagation: device L1 values drawn inside
    [bf16(acc - gamma S), bf16(acc + gamma S)] (ends included), through the clamp, the fp32
    model's SwiGLU and the package's re-quantisation: every activation stays within ``dev``."""
    from deepgemm_ref import formats as fm
    from deepgemm_ref.exact import gamma
    from deepgemm_ref.golden.ranges_mega import activation_deviation
    from deepgemm_ref.mega import _swiglu as sw

    case = Case.from_spec({"id": "dev", "kernel": "fp8_fp4_mega_moe", "profile": "sm100", "seed": 174,
                           "values": "adversarial", "value_draw": "position"})
    g = case.golden()
    rng = np.random.default_rng(0)
    for r in range(2):
        k = f"extra.rank{r}."
        acc, S = g[k + "l1.acc"], g[k + "l1.S"]
        keep = np.all(np.isfinite(acc) & np.isfinite(S), axis=1) & (np.abs(acc).max(axis=1) < 1e30)
        acc, S = acc[keep], S[keep]
        w = g[k + "dispatch.topk_weights"][keep]
        acts, sf = g[k + "l2.acts"][keep], g[k + "l2.acts_sf"][keep]
        gam = gamma(512, 2.0**-24, unbounded=True)
        dev = activation_deviation(acc, S, gam, w, acts, sf, 10.0, "cuda")
        a = np.asarray(acts).astype(np.float64) * np.repeat(np.ldexp(1.0, sf.astype(np.int64) - 127), 32, axis=1)
        lo = fm.decode(fm.encode(np.nextafter(acc - gam * S * (1 + 2.0**-40), -np.inf), fm.BF16, fm.IEEE_RNE), fm.BF16)
        hi = fm.decode(fm.encode(np.nextafter(acc + gam * S * (1 + 2.0**-40), np.inf), fm.BF16, fm.IEEE_RNE), fm.BF16)
        assert np.count_nonzero(dev > 0) > 0  # the case has activations that can move
        for trial in range(6):
            pick = lo if trial == 0 else hi if trial == 1 else np.where(rng.random(lo.shape) < 0.5, lo, hi)
            h = pick.astype(np.float32)
            gg, uu = sw.clamp(h[:, :512], h[:, 512:], 10.0, bf16_clamp=True)
            with np.errstate(all="ignore"):
                v = sw.swiglu_fp32(gg, uu, w.astype(np.float32).reshape(-1, 1), True)
                q, b = sw.requantize(v, "cuda")
            dq = fm.decode(q, fm.E4M3) * np.repeat(np.ldexp(1.0, b.astype(np.int64) - 127), 32, axis=1)
            ok = np.isfinite(dq)
            assert np.all(np.abs(dq - a)[ok] <= dev[ok]), trial


def test_mega_allowance_near_zero_on_normal_values() -> None:
    """Where no interval crosses a rounding boundary the allowance is 0: on normal values it is
    nonzero at a handful of elements at most, and small there."""
    from deepgemm_ref.golden.check import error_bounds, family_range

    for kernel in ("fp8_fp4_mega_moe", "bf16_mega_moe"):
        case = Case.from_spec({"id": "n", "kernel": kernel, "profile": "sm100", "seed": 3})
        g = case.golden()
        hook = family_range(case.entry, g, case.inputs, "y")
        A = hook.allowance(np.arange(g["y"].size), 2.0**-8, 2).reshape(g["y"].shape)
        _, E_hard = error_bounds(g["S"], g["S_hard"], g["acc"], 0.0, case.entry["check"], CheckOptions(), 2, 2.0**-8)
        assert np.count_nonzero(A) <= A.size // 1000 and np.all(A <= E_hard), kernel


@pytest.mark.parametrize("values", ["normal", "adversarial"])
def test_mega_wrong_devices_still_fail(values: str) -> None:
    """A wrong route weight, a wrong expert and a doubled input scale on one slot of a token still
    fail, on normal values and on the adversarial case whose allowance is largest (seed 92); the
    token is one whose allowance is finite."""
    from deepgemm_ref.golden.check import family_range

    case = Case.from_spec({"id": "w", "kernel": "fp8_fp4_mega_moe", "profile": "sm100", "seed": 92,
                           "values": values, "value_draw": "position"})
    g = case.golden()
    hook = family_range(case.entry, g, case.inputs, "y")
    A = hook.allowance(np.arange(g["y"].size), 2.0**-8, 2).reshape(g["y"].shape)
    idx = np.asarray(case.inputs["topk_idx.1"])
    ok_tok = [t for t in range(idx.shape[0]) if idx[t, 0] >= 0 and np.all(np.isfinite(A[1, t]))
              and np.all(np.isfinite(np.asarray(g["y"][1, t], np.float64)))]
    t = ok_tok[0]

    def scaled_weight(inp: dict) -> None:
        inp["topk_weights.1"][t, 0] *= 1.1

    def wrong_expert(inp: dict) -> None:
        inp["topk_idx.1"][t, 0] = (idx[t, 0] + 1) % 4

    def doubled_scale(inp: dict) -> None:
        by = inp["x_sf.1"].view(np.uint8).reshape(inp["x_sf.1"].shape[0], -1)
        by[t, :] += 1  # every UE8M0 scale of the token's row doubled

    for edit in (scaled_weight, wrong_expert, doubled_scale):
        inputs = {k: np.array(v, copy=True) for k, v in case.inputs.items()}
        edit(inputs)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            out = Case(case.spec, case.entry, inputs).call(accumulation="fp32")
        cmp = case.compare({"y": out["y"], "stats": np.array(g["stats"])})
        y = next(r for r in cmp.reports if r.id.endswith("/y"))
        assert y.status == "fail" and y.failed > 0, (edit.__name__, cmp.message())
