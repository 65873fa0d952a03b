"""Row-chunked work on a small thread pool.

NumPy releases the GIL inside its loops, so independent row chunks run in parallel on the
pool; chunks small enough to stay in cache also make each pass cheaper.  Results never depend
on the chunking or the thread count: every chunk is computed by the same element-wise or
row-wise operations.  ``DEEPGEMM_REF_NUM_THREADS`` caps the pool (default: the CPU count).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from . import _state

__all__ = ["num_threads", "parallel_chunks", "limit_blas_threads", "single_threaded_blas", "blas_pinned"]

_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_lock = threading.Lock()
_local = threading.local()


def _reset_after_fork() -> None:
    """A forked child has none of the parent's pool threads: start from a fresh pool and lock."""
    global _pool, _pool_size, _lock
    _pool, _pool_size, _lock = None, 0, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


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
    """Call ``fn(start, stop)`` for consecutive chunks of ``range(total)``, in parallel.

    One task per pool thread (at most one per chunk) takes the next chunk from a shared counter
    until none is left: a call costs a few task hand-overs whatever its number of chunks (a
    task per chunk cost tens of microseconds each, which small in-cache tiles do not repay).
    Every chunk runs on a pool thread, as before; the first error (in chunk order) is raised
    once every task has stopped, and no chunk starts after one has failed.
    """
    chunk = max(1, chunk)
    bounds = [(i, min(total, i + chunk)) for i in range(0, total, chunk)]
    n = min(num_threads(), len(bounds))
    # Nested use (a chunk function that itself parallelises) runs inline.
    if n <= 1 or getattr(_local, "inside", False):
        for b in bounds:
            fn(*b)
        return

    taken = itertools.count()  # next() on it is atomic: each chunk is taken exactly once
    failed: list[tuple[int, BaseException]] = []

    def run() -> None:
        _local.inside = True
        try:
            while not failed:
                i = next(taken)
                if i >= len(bounds):
                    return
                try:
                    fn(*bounds[i])
                except BaseException as e:  # noqa: BLE001 - re-raised in the calling thread
                    failed.append((i, e))
                    return
        finally:
            _local.inside = False

    task = _state.propagate(run)  # an isolated settings block's values travel to the pool's threads
    pool = _get_pool(num_threads())
    for f in [pool.submit(task) for _ in range(n)]:
        f.result()
    if failed:
        raise min(failed, key=lambda x: x[0])[1]


_pinned = 0
_pin_lock = threading.Lock()
_SET_SYMBOLS = ("openblas_set_num_threads", "scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
                "openblas_set_num_threads64_")
_GET_SYMBOLS = ("openblas_get_num_threads", "scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads",
                "openblas_get_num_threads64_")


_found: tuple[Any, Any] | None = None


def _openblas() -> tuple[Any, Any] | None:
    """(set_num_threads, get_num_threads) of the OpenBLAS loaded in this process, or None.

    Looked up in ``/proc/self/maps`` (Linux; NumPy's wheels bundle OpenBLAS) the first time it is
    found, then remembered (a library stays loaded; a forked child maps it at the same address):
    reading the maps took about 1.5 ms, and every golden computation asks several times.
    """
    global _found
    if _found is None:
        _found = _find_openblas()
    return _found


def _find_openblas() -> tuple[Any, Any] | None:
    import ctypes

    try:
        with open("/proc/self/maps") as f:
            paths = sorted({ln.split()[-1] for ln in f if "openblas" in ln.lower() and ln.split()[-1].startswith("/")})
    except OSError:
        return None
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        setter = next((getattr(lib, n) for n in _SET_SYMBOLS if hasattr(lib, n)), None)
        getter = next((getattr(lib, n) for n in _GET_SYMBOLS if hasattr(lib, n)), None)
        if setter is not None and getter is not None:
            getter.restype = ctypes.c_int
            return setter, getter
    return None


def limit_blas_threads(n: int) -> bool:
    """Best effort: set the thread count of the OpenBLAS loaded in this process (a forked worker
    keeps its parent's BLAS thread count, which ``OPENBLAS_NUM_THREADS`` no longer changes).
    Returns False where the library cannot be found.  Only the speed depends on it."""
    import ctypes

    lib = _openblas()
    if lib is None:
        return False
    lib[0](ctypes.c_int(max(1, int(n))))
    return True


@contextlib.contextmanager
def single_threaded_blas() -> Iterator[bool]:
    """Run the body with a one-thread BLAS, restoring the previous count afterwards.

    A multi-threaded OpenBLAS partitions a GEMM by thread count, so an inexact float64 GEMM (an
    accumulator the exactness certificate does not cover, or its error scale) can differ in the
    last bits between thread counts.  One BLAS thread makes every stored float64 tensor a function
    of the inputs alone on a given machine, whatever the number of worker processes.  Yields
    whether the BLAS could be pinned.
    """
    import ctypes

    global _pinned
    lib = _openblas()
    if lib is None:
        yield False
        return
    with _pin_lock:
        before = int(lib[1]())
        lib[0](ctypes.c_int(1))
        _pinned += 1
    try:
        yield True
    finally:
        with _pin_lock:
            _pinned -= 1
            if _pinned == 0:
                lib[0](ctypes.c_int(before))


def blas_pinned() -> bool:
    """Whether a :func:`single_threaded_blas` block is active: callers then run independent GEMMs
    on the package's own thread pool instead (same shapes, so the same bits)."""
    return _pinned > 0
