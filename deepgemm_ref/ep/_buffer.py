"""DeepEP's V2 buffers, ``ElasticBuffer`` and ``EPBuffer``: dispatch and combine over a group of ranks.

Every dispatch and combine is a collective of the group (all ranks call it, in the same order) and
reads: check (:mod:`._checks`, local, before anything moves) -> exchange (through the group's
:class:`~deepgemm_ref.comm.Transport` only, so every form of the group gives the same bytes) ->
assemble (:mod:`.routing`, :mod:`.reduction`).

Each exchange starts with an ``all_gather`` of a small header (the call's settings and the rows
sent to every rank): ranks whose calls disagree (another ``num_experts``, hidden size, dtype, a
cached call against a fresh one, ...) all raise the same error there, so nobody hangs in a later
collective.  The data then moves in ``all_to_all`` calls of byte rows (FP8 payloads and 2-byte SF
packs travel as bytes, which every transport carries).

The DeepEP-Ascend behaviour (contract 13) is selected by the ``ascend950`` profile active when a
buffer is constructed: expand-only dispatch, multiple reduction required, 2-byte SF packs, its
metadata column order, no 4-row alignment of column-major SF outputs and the handle's
``psum_num_recv_tokens_per_rank`` / ``dst_gsge_idx`` names.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeGuard

import numpy as np

from ..api import not_implemented
from ..comm import transport
from ..comm.local import LocalTransport
from ..dtypes import F32, I32
from ..errors import arg_error
from ..exact import align
from ..interop import Kind, from_numpy
from ..profiles import get_profile
from ..toolkit.sizes import check_alloc, size_arg
from . import _topology as topo
from ._checks import (
    BufferSettings,
    CombineCall,
    DispatchCall,
    check_combine,
    check_dispatch,
    count,
    flag,
    handle_arrays,
)
from ._event import EventHandle, EventOverlap
from ._handle import EPHandle
from .reduction import local_reduce, sum_pieces
from .routing import metadata, metadata_columns, recv_layout, send_plan, worst_case_rows

__all__ = ["ElasticBuffer", "EPBuffer"]

I64 = np.dtype(np.int64)
U8 = np.dtype(np.uint8)


class _TorchDtypeName:
    """A torch dtype in a signature without importing torch (``repr`` is the torch name)."""

    def __init__(self, name: str, itemsize: int) -> None:
        self.name = name
        self.itemsize = itemsize

    def __repr__(self) -> str:
        return f"torch.{self.name}"


# Note: the default dtype of get_engram_storage_size_hint is a stand-in for torch.bfloat16.
TORCH_BFLOAT16 = _TorchDtypeName("bfloat16", 2)


class _Runtime:
    """The buffer's runtime handle (DeepEP's C++ object); ``None`` once the buffer is destroyed."""

    def __repr__(self) -> str:
        return "deepgemm_ref.ep runtime (CPU)"


class CPUStream:
    """The communication stream without torch: every call completes before it returns."""

    def __repr__(self) -> str:
        return "CPUStream()"


def _itemsize(func: str, dtype: Any) -> int:
    size = getattr(dtype, "itemsize", None)
    if size is None:
        try:
            size = np.dtype(dtype).itemsize
        except TypeError:
            raise arg_error(func, "dtype", "a torch, NumPy or ml_dtypes dtype", repr(dtype)) from None
    return int(size)


def _shapes(func: str, shapes: Any) -> list[tuple[int, ...]]:
    """One shape (a tuple) or a sequence of shapes (batched: its first element is a tuple)."""
    if not isinstance(shapes, (tuple, list)) or not shapes:
        raise arg_error(func, "shapes", "a shape tuple or a sequence of shape tuples", repr(shapes))
    batch = shapes if isinstance(shapes[0], (tuple, list)) else [shapes]
    return [tuple(count(func, "shapes", v) for v in shape) for shape in batch]


class _BufferBase:
    """The state and the collectives shared by :class:`ElasticBuffer` and :class:`EPBuffer`."""

    _name = "ElasticBuffer"
    _is_ep_buffer = False

    def _setup(self, group: Any, num_bytes: Any, num_cpu_bytes: Any, num_max_tokens_per_rank: Any, hidden: Any,
               num_topk: Any, use_fp8_dispatch: Any, deterministic: Any, allow_hybrid_mode: Any,
               allow_multiple_reduction: Any, prefer_overlap_with_compute: Any, sl_idx: Any, num_allocated_qps: Any,
               num_cpu_timeout_secs: Any, num_gpu_timeout_secs: Any, explicitly_destroy: Any) -> None:
        func = self._name
        t = transport(group, func, "group")
        profile = get_profile()  # read once: the target of this buffer
        self._profile = profile
        self._ascend = profile.is_ascend
        t_max = count(func, "num_max_tokens_per_rank", num_max_tokens_per_rank)
        h = count(func, "hidden", hidden)
        k = count(func, "num_topk", num_topk)
        fp8 = flag(func, "use_fp8_dispatch", use_fp8_dispatch)
        self.deterministic = flag(func, "deterministic", deterministic)
        self.allow_hybrid_mode = flag(func, "allow_hybrid_mode", allow_hybrid_mode)
        self.allow_multiple_reduction = flag(func, "allow_multiple_reduction", allow_multiple_reduction)
        if self._ascend and not self.allow_multiple_reduction:
            # Note: DeepEP-Ascend requires multiple reduction (contract 13.3); refused at construction.
            raise arg_error(func, "allow_multiple_reduction", "True on DeepEP-Ascend (the ascend950 profile)", "False")
        self.prefer_overlap_with_compute = flag(func, "prefer_overlap_with_compute", prefer_overlap_with_compute)
        if sl_idx is not None or not self._is_ep_buffer:
            count(func, "sl_idx", sl_idx)
        cpu = count(func, "num_cpu_bytes", num_cpu_bytes, 0) if num_cpu_bytes is not None else 0
        if cpu % topo.ALIGNMENT_BYTES:
            raise arg_error(func, "num_cpu_bytes", "a multiple of 2 MiB", str(cpu))
        if cpu and num_bytes is None:
            raise arg_error(func, "num_bytes", "the total size when num_cpu_bytes is given", "None", utility=True)
        if num_bytes is None:
            size = topo.buffer_size_hint(func, t.size, t_max, h, k, fp8, self.allow_multiple_reduction)
        else:
            size = size_arg_bytes(func, num_bytes)
        if cpu > size:
            raise arg_error(func, "num_cpu_bytes", f"at most num_bytes ({size})", str(cpu))
        qps = count(func, "num_allocated_qps", num_allocated_qps)
        self.num_cpu_timeout_secs = count(func, "num_cpu_timeout_secs", num_cpu_timeout_secs)
        self.num_gpu_timeout_secs = count(func, "num_gpu_timeout_secs", num_gpu_timeout_secs)
        self.explicitly_destroy = flag(func, "explicitly_destroy", explicitly_destroy)
        self._transport = t
        self.group = group
        self.rank_idx = t.rank
        self.num_ranks = t.size
        self.nccl_comm_handle = None
        self.num_bytes = size
        self.num_cpu_bytes = cpu
        self.num_max_tokens_per_rank = t_max
        self.num_allocated_qps = qps if qps else topo.default_num_allocated_qps(self.allow_hybrid_mode)
        self.runtime: _Runtime | None = _Runtime()
        self.num_scaleout_ranks, self.num_scaleup_ranks = 1, self.num_ranks
        self.scaleout_rank_idx = self.rank_idx // self.num_scaleup_ranks
        self.scaleup_rank_idx = self.rank_idx % self.num_scaleup_ranks
        self.num_rdma_ranks, self.num_nvlink_ranks = 1, self.num_ranks
        # Note: num_cpu_timeout_secs is kept; in-process waits are bounded by run_emulated's timeout_s.
        t.barrier()  # initialisation visible to every peer

    # -- settings, liveness ---------------------------------------------------------------------

    def _live(self, func: str) -> None:
        if self.runtime is None:
            raise arg_error(func, "self", "a live buffer", "a destroyed buffer (destroy() was called)")

    def _settings(self) -> BufferSettings:
        return BufferSettings(owner=self, rank=self.rank_idx, num_ranks=self.num_ranks, ascend=self._ascend,
                              num_max_tokens_per_rank=self.num_max_tokens_per_rank,
                              num_allocated_qps=self.num_allocated_qps,
                              allow_multiple_reduction=self.allow_multiple_reduction, num_bytes=self.num_bytes,
                              # Note: the buffer-size checks follow DeepEP's formula on the CUDA profiles only.
                              check_buffer_bytes=not self._ascend, is_ep_buffer=self._is_ep_buffer)

    def _destroy(self) -> None:
        if not self.explicitly_destroy:
            raise arg_error(f"{self._name}.destroy", "explicitly_destroy", "True at construction", "False",
                            utility=True)
        self.runtime = None

    def _barrier(self, func: str, *flags: tuple[str, Any]) -> None:
        self._live(func)
        for name, v in flags:
            flag(func, name, v)
        self._transport.barrier()

    def _comm_stream(self) -> Any:
        # Note: the communication stream is torch's current CPU stream (a CPUStream without torch).
        try:
            import torch
        except ImportError:
            return CPUStream()
        return torch.cpu.current_stream()

    def _num_sms(self, func: str, num_experts: Any, num_topk: Any, num_scaleout_topk: Any, rdma_gbs: Any,
                 nvlink_gbs: Any, sm_read_gbs: Any, sm_write_gbs: Any) -> int:
        e = count(func, "num_experts", num_experts, 1)
        k = count(func, "num_topk", num_topk, 1)
        if num_scaleout_topk != 0:
            raise arg_error(func, "num_scaleout_topk", "0 (reserved)", repr(num_scaleout_topk), utility=True)
        vals = []
        for name, v in (("rdma_gbs", rdma_gbs), ("nvlink_gbs", nvlink_gbs), ("sm_read_gbs", sm_read_gbs),
                        ("sm_write_gbs", sm_write_gbs)):
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not v >= 0:
                raise arg_error(func, name, "a bandwidth >= 0 (GB/s)", repr(v))
            vals.append(float(v))
        read, write = vals[2] or 200.0, vals[3] or 50.0
        return topo.theoretical_num_sms(self._profile, self.num_ranks, e, k, vals[1], read, write,
                                        self.prefer_overlap_with_compute)

    def get_theoretical_num_qps(self, num_sms: int) -> int:
        """QPs for ``num_sms`` SMs: ``min(num_sms, 9)`` (``16 num_sms + 1`` with hybrid mode
        allowed), at most ``num_allocated_qps``; no effect on the results."""
        return topo.theoretical_num_qps(count("get_theoretical_num_qps", "num_sms", num_sms), self.allow_hybrid_mode,
                                        self.num_allocated_qps)

    # -- the collective header ------------------------------------------------------------------

    _DISPATCH_FIELDS = ("operation", "handle (cached or not)", "do_expand", "num_max_tokens_per_rank",
                        "num_experts", "expert_alignment", "topk_idx (num_topk)", "x (hidden)", "x (dtype size)",
                        "x[1] (scale-factor packs)", "x[1] (dtype size)", "topk_weights (given or not)")
    _COMBINE_FIELDS = ("operation", "handle (do_expand)", "handle (num_max_tokens_per_rank)", "handle (num_experts)",
                       "x (hidden)", "topk_weights (given or not)", "handle.topk_idx (num_topk)",
                       "allow_multiple_reduction (of the buffers)")

    def _header(self, func: str, fields: Sequence[str], config: Sequence[int], rows: np.ndarray) -> np.ndarray:
        """All-gather (config, rows sent to each rank); every rank raises the same error when the
        ranks' configs differ.  Returns the (R, R) matrix of rows sent (source, destination)."""
        # Note: ranks whose calls disagree all raise here (DeepEP would hang or read garbage).
        head = np.concatenate([np.asarray(config, I64), np.asarray(rows, I64)])
        got = np.stack(self._transport.all_gather(head))
        cfg = got[:, :len(config)]
        bad = np.flatnonzero((cfg != cfg[0]).any(axis=0))
        if bad.size:
            i = int(bad[0])
            raise arg_error(func, fields[i], "the same value on every rank of the group (all ranks call the same "
                            "collective)", f"per rank {cfg[:, i].tolist()}")
        return got[:, len(config):]

    # -- dispatch --------------------------------------------------------------------------------

    def _dispatch(self, func: str, *, x: Any, topk_idx: Any, topk_weights: Any,
                  cumulative_local_expert_recv_stats: Any, num_experts: Any, num_max_tokens_per_rank: Any,
                  expert_alignment: Any, num_sms: Any, num_qps: Any, previous_event: Any,
                  previous_event_before_epilogue: Any, async_with_compute_stream: Any, allocate_on_comm_stream: Any,
                  handle: Any, do_handle_copy: Any, do_cpu_sync: Any, do_expand: Any, do_zero_padding: Any,
                  use_tma_aligned_col_major_sf: Any, defer_epilogue: Any) -> Any:
        self._live(func)
        c = check_dispatch(
            func, self._settings(), x=x, topk_idx=topk_idx, topk_weights=topk_weights,
            cumulative_local_expert_recv_stats=cumulative_local_expert_recv_stats, num_experts=num_experts,
            num_max_tokens_per_rank=num_max_tokens_per_rank, expert_alignment=expert_alignment, num_sms=num_sms,
            num_qps=num_qps, previous_event=previous_event,
            previous_event_before_epilogue=previous_event_before_epilogue,
            async_with_compute_stream=async_with_compute_stream, allocate_on_comm_stream=allocate_on_comm_stream,
            handle=handle, do_handle_copy=do_handle_copy, do_cpu_sync=do_cpu_sync, do_expand=do_expand,
            do_zero_padding=do_zero_padding, use_tma_aligned_col_major_sf=use_tma_aligned_col_major_sf,
            defer_epilogue=defer_epilogue,
            default_sms=lambda e, k: self._num_sms(func, e, k, 0, 0, 0, 0, 0))
        out = _dispatch_exchange(self, func, c)
        event = EventOverlap(EventHandle() if c.async_with_compute_stream else None)
        if c.defer_epilogue:
            event.register_hook_after_wait(lambda: out)
            return event
        return (*out, event)

    # -- combine ---------------------------------------------------------------------------------

    def _combine(self, func: str, *, x: Any, handle: Any, topk_weights: Any, bias: Any, num_sms: Any, num_qps: Any,
                 previous_event: Any, previous_event_before_epilogue: Any, async_with_compute_stream: Any,
                 allocate_on_comm_stream: Any, defer_epilogue: Any) -> Any:
        self._live(func)
        s = self._settings()
        c = check_combine(func, s, x=x, handle=handle, topk_weights=topk_weights, bias=bias, num_sms=num_sms,
                          num_qps=num_qps, previous_event=previous_event,
                          previous_event_before_epilogue=previous_event_before_epilogue,
                          async_with_compute_stream=async_with_compute_stream,
                          allocate_on_comm_stream=allocate_on_comm_stream, defer_epilogue=defer_epilogue)
        if s.check_buffer_bytes:
            need = topo.combine_buffer_bytes(self.num_ranks, c.num_max_tokens_per_rank, c.x.shape[1],
                                             c.topk_idx.shape[1], self.allow_multiple_reduction)
            if need > self.num_bytes:
                raise arg_error(func, "x", f"a combine that fits the buffer's {self.num_bytes} bytes",
                                f"{need} bytes needed")
        out = _combine_exchange(self, func, c)
        event = EventOverlap(EventHandle() if c.async_with_compute_stream else None)
        if c.defer_epilogue:
            event.register_hook_after_wait(lambda: out)
            return event
        return (*out, event)


