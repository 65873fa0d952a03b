"""The unfused mega-MoE pipeline as stage functions: dispatch, grouped GEMM, SwiGLU + FP8, combine.

These are DeepGEMM's test baseline (``tests/test_mega_moe.py``: DeepEP dispatch, a psum-layout
grouped GEMM, TileLang's ``swiglu_apply_weight_to_fp8``, the grouped GEMM again, DeepEP combine),
in one process: dispatch and combine over all ranks, the GEMM and SwiGLU on one rank's tensors
(public home: :mod:`deepgemm_ref.mega.stages`).  Each takes the previous stage's output, so
feeding a device's stage-k output gives the golden of stage k + 1 conditioned on the device: a
single FP8 rounding flip on the device does not cascade into false failures downstream.

Row order (a destination rank's "dispatch order"): local expert by local expert, each expert's
routes in increasing (source rank, token, slot), each expert's segment starting at
``align(previous end, expert_alignment)``; ``psum_num_recv_tokens_per_expert`` holds the END offset
of every segment (the psum layout of the grouped GEMMs).  Padding rows are zero.

Each function reads check -> compute: a ``_check_*`` step validates the call for the profile the
dispatcher hands it and returns its request (nothing computed or written); the grouped GEMM's
tasks run through :func:`~deepgemm_ref.executor.execute`, and the other stages, which assemble
stage arrays (or one record per source rank), report them with
:func:`~deepgemm_ref.executor.record`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from .. import core
from .. import formats as fm
from ..api import profiled
from ..errors import arg_error
from ..executor import Collected, Request, Task, active_accumulation, execute, record
from ..interop import Kind, caller_kind, from_numpy
from ..profiles import Profile
from ..toolkit.args import BF16, E4M3, I8, align, as_array, as_pair, ceil_div, int_arg, packed_fp4
from ..toolkit.groups import psum_ranges
from ..toolkit.scales import sf_values
from . import _swiglu as sw
from ._pipeline import (
    PipelineConfig,
    RankOptions,
    RankTokens,
    combine_order_specified,
    combine_rows,
    route,
    swiglu_stage,
)
from ._weights import PlainWeights

__all__ = [
    "MegaMoEDispatch",
    "mega_moe_dispatch",
    "mega_moe_grouped_gemm",
    "swiglu_apply_weight_to_fp8",
    "mega_moe_combine",
]


@dataclass
class MegaMoEDispatch:
    """One destination rank's received rows, in dispatch order (see the module docstring).

    recv_x:            (M, H) float8_e4m3fn or bfloat16
    recv_x_sf:         per-32 UE8M0 scales in the target's grouped-GEMM layout: DeepGEMM int32
                       (M, H / 128) MN-major TMA-aligned (layout 2); DeepGEMM-Ascend int16 UE8M0
                       pairs (M, H / 64) MN-major; None for bfloat16 tokens
    recv_topk_weights: float32 (M,) route weight of every row (0 in padding rows)
    psum_num_recv_tokens_per_expert: int32 (E_l,) END row of every local expert's segment
    src:               int64 (M, 3): (source rank, token, slot) of every row, -1 in padding rows
    num_tokens_per_rank: every source rank's token count N_s; num_topk: K
    """

    recv_x: np.ndarray
    recv_x_sf: np.ndarray | None
    recv_topk_weights: np.ndarray
    psum_num_recv_tokens_per_expert: np.ndarray
    src: np.ndarray
    num_tokens_per_rank: tuple[int, ...]
    num_topk: int


def _seq(func: str, arg: str, v: Any, n: int | None = None) -> list[Any]:
    if not isinstance(v, (list, tuple)) or (n is not None and len(v) != n):
        raise arg_error(func, arg, "a list with one entry per rank" + (f" ({n})" if n is not None else ""),
                        f"{type(v).__name__}" + (f" of length {len(v)}" if isinstance(v, (list, tuple)) else ""))
    return list(v)


def _scale_bytes(values: np.ndarray) -> np.ndarray:
    """float64 powers of two (2^(b - 127), NaN for 255) -> UE8M0 bytes."""
    m, e = np.frexp(np.where(np.isfinite(values), values, 1.0))
    b = np.clip(e.astype(np.int64) - 1 + 127, 0, 254)
    return np.where(np.isnan(values), 255, b).astype(np.uint8)


def _packed_mn_major(b: np.ndarray, ascend: bool) -> np.ndarray:
    """UE8M0 bytes (M, G) -> DeepGEMM layout 2 int32 (M, ceil(G / 4)) or Ascend int16 pairs (M, G / 2), MN-major."""
    m, g = b.shape
    per = 2 if ascend else 4
    cols = ceil_div(g, per)
    padded = np.zeros((m, cols * per), np.uint8)
    padded[:, :g] = b
    words = fm.pack_ue8m0_int16(padded) if ascend else fm.pack_ue8m0_int32(padded)
    rows = m if ascend else align(m, 4)
    phys = np.zeros((cols, rows), words.dtype)
    phys[:, :m] = words.T
    return phys.T[:m]


def _tokens(func: str, x: Any, idx: Any, weights: Any, num_experts: int, target: str) -> list[RankTokens]:
    xs = _seq(func, "x", x)
    R = len(xs)
    idxs = _seq(func, "topk_idx", idx, R)
    ws = _seq(func, "topk_weights", weights, R)
    out: list[RankTokens] = []
    for s in range(R):
        if isinstance(xs[s], (tuple, list)):
            xv, sf = as_pair(xs[s], func, f"x[{s}]")
            if xv.dtype != E4M3 or xv.ndim != 2 or sf is None:
                raise arg_error(func, f"x[{s}]", "(float8_e4m3fn (N, H), per-32 SF) or bfloat16 (N, H)", xv)
            scales = sf_values(sf, xv.shape[0], xv.shape[1], 1, 32, func=func, arg=f"x[{s}][1]")
        else:
            xv = as_array(xs[s], func, f"x[{s}]")
            if xv.dtype != BF16 or xv.ndim != 2:
                raise arg_error(func, f"x[{s}]", "(float8_e4m3fn (N, H), per-32 SF) or bfloat16 (N, H)", xv)
            scales = None
        ia = as_array(idxs[s], func, f"topk_idx[{s}]")
        wa = as_array(ws[s], func, f"topk_weights[{s}]")
        n = xv.shape[0]
        if ia.ndim != 2 or ia.shape[0] != n or ia.dtype.kind not in "iu":
            raise arg_error(func, f"topk_idx[{s}]", f"an integer ({n}, K) array", ia)
        if wa.shape != ia.shape or wa.dtype != np.float32:
            raise arg_error(func, f"topk_weights[{s}]", f"a float32 {ia.shape} array", wa)
        if s and (xv.shape[1] != out[0].x.shape[1] or ia.shape[1] != out[0].topk_idx.shape[1]
                  or (scales is None) != (out[0].x_scales is None)):
            raise arg_error(func, f"x[{s}]", "the hidden size, top-k and format of x[0]", xv)
        ia64 = ia.astype(np.int64)
        if target == "deepgemm":
            i32 = ia64.astype(np.int32)
            if np.any(i32 >= num_experts):
                t, k = (int(v) for v in np.argwhere(i32 >= num_experts)[0])
                raise arg_error(func, f"topk_idx[{s}]", f"expert ids < num_experts = {num_experts} (negative: masked)",
                                f"{int(ia64[t, k])} at token {t}, slot {k}")
            eff = np.where(i32 < 0, -1, i32).astype(np.int64)
        else:
            eff = np.where((ia64 >= 0) & (ia64 < num_experts), ia64, -1)
        out.append(RankTokens(xv, scales, eff, np.asarray(wa, np.float32)))
    return out


@dataclass
class _DispatchRequest:
    """A validated mega_moe_dispatch call: every source rank's tokens, E, the segment alignment and
    the per destination rank stats arrays (or None)."""

    target: str
    tokens: list[RankTokens]
    num_experts: int
    alignment: int
    stats: list[np.ndarray] | None


def _check_dispatch(profile: Profile, func: str, x: Any, topk_idx: Any, topk_weights: Any, num_experts: Any,
                    expert_alignment: Any, cumulative_local_expert_recv_stats: Any) -> _DispatchRequest:
    e = int_arg(func, "num_experts", num_experts, 1)
    alignment = int_arg(func, "expert_alignment", expert_alignment, 1)
    tokens = _tokens(func, x, topk_idx, topk_weights, e, profile.target)
    R = len(tokens)
    if e % R:
        raise arg_error(func, "num_experts", f"a multiple of the rank count {R}", repr(e))
    e_l = e // R
    stats = None
    if cumulative_local_expert_recv_stats is not None:
        stats = []
        for r, st in enumerate(_seq(func, "cumulative_local_expert_recv_stats", cumulative_local_expert_recv_stats, R)):
            sa = as_array(st, func, f"cumulative_local_expert_recv_stats[{r}]")
            if sa.dtype != np.int32 or sa.size != e_l or not sa.flags.writeable:
                raise arg_error(func, f"cumulative_local_expert_recv_stats[{r}]", f"a writeable int32 ({e_l},) array",
                                sa)
            stats.append(sa.reshape(-1))
    return _DispatchRequest(profile.target, tokens, e, alignment, stats)


def _dispatch(func: str, req: _DispatchRequest) -> list[MegaMoEDispatch]:
    """Every destination rank's rows in dispatch order; one record with each rank's recv_x and src."""
    tokens, e = req.tokens, req.num_experts
    R = len(tokens)
    e_l = e // R
    routes = route(tokens, e)
    fp8 = tokens[0].x_scales is not None
    hdim = tokens[0].x.shape[1]
    x_all = np.concatenate([t.x for t in tokens])
    sc_all = np.concatenate([t.x_scales for t in tokens]) if fp8 else None
    w_all = np.concatenate([t.topk_weights for t in tokens])
    out = []
    extra: dict[str, np.ndarray] = {}
    for r in range(R):
        ends, starts, total = [], [], 0
        for i in range(e_l):
            seg = routes.rows(r * e_l + i)
            start = align(total, req.alignment)
            starts.append(start)
            total = start + (seg.stop - seg.start)
            ends.append(total)
        m = total
        recv_x = np.zeros((m, hdim), x_all.dtype)
        scales = np.zeros((m, hdim // 32), np.float64) if fp8 else None
        wts = np.zeros(m, np.float32)
        src = np.full((m, 3), -1, np.int64)
        for i in range(e_l):
            seg = routes.rows(r * e_l + i)
            rows = slice(starts[i], ends[i])
            glob = routes.token_offsets[routes.src[seg]] + routes.tok[seg]
            recv_x[rows] = x_all[glob]
            if scales is not None and sc_all is not None:
                scales[rows] = sc_all[glob]
            wts[rows] = w_all[glob, routes.slot[seg]]
            src[rows] = np.stack([routes.src[seg], routes.tok[seg], routes.slot[seg]], axis=1)
        recv_sf = None
        if scales is not None:
            b = _scale_bytes(scales)
            b[src[:, 0] < 0] = 0  # padding rows
            recv_sf = _packed_mn_major(b, ascend=req.target == "deepgemm-ascend")
        d = MegaMoEDispatch(recv_x, recv_sf, wts, np.array(ends, np.int32), src,
                            tuple(t.num_tokens for t in tokens), int(tokens[0].topk_idx.shape[1]))
        out.append(d)
        if req.stats is not None:
            counts = np.diff(np.searchsorted(routes.expert, np.arange(r * e_l, (r + 1) * e_l + 1)))
            req.stats[r][...] = (req.stats[r].astype(np.int64) + counts).astype(np.int32)
        extra[f"rank{r}.recv_x"] = recv_x
        extra[f"rank{r}.src"] = src
    record(func, None, extra=extra)
    return out


def _mega_moe_dispatch(profile: Profile, /, x: Any, topk_idx: Any, topk_weights: Any, num_experts: int,
                       expert_alignment: int = 1,
                       cumulative_local_expert_recv_stats: Any = None) -> list[MegaMoEDispatch]:
    """Expert-parallel dispatch of every source rank's tokens (one row per routed (token, slot)).

    x:            per source rank, (float8_e4m3fn (N_s, H), per-32 UE8M0 SF in any form:
                  DeepGEMM's packed int32 (N_s, H / 128), DeepGEMM-Ascend's int16 pairs (N_s, H / 64),
                  float32 powers of two (N_s, H / 32)) or bfloat16 (N_s, H)
    topk_idx:     per source rank, integer (N_s, K); masked slots follow the active target
                  (DeepGEMM: negative after int32 truncation, ids >= num_experts are an error;
                  DeepGEMM-Ascend: any id outside [0, num_experts))
    topk_weights: per source rank, float32 (N_s, K)
    num_experts:  E, a multiple of the rank count R = len(x); rank r owns experts [r E_l, (r + 1) E_l)
    expert_alignment: segment alignment of the psum layout (DeepGEMM's test uses
                  get_theoretical_mk_alignment_for_contiguous_layout(); 1 is compact)
    cumulative_local_expert_recv_stats: None or per destination rank int32 (E_l,), += received routes

    Returns one :class:`MegaMoEDispatch` per destination rank.
    """
    func = "mega_moe_dispatch"
    return _dispatch(func, _check_dispatch(profile, func, x, topk_idx, topk_weights, num_experts, expert_alignment,
                                           cumulative_local_expert_recv_stats))


def _psum_rows(func: str, psum: Any, m: int, groups: int, alignment: int) -> list[tuple[int, int]]:
    """The rows [start_g, end_g) of every group of the dispatch's psum END offsets."""
    arg = "psum_num_recv_tokens_per_expert"
    ends = np.asarray(psum) if isinstance(psum, (list, tuple)) else as_array(psum, func, arg)
    if ends.ndim != 1 or ends.size != groups or ends.dtype.kind not in "iu":
        raise arg_error(func, arg, f"an integer ({groups},) array of END rows", ends)
    return psum_ranges(func, arg, ends.astype(np.int64), alignment, m, extent_name=f"M = {m} (the rows of a)")


@dataclass(kw_only=True)
class _GroupedRequest(Request):
    """A validated mega_moe_grouped_gemm call: ``d`` the (M, N) bfloat16 result (allocated zero),
    ``defined`` its rows inside a group, the operands and every group's rows."""

    a: np.ndarray
    a_scales: np.ndarray | None
    weights: PlainWeights
    segments: list[tuple[int, int]]
    kind: Kind


def _check_grouped(profile: Profile, func: str, a: Any, b: Any, psum_num_recv_tokens_per_expert: Any,
                   expert_alignment: Any) -> _GroupedRequest:
    alignment = int_arg(func, "expert_alignment", expert_alignment, 1)
    if isinstance(a, (tuple, list)):
        av, asf = as_pair(a, func, "a")
        if av.dtype != E4M3 or av.ndim != 2 or asf is None:
            raise arg_error(func, "a", "(float8_e4m3fn (M, K), SF) or bfloat16 (M, K)", av)
        m, k = av.shape
        a_sc: np.ndarray | None = sf_values(asf, m, k, 1, 32, func=func, arg="a[1]")
    else:
        av = as_array(a, func, "a")
        if av.dtype != BF16 or av.ndim != 2:
            raise arg_error(func, "a", "(float8_e4m3fn (M, K), SF) or bfloat16 (M, K)", av)
        m, k = av.shape
        a_sc = None
    if isinstance(b, (tuple, list)):
        bw, bsf = as_pair(b, func, "b")
        bw = packed_fp4(bw)
        if bw.ndim != 3 or bw.dtype not in (I8, E4M3) or a_sc is None:
            raise arg_error(func, "b", "(int8 packed FP4 or float8_e4m3fn (G, N, K'), SF) with FP8 a", bw)
        kb = bw.shape[2] * (2 if bw.dtype == I8 else 1)
        weights = PlainWeights(bw, bsf, kb)
    else:
        bw = as_array(b, func, "b")
        if bw.ndim != 3 or bw.dtype != BF16 or a_sc is not None:
            raise arg_error(func, "b", "bfloat16 (G, N, K) with bfloat16 a", bw)
        kb = bw.shape[2]
        weights = PlainWeights(bw, None, kb)
    if kb != k:
        raise arg_error(func, "b", f"K = {k} (from a)", bw)
    groups, n = int(bw.shape[0]), int(bw.shape[1])
    segs = _psum_rows(func, psum_num_recv_tokens_per_expert, m, groups, alignment)
    defined = np.zeros(m, bool)
    for r0, r1 in segs:
        defined[r0:r1] = True  # (empty for an empty group)
    return _GroupedRequest(func=func, profile=profile, d=np.zeros((m, n), BF16), defined=defined, a=av, a_scales=a_sc,
                           weights=weights, segments=segs, kind=caller_kind(a))


def _grouped_tasks(req: _GroupedRequest) -> list[Task]:
    """d[r] = bf16(sum_k A[r, k] sa[r, k // 32] B_g[n, k] sb_g[n, k // 32]) for the rows r of group g.

    One task per non-empty group; the weights are the core's row-chunked operand (see
    :attr:`deepgemm_ref.executor.Task.transposed`); rows outside every group stay 0.
    """
    tasks = []
    for g, (r0, r1) in enumerate(req.segments):
        if r1 <= r0:
            continue
        sc = None if req.a_scales is None else req.a_scales[r0:r1]
        a = core.Operand(req.a[r0:r1]) if sc is None else core.Operand(req.a[r0:r1], sc, 32)
        tasks.append(Task(a, req.weights.operand(g), core.OutputStage(fm.BF16), (slice(r0, r1),), transposed=True,
                          label=f"expert {g}: rows [{r0}, {r1})"))
    return tasks


def _mega_moe_grouped_gemm(profile: Profile, /, a: Any, b: Any, psum_num_recv_tokens_per_expert: Any,
                           expert_alignment: int = 1) -> np.ndarray:
    """``d[r] = bf16(a[r] @ B[g]^T)`` for the rows r of every group g (psum layout); other rows 0.

    a: (float8_e4m3fn (M, K), per-32 SF in any form (M rows)) or bfloat16 (M, K)
    b: un-transformed grouped weights, as DeepGEMM's baseline passes them: (int8 packed FP4
       (G, N, K / 2) or float8_e4m3fn (G, N, K), per-32 SF (G, N, ...) in any form) or bfloat16 (G, N, K);
       ``inverse_transform_weights_for_mega_moe`` recovers them from the fused kernel's layout
    psum_num_recv_tokens_per_expert: int (G,) END rows; group g starts at align(end_{g-1}, expert_alignment)
    Returns bfloat16 (M, N).  One executor task per non-empty group.
    """
    req = _check_grouped(profile, "mega_moe_grouped_gemm", a, b, psum_num_recv_tokens_per_expert, expert_alignment)
    execute(req, _grouped_tasks(req))
    return from_numpy(req.d, req.kind)


