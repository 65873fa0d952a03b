"""Dense GEMMs: FP8 / FP4 with block scales, BF16, the cuBLASLt and ACLNN reference GEMMs.

Every function is DeepGEMM's (or, under the ``ascend950`` profile, DeepGEMM-Ascend's) public
function of the same name: same parameters and defaults, output written in place into ``d``,
``None`` returned.  The math (``NT`` layout; the other layouts only transpose their inputs)::

    d[m, n] = epilogue( sum_k A[m, k] * sfa[m, k // gran_k_a] * B[n, k] * sfb[n, k // gran_k_b] )

with the epilogue's roundings (``bf16(c + bf16(acc))`` for bf16 ``d`` with ``c``,
``f32(c + acc)`` for float32 ``d`` with ``c``, one rounding otherwise) and DeepGEMM-Ascend's
``alpha`` (``f32(alpha * acc)`` before the output step).  The accumulator follows the active
accumulation model (``exact`` by default: golden values).

Shapes and dtypes (NT): ``a = (A (M, K) float8_e4m3fn or int8 packed FP4 (M, K/2), sfa)``,
``b = (B (N, K) or packed (N, K/2), sfb)``, ``d (M, N)`` bfloat16 or float32, row-major, and
``c`` ``None``, a separate (M, N) array of d's dtype, or ``d`` itself.  Scale factors are accepted
in the user form (float32 ``(ceil(MN / gran_mn), ceil(K / gran_k))``) or in the layout each
target's kernels require (DeepGEMM sm100: packed UE8M0 int32, MN-major, TMA-aligned;
DeepGEMM-Ascend: int16 UE8M0 pairs, any major).

Every function reads check -> tasks -> execute: a ``_check_*`` step validates the call for the
profile the dispatcher hands it and returns a :class:`GemmRequest` (nothing computed or written),
:func:`_tasks` states the math as executor tasks, and :func:`~deepgemm_ref.executor.execute`
runs them into ``d`` and the trace.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import core
from . import formats as fm
from .api import profiled
from .errors import arg_error
from .executor import Fill, Request, Task, execute
from .profiles import Profile
from .toolkit.args import (
    BF16,
    E4M3,
    F32,
    as_array,
    as_pair,
    ceil_div,
    check_compiled_dims,
    transposed,
    transposed_pair,
)
from .toolkit.operands import (
    OUT_DTYPES,
    OUT_FORMAT,
    OperandSpec,
    ab_operand,
    alpha_of,
    ascend_recipes,
    bf16_operands,
    check_ascend_mix,
    cuda_recipes,
    recipes,
    resolve_scales,
)
from .toolkit.outputs import check_out, check_written, resolve_c, shares_memory
from .toolkit.sizes import check_matmul

__all__ = [
    "fp8_fp4_gemm_nt", "fp8_fp4_gemm_nn", "fp8_fp4_gemm_tn", "fp8_fp4_gemm_tt",
    "fp8_gemm_nt", "fp8_gemm_nn", "fp8_gemm_tn", "fp8_gemm_tt",
    "fp8_gemm_nt_skip_head_mid",
    "bf16_gemm_nt", "bf16_gemm_nn", "bf16_gemm_tn", "bf16_gemm_tt",
    "cublaslt_gemm_nt", "cublaslt_gemm_nn", "cublaslt_gemm_tn", "cublaslt_gemm_tt",
    "aclnn_bf16_gemm_nt", "aclnn_bf16_gemm_nn", "aclnn_bf16_gemm_tn", "aclnn_bf16_gemm_tt",
    "aclnn_fp8_fp4_gemm_nt", "aclnn_fp8_fp4_gemm_nn", "aclnn_fp8_fp4_gemm_tn", "aclnn_fp8_fp4_gemm_tt",
]


# ----------------------------------------------------------------------------------------------
# the request and its tasks
# ----------------------------------------------------------------------------------------------

@dataclass(kw_only=True)
class GemmRequest(Request):
    """A validated dense GEMM ``d = out(alpha * A_s @ B_s^T ; c)`` (nothing computed or written).

    a, b:     the operands in (M, K) / (N, K) orientation (FP8, packed FP4 or unscaled BF16).
    scales:   float64 scales of every row and K block of A and B (None: unscaled), with their
              K block sizes ``gran_k``.
    output:   the output stage: format, alpha, a snapshot of c and how c is added.
    columns:  the column of ``d`` that each column of A @ B^T lands in (skip_head_mid), or None.
    old_c_to: where ACLNN's addmm leaves c's old value (the caller's ``d`` when the result goes
              into a separate ``c``), or None.
    """

    a: OperandSpec
    b: OperandSpec
    scales: tuple[np.ndarray | None, np.ndarray | None] = (None, None)
    gran_k: tuple[int, int] = (0, 0)
    output: core.OutputStage
    columns: np.ndarray | None = None
    old_c_to: np.ndarray | None = None


def _tasks(req: GemmRequest) -> list[Task | Fill]:
    """d[m, n] = out(alpha * sum_k A[m, k] sa[m, k // gka] B[n, k] sb[n, k // gkb] ; c): one task.

    An empty M or N computes nothing; an empty K writes c (or +0.0) into d, as every target's
    early return does.  skip_head_mid writes the product's columns to ``columns`` of d; ACLNN's
    addmm first leaves c's old value in the caller's d (its result goes into c).
    """
    m, n, k = req.a.mn, req.b.mn, req.a.k
    c = req.output.c
    if m == 0 or n == 0:
        return []
    if k == 0:
        return [Fill((...,), np.zeros((), req.d.dtype) if c is None else c, label="empty K: d = c")]
    a = req.a.operand(req.scales[0], req.gran_k[0])
    b = req.b.operand(req.scales[1], req.gran_k[1])
    index = (slice(None),) if req.columns is None else (slice(None), req.columns)
    tasks: list[Task | Fill] = [Task(a, b, req.output, index)]
    if req.old_c_to is not None and c is not None:
        tasks.insert(0, Fill((...,), c, into=req.old_c_to, label="addmm: d keeps c's old value"))
    return tasks


def _launch(req: GemmRequest | None) -> None:
    if req is not None:
        execute(req, _tasks(req))


def _bf16_spec(x: np.ndarray, major: str) -> OperandSpec:
    return OperandSpec(x, major, False, int(x.shape[0]), int(x.shape[1]))


def _resolve_c_early(func: str, m: int, n: int, dd: np.ndarray, c: Any) -> np.ndarray | None:
    """A snapshot of ``c`` after DeepGEMM's early-return checks (none for an empty M or N)."""
    # Note: under ascend950 a separate c is accepted (the port snapshot copies it into d); the
    # newest official DeepGEMM-Ascend asserts that c is d.  The result is the same.
    if m == 0 or n == 0:
        return None
    return resolve_c(c, dd, func)[0]


# ----------------------------------------------------------------------------------------------
# FP8 / FP4 GEMMs
# ----------------------------------------------------------------------------------------------

def _check_fp8_fp4(
    profile: Profile, func: str, a: Any, b: Any, d: Any, c: Any, recipe: Any, recipe_a: Any, recipe_b: Any,
    compiled_dims: Any, disable_ue8m0_cast: Any, alpha: Any, epilogue: Any,
) -> GemmRequest:
    """Validate an NT FP8/FP4 GEMM for ``profile`` (the other layouts are transposed views)."""
    rules = profile.rules
    check_compiled_dims(func, compiled_dims)
    A, sfa = as_pair(a, func, "a", sf_optional=True)
    B, sfb = as_pair(b, func, "b", sf_optional=True)
    dd = as_array(d, func, "d")
    alpha_f = alpha_of(func, alpha, epilogue)
    if rules.out_dtype_first and dd.dtype not in OUT_DTYPES:  # DeepGEMM-Ascend asserts d's dtype first
        raise arg_error(func, "d", "dtype bfloat16 or float32", dd)
    sa = ab_operand(A, func, "a", allowed=rules.fp8_dtypes)
    sb = ab_operand(B, func, "b", allowed=rules.fp8_dtypes)
    if rules.operand_mix:
        check_ascend_mix(func, sa, sb)
    if rules.fp8_k_major_only and (sa.major != "K" or sb.major != "K"):
        raise arg_error(func, "a" if sa.major != "K" else "b", f"K-major operands on {profile.name}",
                        f"{'a' if sa.major != 'K' else 'b'} is MN-major")
    m, k, n = sa.mn, sa.k, sb.mn
    if sb.k != k:
        raise arg_error(func, "b", f"K = {k} (from a)", f"K = {sb.k} ({B.shape} {B.dtype})")
    check_out(dd, func, (m, n), OUT_DTYPES, inputs=(("a[0]", A), ("a[1]", sfa), ("b[0]", B), ("b[1]", sfb)))
    check_matmul(func, "a", m, n, k)
    if not isinstance(disable_ue8m0_cast, (bool, np.bool_)):
        raise arg_error(func, "disable_ue8m0_cast", "a bool", repr(disable_ue8m0_cast))
    # Validate recipes and SFs before the early return touches d.
    ga, gka, gb, gkb = recipes(func, sfa, sfb, recipe, recipe_a, recipe_b, profile)
    c_arr = as_array(c, func, "c", allow_none=True)
    if c_arr is not None:
        resolve_c(c_arr, dd, func)  # validation only
    scales_a = scales_b = None
    if m and n and k:
        scales_a = resolve_scales(func, "a[1]", sfa, m, k, ga, gka, None, profile, is_b=False,
                                  disable_ue8m0_cast=bool(disable_ue8m0_cast))
        scales_b = resolve_scales(func, "b[1]", sfb, n, k, gb, gkb, None, profile, is_b=True,
                                  disable_ue8m0_cast=bool(disable_ue8m0_cast))
        if rules.fp8_1d2d:  # gran_n 1 runs the 1D1D kernel, otherwise the 1D2D one
            gran_n = gb
            if gran_n == 1 and (c_arr is None or dd.dtype != F32):
                raise arg_error(func, "d", f"float32 d with c for the {profile.name} 1D1D kernel (recipe gran_n 1)",
                                f"d {dd.dtype}, c {'given' if c_arr is not None else 'None'}")
            if gran_n != 1 and (c_arr is not None or dd.dtype != BF16):
                raise arg_error(func, "d", f"bfloat16 d without c for the {profile.name} 1D2D kernel",
                                f"d {dd.dtype}, c {'given' if c_arr is not None else 'None'}")
    c_val = _resolve_c_early(func, m, n, dd, c_arr)
    return GemmRequest(func=func, profile=profile, d=dd, defined=None, a=sa, b=sb, scales=(scales_a, scales_b),
                       gran_k=(gka, gkb), output=core.OutputStage(OUT_FORMAT[dd.dtype], alpha_f, c_val))


def _make_fp8_fp4_variant(layout: str, cuda: bool) -> Callable[..., None]:
    """One of fp8_fp4_gemm_{nt,nn,tn,tt} for DeepGEMM (cuda=True) or DeepGEMM-Ascend."""
    # Note: the DeepGEMM variants also take DeepGEMM-Ascend's trailing alpha=None, epilogue=None.
    name = f"fp8_fp4_gemm_{layout}"
    cd = "nk" if layout in ("nt", "nn") else "mn"

    def impl(profile: Profile, /, a: Any, b: Any, d: Any, c: Any = None, recipe: Any = None, recipe_a: Any = None,
             recipe_b: Any = None, compiled_dims: str = cd, disable_ue8m0_cast: bool = False,
             alpha: float | None = None, epilogue: Any = None) -> None:
        if layout[0] == "t":
            a = transposed_pair(a, name, "a", (0, 1))
        if layout[1] == "n":
            b = transposed_pair(b, name, "b", (0, 1))
        _launch(_check_fp8_fp4(profile, name, a, b, d, c, recipe, recipe_a, recipe_b, compiled_dims,
                               disable_ue8m0_cast, alpha, epilogue))

    impl.__name__ = impl.__qualname__ = name
    impl.__doc__ = (
        f"D = C + A @ B^T with FP8 (E4M3) or packed-FP4 operands and per-block scales ({layout.upper()} layout).\n\n"
        "    a = (A, sfa), b = (B, sfb); see the module docstring for shapes, dtypes and the math.\n"
        "    " + ("A is given as (K, M). " if layout[0] == "t" else "A is (M, K). ")
        + ("B is given as (K, N)." if layout[1] == "n" else "B is (N, K).") + "\n"
        "    d (M, N) bfloat16 or float32 is written in place; c is None, an (M, N) array or d itself.\n"
        + ("    alpha and epilogue are DeepGEMM-Ascend's trailing parameters, also accepted here.\n" if cuda else "")
    )
    return impl


def _profiled_fp8(layout: str) -> Any:
    return profiled(f"fp8_fp4_gemm_{layout}", deepgemm=_make_fp8_fp4_variant(layout, True),
                    deepgemm_ascend=_make_fp8_fp4_variant(layout, False))


fp8_fp4_gemm_nt = _profiled_fp8("nt")
fp8_fp4_gemm_nn = _profiled_fp8("nn")
fp8_fp4_gemm_tn = _profiled_fp8("tn")
fp8_fp4_gemm_tt = _profiled_fp8("tt")
# DeepGEMM registers the FP8 names as the same Python objects; here they are aliases sharing the
# implementations (ProfiledFunction.alias), so an argument error names the function called.
fp8_gemm_nt = fp8_fp4_gemm_nt.alias("fp8_gemm_nt")
fp8_gemm_nn = fp8_fp4_gemm_nn.alias("fp8_gemm_nn")
fp8_gemm_tn = fp8_fp4_gemm_tn.alias("fp8_gemm_tn")
fp8_gemm_tt = fp8_fp4_gemm_tt.alias("fp8_gemm_tt")


def _check_skip_head_mid(profile: Profile, func: str, a: Any, b: Any, d: Any, head_splits: Any, recipe: Any,
                         compiled_dims: Any, disable_ue8m0_cast: Any) -> GemmRequest:
    """Validate fp8_gemm_nt_skip_head_mid; the request's ``columns`` place G's columns in d."""
    check_compiled_dims(func, compiled_dims)
    if not (isinstance(head_splits, (tuple, list)) and len(head_splits) == 3
            and all(isinstance(v, (int, np.integer)) and v >= 0 for v in head_splits)):
        raise arg_error(func, "head_splits", "a (left, mid, right) tuple of non-negative ints", repr(head_splits))
    left, mid, right = (int(v) for v in head_splits)
    A, sfa = as_pair(a, func, "a")
    B, sfb = as_pair(b, func, "b")
    dd = as_array(d, func, "d")
    sa = ab_operand(A, func, "a", allowed=(E4M3,))
    sb = ab_operand(B, func, "b", allowed=(E4M3,))
    if profile.rules.fp8_k_major_only and (sa.major != "K" or sb.major != "K"):
        raise arg_error(func, "a", f"K-major operands on {profile.name}", "an MN-major operand")
    m, k, n = sa.mn, sa.k, sb.mn
    if sb.k != k:
        raise arg_error(func, "b", f"K = {k} (from a)", B)
    if left + right == 0 or n % (left + right):
        raise arg_error(func, "head_splits", f"left + right dividing N = {n}", repr(head_splits))
    heads = n // (left + right)
    out_dtypes = (BF16,) if profile.rules.fp8_1d2d else OUT_DTYPES  # the 1D2D kernel writes bf16
    check_out(dd, func, (m, n + heads * mid), out_dtypes,
              inputs=(("a[0]", A), ("a[1]", sfa), ("b[0]", B), ("b[1]", sfb)))
    check_matmul(func, "a", m, n, k)
    if n == 0 or k == 0:
        raise arg_error(func, "b", "N > 0 and K > 0", B)
    ga, gka, gb, gkb = cuda_recipes(func, sfa, sfb, recipe, None, None, profile)
    if gka != 128 or gkb != 128:
        raise arg_error(func, "recipe", "gran_k 128 for both SFs", f"({gka}, {gkb})")
    if profile.rules.fp8_1d2d and gb == 1:
        raise arg_error(func, "recipe", f"the 1D2D recipe (gran_n != 1) on {profile.name}", repr(recipe))
    scales_a = resolve_scales(func, "a[1]", sfa, m, k, ga, gka, None, profile, is_b=False,
                              disable_ue8m0_cast=bool(disable_ue8m0_cast))
    scales_b = resolve_scales(func, "b[1]", sfb, n, k, gb, gkb, None, profile, is_b=True,
                              disable_ue8m0_cast=bool(disable_ue8m0_cast))
    cols = np.arange(n)
    columns = cols + (cols + right) // (left + right) * mid

    def defined() -> np.ndarray:  # the mid columns of every head are not written
        mask = np.zeros(dd.shape, bool)
        mask[:, columns] = True
        return mask

    return GemmRequest(func=func, profile=profile, d=dd, defined=defined, a=sa, b=sb, scales=(scales_a, scales_b),
                       gran_k=(gka, gkb), output=core.OutputStage(OUT_FORMAT[dd.dtype]), columns=columns)


def _fp8_gemm_nt_skip_head_mid(profile: Profile, /, a: Any, b: Any, d: Any, head_splits: Any, recipe: Any = None,
                               compiled_dims: str = "nk", disable_ue8m0_cast: bool = False) -> None:
    """G = A @ B^T (FP8 x FP8, per-128 K scales), written to d skipping each head's middle columns.

    a = (A (M, K) e4m3, sfa), b = (B (N, K) e4m3, sfb), head_splits = (left, mid, right) with
    N divisible by left + right; d (M, N + heads * mid) bfloat16 (sm90) or bfloat16/float32.
    Column n of G goes to column n + floor((n + right) / (left + right)) * mid; the mid columns
    of every head are not written.
    """
    _launch(_check_skip_head_mid(profile, "fp8_gemm_nt_skip_head_mid", a, b, d, head_splits, recipe, compiled_dims,
                                 disable_ue8m0_cast))


fp8_gemm_nt_skip_head_mid = profiled(
    "fp8_gemm_nt_skip_head_mid", {"deepgemm-ascend": "DeepGEMM-Ascend does not export it"},
    deepgemm=_fp8_gemm_nt_skip_head_mid,
)


# ----------------------------------------------------------------------------------------------
# BF16 GEMMs
# ----------------------------------------------------------------------------------------------

def _check_bf16(profile: Profile, func: str, a: Any, b: Any, d: Any, c: Any, compiled_dims: Any, alpha: Any,
                epilogue: Any, *, dtypes: tuple[np.dtype, ...] = (BF16,), c_mode: str = "kernel",
                c_written: bool = False) -> GemmRequest:
    """Validate a BF16 (or unscaled) NT GEMM.  ``c_written``: a separate ``c`` is also written
    (ACLNN's in-place addmm), so it is checked as an output."""
    check_compiled_dims(func, compiled_dims)
    A = as_array(a, func, "a")
    B = as_array(b, func, "b")
    dd = as_array(d, func, "d")
    major_a, major_b = bf16_operands(func, (("a", A, 2), ("b", B, 2)), dtypes)
    if A.dtype != B.dtype:
        raise arg_error(func, "b", f"dtype {A.dtype} (a's dtype)", B)
    alpha_f = alpha_of(func, alpha, epilogue)
    m, k = A.shape
    n, k2 = B.shape
    if k2 != k:
        raise arg_error(func, "b", f"shape (N, {k}) to match a", B)
    check_out(dd, func, (m, n), OUT_DTYPES, inputs=(("a", A), ("b", B)))
    check_matmul(func, "a", m, n, k)
    if c_written and c is not None:
        ca = as_array(c, func, "c")
        if not shares_memory(ca, dd):  # c is d is in-place; any other overlap is refused with c's checks
            check_written(ca, func, "c", inputs=(("a", A), ("b", B)))
    c_val = _resolve_c_early(func, m, n, dd, c)
    return GemmRequest(func=func, profile=profile, d=dd, defined=None, a=_bf16_spec(A, major_a),
                       b=_bf16_spec(B, major_b), output=core.OutputStage(OUT_FORMAT[dd.dtype], alpha_f, c_val, c_mode))


def _make_bf16_variant(layout: str, cuda: bool) -> Callable[..., None]:
    # Note: the DeepGEMM variants also take DeepGEMM-Ascend's trailing alpha=None, epilogue=None.
    name = f"bf16_gemm_{layout}"
    cd = "nk" if layout in ("nt", "nn") else "mn"

    def impl(profile: Profile, /, a: Any, b: Any, d: Any, c: Any = None, compiled_dims: str = cd,
             alpha: float | None = None, epilogue: Any = None) -> None:
        a2 = transposed(a, name, "a", (0, 1)) if layout[0] == "t" else a
        b2 = transposed(b, name, "b", (0, 1)) if layout[1] == "n" else b
        _launch(_check_bf16(profile, name, a2, b2, d, c, compiled_dims, alpha, epilogue))

    impl.__name__ = impl.__qualname__ = name
    impl.__doc__ = (
        f"D = C + A @ B^T with bfloat16 operands and float32 accumulation ({layout.upper()} layout).\n\n"
        "    " + ("a (K, M)" if layout[0] == "t" else "a (M, K)") + " and "
        + ("b (K, N)" if layout[1] == "n" else "b (N, K)") + " bfloat16, any major; d (M, N) bfloat16 or\n"
        "    float32 row-major, written in place; c None, an (M, N) array of d's dtype, or d itself.\n"
        "    bf16 d with c: bf16(c + bf16(acc)); float32 d with c: f32(c + acc); alpha: f32(alpha * acc) first.\n"
        + ("    alpha and epilogue are DeepGEMM-Ascend's trailing parameters, also accepted here.\n" if cuda else "")
    )
    return impl


def _profiled_bf16(layout: str) -> Any:
    return profiled(f"bf16_gemm_{layout}", deepgemm=_make_bf16_variant(layout, True),
                    deepgemm_ascend=_make_bf16_variant(layout, False))


bf16_gemm_nt = _profiled_bf16("nt")
bf16_gemm_nn = _profiled_bf16("nn")
bf16_gemm_tn = _profiled_bf16("tn")
bf16_gemm_tt = _profiled_bf16("tt")


# ----------------------------------------------------------------------------------------------
# cuBLASLt (DeepGEMM) and ACLNN (DeepGEMM-Ascend) reference GEMMs
# ----------------------------------------------------------------------------------------------

def _make_cublaslt(layout: str) -> Callable[..., None]:
    name = f"cublaslt_gemm_{layout}"

    def impl(profile: Profile, /, a: Any, b: Any, d: Any, c: Any = None) -> None:
        a2 = transposed(a, name, "a", (0, 1)) if layout[0] == "t" else a
        b2 = transposed(b, name, "b", (0, 1)) if layout[1] == "n" else b
        # cuBLASLt's FP32 epilogue adds C once: out(acc + C) with a single rounding.  FP8 inputs
        # are unscaled (DeepGEMM's tests call it with raw FP8 data for timing).
        # Note: float32 inputs are rejected: cuBLASLt computes them in TF32, not emulated here.
        _launch(_check_bf16(profile, name, a2, b2, d, c, "", None, None, dtypes=(BF16, E4M3), c_mode="fused"))

    impl.__name__ = impl.__qualname__ = name
    impl.__doc__ = (
        f"cuBLASLt's D = A @ B^T + C ({layout.upper()} layout): bfloat16 or unscaled float8_e4m3fn operands,\n"
        "    float32 accumulation, d (M, N) bfloat16 or float32; with c the sum acc + c is rounded once."
    )
    return impl


def _check_aclnn_bf16(profile: Profile, func: str, a: Any, b: Any, d: Any, c: Any) -> GemmRequest:
    """Validate ACLNN's bf16 matmul; with a separate ``c`` the result goes into ``c`` and ``d``
    keeps c's old value (DeepGEMM-Ascend copies c into d, then runs aclnnInplaceAddmm on c; its
    tests always pass c = d)."""
    req = _check_bf16(profile, func, a, b, d, c, "", None, None, c_mode="fused", c_written=True)
    if c is not None and req.output.c is not None:
        ca = as_array(c, func, "c")
        if not np.shares_memory(ca, req.d):
            req.old_c_to, req.d = req.d, ca
    return req


def _make_aclnn_bf16(layout: str) -> Callable[..., None]:
    name = f"aclnn_bf16_gemm_{layout}"

    def impl(profile: Profile, /, a: Any, b: Any, d: Any, c: Any = None) -> None:
        a2 = transposed(a, name, "a", (0, 1)) if layout[0] == "t" else a
        b2 = transposed(b, name, "b", (0, 1)) if layout[1] == "n" else b
        _launch(_check_aclnn_bf16(profile, name, a2, b2, d, c))

    impl.__name__ = impl.__qualname__ = name
    impl.__doc__ = (
        f"ACLNN's bf16 matmul ({layout.upper()} layout): d = a @ b^T, or with c the in-place addmm\n"
        "    c + a @ b^T rounded once (into c; d receives c's old value when c is not d)."
    )
    return impl


def _aclnn_fp8_bytes(func: str, arg: str, sf: np.ndarray | None, mn: int, k: int) -> np.ndarray:
    """ACLNN's MX scales: float32 (exponent byte, floored), float8_e8m0fnu or uint8, (mn, ceil(k/32))."""
    if sf is None:
        raise arg_error(func, arg, "a scale-factor array", "None")
    if sf.dtype == np.int16:
        raise arg_error(func, arg, "float32, float8_e8m0fnu or uint8 scales (unsupported ACLNN scale factor "
                        "dtype int16)", sf)
    want = (mn, ceil_div(k, 32))
    if sf.ndim != 2 or tuple(sf.shape) != want:
        raise arg_error(func, arg, f"shape {want} = (mn, ceil(k / 32))", sf)
    if sf.dtype == F32:
        bits = sf.view(np.uint32)  # shape checked above; a view with any strides
        if np.any(bits >> np.uint32(31)):
            raise arg_error(func, arg, "non-negative float32 scales", sf)
        # The port floors a non-power-of-two float32 scale to its exponent byte (no check).
        return (bits >> np.uint32(23)).astype(np.uint8)
    if sf.dtype.itemsize == 1 and sf.dtype.kind in "uV" or str(sf.dtype) == "float8_e8m0fnu":
        return sf.view(np.uint8)
    raise arg_error(func, arg, "float32, float8_e8m0fnu or uint8 scales", sf)


def _check_aclnn_fp8(profile: Profile, func: str, a: Any, b: Any, d: Any, c: Any, recipe: Any, recipe_a: Any,
                     recipe_b: Any) -> GemmRequest:
    """Validate ACLNN's MX quantised matmul (aclnnQuantMatmulV5)."""
    A, sfa = as_pair(a, func, "a")
    B, sfb = as_pair(b, func, "b")
    dd = as_array(d, func, "d")
    sa, sb = ab_operand(A, func, "a"), ab_operand(B, func, "b")
    if sa.is_fp4 and not sb.is_fp4:
        raise arg_error(func, "a", "FP8 x FP8, FP4 x FP4 or FP8 (A) x FP4 (B) (aclnnQuantMatmulV5)", "FP4 A, FP8 B")
    if not sa.is_fp4 and sb.is_fp4:
        if sa.major != "K" or sb.major != "K":
            raise arg_error(func, "b", "K-major A and B for FP8 x FP4", "an MN-major operand")
        if dd.dtype != BF16:
            raise arg_error(func, "d", "bfloat16 d for FP8 x FP4", dd)
    m, k, n = sa.mn, sa.k, sb.mn
    if sb.k != k:
        raise arg_error(func, "b", f"K = {k} (from a)", B)
    check_out(dd, func, (m, n), OUT_DTYPES, inputs=(("a[0]", A), ("a[1]", sfa), ("b[0]", B), ("b[1]", sfb)))
    check_matmul(func, "a", m, n, k)
    if k % 64:
        raise arg_error(func, "a", "K divisible by 64", f"K = {k}")
    ga, gka, gb, gkb = ascend_recipes(func, None, None, recipe, recipe_a, recipe_b, profile)
    if (ga, gka, gb, gkb) != (1, 32, 1, 32):
        raise arg_error(func, "recipe", "(1, 1, 32): the only group size ACLNN accepts", repr(recipe))
    bytes_a = _aclnn_fp8_bytes(func, "a[1]", sfa, m, k)
    bytes_b = _aclnn_fp8_bytes(func, "b[1]", sfb, n, k)
    c_val = _resolve_c_early(func, m, n, dd, as_array(c, func, "c", allow_none=True))
    return GemmRequest(func=func, profile=profile, d=dd, defined=None, a=sa, b=sb,
                       scales=(fm.ue8m0_decode(bytes_a), fm.ue8m0_decode(bytes_b)), gran_k=(32, 32),
                       output=core.OutputStage(OUT_FORMAT[dd.dtype], None, c_val, "rounded"))


def _make_aclnn_fp8(layout: str) -> Callable[..., None]:
    name = f"aclnn_fp8_fp4_gemm_{layout}"

    def impl(profile: Profile, /, a: Any, b: Any, d: Any, c: Any = None, recipe: Any = None, recipe_a: Any = None,
             recipe_b: Any = None, disable_ue8m0_cast: bool = False) -> None:
        if layout[0] == "t":
            a = transposed_pair(a, name, "a", (0, 1))
        if layout[1] == "n":
            b = transposed_pair(b, name, "b", (0, 1))
        _launch(_check_aclnn_fp8(profile, name, a, b, d, c, recipe, recipe_a, recipe_b))

    impl.__name__ = impl.__qualname__ = name
    impl.__doc__ = (
        f"ACLNN's MX quantised matmul ({layout.upper()} layout; aclnnQuantMatmulV5), the port's cross-check.\n\n"
        "    a = (A, sfa), b = (B, sfb): E4M3 or packed FP4 with per-32 UE8M0 scales given as float32 (exponent\n"
        "    byte taken, floored), float8_e8m0fnu or uint8 of shape (mn, ceil(k / 32)); K % 64 == 0; with c the\n"
        "    product is stored in d's dtype, then added: out(c + out(acc)).  disable_ue8m0_cast is ignored."
    )
    return impl


_ACLNN_MISSING = {"deepgemm": "ACLNN reference GEMMs exist only in DeepGEMM-Ascend"}
for _layout in ("nt", "nn", "tn", "tt"):
    _aclnn_bf16 = _make_aclnn_bf16(_layout)
    globals()[f"aclnn_bf16_gemm_{_layout}"] = profiled(
        f"aclnn_bf16_gemm_{_layout}", _ACLNN_MISSING, deepgemm_ascend=_aclnn_bf16)
    # Note: in DeepGEMM-Ascend cublaslt_gemm_* *is* aclnn_bf16_gemm_* (one object); here both names
    # dispatch on the profile, so under ascend950 they run the same implementation but `is` is False.
    globals()[f"cublaslt_gemm_{_layout}"] = profiled(
        f"cublaslt_gemm_{_layout}", deepgemm=_make_cublaslt(_layout), deepgemm_ascend=_aclnn_bf16)
    globals()[f"aclnn_fp8_fp4_gemm_{_layout}"] = profiled(
        f"aclnn_fp8_fp4_gemm_{_layout}", _ACLNN_MISSING, deepgemm_ascend=_make_aclnn_fp8(_layout))

# Explicit names for type checkers and readers (the loop above defines them).
aclnn_bf16_gemm_nt: Any = globals()["aclnn_bf16_gemm_nt"]
aclnn_bf16_gemm_nn: Any = globals()["aclnn_bf16_gemm_nn"]
aclnn_bf16_gemm_tn: Any = globals()["aclnn_bf16_gemm_tn"]
aclnn_bf16_gemm_tt: Any = globals()["aclnn_bf16_gemm_tt"]
cublaslt_gemm_nt: Any = globals()["cublaslt_gemm_nt"]
cublaslt_gemm_nn: Any = globals()["cublaslt_gemm_nn"]
cublaslt_gemm_tn: Any = globals()["cublaslt_gemm_tn"]
cublaslt_gemm_tt: Any = globals()["cublaslt_gemm_tt"]
aclnn_fp8_fp4_gemm_nt: Any = globals()["aclnn_fp8_fp4_gemm_nt"]
aclnn_fp8_fp4_gemm_nn: Any = globals()["aclnn_fp8_fp4_gemm_nn"]
aclnn_fp8_fp4_gemm_tn: Any = globals()["aclnn_fp8_fp4_gemm_tn"]
aclnn_fp8_fp4_gemm_tt: Any = globals()["aclnn_fp8_fp4_gemm_tt"]
