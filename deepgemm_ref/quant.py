"""DeepGEMM's quantisation utilities (``deep_gemm.utils.math``), byte for byte, in NumPy.

Same names, parameter order and defaults as DeepGEMM.  Inputs may be NumPy arrays (float32,
float64, float16 or ml_dtypes bfloat16) or torch CPU tensors; outputs come back in the caller's
kind, in DeepGEMM's dtypes (E4M3 values, float32 or packed int32 UE8M0 scales, int8 packed FP4).

The float32 operation sequence is DeepGEMM's:

1. ``amax = max|x|`` over the group, in float32, then clamped below at float32(1e-4);
2. ``sf = amax / 448`` (or ``/ 6`` for FP4), evaluated as a multiply by float32(1/448) by
   default, which is what PyTorch does on CUDA tensors (DeepGEMM's tests), or as an IEEE
   division (PyTorch on CPU tensors) under ``numerics(scale_division="cpu")``;
3. with ``use_ue8m0``: ``ceil_to_ue8m0`` on the float32 bits;
4. ``y = x * float32(1 / sf)``: a reciprocal then a multiply, never a division; bfloat16 and
   float16 inputs are widened to float32 first, float64 inputs stay float64 (torch's type
   promotion) and go to E4M3 through float32, as torch does;
5. E4M3: round to nearest even with saturation to +-448 (torch >= 2.12; ``numerics(
   e4m3_overflow="nan")`` gives the older NaN); FP4: DeepGEMM's strict-``>`` thresholds
   (ties toward zero, no -0, NaN -> +0);
6. FP4 packing: even element in the low nibble.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import ml_dtypes
import numpy as np

from . import formats as fm
from ._parallel import parallel_chunks
from .config import NumericsOptions, get_numerics
from .errors import arg_error
from .exact import align, ceil_div  # DeepGEMM's deep_gemm.utils.math names, defined once in .exact
from .interop import caller_kind, from_numpy, to_numpy
from .toolkit.sizes import INT_MAX, check_alloc, check_backed, nbytes

__all__ = [
    "ceil_div",
    "align",
    "ceil_to_ue8m0",
    "pack_ue8m0_to_int",
    "unpack_ue8m0_from_int",
    "per_token_cast_to_fp8",
    "per_channel_cast_to_fp8",
    "per_block_cast_to_fp8",
    "per_custom_dims_cast_to_fp8",
    "per_token_cast_to_fp4",
    "transpose_packed_fp4",
    "cast_back_from_fp4",
]

_F32 = np.float32
_BF16 = np.dtype(ml_dtypes.bfloat16)
_AMAX_FLOOR = np.float32(1e-4)  # DeepGEMM's clamp(1e-4) on a float32 tensor: float32(1e-4)
_FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))


# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------

def _float_input(x: Any, func: str, arg: str = "x", ndim: int | None = None) -> np.ndarray:
    xa = to_numpy(x, func, arg)
    if not isinstance(xa, np.ndarray):
        raise arg_error(func, arg, "a floating-point array or tensor", xa, utility=True)
    if xa.dtype not in _FLOAT_DTYPES:
        raise arg_error(func, arg, "dtype float32, float64, float16 or bfloat16", xa, utility=True)
    if ndim is not None and xa.ndim != ndim:
        raise arg_error(func, arg, f"a {ndim}-D array", xa, utility=True)
    check_backed(func, arg, xa, utility=True)
    return xa


def _gran(func: str, gran_k: Any) -> int:
    # Note: gran_k is at most INT_MAX (DeepGEMM's Python utilities take any positive int): the
    # kernels read granularities as C++ ints, and every row is padded to a multiple of gran_k.
    if not isinstance(gran_k, (int, np.integer)) or isinstance(gran_k, bool) or not 0 < gran_k <= INT_MAX:
        raise arg_error(func, "gran_k", f"a positive integer <= {INT_MAX}", repr(gran_k), utility=True)
    return int(gran_k)


#: Bytes per padded element of the quantisers' working copies: the zero-padded copy (up to 8
#: bytes), its float32 widening, the scaled values and the codes.
_PAD_WORK = 16


def _check_padding(func: str, rows: int, padded: int, what: str) -> None:
    """The zero-padded working copies of ``rows`` rows of ``padded`` elements within the limit."""
    check_alloc(func, "gran_k", nbytes((rows, padded), _PAD_WORK), f"the zero-padded working copy ({what})",
                utility=True)


def _wide(x: np.ndarray) -> np.ndarray:
    """Torch's promotion of ``x * float32_tensor``: float64 stays, everything else is float32."""
    return x if x.dtype == np.float64 else x.astype(_F32)


