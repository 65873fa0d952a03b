"""``deepgemm_ref.utils``: the names of ``deep_gemm.utils`` (quantisation and layout utilities)."""

from ..quant import (
    align,
    cast_back_from_fp4,
    ceil_div,
    ceil_to_ue8m0,
    pack_ue8m0_to_int,
    per_block_cast_to_fp8,
    per_channel_cast_to_fp8,
    per_custom_dims_cast_to_fp8,
    per_token_cast_to_fp4,
    per_token_cast_to_fp8,
    transpose_packed_fp4,
    unpack_ue8m0_from_int,
)
from . import math

__all__ = [
    "math",
    "align",
    "cast_back_from_fp4",
    "ceil_div",
    "ceil_to_ue8m0",
    "pack_ue8m0_to_int",
    "per_block_cast_to_fp8",
    "per_channel_cast_to_fp8",
    "per_custom_dims_cast_to_fp8",
    "per_token_cast_to_fp4",
    "per_token_cast_to_fp8",
    "transpose_packed_fp4",
    "unpack_ue8m0_from_int",
]
