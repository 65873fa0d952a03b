"""Progress of long golden work (generation, replay, check, verify --regenerate).

The work functions report to a :class:`Progress`-like object: ``start(total, total_work)``, then
``update(done, done_work, what)`` after each case, then ``finish()``.  ``work`` is each case's
estimated cost (:mod:`.resources`), so the ETA is weighted by what is left to do, not by the
number of cases: ``eta = elapsed / done_work * (total_work - done_work)``.

:class:`Progress` writes to a stream (stderr by default): on a terminal one line redrawn in
place (a bar, done/total, ETA); elsewhere (a log file, a CI job, a pipe) one line every
``interval`` seconds (default 3, or ``DEEPGEMM_REF_PROGRESS_INTERVAL``) with done/total, elapsed
and ETA, plus one at the start and one at the end.  A plain callable ``f(done, total, what)`` is
accepted wherever a progress object is (:func:`as_progress`).

Inside the cases in flight: ``case_started(what, work)`` names a case and ``within(share, what)``
reports the share of its own work done (the core reports it chunk by chunk,
:func:`deepgemm_ref._memory.work_progress`; ``golden --jobs`` workers send theirs to the parent);
the line then adds ``"40% of <case>"`` for each (two at most, then a count) and the work share
counts their done parts; ``update`` after a case ends drops it.  From ``start`` to ``finish`` a
heartbeat thread writes the line again whenever nothing was written for ``interval`` seconds (a
chunk longer than the interval, a Dask or rank-process case that reports nothing until it ends),
so that a log is never silent for longer than the interval.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol, TextIO

from .resources import format_seconds
from .text import count

__all__ = ["Progress", "ProgressLike", "as_progress"]


class ProgressLike(Protocol):
    def start(self, total: int, total_work: float) -> None: ...

    def update(self, done: int, done_work: float, what: str = "") -> None: ...

    def finish(self) -> None: ...


class _Callback:
    """A ``f(done, total, what)`` callable as a progress object."""

    def __init__(self, fn: Callable[[int, int, str], Any]) -> None:
        self.fn = fn
        self.total = 0

    def start(self, total: int, total_work: float) -> None:
        self.total = total
        self.fn(0, total, "")

    def update(self, done: int, done_work: float, what: str = "") -> None:
        self.fn(done, self.total, what)

    def finish(self) -> None:
        pass


class _Silent:
    def start(self, total: int, total_work: float) -> None:
        pass

    def update(self, done: int, done_work: float, what: str = "") -> None:
        pass

    def finish(self) -> None:
        pass


def as_progress(p: Any) -> ProgressLike:
    """None -> silent; an object with ``start`` / ``update`` / ``finish`` -> itself; a callable
    ``f(done, total, what)`` -> wrapped."""
    if p is None:
        return _Silent()
    if all(hasattr(p, m) for m in ("start", "update", "finish")):
        return p
    if callable(p):
        return _Callback(p)
    raise TypeError(f"progress: expected None, a progress object or a callable; got {type(p).__name__}")


def _interval() -> float:
    try:
        v = float(os.environ.get("DEEPGEMM_REF_PROGRESS_INTERVAL", "3"))
    except ValueError:
        return 3.0
    return v if math.isfinite(v) and v > 0 else 3.0


class Progress:
    """Progress lines on ``stream`` (see the module docstring); ``label`` starts each line."""

    def __init__(self, label: str, stream: TextIO | None = None, *, tty: bool | None = None,
                 interval: float | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.tty = _isatty(self.stream) if tty is None else tty
        self.interval = _interval() if interval is None else interval
        self.clock = clock
        self.total = 0
        self.total_work = 0.0
        self.done = 0
        self.done_work = 0.0
        self.t0 = clock()
        self.last = -math.inf
        self.started = False
        #: the cases in flight, in the order they started: name -> [estimated work, share done]
        self.cases: dict[str, list[float]] = {}
        self._lock = threading.RLock()
        self._beat: threading.Thread | None = None
        self._stop = threading.Event()
        #: the heartbeat thread runs only with the real clock on a non-terminal stream
        self.heartbeat = clock is time.monotonic and not self.tty

    def start(self, total: int, total_work: float) -> None:
        self.total, self.total_work = total, float(total_work)
        self.done, self.done_work = 0, 0.0
        self.t0 = self.clock()
        self.started = True
        self._emit("", force=True)
        self._start_heartbeat()

    def _start_heartbeat(self) -> None:
        if self.heartbeat and self.interval > 0 and self._beat is None:
            self._stop.clear()
            self._beat = threading.Thread(target=self._heartbeat, name="deepgemm-ref-progress", daemon=True)
            self._beat.start()

    def update(self, done: int, done_work: float, what: str = "") -> None:
        """``done`` cases (``done_work`` of the work) are finished, the last one ``what`` (no
        longer in flight; an unnamed update ends every case in flight)."""
        with self._lock:
            self.done, self.done_work = done, float(done_work)
            if what in self.cases:
                del self.cases[what]
            else:
                self.cases.clear()
            self._emit(what, force=done >= self.total)

    def case_started(self, what: str, work: float) -> None:
        """The case ``what`` (estimated ``work``) is now in flight."""
        with self._lock:
            self.cases[what] = [float(work), 0.0]

    def within(self, share: float, what: str | None = None) -> None:
        """The case ``what`` in flight (default: the one started last) has done ``share`` (0..1)
        of its work (any thread)."""
        with self._lock:
            if not self.cases:
                return
            key = next(reversed(self.cases)) if what is None else what
            case = self.cases.get(key)
            if case is None:
                return
            case[1] = min(1.0, max(case[1], float(share)))
            if not self.tty:
                self._emit("")

    def _heartbeat(self) -> None:
        while not self._stop.wait(max(0.05, self.interval / 4)):
            with self._lock:
                if self.started and self.clock() - self.last >= self.interval:
                    self._emit("")

    def finish(self) -> None:
        self._stop.set()
        beat, self._beat = self._beat, None
        if beat is not None:
            beat.join(timeout=1.0)
        if self.started and self.tty:
            self._write("\n")
        self.started = False

    def _work_done(self) -> float:
        """Work of the finished cases plus the done shares of the cases in flight."""
        return self.done_work + sum(work * share for work, share in self.cases.values())

    def eta(self) -> float:
        """Seconds left: the elapsed time per unit of work done, times the work left."""
        elapsed = self.clock() - self.t0
        done = self._work_done()
        if done <= 0 or self.total_work <= 0:
            return math.nan
        return elapsed / done * max(self.total_work - done, 0.0)

    def line(self, what: str = "") -> str:
        elapsed = self.clock() - self.t0
        done = self._work_done()
        share = done / self.total_work if self.total_work > 0 else (1.0 if self.total == 0 else 0.0)
        text = (f"{self.label}: {self.done}/{count(self.total, 'case')} ({100 * share:.0f}% of the work), "
                f"elapsed {format_seconds(elapsed)}, ETA {format_seconds(self.eta())}")
        if self.cases and not what:
            shown = [f"{100 * share:.0f}% of {name}" for name, (_, share) in list(self.cases.items())[:2]]
            more = len(self.cases) - len(shown)
            return text + ", " + ", ".join(shown) + (f" and {count(more, 'other case')}" if more else "")
        return text + (f", {what}" if what else "")

    def _emit(self, what: str, force: bool = False) -> None:
        now = self.clock()
        if self.tty:
            width = 24
            share = self._work_done() / self.total_work if self.total_work > 0 else (1.0 if self.done else 0.0)
            fill = min(width, int(width * share))
            bar = "#" * fill + "-" * (width - fill)
            self._write(f"\r{self.label} [{bar}] {self.done}/{self.total} ETA {format_seconds(self.eta()):>7} "
                        f"{what[:40]:<40}")
        elif force or now - self.last >= self.interval:
            self._write(self.line(what) + "\n")
            self.last = now

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # a closed or broken stream must not stop the work
            pass


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False
