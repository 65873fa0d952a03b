"""Argument contracts of the MQA-logits functions shared by both targets, and the device constants.

Sequence lengths and key ranges, weights, head counts, ``logits_dtype``, DeepGEMM-Ascend's Q
scales, paged context lengths, block tables and schedules: each check raises the argument error
naming the argument, before anything is allocated or computed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import dryrun
from .. import formats as fm
from ..errors import arg_error
from ..interop import torch_dtype_name
from ..profiles import Profile
from ..toolkit.args import BF16, I16, I32, ceil_div, check, dtype_name, is_contiguous, unit_stride
from ..toolkit.sizes import check_alloc, nbytes
from .keys import ue8m0_scales

__all__ = [
    "TORCH_FLOAT32",
    "logits_format",
    "check_seq_lens",
    "check_ranges",
    "check_weights",
    "cuda_heads",
    "cuda_weights_and_dtype",
    "ascend_heads",
    "ascend_q_scales",
    "check_context_lens_2d",
    "check_nonnegative",
    "check_indices",
    "PagedRows",
    "paged_rows",
    "check_schedule",
    "check_logits_alloc",
]

# DeepGEMM constants (csrc/apis/attention.hpp and the schedulers)
_SPLIT_KV = 256  # DeepGEMM's KV split (paged schedule and logits padding)
_CLEAN_BLOCK = 8192  # smxx_clean_logits' column block
_SMEM_CAPACITY = 232448  # SM90ArchSpec / SM100ArchSpec::smem_capacity (bytes)
# DeepGEMM-Ascend constants
_ASC_SPLIT_KV = 512
_ASC_ROW_ALIGN = 256  # 512-byte aligned bf16 rows
_ASC_UB_BYTES = 248 * 1024


class _TorchDtypeName:
    """``torch.float32`` in a signature without importing torch (``repr`` is the torch name)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"torch.{self.name}"


TORCH_FLOAT32 = _TorchDtypeName("float32")


def logits_format(func: str, logits_dtype: Any) -> fm.Format:
    """float32 or bfloat16 given as a torch dtype, a NumPy / ml_dtypes dtype, or its name."""
    # Note: logits_dtype may also be a NumPy / ml_dtypes dtype (DeepGEMM takes torch dtypes only).
    name: str | None = None
    if isinstance(logits_dtype, _TorchDtypeName):
        name = logits_dtype.name
    elif type(logits_dtype).__module__.startswith("torch"):
        name = torch_dtype_name(logits_dtype)
    else:
        try:
            name = np.dtype(logits_dtype).name
        except TypeError:
            name = None
    if name == "float32":
        return fm.F32
    if name == "bfloat16":
        return fm.BF16
    raise arg_error(func, "logits_dtype", "float32 or bfloat16 (torch.float32 / torch.bfloat16, or the NumPy "
                    "and ml_dtypes dtypes)", repr(logits_dtype))


def check_logits_alloc(func: str, arg: str, rows: int, stride: int, out: fm.Format) -> None:
    """The padded logits output (rows x stride elements of ``out``) within the allocation limit;
    ``arg`` names the argument that sizes it."""
    check_alloc(func, arg, nbytes((rows, stride), np.dtype(out.storage).itemsize),
                f"the padded logits output ({rows} x {stride} {out.name})")


def check_seq_lens(func: str, arg: str, x: np.ndarray, seq: int) -> np.ndarray:
    # Note: cu_seq_len_k_start / _end must be 1-D; DeepGEMM only checks size(0) and contiguity.
    check(x.ndim == 1 and x.shape[0] == seq, func, arg, f"a 1-D array of {seq} entries (one per query)", x)
    check(x.dtype == I32, func, arg, "dtype int32", x)
    check(is_contiguous(x), func, arg, "a contiguous array", x)
    return x.astype(np.int64)


