"""Exact arithmetic on float64: error-free transformations, round-to-odd, error bounds, integer helpers.

Everything that certifies a float64 evaluation, or makes one exact, is written here once:

* **error-free transformations** (Knuth's TwoSum, Dekker's TwoProduct with Veltkamp's split):
  ``s + e == a + b`` and ``p + e == a * b`` exactly;
* **round-to-odd** (float64 -> float32, double-double -> float64): an inexact result gets an odd
  last bit, so one later round-to-nearest-even to a format at least two bits narrower is the
  single correct rounding of the exact value (Boldo and Melquiond, "When double rounding is
  odd", 2005);
* **sums with a rigorous bound**: a pairwise float64 sum (``gamma(ceil(log2 T))`` relative), a
  double-double sum (two levels of pairwise TwoSum, the rest bounded), an exact ``Fraction`` sum;
* **gamma bounds** (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., section
  3.1): a float64 sum or dot product of ``n`` terms, in any order, errs by at most
  ``gamma(n) * sum |terms|`` with ``gamma(n) = n u / (1 - n u)`` and ``u = U64 = 2^-53``;
* **integer helpers**: :func:`ceil_div` and :func:`align` (DeepGEMM's ``deep_gemm.utils.math``
  names, re-exported there by :mod:`deepgemm_ref.quant`).

All array functions are elementwise on float64 arrays and raise no floating-point warnings of
their own; callers decide which IEEE exceptions to silence.
"""

from __future__ import annotations

from collections.abc import Iterable
from fractions import Fraction
from typing import TypeVar

import numpy as np
import numpy.typing as npt

__all__ = [
    "U64",
    "gamma",
    "sum_upper_bound",
    "two_sum",
    "split",
    "two_prod",
    "f64_to_f32_round_odd",
    "dd_to_f64_round_odd",
    "dd_to_f64_directed",
    "pairwise_two_sum",
    "pairwise_sum",
    "dd_sum",
    "dd_interval",
    "fraction_sum",
    "ceil_div",
    "align",
]

#: Unit roundoff of float64 (round to nearest): every rounding errs by at most U64 relative.
U64 = 2.0**-53


# ----------------------------------------------------------------------------------------------
# error bounds
# ----------------------------------------------------------------------------------------------

def gamma(n: int) -> float:
    """Higham's ``gamma_n = n u / (1 - n u)``: the relative error bound of n float64 roundings."""
    nu = n * U64
    return nu / (1 - nu)


def sum_upper_bound(x: np.ndarray, n: int) -> np.ndarray:
    """An upper bound of the exact sum of ``n`` non-negative terms whose float64 sum is ``x``.

    ``x (1 + 2 gamma(n + 2)) + 2^-1000``: the relative part covers the summation and the
    multiplication itself; the absolute floor keeps the bound positive where ``x`` underflowed.
    """
    return x * (1 + 2 * gamma(n + 2)) + 2.0**-1000


# ----------------------------------------------------------------------------------------------
# error-free transformations
# ----------------------------------------------------------------------------------------------

