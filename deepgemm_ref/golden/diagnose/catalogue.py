"""The catalogue of known port bugs: one record per bug, as data.

Each :class:`Entry` names the bug, the kernels it can affect (``fnmatch`` patterns of public
kernel names), the stage it belongs to (``inputs``, ``layout``, ``call``, ``output``), a one-line
description, the mutation that reproduces it (:mod:`.mutations`), its specificity (how little
of it is fitted to the device's data: 3 a fixed mutation, 1 a model fitted to the device, 0
cells copied from the device output) and, for bugs seen in the wild, the public issues or pull
requests it comes from (``origin`` says where an entry without them was listed).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from . import ep_mutations as ep
from . import mutations as mu

__all__ = ["Entry", "CATALOGUE", "entry", "applicable"]

#: Kernel name patterns.
DENSE_QUANT = ("fp8_gemm_*", "fp8_fp4_gemm_*", "aclnn_fp8_fp4_gemm_*")
GROUPED_QUANT = ("m_grouped_fp8_*", "fp8_m_grouped_*", "k_grouped_fp8_*")
M_CONTIGUOUS = ("m_grouped_*_contiguous",)
MASKED = ("m_grouped_*_masked", "*_m_grouped_gemm_nt_masked")
K_GROUPED = ("k_grouped_*",)
MQA = ("fp8_fp4_mqa_logits", "fp8_fp4_paged_mqa_logits")
MEGA = ("fp8_fp4_mega_moe", "bf16_mega_moe")
EP_DISPATCH = ("ep_dispatch",)
EP_COMBINE = ("ep_combine",)
EP = EP_DISPATCH + EP_COMBINE
#: Where the entries without public sources come from.
ISSUE_18 = "issue 18"
EP_ISSUE = "the DeepEP issue, item 4"
ISSUE_27 = "issue 27"
GEMM_LIKE = ("*gemm*", "einsum", "fp8_einsum")
#: Dense and m-grouped GEMMs: a K loop over operand A's K blocks.
K_LOOP = ("*gemm_nn", "*gemm_nt", "*gemm_tn", "*gemm_tt", "m_grouped_*", "*_m_grouped_gemm_nt_masked")
EVERY = ("*",)


@dataclass(frozen=True)
class Entry:
    """One known port bug (see the module docstring)."""

    name: str
    kernels: tuple[str, ...]
    stage: str
    description: str
    mutation: Callable[[Any], Iterable[Any]]
    specificity: int = 3
    sources: tuple[str, ...] = ()
    origin: str = ISSUE_18

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "kernels": list(self.kernels), "stage": self.stage,
                "description": self.description, "specificity": self.specificity, "sources": list(self.sources),
                "origin": self.origin}


CATALOGUE: tuple[Entry, ...] = (
    Entry("fp4_nibbles_swapped", ("fp8_fp4_gemm_*", "aclnn_fp8_fp4_gemm_*", "fp8_fp4_mqa_logits",
                                  "fp8_fp4_paged_mqa_logits", "fp8_fp4_mega_moe"), "inputs",
          "the two E2M1 codes of every packed FP4 byte swapped (the high nibble read as the even element), "
          "in A or in B", mu.fp4_nibbles_swapped),
    Entry("sf_transposed", DENSE_QUANT + GROUPED_QUANT + ("fp8_einsum",), "layout",
          "a scale-factor buffer read transposed: MN-major memory read as K-major, or the reverse",
          mu.sf_transposed),
    Entry("sf_not_tma_aligned", DENSE_QUANT + GROUPED_QUANT + ("fp8_einsum",), "layout",
          "the MN-major scale-factor buffer's stride not padded to the 16-byte TMA alignment on one side: "
          "written with align(MN, 4) and read with MN, or the reverse", mu.sf_not_tma_aligned),
    Entry("ue8m0_off_by_one", DENSE_QUANT + GROUPED_QUANT + ("fp8_einsum",) + MQA + ("fp8_fp4_mega_moe",), "inputs",
          "UE8M0 scale bytes decoded one exponent off (bias 126 or 128): products scaled by 2 or 1/2 per operand",
          mu.ue8m0_off_by_one),
    Entry("gran_k_confused", DENSE_QUANT + GROUPED_QUANT + ("fp8_einsum",), "inputs",
          "the scales' K granularity confused: per-32 scales read as per-128, or per-128 scales read as per-32",
          mu.gran_k_confused),
    Entry("scale_block_reused", DENSE_QUANT + GROUPED_QUANT + ("fp8_einsum",), "call",
          "one scale block used in place of others: the first K block's for every block, an even block's for "
          "its odd neighbour, a tile's first row's for the whole tile, or group 0's for every group",
          mu.scale_block_reused),
    Entry("k_tail_not_zeroed", ("*gemm_nt", "m_grouped_*"), "call",
          "K not a multiple of the block and the tail of the last block not zeroed: it holds the next row's "
          "elements (flat overrun) or the previous block's (stale buffer)", mu.k_tail_not_zeroed),
    Entry("k_last_block_dropped", K_LOOP, "call",
          "the last block of the K loop not accumulated (the loop bound one block short, or a partial last "
          "block skipped)", mu.k_last_block_dropped, origin=ISSUE_27),
    Entry("k_block_dropped", K_LOOP, "call",
          "one K block other than the last not accumulated (a pipeline stage skipped)", mu.k_block_dropped,
          origin=ISSUE_27),
    Entry("k_block_doubled", K_LOOP, "call",
          "one K block accumulated twice (a pipeline stage consumed twice)", mu.k_block_doubled, origin=ISSUE_27),
    Entry("neg1_rows_as_group0", ("m_grouped_*_contiguous",) + MEGA, "call",
          "a -1 (padding) in m_indices read as group 0, so a tile whose last row is padding is computed with "
          "group 0's B; Mega MoE: a -1 top-k slot routed to expert 0 (DeepGEMM #34: a -1 is not skipped but "
          "used as a group index)", mu.neg1_rows_as_group0,
          sources=("https://github.com/deepseek-ai/DeepGEMM/issues/34",)),
    Entry("psum_offsets_shifted", M_CONTIGUOUS, "call",
          "psum end offsets read as start offsets (group g on rows [psum[g], psum[g+1])), or shifted by one "
          "group", mu.psum_offsets_shifted),
    Entry("group_boundary_off_by_one", M_CONTIGUOUS + MASKED + K_GROUPED, "call",
          "group boundaries one row off: each group's last or first row unwritten or given to the neighbour "
          "group (masked: masked_m - 1 rows; K-grouped: a K element dropped)", mu.group_boundary_off_by_one),
    Entry("masked_m_ignored", MASKED, "call",
          "masked_m not read: every group computed to expected_m rows, or none at all", mu.masked_m_ignored),
    Entry("c_missing", EVERY, "output", "the C input (or D's initial value when C is D) not added", mu.c_missing),
    Entry("c_added_twice", EVERY, "output", "C added twice (the epilogue applied to its own result, or 2 C)",
          mu.c_added_twice),
    Entry("alpha_missing", EVERY, "output", "the alpha output scale not applied", mu.alpha_missing),
    Entry("output_truncated", EVERY, "output",
          "the output rounded toward zero instead of to nearest even", mu.output_truncated),
    Entry("output_transposed", EVERY, "output",
          "D stored transposed (column-major into the row-major buffer), whole or as the accumulator with C "
          "added in place", mu.output_transposed),
    Entry("tile_not_written", EVERY, "output",
          "whole output tiles left at D's initial value (zeros, NaN or C): a tile the scheduler skipped",
          mu.tile_not_written, specificity=0),
    Entry("narrow_accumulator", GEMM_LIKE, "call",
          "an accumulator narrower than float32 (a tensor core's truncating fixed-point sum with a promotion "
          "interval), fitted as limited(bits, interval)", mu.narrow_accumulator, specificity=1,
          sources=("https://github.com/deepseek-ai/DeepGEMM/issues/37",
                   "https://github.com/deepseek-ai/DeepGEMM/issues/50",
                   "https://github.com/deepseek-ai/DeepGEMM/issues/176")),
    Entry("accumulator_truncated", K_LOOP, "call",
          "a float32 accumulator whose additions round toward zero where the profile's model rounds to nearest "
          "(24 bits kept, every error toward zero; scored on all differing elements)", mu.accumulator_truncated,
          origin=ISSUE_27),
    Entry("mqa_weights_missing", MQA, "call", "the per-head weights not applied to the MQA scores",
          mu.mqa_weights_missing),
    Entry("mqa_relu_missing", MQA, "call", "no ReLU on the per-head MQA scores before the weighted sum",
          mu.mqa_relu_missing),
    Entry("mqa_kv_range_off_by_one", MQA, "call",
          "each query's KV range (ks / ke, or the paged context length) one token off", mu.mqa_kv_range_off_by_one),
    Entry("paged_block_table_misread", ("fp8_fp4_paged_mqa_logits",), "inputs",
          "the paged KV block table misread: column-major, shifted by a block, or another request's row",
          mu.paged_block_table_misread),
    # DeepEP's dispatch and combine
    Entry("ep_combine_order", EP_COMBINE, "call",
          "the combine's float32 sum in another order than DeepEP's recipe (owners by rank instead of by master "
          "slot, terms reversed, biases last): within the bound, not bitwise DeepEP", ep.ep_combine_order,
          origin=EP_ISSUE),
    Entry("ep_partial_not_rounded", EP_COMBINE, "call",
          "a rank's partial of two or more slots added in float32, without DeepEP's bf16 rounding where the "
          "partial is sent (a missing rounding at a segment break)", ep.ep_partial_not_rounded, origin=EP_ISSUE),
    Entry("ep_bias_misapplied", EP_COMBINE, "call",
          "the combine's bias added twice, or in bf16 (to the rounded sum) instead of first into the float32 sum",
          ep.ep_bias_misapplied, origin=EP_ISSUE),
    Entry("ep_weights_misapplied", EP_COMBINE, "call",
          "the top-k weights applied twice (the combine weights rows the expert side already weighted) or not "
          "at all (lost by the dispatch)", ep.ep_weights_misapplied, origin=EP_ISSUE),
    Entry("ep_expert_wrong_rank", EP, "call",
          "an expert mapped to the wrong rank (owners round robin instead of in blocks of E / R, or one rank off): "
          "tokens received by the wrong ranks, wrong local expert indices and partial groups",
          ep.ep_expert_wrong_rank, origin=EP_ISSUE),
    Entry("ep_padding_not_zeroed", EP_DISPATCH, "output",
          "expanded padding rows not zeroed although do_zero_padding asks for it (stale rows: the expert's last "
          "slot row or the next expert's first)", ep.ep_padding_not_zeroed, origin=EP_ISSUE),
    Entry("ep_sf_not_copied", EP_DISPATCH, "layout",
          "FP8 scale factors not moved with their rows (taken by position, from the source's first token, or not "
          "written)", ep.ep_sf_not_copied, origin=EP_ISSUE),
    Entry("ep_sf_int16_misread", EP_DISPATCH, "layout",
          "DeepEP-Ascend's int16 view of the float32 scale factors misread (the two halves of a pack swapped, or "
          "the bytes of each int16)", ep.ep_sf_int16_misread, origin=EP_ISSUE),
    # From the public trackers
    Entry("sf_float32_read_as_ue8m0", DENSE_QUANT + GROUPED_QUANT + ("fp8_einsum",), "layout",
          "float32 scales left in the float layout and read by a UE8M0 kernel as packed exponent bytes "
          "(2^-127, 2^-127, then the float's high bytes)", mu.sf_float32_read_as_ue8m0,
          sources=("https://github.com/deepseek-ai/DeepGEMM/issues/417",
                   "https://github.com/vllm-project/vllm/pull/53680")),
    Entry("sf_rounded_up_to_pow2", DENSE_QUANT + GROUPED_QUANT + ("fp8_einsum",), "inputs",
          "FP32 scales rounded up to powers of two (a UE8M0 cast, 2^ceil(log2 s)) on a kernel that expects FP32 "
          "scales", mu.sf_rounded_up_to_pow2,
          sources=("https://github.com/deepseek-ai/DeepGEMM/pull/112",
                   "https://github.com/vllm-project/vllm/issues/38083")),
    Entry("sf_pow2_kept_float32", DENSE_QUANT + GROUPED_QUANT + ("fp8_einsum",), "inputs",
          "a kernel that expects power-of-two (UE8M0) scales given the quantiser's un-rounded float32 scales "
          "(amax / 448 instead of 2^ceil(log2(amax / 448)))", mu.sf_pow2_kept_float32,
          sources=("https://github.com/deepseek-ai/DeepGEMM/pull/112",
                   "https://github.com/vllm-project/vllm/issues/38083")),
    Entry("mqa_head_dim_misread", MQA, "layout",
          "FP8 MQA at head_dim 32 / 64 read as if rows were 128 bytes: shared memory swizzled in head_dim-byte "
          "atoms un-swizzled with the 128-byte pattern, or a 128-byte head stride (DeepGEMM #433: wrong, in the "
          "paged kernel deterministically, so self-consistency passes)", mu.mqa_head_dim_misread,
          sources=("https://github.com/deepseek-ai/DeepGEMM/issues/433",
                   "https://github.com/deepseek-ai/DeepGEMM/pull/434")),
    Entry("paged_page_size_mismatch", ("fp8_fp4_paged_mqa_logits",), "inputs",
          "paged MQA run with a page size other than the block table's: per-token paging (the table indexed by "
          "token position, token 0 of each block read) or another block_kv", mu.paged_page_size_mismatch,
          sources=("https://github.com/ROCm/aiter/pull/5591", "https://github.com/ROCm/aiter/pull/5614")),
    Entry("sf_mantissa_dropped", DENSE_QUANT + GROUPED_QUANT + ("fp8_einsum",), "inputs",
          "non-power-of-two float32 scales cut to their exponent (a UE8M0 cast that keeps the exponent byte "
          "and silently drops the mantissa)", mu.sf_mantissa_dropped,
          sources=("https://github.com/deepseek-ai/DeepGEMM/pull/112",
                   "https://github.com/vllm-project/vllm/pull/49784",
                   "https://github.com/sgl-project/sglang/issues/39193")),
)

_BY_NAME = {e.name: e for e in CATALOGUE}


def entry(name: str) -> Entry:
    """The catalogue entry of that name (KeyError if none)."""
    return _BY_NAME[name]


def applicable(kernel: str) -> list[Entry]:
    """The entries whose kernel patterns match ``kernel``, in catalogue order."""
    import fnmatch

    return [e for e in CATALOGUE if any(fnmatch.fnmatchcase(kernel, p) for p in e.kernels)]
