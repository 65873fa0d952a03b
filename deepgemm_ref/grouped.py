"""Grouped GEMMs: m-grouped contiguous (m_indices and psum layouts), m-grouped masked, k-grouped.

Every function is DeepGEMM's (or, under the ``ascend950`` profile, DeepGEMM-Ascend's) public
function of the same name: same parameters and defaults, output written in place into ``d``,
``None`` returned.  A grouped call is a set of dense GEMMs, each one :func:`core.scaled_matmul`
call on one group's rows (or, k-grouped, one group's K range), with the dense kernels' scale and
epilogue rules (see :mod:`deepgemm_ref.gemm`)::

    m-grouped:  d[r, :]  = out( sum_k A[r, k] sa[r, k // ga] * B[g(r)][:, k] sb[g(r)][:, k // gb] )
    masked:     d[g, r]  = out( A[g, r] @ B[g]^T )            for r < masked_m[g]
    k-grouped:  d[g]     = epilogue( sum_{k in K_g} outer(A[k, :] sa, B[k, :] sb) ; c[g] )

``out`` is one rounding of the accumulator to ``d``'s dtype (bfloat16, or float32 under
DeepGEMM-Ascend), ``alpha`` (DeepGEMM-Ascend's ``Alpha`` epilogue) multiplies the float32
accumulator first, and k-grouped outputs add ``c`` as the dense kernels do (bf16 ``d``:
``bf16(c + bf16(acc))``; float32 ``d``: ``f32(c + acc)``).  The accumulator follows the active
accumulation model (``exact`` by default: golden values).

Group layouts
-------------
``alignment`` is ``get_mk_alignment_for_contiguous_layout()``: DeepGEMM's settable value (128 by
default), fixed at 256 under DeepGEMM-Ascend.

* m_indices (DeepGEMM, ``use_psum_layout=False``): ``grouped_layout`` int32 (M,), row r belongs to
  group ``grouped_layout[r]``, -1 marks a padding row.  The kernels read a block's group from its
  first row, so every block of ``alignment`` rows must be rows of one group followed by -1 rows.
* psum (both targets; the only layout of DeepGEMM-Ascend): ``grouped_layout`` int32 (G,) holds
  cumulative END rows: group g owns rows [start_g, end_g), start_0 = 0,
  start_g = align(end_{g-1}, alignment).  The end offsets must satisfy end_g >= start_g
  (DeepGEMM-Ascend also accepts end_g == end_{g-1}: an empty group after a non-aligned end) and
  end_{G-1} <= M.  Rows [end_g, align(end_g, alignment)) are the group's gap.
* masked (DeepGEMM only): ``masked_m`` int32 (G,), 0 <= masked_m[g] <= MAX_M.
* k-grouped: per-group K sizes (DeepGEMM non-psum: ``grouped_layout`` == ``ks_cpu``, each a
  multiple of ``alignment``, groups back to back) or psum END offsets along K (group g uses K rows
  [align(end_{g-1}, alignment), end_g)).  k-grouped SFs are compact per group under DeepGEMM
  (ceil(k_g / gran_k) rows each) and indexed by absolute K under DeepGEMM-Ascend.

Rows outside the contract: ONE policy
-------------------------------------
The emulator writes exactly the rows the contract defines, plus +0.0 into the padding rows that
the targets' tests require to read as zero (spec 16: "write zeros for m_indices == -1 rows and
for psum padding rows when ensure_zero_padding=True"):

* m_indices == -1 rows: written with +0.0 (every target kernel stores over them);
* psum gap rows [end_g, align(end_g, alignment)) (clipped to M) of a non-empty group: written
  with +0.0 when the target stores the group's whole last block, i.e. DeepGEMM sm100 with
  ``ensure_zero_padding=True``, sm90 (which ignores the flag) and DeepGEMM-Ascend (which
  always computes full 256-row blocks and accepts the flag without effect);
* every other row outside the contract keeps the caller's values: rows past ``masked_m[g]``,
  psum gaps on sm100 with ``ensure_zero_padding=False``, rows after the last group's aligned end.

The real kernels store ``A_pad @ B_g^T`` (zero when A's padding rows are zero, as in the tests)
where this emulator stores +0.0; those spots are marked ``# Note:``.  Padding rows of A never
enter a defined output, and the float32 SFA rows of psum gaps are neither read nor checked (the
targets' SF transforms skip them, so they may be uninitialised).  Nothing is ever allocated for
the caller: ``d`` is theirs and untouched rows keep their values.  Two early returns follow the
targets: DeepGEMM-Ascend clears all of ``d`` when K == 0; an empty k-group keeps ``c[g]`` bit for
bit (the scheduler skips it).

Each call reports, through :mod:`deepgemm_ref.trace`, a ``defined`` mask of ``d``'s shape that is
True exactly on the rows the contract defines (zero-filled padding rows are False), with the
accumulator and error scale of those rows.

Errors: every argument is validated (shapes, dtypes, majors, layouts, group ids, alignment, end
offsets, ``masked_m``, ``ks_cpu`` against the layout, scale factors) before ``d`` is written; a
bad argument raises :class:`DGArgumentError` naming the function and the argument.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import core
from . import formats as fm
from .api import profiled
from .errors import DGArgumentError, arg_error
from .executor import Task, execute
from .layout import ascend_gap_mask, pack_k_grouped_ue8m0, sf_values
from .profiles import Profile, get_profile
from .runtime import ASCEND_MK_ALIGNMENT, current_mk_alignment
from .toolkit.args import (
    BF16,
    E4M3,
    F32,
    I8,
    I32,
    align,
    as_array,
    as_pair,
    bool_arg,
    ceil_div,
    check_compiled_dims,
    int32_vector,
    int_arg,
    is_contiguous,
    ks_list,
    major_of,
    opt_int_arg,
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
    cuda_recipes,
    recipe_arg,
    resolve_scales,
)
from .toolkit.outputs import check_out, snapshot_c

__all__ = [
    "m_grouped_fp8_fp4_gemm_nt_contiguous", "m_grouped_fp8_fp4_gemm_nn_contiguous",
    "m_grouped_fp8_gemm_nt_contiguous", "m_grouped_fp8_gemm_nn_contiguous",
    "m_grouped_bf16_gemm_nt_contiguous", "m_grouped_bf16_gemm_nn_contiguous",
    "m_grouped_fp8_fp4_gemm_nt_masked", "m_grouped_fp8_gemm_nt_masked", "fp8_m_grouped_gemm_nt_masked",
    "m_grouped_bf16_gemm_nt_masked", "bf16_m_grouped_gemm_nt_masked",
    "k_grouped_fp8_gemm_tn_contiguous", "k_grouped_fp8_gemm_nt_contiguous", "k_grouped_bf16_gemm_tn_contiguous",
]

_ASCEND_MIXES = "FP8 x FP8, FP4 x FP4 or FP8 (A) x FP4 (B) operands (Unsupported operand dtypes)"


# ----------------------------------------------------------------------------------------------
# small argument helpers
# ----------------------------------------------------------------------------------------------

def _alignment(func: str) -> int:
    v = current_mk_alignment()
    if v <= 0:
        raise arg_error(func, "grouped_layout", "a positive contiguous-layout alignment",
                        f"get_mk_alignment_for_contiguous_layout() = {v}")
    return v


# ----------------------------------------------------------------------------------------------
# m-grouped layouts
# ----------------------------------------------------------------------------------------------

@dataclass
class _MLayout:
    """A validated m-grouped layout: the defined row runs, the rows zero-filled, the gap rows."""

    runs: list[tuple[int, int, int]]  # (group, r0, r1): rows of d computed with B[group]
    defined: np.ndarray  # (M,) bool
    zero: np.ndarray  # (M,) bool
    ends: np.ndarray | None = None  # psum end offsets (int64)


def _m_indices_layout(func: str, gl: np.ndarray, m: int, groups: int, alignment: int) -> _MLayout:
    """DeepGEMM's m_indices layout (spec 7.1 layout A)."""
    # Note: DeepGEMM does not check the layout's content (a misplaced group id or -1 row gives
    # wrong rows silently); ids outside [-1, G) and blocks mixing groups raise here.
    if ((gl < -1) | (gl >= groups)).any():
        bad = int(np.flatnonzero((gl < -1) | (gl >= groups))[0])
        raise arg_error(func, "grouped_layout", f"group ids in [-1, {groups}) (-1 marks padding rows)",
                        f"{int(gl[bad])} at row {bad}")
    nblk = ceil_div(m, alignment)
    padded = np.full(nblk * alignment, -1, np.int64)
    padded[:m] = gl
    blocks = padded.reshape(nblk, alignment)
    valid = blocks >= 0
    # The kernels take a block's group from its first row (BLOCK_M == alignment): all its rows
    # must belong to that group, padding (-1) rows only after them.
    mixed = valid & (blocks != blocks[:, :1])
    tail = valid[:, 1:] & ~valid[:, :-1]
    if mixed.any() or tail.any():
        blk = int(np.flatnonzero(mixed.any(axis=1) | tail.any(axis=1))[0])
        r0 = blk * alignment
        raise arg_error(
            func, "grouped_layout",
            f"groups aligned to the contiguous-layout alignment ({alignment}): every block of {alignment} rows "
            "holds rows of one group followed by -1 padding rows",
            f"rows [{r0}, {min(m, r0 + alignment)}) = {gl[r0:r0 + alignment].tolist()[:16]}...",
        )
    defined = np.asarray(gl >= 0)
    runs: list[tuple[int, int, int]] = []
    if m:
        cut = np.flatnonzero(np.diff(gl)) + 1
        starts = np.concatenate(([0], cut))
        stops = np.concatenate((cut, [m]))
        runs = [(int(gl[s]), int(s), int(e)) for s, e in zip(starts, stops, strict=True) if gl[s] >= 0]
    # Note: the kernels store A_row @ B_e^T (sm100, sm90 BF16) or, per 64-row chunk, zeros or
    # A_row @ B_e^T (sm90 FP8) into -1 rows; here they get +0.0 (equal when A's padding rows are
    # zero, as in DeepGEMM's tests).
    return _MLayout(runs, defined, ~defined)