def size_arg_bytes(func: str, num_bytes: Any) -> int:
    """``num_bytes``: a positive multiple of 2 MiB."""
    n = size_arg(func, "num_bytes", num_bytes, 1, None)
    if n % topo.ALIGNMENT_BYTES:
        raise arg_error(func, "num_bytes", "a multiple of 2 MiB", str(n))
    return n


# ----------------------------------------------------------------------------------------------
# dispatch: exchange and assemble
# ----------------------------------------------------------------------------------------------

def _bytes_rows(a: np.ndarray) -> np.ndarray:
    """A C-contiguous (n, m) array as (n, m * itemsize) bytes (a view)."""
    a = np.ascontiguousarray(a)
    return a.view(U8).reshape(a.shape[0], int(np.prod(a.shape[1:], dtype=np.int64)) * a.itemsize)


def _sf_out(rows: int, packs: int, dtype: np.dtype, col_major: bool, ascend: bool) -> np.ndarray:
    """Zeroed (rows, packs) SF output: strides (packs, 1), or column-major (1, align(rows, 4))
    (DeepEP: 16-byte aligned columns of 4-byte packs; DeepEP-Ascend: (1, rows))."""
    if not col_major:
        return np.zeros((rows, packs), dtype)
    ld = rows if ascend else align(rows, 4)
    return np.zeros((packs, ld), dtype).T[:rows]


