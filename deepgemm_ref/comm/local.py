"""R ranks in one process: :class:`LocalGroup`, its rank views, and :func:`run_emulated`.

A rank view (``group.rank(r)``) is what DeepGEMM's and DeepEP's code expects of a
``torch.distributed`` process group (``rank()``, ``size()``, ``barrier()``) and is accepted
wherever a process group is.  Collectives come in two forms:

* :meth:`LocalGroup.exchange` (the ranks run in their own threads, :func:`run_emulated`): every
  rank hands in its item and blocks until all have, then every rank gets all items in rank order.
  A rank that waits longer than the group's ``timeout_s`` raises a ``RuntimeError`` naming the
  ranks that did not arrive; a rank that fails (:meth:`LocalGroup.abort`) makes every pending and
  later collective of the group raise, naming it.
* :meth:`LocalGroup.join` (the ranks' calls come one after another from one thread, as in Mega
  MoE's ``EmulatedGroup``): a call adds its item to the pending collective; the last rank's call
  receives every rank's item and completes it; the others return at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import arg_error

__all__ = ["LocalGroup", "LocalRank", "LocalTransport", "PeerFailed", "run_emulated"]

#: Default bound of a rank's wait in a collective (seconds).
DEFAULT_TIMEOUT_S = 120.0


class PeerFailed(RuntimeError):
    """A collective could not complete because another rank failed (or called another collective)."""


class LocalGroup:
    """``size`` ranks in one process; ``rank(r)`` is rank r's process-group view.

    timeout_s: the longest a rank waits in a blocking collective before it raises.
    """

    def __init__(self, size: int, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size <= 0:
            raise arg_error(type(self).__name__, "size", "a positive int", repr(size))
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
            raise arg_error(type(self).__name__, "timeout_s", "a positive number of seconds", repr(timeout_s))
        self._size = int(size)
        self.timeout_s = float(timeout_s)
        self._cond = threading.Condition()
        self._round: dict[int, Any] = {}
        self._labels: dict[int, str] = {}
        self._generation = 0
        self._results: dict[int, list[Any]] = {}
        self._failed: dict[int, BaseException] = {}
        self._pending: dict[int, Any] = {}

    def size(self) -> int:
        """The number of ranks."""
        return self._size

    def rank(self, rank: int) -> LocalRank:
        """Rank ``rank``'s process-group view (all views share this group)."""
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < self._size:
            raise arg_error(f"{type(self).__name__}.rank", "rank", f"an int in [0, {self._size})", repr(rank))
        return LocalRank(self, int(rank))

    # -- blocking collectives (one thread per rank) ----------------------------------------------

    def exchange(self, rank: int, item: Any, label: str = "collective") -> list[Any]:
        """Every rank's ``item`` in rank order, once every rank has handed in its own (blocks).

        ``label`` names the collective: ranks that call different collectives at once fail."""
        with self._cond:
            self._raise_if_failed(rank, label)
            generation = self._generation
            if rank in self._round:
                raise RuntimeError(f"{label}: rank {rank} entered the same collective twice")
            self._round[rank] = item
            self._labels[rank] = label
            if len(self._round) == self._size:
                labels = set(self._labels.values())
                items = [self._round[r] for r in range(self._size)]
                self._round, self._labels = {}, {}
                if len(labels) > 1:
                    error = RuntimeError(f"ranks called different collectives at once: {sorted(labels)}")
                    self._failed.setdefault(-1, error)
                    self._cond.notify_all()
                    raise error
                self._results[generation] = items
                self._generation += 1
                self._cond.notify_all()
                return items
            deadline = time.monotonic() + self.timeout_s
            while self._generation == generation:
                self._raise_if_failed(rank, label)
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = [r for r in range(self._size) if r not in self._round]
                    error = RuntimeError(f"{label}: rank {rank} waited {self.timeout_s:g} s for ranks {missing}")
                    self._failed.setdefault(rank, error)
                    self._cond.notify_all()
                    raise error
                self._cond.wait(left)
            items = self._results[generation]
            return items

    def abort(self, rank: int, error: BaseException) -> None:
        """Rank ``rank`` failed: every pending and later blocking collective raises, naming it."""
        with self._cond:
            self._failed.setdefault(rank, error)
            self._cond.notify_all()

    def _raise_if_failed(self, rank: int, label: str) -> None:
        failed = {r: e for r, e in self._failed.items() if r != rank}
        if failed:
            who = min(failed)
            name = "a collective mismatch" if who < 0 else f"rank {who} failed"
            raise PeerFailed(f"{label}: {name}: {type(failed[who]).__name__}: {failed[who]}")

    # -- sequential collectives (one thread calls every rank in turn) -----------------------------

    def join(self, rank: int, item: Any) -> dict[int, Any] | None:
        """Add rank ``rank``'s item to the pending collective: every rank's item once the last one
        joined (the collective then starts afresh), else None."""
        self._pending[rank] = item
        if len(self._pending) < self._size:
            return None
        items = dict(self._pending)
        self._pending.clear()
        return items

    def pending_ranks(self) -> list[int]:
        """Ranks whose call waits for the rest of the sequential collective."""
        return sorted(self._pending)

    def reset(self) -> None:
        """Drop the pending sequential collective."""
        self._pending.clear()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(size={self._size})"


