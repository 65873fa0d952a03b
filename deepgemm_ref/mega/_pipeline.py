"""The mega-MoE dataflow over all ranks in one process: routing, L1, SwiGLU, re-quantisation, L2, combine.

Everything here is a pure function of canonical inputs (see :class:`RankTokens` and the weight
readers of :mod:`._weights`); the public kernels and stage functions translate layouts and call it.

Per destination rank ``r`` and local expert ``i`` the routed rows are every valid ``(s, t, k)``
(source rank, token, slot) with ``topk_idx[s][t, k] == r * E_l + i``, in increasing ``(s, t, k)``
order; every expert (and DeepGEMM-Ascend's shared expert, on the token's own rank) runs its
stages as labelled executor tasks and fills (:mod:`deepgemm_ref.executor`; :func:`_expert`)::

    dispatch  x = x_s[t]                                   the rows arrive (a fill)
    L1 GEMM   h  = bf16( x @ W1_i^T )                      (n, 2I): gate = h[:, :I], up = h[:, I:]
    SwiGLU    v  = swiglu(gate, up) * w_{s,t,k}            float32 (n, I)   (see ._swiglu)
              q, sf = requantize(v)  (FP8)   |   q = bf16(v)  (BF16)       (a fill)
    L2 GEMM   o  = bf16( q @ W2_i^T )                      (n, H)
    combine   o -> slot (s, t, k) (a fill);  y_s[t] = bf16( sum over valid k in increasing k of
              o_{s,t,k}  (+ shared-expert slot) )

Where the target's library specifies the combine order and tests it bitwise (DeepGEMM: the fused
kernel equals DeepEP's ``allow_multiple_reduction=False`` combine), the combine sum is that
float32 running sum from +0 in slot order under every accumulation model; otherwise
(DeepGEMM-Ascend) it is exact in the ``exact`` model (certified float64, Fraction fallback) and
the same float32 running sum in the ``fp32`` model (:func:`combine_rows`).  Every row is computed
independently of every other, so results do not depend on the rank count, on which rank owns
which expert, or on which other tokens are present.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal, Protocol

import numpy as np

from .. import core, executor
from .. import formats as fm
from ..certified import FormatRounding, Points, round_certified
from ..comm import Transport
from ..exact import fraction_sum, two_sum
from ..profiles import Profile
from ..toolkit.args import BF16, E4M3
from . import _swiglu as sw

__all__ = [
    "RankTokens",
    "RankOptions",
    "PipelineConfig",
    "PipelineResult",
    "ExpertWeights",
    "run",
    "run_rank",
    "route_table",
    "route_counts",
    "swiglu_stage",
    "combine_rows",
    "combine_order_specified",
    "ORDER_MARGIN",
    "ue8m0_values",
    "Routes",
    "route",
]

Target = Literal["deepgemm", "deepgemm-ascend"]


class ExpertWeights(Protocol):
    """One rank's local experts as canonical core operands (see ._weights)."""

    @property
    def num_local_experts(self) -> int: ...

    def l1(self, i: int) -> core.Operand: ...

    def l2(self, i: int) -> core.Operand: ...


@dataclass
class RankTokens:
    """One source rank's inputs: its first N tokens.

    x:            (N, H) float8_e4m3fn (FP8 path) or bfloat16 (BF16 path)
    x_scales:     float64 (N, H / 32) powers of two (FP8 path) or None
    topk_idx:     int64 (N, K): global expert id, or -1 for a masked slot (already validated)
    topk_weights: float32 (N, K)
    """

    x: np.ndarray
    x_scales: np.ndarray | None
    topk_idx: np.ndarray
    topk_weights: np.ndarray

    @property
    def num_tokens(self) -> int:
        return int(self.x.shape[0])


@dataclass(frozen=True)
class RankOptions:
    """Epilogue options of one expert-owner rank (the rank whose kernel runs the L1 epilogue)."""

    activation_clamp: float | None = None
    fast_math: bool = True


