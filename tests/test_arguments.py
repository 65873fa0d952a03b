"""Argument guards of every public kernel and utility (issue 14, items 3, 5 and 6).

The kernels are taken from the reference signature lists (``deepgemm_ref/spec/*.json``): every
function with an output parameter (``d`` or ``y``) is called with a valid set of arguments
(built by the golden workflow's case builders where it has one, by hand otherwise), and then

* with its output sharing memory with each input in turn (a partial overlap of one buffer),
* with a read-only output, and with an output whose rows overlap each other,

and every one of those calls must raise ``DGArgumentError`` before anything is written (the
shared buffer is compared byte for byte).  Every size parameter of the signature lists is
driven to huge values: the argument error must come with a tracemalloc peak of a few MiB.
Coverage tests make sure no kernel and no size parameter is left out.
"""

from __future__ import annotations

import inspect
import json
import re
import tracemalloc
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as hs

import deepgemm_ref as dg
from deepgemm_ref import _C, formats, mega
from deepgemm_ref.errors import DGArgumentError
from deepgemm_ref.golden import build_case
from deepgemm_ref.golden.call import call_kernel, fresh_outputs, run_case_call
from deepgemm_ref.golden.cases import ArgRef
from deepgemm_ref.toolkit import sizes
from deepgemm_ref.toolkit.outputs import overlaps_itself, shares_memory
from tests.test_mega_moe import Problem, _pairs  # the Mega MoE test's problem builder

SPEC = Path(dg.__file__).resolve().parent / "spec"
BF16 = np.dtype(ml_dtypes.bfloat16)
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
F32 = np.dtype(np.float32)
CUDA = ("sm90", "sm100")
ASCEND = ("ascend950",)
#: A tracemalloc peak below this is "no large allocation".
SMALL_PEAK = 8 << 20


# ---------------------------------------------------------------------------------------------
# the kernels, from the signature lists
# ---------------------------------------------------------------------------------------------

def _signatures() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for file, target in (("deepgemm-signatures.json", "deepgemm"), ("deepgemm-ascend-signatures.json", "ascend")):
        for entry in json.loads((SPEC / file).read_text()):
            if entry["module"] in ("deep_gemm", "deep_gemm._C"):
                out.append((target, entry))
    return out


def _qualified(entry: dict[str, Any]) -> str:
    return ("_C." if entry["module"] == "deep_gemm._C" else "") + entry["name"]


def output_kernels() -> dict[str, set[str]]:
    """Every function with an output parameter (``d``, or Mega MoE's leading ``y``) -> its targets."""
    out: dict[str, set[str]] = {}
    for target, entry in _signatures():
        names = [p["name"] for p in entry["params"]]
        if "d" in names or names[:1] == ["y"]:
            out.setdefault(_qualified(entry), set()).add(target)
    return out


#: Output kernels the emulator does not run, with the reason (each raises NotImplementedError).
NOT_RUN = {
    "_C.fp8_fp4_mega_moe": "a raw binding over device addresses; the Python wrapper is the emulated kernel",
    "_C.bf16_mega_moe": "a raw binding over device addresses; the Python wrapper is the emulated kernel",
}


def _obj(module: Any, name: str) -> Any:
    """A public object whatever the active profile (profile namespaces hide the other target's names)."""
    return vars(module)[name] if name in vars(module) else getattr(module, name)


def _resolve(name: str) -> Callable[..., Any]:
    if name.startswith("_C."):
        return _obj(_C, name[3:])
    return _obj(dg, name)


# ---------------------------------------------------------------------------------------------
# valid calls
# ---------------------------------------------------------------------------------------------

@dataclass
class Call:
    """A valid call: ``fn(*args, **kwargs)`` writes the arrays ``outputs`` (by name)."""

    name: str
    profile: str
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    outputs: dict[str, np.ndarray]
    setup: Callable[[], None] = field(default=lambda: None)

    def run(self, args: tuple[Any, ...] | None = None, kwargs: dict[str, Any] | None = None) -> Any:
        dg.set_arch(self.profile)
        self.setup()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # DeepGEMM-Ascend's k-grouped NT wrapper warns
            return self.fn(*(self.args if args is None else args), **(self.kwargs if kwargs is None else kwargs))


class _Capture:
    """A module stand-in for the golden workflow's call: setup functions run, the kernel is captured."""

    def __init__(self, function: str) -> None:
        self.function = function
        self.call: tuple[tuple[Any, ...], dict[str, Any]] | None = None

    def __getattr__(self, name: str) -> Any:
        real = _obj(dg, name)
        if name != self.function:
            return real

        def grab(*args: Any, **kwargs: Any) -> None:
            self.call = (args, kwargs)
        return grab


def golden_call(kernel: str, profile: str, **keys: Any) -> Call:
    """The call of the golden workflow's case for ``kernel`` under ``profile`` (default keys)."""
    dg.set_arch(profile)
    built = build_case({"id": f"{profile}-{kernel}", "kernel": kernel, "profile": profile, **keys})
    outs = fresh_outputs(built.outputs, built.inputs)
    cap = _Capture(built.function)
    entry = {"function": built.function, "setup": built.setup, "derived": built.derived, "driver": None,
             "returns": built.returns}
    run_case_call(cap, entry, built.args, built.kwargs, dict(built.inputs), outs)
    assert cap.call is not None
    args, kwargs = cap.call
    setup = built.setup

    def redo_setup() -> None:  # the runtime settings the case's call needs (the autouse fixture resets them)
        for c in setup:
            call_kernel(dg, c["function"], [ArgRef.from_json(a) for a in c.get("args", [])],
                        {k: ArgRef.from_json(v) for k, v in c.get("kwargs", {}).items()}, {}, {})
    return Call(kernel, profile, _obj(dg, built.function), args, kwargs, outs, redo_setup)


def _fp8(shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32).astype(E4M3)


