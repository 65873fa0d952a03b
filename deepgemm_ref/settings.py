"""Scoped process-global settings: ``numerics(arch=..., **options)``.

Four modules own one kind of process-global state each, and none of them knows the others:
:mod:`.config` the numerics options, :mod:`.profiles` the active arch profile, :mod:`.runtime`
DeepGEMM's runtime settings (SM count, alignment, ...), :mod:`.dryrun` DeepGEMM-Ascend's dry-run
flag.  This module sits above all of them and scopes them together: :func:`numerics` saves every
one, applies the arch and the options it is given, and restores everything on exit, also when
the block raises.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from . import config, dryrun, profiles, runtime

__all__ = ["numerics"]

_lock = threading.RLock()


@contextlib.contextmanager
def numerics(arch: str | None = None, **changes: Any) -> Iterator[config.NumericsOptions]:
    """Scope numerics options (and optionally the arch profile); everything is restored on exit.

    The numerics options, the arch profile, DeepGEMM's runtime settings and the dry-run flag are
    all saved on entry and put back on exit, whatever the block changed.

    >>> with numerics(arch="ascend950", accumulation="fp32"):
    ...     pass
    """
    with _lock:
        saved = (config.get_numerics(), profiles.get_arch(), runtime.runtime_state(), dryrun.enabled())
    try:
        if arch is not None:
            profiles.set_arch(arch)
        if changes:
            config.set_numerics(**changes)
        yield config.get_numerics()
    finally:
        with _lock:
            config.restore_numerics(saved[0])
            profiles.set_arch(saved[1])
            runtime.restore_runtime(saved[2])
            dryrun.set_enabled(saved[3])
