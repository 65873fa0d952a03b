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

A ``torch.distributed`` process group of several processes (one rank each, gloo on a CPU) is the
other form: its :class:`ProcessRegistry` holds this process's rank alone, and a kernel call
computes this rank's outputs at once through the group's collectives
(:class:`~deepgemm_ref.comm.TorchTransport`), as every rank's process calls the kernel.
"""

from __future__ import annotations

from typing import Any

from ..comm import LocalGroup, LocalRank, Transport, transport
from ..errors import arg_error

__all__ = ["GroupRegistry", "EmulatedRank", "ProcessRegistry", "Registry", "resolve_group"]


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


class ProcessRegistry:
    """This process's rank of a ``torch.distributed`` process group whose ranks are processes:
    the group, its transport, and this rank's symmetric buffer (other ranks' live in their
    processes).  Kernel calls are collective over the group's processes (``collective`` True)."""

    collective = True

    def __init__(self, group: Any, transport: Transport) -> None:
        self.group = group
        self.transport = transport
        self._size = transport.size
        self._rank = transport.rank
        self._buffer: Any = None

    def size(self) -> int:
        """The number of ranks (processes) of the group."""
        return self._size

    def rank_index(self) -> int:
        """This process's rank in the group."""
        return self._rank

    def buffer(self, rank: int) -> Any:
        """This rank's most recent SymmBuffer (None for other ranks: their buffers live in their processes)."""
        return self._buffer if rank == self._rank else None

    def register_buffer(self, rank: int, buffer: Any) -> None:
        """Record ``buffer`` as this rank's symmetric buffer."""
        self._buffer = buffer

    def __repr__(self) -> str:
        return f"ProcessRegistry(rank {self._rank} of {self._size})"


#: What a kernel's group resolves to: ranks in this process, or this process's rank of processes.
Registry = GroupRegistry | ProcessRegistry


def resolve_group(func: str, group: Any) -> tuple[Registry, int]:
    """(registry, rank) of a ``group`` argument: a rank view of an EmulatedGroup (an
    :class:`EmulatedRank`, or any :class:`~deepgemm_ref.comm.LocalRank` of one), a
    ``torch.distributed`` process group (one rank per process: a :class:`ProcessRegistry`), or any
    other single-rank group (a rank view of a one-rank ``run_emulated`` group included)."""
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
        if n > 1 and not isinstance(group, LocalRank):
            try:
                t = transport(group, func, "group")
            except ValueError:
                pass
            else:
                return ProcessRegistry(group, t), t.rank
    # Note: a multi-rank group must be an EmulatedGroup rank view (ranks in this process) or a
    # torch.distributed process group (one rank per process); a run_emulated group's ranks are
    # threads, whose calls the kernels' sequential collective does not serve.
    raise arg_error(func, "group", "deepgemm_ref.mega.EmulatedGroup(size).rank(r), a torch.distributed process "
                    "group, or a one-rank group", f"{type(group).__name__} {group!r}")
