"""Row-chunked work on a small thread pool.

NumPy releases the GIL inside its loops, so independent row chunks run in parallel on the
pool (OpenBLAS's own worker threads where it runs multi-threaded, so that they do the work
rather than spin beside it); chunks small enough to stay in cache also make each pass cheaper.
Results never depend on the chunking or the thread count: every chunk is computed by the same
element-wise or row-wise operations.  ``DEEPGEMM_REF_NUM_THREADS`` caps the pool (default: the CPU count).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from . import _state

__all__ = ["num_threads", "parallel_chunks", "limit_blas_threads", "single_threaded_blas", "blas_pinned",
           "blas_threads_pool"]

_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_lock = threading.Lock()
_local = threading.local()


def _reset_after_fork() -> None:
    """A forked child has none of the parent's pool threads: start from a fresh pool and locks."""
    global _pool, _pool_size, _lock, _blas_region
    _pool, _pool_size, _lock = None, 0, threading.Lock()
    _blas_region = threading.Lock()


def _before_fork() -> None:
    """Wait for a region on OpenBLAS's threads to end (the GIL is released while waiting) and keep
    new ones off until the fork is done: OpenBLAS's own fork handler joins its worker threads,
    which a region's tasks (Python code) would keep from ever finishing while the forking thread
    holds the GIL.  (A fork from inside a chunk function cannot wait for its own region: not
    waited for.)"""
    global _fork_holds
    _fork_holds = not getattr(_local, "inside", False) and _blas_region.acquire()


def _after_fork_in_parent() -> None:
    global _fork_holds
    if _fork_holds:
        _fork_holds = False
        _blas_region.release()


_fork_holds = False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                        after_in_child=_reset_after_fork)


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

    One task per thread (at most one per chunk) takes the next chunk from a shared counter
    until none is left: a call costs a few task hand-overs whatever its number of chunks (a
    task per chunk cost tens of microseconds each, which small in-cache tiles do not repay).
    The tasks run on this thread and OpenBLAS's idle worker threads where the BLAS runs
    multi-threaded (:func:`_on_blas_threads`), else on the package's pool; the first error (in
    chunk order) is raised once every task has stopped, and no chunk starts after one has
    failed.  Nested use (a chunk function that itself parallelises) runs inline.
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
    err = np.geterr()  # NumPy's error state is per thread: the tasks take the caller's

    def take_chunks() -> None:
        while not failed:
            i = next(taken)
            if i >= len(bounds):
                return
            try:
                fn(*bounds[i])
            except BaseException as e:  # noqa: BLE001 - re-raised in the calling thread
                failed.append((i, e))
                return

    def run() -> None:
        _local.inside = True
        try:
            with np.errstate(**err):
                take_chunks()
        finally:
            _local.inside = False

    task = _state.propagate(run)  # an isolated settings block's values travel to the pool's threads
    if not _on_blas_threads(n, task):
        pool = _get_pool(num_threads())
        for f in [pool.submit(task) for _ in range(n)]:
            f.result()
    if failed:
        raise min(failed, key=lambda x: x[0])[1]


# ----------------------------------------------------------------------------------------------
# OpenBLAS's own threads as the pool
# ----------------------------------------------------------------------------------------------

_pthread: Any = None  # (gotoblas_pthread, callback type) of the OpenBLAS found, False if none
_blas_region = threading.Lock()


def _find_pthread() -> Any:
    """(``gotoblas_pthread``, its callback type) of the OpenBLAS found, where it is the pthreads
    build (``gotoblas_pthread`` runs a function on the calling thread and idle worker threads);
    else False."""
    import ctypes

    if _openblas() is None or _handle is None:
        return False
    fn = getattr(_handle, "gotoblas_pthread", None)
    parallel = next((getattr(_handle, n) for n in _PARALLEL_SYMBOLS if hasattr(_handle, n)), None)
    if fn is None or parallel is None:
        return False
    parallel.restype = ctypes.c_int
    if int(parallel()) != 1:  # 0: sequential build, 2: OpenMP build
        return False
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    return fn, ctypes.CFUNCTYPE(None, ctypes.c_void_p)


