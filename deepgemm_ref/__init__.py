"""deepgemm_ref: a pure-NumPy reference emulator of DeepGEMM and DeepGEMM-Ascend.

``import deepgemm_ref as deep_gemm`` gives DeepGEMM's names, parameters and defaults over NumPy
arrays (ml_dtypes for the narrow formats) and torch CPU tensors.  Golden outputs are the exact
result rounded once to the output dtype, with the roundings the kernel's data flow defines
(docs/numerics.md, "The rounding rule").  This module only assembles the namespace.
"""

# Note: the quantisation utilities and testing helpers stay available under ascend950 although
# DeepGEMM-Ascend does not export them: inputs for its kernels are made with them; the epilogue
# objects stay available under DeepGEMM's profiles, whose GEMMs also take epilogue=.
# deep_gemm's star import of deep_gemm.utils makes its sub-modules and dist helpers visible at
# top level (math, dist, init_dist, uneven_all_gather); so does this namespace (under DeepGEMM's
# profiles).  The namespace follows the active profile (deepgemm_ref.namespace): hasattr, dir(),
# __all__ and imports see only the names the emulated library exports.

# --- generated from deepgemm_ref._exports.TABLE: do not edit by hand ---
from . import _C, epilogue, formats, locality_domain, mega, testing, utils
from ._version import __version__
from .attention import (
    fp8_fp4_mqa_logits,
    fp8_fp4_paged_mqa_logits,
    fp8_mqa_logits,
    fp8_paged_mqa_logits,
    get_paged_mqa_logits_metadata,
)
from .config import Limited, get_numerics, reset_numerics, set_numerics
from .einsum import einsum, fp8_einsum, tf32_hc_prenorm_gemm
from .errors import DGArgumentError, DGUtilityError
from .gemm import (
    aclnn_bf16_gemm_nn,
    aclnn_bf16_gemm_nt,
    aclnn_bf16_gemm_tn,
    aclnn_bf16_gemm_tt,
    aclnn_fp8_fp4_gemm_nn,
    aclnn_fp8_fp4_gemm_nt,
    aclnn_fp8_fp4_gemm_tn,
    aclnn_fp8_fp4_gemm_tt,
    bf16_gemm_nn,
    bf16_gemm_nt,
    bf16_gemm_tn,
    bf16_gemm_tt,
    cublaslt_gemm_nn,
    cublaslt_gemm_nt,
    cublaslt_gemm_tn,
    cublaslt_gemm_tt,
    fp8_fp4_gemm_nn,
    fp8_fp4_gemm_nt,
    fp8_fp4_gemm_tn,
    fp8_fp4_gemm_tt,
    fp8_gemm_nn,
    fp8_gemm_nt,
    fp8_gemm_nt_skip_head_mid,
    fp8_gemm_tn,
    fp8_gemm_tt,
)
from .grouped import (
    bf16_m_grouped_gemm_nt_masked,
    fp8_m_grouped_gemm_nt_masked,
    k_grouped_bf16_gemm_tn_contiguous,
    k_grouped_fp8_gemm_nt_contiguous,
    k_grouped_fp8_gemm_tn_contiguous,
    m_grouped_bf16_gemm_nn_contiguous,
    m_grouped_bf16_gemm_nt_contiguous,
    m_grouped_bf16_gemm_nt_masked,
    m_grouped_fp8_fp4_gemm_nn_contiguous,
    m_grouped_fp8_fp4_gemm_nt_contiguous,
    m_grouped_fp8_fp4_gemm_nt_masked,
    m_grouped_fp8_gemm_nn_contiguous,
    m_grouped_fp8_gemm_nt_contiguous,
    m_grouped_fp8_gemm_nt_masked,
)
from .layout import (
    get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor,
    get_mn_major_tma_aligned_packed_ue8m0_tensor,
    get_mn_major_tma_aligned_tensor,
    get_tma_aligned_size,
    transform_k_grouped_sf_into_required_layout,
    transform_sf_into_required_layout,
)
from .locality_domain import profiled_destroy_localizer as destroy_localizer
from .locality_domain import profiled_get_num_locality_domains as get_num_locality_domains
from .locality_domain import profiled_is_localization_available as is_localization_available
from .locality_domain import profiled_is_localized as is_localized
from .locality_domain import profiled_localize as localize
from .mega import (
    SymmBuffer,
    bf16_mega_moe,
    fp8_fp4_mega_moe,
    get_symm_buffer_for_mega_moe,
    transform_weights_for_mega_moe,
)
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
from .runtime import (
    ASCEND_HOME,
    get_deterministic_algorithms,
    get_k_alignment_for_contiguous_layout,
    get_library_root_path,
    get_m_alignment_for_contiguous_layout,
    get_mk_alignment_for_contiguous_layout,
    get_npu_arch,
    get_num_sms,
    get_pdl,
    get_tc_util,
    get_theoretical_mk_alignment_for_contiguous_layout,
    set_block_size_multiple_of,
    set_ignore_compile_dims,
    set_mk_alignment_for_contiguous_layout,
    set_npu_arch,
    set_num_sms,
    set_pdl,
    set_tc_util,
    use_deterministic_algorithms,
)
from .settings import numerics
from .utils import dist, math
from .utils.dist import init_dist, uneven_all_gather

