"""Scaling-factor (SF) layouts: DeepGEMM's TMA layout helpers and both targets' SF transforms.

Every FP8/FP4 kernel reads its scales in one "required" layout; these functions build it from
the user form and check it when the caller already built it.  Shapes below use
``SF_K = ceil(k / gran_k)`` and ``G?`` for the optional leading group dimension; strides are
in elements.

User form (both targets)
    float32 ``(G?, ceil(mn / gran_mn), SF_K)``, any strides.

DeepGEMM layout 1: MN-major TMA-aligned float32 (sm90 SFA, sm90 1D1D SFB)
    ``(G?, mn, SF_K)`` with strides ``(align(mn, 4) * SF_K, 1, align(mn, 4))``.

DeepGEMM layout 2: MN-major TMA-aligned packed UE8M0 int32 (every sm100 kernel)
    ``(G?, mn, ceil(SF_K / 4))`` with strides ``(ceil(SF_K / 4) * align(mn, 4), 1, align(mn, 4))``;
    byte ``j`` (bits ``8j..8j+7``) of word ``[.., r, p]`` is the exponent byte of
    ``SF[.., r, 4p + j]``, 0 for ``4p + j >= SF_K``.

DeepGEMM-Ascend layout: MN-major packed UE8M0 pairs, int16
    ``(G?, mn, ceil(k / 64))`` with strides ``(ceil(k / 64) * mn, 1, mn)``: the physical tensor
    is ``(G?, ceil(k / 64), mn)`` row-major, returned as a transposed view.  The low byte of
    ``[.., r, p]`` is the exponent byte of K-group ``2p``, the high byte that of ``2p + 1``
    (0 when ``2p + 1 >= SF_K``).

UE8M0 bytes are the float32 exponent field (bits 23..30).  The device kernels trap when a
float32 SF has its sign bit or a mantissa bit set; here that is a :class:`DGArgumentError`
(see each function for the one DeepGEMM path that floors silently instead).

Padding: every freshly built output is allocated at its padded size and filled with zeros
before the values are written, so padding rows (``mn .. align(mn, 4) - 1``), padding bytes and
unused packed rows are zero.  DeepGEMM's CUDA kernels leave padding rows uninitialised; nothing
reads them, so zero is one valid value of "unspecified".

Aliasing: a function that finds its input already in the required layout
returns the input itself (same Python object, NumPy array or torch tensor) or, where DeepGEMM
does, a view of it; writing into such a result writes into the input.

Every function takes NumPy arrays or torch CPU tensors and returns results of the caller's kind
(torch results share the padded storage and carry the same strides).

The inverse direction, for kernels (:mod:`deepgemm_ref.toolkit.scales`, re-exported here):
:func:`sf_values` reads the scale of every row and K-block
from any of these forms as the hardware does (UE8M0 byte ``b`` is ``2^(b - 127)``, byte 0 is
``2^-127``, byte 255 NaN); :func:`to_user_form` undoes the packing bit for bit (byte ``b`` becomes
the float32 with bits ``b << 23``), so user form -> required -> user form is byte-identical
for non-negative power-of-two scales.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import runtime
from ..api import profiled
from ..errors import arg_error
from ..interop import Kind, caller_kind, from_numpy, is_tensor
from ..profiles import Profile
from ..toolkit.args import (
    F32,
    I16,
    I32,
    align,
    as_array,
    bool_arg,
    ceil_div,
    int_tuple,
    is_contiguous,
    opt_bool_arg,
    strides,
)
from ..toolkit.groups import ascend_gap_mask, psum_row_mask
from ..toolkit.scales import (
    ASCEND_PAIR_K,
    batched,
    check_sf_shape,
    exponent_bytes,
    pack_k_grouped_ue8m0,
    pack_le,
    sf_values,
    to_user_form,
)
from ..toolkit.sizes import check_alloc, nbytes, size_arg

# Note: padding rows and bytes of every built layout are zero (DeepGEMM leaves them uninitialised),
# and a float32 SF that the device kernels would trap on raises DGArgumentError instead.

__all__ = [
    "get_tma_aligned_size",
    "get_mn_major_tma_aligned_tensor",
    "get_mn_major_tma_aligned_packed_ue8m0_tensor",
    "get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor",
    "transform_sf_into_required_layout",
    "transform_k_grouped_sf_into_required_layout",
    "sf_values",
    "check_sf_shape",
    "to_user_form",
    "pack_k_grouped_ue8m0",
    "ASCEND_PAIR_K",
]

# ----------------------------------------------------------------------------------------------
# small helpers
# ----------------------------------------------------------------------------------------------

def _to_caller(view: np.ndarray, storage: np.ndarray, kind: Kind) -> Any:
    """``view`` (a view into the contiguous ``storage``) in the caller's kind; a torch result
    shares the whole padded storage and has ``view``'s strides."""
    if kind == "numpy":
        return view
    t = from_numpy(storage, kind)
    offset = 0
    if view.size:
        offset = (view.__array_interface__["data"][0] - storage.__array_interface__["data"][0]) // view.itemsize
    return t.as_strided(view.shape, strides(view), offset)


