"""DeepGEMM-Ascend's MQA logits (profile ``ascend950``): argument contracts and translation.

``fp8_fp4_mqa_logits`` (compressed logits, plain keys) and ``fp8_fp4_paged_mqa_logits`` (a paged
KV cache in the default or the NZ layout) read check -> tasks -> execute: the check step
(:func:`_check_mqa_logits`, :func:`_check_paged`) validates the arguments for the profile the
dispatcher hands the call, as DeepGEMM-Ascend's host code does, allocates the 256-aligned output
(where a dry run ends) and returns a :class:`~.logits.LogitsRequest` with the ascend reduction;
:func:`.logits.launch` runs its tasks through the executor.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import dryrun, runtime
from .. import formats as fm
from ..executor import active_accumulation
from ..interop import caller_kind, from_numpy
from ..profiles import Profile
from ..toolkit.args import (
    BF16,
    E4M3,
    I8,
    I16,
    I32,
    U8,
    align,
    as_array,
    as_pair,
    bool_arg,
    check,
    is_contiguous,
    packed_fp4,
    strides,
    unit_stride,
)
from ..toolkit.sizes import size_arg
from .contracts import (
    _ASC_ROW_ALIGN,
    ascend_heads,
    ascend_q_scales,
    check_indices,
    check_logits_alloc,
    check_ranges,
    check_schedule,
    check_seq_lens,
    check_weights,
    paged_rows,
)
from .keys import PagedKeys, PagedLayout, PlainKeys, Queries, ue8m0_scales
from .logits import LogitsRequest, allocate, launch, range_mask
from .schedule import ascend_schedule_checked, runs


def _fp8_fp4_mqa_logits_ascend(profile: Profile, /, q: Any, kv: Any, weights: Any, cu_seq_len_k_start: Any,
                               cu_seq_len_k_end: Any, max_seqlen_k: int) -> Any:
    """Lightning-indexer logits on DeepGEMM-Ascend: MX-scaled Q and KV, bf16 out.

    q = (float8_e4m3fn (T, H, D) or int8 packed E2M1 (T, H, D / 2), int16 UE8M0 pairs
    (T * H, D / 64) or (T, H, D / 64), any strides) - the Q scales are mandatory (byte 127 = 1.0).
    kv = (same format (S, D) or (S, D / 2), int16 (S, D / 64)); q and kv contiguous.
    H a multiple of 4 in [4, 64]; D in {64, 128}; weights bfloat16 (T, H), stride(1) == 1;
    cu_seq_len_k_start / _end int32 (T,); max_seqlen_k > 0 (required).
    Returns bfloat16 (T, max_seqlen_k), row stride align(max_seqlen_k, 256), compressed:

        logits[i, t] = sum_h weights[i, h] * relu(q[i, h] . kv[start[i] + t]),  t < end[i] - start[i]

    (scales folded into the dot products); the rest of each row is unspecified: NaN here.
    """
    return launch(_check_mqa_logits(profile, "fp8_fp4_mqa_logits", q, kv, weights, cu_seq_len_k_start,
                                    cu_seq_len_k_end, max_seqlen_k))


def _check_mqa_logits(profile: Profile, func: str, q: Any, kv: Any, weights: Any, cu_seq_len_k_start: Any,
                      cu_seq_len_k_end: Any, max_seqlen_k: Any) -> LogitsRequest:
    """Validate a plain MQA-logits call; the request carries the fresh output (a dry run returns
    it here)."""
    kind = caller_kind(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end)
    q_data, q_sf = as_pair(q, func, "q", sf_optional=True)
    q_data = packed_fp4(q_data)
    kv_data, kv_sf = as_pair(kv, func, "kv", sf_optional=True)
    kv_data = packed_fp4(kv_data)
    w = as_array(weights, func, "weights")
    check(q_data.ndim == 3, func, "q[0]", "a 3-D array (num_q_tokens, num_heads, head_dim)", q_data)
    check(kv_data.ndim == 2, func, "kv[0]", "a 2-D array (num_kv_tokens, head_dim)", kv_data)
    check(w.ndim == 2, func, "weights", "a 2-D array", w)
    check(w.dtype == BF16, func, "weights", "bfloat16 (Ascend MQA logits expects bf16 weights)", w)
    max_k = size_arg(func, "max_seqlen_k", max_seqlen_k, minimum=None)
    t_q, heads = int(q_data.shape[0]), int(q_data.shape[1])
    fp4 = q_data.dtype == I8
    d = int(q_data.shape[2]) * (2 if fp4 else 1)
    seq_kv = int(kv_data.shape[0])
    ascend_heads(func, heads, q_data)
    check(d in (64, 128), func, "q[0]", "head_dim 64 or 128", q_data)
    check(max_k > 0, func, "max_seqlen_k", "a positive int", repr(max_k))
    check_weights(func, w, t_q, heads, (BF16,))
    ks = check_seq_lens(func, "cu_seq_len_k_start", as_array(cu_seq_len_k_start, func, "cu_seq_len_k_start"), t_q)
    ke = check_seq_lens(func, "cu_seq_len_k_end", as_array(cu_seq_len_k_end, func, "cu_seq_len_k_end"), t_q)
    check(is_contiguous(q_data), func, "q[0]", "a contiguous array", q_data)
    check(is_contiguous(kv_data), func, "kv[0]", "a contiguous array", kv_data)
    check(kv_data.shape[1] == (d // 2 if fp4 else d), func, "kv[0]", f"shape ({seq_kv}, {d // 2 if fp4 else d})",
           kv_data)
    check((q_data.dtype, kv_data.dtype) in ((E4M3, E4M3), (I8, I8)), func, "kv[0]",
           "q and kv both float8_e4m3fn or both int8 (packed FP4)", f"q {q_data.dtype}, kv {kv_data.dtype}")
    pairs = d // 64
    q_scales = ascend_q_scales(func, q_sf, t_q, heads, pairs, four_d=False)
    check(kv_sf is not None and kv_sf.dtype == I16, func, "kv[1]", "dtype int16 (packed UE8M0 pairs)", kv_sf)
    assert kv_sf is not None
    check(kv_sf.ndim == 2 and kv_sf.shape == (seq_kv, pairs), func, "kv[1]", f"shape ({seq_kv}, {pairs})", kv_sf)
    check_ranges(func, ks, ke, seq_kv, max_k)

    check_logits_alloc(func, "max_seqlen_k", t_q, align(max_k, _ASC_ROW_ALIGN), fm.BF16)
    alloc, view = allocate(t_q, align(max_k, _ASC_ROW_ALIGN), t_q, max_k, fm.BF16)
    dryrun.stop(from_numpy(view, kind))  # validated: a dry run returns the allocated logits
    keys = PlainKeys(kv_data, fp4, ue8m0_scales(fm.unpack_ue8m0_int16(kv_sf)), None)
    def defined() -> np.ndarray:
        return range_mask(view.shape, np.zeros_like(ks), ke - ks)

    return LogitsRequest(func=func, profile=profile, d=view, defined=defined, reduction="ascend",
                         queries=Queries(q_data, fp4, q_scales), keys=keys, weights=w, out_fmt=fm.BF16, ks=ks, ke=ke,
                         shift=ks, accumulation=active_accumulation(profile), alloc=alloc, kind=kind)


def _fp8_fp4_paged_mqa_logits_ascend(profile: Profile, /, q: Any, kv_cache: Any, weights: Any, context_lens: Any,
                                     block_table: Any, schedule_meta: Any, max_context_len: int, indices: Any,
                                     use_ascend_kv_layout: bool = False) -> Any:
    """Lightning-indexer logits against a paged KV cache on DeepGEMM-Ascend.

    q = (float8_e4m3fn (B, 1, H, D) or int8 packed (B, 1, H, D / 2), int16 UE8M0 pairs (B * H, D / 64)
    or (B, 1, H, D / 64)); H a multiple of 4 in [4, 64]; D in {64, 128}.
    kv_cache: uint8 (num_pages, P, 1, Dbytes + 2 * (D / 64)), P in {64, 128}, Dbytes = D or D / 2,
    stride(1) == last dim, stride(3) == 1, stride(0) % (2 * D / 64) == 0.  Page p (at p * stride(0)):
    P * Dbytes value bytes, then P * (D / 64) int16 pairs.  Default layout: token-major values and
    pairs; use_ascend_kv_layout=True: values as 32-byte column fragments of all P tokens (byte b of
    token t at (b // 32) * P * 32 + t * 32 + b % 32) and pairs per 16 tokens ([pair 0 of 16 tokens]
    [pair 1 of 16 tokens] ...).
    weights bfloat16 (B, H); context_lens int32 (B, 1); block_table int32 (B, max_pages); indices
    int32 (B,) (required: runs of equal values are requests reading the first row's block-table row
    up to the last row's context length); schedule_meta from get_paged_mqa_logits_metadata.
    Returns bfloat16 (B, max_context_len), row stride align(max_context_len, 256):

        logits[r, p] = sum_h w[r, h] * relu(q[r, h] . K[p]),   p < context_lens[r]   (others NaN)
    """
    return launch(_check_paged(profile, "fp8_fp4_paged_mqa_logits", q, kv_cache, weights, context_lens, block_table,
                               schedule_meta, max_context_len, indices, use_ascend_kv_layout))


def _check_paged(profile: Profile, func: str, q: Any, kv_cache: Any, weights: Any, context_lens: Any,
                 block_table: Any, schedule_meta: Any, max_context_len: Any, indices: Any,
                 use_ascend_kv_layout: Any) -> LogitsRequest:
    """Validate a paged MQA-logits call (its schedule for the profile's AI cores); the request
    carries the fresh output (a dry run returns it here)."""
    kind = caller_kind(q, kv_cache, weights, context_lens, block_table, schedule_meta, indices)
    q_data, q_sf = as_pair(q, func, "q", sf_optional=True)
    q_data = packed_fp4(q_data)
    cache = as_array(kv_cache, func, "kv_cache")
    w = as_array(weights, func, "weights")
    ctx_a = as_array(context_lens, func, "context_lens")
    bt = as_array(block_table, func, "block_table")
    meta = as_array(schedule_meta, func, "schedule_meta")
    check(q_data.ndim == 4, func, "q[0]", "a 4-D array (num_q_tokens, 1, num_heads, head_dim)", q_data)
    check(cache.ndim == 4, func, "kv_cache", "a 4-D uint8 array (num_pages, page_size, 1, bytes per token)", cache)
    check(w.ndim == 2, func, "weights", "a 2-D array", w)
    check(ctx_a.ndim == 2 and is_contiguous(ctx_a), func, "context_lens", "a contiguous 2-D array (num_q_tokens, 1)",
           ctx_a)
    check(bt.ndim == 2 and unit_stride(bt, 1), func, "block_table",
           "a 2-D array with stride(1) == 1", bt)
    check(ctx_a.dtype == I32, func, "context_lens", "dtype int32", ctx_a)
    check(bt.dtype == I32, func, "block_table", "dtype int32", bt)
    check(meta.ndim == 2 and is_contiguous(meta) and meta.dtype == I32, func, "schedule_meta",
           "a contiguous 2-D int32 array", meta)
    check(w.dtype == BF16, func, "weights", "bfloat16 (Ascend MQA logits expects bf16 weights)", w)
    max_len = size_arg(func, "max_context_len", max_context_len)
    use_nz = bool_arg(func, "use_ascend_kv_layout", use_ascend_kv_layout)
    rows, heads = int(q_data.shape[0]), int(q_data.shape[2])
    fp4 = q_data.dtype == I8
    d_store = int(q_data.shape[3])
    d = 2 * d_store if fp4 else d_store
    page = int(cache.shape[1])
    check(d in (64, 128), func, "q[0]", "head_dim 64 or 128", q_data)
    check(page in (64, 128), func, "kv_cache", "page_size 64 or 128", cache)
    pairs = d // 64
    sf_bytes = 2 * pairs
    check(cache.shape[2] == 1 and cache.shape[3] == d_store + sf_bytes and cache.dtype == U8, func, "kv_cache",
           f"a uint8 array (num_pages, {page}, 1, {d_store + sf_bytes}) = head_dim bytes + 2 * (head_dim / 64)", cache)
    row_bytes = d_store + sf_bytes
    check(cache.size == 0 or (strides(cache)[1] == row_bytes and strides(cache)[3] == 1
                               and cache.strides[0] % sf_bytes == 0),
           func, "kv_cache", f"stride(1) == {row_bytes}, stride(3) == 1 and stride(0) % {sf_bytes} == 0", cache)
    ascend_heads(func, heads, q_data)
    check(q_data.shape[1] == 1, func, "q[0]", "next_n == 1 (q.size(1))", q_data)
    check(q_data.dtype in (E4M3, I8), func, "q[0]", "float8_e4m3fn or int8 (packed FP4)", q_data)
    check(is_contiguous(q_data), func, "q[0]", "a contiguous array", q_data)
    check(q_sf is not None and q_sf.dtype == I16, func, "q[1]", "int16 Q scale factors", q_sf)
    check(indices is not None, func, "indices", "an int32 array (num_q_tokens,) (required)", "None")
    idx = as_array(indices, func, "indices")
    check_indices(func, idx, rows)
    check_weights(func, w, rows, heads, (BF16,))
    check(ctx_a.shape == (rows, 1), func, "context_lens", f"shape ({rows}, 1)", ctx_a)
    check(bt.shape[0] == rows, func, "block_table", f"{rows} rows", bt)
    q_scales = ascend_q_scales(func, q_sf, rows, heads, pairs, four_d=True)
    cores = runtime.num_sms(profile)
    check(meta.shape == (cores + 1, 2), func, "schedule_meta", f"shape ({cores + 1}, 2) (get_num_sms() + 1, 2)", meta)
    expected = ascend_schedule_checked(profile, "get_paged_mqa_logits_metadata", ctx_a, heads, idx)
    check_schedule(func, meta, expected, f"get_paged_mqa_logits_metadata(context_lens, {heads}, indices)", ctx_a, idx)

    ctx = ctx_a.astype(np.int64).reshape(-1)
    starts, counts = runs(idx.astype(np.int64))
    pr = paged_rows(func, ctx, starts, counts, starts, bt, page, int(cache.shape[0]), max_len)
    check_logits_alloc(func, "max_context_len", rows, align(max_len, _ASC_ROW_ALIGN), fm.BF16)
    alloc, view = allocate(rows, align(max_len, _ASC_ROW_ALIGN), rows, max_len, fm.BF16)
    dryrun.stop(from_numpy(view, kind))  # validated: a dry run returns the allocated logits
    layout = PagedLayout("ascend_nz" if use_nz else "ascend", page, d_store, sf_bytes)
    keys = PagedKeys(cache, layout, fp4, d, "ascend", bt, pr.bt_rows, pr.base)
    queries = Queries(q_data.reshape(rows, heads, d_store), fp4, q_scales)
    def defined() -> np.ndarray:
        return range_mask(view.shape, np.zeros(rows, np.int64), ctx)

    return LogitsRequest(func=func, profile=profile, d=view, defined=defined, reduction="ascend", queries=queries,
                         keys=keys, weights=w, out_fmt=fm.BF16, ks=pr.ks, ke=pr.ke, shift=pr.ks,
                         accumulation=active_accumulation(profile), alloc=alloc, kind=kind)