def two_sum(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Knuth's TwoSum: ``s = fl(a + b)`` and ``e`` with ``s + e == a + b`` exactly (no overflow)."""
    s = a + b
    bb = s - a
    e = (a - (s - bb)) + (b - bb)
    return s, e


_SPLITTER = 134217729.0  # 2^27 + 1


def split(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Veltkamp's split: ``a == hi + lo`` with hi and lo of at most 26 significant bits each."""
    c = _SPLITTER * a
    hi = c - (c - a)
    return hi, a - hi


def two_prod(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Dekker's TwoProduct (Veltkamp split, no FMA): ``p = fl(a * b)``, ``p + e == a * b`` exactly.

    Exact unless an operand exceeds 2^996 in magnitude or the product underflows.
    """
    p = a * b
    ah, al = split(a)
    bh, bl = split(b)
    e = ((ah * bh - p) + ah * bl + al * bh) + al * bl
    return p, e


# ----------------------------------------------------------------------------------------------
# round-to-odd
# ----------------------------------------------------------------------------------------------

def _step_to_odd(r: np.ndarray, exact: np.ndarray, udtype: type) -> np.ndarray:
    """Given ``r = RNE(exact)`` in a narrower type, return round-to-odd(exact) in that type."""
    rb = np.ascontiguousarray(r).view(udtype).copy()
    inexact = r.astype(np.float64) != exact
    fix = inexact & ((rb & 1) == 0) & np.isfinite(r)
    if np.any(fix):
        up = exact > r.astype(np.float64)
        neg = (rb >> (8 * r.itemsize - 1)) == 1
        # For a positive r, +1 on the bits moves away from zero; for a negative r, toward zero.
        inc = np.where(up != neg, 1, -1)
        rb = np.where(fix, (rb.astype(np.int64) + inc).astype(udtype), rb)
    return rb.view(r.dtype).reshape(r.shape)


_LOW29 = np.uint64((1 << 29) - 1)
_F32_NORMAL_MIN_EXP = 1023 - 126
_F32_NORMAL_MAX_EXP = 1023 + 127


def f64_to_f32_round_odd(x: npt.ArrayLike) -> np.ndarray:
    """float64 -> float32 with round-to-odd.

    An inexact result has an odd last bit, so a later RNE rounding to any format with at most
    22 significand bits equals the single correct rounding of ``x`` (24 >= p + 2).
    Fast path (float32-normal magnitudes and zeros): truncate the float64 significand to 24 bits
    and set its last bit if anything was cut off; the result is a float32 value exactly.
    """
    x = np.ascontiguousarray(x, dtype=np.float64)
    bits = x.view(np.uint64)
    exp = (bits >> np.uint64(52)) & np.uint64(0x7FF)
    trunc = (bits & ~_LOW29) | (((bits & _LOW29) != 0).astype(np.uint64) << np.uint64(29))
    with np.errstate(over="ignore", invalid="ignore"):  # out-of-range lanes are redone below
        r = trunc.view(np.float64).astype(np.float32)
    fast = ((exp >= _F32_NORMAL_MIN_EXP) & (exp <= _F32_NORMAL_MAX_EXP)) | (x == 0)
    if not fast.all():
        slow = ~fast
        xs = x[slow]
        with np.errstate(over="ignore"):
            rs = xs.astype(np.float32)
        r[slow] = _step_to_odd(rs, xs, np.uint32)
    return r


def dd_to_f64_round_odd(hi: npt.ArrayLike, lo: npt.ArrayLike) -> np.ndarray:
    """The double-double ``hi + lo`` rounded to float64 with round-to-odd.

    Where lo is zero the value is hi itself, signed zero included (-0 + +0 would give +0).  Where
    hi is not finite it is the value as well: hi is then the IEEE result of the operation that
    made the pair (an overflow, inf + finite, inf - inf), and lo is an artefact of TwoSum /
    TwoProduct (NaN from inf - inf), not part of the value.
    """
    hi, lo = np.asarray(hi, np.float64), np.asarray(lo, np.float64)
    if not np.any(lo):
        return hi.copy()
    s, e = two_sum(hi, lo)
    sb = s.view(np.uint64).copy()
    fix = (e != 0) & ((sb & 1) == 0) & np.isfinite(s)
    if np.any(fix):
        neg = (sb >> np.uint64(63)) == 1
        inc = np.where((e > 0) != neg, 1, -1)
        sb = np.where(fix, (sb.astype(np.int64) + inc).astype(np.uint64), sb)
    return np.where((lo == 0) | ~np.isfinite(hi), hi, sb.view(np.float64))


def dd_to_f64_directed(s: np.ndarray, e: np.ndarray, up: bool) -> np.ndarray:
    """A float64 bound of the double-double ``s + e``: rounded down (``up=False``) or up."""
    h, r = two_sum(s, e)
    if up:
        return np.where(r > 0, np.nextafter(h, np.inf), h)
    return np.where(r < 0, np.nextafter(h, -np.inf), h)


# ----------------------------------------------------------------------------------------------
# sums of exact terms with rigorous bounds
# ----------------------------------------------------------------------------------------------

def pairwise_two_sum(t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sum the columns of ``t`` (F, T) pairwise with TwoSum: (sums (F,), exact errors (F, T - 1)).

    ``sums + errors.sum(axis=1)`` is exactly the row sum of ``t``.
    """
    f = t.shape[0]
    errs = []
    while t.shape[1] > 1:
        if t.shape[1] % 2:
            t = np.concatenate([t, np.zeros((f, 1))], axis=1)
        t, e = two_sum(t[:, 0::2], t[:, 1::2])
        errs.append(e)
    head = t[:, 0] if t.shape[1] else np.zeros(f)
    return head, (np.concatenate(errs, axis=1) if errs else np.zeros((f, 0)))


def pairwise_sum(t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Float64 pairwise sum along axis 1 of exact terms (F, T), with a rigorous error bound.

    Contiguous halves are added level by level, so every term takes part in at most
    L = ceil(log2 T) roundings: ``|sum - s| <= gamma(L) * sum |t|`` (Higham, section 4.2), a
    bound some T / L times tighter than the one of an arbitrary-order float64 dot product.
    Returns (s, bound); the bound is +inf or NaN where a partial sum overflowed.
    """
    f, n = t.shape
    if n == 0:
        return np.zeros(f), np.zeros(f)
    x, ax = t, np.abs(t)
    levels = 0
    while x.shape[1] > 1:
        h = x.shape[1] // 2
        nx, nax = x[:, :h] + x[:, h:2 * h], ax[:, :h] + ax[:, h:2 * h]
        if x.shape[1] % 2:
            nx, nax = np.concatenate([nx, x[:, 2 * h:]], axis=1), np.concatenate([nax, ax[:, 2 * h:]], axis=1)
        x, ax = nx, nax
        levels += 1
    return x[:, 0], gamma(levels) * sum_upper_bound(ax[:, 0], levels)


def dd_sum(t: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Double-double sum along axis 1 of exact float64 terms (F, T): (hi, lo, error bound).

    Two levels of pairwise TwoSum: the terms' sum is exactly ``h1 + sum(E1)``, and ``sum(E1)``
    is exactly ``h2 + sum(E2)``; only ``sum(E2)`` is left out, bounded by ``sum |E2|`` (rounded
    up), which is zero when the result is exact.
    """
    h1, e1 = pairwise_two_sum(t)
    h2, e2 = pairwise_two_sum(e1)
    s, e = two_sum(h1, h2)
    bound = np.abs(e2).sum(axis=1) * (1 + 2 * gamma(e2.shape[1] + 2))
    return s, e, bound


def dd_interval(s: np.ndarray, e: np.ndarray, bound: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ends of the interval ``s + e -+ bound`` as low parts: (s, lo) <= s + e - bound, (s, hi) >= s + e + bound."""
    with np.errstate(over="ignore", invalid="ignore"):
        e_lo = np.where(bound == 0, e, np.nextafter(e - bound, -np.inf))
        e_hi = np.where(bound == 0, e, np.nextafter(e + bound, np.inf))
    return e_lo, e_hi


def fraction_sum(values: Iterable[float]) -> Fraction:
    """The exact sum of float values (each read exactly as a binary fraction)."""
    return sum((Fraction(float(v)) for v in values), Fraction(0))


# ----------------------------------------------------------------------------------------------
# integers
# ----------------------------------------------------------------------------------------------

#: An int, or an integer array (elementwise).
IntOrArray = TypeVar("IntOrArray", int, np.ndarray)


def ceil_div(x: IntOrArray, y: int) -> IntOrArray:
    """ceil(x / y) for integers (y > 0); elementwise for integer arrays."""
    return (x + y - 1) // y


def align(x: IntOrArray, y: int) -> IntOrArray:
    """x rounded up to a multiple of y (y > 0); elementwise for integer arrays."""
    return ceil_div(x, y) * y
