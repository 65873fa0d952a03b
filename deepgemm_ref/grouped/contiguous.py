"""m-grouped contiguous GEMMs: the m_indices and psum layouts, FP8 / FP4 and BF16, both targets.

For every row r of a group g (the layout parsers of :mod:`deepgemm_ref.layout.groups`)::

    d[r, :] = out( alpha * sum_k A[r, k] sa[r, k // ga] * B[g][:, k] sb[g][:, k // gb] )

(BF16: no scales; ``alpha``: DeepGEMM-Ascend's ``Alpha`` epilogue, else 1.)  Every kernel reads
check -> tasks -> execute: ``_check_fp8`` / ``_check_bf16`` validate the call for the profile the
dispatcher hands them and return an :class:`MGroupedRequest` carrying the layout plan
(:class:`~deepgemm_ref.layout.RowGroups`: runs, defined rows, zero rows), :func:`_tasks`
states the math as one task per run, and :func:`~deepgemm_ref.executor.execute` runs them into
``d`` and the trace.  See :mod:`deepgemm_ref.grouped` for the layouts and the padding policy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import core, trace
from ..api import profiled
from ..errors import arg_error
from ..executor import Fill, Request, Task, execute
from ..profiles import Profile
from ..runtime import current_mk_alignment
from ..toolkit.args import (
    F32,
    as_array,
    as_pair,
    bool_arg,
    check_compiled_dims,
    int32_vector,
    is_contiguous,
    transposed,
    transposed_pair,
)
from ..toolkit.groups import RowGroups, m_indices_layout, psum_gap_scale_rows, psum_layout
from ..toolkit.operands import (
    OUT_FORMAT,
    OperandSpec,
    ab_operand,
    alpha_of,
    bf16_operands,
    check_ascend_mix,
    recipes,
    resolve_scales,
)
from ..toolkit.outputs import check_out, input_view
from ..toolkit.sizes import check_matmul, opt_size_arg

__all__ = [
    "m_grouped_fp8_fp4_gemm_nt_contiguous", "m_grouped_fp8_fp4_gemm_nn_contiguous",
    "m_grouped_fp8_gemm_nt_contiguous", "m_grouped_fp8_gemm_nn_contiguous",
    "m_grouped_bf16_gemm_nt_contiguous", "m_grouped_bf16_gemm_nn_contiguous",
]


# ----------------------------------------------------------------------------------------------
# the request and its tasks
# ----------------------------------------------------------------------------------------------

@dataclass(kw_only=True)
class MGroupedRequest(Request):
    """A validated m-grouped contiguous GEMM (nothing computed or written).

    layout:  the row groups: runs (group, r0, r1), defined rows (the request's ``defined``) and
             the rows receiving +0.0 (its ``zero``).
    a, b:    A (M, K) and B (G, N, K) (FP8, packed FP4 or unscaled BF16).
    scales:  float64 scales of every row and K block of A and of every B[g] (None: unscaled),
             with their K block sizes ``gran_k``.
    output:  the output stage: d's format and DeepGEMM-Ascend's alpha.
    parallel: the runs (and their column pieces) write disjoint parts of d and run on the
             package's pool, one task per thread, each with a one-thread BLAS; not for a call a
             trace captures (the golden workflow, whose memory estimates plan one run's float64
             work at a time): its runs go one after the other.
    """

    layout: RowGroups
    a: OperandSpec
    b: OperandSpec
    scales: tuple[np.ndarray | None, np.ndarray | None] = (None, None)
    gran_k: tuple[int, int] = (0, 0)
    output: core.OutputStage
    parallel: bool = True


def _tasks(req: MGroupedRequest) -> list[Task | Fill]:
    """d[r0:r1] = out(alpha * A_s[r0:r1] @ B_s[g]^T) for every run (g, r0, r1): one task per run.

    The rows the padding policy zero-fills get +0.0 (the request's ``zero``); an empty M or N
    computes nothing; an empty K (DeepGEMM-Ascend's early return) clears all of d.
    """
    m, n, k = req.a.mn, req.b.mn, req.a.k
    if m == 0 or n == 0:
        return []
    if k == 0:
        return [Fill((...,), np.zeros((), req.d.dtype), label="empty K: d = 0 (the early return clears d)")]
    b_ops: dict[int, core.Operand] = {}
    tasks: list[Task | Fill] = []
    for g, r0, r1 in req.layout.runs:
        if g not in b_ops:
            b_ops[g] = req.b.operand(req.scales[1], req.gran_k[1], group=g)
        a_op = req.a.operand(req.scales[0], req.gran_k[0], rows=(r0, r1))
        pieces = _column_pieces(a_op, b_ops[g])
        if len(pieces) == 1:
            tasks.append(Task(a_op, b_ops[g], req.output, (slice(r0, r1),), label=f"group {g}: d[{r0}:{r1}]"))
            continue
        for c0, c1 in pieces:
            tasks.append(Task(a_op, _b_rows(b_ops[g], c0, c1), req.output, (slice(r0, r1), slice(c0, c1)),
                              label=f"group {g}: d[{r0}:{r1}, {c0}:{c1}]"))
    return tasks


# Column pieces of one run: N split at multiples of _PIECE_ALIGN into pieces of at least
# _PIECE_COLS columns and _PIECE_WORK multiply-adds.  The split depends on the shapes alone
# (never on the thread count), so every byte is the same on every run; d and the stats are
# those of the unsplit run, and a trace's S and inexact accumulators, whose last bits follow
# the BLAS's summation order (which some kernels vary with N), stay within their documented
# bounds of it (docs/numerics.md).
_PIECE_COLS = 2048
_PIECE_ALIGN = 256
_PIECE_WORK = 1 << 24
_MAX_PIECES = 8


def _column_pieces(a: core.Operand, b: core.Operand) -> list[tuple[int, int]]:
    """[(c0, c1)] column ranges of ``d[run]`` computed as separate tasks (one range: unsplit).

    A run of a few hundred rows against a (N, K) B is one GEMM whose B conversion dominates its
    non-BLAS work; in pieces, the tasks of all runs share the package's pool evenly (each with a
    one-thread BLAS, :attr:`~deepgemm_ref.executor.Request.parallel`) and every element of B is
    still converted once.  Unsplit: operands whose chunks may carry the chunk-wide exactness
    certificate (both with a fixed quantum: FP8 / FP4, whose trace stats label chunks by it),
    a GEMM the core computes transposed, and pieces too small for the BLAS's blocked kernels.
    """
    m, k = a.shape
    n = b.shape[0]
    if a.fixed_quantum is not None and b.fixed_quantum is not None:
        return [(0, n)]
    if core._swap_operands(m, n, k):
        return [(0, n)]
    p = min(_MAX_PIECES, n // _PIECE_COLS)
    if p < 2 or m * k * _PIECE_COLS < _PIECE_WORK:
        return [(0, n)]
    cuts = [0] + [(n * i // p) // _PIECE_ALIGN * _PIECE_ALIGN for i in range(1, p)] + [n]
    return list(zip(cuts[:-1], cuts[1:], strict=True))


def _b_rows(b: core.Operand, c0: int, c1: int) -> core.Operand:
    """Rows [c0, c1) of a B operand (its scale-power-of-two flag kept from the whole)."""
    sub = b.subset(slice(c0, c1))
    sub._pow2 = b.pow2_scales
    return sub


def _launch(req: MGroupedRequest) -> None:
    req.parallel = trace.active() is None
    execute(req, _tasks(req))


# ----------------------------------------------------------------------------------------------
# the layout and the shared checks
# ----------------------------------------------------------------------------------------------

def _alignment(profile: Profile, func: str) -> int:
    v = current_mk_alignment(profile)
    if v <= 0:
        raise arg_error(func, "grouped_layout", "a positive contiguous-layout alignment",
                        f"get_mk_alignment_for_contiguous_layout() = {v}")
    return v


def _m_grouped_common(
    func: str, profile: Profile, m: int, groups: int, grouped_layout: Any, use_psum_layout: Any,
    ensure_zero_padding: Any, expected_m: Any,
) -> RowGroups:
    psum = bool_arg(func, "use_psum_layout", use_psum_layout)
    zero_pad = bool_arg(func, "ensure_zero_padding", ensure_zero_padding)
    exp_m = opt_size_arg(func, "expected_m_for_psum_layout", expected_m, minimum=None)
    if profile.rules.psum_only:
        if not psum:
            raise arg_error(func, "use_psum_layout", "True (DeepGEMM-Ascend supports only the psum layout)", "False")
    elif exp_m is not None and not psum:
        raise arg_error(func, "expected_m_for_psum_layout", "None without use_psum_layout", repr(exp_m))
    alignment = _alignment(profile, func)
    if psum:
        ends = int32_vector(func, "grouped_layout", grouped_layout, groups, "psum end offsets, one per group")
        # Note: sm100 with ensure_zero_padding=False stores A_gap @ B_g^T into the gap rows up to
        # align(end_g, 16); here the whole gap keeps the caller's values.
        zero_gaps = zero_pad if profile.rules.zero_psum_gaps is None else profile.rules.zero_psum_gaps
        return psum_layout(func, ends, m, alignment, ascend=profile.rules.psum_whole_blocks, zero_gaps=zero_gaps)
    gl = int32_vector(func, "grouped_layout", grouped_layout, m, "m_indices, one per row of a")
    return m_indices_layout(func, gl, m, groups, alignment)


def _check_mnk(func: str, profile: Profile, n: int, k: int, groups: int, B: np.ndarray) -> None:
    """DeepGEMM asserts N > 0, K > 0 and G > 0; DeepGEMM-Ascend returns early on N == 0 or K == 0."""
    if groups <= 0:
        raise arg_error(func, "b", "at least one group", B)
    if profile.rules.grouped_asserts_nk and (n <= 0 or k <= 0):
        raise arg_error(func, "b", "N > 0 and K > 0", B)


def _early_return(profile: Profile, func: str, dd: np.ndarray, layout: RowGroups, sa: OperandSpec,
                  sb: OperandSpec, output: core.OutputStage) -> MGroupedRequest | None:
    """The request of an early return, checked no further: M == 0 or N == 0 computes nothing (the
    layout's defined rows in the record); K == 0 (DeepGEMM-Ascend only) clears all of d."""
    m, n, k = sa.mn, sb.mn, sa.k
    if m == 0 or n == 0:
        return MGroupedRequest(func=func, profile=profile, d=dd, defined=layout.defined, layout=layout, a=sa, b=sb,
                               output=output)
    if k == 0:
        return MGroupedRequest(func=func, profile=profile, d=dd, layout=layout, a=sa, b=sb, output=output)
    return None


def _check_runs(func: str, layout: RowGroups, n: int, k: int) -> None:
    """The longest run's (rows, K) x (N, K) product within the allocation limit."""
    check_matmul(func, "a", max(r1 - r0 for _, r0, r1 in layout.runs) if layout.runs else 0, n, k)


# ----------------------------------------------------------------------------------------------
# the check steps
# ----------------------------------------------------------------------------------------------

def _check_fp8(
    profile: Profile, func: str, a: Any, b: Any, d: Any, grouped_layout: Any, recipe: Any, recipe_a: Any,
    recipe_b: Any, compiled_dims: Any, disable_ue8m0_cast: Any, use_psum_layout: Any, ensure_zero_padding: Any,
    expected_m: Any, epilogue: Any,
) -> MGroupedRequest:
    """Validate an m-grouped contiguous FP8/FP4 GEMM (NT after the NN transposition); both targets."""
    check_compiled_dims(func, compiled_dims)
    A, sfa = as_pair(a, func, "a", sf_optional=True)
    B, sfb = as_pair(b, func, "b", sf_optional=True)
    dd = as_array(d, func, "d")
    rules = profile.rules
    alpha = alpha_of(func, None, epilogue) if rules.grouped_epilogue else None
    sa = ab_operand(A, func, "a", allowed=rules.fp8_dtypes)
    sb = ab_operand(B, func, "b", grouped=True, allowed=rules.fp8_dtypes)
    if rules.operand_mix:
        check_ascend_mix(func, sa, sb)
    if rules.fp8_k_major_only and sb.major != "K":
        raise arg_error(func, "b", f"a K-major B on {profile.name}", "an MN-major B")
    if sa.major != "K":
        raise arg_error(func, "a", "a K-major A", "an MN-major A")
    m, k = sa.mn, sa.k
    groups, n = int(sb.groups or 0), sb.mn
    if sb.k != k:
        raise arg_error(func, "b", f"K = {k} (from a)", B)
    reads = (("a[0]", A), ("a[1]", sfa), ("b[0]", B), ("b[1]", sfb), ("grouped_layout", input_view(grouped_layout)))
    check_out(dd, func, (m, n), rules.grouped_out_dtypes, inputs=reads)
    _check_mnk(func, profile, n, k, groups, B)
    disable = bool_arg(func, "disable_ue8m0_cast", disable_ue8m0_cast)
    layout = _m_grouped_common(func, profile, m, groups, grouped_layout, use_psum_layout, ensure_zero_padding,
                               expected_m)
    output = core.OutputStage(OUT_FORMAT[dd.dtype], alpha)
    early = _early_return(profile, func, dd, layout, sa, sb, output)
    if early is not None:
        return early
    _check_runs(func, layout, n, k)
    ga, gka, gb, gkb = recipes(func, sfa, sfb, recipe, recipe_a, recipe_b, profile)
    if rules.fp8_1d2d and gb == 1:
        # Note: DeepGEMM's sm90 m-grouped kernels are 1D2D only and would misread per-row SFB
        # (gran_n 1); rejected here instead of computing garbage.
        raise arg_error(func, "recipe", f"a per-block SFB (gran_n 128) for {profile.name}'s 1D2D grouped kernels",
                        f"gran_n {gb}")
    if (rules.psum_sfa_contiguous and layout.ends is not None and sfa is not None and sfa.dtype == F32
            and ga == 1 and not is_contiguous(sfa)):
        raise arg_error(func, "a[1]", "a contiguous float32 SFA with the psum layout (the SF packer skips "
                        "gap rows)", sfa)
    sfa_read = psum_gap_scale_rows(sfa, layout, m, ga, _alignment(profile, func), rules.psum_sf_gaps)
    scales_a = resolve_scales(func, "a[1]", sfa_read, m, k, ga, gka, None, profile, is_b=False,
                              disable_ue8m0_cast=disable)
    scales_b = resolve_scales(func, "b[1]", sfb, n, k, gb, gkb, groups, profile, is_b=True,
                              disable_ue8m0_cast=disable)
    return MGroupedRequest(func=func, profile=profile, d=dd, defined=layout.defined, zero=layout.zero, layout=layout,
                           a=sa, b=sb, scales=(scales_a, scales_b), gran_k=(gka, gkb), output=output)


def _check_bf16(profile: Profile, func: str, a: Any, b: Any, d: Any, grouped_layout: Any, compiled_dims: Any,
                use_psum_layout: Any, ensure_zero_padding: Any, expected_m: Any, epilogue: Any) -> MGroupedRequest:
    """Validate an m-grouped contiguous BF16 GEMM (NT after the NN transposition); both targets."""
    check_compiled_dims(func, compiled_dims)
    A = as_array(a, func, "a")
    B = as_array(b, func, "b")
    dd = as_array(d, func, "d")
    alpha = alpha_of(func, None, epilogue) if profile.rules.grouped_epilogue else None
    major_a, major_b = bf16_operands(func, (("a", A, 2), ("b", B, 3)))
    if major_a != "K":
        raise arg_error(func, "a", "a K-major A", "an MN-major A")
    m, k = A.shape
    groups, n, k2 = B.shape
    if k2 != k:
        raise arg_error(func, "b", f"shape (G, N, {k}) to match a", B)
    check_out(dd, func, (m, n), profile.rules.grouped_out_dtypes,
              inputs=(("a", A), ("b", B), ("grouped_layout", input_view(grouped_layout))))
    _check_mnk(func, profile, n, k, groups, B)
    if k % profile.rules.bf16_k_multiple:
        raise arg_error(func, "a", f"K divisible by {profile.rules.bf16_k_multiple} on {profile.name}", f"K = {k}")
    layout = _m_grouped_common(func, profile, m, groups, grouped_layout, use_psum_layout, ensure_zero_padding,
                               expected_m)
    sa = OperandSpec(A, major_a, False, m, k)
    sb = OperandSpec(B, major_b, False, n, k, groups)
    output = core.OutputStage(OUT_FORMAT[dd.dtype], alpha)
    early = _early_return(profile, func, dd, layout, sa, sb, output)
    if early is not None:
        return early
    _check_runs(func, layout, n, k)
    return MGroupedRequest(func=func, profile=profile, d=dd, defined=layout.defined, zero=layout.zero, layout=layout,
                           a=sa, b=sb, output=output)


# ----------------------------------------------------------------------------------------------
# the public functions
# ----------------------------------------------------------------------------------------------

_M_GROUPED_DOC = """{what} m-grouped contiguous GEMM: d[r, :] = out(A[r, :] @ B[g(r)]^T) for every row r of a group.

    a = {a_desc}; b = {b_desc}; d (M, N) {d_desc}, row-major, written in place.
    grouped_layout: int32 contiguous; m_indices (M,) with -1 padding rows (use_psum_layout=False,
    DeepGEMM only) or psum END offsets (G,) (use_psum_layout=True; group g owns rows
    [align(end[g-1], alignment), end[g])); alignment = get_mk_alignment_for_contiguous_layout().
    {extra}Rows outside the groups follow the module's padding policy (zeros for -1 rows and, when
    the target stores whole blocks, psum gap rows; everything else untouched).
"""

_FP8_A = "(A (M, K) float8_e4m3fn or int8 packed FP4 (M, K/2), K-major, sfa)"
_FP8_B_NT = "(B (G, N, K) or packed FP4, sfb (G, ...))"
_FP8_B_NN = "(B (G, K, N) or packed FP4, sfb transposed on its last two dims)"


def _make_m_grouped_fp8(layout: str, ascend: bool) -> Callable[..., None]:
    name = f"m_grouped_fp8_fp4_gemm_{layout}_contiguous"
    nn = layout == "nn"

    def prep(b: Any) -> Any:
        return transposed_pair(b, name, "b", (1, 2)) if nn else b

    if ascend:
        def impl(profile: Profile, /, a: Any, b: Any, d: Any, grouped_layout: Any, recipe: Any = None,
                 recipe_a: Any = None, recipe_b: Any = None, compiled_dims: str = "nk",
                 disable_ue8m0_cast: bool = False, use_psum_layout: bool = True, ensure_zero_padding: bool = True,
                 expected_m_for_psum_layout: int | None = None, epilogue: Any = None) -> None:
            _launch(_check_fp8(profile, name, a, prep(b), d, grouped_layout, recipe, recipe_a, recipe_b, compiled_dims,
                               disable_ue8m0_cast, use_psum_layout, ensure_zero_padding, expected_m_for_psum_layout,
                               epilogue))
    elif nn:
        def impl(profile: Profile, /, a: Any, b: Any, d: Any, grouped_layout: Any,  # type: ignore[misc]
                 recipe: Any = None, recipe_a: Any = None, recipe_b: Any = None, compiled_dims: str = "nk",
                 disable_ue8m0_cast: bool = False, use_psum_layout: bool = False,
                 ensure_zero_padding: bool = True) -> None:
            _launch(_check_fp8(profile, name, a, prep(b), d, grouped_layout, recipe, recipe_a, recipe_b, compiled_dims,
                               disable_ue8m0_cast, use_psum_layout, ensure_zero_padding, None, None))
    else:
        def impl(profile: Profile, /, a: Any, b: Any, d: Any, grouped_layout: Any,  # type: ignore[misc]
                 recipe: Any = None, recipe_a: Any = None, recipe_b: Any = None, compiled_dims: str = "nk",
                 disable_ue8m0_cast: bool = False, use_psum_layout: bool = False,
                 ensure_zero_padding: bool = True, expected_m_for_psum_layout: int | None = None) -> None:
            _launch(_check_fp8(profile, name, a, b, d, grouped_layout, recipe, recipe_a, recipe_b, compiled_dims,
                               disable_ue8m0_cast, use_psum_layout, ensure_zero_padding, expected_m_for_psum_layout,
                               None))

    impl.__name__ = impl.__qualname__ = name
    impl.__doc__ = _M_GROUPED_DOC.format(
        what="FP8/FP4", a_desc=_FP8_A, b_desc=_FP8_B_NN if nn else _FP8_B_NT,
        d_desc="bfloat16 or float32" if ascend else "bfloat16",
        extra=("Scales as in fp8_fp4_gemm_nt (recipe, recipe_a / recipe_b).  out(x) rounds to d's dtype once; "
               + ("epilogue=Alpha(alpha) multiplies the float32 accumulator first.\n    " if ascend else "\n    ")),
    )
    return impl


def _make_m_grouped_bf16(layout: str, ascend: bool) -> Callable[..., None]:
    name = f"m_grouped_bf16_gemm_{layout}_contiguous"
    nn = layout == "nn"

    def prep(b: Any) -> Any:
        return transposed(b, name, "b", (1, 2)) if nn else b

    if ascend:
        def impl(profile: Profile, /, a: Any, b: Any, d: Any, grouped_layout: Any, compiled_dims: str = "nk",
                 use_psum_layout: bool = True, ensure_zero_padding: bool = True,
                 expected_m_for_psum_layout: int | None = None, epilogue: Any = None) -> None:
            _launch(_check_bf16(profile, name, a, prep(b), d, grouped_layout, compiled_dims, use_psum_layout,
                                ensure_zero_padding, expected_m_for_psum_layout, epilogue))
    elif nn:
        def impl(profile: Profile, /, a: Any, b: Any, d: Any, grouped_layout: Any,  # type: ignore[misc]
                 compiled_dims: str = "nk", use_psum_layout: bool = False, ensure_zero_padding: bool = True) -> None:
            _launch(_check_bf16(profile, name, a, prep(b), d, grouped_layout, compiled_dims, use_psum_layout,
                                ensure_zero_padding, None, None))
    else:
        def impl(profile: Profile, /, a: Any, b: Any, d: Any, grouped_layout: Any,  # type: ignore[misc]
                 compiled_dims: str = "nk", use_psum_layout: bool = False, ensure_zero_padding: bool = True,
                 expected_m_for_psum_layout: int | None = None) -> None:
            _launch(_check_bf16(profile, name, a, b, d, grouped_layout, compiled_dims, use_psum_layout,
                                ensure_zero_padding, expected_m_for_psum_layout, None))

    impl.__name__ = impl.__qualname__ = name
    impl.__doc__ = _M_GROUPED_DOC.format(
        what="BF16", a_desc="A (M, K) bfloat16, K-major",
        b_desc="B (G, K, N) bfloat16" if nn else "B (G, N, K) bfloat16 (any major; sm90: K % 64 == 0)",
        d_desc="bfloat16 or float32" if ascend else "bfloat16",
        extra="float32 accumulation, one rounding to d's dtype" + (
            "; epilogue=Alpha(alpha) multiplies the float32 accumulator first.\n    " if ascend else ".\n    "),
    )
    return impl


m_grouped_fp8_fp4_gemm_nt_contiguous = profiled(
    "m_grouped_fp8_fp4_gemm_nt_contiguous", deepgemm=_make_m_grouped_fp8("nt", False),
    deepgemm_ascend=_make_m_grouped_fp8("nt", True))
m_grouped_fp8_fp4_gemm_nn_contiguous = profiled(
    "m_grouped_fp8_fp4_gemm_nn_contiguous", deepgemm=_make_m_grouped_fp8("nn", False),
    deepgemm_ascend=_make_m_grouped_fp8("nn", True))
# Both libraries register the FP8 names as the same Python objects; here aliases (ProfiledFunction.alias).
m_grouped_fp8_gemm_nt_contiguous = m_grouped_fp8_fp4_gemm_nt_contiguous.alias("m_grouped_fp8_gemm_nt_contiguous")
m_grouped_fp8_gemm_nn_contiguous = m_grouped_fp8_fp4_gemm_nn_contiguous.alias("m_grouped_fp8_gemm_nn_contiguous")
m_grouped_bf16_gemm_nt_contiguous = profiled(
    "m_grouped_bf16_gemm_nt_contiguous", deepgemm=_make_m_grouped_bf16("nt", False),
    deepgemm_ascend=_make_m_grouped_bf16("nt", True))
m_grouped_bf16_gemm_nn_contiguous = profiled(
    "m_grouped_bf16_gemm_nn_contiguous", deepgemm=_make_m_grouped_bf16("nn", False),
    deepgemm_ascend=_make_m_grouped_bf16("nn", True))
