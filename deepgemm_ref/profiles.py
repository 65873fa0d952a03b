"""Arch profiles: which target the emulator behaves like (``sm90``, ``sm100``, ``ascend950``).

A profile is data: the target library, the arch major, the device's SM (AI-core) count, the
default contiguous-layout alignment, the MMA's block arithmetic, and the kernel rules
(:class:`KernelRules`: what each kernel family accepts, scale formats, alignments, defaults).
The API default is ``sm100`` (DeepGEMM on Blackwell).
Switch with :func:`set_arch` or scope with ``deepgemm_ref.numerics(arch=...)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from ._state import Setting
from .dtypes import BF16, E4M3, F32, I8, I16, I32
from .errors import DGArgumentError

__all__ = ["Profile", "KernelRules", "ScaleRules", "PROFILES", "get_arch", "set_arch", "get_profile", "get_arch_major",
           "DEFAULT_ARCH"]

Target = Literal["deepgemm", "deepgemm-ascend"]


@dataclass(frozen=True, kw_only=True)
class ScaleRules:
    """The scale factors a target's FP8 / FP4 GEMM kernels read.

    gran_k, gran_mn:   accepted K and MN granularities (gran_mn ``"pow2<=128"``: any power of two
                       up to 128; ``"any"``: any, rows broadcast);
                       ``*_expected`` is what the argument error says is expected.
    per_token_sfa:     A's scales must be per token (gran_m 1).
    float32:           how float32 SFs are read: ``"ue8m0"`` (their exponent bytes; the values
                       must be non-negative powers of two) or ``"float"`` (the values themselves).
    disable_cast_error: the error for ``disable_ue8m0_cast=True`` with float32 SFs (``{func}`` and
                       ``{arg}`` filled in), where the kernels need UE8M0.
    packed:            the dtype of the already-packed form (int32: DeepGEMM layout 2; int16:
                       DeepGEMM-Ascend's UE8M0 pairs), or None; ``dtype_expected`` names both forms.
    """

    gran_k: tuple[int, ...]
    gran_k_expected: str
    gran_mn: tuple[int, ...] | Literal["pow2<=128", "any"]
    gran_mn_expected: str
    per_token_sfa: bool
    float32: Literal["ue8m0", "float"]
    disable_cast_error: str | None
    packed: np.dtype | None
    dtype_expected: str


@dataclass(frozen=True, kw_only=True)
class KernelRules:
    """What a target's kernels accept and default to, as data: the kernels read these fields
    instead of testing the arch (the values cite spec / port sections where they come from).

    Dense, grouped and batched FP8 / FP4 GEMMs
        fp8_dtypes:        operand dtypes (E4M3, and int8 packed FP4 where the target has FP4).
        fp8_k_major_only:  every FP8 operand must be K-major (sm90).
        fp8_1d2d:          DeepGEMM sm90's kernel pairing: gran_n 1 runs the 1D1D kernel (float32
                           d with c), otherwise the 1D2D kernel (bf16 d without c); the grouped and
                           batched kernels are 1D2D only (a per-row SFB is rejected).
        operand_mix:       only FP8 x FP8, FP4 x FP4 or FP8 (A) x FP4 (B) (DeepGEMM-Ascend).
        out_dtype_first:   d's dtype is checked before anything else (DeepGEMM-Ascend's order).
        scales:            :class:`ScaleRules`.
    m-grouped GEMMs
        psum_only:         the psum layout is the only one (DeepGEMM-Ascend).
        zero_psum_gaps:    True: psum gap rows always receive +0.0 (the target stores whole
                           blocks); None: ``ensure_zero_padding`` decides (sm100).
        psum_whole_blocks: the kernel computes whole 256-row blocks: the last group's padded end
                           must fit in d, and an empty group may follow a non-aligned end.
        psum_sfa_contiguous: a float32 per-token SFA must be contiguous with the psum layout (the
                           sm100 packer skips gap rows).
        psum_sf_gaps:      which SF rows the target's transform skips with the psum layout: "rows"
                           (rows outside every group) or "blocks" (the gap blocks after each end).
        grouped_out_dtypes: output dtypes of the m-grouped GEMMs.
        grouped_epilogue:  the grouped and batched GEMMs take an ``epilogue`` object (Alpha).
        grouped_asserts_nk: N > 0 and K > 0 are asserted (DeepGEMM); otherwise they return early.
        bf16_k_multiple:   K of the BF16 grouped GEMMs must be a multiple of this (sm90: 64).
    k-grouped GEMMs
        k_grouped_fp8:     which FP8 k-grouped kernel the target has: "tn" (sm100) or "nt" (sm90).
        k_grouped_bf16_psum: the BF16 k-grouped GEMM has a psum layout; k_grouped_bf16_k_multiple:
                           its K sizes must be multiples of this (sm90: 128).
    einsum / hc prenorm
        fp8_einsum_exprs:  the expressions ``fp8_einsum`` accepts; hc_prenorm_n_max: N limit.
    MQA logits
        mqa_heads, mqa_fp4, mqa_weight_dtypes, paged_block_kv: what the kernels accept;
        mqa_reduction / paged_schedule: the device reduction model and schedule of the target;
        varlen_indices:    paged calls may pass ``indices`` (varlen, next_n == 1).
    Mega MoE and runtime
        mega_moe:          the fused Mega MoE kernels exist on this profile.
        fixed_mk_alignment: the contiguous-layout alignment when the target fixes it (256 on
                           DeepGEMM-Ascend), else None (settable, ``default_mk_alignment``).
        theoretical_mk_alignment: (start, step) of get_theoretical_mk_alignment_for_contiguous_layout:
                           start, shrunk by step while above 32 and at least expected_m.
    """

    fp8_dtypes: tuple[np.dtype, ...]
    fp8_k_major_only: bool
    fp8_1d2d: bool
    operand_mix: bool
    out_dtype_first: bool
    scales: ScaleRules
    psum_only: bool
    zero_psum_gaps: bool | None
    psum_whole_blocks: bool
    psum_sfa_contiguous: bool
    psum_sf_gaps: Literal["rows", "blocks"]
    grouped_out_dtypes: tuple[np.dtype, ...]
    grouped_epilogue: bool
    grouped_asserts_nk: bool
    bf16_k_multiple: int
    k_grouped_fp8: Literal["tn", "nt"]
    k_grouped_bf16_psum: bool
    k_grouped_bf16_k_multiple: int
    fp8_einsum_exprs: tuple[str, ...]
    hc_prenorm_n_max: int
    mqa_heads: tuple[int, ...]
    mqa_fp4: bool
    mqa_weight_dtypes: tuple[np.dtype, ...]
    paged_block_kv: tuple[int, ...]
    mqa_reduction: Literal["sm90", "sm100", "ascend"]
    paged_schedule: Literal["sm90", "sm100", "ascend"]
    varlen_indices: bool
    mega_moe: bool
    fixed_mk_alignment: int | None
    theoretical_mk_alignment: tuple[int, int]


@dataclass(frozen=True, kw_only=True)
class Profile:
    """One target: its library, arch major, device core count, MMA arithmetic and kernel rules."""

    name: str
    target: Target
    arch_major: int
    device_num_sms: int  # SMs (CUDA) or AI cores (Ascend) of the reference device
    default_mk_alignment: int
    description: str
    fp32_block: int  # K block of the "fp32" accumulation model's partial sums (the MMA block)
    mma_block_scaling: bool = False  # UE8M0 block scales applied inside the MMA (MX), not by a float32 multiply
    rules: KernelRules

    @property
    def is_ascend(self) -> bool:
        return self.target == "deepgemm-ascend"


_BATCHED_EXPRS = ("bhr,hdr->bhd", "bhd,hdr->bhr", "bhd,bhr->hdr")
_SM100_DISABLE = ("{func}: {arg}: Unsupported architecture or scaling factor types: sm100 kernels need UE8M0 "
                  "scales, and disable_ue8m0_cast=True keeps them float32")

_SM90 = KernelRules(
    fp8_dtypes=(E4M3,), fp8_k_major_only=True, fp8_1d2d=True, operand_mix=False, out_dtype_first=False,
    scales=ScaleRules(gran_k=(128,), gran_k_expected="gran_k 128 on sm90 (Unknown SF transformation)",
                      gran_mn=(1, 128), gran_mn_expected="gran_mn 1 or 128 on sm90", per_token_sfa=True,
                      float32="float", disable_cast_error=None, packed=None, dtype_expected="float32 SFs on sm90"),
    psum_only=False, zero_psum_gaps=True, psum_whole_blocks=False, psum_sfa_contiguous=False, psum_sf_gaps="rows",
    grouped_out_dtypes=(BF16,), grouped_epilogue=False, grouped_asserts_nk=True, bf16_k_multiple=64,
    k_grouped_fp8="nt", k_grouped_bf16_psum=False, k_grouped_bf16_k_multiple=128,
    fp8_einsum_exprs=("bhr,hdr->bhd",), hc_prenorm_n_max=32,
    mqa_heads=(32, 64), mqa_fp4=False, mqa_weight_dtypes=(F32,), paged_block_kv=(64,), mqa_reduction="sm90",
    paged_schedule="sm90", varlen_indices=False, mega_moe=False,
    fixed_mk_alignment=None, theoretical_mk_alignment=(128, 0),
)
_SM100 = KernelRules(
    fp8_dtypes=(E4M3, I8), fp8_k_major_only=False, fp8_1d2d=False, operand_mix=False, out_dtype_first=False,
    scales=ScaleRules(gran_k=(32, 128), gran_k_expected="gran_k 32 or 128 on sm100", gran_mn="any",
                      gran_mn_expected="a power-of-two gran_mn <= 128", per_token_sfa=False, float32="ue8m0",
                      disable_cast_error=_SM100_DISABLE, packed=I32,
                      dtype_expected="float32 (powers of two) or int32 packed UE8M0 SFs on sm100"),
    psum_only=False, zero_psum_gaps=None, psum_whole_blocks=False, psum_sfa_contiguous=True, psum_sf_gaps="rows",
    grouped_out_dtypes=(BF16,), grouped_epilogue=False, grouped_asserts_nk=True, bf16_k_multiple=1,
    k_grouped_fp8="tn", k_grouped_bf16_psum=True, k_grouped_bf16_k_multiple=1,
    fp8_einsum_exprs=_BATCHED_EXPRS, hc_prenorm_n_max=128,
    mqa_heads=(8, 16, 32, 64), mqa_fp4=True, mqa_weight_dtypes=(F32, BF16), paged_block_kv=(32, 64),
    mqa_reduction="sm100", paged_schedule="sm100", varlen_indices=True, mega_moe=True,
    fixed_mk_alignment=None, theoretical_mk_alignment=(224, 32),
)
_ASCEND950 = KernelRules(
    fp8_dtypes=(E4M3, I8), fp8_k_major_only=False, fp8_1d2d=False, operand_mix=True, out_dtype_first=True,
    scales=ScaleRules(gran_k=(32,), gran_k_expected="gran_k 32 (DeepGEMM-Ascend's MX GEMMs scale every 32 K elements)",
                      gran_mn="pow2<=128", gran_mn_expected="a power-of-two gran_mn <= 128", per_token_sfa=False,
                      float32="ue8m0",
                      disable_cast_error="{func}: disable_ue8m0_cast: expected False: float32 SFs must be converted "
                                         "into UE8M0; got True",
                      packed=I16, dtype_expected="float32 (powers of two) or int16 packed UE8M0 pairs"),
    psum_only=True, zero_psum_gaps=True, psum_whole_blocks=True, psum_sfa_contiguous=False, psum_sf_gaps="blocks",
    grouped_out_dtypes=(BF16, F32), grouped_epilogue=True, grouped_asserts_nk=False, bf16_k_multiple=1,
    k_grouped_fp8="tn", k_grouped_bf16_psum=True, k_grouped_bf16_k_multiple=1,
    fp8_einsum_exprs=_BATCHED_EXPRS, hc_prenorm_n_max=64,
    mqa_heads=tuple(range(4, 65, 4)), mqa_fp4=True, mqa_weight_dtypes=(BF16,), paged_block_kv=(64, 128),
    mqa_reduction="ascend", paged_schedule="ascend", varlen_indices=True, mega_moe=True,
    fixed_mk_alignment=256, theoretical_mk_alignment=(256, 0),
)

PROFILES: dict[str, Profile] = {
    # sm90 promotes the tensor-core partial sums every 128 K; sm100 and Ascend 950
    # scale per 32-element block in the MMA.
    "sm90": Profile(name="sm90", target="deepgemm", arch_major=9, device_num_sms=132, default_mk_alignment=128,
                    description="DeepGEMM 2.6.1 on Hopper (H800/H100 SXM, 132 SMs)", fp32_block=128, rules=_SM90),
    "sm100": Profile(name="sm100", target="deepgemm", arch_major=10, device_num_sms=148, default_mk_alignment=128,
                     description="DeepGEMM 2.6.1 on Blackwell (B200, 148 SMs)", fp32_block=32, mma_block_scaling=True,
                     rules=_SM100),
    "ascend950": Profile(
        name="ascend950", target="deepgemm-ascend", arch_major=0, device_num_sms=32, default_mk_alignment=256,
        description="DeepGEMM-Ascend on Ascend 950 (CANN 9.20, 32 AI cores): MX per-32 UE8M0 scales, psum-only "
                    "grouping", fp32_block=32, mma_block_scaling=True, rules=_ASCEND950,
    ),
}
DEFAULT_ARCH = "sm100"

_arch: Setting[str] = Setting("arch", DEFAULT_ARCH)


def get_arch() -> str:
    """Name of the active profile."""
    return _arch.get()


def get_profile() -> Profile:
    """The active profile record."""
    return PROFILES[_arch.get()]


def set_arch(arch: str) -> None:
    """Switch the active profile (``"sm90"``, ``"sm100"`` or ``"ascend950"``) process-wide."""
    if arch not in PROFILES:
        raise DGArgumentError(f"set_arch: arch: expected one of {sorted(PROFILES)}; got {arch!r}")
    _arch.set(arch)


def get_arch_major() -> int:
    """The arch major of the active profile: 9 (sm90) or 10 (sm100)."""
    p = get_profile()
    if p.is_ascend:
        raise DGArgumentError(
            "get_arch_major: not provided by DeepGEMM-Ascend (the ascend950 profile); "
            "use deepgemm_ref.get_arch() or get_npu_arch()"
        )
    return p.arch_major

