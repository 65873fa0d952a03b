"""The memory limit in force and the progress of long work inside one call (base layer).

The toolkit's size guards (:mod:`.toolkit.sizes`) and the core's streaming both read the limit
here, so that the core (numerics layer) sizes its float64 work from the limit the golden workflow
sets per case without importing the toolkit:

* :func:`allocation_limit`: the innermost :func:`limit_allocations` of this thread, else
  :func:`default_memory_limit` (half of the total physical memory, or of the cgroup's limit when
  lower).
* :func:`work_budget`: the bytes the core's float64 work of one call (operand copies, GEMM
  chunks, error-scale buffers) may take: what :func:`limit_work` set (generation: the case's
  limit less its own tensors), else a quarter of the limit; at least 1 MiB.
* :func:`report_work` / :func:`work_progress`: a long call reports the share of its own work
  done (chunk by chunk) to the callback the caller installed for this thread.

Nothing here allocates or imports anything of the package.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["physical_memory", "cgroup_memory_limit", "default_memory_limit", "allocation_limit",
           "limit_allocations", "work_budget", "limit_work", "WORK_FRACTION", "MIN_WORK_BUDGET", "work_progress",
           "work_reporter"]

#: The share of the limit the float64 work of one call may take (the rest holds the call's own
#: tensors: inputs, outputs, accumulator, error scale).
WORK_FRACTION = 4
#: The work budget is never below this (a chunk of a few rows and its temporaries).
MIN_WORK_BUDGET = 1 << 20


def physical_memory() -> int | None:
    """Total physical memory in bytes (``os.sysconf``), or None where unknown."""
    try:
        pages = os.sysconf("SC_PHYS_PAGES")
        page = os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None
    return int(pages) * int(page) if pages > 0 and page > 0 else None


def cgroup_memory_limit() -> int | None:
    """The memory limit of this process's cgroup (v2 ``memory.max``, v1
    ``memory.limit_in_bytes``) in bytes, or None where there is none or it cannot be read."""
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path, "rb") as f:
                text = f.read(64).decode("ascii").strip()
        except (OSError, UnicodeDecodeError):
            continue
        if text.isdigit() and 0 < int(text) < (1 << 60):  # v1 says "no limit" with a huge number
            return int(text)
    return None


def default_memory_limit() -> int:
    """Half of the total physical memory, or of this process's cgroup memory limit when that is
    lower: a number stable from run to run (not the memory available at the moment).  8 GiB where
    neither can be read; never below 256 MiB."""
    known = [x for x in (physical_memory(), cgroup_memory_limit()) if x]
    return max(1 << 28, min(known) // 2) if known else 8 << 30


_local = threading.local()


def allocation_limit() -> int:
    """The bytes one derived allocation may take: the innermost :func:`limit_allocations`, else
    :func:`default_memory_limit`."""
    limit = _innermost("limits")
    return default_memory_limit() if limit is None else int(limit)


def _innermost(name: str) -> Any:
    """The value the innermost :func:`_pushed` of ``name`` set in this thread, else None."""
    stack = getattr(_local, name, None)
    return stack[-1] if stack else None


@contextmanager
def _pushed(name: str, value: Any) -> Iterator[None]:
    """Within the block (this thread), ``value`` is the innermost of the thread-local stack ``name``."""
    stack = getattr(_local, name, None)
    if stack is None:
        stack = []
        setattr(_local, name, stack)
    stack.append(value)
    try:
        yield
    finally:
        stack.pop()


@contextmanager
def limit_allocations(limit: int) -> Iterator[None]:
    """Within the block (this thread), derived allocations above ``limit`` bytes are refused and
    the core's float64 work streams within :func:`work_budget` of it."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        from .errors import arg_error

        raise arg_error("limit_allocations", "limit", "a positive number of bytes", repr(limit))
    with _pushed("limits", limit):
        yield


def work_budget() -> int:
    """Bytes of float64 work one call may hold at once: the innermost :func:`limit_work` of this
    thread, else :func:`allocation_limit` / :data:`WORK_FRACTION`; at least
    :data:`MIN_WORK_BUDGET`."""
    budget = _innermost("work")
    return max(MIN_WORK_BUDGET, allocation_limit() // WORK_FRACTION if budget is None else budget)


@contextmanager
def limit_work(budget: int) -> Iterator[None]:
    """Within the block (this thread), :func:`work_budget` is ``budget`` bytes (the golden workflow:
    the case's limit less its own tensors)."""
    with _pushed("work", int(budget)):
        yield


def work_reporter() -> Callable[[float], None] | None:
    """The callback :func:`work_progress` installed for this thread (read it in the calling thread,
    call it from any thread): ``f(share)`` with the share of the call's work done, in [0, 1]."""
    fn: Callable[[float], None] | None = _innermost("progress")
    return fn


@contextmanager
def work_progress(fn: Callable[[float], None]) -> Iterator[None]:
    """Within the block (this thread), long calls report the share of their work done to ``fn``
    (from any thread; ``fn`` must be thread-safe and fast)."""
    with _pushed("progress", fn):
        yield