def _psum_layout(func: str, ends: np.ndarray, m: int, alignment: int, *, ascend: bool,
                 zero_gaps: bool) -> _MLayout:
    """psum END offsets (spec 7.1 layout B; port 2.4)."""
    # Note: neither target checks the end offsets (a group ending before its aligned start
    # underflows the kernels' block count); such layouts and ends past M raise here.
    if (ends < 0).any():
        raise arg_error(func, "grouped_layout", "non-negative end offsets", repr(ends.tolist()))
    defined = np.zeros(m, bool)
    zero = np.zeros(m, bool)
    runs: list[tuple[int, int, int]] = []
    prev_end = 0
    for g, end in enumerate(ends.tolist()):
        start = align(prev_end, alignment) if g else 0
        if end < start:
            if not (ascend and end == prev_end):
                raise arg_error(
                    func, "grouped_layout",
                    f"increasing end offsets with end[g] >= align(end[g-1], {alignment}) (group g starts there)",
                    f"{ends.tolist()} (group {g}: end {end} < start {start})",
                )
            # DeepGEMM-Ascend treats a group ending before its aligned start as empty.
            prev_end = end
            continue
        if end > m:
            raise arg_error(func, "grouped_layout", f"end offsets <= M = {m} (the rows of a and d)",
                            f"{ends.tolist()} (group {g} ends at {end})")
        if end > start:
            runs.append((g, start, end))
            defined[start:end] = True
            if ascend and align(end, alignment) > m:
                # Note: DeepGEMM-Ascend does not check this; its kernel would read A and write d
                # past their last row (the whole 256-row block is computed).
                raise arg_error(func, "d", f"rows up to the last group's padded end align({end}, {alignment}) = "
                                f"{align(end, alignment)} (DeepGEMM-Ascend computes whole blocks)", f"M = {m}")
            if zero_gaps:
                # Note: the kernels store A_gap @ B_g^T into the gap (sm90 FP8: zeros for 64-row
                # chunks past end_g); here the gap gets +0.0 (equal for zero A gap rows).
                zero[end:min(align(end, alignment), m)] = True
        prev_end = end
    return _MLayout(runs, defined, zero, ends)


def _sfa_for_psum(sf: np.ndarray | None, layout: _MLayout, m: int, gran_m: int, alignment: int,
                  ascend: bool) -> np.ndarray | None:
    """float32 SFA with the rows the target's SF transform skips (psum gaps) set to 0.0.

    Those rows may be uninitialised (DeepGEMM's masked-to-psum test): the transforms write
    byte 0 for them without checking, and this emulator never computes them.
    """
    if sf is None or sf.dtype != F32 or sf.ndim != 2 or layout.ends is None or sf.shape[0] != ceil_div(m, gran_m):
        return sf
    rows = sf.shape[0]
    if ascend:
        keep = ascend_gap_mask(layout.ends, rows, gran_m, alignment)
    else:
        valid = np.zeros(rows * gran_m, bool)
        valid[:m] = layout.defined
        keep = np.asarray(valid.reshape(rows, gran_m).any(axis=1))
    if keep.all():
        return sf
    return np.where(keep[:, None], sf, np.float32(0.0))


# ----------------------------------------------------------------------------------------------
# m-grouped contiguous
# ----------------------------------------------------------------------------------------------

def _m_grouped_common(
    func: str, profile: Profile, m: int, groups: int, grouped_layout: Any, use_psum_layout: Any,
    ensure_zero_padding: Any, expected_m: Any,
) -> _MLayout:
    psum = bool_arg(func, "use_psum_layout", use_psum_layout)
    zero_pad = bool_arg(func, "ensure_zero_padding", ensure_zero_padding)
    exp_m = opt_int_arg(func, "expected_m_for_psum_layout", expected_m)
    if profile.is_ascend:
        if not psum:
            raise arg_error(func, "use_psum_layout", "True (DeepGEMM-Ascend supports only the psum layout)", "False")
    elif exp_m is not None and not psum:
        raise arg_error(func, "expected_m_for_psum_layout", "None without use_psum_layout", repr(exp_m))
    alignment = _alignment(func)
    if psum:
        ends = int32_vector(func, "grouped_layout", grouped_layout, groups, "psum end offsets, one per group")
        # Note: sm100 with ensure_zero_padding=False stores A_gap @ B_g^T into the gap rows up to
        # align(end_g, 16); here the whole gap keeps the caller's values (spec 16).
        zero_gaps = profile.is_ascend or profile.arch_major == 9 or zero_pad
        return _psum_layout(func, ends, m, alignment, ascend=profile.is_ascend, zero_gaps=zero_gaps)
    gl = int32_vector(func, "grouped_layout", grouped_layout, m, "m_indices, one per row of a")
    return _m_indices_layout(func, gl, m, groups, alignment)


