"""Topology, buffer sizes and resource models of DeepEP's V2 buffers: arithmetic only.

The emulator's ranks live on one host: the physical domain is ``(RDMA ranks, NVLink ranks) =
(1, R)`` and so is the logical one, ``(scale-out, scale-up) = (1, R)``, whatever
``allow_hybrid_mode`` says (contract 4.1): hybrid mode never engages.
"""

from __future__ import annotations

import math
from typing import Any

from ..comm import transport
from ..errors import arg_error
from ..exact import align, ceil_div
from ..profiles import Profile
from ..toolkit.sizes import size_arg

__all__ = [
    "ALIGNMENT_BYTES",
    "get_physical_domain_size",
    "get_logical_domain_size",
    "group_size",
    "dispatch_buffer_bytes",
    "combine_buffer_bytes",
    "buffer_size_hint",
    "theoretical_num_sms",
    "theoretical_num_qps",
    "default_num_allocated_qps",
    "NVLINK_GBS",
]

#: DeepEP's buffer granularity: sizes are multiples of 2 MiB.
ALIGNMENT_BYTES = 2 << 20
_TMA_ALIGN = 32
_SF_PACK_BYTES = 4


def group_size(group: Any, func: str) -> tuple[int, int]:
    """(rank, size) of a group (a rank view of an in-process group or a torch process group)."""
    t = transport(group, func, "group")
    return t.rank, t.size


# Note: one host: physical and logical domains are (1, R) and hybrid mode never engages.
def get_physical_domain_size(group: Any) -> tuple[int, int]:
    """``(num_rdma_ranks, num_nvlink_ranks)`` of ``group``: ``(1, R)``, every rank on one host."""
    return 1, group_size(group, "get_physical_domain_size")[1]


def get_logical_domain_size(group: Any, allow_hybrid_mode: bool = True) -> tuple[int, int]:
    """``(num_scaleout_ranks, num_scaleup_ranks)`` of ``group``: ``(1, R)`` (one host, so hybrid
    mode never engages whatever ``allow_hybrid_mode`` says)."""
    if not isinstance(allow_hybrid_mode, (bool, int)):
        raise arg_error("get_logical_domain_size", "allow_hybrid_mode", "a bool", repr(allow_hybrid_mode))
    return 1, group_size(group, "get_logical_domain_size")[1]


def _token_bytes(hidden_bytes: int, sf_bytes: int, metadata_bytes: int) -> int:
    return align(hidden_bytes, _TMA_ALIGN) + align(sf_bytes, _TMA_ALIGN) + align(metadata_bytes, _TMA_ALIGN)


def dispatch_buffer_bytes(num_ranks: int, num_max_tokens_per_rank: int, hidden: int, num_sf_packs: int,
                          num_topk: int, elem_size: int) -> int:
    """Bytes the one-host dispatch needs: R receive slots of ``T_max`` tokens, each token
    ``align(H e, 32) + align(4 P, 32) + align(8 K + 4 (1 + K), 32)`` bytes (data, SF packs,
    top-k ids and weights, source index and slot)."""
    per_token = _token_bytes(hidden * elem_size, num_sf_packs * _SF_PACK_BYTES, num_topk * 8 + (1 + num_topk) * 4)
    return num_ranks * num_max_tokens_per_rank * per_token


def combine_buffer_bytes(num_ranks: int, num_max_tokens_per_rank: int, hidden: int, num_topk: int,
                         allow_multiple_reduction: bool) -> int:
    """Bytes the one-host combine needs: ``min(R, K)`` (multiple reduction) or K rows of
    ``T_max`` tokens, each ``align(2 H, 32) + align(8 K, 32)`` bytes."""
    rows = min(num_ranks, num_topk) if allow_multiple_reduction else num_topk
    return rows * num_max_tokens_per_rank * _token_bytes(hidden * 2, 0, num_topk * 8)


