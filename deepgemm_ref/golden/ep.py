"""Golden cases for DeepEP's dispatch and combine (``ep_dispatch``, ``ep_combine``): every rank in one case.

A case is R ranks of DeepEP's V2 buffers (``ElasticBuffer`` under ``sm100``, DeepEP-Ascend's
``EPBuffer`` under ``ascend950``, expanded layout only).  Rank ``r`` holds ``T_r`` tokens (``T``, or
DeepEP's test's ``max(1, T - r)`` with ``uneven``), ``T_max = T`` for the global index.

Inputs, stored per rank ``r`` (the ``.r`` suffix), as DeepEP's test builds them:

* ``x.r``: bf16 (T_r, H) standard-normal tokens; with ``fp8`` the E4M3 codes of
  ``deepgemm_ref.ep.utils.math.per_token_cast_to_fp8`` and their scales ``x_sf.r`` (float32
  (T_r, ceil(H / 128)); DeepEP-Ascend's int16 view of them, (T_r, 2 ceil(H / 128)); or with
  ``sf = "ue8m0"`` DeepGEMM's packed per-32 UE8M0 int32 words, the Mega MoE baseline's);
* ``topk_idx.r``: int64 (T_r, K), the top-K of uniform random scores (distinct experts), a
  ``masked`` share of the slots -1;
* ``topk_weights.r``: float32 (T_r, K) standard normal (with ``weights``; masked slots keep theirs);
* combine only: ``y.r`` bf16 (T_r, K, H), the row the expert of each slot produced (masked slots
  zero), and ``bias0.r`` / ``bias1.r`` bf16 (T_r, H) (``bias`` of them).

The call is a driver (``run_ep``): every rank constructs its buffer with the module's own class,
dispatches (``cumulative_local_expert_recv_stats`` from zero) and, for ``ep_combine``, builds its
combine input from the handle it got (the expert side: for each received token and local slot
``k`` the row ``y[src][t, k]``, times the received weight ``bf16(float(y) * w)`` with ``weights``;
non-expanded, one row per token, the local slots' rows summed in ascending ``k`` from +0 in
float32 and rounded to bf16 when there are two or more, as DeepEP's test does) and combines it
(the received weights passed back, the biases added).  Under deepgemm_ref the ranks are threads
(``run_emulated``); a module without ``run_emulated`` (a real ``deep_ep``) runs this process's
rank under ``torch.distributed`` (see :func:`run_ep`).

Outputs, stacked over the ranks (leading axis R), each rank's rows followed by fill rows (zero
bytes, -1 for indices and metadata) up to the largest rank's count:

* ``ep_dispatch``: ``recv_x`` (R, rows, H) (bf16 or E4M3), ``recv_sf`` (R, rows, P) with FP8,
  ``recv_topk_idx`` int64 (R, rows, K) non-expanded, ``recv_topk_weights`` float32 (R, rows, K)
  or expanded (R, rows) with ``weights``, ``recv_src_metadata`` int32 (R, N_max, K + 2),
  ``psum_num_recv_tokens_per_rank`` int32 (R, R), ``psum_num_recv_tokens_per_expert``,
  ``num_unaligned_recv_tokens_per_expert``, ``stats`` int32 (R, E_l), ``num_recv_tokens_per_expert``
  int32 (R, E_l) with CPU sync, ``num_tokens`` int32 (R, 2) (the handle's ``num_recv_tokens``,
  ``num_expanded_tokens``); rows = N_r (non-expanded) or M_r (expanded) with CPU sync, DeepEP's
  worst cases without.
* ``ep_combine``: ``combined_x`` bf16 (R, T_max, H) and, with ``weights`` (and a combine that
  takes them), ``combined_topk_weights`` float32 (R, T_max, K); rows past T_r are not checked.

Goldens come from the pure math layer (:mod:`deepgemm_ref.ep.routing`,
:mod:`deepgemm_ref.ep.reduction`), not from a trace of the buffers (:func:`compute_ep`):

* dispatch: a copy, in canonical order (source rank, then token), expanded slots ascending in the
  source index within each expert, padding zero;
* combine: ``golden.combined_x`` is DeepEP's recipe (``reduction.combine_reference``: bitwise
  what the kernels compute), ``golden.acc`` / ``golden.S`` the exact sum with the same bf16
  rounding of every multi-slot partial (``reduction.combine_exact``), ``golden.extra.exact`` that
  sum rounded once, and ``golden.S_hard`` the error scale that also covers a partial whose bf16
  rounding another summation order can flip (docs/numerics.md, "DeepEP's dispatch and combine").

The check (:func:`ep_view`) puts a device's own order into the canonical one first: rows sorted
by the source index of the handle's metadata (column 0; DeepEP-Ascend: column K), expanded rows
sorted by source index within each expert region of the device's own prefix sums (DeepEP's
deterministic epilogue), the metadata's slot columns rewritten to match.  Dispatch outputs are
then compared as bit patterns (padding only with ``zero_padding``, tails without CPU sync and
non-local weights not at all); ``combined_x`` within the checker's bound around the exact sum
(``combine_check = "bound"``) or bit for bit against the recipe (``"bitwise"``, up to the sign
of zero), ``combined_topk_weights`` bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import ep as ep_pkg
from .. import formats as fm
from .. import quant
from ..dtypes import BF16, E4M3, F32, I16, I32
from ..ep.reduction import Recipe
from ..errors import DGArgumentError
from ..exact import align, ceil_div, gamma
from ..interop import from_numpy, to_numpy
from .bundle import BundleError
from .call import DTYPES
from .cases import ArgRef, BuiltCase, CaseSpec, randn_bf16, register_family
from .check import CheckView
from .ranks import current_scope
from .resources import PEAK_FIXED, Estimate, tensor_bytes
from .schema import Key, Only, Params, Rule, Schema

__all__ = ["EPConfig", "EP_DISPATCH_SCHEMA", "EP_COMBINE_SCHEMA", "build_ep", "compute_ep", "ep_goldens", "run_ep",
           "ep_view", "canonical_device", "combine_variant", "flip_allowance", "remap_experts", "OWNER_MAPS"]

I64 = np.dtype(np.int64)
U32 = 2.0**-24
#: Unsigned views the dispatch payloads are compared as (a copy is bitwise: -0 and NaN payloads count).
_BITS: dict[np.dtype, np.dtype] = {BF16: np.dtype(np.uint16), E4M3: np.dtype(np.uint8), F32: np.dtype(np.uint32)}
DISPATCH, COMBINE = "ep_dispatch", "ep_combine"


# ----------------------------------------------------------------------------------------------
# configuration
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class EPConfig:
    """One EP case's settings (the driver's record in the manifest)."""

    family: str
    ranks: int
    experts: int
    topk: int
    hidden: int
    tokens: tuple[int, ...]
    t_max: int
    ascend: bool
    expand: bool
    alignment: int
    zero_padding: bool
    cpu_sync: bool
    fp8: bool
    sf: str
    col_major_sf: bool
    weights: bool
    multiple_reduction: bool
    bias: int
    combine_check: str

    @property
    def combine(self) -> bool:
        """An ``ep_combine`` case (a dispatch, the expert side, then combine)."""
        return self.family == COMBINE

    @property
    def e_l(self) -> int:
        """Experts per rank, E / R."""
        return self.experts // self.ranks

    @property
    def recipe(self) -> Recipe:
        """DeepEP's recipe: ``"slots"`` for an expanded combine without multiple reduction, else ``"local"``."""
        return "slots" if (self.expand and not self.multiple_reduction) else "local"

    @property
    def n_terms(self) -> int:
        """The longest float32 rounding path of a combined element: biases and K terms."""
        return self.bias + self.topk

    @property
    def combine_weights(self) -> bool:
        """Whether combine takes (and returns) top-k weights."""
        return self.weights and (not self.expand or self.multiple_reduction)

    @property
    def sf_packs(self) -> int:
        """Scale-factor columns of ``x_sf``: ceil(H / 128) float32 packs, twice as many int16 (Ascend)."""
        if self.sf == "ue8m0":
            return ceil_div(self.hidden, 32) // 4
        return ceil_div(self.hidden, 128) * (2 if self.ascend else 1)

    @property
    def sf_dtype(self) -> np.dtype:
        """The scale factors' dtype: float32, packed UE8M0 int32, or DeepEP-Ascend's int16 view."""
        if self.ascend:
            return I16
        return I32 if self.sf == "ue8m0" else F32

    def to_driver(self) -> dict[str, Any]:
        """The manifest's driver record (every setting; ``name`` is the family)."""
        return {"name": self.family, "ranks": self.ranks, "experts": self.experts, "topk": self.topk,
                "hidden": self.hidden, "tokens": list(self.tokens), "t_max": self.t_max, "expand": self.expand,
                "alignment": self.alignment, "zero_padding": self.zero_padding, "cpu_sync": self.cpu_sync,
                "fp8": self.fp8, "sf": self.sf, "col_major_sf": self.col_major_sf, "weights": self.weights,
                "multiple_reduction": self.multiple_reduction, "bias": self.bias,
                "combine_check": self.combine_check}

    @staticmethod
    def of_params(kernel: str, p: Params) -> EPConfig:
        """The settings of a validated specification's resolved keys."""
        r, t = p["ranks"], p["tokens"]
        tokens = tuple(max(1, t - i) if p["uneven"] else t for i in range(r))
        return EPConfig(kernel, r, p["experts"], p["topk"], p["hidden"], tokens, t, p.ascend, p["expand"],
                        p["alignment"], bool(p.get("zero_padding", False)), p["cpu_sync"],
                        bool(p.get("fp8", False)), p.get("sf") or "float32", bool(p.get("col_major_sf", False)),
                        p["weights"], bool(p.get("multiple_reduction", True)), int(p.get("bias", 0)),
                        p.get("combine_check") or "bound")

    @staticmethod
    def of_entry(entry: Mapping[str, Any]) -> EPConfig:
        """The settings of a manifest entry (its driver record and profile)."""
        d = entry["driver"]
        return EPConfig(str(d["name"]), int(d["ranks"]), int(d["experts"]), int(d["topk"]), int(d["hidden"]),
                        tuple(int(v) for v in d["tokens"]), int(d["t_max"]), entry["profile"] == "ascend950",
                        bool(d["expand"]), int(d["alignment"]), bool(d["zero_padding"]), bool(d["cpu_sync"]),
                        bool(d["fp8"]), str(d["sf"]), bool(d["col_major_sf"]), bool(d["weights"]),
                        bool(d["multiple_reduction"]), int(d["bias"]), str(d["combine_check"]))


