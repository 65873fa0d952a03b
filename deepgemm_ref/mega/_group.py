"""An expert-parallel process group emulated inside one process: the registry of its ranks.

A :class:`GroupRegistry` (public as :class:`deepgemm_ref.mega.EmulatedGroup`, which adds the
kernels' ``bind``) is shared by its rank views ``group.rank(r)``; a rank view
is what DeepGEMM's mega-MoE code expects of a ``torch.distributed`` process group (``size()``,
``rank()``, ``barrier()``).  Every :class:`SymmBuffer` made on a rank view registers itself as
that rank's symmetric buffer, so one process holds every rank's buffer.

Kernel calls are collective, as on the devices:

* ``collective=True`` (default): a call for rank r checks its arguments and joins the pending
  collective; when every rank of the group has joined, the whole layer is computed (reading every
  rank's inputs from its buffer) and every rank's ``y``, statistics and receive counts are
  written.  The calls before the last one return with their outputs not yet written.
* ``collective=False``: a call for rank r computes rank r's outputs at once.  Tokens routed to
  other ranks' experts need those ranks' weights and token counts: the ones of their most recent
  call, or those given with :meth:`EmulatedGroup.bind`.
"""

from __future__ import annotations

from typing import Any

from ..errors import arg_error

__all__ = ["GroupRegistry", "EmulatedRank", "resolve_group"]


class GroupRegistry:
    """``size`` EP ranks in one process: every rank's symmetric buffer, binding and pending call.

    A plain registry: it stores what the buffers and the kernels put into it and decides nothing
    (validation and computation are the kernels'; :class:`deepgemm_ref.mega.EmulatedGroup` is
    this registry with the kernels' ``bind``).  ``rank(r)`` gives rank r's process-group view.
    """

    def __init__(self, size: int, *, collective: bool = True) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise arg_error("EmulatedGroup", "size", "a positive int", repr(size))
        self._size = size
        self.collective = bool(collective)
        self._buffers: list[Any] = [None] * size  # each rank's SymmBuffer (this module stores, never reads them)
        self._pending: dict[int, Any] = {}
        self._bound: dict[int, Any] = {}

    def size(self) -> int:
        """The number of ranks."""
        return self._size

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

    def join(self, rank: int, call: Any) -> dict[int, Any] | None:
        """Add rank ``rank``'s call to the pending collective: every rank's call once the last one
        joined (the collective then starts afresh), else None."""
        self._pending[rank] = call
        if len(self._pending) < self._size:
            return None
        calls = dict(self._pending)
        self._pending.clear()
        return calls

    def pending_ranks(self) -> list[int]:
        """Ranks whose kernel call waits for the rest of the collective."""
        return sorted(self._pending)

    def reset(self) -> None:
        """Drop the pending collective and every binding."""
        self._pending.clear()
        self._bound.clear()

    def __repr__(self) -> str:
        return f"EmulatedGroup(size={self._size}, collective={self.collective})"


class EmulatedRank:
    """One rank's view of a group (``size()``, ``rank()``, ``barrier()``)."""

    def __init__(self, group: GroupRegistry, rank: int) -> None:
        self.group = group
        self._rank = rank

    def size(self) -> int:
        return self.group.size()

    def rank(self) -> int:
        return self._rank

    def barrier(self) -> None:
        """Nothing to wait for in one process."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, EmulatedRank) and other.group is self.group and other._rank == self._rank

    def __hash__(self) -> int:
        return hash((id(self.group), self._rank))

    def __repr__(self) -> str:
        return f"EmulatedRank({self._rank} of {self.group.size()})"


def resolve_group(func: str, group: Any) -> tuple[GroupRegistry, int]:
    """(registry, rank) of a ``group`` argument: an EmulatedRank, or any single-rank group."""
    if isinstance(group, EmulatedRank):
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
    # accepted only with one rank (everything runs in this process).
    raise arg_error(func, "group", "deepgemm_ref.mega.EmulatedGroup(size).rank(r), or a one-rank process group",
                    f"{type(group).__name__} {group!r}")
