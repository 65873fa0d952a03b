"""``SymmBuffer``, ``get_symm_buffer_for_mega_moe`` and the ``_C`` size helpers, per target."""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from ..api import profiled
from ..errors import arg_error
from ..interop import caller_kind, from_numpy, to_numpy
from ..toolkit.args import align
from ..toolkit.sizes import check_alloc, size_arg
from ._group import Registry, resolve_group
from ._layout import (
    TOKEN_ALIGNMENT,
    BufferLayout,
    alloc_bytes,
    ascend_layout,
    cuda_layout,
    make_views,
    ring_limit,
    zero_bytes,
)

__all__ = [
    "SymmBuffer",
    "get_symm_buffer_for_mega_moe",
    "get_token_alignment_for_mega_moe",
    "get_ring_limit_for_mega_moe",
    "get_symm_buffer_size_for_mega_moe",
    "symm_bytes",
    "buffer_ptrs",
]

_ASCEND_MISSING = "DeepGEMM-Ascend has no {what} (it derives the ring size internally)"
_SIZE_ARGS = "num_experts, num_max_tokens_per_rank, num_topk, hidden, intermediate_hidden"
_UPSTREAM_VIEWS = ("x", "x_sf", "topk_idx", "topk_weights", "l1_acts", "l1_acts_sf", "l2_acts", "l2_acts_sf")
_ASCEND_VIEWS = ("x", "x_sf", "topk_idx", "topk_weights", "shared_l1_acts", "shared_l1_acts_sf", "shared_l2_acts",
                 "shared_l2_acts_sf", "l1_acts", "l1_acts_sf", "l2_acts", "l2_acts_sf", "expert_recv_count")


def _str(func: str, arg: str, v: Any) -> str:
    if not isinstance(v, str):
        raise arg_error(func, arg, "a string", repr(v))
    return v


# ----------------------------------------------------------------------------------------------
# _C helpers
# ----------------------------------------------------------------------------------------------

def _get_token_alignment_for_mega_moe() -> int:
    """LCM of the candidate BLOCK_M values {8, 16, 32, 64, 96, 128, 192}: 384."""
    return TOKEN_ALIGNMENT


def _get_ring_limit_for_mega_moe(num_max_tokens_per_rank: int, num_experts_per_rank: int, num_topk: int,
                                 num_ranks: int, /) -> tuple[int, int]:
    """(min, max) ring tokens: min = T R; max = T R if E_l == 1 else min(T R E_l, align(T R K + 383 E_l, 384)).

    T (``num_max_tokens_per_rank``) must be a multiple of 384.
    """
    func = "get_ring_limit_for_mega_moe"
    return ring_limit(func, size_arg(func, "num_max_tokens_per_rank", num_max_tokens_per_rank, 1),
                      size_arg(func, "num_experts_per_rank", num_experts_per_rank, 1),
                      size_arg(func, "num_topk", num_topk, 1), size_arg(func, "num_ranks", num_ranks, 1))


def _slicer(layout: BufferLayout, names: tuple[str, ...], func: str) -> Callable[[Any], tuple[Any, ...]]:
    def slice_input_buffers(buffer: Any) -> tuple[Any, ...]:
        kind = caller_kind(buffer)
        b = to_numpy(buffer, func, "buffer")
        if not isinstance(b, np.ndarray) or b.dtype != np.int8 or b.ndim != 1 or not b.flags.c_contiguous:
            raise arg_error(func, "buffer", "a contiguous 1-D int8 buffer", b)
        if b.nbytes < layout.num_bytes:
            raise arg_error(func, "buffer", f"at least {layout.num_bytes} bytes", f"{b.nbytes} bytes")
        views = make_views(b, layout)
        return tuple(from_numpy(views[n], kind) for n in names)

    return slice_input_buffers


