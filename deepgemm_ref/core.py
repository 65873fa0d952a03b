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

How the exact result is obtained, per output element:

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
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from functools import partial
from typing import Any

import ml_dtypes
import numpy as np

from . import formats as fm
from ._memory import work_budget, work_reporter
from ._parallel import blas_pinned, blas_threads_pool, num_threads, parallel_chunks, single_threaded_blas
from .certified import Points, decode_codes, round_certified, within_half_gap
from .config import AccumulationModel, Limited
from .exact import (
    U32,
    U64,
    Slices,
    ceil_div,
    dd_interval,
    dd_sum,
    dd_to_f64_directed,
    fraction_sum,
    gamma,
    pairwise_sum,
    slice_bits,
    split_windows,
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
    "error_scale",
    "dot_products",
    "gemm_work_bytes",
]


# ----------------------------------------------------------------------------------------------
# Operands
# ----------------------------------------------------------------------------------------------

@dataclass
class Operand:
    """A canonical GEMM operand of logical shape (MN, K).

    values: (MN, K) array of element values in any of: float32, float64, float16, ml_dtypes
            bfloat16 / float8_e4m3fn / float8_e5m2, or uint8 E2M1 codes (``codes_fmt=E2M1``);
            with ``packed``, (MN, K / 2) uint8 bytes of two E2M1 codes each (low nibble first,
            :func:`formats.pack_fp4`'s layout), decoded a byte at a time.
            Any strides (views are fine).
    scales: float64 (MN, ceil(K / block)) scale of every row and K block, or None (all 1).
    block:  K block size of ``scales`` (ignored without scales).
    """

    values: np.ndarray
    scales: np.ndarray | None = None
    block: int = 0
    codes_fmt: fm.Format | None = None
    _pow2: bool | None = field(default=None, repr=False)
    packed: bool = False

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.values.shape[0]), int(self.values.shape[1]) * (2 if self.packed else 1))

    def subset(self, idx: np.ndarray | slice) -> Operand:
        """The rows ``idx`` (an index array or a slice) as an operand of their own."""
        return Operand(self.values[idx], None if self.scales is None else self.scales[idx], self.block,
                       self.codes_fmt, self._pow2, self.packed)

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

    @property
    def byte_format(self) -> fm.Format | None:
        """The format of one-byte element codes (FP8 dtypes, E2M1 codes), else None."""
        return self.codes_fmt or _BYTE_FORMATS.get(self.values.dtype)

    def element_rows(self, r0: int, r1: int) -> np.ndarray:
        """Unscaled element values of rows [r0, r1) as float64 (r1 - r0, K)."""
        v = self.values[r0:r1]
        fmt = self.byte_format
        if self.packed:
            v = fm.unpack_fp4(v)
        if fmt is not None:  # one-byte formats: a 256-entry table is much faster than a cast
            return np.take(_decode_table(fmt), v.view(np.uint8))
        return v.astype(np.float64)

    def scale_rows(self, r0: int, r1: int) -> np.ndarray | None:
        """Scales of rows [r0, r1) expanded to one per element: float64 (r1 - r0, K), or None."""
        if self.scales is None:
            return None
        k = self.shape[1]
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
        return self.subset(idx).rows(0, idx.size, scaled)

    def take_block_scales(self, idx: np.ndarray, block: int) -> np.ndarray:
        """Like :meth:`block_scales` for the rows listed in ``idx``."""
        return self.subset(idx).block_scales(0, idx.size, block)

    def block_scales(self, r0: int, r1: int, block: int) -> np.ndarray:
        """Scales per row and per K block of size ``block`` (which must divide self.block)."""
        k = self.shape[1]
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


#: Pairs of codes read as one little-endian uint16 (the first code in the low byte).
_PAIRS_OK = sys.byteorder == "little"
_PAIR_TABLES: dict[str, np.ndarray] = {}


