"""The one executor: a kernel call's tasks through the core, into ``d``, into the trace.

Every kernel reads check -> tasks -> execute::

    req = check(profile, ...)          # a Request: the validated call, nothing computed or written
    execute(req, tasks(req))           # tasks(req): the math, as a list of Task / Fill

A :class:`Request` is what a kernel's check step returns: the public name, the profile the
dispatcher resolved for the call (read once, passed on), the output ``d`` and the call's output
policy (the elements the contract defines, the padding rows that receive +0.0).  Families extend
it with their validated operands.

A :class:`Task` is one matmul: two canonical operands (:class:`~deepgemm_ref.core.Operand`), the
output stage (format, ``alpha``, ``c``), and where the result goes: ``d[index]`` (and the same
place in the output-shaped trace arrays), or a ``sink`` that writes it itself (DeepGEMM-Ascend's
FP8 output, MQA logits).  A task without an output stage computes the dot products themselves
(:func:`~deepgemm_ref.core.dot_products`) for a sink that finishes them.  A :class:`Fill` writes
given values instead of computing them (an early return's ``c``, a cleaned logit, the old ``c``
that ACLNN's addmm leaves in ``d``).

:func:`execute` owns everything around the core: the accumulation model and MMA block arithmetic
in force for the request's profile (:func:`active_accumulation`, read once per call and passed to
the core as values), the padding policy's zero rows, the fills, writing ``d`` only after each
task's result exists, the accumulator / error-scale / stats collection a trace capture asks for,
and the one :class:`~deepgemm_ref.trace.KernelRecord` of the public call (with the labels of the
tasks it ran).  Kernels whose call makes several records (Mega MoE, one per rank) or assembles
stage arrays report them with :func:`record`; nothing else writes the trace.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal, TypeVar

import numpy as np

from . import core, dryrun, trace
from ._memory import allocation_limit, limit_allocations, limit_work, work_budget, work_progress, work_reporter
from ._parallel import num_threads, parallel_chunks, single_threaded_blas
from .config import get_numerics
from .profiles import Profile

__all__ = ["Request", "Task", "Fill", "Collected", "active_accumulation", "run", "execute", "record", "on_pool"]

T = TypeVar("T")


def active_accumulation(profile: Profile) -> core.Accumulation:
    """The accumulation in force: the numerics option and ``profile``'s MMA block arithmetic."""
    return core.Accumulation(get_numerics().accumulation, profile.fp32_block, profile.mma_block_scaling)


@dataclass(kw_only=True)
class Request:
    """A validated kernel call: what a check step returns and a tasks step reads.

    func:       the public name (messages and the trace record).
    profile:    the profile the dispatcher resolved for the call.
    d:          the array the tasks' results go into (the caller's output, or a view of it).
    defined:    bool mask over ``d``'s leading axes (or its whole shape) of the elements the
                contract defines, or a function making it (called only when a trace capture
                records the call: an output-sized mask costs nothing otherwise); ``"all"``: all
                of ``d``; None: no mask in the record (dense GEMMs).
    zero:       bool mask over the same axes: elements that receive +0.0 (the padding policy).
    trace_fill: the trace arrays' value where no task reports one (NaN for MQA logits).
    parallel:   run the tasks on the package's thread pool (their destinations are disjoint).
    """

    func: str
    profile: Profile
    d: np.ndarray
    defined: np.ndarray | Callable[[], np.ndarray | Literal["all"]] | Literal["all"] | None = "all"
    zero: np.ndarray | None = None
    trace_fill: float = 0.0
    parallel: bool = False


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
    tasks: list[str] = field(default_factory=list)
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
        """A task's accumulator, low part and error scale at ``index``.

        A task whose result covers the whole output, arriving first, hands its own arrays over
        (the core allocates them for this result alone): no second output-sized copy of each is
        held while the call finishes (a 4096 x 4096 GEMM's acc and S are 256 MiB).
        """
        for name in ("acc", "acc_lo", "S"):
            v = getattr(res, name)
            if v is None:
                continue
            with self.lock:
                if getattr(self, name) is None and _adoptable(v, index, self.shape):
                    setattr(self, name, v)
                    continue
            self.array(name)[index] = v
        self.add_stats(res.stats)


