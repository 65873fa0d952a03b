"""Layouts: scale-factor layouts of both targets (:mod:`.sf`) and grouped layouts (:mod:`.groups`).

:mod:`.sf` holds DeepGEMM's TMA layout helpers, both targets' SF transforms and their inverse
for kernels (:func:`sf_values`: the scale of every row and K block, from any accepted form).
:mod:`.groups` parses the grouped GEMMs' layouts (m_indices, psum END offsets, masked row counts,
k-grouped sizes) into the groups the kernels compute.
"""

from .groups import (
    KGroups,
    RowGroups,
    ascend_gap_mask,
    k_groups_ascend,
    k_groups_cuda,
    m_indices_layout,
    masked_rows,
    psum_gap_scale_blocks,
    psum_gap_scale_rows,
    psum_layout,
    psum_ranges,
    psum_row_mask,
    psum_starts,
)
from .sf import (
    ASCEND_PAIR_K,
    get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor,
    get_mn_major_tma_aligned_packed_ue8m0_tensor,
    get_mn_major_tma_aligned_tensor,
    get_tma_aligned_size,
    pack_k_grouped_ue8m0,
    sf_values,
    to_user_form,
    transform_k_grouped_sf_into_required_layout,
    transform_sf_into_required_layout,
)

__all__ = [
    "get_tma_aligned_size",
    "get_mn_major_tma_aligned_tensor",
    "get_mn_major_tma_aligned_packed_ue8m0_tensor",
    "get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor",
    "transform_sf_into_required_layout",
    "transform_k_grouped_sf_into_required_layout",
    "sf_values",
    "to_user_form",
    "pack_k_grouped_ue8m0",
    "ASCEND_PAIR_K",
    "RowGroups",
    "KGroups",
    "psum_starts",
    "psum_ranges",
    "psum_row_mask",
    "ascend_gap_mask",
    "m_indices_layout",
    "psum_layout",
    "masked_rows",
    "k_groups_cuda",
    "k_groups_ascend",
    "psum_gap_scale_rows",
    "psum_gap_scale_blocks",
]
