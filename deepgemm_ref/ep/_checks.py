"""Argument checks of the V2 buffers' dispatch and combine (contract 5.1, 6, 13, 15).

Every check is local: it reads the arguments and the buffer's own settings and raises the
package's argument error naming the argument before anything is exchanged, allocated or written
(so a bad argument on every rank raises on every rank without a hang).  The results are NumPy
views of the caller's arrays (torch CPU tensors become views of the same memory).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..dtypes import BF16, E4M3, F32, I32
from ..errors import arg_error
from ..interop import Kind, caller_kind
from ..toolkit.args import as_array, is_contiguous
from ..toolkit.sizes import check_alloc, size_arg
from ._event import EventHandle
from ._handle import EPHandle
from .routing import metadata_columns, worst_case_rows

__all__ = ["BufferSettings", "DispatchCall", "CombineCall", "check_dispatch", "check_combine", "handle_arrays", "flag",
           "count"]

I64 = np.dtype(np.int64)
#: DeepEP's limits (contract 5.1): top-k slots, experts, experts per rank, ranks.
MAX_TOPK, MAX_EXPERTS, MAX_EXPERTS_PER_RANK, MAX_RANKS = 32, 2048, 256, 1024


def flag(func: str, arg: str, v: Any) -> bool:
    """A bool argument: ``True`` / ``False``, a NumPy bool, or the ints 0 and 1 (DeepEP's own
    tests pass 0 / 1)."""
    if isinstance(v, (bool, np.bool_)) or (isinstance(v, (int, np.integer)) and int(v) in (0, 1)):
        return bool(v)
    raise arg_error(func, arg, "a bool (or 0 / 1)", f"{type(v).__name__} {v!r}")


def count(func: str, arg: str, v: Any, minimum: int = 0) -> int:
    """A size argument (a C++ int of at least ``minimum``)."""
    return size_arg(func, arg, v, minimum)


@dataclass(frozen=True)
class BufferSettings:
    """What the checks need of a buffer: its group size, target and limits."""

    owner: Any  # the buffer (handles must come from it)
    rank: int
    num_ranks: int
    ascend: bool
    num_max_tokens_per_rank: int
    num_allocated_qps: int
    allow_multiple_reduction: bool
    num_bytes: int
    check_buffer_bytes: bool
    is_ep_buffer: bool


@dataclass(frozen=True)
class DispatchCall:
    """A checked dispatch: NumPy views of the inputs and the resolved settings."""

    kind: Kind
    x: np.ndarray                # (T, H) bf16 or e4m3, contiguous
    sf: np.ndarray | None        # (T, P), any strides
    topk_idx: np.ndarray         # (T, K) int64 (the argument, or the handle's)
    topk_idx_obj: Any            # the caller's routing object (kept by the handle without a copy)
    weights: np.ndarray | None   # (T, K) float32
    stats: np.ndarray | None     # (E_l,) int32, written in place (+=)
    num_experts: int
    num_max_tokens_per_rank: int
    alignment: int
    num_sms: int
    num_qps: int
    handle: EPHandle | None
    do_handle_copy: bool
    do_cpu_sync: bool
    do_expand: bool
    do_zero_padding: bool
    col_major_sf: bool
    async_with_compute_stream: bool
    defer_epilogue: bool

    @property
    def num_topk(self) -> int:
        return int(self.topk_idx.shape[1])

    @property
    def hidden(self) -> int:
        return int(self.x.shape[1])


@dataclass(frozen=True)
class CombineCall:
    """A checked combine."""

    kind: Kind
    x: np.ndarray                 # (rows, H) bf16, contiguous
    weights: np.ndarray | None    # (rows, K) or (rows,) float32
    bias: tuple[np.ndarray | None, np.ndarray | None]
    handle: EPHandle
    topk_idx: np.ndarray          # (T, K) int64: the source routing (the handle's)
    metadata: np.ndarray          # (rows_meta, K + 2) int32
    num_recv_tokens: int          # N, the valid metadata rows
    num_experts: int
    num_max_tokens_per_rank: int
    do_expand: bool
    num_sms: int
    num_qps: int
    async_with_compute_stream: bool
    defer_epilogue: bool


def _events(func: str, previous_event: Any, previous_event_before_epilogue: Any, allocate_on_comm_stream: Any,
            async_with_compute_stream: Any, defer_epilogue: Any) -> tuple[bool, bool]:
    events = (("previous_event", previous_event), ("previous_event_before_epilogue", previous_event_before_epilogue))
    for name, ev in events:
        if ev is not None and not isinstance(ev, EventHandle):
            raise arg_error(func, name, "None or an EventHandle (buffer.capture())", type(ev).__name__)
    alloc = flag(func, "allocate_on_comm_stream", allocate_on_comm_stream)
    if previous_event is not None and not alloc:
        raise arg_error(func, "allocate_on_comm_stream", "True when previous_event is given", "False")
    async_ = flag(func, "async_with_compute_stream", async_with_compute_stream)
    defer = flag(func, "defer_epilogue", defer_epilogue)
    if defer and not async_:
        raise arg_error(func, "defer_epilogue", "False unless async_with_compute_stream=True", "True")
    return async_, defer


def _resources(func: str, s: BufferSettings, num_sms: Any, num_qps: Any, default_sms: Any) -> tuple[int, int]:
    """(num_sms, num_qps) resolved: 0 means the buffer's theoretical counts (``default_sms()``)."""
    sms = count(func, "num_sms", num_sms)
    qps = count(func, "num_qps", num_qps)
    if sms == 0:
        sms = int(default_sms())
    elif s.is_ep_buffer and sms % 2:
        sms += 1  # EPBuffer rounds an odd SM count up to even
    if qps == 0:
        qps = int(s.owner.get_theoretical_num_qps(sms))
    if qps > s.num_allocated_qps:
        raise arg_error(func, "num_qps", f"at most num_allocated_qps ({s.num_allocated_qps}): allocated QPs are "
                        "not enough", str(qps), utility=True)
    return sms, qps


