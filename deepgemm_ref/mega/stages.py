"""The unfused Mega MoE baseline of DeepGEMM's test, stage by stage, as composable functions.

DeepGEMM's ``tests/test_mega_moe.py`` asserts (``torch.equal``) that the fused kernel
(``fp8_fp4_mega_moe``; ``bf16_mega_moe`` in later versions) equals this pipeline on every rank::

    recv_x, _, recv_w, handle, _ = ep_buffer.dispatch(x, topk_idx=..., topk_weights=...,
        num_experts=E, expert_alignment=A, do_cpu_sync=False, do_handle_copy=False,
        do_expand=True, use_tma_aligned_col_major_sf=True)          # DeepEP ElasticBuffer, FP8
    psum = handle.psum_num_recv_tokens_per_expert                   # int32 (E_l,) END rows
    m_grouped_fp8_fp4_gemm_nt_contiguous(recv_x, l1, l1_y, psum, use_psum_layout=True, recipe=(1, 1, 32))
    acts = swiglu_apply_weight_to_fp8(x=l1_y, topk_weights=recv_w, avail_tokens=psum[-1],
        num_per_channels=32, use_col_major_scales=True, round_scale=True, ue8m0_scale=True,
        output_bf16=False, clamp_value=c, fast_math=fm)             # TileLang's op
    m_grouped_fp8_fp4_gemm_nt_contiguous(acts, l2, l2_y, psum, use_psum_layout=True, recipe=(1, 1, 32))
    y = ep_buffer.combine(l2_y, handle=handle)[0]                   # allow_multiple_reduction=False

(the BF16 path: ``m_grouped_bf16_gemm_nt_contiguous`` and the op with ``round_scale=False,
ue8m0_scale=False, output_bf16=True``, whose last output, ``bf16(v)``, feeds the L2 GEMM).

This module gives every stage a golden, on one rank's tensors wherever the stage is local:

* :func:`mega_moe_dispatch` (all ranks at once, a stand-in for DeepEP's expand-mode dispatch:
  one row per routed (token, slot), expert segments aligned to ``expert_alignment``, the psum
  END offsets, the per-row weight; ``deepgemm_ref.ep``'s ``ElasticBuffer`` is the drop-in);
* :func:`mega_moe_grouped_gemm` (one rank: DeepGEMM's psum-layout m-grouped GEMM on
  un-transformed weights, bitwise ``m_grouped_fp8_fp4_gemm_nt_contiguous(...,
  use_psum_layout=True)``);
* :func:`swiglu_apply_weight_to_fp8` (one rank: TileLang's op, see below);
* :func:`mega_moe_combine` (all ranks at once: DeepEP's ``allow_multiple_reduction=False``
  combine under DeepGEMM's profiles, a float32 running sum from +0 in top-k order).

TileLang's ``swiglu_apply_weight_to_fp8`` (``third-party/tilelang_ops`` of DeepGEMM)
------------------------------------------------------------------------------------------
Signature, in DeepGEMM's parameter order: ``(x, topk_weights, avail_tokens, num_per_channels,
use_col_major_scales, round_scale, ue8m0_scale, clamp_value=None, fmt='e4m3', num_sms=None,
output_bf16=False, fast_math=True)``, plus this package's keyword ``semantics``.  DeepGEMM's
test passes everything by keyword, so the order only matters to positional callers.  The data
flow, per row ``r < avail_tokens`` and channel ``j < I`` (rows from ``avail_tokens`` on are not
processed)::

    gate = x[r, j], up = x[r, I + j]                      bf16 values in float32
    up = min(c, max(-c, up)); gate = min(c, gate)          with clamp_value c (float32)
    v = gate / (1 + exp(-gate)) * up * topk_weights[r]     float32 (weight 1 without topk_weights)
    per group of num_per_channels channels: amax = max(max |v|, 1e-4)
        round_scale: sf = 2^ceil(log2(f32(amax / 448))) (exponent bits), inv = 1 / sf exactly;
                     ue8m0_scale stores the byte log2(sf) + 127
        otherwise:   sf = f32(amax / 448), inv = f32(448 / amax)
    y = e4m3(v * inv);  y_bf16 = bf16(v) with output_bf16

Returned: ``(y, y_sf)`` or ``(y, y_sf, y_bf16)``; ``y_sf`` int32 ``(M, ceil(G / 4))`` packed
UE8M0 with strides ``(1, align(M, 4))`` (``ue8m0_scale``), float32 ``(M, G)`` with strides
``(1, align(M, 4))`` (``use_col_major_scales``) or row-major.  Where the signature or layout is
not visible to this package, it follows what DeepGEMM's test passes (above) and what its
consumers read: the psum-layout grouped GEMM takes MN-major TMA-aligned packed UE8M0 scales
(DeepGEMM's layout 2), and ``avail_tokens = psum[-1]`` is a 0-D int32 tensor (an int, a NumPy
integer or a one-element integer array are accepted too).  In an expand-mode dispatch without
CPU sync the received rows past ``psum[-1]`` are the worst-case allocation; the rows between
expert segments (alignment padding) are processed like any other row and never read by the L2
GEMM.

``semantics``: ``"baseline"`` is TileLang's op exactly as above (the 1e-4 amax floor, the float32
clamp); ``"fused"`` (the default, shared with ``deepgemm_ref.mega.swiglu_apply_weight_to_fp8``,
which is this same function) follows the active target's fused kernel (DeepGEMM: no amax floor,
a bf16-rounded clamp value).  The two agree unless a group's amax is below 1e-4 or the clamp
value is not a bf16 value; DeepGEMM's test data meet neither, which is why its bitwise check
holds; a device's TileLang op is checked with ``semantics="baseline"``.  Later versions of the op
add ``alpha=1.0, beta=0.0`` (``exp(-alpha * gate)``, ``up + beta``); this is the version without
them, the one DeepGEMM's Mega MoE test calls.  ``fast_math`` selects approximate exp and division
in TileLang's build; the ``exact`` model rounds the exact SwiGLU value once whatever it says.
"""

from __future__ import annotations

from ._stages import (
    MegaMoEDispatch,
    mega_moe_combine,
    mega_moe_dispatch,
    mega_moe_grouped_gemm,
    swiglu_apply_weight_to_fp8,
)

__all__ = [
    "MegaMoEDispatch",
    "mega_moe_dispatch",
    "mega_moe_grouped_gemm",
    "swiglu_apply_weight_to_fp8",
    "mega_moe_combine",
]
