"""DeepGEMM's quantisation algorithm written in torch from the specification (spec section 11).

Used by the torch interop tests (the NumPy utilities must give the same bytes as torch running
the same float32 sequence) and by ``benchmarks/bench_quant.py`` (the speed baseline).
``division="cpu"`` divides ``amax / 448`` like torch on CPU tensors; ``"cuda"`` multiplies by
float32(1/448) like torch on CUDA tensors.
"""

from __future__ import annotations

import torch


def _align(x: int, y: int) -> int:
    return (x + y - 1) // y * y


def ceil_pow2(sf: torch.Tensor) -> torch.Tensor:
    bits = sf.abs().float().view(torch.int32)
    e = ((bits >> 23) & 0xFF) + (bits & 0x7FFFFF).ne(0).to(torch.int32)
    return (e.clamp(1, 254) << 23).view(torch.float32)


def _scale(amax: torch.Tensor, divisor: float, division: str) -> torch.Tensor:
    if division == "cpu":
        return amax / divisor
    return amax * torch.tensor(1.0 / divisor, dtype=torch.float32)


def _grouped(x: torch.Tensor, gran_k: int) -> tuple[torch.Tensor, int]:
    m, n = x.shape
    padded = _align(n, gran_k)
    xp = torch.zeros((m, padded), dtype=x.dtype)
    xp[:, :n] = x
    return xp.view(m, padded // gran_k, gran_k), padded


def per_token_cast_to_fp8(x: torch.Tensor, use_ue8m0: bool, gran_k: int = 128, division: str = "cpu"):
    m, n = x.shape
    xv, padded = _grouped(x, gran_k)
    amax = xv.abs().float().amax(dim=2).clamp(1e-4)
    sf = _scale(amax, 448.0, division)
    if use_ue8m0:
        sf = ceil_pow2(sf)
    q = (xv * (1.0 / sf.unsqueeze(2))).to(torch.float8_e4m3fn)
    return q.view(m, padded)[:, :n].contiguous(), sf


def per_token_cast_to_fp4(x: torch.Tensor, use_ue8m0: bool, gran_k: int = 128, division: str = "cpu"):
    m, n = x.shape
    xv, padded = _grouped(x, gran_k)
    amax = xv.abs().float().amax(dim=2).clamp_min(1e-4)
    sf = _scale(amax, 6.0, division)
    if use_ue8m0:
        sf = ceil_pow2(sf)
    y = xv * (1.0 / sf.unsqueeze(2))
    a = y.abs()
    code = torch.zeros_like(y, dtype=torch.uint8)
    for t in (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0):
        code += (a > t).to(torch.uint8)
    code |= ((y < 0) & (code != 0)).to(torch.uint8) << 3
    code = code.view(m, padded)
    packed = (code[:, 0::2] & 0xF) | ((code[:, 1::2] & 0xF) << 4)
    return packed[:, : n // 2].contiguous().view(torch.int8), sf


def per_block_cast_to_fp8(x: torch.Tensor, use_ue8m0: bool, gran_k: int = 128,
                          division: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """One scale per gran_k x gran_k block of the zero-padded input (DeepGEMM's per-block utility)."""
    m, n = x.shape
    pm, pn = _align(m, gran_k), _align(n, gran_k)
    xp = torch.zeros((pm, pn), dtype=x.dtype)
    xp[:m, :n] = x
    xv = xp.view(pm // gran_k, gran_k, pn // gran_k, gran_k)
    amax = xv.abs().float().amax(dim=(1, 3), keepdim=True).clamp(1e-4)
    sf = _scale(amax, 448.0, division)
    if use_ue8m0:
        sf = ceil_pow2(sf)
    q = (xv * (1.0 / sf)).to(torch.float8_e4m3fn)
    return q.view(pm, pn)[:m, :n].contiguous(), sf.view(pm // gran_k, pn // gran_k)
