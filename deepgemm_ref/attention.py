"""MQA logits for the lightning indexer: plain and paged, FP8 and FP4, DeepGEMM and DeepGEMM-Ascend.

Every public function is DeepGEMM's (profiles ``sm90``, ``sm100``; spec section 9) or, under the
``ascend950`` profile, DeepGEMM-Ascend's (port 1.8 and 2.5) function of the same name, with that
target's parameters, defaults and accepted inputs.  The math, for query row ``i`` and key ``j``::

    logit[i, j] = s_j * sum_h  w[i, h] * relu( sum_d  q[i, h, d] * sq[i, h, d // 32] * k[j, d] * sk[j, d // 32] )

``q`` and ``k`` are the FP8 (E4M3) or FP4 (E2M1) element values, ``sq`` / ``sk`` their per-32 UE8M0
block scales (FP4 on DeepGEMM, both formats on DeepGEMM-Ascend; 1 otherwise), ``s_j`` DeepGEMM's
float32 per-token KV scale (FP8 mode; 1 otherwise) and ``w`` the float32 or bfloat16 weights.

Accumulation models (``deepgemm_ref.numerics(accumulation=...)``)
    ``exact`` (default): the exact real value of the whole logit, rounded once (RNE) to the output
    dtype.  ``fp32`` / ``limited(bits, interval)``: each head's dot product ``x_h`` is the core's
    float32 result in that model, then the head reduction follows the target's arithmetic:

    * sm100, float32 weights: two float2 accumulators A, B start at +0; heads 4u, 4u+1 go to A's
      lanes, 4u+2, 4u+3 to B's, u increasing; each step ``acc = fma(f32(x + |x|), w, acc)`` (one
      rounding); then ``(A.x + B.x) + (A.y + B.y)``, halved, times ``s_j`` in float32, cast.
    * sm100, bfloat16 weights: ``r = bf16(relu(x))``, the same lanes with fused bf16 FMAs, bf16
      lane adds, then ``bf16(reduced * bf16(s_j))``.
    * sm90: lane ``c`` (0..3), parity ``p``: ``acc = f32(relu(x_h) * w_h)`` for h = 2c + p, then
      ``acc = fma(relu(x_h), w_h, acc)`` for h = 8g + 2c + p, g = 1, 2, ... (nvcc contracts
      ``acc += a * b``); ``v_c = f32(f32(acc_even + acc_odd) * s_j)``; ``(v0 + v1) + (v2 + v3)``.
      ``relu`` is ``fmaxf(x, 0)`` (NaN gives 0).
    * ascend950: ``r_h = bf16(relu(x_h))`` (FIXPIPE), then ``acc = bf16(0)`` and for h = 0..H-1
      ``acc = bf16(acc + r_h * w_h)`` with one rounding per step (a fused multiply-accumulate;
      see ``ASCEND_BF16_MULA_FUSED``).

How the exact value is obtained (per task of ``rows x H`` query-heads and ``n`` keys)
    1. ``core.exact_accumulator`` gives every ``x_h`` in float64 with a rigorous bound
       ``err_h`` (0 when the core's exactness certificate holds: ``||q_h|| ||k_j|| <
       2^(53 + e_q + e_k)``, ``2^e`` the quantum of each row; DeepGEMM's FP8 mode, no Q/K scales
       and D <= 128, is always exact: |x| < 2^25 in steps of 2^-18).  No output rounding is
       spent on these intermediate values.
    2. ``T = sum_h w_h relu(acc_h)`` and ``A = sum_h |w_h| relu(acc_h)`` by one batched float64
       matmul; ``|T - exact| <= gamma_{H+2} A (+ sum_h |w_h| err_h)``; ``z = s_j T`` adds ``u |z|``.
    3. Every logit whose error interval ``[z - E, z + E]`` rounds to one output code is decided
       (RNE is monotone).  The others (exact ties, near-ties) are recomputed from the operands
       with Python ``Fraction`` s and rounded by ``formats.encode_scalar``.  The result is the
       correctly rounded exact value for every finite input; non-finite inputs follow IEEE
       arithmetic on the float64 evaluation (NaN propagates through relu).

Outputs
    Fresh allocations with the target's padded row stride; the returned logits are views
    (DeepGEMM 9.1 "Output allocation", 9.4; DeepGEMM-Ascend rows aligned to 256 elements).
    Elements the kernel leaves unspecified are NaN (outside ``[ks, ke)`` without cleaning,
    compressed-row tails, paged positions at or past a row's context length, the padding);
    with ``clean_logits`` the cleaned columns are ``-inf`` exactly where DeepGEMM writes ``-inf``.
    ``deepgemm_ref.trace.capture()`` reports a ``defined`` mask (and the float64 value ``acc`` and
    error scale ``S = |s_j| sum_h |w_h| sum_d |q_hd k_d| * scales`` on request) per call.

Memory is bounded: work is split into tasks of about ``2^21`` query-head x key products (about
60 MiB each, two in flight), so the peak is the output plus well under 256 MiB for any length.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Protocol

import numpy as np

from . import core, runtime, trace
from . import formats as fm
from ._parallel import parallel_chunks
from .api import profiled
from .certified import FormatRounding, Points, round_certified
from .errors import arg_error
from .exact import U64, align, ceil_div, dd_to_f64_round_odd, gamma, two_sum
from .executor import active_accumulation
from .interop import caller_kind, from_numpy, torch_dtype_name
from .profiles import get_profile
from .toolkit.args import (
    BF16,
    E4M3,
    F32,
    I8,
    I16,
    I32,
    U8,
    as_array,
    as_pair,
    bool_arg,
    check,
    dtype_name,
    int_arg,
    is_contiguous,
    strides,
    unit_stride,
)

__all__ = [
    "fp8_fp4_mqa_logits",
    "fp8_mqa_logits",
    "get_paged_mqa_logits_metadata",
    "fp8_fp4_paged_mqa_logits",
    "fp8_paged_mqa_logits",
    "ASCEND_BF16_MULA_FUSED",
    "TASK_ELEMENTS",
]

# Note: DeepGEMM-Ascend's bf16 multiply-accumulate is modelled as fused (one rounding per head);
# the port's source does not say, and the choice only matters under the fp32 / limited models.
#: DeepGEMM-Ascend's head reduction uses the vector instruction ``asc_mula`` (bf16 registers,
#: ``acc += value * w``).  Modelled as fused: one rounding per step.  A bf16 x bf16 product is
#: exact in any multiplier wider than 16 significand bits, so the only rounding the instruction
#: needs is the write-back to its bf16 destination; DeepGEMM's own bf16 path (``__hfma2``) is fused
#: too.  The port's source does not say (port 2.5); ``False`` selects multiply-then-add.
ASCEND_BF16_MULA_FUSED = True

#: Query-head x key products per task (one ``scaled_matmul`` call); bounds the working memory.
TASK_ELEMENTS = 1 << 21
_MIN_KEYS = 256  # smallest key chunk of a task
_SLACK_KEYS = 256  # keys per row a row group may compute beyond the rows' own ranges

# DeepGEMM constants (csrc/apis/attention.hpp and the schedulers)
_SPLIT_KV = 256  # DeepGEMM's KV split (paged schedule and logits padding)
_CLEAN_BLOCK = 8192  # smxx_clean_logits' column block
_SMEM_CAPACITY = 232448  # SM90ArchSpec / SM100ArchSpec::smem_capacity (bytes)
# DeepGEMM-Ascend constants
_ASC_SPLIT_KV = 512
_ASC_ROW_ALIGN = 256  # 512-byte aligned bf16 rows
_ASC_UB_BYTES = 248 * 1024


# ----------------------------------------------------------------------------------------------
# small helpers
# ----------------------------------------------------------------------------------------------

class _TorchDtypeName:
    """``torch.float32`` in a signature without importing torch (``repr`` is the torch name)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"torch.{self.name}"


_TORCH_FLOAT32 = _TorchDtypeName("float32")


def _logits_format(func: str, logits_dtype: Any) -> fm.Format:
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


def _ue8m0_scales(bytes_: np.ndarray) -> np.ndarray:
    """UE8M0 bytes -> float64 scales as the hardware reads them (byte 0 is 2^-127, 255 NaN)."""
    return fm.ue8m0_decode(bytes_)


# ----------------------------------------------------------------------------------------------
# canonical operands: queries and keys
# ----------------------------------------------------------------------------------------------

@dataclass
class _Queries:
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
        if self.fp4:
            codes = fm.unpack_fp4(d).reshape(rows * heads, -1)
            return core.Operand(codes, sc, 32, codes_fmt=fm.E2M1)
        return core.Operand(d.reshape(rows * heads, -1), sc, 32)


