"""Grouped GEMMs: m-grouped contiguous (m_indices and psum layouts), m-grouped masked, k-grouped.

Every function is DeepGEMM's (or, under the ``ascend950`` profile, DeepGEMM-Ascend's) public
function of the same name: same parameters and defaults, output written in place into ``d``,
``None`` returned.  A grouped call is a set of dense GEMMs, one executor task on one group's rows
(or, k-grouped, one group's K range), with the dense kernels' scale and epilogue rules (see
:mod:`deepgemm_ref.gemm`)::

    m-grouped:  d[r, :]  = out( sum_k A[r, k] sa[r, k // ga] * B[g(r)][:, k] sb[g(r)][:, k // gb] )
    masked:     d[g, r]  = out( A[g, r] @ B[g]^T )            for r < masked_m[g]
    k-grouped:  d[g]     = epilogue( sum_{k in K_g} outer(A[k, :] sa, B[k, :] sb) ; c[g] )

``out`` is one rounding of the accumulator to ``d``'s dtype (bfloat16, or float32 under
DeepGEMM-Ascend), ``alpha`` (DeepGEMM-Ascend's ``Alpha`` epilogue) multiplies the float32
accumulator first, and k-grouped outputs add ``c`` as the dense kernels do (bf16 ``d``:
``bf16(c + bf16(acc))``; float32 ``d``: ``f32(c + acc)``).  The accumulator follows the active
accumulation model (``exact`` by default: golden values).

Rooms: :mod:`.contiguous` (m-grouped contiguous), :mod:`.masked` (m-grouped masked),
:mod:`.k_grouped` (k-grouped); the layouts are parsed by :mod:`deepgemm_ref.layout.groups`.
Each kernel reads check -> tasks -> execute: a ``_check_*`` step validates the call for the
profile the dispatcher hands it and returns a request (an :class:`~deepgemm_ref.executor.Request`
carrying the layout plan: runs or K groups, defined and zero rows, the operands and their scales,
the snapshot of ``c``; nothing computed or written), a ``_tasks`` step states the math as one
executor task per run or group (and a fill per empty k-group or empty-K early return), and
:func:`deepgemm_ref.executor.execute` runs them into ``d`` and the trace (one record per call,
listing the tasks' labels).

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
the targets' tests require to read as zero (zeros for m_indices == -1 rows, and for psum padding rows when
ensure_zero_padding=True):

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

from .contiguous import (
    m_grouped_bf16_gemm_nn_contiguous,
    m_grouped_bf16_gemm_nt_contiguous,
    m_grouped_fp8_fp4_gemm_nn_contiguous,
    m_grouped_fp8_fp4_gemm_nt_contiguous,
    m_grouped_fp8_gemm_nn_contiguous,
    m_grouped_fp8_gemm_nt_contiguous,
)
from .k_grouped import (
    k_grouped_bf16_gemm_tn_contiguous,
    k_grouped_fp8_gemm_nt_contiguous,
    k_grouped_fp8_gemm_tn_contiguous,
)
from .masked import (
    bf16_m_grouped_gemm_nt_masked,
    fp8_m_grouped_gemm_nt_masked,
    m_grouped_bf16_gemm_nt_masked,
    m_grouped_fp8_fp4_gemm_nt_masked,
    m_grouped_fp8_gemm_nt_masked,
)

__all__ = [
    "m_grouped_fp8_fp4_gemm_nt_contiguous", "m_grouped_fp8_fp4_gemm_nn_contiguous",
    "m_grouped_fp8_gemm_nt_contiguous", "m_grouped_fp8_gemm_nn_contiguous",
    "m_grouped_bf16_gemm_nt_contiguous", "m_grouped_bf16_gemm_nn_contiguous",
    "m_grouped_fp8_fp4_gemm_nt_masked", "m_grouped_fp8_gemm_nt_masked", "fp8_m_grouped_gemm_nt_masked",
    "m_grouped_bf16_gemm_nt_masked", "bf16_m_grouped_gemm_nt_masked",
    "k_grouped_fp8_gemm_tn_contiguous", "k_grouped_fp8_gemm_nt_contiguous", "k_grouped_bf16_gemm_tn_contiguous",
]