def _check_mnk(func: str, profile: Profile, n: int, k: int, groups: int, B: np.ndarray) -> None:
    """DeepGEMM asserts N > 0, K > 0 and G > 0; DeepGEMM-Ascend returns early on N == 0 or K == 0."""
    if groups <= 0:
        raise arg_error(func, "b", "at least one group", B)
    if not profile.is_ascend and (n <= 0 or k <= 0):
        raise arg_error(func, "b", "N > 0 and K > 0", B)


def _m_grouped_early_return(func: str, dd: np.ndarray, layout: _MLayout, m: int, n: int, k: int) -> bool:
    """M == 0 or N == 0: nothing to do; K == 0 (DeepGEMM-Ascend only): d := 0, all of it (the
    port's early return clears the whole output)."""
    if m == 0 or n == 0:
        execute(func, dd, [], defined=layout.defined)
        return True
    if k == 0:
        execute(func, dd, [], zero=np.ones(m, bool))
        return True
    return False


def _m_grouped_fp8(
    func: str, a: Any, b: Any, d: Any, grouped_layout: Any, recipe: Any, recipe_a: Any, recipe_b: Any,
    compiled_dims: Any, disable_ue8m0_cast: Any, use_psum_layout: Any, ensure_zero_padding: Any,
    expected_m: Any, epilogue: Any,
) -> None:
    """m-grouped contiguous FP8/FP4 GEMM (NT after the NN transposition); both targets."""
    profile = get_profile()
    check_compiled_dims(func, compiled_dims)
    A, sfa = as_pair(a, func, "a", sf_optional=True)
    B, sfb = as_pair(b, func, "b", sf_optional=True)
    dd = as_array(d, func, "d")
    alpha = alpha_of(func, None, epilogue) if profile.is_ascend else None
    if profile.is_ascend:
        sa = ab_operand(A, func, "a")
        sb = ab_operand(B, func, "b", grouped=True)
        if sa.is_fp4 and not sb.is_fp4:
            raise arg_error(func, "a", _ASCEND_MIXES, "FP4 A with FP8 B")
        out_dtypes: tuple[np.dtype, ...] = OUT_DTYPES
    else:
        allowed = (E4M3,) if profile.arch_major == 9 else (E4M3, I8)
        sa = ab_operand(A, func, "a", allowed=allowed)
        sb = ab_operand(B, func, "b", grouped=True, allowed=allowed)
        if profile.arch_major == 9 and sb.major != "K":
            raise arg_error(func, "b", "a K-major B on sm90", "an MN-major B")
        out_dtypes = (BF16,)
    if sa.major != "K":
        raise arg_error(func, "a", "a K-major A", "an MN-major A")
    m, k = sa.mn, sa.k
    groups, n = int(sb.groups or 0), sb.mn
    if sb.k != k:
        raise arg_error(func, "b", f"K = {k} (from a)", B)
    check_out(dd, func, (m, n), out_dtypes)
    _check_mnk(func, profile, n, k, groups, B)
    disable = bool_arg(func, "disable_ue8m0_cast", disable_ue8m0_cast)
    layout = _m_grouped_common(func, profile, m, groups, grouped_layout, use_psum_layout, ensure_zero_padding,
                               expected_m)
    if _m_grouped_early_return(func, dd, layout, m, n, k):
        return
    if profile.is_ascend:
        ga, gka, gb, gkb = ascend_recipes(func, recipe, recipe_a, recipe_b)
    else:
        ga, gka, gb, gkb = cuda_recipes(func, sfa, sfb, recipe, recipe_a, recipe_b, profile)
        if profile.arch_major == 9 and gb == 1:
            # Note: DeepGEMM's sm90 m-grouped kernels are 1D2D only and would misread per-row SFB
            # (gran_n 1); rejected here instead of computing garbage.
            raise arg_error(func, "recipe", "a per-block SFB (gran_n 128) for sm90's 1D2D grouped kernels",
                            f"gran_n {gb}")
        if (profile.arch_major == 10 and layout.ends is not None and sfa is not None and sfa.dtype == F32
                and ga == 1 and not is_contiguous(sfa)):
            raise arg_error(func, "a[1]", "a contiguous float32 SFA with the psum layout (the SF packer skips "
                            "gap rows)", sfa)
    alignment = _alignment(func)
    sfa_read = _sfa_for_psum(sfa, layout, m, ga, alignment, profile.is_ascend)
    scales_a = resolve_scales(func, "a[1]", sfa_read, m, k, ga, gka, None, profile, is_b=False,
                              disable_ue8m0_cast=disable)
    scales_b = resolve_scales(func, "b[1]", sfb, n, k, gb, gkb, groups, profile, is_b=True,
                              disable_ue8m0_cast=disable)
    out = OUT_FORMAT[dd.dtype]
    b_ops: dict[int, core.Operand] = {}
    tasks = []
    for g, r0, r1 in layout.runs:
        if g not in b_ops:
            b_ops[g] = sb.operand(scales_b, gkb, group=g)
        tasks.append(Task(sa.operand(scales_a, gka, rows=(r0, r1)), b_ops[g], core.OutputStage(out, alpha),
                          (slice(r0, r1),)))
    execute(func, dd, tasks, defined=layout.defined, zero=layout.zero)