def buffer_size_hint(func: str, num_ranks: int, num_max_tokens_per_rank: Any, hidden: Any, num_topk: Any,
                     use_fp8_dispatch: Any, allow_multiple_reduction: Any) -> int:
    """DeepEP's size hint for scale-out 1: ``align(max(dispatch, combine), 2 MiB)`` with K = 0
    counted as 32 and ``ceil(H / 32)`` SF packs for FP8 (an upper bound of the packs)."""
    t_max = size_arg(func, "num_max_tokens_per_rank", num_max_tokens_per_rank, 1)
    h = size_arg(func, "hidden", hidden, 1)
    k = size_arg(func, "num_topk", num_topk, 0)
    if ceil_div(h, 32) * 4 > h:
        raise arg_error(func, "hidden", "a size whose worst-case SF bytes ceil(hidden / 32) * 4 fit in hidden",
                        str(h))
    fp8 = bool(use_fp8_dispatch)
    k = 32 if k == 0 else k
    d = dispatch_buffer_bytes(num_ranks, t_max, h, ceil_div(h, 32) if fp8 else 0, k, 1 if fp8 else 2)
    c = combine_buffer_bytes(num_ranks, t_max, h, k, bool(allow_multiple_reduction))
    return align(max(d, c, 1), ALIGNMENT_BYTES)


# Note: the SM model uses nominal NVLink bandwidths (no nvidia-smi), and 129 QPs by default with hybrid mode.
#: Total NVLink bandwidth (GB/s) DeepEP's detection reports on the reference devices: 18 links
#: of 26.5625 GB/s (H800 / H100 SXM) or 53.125 GB/s (B200), times its 0.9 efficiency factor.
NVLINK_GBS: dict[str, float] = {"sm90": 18 * 26.5625 * 0.9, "sm100": 18 * 53.125 * 0.9}


def theoretical_num_sms(profile: Profile, num_ranks: int, num_experts: int, num_topk: int, nvlink_gbs: float,
                        sm_read_gbs: float, sm_write_gbs: float, prefer_overlap_with_compute: bool) -> int:
    """DeepEP's bandwidth model on one host (scale-out 1, one RDMA rank): the SMs that keep NVLink
    busy, ``max(B / traffic * read / sm_read_gbs, B / traffic * write / sm_write_gbs)`` with
    ``traffic = 1 - 1 / R``, ``read = 1 / E[#ranks per token]``, ``write = 1``; then
    ``align(max(4, ceil(1.25 n)), 2)``, at least 64 without ``prefer_overlap_with_compute``, at
    most the device's SMs (all of them when nothing travels, R = 1).  DeepEP-Ascend: the AI cores."""
    device = profile.device_num_sms
    if profile.is_ascend:
        return device
    if num_experts % num_ranks:
        raise arg_error("get_theoretical_num_sms", "num_experts", f"a multiple of the {num_ranks} ranks",
                        str(num_experts))
    expected = num_ranks * (1 - math.comb(num_experts - num_experts // num_ranks, num_topk)
                            / math.comb(num_experts, num_topk)) if num_topk <= num_experts else float(num_ranks)
    traffic = 1 - 1 / num_ranks
    n: float = device
    if traffic > 0 and expected > 0:
        gbs = nvlink_gbs if nvlink_gbs else NVLINK_GBS.get(profile.name, 0.0)
        n = max(gbs / traffic * (1 / expected) / sm_read_gbs, gbs / traffic * 1.0 / sm_write_gbs)
    sms = align(max(4, math.ceil(n * 1.25)), 2)
    if not prefer_overlap_with_compute:
        sms = max(sms, 64)
    return min(sms, device)


def theoretical_num_qps(num_sms: int, allow_hybrid_mode: bool, num_allocated_qps: int) -> int:
    """``min(num_sms, 9)`` (``num_sms * 16 + 1`` with hybrid mode allowed), at most the allocated QPs."""
    qps = num_sms * 16 + 1 if allow_hybrid_mode else min(num_sms, 8 + 1)
    return min(qps, num_allocated_qps)


def default_num_allocated_qps(allow_hybrid_mode: bool) -> int:
    """QPs allocated for ``num_allocated_qps=0``: 129 with hybrid mode allowed (no NIC with fast
    RDMA atomics is found), else 17."""
    return 129 if allow_hybrid_mode else 17