def _get_symm_buffer_size_cuda(num_ranks: int, num_experts: int, num_max_tokens_per_rank: int, num_topk: int,
                               hidden: int, intermediate_hidden: int, mma_type: str, activation: str,
                               num_ring_tokens: int, /) -> tuple[int, Callable[[Any], tuple[Any, ...]]]:
    """(num_bytes, slicer): the slicer maps an int8 buffer to (x, x_sf, topk_idx, topk_weights,
    l1_acts, l1_acts_sf, l2_acts, l2_acts_sf) (x_sf and the SF views are None for bf16xbf16)."""
    func = "get_symm_buffer_size_for_mega_moe"
    layout = cuda_layout(func, size_arg(func, "num_ranks", num_ranks, 1),
                         size_arg(func, "num_experts", num_experts, 1),
                         size_arg(func, "num_max_tokens_per_rank", num_max_tokens_per_rank, 1),
                         size_arg(func, "num_topk", num_topk, 1), size_arg(func, "hidden", hidden, 1),
                         size_arg(func, "intermediate_hidden", intermediate_hidden, 1),
                         _str(func, "mma_type", mma_type),
                         _str(func, "activation", activation), size_arg(func, "num_ring_tokens", num_ring_tokens, 0))
    return layout.num_bytes, _slicer(layout, _UPSTREAM_VIEWS, func)


def _get_symm_buffer_size_ascend(num_ranks: int, num_experts: int, num_max_tokens_per_rank: int, num_topk: int,
                                 hidden: int, intermediate_hidden: int, mma_type: str, activation: str,
                                 num_shared_experts: int = 0) -> tuple[int, Callable[[Any], tuple[Any, ...]]]:
    """(num_bytes, slicer) with num_bytes a multiple of 2 MiB; the slicer maps an int8 buffer to
    (x, x_sf, topk_idx, topk_weights, shared_l1_acts, shared_l1_acts_sf, shared_l2_acts,
    shared_l2_acts_sf, l1_acts, l1_acts_sf, l2_acts, l2_acts_sf, expert_recv_count)."""
    func = "get_symm_buffer_size_for_mega_moe"
    layout = ascend_layout(func, size_arg(func, "num_ranks", num_ranks, None),
                           size_arg(func, "num_experts", num_experts, None),
                           size_arg(func, "num_max_tokens_per_rank", num_max_tokens_per_rank, None),
                           size_arg(func, "num_topk", num_topk, None), size_arg(func, "hidden", hidden, None),
                           size_arg(func, "intermediate_hidden", intermediate_hidden, None),
                           _str(func, "mma_type", mma_type), _str(func, "activation", activation),
                           size_arg(func, "num_shared_experts", num_shared_experts, None))
    return layout.num_bytes, _slicer(layout, _ASCEND_VIEWS, func)


# ----------------------------------------------------------------------------------------------
# the symmetric bytes (SymmBuffer here, DeepGEMM-Ascend's _C.SymmBuffer lease)
# ----------------------------------------------------------------------------------------------

def symm_bytes(num_bytes: int, reuse: np.ndarray | None = None) -> np.ndarray:
    """A zero-filled int8 symmetric buffer of ``num_bytes`` (an anonymous map above 64 MiB: pages
    on first touch): ``reuse``, a buffer of an earlier construction holding at least ``num_bytes``,
    zero-filled again (its mapped pages given back), else a new one.  The caller refuses a size
    that cannot be mapped first (``toolkit.sizes.check_alloc(..., lazy=True)``, with its own
    message)."""
    if reuse is not None and reuse.nbytes >= num_bytes:
        zero_bytes(reuse)
        return reuse
    return alloc_bytes(num_bytes)


def buffer_ptrs(buffers: Iterable[np.ndarray | None]) -> list[int]:
    """Every rank's buffer address in this process (0 for a rank without a buffer yet), as a
    symmetric-memory handle's ``buffer_ptrs`` lists them."""
    return [0 if b is None else int(b.__array_interface__["data"][0]) for b in buffers]


# ----------------------------------------------------------------------------------------------
# SymmBuffer
# ----------------------------------------------------------------------------------------------

class _Handle:
    """The symmetric-memory handle: ``buffer_ptrs`` lists every rank's buffer address (0 for a rank
    that has no buffer yet); DeepGEMM-Ascend's handle also carries ``buffer``."""

    def __init__(self, group: Registry, buffer: np.ndarray) -> None:
        self._group = group
        self.buffer = buffer

    @property
    def buffer_ptrs(self) -> list[int]:
        return buffer_ptrs(getattr(self._group.buffer(r), "buffer", None) for r in range(self._group.size()))


