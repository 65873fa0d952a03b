"""R ranks in one process: :class:`LocalGroup`, its rank views, and :func:`run_emulated`.

A rank view (``group.rank(r)``) is what DeepGEMM's and DeepEP's code expects of a
``torch.distributed`` process group (``rank()``, ``size()``, ``barrier()``) and is accepted
wherever a process group is.  Collectives come in two forms:

* :meth:`LocalGroup.exchange` (the ranks run in their own threads, :func:`run_emulated`): every
  rank hands in its item and blocks until all have, then every rank gets all items in rank order.
  Each call carries a label (the collective, dtype and row shape: :func:`collective_label`);
  ranks whose labels differ all raise the same :class:`CollectiveMismatch` and the group stays
  usable.  A rank that waits longer than the group's ``timeout_s`` raises a ``RuntimeError``
  naming the ranks that did not arrive; a rank that fails (:meth:`LocalGroup.abort`) or leaves
  (:meth:`LocalGroup.leave`) makes every pending and later collective of the group raise
  :class:`PeerFailed`, naming it.  After a failure the group cannot be used again.
* :meth:`LocalGroup.join` (the ranks' calls come one after another from one thread, as in Mega
  MoE's ``EmulatedGroup``): a call adds its item to the pending collective; the last rank's call
  receives every rank's item and completes it; the others return at once.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np

from .. import _state
from ..errors import arg_error
from ._rows import CollectiveMismatch, as_rows, collective_label, mismatch_message, send_arrays

__all__ = ["LocalGroup", "LocalRank", "LocalTransport", "PeerFailed", "run_emulated", "DEFAULT_TIMEOUT_S"]

#: Default bound of a rank's wait in a collective (seconds).
DEFAULT_TIMEOUT_S = 120.0


class PeerFailed(RuntimeError):
    """A collective could not complete because another rank failed, timed out or left the group."""


class _Left(RuntimeError):
    """What :meth:`LocalGroup.leave` records: the rank is done with the group (not an error of its own)."""


def _timeout_arg(func: str, timeout_s: Any) -> float:
    if isinstance(timeout_s, (bool, np.bool_)) or not isinstance(timeout_s, (int, float, np.integer, np.floating)) \
            or not (math.isfinite(timeout_s) and timeout_s > 0):
        raise arg_error(func, "timeout_s", "a positive finite number of seconds", repr(timeout_s))
    return float(timeout_s)


def _size_arg(func: str, arg: str, size: Any) -> int:
    if isinstance(size, (bool, np.bool_)) or not isinstance(size, (int, np.integer)) or size <= 0:
        raise arg_error(func, arg, "a positive int", repr(size))
    return int(size)


class LocalGroup:
    """``size`` ranks in one process; ``rank(r)`` is rank r's process-group view.

    timeout_s: the longest a rank waits in a blocking collective before it raises (settable).
    """

    #: The class of the rank views :meth:`rank` returns.
    _view: ClassVar[type[LocalRank]]

    def __init__(self, size: int, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self._size = _size_arg(type(self).__name__, "size", size)
        self._timeout_s = _timeout_arg(type(self).__name__, timeout_s)
        self._cond = threading.Condition()
        # the blocking collective in progress: rank -> (label, item)
        self._round: dict[int, tuple[str, Any]] = {}
        self._generation = 0
        # completed rounds some rank has not read yet: generation -> [items, mismatch, readers left]
        self._outcomes: dict[int, list[Any]] = {}
        self._failed: dict[int, BaseException] = {}
        # the sequential collective in progress: rank -> item
        self._pending: dict[int, Any] = {}

    @property
    def timeout_s(self) -> float:
        """The longest a rank waits in a blocking collective (seconds)."""
        return self._timeout_s

    @timeout_s.setter
    def timeout_s(self, value: float) -> None:
        self._timeout_s = _timeout_arg(f"{type(self).__name__}.timeout_s", value)

    def size(self) -> int:
        """The number of ranks."""
        return self._size

    def rank(self, rank: int) -> LocalRank:
        """Rank ``rank``'s process-group view (all views share this group; equal views compare equal)."""
        return self._view(self, self._rank_arg(f"{type(self).__name__}.rank", rank))

    def _rank_arg(self, func: str, rank: Any) -> int:
        if isinstance(rank, (bool, np.bool_)) or not isinstance(rank, (int, np.integer)) \
                or not 0 <= rank < self._size:
            raise arg_error(func, "rank", f"an int in [0, {self._size})", repr(rank))
        return int(rank)

    # -- blocking collectives (one thread per rank) ----------------------------------------------

    def exchange(self, rank: int, item: Any, label: str = "collective") -> list[Any]:
        """Every rank's ``item`` in rank order, once every rank has handed in its own (blocks).

        ``label`` names the collective: if the ranks' labels differ, every rank raises the same
        :class:`CollectiveMismatch` (naming each rank's label) and no item is handed out.  The
        items are handed out as they are (the callers copy what must not be shared).
        Raises :class:`PeerFailed` if another rank failed or left, and ``RuntimeError`` naming
        the missing ranks after ``timeout_s`` seconds."""
        r = self._rank_arg(f"{type(self).__name__}.exchange", rank)
        with self._cond:
            self._raise_if_failed(r, label)
            generation = self._generation
            if r in self._round:
                raise RuntimeError(f"{label}: rank {r} entered the same collective twice (two threads on one rank?)")
            self._round[r] = (str(label), item)
            if len(self._round) == self._size:
                return self._complete(r)
            deadline = time.monotonic() + self._timeout_s
            while self._generation == generation:
                self._raise_if_failed(r, label)
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = [s for s in range(self._size) if s not in self._round]
                    error = RuntimeError(f"{label}: rank {r} waited {self._timeout_s:g} s (the group's timeout_s) "
                                         f"for ranks {missing}, which did not call it")
                    self._fail(r, error)
                    raise error
                self._cond.wait(min(left, threading.TIMEOUT_MAX))
            outcome = self._outcomes[generation]
            outcome[2] -= 1
            if outcome[2] == 0:
                del self._outcomes[generation]
            return self._hand_out(outcome[0], outcome[1])

    def _complete(self, rank: int) -> list[Any]:
        """The last rank arrived (lock held): close the round and hand out its outcome."""
        labels = [self._round[s][0] for s in range(self._size)]
        items = [self._round[s][1] for s in range(self._size)]
        mismatch = mismatch_message(labels) if len(set(labels)) > 1 else None
        if mismatch is not None:
            items = []
        self._round = {}
        if self._size > 1:
            self._outcomes[self._generation] = [items, mismatch, self._size - 1]
        self._generation += 1
        self._cond.notify_all()
        return self._hand_out(items, mismatch)

    @staticmethod
    def _hand_out(items: list[Any], mismatch: str | None) -> list[Any]:
        if mismatch is not None:
            raise CollectiveMismatch(mismatch)
        return list(items)

    def barrier(self, rank: int) -> None:
        """Rank ``rank`` waits for every rank (a blocking collective; one rank alone returns at once)."""
        r = self._rank_arg(f"{type(self).__name__}.barrier", rank)
        if self._size > 1:
            self.exchange(r, None, collective_label("barrier"))

    def abort(self, rank: int, error: BaseException) -> None:
        """Rank ``rank`` failed with ``error``: every pending and later blocking collective raises
        :class:`PeerFailed`, naming it."""
        r = self._rank_arg(f"{type(self).__name__}.abort", rank)
        with self._cond:
            self._fail(r, error)

    def leave(self, rank: int) -> None:
        """Rank ``rank`` is done with the group (its thread returned): a collective that waits
        for it, now or later, raises :class:`PeerFailed` at once instead of waiting for the timeout."""
        self.abort(rank, _Left(f"rank {int(rank)} left the group (its function returned) without joining"))

    def _fail(self, rank: int, error: BaseException) -> None:
        self._failed.setdefault(rank, error)
        self._round = {}  # nothing of a round that cannot complete is handed out
        self._cond.notify_all()

    def _raise_if_failed(self, rank: int, label: str) -> None:
        if not self._failed:
            return
        who = min(self._failed, key=lambda s: (isinstance(self._failed[s], _Left), s))
        e = self._failed[who]
        what = str(e) if isinstance(e, _Left) else f"rank {who} failed: {type(e).__name__}: {e}"
        raise PeerFailed(f"{label} on rank {rank}: {what}")

    # -- sequential collectives (one thread calls every rank in turn) -----------------------------

    def join(self, rank: int, item: Any) -> dict[int, Any] | None:
        """Add rank ``rank``'s item to the pending collective: every rank's item once the last one
        joined (the collective then starts afresh), else None.  A rank that joins twice replaces
        its item."""
        r = self._rank_arg(f"{type(self).__name__}.join", rank)
        with self._cond:
            self._pending[r] = item
            if len(self._pending) < self._size:
                return None
            items = dict(sorted(self._pending.items()))
            self._pending.clear()
            return items

    def pending_ranks(self) -> list[int]:
        """Ranks whose call waits for the rest of the sequential collective."""
        return sorted(self._pending)

    def reset(self) -> None:
        """Drop the pending sequential collective."""
        with self._cond:
            self._pending.clear()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(size={self._size})"


