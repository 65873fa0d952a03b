"""Golden case families: dense GEMMs, grouped GEMMs, einsums and the HC prenorm GEMM, MQA logits.

Each family is its schema (the keys a specification may give, see ``docs/case-specs.md``), a
builder that generates inputs the way DeepGEMM's test generators do (``tests/generators.py``,
``tests/test_attention.py``: seeded normal bf16 data, its quantisers, zeroed padding rows) and
records the exact call, and an estimate of the case's file, memory and work from its keys.

gemm     ``m``, ``n``, ``k``; ``a`` / ``b`` ("fp8", "fp4", "bf16"); ``gran_k_a``, ``gran_k_b``,
         ``gran_n``, ``ue8m0``; ``out``; ``c``; ``alpha``; ``head_splits`` (skip_head_mid).
grouped  ``groups``, ``m`` (expected rows per group; the M of a k-grouped GEMM), ``n``, ``k``,
         ``layout`` ("psum" / "m_indices", or the ``psum`` flag), ``dtype`` (must match the
         kernel), ``max_m`` (masked).
einsum   ``expr``, ``b`` (batch), ``h``, ``r``, ``d_dim``; ``tf32_hc_prenorm_gemm``: ``m``, ``n``, ``k``.
mqa      ``seq``, ``seq_kv``, ``heads``, ``head_dim``, ``fp4``, ``clean``; paged: ``batch``,
         ``block_kv``.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from .. import quant
from .._memory import allocation_limit
from .._parallel import num_threads
from ..core import gemm_work_bytes
from ..quant import CHUNK_ELEMENTS as QUANT_CHUNK
from ..quant import align, ceil_div
from .cases import ArgRef, BuiltCase, CaseSpec, randn_bf16, register_family
from .ranges import scale_product_range
from .ranges_mqa import mqa_range
from .resources import PEAK_FIXED, Estimate, row_block, tensor_bytes, work_room
from .schema import MAX_DIM, Key, Only, Params, Rule, Schema

__all__ = ["build_gemm", "build_grouped", "build_einsum", "build_mqa", "GEMM_SCHEMA", "GROUPED_SCHEMA",
           "EINSUM_SCHEMA", "MQA_SCHEMA"]

BF16 = np.dtype(ml_dtypes.bfloat16)
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
F32 = np.dtype(np.float32)
ALL = ("sm90", "sm100", "ascend950")
CUDA = ("sm90", "sm100")
NOT_SM90 = ("sm100", "ascend950")
LAYOUTS = ("nt", "nn", "tn", "tt")
#: Bytes per element of a stored operand format.
_BYTES = {"fp8": 1.0, "fp4": 0.5, "bf16": 2.0}


def _v(x: Any) -> ArgRef:
    return ArgRef("value", (), x)


def _t(name: str) -> ArgRef:
    return ArgRef("tensor", (name,))


def _pair(a: str, b: str) -> ArgRef:
    return ArgRef("pair", (a, b))


def _out(name: str) -> ArgRef:
    return ArgRef("output", (name,))


def _dim(name: str, default: Any, doc: str, **kw: Any) -> Key:
    """A positive dimension (part of the case's shape)."""
    return Key(name, "int", doc, default, lo=kw.pop("lo", 1), hi=kw.pop("hi", MAX_DIM), shape=True, **kw)


def _check(out: str, n: int, c: str | None = None, u_acc: float | None = None) -> dict[str, Any]:
    d: dict[str, Any] = {"n": n, "epilogue": {"out": out, "alpha": None, "c": c, "c_mode": "kernel"},
                         "c_epi": int(c is not None)}
    if u_acc is not None:
        d["u_acc"] = u_acc
    return d


def _gemm_estimate(rows: float, cols: float, depth: float, in_bytes: float, out_bytes: float, batch: float = 1,
                   extra: float = 0, cost: float = 1.0, split: str = "", align: int = 1,
                   gran: int = 128) -> Estimate:
    """A GEMM-shaped case: ``batch`` products of (rows, depth) x (depth, cols).

    File: stored operands (``in_bytes`` per element, scales included) and per output element the
    output, float64 accumulator and error scale and the defined mask.  Peak: the case's own
    tensors (its file's tensors and the core's output codes before they are copied into the
    output) plus the larger of the float64 work of one product (:func:`core.gemm_work_bytes`,
    within the limit in force less the own tensors: it streams) with :data:`PEAK_FIXED` and the inputs' build
    temporaries (the larger operand's bf16 draw and codes, and the quantiser's temporaries of the
    chunks in flight, its K padded to ``gran``; bf16 draws in blocks), measured with tracemalloc
    on every preset (benchmarks/estimates.md).

    split: whether the case's golden may go in blocks along its output's leading axis
    (:func:`.resources.row_block`, ``align`` rows at a time): ``"rows"`` (the rows of every
    product, one after the other: dense and m-grouped contiguous GEMMs) or ``"batch"`` (whole
    products: masked grouped GEMMs); "" never.  When its own tensors would take more than their
    share of the limit, only the inputs and one block's outputs are held at once, and the
    float64 work is one block's.
    """
    src = batch * (rows + cols) * depth
    outs = batch * rows * cols
    file = tensor_bytes((src, in_bytes), (outs, out_bytes + 17)) + int(extra)
    codes = 2 if out_bytes <= 2 else 4  # the core's output codes per element
    per_elem = out_bytes + 17 + codes  # an output element's own bytes: file tensors and codes
    own = file + outs * codes
    limit = allocation_limit()
    lead, per_lead = (batch * rows, cols * per_elem) if split == "rows" else (batch, rows * cols * per_elem)
    block = row_block(int(lead), own - lead * per_lead, per_lead, limit, align) if split else 0
    if block:
        own = own - (lead - block) * per_lead
    budget = work_room(limit, own)
    work = gemm_work_bytes(int(min(block, rows) if block and split == "rows" else rows), int(cols), int(depth),
                           budget)
    # building the inputs (measured with tracemalloc, benchmarks/estimates.md): a quantised larger
    # operand holds its bf16 draw and its codes (3 bytes per element) and the quantiser about 21
    # bytes per (padded) element of the chunks in flight; bf16 operands are drawn in blocks
    larger = max(rows, cols) * depth
    padded = max(rows, cols) * (-(-depth // gran) * gran)
    in_flight = min(padded, QUANT_CHUNK * max(1, num_threads()))
    build = 3 * larger + 21 * in_flight if in_bytes < 2 else 10 * min(larger, 16 << 20)
    # time (fitted to the CPU times of every preset's GEMMs): two BLAS multiply-adds per
    # multiply-add (the float64 GEMM, the error scale's float32 one and the certificates), and
    # per output and per input element the passes beside them; ``cost`` weighs the whole
    madds = cost * (2.0 * batch * rows * cols * depth + 320 * outs + 500 * src)
    if block:  # each block converts the other operand again
        madds += cost * 50 * cols * depth * (-(-lead // block) - 1)
    return Estimate.of(file, own + max(PEAK_FIXED + work, build), madds, own, row_block=block)


# ----------------------------------------------------------------------------------------------
# Dense GEMMs
# ----------------------------------------------------------------------------------------------

_BF16_GEMMS = tuple(f"{p}_gemm_{x}" for p in ("bf16", "cublaslt", "aclnn_bf16") for x in LAYOUTS)
_FP8_ONLY = tuple(f"fp8_gemm_{x}" for x in LAYOUTS) + ("fp8_gemm_nt_skip_head_mid",)
_FP8_FP4 = tuple(f"{p}_gemm_{x}" for p in ("fp8_fp4", "aclnn_fp8_fp4") for x in LAYOUTS)
_SKIP = ("fp8_gemm_nt_skip_head_mid",)
_NO_ALPHA = tuple(f"{p}_gemm_{x}" for p in ("cublaslt", "aclnn_bf16", "aclnn_fp8_fp4") for x in LAYOUTS)
_ACLNN_ADDMM = tuple(f"{p}_gemm_{x}" for p in ("cublaslt", "aclnn_bf16") for x in LAYOUTS)


def _gemm_kernels() -> dict[str, tuple[str, ...]]:
    out: dict[str, tuple[str, ...]] = {}
    for x in LAYOUTS:
        out[f"fp8_fp4_gemm_{x}"] = ALL if x == "nt" else NOT_SM90
        out[f"fp8_gemm_{x}"] = ALL if x == "nt" else NOT_SM90
        out[f"bf16_gemm_{x}"] = ALL
        out[f"cublaslt_gemm_{x}"] = ALL
    for x in LAYOUTS:
        out[f"aclnn_fp8_fp4_gemm_{x}"] = ("ascend950",)
        out[f"aclnn_bf16_gemm_{x}"] = ("ascend950",)
    out["fp8_gemm_nt_skip_head_mid"] = CUDA
    return out


def _quantised(p: Params) -> bool:
    return p.kernel not in _BF16_GEMMS


def _sm90_recipe(p: Params) -> str | None:
    if p.profile != "sm90" or not _quantised(p):
        return None
    if p.kernel in _SKIP:
        return "fp8_gemm_nt_skip_head_mid on sm90 takes the 1D2D recipe: gran_n 128" if p["gran_n"] != 128 else None
    if p["gran_n"] == 1 and (p["out"] != "f32" or p["c"] == "none"):
        return "sm90's 1D1D FP8 kernel (gran_n 1) writes out 'f32' with c ('is_d' or 'separate')"
    if p["gran_n"] == 128 and (p["out"] != "bf16" or p["c"] != "none"):
        return "sm90's 1D2D FP8 kernel (gran_n 128) writes out 'bf16' without c"
    return None


def _default_gran_n(p: Params) -> int:
    """sm90's FP8 kernels come in two recipes: 1D1D (gran_n 1, out 'f32', with c) and 1D2D (gran_n 128,
    out 'bf16', no c).  With neither out nor c given, a case is the 1D2D one; elsewhere gran_n is 1."""
    if p.profile != "sm90" or not _quantised(p):
        return 1
    if p.kernel in _SKIP:
        return 128
    return 1 if (p.get("out", "bf16") == "f32" or p.get("c", "none") != "none") else 128


def _sm90_1d1d(p: Params) -> bool:
    """An sm90 FP8 case of the 1D1D recipe (gran_n 1), whose out and c defaults follow it."""
    return p.profile == "sm90" and _quantised(p) and p.kernel not in _SKIP and p.get("gran_n") == 1


def _skip_splits(p: Params) -> str | None:
    if p.kernel not in _SKIP:
        return None
    left, _, right = p["head_splits"]
    if left + right == 0 or p["n"] % (left + right):
        return f"head_splits: left + right must divide n = {p['n']}; got {p['head_splits']}"
    return None


def _gran_n_rule(p: Params) -> str | None:
    if _quantised(p) and p["gran_n"] == 128 and (p["b"] != "fp8" or p["gran_k_b"] != 128):
        return "gran_n 128 (a per-block SFB) needs b 'fp8' with gran_k_b 128"
    return None


def _fp4_pair_rule(p: Params) -> str | None:
    if p.ascend and _quantised(p) and p["a"] == "fp4" and p["b"] != "fp4":
        return "DeepGEMM-Ascend takes FP8 x FP8, FP4 x FP4 or FP8 x FP4 operands, not FP4 (a) x FP8 (b)"
    return None


def _fp4_even_rule(p: Params) -> str | None:
    """Packed FP4 holds two codes per byte along K (K-major) or along M / N (MN-major)."""
    if not _quantised(p):
        return None
    layout = "nt" if p.kernel in _SKIP else p.kernel[-2:]
    for side, mn, major_mn in (("a", "m", layout[0] == "t"), ("b", "n", layout[1] == "n")):
        if p[side] == "fp4" and p["k"] % 2:
            return f"an FP4 {side} packs two K elements per byte: k must be even; got {p['k']}"
        if p[side] == "fp4" and major_mn and (p[mn] % 2 or p[mn] < 4):
            # (a (K, 1) packed operand, mn = 2, reads as K-major to the kernels' layout checks)
            return (f"an MN-major FP4 {side} packs two {mn.upper()} elements per byte: {mn} must be even and at "
                    f"least 4; got {p[mn]}")
    return None


def _aclnn_rule(p: Params) -> str | None:
    if not p.kernel.startswith("aclnn_fp8_fp4"):
        return None
    if p["k"] % 64:
        return f"ACLNN's FP8 / FP4 GEMMs take K divisible by 64; got k = {p['k']}"
    if p["a"] == "fp8" and p["b"] == "fp4" and (p.kernel[-2:] != "nt" or p["out"] != "bf16"):
        return "ACLNN's FP8 x FP4 GEMM takes K-major A and B (the nt layout) and writes out 'bf16'"
    return None


def _fp4_gran_rule(p: Params) -> str | None:
    for side in ("a", "b"):
        if _quantised(p) and p[side] == "fp4" and p[f"gran_k_{side}"] != 32:
            return f"FP4 operands take per-32 scales: gran_k_{side} 32"
    return None


# The operand formats (a and b) each kernel and profile takes.
_FORMAT_ONLY = (
    Only(("bf16",), "a BF16 kernel", kernels=_BF16_GEMMS, label="bf16_gemm_*, cublaslt_gemm_*, aclnn_bf16_gemm_*"),
    Only(("fp8",), "an FP8-only kernel", kernels=_FP8_ONLY, label="fp8_gemm_*"),
    Only(("fp8", "fp4"), "an FP8 / FP4 kernel", kernels=_FP8_FP4, label="fp8_fp4_gemm_*, aclnn_fp8_fp4_gemm_*"),
    Only(("fp8",), "DeepGEMM on sm90 takes E4M3 operands only", profiles=("sm90",)),
)
# The K granularities of the scales (gran_k_a and gran_k_b) each profile and kernel takes.
_GRAN_K_ONLY = (
    Only((32,), "DeepGEMM-Ascend scales every 32 K elements", profiles=("ascend950",)),
    Only((128,), "sm90 kernels take per-128 scales", profiles=("sm90",)),
    Only((128,), "fp8_gemm_nt_skip_head_mid takes per-128 scales", kernels=_SKIP),
)

GEMM_SCHEMA = Schema(
    "gemm",
    "Dense GEMMs D = alpha * A @ B^T (+ C), the layout taken from the kernel's suffix (`nt`, `nn`, `tn`, `tt`: "
    "a T first letter stores A as (K, M), an N second letter stores B as (K, N)).  FP8 / FP4 operands are "
    "quantised with DeepGEMM's casting utilities (per-token SFA, per-token or per-block SFB).",
    _gemm_kernels(),
    (
        _dim("m", 128, "rows of A and D"),
        _dim("n", 128, "rows of B, columns of D"),
        _dim("k", 256, "the reduction length"),
        Key("a", "str", "A's element format", lambda p: "fp8" if _quantised(p) else "bf16",
            "'bf16' for the BF16 kernels, else 'fp8'", choices=("fp8", "fp4", "bf16"),
            only=_FORMAT_ONLY),
        Key("b", "str", "B's element format", lambda p: "bf16" if p["a"] == "bf16" else "fp8",
            "'bf16' when a is 'bf16', else 'fp8'", choices=("fp8", "fp4", "bf16"),
            only=_FORMAT_ONLY),
        Key("gran_k_a", "int", "K granularity of A's scales", lambda p: 32 if p.ascend else 128,
            "32 under ascend950, else 128", choices=(32, 128), when=_quantised, when_doc="FP8 / FP4 kernels",
            only=_GRAN_K_ONLY),
        Key("gran_k_b", "int", "K granularity of B's scales",
            lambda p: 32 if (p.ascend or p["b"] == "fp4") else 128, "32 under ascend950 or for an FP4 b, else 128",
            choices=(32, 128), when=_quantised, when_doc="FP8 / FP4 kernels",
            only=_GRAN_K_ONLY),
        Key("gran_n", "int", "N granularity of B's scales: 1 (per token) or 128 (per 128 x 128 block)",
            _default_gran_n, "sm90: 1 when out 'f32' or a c is given, else 128 (the 1D2D kernel); else 1",
            choices=(1, 128), when=_quantised, when_doc="FP8 / FP4 kernels",
            only=(Only((1,), "DeepGEMM-Ascend's per-block SFB is not generated", profiles=("ascend950",)),)),
        Key("ue8m0", "bool", "round the scales to powers of two (UE8M0)", lambda p: p.profile != "sm90",
            "false under sm90, else true", when=_quantised, when_doc="FP8 / FP4 kernels",
            only=(Only((True,), "the kernel takes UE8M0 scales", profiles=NOT_SM90),)),
        Key("out", "str", "D's dtype", lambda p: "f32" if _sm90_1d1d(p) else "bf16",
            "sm90 FP8 with gran_n 1 (the 1D1D kernel): 'f32'; else 'bf16'", choices=("bf16", "f32"),
            only=(Only(("bf16",), "sm90's skip_head_mid kernel writes bf16", profiles=("sm90",), kernels=_SKIP),)),
        Key("c", "str", "the C input: none, a separate tensor, or D itself (accumulate in place)",
            lambda p: "is_d" if _sm90_1d1d(p) else "none",
            "sm90 FP8 with gran_n 1 (the 1D1D kernel): 'is_d' (DeepGEMM's tests accumulate into D); else 'none'",
            choices=("none", "separate", "is_d"),
            only=(Only(("none",), "fp8_gemm_nt_skip_head_mid takes no c", kernels=_SKIP),
                  Only(("none", "is_d"), "DeepGEMM-Ascend's ACLNN addmm writes the result into c and gives d c's "
                       "old value (its tests pass c = d)", profiles=("ascend950",), kernels=_ACLNN_ADDMM,
                       label="aclnn_bf16_gemm_*, cublaslt_gemm_*"))),
        Key("alpha", "float", "the output scale alpha (DeepGEMM-Ascend's epilogue)", None, nullable=True,
            only=(Only((None,), "the kernel takes no alpha", kernels=_SKIP + _NO_ALPHA,
                       label="skip_head_mid, cublaslt_gemm_*, aclnn_*"),)),
        Key("head_splits", "ints", "(left, mid, right) columns of each head; the mid columns of d stay undefined",
            lambda p: [p["n"] // 2, 8, p["n"] - p["n"] // 2], "[n // 2, 8, n - n // 2]: one head", lo=0,
            hi=MAX_DIM, length=3, kernels=_SKIP),
    ),
    (Rule("sm90 FP8 GEMMs: gran_n 1 (1D1D) writes out 'f32' with c; gran_n 128 (1D2D) writes out 'bf16' "
          "without c; skip_head_mid takes gran_n 128", _sm90_recipe, ("gran_n", "out", "c")),
     Rule("gran_n 128 needs b 'fp8' and gran_k_b 128", _gran_n_rule, ("gran_n", "b", "gran_k_b")),
     Rule("FP4 operands take gran_k 32", _fp4_gran_rule, ("a", "b", "gran_k_a", "gran_k_b")),
     Rule("FP4 operands: k even, and m (n) even and >= 4 when A (B) is MN-major", _fp4_even_rule,
          ("a", "b", "m", "n", "k")),
     Rule("ACLNN FP8 / FP4 GEMMs: k divisible by 64; FP8 x FP4 only as nt with out 'bf16'", _aclnn_rule,
          ("k", "a", "b", "out")),
     Rule("ascend950: an FP4 a needs an FP4 b", _fp4_pair_rule, ("a", "b")),
     Rule("skip_head_mid: left + right divides n", _skip_splits, ("head_splits",))),
    why_not={**{f"fp8_fp4_gemm_{x}": "sm90 takes K-major operands only (the NT layout)" for x in LAYOUTS[1:]},
             **{f"fp8_gemm_{x}": "sm90 takes K-major operands only (the NT layout)" for x in LAYOUTS[1:]},
             **{f"aclnn_{p}_gemm_{x}": "ACLNN reference GEMMs exist only in DeepGEMM-Ascend"
                for p in ("fp8_fp4", "bf16") for x in LAYOUTS},
             "fp8_gemm_nt_skip_head_mid": "DeepGEMM-Ascend does not export it"},
    aliases={"a_dtype": "a", "b_dtype": "b", "out_dtype": "out", "dtype": "a", "a_format": "a", "b_format": "b",
             "gran_k": "gran_k_a", "use_ue8m0": "ue8m0"},
)


def _quantise(x: np.ndarray, fmt: str, gran_k: int, ue8m0: bool, block: bool) -> tuple[np.ndarray, np.ndarray]:
    if fmt == "fp4":
        return quant.per_token_cast_to_fp4(x, use_ue8m0=ue8m0, gran_k=gran_k)
    if block:
        return quant.per_block_cast_to_fp8(x, use_ue8m0=ue8m0, gran_k=gran_k)
    return quant.per_token_cast_to_fp8(x, use_ue8m0=ue8m0, gran_k=gran_k)


def _sf_transform(profile: str, mn: int, k: int, recipe: tuple[int, ...], is_sfa: bool | None,
                  gran: tuple[int, int] | None = None) -> dict[str, Any]:
    """The layout transform a device call needs for one SF tensor (recorded, and applied by replay)."""
    kwargs: dict[str, Any] = {"mn": mn, "k": k}
    if gran is not None:
        kwargs["recipe"] = list(gran)
    else:
        kwargs["recipe"] = list(recipe)
        kwargs["is_sfa"] = is_sfa
    return {"function": "transform_sf_into_required_layout", "kwargs": kwargs, "profile": profile}


def _layout(kernel: str) -> str:
    """A dense GEMM kernel's operand layout (``"nt"``, ``"nn"``, ``"tn"``, ``"tt"``)."""
    return "nt" if kernel in _SKIP else kernel[-2:]


def build_gemm(spec: CaseSpec, rng: np.random.Generator) -> BuiltCase:
    """A dense GEMM case (keys: :data:`GEMM_SCHEMA`).

    ``fp8_gemm_nt_skip_head_mid``: d is (m, n + heads * mid) and the mid columns stay undefined.
    """
    p = spec.resolved
    kernel = spec.kernel
    skip = kernel in _SKIP
    layout = _layout(kernel)
    m, n, k = p["m"], p["n"], p["k"]
    fa, fb = p["a"], p["b"]
    out = BF16 if p["out"] == "bf16" else F32
    c_mode = p["c"]
    alpha = p["alpha"]
    profile = spec.profile
    a_x = randn_bf16(rng, (m, k))
    b_x = randn_bf16(rng, (n, k))
    inputs: dict[str, np.ndarray] = {}
    kwargs: dict[str, ArgRef] = {}
    transforms: dict[str, dict[str, Any]] = {}
    if not _quantised(p):
        a_t, b_t = a_x, b_x
        pair = False
        recipe_desc: dict[str, Any] = {}
    else:
        gka, gkb, gran_n, ue8m0 = p["gran_k_a"], p["gran_k_b"], p["gran_n"], p["ue8m0"]
        a_t, a_sf = _quantise(a_x, fa, gka, ue8m0, False)
        b_t, b_sf = _quantise(b_x, fb, gkb, ue8m0, gran_n != 1)
        pair = True
        if gka == gkb:
            recipe = (1, gran_n, gka)
            recipe_desc = {"recipe": list(recipe)}
            kwargs["recipe"] = _v(list(recipe))
            transforms["a_sf"] = _sf_transform(profile, m, k, recipe, True)
            transforms["b_sf"] = _sf_transform(profile, n, k, recipe, False)
        else:
            recipe_desc = {"recipe_a": [1, gka], "recipe_b": [gran_n, gkb]}
            kwargs["recipe_a"] = _v([1, gka])
            kwargs["recipe_b"] = _v([gran_n, gkb])
            transforms["a_sf"] = _sf_transform(profile, m, k, (), None, (1, gka))
            transforms["b_sf"] = _sf_transform(profile, n, k, (), None, (gran_n, gkb))
        if profile == "sm100" and gran_n != 1:
            # sm100's transform gives per-row packed UE8M0 SFB, which the kernel takes only with
            # gran_n 1; with the recorded per-block recipe the kernel transforms the user form itself.
            del transforms["b_sf"]
        inputs["a_sf"], inputs["b_sf"] = np.ascontiguousarray(a_sf), np.ascontiguousarray(b_sf)
    # Orientation: "t" as first letter: A is given as (K, M); "n" as second: B is given as (K, N).
    if layout[0] == "t":
        a_t = np.ascontiguousarray(a_t.T) if fa != "fp4" else quant.transpose_packed_fp4(a_t)
        if pair:
            inputs["a_sf"] = np.ascontiguousarray(inputs["a_sf"].T)
            transforms["a_sf"]["transpose_back"] = True
    if layout[1] == "n":
        b_t = np.ascontiguousarray(b_t.T) if fb != "fp4" else quant.transpose_packed_fp4(b_t)
        if pair:
            inputs["b_sf"] = np.ascontiguousarray(inputs["b_sf"].T)
            if "b_sf" in transforms:
                transforms["b_sf"]["transpose_back"] = True
    # transpose_packed_fp4 gives the (K, MN / 2) storage of an MN-major FP4 operand, which is what
    # the T / N positions take (the kernel sees its (MN / 2, K) transposed view).
    inputs["a"], inputs["b"] = np.ascontiguousarray(a_t), np.ascontiguousarray(b_t)
    args = [_pair("a", "a_sf") if pair else _t("a"), _pair("b", "b_sf") if pair else _t("b"), _out("d")]
    init = "zeros"
    if c_mode in ("separate", "is_d"):
        inputs["c"] = randn_bf16(rng, (m, n), 32.0).astype(out)
        if c_mode == "separate":
            kwargs["c"] = _t("c")
        else:
            kwargs["c"] = _out("d")
            init = "c"
    if alpha is not None:
        kwargs["alpha"] = _v(float(alpha))
    if kernel.startswith("aclnn_"):
        transforms = {}  # ACLNN takes the float32 user form (int16 pairs are rejected)
    d_cols = n
    if skip:
        splits = list(p["head_splits"])
        args.append(_v(splits))
        d_cols = n + n // (splits[0] + splits[2]) * splits[1]
    outputs = {"d": {"init": init, "shape": [m, d_cols], "dtype": str(out)}}
    check = {
        "n": k,
        "epilogue": {"out": "bf16" if out == BF16 else "f32", "alpha": alpha, "c": "c" if "c" in inputs else None,
                     "c_mode": "fused" if kernel.startswith(("cublaslt", "aclnn_bf16")) else
                     ("rounded" if kernel.startswith("aclnn_fp8") else "kernel")},
        "c_epi": int(alpha is not None) + int("c" in inputs),
        **recipe_desc,
    }
    return BuiltCase(spec, inputs, kernel, args, kwargs, outputs, transforms, check)


def estimate_gemm(p: Params) -> Estimate:
    m, n, k = p["m"], p["n"], p["k"]
    fmt = (_BYTES[p["a"]] + _BYTES[p["b"]]) / 2 + (0 if p["a"] == "bf16" else 4 / 32)
    out_b = 2 if p["out"] == "bf16" else 12  # f32 outputs also store the accumulator's low part
    cols = n + (n // max(p["head_splits"][0] + p["head_splits"][2], 1) * p["head_splits"][1]
                if p.kernel in _SKIP else 0)
    c_bytes = m * n * out_b if p["c"] != "none" else 0
    # row blocks: A's rows are whole rows or columns of its stored form (not packed FP4 along M)
    split = "" if _layout(p.kernel)[0] == "t" and p["a"] == "fp4" else "rows"
    gran = p.get("gran_k_a" if m >= cols else "gran_k_b") or 128  # the larger operand's quantiser
    return _gemm_estimate(m, cols, k, fmt, out_b, extra=c_bytes, split=split, gran=gran)


def gemm_rows(built: BuiltCase) -> dict[str, int] | None:
    """The inputs of a dense GEMM case that hold rows of its output, by the axis they lie along
    (``a``, ``a_sf``, ``c``; ``b``, ``b_sf`` serve every row): output rows [r0, r1) are the
    golden of those slices.  None where A's rows are not slices of its stored form (FP4 A given
    as (K, M / 2) packed bytes)."""
    axis = 0 if _layout(built.spec.kernel)[0] == "n" else 1
    if axis == 1 and built.spec.resolved["a"] == "fp4":
        return None
    axes = {"a": axis}
    if "a_sf" in built.inputs:
        axes["a_sf"] = axis
    if "c" in built.inputs:
        axes["c"] = 0
    return axes


register_family("gemm", build_gemm, schema=GEMM_SCHEMA, estimate=estimate_gemm, range=scale_product_range,
                functions=("transform_sf_into_required_layout",), row_split=gemm_rows)


# ----------------------------------------------------------------------------------------------
# grouped GEMMs
# ----------------------------------------------------------------------------------------------

_CONTIGUOUS = ("m_grouped_fp8_gemm_nt_contiguous", "m_grouped_fp8_fp4_gemm_nt_contiguous",
               "m_grouped_bf16_gemm_nt_contiguous")
_MASKED = ("m_grouped_fp8_gemm_nt_masked", "fp8_m_grouped_gemm_nt_masked", "m_grouped_fp8_fp4_gemm_nt_masked",
           "m_grouped_bf16_gemm_nt_masked", "bf16_m_grouped_gemm_nt_masked")
_K_GROUPED = ("k_grouped_fp8_gemm_tn_contiguous", "k_grouped_bf16_gemm_tn_contiguous")


def _grouped_kernels() -> dict[str, tuple[str, ...]]:
    out: dict[str, tuple[str, ...]] = {k: ALL for k in _CONTIGUOUS}
    out.update({k: CUDA for k in _MASKED})
    out["k_grouped_fp8_gemm_tn_contiguous"] = NOT_SM90
    out["k_grouped_bf16_gemm_tn_contiguous"] = ALL
    return out


def _fp8(kernel: str) -> bool:
    return "fp8" in kernel


def _default_layout(p: Params) -> str:
    if p.kernel in _MASKED:
        return "masked"
    if p.kernel in _K_GROUPED:
        return "k_grouped"
    return "psum" if p.get("psum", True) else "m_indices"


def _default_max_m(p: Params) -> int:
    return align(int(p["m"] * 1.3) + 1, 64)


def _masked_rows(p: Params) -> str | None:
    if p.kernel in _MASKED and p["max_m"] < int(p["m"] * 1.3):
        return (f"max_m must hold every group's rows (up to int(1.3 m) = {int(p['m'] * 1.3)} for m = {p['m']}); "
                f"got {p['max_m']}")
    return None


def _psum_layout(p: Params) -> str | None:
    if p.kernel in _CONTIGUOUS and (p["layout"] == "psum") != p["psum"]:
        return f"layout {p['layout']!r} and psum {p['psum']} disagree (give one of them)"
    return None


def _k_grouped_mn(p: Params) -> str | None:
    if p.kernel in _K_GROUPED and (p["m"] < 2 or p["n"] < 2):
        return ("k-grouped cases take m, n >= 2 (a (K, 1) operand reads as K-major to the kernel's layout check); "
                f"got m = {p['m']}, n = {p['n']}")
    if p.kernel == "k_grouped_fp8_gemm_tn_contiguous" and p.profile == "sm100" and (p["m"] % 4 or p["n"] % 4):
        return f"sm100's FP8 k-grouped GEMM packs 4 scales per int32 along M and N: m, n divisible by 4; got " \
               f"m = {p['m']}, n = {p['n']}"
    return None


def _sm90_k(p: Params) -> str | None:
    if p.profile == "sm90" and not _fp8(p.kernel) and p.kernel not in _K_GROUPED and p["k"] % 64:
        return f"sm90's BF16 grouped kernels take K divisible by 64; got k = {p['k']}"
    return None


GROUPED_SCHEMA = Schema(
    "grouped",
    "M-grouped GEMMs (contiguous with psum ends or m_indices, masked) and K-grouped GEMMs.  Each group's row "
    "count (K size for k-grouped) is drawn uniformly in [0.7, 1.3] times `m` (`k`), as DeepGEMM's tests do, "
    "and padded to the contiguous-layout alignment (128; 256 under ascend950).",
    _grouped_kernels(),
    (
        _dim("groups", 3, "the number of groups (experts)", hi=1 << 16),
        _dim("m", lambda p: 48 if p.kernel in _K_GROUPED else 40, "expected rows per group (m-grouped); M of a "
             "k-grouped GEMM", default_doc="40 (48 for k-grouped)"),
        _dim("n", 64, "columns of D (rows of each group's B)"),
        _dim("k", 256, "the reduction length (expected K per group for k-grouped)"),
        Key("dtype", "str", "the operand format, which the kernel's name fixes", lambda p: "fp8" if _fp8(p.kernel)
            else "bf16", "the kernel's", choices=("fp8", "bf16"),
            only=(Only(("fp8",), "an FP8 kernel; the m_grouped_bf16_* and k_grouped_bf16_* kernels take bf16",
                       kernels=tuple(k for k in _grouped_kernels() if _fp8(k)), label="the FP8 kernels"),
                  Only(("bf16",), "a BF16 kernel; the FP8 kernels take fp8",
                       kernels=tuple(k for k in _grouped_kernels() if not _fp8(k)), label="the BF16 kernels"))),
        Key("psum", "bool", "psum end offsets (true) or per-row m_indices (false) as the grouped layout",
            lambda p: p.get("layout", "psum") == "psum", "from layout (true)", kernels=_CONTIGUOUS,
            only=(Only((True,), "DeepGEMM-Ascend supports only the psum layout", profiles=("ascend950",)),)),
        Key("layout", "str", "the grouped layout; the kernel fixes it except for contiguous M-grouped kernels",
            _default_layout, "from psum for contiguous kernels, else the kernel's", choices=("psum", "m_indices",
                                                                                         "masked", "k_grouped"),
            only=(Only(("psum", "m_indices"), "a contiguous M-grouped kernel", kernels=_CONTIGUOUS,
                       label="the contiguous kernels"),
                  Only(("psum",), "DeepGEMM-Ascend supports only the psum layout", profiles=("ascend950",),
                       kernels=_CONTIGUOUS, label="the contiguous kernels"),
                  Only(("masked",), "a masked kernel", kernels=_MASKED, label="the masked kernels"),
                  Only(("k_grouped",), "a K-grouped kernel", kernels=_K_GROUPED, label="the k-grouped kernels"))),
        Key("max_m", "int", "rows per group of a and d (masked)", _default_max_m, "align(int(1.3 m) + 1, 64)", lo=1,
            hi=MAX_DIM, kernels=_MASKED, shape=True),
    ),
    (Rule("masked: max_m >= int(1.3 m) (the largest masked_m drawn)", _masked_rows, ("max_m", "m")),
     Rule("layout and psum, when both given, agree", _psum_layout, ("layout", "psum")),
     Rule("sm90 BF16 M-grouped GEMMs take K divisible by 64", _sm90_k, ("k",)),
     Rule("k-grouped: m, n >= 2; sm100 FP8: m, n divisible by 4", _k_grouped_mn, ("m", "n"))),
    why_not={**{k: "DeepGEMM-Ascend provides no masked grouped GEMM" for k in _MASKED},
             "k_grouped_fp8_gemm_tn_contiguous": "the FP8 TN k-grouped GEMM is sm100 / Ascend only"},
    aliases={"num_groups": "groups", "num_experts": "groups", "experts": "groups", "expected_m": "m",
             "m_per_group": "m", "a": "dtype", "a_dtype": "dtype", "use_psum_layout": "psum", "masked_m": "max_m"},
)


def build_grouped(spec: CaseSpec, rng: np.random.Generator) -> BuiltCase:
    """A grouped GEMM case (keys: :data:`GROUPED_SCHEMA`)."""
    p = spec.resolved
    kernel = spec.kernel
    ascend = p.ascend
    groups, exp_m, n, k = p["groups"], p["m"], p["n"], p["k"]
    fp8 = _fp8(kernel)
    ue8m0 = spec.profile != "sm90"
    gran = 32 if ascend else 128
    setup = [] if ascend else [{"function": "set_mk_alignment_for_contiguous_layout", "args": [{"value": 128}]}]
    alignment = 256 if ascend else 128
    if kernel in _K_GROUPED:
        return _build_k_grouped(spec, rng, groups, n, k, fp8, ascend, setup)
    if kernel in _MASKED:
        max_m = p["max_m"]
        masked = np.array([int(exp_m * rng.uniform(0.7, 1.3)) for _ in range(groups)], np.int32)
        a = randn_bf16(rng, (groups, max_m, k))
        b = randn_bf16(rng, (groups, n, k))
        inputs: dict[str, np.ndarray] = {"masked_m": masked}
        if fp8:
            qa = [quant.per_token_cast_to_fp8(a[g], use_ue8m0=ue8m0, gran_k=gran) for g in range(groups)]
            qb = [quant.per_block_cast_to_fp8(b[g], use_ue8m0=ue8m0, gran_k=gran) for g in range(groups)]
            sfa = np.stack([q[1] for q in qa])
            for g in range(groups):
                sfa[g, masked[g]:] = 0  # DeepGEMM's test zeroes SFA rows past masked_m
            inputs.update(a=np.stack([q[0] for q in qa]), a_sf=sfa, b=np.stack([q[0] for q in qb]),
                          b_sf=np.stack([q[1] for q in qb]))
            args = [_pair("a", "a_sf"), _pair("b", "b_sf")]
        else:
            inputs.update(a=a, b=b)
            args = [_t("a"), _t("b")]
        args += [_out("d"), _t("masked_m"), _v(int(exp_m * 1.2))]
        outputs = {"d": {"init": "zeros", "shape": [groups, max_m, n], "dtype": "bfloat16"}}
        return BuiltCase(spec, inputs, kernel, args, {}, outputs, {}, _check("bf16", k), setup)
    # m-grouped contiguous: psum ends or m_indices
    psum = bool(p["psum"]) or ascend
    actual = [int(exp_m * rng.uniform(0.7, 1.3)) for _ in range(groups)]
    aligned = [align(x, alignment) for x in actual]
    m = sum(aligned)
    a = randn_bf16(rng, (m, k))
    b = randn_bf16(rng, (groups, n, k))
    layout = np.zeros(groups if psum else m, np.int32)
    start = 0
    for g, (act, al) in enumerate(zip(actual, aligned, strict=True)):
        if psum:
            layout[g] = start + act
        else:
            layout[start:start + act] = g
            layout[start + act:start + al] = -1
        a[start + act:start + al] = 0  # zero padding, as DeepGEMM's generator does
        start += al
    inputs = {"grouped_layout": layout}
    if fp8:
        qa, sfa = quant.per_token_cast_to_fp8(a, use_ue8m0=ue8m0, gran_k=gran)
        if ascend:
            qbs = [quant.per_token_cast_to_fp8(b[g], use_ue8m0=True, gran_k=32) for g in range(groups)]
        else:
            qbs = [quant.per_block_cast_to_fp8(b[g], use_ue8m0=ue8m0, gran_k=gran) for g in range(groups)]
        inputs.update(a=qa, a_sf=sfa, b=np.stack([q[0] for q in qbs]), b_sf=np.stack([q[1] for q in qbs]))
        args = [_pair("a", "a_sf"), _pair("b", "b_sf")]
    else:
        inputs.update(a=a, b=b)
        args = [_t("a"), _t("b")]
    args += [_out("d"), _t("grouped_layout")]
    kwargs = {"use_psum_layout": _v(psum)}
    outputs = {"d": {"init": "zeros", "shape": [m, n], "dtype": "bfloat16"}}
    return BuiltCase(spec, inputs, kernel, args, kwargs, outputs, {}, _check("bf16", k), setup)


def _build_k_grouped(spec: CaseSpec, rng: np.random.Generator, groups: int, n: int, k_avg: int, fp8: bool,
                     ascend: bool, setup: list[dict[str, Any]]) -> BuiltCase:
    m = spec.resolved["m"]
    alignment = 256 if ascend else 128
    real = [max(1, int(k_avg * rng.uniform(0.7, 1.3))) for _ in range(groups)]
    if ascend:
        # psum ends along K; group g uses rows [align(end_{g-1}, 256), end_g)
        ends, starts, pos = [], [], 0
        for kg in real:
            starts.append(pos)
            ends.append(pos + kg)
            pos = align(pos + kg, alignment)
        total = ends[-1]
    else:
        ks = [align(x, alignment) for x in real]
        starts = list(np.cumsum([0] + ks[:-1]))
        ends = [s + kg for s, kg in zip(starts, ks, strict=True)]
        total = sum(ks)
    a = np.zeros((total, m), BF16)
    b = np.zeros((total, n), BF16)
    for s0, e0 in zip(starts, ends, strict=True):
        a[s0:e0] = randn_bf16(rng, (e0 - s0, m))
        b[s0:e0] = randn_bf16(rng, (e0 - s0, n))
    c = randn_bf16(rng, (groups, m, n), 32.0).astype(np.float32)
    inputs: dict[str, np.ndarray] = {"c": c}
    if ascend:
        inputs["grouped_layout"] = np.array(ends, np.int32)
        ks_cpu: Any = None
    else:
        inputs["grouped_layout"] = np.array([e - s for s, e in zip(starts, ends, strict=True)], np.int32)
        ks_cpu = [int(e - s) for s, e in zip(starts, ends, strict=True)]
    kwargs: dict[str, ArgRef] = {"c": _out("d")}
    if fp8:
        gran = 32 if ascend else 128
        if ascend:
            qa, sfa = quant.per_channel_cast_to_fp8(_pad_rows(a, gran), use_ue8m0=True, gran_k=gran)
            qb, sfb = quant.per_channel_cast_to_fp8(_pad_rows(b, gran), use_ue8m0=True, gran_k=gran)
            qa, qb = qa[:total], qb[:total]
        else:
            qa, sfa = _per_group_channel_cast(a, starts, ends, gran)
            qb, sfb = _per_group_channel_cast(b, starts, ends, gran)
        inputs.update(a=qa, a_sf=sfa, b=qb, b_sf=sfb)
        args = [_pair("a", "a_sf"), _pair("b", "b_sf")]
        kwargs["recipe"] = _v([1, 1, gran])
    else:
        inputs.update(a=a, b=b)
        args = [_t("a"), _t("b")]
    args += [_out("d"), _v(ks_cpu), _t("grouped_layout")]
    if ascend:
        kwargs["use_psum_layout"] = _v(True)
    outputs = {"d": {"init": "c", "shape": [groups, m, n], "dtype": "float32"}}
    return BuiltCase(spec, inputs, spec.kernel, args, kwargs, outputs, {}, _check("f32", k_avg * 2, c="c"), setup)


def _pad_rows(x: np.ndarray, gran: int) -> np.ndarray:
    out = np.zeros((align(x.shape[0], gran), x.shape[1]), x.dtype)
    out[: x.shape[0]] = x
    return out


def _per_group_channel_cast(
    x: np.ndarray, starts: list[int], ends: list[int], gran: int
) -> tuple[np.ndarray, np.ndarray]:
    """DeepGEMM's k_grouped_per_channel_cast_to_fp8: each group cast alone, SF rows compact."""
    q = np.zeros(x.shape, E4M3)
    sfs = []
    for s0, e0 in zip(starts, ends, strict=True):
        kg = e0 - s0
        if kg == 0:
            continue
        grp = np.zeros((align(kg, gran), x.shape[1]), x.dtype)
        grp[:kg] = x[s0:e0]
        gq, gs = quant.per_channel_cast_to_fp8(grp, use_ue8m0=True, gran_k=gran)
        q[s0:e0] = gq[:kg]
        sfs.append(gs)
    return q, np.concatenate(sfs) if sfs else np.zeros((0, x.shape[1]), np.float32)


def _expected_aligned_rows(m: int, alignment: int) -> float:
    """The mean of ``align(int(m u), alignment)`` over ``u`` uniform in [0.7, 1.3]: the rows a
    contiguous m-grouped case gives a group (:func:`build_grouped` draws each group's size so and
    aligns it), averaged over 600 evenly spaced ``u`` (the largest, ``align(int(1.3 m) + 1)``, is
    up to twice the mean)."""
    u = (np.arange(600) + 0.5) / 600 * 0.6 + 0.7
    return float(np.mean(-(-(m * u).astype(np.int64) // alignment) * alignment))


def estimate_grouped(p: Params) -> Estimate:
    groups, m, n, k = p["groups"], p["m"], p["n"], p["k"]
    al = 256 if p.ascend else 128
    fmt = 1 + 4 / 32 if _fp8(p.kernel) else 2
    if p.kernel in _K_GROUPED:
        # SUM_K <= groups * align(int(1.3 k), alignment); the (groups, m, n) float32 c and d
        k_group = align(int(1.3 * k) + 1, al)
        est = _gemm_estimate(m, n, k_group, fmt, 12, batch=groups, extra=groups * m * n * 4)
        return Estimate(est.file_bytes, est.peak_bytes, est.work)  # the (groups, m, n) GEMMs' time (measured)
    rows = p["max_m"] if p.kernel in _MASKED else _expected_aligned_rows(m, al)
    # per group: (rows, k) x (n, k); the estimate of one GEMM of all groups' rows against one B each.
    # Blocks: whole groups (masked), or rows in whole alignment blocks (m_indices)
    split = "batch" if p.kernel in _MASKED else ("" if p["psum"] or p.ascend else "rows")
    return _gemm_estimate(rows, n, k, fmt, 2, batch=groups, split=split, align=al if split == "rows" else 1,
                          gran=32 if p.ascend else 128)


def grouped_rows(built: BuiltCase) -> dict[str, int] | None:
    """The inputs of an m-grouped case that hold rows of its output (see :func:`gemm_rows`):
    masked, every per-group input along the groups (blocks of whole groups); contiguous with
    ``m_indices``, ``a``, its scales and the indices along the rows (blocks of whole alignment
    blocks: each holds one group's rows or padding).  None for psum ends and K-grouped cases."""
    kernel = built.spec.kernel
    if kernel in _MASKED:
        return {k: 0 for k in ("a", "a_sf", "b", "b_sf", "masked_m") if k in built.inputs}
    if kernel in _CONTIGUOUS and not built.kwargs["use_psum_layout"].value:
        return {k: 0 for k in ("a", "a_sf", "grouped_layout") if k in built.inputs}
    return None


register_family("grouped", build_grouped, schema=GROUPED_SCHEMA, estimate=estimate_grouped, range=scale_product_range,
                functions=("set_mk_alignment_for_contiguous_layout",), row_split=grouped_rows)


# ----------------------------------------------------------------------------------------------
# einsum, fp8_einsum, tf32_hc_prenorm_gemm
# ----------------------------------------------------------------------------------------------

_EINSUMS = ("einsum", "fp8_einsum")
_HC = ("tf32_hc_prenorm_gemm",)

def _hc_rule(p: Params) -> str | None:
    if p.kernel not in _HC:
        return None
    n_max, k_mult = (64, 256) if p.ascend else ((32, 64) if p.profile == "sm90" else (128, 64))
    if p["n"] > n_max or p["n"] % 8 or p["k"] % k_mult:
        return (f"tf32_hc_prenorm_gemm under {p.profile} takes n <= {n_max}, n % 8 == 0 and k % {k_mult} == 0; "
                f"got n = {p['n']}, k = {p['k']}")
    return None


EINSUM_SCHEMA = Schema(
    "einsum",
    "`einsum` / `fp8_einsum` with the expression `bhr,hdr->bhd` (batched per-head products), and "
    "`tf32_hc_prenorm_gemm` (D = A @ B^T with bf16 A, float32 B, and the row sums of squares of A).",
    {"einsum": ALL, "fp8_einsum": ALL, "tf32_hc_prenorm_gemm": ALL},
    (
        Key("expr", "str", "the einsum expression (only this one is generated)", "bhr,hdr->bhd",
            choices=("bhr,hdr->bhd",), kernels=_EINSUMS),
        _dim("b", 4, "the batch size b", kernels=_EINSUMS),
        _dim("h", 2, "the heads h", kernels=_EINSUMS),
        _dim("r", 256, "the reduction length r", kernels=_EINSUMS),
        _dim("d_dim", 128, "the output length d", kernels=_EINSUMS),
        _dim("m", 13, "rows of A and D", kernels=_HC),
        _dim("n", 24, "rows of B, columns of D", kernels=_HC),
        _dim("k", 512, "the reduction length", kernels=_HC),
    ),
    (Rule("tf32_hc_prenorm_gemm: n <= 128 (sm90: 32; ascend950: 64), n % 8 == 0, k % 64 == 0 (ascend950: 256)",
          _hc_rule, ("n", "k")),),
    aliases={"batch": "b", "heads": "h", "d": "d_dim", "equation": "expr"},
)


def build_einsum(spec: CaseSpec, rng: np.random.Generator) -> BuiltCase:
    """An einsum or HC prenorm case (keys: :data:`EINSUM_SCHEMA`)."""
    p = spec.resolved
    kernel = spec.kernel
    if kernel == "tf32_hc_prenorm_gemm":
        m, n, k = p["m"], p["n"], p["k"]
        inputs = {"a": randn_bf16(rng, (m, k)), "b": rng.standard_normal((n, k), dtype=np.float32)}
        outputs = {"d": {"init": "zeros", "shape": [m, n], "dtype": "float32"},
                   "sqr_sum": {"init": "zeros", "shape": [m], "dtype": "float32"}}
        return BuiltCase(spec, inputs, kernel, [_t("a"), _t("b"), _out("d"), _out("sqr_sum")], {}, outputs, {},
                         _check("f32", k))
    expr = p["expr"]
    bsz, h, r, dd = p["b"], p["h"], p["r"], p["d_dim"]
    x = randn_bf16(rng, (bsz, h, r))
    y = randn_bf16(rng, (h, dd, r))
    if kernel == "einsum":
        inputs = {"x": x, "y": y}
        args = [_v(expr), _t("x"), _t("y"), _out("d")]
        kwargs: dict[str, ArgRef] = {}
    else:
        gran = 32 if spec.profile == "ascend950" else 128
        ue8m0 = spec.profile != "sm90"
        qx, sx = quant.per_token_cast_to_fp8(x.reshape(bsz * h, r), use_ue8m0=ue8m0, gran_k=gran)
        qys = [quant.per_block_cast_to_fp8(y[i], use_ue8m0=ue8m0, gran_k=gran) if gran == 128
               else quant.per_token_cast_to_fp8(y[i], use_ue8m0=True, gran_k=32) for i in range(h)]
        inputs = {"x": qx.reshape(bsz, h, r), "x_sf": sx.reshape(bsz, h, -1),
                  "y": np.stack([q[0] for q in qys]), "y_sf": np.stack([q[1] for q in qys])}
        args = [_v(expr), _pair("x", "x_sf"), _pair("y", "y_sf"), _out("d")]
        kwargs = {"recipe": _v([1, 1, 32] if gran == 32 else [1, 128, 128])}
    outputs = {"d": {"init": "zeros", "shape": [bsz, h, dd], "dtype": "bfloat16"}}
    return BuiltCase(spec, inputs, kernel, args, kwargs, outputs, {}, _check("bf16", r))


def estimate_einsum(p: Params) -> Estimate:
    if p.kernel in _HC:
        m, n, k = p["m"], p["n"], p["k"]
        est = _gemm_estimate(m, n, k, 3, 12 + 40 / max(n, 1))
        # the HC prenorm GEMM's exact model holds about 0.35 bytes per multiply-add (measured with
        # tracemalloc: 26 MiB for m, n, k = 512, 32, 2048) and is about 30 times slower per
        # multiply-add than a dense GEMM's
        return Estimate.of(est.file_bytes, est.peak_bytes + 0.35 * m * n * k, 30 * m * n * k)
    return _gemm_estimate(p["b"], p["d_dim"], p["r"], 2 if p.kernel == "einsum" else 1.2, 2, batch=p["h"])


register_family("einsum", build_einsum, schema=EINSUM_SCHEMA, estimate=estimate_einsum,
                range=scale_product_range)


# ----------------------------------------------------------------------------------------------
# MQA logits
# ----------------------------------------------------------------------------------------------

_MQA = ("fp8_fp4_mqa_logits",)
_PAGED = ("fp8_fp4_paged_mqa_logits",)


def _cuda(p: Params) -> bool:
    return not p.ascend


def _seq_rule(p: Params) -> str | None:
    if p.kernel in _MQA and p["seq_kv"] < p["seq"]:
        return f"seq_kv must be >= seq (causal rows end at i + seq_kv - seq + 1); got seq {p['seq']}, " \
               f"seq_kv {p['seq_kv']}"
    return None


def _fp4_dim_rule(p: Params) -> str | None:
    if _cuda(p) and p["fp4"] and p["head_dim"] not in (64, 128):
        return f"FP4 MQA takes head_dim 64 or 128; got {p['head_dim']}"
    return None


MQA_SCHEMA = Schema(
    "mqa",
    "MQA logits `fp8_fp4_mqa_logits` (causal rows, as DeepGEMM's test builds them) and the paged "
    "`fp8_fp4_paged_mqa_logits` (random context lengths in [block_kv / 2, 3 block_kv), a shuffled block "
    "table, the schedule from `get_paged_mqa_logits_metadata`).  DeepGEMM-Ascend takes FP8 with int16 UE8M0 "
    "pairs and writes bf16 logits.",
    {"fp8_fp4_mqa_logits": ALL, "fp8_fp4_paged_mqa_logits": ALL},
    (
        _dim("seq", 16, "query tokens", kernels=_MQA),
        _dim("seq_kv", 96, "KV tokens", kernels=_MQA),
        _dim("batch", 3, "requests", kernels=_PAGED, hi=1 << 20),
        Key("heads", "int", "query heads", lambda p: 32 if p.profile == "sm90" else (4 if p.ascend else 8),
            "32 under sm90, 4 under ascend950, else 8", lo=1, hi=64, shape=True,
            only=(Only((8, 16, 32, 64), "DeepGEMM on sm100", profiles=("sm100",)),
                  Only((32, 64), "DeepGEMM on sm90", profiles=("sm90",)),
                  Only(tuple(range(4, 65, 4)), "DeepGEMM-Ascend takes a multiple of 4 in [4, 64]",
                       profiles=("ascend950",)))),
        Key("head_dim", "int", "the head dimension", 64, choices=(32, 64, 128), shape=True,
            only=(Only((64, 128), "DeepGEMM-Ascend", profiles=("ascend950",)),)),
        Key("block_kv", "int", "tokens per KV block (page)", 64, choices=(32, 64, 128), kernels=_PAGED, shape=True,
            only=(Only((32, 64), "DeepGEMM on sm100", profiles=("sm100",)),
                  Only((64,), "DeepGEMM on sm90", profiles=("sm90",)),
                  Only((64, 128), "DeepGEMM-Ascend's page sizes", profiles=("ascend950",)))),
        Key("fp4", "bool", "FP4 queries and keys (packed, per-32 UE8M0 scales) instead of FP8", False,
            profiles=CUDA, only=(Only((False,), "FP4 MQA logits need sm100", profiles=("sm90",)),)),
        Key("clean", "bool", "clean_logits: -inf outside each row's KV range", True, kernels=_MQA, profiles=CUDA),
    ),
    (Rule("seq_kv >= seq", _seq_rule, ("seq", "seq_kv")),
     Rule("FP4 MQA takes head_dim 64 or 128", _fp4_dim_rule, ("fp4", "head_dim"))),
    aliases={"num_heads": "heads", "seq_len": "seq", "seq_len_kv": "seq_kv", "batch_size": "batch",
             "page_size": "block_kv", "dim": "head_dim", "clean_logits": "clean"},
)


def _ascend_pairs(sf: np.ndarray) -> np.ndarray:
    """float32 per-32 UE8M0 scales (..., D/32) -> int16 packed pairs (..., D/64)."""
    from .. import formats as fm

    by = (np.ascontiguousarray(sf).view(np.uint32) >> 23).astype(np.uint8)
    return fm.pack_ue8m0_int16(by)


def _to_e4m3(x: np.ndarray) -> np.ndarray:
    """``x.to(torch.float8_e4m3fn)`` as DeepGEMM's test casts unscaled FP8 queries: torch >= 2.12
    saturates to +-448 (ml_dtypes would give NaN; only adversarial values reach it)."""
    return np.clip(x.astype(np.float32), -448.0, 448.0).astype(E4M3)


def build_mqa(spec: CaseSpec, rng: np.random.Generator) -> BuiltCase:
    """An MQA logits case (keys: :data:`MQA_SCHEMA`)."""
    p = spec.resolved
    kernel = spec.kernel
    ascend = p.ascend
    heads, dim = p["heads"], p["head_dim"]
    fp4 = bool(p.get("fp4", False))
    if kernel in _PAGED:
        return _build_paged(spec, rng, heads, dim, fp4, ascend)
    seq, seq_kv = p["seq"], p["seq_kv"]
    q = randn_bf16(rng, (seq, heads, dim))
    kv = randn_bf16(rng, (seq_kv, dim))
    w = rng.standard_normal((seq, heads), dtype=np.float32)
    ks = np.zeros(seq, np.int32)
    ke = np.array([i + seq_kv - seq + 1 for i in range(seq)], np.int32)  # causal, as DeepGEMM's test
    inputs: dict[str, np.ndarray] = {"ks": ks, "ke": ke}
    if ascend:
        qq, qs = quant.per_token_cast_to_fp8(q.reshape(seq * heads, dim), use_ue8m0=True, gran_k=32)
        kq, ksf = quant.per_token_cast_to_fp8(kv, use_ue8m0=True, gran_k=32)
        inputs.update(q=qq.reshape(seq, heads, dim), q_sf=_ascend_pairs(qs).reshape(seq, heads, -1),
                      kv=kq, kv_sf=_ascend_pairs(ksf), w=w.astype(BF16))
        max_k = int((ke - ks).max())
        args = [_pair("q", "q_sf"), _pair("kv", "kv_sf"), _t("w"), _t("ks"), _t("ke"), _v(max_k)]
        kwargs: dict[str, ArgRef] = {}
        out_dtype, out_shape = "bfloat16", [seq, max_k]
        check = _check("bf16", dim + heads, u_acc=2.0**-8)  # bf16 head chain on the device
    else:
        if fp4:
            qq, qs = quant.per_token_cast_to_fp4(q.reshape(seq * heads, dim), use_ue8m0=True, gran_k=32,
                                                 use_packed_ue8m0=True)
            kq, ksf = quant.per_token_cast_to_fp4(kv, use_ue8m0=True, gran_k=32, use_packed_ue8m0=True)
            inputs.update(q=qq.reshape(seq, heads, dim // 2), q_sf=qs.reshape(seq, heads), kv=kq,
                          kv_sf=ksf.reshape(seq_kv), w=w)
            q_arg = _pair("q", "q_sf")
        else:
            inputs.update(q=_to_e4m3(q), w=w)
            kq, ksf = quant.per_custom_dims_cast_to_fp8(kv, (0,), False)
            inputs.update(kv=kq, kv_sf=ksf.reshape(seq_kv))  # the utility squeezes one token's scale to 0-d
            q_arg = ArgRef("pair", ("q", None))
        args = [q_arg, _pair("kv", "kv_sf"), _t("w"), _t("ks"), _t("ke")]
        kwargs = {"clean_logits": _v(bool(p["clean"]))}
        out_dtype, out_shape = "float32", [seq, seq_kv]
        check = _check("f32", dim + heads)
    outputs = {"logits": {"init": "returned", "shape": out_shape, "dtype": out_dtype}}
    return BuiltCase(spec, inputs, kernel, args, kwargs, outputs, {}, check, returns="logits")


def _build_paged(spec: CaseSpec, rng: np.random.Generator, heads: int, dim: int, fp4: bool,
                 ascend: bool) -> BuiltCase:
    batch = spec.resolved["batch"]
    block_kv = spec.resolved["block_kv"]
    ctx = np.array([int(rng.integers(block_kv // 2, 3 * block_kv)) for _ in range(batch)], np.int32)
    blocks_per = [ceil_div(int(c), block_kv) for c in ctx]
    max_blocks = max(blocks_per)
    num_blocks = sum(blocks_per) + 1
    perm = rng.permutation(num_blocks)
    table = np.zeros((batch, max_blocks), np.int32)
    pos = 0
    for i, nb in enumerate(blocks_per):
        table[i, :nb] = perm[pos:pos + nb]
        pos += nb
    q = randn_bf16(rng, (batch, 1, heads, dim))
    w = rng.standard_normal((batch, heads), dtype=np.float32)
    kv = randn_bf16(rng, (num_blocks * block_kv, dim))
    if ascend:
        vbytes, sbytes = dim, 2 * (dim // 64)
        kq, ksf = quant.per_token_cast_to_fp8(kv, use_ue8m0=True, gran_k=32)
        vals = kq.view(np.uint8).reshape(num_blocks, block_kv * dim)
        scales = _ascend_pairs(ksf).view(np.uint8).reshape(num_blocks, block_kv * sbytes)
        qq, qs = quant.per_token_cast_to_fp8(q.reshape(batch * heads, dim), use_ue8m0=True, gran_k=32)
        q_in, q_sf = qq.reshape(batch, 1, heads, dim), _ascend_pairs(qs).reshape(batch * heads, -1)
        w = w.astype(BF16)
    elif fp4:
        vbytes, sbytes = dim // 2, 4
        kq, ksf = quant.per_token_cast_to_fp4(kv, use_ue8m0=True, gran_k=32, use_packed_ue8m0=True)
        vals = kq.view(np.uint8).reshape(num_blocks, block_kv * vbytes)
        scales = np.ascontiguousarray(ksf).view(np.uint8).reshape(num_blocks, block_kv * 4)
        qq, qs = quant.per_token_cast_to_fp4(q.reshape(batch * heads, dim), use_ue8m0=True, gran_k=32,
                                             use_packed_ue8m0=True)
        q_in, q_sf = qq.reshape(batch, 1, heads, dim // 2), qs.reshape(batch, 1, heads)
    else:
        vbytes, sbytes = dim, 4
        kq, ksf = quant.per_custom_dims_cast_to_fp8(kv, (0,), False)
        vals = kq.view(np.uint8).reshape(num_blocks, block_kv * dim)
        scales = np.ascontiguousarray(ksf.astype(np.float32)).view(np.uint8).reshape(num_blocks, block_kv * 4)
        q_in, q_sf = _to_e4m3(q), None
    cache = np.concatenate([vals, scales], axis=1).reshape(num_blocks, block_kv, 1, vbytes + sbytes)
    inputs: dict[str, np.ndarray] = {"q": q_in, "kv_cache": cache, "w": w, "context_lens": ctx.reshape(batch, 1),
                                     "block_table": table}
    if q_sf is not None:
        inputs["q_sf"] = q_sf
    q_arg = ArgRef("pair", ("q", "q_sf" if q_sf is not None else None))
    max_ctx = max_blocks * block_kv
    if ascend:
        inputs["indices"] = np.arange(batch, dtype=np.int32)
        derived = [{"name": "schedule", "function": "get_paged_mqa_logits_metadata",
                    "args": [{"tensor": "context_lens"}, {"value": heads}, {"tensor": "indices"}]}]
        args = [q_arg, _t("kv_cache"), _t("w"), _t("context_lens"), _t("block_table"), _t("schedule"),
                _v(max_ctx), _t("indices")]
        kwargs: dict[str, ArgRef] = {}
        out_dtype = "bfloat16"
        check = _check("bf16", dim + heads, u_acc=2.0**-8)
    else:
        derived = [{"name": "num_sms", "function": "get_num_sms"},
                   {"name": "schedule", "function": "get_paged_mqa_logits_metadata",
                    "args": [{"tensor": "context_lens"}, {"value": block_kv}, {"tensor": "num_sms"}]}]
        args = [q_arg, _t("kv_cache"), _t("w"), _t("context_lens"), _t("block_table"), _t("schedule"), _v(max_ctx)]
        kwargs = {}
        out_dtype = "float32"
        check = _check("f32", dim + heads)
    outputs = {"logits": {"init": "returned", "shape": [batch, max_ctx], "dtype": out_dtype}}
    return BuiltCase(spec, inputs, spec.kernel, args, kwargs, outputs, {}, check, derived=derived, returns="logits")


def estimate_mqa(p: Params) -> Estimate:
    heads, dim = p["heads"], p["head_dim"]
    if p.kernel in _PAGED:
        batch, block = p["batch"], p["block_kv"]
        rows, cols = batch, 2.5 * block  # one query token per request; contexts < 3 block_kv, 2.5 on average
        kv_tokens = batch * 2.5 * block + block
    else:
        rows, cols = p["seq"], p["seq_kv"]
        kv_tokens = cols
    src = rows * heads * dim + kv_tokens * dim
    logits = rows * cols
    file = tensor_bytes((src, 1.2), (logits, 21), (rows * heads, 4))
    # the exact model keeps every head's (rows, cols) float64 products and their error terms,
    # and is about twice as slow per multiply-add as a dense GEMM's
    # measured (tracemalloc, every preset): 0.55 of the former bound with one pool thread, and
    # about 20 bytes per logit and head more for every further thread (each holds its heads' work)
    peak = PEAK_FIXED + (0.35 if p.kernel in _PAGED else 0.55) * (24 * src + 32 * logits * heads + 128 * logits) \
        + 20 * (num_threads() - 1) * logits * heads
    return Estimate.of(file, peak, 1.4 * logits * heads * dim, byte_work=400)  # fitted: every preset


def check_mqa_entry(entry: Any) -> str | None:
    """The max_context_len / max_k argument of an MQA case is the logits' column count."""
    cols = entry["outputs"]["logits"]["shape"][-1]
    values = [a["value"] for a in entry["args"] if "value" in a and isinstance(a["value"], int)]
    if any(v != cols for v in values):
        return f"the kernel's length argument {values} differs from the logits' columns {cols}"
    return None


register_family("mqa", build_mqa, schema=MQA_SCHEMA, estimate=estimate_mqa,
                functions=("get_paged_mqa_logits_metadata", "get_num_sms"), check_entry=check_mqa_entry,
                range=mqa_range)


def _smoke_cases() -> list[dict[str, Any]]:
    return [
        {"id": "sm100-grouped-psum-fp8", "kernel": "m_grouped_fp8_gemm_nt_contiguous", "profile": "sm100"},
        {"id": "sm100-grouped-mindices-bf16", "kernel": "m_grouped_bf16_gemm_nt_contiguous", "profile": "sm100",
         "psum": False},
        {"id": "sm90-grouped-mindices-fp8", "kernel": "m_grouped_fp8_gemm_nt_contiguous", "profile": "sm90",
         "psum": False},
        {"id": "sm100-grouped-masked-fp8", "kernel": "m_grouped_fp8_gemm_nt_masked", "profile": "sm100"},
        {"id": "sm100-kgrouped-fp8", "kernel": "k_grouped_fp8_gemm_tn_contiguous", "profile": "sm100", "k": 200},
        {"id": "ascend950-grouped-psum-fp8", "kernel": "m_grouped_fp8_gemm_nt_contiguous", "profile": "ascend950"},
        {"id": "ascend950-kgrouped-bf16", "kernel": "k_grouped_bf16_gemm_tn_contiguous", "profile": "ascend950",
         "k": 300},
        {"id": "sm100-einsum-bf16", "kernel": "einsum", "profile": "sm100"},
        {"id": "sm100-fp8-einsum", "kernel": "fp8_einsum", "profile": "sm100"},
        {"id": "ascend950-fp8-einsum", "kernel": "fp8_einsum", "profile": "ascend950"},
        {"id": "sm100-hc-prenorm", "kernel": "tf32_hc_prenorm_gemm", "profile": "sm100"},
        {"id": "ascend950-hc-prenorm", "kernel": "tf32_hc_prenorm_gemm", "profile": "ascend950"},
        {"id": "sm100-mqa-fp8", "kernel": "fp8_fp4_mqa_logits", "profile": "sm100"},
        {"id": "sm100-mqa-fp4", "kernel": "fp8_fp4_mqa_logits", "profile": "sm100", "fp4": True},
        {"id": "ascend950-mqa", "kernel": "fp8_fp4_mqa_logits", "profile": "ascend950"},
        {"id": "sm100-paged-mqa-fp8", "kernel": "fp8_fp4_paged_mqa_logits", "profile": "sm100"},
        {"id": "sm90-paged-mqa-fp8", "kernel": "fp8_fp4_paged_mqa_logits", "profile": "sm90", "heads": 32,
         "head_dim": 128},
        {"id": "ascend950-paged-mqa", "kernel": "fp8_fp4_paged_mqa_logits", "profile": "ascend950"},
    ]


def _small_cases() -> list[dict[str, Any]]:
    """Spec 14's grouped and attention lists, scaled down for two cores."""
    cases: list[dict[str, Any]] = []
    for groups, exp_m in ((4, 512), (8, 256)):
        for n, k in ((384, 448), (448, 192), (256, 256)):
            for profile, psum in (("sm100", True), ("sm100", False), ("ascend950", True)):
                cases.append({"id": f"{profile}-grouped-g{groups}-m{exp_m}-n{n}-k{k}-{'psum' if psum else 'mind'}",
                              "kernel": "m_grouped_fp8_gemm_nt_contiguous", "profile": profile, "groups": groups,
                              "m": exp_m, "n": n, "k": k, "psum": psum})
    for groups, exp_m in ((32, 12), (6, 64)):
        cases.append({"id": f"sm100-masked-g{groups}-m{exp_m}", "kernel": "m_grouped_fp8_gemm_nt_masked",
                      "profile": "sm100", "groups": groups, "m": exp_m, "n": 256, "k": 256})
    for groups, m, n, k in ((4, 256, 448, 512), (8, 448, 128, 256)):
        cases.append({"id": f"sm100-kgrouped-g{groups}-m{m}-n{n}-k{k}", "kernel": "k_grouped_fp8_gemm_tn_contiguous",
                      "profile": "sm100", "groups": groups, "m": m, "n": n, "k": k})
    for seq, seq_kv, heads in ((128, 512, 64), (128, 1024, 32)):
        cases.append({"id": f"sm100-mqa-s{seq}-kv{seq_kv}-h{heads}", "kernel": "fp8_fp4_mqa_logits",
                      "profile": "sm100", "seq": seq, "seq_kv": seq_kv, "heads": heads, "head_dim": 128})
    cases.append({"id": "sm100-paged-mqa-b16", "kernel": "fp8_fp4_paged_mqa_logits", "profile": "sm100",
                  "batch": 16, "heads": 64, "head_dim": 128})
    return cases


def _register_presets() -> None:
    from .presets import register_preset_cases

    register_preset_cases("smoke", _smoke_cases)
    register_preset_cases("deepgemm-tests-small", _small_cases)


_register_presets()