#: Payloads of an in-process group travel by ``LocalTransport.all_gather_shared`` (each rank's rows
#: are copied once and shared, read-only, by every receiver, which gathers its rows straight into
#: its outputs); other transports
#: move only the rows each destination needs (``all_to_all``).  The bytes are the same either way.
SHARED_ALL_GATHER = True


def _shared(t: Any) -> TypeGuard[LocalTransport]:
    return SHARED_ALL_GATHER and isinstance(t, LocalTransport)


class _Pieces:
    """What came from every source rank: an array of rows each, and which of its rows were
    received (``None``: all of them, in order)."""

    def __init__(self, arrays: list[np.ndarray], rows: Sequence[np.ndarray | None] | None = None) -> None:
        self.arrays = arrays
        self.rows: list[np.ndarray | None] = list(rows) if rows is not None else [None] * len(arrays)

    def take(self, s: int, sub: np.ndarray | None = None) -> np.ndarray:
        """Source ``s``'s received rows (or the ``sub`` ones of them)."""
        a, rows = self.arrays[s], self.rows[s]
        if rows is None:
            return a if sub is None else a[sub]
        return a[rows] if sub is None else a[rows[sub]]

    def fill(self, s: int, out: np.ndarray, start: int) -> None:
        """Write source ``s``'s received rows into ``out[start:]`` (a contiguous block)."""
        a, rows = self.arrays[s], self.rows[s]
        n = a.shape[0] if rows is None else rows.size
        if rows is None:
            out[start:start + n] = a
        else:
            # mode="clip" (the rows are in range): with the default "raise" NumPy copies ``out`` first
            np.take(a, rows, axis=0, out=out[start:start + n], mode="clip")


