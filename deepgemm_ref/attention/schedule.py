"""The paged MQA kernel's work partition over SMs / AI cores (``get_paged_mqa_logits_metadata``).

DeepGEMM sm100: requests of ``next_n`` rows (or runs of equal ``indices``), work
``ceil(ctx / 256) * rows`` per request split evenly over the SMs; sm90: segments times atoms with
the remainder to the last SMs; DeepGEMM-Ascend: a cost model over 512-token splits,
balanced over the AI cores.  The logits never depend on the schedule, but the paged kernels
require the one these functions return.  The SM (AI-core) count is :func:`deepgemm_ref.runtime.num_sms` of the
profile the dispatcher hands the call.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import runtime
from ..interop import caller_kind, from_numpy
from ..profiles import Profile
from ..toolkit.args import I32, align, as_array, ceil_div, check, is_contiguous
from ..toolkit.sizes import check_alloc, size_arg
from .contracts import (
    _ASC_SPLIT_KV,
    _ASC_UB_BYTES,
    _SMEM_CAPACITY,
    _SPLIT_KV,
    check_context_lens_2d,
    check_indices,
    check_nonnegative,
)

__all__ = ["runs", "requests", "cuda_schedule", "ascend_schedule_checked"]


def runs(indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first row, row count) of the maximal runs of equal values."""
    n = indices.size
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    starts = np.flatnonzero(np.concatenate([[True], indices[1:] != indices[:-1]])).astype(np.int64)
    counts = np.diff(np.concatenate([starts, [n]])).astype(np.int64)
    return starts, counts


