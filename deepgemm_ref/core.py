"""The one numeric core: a scaled block matmul with exact, fp32 and limited accumulation models.

Every kernel turns its inputs into two canonical :class:`Operand` s (element values, one scale per
row and K block) and an :class:`OutputStage`, and the executor (:mod:`deepgemm_ref.executor`) calls
:func:`scaled_matmul` (or :func:`dot_products`) with the active :class:`Accumulation`.  No kernel
owns a matmul loop, and the core reads no global state.

Math.  With ``a`` of logical shape (M, K), ``b`` of shape (N, K), block sizes ``ba``, ``bb``::

    acc[m, n] = sum_k  a[m, k] * sa[m, k // ba]  *  b[n, k] * sb[n, k // bb]

``exact`` (default) is that real number; the epilogue then applies the roundings the kernel
defines (one rounding to the output dtype without ``c``; ``bf16(c + bf16(acc))`` for bf16 output
with ``c``; ``f32(c + acc)`` for float32 output with ``c``; ``alpha`` multiplies the accumulator
and the product is rounded to float32, as DeepGEMM-Ascend's epilogue does).

How the exact result is obtained (numerics.md section 5), per output element:

1. One float64 GEMM of the operands with their scales folded in.  The values and their folded
   scales are exact in float64 (at most 8 + 24 significand bits).
2. *Exactness certificate*: when every scale is a power of two, every product is an integer
   multiple of ``2^(qa[m] + qb[n])`` (the smallest set bit of the row of ``a`` and of ``b``); if
   ``S[m, n] = sum |a b| < 2^(53 + qa[m] + qb[n])``, every partial sum is representable and the
   GEMM is exact whatever the summation order.
3. Otherwise a *rounding certificate*: the float64 result ``y`` satisfies
   ``|y - acc| <= gamma_K * S`` with ``gamma_K = K u / (1 - K u)``, ``u = 2^-53`` (Higham 3.1, any
   order, with or without FMA); if the epilogue gives the same bits at both ends of that interval
   it gives them at ``acc`` too (every epilogue step is monotone).
4. Elements without a certificate are recomputed with a double-double sum of their exact terms
   (error below ``2 T^2 u^2 S``) and certified again; what remains (exact ties) is computed with
   Python ``Fraction`` s.

Steps 3 and 4 are :func:`deepgemm_ref.certified.round_certified` (estimate ``y``, bound
``gamma_K S``, the epilogue as the rounding, the exact tiers as its fallback); the error-free
transformations and bounds come from :mod:`deepgemm_ref.exact`.

``S`` is bounded by ``|a_m|_2 |b_n|_2`` (Cauchy-Schwarz) unless the caller asks for the exact
error scale, which costs one more GEMM (``|a| @ |b|^T``, rounded up).

Non-power-of-two (FP32) scales make the folded products inexact, so step 2 never applies; for
float32 outputs the per-block sums ``sum_k a b`` (exact in float64 for FP8 and FP4 blocks) are
combined with the scale products in float64, which keeps the error bound at ``gamma_{2 nb}``.

``fp32`` models a kernel's arithmetic, deterministically: each K block's partial sum is the exact
block sum rounded once to float32, multiplied (float32, one rounding) by the float32 product of
the block's two scales and added to a float32 accumulator in K order (one rounding), then the
epilogue.  (DeepGEMM's SM90 promotion may be contracted into a fused multiply-add by nvcc; the
model keeps the two roundings, which are identical whenever the scales are powers of two.)
``limited(bits, interval)`` models a tensor-core accumulator (see :class:`Limited`).
"""

from __future__ import annotations

import contextlib
import math
import threading
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import ml_dtypes
import numpy as np

from . import formats as fm
from ._parallel import blas_pinned, parallel_chunks, single_threaded_blas
from .certified import Points, round_certified
from .config import AccumulationModel, Limited
from .exact import (
    ceil_div,
    dd_interval,
    dd_sum,
    dd_to_f64_directed,
    fraction_sum,
    gamma,
    pairwise_sum,
    sum_upper_bound,
    two_prod,
    two_sum,
)

__all__ = [
    "Operand",
    "OutputStage",
    "Accumulation",
    "MatmulResult",
    "Accumulator",
    "Products",
    "scaled_matmul",
    "exact_accumulator",
    "dot_products",
]


# ----------------------------------------------------------------------------------------------
# Operands
# ----------------------------------------------------------------------------------------------