def _pair_table(fmt: fm.Format, bits: int = 8) -> np.ndarray:
    """complex128 (2^(2 bits),): entry ``lo + 2^bits hi`` holds the values of the ``bits``-bit codes
    ``lo`` and ``hi`` as its (real, imaginary) float64 pair, so that one lookup decodes two adjacent
    codes: bytes of FP8 codes read as uint16 (bits 8: 1 MiB a format), or packed E2M1 bytes (bits
    4, low nibble first: 4 KiB, it stays in the cache)."""
    key = f"{bits} {fmt.name}"
    t = _PAIR_TABLES.get(key)
    if t is None:
        single = _decode_table(fmt)
        idx = np.arange(1 << (2 * bits))
        pairs = np.empty((idx.size, 2))
        pairs[:, 0] = single[idx & ((1 << bits) - 1)]
        pairs[:, 1] = single[idx >> bits]
        t = _PAIR_TABLES[key] = pairs.view(np.complex128).reshape(-1)
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
    via:    optional format the accumulator is stored in before the rest of the epilogue reads it
            (``z = via(z)`` after alpha): DeepGEMM's ``einsum('bmk,bnk->mn')`` with a bf16 ``d``
            sums into a zeroed float32 workspace and copies it into ``d``
            (``d = bf16(f32(+0 + acc))``, csrc/apis/einsum.hpp).
    """

    out: fm.Format
    alpha: float | None = None
    c: np.ndarray | None = None
    c_mode: str = "kernel"
    via: fm.Format | None = None

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

    @property
    def dd_exact(self) -> bool:
        """Whether :meth:`apply_points_dd` rounds the double-double exactly (``up`` unused)."""
        return self.alpha is None and self.via is None and (self.c is None or self._round_first)

    def apply_points_dd(
        self, hi: np.ndarray, lo: np.ndarray, rows: np.ndarray, cols: np.ndarray, up: bool
    ) -> np.ndarray:
        """Output codes for double-double accumulator values (the end of an interval).

        Without ``alpha``, and without ``c`` or with a bf16 output, every step stays exact on a
        double-double; otherwise the value is first rounded outward (``up``) to float64, which
        keeps the interval valid.
        """
        if self.dd_exact:
            if self.c is None:
                return fm.round_dd(hi, lo, self.out).view(self.out.code_dtype)
            z = fm.round_dd(hi, lo, self.out).astype(np.float64)
            s, e = two_sum(self.c[rows, cols].astype(np.float64), z)
            return fm.round_dd(s, e, self.out).view(self.out.code_dtype)
        return self.apply_points(dd_to_f64_directed(hi, lo, up), rows, cols)

    def transposed(self) -> OutputStage:
        """The same stage for the transposed product (``c`` transposed)."""
        return OutputStage(self.out, self.alpha, None if self.c is None else self.c.T, self.c_mode, self.via)

    def margin(self, x: np.ndarray, r0: int, r1: int, err: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
        """(codes of ``x`` as :meth:`apply` gives them, bool: every real within ``err`` of ``x``
        gives the same codes): the margin certificate of :mod:`deepgemm_ref.certified`."""
        return self._apply_margin(x, None if self.c is None else self.c[r0:r1], err)

    def margin_points(self, x: np.ndarray, rows: np.ndarray, cols: np.ndarray,
                      err: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`margin` for scattered elements (rows[i], cols[i])."""
        return self._apply_margin(x, None if self.c is None else self.c[rows, cols], err)

    def _apply_margin(self, x: np.ndarray, c: np.ndarray | None,
                      err: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`_apply` and the half-gap test of its first rounding (alpha's float32 product;
        without alpha the output rounding of ``x``, or of ``c + x`` for a one-rounding ``c``):
        once that rounding is the same over the interval, so is everything after it."""
        if self.out is fm.BF16 and c is None and self.alpha is None and self.via is None and x.dtype == np.float64:
            return _bf16_margin(x, err)
        ok: np.ndarray | None = None
        z = x
        code_dtype = self.out.code_dtype
        if self.alpha is not None:
            p, e = two_prod(np.float64(self.alpha), z)
            z = fm.round_dd(p, e, fm.F32).astype(np.float64)
            ok = within_half_gap(p, e, z, np.multiply(err, abs(self.alpha)), fm.F32)
        if self.via is not None:
            zv = fm.round_f64(z, self.via).astype(np.float64)
            if ok is None:
                ok = within_half_gap(z, None, zv, err, self.via)
            z = zv
        if c is None:
            codes = fm.round_f64(z, self.out).view(code_dtype)
            if ok is None:
                ok = within_half_gap(x, None, decode_codes(codes, self.out), err, self.out)
            return codes, ok
        if self._round_first:
            z2 = fm.round_f64(z, self.out).astype(np.float64)
            if ok is None:
                ok = within_half_gap(x, None, z2, err, self.out)
            s, e = two_sum(c.astype(np.float64), z2)
            return fm.round_dd(s, e, self.out).view(code_dtype), ok
        s, e = two_sum(c.astype(np.float64), z)
        codes = fm.round_dd(s, e, self.out).view(code_dtype)
        if ok is None:
            ok = within_half_gap(s, e, decode_codes(codes, self.out), err, self.out)
        return codes, ok

    def _apply(self, x: np.ndarray, c: np.ndarray | None) -> np.ndarray:
        if self.out is fm.BF16 and c is None and self.alpha is None and self.via is None and x.dtype == np.float64:
            return _bf16_codes(x)
        z = x
        if self.alpha is not None:
            p, e = two_prod(np.float64(self.alpha), z)
            z = fm.round_dd(p, e, fm.F32).astype(np.float64)
        if self.via is not None:
            z = fm.round_f64(z, self.via).astype(np.float64)
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
        if self.via is not None and not _nonfinite(v):
            v = _rn_signed(v, self.via)  # the workspace: f32(+0 + v), so an exact zero stays +0
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


_BF16_TIE = np.uint32(0x8000)
_HALF_GAP_BF16 = 2.0**-8 * (1 - 2.0**-40)  # 2^-8 2^e: the half gap of a bf16 r in [2^e, 2^(e + 1)), less the slack
_HALF_GAP_BF16_SUB = 2.0**-134 * (1 - 2.0**-40)
_F64_EXP = np.uint64(0x7FF0000000000000)


def _bf16_rne_bits(u: np.ndarray) -> np.ndarray:
    """bf16 codes (uint16) of finite float32 bits ``u`` (uint32), rounded to nearest even:
    ``(u + 0x7FFF + bit16(u)) >> 16`` (no carry out of 32 bits for finite values)."""
    t = u >> np.uint32(16)
    t &= np.uint32(1)
    t += np.uint32(0x7FFF)
    t += u
    t >>= np.uint32(16)
    return t.astype(np.uint16)


def _bf16_codes(x: np.ndarray) -> np.ndarray:
    """bf16 codes (uint16) of float64 ``x``, correctly rounded (RNE), as :func:`formats.round_f64`
    gives them: float64 -> float32 -> bf16, except where the float32 value is exactly a bf16
    midpoint that ``x`` is not (a double rounding); those elements take :func:`formats.round_f64`."""
    with np.errstate(over="ignore", invalid="ignore"):
        x32 = x.astype(np.float32, order="C")
        finite = x32.size > 0 and bool(np.isfinite(x32.max())) and bool(np.isfinite(x32.min()))
    u = x32.view(np.uint32)
    if finite:  # RNE on the float32 bits (about twice as fast as the cast; the same codes)
        codes = _bf16_rne_bits(u)
    else:  # NaN keeps the cast's quiet NaN
        codes = x32.astype(ml_dtypes.bfloat16).view(np.uint16)
    tie = np.flatnonzero((u.reshape(-1) & np.uint32(0xFFFF)) == _BF16_TIE)
    if tie.size:
        xv = x[np.unravel_index(tie, x.shape)]
        off = xv != x32.reshape(-1)[tie]
        if off.any():
            codes.reshape(-1)[tie[off]] = fm.round_f64(xv[off], fm.BF16).view(np.uint16)
    return codes


def _bf16_margin(x: np.ndarray, err: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
    """:meth:`OutputStage.margin` of a plain bf16 output (no alpha, c or via), in a few passes.

    Codes: :func:`_bf16_codes`.  The certificate decides a subset of what the margin test of
    :func:`certified.within_half_gap` decides, and everything that test decides is decided by
    :func:`certified.round_certified`'s per-element test after it (its bound is at most the
    margin), so the elements left open, and everything computed from them, are the same.
    Tiles whose values all lie in float32's normal range above 2^-103 take
    :func:`_bf16_margin_f32` (integer arithmetic on the float32 bits, about a third of the
    time); the others the float64 test below.
    """
    fast = _bf16_margin_f32(x, err)
    if fast is not None:
        return fast
    return _bf16_margin_f64(x, err)


_F32_EXP = np.uint32(0x7F800000)
_F32_EXP_LO = np.uint32(24 << 23)  # float32 exponents 24 .. 254: |f32(x)| in [2^-103, 2^128)
_F32_EXP_HI = np.uint32(254 << 23)


def _bf16_margin_f32(x: np.ndarray, err: np.ndarray | float) -> tuple[np.ndarray, np.ndarray] | None:
    """:func:`_bf16_margin` from the bits of ``x32 = f32(x)``, or None where some ``|x32|`` is
    outside [2^-103, 2^128) (zeros, tiny values, infinities, NaN: the float64 test's job).

    With ``u`` the bits of ``x32`` in binade ``e`` (unit ``2^(e - 23)``, one float32 ulp):
    codes are ``(u + 0x7FFF + bit16(u)) >> 16`` (RNE on the bits), except where ``x32`` is a
    bf16 midpoint (``u & 0xFFFF == 0x8000``; the cast may be a double rounding there, so those
    are among the few below).  The nearest rounding boundary of ``x32`` is the midpoint
    ``|rem - 0x8000|`` units away (``rem = u & 0xFFFF``) or, below a power of two, the finer
    midpoint ``rem + 0x4000`` units below; the smaller of the two, less one unit for
    ``|x - x32| <= 1/2`` unit (midpoints are float32 numbers, so ``x`` and ``x32`` lie on the
    same side of each), bounds ``x``'s distance from below, exactly in float32.  Certified: that
    distance exceeds ``err`` (rounded up to float32).  Elements with ``x32`` at most one unit
    from a midpoint (about 3 in 2^16) take :func:`_bf16_margin_f64`, codes and test.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        x32 = x.astype(np.float32, order="C")
    u = x32.view(np.uint32)
    e = u & _F32_EXP
    if e.size == 0 or e.min() < _F32_EXP_LO or e.max() > _F32_EXP_HI:
        return None
    codes = _bf16_rne_bits(u)
    rem = (u & np.uint32(0xFFFF)).view(np.int32)
    d = rem - np.int32(0x8000)
    np.abs(d, out=d)
    # x32 on a bf16 midpoint or one unit from one: the float32 bits cannot place x (RNE of them
    # may be a double rounding); those few take the float64 test, codes included
    near = np.unravel_index(np.flatnonzero(d.reshape(-1) <= 1), d.shape) if d.min() <= 1 else None
    rem += np.int32(0x4000)
    np.minimum(d, rem, out=d)
    d -= np.int32(1)
    e -= np.uint32(23 << 23)  # 2^(e - 23): a float32 power of two (e >= 24)
    dist = d.astype(np.float32)
    dist *= e.view(np.float32)  # exact: an integer below 2^15 times a power of two
    with np.errstate(over="ignore", invalid="ignore"):
        err64 = np.asarray(err, np.float64)
        ok = dist > (err64 * (1 + 2.0**-20)).astype(np.float32)  # err rounded up to float32
    if near is not None:
        codes[near], ok[near] = _bf16_margin_f64(x[near], np.broadcast_to(err64, x.shape)[near])
    return codes, ok


def _bf16_margin_f64(x: np.ndarray, err: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_bf16_margin` in float64: the margin test of :func:`certified.within_half_gap`
    with the half gap replaced by its lower bound ``|r| 2^-9`` (bf16 values have 8 significant
    bits; at a power of two it is the half gap below)."""
    codes = _bf16_codes(x)
    r = np.left_shift(codes, 16, dtype=np.uint32).view(np.float32).astype(np.float64)
    d = x - r
    # The half gap around r: 2^(e - 8) for r in [2^e, 2^(e + 1)), half that below a power of two
    # when x lies toward zero from it, and 2^-134 at and below the smallest normal (the
    # exponent's bits alone give 2^e: 0 for r = 0, inf for inf).  An interval around x beyond a
    # power of two that reaches back past it must also stay above the finer boundary below it.
    gap = (r.view(np.uint64) & _F64_EXP).view(np.float64)
    gap *= _HALF_GAP_BF16
    pow2 = (codes & np.uint16(0x7F)) == 0
    beyond = (d < 0) == (r < 0)
    pow2 &= ~beyond
    np.multiply(gap, 0.5, out=gap, where=pow2)
    np.maximum(gap, _HALF_GAP_BF16_SUB, out=gap)  # zero, subnormals and the smallest normal: 2^-134
    np.abs(d, out=d)
    e = np.multiply(err, 1 + 2.0**-40)
    ok = d + e < gap
    back = ok & beyond & (e >= d) & ((codes & np.uint16(0x7F)) == 0)
    if back.any():
        at = np.nonzero(back)
        ok[at] = np.broadcast_to(e, ok.shape)[at] - d[at] < np.maximum(gap[at] * 0.5, _HALF_GAP_BF16_SUB)
    return codes, ok


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

#: Elements per tile of the passes beside the GEMMs (certificates, epilogue, error scale): small
#: enough that a tile and its temporaries stay in the caches, large enough that NumPy's per-call
#: overhead is small and that two pool threads seldom wait for each other's GIL hand-overs (one
#: NumPy pass over 2^15 elements takes a few microseconds, about one hand-over:
#: benchmarks/bench_threads.py).  Tiles run on the package's thread pool.
_TILE = 1 << 17
#: Elements per tile of the operand conversions (decode, scale and a reduction per row, no
#: temporaries): larger, since two pool threads on tiles of 2^15 elements mostly wait for each
#: other's GIL hand-overs (a bf16 (4096, 4096) operand: 22 ms at two threads against 9.5 ms with
#: tiles of 2^19; FP8 46 ms against 14; benchmarks/speed-table.md).
_CONVERT_TILE = 1 << 19


#: Bytes of scratch memory the core keeps between calls (float64 copies of the operands, GEMM
#: chunks): a fresh allocation of that size costs its page faults (and, with transparent huge
#: pages, sometimes a compaction stall) on every call, as much as a tenth of the GEMM itself.
_SCRATCH_KEEP = 512 << 20
_scratch: list[np.ndarray] = []
_scratch_lock = threading.Lock()


def _scratch_take(shape: tuple[int, ...], dtype: Any = np.float64) -> np.ndarray:
    """An uninitialised C-contiguous array, in memory a previous call gave back when one is
    large enough (the smallest such); otherwise a fresh one, and then everything kept is
    released first (the kept memory never adds to a call's peak)."""
    dt = np.dtype(dtype)
    need = dt.itemsize * math.prod(shape)
    with _scratch_lock:
        fits = [i for i, buf in enumerate(_scratch) if buf.nbytes >= need]
        if fits:
            buf = _scratch.pop(min(fits, key=lambda i: _scratch[i].nbytes))
            return buf[:need].view(dt).reshape(shape)
        _scratch.clear()
    return np.empty(max(need, 1), np.uint8)[:need].view(dt).reshape(shape)


def _scratch_give(*arrays: np.ndarray | None) -> None:
    """Give arrays from :func:`_scratch_take` back (their memory is reused by later calls; the
    caller must hold no view of them).  At most ``_SCRATCH_KEEP`` bytes are kept, the largest
    buffers first."""
    with _scratch_lock:
        for x in arrays:
            if x is None:
                continue
            base = x
            while isinstance(base.base, np.ndarray):
                base = base.base
            if base.dtype != np.uint8 or base.ndim != 1:
                continue  # not from _scratch_take
            if base.nbytes >= (1 << 20) and not any(b is base for b in _scratch):
                _scratch.append(base)
        _scratch.sort(key=lambda b: -b.nbytes)
        total = 0
        for i, b in enumerate(_scratch):
            total += b.nbytes
            if total > _SCRATCH_KEEP:
                del _scratch[i:]
                break


def release_scratch() -> None:
    """Release the scratch memory the core keeps between calls."""
    with _scratch_lock:
        _scratch.clear()


def _tile_rows(width: int) -> int:
    return max(1, _TILE // max(width, 1))


def _convert_rows(width: int) -> int:
    return max(1, _CONVERT_TILE // max(width, 1))


def _chunk_rows(m: int, n: int, k: int, budget: int | None = None) -> int:
    """Rows of ``a`` per chunk of the float64 GEMM.

    A chunk holds its float64 rows of ``a`` and its (rows, N) GEMM result (two of them for K-blocked
    and FP32-scaled products), and later the float32 rows of the error scale (the passes beside
    the GEMM work on small tiles of them; :func:`_row_work`); the whole
    float64 copy of ``b`` is kept.  A chunk is at most a quarter of the float64 copies of A, B and
    D (at least 64 MiB, and at least 512 rows: chunks enough for the thread pool, and the BLAS at
    full speed), and the chunks in flight (one per pool thread) with the copy of ``b`` fit in the
    work budget of the limit in force (:func:`._memory.work_budget`: what the golden workflow
    leaves of ``--max-memory`` beside the case's own tensors, else a quarter of the limit;
    chunks of at least 16 rows).  The golden bytes do not depend on the chunking (each element's
    sum runs in the same order).
    """
    # as before the limit: a quarter of the copies, at least 512 rows
    cap = max(512, max(64 << 20, 2 * (m * k + n * k + m * n)) // max(8 * (n + k) + 2 * n, 1))
    allowed = work_budget() if budget is None else budget
    fits = max(16, (allowed - 8 * n * k) // max(1, num_threads()) // max(_row_work(n, k), 1))
    return max(1, min(m, cap, fits))


def gemm_work_bytes(m: int, n: int, k: int, budget: int | None = None) -> int:
    """Bytes the exact model of an (m, k) by (n, k) product holds beside its inputs and (M, N)
    results, at most: the whole float64 copy of the kept operand (``b``, or ``a`` when the
    operands are swapped), and per chunk in flight (one per pool thread) its float64 rows and
    (rows, N) GEMM result, a second such result (K-blocked and FP32-scaled products) and the
    float32 rows of the error scale.  ``budget``: the work budget (default
    :func:`._memory.work_budget`).  The golden workflow's memory estimates use it."""
    if m <= 0 or n <= 0 or k <= 0:
        return 0
    if _swap_operands(m, n, k):
        m, n = n, m
    rows = _chunk_rows(m, n, k, budget)
    chunks = -(-m // rows)
    inflight = min(chunks, max(1, num_threads())) if chunks > 1 else 1
    return 8 * n * k + inflight * rows * _row_work(n, k)


def _row_work(n: int, k: int) -> int:
    """Bytes per row of a chunk: its float64 row of ``a`` and row of the GEMM result, a second
    result row (K-blocked and FP32-scaled products) and the error scale's float32 rows."""
    return 8 * (n + k) + 8 * n + 4 * (n + k)


def _swap_operands(m: int, n: int, k: int) -> bool:
    """Whether to convert ``a`` whole and stream ``b`` instead (the smaller float64 copy is kept
    whole: that halves the peak memory of a GEMM whose N is much larger than M)."""
    return n > m and 8 * n * k > (256 << 20)


def _decode_into(op: Operand, r0: int, r1: int, out: np.ndarray) -> None:
    """Unscaled element values of rows [r0, r1) of ``op`` into the float64 array ``out``."""
    v = op.values[r0:r1]
    fmt = op.byte_format
    if op.packed:  # two E2M1 codes a byte: one lookup in a 256-entry table of value pairs
        assert fmt is not None
        if _PAIRS_OK and out.flags.c_contiguous:
            np.take(_pair_table(fmt, 4), v.view(np.uint8), out=out.view(np.complex128), mode="clip")
            return
        v = fm.unpack_fp4(v)
    if fmt is not None:  # one-byte formats: a table lookup
        codes = v.view(np.uint8)
        if (_PAIRS_OK and codes.ndim == 2 and codes.shape[1] % 2 == 0 and codes.flags.c_contiguous
                and out.flags.c_contiguous):
            # two codes at once: a 2^16-entry table of value pairs (one lookup per two elements)
            np.take(_pair_table(fmt), codes.view(np.uint16), out=out.view(np.complex128), mode="clip")
        else:
            np.take(_decode_table(fmt), codes, out=out, mode="clip")
    else:
        # bfloat16 (ml_dtypes' cast: the same bits as widening the top half of a float32, NaN
        # payloads included, about 1.4x faster than the shift), float16, float32 and float64
        # widen exactly
        np.copyto(out, v, casting="unsafe")


def _scale_into(op: Operand, r0: int, r1: int, out: np.ndarray) -> None:
    """Multiply the rows [r0, r1) held in ``out`` (C-contiguous) by their block scales, in place
    (exact: at most 24 + 24 significand bits)."""
    if op.scales is None:
        return
    rows, k = out.shape
    blk = op.block
    s = op.scales[r0:r1]
    full = k // blk
    if full:
        view = np.lib.stride_tricks.as_strided(out, (rows, full, blk), (out.strides[0], blk * 8, 8))
        view *= s[:, :full, None]
    if full * blk < k:
        out[:, full * blk:] *= s[:, full:full + 1]


def _values_into(op: Operand, r0: int, r1: int, out: np.ndarray, scaled: bool) -> None:
    """Rows [r0, r1) of ``op`` into ``out`` (C-contiguous float64): the element values, times
    their scales when ``scaled`` (:func:`_decode_into`, :func:`_scale_into`); packed E2M1 codes
    with power-of-two scales take both in one lookup (:func:`_packed_scaled_into`)."""
    if scaled and op.packed and op.scales is not None and _packed_scaled_into(op, r0, r1, out):
        return
    _decode_into(op, r0, r1, out)
    if scaled:
        _scale_into(op, r0, r1, out)


def _packed_scaled_into(op: Operand, r0: int, r1: int, out: np.ndarray) -> bool:
    """Packed E2M1 rows times their power-of-two block scales, one lookup per byte in a table of
    scaled value pairs (``scale 2^e`` of the ``e``-th table, exact: E2M1 values times powers of
    two); False where it does not apply (scales not powers of two, odd blocks, more than 64
    scale exponents in the rows, a destination the pair view cannot write)."""
    blk = op.block
    if not (_PAIRS_OK and op.pow2_scales and blk % 2 == 0 and out.flags.c_contiguous):
        return False
    assert op.scales is not None and op.byte_format is not None
    v = op.values[r0:r1].view(np.uint8)
    rows, half = v.shape
    if rows == 0 or half == 0:
        return True
    s = op.scales[r0:r1]
    e = (s.view(np.uint64) >> np.uint64(52)).astype(np.int32)  # biased exponents (powers of two)
    lo = int(e.min())
    span = int(e.max()) - lo + 1
    if span > 64 or lo == 0:  # (a float64 subnormal scale has no exponent bits)
        return False
    scales = np.ldexp(1.0, np.arange(lo, lo + span) - 1023)
    # value pairs times the scales as float64 (a complex product would lose the signs of zeros)
    table = (_pair_table(op.byte_format, 4).view(np.float64)[None, :] * scales[:, None]).reshape(-1)
    table = table.view(np.complex128)  # (span * 256,)
    idx = np.empty((rows, half), np.uint16)
    per = blk // 2  # bytes per scale block
    full = half // per
    sid = (e - lo).astype(np.uint16) << np.uint16(8)
    if full:
        body = idx[:, :full * per].reshape(rows, full, per)
        np.copyto(body, v[:, :full * per].reshape(rows, full, per), casting="unsafe")
        body |= sid[:, :full, None]
    if full * per < half:
        np.copyto(idx[:, full * per:], v[:, full * per:], casting="unsafe")
        idx[:, full * per:] |= sid[:, full:full + 1]
    np.take(table, idx, out=out.view(np.complex128), mode="clip")
    return True


def _norm_bounds(sumsq: np.ndarray, k: int) -> np.ndarray:
    """Upper bounds of 2-norms from float64 sums of squares of K values (squares that underflow
    lose at most 2^-1075 each: the floor keeps the bound rigorous)."""
    return np.sqrt(sumsq) * (1 + 2 * gamma(k + 2)) + math.sqrt(k) * 2.0**-537


def _convert(op: Operand, r0: int, r1: int, out: np.ndarray, scaled: bool = True,
             scaled_norms: bool = True, want_norms: bool = True,
             norms: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Rows [r0, r1) of ``op`` as float64 into ``out`` (C-contiguous (rows, K)), tile by tile on the
    package's pool, with the rows' norms from the values just written (no second conversion).

    Returns (upper bounds of the 2-norms of the *scaled* rows, whether each row is finite).
    ``scaled=False`` writes the unscaled elements (their scaled norms are still returned unless
    ``scaled_norms`` is False).  ``want_norms=False``: the values alone (two empty arrays returned).
    ``norms``: upper bounds known already (:func:`_scale_norm_bounds`, scaled values): they are
    returned as they are, and the pass over the values only finds the non-finite rows (a row sum
    of values whose magnitudes are bounded is finite exactly when every value is).
    """
    rows, k = out.shape
    sumsq = np.empty(rows)
    with_scales = op.scales is not None and scaled_norms and not scaled
    if norms is not None:
        assert scaled
        fmt = op.byte_format
        # finite scales (power-of-two scales are) on a format without NaN or inf codes (E2M1):
        # every value is finite, nothing to look for
        look = (fmt is None or fmt.has_nan or fmt.has_inf
                or (op.scales is not None and not bool(np.isfinite(op.scales[r0:r1]).all())))
        row_sum = np.zeros(rows)

        def checked(t0: int, t1: int) -> None:
            o = out[t0:t1]
            with np.errstate(over="ignore", invalid="ignore"):
                _values_into(op, r0 + t0, r0 + t1, o, True)
                if look:
                    np.add.reduce(o, axis=1, out=row_sum[t0:t1])

        parallel_chunks(rows, _convert_rows(k), checked)
        finite = np.isfinite(row_sum)
        if not finite.all():  # the norms of the values themselves, as below (NaN or inf)
            bad = np.flatnonzero(~finite)
            norms = norms.copy()
            with np.errstate(over="ignore", invalid="ignore"):
                norms[bad] = _norm_bounds(np.einsum("ij,ij->i", out[bad], out[bad]), k)
        return norms, finite
    if not want_norms:
        def values(t0: int, t1: int) -> None:
            with np.errstate(over="ignore", invalid="ignore"):
                _values_into(op, r0 + t0, r0 + t1, out[t0:t1], scaled)

        parallel_chunks(rows, _convert_rows(k), values)
        return np.empty(0), np.empty(0, bool)

    def tile(t0: int, t1: int) -> None:
        o = out[t0:t1]
        with np.errstate(over="ignore", invalid="ignore"):
            _values_into(op, r0 + t0, r0 + t1, o, scaled)
            if with_scales:
                t = o.copy()
                _scale_into(op, r0 + t0, r0 + t1, t)
                sumsq[t0:t1] = np.einsum("ij,ij->i", t, t)
            else:
                sumsq[t0:t1] = np.einsum("ij,ij->i", o, o)

    parallel_chunks(rows, _convert_rows(k), tile)
    with np.errstate(over="ignore", invalid="ignore"):
        norms = _norm_bounds(sumsq, k)
    finite = np.isfinite(norms)
    if not finite.all():  # a huge finite row can overflow its sum of squares: look at the values
        for i in np.flatnonzero(~finite):
            finite[i] = bool(np.isfinite(out[i]).all()) if (scaled or not with_scales) else \
                bool(np.isfinite(op.rows(r0 + i, r0 + i + 1)).all())
    return norms, finite


def _scale_norm_bounds(op: Operand, r0: int, r1: int) -> np.ndarray | None:
    """Upper bounds of the 2-norms of the scaled rows [r0, r1) from the scales alone, for element
    formats with a largest finite magnitude (FP8, FP4; None for the others).

    Every finite element of block ``j`` is at most ``max * s_j`` in magnitude and a block holds at
    most ``block`` elements, so ``|row|_2 <= max * sqrt(block * sum_j s_j^2)`` over the finite
    elements; the float64 evaluation (a sum of ``nb`` terms, a square root and two products) is
    covered by the factor ``1 + 2 gamma(nb + 4)``.
    """
    fmt = op.byte_format
    if fmt is None:
        return None
    k = op.shape[1]
    with np.errstate(over="ignore", invalid="ignore"):
        if op.scales is None:
            return np.full(r1 - r0, fmt.max * math.sqrt(k) * (1 + 2 * gamma(4)))
        s = op.scales[r0:r1]
        per_block = min(op.block, k) if op.block else k
        sq = np.einsum("ij,ij->i", s, s)
        return fmt.max * np.sqrt(per_block * sq) * (1 + 2 * gamma(s.shape[1] + 4))


def _exact_by_scales(a: Operand, b: Operand, qa: _Quanta, qb: _Quanta) -> tuple[np.ndarray, np.ndarray] | None:
    """The norm bounds from the scales (:func:`_scale_norm_bounds`) of every row of ``a`` and of
    ``b`` when they certify every element exact, else None (power-of-two scales, fixed-quantum
    formats): the largest ``|a_m|_2 2^-qa[m]`` times the largest ``|b_n|_2 2^-qb[n]`` is below
    2^53.  The float64 GEMM is then exact for every finite element, and the values need no norm
    pass."""
    if not (a.pow2_scales and b.pow2_scales) or a.fixed_quantum is None or b.fixed_quantum is None:
        return None
    m, n = a.shape[0], b.shape[0]
    na, nb = _scale_norm_bounds(a, 0, m), _scale_norm_bounds(b, 0, n)
    if na is None or nb is None or m == 0 or n == 0:
        return None
    with np.errstate(over="ignore", invalid="ignore"):
        ra = float(np.max(na * np.exp2(-qa.q)))
        rb = float(np.max(nb * np.exp2(-qb.q)))
        top = float(sum_upper_bound(np.asarray(ra * rb), 2))
    return (na, nb) if top < 2.0**53 else None


def _gather(op: Operand, idx: np.ndarray) -> np.ndarray:
    """Scaled float64 values (exact) of the rows ``idx`` of ``op``."""
    sub = op.subset(idx)
    out = np.empty((idx.size, op.shape[1]))
    _convert(sub, 0, idx.size, out, want_norms=False)
    return out


def _exact_terms(a: Operand, b: Operand, rows: np.ndarray, cols: np.ndarray) -> list[np.ndarray]:
    """Exact float64 terms whose sum is acc[rows[i], cols[i]]: (T, F) arrays, as a list of 1-D arrays.

    Power-of-two scales (or none): the products a' b' of the scaled values (exact: at most 48
    significand bits).  Other scales: for every K block, TwoProduct(scale product, exact block
    sum of the unscaled products) gives two exact terms.
    """
    k = a.shape[1]
    ua, ia = _index_set(rows)
    ub, ib = _index_set(cols)
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
    """The per-element tiers: output codes (F,) of the elements (rows[i], cols[i]) from their
    exact terms (a pairwise float64 sum, a double-double sum, Fractions).

    The last resort behind the GEMM-based tier (:func:`_sliced_tier`) and its test oracle.  rows
    are absolute; ``acc`` / ``acc_lo`` (their rows from r0) receive the tiers' values.
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


# ----------------------------------------------------------------------------------------------
# The GEMM-based exact tier
# ----------------------------------------------------------------------------------------------

_SLICE_BUDGET = 96 << 20  # bytes of float64 rows gathered per operand group of the sliced tier


def _index_set(idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(idx, return_inverse=True)`` of non-negative indices, in linear time (a
    presence table instead of a sort: the exact tiers take millions of points at once)."""
    if idx.size == 0:
        return idx.astype(np.intp), np.zeros(0, np.intp)
    present = np.zeros(int(idx.max()) + 1, bool)
    present[idx] = True
    uniq = np.flatnonzero(present)
    where = np.empty(present.size, np.intp)
    where[uniq] = np.arange(uniq.size)
    return uniq, where[idx]


class _PointSet:
    """Points (pa[i], pb[i]) with their index sets (:func:`_index_set`) and whether they are the
    whole grid ua x ub in row-major order (a GEMM's result is then their values as it stands)."""

    def __init__(self, pa: np.ndarray, pb: np.ndarray) -> None:
        self.pa, self.pb = pa, pb
        self.ua, self.ia = _index_set(pa)
        self.ub, self.ib = _index_set(pb)
        nu, nv = self.ua.size, self.ub.size
        self.grid = bool(nu * nv == pa.size and pa.size
                         and (self.ia.reshape(nu, nv) == np.arange(nu)[:, None]).all()
                         and (self.ib.reshape(nu, nv) == np.arange(nv)[None, :]).all())


def _pair_values(sa: Slices, s: int, sb: Slices, t: int, pa: np.ndarray, pb: np.ndarray,
                 points: _PointSet | None = None) -> np.ndarray:
    """The exact dot products of part ``s`` of rows ``pa`` with part ``t`` of rows ``pb`` (F,).

    Only the columns where both parts have values take part; a dense block of rows goes
    through one GEMM (exact: :class:`~deepgemm_ref.exact.Slices`), scattered points through
    per-point dot products (exact for the same reason, in any order).  ``points``: the same
    points' :class:`_PointSet`, when the caller has it.
    """
    cols = np.flatnonzero(sa.columns[s] & sb.columns[t])
    f = pa.size
    if cols.size == 0 or f == 0:
        return np.zeros(f)
    xa, xb = sa.parts[s], sb.parts[t]
    if points is None:
        points = _PointSet(pa, pb)
    ua, ia, ub, ib = points.ua, points.ia, points.ub, points.ib
    # Most columns: whole rows (the other columns hold a zero in one of the parts, and the GEMM
    # is exact over all K columns), which saves gathering the columns; all rows: no gather.
    dense_cols = 2 * cols.size >= xa.shape[1]
    if ua.size * ub.size <= 16 * f:
        sparse = _sparse_pair(sa, s, sb, t, ua, ub, cols)
        if sparse is not None:
            return sparse.reshape(-1) if points.grid else sparse[ia, ib]
        if dense_cols:
            x = xa if ua.size == xa.shape[0] else xa[ua]
            y = xb if ub.size == xb.shape[0] else xb[ub]
        else:
            x = np.take(xa, cols, axis=1) if ua.size == xa.shape[0] else xa[np.ix_(ua, cols)]
            y = np.take(xb, cols, axis=1) if ub.size == xb.shape[0] else xb[np.ix_(ub, cols)]
        prod = np.asarray(x @ y.T)
        return prod.reshape(-1) if points.grid else prod[ia, ib]
    out = np.empty(f)
    per = max(1, (16 << 20) // (16 * cols.size))
    for i0 in range(0, f, per):
        i1 = min(f, i0 + per)
        x = xa[np.ix_(ua[ia[i0:i1]], cols)]
        y = xb[np.ix_(ub[ib[i0:i1]], cols)]
        out[i0:i1] = np.einsum("ij,ij->i", x, y)
    return out


#: A pair with a sparse part (:attr:`Slices.entries`) takes its products value by value
#: (:func:`_entries_product`) instead of by a GEMM where that is estimated cheaper (the GEMM's cost
#: times this factor; 0: never).
_SPARSE_GAIN = 1.0


def _sparse_pair(sa: Slices, s: int, sb: Slices, t: int, ua: np.ndarray, ub: np.ndarray,
                 cols: np.ndarray) -> np.ndarray | None:
    """``parts[s][ua] @ parts[t][ub].T`` (the grid of :func:`_pair_values`) when one of the two
    parts is sparse (a window that holds the low bits of a few values per row: a GEMM would
    multiply zeros), else None.  Exact like the GEMM: every partial sum of the products is
    (:class:`Slices`)."""
    ea = sa.entries[s] if s < len(sa.entries) else None
    eb = sb.entries[t] if t < len(sb.entries) else None
    cost_a = ea[0].size * ub.size if ea is not None else math.inf
    cost_b = eb[0].size * ua.size if eb is not None else math.inf
    # value by value costs some 256 multiply-adds of a GEMM per product, and its (rows, Q) result
    # some 512 per element (its zeros, scatter and transpose), as measured on OpenBLAS
    if not 256 * min(cost_a, cost_b) + 512 * ua.size * ub.size < _SPARSE_GAIN * ua.size * ub.size * cols.size:
        return None
    xa, xb = sa.parts[s], sb.parts[t]
    if cost_a <= cost_b:
        assert ea is not None
        return _entries_product(ea, ua, xa.shape[0], xb if ub.size == xb.shape[0] else xb[ub])
    assert eb is not None
    return _entries_product(eb, ub, xb.shape[0], xa if ua.size == xa.shape[0] else xa[ua]).T


def _entries_product(entries: tuple[np.ndarray, np.ndarray, np.ndarray], u: np.ndarray, r_count: int,
                     xd: np.ndarray) -> np.ndarray:
    """``xs[u] @ xd.T`` (float64 (u.size, Q)) for the part ``xs`` (r_count rows) whose non-zero
    values are ``entries`` (rows ascending): per value, that value times a column of ``xd``, summed
    per row in chunks (exact in any order for slice parts)."""
    rows, cc, vals = entries
    where = np.full(r_count, -1, np.intp)
    where[u] = np.arange(u.size)
    wr = where[rows]
    keep = wr >= 0  # u ascends (_index_set), so the kept rows still ascend
    r, c, v = wr[keep], cc[keep], vals[keep]
    q_count, k = xd.shape
    out = np.zeros((u.size, q_count))
    flat = xd.reshape(-1)
    offsets = np.arange(q_count) * k
    per = max(1, (16 << 20) // (8 * max(q_count, 1)))
    for i0 in range(0, r.size, per):
        i1 = min(r.size, i0 + per)
        # the columns c of xd by one flat take ((Q, values): a take along axis 1 copies value by
        # value, twice as slow), then one value per row, times its value
        g = np.take(flat, offsets[:, None] + c[i0:i1]).T.copy()
        g *= v[i0:i1, None]
        rr = r[i0:i1]
        starts = np.flatnonzero(np.concatenate(([True], rr[1:] != rr[:-1])))
        out[rr[starts]] += np.add.reduceat(g, starts, axis=0)  # rows unique within a chunk
    return out


def _sliced_tier(
    a: Operand, b: Operand, ep: OutputStage, rows: np.ndarray, cols: np.ndarray,
    acc: np.ndarray | None, acc_lo: np.ndarray | None, stats: dict[str, int],
) -> tuple[np.ndarray, np.ndarray]:
    """The GEMM-based exact tier: codes (F,) of the elements (rows[i], cols[i]) and a bool mask
    of those it decided (the others need the per-element tiers: values beyond the slices' range).

    The rows of ``a`` and ``b`` that hold points are split into exponent-window slices
    (:func:`~deepgemm_ref.exact.split_windows`, ``bits = slice_bits(K)``), so that every
    slice-pair GEMM is exact.  Pairs are added level by level (slice s of ``a`` with slice t of
    ``b`` at level s + t: from the largest contributions down); after each level the exact
    partial sums (a double-double with its bound) plus a Cauchy-Schwarz bound of the pairs not
    yet computed give an interval that the margin certificate tries; the elements it decides
    stop there.  Once every pair is in, the double-double ends decide (bound 0 unless the
    double-double itself is inexact), and Fractions of the few pair sums the rest.  ``acc``
    (given: every pair is computed, so that it holds the exact sum's double-double)
    / ``acc_lo`` receive the values.
    """
    f = rows.size
    k = a.shape[1]
    codes = np.zeros(f, ep.out.code_dtype)
    done = np.zeros(f, bool)
    bits = slice_bits(k)
    full = acc is not None
    group = max(1, _SLICE_BUDGET // (8 * max(k, 1) * 3))
    ua, ia = _index_set(rows)
    for g0 in range(0, ua.size, group):
        in_a = np.flatnonzero((ia >= g0) & (ia < g0 + group))
        sa = split_windows(_gather(a, ua[g0:g0 + group]), bits)
        if sa is None:
            continue
        ub, ib = _index_set(cols[in_a])

        def group_b(h0: int, st: dict[str, int], sa: Slices = sa, g0: int = g0, in_a: np.ndarray = in_a,
                    ub: np.ndarray = ub, ib: np.ndarray = ib) -> None:
            sel = (ib >= h0) & (ib < h0 + group)
            pts = in_a[sel]
            sb = split_windows(_gather(b, ub[h0:h0 + group]), bits)
            if sb is None or not sa.products_exact(sb, k):
                return
            c, hi, lo = _slice_levels(sa, sb, ia[pts] - g0, ib[sel] - h0, ep, rows[pts], cols[pts], full, st)
            codes[pts] = c  # the groups' points are disjoint
            done[pts] = True
            if acc is not None:
                acc[rows[pts], cols[pts]] = hi
            if acc_lo is not None:
                acc_lo[rows[pts], cols[pts]] = lo

        _groups_on_pool(list(range(0, ub.size, group)), group_b, stats)
    return codes, done


def _groups_on_pool(starts: list[int], fn: Callable[[int, dict[str, int]], None], stats: dict[str, int]) -> None:
    """``fn(start, stats)`` for every group of the sliced tier: on the package's pool with a
    one-thread BLAS each when there are several groups and threads and the work budget holds a
    group's slices per thread (about four times ``_SLICE_BUDGET``: its gathered rows, their parts
    and remainder), else in order.  Every group's codes are its points' exact roundings,
    whichever thread computes them."""
    threads = min(len(starts), num_threads())
    if threads > 1 and threads * 4 * _SLICE_BUDGET <= work_budget():
        own: list[dict[str, int]] = [{} for _ in starts]

        def run(i0: int, i1: int) -> None:
            for i in range(i0, i1):
                fn(starts[i], own[i])

        with single_threaded_blas():
            parallel_chunks(len(starts), 1, run)
        for st in own:
            for key, v in st.items():
                stats[key] = stats.get(key, 0) + v
    else:
        for h0 in starts:
            fn(h0, stats)


def _slice_levels(sa: Slices, sb: Slices, pa: np.ndarray, pb: np.ndarray, ep: OutputStage, rows: np.ndarray,
                  cols: np.ndarray, full: bool, stats: dict[str, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_sliced_tier` on one group: (codes, hi, lo) of the points (pa[i], pb[i]) of the
    slices' rows (absolute output positions rows, cols).

    The pair values (exact) are added as they come, level by level, into a running double-double
    ``(s, e)`` with TwoSum (``s, r = TwoSum(s, v)``, ``e, q = TwoSum(e, r)``): the sum of the
    terms so far is exactly ``s + e + sum(q)``, and ``sum |q|`` (rounded up: ``tail``) bounds
    what the pair leaves out; ``(s, e)`` is renormalised (TwoSum) before each test.  With
    ``tail = 0`` the renormalised pair is the exact sum's canonical double-double (``s`` its
    nearest float64), as stored accumulators need; otherwise they are recomputed with Fractions.
    """
    f = pa.size
    wa, wb = len(sa.parts), len(sb.parts)
    codes = np.zeros(f, ep.out.code_dtype)
    hi = np.zeros(f)
    lo = np.zeros(f)
    live = np.arange(f)
    terms: list[np.ndarray] = []
    run_s, run_e, tail = np.zeros(f), np.zeros(f), np.zeros(f)
    last = max(wa + wb - 2, 0)
    pairs = [(s, t) for s in range(wa) for t in range(wb)]
    rest_factor = 1 + 2 * gamma(len(pairs) + 2)
    norms_a: list[np.ndarray] = []  # the parts' row norms at the live points (norms_at of them)
    norms_b: list[np.ndarray] = []
    norms_at = -1
    with np.errstate(over="ignore", invalid="ignore"):
        points: _PointSet | None = None
        for level in range(last + 1):
            for s, t in pairs:
                if s + t == level:
                    if not (sa.columns[s] & sb.columns[t]).any():
                        continue  # no column where both parts have values: the pair adds zeros
                    if points is None or points.pa.size != live.size:
                        points = _PointSet(pa[live], pb[live])
                    v = _pair_values(sa, s, sb, t, points.pa, points.pb, points)
                    terms.append(v)
                    if len(terms) == 1:  # TwoSum(0, v) = (v + 0, +0) and TwoSum(0, +0) = (+0, +0)
                        run_s = v + 0.0
                        continue
                    _accumulate(run_s, run_e, tail, v)
            if level < last and full:
                continue
            if level < last and live.size >= _PROBE_MIN and not _level_decides(
                    sa, sb, pa[live], pb[live], ep, rows[live], cols[live], run_s, run_e, tail, len(terms),
                    [(s, t) for s, t in pairs if s + t > level], rest_factor):
                continue  # a sample of the points says the margin test would decide few of them here
            s_, e_ = _in_blocks(_renormalised, run_s, run_e)  # an exact zero sum is +0
            bound = tail * (1 + 2 * gamma(len(terms) + 2)) if tail.any() else tail
            pr, pc = rows[live], cols[live]
            if level < last:
                if norms_at != live.size:
                    norms_at = live.size
                    norms_a = [sa.norms[s][pa[live]] for s in range(wa)]
                    norms_b = [sb.norms[t][pb[live]] for t in range(wb)]
                later = [x for s, t in pairs if s + t > level for x in (norms_a[s], norms_b[t])]
                c, ok = _in_blocks(partial(_level_margin, ep, rest_factor), s_, e_, bound, pr, pc, *later)
                codes[live[ok]] = c[ok]
                stats["sliced"] = stats.get("sliced", 0) + int(np.count_nonzero(ok))
                if ok.any():
                    keep = ~ok
                    live = live[keep]
                    terms = [v[keep] for v in terms]
                    run_s, run_e, tail = s_[keep], e_[keep], tail[keep]
                else:
                    run_s, run_e = s_, e_
                if live.size == 0:
                    break
                continue
            # every pair is in: the exact sum is s_ + e_ within bound (0 unless the dd is inexact)
            if ep.dd_exact and not bound.any():  # both ends are the exact value: one rounding
                c_lo = _in_blocks(lambda s_, e_, pr, pc: ep.apply_points_dd(s_, e_, pr, pc, up=False), s_, e_, pr, pc)
                ok = np.ones(live.size, bool)
            else:
                def ends(s_: np.ndarray, e_: np.ndarray, bound: np.ndarray, pr: np.ndarray,
                         pc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
                    e_lo, e_hi = dd_interval(s_, e_, bound)
                    return (ep.apply_points_dd(s_, e_lo, pr, pc, up=False),
                            ep.apply_points_dd(s_, e_hi, pr, pc, up=True))

                c_lo, c_hi = _in_blocks(ends, s_, e_, bound, pr, pc)
                ok = c_lo == c_hi
            codes[live[ok]] = c_lo[ok]
            hi[live], lo[live] = s_, e_
            stats["sliced"] = stats.get("sliced", 0) + int(np.count_nonzero(ok))
            for j in np.flatnonzero(~ok | ((bound != 0) & full)):
                # undecided, or a stored accumulator that must be the exact sum's nearest float64
                ex = fraction_sum(v[j] for v in terms)
                p = live[j]
                if not ok[j]:
                    codes[p] = ep.apply_exact(ex, int(rows[p]), int(cols[p]))
                hi[p] = float(ex) + 0.0
                lo[p] = float(ex - Fraction(hi[p]))
            if not ok.all():
                stats["fraction"] = stats.get("fraction", 0) + int(np.count_nonzero(~ok))
    return codes, hi, lo


#: Points per block of the sliced tier's element-wise arithmetic (TwoSum chains, the margin test,
#: the final roundings): its temporaries then stay in the cache instead of streaming arrays of
#: millions of points through memory once per operation (five TwoSum accumulations of 2^20
#: points: 27 ms against 83 to 153 ms whole).  Element-wise, so the values do not depend on it.
_POINTS_BLOCK = 1 << 15


def _in_blocks(fn: Callable[..., Any], *arrays: np.ndarray) -> Any:
    """``fn(*arrays)`` for an element-wise ``fn`` of 1-D point arrays, block by block
    (:data:`_POINTS_BLOCK`); its result (an array or a tuple of arrays) concatenated."""
    n = arrays[0].size
    if n <= _POINTS_BLOCK:
        return fn(*arrays)
    parts = [fn(*(x[i:i + _POINTS_BLOCK] for x in arrays)) for i in range(0, n, _POINTS_BLOCK)]
    if isinstance(parts[0], tuple):
        return tuple(np.concatenate(p) for p in zip(*parts, strict=True))
    return np.concatenate(parts)


def _accumulate(run_s: np.ndarray, run_e: np.ndarray, tail: np.ndarray, v: np.ndarray) -> None:
    """One term into the sliced tier's running sums, in place and block by block:
    ``s, r = TwoSum(s, v)``, ``e, q = TwoSum(e, r)``, ``tail += |q|``."""
    for i in range(0, v.size, _POINTS_BLOCK):
        sl = slice(i, i + _POINTS_BLOCK)
        s, r = two_sum(run_s[sl], v[sl])
        e, q = two_sum(run_e[sl], r)
        run_s[sl] = s
        run_e[sl] = e
        np.abs(q, out=q)
        tail[sl] += q


def _renormalised(run_s: np.ndarray, run_e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``TwoSum(s, e)`` with an exact zero sum as +0."""
    s_, e_ = two_sum(run_s, run_e)
    s_ += 0.0
    return s_, e_


#: Live points from which a level's margin test is first tried on a sample of them (_PROBE points).
_PROBE_MIN = 1 << 14
_PROBE = 1 << 10


def _level_decides(sa: Slices, sb: Slices, pa: np.ndarray, pb: np.ndarray, ep: OutputStage, rows: np.ndarray,
                   cols: np.ndarray, run_s: np.ndarray, run_e: np.ndarray, tail: np.ndarray, n_terms: int,
                   later: list[tuple[int, int]], rest_factor: float) -> bool:
    """Whether the margin test of :func:`_slice_levels` at this level is worth its passes over all
    the live points: it is run on ``_PROBE`` of them, evenly spaced, and must decide at least a
    quarter.  Only where a level's test runs changes, never a code: every level's test and the
    last level's ends decide by the same exact value."""
    idx = np.linspace(0, pa.size - 1, _PROBE).astype(np.intp)
    with np.errstate(over="ignore", invalid="ignore"):
        s_, e_ = _renormalised(run_s[idx], run_e[idx])
        bound = tail[idx] * (1 + 2 * gamma(n_terms + 2))
        norms = [x for s, t in later for x in (sa.norms[s][pa[idx]], sb.norms[t][pb[idx]])]
        _, ok = _level_margin(ep, rest_factor, s_, e_, bound, rows[idx], cols[idx], *norms)
    return 4 * int(np.count_nonzero(ok)) >= idx.size


def _level_margin(ep: OutputStage, rest_factor: float, s_: np.ndarray, e_: np.ndarray, bound: np.ndarray,
                  rows: np.ndarray, cols: np.ndarray, *norms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The margin test of a level of :func:`_slice_levels` at points (rows, cols): the exact sum
    so far is ``s_ + e_`` within ``bound``, and the pairs not yet in add at most the sum of the
    products of their parts' row norms (``norms``: a's and b's, pair after pair)."""
    rest = np.zeros(s_.size)
    for na, nb in zip(norms[0::2], norms[1::2], strict=True):
        rest += na * nb
    err = (np.abs(e_) + bound + rest * rest_factor) * (1 + 2.0**-50)
    return ep.margin_points(s_, rows, cols, err)


def _exact_points(a: Operand, b: Operand, ep: OutputStage, rows: np.ndarray, cols: np.ndarray,
                  acc: np.ndarray | None, acc_lo: np.ndarray | None, stats: dict[str, int]) -> np.ndarray:
    """Codes of the elements no GEMM certificate decided: the GEMM-based tier, then the
    per-element tiers for what it cannot take."""
    codes, done = _sliced_tier(a, b, ep, rows, cols, acc, acc_lo, stats)
    if not done.all():
        rest = np.flatnonzero(~done)
        codes[rest] = _exact_tiers(a, b, ep, rows[rest], cols[rest], 0, acc, acc_lo, stats)
    return codes


# ----------------------------------------------------------------------------------------------
# The float64 GEMM, its certificates and its error scale
# ----------------------------------------------------------------------------------------------

class _RowsRounding:
    """The output step of rows [r0, r0 + rows) as a :class:`certified.Rounding`."""

    def __init__(self, ep: OutputStage, r0: int, r1: int) -> None:
        self.ep, self.r0, self.r1 = ep, r0, r1

    def block(self, x: np.ndarray) -> np.ndarray:
        return self.ep.apply(x, self.r0, self.r1)

    def points(self, x: np.ndarray, at: Points) -> np.ndarray:
        return self.ep.apply_points(x, at[0] + self.r0, at[1])

    def margin(self, x: np.ndarray, err: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
        return self.ep.margin(x, self.r0, self.r1, err)


class _Quanta:
    """Per-row quantum exponents of an operand (every scaled value a multiple of 2^q; pow2
    scales), computed for the rows asked for and kept."""

    def __init__(self, op: Operand) -> None:
        self.op = op
        self.q = np.full(op.shape[0], np.nan)
        fq = op.fixed_quantum
        if fq is not None:  # from the scales alone: cheap for every row
            if op.scales is None:
                self.q[:] = fq
            elif op.scales.shape[1]:
                with np.errstate(divide="ignore"):
                    self.q[:] = fq + np.log2(op.scales).min(axis=1)  # exact for powers of two
            else:
                self.q[:] = np.inf

    def __getitem__(self, idx: np.ndarray) -> np.ndarray:
        q = self.q[idx]
        miss = np.isnan(q)
        if miss.any():
            rows = np.unique(idx[miss])
            self.q[rows] = _row_quanta(self.op, rows)
            q = self.q[idx]
        return q


def _row_quanta(op: Operand, rows: np.ndarray) -> np.ndarray:
    """Quantum exponents of the rows ``rows`` (non-fixed-quantum formats)."""
    if op.values.dtype == ml_dtypes.bfloat16 and op.scales is None and op.codes_fmt is None:
        out = np.full(rows.size, np.inf)
        k = op.values.shape[1]
        if k:
            table = _bf16_lsb_table()
            step = max(1, (1 << 20) // k)
            for i in range(0, rows.size, step):
                out[i:i + step] = np.take(table, op.values[rows[i:i + step]].view(np.uint16)).min(axis=1)
        return out
    return _lsb_exponent(_gather(op, rows))


@dataclass
class _Chunk:
    """Rows [r0, r1) of the float64 GEMM with what its certificates need."""

    r0: int
    r1: int
    y: np.ndarray  # float64 (rows, N): the GEMM of the scaled operands
    a_norm: np.ndarray  # (rows,) upper bounds of the scaled rows' 2-norms
    a_finite: np.ndarray  # (rows,) bool
    n_round: int  # rounding-path length: |y - acc| <= gamma(n_round) * S
    all_exact: bool  # every element certified exact (the chunk-wide exactness certificate)


class _Gemm:
    """The float64 GEMM of two operands, row chunk by row chunk, with its certificates.

    ``b`` is converted once (float64, scaled; its norms from the same pass); each chunk of ``a``
    is converted into a reused buffer and multiplied by the BLAS.  Certificates per element
    (:meth:`bound`, :meth:`final`): the GEMM's a priori bound ``gamma(n_round) * S`` with the
    Cauchy-Schwarz ``S <= |a_m|_2 |b_n|_2``, and with power-of-two scales the exactness
    certificate ``S < 2^(53 + qa[m] + qb[n])`` (quantum exponents, :class:`_Quanta`).

    blocked: FP32 (non-power-of-two) scales; per-block sums of the unscaled elements (exact for
    FP8 and FP4) are combined with the scale products in float64 (path length 2 nb + 2).
    kblock:  K blocks accumulated in order (float32 outputs at long K): each product meets at most
    kblock roundings in its block's GEMM and nb in the accumulation.
    """

    def __init__(self, a: Operand, b: Operand, blocked: bool, step: int, kblock: int = 0) -> None:
        self.a, self.b, self.blocked, self.step, self.kblock = a, b, blocked, step, kblock
        m, k = a.shape
        n = b.shape[0]
        self.pow2 = a.pow2_scales and b.pow2_scales
        self.blk = math.gcd(a.block or k, b.block or k) if blocked else 0
        self.qa, self.qb = _Quanta(a), _Quanta(b)
        # power-of-two scales on FP8 / FP4 elements: the norms from the scales usually certify
        # every element exact, and the conversions then only look for non-finite rows
        self.scale_norms = None if blocked else _exact_by_scales(a, b, self.qa, self.qb)
        self.b64 = self._b_buf = _scratch_take((n, k))
        self.b_norm, self.b_finite = _convert(b, 0, n, self.b64, scaled=not blocked,
                                              norms=None if self.scale_norms is None else self.scale_norms[1])
        finite_norms = self.b_norm[self.b_finite]
        self.b_max = float(finite_norms.max()) if finite_norms.size else 0.0
        self.sb_blk = b.block_scales(0, n, self.blk) if blocked else None
        self._buffers: list[tuple[np.ndarray, np.ndarray]] = []
        self._lock = threading.Lock()
        # progress of a long call (the golden workflow's lines inside one case): read here, in the
        # calling thread; rows done are reported from whichever thread finished them
        self._report = work_reporter()
        self._rows_done = 0

    def _progress(self, rows: int, phase: float, weight: float) -> None:
        """Report ``rows`` more rows of ``a`` done in the phase that starts at share ``phase`` and
        weighs ``weight`` (the GEMM 3/4 of the call, the error scale 1/4)."""
        if self._report is None:
            return
        with self._lock:
            self._rows_done += rows
            share = phase + weight * min(1.0, self._rows_done / max(1, self.a.shape[0]))
        self._report(share)

    def close(self) -> None:
        """Give the float64 copy of ``b`` and the chunk buffers back to the scratch memory."""
        with self._lock:
            bufs, self._buffers = self._buffers, []
        _scratch_give(self._b_buf, *(x for pair in bufs for x in pair))
        self.b64 = self._b_buf = np.empty((0, self.b.shape[1]))

    # -- chunks --------------------------------------------------------------------------------

    def starts(self) -> list[int]:
        return list(range(0, self.a.shape[0], self.step))

    @property
    def by_scales(self) -> bool:
        """Every element certified exact by the scales alone (:func:`_exact_by_scales`)."""
        return self.scale_norms is not None

    @property
    def plain(self) -> bool:
        """One float64 GEMM over all of K (no FP32-scaled or K-blocked sums)."""
        return not self.blocked and not (self.kblock and self.a.shape[1] > self.kblock)

    def for_each(self, fn: Callable[[_Chunk], None]) -> None:
        """``fn(chunk)`` for every chunk (rows are disjoint): in parallel on the package's thread
        pool while the BLAS is pinned to one thread (stored float64 tensors), else in order with
        the BLAS's own threads (the passes beside it run on the pool, tile by tile)."""
        starts = self.starts()

        self._rows_done = 0

        def run(i0: int, i1: int) -> None:
            for r0 in starts[i0:i1]:
                with self._chunk(r0) as ch:
                    fn(ch)
                self._progress(ch.r1 - ch.r0, 0.0, 0.75)

        if len(starts) > 1 and blas_pinned():
            parallel_chunks(len(starts), 1, run)
        else:
            run(0, len(starts))

    @contextlib.contextmanager
    def _chunk(self, r0: int) -> Iterator[_Chunk]:
        a, k = self.a, self.a.shape[1]
        n = self.b.shape[0]
        r1 = min(a.shape[0], r0 + self.step)
        with self._lock:
            bufs = self._buffers.pop() if self._buffers else (_scratch_take((self.step, k)),
                                                              _scratch_take((self.step, n)))
        try:
            yield self._compute(r0, r1, bufs[0][:r1 - r0], bufs[1][:r1 - r0])
        finally:
            with self._lock:
                self._buffers.append(bufs)

    def _compute(self, r0: int, r1: int, a64: np.ndarray, y: np.ndarray) -> _Chunk:
        """Rows [r0, r1) of ``a`` converted into ``a64`` and multiplied into ``y``, with the
        chunk-wide exactness certificate."""
        a = self.a
        with np.errstate(over="ignore", invalid="ignore", under="ignore"):
            a_norm, a_fin = _convert(a, r0, r1, a64, scaled=not self.blocked,
                                     norms=None if self.scale_norms is None else self.scale_norms[0][r0:r1])
            n_round = self._multiply(a64, r0, r1, y)
        all_exact = False
        if self.pow2 and a.fixed_quantum is not None and self.b.fixed_quantum is not None:
            # Whole chunk at once: S_ij < 2^(53 + qa_i + qb_j) for every (i, j) when the
            # largest a_norm_i 2^-qa_i times the largest b_norm_j 2^-qb_j is below 2^53
            # (powers of two scale exactly; an overflow to inf just fails this test).
            with np.errstate(over="ignore", invalid="ignore"):
                ra = a_norm * np.exp2(-self.qa.q[r0:r1])
                rb = self.b_norm * np.exp2(-self.qb.q)
                top = float(sum_upper_bound(np.asarray(np.nanmax(ra) * np.nanmax(rb)), 2))
            all_exact = bool(a_fin.all() and self.b_finite.all() and top < 2.0**53)
        return _Chunk(r0, r1, y, a_norm, a_fin, n_round, all_exact)

    def _multiply(self, a64: np.ndarray, r0: int, r1: int, y: np.ndarray) -> int:
        """y = the GEMM of the chunk's rows; returns the rounding-path length."""
        k = a64.shape[1]
        if self.blocked:
            assert self.sb_blk is not None
            sa_blk = self.a.block_scales(r0, r1, self.blk)
            y[...] = 0.0
            part = np.empty_like(y)
            for j in range(sa_blk.shape[1]):
                ks = slice(j * self.blk, min(k, (j + 1) * self.blk))
                np.matmul(a64[:, ks], self.b64[:, ks].T, out=part)
                part *= np.outer(sa_blk[:, j], self.sb_blk[:, j])
                y += part
            return 2 * sa_blk.shape[1] + 2
        if self.kblock and k > self.kblock:
            kb = self.kblock
            np.matmul(a64[:, :kb], self.b64[:, :kb].T, out=y)
            part = np.empty_like(y)
            for k0 in range(kb, k, kb):
                np.matmul(a64[:, k0:k0 + kb], self.b64[:, k0:k0 + kb].T, out=part)
                y += part
            return kb + ceil_div(k, kb) + 1
        np.matmul(a64, self.b64.T, out=y)
        return k + 1

    # -- per-element certificates --------------------------------------------------------------

    def row_bound(self, ch: _Chunk, t0: int, t1: int) -> np.ndarray:
        """(rows, 1) bounds of |y - acc| valid for every element of rows [t0, t1) of the chunk
        (the margin certificate's bound)."""
        with np.errstate(over="ignore", invalid="ignore"):
            s = sum_upper_bound(ch.a_norm[t0:t1] * self.b_max, 2)
            return (gamma(ch.n_round) * s * (1 + 4 * U64))[:, None]

    def S_cs(self, ch: _Chunk, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """Cauchy-Schwarz upper bounds of sum |a b| at chunk rows ``rows`` and columns ``cols``."""
        with np.errstate(over="ignore", invalid="ignore"):
            return sum_upper_bound(ch.a_norm[rows] * self.b_norm[cols], 2)

    def bound(self, ch: _Chunk, at: Points) -> np.ndarray:
        return gamma(ch.n_round) * self.S_cs(ch, at[0], at[1])

    def exact(self, ch: _Chunk, at: Points) -> np.ndarray:
        """The exactness certificate at chunk points ``at`` (False without power-of-two scales)."""
        rows, cols = at
        fin = ch.a_finite[rows] & self.b_finite[cols]
        if not self.pow2 or rows.size == 0:
            return np.zeros(rows.size, bool)
        with np.errstate(over="ignore", invalid="ignore"):
            q = self.qa[rows + ch.r0] + self.qb[cols]
            limit = np.exp2(np.minimum(53.0 + q, 1000.0))
            return (self.S_cs(ch, rows, cols) < limit) & fin

    def final(self, ch: _Chunk, at: Points) -> np.ndarray:
        """Elements whose GEMM value is final: exact, or IEEE semantics of non-finite operands."""
        rows, cols = at
        return ~(ch.a_finite[rows] & self.b_finite[cols]) | self.exact(ch, at)

    # -- the error scale -----------------------------------------------------------------------

    def error_scale(self, out: np.ndarray) -> None:
        """S >= sum |a b| (the exact sum of magnitudes with their scales) into ``out`` (M, N).

        One float32 GEMM of the magnitudes, each row normalised by a power of two (its largest
        magnitude in [1/2, 1)): every product and partial sum is then far from float32's range,
        and for BF16 / FP8 / FP4 elements the products are exact.  A float32 evaluation of
        ``sum_k t_k`` (t_k >= 0) in any order, each term through at most K + 2 roundings (its two
        conversions, its product, K - 1 additions), satisfies ``s^ >= s (1 - gamma_{K+2}(2^-24))``,
        so ``S = s^ / (1 - gamma_{K+2}) (1 + 2^-40) 2^(ea + eb) + 2^-1000`` is an upper bound
        (docs/numerics.md, "The error scale S").  Rows where a normalised magnitude falls below
        2^-62 (a product could leave float32's normal range) or that hold non-finite values take
        the float64 computation of old: ``|a| @ |b|^T`` rounded up.  Run after every use of the
        float64 copy of ``b``: its buffer is reused for the float32 one.
        """
        a, b = self.a, self.b
        m, k = a.shape
        n = b.shape[0]
        b32 = self.b64.reshape(-1).view(np.float32)[:n * k].reshape(n, k)
        self.b64 = np.empty((0, k))  # its memory now holds b32
        eb, b_wide = _normalised_magnitudes(b, 0, n, b32)
        factor = (1 + 2.0**-40) / (1 - gamma(k + 2, U32))
        pb = np.ldexp(1.0, eb)
        starts = list(range(0, m, self.step))
        wide_rows: list[np.ndarray] = []
        self._rows_done = 0

        def rows(i0: int, i1: int) -> None:
            a32 = _scratch_take((self.step, k), np.float32)
            s32 = _scratch_take((self.step, n), np.float32)
            try:
                rows_into(i0, i1, a32, s32)
            finally:
                _scratch_give(a32, s32)

        def rows_into(i0: int, i1: int, a32: np.ndarray, s32: np.ndarray) -> None:
            for r0 in starts[i0:i1]:
                r1 = min(m, r0 + self.step)
                ea, a_wide = _normalised_magnitudes(a, r0, r1, a32[:r1 - r0])
                with np.errstate(invalid="ignore", over="ignore"):  # non-finite inputs: S is theirs
                    np.matmul(a32[:r1 - r0], b32.T, out=s32[:r1 - r0])
                pa = np.ldexp(1.0, ea)

                def tile(t0: int, t1: int, r0: int = r0, pa: np.ndarray = pa) -> None:
                    o = out[r0 + t0:r0 + t1]
                    np.multiply(s32[t0:t1], factor, out=o, dtype=np.float64)
                    o *= pa[t0:t1, None]
                    o *= pb[None, :]
                    o += 2.0**-1000

                with np.errstate(over="ignore", invalid="ignore", under="ignore"):
                    parallel_chunks(r1 - r0, _tile_rows(n), tile)
                if a_wide.any():
                    with self._lock:
                        wide_rows.append(np.flatnonzero(a_wide) + r0)
                self._progress(r1 - r0, 0.75, 0.25)

        if len(starts) > 1 and blas_pinned():
            parallel_chunks(len(starts), 1, rows)
        else:
            rows(0, len(starts))
        wa = np.concatenate(wide_rows) if wide_rows else np.zeros(0, np.int64)
        wb = np.flatnonzero(b_wide)
        if wa.size or wb.size:
            _error_scale_f64(a, b, wa, wb, out)


def _normalised_magnitudes(op: Operand, r0: int, r1: int, out32: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """|scaled rows [r0, r1)| * 2^-e (e: each row's largest magnitude is in [2^(e-1), 2^e)) as
    float32 into ``out32``; returns (e (rows,) int, bool: the row needs the float64 error scale:
    a non-zero normalised magnitude below 2^-62, or a non-finite value)."""
    rows, k = out32.shape
    e_out = np.zeros(rows, np.int64)
    wide = np.zeros(rows, bool)

    def tile(t0: int, t1: int) -> None:
        x = np.empty((t1 - t0, k))
        with np.errstate(over="ignore", invalid="ignore", under="ignore"):
            _values_into(op, r0 + t0, r0 + t1, x, True)
            np.abs(x, out=x)
            amax = x.max(axis=1, initial=0.0)
            _, e = np.frexp(amax)
            fin = np.isfinite(amax)
            e = np.where(fin, e, 0)
            x *= np.ldexp(1.0, -e)[:, None]
            small = np.where(x > 0, x, 1.0).min(axis=1, initial=1.0)
            np.copyto(out32[t0:t1], x, casting="same_kind")
        e_out[t0:t1] = e
        wide[t0:t1] = ~fin | (small < 2.0**-62)

    parallel_chunks(rows, _tile_rows(k), tile)
    return e_out, wide


def _error_scale_f64(a: Operand, b: Operand, wa: np.ndarray, wb: np.ndarray, out: np.ndarray) -> None:
    """``|a| @ |b|^T`` in float64, rounded up, for the rows ``wa`` of ``a`` (all columns) and the
    columns ``wb`` (all rows): the error scale where float32's range does not suffice."""
    m, k = a.shape
    n = b.shape[0]
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        if wa.size:
            xa = np.abs(_gather(a, wa))
            step = max(1, (64 << 20) // (8 * max(k, 1)))
            for j0 in range(0, n, step):
                xb = np.abs(_gather(b, np.arange(j0, min(n, j0 + step))))
                out[np.ix_(wa, np.arange(j0, min(n, j0 + step)))] = sum_upper_bound(xa @ xb.T, k)
        if wb.size:
            xb = np.abs(_gather(b, wb))
            step = max(1, (64 << 20) // (8 * max(k, 1)))
            for i0 in range(0, m, step):
                xa = np.abs(_gather(a, np.arange(i0, min(m, i0 + step))))
                out[np.ix_(np.arange(i0, min(m, i0 + step)), wb)] = sum_upper_bound(xa @ xb.T, k)


def error_scale(a: Operand, b: Operand) -> np.ndarray:
    """The error scale ``S >= sum_k |a[m, k] sa b[n, k] sb|`` (M, N) alone (see :meth:`_Gemm.error_scale`).

    Stored error scales must not depend on the BLAS's thread count: the GEMM runs with a
    one-thread BLAS (its chunks on the package's pool)."""
    m, k = a.shape
    n = b.shape[0]
    out = np.empty((m, n))
    if m == 0 or n == 0:
        return out
    if k == 0:
        out[...] = 0.0
        return out
    gemm = _ErrorScaleOnly(a, b, _chunk_rows(m, n, k))
    try:
        with single_threaded_blas():
            gemm.error_scale(out)
    finally:
        gemm.close()
    return out


class _ErrorScaleOnly(_Gemm):
    """A :class:`_Gemm` that only computes the error scale (no float64 copy of ``b``)."""

    def __init__(self, a: Operand, b: Operand, step: int) -> None:  # noqa: D107 - no float64 conversion
        self.a, self.b, self.step = a, b, step
        n, k = b.shape
        self.b64 = self._b_buf = _scratch_take((n, (k + 1) // 2))  # room for the float32 copy
        self._buffers = []
        self._lock = threading.Lock()
        self._report = work_reporter()
        self._rows_done = 0


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
    gemm = _Gemm(a, b, False, _chunk_rows(m, n, k))
    flags = {"all_exact": True}

    def process(ch: _Chunk) -> None:
        acc[ch.r0:ch.r1] = ch.y
        if ch.all_exact:
            return
        flags["all_exact"] = False

        def tile(t0: int, t1: int) -> None:
            rr, cc = np.meshgrid(np.arange(t0, t1), np.arange(n), indexing="ij")
            at = (rr.reshape(-1), cc.reshape(-1))
            e = np.where(gemm.exact(ch, at), 0.0, gemm.bound(ch, at))
            err[ch.r0 + t0:ch.r0 + t1] = e.reshape(t1 - t0, n)
            fin[ch.r0 + t0:ch.r0 + t1] = (ch.a_finite[t0:t1, None] & gemm.b_finite[None, :])

        parallel_chunks(ch.r1 - ch.r0, _tile_rows(n), tile)

    S = None
    try:
        gemm.for_each(process)
        if want_S:
            S = np.empty((m, n))
            with single_threaded_blas():  # a stored S must not depend on the BLAS thread count
                gemm.error_scale(S)
    finally:
        gemm.close()
    return Accumulator(acc, err, fin, S, flags["all_exact"])


_KBLOCK_F32 = 512


def _exact_model(a: Operand, b: Operand, ep: OutputStage, want_acc: bool, want_S: bool) -> MatmulResult:
    m, k = a.shape
    n = b.shape[0]
    out_codes = np.empty((m, n), ep.out.code_dtype)
    acc = np.empty((m, n)) if want_acc else None
    acc_lo = np.zeros((m, n)) if (want_acc and ep.out is fm.F32) else None
    S_all = np.empty((m, n)) if want_S else None
    stats: dict[str, int] = {}
    if _swap_operands(m, n, k):  # compute the transpose into transposed views of the same arrays
        _exact_run(b, a, ep.transposed(), out_codes.T, None if acc is None else acc.T,
                   None if acc_lo is None else acc_lo.T, None if S_all is None else S_all.T, stats)
    else:
        _exact_run(a, b, ep, out_codes, acc, acc_lo, S_all, stats)
    return MatmulResult(out_codes.view(ep.out.storage), acc, acc_lo, S_all, stats)


def _exact_run(a: Operand, b: Operand, ep: OutputStage, out_codes: np.ndarray, acc: np.ndarray | None,
               acc_lo: np.ndarray | None, S_all: np.ndarray | None, stats: dict[str, int]) -> None:
    """The exact model into the given (M, N) arrays (views are fine).

    Per chunk of rows: the float64 GEMM; per tile of it (on the pool) the margin certificate
    with a per-row bound (codes and certificate from one pass of the output stage), and for the
    few elements it leaves open the exactness certificate and the per-element GEMM bound
    (:func:`deepgemm_ref.certified.round_certified`).  What is left goes, after every chunk, to
    the GEMM-based exact tier (:func:`_exact_points`).
    """
    m, k = a.shape
    n = b.shape[0]
    pow2 = a.pow2_scales and b.pow2_scales
    blocked = (not pow2) and ep.out is fm.F32 and a.fixed_quantum is not None and b.fixed_quantum is not None
    # float32 outputs have 2^16 times finer roundings than bf16 ones: the GEMM's a priori bound
    # leaves a few percent of the elements undecided at large K unless K is blocked.
    kblock = _KBLOCK_F32 if ep.out is fm.F32 and k > 4 * _KBLOCK_F32 else 0
    step = whole_step = _chunk_rows(m, n, k)
    if acc is None and S_all is None and blas_pinned():
        # Codes alone are certified whatever the GEMM's last bits: with a one-thread BLAS every pool
        # thread takes a chunk (its conversion, GEMM and certificates overlap the others').
        step = min(step, -(-m // max(1, num_threads())))
    gemm = _Gemm(a, b, blocked, step, kblock)
    lock = threading.Lock()
    open_rows: list[np.ndarray] = []
    open_cols: list[np.ndarray] = []

    def process(ch: _Chunk) -> None:
        st: dict[str, int] = {}
        r0, r1, y = ch.r0, ch.r1, ch.y
        if acc is not None:
            acc[r0:r1] = y

        def tile(t0: int, t1: int) -> None:
            g0, g1 = r0 + t0, r0 + t1
            yt = y[t0:t1]
            if ch.all_exact:
                out_codes[g0:g1] = ep.apply(yt, g0, g1)
                return

            def bound(at: Points | None) -> np.ndarray:
                assert at is not None
                return gemm.bound(ch, (at[0] + t0, at[1]))

            def final(at: Points) -> np.ndarray:
                return gemm.final(ch, (at[0] + t0, at[1]))

            # codes alone: elements no per-element test decides go to the exact tier untested
            # (the same codes; with an accumulator its values follow the certificate that decided)
            codes, pending = round_certified(yt, bound, _RowsRounding(ep, g0, g1), final=final,
                                             margin=gemm.row_bound(ch, t0, t1), probe=acc is None)
            out_codes[g0:g1] = codes
            if pending.any():
                pr, pc = np.nonzero(pending)
                with lock:
                    open_rows.append(pr + g0)
                    open_cols.append(pc)

        parallel_chunks(r1 - r0, _tile_rows(n), tile)
        st["exact" if ch.all_exact else "bounded"] = (r1 - r0) * n
        with lock:
            for key, v in st.items():
                stats[key] = stats.get(key, 0) + v

    try:
        if acc is None and S_all is None and m >= _GEMM_PROBE_MIN_ROWS and n >= _GEMM_PROBE_COLS \
                and gemm.plain and not gemm.by_scales and _gemm_decides_little(gemm, ep):
            # Codes alone, and the GEMM's certificates decided under an eighth of a probe block:
            # the inputs are of the kind every element of which needs the exact tier (ties,
            # cancellations); every element goes there, chunk by chunk, without the float64
            # GEMM that would certify next to none of them (the codes are exact either way).
            for r0 in range(0, m, whole_step):  # the exact tier parallelises inside: whole chunks
                r1 = min(m, r0 + whole_step)
                rows, cols = np.divmod(np.arange((r1 - r0) * n, dtype=np.intp), n)
                rows += r0
                out_codes[r0:r1] = _exact_points(a, b, ep, rows, cols, None, None, stats).reshape(r1 - r0, n)
            return
        gemm.for_each(process)
        if open_rows:
            rows, cols = np.concatenate(open_rows), np.concatenate(open_cols)
            stats["bounded"] -= rows.size
            out_codes[rows, cols] = _exact_points(a, b, ep, rows, cols, acc, acc_lo, stats)
        if S_all is not None:
            gemm.error_scale(S_all)
    finally:
        gemm.close()


#: Codes-only exact GEMMs of at least _GEMM_PROBE_MIN_ROWS rows and _GEMM_PROBE_COLS columns first
#: run their certificates on the product of _GEMM_PROBE_ROWS rows and _GEMM_PROBE_COLS columns
#: (:func:`_gemm_decides_little`: 1/1024 of a 1024 x 2048 GEMM) and skip the float64 GEMM where they
#: decide under an eighth of it.
_GEMM_PROBE_ROWS = 16
_GEMM_PROBE_COLS = 128
_GEMM_PROBE_MIN_ROWS = 512


def _gemm_decides_little(gemm: _Gemm, ep: OutputStage) -> bool:
    """Whether the float64 GEMM's certificates (margin, per-element bound, exactness) decide
    fewer than an eighth of the elements of its first _GEMM_PROBE_ROWS rows and _GEMM_PROBE_COLS
    columns, computed apart (a plain GEMM: no K blocks, no FP32 scales): inputs of the kind
    every element of which needs the exact tier."""
    k = gemm.a.shape[1]
    rows, cols = _GEMM_PROBE_ROWS, _GEMM_PROBE_COLS
    a64, y = np.empty((rows, k)), np.empty((rows, cols))
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        a_norm, a_fin = _convert(gemm.a, 0, rows, a64)
        np.matmul(a64, gemm.b64[:cols].T, out=y)
    ch = _Chunk(0, rows, y, a_norm, a_fin, k + 1, False)
    part = OutputStage(ep.out, ep.alpha, None if ep.c is None else ep.c[:, :cols], ep.c_mode, ep.via)

    def bound(at: Points | None) -> np.ndarray:
        assert at is not None
        return gemm.bound(ch, at)

    _, pending = round_certified(y, bound, _RowsRounding(part, 0, rows), final=lambda at: gemm.final(ch, at),
                                 margin=gemm.row_bound(ch, 0, rows))
    return 8 * int(np.count_nonzero(~pending)) < pending.size


_BF16_LSB: np.ndarray | None = None


def _bf16_lsb_table() -> np.ndarray:
    """Exponent of the lowest set bit of every bf16 bit pattern (+inf for zeros and non-finite)."""
    global _BF16_LSB
    if _BF16_LSB is None:
        with np.errstate(invalid="ignore"):
            v = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(ml_dtypes.bfloat16).astype(np.float64)
            _BF16_LSB = _lsb_exponent(v.reshape(-1, 1))
    return _BF16_LSB


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


def _fp32_model_prescaled(a: Operand, b: Operand, ep: OutputStage, blk: int, want_acc: bool = True) -> MatmulResult:
    """The fp32 model on pre-scaled operands: per K block one float64 GEMM of the scaled values
    (exact: FP8 / FP4 elements times powers of two stay far inside float64's range), one rounding
    to float32, one float32 add.  This is the model itself under MMA block scaling, and equals
    the promotion-multiply model under :func:`_prescaled_fp32_ok`.

    The output is cut into tiles small enough that a tile's block sums and its float32
    accumulator stay in the core's cache while every K block passes over them (one ufunc pass
    per block: ``np.add`` with ``dtype=float32`` rounds the float64 block sum once, then adds);
    the tiles run on the package's pool with a one-thread BLAS each.
    """
    m, k = a.shape
    n = b.shape[0]
    out_codes = np.empty((m, n), ep.out.code_dtype)
    b_s = _scratch_take((n, k))
    step = _chunk_rows(m, n, k)
    acc_all = _scratch_take((m, n), np.float32)
    a_s = _scratch_take((min(step, m), k))
    try:
        _convert(b, 0, n, b_s, want_norms=False)  # NaN / inf elements follow IEEE through the GEMM, as on the device
        _fp32_prescaled_run(a, ep, blk, b_s, a_s, acc_all, out_codes, step)
        acc64 = acc_all.astype(np.float64) if want_acc else None
    finally:
        _scratch_give(b_s, a_s, acc_all)
    return MatmulResult(out_codes.view(ep.out.storage), acc64, None, None, {"fp32": m * n})


def _fp32_prescaled_run(a: Operand, ep: OutputStage, blk: int, b_s: np.ndarray, a_s: np.ndarray,
                        acc_all: np.ndarray, out_codes: np.ndarray, step: int) -> None:
    """:func:`_fp32_model_prescaled` into its buffers: ``b_s`` the scaled ``b`` (N, K), ``a_s``
    room for ``step`` scaled rows of ``a``, ``acc_all`` the float32 accumulators (M, N)."""
    m, k = a.shape
    n = b_s.shape[0]
    nb = ceil_div(k, blk)
    plain_bf16 = ep.out is fm.BF16 and ep.c is None and ep.alpha is None and ep.via is None
    with single_threaded_blas(), np.errstate(over="ignore", under="ignore", invalid="ignore"):
        for r0 in range(0, m, step):
            r1 = min(m, r0 + step)
            rows = r1 - r0
            _convert(a, r0, r1, a_s[:rows], want_norms=False)
            tr, tc = _fp32_tile_shape(rows, blk)
            tiles = [(i0, j0) for i0 in range(0, rows, tr) for j0 in range(0, n, tc)]

            def run(t0: int, t1: int, r0: int = r0, rows: int = rows, tr: int = tr, tc: int = tc,
                    tiles: list[tuple[int, int]] = tiles) -> None:
                # The block sum and the accumulator of a tile are contiguous arrays of their own
                # (a strided view into the (M, N) result halves the speed of the per-block add);
                # the accumulator is copied into the result once, after the last block.
                y_buf = np.empty(tr * tc)
                acc_buf = np.empty(tr * tc, np.float32)
                with np.errstate(over="ignore", invalid="ignore"):  # a float32 overflow is the model's result
                    for i0, j0 in tiles[t0:t1]:
                        i1, j1 = min(rows, i0 + tr), min(n, j0 + tc)
                        shape = (i1 - i0, j1 - j0)
                        size = shape[0] * shape[1]
                        yt = y_buf[:size].reshape(shape)
                        acc = acc_buf[:size].reshape(shape)
                        for j in range(nb):
                            ks = slice(j * blk, min(k, (j + 1) * blk))
                            np.matmul(a_s[i0:i1, ks], b_s[j0:j1, ks].T, out=yt)  # exact block sum
                            if j == 0:
                                np.copyto(acc, yt, casting="same_kind")  # f32(+0 + f32(y)) = f32(y), -0 -> +0 below
                                acc += np.float32(0.0)
                            else:
                                np.add(acc, yt, out=acc, dtype=np.float32)  # one rounding of y, one of the sum
                        acc_all[r0 + i0:r0 + i1, j0:j1] = acc

            parallel_chunks(len(tiles), 1, run)
            acc = acc_all[r0:r1]

            def epi(t0: int, t1: int, r0: int = r0, acc: np.ndarray = acc) -> None:
                if plain_bf16:  # float32 -> bf16 (RNE) is the rounding of the (exact) float64 value
                    out_codes[r0 + t0:r0 + t1] = acc[t0:t1].astype(ml_dtypes.bfloat16).view(np.uint16)
                else:
                    out_codes[r0 + t0:r0 + t1] = ep.apply(acc[t0:t1].astype(np.float64), r0 + t0, r0 + t1)

            parallel_chunks(rows, _tile_rows(n), epi)


_FP32_TILE = 1 << 17  # output elements per tile of the fp32 model at block 32 (a float64 block sum and a
# float32 accumulator; blocks of 64 and more take twice as many: 512 x 512)
_FP32_TILE_ROWS = 512  # rows per tile of the fp32 model (at most)


def _fp32_tile_shape(rows: int, blk: int) -> tuple[int, int]:
    """(rows, columns) of the fp32 model's output tiles for a chunk of ``rows`` rows and K block
    ``blk``.  Larger blocks take larger tiles: the BLAS then runs near its full speed (a tile's
    GEMM has about the same work whatever the block), and the tiles stay in the cache.  Tall
    tiles (all of a chunk's rows up to _FP32_TILE_ROWS) measured fastest on a one-thread
    OpenBLAS: the small-K GEMMs are dearer per call than per row."""
    tile = _FP32_TILE * max(1, min(blk // 32, 2))
    tr = min(rows, _FP32_TILE_ROWS)
    return tr, max(16, tile // tr)


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
    # A non-finite block sum has a non-finite term (the finite terms' float64 sum cannot overflow):
    # its IEEE class (inf, -inf, NaN from inf - inf or inf * 0) is what a float32 device gets.
    certified = (prod_max * a_el.shape[1] < limit) | ~np.isfinite(y)
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
                prescale: bool = True, want_acc: bool = True) -> MatmulResult:
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
        return _fp32_model_prescaled(a, b, ep, blk, want_acc)
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
        # (see _parallel.single_threaded_blas); chunks then run on the pool, each its own
        # conversion, one-thread GEMM and certificates.  Codes alone do so too where the pool runs
        # on OpenBLAS's own threads (1.065x one two-thread float64 matmul against 1.094x with the
        # BLAS's two threads, benchmarks/speed-table.md); elsewhere they keep the BLAS's threads:
        # beside a spinning OpenBLAS worker the package's own pool threads measured 1.32x.
        pinned = want_acc or want_S or blas_threads_pool(num_threads())
        with single_threaded_blas() if pinned else contextlib.nullcontext():
            return _exact_model(a, b, output, want_acc, want_S)
    if model == "fp32":
        res = _fp32_model(a, b, output, fp32_block, mma_block_scaling, want_acc=want_acc)
    elif isinstance(model, Limited):
        res = _limited_model(a, b, output, model)
    else:  # pragma: no cover - validated by config
        raise ValueError(f"unknown accumulation model {model!r}")
    if want_S:
        res.S = error_scale(a, b)
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
