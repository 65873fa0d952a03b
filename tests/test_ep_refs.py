"""deepgemm_ref.ep against DeepEP's own reference, ``deep_ep/utils/refs.py`` (and ``utils/math.py``).

The files are read UNCHANGED from the DeepEP mirror at test time (``git show``) into a temporary
directory outside the repository, inside a tiny package stub that provides only what they import
(``.envs.get_global_seed`` and ``.math.ceil_div`` for refs.py).  Nothing of them is copied into the
repository.  Skipped when the mirror or torch is absent.

Three forms:

* a single-process gloo group (world size 1): refs.py's dispatch and combine with the real
  ``torch.distributed`` against the in-process form with one rank;
* R = 2 and 4 ranks as threads: refs.py's module-level ``dist`` (``get_rank``, ``get_world_size``,
  ``all_to_all_single``) replaced at run time by a double over the in-process group, as DeepEP-
  Ascend's host test replaces them by single-rank doubles;
* R = 2 and 4 processes over real gloo with the buffers on ``TorchTransport`` (slow; skipped while
  the torch.distributed transport is the placeholder that raises ``NotImplementedError``).
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed; DeepEP's reference needs it")
pytestmark = pytest.mark.torch

import deepgemm_ref.ep as deep_ep  # noqa: E402
from deepgemm_ref import comm  # noqa: E402

from .ep_model import run_rank_processes  # noqa: E402

MIRROR = Path(os.environ.get("DEEPEP_MIRROR", "/work/.mirror/deepseek-ai+DeepEP/repo"))
ROOT = Path(__file__).resolve().parent.parent
STUB = "deepep_refs_stub"


def _git_show(path: str) -> str:
    if not MIRROR.exists():
        pytest.skip(f"DeepEP mirror not found at {MIRROR}")
    r = subprocess.run(["git", "-C", str(MIRROR), "show", f"HEAD:{path}"], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"{path} not readable from the DeepEP mirror: {r.stderr.strip()}")
    return r.stdout


@pytest.fixture(scope="module")
def deepep(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A stub package holding DeepEP's refs.py and math.py unchanged: ``(refs, math)`` modules."""
    base = tmp_path_factory.mktemp("deepep_refs")
    pkg = base / STUB / "utils"
    pkg.mkdir(parents=True)
    (base / STUB / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "refs.py").write_text(_git_show("deep_ep/utils/refs.py"))
    (pkg / "math.py").write_text(_git_show("deep_ep/utils/math.py"))
    (pkg / "envs.py").write_text("def get_global_seed():\n    return 0\n")
    sys.path.insert(0, str(base))
    compile_ = torch.compile
    torch.compile = lambda *a, **k: (lambda f: f)  # run DeepEP's @torch.compile functions eagerly
    try:
        math_mod = importlib.import_module(f"{STUB}.utils.math")
        refs = importlib.import_module(f"{STUB}.utils.refs")
    finally:
        torch.compile = compile_
        sys.path.remove(str(base))
    yield refs, math_mod
    for name in [m for m in sys.modules if m.startswith(STUB)]:
        del sys.modules[name]


# ----------------------------------------------------------------------------------------------
# inputs and helpers
# ----------------------------------------------------------------------------------------------

def _bytes(t: Any) -> Any:
    t = t.contiguous()
    return t.view(torch.uint8) if t.element_size() == 1 else t.view({2: torch.int16, 4: torch.int32,
                                                                    8: torch.int64}[t.element_size()])


def eq(a: Any, b: Any) -> bool:
    """Bitwise equality of two tensors (or None)."""
    if a is None or b is None:
        return a is b
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(_bytes(a), _bytes(b))