@dataclass(frozen=True)
class PipelineConfig:
    """How the layer is computed.

    profile:      the profile the call was dispatched under (its target's rules; the executor's
                  requests carry it).
    mode:         ``"fp8"`` (FP8 x FP4, re-quantised activations) or ``"bf16"``.
    accumulation: the core's accumulation (the GEMMs), whose model also selects SwiGLU's and the
                  combine's arithmetic.
    semantics:    ``"fused"`` the target's fused kernel, ``"baseline"`` TileLang's op (SwiGLU).
    want_stages:  keep every stage's golden; want_acc, want_S: the GEMMs' accumulators / error scales.
    func:         the name the executor's requests carry.
    """

    profile: Profile
    mode: Literal["fp8", "bf16"]
    accumulation: core.Accumulation = field(default_factory=core.Accumulation)
    semantics: Literal["fused", "baseline"] = "fused"
    want_stages: bool = False
    want_acc: bool = False
    want_S: bool = False
    func: str = "mega_moe"

    @property
    def target(self) -> Target:
        return self.profile.target

    @property
    def exact(self) -> bool:
        return self.accumulation.model == "exact"


@dataclass
class PipelineResult:
    """y, combine accumulators and error scales (:func:`combine_rows`) of the requested source
    ranks; routing counts (dst rank, local expert, src rank) of every rank; stage goldens by rank
    when requested; the labels of the executor tasks run for each rank."""

    y: dict[int, np.ndarray]
    acc: dict[int, np.ndarray]
    S: dict[int, np.ndarray]
    counts: np.ndarray
    stages: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)
    stats: dict[str, int] = field(default_factory=dict)
    tasks: dict[int, list[str]] = field(default_factory=dict)


# ----------------------------------------------------------------------------------------------
# routing
# ----------------------------------------------------------------------------------------------

@dataclass
class Routes:
    """Every valid (src, token, slot) route, sorted by (expert, src, token, slot)."""

    src: np.ndarray
    tok: np.ndarray
    slot: np.ndarray
    expert: np.ndarray
    starts: np.ndarray  # (E + 1,) segment starts per global expert
    token_offsets: np.ndarray  # (R + 1,) start of each source rank's tokens in the global token list

    def rows(self, expert: int) -> slice:
        return slice(int(self.starts[expert]), int(self.starts[expert + 1]))


def route(tokens: Sequence[RankTokens], num_experts: int) -> Routes:
    """The route table of all source ranks (slots with id -1 are masked)."""
    return route_table([tk.topk_idx for tk in tokens], num_experts)


def route_table(topk_idx: Sequence[np.ndarray], num_experts: int) -> Routes:
    """The route table of every source rank's ``topk_idx`` (int64 (N_s, K); -1: a masked slot)."""
    src, tok, slot, exp = [], [], [], []
    for s, idx in enumerate(topk_idx):
        t, k = np.nonzero(idx >= 0)
        src.append(np.full(t.size, s, np.int64))
        tok.append(t.astype(np.int64))
        slot.append(k.astype(np.int64))
        exp.append(idx[t, k].astype(np.int64))
    s_all, t_all, k_all, e_all = (np.concatenate(a) if a else np.zeros(0, np.int64) for a in (src, tok, slot, exp))
    order = np.argsort(e_all, kind="stable")  # stable: (src, token, slot) order inside an expert
    s_all, t_all, k_all, e_all = s_all[order], t_all[order], k_all[order], e_all[order]
    starts = np.searchsorted(e_all, np.arange(num_experts + 1), side="left")
    offs = np.zeros(len(topk_idx) + 1, np.int64)
    offs[1:] = np.cumsum([idx.shape[0] for idx in topk_idx])
    return Routes(s_all, t_all, k_all, e_all, starts, offs)


# ----------------------------------------------------------------------------------------------
# SwiGLU stage
# ----------------------------------------------------------------------------------------------