def _m_grouped_nn(kernel: str, profile: str) -> Call:
    """The NN variant of an m-grouped contiguous case: b given as (G, K, N) (a transposed view)."""
    nt = golden_call(kernel.replace("_nn_", "_nt_"), profile)
    bound = inspect.signature(nt.fn).bind(*nt.args, **nt.kwargs)
    b = bound.arguments["b"]
    if isinstance(b, tuple):
        bound.arguments["b"] = (b[0].transpose(0, 2, 1), b[1].transpose(0, 2, 1))
    else:
        bound.arguments["b"] = b.transpose(0, 2, 1)
    return Call(kernel, profile, _obj(dg, kernel), bound.args, bound.kwargs, nt.outputs, nt.setup)


def _k_grouped_nt(profile: str) -> Call:
    name = "k_grouped_fp8_gemm_nt_contiguous"
    rng = np.random.default_rng(1)
    if profile == "sm90":  # flat buffers, per-128 scales on both sides
        ks, m, n = [128, 256], 4, 8
        a, b = _fp8((sum(ks) * m,), rng), _fp8((sum(ks) * n,), rng)
        sfa = np.ones((m, sum(ks) // 128), F32)
        sfb = np.ones((n, sum(ks) // 128), F32)
        d = np.zeros((2, m, n), F32)
        return Call(name, profile, dg.k_grouped_fp8_gemm_nt_contiguous,
                    ((a, sfa), (b, sfb), d, ks, np.array(ks, np.int32)), {"c": d}, {"d": d})
    tn = golden_call("k_grouped_fp8_gemm_tn_contiguous", profile)  # ascend950: the transposed TN call
    bound = inspect.signature(tn.fn).bind(*tn.args, **tn.kwargs)
    for arg in ("a", "b"):
        x, sf = bound.arguments[arg]
        bound.arguments[arg] = (x.T, sf.T)
    return Call(name, profile, dg.k_grouped_fp8_gemm_nt_contiguous, bound.args, bound.kwargs, tn.outputs, tn.setup)


def _bmm(name: str) -> Call:
    rng = np.random.default_rng(2)
    batch, m, n, k = 2, 4, 8, 64
    d = np.zeros((batch, m, n), BF16)
    if name == "_C.bf16_bmm":
        a = rng.standard_normal((batch, m, k)).astype(BF16)
        b = rng.standard_normal((batch, n, k)).astype(BF16)
        return Call(name, "ascend950", _obj(_C, "bf16_bmm"), (a, b, d), {}, {"d": d})
    a, sfa = _fp8((batch, m, k), rng), np.ones((batch, m, k // 32), F32)
    b, sfb = _fp8((batch, n, k), rng), np.ones((batch, n, k // 32), F32)
    return Call(name, "ascend950", _obj(_C, "fp8_bmm"), ((a, sfa), (b, sfb), d), {}, {"d": d})


def _mega(name: str, profile: str) -> Call:
    """One rank (R = 1) of a small Mega MoE layer: y and the receive stats are its outputs."""
    p = Problem(1, 2, 4, 2, 512, 512, seed=3)
    group = mega.EmulatedGroup(1)
    n, stats = p.N[0], np.zeros(p.E_l, np.int32)
    y = np.zeros((n, p.H), BF16)
    dg.set_arch(profile)
    if profile == "ascend950":
        buf = mega.SymmBuffer(group.rank(0), p.E, n, p.K, p.H, p.I)
        buf.x[:n], buf.x_sf[:n] = p.xq[0], _pairs(p.x_sf32[0])
        l1, l2 = p.ascend_weights(0)
        args: tuple[Any, ...] = (y, l1, l2, buf, None, None, stats)
    elif name == "bf16_mega_moe":
        buf = mega.get_symm_buffer_for_mega_moe(group.rank(0), p.E, 384, p.K, p.H, p.I, mma_type="bf16xbf16")
        buf.x[:n] = p.x[0]
        l1, l2 = mega.transform_weights_for_mega_moe(p.w1_bf16, p.w2_bf16)
        args = (y, l1, l2, buf, stats)
    else:
        buf = mega.get_symm_buffer_for_mega_moe(group.rank(0), p.E, 384, p.K, p.H, p.I)
        buf.x[:n], buf.x_sf[:n] = p.xq[0], p.x_sf_packed[0]
        l1, l2 = p.cuda_weights(0)
        args = (y, l1, l2, buf, stats)
    buf.topk_idx[:n], buf.topk_weights[:n] = p.idx[0], p.w[0]
    return Call(name, profile, _obj(dg, name), args, {}, {"y": y, "cumulative_local_expert_recv_stats": stats})


#: Case keys where a kernel's defaults do not make a valid case under a profile.
KEYS = {
    ("fp8_fp4_gemm_nt", "sm90"): {"out": "f32", "c": "separate"},  # the 1D1D kernel accumulates into c
    ("fp8_gemm_nt", "sm90"): {"out": "f32", "c": "separate"},
    ("fp8_gemm_nt_skip_head_mid", "sm90"): {"gran_n": 128},  # the 1D2D recipe
    ("bf16_gemm_nt", "sm100"): {"c": "separate"},  # a separate c, to overlap d partly
    ("aclnn_bf16_gemm_nt", "ascend950"): {"c": "separate"},  # ACLNN's c is written too
}


def unsupported(name: str, profile: str) -> str | None:
    """Why ``name`` has no kernel under ``profile`` (None: it has one)."""
    if ("ascend" if profile == "ascend950" else "deepgemm") not in output_kernels()[name]:
        return "not in that target's signature list"
    if name in ("fp8_fp4_mega_moe", "bf16_mega_moe") and profile == "sm90":
        return "the Mega MoE kernels are sm100 only"
    if name == "k_grouped_fp8_gemm_nt_contiguous" and profile == "sm100":
        return "DeepGEMM's FP8 NT k-grouped GEMM is sm90 only"
    if name == "k_grouped_fp8_gemm_tn_contiguous" and profile == "sm90":
        return "DeepGEMM's FP8 TN k-grouped GEMM is sm100 only"
    if name in ("fp8_fp4_gemm_nn", "fp8_fp4_gemm_tn", "fp8_fp4_gemm_tt", "fp8_gemm_nn", "fp8_gemm_tn",
                "fp8_gemm_tt") and profile == "sm90":
        return "sm90's FP8 GEMMs take K-major operands only (NT)"
    return None


def valid_call(name: str, profile: str) -> Call | None:
    """A valid call of ``name`` under ``profile``, or None where the profile has no such kernel."""
    if unsupported(name, profile):
        return None
    if name in ("_C.fp8_bmm", "_C.bf16_bmm"):
        return _bmm(name)
    if name in ("fp8_fp4_mega_moe", "bf16_mega_moe"):
        return _mega(name, profile)
    if name == "k_grouped_fp8_gemm_nt_contiguous":
        return _k_grouped_nt(profile)
    if "_nn_contiguous" in name and name.startswith("m_grouped"):
        return _m_grouped_nn(name, profile)
    return golden_call(name, profile, **KEYS.get((name, profile), {}))


def _calls() -> list[tuple[str, str]]:
    """Every (kernel, profile) with a valid call."""
    return [(name, profile) for name in sorted(output_kernels()) if name not in NOT_RUN
            for profile in ("sm90", "sm100", "ascend950") if not unsupported(name, profile)]


_CACHE: dict[tuple[str, str], Call | None] = {}


def _call(name: str, profile: str) -> Call:
    key = (name, profile)
    if key not in _CACHE:
        _CACHE[key] = valid_call(name, profile)
    call = _CACHE[key]
    assert call is not None
    return call


# ---------------------------------------------------------------------------------------------
# rebuilding a call with some arrays replaced
# ---------------------------------------------------------------------------------------------

def _leaves(obj: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], np.ndarray]]:
    if isinstance(obj, np.ndarray):
        yield path, obj
    elif isinstance(obj, (tuple, list)):
        for i, v in enumerate(obj):
            yield from _leaves(v, path + (i,))


def _replace(obj: Any, swap: dict[int, np.ndarray]) -> Any:
    """``obj`` with every array whose id is in ``swap`` replaced."""
    if isinstance(obj, np.ndarray):
        return swap.get(id(obj), obj)
    if isinstance(obj, tuple):
        return tuple(_replace(v, swap) for v in obj)
    if isinstance(obj, list):
        return [_replace(v, swap) for v in obj]
    return obj


def _inputs(call: Call) -> list[tuple[str, np.ndarray]]:
    """The call's input arrays (outputs excluded), named by their argument path."""
    outs = {id(v) for v in call.outputs.values()}
    named = inspect.signature(call.fn).bind(*call.args, **call.kwargs).arguments
    found: dict[int, tuple[str, np.ndarray]] = {}
    for arg, value in named.items():
        for path, x in _leaves(value):
            if id(x) not in outs and x.size:
                found.setdefault(id(x), (arg + "".join(f"[{i}]" for i in path), x))
    return list(found.values())


def _view(buf: np.ndarray, offset: int, like: np.ndarray) -> np.ndarray:
    return np.ndarray(like.shape, like.dtype, buffer=buf, offset=offset, strides=like.strides)


def _span(x: np.ndarray) -> int:
    return x.itemsize + sum((n - 1) * s for n, s in zip(x.shape, x.strides, strict=True) if n > 1)


def _sharing(x: np.ndarray, out: np.ndarray, shift: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(buffer, x2, out2): x2 equal to x (same strides and values) and out2 like out, ``shift``
    bytes further (default one element of out: never the same array), overlapping it."""
    assert all(s >= 0 for s in x.strides + out.strides)
    shift = out.itemsize if shift is None else shift
    buf = np.zeros(max(_span(x), shift + _span(out)) + 64, np.uint8)
    x2 = _view(buf, 0, x)
    x2[...] = x
    out2 = _view(buf, shift, out)
    return buf, x2, out2


def _run_expecting(call: Call, swap: dict[int, np.ndarray], match: str, watch: list[np.ndarray], what: str) -> None:
    """The call with ``swap`` applied raises DGArgumentError matching ``match``; ``watch`` unchanged."""
    before = [w.copy() for w in watch]
    try:
        call.run(_replace(call.args, swap), {k: _replace(v, swap) for k, v in call.kwargs.items()})
    except DGArgumentError as e:
        assert re.search(match, str(e)), f"{call.name} ({call.profile}), {what}: {e}"
    else:
        pytest.fail(f"{call.name} ({call.profile}), {what}: no argument error")
    for w, b in zip(watch, before, strict=True):
        assert w.tobytes() == b.tobytes(), f"{call.name} ({call.profile}), {what}: written before the argument error"


# ---------------------------------------------------------------------------------------------
# coverage
# ---------------------------------------------------------------------------------------------

def test_every_output_kernel_of_the_signature_lists_has_a_valid_call():
    missing = []
    for name, targets in sorted(output_kernels().items()):
        if name in NOT_RUN:
            with pytest.raises(NotImplementedError):
                _raise_not_implemented(name)
            continue
        for target in targets:
            profiles = ASCEND if target == "ascend" else CUDA
            if not any(valid_call(name, p) is not None for p in profiles):
                missing.append((name, target))
    assert not missing, f"kernels without a valid call in this table: {missing}"


def _raise_not_implemented(name: str) -> None:
    fn = _resolve(name)
    params = inspect.signature(fn).parameters
    fn(*([None] * sum(p.default is inspect.Parameter.empty for p in params.values())))


@pytest.mark.parametrize(("name", "profile"), _calls())
def test_valid_call_runs(name, profile):
    call = _call(name, profile)
    before = {k: v.copy() for k, v in call.outputs.items()}
    call.run()
    assert any(not np.array_equal(v, before[k], equal_nan=True) for k, v in call.outputs.items()), \
        "the valid call wrote none of its outputs"


# ---------------------------------------------------------------------------------------------
# item 6: aliasing, read-only and self-overlapping outputs
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "profile"), _calls())
def test_output_sharing_memory_with_any_input_is_refused(name, profile):
    call = _call(name, profile)
    inputs = _inputs(call)
    assert inputs
    for out_name, out in call.outputs.items():
        for in_name, x in inputs:
            buf, x2, out2 = _sharing(x, out)
            assert shares_memory(x2, out2)
            watch = [buf] + [v for k, v in call.outputs.items() if k != out_name]
            _run_expecting(call, {id(x): x2, id(out): out2}, "shares no memory|sharing no memory|overlapping",
                           watch, f"{out_name} sharing memory with {in_name}")


@settings(max_examples=60)
@given(hs.sampled_from(_calls()), hs.data())
def test_fuzz_any_overlap_of_an_output_with_an_input_is_refused(case, data):
    """Random kernel, output, input and byte offset: wherever the two overlap, the argument error."""
    call = _call(*case)
    out_name = data.draw(hs.sampled_from(sorted(call.outputs)))
    out = call.outputs[out_name]
    in_name, x = data.draw(hs.sampled_from(_inputs(call)))
    align = np.lcm(out.itemsize, x.itemsize)
    shift = align * data.draw(hs.integers(0, max(_span(x) // align - 1, 0)))
    buf, x2, out2 = _sharing(x, out, shift)
    assume(shares_memory(x2, out2))
    _run_expecting(call, {id(x): x2, id(out): out2}, "shares no memory|sharing no memory|overlapping|c: expected d",
                   [buf] + [v for k, v in call.outputs.items() if k != out_name],
                   f"{out_name} sharing memory with {in_name} at byte {shift}")


@pytest.mark.parametrize(("name", "profile"), _calls())
def test_read_only_output_is_refused(name, profile):
    call = _call(name, profile)
    for out_name, out in call.outputs.items():
        ro = out.copy()
        ro.setflags(write=False)
        watch = [ro] + [v for k, v in call.outputs.items() if k != out_name]
        _run_expecting(call, {id(out): ro}, "writeable", watch, f"read-only {out_name}")


@pytest.mark.parametrize(("name", "profile"), _calls())
def test_output_overlapping_itself_is_refused(name, profile):
    call = _call(name, profile)
    for out_name, out in call.outputs.items():
        if out.ndim < 1 or out.shape[max(out.ndim - 2, 0)] < 2:
            continue
        axis = max(out.ndim - 2, 0)
        strides = list(out.strides)
        strides[axis] = 0  # every row at one address
        base = np.zeros(_span(out) + 64, np.uint8)
        bad = np.lib.stride_tricks.as_strided(base.view(out.dtype)[: out.size], out.shape, strides, writeable=True)
        assert overlaps_itself(bad)
        _run_expecting(call, {id(out): bad}, "overlap|contiguous|compact", [base], f"{out_name} overlapping itself")


def test_c_is_d_still_accumulates_in_place():
    """The documented aliasing keeps working: DeepGEMM's c is d, DeepGEMM-Ascend's ACLNN c."""
    rng = np.random.default_rng(4)
    a = rng.standard_normal((8, 64)).astype(BF16)
    b = rng.standard_normal((16, 64)).astype(BF16)
    for profile, fn in (("sm100", "bf16_gemm_nt"), ("ascend950", "bf16_gemm_nt"), ("ascend950", "aclnn_bf16_gemm_nt")):
        dg.set_arch(profile)
        d = rng.standard_normal((8, 16)).astype(np.float32)
        ref = d.copy()
        _obj(dg, fn)(a, b, d, c=d)
        expect = np.zeros_like(d)
        _obj(dg, fn)(a, b, expect, c=ref)
        if fn.startswith("aclnn"):  # the ACLNN addmm's result lands in c
            expect = ref
        assert np.array_equal(d, expect)


# ---------------------------------------------------------------------------------------------
# item 3: size arguments and zero-stride tensors
# ---------------------------------------------------------------------------------------------

#: Size-like parameters of the signature lists; each (function, parameter) must be driven huge
#: below or be listed in SIZE_EXEMPT.
SIZE_PARAMS = {"num_sms", "new_num_sms", "n", "max_context_len", "max_seqlen_k", "gran_k", "mn", "k", "num_groups",
               "expected_m", "expected_m_for_psum_layout", "block_kv", "num_experts", "num_max_tokens_per_rank",
               "num_topk", "hidden", "intermediate_hidden", "num_ring_tokens", "num_bytes", "num_shared_experts",
               "num_splits", "num_heads", "element_size", "k_alignment", "ks_cpu", "head_splits",
               "num_ranks", "num_experts_per_rank", "rank_idx"}
#: Size parameters whose name is not a size elsewhere (``x`` is an array in the quantisers).
SIZE_NAMED = {("get_tma_aligned_size", "x")}

#: (function, parameter) pairs not driven huge, with the reason.
SIZE_EXEMPT = {
    ("set_num_sms", "new_num_sms"): "bounded by the device's SM count (runtime settings, tests/test_profiles.py)",
    ("set_num_sms", "n"): "bounded by the device's AI-core count (runtime settings)",
    ("get_theoretical_mk_alignment_for_contiguous_layout", "expected_m"): "returns an int, nothing is allocated",
    ("_C.get_ring_limit_for_mega_moe", "num_experts_per_rank"): "returns two ints, nothing is allocated",
    ("_C.get_ring_limit_for_mega_moe", "num_max_tokens_per_rank"): "returns two ints, nothing is allocated",
    ("_C.get_ring_limit_for_mega_moe", "num_topk"): "returns two ints, nothing is allocated",
    ("_C.get_ring_limit_for_mega_moe", "num_ranks"): "returns two ints, nothing is allocated",
    ("_C.fp8_fp4_mega_moe", "num_max_tokens_per_rank"): "raw binding, not implemented",
    ("_C.fp8_fp4_mega_moe", "num_experts"): "raw binding, not implemented",
    ("_C.fp8_fp4_mega_moe", "num_topk"): "raw binding, not implemented",
    ("_C.fp8_fp4_mega_moe", "num_ring_tokens"): "raw binding, not implemented",
    ("_C.fp8_fp4_mega_moe", "hidden"): "raw binding, not implemented",
    ("_C.fp8_fp4_mega_moe", "intermediate_hidden"): "raw binding, not implemented",
    ("_C.fp8_fp4_mega_moe", "num_shared_experts"): "raw binding, not implemented",
    ("_C.fp8_fp4_mega_moe", "rank_idx"): "raw binding, not implemented",
    ("_C.bf16_mega_moe", "num_max_tokens_per_rank"): "raw binding, not implemented",
    ("_C.bf16_mega_moe", "num_experts"): "raw binding, not implemented",
    ("_C.bf16_mega_moe", "num_topk"): "raw binding, not implemented",
    ("_C.bf16_mega_moe", "num_ring_tokens"): "raw binding, not implemented",
    ("_C.bf16_mega_moe", "rank_idx"): "raw binding, not implemented",
    ("_C.SymmBuffer", "rank_idx"): "an index checked against num_ranks",
    ("fp8_fp4_paged_mqa_logits", "num_heads"): "not a parameter (DeepGEMM-Ascend's metadata takes it)",
}

HUGE = (2**31, 10**12, 2**40)


def _ctx() -> np.ndarray:
    return np.full((4, 1), 100, np.int32)


def _mqa_call(kernel: str, profile: str, **keys: Any) -> Call:
    return golden_call(kernel, profile, **keys)


def _with(call: Call, **changes: Any) -> Callable[[], Any]:
    """The call with some parameters changed (by name)."""
    def run() -> Any:
        dg.set_arch(call.profile)
        call.setup()
        bound = inspect.signature(call.fn).bind(*call.args, **call.kwargs)
        bound.arguments.update(changes)
        return call.fn(*bound.args, **bound.kwargs)
    return run


def _group() -> Any:
    return mega.EmulatedGroup(1).rank(0)


def _size_cases() -> list[tuple[str, str, str, Any, Callable[[Any], Callable[[], Any]]]]:
    """(function, parameter, profile, huge value, make(value) -> the call)."""
    sf = np.ones((2, 1), F32)
    x2 = np.ones((2, 64), np.float32)
    packed = np.zeros((2, 32), np.int8)
    cases: list[tuple[str, str, str, Any, Callable[[Any], Callable[[], Any]]]] = []

    def add(fn: str, param: str, profile: str, make: Callable[[Any], Callable[[], Any]],
            values: tuple[Any, ...] = HUGE) -> None:
        for v in values:
            cases.append((fn, param, profile, v, make))

    def direct(fn: str, profile: str, *args: Any, **kwargs: Any) -> Callable[[], Any]:
        def run() -> Any:
            dg.set_arch(profile)
            target = _resolve(fn)
            return target(*args, **kwargs)
        return run

    for p in CUDA:
        add("get_paged_mqa_logits_metadata", "num_sms", p,
            lambda v, p=p: direct("get_paged_mqa_logits_metadata", p, _ctx(), 64, v))
        add("get_paged_mqa_logits_metadata", "num_sms", p,
            lambda v, p=p: direct("get_paged_mqa_logits_metadata", p, _ctx(), 64, v), (2**31 - 2, 10**9))
        add("get_paged_mqa_logits_metadata", "block_kv", p,
            lambda v, p=p: direct("get_paged_mqa_logits_metadata", p, _ctx(), v, 132))
    add("get_paged_mqa_logits_metadata", "num_heads", "ascend950",
        lambda v: direct("get_paged_mqa_logits_metadata", "ascend950", _ctx(), v, np.zeros(4, np.int32)))
    for kernel in ("fp8_fp4_paged_mqa_logits", "fp8_paged_mqa_logits"):
        for p in (("sm100",) if kernel == "fp8_paged_mqa_logits" else ("sm100", "ascend950")):
            add(kernel, "max_context_len", p,
                lambda v, p=p, kernel=kernel: _with(_paged(kernel, p), max_context_len=v), HUGE + (2**31 - 1,))
    for kernel in ("fp8_fp4_mqa_logits", "fp8_mqa_logits"):
        for p in (("sm100",) if kernel == "fp8_mqa_logits" else ("sm100", "ascend950")):
            add(kernel, "max_seqlen_k", p,
                lambda v, p=p, kernel=kernel: _with(_plain(kernel, p), max_seqlen_k=v), HUGE + (2**31 - 1,))
    for fn in ("per_token_cast_to_fp8", "per_token_cast_to_fp4", "per_block_cast_to_fp8", "per_channel_cast_to_fp8"):
        add(fn, "gran_k", "sm100", lambda v, fn=fn: direct(fn, "sm100", x2, True, gran_k=v), HUGE + (2**30, 2**27))
    add("cast_back_from_fp4", "gran_k", "sm100", lambda v: direct("cast_back_from_fp4", "sm100", packed,
                                                                  np.ones((2, 1), F32), gran_k=v))
    sf_mn = np.ones((1, 1), F32)
    for p in ("sm90", "sm100", "ascend950"):
        recipe = (1, 1, 32) if p == "ascend950" else (1, 128)
        is_sfa = True if p == "ascend950" else None
        add("transform_sf_into_required_layout", "mn", p,
            lambda v, p=p, recipe=recipe, is_sfa=is_sfa: direct("transform_sf_into_required_layout", p, sf_mn, v, 128,
                                                                 recipe, None, is_sfa))
        add("transform_sf_into_required_layout", "k", p,
            lambda v, p=p, recipe=recipe, is_sfa=is_sfa: direct("transform_sf_into_required_layout", p, sf_mn, 1, v,
                                                                 recipe, None, is_sfa))
        add("transform_sf_into_required_layout", "num_groups", p,
            lambda v, p=p, recipe=recipe, is_sfa=is_sfa: direct("transform_sf_into_required_layout", p, sf_mn, 1, 128,
                                                                 recipe, v, is_sfa))
        # a broadcast SF of the shape mn asks for: the layout built from it is what would be huge
        big = 2**31 - 1
        add("transform_sf_into_required_layout", "mn", p,
            lambda v, p=p, is_sfa=is_sfa: direct(
                "transform_sf_into_required_layout", p,
                np.lib.stride_tricks.as_strided(np.ones(1, F32), (-(-v // 128), 1), (0, 4)), v, 128,
                (128, 128, 32) if p == "ascend950" else (128, 32), None, is_sfa), (big,))
    add("transform_k_grouped_sf_into_required_layout", "mn", "ascend950",
        lambda v: direct("transform_k_grouped_sf_into_required_layout", "ascend950", sf, v, 64, (1, 1, 32), True,
                         np.array([64], np.int32)))
    add("transform_k_grouped_sf_into_required_layout", "k", "ascend950",
        lambda v: direct("transform_k_grouped_sf_into_required_layout", "ascend950", sf, 2, v, (1, 1, 32), True,
                         np.array([64], np.int32)))
    add("get_tma_aligned_size", "x", "sm100", lambda v: direct("get_tma_aligned_size", "sm100", v, 4))
    add("get_tma_aligned_size", "element_size", "sm100", lambda v: direct("get_tma_aligned_size", "sm100", 8, v))
    add("get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor", "gran_k", "sm100",
        lambda v: direct("get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor", "sm100", np.ones((1, 4), F32),
                         np.array([128], np.int32), [128], v, 128))
    add("get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor", "k_alignment", "sm100",
        lambda v: direct("get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor", "sm100", np.ones((1, 4), F32),
                         np.array([128], np.int32), [128], 128, v))
    add("get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor", "ks_cpu", "sm100",
        lambda v: direct("get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor", "sm100", np.ones((1, 4), F32),
                         np.array([128], np.int32), [v], 128, 128))
    # grouped and dense kernels' integer arguments
    for kernel in ("m_grouped_fp8_gemm_nt_masked", "m_grouped_fp8_fp4_gemm_nt_masked", "fp8_m_grouped_gemm_nt_masked",
                   "m_grouped_bf16_gemm_nt_masked", "bf16_m_grouped_gemm_nt_masked"):
        add(kernel, "expected_m", "sm100", lambda v, kernel=kernel: _with(_call_cached(kernel, "sm100"), expected_m=v))
    for kernel in ("m_grouped_fp8_fp4_gemm_nt_contiguous", "m_grouped_fp8_gemm_nt_contiguous",
                   "m_grouped_bf16_gemm_nt_contiguous", "m_grouped_fp8_fp4_gemm_nn_contiguous",
                   "m_grouped_fp8_gemm_nn_contiguous", "m_grouped_bf16_gemm_nn_contiguous"):
        for p in (("ascend950",) if "_nn_" in kernel else ("sm100", "ascend950")):
            add(kernel, "expected_m_for_psum_layout", p,
                lambda v, p=p, kernel=kernel: _with(_call_cached(kernel, p), expected_m_for_psum_layout=v))
    for kernel in ("k_grouped_fp8_gemm_tn_contiguous", "k_grouped_bf16_gemm_tn_contiguous"):
        add(kernel, "ks_cpu", "sm100", lambda v, kernel=kernel: _with(_call_cached(kernel, "sm100"), ks_cpu=[v, 0]))
    add("k_grouped_fp8_gemm_nt_contiguous", "ks_cpu", "sm90",
        lambda v: _with(_call_cached("k_grouped_fp8_gemm_nt_contiguous", "sm90"), ks_cpu=[v, 0]))
    add("fp8_gemm_nt_skip_head_mid", "head_splits", "sm100",
        lambda v: _with(_call_cached("fp8_gemm_nt_skip_head_mid", "sm100"), head_splits=(v, 0, v)))
    for p in ("sm100", "ascend950"):
        add("tf32_hc_prenorm_gemm", "num_splits", p,
            lambda v, p=p: _with(_call_cached("tf32_hc_prenorm_gemm", p), num_splits=v))
    # Mega MoE buffers
    mega_sizes = {"num_experts": 8, "num_max_tokens_per_rank": 384, "num_topk": 2, "hidden": 512,
                  "intermediate_hidden": 512}
    for param in mega_sizes:
        for fn in ("SymmBuffer", "get_symm_buffer_for_mega_moe"):
            def make(v: Any, fn: str = fn, param: str = param) -> Callable[[], Any]:
                kw = dict(mega_sizes, **{param: v})
                if fn == "SymmBuffer":
                    return direct(fn, "sm100", _group(), kw["num_experts"], kw["num_max_tokens_per_rank"],
                                  kw["num_topk"], kw["hidden"], kw["intermediate_hidden"], 384)
                return direct(fn, "sm100", _group(), *kw.values())
            add(fn, param, "sm100", make)
            if fn == "SymmBuffer":
                add(fn, param, "ascend950", lambda v, param=param: direct(
                    "SymmBuffer", "ascend950", _group(),
                    *dict({"num_experts": 8, "num_max_tokens_per_rank": 256, "num_topk": 2, "hidden": 512,
                           "intermediate_hidden": 512}, **{param: v}).values()))
    # the buffer as a whole: every size within the int range, the bytes far beyond any memory
    add("SymmBuffer", "num_max_tokens_per_rank", "sm100",
        lambda v: direct("SymmBuffer", "sm100", _group(), 8, v, 2, 7168, 2048, v), (384 * 5_000_000,))
    add("SymmBuffer", "num_ring_tokens", "sm100",
        lambda v: direct("SymmBuffer", "sm100", _group(), 8, 384, 2, 512, 512, v))
    add("SymmBuffer", "num_shared_experts", "ascend950",
        lambda v: direct("SymmBuffer", "ascend950", _group(), 8, 256, 2, 512, 512, v))
    add("_C.SymmBuffer", "num_bytes", "ascend950", lambda v: direct("_C.SymmBuffer", "ascend950", 0, 1, "g", v),
        (2**50, 10**15))
    add("_C.SymmBuffer", "num_ranks", "ascend950", lambda v: direct("_C.SymmBuffer", "ascend950", 0, v, "g", 4096))
    for param, pos in (("num_ranks", 0), ("num_experts", 1), ("num_max_tokens_per_rank", 2), ("num_topk", 3),
                       ("hidden", 4), ("intermediate_hidden", 5), ("num_ring_tokens", 8)):
        base = [1, 8, 384, 2, 512, 512, "fp8xfp4", "swiglu", 384]
        base[pos] = None

        def make_size(v: Any, base: list[Any] = base, pos: int = pos) -> Callable[[], Any]:
            args = list(base)
            args[pos] = v
            return direct("_C.get_symm_buffer_size_for_mega_moe", "sm100", *args)
        add("_C.get_symm_buffer_size_for_mega_moe", param, "sm100", make_size)
    for param, pos in (("num_ranks", 0), ("num_experts", 1), ("num_max_tokens_per_rank", 2), ("num_topk", 3),
                       ("hidden", 4), ("intermediate_hidden", 5), ("num_shared_experts", 8)):
        base = [1, 8, 256, 2, 512, 512, "fp8xfp4", "swiglu", 0]

        def make_size_a(v: Any, base: list[Any] = base, pos: int = pos) -> Callable[[], Any]:
            args = list(base)
            args[pos] = v
            return direct("_C.get_symm_buffer_size_for_mega_moe", "ascend950", *args)
        add("_C.get_symm_buffer_size_for_mega_moe", param, "ascend950", make_size_a)
    return cases


def _call_cached(name: str, profile: str, **keys: Any) -> Call:
    key = (name + repr(sorted(keys.items())), profile)
    if key not in _CACHE:
        _CACHE[key] = valid_call(name, profile) if not keys and name in output_kernels() else \
            golden_call(name, profile, **keys)
    call = _CACHE[key]
    assert call is not None
    return call


def _paged(kernel: str, profile: str) -> Call:
    if kernel == "fp8_paged_mqa_logits":  # the legacy name: bare FP8 q, float32 logits
        call = _call_cached("fp8_fp4_paged_mqa_logits", profile)
        bound = inspect.signature(call.fn).bind(*call.args, **call.kwargs)
        args = dict(bound.arguments)
        args["q"] = args["q"][0]
        args.pop("logits_dtype", None)
        return Call(kernel, profile, dg.fp8_paged_mqa_logits, (), args, {}, call.setup)
    return _call_cached(kernel, profile)


def _plain(kernel: str, profile: str) -> Call:
    if kernel == "fp8_mqa_logits":
        call = _call_cached("fp8_fp4_mqa_logits", profile, clean=False)
        bound = inspect.signature(call.fn).bind(*call.args, **call.kwargs)
        args = dict(bound.arguments)
        args["q"] = args["q"][0]
        args.pop("logits_dtype", None)
        return Call(kernel, profile, dg.fp8_mqa_logits, (), args, {}, call.setup)
    return _call_cached(kernel, profile, **({} if profile == "ascend950" else {"clean": False}))


SIZE_CASES = _size_cases()


def test_every_size_parameter_of_the_signature_lists_is_driven_huge():
    covered = {(fn, param) for fn, param, _, _, _ in SIZE_CASES}
    missing = []
    for _target, entry in _signatures():
        name = _qualified(entry)
        for p in entry["params"]:
            key = (name, p["name"])
            is_size = p["name"] in SIZE_PARAMS or key in SIZE_NAMED
            if is_size and key not in covered and key not in SIZE_EXEMPT:
                missing.append(key)
    assert not missing, f"size parameters without a huge-value case: {sorted(set(missing))}"


@pytest.mark.parametrize(("fn", "param", "profile", "value", "make"), SIZE_CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[2]}-{c[3]}" for c in SIZE_CASES])
def test_huge_size_is_refused_before_any_large_allocation(fn, param, profile, value, make):
    """The argument error, and a tracemalloc peak of a few MiB.  Under a 1 GiB allocation limit,
    so that the sizes below the C++ int range are refused on any machine."""
    run = make(value)
    with sizes.limit_allocations(1 << 30):
        tracemalloc.start()
        try:
            with pytest.raises(DGArgumentError) as err:
                run()
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert peak < SMALL_PEAK, f"{fn}({param}={value}): peak {peak} bytes before the error"
    message = str(err.value)
    assert param in message or "memory" in message or "allocation limit" in message, message


def test_size_limit_can_be_lowered_for_a_block():
    x = np.ones((4, 4096), np.float32)
    dg.per_token_cast_to_fp8(x, True)
    with sizes.limit_allocations(1 << 20), pytest.raises(DGArgumentError, match="allocation limit"):
        dg.per_token_cast_to_fp8(x, True, gran_k=2**25)
    dg.per_token_cast_to_fp8(x, True, gran_k=2**25 // 4096)


@pytest.mark.parametrize("profile", ["sm100", "ascend950"])
def test_zero_stride_scales_of_the_wrong_shape_are_not_copied(profile):
    """A broadcast SF describing 10^12 elements: refused from its shape, nothing copied."""
    dg.set_arch(profile)
    rng = np.random.default_rng(5)
    a, b = _fp8((8, 128), rng), _fp8((16, 128), rng)
    good_a = np.ones((8, 4 if profile == "ascend950" else 1), np.float32)
    huge = np.broadcast_to(np.float32(1.0), (10**6, 10**6))
    small_wrong = np.broadcast_to(np.float32(1.0), (3, 7))
    d = np.zeros((8, 16), BF16)
    for sf in (huge, small_wrong):
        tracemalloc.start()
        try:
            with pytest.raises(DGArgumentError, match=r"b\[1\]"):
                dg.fp8_gemm_nt((a, good_a), (b, sf), d)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < SMALL_PEAK
        assert not d.any()


def test_zero_stride_operand_too_large_to_work_on_is_refused():
    a = np.broadcast_to(np.asarray(1.0, BF16), (4, 2**36))
    b = np.broadcast_to(np.asarray(1.0, BF16), (8, 2**36))
    d = np.zeros((4, 8), np.float32)
    tracemalloc.start()
    try:
        with pytest.raises(DGArgumentError, match="broadcast"):
            dg.bf16_gemm_nt(a, b, d)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < SMALL_PEAK and not d.any()


def test_size_arguments_use_the_cpp_int_range():
    assert sizes.size_arg("f", "n", 2**31 - 1) == 2**31 - 1
    with pytest.raises(DGArgumentError, match=r"f: n: expected an int <= 2147483647"):
        sizes.size_arg("f", "n", 2**31)
    with pytest.raises(DGArgumentError, match="an int >= 0"):
        sizes.size_arg("f", "n", -1)
    with pytest.raises(DGArgumentError, match="an int"):
        sizes.size_arg("f", "n", True)
    assert sizes.nbytes((2**40, 2**40), 8) == 2**83  # Python ints: no overflow


# ---------------------------------------------------------------------------------------------
# the checks' own definitions
# ---------------------------------------------------------------------------------------------

def test_overlap_and_sharing_definitions():
    x = np.zeros((4, 6), np.float32)
    assert not overlaps_itself(x) and not overlaps_itself(x.T) and not overlaps_itself(x[:, ::2])
    assert overlaps_itself(np.lib.stride_tricks.as_strided(x, (4, 6), (0, 4)))
    assert overlaps_itself(np.lib.stride_tricks.as_strided(x, (4, 6), (8, 4)))  # rows overlap by 4 elements
    assert not overlaps_itself(np.lib.stride_tricks.as_strided(x, (0, 6), (0, 4)))  # empty
    assert not overlaps_itself(np.lib.stride_tricks.as_strided(x, (1, 6), (0, 4)))  # one row
    assert shares_memory(x[:2], x[1:3]) and not shares_memory(x[:2], x[2:])
    assert not shares_memory(x[:, ::2], x[:, 1::2])  # interleaved columns share no element
    assert not shares_memory(x[:0], x)


def test_partly_overlapping_c_is_refused_and_d_untouched():
    rng = np.random.default_rng(6)
    a = rng.standard_normal((8, 64)).astype(BF16)
    b = rng.standard_normal((16, 64)).astype(BF16)
    buf = np.zeros(8 * 16 + 16, np.float32)
    d, c = buf[:128].reshape(8, 16), buf[16:144].reshape(8, 16)
    with pytest.raises(DGArgumentError, match="c: expected d itself"):
        dg.bf16_gemm_nt(a, b, d, c=c)
    assert not buf.any()


# ---------------------------------------------------------------------------------------------
# item 5: normal runs print no Python warnings
# ---------------------------------------------------------------------------------------------

def test_decoding_every_bf16_and_float32_pattern_warns_nothing():
    codes16 = np.arange(1 << 16, dtype=np.uint32)
    codes32 = np.array([0x7F800001, 0xFF800001, 0x7FC00000, 0x7F800000, 0, 0x80000000, 1], np.uint32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        v16 = formats.decode(codes16, formats.BF16)
        v32 = formats.decode(codes32, formats.F32)
        r = formats.f64_to_f32_round_odd(np.array([1e300, -1e300, np.inf, np.nan, 1e-300]))
    assert np.isnan(v16[0x7F81]) and np.isnan(v32[0]) and np.isinf(r[0])


def test_a_kernel_call_warns_nothing():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((8, 256)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        a = dg.per_token_cast_to_fp8(x, True)
        b = dg.per_token_cast_to_fp8(x[:4], True)
        d = np.zeros((8, 4), BF16)
        dg.fp8_gemm_nt(a, b, d, recipe=(1, 1, 128))
    assert np.isfinite(d.astype(np.float32)).all() and d.any()


@pytest.mark.parametrize(("profile", "name"), [("sm100", "cublaslt_gemm_nt"), ("ascend950", "cublaslt_gemm_nt"),
                                               ("ascend950", "aclnn_bf16_gemm_nt"), ("ascend950", "aclnn_fp8_fp4_gemm_nt")])
def test_a_keyword_the_real_signature_lacks_is_pythons_type_error(profile, name):
    """cuBLASLt and ACLNN GEMMs have no ``alpha`` in either signature list: Python's TypeError, as
    for the real bindings, and nothing is written."""
    for target, entry in _signatures():
        if entry["name"] == name and (target == "ascend") == (profile == "ascend950"):
            assert "alpha" not in {p["name"] for p in entry["params"]}
    dg.set_arch(profile)
    d = np.zeros((4, 8), np.float32)
    with pytest.raises(TypeError, match="alpha"):
        _obj(dg, name)(np.ones((4, 64), BF16), np.ones((8, 64), BF16), d, alpha=2.0)
    assert not d.any()


def test_products_too_large_for_the_working_copies_are_refused_first():
    """A product whose float64 working copies exceed the limit: the argument error, d untouched."""
    rng = np.random.default_rng(8)
    a = rng.standard_normal((2048, 4096)).astype(BF16)
    b = rng.standard_normal((2048, 4096)).astype(BF16)
    d = np.zeros((2048, 2048), np.float32)
    with sizes.limit_allocations(80 << 20), pytest.raises(DGArgumentError, match="float64 working copies"):
        dg.bf16_gemm_nt(a, b, d)
    assert not d.any()
    grouped = np.zeros((2, 2048, 2048), np.float32)
    with sizes.limit_allocations(80 << 20), pytest.raises(DGArgumentError, match="float64 working copies"):
        dg.k_grouped_bf16_gemm_tn_contiguous(np.ascontiguousarray(a.T), np.ascontiguousarray(b.T), grouped,
                                             [4096, 0], np.array([4096, 0], np.int32), c=grouped)
    assert not grouped.any()