class LocalRank:
    """One rank's view of a :class:`LocalGroup` (``size()``, ``rank()``, ``barrier()``).

    Views compare equal when they name the same group and rank."""

    def __init__(self, group: LocalGroup, rank: int) -> None:
        self.group = group
        self._rank = rank

    def size(self) -> int:
        """The number of ranks of the group."""
        return self.group.size()

    def rank(self) -> int:
        """This view's rank."""
        return self._rank

    def barrier(self) -> None:
        """Wait for every rank (the group's :meth:`LocalGroup.barrier`)."""
        self.group.barrier(self._rank)

    def transport(self) -> LocalTransport:
        """This rank's :class:`~deepgemm_ref.comm.Transport`."""
        return LocalTransport(self.group, self._rank)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LocalRank) and other.group is self.group and other._rank == self._rank

    def __hash__(self) -> int:
        return hash((id(self.group), self._rank))

    def __repr__(self) -> str:
        return f"{self.group!r}.rank({self._rank})"


LocalGroup._view = LocalRank


class LocalTransport:
    """The :class:`~deepgemm_ref.comm.Transport` of a rank of a :class:`LocalGroup`, over
    :meth:`LocalGroup.exchange` (the ranks run in their own threads).

    Every array is copied once for each rank that receives it, so no rank holds memory that the
    caller or another rank holds."""

    def __init__(self, group: LocalGroup, rank: int) -> None:
        self.group = group
        self._rank = rank

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def size(self) -> int:
        return self.group.size()

    def barrier(self) -> None:
        """Every rank has arrived (a blocking collective, whatever the group's own ``barrier``)."""
        if self.size > 1:
            self.group.exchange(self._rank, None, collective_label("barrier"))

    def all_to_all(self, send: Sequence[np.ndarray]) -> list[np.ndarray]:
        """``send[d]`` (rows of one dtype and row shape) to rank d; the rows each rank sent here."""
        arrays = send_arrays("LocalTransport.all_to_all", send, self.size)
        label = collective_label("all_to_all", arrays[0])
        items = self.group.exchange(self._rank, [a.copy() for a in arrays], label)
        return [items[src][self._rank] for src in range(self.size)]

    def all_gather(self, x: np.ndarray) -> list[np.ndarray]:
        """Every rank's ``x`` in rank order (row counts may differ)."""
        a = as_rows("LocalTransport.all_gather", "x", x)
        items = self.group.exchange(self._rank, [a.copy() for _ in range(self.size)],
                                    collective_label("all_gather", a))
        return [items[src][self._rank] for src in range(self.size)]

    def all_gather_shared(self, x: np.ndarray) -> list[np.ndarray]:
        """Every rank's ``x`` in rank order, each copied once and shared, read-only, by every
        receiver (in-process groups only).

        Not part of the :class:`~deepgemm_ref.comm.Transport` protocol, whose ``all_gather``
        copies once per receiver: this is the in-process payload path of ``deepgemm_ref.ep``'s
        buffers, which only read what they receive (R copies of the payloads instead of R * R)."""
        a = as_rows("LocalTransport.all_gather_shared", "x", x)
        mine = a.copy()
        mine.flags.writeable = False
        return self.group.exchange(self._rank, mine, collective_label("all_gather", a))


