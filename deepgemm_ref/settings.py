"""Scoped process-global settings: ``numerics(arch=..., **options)``.

Four modules own one kind of process-global state each, and none of them knows the others:
:mod:`.config` the numerics options, :mod:`.profiles` the active arch profile, :mod:`.runtime`
DeepGEMM's runtime settings (SM count, alignment, ...), :mod:`.dryrun` DeepGEMM-Ascend's dry-run
flag.  Each holds its value in a :class:`deepgemm_ref._state.Setting`; this module scopes all of
them together: :func:`numerics` saves every setting, applies the arch and the options it is given,
and restores everything on exit, also when the block raises.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from . import _state, config, profiles

__all__ = ["numerics"]


@contextlib.contextmanager
def numerics(arch: str | None = None, **changes: Any) -> Iterator[config.NumericsOptions]:
    """Scope numerics options (and optionally the arch profile); everything is restored on exit.

    The numerics options, the arch profile, DeepGEMM's runtime settings and the dry-run flag are
    all saved on entry and put back on exit, whatever the block changed.

    >>> with numerics(arch="ascend950", accumulation="fp32"):
    ...     pass
    """
    saved = _state.snapshot()
    try:
        if arch is not None:
            profiles.set_arch(arch)
        if changes:
            config.set_numerics(**changes)
        yield config.get_numerics()
    finally:
        _state.restore(saved)
