"""Element and scale formats as data, casts with named policies, and bit packing.

One :class:`Format` record per format (``BF16``, ``F32``, ``E4M3``, ``E5M2``, ``E2M1``, ``UE8M0``)
holds its bit layout, bias and specials as keyword fields; its range (``max``, ``min_normal``,
``min_subnormal``) and special codes are derived from them.  Every cast exists twice:

* a slow scalar version (:func:`encode_scalar`) that works on exact rationals and *is* the
  specification, and
* the vectorised version (:func:`encode`) used everywhere else, tested equal to the scalar one
  on exhaustive sweeps and on hypothesis inputs.

Policies are explicit (:class:`CastPolicy`): rounding (``"rne"`` = IEEE roundTiesToEven, or
``"ties_toward_zero"``, DeepGEMM's FP4 rule), saturation, NaN handling and negative zero.
There is no implicit saturation anywhere.

Float64 inputs are never narrowed with ``astype``: they are first
rounded to float32 with round-to-odd, which keeps enough information for one correct
rounding to any format of at most 22 significand bits, and only then cast.
UE8M0 bytes are always built with integer bit operations.

The round-to-odd steps and the error-free transformations (``f64_to_f32_round_odd``,
``dd_to_f64_round_odd``, ``two_sum``, ``two_prod``) live in :mod:`deepgemm_ref.exact` and are
re-exported here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

import ml_dtypes
import numpy as np
import numpy.typing as npt

from .errors import DGArgumentError
from .exact import dd_to_f64_round_odd, f64_to_f32_round_odd, two_prod, two_sum

__all__ = [
    "Format",
    "CastPolicy",
    "BF16",
    "F32",
    "E4M3",
    "E5M2",
    "E2M1",
    "UE8M0",
    "FORMATS",
    "IEEE_RNE",
    "SATURATING_RNE",
    "DEEPGEMM_FP4",
    "RNE_FP4",
    "decode",
    "decode_scalar",
    "encode",
    "encode_scalar",
    "cast",
    "ue8m0_encode",
    "ue8m0_encode_scalar",
    "ue8m0_decode",
    "pack_fp4",
    "unpack_fp4",
    "pack_ue8m0_int32",
    "unpack_ue8m0_int32",
    "pack_ue8m0_int16",
    "unpack_ue8m0_int16",
    "f64_to_f32_round_odd",
    "dd_to_f64_round_odd",
    "round_f64",
    "round_dd",
    "encode_f32",
    "two_sum",
    "two_prod",
]

Rounding = Literal["rne", "ties_toward_zero"]


@dataclass(frozen=True, kw_only=True)
class Format:
    """A binary floating-point element or scale format, described as data (gfloat's record).

    The primitive fields say how the bits are read; every other fact (width, largest finite
    value, smallest normal and subnormal, the special codes) is derived from them, exactly.

    exponent_bits, mantissa_bits, bias: the usual fields; a normal value with exponent field
                    ``E`` and mantissa field ``M`` is ``2^(E - bias) (1 + M 2^-mantissa_bits)``.
    signed:         one sign bit in front (sign-magnitude).
    has_inf:        IEEE-style specials: the all-ones exponent field holds +-inf (mantissa 0) and
                    NaN (otherwise).  Without it, ``has_nan`` formats keep one NaN magnitude, the
                    all-ones code ("fn" formats: E4M3, UE8M0) and every other code is finite.
    has_nan:        the format can hold NaN.
    has_subnormals: exponent field 0 holds subnormals ``M 2^(1 - bias - mantissa_bits)`` (and
                    zero); without it (UE8M0) field 0 is the normal value ``2^-bias`` and there
                    is no zero.
    storage:        the ml_dtypes / NumPy dtype that holds one element.
    """

    name: str
    exponent_bits: int
    mantissa_bits: int
    bias: int
    signed: bool
    has_inf: bool
    has_nan: bool
    has_subnormals: bool = True
    storage: np.dtype

    @property
    def bits(self) -> int:
        """Width of one code."""
        return int(self.signed) + self.exponent_bits + self.mantissa_bits

    @property
    def code_dtype(self) -> np.dtype:
        """Unsigned integer dtype that holds one code."""
        return np.dtype({4: np.uint8, 8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}[self.bits])

    @property
    def sign_bit(self) -> int:
        return 1 << (self.bits - 1) if self.signed else 0

    @property
    def has_zero(self) -> bool:
        return self.has_subnormals

    @property
    def has_negative_zero(self) -> bool:
        return self.signed and self.has_zero

    @property
    def min_exponent(self) -> int:
        """Exponent of the smallest normal number (``1 - bias``; ``-bias`` without subnormals)."""
        return 1 - self.bias if self.has_subnormals else -self.bias

    @property
    def _top_field(self) -> int:
        return (1 << self.exponent_bits) - 1

    @property
    def max(self) -> float:
        """The largest finite value, exactly."""
        m, top = self.mantissa_bits, self._top_field
        if self.has_inf or (self.has_nan and m == 0):  # the all-ones field is special
            return math.ldexp(2.0 - math.ldexp(1.0, -m), top - 1 - self.bias)
        if self.has_nan:  # "fn": only the all-ones code is NaN
            return math.ldexp(2.0 - math.ldexp(1.0, 1 - m), top - self.bias)
        return math.ldexp(2.0 - math.ldexp(1.0, -m), top - self.bias)

    @property
    def min_normal(self) -> float:
        return math.ldexp(1.0, self.min_exponent)

    @property
    def min_subnormal(self) -> float | None:
        return math.ldexp(1.0, 1 - self.bias - self.mantissa_bits) if self.has_subnormals else None

    @property
    def nan_code(self) -> int | None:
        """The canonical positive NaN code this package writes (the quiet NaN; None without NaN)."""
        if not self.has_nan:
            return None
        if self.has_inf:
            return (self._top_field << self.mantissa_bits) | (1 << (self.mantissa_bits - 1))
        return (1 << (self.exponent_bits + self.mantissa_bits)) - 1

    @property
    def inf_code(self) -> int | None:
        """The +inf code (None without infinities)."""
        return self._top_field << self.mantissa_bits if self.has_inf else None

    def __repr__(self) -> str:
        return f"Format({self.name})"


BF16 = Format(name="bf16", exponent_bits=8, mantissa_bits=7, bias=127, signed=True, has_inf=True, has_nan=True,
              storage=np.dtype(ml_dtypes.bfloat16))
F32 = Format(name="f32", exponent_bits=8, mantissa_bits=23, bias=127, signed=True, has_inf=True, has_nan=True,
             storage=np.dtype(np.float32))
E4M3 = Format(name="e4m3", exponent_bits=4, mantissa_bits=3, bias=7, signed=True, has_inf=False, has_nan=True,
              storage=np.dtype(ml_dtypes.float8_e4m3fn))
E5M2 = Format(name="e5m2", exponent_bits=5, mantissa_bits=2, bias=15, signed=True, has_inf=True, has_nan=True,
              storage=np.dtype(ml_dtypes.float8_e5m2))
E2M1 = Format(name="e2m1", exponent_bits=2, mantissa_bits=1, bias=1, signed=True, has_inf=False, has_nan=False,
              storage=np.dtype(ml_dtypes.float4_e2m1fn))
# UE8M0: unsigned, no mantissa, no zero and no infinity; byte b is 2^(b - 127), byte 255 is NaN.
UE8M0 = Format(name="ue8m0", exponent_bits=8, mantissa_bits=0, bias=127, signed=False, has_inf=False, has_nan=True,
               has_subnormals=False, storage=np.dtype(ml_dtypes.float8_e8m0fnu))

FORMATS: dict[str, Format] = {f.name: f for f in (BF16, F32, E4M3, E5M2, E2M1, UE8M0)}


@dataclass(frozen=True)
class CastPolicy:
    """How a value that is not representable becomes a code.

    rounding:       ``"rne"`` (roundTiesToEven) or ``"ties_toward_zero"`` (nearest, ties to
                    the smaller magnitude: DeepGEMM's ``_quantize_to_fp4_e2m1``).
    saturate:       finite overflow and +-inf become +-max.  Without it, overflow gives the
                    format's infinity, or NaN where it has none (E4M3); a format with neither
                    (E2M1) requires ``saturate=True``.
    nan:            ``"propagate"`` (the canonical NaN with the input's sign) or ``"to_zero"``
                    (+0; DeepGEMM's FP4 rule; required for E2M1, which has no NaN).
    negative_zero:  ``"keep"`` (IEEE) or ``"to_positive"`` (a result of magnitude zero is +0,
                    DeepGEMM's FP4 rule).
    """

    rounding: Rounding
    saturate: bool
    nan: Literal["propagate", "to_zero"] = "propagate"
    negative_zero: Literal["keep", "to_positive"] = "keep"

    def check(self, fmt: Format) -> None:
        if self.rounding not in ("rne", "ties_toward_zero"):
            raise DGArgumentError(f"CastPolicy: rounding: expected 'rne' or 'ties_toward_zero'; got {self.rounding!r}")
        if not fmt.has_inf and not fmt.has_nan and not self.saturate:
            raise DGArgumentError(f"CastPolicy: {fmt.name} has neither inf nor NaN, so saturate must be True")
        if not fmt.has_nan and self.nan == "propagate":
            raise DGArgumentError(f"CastPolicy: {fmt.name} has no NaN code; use nan='to_zero'")


#: IEEE roundTiesToEven, overflow to inf (NaN for E4M3): ml_dtypes' casts from float32.
IEEE_RNE = CastPolicy("rne", saturate=False)
#: roundTiesToEven with saturation of finite overflow and +-inf: torch >= 2.12's float8 casts,
#: PTX ``cvt.rn.satfinite``, CANN's saturating casts.
SATURATING_RNE = CastPolicy("rne", saturate=True)
#: DeepGEMM's FP4 quantiser: ties toward zero, saturate, NaN -> +0, never -0.
DEEPGEMM_FP4 = CastPolicy("ties_toward_zero", saturate=True, nan="to_zero", negative_zero="to_positive")
#: Hardware-style FP4: roundTiesToEven, saturate, NaN -> +0, keep -0.
RNE_FP4 = CastPolicy("rne", saturate=True, nan="to_zero", negative_zero="keep")


# ----------------------------------------------------------------------------------------------
# Decoding
# ----------------------------------------------------------------------------------------------

def decode_scalar(code: int, fmt: Format) -> float:
    """The value of one code (the specification; UE8M0 byte 0 is 2^-127, byte 255 NaN)."""
    if fmt is UE8M0:
        return math.nan if code == 0xFF else math.ldexp(1.0, code - 127)
    sign = -1.0 if fmt.signed and code & fmt.sign_bit else 1.0
    mag = code & (fmt.sign_bit - 1)
    e_field = mag >> fmt.mantissa_bits
    m_field = mag & ((1 << fmt.mantissa_bits) - 1)
    e_all_ones = e_field == (1 << fmt.exponent_bits) - 1
    if fmt is E4M3 and mag == 0x7F:
        return math.nan
    if e_all_ones and fmt.has_inf:
        return sign * math.inf if m_field == 0 else math.nan
    if e_field == 0:
        return sign * math.ldexp(m_field, fmt.min_exponent - fmt.mantissa_bits)
    return sign * math.ldexp((1 << fmt.mantissa_bits) + m_field, e_field - fmt.bias - fmt.mantissa_bits)


_TABLES: dict[str, np.ndarray] = {}


def _table(fmt: Format) -> np.ndarray:
    t = _TABLES.get(fmt.name)
    if t is None:
        t = np.array([decode_scalar(c, fmt) for c in range(1 << fmt.bits)], dtype=np.float64)
        t.setflags(write=False)
        _TABLES[fmt.name] = t
    return t


def decode(codes: npt.ArrayLike, fmt: Format) -> np.ndarray:
    """Decode integer codes (any integer dtype; only the low ``fmt.bits`` bits are read) to float64."""
    c = np.asarray(codes)
    # Widening is exact; a signalling NaN comes back as a quiet NaN of the same sign, which
    # raises the "invalid" flag: not an error here (NaN in, NaN out).
    if fmt is F32:
        with np.errstate(invalid="ignore"):
            return c.astype(np.uint32).view(np.float32).astype(np.float64)
    if fmt is BF16:
        with np.errstate(invalid="ignore"):
            return c.astype(np.uint16).view(ml_dtypes.bfloat16).astype(np.float64)
    mask = (1 << fmt.bits) - 1
    return _table(fmt)[c.astype(np.int64) & mask]


# ----------------------------------------------------------------------------------------------
# Encoding: the scalar specification
# ----------------------------------------------------------------------------------------------

def _floor_log2(a: Fraction) -> int:
    """floor(log2(a)) for a positive rational, exactly."""
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    return e


def _round_integer(n: Fraction, rounding: Rounding) -> int:
    fl = n.numerator // n.denominator
    rem = n - fl
    if rem > Fraction(1, 2):
        return fl + 1
    if rem < Fraction(1, 2):
        return fl
    if rounding == "rne":
        return fl + (fl & 1)
    return fl  # ties toward zero (n >= 0 here)


def _code_of_magnitude(value: Fraction, fmt: Format) -> int:
    """The unsigned code of an exactly representable non-negative finite value."""
    if value == 0:
        return 0
    e = _floor_log2(value)
    m = fmt.mantissa_bits
    if e < fmt.min_exponent:
        mant = value / Fraction(2) ** (fmt.min_exponent - m)
        assert mant.denominator == 1
        return int(mant)
    scaled = value / Fraction(2) ** (e - m)
    assert scaled.denominator == 1
    return ((e + fmt.bias) << m) | (int(scaled) - (1 << m))


def encode_scalar(x: float | Fraction, fmt: Format, policy: CastPolicy) -> int:
    """Round one value (a Python float or an exact ``Fraction``) to a code of ``fmt``.

    This is the specification that :func:`encode` is tested against: it rounds the exact
    value once, with an unbounded exponent range, and then applies the overflow policy.
    """
    if fmt is UE8M0:
        raise DGArgumentError("encode_scalar: use ue8m0_encode_scalar for UE8M0 (it has its own policies)")
    policy.check(fmt)
    if isinstance(x, float) and math.isnan(x):
        if policy.nan == "to_zero":
            return 0
        assert fmt.nan_code is not None
        return fmt.nan_code | (fmt.sign_bit if math.copysign(1.0, x) < 0 else 0)
    if isinstance(x, float):
        negative = math.copysign(1.0, x) < 0
        if math.isinf(x):
            return _overflow_code(fmt, policy, negative)
        a = Fraction(abs(x))
    else:
        negative = x < 0
        a = abs(x)
    sign = fmt.sign_bit if negative else 0
    if a == 0:
        return sign if policy.negative_zero == "keep" else 0
    m = fmt.mantissa_bits
    e = max(_floor_log2(a), fmt.min_exponent)
    quantum = Fraction(2) ** (e - m)
    r = _round_integer(a / quantum, policy.rounding)
    value = r * quantum
    if value > Fraction(fmt.max):
        return _overflow_code(fmt, policy, negative)
    if value == 0:
        return sign if policy.negative_zero == "keep" else 0
    return sign | _code_of_magnitude(value, fmt)


def _overflow_code(fmt: Format, policy: CastPolicy, negative: bool) -> int:
    sign = fmt.sign_bit if negative else 0
    if policy.saturate:
        return sign | _code_of_magnitude(Fraction(fmt.max), fmt)
    if fmt.has_inf:
        assert fmt.inf_code is not None
        return sign | fmt.inf_code
    assert fmt.nan_code is not None
    return sign | fmt.nan_code


# ----------------------------------------------------------------------------------------------
# Correct rounding of float64 and double-double values (round-to-odd lives in .exact)
# ----------------------------------------------------------------------------------------------

def round_f64(x: npt.ArrayLike, fmt: Format, policy: CastPolicy = IEEE_RNE) -> np.ndarray:
    """Correctly round float64 values to ``fmt`` (bf16, f32, fp8 or fp4); returns ``fmt.storage``."""
    return cast(np.asarray(x, np.float64), fmt, policy)


def round_dd(hi: np.ndarray, lo: np.ndarray, fmt: Format, policy: CastPolicy = IEEE_RNE) -> np.ndarray:
    """Correctly round the exact double-double ``hi + lo`` to ``fmt``; returns ``fmt.storage``.

    float64 round-to-odd keeps 53 bits, enough for one correct RNE rounding to float32 (24 + 2)
    and, through the float32 round-to-odd step, to every narrower format.
    """
    if fmt is F32 and policy.rounding != "rne":
        raise DGArgumentError("round_dd: only RNE is supported for float32 outputs")
    return cast(dd_to_f64_round_odd(hi, lo), fmt, policy)


# ----------------------------------------------------------------------------------------------
# Encoding: vectorised
# ----------------------------------------------------------------------------------------------

_E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def _widen_input(x: np.ndarray) -> np.ndarray:
    """float16 / bfloat16 widen exactly to float32; float32 and float64 stay."""
    if x.dtype in (np.float32, np.float64):
        return x
    if x.dtype == np.float16 or x.dtype == ml_dtypes.bfloat16:
        return x.astype(np.float32)
    if x.dtype.kind in "iub":
        return x.astype(np.float64)
    if x.dtype.kind == "f" or x.dtype.itemsize <= 2:  # ml_dtypes narrow floats: exact in float32
        return x.astype(np.float32)
    raise DGArgumentError(f"encode: x: expected a real floating-point array; got dtype {x.dtype}")


def _encode_e2m1(x: np.ndarray, policy: CastPolicy) -> np.ndarray:
    """E2M1 codes by comparing |x| with the midpoints (in x's own precision, exactly)."""
    a = np.abs(x)
    code = np.zeros(x.shape, np.uint8)
    for i, b in enumerate(_E2M1_MIDPOINTS):
        # At a midpoint between codes i and i + 1, RNE goes to the even code.
        if policy.rounding == "rne" and i % 2 == 1:
            code += a >= b
        else:
            code += a > b
    # NaN compares false everywhere, so its magnitude code is already 0 (policy nan="to_zero").
    if policy.negative_zero == "keep":
        sign = np.signbit(x) & ~np.isnan(x)
    else:
        sign = np.signbit(x) & (code != 0)
    return code | (sign.astype(np.uint8) << 3)


def encode(x: npt.ArrayLike, fmt: Format, policy: CastPolicy) -> np.ndarray:
    """Round every element of ``x`` (float64, float32 or narrower) to a code of ``fmt``.

    Returns unsigned integer codes (``fmt.code_dtype``; FP4 codes one per byte).  Equal to
    :func:`encode_scalar` element by element, including NaN, +-inf, -0, ties and subnormals.
    """
    if fmt is UE8M0:
        raise DGArgumentError("encode: use ue8m0_encode for UE8M0 (it has its own policies)")
    policy.check(fmt)
    xa = _widen_input(np.asarray(x))
    if fmt is E2M1:
        return _encode_e2m1(xa, policy)
    if fmt is F32:
        if policy.rounding != "rne":
            raise DGArgumentError("encode: float32 supports only rounding='rne'")
        with np.errstate(over="ignore"):
            r = xa.astype(np.float32)
    else:
        if policy.rounding != "rne":
            # DeepGEMM rounds ties toward zero only in its FP4 quantiser; encode_scalar covers
            # the rule for every format, the vectorised path only where it is used.
            raise DGArgumentError(f"encode: rounding {policy.rounding!r} is implemented for e2m1 only; got {fmt.name}")
        x32 = f64_to_f32_round_odd(xa) if xa.dtype == np.float64 else xa
        if policy.saturate:
            x32 = np.clip(x32, np.float32(-fmt.max), np.float32(fmt.max))  # NaN passes through
        with np.errstate(over="ignore", invalid="ignore"):
            r = x32.astype(fmt.storage)
    codes = r.view(fmt.code_dtype)  # r is a fresh array: modify in place
    if fmt is F32 and policy.saturate:
        big = np.isinf(r)
        if np.any(big):
            codes[big] = np.where(np.signbit(r[big]), 0xFF7FFFFF, 0x7F7FFFFF).astype(np.uint32)
    # ml_dtypes already writes the canonical quiet NaN with the input's sign for bf16, E4M3 and
    # E5M2 (tested against encode_scalar); float32 keeps payloads, so canonicalise there.
    if policy.nan == "to_zero" or fmt is F32:
        nan = np.isnan(xa)
        if np.any(nan):
            if policy.nan == "to_zero":
                codes[nan] = 0
            else:
                assert fmt.nan_code is not None
                codes[nan] = (fmt.nan_code | np.where(np.signbit(xa[nan]), fmt.sign_bit, 0)).astype(fmt.code_dtype)
    if policy.negative_zero == "to_positive":
        codes[codes == fmt.sign_bit] = 0
    return codes


_F32_TABLES: dict[tuple[str, CastPolicy, bool], np.ndarray] = {}


def encode_f32(x: np.ndarray, fmt: Format, policy: CastPolicy, low_bits_zero: bool = False) -> np.ndarray:
    """:func:`encode` of float32 values into a format of at most 6 mantissa bits, by table lookup.

    The rounding of a float32 value to such a format (E4M3, E5M2, E2M1: any policy) depends only
    on its top 16 bits (sign, exponent, 7 mantissa bits) and on whether any of the 16 bits below
    is set (the sticky bit: it tells a tie from a value just above it).  So a table of the codes
    of 2^17 representatives (the top 16 bits, and the lowest bit set for "sticky") gives the code
    of every float32 value, NaN, infinities and subnormals included, bit for bit equal to
    :func:`encode` by construction.  ``low_bits_zero``: the caller knows that every value with a
    non-zero low half rounds like its top half (bf16 values times powers of two: their low 16
    bits are zero unless they are float32 subnormals, which round to zero in these formats);
    the table is then indexed by the top 16 bits alone.
    """
    if fmt.mantissa_bits > 6 or fmt is UE8M0:
        raise DGArgumentError(f"encode_f32: {fmt.name} has more than 6 mantissa bits; use encode")
    key = (fmt.name, policy, low_bits_zero)
    table = _F32_TABLES.get(key)
    if table is None:
        idx = np.arange(1 << (16 if low_bits_zero else 17), dtype=np.uint32)
        rep = (((idx & np.uint32(0xFFFF)) << np.uint32(16)) | (idx >> np.uint32(16))).view(np.float32)
        table = encode(rep, fmt, policy).astype(fmt.code_dtype)
        _F32_TABLES[key] = table
    x = np.asarray(x, np.float32)
    u = (x if x.flags.c_contiguous else x.copy()).view(np.uint32)  # (ascontiguousarray makes a 0-d array 1-D)
    if low_bits_zero:
        return np.take(table, u >> np.uint32(16))
    sticky = ((u & np.uint32(0xFFFF)) + np.uint32(0xFFFF)) >> np.uint32(16)
    return np.take(table, (u >> np.uint32(16)) | (sticky << np.uint32(16)))


def cast(x: npt.ArrayLike, fmt: Format, policy: CastPolicy) -> np.ndarray:
    """Like :func:`encode`, but returns the values in ``fmt.storage`` (an ml_dtypes dtype)."""
    codes = encode(x, fmt, policy)
    return codes.view(fmt.storage)


# ----------------------------------------------------------------------------------------------
# UE8M0 scales: bit operations only
# ----------------------------------------------------------------------------------------------

UE8M0Rounding = Literal["ceil", "floor", "nearest_ties_up"]


def ue8m0_encode_scalar(x: float | Fraction, rounding: UE8M0Rounding) -> int:
    """UE8M0 byte of a positive value (the specification).

    ``"ceil"``: the smallest power of two >= x (DeepGEMM's ``ceil_to_ue8m0``), exponent clamped
    to [-126, 127] so that 0x00 and 0xFF are never produced; zero maps to 2^-126.
    ``"floor"``: the largest power of two <= x (OCP MX), clamped to [-127, 127].
    ``"nearest_ties_up"``: nearest power of two on the linear scale, ties up (the rounding of
    ``astype(float8_e8m0fnu)`` in ml_dtypes and torch), below 2^-127 clamped to 2^-127, above
    2^127 NaN.
    NaN and infinity give 0xFF (NaN) for floor/nearest and 0xFE (2^127) for ceil, as
    DeepGEMM's bit rule does.
    """
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return 0xFE if rounding == "ceil" else 0xFF
    a = abs(Fraction(x))
    if a == 0:
        if rounding == "ceil":
            return 1
        raise DGArgumentError(f"ue8m0_encode_scalar: x: expected a non-zero value for rounding={rounding!r}; got 0")
    e = _floor_log2(a)
    exact = a == Fraction(2) ** e
    if rounding == "ceil":
        e = e if exact else e + 1
        return min(max(e, -126), 127) + 127
    if rounding == "nearest_ties_up":
        if a / Fraction(2) ** e >= Fraction(3, 2):
            e += 1
        if e > 127:
            return 0xFF  # overflow is NaN, as in the ml_dtypes / torch cast
    elif rounding != "floor":
        raise DGArgumentError(
            f"ue8m0_encode_scalar: rounding: expected 'ceil', 'floor' or 'nearest_ties_up'; got {rounding!r}"
        )
    return min(max(e, -127), 127) + 127


def ue8m0_encode(x: npt.ArrayLike, rounding: UE8M0Rounding) -> np.ndarray:
    """Vectorised :func:`ue8m0_encode_scalar` of ``|x|`` (float32 or float64 input); uint8 bytes.

    ``"ceil"`` is exactly DeepGEMM's ``ceil_to_ue8m0`` on float32 bits (exponent field, +1 when a
    mantissa bit is set, clamped to [1, 254]), which also maps float32 subnormals and zero to
    2^-126.  Float64 inputs go through float32 round-to-odd, which keeps both the binade and
    whether the value is a power of two.
    """
    xa = _widen_input(np.asarray(x))
    x32 = f64_to_f32_round_odd(np.abs(xa)) if xa.dtype == np.float64 else np.abs(xa)
    bits = x32.view(np.uint32).astype(np.int64)
    exp = (bits >> 23) & 0xFF
    mant = bits & 0x7FFFFF
    special = exp == 0xFF
    if rounding == "ceil":
        out = np.clip(exp + (mant != 0), 1, 254)
        return out.astype(np.uint8)
    if rounding == "floor":
        e = exp.copy()
        sub = exp == 0  # float32 subnormal (or zero): floor(log2) is below -126
        if np.any(sub & (mant == 0)):
            raise DGArgumentError("ue8m0_encode: x: expected non-zero values for rounding='floor'; got a zero")
        e = np.where(sub, 0, e)  # 2^-127 is the smallest UE8M0 value
        out = np.where(special, 0xFF, e)
        return out.astype(np.uint8)
    if rounding == "nearest_ties_up":
        if np.any((exp == 0) & (mant == 0)):
            raise DGArgumentError(
                "ue8m0_encode: x: expected non-zero values for rounding='nearest_ties_up'; got a zero"
            )
        e = exp + (mant >= 0x400000)  # a significand >= 1.5 rounds up (ties up)
        # A float32 subnormal m * 2^-149 (m < 2^23): floor(log2 m) from frexp (exact for integers).
        _, fe = np.frexp(mant.astype(np.float64))
        sub_e = fe.astype(np.int64) - 1
        sub_up = (sub_e >= 1) & (mant >= (3 << np.maximum(sub_e - 1, 0)))
        e = np.where(exp == 0, np.maximum(sub_e + sub_up - 22, 0), e)
        out = np.where(special | (e > 254), 0xFF, e)
        return out.astype(np.uint8)
    raise DGArgumentError(f"ue8m0_encode: rounding: expected 'ceil', 'floor' or 'nearest_ties_up'; got {rounding!r}")


def ue8m0_decode(
    codes: npt.ArrayLike, zero_byte: Literal["2^-127", "zero"] = "2^-127", dtype: type = np.float64
) -> np.ndarray:
    """Value of UE8M0 bytes: 2^(b - 127); byte 255 is NaN.

    ``zero_byte="2^-127"`` is the OCP MX / NVIDIA hardware reading of byte 0;
    ``"zero"`` is CANN's host decode (``op::Float8E8M0``), which reads byte 0 as 0.0.
    """
    b = np.asarray(codes).astype(np.int64) & 0xFF
    out = np.ldexp(1.0, b - 127)
    out = np.where(b == 0xFF, np.nan, out)
    if zero_byte == "zero":
        out = np.where(b == 0, 0.0, out)
    return out.astype(dtype)


# ----------------------------------------------------------------------------------------------
# Packing
# ----------------------------------------------------------------------------------------------

def pack_fp4(codes: npt.ArrayLike) -> np.ndarray:
    """Pack E2M1 codes two per byte along the last axis: even element in the low nibble.

    ``codes`` (..., 2n) integer -> int8 (..., n), DeepGEMM's packed-FP4 storage.
    """
    c = np.asarray(codes).astype(np.uint8) & 0xF
    if c.shape[-1] % 2:
        raise DGArgumentError(f"pack_fp4: codes: expected an even last dimension; got shape {c.shape}")
    return (c[..., 0::2] | (c[..., 1::2] << 4)).view(np.int8)


def unpack_fp4(packed: npt.ArrayLike) -> np.ndarray:
    """Inverse of :func:`pack_fp4`: int8 or uint8 (..., n) -> uint8 codes (..., 2n)."""
    arr = np.asarray(packed)
    if arr.dtype.itemsize != 1 or arr.dtype.kind not in "iu":
        raise DGArgumentError(f"unpack_fp4: packed: expected int8 or uint8; got dtype {arr.dtype}")
    p = arr.view(np.uint8)
    out = np.empty(p.shape[:-1] + (2 * p.shape[-1],), np.uint8)
    out[..., 0::2] = p & 0xF
    out[..., 1::2] = p >> 4
    return out


def _pack_bytes(b: np.ndarray, per: int, dtype: type, name: str) -> np.ndarray:
    b = np.asarray(b)
    if b.shape[-1] % per:
        raise DGArgumentError(f"{name}: bytes: expected a last dimension divisible by {per}; got shape {b.shape}")
    bu = b.astype(np.uint64).reshape(b.shape[:-1] + (b.shape[-1] // per, per)) & 0xFF
    word = np.zeros(bu.shape[:-1], np.uint64)
    for j in range(per):
        word |= bu[..., j] << np.uint64(8 * j)  # byte j at bits 8j..8j+7 (little-endian order)
    unsigned = {4: np.uint32, 2: np.uint16}[per]
    return word.astype(unsigned).view(dtype)


def _unpack_bytes(w: np.ndarray, per: int, name: str) -> np.ndarray:
    w = np.asarray(w)
    unsigned = {4: np.uint32, 2: np.uint16}[per]
    if w.dtype.itemsize != per:
        raise DGArgumentError(f"{name}: packed: expected {per}-byte integers; got dtype {w.dtype}")
    wu = np.ascontiguousarray(w).view(unsigned).astype(np.uint64)
    out = np.empty(w.shape + (per,), np.uint8)
    for j in range(per):
        out[..., j] = (wu >> np.uint64(8 * j)) & 0xFF
    return out.reshape(w.shape[:-1] + (w.shape[-1] * per,))


def pack_ue8m0_int32(b: npt.ArrayLike) -> np.ndarray:
    """Four UE8M0 bytes per int32 along the last axis; byte j of word p is element 4p + j."""
    return _pack_bytes(np.asarray(b), 4, np.int32, "pack_ue8m0_int32")


def unpack_ue8m0_int32(w: npt.ArrayLike) -> np.ndarray:
    """Inverse of :func:`pack_ue8m0_int32`: int32 (..., n) -> uint8 (..., 4n)."""
    return _unpack_bytes(np.asarray(w), 4, "unpack_ue8m0_int32")


def pack_ue8m0_int16(b: npt.ArrayLike) -> np.ndarray:
    """Two UE8M0 bytes per int16 (DeepGEMM-Ascend's packed pair); low byte = even K-group."""
    return _pack_bytes(np.asarray(b), 2, np.int16, "pack_ue8m0_int16")


def unpack_ue8m0_int16(w: npt.ArrayLike) -> np.ndarray:
    """Inverse of :func:`pack_ue8m0_int16`: int16 (..., n) -> uint8 (..., 2n)."""
    return _unpack_bytes(np.asarray(w), 2, "unpack_ue8m0_int16")