def run_emulated(fn: Callable[..., Any], nprocs: int, args: Sequence[Any] = (),
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> list[Any]:
    """Run ``fn(group, *args)`` for ``nprocs`` ranks of a new :class:`LocalGroup`, one thread per
    rank; returns the return values in rank order.

    ``group`` is rank r's view (accepted wherever a process group is).  Collectives rendezvous
    between the threads, each wait bounded by ``timeout_s``.  If a rank raises, the others'
    pending and later collectives fail instead of hanging (:class:`PeerFailed`), and so do those
    that wait for a rank whose ``fn`` returned; the exception of the lowest rank that failed on
    its own (not for another rank's failure) is re-raised here, else the lowest rank's.
    """
    func = "run_emulated"
    if not callable(fn):
        raise arg_error(func, "fn", "a callable fn(group, *args)", type(fn).__name__)
    size = _size_arg(func, "nprocs", nprocs)
    if not isinstance(args, (tuple, list)):
        raise arg_error(func, "args", "a tuple of extra arguments", type(args).__name__)
    group = LocalGroup(size, timeout_s=_timeout_arg(func, timeout_s))
    results: list[Any] = [None] * size
    errors: dict[int, BaseException] = {}

    def body(r: int) -> None:
        try:
            results[r] = fn(group.rank(r), *args)
        except BaseException as e:  # noqa: BLE001 - handed to the caller below
            errors[r] = e
            group.abort(r, e)
        else:
            group.leave(r)

    # the ranks see the settings of the caller (its isolated block's own, in a golden run)
    threads = [threading.Thread(target=_state.propagate(body), args=(r,), name=f"deepgemm_ref-rank{r}", daemon=True)
               for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        own = [r for r, e in errors.items() if not isinstance(e, PeerFailed)]
        raise errors[min(own or errors)]
    return results