def check_ranges(func: str, ks: np.ndarray, ke: np.ndarray, seq_kv: int, max_seqlen_k: int) -> None:
    # Note: DeepGEMM does not check the key ranges (a bad range reads or writes out of bounds;
    # DeepGEMM-Ascend clamps ends to seq_len_kv); here they must satisfy 0 <= start <= end <= seq_len_kv
    # and, for compressed logits, end - start <= max_seqlen_k.
    bad = np.flatnonzero((ks < 0) | (ks > ke))
    if bad.size:
        i = int(bad[0])
        raise arg_error(func, "cu_seq_len_k_start", "0 <= cu_seq_len_k_start[i] <= cu_seq_len_k_end[i]",
                        f"start {int(ks[i])}, end {int(ke[i])} at query {i}")
    bad = np.flatnonzero(ke > seq_kv)
    if bad.size:
        i = int(bad[0])
        raise arg_error(func, "cu_seq_len_k_end", f"ends <= seq_len_kv = {seq_kv}", f"{int(ke[i])} at query {i}")
    if max_seqlen_k > 0:
        bad = np.flatnonzero(ke - ks > max_seqlen_k)
        if bad.size:
            i = int(bad[0])
            raise arg_error(func, "max_seqlen_k", "at least every end - start (compressed rows hold a whole range)",
                            f"{max_seqlen_k} < {int(ke[i] - ks[i])} at query {i}")


def check_weights(func: str, w: np.ndarray, rows: int, heads: int, dtypes: tuple[np.dtype, ...],
                   contiguous: bool = False) -> None:
    check(w.ndim == 2 and w.shape == (rows, heads), func, "weights", f"shape ({rows}, {heads})", w)
    check(unit_stride(w, 1), func, "weights", "stride(1) == 1", w)
    if contiguous:
        check(is_contiguous(w), func, "weights", "a contiguous array (FP8 paged MQA logits)", w)
    check(w.dtype in dtypes, func, "weights", "dtype " + " or ".join(dtype_name(t) for t in dtypes), w)


def cuda_heads(func: str, arg: str, profile: Profile, heads: int, x: np.ndarray) -> None:
    allowed = profile.rules.mqa_heads
    check(heads in allowed, func, arg, f"num_heads in {allowed} on {profile.name}", x)


def cuda_weights_and_dtype(func: str, w: np.ndarray, rows: int, heads: int, profile: Profile, out: fm.Format,
                           contiguous: bool) -> None:
    check_weights(func, w, rows, heads, profile.rules.mqa_weight_dtypes, contiguous)
    if w.dtype == BF16 and out is not fm.BF16:
        raise arg_error(func, "logits_dtype", "bfloat16 with bfloat16 weights", "float32")


def ascend_heads(func: str, heads: int, x: Any) -> None:
    check(4 <= heads <= 64 and heads % 4 == 0, func, "q[0]", "num_heads a multiple of 4 in [4, 64]", x)


def ascend_q_scales(func: str, q_sf: np.ndarray | None, rows: int, heads: int, pairs: int,
                     four_d: bool) -> np.ndarray:
    """int16 UE8M0 pairs (rows * H, D / 64) (or (rows, H, D / 64) / (rows, 1, H, D / 64)), any
    strides -> float64 scales (rows, H, D / 32)."""
    check(q_sf is not None, func, "q[1]", "int16 Q scale factors (MQA logits requires Q scale factors)", "None")
    assert q_sf is not None
    check(q_sf.dtype == I16, func, "q[1]", "dtype int16 (packed UE8M0 pairs)", q_sf)
    sf = q_sf
    if four_d and sf.ndim == 4:
        check(sf.shape[0] == rows and sf.shape[1] == 1 and sf.shape[2] == heads, func, "q[1]",
               f"shape ({rows}, 1, {heads}, {pairs})", sf)
        sf = sf.reshape(rows * heads, sf.shape[3])
    elif not four_d and sf.ndim == 3:
        check(sf.shape[0] == rows and sf.shape[1] == heads, func, "q[1]", f"shape ({rows}, {heads}, {pairs})", sf)
        sf = sf.reshape(rows * heads, sf.shape[2])
    check(sf.ndim == 2 and sf.shape == (rows * heads, pairs), func, "q[1]",
           f"shape ({rows * heads}, {pairs}) = (tokens * num_heads, head_dim / 64)", q_sf)
    by = fm.unpack_ue8m0_int16(sf)
    return ue8m0_scales(by).reshape(rows, heads, 2 * pairs)


def check_context_lens_2d(func: str, x: np.ndarray) -> None:
    check(x.ndim == 2, func, "context_lens", "a 2-D array (batch_size, next_n) (only 2D context lens is supported)",
           x)
    check(x.dtype == I32, func, "context_lens", "dtype int32", x)
    check(is_contiguous(x), func, "context_lens", "a contiguous array", x)


def check_nonnegative(func: str, arg: str, x: np.ndarray) -> None:
    # Note: negative context lengths are rejected (the kernels read them as huge unsigned values).
    bad = np.flatnonzero(x.reshape(-1) < 0)
    if bad.size:
        raise arg_error(func, arg, "non-negative values", f"{int(x.reshape(-1)[bad[0]])} at flat index {int(bad[0])}")


