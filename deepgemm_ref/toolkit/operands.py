"""Operands and scales in every form the kernels accept, turned into the core's canonical operands.

* :func:`ab_operand` infers the logical (MN, K) shape of an FP8 (E4M3) or packed-FP4 (int8)
  operand as DeepGEMM's ``check_ab_fp8_fp4`` does; :func:`bf16_operands` checks a BF16 pair.
  :meth:`OperandSpec.operand` cuts a :class:`~deepgemm_ref.core.Operand` out of it (one group,
  a row range, a K range), unpacking FP4 into E2M1 codes.
* :func:`resolve_scales` validates one scale-factor tensor as the active target's kernels read
  it (float32 user form, packed UE8M0 int32, int16 UE8M0 pairs, sm90 per-block SFB) and returns
  the float64 scale of every row and K block (:func:`deepgemm_ref.layout.sf_values`).
* :func:`cuda_recipes` / :func:`ascend_recipes` apply each target's recipe rules;
  :func:`alpha_of` reads ``alpha=`` or an ``Alpha`` epilogue object; :data:`OUT_FORMAT` maps an
  output dtype to its format.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import dryrun
from .. import formats as fm
from ..core import Operand
from ..epilogue import Alpha, Epilogue, FP8Quantization, Identity
from ..errors import DGArgumentError, arg_error
from ..profiles import Profile
from .args import BF16, E4M3, F32, I8, I32, U8, align, ceil_div, dtype_name, elem_stride, major_of, packed_fp4
from .scales import check_sf_shape, sf_values
from .sizes import INT_MAX

__all__ = [
    "OperandSpec",
    "ab_operand",
    "check_ascend_mix",
    "bf16_operands",
    "fp4_codes",
    "resolve_scales",
    "ue8m0_bytes_of_f32",
    "recipes",
    "recipe_arg",
    "cuda_recipes",
    "ascend_recipes",
    "alpha_of",
    "OUT_DTYPES",
    "OUT_FORMAT",
]

#: Output dtypes of the GEMMs and their formats.
OUT_DTYPES = (BF16, F32)
OUT_FORMAT = {BF16: fm.BF16, F32: fm.F32}


# ----------------------------------------------------------------------------------------------
# A / B operands
# ----------------------------------------------------------------------------------------------

def fp4_codes(x: np.ndarray, major: str) -> np.ndarray:
    """Packed FP4 (int8) operand -> uint8 E2M1 codes of logical shape (MN, K) (or (G, MN, K)).

    K-major: bytes along K hold (even, odd) K elements in (low, high) nibbles; MN-major: bytes
    along MN hold (even, odd) MN elements.
    """
    if major == "K":
        return fm.unpack_fp4(x)
    codes = fm.unpack_fp4(np.swapaxes(x, -1, -2))  # pack axis last
    return np.swapaxes(codes, -1, -2)


@dataclass
class OperandSpec:
    """An A/B operand in logical (MN, K) orientation after shape inference.

    data:   the user's array, transposed into (G?, MN, K') orientation (K' = K / 2 for K-major
            packed FP4, MN' = MN / 2 for MN-major packed FP4).
    major:  "K" or "MN"; is_fp4: int8 packed E2M1; mn, k: the logical extents; groups: G or None.
    """

    data: np.ndarray
    major: str
    is_fp4: bool
    mn: int
    k: int
    groups: int | None = None

    def operand(self, scales: np.ndarray | None = None, block: int = 0, *, group: int | None = None,
                rows: tuple[int, int] | None = None, k_range: tuple[int, int] | None = None) -> Operand:
        """The core operand of one group, a row range and / or a K range of this operand.

        scales: float64 (G?, MN, ceil(K / block)) from :func:`resolve_scales` (indexed like the
        data), or None.  ``k_range`` slices the data's last axis as stored (K for FP8 and for
        MN-major FP4, which is packed along MN) and the scale blocks it covers.  Building an
        operand ends validation: under DeepGEMM-Ascend's dry run the call ends here.
        """
        dryrun.stop()
        data, sc = self.data, scales
        if group is not None:
            data, sc = data[group], (None if sc is None else sc[group])
        if rows is not None:
            data, sc = data[rows[0]:rows[1]], (None if sc is None else sc[rows[0]:rows[1]])
        if k_range is not None:
            k0, k1 = k_range
            data = data[:, k0:k1]
            sc = None if sc is None else sc[:, k0 // block:ceil_div(k1, block)]
        if self.is_fp4 and self.major == "K":  # bytes along K: decoded two codes at a time, unpacked never
            return Operand(data.view(np.uint8), sc, block, codes_fmt=fm.E2M1, packed=True)
        if self.is_fp4:
            return Operand(fp4_codes(data, self.major), sc, block, codes_fmt=fm.E2M1)
        return Operand(data, sc, block)


def ab_operand(x: np.ndarray, func: str, arg: str, *, grouped: bool = False,
               allowed: tuple[np.dtype, ...] = (E4M3, I8)) -> OperandSpec:
    """Shape inference of DeepGEMM's ``check_ab_fp8_fp4``: an int8 (packed FP4) operand doubles
    its K extent when K-major and its MN extent when MN-major (uint8 packed FP4 is read as int8)."""
    if I8 in allowed:
        x = packed_fp4(x)
    ndim = 3 if grouped else 2
    if x.ndim != ndim:
        raise arg_error(func, arg, f"a {ndim}-D array", x)
    if x.dtype not in allowed:
        raise arg_error(func, arg, "dtype " + " or ".join(dtype_name(t) for t in allowed), x)
    major = major_of(x, func, arg)
    is_fp4 = x.dtype == I8
    mn, k = int(x.shape[-2]), int(x.shape[-1])
    if is_fp4:
        if major == "K":
            k *= 2
        else:
            mn *= 2
    return OperandSpec(x, major, is_fp4, mn, k, int(x.shape[0]) if grouped else None)


def check_ascend_mix(func: str, sa: OperandSpec, sb: OperandSpec) -> None:
    """DeepGEMM-Ascend's operand pairs: FP8 x FP8, FP4 x FP4 or FP8 (A) x FP4 (B)."""
    if sa.is_fp4 and not sb.is_fp4:
        raise arg_error(func, "a", "FP8 x FP8, FP4 x FP4 or FP8 (A) x FP4 (B) operands (Unsupported operand dtypes)",
                        "FP4 A with FP8 B")


