"""deepgemm_ref.exact (error-free transformations, round-to-odd, bounded sums) and
deepgemm_ref.certified (the one certified rounding routine), against exact rationals."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from deepgemm_ref import certified, exact
from deepgemm_ref import formats as fm

finite = st.floats(allow_nan=False, allow_infinity=False, width=64, min_value=-1e300, max_value=1e300)


def _odd_round(x: Fraction) -> float:
    """Round-to-odd of an exact rational to float64: truncate, then set the last bit if inexact."""
    if x == 0:
        return 0.0
    t = float(x)  # RNE
    if Fraction(t) == x:
        return t
    lo = t if Fraction(t) < x else math.nextafter(t, -math.inf)
    hi = math.nextafter(lo, math.inf)
    m_lo = int.from_bytes(np.float64(lo).tobytes(), "little")
    return lo if m_lo & 1 else hi


@given(finite, finite)
def test_two_sum_and_two_prod_are_error_free(a, b):
    x, y = np.array([a]), np.array([b])
    s, e = exact.two_sum(x, y)
    assert Fraction(float(s[0])) + Fraction(float(e[0])) == Fraction(a) + Fraction(b)
    if a == 0 or b == 0 or 2.0**-900 < abs(Fraction(a) * Fraction(b)) < 2.0**1000:
        p, f = exact.two_prod(x, y)
        assert Fraction(float(p[0])) + Fraction(float(f[0])) == Fraction(a) * Fraction(b)


@given(finite, st.floats(allow_nan=False, allow_infinity=False, min_value=-1.0, max_value=1.0))
def test_dd_to_f64_round_odd_against_rationals(a, frac):
    hi = np.array([a])
    lo = np.array([a * frac * 2.0**-54])
    hi, lo = exact.two_sum(hi, lo)  # a normalised pair
    got = float(exact.dd_to_f64_round_odd(hi, lo)[0])
    assert got == _odd_round(Fraction(float(hi[0])) + Fraction(float(lo[0])))


def test_f64_to_f32_round_odd_against_rationals():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(4000) * 2.0 ** rng.integers(-120, 120, 4000)
    x[:500] = x[:500].astype(np.float32)  # exactly representable
    got = exact.f64_to_f32_round_odd(x)
    for v, r in zip(x.tolist(), got.tolist(), strict=True):
        near = np.float32(v)
        if float(near) == v:
            assert r == v
            continue
        other = np.nextafter(near, np.float32(np.inf if Fraction(float(near)) < Fraction(v) else -np.inf))
        odd = near if int(near.view(np.uint32)) & 1 else other  # the odd one of the bracketing pair
        assert r == float(odd), (v, r)


@pytest.mark.parametrize("seed", range(4))
def test_pairwise_and_dd_sums_bound_the_exact_sum(seed):
    rng = np.random.default_rng(seed)
    t = rng.standard_normal((60, 97)) * 2.0 ** rng.integers(-30, 30, (60, 97))
    t[:, 5] = -t[:, 6] * (1 + 2.0**-40)  # cancellation
    s2, b2 = exact.pairwise_sum(t)
    hi, lo, b3 = exact.dd_sum(t)
    for i in range(t.shape[0]):
        ex = exact.fraction_sum(t[i])
        assert abs(Fraction(float(s2[i])) - ex) <= Fraction(float(b2[i]))
        assert abs(Fraction(float(hi[i])) + Fraction(float(lo[i])) - ex) <= Fraction(float(b3[i]))
        e_lo, e_hi = exact.dd_interval(hi[i:i + 1], lo[i:i + 1], b3[i:i + 1])
        assert Fraction(float(hi[i])) + Fraction(float(e_lo[0])) <= ex <= Fraction(float(hi[i])) + Fraction(float(e_hi[0]))
        down = exact.dd_to_f64_directed(hi[i:i + 1], lo[i:i + 1], up=False)[0]
        up = exact.dd_to_f64_directed(hi[i:i + 1], lo[i:i + 1], up=True)[0]
        assert Fraction(float(down)) <= Fraction(float(hi[i])) + Fraction(float(lo[i])) <= Fraction(float(up))


def test_gamma_and_integer_helpers():
    assert exact.gamma(0) == 0.0 and exact.gamma(1) > exact.U64
    assert exact.gamma(2**20) == pytest.approx(2**20 * 2.0**-53, rel=1e-9)
    assert [exact.ceil_div(x, 4) for x in (0, 1, 4, 5)] == [0, 1, 1, 2]
    assert [exact.align(x, 128) for x in (0, 1, 128, 129)] == [0, 128, 128, 256]
    assert float(exact.sum_upper_bound(np.array([1.0]), 10)[0]) > 1.0


# ---------------------------------------------------------------------------------------------
# round_certified
# ---------------------------------------------------------------------------------------------

def _rounding_case(seed: int, fmt: fm.Format, tie_every: int, n: int = 600):
    """Exact values (rationals), float64 estimates within known bounds, some of them near ties."""
    rng = np.random.default_rng(seed)
    exact_vals = []
    for i in range(n):
        v = Fraction(float(rng.standard_normal())) * Fraction(2) ** int(rng.integers(-20, 20))
        if i % tie_every == 0:  # a tie of fmt plus a tiny offset
            code = fm.encode_scalar(v, fmt, fm.IEEE_RNE)
            q = Fraction(fm.decode_scalar(code, fmt))
            ulp = Fraction(fm.decode_scalar(code + 1, fmt)) - q
            v = q + ulp / 2 + (Fraction(1, 2**90) if i % 2 else -Fraction(1, 2**90))
        exact_vals.append(v)
    est = np.array([float(v) for v in exact_vals])
    bound = np.abs(est) * 2.0**-50 + np.array([abs(float(Fraction(float(e)) - v)) for e, v in zip(est, exact_vals, strict=True)])
    return exact_vals, est, bound


@pytest.mark.parametrize("fmt", [fm.BF16, fm.F32])
@pytest.mark.parametrize("dense", [False, True])
def test_round_certified_gives_the_correct_rounding(fmt, dense):
    vals, est, bound = _rounding_case(1, fmt, 3 if dense else 30)
    # sparse: the estimates known exact are final (few left open: the points path)
    final = None if dense else np.array([Fraction(e) == v for e, v in zip(est.tolist(), vals, strict=True)])
    r = certified.FormatRounding(fmt)
    calls = []

    def fallback(at):
        calls.append(at[0].size)
        return np.array([r.exact(vals[i]) for i in at[0].tolist()], fmt.code_dtype)

    codes, pending = certified.round_certified(est, bound, r, final=final, fallback=fallback)
    want = np.array([fm.encode_scalar(v, fmt, fm.IEEE_RNE) for v in vals], fmt.code_dtype)
    assert np.array_equal(codes, want)
    assert 0 < int(pending.sum()) < est.size and calls == [int(pending.sum())]


def test_round_certified_zero_bound_is_exact_and_callable_bound_is_evaluated_lazily():
    est = np.full(16, 3.0)
    est[1] = 1.0 + 2.0**-8  # a bf16 tie, exact: a zero bound rounds the estimate itself
    seen = []

    def bound(at):
        seen.append(None if at is None else at[0].tolist())
        z = np.zeros(16)
        return z if at is None else z[at]

    final = np.ones(16, bool)
    final[1] = False
    codes, pending = certified.round_certified(est, bound, certified.FormatRounding(fm.BF16), final=final)
    assert not pending.any() and seen == [[1]]  # one element of 16: only its bound is computed
    assert codes.tolist() == fm.round_f64(est, fm.BF16).view(np.uint16).tolist()
    _, pending = certified.round_certified(est, bound, certified.FormatRounding(fm.BF16))
    assert not pending.any() and seen[-1] is None  # all of them: the whole array


def test_round_certified_unknown_bound_goes_to_the_fallback_and_nonfinite_is_final():
    est = np.array([1.0, np.inf, np.nan, 2.0])
    bound = np.array([np.inf, np.inf, np.inf, 0.0])
    codes, pending = certified.round_certified(est, bound, certified.FormatRounding(fm.BF16),
                                               final=~np.isfinite(est))
    assert pending.tolist() == [True, False, False, False]
