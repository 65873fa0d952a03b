"""k-grouped GEMMs: one GEMM per group of K rows, accumulated into c[g], both targets.

For every group g owning the K rows ``K_g`` (the layout parsers of
:mod:`deepgemm_ref.layout.groups`)::

    d[g] = epilogue( sum_{k in K_g} outer(A[k, :] sa, B[k, :] sb) ; c[g] )

with the dense kernels' ``c`` rules (bf16 ``d``: ``bf16(c + bf16(acc))``; float32 ``d``:
``f32(c + acc)``) and DeepGEMM-Ascend's ``alpha``.  An empty group keeps ``c[g]`` bit for bit;
an empty K (SUM_K == 0) gives ``d = c``.

Kernels: DeepGEMM's FP8 TN (sm100), its flat FP8 NT (sm90), its BF16 TN (both
arches), and DeepGEMM-Ascend's FP8 / FP4 and BF16 TN with the psum layout (its NT
name transposes and calls TN).  Every kernel reads check -> tasks -> execute: a ``_check_*`` step
validates the call for the profile the dispatcher hands it and returns a :class:`KGroupedRequest`
(the K groups, each side's data and scales as a :class:`KSide`, the snapshot of ``c``),
:func:`_tasks` states the math as one task per non-empty group and a fill per empty one, and
:func:`~deepgemm_ref.executor.execute` runs them into ``d`` and the trace.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from .. import core
from .. import formats as fm
from ..api import profiled
from ..errors import DGArgumentError, arg_error
from ..executor import Fill, Request, Task, execute
from ..profiles import Profile
from ..runtime import current_mk_alignment
from ..toolkit.args import (
    BF16,
    E4M3,
    F32,
    I32,
    as_array,
    as_pair,
    bool_arg,
    ceil_div,
    check_compiled_dims,
    elem_stride,
    int32_vector,
    is_contiguous,
    ks_list,
    major_of,
    transposed,
    transposed_pair,
)
from ..toolkit.groups import KGroups, k_groups_ascend, k_groups_cuda, psum_gap_scale_blocks
from ..toolkit.operands import (
    OUT_DTYPES,
    OUT_FORMAT,
    OperandSpec,
    ab_operand,
    alpha_of,
    ascend_recipes,
    check_ascend_mix,
    recipe_arg,
    resolve_scales,
)
from ..toolkit.outputs import Inputs, check_out, input_view, snapshot_c
from ..toolkit.scales import pack_k_grouped_ue8m0, sf_values
from ..toolkit.sizes import check_matmul

__all__ = ["k_grouped_fp8_gemm_tn_contiguous", "k_grouped_fp8_gemm_nt_contiguous", "k_grouped_bf16_gemm_tn_contiguous"]


# ----------------------------------------------------------------------------------------------
# the request and its tasks
# ----------------------------------------------------------------------------------------------

@dataclass
class KSide:
    """One operand (A or B) of a k-grouped GEMM: group g's (MN, k_g) core operand of K rows [k0, k1).

    form "rows": ``data`` (SUM_K, MN), K along its rows (DeepGEMM's TN kernels); ``group_scales``
                 one float64 (MN, ceil(k_g / block)) array per group (the SFs are compact per
                 group), or None (BF16).
    form "flat": ``data`` a flat buffer holding group g as an (MN, k_g) row-major matrix at element
                 MN * k0 (DeepGEMM sm90's NT kernel); ``scales`` float64 (MN, SUM_K / block).
    form "spec": ``spec`` (MN, K) (DeepGEMM-Ascend, after the transposition: FP8, packed FP4 or
                 BF16); ``scales`` float64 (MN, ceil(K / block)) indexed by absolute K, or None.
    """

    form: Literal["rows", "flat", "spec"]
    data: np.ndarray
    mn: int
    block: int = 0
    scales: np.ndarray | None = None
    group_scales: Sequence[np.ndarray] | None = None
    spec: OperandSpec | None = None

    def group(self, g: int, k0: int, k1: int) -> core.Operand:
        """Group g's operand over the K rows [k0, k1)."""
        if self.form == "rows":
            sc = None if self.group_scales is None else self.group_scales[g]
            return core.Operand(self.data[k0:k1].T, sc, self.block)
        if self.form == "flat":
            assert self.scales is not None
            values = self.data[self.mn * k0:self.mn * k1].reshape(self.mn, k1 - k0)
            return core.Operand(values, self.scales[:, k0 // self.block:k1 // self.block], self.block)
        assert self.spec is not None
        return self.spec.operand(self.scales, self.block, k_range=(k0, k1))


@dataclass(kw_only=True)
class KGroupedRequest(Request):
    """A validated k-grouped GEMM (nothing computed or written).

    groups:     the K groups: group g's K rows [k0, k1) (``ranges``) and the K extent ``sum_k``.
    a, b:       the two sides, as each group's (M, k_g) and (N, k_g) operands (data and scales).
    c:          the snapshot of c (G, M, N) (k-grouped GEMMs require c; it may be d itself).
    out, alpha: d's format and DeepGEMM-Ascend's alpha (None: 1).
    """

    groups: KGroups
    a: KSide
    b: KSide
    c: np.ndarray
    out: fm.Format
    alpha: float | None = None


def _tasks(req: KGroupedRequest) -> list[Task | Fill]:
    """d[g] = out(alpha * sum_{k0 <= k < k1} outer(A_s[k, :], B_s[k, :]) ; c[g]): one task per group.

    An empty group (k1 == k0) keeps c[g] bit for bit (a fill, before the computed groups); an
    empty M or N computes nothing; an empty K (SUM_K == 0) writes c into d.
    """
    _, m, n = req.d.shape
    if m == 0 or n == 0:
        return []
    if req.groups.sum_k == 0:
        return [Fill((slice(None),), req.c, label="empty K: d = c")]
    fills: list[Task | Fill] = []
    tasks: list[Task | Fill] = []
    for g, (k0, k1) in enumerate(req.groups.ranges):
        if k1 <= k0:
            fills.append(Fill((g,), req.c[g], label=f"empty group {g}: d[{g}] = c[{g}]"))
        else:
            tasks.append(Task(req.a.group(g, k0, k1), req.b.group(g, k0, k1),
                              core.OutputStage(req.out, req.alpha, req.c[g]), (g,), label=f"group {g}: K [{k0}, {k1})"))
    return fills + tasks


def _launch(req: KGroupedRequest) -> None:
    execute(req, _tasks(req))


def _request(profile: Profile, func: str, dd: np.ndarray, kg: KGroups, c_val: np.ndarray, a: KSide, b: KSide,
             alpha: float | None = None) -> KGroupedRequest:
    return KGroupedRequest(func=func, profile=profile, d=dd, groups=kg, a=a, b=b, c=c_val, out=OUT_FORMAT[dd.dtype],
                           alpha=alpha)


# ----------------------------------------------------------------------------------------------
# the shared checks
# ----------------------------------------------------------------------------------------------


def _k_grouped_c(func: str, c: Any, dd: np.ndarray) -> np.ndarray:
    """c is required (both targets assert it): validated, returned as a snapshot."""
    if c is None:
        raise arg_error(func, "c", "an accumulator (k-grouped GEMMs require c; pass d itself to accumulate in place)",
                        "None")
    return snapshot_c(c, dd, func)[0]


def _cuda_k_grouped_scales(func: str, arg: str, sf: np.ndarray | None, mn: int, gl_arr: np.ndarray,
                           ks: list[int] | None, gran_k: int, k_alignment: int, psum: bool,
                           kg: KGroups) -> list[np.ndarray]:
    """sm100 k-grouped SFs -> per group float64 (mn, ceil(k_g / gran_k)) scales.

    float32 (SF_ROWS, mn), compact per group, packed by DeepGEMM's k-grouped packer (powers of
    two, contiguous, mn % 4 == 0), or already packed int32 (PACKED_ROWS, mn) contiguous.
    """
    if sf is None:
        raise arg_error(func, arg, "a scale-factor array", "None")
    if sf.ndim != 2 or sf.shape[1] != mn:
        raise arg_error(func, arg, f"a 2-D SF array (rows along K, {mn} columns)", sf)
    rows_g = [ceil_div(e - s, gran_k) for s, e in kg.ranges]
    needed = sum(ceil_div(r, 4) for r in rows_g)
    if sf.dtype == F32:
        try:
            packed = pack_k_grouped_ue8m0(sf, gl_arr, ks, gran_k, k_alignment, psum)
        except DGArgumentError as e:
            raise DGArgumentError(f"{func}: {arg}: k-grouped SF packing failed: {e}") from e
        packed = np.asarray(packed)
    elif sf.dtype == I32:
        if not is_contiguous(sf) or mn % 4 or sf.shape[0] == 0:
            raise arg_error(func, arg, "packed int32 SFs (PACKED_ROWS > 0, mn) contiguous with mn % 4 == 0", sf)
        if ks and not psum and sf.shape[0] < sum(ceil_div(k, 4 * gran_k) for k in ks):
            raise arg_error(func, arg, f"at least {sum(ceil_div(k, 4 * gran_k) for k in ks)} packed rows", sf)
        packed = sf
    else:
        raise arg_error(func, arg, "float32 (powers of two) or packed int32 UE8M0 SFs", sf)
    if packed.shape[0] < needed:
        raise arg_error(func, arg, f"SFs covering every group ({needed} packed rows of 4 K blocks)", sf)
    byte_rows = fm.unpack_ue8m0_int32(np.ascontiguousarray(packed.T))  # (mn, 4 * PACKED_ROWS)
    out = []
    p = 0
    for r in rows_g:
        out.append(fm.ue8m0_decode(byte_rows[:, 4 * p:4 * p + r]))
        p += ceil_div(r, 4)
    return out


def _fp8_args(func: str, a: Any, b: Any, d: Any, grouped_layout: Any, ks_cpu: Any
              ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray, np.ndarray | None, np.ndarray, np.ndarray,
                         list[int] | None]:
    """The operands, d, the layout and ks_cpu of DeepGEMM's FP8 k-grouped GEMMs (before the layout
    itself is checked): contiguous E4M3 data, a 3-D d (G, M, N), int32 (G,) grouped_layout."""
    A, sfa = as_pair(a, func, "a", sf_optional=True)
    B, sfb = as_pair(b, func, "b", sf_optional=True)
    dd = as_array(d, func, "d")
    if dd.ndim != 3:
        raise arg_error(func, "d", "a 3-D array (G, M, N)", dd)
    gl = int32_vector(func, "grouped_layout", grouped_layout, dd.shape[0], "one entry per group of d")
    ks = ks_list(func, ks_cpu)
    return A, sfa, B, sfb, dd, gl, ks


def _check_data(func: str, ops: tuple[tuple[str, np.ndarray], ...]) -> None:
    for name, x in ops:
        if x.dtype != E4M3:
            raise arg_error(func, f"{name}[0]", "dtype float8_e4m3fn", x)
        if not is_contiguous(x):
            raise arg_error(func, f"{name}[0]", "a contiguous array", x)


def _inputs(a: np.ndarray, sfa: np.ndarray | None, b: np.ndarray, sfb: np.ndarray | None, grouped_layout: Any,
            ks_cpu: Any) -> Inputs:
    """The arrays a k-grouped GEMM reads, for the aliasing checks of d."""
    return (("a[0]", a), ("a[1]", sfa), ("b[0]", b), ("b[1]", sfb), ("grouped_layout", input_view(grouped_layout)),
            ("ks_cpu", input_view(ks_cpu)))


def _outputs(func: str, dd: np.ndarray, c: Any, dtypes: tuple[np.dtype, ...], inputs: Inputs) -> np.ndarray:
    """d and c of a k-grouped GEMM (contiguous, d's contract; c required): the snapshot of c."""
    if not is_contiguous(dd):
        raise arg_error(func, "d", "a contiguous array", dd)
    check_out(dd, func, tuple(dd.shape), dtypes, inputs=inputs)
    c_val = _k_grouped_c(func, c, dd)
    if not is_contiguous(as_array(c, func, "c")):
        raise arg_error(func, "c", "a contiguous array", as_array(c, func, "c"))
    return c_val


def _check_group_products(func: str, kg: KGroups, m: int, n: int) -> None:
    """The largest group's (M, k_g) x (N, k_g) product within the allocation limit."""
    check_matmul(func, "a", m, n, max((k1 - k0 for k0, k1 in kg.ranges), default=0))


def _fp8_head(func: str, recipe: Any, compiled_dims: Any, use_psum_layout: Any) -> tuple[tuple[int, ...], bool]:
    """compiled_dims, recipe (the 1D1D kernel: (1, 1, gran_k)) and use_psum_layout of the FP8 kernels."""
    check_compiled_dims(func, compiled_dims)
    r3 = recipe_arg(func, "recipe", recipe, 3)
    psum = bool_arg(func, "use_psum_layout", use_psum_layout)
    if r3 is None or r3[0] != 1 or r3[1] != 1:
        raise arg_error(func, "recipe", "(1, 1, gran_k) (the 1D1D kernel)", repr(recipe))
    return r3, psum


# ----------------------------------------------------------------------------------------------
# the check steps
# ----------------------------------------------------------------------------------------------

def _check_fp8_tn_sm100(profile: Profile, func: str, a: Any, b: Any, d: Any, ks_cpu: Any, grouped_layout: Any,
                        c: Any, recipe: Any, compiled_dims: Any, use_psum_layout: Any) -> KGroupedRequest:
    """Validate DeepGEMM's FP8 TN k-grouped GEMM (sm100)."""
    r3, psum = _fp8_head(func, recipe, compiled_dims, use_psum_layout)
    gran_k = r3[2]
    if gran_k not in (32, 128):
        raise arg_error(func, "recipe", "gran_k 32 or 128", repr(recipe))
    k_alignment = current_mk_alignment(profile)
    if k_alignment <= 0 or k_alignment % 32:
        raise arg_error(func, "recipe", "a K alignment (get_mk_alignment_for_contiguous_layout()) that is a "
                        "positive multiple of 32", repr(k_alignment))
    A, sfa, B, sfb, dd, gl, ks = _fp8_args(func, a, b, d, grouped_layout, ks_cpu)
    groups, m, n = dd.shape
    _check_data(func, (("a", A), ("b", B)))
    if A.ndim != 2 or B.ndim != 2:
        raise arg_error(func, "a", "2-D (SUM_K, M) and (SUM_K, N) operands", A if A.ndim != 2 else B)
    kg = k_groups_cuda(func, gl, ks, A.shape[0], k_alignment, psum)
    if A.shape != (kg.sum_k, m) or B.shape != (kg.sum_k, n):
        raise arg_error(func, "a", f"a (SUM_K, M) = ({kg.sum_k}, {m}) and b (SUM_K, N) = ({kg.sum_k}, {n})",
                        f"{A.shape} and {B.shape}")
    _check_group_products(func, kg, m, n)
    c_val = _outputs(func, dd, c, OUT_DTYPES, _inputs(A, sfa, B, sfb, grouped_layout, ks_cpu))
    if profile.rules.k_grouped_fp8 != "tn":
        raise arg_error(func, "d", "an sm100 device (Unsupported architecture: the FP8 TN k-grouped GEMM is "
                        "sm100-only; use k_grouped_fp8_gemm_nt_contiguous on sm90)", f"profile {profile.name}")
    scales_a = scales_b = None
    if m and n and kg.sum_k:  # the early returns check no scales
        scales_a = _cuda_k_grouped_scales(func, "a[1]", sfa, m, gl.astype(np.int32), ks, gran_k, k_alignment, psum,
                                          kg)
        scales_b = _cuda_k_grouped_scales(func, "b[1]", sfb, n, gl.astype(np.int32), ks, gran_k, k_alignment, psum,
                                          kg)
    # Note: with the psum layout the kernel's MMA also consumes the gap rows
    # [end_g, align(end_g, 32)) (128 when the alignment is a multiple of 128), which the
    # contract requires to be zero; only the group's rows [start_g, end_g) are used here.
    return _request(profile, func, dd, kg, c_val, KSide("rows", A, m, gran_k, group_scales=scales_a),
                    KSide("rows", B, n, gran_k, group_scales=scales_b))


def _check_fp8_nt_sm90(profile: Profile, func: str, a: Any, b: Any, d: Any, ks_cpu: Any, grouped_layout: Any,
                       c: Any, recipe: Any, compiled_dims: Any, use_psum_layout: Any) -> KGroupedRequest:
    """Validate DeepGEMM's flat FP8 NT k-grouped GEMM (sm90)."""
    r3, psum = _fp8_head(func, recipe, compiled_dims, use_psum_layout)
    if r3 != (1, 1, 128):
        raise arg_error(func, "recipe", "(1, 1, 128)", repr(recipe))
    if psum:
        raise arg_error(func, "use_psum_layout", "False (no psum layout for the FP8 NT k-grouped GEMM)", "True")
    A, sfa, B, sfb, dd, gl, ks = _fp8_args(func, a, b, d, grouped_layout, ks_cpu)
    groups, m, n = dd.shape
    if not ks:
        raise arg_error(func, "ks_cpu", "the per-group K sizes (required by the FP8 NT k-grouped GEMM)", repr(ks_cpu))
    _check_data(func, (("a", A), ("b", B)))
    kg = k_groups_cuda(func, gl, ks, 0, 128, False)
    if A.size != kg.sum_k * m or B.size != kg.sum_k * n:
        raise arg_error(func, "a", f"flat buffers of SUM_K * M = {kg.sum_k * m} and SUM_K * N = {kg.sum_k * n} "
                        "elements", f"{A.size} and {B.size} elements")
    _check_group_products(func, kg, m, n)
    c_val = _outputs(func, dd, c, (F32,), _inputs(A, sfa, B, sfb, grouped_layout, ks_cpu))
    if profile.rules.k_grouped_fp8 != "nt":
        raise arg_error(func, "d", "an sm90 device (Unsupported architecture: the FP8 NT k-grouped GEMM is sm90-only; "
                        "use k_grouped_fp8_gemm_tn_contiguous on sm100)", f"profile {profile.name}")
    sva = svb = None
    if m and n and kg.sum_k:  # the early returns check no scales
        for name, sf, mn in (("a[1]", sfa, m), ("b[1]", sfb, n)):
            if sf is None or sf.dtype != F32 or sf.ndim != 2 or sf.shape != (mn, kg.sum_k // 128):
                raise arg_error(func, name, f"float32 SFs of shape ({mn}, SUM_K / 128 = {kg.sum_k // 128})", sf)
        sva = sf_values(sfa, m, kg.sum_k, 1, 128, func=func, arg="a[1]")
        svb = sf_values(sfb, n, kg.sum_k, 1, 128, func=func, arg="b[1]")
    # group g's A: (M, k_g) row-major at element M * prefix_k(g) of the flat buffer (likewise B)
    return _request(profile, func, dd, kg, c_val, KSide("flat", A.reshape(-1), m, 128, scales=sva),
                    KSide("flat", B.reshape(-1), n, 128, scales=svb))


def _check_bf16_cuda(profile: Profile, func: str, a: Any, b: Any, d: Any, ks_cpu: Any, grouped_layout: Any, c: Any,
                     compiled_dims: Any, use_psum_layout: Any) -> KGroupedRequest:
    """Validate DeepGEMM's BF16 k-grouped GEMM (both arches)."""
    check_compiled_dims(func, compiled_dims)
    psum = bool_arg(func, "use_psum_layout", use_psum_layout)
    A = as_array(a, func, "a")
    B = as_array(b, func, "b")
    dd = as_array(d, func, "d")
    if dd.ndim != 3:
        raise arg_error(func, "d", "a 3-D array (G, M, N)", dd)
    groups, m, n = dd.shape
    k_alignment = current_mk_alignment(profile)
    if k_alignment <= 0 or k_alignment % 32:
        raise arg_error(func, "grouped_layout", "a K alignment (get_mk_alignment_for_contiguous_layout()) that is a "
                        "positive multiple of 32", repr(k_alignment))
    gl = int32_vector(func, "grouped_layout", grouped_layout, groups, "one entry per group of d")
    ks = ks_list(func, ks_cpu)
    for name, x in (("a", A), ("b", B)):
        if x.ndim != 2 or x.dtype != BF16:
            raise arg_error(func, name, "a 2-D bfloat16 array (SUM_K, MN)", x)
        if not is_contiguous(x):
            raise arg_error(func, name, "a contiguous array", x)
    kg = k_groups_cuda(func, gl, ks, A.shape[0], k_alignment, psum)
    if A.shape != (kg.sum_k, m) or B.shape != (kg.sum_k, n):
        raise arg_error(func, "a", f"a (SUM_K, M) = ({kg.sum_k}, {m}) and b (SUM_K, N) = ({kg.sum_k}, {n})",
                        f"{A.shape} and {B.shape}")
    _check_group_products(func, kg, m, n)
    c_val = _outputs(func, dd, c, OUT_DTYPES, _inputs(A, None, B, None, grouped_layout, ks_cpu))
    rules = profile.rules
    if not rules.k_grouped_bf16_psum and (psum or not ks):
        raise arg_error(func, "use_psum_layout", f"False with ks_cpu given ({profile.name} has no psum k-grouped "
                        "kernel)", f"use_psum_layout={psum}, ks_cpu={ks_cpu!r}")
    if ks and any(k % rules.k_grouped_bf16_k_multiple for k in ks):
        raise arg_error(func, "ks_cpu", f"K sizes divisible by {rules.k_grouped_bf16_k_multiple} on {profile.name}",
                        repr(ks))
    # Note: as for the FP8 version, psum gap rows the MMA consumes are not used here.
    return _request(profile, func, dd, kg, c_val, KSide("rows", A, m), KSide("rows", B, n))


def _check_ascend(profile: Profile, func: str, a: Any, b: Any, d: Any, ks_cpu: Any, grouped_layout: Any, c: Any,
                  recipe: Any, compiled_dims: Any, use_psum_layout: Any, epilogue: Any, *,
                  fp8: bool) -> KGroupedRequest:
    """Validate DeepGEMM-Ascend's k-grouped GEMMs: a (K, M), b (K, N), psum only."""
    check_compiled_dims(func, compiled_dims)
    alignment = current_mk_alignment(profile)  # fixed: 256
    sfa = sfb = None
    if fp8:
        (A, sfa), (B, sfb) = transposed_pair(a, func, "a", (0, 1)), transposed_pair(b, func, "b", (0, 1))
    else:
        A, B = transposed(a, func, "a", (0, 1)), transposed(b, func, "b", (0, 1))
    dd = as_array(d, func, "d")
    if dd.ndim != 3:
        raise arg_error(func, "d", "a 3-D array (G, M, N)", dd)
    groups, m, n = dd.shape
    if fp8:
        sa, sb = ab_operand(A, func, "a"), ab_operand(B, func, "b")
        check_ascend_mix(func, sa, sb)
    else:
        for name, x in (("a", A), ("b", B)):
            if x.dtype != BF16:
                raise arg_error(func, name, "dtype bfloat16", x)
        sa = OperandSpec(A, major_of(A, func, "a"), False, A.shape[0], A.shape[1])
        sb = OperandSpec(B, major_of(B, func, "b"), False, B.shape[0], B.shape[1])
    k = sa.k
    # An empty K (every group empty) has no memory layout to check: d := c, as the spec says.
    if k and (sa.major != "MN" or sb.major != "MN"):
        name, x = ("a", sa.data) if sa.major != "MN" else ("b", sb.data)
        # DeepGEMM-Ascend's major_check refuses an operand whose last two strides are both 1 (a
        # C-contiguous (K, 1) operand) as having an ambiguous major axis.
        ambiguous = x.size and elem_stride(x, -1) == 1 and elem_stride(x, -2) == 1
        raise arg_error(func, name, "a (K, M) and b (K, N) row-major (MN-major after the transposition)",
                        "an operand with an ambiguous major axis (both of its last two strides 1: M or N is 1)"
                        if ambiguous else "a K-major operand")
    if (sa.mn, sb.mn, sb.k) != (m, n, k):
        raise arg_error(func, "b", f"a (K, M) = ({k}, {m}) and b (K, N) = ({k}, {n}) to match d {dd.shape}",
                        f"a {sa.data.shape[::-1]} and b {sb.data.shape[::-1]}")
    check_out(dd, func, (groups, m, n), OUT_DTYPES, inputs=_inputs(A, sfa, B, sfb, grouped_layout, ks_cpu))
    if not bool_arg(func, "use_psum_layout", use_psum_layout):
        raise arg_error(func, "use_psum_layout", "True (DeepGEMM-Ascend supports only the psum layout)", "False")
    gl = int32_vector(func, "grouped_layout", grouped_layout, groups, "psum K end offsets, one per group")
    ks = ks_list(func, ks_cpu)
    alpha = alpha_of(func, None, epilogue)
    c_val = _k_grouped_c(func, c, dd)
    # Note: the newer DeepGEMM-Ascend (787919d) asserts that c is d; the snapshot copies a
    # separate c into d first.  Both are accepted (same result).
    kg = k_groups_ascend(func, gl, ks, k, alignment)
    _check_group_products(func, kg, m, n)
    scales_a = scales_b = None
    gka = 32
    if fp8:
        ga, gka, gb, gkb = ascend_recipes(func, None, None, recipe, None, None, profile)
        if m and n and k:
            sfa_r = psum_gap_scale_blocks(sfa, gl, k, alignment)
            sfb_r = psum_gap_scale_blocks(sfb, gl, k, alignment)
            scales_a = resolve_scales(func, "a[1]", sfa_r, m, k, ga, gka, None, profile, is_b=False)
            scales_b = resolve_scales(func, "b[1]", sfb_r, n, k, gb, gkb, None, profile, is_b=True)
    # group starts are 256-aligned: whole scale blocks (no scales: BF16); both sides use gran_k_a
    return _request(profile, func, dd, kg, c_val, KSide("spec", sa.data, m, gka, scales=scales_a, spec=sa),
                    KSide("spec", sb.data, n, gka, scales=scales_b, spec=sb), alpha)


# ----------------------------------------------------------------------------------------------
# the public functions
# ----------------------------------------------------------------------------------------------

def _make_k_grouped_fp8(layout: str) -> tuple[Callable[..., None], Callable[..., None]]:
    """(DeepGEMM impl, DeepGEMM-Ascend impl) of k_grouped_fp8_gemm_{layout}_contiguous."""
    name = f"k_grouped_fp8_gemm_{layout}_contiguous"

    def cuda(profile: Profile, /, a: Any, b: Any, d: Any, ks_cpu: Any, grouped_layout: Any, c: Any = None,
             recipe: tuple[int, int, int] = (1, 1, 128), compiled_dims: str = "mn",
             use_psum_layout: bool = False) -> None:
        check = _check_fp8_nt_sm90 if layout == "nt" else _check_fp8_tn_sm100
        _launch(check(profile, name, a, b, d, ks_cpu, grouped_layout, c, recipe, compiled_dims, use_psum_layout))

    def ascend(profile: Profile, /, a: Any, b: Any, d: Any, ks_cpu: Any, grouped_layout: Any, c: Any = None,
               recipe: tuple[int, int, int] = (1, 1, 32), compiled_dims: str = "mn",
               use_psum_layout: bool = True, epilogue: Any = None) -> None:
        if layout == "nt":
            warnings.warn("Calling k_grouped_fp8_gemm_nt_contiguous is deprecated, please transpose a, b into "
                          "[k, m] and [k, n] shape and call `k_grouped_fp8_gemm_tn_contiguous` instead",
                          DeprecationWarning, stacklevel=3)
            a = transposed_pair(a, name, "a", (0, 1))
            b = transposed_pair(b, name, "b", (0, 1))
        _launch(_check_ascend(profile, name, a, b, d, ks_cpu, grouped_layout, c, recipe, compiled_dims, use_psum_layout,
                              epilogue, fp8=True))

    cuda.__name__ = cuda.__qualname__ = ascend.__name__ = ascend.__qualname__ = name
    if layout == "tn":
        cuda.__doc__ = """FP8 k-grouped GEMM (sm100): d[g] = c[g] + A_g^T @ B_g with per-channel scales along K.

    a = (A (SUM_K, M) float8_e4m3fn contiguous, sfa), b = (B (SUM_K, N), sfb): group g owns the K
    rows K_g (back to back, or [align(end[g-1], alignment), end[g]) with the psum layout).
    sfa / sfb: float32 (SF_ROWS, MN) compact per group (ceil(k_g / gran_k) rows each, powers of
    two) or packed int32 (PACKED_ROWS, MN).  recipe (1, 1, gran_k), gran_k 32 or 128.
    d, c (G, M, N) contiguous float32 (bf16 d: bf16(c + bf16(acc))); c required (may be d).
    ks_cpu / grouped_layout as in k_grouped_bf16_gemm_tn_contiguous.  Empty groups keep c[g].
    """
    else:
        cuda.__doc__ = """FP8 k-grouped GEMM (sm90): d[g] = c[g] + A_g @ B_g^T, per-128 scales on both sides.

    a, b: flat contiguous float8_e4m3fn buffers of SUM_K * M and SUM_K * N elements; group g's A
    is an (M, k_g) row-major matrix at element offset M * prefix_k(g) (likewise B).
    sfa (M, SUM_K / 128), sfb (N, SUM_K / 128) float32, any strides.  ks_cpu (required) and
    grouped_layout: the K sizes, multiples of 128.  recipe (1, 1, 128); no psum layout.
    d, c (G, M, N) float32 contiguous; c required (may be d).
    """
    ascend.__doc__ = f"""FP8/FP4 k-grouped GEMM (DeepGEMM-Ascend): d[g] = c[g] + [alpha *] A_g^T @ B_g.

    a = (A (K, M) float8_e4m3fn or packed FP4, row-major, sfa), b = (B (K, N), sfb); SFs in the
    data's orientation: float32 (ceil(K / 32), ceil(MN / gran_mn)) powers of two or int16 pairs
    (ceil(K / 64), MN), indexed by absolute K.  grouped_layout: int32 psum END offsets along K,
    group g uses rows [align(end[g-1], 256), end[g]); ks_cpu: None or the groups' K sizes.
    recipe default (1, 1, 32); d, c (G, M, N) bfloat16 or float32; c required (may be d);
    epilogue Identity() or Alpha(alpha).  Empty groups keep c[g].{
        '''
    Deprecated: transposes a and b (and their SFs) and calls k_grouped_fp8_gemm_tn_contiguous
    (a (M, K), b (N, K) here), with a DeprecationWarning.''' if layout == "nt" else ''}
    """
    return cuda, ascend


def _k_grouped_bf16_cuda(profile: Profile, /, a: Any, b: Any, d: Any, ks_cpu: Any, grouped_layout: Any,
                         c: Any = None, compiled_dims: str = "mn", use_psum_layout: bool = False) -> None:
    """BF16 k-grouped GEMM: d[g] = c[g] + A_g^T @ B_g (float32 accumulation).

    a (SUM_K, M), b (SUM_K, N) bfloat16 contiguous; d, c (G, M, N) contiguous, float32 (or
    bfloat16: bf16(c + bf16(acc))); c is required (pass d itself to accumulate in place).
    ks_cpu: per-group K sizes, multiples of get_mk_alignment_for_contiguous_layout() (a multiple
    of 32), or None / [] with use_psum_layout=True; grouped_layout int32 (G,): the same sizes, or
    psum END offsets along K (group g uses rows [align(end[g-1], alignment), end[g])).
    sm90: no psum, ks_cpu required, every K size a multiple of 128.  Empty groups keep c[g].
    """
    _launch(_check_bf16_cuda(profile, "k_grouped_bf16_gemm_tn_contiguous", a, b, d, ks_cpu, grouped_layout, c,
                             compiled_dims, use_psum_layout))


def _k_grouped_bf16_ascend(profile: Profile, /, a: Any, b: Any, d: Any, ks_cpu: Any, grouped_layout: Any,
                           c: Any = None, compiled_dims: str = "mn", use_psum_layout: bool = True,
                           epilogue: Any = None) -> None:
    """BF16 k-grouped GEMM (DeepGEMM-Ascend): d[g] = c[g] + [alpha *] A_g^T @ B_g.

    a (K, M), b (K, N) bfloat16 row-major; grouped_layout int32 psum END offsets along K (group
    g uses rows [align(end[g-1], 256), end[g])); ks_cpu None or the groups' K sizes; d, c
    (G, M, N) bfloat16 or float32, c required (may be d); epilogue Identity() or Alpha(alpha).
    """
    _launch(_check_ascend(profile, "k_grouped_bf16_gemm_tn_contiguous", a, b, d, ks_cpu, grouped_layout, c, None,
                          compiled_dims, use_psum_layout, epilogue, fp8=False))


_kg_tn_cuda, _kg_tn_ascend = _make_k_grouped_fp8("tn")
_kg_nt_cuda, _kg_nt_ascend = _make_k_grouped_fp8("nt")
k_grouped_fp8_gemm_tn_contiguous = profiled("k_grouped_fp8_gemm_tn_contiguous", deepgemm=_kg_tn_cuda,
                                            deepgemm_ascend=_kg_tn_ascend)
k_grouped_fp8_gemm_nt_contiguous = profiled("k_grouped_fp8_gemm_nt_contiguous", deepgemm=_kg_nt_cuda,
                                            deepgemm_ascend=_kg_nt_ascend)
k_grouped_bf16_gemm_tn_contiguous = profiled("k_grouped_bf16_gemm_tn_contiguous", deepgemm=_k_grouped_bf16_cuda,
                                             deepgemm_ascend=_k_grouped_bf16_ascend)