def _dispatch_exchange(buf: _BufferBase, func: str, c: DispatchCall) -> tuple[Any, Any, Any, EPHandle]:
    r, world = buf.rank_idx, buf.num_ranks
    t = buf._transport
    e, k, t_max, a = c.num_experts, c.num_topk, c.num_max_tokens_per_rank, c.alignment
    e_l = e // world
    plan = send_plan(c.topk_idx, e, world)
    sf_packs = -1 if c.sf is None else c.sf.shape[1]
    sf_size = 0 if c.sf is None else c.sf.itemsize
    config = (1, c.handle is not None, c.do_expand, t_max, e, a, k, c.hidden, c.x.itemsize, sf_packs, sf_size,
              c.weights is not None)
    sent = buf._header(func, buf._DISPATCH_FIELDS, [int(v) for v in config], plan.counts)

    # exchange: the routing rows and the payloads of every token this rank owns an expert of
    xb = _bytes_rows(c.x)
    if _shared(t):
        routing = t.all_gather_shared(c.topk_idx)
        toks = [np.flatnonzero(((q >= r * e_l) & (q < (r + 1) * e_l)).any(axis=1)) for q in routing]
        topk = [q[tk] for q, tk in zip(routing, toks, strict=True)]
        data = _Pieces(t.all_gather_shared(xb), toks)
        sfs = _Pieces(t.all_gather_shared(_bytes_rows(c.sf)), toks) if c.sf is not None else None
        weights = _Pieces(t.all_gather_shared(c.weights), toks) if c.weights is not None else None
    else:
        tokens = plan.tokens
        meta = t.all_to_all([np.concatenate([c.topk_idx[tk], tk[:, None]], axis=1) for tk in tokens])
        toks = [m[:, k] for m in meta]
        topk = [m[:, :k] for m in meta]
        weights = _Pieces(t.all_to_all([c.weights[tk] for tk in tokens])) if c.weights is not None else None
        data = _Pieces(t.all_to_all([xb[tk] for tk in tokens]))
        sfs = _Pieces(t.all_to_all([_bytes_rows(c.sf[tk]) for tk in tokens])) if c.sf is not None else None
    counts = [tk.size for tk in toks]
    if counts != [int(v) for v in sent[:, r]]:  # pragma: no cover - the transport's own consistency
        raise RuntimeError(f"{func}: rank {r} received {counts} tokens, its peers sent {sent[:, r].tolist()}")

    # assemble, in canonical order (source rank, then token)
    # Note: always the canonical order (deterministic=True's), whatever `deterministic` says; padding
    # and the tails without CPU sync are zero bytes (indices and metadata -1), with or without do_zero_padding.
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(I64)
    n = int(offsets[-1])
    topk_rows = np.concatenate(topk) if topk else np.zeros((0, k), I64)
    src_global = np.concatenate([s * t_max + np.asarray(tk, I64) for s, tk in enumerate(toks)])
    local = (topk_rows >= r * e_l) & (topk_rows < (r + 1) * e_l)
    local_idx = np.where(local, topk_rows - r * e_l, -1)
    h = c.handle
    if h is None:
        lay = recv_layout(topk_rows, src_global, r, world, e, t_max, a)
        pos = None
        slot_row = lay.slot_row
        if c.do_cpu_sync:
            rows_alloc = lay.num_expanded_tokens if c.do_expand else n
        else:
            rows_alloc = worst_case_rows(world, t_max, k, e_l, a, c.do_expand)
    else:
        lay = None
        pos, slot_row = _cached_placement(func, buf, h, src_global, k)
        rows_alloc = int(h.num_expanded_tokens) if c.do_expand else int(h.num_recv_tokens)
        top = int(slot_row.max()) + 1 if (c.do_expand and slot_row.size) else (int(pos.max()) + 1 if pos.size else 0)
        if top > rows_alloc:
            raise arg_error(func, "handle", f"slots within its {rows_alloc} allocated rows", f"row {top - 1}")
    row_bytes = c.hidden * c.x.itemsize + max(sf_packs, 0) * sf_size + 12 * k
    check_alloc(func, "x", rows_alloc * row_bytes, "the received tokens")
    expand_rows = slot_row if c.do_expand else None

    recv_x = _assemble(data, offsets, pos, expand_rows, rows_alloc, np.empty((rows_alloc, xb.shape[1]), U8))
    recv_x = recv_x.view(c.x.dtype)
    recv_sf = None
    if c.sf is not None and sfs is not None:
        out_sf = _sf_out(rows_alloc, sf_packs, c.sf.dtype, c.col_major_sf, buf._ascend)
        typed = _Pieces([p.view(c.sf.dtype) for p in sfs.arrays], sfs.rows)
        recv_sf = _assemble(typed, offsets, pos, expand_rows, rows_alloc, out_sf, zeroed=True)
    recv_topk_idx = None
    if not c.do_expand:
        recv_topk_idx = np.full((rows_alloc, k), -1, I64)
        recv_topk_idx[pos if pos is not None else slice(0, n)] = local_idx
    recv_w: np.ndarray | None = None
    if weights is not None:
        if c.do_expand:
            recv_w = np.zeros(rows_alloc, F32)
            for s in range(world):
                ni, ki = np.nonzero(slot_row[offsets[s]:offsets[s + 1]] >= 0)
                recv_w[slot_row[offsets[s] + ni, ki]] = weights.take(s, ni)[np.arange(ni.size), ki]
        else:
            recv_w = _assemble(weights, offsets, pos, None, rows_alloc, np.zeros((rows_alloc, k), F32), zeroed=True)

    kind = c.kind
    if h is None:
        assert lay is not None
        h = _new_handle(buf, c, lay, plan.owner, plan.tokens, sent)
        if c.stats is not None:
            stats = c.stats
            stats += lay.counts.astype(I32)  # in place (the caller's array or tensor)
    x_out: Any = from_numpy(recv_x, kind)
    if recv_sf is not None:
        x_out = (x_out, from_numpy(recv_sf, kind))
    return x_out, from_numpy(recv_topk_idx, kind), from_numpy(recv_w, kind), h


def _assemble(pieces: _Pieces, offsets: np.ndarray, pos: np.ndarray | None, slot_row: np.ndarray | None,
              rows_alloc: int, out: np.ndarray, zeroed: bool = False) -> np.ndarray:
    """The received rows of every source written into ``out`` (rows_alloc, ...): in canonical order
    (``pos`` None: source after source), at the rows ``pos`` (a cached layout), or at every slot
    row ``slot_row[n, k] >= 0`` (expanded); every other row zero (``zeroed``: ``out`` is already)."""
    world = len(pieces.arrays)
    n = int(offsets[-1])
    if slot_row is None and pos is None and out.flags.c_contiguous:
        for s in range(world):
            pieces.fill(s, out, int(offsets[s]))
        if not zeroed:
            out[n:] = 0
        return out
    if not zeroed:
        out[...] = 0
    for s in range(world):
        lo, hi = int(offsets[s]), int(offsets[s + 1])
        if slot_row is not None:
            ni, ki = np.nonzero(slot_row[lo:hi] >= 0)
            out[slot_row[lo + ni, ki]] = pieces.take(s, ni)
        elif pos is None:
            out[lo:hi] = pieces.take(s)
        else:
            out[pos[lo:hi]] = pieces.take(s)
    return out


def _cached_placement(func: str, buf: _BufferBase, h: EPHandle, src_global: np.ndarray,
                      k: int) -> tuple[np.ndarray, np.ndarray]:
    """(row of each received token in the handle's metadata, its expanded slots) for a cached
    dispatch: the new rows go where the handle's layout put the same tokens."""
    _, meta, n = handle_arrays(func, buf._settings(), h)
    src_col, _, slots = metadata_columns(k, buf._ascend)
    keys = meta[:n, src_col].astype(I64)
    order = np.argsort(keys, kind="stable")
    sk = keys[order]
    at = np.minimum(np.searchsorted(sk, src_global), max(n - 1, 0))
    ok = n > 0 and src_global.size == n and bool(np.all(sk[at] == src_global)) and np.unique(at).size == n
    if not ok and not (n == 0 and src_global.size == 0):
        raise arg_error(func, "handle", "the routing of the tokens now received (the handle of the dispatch whose "
                        "routing is reused, on every rank)", f"{src_global.size} tokens received, the handle holds {n}")
    pos = order[at] if n else np.zeros(0, I64)
    slot_row = meta[pos][:, slots].astype(I64) if n else np.zeros((0, k), I64)
    return pos.astype(I64), slot_row


