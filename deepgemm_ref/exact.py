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
  ``gamma(n) * sum |terms|`` with ``gamma(n) = n u / (1 - n u)`` and ``u = U64 = 2^-53``
  (``gamma(n, U32)`` for float32 arithmetic);
* **exponent-window slices** (:func:`split_windows`): rows split exactly into slices of at most
  ``b`` significant bits each, so that a GEMM of two slices is exact when
  ``2 b + ceil(log2 K) <= 53`` (:func:`slice_bits`), the error-free splitting of Ozaki et al.
  ("Error-free transformations of matrix multiplication by using fast routines of matrix
  multiplication and its applications", 2012), with windows placed where each row's bits are;
* **integer helpers**: :func:`ceil_div` and :func:`align` (DeepGEMM's ``deep_gemm.utils.math``
  names, re-exported there by :mod:`deepgemm_ref.quant`).

All array functions are elementwise on float64 arrays and raise no floating-point warnings of
their own; callers decide which IEEE exceptions to silence.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TypeVar

import numpy as np
import numpy.typing as npt

__all__ = [
    "U64",
    "U32",
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
    "slice_bits",
    "Slices",
    "split_windows",
    "ceil_div",
    "align",
]

#: Unit roundoff of float64 (round to nearest): every rounding errs by at most U64 relative.
U64 = 2.0**-53
#: Unit roundoff of float32 (round to nearest), for bounds of float32 arithmetic.
U32 = 2.0**-24


# ----------------------------------------------------------------------------------------------
# error bounds
# ----------------------------------------------------------------------------------------------

def gamma(n: int, u: float = U64, *, unbounded: bool = False) -> float:
    """Higham's ``gamma_n = n u / (1 - n u)``: the relative error bound of n roundings of unit
    roundoff ``u`` (float64 by default; ``U32`` for float32).  Requires ``n u < 1``, unless
    ``unbounded``: then ``n u >= 1`` gives ``inf`` (no bound: the checker's deterministic bound
    of a very long or very coarse accumulation)."""
    nu = n * u
    if nu >= 1:
        if unbounded:
            return math.inf
        raise ValueError(f"gamma: n u = {nu} must be below 1")
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
    if not isinstance(bb, np.ndarray) or bb.ndim == 0:
        return s, (a - (s - bb)) + (b - bb)
    e = s - bb  # e = (a - (s - bb)) + (b - bb), with two temporaries fewer (the same operations)
    np.subtract(a, e, out=e)
    np.subtract(b, bb, out=bb)
    e += bb
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
# exponent-window slices: exact splits whose GEMMs are exact
# ----------------------------------------------------------------------------------------------

def slice_bits(k: int) -> int:
    """Bits ``b`` per slice such that a float64 dot product of ``k`` products of two ``b``-bit
    slices is exact in any order: the largest ``b`` with ``2 b + ceil(log2 k) <= 53``."""
    return (53 - max(k - 1, 0).bit_length()) // 2


@dataclass
class Slices:
    """An exact split of the rows of a float64 matrix ``x`` (R, K): ``x == sum(parts)`` elementwise.

    parts:   float64 (R, K) arrays.  In ``parts[s]`` every value of row ``i`` is an integer
             multiple of ``2^low[s][i]`` below ``2^(low[s][i] + bits)`` in magnitude (at most
             ``bits`` significant bits), and every value of the later parts is below
             ``2^low[s][i]``: the window of each row starts at the highest bit it has left, so
             runs of empty exponents cost nothing.
    low:     int64 (R,) arrays (0 for a row whose part is zero).
    columns: bool (K,) arrays: the columns where the part has a non-zero value.
    norms:   float64 (R,) upper bounds of the 2-norms of the parts' rows.
    entries: per part, its non-zero values as (rows, columns, values) in row-major order when
             they are few (at most ``1 / SPARSE_PART`` of the part), else None.

    Two parts ``p`` of ``x`` and ``q`` of ``y`` with ``bits <= slice_bits(K)`` have an exact float64
    product ``p @ q.T`` in any summation order: every product is a multiple of
    ``Q = 2^(low_p[i] + low_q[j])`` below ``2^(2 bits) Q``, so every partial sum of at most ``K``
    of them is a multiple of ``Q`` below ``2^53 Q`` (given ``Q >= 2^-1074`` and no overflow:
    :meth:`products_exact`).
    """

    bits: int
    parts: list[np.ndarray]
    low: list[np.ndarray]
    columns: list[np.ndarray]
    norms: list[np.ndarray]
    entries: list[tuple[np.ndarray, np.ndarray, np.ndarray] | None] = field(default_factory=list)

    def lowest(self, s: int) -> int:
        """Smallest ``low`` of part ``s`` over the rows where it is not zero (0 if none)."""
        live = self.norms[s] > 0
        return int(self.low[s][live].min()) if live.any() else 0

    def highest(self, s: int) -> int:
        """Largest ``low + bits`` of part ``s`` over its non-zero rows (0 if none)."""
        live = self.norms[s] > 0
        return int(self.low[s][live].max()) + self.bits if live.any() else 0

    def products_exact(self, other: Slices, k: int) -> bool:
        """Whether every product of a part of self and one of ``other`` is free of underflow and
        overflow (the condition the class docstring assumes)."""
        if not self.parts or not other.parts:
            return True  # a zero operand: every product is zero
        lo = min(map(self.lowest, range(len(self.parts)))) + min(map(other.lowest, range(len(other.parts))))
        hi = max(map(self.highest, range(len(self.parts)))) + max(map(other.highest, range(len(other.parts))))
        return lo >= -1074 and hi + max(k - 1, 0).bit_length() <= 1020


def split_windows(x: np.ndarray, bits: int) -> Slices | None:
    """Split the rows of ``x`` (R, K) exactly into :class:`Slices` of at most ``bits`` bits.

    Row by row: the window of the next part ends at the row's largest remaining magnitude
    ``2^e`` (``amax < 2^e``), and the part is the remainder truncated toward zero to a multiple of
    ``2^(e - bits)``; the remainder keeps the bits below.  ``x`` must be finite; None where a window
    would leave float64's normal range (values beyond 2^1000 or below 2^-1000: the caller falls
    back to per-element sums).  ``x`` is not modified.

    Once the remainder is sparse (at most ``1 / SPARSE_PART`` of it non-zero: the low bits of a
    few values per row) the later windows work on its non-zero values alone, with the same
    arithmetic value by value (the same parts, norms and columns as the dense passes).
    """
    if x.size and not np.isfinite(x).all():
        return None
    r_count, k = x.shape
    rest = np.array(x, dtype=np.float64, copy=True)
    out = Slices(bits, [], [], [], [])
    norm_up = 1 + 2 * gamma(k + 2)
    step = max(1, SPLIT_BLOCK // max(k, 1))
    blocks = [slice(r0, r0 + step) for r0 in range(0, r_count, step)]
    with np.errstate(under="ignore"):
        while True:
            amax = np.empty(r_count)
            for sl in blocks:
                amax[sl] = np.maximum(rest[sl].max(axis=1, initial=0.0), -rest[sl].min(axis=1, initial=0.0))
            live = amax > 0
            if not live.any():
                return out
            _, e = np.frexp(amax)  # amax < 2^e
            low = np.where(live, e.astype(np.int64) - bits, 0)
            if int(low[live].min()) < -1000 or int(e[live].max()) > 1000:
                return None
            down, up = np.ldexp(1.0, -low)[:, None], np.ldexp(1.0, low)[:, None]
            part = np.empty_like(rest)
            ss = np.empty(r_count)
            cols = np.zeros(k, bool)
            nz = left = 0
            for sl in blocks:  # row blocks in the cache; every step is row by row or element-wise
                p = part[sl]
                np.multiply(rest[sl], down[sl], out=p)
                np.trunc(p, out=p)  # integers below 2^bits (values under 2^low truncate to 0)
                ss[sl] = np.einsum("ij,ij->i", p, p)  # exact: integers below 2^(2 bits) * k <= 2^53
                p *= up[sl]  # exact: integers times a normal power of two
                rest[sl] -= p  # exact: the bits below the window
                nonzero = p != 0
                nz += int(np.count_nonzero(nonzero))
                cols |= np.any(nonzero, axis=0)
                left += int(np.count_nonzero(rest[sl]))
            out.parts.append(part)
            out.low.append(low)
            out.norms.append(np.sqrt(ss) * norm_up * up[:, 0])
            if nz * SPARSE_PART <= part.size:
                idx = np.flatnonzero(part)
                rr, cc = np.divmod(idx, k) if k else (idx, idx)
                out.entries.append((rr, cc, part.reshape(-1)[idx]))
            else:
                out.entries.append(None)
            out.columns.append(cols)
            if left * SPARSE_PART <= rest.size:
                return _split_sparse(rest, bits, out, norm_up)


#: Elements per row block of :func:`split_windows`'s dense passes (the block's values and its part
#: stay in the cache across the passes of one window).
SPLIT_BLOCK = 1 << 15


#: A part (or remainder) with at most one value in SPARSE_PART non-zero is handled value by value.
SPARSE_PART = 32


def _split_sparse(rest: np.ndarray, bits: int, out: Slices, norm_up: float) -> Slices | None:
    """The later windows of :func:`split_windows` on the non-zero values of a sparse remainder
    ``rest`` (R, K): per window the same truncation, row maxima and sums of squares as the dense
    passes, on those values alone."""
    r_count, k = rest.shape
    idx = np.flatnonzero(rest)
    vals = rest.reshape(-1)[idx]
    with np.errstate(under="ignore"):
        while idx.size:
            rr = idx // k
            starts = np.flatnonzero(np.concatenate(([True], rr[1:] != rr[:-1])))  # rows ascend
            rows = rr[starts]
            amax = np.zeros(r_count)
            amax[rows] = np.maximum.reduceat(np.abs(vals), starts)
            live = amax > 0
            _, e = np.frexp(amax)
            low = np.where(live, e.astype(np.int64) - bits, 0)
            if int(low[live].min()) < -1000 or int(e[live].max()) > 1000:
                return None
            ints = np.trunc(vals * np.ldexp(1.0, -low)[rr])
            ss = np.zeros(r_count)
            ss[rows] = np.add.reduceat(ints * ints, starts)  # exact: integers, as the dense einsum
            pv = ints * np.ldexp(1.0, low)[rr]
            vals = vals - pv
            keep = pv != 0
            part = np.zeros(r_count * k)
            part[idx[keep]] = pv[keep]
            cc = idx[keep] % k
            cols = np.zeros(k, bool)
            cols[cc] = True
            out.parts.append(part.reshape(r_count, k))
            out.low.append(low)
            out.columns.append(cols)
            out.norms.append(np.sqrt(ss) * norm_up * np.ldexp(1.0, low))
            out.entries.append((rr[keep], cc, pv[keep]))
            left = vals != 0
            idx, vals = idx[left], vals[left]
    return out


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
