"""What a kernel family needs from a group of ranks: :class:`Transport`, and :func:`transport`.

Every collective is called by every rank of the group, in the same order, with arrays of the same
dtype and row shape on every rank (their row counts may differ).  Validation is the caller's and
happens before the first collective, so that a bad argument raises on every rank without a hang.

Both transports describe each collective by a label (:func:`collective_label`: the collective's
name, the dtype and the row shape) and compare the ranks' labels before any data moves: ranks
that disagree (different collectives, dtypes or row shapes) all raise the same
:class:`CollectiveMismatch`, whatever the form the ranks run in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..errors import arg_error
from ._rows import CollectiveMismatch, as_rows, collective_label, mismatch_message, send_arrays

__all__ = [
    "CollectiveMismatch", "Transport", "as_rows", "collective_label", "mismatch_message", "send_arrays", "transport",
]


@runtime_checkable
class Transport(Protocol):
    """One rank's end of a group's collectives.

    rank, size:        this rank's index and the number of ranks.
    barrier():         every rank has arrived.
    all_to_all(send):  ``send[d]`` (an array of rows) goes to rank d; returns ``recv[s]``, the
                       rows rank s sent here (same dtype and row shape as sent).
    all_gather(x):     every rank's ``x`` (same dtype and row shape; row counts may differ), in
                       rank order.

    The arrays returned are C-contiguous, writeable, and share memory with nothing the caller or
    another rank holds; their bytes are the bytes sent.
    """

    @property
    def rank(self) -> int: ...

    @property
    def size(self) -> int: ...

    def barrier(self) -> None: ...

    def all_to_all(self, send: Sequence[np.ndarray]) -> list[np.ndarray]: ...

    def all_gather(self, x: np.ndarray) -> list[np.ndarray]: ...


def transport(group: Any, func: str = "group", arg: str = "group") -> Transport:
    """The transport of ``group``: a :class:`~deepgemm_ref.comm.LocalRank` (a rank view of an
    in-process group) or a ``torch.distributed`` process group; anything else is the argument
    error naming ``func`` and ``arg``."""
    from .local import LocalRank

    if isinstance(group, LocalRank):
        return group.transport()
    if _is_torch_group(group):
        from .torchdist import TorchTransport

        return TorchTransport(group)
    raise arg_error(func, arg, "a torch.distributed process group or a rank view of an in-process group "
                    "(deepgemm_ref.comm.LocalGroup(...).rank(r), run_emulated)", type(group).__name__)


def _is_torch_group(group: Any) -> bool:
    import sys

    dist = sys.modules.get("torch.distributed")  # a torch group exists only where torch is imported
    pg = getattr(dist, "ProcessGroup", None) if dist is not None else None
    return pg is not None and isinstance(group, pg)
