"""Golden cases for Mega MoE (``fp8_fp4_mega_moe``, ``bf16_mega_moe``): every EP rank in one case.

Parameters (all optional): ``ranks`` R (2), ``experts`` E (4), ``topk`` K (2), ``hidden`` H (512),
``intermediate`` I (512), ``tokens`` N per rank (24), ``shared`` (ascend950 shared experts, 1),
``masked`` (fraction of -1 slots, 0.1), ``clamp`` (``activation_clamp``, 10.0).

Inputs are stored per rank ``r`` in user form, the way DeepGEMM's test builds them: ``x.r``
(bf16 tokens cast with ``per_token_cast_to_fp8(x, True, 32, True)``: e4m3 and packed UE8M0
``x_sf.r``; int16 UE8M0 pairs under ascend950), ``topk_idx.r`` (int64, top-K of random scores,
some slots -1), ``topk_weights.r`` (float32), and the rank's un-transformed expert weights ``l1.r``
(E_l, 2I, H/2) / ``l2.r`` (E_l, H, I/2) packed FP4 with per-32 scales ``l1_sf.r`` / ``l2_sf.r``
(float32; int16 pairs under ascend950; bf16 weights and no scales for ``bf16_mega_moe``), plus
the shared experts ``shared_l1`` / ``shared_l2`` (e4m3, int16 pairs) under ascend950.

The call is a *driver* (``run_mega_moe``) rather than one function call: it builds the symmetric
buffers with the module's own ``get_symm_buffer_for_mega_moe`` / ``SymmBuffer``, copies the
inputs into them, applies the module's ``transform_sf_into_required_layout`` and
``transform_weights_for_mega_moe``, and calls the kernel on every rank.  Under deepgemm_ref the
ranks are an ``EmulatedGroup``; a real library is driven in one process, so only one-rank cases
(``ranks = 1``) replay there, with ``torch.distributed`` initialised by the caller.

Outputs: ``y`` (R, N, H) bf16, every rank's combined tokens, and ``stats`` (R, E_l) int32,
``cumulative_local_expert_recv_stats`` from zero (compared bit for bit).  The golden tensors
also hold, per rank, the combine's accumulator ``acc`` (under DeepGEMM's profiles the float32 running
sum in top-k order that DeepGEMM specifies; under ascend950 the exact sum) and ``S`` = sum of |slot
contributions| (with a 2^-12 margin under DeepGEMM's profiles, see docs/numerics.md), and
every stage's golden as ``extra.rank<r>.<stage>`` (``dispatch.src``, ``l1.output``,
``swiglu.output``, ``l2.acts``, ``l2.acts_sf``, ``l2.output``, ``combine.input``, ...; see
``deepgemm_ref.mega``).

Checker bounds for ``y`` (derivation).  The combine on the device adds the J = K slot
contributions (+ 1 shared) ``o_k``, each one bf16 rounding of an L2 output accumulated in
float32.  With the same L2 inputs, ``o_k`` deviates from the golden contribution by at most one
bf16 rounding (unit roundoff u = 2^-8) plus a float32 accumulation error far below it, and the
float32 combine adds gamma_J(2^-24) |o|.  So the typical bound ``E`` uses ``u_acc = 2^-8``,
``n = J`` and ``S = sum_k |o_k|`` (the golden ``S``).  The device's L2 *inputs* may differ too:
its L1 accumulates in float32 before the bf16 rounding of ``h`` and its SwiGLU is not correctly
rounded, so an activation near a rounding boundary can land one bf16 (BF16 path) or E4M3 (FP8
path) step away, moving its L2 product by at most 2u = 2^-7 (one bf16 step) of itself, and
rarely a larger E4M3 step.  The warning bound ``E_hard = gamma_J(2^-8) * S_hard`` with
``S_hard = sum_k (|o_k| + 2 l2.S_k)``, ``l2.S_k = sum_i |a_i w_i|`` over the slot's L2 products
(the golden ``S_hard``), covers every activation being one bf16 step off.  An element outside
``E`` but inside ``E_hard`` warns (consistent with upstream rounding flips); outside ``E_hard``
it fails: a wrong route, expert, weight, scale or combine.  A device's stage outputs are checked
against stage goldens conditioned on them with ``deepgemm_ref.mega``'s stage functions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

from .. import formats as fm
from .. import quant
from ..errors import DGArgumentError
from .cases import ArgRef, BuiltCase, CaseSpec, randn_bf16, register_family
from .ranges_mega import mega_range
from .ranks import current_scope
from .resources import PEAK_FIXED, Estimate, tensor_bytes
from .schema import Key, Params, Rule, Schema

__all__ = ["build_mega_moe", "run_mega_moe", "finish_mega_moe", "hard_error_scale", "MEGA_MOE_SCHEMA"]

BF16 = np.dtype(ml_dtypes.bfloat16)


def _pairs(sf: np.ndarray) -> np.ndarray:
    """float32 power-of-two scales (..., G) -> DeepGEMM-Ascend's int16 UE8M0 pairs (..., G / 2)."""
    by = (np.ascontiguousarray(sf, np.float32).view(np.uint32) >> 23).astype(np.uint8)
    return fm.pack_ue8m0_int16(by)


def hard_error_scale(golden: dict[str, np.ndarray], inputs: dict[str, np.ndarray]) -> np.ndarray:
    """``S_hard`` (R, N, H): the golden ``S`` plus, for every route and the shared experts, twice
    the L2 error scale sum_i |a_i w_i| of the contribution it sends to (rank, token) (one bf16
    step of every activation is 2u = 2^-7 of it)."""
    s_hard = np.array(golden["S"], np.float64, copy=True)
    ranks = s_hard.shape[0]
    for r in range(ranks):
        src, l2s = golden.get(f"extra.rank{r}.dispatch.src"), golden.get(f"extra.rank{r}.l2.S")
        received = src is not None and src.shape[0] > 0  # a rank that received no token has no L2 stage
        if src is None or (received and l2s is None):
            raise DGArgumentError(f"Mega MoE golden: rank {r}'s dispatch.src / l2.S stage goldens are missing")
        if received and l2s is not None:
            np.add.at(s_hard, (src[:, 0], src[:, 1]), 2 * l2s)
        acts = golden.get(f"extra.rank{r}.shared.l2.acts")
        if acts is not None:  # DeepGEMM-Ascend's shared experts: e4m3 acts x e4m3 weights, per-32 scales
            a = np.abs(acts.astype(np.float64)) * np.repeat(
                fm.ue8m0_decode(golden[f"extra.rank{r}.shared.l2.acts_sf"]), 32, axis=-1)
            w = np.abs(inputs["shared_l2"].astype(np.float64)) * np.repeat(
                fm.ue8m0_decode(fm.unpack_ue8m0_int16(inputs["shared_l2_sf"])), 32, axis=-1)
            # non-negative terms: float64 relative error < k * 2^-53; the margin rounds it up
            s_hard[r] += 2 * (a @ w.T) * (1 + 2.0**-40)
    return s_hard


def _fp4_weights(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(E, N, K) bf16 -> packed FP4 (E, N, K / 2) int8 and per-32 UE8M0 scales (E, N, K / 32) float32."""
    pairs = [quant.per_token_cast_to_fp4(w[e], use_ue8m0=True, gran_k=32) for e in range(w.shape[0])]
    return np.stack([p[0] for p in pairs]), np.stack([p[1] for p in pairs])


def _divisible(p: Params) -> str | None:
    if p["experts"] % p["ranks"]:
        return f"experts must be a multiple of ranks = {p['ranks']}; got {p['experts']}"
    return None


def _topk(p: Params) -> str | None:
    if p["topk"] > p["experts"]:
        return f"topk must be at most experts = {p['experts']}; got {p['topk']}"
    return None


def _dims(p: Params) -> str | None:
    if p.ascend:
        step, i_min = 256, 512
        why = "DeepGEMM-Ascend: hidden a multiple of 256, intermediate >= 512 and a multiple of 256"
    elif p.kernel == "fp8_fp4_mega_moe":
        step, i_min, why = 512, 512, "fp8xfp4 (TMA alignment of the per-32 scale bytes): multiples of 512"
    else:
        step, i_min, why = 128, 128, "bf16xbf16: multiples of 128"
    for name in ("hidden", "intermediate"):
        if p[name] % step or (name == "intermediate" and p[name] < i_min):
            return f"{why}; got {name} = {p[name]}"
    return None


MEGA_MOE_SCHEMA = Schema(
    "mega_moe",
    "Mega MoE (dispatch, L1 GEMM, SwiGLU, L2 GEMM, combine) on every EP rank of one case, inputs built the "
    "way DeepGEMM's test builds them (top-k of random scores, some slots -1, weights scaled by 0.05).",
    {"fp8_fp4_mega_moe": ("sm100", "ascend950"), "bf16_mega_moe": ("sm100",)},
    (
        Key("ranks", "int", "expert-parallel ranks R (emulated in one process; see 'Ranks in processes' for "
            "--executor processes)", 2, lo=1, hi=255, shape=True),
        Key("experts", "int", "experts E over all ranks (a multiple of R)", 4, lo=1, hi=4096, shape=True),
        Key("topk", "int", "experts per token K", 2, lo=1, hi=32, shape=True),
        Key("hidden", "int", "the hidden size H", 512, lo=128, hi=1 << 16, shape=True),
        Key("intermediate", "int", "the intermediate size I", 512, lo=128, hi=1 << 16, shape=True),
        Key("tokens", "int", "tokens per rank N", 24, lo=1, hi=1 << 16, shape=True),
        Key("shared", "int", "DeepGEMM-Ascend's shared experts", 1, lo=0, hi=2, profiles=("ascend950",)),
        Key("masked", "float", "fraction of top-k slots set to -1", 0.1, lo=0.0, hi=1.0),
        Key("clamp", "float", "activation_clamp (null: none)", 10.0, lo=0.0, nullable=True),
    ),
    (Rule("experts is a multiple of ranks", _divisible, ("experts", "ranks")),
     Rule("topk <= experts", _topk, ("topk", "experts")),
     Rule("hidden, intermediate: multiples of 512 (fp8_fp4_mega_moe on sm100), of 128 (bf16_mega_moe), of 256 "
          "with intermediate >= 512 (ascend950)", _dims, ("hidden", "intermediate"))),
    why_not={"fp8_fp4_mega_moe": "the CUDA Mega MoE kernels are SM100 only",
             "bf16_mega_moe": "SM100 only; DeepGEMM-Ascend has no BF16 mode"},
    aliases={"num_experts": "experts", "num_ranks": "ranks", "world_size": "ranks", "top_k": "topk",
             "num_topk": "topk", "hidden_size": "hidden", "intermediate_size": "intermediate",
             "num_tokens": "tokens", "activation_clamp": "clamp", "num_shared_experts": "shared"},
)


def build_mega_moe(spec: CaseSpec, rng: np.random.Generator) -> BuiltCase:
    """A Mega MoE case (keys: :data:`MEGA_MOE_SCHEMA`)."""
    p = spec.resolved
    kernel = spec.kernel
    ascend = p.ascend
    bf16 = kernel == "bf16_mega_moe"
    R, E, K = p["ranks"], p["experts"], p["topk"]
    H, I, N = p["hidden"], p["intermediate"], p["tokens"]
    shared = p["shared"] if ascend else 0
    masked = p["masked"]
    clamp = p["clamp"]
    e_l = E // R
    inputs: dict[str, np.ndarray] = {}
    for r in range(R):
        x = randn_bf16(rng, (N, H))
        scores = rng.standard_normal((N, E), dtype=np.float32)
        idx = np.argsort(-scores, axis=1, kind="stable")[:, :K].astype(np.int64)
        w = np.take_along_axis(scores, idx, 1)
        drop = rng.random((N, K)) < masked
        idx[drop] = -1
        w[drop] = 0
        if bf16:
            inputs[f"x.{r}"] = x
        elif ascend:
            q, sf = quant.per_token_cast_to_fp8(x, use_ue8m0=True, gran_k=32)
            inputs[f"x.{r}"], inputs[f"x_sf.{r}"] = q, _pairs(sf)
        else:
            inputs[f"x.{r}"], inputs[f"x_sf.{r}"] = quant.per_token_cast_to_fp8(x, True, 32, True)
        inputs[f"topk_idx.{r}"], inputs[f"topk_weights.{r}"] = idx, w.astype(np.float32)
    scale_w = 0.05  # keeps the activations in a realistic range, as DeepGEMM's test scales its weights
    for r in range(R):
        w1 = randn_bf16(rng, (e_l, 2 * I, H), scale_w)
        w2 = randn_bf16(rng, (e_l, H, I), scale_w)
        if bf16:
            inputs[f"l1.{r}"], inputs[f"l2.{r}"] = w1, w2
            continue
        (q1, s1), (q2, s2) = _fp4_weights(w1), _fp4_weights(w2)
        inputs[f"l1.{r}"], inputs[f"l2.{r}"] = q1, q2
        inputs[f"l1_sf.{r}"], inputs[f"l2_sf.{r}"] = (_pairs(s1), _pairs(s2)) if ascend else (s1, s2)
    if shared:
        ws1 = randn_bf16(rng, (2 * shared * I, H), scale_w)
        ws2 = randn_bf16(rng, (H, shared * I), scale_w)
        for name, wsh in (("shared_l1", ws1), ("shared_l2", ws2)):
            q, sf = quant.per_token_cast_to_fp8(wsh, use_ue8m0=True, gran_k=32)
            inputs[name], inputs[f"{name}_sf"] = q, _pairs(sf)
    driver = {"name": "mega_moe", "ranks": R, "experts": E, "topk": K, "hidden": H, "intermediate": I,
              "tokens": N, "shared": shared, "activation_clamp": clamp}
    outputs = {"y": {"init": "zeros", "shape": [R, N, H], "dtype": "bfloat16"},
               "stats": {"init": "zeros", "shape": [R, e_l], "dtype": "int32"}}
    check = {"n": K + (1 if shared else 0), "u_acc": 2.0**-8,
             "epilogue": {"out": "bf16", "alpha": None, "c": None, "c_mode": "kernel"}, "c_epi": 0}
    args = [ArgRef("output", ("y",))]  # the manifest's record of the main output; the driver makes the call
    return BuiltCase(spec, inputs, kernel, args, {}, outputs, {}, check, driver=driver)


# ----------------------------------------------------------------------------------------------
# the driver
# ----------------------------------------------------------------------------------------------

def _assign(view: Any, value: Any) -> None:
    """``view[...] = value`` for NumPy views and torch tensors alike."""
    if hasattr(view, "copy_"):
        view.copy_(value)
    else:
        from ..interop import to_numpy

        view[...] = to_numpy(value, "mega_moe driver", "input")


def _group_of(module: Any, ranks: int) -> Callable[[int], Any]:
    mega = getattr(module, "mega", None)
    emulated = getattr(mega, "EmulatedGroup", None)
    if emulated is not None:
        group = emulated(ranks)
        return group.rank
    from .bundle import BundleError

    why = (f"a Mega MoE case with {ranks} rank(s) replays through a real library only with ranks = 1 and an "
           "initialised one-process torch.distributed group; multi-rank cases replay with --module deepgemm_ref")
    if ranks != 1:
        raise BundleError(why)
    try:
        import torch.distributed as dist
    except ImportError as e:
        raise BundleError(why + " (torch.distributed is not importable)") from e
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() == 1:
        return lambda r: dist.group.WORLD
    raise BundleError(why)


def _one_group(group: Any) -> Callable[[int], Any]:
    return lambda r: group


def run_mega_moe(module: Any, entry: dict[str, Any], tensors: dict[str, Any], outputs: dict[str, Any]) -> None:
    """Build every rank's symmetric buffer and weights with ``module``'s functions and run the kernel.

    Within :func:`.ranks.rank_scope` (one process per rank: generation's ``processes`` executor,
    replay under torchrun) only this process's rank runs: its buffer is made with
    ``get_symm_buffer_for_mega_moe(scope.group, ...)`` (``SymmBuffer`` under ascend950), its kernel
    call writes its rows of ``y`` and ``stats``, and the kernel's collectives are the group's.  A
    module whose kernels do not take that group raises its argument error on ``group``."""
    d = entry["driver"]
    R, E, K, H, I, N = (int(d[k]) for k in ("ranks", "experts", "topk", "hidden", "intermediate", "tokens"))
    shared = int(d.get("shared", 0))
    ascend = entry["profile"] == "ascend950"
    bf16 = entry["function"] == "bf16_mega_moe"
    e_l = E // R
    scope = current_scope()
    here: list[int] = list(range(R))
    if scope is not None:  # one process per rank: this process's rank alone, on its group
        if scope.size != R:
            from .bundle import BundleError

            raise BundleError(f"case {entry.get('id')!r}: {R} ranks; this process is rank {scope.rank} of "
                              f"{scope.size}")
        here = [scope.rank]
        rank: Callable[[int], Any] = _one_group(scope.group)
    else:
        rank = _group_of(module, R)
    fn = getattr(module, entry["function"])
    bufs: dict[int, Any] = {}
    weights: dict[int, Any] = {}
    for r in here:
        if ascend:
            buf = module.SymmBuffer(rank(r), E, N, K, H, I, num_shared_experts=shared)
        else:
            buf = module.get_symm_buffer_for_mega_moe(rank(r), E, N, K, H, I,
                                                      mma_type="bf16xbf16" if bf16 else "fp8xfp4")
        _assign(buf.x[:N], tensors[f"x.{r}"])
        if not bf16:
            _assign(buf.x_sf[:N], tensors[f"x_sf.{r}"])
        _assign(buf.topk_idx[:N], tensors[f"topk_idx.{r}"])
        _assign(buf.topk_weights[:N], tensors[f"topk_weights.{r}"])
        bufs[r] = buf
        if bf16:
            weights[r] = module.transform_weights_for_mega_moe(tensors[f"l1.{r}"], tensors[f"l2.{r}"])
        elif ascend:
            weights[r] = module.transform_weights_for_mega_moe((tensors[f"l1.{r}"], tensors[f"l1_sf.{r}"]),
                                                               (tensors[f"l2.{r}"], tensors[f"l2_sf.{r}"]))
        else:
            s1 = module.transform_sf_into_required_layout(tensors[f"l1_sf.{r}"], 2 * I, H, (1, 32), e_l)
            s2 = module.transform_sf_into_required_layout(tensors[f"l2_sf.{r}"], H, I, (1, 32), e_l)
            weights[r] = module.transform_weights_for_mega_moe((tensors[f"l1.{r}"], s1), (tensors[f"l2.{r}"], s2))
    shared_w: tuple[Any, Any] = (None, None)
    if shared:
        shared_w = module.transform_weights_for_mega_moe((tensors["shared_l1"], tensors["shared_l1_sf"]),
                                                         (tensors["shared_l2"], tensors["shared_l2_sf"]))
    y, stats = outputs["y"], outputs["stats"]
    for r in here:
        if ascend:
            fn(y[r], weights[r][0], weights[r][1], bufs[r], shared_w[0], shared_w[1], stats[r],
               activation_clamp=d.get("activation_clamp"))
        else:
            fn(y[r], weights[r][0], weights[r][1], bufs[r], stats[r], activation_clamp=d.get("activation_clamp"))


def finish_mega_moe(golden: dict[str, np.ndarray], records: list[Any],
                    inputs: dict[str, np.ndarray]) -> dict[str, Any]:
    """One trace record per rank: stack ``acc`` / ``S`` along the rank axis of ``y``, keep each
    rank's stage goldens as ``extra.rank<r>.<name>``, and add ``S_hard`` (see the module docstring)."""
    for key in ("acc", "S"):
        vals = [getattr(rec, key) for rec in records]
        if vals and all(v is not None for v in vals):
            golden[key] = np.ascontiguousarray(np.stack([np.asarray(v, np.float64) for v in vals]))
    golden["defined"] = np.ones(golden["y"].shape, bool)
    for r, rec in enumerate(records):
        for k, v in rec.extra.items():
            golden[f"extra.rank{r}.{k}"] = np.ascontiguousarray(v)
    golden["S_hard"] = hard_error_scale(golden, inputs)
    return {"ranks": [dict(rec.stats) for rec in records]}


def estimate_mega_moe(p: Params) -> Estimate:
    R, E, K = p["ranks"], p["experts"], p["topk"]
    H, I, N = p["hidden"], p["intermediate"], p["tokens"]
    w_bytes = 2 if p.kernel == "bf16_mega_moe" else 0.5 + 1 / 16
    shared = p["shared"] if p.ascend else 0
    weights = (E + shared) * 3 * I * H
    slots = R * N * K  # routed token copies over all ranks
    # stage goldens per routed copy (padded to blocks: about twice the copies): L1 output and its
    # accumulator and error scale (2I each), SwiGLU (I), L2 acts and output (I + H), combine (H)
    stages = 2 * slots * (8 * I + 3 * H)
    file = tensor_bytes((weights, w_bytes), (R * N * H, 2 + 8 * 3 + 1), (stages, 4), (slots, 12))
    # measured (tracemalloc, every preset; benchmarks/estimates.md): 0.38 of the former bound, and
    # the weights themselves in their stored format
    peak = PEAK_FIXED + 0.38 * (12 * weights + 20 * stages + 64 * R * N * H) + w_bytes * weights
    # the pipeline's exact model is about 13 BLAS multiply-adds per multiply-add with FP4 weights
    # (decoded and scaled per expert), 10 with BF16 ones, and its driver (ranks, stages) about
    # 75 ms per case
    per_madd = 10 if p.kernel == "bf16_mega_moe" else 13
    return Estimate.of(file, peak, per_madd * slots * 3 * H * I, case_work=2e9)  # fitted: every preset


def check_mega_moe_entry(entry: Any) -> str | None:
    """The driver's sizes are those of the stored tensors (a forged driver cannot ask for more)."""
    d = entry.get("driver")
    if not isinstance(d, dict) or d.get("name") != "mega_moe":
        return "a Mega MoE case needs the 'mega_moe' driver"
    keys = ("ranks", "experts", "topk", "hidden", "intermediate", "tokens")
    if not all(isinstance(d.get(k), int) and not isinstance(d.get(k), bool) and d[k] >= 1 for k in keys):
        return f"driver: {', '.join(keys)} must be positive integers"
    if not isinstance(d.get("shared", 0), int) or d.get("shared", 0) < 0:
        return "driver: shared must be a non-negative integer"
    clamp = d.get("activation_clamp")
    if clamp is not None and not isinstance(clamp, (int, float)):
        return "driver: activation_clamp must be a number or null"
    R, E, K, H, _, N = (d[k] for k in keys)
    if E % R:
        return "driver: experts must be a multiple of ranks"
    t = entry["tensors"]
    y = entry["outputs"].get("y", {}).get("shape")
    for r in range(R):
        x, idx = t.get(f"input.x.{r}"), t.get(f"input.topk_idx.{r}")
        if x is None or idx is None or x["shape"] != [N, H] or idx["shape"] != [N, K]:
            return f"driver: rank {r}'s x / topk_idx tensors do not have the driver's (tokens, hidden / topk) shape"
        l1 = t.get(f"input.l1.{r}")
        if l1 is None or l1["shape"][0] != E // R:
            return f"driver: rank {r}'s l1 weights do not hold experts / ranks experts"
    if y != [R, N, H]:
        return f"output y has shape {y}; the driver gives {[R, N, H]}"
    return None


register_family("mega_moe", build_mega_moe, schema=MEGA_MOE_SCHEMA, estimate=estimate_mega_moe,
                driver=run_mega_moe, finish=finish_mega_moe, check_entry=check_mega_moe_entry, ranked=True,
                range=mega_range)


def _smoke_cases() -> list[dict[str, Any]]:
    return [
        {"id": "sm100-mega-moe-fp8xfp4", "kernel": "fp8_fp4_mega_moe", "profile": "sm100"},
        {"id": "sm100-mega-moe-bf16", "kernel": "bf16_mega_moe", "profile": "sm100"},
        {"id": "ascend950-mega-moe", "kernel": "fp8_fp4_mega_moe", "profile": "ascend950"},
    ]


def _small_cases() -> list[dict[str, Any]]:
    """Issue 7's small configuration (8 ranks, 32 experts, top-6, hidden 512, intermediate 512)."""
    base = {"ranks": 8, "experts": 32, "topk": 6, "hidden": 512, "intermediate": 512, "tokens": 48}
    return [
        {"id": "sm100-mega-moe-ep8", "kernel": "fp8_fp4_mega_moe", "profile": "sm100", **base},
        {"id": "ascend950-mega-moe-ep8", "kernel": "fp8_fp4_mega_moe", "profile": "ascend950", "shared": 2, **base},
    ]


def _register_presets() -> None:
    from .presets import register_preset_cases

    register_preset_cases("smoke", _smoke_cases)
    register_preset_cases("deepgemm-tests-small", _small_cases)


_register_presets()
