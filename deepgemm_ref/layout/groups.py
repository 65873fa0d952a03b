"""Grouped layouts (m_indices, psum END offsets, masked row counts, k-grouped sizes).

The parsers live in the kernel toolkit (:mod:`deepgemm_ref.toolkit.groups`), below the kernel
families that read them; this module keeps their documented import path.
"""

from ..toolkit.groups import *  # noqa: F403
from ..toolkit.groups import __all__  # noqa: F401
