"""DeepGEMM's MQA logits (profiles ``sm90``, ``sm100``): argument contracts and translation.

``fp8_fp4_mqa_logits`` / ``fp8_mqa_logits`` (plain keys) and ``fp8_fp4_paged_mqa_logits`` /
``fp8_paged_mqa_logits`` (a paged KV cache) read check -> tasks -> execute: the check step
(:func:`_check_mqa_logits`, :func:`_check_paged`) validates the arguments for the profile the
dispatcher hands the call, as DeepGEMM's host code does (plus the checks marked ``# Note:``),
allocates the padded output and returns a :class:`~.logits.LogitsRequest` with the sm90 or sm100
reduction; :func:`.logits.launch` runs its tasks through the executor.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from .. import formats as fm
from .. import runtime
from ..errors import arg_error
from ..executor import active_accumulation
from ..interop import caller_kind
from ..profiles import Profile
from ..toolkit.args import (
    BF16,
    E4M3,
    F32,
    I8,
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
    _CLEAN_BLOCK,
    _SPLIT_KV,
    TORCH_FLOAT32,
    check_context_lens_2d,
    check_indices,
    check_logits_alloc,
    check_ranges,
    check_schedule,
    check_seq_lens,
    check_weights,
    cuda_heads,
    cuda_weights_and_dtype,
    logits_format,
    paged_rows,
)
from .keys import KeySource, PagedKeys, PagedLayout, PlainKeys, Queries, ue8m0_scales
from .logits import LogitsRequest, allocate, launch, range_mask
from .schedule import cuda_schedule, requests


def _kv_sf_shape(seq_kv: int) -> str:
    """What kv[1] must be: 1-D, as DeepGEMM's get_shape<1> asserts (a squeezed 0-d scale is refused)."""
    hint = " (per_custom_dims_cast_to_fp8 squeezes one token's scale to 0-d; pass sf.reshape(1))" if seq_kv == 1 else ""
    return f"a 1-D array of shape ({seq_kv},){hint}"


def _check_q(func: str, profile: Profile, q_data: np.ndarray, q_sf: np.ndarray | None, heads: int, d: int,
             what: str) -> None:
    """DeepGEMM's query contract: int8 packed FP4 (sm100, head_dim 64 / 128) when q[1] is given,
    else float8_e4m3fn (head_dim 32 / 64 / 128); the target's head counts; contiguous."""
    if q_sf is not None:
        check(profile.rules.mqa_fp4, func, "q[1]", f"None on {profile.name} (FP4 {what} need sm100)", q_sf)
        check(q_data.dtype == I8, func, "q[0]", "int8 packed FP4 (q[1] is given)", q_data)
        cuda_heads(func, "q[0]", profile, heads, q_data)
        check(d in (64, 128), func, "q[0]", "head_dim 64 or 128 for FP4", q_data)
    else:
        check(q_data.dtype == E4M3, func, "q[0]", "float8_e4m3fn (q[1] is None)", q_data)
        cuda_heads(func, "q[0]", profile, heads, q_data)
        check(d in (32, 64, 128), func, "q[0]", "head_dim 32, 64 or 128", q_data)
    check(is_contiguous(q_data), func, "q[0]", "a contiguous array", q_data)