@dataclass
class Operand:
    """A canonical GEMM operand of logical shape (MN, K).

    values: (MN, K) array of element values in any of: float32, float64, float16, ml_dtypes
            bfloat16 / float8_e4m3fn / float8_e5m2, or uint8 E2M1 codes (``codes_fmt=E2M1``).
            Any strides (views are fine).
    scales: float64 (MN, ceil(K / block)) scale of every row and K block, or None (all 1).
    block:  K block size of ``scales`` (ignored without scales).
    """

    values: np.ndarray
    scales: np.ndarray | None = None
    block: int = 0
    codes_fmt: fm.Format | None = None
    _pow2: bool | None = field(default=None, repr=False)

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.values.shape[0]), int(self.values.shape[1]))

    @property
    def pow2_scales(self) -> bool:
        """True when every scale is a positive power of two (or there are none)."""
        if self._pow2 is None:
            if self.scales is None:
                self._pow2 = True
            else:
                s = self.scales
                m, _ = np.frexp(s)
                self._pow2 = bool(np.all((m == 0.5) & np.isfinite(s)))
        return self._pow2

    @property
    def fixed_quantum(self) -> int | None:
        """Exponent q such that every element value is a multiple of 2^q, for formats that have one."""
        if self.codes_fmt is fm.E2M1:
            return -1
        dt = self.values.dtype
        if dt == ml_dtypes.float8_e4m3fn:
            return -9
        if dt == ml_dtypes.float8_e5m2:
            return -16
        return None

    def element_rows(self, r0: int, r1: int) -> np.ndarray:
        """Unscaled element values of rows [r0, r1) as float64 (r1 - r0, K)."""
        v = self.values[r0:r1]
        fmt = self.codes_fmt or _BYTE_FORMATS.get(v.dtype)
        if fmt is not None:  # one-byte formats: a 256-entry table is much faster than a cast
            return np.take(_decode_table(fmt), v.view(np.uint8))
        return v.astype(np.float64)

    def scale_rows(self, r0: int, r1: int) -> np.ndarray | None:
        """Scales of rows [r0, r1) expanded to one per element: float64 (r1 - r0, K), or None."""
        if self.scales is None:
            return None
        k = self.values.shape[1]
        s = self.scales[r0:r1]
        return np.repeat(s, self.block, axis=1)[:, :k]

    def rows(self, r0: int, r1: int, scaled: bool = True) -> np.ndarray:
        """Element values times their scales (exact in float64), rows [r0, r1)."""
        x = self.element_rows(r0, r1)
        if scaled and self.scales is not None:
            k = x.shape[1]
            if k % self.block == 0:
                x.reshape(x.shape[0], k // self.block, self.block)[...] *= self.scales[r0:r1, :, None]
            else:
                x *= self.scale_rows(r0, r1)
        return x

    def take_rows(self, idx: np.ndarray, scaled: bool = True) -> np.ndarray:
        """Like :meth:`rows` for the rows listed in ``idx``."""
        sub = Operand(self.values[idx], None if self.scales is None else self.scales[idx], self.block,
                      self.codes_fmt, self._pow2)
        return sub.rows(0, idx.size, scaled)

    def take_block_scales(self, idx: np.ndarray, block: int) -> np.ndarray:
        """Like :meth:`block_scales` for the rows listed in ``idx``."""
        sub = Operand(self.values[idx], None if self.scales is None else self.scales[idx], self.block,
                      self.codes_fmt, self._pow2)
        return sub.block_scales(0, idx.size, block)

    def block_scales(self, r0: int, r1: int, block: int) -> np.ndarray:
        """Scales per row and per K block of size ``block`` (which must divide self.block)."""
        k = self.values.shape[1]
        nb = ceil_div(k, block) if k else 0
        if self.scales is None:
            return np.ones((r1 - r0, nb))
        rep = self.block // block
        return np.repeat(self.scales[r0:r1], rep, axis=1)[:, :nb]


_BYTE_FORMATS = {np.dtype(ml_dtypes.float8_e4m3fn): fm.E4M3, np.dtype(ml_dtypes.float8_e5m2): fm.E5M2}
_TABLES: dict[str, np.ndarray] = {}


def _decode_table(fmt: fm.Format) -> np.ndarray:
    t = _TABLES.get(fmt.name)
    if t is None:
        t = fm.decode(np.arange(256), fmt) if fmt.bits == 8 else fm.decode(np.arange(256) & 0xF, fmt)
        _TABLES[fmt.name] = t
    return t


def _lsb_exponent(x: np.ndarray) -> np.ndarray:
    """Per row: the exponent of the smallest set bit over the row's non-zero finite values.

    float64 (rows, K) -> float64 (rows,), +inf for a row of zeros.
    """
    mant, exp = np.frexp(np.where(np.isfinite(x), x, 0.0))
    # mant in [0.5, 1): an integer after scaling by 2^53; its lowest set bit gives the quantum.
    mi = np.abs(mant * 2.0**53).astype(np.int64)
    low = mi & -mi
    _, le = np.frexp(low.astype(np.float64))  # low = 2^(le - 1)
    q = (exp.astype(np.int64) - 53 + le.astype(np.int64) - 1).astype(np.float64)
    q[(x == 0) | ~np.isfinite(x)] = np.inf
    return q.min(axis=1) if x.shape[1] else np.full(x.shape[0], np.inf)


# ----------------------------------------------------------------------------------------------
# OutputStage
# ----------------------------------------------------------------------------------------------

@dataclass
class OutputStage:
    """What happens to the accumulator on its way into ``d`` (the kernel's epilogue arithmetic).

    Not to be confused with :mod:`deepgemm_ref.epilogue`, DeepGEMM-Ascend's epilogue *objects*
    (``Identity``, ``Alpha``, ``FP8Quantization``) that the kernels accept and translate into this.

    out:    the output format (``formats.BF16`` or ``formats.F32``).
    alpha:  optional float32 multiplier: ``z = f32(alpha * acc)`` (DeepGEMM-Ascend's Alpha).
    c:      optional (M, N) array added in the output precision.
    c_mode: how ``c`` is added: ``"kernel"`` (DeepGEMM's and DeepGEMM-Ascend's GEMM kernels:
            bf16 output ``bf16(c + bf16(z))``, two roundings through the reduce-add; float32 output
            ``f32(c + z)``), ``"fused"`` (one rounding of ``c + z``, cuBLASLt's FP32 epilogue and
            ACLNN's addmm) or ``"rounded"`` (``out(c + out(z))``: the product is stored in the
            output dtype first, then added, as DeepGEMM-Ascend's ACLNN FP8 wrapper does).
    """

    out: fm.Format
    alpha: float | None = None
    c: np.ndarray | None = None
    c_mode: str = "kernel"

    @property
    def _round_first(self) -> bool:
        return self.c_mode == "rounded" or (self.c_mode == "kernel" and self.out is fm.BF16)

    def apply(self, x: np.ndarray, r0: int, r1: int) -> np.ndarray:
        """Output codes (unsigned ints) for exact float64 accumulator values ``x`` of rows [r0, r1).

        Every step is an exact operation on at most two float64 numbers followed by one correct
        rounding, so the result is exact for exact inputs; every step is also monotone in ``x``.
        """
        return self._apply(x, None if self.c is None else self.c[r0:r1])

    def apply_points(self, x: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """Output codes for scattered elements (rows[i], cols[i]) with accumulator values x[i]."""
        return self._apply(x, None if self.c is None else self.c[rows, cols])

    def apply_points_dd(
        self, hi: np.ndarray, lo: np.ndarray, rows: np.ndarray, cols: np.ndarray, up: bool
    ) -> np.ndarray:
        """Output codes for double-double accumulator values (the end of an interval).

        Without ``alpha``, and without ``c`` or with a bf16 output, every step stays exact on a
        double-double; otherwise the value is first rounded outward (``up``) to float64, which
        keeps the interval valid.
        """
        if self.alpha is None and (self.c is None or self._round_first):
            if self.c is None:
                return fm.round_dd(hi, lo, self.out).view(self.out.code_dtype)
            z = fm.round_dd(hi, lo, self.out).astype(np.float64)
            s, e = two_sum(self.c[rows, cols].astype(np.float64), z)
            return fm.round_dd(s, e, self.out).view(self.out.code_dtype)
        return self.apply_points(dd_to_f64_directed(hi, lo, up), rows, cols)

    def _apply(self, x: np.ndarray, c: np.ndarray | None) -> np.ndarray:
        z = x
        if self.alpha is not None:
            p, e = two_prod(np.float64(self.alpha), z)
            z = fm.round_dd(p, e, fm.F32).astype(np.float64)
        if c is None:
            return fm.round_f64(z, self.out).view(self.out.code_dtype)
        if self._round_first:
            z = fm.round_f64(z, self.out).astype(np.float64)
        s, e = two_sum(c.astype(np.float64), z)
        return fm.round_dd(s, e, self.out).view(self.out.code_dtype)

    def apply_exact(self, x: Fraction, m: int, n: int) -> Any:
        """The same epilogue on one exact rational accumulator value (the slow specification).

        A rounding that overflows gives an infinity (a float), which then follows IEEE
        arithmetic: inf + finite c is inf, inf + -inf is NaN.
        """
        v: Fraction | float = x  # an exact zero accumulator is +0 (an accumulator starts at +0)
        if self.alpha is not None:
            v = _rn(Fraction(self.alpha) * x, fm.F32)
            if v == 0:
                v = math.copysign(0.0, self.alpha)  # f32(alpha * +0) carries alpha's sign
        if self.c is not None:
            if self._round_first and not _nonfinite(v):
                v = _rn_signed(v, self.out)
            cv = float(self.c[m, n])
            if not math.isfinite(cv) or _nonfinite(v) or (cv == 0 and v == 0):
                # IEEE addition of the two floats: inf rules, and -0 + -0 = -0 (else +0)
                return fm.encode(np.array([cv + float(v)]), self.out, fm.IEEE_RNE)[0]
            v = Fraction(cv) + Fraction(v)
        if _nonfinite(v) or (isinstance(v, float) and v == 0):
            return fm.encode(np.array([float(v)]), self.out, fm.IEEE_RNE)[0]
        return fm.encode_scalar(Fraction(v), self.out, fm.IEEE_RNE)


def _rn_signed(v: Fraction | float, fmt: fm.Format) -> float:
    """RN of v to fmt as a float; a result of zero keeps v's sign (a value that rounds to zero
    keeps its sign in IEEE rounding, and -0.0 stays -0.0)."""
    r = _rn(Fraction(v), fmt)
    if r == 0:
        neg = (v < 0) or (isinstance(v, float) and math.copysign(1.0, v) < 0)
        return -0.0 if neg else 0.0
    return r


def _nonfinite(v: Fraction | float) -> bool:
    return isinstance(v, float) and not math.isfinite(v)


def _rn(x: Fraction, fmt: fm.Format) -> float:
    return fm.decode_scalar(fm.encode_scalar(x, fmt, fm.IEEE_RNE), fmt)


# ----------------------------------------------------------------------------------------------
# Result
# ----------------------------------------------------------------------------------------------

@dataclass
class MatmulResult:
    """Output of :func:`scaled_matmul`.

    out:    (M, N) output codes viewed as the output dtype (bf16 or float32).
    acc:    float64 (M, N) accumulator (exact where ``exact_mask``; otherwise within
            ``acc_err``), when requested.
    acc_lo: float64 (M, N) low part so that ``acc + acc_lo`` is the accumulator to about 2^-100
            relative (only for float32 outputs, when requested).
    S:      float64 (M, N) upper bound of sum |a_i b_i| * scales, when requested.
    stats:  how many elements each tier decided.
    """

    out: np.ndarray
    acc: np.ndarray | None = None
    acc_lo: np.ndarray | None = None
    S: np.ndarray | None = None
    stats: dict[str, int] = field(default_factory=dict)


# ----------------------------------------------------------------------------------------------
# The exact model
# ----------------------------------------------------------------------------------------------

def _chunk_rows(m: int, n: int, k: int) -> int:
    """Rows of ``a`` per chunk.

    A chunk's temporaries are some ten (rows, N) float64 arrays and two (rows, K) ones.  Their
    budget is a quarter of the float64 copies of A, B and D (at least 32 MiB), so peak memory
    stays within 1.5x of those copies, and chunks stay tall enough (>= 256 rows when possible)
    for the BLAS to run at full speed instead of re-reading B for every thin slice of A.
    """
    per_row = 8 * (n * 10 + k * 2)
    budget = max(32 << 20, 2 * (m * k + n * k + m * n))  # bytes: 1/4 of 8 * (mk + nk + mn)
    rows = budget // max(per_row, 1)
    return max(1, min(m, max(rows, min(m, 256) if per_row * 256 <= 4 * budget else rows)))


def _exact_terms(a: Operand, b: Operand, rows: np.ndarray, cols: np.ndarray) -> list[np.ndarray]:
    """Exact float64 terms whose sum is acc[rows[i], cols[i]]: (T, F) arrays, as a list of 1-D arrays.

    Power-of-two scales (or none): the products a' b' of the scaled values (exact: at most 48
    significand bits).  Other scales: for every K block, TwoProduct(scale product, exact block
    sum of the unscaled products) gives two exact terms.
    """
    k = a.shape[1]
    ua, ia = np.unique(rows, return_inverse=True)
    ub, ib = np.unique(cols, return_inverse=True)
    if a.pow2_scales and b.pow2_scales:
        return [a.take_rows(ua)[ia] * b.take_rows(ub)[ib]]  # (F, K) exact products
    blk = math.gcd(a.block or k or 1, b.block or k or 1)
    ea = a.take_rows(ua, scaled=False)
    eb = b.take_rows(ub, scaled=False)
    sa = a.take_block_scales(ua, blk)
    sb = b.take_block_scales(ub, blk)
    nb = sa.shape[1]
    prod = ea[ia] * eb[ib]  # exact (element products have at most 16 bits)
    pad = nb * blk - k
    if pad:
        prod = np.concatenate([prod, np.zeros((prod.shape[0], pad))], axis=1)
    blocks = prod.reshape(prod.shape[0], nb, blk)
    sums = [blocks[:, j, :] for j in range(nb)]
    scale = sa[ia] * sb[ib]  # exact: 24 + 24 bits
    terms = []
    for j, bs in enumerate(sums):
        # Within a block the products share the block's scale; their sum is exact only for
        # fixed-quantum formats, so split the block into exact product terms otherwise.
        if a.fixed_quantum is not None and b.fixed_quantum is not None:
            p, e = two_prod(scale[:, j], bs.sum(axis=1))
            terms += [p[:, None], e[:, None]]
        else:
            for t in range(bs.shape[1]):
                p, e = two_prod(scale[:, j], bs[:, t])
                terms += [p[:, None], e[:, None]]
    return [np.concatenate(terms, axis=1)]


def _exact_tiers(
    a: Operand, b: Operand, ep: OutputStage, rows: np.ndarray, cols: np.ndarray, r0: int,
    acc: np.ndarray | None, acc_lo: np.ndarray | None, stats: dict[str, int],
) -> np.ndarray:
    """Tiers 2 and 3: output codes (F,) of the elements (rows[i], cols[i]) no GEMM bound decided.

    rows are absolute; ``acc`` / ``acc_lo`` (the chunk's rows from r0) receive the tiers' values.
    """
    codes = np.empty(rows.size, ep.out.code_dtype)
    # Bound the memory of the gathered terms (F x T float64) to about 64 MiB per batch.
    k = max(a.shape[1], 1)
    per = max(1, (64 << 20) // (8 * 2 * k))
    for i0 in range(0, rows.size, per):
        at = np.arange(i0, min(rows.size, i0 + per))
        rr, cc = rows[at], cols[at]
        (terms,) = _exact_terms(a, b, rr, cc)
        # Tier 2a: a pairwise float64 sum of the exact terms has an error bound some K / log2 K
        # times tighter than the GEMM's; most elements the GEMM's bound left open end here.
        with np.errstate(over="ignore", invalid="ignore"):
            s2, bound2 = pairwise_sum(terms)
            p_lo = ep.apply_points(np.nextafter(s2 - bound2, -np.inf), rr, cc)
            p_hi = ep.apply_points(np.nextafter(s2 + bound2, np.inf), rr, cc)
            ok2 = (p_lo == p_hi) & np.isfinite(s2) & np.isfinite(bound2)
        if ok2.any():
            codes[at[ok2]] = p_lo[ok2]
            stats["pairwise"] = stats.get("pairwise", 0) + int(ok2.sum())
            if acc is not None:
                acc[rr[ok2] - r0, cc[ok2]] = s2[ok2]
            if ok2.all():
                continue
            at, rr, cc, terms = at[~ok2], rr[~ok2], cc[~ok2], terms[~ok2]
        s, e, bound = dd_sum(terms)
        e_lo, e_hi = dd_interval(s, e, bound)
        c_lo = ep.apply_points_dd(s, e_lo, rr, cc, up=False)
        c_hi = ep.apply_points_dd(s, e_hi, rr, cc, up=True)
        ok = c_lo == c_hi
        codes[at[ok]] = c_lo[ok]
        stats["double_double"] = stats.get("double_double", 0) + int(ok.sum())
        if acc is not None:
            acc[rr - r0, cc] = s
        if acc_lo is not None:
            acc_lo[rr - r0, cc] = e
        bad = np.flatnonzero(~ok)
        for j in bad:
            exact = fraction_sum(terms[j])
            codes[at[j]] = ep.apply_exact(exact, int(rr[j]), int(cc[j]))
            if acc is not None:
                hi_f = float(exact)
                acc[rr[j] - r0, cc[j]] = hi_f
                if acc_lo is not None:
                    acc_lo[rr[j] - r0, cc[j]] = float(exact - Fraction(hi_f))
        stats["fraction"] = stats.get("fraction", 0) + int(bad.size)
    return codes


class _RowsRounding:
    """The output step of rows [r0, r0 + rows) as a :class:`certified.Rounding`."""

    def __init__(self, ep: OutputStage, r0: int, r1: int) -> None:
        self.ep, self.r0, self.r1 = ep, r0, r1

    def block(self, x: np.ndarray) -> np.ndarray:
        return self.ep.apply(x, self.r0, self.r1)

    def points(self, x: np.ndarray, at: Points) -> np.ndarray:
        return self.ep.apply_points(x, at[0] + self.r0, at[1])


@dataclass
class _Chunk:
    """One block of rows [r0, r1) of the float64 GEMM with its certificates."""

    r0: int
    r1: int
    y: np.ndarray  # float64 (rows, N): the GEMM of the scaled operands
    exact: np.ndarray  # bool: y is exactly the accumulator (exactness certificate)
    finite: np.ndarray  # bool: the operands' rows are finite
    a_norm: np.ndarray  # (rows,) and (N,) upper bounds of the scaled rows' 2-norms
    b_norm: np.ndarray
    n_round: int  # rounding-path length: |y - acc| <= gamma(n_round) * S
    all_exact: bool = False  # every element certified exact (S is then never needed)
    _S: np.ndarray | None = None

    @property
    def S(self) -> np.ndarray:
        """float64 upper bound of sum |a b| (Cauchy-Schwarz), computed on first use."""
        if self._S is None:
            with np.errstate(over="ignore", invalid="ignore"):
                self._S = sum_upper_bound(np.outer(self.a_norm, self.b_norm), 2)
        return self._S


class _CertifiedChunks:
    """The float64 GEMM of two operands, row chunk by row chunk, with the exactness certificate.

    blocked: FP32 (non-power-of-two) scales; per-block sums of the unscaled elements (exact for
    FP8 and FP4) are combined with the scale products in float64 (path length 2 nb + 2).
    """

    def __init__(self, a: Operand, b: Operand, blocked: bool, step: int, kblock: int = 0) -> None:
        self.a, self.b, self.blocked, self.step, self.kblock = a, b, blocked, step, kblock
        m, k = a.shape
        n = b.shape[0]
        self.pow2 = a.pow2_scales and b.pow2_scales
        self.b_norm, self.b_finite = _row_norms(b)
        if blocked:
            self.blk = math.gcd(a.block or k, b.block or k)
            self.b64 = b.element_rows(0, n)
            self.sb_blk = b.block_scales(0, n, self.blk)
            self.qb = np.zeros(n)
        else:
            self.b64 = b.rows(0, n)  # (N, K) scaled float64: exact (element bits + scale bits <= 32)
            self.qb = _quantum_exponents(b, self.b64)

    def __iter__(self) -> Iterator[_Chunk]:
        for r0 in range(0, self.a.shape[0], self.step):
            yield self.chunk(r0)

    def for_each(self, fn: Callable[[_Chunk], None]) -> None:
        """``fn(chunk)`` for every chunk (rows are disjoint): in parallel on the package's thread
        pool while the BLAS is pinned to one thread (golden generation), else in order."""
        starts = list(range(0, self.a.shape[0], self.step))
        if len(starts) > 1 and blas_pinned():

            def run(i0: int, i1: int) -> None:
                for r0 in starts[i0:i1]:
                    fn(self.chunk(r0))

            parallel_chunks(len(starts), 1, run)
        else:
            for r0 in starts:
                fn(self.chunk(r0))

    def chunk(self, r0: int) -> _Chunk:
        """Rows [r0, r0 + step) of the GEMM with their certificates."""
        a, k = self.a, self.a.shape[1]
        r1 = min(a.shape[0], r0 + self.step)
        with np.errstate(over="ignore", invalid="ignore", under="ignore"):
            a64 = a.rows(r0, r1)
            if self.blocked:
                a_el = a.element_rows(r0, r1)
                sa_blk = a.block_scales(r0, r1, self.blk)
                y = np.zeros((r1 - r0, self.b64.shape[0]))
                for j in range(sa_blk.shape[1]):
                    ks = slice(j * self.blk, min(k, (j + 1) * self.blk))
                    y += np.outer(sa_blk[:, j], self.sb_blk[:, j]) * (a_el[:, ks] @ self.b64[:, ks].T)
                n_round = 2 * sa_blk.shape[1] + 2
            elif self.kblock and k > self.kblock:
                # K blocks accumulated in order: every product meets at most kblock roundings in
                # its block's GEMM and nb in the accumulation, so the error bound shrinks from
                # gamma(K + 1) to gamma(kblock + nb + 1) (float32 outputs: far fewer elements
                # are left to the per-element tiers).
                kb = self.kblock
                y = a64[:, :kb] @ self.b64[:, :kb].T
                for k0 in range(kb, k, kb):
                    y += a64[:, k0:k0 + kb] @ self.b64[:, k0:k0 + kb].T
                n_round = kb + ceil_div(k, kb) + 1
            else:
                y = a64 @ self.b64.T
                n_round = k + 1
            a_norm = np.sqrt(np.einsum("ij,ij->i", a64, a64)) * (1 + 2 * gamma(k + 2))
            # Cauchy-Schwarz: sum |a b| <= |a|_2 |b|_2 (the exact S, if asked for, comes after)
            a_fin = np.isfinite(a64).all(axis=1)
            finite = a_fin[:, None] & self.b_finite[None, :]
            ch = _Chunk(r0, r1, y, np.zeros(y.shape, bool), finite, a_norm, self.b_norm, n_round)
            if self.pow2:
                qa = _quantum_exponents(a, a64, r0, r1)
                # Whole chunk at once: S_ij < 2^(53 + qa_i + qb_j) for every (i, j) when the
                # largest a_norm_i 2^-qa_i times the largest b_norm_j 2^-qb_j is below 2^53
                # (powers of two scale exactly; an overflow to inf just fails this test).
                ra = a_norm * np.exp2(-qa)
                rb = self.b_norm * np.exp2(-self.qb)
                top = 0.0
                if ra.size and rb.size:
                    top = float(sum_upper_bound(np.asarray(np.nanmax(ra) * np.nanmax(rb)), 2))
                if a_fin.all() and self.b_finite.all() and top < 2.0**53:
                    ch.exact[...] = True
                    ch.all_exact = True
                else:
                    limit = np.exp2(np.minimum(53.0 + qa[:, None] + self.qb[None, :], 1000.0))
                    ch.exact = (ch.S < limit) & finite
        return ch

    def error_scale(self, out: np.ndarray) -> None:
        """S = |A| @ |B|^T rounded up, into ``out`` (M, N); B's float64 copy is reused in place."""
        a, k = self.a, self.a.shape[1]
        if self.blocked:
            self.b64 *= np.repeat(self.sb_blk, self.blk, axis=1)[:, :k]
        np.abs(self.b64, out=self.b64)
        starts = list(range(0, a.shape[0], self.step))

        def rows(i0: int, i1: int) -> None:
            with np.errstate(over="ignore", invalid="ignore", under="ignore"):
                for r0 in starts[i0:i1]:
                    r1 = min(a.shape[0], r0 + self.step)
                    out[r0:r1] = sum_upper_bound(np.abs(a.rows(r0, r1)) @ self.b64.T, k)

        if len(starts) > 1 and blas_pinned():
            parallel_chunks(len(starts), 1, rows)
        else:
            rows(0, len(starts))


@dataclass
class Accumulator:
    """The exact model's accumulator without an output rounding (see :func:`exact_accumulator`).

    acc: float64 (M, N); err: float64 (M, N) with |acc - exact| <= err (0 where the exactness
    certificate holds); finite: bool (M, N), False where an operand row holds NaN or inf (acc
    then carries the float64 GEMM's IEEE result); S: the exact error scale when asked for.
    """

    acc: np.ndarray
    err: np.ndarray
    finite: np.ndarray
    S: np.ndarray | None = None
    all_exact: bool = False  # err is zero everywhere (every element certified exact)


def exact_accumulator(a: Operand, b: Operand, *, want_S: bool = False) -> Accumulator:
    """The float64 accumulator of ``a @ b^T`` with a rigorous per-element error bound.

    For kernels whose arithmetic after the dot products (relu, weights, head sums) needs its own
    exact treatment: no epilogue is applied and nothing is recomputed; elements whose bound is
    not zero are the caller's to certify (or to recompute exactly).
    """
    m, k = a.shape
    n = b.shape[0]
    acc = np.empty((m, n))
    err = np.zeros((m, n))  # calloc: pages are touched only where a bound is written
    fin = np.ones((m, n), bool)
    if m == 0 or n == 0:
        return Accumulator(acc, err, fin, np.zeros((m, n)) if want_S else None)
    if k == 0:
        acc[...] = 0.0
        return Accumulator(acc, err, fin, np.zeros((m, n)) if want_S else None)
    step = _chunk_rows(m, n, k)
    chunks = _CertifiedChunks(a, b, False, step)
    all_exact = True
    for ch in chunks:
        if step >= m:
            acc = ch.y  # one chunk: no copy
        else:
            acc[ch.r0:ch.r1] = ch.y
        if not ch.all_exact:
            all_exact = False
            err[ch.r0:ch.r1] = np.where(ch.exact, 0.0, gamma(ch.n_round) * ch.S)
            fin[ch.r0:ch.r1] = ch.finite
    S = None
    if want_S:
        S = np.empty((m, n))
        with single_threaded_blas():  # a stored S must not depend on the BLAS thread count
            chunks.error_scale(S)
    return Accumulator(acc, err, fin, S, all_exact)


_KBLOCK_F32 = 512


def _exact_model(
    a: Operand, b: Operand, ep: OutputStage, want_acc: bool, want_S: bool
) -> MatmulResult:
    m, k = a.shape
    n = b.shape[0]
    out_codes = np.empty((m, n), ep.out.code_dtype)
    acc = np.empty((m, n)) if want_acc else None
    acc_lo = np.zeros((m, n)) if (want_acc and ep.out is fm.F32) else None
    S_all = np.empty((m, n)) if want_S else None
    stats: dict[str, int] = {}
    pow2 = a.pow2_scales and b.pow2_scales
    blocked = (not pow2) and ep.out is fm.F32 and a.fixed_quantum is not None and b.fixed_quantum is not None

    step = _chunk_rows(m, n, k)
    # float32 outputs have 2^16 times finer roundings than bf16 ones: the GEMM's a priori bound
    # leaves a few percent of the elements undecided at large K unless K is blocked.
    kblock = _KBLOCK_F32 if ep.out is fm.F32 and k > 4 * _KBLOCK_F32 else 0
    chunks = _CertifiedChunks(a, b, blocked, step, kblock)
    lock = threading.Lock()

    def process(ch: _Chunk) -> None:
        st: dict[str, int] = {}
        r0, r1, y, exact, finite = ch.r0, ch.r1, ch.y, ch.exact, ch.finite
        if acc is not None:
            acc[r0:r1] = y
        acc_rows = acc[r0:r1] if acc is not None else None
        lo_rows = acc_lo[r0:r1] if acc_lo is not None else None

        def bound(at: Points | None) -> np.ndarray:
            return gamma(ch.n_round) * (ch.S if at is None else ch.S[at])

        def tiers(at: Points) -> np.ndarray:
            return _exact_tiers(a, b, ep, at[0] + r0, at[1], r0, acc_rows, lo_rows, st)

        # Exact elements (and non-finite ones: IEEE semantics of the float64 GEMM carried
        # through) take the epilogue of y itself; the others must give the same bits at both
        # ends of their error interval, or go to the exact tiers.
        codes, pending = round_certified(y, bound, _RowsRounding(ep, r0, r1), final=exact | ~finite,
                                         fallback=tiers)
        if ch.all_exact:
            st["exact"] = exact.size
        else:
            st["exact"] = int(exact.sum())
            st["bounded"] = int((~pending & ~exact & finite).sum())
        out_codes[r0:r1] = codes
        with lock:
            for key, v in st.items():
                stats[key] = stats.get(key, 0) + v

    chunks.for_each(process)
    if S_all is not None:
        chunks.error_scale(S_all)
    return MatmulResult(out_codes.view(ep.out.storage), acc, acc_lo, S_all, stats)


_BF16_LSB: np.ndarray | None = None


def _bf16_lsb_table() -> np.ndarray:
    """Exponent of the lowest set bit of every bf16 bit pattern (+inf for zeros and non-finite)."""
    global _BF16_LSB
    if _BF16_LSB is None:
        with np.errstate(invalid="ignore"):
            v = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(ml_dtypes.bfloat16).astype(np.float64)
            _BF16_LSB = _lsb_exponent(v.reshape(-1, 1))
    return _BF16_LSB


def _row_norms(op: Operand) -> tuple[np.ndarray, np.ndarray]:
    """(upper bounds of the 2-norms of the scaled rows, whether each row is finite), row-chunked."""
    n, k = op.shape
    norms = np.empty(n)
    finite = np.ones(n, bool)
    step = max(1, (4 << 20) // max(8 * k, 1))
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        x = op.rows(r0, r1)
        norms[r0:r1] = np.sqrt(np.einsum("ij,ij->i", x, x))
        if k:
            finite[r0:r1] = np.isfinite(x).all(axis=1)
    return norms * (1 + 2 * gamma(k + 2)), finite


def _quantum_exponents(op: Operand, x64: np.ndarray, r0: int = 0, r1: int | None = None) -> np.ndarray:
    """Per row, the exponent q with every scaled value a multiple of 2^q (assumes pow2 scales)."""
    r1 = x64.shape[0] + r0 if r1 is None else r1
    if op.values.dtype == ml_dtypes.bfloat16 and op.scales is None and op.codes_fmt is None:
        out = np.full(r1 - r0, np.inf)
        if op.values.shape[1]:
            step = max(1, (1 << 20) // op.values.shape[1])  # bound the (rows, K) temporary
            table = _bf16_lsb_table()
            for i in range(r0, r1, step):
                j = min(r1, i + step)
                out[i - r0:j - r0] = np.take(table, op.values[i:j].view(np.uint16)).min(axis=1)
        return out
    fq = op.fixed_quantum
    if fq is not None:
        if op.scales is None:
            return np.full(r1 - r0, float(fq))
        with np.errstate(divide="ignore"):
            se = np.log2(op.scales[r0:r1])  # exact for powers of two
        return fq + se.min(axis=1) if se.shape[1] else np.full(r1 - r0, np.inf)
    return _lsb_exponent(x64)


# ----------------------------------------------------------------------------------------------
# The fp32 and limited models
# ----------------------------------------------------------------------------------------------

def _f32_accumulate(acc32: np.ndarray, s32: np.ndarray | None, p32: np.ndarray) -> np.ndarray:
    """acc + s * p in float32 arithmetic: one rounding for the product, one for the sum."""
    if s32 is not None:
        p32 = p32 * s32
    acc32 += p32
    return acc32


def _prescaled_fp32_ok(a: Operand, b: Operand) -> bool:
    """Whether the fp32 model may scale the operands before the block GEMMs.

    With FP8 / FP4 elements (every block sum exact in float64 and, when not zero, at least
    2^(qa + qb) in magnitude) and power-of-two scales 2^ea, 2^eb, the model's
    f32(f32(sa sb) * RN_f32(block sum)) equals RN_f32(block sum * 2^(ea + eb)) exactly, provided
    no scaled block sum can become a float32 subnormal (ea + eb + qa + qb >= -126) and the scale
    product is a float32 number (ea + eb <= 127, each scale itself a float32 number); overflow to
    inf is the same on both sides.
    Non-finite elements take the general path.
    """
    if not (a.pow2_scales and b.pow2_scales):
        return False
    qa, qb = a.fixed_quantum, b.fixed_quantum
    assert qa is not None and qb is not None

    def exp_range(op: Operand) -> tuple[float, float]:
        if op.scales is None or op.scales.size == 0:
            return 0.0, 0.0
        e = np.log2(op.scales)  # exact for powers of two
        return float(e.min()), float(e.max())

    (lo_a, hi_a), (lo_b, hi_b) = exp_range(a), exp_range(b)
    in_f32 = min(lo_a, lo_b) >= -149 and max(hi_a, hi_b) <= 127  # each scale a float32 number
    return in_f32 and lo_a + lo_b + qa + qb >= -126 and hi_a + hi_b <= 127


def _fp32_model_prescaled(a: Operand, b: Operand, ep: OutputStage, blk: int) -> MatmulResult:
    """The fp32 model on pre-scaled operands: per K block one float64 GEMM of the scaled values
    (exact: FP8 / FP4 elements times powers of two stay far inside float64's range), one rounding
    to float32, one float32 add.  This is the model itself under MMA block scaling, and equals
    the promotion-multiply model under :func:`_prescaled_fp32_ok`."""
    m, k = a.shape
    n = b.shape[0]
    out_codes = np.empty((m, n), ep.out.code_dtype)
    b_s = b.rows(0, n)  # NaN / inf elements follow IEEE through the GEMM, as on the device
    step = _chunk_rows(m, n, k)
    acc_all = np.empty((m, n), np.float32)
    nb = ceil_div(k, blk) if k else 0
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        for r0 in range(0, m, step):
            r1 = min(m, r0 + step)
            a_s = a.rows(r0, r1)
            acc = np.zeros((r1 - r0, n), np.float32)
            y = np.empty((r1 - r0, n))  # reused buffers: no page faults per block
            part = np.empty((r1 - r0, n), np.float32)
            for j in range(nb):
                ks = slice(j * blk, min(k, (j + 1) * blk))
                np.matmul(a_s[:, ks], b_s[:, ks].T, out=y)  # exact block sum
                np.copyto(part, y, casting="same_kind")  # one rounding to float32 (RNE)
                acc += part
            acc_all[r0:r1] = acc
            out_codes[r0:r1] = ep.apply(acc.astype(np.float64), r0, r1)
    return MatmulResult(out_codes.view(ep.out.storage), acc_all.astype(np.float64), None, None,
                        {"fp32": m * n})


def _block_partials(a_el: np.ndarray, b_el: np.ndarray, exact_ok: bool) -> np.ndarray:
    """Exact block sums a_el @ b_el^T, rounded once to float32 (float64 exact for FP8/FP4 blocks)."""
    y = a_el @ b_el.T
    if exact_ok:
        return fm.round_f64(y, fm.F32)
    # BF16/FP32 elements: the float64 block sum is exact when the products' span fits 53 bits;
    # otherwise compute the block exactly with a double-double sum of the products.
    prod_max = np.abs(a_el).max(axis=1, initial=0)[:, None] * np.abs(b_el).max(axis=1, initial=0)[None, :]
    qa = _lsb_exponent(a_el)
    qb = _lsb_exponent(b_el)
    limit = np.exp2(np.minimum(53.0 + qa[:, None] + qb[None, :], 1000.0))
    certified = prod_max * a_el.shape[1] < limit
    out = fm.round_f64(y, fm.F32)
    if not certified.all():
        rr, cc = np.nonzero(~certified)
        terms = a_el[rr] * b_el[cc]
        s, e, bound = dd_sum(terms)
        e_lo, e_hi = dd_interval(s, e, bound)
        r_lo = fm.round_dd(s, e_lo, fm.F32)
        r_hi = fm.round_dd(s, e_hi, fm.F32)
        vals = r_lo.copy()
        for j in np.flatnonzero(r_lo.view(np.uint32) != r_hi.view(np.uint32)):
            ex = fraction_sum(terms[j])
            vals[j] = np.float32(_rn(ex, fm.F32))
        out[rr, cc] = vals
    return out


def _fp32_model(a: Operand, b: Operand, ep: OutputStage, block: int, mma_block_scaling: bool,
                prescale: bool = True) -> MatmulResult:
    """Per K block: partial = RN_f32(exact block sum); acc = f32(acc + f32(f32(sa * sb) * partial))."""
    m, k = a.shape
    n = b.shape[0]
    blk = block
    if a.scales is not None:
        blk = math.gcd(blk, a.block)
    if b.scales is not None:
        blk = math.gcd(blk, b.block)
    exact_ok = a.fixed_quantum is not None and b.fixed_quantum is not None
    out_codes = np.empty((m, n), ep.out.code_dtype)
    if prescale and exact_ok and a.pow2_scales and b.pow2_scales and (mma_block_scaling or _prescaled_fp32_ok(a, b)):
        return _fp32_model_prescaled(a, b, ep, blk)
    b_el = b.element_rows(0, n)
    sb = b.block_scales(0, n, blk).astype(np.float32) if b.scales is not None else None
    step = _chunk_rows(m, n, k)
    acc_all = np.empty((m, n), np.float32)
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        for r0 in range(0, m, step):
            r1 = min(m, r0 + step)
            a_el = a.element_rows(r0, r1)
            sa = a.block_scales(r0, r1, blk).astype(np.float32) if a.scales is not None else None
            acc = np.zeros((r1 - r0, n), np.float32)
            nb = ceil_div(k, blk) if k else 0
            for j in range(nb):
                ks = slice(j * blk, min(k, (j + 1) * blk))
                part = _block_partials(a_el[:, ks], b_el[:, ks], exact_ok)
                s32 = None
                if sa is not None or sb is not None:
                    ca = sa[:, j] if sa is not None else np.ones(r1 - r0, np.float32)
                    cb = sb[:, j] if sb is not None else np.ones(n, np.float32)
                    s32 = np.multiply.outer(ca, cb)  # float32 * float32: one rounding
                if s32 is not None:
                    np.multiply(part, s32, out=part)
                acc += part
            acc_all[r0:r1] = acc
            out_codes[r0:r1] = ep.apply(acc.astype(np.float64), r0, r1)
    return MatmulResult(out_codes.view(ep.out.storage), acc_all.astype(np.float64), None, None,
                        {"fp32": m * n})


def _truncate_to(x: np.ndarray, exp_top: np.ndarray, bits: int) -> np.ndarray:
    """Truncate x toward zero to a multiple of 2^(exp_top - bits + 1) (exp_top: floor(log2) scale)."""
    q = np.exp2(exp_top - bits + 1)
    return np.trunc(x / q) * q


def _limited_model(a: Operand, b: Operand, ep: OutputStage, model: Limited) -> MatmulResult:
    """A tensor-core accumulator: see :class:`deepgemm_ref.config.Limited`.

    Per output element, in K order, in groups of 32 products: the group's terms (its products
    and the running partial sum) are aligned to the largest exponent among them and truncated
    toward zero to ``mantissa_bits`` bits (the leading bit included), then summed exactly.  Every
    ``promotion_interval`` elements (and at the end of K) the partial sum is rounded to float32,
    multiplied by the float32 product of the two block scales and added to a float32
    accumulator (float32 arithmetic, as in the ``fp32`` model).  Power-of-two scales (hardware
    block scaling) are instead applied to the products, exactly, before they enter the group.
    """
    from .errors import DGArgumentError

    m, k = a.shape
    n = b.shape[0]
    interval = model.promotion_interval
    fold = a.pow2_scales and b.pow2_scales
    if not fold:
        for op in (a, b):
            if op.scales is not None and op.block % interval:
                raise DGArgumentError(
                    f"limited: FP32 scales need blocks ({op.block}) that are multiples of the "
                    f"promotion interval ({interval})"
                )
    out_codes = np.empty((m, n), ep.out.code_dtype)
    b_v = b.rows(0, n, scaled=fold)
    acc_all = np.empty((m, n), np.float32)
    step = max(1, min(m, (16 << 20) // max(8 * n * 33, 1)))
    bits = model.mantissa_bits
    with np.errstate(over="ignore", invalid="ignore", under="ignore", divide="ignore"):
        for r0 in range(0, m, step):
            r1 = min(m, r0 + step)
            a_v = a.rows(r0, r1, scaled=fold)
            acc = np.zeros((r1 - r0, n), np.float32)
            for p0 in range(0, k, interval):
                p1 = min(k, p0 + interval)
                part = np.zeros((r1 - r0, n))
                for g0 in range(p0, p1, 32):
                    g1 = min(p1, g0 + 32)
                    terms = a_v[:, None, g0:g1] * b_v[None, :, g0:g1]  # exact products
                    terms = np.concatenate([terms, part[:, :, None]], axis=2)
                    top = np.abs(terms).max(axis=2, keepdims=True)
                    _, e = np.frexp(top)  # top in [2^(e-1), 2^e)
                    quantum = np.exp2(e.astype(np.float64) - bits)
                    quantum[top == 0] = 1.0
                    part = (np.trunc(terms / quantum) * quantum).sum(axis=2)  # exact
                s32 = None
                if not fold:
                    ca = a.block_scales(r0, r1, interval)[:, p0 // interval].astype(np.float32)
                    cb = b.block_scales(0, n, interval)[:, p0 // interval].astype(np.float32)
                    s32 = np.multiply.outer(ca, cb)
                acc = _f32_accumulate(acc, s32, fm.round_f64(part, fm.F32))
            acc_all[r0:r1] = acc
            out_codes[r0:r1] = ep.apply(acc.astype(np.float64), r0, r1)
    return MatmulResult(out_codes.view(ep.out.storage), acc_all.astype(np.float64), None, None,
                        {str(model): m * n})


# ----------------------------------------------------------------------------------------------
# Entry point
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Accumulation:
    """How the core accumulates, as values (the core reads no global state).

    model:             ``"exact"``, ``"fp32"`` or a :class:`Limited`.
    fp32_block:        K block of the ``fp32`` model's partial sums (the target's MMA block).
    mma_block_scaling: whether UE8M0 block scales are applied inside the MMA (sm100, ascend950):
                       the block partial is then RN_f32(exact block sum * 2^(ea + eb)), one
                       rounding, and a scale product beyond float32's range never exists as a
                       float32 number.
    """

    model: AccumulationModel = "exact"
    fp32_block: int = 32
    mma_block_scaling: bool = False


def scaled_matmul(
    a: Operand,
    b: Operand,
    output: OutputStage,
    *,
    model: AccumulationModel = "exact",
    fp32_block: int = 32,
    mma_block_scaling: bool = False,
    want_acc: bool = False,
    want_S: bool = False,
) -> MatmulResult:
    """``output(sum_k a[m, k] sa[m, k // ba] b[n, k] sb[n, k // bb])`` for every (m, n).

    a: Operand (M, K); b: Operand (N, K); output: the output stage (format, optional alpha and
    c (M, N)).  model, fp32_block, mma_block_scaling: see :class:`Accumulation`.
    Returns a :class:`MatmulResult` whose ``out`` is a fresh (M, N) array of the output dtype.
    """
    m, k = a.shape
    n, kb = b.shape
    assert k == kb, (a.shape, b.shape)
    if m == 0 or n == 0:
        return MatmulResult(np.empty((m, n), output.out.storage))
    if k == 0:
        zeros = np.zeros((m, n))
        return MatmulResult(output.apply(zeros, 0, m).view(output.out.storage),
                            zeros if want_acc else None, None, zeros.copy() if want_S else None)
    if model == "exact":
        # Stored float64 tensors (an inexact acc, S) are bit-stable only with a one-thread BLAS
        # (see _parallel.single_threaded_blas); chunks then run on the package's pool.
        with single_threaded_blas() if (want_acc or want_S) else contextlib.nullcontext():
            return _exact_model(a, b, output, want_acc, want_S)
    if model == "fp32":
        res = _fp32_model(a, b, output, fp32_block, mma_block_scaling)
    elif isinstance(model, Limited):
        res = _limited_model(a, b, output, model)
    else:  # pragma: no cover - validated by config
        raise ValueError(f"unknown accumulation model {model!r}")
    if want_S:
        with single_threaded_blas():
            res.S = _exact_model(a, b, OutputStage(fm.F32), False, True).S
    if not want_acc:
        res.acc = None
    return res


@dataclass
class Products:
    """The dot products ``sum_k a[m, k] sa b[n, k] sb`` themselves, without an output rounding.

    values: exact model: the float64 accumulator (exact where ``err`` is 0); other models: the
            model's float32 results (M, N).
    err:    exact model: float64 (M, N) with |values - exact| <= err, or None when every element
            is certified exact; other models: None.
    S:      the exact error scale sum |a b| (rounded up), when asked for.
    exact:  whether ``values`` are the exact model's (certified) accumulators.
    """

    values: np.ndarray
    err: np.ndarray | None
    S: np.ndarray | None
    exact: bool


def dot_products(a: Operand, b: Operand, accumulation: Accumulation, *, want_S: bool = False) -> Products:
    """The dot products of ``a`` (M, K) and ``b`` (N, K) as ``accumulation`` computes them.

    For kernels whose arithmetic after the dot products (relu, weights, head sums) is their own:
    the exact model gives :func:`exact_accumulator`'s certified float64 values and bounds, the
    other models their float32 results (:func:`scaled_matmul` into float32).
    """
    if accumulation.model == "exact":
        acc = exact_accumulator(a, b, want_S=want_S)
        return Products(acc.acc, None if acc.all_exact else acc.err, acc.S, True)
    res = scaled_matmul(a, b, OutputStage(fm.F32), model=accumulation.model, fp32_block=accumulation.fp32_block,
                        mma_block_scaling=accumulation.mma_block_scaling, want_S=want_S)
    return Products(res.out, None, res.S, False)


def __getattr__(name: str) -> Any:
    # A compatibility alias for callers written before the rename (remove once none is left).
    if name == "Epilogue":
        warnings.warn("deepgemm_ref.core.Epilogue is now deepgemm_ref.core.OutputStage (deepgemm_ref.epilogue.Epilogue "
                      "is DeepGEMM-Ascend's epilogue object)", DeprecationWarning, stacklevel=2)
        return OutputStage
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
