"""An expert-parallel process group emulated inside one process: the registry of its ranks.

A :class:`GroupRegistry` (public as :class:`deepgemm_ref.mega.EmulatedGroup`, which adds the
kernels' ``bind``) is a :class:`deepgemm_ref.comm.LocalGroup`, the package's in-process group,
shared by its rank views ``group.rank(r)`` (:class:`EmulatedRank`, a
:class:`~deepgemm_ref.comm.LocalRank`); a rank view is what DeepGEMM's mega-MoE code expects of a
``torch.distributed`` process group (``size()``, ``rank()``, ``barrier()``) and what the rest of
the package accepts as one.  Every :class:`SymmBuffer` made on a rank view registers itself as
that rank's symmetric buffer, so one process holds every rank's buffer.

Kernel calls are collective, as on the devices:

* ``collective=True`` (default): a call for rank r checks its arguments and joins the pending
  collective (:meth:`~deepgemm_ref.comm.LocalGroup.join`, the sequential collective); when every
  rank of the group has joined, the whole layer is computed (reading every rank's inputs from its
  buffer) and every rank's ``y``, statistics and receive counts are written.  The calls before
  the last one return with their outputs not yet written.
* ``collective=False``: a call for rank r computes rank r's outputs at once.  Tokens routed to
  other ranks' experts need those ranks' weights and token counts: the ones of their most recent
  call, or those given with :meth:`EmulatedGroup.bind`.
"""

from __future__ import annotations

from typing import Any

from ..comm import LocalGroup, LocalRank
from ..errors import arg_error

__all__ = ["GroupRegistry", "EmulatedRank", "resolve_group"]


class GroupRegistry(LocalGroup):
    """``size`` EP ranks in one process: a :class:`~deepgemm_ref.comm.LocalGroup` (its rank views,
    its sequential collective :meth:`join` that the kernels' calls join, its blocking collectives
    for ranks that run in threads) plus what only Mega MoE keeps: every rank's symmetric buffer
    and binding.

    A plain registry: it stores what the buffers and the kernels put into it and decides nothing
    (validation and computation are the kernels'; :class:`deepgemm_ref.mega.EmulatedGroup` is
    this registry with the kernels' ``bind``).  ``rank(r)`` gives rank r's process-group view, an
    :class:`EmulatedRank` (a :class:`~deepgemm_ref.comm.LocalRank`, so the view is accepted
    wherever the package accepts a process group, e.g. by :mod:`deepgemm_ref.ep` with its ranks
    in threads).
    """

    def __init__(self, size: int, *, collective: bool = True) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise arg_error("EmulatedGroup", "size", "a positive int", repr(size))
        super().__init__(size)
        self.collective = bool(collective)
        self._buffers: list[Any] = [None] * size  # each rank's SymmBuffer (this module stores, never reads them)
        self._bound: dict[int, Any] = {}

    def rank(self, rank: int) -> EmulatedRank:
        """Rank ``rank``'s process-group view (all views share this group's registry)."""
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self._size:
            raise arg_error("EmulatedGroup.rank", "rank", f"an int in [0, {self._size})", repr(rank))
        return EmulatedRank(self, rank)

    def buffer(self, rank: int) -> Any:
        """The symmetric buffer (a :class:`~deepgemm_ref.mega.SymmBuffer`) most recently made for ``rank``
        (None before the first)."""
        return self._buffers[rank]

    def register_buffer(self, rank: int, buffer: Any) -> None:
        """Record ``buffer`` as rank ``rank``'s symmetric buffer."""
        self._buffers[rank] = buffer

    def binding(self, rank: int) -> Any:
        """Rank ``rank``'s most recent validated call or binding (None before the first)."""
        return self._bound.get(rank)

    def set_binding(self, rank: int, call: Any) -> None:
        """Record a validated call (or binding) of rank ``rank``."""
        self._bound[rank] = call

    def unbound_ranks(self) -> list[int]:
        """Ranks without a call or binding yet."""
        return [r for r in range(self._size) if r not in self._bound]

    def barrier(self, rank: int) -> None:
        """Returns at once: one thread plays every rank, so a rank has no one to wait for (the
        blocking barrier of ranks in threads is the transport's, :meth:`LocalRank.transport`)."""
        self._rank_arg("EmulatedGroup.barrier", rank)

    def reset(self) -> None:
        """Drop the pending collective and every binding."""
        super().reset()
        self._bound.clear()

    def __repr__(self) -> str:
        return f"EmulatedGroup(size={self._size}, collective={self.collective})"


class EmulatedRank(LocalRank):
    """One rank's view of an :class:`EmulatedGroup <GroupRegistry>` (``size()``, ``rank()``,
    ``barrier()``, which returns at once): a :class:`~deepgemm_ref.comm.LocalRank`."""

    group: GroupRegistry

    def __repr__(self) -> str:
        return f"EmulatedRank({self._rank} of {self.group.size()})"


def resolve_group(func: str, group: Any) -> tuple[GroupRegistry, int]:
    """(registry, rank) of a ``group`` argument: a rank view of an EmulatedGroup (an
    :class:`EmulatedRank`, or any :class:`~deepgemm_ref.comm.LocalRank` of one), or any
    single-rank group (a rank view of a one-rank ``run_emulated`` group included)."""
    if isinstance(group, LocalRank) and isinstance(group.group, GroupRegistry):
        return group.group, group.rank()
    size = getattr(group, "size", None)
    rank = getattr(group, "rank", None)
    if callable(size) and callable(rank):
        try:
            n, r = int(size()), int(rank())
        except Exception:  # pragma: no cover - foreign objects
            n, r = -1, -1
        if n == 1 and r == 0:
            return GroupRegistry(1), 0
    # Note: multi-rank groups must be EmulatedGroup rank views; a real torch.distributed group is
    # accepted only with one rank (everything runs in this process), and so is a run_emulated
    # group (its ranks run in threads; the kernels' collective is the sequential one).
    raise arg_error(func, "group", "deepgemm_ref.mega.EmulatedGroup(size).rank(r), or a one-rank process group",
                    f"{type(group).__name__} {group!r}")
