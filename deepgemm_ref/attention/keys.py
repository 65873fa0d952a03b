"""Where MQA operands come from: query rows, and keys from a contiguous KV tensor or a paged cache.

:class:`Queries` turns query rows (T, H, D) into the core's operand of ``rows x H`` query-heads;
a :class:`KeySource` gives the keys of a range of virtual positions as a core operand (plus
DeepGEMM's per-token FP8 scale): :class:`PlainKeys` slices a contiguous (S, D) tensor,
:class:`PagedKeys` gathers tokens through a block table from a paged cache in either target's
byte layout (:class:`PagedLayout`), touching only the bytes the kernel reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from .. import core
from .. import formats as fm
from ..toolkit.args import E4M3

__all__ = ["Queries", "Keys", "KeySource", "PlainKeys", "PagedLayout", "PagedKeys", "ue8m0_scales"]


def ue8m0_scales(bytes_: np.ndarray) -> np.ndarray:
    """UE8M0 bytes -> float64 scales as the hardware reads them (byte 0 is 2^-127, 255 NaN)."""
    return fm.ue8m0_decode(bytes_)


@dataclass
class Queries:
    """Query rows (tokens) x heads x head_dim.

    data:   (rows, H, D) float8_e4m3fn, or (rows, H, D / 2) int8 packed E2M1.
    scales: (rows, H, D / 32) float64 per-32 block scales, or None (DeepGEMM FP8: unscaled).
    """

    data: np.ndarray
    fp4: bool
    scales: np.ndarray | None

    def operand(self, r0: int, r1: int) -> core.Operand:
        d = self.data[r0:r1]
        rows, heads = d.shape[0], d.shape[1]
        sc = None if self.scales is None else self.scales[r0:r1].reshape(rows * heads, -1)
        if self.fp4:  # bytes along the head dimension: decoded two codes at a time
            return _fp4_operand(d.reshape(rows * heads, -1), sc)
        return core.Operand(d.reshape(rows * heads, -1), sc, 32)


def _fp4_operand(packed: np.ndarray, scales: np.ndarray | None) -> core.Operand:
    """Packed E2M1 rows (two codes a byte along the head dimension, low nibble first) with per-32
    scales, as a core operand that decodes them without unpacking."""
    return core.Operand(packed.view(np.uint8), scales, 32, codes_fmt=fm.E2M1, packed=True)


@dataclass
class Keys:
    """Key tokens for a range of (virtual) positions: element operand and DeepGEMM's token scale."""

    operand: core.Operand
    token_scale: np.ndarray | None  # float64 (n,) or None


class KeySource(Protocol):
    """Where the keys of virtual positions [k0, k1) come from."""

    def get(self, k0: int, k1: int) -> Keys:
        """The keys of virtual positions [k0, k1) as a core operand (plus token scales)."""
        ...


class PlainKeys:
    """A contiguous KV tensor: data (S, D) e4m3 or (S, D / 2) packed, per-32 scales or token scale."""

    def __init__(self, data: np.ndarray, fp4: bool, block_scales: np.ndarray | None,
                 token_scale: np.ndarray | None) -> None:
        self.data = data
        self.fp4 = fp4
        self.block_scales = block_scales  # float64 (S, D / 32)
        self.token_scale = token_scale  # float64 (S,)

    def get(self, k0: int, k1: int) -> Keys:
        sc = None if self.block_scales is None else self.block_scales[k0:k1]
        if self.fp4:
            op = _fp4_operand(self.data[k0:k1], sc)
        else:
            op = core.Operand(self.data[k0:k1], sc, 32)
        ts = None if self.token_scale is None else self.token_scale[k0:k1]
        return Keys(op, ts)


@dataclass
class PagedLayout:
    """Byte layout of one KV-cache page (block) of ``page`` tokens: the value area
    (``page * value_bytes``), then the scale area.

    kinds: "deepgemm" (token-major values, then one 4-byte scale word per token),
    "ascend" (token-major values, then D/64 int16 pairs per token, token-major),
    "ascend_nz" (32-byte column fragments of all tokens, then pairs grouped per 16 tokens).
    """

    kind: str
    page: int
    value_bytes: int  # per token: D (FP8) or D / 2 (FP4)
    scale_bytes: int  # per token: 4 (DeepGEMM) or 2 * (D / 64) (DeepGEMM-Ascend)


