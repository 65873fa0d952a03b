"""deepgemm_ref.strategies: valid cases of every kernel under every profile, in every value mode,
that pass on the emulator and fail, shrunk and explained, on broken stand-ins."""

from __future__ import annotations

import collections

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import deepgemm_ref as dg
from deepgemm_ref import DGArgumentError, strategies
from deepgemm_ref.golden.cases import FAMILIES, validate_spec
from deepgemm_ref.strategies import cases, kernels, specs
from deepgemm_ref.testing import assert_matches_golden

from .standin import DROPS_K_BLOCK, FLUSHES_NAN, K_GROUPED_DROPS_C, MQA_NO_KV_SCALE, SKIPS_GROUP, TRUNCATES, WRONG_SCALE

KERNELS = kernels()
QUICK = settings(max_examples=3, deadline=None, database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
#: A test parametrized with ``full``: the default run draws small sizes (``_small``), the ``slow``
#: run draws the strategy's whole size range, with the same examples count and assertions.
FULL = pytest.mark.parametrize("full", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["small", "full"])
#: Both sizes in the slow run (default-run time: tests/test_shrinking.py proves shrinking by default).
SLOW_BOTH = pytest.mark.parametrize("full", [pytest.param(False, marks=pytest.mark.slow),
                                             pytest.param(True, marks=pytest.mark.slow)], ids=["small", "full"])
#: Sizes for the default run of the kernels whose drawn cases can take seconds at full size
#: (DeepGEMM-Ascend's MQA head scores on adversarial values fall back to exact rationals, at a cost
#: that grows fastest with the number of heads; a Mega MoE case is a whole layer): the same
#: profiles, value modes and other keys, at sizes that take milliseconds (_quick_cases).
#: test_the_emulator_matches_its_goldens_many (slow) draws the full range.
SMALL = {
    "fp8_fp4_mqa_logits": {"seq": st.integers(1, 4), "seq_kv": st.integers(1, 24)},
    "fp8_fp4_paged_mqa_logits": {"batch": st.integers(1, 2)},
    "bf16_mega_moe": {"ranks": st.integers(1, 2), "tokens": st.integers(1, 8)},
    "fp8_fp4_mega_moe": {"ranks": st.integers(1, 2), "tokens": st.integers(1, 8)},
}
SMALL_ASCEND_MQA_HEADS = st.sampled_from([4, 8])


def _quick_cases(kernel: str, values: str = "normal") -> st.SearchStrategy[strategies.Case]:
    """cases(kernel, values=values) for the default run: SMALL's sizes, and at most 8 heads for
    the MQA kernels under ascend950 (every profile drawn, as cases() draws them)."""
    small = SMALL.get(kernel, {})
    if kernel not in ("fp8_fp4_mqa_logits", "fp8_fp4_paged_mqa_logits"):
        return cases(kernel, values=values, **small)
    return st.one_of(*(cases(kernel, profile=p, values=values, **small,
                             **({"heads": SMALL_ASCEND_MQA_HEADS} if p == "ascend950" else {}))
                       for p in _profiles(kernel)))


def _small(**caps: int) -> dict[str, st.SearchStrategy[int]]:
    """Size keys drawn from 1 up to a cap (values the schema refuses are moved up to the next it accepts)."""
    return {k: st.integers(1, v) for k, v in caps.items()}


def test_kernels_are_the_golden_families_kernels():
    want = {k for f in FAMILIES.values() if not f.explicit for k in f.kernels}
    assert set(KERNELS) == want and len(KERNELS) == len(want)
    assert {"fp8_gemm_nt", "m_grouped_fp8_gemm_nt_masked", "k_grouped_fp8_gemm_tn_contiguous", "fp8_einsum",
            "fp8_fp4_paged_mqa_logits", "fp8_fp4_mega_moe", "tf32_hc_prenorm_gemm"} <= set(KERNELS)


@pytest.mark.parametrize("examples", [20, pytest.param(60, marks=pytest.mark.slow)])
@pytest.mark.parametrize("kernel", KERNELS)
def test_every_drawn_spec_is_valid_for_the_schema(kernel, examples):
    profiles = _profiles(kernel)
    seen_profiles = set()

    @settings(max_examples=examples, deadline=None, database=None)
    @given(spec=specs(kernel))
    def check(spec):
        parsed = validate_spec(spec)
        assert parsed.kernel == kernel and parsed.profile in profiles
        assert parsed.to_dict() == spec  # canonical already: to_spec round-trips
        seen_profiles.add(parsed.profile)

    check()
    assert seen_profiles == set(profiles)  # profile=None draws among every profile providing it


def _profiles(kernel):
    from deepgemm_ref.golden.cases import family_of

    return FAMILIES[family_of(kernel)].schema.kernels[kernel]


@pytest.mark.parametrize("kernel", KERNELS)
def test_the_emulator_matches_its_goldens_on_normal_cases(kernel):
    @QUICK
    @given(case=_quick_cases(kernel))
    def check(case):
        assert case.values == "normal" and "values" not in case.to_spec()
        assert_matches_golden(case, case.call())

    check()


# "special" in the slow run only (default-run time); its "many" variant there draws more examples
@pytest.mark.parametrize("values", ["adversarial", pytest.param("special", marks=pytest.mark.slow)])
@pytest.mark.parametrize("kernel", KERNELS)
def test_the_emulator_matches_its_goldens_on_adversarial_and_special_cases(kernel, values):
    @settings(max_examples=2, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
    @given(case=_quick_cases(kernel, values))
    def check(case):
        assert case.values == values and case.to_spec()["values"] == values
        assert_matches_golden(case, case.call())

    check()


@pytest.mark.slow
@pytest.mark.parametrize("values", ["normal", "adversarial", "special"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_the_emulator_matches_its_goldens_many(kernel, values):
    """The two tests above over the strategy's whole size range, 12 examples each (4 for the MQA
    and Mega MoE kernels, whose cases at full size take seconds each: CI time)."""
    @settings(max_examples=4 if kernel in SMALL else 12, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(case=cases(kernel, values=values))
    def check(case):
        assert case.values == values and case.to_spec().get("values", "normal") == values
        assert_matches_golden(case, case.call())

    check()


def test_every_key_of_the_schema_is_drawn():
    """Each categorical key of fp8_fp4_gemm_nt under sm100 takes each of its allowed values."""
    values = collections.defaultdict(set)

    @settings(max_examples=300, deadline=None, database=None)
    @given(spec=specs("fp8_fp4_gemm_nt", profile="sm100"))
    def collect(spec):
        p = validate_spec(spec).resolved
        for key in ("a", "b", "gran_k_a", "gran_k_b", "gran_n", "out", "c"):
            values[key].add(p[key])
        values["alpha"].add(p["alpha"] is None)
        values["m"].add(p["m"])

    collect()
    assert values["a"] == {"fp8", "fp4"} and values["b"] == {"fp8", "fp4"}
    assert values["gran_n"] == {1, 128} and values["out"] == {"bf16", "f32"}
    assert values["c"] == {"none", "separate", "is_d"} and values["alpha"] == {True, False}
    assert values["gran_k_a"] == {32, 128} and len(values["m"]) > 20


def test_adversarial_values_cover_ties_cancellation_and_the_scale_range():
    c = strategies.Case.from_spec({"id": "adv", "kernel": "fp8_gemm_nt", "profile": "sm100", "m": 256, "n": 256,
                                   "k": 512, "values": "adversarial"})
    sf = np.concatenate([c.inputs["a_sf"].ravel(), c.inputs["b_sf"].ravel()])
    exps = np.log2(sf[sf > 0]).astype(int)
    assert exps.min() < -100 and exps.max() > 50  # scale factors across the UE8M0 range
    g = c.golden()
    d = g["d"].astype(np.float64)
    finite = np.isfinite(d)
    assert np.any(np.isinf(d)) and finite.mean() > 0.9  # a few overflow, most are finite
    assert np.any((g["acc"] == 0) & (g["S"] > 0))  # exact cancellation
    y = g["acc"][finite & (g["acc"] != 0)]
    mant, _ = np.frexp(y)
    assert np.any(np.ldexp(mant, 9) % 2 == 1)  # bf16 ties: halfway between two bf16 neighbours
    b = strategies.Case.from_spec({"id": "adv", "kernel": "bf16_gemm_nt", "profile": "sm100", "m": 256, "n": 256,
                                   "k": 64, "values": "adversarial"})
    db = b.golden()["d"].astype(np.float64)
    assert np.any((db != 0) & (np.abs(db) < 2.0**-126))  # subnormal results
    assert np.any(np.isfinite(db) & (np.abs(db) > 2.0**120))  # results next to the saturation bound


def test_special_values_hold_nan_infinities_and_signed_zeros():
    c = strategies.Case.from_spec({"id": "sp", "kernel": "bf16_gemm_nt", "profile": "sm100", "m": 64, "n": 64,
                                   "values": "special", "seed": 1})
    a = np.concatenate([c.inputs["a"].astype(np.float32).ravel(), c.inputs["b"].astype(np.float32).ravel()])
    assert np.isnan(a).any() or np.isinf(a).any() or np.any((a == 0) & np.signbit(a))
    q = strategies.Case.from_spec({"id": "sp", "kernel": "fp8_gemm_nt", "profile": "sm100", "values": "special"})
    assert np.isnan(q.inputs["a"].astype(np.float32)).any() or np.isnan(q.inputs["b"].astype(np.float32)).any()
    assert np.isfinite(q.inputs["a_sf"]).all()  # scale factors hold no specials


@pytest.mark.parametrize("name,strategy_kw,check", [
    ("num_groups", {"num_groups": 2}, lambda p: p["groups"] == 2),
    ("groups", {"groups": 5}, lambda p: p["groups"] == 5),
    ("use_psum_layout", {"use_psum_layout": False}, lambda p: p["layout"] == "m_indices"),
])
def test_grouped_names_map_to_schema_keys(name, strategy_kw, check):
    @QUICK
    @given(spec=specs("m_grouped_fp8_gemm_nt_contiguous", profile="sm100", **strategy_kw))
    def run(spec):
        assert check(validate_spec(spec).resolved)

    run()


@pytest.mark.torch
def test_gemm_names_map_to_schema_keys():
    torch = pytest.importorskip("torch", reason="DeepGEMM's names carry torch dtypes")

    @settings(max_examples=15, deadline=None, database=None)
    @given(spec=specs("fp8_gemm_nt", profile="sm100", with_c=True, recipe=(1, 128, 128), out_dtype=torch.float32,
                      m=16, seed=3))
    def run(spec):
        p = validate_spec(spec).resolved
        assert p["c"] in ("separate", "is_d") and (p["gran_n"], p["gran_k_a"], p["gran_k_b"]) == (128, 128, 128)
        assert p["out"] == "f32" and p["m"] == 16 and spec["seed"] == 3

    run()

    @QUICK
    @given(spec=specs("fp8_gemm_nt", profile="sm100", with_c=False, a_dtype="float8_e4m3fn", k=st.sampled_from([64, 96])))
    def run2(spec):
        p = validate_spec(spec).resolved
        assert p["c"] == "none" and p["a"] == "fp8" and p["k"] in (64, 96)

    run2()


def test_mqa_and_mega_moe_names():
    @QUICK
    @given(spec=specs("fp8_fp4_mqa_logits", profile="sm100", num_heads=16, seq_len=8))
    def mqa(spec):
        p = validate_spec(spec).resolved
        assert p["heads"] == 16 and p["seq"] == 8

    mqa()

    @QUICK
    @given(spec=specs("bf16_mega_moe", num_experts=4, num_topk=2, num_ranks=1))
    def moe(spec):
        p = validate_spec(spec).resolved
        assert (p["experts"], p["topk"], p["ranks"]) == (4, 2, 1)

    moe()


@pytest.mark.parametrize("call,message", [
    (lambda: cases("no_such_kernel"), "unknown kernel 'no_such_kernel'"),
    (lambda: cases("fp8_gemm_nn", profile="sm90"), "fp8_gemm_nn is not provided under 'sm90'"),
    (lambda: cases("fp8_gemm_nt_skip_head_mid", profile="ascend950"), "DeepGEMM-Ascend does not export it"),
    (lambda: cases("fp8_gemm_nt", profile="sm101"), "profile: expected one of 'sm90', 'sm100', 'ascend950'"),
    (lambda: cases("fp8_gemm_nt", bogus=1), "unknown parameter 'bogus'"),
    (lambda: cases("fp8_gemm_nt", num_grups=2), "unknown parameter 'num_grups'"),
    (lambda: cases("fp8_gemm_nt", m=0), "m: expected an integer in [1, 2^31 - 1]; got 0"),
    (lambda: cases("fp8_gemm_nt", m=1.5), "m: expected an integer"),
    (lambda: cases("fp8_gemm_nt", out="f16"), "out: expected one of 'bf16', 'f32'; got 'f16'"),
    (lambda: cases("fp8_fp4_gemm_nt", profile="sm90", a="fp4"), "sm90 takes E4M3 operands only"),
    (lambda: cases("aclnn_fp8_fp4_gemm_nt", k=100), "no valid case under any of ascend950 has k=100"),
    (lambda: cases("fp8_gemm_nt", values="weird"), "values: expected one of 'normal', 'adversarial', 'special'"),
    (lambda: cases("fp8_gemm_nt", major_a="mn"), "fixes its operands' major-ness"),
    (lambda: cases("fp8_gemm_nt", with_c="yes"), "with_c: expected True or False"),
    (lambda: cases("fp8_gemm_nt", seed=-1), "seed: expected an integer"),
    (lambda: cases("einsum", with_c=True), "unknown parameter 'with_c'"),
    (lambda: cases("fp8_fp4_mqa_logits", profile="ascend950", clean=False), "'clean' is not read by"),
])
def test_bad_arguments_raise_at_construction(call, message):
    with pytest.raises(DGArgumentError) as err:
        call()  # no draw happens
    assert message in str(err.value)
    assert str(err.value).startswith("cases:")


def test_did_you_mean_for_a_near_kernel():
    with pytest.raises(DGArgumentError, match="did you mean .fp8_gemm_tn."):
        cases("fp8_gemm_tn_")


# ----------------------------------------------------------------------------------------------
# broken stand-ins: the property fails, shrinks to a small example and says what is wrong
# ----------------------------------------------------------------------------------------------

def _falsify(strategy, module, **kw):
    """Run a property test of ``module`` and return (its AssertionError message, the shrunk case)."""
    found = []

    @settings(max_examples=80, deadline=None, database=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow])
    @given(case=strategy)
    def prop(case):
        found.append(case)
        assert_matches_golden(case, case.call(module), **kw)

    with pytest.raises(AssertionError) as err:
        prop()
    notes = "\n".join(getattr(err.value, "__notes__", []))
    return str(err.value), notes


@FULL
def test_a_kernel_that_drops_a_k_block_fails_shrunk_to_k_129(full):
    sizes = {} if full else _small(m=8, n=8, k=256)
    msg, notes = _falsify(cases("fp8_gemm_nt", profile="sm100", gran_k_a=128, gran_k_b=128, **sizes), DROPS_K_BLOCK)
    assert "fp8_gemm_nt under sm100 does not match its golden values" in msg
    assert "(m=1 n=1 k=129;" in msg  # the smallest shape that has a second K block
    assert "worst 1 of them" in msg and "allowed [" in msg and "ULPs" in msg
    assert "Case.from_spec(" in notes and "'k': 129" in notes  # hypothesis' falsifying example


def test_a_kernel_with_the_wrong_scale_fails_shrunk_to_two_rows():
    msg, _ = _falsify(cases("fp8_gemm_nt", profile="sm90"), WRONG_SCALE)
    assert "fp8_gemm_nt under sm90 does not match" in msg and "(m=2 n=1 k=1;" in msg


@FULL
def test_a_kernel_that_truncates_its_output_fails_on_a_tiny_case(full):
    sizes = {} if full else _small(m=8, n=8, k=16)
    msg, _ = _falsify(cases("bf16_gemm_nt", profile="sm100", out="bf16", c="none", alpha=None, **sizes), TRUNCATES)
    assert "bf16_gemm_nt under sm100 does not match" in msg
    line = next(x for x in msg.splitlines() if x.strip().startswith("at ("))
    assert "ULPs 1" in line  # one bf16 step below the correctly rounded value
    shape = msg.split("(m=")[1].split(";")[0]
    m, n, k = (int(t.split("=")[-1]) for t in ("m=" + shape).split())
    assert m * n * k <= 4


def test_a_grouped_kernel_that_skips_its_last_group_fails():
    msg, _ = _falsify(cases("m_grouped_bf16_gemm_nt_contiguous", profile="sm100"), SKIPS_GROUP)
    assert "m_grouped_bf16_gemm_nt_contiguous under sm100 does not match" in msg and "groups=1" in msg


@pytest.mark.slow  # a hypothesis search over special values (seconds): the slow step
def test_a_kernel_that_flushes_nan_fails_with_a_class_mismatch():
    msg, _ = _falsify(cases("bf16_gemm_nt", profile="sm100", values="special"), FLUSHES_NAN)
    assert "class mismatch (finite where the golden value is NaN)" in msg


@SLOW_BOTH
def test_an_mqa_kernel_that_drops_the_kv_scale_fails_shrunk_to_one_query_and_one_key(full):
    sizes = {} if full else _small(seq=4, seq_kv=24)
    msg, notes = _falsify(cases("fp8_fp4_mqa_logits", profile="sm100", fp4=False, **sizes), MQA_NO_KV_SCALE)
    assert "fp8_fp4_mqa_logits under sm100 does not match its golden values" in msg
    assert "(seq=1 seq_kv=1 " in msg and "output 'logits' (1, 1) float32: 1 of 1 checked element fails" in msg
    assert "'seq': 1, 'seq_kv': 1" in notes


@SLOW_BOTH
def test_a_k_grouped_kernel_that_loses_c_fails_shrunk_to_one_group(full):
    sizes = {} if full else _small(groups=3, m=32, n=32, k=64)
    msg, _ = _falsify(cases("k_grouped_fp8_gemm_tn_contiguous", profile="sm100", **sizes), K_GROUPED_DROPS_C)
    assert "k_grouped_fp8_gemm_tn_contiguous under sm100 does not match its golden values" in msg
    assert "(groups=1 m=4 n=4 k=1;" in msg and "16 of 16 checked elements fail" in msg


@FULL
def test_the_same_properties_pass_on_the_correct_kernels(full):
    """The strategies of the tests above (small: with the same size caps) pass on deepgemm_ref."""
    def sizes(**caps):
        return {} if full else _small(**caps)

    for strategy in (cases("fp8_gemm_nt", profile="sm100", gran_k_a=128, gran_k_b=128, **sizes(m=8, n=8, k=256)),
                     cases("fp8_gemm_nt", profile="sm90"),
                     cases("m_grouped_bf16_gemm_nt_contiguous", profile="sm100"),
                     cases("fp8_fp4_mqa_logits", profile="sm100", fp4=False, **sizes(seq=4, seq_kv=24)),
                     cases("k_grouped_fp8_gemm_tn_contiguous", profile="sm100", **sizes(groups=3, m=32, n=32, k=64))):
        @settings(max_examples=10, deadline=None, database=None)
        @given(case=strategy)
        def prop(case):
            assert_matches_golden(case, case.call(dg))

        prop()


# ----------------------------------------------------------------------------------------------
# the pieces, used with the kernels
# ----------------------------------------------------------------------------------------------

BF16 = np.dtype(ml_dtypes.bfloat16)


def _bf16(rng, *shape):
    return rng.standard_normal(shape, dtype=np.float32).astype(BF16)


@settings(max_examples=20, deadline=None)
@given(layout=strategies.m_indices(3, alignment=128, max_rows=200), data=st.data())
def test_m_indices_drive_the_contiguous_kernel(layout, data):
    assert layout.dtype == np.int32 and layout.size % 128 == 0
    for g in range(3):
        rows = np.flatnonzero(layout == g)
        if rows.size:
            assert rows[0] % 128 == 0 and np.all(np.diff(rows) == 1)
    if layout.size == 0:
        return
    rng = np.random.default_rng(data.draw(st.integers(0, 9)))
    a, b = _bf16(rng, layout.size, 64), _bf16(rng, 3, 32, 64)
    a[layout < 0] = 0
    d = np.zeros((layout.size, 32), BF16)
    dg.m_grouped_bf16_gemm_nt_contiguous(a, b, d, layout)
    for g in range(3):
        rows = layout == g
        dense = np.zeros((int(rows.sum()), 32), BF16)
        if rows.any():
            dg.bf16_gemm_nt(a[rows], b[g], dense)
            assert np.array_equal(d[rows].view(np.uint16), dense.view(np.uint16))


@settings(max_examples=20, deadline=None)
@given(ends=strategies.psum_layouts(3, alignment=128, max_rows=150))
def test_psum_layouts_drive_the_contiguous_kernel(ends):
    assert ends.dtype == np.int32 and np.all(np.diff(ends) >= 0)
    m = -(-int(ends[-1]) // 128) * 128
    if m == 0:
        return
    rng = np.random.default_rng(1)
    a, b = _bf16(rng, m, 64), _bf16(rng, 3, 16, 64)
    d = np.zeros((m, 16), BF16)
    dg.m_grouped_bf16_gemm_nt_contiguous(a, b, d, ends, use_psum_layout=True)
    start = 0
    for g, end in enumerate(ends.tolist()):
        if end > start:
            dense = np.zeros((end - start, 16), BF16)
            dg.bf16_gemm_nt(a[start:end], b[g], dense)
            assert np.array_equal(d[start:end].view(np.uint16), dense.view(np.uint16))
        start = -(-end // 128) * 128


@settings(max_examples=20, deadline=None)
@given(masked=strategies.masked_m(4, 48))
def test_masked_m_drives_the_masked_kernel(masked):
    assert masked.dtype == np.int32 and masked.min() >= 0 and masked.max() <= 48
    rng = np.random.default_rng(2)
    a, b = _bf16(rng, 4, 48, 64), _bf16(rng, 4, 16, 64)
    d = np.zeros((4, 48, 16), BF16)
    dg.m_grouped_bf16_gemm_nt_masked(a, b, d, masked, 32)
    for g in range(4):
        rows = int(masked[g])
        if rows:
            dense = np.zeros((rows, 16), BF16)
            dg.bf16_gemm_nt(a[g, :rows], b[g], dense)
            assert np.array_equal(d[g, :rows].view(np.uint16), dense.view(np.uint16))


@settings(max_examples=20, deadline=None)
@given(ks=strategies.k_grouped_sizes(3, alignment=128, max_k=384))
def test_k_grouped_sizes_with_empty_groups_drive_the_kernel(ks):
    assert all(k % 128 == 0 and 0 <= k <= 384 for k in ks)
    total = sum(ks)
    if total == 0:
        return
    rng = np.random.default_rng(3)
    a, b = _bf16(rng, total, 8), _bf16(rng, total, 16)
    c = rng.standard_normal((3, 8, 16), dtype=np.float32)
    d = c.copy()
    dg.k_grouped_bf16_gemm_tn_contiguous(a, b, d, ks, np.array(ks, np.int32), d)
    start = 0
    for g, k in enumerate(ks):
        if k == 0:
            assert np.array_equal(d[g], c[g])  # an empty group keeps c
        start += k


@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_context_lens_and_block_tables(data):
    lens = data.draw(strategies.context_lens(4, max_len=300))
    table, num_blocks = data.draw(strategies.block_tables(lens, 64, spare_blocks=2))
    pages = [-(-int(n) // 64) for n in lens]
    assert lens.dtype == np.int32 and table.dtype == np.int32 and table.shape == (4, max(pages))
    used = np.concatenate([table[i, :p] for i, p in enumerate(pages)])
    assert used.size == len(set(used.tolist())) == sum(pages) and used.max(initial=0) < num_blocks
    assert num_blocks == sum(pages) + 2


@settings(max_examples=30, deadline=None)
@given(route=strategies.topk(6, 8, 3))
def test_topk_routing(route):
    idx, w = route
    assert idx.shape == w.shape == (6, 3) and idx.dtype == np.int64 and w.dtype == np.float32
    for row, wr in zip(idx, w, strict=True):
        live = row[row >= 0]
        assert len(set(live.tolist())) == live.size and np.all(live < 8)
        assert np.all(wr[row < 0] == 0) and np.all((wr[row >= 0] > 0) & (wr[row >= 0] <= 1))


@settings(max_examples=20, deadline=None)
@given(sf=strategies.scales((4, 8)), packed=strategies.scales((4, 8), packed="int32"),
       pairs=strategies.scales((4, 8), packed="int16"), plain=strategies.scales(5, ue8m0=False))
def test_scales(sf, packed, pairs, plain):
    bits = sf.view(np.uint32)
    assert sf.dtype == np.float32 and np.all(bits & 0x807FFFFF == 0)  # powers of two
    assert np.all(((bits >> 23) >= 1) & ((bits >> 23) <= 248))
    assert packed.shape == (4, 2) and packed.dtype == np.int32 and pairs.shape == (4, 4) and pairs.dtype == np.int16
    assert np.all((packed.view(np.uint8) >= 1) & (packed.view(np.uint8) <= 248))
    assert plain.shape == (5,) and np.all(plain > 0)


@settings(max_examples=10, deadline=None)
@given(sfb=strategies.scales((96, 2), min_exponent=-10, max_exponent=10))
def test_scales_drive_a_kernel(sfb):
    case = strategies.Case.from_spec({"id": "s", "kernel": "fp8_gemm_nt", "profile": "sm100", "m": 16, "n": 96,
                                      "k": 256})
    a, sfa, b = case.inputs["a"], case.inputs["a_sf"], case.inputs["b"]
    d = np.zeros((16, 96), BF16)
    dg.fp8_gemm_nt((a, sfa), (b, sfb), d)
    ref = (a.astype(np.float64) * np.repeat(sfa, 128, 1)) @ (b.astype(np.float64) * np.repeat(sfb, 128, 1)).T
    assert np.allclose(d.astype(np.float64), ref, rtol=2**-7, atol=1e-30)


def test_piece_arguments_are_checked():
    with pytest.raises(DGArgumentError, match="strategies.m_indices"):
        strategies.m_indices(0)
    with pytest.raises(DGArgumentError, match="k: expected at most num_experts"):
        strategies.topk(4, 2, 3)
    with pytest.raises(DGArgumentError, match="multiple of 4"):
        strategies.scales((2, 3), packed="int32")


def test_shapes():
    @QUICK
    @given(shape=strategies.shapes("m_grouped_fp8_gemm_nt_masked", profile="sm100", num_groups=2))
    def run(shape):
        assert set(shape) == {"groups", "m", "n", "k", "max_m"} and shape["groups"] == 2

    run()
