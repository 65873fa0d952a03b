"""Scale factors as the kernels read them: every accepted SF form to the scale of each row and K block.

The kernel side of :mod:`deepgemm_ref.layout.sf` (whose public, profile-dispatched transforms build
the layouts): :func:`check_sf_shape` checks the shape of any SF form before anything is read,
:func:`sf_values` reads the scale of every row and K block as the hardware does (UE8M0 byte ``b``
is ``2^(b - 127)``, byte 0 is ``2^-127``, byte 255 NaN) and :func:`to_user_form` undoes the
packing bit for bit (byte ``b`` becomes the float32 with bits ``b << 23``).  The byte helpers
(:func:`exponent_bytes`, :func:`pack_le`) and the k-grouped packer (:func:`pack_k_grouped_ue8m0`,
DeepGEMM's ``get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor``, which the k-grouped kernels
also call) are shared by both directions.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from .. import formats as fm
from ..dtypes import F32, I16, I32
from ..errors import arg_error
from ..interop import Kind, caller_kind, from_numpy
from .args import align, as_array, bool_arg, ceil_div, int_arg, is_contiguous, ks_list
from .sizes import check_alloc, nbytes, size_arg

__all__ = [
    "ASCEND_PAIR_K",
    "POW2_EXPECTED",
    "exponent_bytes",
    "pack_le",
    "batched",
    "pack_k_grouped_ue8m0",
    "check_sf_shape",
    "sf_values",
    "to_user_form",
]

_SIGN_AND_MANTISSA = np.uint32(0x807FFFFF)
POW2_EXPECTED = "non-negative powers of two (float32 sign and mantissa bits zero; the device kernel traps otherwise)"

#: K elements covered by one DeepGEMM-Ascend int16 pair (two per-32 UE8M0 scales).
ASCEND_PAIR_K = 64


def exponent_bytes(
    x: np.ndarray,
    func: str,
    arg: str,
    *,
    check: bool,
    keep: np.ndarray | None = None,
    lead: int = 0,
    where: str = "",
) -> np.ndarray:
    """The UE8M0 byte (float32 bits 23..30) of every element of float32 ``x``; uint8, same shape.

    check: raise where an element has its sign bit or a mantissa bit set (the device trap).
    keep:  optional bool mask broadcastable to ``x``; False entries become byte 0 and are not
           checked (the kernels never load them).
    lead:  leading index entries to leave out of the error message (an added batch axis);
    where: what the index refers to, when it is not the caller's array.
    """
    bits = x.view(np.uint32)
    if check:
        flagged = np.bitwise_and(bits, _SIGN_AND_MANTISSA)
        if keep is not None:
            flagged *= keep
        if flagged.any():
            bad = flagged != 0
            idx = tuple(int(i) for i in np.argwhere(bad)[0])
            raise arg_error(func, arg, POW2_EXPECTED,
                            f"{float(x[idx])!r} (bits 0x{int(bits[idx]):08x}) at index {idx[lead:]}{where}")
    out = (bits >> np.uint32(23)).astype(np.uint8)  # the cast keeps the low 8 bits: a set sign bit drops out
    if keep is not None:
        out *= keep
    return out


def pack_le(b: np.ndarray, per: int) -> np.ndarray:
    """``per`` (4 or 2) UE8M0 bytes per int32 / int16 along the last axis, byte j at bits 8j..8j+7.

    b: uint8 (..., n); the last word is zero-padded.  Returns int32 / int16 (..., ceil(n / per)).
    Same result as :func:`formats.pack_ue8m0_int32` / ``pack_ue8m0_int16`` (tested equal); the
    bytes are reinterpreted through an explicitly little-endian dtype, so no host byte order
    leaks in.
    """
    n = b.shape[-1]
    if n % per or not b.flags.c_contiguous:
        padded = np.zeros(b.shape[:-1] + (align(n, per),), np.uint8)
        padded[..., :n] = b
        b = padded
    native = np.int32 if per == 4 else np.int16
    return b.view("<i4" if per == 4 else "<i2").astype(native, copy=False)


def batched(a: np.ndarray) -> np.ndarray:
    return a[np.newaxis] if a.ndim == 2 else a


def pack_k_grouped_ue8m0(
    sf: Any, grouped_layout: Any, ks_cpu: Any, gran_k: int, k_alignment: int, use_psum_layout: bool = False
) -> Any:
    """Pack the float32 SFs of a k-grouped operand: SF rows run along K, groups packed compactly.

    sf: float32 (SF_ROWS, mn) contiguous, mn % 4 == 0; group g owns ceil(k_g / gran_k)
    consecutive rows, groups in order, no gaps.
    grouped_layout: int32 contiguous, num_groups <= 128 entries: per-group K sizes k_g, or with
    use_psum_layout psum END offsets, k_g = end_g - align(end_{g-1}, k_alignment).
    ks_cpu: the host's per-group K sizes (len num_groups), or None / [] (only with
    use_psum_layout).  gran_k: 32 or 128.  k_alignment: a positive multiple of 32.
    Returns int32 (PACKED_ROWS, mn) row-major.  Group g owns ceil(rows_g / 4) consecutive packed
    rows; byte j of its packed row p is the exponent byte of its SF row 4p + j (0 past rows_g).
    PACKED_ROWS = sum_g ceil(ks_cpu[g] / (4 gran_k)), or (SF_ROWS + 3 num_groups) // 4 without
    ks_cpu; rows past the packed content are zero (DeepGEMM leaves them uninitialised).
    Without use_psum_layout, sum_g ceil(ks_cpu[g] / gran_k) must equal SF_ROWS.

    The group sizes come from grouped_layout (the device reads it), except for a single
    non-psum group, which owns all SF_ROWS rows.  Every SF value packed must be a non-negative
    power of two (the kernel traps otherwise); a group reaching past SF_ROWS is an error.
    """
    func = "get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor"
    kind = caller_kind(sf, grouped_layout)
    gran_k = size_arg(func, "gran_k", gran_k, minimum=0)
    if gran_k not in (32, 128):
        raise arg_error(func, "gran_k", "32 or 128", repr(gran_k))
    k_alignment = size_arg(func, "k_alignment", k_alignment, minimum=1)
    if k_alignment % 32:
        raise arg_error(func, "k_alignment", "a positive multiple of 32", repr(k_alignment))
    use_psum_layout = bool_arg(func, "use_psum_layout", use_psum_layout)
    a = as_array(sf, func, "sf")
    if a.dtype != F32 or a.ndim != 2:
        raise arg_error(func, "sf", "a 2-D float32 array (sf_rows, mn)", a)
    if not is_contiguous(a):
        raise arg_error(func, "sf", "a contiguous array", a)
    sf_rows, mn = a.shape
    gl = as_array(grouped_layout, func, "grouped_layout")
    num_groups = gl.size
    if num_groups > 128:
        raise arg_error(func, "grouped_layout", "at most 128 groups", gl)
    if mn % 4:
        raise arg_error(func, "sf", "mn (the last dimension) divisible by 4", a)
    if gl.dtype != I32 or not is_contiguous(gl):
        raise arg_error(func, "grouped_layout", "a contiguous int32 array", gl)
    ks = ks_list(func, ks_cpu)
    synced = bool(ks)
    if synced:
        assert ks is not None
        if len(ks) != num_groups:
            raise arg_error(func, "ks_cpu", f"{num_groups} entries (one per group of grouped_layout)", repr(ks))
        if any(k < 0 for k in ks):
            raise arg_error(func, "ks_cpu", "non-negative K sizes", repr(ks))
        if not use_psum_layout and sum(ceil_div(k, gran_k) for k in ks) != sf_rows:
            raise arg_error(func, "ks_cpu", f"sum(ceil(k / {gran_k})) == {sf_rows} (the SF rows of sf)", repr(ks))
        packed_rows = sum(ceil_div(k, 4 * gran_k) for k in ks)
    else:
        if not use_psum_layout:
            raise arg_error(func, "ks_cpu", "the per-group K sizes (None or [] needs use_psum_layout=True)",
                            repr(ks_cpu))
        packed_rows = (sf_rows + 3 * num_groups) // 4

    # Group sizes as the device derives them.
    values = gl.ravel().astype(np.int64).tolist()
    if num_groups == 1 and not use_psum_layout:
        group_rows = [sf_rows]
    else:
        group_ks = []
        prev_end = 0
        for g, v in enumerate(values):
            k_g = v - align(prev_end, k_alignment) if use_psum_layout else v
            if k_g < 0:
                what = "non-negative K sizes"
                if use_psum_layout:
                    what = "end offsets with end_g >= align(end_{g-1}, k_alignment)"
                raise arg_error(func, "grouped_layout", what, f"{values!r} (group {g})")
            group_ks.append(k_g)
            prev_end = v
        group_rows = [ceil_div(k, gran_k) for k in group_ks]

    # the byte rows, their transpose and the packed int32 result
    check_alloc(func, "ks_cpu" if synced else "sf", nbytes((packed_rows, mn), 12),
                f"the packed k-grouped SFs ({packed_rows} packed rows x {mn})")
    byte_rows = np.zeros((4 * packed_rows, mn), np.uint8)
    src = dst = 0
    for g, rows in enumerate(group_rows):
        n_read = min(rows, max(0, 4 * packed_rows - dst))  # rows past the allocation are never read
        if src + n_read > sf_rows:
            raise arg_error(func, "grouped_layout", f"groups whose SF rows fit in sf ({sf_rows} rows)",
                            f"{values!r}: group {g} needs SF rows up to {src + rows}")
        if n_read:
            byte_rows[dst:dst + n_read] = exponent_bytes(a[src:src + n_read], func, "sf", check=True)
        src += rows
        dst += 4 * ceil_div(rows, 4)
    out = np.ascontiguousarray(pack_le(np.ascontiguousarray(byte_rows.T), 4).T)
    return from_numpy(out, kind)


_BYTE_DTYPES = (np.dtype(np.uint8), np.dtype(ml_dtypes.float8_e8m0fnu))


def check_sf_shape(
    sf: np.ndarray, mn: int, k: int, gran_mn: int, gran_k: int, num_groups: int | None, func: str, arg: str,
    form: np.dtype | None = None,
) -> tuple[int, Any]:
    """Check the shape of any SF form of :func:`sf_values` (nothing is read or copied); returns
    (SF_K, the unpacker of the form: None for float32 and byte forms).  ``form``: the dtype whose
    shape rule applies (default sf's own; uint8 for float32 scales read as their exponent bytes)."""
    form = sf.dtype if form is None else np.dtype(form)
    ndim = 2 + (num_groups is not None)
    if sf.ndim != ndim or (num_groups is not None and sf.shape[0] != num_groups):
        lead = f"({num_groups}, " if num_groups is not None else "("
        raise arg_error(func, arg, f"a {ndim}-D array {lead}rows, columns)", sf)
    sf_k = ceil_div(k, gran_k)
    rows_user = ceil_div(mn, gran_mn)
    rows, cols = sf.shape[-2:]
    if form == F32:
        if (rows, cols) != (rows_user, sf_k):
            raise arg_error(func, arg, f"float32 SFs of shape (..., {rows_user}, {sf_k}) = "
                            "(ceil(mn / gran_mn), ceil(k / gran_k))", sf)
        return sf_k, None
    if form == I32:
        want_cols, unpack = ceil_div(sf_k, 4), fm.unpack_ue8m0_int32
    elif form == I16:
        if gran_k != 32:
            raise arg_error(func, "gran_k", "32 for int16 UE8M0 pairs", repr(gran_k))
        want_cols, unpack = ceil_div(k, ASCEND_PAIR_K), fm.unpack_ue8m0_int16
    elif form in _BYTE_DTYPES:
        want_cols, unpack = sf_k, None
    else:
        raise arg_error(func, arg, "float32, int32 (4 UE8M0 per int), int16 (2 UE8M0 per int) or UE8M0 bytes", sf)
    if rows not in (mn, rows_user) or cols != want_cols:
        raise arg_error(func, arg, f"{sf.dtype} SFs of shape (..., {mn} or {rows_user}, {want_cols})", sf)
    return sf_k, unpack


def _sf_bytes(
    sf: Any, mn: int, k: int, gran_mn: int, gran_k: int, num_groups: int | None, func: str, arg: str
) -> tuple[np.ndarray, Kind]:
    """Validate any SF form; returns (per-entry data of shape (G, rows, SF_K), caller kind).

    The data is float32 for the float32 form and UE8M0 bytes (uint8) for every other form;
    rows is mn or ceil(mn / gran_mn).
    """
    kind = caller_kind(sf)
    mn = int_arg(func, "mn", mn, minimum=0)
    k = int_arg(func, "k", k, minimum=0)
    gran_mn = int_arg(func, "gran_mn", gran_mn, minimum=1)
    gran_k = int_arg(func, "gran_k", gran_k, minimum=1)
    groups = None if num_groups is None else int_arg(func, "num_groups", num_groups, minimum=0)
    a = as_array(sf, func, arg)
    sf_k, unpack = check_sf_shape(a, mn, k, gran_mn, gran_k, groups, func, arg)
    b = batched(a)
    if a.dtype == F32:
        return b, kind
    by = b.view(np.uint8) if unpack is None else unpack(b)[..., :sf_k]
    return by, kind


def _broadcast_rows(x: np.ndarray, mn: int, gran_mn: int) -> np.ndarray:
    if x.shape[1] == mn:
        return x
    return x[:, np.arange(mn) // gran_mn, :]


def sf_values(
    sf: Any, mn: int, k: int, gran_mn: int, gran_k: int, num_groups: int | None = None, *, func: str, arg: str
) -> np.ndarray:
    """The scale of every row and K-block, as the hardware reads it; float64 (G?, mn, ceil(k / gran_k)).

    A kernel-side reading: the result is a NumPy array also for torch input (kernels compute in
    NumPy and convert only what they return).

    sf may be any form a kernel can be given, with any strides:

    * float32 user form (G?, ceil(mn / gran_mn), ceil(k / gran_k)) (including DeepGEMM layout 1
      and the sm90 per-block SFB): the float32 values, rows broadcast (row r reads r // gran_mn);
    * int32 packed UE8M0 (G?, mn, ceil(ceil(k / gran_k) / 4)): K-major as returned by
      per_token_cast_to_fp8(use_packed_ue8m0=True), or DeepGEMM layout 2;
    * int16 UE8M0 pairs (G?, mn, ceil(k / 64)), gran_k 32: DeepGEMM-Ascend's layout, or its
      int16 input form;
    * UE8M0 bytes (uint8 or float8_e8m0fnu) (G?, mn, ceil(k / gran_k)).

    Integer and byte forms may also have ceil(mn / gran_mn) rows (then broadcast).  UE8M0 byte b
    reads as 2^(b - 127) exactly: byte 0 is 2^-127 and byte 255 NaN.  ``func`` and ``arg`` name
    the calling function and argument in errors (DGArgumentError on any shape mismatch).
    """
    data, _ = _sf_bytes(sf, mn, k, gran_mn, gran_k, num_groups, func, arg)
    vals = data.astype(np.float64) if data.dtype == F32 else fm.ue8m0_decode(data)
    out = np.ascontiguousarray(_broadcast_rows(vals, int(mn), int(gran_mn)))
    return out[0] if num_groups is None else out


def to_user_form(
    sf: Any,
    mn: int,
    k: int,
    gran_mn: int,
    gran_k: int,
    num_groups: int | None = None,
    *,
    func: str = "to_user_form",
    arg: str = "sf",
) -> Any:
    """Any SF form back to the float32 user form (G?, ceil(mn / gran_mn), ceil(k / gran_k)), contiguous.

    Returns the caller's kind (a new array or tensor, never a view of ``sf``).

    Accepts the forms of :func:`sf_values`.  Packed bytes b become the float32 with bits b << 23
    (DeepGEMM's unpack_ue8m0_from_int reading: byte 0 -> 0.0, byte 255 -> +inf), so for
    non-negative power-of-two scales (and 0.0, +inf) user form -> required layout -> user form
    is byte-identical.  A per-row input (mn rows) with gran_mn > 1 gives the first row of every
    block of gran_mn rows.
    """
    data, kind = _sf_bytes(sf, mn, k, gran_mn, gran_k, num_groups, func, arg)
    if data.shape[1] != ceil_div(int(mn), int(gran_mn)):
        data = data[:, :: int(gran_mn), :]
    if data.dtype == F32:
        out = np.array(data, dtype=F32, order="C", copy=True)  # never alias the caller's array
    else:
        out = (data.astype(np.uint32) << np.uint32(23)).view(np.float32)
    return from_numpy(out[0] if num_groups is None else out, kind)
