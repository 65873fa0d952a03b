"""Mega MoE: the fused expert-parallel MoE layer, every EP rank emulated in one process.

DeepGEMM's ``deep_gemm.mega`` under the ``sm100`` profile and DeepGEMM-Ascend's under
``ascend950``, with golden values for every stage.

Quick start (DeepGEMM, 8 ranks)::

    group = EmulatedGroup(8)
    bufs = [get_symm_buffer_for_mega_moe(group.rank(r), E, T, K, H, I) for r in range(8)]
    for r in range(8):                       # every rank's inputs into its own buffer
        bufs[r].x[:N], bufs[r].x_sf[:N] = per_token_cast_to_fp8(x[r], True, 32, True)
        bufs[r].topk_idx[:N], bufs[r].topk_weights[:N] = idx[r], w[r]
    l1, l2 = zip(*(transform_weights_for_mega_moe(l1_raw[r], l2_raw[r]) for r in range(8)))
    for r in range(8):                       # collective: the 8th call computes and writes all y
        fp8_fp4_mega_moe(y[r], l1[r], l2[r], bufs[r], stats[r], activation_clamp=10.0)

The dataflow (R ranks, E experts, ``E_l = E / R`` per rank, top-K, hidden H, intermediate I)
----------------------------------------------------------------------------------------------
For every source rank s, token t < N_s and slot k with a valid expert ``e = topk_idx[s][t, k]``
(DeepGEMM: the id truncated to int32, negative = masked, >= E an error; DeepGEMM-Ascend: any id
outside [0, E) masked), on the expert's rank ``e // E_l`` (local expert ``e % E_l``):

1. L1:   ``h = bf16(x_deq[t] @ W1_deq[e]^T)`` (2I,), x e4m3 and W1 E2M1 with per-32 UE8M0 scales
         (BF16 path: bf16 x and W1).  ``gate = h[:I]``, ``up = h[I:]``.
2. Clamp (``activation_clamp`` c): ``gate = min(gate, cb)``, ``up = clamp(up, -cb, cb)``, cb = bf16(c).
3. SwiGLU: ``v = gate * up * w / (1 + exp(-gate))`` with ``w = topk_weights[s][t, k]`` (no w for
         DeepGEMM-Ascend's shared experts), a float32 value (see "Accumulation models").
4. FP8 re-quantisation per 32 channels: ``sf = 2^ceil(log2(amax / 448))``, ``q = e4m3(v / sf)``
         (DeepGEMM: no amax floor, amax 0 gives SF byte 0; DeepGEMM-Ascend: amax floored at 1e-4,
         byte 105 for amax 0).  BF16 path: ``q = bf16(v)``.
5. L2:   ``o = bf16(q_deq @ W2_deq[e]^T)`` (H,), sent to combine slot (s, t, k).
6. Combine on rank s, over the valid slots in increasing k (DeepGEMM-Ascend: then the
         shared-expert slot, whose S shared experts form one wide expert of S * I channels
         computed on rank s).  DeepGEMM: ``F = +0; F = f32(F + o_k)``, ``y[t] = bf16(F)``, the
         order DeepGEMM's test asserts bitwise (the fused kernel equals DeepEP's
         ``allow_multiple_reduction=False`` combine); DeepGEMM-Ascend, whose combine order no
         source shows: ``y[t] = bf16(exact sum of the o)``.  A token without valid slots gives +0.
7. Stats: ``cumulative_local_expert_recv_stats[i] += routes received by local expert i`` (int32,
         wrapping); DeepGEMM-Ascend also writes ``sym_buffer.expert_recv_count[s, i]``.

Accumulation models (``deepgemm_ref.numerics(accumulation=...)``)
--------------------------------------------------------------------
``exact`` (default; golden values): the roundings the dataflow defines are applied to exact
values and nothing else: L1 = bf16 of the exact dot product; v = float32 of the exact SwiGLU
value, rounded once (certified float64 evaluation with an exact rational / ``decimal``
fallback: ``_swiglu.swiglu_exact`` states and proves it); FP8 re-quantisation by the target's
bit recipe; L2 = bf16 of the exact dot product; y = the combine of step 6 (DeepGEMM: the
specified float32 order; DeepGEMM-Ascend: bf16 of the exact sum).  ``fast_math`` is recorded and
has no effect.
``fp32``: the kernels' float32 order: every GEMM as the core's fp32 model (per 32-element block
partial sums in float32, block scales, float32 accumulator), SwiGLU in float32 operations with a
correctly rounded expf (and the reciprocal-then-multiply of DeepGEMM's fused kernel under
``fast_math``), the combine as a float32 running sum from +0 (under DeepGEMM's profiles the
same combine as ``exact``: given the same slot outputs both models give the same y; they differ
only through the GEMMs' and SwiGLU's roundings).  ``limited(...)`` applies to the GEMMs; SwiGLU
and the combine then follow ``fp32``.  The devices' ``__expf``, ``rcp.approx`` and
Ascend vector exp/div, and their MMA accumulation orders, are not reproducible bit for bit.

Stage goldens and the trace
---------------------------
The unfused baseline of DeepGEMM's test is available as stage functions, also collected in the
public module :mod:`deepgemm_ref.mega.stages` (which documents each against the op it stands
for): :func:`mega_moe_dispatch` and :func:`mega_moe_combine` over all ranks,
:func:`mega_moe_grouped_gemm` and :func:`swiglu_apply_weight_to_fp8` (TileLang's op) on one
rank's tensors; they compose to the fused result bitwise (by default the SwiGLU stage mirrors the
fused kernel where it differs from TileLang's op: ``semantics="baseline"`` gives the op's amax
floor and float32 clamp).  Each stage takes the previous stage's output, so a device's stage-k
output gives the golden of stage k + 1 conditioned on it.

Under ``deepgemm_ref.trace.capture()`` a completed collective records one ``KernelRecord`` per
rank (in rank order) with ``acc`` = the combine sum before the final bf16 rounding (float64):
under DeepGEMM's profiles the float32 running sum F of step 6, under DeepGEMM-Ascend's the exact
sum; ``S`` = the sum of |slot contributions| (J = slots + shared of them; any float32 combine of
them is within ``gamma_J * S`` of the exact sum; a float32 device pipeline with the same FP8
activations deviates further only through its L2 accumulation, bounded by the ``l2.S`` extra),
under DeepGEMM's profiles times 1 + 2^-12 so that the checker's bounds, centred on F, still
cover a device that adds the same contributions in another float32 order
(``_pipeline.combine_rows`` derives it); and ``extra`` = every stage's golden: for the rank as
expert owner, in its dispatch order (expert by expert, routes in (source rank, token, slot)
order) ``dispatch.src`` (M, 3), ``dispatch.psum`` (E_l,) END offsets, ``dispatch.topk_weights`` (M,),
``l1.output`` bf16 (M, 2I) [gate | up], ``swiglu.output`` float32 (M, I), ``l2.acts`` e4m3 (M, I)
(bf16 on the BF16 path), ``l2.acts_sf`` UE8M0 bytes (M, I / 32), ``l2.output`` bf16 (M, H),
``l1.acc``/``l2.acc`` and ``l1.S``/``l2.S`` when the capture wants them; for the rank as token
source ``combine.input`` bf16 (N, slots, H), ``shared.*`` (DeepGEMM-Ascend) and ``y``.  Every
stage runs as a labelled executor task or fill (:mod:`deepgemm_ref.executor`), and the record's
``tasks`` lists them: per expert of the rank ``"rank r expert i: dispatch"``, ``": L1 GEMM"``,
``": SwiGLU"``, ``": L2 GEMM"``, ``": to the combine"``, the same for ``"rank r shared expert"``
(DeepGEMM-Ascend), then the writes of the rank's outputs (``"rank r: combine into y"``, ...).
The stage functions' records come from the executor as well.

Memory
------
Every symmetric buffer above 64 MiB is an anonymous memory map: the default DeepGEMM buffer of
several GiB per rank costs only the pages the inputs touch.  The emulator never writes the ring
scratch views (``l1_acts``, ``l2_acts`` and their SFs): their contents on a device depend on the
scheduling.
"""

