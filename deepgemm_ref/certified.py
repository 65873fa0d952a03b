"""The one certified rounding routine: round an estimate, prove the rounding, recompute what it cannot prove.

Every exact result of the package is obtained the same way.  Given

* an **estimate** ``y`` of an exact real value ``v`` (float64, any shape),
* a rigorous **error bound** ``E`` with ``|y - v| <= E`` (0: ``y`` is ``v``),
* the **output rounding** ``R``, a monotone map from reals to output codes (a format's
  round-to-nearest-even, or a kernel's whole output step: ``alpha``, ``c``, the output format),
* an **exact fallback** that computes the code of ``v`` itself (Fractions, or cheaper exact tiers),

the code ``R(v)`` is ``R(y)`` wherever ``R`` maps both ends of ``[y - E, y + E]`` to the same
code: ``R`` is monotone, so every real in between, ``v`` included, gets that code.  The ends are
rounded outward first (``nextafter``), so the float64 evaluation of ``y -+ E`` cannot land inside
the interval.  The elements left over go to the fallback.

A cheaper test decides most elements first (the *margin* certificate): with one bound ``M``
valid for a whole block (``M >= E`` everywhere, e.g. one value per row), the rounding's first
step maps ``y`` to a value ``r`` of its format; every real within half a gap of ``r`` rounds to
``r``, so if ``|y - r| + M`` is below the smallest half gap around ``r`` (:func:`half_gap`), the
whole interval rounds to ``r`` and every later step (exact given ``r``) gives ``R(y)``.  That
costs a few passes over the codes the rounding computes anyway; it decides a subset of what the
two-ends test decides (never more), and only the elements it leaves open take the per-element
two-ends test.

:func:`round_certified` is that routine.  The matmul core (its GEMM bound and then its
double-double and Fraction tiers), the MQA logits (head sums of certified dot products) and the
Mega MoE combine (a TwoSum-checked running sum) all call it with their own estimate, bound,
rounding and fallback.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np

from . import formats as fm

__all__ = ["Rounding", "FormatRounding", "Points", "half_gap", "within_half_gap", "decode_codes", "round_certified"]

#: Index arrays of scattered elements (as ``np.nonzero`` returns them).
Points = tuple[np.ndarray, ...]


class Rounding(Protocol):
    """A monotone map from float64 values to output codes, over a whole block or at points."""

    def block(self, x: np.ndarray) -> np.ndarray:
        """Codes of ``x``, an array of the estimate's shape."""
        ...

    def points(self, x: np.ndarray, at: Points) -> np.ndarray:
        """Codes of the 1-D values ``x`` of the elements ``at`` (they may depend on the position)."""
        ...


_MARGIN_UP = 1 + 2.0**-40  # slack for the float64 evaluation of the margin test (see within_half_gap)
_MARGIN_DOWN = 1 - 2.0**-40


def half_gap(r: np.ndarray, fmt: fm.Format, toward_zero: np.ndarray | bool = True) -> np.ndarray:
    """A lower bound of the distance from ``r`` to the nearest rounding boundary of ``fmt``.

    r: float64 array of values of ``fmt`` (finite, or inf where a rounding overflowed).  For
    ``|r|`` in ``[2^e, 2^(e + 1))`` (``e`` at least the format's smallest normal exponent, so zero
    and subnormals take that one) the gaps to the neighbours are ``2^(e - m)`` (``m`` = mantissa
    bits), except below a power of two above the smallest normal, where the gap is half that.
    Boundaries (midpoints) are half a gap away: ``2^(e - m - 1)``, or ``2^(e - m - 2)`` at such a
    power of two: that power of two, built from the float64 bits of ``r``.  The boundary between
    the largest finite value and overflow is half a gap above it, like any other.
    ``toward_zero``: bool (broadcastable), False where only the boundary on the far side of ``r``
    from zero matters (every value in question lies beyond ``r``): the halving below a power of
    two then does not apply.
    """
    bits = np.ascontiguousarray(r, np.float64).view(np.uint64)
    field = (bits >> np.uint64(52)) & np.uint64(0x7FF)
    normal_min = np.uint64(fmt.min_exponent + 1023)
    power_of_two = ((bits & np.uint64((1 << 52) - 1)) == 0) & (field > normal_min) & toward_zero
    field = np.maximum(field, normal_min) - np.uint64(fmt.mantissa_bits + 1) - power_of_two.astype(np.uint64)
    return (field << np.uint64(52)).view(np.float64)