class LocalRank:
    """One rank's view of a :class:`LocalGroup` (``size()``, ``rank()``, ``barrier()``)."""

    def __init__(self, group: LocalGroup, rank: int) -> None:
        self.group = group
        self._rank = rank

    def size(self) -> int:
        return self.group.size()

    def rank(self) -> int:
        return self._rank

    def barrier(self) -> None:
        """Wait for every rank (a blocking collective; one rank alone returns at once)."""
        if self.group.size() > 1:
            self.group.exchange(self._rank, None, "barrier")

    def transport(self) -> LocalTransport:
        return LocalTransport(self.group, self._rank)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LocalRank) and other.group is self.group and other._rank == self._rank

    def __hash__(self) -> int:
        return hash((id(self.group), self._rank))

    def __repr__(self) -> str:
        return f"{self.group!r}.rank({self._rank})"


class LocalTransport:
    """The :class:`~deepgemm_ref.comm.Transport` of a rank of a :class:`LocalGroup` (arrays are
    copied, so no rank holds a view of another rank's memory)."""

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
        LocalRank(self.group, self._rank).barrier()

    def all_to_all(self, send: Sequence[np.ndarray]) -> list[np.ndarray]:
        if len(send) != self.size:
            raise ValueError(f"all_to_all: {len(send)} arrays for {self.size} ranks")
        items = self.group.exchange(self._rank, [np.array(a, copy=True) for a in send], "all_to_all")
        return [items[src][self._rank] for src in range(self.size)]

    def all_gather(self, x: np.ndarray) -> list[np.ndarray]:
        items = self.group.exchange(self._rank, np.array(x, copy=True), "all_gather")
        return list(items)


def run_emulated(fn: Callable[..., Any], nprocs: int, args: Sequence[Any] = (),
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> list[Any]:
    """Run ``fn(group, *args)`` for ``nprocs`` ranks of a new :class:`LocalGroup`, one thread per
    rank; returns the return values in rank order.

    ``group`` is rank r's view (accepted wherever a process group is).  Collectives rendezvous
    between the threads, each wait bounded by ``timeout_s``.  If a rank raises, the others'
    pending collectives fail instead of hanging (:class:`PeerFailed`), and the exception of the
    lowest rank that failed on its own (not for another rank's failure) is re-raised here.
    """
    func = "run_emulated"
    if not callable(fn):
        raise arg_error(func, "fn", "a callable fn(group, *args)", type(fn).__name__)
    group = LocalGroup(nprocs, timeout_s=timeout_s)
    if not isinstance(args, (tuple, list)):
        raise arg_error(func, "args", "a tuple of extra arguments", type(args).__name__)
    results: list[Any] = [None] * group.size()
    errors: dict[int, BaseException] = {}

    def body(r: int) -> None:
        try:
            results[r] = fn(group.rank(r), *args)
        except BaseException as e:  # noqa: BLE001 - handed to the caller below
            errors[r] = e
            group.abort(r, e)

    threads = [threading.Thread(target=body, args=(r,), name=f"deepgemm_ref-rank{r}", daemon=True)
               for r in range(group.size())]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        own = [r for r, e in errors.items() if not isinstance(e, PeerFailed)]
        raise errors[min(own or errors)]
    return results