@dataclass(frozen=True)
class RankRows:
    """Rank r's row counts: N (tokens received), M (expanded rows with CPU sync), the rows its
    outputs are allocated with and its metadata rows."""

    n: int
    m: int
    alloc: int
    meta: int


def rank_rows(cfg: EPConfig, counts: np.ndarray, n: int) -> RankRows:
    """Row counts of one rank from its unaligned per-expert counts ``c_e`` and N."""
    a = cfg.alignment
    m = int(((np.asarray(counts, I64) + a - 1) // a * a).sum())
    if cfg.cpu_sync:
        return RankRows(n, m, m if cfg.expand else n, n)
    worst = ep_pkg.routing.worst_case_rows(cfg.ranks, cfg.t_max, cfg.topk, cfg.e_l, a, cfg.expand)
    return RankRows(n, m, worst, cfg.ranks * cfg.t_max)


def _layouts(cfg: EPConfig, idx: Sequence[np.ndarray]) -> list[Any]:
    return ep_pkg.routing.case_layouts([np.asarray(i, I64) for i in idx], cfg.experts, cfg.t_max, cfg.alignment)


# ----------------------------------------------------------------------------------------------
# the schema
# ----------------------------------------------------------------------------------------------

def _fp8(p: Params) -> bool:
    return bool(p.get("fp8"))


def _expand(p: Params) -> bool:
    return bool(p.get("expand", p.ascend))  # a given key is read before the defaults are filled in


def _divisible(p: Params) -> str | None:
    if p["experts"] % p["ranks"]:
        return f"experts must be a multiple of ranks = {p['ranks']}; got {p['experts']}"
    if p["experts"] // p["ranks"] > 256:
        return f"at most 256 experts per rank (DeepEP's layout); got {p['experts'] // p['ranks']}"
    return None


def _topk(p: Params) -> str | None:
    if p["topk"] > p["experts"]:
        return f"topk must be at most experts = {p['experts']}; got {p['topk']}"
    return None


def _hidden(p: Params) -> str | None:
    h = p["hidden"]
    if ceil_div(h, 32) * 4 > h:
        return f"hidden must leave room for its scale factors (ceil(hidden / 32) * 4 <= hidden); got {h}"
    if p.kernel == COMBINE:
        if h % 8:
            return f"combine rows are a multiple of 16 bytes (hidden a multiple of 8); got {h}"
        if not p.ascend and h % 256:
            return f"DeepEP's combine kernels take hidden a multiple of 256; got {h}"
        return None
    step = 16 if p.get("fp8") else 8
    if h % step:
        return f"dispatched rows are a multiple of 16 bytes (hidden a multiple of {step}); got {h}"
    if p.get("fp8") and p.get("sf") == "ue8m0" and h % 128:
        return f"DeepGEMM's packed UE8M0 scales (4 per-32 bytes per int32) need hidden a multiple of 128; got {h}"
    return None


def _keys(kernel: str) -> tuple[Key, ...]:
    dispatch = kernel == DISPATCH
    keys = [
        Key("ranks", "int", "expert-parallel ranks R (threads of one process; one process each with "
            "--executor processes, see 'Ranks in processes')", 2, lo=1, hi=64, shape=True),
        Key("tokens", "int", "tokens per rank T (num_max_tokens_per_rank); with uneven, rank r has max(1, T - r)",
            8, lo=1, hi=1 << 14, shape=True),
        Key("uneven", "bool", "rank r holds max(1, T - r) tokens, as DeepEP's test", True),
        Key("hidden", "int", "the hidden size H", 256, lo=8, hi=1 << 16, shape=True),
        Key("experts", "int", "experts E over all ranks (a multiple of R, at most 256 per rank)", 8, lo=1, hi=2048,
            shape=True),
        Key("topk", "int", "experts per token K (distinct)", 4, lo=1, hi=32, shape=True),
        Key("masked", "float", "fraction of top-k slots set to -1", 0.1, lo=0.0, hi=1.0),
    ]
    if dispatch:
        keys += [
            Key("fp8", "bool", "FP8 dispatch: x as (E4M3 codes, scale factors)", False),
            Key("sf", "str", "the FP8 scale factors: DeepEP's float32 per-128 scales, or DeepGEMM's packed per-32 "
                "UE8M0 int32 words (the Mega MoE baseline's)", "float32", choices=("float32", "ue8m0"),
                profiles=("sm100",), when=_fp8, when_doc="fp8"),
            Key("col_major_sf", "bool", "use_tma_aligned_col_major_sf (strides only; the values are compared)", False,
                when=_fp8, when_doc="fp8"),
        ]
    keys += [
        Key("expand", "bool", "do_expand: one row per (token, local slot), grouped by expert",
            lambda p: p.ascend, "false (true under ascend950)",
            only=(Only((True,), "DeepEP-Ascend's dispatch is expand-only", profiles=("ascend950",)),)),
        Key("alignment", "int", "expert_alignment A: each expert's expanded rows start at a multiple of A", 1,
            lo=1, hi=1024),
        Key("zero_padding", "bool", "do_zero_padding: the expanded padding rows are zero (and checked)", False,
            when=_expand, when_doc="expand"),
        Key("cpu_sync", "bool", "do_cpu_sync: exact row counts (false: DeepEP's worst-case rows, tails unchecked)",
            True),
        Key("weights", "bool", "top-k weights dispatched (and, for combine, applied by the expert side and passed "
            "back)", True),
    ]
    if not dispatch:
        keys += [
            Key("multiple_reduction", "bool", "allow_multiple_reduction: an expanded combine reduces each rank's "
                "slots first (false: every slot row travels alone)", True, when=_expand, when_doc="expand",
                only=(Only((True,), "DeepEP-Ascend requires multiple reduction", profiles=("ascend950",)),)),
            Key("bias", "int", "bias tensors added by combine (0, 1 or 2)", 1, lo=0, hi=2),
            Key("combine_check", "str", "how combined_x is checked: within the bound around the exact sum (any "
                "summation order passes), or bit for bit against DeepEP's recipe", "bound",
                choices=("bound", "bitwise")),
        ]
    return tuple(keys)


_RULES = (Rule("experts is a multiple of ranks, at most 256 per rank", _divisible, ("experts", "ranks")),
          Rule("topk <= experts", _topk, ("topk", "experts")),
          Rule("hidden: rows of a multiple of 16 bytes, ceil(hidden / 32) * 4 <= hidden; a multiple of 256 for "
               "ep_combine under sm100; a multiple of 128 for packed UE8M0 scales", _hidden, ("hidden",)))
_ALIASES = {"num_experts": "experts", "num_ranks": "ranks", "world_size": "ranks", "top_k": "topk",
            "num_topk": "topk", "hidden_size": "hidden", "num_tokens": "tokens", "num_max_tokens_per_rank": "tokens",
            "use_fp8_dispatch": "fp8", "do_expand": "expand", "expert_alignment": "alignment",
            "do_zero_padding": "zero_padding", "do_cpu_sync": "cpu_sync", "topk_weights": "weights",
            "use_tma_aligned_col_major_sf": "col_major_sf", "allow_multiple_reduction": "multiple_reduction",
            "num_bias": "bias", "masked_ratio": "masked"}
_WHY = "DeepEP (ElasticBuffer) under sm100, DeepEP-Ascend (EPBuffer) under ascend950"

EP_DISPATCH_SCHEMA = Schema(
    DISPATCH,
    "DeepEP's dispatch on every rank of one case.  Each rank constructs `ElasticBuffer(group, "
    "num_max_tokens_per_rank=T, hidden=H, num_topk=K, use_fp8_dispatch=fp8)` (DeepEP-Ascend's `EPBuffer` under "
    "ascend950) and calls `dispatch(x or (x, x_sf), topk_idx, topk_weights, cumulative_local_expert_recv_stats, "
    "num_experts=E, expert_alignment=A, do_cpu_sync=cpu_sync, do_expand=expand, do_zero_padding=zero_padding, "
    "use_tma_aligned_col_major_sf=col_major_sf)`.  Outputs, stacked over the ranks: the received tokens, scale "
    "factors, local expert indices, weights, the handle's prefix sums, counts and source metadata, and the receive "
    "statistics; a device's own row order is put into the canonical one (source rank, then token) by its metadata, "
    "then they are compared bit for bit (docs/numerics.md, \"DeepEP's dispatch and combine\").",
    {DISPATCH: ("sm100", "ascend950")}, _keys(DISPATCH), _RULES, why_not={DISPATCH: _WHY}, aliases=_ALIASES)
EP_COMBINE_SCHEMA = Schema(
    COMBINE,
    "DeepEP's combine on every rank of one case.  Each rank constructs its buffer (as for ep_dispatch, with "
    "`allow_multiple_reduction`), dispatches its bf16 tokens, builds its combine input from the handle it got (the "
    "expert side: each local slot's row `y[src][t, k]`, times its received weight with weights; non-expanded, one "
    "row per token, its local slots summed in float32 in ascending k and rounded to bf16) and calls "
    "`combine(x, handle, topk_weights, bias)`.  Outputs: `combined_x` (ranks, T, H) bf16, checked within the bound "
    "around the exact sum with DeepEP's bf16 partial roundings (or bit for bit against DeepEP's recipe), and "
    "`combined_topk_weights` bit for bit.",
    {COMBINE: ("sm100", "ascend950")}, _keys(COMBINE), _RULES, why_not={COMBINE: _WHY}, aliases=_ALIASES)


# ----------------------------------------------------------------------------------------------
# the builder
# ----------------------------------------------------------------------------------------------

def _routing(rng: np.random.Generator, t: int, e: int, k: int, masked: float) -> np.ndarray:
    """Top-K of uniform random scores (distinct experts, uniform draws: the same routing in every
    value mode), a ``masked`` share of the slots -1."""
    scores = rng.random((t, e))
    idx = np.argsort(-scores, axis=1, kind="stable")[:, :k].astype(I64)
    drop = rng.random((t, k)) < masked
    idx[drop] = -1
    return np.ascontiguousarray(idx)


def _cast(x: np.ndarray, cfg: EPConfig) -> tuple[np.ndarray, np.ndarray]:
    if cfg.sf == "ue8m0":
        q, sf = quant.per_token_cast_to_fp8(x, True, 32, True)
        return np.ascontiguousarray(q), np.ascontiguousarray(sf)
    q, sf = ep_pkg.utils.math.per_token_cast_to_fp8(x)
    sf = np.ascontiguousarray(sf, F32)
    return np.ascontiguousarray(q), (sf.view(I16) if cfg.ascend else sf)


def build_ep(spec: CaseSpec, rng: np.random.Generator) -> BuiltCase:
    """An EP case (keys: :data:`EP_DISPATCH_SCHEMA`, :data:`EP_COMBINE_SCHEMA`)."""
    p = spec.resolved
    cfg = EPConfig.of_params(spec.kernel, p)
    inputs: dict[str, np.ndarray] = {}
    for r, t in enumerate(cfg.tokens):
        x = randn_bf16(rng, (t, cfg.hidden))
        if cfg.fp8:
            inputs[f"x.{r}"], inputs[f"x_sf.{r}"] = _cast(x, cfg)
        else:
            inputs[f"x.{r}"] = x
        inputs[f"topk_idx.{r}"] = _routing(rng, t, cfg.experts, cfg.topk, p["masked"])
        if cfg.weights:
            inputs[f"topk_weights.{r}"] = rng.standard_normal((t, cfg.topk), dtype=np.float32)
    if cfg.combine:
        for r, t in enumerate(cfg.tokens):
            y = randn_bf16(rng, (t, cfg.topk, cfg.hidden))
            y[inputs[f"topk_idx.{r}"] < 0] = 0
            inputs[f"y.{r}"] = y
            for b in range(cfg.bias):
                inputs[f"bias{b}.{r}"] = randn_bf16(rng, (t, cfg.hidden))
    outputs = output_descs(cfg, _layouts(cfg, [inputs[f"topk_idx.{r}"] for r in range(cfg.ranks)]))
    if cfg.combine:
        check = {"n": cfg.n_terms, "u_acc": U32, "epilogue": {"out": "bf16", "alpha": None, "c": None,
                                                               "c_mode": "kernel"}, "c_epi": 0}
    else:  # every output is compared bit for bit (no accumulator)
        check = {"n": 1, "epilogue": {"out": "bf16", "alpha": None, "c": None, "c_mode": "kernel"}, "c_epi": 0}
    main = next(iter(outputs))
    return BuiltCase(spec, inputs, spec.kernel, [ArgRef("output", (main,))], {}, outputs, {}, check,
                     driver=cfg.to_driver())


def output_descs(cfg: EPConfig, lays: Sequence[Any] | None) -> dict[str, dict[str, Any]]:
    """The stacked outputs' shapes and dtypes (rows: the largest rank's; ``lays`` None: none)."""
    if lays is None:
        return {}
    r_, k, h, e_l = cfg.ranks, cfg.topk, cfg.hidden, cfg.e_l

    def out(shape: Sequence[int], dtype: str) -> dict[str, Any]:
        return {"init": "zeros", "shape": [int(v) for v in shape], "dtype": dtype}

    if cfg.combine:
        o = {"combined_x": out((r_, cfg.t_max, h), "bfloat16")}
        if cfg.combine_weights:
            o["combined_topk_weights"] = out((r_, cfg.t_max, k), "float32")
        return o
    rows = [rank_rows(cfg, lay.counts, lay.num_recv_tokens) for lay in lays]
    alloc = max([1] + [x.alloc for x in rows])  # at least one (fill) row: no empty axis
    meta = max([1] + [x.meta for x in rows])
    o = {"recv_x": out((r_, alloc, h), "float8_e4m3fn" if cfg.fp8 else "bfloat16")}
    if cfg.fp8:
        o["recv_sf"] = out((r_, alloc, cfg.sf_packs), cfg.sf_dtype.name)
    if not cfg.expand:
        o["recv_topk_idx"] = out((r_, alloc, k), "int64")
    if cfg.weights:
        o["recv_topk_weights"] = out((r_, alloc) if cfg.expand else (r_, alloc, k), "float32")
    o["recv_src_metadata"] = out((r_, meta, k + 2), "int32")
    o["psum_num_recv_tokens_per_rank"] = out((r_, r_), "int32")
    o["psum_num_recv_tokens_per_expert"] = out((r_, e_l), "int32")
    o["num_unaligned_recv_tokens_per_expert"] = out((r_, e_l), "int32")
    if cfg.cpu_sync:
        o["num_recv_tokens_per_expert"] = out((r_, e_l), "int32")
    o["num_tokens"] = out((r_, 2), "int32")
    o["stats"] = out((r_, e_l), "int32")
    return o


def _fill(name: str) -> int:
    """The fill of the stacked rows past a rank's own: -1 for indices and metadata, else zero bytes."""
    return -1 if name in ("recv_topk_idx", "recv_src_metadata") else 0


# ----------------------------------------------------------------------------------------------
# goldens: the pure math layer
# ----------------------------------------------------------------------------------------------

def _per_rank(inputs: Mapping[str, Any], name: str, ranks: int) -> list[np.ndarray]:
    return [np.asarray(inputs[f"{name}.{r}"]) for r in range(ranks)]


#: Wrong owner maps of the "expert mapped to the wrong rank" port bug: expert e -> (owner, local).
OWNER_MAPS: dict[str, Callable[[np.ndarray, int, int], tuple[np.ndarray, np.ndarray]]] = {
    "round_robin": lambda e, r, e_l: (e % r, e // r),
    "next_rank": lambda e, r, e_l: ((e // e_l + 1) % r, e % e_l),
}


def remap_experts(idx: np.ndarray, owner_map: str, ranks: int, experts: int) -> np.ndarray:
    """``topk_idx`` whose expert ids place each expert where the wrong ``owner_map`` puts it
    (``owner * E_l + local``): the routing a port with that map dispatches by (-1 stays)."""
    e_l = experts // ranks
    e = np.asarray(idx, I64)
    owner, local = OWNER_MAPS[owner_map](np.maximum(e, 0), ranks, e_l)
    return np.where(e >= 0, owner * e_l + local, -1).astype(I64)


def ep_goldens(cfg: EPConfig, inputs: Mapping[str, Any], variant: Mapping[str, Any] | None = None,
               only: int | None = None) -> dict[str, np.ndarray]:
    """The golden tensors of a case, or of a port with a known bug (``variant``: see
    :mod:`.diagnose.ep_mutations`): every output stacked over the ranks, and for combine ``acc``,
    ``S``, ``S_hard``, ``defined`` and ``extra.exact``.  ``only``: compute rank ``only``'s rows
    alone (the other ranks' rows keep the fill: zero bytes, -1 for indices and metadata, False
    for ``defined``); each rank's rows depend on no other rank's computation, so the rows are
    those of the whole computation (generation with one process per rank, :mod:`.ranks`)."""
    v = dict(variant or {})
    routing = _per_rank(inputs, "topk_idx", cfg.ranks)
    idx = routing
    if v.get("owner"):
        idx = [remap_experts(i, v["owner"], cfg.ranks, cfg.experts) for i in idx]
    if cfg.combine:
        return _combine_goldens(cfg, inputs, idx, v, only)
    # the case's output shapes (a port's other layout is cut or filled to them, as the driver does)
    descs = output_descs(cfg, _layouts(cfg, routing) if idx is not routing else None)
    return _dispatch_goldens(cfg, inputs, idx, v, descs, only)


def _stack(name: str, per_rank: Sequence[np.ndarray | None], shape: Sequence[int], dtype: np.dtype) -> np.ndarray:
    out = np.full(tuple(shape), _fill(name), dtype)
    for r, a in enumerate(per_rank):
        if a is None:  # a rank not computed here (``only``)
            continue
        n = min(a.shape[0], out.shape[1])
        out[r, :n] = a[:n]
    return out


def _dispatch_goldens(cfg: EPConfig, inputs: Mapping[str, Any], idx: list[np.ndarray],
                      v: Mapping[str, Any], descs: Mapping[str, Mapping[str, Any]],
                      only: int | None = None) -> dict[str, np.ndarray]:
    R, k = cfg.ranks, cfg.topk
    routing = ep_pkg.routing
    lays = _layouts(cfg, idx)
    descs = descs or output_descs(cfg, lays)
    xs = _per_rank(inputs, "x", R)
    sfs = _per_rank(inputs, "x_sf", R) if cfg.fp8 else None
    ws = _per_rank(inputs, "topk_weights", R) if cfg.weights else None
    per: dict[str, list[np.ndarray | None]] = {name: [] for name in descs}
    for r_lay, lay in enumerate(lays):
        if only is not None and r_lay != only:
            for name in per:
                per[name].append(None)
            continue
        rows = rank_rows(cfg, lay.counts, lay.num_recv_tokens)
        n = lay.num_recv_tokens

        def place(a: np.ndarray, lay: Any = lay, rows: RankRows = rows, n: int = n) -> np.ndarray:
            """A rank's received rows placed in its allocated rows (expanded: at the slot rows)."""
            if cfg.expand:
                return routing.expand_rows(a, lay, rows.alloc)
            out = np.zeros((rows.alloc,) + a.shape[1:], a.dtype)
            out[:n] = a
            return out

        per["recv_x"].append(place(routing.gather_rows(xs, lay)))
        if sfs is not None:
            per["recv_sf"].append(_int16_variant(place(_sf_rows(sfs, lay, v.get("sf"))), v.get("int16")))
        if not cfg.expand:
            ids = np.full((rows.alloc, k), -1, I64)
            ids[:n] = lay.local_idx
            per["recv_topk_idx"].append(ids)
        if ws is not None:
            w = routing.gather_rows(ws, lay)
            if cfg.expand:
                wx = np.zeros(rows.alloc, F32)
                ni, ki = np.nonzero(lay.slot_row >= 0)
                wx[lay.slot_row[ni, ki]] = w[ni, ki]
                per["recv_topk_weights"].append(wx)
            else:
                per["recv_topk_weights"].append(place(w))
        per["recv_src_metadata"].append(routing.metadata(lay, cfg.expand, cfg.ascend, rows.meta))
        per["psum_num_recv_tokens_per_rank"].append(lay.psum_rank.astype(I32))
        per["psum_num_recv_tokens_per_expert"].append(lay.psum_expert(cfg.expand).astype(I32))
        per["num_unaligned_recv_tokens_per_expert"].append(lay.counts.astype(I32))
        if cfg.cpu_sync:
            per["num_recv_tokens_per_expert"].append(lay.aligned_counts.astype(I32))
        worst = routing.worst_case_rows(R, cfg.t_max, k, cfg.e_l, cfg.alignment, True)
        per["num_tokens"].append(np.array([n, rows.m] if cfg.cpu_sync else [R * cfg.t_max, worst], I32))
        per["stats"].append(lay.counts.astype(I32))
    golden: dict[str, np.ndarray] = {}
    for name, d in descs.items():
        golden[name] = _stack(name, per[name], d["shape"], np.dtype(DTYPES[d["dtype"]]))
    if v.get("padding") and cfg.expand:
        _padding_variant(cfg, golden, lays, v["padding"], only)
    return golden


def _sf_rows(sfs: list[np.ndarray], lay: Any, form: str | None) -> np.ndarray:
    """The received tokens' scale-factor rows: gathered with their tokens, or as a port that does
    not copy them with their rows does (``form``)."""
    if not form:
        return ep_pkg.routing.gather_rows(sfs, lay)
    parts = []
    for s in range(lay.num_ranks):
        tok = lay.src_token[lay.src_rank == s]
        src = np.asarray(sfs[s])
        if form == "by_position":  # the j-th token received from s takes s's j-th row
            pick = np.minimum(np.arange(tok.size), src.shape[0] - 1)
            parts.append(src[pick])
        elif form == "first_token":  # every token from s takes s's first row
            parts.append(np.repeat(src[:1], tok.size, axis=0))
        elif form == "not_written":
            parts.append(np.zeros((tok.size,) + src.shape[1:], src.dtype))
        else:
            raise DGArgumentError(f"sf variant {form!r}")
    return np.concatenate(parts) if parts else np.asarray(sfs[0])[:0]


def _int16_variant(sf: np.ndarray, form: str | None) -> np.ndarray:
    """DeepEP-Ascend's int16 scale-factor view misread: the two int16 halves of each 4-byte pack
    swapped, or the two bytes of each int16."""
    if not form:
        return sf
    if form == "halves_swapped":
        out = sf.copy()
        out[:, 0::2], out[:, 1::2] = sf[:, 1::2], sf[:, 0::2]
        return out
    if form == "bytes_swapped":
        return sf.byteswap()
    raise DGArgumentError(f"int16 variant {form!r}")


def _padding_variant(cfg: EPConfig, golden: dict[str, np.ndarray], lays: Sequence[Any], form: str,
                     only: int | None = None) -> None:
    """Expanded padding rows left holding stale rows: the row above (each padding row a copy of
    its expert's last slot row), or the next expert's first row."""
    names = [n for n in ("recv_x", "recv_sf", "recv_topk_weights") if n in golden]
    for r, lay in enumerate(lays):
        if only is not None and r != only:
            continue
        starts, counts, aligned = lay.starts, lay.counts, lay.aligned_counts
        m = int(aligned.sum())
        for e in range(cfg.e_l):
            lo, hi = int(starts[e] + counts[e]), int(starts[e] + aligned[e])
            if hi <= lo:
                continue
            for name in names:
                a = golden[name][r]
                if form == "previous_row":
                    a[lo:hi] = a[lo - 1] if lo > int(starts[e]) else 0
                elif form == "next_row":
                    a[lo:hi] = a[hi] if hi < min(m, a.shape[0]) else 0
                else:
                    raise DGArgumentError(f"padding variant {form!r}")


def _y_eff(y: np.ndarray, w: np.ndarray | None, idx: np.ndarray, form: str | None) -> np.ndarray:
    """The rows the owners pass to combine for each (token, slot): ``y``, weighted by the expert
    side, ``bf16(float(y) * w)`` with weights (``form`` "not_applied": unweighted); masked slots 0."""
    out = _weighted(y, w) if (w is not None and form != "not_applied") else np.array(y, copy=True)
    out[np.asarray(idx) < 0] = 0
    return out


def _combine_goldens(cfg: EPConfig, inputs: Mapping[str, Any], idx: list[np.ndarray],
                     v: Mapping[str, Any], only: int | None = None) -> dict[str, np.ndarray]:
    R, T, H, K = cfg.ranks, cfg.t_max, cfg.hidden, cfg.topk
    red = ep_pkg.reduction
    plain = not any(v.get(key) for key in ("order", "rounding", "bias", "weights"))
    x = np.zeros((R, T, H), BF16)
    acc = np.zeros((R, T, H))
    S = np.zeros((R, T, H))
    S_hard = np.zeros((R, T, H))
    exact = np.zeros((R, T, H), BF16)
    defined = np.zeros((R, T, H), bool)
    cw = np.zeros((R, T, K), F32)
    # the exact form of a variant: the same data flow with other rows (weights, biases, no partial
    # rounding); another order or a bf16 bias addition has none (compared bit for bit)
    twice = v.get("weights") == "applied_twice"
    have_exact = v.get("order") is None and v.get("bias") != "bf16" and not (twice and not cfg.expand)
    g_n = gamma(cfg.n_terms, U32)
    for s, t in enumerate(cfg.tokens):
        if only is not None and s != only:
            continue
        w = np.asarray(inputs[f"topk_weights.{s}"]) if cfg.weights else None
        y = _y_eff(np.asarray(inputs[f"y.{s}"]), w, idx[s], v.get("weights"))
        biases = [np.asarray(inputs[f"bias{b}.{s}"]) for b in range(cfg.bias)]
        bias_arg = None if not biases else (biases[0] if len(biases) == 1 else (biases[0], biases[1]))
        if plain:
            x[s, :t] = red.combine_reference(y, idx[s], cfg.experts, R, bias_arg, cfg.recipe)
        else:
            x[s, :t] = combine_variant(y, idx[s], cfg.experts, R, biases, cfg.recipe, v, w, cfg.expand)
        if have_exact:
            ey: np.ndarray = y
            eb: Any = bias_arg
            if twice and w is not None:
                ey = _weighted(y, w)
            if v.get("bias") == "twice" and biases:
                doubled = [(b.astype(F32) * 2).astype(BF16) for b in biases]
                eb = doubled[0] if len(doubled) == 1 else (doubled[0], doubled[1])
            recipe: Recipe = "slots" if v.get("rounding") == "missing" else cfg.recipe
            ex = red.combine_exact(ey, idx[s], cfg.experts, R, eb, recipe)
            exact[s, :t], acc[s, :t], S[s, :t] = ex.y, ex.acc, ex.S
            S_hard[s, :t] = ex.S + flip_allowance(ey, idx[s], cfg.experts, R, recipe) * ((1 + 2.0**-20) / g_n)
        defined[s, :t] = True
        if cfg.combine_weights and w is not None and v.get("weights") != "not_applied":
            cw[s, :t] = red.combined_weights(w, idx[s])
    golden: dict[str, np.ndarray] = {"combined_x": x}
    if cfg.combine_weights:
        golden["combined_topk_weights"] = cw
    if have_exact:
        golden.update({"acc": acc, "S": S, "S_hard": S_hard, "extra.exact": exact})
    golden["defined"] = defined
    return golden


def _weighted(y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Every slot row times its top-k weight: ``bf16(float(row) * w)``."""
    return (np.asarray(y).astype(F32) * np.asarray(w, F32)[:, :, None]).astype(BF16)


def flip_allowance(y: np.ndarray, topk_idx: np.ndarray, num_experts: int, num_ranks: int, recipe: str) -> np.ndarray:
    """float64 (T, H): for every multi-slot partial of the recipe (an owner rank's slots summed in
    float32 and rounded to bf16), how far its bf16 value can move when its slots are summed in
    another float32 order: ``|bf16(s + d) - bf16(s - d)|`` with ``s`` the exact sum of its slots
    and ``d = gamma_{m-1}(2^-24) S_p`` (plus the float64 error of ``s``), summed over the partials
    of each token.  Zero unless a bf16 rounding boundary lies within ``d`` of ``s``."""
    y = np.asarray(y)
    t_count, k_count, hdim = y.shape
    out = np.zeros((t_count, hdim))
    if recipe == "slots":
        return out
    idx = np.asarray(topk_idx, I64)
    owner = np.where(idx >= 0, idx // (num_experts // num_ranks), -1)
    vals = y.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        for q in np.unique(owner[owner >= 0]):
            member = owner == q
            m = member.sum(axis=1)
            tok = np.flatnonzero(m >= 2)
            if tok.size == 0:
                continue
            sel = np.where(member[tok][:, :, None], vals[tok], 0.0)
            s = sel.sum(axis=1)
            sp = np.abs(sel).sum(axis=1)
            mm = m[tok][:, None].astype(np.float64)
            d = ((mm - 1) * U32 / (1 - (mm - 1) * U32) + mm * 2.0**-52) * sp
            lo = fm.round_f64(s - d, fm.BF16).astype(np.float64)  # correctly rounded bf16 values
            hi = fm.round_f64(s + d, fm.BF16).astype(np.float64)
            gap = np.abs(hi - lo)
            out[tok] += np.where(np.isfinite(gap), gap, 0.0)
    return out


def combine_variant(y: np.ndarray, topk_idx: np.ndarray, num_experts: int, num_ranks: int,
                    biases: Sequence[np.ndarray], recipe: str, variant: Mapping[str, Any],
                    weights: np.ndarray | None = None, expand: bool = False) -> np.ndarray:
    """One source rank's combined rows as a port with a known bug computes them (``variant``):

    * ``order``: ``"rank"`` (owner partials in ascending rank instead of master slot),
      ``"reverse"`` (descending master slot / slot), ``"bias_last"`` (the biases after the terms);
    * ``rounding``: ``"missing"`` (a multi-slot partial added in float32, not rounded to bf16);
    * ``bias``: ``"twice"`` (added twice), ``"bf16"`` (added to the bf16 result, each addition
      rounded to bf16);
    * ``weights``: ``"applied_twice"`` (the combine multiplies the rows it is given by their top-k
      weight once more: expanded, every slot row before its owner reduces it; non-expanded, each
      owner's row by the weight of its master slot); ``"not_applied"`` is a change of ``y``.

    Without a variant this is DeepEP's recipe (``reduction.combine_reference``).  y: bf16
    (T, K, H) the rows passed per slot; weights: float32 (T, K); returns bf16 (T, H).
    """
    y = np.asarray(y)
    idx = np.asarray(topk_idx, I64)
    t_count, k_count, hdim = y.shape
    e_l = num_experts // num_ranks
    owner = np.where(idx >= 0, idx // e_l, -1)
    order = variant.get("order")
    twice = variant.get("weights") == "applied_twice" and weights is not None
    w = None if weights is None else np.asarray(weights, F32)
    if twice and expand and w is not None:
        y = _weighted(y, w)
    rows = np.arange(t_count)
    if recipe == "slots":
        ks = list(range(k_count))[::-1] if order == "reverse" else list(range(k_count))
        terms = np.stack([y[:, k].astype(F32) for k in ks], axis=1) if ks else np.zeros((t_count, 0, hdim), F32)
        have = np.stack([idx[:, k] >= 0 for k in ks], axis=1) if ks else np.zeros((t_count, 0), bool)
    else:
        parts = np.zeros((t_count, num_ranks, hdim), F32)
        has = np.zeros((t_count, num_ranks), bool)
        master = np.full((t_count, num_ranks), -1, I64)
        for q in range(num_ranks):
            member = owner == q
            cnt = member.sum(axis=1)
            if not cnt.any():
                continue
            acc = np.zeros((t_count, hdim), F32)
            for k in range(k_count):
                sel = member[:, k]
                acc[sel] += y[sel, k].astype(F32)
                master[sel, q] = k
            first = np.argmax(member, axis=1)
            p = acc if variant.get("rounding") == "missing" else acc.astype(BF16).astype(F32)
            p = np.where((cnt == 1)[:, None], y[rows, first].astype(F32), p)
            if twice and not expand and w is not None:
                mw = w[rows, np.maximum(master[:, q], 0)]
                p = (p.astype(BF16).astype(F32) * mw[:, None]).astype(BF16).astype(F32)
            parts[:, q] = p
            has[:, q] = cnt > 0
        if order == "rank":
            pos = np.argsort(np.where(has, np.arange(num_ranks)[None, :], num_ranks + 1), axis=1, kind="stable")
        elif order == "reverse":
            pos = np.argsort(-np.where(has, master, -1), axis=1, kind="stable")
        else:
            pos = np.argsort(np.where(has, master, k_count + 1), axis=1, kind="stable")
        terms = np.take_along_axis(parts, pos[:, :, None], axis=1)
        have = np.take_along_axis(has, pos, axis=1)
    bias_terms = [np.asarray(b).astype(F32) for b in biases]
    if variant.get("bias") == "twice":
        bias_terms = bias_terms + bias_terms
    in_bf16 = variant.get("bias") == "bf16"
    acc = np.zeros((t_count, hdim), F32)
    with np.errstate(over="ignore", invalid="ignore"):
        if not in_bf16 and order != "bias_last":
            for b in bias_terms:
                acc += b
        for j in range(terms.shape[1]):
            acc += np.where(have[:, j, None], terms[:, j], np.float32(0))
        if not in_bf16 and order == "bias_last":
            for b in bias_terms:
                acc += b
        out = acc.astype(BF16)
        if in_bf16:
            for b in bias_terms:
                out = (out.astype(F32) + b).astype(BF16)
    return out


def compute_ep(entry: Mapping[str, Any], inputs: Mapping[str, Any],
               outputs: Mapping[str, Mapping[str, Any]]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The family's golden hook: :func:`ep_goldens` of the case, and a few statistics."""
    cfg = EPConfig.of_entry(entry)
    return _with_stats(cfg, ep_goldens(cfg, inputs), outputs)


def compute_ep_rank(entry: Mapping[str, Any], inputs: Mapping[str, Any], outputs: Mapping[str, Mapping[str, Any]],
                    rank: int) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Rank ``rank``'s part of the goldens (one process per rank, :mod:`.ranks`): row ``rank`` of
    every golden tensor (all of them are stacked over the ranks)."""
    cfg = EPConfig.of_entry(entry)
    if not 0 <= rank < cfg.ranks:
        raise DGArgumentError(f"EP golden: rank {rank} of a case of {cfg.ranks} ranks")
    golden = ep_goldens(cfg, inputs, only=rank)
    return {name: np.ascontiguousarray(a[rank]) for name, a in golden.items()}, {}


def merge_ep(entry: Mapping[str, Any], parts: list[dict[str, np.ndarray]], infos: list[dict[str, Any]],
             inputs: Mapping[str, Any], outputs: Mapping[str, Mapping[str, Any]]
             ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Every rank's :func:`compute_ep_rank` rows (rank order) stacked into the case's goldens, and
    the statistics of the stacked tensors: what :func:`compute_ep` returns."""
    cfg = EPConfig.of_entry(entry)
    if len(parts) != cfg.ranks or any(set(p) != set(parts[0]) for p in parts):
        raise DGArgumentError(f"EP golden: {len(parts)} rank parts (of names {sorted(parts[0]) if parts else []}) "
                              f"for a case of {cfg.ranks} ranks")
    golden = {name: np.ascontiguousarray(np.stack([p[name] for p in parts])) for name in parts[0]}
    return _with_stats(cfg, golden, outputs)


def _with_stats(cfg: EPConfig, golden: dict[str, np.ndarray], outputs: Mapping[str, Mapping[str, Any]]
                ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    stats: dict[str, Any] = {"ranks": cfg.ranks, "tokens": list(cfg.tokens)}
    if cfg.combine:
        stats["recipe"] = cfg.recipe
        stats["recipe_equals_exact"] = float(np.mean(golden["combined_x"][golden["defined"]].view(np.uint16)
                                                     == golden["extra.exact"][golden["defined"]].view(np.uint16)))
    else:
        stats["received"] = [int(v) for v in golden["psum_num_recv_tokens_per_rank"][:, -1]]
    for name, o in outputs.items():
        if list(golden[name].shape) != list(o["shape"]):  # pragma: no cover - a builder bug
            raise DGArgumentError(f"EP golden {name!r}: shape {golden[name].shape}, the case says {o['shape']}")
    return golden, stats


# ----------------------------------------------------------------------------------------------
# the driver
# ----------------------------------------------------------------------------------------------

def _ep_module(module: Any) -> Any:
    """The module with DeepEP's names: ``module`` itself (``deep_ep``, a stand-in) or its ``ep``
    (``deepgemm_ref``, a stand-in of it)."""
    if getattr(module, "ElasticBuffer", None) is not None or getattr(module, "EPBuffer", None) is not None:
        return module
    ep = getattr(module, "ep", None)
    if ep is not None and (getattr(ep, "ElasticBuffer", None) is not None or getattr(ep, "EPBuffer", None) is not None):
        return ep
    raise BundleError(f"module {getattr(module, '__name__', module)!r} has neither DeepEP's buffers (ElasticBuffer, "
                      "EPBuffer) nor an 'ep' module with them")


def _host(x: Any) -> Any:
    if x is None:
        return None
    if hasattr(x, "detach") and hasattr(x, "cpu"):
        x = x.detach().cpu()
    return np.asarray(to_numpy(x, "EP driver", "output"))


def _like(a: np.ndarray, ref: Any) -> Any:
    """``a`` in the kind (and on the device) of ``ref``."""
    if hasattr(ref, "device") and hasattr(ref, "detach"):
        t = from_numpy(np.ascontiguousarray(a), "torch")
        return t.to(ref.device)
    return np.ascontiguousarray(a)


def _store(out: Any, r: int, a: np.ndarray, fill: int) -> None:
    """``out[r] = a``, truncated or filled to ``out``'s rows, for NumPy arrays and torch tensors."""
    dtype = _numpy_dtype(out)
    full = np.full(tuple(out.shape[1:]), fill, dtype)
    if a.dtype != dtype:
        if a.dtype.kind not in "iu" or dtype.kind not in "iu":
            raise BundleError(f"EP driver: the module returned {a.dtype} where the case holds {dtype}")
        a = a.astype(dtype)
    n = min(a.shape[0], full.shape[0]) if full.ndim else 0
    if full.ndim and a.shape[1:] != full.shape[1:]:
            raise BundleError(f"EP driver: the module returned rows of shape {a.shape[1:]} where the case holds "
                          f"{full.shape[1:]}")
    if full.ndim:
        full[:n] = a[:n]
    if hasattr(out, "copy_"):
        out[r].copy_(from_numpy(np.ascontiguousarray(full), "torch").to(out.device))
    else:
        out[r] = full


def _buffer_class(ep: Any, ascend: bool) -> Any:
    """DeepEP-Ascend's ``EPBuffer`` (ascend950), else ``ElasticBuffer`` (or the newer ``EPBuffer``)."""
    if ascend:
        cls = getattr(ep, "EPBuffer", None)
    else:
        cls = getattr(ep, "ElasticBuffer", None) or getattr(ep, "EPBuffer", None)
    if cls is None:
        want = "EPBuffer" if ascend else "ElasticBuffer"
        raise BundleError(f"module {getattr(ep, '__name__', ep)!r} has no {want}")
    return cls


def _handle_psum_rank(handle: Any) -> Any:
    p = getattr(handle, "psum_num_recv_tokens_per_scaleup_rank", None)
    return p if p is not None else handle.psum_num_recv_tokens_per_rank


def run_ep(module: Any, entry: dict[str, Any], tensors: dict[str, Any], outputs: dict[str, Any]) -> None:
    """Every rank's buffer, dispatch (and combine) with ``module``'s DeepEP classes; the results
    stacked into ``outputs``.  Within :func:`.ranks.rank_scope` (one process per rank: replay under
    torchrun) this process's rank alone runs, on the scope's group, and writes its row of every
    output.  Otherwise, under deepgemm_ref (a module with ``run_emulated``) the R ranks are
    threads of this process; a real ``deep_ep`` runs this process's rank under torch.distributed,
    initialised with R processes (every process replays the bundle; the outputs are all-gathered,
    so each holds every rank's), or with none for a one-rank case (a one-process group is then made
    for it); other cases are refused naming the case."""
    cfg = EPConfig.of_entry(entry)
    ep = _ep_module(module)
    cls = _buffer_class(ep, cfg.ascend)
    y_np = [_host(tensors[f"y.{r}"]) for r in range(cfg.ranks)] if cfg.combine else []

    def rank_fn(group: Any, r: int) -> dict[str, np.ndarray | None]:
        # NumPy's error state is per thread: the emulator's inf / NaN are results here too
        with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
            return _run_rank(cfg, cls, group, r, tensors, y_np)

    scope = current_scope()
    if scope is not None:  # one process per rank: this process's rank alone, on its group
        if scope.size != cfg.ranks:
            raise BundleError(f"case {entry.get('id')!r}: {cfg.ranks} ranks; this process is rank {scope.rank} of "
                              f"{scope.size}")
        _write(outputs, scope.rank, rank_fn(scope.group, scope.rank))
        return
    run = getattr(ep, "run_emulated", None)
    if run is not None:
        results = run(lambda g: rank_fn(g, g.rank()), cfg.ranks)
        for r, res in enumerate(results):
            _write(outputs, r, res)
        return
    _run_distributed(cfg, entry, rank_fn, outputs)


def _run_rank(cfg: EPConfig, cls: Any, group: Any, r: int, tensors: Mapping[str, Any],
              y_np: list[np.ndarray]) -> dict[str, np.ndarray | None]:
    """One rank: its buffer, its dispatch and (combine) its expert side and combine; host results."""
    mr = cfg.multiple_reduction if cfg.combine else True
    buf = cls(group, num_max_tokens_per_rank=cfg.t_max, hidden=cfg.hidden, num_topk=cfg.topk,
              use_fp8_dispatch=cfg.fp8, allow_multiple_reduction=mr)
    x = tensors[f"x.{r}"]
    if cfg.fp8:
        x = (x, tensors[f"x_sf.{r}"])
    ref = tensors[f"topk_idx.{r}"]
    stats = _like(np.zeros(cfg.e_l, I32), ref)
    kwargs: dict[str, Any] = {"num_experts": cfg.experts, "expert_alignment": cfg.alignment,
                              "do_cpu_sync": cfg.cpu_sync, "do_expand": cfg.expand}
    if cfg.expand:
        kwargs["do_zero_padding"] = cfg.zero_padding
    if cfg.fp8:
        kwargs["use_tma_aligned_col_major_sf"] = cfg.col_major_sf
    w_in = tensors[f"topk_weights.{r}"] if cfg.weights else None
    recv_x, recv_idx, recv_w, handle, _ = buf.dispatch(x, ref, w_in, stats, **kwargs)
    res: dict[str, np.ndarray | None] = {}
    meta = _host(handle.recv_src_metadata)
    psum = _host(_handle_psum_rank(handle))
    if not cfg.combine:
        if cfg.fp8:
            res["recv_x"], res["recv_sf"] = _host(recv_x[0]), _host(recv_x[1])
        else:
            res["recv_x"] = _host(recv_x)
        res["recv_topk_idx"] = _host(recv_idx)
        res["recv_topk_weights"] = _host(recv_w)
        res["recv_src_metadata"] = meta
        res["psum_num_recv_tokens_per_rank"] = psum
        res["psum_num_recv_tokens_per_expert"] = _host(handle.psum_num_recv_tokens_per_expert)
        res["num_unaligned_recv_tokens_per_expert"] = _host(handle.num_unaligned_recv_tokens_per_expert)
        res["num_recv_tokens_per_expert"] = np.asarray([int(v) for v in handle.num_recv_tokens_per_expert_list], I32)
        res["num_tokens"] = np.asarray([int(handle.num_recv_tokens), int(handle.num_expanded_tokens)], I32)
        res["stats"] = _host(stats)
        return res
    rx = recv_x[0] if isinstance(recv_x, (tuple, list)) else recv_x
    rows = int(rx.shape[0]) if cfg.expand else int(meta.shape[0])
    xin = expert_side(cfg, meta, psum, None if recv_idx is None else _host(recv_idx),
                      None if recv_w is None else _host(recv_w), y_np, rows)
    biases = [tensors[f"bias{b}.{r}"] for b in range(cfg.bias)]
    bias = None if not biases else (biases[0] if len(biases) == 1 else (biases[0], biases[1]))
    cw_in = recv_w if cfg.combine_weights else None
    combined, combined_w, _ = buf.combine(_like(xin, ref), handle, cw_in, bias)
    res["combined_x"] = _host(combined)
    res["combined_topk_weights"] = None if combined_w is None else _host(combined_w)
    return res


def expert_side(cfg: EPConfig, meta: np.ndarray, psum_rank: np.ndarray, recv_idx: np.ndarray | None,
                recv_w: np.ndarray | None, y: Sequence[np.ndarray], rows: int) -> np.ndarray:
    """A rank's combine input, bf16 (rows, H), from what its dispatch returned (in the device's
    own order): the handle's metadata (source index, expanded slots), ``recv_topk_idx`` (the local
    slots, non-expanded), the received weights, and every source's expert outputs ``y`` (T_s, K, H).
    Expanded: the row of each local slot at its slot row; non-expanded: one row per received
    token, its local slots' rows summed in ascending k from +0 in float32 and rounded to bf16
    when there are two or more (``reduction.local_reduce``, DeepEP's test's ``ordered_accumulate``).
    With weights each slot's row is first ``bf16(float(y) * w)``, ``w`` its received weight."""
    k, t_max, h = cfg.topk, cfg.t_max, cfg.hidden
    meta = np.asarray(meta, I64)
    last = int(np.asarray(psum_rank).reshape(-1)[-1]) if np.size(psum_rank) else 0
    n = max(0, min(last, meta.shape[0]))
    src_col, _, slots = ep_pkg.routing.metadata_columns(k, cfg.ascend)
    src = meta[:n, src_col]
    s_of = np.clip(src // t_max, 0, cfg.ranks - 1)
    t_of = src % t_max
    ok = (src >= 0) & (src < cfg.ranks * t_max)
    ok &= np.array([t_of[i] < y[s_of[i]].shape[0] for i in range(n)], bool) if n else np.zeros(0, bool)
    w = None if (recv_w is None or not cfg.weights) else np.asarray(recv_w, F32)
    x = np.zeros((rows, h), BF16)
    if cfg.expand:
        sl = meta[:n, slots]
        ni, ki = np.nonzero((sl >= 0) & (sl < rows) & ok[:, None])
        if ni.size:
            vals = np.stack([y[int(s_of[i])][int(t_of[i]), kk] for i, kk in zip(ni.tolist(), ki.tolist(),
                                                                                 strict=True)])
            if w is not None:
                vals = (vals.astype(F32) * w[sl[ni, ki]][:, None]).astype(BF16)
            x[sl[ni, ki]] = vals
        return x
    local_all = np.zeros((n, k), bool) if recv_idx is None else np.asarray(recv_idx)[:n] >= 0
    for i in np.flatnonzero(ok).tolist():
        if i >= rows:
            continue
        local = np.flatnonzero(local_all[i])
        if local.size == 0:
            continue
        rws = y[int(s_of[i])][int(t_of[i]), local]
        if w is not None:
            rws = (rws.astype(F32) * w[i, local][:, None]).astype(BF16)
        x[i] = ep_pkg.reduction.local_reduce(rws, np.arange(local.size)[None, :])[0]
    return x


def _write(outputs: Mapping[str, Any], r: int, res: Mapping[str, np.ndarray | None]) -> None:
    for name, out in outputs.items():
        a = res.get(name)
        if a is None:
            a = np.zeros((0,) + tuple(out.shape[2:]), _numpy_dtype(out))
        _store(out, r, np.asarray(a), _fill(name))


def _numpy_dtype(out: Any) -> np.dtype:
    if isinstance(out, np.ndarray):
        return out.dtype
    return np.asarray(_host(out.reshape(-1)[:0])).dtype


def _run_distributed(cfg: EPConfig, entry: Mapping[str, Any], rank_fn: Callable[[Any, int], Any],
                     outputs: Mapping[str, Any]) -> None:
    """This process's rank of a real DeepEP under torch.distributed (see :func:`run_ep`)."""
    case = entry.get("id")
    why = (f"case {case!r}: a real DeepEP module replays an EP case of {cfg.ranks} rank(s) only under "
           f"torch.distributed initialised with {cfg.ranks} processes (torchrun --nproc-per-node {cfg.ranks} "
           "deepgemm-ref replay ...; a one-rank case needs none); replay it with --module deepgemm_ref otherwise")
    try:
        import torch
        import torch.distributed as dist
    except ImportError as e:
        raise BundleError(why + " (torch.distributed is not importable)") from e
    made = False
    if not (dist.is_available() and dist.is_initialized()):
        if cfg.ranks != 1 or not dist.is_available():
            raise BundleError(why)
        ref = next(iter(outputs.values()))
        device = getattr(ref, "device", None)
        kind = getattr(device, "type", "cpu")
        backend = {"cuda": "nccl", "npu": "hccl"}.get(kind, "gloo")
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", world_size=1, rank=0)
        made = True
    try:
        world = dist.get_world_size()
        if world != cfg.ranks:
            raise BundleError(why + f" (torch.distributed has {world})")
        me = dist.get_rank()
        group = dist.new_group(list(range(world)))
        res = rank_fn(group, me)
        _write(outputs, me, res)
        for out in outputs.values():
            mine = out[me].contiguous().view(-1).view(torch.uint8)
            parts = [torch.empty_like(mine) for _ in range(world)]
            dist.all_gather(parts, mine, group=group)
            for q, part in enumerate(parts):
                if q != me:
                    out[q].view(-1).view(torch.uint8).copy_(part)
    finally:
        if made:
            dist.destroy_process_group()


# ----------------------------------------------------------------------------------------------
# the check: a device's own order, defined masks
# ----------------------------------------------------------------------------------------------

def _bits(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    u = _BITS.get(a.dtype)
    return a.view(u) if u is not None else a


def canonical_device(cfg: EPConfig, device: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A device's dispatch outputs in canonical order, per rank by its own handle: the first N
    rows (N the last prefix sum over ranks) sorted by the metadata's source index; expanded, the
    metadata rows sorted the same way and every expert region ``[S_e, S_e + c_e)`` (from the
    device's expert prefix sums) sorted by the source index of the slot each row holds (rows no
    slot names last), the metadata's slot columns rewritten to the new rows (DeepEP's
    deterministic epilogue).  Rows past the valid ones stay where they are."""
    out = {name: np.array(a, copy=True) for name, a in device.items()}
    meta_all = out.get("recv_src_metadata")
    psum_all = out.get("psum_num_recv_tokens_per_rank")
    if meta_all is None or psum_all is None:
        return out
    k = cfg.topk
    src_col, _, slots = ep_pkg.routing.metadata_columns(k, cfg.ascend)
    for r in range(cfg.ranks):
        meta = meta_all[r]
        n = int(np.clip(psum_all[r][-1] if psum_all.shape[1] else 0, 0, meta.shape[0]))
        key = meta[:n, src_col].astype(I64)
        order = np.argsort(key, kind="stable")
        meta[:n] = meta[:n][order]
        if not cfg.expand:
            for name in ("recv_x", "recv_sf", "recv_topk_idx", "recv_topk_weights"):
                if name in out and out[name].shape[1] >= n:
                    out[name][r, :n] = out[name][r, :n][order]
            continue
        psum_e = out.get("psum_num_recv_tokens_per_expert")
        rows = out["recv_x"].shape[1] if "recv_x" in out else 0
        if psum_e is None or rows == 0:
            continue
        perm = np.arange(rows)
        sl = meta[:n, slots].astype(I64)
        valid = (sl >= 0) & (sl < rows)
        row_key = np.full(rows, np.iinfo(np.int64).max, I64)
        ni, ki = np.nonzero(valid)
        if n:
            np.minimum.at(row_key, sl[ni, ki], key[order][ni])  # a row two slots name: the smaller key
        start = 0
        for e in range(psum_e.shape[1]):
            end = int(np.clip(psum_e[r][e], start, rows))
            if end > start:
                local = np.argsort(row_key[start:end], kind="stable")
                perm[start:end] = start + local
            start = int(min(align(end, cfg.alignment), rows))
        new_pos = np.empty(rows, I64)
        new_pos[perm] = np.arange(rows)
        for name in ("recv_x", "recv_sf", "recv_topk_weights"):
            if name in out:
                out[name][r] = out[name][r][perm]
        fixed = sl.copy()
        fixed[valid] = new_pos[sl[valid]]
        meta[:n, slots] = fixed.astype(meta.dtype)
    return out


def _row_masks(cfg: EPConfig, golden: Mapping[str, np.ndarray], rows: int, meta_rows: int
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(payload rows checked (R, rows), metadata / index rows checked (R, meta_rows), local-slot
    rows of the non-expanded weights (R, rows, K)) from the golden layout."""
    R = cfg.ranks
    payload = np.ones((R, rows), bool)
    meta = np.ones((R, meta_rows), bool)
    counts = golden["num_unaligned_recv_tokens_per_expert"].astype(I64)
    n_all = golden["psum_num_recv_tokens_per_rank"][:, -1].astype(I64)
    for r in range(R):
        lay = rank_rows(cfg, counts[r], int(n_all[r]))
        if not cfg.cpu_sync:
            meta[r, lay.n:lay.meta] = False
            if not cfg.expand:
                payload[r, lay.n:lay.alloc] = False
        if cfg.expand:
            a = cfg.alignment
            aligned = (counts[r] + a - 1) // a * a
            starts = np.concatenate([[0], np.cumsum(aligned)[:-1]])
            if not cfg.zero_padding:
                for e in range(cfg.e_l):
                    payload[r, starts[e] + counts[r][e]:starts[e] + aligned[e]] = False
            payload[r, lay.m:lay.alloc] = False  # the tail without CPU sync
    return payload, meta, counts


def ep_view(entry: Mapping[str, Any], golden: Mapping[str, np.ndarray],
            device: Mapping[str, Any] | None = None) -> CheckView:
    """The family's check view (see the module docstring): the device's outputs in canonical
    order as bit patterns (dispatch), each output's golden tensors and defined mask."""
    cfg = EPConfig.of_entry(entry)
    outs = list(entry["outputs"])
    dev = {name: np.asarray(device[name]) for name in outs if device is not None and name in device}
    checks = {name: dict(entry.get("check") or {}) for name in outs}
    goldens: dict[str, dict[str, np.ndarray]] = {}
    if cfg.combine:
        g = golden["combined_x"]
        defined = np.asarray(golden["defined"], bool)
        main: dict[str, np.ndarray] = {"main": g, "defined": defined}
        if cfg.combine_check == "bound":
            for key in ("acc", "S", "S_hard"):
                if key in golden:
                    main[key] = golden[key]
        goldens["combined_x"] = main
        if "combined_topk_weights" in outs:
            goldens["combined_topk_weights"] = {"main": golden["combined_topk_weights"],
                                                "defined": np.repeat(defined[:, :, :1], cfg.topk, axis=2)}
        return CheckView(dev, goldens, checks)
    canon = canonical_device(cfg, dev) if dev else {}
    rows = golden["recv_x"].shape[1]
    meta_rows = golden["recv_src_metadata"].shape[1]
    payload, meta_ok, _ = _row_masks(cfg, golden, rows, meta_rows)
    src_col, master_col, slots = ep_pkg.routing.metadata_columns(cfg.topk, cfg.ascend)
    for name in outs:
        g = np.asarray(golden[name])
        if name in ("recv_x", "recv_sf"):
            mask = np.broadcast_to(payload[:, :, None], g.shape)
        elif name == "recv_topk_weights":
            if cfg.expand:
                mask = payload
            else:  # compared where the slot is local (DeepEP's test masks the others)
                mask = meta_ok[:, :, None] & (golden["recv_topk_idx"] >= 0)
        elif name == "recv_topk_idx":
            mask = np.broadcast_to(meta_ok[:, :g.shape[1], None], g.shape)
        elif name == "recv_src_metadata":
            cols = np.zeros(cfg.topk + 2, bool)
            cols[[src_col, master_col]] = True
            if cfg.expand:
                cols[slots] = True
            mask = meta_ok[:, :, None] & cols[None, None, :]
        else:
            mask = np.ones(g.shape, bool)
        goldens[name] = {"main": _bits(g), "defined": np.ascontiguousarray(mask)}
        if name in canon:
            dev[name] = _bits(canon[name])
    return CheckView(dev, goldens, checks)


# ----------------------------------------------------------------------------------------------
# resources, manifest checks, registration
# ----------------------------------------------------------------------------------------------

def _ep_case_work(fixed: float, ranks: int) -> float:
    """An EP case's fixed cost in work units: ``fixed`` and about 0.5 ms per rank (each rank's
    routing, layout and goldens are built apart); fitted to every preset's EP cases (idle)."""
    return fixed + 1.3e7 * ranks


def estimate_ep(p: Params) -> Estimate:
    """File, peak memory and work of an EP case: the stored inputs and stacked goldens (expected
    received rows per rank, a quarter over for the largest rank; the worst case without CPU sync)."""
    kernel = COMBINE if "bias" in p else DISPATCH
    cfg = EPConfig.of_params(kernel, p)
    R, H, K, T = cfg.ranks, cfg.hidden, cfg.topk, cfg.t_max
    n_tok = sum(cfg.tokens)
    live = 1.0 - float(p["masked"])
    slots = n_tok * K * live
    x_b = 1 if cfg.fp8 else 2
    inputs = tensor_bytes(*([(n_tok * H, x_b), (n_tok * K, 8)] + ([(n_tok * K, 4)] if cfg.weights else [])
                            + ([(n_tok * cfg.sf_packs, cfg.sf_dtype.itemsize)] if cfg.fp8 else [])))
    if cfg.combine:
        inputs += tensor_bytes((n_tok * K * H, 2), *[(n_tok * H, 2)] * cfg.bias)
        gold = tensor_bytes((R * T * H, 2 + 8 * 3 + 2 + 1), (R * T * K, 4))
        file = inputs + gold
        # measured (tracemalloc, every preset; benchmarks/estimates.md): 0.3 of the former bound
        peak = PEAK_FIXED + 0.3 * (3 * file + 40 * n_tok * K * H + 24 * R * T * H)
        return Estimate.of(file, peak, 0, case_work=_ep_case_work(3.5e7, R), byte_work=170)  # fitted: the bytes
    def most(mean: float) -> float:  # the largest of R draws around ``mean``, roughly
        return mean + 2 * math.sqrt(mean) + 1

    per_rank = n_tok * (1.0 - (1.0 - 1.0 / R) ** (K * live))  # tokens with a slot on a given rank
    if cfg.expand:  # the slots, and (A - 1) padding rows for each expert used (few slots each) or half that
        used = cfg.e_l * (1.0 - math.exp(-slots / R / cfg.e_l))
        pad = (cfg.alignment - 1) * (1.0 if slots / R <= used * cfg.alignment / 2 else 0.5)
        rows = most(slots / R) + most(used) * pad
    else:
        rows = most(per_rank)
    worst = ep_pkg.routing.worst_case_rows(R, T, K, cfg.e_l, cfg.alignment, cfg.expand)
    rows = worst if not cfg.cpu_sync else min(worst, rows)
    meta = R * T if not cfg.cpu_sync else most(per_rank)
    row_bytes = H * x_b + cfg.sf_packs * cfg.sf_dtype.itemsize * cfg.fp8 + (4 if cfg.expand else 12 * K)
    out = tensor_bytes((R * rows, row_bytes), (R * meta * (K + 2), 4), (R * (R + 5 * cfg.e_l + 2), 4))
    file = inputs + out
    peak = PEAK_FIXED + 1.6 * file  # measured (tracemalloc, every preset): 0.4 of the former bound
    # outputs beyond a few MiB are fresh pages (faulted in when filled) written through the page
    # cache: about 3 ms more per MB (the expanded layouts' padding rows; fitted on deepep-tests-small)
    large = 80 * max(0.0, file - (8 << 20))
    return Estimate.of(file, peak, large, case_work=_ep_case_work(4e7, R), byte_work=65)  # fitted: the bytes


def check_ep_entry(entry: Any) -> str | None:
    """The driver's sizes are those of the stored tensors (a forged driver cannot ask for more)."""
    d = entry.get("driver")
    fam = entry.get("spec", {}).get("family") or entry.get("kernel")
    if not isinstance(d, dict) or d.get("name") != fam:
        return f"an EP case needs the {fam!r} driver"
    ints = ("ranks", "experts", "topk", "hidden", "t_max", "alignment", "bias")
    if not all(isinstance(d.get(k), int) and not isinstance(d.get(k), bool) and d[k] >= (0 if k == "bias" else 1)
               for k in ints):
        return f"driver: {', '.join(ints)} must be positive integers (bias >= 0)"
    bools = ("expand", "zero_padding", "cpu_sync", "fp8", "col_major_sf", "weights", "multiple_reduction")
    if not all(isinstance(d.get(k), bool) for k in bools):
        return f"driver: {', '.join(bools)} must be true or false"
    if d.get("sf") not in ("float32", "ue8m0") or d.get("combine_check") not in ("bound", "bitwise"):
        return "driver: sf must be 'float32' or 'ue8m0', combine_check 'bound' or 'bitwise'"
    R, E, K, H, T = (d[k] for k in ("ranks", "experts", "topk", "hidden", "t_max"))
    tokens = d.get("tokens")
    if not (isinstance(tokens, list) and len(tokens) == R and all(isinstance(t, int) and 1 <= t <= T
                                                                    for t in tokens) and max(tokens) == T):
        return "driver: tokens must list every rank's token count (1 to t_max, the largest t_max)"
    if R > 64 or E % R or E // R > 256 or K > min(E, 32) or d["bias"] > 2 or d["alignment"] > 1024:
        return ("driver: at most 64 ranks, experts a multiple of ranks (at most 256 per rank), topk at most "
                "experts and 32, bias at most 2, alignment at most 1024")
    t = entry["tensors"]
    for r in range(R):
        x, idx = t.get(f"input.x.{r}"), t.get(f"input.topk_idx.{r}")
        if x is None or idx is None or x["shape"] != [tokens[r], H] or idx["shape"] != [tokens[r], K]:
            return f"driver: rank {r}'s x / topk_idx tensors do not have the driver's (tokens, hidden / topk) shape"
        y = t.get(f"input.y.{r}")
        if d["name"] == COMBINE and (y is None or y["shape"] != [tokens[r], K, H]):
            return f"driver: rank {r}'s y tensor does not have the driver's (tokens, topk, hidden) shape"
    for name, o in entry["outputs"].items():
        if not o["shape"] or o["shape"][0] != R:
            return f"output {name} does not hold the driver's {R} ranks"
    return None


register_family(DISPATCH, build_ep, schema=EP_DISPATCH_SCHEMA, estimate=estimate_ep, driver=run_ep,
                check_entry=check_ep_entry, compute=compute_ep, view=ep_view, ranked=True,
                compute_rank=compute_ep_rank, merge_ranks=merge_ep)
register_family(COMBINE, build_ep, schema=EP_COMBINE_SCHEMA, estimate=estimate_ep, driver=run_ep,
                check_entry=check_ep_entry, compute=compute_ep, view=ep_view, ranked=True,
                compute_rank=compute_ep_rank, merge_ranks=merge_ep)


def _smoke_cases() -> list[dict[str, Any]]:
    """Tiny cases of both families under both profiles (R 2, hidden 256, 8 experts, top-4)."""
    base = {"ranks": 2, "tokens": 6, "hidden": 256, "experts": 8, "topk": 4}
    return [
        {"id": "sm100-ep-dispatch", "kernel": DISPATCH, "profile": "sm100", **base},
        {"id": "sm100-ep-dispatch-fp8-expand", "kernel": DISPATCH, "profile": "sm100", **base, "fp8": True,
         "expand": True, "alignment": 4, "zero_padding": True},
        {"id": "ascend950-ep-dispatch-fp8", "kernel": DISPATCH, "profile": "ascend950", **base, "fp8": True,
         "alignment": 4, "zero_padding": True},
        {"id": "sm100-ep-combine", "kernel": COMBINE, "profile": "sm100", **base, "bias": 2},
        {"id": "sm100-ep-combine-expand", "kernel": COMBINE, "profile": "sm100", **base, "expand": True,
         "multiple_reduction": False},
        {"id": "ascend950-ep-combine", "kernel": COMBINE, "profile": "ascend950", **base},
    ]


def _deepep_tests_small() -> list[dict[str, Any]]:
    """DeepEP's test configuration (8 ranks, hidden 7168, top-6 of 256 experts) with few tokens,
    and the Mega MoE baseline's dispatch and combine at the Mega MoE small preset's shapes (8 ranks,
    hidden 512, top-6 of 32 experts, alignment 224, expanded without CPU sync, TMA-aligned
    column-major packed UE8M0 scales, no multiple reduction)."""
    seed = {"ranks": 8, "tokens": 4, "hidden": 7168, "experts": 256, "topk": 6}
    mega = {"ranks": 8, "tokens": 8, "hidden": 512, "experts": 32, "topk": 6, "masked": 0.0, "uneven": False,
            "alignment": 224, "expand": True, "cpu_sync": False}
    return [
        {"id": "sm100-deepep-dispatch-ep8-h7168-e256-k6", "kernel": DISPATCH, "profile": "sm100", **seed},
        {"id": "sm100-deepep-dispatch-fp8-ep8-h7168-e256-k6", "kernel": DISPATCH, "profile": "sm100", **seed,
         "fp8": True},
        {"id": "sm100-deepep-dispatch-expand-ep8-h7168-e256-k6", "kernel": DISPATCH, "profile": "sm100", **seed,
         "fp8": True, "expand": True, "alignment": 128, "zero_padding": True, "col_major_sf": True},
        {"id": "sm100-deepep-combine-ep8-h7168-e256-k6", "kernel": COMBINE, "profile": "sm100", **seed, "bias": 2},
        {"id": "sm100-deepep-combine-expand-ep8-h7168-e256-k6", "kernel": COMBINE, "profile": "sm100", **seed,
         "expand": True, "bias": 1},
        {"id": "ascend950-deepep-dispatch-ep8-h7168-e256-k6", "kernel": DISPATCH, "profile": "ascend950", **seed,
         "fp8": True},
        {"id": "ascend950-deepep-combine-ep8-h7168-e256-k6", "kernel": COMBINE, "profile": "ascend950", **seed,
         "bias": 2},
        {"id": "sm100-megamoe-baseline-dispatch-ep8", "kernel": DISPATCH, "profile": "sm100", **mega, "fp8": True,
         "sf": "ue8m0", "col_major_sf": True},
        {"id": "sm100-megamoe-baseline-combine-ep8", "kernel": COMBINE, "profile": "sm100", **mega,
         "multiple_reduction": False, "bias": 0},
    ]


def _register_presets() -> None:
    from .presets import register_preset_cases

    register_preset_cases("smoke", _smoke_cases)
    register_preset_cases("deepep-tests-small", _deepep_tests_small)


_register_presets()

