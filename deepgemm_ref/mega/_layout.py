"""Symmetric-buffer layouts of both targets, byte for byte, and lazy byte buffers.

DeepGEMM (``csrc/apis/mega.hpp``, ``layout/mega_moe.cuh``), with R ranks, E experts,
``E_l = E / R``, T tokens per rank, K top-k, H hidden, I intermediate, ``N_ring`` ring tokens and
``elem`` = 1 (fp8xfp4) or 2 (bf16xbf16)::

    workspace   align(32 + 16 E + 8 E_l + 16 (N_ring / 8) + 4 E_l R (R T) + 12 P, 16),
                P = align(R T min(K, E_l) + 191 E_l, 384)
    x           T * H * elem                  (T, H) e4m3 / bf16
    x_sf        T * H / 32          (fp8)     (T, H / 128) int32, K-major packed per-32 UE8M0
    topk_idx    T * K * 8                     (T, K) int64
    topk_weights T * K * 4                    (T, K) float32
    l1 tokens   N_ring * H * elem             (N_ring, H)
    l1 SF       N_sf * H / 32       (fp8)     (N_sf, H / 128) int32, strides (1, N_sf)
    l1 weights  N_ring * 4
    l2 tokens   N_ring * I * elem             (N_ring, I)
    l2 SF       N_sf * I / 32       (fp8)     (N_sf, I / 128) int32, strides (1, N_sf)
    combine     K * T * H * 2                 -> num_bytes = end of the combine buffer

with ``N_sf = max over BLOCK_M in {8, ..., 192} of (N_ring / BLOCK_M) * align(BLOCK_M, 128) = 16 N_ring``.

DeepGEMM-Ascend (``layout/mega_moe.hpp``, ``csrc/apis/mega_moe.hpp``): the ``Workspace``
struct's fields in declaration order, each aligned as the struct aligns it (512-byte GM
alignment for most, 128-byte L2 sectors for counters), total rounded up to 2 MiB.  Ring rows
``256 * min(Mb, W * 32)`` with ``Mb = ceil(R T K / 256) + E_l`` and ``W = 4`` if ``H / 256 <= 16``
else 1.
"""

from __future__ import annotations

import mmap
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import arg_error
from ..toolkit import sizes
from ..toolkit.args import BF16, E4M3, align, ceil_div

__all__ = [
    "TOKEN_ALIGNMENT",
    "CANDIDATE_BLOCK_M",
    "BLOCK_N",
    "ViewSpec",
    "BufferLayout",
    "BufferView",
    "ring_limit",
    "cuda_layout",
    "ascend_layout",
    "alloc_bytes",
    "make_views",
    "LAZY_THRESHOLD",
]

TOKEN_ALIGNMENT = 384  # LCM of the candidate BLOCK_M values
CANDIDATE_BLOCK_M = (8, 16, 32, 64, 96, 128, 192)
BLOCK_N = 256  # DeepGEMM-Ascend's mega-MoE block (deep_gemm.mega.BLOCK_N)
_ASCEND_CORES = 32
_ASCEND_GM_ALIGN = 512
_ASCEND_SECTOR = 128
_ASCEND_COUNT_ARRIVAL_BIT = 1 << 24
#: Byte buffers larger than this are anonymous memory maps: the OS supplies zero pages on first
#: touch, so a multi-GiB symmetric buffer costs only what is written.
LAZY_THRESHOLD = 64 << 20



@dataclass(frozen=True)
class ViewSpec:
    """A typed view into a byte buffer: offset in bytes, shape, dtype, strides in elements."""

    offset: int
    shape: tuple[int, ...]
    dtype: np.dtype
    strides: tuple[int, ...] | None = None  # None: row-major

    @property
    def nbytes(self) -> int:
        return sizes.nbytes(self.shape, self.dtype.itemsize)


@dataclass(frozen=True)
class BufferLayout:
    """A target's buffer: total size and the named views (None where the target has none)."""

    num_bytes: int
    views: dict[str, ViewSpec | None]
    num_ring_tokens: int


# ----------------------------------------------------------------------------------------------
# DeepGEMM
# ----------------------------------------------------------------------------------------------

