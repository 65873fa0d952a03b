"""The one executor: a kernel call's tasks through the core, into ``d``, into the trace.

A kernel function validates its arguments, translates them into :class:`Task` s and calls
:func:`execute`::

    tasks = [Task(a_op, b_op, OutputStage(out, alpha, c), index=(slice(r0, r1),)) for ...]
    execute(func, d, tasks, defined=rows_defined, zero=padding_rows)

A task is one matmul: two canonical operands (:class:`~deepgemm_ref.core.Operand`), the output
stage (format, ``alpha``, ``c``), and where the result goes: ``d[index]`` (and the same place in
the output-shaped trace arrays), or a ``sink`` that writes it itself (DeepGEMM-Ascend's FP8
output, MQA logits).  A task without an output stage computes the dot products themselves
(:func:`~deepgemm_ref.core.dot_products`) for a sink that finishes them.

:func:`execute` owns everything around the core: the accumulation model and MMA block arithmetic
in force (:func:`active_accumulation`, read once per call and passed to the core as values), the
padding policy's zero rows and copied blocks, writing ``d`` only after each task's result exists,
the accumulator / error-scale / stats collection a trace capture asks for, and the one
:class:`~deepgemm_ref.trace.KernelRecord` of the public call.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from . import core, dryrun, trace
from ._parallel import num_threads, parallel_chunks, single_threaded_blas
from .config import get_numerics
from .profiles import get_profile

__all__ = ["Task", "Collected", "active_accumulation", "run", "execute", "record"]


def active_accumulation() -> core.Accumulation:
    """The accumulation in force: the numerics option and the active profile's MMA arithmetic."""
    p = get_profile()
    return core.Accumulation(get_numerics().accumulation, p.fp32_block, p.mma_block_scaling)


@dataclass
class Collected:
    """Output-shaped trace arrays of one call (allocated on first use), and the core's stats.

    ``fill`` is the value of the elements no task reports (0 for GEMMs; NaN where outputs are
    unspecified outside the computed ranges, as for MQA logits).
    """

    shape: tuple[int, ...]
    want_acc: bool
    want_S: bool
    fill: float = 0.0
    acc: np.ndarray | None = None
    acc_lo: np.ndarray | None = None
    S: np.ndarray | None = None
    stats: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def array(self, name: str) -> np.ndarray:
        """The output-shaped array ``acc``, ``acc_lo`` or ``S``, allocated on first use (thread-safe)."""
        arr = getattr(self, name)
        if arr is None:
            with self.lock:
                arr = getattr(self, name)
                if arr is None:
                    arr = np.full(self.shape, self.fill)
                    setattr(self, name, arr)
        return arr

    def add_stats(self, stats: dict[str, int] | None) -> None:
        if stats:
            with self.lock:
                for key, v in stats.items():
                    self.stats[key] = self.stats.get(key, 0) + v

    def add(self, index: tuple[Any, ...], res: core.MatmulResult) -> None:
        """A task's accumulator, low part and error scale at ``index``."""
        for name in ("acc", "acc_lo", "S"):
            v = getattr(res, name)
            if v is not None:
                self.array(name)[index] = v
        self.add_stats(res.stats)


Result = core.MatmulResult | core.Products
Sink = Callable[[Any, Collected], "dict[str, int] | None"]


@dataclass
class Task:
    """One matmul of a kernel call.

    a, b:       core operands (rows, K) and (N, K).
    output:     the output stage (format, alpha, c), or None: the dot products themselves
                (:class:`~deepgemm_ref.core.Products`), for a ``sink`` that finishes them.
    index:      where the (rows, N) result goes in ``d`` and in the output-shaped trace arrays.
    sink:       optional ``sink(result, collected) -> stats`` writing the result itself instead.
    transposed: compute ``b @ a^T`` and transpose the result (the core decodes its ``b`` whole
                and streams ``a`` in row chunks: a large weight matrix passed as ``a`` is decoded
                chunk by chunk, and every chunk's BLAS call sees all rows of ``b``).
    """

    a: core.Operand
    b: core.Operand
    output: core.OutputStage | None
    index: tuple[Any, ...] = ()
    sink: Sink | None = None
    transposed: bool = False