def _m_grouped_bf16(func: str, a: Any, b: Any, d: Any, grouped_layout: Any, compiled_dims: Any,
                    use_psum_layout: Any, ensure_zero_padding: Any, expected_m: Any, epilogue: Any) -> None:
    """m-grouped contiguous BF16 GEMM (NT after the NN transposition); both targets."""
    profile = get_profile()
    check_compiled_dims(func, compiled_dims)
    A = as_array(a, func, "a")
    B = as_array(b, func, "b")
    dd = as_array(d, func, "d")
    alpha = alpha_of(func, None, epilogue) if profile.is_ascend else None
    major_a, _ = bf16_operands(func, (("a", A, 2), ("b", B, 3)))
    if major_a != "K":
        raise arg_error(func, "a", "a K-major A", "an MN-major A")
    m, k = A.shape
    groups, n, k2 = B.shape
    if k2 != k:
        raise arg_error(func, "b", f"shape (G, N, {k}) to match a", B)
    check_out(dd, func, (m, n), OUT_DTYPES if profile.is_ascend else (BF16,))
    _check_mnk(func, profile, n, k, groups, B)
    if profile.arch_major == 9 and not profile.is_ascend and k % 64:
        raise arg_error(func, "a", "K divisible by 64 on sm90", f"K = {k}")
    layout = _m_grouped_common(func, profile, m, groups, grouped_layout, use_psum_layout, ensure_zero_padding,
                               expected_m)
    if _m_grouped_early_return(func, dd, layout, m, n, k):
        return
    out = OUT_FORMAT[dd.dtype]
    tasks = [Task(core.Operand(A[r0:r1]), core.Operand(B[g]), core.OutputStage(out, alpha), (slice(r0, r1),))
             for g, r0, r1 in layout.runs]
    execute(func, dd, tasks, defined=layout.defined, zero=layout.zero)


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
        def impl(a: Any, b: Any, d: Any, grouped_layout: Any, recipe: Any = None, recipe_a: Any = None,
                 recipe_b: Any = None, compiled_dims: str = "nk", disable_ue8m0_cast: bool = False,
                 use_psum_layout: bool = True, ensure_zero_padding: bool = True,
                 expected_m_for_psum_layout: int | None = None, epilogue: Any = None) -> None:
            _m_grouped_fp8(name, a, prep(b), d, grouped_layout, recipe, recipe_a, recipe_b, compiled_dims,
                           disable_ue8m0_cast, use_psum_layout, ensure_zero_padding, expected_m_for_psum_layout,
                           epilogue)
    elif nn:
        def impl(a: Any, b: Any, d: Any, grouped_layout: Any, recipe: Any = None,  # type: ignore[misc]
                 recipe_a: Any = None, recipe_b: Any = None, compiled_dims: str = "nk",
                 disable_ue8m0_cast: bool = False, use_psum_layout: bool = False,
                 ensure_zero_padding: bool = True) -> None:
            _m_grouped_fp8(name, a, prep(b), d, grouped_layout, recipe, recipe_a, recipe_b, compiled_dims,
                           disable_ue8m0_cast, use_psum_layout, ensure_zero_padding, None, None)
    else:
        def impl(a: Any, b: Any, d: Any, grouped_layout: Any, recipe: Any = None,  # type: ignore[misc]
                 recipe_a: Any = None, recipe_b: Any = None, compiled_dims: str = "nk",
                 disable_ue8m0_cast: bool = False, use_psum_layout: bool = False,
                 ensure_zero_padding: bool = True, expected_m_for_psum_layout: int | None = None) -> None:
            _m_grouped_fp8(name, a, b, d, grouped_layout, recipe, recipe_a, recipe_b, compiled_dims,
                           disable_ue8m0_cast, use_psum_layout, ensure_zero_padding, expected_m_for_psum_layout,
                           None)

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
        def impl(a: Any, b: Any, d: Any, grouped_layout: Any, compiled_dims: str = "nk",
                 use_psum_layout: bool = True, ensure_zero_padding: bool = True,
                 expected_m_for_psum_layout: int | None = None, epilogue: Any = None) -> None:
            _m_grouped_bf16(name, a, prep(b), d, grouped_layout, compiled_dims, use_psum_layout, ensure_zero_padding,
                            expected_m_for_psum_layout, epilogue)
    elif nn:
        def impl(a: Any, b: Any, d: Any, grouped_layout: Any, compiled_dims: str = "nk",  # type: ignore[misc]
                 use_psum_layout: bool = False, ensure_zero_padding: bool = True) -> None:
            _m_grouped_bf16(name, a, prep(b), d, grouped_layout, compiled_dims, use_psum_layout, ensure_zero_padding,
                            None, None)
    else:
        def impl(a: Any, b: Any, d: Any, grouped_layout: Any, compiled_dims: str = "nk",  # type: ignore[misc]
                 use_psum_layout: bool = False, ensure_zero_padding: bool = True,
                 expected_m_for_psum_layout: int | None = None) -> None:
            _m_grouped_bf16(name, a, b, d, grouped_layout, compiled_dims, use_psum_layout, ensure_zero_padding,
                            expected_m_for_psum_layout, None)

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
# Both libraries register the FP8 names as the same Python objects.
m_grouped_fp8_gemm_nt_contiguous = m_grouped_fp8_fp4_gemm_nt_contiguous
m_grouped_fp8_gemm_nn_contiguous = m_grouped_fp8_fp4_gemm_nn_contiguous
m_grouped_bf16_gemm_nt_contiguous = profiled(
    "m_grouped_bf16_gemm_nt_contiguous", deepgemm=_make_m_grouped_bf16("nt", False),
    deepgemm_ascend=_make_m_grouped_bf16("nt", True))
m_grouped_bf16_gemm_nn_contiguous = profiled(
    "m_grouped_bf16_gemm_nn_contiguous", deepgemm=_make_m_grouped_bf16("nn", False),
    deepgemm_ascend=_make_m_grouped_bf16("nn", True))


# ----------------------------------------------------------------------------------------------
# m-grouped masked (DeepGEMM only)
# ----------------------------------------------------------------------------------------------

def _masked_common(func: str, masked_m: Any, expected_m: Any, groups: int, max_m: int) -> np.ndarray:
    mm = int32_vector(func, "masked_m", masked_m, groups, "valid rows, one per group")
    int_arg(func, "expected_m", expected_m, minimum=1)
    # Note: DeepGEMM does not check masked_m's values (the kernel would read past the group's
    # rows); values outside [0, MAX_M] raise here.
    if ((mm < 0) | (mm > max_m)).any():
        g = int(np.flatnonzero((mm < 0) | (mm > max_m))[0])
        raise arg_error(func, "masked_m", f"0 <= masked_m[g] <= {max_m} (the rows of a and d per group)",
                        f"masked_m[{g}] = {int(mm[g])}")
    return mm


def _masked_tasks(func: str, dd: np.ndarray, mm: np.ndarray,
                  make: Callable[[int, int], tuple[core.Operand, core.Operand]], out: fm.Format) -> None:
    groups, max_m = dd.shape[0], dd.shape[1]
    defined = np.arange(max_m)[None, :] < mm[:, None]
    tasks = []
    for g in range(groups):
        rows = int(mm[g])
        if rows:
            a_op, b_op = make(g, rows)
            tasks.append(Task(a_op, b_op, core.OutputStage(out), (g, slice(0, rows))))
    # Note: the kernels also store A_row @ B_g^T (sm90 FP8: zeros per 64-row chunk) into the
    # padding rows of each group's last visited block; here every row past masked_m[g] keeps
    # the caller's value (spec 7.2: "the emulator should leave them untouched").
    execute(func, dd, tasks, defined=defined)