def _own_handle(func: str, s: BufferSettings, handle: Any) -> EPHandle:
    # Note: a handle must come from this buffer's own dispatch (DeepEP does not check where it came from).
    if not isinstance(handle, EPHandle):
        raise arg_error(func, "handle", "an EPHandle returned by this buffer's dispatch", type(handle).__name__)
    owner = handle._owner() if isinstance(handle._owner, weakref.ref) else None
    if owner is not s.owner:
        raise arg_error(func, "handle", "a handle returned by this buffer's dispatch (rank "
                        f"{s.rank} of this group)", "a handle from another buffer, rank or configuration")
    return handle


def _routing(func: str, arg: str, topk_idx: Any, tokens: int | None, num_experts: int) -> np.ndarray:
    """``topk_idx``: int64 (T, K) contiguous, K <= 32, ids < E, no expert twice in a row."""
    # Note: ids >= num_experts and an expert twice in a row raise (the device does not check them).
    idx = as_array(topk_idx, func, arg)
    if idx.dtype != I64:
        raise arg_error(func, arg, "an int64 (deep_ep.topk_idx_t) array", idx)
    if idx.ndim != 2 or (tokens is not None and idx.shape[0] != tokens):
        raise arg_error(func, arg, f"a 2-D array of shape ({'T' if tokens is None else tokens}, num_topk)", idx)
    if not is_contiguous(idx):
        raise arg_error(func, arg, "a contiguous array", idx)
    k = idx.shape[1]
    if not 1 <= k <= MAX_TOPK:
        raise arg_error(func, arg, f"1 to {MAX_TOPK} top-k columns", idx)
    if idx.size:
        hi = int(idx.max())
        if hi >= num_experts:
            t, j = np.argwhere(idx >= num_experts)[0]
            raise arg_error(func, arg, f"expert ids below num_experts ({num_experts}) or negative (no selection)",
                            f"{hi} (first at [{t}, {j}])")
        srt = np.sort(idx, axis=1)
        dup = (srt[:, 1:] == srt[:, :-1]) & (srt[:, 1:] >= 0)
        if dup.any():
            t = int(np.flatnonzero(dup.any(axis=1))[0])
            raise arg_error(func, arg, "each expert at most once per token", f"row {t} selects an expert twice: "
                            f"{idx[t].tolist()}")
    return idx


def _experts(func: str, s: BufferSettings, num_experts: Any) -> int:
    if num_experts is None:
        raise arg_error(func, "num_experts", "the number of experts (an int)", "None")
    e = count(func, "num_experts", num_experts, 1)
    r = s.num_ranks
    if r > MAX_RANKS:
        raise arg_error(func, "group", f"at most {MAX_RANKS} ranks", str(r))
    if e % r:
        raise arg_error(func, "num_experts", f"a multiple of the number of ranks ({r})", str(e))
    if e > MAX_EXPERTS or e // r > MAX_EXPERTS_PER_RANK:
        raise arg_error(func, "num_experts", f"at most {MAX_EXPERTS} experts and {MAX_EXPERTS_PER_RANK} per rank",
                        f"{e} ({e // r} per rank)")
    return e