def bf16_operands(func: str, ops: tuple[tuple[str, np.ndarray, int], ...],
                  dtypes: tuple[np.dtype, ...] = (BF16,)) -> list[str]:
    """Unscaled operands ``(name, array, ndim)`` (BF16 unless ``dtypes`` says otherwise):
    dimensions and dtype checked; returns each one's major ("K" or "MN")."""
    majors = []
    for name, x, nd in ops:
        if x.ndim != nd:
            raise arg_error(func, name, f"a {nd}-D array", x)
        if x.dtype not in dtypes:
            raise arg_error(func, name, "dtype " + " or ".join(str(t) for t in dtypes), x)
        majors.append(major_of(x, func, name))
    return majors


# ----------------------------------------------------------------------------------------------
# scale factors
# ----------------------------------------------------------------------------------------------

def ue8m0_bytes_of_f32(func: str, arg: str, sf: np.ndarray) -> np.ndarray:
    """float32 scales that must be powers of two (or 0) -> their UE8M0 bytes, same shape."""
    # Note: the devices trap inside the kernel on such scales; we raise the argument error first.
    bits = sf.view(np.uint32)  # a view with any strides: nothing is copied
    bad = (bits & np.uint32(0x807FFFFF)) != 0
    if np.any(bad):
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise arg_error(
            func, arg,
            "float32 scales that are non-negative powers of two (the target packs their exponent byte; "
            "the device kernel traps otherwise); quantise with use_ue8m0=True",
            f"{float(sf[idx])!r} at index {idx}",
        )
    return (bits >> np.uint32(23)).astype(np.uint8)


def _check_cuda_int_sf_layout(func: str, arg: str, sf: np.ndarray, mn: int, groups: int | None) -> None:
    """sm100 already-packed INT SFs must be in the MN-major TMA-aligned layout."""
    if groups is not None and sf.ndim == 3 and elem_stride(sf, -3) != elem_stride(sf, -1) * sf.shape[-1]:
        raise arg_error(func, arg, "packed SFs with stride(-3) == stride(-1) * size(-1)", sf)
    if not (elem_stride(sf, -2) == 1 or mn == 1) or (sf.shape[-1] > 1 and elem_stride(sf, -1) != align(mn, 4)):
        raise arg_error(
            func, arg,
            f"packed UE8M0 SFs in the MN-major TMA-aligned layout (stride(-2) == 1, stride(-1) == {align(mn, 4)}); "
            "use transform_sf_into_required_layout", sf,
        )


def _check_sm90_sfb(func: str, arg: str, sf: np.ndarray, groups: int | None) -> None:
    rows, cols = sf.shape[-2:]
    if groups is not None and elem_stride(sf, -3) != rows * cols:
        raise arg_error(func, arg, "SM90 per-block SFB with stride(-3) == size(-2) * size(-1)", sf)
    row_major = elem_stride(sf, -1) == 1 and elem_stride(sf, -2) == cols
    col_major = elem_stride(sf, -1) == rows and elem_stride(sf, -2) == 1
    if not (row_major or col_major or rows == 1 or cols == 1):
        raise arg_error(func, arg, "an SM90 per-block SFB, contiguous or contiguous after transposing the last "
                        "two dims", sf)