def _m_grouped_fp8_masked(a: Any, b: Any, d: Any, masked_m: Any, expected_m: int, recipe: Any = None,
                          recipe_a: Any = None, recipe_b: Any = None, compiled_dims: str = "nk",
                          disable_ue8m0_cast: bool = False) -> None:
    """FP8/FP4 m-grouped masked GEMM: d[g, r] = bf16(A[g, r] @ B[g]^T) for r < masked_m[g].

    a = (A (G, MAX_M, K) float8_e4m3fn or int8 packed FP4 (G, MAX_M, K/2), sfa (G, ...)),
    b = (B (G, N, K) or packed FP4, sfb (G, ...)), both K-major; d (G, MAX_M, N) bfloat16.
    masked_m: int32 contiguous (G,), 0 <= masked_m[g] <= MAX_M; expected_m: a positive int (a
    scheduling hint).  Scales and math as fp8_fp4_gemm_nt.  Rows r >= masked_m[g] are left
    untouched (the kernels leave them unspecified).  SFA rows past masked_m are validated like
    the others (DeepGEMM's packer reads them; its test zeroes them).
    """
    func = "m_grouped_fp8_fp4_gemm_nt_masked"
    profile = get_profile()
    check_compiled_dims(func, compiled_dims)
    A, sfa = as_pair(a, func, "a", sf_optional=True)
    B, sfb = as_pair(b, func, "b", sf_optional=True)
    dd = as_array(d, func, "d")
    allowed = (E4M3,) if profile.arch_major == 9 else (E4M3, I8)
    sa = ab_operand(A, func, "a", grouped=True, allowed=allowed)
    sb = ab_operand(B, func, "b", grouped=True, allowed=allowed)
    if sa.major != "K" or sb.major != "K":
        raise arg_error(func, "a" if sa.major != "K" else "b", "K-major A and B", "an MN-major operand")
    groups, max_m, k = int(sa.groups or 0), sa.mn, sa.k
    if sb.groups != groups or sb.k != k:
        raise arg_error(func, "b", f"shape (G, N, K) with G = {groups}, K = {k} (from a)", B)
    n = sb.mn
    check_out(dd, func, (groups, max_m, n), (BF16,))
    if min(groups, max_m, n, k) <= 0:
        raise arg_error(func, "a", "G, MAX_M, N and K all > 0", A)
    disable = bool_arg(func, "disable_ue8m0_cast", disable_ue8m0_cast)
    mm = _masked_common(func, masked_m, expected_m, groups, max_m)
    ga, gka, gb, gkb = cuda_recipes(func, sfa, sfb, recipe, recipe_a, recipe_b, profile)
    if profile.arch_major == 9 and gb == 1:
        # Note: sm90's masked kernel is 1D2D only (see m_grouped_fp8_fp4_gemm_nt_contiguous).
        raise arg_error(func, "recipe", "a per-block SFB (gran_n 128) for sm90's 1D2D grouped kernels",
                        f"gran_n {gb}")
    scales_a = resolve_scales(func, "a[1]", sfa, max_m, k, ga, gka, groups, profile, is_b=False,
                              disable_ue8m0_cast=disable)
    scales_b = resolve_scales(func, "b[1]", sfb, n, k, gb, gkb, groups, profile, is_b=True,
                              disable_ue8m0_cast=disable)

    def make(g: int, rows: int) -> tuple[core.Operand, core.Operand]:
        return (sa.operand(scales_a, gka, group=g, rows=(0, rows)), sb.operand(scales_b, gkb, group=g))

    _masked_tasks(func, dd, mm, make, fm.BF16)


def _m_grouped_bf16_masked(a: Any, b: Any, d: Any, masked_m: Any, expected_m: int,
                           compiled_dims: str = "nk") -> None:
    """BF16 m-grouped masked GEMM: d[g, r] = bf16(A[g, r] @ B[g]^T) for r < masked_m[g].

    a (G, MAX_M, K) and b (G, N, K) bfloat16, both K-major (sm90: K % 64 == 0); d (G, MAX_M, N)
    bfloat16; masked_m int32 contiguous (G,), 0 <= masked_m[g] <= MAX_M; expected_m > 0 (a
    hint).  float32 accumulation, one rounding.  Rows r >= masked_m[g] are left untouched.
    """
    func = "m_grouped_bf16_gemm_nt_masked"
    profile = get_profile()
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
    check_out(dd, func, (groups, max_m, n), (BF16,))
    if min(groups, max_m, n, k) <= 0:
        raise arg_error(func, "a", "G, MAX_M, N and K all > 0", A)
    if profile.arch_major == 9 and k % 64:
        raise arg_error(func, "a", "K divisible by 64 on sm90", f"K = {k}")
    mm = _masked_common(func, masked_m, expected_m, groups, max_m)

    def make(g: int, rows: int) -> tuple[core.Operand, core.Operand]:
        return core.Operand(A[g, :rows]), core.Operand(B[g])

    _masked_tasks(func, dd, mm, make, fm.BF16)


_MASKED_MISSING = {"deepgemm-ascend": "DeepGEMM-Ascend provides no masked grouped GEMM"}
m_grouped_fp8_fp4_gemm_nt_masked = profiled("m_grouped_fp8_fp4_gemm_nt_masked", _MASKED_MISSING,
                                            deepgemm=_m_grouped_fp8_masked)
# DeepGEMM registers the FP8 name as the same object; the fp8_m_grouped / bf16_m_grouped names
# are its legacy Python aliases.
m_grouped_fp8_gemm_nt_masked = m_grouped_fp8_fp4_gemm_nt_masked
fp8_m_grouped_gemm_nt_masked = m_grouped_fp8_fp4_gemm_nt_masked
m_grouped_bf16_gemm_nt_masked = profiled("m_grouped_bf16_gemm_nt_masked", _MASKED_MISSING,
                                         deepgemm=_m_grouped_bf16_masked)
bf16_m_grouped_gemm_nt_masked = m_grouped_bf16_gemm_nt_masked


# ----------------------------------------------------------------------------------------------
# k-grouped
# ----------------------------------------------------------------------------------------------

@dataclass
class _KGroups:
    """Validated K groups: per group (first K row, end K row); real sizes k1 - k0."""

    ranges: list[tuple[int, int]]
    sum_k: int


def _k_groups_cuda(func: str, gl: np.ndarray, ks: list[int] | None, sum_k_rows: int, k_alignment: int,
                   psum: bool) -> _KGroups:
    """DeepGEMM's check_k_grouped_args plus the layout's own consistency (spec 7.3)."""
    groups = gl.size
    synced = bool(ks)
    if synced:
        assert ks is not None
        if len(ks) != groups:
            raise arg_error(func, "ks_cpu", f"{groups} entries (one per group of grouped_layout)", repr(ks))
        bad = [k for k in ks if k < 0 or k % k_alignment]
        if bad:
            raise arg_error(func, "ks_cpu", f"non-negative multiples of the K alignment {k_alignment}", repr(ks))
        sum_k = sum(ks)
    else:
        if not psum:
            raise arg_error(func, "ks_cpu", "the per-group K sizes (None or [] needs use_psum_layout=True)",
                            repr(ks))
        sum_k = sum_k_rows
    ranges: list[tuple[int, int]] = []
    if psum:
        prev = 0
        for g, end in enumerate(gl.tolist()):
            start = align(prev, k_alignment) if g else 0
            if end < start:
                raise arg_error(func, "grouped_layout",
                                f"psum K end offsets with end[g] >= align(end[g-1], {k_alignment})",
                                f"{gl.tolist()} (group {g}: end {end} < start {start})")
            ranges.append((start, end))
            prev = end
        if ranges and ranges[-1][1] > sum_k:
            raise arg_error(func, "grouped_layout", f"end offsets <= SUM_K = {sum_k}", repr(gl.tolist()))
        if synced:
            assert ks is not None
            want = [align(e - s, k_alignment) for s, e in ranges]
            if want != list(ks):
                # Note: DeepGEMM does not compare them; ks_cpu must hold the aligned group sizes
                # (what its tests pass), otherwise the host and the device disagree on SUM_K.
                raise arg_error(func, "ks_cpu", f"the aligned group sizes of grouped_layout {want}", repr(ks))
    else:
        assert ks is not None
        if gl.tolist() != list(ks):
            # Note: the device reads the sizes from grouped_layout and the host from ks_cpu;
            # DeepGEMM does not compare them, here they must be equal.
            raise arg_error(func, "grouped_layout", f"the K sizes of ks_cpu {list(ks)}", repr(gl.tolist()))
        start = 0
        for k in ks:
            ranges.append((start, start + k))
            start += k
    return _KGroups(ranges, sum_k)