class PagedKeys:
    """Keys gathered from a paged KV cache through a block table, for a virtual token layout.

    Request r occupies virtual positions [base[r], base[r + 1]); its position p is token
    p % page of physical page block_table[bt_rows[r], p // page].  Only the bytes the kernel
    reads are touched: page b starts at b * stride(0) of the caller's cache.
    """

    def __init__(self, cache: np.ndarray, layout: PagedLayout, fp4: bool, head_dim: int, target: str,
                 block_table: np.ndarray, bt_rows: np.ndarray, base: np.ndarray) -> None:
        self.layout = layout
        self.fp4 = fp4
        self.head_dim = head_dim
        self.target = target
        self.block_table = block_table
        self.bt_rows = bt_rows
        self.base = base  # int64 (R + 1,): request r's virtual start; base[-1] = total
        s0, num_pages, lay = cache.strides[0], cache.shape[0], layout
        if lay.kind == "ascend_nz":  # byte b of token t at (b // 32) * page * 32 + t * 32 + b % 32
            self._values = _byte_view(cache, 0, (num_pages, lay.page, lay.value_bytes // 32, 32),
                                      (s0, 32, lay.page * 32, 1))
        else:
            self._values = _byte_view(cache, 0, (num_pages, lay.page, lay.value_bytes), (s0, lay.value_bytes, 1))
        scale_at = lay.page * lay.value_bytes
        if lay.kind == "ascend_nz":  # int16 pair j of token t at 2 * ((t // 16) * 16 * pairs + j * 16 + t % 16)
            pairs = lay.scale_bytes // 2
            self._scales = _byte_view(cache, scale_at, (num_pages, lay.page // 16, 16, pairs, 2),
                                      (s0, 32 * pairs, 2, 32, 1))
        else:
            self._scales = _byte_view(cache, scale_at, (num_pages, lay.page, lay.scale_bytes),
                                      (s0, lay.scale_bytes, 1))

    def pages_tokens(self, k0: int, k1: int) -> tuple[np.ndarray, np.ndarray]:
        """(physical page, token in page) of virtual positions [k0, k1)."""
        v = np.arange(k0, k1, dtype=np.int64)
        r = np.searchsorted(self.base, v, side="right") - 1
        p = v - self.base[r]
        page = self.layout.page
        phys = self.block_table[self.bt_rows[r], p // page].astype(np.int64)
        return phys, p % page

    def get(self, k0: int, k1: int) -> Keys:
        phys, tok = self.pages_tokens(k0, k1)
        lay, n, d = self.layout, phys.size, self.head_dim
        vals = np.ascontiguousarray(self._values[phys, tok].reshape(n, lay.value_bytes))
        if lay.kind == "ascend_nz":
            raw = self._scales[phys, tok // 16, tok % 16]
        else:
            raw = self._scales[phys, tok]
        raw = np.ascontiguousarray(raw.reshape(n, lay.scale_bytes))
        if self.target == "cuda":
            if self.fp4:
                by = fm.unpack_ue8m0_int32(raw.view("<i4"))[:, : d // 32]
                return Keys(_fp4_operand(vals, ue8m0_scales(by)), None)
            ts = raw.view("<f4").reshape(n).astype(np.float64)
            return Keys(core.Operand(vals.view(E4M3), None, 32), ts)
        by = fm.unpack_ue8m0_int16(raw.view("<i2"))[:, : d // 32]
        if self.fp4:
            return Keys(_fp4_operand(vals, ue8m0_scales(by)), None)
        return Keys(core.Operand(vals.view(E4M3), ue8m0_scales(by), 32), None)


def _byte_view(cache: np.ndarray, offset: int, shape: tuple[int, ...], strides: tuple[int, ...]) -> np.ndarray:
    """A read-only byte view of ``cache``'s buffer starting ``offset`` bytes after its first element.

    The leading size-2 axis with stride ``offset`` moves the start without leaving the buffer
    (only index 1 is used, and every byte it reaches belongs to one of the cache's pages).
    """
    st = np.lib.stride_tricks.as_strided
    return st(cache, (2, *shape), (offset, *strides), writeable=False)[1]
