"""The package's argument errors.

DeepGEMM's host checks raise ``RuntimeError`` (a C++ ``DGException`` surfaced by pybind) and its
Python utilities use ``assert`` (``AssertionError``).  Code written for DeepGEMM catches one of
those; code written for NumPy catches ``ValueError``.  ``DGArgumentError`` is all of the first two
and ``DGUtilityError`` adds ``AssertionError`` for the places where DeepGEMM's utility asserts.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DGArgumentError", "DGUtilityError", "arg_error", "describe"]


# Note: one exception type (also a ValueError) where DeepGEMM raises RuntimeError or asserts.
class DGArgumentError(ValueError, RuntimeError):
    """A bad argument: wrong dtype, shape, layout, value, or not supported by the active profile.

    Raised before any caller-owned buffer is modified.  Subclasses both ``ValueError`` and
    ``RuntimeError`` so that code written for DeepGEMM's host checks still catches it.
    """


class DGUtilityError(DGArgumentError, AssertionError):
    """A bad argument to one of DeepGEMM's Python utilities, where DeepGEMM itself asserts."""


def describe(x: Any) -> str:
    """A short description of an argument for error messages: kind, dtype, shape and strides."""
    if x is None:
        return "None"
    shape = getattr(x, "shape", None)
    dtype = getattr(x, "dtype", None)
    if shape is not None and dtype is not None:
        kind = "tensor" if type(x).__module__.startswith("torch") else "array"
        strides = None
        if kind == "tensor":
            try:
                strides = tuple(x.stride())
            except Exception:  # pragma: no cover - exotic tensor subclasses
                strides = None
        else:
            itemsize = getattr(dtype, "itemsize", 0) or 1
            strides = tuple(s // itemsize for s in x.strides)
        return f"{kind} of dtype {dtype}, shape {tuple(shape)}, element strides {strides}"
    return f"{type(x).__name__} {x!r}"


def arg_error(func: str, arg: str, expected: str, got: Any, *, utility: bool = False) -> DGArgumentError:
    """Build the error for argument ``arg`` of ``func``: what was expected and what came.

    ``got`` is either a description string or the offending object (described with
    :func:`describe`).  With ``utility=True`` the error is also an ``AssertionError``.
    """
    got_text = got if isinstance(got, str) else describe(got)
    cls = DGUtilityError if utility else DGArgumentError
    return cls(f"{func}: {arg}: expected {expected}; got {got_text}")
