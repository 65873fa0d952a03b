"""DeepGEMM-Ascend's dry run: validate every argument, compute nothing, write nothing.

``_C.set_dry_run(True)`` (or ``deepgemm_ref.testing.par_compile.dry_run()``) sets a process-wide
flag, as DeepGEMM-Ascend's ``Runtime::dry_run``.  While it is set, a call of a public kernel under
the ``ascend950`` profile is a *dry call* (:func:`call`, entered by
:class:`deepgemm_ref.api.ProfiledFunction`):

* the kernel validates its arguments exactly as in a real call, so every argument error is raised;
* where validation ends and work begins (the executor, the operand builders, the first write of a
  caller's buffer, the allocation of a returned output) the kernel calls :func:`stop`, which ends
  the dry call there: nothing is translated, computed or written, and functions that return an
  output return it allocated and unspecified (NaN here), as DeepGEMM-Ascend returns the tensor it
  allocated without launching;
* torch tensors on the ``meta`` device are accepted (:func:`phantom`): their shapes, dtypes and
  strides are checked as a CPU tensor's would be; their values do not exist, so the checks that
  read values (layout contents, schedule metadata) skip them (:func:`has_data`), and outputs of
  a call on meta tensors come back as meta tensors.  Outside a dry call a meta tensor is the
  argument error.

Nothing else of the package reads the flag.  This module imports only :mod:`._state` from the
package (it sits below the argument coercion that needs it).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._state import Setting

__all__ = ["enabled", "set_enabled", "DryCall", "call", "active", "stop", "Stop", "phantom", "has_data",
           "on_meta"]

_enabled: Setting[bool] = Setting("dry_run", False)


def enabled() -> bool:
    """The process-wide dry-run flag (DeepGEMM-Ascend's ``_C.get_dry_run()``)."""
    return _enabled.get()


def set_enabled(value: bool) -> None:
    """Set the process-wide dry-run flag (DeepGEMM-Ascend's ``_C.set_dry_run(value)``)."""
    _enabled.set(bool(value))


@dataclass
class DryCall:
    """One dry call: the phantom buffers made for its meta tensors (one per torch storage, so
    views of one storage alias here as they do in torch)."""

    func: str
    buffers: dict[int, np.ndarray] = field(default_factory=dict)

    def owns(self, x: np.ndarray) -> bool:
        root = _root(x)
        return any(root is b for b in self.buffers.values())


_current: contextvars.ContextVar[DryCall | None] = contextvars.ContextVar("deepgemm_ref_dry_call", default=None)


class Stop(BaseException):  # noqa: N818 - a control-flow signal, not an error
    """Raised by :func:`stop` inside a dry call; the outermost public function returns ``result``.

    A ``BaseException``, so that no ``except Exception`` on the way can take it for an error.
    """

    def __init__(self, result: Any = None) -> None:
        super().__init__("dry run: validation complete")
        self.result = result


@contextlib.contextmanager
def call(func: str) -> Iterator[bool]:
    """The scope of one dry call of ``func``; yields True for the outermost public call (a public
    function called by another joins the caller's dry call, and only the outermost one returns)."""
    if _current.get() is not None:
        yield False
        return
    token = _current.set(DryCall(func))
    try:
        yield True
    finally:
        _current.reset(token)


def active() -> bool:
    """True inside a dry call (of this thread)."""
    return _current.get() is not None


# Note: a dry call returns its allocated output filled with NaN (DeepGEMM-Ascend: uninitialised
# memory), so that the result is deterministic and cannot pass for a value.
def stop(result: Any = None) -> None:
    """Validation is complete: inside a dry call, end it here and return ``result``; else nothing."""
    if _current.get() is not None:
        raise Stop(result)


def on_meta() -> bool:
    """True inside a dry call that received meta tensors."""
    state = _current.get()
    return state is not None and bool(state.buffers)


# ----------------------------------------------------------------------------------------------
# meta tensors
# ----------------------------------------------------------------------------------------------

def _root(x: np.ndarray) -> np.ndarray:
    while isinstance(x.base, np.ndarray):
        x = x.base
    return x


def phantom(t: Any, np_dtype: np.dtype, storage_key: int, storage_nbytes: int) -> np.ndarray | None:
    """A NumPy stand-in for a meta tensor inside a dry call (None outside one).

    The stand-in has the tensor's shape, dtype and strides over a zero-filled buffer of its
    storage's size (calloc'ed: no page is touched unless read), shared by every tensor of the same
    storage within the call, so ``c is d`` style aliasing is seen as in torch.
    """
    state = _current.get()
    if state is None:
        return None
    buf = state.buffers.get(storage_key)
    if buf is None:
        buf = np.zeros(max(storage_nbytes, np_dtype.itemsize), np.uint8)
        state.buffers[storage_key] = buf
    itemsize = np_dtype.itemsize
    shape = tuple(int(s) for s in t.shape)
    strides = tuple(int(s) * itemsize for s in t.stride())
    return np.ndarray(shape, np_dtype, buffer=buf, offset=int(t.storage_offset()) * itemsize, strides=strides)


# Note: checks that read values (a schedule compared with the one its inputs give) skip meta
# stand-ins; the host code of DeepGEMM-Ascend never reads device values either.
def has_data(*arrays: np.ndarray | None) -> bool:
    """False when any of ``arrays`` stands for a meta tensor (its values do not exist)."""
    state = _current.get()
    if state is None or not state.buffers:
        return True
    return not any(a is not None and state.owns(a) for a in arrays)
