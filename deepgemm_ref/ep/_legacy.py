"""DeepEP's legacy ``Buffer`` (V1) on a group of ranks (contract 11).

Two families of collectives, on the group's :class:`~deepgemm_ref.comm.Transport` only (so the
in-process form and a gloo process group give the same bytes):

* the intranode path (``get_dispatch_layout``, ``dispatch``, ``combine``): tokens go whole to
  every rank owning one of their experts (``is_token_in_rank``), received in canonical order
  (source rank, then token); combine sums the ranks' rows back in rank order with the biases
  first (:func:`~deepgemm_ref.ep.reduction.rank_order_combine`);
* the low-latency path (``low_latency_dispatch`` / ``low_latency_combine``): one message per
  (token, expert) slot into a packed per-expert layout (:func:`~deepgemm_ref.ep.routing.packed_layout`),
  optionally cast to FP8 per 128 channels (:mod:`deepgemm_ref.ep.cast`); combine is the float32
  FMA chain over the slots in top-k order
  (:func:`~deepgemm_ref.ep.reduction.low_latency_combine_reference`).

Every call checks its arguments locally first (the package's argument error naming the argument,
before any output, in-place argument or collective), then exchanges a small header by
``all_gather``: ranks whose calls disagree (hidden size, experts, dtypes, ...) all raise the same
error there.  The emulator's ranks share one host: ``internode_*`` raise ``NotImplementedError``.
Stream and event arguments are checked as DeepEP checks them and have no effect: every call has
finished when it returns.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..api import not_implemented
from ..comm import transport
from ..dtypes import BF16, E4M3, F32, I32
from ..errors import DGArgumentError, arg_error
from ..exact import align, ceil_div
from ..interop import TORCH_TO_NUMPY, Kind, caller_kind, from_numpy, torch_dtype_name
from ..profiles import get_profile
from ..toolkit.args import as_array, is_contiguous
from ..toolkit.outputs import check_written
from ..toolkit.sizes import check_alloc, size_arg
from . import routing
from ._buffer import CPUStream
from ._checks import _routing as check_topk_idx
from ._checks import count, flag
from ._config import Config
from ._event import EventHandle, EventOverlap
from .cast import low_latency_cast_fp8, pack_ue8m0
from .reduction import low_latency_combine_reference, sum_f32_pieces, sum_pieces

__all__ = ["Buffer", "LL_HIDDEN_SIZES", "get_low_latency_rdma_size_hint"]

I64 = np.dtype(np.int64)
U8 = np.dtype(np.uint8)
BOOL = np.dtype(bool)
INT_MAX = 2**31 - 1
#: The legacy buffers' size granularity (bytes).
BUFFER_ALIGNMENT_BYTES = 128
NUM_MAX_NVL_PEERS = routing.NUM_MAX_NVL_PEERS
NUM_MAX_RDMA_PEERS = 20
NUM_MAX_LOCAL_EXPERTS = 1024
WORKSPACE_BYTES = 32 << 20
#: Hidden sizes the low-latency kernels are compiled for.
LL_HIDDEN_SIZES = (2048, 2560, 3072, 4096, 5120, 6144, 7168, 8192)
LL_MAX_TOPK = 11
_TOPK_BYTES = 8

#: DeepEP's recommended configs: ranks -> (nvl send, nvl recv, rdma send, rdma recv) chunk tokens.
_DISPATCH_CONFIGS: dict[int, tuple[int, int, int, int]] = {
    2: (24, 256, 6, 128), 4: (6, 256, 6, 128), 8: (6, 256, 6, 128), 16: (36, 288, 20, 128),
    24: (32, 288, 8, 128), 32: (32, 288, 8, 128), 48: (32, 288, 8, 128), 64: (32, 288, 8, 128),
    96: (20, 480, 12, 128), 128: (20, 560, 12, 128), 144: (32, 720, 12, 128), 160: (28, 720, 12, 128),
}
_COMBINE_CONFIGS: dict[int, tuple[int, int, int, int]] = {
    2: (10, 256, 6, 128), 4: (9, 256, 6, 128), 8: (4, 256, 6, 128), 16: (4, 288, 12, 128),
    24: (1, 288, 8, 128), 32: (1, 288, 8, 128), 48: (1, 288, 8, 128), 64: (1, 288, 8, 128),
    96: (1, 480, 8, 128), 128: (1, 560, 8, 128), 144: (2, 720, 8, 128), 160: (2, 720, 8, 128),
}

# Note: internode_dispatch / internode_combine (and dispatch / combine of more than 8 ranks) raise NotImplementedError.
_ONE_HOST = ("the emulator's ranks share one host (num_rdma_ranks = 1): DeepEP's internode kernels (RDMA between "
             "hosts, R > 8) are not emulated")


class _Runtime:
    """The buffer's runtime handle (DeepEP's C++ object); ``None`` once the buffer is destroyed."""

    def __repr__(self) -> str:
        return "deepgemm_ref.ep legacy runtime (CPU)"


# ----------------------------------------------------------------------------------------------
# sizes
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _LowLatencyLayout:
    """DeepEP's low-latency RDMA buffer layout: two send, two receive and two signalling
    buffers (odd / even calls)."""

    total_bytes: int
    send_bytes: int
    recv_bytes: int
    signaling_aligned: int
    combine_msg_bytes: int

    def combine_send_offset(self, i: int) -> int:
        """Byte offset of buffer i's combine send region (what ``get_next_low_latency_combine_buffer`` views)."""
        return 2 * self.signaling_aligned + self.send_bytes * i


def _ll_layout(func: str, t_max: int, hidden: int, num_experts: int) -> _LowLatencyLayout:
    scales = hidden // 128
    if scales * 4 > hidden:
        raise arg_error(func, "hidden", "a hidden size whose per-128 scales fit in it (hidden // 128 * 4 <= hidden)",
                        str(hidden))
    dispatch_msg = 16 + max(hidden * 2, hidden + scales * 4)
    combine_msg = scales * 4 + hidden * 2
    send = max(t_max * dispatch_msg, num_experts * t_max * combine_msg)
    recv = max(num_experts * t_max * dispatch_msg, num_experts * t_max * combine_msg)
    if send % 16 or recv % 16:
        raise arg_error(func, "hidden", "message sizes that keep the buffers 16-byte aligned",
                        f"hidden {hidden}, {t_max} tokens per rank")
    signaling = align(num_experts * 4, 128)
    return _LowLatencyLayout(total_bytes=2 * (send + recv + signaling), send_bytes=send, recv_bytes=recv,
                             signaling_aligned=signaling, combine_msg_bytes=combine_msg)


def get_low_latency_rdma_size_hint(num_max_dispatch_tokens_per_rank: int, hidden: int, num_ranks: int,
                                   num_experts: int) -> int:
    """RDMA buffer bytes for the low-latency kernels: the layout's two send, two receive and two
    signalling buffers, rounded up past the next multiple of 128 (DeepEP adds 128 even to an
    aligned size).  The BF16 message size bounds the FP8 one."""
    func = "Buffer.get_low_latency_rdma_size_hint"
    t_max = count(func, "num_max_dispatch_tokens_per_rank", num_max_dispatch_tokens_per_rank)
    h = count(func, "hidden", hidden)
    count(func, "num_ranks", num_ranks, 1)
    e = count(func, "num_experts", num_experts)
    n = _ll_layout(func, t_max, h, e).total_bytes
    return (n + BUFFER_ALIGNMENT_BYTES) // BUFFER_ALIGNMENT_BYTES * BUFFER_ALIGNMENT_BYTES


def _dispatch_nvl_bytes(num_ranks: int, cfg: Config, hidden_bytes: int, num_topk: int, num_scales: int) -> int:
    """NVLink bytes an intranode dispatch uses (DeepEP's host check)."""
    ch = cfg.num_sms // 2
    slots = ch * num_ranks * cfg.num_max_nvl_chunked_recv_tokens
    return (num_ranks * num_ranks * 4 + ch * num_ranks * 4 * 4 + slots * hidden_bytes + slots * 4
            + slots * num_topk * _TOPK_BYTES + slots * num_topk * 4 + slots * 4 * num_scales)


def _combine_nvl_bytes(num_ranks: int, cfg: Config, hidden_bytes: int, num_topk: int) -> int:
    """NVLink bytes an intranode combine uses (DeepEP's host check)."""
    ch = cfg.num_sms // 2
    slots = ch * num_ranks * cfg.num_max_nvl_chunked_recv_tokens
    return ch * num_ranks * 4 * 2 + slots * hidden_bytes + slots * 4 + slots * num_topk * 4


# ----------------------------------------------------------------------------------------------
# argument helpers
# ----------------------------------------------------------------------------------------------

def _int_array(func: str, arg: str, x: Any, dtype: np.dtype, shape: tuple[int, ...] | None, what: str) -> np.ndarray:
    """A contiguous array of ``dtype`` (and ``shape``, when given)."""
    a = as_array(x, func, arg)
    if a.dtype != dtype or (shape is not None and a.shape != shape) or not is_contiguous(a):
        want = f"a contiguous {dtype} array" + (f" of shape {shape}" if shape is not None else "")
        raise arg_error(func, arg, f"{want} ({what})", a)
    return a


def _events(func: str, previous_event: Any, async_finish: Any, allocate_on_comm_stream: Any) -> bool:
    """The legacy stream rules: ``allocate_on_comm_stream`` needs a previous event and ``async_finish``."""
    if previous_event is not None and not isinstance(previous_event, EventOverlap):
        raise arg_error(func, "previous_event", "None or an EventOverlap (Buffer.capture())",
                        type(previous_event).__name__)
    async_ = flag(func, "async_finish", async_finish)
    alloc = flag(func, "allocate_on_comm_stream", allocate_on_comm_stream)
    has_event = previous_event is not None and previous_event.event is not None
    if alloc and not (has_event and async_):
        raise arg_error(func, "allocate_on_comm_stream", "False unless previous_event (a captured event) is given "
                        "and async_finish=True", "True")
    return async_


