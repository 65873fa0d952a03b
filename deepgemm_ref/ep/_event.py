"""DeepEP's ``EventHandle`` and ``EventOverlap`` on the CPU: every call has finished when it returns.

``EventOverlap`` follows DeepEP-Ascend's version (contract 9), a superset of DeepEP's:
``current_stream_wait`` returns what the registered hook returns (DeepEP returns ``None``), the
hook is cleared *before* it is called (a failing hook is not retried; a hook may register a
successor), and ``wait()`` is ``current_stream_wait()``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import arg_error

__all__ = ["EventHandle", "EventOverlap"]


# Note: events are complete when captured (every call finishes before it returns); EventOverlap is
# DeepEP-Ascend's (current_stream_wait returns the hook's result; wait()).
class EventHandle:
    """A captured point of the current stream.  On the CPU the work before it has completed when
    it is captured, so waiting on it is a no-op."""

    def __init__(self) -> None:
        self.completed = True

    def current_stream_wait(self) -> None:
        """Make the current stream wait for the event (already complete: nothing to wait for)."""
        return None

    def __repr__(self) -> str:
        return "EventHandle(completed)"


class EventOverlap:
    """A wrapper of an :class:`EventHandle` for overlapping, with a hook run after the wait.

    event:          the captured event, or None (a synchronous call returns an overlap without one).
    extra_tensors:  tensors to keep alive until the wait (kept, unused).
    """

    def __init__(self, event: EventHandle | None = None, extra_tensors: tuple[Any, ...] | None = None) -> None:
        self.event = event
        self.extra_tensors = extra_tensors
        self._release_handle_by_call = False
        self.hook_after_wait: Callable[[], Any] | None = None

    def current_stream_wait(self, release_handle: bool = False) -> Any:
        """Wait for the event, then run (and clear, before calling it) the registered hook;
        returns the hook's result (``None`` without a hook).  ``release_handle`` drops the event."""
        if self.event is None:
            # DeepEP asserts here; the package's utility error is also an AssertionError.
            raise arg_error("EventOverlap.current_stream_wait", "self.event",
                            "an event (the call was made with async_with_compute_stream=True)", "None",
                            utility=True)
        self.event.current_stream_wait()
        result = None
        hook = self.hook_after_wait
        if hook is not None:
            self.hook_after_wait = None
            result = hook()
        if release_handle:
            self.event = None
        return result

    def wait(self) -> Any:
        """``current_stream_wait()`` (DeepEP-Ascend's name): the hook's result."""
        return self.current_stream_wait()

    def register_hook_after_wait(self, hook_after_wait: Callable[[], Any]) -> None:
        """Register the hook run by the next :meth:`current_stream_wait` (one at a time)."""
        if self.hook_after_wait is not None:
            raise arg_error("EventOverlap.register_hook_after_wait", "hook_after_wait",
                            "no hook registered yet (one hook at a time)", "a hook is already registered",
                            utility=True)
        if not callable(hook_after_wait):
            raise arg_error("EventOverlap.register_hook_after_wait", "hook_after_wait", "a callable",
                            type(hook_after_wait).__name__, utility=True)
        self.hook_after_wait = hook_after_wait

    def __call__(self, release_handle: bool = False) -> EventOverlap:
        """Set ``release_handle`` for the next ``with`` block; returns this object."""
        self._release_handle_by_call = release_handle
        return self

    def __enter__(self) -> Any:
        """``with event_overlap:`` (DeepEP's overlap idiom): the block runs, the wait comes at its end."""
        return self

    def __exit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> None:
        """Wait for the event (runs its hook) when there is one; the release flag of ``__call__`` is reset."""
        if self.event is not None:
            self.current_stream_wait(release_handle=self._release_handle_by_call)
        self._release_handle_by_call = False