@dataclass
class _Keys:
    """Key tokens for a range of (virtual) positions: element operand and DeepGEMM's token scale."""

    operand: core.Operand
    token_scale: np.ndarray | None  # float64 (n,) or None


class _KeySource(Protocol):
    """Where the keys of virtual positions [k0, k1) come from."""

    def get(self, k0: int, k1: int) -> _Keys:
        """The keys of virtual positions [k0, k1) as a core operand (plus token scales)."""
        ...


class _PlainKeys:
    """A contiguous KV tensor: data (S, D) e4m3 or (S, D / 2) packed, per-32 scales or token scale."""

    def __init__(self, data: np.ndarray, fp4: bool, block_scales: np.ndarray | None,
                 token_scale: np.ndarray | None) -> None:
        self.data = data
        self.fp4 = fp4
        self.block_scales = block_scales  # float64 (S, D / 32)
        self.token_scale = token_scale  # float64 (S,)

    def get(self, k0: int, k1: int) -> _Keys:
        sc = None if self.block_scales is None else self.block_scales[k0:k1]
        if self.fp4:
            op = core.Operand(fm.unpack_fp4(self.data[k0:k1]), sc, 32, codes_fmt=fm.E2M1)
        else:
            op = core.Operand(self.data[k0:k1], sc, 32)
        ts = None if self.token_scale is None else self.token_scale[k0:k1]
        return _Keys(op, ts)


@dataclass
class _PagedLayout:
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