def run(task: Task, accumulation: core.Accumulation, *, want_acc: bool = False, want_S: bool = False) -> Result:
    """The core call of one task (no writing, no trace)."""
    a, b = (task.b, task.a) if task.transposed else (task.a, task.b)
    if task.output is None:
        return core.dot_products(a, b, accumulation, want_S=want_S)
    res = core.scaled_matmul(a, b, task.output, model=accumulation.model, fp32_block=accumulation.fp32_block,
                             mma_block_scaling=accumulation.mma_block_scaling, want_acc=want_acc, want_S=want_S)
    if task.transposed:
        return core.MatmulResult(res.out.T, None if res.acc is None else res.acc.T,
                                 None if res.acc_lo is None else res.acc_lo.T, None if res.S is None else res.S.T,
                                 res.stats)
    return res


def _expand(mask: np.ndarray | None, shape: tuple[int, ...]) -> np.ndarray:
    if mask is None:
        return np.ones(shape, bool)
    m = mask.reshape(mask.shape + (1,) * (len(shape) - mask.ndim))
    return np.array(np.broadcast_to(m, shape))


def execute(
    func: str,
    d: np.ndarray,
    tasks: Sequence[Task | Callable[[], Task]],
    *,
    accumulation: core.Accumulation | None = None,
    want: tuple[bool, bool] | None = None,
    defined: np.ndarray | Literal["all"] | None = "all",
    zero: np.ndarray | None = None,
    fill: Sequence[tuple[tuple[Any, ...], np.ndarray]] = (),
    trace_fill: float = 0.0,
    parallel: bool = False,
    record_trace: bool = True,
    extra: dict[str, np.ndarray] | None = None,
) -> Collected:
    """Run validated tasks, write ``d``, and report one trace record for the public call.

    A task may be given as a function building it when it runs (operands gathered from a paged
    cache, for instance, exist only while their task does: memory stays bounded).

    accumulation: the core's accumulation (default: :func:`active_accumulation`).
    want:         (want_acc, want_S) (default: what an active trace capture asks for).
    defined:      bool mask over ``d``'s leading axes (rows), True where the contract defines
                  the values; ``"all"``: all of ``d``; None: no mask in the record (dense GEMMs).
    zero:         bool mask over the same axes: rows that receive +0.0 (the padding policy).
    fill:         (index, values) pairs copied into ``d`` as they are (k-grouped empty groups: c[g]).
    trace_fill:   the trace arrays' value where no task reports one.
    parallel:     run the tasks on the package's thread pool (their destinations are disjoint).
    record_trace: False: return the collected arrays without recording (the caller records).
    extra:        kernel-specific arrays for the record (e.g. a second output's accumulator).
    Returns the :class:`Collected` trace arrays and stats.  Under DeepGEMM-Ascend's dry run the
    call ends here, before anything is computed or written (:func:`deepgemm_ref.dryrun.stop`).
    """
    dryrun.stop()
    acc = active_accumulation() if accumulation is None else accumulation
    want_acc, want_S = trace.wants() if want is None else want
    col = Collected(tuple(d.shape), want_acc, want_S, trace_fill)
    if zero is not None and zero.any():
        d[zero] = np.zeros((), d.dtype)
    for index, values in fill:
        d[index] = values

    def one(item: Task | Callable[[], Task]) -> None:
        t = item if isinstance(item, Task) else item()
        res = run(t, acc, want_acc=want_acc, want_S=want_S)
        if isinstance(res, core.Products):
            assert t.sink is not None, "a products task needs a sink"
            col.add_stats(t.sink(res, col))
            return
        if t.sink is None:
            d[t.index] = res.out
        else:
            col.add_stats(t.sink(res, col))
        col.add(t.index, res)

    if parallel and len(tasks) > 1 and num_threads() > 1:
        def chunk(i0: int, i1: int) -> None:
            for t in tasks[i0:i1]:
                one(t)

        # The tasks share the cores: a one-thread BLAS each (the pool's threads are the
        # parallelism), so that two tasks' BLAS calls do not compete for the same cores.
        with single_threaded_blas():
            parallel_chunks(len(tasks), 1, chunk)
    else:
        for t in tasks:
            one(t)
    if record_trace and trace.active() is not None:
        mask = None if defined is None else _expand(None if isinstance(defined, str) else defined, tuple(d.shape))
        record(func, col, mask, extra=extra or {})
    return col


def record(func: str, col: Collected, defined: np.ndarray | None, **extra: Any) -> None:
    """The call's :class:`~deepgemm_ref.trace.KernelRecord` (no-op without an active capture)."""
    if trace.active() is None:
        return
    if col.want_acc:
        col.array("acc")
    if col.want_S:
        col.array("S")
    trace.record(func, acc=col.acc, acc_lo=col.acc_lo, S=col.S, defined=defined, stats=dict(col.stats), **extra)
