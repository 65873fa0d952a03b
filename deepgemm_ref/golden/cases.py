"""Golden cases: specifications, input generation and the golden computation.

A *case specification* is a flat JSON/TOML table: ``id``, ``kernel`` (a public function name),
``profile`` and the kernel family's parameters (shapes, formats, recipe, output dtype, ``c``,
``alpha``, ``seed``).  Each family registers a builder that turns a specification into

* the inputs, stored contiguous in the dtypes the kernel API takes (user-form scales),
* the exact call (function, argument list, keyword values, which tensors are outputs),
* the layout transform each input needs before a device call, and
* the checker parameters (epilogue, rounding-path length ``n``).

Inputs are generated as DeepGEMM's test generators generate them (``tests/generators.py``:
seeded standard-normal bf16 matrices, then DeepGEMM's quantisers), with a NumPy generator seeded
by ``SeedSequence(seed, spawn_key=(crc32(case id),))``.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np

from .. import quant
from ..errors import DGArgumentError

__all__ = ["CaseSpec", "BuiltCase", "ArgRef", "build_case", "FAMILIES", "register_family", "family_of", "case_rng"]

BF16 = np.dtype(ml_dtypes.bfloat16)


@dataclass(frozen=True)
class CaseSpec:
    """One golden case.  ``params`` holds the family-specific fields (see each builder)."""

    id: str
    kernel: str
    profile: str
    seed: int = 0
    params: Mapping[str, Any] = field(default_factory=dict)

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> CaseSpec:
        for key in ("id", "kernel", "profile"):
            if key not in d:
                raise DGArgumentError(f"case specification: missing {key!r} in {dict(d)!r}")
        params = {k: v for k, v in d.items() if k not in ("id", "kernel", "profile", "seed")}
        return CaseSpec(str(d["id"]), str(d["kernel"]), str(d["profile"]), int(d.get("seed", 0)), params)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "kernel": self.kernel, "profile": self.profile, "seed": self.seed, **dict(self.params)}

    def get(self, key: str, default: Any = None) -> Any:
        return self.params.get(key, default)


@dataclass
class ArgRef:
    """One argument of the recorded call: a stored tensor, a (data, sf) pair, an output, or a value."""

    kind: str  # "tensor", "pair", "output", "value"
    names: tuple[str | None, ...] = ()
    value: Any = None

    def to_json(self) -> dict[str, Any]:
        if self.kind == "value":
            return {"value": self.value}
        if self.kind == "pair":
            return {"pair": list(self.names)}
        return {self.kind: self.names[0]}

    @staticmethod
    def from_json(j: Mapping[str, Any]) -> ArgRef:
        if "value" in j:
            return ArgRef("value", (), j["value"])
        if "pair" in j:
            return ArgRef("pair", tuple(j["pair"]))
        for kind in ("tensor", "output"):
            if kind in j:
                return ArgRef(kind, (j[kind],))
        raise DGArgumentError(f"manifest: unknown argument reference {dict(j)!r}")


@dataclass
class BuiltCase:
    """A generated case, before the golden computation."""

    spec: CaseSpec
    inputs: dict[str, np.ndarray]  # stored tensors (contiguous), by name
    function: str
    args: list[ArgRef]
    kwargs: dict[str, ArgRef]
    outputs: dict[str, dict[str, Any]]  # output name -> {"init": input name or "zeros", "shape", "dtype"}
    transforms: dict[str, dict[str, Any]] = field(default_factory=dict)
    check: dict[str, Any] = field(default_factory=dict)
    # Calls made before the kernel: ``setup`` (runtime settings, e.g. the contiguous-layout
    # alignment) and ``derived`` inputs computed by the library itself, in order (e.g. the
    # paged-MQA schedule): [{"name", "function", "args": [ArgRef json], "kwargs": {...}}].
    setup: list[dict[str, Any]] = field(default_factory=list)
    derived: list[dict[str, Any]] = field(default_factory=list)
    # The output that is the kernel's return value (MQA logits), if any.
    returns: str | None = None
    # A driver that makes the call instead of ``function(*args, **kwargs)`` (Mega MoE: buffers and
    # weight transforms on every rank): {"name": key of golden.moe.DRIVERS, ...its parameters}.
    driver: dict[str, Any] | None = None


Builder = Callable[[CaseSpec, np.random.Generator], BuiltCase]
FAMILIES: dict[str, Builder] = {}


def register_family(name: str, builder: Builder) -> None:
    """Make a kernel family available to specifications (``family_of`` maps kernels to it)."""
    FAMILIES[name] = builder


def family_of(kernel: str) -> str:
    """The family of a public kernel name."""
    if kernel.startswith(("fp8_fp4_gemm_", "fp8_gemm_", "bf16_gemm_", "cublaslt_gemm_", "aclnn_")):
        return "gemm" if "skip_head_mid" not in kernel else "gemm_skip_head_mid"
    if kernel.startswith(("m_grouped_", "k_grouped_", "fp8_m_grouped", "bf16_m_grouped")):
        return "grouped"
    if "mqa_logits" in kernel:
        return "mqa"
    if "mega_moe" in kernel:
        return "mega_moe"
    if kernel in ("einsum", "fp8_einsum", "tf32_hc_prenorm_gemm"):
        return "einsum"
    raise DGArgumentError(f"case specification: kernel: unknown kernel {kernel!r}")


def case_rng(spec: CaseSpec) -> np.random.Generator:
    """The case's generator: PCG64 seeded by SeedSequence(seed, spawn_key=(crc32(id),))."""
    seq = np.random.SeedSequence(spec.seed, spawn_key=(zlib.crc32(spec.id.encode()),))
    return np.random.Generator(np.random.PCG64(seq))