def check_indices(func: str, idx: np.ndarray, rows: int) -> None:
    check(idx.ndim == 1 and idx.shape[0] == rows, func, "indices", f"a 1-D array of {rows} entries", idx)
    check(is_contiguous(idx), func, "indices", "a contiguous array", idx)
    check(idx.dtype == I32, func, "indices", "dtype int32", idx)


@dataclass
class PagedRows:
    """Requests and per-row virtual key ranges of a paged call (after validation)."""

    ks: np.ndarray
    ke: np.ndarray
    base: np.ndarray
    bt_rows: np.ndarray


def paged_rows(func: str, ctx: np.ndarray, starts: np.ndarray, counts: np.ndarray, bt_rows: np.ndarray,
                block_table: np.ndarray, page: int, num_pages: int, max_context_len: int) -> PagedRows:
    """Validate context lengths and the block-table entries the kernel reads; lay requests out.

    Request r (rows starts[r] .. + counts[r]) is computed up to its last row's context length
    ctx_r, reading pages block_table[bt_rows[r], :ceil(ctx_r / page)].
    """
    rows = ctx.size
    check_nonnegative(func, "context_lens", ctx)
    # Note: context lengths past max_context_len, rows whose context exceeds their request's last
    # row (the kernel computes each request up to that length only) and block-table entries that
    # are out of range or missing for the context are rejected; DeepGEMM does not check them.
    big = np.flatnonzero(ctx > max_context_len)
    if big.size:
        raise arg_error(func, "max_context_len", "at least every context length",
                        f"{max_context_len} < context_lens {int(ctx[big[0]])} at query row {int(big[0])}")
    req = np.repeat(np.arange(starts.size), counts)
    req_ctx = ctx[starts + counts - 1] if starts.size else np.zeros(0, np.int64)
    over = np.flatnonzero(ctx > req_ctx[req]) if rows else np.zeros(0, np.int64)
    if over.size:
        i = int(over[0])
        raise arg_error(func, "context_lens", "every row's context length at most its request's last row's "
                        "(the kernel computes a request up to that length)",
                        f"{int(ctx[i])} at row {i} > {int(req_ctx[req[i]])}")
    pages = ceil_div(req_ctx, page)
    need = int(pages.max(initial=0))
    if need > block_table.shape[1]:
        r = int(np.argmax(pages))
        raise arg_error(func, "block_table", f"at least {need} columns (ceil(context length / {page}))",
                        f"{block_table.shape[1]} columns for request rows starting at {int(starts[r])}")
    if need:
        used = np.arange(need)[None, :] < pages[:, None]
        entries = block_table[bt_rows][:, :need]
        bad = used & ((entries < 0) | (entries >= num_pages))
        if np.any(bad):
            r, p = (int(v) for v in np.argwhere(bad)[0])
            raise arg_error(func, "block_table", f"page indices in [0, {num_pages})",
                            f"{int(entries[r, p])} at [{int(bt_rows[r])}, {p}]")
    base = np.concatenate([[0], np.cumsum(req_ctx)]).astype(np.int64)
    ks = base[:-1][req] if rows else np.zeros(0, np.int64)
    return PagedRows(ks, ks + ctx, base, bt_rows)


def check_schedule(func: str, meta: np.ndarray, expected: np.ndarray, how: str, *sources: np.ndarray) -> None:
    """``meta`` is the schedule ``expected`` (computed from ``sources``): shape, dtype, contiguity and
    values; the values only where ``meta`` and the sources have them (not for dry-run meta tensors)."""
    check(meta.ndim == 2 and meta.shape == expected.shape, func, "schedule_meta",
           f"shape {expected.shape} (get_num_sms() + 1, 2)", meta)
    check(meta.dtype == I32 and is_contiguous(meta), func, "schedule_meta", "a contiguous int32 array", meta)
    # Note: the schedule must equal what get_paged_mqa_logits_metadata returns for these inputs
    # (DeepGEMM checks only shape, dtype and contiguity; a stale one makes the device skip or
    # repeat work).  The logits never depend on it.
    if not dryrun.has_data(meta, *sources):
        return
    diff = np.argwhere(meta != expected)
    if diff.size:
        r = int(diff[0][0])
        raise arg_error(func, "schedule_meta", f"the schedule {how} returns for these inputs",
                        f"row {r} = {tuple(int(v) for v in meta[r])}, expected {tuple(int(v) for v in expected[r])}")