def _amax_f32(xw: np.ndarray, axis: Any) -> np.ndarray:
    """``x.abs().float().amax(axis)`` then ``clamp(1e-4)`` of the widened input ``xw``.

    Widening bf16/f16 to float32 is exact, so |x| is the same either way; a float64 input is
    rounded to float32 after the abs, as ``.float()`` does.  NaN propagates as in torch.
    """
    a = np.abs(xw)
    if a.dtype != _F32:
        a = a.astype(_F32)
    if axis == 2 and a.ndim == 3 and a.shape[2] > 1 and a.shape[2] & (a.shape[2] - 1) == 0:
        # Pairwise maxima over the (power-of-two) group: same result, faster than max(axis=2)
        # on short rows.  np.maximum propagates NaN like max does.
        while a.shape[2] > 1:
            h = a.shape[2] // 2
            a = np.maximum(a[:, :, :h], a[:, :, h:])
        amax = a
    else:
        amax = np.max(a, axis=axis, keepdims=True)
    return np.maximum(amax, _AMAX_FLOOR)


def _scale_from_amax(amax: np.ndarray, divisor: float, options: NumericsOptions | None = None) -> np.ndarray:
    """``amax / divisor`` as torch evaluates it on CUDA (default) or on the CPU."""
    # Note: DeepGEMM's bytes depend on the tensor's device here; the option picks one.
    options = options or get_numerics()
    with np.errstate(over="ignore", invalid="ignore"):
        if options.scale_division == "cuda":
            return (amax * _F32(1.0 / divisor)).astype(_F32)
        return (amax / _F32(divisor)).astype(_F32)


def _ceil_to_ue8m0_f32(sf: np.ndarray) -> np.ndarray:
    return (fm.ue8m0_encode(sf, "ceil").astype(np.uint32) << np.uint32(23)).view(_F32)