def resolve_scales(
    func: str, arg: str, sf: np.ndarray | None, mn: int, k: int, gran_mn: int, gran_k: int,
    groups: int | None, profile: Profile, *, is_b: bool, disable_ue8m0_cast: bool = False,
) -> np.ndarray:
    """Validate one SF tensor as the active target's kernels read it (``profile.rules.scales``),
    and return its canonical scales.

    Returns float64 (G?, mn, ceil(k / gran_k)): the value the hardware multiplies by.
    """
    if sf is None:
        raise arg_error(func, arg, "a scale-factor array", "None")
    r = profile.rules.scales
    if gran_k not in r.gran_k:
        raise arg_error(func, "recipe", r.gran_k_expected, f"gran_k {gran_k}")
    if r.gran_mn == "any":
        bad_mn = False
    elif r.gran_mn == "pow2<=128":
        bad_mn = bool(gran_mn & (gran_mn - 1)) or gran_mn > 128
    else:
        bad_mn = gran_mn not in r.gran_mn
    if bad_mn:
        raise arg_error(func, "recipe", r.gran_mn_expected, f"gran_mn {gran_mn}")
    if r.per_token_sfa and gran_mn != 1 and not is_b:
        raise arg_error(func, "recipe", f"per-token SFA (gran_m 1) on {profile.name}", f"gran_m {gran_mn}")
    if sf.dtype == F32 or sf.dtype == r.packed:  # shapes first: nothing is read or copied before they match
        read_as_bytes = sf.dtype == F32 and r.float32 == "ue8m0"
        check_sf_shape(sf, mn, k, gran_mn, gran_k, groups, func, arg, form=U8 if read_as_bytes else None)
    if sf.dtype == F32:
        if r.float32 == "ue8m0":
            if disable_ue8m0_cast and r.disable_cast_error is not None:
                raise DGArgumentError(r.disable_cast_error.format(func=func, arg=arg))
            sf = ue8m0_bytes_of_f32(func, arg, sf)
        elif gran_mn == 128:
            _check_sm90_sfb(func, arg, sf, groups)
    elif r.packed is not None and sf.dtype == r.packed:
        if sf.dtype == I32:  # DeepGEMM layout 2: per row, MN-major, TMA-aligned
            if gran_mn != 1:
                raise arg_error(func, "recipe", "gran_mn 1 for packed int32 SFs", f"gran_mn {gran_mn}")
            _check_cuda_int_sf_layout(func, arg, sf, mn, groups)
    else:
        raise arg_error(func, arg, r.dtype_expected, sf)
    return np.asarray(sf_values(sf, mn, k, gran_mn, gran_k, groups, func=func, arg=arg))


# ----------------------------------------------------------------------------------------------
# recipes
# ----------------------------------------------------------------------------------------------

def recipes(func: str, sfa: np.ndarray | None, sfb: np.ndarray | None, recipe: Any, recipe_a: Any, recipe_b: Any,
            profile: Profile) -> tuple[int, int, int, int]:
    """(gran_m, gran_k_a, gran_n, gran_k_b) by the target's recipe rules (DeepGEMM's
    transform_sf_pair or DeepGEMM-Ascend's)."""
    rule = ascend_recipes if profile.target == "deepgemm-ascend" else cuda_recipes
    return rule(func, sfa, sfb, recipe, recipe_a, recipe_b, profile)


def recipe_arg(func: str, arg: str, r: Any, n: int) -> tuple[int, ...] | None:
    """None, or a tuple (or list) of ``n`` positive ints (C++ ints: at most ``INT_MAX``)."""
    if r is None:
        return None
    if not isinstance(r, (tuple, list)) or len(r) != n or not all(
        isinstance(v, (int, np.integer)) and not isinstance(v, bool) and 0 < v <= INT_MAX for v in r
    ):
        raise arg_error(func, arg, f"None or a tuple of {n} positive ints (each <= {INT_MAX})", repr(r))
    return tuple(int(v) for v in r)