__all__ = [
    "SymmBuffer",
    "get_symm_buffer_for_mega_moe",
    "transform_weights_for_mega_moe",
    "fp8_fp4_mega_moe",
    "bf16_mega_moe",
    "mega",
    "k_grouped_bf16_gemm_tn_contiguous",
    "k_grouped_fp8_gemm_nt_contiguous",
    "k_grouped_fp8_gemm_tn_contiguous",
    "m_grouped_bf16_gemm_nn_contiguous",
    "m_grouped_bf16_gemm_nt_contiguous",
    "m_grouped_bf16_gemm_nt_masked",
    "bf16_m_grouped_gemm_nt_masked",
    "m_grouped_fp8_fp4_gemm_nn_contiguous",
    "m_grouped_fp8_fp4_gemm_nt_contiguous",
    "m_grouped_fp8_fp4_gemm_nt_masked",
    "m_grouped_fp8_gemm_nn_contiguous",
    "m_grouped_fp8_gemm_nt_contiguous",
    "m_grouped_fp8_gemm_nt_masked",
    "fp8_m_grouped_gemm_nt_masked",
    "einsum",
    "fp8_einsum",
    "tf32_hc_prenorm_gemm",
    "fp8_fp4_mqa_logits",
    "fp8_fp4_paged_mqa_logits",
    "fp8_mqa_logits",
    "fp8_paged_mqa_logits",
    "get_paged_mqa_logits_metadata",
    "fp8_fp4_gemm_nt",
    "fp8_fp4_gemm_nn",
    "fp8_fp4_gemm_tn",
    "fp8_fp4_gemm_tt",
    "fp8_gemm_nt",
    "fp8_gemm_nn",
    "fp8_gemm_tn",
    "fp8_gemm_tt",
    "fp8_gemm_nt_skip_head_mid",
    "bf16_gemm_nt",
    "bf16_gemm_nn",
    "bf16_gemm_tn",
    "bf16_gemm_tt",
    "cublaslt_gemm_nt",
    "cublaslt_gemm_nn",
    "cublaslt_gemm_tn",
    "cublaslt_gemm_tt",
    "aclnn_bf16_gemm_nt",
    "aclnn_bf16_gemm_nn",
    "aclnn_bf16_gemm_tn",
    "aclnn_bf16_gemm_tt",
    "aclnn_fp8_fp4_gemm_nt",
    "aclnn_fp8_fp4_gemm_nn",
    "aclnn_fp8_fp4_gemm_tn",
    "aclnn_fp8_fp4_gemm_tt",
    "__version__",
    "formats",
    "testing",
    "utils",
    "math",
    "dist",
    "init_dist",
    "uneven_all_gather",
    "_C",
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
    "epilogue",
    "locality_domain",
    "get_num_locality_domains",
    "is_localization_available",
    "localize",
    "is_localized",
    "destroy_localizer",
    "set_num_sms",
    "get_num_sms",
    "set_tc_util",
    "get_tc_util",
    "set_pdl",
    "get_pdl",
    "set_ignore_compile_dims",
    "set_block_size_multiple_of",
    "set_mk_alignment_for_contiguous_layout",
    "get_mk_alignment_for_contiguous_layout",
    "get_m_alignment_for_contiguous_layout",
    "get_k_alignment_for_contiguous_layout",
    "get_theoretical_mk_alignment_for_contiguous_layout",
    "set_npu_arch",
    "get_npu_arch",
    "use_deterministic_algorithms",
    "get_deterministic_algorithms",
    "get_library_root_path",
    "ASCEND_HOME",
    "get_tma_aligned_size",
    "get_mn_major_tma_aligned_tensor",
    "get_mn_major_tma_aligned_packed_ue8m0_tensor",
    "get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor",
    "transform_sf_into_required_layout",
    "transform_k_grouped_sf_into_required_layout",
]
# --- end of generated block ---

from . import _exports, namespace  # noqa: E402

namespace.install(__name__, _exports.only("top"))