def _event(async_: bool, tensors: tuple[Any, ...] | None = None) -> EventOverlap:
    return EventOverlap(EventHandle() if async_ else None, tensors if async_ else None)


def _bytes_rows(a: np.ndarray) -> np.ndarray:
    """An (n, ...) array as (n, row bytes) uint8 (a copy only where not C-contiguous)."""
    a = np.ascontiguousarray(a)
    row = int(np.prod(a.shape[1:], dtype=np.int64)) * a.itemsize
    return a.view(U8).reshape(a.shape[0], row) if a.size else np.zeros((a.shape[0], row), U8)


def _np_dtype(func: str, dtype: Any) -> tuple[np.dtype, bool]:
    """(NumPy dtype, whether a torch dtype was given) of ``get_local_buffer_tensor``'s dtype."""
    if type(dtype).__module__.startswith("torch"):
        name = torch_dtype_name(dtype)
        if name in TORCH_TO_NUMPY:
            return TORCH_TO_NUMPY[name][1], True
        try:
            return np.dtype(name), True
        except TypeError:
            raise arg_error(func, "dtype", "a dtype with a NumPy equivalent", repr(dtype)) from None
    try:
        return np.dtype(dtype), False
    except TypeError:
        raise arg_error(func, "dtype", "a torch, NumPy or ml_dtypes dtype", repr(dtype)) from None


@dataclass(frozen=True)
class _DispatchCall:
    kind: Kind
    x: np.ndarray
    sf: np.ndarray | None
    in_rank: np.ndarray              # bool (T, R)
    in_rank_obj: Any                 # the caller's is_token_in_rank (kept by the handle)
    per_expert: np.ndarray | None    # int32 (E,), non-cached
    topk: np.ndarray | None          # int64 (T, K)
    weights: np.ndarray | None       # float32 (T, K)
    num_experts: int
    alignment: int
    worst: int
    num_channels: int
    cached: tuple[np.ndarray, np.ndarray] | None  # (rank_prefix_matrix, recv_src_idx) of a cached handle
    async_: bool


# ----------------------------------------------------------------------------------------------
# the buffer
# ----------------------------------------------------------------------------------------------

