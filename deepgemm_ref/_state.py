"""Process-global settings, one helper for all of them: get, set, and save / restore together.

DeepGEMM keeps its runtime settings in process-global singletons; so does this package.  Four
modules own one setting each (:mod:`.config` the numerics options, :mod:`.profiles` the active
arch profile, :mod:`.runtime` DeepGEMM's runtime settings, :mod:`.dryrun` DeepGEMM-Ascend's
dry-run flag) and each holds it in a :class:`Setting`.  Every setting made registers itself, so
that ``deepgemm_ref.numerics(...)`` can save all of them on entry and put all of them back on exit
(:func:`snapshot`, :func:`restore`) without knowing which exist.

Reads are plain attribute reads (a kernel call reads several settings); writes, snapshots and
restores hold one lock, so a snapshot never sees half of a ``restore``.

:func:`isolated` gives a block its own copy of every setting (a context variable): what the block
sets (``set_arch``, ``numerics(...)``) is seen by the block and the threads it starts through
:func:`propagate`, and by no other thread; the process-global values are untouched.  The golden
workflow runs every case in such a block, with the case's profile and options passed to it, so
that runs in several threads at once are independent.  Outside such a block every setting is
process-global, as documented (a new thread sees what ``set_arch`` set in any other).
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

__all__ = ["Setting", "snapshot", "restore", "isolated", "propagate"]

T = TypeVar("T")

_lock = threading.RLock()
_registry: list[Setting[object]] = []
#: An isolated block's own values (see :func:`isolated`); None outside one.
_scope: contextvars.ContextVar[dict[Setting[Any], Any] | None] = contextvars.ContextVar(
    "deepgemm_ref_settings_scope", default=None)


class Setting(Generic[T]):
    """One process-global value with its default (``name`` is for messages and ``repr``)."""

    def __init__(self, name: str, default: T) -> None:
        self.name = name
        self.default = default
        self._value = default
        with _lock:
            _registry.append(self)  # type: ignore[arg-type]

    def get(self) -> T:
        """The current value (an isolated block's own, inside one)."""
        scope = _scope.get()
        if scope is not None and self in scope:
            return scope[self]
        return self._value

    def set(self, value: T) -> None:
        """Replace the value (callers validate it first); inside an isolated block, its own."""
        with _lock:
            scope = _scope.get()
            if scope is not None:
                scope[self] = value
            else:
                self._value = value

    def update(self, change: Callable[[T], T]) -> T:
        """Replace the value by ``change(current)`` atomically; returns the new value."""
        with _lock:
            value = change(self.get())
            self.set(value)
            return value

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


@contextlib.contextmanager
def isolated() -> Iterator[None]:
    """A block with its own copy of every setting, starting from the values seen on entry: its
    changes are seen only by this thread (and threads started through :func:`propagate`), and are
    gone on exit; other threads keep seeing the process-global values."""
    with _lock:
        own = {s: s.get() for s in _registry}
    token = _scope.set(own)
    try:
        yield
    finally:
        _scope.reset(token)


def propagate(func: Callable[..., T]) -> Callable[..., T]:
    """``func`` to run in another thread with the settings this thread sees (an isolated block's
    own values travel with it; outside one this changes nothing)."""
    if _scope.get() is None:
        return func
    ctx = contextvars.copy_context()

    def run(*args: Any, **kwargs: Any) -> T:
        return ctx.copy().run(func, *args, **kwargs)

    return run
