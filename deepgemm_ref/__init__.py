"""deepgemm_ref: a pure-NumPy reference emulator of DeepGEMM and DeepGEMM-Ascend.

``import deepgemm_ref as deep_gemm`` gives DeepGEMM's names, parameters and defaults over NumPy
arrays (ml_dtypes for the narrow formats) and torch CPU tensors.  Golden outputs are the exact
result rounded once to the output dtype.  This module only assembles the namespace.
"""

from . import formats, testing, utils
from ._version import __version__
from .config import Limited, get_numerics, numerics, reset_numerics, set_numerics
from .errors import DGArgumentError, DGUtilityError
from .profiles import get_arch, get_profile, set_arch
from .quant import (
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

# deep_gemm's star import of deep_gemm.utils makes its sub-modules visible at top level.
math = utils.math

__all__ = [
    "__version__",
    "formats",
    "testing",
    "utils",
    "math",
    "DGArgumentError",
    "DGUtilityError",
    "Limited",
    "get_numerics",
    "numerics",
    "reset_numerics",
    "set_numerics",
    "get_arch",
    "get_profile",
    "set_arch",
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