class Buffer:
    """DeepEP's legacy communication buffer (contract 11) on a group of ranks.

    ``group``: a rank view of an in-process group (:func:`deepgemm_ref.ep.run_emulated`) or a
    ``torch.distributed`` process group; every rank constructs its buffer (a barrier ends the
    constructor).  ``num_nvl_bytes`` sizes the intranode path and ``num_rdma_bytes`` (with
    ``low_latency_mode=True``) the low-latency one; both are checked as DeepEP checks them (the
    device layout's byte counts) and never allocated unless :meth:`get_local_buffer_tensor` or
    :meth:`get_next_low_latency_combine_buffer` asks for their bytes.  ``enable_shrink`` (with
    ``num_rdma_bytes > 0``) gives the buffer a mask of ranks the low-latency calls skip.

    Attributes: ``rank``, ``group``, ``group_size``, ``num_nvl_bytes``, ``num_rdma_bytes``,
    ``low_latency_mode``, ``explicitly_destroy``, ``enable_shrink``, ``runtime`` (``None`` after
    :meth:`destroy`), ``nvshmem_qp_depth`` (low-latency mode or more than 8 ranks: the
    ``NVSHMEM_QP_DEPTH`` environment variable, default 1024).  Class attribute ``num_sms``: the
    SMs of the default configs (:meth:`set_num_sms`).
    """

    num_sms: int = 20

    def __init__(self, group: Any, num_nvl_bytes: int = 0, num_rdma_bytes: int = 0, low_latency_mode: bool = False,
                 num_qps_per_rank: int = 24, allow_nvlink_for_low_latency_mode: bool = True,
                 allow_mnnvl: bool = False, explicitly_destroy: bool = False, enable_shrink: bool = False,
                 comm: Any = None) -> None:
        func = "Buffer"
        profile = get_profile()
        if profile.is_ascend:
            # Note: DeepEP-Ascend offers EPBuffer only: the legacy Buffer raises under ascend950.
            raise DGArgumentError(
                f"{func}: not provided by DeepEP-Ascend (active arch profile {profile.name!r}): its deep_ep offers "
                "EPBuffer (contract 13); the legacy Buffer is CUDA-only; switch profiles with "
                "deepgemm_ref.set_arch(...) or deepgemm_ref.numerics(arch=...)")
        if group is None:
            if comm is None:
                raise arg_error(func, "group", "a process group (or an mpi4py communicator as comm)", "None")
            # Note: an mpi4py communicator instead of a group is not supported (no MPI transport).
            raise NotImplementedError(f"{func}: comm: not implemented: an mpi4py communicator needs an MPI "
                                      "transport; pass a torch.distributed process group or an in-process group")
        t = transport(group, func, "group")
        nvl = size_arg(func, "num_nvl_bytes", num_nvl_bytes, 0, None)
        rdma = size_arg(func, "num_rdma_bytes", num_rdma_bytes, 0, None)
        ll = flag(func, "low_latency_mode", low_latency_mode)
        qps = size_arg(func, "num_qps_per_rank", num_qps_per_rank, None)
        flag(func, "allow_nvlink_for_low_latency_mode", allow_nvlink_for_low_latency_mode)
        flag(func, "allow_mnnvl", allow_mnnvl)
        destroy = flag(func, "explicitly_destroy", explicitly_destroy)
        shrink = flag(func, "enable_shrink", enable_shrink)
        size = t.size
        if nvl % BUFFER_ALIGNMENT_BYTES or (nvl > INT_MAX and rdma != 0):
            raise arg_error(func, "num_nvl_bytes", "a multiple of 128 (at most 2^31 - 1 with RDMA bytes)", str(nvl))
        if rdma % BUFFER_ALIGNMENT_BYTES or (rdma > INT_MAX and not ll):
            raise arg_error(func, "num_rdma_bytes", "a multiple of 128 (at most 2^31 - 1 outside low-latency mode)",
                            str(rdma))
        for name, v in (("num_nvl_bytes", nvl), ("num_rdma_bytes", rdma)):
            if v // 16 >= INT_MAX or ceil_div(v, max(profile.device_num_sms // 2, 1)) >= INT_MAX:
                raise arg_error(func, name, "a size whose 16-byte units and per-channel bytes fit a C++ int", str(v))
        if size > NUM_MAX_NVL_PEERS * NUM_MAX_RDMA_PEERS and not ll:
            raise arg_error(func, "group", f"at most {NUM_MAX_NVL_PEERS * NUM_MAX_RDMA_PEERS} ranks outside "
                            "low-latency mode", f"{size} ranks")
        if not (size < NUM_MAX_NVL_PEERS or size % NUM_MAX_NVL_PEERS == 0):
            raise arg_error(func, "group", f"fewer than {NUM_MAX_NVL_PEERS} ranks or a multiple of "
                            f"{NUM_MAX_NVL_PEERS}", f"{size} ranks")
        if rdma > 0 and not (size > NUM_MAX_NVL_PEERS or ll):
            raise arg_error(func, "num_rdma_bytes", "0 on one host outside low-latency mode", str(rdma))
        # Note: the intranode path takes any R <= 8 (DeepEP's kernels are compiled for R in {2, 4, 8}).
        self._num_rdma_ranks = max(1, size // NUM_MAX_NVL_PEERS)
        if self._num_rdma_ranks > 1 or ll:
            if qps <= 0:
                raise arg_error(func, "num_qps_per_rank", "a positive QP count (RDMA / low-latency mode)", str(qps),
                                utility=True)
            # Note: the NVSHMEM environment variables are read (NVSHMEM_QP_DEPTH) but never set.
            self.nvshmem_qp_depth = int(os.environ.get("NVSHMEM_QP_DEPTH", "1024"))
        self.rank = t.rank
        self.group = group
        self.group_size = size
        self.num_nvl_bytes = nvl
        self.num_rdma_bytes = rdma
        self.low_latency_mode = ll
        self.explicitly_destroy = destroy
        self.enable_shrink = shrink
        self.runtime: _Runtime | None = _Runtime()
        self._transport = t
        self._profile = profile
        self._num_qps_per_rank = qps
        self._ll_buffer_idx = 0
        # the shrink mask exists with RDMA bytes only (DeepEP allocates it with the NVSHMEM buffer)
        self._mask: np.ndarray | None = np.zeros(size, I32) if (shrink and rdma > 0) else None
        self._local: dict[bool, np.ndarray] = {}
        t.barrier()  # initialisation visible to every peer

    # -- state ----------------------------------------------------------------------------------

    def _live(self, func: str) -> None:
        if self.runtime is None:
            raise arg_error(func, "self", "a live buffer", "a destroyed buffer (destroy() was called)")

    def _need_ll(self, func: str) -> None:
        self._live(func)
        if not self.low_latency_mode:
            raise arg_error(func, "low_latency_mode", "a buffer constructed with low_latency_mode=True", "False")

    def _local_bytes(self, func: str, rdma: bool) -> np.ndarray:
        """The buffer's raw bytes (zero-filled, allocated on first use)."""
        if rdma not in self._local:
            n = self.num_rdma_bytes if rdma else self.num_nvl_bytes
            check_alloc(func, "use_rdma_buffer" if rdma else "num_nvl_bytes", n, "the buffer's bytes")
            self._local[rdma] = np.zeros(n, U8)
        return self._local[rdma]

    def destroy(self) -> None:
        """Release the buffer (requires ``explicitly_destroy=True``); it is unusable afterwards."""
        if not self.explicitly_destroy:
            raise arg_error("Buffer.destroy", "explicitly_destroy", "True at construction", "False", utility=True)
        self._live("Buffer.destroy")
        self.runtime = None
        self._local.clear()

    # -- static helpers -------------------------------------------------------------------------

    @staticmethod
    def is_sm90_compiled() -> bool:
        """True: the emulated build has the SM90 features (FP8 dispatch, TMA combine)."""
        return True

    @staticmethod
    def set_num_sms(new_num_sms: int) -> None:
        """Set the SMs of the default configs (:meth:`get_dispatch_config`); must be even."""
        n = size_arg("Buffer.set_num_sms", "new_num_sms", new_num_sms, 0)
        if n % 2:
            raise arg_error("Buffer.set_num_sms", "new_num_sms", "an even SM count", str(n), utility=True)
        Buffer.num_sms = n

    @staticmethod
    def capture() -> EventOverlap:
        """An event of the current stream (complete: the CPU has finished everything before it)."""
        return EventOverlap(EventHandle())

    @staticmethod
    def get_low_latency_rdma_size_hint(num_max_dispatch_tokens_per_rank: int, hidden: int, num_ranks: int,
                                       num_experts: int) -> int:
        """The RDMA bytes the low-latency kernels need (a multiple of 128; see
        :func:`get_low_latency_rdma_size_hint`)."""
        return get_low_latency_rdma_size_hint(num_max_dispatch_tokens_per_rank, hidden, num_ranks, num_experts)

    def get_comm_stream(self) -> Any:
        """The communication stream: ``torch.cpu.current_stream()`` (a ``CPUStream`` without torch)."""
        try:
            import torch
        except ImportError:
            return CPUStream()
        return torch.cpu.current_stream()

    def get_local_buffer_tensor(self, dtype: Any, size: Any = None, offset: int = 0,
                                use_rdma_buffer: bool = False) -> Any:
        """The buffer's own bytes from byte ``offset`` on as a 1-D array of ``dtype`` (a torch tensor
        for a torch dtype), or its first ``prod(size)`` elements shaped ``size``.  The emulator's
        dispatch and combine do not keep their messages there; only
        :meth:`get_next_low_latency_combine_buffer`'s region is read (``zero_copy``)."""
        func = "Buffer.get_local_buffer_tensor"
        self._live(func)
        dt, torch_kind = _np_dtype(func, dtype)
        rdma = flag(func, "use_rdma_buffer", use_rdma_buffer)
        total = self.num_rdma_bytes if rdma else self.num_nvl_bytes
        off = size_arg(func, "offset", offset, 0, None)
        if off > total or off % dt.itemsize:
            raise arg_error(func, "offset", f"a byte offset within the buffer's {total} bytes and a multiple of "
                            f"{dt.itemsize}", str(off))
        raw = self._local_bytes(func, rdma)
        # Note: the view holds the bytes from offset to the end (DeepEP's holds num_bytes / itemsize elements).
        n = (total - off) // dt.itemsize
        view = raw[off:off + n * dt.itemsize].view(dt)
        if size is not None:
            shape = tuple(int(v) for v in size)
            need = int(np.prod(shape, dtype=np.int64))
            if need > n:
                raise arg_error(func, "size", f"at most {n} elements", f"{need} elements", utility=True)
            view = view[:need].reshape(shape)
        return from_numpy(view, "torch") if torch_kind else view

    @staticmethod
    def get_dispatch_config(num_ranks: int) -> Config:
        """DeepEP's recommended dispatch config for ``num_ranks`` in {2, 4, 8, 16, 24, 32, 48, 64,
        96, 128, 144, 160}, with ``Buffer.num_sms`` SMs."""
        return _table_config("Buffer.get_dispatch_config", _DISPATCH_CONFIGS, num_ranks)

    @staticmethod
    def get_combine_config(num_ranks: int) -> Config:
        """DeepEP's recommended combine config (as :meth:`get_dispatch_config`)."""
        return _table_config("Buffer.get_combine_config", _COMBINE_CONFIGS, num_ranks)

    def _config(self, func: str, config: Any, table: dict[int, tuple[int, int, int, int]]) -> Config:
        if config is None:
            if self.group_size in table:
                return Config(Buffer.num_sms, *table[self.group_size])
            # Note: with no table entry for R (R = 1, 3, 5, 6, 7) config=None means Config(Buffer.num_sms).
            return Config(Buffer.num_sms)
        if not isinstance(config, Config):
            raise arg_error(func, "config", "None or a deep_ep.Config", type(config).__name__)
        # Note: config.num_sms must be even and at least 2 (DeepEP only asserts even; 0 channels would hang).
        if config.num_sms % 2 or config.num_sms < 2:
            raise arg_error(func, "config", "an even num_sms of at least 2 (one channel is two SMs)",
                            repr(config))
        return config

    # -- layout ---------------------------------------------------------------------------------

    def get_dispatch_layout(self, topk_idx: Any, num_experts: int, previous_event: EventOverlap | None = None,
                            async_finish: bool = False, allocate_on_comm_stream: bool = False) -> tuple[
                                Any, Any, Any, Any, EventOverlap]:
        """The layout of this rank's routing (contract 11.2; local, not a collective).

        topk_idx: int64 (T, K), expert ids (-1: none; each expert at most once per row).
        Returns ``(num_tokens_per_rank int32 (R,), num_tokens_per_rdma_rank (int32 (R / 8,), or
        None on one host), num_tokens_per_expert int32 (E,), is_token_in_rank bool (T, R), event)``:
        tokens with at least one expert on each rank (RDMA rank), selections of each expert, and
        whether token t goes to rank r.
        """
        func = "Buffer.get_dispatch_layout"
        self._live(func)
        async_ = _events(func, previous_event, async_finish, allocate_on_comm_stream)
        e = self._experts(func, num_experts)
        idx = check_topk_idx(func, "topk_idx", topk_idx, None, e)
        lay = routing.dispatch_layout(idx, e, self.group_size)
        kind = caller_kind(topk_idx)
        return (from_numpy(lay.num_tokens_per_rank, kind), from_numpy(lay.num_tokens_per_rdma_rank, kind),
                from_numpy(lay.num_tokens_per_expert, kind), from_numpy(lay.is_token_in_rank, kind), _event(async_))

    def _experts(self, func: str, num_experts: Any) -> int:
        e = count(func, "num_experts", num_experts, 1)
        if e % self.group_size:
            raise arg_error(func, "num_experts", f"a multiple of the number of ranks ({self.group_size})", str(e))
        return e

    # -- intranode dispatch ---------------------------------------------------------------------

    def dispatch(self, x: Any, handle: tuple | None = None, num_tokens_per_rank: Any = None,
                 num_tokens_per_rdma_rank: Any = None, is_token_in_rank: Any = None, num_tokens_per_expert: Any = None,
                 topk_idx: Any = None, topk_weights: Any = None, expert_alignment: int = 1, num_worst_tokens: int = 0,
                 config: Config | None = None, previous_event: EventOverlap | None = None, async_finish: bool = False,
                 allocate_on_comm_stream: bool = False) -> tuple[Any, Any, Any, Any, Any, EventOverlap]:
        """Send every token to the ranks ``is_token_in_rank`` names (a collective; contract 11.3).

        x:  bf16 (T, H), or ``(x_e4m3 (T, H), sf (T, P))`` with float32 or int32 scale packs (any
            strides); rows of a multiple of 16 bytes.
        Fresh call: ``num_tokens_per_rank`` int32 (R,), ``is_token_in_rank`` bool (T, R) and
            ``num_tokens_per_expert`` int32 (E,) (:meth:`get_dispatch_layout`); ``topk_idx`` int64
            (T, K) and ``topk_weights`` float32 (T, K) together or neither.
        Cached call: ``handle`` of an earlier dispatch, no top-k; the new ``x`` takes its layout.
        num_worst_tokens: > 0 allocates that many rows (no CPU sync; needs top-k).

        Returns ``(recv_x, recv_topk_idx, recv_topk_weights, num_recv_tokens_per_expert_list,
        handle, event)``: N received rows in canonical order (source rank, then token), each a
        byte copy of its token (FP8: ``(recv_x, recv_sf)``, sf (N, P) row-major);
        ``recv_topk_idx`` int64 (N, K) the local expert of each slot on this rank else -1;
        ``recv_topk_weights`` float32 (N, K) the source's weights, 0.0 on the other ranks' slots;
        the list ``[align(c_e, A)]`` (``[]`` with ``num_worst_tokens``); ``handle = (rank_prefix_matrix
        int32 (R, R), channel_prefix_matrix int32 (R, C), recv_channel_prefix_matrix int32 (R, C),
        recv_src_idx int32 (N,), is_token_in_rank, send_head int32 (T, R))``, C = ``config.num_sms / 2``.
        With ``num_worst_tokens`` the rows past N are zero, ``recv_topk_idx`` -1 and
        ``recv_src_idx`` -1.  Cached: ``(recv_x, None, None, None, None, event)``.
        """
        func = "Buffer.dispatch"
        self._live(func)
        cfg = self._config(func, config, _DISPATCH_CONFIGS)
        worst = count(func, "num_worst_tokens", num_worst_tokens)
        if self._num_rdma_ranks > 1:
            if worst:
                raise arg_error(func, "num_worst_tokens", "0 for an internode dispatch", str(worst), utility=True)
            return self.internode_dispatch(x, handle, num_tokens_per_rank, num_tokens_per_rdma_rank, is_token_in_rank,
                                           num_tokens_per_expert, topk_idx, topk_weights, expert_alignment, cfg,
                                           previous_event, async_finish, allocate_on_comm_stream)
        c = self._check_dispatch(func, cfg, x=x, handle=handle, num_tokens_per_rank=num_tokens_per_rank,
                                 is_token_in_rank=is_token_in_rank, num_tokens_per_expert=num_tokens_per_expert,
                                 topk_idx=topk_idx, topk_weights=topk_weights, expert_alignment=expert_alignment,
                                 worst=worst, previous_event=previous_event, async_finish=async_finish,
                                 allocate_on_comm_stream=allocate_on_comm_stream)
        return self._dispatch_exchange(func, c)

    def _check_dispatch(self, func: str, cfg: Config, *, x: Any, handle: Any, num_tokens_per_rank: Any,
                        is_token_in_rank: Any, num_tokens_per_expert: Any, topk_idx: Any, topk_weights: Any,
                        expert_alignment: Any, worst: int, previous_event: Any, async_finish: Any,
                        allocate_on_comm_stream: Any) -> _DispatchCall:
        size = self.group_size
        async_ = _events(func, previous_event, async_finish, allocate_on_comm_stream)
        alignment = count(func, "expert_alignment", expert_alignment, 1)
        nc = cfg.num_sms // 2
        # the data
        if isinstance(x, (tuple, list)):
            if len(x) != 2:
                raise arg_error(func, "x", "a bf16 array or an (x_e4m3, sf) pair", f"a sequence of {len(x)}")
            xa, sf = as_array(x[0], func, "x[0]"), as_array(x[1], func, "x[1]")
            if xa.dtype != E4M3:
                raise arg_error(func, "x[0]", "a float8_e4m3fn array (with scale factors)", xa)
            if sf.dtype not in (F32, I32) or sf.ndim != 2:
                raise arg_error(func, "x[1]", "a 2-D float32 or int32 scale-factor array", sf)
            xname = "x[0]"
        else:
            xa, sf, xname = as_array(x, func, "x"), None, "x"
            # Note: x must be bf16 (or e4m3 with scale factors); DeepEP copies rows of any dtype.
            if xa.dtype != BF16:
                raise arg_error(func, "x", "a bfloat16 array (or an (x_e4m3, sf) pair)", xa)
        if xa.ndim != 2 or not is_contiguous(xa):
            raise arg_error(func, xname, "a contiguous 2-D array (T, hidden)", xa)
        t_count, hidden = xa.shape
        if (hidden * xa.itemsize) % 16:
            raise arg_error(func, xname, "rows of a multiple of 16 bytes", xa)
        if sf is not None and sf.shape[0] != t_count:
            raise arg_error(func, "x[1]", f"{t_count} rows (one per token)", sf)
        cached = None
        per_expert = per_rank = None
        topk = weights = None
        e = 0
        if handle is not None:
            if topk_idx is not None or topk_weights is not None:
                raise arg_error(func, "topk_idx" if topk_idx is not None else "topk_weights",
                                "None with a cached handle", "an array", utility=True)
            if not isinstance(handle, (tuple, list)) or len(handle) != 6:
                raise arg_error(func, "handle", "the 6-tuple an intranode dispatch returns", type(handle).__name__)
            prefix = _int_array(func, "handle[0]", handle[0], I32, (size, size), "rank_prefix_matrix")
            _int_array(func, "handle[1]", handle[1], I32, (size, nc), "channel_prefix_matrix of this config")
            src_idx = _int_array(func, "handle[3]", handle[3], I32, None, "recv_src_idx")
            if src_idx.ndim != 1:
                raise arg_error(func, "handle[3]", "a 1-D recv_src_idx", src_idx)
            in_rank_obj = handle[4]
            in_name = "handle[4]"
            cached = (prefix, src_idx)
        else:
            for name, v in (("num_tokens_per_rank", num_tokens_per_rank), ("is_token_in_rank", is_token_in_rank),
                            ("num_tokens_per_expert", num_tokens_per_expert)):
                if v is None:
                    raise arg_error(func, name, "the layout (get_dispatch_layout) or a cached handle", "None",
                                    utility=True)
            per_expert = _int_array(func, "num_tokens_per_expert", num_tokens_per_expert, I32, None,
                                    "tokens per expert")
            if per_expert.ndim != 1 or per_expert.size % size or per_expert.size // size > NUM_MAX_LOCAL_EXPERTS:
                raise arg_error(func, "num_tokens_per_expert", f"a 1-D array of E entries, E a multiple of {size} "
                                f"and E / {size} <= {NUM_MAX_LOCAL_EXPERTS}", per_expert)
            e = per_expert.size
            per_rank = _int_array(func, "num_tokens_per_rank", num_tokens_per_rank, I32, (size,), "tokens per rank")
            in_rank_obj, in_name = is_token_in_rank, "is_token_in_rank"
            if (topk_idx is None) != (topk_weights is None):
                missing = "topk_weights" if topk_weights is None else "topk_idx"
                raise arg_error(func, missing, "an array when the other top-k argument is given (both or neither)",
                                "None")
            if topk_idx is not None:
                if e == 0:
                    raise arg_error(func, "num_tokens_per_expert", "at least one expert with top-k", per_expert)
                topk = check_topk_idx(func, "topk_idx", topk_idx, t_count, e)
                weights = as_array(topk_weights, func, "topk_weights")
                if weights.dtype != F32 or weights.shape != topk.shape or not is_contiguous(weights):
                    raise arg_error(func, "topk_weights", f"a contiguous float32 array of shape {topk.shape}", weights)
            elif worst:
                raise arg_error(func, "topk_idx", "the top-k arguments with num_worst_tokens > 0", "None",
                                utility=True)
        in_rank = as_array(in_rank_obj, func, in_name)
        if in_rank.dtype != BOOL or in_rank.shape != (t_count, size) or not is_contiguous(in_rank):
            raise arg_error(func, in_name, f"a contiguous bool array of shape ({t_count}, {size})", in_rank)
        if cached is None and per_rank is not None and per_expert is not None:
            # Note: the layout arguments must agree with each other and with topk_idx (DeepEP trusts them).
            if not np.array_equal(per_rank, in_rank.sum(axis=0)):
                raise arg_error(func, "num_tokens_per_rank", "the column sums of is_token_in_rank "
                                f"{in_rank.sum(axis=0).tolist()}", str(np.asarray(per_rank).tolist()))
            if topk is not None:
                lay = routing.dispatch_layout(topk, e, size)
                if not np.array_equal(in_rank, lay.is_token_in_rank):
                    raise arg_error(func, "is_token_in_rank", "the ranks owning each token's experts "
                                    "(get_dispatch_layout(topk_idx))", "another layout")
                if not np.array_equal(per_expert, lay.num_tokens_per_expert):
                    raise arg_error(func, "num_tokens_per_expert", "the selections of each expert in topk_idx",
                                    str(np.asarray(per_expert).tolist()))
            local_meta = size * (size + e // size) * 4
            if local_meta > self.num_nvl_bytes:
                raise arg_error(func, "num_tokens_per_expert", f"a layout that fits the buffer's num_nvl_bytes "
                                f"({self.num_nvl_bytes})", f"{local_meta} bytes needed")
        k = 0 if topk is None else topk.shape[1]
        need = _dispatch_nvl_bytes(size, cfg, hidden * xa.itemsize, k, 0 if sf is None else sf.shape[1])
        if need > self.num_nvl_bytes:
            raise arg_error(func, "config", "a config whose chunks fit the buffer's num_nvl_bytes "
                            f"({self.num_nvl_bytes})",
                            f"{need} bytes needed")
        rows_bound = size * t_count if not worst else max(worst, size * t_count)
        row_bytes = hidden * xa.itemsize + (0 if sf is None else sf.shape[1] * 4) + 12 * k + 4
        check_alloc(func, "x", rows_bound * row_bytes, "the received tokens")
        kind = caller_kind(x, topk_idx, topk_weights, in_rank_obj)
        return _DispatchCall(kind=kind, x=xa, sf=sf, in_rank=in_rank, in_rank_obj=in_rank_obj, per_expert=per_expert,
                             topk=topk, weights=weights, num_experts=e, alignment=alignment, worst=worst,
                             num_channels=nc, cached=cached, async_=async_)

    def _dispatch_exchange(self, func: str, c: _DispatchCall) -> tuple[Any, Any, Any, Any, Any, EventOverlap]:
        t, r, size = self._transport, self.rank, self.group_size
        t_count = c.x.shape[0]
        k = 0 if c.topk is None else c.topk.shape[1]
        sf_packs = -1 if c.sf is None else c.sf.shape[1]
        sf_dtype = 0 if c.sf is None else (1 if c.sf.dtype == F32 else 2)
        sent_counts = c.in_rank.sum(axis=0).astype(I64)
        n_cached = -1 if c.cached is None else int(c.cached[0][-1, r])
        agree = {"operation": 11, "handle (cached or not)": c.cached is not None, "x (hidden)": c.x.shape[1],
                 "x (dtype)": c.x.itemsize, "x[1] (scale-factor packs)": sf_packs, "x[1] (dtype)": sf_dtype,
                 "topk_idx (given or not, num_topk)": k if c.topk is not None else -1,
                 "num_tokens_per_expert (num_experts)": c.num_experts, "config (num_sms)": c.num_channels}
        per_expert = c.per_expert if c.per_expert is not None else np.zeros(0, I32)
        free = np.concatenate([[c.worst, t_count, n_cached], sent_counts, per_expert.astype(I64)])
        got = _header(t, func, agree, free)
        worst_all, t_all, cached_all = got[:, 0], got[:, 1], got[:, 2]
        counts = got[:, 3:3 + size]  # counts[s, d]: tokens s sends to d
        recv_n = counts.sum(axis=0)
        bad = np.flatnonzero((worst_all > 0) & (worst_all < recv_n))
        if bad.size:
            q = int(bad[0])
            raise arg_error(func, "num_worst_tokens", f"at least the tokens each rank receives (rank {q} receives "
                            f"{int(recv_n[q])})", f"per rank {worst_all.tolist()}")
        bad = np.flatnonzero((cached_all >= 0) & (cached_all != recv_n))
        if bad.size:
            q = int(bad[0])
            raise arg_error(func, "handle", "the handle of the dispatch whose layout is reused, on every rank",
                            f"rank {q}'s handle holds {int(cached_all[q])} rows, it receives {int(recv_n[q])}")

        # exchange: the tokens for each destination, ascending
        tokens = [np.flatnonzero(c.in_rank[:, d]) for d in range(size)]
        xb = _bytes_rows(c.x)
        data = t.all_to_all([xb[tk] for tk in tokens])
        meta = t.all_to_all([np.concatenate([tk[:, None].astype(I64), c.topk[tk] if c.topk is not None
                                             else np.zeros((tk.size, 0), I64)], axis=1) for tk in tokens])
        sfs = t.all_to_all([_bytes_rows(c.sf[tk]) for tk in tokens]) if c.sf is not None else None
        ws = t.all_to_all([c.weights[tk] for tk in tokens]) if c.weights is not None else None

        # assemble in canonical order (source rank, then token)
        n = int(recv_n[r])
        rows = n if c.cached is None else int(c.cached[1].size)
        rows = max(rows, c.worst)
        src_tok = np.concatenate([m[:, 0] for m in meta]).astype(I64) if meta else np.zeros(0, I64)
        if c.cached is not None:
            prefix, src_idx = c.cached
            bounds = np.concatenate([[0], prefix[:, r].astype(I64)])
            if not (np.array_equal(np.diff(bounds), counts[:, r]) and np.array_equal(src_idx[:n], src_tok)):
                raise arg_error(func, "handle", "the layout of the tokens now received (this rank's handle of the "
                                "dispatch whose layout is reused)", "another layout")
        # Note: rows past the received ones (num_worst_tokens) are zero, recv_topk_idx and recv_src_idx -1.
        recv_x = np.zeros((rows, xb.shape[1]), U8)
        recv_x[:n] = np.concatenate(data) if data else recv_x[:0]
        recv_x_typed = recv_x.view(c.x.dtype)
        recv_sf = None
        if sfs is not None and c.sf is not None:
            sfb = np.zeros((rows, c.sf.shape[1] * 4), U8)
            sfb[:n] = np.concatenate(sfs)
            recv_sf = sfb.view(c.sf.dtype)
        kind = c.kind
        x_out: Any = from_numpy(recv_x_typed, kind)
        if recv_sf is not None:
            x_out = (x_out, from_numpy(recv_sf, kind))
        event = _event(c.async_)
        if c.cached is not None:
            return x_out, None, None, None, None, event

        e_l = c.num_experts // size
        recv_idx = recv_w = None
        if c.topk is not None and ws is not None:
            topk_rows = np.concatenate([m[:, 1:] for m in meta]).astype(I64)
            local = (topk_rows >= r * e_l) & (topk_rows < (r + 1) * e_l)
            recv_idx = np.full((rows, k), -1, I64)
            recv_idx[:n] = np.where(local, topk_rows - r * e_l, -1)
            recv_w = np.zeros((rows, k), F32)
            recv_w[:n] = np.where(local, np.concatenate(ws), np.float32(0))
        src_idx_out = np.full(rows, -1, I32)
        src_idx_out[:n] = src_tok
        if c.worst:
            per_list: list[int] = []
        else:
            mine = got[:, 3 + size:][:, r * e_l:(r + 1) * e_l].sum(axis=0)
            per_list = [int(align(int(v), c.alignment)) for v in mine]
        # the handle: prefix sums, the channel bookkeeping of the device kernels, the source tokens
        # Note: send_head is the device's value at dispatch; combine does not rewrite its -1 entries.
        prefix_m = routing.rank_prefix_matrix(counts)
        chan = routing.channel_prefix_matrix(c.in_rank, c.num_channels)
        recv_chan = np.zeros((size, c.num_channels), I32)
        for s, m in enumerate(meta):
            starts, _ = routing.channel_ranges(int(t_all[s]), c.num_channels)
            recv_chan[s] = np.searchsorted(m[:, 0], starts, side="left")
        head = routing.send_head(c.in_rank, c.num_channels)
        handle = (from_numpy(prefix_m, kind), from_numpy(chan, kind), from_numpy(recv_chan, kind),
                  from_numpy(src_idx_out, kind), c.in_rank_obj, from_numpy(head, kind))
        return x_out, from_numpy(recv_idx, kind), from_numpy(recv_w, kind), per_list, handle, event

    # -- intranode combine ----------------------------------------------------------------------

    def combine(self, x: Any, handle: tuple, topk_weights: Any = None, bias: Any = None, config: Config | None = None,
                previous_event: EventOverlap | None = None, async_finish: bool = False,
                allocate_on_comm_stream: bool = False) -> tuple[Any, Any, EventOverlap]:
        """Sum every token's rows back on its source rank, without weights (a collective; contract 11.4).

        x:     bf16 (N, H), one row per received token of ``handle``'s dispatch.
        topk_weights: float32 (N, K') or None.   bias: None, bf16 (T, H), or a pair of them.

        ``combined_x[t] = bf16(F)`` with ``F = float(bias0 or +0) + float(bias1 or +0)`` and then
        ``F += float(row)`` for the ranks holding token t in ascending rank order, every addition
        a float32 rounding; ``combined_topk_weights[t] = 0 + sum of those ranks' weight rows``
        (float32, rank order; None without ``topk_weights``).  Returns ``(combined_x (T, H),
        combined_topk_weights, event)``.
        """
        func = "Buffer.combine"
        self._live(func)
        cfg = self._config(func, config, _COMBINE_CONFIGS)
        if self._num_rdma_ranks > 1:
            return self.internode_combine(x, handle, topk_weights, bias, cfg, previous_event, async_finish,
                                          allocate_on_comm_stream)
        size, r, t = self.group_size, self.rank, self._transport
        nc = cfg.num_sms // 2
        if not isinstance(handle, (tuple, list)) or len(handle) != 6:
            raise arg_error(func, "handle", "the 6-tuple an intranode dispatch returns", type(handle).__name__)
        xa = as_array(x, func, "x")
        if xa.ndim != 2 or not is_contiguous(xa):
            raise arg_error(func, "x", "a contiguous 2-D array", xa)
        src_idx = _int_array(func, "handle[3]", handle[3], I32, None, "recv_src_idx")
        head = _int_array(func, "handle[5]", handle[5], I32, None, "send_head")
        prefix = _int_array(func, "handle[0]", handle[0], I32, (size, size), "rank_prefix_matrix")
        _int_array(func, "handle[2]", handle[2], I32, (size, nc), "recv_channel_prefix_matrix of this config")
        if src_idx.ndim != 1 or src_idx.size != xa.shape[0]:
            raise arg_error(func, "x", f"{src_idx.size} rows (one per received token of the handle)", xa)
        if head.ndim != 2 or head.shape[1] != size:
            raise arg_error(func, "handle[5]", f"a 2-D send_head of {size} columns", head)
        rows, hidden = xa.shape
        if (hidden * xa.itemsize) % 16:
            raise arg_error(func, "x", "rows of a multiple of 16 bytes", xa)
        async_ = _events(func, previous_event, async_finish, allocate_on_comm_stream)
        w = None
        if topk_weights is not None:
            w = as_array(topk_weights, func, "topk_weights")
            if w.dtype != F32 or w.ndim != 2 or w.shape[0] != rows or not is_contiguous(w):
                raise arg_error(func, "topk_weights", f"a contiguous float32 array of {rows} rows", w)
        t_count = head.shape[0]
        biases = self._biases(func, bias, xa, t_count)
        if xa.dtype != BF16:
            raise arg_error(func, "x", "a bfloat16 array (DeepEP's combine kernels)", xa)
        k = 0 if w is None else w.shape[1]
        need = _combine_nvl_bytes(size, cfg, hidden * 2, k)
        if need > self.num_nvl_bytes:
            raise arg_error(func, "config", "a config whose chunks fit the buffer's num_nvl_bytes "
                            f"({self.num_nvl_bytes})",
                            f"{need} bytes needed")
        bounds = np.concatenate([[0], prefix[:, r].astype(I64)])
        per_src = np.diff(bounds)
        if bounds[-1] > rows or np.any(per_src < 0):
            raise arg_error(func, "handle[0]", f"a rank_prefix_matrix whose column {r} ends within the {rows} rows "
                            "of x",
                            str(prefix[:, r].tolist()))
        holders = head >= 0
        expect = holders.sum(axis=0).astype(I64)  # rows each owner sends back to this rank
        check_alloc(func, "x", t_count * hidden * 6 + rows * hidden * 2, "the combined tokens")

        # header: what every owner sends every source must be what the source expects
        agree = {"operation": 12, "x (hidden)": hidden, "topk_weights (given or not, columns)": k if w is not None
                 else -1, "config (num_sms)": nc}
        got = _header(t, func, agree, np.concatenate([per_src, expect]))
        sends, expects = got[:, :size], got[:, size:]  # sends[q, s]; expects[s, q]
        if not np.array_equal(sends, expects.T):
            q, s = (int(v[0]) for v in np.nonzero(sends != expects.T))
            raise arg_error(func, "handle", "the handles of one dispatch on every rank (rows sent back = rows "
                            "expected)", f"rank {q} sends {int(sends[q, s])} rows to rank {s}, which expects "
                            f"{int(expects[s, q])}")

        parts = [np.arange(bounds[s], bounds[s + 1]) for s in range(size)]
        data = t.all_to_all([_bytes_rows(xa[p]) for p in parts])
        toks = t.all_to_all([src_idx[p].astype(I64)[:, None] for p in parts])
        ws = t.all_to_all([w[p] for p in parts]) if w is not None else None

        # reduce in rank order
        row_of = np.full((t_count, size), -1, I64)
        for q, tk in enumerate(toks):
            tq = tk[:, 0]
            if not np.array_equal(tq, np.flatnonzero(holders[:, q])):
                raise arg_error(func, "handle", "the handle of the dispatch whose tokens are combined (this rank's "
                                "send_head and the owners' recv_src_idx)", f"rank {q} returned other tokens")
            row_of[tq, q] = np.arange(tq.size)
        order = np.argsort(~holders, axis=1, kind="stable")
        width = int(holders.sum(axis=1).max()) if t_count else 0
        index_owner = order[:, :width]
        index_row = np.take_along_axis(row_of, index_owner, axis=1)
        index_owner = np.where(index_row >= 0, index_owner, -1)
        pieces = [d.view(BF16).reshape(d.shape[0], hidden) for d in data]
        combined = sum_pieces(pieces, index_owner, index_row, biases[0], biases[1], start="bias")
        combined_w = None
        if ws is not None:
            combined_w = sum_f32_pieces(list(ws), index_owner, index_row, k)
        kind = caller_kind(x, topk_weights, bias)
        return from_numpy(combined, kind), from_numpy(combined_w, kind), _event(async_)

    @staticmethod
    def _biases(func: str, bias: Any, xa: np.ndarray, t_count: int) -> tuple[np.ndarray | None, np.ndarray | None]:
        if bias is None:
            items: tuple[Any, ...] = ()
        elif isinstance(bias, tuple):
            if len(bias) != 2:
                raise arg_error(func, "bias", "None, an array or a 2-tuple of arrays", f"a {len(bias)}-tuple",
                                utility=True)
            items = bias
        elif isinstance(bias, list):
            # Note: a list bias raises (DeepEP's _unpack_bias ignores anything but a tensor or a tuple).
            raise arg_error(func, "bias", "None, an array or a 2-tuple of arrays", "a list")
        else:
            items = (bias,)
        out: list[np.ndarray | None] = [None, None]
        for i, b in enumerate(items):
            if b is None:
                continue
            name = f"bias[{i}]" if isinstance(bias, tuple) else "bias"
            ba = as_array(b, func, name)
            if ba.ndim != 2 or not is_contiguous(ba) or ba.dtype != xa.dtype or ba.shape != (t_count, xa.shape[1]):
                raise arg_error(func, name, f"a contiguous {xa.dtype} array of shape ({t_count}, {xa.shape[1]})", ba)
            out[i] = ba
        return out[0], out[1]

    @not_implemented(_ONE_HOST)
    def internode_dispatch(self, x: Any, handle: tuple | None = None, num_tokens_per_rank: Any = None,
                           num_tokens_per_rdma_rank: Any = None, is_token_in_rank: Any = None,
                           num_tokens_per_expert: Any = None, topk_idx: Any = None, topk_weights: Any = None,
                           expert_alignment: int = 1, config: Config | None = None,
                           previous_event: EventOverlap | None = None, async_finish: bool = False,
                           allocate_on_comm_stream: bool = False) -> Any:
        """Not implemented: the internode (RDMA + NVLink) dispatch of more than 8 ranks."""

    @not_implemented(_ONE_HOST)
    def internode_combine(self, x: Any, handle: tuple | list, topk_weights: Any = None, bias: Any = None,
                          config: Config | None = None, previous_event: EventOverlap | None = None,
                          async_finish: bool = False, allocate_on_comm_stream: bool = False) -> Any:
        """Not implemented: the internode (RDMA + NVLink) combine of more than 8 ranks."""

    # -- low-latency mode -----------------------------------------------------------------------

    def clean_low_latency_buffer(self, num_max_dispatch_tokens_per_rank: int, hidden: int, num_experts: int) -> None:
        """Clean the low-latency signalling buffers (a collective barrier of the group; with shrink
        mode, a rank masked by a peer masks that peer too, as a device barrier's timeout would)."""
        func = "Buffer.clean_low_latency_buffer"
        self._need_ll(func)
        t_max = count(func, "num_max_dispatch_tokens_per_rank", num_max_dispatch_tokens_per_rank)
        h = count(func, "hidden", hidden)
        e = count(func, "num_experts", num_experts)
        lay = _ll_layout(func, t_max, h, e)
        if 2 * lay.signaling_aligned > self.num_rdma_bytes:
            raise arg_error(func, "num_experts", f"signalling buffers within the buffer's num_rdma_bytes "
                            f"({self.num_rdma_bytes})", f"{2 * lay.signaling_aligned} bytes")
        self._ll_header(func, {"operation": 23}, np.zeros(0, I64))

    def _ll_checks(self, func: str, t_max: int, hidden: int, num_experts: int, num_topk: int) -> _LowLatencyLayout:
        """The low-latency launch constraints shared by dispatch and combine."""
        size = self.group_size
        if hidden % 128 or hidden not in LL_HIDDEN_SIZES:
            raise arg_error(func, "x", f"a hidden size in {LL_HIDDEN_SIZES} (the low-latency kernels)", str(hidden))
        if num_experts % size:
            raise arg_error(func, "num_experts", f"a multiple of the number of ranks ({size})", str(num_experts))
        if num_topk > LL_MAX_TOPK:
            raise arg_error(func, "topk_idx", f"at most {LL_MAX_TOPK} top-k columns", str(num_topk))
        sms = self._profile.device_num_sms
        groups = ceil_div(num_experts, sms)
        per_group = 32 // groups if groups else 0
        launch = ceil_div(num_experts, groups) if groups else 0
        if not (0 < groups < 15 and per_group > 1 and LL_MAX_TOPK + 1 <= groups * per_group and launch > 1
                and num_experts * 8 <= WORKSPACE_BYTES):
            raise arg_error(func, "num_experts", f"an expert count the kernels can launch on {sms} SMs (at least 2, "
                            f"fewer than {15 * sms})", str(num_experts))
        if num_experts // size > self._num_qps_per_rank:
            raise arg_error(func, "num_experts", f"at most num_qps_per_rank ({self._num_qps_per_rank}) local experts",
                            str(num_experts // size))
        if (size * t_max) % 4:
            raise arg_error(func, "num_max_dispatch_tokens_per_rank", f"a count with R * T_max a multiple of 4 "
                            f"(R = {size}; TMA)", str(t_max))
        if self.nvshmem_qp_depth < (t_max + 1) * 2:
            raise arg_error(func, "num_max_dispatch_tokens_per_rank", f"(T_max + 1) * 2 <= nvshmem_qp_depth "
                            f"({self.nvshmem_qp_depth})", str(t_max), utility=True)
        lay = _ll_layout(func, t_max, hidden, num_experts)
        if lay.total_bytes > self.num_rdma_bytes:
            raise arg_error(func, "num_max_dispatch_tokens_per_rank", f"a low-latency layout within the buffer's "
                            f"num_rdma_bytes ({self.num_rdma_bytes})", f"{lay.total_bytes} bytes needed")
        return lay

    def _ll_header(self, func: str, agree: dict[str, Any], rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The low-latency header: every rank's shrink mask (and ``rows``).  Returns (blocked (R,)
        bool: peers this rank exchanges nothing with, every rank's rows (R, len(rows))) and
        updates this rank's mask: a peer that masks this rank gets masked (the device times out
        waiting for it)."""
        # Note: masked ranks still call every collective; a rank masked by a peer masks it back (timeout).
        size = self.group_size
        agree = dict(agree, **{"enable_shrink (with num_rdma_bytes)": self._mask is not None})
        mask = self._mask if self._mask is not None else np.zeros(size, I32)
        got = _header(self._transport, func, agree, np.concatenate([mask.astype(I64), rows]))
        masks = got[:, :size] != 0  # masks[d, s]: rank d masks rank s
        blocked = masks[self.rank] | masks[:, self.rank]
        if self._mask is not None:
            self._mask[blocked] = 1
        return blocked, got[:, size:]

    def low_latency_dispatch(self, x: Any, topk_idx: Any, num_max_dispatch_tokens_per_rank: int, num_experts: int,
                             cumulative_local_expert_recv_stats: Any = None, dispatch_wait_recv_cost_stats: Any = None,
                             use_fp8: bool = True, round_scale: bool = False, use_ue8m0: bool = False,
                             async_finish: bool = False, return_recv_hook: bool = False) -> tuple[
                                 Any, Any, tuple, EventOverlap, Callable[[], None] | None]:
        """Send every (token, expert) slot to the expert's rank, packed per expert (a collective;
        contract 11.5).

        x: bf16 (T, H), H in :data:`LL_HIDDEN_SIZES`, T <= T_max; topk_idx: int64 (T, K), K <= 11.
        cumulative_local_expert_recv_stats: int32 (E_l,), += the tokens each local expert received;
        dispatch_wait_recv_cost_stats: int64 (R,) (nothing is waited for: unchanged).

        Returns ``(recv_x, packed_recv_count, handle, event, hook)``.  ``recv_x``: bf16 or
        e4m3 ``(E_l, R * T_max, H)``; local expert j holds the tokens of source rank s in rows
        ``[begin_s, begin_s + count_s)``, sources ascending, tokens ascending (canonical), the
        other rows zero.  With ``use_fp8`` it is ``(q, scales)``: scales float32 ``(E_l, R * T_max,
        H / 128)`` or, with ``use_ue8m0``, int32 ``(E_l, R * T_max, H / 512)`` (four exponent bytes
        per int), both column-major in the last two dimensions; the cast is :mod:`deepgemm_ref.ep.cast`'s.
        ``packed_recv_count`` int32 (E_l,); ``handle = (packed_recv_src_info int32 (E_l, R * T_max)
        source tokens (-1 past the counts), packed_recv_layout_range int64 (E_l, R) = (begin << 32)
        | count, T_max, H, E)``; ``hook``: a no-op callable with ``return_recv_hook``, else None.
        Ranks masked (shrink mode) exchange nothing: their counts are 0.
        """
        func = "Buffer.low_latency_dispatch"
        self._need_ll(func)
        size, r = self.group_size, self.rank
        t_max = count(func, "num_max_dispatch_tokens_per_rank", num_max_dispatch_tokens_per_rank)
        e = count(func, "num_experts", num_experts, 1)
        fp8 = flag(func, "use_fp8", use_fp8)
        rounded = flag(func, "round_scale", round_scale)
        ue8m0 = flag(func, "use_ue8m0", use_ue8m0)
        async_ = flag(func, "async_finish", async_finish)
        hook = flag(func, "return_recv_hook", return_recv_hook)
        if async_ and hook:
            raise arg_error(func, "return_recv_hook", "False with async_finish=True", "True")
        xa = as_array(x, func, "x")
        if xa.dtype != BF16 or xa.ndim != 2 or not is_contiguous(xa):
            raise arg_error(func, "x", "a contiguous 2-D bfloat16 array (T, hidden)", xa)
        t_count, hidden = xa.shape
        if t_count > t_max:
            raise arg_error(func, "x", f"at most num_max_dispatch_tokens_per_rank ({t_max}) rows", xa)
        if e % size:
            raise arg_error(func, "num_experts", f"a multiple of the number of ranks ({size})", str(e))
        idx = check_topk_idx(func, "topk_idx", topk_idx, t_count, e)
        e_l = e // size
        stats = None
        if cumulative_local_expert_recv_stats is not None:
            stats = as_array(cumulative_local_expert_recv_stats, func, "cumulative_local_expert_recv_stats")
            if stats.dtype != I32 or stats.shape != (e_l,) or not is_contiguous(stats) or not stats.flags.writeable:
                raise arg_error(func, "cumulative_local_expert_recv_stats",
                                f"a writeable contiguous int32 array of shape ({e_l},)", stats)
        if dispatch_wait_recv_cost_stats is not None:
            _int_array(func, "dispatch_wait_recv_cost_stats", dispatch_wait_recv_cost_stats, I64, (size,),
                       "wait cycles per rank")
        if ue8m0 and not rounded:
            raise arg_error(func, "use_ue8m0", "False unless round_scale=True", "True")
        if fp8 and hidden % 512:
            raise arg_error(func, "x", "a hidden size that is a multiple of 512 for FP8", xa)
        self._ll_checks(func, t_max, hidden, e, idx.shape[1])
        slots = size * t_max
        check_alloc(func, "num_max_dispatch_tokens_per_rank", e_l * slots * (hidden * 2 + 16), "the packed tokens")

        # exchange: one message per (token, expert) slot
        agree = {"operation": 21, "num_max_dispatch_tokens_per_rank": t_max, "x (hidden)": hidden,
                 "num_experts": e, "use_fp8": fp8, "round_scale": rounded, "use_ue8m0": ue8m0}
        blocked, _ = self._ll_header(func, agree, np.zeros(0, I64))
        messages = routing.low_latency_messages(idx, e, size, skip=blocked)
        if fp8:
            q, scale_inv = low_latency_cast_fp8(xa, rounded)
            payload = _bytes_rows(q)
        else:
            payload, scale_inv = _bytes_rows(xa), None
        t = self._transport
        meta = t.all_to_all([np.stack([ex, tok], axis=1) for ex, tok in messages])
        data = t.all_to_all([payload[tok] for _, tok in messages])
        scales = t.all_to_all([scale_inv[tok] for _, tok in messages]) if scale_inv is not None else None
        received = [(m[:, 0], m[:, 1]) if not blocked[s] else (m[:0, 0], m[:0, 1]) for s, m in enumerate(meta)]
        lay = routing.packed_layout(received, r, size, e, t_max)

        # assemble the packed layout
        # Note: canonical order (sources, then tokens ascending); rows past the counts are zero, src_info -1.
        cat = np.concatenate(data) if data else np.zeros((0, payload.shape[1]), U8)
        packed = np.zeros((e_l, slots, payload.shape[1]), U8)
        packed[lay.expert, lay.row] = cat
        recv_x = packed.view(E4M3 if fp8 else BF16)
        recv_scales = None
        if scales is not None:
            sc = np.concatenate(scales).astype(F32)
            if ue8m0:
                packs = pack_ue8m0(sc)
                store = np.zeros((e_l, hidden // 512, slots), I32)
                store[lay.expert, :, lay.row] = packs
            else:
                store = np.zeros((e_l, hidden // 128, slots), F32)
                store[lay.expert, :, lay.row] = sc
            recv_scales = store.transpose(0, 2, 1)
        counts = lay.recv_count
        # Note: the wait-cost statistics stay unchanged; events are complete and the hook a no-op.
        if stats is not None:
            stats += counts  # in place (the caller's array or tensor)
        self._ll_buffer_idx ^= 1
        kind = caller_kind(x, topk_idx, cumulative_local_expert_recv_stats)
        out_x: Any = from_numpy(recv_x, kind)
        if recv_scales is not None:
            out_x = (out_x, from_numpy(recv_scales, kind))
        handle = (from_numpy(lay.src_info(), kind), from_numpy(lay.layout_range, kind), t_max, hidden, e)
        cnt = from_numpy(counts, kind)
        tensors = (x, topk_idx, out_x, cnt, handle[0], handle[1], cumulative_local_expert_recv_stats)
        return out_x, cnt, handle, _event(async_, tensors), (_no_hook if hook else None)

    def _ll_handle(self, func: str, handle: Any) -> tuple[np.ndarray, np.ndarray, int, int, int]:
        if not isinstance(handle, (tuple, list)) or len(handle) != 5:
            raise arg_error(func, "handle", "the 5-tuple low_latency_dispatch returns", type(handle).__name__)
        t_max = count(func, "handle[2]", handle[2])
        hidden = count(func, "handle[3]", handle[3])
        e = count(func, "handle[4]", handle[4], 1)
        if e % self.group_size:
            raise arg_error(func, "handle[4]", f"a multiple of the number of ranks ({self.group_size})", str(e))
        e_l, slots = e // self.group_size, self.group_size * t_max
        src_info = _int_array(func, "handle[0]", handle[0], I32, (e_l, slots), "packed_recv_src_info")
        ranges = _int_array(func, "handle[1]", handle[1], I64, (e_l, self.group_size), "packed_recv_layout_range")
        return src_info, ranges, t_max, hidden, e

    def low_latency_combine(self, x: Any, topk_idx: Any, topk_weights: Any, handle: tuple, use_logfmt: bool = False,
                            zero_copy: bool = False, async_finish: bool = False, return_recv_hook: bool = False,
                            out: Any = None, combine_wait_recv_cost_stats: Any = None) -> tuple[
                                Any, EventOverlap, Callable[[], None] | None]:
        """Reduce every token's expert outputs back on its source rank, with weights (a collective;
        contract 11.6).

        x: bf16 (E_l, R * T_max, H), the experts' outputs in the packed layout of ``handle``
           (with ``zero_copy`` the rows come from :meth:`get_next_low_latency_combine_buffer` instead);
        topk_idx: int64 (T, K), topk_weights: float32 (T, K): the routing this rank dispatched.
        out: bf16 (T, H), written and returned, or None.

        ``combined_x[t] = bf16(acc)``, ``acc = +0`` then ``acc = RN32(acc + float(y_k) * w[t, k])``
        (a fused multiply-add, exact product) for k ascending over the valid slots whose owner is
        not masked, ``y_k`` the row expert ``topk_idx[t, k]`` returned for this token.  Returns
        ``(combined_x, event, hook)``.  LogFMT (``use_logfmt``) raises ``NotImplementedError``: the
        kernel's log2 / exp2 approximations have no bitwise golden.
        """
        func = "Buffer.low_latency_combine"
        self._need_ll(func)
        size, r = self.group_size, self.rank
        src_info, ranges, t_max, _, e = self._ll_handle(func, handle)
        logfmt = flag(func, "use_logfmt", use_logfmt)
        zc = flag(func, "zero_copy", zero_copy)
        async_ = flag(func, "async_finish", async_finish)
        hook = flag(func, "return_recv_hook", return_recv_hook)
        if zc and logfmt:
            raise arg_error(func, "zero_copy", "False with use_logfmt=True (an online cast cannot be zero-copy)",
                            "True")
        if async_ and hook:
            raise arg_error(func, "return_recv_hook", "False with async_finish=True", "True")
        e_l, slots = e // size, size * t_max
        xa = as_array(x, func, "x")
        if xa.dtype != BF16 or xa.ndim != 3 or not is_contiguous(xa) or xa.shape[:2] != (e_l, slots):
            raise arg_error(func, "x", f"a contiguous bfloat16 array of shape ({e_l}, {slots}, hidden)", xa)
        hidden = xa.shape[2]
        idx = check_topk_idx(func, "topk_idx", topk_idx, None, e)
        w = as_array(topk_weights, func, "topk_weights")
        if w.dtype != F32 or w.shape != idx.shape or not is_contiguous(w):
            raise arg_error(func, "topk_weights", f"a contiguous float32 array of shape {idx.shape}", w)
        t_count, k = idx.shape
        if t_count > t_max:
            raise arg_error(func, "topk_weights", f"at most num_max_dispatch_tokens_per_rank ({t_max}) rows", w)
        if combine_wait_recv_cost_stats is not None:
            _int_array(func, "combine_wait_recv_cost_stats", combine_wait_recv_cost_stats, I64, (size,),
                       "wait cycles per rank")
        out_a = None
        if out is not None:
            out_a = as_array(out, func, "out")
            if out_a.dtype != BF16 or out_a.shape != (t_count, hidden) or not is_contiguous(out_a):
                raise arg_error(func, "out", f"a contiguous bfloat16 array of shape ({t_count}, {hidden})", out_a)
            check_written(out_a, func, "out", (("x", xa), ("topk_idx", idx), ("topk_weights", w)))
        lay = self._ll_checks(func, t_max, hidden, e, k)
        if logfmt:
            # Note: LogFMT raises NotImplementedError (log2f / exp2f approximations: no bitwise golden).
            raise NotImplementedError(f"{func}: use_logfmt: not implemented: the LogFMT-10 cast uses the GPU's "
                                      "log2 / exp2 approximations, so it has no bitwise golden (contract 11.6)")
        begin, cnt = ranges >> 32, ranges & 0xFFFFFFFF
        if np.any(ranges < 0) or np.any(begin + cnt > slots):
            raise arg_error(func, "handle[1]", f"(begin << 32) | count ranges within {slots} rows", "other values")
        check_alloc(func, "topk_idx", t_count * k * hidden * 2 + t_count * hidden * 8, "the combined tokens")
        source = xa
        if zc:
            source = self._combine_buffer(func, lay, t_max, hidden, e)

        # owners send each source its tokens' rows, per local expert
        rows_to: list[list[np.ndarray]] = [[] for _ in range(size)]
        for j in range(e_l):
            for s in range(size):
                b, n = int(begin[j, s]), int(cnt[j, s])
                if n:
                    rows_to[s].append(np.stack([np.full(n, j), np.arange(b, b + n)], axis=1))
        sel = [np.concatenate(v) if v else np.zeros((0, 2), I64) for v in rows_to]
        agree = {"operation": 22, "num_max_dispatch_tokens_per_rank": t_max, "x (hidden)": hidden,
                 "handle (num_experts)": e}
        blocked, _ = self._ll_header(func, agree, np.zeros(0, I64))
        sel = [v if not blocked[s] else v[:0] for s, v in enumerate(sel)]
        for v in sel:
            toks = src_info[v[:, 0], v[:, 1]]
            if toks.size and (toks.min() < 0 or toks.max() >= t_max):
                raise arg_error(func, "handle[0]", f"source tokens in [0, {t_max}) in the layout's rows",
                                f"values in [{toks.min()}, {toks.max()}]")
        t = self._transport
        meta = t.all_to_all([np.stack([r * e_l + v[:, 0], src_info[v[:, 0], v[:, 1]].astype(I64)], axis=1)
                             for v in sel])
        data = t.all_to_all([_bytes_rows(np.ascontiguousarray(source[v[:, 0], v[:, 1]])) for v in sel])

        # gather each slot's row and run the FMA chain
        # Note: a slot without exactly one row from its owner raises (DeepEP reads a stale buffer slot).
        owner = np.where(idx >= 0, idx // e_l, -1)
        skip = (idx >= 0) & blocked[np.maximum(owner, 0)]
        row_of = np.full((e, max(t_count, 1)), -1, I64)
        offsets = np.concatenate([[0], np.cumsum([m.shape[0] for m in meta])]).astype(I64)
        for q, m in enumerate(meta):
            ge, tok = m[:, 0], m[:, 1]
            if m.shape[0] and (np.any(ge // e_l != q) or np.any(tok >= t_count) or np.any(row_of[ge, tok] >= 0)
                               or np.unique(ge * t_count + tok).size != ge.size):
                raise arg_error(func, "topk_idx", "the routing this rank dispatched with the handle's layout (one row "
                                "per selected slot)", f"unexpected rows from rank {q}")
            row_of[ge, tok] = offsets[q] + np.arange(m.shape[0])
        allrows = (np.concatenate(data).view(BF16).reshape(-1, hidden) if data and offsets[-1]
                   else np.zeros((0, hidden), BF16))
        use = (idx >= 0) & ~skip
        ti, ki = np.nonzero(use)
        at = row_of[idx[ti, ki], ti]
        if np.any(at < 0):
            j = int(np.flatnonzero(at < 0)[0])
            raise arg_error(func, "topk_idx", "slots the dispatch of this handle sent (the same routing)",
                            f"no row for token {int(ti[j])}, expert {int(idx[ti[j], ki[j]])}")
        y = np.zeros((t_count, k, hidden), BF16)
        y[ti, ki] = allrows[at]
        result = low_latency_combine_reference(y, idx, w, skip)
        self._ll_buffer_idx ^= 1
        kind = caller_kind(x, topk_idx, topk_weights)
        if out_a is not None:
            out_a[...] = result
            combined: Any = out
        else:
            combined = from_numpy(result, kind)
        tensors = (x, topk_idx, topk_weights, handle[0], handle[1], combined)
        return combined, _event(async_, tensors), (_no_hook if hook else None)

    def _combine_buffer(self, func: str, lay: _LowLatencyLayout, t_max: int, hidden: int,
                        num_experts: int) -> np.ndarray:
        """The current combine send region as bf16 (E_l, R * T_max, H) with DeepEP's message stride."""
        if lay.combine_msg_bytes % 2:
            raise arg_error(func, "hidden", "an even combine message size", str(lay.combine_msg_bytes))
        raw = self._local_bytes(func, True)
        e_l, slots = num_experts // self.group_size, self.group_size * t_max
        msg = lay.combine_msg_bytes // 2
        start = lay.combine_send_offset(self._ll_buffer_idx)
        region = raw[start:start + e_l * slots * lay.combine_msg_bytes].view(BF16)
        return region.reshape(e_l, slots, msg)[:, :, :hidden]

    def get_next_low_latency_combine_buffer(self, handle: object) -> Any:
        """The buffer the next ``low_latency_combine(..., zero_copy=True)`` reads: bf16
        (E_l, R * T_max, H) with rows ``H + H / 64`` elements apart (DeepEP's message stride),
        a view of the RDMA buffer's bytes: write the experts' outputs into it."""
        func = "Buffer.get_next_low_latency_combine_buffer"
        self._need_ll(func)
        src_info, _, t_max, hidden, e = self._ll_handle(func, handle)
        lay = _ll_layout(func, t_max, hidden, e)
        if lay.total_bytes > self.num_rdma_bytes:
            # Note: the combine buffer must lie within num_rdma_bytes (DeepEP does not check the view).
            raise arg_error(func, "handle", f"a low-latency layout within the buffer's num_rdma_bytes "
                            f"({self.num_rdma_bytes})", f"{lay.total_bytes} bytes needed")
        view = self._combine_buffer(func, lay, t_max, hidden, e)
        return from_numpy(view, caller_kind(src_info if not isinstance(handle, (tuple, list)) else handle[0]))

    # -- shrink mode ----------------------------------------------------------------------------

    def _need_mask(self, func: str) -> np.ndarray:
        self._live(func)
        if self._mask is None:
            raise arg_error(func, "enable_shrink", "a buffer constructed with enable_shrink=True and "
                            "num_rdma_bytes > 0 (shrink mode)", "no mask buffer")
        return self._mask

    def low_latency_update_mask_buffer(self, rank_to_mask: int, mask: bool = False) -> None:
        """Mask (``mask=True``) or unmask a rank in this rank's mask: the low-latency calls of this
        rank send nothing to it and take nothing from it (local, not a collective)."""
        func = "Buffer.low_latency_update_mask_buffer"
        m = self._need_mask(func)
        q = count(func, "rank_to_mask", rank_to_mask)
        if q >= self.group_size:
            raise arg_error(func, "rank_to_mask", f"a rank in [0, {self.group_size})", str(q))
        m[q] = 1 if flag(func, "mask", mask) else 0

    def low_latency_query_mask_buffer(self, mask_status: Any) -> None:
        """Write this rank's mask into ``mask_status`` (int32, R elements; 1 = masked)."""
        func = "Buffer.low_latency_query_mask_buffer"
        m = self._need_mask(func)
        a = as_array(mask_status, func, "mask_status")
        if a.dtype != I32 or a.size != self.group_size or not is_contiguous(a) or not a.flags.writeable:
            raise arg_error(func, "mask_status", f"a writeable contiguous int32 array of {self.group_size} elements", a)
        a.reshape(-1)[...] = m

    def low_latency_clean_mask_buffer(self) -> None:
        """Unmask every rank (this rank's mask)."""
        self._need_mask("Buffer.low_latency_clean_mask_buffer")[...] = 0


def _no_hook() -> None:
    """The receive hook: the data has arrived when the call returns."""
    return None


def _table_config(func: str, table: dict[int, tuple[int, int, int, int]], num_ranks: Any) -> Config:
    n = count(func, "num_ranks", num_ranks)
    if n not in table:
        raise arg_error(func, "num_ranks", f"one of {sorted(table)}", f"unsupported number of EP ranks: {n}",
                        utility=True)
    return Config(Buffer.num_sms, *table[n])


def _header(t: Any, func: str, agree: dict[str, Any], free: Sequence[int] | np.ndarray) -> np.ndarray:
    """All-gather (the settings every rank must share, this rank's other values); every rank
    raises the same argument error when the shared settings differ.  Returns (R, len(free))."""
    # Note: ranks whose calls disagree all raise here (DeepEP would hang or misread bytes).
    names = list(agree)
    cfg = np.array([int(agree[n]) for n in names], I64)
    head = np.concatenate([cfg, np.asarray(free, I64)])
    got = np.stack(t.all_gather(head))
    part = got[:, :len(names)]
    bad = np.flatnonzero((part != part[0]).any(axis=0))
    if bad.size:
        i = int(bad[0])
        raise arg_error(func, names[i], "the same value on every rank of the group (all ranks call the same "
                        "collective)", f"per rank {part[:, i].tolist()}")
    return got[:, len(names):]