def _new_handle(buf: _BufferBase, c: DispatchCall, lay: Any, owner: np.ndarray, tokens: list[np.ndarray],
                sent: np.ndarray) -> EPHandle:
    """The handle of a fresh dispatch (contract 5.4), its tensors in the caller's kind."""
    world, r, kind = buf.num_ranks, buf.rank_idx, c.kind
    k = c.num_topk
    sync = c.do_cpu_sync
    meta_rows = lay.num_recv_tokens if sync else world * c.num_max_tokens_per_rank
    meta = metadata(lay, c.do_expand, buf._ascend, meta_rows)
    # dst_buffer_slot_idx: the row of each selected slot's token among its owner's received tokens
    offset = sent[:r].sum(axis=0)  # rows the lower ranks sent to every destination
    row_in_dest = np.full((c.topk_idx.shape[0], world), -1, I64)
    for d, tk in enumerate(tokens):
        row_in_dest[tk, d] = offset[d] + np.arange(tk.size)
    dst = np.where(owner >= 0, np.take_along_axis(row_in_dest, np.maximum(owner, 0), axis=1), -1).astype(I32)
    if c.do_handle_copy:
        routing = from_numpy(np.array(c.topk_idx, copy=True), kind)
    else:
        routing = c.topk_idx_obj
    worst = worst_case_rows(world, c.num_max_tokens_per_rank, k, c.num_experts // world, c.alignment, True)
    h = EPHandle(
        c.do_expand, c.num_experts, c.alignment, c.num_max_tokens_per_rank, c.num_sms, routing,
        lay.num_recv_tokens if sync else world * c.num_max_tokens_per_rank,
        lay.num_expanded_tokens if sync else worst,
        [int(v) for v in lay.aligned_counts] if sync else [],
        from_numpy(lay.psum_rank.astype(I32), kind),
        from_numpy(lay.psum_expert(c.do_expand).astype(I32), kind),
        from_numpy(lay.counts.astype(I32), kind),
        from_numpy(meta, kind),
        from_numpy(dst, kind),
        None, None)
    h._owner = weakref.ref(buf)
    if buf._ascend:
        h.dst_gsge_idx = from_numpy(dst.copy(), kind)  # type: ignore[attr-defined]
    return h


# ----------------------------------------------------------------------------------------------
# combine: exchange and reduce
# ----------------------------------------------------------------------------------------------

def _combine_exchange(buf: _BufferBase, func: str, c: CombineCall) -> tuple[Any, Any]:
    world, t = buf.num_ranks, buf._transport
    k = c.topk_idx.shape[1]
    t_max, n = c.num_max_tokens_per_rank, c.num_recv_tokens
    src_col, _, slots = metadata_columns(k, buf._ascend)
    src = c.metadata[:n, src_col].astype(I64)
    if src.size and (src.min() < 0 or src.max() >= world * t_max):
        raise arg_error(func, "handle.recv_src_metadata", f"source indices in [0, {world * t_max})",
                        f"values in [{src.min()}, {src.max()}]")
    per_slot = c.do_expand and not buf.allow_multiple_reduction
    x = c.x
    # this rank's contributions: rows of `contrib`, each listed as (source index, slot or -1, row)
    w_rows = None
    if not c.do_expand:  # the row the caller passed for each received token
        contrib, entry = x, np.stack([src, np.full(n, -1, I64), np.arange(n, dtype=I64)], axis=1)
        if c.weights is not None:
            w_rows = c.weights
    else:
        sl = c.metadata[:n, slots].astype(I64)
        if per_slot:  # every slot row travels alone (no intermediate reduction)
            ni, ki = np.nonzero(sl >= 0)
            contrib, entry = x, np.stack([src[ni], ki.astype(I64), sl[ni, ki]], axis=1)
        else:  # the owner's partial of each token
            contrib, entry = local_reduce(x, sl), np.stack([src, np.full(n, -1, I64), np.arange(n, dtype=I64)], axis=1)
            if c.weights is not None:
                w_rows = np.where(sl >= 0, c.weights[np.maximum(sl, 0)], np.float32(0)).astype(F32)
    dest = entry[:, 0] // t_max
    counts = np.bincount(dest, minlength=world)
    config = (2, c.do_expand, t_max, c.num_experts, x.shape[1], c.weights is not None, k, buf.allow_multiple_reduction)
    buf._header(func, buf._COMBINE_FIELDS, [int(v) for v in config], counts)

    # exchange: every source rank gets, per owner, an array of rows and its (token, slot, row) entries
    cb = _bytes_rows(contrib)
    if _shared(t):
        entries = t.all_gather_shared(entry)
        arrays = t.all_gather_shared(cb)
        weights = t.all_gather_shared(w_rows) if w_rows is not None else None
        mine = [e[e[:, 0] // t_max == buf.rank_idx] for e in entries]
    else:
        order = np.argsort(dest, kind="stable")
        bounds = np.concatenate([[0], np.cumsum(counts)]).astype(I64)
        parts = [order[bounds[d]:bounds[d + 1]] for d in range(world)]
        sent = [entry[p] for p in parts]
        mine = t.all_to_all([np.stack([e[:, 0], e[:, 1], np.arange(e.shape[0], dtype=I64)], axis=1) for e in sent])
        arrays = t.all_to_all([cb[e[:, 2]] for e in sent])
        weights = t.all_to_all([w_rows[e[:, 2]] for e in sent]) if w_rows is not None else None
    pieces = [a.view(x.dtype) for a in arrays]

    # reduce on the source rank, in the kernels' order
    routing = c.topk_idx
    plan = send_plan(routing, c.num_experts, world)
    owner = plan.owner
    t_count = routing.shape[0]
    if per_slot:
        row_of = np.full((t_count, k), -1, I64)
        who = np.full((t_count, k), -1, I64)
        for q, m in enumerate(mine):
            tq, kq = m[:, 0] % t_max, m[:, 1]
            ok = (tq < t_count) & (kq >= 0) & (kq < k)
            ok[ok] &= owner[tq[ok], kq[ok]] == q
            if not ok.all() or np.any(row_of[tq, kq] >= 0):
                raise arg_error(func, "handle", "the routing its owners combine (slot rows of the selected "
                                "experts, once each)", f"unexpected rows from rank {q}")
            row_of[tq, kq] = m[:, 2]
            who[tq, kq] = q
        if np.any((row_of >= 0) != (owner >= 0)):
            raise arg_error(func, "handle", "a row for every selected slot", "missing slot rows")
        index_owner, index_row = who, row_of
    else:
        row_of = np.full((t_count, world), -1, I64)
        for q, m in enumerate(mine):
            tq = m[:, 0] % t_max
            if not np.array_equal(np.sort(tq), plan.tokens[q]):
                raise arg_error(func, "handle", "the routing its owners combine (one row per token and owner rank)",
                                f"rank {q} sent {tq.size} rows for {plan.tokens[q].size} tokens")
            row_of[tq, q] = m[:, 2]
        key = np.where(plan.master >= 0, plan.master, k + 1)
        width = int((plan.master >= 0).sum(axis=1).max()) if t_count else 0
        index_owner = np.argsort(key, axis=1, kind="stable")[:, :width]
        index_row = np.take_along_axis(row_of, index_owner, axis=1)
        index_owner = np.where(index_row >= 0, index_owner, -1)
    b0, b1 = c.bias
    combined = sum_pieces(pieces, index_owner, index_row, b0, b1)
    combined_w = None
    if weights is not None:
        ti, ki = np.nonzero(owner >= 0)
        q_of = owner[ti, ki]
        combined_w = np.zeros((t_count, k), F32)
        for q in range(world):
            sel = q_of == q
            combined_w[ti[sel], ki[sel]] = weights[q][row_of[ti[sel], q], ki[sel]]
    kind: Kind = c.kind
    return from_numpy(combined, kind), from_numpy(combined_w, kind)


# ----------------------------------------------------------------------------------------------
# the public classes
# ----------------------------------------------------------------------------------------------

# Note: Engram, PP, AGRS and the load-balancing helpers raise NotImplementedError.
_EXPERIMENTAL = ("an experimental DeepEP feature (Engram / pipeline-parallel / AGRS) that deepgemm_ref.ep does not "
                 "emulate")
_LB = "EPBuffer's load-balancing helpers are not emulated"


class ElasticBuffer(_BufferBase):
    """DeepEP 2.1.0's ``ElasticBuffer`` on a group of ranks (contract 4 - 10).

    ``group``: a rank view of an in-process group (:func:`deepgemm_ref.ep.run_emulated`) or a
    ``torch.distributed`` process group.  Every rank constructs its buffer (a barrier ends the
    constructor).  The emulator's ranks share one host: the physical and logical domains are
    ``(1, R)`` and hybrid mode never engages.  Sizes, SM / QP counts, timeouts, streams and events
    are accepted and checked as DeepEP checks them, with no effect on the results
    (``deterministic`` included: outputs are always in canonical order).
    """

    _name = "ElasticBuffer"

    def __init__(self, group: Any, num_bytes: int | None = None, num_cpu_bytes: int = 0,
                 num_max_tokens_per_rank: int = 0, hidden: int = 0, num_topk: int = 0, use_fp8_dispatch: bool = False,
                 deterministic: bool = False, allow_hybrid_mode: bool = True, allow_multiple_reduction: bool = True,
                 prefer_overlap_with_compute: bool = True, sl_idx: int = 3, num_allocated_qps: int = 0,
                 num_cpu_timeout_secs: int = 300, num_gpu_timeout_secs: int = 100,
                 explicitly_destroy: bool = False) -> None:
        self._setup(group, num_bytes, num_cpu_bytes, num_max_tokens_per_rank, hidden, num_topk, use_fp8_dispatch,
                    deterministic, allow_hybrid_mode, allow_multiple_reduction, prefer_overlap_with_compute, sl_idx,
                    num_allocated_qps, num_cpu_timeout_secs, num_gpu_timeout_secs, explicitly_destroy)

    def destroy(self) -> None:
        """Release the buffer (requires ``explicitly_destroy=True``); it is unusable afterwards."""
        self._destroy()

    @staticmethod
    def get_buffer_size_hint(group: Any, num_max_tokens_per_rank: int, hidden: int, num_topk: int = 0,
                             use_fp8_dispatch: bool = False, allow_hybrid_mode: bool = True,
                             allow_multiple_reduction: bool = True) -> int:
        """DeepEP's buffer size for these settings on one host: a positive multiple of 2 MiB."""
        func = "ElasticBuffer.get_buffer_size_hint"
        _, size = topo.group_size(group, func)
        return topo.buffer_size_hint(func, size, num_max_tokens_per_rank, hidden, num_topk, use_fp8_dispatch,
                                     allow_multiple_reduction)

    @staticmethod
    def get_engram_storage_size_hint(num_entries: int, hidden: int, num_max_tokens_per_rank: int,
                                     dtype: Any = TORCH_BFLOAT16) -> tuple[int, int]:
        """(GPU, CPU) bytes of an Engram storage: ``align(align(H e, 32) T_max, 2 MiB)`` and
        ``align(align(H e, 32) num_entries, 2 MiB)``."""
        func = "ElasticBuffer.get_engram_storage_size_hint"
        per = align(count(func, "hidden", hidden) * _itemsize(func, dtype), 32)
        gpu = align(per * count(func, "num_max_tokens_per_rank", num_max_tokens_per_rank), topo.ALIGNMENT_BYTES)
        cpu = align(per * count(func, "num_entries", num_entries), topo.ALIGNMENT_BYTES)
        return gpu, cpu

    @staticmethod
    def get_pp_buffer_size_hint(num_max_tensor_bytes: int, num_max_inflight_tensors: int) -> int:
        """Pipeline-parallel buffer bytes: ``align(align(bytes, 32) * inflight * 4, 2 MiB)``."""
        func = "ElasticBuffer.get_pp_buffer_size_hint"
        per = align(count(func, "num_max_tensor_bytes", num_max_tensor_bytes), 32)
        return align(per * count(func, "num_max_inflight_tensors", num_max_inflight_tensors) * 4,
                     topo.ALIGNMENT_BYTES)

    @staticmethod
    def get_agrs_num_max_session_bytes(group: Any, shapes: Any, dtype: Any) -> int:
        """Bytes of one AGRS session: ``sum over shapes of align(R * prod(shape) * itemsize, 32)``."""
        func = "ElasticBuffer.get_agrs_num_max_session_bytes"
        _, size = topo.group_size(group, func)
        item = _itemsize(func, dtype)
        return sum(align(size * math.prod(s) * item, 32) for s in _shapes(func, shapes))

    @staticmethod
    def get_agrs_buffer_size_hint(group: Any, num_max_session_bytes: int) -> int:
        """AGRS buffer bytes: ``align(num_max_session_bytes, 2 MiB)``."""
        func = "ElasticBuffer.get_agrs_buffer_size_hint"
        topo.group_size(group, func)
        return align(count(func, "num_max_session_bytes", num_max_session_bytes), topo.ALIGNMENT_BYTES)

    def barrier(self, use_comm_stream: bool = True, with_cpu_sync: bool = False, sequential: bool = True) -> None:
        """A barrier of the group (every rank calls it)."""
        self._barrier("ElasticBuffer.barrier", ("use_comm_stream", use_comm_stream), ("with_cpu_sync", with_cpu_sync),
                      ("sequential", sequential))

    @staticmethod
    def capture() -> EventHandle:
        """An event of the current stream (complete: the CPU has finished everything before it)."""
        return EventHandle()

    def get_comm_stream(self) -> Any:
        """The communication stream: ``torch.cpu.current_stream()`` (a :class:`CPUStream` without torch)."""
        return self._comm_stream()

    def get_physical_domain_size(self) -> tuple[int, int]:
        """``(num_rdma_ranks, num_nvlink_ranks)`` = ``(1, R)``: one host."""
        return self.num_rdma_ranks, self.num_nvlink_ranks

    def get_logical_domain_size(self) -> tuple[int, int]:
        """``(num_scaleout_ranks, num_scaleup_ranks)`` = ``(1, R)``: hybrid mode never engages."""
        return self.num_scaleout_ranks, self.num_scaleup_ranks

    @not_implemented(_EXPERIMENTAL)
    def engram_write(self, storage: Any, sf: Any = None) -> None:
        """Not implemented: Engram (experimental)."""

    @not_implemented(_EXPERIMENTAL)
    def engram_fetch(self, indices: Any, num_qps: int = 0, use_tma_aligned_col_major_sf: bool = False) -> Callable:
        """Not implemented: Engram (experimental)."""
        raise NotImplementedError

    @not_implemented(_EXPERIMENTAL)
    def pp_set_config(self, num_max_tensor_bytes: int, num_max_inflight_tensors: int) -> None:
        """Not implemented: pipeline-parallel send/recv (experimental)."""

    @not_implemented(_EXPERIMENTAL)
    def pp_send(self, t: Any, dst_rank_idx: int, num_sms: int = 0) -> None:
        """Not implemented: pipeline-parallel send/recv (experimental)."""

    @not_implemented(_EXPERIMENTAL)
    def pp_recv(self, t: Any, src_rank_idx: int, num_sms: int = 0) -> None:
        """Not implemented: pipeline-parallel send/recv (experimental)."""

    @not_implemented(_EXPERIMENTAL)
    def create_agrs_session(self) -> None:
        """Not implemented: all-gather reduce-scatter sessions (experimental)."""

    @not_implemented(_EXPERIMENTAL)
    def destroy_agrs_session(self) -> None:
        """Not implemented: all-gather reduce-scatter sessions (experimental)."""

    @contextmanager
    def agrs_new_session(self, enabled: bool = True) -> Iterator[None]:
        """A context with an AGRS session (a no-op with ``enabled=False``); sessions are not implemented."""
        if not flag("ElasticBuffer.agrs_new_session", "enabled", enabled):
            yield
            return
        self.create_agrs_session()
        yield  # pragma: no cover - create_agrs_session raises

    @not_implemented(_EXPERIMENTAL)
    def agrs_set_config(self, num_max_session_bytes: int, num_max_all_gathers_per_session: int) -> None:
        """Not implemented: all-gather reduce-scatter sessions (experimental)."""

    @not_implemented(_EXPERIMENTAL)
    def agrs_get_inplace_tensor(self, shapes: Any, dtype: Any) -> Any:
        """Not implemented: all-gather reduce-scatter sessions (experimental)."""

    @not_implemented(_EXPERIMENTAL)
    def all_gather(self, t: Any) -> None:
        """Not implemented: all-gather reduce-scatter sessions (experimental)."""

    def get_theoretical_num_sms(self, num_experts: int, num_topk: int, num_scaleout_topk: int = 0,
                                rdma_gbs: float = 0, nvlink_gbs: float = 0, sm_read_gbs: float = 200,
                                sm_write_gbs: float = 50) -> int:
        """DeepEP's SM count model for a balanced gate on one host (no effect on the results):
        even, at least 4, at most the active profile's SM count (see :mod:`._topology`)."""
        return self._num_sms("ElasticBuffer.get_theoretical_num_sms", num_experts, num_topk, num_scaleout_topk,
                             rdma_gbs, nvlink_gbs, sm_read_gbs, sm_write_gbs)

    def dispatch(self, x: Any, topk_idx: Any = None, topk_weights: Any = None,
                 cumulative_local_expert_recv_stats: Any = None, num_experts: int | None = None,
                 num_max_tokens_per_rank: int | None = None, expert_alignment: int | None = None, num_sms: int = 0,
                 num_qps: int = 0, previous_event: EventHandle | None = None,
                 previous_event_before_epilogue: EventHandle | None = None, async_with_compute_stream: bool = False,
                 allocate_on_comm_stream: bool = False, handle: EPHandle | None = None, do_handle_copy: bool = True,
                 do_cpu_sync: bool | None = None, do_expand: bool = False, do_zero_padding: bool = False,
                 use_tma_aligned_col_major_sf: bool = False) -> tuple[Any, Any, Any, EPHandle, EventOverlap]:
        """Send every token to the ranks owning its experts (a collective; contract 5).

        x:          bf16 (T, H), or ``(x_e4m3 (T, H), sf (T, P))`` with 4-byte SF packs (float32 or
                    packed UE8M0 int32; 2-byte int16 views under ``ascend950``), any SF strides;
                    T <= ``num_max_tokens_per_rank``, rows of a multiple of 16 bytes.
        topk_idx:   int64 (T, K), K <= 32: expert ids, -1 = none; each expert at most once per row
                    (``None`` with a cached ``handle``).
        topk_weights: float32 (T, K) or None.
        cumulative_local_expert_recv_stats: int32 (E_l,), += the tokens each local expert
                    received (unaligned ``c_e``; not by cached dispatches).

        Returns ``(recv_x, recv_topk_idx, recv_topk_weights, handle, event)`` in canonical order
        (source rank, then token): non-expanded, N rows, ``recv_x`` (N, H) copies of the tokens
        (``(recv_x, recv_sf)`` for FP8; SF strides (P, 1) or, column-major, (1, align(N, 4))),
        ``recv_topk_idx`` int64 (N, K) the local expert of each slot on this rank else -1,
        ``recv_topk_weights`` float32 (N, K) the source's weights; expanded (``do_expand``), M =
        sum align(c_e, A) rows: expert e owns rows [S_e, S_e + c_e) (tokens ascending), padding
        rows zero, weights (M,), ``recv_topk_idx`` None.  Without CPU sync the worst-case row
        counts of contract 5.5 (tails zero, indices and metadata -1).
        """
        return self._dispatch(
            "ElasticBuffer.dispatch", x=x, topk_idx=topk_idx, topk_weights=topk_weights,
            cumulative_local_expert_recv_stats=cumulative_local_expert_recv_stats, num_experts=num_experts,
            num_max_tokens_per_rank=num_max_tokens_per_rank, expert_alignment=expert_alignment, num_sms=num_sms,
            num_qps=num_qps, previous_event=previous_event,
            previous_event_before_epilogue=previous_event_before_epilogue,
            async_with_compute_stream=async_with_compute_stream, allocate_on_comm_stream=allocate_on_comm_stream,
            handle=handle, do_handle_copy=do_handle_copy, do_cpu_sync=do_cpu_sync, do_expand=do_expand,
            do_zero_padding=do_zero_padding, use_tma_aligned_col_major_sf=use_tma_aligned_col_major_sf,
            defer_epilogue=False)

    def combine(self, x: Any, handle: EPHandle, topk_weights: Any = None, bias: Any = None, num_sms: int = 0,
                num_qps: int = 0, previous_event: EventHandle | None = None,
                previous_event_before_epilogue: EventHandle | None = None, async_with_compute_stream: bool = False,
                allocate_on_comm_stream: bool = False) -> tuple[Any, Any, EventOverlap]:
        """Reduce every token's rows back on its source rank (a collective; contract 6, 8.2).

        x:     bf16 (rows, H), H a multiple of 256: one row per row of ``handle.recv_src_metadata``
               (non-expanded), or the expanded layout's slot rows.
        topk_weights: float32 (rows, K) (non-expanded) or (rows,) (expanded; requires
               ``allow_multiple_reduction``), or None.
        bias:  None, bf16 (T, H), or a pair of them.

        ``combined_x[t] = bf16(+0 + bias0 + bias1 + P_1 + P_2 + ...)`` in float32, the terms in
        ascending master slot (one per owner rank: its row, or, expanded, its one slot row or
        ``bf16(+0 + its slot rows)``); without multiple reduction every slot row in ascending k.
        ``combined_topk_weights`` float32 (T, K): the weight each owner passed for the slot, 0.0 for
        masked slots (None without ``topk_weights``).
        """
        return self._combine(
            "ElasticBuffer.combine", x=x, handle=handle, topk_weights=topk_weights, bias=bias, num_sms=num_sms,
            num_qps=num_qps, previous_event=previous_event,
            previous_event_before_epilogue=previous_event_before_epilogue,
            async_with_compute_stream=async_with_compute_stream, allocate_on_comm_stream=allocate_on_comm_stream,
            defer_epilogue=False)


class EPBuffer(_BufferBase):
    """The newer upstream name of the V2 buffer, DeepEP-Ascend's class (contract 7): the numerics
    and layouts of :class:`ElasticBuffer`, ``do_handle_copy`` must be False (the handle keeps the
    caller's ``topk_idx``), an odd ``num_sms`` is rounded up to even, and ``defer_epilogue=True``
    (with ``async_with_compute_stream=True``) returns only the event, whose
    ``current_stream_wait()`` returns the outputs."""

    _name = "EPBuffer"
    _is_ep_buffer = True

    def __init__(self, group: Any, num_bytes: int | None = None, num_max_tokens_per_rank: int = 0, hidden: int = 0,
                 num_topk: int = 0, use_fp8_dispatch: bool = False, lb_allocation_plan_or_num_bytes: Any = 0,
                 deterministic: bool = False, allow_hybrid_mode: bool = True, allow_multiple_reduction: bool = True,
                 prefer_overlap_with_compute: bool = True, sl_idx: int | None = None, num_allocated_qps: int = 0,
                 num_cpu_timeout_secs: int = 300, num_gpu_timeout_secs: int = 100,
                 explicitly_destroy: bool = False) -> None:
        self.lb_num_bytes = count("EPBuffer", "lb_allocation_plan_or_num_bytes", lb_allocation_plan_or_num_bytes)
        self._setup(group, num_bytes, 0, num_max_tokens_per_rank, hidden, num_topk, use_fp8_dispatch, deterministic,
                    allow_hybrid_mode, allow_multiple_reduction, prefer_overlap_with_compute, sl_idx,
                    num_allocated_qps, num_cpu_timeout_secs, num_gpu_timeout_secs, explicitly_destroy)

    def destroy(self) -> None:
        """Release the buffer (requires ``explicitly_destroy=True``); it is unusable afterwards."""
        self._destroy()

    @staticmethod
    def get_buffer_size_hint(group: Any, num_max_tokens_per_rank: int, hidden: int, num_topk: int = 0,
                             use_fp8_dispatch: bool = False, allow_hybrid_mode: bool = True,
                             allow_multiple_reduction: bool = True) -> int:
        """The buffer size for these settings: a positive multiple of 2 MiB (as ElasticBuffer's)."""
        func = "EPBuffer.get_buffer_size_hint"
        _, size = topo.group_size(group, func)
        return topo.buffer_size_hint(func, size, num_max_tokens_per_rank, hidden, num_topk, use_fp8_dispatch,
                                     allow_multiple_reduction)

    @staticmethod
    def capture() -> EventHandle:
        """An event of the current stream (complete)."""
        return EventHandle()

    def get_theoretical_num_sms(self, num_experts: int, num_topk: int, num_scaleout_topk: int = 0,
                                rdma_gbs: float = 0, nvlink_gbs: float = 0, sm_read_gbs: float = 0,
                                sm_write_gbs: float = 0) -> int:
        """As :meth:`ElasticBuffer.get_theoretical_num_sms`; bandwidths 0 mean the defaults
        (200 / 50 GB/s per SM); DeepEP-Ascend: the profile's AI cores."""
        return self._num_sms("EPBuffer.get_theoretical_num_sms", num_experts, num_topk, num_scaleout_topk, rdma_gbs,
                             nvlink_gbs, sm_read_gbs, sm_write_gbs)

    @not_implemented(_LB)
    def lb_get_theoretical_num_sms(self) -> int:
        """Not implemented: load balancing."""
        raise NotImplementedError

    @not_implemented(_LB)
    def lb_prefetch_weights(self, redundant_expert_weights: Any, expert_weights: Any, redundancy_mapping: Any,
                            num_sms: int = 0, previous_event: Any = None) -> EventOverlap:
        """Not implemented: load balancing."""
        raise NotImplementedError

    @not_implemented(_LB)
    def lb_reduce_grads(self, redundant_expert_grads: Any, expert_grads: Any, redundancy_mapping: Any,
                        num_sms: int = 0, previous_event: Any = None) -> EventOverlap:
        """Not implemented: load balancing."""
        raise NotImplementedError

    def barrier(self, wait_comm_stream: bool = True, with_cpu_sync: bool = False, sequential: bool = True,
                context_idx: int | None = None) -> None:
        """A barrier of the group (every rank calls it)."""
        if context_idx is not None:
            count("EPBuffer.barrier", "context_idx", context_idx)
        self._barrier("EPBuffer.barrier", ("wait_comm_stream", wait_comm_stream), ("with_cpu_sync", with_cpu_sync),
                      ("sequential", sequential))

    def get_comm_stream(self) -> Any:
        """The communication stream: ``torch.cpu.current_stream()`` (a :class:`CPUStream` without torch)."""
        return self._comm_stream()

    def get_physical_domain_size(self) -> tuple[int, int]:
        """``(1, R)``: one host."""
        return self.num_rdma_ranks, self.num_nvlink_ranks

    def get_logical_domain_size(self) -> tuple[int, int]:
        """``(1, R)``: hybrid mode never engages."""
        return self.num_scaleout_ranks, self.num_scaleup_ranks

    def print_memory_usage(self) -> None:
        """Print the buffer's byte counts."""
        print(f"EPBuffer rank {self.rank_idx}/{self.num_ranks}: {self.num_bytes} bytes "
              f"(load balancing: {self.lb_num_bytes})", flush=True)

    def dispatch(self, x: Any, topk_idx: Any = None, topk_weights: Any = None,
                 cumulative_local_expert_recv_stats: Any = None, num_experts: int | None = None,
                 num_max_tokens_per_rank: int | None = None, expert_alignment: int | None = None, num_sms: int = 0,
                 num_qps: int = 0, previous_event: EventHandle | None = None, async_with_compute_stream: bool = False,
                 allocate_on_comm_stream: bool = False, handle: EPHandle | None = None, do_handle_copy: bool = False,
                 do_cpu_sync: bool | None = None, do_expand: bool = False, do_zero_padding: bool = False,
                 use_tma_aligned_col_major_sf: bool = False, defer_epilogue: bool = False) -> Any:
        """:meth:`ElasticBuffer.dispatch` (no ``previous_event_before_epilogue``); with
        ``defer_epilogue`` only the event, whose ``current_stream_wait()`` returns
        ``(recv_x, recv_topk_idx, recv_topk_weights, handle)``."""
        return self._dispatch(
            "EPBuffer.dispatch", x=x, topk_idx=topk_idx, topk_weights=topk_weights,
            cumulative_local_expert_recv_stats=cumulative_local_expert_recv_stats, num_experts=num_experts,
            num_max_tokens_per_rank=num_max_tokens_per_rank, expert_alignment=expert_alignment, num_sms=num_sms,
            num_qps=num_qps, previous_event=previous_event, previous_event_before_epilogue=None,
            async_with_compute_stream=async_with_compute_stream, allocate_on_comm_stream=allocate_on_comm_stream,
            handle=handle, do_handle_copy=do_handle_copy, do_cpu_sync=do_cpu_sync, do_expand=do_expand,
            do_zero_padding=do_zero_padding, use_tma_aligned_col_major_sf=use_tma_aligned_col_major_sf,
            defer_epilogue=defer_epilogue)

    def combine(self, x: Any, handle: EPHandle, topk_weights: Any = None, bias: Any = None, num_sms: int = 0,
                num_qps: int = 0, previous_event: EventHandle | None = None, async_with_compute_stream: bool = False,
                allocate_on_comm_stream: bool = False, defer_epilogue: bool = False) -> Any:
        """:meth:`ElasticBuffer.combine` (no ``previous_event_before_epilogue``); with
        ``defer_epilogue`` only the event, whose ``current_stream_wait()`` returns
        ``(combined_x, combined_topk_weights)``."""
        return self._combine(
            "EPBuffer.combine", x=x, handle=handle, topk_weights=topk_weights, bias=bias, num_sms=num_sms,
            num_qps=num_qps, previous_event=previous_event, previous_event_before_epilogue=None,
            async_with_compute_stream=async_with_compute_stream, allocate_on_comm_stream=allocate_on_comm_stream,
            defer_epilogue=defer_epilogue)