def within_half_gap(hi: np.ndarray, lo: np.ndarray | None, r: np.ndarray, err: np.ndarray | float,
                    fmt: fm.Format) -> np.ndarray:
    """bool: every real within ``err`` of ``hi + lo`` rounds to ``r`` in ``fmt`` (``r`` its RNE value).

    ``|hi + lo - r| + err < half_gap(r)`` is evaluated in float64 with a relative slack of 2^-40
    on both sides: ``hi - r`` is exact (Sterbenz: ``r`` is within a factor 2 of ``hi``, or a
    difference that underflows is exact), and the two or three later roundings err by at most
    2^-53 relative each, far inside the slack.  NaN and infinities give False.
    Both boundaries count: an interval around a value just beyond a power of two ``r`` that
    reaches back past ``r`` must also stay above the finer boundary below it
    (``err - |hi + lo - r|`` below that half gap).
    """
    d = hi - r
    if lo is not None:
        d += lo
    beyond = (d < 0) == (r < 0)
    gap = half_gap(r, fmt, toward_zero=~beyond)
    np.abs(d, out=d)
    e = np.multiply(err, _MARGIN_UP)
    ok = d + e < gap * _MARGIN_DOWN
    back = ok & beyond & (e >= d)  # certified on the far side, the interval reaching back past r
    if back.any():
        at = np.nonzero(back)
        ok[at] = np.broadcast_to(e, ok.shape)[at] - d[at] < half_gap(r[at], fmt) * _MARGIN_DOWN
    return ok


def decode_codes(codes: np.ndarray, fmt: fm.Format) -> np.ndarray:
    """float64 values of bf16 or float32 codes (unsigned integer arrays)."""
    if fmt is fm.BF16:
        return (codes.astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)
    if fmt is fm.F32:
        return codes.view(np.float32).astype(np.float64)
    return fm.decode(codes, fmt)


