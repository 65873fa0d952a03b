"""Row-chunked work on a small thread pool.

NumPy releases the GIL inside its loops, so independent row chunks run in parallel on the
pool; chunks small enough to stay in cache also make each pass cheaper.  Results never depend
on the chunking or the thread count: every chunk is computed by the same element-wise or
row-wise operations.  ``DEEPGEMM_REF_NUM_THREADS`` caps the pool (default: the CPU count).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

__all__ = ["num_threads", "parallel_chunks"]

_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_lock = threading.Lock()
_local = threading.local()


def num_threads() -> int:
    env = os.environ.get("DEEPGEMM_REF_NUM_THREADS")
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            pass
    return max(1, os.cpu_count() or 1)


def _get_pool(n: int) -> ThreadPoolExecutor:
    global _pool, _pool_size
    with _lock:
        if _pool is None or _pool_size != n:
            if _pool is not None:
                _pool.shutdown(wait=False)
            _pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="deepgemm_ref")
            _pool_size = n
        return _pool


def parallel_chunks(total: int, chunk: int, fn: Callable[[int, int], None]) -> None:
    """Call ``fn(start, stop)`` for consecutive chunks of ``range(total)``, in parallel."""
    chunk = max(1, chunk)
    bounds = [(i, min(total, i + chunk)) for i in range(0, total, chunk)]
    n = num_threads()
    # Nested use (a chunk function that itself parallelises) runs inline.
    if n == 1 or len(bounds) <= 1 or getattr(_local, "inside", False):
        for b in bounds:
            fn(*b)
        return

    def run(b: tuple[int, int]) -> None:
        _local.inside = True
        try:
            fn(*b)
        finally:
            _local.inside = False

    for f in [_get_pool(n).submit(run, b) for b in bounds]:
        f.result()