def requests(rows: int, next_n: int, indices: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Requests as (first row, rows): groups of next_n rows, or runs of equal ``indices``."""
    if indices is None:
        starts = np.arange(0, rows, next_n, dtype=np.int64) if next_n else np.zeros(0, np.int64)
        return starts, np.full(starts.size, next_n, np.int64)
    return runs(indices)


def _sm100_schedule(ctx: np.ndarray, next_n: int, num_sms: int, indices: np.ndarray | None) -> np.ndarray:
    """DeepGEMM sm100: work = ceil(ctx / 256) * rows per request, split evenly by units."""
    total_rows = ctx.size
    starts, counts = requests(total_rows, next_n, indices)
    req_ctx = ctx[starts + counts - 1] if starts.size else np.zeros(0, np.int64)
    work = ceil_div(req_ctx, _SPLIT_KV) * counts
    prefix = np.cumsum(work)
    total = int(prefix[-1]) if prefix.size else 0
    q, rem = divmod(total, num_sms)
    s = np.arange(num_sms + 1, dtype=np.int64)
    w = s * q + np.minimum(s, rem)
    r = np.searchsorted(prefix, w, side="right")
    meta = np.empty((num_sms + 1, 2), np.int32)
    valid = r < starts.size
    rv = r[valid]
    before = np.where(rv > 0, prefix[np.maximum(rv - 1, 0)], 0)
    meta[valid, 0] = starts[rv]
    meta[valid, 1] = (w[valid] - before) // counts[rv]
    meta[~valid] = (total_rows, 0)
    return meta


def _sm90_schedule(ctx: np.ndarray, batch: int, next_n: int, num_sms: int) -> np.ndarray:
    """DeepGEMM sm90 (non-varlen): per batch ceil(ctx / 256) segments x ceil(next_n / atom) atoms
    (atom 2 when next_n >= 2), split with the remainder given to the last SMs."""
    req_ctx = ctx.reshape(batch, next_n)[:, -1] if batch else np.zeros(0, np.int64)
    segs = ceil_div(req_ctx, _SPLIT_KV)
    prefix = np.cumsum(segs)
    total_segs = int(prefix[-1]) if prefix.size else 0
    atom = 2 if next_n >= 2 else 1
    atoms = ceil_div(next_n, atom)
    total = total_segs * atoms
    q, r = divmod(total, num_sms)
    pivot = num_sms - r
    meta = np.empty((num_sms + 1, 2), np.int32)
    # Entries past the batch read the zero-padded prefix (= the total): no segments there.
    ext = np.concatenate([prefix, [total_segs]]).astype(np.int64)
    for sm in range(num_sms):
        seg = sm * q + (sm - pivot if sm > pivot else 0)
        qi = int(np.searchsorted(prefix * atoms, seg, side="right"))
        prev = int(ext[qi - 1]) if qi > 0 else 0
        off = seg - prev * atoms
        nseg = int(ext[qi]) - prev
        atom_idx, split = (off // nseg, off % nseg) if nseg > 0 else (0, 0)
        meta[sm] = (qi * atoms + atom_idx, split)
    meta[num_sms] = (batch * atoms, 0)
    return meta


def _ascend_schedule(ctx: np.ndarray, indices: np.ndarray, heads: int, cores: int) -> np.ndarray:
    """DeepGEMM-Ascend: requests = runs of ``indices``, cost-balanced over the cores."""
    rows = ctx.size
    tile = 64 // heads  # queries per MMAD tile (MAD_M = 64 // H * H)
    starts, counts = runs(indices)
    req_ctx = ctx[starts + counts - 1] if starts.size else np.zeros(0, np.int64)

    def split_cost(nq: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        tiles = ceil_div(nq, tile)
        c0 = 2 + 2 * tiles if tile > 1 else tiles
        return ceil_div(tokens, _ASC_SPLIT_KV // 4) * c0 + 2

    splits = ceil_div(req_ctx, _ASC_SPLIT_KV)
    full = split_cost(counts, np.full(counts.size, _ASC_SPLIT_KV))
    last = split_cost(counts, req_ctx - (splits - 1) * _ASC_SPLIT_KV)
    cost = np.where(splits == 0, 0, (splits - 1) * full + last)
    prefix = np.cumsum(cost)
    meta = np.empty((cores + 1, 2), np.int32)
    meta[:] = (rows, 0)
    total = int(prefix[-1]) if prefix.size else 0
    for c in range(cores + 1):
        target = c * (total // cores) + min(c, total % cores)
        if target < total:
            r = int(np.searchsorted(prefix, target, side="right"))
            prev = int(prefix[r - 1]) if r > 0 else 0
            meta[c] = (starts[r], min((target - prev) // int(full[r]), int(splits[r]) - 1))
    return meta


def _sm100_checked(func: str, ctx_a: np.ndarray, ctx: np.ndarray, next_n: int, sms: int,
                   idx: np.ndarray | None) -> np.ndarray:
    batch = int(ctx_a.shape[0])
    check(2 * batch * 4 <= _SMEM_CAPACITY, func, "context_lens",
          f"at most {_SMEM_CAPACITY // 8} requests (the schedule kernel's shared memory)", ctx_a)
    return _sm100_schedule(ctx, next_n, sms, None if idx is None else idx.astype(np.int64))


def _sm90_checked(func: str, ctx_a: np.ndarray, ctx: np.ndarray, next_n: int, sms: int,
                  idx: np.ndarray | None) -> np.ndarray:
    batch = int(ctx_a.shape[0])
    check(align(batch, 32) * 4 <= _SMEM_CAPACITY, func, "context_lens",
          f"batch_size <= {_SMEM_CAPACITY // 4} (the schedule kernel's shared memory)", ctx_a)
    # Note: an all-zero schedule (no work) with batch_size a multiple of 32 gives the sentinel row
    # everywhere; DeepGEMM's sm90 kernel reads one shared-memory word past its prefix sums there.
    return _sm90_schedule(ctx, batch, next_n, sms)


#: DeepGEMM's schedule kernels by ``KernelRules.paged_schedule``.
_CUDA_SCHEDULES = {"sm100": _sm100_checked, "sm90": _sm90_checked}


def cuda_schedule(profile: Profile, func: str, context_lens: Any, block_kv: Any, num_sms: Any,
                  indices: Any) -> np.ndarray:
    """DeepGEMM's validated schedule (``profile``'s rules and schedule kernel)."""
    rules = profile.rules
    ctx_a = as_array(context_lens, func, "context_lens")
    check_context_lens_2d(func, ctx_a)
    bkv = size_arg(func, "block_kv", block_kv, minimum=None)
    # Note: num_sms must be at least 1 (DeepGEMM divides the work by it on the device).
    sms = size_arg(func, "num_sms", num_sms, minimum=1)
    # the schedule (num_sms + 1, 2) int32 and the sm100 schedule's int64 working arrays per SM
    check_alloc(func, "num_sms", (sms + 1) * 56, f"the schedule of {sms} + 1 rows")
    batch, next_n = int(ctx_a.shape[0]), int(ctx_a.shape[1])
    idx = as_array(indices, func, "indices", allow_none=True)
    sizes = " or ".join(str(v) for v in rules.paged_block_kv)
    if idx is not None:
        check(rules.varlen_indices, func, "indices", f"None on {profile.name} (varlen paged MQA logits need sm100)",
              idx)
        check(next_n == 1, func, "context_lens", "next_n == 1 with indices (varlen)", ctx_a)
        check(bkv in rules.paged_block_kv, func, "block_kv", sizes, repr(bkv))
        check_indices(func, idx, batch)
    else:
        check(bkv in rules.paged_block_kv, func, "block_kv", f"{sizes} on {profile.name}", repr(bkv))
    check_nonnegative(func, "context_lens", ctx_a)
    ctx = ctx_a.astype(np.int64).reshape(-1)
    return _CUDA_SCHEDULES[rules.paged_schedule](func, ctx_a, ctx, next_n, sms, idx)


def _get_paged_mqa_logits_metadata_cuda(profile: Profile, /, context_lens: Any, block_kv: int, num_sms: int,
                                        indices: Any = None) -> Any:
    """The paged kernel's work partition over SMs: int32 (num_sms + 1, 2).

    context_lens: int32 (batch_size, next_n), contiguous (2-D only).  block_kv: 32 or 64 (sm100),
    64 (sm90).  indices (varlen, sm100, next_n == 1): int32 (batch_size,) - runs of equal values
    form one request.  Row s is (first query row, 256-token split) where SM s starts.

    sm100: requests of next_n rows (or runs); work_r = ceil(ctx_r / 256) * rows_r with ctx_r the
    request's last row's context length; SM s starts at unit s * (W // num_sms) + min(s, W % num_sms);
    units at or past W give (total rows, 0).  sm90: per batch ceil(ctx / 256) segments times
    ceil(next_n / atom) atoms (atom 2 when next_n >= 2), remainder to the last SMs, row num_sms is
    (batch_size * atoms, 0).  The logits never depend on the schedule.
    """
    func = "get_paged_mqa_logits_metadata"
    kind = caller_kind(context_lens, indices)
    return from_numpy(cuda_schedule(profile, func, context_lens, block_kv, num_sms, indices), kind)


def ascend_schedule_checked(profile: Profile, func: str, context_lens: Any, num_heads: Any,
                            indices: Any) -> np.ndarray:
    """DeepGEMM-Ascend's validated schedule over ``profile``'s AI cores (:func:`deepgemm_ref.runtime.num_sms`)."""
    ctx_a = as_array(context_lens, func, "context_lens")
    check(ctx_a.ndim == 2 and ctx_a.shape[1] == 1 and is_contiguous(ctx_a) and ctx_a.dtype == I32, func,
           "context_lens", "a contiguous int32 array (num_q_tokens, 1)", ctx_a)
    rows = int(ctx_a.shape[0])
    idx = as_array(indices, func, "indices")
    check_indices(func, idx, rows)
    heads = size_arg(func, "num_heads", num_heads, minimum=None)
    check(4 <= heads <= 64 and heads % 4 == 0, func, "num_heads", "a multiple of 4 in [4, 64]", repr(heads))
    cores = runtime.num_sms(profile)
    check(0 < cores < 256, func, "get_num_sms()", "1..255 cores", repr(cores))
    ub = align(align(8 * rows + 32, 32) + 8 * (cores + 1), 32)
    check(ub <= _ASC_UB_BYTES, func, "context_lens", "num_q_tokens small enough for the schedule kernel's "
           f"unified buffer ({_ASC_UB_BYTES} bytes)", f"{rows} rows need {ub} bytes")
    check_nonnegative(func, "context_lens", ctx_a)
    return _ascend_schedule(ctx_a.astype(np.int64).reshape(-1), idx.astype(np.int64), heads, cores)


def _get_paged_mqa_logits_metadata_ascend(profile: Profile, /, context_lens: Any, num_heads: int, indices: Any) -> Any:
    """The paged kernel's schedule on DeepGEMM-Ascend: int32 (get_num_sms() + 1, 2).

    context_lens int32 (B, 1) contiguous; num_heads a multiple of 4 in [4, 64]; indices int32 (B,)
    (required: runs of equal values are requests).  A request of nq rows and context L (its last
    row's) costs ceil(L/512) - 1 full splits plus the tail, split cost ceil(tokens/128) * c0 + 2 with
    c0 = 2 + 2 ceil(nq / tile) (tile = 64 // H > 1) or ceil(nq / tile); core c starts at cost
    c * (W // C) + min(c, W % C): row (first row of the owning request, split), else (B, 0).
    """
    func = "get_paged_mqa_logits_metadata"
    kind = caller_kind(context_lens, indices)
    return from_numpy(ascend_schedule_checked(profile, func, context_lens, num_heads, indices), kind)
