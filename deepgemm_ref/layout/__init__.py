"""Layouts: scale-factor layouts of both targets (:mod:`.sf`) and grouped layouts (:mod:`.groups`).

:mod:`.sf` holds DeepGEMM's TMA layout helpers, both targets' SF transforms and their inverse
for kernels (:func:`sf_values`: the scale of every row and K block, from any accepted form).
:mod:`.groups` parses the grouped GEMMs' layouts (m_indices, psum END offsets, masked row counts,
k-grouped sizes) into the groups the kernels compute.
"""

from . import groups, sf
from .groups import *  # noqa: F403
from .sf import *  # noqa: F403

__all__: list[str] = []
__all__ += sf.__all__
__all__ += groups.__all__