class FormatRounding:
    """Round to nearest, ties to even, to ``fmt`` (unsigned integer codes of ``fmt.code_dtype``)."""

    def __init__(self, fmt: fm.Format) -> None:
        self.fmt = fmt

    def block(self, x: np.ndarray) -> np.ndarray:
        return fm.round_f64(x, self.fmt).view(self.fmt.code_dtype)

    def margin(self, x: np.ndarray, err: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
        """(codes of ``x``, bool: every real within ``err`` of ``x`` has the same code)."""
        codes = self.block(x)
        return codes, within_half_gap(x, None, decode_codes(codes, self.fmt), err, self.fmt)

    def points(self, x: np.ndarray, at: Points) -> np.ndarray:
        return self.block(x)

    def exact(self, v: object) -> int:
        """The code of an exact rational (or float) value: the slow specification."""
        return fm.encode_scalar(v, self.fmt, fm.IEEE_RNE)  # type: ignore[arg-type]


Bound = np.ndarray | Callable[[Points | None], np.ndarray]


def _ends(y: np.ndarray, err: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The interval ends ``y -+ err`` rounded outward; ``y`` itself where the bound is 0."""
    lo = np.nextafter(y - err, -np.inf)
    hi = np.nextafter(y + err, np.inf)
    zero = err == 0
    if zero.any():
        lo = np.where(zero, y, lo)
        hi = np.where(zero, y, hi)
    return lo, hi


#: Open elements on which :func:`round_certified` with ``probe`` first tries the per-element test.
_PROBE = 256


def _decides_some(estimate: np.ndarray, pending: np.ndarray, count: int, bound: Bound, rounding: Rounding,
                  final: np.ndarray | Callable[[Points], np.ndarray] | None) -> bool:
    """Whether the per-element test (then ``final``) decides at least a quarter of ``_PROBE`` of the
    ``count`` open elements, evenly spaced."""
    at = np.nonzero(pending)
    pick = np.linspace(0, count - 1, _PROBE).astype(np.intp)
    sample = tuple(i[pick] for i in at)
    err = bound(sample) if callable(bound) else bound[sample]
    lo, hi = _ends(estimate[sample], err)
    same = rounding.points(lo, sample) == rounding.points(hi, sample)
    if callable(final) and not same.all():
        rest = tuple(i[~same] for i in sample)
        decided = int(np.count_nonzero(same)) + int(np.count_nonzero(final(rest)))
    else:
        decided = int(np.count_nonzero(same))
    return 4 * decided >= _PROBE


def round_certified(
    estimate: np.ndarray,
    bound: Bound,
    rounding: Rounding,
    *,
    final: np.ndarray | Callable[[Points], np.ndarray] | None = None,
    fallback: Callable[[Points], np.ndarray] | None = None,
    margin: np.ndarray | float | None = None,
    probe: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Output codes of exact values known through an estimate and an error bound.

    estimate: float64 array ``y`` (any shape).
    bound:    float64 array of ``y``'s shape with ``|y - v| <= bound`` (0: exact; inf: unknown),
              or a function computing it for the given points (``None``: the whole array), so
              that a bound is only evaluated where it is needed.
    rounding: the monotone output map (:class:`Rounding`).
    final:    optional bool mask of elements whose estimate is their value by the caller's own
              proof (an exactness certificate, a non-finite IEEE result, an element nobody
              reads); they take ``rounding(y)`` without a bound.  With ``margin`` it may be a
              function of points, evaluated only where the margin test fails.
    fallback: ``fallback(points) -> codes`` for the elements no certificate decides; without
              it those elements keep ``rounding(y)`` and are only reported.
    margin:   optional bound broadcastable to ``y`` (one per row, say) with ``margin >= bound``
              everywhere, for the cheap margin certificate (the module docstring) of a rounding
              that has ``margin(x, err) -> (codes, certified)``; only the elements it leaves
              open take the per-element test with ``bound``.
    probe:    with ``margin``: when the margin test leaves more than half of the elements open,
              first try the per-element test (and ``final``) on ``_PROBE`` of them, evenly
              spaced; if it decides fewer than a quarter, every open element goes to the
              fallback untested.  For callers whose fallback gives every element its exact
              code (the codes are the same either way; only which certificate decided differs,
              and with it any value a caller stores per certificate).

    Returns ``(codes, pending)``: the codes (the rounding's dtype, ``y``'s shape) and the bool mask
    of the elements the certificate left to the fallback.  Without ``margin``, when more than 1/8
    of the elements need their bound, both interval ends are rounded as whole arrays; otherwise
    only at those points (the certificate decides the same elements either way).
    """
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        use_margin = margin is not None and hasattr(rounding, "margin")
        if use_margin:
            codes, ok = rounding.margin(estimate, margin)  # type: ignore[attr-defined]
            pending = ~ok
            if final is not None and not callable(final):
                pending &= ~final
            count = int(np.count_nonzero(pending))
            if probe and count > max(pending.size // 2, _PROBE) and not _decides_some(
                    estimate, pending, count, bound, rounding, final):
                count = 0  # the per-element test would decide few: every open element to the fallback
        else:
            if callable(final):
                raise TypeError("round_certified: a callable final needs a margin")
            codes = rounding.block(estimate)
            pending = np.ones(estimate.shape, bool) if final is None else ~final
            count = int(np.count_nonzero(pending))
        if count > pending.size // 8 and not use_margin:
            err = bound(None) if callable(bound) else bound
            lo, hi = _ends(estimate, err)
            pending &= rounding.block(lo) != rounding.block(hi)
        elif count:
            at = np.nonzero(pending)
            err = bound(at) if callable(bound) else bound[at]
            lo, hi = _ends(estimate[at], err)
            same = rounding.points(lo, at) == rounding.points(hi, at)
            pending[tuple(i[same] for i in at)] = False
            if callable(final):  # evaluated last: the fewest elements (the codes are rounding(y) either way)
                at = tuple(i[~same] for i in at)
                if at[0].size:
                    fin = final(at)
                    pending[tuple(i[fin] for i in at)] = False
    if fallback is not None and pending.any():
        at = np.nonzero(pending)
        codes[at] = fallback(at)
    return codes, pending