from __future__ import annotations

from ..api import profiled
from . import stages  # the public module of the stage functions
from ._buffer import (
    SymmBuffer,
    get_ring_limit_for_mega_moe,
    get_symm_buffer_for_mega_moe,
    get_symm_buffer_size_for_mega_moe,
    get_token_alignment_for_mega_moe,
)
from ._group import EmulatedRank
from ._kernels import EmulatedGroup, bf16_mega_moe, fp8_fp4_mega_moe
from ._layout import BLOCK_N
from ._stages import (
    MegaMoEDispatch,
    mega_moe_combine,
    mega_moe_dispatch,
    mega_moe_grouped_gemm,
    swiglu_apply_weight_to_fp8,
)
from ._weights import inverse_ascend, inverse_cuda, transform_ascend, transform_cuda

__all__ = [
    "SymmBuffer",
    "get_symm_buffer_for_mega_moe",
    "transform_weights_for_mega_moe",
    "inverse_transform_weights_for_mega_moe",
    "fp8_fp4_mega_moe",
    "bf16_mega_moe",
    "get_token_alignment_for_mega_moe",
    "get_ring_limit_for_mega_moe",
    "get_symm_buffer_size_for_mega_moe",
    "EmulatedGroup",
    "EmulatedRank",
    "MegaMoEDispatch",
    "mega_moe_dispatch",
    "mega_moe_grouped_gemm",
    "swiglu_apply_weight_to_fp8",
    "mega_moe_combine",
    "stages",
    "BLOCK_N",
    "_mega_moe_block_n",
]

# Note: EmulatedGroup, the stage functions (mega_moe_dispatch, mega_moe_grouped_gemm,
# swiglu_apply_weight_to_fp8, mega_moe_combine) and inverse_transform_weights_for_mega_moe are this
# package's additions: DeepGEMM has no process-group emulation and its baseline ops live in DeepEP
# and TileLang outside the library.

#: DeepGEMM-Ascend's ``_C._mega_moe_block_n`` (= ``deep_gemm.mega.BLOCK_N``).
_mega_moe_block_n = BLOCK_N

transform_weights_for_mega_moe = profiled("transform_weights_for_mega_moe", None, deepgemm=transform_cuda,
                                          deepgemm_ascend=transform_ascend)
# Not a DeepGEMM name: the exact inverse of each target's transform (identity on bytes).
inverse_transform_weights_for_mega_moe = profiled("inverse_transform_weights_for_mega_moe", None,
                                                  deepgemm=inverse_cuda, deepgemm_ascend=inverse_ascend)