class _PagedKeys:
    """Keys gathered from a paged KV cache through a block table, for a virtual token layout.

    Request r occupies virtual positions [base[r], base[r + 1]); its position p is token
    p % page of physical page block_table[bt_rows[r], p // page].  Only the bytes the kernel
    reads are touched: page b starts at b * stride(0) of the caller's cache.
    """

    def __init__(self, cache: np.ndarray, layout: _PagedLayout, fp4: bool, head_dim: int, target: str,
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

    def get(self, k0: int, k1: int) -> _Keys:
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
                return _Keys(core.Operand(fm.unpack_fp4(vals), _ue8m0_scales(by), 32, codes_fmt=fm.E2M1), None)
            ts = raw.view("<f4").reshape(n).astype(np.float64)
            return _Keys(core.Operand(vals.view(E4M3), None, 32), ts)
        by = fm.unpack_ue8m0_int16(raw.view("<i2"))[:, : d // 32]
        if self.fp4:
            return _Keys(core.Operand(fm.unpack_fp4(vals), _ue8m0_scales(by), 32, codes_fmt=fm.E2M1), None)
        return _Keys(core.Operand(vals.view(E4M3), _ue8m0_scales(by), 32), None)


def _byte_view(cache: np.ndarray, offset: int, shape: tuple[int, ...], strides: tuple[int, ...]) -> np.ndarray:
    """A read-only byte view of ``cache``'s buffer starting ``offset`` bytes after its first element.

    The leading size-2 axis with stride ``offset`` moves the start without leaving the buffer
    (only index 1 is used, and every byte it reaches belongs to one of the cache's pages).
    """
    st = np.lib.stride_tricks.as_strided
    return st(cache, (2, *shape), (offset, *strides), writeable=False)[1]


# ----------------------------------------------------------------------------------------------
# roundings used by the device models (all exact emulations of one IEEE operation each)
# ----------------------------------------------------------------------------------------------

def _fma_f32(a: np.ndarray, w: np.ndarray, c: np.ndarray) -> np.ndarray:
    """float32 ``fma(a, w, c)``: RN_f32(a * w + c) with one rounding (a * w is exact in float64)."""
    s, e = two_sum(c.astype(np.float64), a.astype(np.float64) * w)
    return dd_to_f64_round_odd(s, e).astype(np.float32)


def _to_bf16_value(x: np.ndarray) -> np.ndarray:
    """RNE to bfloat16 of float32 or float64 values (correct rounding), returned as float64."""
    return fm.cast(x, fm.BF16, fm.IEEE_RNE).astype(np.float64)


def _fma_bf16(a: np.ndarray, w: np.ndarray, c: np.ndarray) -> np.ndarray:
    """bf16 fused multiply-add RN_bf16(a * w + c) on bf16 values held in float64."""
    s, e = two_sum(c, a * w)  # a * w: 8 + 8 significand bits, exact
    return _to_bf16_value(dd_to_f64_round_odd(s, e))


def _add_bf16(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    s, e = two_sum(a, b)
    return _to_bf16_value(dd_to_f64_round_odd(s, e))


# ----------------------------------------------------------------------------------------------
# head reductions of the device models (x: float32 (rows, H, n) per-head dot products)
# ----------------------------------------------------------------------------------------------

def _reduce_sm100_f32(x: np.ndarray, w: np.ndarray, kvs: np.ndarray | None) -> np.ndarray:
    """DeepGEMM sm100, float32 weights: float32 (rows, n) before the cast to logits_dtype.

    Lanes (A.x, A.y, B.x, B.y) take heads 4u, 4u+1, 4u+2, 4u+3; acc = fma(f32(x + |x|), w, acc).
    """
    rows, heads, n = x.shape
    with np.errstate(over="ignore", invalid="ignore"):
        a = x + np.abs(x)  # float32 add: 2x (or 0), one IEEE rounding (overflow to inf)
        acc = np.zeros((rows, 4, n), np.float32)
        w32 = w.astype(np.float32)
        for u in range(heads // 4):
            acc = _fma_f32(a[:, 4 * u:4 * u + 4], w32[:, 4 * u:4 * u + 4, None], acc)
        sx = acc[:, 0] + acc[:, 2]  # __fadd2_rn(A, B)
        sy = acc[:, 1] + acc[:, 3]
        red = (sx + sy) / np.float32(2)
        if kvs is not None:
            red = red * kvs.astype(np.float32)[None, :]
    return red


def _reduce_sm100_bf16(x: np.ndarray, w: np.ndarray, kvs: np.ndarray | None) -> np.ndarray:
    """DeepGEMM sm100, bfloat16 weights: bf16 values (as float64) (rows, n).

    r = bf16(relu(x)); lanes as the float32 path with fused bf16 FMAs (``__hfma2``); lane sums
    with bf16 adds; then bf16(reduced * bf16(kv_scale)) in FP8 mode.
    """
    rows, heads, n = x.shape
    with np.errstate(over="ignore", invalid="ignore"):
        r = _to_bf16_value(np.maximum(x, np.float32(0))).reshape(rows, heads, n)
        acc = np.zeros((rows, 4, n))
        w64 = w.astype(np.float64)
        for u in range(heads // 4):
            acc = _fma_bf16(r[:, 4 * u:4 * u + 4], w64[:, 4 * u:4 * u + 4, None], acc).reshape(rows, 4, n)
        sx = _add_bf16(acc[:, 0], acc[:, 2]).reshape(rows, n)
        sy = _add_bf16(acc[:, 1], acc[:, 3]).reshape(rows, n)
        red = _add_bf16(sx, sy).reshape(rows, n)
        if kvs is not None:
            red = _to_bf16_value(red * _to_bf16_value(kvs)[None, :]).reshape(rows, n)
    return red


def _reduce_sm90(x: np.ndarray, w: np.ndarray, kvs: np.ndarray | None) -> np.ndarray:
    """DeepGEMM sm90 (float32 weights): float32 (rows, n).

    Lane L = h mod 8 = 2c + p keeps acc_L = f32(relu(x_L) w_L), then fma(relu(x_h), w_h, acc_L)
    for h = L + 8, L + 16, ...; v_c = f32(f32(acc_2c + acc_2c+1) * s); (v0 + v1) + (v2 + v3).
    """
    rows, heads, n = x.shape
    with np.errstate(over="ignore", invalid="ignore"):
        r = np.where(x > 0, x, np.float32(0))  # fmaxf(x, 0): NaN -> 0
        # Note: sm90's ``sum += fmaxf(x, 0) * w`` is modelled with nvcc's default contraction into
        # an FMA (--fmad=true); the first term of each lane is a rounded product.
        w32 = w.astype(np.float32)
        acc = r[:, 0:8] * w32[:, 0:8, None]
        for g in range(1, heads // 8):
            acc = _fma_f32(r[:, 8 * g:8 * g + 8], w32[:, 8 * g:8 * g + 8, None], acc)
        pair = acc[:, 0::2] + acc[:, 1::2]  # (rows, 4, n): lane c
        if kvs is not None:
            pair = pair * kvs.astype(np.float32)[None, None, :]
        return (pair[:, 0] + pair[:, 1]) + (pair[:, 2] + pair[:, 3])


def _reduce_ascend(x: np.ndarray, w: np.ndarray, fused: bool) -> np.ndarray:
    """DeepGEMM-Ascend: r_h = bf16(relu(x_h)); acc = bf16(0); acc = bf16(acc + r_h w_h), h = 0..H-1.

    Returns bf16 values as float64 (rows, n).  ``fused=False``: bf16(acc + bf16(r_h w_h)).
    """
    rows, heads, n = x.shape
    with np.errstate(over="ignore", invalid="ignore"):
        r = _to_bf16_value(np.maximum(x, np.float32(0))).reshape(rows, heads, n)
        w64 = w.astype(np.float64)
        acc = np.zeros((rows, n))
        for h in range(heads):
            if fused:
                acc = _fma_bf16(r[:, h], w64[:, h, None], acc).reshape(rows, n)
            else:
                p = _to_bf16_value(r[:, h] * w64[:, h, None]).reshape(rows, n)
                acc = _add_bf16(acc, p).reshape(rows, n)
    return acc


# ----------------------------------------------------------------------------------------------
# the plan: everything a task needs, validated and canonical
# ----------------------------------------------------------------------------------------------

@dataclass
class _Plan:
    """A validated MQA-logits call: operands, per-row key ranges, output placement.

    Row i (query token) sees virtual keys [ks[i], ke[i]); key v lands in output column
    v - shift[i] (shift 0: column = key index; shift ks: compressed / paged indexing).
    """

    func: str
    reduction: str  # "sm100", "sm90" or "ascend"
    queries: _Queries
    keys: _KeySource
    weights: np.ndarray  # (rows, H) float32 or bfloat16 (caller's view, stride(1) == 1)
    out_fmt: fm.Format
    ks: np.ndarray  # int64 (rows,)
    ke: np.ndarray
    shift: np.ndarray
    accumulation: core.Accumulation = field(default_factory=core.Accumulation)
    stats: dict[str, int] = field(default_factory=dict)

    @property
    def heads(self) -> int:
        return int(self.queries.data.shape[1])


def _row_groups(ks: np.ndarray, ke: np.ndarray, heads: int, budget: int) -> list[tuple[int, int, int, int]]:
    """Consecutive rows computed together: (r0, r1, k_lo, k_hi) with the union of their key ranges.

    A row joins a group while the group's rows x union span stays within 1.25x the rows' own
    work (plus ``_SLACK_KEYS`` per row), so unrelated ranges (paged requests) are not crossed.
    Empty rows take no keys.
    """
    rows = ks.size
    max_rows = max(1, budget // (heads * _MIN_KEYS))
    groups: list[tuple[int, int, int, int]] = []
    i = 0
    ks_l = ks.tolist()
    ke_l = ke.tolist()
    while i < rows:
        lo, hi = (ks_l[i], ke_l[i]) if ke_l[i] > ks_l[i] else (None, None)
        useful = max(ke_l[i] - ks_l[i], 0)
        j = i + 1
        while j < rows and j - i < max_rows:
            a, b = ks_l[j], ke_l[j]
            if b > a:
                nlo = a if lo is None else min(lo, a)
                nhi = b if hi is None else max(hi, b)
                nuse = useful + b - a
                if (j + 1 - i) * (nhi - nlo) > 1.25 * nuse + (j + 1 - i) * _SLACK_KEYS:
                    break
                lo, hi, useful = nlo, nhi, nuse
            j += 1
        if lo is not None and hi is not None:
            groups.append((i, j, lo, hi))
        i = j
    return groups


def _tasks(plan: _Plan, budget: int) -> list[tuple[int, int, int, int]]:
    out = []
    for r0, r1, lo, hi in _row_groups(plan.ks, plan.ke, plan.heads, budget):
        n = max(_MIN_KEYS, budget // ((r1 - r0) * plan.heads))
        for k0 in range(lo, hi, n):
            out.append((r0, r1, k0, min(hi, k0 + n)))
    return out


@dataclass
class _Sinks:
    """Where task results go: the output (padded allocation's view) and optional trace arrays."""

    out: np.ndarray  # (rows, width) of the output storage dtype
    acc: np.ndarray | None
    S: np.ndarray | None
    lock: threading.Lock = field(default_factory=threading.Lock)


def _run(plan: _Plan, sinks: _Sinks, want_S: bool) -> None:
    """Compute every defined logit of the plan and write it (and trace values) into the sinks."""
    tasks = _tasks(plan, TASK_ELEMENTS)

    def work(a: int, b: int) -> None:
        for t in tasks[a:b]:
            _task(plan, sinks, want_S, *t)

    parallel_chunks(len(tasks), 1, work)


def _task(plan: _Plan, sinks: _Sinks, want_S: bool, r0: int, r1: int, k0: int, k1: int) -> None:
    rows, heads, n = r1 - r0, plan.heads, k1 - k0
    qop = plan.queries.operand(r0, r1)
    keys = plan.keys.get(k0, k1)
    w = plan.weights[r0:r1]
    stats: dict[str, int] = {}
    keys_at = np.arange(k0, k1)[None, :]
    needed = (keys_at >= plan.ks[r0:r1, None]) & (keys_at < plan.ke[r0:r1, None])
    prod = core.dot_products(qop, keys.operand, plan.accumulation, want_S=want_S)
    head_S = prod.S
    if prod.exact:
        codes, value = _exact_logits(plan, qop, keys, w, prod.values.reshape(rows, heads, n),
                                     None if prod.err is None else prod.err.reshape(rows, heads, n), needed, stats)
    else:
        x = prod.values.reshape(rows, heads, n)
        value = _model_logits(plan, x, w, keys.token_scale)
        codes = fm.round_f64(value, plan.out_fmt).view(plan.out_fmt.code_dtype)
        stats[str(plan.accumulation.model)] = int(np.count_nonzero(needed))
    S = None
    if want_S and head_S is not None:
        S = _logit_error_scale(head_S.reshape(rows, heads, n), w, keys.token_scale)
    out_codes = sinks.out.view(plan.out_fmt.code_dtype)
    ks, ke, shift = plan.ks, plan.ke, plan.shift
    for i in range(rows):
        g = r0 + i
        a, b = max(int(ks[g]), k0), min(int(ke[g]), k1)
        if a >= b:
            continue
        c0 = a - int(shift[g])
        out_codes[g, c0:c0 + b - a] = codes[i, a - k0:b - k0]
        if sinks.acc is not None:
            sinks.acc[g, c0:c0 + b - a] = value[i, a - k0:b - k0]
        if sinks.S is not None and S is not None:
            sinks.S[g, c0:c0 + b - a] = S[i, a - k0:b - k0]
    with sinks.lock:
        for key, v in stats.items():
            plan.stats[key] = plan.stats.get(key, 0) + v


def _model_logits(plan: _Plan, x: np.ndarray, w: np.ndarray, kvs: np.ndarray | None) -> np.ndarray:
    """The device models' head reduction: float64 values exactly representable in the output."""
    if plan.reduction == "ascend":
        return _reduce_ascend(x, w, ASCEND_BF16_MULA_FUSED)
    if plan.reduction == "sm90":
        return _reduce_sm90(x, w, kvs).astype(np.float64)
    if w.dtype == BF16:
        return _reduce_sm100_bf16(x, w, kvs)
    return _reduce_sm100_f32(x, w, kvs).astype(np.float64)


def _logit_error_scale(s_heads: np.ndarray, w: np.ndarray, kvs: np.ndarray | None) -> np.ndarray:
    """S = |s_j| sum_h |w_h| S_h (rounded up) from the per-head error scales S_h (rows, H, n)."""
    wa = np.abs(w.astype(np.float64))[:, None, :]
    with np.errstate(over="ignore", invalid="ignore"):
        s = np.matmul(wa, s_heads)[:, 0, :] * (1 + 2 * gamma(s_heads.shape[1] + 2))
        if kvs is not None:
            s = s * np.abs(kvs)[None, :] * (1 + 4 * U64)
    return s


# ----------------------------------------------------------------------------------------------
# the exact model
# ----------------------------------------------------------------------------------------------

def _exact_logits(plan: _Plan, qop: core.Operand, keys: _Keys, w: np.ndarray, x: np.ndarray,
                  x_err: np.ndarray | None, needed: np.ndarray,
                  stats: dict[str, int]) -> tuple[np.ndarray, np.ndarray]:
    """Correctly rounded codes (rows, n) and float64 values of s_j sum_h w_h relu(x_h).

    x: the core's float64 accumulators (rows, H, n), modified in place (relu); x_err: their
    rigorous error bounds (0 where the core's exactness certificate holds; None: all exact).  needed: bool
    (rows, n), the pairs inside their row's key range (only those go to the exact fallback;
    the others are computed because a row group shares one key span, and are discarded).
    """
    rows, heads, n = x.shape
    kop, kvs = keys.operand, keys.token_scale
    out = plan.out_fmt
    # The per-head dot products come certified from the core (module docstring, step 1).
    exact_x = x_err is None or not np.any(x_err)
    w64 = w.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        np.maximum(x, 0.0, out=x)  # relu (NaN propagates)
        w2 = np.stack([w64, np.abs(w64)], axis=1)  # (rows, 2, H)
        ta = np.matmul(w2, x)  # (rows, 2, n): one pass over x
        t, a = ta[:, 0], ta[:, 1]
        err = a * (gamma(heads + 2) * (1 + 8 * U64))
        if not exact_x:
            # |relu(x^) - relu(x)| <= |x^ - x| <= x_err, weighted by |w| and summed over heads
            assert x_err is not None
            err = err + np.matmul(np.abs(w64)[:, None, :], x_err)[:, 0, :] * (1 + 2 * gamma(heads + 2))
        if kvs is not None:
            z = t * kvs[None, :]
            e_all = (err * np.abs(kvs)[None, :] + np.abs(z) * U64) * (1 + 8 * U64)
        else:
            z = t
            e_all = err * (1 + 8 * U64)
        z += 0.0  # the exact value has no sign: a zero logit is +0 (as the devices' +0-seeded sums give)
        # A floor for an error bound that underflowed; an exact zero (A == 0) keeps E == 0.
        e_all = np.where((e_all > 0) | (a > 0), e_all + 2.0**-1070, e_all)
    rounding = FormatRounding(out)

    def exact(at: Points) -> np.ndarray:
        codes = np.empty(at[0].size, out.code_dtype)
        for p, (i, j) in enumerate(zip(at[0].tolist(), at[1].tolist(), strict=True)):
            if x_err is None or not np.any(x_err[i, :, j]):
                xs = [Fraction(float(v)) for v in x[i, :, j]]  # relu'd exact values
            else:
                xs = _exact_head_dots(qop, kop, i, j, heads)
            v = sum((Fraction(float(w64[i, h])) * xs[h] for h in range(heads)), Fraction(0))
            if kvs is not None:
                v *= Fraction(float(kvs[j]))
            codes[p] = rounding.exact(v)
            z[i, j] = float(v)
        return codes

    # Non-finite values follow IEEE arithmetic; pairs outside their row's range are discarded.
    codes, pending = round_certified(z, e_all, rounding, final=~np.isfinite(z) | ~needed, fallback=exact)
    n_pending = int(np.count_nonzero(pending))
    stats["bounded"] = stats.get("bounded", 0) + int(np.count_nonzero(needed)) - n_pending
    if n_pending:
        stats["fraction"] = stats.get("fraction", 0) + n_pending
    return codes, z


def _exact_head_dots(qop: core.Operand, kop: core.Operand, i: int, j: int, heads: int) -> list[Fraction]:
    """relu of the exact dot products of query row i's heads with key j (scaled values are exact)."""
    qv = qop.rows(i * heads, (i + 1) * heads)
    kv = kop.rows(j, j + 1)[0]
    kf = [Fraction(float(v)) for v in kv]
    out = []
    for h in range(heads):
        s = sum((Fraction(float(a)) * b for a, b in zip(qv[h], kf, strict=True) if a != 0), Fraction(0))
        out.append(max(s, Fraction(0)))
    return out


# ----------------------------------------------------------------------------------------------
# output allocation, cleaning, trace
# ----------------------------------------------------------------------------------------------

def _allocate(rows_alloc: int, stride: int, rows: int, width: int, out: fm.Format) -> tuple[np.ndarray, np.ndarray]:
    """(padded allocation filled with NaN, the (rows, width) view of it)."""
    # Note: elements the kernels leave unspecified (uninitialised memory or stray scores on the
    # device) are NaN here, so that nothing undefined can pass for a value.
    alloc = np.full((rows_alloc, stride), np.nan, out.storage)
    return alloc, alloc[:rows, :width]


def _execute(plan: _Plan, view: np.ndarray, defined: Callable[[], np.ndarray],
             cleaned: Callable[[], np.ndarray] | None = None) -> None:
    """Run the plan into ``view`` and report it to an active trace capture.

    ``defined()`` / ``cleaned()`` give the bool masks (view-shaped) of the elements the kernel's
    contract defines and of those the clean pass set to -inf.
    """
    cap = trace.active()
    want_acc, want_S = trace.wants()
    acc = np.full(view.shape, np.nan) if want_acc else None
    S = np.full(view.shape, np.nan) if want_S else None
    _run(plan, _Sinks(view, acc, S), want_S)
    if cap is not None:
        mask = defined()
        if cleaned is not None:
            neg = cleaned()
            if acc is not None:
                acc[neg] = -np.inf
            if S is not None:
                S[neg] = 0.0  # written, not computed: no error
        trace.record(plan.func, acc=acc, S=S, defined=mask, stats=dict(plan.stats))


def _range_mask(shape: tuple[int, int], lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """bool (rows, width): column c of row i is in [lo[i], hi[i])."""
    cols = np.arange(shape[1])[None, :]
    return (cols >= lo[:, None]) & (cols < hi[:, None])


def _clean(alloc: np.ndarray, seq: int, seq_kv: int, ks: np.ndarray, ke: np.ndarray) -> None:
    """smxx_clean_logits: -inf at columns [0, ks) and [ke, right) of every row, where the kernel's
    8192-column blocks stop at min(ceil(seq_kv / 8192) * 8192, row stride) (beyond the view)."""
    right = min(align(seq_kv, _CLEAN_BLOCK), alloc.shape[1])
    for i in range(seq):
        alloc[i, :int(ks[i])] = -np.inf
        alloc[i, int(ke[i]):right] = -np.inf


# ----------------------------------------------------------------------------------------------
# argument checks shared by the DeepGEMM and DeepGEMM-Ascend entry points
# ----------------------------------------------------------------------------------------------

def _check_seq_lens(func: str, arg: str, x: np.ndarray, seq: int) -> np.ndarray:
    # Note: cu_seq_len_k_start / _end must be 1-D; DeepGEMM only checks size(0) and contiguity.
    check(x.ndim == 1 and x.shape[0] == seq, func, arg, f"a 1-D array of {seq} entries (one per query)", x)
    check(x.dtype == I32, func, arg, "dtype int32", x)
    check(is_contiguous(x), func, arg, "a contiguous array", x)
    return x.astype(np.int64)


def _check_ranges(func: str, ks: np.ndarray, ke: np.ndarray, seq_kv: int, max_seqlen_k: int) -> None:
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


def _check_weights(func: str, w: np.ndarray, rows: int, heads: int, dtypes: tuple[np.dtype, ...],
                   contiguous: bool = False) -> None:
    check(w.ndim == 2 and w.shape == (rows, heads), func, "weights", f"shape ({rows}, {heads})", w)
    check(unit_stride(w, 1), func, "weights", "stride(1) == 1", w)
    if contiguous:
        check(is_contiguous(w), func, "weights", "a contiguous array (FP8 paged MQA logits)", w)
    check(w.dtype in dtypes, func, "weights", "dtype " + " or ".join(dtype_name(t) for t in dtypes), w)


def _cuda_heads(func: str, arg: str, arch: int, heads: int, fp4: bool, x: np.ndarray) -> None:
    allowed = (8, 16, 32, 64) if arch == 10 else (32, 64)
    check(heads in allowed, func, arg, f"num_heads in {allowed} on sm{arch}0", x)


def _cuda_weights_and_dtype(func: str, w: np.ndarray, rows: int, heads: int, arch: int, out: fm.Format,
                            contiguous: bool) -> None:
    _check_weights(func, w, rows, heads, (F32, BF16) if arch == 10 else (F32,), contiguous)
    if w.dtype == BF16 and out is not fm.BF16:
        raise arg_error(func, "logits_dtype", "bfloat16 with bfloat16 weights", "float32")




# ----------------------------------------------------------------------------------------------
# plain MQA logits
# ----------------------------------------------------------------------------------------------

def _mqa_logits_cuda(func: str, q: Any, kv: Any, weights: Any, cu_seq_len_k_start: Any, cu_seq_len_k_end: Any,
                     clean_logits: Any, max_seqlen_k: Any, logits_dtype: Any) -> Any:
    profile = get_profile()
    arch = profile.arch_major
    kind = caller_kind(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end)
    q_data, q_sf = as_pair(q, func, "q", sf_optional=True)
    kv_data, kv_sf = as_pair(kv, func, "kv", sf_optional=True)
    clean = bool_arg(func, "clean_logits", clean_logits)
    max_k = int_arg(func, "max_seqlen_k", max_seqlen_k, minimum=0)
    out = _logits_format(func, logits_dtype)
    w = as_array(weights, func, "weights")
    fp4 = q_sf is not None
    check(q_data.ndim == 3, func, "q[0]", "a 3-D array (seq_len, num_heads, head_dim)", q_data)
    seq, heads = int(q_data.shape[0]), int(q_data.shape[1])
    if fp4:
        d = 2 * int(q_data.shape[2])
        check(arch == 10, func, "q[1]", "None on sm90 (FP4 MQA logits need sm100)", q_sf)
        check(q_data.dtype == I8, func, "q[0]", "int8 packed FP4 (q[1] is given)", q_data)
        _cuda_heads(func, "q[0]", arch, heads, True, q_data)
        check(d in (64, 128), func, "q[0]", "head_dim 64 or 128 for FP4", q_data)
        check(is_contiguous(q_data), func, "q[0]", "a contiguous array", q_data)
        assert q_sf is not None
        check(q_sf.ndim == 2 and q_sf.shape == (seq, heads), func, "q[1]", f"shape ({seq}, {heads})", q_sf)
        check(is_contiguous(q_sf) and q_sf.dtype == I32, func, "q[1]", "a contiguous int32 array (packed UE8M0)", q_sf)
        check(kv_data.ndim == 2 and kv_data.shape[1] * 2 == d, func, "kv[0]", f"shape (seq_len_kv, {d // 2})",
               kv_data)
        check(kv_data.dtype == I8 and is_contiguous(kv_data), func, "kv[0]", "a contiguous int8 (packed FP4) array",
               kv_data)
        seq_kv = int(kv_data.shape[0])
        check(kv_sf is not None and kv_sf.ndim == 1 and kv_sf.shape[0] == seq_kv, func, "kv[1]",
               f"shape ({seq_kv},)", kv_sf)
        assert kv_sf is not None
        check(is_contiguous(kv_sf) and kv_sf.dtype == I32, func, "kv[1]", "a contiguous int32 array (packed UE8M0)",
               kv_sf)
    else:
        d = int(q_data.shape[2])
        check(q_data.dtype == E4M3, func, "q[0]", "float8_e4m3fn (q[1] is None)", q_data)
        _cuda_heads(func, "q[0]", arch, heads, False, q_data)
        check(d in (32, 64, 128), func, "q[0]", "head_dim 32, 64 or 128", q_data)
        check(is_contiguous(q_data), func, "q[0]", "a contiguous array", q_data)
        check(kv_data.ndim == 2 and kv_data.shape[1] == d, func, "kv[0]", f"shape (seq_len_kv, {d})", kv_data)
        check(kv_data.dtype == E4M3 and is_contiguous(kv_data), func, "kv[0]", "a contiguous float8_e4m3fn array",
               kv_data)
        seq_kv = int(kv_data.shape[0])
        check(kv_sf is not None and kv_sf.ndim == 1 and kv_sf.shape[0] == seq_kv, func, "kv[1]",
               f"shape ({seq_kv},)", kv_sf)
        assert kv_sf is not None
        check(is_contiguous(kv_sf) and kv_sf.dtype == F32, func, "kv[1]", "a contiguous float32 array", kv_sf)
    _cuda_weights_and_dtype(func, w, seq, heads, arch, out, contiguous=False)
    ks = _check_seq_lens(func, "cu_seq_len_k_start", as_array(cu_seq_len_k_start, func, "cu_seq_len_k_start"), seq)
    ke = _check_seq_lens(func, "cu_seq_len_k_end", as_array(cu_seq_len_k_end, func, "cu_seq_len_k_end"), seq)
    if max_k > 0 and clean:
        raise arg_error(func, "clean_logits", "False with compressed logits (max_seqlen_k > 0)", "True")
    _check_ranges(func, ks, ke, seq_kv, max_k)

    # Output allocation (spec 9.1): rows align(seq, 128 / H), row stride 1024-byte aligned.
    elem = 4 if out is fm.F32 else 2
    block_q = 128 // heads
    if max_k == 0:
        stride, width = align(seq_kv + _SPLIT_KV, 1024 // elem), seq_kv
    else:
        stride, width = align(align(max_k, _SPLIT_KV), 1024 // elem), max_k
    alloc, view = _allocate(align(seq, block_q), stride, seq, width, out)

    if fp4:
        assert q_sf is not None and kv_sf is not None
        q_scales = _ue8m0_scales(fm.unpack_ue8m0_int32(q_sf[..., None])[..., : d // 32])
        keys: _KeySource = _PlainKeys(kv_data, True, _ue8m0_scales(fm.unpack_ue8m0_int32(kv_sf[:, None])[:, : d // 32]),
                                      None)
        queries = _Queries(q_data, True, q_scales)
    else:
        assert kv_sf is not None
        keys = _PlainKeys(kv_data, False, None, kv_sf.astype(np.float64))
        queries = _Queries(q_data, False, None)
    shift = ks if max_k > 0 else np.zeros(seq, np.int64)
    plan = _Plan(func, "sm90" if arch == 9 else "sm100", queries, keys, w, out, ks, ke, shift, active_accumulation())

    def defined() -> np.ndarray:
        if max_k == 0 and clean:
            return np.ones(view.shape, bool)
        return _range_mask(view.shape, ks - shift, ke - shift)

    if max_k == 0 and clean:
        _clean(alloc, seq, seq_kv, ks, ke)
    _execute(plan, view, defined, (lambda: ~_range_mask(view.shape, ks, ke)) if max_k == 0 and clean else None)
    return from_numpy(view, kind)


def _fp8_fp4_mqa_logits_cuda(q: Any, kv: Any, weights: Any, cu_seq_len_k_start: Any, cu_seq_len_k_end: Any,
                             clean_logits: bool = True, max_seqlen_k: int = 0,
                             logits_dtype: Any = _TORCH_FLOAT32) -> Any:
    """Lightning-indexer logits of FP8 or FP4 queries against contiguous keys (DeepGEMM, spec 9.1).

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
    return _mqa_logits_cuda("fp8_fp4_mqa_logits", q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end,
                            clean_logits, max_seqlen_k, logits_dtype)


def _fp8_mqa_logits_cuda(q: Any, kv: Any, weights: Any, cu_seq_len_k_start: Any, cu_seq_len_k_end: Any,
                         clean_logits: bool = True, max_seqlen_k: int = 0) -> Any:
    """Legacy FP8 MQA logits (spec 9.2): ``fp8_fp4_mqa_logits((q, None), kv, ..., logits_dtype=float32)``.

    q: bare float8_e4m3fn (seq_len, H, D); the rest as :func:`fp8_fp4_mqa_logits`.
    """
    return _mqa_logits_cuda("fp8_mqa_logits", (q, None), kv, weights, cu_seq_len_k_start, cu_seq_len_k_end,
                            clean_logits, max_seqlen_k, _TORCH_FLOAT32)


def _ascend_heads(func: str, heads: int, x: Any) -> None:
    check(4 <= heads <= 64 and heads % 4 == 0, func, "q[0]", "num_heads a multiple of 4 in [4, 64]", x)


def _ascend_q_scales(func: str, q_sf: np.ndarray | None, rows: int, heads: int, pairs: int,
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
    return _ue8m0_scales(by).reshape(rows, heads, 2 * pairs)


def _fp8_fp4_mqa_logits_ascend(q: Any, kv: Any, weights: Any, cu_seq_len_k_start: Any, cu_seq_len_k_end: Any,
                               max_seqlen_k: int) -> Any:
    """Lightning-indexer logits on DeepGEMM-Ascend (port 1.8, 2.5): MX-scaled Q and KV, bf16 out.

    q = (float8_e4m3fn (T, H, D) or int8 packed E2M1 (T, H, D / 2), int16 UE8M0 pairs
    (T * H, D / 64) or (T, H, D / 64), any strides) - the Q scales are mandatory (byte 127 = 1.0).
    kv = (same format (S, D) or (S, D / 2), int16 (S, D / 64)); q and kv contiguous.
    H a multiple of 4 in [4, 64]; D in {64, 128}; weights bfloat16 (T, H), stride(1) == 1;
    cu_seq_len_k_start / _end int32 (T,); max_seqlen_k > 0 (required).
    Returns bfloat16 (T, max_seqlen_k), row stride align(max_seqlen_k, 256), compressed:

        logits[i, t] = sum_h weights[i, h] * relu(q[i, h] . kv[start[i] + t]),  t < end[i] - start[i]

    (scales folded into the dot products); the rest of each row is unspecified: NaN here.
    """
    func = "fp8_fp4_mqa_logits"
    kind = caller_kind(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end)
    q_data, q_sf = as_pair(q, func, "q", sf_optional=True)
    kv_data, kv_sf = as_pair(kv, func, "kv", sf_optional=True)
    w = as_array(weights, func, "weights")
    check(q_data.ndim == 3, func, "q[0]", "a 3-D array (num_q_tokens, num_heads, head_dim)", q_data)
    check(kv_data.ndim == 2, func, "kv[0]", "a 2-D array (num_kv_tokens, head_dim)", kv_data)
    check(w.ndim == 2, func, "weights", "a 2-D array", w)
    check(w.dtype == BF16, func, "weights", "bfloat16 (Ascend MQA logits expects bf16 weights)", w)
    max_k = int_arg(func, "max_seqlen_k", max_seqlen_k)
    t_q, heads = int(q_data.shape[0]), int(q_data.shape[1])
    fp4 = q_data.dtype == I8
    d = int(q_data.shape[2]) * (2 if fp4 else 1)
    seq_kv = int(kv_data.shape[0])
    _ascend_heads(func, heads, q_data)
    check(d in (64, 128), func, "q[0]", "head_dim 64 or 128", q_data)
    check(max_k > 0, func, "max_seqlen_k", "a positive int", repr(max_k))
    _check_weights(func, w, t_q, heads, (BF16,))
    ks = _check_seq_lens(func, "cu_seq_len_k_start", as_array(cu_seq_len_k_start, func, "cu_seq_len_k_start"), t_q)
    ke = _check_seq_lens(func, "cu_seq_len_k_end", as_array(cu_seq_len_k_end, func, "cu_seq_len_k_end"), t_q)
    check(is_contiguous(q_data), func, "q[0]", "a contiguous array", q_data)
    check(is_contiguous(kv_data), func, "kv[0]", "a contiguous array", kv_data)
    check(kv_data.shape[1] == (d // 2 if fp4 else d), func, "kv[0]", f"shape ({seq_kv}, {d // 2 if fp4 else d})",
           kv_data)
    check((q_data.dtype, kv_data.dtype) in ((E4M3, E4M3), (I8, I8)), func, "kv[0]",
           "q and kv both float8_e4m3fn or both int8 (packed FP4)", f"q {q_data.dtype}, kv {kv_data.dtype}")
    pairs = d // 64
    q_scales = _ascend_q_scales(func, q_sf, t_q, heads, pairs, four_d=False)
    check(kv_sf is not None and kv_sf.dtype == I16, func, "kv[1]", "dtype int16 (packed UE8M0 pairs)", kv_sf)
    assert kv_sf is not None
    check(kv_sf.ndim == 2 and kv_sf.shape == (seq_kv, pairs), func, "kv[1]", f"shape ({seq_kv}, {pairs})", kv_sf)
    _check_ranges(func, ks, ke, seq_kv, max_k)

    alloc, view = _allocate(t_q, align(max_k, _ASC_ROW_ALIGN), t_q, max_k, fm.BF16)
    keys = _PlainKeys(kv_data, fp4, _ue8m0_scales(fm.unpack_ue8m0_int16(kv_sf)), None)
    plan = _Plan(func, "ascend", _Queries(q_data, fp4, q_scales), keys, w, fm.BF16, ks, ke, ks, active_accumulation())
    _execute(plan, view, lambda: _range_mask(view.shape, np.zeros_like(ks), ke - ks))
    _ = alloc
    return from_numpy(view, kind)


# ----------------------------------------------------------------------------------------------
# paged schedules (get_paged_mqa_logits_metadata)
# ----------------------------------------------------------------------------------------------

def _runs(indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first row, row count) of the maximal runs of equal values."""
    n = indices.size
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    starts = np.flatnonzero(np.concatenate([[True], indices[1:] != indices[:-1]])).astype(np.int64)
    counts = np.diff(np.concatenate([starts, [n]])).astype(np.int64)
    return starts, counts


def _requests(rows: int, next_n: int, indices: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Requests as (first row, rows): groups of next_n rows, or runs of equal ``indices``."""
    if indices is None:
        starts = np.arange(0, rows, next_n, dtype=np.int64) if next_n else np.zeros(0, np.int64)
        return starts, np.full(starts.size, next_n, np.int64)
    return _runs(indices)


def _sm100_schedule(ctx: np.ndarray, next_n: int, num_sms: int, indices: np.ndarray | None) -> np.ndarray:
    """DeepGEMM sm100 (spec 9.3): work = ceil(ctx / 256) * rows per request, split evenly by units."""
    total_rows = ctx.size
    starts, counts = _requests(total_rows, next_n, indices)
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
    """DeepGEMM-Ascend (port 2.5): requests = runs of ``indices``, cost-balanced over the cores."""
    rows = ctx.size
    tile = 64 // heads  # queries per MMAD tile (MAD_M = 64 // H * H)
    starts, counts = _runs(indices)
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


def _check_context_lens_2d(func: str, x: np.ndarray) -> None:
    check(x.ndim == 2, func, "context_lens", "a 2-D array (batch_size, next_n) (only 2D context lens is supported)",
           x)
    check(x.dtype == I32, func, "context_lens", "dtype int32", x)
    check(is_contiguous(x), func, "context_lens", "a contiguous array", x)


def _check_nonnegative(func: str, arg: str, x: np.ndarray) -> None:
    # Note: negative context lengths are rejected (the kernels read them as huge unsigned values).
    bad = np.flatnonzero(x.reshape(-1) < 0)
    if bad.size:
        raise arg_error(func, arg, "non-negative values", f"{int(x.reshape(-1)[bad[0]])} at flat index {int(bad[0])}")


def _check_indices(func: str, idx: np.ndarray, rows: int) -> None:
    check(idx.ndim == 1 and idx.shape[0] == rows, func, "indices", f"a 1-D array of {rows} entries", idx)
    check(is_contiguous(idx), func, "indices", "a contiguous array", idx)
    check(idx.dtype == I32, func, "indices", "dtype int32", idx)


def _cuda_schedule(func: str, context_lens: Any, block_kv: Any, num_sms: Any, indices: Any) -> np.ndarray:
    arch = get_profile().arch_major
    ctx_a = as_array(context_lens, func, "context_lens")
    _check_context_lens_2d(func, ctx_a)
    bkv = int_arg(func, "block_kv", block_kv)
    # Note: num_sms must be at least 1 (DeepGEMM divides the work by it on the device).
    sms = int_arg(func, "num_sms", num_sms, minimum=1)
    batch, next_n = int(ctx_a.shape[0]), int(ctx_a.shape[1])
    idx = as_array(indices, func, "indices", allow_none=True)
    if idx is not None:
        check(arch == 10, func, "indices", "None on sm90 (varlen paged MQA logits need sm100)", idx)
        check(next_n == 1, func, "context_lens", "next_n == 1 with indices (varlen)", ctx_a)
        check(bkv in (32, 64), func, "block_kv", "32 or 64", repr(bkv))
        _check_indices(func, idx, batch)
    elif arch == 10:
        check(bkv in (32, 64), func, "block_kv", "32 or 64 on sm100", repr(bkv))
    else:
        check(bkv == 64, func, "block_kv", "64 on sm90", repr(bkv))
    _check_nonnegative(func, "context_lens", ctx_a)
    ctx = ctx_a.astype(np.int64).reshape(-1)
    if arch == 10:
        check(2 * batch * 4 <= _SMEM_CAPACITY, func, "context_lens",
               f"at most {_SMEM_CAPACITY // 8} requests (the schedule kernel's shared memory)", ctx_a)
        return _sm100_schedule(ctx, next_n, sms, None if idx is None else idx.astype(np.int64))
    check(align(batch, 32) * 4 <= _SMEM_CAPACITY, func, "context_lens",
           f"batch_size <= {_SMEM_CAPACITY // 4} (the schedule kernel's shared memory)", ctx_a)
    # Note: an all-zero schedule (no work) with batch_size a multiple of 32 gives the sentinel row
    # everywhere; DeepGEMM's sm90 kernel reads one shared-memory word past its prefix sums there.
    return _sm90_schedule(ctx, batch, next_n, sms)


def _get_paged_mqa_logits_metadata_cuda(context_lens: Any, block_kv: int, num_sms: int, indices: Any = None) -> Any:
    """The paged kernel's work partition over SMs (DeepGEMM, spec 9.3): int32 (num_sms + 1, 2).

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
    return from_numpy(_cuda_schedule(func, context_lens, block_kv, num_sms, indices), kind)


def _ascend_schedule_checked(func: str, context_lens: Any, num_heads: Any, indices: Any) -> np.ndarray:
    ctx_a = as_array(context_lens, func, "context_lens")
    check(ctx_a.ndim == 2 and ctx_a.shape[1] == 1 and is_contiguous(ctx_a) and ctx_a.dtype == I32, func,
           "context_lens", "a contiguous int32 array (num_q_tokens, 1)", ctx_a)
    rows = int(ctx_a.shape[0])
    idx = as_array(indices, func, "indices")
    _check_indices(func, idx, rows)
    heads = int_arg(func, "num_heads", num_heads)
    check(4 <= heads <= 64 and heads % 4 == 0, func, "num_heads", "a multiple of 4 in [4, 64]", repr(heads))
    cores = int(runtime.get_num_sms())
    check(0 < cores < 256, func, "get_num_sms()", "1..255 cores", repr(cores))
    ub = align(align(8 * rows + 32, 32) + 8 * (cores + 1), 32)
    check(ub <= _ASC_UB_BYTES, func, "context_lens", "num_q_tokens small enough for the schedule kernel's "
           f"unified buffer ({_ASC_UB_BYTES} bytes)", f"{rows} rows need {ub} bytes")
    _check_nonnegative(func, "context_lens", ctx_a)
    return _ascend_schedule(ctx_a.astype(np.int64).reshape(-1), idx.astype(np.int64), heads, cores)


def _get_paged_mqa_logits_metadata_ascend(context_lens: Any, num_heads: int, indices: Any) -> Any:
    """The paged kernel's schedule on DeepGEMM-Ascend (port 2.5): int32 (get_num_sms() + 1, 2).

    context_lens int32 (B, 1) contiguous; num_heads a multiple of 4 in [4, 64]; indices int32 (B,)
    (required: runs of equal values are requests).  A request of nq rows and context L (its last
    row's) costs ceil(L/512) - 1 full splits plus the tail, split cost ceil(tokens/128) * c0 + 2 with
    c0 = 2 + 2 ceil(nq / tile) (tile = 64 // H > 1) or ceil(nq / tile); core c starts at cost
    c * (W // C) + min(c, W % C): row (first row of the owning request, split), else (B, 0).
    """
    func = "get_paged_mqa_logits_metadata"
    kind = caller_kind(context_lens, indices)
    return from_numpy(_ascend_schedule_checked(func, context_lens, num_heads, indices), kind)


# ----------------------------------------------------------------------------------------------
# paged MQA logits
# ----------------------------------------------------------------------------------------------

@dataclass
class _PagedRows:
    """Requests and per-row virtual key ranges of a paged call (after validation)."""

    ks: np.ndarray
    ke: np.ndarray
    base: np.ndarray
    bt_rows: np.ndarray


def _paged_rows(func: str, ctx: np.ndarray, starts: np.ndarray, counts: np.ndarray, bt_rows: np.ndarray,
                block_table: np.ndarray, page: int, num_pages: int, max_context_len: int) -> _PagedRows:
    """Validate context lengths and the block-table entries the kernel reads; lay requests out.

    Request r (rows starts[r] .. + counts[r]) is computed up to its last row's context length
    ctx_r, reading pages block_table[bt_rows[r], :ceil(ctx_r / page)].
    """
    rows = ctx.size
    _check_nonnegative(func, "context_lens", ctx)
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
    return _PagedRows(ks, ks + ctx, base, bt_rows)


def _check_schedule(func: str, meta: np.ndarray, expected: np.ndarray, how: str) -> None:
    check(meta.ndim == 2 and meta.shape == expected.shape, func, "schedule_meta",
           f"shape {expected.shape} (get_num_sms() + 1, 2)", meta)
    check(meta.dtype == I32 and is_contiguous(meta), func, "schedule_meta", "a contiguous int32 array", meta)
    # Note: the schedule must equal what get_paged_mqa_logits_metadata returns for these inputs
    # (DeepGEMM checks only shape, dtype and contiguity; a stale one makes the device skip or
    # repeat work).  The logits never depend on it.
    diff = np.argwhere(meta != expected)
    if diff.size:
        r = int(diff[0][0])
        raise arg_error(func, "schedule_meta", f"the schedule {how} returns for these inputs",
                        f"row {r} = {tuple(int(v) for v in meta[r])}, expected {tuple(int(v) for v in expected[r])}")


def _paged_cuda(func: str, q: Any, kv_cache: Any, weights: Any, context_lens: Any, block_table: Any,
                schedule_meta: Any, max_context_len: Any, clean_logits: Any, logits_dtype: Any, indices: Any) -> Any:
    profile = get_profile()
    arch = profile.arch_major
    kind = caller_kind(q, kv_cache, weights, context_lens, block_table, schedule_meta, indices)
    q_data, q_sf = as_pair(q, func, "q", sf_optional=True)
    cache = as_array(kv_cache, func, "kv_cache")
    w = as_array(weights, func, "weights")
    ctx_a = as_array(context_lens, func, "context_lens")
    bt = as_array(block_table, func, "block_table")
    meta = as_array(schedule_meta, func, "schedule_meta")
    idx = as_array(indices, func, "indices", allow_none=True)
    num_sms = int(runtime.get_num_sms())
    max_len = int_arg(func, "max_context_len", max_context_len, minimum=0)
    clean = bool_arg(func, "clean_logits", clean_logits)
    out = _logits_format(func, logits_dtype)
    fp4 = q_sf is not None
    check(q_data.ndim == 4, func, "q[0]", "a 4-D array (batch_size, next_n, num_heads, head_dim)", q_data)
    batch, next_n, heads = (int(v) for v in q_data.shape[:3])
    d = int(q_data.shape[3]) * (2 if fp4 else 1)
    check(next_n >= 1, func, "q[0]", "next_n >= 1", q_data)
    if fp4:
        check(arch == 10, func, "q[1]", "None on sm90 (FP4 paged MQA logits need sm100)", q_sf)
        check(q_data.dtype == I8, func, "q[0]", "int8 packed FP4 (q[1] is given)", q_data)
        _cuda_heads(func, "q[0]", arch, heads, True, q_data)
        check(d in (64, 128), func, "q[0]", "head_dim 64 or 128 for FP4", q_data)
        check(is_contiguous(q_data), func, "q[0]", "a contiguous array", q_data)
        assert q_sf is not None
        check(q_sf.ndim == 3 and q_sf.shape == (batch, next_n, heads), func, "q[1]",
               f"shape ({batch}, {next_n}, {heads})", q_sf)
        check(is_contiguous(q_sf) and q_sf.dtype == I32, func, "q[1]", "a contiguous int32 array (packed UE8M0)", q_sf)
        value_bytes = d // 2
    else:
        check(q_data.dtype == E4M3, func, "q[0]", "float8_e4m3fn (q[1] is None)", q_data)
        _cuda_heads(func, "q[0]", arch, heads, False, q_data)
        check(d in (32, 64, 128), func, "q[0]", "head_dim 32, 64 or 128", q_data)
        check(is_contiguous(q_data), func, "q[0]", "a contiguous array", q_data)
        value_bytes = d
    check(cache.ndim == 4, func, "kv_cache", "a 4-D uint8 array (num_blocks, block_kv, 1, bytes per token)", cache)
    num_pages, page = int(cache.shape[0]), int(cache.shape[1])
    check(page in ((32, 64) if arch == 10 else (64,)), func, "kv_cache",
           "block_kv 32 or 64 (sm100)" if arch == 10 else "block_kv 64 (sm90)", cache)
    width = value_bytes + 4
    check(cache.shape[2] == 1 and cache.shape[3] == width, func, "kv_cache",
           f"shape (num_blocks, {page}, 1, {width}) = head_dim{' / 2' if fp4 else ''} + 4 bytes per token", cache)
    check(cache.dtype == U8, func, "kv_cache", "dtype uint8", cache)
    check(cache.size == 0 or (strides(cache)[1] == width and strides(cache)[3] == 1), func, "kv_cache",
           f"stride(1) == {width} and stride(3) == 1", cache)
    check(cache.size == 0 or cache.strides[0] % 4 == 0, func, "kv_cache",
           "stride(0) (bytes per block) a multiple of 4", cache)
    _check_weights(func, w, batch * next_n, heads, (F32, BF16) if arch == 10 else (F32,), contiguous=not fp4)
    if w.dtype == BF16 and out is not fm.BF16:
        raise arg_error(func, "logits_dtype", "bfloat16 with bfloat16 weights", "float32")
    check(bt.ndim == 2 and bt.shape[0] == batch, func, "block_table", f"a 2-D array ({batch}, max_blocks)", bt)
    check(unit_stride(bt, 1), func, "block_table", "stride(1) == 1", bt)
    check(bt.dtype == I32, func, "block_table", "dtype int32", bt)
    if idx is not None:
        check(arch == 10 and next_n == 1, func, "indices", "None unless sm100 with next_n == 1 (varlen)", idx)
        _check_indices(func, idx, batch)
    _check_context_lens_2d(func, ctx_a)
    check(ctx_a.shape == (batch, next_n), func, "context_lens", f"shape ({batch}, {next_n})", ctx_a)
    if clean:
        raise arg_error(func, "clean_logits", "False (cleaning needs 1-D context lens; only 2-D context lens are "
                        "supported)", "True")
    check(meta.ndim == 2 and meta.shape == (num_sms + 1, 2), func, "schedule_meta",
           f"shape ({num_sms + 1}, 2) (get_num_sms() + 1, 2)", meta)
    expected = _cuda_schedule("get_paged_mqa_logits_metadata", ctx_a, page, num_sms, idx)
    _check_schedule(func, meta, expected, f"get_paged_mqa_logits_metadata(context_lens, {page}, {num_sms}, indices)")

    ctx = ctx_a.astype(np.int64).reshape(-1)
    rows = batch * next_n
    starts, counts = _requests(rows, next_n, None if idx is None else idx.astype(np.int64))
    bt_rows = starts if idx is not None else starts // next_n
    pr = _paged_rows(func, ctx, starts, counts, bt_rows, bt, page, num_pages, max_len)

    elem = 4 if out is fm.F32 else 2
    alloc, view = _allocate(rows, align(align(max_len, _SPLIT_KV), 1024 // elem), rows, max_len, out)
    layout = _PagedLayout("deepgemm", page, value_bytes, 4)
    keys = _PagedKeys(cache, layout, fp4, d, "cuda", bt, pr.bt_rows, pr.base)
    if fp4:
        assert q_sf is not None
        by = fm.unpack_ue8m0_int32(q_sf.reshape(rows, heads)[..., None])[..., : d // 32]
        queries = _Queries(q_data.reshape(rows, heads, -1), True, _ue8m0_scales(by))
    else:
        queries = _Queries(q_data.reshape(rows, heads, d), False, None)
    plan = _Plan(func, "sm90" if arch == 9 else "sm100", queries, keys, w, out, pr.ks, pr.ke, pr.ks,
                 active_accumulation())
    _execute(plan, view, lambda: _range_mask(view.shape, np.zeros(rows, np.int64), ctx))
    _ = alloc
    return from_numpy(view, kind)


def _fp8_fp4_paged_mqa_logits_cuda(q: Any, kv_cache: Any, weights: Any, context_lens: Any, block_table: Any,
                                   schedule_meta: Any, max_context_len: int, clean_logits: bool = False,
                                   logits_dtype: Any = _TORCH_FLOAT32, indices: Any = None) -> Any:
    """Lightning-indexer logits against a paged KV cache (DeepGEMM, spec 9.4).

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
    return _paged_cuda("fp8_fp4_paged_mqa_logits", q, kv_cache, weights, context_lens, block_table, schedule_meta,
                       max_context_len, clean_logits, logits_dtype, indices)


def _fp8_paged_mqa_logits_cuda(q: Any, kv_cache: Any, weights: Any, context_lens: Any, block_table: Any,
                               schedule_meta: Any, max_context_len: int, clean_logits: bool = False,
                               indices: Any = None) -> Any:
    """Legacy FP8 paged MQA logits (spec 9.5): bare float8_e4m3fn q, float32 logits; see
    :func:`fp8_fp4_paged_mqa_logits`."""
    return _paged_cuda("fp8_paged_mqa_logits", (q, None), kv_cache, weights, context_lens, block_table,
                       schedule_meta, max_context_len, clean_logits, _TORCH_FLOAT32, indices)


def _fp8_fp4_paged_mqa_logits_ascend(q: Any, kv_cache: Any, weights: Any, context_lens: Any, block_table: Any,
                                     schedule_meta: Any, max_context_len: int, indices: Any,
                                     use_ascend_kv_layout: bool = False) -> Any:
    """Lightning-indexer logits against a paged KV cache on DeepGEMM-Ascend (port 1.8, 2.5).

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
    func = "fp8_fp4_paged_mqa_logits"
    kind = caller_kind(q, kv_cache, weights, context_lens, block_table, schedule_meta, indices)
    q_data, q_sf = as_pair(q, func, "q", sf_optional=True)
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
    max_len = int_arg(func, "max_context_len", max_context_len, minimum=0)
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
    _ascend_heads(func, heads, q_data)
    check(q_data.shape[1] == 1, func, "q[0]", "next_n == 1 (q.size(1))", q_data)
    check(q_data.dtype in (E4M3, I8), func, "q[0]", "float8_e4m3fn or int8 (packed FP4)", q_data)
    check(is_contiguous(q_data), func, "q[0]", "a contiguous array", q_data)
    check(q_sf is not None and q_sf.dtype == I16, func, "q[1]", "int16 Q scale factors", q_sf)
    check(indices is not None, func, "indices", "an int32 array (num_q_tokens,) (required)", "None")
    idx = as_array(indices, func, "indices")
    _check_indices(func, idx, rows)
    _check_weights(func, w, rows, heads, (BF16,))
    check(ctx_a.shape == (rows, 1), func, "context_lens", f"shape ({rows}, 1)", ctx_a)
    check(bt.shape[0] == rows, func, "block_table", f"{rows} rows", bt)
    q_scales = _ascend_q_scales(func, q_sf, rows, heads, pairs, four_d=True)
    cores = int(runtime.get_num_sms())
    check(meta.shape == (cores + 1, 2), func, "schedule_meta", f"shape ({cores + 1}, 2) (get_num_sms() + 1, 2)", meta)
    expected = _ascend_schedule_checked("get_paged_mqa_logits_metadata", ctx_a, heads, idx)
    _check_schedule(func, meta, expected, f"get_paged_mqa_logits_metadata(context_lens, {heads}, indices)")

    ctx = ctx_a.astype(np.int64).reshape(-1)
    starts, counts = _runs(idx.astype(np.int64))
    pr = _paged_rows(func, ctx, starts, counts, starts, bt, page, int(cache.shape[0]), max_len)
    alloc, view = _allocate(rows, align(max_len, _ASC_ROW_ALIGN), rows, max_len, fm.BF16)
    layout = _PagedLayout("ascend_nz" if use_nz else "ascend", page, d_store, sf_bytes)
    keys = _PagedKeys(cache, layout, fp4, d, "ascend", bt, pr.bt_rows, pr.base)
    queries = _Queries(q_data.reshape(rows, heads, d_store), fp4, q_scales)
    plan = _Plan(func, "ascend", queries, keys, w, fm.BF16, pr.ks, pr.ke, pr.ks, active_accumulation())
    _execute(plan, view, lambda: _range_mask(view.shape, np.zeros(rows, np.int64), ctx))
    _ = alloc
    return from_numpy(view, kind)


# ----------------------------------------------------------------------------------------------
# public names
# ----------------------------------------------------------------------------------------------

_LEGACY_MISSING = {"deepgemm-ascend": "DeepGEMM-Ascend has no legacy MQA wrappers; use fp8_fp4_mqa_logits / "
                                      "fp8_fp4_paged_mqa_logits with int16 Q scales"}

fp8_fp4_mqa_logits = profiled("fp8_fp4_mqa_logits", deepgemm=_fp8_fp4_mqa_logits_cuda,
                              deepgemm_ascend=_fp8_fp4_mqa_logits_ascend)
fp8_mqa_logits = profiled("fp8_mqa_logits", _LEGACY_MISSING, deepgemm=_fp8_mqa_logits_cuda)
get_paged_mqa_logits_metadata = profiled("get_paged_mqa_logits_metadata",
                                         deepgemm=_get_paged_mqa_logits_metadata_cuda,
                                         deepgemm_ascend=_get_paged_mqa_logits_metadata_ascend)
fp8_fp4_paged_mqa_logits = profiled("fp8_fp4_paged_mqa_logits", deepgemm=_fp8_fp4_paged_mqa_logits_cuda,
                                    deepgemm_ascend=_fp8_fp4_paged_mqa_logits_ascend)
fp8_paged_mqa_logits = profiled("fp8_paged_mqa_logits", _LEGACY_MISSING, deepgemm=_fp8_paged_mqa_logits_cuda)