def _psum_ends(func: str, psum_layout: Any, *, require_1d: bool) -> np.ndarray:
    """The int32 psum end offsets as int64, after the host checks both targets make."""
    p = as_array(psum_layout, func, "psum_layout")
    if p.dtype != I32:
        raise arg_error(func, "psum_layout", "an int32 array", p)
    if require_1d and p.ndim != 1:
        raise arg_error(func, "psum_layout", "a 1-D array", p)
    if not is_contiguous(p):
        raise arg_error(func, "psum_layout", "a contiguous array", p)
    if p.size == 0:
        raise arg_error(func, "psum_layout", "at least one group", p)
    ends = p.ravel().astype(np.int64)
    if (ends < 0).any():
        # The kernels read the offsets as unsigned integers.
        raise arg_error(func, "psum_layout", "non-negative end offsets", repr(ends.tolist()))
    return ends


# ----------------------------------------------------------------------------------------------
# DeepGEMM (sm90, sm100)
# ----------------------------------------------------------------------------------------------

def _get_tma_aligned_size(x: int, element_size: int, /) -> int:
    """``align(x, 16 // element_size)``: the TMA-aligned extent of ``x`` elements of ``element_size`` bytes.

    ``element_size`` must divide 16 (4 for float32/int32 SFs gives ``align(x, 4)``).
    """
    func = "get_tma_aligned_size"
    x = size_arg(func, "x", x, minimum=0)
    element_size = size_arg(func, "element_size", element_size, minimum=1)
    if 16 % element_size:
        raise arg_error(func, "element_size", "a divisor of 16 (TMA needs 16-byte alignment)", repr(element_size))
    return align(x, 16 // element_size)


def _float_sf(func: str, sf: Any) -> np.ndarray:
    a = as_array(sf, func, "sf")
    if a.dtype != F32:
        raise arg_error(func, "sf", "a float32 array", a)
    if a.ndim not in (2, 3):
        raise arg_error(func, "sf", "a 2-D (mn, sf_k) or 3-D (num_groups, mn, sf_k) array", a)
    return a


def _mn_major_tma_aligned(func: str, sf_obj: Any, kind: Kind) -> Any:
    sf = _float_sf(func, sf_obj)
    b = batched(sf)
    g, mn, sf_k = b.shape
    tma_mn = align(mn, 4)
    st = strides(b)
    if (sf.ndim == 2 or st[0] == tma_mn * sf_k) and st[1] == 1 and st[2] == tma_mn:
        # Already layout 1: no copy.  DeepGEMM returns a 3-D input itself and a view of a 2-D one.
        if sf.ndim == 3:
            return sf_obj
        return sf_obj.unsqueeze(0).squeeze(0) if is_tensor(sf_obj) else sf[np.newaxis][0]
    storage = np.zeros((g, sf_k, tma_mn), F32)
    storage[:, :, :mn] = b.transpose(0, 2, 1)
    view = storage.transpose(0, 2, 1)[:, :mn, :]
    return _to_caller(view[0] if sf.ndim == 2 else view, storage, kind)


def _get_mn_major_tma_aligned_tensor(sf: Any, /) -> Any:
    """The float32 SFs in DeepGEMM layout 1 (MN-major, TMA-aligned); values unchanged.

    sf: float32 (mn, sf_k) or (G, mn, sf_k), any strides.
    Returns float32 of the same shape with strides (1, align(mn, 4)) or
    (align(mn, 4) * sf_k, 1, align(mn, 4)); padding rows are zero.  An input already in that
    layout is returned without a copy: a 3-D input itself, a 2-D input as a view of it (for 2-D
    only the last two strides are checked).
    """
    func = "get_mn_major_tma_aligned_tensor"
    return _mn_major_tma_aligned(func, sf, caller_kind(sf))


def _pack_int32_mn_major(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """UE8M0 bytes (G, mn, sf_k) -> (storage (G, P, align(mn, 4)), layout-2 view (G, mn, P)) int32."""
    g, mn, sf_k = b.shape
    p = ceil_div(sf_k, 4)
    tma_mn = align(mn, 4)
    storage = np.zeros((g, p, tma_mn), I32)
    storage[:, :, :mn] = pack_le(b, 4).transpose(0, 2, 1)
    return storage, storage.transpose(0, 2, 1)[:, :mn, :]


def _packed_ue8m0(profile: Profile, func: str, sf_obj: Any, psum_layout: Any, kind: Kind, where: str = "") -> Any:
    sf = _float_sf(func, sf_obj)
    b = batched(sf)
    g, mn, sf_k = b.shape
    contiguous = is_contiguous(b)
    keep = None
    if psum_layout is not None:
        if g != 1 or not contiguous:
            raise arg_error(func, "sf", "a single contiguous batch when psum_layout is given", sf)
        ends = _psum_ends(func, psum_layout, require_1d=False)
        alignment = runtime.current_mk_alignment(profile)
        if alignment <= 0:
            raise arg_error(func, "psum_layout", "a positive contiguous-layout alignment to place groups",
                            f"get_mk_alignment_for_contiguous_layout() = {alignment}")
        keep = psum_row_mask(ends, mn, alignment)[np.newaxis, :, np.newaxis]
    if contiguous:
        # The transpose-and-pack kernel checks every loaded value; batched inputs whose batch
        # size is not a whole number of 16-byte vectors take the PyTorch fallback instead.
        check = not ((mn * sf_k) % 4 and g > 1)
    else:
        check = not (mn % 4 or g > 1)
        if check and strides(b)[1:] != (1, mn):
            raise arg_error(func, "sf", f"a contiguous array or an MN-major one with strides (1, {mn})", sf)
    # Where DeepGEMM takes its PyTorch fallback (check False) it keeps the exponent field
    # without checking it, flooring non-powers of two and dropping a sign bit; so do we.
    by = exponent_bytes(b, func, "sf", check=check, keep=keep, lead=3 - sf.ndim, where=where)
    storage, view = _pack_int32_mn_major(by)
    return _to_caller(view[0] if sf.ndim == 2 else view, storage, kind)


def _get_mn_major_tma_aligned_packed_ue8m0_tensor(profile: Profile, /, sf: Any, psum_layout: Any = None) -> Any:
    """Pack float32 power-of-two SFs into DeepGEMM layout 2 (UE8M0, four per int32, MN-major, TMA-aligned).

    sf: float32 (mn, sf_k) or (G, mn, sf_k).  Contiguous, or 2-D MN-major with strides
    (1, mn); other strides are accepted only where DeepGEMM falls back to PyTorch (mn % 4 != 0
    or 3-D).
    psum_layout: optional int32 contiguous non-empty array of m-grouped psum end offsets (then
    sf must be one contiguous batch); rows outside every group's [start_g, end_g), with
    start_g = align(end_{g-1}, get_mk_alignment_for_contiguous_layout()), get packed value 0.
    Returns int32 (mn, P) or (G, mn, P), P = ceil(sf_k / 4), strides (1, align(mn, 4)) or
    (P * align(mn, 4), 1, align(mn, 4)); byte j of [.., r, p] is the exponent byte of
    sf[.., r, 4p + j] (0 past sf_k); padding rows and bytes are zero.

    Values must be non-negative powers of two (or 0.0 / +inf, bytes 0 / 255) wherever the CUDA
    kernel reads them; otherwise DGArgumentError (the kernel traps).  Exception kept from
    DeepGEMM: the PyTorch fallback (non-contiguous with mn % 4 != 0 or 3-D, or 3-D contiguous
    with (mn * sf_k) % 4 != 0) keeps the exponent field without checking.
    """
    func = "get_mn_major_tma_aligned_packed_ue8m0_tensor"
    return _packed_ue8m0(profile, func, sf, psum_layout, caller_kind(sf, psum_layout))


def _check_sf_layout_cuda(
    func: str, sf: np.ndarray, mn: int, k: int, gran_mn: int, gran_k: int, num_groups: int | None
) -> None:
    """DeepGEMM's ``check_sf_layout`` shape checks."""
    if sf.dtype not in (F32, I32):
        raise arg_error(func, "sf", "a float32 or int32 (packed UE8M0) array", sf)
    ndim = 2 + (num_groups is not None)
    if sf.ndim != ndim:
        raise arg_error(func, "sf", f"a {ndim}-D array (num_groups={num_groups})", sf)
    sf_cols = ceil_div(k, gran_k * (1 if sf.dtype == F32 else 4))
    want = ((num_groups,) if num_groups is not None else ()) + (ceil_div(mn, gran_mn), sf_cols)
    if sf.shape != want:
        what = "ceil(k / gran_k)" if sf.dtype == F32 else "ceil(k / (4 * gran_k))"
        raise arg_error(func, "sf", f"shape {want} = ((num_groups,) ceil(mn / gran_mn), {what})", sf)


def _transform_cuda(
    profile: Profile,
    /,
    sf: Any,
    mn: int,
    k: int,
    recipe: tuple[int, int, int] | tuple[int, int],
    num_groups: int | None = None,
    is_sfa: bool | None = None,
    disable_ue8m0_cast: bool = False,
    psum_layout: Any = None,
) -> Any:
    """Turn user-form SFs into the layout DeepGEMM's kernels read (each profile's own rules).

    sf: float32 (G?, ceil(mn / gran_mn), ceil(k / gran_k)), or on sm100 an already packed int32
    (G?, mn, ceil(k / (4 gran_k))) in layout 2 (gran_mn 1).  The 3-D forms need num_groups.
    recipe: (gran_mn_a, gran_mn_b, gran_k) with is_sfa given, or (gran_mn, gran_k) with is_sfa None.
    psum_layout: m-grouped psum end offsets (int32), passed to the sm100 packer (gap rows -> 0).
    Returns, by the first matching rule:

    1. float32, gran_mn 1, gran_k 128, sm90 or disable_ue8m0_cast: get_mn_major_tma_aligned_tensor(sf);
    2. float32, gran_mn 128, gran_k 128, sm90 or disable_ue8m0_cast: sf itself, after checking it is
       row-major or transposed-contiguous (what the sm90 1D2D kernel reads);
    3. float32, gran_k 32 or 128, sm100: rows broadcast (row r takes SF row r // gran_mn), then
       get_mn_major_tma_aligned_packed_ue8m0_tensor(..., psum_layout): int32 layout 2;
       disable_ue8m0_cast is an error here;
    4. int32, gran_mn 1, gran_k 32 or 128, sm100: sf itself, after checking layout 2's strides;
    5. anything else is an error ("unknown SF transformation").
    """
    func = "transform_sf_into_required_layout"
    kind = caller_kind(sf, psum_layout)
    mn = size_arg(func, "mn", mn, minimum=0)
    k = size_arg(func, "k", k, minimum=0)
    r = int_tuple(func, "recipe", recipe, (3, 2))
    sfa = opt_bool_arg(func, "is_sfa", is_sfa)
    if len(r) == 3:
        if sfa is None:
            raise arg_error(func, "is_sfa", "True or False with a 3-tuple recipe", "None")
        gran_mn, gran_k = (r[0] if sfa else r[1]), r[2]
    else:
        if sfa is not None:
            raise arg_error(func, "is_sfa", "None with a 2-tuple recipe (gran_mn, gran_k)", repr(sfa))
        gran_mn, gran_k = r
    groups = None if num_groups is None else size_arg(func, "num_groups", num_groups, minimum=0)
    disable = bool_arg(func, "disable_ue8m0_cast", disable_ue8m0_cast)
    a = as_array(sf, func, "sf")
    _check_sf_layout_cuda(func, a, mn, k, gran_mn, gran_k, groups)
    sf_rules = profile.rules.scales
    reads_float = sf_rules.float32 == "float"  # sm90's kernels read float32 SFs as they are
    reads_packed = sf_rules.packed == I32  # sm100's kernels read layout 2
    is_float = a.dtype == F32

    if is_float and gran_mn == 1 and gran_k == 128 and (reads_float or disable):
        return _mn_major_tma_aligned(func, sf, kind)
    if is_float and gran_mn == 128 and gran_k == 128 and (reads_float or disable):
        st, sh = strides(a), a.shape
        if a.size == 0:
            return sf
        if groups is not None and st[0] != sh[1] * sh[2]:
            raise arg_error(func, "sf", f"stride(0) == {sh[1] * sh[2]} for the sm90 per-block SFB", a)
        if not ((st[-1] == 1 and st[-2] == sh[-1]) or (st[-1] == sh[-2] and st[-2] == 1)):
            raise arg_error(func, "sf", "a row-major or transposed-contiguous per-block SFB (sm90 1D2D kernel)", a)
        return sf
    if is_float and gran_k in (32, 128) and reads_packed:
        if disable:
            raise arg_error(func, "disable_ue8m0_cast",
                            f"False for float32 SFs with recipe {r} on sm100 (the kernels need UE8M0)", "True")
        where = ""
        b = batched(a)
        # the row-broadcast float32 SFs, their exponent bytes and the packed int32 layout
        check_alloc(func, "mn", nbytes((b.shape[0], align(mn, 4), b.shape[2]), 4 + 1 + 1) + 8 * mn,
                    f"the packed SF layout of (num_groups, mn, sf_k) = ({b.shape[0]}, {mn}, {b.shape[2]})")
        if gran_mn != 1:
            a = np.ascontiguousarray(a[..., np.arange(mn) // gran_mn, :])
            where = f" of the row-broadcast SFs (row r reads sf row r // {gran_mn})"
        return _packed_ue8m0(profile, func, a, psum_layout, kind, where)
    if not is_float and gran_mn == 1 and gran_k in (32, 128) and reads_packed:
        st = strides(a)
        tma_mn = align(mn, 4)
        ok = (st[-2] == 1 or mn == 1) and st[-1] == tma_mn
        if groups is not None:
            ok = ok and st[0] == st[-1] * a.shape[-1]
        if not ok and a.size:
            want = (f"({tma_mn} * {a.shape[-1]}, 1, {tma_mn})" if groups is not None else f"(1, {tma_mn})")
            raise arg_error(func, "sf", f"packed int32 SFs in the MN-major TMA-aligned layout, strides {want}", a)
        return sf
    raise arg_error(
        func, "sf",
        "a known SF transformation (sm90: float32 with gran_k 128 and gran_mn 1 or 128; "
        "sm100: float32 or packed int32 (gran_mn 1) with gran_k 32 or 128)",
        f"{a.dtype} SFs with gran_mn {gran_mn}, gran_k {gran_k} on {profile.name}",
    )


# ----------------------------------------------------------------------------------------------
# DeepGEMM-Ascend (ascend950)
# ----------------------------------------------------------------------------------------------

def _transform_ascend_impl(
    profile: Profile,
    func: str,
    sf_obj: Any,
    mn: int,
    k: int,
    recipe: Any,
    num_groups: int | None,
    is_sfa: Any,
    disable_ue8m0_cast: bool,
    psum_layout: Any,
    grouping: str,
) -> Any:
    kind = caller_kind(sf_obj, psum_layout)
    if is_sfa is None:
        raise arg_error(func, "is_sfa", "True or False (DeepGEMM-Ascend asserts it is given)", "None")
    sfa = opt_bool_arg(func, "is_sfa", is_sfa)
    # Note: DeepGEMM-Ascend declares a 3-tuple; a 2-tuple fails pybind's conversion (TypeError there).
    r = int_tuple(func, "recipe", recipe, (3,))
    mn = size_arg(func, "mn", mn, minimum=0)
    k = size_arg(func, "k", k, minimum=0)
    groups = None if num_groups is None else size_arg(func, "num_groups", num_groups, minimum=0)
    disable = bool_arg(func, "disable_ue8m0_cast", disable_ue8m0_cast)
    gran_mn, gran_k = (r[0] if sfa else r[1]), r[2]

    a = as_array(sf_obj, func, "sf")
    if a.dtype not in (F32, I16):
        raise arg_error(func, "sf", "a float32 or int16 (packed UE8M0 pairs) array", a)
    ndim = 2 + (groups is not None)
    if a.ndim != ndim:
        raise arg_error(func, "sf", f"a {ndim}-D array (num_groups={groups})", a)
    st = strides(a)
    # Note: stride checks skip empty arrays, which have nothing to read (NumPy gives a fresh
    # empty array all-zero strides, torch contiguous ones); the same holds for the CUDA checks.
    if a.size and st[-1] != 1 and st[-2] != 1:
        raise arg_error(func, "sf", "stride(-1) == 1 or stride(-2) == 1", a)
    is_float = a.dtype == F32
    sf_cols = ceil_div(k, gran_k if is_float else 2 * gran_k)
    want = ((groups,) if groups is not None else ()) + (ceil_div(mn, gran_mn), sf_cols)
    if a.shape != want:
        what = "ceil(k / gran_k)" if is_float else "ceil(k / (2 * gran_k))"
        raise arg_error(func, "sf", f"shape {want} = ((num_groups,) ceil(mn / gran_mn), {what})", a)
    if gran_k != 32:
        raise arg_error(func, "recipe", "gran_k == 32 (DeepGEMM-Ascend scales are per-32 MX scales)", repr(r))
    if not is_float and gran_mn == 1 and st[-2] == 1 and st[-1] == a.shape[-2]:
        if groups is None or st[0] == a.shape[-2] * a.shape[-1]:
            return sf_obj  # already the required layout: the input itself, gap rows untouched
    if is_float and disable:
        raise arg_error(func, "disable_ue8m0_cast",
                        "False for float32 SFs (DeepGEMM-Ascend must convert them to UE8M0)", "True")
    if gran_mn > 128 or gran_mn & (gran_mn - 1):
        raise arg_error(func, "recipe", "gran_mn a power of two in [1, 128]", f"gran_mn {gran_mn} in {r}")

    b = batched(a)
    g, src_rows, src_cols = b.shape
    dst_k = ceil_div(src_cols, 2) if is_float else src_cols
    # the int16 layout and the row-broadcast pairs it is built from
    check_alloc(func, "mn", 2 * nbytes((g, dst_k, mn), 2) + 8 * mn,
                f"the int16 SF layout of (num_groups, mn, ceil(k / 64)) = ({g}, {mn}, {dst_k})")
    keep_rows = keep_cols = None
    if grouping != "none":
        if g != 1:
            raise arg_error(func, "sf", "a single batch for a grouped (psum) transform", a)
        if psum_layout is None:
            raise arg_error(func, "psum_layout", "int32 psum end offsets", "None")
        ends = _psum_ends(func, psum_layout, require_1d=True)
        if (np.diff(ends) < 0).any():
            # Note: the kernel scans the groups in order assuming non-decreasing ends; other
            # layouts have no defined result, so they are rejected here.
            raise arg_error(func, "psum_layout", "non-decreasing end offsets", repr(ends.tolist()))
        alignment = runtime.current_mk_alignment(profile)
        k_major = st[-1] == 1
        # The kernel zeroes gap entries of int16 input only where it clears source rows
        # in its buffer (m-grouped K-major, k-grouped MN-major); in the other two cases its
        # int16 copy path ignores the gap flags, so the gap pairs pass through unchanged.
        zero_gaps = is_float or (k_major if grouping == "m" else not k_major)
        if zero_gaps and grouping == "m":
            keep_rows = ascend_gap_mask(ends, src_rows, gran_mn, alignment)
        elif zero_gaps:
            keep_cols = ascend_gap_mask(ends, src_cols, 32 if is_float else ASCEND_PAIR_K, alignment)

    storage = np.zeros((g, dst_k, mn), I16)
    if storage.size == 0:  # nothing to launch, so nothing is checked either
        view = storage.transpose(0, 2, 1)
        return _to_caller(view[0] if a.ndim == 2 else view, storage, kind)
    keep = None
    if keep_rows is not None:
        keep = keep_rows[np.newaxis, :, np.newaxis]
    elif keep_cols is not None:
        keep = keep_cols[np.newaxis, np.newaxis, :]
    if is_float:
        pairs = pack_le(exponent_bytes(b, func, "sf", check=True, keep=keep, lead=3 - a.ndim), 2)
    else:
        pairs = b if keep is None else np.where(keep, b, np.int16(0))
    if gran_mn != 1:
        pairs = pairs[:, np.arange(mn) // gran_mn, :]
    storage[...] = pairs.transpose(0, 2, 1)
    view = storage.transpose(0, 2, 1)
    return _to_caller(view[0] if a.ndim == 2 else view, storage, kind)


def _transform_ascend(
    profile: Profile,
    /,
    sf: Any,
    mn: int,
    k: int,
    recipe: tuple[int, int, int],
    num_groups: int | None = None,
    is_sfa: bool | None = None,
    disable_ue8m0_cast: bool = False,
    psum_layout: Any = None,
) -> Any:
    """Turn SFs into the layout DeepGEMM-Ascend's kernels read: MN-major int16 UE8M0 pairs.

    sf: float32 (G?, ceil(mn / gran_mn), ceil(k / 32)) or int16 pairs (G?, ceil(mn / gran_mn),
    ceil(k / 64)); stride(-1) == 1 or stride(-2) == 1; 3-D needs num_groups.
    recipe: (gran_m, gran_n, gran_k), a 3-tuple; is_sfa (required) picks gran_mn = gran_m or
    gran_n; gran_k must be 32; gran_mn a power of two in [1, 128] (rows broadcast, row r taking
    source row r // gran_mn).
    psum_layout: optional int32 1-D contiguous m-grouped psum end offsets (single batch only);
    source rows between ceil(end_g / gran_mn) and the next 256-aligned group start get byte 0
    (scale 2^-127, not zero); rows past the last group's aligned end are converted normally.
    Returns int16 (G?, mn, ceil(k / 64)), strides (ceil(k / 64) * mn, 1, mn): a transposed view
    of the row-major (G?, ceil(k / 64), mn) result; low byte = even K-group, high byte of the
    last pair 0 when ceil(k / 32) is odd.  An int16 input with gran_mn 1 that is already
    MN-major (strides (.., 1, mn)) is returned itself, without touching gap rows.

    float32 values must be non-negative powers of two (0.0 gives byte 0, +inf byte 255) outside
    the zeroed gaps; otherwise DGArgumentError (the device asserts).  disable_ue8m0_cast=True
    with float32 SFs is an error.
    """
    return _transform_ascend_impl(profile, "transform_sf_into_required_layout", sf, mn, k, recipe, num_groups, is_sfa,
                                  disable_ue8m0_cast, psum_layout, "none" if psum_layout is None else "m")


def _transform_k_grouped_ascend(
    profile: Profile, /, sf: Any, mn: int, k: int, recipe: tuple[int, int, int], is_sfa: bool, psum_layout: Any
) -> Any:
    """The k-grouped variant of DeepGEMM-Ascend's transform: same checks, no num_groups.

    sf: float32 (ceil(mn / gran_mn), ceil(k / 32)) or int16 pairs (ceil(mn / gran_mn), ceil(k / 64))
    covering the total K extent including alignment gaps (indexed by absolute K).
    psum_layout: int32 1-D contiguous K end offsets (required).  Source entries between each
    group's end and the next 256-aligned start are zeroed: float32 columns
    [ceil(end / 32), align(end, 256) / 32), int16 pair columns [ceil(end / 64), align(end, 256) / 64)
    (an int16 K-major input keeps its gap pairs, as the kernel does).
    Returns int16 (mn, ceil(k / 64)) MN-major (strides (1, mn)); see transform_sf_into_required_layout.
    """
    return _transform_ascend_impl(profile, "transform_k_grouped_sf_into_required_layout", sf, mn, k, recipe, None,
                                  is_sfa, False, psum_layout, "k")


# ----------------------------------------------------------------------------------------------
# public, profile-dispatched names
# ----------------------------------------------------------------------------------------------

_CUDA_ONLY = {
    "deepgemm-ascend": "DeepGEMM-Ascend has no TMA layout helpers; transform_sf_into_required_layout "
                       "builds its int16 pair layout"
}
_ASCEND_ONLY = {
    "deepgemm": "a DeepGEMM-Ascend addition; DeepGEMM packs k-grouped SFs with "
                "get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor"
}

get_tma_aligned_size = profiled("get_tma_aligned_size", _CUDA_ONLY, deepgemm=_get_tma_aligned_size)
get_mn_major_tma_aligned_tensor = profiled(
    "get_mn_major_tma_aligned_tensor", _CUDA_ONLY, deepgemm=_get_mn_major_tma_aligned_tensor
)
get_mn_major_tma_aligned_packed_ue8m0_tensor = profiled(
    "get_mn_major_tma_aligned_packed_ue8m0_tensor", _CUDA_ONLY, deepgemm=_get_mn_major_tma_aligned_packed_ue8m0_tensor
)
get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor = profiled(
    "get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor",
    _CUDA_ONLY,
    deepgemm=pack_k_grouped_ue8m0,
)
transform_sf_into_required_layout = profiled(
    "transform_sf_into_required_layout", deepgemm=_transform_cuda, deepgemm_ascend=_transform_ascend
)
transform_k_grouped_sf_into_required_layout = profiled(
    "transform_k_grouped_sf_into_required_layout", _ASCEND_ONLY, deepgemm_ascend=_transform_k_grouped_ascend
)