def build_case(spec: CaseSpec) -> BuiltCase:
    """Generate a case's inputs and call description."""
    fam = spec.get("family") or family_of(spec.kernel)
    if fam not in FAMILIES:
        raise DGArgumentError(f"case {spec.id!r}: kernel family {fam!r} ({spec.kernel}) has no golden builder yet")
    return FAMILIES[fam](spec, case_rng(spec))


# ----------------------------------------------------------------------------------------------
# Dense GEMMs
# ----------------------------------------------------------------------------------------------

def randn_bf16(rng: np.random.Generator, shape: tuple[int, ...], scale: float = 1.0) -> np.ndarray:
    """Standard-normal values rounded to bf16 (DeepGEMM's ``torch.randn(..., dtype=bf16)``)."""
    return (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)).astype(BF16)


def _quantise(x: np.ndarray, fmt: str, gran_k: int, ue8m0: bool, block: bool) -> tuple[np.ndarray, np.ndarray]:
    if fmt == "fp4":
        return quant.per_token_cast_to_fp4(x, use_ue8m0=ue8m0, gran_k=gran_k)
    if block:
        return quant.per_block_cast_to_fp8(x, use_ue8m0=ue8m0, gran_k=gran_k)
    return quant.per_token_cast_to_fp8(x, use_ue8m0=ue8m0, gran_k=gran_k)


def _out_dtype(name: str) -> np.dtype:
    if name not in ("bf16", "f32"):
        raise DGArgumentError(f"case specification: out: expected 'bf16' or 'f32'; got {name!r}")
    return BF16 if name == "bf16" else np.dtype(np.float32)


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