def check_dispatch(func: str, s: BufferSettings, *, x: Any, topk_idx: Any, topk_weights: Any,
                   cumulative_local_expert_recv_stats: Any, num_experts: Any, num_max_tokens_per_rank: Any,
                   expert_alignment: Any, num_sms: Any, num_qps: Any, previous_event: Any,
                   previous_event_before_epilogue: Any, async_with_compute_stream: Any, allocate_on_comm_stream: Any,
                   handle: Any, do_handle_copy: Any, do_cpu_sync: Any, do_expand: Any, do_zero_padding: Any,
                   use_tma_aligned_col_major_sf: Any, defer_epilogue: Any, default_sms: Any) -> DispatchCall:
    """Check a dispatch (contract 5, 15) and resolve its defaults."""
    async_, defer = _events(func, previous_event, previous_event_before_epilogue, allocate_on_comm_stream,
                            async_with_compute_stream, defer_epilogue)
    copy = flag(func, "do_handle_copy", do_handle_copy)
    if s.is_ep_buffer and copy:
        raise arg_error(func, "do_handle_copy", "False (EPBuffer keeps the caller's topk_idx)", "True", utility=True)
    expand = flag(func, "do_expand", do_expand)
    if s.ascend and not expand:
        # Note: DeepEP-Ascend's dispatch epilogue is expand-only (contract 13.2).
        raise arg_error(func, "do_expand", "True (DeepEP-Ascend's dispatch is expand-only)", "False")
    zero_padding = flag(func, "do_zero_padding", do_zero_padding)
    if zero_padding and not expand:
        raise arg_error(func, "do_zero_padding", "False unless do_expand=True", "True")
    col_major = flag(func, "use_tma_aligned_col_major_sf", use_tma_aligned_col_major_sf)
    sync = None if do_cpu_sync is None else flag(func, "do_cpu_sync", do_cpu_sync)

    # the routing: the argument, or the handle's
    if handle is not None:
        h = _own_handle(func, s, handle)
        if topk_idx is not None:
            raise arg_error(func, "topk_idx", "None with a cached handle (the handle's routing is reused)",
                            "an array", utility=True)
        if sync:
            raise arg_error(func, "do_cpu_sync", "None or False with a cached handle", "True", utility=True)
        sync = False
        checks = (("num_experts", num_experts, h.num_experts), ("expert_alignment", expert_alignment,
                  h.expert_alignment), ("num_max_tokens_per_rank", num_max_tokens_per_rank, h.num_max_tokens_per_rank))
        for name, given, kept in checks:
            if given is not None and given != kept:
                raise arg_error(func, name, f"the handle's value {kept} (or None)", repr(given), utility=True)
        if expand != bool(h.do_expand):
            raise arg_error(func, "do_expand", f"the handle's layout (do_expand={bool(h.do_expand)})", str(expand))
        e = int(h.num_experts)
        alignment = int(h.expert_alignment)
        t_max = int(h.num_max_tokens_per_rank)
        routing_obj = h.topk_idx
        routing = _routing(func, "handle.topk_idx", routing_obj, None, e)
    else:
        h = None
        e = _experts(func, s, num_experts)
        alignment = 1 if expert_alignment is None else count(func, "expert_alignment", expert_alignment, 1)
        t_max = s.num_max_tokens_per_rank if num_max_tokens_per_rank is None else count(
            func, "num_max_tokens_per_rank", num_max_tokens_per_rank)
        if topk_idx is None:
            raise arg_error(func, "topk_idx", "the routing (T, num_topk) int64 array (or a cached handle)", "None")
        routing_obj = topk_idx
        routing = _routing(func, "topk_idx", topk_idx, None, e)
        sync = True if sync is None else sync

    # the data
    fp8 = isinstance(x, (tuple, list))
    if fp8:
        if len(x) != 2:
            raise arg_error(func, "x", "a bf16 array or an (x_e4m3, sf) pair", f"a sequence of {len(x)}")
        xa = as_array(x[0], func, "x[0]")
        sf = as_array(x[1], func, "x[1]")
        if xa.dtype != E4M3:
            raise arg_error(func, "x[0]", "a float8_e4m3fn array", xa)
    else:
        xa = as_array(x, func, "x")
        sf = None
        if xa.dtype != BF16:
            raise arg_error(func, "x", "a bfloat16 array (or an (x_e4m3, sf) pair)", xa)
    xname = "x[0]" if fp8 else "x"
    if xa.ndim != 2 or not is_contiguous(xa):
        raise arg_error(func, xname, "a contiguous 2-D array (T, hidden)", xa)
    t_count, hidden = xa.shape
    if (hidden * xa.itemsize) % 16:
        raise arg_error(func, xname, "rows of a multiple of 16 bytes", xa)
    if t_count > t_max:
        raise arg_error(func, xname, f"at most num_max_tokens_per_rank ({t_max}) rows", xa)
    if routing.shape[0] != t_count:
        raise arg_error(func, "handle.topk_idx" if h is not None else "topk_idx",
                        f"{t_count} rows (one per token of x)", routing)
    if sf is not None:
        pack = 2 if s.ascend else 4
        if sf.ndim != 2 or sf.shape[0] != t_count:
            raise arg_error(func, "x[1]", f"a 2-D scale-factor array with {t_count} rows", sf)
        if sf.itemsize != pack:
            raise arg_error(func, "x[1]", f"{pack}-byte scale-factor packs"
                            + (" (int16 views on DeepEP-Ascend)" if s.ascend else " (float32 or packed UE8M0 int32)"),
                            sf)
    k = routing.shape[1]
    w = None
    if topk_weights is not None:
        w = as_array(topk_weights, func, "topk_weights")
        if w.dtype != F32 or w.shape != (t_count, k) or not is_contiguous(w):
            raise arg_error(func, "topk_weights", f"a contiguous float32 array of shape ({t_count}, {k})", w)
    stats = None
    if cumulative_local_expert_recv_stats is not None:
        stats = as_array(cumulative_local_expert_recv_stats, func, "cumulative_local_expert_recv_stats")
        e_l = e // s.num_ranks
        if stats.dtype != I32 or stats.shape != (e_l,) or not is_contiguous(stats) or not stats.flags.writeable:
            raise arg_error(func, "cumulative_local_expert_recv_stats",
                            f"a writeable contiguous int32 array of shape ({e_l},)", stats)
    sms, qps = _resources(func, s, num_sms, num_qps, lambda: default_sms(e, k))
    if s.check_buffer_bytes:
        from ._topology import dispatch_buffer_bytes

        need = dispatch_buffer_bytes(s.num_ranks, t_max, hidden, 0 if sf is None else sf.shape[1], k, xa.itemsize)
        if need > s.num_bytes:
            raise arg_error(func, "num_max_tokens_per_rank", f"a dispatch that fits the buffer's {s.num_bytes} bytes",
                            f"{need} bytes needed")
    if not sync:  # the worst-case allocation is known before anything is exchanged
        rows = worst_case_rows(s.num_ranks, t_max, k, e // s.num_ranks, alignment, expand)
        row_bytes = hidden * xa.itemsize + (0 if sf is None else sf.shape[1] * sf.itemsize) + 4 * k + 8 * k
        check_alloc(func, "num_max_tokens_per_rank", rows * row_bytes, "the worst-case received tokens")
    kind = caller_kind(x, routing_obj, topk_weights, cumulative_local_expert_recv_stats)
    return DispatchCall(kind=kind, x=xa, sf=sf, topk_idx=routing, topk_idx_obj=routing_obj, weights=w, stats=stats,
                        num_experts=e, num_max_tokens_per_rank=t_max, alignment=alignment, num_sms=sms, num_qps=qps,
                        handle=h, do_handle_copy=copy, do_cpu_sync=bool(sync), do_expand=expand,
                        do_zero_padding=zero_padding, col_major_sf=col_major, async_with_compute_stream=async_,
                        defer_epilogue=defer)


def handle_arrays(func: str, s: BufferSettings, h: EPHandle) -> tuple[np.ndarray, np.ndarray, int]:
    """(routing (T, K) int64, metadata (rows, K + 2) int32, N) of a handle, checked."""
    routing = _routing(func, "handle.topk_idx", h.topk_idx, None, int(h.num_experts))
    k = routing.shape[1]
    meta = as_array(h.recv_src_metadata, func, "handle.recv_src_metadata")
    if meta.dtype != I32 or meta.ndim != 2 or meta.shape[1] != k + 2:
        raise arg_error(func, "handle.recv_src_metadata", f"an int32 array of shape (rows, {k + 2})", meta)
    psum = as_array(h.psum_num_recv_tokens_per_scaleup_rank, func, "handle.psum_num_recv_tokens_per_scaleup_rank")
    if psum.dtype != I32 or psum.shape != (s.num_ranks,):
        raise arg_error(func, "handle.psum_num_recv_tokens_per_scaleup_rank",
                        f"an int32 array of shape ({s.num_ranks},)", psum)
    n = int(psum[-1]) if psum.size else 0
    if not 0 <= n <= meta.shape[0]:
        raise arg_error(func, "handle.psum_num_recv_tokens_per_scaleup_rank",
                        f"a received-token count within the metadata's {meta.shape[0]} rows", str(n))
    return routing, meta, n


def check_combine(func: str, s: BufferSettings, *, x: Any, handle: Any, topk_weights: Any, bias: Any,
                  num_sms: Any, num_qps: Any, previous_event: Any, previous_event_before_epilogue: Any,
                  async_with_compute_stream: Any, allocate_on_comm_stream: Any,
                  defer_epilogue: Any) -> CombineCall:
    """Check a combine (contract 6, 15)."""
    async_, defer = _events(func, previous_event, previous_event_before_epilogue, allocate_on_comm_stream,
                            async_with_compute_stream, defer_epilogue)
    h = _own_handle(func, s, handle)
    routing, meta, n = handle_arrays(func, s, h)
    t_count, k = routing.shape
    t_max = int(h.num_max_tokens_per_rank)
    if t_count > t_max:
        raise arg_error(func, "handle.topk_idx", f"at most num_max_tokens_per_rank ({t_max}) rows", routing)
    xa = as_array(x, func, "x")
    if xa.dtype != BF16 or xa.ndim != 2 or not is_contiguous(xa):
        raise arg_error(func, "x", "a contiguous 2-D bfloat16 array", xa)
    rows, hidden = xa.shape
    if (hidden * 2) % 16:
        raise arg_error(func, "x", "rows of a multiple of 16 bytes", xa)
    # Note: H % 256 == 0 (a CUDA kernel constraint) is required on the CUDA profiles only.
    if not s.ascend and hidden % 256:
        raise arg_error(func, "x", "a hidden size that is a multiple of 256 (DeepEP's combine kernels)", xa)
    expand = bool(h.do_expand)
    _, _, slots = metadata_columns(k, s.ascend)
    # Note: an expanded combine needs rows for every slot (DeepEP does not check its row count).
    if expand:
        used = meta[:n, slots]
        need = int(used.max()) + 1 if used.size else 0
        if rows < need:
            raise arg_error(func, "x", f"at least {need} rows (the expanded layout's slots)", xa)
    elif rows != meta.shape[0]:
        raise arg_error(func, "x", f"{meta.shape[0]} rows (one per row of handle.recv_src_metadata)", xa)
    w = None
    if topk_weights is not None:
        w = as_array(topk_weights, func, "topk_weights")
        shape = (rows,) if expand else (rows, k)
        if w.dtype != F32 or w.shape != shape or not is_contiguous(w):
            raise arg_error(func, "topk_weights", f"a contiguous float32 array of shape {shape}", w)
        if expand and not s.allow_multiple_reduction:
            raise arg_error(func, "topk_weights", "None for an expanded combine without allow_multiple_reduction",
                            "an array")
    if bias is None:
        biases: tuple[Any, ...] = ()
    elif isinstance(bias, tuple):
        if len(bias) != 2:
            raise arg_error(func, "bias", "None, an array or a 2-tuple of arrays", f"a {len(bias)}-tuple", utility=True)
        biases = bias
    else:
        biases = (bias,)
    checked = []
    for i, b in enumerate(biases):
        name = "bias" if not isinstance(bias, tuple) else f"bias[{i}]"
        ba = as_array(b, func, name)
        if ba.dtype != BF16 or ba.shape != (t_count, hidden) or not is_contiguous(ba):
            raise arg_error(func, name, f"a contiguous bfloat16 array of shape ({t_count}, {hidden})", ba)
        checked.append(ba)
    b0 = checked[0] if checked else None
    b1 = checked[1] if len(checked) > 1 else None
    sms = int(h.num_sms) if count(func, "num_sms", num_sms) == 0 else num_sms
    sms, qps = _resources(func, s, sms, num_qps, lambda: h.num_sms)
    kind = caller_kind(x, topk_weights, *biases)
    return CombineCall(kind=kind, x=xa, weights=w, bias=(b0, b1), handle=h, topk_idx=routing, metadata=meta,
                       num_recv_tokens=n, num_experts=int(h.num_experts), num_max_tokens_per_rank=t_max,
                       do_expand=expand, num_sms=sms, num_qps=qps, async_with_compute_stream=async_,
                       defer_epilogue=defer)
