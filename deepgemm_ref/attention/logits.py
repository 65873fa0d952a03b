"""MQA logits as tasks: the request, its row groups and key chunks, the exact logits, the outputs.

A validated call is a :class:`LogitsRequest` (queries, a key source, weights, per-row key ranges
and output placement, the target's reduction, the accumulation, the clean pass).  :func:`_tasks`
cuts it into tasks of about :data:`TASK_ELEMENTS` query-head x key products, each one executor
task whose dot products (:func:`deepgemm_ref.core.dot_products`) its sink finishes:

* exact model: ``z = s_j sum_h w_h r_h`` in float64 with a rigorous bound, then
  :func:`deepgemm_ref.certified.round_certified` with a Fraction fallback (:func:`_exact_logits`),
  where ``r_h = relu(x_h)``, or ``bf16(relu(x_h))`` (and ``s_j`` ``bf16(s_j)``) where the target's
  data flow rounds them (:func:`.reduction.data_flow_roundings`: ascend950, sm100 with bf16
  weights), each rounded once from the exact dot product;
* other models: the target's device reduction (:mod:`.reduction`), rounded once;

then DeepGEMM's clean pass (``clean_logits``) as executor fills of -inf.  :func:`launch` runs them
through :func:`~deepgemm_ref.executor.execute`, which writes the logits and records the call.

Row ``i`` (query token) sees virtual keys ``[ks[i], ke[i])``; key ``v`` lands in output column
``v - shift[i]``.  Memory is bounded: a task's operands exist only while it runs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from fractions import Fraction
from functools import partial
from typing import Any

import numpy as np

from .. import core, dryrun, trace
from .. import formats as fm
from ..certified import FormatRounding, Points, round_certified
from ..exact import U64, gamma
from ..executor import Collected, Fill, Item, Request, Task, execute
from ..interop import Kind, from_numpy
from .keys import Keys, KeySource, Queries
from .reduction import data_flow_roundings, model_logits

__all__ = ["LogitsRequest", "TASK_ELEMENTS", "launch", "allocate", "range_mask", "requests_only"]

#: Query-head x key products per task (one ``scaled_matmul`` call); bounds the working memory.
TASK_ELEMENTS = 1 << 21
#: The same for the fused exact path (:func:`_fused_exact`), which never holds a task's products
#: at once (float64 row chunks of :data:`_FUSED_CHUNK_BYTES`, and (rows, keys) arrays): fewer
#: tasks, each converting the query rows once for more keys.
FUSED_TASK_ELEMENTS = 1 << 23
_MIN_KEYS = 256  # smallest key chunk of a task
_SLACK_KEYS = 256  # keys per row a row group may compute beyond the rows' own ranges


@dataclass(kw_only=True)
class LogitsRequest(Request):
    """A validated MQA-logits call (nothing computed; ``d`` is the fresh output's view, NaN).

    Row i (query token) sees virtual keys [ks[i], ke[i]); key v lands in output column
    v - shift[i] (shift 0: column = key index; shift ks: compressed / paged indexing).

    reduction:    the target's head reduction: "sm100", "sm90" or "ascend".
    queries:      the query rows; keys: where the keys of virtual positions come from (both give
                  core operands only when a task runs).
    weights:      (rows, H) float32 or bfloat16 (the caller's view, stride(1) == 1).
    out_fmt:      the logits' format.
    accumulation: the accumulation in force for the call (read once, by the check step).
    clean_to:     with ``clean_logits``: the column where the clean kernel's 8192-column blocks
                  stop (in the allocation: it may pass the view's width); None: no clean pass.
    alloc:        the padded allocation ``d`` is a view of; kind: the caller's array kind.
    The undefined elements' trace value is NaN and the tasks run on the thread pool.
    """

    trace_fill: float = float("nan")
    parallel: bool = True
    reduction: str
    queries: Queries
    keys: KeySource
    weights: np.ndarray
    out_fmt: fm.Format
    ks: np.ndarray  # int64 (rows,)
    ke: np.ndarray
    shift: np.ndarray
    accumulation: core.Accumulation
    clean_to: int | None = None
    alloc: np.ndarray
    kind: Kind

    @property
    def heads(self) -> int:
        return int(self.queries.data.shape[1])


def _row_groups(ks: np.ndarray, ke: np.ndarray, heads: int, budget: int) -> list[tuple[int, int, int, int]]:
    """Consecutive rows computed together: (r0, r1, k_lo, k_hi) with the union of their key ranges.

    A row joins a group while the group's rows x union span stays within 1.25x the rows' own
    work (plus ``_SLACK_KEYS`` per row), so unrelated ranges (paged requests) are not crossed.
    Empty rows take no keys.
    """
    rows = ks.size
    max_rows = max(1, budget // (heads * _MIN_KEYS))
    groups: list[tuple[int, int, int, int]] = []
    i = 0
    ks_l = ks.tolist()
    ke_l = ke.tolist()
    while i < rows:
        lo, hi = (ks_l[i], ke_l[i]) if ke_l[i] > ks_l[i] else (None, None)
        useful = max(ke_l[i] - ks_l[i], 0)
        j = i + 1
        while j < rows and j - i < max_rows:
            a, b = ks_l[j], ke_l[j]
            if b > a:
                nlo = a if lo is None else min(lo, a)
                nhi = b if hi is None else max(hi, b)
                nuse = useful + b - a
                if (j + 1 - i) * (nhi - nlo) > 1.25 * nuse + (j + 1 - i) * _SLACK_KEYS:
                    break
                lo, hi, useful = nlo, nhi, nuse
            j += 1
        if lo is not None and hi is not None:
            groups.append((i, j, lo, hi))
        i = j
    return groups


def _chunks(req: LogitsRequest, budget: int) -> list[tuple[int, int, int, int]]:
    """(r0, r1, k0, k1): each row group's key span cut into chunks of about ``budget`` products."""
    out = []
    for r0, r1, lo, hi in _row_groups(req.ks, req.ke, req.heads, budget):
        n = max(_MIN_KEYS, budget // ((r1 - r0) * req.heads))
        for k0 in range(lo, hi, n):
            out.append((r0, r1, k0, min(hi, k0 + n)))
    return out


def _task(req: LogitsRequest, r0: int, r1: int, k0: int, k1: int, fused_span: bool = False) -> Task:
    """The task of query rows [r0, r1) against virtual keys [k0, k1): the per-head dot products,
    finished by the sink into logits (exact, or the target's device model) and written to ``req.d``.

    Exact model without error scales: the task computes itself (:func:`_fused_exact`), the core's
    row chunks reduced over heads while they are in cache; the same bytes as the sink's path.
    ``fused_span``: the span was cut for the fused path (up to :data:`FUSED_TASK_ELEMENTS`
    products, whose float64 values it never holds at once); where that path declines, the sink's
    path runs over key chunks of at most :data:`TASK_ELEMENTS` products (:func:`_sink_spans`)."""
    rows, heads, n = r1 - r0, req.heads, k1 - k0
    qop = req.queries.operand(r0, r1)
    keys = req.keys.get(k0, k1)
    w = req.weights[r0:r1]

    def needed_pairs() -> np.ndarray:
        keys_at = np.arange(k0, k1)[None, :]
        return (keys_at >= req.ks[r0:r1, None]) & (keys_at < req.ke[r0:r1, None])

    def sink(prod: core.Products, col: Collected) -> dict[str, int]:
        stats: dict[str, int] = {}
        needed = needed_pairs()
        if prod.exact:
            codes, value = _exact_logits(req, qop, keys, w, prod.values.reshape(rows, heads, n),
                                         None if prod.err is None else prod.err.reshape(rows, heads, n), needed, stats)
        else:
            x = prod.values.reshape(rows, heads, n)
            value = model_logits(req.reduction, x, w, keys.token_scale)
            codes = fm.round_f64(value, req.out_fmt).view(req.out_fmt.code_dtype)
            stats[str(req.accumulation.model)] = int(np.count_nonzero(needed))
        S = None
        if col.want_S and prod.S is not None:
            S = _logit_error_scale(prod.S.reshape(rows, heads, n), w, keys.token_scale)
        _write(req, r0, r1, k0, k1, codes, value, S, col)
        return stats

    def compute(col: Collected, accumulation: core.Accumulation) -> dict[str, int] | None:
        if not col.want_S and accumulation.model == "exact":
            stats: dict[str, int] = {}
            got = _fused_exact(req, qop, keys, w, needed_pairs(), stats)
            if got is not None:
                _write(req, r0, r1, k0, k1, got[0], got[1], None, col)
                return stats
        if fused_span:
            stats = {}
            for s0, s1 in _sink_spans(rows * heads, k0, k1):
                sub = _task(req, r0, r1, s0, s1)
                got_stats = _sink_of(sub)(core.dot_products(sub.a, sub.b, accumulation, want_S=col.want_S), col)
                for key, v in got_stats.items():
                    stats[key] = stats.get(key, 0) + v
            return stats
        return sink(core.dot_products(qop, keys.operand, accumulation, want_S=col.want_S), col)

    return Task(qop, keys.operand, None, sink=sink, label="MQA logits", compute=compute)


def _sink_of(task: Task) -> Callable[[Any, Collected], dict[str, int]]:
    """A logits task's sink (every task :func:`_task` makes has one)."""
    assert task.sink is not None
    return task.sink  # type: ignore[return-value]


def _sink_spans(qrows: int, k0: int, k1: int) -> list[tuple[int, int]]:
    """Keys [k0, k1) in spans of about :data:`TASK_ELEMENTS` products with ``qrows`` query-head rows
    (the materialised dot products of the sink's path), as :func:`_chunks` cuts them."""
    n = max(_MIN_KEYS, TASK_ELEMENTS // max(1, qrows))
    return [(a, min(k1, a + n)) for a in range(k0, k1, n)]


def _write(req: LogitsRequest, r0: int, r1: int, k0: int, k1: int, codes: np.ndarray, value: np.ndarray,
           S: np.ndarray | None, col: Collected) -> None:
    """Codes (rows, n) of query rows [r0, r1) and keys [k0, k1) into ``req.d`` within every row's
    key range, with their values and error scales into the trace arrays when asked for."""
    acc_out = col.array("acc") if col.want_acc else None
    S_out = col.array("S") if S is not None else None
    out_codes = req.d.view(req.out_fmt.code_dtype)
    ks, ke, shift = req.ks, req.ke, req.shift
    for i in range(r1 - r0):
        g = r0 + i
        a, b = max(int(ks[g]), k0), min(int(ke[g]), k1)
        if a >= b:
            continue
        c0 = a - int(shift[g])
        out_codes[g, c0:c0 + b - a] = codes[i, a - k0:b - k0]
        if acc_out is not None:
            acc_out[g, c0:c0 + b - a] = value[i, a - k0:b - k0]
        if S_out is not None and S is not None:
            S_out[g, c0:c0 + b - a] = S[i, a - k0:b - k0]


def _logit_error_scale(s_heads: np.ndarray, w: np.ndarray, kvs: np.ndarray | None) -> np.ndarray:
    """S = |s_j| sum_h |w_h| S_h (rounded up) from the per-head error scales S_h (rows, H, n)."""
    wa = np.abs(w.astype(np.float64))[:, None, :]
    with np.errstate(over="ignore", invalid="ignore"):
        s = np.matmul(wa, s_heads)[:, 0, :] * (1 + 2 * gamma(s_heads.shape[1] + 2))
        if kvs is not None:
            s = s * np.abs(kvs)[None, :] * (1 + 4 * U64)
    return s


# ----------------------------------------------------------------------------------------------
# the exact model
# ----------------------------------------------------------------------------------------------

def _exact_logits(req: LogitsRequest, qop: core.Operand, keys: Keys, w: np.ndarray, x: np.ndarray,
                  x_err: np.ndarray | None, needed: np.ndarray,
                  stats: dict[str, int]) -> tuple[np.ndarray, np.ndarray]:
    """Correctly rounded codes (rows, n) and float64 values of s_j sum_h w_h relu(x_h).

    x: the core's float64 accumulators (rows, H, n), modified in place (relu); x_err: their
    rigorous error bounds (0 where the core's exactness certificate holds; None: all exact).  needed: bool
    (rows, n), the pairs inside their row's key range (only those go to the exact fallback;
    the others are computed because a row group shares one key span, and are discarded).
    """
    rows, heads, n = x.shape
    kop = keys.operand
    flow = data_flow_roundings(req.reduction, w.dtype)
    w64 = w.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        np.maximum(x, 0.0, out=x)  # relu (NaN propagates)
    if flow.head_score is not None:  # r_h = fmt(relu(x_h)), from the exact x_h: part of the golden
        x = _round_head_scores(qop, kop, x, x_err, needed, flow.head_score, stats)
        x_err = None
    # The per-head values are exact now or come certified from the core (module docstring, step 1).
    exact_x = x_err is None or not np.any(x_err)
    with np.errstate(over="ignore", invalid="ignore"):
        ta = np.matmul(_weight_pair(w64), x)  # (rows, 2, n): one pass over x

    def head_values(i: int, j: int) -> list[Fraction]:
        if x_err is None or not np.any(x_err[i, :, j]):
            return [Fraction(float(v)) for v in x[i, :, j]]  # relu'd exact values
        return _exact_head_dots(qop, kop, i, j, heads)

    return _logits_from_sums(req, keys, w64, ta, None if exact_x else x_err, heads, needed, stats, head_values)


def _weight_pair(w64: np.ndarray) -> np.ndarray:
    """(rows, 2, H): the head weights and their magnitudes, for one pass over the head scores."""
    return np.stack([w64, np.abs(w64)], axis=1)


def _logits_from_sums(req: LogitsRequest, keys: Keys, w64: np.ndarray, ta: np.ndarray, x_err: np.ndarray | None,
                      heads: int, needed: np.ndarray, stats: dict[str, int],
                      head_values: Callable[[int, int], list[Fraction]]) -> tuple[np.ndarray, np.ndarray]:
    """Codes and values from the weighted head sums ``ta`` (rows, 2, n) = (sum_h w_h r_h,
    sum_h |w_h| r_h) with the head scores' bounds ``x_err`` (None: exact); ``head_values(i, j)``
    gives the exact r_h of a pair for the Fraction fallback."""
    kvs = keys.token_scale
    out = req.out_fmt
    flow = data_flow_roundings(req.reduction, req.weights.dtype)
    if flow.kv_scale is not None and kvs is not None:
        kvs = fm.round_f64(kvs, flow.kv_scale).astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        t, a = ta[:, 0], ta[:, 1]
        err = a * (gamma(heads + 2) * (1 + 8 * U64))
        if x_err is not None:
            # |relu(x^) - relu(x)| <= |x^ - x| <= x_err, weighted by |w| and summed over heads
            err = err + np.matmul(np.abs(w64)[:, None, :], x_err)[:, 0, :] * (1 + 2 * gamma(heads + 2))
        if kvs is not None:
            z = t * kvs[None, :]
            e_all = (err * np.abs(kvs)[None, :] + np.abs(z) * U64) * (1 + 8 * U64)
        else:
            z = t
            e_all = err * (1 + 8 * U64)
        z += 0.0  # the exact value has no sign: a zero logit is +0 (as the devices' +0-seeded sums give)
        # A floor for an error bound that underflowed; an exact zero (A == 0) keeps E == 0.
        e_all = np.where((e_all > 0) | (a > 0), e_all + 2.0**-1070, e_all)
    rounding = FormatRounding(out)

    def exact(at: Points) -> np.ndarray:
        codes = np.empty(at[0].size, out.code_dtype)
        for p, (i, j) in enumerate(zip(at[0].tolist(), at[1].tolist(), strict=True)):
            xs = head_values(i, j)
            v = sum((Fraction(float(w64[i, h])) * xs[h] for h in range(heads)), Fraction(0))
            if kvs is not None:
                v *= Fraction(float(kvs[j]))
            codes[p] = rounding.exact(v)
            z[i, j] = float(v)
        return codes

    # Non-finite values follow IEEE arithmetic; pairs outside their row's range are discarded.
    codes, pending = round_certified(z, e_all, rounding, final=~np.isfinite(z) | ~needed, fallback=exact)
    n_pending = int(np.count_nonzero(pending))
    stats["bounded"] = stats.get("bounded", 0) + int(np.count_nonzero(needed)) - n_pending
    if n_pending:
        stats["fraction"] = stats.get("fraction", 0) + n_pending
    return codes, z


class _NotAllExact(Exception):
    """A row chunk without the chunk-wide exactness certificate (the task takes the sink's path)."""


#: Bytes of float64 head scores per row chunk of :func:`_fused_exact` (a few L2s: the GEMM of a
#: chunk runs at the BLAS's speed and the passes over it stay in the last-level cache).
_FUSED_CHUNK_BYTES = 1 << 22


def _fused_exact(req: LogitsRequest, qop: core.Operand, keys: Keys, w: np.ndarray, needed: np.ndarray,
                 stats: dict[str, int]) -> tuple[np.ndarray, np.ndarray] | None:
    """:func:`_exact_logits` of the task's dot products without materialising them: the core's
    float64 GEMM (:class:`deepgemm_ref.core._Gemm`: one conversion of the keys, the query rows in
    chunks of whole query rows) and, per chunk while it is in cache, relu, the data flow's head
    score rounding and the weighted head sums.  Only when every chunk carries the chunk-wide
    exactness certificate (then every dot product is exact, whatever the chunking, and the result
    is :func:`_exact_logits`'s with ``x_err`` None, byte for byte); otherwise None (the caller
    takes the sink's path).  The Fraction fallback's exact head scores are recomputed per pair
    (a float64 dot product of exact values whose partial sums the certificate keeps exact).
    """
    kop = keys.operand
    rows, heads = w.shape[0], req.heads
    m, k = qop.shape
    n = kop.shape[0]
    if m == 0 or n == 0 or k == 0:
        return None
    flow = data_flow_roundings(req.reduction, w.dtype)
    w64 = w.astype(np.float64)
    w2 = _weight_pair(w64)
    ta = np.empty((rows, 2, n))
    per_chunk = max(1, _FUSED_CHUNK_BYTES // (8 * heads * n))
    gemm = core._Gemm(qop, kop, False, per_chunk * heads)
    head_fmt = flow.head_score
    head_rounding = None if head_fmt is None else FormatRounding(head_fmt)

    def head_scores(x: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore", invalid="ignore"):
            np.maximum(x, 0.0, out=x)  # relu (NaN propagates)
        if head_rounding is None or head_fmt is None:
            return x
        return head_rounding.block(x).view(head_fmt.storage).astype(np.float64)

    def process(ch: core._Chunk) -> None:
        if not ch.all_exact:
            raise _NotAllExact
        i0, i1 = ch.r0 // heads, ch.r1 // heads
        x = head_scores(ch.y.reshape(i1 - i0, heads, n))
        with np.errstate(over="ignore", invalid="ignore"):
            np.matmul(w2[i0:i1], x, out=ta[i0:i1])

    try:
        gemm.for_each(process)
    except _NotAllExact:
        return None

    def head_values(i: int, j: int) -> list[Fraction]:
        with np.errstate(over="ignore", invalid="ignore"):
            x = qop.rows(i * heads, (i + 1) * heads) @ kop.rows(j, j + 1)[0]
        return [Fraction(float(v)) for v in head_scores(x[None, :, None])[0, :, 0]]

    return _logits_from_sums(req, keys, w64, ta, None, heads, needed, stats, head_values)


def _round_head_scores(qop: core.Operand, kop: core.Operand, x: np.ndarray, x_err: np.ndarray | None,
                       needed: np.ndarray, fmt: fm.Format, stats: dict[str, int]) -> np.ndarray:
    """``fmt(relu(x_h))`` as float64 (rows, H, n), each rounded once (RNE) from the exact dot product.

    x: the relu'd float64 dot products with their bounds ``x_err`` (None or 0: exact).  Where a
    bound straddles a rounding boundary of ``fmt`` the score is recomputed with Fractions.
    """
    rounding = FormatRounding(fmt)
    if x_err is None or not np.any(x_err):
        codes = rounding.block(x)
    else:
        rows, heads, n = x.shape
        dots: dict[tuple[int, int], list[Fraction]] = {}

        def exact(at: Points) -> np.ndarray:
            codes = np.empty(at[0].size, fmt.code_dtype)
            for p, (i, h, j) in enumerate(zip(*(a.tolist() for a in at), strict=True)):
                if (i, j) not in dots:
                    dots[i, j] = _exact_head_dots(qop, kop, i, j, heads)
                codes[p] = rounding.exact(dots[i, j][h])
            return codes

        # Pairs outside their row's range are discarded; non-finite scores follow IEEE arithmetic.
        final = ~np.isfinite(x) | ~needed[:, None, :]
        codes, pending = round_certified(x, x_err, rounding, final=final, fallback=exact)
        if pending.any():
            stats["head_fraction"] = stats.get("head_fraction", 0) + int(np.count_nonzero(pending))
    return codes.view(fmt.storage).astype(np.float64)


def _exact_head_dots(qop: core.Operand, kop: core.Operand, i: int, j: int, heads: int) -> list[Fraction]:
    """relu of the exact dot products of query row i's heads with key j (scaled values are exact)."""
    qv = qop.rows(i * heads, (i + 1) * heads)
    kv = kop.rows(j, j + 1)[0]
    kf = [Fraction(float(v)) for v in kv]
    out = []
    for h in range(heads):
        s = sum((Fraction(float(a)) * b for a, b in zip(qv[h], kf, strict=True) if a != 0), Fraction(0))
        out.append(max(s, Fraction(0)))
    return out


# ----------------------------------------------------------------------------------------------
# output allocation and masks
# ----------------------------------------------------------------------------------------------

def allocate(rows_alloc: int, stride: int, rows: int, width: int, out: fm.Format) -> tuple[np.ndarray, np.ndarray]:
    """(padded allocation filled with NaN, the (rows, width) view of it; in a dry call on meta
    tensors the allocation is left untouched: it only gives the returned meta tensor its shape)."""
    if dryrun.on_meta():
        alloc = np.empty((rows_alloc, stride), out.storage)
        return alloc, alloc[:rows, :width]
    # Note: elements the kernels leave unspecified (uninitialised memory or stray scores on the
    # device) are NaN here, so that nothing undefined can pass for a value.
    alloc = np.full((rows_alloc, stride), np.nan, out.storage)
    return alloc, alloc[:rows, :width]


def range_mask(shape: tuple[int, int], lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """bool (rows, width): column c of row i is in [lo[i], hi[i])."""
    cols = np.arange(shape[1])[None, :]
    return (cols >= lo[:, None]) & (cols < hi[:, None])


def _outside(shape: tuple[int, int], lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """bool (rows, width): column c of row i is outside [lo[i], hi[i]) (one output-sized mask)."""
    cols = np.arange(shape[1])[None, :]
    mask = cols < lo[:, None]
    mask |= cols >= hi[:, None]
    return mask


# ----------------------------------------------------------------------------------------------
# the tasks and the launch
# ----------------------------------------------------------------------------------------------

def _tasks(req: LogitsRequest) -> list[Item]:
    """logits[i, v - shift_i] = s_v sum_h w[i, h] relu(q[i, h] . k[v])  for keys v in [ks_i, ke_i).

    One task per row group and key chunk (about :data:`TASK_ELEMENTS` query-head x key
    products), built when it runs (its operands exist only then); the sink finishes the dot
    products into logits.  Then DeepGEMM's clean pass (smxx_clean_logits, after the logits
    kernel): -inf at columns [0, ks) and [ke, clean_to) of every row, in the view (the trace
    reports acc = -inf, S = 0 there) and in the allocation's columns past the view.
    """
    # the fused exact path holds (rows, keys) arrays, not (rows, heads, keys) ones: larger spans
    fused = req.accumulation.model == "exact" and not trace.wants()[1]
    budget = FUSED_TASK_ELEMENTS if fused else TASK_ELEMENTS
    items: list[Item] = [partial(_task, req, *chunk, fused_span=fused) for chunk in _chunks(req, budget)]
    if req.clean_to is not None:
        rows, width = req.d.shape
        outside = _outside(req.d.shape, req.ks - req.shift, req.ke - req.shift)
        items.append(Fill((outside,), -np.inf, acc=-np.inf, label="clean logits"))
        if req.clean_to > width:
            items.append(Fill((slice(0, rows), slice(width, req.clean_to)), -np.inf, into=req.alloc,
                              label="clean logits: allocation columns past the view"))
    return items


#: Where :func:`requests_only` collects validated requests (None: calls run as usual).
_REQUESTS: ContextVar[list[LogitsRequest] | None] = ContextVar("mqa_requests_only", default=None)


@contextlib.contextmanager
def requests_only() -> Iterator[list[LogitsRequest]]:
    """Within the block, MQA logits calls (in this context) are validated and their requests
    collected into the yielded list, but nothing is computed: the returned logits are the fresh
    NaN view.  The checker's range hook reads the decoded queries, keys and weights from them."""
    got: list[LogitsRequest] = []
    token = _REQUESTS.set(got)
    try:
        yield got
    finally:
        _REQUESTS.reset(token)


def launch(req: LogitsRequest) -> Any:
    """The call's tasks through the executor (into ``req.d`` and the trace); the logits view in
    the caller's kind."""
    collect = _REQUESTS.get()
    if collect is not None:
        collect.append(req)
        return from_numpy(req.d, req.kind)
    execute(req, _tasks(req), accumulation=req.accumulation)
    return from_numpy(req.d, req.kind)
