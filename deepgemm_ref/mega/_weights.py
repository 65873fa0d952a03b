"""Mega-MoE weight layouts: both targets' ``transform_weights_for_mega_moe``, its exact inverse, and
the readers that turn transformed weights into canonical core operands.

Canonical (un-transformed) form, per local expert ``i``: L1 ``(2I, H)`` with rows ``[0, I)`` gate
and ``[I, 2I)`` up, L2 ``(H, I)``, each with one UE8M0 scale per row and 32 K-elements.

DeepGEMM
    L1 rows are interleaved by 8: transformed row ``16 b + 8 s + j`` is canonical row
    ``s I + 8 b + j`` (``s`` 0 = gate, 1 = up).  The SF tensors (layout 2: int32, MN-major,
    TMA-aligned) get the same interleave and then the UTCCP transposition inside every chunk of
    128 rows: output row ``4 j + i`` is input row ``32 i + j``.  Results are written into
    ``empty_like(input)``, so strides are preserved; W2 is returned unchanged (same object).
    BF16 mode: W1 interleaved, W2 unchanged.
DeepGEMM-Ascend
    L1 rows are grouped in 256-row blocks of 128 gate rows followed by the matching 128 up rows;
    L2 rows in plain 256-row blocks.  Data become ``(..., N / 256, 256, K')`` (FP4 ``K' = K / 2``);
    e4m3 data are additionally stored in 32-byte NZ fragments (for each 32-column fragment the 256
    rows are contiguous).  SFs (int16 pairs) get the same row order and are transposed per block to
    ``(..., N / 256, K / 64, 256)``; routed FP4 SF bytes are raised by 6 (255 kept; 249..254 raise
    ValueError) because the kernel decodes E2M1 as E4M3 values divided by 64.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import core
from .. import formats as fm
from ..errors import DGArgumentError, arg_error
from ..interop import caller_kind, from_numpy, to_numpy
from ..toolkit.args import E4M3, I8, I16, packed_fp4
from ..toolkit.scales import sf_values

__all__ = [
    "transform_cuda",
    "transform_ascend",
    "inverse_cuda",
    "inverse_ascend",
    "CudaFp4Weights",
    "CudaBf16Weights",
    "AscendWeights",
    "PlainWeights",
    "interleave8_rows",
    "utccp_rows",
    "ascend_l1_rows",
]

I32 = np.dtype(np.int32)
_ASCEND_BLOCK = 256
_FP4_SF_BIAS = 6
_TRANSFORM = "transform_weights_for_mega_moe"
_INVERSE = "inverse_transform_weights_for_mega_moe"


def _np(x: Any, func: str, arg: str) -> np.ndarray:
    xa = to_numpy(x, func, arg)
    if not isinstance(xa, np.ndarray):
        raise arg_error(func, arg, "an array or torch CPU tensor", xa, utility=True)
    return xa


# ----------------------------------------------------------------------------------------------
# row permutations (index arrays: canonical row -> transformed row)
# ----------------------------------------------------------------------------------------------

def interleave8_rows(n: int) -> np.ndarray:
    """DeepGEMM's gate/up interleave: transformed row of every canonical row (n = 2I, I % 8 == 0)."""
    c = np.arange(n)
    half = n // 2
    s, rem = c // half, c % half
    return 16 * (rem // 8) + 8 * s + rem % 8


def utccp_rows(n: int) -> np.ndarray:
    """DeepGEMM's UTCCP transposition: output row of every input row (n % 128 == 0)."""
    p = np.arange(n)
    return (p // 128) * 128 + 4 * (p % 32) + (p % 128) // 32


def ascend_l1_rows(n: int) -> np.ndarray:
    """DeepGEMM-Ascend's 128 + 128 interleave: transformed row of every canonical row (n = 2I)."""
    c = np.arange(n)
    half = n // 2
    s, rem = c // half, c % half
    return 256 * (rem // 128) + 128 * s + rem % 128


def _permute_rows(t: np.ndarray, rows_of_canonical: np.ndarray, inverse: bool) -> np.ndarray:
    """Logical row permutation along axis 1 of (G, n, ...): forward out[:, rows[c]] = t[:, c]."""
    if inverse:
        return np.ascontiguousarray(t[:, rows_of_canonical])
    out = np.empty_like(t)
    out[:, rows_of_canonical] = t
    return out


def _dense(t: np.ndarray) -> bool:
    """Non-overlapping and dense: the elements fill exactly ``t.size`` consecutive slots."""
    expect = t.itemsize
    dims = sorted(((st, s) for s, st in zip(t.shape, t.strides, strict=True) if s > 1))
    for stride, size in dims:
        if stride != expect:
            return False
        expect *= size
    return True


def _into_like(template: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``torch.empty_like(template).copy_(values)``: new memory with exactly ``template``'s strides
    when it is dense (torch's preserve_format), else C order."""
    if template.size and _dense(template) and all(s >= 0 for s in template.strides):
        buf = np.empty(template.size, template.dtype)
        out = np.lib.stride_tricks.as_strided(buf, template.shape, template.strides, writeable=True)
    else:
        out = np.empty(template.shape, template.dtype)
    out[...] = values
    return out


# ----------------------------------------------------------------------------------------------
# DeepGEMM
# ----------------------------------------------------------------------------------------------

def _cuda_interleave(func: str, arg: str, t: np.ndarray, inverse: bool) -> np.ndarray:
    if t.ndim < 2:
        raise arg_error(func, arg, "a grouped tensor (num_groups, 2 * intermediate_hidden, ...)", t, utility=True)
    n = t.shape[1]
    if n % 16:
        raise arg_error(func, arg, "dim 1 (2 * intermediate_hidden) a multiple of 16 (gate/up interleave by 8)",
                        t, utility=True)
    return _into_like(t, _permute_rows(t, interleave8_rows(n), inverse))


def _cuda_utccp(func: str, arg: str, sf: np.ndarray, inverse: bool) -> np.ndarray:
    if sf.dtype != I32 or sf.ndim != 3 or sf.shape[1] % 128:
        raise arg_error(func, arg, "an int32 (num_groups, mn, packed_sf_k) SF tensor with mn % 128 == 0 "
                        "(packed UE8M0, layout 2)", sf, utility=True)
    return _into_like(sf, _permute_rows(sf, utccp_rows(sf.shape[1]), inverse))


def _check_activation(func: str, activation: Any) -> None:
    if activation != "swiglu":
        raise arg_error(func, "activation", "'swiglu' (the only activation)", repr(activation), utility=True)


def _cuda(func: str, l1_weights: Any, l2_weights: Any, activation: Any, inverse: bool) -> tuple[Any, Any]:
    _check_activation(func, activation)
    kind = caller_kind(l1_weights, l2_weights)
    if isinstance(l1_weights, tuple):
        if len(l1_weights) != 2 or not isinstance(l2_weights, (tuple, list)) or len(l2_weights) != 2:
            raise arg_error(func, "l1_weights", "(weights, sf) pairs for both layers", repr(type(l2_weights)),
                            utility=True)
        w1 = _np(l1_weights[0], func, "l1_weights[0]")
        s1 = _np(l1_weights[1], func, "l1_weights[1]")
        s2 = _np(l2_weights[1], func, "l2_weights[1]")
        if inverse:
            l1_w = _cuda_interleave(func, "l1_weights[0]", w1, True)
            l1_sf = _cuda_interleave(func, "l1_weights[1]", _cuda_utccp(func, "l1_weights[1]", s1, True), True)
        else:
            l1_w = _cuda_interleave(func, "l1_weights[0]", w1, False)
            l1_sf = _cuda_utccp(func, "l1_weights[1]", _cuda_interleave(func, "l1_weights[1]", s1, False), False)
        l2_sf = _cuda_utccp(func, "l2_weights[1]", s2, inverse)
        return ((from_numpy(l1_w, kind), from_numpy(l1_sf, kind)), (l2_weights[0], from_numpy(l2_sf, kind)))
    w1 = _np(l1_weights, func, "l1_weights")
    return from_numpy(_cuda_interleave(func, "l1_weights", w1, inverse), kind), l2_weights


def transform_cuda(l1_weights: Any, l2_weights: Any, activation: str = "swiglu") -> tuple[Any, Any]:
    """DeepGEMM's ``transform_weights_for_mega_moe`` (see the module docstring)."""
    return _cuda(_TRANSFORM, l1_weights, l2_weights, activation, inverse=False)


def inverse_cuda(l1_weights: Any, l2_weights: Any, activation: str = "swiglu") -> tuple[Any, Any]:
    """The exact inverse of DeepGEMM's transform: transformed weights back to the caller's layout."""
    return _cuda(_INVERSE, l1_weights, l2_weights, activation, inverse=True)


# ----------------------------------------------------------------------------------------------
# DeepGEMM-Ascend
# ----------------------------------------------------------------------------------------------

def _nz(t: np.ndarray, inverse: bool) -> np.ndarray:
    """e4m3 (..., rows, K) <-> 32-byte NZ fragments: memory [..][K / 32][rows][32]."""
    *lead, rows, k = t.shape
    u = t.view(np.uint8)
    if inverse:
        out = u.reshape(*lead, k // 32, rows, 32).swapaxes(-3, -2)
    else:
        out = u.reshape(*lead, rows, k // 32, 32).swapaxes(-3, -2)
    return np.ascontiguousarray(out).reshape(t.shape).view(t.dtype)


def _ascend_rows(t: np.ndarray, l1: bool, inverse: bool) -> np.ndarray:
    """(..., N, k) <-> (..., N / 256, 256, k) with the L1 128 + 128 interleave."""
    if inverse:
        *lead, nb, blk, k = t.shape
        if l1:
            half = blk // 2
            gate = t[..., :half, :].reshape(*lead, nb * half, k)
            up = t[..., half:, :].reshape(*lead, nb * half, k)
            return np.ascontiguousarray(np.concatenate([gate, up], axis=-2))
        return np.ascontiguousarray(t.reshape(*lead, nb * blk, k))
    *lead, n, k = t.shape
    if l1:
        half = n // 2
        gran = _ASCEND_BLOCK // 2
        gate = t[..., :half, :].reshape(*lead, half // gran, gran, k)
        up = t[..., half:, :].reshape(*lead, half // gran, gran, k)
        return np.ascontiguousarray(np.stack([gate, up], axis=-3).reshape(*lead, half // gran, _ASCEND_BLOCK, k))
    return np.ascontiguousarray(t.reshape(*lead, n // _ASCEND_BLOCK, _ASCEND_BLOCK, k))


def _fp4_sf_bias(func: str, arg: str, sf: np.ndarray, inverse: bool) -> np.ndarray:
    b = sf.view(np.uint8)
    if inverse:
        bad = (b < _FP4_SF_BIAS) & (b != 255)
        if np.any(bad):
            raise arg_error(func, arg, "FP4 SF bytes in 6..254 or 255 (the image of the +6 transform)",
                            f"byte {int(b[bad].flat[0])}")
        out = np.where(b == 255, b, b - _FP4_SF_BIAS)
    else:
        if np.any((b > 254 - _FP4_SF_BIAS) & (b != 255)):
            raise DGArgumentError(f"{func}: {arg}: FP4 weight scale exponent must be 0..248 or 255")
        out = np.where(b == 255, b, b + _FP4_SF_BIAS)
    return np.ascontiguousarray(out.astype(np.uint8)).view(I16)


def _ascend(func: str, l1_weights: Any, l2_weights: Any, activation: Any, inverse: bool) -> tuple[Any, Any]:
    _check_activation(func, activation)
    if not isinstance(l1_weights, tuple) or not isinstance(l2_weights, tuple):
        raise arg_error(func, "l1_weights", "(weights, sf) tuples for both layers (DeepGEMM-Ascend has no BF16 mode)",
                        f"{type(l1_weights).__name__}, {type(l2_weights).__name__}", utility=True)
    if len(l1_weights) != 2 or len(l2_weights) != 2:
        raise arg_error(func, "l1_weights", "(weights, sf) pairs", f"lengths {len(l1_weights)}, {len(l2_weights)}",
                        utility=True)
    kind = caller_kind(l1_weights, l2_weights)
    w1, s1 = _np(l1_weights[0], func, "l1_weights[0]"), _np(l1_weights[1], func, "l1_weights[1]")
    w2, s2 = _np(l2_weights[0], func, "l2_weights[0]"), _np(l2_weights[1], func, "l2_weights[1]")
    w1, w2 = packed_fp4(w1), packed_fp4(w2)
    if w1.dtype != w2.dtype or w1.dtype not in (I8, E4M3):
        raise arg_error(func, "l1_weights[0]", "int8 (packed FP4, routed) or float8_e4m3fn (shared) weights, "
                        "the same for both layers", f"{w1.dtype} and {w2.dtype}", utility=True)
    if s1.dtype != I16 or s2.dtype != I16:
        raise arg_error(func, "l1_weights[1]", "int16 UE8M0-pair SFs for both layers", f"{s1.dtype} and {s2.dtype}",
                        utility=True)
    fp4 = w1.dtype == I8
    out = []
    for layer, (w, s, name) in enumerate(((w1, s1, "l1_weights"), (w2, s2, "l2_weights"))):
        l1 = layer == 0
        if inverse:
            if w.ndim not in (3, 4) or w.shape[-2] != _ASCEND_BLOCK or s.ndim != w.ndim or \
                    s.shape[:-2] != w.shape[:-2] or s.shape[-1] != _ASCEND_BLOCK:
                raise arg_error(func, name, "transformed (..., N / 256, 256, K') data with (..., N / 256, K / 64, 256) "
                                "SFs", f"{w.shape} and {s.shape}", utility=True)
            k = w.shape[-1] * (2 if fp4 else 1)
            if s.shape[-2] * 64 != k or (not fp4 and k % 32):
                raise arg_error(func, f"{name}[1]", f"K / 64 = {k // 64} SF pairs per row", s, utility=True)
            data = _nz(w, True) if not fp4 else w
            wd = _ascend_rows(data, l1, True)
            sf = np.ascontiguousarray(np.swapaxes(s, -1, -2))
            sd = _ascend_rows(sf, l1, True)
            if fp4:
                sd = _fp4_sf_bias(func, f"{name}[1]", sd, True)
        else:
            if w.ndim not in (2, 3) or s.ndim != w.ndim:
                raise arg_error(func, name, "(E_l, N, K') routed or (N, K) shared weights with SFs of the same rank",
                                f"{w.shape} and {s.shape}", utility=True)
            if w.shape[:-1] != s.shape[:-1]:
                raise arg_error(func, f"{name}[1]", f"SF rows matching the weights {w.shape[:-1]}", s, utility=True)
            k = w.shape[-1] * (2 if fp4 else 1)
            if k != s.shape[-1] * 64:
                raise arg_error(func, f"{name}[1]", f"K / 64 = {k / 64:g} SF pairs per row (K = {k})", s, utility=True)
            n = w.shape[-2]
            if l1 and (n % 2 or (n // 2) % (_ASCEND_BLOCK // 2)):
                raise arg_error(func, name, "2 * intermediate_hidden rows with intermediate_hidden % 128 == 0",
                                w, utility=True)
            if not l1 and n % _ASCEND_BLOCK:
                raise arg_error(func, name, f"hidden rows, a multiple of {_ASCEND_BLOCK}", w, utility=True)
            if not fp4 and k % 32:
                raise arg_error(func, name, "K a multiple of 32 (NZ fragments)", w, utility=True)
            wd = _ascend_rows(w, l1, False)
            if not fp4:
                wd = _nz(wd, False)
            sd = np.ascontiguousarray(np.swapaxes(_ascend_rows(s, l1, False), -1, -2))
            if fp4:
                sd = _fp4_sf_bias(func, f"{name}[1]", sd, False)
        out.append((from_numpy(wd, kind), from_numpy(sd, kind)))
    return out[0], out[1]


def transform_ascend(l1_weights: Any, l2_weights: Any, activation: str = "swiglu") -> tuple[Any, Any]:
    """DeepGEMM-Ascend's ``transform_weights_for_mega_moe`` (see the module docstring)."""
    return _ascend(_TRANSFORM, l1_weights, l2_weights, activation, inverse=False)


def inverse_ascend(l1_weights: Any, l2_weights: Any, activation: str = "swiglu") -> tuple[Any, Any]:
    """The exact inverse of DeepGEMM-Ascend's transform (contiguous arrays in the input layout)."""
    return _ascend(_INVERSE, l1_weights, l2_weights, activation, inverse=True)


# ----------------------------------------------------------------------------------------------
# kernel-side readers: transformed weights -> canonical core operands, one expert at a time
# ----------------------------------------------------------------------------------------------

def _codes_operand(codes_packed: np.ndarray, scales: np.ndarray) -> core.Operand:
    return core.Operand(np.asarray(codes_packed).view(np.uint8), scales, 32, codes_fmt=fm.E2M1, packed=True)


_UE8M0 = fm.ue8m0_decode(np.arange(256))  # byte b -> 2^(b - 127) (0 -> 2^-127, 255 -> NaN)
_UE8M0_FP4_ASCEND = np.where(np.arange(256) == 255, np.nan, np.ldexp(1.0, np.arange(256) - 133))


def _sf_bytes(words: np.ndarray) -> np.ndarray:
    """Packed UE8M0 words (n, w) of 2 or 4 bytes -> bytes (n, w * size): byte j of a word is bits 8j..8j+7."""
    words = np.ascontiguousarray(words)
    if sys.byteorder == "little":  # the memory order is the bit order: a view is the unpacking
        return words.view(np.uint8).reshape(words.shape[0], -1)
    unpack = fm.unpack_ue8m0_int32 if words.itemsize == 4 else fm.unpack_ue8m0_int16
    return unpack(words)


def _int32_sf_scales(sf_rows: np.ndarray, k: int) -> np.ndarray:
    """int32 packed per-32 UE8M0 rows (n, ceil(k / 128)) -> float64 scales (n, k / 32)."""
    return _UE8M0[_sf_bytes(sf_rows)[:, : k // 32]]


@dataclass
class CudaFp4Weights:
    """DeepGEMM's transformed FP8xFP4 weights of one rank: W1 (E_l, 2I, H/2) int8, S1 int32 layout 2
    (interleaved, UTCCP), W2 (E_l, H, I/2) int8, S2 int32 layout 2 (UTCCP)."""

    w1: np.ndarray
    s1: np.ndarray
    w2: np.ndarray
    s2: np.ndarray

    @property
    def num_local_experts(self) -> int:
        return int(self.w1.shape[0])

    def l1(self, i: int) -> core.Operand:
        n, h = self.w1.shape[1], self.w1.shape[2] * 2
        rows = interleave8_rows(n)
        sf_rows = utccp_rows(n)[rows]
        return _codes_operand(self.w1[i][rows], _int32_sf_scales(self.s1[i][sf_rows], h))

    def l2(self, i: int) -> core.Operand:
        n, k = self.w2.shape[1], self.w2.shape[2] * 2
        return _codes_operand(self.w2[i], _int32_sf_scales(self.s2[i][utccp_rows(n)], k))


@dataclass
class CudaBf16Weights:
    """DeepGEMM's transformed BF16 weights of one rank: W1 (E_l, 2I, H) interleaved, W2 (E_l, H, I)."""

    w1: np.ndarray
    w2: np.ndarray

    @property
    def num_local_experts(self) -> int:
        return int(self.w1.shape[0])

    def l1(self, i: int) -> core.Operand:
        return core.Operand(self.w1[i][interleave8_rows(self.w1.shape[1])])

    def l2(self, i: int) -> core.Operand:
        return core.Operand(self.w2[i])


@dataclass
class AscendWeights:
    """DeepGEMM-Ascend's transformed weights: routed FP4 (E_l, N/256, 256, K/2) with +6 int16 SFs
    (E_l, N/256, K/64, 256), or the shared experts' e4m3 NZ (N/256, 256, K) (one "expert")."""

    w1: np.ndarray
    s1: np.ndarray
    w2: np.ndarray
    s2: np.ndarray
    shared: bool = False

    @property
    def num_local_experts(self) -> int:
        return 1 if self.shared else int(self.w1.shape[0])

    def _operand(self, w: np.ndarray, s: np.ndarray, l1: bool) -> core.Operand:
        nb, blk, kp = w.shape
        n = nb * blk
        k = kp * (1 if self.shared else 2)
        rows = ascend_l1_rows(n) if l1 else np.arange(n)
        sf = np.swapaxes(s, -1, -2).reshape(n, k // 64)[rows]
        b = _sf_bytes(sf)  # low byte: even K-group
        if self.shared:
            return core.Operand(_nz(w, True).reshape(n, k)[rows], _UE8M0[b], 32)
        # The kernel reads E2M1 codes as E4M3 values divided by 64 with the SF bytes raised by 6:
        # exactly the E2M1 value times 2^(byte - 6 - 127).
        return _codes_operand(w.reshape(n, kp)[rows], _UE8M0_FP4_ASCEND[b])

    def l1(self, i: int) -> core.Operand:
        if self.shared:
            return self._operand(self.w1, self.s1, True)
        return self._operand(self.w1[i], self.s1[i], True)

    def l2(self, i: int) -> core.Operand:
        if self.shared:
            return self._operand(self.w2, self.s2, False)
        return self._operand(self.w2[i], self.s2[i], False)


@dataclass
class PlainWeights:
    """Un-transformed grouped weights, as DeepGEMM's baseline passes them to its grouped GEMMs:
    (G, N, K/2) int8 packed FP4 or (G, N, K) e4m3 with SFs in any form ``layout.sf_values`` reads
    (float32 user form, int32 packed, int16 pairs, UE8M0 bytes; gran 1 x 32), or (G, N, K) bf16."""

    w: np.ndarray
    s: np.ndarray | None
    k: int

    @property
    def num_local_experts(self) -> int:
        return int(self.w.shape[0])

    def operand(self, g: int) -> core.Operand:
        if self.s is None:
            return core.Operand(self.w[g])
        n = self.w.shape[1]
        scales = sf_values(self.s[g], n, self.k, 1, 32, func="mega_moe_grouped_gemm", arg="b[1]")
        if self.w.dtype == I8:
            return _codes_operand(self.w[g], scales)
        return core.Operand(self.w[g], scales, 32)

    def l1(self, i: int) -> core.Operand:
        return self.operand(i)

    def l2(self, i: int) -> core.Operand:
        return self.operand(i)