def _avail(func: str, avail_tokens: Any, m: int) -> int:
    if avail_tokens is None:
        return m
    v = as_array(avail_tokens, func, "avail_tokens") if not isinstance(avail_tokens, (int, np.integer)) else \
        np.array([avail_tokens])
    if v.size != 1 or v.dtype.kind not in "iu" or not 0 <= int(v.reshape(-1)[0]) <= m:
        raise arg_error(func, "avail_tokens", f"None or one int in [0, {m}]", v)
    return int(v.reshape(-1)[0])


@dataclass
class _SwigluRequest:
    """A validated swiglu_apply_weight_to_fp8 call: x (M, 2I), the weights or None, the rows
    processed, the clamp, the scale group size and form, and the configuration of the stage."""

    kind: Kind
    x: np.ndarray
    weights: np.ndarray | None
    rows: int
    gran: int
    use_col_major_scales: Any
    round_scale: Any
    ue8m0_scale: Any
    output_bf16: Any
    options: RankOptions
    cfg: PipelineConfig


def _check_swiglu(profile: Profile, func: str, x: Any, topk_weights: Any, avail_tokens: Any, num_per_channels: Any,
                  use_col_major_scales: Any, round_scale: Any, ue8m0_scale: Any, clamp_value: Any, fmt: Any,
                  output_bf16: Any, fast_math: Any, semantics: Any) -> _SwigluRequest:
    kind = caller_kind(x)
    xa = as_array(x, func, "x")
    if fmt != "e4m3":
        raise arg_error(func, "fmt", "'e4m3'", repr(fmt), utility=True)
    if semantics not in ("fused", "baseline"):
        raise arg_error(func, "semantics", "'fused' or 'baseline'", repr(semantics))
    gran = int_arg(func, "num_per_channels", num_per_channels, 1)
    if xa.dtype != BF16 or xa.ndim != 2 or xa.shape[1] % (2 * gran):
        raise arg_error(func, "x", f"a bfloat16 (M, 2I) array with I a multiple of num_per_channels = {gran}", xa)
    if ue8m0_scale and not (round_scale and use_col_major_scales):
        raise arg_error(func, "ue8m0_scale", "round_scale=True and use_col_major_scales=True with UE8M0 scales",
                        repr((round_scale, use_col_major_scales)), utility=True)
    m = xa.shape[0]
    w = None
    if topk_weights is not None:
        w = as_array(topk_weights, func, "topk_weights")
        if w.dtype != np.float32 or w.size != m:
            raise arg_error(func, "topk_weights", f"float32 ({m},)", w)
        w = w.reshape(-1)
    # Note: rows from avail_tokens on are zero in the outputs (TileLang leaves them uninitialised),
    # and UE8M0 scales require round_scale and column-major scales (TileLang writes garbage otherwise).
    rows = _avail(func, avail_tokens, m)
    c = None if clamp_value is None else float(clamp_value)
    cfg = PipelineConfig(profile, "fp8", accumulation=active_accumulation(profile), semantics=semantics)
    return _SwigluRequest(kind, xa, w, rows, gran, use_col_major_scales, round_scale, ue8m0_scale, output_bf16,
                          RankOptions(c, bool(fast_math)), cfg)