def swiglu_stage(
    h: np.ndarray, w: np.ndarray | None, opts: RankOptions, cfg: PipelineConfig, *, quantize: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, dict[str, int]]:
    """bf16 (n, 2I) [gate | up] -> (v float32 (n, I), q, sf bytes (n, I / 32) or None, stats).

    q is E4M3 (FP8 mode, per-32 re-quantisation with the target's rule) or bf16 (BF16 mode).
    ``cfg.semantics``: ``"fused"`` the active target's fused kernel, ``"baseline"`` TileLang's op.
    """
    i = h.shape[1] // 2
    g = h[:, :i].astype(np.float32)
    u = h[:, i:].astype(np.float32)
    fused = cfg.semantics == "fused"
    g, u = sw.clamp(g, u, opts.activation_clamp, bf16_clamp=fused)
    w2 = None if w is None else w.astype(np.float32).reshape(-1, 1)
    stats: dict[str, int] = {}
    if cfg.exact:
        # Note: the devices' __expf / rcp.approx (fast_math) and CUDA expf or Ascend vector exp/div
        # are not reproducible; the exact model rounds the exact SwiGLU value once (fast_math unused).
        v, stats = sw.swiglu_exact(g, u, w2)
    else:
        reciprocal = fused and cfg.target == "deepgemm" and opts.fast_math
        v = sw.swiglu_fp32(g, u, w2, reciprocal)
    if cfg.mode == "bf16" or not quantize:
        return v, fm.cast(v, fm.BF16, fm.IEEE_RNE), None, stats
    rule: sw.ScaleRule = ("cuda" if cfg.target == "deepgemm" else "ascend") if fused else "tilelang"
    codes, sf = sw.requantize(v, rule)
    return v, codes.view(E4M3), sf, stats


# ----------------------------------------------------------------------------------------------
# combine
# ----------------------------------------------------------------------------------------------

#: The relative margin by which the error scale ``S`` of a combine in the specified order exceeds
#: ``sum |o_j|`` (see :func:`combine_rows`).
ORDER_MARGIN = 2.0**-12


def combine_order_specified(target: Target) -> bool:
    """Whether the target's library specifies its combine order and tests it bitwise.

    DeepGEMM does: its Mega MoE test asserts ``torch.equal`` between the fused kernel and DeepEP's
    ``allow_multiple_reduction=False`` expanded combine, a float32 running sum from +0 of the bf16
    slot outputs in increasing top-k order, rounded once to bf16.  No
    DeepGEMM-Ascend source shows its combine order, so its golden keeps the exact sum.
    """
    # Note: the golden keeps DeepGEMM's float32 combine order (specified and tested bitwise), and
    # rounds DeepGEMM-Ascend's exact sum once (no source shows that order: accumulation).
    return target == "deepgemm"