def _adoptable(v: np.ndarray, index: tuple[Any, ...], shape: tuple[int, ...]) -> bool:
    """Whether ``v`` can stand for the whole trace array of ``shape``: a writeable C-contiguous
    float64 array of that shape, written at an ``index`` that selects every element in order
    (``()``, or slices covering each leading axis with unit step)."""
    if not (v.shape == shape and v.dtype == np.float64 and v.flags.c_contiguous and v.flags.writeable):
        return False
    idx = index if isinstance(index, tuple) else (index,)
    if len(idx) > len(shape):
        return False
    return all(isinstance(s, slice) and s.indices(n) == (0, n, 1) for s, n in zip(idx, shape, strict=False))


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
    label:      what the task computes, as the trace record lists it.
    compute:    optional ``compute(collected, accumulation) -> stats`` that computes and writes
                the task's result itself (fusing the core's row chunks with what a sink would do
                after them); the task's operands and sink then serve it as it sees fit.
    """

    a: core.Operand
    b: core.Operand
    output: core.OutputStage | None
    index: tuple[Any, ...] = ()
    sink: Sink | None = None
    transposed: bool = False
    label: str = "matmul"
    compute: Callable[[Collected, core.Accumulation], dict[str, int] | None] | None = None


@dataclass
class Fill:
    """Values written instead of computed: ``into[index] = values``.

    into:  the array written (default None: the request's ``d``); another output of the call
           (ACLNN's addmm leaves the old ``c`` in ``d`` and writes its result into ``c``).
    acc:   the accumulator the trace reports for these elements of ``d`` (their error scale is 0:
           written, not computed), or None: the trace arrays keep the request's ``trace_fill``.
    label: what the fill stands for, as the trace record lists it.
    Fills listed before the computed tasks run before them, fills listed after run after them.
    """

    index: tuple[Any, ...]
    values: Any
    into: np.ndarray | None = None
    acc: Any = None
    label: str = "fill"


def run(task: Task, accumulation: core.Accumulation, *, want_acc: bool = False, want_S: bool = False) -> Result:
    """The core call of one task (no writing, no trace).

    A transposed task asked for the exact model's codes alone runs in its own orientation when the
    float64 copy of its ``b`` takes at most a quarter of the work budget: the codes are the exact
    roundings either way, and the BLAS is faster with the short side as its row count (an expert's
    activations against its weights: 3.5% of the GEMM).  Accumulators and S keep the transposed
    product, whose float64 and float32 sums they are.
    """
    transposed = task.transposed and (want_acc or want_S or task.output is None or accumulation.model != "exact"
                                      or 8 * task.b.shape[0] * task.b.shape[1] > work_budget() // 4)
    a, b = (task.b, task.a) if transposed else (task.a, task.b)
    if task.output is None:
        return core.dot_products(a, b, accumulation, want_S=want_S)
    res = core.scaled_matmul(a, b, task.output, model=accumulation.model, fp32_block=accumulation.fp32_block,
                             mma_block_scaling=accumulation.mma_block_scaling, want_acc=want_acc, want_S=want_S)
    if transposed:
        return core.MatmulResult(res.out.T, None if res.acc is None else res.acc.T,
                                 None if res.acc_lo is None else res.acc_lo.T, None if res.S is None else res.S.T,
                                 res.stats)
    return res


def _expand(mask: np.ndarray | None, shape: tuple[int, ...]) -> np.ndarray:
    if mask is None:
        return np.ones(shape, bool)
    m = mask.reshape(mask.shape + (1,) * (len(shape) - mask.ndim))
    return np.array(np.broadcast_to(m, shape))


Item = Task | Fill | Callable[[], Task]


def _label(item: Item) -> str:
    return item.label if isinstance(item, (Task, Fill)) else "matmul (built when it runs)"


def _split(items: Sequence[Item]) -> tuple[list[Fill], list[Task | Callable[[], Task]], list[Fill]]:
    """(fills before the computed tasks, the computed tasks, fills after them)."""
    first = next((i for i, t in enumerate(items) if not isinstance(t, Fill)), len(items))
    last = max((i for i, t in enumerate(items) if not isinstance(t, Fill)), default=first - 1)
    middle = items[first:last + 1]
    if any(isinstance(t, Fill) for t in middle):
        raise ValueError("executor: a Fill between computed tasks (fills run before or after them)")
    return list(items[:first]), list(middle), list(items[last + 1:])  # type: ignore[arg-type]


def execute(
    req: Request,
    tasks: Sequence[Item],
    *,
    accumulation: core.Accumulation | None = None,
    want: tuple[bool, bool] | None = None,
    record_trace: bool = True,
    extra: dict[str, np.ndarray] | None = None,
) -> Collected:
    """Run a request's tasks, write its outputs, and report one trace record for the public call.

    A task may be given as a function building it when it runs (operands gathered from a paged
    cache, for instance, exist only while their task does: memory stays bounded).

    accumulation: the core's accumulation (default: :func:`active_accumulation` of the profile).
    want:         (want_acc, want_S) (default: what an active trace capture asks for).
    record_trace: False: return the collected arrays without recording (the caller records
                  them with :func:`record`, e.g. once per rank).
    extra:        kernel-specific arrays for the record (e.g. a second output's accumulator).
    Returns the :class:`Collected` trace arrays, stats and task labels.  Under DeepGEMM-Ascend's
    dry run the call ends here, before anything is computed or written
    (:func:`deepgemm_ref.dryrun.stop`).
    """
    dryrun.stop()
    d = req.d
    acc = active_accumulation(req.profile) if accumulation is None else accumulation
    want_acc, want_S = trace.wants() if want is None else want
    col = Collected(tuple(d.shape), want_acc, want_S, req.trace_fill)
    col.tasks = [_label(t) for t in tasks]
    before, computed, after = _split(tasks)
    if req.zero is not None and req.zero.any():
        d[req.zero] = np.zeros((), d.dtype)
    for f in before:
        _fill(f, d, col)

    def one(item: Task | Callable[[], Task]) -> None:
        t = item if isinstance(item, Task) else item()
        if t.compute is not None:
            col.add_stats(t.compute(col, acc))
            return
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

    if req.parallel:
        on_pool([partial(one, t) for t in computed])
    else:
        for t in computed:
            one(t)
    for f in after:
        _fill(f, d, col)
    if record_trace and trace.active() is not None:
        defined = req.defined() if callable(req.defined) else req.defined
        mask = None if defined is None else _expand(None if isinstance(defined, str) else defined, tuple(d.shape))
        record(req.func, col, mask, extra=extra or {})
    return col


def on_pool(jobs: Sequence[Callable[[], T]]) -> list[T]:
    """Independent jobs on the package's thread pool; their results in order.

    The jobs share the cores: a one-thread BLAS each (the pool's threads are the parallelism),
    so that two jobs' BLAS calls do not compete for the same cores; each job sees the calling
    thread's allocation limit, its share of the work budget and its progress callback
    (:func:`_inherited`) and runs in a copy of its context variables (NumPy's error state, the
    settings in force).  One job or one pool thread: in order, in the calling thread.
    """
    if len(jobs) <= 1 or num_threads() <= 1:
        return [job() for job in jobs]
    out: list[Any] = [None] * len(jobs)
    inherit = _inherited(min(num_threads(), len(jobs)))
    contexts = [contextvars.copy_context() for _ in jobs]  # NumPy's errstate, the settings, ...

    def chunk(i0: int, i1: int) -> None:
        with inherit():
            for i in range(i0, i1):
                out[i] = contexts[i].run(jobs[i])

    with single_threaded_blas():
        parallel_chunks(len(jobs), 1, chunk)
    return out


def _inherited(inflight: int) -> Callable[[], contextlib.AbstractContextManager[None]]:
    """What the calling thread's limits are, for tasks running on the pool's threads: its
    allocation limit, an ``inflight``-th of its work budget each (that many tasks hold their float64
    work at once) and its progress callback (the settings travel with ``_state.propagate``)."""
    limit, budget, report = allocation_limit(), work_budget() // max(1, inflight), work_reporter()

    @contextlib.contextmanager
    def inherit() -> Iterator[None]:
        with limit_allocations(limit), limit_work(budget), \
                (work_progress(report) if report is not None else contextlib.nullcontext()):
            yield

    return inherit


def _fill(f: Fill, d: np.ndarray, col: Collected) -> None:
    (d if f.into is None else f.into)[f.index] = f.values
    if f.acc is not None and f.into is None:
        if col.want_acc:
            col.array("acc")[f.index] = f.acc
        if col.want_S:
            col.array("S")[f.index] = 0.0  # written, not computed: no error


def record(func: str, col: Collected | None, defined: np.ndarray | None = None, **fields: Any) -> None:
    """The call's :class:`~deepgemm_ref.trace.KernelRecord` (no-op without an active capture):
    ``col``'s accumulator, error scale, stats and task labels (None: a record of ``fields`` alone,
    e.g. a stage that only moves data), and ``fields`` (``extra``, ``stats``, ...) given."""
    if trace.active() is None:
        return
    if col is None:
        trace.record(func, defined=defined, **fields)
        return
    if col.want_acc:
        col.array("acc")
    if col.want_S:
        col.array("S")
    stats = {**col.stats, **fields.pop("stats", {})}
    trace.record(func, acc=col.acc, acc_lo=col.acc_lo, S=col.S, defined=defined, stats=stats,
                 tasks=tuple(col.tasks), **fields)
