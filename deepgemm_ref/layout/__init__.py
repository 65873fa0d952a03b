"""Layouts: scale-factor layouts of both targets (:mod:`.sf`) and grouped layouts (:mod:`.groups`).

:mod:`.sf` holds DeepGEMM's TMA layout helpers and both targets' public, profile-dispatched SF
transforms.  What the kernels read lives one layer down, in the kernel toolkit, and is re-exported
here under its documented names: the inverse of the transforms (:func:`sf_values`: the scale of
every row and K block, from any accepted form; :mod:`deepgemm_ref.toolkit.scales`) and the
grouped-layout parsers (:mod:`.groups`, from :mod:`deepgemm_ref.toolkit.groups`).
"""

from . import groups, sf
from .groups import *  # noqa: F403
from .sf import *  # noqa: F403

__all__: list[str] = []
__all__ += sf.__all__
__all__ += groups.__all__