def _reciprocal(sf: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", over="ignore"):
        return (_F32(1.0) / sf).astype(_F32)


def _to_e4m3(y: np.ndarray, options: NumericsOptions | None = None, low_bits_zero: bool = False) -> np.ndarray:
    """torch's ``.to(torch.float8_e4m3fn)``: float64 goes through float32 (torch double-rounds).

    By table lookup on the float32 bits (:func:`deepgemm_ref.formats.encode_f32`, the same codes
    as ``formats.cast``); ``low_bits_zero``: every value is a bf16 value times a power of two.
    """
    # Note: the overflow behaviour depends on the torch version; the option picks one.
    options = options or get_numerics()
    with np.errstate(over="ignore", invalid="ignore"):
        y32 = y.astype(_F32) if y.dtype == np.float64 else y
    policy = fm.SATURATING_RNE if options.e4m3_overflow == "saturate" else fm.IEEE_RNE
    return fm.encode_f32(y32, fm.E4M3, policy, low_bits_zero and y.dtype == _F32).view(ml_dtypes.float8_e4m3fn)


def _bf16_bits_amax(x: np.ndarray, gran_k: int) -> np.ndarray | None:
    """:func:`_amax_f32` of a bf16 chunk ``x`` (rows, n), n a multiple of ``gran_k``, over groups of
    ``gran_k`` columns, from the bit patterns: (rows, n / gran_k, 1) float32, clamped.

    For non-NaN values the order of ``|x|`` is the order of the bits with the sign cleared (as
    unsigned integers; +-0 -> 0, inf -> 0x7F80), so the maximum's bits are the maximum of the
    bits: the same float32 as the float path, from 2-byte integers.  None when the chunk holds a
    NaN (the float path then decides which NaN propagates).
    """
    rows, n = x.shape
    bits = (x.view(np.uint16) & np.uint16(0x7FFF)).reshape(rows, n // gran_k, gran_k)
    if gran_k <= 32:  # short groups: one elementwise maximum per column of the group
        m = bits[:, :, 0].copy()
        for j in range(1, gran_k):
            np.maximum(m, bits[:, :, j], out=m)
    else:
        m = bits.max(axis=2)
    if m.size and int(m.max()) > 0x7F80:
        return None
    amax = (m.astype(np.uint32) << np.uint32(16)).view(_F32)[:, :, None]
    return np.maximum(amax, _AMAX_FLOOR)


def _bf16_to_f32(x: np.ndarray) -> np.ndarray:
    """A bf16 array widened to float32 (exact): its bits shifted into the top half."""
    return np.left_shift(x.view(np.uint16), 16, dtype=np.uint32).view(_F32)


def _pack_codes(codes: np.ndarray) -> np.ndarray:
    """:func:`deepgemm_ref.formats.pack_fp4` of codes < 16 (rows, 2k) uint8 -> int8 (rows, k):
    each little-endian uint16 pair ``c0 | c1 << 8`` becomes ``c0 | c1 << 4``."""
    if sys.byteorder != "little" or codes.shape[-1] % 2 or not codes.flags.c_contiguous:
        return fm.pack_fp4(codes)
    v = codes.view(np.uint16)
    w = v >> np.uint16(4)
    w |= v
    return w.astype(np.uint8).view(np.int8)


def _padded_groups(x: np.ndarray, gran_k: int) -> np.ndarray:
    """(rows, n) -> (rows, ceil(n / gran_k), gran_k), zero-padded in x's own dtype."""
    rows, n = x.shape
    padded_n = align(n, gran_k)
    if padded_n != n:
        xp = np.zeros((rows, padded_n), x.dtype)
        xp[:, :n] = x
        x = xp
    return x.reshape(rows, padded_n // gran_k, gran_k)


def _widened_groups(x: np.ndarray, gran_k: int, bits_path: bool) -> tuple[np.ndarray, np.ndarray]:
    """(the widened groups (rows, n / gran_k, gran_k), their clamped amax (rows, groups, 1)) of a
    chunk; ``bits_path``: x is bf16 with n a multiple of gran_k (amax from the bit patterns, the
    widening a shift; the same float32 values as the float path)."""
    if bits_path:
        amax = _bf16_bits_amax(x, gran_k)
        if amax is not None:
            return _bf16_to_f32(x).reshape(amax.shape[0], amax.shape[1], gran_k), amax
    xw = _wide(_padded_groups(x, gran_k))
    return xw, _amax_f32(xw, axis=2)


#: Elements per parallel chunk of the quantisers (measured best on 2 cores: large enough that thread
#: hand-offs are rare, small enough that a chunk's temporaries stay in cache).
CHUNK_ELEMENTS = 1 << 19


def _rows_per_chunk(width: int) -> int:
    """Rows per parallel chunk: about :data:`CHUNK_ELEMENTS` elements."""
    return max(1, CHUNK_ELEMENTS // max(width, 1))


def _scaled(xw: np.ndarray, inv: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        return xw * inv


# ----------------------------------------------------------------------------------------------
# UE8M0 helpers
# ----------------------------------------------------------------------------------------------

def ceil_to_ue8m0(x: Any) -> Any:
    """Round ``|x|`` up to a power of two by its float32 exponent bits (clamped to [2^-126, 2^127]).

    x: any float array (float64 is first rounded to float32, as ``.float()`` does).
    Returns float32, same shape: powers of two map to themselves, zero and subnormals to
    2^-126, values above 2^127 (and inf, NaN) to 2^127.
    """
    kind = caller_kind(x)
    xa = _float_input(x, "ceil_to_ue8m0")
    x32 = np.abs(xa).astype(_F32)  # torch: x.abs().float()
    return from_numpy(_ceil_to_ue8m0_f32(x32), kind)


def pack_ue8m0_to_int(x: Any) -> Any:
    """Pack float32 powers of two as UE8M0 bytes, four per int32 along the last dimension.

    x: float32 (..., 4n), every value a non-negative power of two (sign and mantissa bits zero).
    Returns int32 (..., n); byte j of word p is the exponent byte of element 4p + j.
    """
    func = "pack_ue8m0_to_int"
    kind = caller_kind(x)
    xa = to_numpy(x, func)
    if not isinstance(xa, np.ndarray) or xa.dtype != np.float32:
        raise arg_error(func, "x", "a float32 array", xa, utility=True)
    check_backed(func, "x", xa, utility=True)
    if xa.ndim == 0 or xa.shape[-1] % 4:
        raise arg_error(func, "x", "a last dimension divisible by 4", xa, utility=True)
    bits = np.ascontiguousarray(xa).view(np.int32)
    bad = (bits < 0) | ((bits & 0x7FFFFF) != 0)
    if np.any(bad):
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise arg_error(func, "x", "non-negative powers of two (sign and mantissa bits zero)",
                        f"{xa[idx]!r} at index {idx}", utility=True)
    return from_numpy(fm.pack_ue8m0_int32((bits >> 23).astype(np.uint8)), kind)


def unpack_ue8m0_from_int(packed_sf: Any) -> Any:
    """Each byte b of an int32 tensor becomes the float32 with bits ``b << 23``.

    packed_sf: int32 (..., n) -> float32 (..., 4n).  Byte 0 gives 0.0 (not 2^-127) and byte 255
    gives +inf: this is DeepGEMM's host-side reading, not the hardware's.
    """
    func = "unpack_ue8m0_from_int"
    kind = caller_kind(packed_sf)
    p = to_numpy(packed_sf, func, "packed_sf")
    if not isinstance(p, np.ndarray) or p.dtype.itemsize != 4 or p.dtype.kind not in "iu":
        raise arg_error(func, "packed_sf", "an int32 array", p, utility=True)
    check_backed(func, "packed_sf", p, utility=True)
    if p.ndim == 0 or (p.shape[-1] > 1 and p.strides[-1] != 4):
        # DeepGEMM views the tensor as uint8, which needs a last dimension of unit stride
        raise arg_error(func, "packed_sf", "at least one dimension, the last one of unit stride", p, utility=True)
    b = fm.unpack_ue8m0_int32(p.view(np.int32))
    return from_numpy((b.astype(np.uint32) << np.uint32(23)).view(_F32), kind)


# ----------------------------------------------------------------------------------------------
# FP8 casts
# ----------------------------------------------------------------------------------------------

def per_token_cast_to_fp8(x: Any, use_ue8m0: bool, gran_k: int = 128, use_packed_ue8m0: bool = False) -> Any:
    """Quantise each row to E4M3 with one scale per ``gran_k`` consecutive columns.

    x: (m, n) float.  Returns ``(x_fp8, sf)``: E4M3 (m, n) contiguous, and float32 scales
    (m, ceil(n / gran_k)) or, with ``use_packed_ue8m0``, packed UE8M0 int32
    (m, ceil(n / gran_k) / 4) (the group count must then be a multiple of 4).
    ``x_fp8 * sf`` (per group) approximates ``x``; ``sf = amax / 448`` (ceiled to a power of
    two with ``use_ue8m0``).
    """
    func = "per_token_cast_to_fp8"
    kind = caller_kind(x)
    gran_k = _gran(func, gran_k)
    xa = _float_input(x, func, ndim=2)
    m, n = xa.shape
    padded_n = align(n, gran_k)
    groups = padded_n // gran_k
    if use_packed_ue8m0 and groups % 4:
        raise arg_error(func, "x", f"a group count (ceil(n / gran_k) = {groups}) divisible by 4 for packed scales",
                        xa, utility=True)
    _check_padding(func, min(m, _rows_per_chunk(padded_n)), padded_n, f"rows padded to {padded_n} columns")
    x_fp8 = np.empty((m, n), ml_dtypes.float8_e4m3fn)
    sf2 = np.empty((m, groups), _F32)
    options = get_numerics()

    bits_path = xa.dtype == _BF16 and padded_n == n

    def work(r0: int, r1: int) -> None:
        xw, amax = _widened_groups(xa[r0:r1], gran_k, bits_path)
        sf = _scale_from_amax(amax, 448.0, options)
        if use_ue8m0:
            sf = _ceil_to_ue8m0_f32(sf)
        q = _to_e4m3(_scaled(xw, _reciprocal(sf)), options, low_bits_zero=use_ue8m0 and xa.dtype == _BF16)
        x_fp8[r0:r1] = q.reshape(r1 - r0, padded_n)[:, :n]
        sf2[r0:r1] = sf.reshape(r1 - r0, groups)

    parallel_chunks(m, _rows_per_chunk(padded_n), work)
    if use_packed_ue8m0:
        return from_numpy((x_fp8, pack_ue8m0_to_int(sf2)), kind)
    return from_numpy((x_fp8, sf2), kind)


def per_channel_cast_to_fp8(x: Any, use_ue8m0: bool, gran_k: int = 128) -> Any:
    """Quantise each column to E4M3 with one scale per ``gran_k`` consecutive rows.

    x: (m, n) float with m divisible by gran_k.  Returns ``(x_fp8 (m, n) E4M3, sf float32
    (m / gran_k, n))``.
    """
    func = "per_channel_cast_to_fp8"
    kind = caller_kind(x)
    gran_k = _gran(func, gran_k)
    xa = _float_input(x, func, ndim=2)
    m, n = xa.shape
    if m % gran_k:
        raise arg_error(func, "x", f"a row count divisible by gran_k={gran_k}", xa, utility=True)
    xw = _wide(xa.reshape(m // gran_k, gran_k, n))
    sf = _scale_from_amax(_amax_f32(xw, axis=1), 448.0)
    if use_ue8m0:
        sf = _ceil_to_ue8m0_f32(sf)
    q = _to_e4m3(_scaled(xw, _reciprocal(sf)))
    return from_numpy((np.ascontiguousarray(q.reshape(m, n)), sf.reshape(m // gran_k, n)), kind)


def per_block_cast_to_fp8(x: Any, use_ue8m0: bool, gran_k: int = 128) -> Any:
    """Quantise ``gran_k x gran_k`` blocks to E4M3 with one scale per block.

    x: (m, n) float.  Returns ``(x_fp8 (m, n) E4M3, sf float32 (ceil(m / gran_k),
    ceil(n / gran_k)))``; both dimensions are zero-padded to multiples of gran_k first (padding
    never changes a block's amax, so only the scale count sees it).  Rows of blocks are
    quantised in chunks on the package's pool: amax, scale and cast per chunk, in one pass over
    the input each.
    """
    func = "per_block_cast_to_fp8"
    kind = caller_kind(x)
    gran_k = _gran(func, gran_k)
    xa = _float_input(x, func, ndim=2)
    m, n = xa.shape
    mb, nb = ceil_div(m, gran_k), ceil_div(n, gran_k)
    block_rows = max(1, _rows_per_chunk(nb * gran_k) // gran_k)  # row blocks per parallel chunk
    _check_padding(func, min(m, block_rows * gran_k), nb * gran_k,
                   f"row blocks of ({m}, {n}) padded to {nb * gran_k} columns")
    out = np.empty((m, n), ml_dtypes.float8_e4m3fn)
    sf_all = np.empty((mb, nb), _F32)
    options = get_numerics()
    low_zero = use_ue8m0 and xa.dtype == _BF16
    bits_path = xa.dtype == _BF16 and n % gran_k == 0

    def work(b0: int, b1: int) -> None:
        r0, r1 = b0 * gran_k, min(m, b1 * gran_k)
        xw, amax = _widened_groups(xa[r0:r1], gran_k, bits_path)  # (rows, nb, gran_k), (rows, nb, 1)
        col = amax[:, :, 0]  # (rows, nb), clamped
        if (b1 - b0) * gran_k != r1 - r0:  # the last row block is short: zero rows do not change amax
            col = np.concatenate([col, np.zeros(((b1 - b0) * gran_k - (r1 - r0), nb), _F32)])
        amax = col.reshape(b1 - b0, gran_k, nb).max(axis=1)
        sf = _scale_from_amax(amax, 448.0, options)
        if use_ue8m0:
            sf = _ceil_to_ue8m0_f32(sf)
        inv = np.repeat(_reciprocal(sf), gran_k, axis=0)[:r1 - r0]  # (rows, nb) per row
        q = _to_e4m3(_scaled(xw, inv[:, :, None]), options, low_bits_zero=low_zero)
        out[r0:r1] = q.reshape(r1 - r0, nb * gran_k)[:, :n]
        sf_all[b0:b1] = sf

    parallel_chunks(mb, block_rows, work)
    return from_numpy((out, sf_all), kind)


def per_custom_dims_cast_to_fp8(x: Any, dims: Sequence[int], use_ue8m0: bool) -> Any:
    """Quantise to E4M3 with one scale per index of the dimensions in ``dims``.

    The amax is taken over every dimension *not* listed in ``dims`` (negative entries never
    match, exactly as in DeepGEMM).  Returns ``(x_fp8 with x's shape, sf.squeeze())``; the
    squeeze drops every size-1 dimension, so one token gives a 0-d scale.
    """
    func = "per_custom_dims_cast_to_fp8"
    kind = caller_kind(x)
    xa = _float_input(x, func)
    try:
        dim_set = set(dims)
    except TypeError:
        raise arg_error(func, "dims", "a tuple of dimension indices", repr(dims), utility=True) from None
    excluded = tuple(i for i in range(xa.ndim) if i not in dim_set)
    # torch's amax(dim=()) reduces every dimension; NumPy's max(axis=()) reduces none.
    axis = excluded if excluded else tuple(range(xa.ndim))
    empty = [i for i in axis if xa.shape[i] == 0]
    if empty:  # torch's amax refuses a zero-size reduction dimension
        raise arg_error(func, "x", f"non-zero sizes in the reduced dimensions {list(axis)}", xa, utility=True)
    xw = _wide(xa)
    sf = _scale_from_amax(_amax_f32(xw, axis=axis), 448.0)
    if use_ue8m0:
        sf = _ceil_to_ue8m0_f32(sf)
    q = np.asarray(_to_e4m3(_scaled(xw, _reciprocal(sf))))
    q = q if q.flags.c_contiguous else q.copy()  # (np.ascontiguousarray would make a 0-d x 1-D)
    return from_numpy((q, np.array(np.squeeze(sf))), kind)


# ----------------------------------------------------------------------------------------------
# FP4
# ----------------------------------------------------------------------------------------------

def per_token_cast_to_fp4(x: Any, use_ue8m0: bool, gran_k: int = 128, use_packed_ue8m0: bool = False) -> Any:
    """Quantise each row to packed E2M1 with one scale per ``gran_k`` columns.

    x: (m, n) float, n even.  Returns ``(packed int8 (m, n / 2), sf)``: sf float32
    (m, ceil(n / gran_k)) or, with ``use_packed_ue8m0`` (requires ``use_ue8m0``), int32
    (m, ceil(ceil(n / gran_k) / 4)), the scale count right-padded with 1.0 (byte 127).
    Elements use DeepGEMM's thresholds: ties toward zero, > 5 saturates to 6, NaN -> +0, no -0.
    """
    func = "per_token_cast_to_fp4"
    kind = caller_kind(x)
    gran_k = _gran(func, gran_k)
    xa = _float_input(x, func, ndim=2)
    m, n = xa.shape
    if n % 2:
        raise arg_error(func, "x", "an even number of columns", xa, utility=True)
    if use_packed_ue8m0 and not use_ue8m0:
        raise arg_error(func, "use_packed_ue8m0", "use_ue8m0=True when packing scales", "use_ue8m0=False",
                        utility=True)
    padded_n = align(n, gran_k)
    if padded_n % 2:  # DeepGEMM packs the padded codes in pairs (its view fails on an odd width)
        raise arg_error(func, "gran_k", f"a granularity that pads n = {n} to an even width",
                        f"{gran_k} (padded width {padded_n})", utility=True)
    groups = padded_n // gran_k
    _check_padding(func, min(m, _rows_per_chunk(padded_n)), padded_n, f"rows padded to {padded_n} columns")
    packed = np.empty((m, n // 2), np.int8)
    sf2 = np.empty((m, groups), _F32)
    options = get_numerics()

    bits_path = xa.dtype == _BF16 and padded_n == n

    def work(r0: int, r1: int) -> None:
        xw, amax = _widened_groups(xa[r0:r1], gran_k, bits_path)
        sf = _scale_from_amax(amax, 6.0, options)
        if use_ue8m0:
            sf = _ceil_to_ue8m0_f32(sf)
        # Thresholds are compared in the product's own precision (float64 stays float64 in torch).
        y = _scaled(xw, _reciprocal(sf))
        if y.dtype == _F32:  # a table on the float32 bits: the same codes as the threshold compares
            codes = fm.encode_f32(y, fm.E2M1, fm.DEEPGEMM_FP4, low_bits_zero=use_ue8m0 and xa.dtype == _BF16)
        else:
            codes = fm.encode(y, fm.E2M1, fm.DEEPGEMM_FP4)
        packed[r0:r1] = _pack_codes(codes.reshape(r1 - r0, padded_n))[:, : n // 2]
        sf2[r0:r1] = sf.reshape(r1 - r0, groups)

    parallel_chunks(m, _rows_per_chunk(padded_n), work)
    if use_packed_ue8m0:
        num_sf = sf2.shape[-1]
        if num_sf % 4:
            sf2 = np.concatenate([sf2, np.ones((m, align(num_sf, 4) - num_sf), _F32)], axis=1)
        return from_numpy((packed, pack_ue8m0_to_int(sf2)), kind)
    return from_numpy((packed, sf2), kind)


def _packed_fp4_input(a: Any, func: str, arg: str) -> np.ndarray:
    aa = to_numpy(a, func, arg)
    if not isinstance(aa, np.ndarray) or aa.dtype != np.int8:
        raise arg_error(func, arg, "an int8 array of packed FP4", aa, utility=True)
    check_backed(func, arg, aa, utility=True)
    return aa


def transpose_packed_fp4(a: Any) -> Any:
    """Transpose a packed-FP4 matrix: int8 (m, n / 2) -> int8 (n, m / 2) contiguous (m even).

    The result's byte [j, i] holds the codes of elements (2i, j) (low nibble) and (2i + 1, j).
    """
    func = "transpose_packed_fp4"
    kind = caller_kind(a)
    aa = _packed_fp4_input(a, func, "a")
    if aa.ndim != 2:
        raise arg_error(func, "a", "a 2-D array", aa, utility=True)
    if aa.shape[0] % 2:
        raise arg_error(func, "a", "an even number of rows", aa, utility=True)
    codes_t = np.ascontiguousarray(fm.unpack_fp4(aa).T)
    return from_numpy(np.ascontiguousarray(fm.pack_fp4(codes_t)), kind)


def cast_back_from_fp4(packed: Any, sf: Any, gran_k: int = 128, use_packed_ue8m0: bool = False) -> Any:
    """Dequantise packed FP4: int8 (m, n / 2) and scales -> float32 (m, n).

    sf: float32 (m, >= ceil(n / gran_k)), or packed int32 with ``use_packed_ue8m0`` (read by
    :func:`unpack_ue8m0_from_int`).  Code 8 (-0) decodes to +0, as in DeepGEMM.
    """
    func = "cast_back_from_fp4"
    kind = caller_kind(packed, sf)
    gran_k = _gran(func, gran_k)
    pa = _packed_fp4_input(packed, func, "packed")
    if pa.ndim != 2:
        raise arg_error(func, "packed", "a 2-D array", pa, utility=True)
    sa = to_numpy(sf, func, "sf")
    if use_packed_ue8m0:
        if not isinstance(sa, np.ndarray) or sa.dtype != np.int32:
            raise arg_error(func, "sf", "an int32 array of packed UE8M0 scales", sa, utility=True)
        sa = np.asarray(unpack_ue8m0_from_int(sa))
    if not isinstance(sa, np.ndarray) or sa.dtype != np.float32 or sa.ndim != 2:
        raise arg_error(func, "sf", "a 2-D float32 array", sa, utility=True)
    m, n2 = pa.shape
    n = 2 * n2
    need = ceil_div(n, gran_k) if n else 0
    if sa.shape[0] != m or sa.shape[1] < need:
        raise arg_error(func, "sf", f"shape ({m}, >= {need})", sa, utility=True)
    codes = fm.unpack_fp4(pa)
    values = fm.decode(codes & 0x7, fm.E2M1).astype(_F32)  # sign of code 8 dropped: -0 -> +0
    values = np.where((codes & 0x8).astype(bool) & ((codes & 0x7) != 0), -values, values)
    group_idx = np.arange(n) // gran_k
    with np.errstate(over="ignore", invalid="ignore"):
        out = (values * sa[:, group_idx]).astype(_F32)
    return from_numpy(out, kind)