def _k_groups_ascend(func: str, gl: np.ndarray, ks: list[int] | None, sum_k: int) -> _KGroups:
    """DeepGEMM-Ascend: psum K end offsets, groups start on 256-aligned K rows (port 2.4)."""
    if (gl < 0).any():
        raise arg_error(func, "grouped_layout", "non-negative end offsets", repr(gl.tolist()))
    ranges: list[tuple[int, int]] = []
    prev = 0
    for g, end in enumerate(gl.tolist()):
        start = align(prev, ASCEND_MK_ALIGNMENT) if g else 0
        if end < start:
            if end != prev:
                raise arg_error(func, "grouped_layout",
                                f"psum K end offsets with end[g] >= align(end[g-1], {ASCEND_MK_ALIGNMENT}) "
                                "or end[g] == end[g-1] (an empty group)",
                                f"{gl.tolist()} (group {g}: end {end} < start {start})")
            start = end  # an empty group
        if end > sum_k:
            raise arg_error(func, "grouped_layout", f"end offsets <= K = {sum_k} (the rows of a and b)",
                            repr(gl.tolist()))
        ranges.append((start, end))
        prev = end
    if ks:
        if len(ks) != gl.size:
            raise arg_error(func, "ks_cpu", f"None or {gl.size} entries (one per group)", repr(ks))
        for g, (s, e) in enumerate(ranges):
            if ks[g] not in (e - s, align(e - s, ASCEND_MK_ALIGNMENT)):
                # Note: DeepGEMM-Ascend only averages ks_cpu for its tile heuristic; here each
                # entry must be the group's K size (exact or 256-aligned) so that a mismatch is caught.
                raise arg_error(func, "ks_cpu", "each group's K size (exact or aligned to 256) from grouped_layout",
                                f"{ks} (group {g} has K = {e - s})")
    return _KGroups(ranges, sum_k)


def _k_grouped_c(func: str, c: Any, dd: np.ndarray) -> np.ndarray:
    """c is required (both targets assert it): validated, returned as a snapshot."""
    if c is None:
        raise arg_error(func, "c", "an accumulator (k-grouped GEMMs require c; pass d itself to accumulate in place)",
                        "None")
    return snapshot_c(c, dd, func)[0]


def _cuda_k_grouped_scales(func: str, arg: str, sf: np.ndarray | None, mn: int, gl_arr: np.ndarray,
                           ks: list[int] | None, gran_k: int, k_alignment: int, psum: bool,
                           kg: _KGroups) -> list[np.ndarray]:
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