def inputs(rank: int, R: int, T_max: int, H: int, K: int, E: int, fp8: bool, seed: int = 0) -> tuple:
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    T = max(1, T_max - rank)
    scores = torch.rand((T, E), generator=g)
    weights, idx = torch.topk(scores, K, dim=-1, sorted=False)
    idx = idx.to(torch.int64)
    idx.masked_fill_(torch.rand(idx.shape, generator=g) < 0.2, -1)
    weights = weights.masked_fill(idx < 0, 0)
    x = torch.randn((T, H), generator=g).to(torch.bfloat16)
    if fp8:
        q = torch.randint(0, 256, (T, H), generator=g, dtype=torch.uint8).view(torch.float8_e4m3fn)  # any bytes
        sf = torch.rand((T, (H + 127) // 128), generator=g)
        x = (q, sf)
    bias = tuple(torch.randn((T, H), generator=g).to(torch.bfloat16) for _ in range(2))
    return x, idx, weights, bias


def wide_rows(src: Any, K: int, H: int) -> Any:
    """bf16 rows (n, K, H) of magnitudes 2^-24 .. 2^30, a function of the source index only."""
    g = torch.Generator()
    out = torch.empty((src.numel(), K, H), dtype=torch.float32)
    for i, v in enumerate(src.tolist()):
        g.manual_seed(int(v) + 7)
        e = torch.randint(-24, 31, (K, H), generator=g).float()
        sgn = torch.randint(0, 2, (K, H), generator=g).float() * 2 - 1
        m = 1 + torch.randint(0, 128, (K, H), generator=g).float() / 128
        out[i] = torch.exp2(e) * sgn * m
    return out.to(torch.bfloat16)


def run_case(refs: Any, group: Any, R: int, rank: int, *, fp8: bool, wide: bool, multi: bool, seed: int = 0) -> list:
    """One rank's comparison of refs.py (its ``dist`` is whatever the caller arranged) and the
    buffers on ``group``; returns the names of the mismatches."""
    T_max, H, K, E = 10, 256, 4, 4 * R
    x, idx, w, bias = inputs(rank, R, T_max, H, K, E, fp8, seed)
    bad = []
    # gloo carries no float8: the reference moves the FP8 bytes as uint8 (as DeepEP-Ascend's test does)
    ref_x, ref_idx, ref_w, ref_src, ref_counts = refs.dispatch((x[0].view(torch.uint8), x[1]) if fp8 else x, idx, w,
                                                               T_max, E)
    if fp8:
        ref_x = (ref_x[0].view(torch.float8_e4m3fn), ref_x[1])
    buf = deep_ep.ElasticBuffer(group, num_max_tokens_per_rank=T_max, hidden=H, num_topk=K,
                                allow_multiple_reduction=multi)
    recv_x, recv_idx, recv_w, h, _ = buf.dispatch(x, idx, w, num_experts=E, num_max_tokens_per_rank=T_max)
    ex_x, _, ex_w, eh, _ = buf.dispatch(x, idx, w, num_experts=E, num_max_tokens_per_rank=T_max, do_expand=True,
                                        expert_alignment=4, use_tma_aligned_col_major_sf=True)
    for name, a, b in (("recv_x", recv_x[0] if fp8 else recv_x, ref_x[0] if fp8 else ref_x),
                       ("recv_sf", recv_x[1] if fp8 else None, ref_x[1] if fp8 else None),
                       ("recv_topk_idx", recv_idx, ref_idx), ("recv_topk_weights", recv_w, ref_w),
                       ("src_token_global_idx", h.recv_src_metadata[:, 0], ref_src),
                       ("psum per rank", h.psum_num_recv_tokens_per_scaleup_rank, torch.cumsum(ref_counts, 0).int())):
        if not eq(a.contiguous() if a is not None else None, b.contiguous() if b is not None else None):
            bad.append(name)
    # expanded rows, checked against refs through the expanded metadata
    slots = eh.recv_src_metadata[:, 2:]
    for n in range(slots.shape[0]):
        for k in range(K):
            s = int(slots[n, k])
            if s >= 0 and not eq((ex_x[0] if fp8 else ex_x)[s], (ref_x[0] if fp8 else ref_x)[n]):
                bad.append("expanded recv_x")
            if s >= 0 and ex_w[s] != ref_w[n, k]:
                bad.append("expanded weights")

    # combine, built as DeepEP's test builds its inputs
    own = rank * T_max + torch.arange(idx.shape[0])
    ref_y = wide_rows(own, K, H) if wide else refs.generate_pre_combine_data(own, T_max, K, H)
    ref_y[idx == -1] = 0
    src = h.recv_src_metadata[:, 0]
    local_y = wide_rows(src, K, H) if wide else refs.generate_pre_combine_data(src, T_max, K, H)
    local_y[recv_idx == -1] = 0
    reduced = refs.ordered_accumulate(local_y)
    esrc = eh.recv_src_metadata[:, 0]
    local_ey = wide_rows(esrc, K, H) if wide else refs.generate_pre_combine_data(esrc, T_max, K, H)
    expanded_in = torch.empty((ex_x[0].shape[0] + 1 if fp8 else ex_x.shape[0] + 1, H), dtype=torch.bfloat16)
    expanded_in[eh.recv_src_metadata[:, 2:].flatten()] = local_ey.view(-1, H)
    expanded_in = expanded_in[:-1]
    for nb, b in ((0, None), (1, bias[0]), (2, bias)):
        want_local = refs.combine(ref_y, idx, 1, R, E, b, True, False)
        cx, cw, _ = buf.combine(reduced, h, topk_weights=recv_w, bias=b)
        if not eq(cx, want_local):
            bad.append(f"combine (bias {nb})")
        if not eq(cw, w):
            bad.append("combined weights")
        recipe = (True, False) if multi else (False, False)
        want_exp = refs.combine(ref_y, idx, 1, R, E, b, *recipe)
        ecx, ecw, _ = buf.combine(expanded_in, eh, topk_weights=ex_w if multi else None, bias=b)
        if not eq(ecx, want_exp):
            bad.append(f"expanded combine {recipe} (bias {nb})")
        if multi and not eq(ecw, w):
            bad.append("expanded combined weights")
        # the pure layer on the same slot rows
        yb = None if b is None else (b.view(torch.int16).numpy().view(np.dtype("bfloat16"))
                                     if isinstance(b, torch.Tensor) else tuple(
                                         t.view(torch.int16).numpy().view(np.dtype("bfloat16")) for t in b))
        pure = deep_ep.reduction.combine_reference(ref_y.view(torch.int16).numpy().view(np.dtype("bfloat16")),
                                                   idx.numpy(), E, R, yb, recipe="local" if recipe[0] else "slots")
        if not np.array_equal(pure.view(np.uint16), want_exp.view(torch.int16).numpy().view(np.uint16)):
            bad.append(f"pure combine {recipe} (bias {nb})")
    return bad


# ----------------------------------------------------------------------------------------------
# DeepEP's math.py
# ----------------------------------------------------------------------------------------------

def test_per_token_cast_matches_deepeps_math(deepep):
    _, m = deepep
    g = torch.Generator().manual_seed(3)
    for shape, scale in (((16, 7168), 1.0), ((9, 300), 1e-6), ((5, 128), 300.0), ((4, 1000), 1e-30)):
        x = (torch.randn(shape, generator=g) * scale).to(torch.bfloat16)
        x[0, :128] = 0  # a zero block: the 1e-4 floor
        q, sf = m.per_token_cast_to_fp8(x)
        q2, sf2 = deep_ep.utils.math.per_token_cast_to_fp8(x)
        assert eq(q2, q) and eq(sf2, sf), shape
        assert eq(deep_ep.utils.math.per_token_cast_back(q2, sf2), m.per_token_cast_back(q, sf))
        packed = torch.randint(100, 140, (shape[0], (shape[1] + 511) // 512 * 4), generator=g, dtype=torch.uint8)
        if shape[1] % 512 == 0:
            sf_i = packed.view(torch.int32)
            assert eq(deep_ep.utils.math.per_token_cast_back(q2, sf_i), m.per_token_cast_back(q, sf_i))
        y = torch.randn(shape, generator=g).to(torch.bfloat16)
        assert deep_ep.utils.math.calc_diff(x, y) == m.calc_diff(x, y)
    assert deep_ep.utils.math.count_bytes(q, (sf, None)) == m.count_bytes(q, (sf, None))


# ----------------------------------------------------------------------------------------------
# refs.py with a single-process gloo group
# ----------------------------------------------------------------------------------------------

def test_refs_on_a_world_size_one_gloo_group(deepep, tmp_path):
    refs, _ = deepep
    dist = torch.distributed
    if dist.is_initialized():
        pytest.skip("a default process group already exists in this process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        for fp8 in (False, True):
            for multi in (True, False):
                bad = deep_ep.run_emulated(
                    lambda g, fp8=fp8, multi=multi: run_case(refs, g, 1, 0, fp8=fp8, wide=not fp8, multi=multi), 1)[0]
                assert not bad, bad
    finally:
        dist.destroy_process_group()


# ----------------------------------------------------------------------------------------------
# refs.py on R threads: its dist functions replaced by a double over the in-process group
# ----------------------------------------------------------------------------------------------

class ThreadDist:
    """``get_rank``, ``get_world_size`` and ``all_to_all_single`` of the calling thread's rank."""

    def __init__(self) -> None:
        self.local = threading.local()

    def get_rank(self) -> int:
        return self.local.group.rank()

    def get_world_size(self) -> int:
        return self.local.group.size()

    def all_to_all_single(self, output: Any, input: Any, output_split_sizes: Any = None,
                          input_split_sizes: Any = None) -> None:
        t = comm.transport(self.local.group)
        n = t.size
        sizes = input_split_sizes if input_split_sizes is not None else [input.shape[0] // n] * n
        pieces = torch.split(input.contiguous(), list(sizes))
        send = []
        for p in pieces:
            b = p.contiguous().view(torch.uint8).numpy()
            send.append(b.reshape(len(p), b.size // max(len(p), 1)))
        recv = t.all_to_all(send)
        flat = np.concatenate([r.reshape(-1) for r in recv]).astype(np.uint8)
        out = torch.from_numpy(flat.copy()).view(output.dtype).reshape(output.shape)
        output.copy_(out)


@pytest.fixture(params=["shared", "all_to_all"])
def payload_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways payloads travel in the in-process form (see tests/test_ep.py)."""
    from deepgemm_ref.ep import _buffer

    monkeypatch.setattr(_buffer, "SHARED_ALL_GATHER", request.param == "shared")
    return request.param


@pytest.mark.parametrize("R", [2, 4])
@pytest.mark.parametrize(("fp8", "wide", "multi"), [(False, False, True), (True, False, False), (False, True, True),
                                                     (False, True, False)])
def test_refs_on_threads(deepep, R, fp8, wide, multi, payload_path):
    refs, _ = deepep
    double = ThreadDist()
    real = refs.dist
    refs.dist = double  # the module's global, replaced at run time (the file is unchanged)
    try:
        def fn(g: Any) -> list:
            double.local.group = g
            return run_case(refs, g, R, g.rank(), fp8=fp8, wide=wide, multi=multi, seed=R)

        bads = deep_ep.run_emulated(fn, R, timeout_s=60.0)
    finally:
        refs.dist = real
    assert not any(bads), bads


def test_hybrid_recipe_matches_refs(deepep):
    """8.3: the pure layer's hybrid recipe against refs.combine's (True, True) with 2 x 2 ranks."""
    refs, _ = deepep
    R, T, K, H, E = 4, 12, 6, 256, 16
    own = torch.arange(T)
    y = wide_rows(own, K, H)
    g = torch.Generator().manual_seed(0)
    idx = torch.topk(torch.rand((T, E), generator=g), K, dim=-1, sorted=False)[1]
    idx.masked_fill_(torch.rand(idx.shape, generator=g) < 0.2, -1)
    y[idx == -1] = 0
    bias = tuple(torch.randn((T, H), generator=g).to(torch.bfloat16) for _ in range(2))
    yb = y.view(torch.int16).numpy().view(np.dtype("bfloat16"))
    nb = tuple(b.view(torch.int16).numpy().view(np.dtype("bfloat16")) for b in bias)
    for recipe, flags in (("hybrid", (True, True)), ("local", (True, False)), ("slots", (False, False))):
        want = refs.combine(y, idx, 2, 2, E, bias, *flags)
        got = deep_ep.reduction.combine_reference(yb, idx.numpy(), E, R, nb, recipe=recipe, num_scaleup_ranks=2)
        assert np.array_equal(got.view(np.uint16), want.view(torch.int16).numpy().view(np.uint16)), recipe


# ----------------------------------------------------------------------------------------------
# real gloo process groups: the buffers on TorchTransport
# ----------------------------------------------------------------------------------------------

_CHILD = textwrap.dedent("""
    import importlib, json, os, sys
    import torch, torch.distributed as dist
    rank, R, store, out, stub = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
    sys.path.insert(0, stub)
    sys.path.insert(0, {tests!r})
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=R)
    refs = importlib.import_module("{pkg}.utils.refs")
    from tests import test_ep_refs as t
    result = {{}}
    try:
        bad = []
        for fp8, wide, multi in ((False, False, True), (True, True, False)):
            bad += t.run_case(refs, dist.group.WORLD, R, rank, fp8=fp8, wide=wide, multi=multi, seed=R)
        result["bad"] = bad
    except NotImplementedError as e:
        result["skip"] = str(e)
    with open(out, "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()
    sys.stdout.flush(); sys.stderr.flush()
    os._exit(0)  # past torch's gloo teardown at interpreter exit, which can abort (SIGABRT)
""")


@pytest.mark.slow
@pytest.mark.parametrize("R", [2, 4])
def test_refs_on_gloo_processes(deepep, tmp_path, R):
    refs, _ = deepep
    stub = Path(refs.__file__).parents[2]
    script = tmp_path / "child.py"
    script.write_text(_CHILD.format(tests=str(ROOT / "tests"), pkg=STUB))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    logs = run_rank_processes(lambda r: [sys.executable, str(script), str(r), str(R), str(tmp_path / "store"),
                                         str(tmp_path / f"out{r}.json"), str(stub)], R, env)
    results = []
    for r in range(R):
        f = tmp_path / f"out{r}.json"
        assert f.exists(), logs[r][-3000:]
        results.append(json.loads(f.read_text()))
    if any("skip" in res for res in results):
        pytest.skip("TorchTransport is not written yet: " + next(res["skip"] for res in results if "skip" in res))
    assert all(not res["bad"] for res in results), results


def test_torch_tensors_in_place_and_handle_copies():
    """torch in, torch out: the stats tensor is updated in place, the handle keeps the caller's
    routing tensor (do_handle_copy=False) or a copy."""
    R, T, H, K, E = 2, 5, 256, 3, 8

    def fn(g: Any) -> None:
        r = g.rank()
        x, idx, w, _ = inputs(r, R, T, H, K, E, False, seed=9)
        stats = torch.zeros(E // R, dtype=torch.int32)
        buf = deep_ep.ElasticBuffer(g, num_max_tokens_per_rank=T, hidden=H, num_topk=K)
        recv_x, recv_idx, recv_w, h, _ = buf.dispatch(x, idx, w, stats, num_experts=E, do_handle_copy=False)
        assert isinstance(recv_x, torch.Tensor) and recv_x.dtype == torch.bfloat16 and recv_idx.dtype == torch.int64
        assert h.topk_idx is idx and isinstance(h.recv_src_metadata, torch.Tensor)
        assert int(stats.sum()) == int((recv_idx >= 0).sum())
        _, _, _, h2, _ = buf.dispatch(x, idx, w, num_experts=E)
        assert h2.topk_idx is not idx and h2.topk_idx.data_ptr() != idx.data_ptr() and torch.equal(h2.topk_idx, idx)
        cx, cw, _ = buf.combine(recv_x, h, topk_weights=recv_w)
        assert isinstance(cx, torch.Tensor) and torch.equal(cw, w)

    deep_ep.run_emulated(fn, R)


def test_init_dist_on_gloo(tmp_path):
    """DeepEP's init_dist on gloo in a fresh process (world size 1): the group, bf16 default dtype, seeds."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = textwrap.dedent("""
        import torch, torch.distributed as dist
        from deepgemm_ref.ep.utils import envs
        rank, world, group = envs.init_dist(0, 1, seed=5)
        assert (rank, world) == (0, 1) and group.size() == 1
        assert torch.get_default_dtype() == torch.bfloat16
        assert envs.get_global_seed() == 5 and envs.get_local_seed() == 5
        envs.dist_print("ok", once_in_node=True)
        dist.destroy_process_group()
    """)
    env = dict(os.environ, MASTER_PORT=str(port), PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr
