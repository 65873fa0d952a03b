"""The golden workflow's DeepEP families (``ep_dispatch``, ``ep_combine``): specs, goldens from the
pure math layer equal to the buffers bit for bit, the device-order rule of the check, the combine's
bound, the real-module path, and the cases' place in the presets (the DeepEP issue, items 3, 4, 8)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import deepgemm_ref as dg
import deepgemm_ref.ep as deep_ep
from deepgemm_ref import golden
from deepgemm_ref.golden import ep as gep
from deepgemm_ref.golden.bundle import BundleError, manifest_digest
from deepgemm_ref.golden.cases import SpecError, validate_spec
from deepgemm_ref.strategies import Case, cases
from deepgemm_ref.testing import assert_matches_golden

from .standin import EP_BIAS_TWICE, EP_DROPS_SLOT, ep_port, replay_through, standin
from .test_diagnose import ep_owners_by_rank, ep_stale_padding

ROOT = Path(__file__).resolve().parent.parent
BF16 = np.dtype(ml_dtypes.bfloat16)


def _spec(i: str, kernel: str, profile: str = "sm100", **kw: Any) -> dict[str, Any]:
    return {"id": i, "kernel": kernel, "profile": profile, **kw}


def _bytes_equal(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.view(np.uint8).tobytes() == b.view(np.uint8).tobytes()


#: Configurations whose every output the buffers must give bit for bit as the math layer does.
CONFIGS = [
    _spec("d", "ep_dispatch"),
    _spec("d-even", "ep_dispatch", uneven=False, weights=False, masked=0.0),
    _spec("d-fp8", "ep_dispatch", fp8=True, col_major_sf=True, ranks=3, experts=6, topk=3),
    _spec("d-nosync", "ep_dispatch", cpu_sync=False, ranks=3, experts=9, topk=2),
    _spec("d-expand", "ep_dispatch", expand=True, alignment=4, zero_padding=True, fp8=True, sf="ue8m0",
          hidden=256),
    _spec("d-expand-nosync", "ep_dispatch", expand=True, alignment=8, cpu_sync=False, masked=0.5),
    _spec("d-asc", "ep_dispatch", "ascend950", fp8=True, alignment=2),
    _spec("d-asc-nosync", "ep_dispatch", "ascend950", cpu_sync=False, col_major_sf=True, fp8=True),
    _spec("c", "ep_combine", bias=2),
    _spec("c-nobias", "ep_combine", bias=0, weights=False, ranks=3, experts=6, topk=3),
    _spec("c-expand", "ep_combine", expand=True, alignment=4, bias=1),
    _spec("c-slots", "ep_combine", expand=True, multiple_reduction=False, bias=2, cpu_sync=False),
    _spec("c-asc", "ep_combine", "ascend950", hidden=64, bias=2),
]


@pytest.mark.parametrize("spec", CONFIGS, ids=lambda s: s["id"])
def test_the_buffers_give_the_math_layer_goldens_bit_for_bit(spec):
    """Replayed through deepgemm_ref.ep's buffers (threads, in their canonical order), every output,
    fill rows, padding and tails included, is byte for byte the pure-math golden."""
    case = Case.from_spec(spec)
    got = case.call()
    gold = case.golden()
    for name in case.outputs:
        assert _bytes_equal(got[name], gold[name]), name
    assert_matches_golden(case, got)


@pytest.mark.parametrize("recipe,bias", [("local", 0), ("local", 2), ("slots", 1)])
def test_the_golden_is_deeps_recipe_and_the_variant_engine_without_a_variant_is_too(recipe, bias):
    rng = np.random.default_rng(7)
    t, k, h, e, r = 12, 5, 64, 16, 4
    idx = np.stack([rng.permutation(e)[:k] for _ in range(t)]).astype(np.int64)
    idx[rng.random((t, k)) < 0.2] = -1
    # values whose float32 sums round and cancel: a +-2^24 pair in the first two slots of every token
    y = rng.standard_normal((t, k, h)).astype(BF16)
    y[:, 0] = np.float32(2.0**24)
    y[:, 1] = np.float32(-(2.0**24))
    idx[:, :2] = np.stack([rng.permutation(4)[:2] * 4 for _ in range(t)])  # on two different ranks
    y[idx < 0] = 0
    biases = [rng.standard_normal((t, h)).astype(BF16) for _ in range(bias)]
    arg = None if not biases else (biases[0] if bias == 1 else tuple(biases))
    ref = deep_ep.reduction.combine_reference(y, idx, e, r, arg, recipe)
    mine = gep.combine_variant(y, idx, e, r, biases, recipe, {})
    assert _bytes_equal(ref, mine)
    assert not _bytes_equal(ref, gep.combine_variant(y, idx, e, r, biases, recipe, {"order": "reverse"}))


def test_goldens_store_the_recipe_the_exact_sum_and_the_bound():
    case = Case.from_spec(_spec("c", "ep_combine", bias=2, values="adversarial", ranks=4, experts=8))
    g = case.golden()
    assert set(g) >= {"combined_x", "combined_topk_weights", "acc", "S", "S_hard", "defined", "extra.exact"}
    assert g.check["n"] == 2 + 4 and g.check["u_acc"] == 2.0**-24 and g.check["epilogue"]["out"] == "bf16"
    d = g["defined"]
    assert d.any() and not d.all()  # uneven ranks: rows past a rank's tokens are not checked
    assert np.all(g["S_hard"] >= g["S"])
    # the exact sum rounded once and the recipe differ on values where float32 rounds
    assert not np.array_equal(g["extra.exact"][d].view(np.uint16), g["combined_x"][d].view(np.uint16))


def test_flip_allowance_covers_a_partial_whose_rounding_another_order_moves():
    # three slots of one owner: (1 + 2^-8) lands on a bf16 tie once 2^-30 is lost in float32
    a, b, c = 1.0, 2.0**-8, 2.0**-30
    y = np.array([[[a], [b], [c]]], np.float64).astype(np.float32).astype(BF16)
    idx = np.array([[0, 1, 2]], np.int64)
    allow = gep.flip_allowance(y, idx, 4, 1, "local")
    assert allow[0, 0] == 2.0**-7  # one bf16 step at 1
    far = np.array([[[1.0], [0.25], [0.5]]], np.float32).astype(BF16)
    assert gep.flip_allowance(far, idx, 4, 1, "local")[0, 0] == 0.0  # no tie within reach
    assert gep.flip_allowance(y, idx, 4, 1, "slots")[0, 0] == 0.0  # no partials


# ----------------------------------------------------------------------------------------------
# the check: a device's own order, defined elements, the combine's bound
# ----------------------------------------------------------------------------------------------

def _reverse_order(buf: Any, correct: Any, *args: Any, **kw: Any) -> Any:
    """A correct port in another order: received rows reversed (metadata with them); expanded,
    every expert's slot rows reversed, the metadata's slot columns rewritten to follow."""
    recv_x, idx, w, h, ev = correct(*args, **kw)
    meta = np.asarray(h.recv_src_metadata)
    k = meta.shape[1] - 2
    n = int(np.asarray(h.psum_num_recv_tokens_per_scaleup_rank)[-1])
    slots = slice(0, k) if buf._ascend else slice(2, 2 + k)
    xs = list(recv_x) if isinstance(recv_x, tuple) else [recv_x]
    if not h.do_expand:
        for a in xs + [x for x in (idx, w) if x is not None]:
            a[:n] = a[:n][::-1].copy()
    else:
        rows = xs[0].shape[0]
        perm = np.arange(rows)
        start = 0
        for end in np.asarray(h.psum_num_recv_tokens_per_expert).tolist():
            perm[start:end] = perm[start:end][::-1]
            start = -(-end // h.expert_alignment) * h.expert_alignment
        for a in xs + ([w] if w is not None else []):
            a[...] = a[perm].copy()
        new = np.empty(rows, np.int64)
        new[perm] = np.arange(rows)
        sl = meta[:n, slots]
        meta[:n, slots] = np.where(sl >= 0, new[np.maximum(sl, 0)], -1)
    meta[:n] = meta[:n][::-1].copy()
    return recv_x, idx, w, h, ev


REVERSED = standin("ep_reversed", ep=ep_port("ep_port_reversed", dispatch=_reverse_order))


def _replay(tmp_path: Path, specs: list[dict[str, Any]], module: Any) -> tuple[Path, Path]:
    bundle = tmp_path / "b"
    golden.generate(specs, bundle, force=True)
    profiles = {s.get("profile") for s in specs}
    out = tmp_path / f"{module.__name__}.safetensors"
    if len(profiles) == 1:
        replay_through(bundle, module, out)
    else:
        res = golden.replay(bundle, out, module=module.__name__, use_torch=False, force=True)
        assert not res.errors
    return bundle, out


def test_a_device_in_its_own_order_passes_and_a_misplaced_payload_fails(tmp_path):
    specs = [_spec("d", "ep_dispatch", fp8=True), _spec("d-exp", "ep_dispatch", expand=True, alignment=4,
                                                         zero_padding=True, fp8=True),
             _spec("c", "ep_combine"), _spec("c-exp", "ep_combine", expand=True)]
    bundle, out = _replay(tmp_path, specs, REVERSED)
    raw = golden.load_outputs(out)
    b = golden.load_bundle(bundle)
    for cid in ("d", "d-exp"):  # the device's rows really are in another order
        assert not np.array_equal(raw[f"{cid}/recv_x"], b.case(cid).golden()["recv_x"])
    reports = golden.check(bundle, out)
    assert all(r.status == "pass" for r in reports), [(r.id, r.status) for r in reports if r.status != "pass"]
    # the rows moved without their metadata: the check finds it
    for cid in ("d", "d-exp"):
        outs = dict(raw)
        x = outs[f"{cid}/recv_x"].copy()
        x[0, [0, 1]] = x[0, [1, 0]]
        outs[f"{cid}/recv_x"] = x
        [rep] = [r for r in golden.check_outputs(b, outs, cases=[cid]) if r.id == f"{cid}/recv_x"]
        assert rep.status == "fail" and rep.failed > 0


def _garbage_where_undefined(buf: Any, correct: Any, *args: Any, **kw: Any) -> Any:
    """Bytes the contract leaves undefined: tails without CPU sync, padding without zero padding,
    the non-expanded weights of slots on other ranks, the metadata's slot columns (non-expanded)."""
    recv_x, idx, w, h, ev = correct(*args, **kw)
    meta = np.asarray(h.recv_src_metadata)
    n = int(np.asarray(h.psum_num_recv_tokens_per_scaleup_rank)[-1])
    xs = list(recv_x) if isinstance(recv_x, tuple) else [recv_x]
    if not h.do_expand:
        for a in xs:
            a[n:].view(np.uint8)[...] = 0x7B
        if w is not None:
            w[:n][np.asarray(idx)[:n] < 0] = 123.0
        meta[:n, 2:] = 77
        meta[n:] = 55
    else:
        psum = np.asarray(h.psum_num_recv_tokens_per_expert)
        start = 0
        for end in psum.tolist():
            top = -(-end // h.expert_alignment) * h.expert_alignment
            for a in xs:
                a[end:top].view(np.uint8)[...] = 0x7B
            start = top
        for a in xs:
            a[start:].view(np.uint8)[...] = 0x7C
        meta[n:] = 55
    return recv_x, idx, w, h, ev


def test_undefined_bytes_are_not_checked_and_defined_ones_are(tmp_path):
    port = standin("ep_garbage", ep=ep_port("ep_port_garbage", dispatch=_garbage_where_undefined))
    specs = [_spec("nosync", "ep_dispatch", cpu_sync=False, fp8=True),
             _spec("exp-nosync", "ep_dispatch", expand=True, alignment=4, cpu_sync=False, fp8=True),
             _spec("exp-pad", "ep_dispatch", expand=True, alignment=4, zero_padding=True)]
    bundle, out = _replay(tmp_path, specs, port)
    by = {r.id: r for r in golden.check(bundle, out)}
    assert all(r.status == "pass" for i, r in by.items() if not i.startswith("exp-pad")), by
    # with do_zero_padding the padding is defined: zero
    assert by["exp-pad/recv_x"].status == "fail" and by["exp-pad/recv_x"].failed > 0
    # stale padding rows pass without zero padding, fail with it
    spec2 = [_spec("pad-off", "ep_dispatch", expand=True, alignment=8),
             _spec("pad-on", "ep_dispatch", expand=True, alignment=8, zero_padding=True)]
    stale = standin("ep_stale", ep=ep_port("ep_port_stale", dispatch=ep_stale_padding))
    bundle2, out2 = _replay(tmp_path / "two", spec2, stale)
    by2 = {r.id: r.status for r in golden.check(bundle2, out2)}
    assert by2["pad-off/recv_x"] == "pass" and by2["pad-on/recv_x"] == "fail"


def test_another_summation_order_passes_the_bound_and_fails_a_bitwise_check(tmp_path):
    """The owners' partials added in rank order (not master-slot order): on adversarial values a
    few elements differ from DeepEP's recipe (this case's draw has some); the default check passes
    them within the bound, a bitwise one fails exactly them."""
    base = {"id": "order", "kernel": "ep_combine", "profile": "sm100", "ranks": 4, "experts": 8, "topk": 4,
            "bias": 2, "values": "adversarial", "tokens": 16}
    port = standin("ep_by_rank", ep=ep_port("ep_port_by_rank", combine=ep_owners_by_rank))
    got = {}
    for mode in ("bound", "bitwise"):
        bundle, out = _replay(tmp_path / mode, [{**base, "combine_check": mode}], port)
        raw = golden.load_outputs(out)["order/combined_x"]
        gold = golden.load_bundle(bundle).case("order").golden()
        d = gold["defined"]
        differs = raw[d].view(np.uint16) != gold["combined_x"][d].view(np.uint16)
        assert differs.any()  # the order changes some bits
        got[mode] = (next(r for r in golden.check(bundle, out) if r.id == "order/combined_x"), int(differs.sum()))
    rep, _ = got["bound"]
    assert rep.status in ("pass", "warn") and rep.failed == 0
    rep, n = got["bitwise"]
    assert rep.status == "fail" and rep.failed == n


def test_a_wrong_combine_fails_the_bound(tmp_path):
    bundle, out = _replay(tmp_path, [_spec("c", "ep_combine", bias=1, ranks=3, experts=6)], EP_BIAS_TWICE)
    rep = next(r for r in golden.check(bundle, out) if r.id == "c/combined_x")
    assert rep.status == "fail" and rep.failed > rep.checked // 2


# ----------------------------------------------------------------------------------------------
# specifications, manifests, presets, estimates
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("spec,words", [
    (_spec("x", "ep_combine", hidden=128), "a multiple of 256"),
    (_spec("x", "ep_dispatch", "ascend950", expand=False), "expand-only"),
    (_spec("x", "ep_dispatch", zero_padding=True), "'zero_padding' is not read"),
    (_spec("x", "ep_dispatch", "ascend950", fp8=True, sf="ue8m0"), "'sf' is not read"),
    (_spec("x", "ep_dispatch", ranks=3, experts=8), "multiple of ranks"),
    (_spec("x", "ep_dispatch", topk=9, experts=8), "topk must be at most"),
    (_spec("x", "ep_combine", "ascend950", expand=True, multiple_reduction=False), "requires multiple reduction"),
    (_spec("x", "ep_dispatch", fp8=True, hidden=40), "a multiple of 16"),
    (_spec("x", "ep_combine", bias=3), "'bias'"),
    (_spec("x", "ep_dispatch", num_experts=8), "did you mean 'experts'"),
])
def test_specs_are_checked_against_the_schema(spec, words):
    with pytest.raises(SpecError) as err:
        validate_spec(spec)
    assert words in str(err.value)


def test_the_manifest_records_the_driver_and_a_forged_one_is_refused(tmp_path):
    bundle = tmp_path / "b"
    golden.generate([_spec("c", "ep_combine")], bundle)
    m = json.loads((bundle / "manifest.json").read_text())
    entry = m["cases"][0]
    assert entry["driver"]["name"] == "ep_combine" and entry["driver"]["tokens"] == [8, 7]
    assert entry["outputs"]["combined_x"]["shape"] == [2, 8, 256]
    entry["driver"]["tokens"] = [8, 9]  # more tokens than the stored tensors hold
    m["manifest_sha256"] = manifest_digest(m)
    (bundle / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(BundleError, match="tokens"):
        golden.load_bundle(bundle)


def test_presets_hold_both_families_under_both_profiles():
    smoke = [c for c in golden.preset("smoke") if c["kernel"].startswith("ep_")]
    assert {(c["kernel"], c["profile"]) for c in smoke} == {(k, p) for k in ("ep_dispatch", "ep_combine")
                                                            for p in ("sm100", "ascend950")}
    small = golden.preset("deepep-tests-small")
    seeds = [validate_spec(c).resolved for c in small if "deepep" in c["id"]]
    assert seeds and all((p["ranks"], p["hidden"], p["experts"], p["topk"]) == (8, 7168, 256, 6) for p in seeds)
    mega = [validate_spec(c).resolved for c in small if "megamoe" in c["id"]]
    assert len(mega) == 2 and all(p["expand"] and not p["cpu_sync"] and p["alignment"] == 224 for p in mega)
    assert {c["profile"] for c in small} == {"sm100", "ascend950"}


def test_smoke_generates_replays_and_checks_without_torch(tmp_path):
    """The EP smoke cases need no torch (torch imports are blocked in a fresh interpreter)."""
    code = f"""
import sys
sys.modules["torch"] = None  # import torch raises ImportError
import numpy as np
import deepgemm_ref.ep as deep_ep
assert deep_ep.topk_idx_t == np.dtype(np.int64)
from deepgemm_ref import golden
specs = [c for c in golden.preset("smoke") if c["kernel"].startswith("ep_")]
golden.generate(specs, {str(tmp_path / 'b')!r})
golden.replay({str(tmp_path / 'b')!r}, {str(tmp_path / 'o.safetensors')!r})
reports = golden.check({str(tmp_path / 'b')!r}, {str(tmp_path / 'o.safetensors')!r})
assert reports and all(r.status == "pass" for r in reports), [r.id for r in reports if r.status != "pass"]
assert "torch" not in [m for m in sys.modules if sys.modules[m] is not None and m.split(".")[0] == "torch"]
print("ok", len(specs))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0 and "ok 6" in r.stdout, r.stdout + r.stderr


# ----------------------------------------------------------------------------------------------
# strategies: the property fails on a broken port and shrinks
# ----------------------------------------------------------------------------------------------

#: Size caps of the default run's property tests (the slow run's generic tests draw the full range).
SMALL = {"ranks": st.integers(1, 3), "tokens": st.integers(1, 6), "experts": st.integers(1, 12),
         "topk": st.integers(1, 4)}


def test_a_dispatch_that_drops_a_slot_fails_shrunk_to_one_token():
    found = []

    @settings(max_examples=60, deadline=None, database=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow])
    @given(case=cases("ep_dispatch", profile="sm100", **SMALL))
    def prop(case):
        found.append(case)
        assert_matches_golden(case, case.call(EP_DROPS_SLOT))

    with pytest.raises(AssertionError) as err:
        prop()
    msg = str(err.value)
    assert "ep_dispatch under sm100 does not match its golden values" in msg
    line = msg.splitlines()[1]
    assert "(ranks=1 tokens=1 hidden=8 " in line and " topk=2;" in line, line  # the smallest that can show it
    assert "compared bit for bit" in msg and "output 'recv_topk_idx'" in msg


@pytest.mark.slow
def test_a_combine_that_adds_the_bias_twice_fails_shrunk_to_one_token():
    @settings(max_examples=60, deadline=None, database=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow])
    @given(case=cases("ep_combine", profile="sm100", **SMALL))
    def prop(case):
        assert_matches_golden(case, case.call(EP_BIAS_TWICE))

    with pytest.raises(AssertionError) as err:
        prop()
    msg = str(err.value)
    line = msg.splitlines()[1]
    assert "ep_combine under sm100 does not match its golden values" in msg
    assert "(ranks=1 tokens=1 hidden=256 " in line and " topk=1;" in line, line  # the smallest combine
    assert "output 'combined_x'" in msg and "allowed [" in msg and "exact accumulator" in msg


@pytest.mark.parametrize("kernel", ["ep_dispatch", "ep_combine"])
def test_strategy_names_map_to_the_schema(kernel):
    @settings(max_examples=5, deadline=None, database=None)
    @given(spec=golden_specs(kernel))
    def run(spec):
        p = validate_spec(spec).resolved
        assert (p["ranks"], p["experts"], p["topk"]) == (2, 8, 2) and p["expand"]

    run()


def golden_specs(kernel: str) -> Any:
    from deepgemm_ref.strategies import specs

    return specs(kernel, profile="sm100", num_ranks=2, num_experts=8, num_topk=2, do_expand=True)


# ----------------------------------------------------------------------------------------------
# a real DeepEP module: this process's rank under torch.distributed
# ----------------------------------------------------------------------------------------------

def _real_like(name: str) -> Any:
    """A module that looks like a real deep_ep: DeepEP's buffers (deepgemm_ref's, which take a
    torch.distributed group), no run_emulated."""
    import types

    mod = types.ModuleType(name)
    mod.ElasticBuffer = deep_ep.ElasticBuffer  # type: ignore[attr-defined]
    mod.EPBuffer = deep_ep.EPBuffer  # type: ignore[attr-defined]
    sys.modules[name] = mod
    return mod


@pytest.mark.torch
def test_a_real_module_replays_one_rank_and_refuses_more(tmp_path):
    pytest.importorskip("torch")
    import torch.distributed as dist

    mod = _real_like("deep_ep_real_like")
    bundle = tmp_path / "b"
    golden.generate([_spec("one", "ep_combine", ranks=1, experts=4, bias=2),
                     _spec("one-d", "ep_dispatch", ranks=1, experts=4, fp8=True, expand=True, alignment=4),
                     _spec("two", "ep_dispatch")], bundle)
    with dg.numerics(arch="sm100"), pytest.raises(BundleError, match=r"case 'two' has 2 ranks and module "
                                                                      r"'deep_ep_real_like' runs one rank per process: "
                                                                      r"launch the replay under torchrun"):
        golden.replay(bundle, tmp_path / "o.safetensors", module=mod.__name__, use_torch=True)
    assert not (tmp_path / "o.safetensors").exists()  # refused before any case ran
    with dg.numerics(arch="sm100"):
        res = golden.replay(bundle, tmp_path / "o.safetensors", module=mod.__name__, use_torch=True,
                            cases=["one", "one-d"])
    assert not res.errors
    assert not dist.is_initialized()  # the one-process group made for a case is gone
    reports = golden.check(bundle, tmp_path / "o.safetensors", cases=["one", "one-d"])
    assert [r.status for r in reports] == ["pass"] * len(reports) and len(reports) > 4


def _two_process_replay(rank: int, bundle: str, outdir: str, port: int) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=2, rank=rank)
    mod = _real_like("deep_ep_real_like")
    with dg.numerics(arch="sm100"):
        res = golden.replay(bundle, f"{outdir}/o{rank}.safetensors", module=mod.__name__, use_torch=True)
    assert not res.errors, res.errors
    assert res.written == (rank == 0) and res.world == 2  # rank 0 merges every rank's rows and writes the file
    dist.destroy_process_group()


@pytest.mark.torch
@pytest.mark.slow
def test_a_real_module_replays_every_rank_under_two_processes(tmp_path):
    pytest.importorskip("torch")
    import socket

    import torch.multiprocessing as mp

    bundle = tmp_path / "b"
    golden.generate([_spec("d", "ep_dispatch", fp8=True), _spec("c", "ep_combine", expand=True)], bundle)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_two_process_replay, args=(str(bundle), str(tmp_path), port), nprocs=2)
    assert not (tmp_path / "o1.safetensors").exists()
    golden.replay(bundle, tmp_path / "one.safetensors")  # deepgemm_ref in one process: the same bytes
    a, b = (golden.load_outputs(tmp_path / name) for name in ("o0.safetensors", "one.safetensors"))
    assert set(a) == set(b) and all(_bytes_equal(a[k], b[k]) for k in a)
    assert all(r.status == "pass" for r in golden.check(bundle, tmp_path / "o0.safetensors"))


def test_the_driver_finds_deeps_names_and_refuses_a_module_without_them(tmp_path):
    import types

    assert gep._ep_module(dg) is deep_ep and gep._ep_module(deep_ep) is deep_ep
    with pytest.raises(BundleError, match="neither DeepEP's buffers"):
        gep._ep_module(types.ModuleType("nothing"))
    bundle = tmp_path / "b"
    golden.generate([_spec("d", "ep_dispatch")], bundle)
    sys.modules["no_deep_ep"] = types.ModuleType("no_deep_ep")
    res = golden.replay(bundle, tmp_path / "o.safetensors", module="no_deep_ep", use_torch=False)
    assert "neither DeepEP's buffers" in res.errors["d"]
