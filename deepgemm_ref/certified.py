"""The one certified rounding routine: round an estimate, prove the rounding, recompute what it cannot prove.

Every exact result of the package is obtained the same way (numerics.md section 5).  Given

* an **estimate** ``y`` of an exact real value ``v`` (float64, any shape),
* a rigorous **error bound** ``E`` with ``|y - v| <= E`` (0: ``y`` is ``v``),
* the **output rounding** ``R``, a monotone map from reals to output codes (a format's
  round-to-nearest-even, or a kernel's whole output step: ``alpha``, ``c``, the output format),
* an **exact fallback** that computes the code of ``v`` itself (Fractions, or cheaper exact tiers),

the code ``R(v)`` is ``R(y)`` wherever ``R`` maps both ends of ``[y - E, y + E]`` to the same
code: ``R`` is monotone, so every real in between, ``v`` included, gets that code.  The ends are
rounded outward first (``nextafter``), so the float64 evaluation of ``y -+ E`` cannot land inside
the interval.  The elements left over go to the fallback.

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

__all__ = ["Rounding", "FormatRounding", "Points", "round_certified"]

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


class FormatRounding:
    """Round to nearest, ties to even, to ``fmt`` (unsigned integer codes of ``fmt.code_dtype``)."""

    def __init__(self, fmt: fm.Format) -> None:
        self.fmt = fmt

    def block(self, x: np.ndarray) -> np.ndarray:
        return fm.round_f64(x, self.fmt).view(self.fmt.code_dtype)

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


def round_certified(
    estimate: np.ndarray,
    bound: Bound,
    rounding: Rounding,
    *,
    final: np.ndarray | None = None,
    fallback: Callable[[Points], np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Output codes of exact values known through an estimate and an error bound.

    estimate: float64 array ``y`` (any shape).
    bound:    float64 array of ``y``'s shape with ``|y - v| <= bound`` (0: exact; inf: unknown),
              or a function computing it for the given points (``None``: the whole array), so
              that a bound is only evaluated where it is needed.
    rounding: the monotone output map (:class:`Rounding`).
    final:    optional bool mask of elements whose estimate is their value by the caller's own
              proof (an exactness certificate, a non-finite IEEE result, an element nobody
              reads); they take ``rounding(y)`` without a bound.
    fallback: ``fallback(points) -> codes`` for the elements no certificate decides; without
              it those elements keep ``rounding(y)`` and are only reported.

    Returns ``(codes, pending)``: the codes (the rounding's dtype, ``y``'s shape) and the bool mask
    of the elements the certificate left to the fallback.  When more than 1/8 of the elements
    need their bound, both interval ends are rounded as whole arrays; otherwise only at those
    points (the certificate decides the same elements either way).
    """
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        codes = rounding.block(estimate)
        pending = np.ones(estimate.shape, bool) if final is None else ~final
        count = int(np.count_nonzero(pending))
        if count > pending.size // 8:
            err = bound(None) if callable(bound) else bound
            lo, hi = _ends(estimate, err)
            pending &= rounding.block(lo) != rounding.block(hi)
        elif count:
            at = np.nonzero(pending)
            err = bound(at) if callable(bound) else bound[at]
            lo, hi = _ends(estimate[at], err)
            same = rounding.points(lo, at) == rounding.points(hi, at)
            pending[tuple(i[same] for i in at)] = False
    if fallback is not None and pending.any():
        at = np.nonzero(pending)
        codes[at] = fallback(at)
    return codes, pending
