"""What two threads can and cannot buy on this machine: the measurements behind the speed table's
two-thread rows (benchmarks/speed-table.md, "Two threads").

    python benchmarks/bench_threads.py

Three measurements, each in this process, each printed as its numbers and its ratio:

1. **OpenBLAS's idle workers spin.**  After a call with more than one BLAS thread, OpenBLAS's
   worker threads keep polling for new work (2^THREAD_TIMEOUT cycles by default, about a tenth of
   a second) before they sleep.  Measured as this process's CPU time during a sleep of the main
   thread right after a two-thread float64 GEMM, and again after that time.
2. **What the spin costs the work that follows.**  The same float64 GEMM as two halves, each a
   one-thread GEMM on one of two pool threads, timed right after a two-thread GEMM (the worker
   still spinning), after a 0.2 s pause (asleep) and after another such pair (no multi-threaded
   call before it).
3. **Elementwise passes on two threads.**  The same number of NumPy passes over tiles of a given
   size, on one thread and split over two: a multiply (a few cycles per element, the conversions'
   and roundings' kind of pass) and a square root (tens of cycles per element).

OpenBLAS reads ``OPENBLAS_THREAD_TIMEOUT`` (4 to 30, a power of two of cycles) once, when it is
loaded; the environment of the process that imports NumPy decides it, not this package.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from _common import ROOT  # noqa: F401, I001  (benchmarks run as scripts; puts the package on the path)

from deepgemm_ref import _parallel

GEMM = (1024, 2048, 4096)


def _median(fn: Callable[[], Any], before: Callable[[], Any], rounds: int = 7) -> float:
    times = []
    for _ in range(rounds):
        before()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def spin() -> None:
    m, n, k = GEMM
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((m, k)), rng.standard_normal((n, k))
    y = np.empty((m, n))
    _parallel.limit_blas_threads(2)
    np.matmul(a, b.T, out=y)
    time.sleep(0.5)
    np.matmul(a, b.T, out=y)
    c0 = time.process_time()
    time.sleep(0.05)
    c1 = time.process_time()
    time.sleep(0.2)
    c2 = time.process_time()
    print(f"1. CPU time of this process while its main thread sleeps, right after a two-thread GEMM: "
          f"{(c1 - c0) * 1e3:.0f} ms in the first 50 ms, {(c2 - c1) * 1e3:.0f} ms in the next 200 ms")

    def full() -> None:
        np.matmul(a, b.T, out=y)

    def halves() -> None:
        with _parallel.single_threaded_blas():
            _parallel.parallel_chunks(m, m // 2, lambda t0, t1: np.matmul(a[t0:t1], b.T, out=y[t0:t1]))

    t_full = _median(full, lambda: None)
    t_spin = _median(halves, full)
    t_rest = _median(halves, lambda: (full(), time.sleep(0.2)))
    t_own = _median(halves, halves)
    print(f"2. {m}x{n}x{k} float64 GEMM: one two-thread call {t_full * 1e3:.0f} ms; as two one-thread halves on "
          f"the pool: {t_spin * 1e3:.0f} ms right after a two-thread call ({t_spin / t_full:.2f}x), "
          f"{t_rest * 1e3:.0f} ms after a 0.2 s pause ({t_rest / t_full:.2f}x), {t_own * 1e3:.0f} ms after "
          f"another pair ({t_own / t_full:.2f}x)")


def passes() -> None:
    total = 1 << 26
    print("3. NumPy passes over 2^26 elements in tiles, one thread against two (the same tiles split "
          "between them):")
    for name, op in (("multiply", lambda x, o: np.multiply(x, 3.0, out=o)),
                     ("sqrt", lambda x, o: np.sqrt(x, out=o))):
        for n in (1 << 12, 1 << 15, 1 << 18):
            times = []
            for threads in (1, 2):
                reps = total // n // threads

                def work(reps: int = reps, n: int = n, op: Any = op) -> None:
                    x = np.random.default_rng(0).random(n)
                    o = np.empty_like(x)
                    for _ in range(reps):
                        op(x, o)

                runs = []
                for _ in range(3):
                    ts = [threading.Thread(target=work) for _ in range(threads)]
                    t0 = time.perf_counter()
                    for t in ts:
                        t.start()
                    for t in ts:
                        t.join()
                    runs.append(time.perf_counter() - t0)
                times.append(statistics.median(runs))
            print(f"   {name:8s} tiles of 2^{n.bit_length() - 1:<2d} elements: one thread {times[0] * 1e3:6.1f} ms, "
                  f"two {times[1] * 1e3:6.1f} ms: {times[0] / times[1]:.2f}x faster")


if __name__ == "__main__":
    spin()
    passes()