def combine_rows(values: np.ndarray, model: Any, want_S: bool = True,
                 ordered: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Combine (n, J, H) bf16 slot contributions o_j (masked slots +0) in slot order j = 0 .. J-1.

    Returns (y bf16 (n, H), acc float64 (n, H), S float64 (n, H) or None).

    ``ordered`` (the order the library specifies, :func:`combine_order_specified`; every
    accumulation model): ``F = +0; F = f32(F + o_j)`` for j = 0 .. J-1, ``y = bf16_RN(F)``;
    ``acc = F`` (a float32 value, exact in float64) and ``S = (1 + ORDER_MARGIN) sum_j |o_j|``.
    Why the margin: the checker's bounds for Mega MoE (``u_acc = 2^-8``, ``n = J``) were derived
    around the exact sum X, which a device summing in any float32 order stays close to; centred
    on F they must also absorb ``|F - X| <= gamma_{J-1}(2^-24) sum_j |o_j|`` (J - 1 float32
    roundings; any other float32 order F' has the same bound, so ``|F' - F|`` is at most twice
    it).  The factor 1 + 2^-12 adds at least ``J 2^-20 sum |o_j|`` to ``E_hard`` (more than that
    shift for every J) and ``8 sqrt(J) 2^-20 sum |o_j|`` to ``E`` (more for every J < 16000).
    Masked slots (+0) change nothing: F is never -0.

    Otherwise: ``acc`` = the exact sum: the float64 running sum in slot order, with every addition
    checked exact by TwoSum (a zero error term at every step means every partial sum, hence the
    result, is exact); elements with a non-zero error anywhere are summed with Fractions (their
    float64 ``acc`` is the nearest float64).  ``exact`` rounds the exact sum once to bf16; ``fp32``
    (and limited) runs the float32 chain above, then one bf16 rounding.  ``S = sum_j |o_j|``
    (rounded up).
    """
    n, j, hdim = values.shape
    S = None
    if want_S:
        S = np.zeros((n, hdim))
        for k in range(j):
            S += np.abs(values[:, k, :].astype(np.float64))
        S *= 1 + 2.0**-50  # an upper bound also where the float64 sum of |terms| rounded
        if ordered:
            S *= 1 + ORDER_MARGIN
    if ordered:
        y32, acc32 = _f32_chain(values)
        return y32, acc32.astype(np.float64), S
    acc = np.zeros((n, hdim))
    exact = np.ones((n, hdim), bool)
    with np.errstate(over="ignore", invalid="ignore"):
        for k in range(j):
            acc, e = two_sum(acc, values[:, k, :].astype(np.float64))
            exact &= e == 0
    acc[acc == 0] = 0.0  # an exact zero sum is +0
    rounding = FormatRounding(fm.BF16)

    def exact_sum(at: Points) -> np.ndarray:
        codes = np.empty(at[0].size, np.uint16)
        for p, (r, c) in enumerate(zip(at[0].tolist(), at[1].tolist(), strict=True)):
            ex = fraction_sum(values[r, :, c].astype(np.float64))
            acc[r, c] = float(ex) + 0.0  # the nearest float64 (an exact zero sum is +0)
            codes[p] = rounding.exact(ex)
        return codes

    # The estimate is exact where every TwoSum error vanished (bound 0); elsewhere the bound is
    # unknown (inf) and the Fraction sum decides (it also makes ``acc`` the exact sum's nearest
    # float64 under every model).  Non-finite sums follow IEEE arithmetic.
    bound = np.where(exact, 0.0, np.inf)
    codes, _ = round_certified(acc, bound, rounding, final=~np.isfinite(acc), fallback=exact_sum)
    if model == "exact":
        return codes.view(BF16), acc, S
    return _f32_chain(values)[0], acc, S


def _f32_chain(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(bf16_RN(F), F) of the float32 running sum ``F = +0; F = f32(F + o_j)`` over the slots j of
    (n, J, H) bf16 contributions, in increasing j; bf16 (n, H) and float32 (n, H)."""
    n, j, hdim = values.shape
    acc32 = np.zeros((n, hdim), np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        for k in range(j):
            acc32 = (acc32 + values[:, k, :].astype(np.float32)).astype(np.float32)
    return fm.cast(acc32, fm.BF16, fm.IEEE_RNE), acc32


# ----------------------------------------------------------------------------------------------
# the whole layer
# ----------------------------------------------------------------------------------------------

_BF16_OUT = core.OutputStage(fm.BF16)
_UE8M0_VALUES = fm.ue8m0_decode(np.arange(256))  # byte b -> 2^(b - 127); 0 -> 2^-127, 255 -> NaN


def ue8m0_values(b: np.ndarray) -> np.ndarray:
    """UE8M0 bytes -> float64 scales as the hardware reads them (a table lookup)."""
    return _UE8M0_VALUES[b]


def _acts_operand(q: np.ndarray, sf: np.ndarray | None) -> core.Operand:
    if sf is None:
        return core.Operand(q)
    return core.Operand(q, ue8m0_values(sf), 32)


@dataclass
class _Expert:
    """One expert's rows: a rank's routed local expert, or a rank's shared experts (one wide expert).

    name:     the label prefix of its executor tasks ("rank 1 expert 0", "rank 1 shared expert").
    x, x_sf:  its token rows as they arrive (dispatch), and their float64 scales or None.
    l1, l2:   its weights as core operands.
    weights:  the route weight of every row (None: the shared expert, no weight).
    options:  the owner rank's epilogue options.
    slots:    where its L2 rows go in the combine array: (token rows, slot).
    count_swiglu: add the SwiGLU stats to the layer's (routed experts; the shared expert's are not).
    """

    name: str
    x: np.ndarray
    x_sf: np.ndarray | None
    l1: core.Operand
    l2: core.Operand
    weights: np.ndarray | None
    options: RankOptions
    slots: tuple[np.ndarray | slice, np.ndarray | int]
    count_swiglu: bool


@dataclass
class _ExpertOut:
    """An expert's stage values: L1 output h, SwiGLU output v, L2 activations q (and SF bytes),
    L2 output o, the GEMMs' accumulators and error scales (when asked), the executor task labels."""

    h: np.ndarray
    v: np.ndarray
    q: np.ndarray
    sf: np.ndarray | None
    o: np.ndarray
    l1: executor.Collected
    l2: executor.Collected
    tasks: list[str]


def _execute(cfg: PipelineConfig, d: np.ndarray, tasks: list[executor.Task | executor.Fill],
             stats: dict[str, int]) -> executor.Collected:
    """Run one stage's tasks into ``d`` (the layer's records are the collective's: nothing is
    recorded here) and add the core's stats to ``stats``."""
    req = executor.Request(func=cfg.func, profile=cfg.profile, d=d, defined=None)
    col = executor.execute(req, tasks, accumulation=cfg.accumulation, want=(cfg.want_acc, cfg.want_S),
                           record_trace=False)
    for key, val in col.stats.items():
        stats[key] = stats.get(key, 0) + val
    return col


def _expert(e: _Expert, cfg: PipelineConfig, comb: np.ndarray, stats: dict[str, int]) -> _ExpertOut:
    """h = bf16(x @ W1^T);  v = swiglu(h) (* w);  q, sf = requantize(v);  o = bf16(q @ W2^T) -> combine slots.

    Two executor requests: [dispatch (the token rows arrive), L1 GEMM] into h, then [SwiGLU (its
    activations written), L2 GEMM, o sent to the combine slots] into o.  The GEMMs are transposed
    tasks (:attr:`deepgemm_ref.executor.Task.transposed`): the large weight matrix is decoded
    chunk by chunk and every chunk's BLAS call has all rows; the epilogue (one rounding per
    element) and the certificates do not depend on the orientation.
    """
    n = e.x.shape[0]
    recv = np.empty_like(e.x)
    h = np.empty((n, e.l1.shape[0]), BF16)
    l1 = _execute(cfg, h, [
        executor.Fill((...,), e.x, into=recv, label=f"{e.name}: dispatch"),
        executor.Task(core.Operand(recv) if e.x_sf is None else core.Operand(recv, e.x_sf, 32), e.l1, _BF16_OUT,
                      (slice(None),), transposed=True, label=f"{e.name}: L1 GEMM"),
    ], stats)
    v, q, sf, st = swiglu_stage(h, e.weights, e.options, cfg)
    if e.count_swiglu:
        for key, val in st.items():
            stats["swiglu_" + key] = stats.get("swiglu_" + key, 0) + val
    acts = np.empty_like(q)
    o = np.empty((n, e.l2.shape[0]), BF16)
    l2 = _execute(cfg, o, [
        executor.Fill((...,), q, into=acts, label=f"{e.name}: SwiGLU"),
        executor.Task(_acts_operand(acts, sf), e.l2, _BF16_OUT, (slice(None),), transposed=True,
                      label=f"{e.name}: L2 GEMM"),
        executor.Fill(e.slots, o, into=comb, label=f"{e.name}: to the combine"),
    ], stats)
    return _ExpertOut(h, v, q, sf, o, l1, l2, l1.tasks + l2.tasks)


class _Ranks:
    """Per rank: the stage goldens (when asked) and the labels of the executor tasks run for it."""

    def __init__(self, want_stages: bool) -> None:
        self.want = want_stages
        self.stages: dict[int, dict[str, list[np.ndarray]]] = {}
        self.tasks: dict[int, list[str]] = {}

    def keep(self, rank: int, name: str, arr: np.ndarray) -> None:
        if self.want:
            self.stages.setdefault(rank, {}).setdefault(name, []).append(arr)

    def expert(self, rank: int, out: _ExpertOut, shared: bool) -> None:
        """An expert's labels and stage goldens (the shared expert's without accumulators)."""
        self.tasks.setdefault(rank, []).extend(out.tasks)
        pre = "shared." if shared else ""
        self.keep(rank, pre + "l1.output", out.h)
        self.keep(rank, pre + "swiglu.output", out.v)
        self.keep(rank, pre + "l2.acts", out.q)
        if out.sf is not None:
            self.keep(rank, pre + "l2.acts_sf", out.sf)
        self.keep(rank, "shared.output" if shared else "l2.output", out.o)
        if shared:
            return
        if out.l1.acc is not None and out.l2.acc is not None:
            self.keep(rank, "l1.acc", out.l1.acc)
            self.keep(rank, "l2.acc", out.l2.acc)
        if out.l1.S is not None and out.l2.S is not None:
            self.keep(rank, "l1.S", out.l1.S)
            self.keep(rank, "l2.S", out.l2.S)


def route_counts(routes: Routes, num_ranks: int, num_local_experts: int) -> np.ndarray:
    """counts[r, i, s]: the routes from source rank s to rank r's local expert i (int64)."""
    counts = np.zeros((num_ranks, num_local_experts, num_ranks), np.int64)
    if routes.src.size:
        np.add.at(counts, (routes.expert // num_local_experts, routes.expert % num_local_experts, routes.src), 1)
    return counts


#: What an expert owner reads for the route indices ``sel`` (sorted): the token rows, their scales
#: (or None) and the route weights, in the order of ``sel``.
Fetch = Callable[[np.ndarray], tuple[np.ndarray, "np.ndarray | None", np.ndarray]]


def _owners(owners: Sequence[int], routes: Routes, selected: Callable[[int], np.ndarray], fetch: Fetch,
            place: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray | int]], sink: np.ndarray,
            weights: Callable[[int], ExpertWeights], options: Callable[[int], RankOptions], cfg: PipelineConfig,
            stats: dict[str, int], ranks: _Ranks) -> None:
    """Expert owners ``owners``: every local expert's rows (``selected(global expert)``: route
    indices), fetched, run through :func:`_expert` and filled into ``sink`` at ``place(sel)``.

    The experts are independent (their rows go to disjoint places of ``sink``): they run on the
    package's pool (:func:`deepgemm_ref.executor.on_pool`, a one-thread BLAS each), every stage
    of one expert in one thread; their stats, stage goldens and task labels are then taken in
    (owner, local expert) order, as one expert after the other gives them.  A call that keeps its
    stage goldens (a trace capture: the golden workflow, whose memory estimates plan one expert's
    float64 work at a time) runs them one after the other.
    """
    jobs: list[tuple[int, np.ndarray, np.ndarray, _Expert]] = []
    ends: dict[int, list[int]] = {}
    for r in owners:
        w = weights(r)
        e_l = w.num_local_experts
        total = 0
        ends[r] = []
        for i in range(e_l):
            sel = selected(r * e_l + i)
            total += sel.size
            ends[r].append(total)
            if sel.size == 0:
                continue
            x, x_sf, wts = fetch(sel)
            jobs.append((r, sel, wts, _Expert(f"rank {r} expert {i}", x, x_sf, w.l1(i), w.l2(i), wts, options(r),
                                              place(sel), True)))

    def job(e: _Expert) -> tuple[_ExpertOut, dict[str, int]]:
        own: dict[str, int] = {}
        return _expert(e, cfg, sink, own), own

    calls = [partial(job, e) for *_, e in jobs]
    outs = [c() for c in calls] if cfg.want_stages else executor.on_pool(calls)
    done = 0
    for r in owners:
        for (jr, sel, wts, _), (res, own) in zip(jobs[done:], outs[done:], strict=True):
            if jr != r:
                break
            done += 1
            for key, val in own.items():
                stats[key] = stats.get(key, 0) + val
            ranks.keep(r, "dispatch.src", np.stack([routes.src[sel], routes.tok[sel], routes.slot[sel]], axis=1))
            ranks.keep(r, "dispatch.topk_weights", wts.astype(np.float32))
            ranks.expert(r, res, shared=False)
        ranks.keep(r, "dispatch.psum", np.array(ends[r], np.int32))


def _source(s: int, tokens: RankTokens, comb: np.ndarray, shared: ExpertWeights | None, options: RankOptions,
            cfg: PipelineConfig, stats: dict[str, int], ranks: _Ranks, result: PipelineResult) -> None:
    """Source rank s: its shared expert (DeepGEMM-Ascend) into the last slot of ``comb`` (its
    (N, slots, H) combine array, routed slots already filled), then the combine into ``result``."""
    n, k = tokens.num_tokens, tokens.topk_idx.shape[1]
    if shared is not None and n:
        res = _expert(_Expert(f"rank {s} shared expert", tokens.x.copy(), None if tokens.x_scales is None
                              else tokens.x_scales.copy(), shared.l1(0), shared.l2(0), None, options,
                              (slice(0, n), k), False), cfg, comb, stats)
        ranks.expert(s, res, shared=True)
    y, acc, S = combine_rows(comb, cfg.accumulation.model, want_S=cfg.want_stages,
                             ordered=combine_order_specified(cfg.target))
    result.y[s], result.acc[s] = y, acc
    if S is not None:
        result.S[s] = S
    ranks.keep(s, "combine.input", comb)
    ranks.keep(s, "y", y)


def _finish(result: PipelineResult, ranks: _Ranks, weights: dict[int, ExpertWeights], hidden: int,
            cfg: PipelineConfig) -> PipelineResult:
    """Every kept stage golden of the ranks in ``weights`` (empty ones for ranks that received
    nothing), concatenated; the task labels."""
    if cfg.want_stages:
        for r, w in weights.items():
            named = ranks.stages.setdefault(r, {})
            i_dim = int(w.l2(0).shape[1]) if w.num_local_experts and "l2.acts" not in named else 0
            for key, shape, dt in (("dispatch.src", (0, 3), np.int64), ("dispatch.topk_weights", (0,), np.float32),
                                   ("l1.output", (0, 2 * i_dim), BF16), ("swiglu.output", (0, i_dim), np.float32),
                                   ("l2.output", (0, hidden), BF16)):
                named.setdefault(key, [np.zeros(shape, dt)])
    for rank, named in ranks.stages.items():
        result.stages[rank] = {k: (np.concatenate(v) if len(v) > 1 else v[0]) for k, v in named.items()}
    result.tasks = ranks.tasks
    return result


def _merge_stats(result: PipelineResult, *parts: dict[str, int]) -> None:
    for part in parts:
        for key, val in part.items():
            result.stats[key] = result.stats.get(key, 0) + val


def run(
    tokens: Sequence[RankTokens],
    weights: Sequence[ExpertWeights],
    options: Sequence[RankOptions],
    cfg: PipelineConfig,
    out_ranks: Sequence[int],
    shared: Sequence[ExpertWeights | None] | None = None,
) -> PipelineResult:
    """Compute y (and goldens) of the source ranks ``out_ranks``; routing counts of every rank.

    tokens: one per rank (source role); weights, options: one per rank (expert-owner role);
    shared: DeepGEMM-Ascend's shared experts per rank (their rows run on the token's own rank).
    Every expert (routed, then shared) runs :func:`_expert`; each source rank's combine array
    (N, slots, H) receives its routed slots, then the shared-expert slot, and is summed by
    :func:`combine_rows`.  ``result.tasks[r]``: the labels of the executor tasks run for rank r
    (as expert owner, then as token source).
    """
    R = len(tokens)
    E_l = weights[0].num_local_experts
    routes = route(tokens, E_l * R)
    out = sorted(set(int(s) for s in out_ranks))
    x_all = np.concatenate([tk.x for tk in tokens]) if R else np.zeros((0, 0))
    sc_all = None if tokens[0].x_scales is None else np.concatenate([tk.x_scales for tk in tokens])
    w_all = np.concatenate([tk.topk_weights for tk in tokens])
    K, H = tokens[0].topk_idx.shape[1], x_all.shape[1]
    has_shared = shared is not None and any(sh is not None for sh in shared)
    # the combine array: every out rank's tokens, in rank order, by (token, slot (+ shared), H)
    first = np.zeros(R, np.int64)  # the combine row of each out rank's token 0
    first[out] = np.cumsum([0] + [tokens[s].num_tokens for s in out])[:-1]
    comb = np.zeros((sum(tokens[s].num_tokens for s in out), K + int(has_shared), H), BF16)
    routed: dict[str, int] = {}
    ranks = _Ranks(cfg.want_stages)

    def selected(expert: int) -> np.ndarray:
        seg = routes.rows(expert)
        sel = np.arange(seg.start, seg.stop)
        return sel[np.isin(routes.src[sel], out)] if len(out) < R else sel

    def fetch(sel: np.ndarray) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
        glob = routes.token_offsets[routes.src[sel]] + routes.tok[sel]
        return x_all[glob], (None if sc_all is None else sc_all[glob]), w_all[glob, routes.slot[sel]]

    def place(sel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return first[routes.src[sel]] + routes.tok[sel], routes.slot[sel]

    _owners(range(R), routes, selected, fetch, place, comb, weights.__getitem__, options.__getitem__, cfg, routed,
            ranks)
    result = PipelineResult({}, {}, {}, route_counts(routes, R, E_l), {}, {})
    own: dict[str, int] = {}
    for s in out:
        rows = slice(int(first[s]), int(first[s]) + tokens[s].num_tokens)
        _source(s, tokens[s], comb[rows], None if shared is None else shared[s], options[s], cfg, own, ranks, result)
    _merge_stats(result, routed, own)
    return _finish(result, ranks, dict(enumerate(weights)), H, cfg)


def run_rank(
    tokens: RankTokens,
    weights: ExpertWeights,
    options: RankOptions,
    cfg: PipelineConfig,
    transport: Transport,
    shared: ExpertWeights | None = None,
) -> PipelineResult:
    """:func:`run` for this process's rank of a group whose ranks are processes: the same bytes
    (y, acc, S, counts, stages, stats, task labels of this rank) from this rank's own inputs.

    tokens, weights, options, shared: this rank's (``transport.rank``).  The exchanges:
    all-gather of every rank's ``topk_idx`` (the route table), all-to-all of the routed token
    rows, their scales and route weights to the experts' owners (each owner receives its rows in
    the route table's order, as :func:`run` reads them), all-to-all of the L2 outputs back to
    their source ranks, all-gather of the stats.
    """
    me, R = transport.rank, transport.size
    E_l = weights.num_local_experts
    idx = transport.all_gather(tokens.topk_idx)
    routes = route_table(idx, E_l * R)
    K, H = tokens.topk_idx.shape[1], tokens.x.shape[1]
    owner = routes.expert // E_l
    # what this rank sends to each owner: its routes to that owner's experts, in route-table order
    sent = [np.flatnonzero((routes.src == me) & (owner == r)) for r in range(R)]
    tok = [routes.tok[j] for j in sent]
    x_in = transport.all_to_all([tokens.x[t] for t in tok])
    sc_in = None if tokens.x_scales is None else transport.all_to_all([tokens.x_scales[t] for t in tok])
    w_in = transport.all_to_all([tokens.topk_weights[t, routes.slot[j]] for t, j in zip(tok, sent, strict=True)])
    # this rank's routes as owner (route-table order) and where each one's row arrived
    mine = np.flatnonzero(owner == me)
    src = routes.src[mine]
    start = np.concatenate([[0], np.cumsum([a.shape[0] for a in x_in])]).astype(np.int64)
    nth = np.zeros(mine.size, np.int64)  # the route's position among its source's routes to this rank
    for s in range(R):
        at = np.flatnonzero(src == s)
        nth[at] = np.arange(at.size)
    arrived = np.full(routes.src.size, -1, np.int64)
    arrived[mine] = start[src] + nth
    x_all = np.concatenate(x_in)
    sc_all = None if sc_in is None else np.concatenate(sc_in)
    w_all = np.concatenate(w_in)
    out_rows = np.zeros((x_all.shape[0], 1, H), BF16)
    routed: dict[str, int] = {}
    ranks = _Ranks(cfg.want_stages)

    def selected(expert: int) -> np.ndarray:
        seg = routes.rows(expert)
        return np.arange(seg.start, seg.stop)

    def fetch(sel: np.ndarray) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
        at = arrived[sel]
        return x_all[at], (None if sc_all is None else sc_all[at]), w_all[at]

    def place(sel: np.ndarray) -> tuple[np.ndarray, int]:
        return arrived[sel], 0

    _owners([me], routes, selected, fetch, place, out_rows, lambda _: weights, lambda _: options, cfg, routed, ranks)
    # back to the sources, in the order each one sent its rows
    back = transport.all_to_all([out_rows[start[s]:start[s + 1], 0] for s in range(R)])
    comb = np.zeros((tokens.num_tokens, K + int(shared is not None), H), BF16)
    for r in range(R):
        comb[tok[r], routes.slot[sent[r]]] = back[r]
    result = PipelineResult({}, {}, {}, route_counts(routes, R, E_l), {}, {})
    own: dict[str, int] = {}
    _source(me, tokens, comb, shared, options, cfg, own, ranks, result)
    for part in _gather_stats(transport, routed, own):
        _merge_stats(result, part)
    return _finish(result, ranks, {me: weights}, H, cfg)


def _gather_stats(transport: Transport, *parts: dict[str, int]) -> list[dict[str, int]]:
    """Every rank's stats dicts, merged in :func:`run`'s order: the first part of every rank in
    rank order, then the second part of every rank, ... (JSON text as bytes, no pickle)."""
    text = json.dumps([list(p.items()) for p in parts]).encode()
    got = [json.loads(a.tobytes().decode()) for a in transport.all_gather(np.frombuffer(text, np.uint8))]
    return [dict(rank_parts[i]) for i in range(len(parts)) for rank_parts in got]
