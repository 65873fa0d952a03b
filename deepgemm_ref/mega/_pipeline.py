"""The mega-MoE dataflow over all ranks in one process: routing, L1, SwiGLU, re-quantisation, L2, combine.

Everything here is a pure function of canonical inputs (see :class:`RankTokens` and the weight
readers of :mod:`._weights`); the public kernels and stage functions translate layouts and call it.

Per destination rank ``r`` and local expert ``i`` the routed rows are every valid ``(s, t, k)``
(source rank, token, slot) with ``topk_idx[s][t, k] == r * E_l + i``, in increasing ``(s, t, k)``
order, and one executor task (:mod:`deepgemm_ref.executor`) computes each GEMM on them::

    h  = bf16( x_s[t] @ W1_i^T )                          (n, 2I): gate = h[:, :I], up = h[:, I:]
    v  = swiglu(gate, up) * w_{s,t,k}                     float32 (n, I)   (see ._swiglu)
    q, sf = requantize(v)  (FP8)   |   q = bf16(v)  (BF16)
    o  = bf16( q @ W2_i^T )                               (n, H), sent to combine slot (s, t, k)
    y_s[t] = bf16( sum over valid k in increasing k of o_{s,t,k}  (+ shared-expert slot) )

The combine sum is exact in the ``exact`` model (certified float64, Fraction fallback) and a
float32 running sum from +0 in slot order in the ``fp32`` model.  Every row is computed
independently of every other, so results do not depend on the rank count, on which rank owns
which expert, or on which other tokens are present.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np

from .. import core, executor
from .. import formats as fm
from ..certified import FormatRounding, Points, round_certified
from ..exact import fraction_sum, two_sum
from ..toolkit.args import BF16, E4M3
from . import _swiglu as sw

__all__ = [
    "RankTokens",
    "RankOptions",
    "PipelineConfig",
    "PipelineResult",
    "ExpertWeights",
    "run",
    "swiglu_stage",
    "combine_rows",
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
    target: Target
    mode: Literal["fp8", "bf16"]
    accumulation: core.Accumulation = field(default_factory=core.Accumulation)
    semantics: Literal["fused", "baseline"] = "fused"
    want_stages: bool = False
    want_acc: bool = False
    want_S: bool = False

    @property
    def exact(self) -> bool:
        return self.accumulation.model == "exact"


@dataclass
class PipelineResult:
    """y, exact combine accumulators and error scales of the requested source ranks; routing counts
    (dst rank, local expert, src rank) of every rank; stage goldens by rank when requested."""

    y: dict[int, np.ndarray]
    acc: dict[int, np.ndarray]
    S: dict[int, np.ndarray]
    counts: np.ndarray
    stages: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)
    stats: dict[str, int] = field(default_factory=dict)


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
    src, tok, slot, exp = [], [], [], []
    for s, tk in enumerate(tokens):
        valid = tk.topk_idx >= 0
        t, k = np.nonzero(valid)
        src.append(np.full(t.size, s, np.int64))
        tok.append(t.astype(np.int64))
        slot.append(k.astype(np.int64))
        exp.append(tk.topk_idx[t, k].astype(np.int64))
    s_all, t_all, k_all, e_all = (np.concatenate(a) if a else np.zeros(0, np.int64) for a in (src, tok, slot, exp))
    order = np.argsort(e_all, kind="stable")  # stable: (src, token, slot) order inside an expert
    s_all, t_all, k_all, e_all = s_all[order], t_all[order], k_all[order], e_all[order]
    starts = np.searchsorted(e_all, np.arange(num_experts + 1), side="left")
    offs = np.zeros(len(tokens) + 1, np.int64)
    offs[1:] = np.cumsum([tk.num_tokens for tk in tokens])
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

def combine_rows(values: np.ndarray, model: Any,
                 want_S: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Combine (n, J, H) bf16 slot contributions (masked slots +0) in slot order.

    Returns (y bf16 (n, H), exact sum float64 (n, H), S = sum |contributions| float64 (n, H) or None).
    The exact sum: the float64 running sum in slot order, with every addition checked exact by
    TwoSum (a zero error term at every step means every partial sum, hence the result, is exact);
    elements with a non-zero error anywhere are summed with Fractions (their float64 ``acc`` is
    the nearest float64).  ``exact`` rounds the exact sum once to bf16; ``fp32`` (and limited) runs
    the kernels' float32 chain ``acc = f32(acc + o_j)`` from +0, then one bf16 rounding.
    """
    n, j, hdim = values.shape
    acc = np.zeros((n, hdim))
    exact = np.ones((n, hdim), bool)
    S = np.zeros((n, hdim)) if want_S else None
    with np.errstate(over="ignore", invalid="ignore"):
        for k in range(j):
            v = values[:, k, :].astype(np.float64)
            acc, e = two_sum(acc, v)
            exact &= e == 0
            if S is not None:
                S += np.abs(v)
    if S is not None:
        S *= 1 + 2.0**-50  # an upper bound also where the float64 sum of |terms| rounded
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
    acc32 = np.zeros((n, hdim), np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        for k in range(j):
            acc32 = (acc32 + values[:, k, :].astype(np.float32)).astype(np.float32)
    return fm.cast(acc32, fm.BF16, fm.IEEE_RNE), acc, S


# ----------------------------------------------------------------------------------------------
# the whole layer
# ----------------------------------------------------------------------------------------------

def _gemm(tokens: core.Operand, weights: core.Operand, cfg: PipelineConfig, stats: dict[str, int]) -> core.MatmulResult:
    """``bf16(tokens @ weights^T)`` (rows, N): one executor task (the layer's trace record is the
    collective's, so nothing is recorded here).

    The task is transposed (:attr:`deepgemm_ref.executor.Task.transposed`): the large weight
    matrix is decoded chunk by chunk (no float64 copy of it) and every chunk's BLAS call has all
    routed rows.  The epilogue (one rounding per element) and the certificates do not depend on
    the orientation.
    """
    out = np.empty((tokens.shape[0], weights.shape[0]), BF16)
    task = executor.Task(tokens, weights, core.OutputStage(fm.BF16), (slice(None),), transposed=True)
    col = executor.legacy_execute("mega_moe", out, [task], accumulation=cfg.accumulation,
                                  want=(cfg.want_acc, cfg.want_S), record_trace=False)
    for key, val in col.stats.items():
        stats[key] = stats.get(key, 0) + val
    return core.MatmulResult(out, col.acc, None, col.S, col.stats)


def _token_operand(x_all: np.ndarray, sc_all: np.ndarray | None, rows: np.ndarray) -> core.Operand:
    if sc_all is None:
        return core.Operand(x_all[rows])
    return core.Operand(x_all[rows], sc_all[rows], 32)


def _acts_operand(q: np.ndarray, sf: np.ndarray | None) -> core.Operand:
    if sf is None:
        return core.Operand(q)
    return core.Operand(q, ue8m0_values(sf), 32)


_UE8M0_VALUES = fm.ue8m0_decode(np.arange(256))  # byte b -> 2^(b - 127); 0 -> 2^-127, 255 -> NaN


def ue8m0_values(b: np.ndarray) -> np.ndarray:
    """UE8M0 bytes -> float64 scales as the hardware reads them (a table lookup)."""
    return _UE8M0_VALUES[b]


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
    """
    R = len(tokens)
    E_l = weights[0].num_local_experts
    E = E_l * R
    routes = route(tokens, E)
    counts = np.zeros((R, E_l, R), np.int64)
    if routes.src.size:
        np.add.at(counts, (routes.expert // E_l, routes.expert % E_l, routes.src), 1)
    out_set = set(int(s) for s in out_ranks)
    x_all = np.concatenate([tk.x for tk in tokens]) if R else np.zeros((0, 0))
    sc_all = None if tokens[0].x_scales is None else np.concatenate([tk.x_scales for tk in tokens])
    w_all = np.concatenate([tk.topk_weights for tk in tokens])
    K = tokens[0].topk_idx.shape[1]
    H = x_all.shape[1]
    has_shared = shared is not None and any(sh is not None for sh in shared)
    J = K + (1 if has_shared else 0)
    comb = {s: np.zeros((tokens[s].num_tokens, J, H), BF16) for s in out_set}
    stats: dict[str, int] = {}
    stages: dict[int, dict[str, list[np.ndarray]]] = {}

    def keep(rank: int, name: str, arr: np.ndarray) -> None:
        stages.setdefault(rank, {}).setdefault(name, []).append(arr)

    for r in range(R):
        ends = []
        total = 0
        for i in range(E_l):
            seg = routes.rows(r * E_l + i)
            sel = np.arange(seg.start, seg.stop)
            if len(out_set) < R:
                sel = sel[np.isin(routes.src[sel], list(out_set))]
            total += sel.size
            ends.append(total)
            if sel.size == 0:
                continue
            src, tok, slot = routes.src[sel], routes.tok[sel], routes.slot[sel]
            glob = routes.token_offsets[src] + tok
            res1 = _gemm(_token_operand(x_all, sc_all, glob), weights[r].l1(i), cfg, stats)
            wts = w_all[glob, slot]
            v, q, sf, st = swiglu_stage(res1.out, wts, options[r], cfg)
            for key, val in st.items():
                stats["swiglu_" + key] = stats.get("swiglu_" + key, 0) + val
            res2 = _gemm(_acts_operand(q, sf), weights[r].l2(i), cfg, stats)
            for s in np.unique(src):
                m = src == s
                comb[int(s)][tok[m], slot[m]] = res2.out[m]
            if cfg.want_stages:
                keep(r, "dispatch.src", np.stack([src, tok, slot], axis=1))
                keep(r, "dispatch.topk_weights", wts.astype(np.float32))
                keep(r, "l1.output", res1.out)
                keep(r, "swiglu.output", v)
                keep(r, "l2.acts", q)
                if sf is not None:
                    keep(r, "l2.acts_sf", sf)
                keep(r, "l2.output", res2.out)
                if res1.acc is not None and res2.acc is not None:
                    keep(r, "l1.acc", res1.acc)
                    keep(r, "l2.acc", res2.acc)
                if res1.S is not None and res2.S is not None:
                    keep(r, "l1.S", res1.S)
                    keep(r, "l2.S", res2.S)
        if cfg.want_stages:
            keep(r, "dispatch.psum", np.array(ends, np.int32))

    result = PipelineResult({}, {}, {}, counts, {}, stats)
    for s in sorted(out_set):
        tk = tokens[s]
        if has_shared and shared is not None and shared[s] is not None and tk.num_tokens:
            sh = shared[s]
            assert sh is not None
            rows = np.arange(routes.token_offsets[s], routes.token_offsets[s + 1])
            res1 = _gemm(_token_operand(x_all, sc_all, rows), sh.l1(0), cfg, stats)
            v, q, sf, _ = swiglu_stage(res1.out, None, options[s], cfg)
            res2 = _gemm(_acts_operand(q, sf), sh.l2(0), cfg, stats)
            comb[s][:, K] = res2.out
            if cfg.want_stages:
                keep(s, "shared.l1.output", res1.out)
                keep(s, "shared.swiglu.output", v)
                keep(s, "shared.l2.acts", q)
                if sf is not None:
                    keep(s, "shared.l2.acts_sf", sf)
                keep(s, "shared.output", res2.out)
        y, acc, S = combine_rows(comb[s], cfg.accumulation.model, want_S=cfg.want_stages)
        result.y[s], result.acc[s] = y, acc
        if S is not None:
            result.S[s] = S
        if cfg.want_stages:
            keep(s, "combine.input", comb[s])
            keep(s, "y", y)
    if cfg.want_stages:
        for r in range(R):
            named = stages.setdefault(r, {})
            i_dim = int(weights[r].l2(0).shape[1]) if E_l and "l2.acts" not in named else 0
            for key, shape, dt in (("dispatch.src", (0, 3), np.int64), ("dispatch.topk_weights", (0,), np.float32),
                                   ("l1.output", (0, 2 * i_dim), BF16), ("swiglu.output", (0, i_dim), np.float32),
                                   ("l2.output", (0, H), BF16)):
                named.setdefault(key, [np.zeros(shape, dt)])
    for rank, named in stages.items():
        result.stages[rank] = {k: (np.concatenate(v) if len(v) > 1 else v[0]) for k, v in named.items()}
    return result
