"""m-grouped masked GEMMs (DeepGEMM only): FP8 / FP4 and BF16.

For every group g and row r < masked_m[g]::

    d[g, r] = bf16( A[g, r] @ B[g]^T )      (FP8 / FP4: with the block scales of fp8_fp4_gemm_nt)

Every kernel reads check -> tasks -> execute: ``_check_fp8`` / ``_check_bf16`` validate the call
(masked row counts: :func:`deepgemm_ref.layout.masked_rows`) and return a :class:`MaskedRequest`,
:func:`_tasks` states the math as one task per non-empty group, and
:func:`~deepgemm_ref.executor.execute` runs them into ``d`` and the trace.  Rows past
``masked_m[g]`` keep the caller's values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import core
from .. import formats as fm
from ..api import profiled
from ..errors import arg_error
from ..executor import Fill, Request, Task, execute
from ..profiles import Profile
from ..toolkit.args import BF16, as_array, as_pair, bool_arg, check_compiled_dims, int32_vector
from ..toolkit.groups import masked_rows
from ..toolkit.operands import OperandSpec, ab_operand, bf16_operands, cuda_recipes, resolve_scales
from ..toolkit.outputs import check_out, input_view
from ..toolkit.sizes import check_matmul, size_arg

__all__ = [
    "m_grouped_fp8_fp4_gemm_nt_masked", "m_grouped_fp8_gemm_nt_masked", "fp8_m_grouped_gemm_nt_masked",
    "m_grouped_bf16_gemm_nt_masked", "bf16_m_grouped_gemm_nt_masked",
]


@dataclass(kw_only=True)
class MaskedRequest(Request):
    """A validated m-grouped masked GEMM (nothing computed or written).

    masked_m: int64 (G,) valid rows per group (the request's ``defined``: rows r < masked_m[g]).
    a, b:     A (G, MAX_M, K) and B (G, N, K) (FP8, packed FP4 or unscaled BF16).
    scales:   float64 scales of every group's rows and K blocks of A and B (None: unscaled), with
              their K block sizes ``gran_k``.
    output:   the output stage (bfloat16 d).
    """

    masked_m: np.ndarray
    a: OperandSpec
    b: OperandSpec
    scales: tuple[np.ndarray | None, np.ndarray | None] = (None, None)
    gran_k: tuple[int, int] = (0, 0)
    output: core.OutputStage


def _tasks(req: MaskedRequest) -> list[Task | Fill]:
    """d[g, :masked_m[g]] = bf16(A_s[g, :masked_m[g]] @ B_s[g]^T): one task per non-empty group.

    Rows past masked_m[g] are not written.
    """
    # Note: the kernels also store A_row @ B_g^T (sm90 FP8: zeros per 64-row chunk) into the
    # padding rows of each group's last visited block; here every row past masked_m[g] keeps
    # the caller's value (the block size is a heuristic, so those rows are left untouched).
    tasks: list[Task | Fill] = []
    for g, rows in enumerate(req.masked_m.tolist()):
        if rows:
            a_op = req.a.operand(req.scales[0], req.gran_k[0], group=g, rows=(0, rows))
            b_op = req.b.operand(req.scales[1], req.gran_k[1], group=g)
            tasks.append(Task(a_op, b_op, req.output, (g, slice(0, rows)), label=f"group {g}: d[{g}, :{rows}]"))
    return tasks


def _masked_common(func: str, masked_m: Any, expected_m: Any, groups: int, max_m: int) -> np.ndarray:
    mm = int32_vector(func, "masked_m", masked_m, groups, "valid rows, one per group")
    size_arg(func, "expected_m", expected_m, minimum=1)
    return masked_rows(func, mm, max_m)


def _request(profile: Profile, func: str, dd: np.ndarray, mm: np.ndarray, sa: OperandSpec, sb: OperandSpec,
             scales: tuple[np.ndarray | None, np.ndarray | None] = (None, None),
             gran_k: tuple[int, int] = (0, 0)) -> MaskedRequest:
    """The request: the defined rows of every group are its first masked_m[g]."""
    defined = np.arange(dd.shape[1])[None, :] < mm[:, None]
    return MaskedRequest(func=func, profile=profile, d=dd, defined=defined, masked_m=mm, a=sa, b=sb, scales=scales,
                         gran_k=gran_k, output=core.OutputStage(fm.BF16))


def _check_fp8(profile: Profile, func: str, a: Any, b: Any, d: Any, masked_m: Any, expected_m: Any, recipe: Any,
               recipe_a: Any, recipe_b: Any, compiled_dims: Any, disable_ue8m0_cast: Any) -> MaskedRequest:
    """Validate an FP8/FP4 m-grouped masked GEMM."""
    check_compiled_dims(func, compiled_dims)
    A, sfa = as_pair(a, func, "a", sf_optional=True)
    B, sfb = as_pair(b, func, "b", sf_optional=True)
    dd = as_array(d, func, "d")
    allowed = profile.rules.fp8_dtypes
    sa = ab_operand(A, func, "a", grouped=True, allowed=allowed)
    sb = ab_operand(B, func, "b", grouped=True, allowed=allowed)
    if sa.major != "K" or sb.major != "K":
        raise arg_error(func, "a" if sa.major != "K" else "b", "K-major A and B", "an MN-major operand")
    groups, max_m, k = int(sa.groups or 0), sa.mn, sa.k
    if sb.groups != groups or sb.k != k:
        raise arg_error(func, "b", f"shape (G, N, K) with G = {groups}, K = {k} (from a)", B)
    n = sb.mn
    check_out(dd, func, (groups, max_m, n), (BF16,), inputs=(("a[0]", A), ("a[1]", sfa), ("b[0]", B), ("b[1]", sfb),
              ("masked_m", input_view(masked_m))))
    if min(groups, max_m, n, k) <= 0:
        raise arg_error(func, "a", "G, MAX_M, N and K all > 0", A)
    disable = bool_arg(func, "disable_ue8m0_cast", disable_ue8m0_cast)
    mm = _masked_common(func, masked_m, expected_m, groups, max_m)
    check_matmul(func, "a", int(mm.max()), n, k)
    ga, gka, gb, gkb = cuda_recipes(func, sfa, sfb, recipe, recipe_a, recipe_b, profile)
    if profile.rules.fp8_1d2d and gb == 1:
        # Note: sm90's masked kernel is 1D2D only (see m_grouped_fp8_fp4_gemm_nt_contiguous).
        raise arg_error(func, "recipe", f"a per-block SFB (gran_n 128) for {profile.name}'s 1D2D grouped kernels",
                        f"gran_n {gb}")
    scales_a = resolve_scales(func, "a[1]", sfa, max_m, k, ga, gka, groups, profile, is_b=False,
                              disable_ue8m0_cast=disable)
    scales_b = resolve_scales(func, "b[1]", sfb, n, k, gb, gkb, groups, profile, is_b=True,
                              disable_ue8m0_cast=disable)
    return _request(profile, func, dd, mm, sa, sb, (scales_a, scales_b), (gka, gkb))


def _check_bf16(profile: Profile, func: str, a: Any, b: Any, d: Any, masked_m: Any, expected_m: Any,
                compiled_dims: Any) -> MaskedRequest:
    """Validate a BF16 m-grouped masked GEMM."""
    check_compiled_dims(func, compiled_dims)
    A = as_array(a, func, "a")
    B = as_array(b, func, "b")
    dd = as_array(d, func, "d")
    for name, major in zip("ab", bf16_operands(func, (("a", A, 3), ("b", B, 3))), strict=True):
        if major != "K":
            raise arg_error(func, name, "K-major A and B", "an MN-major operand")
    groups, max_m, k = A.shape
    if B.shape[0] != groups or B.shape[2] != k:
        raise arg_error(func, "b", f"shape (G, N, K) with G = {groups}, K = {k} (from a)", B)
    n = B.shape[1]
    check_out(dd, func, (groups, max_m, n), (BF16,), inputs=(("a", A), ("b", B), ("masked_m", input_view(masked_m))))
    if min(groups, max_m, n, k) <= 0:
        raise arg_error(func, "a", "G, MAX_M, N and K all > 0", A)
    if k % profile.rules.bf16_k_multiple:
        raise arg_error(func, "a", f"K divisible by {profile.rules.bf16_k_multiple} on {profile.name}", f"K = {k}")
    mm = _masked_common(func, masked_m, expected_m, groups, max_m)
    check_matmul(func, "a", int(mm.max()), n, k)
    return _request(profile, func, dd, mm, OperandSpec(A, "K", False, max_m, k, groups),
                    OperandSpec(B, "K", False, n, k, groups))


def _launch(req: MaskedRequest) -> None:
    execute(req, _tasks(req))


def _m_grouped_fp8_masked(profile: Profile, /, a: Any, b: Any, d: Any, masked_m: Any, expected_m: int,
                          recipe: Any = None, recipe_a: Any = None, recipe_b: Any = None, compiled_dims: str = "nk",
                          disable_ue8m0_cast: bool = False) -> None:
    """FP8/FP4 m-grouped masked GEMM: d[g, r] = bf16(A[g, r] @ B[g]^T) for r < masked_m[g].

    a = (A (G, MAX_M, K) float8_e4m3fn or int8 packed FP4 (G, MAX_M, K/2), sfa (G, ...)),
    b = (B (G, N, K) or packed FP4, sfb (G, ...)), both K-major; d (G, MAX_M, N) bfloat16.
    masked_m: int32 contiguous (G,), 0 <= masked_m[g] <= MAX_M; expected_m: a positive int (a
    scheduling hint).  Scales and math as fp8_fp4_gemm_nt.  Rows r >= masked_m[g] are left
    untouched (the kernels leave them unspecified).  SFA rows past masked_m are validated like
    the others (DeepGEMM's packer reads them; its test zeroes them).
    """
    _launch(_check_fp8(profile, "m_grouped_fp8_fp4_gemm_nt_masked", a, b, d, masked_m, expected_m, recipe, recipe_a,
                       recipe_b, compiled_dims, disable_ue8m0_cast))


def _m_grouped_bf16_masked(profile: Profile, /, a: Any, b: Any, d: Any, masked_m: Any, expected_m: int,
                           compiled_dims: str = "nk") -> None:
    """BF16 m-grouped masked GEMM: d[g, r] = bf16(A[g, r] @ B[g]^T) for r < masked_m[g].

    a (G, MAX_M, K) and b (G, N, K) bfloat16, both K-major (sm90: K % 64 == 0); d (G, MAX_M, N)
    bfloat16; masked_m int32 contiguous (G,), 0 <= masked_m[g] <= MAX_M; expected_m > 0 (a
    hint).  float32 accumulation, one rounding.  Rows r >= masked_m[g] are left untouched.
    """
    _launch(_check_bf16(profile, "m_grouped_bf16_gemm_nt_masked", a, b, d, masked_m, expected_m, compiled_dims))


_MASKED_MISSING = {"deepgemm-ascend": "DeepGEMM-Ascend provides no masked grouped GEMM"}
m_grouped_fp8_fp4_gemm_nt_masked = profiled("m_grouped_fp8_fp4_gemm_nt_masked", _MASKED_MISSING,
                                            deepgemm=_m_grouped_fp8_masked)
# DeepGEMM registers the FP8 name as the same object (here an alias sharing the implementations,
# ProfiledFunction.alias); the fp8_m_grouped / bf16_m_grouped names are its legacy Python aliases.
m_grouped_fp8_gemm_nt_masked = m_grouped_fp8_fp4_gemm_nt_masked.alias("m_grouped_fp8_gemm_nt_masked")
fp8_m_grouped_gemm_nt_masked = m_grouped_fp8_fp4_gemm_nt_masked.alias("fp8_m_grouped_gemm_nt_masked")
m_grouped_bf16_gemm_nt_masked = profiled("m_grouped_bf16_gemm_nt_masked", _MASKED_MISSING,
                                         deepgemm=_m_grouped_bf16_masked)
bf16_m_grouped_gemm_nt_masked = m_grouped_bf16_gemm_nt_masked.alias("bf16_m_grouped_gemm_nt_masked")