def build_gemm(spec: CaseSpec, rng: np.random.Generator) -> BuiltCase:
    """Dense GEMM cases.

    params: m, n, k; ``a`` / ``b``: "fp8", "fp4" or "bf16"; gran_k_a, gran_k_b (FP8/FP4 K
    granularity), gran_n (1, or 128 for a per-block SFB); out ("bf16" / "f32"); c ("none",
    "separate", "is_d"); alpha (float or None); the layout is the kernel's suffix.
    ``fp8_gemm_nt_skip_head_mid``: head_splits (left, mid, right), default (n // 2, 8, n // 2)
    for one head; d is (m, n + heads * mid) and the mid columns stay undefined.
    """
    kernel = spec.kernel
    skip = "skip_head_mid" in kernel
    layout = "nt" if skip else kernel[-2:]
    m, n, k = int(spec.get("m", 128)), int(spec.get("n", 128)), int(spec.get("k", 256))
    fa = spec.get("a", "bf16" if kernel.startswith(("bf16", "cublaslt", "aclnn_bf16")) else "fp8")
    fb = spec.get("b", None) or ("bf16" if fa == "bf16" else "fp8")
    out = _out_dtype(spec.get("out", "bf16"))
    c_mode = spec.get("c", "none")
    alpha = spec.get("alpha")
    profile = spec.profile
    ascend = profile == "ascend950"
    ue8m0 = bool(spec.get("ue8m0", profile != "sm90"))
    a_x = randn_bf16(rng, (m, k))
    b_x = randn_bf16(rng, (n, k))
    inputs: dict[str, np.ndarray] = {}
    kwargs: dict[str, ArgRef] = {}
    transforms: dict[str, dict[str, Any]] = {}
    if fa == "bf16":
        a_t, b_t = a_x, b_x
        pair = False
        recipe_desc: dict[str, Any] = {}
    else:
        gka = int(spec.get("gran_k_a", 32 if ascend else 128))
        gkb = int(spec.get("gran_k_b", 32 if (ascend or fb == "fp4") else 128))
        gran_n = int(spec.get("gran_n", 1))
        a_t, a_sf = _quantise(a_x, fa, gka, ue8m0, False)
        b_t, b_sf = _quantise(b_x, fb, gkb, ue8m0, gran_n != 1)
        pair = True
        if gka == gkb and gran_n in (1, 128):
            recipe = (1, gran_n, gka)
            recipe_desc = {"recipe": list(recipe)}
            kwargs["recipe"] = ArgRef("value", (), list(recipe))
            transforms["a_sf"] = _sf_transform(profile, m, k, recipe, True)
            transforms["b_sf"] = _sf_transform(profile, n, k, recipe, False)
        else:
            recipe_desc = {"recipe_a": [1, gka], "recipe_b": [gran_n, gkb]}
            kwargs["recipe_a"] = ArgRef("value", (), [1, gka])
            kwargs["recipe_b"] = ArgRef("value", (), [gran_n, gkb])
            transforms["a_sf"] = _sf_transform(profile, m, k, (), None, (1, gka))
            transforms["b_sf"] = _sf_transform(profile, n, k, (), None, (gran_n, gkb))
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
            transforms["b_sf"]["transpose_back"] = True
    # transpose_packed_fp4 gives the (K, MN / 2) storage of an MN-major FP4 operand, which is what
    # the T / N positions take (the kernel sees its (MN / 2, K) transposed view).
    inputs["a"], inputs["b"] = np.ascontiguousarray(a_t), np.ascontiguousarray(b_t)
    args = [ArgRef("pair", ("a", "a_sf")) if pair else ArgRef("tensor", ("a",)),
            ArgRef("pair", ("b", "b_sf")) if pair else ArgRef("tensor", ("b",)),
            ArgRef("output", ("d",))]
    init = "zeros"
    if c_mode in ("separate", "is_d"):
        inputs["c"] = randn_bf16(rng, (m, n), 32.0).astype(out)
        if c_mode == "separate":
            kwargs["c"] = ArgRef("tensor", ("c",))
        else:
            kwargs["c"] = ArgRef("output", ("d",))
            init = "c"
    elif c_mode != "none":
        raise DGArgumentError(f"case {spec.id!r}: c: expected 'none', 'separate' or 'is_d'; got {c_mode!r}")
    if alpha is not None:
        kwargs["alpha"] = ArgRef("value", (), float(alpha))
    if kernel.startswith("aclnn_"):
        transforms = {}  # ACLNN takes the float32 user form (int16 pairs are rejected)
    d_cols = n
    if skip:
        splits = [int(v) for v in spec.get("head_splits", [n // 2, 8, n - n // 2])]
        if len(splits) != 3 or c_mode != "none" or alpha is not None:
            raise DGArgumentError(f"case {spec.id!r}: skip_head_mid takes head_splits (left, mid, right) "
                                  "and neither c nor alpha")
        args.append(ArgRef("value", (), splits))
        d_cols = n + n // max(splits[0] + splits[2], 1) * splits[1]
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


register_family("gemm", build_gemm)
register_family("gemm_skip_head_mid", build_gemm)