_MAX_BLAS_THREADS = 64  # gotoblas_pthread's queue holds at most MAX_CPU_NUMBER (64 in NumPy's wheels) tasks
_PARALLEL_SYMBOLS = ("openblas_get_parallel", "scipy_openblas_get_parallel64_", "scipy_openblas_get_parallel",
                     "openblas_get_parallel64_")


def _blas_threads_usable(n: int) -> bool:
    """Whether ``n`` tasks can run on OpenBLAS's threads at all: a pthreads OpenBLAS with
    ``gotoblas_pthread`` that runs at least ``n`` threads outside every pinned block."""
    global _pthread
    if _pthread is None:
        _pthread = _find_pthread()
    return bool(_pthread) and 2 <= n <= _MAX_BLAS_THREADS and _outer_blas_threads() >= n


def blas_threads_pool(n: int) -> bool:
    """Whether :func:`parallel_chunks` would now run ``n`` tasks on OpenBLAS's own threads (it
    may not by the time it runs: another caller may have started a region meanwhile)."""
    return _blas_threads_usable(n) and not _blas_region.locked()


def _on_blas_threads(n: int, task: Callable[[], None]) -> bool:
    """Run ``task`` on ``n`` threads: this one and ``n - 1`` of OpenBLAS's worker threads, the BLAS
    pinned to one thread meanwhile; False (nothing run) where that cannot be done safely.

    Why: after a multi-threaded BLAS call OpenBLAS's workers spin for a while (about 0.1 s)
    waiting for more work.  The package's own pool threads then share the cores with them: on two
    cores, a call right after a two-thread GEMM (the user's or its own) ran its pool passes about
    a third slower.  On the workers themselves the spinning thread does the work instead.

    Only where OpenBLAS (pthreads build) already runs at least ``n`` threads outside every
    :func:`single_threaded_blas` block (so it has ``n - 1`` workers), and one region at a time (a
    second concurrent caller takes the package's pool).  Inside, every BLAS call of the tasks is
    single-threaded, so none of them asks a worker for help: a worker that runs a task never
    waits for another worker.
    """
    if not _blas_threads_usable(n) or not _blas_region.acquire(blocking=False):
        return False
    fn, cb_type = _pthread
    errors: list[BaseException] = []

    def body(_arg: Any) -> None:
        try:
            task()
        except BaseException as e:  # noqa: BLE001 - a callback must not raise; re-raised below
            errors.append(e)

    cb = cb_type(body)
    try:
        with single_threaded_blas():
            fn(n, cb, None, 0)
    finally:
        _blas_region.release()
    if errors:
        raise errors[0]
    return True


_pinned = 0
_pin_lock = threading.Lock()
_SET_SYMBOLS = ("openblas_set_num_threads", "scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
                "openblas_set_num_threads64_")
_GET_SYMBOLS = ("openblas_get_num_threads", "scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads",
                "openblas_get_num_threads64_")


_found: tuple[Any, Any] | None = None
_handle: Any = None  # the OpenBLAS library found (ctypes.CDLL)


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
            global _handle
            _handle = lib
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

    global _pinned, _outer
    lib = _openblas()
    if lib is None:
        yield False
        return
    with _pin_lock:
        if _pinned == 0:  # the count outside every block, put back when the last one ends
            _outer = int(lib[1]())
            lib[0](ctypes.c_int(1))
        _pinned += 1
    try:
        yield True
    finally:
        with _pin_lock:
            _pinned -= 1
            if _pinned == 0:
                lib[0](ctypes.c_int(_outer))


_outer = 1


def _outer_blas_threads() -> int:
    """The BLAS's thread count outside every :func:`single_threaded_blas` block."""
    lib = _openblas()
    if lib is None:
        return 1
    with _pin_lock:
        return _outer if _pinned else int(lib[1]())


def blas_pinned() -> bool:
    """Whether a :func:`single_threaded_blas` block is active: callers then run independent GEMMs
    on the package's own thread pool instead (same shapes, so the same bits)."""
    return _pinned > 0