class _SymmBufferType(type):
    """Makes ``SymmBuffer(...)`` build the active target's buffer and report its signature."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls is SymmBuffer:
            return _SYMM_BUFFER(*args, **kwargs)
        return super().__call__(*args, **kwargs)

    @property
    def __signature__(cls) -> inspect.Signature:
        if cls is SymmBuffer:
            return _SYMM_BUFFER.__signature__
        sig = inspect.signature(cls.__init__)  # type: ignore[misc]
        return sig.replace(parameters=list(sig.parameters.values())[1:])


class SymmBuffer(metaclass=_SymmBufferType):
    """One rank's symmetric mega-MoE buffer: a zero-filled int8 ``buffer`` and typed views into it.

    DeepGEMM: ``SymmBuffer(group, num_experts, num_max_tokens_per_rank, num_topk, hidden,
    intermediate_hidden, num_ring_tokens, mma_type='fp8xfp4', activation='swiglu')`` with views
    ``x`` (T, H) e4m3 / bf16, ``x_sf`` (T, H / 128) int32 (K-major packed per-32 UE8M0; None for
    bf16xbf16), ``topk_idx`` (T, K) int64, ``topk_weights`` (T, K) float32, and the internal ring
    scratch ``l1_acts``, ``l1_acts_sf``, ``l2_acts``, ``l2_acts_sf``.

    DeepGEMM-Ascend: ``SymmBuffer(group, num_experts, num_max_tokens_per_rank, num_topk, hidden,
    intermediate_hidden, num_shared_experts=0, mma_type='fp8xfp4', activation='swiglu', base=None)``
    with ``x`` (T, H) e4m3, ``x_sf`` (T, H / 64) int16 UE8M0 pairs, ``topk_idx``, ``topk_weights``,
    the shared-expert views, the ring scratch, the ``expert_recv_count`` (R, E_l) int32 property and
    ``num_bytes``.

    ``group`` is an :class:`GroupRegistry` rank view, a ``torch.distributed`` process group (this
    process's rank; one rank per process) or any one-rank group.  Buffers above 64 MiB
    are anonymous memory maps: untouched pages cost nothing.
    """

    group: Any
    buffer: np.ndarray | None
    handle: Any
    num_experts: int
    num_max_tokens_per_rank: int
    num_topk: int
    hidden: int
    intermediate_hidden: int
    _registry: Registry
    _rank: int
    _layout: BufferLayout
    _mma: str
    _target: str

    def _setup(self, registry: Registry, rank: int, layout: BufferLayout, mma: str, target: str,
               buffer: np.ndarray | None = None, handle: Any = None) -> None:
        self._registry, self._rank, self._layout, self._mma, self._target = registry, rank, layout, mma, target
        if buffer is None:
            check_alloc("SymmBuffer", _SIZE_ARGS, layout.num_bytes, f"the symmetric buffer ({layout.num_bytes} bytes, "
                        "pages mapped on first touch)", lazy=True)
            buffer = symm_bytes(layout.num_bytes)  # zero-filled, as DeepGEMM's buffer.zero_()
            handle = _Handle(registry, buffer)
        # Note: the buffer and its views are NumPy arrays (ml_dtypes dtypes), not CUDA / NPU tensors;
        # buffers above 64 MiB are anonymous memory maps (zero pages until touched).
        self.buffer = buffer
        self.handle = handle
        registry.register_buffer(rank, self)
        for name, view in make_views(buffer, layout).items():
            setattr(self, "_expert_recv_count" if name == "expert_recv_count" else name, view)

    @property
    def _config(self) -> tuple[Any, ...]:
        return (self._target, self._mma, self._registry.size(), self.num_experts, self.num_max_tokens_per_rank,
                self.num_topk, self.hidden, self.intermediate_hidden, getattr(self, "num_shared_experts", 0))

    def __repr__(self) -> str:
        return (f"SymmBuffer(rank {self._rank} of {self._registry.size()}, {self._mma}, experts={self.num_experts}, "
                f"tokens={self.num_max_tokens_per_rank}, topk={self.num_topk}, hidden={self.hidden}, "
                f"intermediate={self.intermediate_hidden})")


class _CudaSymmBuffer(SymmBuffer):
    __doc__ = SymmBuffer.__doc__

    def __init__(self, group: Any, num_experts: int, num_max_tokens_per_rank: int, num_topk: int, hidden: int,
                 intermediate_hidden: int, num_ring_tokens: int, mma_type: str = "fp8xfp4",
                 activation: str = "swiglu") -> None:
        func = "SymmBuffer"
        if activation != "swiglu":
            raise arg_error(func, "activation", "'swiglu' (Only `swiglu` activation is supported)", repr(activation),
                            utility=True)
        self.group = group
        self.num_experts = num_experts
        self.num_max_tokens_per_rank = num_max_tokens_per_rank
        self.num_topk = num_topk
        self.hidden = hidden
        self.intermediate_hidden = intermediate_hidden
        self.num_ring_tokens = num_ring_tokens
        registry, rank = resolve_group(func, group)
        layout = cuda_layout(func, registry.size(), size_arg(func, "num_experts", num_experts, 1),
                             size_arg(func, "num_max_tokens_per_rank", num_max_tokens_per_rank, 1),
                             size_arg(func, "num_topk", num_topk, 1), size_arg(func, "hidden", hidden, 1),
                             size_arg(func, "intermediate_hidden", intermediate_hidden, 1),
                             _str(func, "mma_type", mma_type), activation,
                             size_arg(func, "num_ring_tokens", num_ring_tokens, 0))
        self._setup(registry, rank, layout, mma_type, "deepgemm")

    def destroy(self) -> None:
        """Drop the handle, the buffer, the group and the x / x_sf views (DeepGEMM's destroy)."""
        self.handle = None
        self.buffer = None
        self.group = None
        self.x = None
        self.x_sf = None


class _AscendSymmBuffer(SymmBuffer):
    __doc__ = SymmBuffer.__doc__

    def __init__(self, group: Any, num_experts: int, num_max_tokens_per_rank: int, num_topk: int, hidden: int,
                 intermediate_hidden: int, num_shared_experts: int = 0, mma_type: str = "fp8xfp4",
                 activation: str = "swiglu", base: Any = None) -> None:
        func = "SymmBuffer"
        if mma_type != "fp8xfp4":
            raise arg_error(func, "mma_type", "'fp8xfp4' (Ascend MegaMoE currently supports only fp8xfp4)",
                            repr(mma_type), utility=True)
        if activation != "swiglu":
            raise arg_error(func, "activation", "'swiglu' (Ascend MegaMoE currently supports only swiglu)",
                            repr(activation), utility=True)
        self.group = group
        self.num_experts = num_experts
        self.num_max_tokens_per_rank = num_max_tokens_per_rank
        self.num_topk = num_topk
        self.hidden = hidden
        self.intermediate_hidden = intermediate_hidden
        self.num_shared_experts = num_shared_experts
        self.mma_type = mma_type
        self.activation = activation
        registry, rank = resolve_group(func, group)
        layout = ascend_layout(func, registry.size(), size_arg(func, "num_experts", num_experts, None),
                               size_arg(func, "num_max_tokens_per_rank", num_max_tokens_per_rank, None),
                               size_arg(func, "num_topk", num_topk, None), size_arg(func, "hidden", hidden, None),
                               size_arg(func, "intermediate_hidden", intermediate_hidden, None), mma_type, activation,
                               size_arg(func, "num_shared_experts", num_shared_experts, None))
        if base is None:
            self._setup(registry, rank, layout, mma_type, "deepgemm-ascend")
            return
        if (not isinstance(base, _AscendSymmBuffer) or base.buffer is None or base.handle is None
                or not _same_group(base.group, group)):
            raise arg_error(func, "base", "a live SymmBuffer on the same group (Cannot reuse an invalid symmetric "
                            "buffer)", repr(base), utility=True)
        if layout.num_bytes > base.buffer.nbytes:
            raise arg_error(func, "base", f"a buffer of at least {layout.num_bytes} bytes",
                            f"{base.buffer.nbytes} bytes", utility=True)
        # Shared scratch: no zeroing (the inputs are refilled before every call).
        self._setup(registry, rank, layout, mma_type, "deepgemm-ascend", base.buffer, base.handle)

    @property
    def expert_recv_count(self) -> Any:
        """(R, E_l) int32: routes each source rank sent to each local expert in the last call."""
        return self._expert_recv_count

    @property
    def num_bytes(self) -> int:
        assert self.buffer is not None
        return int(self.buffer.nbytes)

    def destroy(self) -> None:
        """Drop this owner's references (DeepGEMM-Ascend's destroy; memory is freed with the last view)."""
        self.handle = None
        self.buffer = None
        self.group = None
        for name in _ASCEND_VIEWS[:-1]:
            setattr(self, name, None)
        self._expert_recv_count = None


def _same_group(a: Any, b: Any) -> bool:
    # Note: DeepGEMM-Ascend requires ``base.group is group``; rank views of one GroupRegistry are
    # fresh objects, so equal views (same group, same rank) count as the same group.
    return a is b or (a is not None and a == b)


_SYMM_BUFFER = profiled("SymmBuffer", None, deepgemm=_CudaSymmBuffer, deepgemm_ascend=_AscendSymmBuffer)


# ----------------------------------------------------------------------------------------------
# get_symm_buffer_for_mega_moe (DeepGEMM only)
# ----------------------------------------------------------------------------------------------

def _get_symm_buffer_for_mega_moe(group: Any, num_experts: int, num_max_tokens_per_rank: int, num_topk: int,
                                  hidden: int, intermediate_hidden: int, use_fp8_dispatch: bool | None = None,
                                  mma_type: str = "fp8xfp4", activation: str = "swiglu") -> SymmBuffer:
    """A SymmBuffer with T = align(num_max_tokens_per_rank, 384) and DeepGEMM's ring-size heuristic:
    786432 ring tokens when T >= 6144, else 1824768, clamped into get_ring_limit_for_mega_moe."""
    func = "get_symm_buffer_for_mega_moe"
    registry, _ = resolve_group(func, group)
    size = registry.size()
    t = size_arg(func, "num_max_tokens_per_rank", num_max_tokens_per_rank, 1)
    t = align(t, TOKEN_ALIGNMENT)
    e = size_arg(func, "num_experts", num_experts, 1)
    k = size_arg(func, "num_topk", num_topk, 1)
    lo, hi = ring_limit(func, t, e // size, k, size)
    if t >= 6144:
        ring = align(768 * 1024, TOKEN_ALIGNMENT)
    else:
        ring = ring_limit(func, align(4096, TOKEN_ALIGNMENT), 432 // 72, 6, 72)[1]
    ring = min(max(ring, lo), hi)
    if use_fp8_dispatch is not None:
        if use_fp8_dispatch != (str(mma_type).split("x")[0] == "fp8"):
            raise arg_error(func, "use_fp8_dispatch", f"{str(mma_type).split('x')[0] == 'fp8'} (consistent with "
                            f"mma_type {mma_type!r})", repr(use_fp8_dispatch), utility=True)
        warnings.warn("`use_fp8_dispatch` will be deprecated in the future, please use `mma_type`",
                      DeprecationWarning, stacklevel=3)
    return _CudaSymmBuffer(group, e, t, k, hidden, intermediate_hidden, ring, mma_type=mma_type,
                           activation=activation)


_C_ONLY_UPSTREAM = {"deepgemm-ascend": "DeepGEMM-Ascend derives the ring size internally"}

get_symm_buffer_for_mega_moe = profiled(
    "get_symm_buffer_for_mega_moe",
    {"deepgemm-ascend": _ASCEND_MISSING.format(what="get_symm_buffer_for_mega_moe; construct SymmBuffer directly")},
    deepgemm=_get_symm_buffer_for_mega_moe,
)
get_token_alignment_for_mega_moe = profiled("get_token_alignment_for_mega_moe", _C_ONLY_UPSTREAM,
                                            deepgemm=_get_token_alignment_for_mega_moe)
get_ring_limit_for_mega_moe = profiled("get_ring_limit_for_mega_moe", _C_ONLY_UPSTREAM,
                                       deepgemm=_get_ring_limit_for_mega_moe)
get_symm_buffer_size_for_mega_moe = profiled("get_symm_buffer_size_for_mega_moe", None,
                                             deepgemm=_get_symm_buffer_size_cuda,
                                             deepgemm_ascend=_get_symm_buffer_size_ascend)