def _check_mqa_logits(profile: Profile, func: str, q: Any, kv: Any, weights: Any, cu_seq_len_k_start: Any,
                      cu_seq_len_k_end: Any, clean_logits: Any, max_seqlen_k: Any, logits_dtype: Any) -> LogitsRequest:
    """Validate a plain MQA-logits call for ``profile``; the request carries the fresh output."""
    kind = caller_kind(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end)
    q_data, q_sf = as_pair(q, func, "q", sf_optional=True)
    q_data = packed_fp4(q_data)
    kv_data, kv_sf = as_pair(kv, func, "kv", sf_optional=True)
    kv_data = packed_fp4(kv_data)
    clean = bool_arg(func, "clean_logits", clean_logits)
    max_k = size_arg(func, "max_seqlen_k", max_seqlen_k)
    out = logits_format(func, logits_dtype)
    w = as_array(weights, func, "weights")
    fp4 = q_sf is not None
    check(q_data.ndim == 3, func, "q[0]", "a 3-D array (seq_len, num_heads, head_dim)", q_data)
    seq, heads = int(q_data.shape[0]), int(q_data.shape[1])
    d = int(q_data.shape[2]) * (2 if fp4 else 1)
    _check_q(func, profile, q_data, q_sf, heads, d, "MQA logits")
    if fp4:
        assert q_sf is not None
        check(q_sf.ndim == 2 and q_sf.shape == (seq, heads), func, "q[1]", f"shape ({seq}, {heads})", q_sf)
        check(is_contiguous(q_sf) and q_sf.dtype == I32, func, "q[1]", "a contiguous int32 array (packed UE8M0)", q_sf)
        check(kv_data.ndim == 2 and kv_data.shape[1] * 2 == d, func, "kv[0]", f"shape (seq_len_kv, {d // 2})",
               kv_data)
        check(kv_data.dtype == I8 and is_contiguous(kv_data), func, "kv[0]", "a contiguous int8 (packed FP4) array",
               kv_data)
        seq_kv = int(kv_data.shape[0])
        check(kv_sf is not None and kv_sf.ndim == 1 and kv_sf.shape[0] == seq_kv, func, "kv[1]",
               _kv_sf_shape(seq_kv), kv_sf)
        assert kv_sf is not None
        check(is_contiguous(kv_sf) and kv_sf.dtype == I32, func, "kv[1]", "a contiguous int32 array (packed UE8M0)",
               kv_sf)
    else:
        check(kv_data.ndim == 2 and kv_data.shape[1] == d, func, "kv[0]", f"shape (seq_len_kv, {d})", kv_data)
        check(kv_data.dtype == E4M3 and is_contiguous(kv_data), func, "kv[0]", "a contiguous float8_e4m3fn array",
               kv_data)
        seq_kv = int(kv_data.shape[0])
        check(kv_sf is not None and kv_sf.ndim == 1 and kv_sf.shape[0] == seq_kv, func, "kv[1]",
               _kv_sf_shape(seq_kv), kv_sf)
        assert kv_sf is not None
        check(is_contiguous(kv_sf) and kv_sf.dtype == F32, func, "kv[1]", "a contiguous float32 array", kv_sf)
    cuda_weights_and_dtype(func, w, seq, heads, profile, out, contiguous=False)
    ks = check_seq_lens(func, "cu_seq_len_k_start", as_array(cu_seq_len_k_start, func, "cu_seq_len_k_start"), seq)
    ke = check_seq_lens(func, "cu_seq_len_k_end", as_array(cu_seq_len_k_end, func, "cu_seq_len_k_end"), seq)
    if max_k > 0 and clean:
        raise arg_error(func, "clean_logits", "False with compressed logits (max_seqlen_k > 0)", "True")
    check_ranges(func, ks, ke, seq_kv, max_k)

    # Output allocation: rows align(seq, 128 / H), row stride 1024-byte aligned.
    elem = 4 if out is fm.F32 else 2
    block_q = 128 // heads
    if max_k == 0:
        stride, width = align(seq_kv + _SPLIT_KV, 1024 // elem), seq_kv
    else:
        stride, width = align(align(max_k, _SPLIT_KV), 1024 // elem), max_k
    check_logits_alloc(func, "max_seqlen_k" if max_k else "kv[0]", align(seq, block_q), stride, out)
    alloc, view = allocate(align(seq, block_q), stride, seq, width, out)

    if fp4:
        assert q_sf is not None and kv_sf is not None
        q_scales = ue8m0_scales(fm.unpack_ue8m0_int32(q_sf[..., None])[..., : d // 32])
        keys: KeySource = PlainKeys(kv_data, True, ue8m0_scales(fm.unpack_ue8m0_int32(kv_sf[:, None])[:, : d // 32]),
                                      None)
        queries = Queries(q_data, True, q_scales)
    else:
        assert kv_sf is not None
        keys = PlainKeys(kv_data, False, None, kv_sf.astype(np.float64))
        queries = Queries(q_data, False, None)
    shift = ks if max_k > 0 else np.zeros(seq, np.int64)
    cleaned = max_k == 0 and clean
    # smxx_clean_logits' 8192-column blocks stop at min(ceil(seq_kv / 8192) * 8192, row stride).
    clean_to = min(align(seq_kv, _CLEAN_BLOCK), stride) if cleaned else None
    # With cleaning every element is defined (-inf outside [start, end)).
    def defined() -> np.ndarray | Literal["all"]:
        return "all" if cleaned else range_mask(view.shape, ks - shift, ke - shift)

    return LogitsRequest(func=func, profile=profile, d=view, defined=defined, reduction=profile.rules.mqa_reduction,
                         queries=queries, keys=keys, weights=w, out_fmt=out, ks=ks, ke=ke, shift=shift,
                         accumulation=active_accumulation(profile), clean_to=clean_to, alloc=alloc, kind=kind)


def _fp8_fp4_mqa_logits_cuda(profile: Profile, /, q: Any, kv: Any, weights: Any, cu_seq_len_k_start: Any,
                             cu_seq_len_k_end: Any, clean_logits: bool = True, max_seqlen_k: int = 0,
                             logits_dtype: Any = TORCH_FLOAT32) -> Any:
    """Lightning-indexer logits of FP8 or FP4 queries against contiguous keys.

    q = (q_data, None): float8_e4m3fn (seq_len, H, D), unscaled, D in {32, 64, 128}; or (FP4,
    sm100) (int8 packed E2M1 (seq_len, H, D / 2), int32 (seq_len, H) packed UE8M0 per-32 scales).
    H in {8, 16, 32, 64} (sm100) or {32, 64} (sm90).
    kv = (float8_e4m3fn (seq_len_kv, D), float32 (seq_len_kv,) per-token scale), or (FP4) (int8
    (seq_len_kv, D / 2), int32 (seq_len_kv,) packed UE8M0).  All contiguous.
    weights: (seq_len, H) float32 (or bfloat16 on sm100, then logits_dtype must be bfloat16), stride(1) == 1.
    cu_seq_len_k_start / cu_seq_len_k_end: int32 (seq_len,): query i sees keys [start[i], end[i]).
    Returns (seq_len, seq_len_kv) logits (max_seqlen_k == 0) or compressed (seq_len, max_seqlen_k)
    logits with column t = key start[i] + t; float32 or bfloat16 (``logits_dtype``: a torch dtype or
    the NumPy / ml_dtypes dtype), a view into a padded allocation (row stride
    align(seq_len_kv + 256, 1024 / elem) or align(align(max_seqlen_k, 256), 1024 / elem)).

        logits[i, j] = s_j * sum_h weights[i, h] * relu(q[i, h] . kv[j])   (s_j: FP8 token scale)

    With clean_logits (requires max_seqlen_k == 0) every column outside [start, end) is -inf;
    otherwise those entries (and compressed-row tails) are unspecified: NaN here.
    """
    return launch(_check_mqa_logits(profile, "fp8_fp4_mqa_logits", q, kv, weights, cu_seq_len_k_start,
                                    cu_seq_len_k_end, clean_logits, max_seqlen_k, logits_dtype))


def _fp8_mqa_logits_cuda(profile: Profile, /, q: Any, kv: Any, weights: Any, cu_seq_len_k_start: Any,
                         cu_seq_len_k_end: Any, clean_logits: bool = True, max_seqlen_k: int = 0) -> Any:
    """Legacy FP8 MQA logits: ``fp8_fp4_mqa_logits((q, None), kv, ..., logits_dtype=float32)``.

    q: bare float8_e4m3fn (seq_len, H, D); the rest as :func:`fp8_fp4_mqa_logits`.
    """
    return launch(_check_mqa_logits(profile, "fp8_mqa_logits", (q, None), kv, weights, cu_seq_len_k_start,
                                    cu_seq_len_k_end, clean_logits, max_seqlen_k, TORCH_FLOAT32))


def _check_paged(profile: Profile, func: str, q: Any, kv_cache: Any, weights: Any, context_lens: Any,
                 block_table: Any, schedule_meta: Any, max_context_len: Any, clean_logits: Any, logits_dtype: Any,
                 indices: Any) -> LogitsRequest:
    """Validate a paged MQA-logits call for ``profile`` (its schedule for the profile's SM count);
    the request carries the fresh output."""
    rules = profile.rules
    kind = caller_kind(q, kv_cache, weights, context_lens, block_table, schedule_meta, indices)
    q_data, q_sf = as_pair(q, func, "q", sf_optional=True)
    q_data = packed_fp4(q_data)
    cache = as_array(kv_cache, func, "kv_cache")
    w = as_array(weights, func, "weights")
    ctx_a = as_array(context_lens, func, "context_lens")
    bt = as_array(block_table, func, "block_table")
    meta = as_array(schedule_meta, func, "schedule_meta")
    idx = as_array(indices, func, "indices", allow_none=True)
    num_sms = runtime.num_sms(profile)
    max_len = size_arg(func, "max_context_len", max_context_len)
    clean = bool_arg(func, "clean_logits", clean_logits)
    out = logits_format(func, logits_dtype)
    fp4 = q_sf is not None
    check(q_data.ndim == 4, func, "q[0]", "a 4-D array (batch_size, next_n, num_heads, head_dim)", q_data)
    batch, next_n, heads = (int(v) for v in q_data.shape[:3])
    d = int(q_data.shape[3]) * (2 if fp4 else 1)
    check(next_n >= 1, func, "q[0]", "next_n >= 1", q_data)
    _check_q(func, profile, q_data, q_sf, heads, d, "paged MQA logits")
    if fp4:
        assert q_sf is not None
        check(q_sf.ndim == 3 and q_sf.shape == (batch, next_n, heads), func, "q[1]",
               f"shape ({batch}, {next_n}, {heads})", q_sf)
        check(is_contiguous(q_sf) and q_sf.dtype == I32, func, "q[1]", "a contiguous int32 array (packed UE8M0)", q_sf)
        value_bytes = d // 2
    else:
        value_bytes = d
    check(cache.ndim == 4, func, "kv_cache", "a 4-D uint8 array (num_blocks, block_kv, 1, bytes per token)", cache)
    num_pages, page = int(cache.shape[0]), int(cache.shape[1])
    check(page in rules.paged_block_kv, func, "kv_cache",
          f"block_kv {' or '.join(str(v) for v in rules.paged_block_kv)} ({profile.name})", cache)
    width = value_bytes + 4
    check(cache.shape[2] == 1 and cache.shape[3] == width, func, "kv_cache",
           f"shape (num_blocks, {page}, 1, {width}) = head_dim{' / 2' if fp4 else ''} + 4 bytes per token", cache)
    check(cache.dtype == U8, func, "kv_cache", "dtype uint8", cache)
    check(cache.size == 0 or (strides(cache)[1] == width and strides(cache)[3] == 1), func, "kv_cache",
           f"stride(1) == {width} and stride(3) == 1", cache)
    check(cache.size == 0 or cache.strides[0] % 4 == 0, func, "kv_cache",
           "stride(0) (bytes per block) a multiple of 4", cache)
    check_weights(func, w, batch * next_n, heads, rules.mqa_weight_dtypes, contiguous=not fp4)
    if w.dtype == BF16 and out is not fm.BF16:
        raise arg_error(func, "logits_dtype", "bfloat16 with bfloat16 weights", "float32")
    check(bt.ndim == 2 and bt.shape[0] == batch, func, "block_table", f"a 2-D array ({batch}, max_blocks)", bt)
    check(unit_stride(bt, 1), func, "block_table", "stride(1) == 1", bt)
    check(bt.dtype == I32, func, "block_table", "dtype int32", bt)
    if idx is not None:
        check(rules.varlen_indices and next_n == 1, func, "indices", "None unless sm100 with next_n == 1 (varlen)",
              idx)
        check_indices(func, idx, batch)
    check_context_lens_2d(func, ctx_a)
    check(ctx_a.shape == (batch, next_n), func, "context_lens", f"shape ({batch}, {next_n})", ctx_a)
    if clean:
        raise arg_error(func, "clean_logits", "False (cleaning needs 1-D context lens; only 2-D context lens are "
                        "supported)", "True")
    check(meta.ndim == 2 and meta.shape == (num_sms + 1, 2), func, "schedule_meta",
           f"shape ({num_sms + 1}, 2) (get_num_sms() + 1, 2)", meta)
    expected = cuda_schedule(profile, "get_paged_mqa_logits_metadata", ctx_a, page, num_sms, idx)
    check_schedule(func, meta, expected, f"get_paged_mqa_logits_metadata(context_lens, {page}, {num_sms}, indices)")

    ctx = ctx_a.astype(np.int64).reshape(-1)
    rows = batch * next_n
    starts, counts = requests(rows, next_n, None if idx is None else idx.astype(np.int64))
    bt_rows = starts if idx is not None else starts // next_n
    pr = paged_rows(func, ctx, starts, counts, bt_rows, bt, page, num_pages, max_len)

    elem = 4 if out is fm.F32 else 2
    check_logits_alloc(func, "max_context_len", rows, align(align(max_len, _SPLIT_KV), 1024 // elem), out)
    alloc, view = allocate(rows, align(align(max_len, _SPLIT_KV), 1024 // elem), rows, max_len, out)
    layout = PagedLayout("deepgemm", page, value_bytes, 4)
    keys = PagedKeys(cache, layout, fp4, d, "cuda", bt, pr.bt_rows, pr.base)
    if fp4:
        assert q_sf is not None
        by = fm.unpack_ue8m0_int32(q_sf.reshape(rows, heads)[..., None])[..., : d // 32]
        queries = Queries(q_data.reshape(rows, heads, -1), True, ue8m0_scales(by))
    else:
        queries = Queries(q_data.reshape(rows, heads, d), False, None)
    def defined() -> np.ndarray:
        return range_mask(view.shape, np.zeros(rows, np.int64), ctx)

    return LogitsRequest(func=func, profile=profile, d=view, defined=defined, reduction=rules.mqa_reduction,
                         queries=queries, keys=keys, weights=w, out_fmt=out, ks=pr.ks, ke=pr.ke, shift=pr.ks,
                         accumulation=active_accumulation(profile), alloc=alloc, kind=kind)


def _fp8_fp4_paged_mqa_logits_cuda(profile: Profile, /, q: Any, kv_cache: Any, weights: Any, context_lens: Any,
                                   block_table: Any, schedule_meta: Any, max_context_len: int,
                                   clean_logits: bool = False, logits_dtype: Any = TORCH_FLOAT32,
                                   indices: Any = None) -> Any:
    """Lightning-indexer logits against a paged KV cache.

    q = (float8_e4m3fn (B, N, H, D), None) or (FP4, sm100) (int8 (B, N, H, D / 2), int32 (B, N, H)).
    kv_cache: uint8 (num_blocks, block_kv, 1, D + 4) (FP8) or (..., D / 2 + 4) (FP4), stride(1) ==
    last dim, stride(3) == 1, stride(0) % 4 == 0.  The shape is a byte container: block b (at
    b * stride(0)) holds block_kv tokens' values token-major (token t at t * D, or t * D / 2), then
    block_kv float32 token scales (FP8) or int32 packed UE8M0 words (FP4) at block_kv * D + 4 t.
    weights (B * N, H) float32 (contiguous for FP8) or bfloat16 (sm100; logits bfloat16).
    context_lens int32 (B, N) (2-D only); block_table int32 (B, max_blocks), stride(1) == 1;
    schedule_meta from get_paged_mqa_logits_metadata(context_lens, block_kv, get_num_sms(), indices);
    indices (varlen, sm100, N == 1): int32 (B,), runs share the first row's block-table row.
    clean_logits must be False.  Returns (B * N, max_context_len) float32 / bfloat16 logits, a view
    with row stride align(align(max_context_len, 256), 1024 / elem):

        logits[i, p] = s_p * sum_h w[i, h] * relu(q[i, h] . K[p]),   p < context_lens[i]

    K[p] token p % block_kv of block block_table[row, p // block_kv]; other positions are NaN.
    """
    return launch(_check_paged(profile, "fp8_fp4_paged_mqa_logits", q, kv_cache, weights, context_lens, block_table,
                               schedule_meta, max_context_len, clean_logits, logits_dtype, indices))


def _fp8_paged_mqa_logits_cuda(profile: Profile, /, q: Any, kv_cache: Any, weights: Any, context_lens: Any,
                               block_table: Any, schedule_meta: Any, max_context_len: int, clean_logits: bool = False,
                               indices: Any = None) -> Any:
    """Legacy FP8 paged MQA logits: bare float8_e4m3fn q, float32 logits; see
    :func:`fp8_fp4_paged_mqa_logits`."""
    return launch(_check_paged(profile, "fp8_paged_mqa_logits", (q, None), kv_cache, weights, context_lens,
                               block_table, schedule_meta, max_context_len, clean_logits, TORCH_FLOAT32, indices))
