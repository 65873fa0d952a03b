"""The FP8 cast of DeepEP's legacy low-latency dispatch as pure functions (contract 11.5).

Per token and per block of 128 channels, in float32 (every operation rounded to nearest even)::

    amax      = max(1e-4f, max_i |x_i|)        (NaN elements are ignored: fmaxf)
    default:    scale_inv = amax * float32(1 / 448);   scale = 448 / amax   (a correctly rounded division)
    round_scale: e = ceil(log2(amax * float32(1 / 448))) read from the float bits (exponent - 127,
               + 1 if any mantissa bit is set);  scale = 2^-e;  scale_inv = 2^e
               (both built as the bits (n + 127) << 23, wrapping as the kernel's 32-bit ints do)
    q_i       = e4m3_RN_satfinite(float(x_i) * scale)      (finite overflow and +-inf -> +-448)
    stored SF = scale_inv (float32), or with UE8M0 its exponent byte (bits >> 23)

This is not ``deep_ep.utils.math.per_token_cast_to_fp8`` (that one multiplies by
``(1 / amax) * 448`` and stores ``amax / 448``).  UE8M0 scale bytes are packed four to an int32:
byte j (little-endian) of pack p is the scale of block 4 p + j.
"""

from __future__ import annotations

import numpy as np

from .. import formats as fm
from ..dtypes import E4M3, F32, I32

__all__ = ["FP8_MARGIN", "low_latency_cast_fp8", "pack_ue8m0", "unpack_ue8m0"]

#: The amax floor of DeepEP's casts.
FP8_MARGIN = np.float32(1e-4)
_AMAX_INV = np.float32(1.0) / np.float32(448.0)  # float32(1 / 448), the kernel's constexpr
_U32 = np.uint32


def _pow2_bits(n: np.ndarray) -> np.ndarray:
    """float32 with bits ``(n + 127) << 23`` modulo 2^32 (the kernel's ``fast_pow2``)."""
    return ((n.astype(np.int64) + 127) << 23).astype(np.uint64).astype(_U32).view(F32)


def _log2_ceil(v: np.ndarray) -> np.ndarray:
    """int64: the kernel's ``fast_log2_ceil`` (exponent field - 127, + 1 if any mantissa bit)."""
    bits = np.ascontiguousarray(v, F32).view(_U32).astype(np.int64)
    return ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0)


def low_latency_cast_fp8(x: np.ndarray, round_scale: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The low-latency dispatch's cast of bf16 rows (module docstring).

    x: bf16 (n, H), H a multiple of 128.  Returns ``(q, scale_inv)``: float8_e4m3fn (n, H) and
    float32 (n, H / 128), the stored scale of each block (``q * scale_inv`` approximates x).
    """
    xa = np.asarray(x)
    n, hdim = xa.shape
    blocks = xa.astype(F32).reshape(n, hdim // 128, 128)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        amax = np.fmax(np.fmax.reduce(np.abs(blocks), axis=2, initial=FP8_MARGIN), FP8_MARGIN)
        if round_scale:
            e = _log2_ceil(amax * _AMAX_INV)
            scale, scale_inv = _pow2_bits(-e), _pow2_bits(e)
        else:
            scale_inv = (amax * _AMAX_INV).astype(F32)
            scale = (np.float32(448.0) / amax).astype(F32)
        y = (blocks * scale[:, :, None]).astype(F32)
    q = fm.encode_f32(y.reshape(n, hdim), fm.E4M3, fm.SATURATING_RNE).view(E4M3)
    return np.ascontiguousarray(q), np.ascontiguousarray(scale_inv, F32)


def pack_ue8m0(scale_inv: np.ndarray) -> np.ndarray:
    """float32 (n, G) scales -> int32 (n, G / 4): their exponent bytes (bits >> 23), four per int
    (byte j of pack p = block 4 p + j).  G must be a multiple of 4."""
    s = np.ascontiguousarray(scale_inv, F32)
    n, g = s.shape
    byte = ((s.view(_U32) >> _U32(23)) & _U32(0xFF)).astype(np.uint8)
    return np.ascontiguousarray(byte.reshape(n, g // 4, 4)).view(np.int32).reshape(n, g // 4).astype(I32)


def unpack_ue8m0(packed: np.ndarray) -> np.ndarray:
    """int32 (n, G / 4) packs -> float32 (n, G) scales ``2^(byte - 127)`` (byte 0 as the bits 0)."""
    p = np.ascontiguousarray(packed, I32)
    n = p.shape[0]
    byte = p.view(np.uint8).reshape(n, -1).astype(_U32)
    return (byte << _U32(23)).view(F32)
