"""What both transports share: the arrays they accept, and the label of a collective.

Every collective is described by a label (:func:`collective_label`: the collective's name, the
dtype and the row shape); the transports compare the ranks' labels before any data moves, and
ranks that disagree all raise the same :class:`CollectiveMismatch` (:func:`mismatch_message`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import arg_error

__all__ = ["CollectiveMismatch", "as_rows", "collective_label", "mismatch_message", "send_arrays"]


class CollectiveMismatch(RuntimeError):
    """The ranks of a group called different collectives at once, or disagree on the arrays'
    dtype or row shape (raised on every rank, with the same message)."""


def as_rows(func: str, arg: str, x: Any) -> np.ndarray:
    """``x`` as an array of rows (ndim >= 1) of a plain dtype, C-contiguous (a copy only where
    ``x`` is not); anything else is the argument error.

    Plain: any dtype whose items are bytes without Python objects, fields or sub-arrays (numpy's
    numbers and bool, ml_dtypes' bfloat16 and float8 formats, ...): these travel as bytes."""
    try:
        a = np.asarray(x)
    except (TypeError, ValueError) as e:
        raise arg_error(func, arg, "an array of rows", f"{type(x).__name__} ({e})") from None
    if a.dtype.hasobject or a.dtype.fields is not None or a.dtype.subdtype is not None:
        raise arg_error(func, arg, "an array of a plain dtype (no object, structured or sub-array dtype)",
                        f"dtype {a.dtype}")
    if a.ndim < 1:
        raise arg_error(func, arg, "an array of rows (ndim >= 1)", f"a {a.ndim}-D array")
    return np.ascontiguousarray(a)


def collective_label(op: str, x: np.ndarray | None = None) -> str:
    """The label of collective ``op`` on arrays like ``x`` (its dtype and row shape ``x.shape[1:]``;
    None for a barrier): what every rank's call must agree on."""
    if x is None:
        return op
    dt = x.dtype
    name = dt.name if dt.isnative or dt.byteorder == "|" else f"{dt.name} ({dt.str})"
    return f"{op} of {name} rows of shape {tuple(int(n) for n in x.shape[1:])}"


def mismatch_message(labels: Sequence[str]) -> str:
    """The message of :class:`CollectiveMismatch` for the ranks' ``labels`` (rank order): each
    distinct label with the ranks that gave it."""
    seen: dict[str, list[int]] = {}
    for r, label in enumerate(labels):
        seen.setdefault(label, []).append(r)
    parts = "; ".join(f"rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))}: {label}"
                      for label, rs in seen.items())
    return f"the ranks called different collectives at once (or disagree on dtype or row shape): {parts}"


def send_arrays(func: str, send: Any, size: int) -> list[np.ndarray]:
    """The ``send`` argument of an all_to_all: ``size`` arrays of rows of one dtype and row shape."""
    if isinstance(send, np.ndarray) or not isinstance(send, Sequence) or len(send) != size:
        got = f"{type(send).__name__} of length {len(send)}" if isinstance(send, Sequence) else type(send).__name__
        raise arg_error(func, "send", f"a list of {size} arrays (one per destination rank)", got)
    arrays = [as_rows(func, f"send[{d}]", a) for d, a in enumerate(send)]
    for d, a in enumerate(arrays):
        if a.dtype != arrays[0].dtype or a.shape[1:] != arrays[0].shape[1:]:
            raise arg_error(func, f"send[{d}]", f"rows like send[0] (dtype {arrays[0].dtype}, row shape "
                            f"{arrays[0].shape[1:]})", f"dtype {a.dtype}, row shape {a.shape[1:]}")
    return arrays