def _k_grouped_fp8_cuda(func: str, a: Any, b: Any, d: Any, ks_cpu: Any, grouped_layout: Any, c: Any,
                        recipe: Any, compiled_dims: Any, use_psum_layout: Any, *, flat_nt: bool) -> None:
    """DeepGEMM's k-grouped FP8 GEMMs: TN (sm100, spec 7.3) and flat NT (sm90, spec 7.4)."""
    profile = get_profile()
    check_compiled_dims(func, compiled_dims)
    r3 = recipe_arg(func, "recipe", recipe, 3)
    psum = bool_arg(func, "use_psum_layout", use_psum_layout)
    if r3 is None or r3[0] != 1 or r3[1] != 1:
        raise arg_error(func, "recipe", "(1, 1, gran_k) (the 1D1D kernel)", repr(recipe))
    gran_k = r3[2]
    if flat_nt:
        if r3 != (1, 1, 128):
            raise arg_error(func, "recipe", "(1, 1, 128)", repr(recipe))
        if psum:
            raise arg_error(func, "use_psum_layout", "False (no psum layout for the FP8 NT k-grouped GEMM)", "True")
        k_alignment = 128
    else:
        if gran_k not in (32, 128):
            raise arg_error(func, "recipe", "gran_k 32 or 128", repr(recipe))
        k_alignment = current_mk_alignment()
        if k_alignment <= 0 or k_alignment % 32:
            raise arg_error(func, "recipe", "a K alignment (get_mk_alignment_for_contiguous_layout()) that is a "
                            "positive multiple of 32", repr(k_alignment))
    A, sfa = as_pair(a, func, "a", sf_optional=True)
    B, sfb = as_pair(b, func, "b", sf_optional=True)
    dd = as_array(d, func, "d")
    if dd.ndim != 3:
        raise arg_error(func, "d", "a 3-D array (G, M, N)", dd)
    groups, m, n = dd.shape
    gl = int32_vector(func, "grouped_layout", grouped_layout, groups, "one entry per group of d")
    ks = ks_list(func, ks_cpu)
    if flat_nt and not ks:
        raise arg_error(func, "ks_cpu", "the per-group K sizes (required by the FP8 NT k-grouped GEMM)", repr(ks_cpu))
    for name, x in (("a", A), ("b", B)):
        if x.dtype != E4M3:
            raise arg_error(func, f"{name}[0]", "dtype float8_e4m3fn", x)
        if not is_contiguous(x):
            raise arg_error(func, f"{name}[0]", "a contiguous array", x)
    if flat_nt:
        kg = _k_groups_cuda(func, gl, ks, 0, k_alignment, False)
        if A.size != kg.sum_k * m or B.size != kg.sum_k * n:
            raise arg_error(func, "a", f"flat buffers of SUM_K * M = {kg.sum_k * m} and SUM_K * N = {kg.sum_k * n} "
                            "elements", f"{A.size} and {B.size} elements")
    else:
        if A.ndim != 2 or B.ndim != 2:
            raise arg_error(func, "a", "2-D (SUM_K, M) and (SUM_K, N) operands", A if A.ndim != 2 else B)
        kg = _k_groups_cuda(func, gl, ks, A.shape[0], k_alignment, psum)
        if A.shape != (kg.sum_k, m) or B.shape != (kg.sum_k, n):
            raise arg_error(func, "a", f"a (SUM_K, M) = ({kg.sum_k}, {m}) and b (SUM_K, N) = ({kg.sum_k}, {n})",
                            f"{A.shape} and {B.shape}")
    if not is_contiguous(dd):
        raise arg_error(func, "d", "a contiguous array", dd)
    check_out(dd, func, (groups, m, n), (F32,) if flat_nt else OUT_DTYPES)
    c_val = _k_grouped_c(func, c, dd)
    ca = as_array(c, func, "c")
    if not is_contiguous(ca):
        raise arg_error(func, "c", "a contiguous array", ca)
    if flat_nt and profile.arch_major != 9:
        raise arg_error(func, "d", "an sm90 device (Unsupported architecture: the FP8 NT k-grouped GEMM is sm90-only; "
                        "use k_grouped_fp8_gemm_tn_contiguous on sm100)", f"profile {profile.name}")
    if not flat_nt and profile.arch_major != 10:
        raise arg_error(func, "d", "an sm100 device (Unsupported architecture: the FP8 TN k-grouped GEMM is "
                        "sm100-only; use k_grouped_fp8_gemm_nt_contiguous on sm90)", f"profile {profile.name}")
    if m == 0 or n == 0:
        execute(func, dd, [])
        return
    if kg.sum_k == 0:
        execute(func, dd, [], fill=[((slice(None),), c_val)])
        return
    out = OUT_FORMAT[dd.dtype]
    tasks: list[Task] = []
    fill: list[tuple[tuple[Any, ...], np.ndarray]] = []
    if flat_nt:
        for name, sf, mn in (("a[1]", sfa, m), ("b[1]", sfb, n)):
            if sf is None or sf.dtype != F32 or sf.ndim != 2 or sf.shape != (mn, kg.sum_k // 128):
                raise arg_error(func, name, f"float32 SFs of shape ({mn}, SUM_K / 128 = {kg.sum_k // 128})", sf)
        assert sfa is not None and sfb is not None
        sva = sf_values(sfa, m, kg.sum_k, 1, 128, func=func, arg="a[1]")
        svb = sf_values(sfb, n, kg.sum_k, 1, 128, func=func, arg="b[1]")
        flat_a, flat_b = A.reshape(-1), B.reshape(-1)
        for g, (k0, k1) in enumerate(kg.ranges):
            if k1 == k0:
                fill.append(((g,), c_val[g]))
                continue
            a_g = flat_a[m * k0:m * k1].reshape(m, k1 - k0)
            b_g = flat_b[n * k0:n * k1].reshape(n, k1 - k0)
            tasks.append(Task(core.Operand(a_g, sva[:, k0 // 128:k1 // 128], 128),
                              core.Operand(b_g, svb[:, k0 // 128:k1 // 128], 128),
                              core.OutputStage(out, None, c_val[g]), (g,)))
    else:
        scales_a = _cuda_k_grouped_scales(func, "a[1]", sfa, m, gl.astype(np.int32), ks, gran_k, k_alignment, psum, kg)
        scales_b = _cuda_k_grouped_scales(func, "b[1]", sfb, n, gl.astype(np.int32), ks, gran_k, k_alignment, psum, kg)
        for g, (k0, k1) in enumerate(kg.ranges):
            if k1 == k0:
                fill.append(((g,), c_val[g]))
                continue
            # Note: with the psum layout the kernel's MMA also consumes the gap rows
            # [end_g, align(end_g, 32)) (128 when the alignment is a multiple of 128), which the
            # contract requires to be zero; only the group's rows [start_g, end_g) are used here.
            tasks.append(Task(core.Operand(A[k0:k1].T, scales_a[g], gran_k),
                              core.Operand(B[k0:k1].T, scales_b[g], gran_k),
                              core.OutputStage(out, None, c_val[g]), (g,)))
    execute(func, dd, tasks, fill=fill)


def _k_grouped_bf16_cuda(a: Any, b: Any, d: Any, ks_cpu: Any, grouped_layout: Any, c: Any = None,
                         compiled_dims: str = "mn", use_psum_layout: bool = False) -> None:
    """BF16 k-grouped GEMM: d[g] = c[g] + A_g^T @ B_g (float32 accumulation).

    a (SUM_K, M), b (SUM_K, N) bfloat16 contiguous; d, c (G, M, N) contiguous, float32 (or
    bfloat16: bf16(c + bf16(acc))); c is required (pass d itself to accumulate in place).
    ks_cpu: per-group K sizes, multiples of get_mk_alignment_for_contiguous_layout() (a multiple
    of 32), or None / [] with use_psum_layout=True; grouped_layout int32 (G,): the same sizes, or
    psum END offsets along K (group g uses rows [align(end[g-1], alignment), end[g])).
    sm90: no psum, ks_cpu required, every K size a multiple of 128.  Empty groups keep c[g].
    """
    func = "k_grouped_bf16_gemm_tn_contiguous"
    profile = get_profile()
    check_compiled_dims(func, compiled_dims)
    psum = bool_arg(func, "use_psum_layout", use_psum_layout)
    A = as_array(a, func, "a")
    B = as_array(b, func, "b")
    dd = as_array(d, func, "d")
    if dd.ndim != 3:
        raise arg_error(func, "d", "a 3-D array (G, M, N)", dd)
    groups, m, n = dd.shape
    k_alignment = current_mk_alignment()
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
    kg = _k_groups_cuda(func, gl, ks, A.shape[0], k_alignment, psum)
    if A.shape != (kg.sum_k, m) or B.shape != (kg.sum_k, n):
        raise arg_error(func, "a", f"a (SUM_K, M) = ({kg.sum_k}, {m}) and b (SUM_K, N) = ({kg.sum_k}, {n})",
                        f"{A.shape} and {B.shape}")
    if not is_contiguous(dd):
        raise arg_error(func, "d", "a contiguous array", dd)
    check_out(dd, func, (groups, m, n), OUT_DTYPES)
    c_val = _k_grouped_c(func, c, dd)
    ca = as_array(c, func, "c")
    if not is_contiguous(ca):
        raise arg_error(func, "c", "a contiguous array", ca)
    if profile.arch_major == 9:
        if psum or not ks:
            raise arg_error(func, "use_psum_layout", "False with ks_cpu given (sm90 has no psum k-grouped kernel)",
                            f"use_psum_layout={psum}, ks_cpu={ks_cpu!r}")
        if any(k % 128 for k in ks):
            raise arg_error(func, "ks_cpu", "K sizes divisible by 128 on sm90", repr(ks))
    if m == 0 or n == 0:
        execute(func, dd, [])
        return
    out = OUT_FORMAT[dd.dtype]
    tasks: list[Task] = []
    fill: list[tuple[tuple[Any, ...], np.ndarray]] = []
    for g, (k0, k1) in enumerate(kg.ranges):
        if k1 == k0:
            fill.append(((g,), c_val[g]))
            continue
        # Note: as for the FP8 version, psum gap rows the MMA consumes are not used here.
        tasks.append(Task(core.Operand(A[k0:k1].T), core.Operand(B[k0:k1].T), core.OutputStage(out, None, c_val[g]),
                          (g,)))
    execute(func, dd, tasks, fill=fill)


def _ascend_k_grouped(func: str, a: Any, b: Any, d: Any, ks_cpu: Any, grouped_layout: Any, c: Any, recipe: Any,
                      compiled_dims: Any, use_psum_layout: Any, epilogue: Any, *, fp8: bool) -> None:
    """DeepGEMM-Ascend's k-grouped GEMMs (port 1.5, 2.4): a (K, M), b (K, N), psum only."""
    check_compiled_dims(func, compiled_dims)
    profile = get_profile()
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
        if sa.is_fp4 and not sb.is_fp4:
            raise arg_error(func, "a", _ASCEND_MIXES, "FP4 A with FP8 B")
    else:
        for name, x in (("a", A), ("b", B)):
            if x.dtype != BF16:
                raise arg_error(func, name, "dtype bfloat16", x)
        sa = OperandSpec(A, major_of(A, func, "a"), False, A.shape[0], A.shape[1])
        sb = OperandSpec(B, major_of(B, func, "b"), False, B.shape[0], B.shape[1])
    k = sa.k
    # An empty K (every group empty) has no memory layout to check: d := c, as the spec says.
    if k and (sa.major != "MN" or sb.major != "MN"):
        raise arg_error(func, "a" if sa.major != "MN" else "b",
                        "a (K, M) and b (K, N) row-major (MN-major after the transposition)", "a K-major operand")
    if (sa.mn, sb.mn, sb.k) != (m, n, k):
        raise arg_error(func, "b", f"a (K, M) = ({k}, {m}) and b (K, N) = ({k}, {n}) to match d {dd.shape}",
                        f"a {sa.data.shape[::-1]} and b {sb.data.shape[::-1]}")
    check_out(dd, func, (groups, m, n), OUT_DTYPES)
    if not bool_arg(func, "use_psum_layout", use_psum_layout):
        raise arg_error(func, "use_psum_layout", "True (DeepGEMM-Ascend supports only the psum layout)", "False")
    gl = int32_vector(func, "grouped_layout", grouped_layout, groups, "psum K end offsets, one per group")
    ks = ks_list(func, ks_cpu)
    alpha = alpha_of(func, None, epilogue)
    c_val = _k_grouped_c(func, c, dd)
    # Note: the newer DeepGEMM-Ascend (787919d) asserts that c is d; the snapshot copies a
    # separate c into d first.  Both are accepted (same result).
    kg = _k_groups_ascend(func, gl, ks, k)
    scales_a = scales_b = None
    gka = 32
    if fp8:
        ga, gka, gb, gkb = ascend_recipes(func, recipe, None, None)
        if m and n and k:
            sfa_r = _sfa_k_gaps(sfa, gl, k)
            sfb_r = _sfa_k_gaps(sfb, gl, k)
            scales_a = resolve_scales(func, "a[1]", sfa_r, m, k, ga, gka, None, profile, is_b=False)
            scales_b = resolve_scales(func, "b[1]", sfb_r, n, k, gb, gkb, None, profile, is_b=True)
    if m == 0 or n == 0:
        execute(func, dd, [])
        return
    if k == 0:
        execute(func, dd, [], fill=[((slice(None),), c_val)])
        return
    out = OUT_FORMAT[dd.dtype]
    tasks: list[Task] = []
    fill: list[tuple[tuple[Any, ...], np.ndarray]] = []
    for g, (k0, k1) in enumerate(kg.ranges):
        if k1 <= k0:
            fill.append(((g,), c_val[g]))
            continue
        ep = core.OutputStage(out, alpha, c_val[g])
        if fp8:
            assert scales_a is not None and scales_b is not None
            # group starts are 256-aligned: whole scale blocks
            tasks.append(Task(sa.operand(scales_a, gka, k_range=(k0, k1)), sb.operand(scales_b, gka, k_range=(k0, k1)),
                              ep, (g,)))
        else:
            tasks.append(Task(core.Operand(A[:, k0:k1]), core.Operand(B[:, k0:k1]), ep, (g,)))
    execute(func, dd, tasks, fill=fill)


def _sfa_k_gaps(sf: np.ndarray | None, ends: np.ndarray, k: int) -> np.ndarray | None:
    """float32 k-grouped SFs (mn rows, K blocks) with the K-gap blocks the transform zeroes set to 0.0."""
    if sf is None or sf.dtype != F32 or sf.ndim != 2 or sf.shape[1] != ceil_div(k, 32):
        return sf
    keep = ascend_gap_mask(ends, sf.shape[1], 32, ASCEND_MK_ALIGNMENT)
    if keep.all():
        return sf
    return np.where(keep[None, :], sf, np.float32(0.0))


def _make_k_grouped_fp8(layout: str) -> tuple[Callable[..., None], Callable[..., None]]:
    """(DeepGEMM impl, DeepGEMM-Ascend impl) of k_grouped_fp8_gemm_{layout}_contiguous."""
    name = f"k_grouped_fp8_gemm_{layout}_contiguous"

    def cuda(a: Any, b: Any, d: Any, ks_cpu: Any, grouped_layout: Any, c: Any = None,
             recipe: tuple[int, int, int] = (1, 1, 128), compiled_dims: str = "mn",
             use_psum_layout: bool = False) -> None:
        _k_grouped_fp8_cuda(name, a, b, d, ks_cpu, grouped_layout, c, recipe, compiled_dims, use_psum_layout,
                            flat_nt=layout == "nt")

    def ascend(a: Any, b: Any, d: Any, ks_cpu: Any, grouped_layout: Any, c: Any = None,
               recipe: tuple[int, int, int] = (1, 1, 32), compiled_dims: str = "mn",
               use_psum_layout: bool = True, epilogue: Any = None) -> None:
        if layout == "nt":
            warnings.warn("Calling k_grouped_fp8_gemm_nt_contiguous is deprecated, please transpose a, b into "
                          "[k, m] and [k, n] shape and call `k_grouped_fp8_gemm_tn_contiguous` instead",
                          DeprecationWarning, stacklevel=3)
            a = transposed_pair(a, name, "a", (0, 1))
            b = transposed_pair(b, name, "b", (0, 1))
        _ascend_k_grouped(name, a, b, d, ks_cpu, grouped_layout, c, recipe, compiled_dims, use_psum_layout, epilogue,
                          fp8=True)

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


def _k_grouped_bf16_ascend(a: Any, b: Any, d: Any, ks_cpu: Any, grouped_layout: Any, c: Any = None,
                           compiled_dims: str = "mn", use_psum_layout: bool = True, epilogue: Any = None) -> None:
    """BF16 k-grouped GEMM (DeepGEMM-Ascend): d[g] = c[g] + [alpha *] A_g^T @ B_g.

    a (K, M), b (K, N) bfloat16 row-major; grouped_layout int32 psum END offsets along K (group
    g uses rows [align(end[g-1], 256), end[g])); ks_cpu None or the groups' K sizes; d, c
    (G, M, N) bfloat16 or float32, c required (may be d); epilogue Identity() or Alpha(alpha).
    """
    _ascend_k_grouped("k_grouped_bf16_gemm_tn_contiguous", a, b, d, ks_cpu, grouped_layout, c, None, compiled_dims,
                      use_psum_layout, epilogue, fp8=False)


_kg_tn_cuda, _kg_tn_ascend = _make_k_grouped_fp8("tn")
_kg_nt_cuda, _kg_nt_ascend = _make_k_grouped_fp8("nt")
k_grouped_fp8_gemm_tn_contiguous = profiled("k_grouped_fp8_gemm_tn_contiguous", deepgemm=_kg_tn_cuda,
                                            deepgemm_ascend=_kg_tn_ascend)
k_grouped_fp8_gemm_nt_contiguous = profiled("k_grouped_fp8_gemm_nt_contiguous", deepgemm=_kg_nt_cuda,
                                            deepgemm_ascend=_kg_nt_ascend)
k_grouped_bf16_gemm_tn_contiguous = profiled("k_grouped_bf16_gemm_tn_contiguous", deepgemm=_k_grouped_bf16_cuda,
                                             deepgemm_ascend=_k_grouped_bf16_ascend)
