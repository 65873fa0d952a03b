"""Process-global settings, one helper for all of them: get, set, and save / restore together.

DeepGEMM keeps its runtime settings in process-global singletons; so does this package.  Four
modules own one setting each (:mod:`.config` the numerics options, :mod:`.profiles` the active
arch profile, :mod:`.runtime` DeepGEMM's runtime settings, :mod:`.dryrun` DeepGEMM-Ascend's
dry-run flag) and each holds it in a :class:`Setting`.  Every setting made registers itself, so
that ``deepgemm_ref.numerics(...)`` can save all of them on entry and put all of them back on exit
(:func:`snapshot`, :func:`restore`) without knowing which exist.

Reads are plain attribute reads (a kernel call reads several settings); writes, snapshots and
restores hold one lock, so a snapshot never sees half of a ``restore``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["Setting", "snapshot", "restore"]

T = TypeVar("T")

_lock = threading.RLock()
_registry: list[Setting[object]] = []


class Setting(Generic[T]):
    """One process-global value with its default (``name`` is for messages and ``repr``)."""

    def __init__(self, name: str, default: T) -> None:
        self.name = name
        self.default = default
        self._value = default
        with _lock:
            _registry.append(self)  # type: ignore[arg-type]

    def get(self) -> T:
        """The current value."""
        return self._value

    def set(self, value: T) -> None:
        """Replace the value (callers validate it first)."""
        with _lock:
            self._value = value

    def update(self, change: Callable[[T], T]) -> T:
        """Replace the value by ``change(current)`` atomically; returns the new value."""
        with _lock:
            self._value = change(self._value)
            return self._value

    def reset(self) -> None:
        """Back to the default."""
        self.set(self.default)

    def __repr__(self) -> str:
        return f"Setting({self.name!r}, {self._value!r})"


Snapshot = list[tuple[Setting[object], object]]


def snapshot() -> Snapshot:
    """The value of every setting of the process, for :func:`restore`."""
    with _lock:
        return [(s, s.get()) for s in _registry]


def restore(saved: Snapshot) -> None:
    """Put back every value saved by :func:`snapshot`, under one lock."""
    with _lock:
        for setting, value in saved:
            setting.set(value)