def _swiglu(func: str, req: _SwigluRequest) -> tuple[Any, ...]:
    """v = swiglu(gate, up) (* w) on the first ``rows`` rows; y = e4m3(v / sf) per group of ``gran``
    channels; the scales in the requested form; one record (v, y and the scale bytes)."""
    xa, w, rows, gran, cfg = req.x, req.weights, req.rows, req.gran, req.cfg
    m, i = xa.shape[0], xa.shape[1] // 2
    v, q8, sf, st = swiglu_stage(xa[:rows], None if w is None else w[:rows], req.options, cfg, quantize=False)
    y = np.zeros((m, i), E4M3)
    groups = i // gran
    if req.round_scale:
        rule: sw.ScaleRule = ("cuda" if cfg.target == "deepgemm" else "ascend") if cfg.semantics == "fused" \
            else "tilelang"
        codes, sfb = sw.requantize(v, rule, gran)
        y[:rows] = codes.view(E4M3)
    else:
        codes, sff = sw.requantize_float_scale(v, gran)
        y[:rows] = codes.view(E4M3)
    a4 = align(m, 4)
    if req.ue8m0_scale:
        b = np.zeros((m, align(groups, 4)), np.uint8)
        b[:rows, :groups] = sfb
        phys = np.zeros((b.shape[1] // 4, a4), np.int32)
        phys[:, :m] = fm.pack_ue8m0_int32(b).T
        y_sf = phys.T[:m]
    else:
        vals = np.zeros((m, groups), np.float32)
        if req.round_scale:
            vals[:rows] = (sfb.astype(np.uint32) << np.uint32(23)).view(np.float32)
        else:
            vals[:rows] = sff
        if req.use_col_major_scales:
            phys32 = np.zeros((groups, a4), np.float32)
            phys32[:, :m] = vals.T
            y_sf = phys32.T[:m]
        else:
            y_sf = vals
    extra = {"swiglu.output": v, "l2.acts": y}
    if req.round_scale:
        extra["l2.acts_sf"] = sfb
    record(func, None, np.broadcast_to((np.arange(m) < rows)[:, None], (m, i)), stats=st, extra=extra)
    result: tuple[Any, ...] = (from_numpy(y, req.kind), from_numpy(y_sf, req.kind))
    if req.output_bf16:
        yb = np.zeros((m, i), BF16)
        yb[:rows] = q8
        result += (from_numpy(yb, req.kind),)
    return result


def _swiglu_apply_weight_to_fp8(profile: Profile, /, x: Any, topk_weights: Any, avail_tokens: Any,
                                num_per_channels: int, use_col_major_scales: bool, round_scale: bool,
                                ue8m0_scale: bool, clamp_value: float | None = None, fmt: str = "e4m3",
                                num_sms: int | None = None, output_bf16: bool = False, fast_math: bool = True, *,
                                semantics: Literal["fused", "baseline"] = "fused") -> tuple[Any, ...]:
    """SwiGLU with the top-k weight and per-channel-group FP8 quantisation (TileLang's op).

    x:            bfloat16 (M, 2I): gate = x[:, :I], up = x[:, I:] (un-interleaved L1 output)
    topk_weights: float32 (M,) route weights, or None (no weight: shared experts)
    avail_tokens: None (all rows) or the number of leading rows to process (an int, a NumPy integer,
                  a 0-D or one-element integer array or tensor: DeepGEMM's test passes the
                  dispatch's ``psum_num_recv_tokens_per_expert[-1]``); later rows are zero
    num_per_channels: channels per scale group (32 in the mega-MoE pipeline)
    use_col_major_scales, round_scale, ue8m0_scale: the scale output form (see below)
    clamp_value:  None or the activation clamp c (gate <= c, |up| <= c)
    semantics:    ``"fused"`` (default): the active target's fused kernel (bf16 clamp; DeepGEMM no
                  amax floor, byte 0 for amax 0; DeepGEMM-Ascend amax floor 1e-4); ``"baseline"``:
                  TileLang's op (float32 clamp, amax floor 1e-4) - the two differ only there
    fast_math:    the fp32 model's reciprocal-then-multiply in DeepGEMM's fused kernel; no effect
                  in the exact model

    v = swiglu(gate, up) * w (see deepgemm_ref.mega); per group of num_per_channels channels,
    sf = 2^ceil(log2(amax / 448)) (round_scale) or amax / 448, y = e4m3(v / sf).
    Returns (y float8_e4m3fn (M, I), y_sf) or, with output_bf16, (y, y_sf, bfloat16(v)).  y_sf:
    ue8m0_scale: int32 (M, ceil(G / 4)) MN-major packed UE8M0 (strides (1, align(M, 4)));
    otherwise float32 (M, G), column-major (strides (1, align(M, 4))) with use_col_major_scales,
    row-major without.  The public home is :mod:`deepgemm_ref.mega.stages`, which describes the
    op's data flow and how DeepGEMM's baseline calls it.
    """
    # Note: ``semantics`` is this package's keyword (the fused kernels and TileLang's op differ in
    # the amax floor and the clamp precision); the default mirrors the fused kernel.
    # Note: row-major float32 scales (use_col_major_scales=False) come back as (M, G); TileLang's
    # op returns the transpose of its (M, G) buffer cut to M rows there (DeepGEMM never asks for it).
    func = "swiglu_apply_weight_to_fp8"
    return _swiglu(func, _check_swiglu(profile, func, x, topk_weights, avail_tokens, num_per_channels,
                                       use_col_major_scales, round_scale, ue8m0_scale, clamp_value, fmt, output_bf16,
                                       fast_math, semantics))


@dataclass
class _CombineRequest:
    """A validated mega_moe_combine call: every destination rank's L2 rows and dispatch handle, the
    shared-expert outputs per source rank (or None), the accumulation model, and whether the
    target specifies the combine order (DeepGEMM: DeepEP's float32 order)."""

    kind: Kind
    x: list[np.ndarray]
    handles: list[MegaMoEDispatch]
    shared: list[np.ndarray] | None
    hidden: int
    model: Any
    ordered: bool


def _check_combine(profile: Profile, func: str, x: Any, handles: Any, shared_output: Any) -> _CombineRequest:
    hs = _seq(func, "handles", handles)
    xs = _seq(func, "x", x, len(hs))
    kind = caller_kind(*xs)
    if not hs or not all(isinstance(h, MegaMoEDispatch) for h in hs):
        raise arg_error(func, "handles", "the MegaMoEDispatch list returned by mega_moe_dispatch", repr(type(handles)))
    ns = hs[0].num_tokens_per_rank
    R = len(ns)
    shared = None if shared_output is None else _seq(func, "shared_output", shared_output, R)
    hdim = None
    xa_list = []
    for r, (xr, h) in enumerate(zip(xs, hs, strict=True)):
        xa = as_array(xr, func, f"x[{r}]")
        if xa.dtype != BF16 or xa.ndim != 2 or xa.shape[0] != h.src.shape[0] or (hdim is not None and
                                                                                  xa.shape[1] != hdim):
            raise arg_error(func, f"x[{r}]", f"bfloat16 ({h.src.shape[0]}, H) rows in rank {r}'s dispatch order", xa)
        hdim = xa.shape[1]
        xa_list.append(xa)
    assert hdim is not None
    sa_list = None
    if shared is not None:
        sa_list = []
        for src, sh in enumerate(shared):
            sa = as_array(sh, func, f"shared_output[{src}]")
            if sa.dtype != BF16 or sa.shape != (ns[src], hdim):
                raise arg_error(func, f"shared_output[{src}]", f"bfloat16 ({ns[src]}, {hdim})", sa)
            sa_list.append(sa)
    return _CombineRequest(kind, xa_list, list(hs), sa_list, hdim, active_accumulation(profile).model,
                           combine_order_specified(profile.target))


def _combine(func: str, req: _CombineRequest) -> list[Any]:
    """y_s[t] = bf16(sum over valid slots k, in increasing k, of o_{s,t,k} (+ shared_s[t])); one
    record per source rank (acc, S: see :func:`combine_rows`; extra: its combine input, the
    shared output in the last slot).  In the specified order (DeepGEMM) the shared output is
    DeepEP's bias: added first."""
    hs = req.handles
    ns, k = hs[0].num_tokens_per_rank, hs[0].num_topk
    j = k + (1 if req.shared is not None else 0)
    comb = [np.zeros((n, j, req.hidden), BF16) for n in ns]
    for xa, h in zip(req.x, hs, strict=True):
        valid = h.src[:, 0] >= 0
        s, t, sl = h.src[valid, 0], h.src[valid, 1], h.src[valid, 2]
        rows = xa[valid]
        for src in np.unique(s):
            sel = s == src
            comb[int(src)][t[sel], sl[sel]] = rows[sel]
    if req.shared is not None:
        for src, sa in enumerate(req.shared):
            comb[src][:, k] = sa
    out = []
    for src in range(len(ns)):
        terms = comb[src]
        if req.ordered and req.shared is not None:
            # Note: under DeepGEMM's profiles the shared output is DeepEP's bias, added before the
            # slots (F = +0 + bias + slots); DeepGEMM-Ascend adds its shared slot last.
            terms = np.concatenate([terms[:, k:], terms[:, :k]], axis=1)
        y, acc, S = combine_rows(terms, req.model, ordered=req.ordered)
        record(func, Collected(y.shape, False, False, acc=acc, S=S), None, stats={"rank": src},
               extra={"combine.input": comb[src]})
        out.append(from_numpy(y, req.kind))
    return out


def _mega_moe_combine(profile: Profile, /, x: Any, handles: Sequence[MegaMoEDispatch],
                      shared_output: Any = None) -> list[Any]:
    """Combine: ``y_s[t] = bf16(sum over valid slots k, in increasing k, of o_{s,t,k} (+ shared_s[t]))``.

    x:       per destination rank, bfloat16 (M_r, H) L2 outputs in that rank's dispatch order
    handles: the :class:`MegaMoEDispatch` of every destination rank (row -> (source rank, token, slot))
    shared_output: None, or per source rank bfloat16 (N_s, H): DeepGEMM-Ascend's shared experts
             (added after the routed slots), or under DeepGEMM's profiles DeepEP's ``bias``
             (added first, ``F = +0 + bias``, as DeepEP's combine does)
    Returns per source rank bfloat16 (N_s, H).  DeepGEMM's profiles (every accumulation model):
    DeepEP's ``allow_multiple_reduction=False`` combine, ``F = +0; F = f32(F + o_k)`` in increasing
    k, ``y = bf16(F)``, the order DeepGEMM's fused kernel is tested bitwise against;
    DeepGEMM-Ascend: ``exact`` the exact sum rounded once, ``fp32`` the same float32 running sum.
    Each source rank's call records acc and S (:func:`~deepgemm_ref.mega._pipeline.combine_rows`:
    F and (1 + 2^-12) sum |terms| in the specified order, else the exact sum and sum |terms|).
    """
    func = "mega_moe_combine"
    return _combine(func, _check_combine(profile, func, x, handles, shared_output))


mega_moe_dispatch = profiled("mega_moe_dispatch", None, deepgemm=_mega_moe_dispatch, deepgemm_ascend=_mega_moe_dispatch)
mega_moe_grouped_gemm = profiled("mega_moe_grouped_gemm", None, deepgemm=_mega_moe_grouped_gemm,
                                 deepgemm_ascend=_mega_moe_grouped_gemm)
swiglu_apply_weight_to_fp8 = profiled("swiglu_apply_weight_to_fp8", None, deepgemm=_swiglu_apply_weight_to_fp8,
                                      deepgemm_ascend=_swiglu_apply_weight_to_fp8)
mega_moe_combine = profiled("mega_moe_combine", None, deepgemm=_mega_moe_combine, deepgemm_ascend=_mega_moe_combine)