def cuda_recipes(
    func: str, sfa: np.ndarray | None, sfb: np.ndarray | None, recipe: Any, recipe_a: Any, recipe_b: Any,
    profile: Profile,
) -> tuple[int, int, int, int]:
    """DeepGEMM's transform_sf_pair recipe rules -> (gran_m, gran_k_a, gran_n, gran_k_b)."""
    r3 = recipe_arg(func, "recipe", recipe, 3)
    ra = recipe_arg(func, "recipe_a", recipe_a, 2)
    rb = recipe_arg(func, "recipe_b", recipe_b, 2)
    if ra is None and r3 is None:
        # The default recipe follows the SFB form: float32 per-128 blocks, or (packed) per-row.
        sfa_t = None if sfa is None else sfa.dtype
        sfb_t = None if sfb is None else sfb.dtype
        packed = profile.rules.scales.packed
        if packed is None:
            if sfa_t != F32:  # the argument at fault named: a's scales (sfa), then b's (sfb)
                raise arg_error(func, "sfa (a[1])", f"float32 SFA for the {profile.name} default recipe",
                                f"SFA of dtype {sfa_t} (SFB {sfb_t})")
            if sfb_t != F32:
                raise arg_error(func, "sfb (b[1])", f"float32 SFB for the {profile.name} default recipe",
                                f"SFB of dtype {sfb_t} (SFA {sfa_t})")
            r3 = (1, 128, 128)
        else:
            if sfb_t not in (F32, packed):
                raise arg_error(func, "sfb (b[1])", f"float32 or {packed} SFB for the {profile.name} default recipe",
                                f"{sfb_t}")
            r3 = (1, 128, 128) if sfb_t == F32 else (1, 1, 128)
    if (ra is None) != (rb is None):
        raise arg_error(func, "recipe_a", "recipe_a and recipe_b given together", f"recipe_a={ra}, recipe_b={rb}")
    if (ra is None) == (r3 is None):
        raise arg_error(func, "recipe", "either recipe or the (recipe_a, recipe_b) pair, not both", f"recipe={r3}")
    if r3 is not None:
        return r3[0], r3[2], r3[1], r3[2]
    assert ra is not None and rb is not None
    return ra[0], ra[1], rb[0], rb[1]


def ascend_recipes(func: str, sfa: np.ndarray | None, sfb: np.ndarray | None, recipe: Any, recipe_a: Any,
                   recipe_b: Any, profile: Profile) -> tuple[int, int, int, int]:
    """DeepGEMM-Ascend: default (1, 1, 32); recipe_a / recipe_b may be given alone; gran_k equal."""
    r3 = recipe_arg(func, "recipe", recipe, 3)
    ra = recipe_arg(func, "recipe_a", recipe_a, 2)
    rb = recipe_arg(func, "recipe_b", recipe_b, 2)
    if r3 is not None and (ra is not None or rb is not None):
        raise arg_error(func, "recipe", "either recipe or recipe_a / recipe_b, not both", f"recipe={r3}")
    if r3 is not None:
        ga, gka, gb, gkb = r3[0], r3[2], r3[1], r3[2]
    else:
        ga, gka = ra if ra is not None else (1, 32)
        gb, gkb = rb if rb is not None else (1, 32)
    if gka != gkb:
        raise arg_error(func, "recipe_b", f"the same gran_k as recipe_a ({gka})", f"gran_k {gkb}")
    return ga, gka, gb, gkb


# ----------------------------------------------------------------------------------------------
# alpha
# ----------------------------------------------------------------------------------------------

def alpha_of(func: str, alpha: Any, epilogue: Any) -> float | None:
    """The float32 alpha from ``alpha=`` or an ``Alpha`` epilogue (at most one of them)."""
    if alpha is not None and epilogue is not None:
        raise arg_error(func, "epilogue", "at most one of epilogue and alpha", f"both (alpha={alpha!r}, {epilogue!r})")
    if epilogue is not None:
        if isinstance(epilogue, FP8Quantization):
            raise arg_error(func, "epilogue", "Identity() or Alpha(alpha) (FP8Quantization needs an FP8 d, which "
                            "only the batched FP8 GEMM accepts)", repr(epilogue))
        if not isinstance(epilogue, Epilogue):
            raise arg_error(func, "epilogue", "an epilogue object (Identity, Alpha)", repr(epilogue))
        if isinstance(epilogue, Alpha):
            alpha = epilogue.alpha
        elif not isinstance(epilogue, Identity):  # pragma: no cover - no other subclasses
            raise arg_error(func, "epilogue", "Identity() or Alpha(alpha)", repr(epilogue))
    if alpha is None:
        return None
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.floating)) or not np.isfinite(alpha):
        raise arg_error(func, "alpha", "a finite float", repr(alpha))
    # The kernel multiplies in float32: a value that overflows float32 would be an infinite alpha.
    with np.errstate(over="ignore"):
        a32 = np.float32(alpha)
    if not np.isfinite(a32):
        raise arg_error(func, "alpha", "a finite float32 value (|alpha| < 3.4028236e38)", repr(alpha))
    return float(a32)