def _wave_pool_tokens(func: str, num_ranks: int, num_topk: int, num_max_tokens_per_rank: int,
                      num_experts_per_wave: int, block_m: int) -> int:
    if num_max_tokens_per_rank % block_m:
        raise arg_error(func, "num_max_tokens_per_rank", f"a multiple of {block_m} (the mega-MoE token alignment; "
                        "get_symm_buffer_for_mega_moe aligns it up)", repr(num_max_tokens_per_rank))
    total = num_max_tokens_per_rank * num_ranks
    if num_experts_per_wave == 1:
        return total
    return min(total * num_experts_per_wave,
               align(total * num_topk + num_experts_per_wave * (block_m - 1), block_m))


def ring_limit(func: str, num_max_tokens_per_rank: int, num_experts_per_rank: int, num_topk: int,
               num_ranks: int) -> tuple[int, int]:
    """(min, max) ring tokens."""
    return (_wave_pool_tokens(func, num_ranks, num_topk, num_max_tokens_per_rank, 1, TOKEN_ALIGNMENT),
            _wave_pool_tokens(func, num_ranks, num_topk, num_max_tokens_per_rank, num_experts_per_rank,
                              TOKEN_ALIGNMENT))


def cuda_layout(func: str, num_ranks: int, num_experts: int, num_max_tokens_per_rank: int, num_topk: int,
                hidden: int, intermediate_hidden: int, mma_type: str, activation: str,
                num_ring_tokens: int) -> BufferLayout:
    """DeepGEMM's ``get_symm_buffer_size_for_mega_moe`` (checks in its order, then the layout)."""
    R, E, T, K, H, I, N = (num_ranks, num_experts, num_max_tokens_per_rank, num_topk, hidden,
                           intermediate_hidden, num_ring_tokens)
    if R <= 0 or E % R:
        raise arg_error(func, "num_experts", f"a multiple of the rank count {R}", repr(E))
    if activation != "swiglu":
        raise arg_error(func, "activation", "'swiglu'", repr(activation))
    E_l = E // R
    lo, hi = ring_limit(func, T, E_l, K, R)
    if N % TOKEN_ALIGNMENT:
        raise arg_error(func, "num_ring_tokens", f"a multiple of {TOKEN_ALIGNMENT}", repr(N))
    if not lo <= N <= hi:
        raise arg_error(func, "num_ring_tokens", f"a value in [{lo}, {hi}] (get_ring_limit_for_mega_moe)", repr(N))
    if mma_type not in ("fp8xfp4", "bf16xbf16"):
        raise arg_error(func, "mma_type", "'fp8xfp4' or 'bf16xbf16'", repr(mma_type))
    with_sf = mma_type == "fp8xfp4"
    elem = 1 if with_sf else 2
    for what, nbytes in (("hidden * element size", H * elem), ("hidden * 2 (bf16 combine rows)", H * 2),
                         ("intermediate_hidden * element size", I * elem),
                         ("hidden / 32 (SF bytes per token)", H // 32 if with_sf else 0),
                         ("intermediate_hidden / 32 (SF bytes per token)", I // 32 if with_sf else 0)):
        if nbytes % 16:
            arg = "intermediate_hidden" if "intermediate" in what else "hidden"
            raise arg_error(func, arg, f"{what} = {nbytes} bytes to be a multiple of 16 (TMA alignment; "
                            "fp8xfp4 needs multiples of 512)", repr(H if arg == "hidden" else I))
    if H <= 0 or I <= 0 or K <= 0 or T <= 0:
        raise arg_error(func, "hidden", "positive hidden, intermediate_hidden, num_topk, num_max_tokens_per_rank",
                        repr((H, I, K, T)))
    pool = align(R * T * min(K, E_l) + E_l * (max(CANDIDATE_BLOCK_M) - 1), TOKEN_ALIGNMENT)
    ring_blocks = N // min(CANDIDATE_BLOCK_M)
    workspace = align(32 + E * 16 + E_l * 8 + 4 * ring_blocks * 4 + E_l * R * (R * T) * 4 + pool * 12, 16)
    n_sf = max((N // bm) * align(bm, 128) for bm in CANDIDATE_BLOCK_M)
    if with_sf and (H % 128 or I % 128):
        arg = "hidden" if H % 128 else "intermediate_hidden"
        raise arg_error(func, arg, "a multiple of 128 for fp8xfp4", repr(H if arg == "hidden" else I))
    tok_dt = E4M3 if with_sf else BF16
    i32 = np.dtype(np.int32)
    off = workspace
    views: dict[str, ViewSpec | None] = {}
    views["x"] = ViewSpec(off, (T, H), tok_dt)
    off += T * H * elem
    if with_sf:
        views["x_sf"] = ViewSpec(off, (T, H // 128), i32)
        off += T * H // 32
    else:
        views["x_sf"] = None
    views["topk_idx"] = ViewSpec(off, (T, K), np.dtype(np.int64))
    off += T * K * 8
    views["topk_weights"] = ViewSpec(off, (T, K), np.dtype(np.float32))
    off += T * K * 4
    views["l1_acts"] = ViewSpec(off, (N, H), tok_dt)
    off += N * H * elem
    if with_sf:
        views["l1_acts_sf"] = ViewSpec(off, (n_sf, H // 128), i32, (1, n_sf))
        off += n_sf * H // 32
    else:
        views["l1_acts_sf"] = None
    off += N * 4  # l1 top-k weights
    views["l2_acts"] = ViewSpec(off, (N, I), tok_dt)
    off += N * I * elem
    if with_sf:
        views["l2_acts_sf"] = ViewSpec(off, (n_sf, I // 128), i32, (1, n_sf))
        off += n_sf * I // 32
    else:
        views["l2_acts_sf"] = None
    off += K * T * H * 2  # combine buffer
    return BufferLayout(off, views, N)


# ----------------------------------------------------------------------------------------------
# DeepGEMM-Ascend
# ----------------------------------------------------------------------------------------------

class _Cursor:
    """The ``next_offset`` walk of DeepGEMM-Ascend's ``Workspace`` (``Buffer<T, stride>`` fields)."""

    def __init__(self) -> None:
        self.next = 0

    def take(self, num_elements: int, stride: int, alignment: int | None = None) -> int:
        off = align(self.next, alignment if alignment is not None else stride)
        self.next = off + num_elements * stride
        return off

    def fp8_buffer(self, rows: int, cols: int) -> tuple[int, int]:
        data = self.take(rows * cols, 1, _ASCEND_GM_ALIGN)
        sf = self.take(rows * ceil_div(cols, 64), 2, _ASCEND_GM_ALIGN)
        return data, sf


def ascend_layout(func: str, num_ranks: int, num_experts: int, num_max_tokens_per_rank: int, num_topk: int,
                  hidden: int, intermediate_hidden: int, mma_type: str, activation: str,
                  num_shared_experts: int) -> BufferLayout:
    """DeepGEMM-Ascend's ``get_symm_buffer_size_for_mega_moe`` (``get_workspace`` checks, then the layout)."""
    R, E, T, K, H, I, S = (num_ranks, num_experts, num_max_tokens_per_rank, num_topk, hidden,
                           intermediate_hidden, num_shared_experts)
    if mma_type != "fp8xfp4":
        raise arg_error(func, "mma_type", "'fp8xfp4' (the only DeepGEMM-Ascend mega-MoE type)", repr(mma_type))
    if activation != "swiglu":
        raise arg_error(func, "activation", "'swiglu'", repr(activation))
    if not 0 < R < 256:
        raise arg_error(func, "num_ranks", "0 < num_ranks < 256", repr(R))
    if not (E > 0 and E % R == 0):
        raise arg_error(func, "num_experts", f"a positive multiple of the rank count {R}", repr(E))
    if T <= 0:
        raise arg_error(func, "num_max_tokens_per_rank", "a positive count", repr(T))
    if not 0 < K <= 32:
        raise arg_error(func, "num_topk", "0 < num_topk <= 32", repr(K))
    if not 0 <= S <= 2:
        raise arg_error(func, "num_shared_experts", "0, 1 or 2", repr(S))
    if not (H > 0 and H % BLOCK_N == 0):
        raise arg_error(func, "hidden", f"a positive multiple of {BLOCK_N}", repr(H))
    if not (I >= 512 and I % BLOCK_N == 0):
        raise arg_error(func, "intermediate_hidden", f"at least 512 and a multiple of {BLOCK_N}", repr(I))
    if R * T * K >= _ASCEND_COUNT_ARRIVAL_BIT:
        raise arg_error(func, "num_max_tokens_per_rank", "num_ranks * num_max_tokens_per_rank * num_topk < 2^24",
                        repr(R * T * K))
    E_l = E // R
    SI = S * I
    num_src_indices = E * T * K
    padded_shared_rows = align(T, 256)
    max_m_blocks = ceil_div(R * T * K, 256) + E_l
    max_shared_m_blocks = ceil_div(T, 256) if S > 0 else 0
    counters_per_stage = max_shared_m_blocks + max_m_blocks
    full_pool_rows = max_m_blocks * 256
    windows = 4 if H // BLOCK_N <= _ASCEND_CORES // 2 else 1
    ring_blocks = min(max_m_blocks, windows * _ASCEND_CORES)
    ring_rows = ring_blocks * 256
    c = _Cursor()
    c.take(3, 4, _ASCEND_GM_ALIGN)  # grid sync counters
    c.take(2, 16, _ASCEND_GM_ALIGN)  # rank barriers {uint64 epoch; int32 signals[2]}
    c.take(_ASCEND_CORES * E, 4, _ASCEND_GM_ALIGN)  # worker expert counts
    c.take(E, 4)  # total expert counts
    c.take(R, _ASCEND_SECTOR)  # combine-ready prefixes
    recv_count = c.take(E, 4)
    c.take(E_l, _ASCEND_GM_ALIGN)  # expert receive-count sums
    c.take(1, 4, _ASCEND_SECTOR)  # M-block certificate
    c.take(num_src_indices, 8, _ASCEND_GM_ALIGN)  # source token metadata
    c.take(num_src_indices, 4, _ASCEND_GM_ALIGN)  # staged token/top-k indices
    x_off, x_sf_off = c.fp8_buffer(T, H)
    idx_off = c.take(T * K, 8, _ASCEND_GM_ALIGN)
    w_off = c.take(T * K, 4, _ASCEND_GM_ALIGN)
    c.take(4 * counters_per_stage, _ASCEND_SECTOR)  # progress blocks
    c.take(_ASCEND_CORES, _ASCEND_SECTOR)  # issued GEMMs
    c.take(_ASCEND_CORES, _ASCEND_SECTOR)  # metadata ready
    l1_off, l1_sf_off = c.fp8_buffer(ring_rows, H)
    c.take(full_pool_rows, 4, _ASCEND_GM_ALIGN)  # routed top-k weights
    c.take(full_pool_rows, 4, _ASCEND_GM_ALIGN)  # routed source metadata
    l2_off, l2_sf_off = c.fp8_buffer(ring_rows, I)
    c.take(ring_rows * H, 2, _ASCEND_GM_ALIGN)  # routed bf16 output ring
    c.take((K + (S > 0)) * T * H, 2, _ASCEND_GM_ALIGN)  # combine input
    sh_off, sh_sf_off = c.fp8_buffer(padded_shared_rows if S > 0 else 0, SI)
    c.take(T * K, 4, _ASCEND_GM_ALIGN)  # route M-blocks
    num_bytes = align(c.next, 2 << 20)
    i16 = np.dtype(np.int16)
    views: dict[str, ViewSpec | None] = {
        "x": ViewSpec(x_off, (T, H), E4M3),
        "x_sf": ViewSpec(x_sf_off, (T, H // 64), i16),
        "topk_idx": ViewSpec(idx_off, (T, K), np.dtype(np.int64)),
        "topk_weights": ViewSpec(w_off, (T, K), np.dtype(np.float32)),
        "shared_l1_acts": ViewSpec(x_off, (T, H), E4M3),
        "shared_l1_acts_sf": ViewSpec(x_sf_off, (T, H // 64), i16) if S > 0 else None,
        "shared_l2_acts": ViewSpec(sh_off, (T, SI), E4M3) if S > 0 else None,
        "shared_l2_acts_sf": ViewSpec(sh_sf_off, (padded_shared_rows * (SI // 64),), i16) if S > 0 else None,
        "l1_acts": ViewSpec(l1_off, (ring_rows, H), E4M3),
        "l1_acts_sf": ViewSpec(l1_sf_off, (ring_rows, H // 64), i16),
        "l2_acts": ViewSpec(l2_off, (ring_rows, I), E4M3),
        "l2_acts_sf": ViewSpec(l2_sf_off, (ring_rows * (I // 64),), i16),
        "expert_recv_count": ViewSpec(recv_count, (R, E_l), np.dtype(np.int32)),
    }
    return BufferLayout(num_bytes, views, ring_rows)


# ----------------------------------------------------------------------------------------------
# byte buffers and views
# ----------------------------------------------------------------------------------------------

# MAP_NORESERVE (Linux 0x4000) lets a large anonymous map exceed the overcommit heuristic; Python
# exposes no constant for it before 3.13.
_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000 if sys.platform.startswith("linux") else 0)


def alloc_bytes(num_bytes: int) -> np.ndarray:
    """A zero-filled int8 buffer; above :data:`LAZY_THRESHOLD` an anonymous map (pages on first touch)."""
    if num_bytes <= LAZY_THRESHOLD or not hasattr(mmap, "MAP_ANONYMOUS"):
        return np.zeros(num_bytes, np.int8)
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE
    mm = mmap.mmap(-1, num_bytes, flags=flags)
    return np.frombuffer(mm, dtype=np.int8)  # writable; the array keeps the map alive


def zero_bytes(buffer: np.ndarray) -> None:
    """Zero a buffer from :func:`alloc_bytes`, giving mapped pages back to the OS."""
    base = buffer.base
    if isinstance(base, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED"):
        base.madvise(mmap.MADV_DONTNEED)  # private anonymous pages read back as zeros
    else:
        buffer[...] = 0


class BufferView(np.ndarray):
    """A NumPy view into a symmetric buffer that also takes torch-style writes.

    DeepGEMM's scripts fill the buffer with ``buffer.x[:n].copy_(x)``; here ``copy_`` (and item
    assignment) accept torch CPU tensors as well as arrays, converted without rounding (the
    dtypes must match as DeepGEMM's ``copy_`` would cast; a bf16 / float8 tensor keeps its bits).
    Arithmetic on a view gives plain ``numpy.ndarray`` results.
    """

    def copy_(self, src: Any) -> BufferView:
        """``self[...] = src`` (a torch tensor or an array); returns ``self`` like torch."""
        self[...] = src
        return self

    def zero_(self) -> BufferView:
        """Zero the view in place; returns ``self``."""
        np.ndarray.__setitem__(self, Ellipsis, 0)
        return self

    def __setitem__(self, key: Any, value: Any) -> None:
        if type(value).__module__.startswith("torch"):
            from ..interop import to_numpy

            value = to_numpy(value, "SymmBuffer", "value")
        np.ndarray.__setitem__(self, key, value)

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        plain = tuple(x.view(np.ndarray) if isinstance(x, BufferView) else x for x in inputs)
        if "out" in kwargs:
            kwargs["out"] = tuple(x.view(np.ndarray) if isinstance(x, BufferView) else x for x in kwargs["out"])
        return getattr(ufunc, method)(*plain, **kwargs)


def make_views(buffer: np.ndarray, layout: BufferLayout) -> dict[str, np.ndarray | None]:
    """Views of ``buffer`` (int8, 1-D) for every named view of ``layout`` (:class:`BufferView`)."""
    out: dict[str, np.ndarray | None] = {}
    for name, spec in layout.views.items():
        if spec is None:
            out[name] = None
            continue
        strides = None if spec.strides is None else tuple(s * spec.dtype.itemsize for s in spec.strides)
        out[name] = np.ndarray(spec.shape, dtype=spec.dtype, buffer=buffer, offset=spec.offset,
                               strides=strides).view(BufferView)
    return out
