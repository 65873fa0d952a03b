"""Expert-parallel cases with one process per rank (issue 26, parts 4 and 5): generation with
``--executor processes``, replay under torchrun, and the pytest plugin's ``--dg-ranks processes``.

The default run checks the pieces in this process: every rank's part of the goldens merges into
the bytes one process computes, the exchange format round-trips every dtype bit for bit, the
world replay (its checks, its per-case agreement, its merge) run on ranks in threads gives the
one-process outputs file byte for byte and records a rank that fails alone, and bad options exit
2 naming the option or the case.  The tests that start processes (gloo groups, torchrun) are
marked slow and torch."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import deepgemm_ref.ep as deep_ep
from deepgemm_ref import golden
from deepgemm_ref.cli import main
from deepgemm_ref.comm import LocalGroup, run_emulated
from deepgemm_ref.golden import ranks
from deepgemm_ref.golden import safetensors as st
from deepgemm_ref.golden.bundle import BundleError
from deepgemm_ref.golden.call import compute_golden
from deepgemm_ref.golden.cases import build_case, validate_spec
from deepgemm_ref.golden.replay import _replay_in_world, _World, read_replay_record
from deepgemm_ref.mega import EmulatedGroup

ROOT = Path(__file__).resolve().parent.parent


def _spec(i: str, kernel: str, profile: str = "sm100", **kw: Any) -> dict[str, Any]:
    return {"id": i, "kernel": kernel, "profile": profile, **kw}


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.view(np.uint8).tobytes() == b.view(np.uint8).tobytes()


#: EP cases of every layout the goldens have (both profiles, FP8, expanded, without CPU sync, 3 ranks).
EP_SPECS = [
    _spec("d", "ep_dispatch"),
    _spec("d-fp8-expand", "ep_dispatch", fp8=True, expand=True, alignment=4, zero_padding=True, sf="ue8m0"),
    _spec("d-nosync", "ep_dispatch", cpu_sync=False, ranks=3, experts=9, topk=2),
    _spec("d-asc", "ep_dispatch", "ascend950", fp8=True, alignment=2),
    _spec("c", "ep_combine", bias=2),
    _spec("c-slots", "ep_combine", expand=True, multiple_reduction=False, bias=1, ranks=3, experts=6, topk=3),
    _spec("c-asc", "ep_combine", "ascend950", hidden=64, bias=2),
]


@pytest.mark.parametrize("spec", EP_SPECS, ids=lambda s: s["id"])
def test_every_ranks_part_merges_into_the_one_process_goldens(spec):
    """Rank r's part (its rows of the pure model), sent as bytes, and the merge of every rank's
    parts give the tensors and statistics one process computes; a rank's part does not hold
    another rank's rows."""
    built = build_case(validate_spec(spec))
    whole, stats = compute_golden(built)
    r_count = built.spec.resolved["ranks"]
    parts, infos = [], []
    for r in range(r_count):
        part, info = ranks.rank_golden(built, r, None)
        assert set(part) == set(whole)
        got, got_info = ranks.unpack(ranks.pack(part, info))
        parts.append(got)
        infos.append(got_info)
    merged, merged_stats = ranks.merge_golden(built, parts, infos)
    assert set(merged) == set(whole) and merged_stats == stats
    for name in whole:
        assert _same(merged[name], whole[name]), name
    # the rows come from the rank that computed them: a part made with another rank differs
    other = ranks.rank_golden(built, r_count - 1, None)[0]
    assert any(not _same(other[name], parts[0][name]) for name in whole)


def test_a_mega_moe_rank_part_is_its_trace_record_and_rows():
    """Mega MoE: one rank's driver under trace capture (here a one-rank group, which the kernels
    take) gives its rows and trace record; their merge through the family's finish hook is the
    one-process golden, bit for bit."""
    built = build_case(validate_spec(_spec("m", "bf16_mega_moe", ranks=1, experts=2, hidden=128,
                                           intermediate=128, tokens=8)))
    whole, stats = compute_golden(built)
    part, info = ranks.rank_golden(built, 0, EmulatedGroup(1).rank(0))
    assert {"out.y", "out.stats", "rec.acc", "rec.S"} <= set(part)
    part, info = ranks.unpack(ranks.pack(part, json.loads(json.dumps(info))))
    merged, merged_stats = ranks.merge_golden(built, [part], [info])
    assert set(merged) == set(whole) and merged_stats == stats
    assert all(_same(merged[k], whole[k]) for k in whole)


def test_the_exchange_carries_every_dtype_bit_for_bit_and_refuses_a_damaged_message():
    rng = np.random.default_rng(5)
    arrays = {
        "bf16": rng.standard_normal((3, 5)).astype(ml_dtypes.bfloat16),
        "e4m3": rng.standard_normal((4,)).astype(ml_dtypes.float8_e4m3fn),
        "i16": np.array([[-1, 2], [3, -32768]], np.int16),
        "mask": np.array([True, False, True]),
        "nan": np.array([np.nan, -0.0, np.inf], np.float32),
        "scalar": np.float64(2.5),
        "empty": np.zeros((0, 3), np.int64),
        "strided": np.arange(12, dtype=np.int32).reshape(3, 4)[:, ::2],
    }
    buf = ranks.pack(arrays, {"stats": {"a": [1, 2]}})
    got, info = ranks.unpack(buf)
    assert info == {"stats": {"a": [1, 2]}} and list(got) == list(arrays)
    for name, a in arrays.items():
        assert _same(got[name], np.asarray(a)), name
    with pytest.raises(BundleError, match="runs past the message"):
        ranks.unpack(buf[:-1])
    with pytest.raises(BundleError, match="left over"):
        ranks.unpack(np.concatenate([buf, np.zeros(1, np.uint8)]))
    with pytest.raises(BundleError, match="shorter than its header"):
        ranks.unpack(buf[:3])


# ----------------------------------------------------------------------------------------------
# the world replay, its ranks in threads
# ----------------------------------------------------------------------------------------------

#: sm100 only: the settings are process-global, and each thread's replay scopes the case's profile.
WORLD_SPECS = [_spec("d", "ep_dispatch", fp8=True, expand=True, alignment=4),
               _spec("c", "ep_combine", bias=2),
               _spec("one", "ep_dispatch", ranks=1, experts=4),
               _spec("g", "bf16_gemm_nt", m=8, n=16, k=64)]


@pytest.fixture(scope="module")
def world_bundle(tmp_path_factory):
    root = tmp_path_factory.mktemp("ranks") / "b"
    golden.generate(WORLD_SPECS, root)
    return root


def _world_replay(bundle: Path, out: Path, module: str = "deepgemm_ref", size: int = 2, **kw: Any) -> list[Any]:
    """The world replay with its ranks in threads of this process (a LocalGroup for the group and
    the exchanges, as a torchrun world of processes gives a process group and gloo)."""

    def rank(g: Any) -> Any:
        w = _World(g.rank(), g.size(), g, g.transport(), False, lambda: LocalGroup(1).rank(0))
        return _replay_in_world(w, bundle, out, module, None, None, True, False, kw.get("cases"), None, None,
                                       1 << 34)

    return list(run_emulated(rank, size))


def test_the_world_replay_gives_the_one_process_outputs_file(world_bundle, tmp_path):
    one = tmp_path / "one.safetensors"
    golden.replay(world_bundle, one)
    outs = _world_replay(world_bundle, tmp_path / "world.safetensors")
    assert outs[0].written and not outs[1].written and len(outs[1]) == 0
    assert (tmp_path / "world.safetensors").read_bytes() == one.read_bytes()  # the same file, byte for byte
    assert all(r.status == "pass" for r in golden.check(world_bundle, tmp_path / "world.safetensors"))


@pytest.mark.torch
def test_a_rank_that_fails_alone_fails_its_case_and_the_others_go_on(world_bundle, tmp_path):
    """Rank 1's buffer raises before the buffers' first collective; rank 0 waits in it: both
    record the case as failed (rank 0's collective and rank 1's agreement see different
    collectives) and the next cases run."""
    pytest.importorskip("torch")  # the module's replay passes torch tensors

    class Flaky(deep_ep.ElasticBuffer):
        def __init__(self, group: Any, *args: Any, **kwargs: Any) -> None:
            if group.rank() == 1:
                raise RuntimeError("no buffer on rank 1")
            super().__init__(group, *args, **kwargs)

    mod = types.ModuleType("ep_flaky_rank")
    mod.ElasticBuffer = Flaky  # type: ignore[attr-defined]
    mod.EPBuffer = deep_ep.EPBuffer  # type: ignore[attr-defined]
    sys.modules[mod.__name__] = mod
    try:
        outs = _world_replay(world_bundle, tmp_path / "w.safetensors", mod.__name__, cases=["d", "c"])
    finally:
        del sys.modules[mod.__name__]
    assert set(outs[0].errors) == {"d", "c"} and outs[0].errors == outs[1].errors
    assert "rank 1 of 2: RuntimeError: no buffer on rank 1" in outs[0].errors["d"]
    assert "rank 0 of 2: CollectiveMismatch" in outs[0].errors["d"]
    errors, cases = read_replay_record(tmp_path / "w.safetensors")
    assert cases == ["d", "c"] and set(errors) == {"d", "c"}


def test_the_world_replay_refuses_a_case_of_other_ranks_on_every_rank(world_bundle, tmp_path):
    with pytest.raises(BundleError, match=r"case 'd' has 2 ranks; this torchrun world has 3 processes: launch it "
                                          r"with --nproc-per-node 2"):
        _world_replay(world_bundle, tmp_path / "w.safetensors", size=3)
    assert not (tmp_path / "w.safetensors").exists()
    (tmp_path / "taken.safetensors").write_bytes(b"x")  # rank 0's problem: every rank raises it
    with pytest.raises(BundleError, match="taken.safetensors: file exists"):
        _world_replay(world_bundle, tmp_path / "taken.safetensors", cases=["d"])


def test_outside_a_world_a_one_rank_per_process_module_is_refused_a_multi_rank_case(world_bundle, tmp_path, capsys):
    mod = types.ModuleType("ep_one_rank_per_process")
    mod.ElasticBuffer = deep_ep.ElasticBuffer  # type: ignore[attr-defined]
    mod.EPBuffer = deep_ep.EPBuffer  # type: ignore[attr-defined]
    sys.modules[mod.__name__] = mod
    try:
        code = main(["replay", str(world_bundle), "--module", mod.__name__, "--no-torch", "--out",
                     str(tmp_path / "o.safetensors")])
    finally:
        del sys.modules[mod.__name__]
    err = capsys.readouterr().err
    assert code == 2 and "case 'd' has 2 ranks" in err and "torchrun --nproc-per-node 2" in err
    assert "Traceback" not in err and not (tmp_path / "o.safetensors").exists()


def test_replay_under_torchrun_without_torch_or_with_bad_variables_exits_2(world_bundle, tmp_path, capsys,
                                                                          monkeypatch):
    for key, value in (("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "1")):
        monkeypatch.setenv(key, value)
    args = ["replay", str(world_bundle), "--out", str(tmp_path / "o.safetensors")]
    monkeypatch.setitem(sys.modules, "torch.distributed", None)  # import torch.distributed fails
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "replay under torchrun (WORLD_SIZE=2): needs torch (torch.distributed)" in err and "Traceback" not in err
    monkeypatch.setenv("RANK", "two")
    assert main(args) == 2
    assert "environment variable RANK='two': expected an integer (set by torchrun)" in capsys.readouterr().err
    monkeypatch.setenv("RANK", "2")
    assert main(args) == 2
    assert "RANK=2, WORLD_SIZE=2: expected 0 <= RANK < WORLD_SIZE" in capsys.readouterr().err
    assert not (tmp_path / "o.safetensors").exists()


# ----------------------------------------------------------------------------------------------
# bad options
# ----------------------------------------------------------------------------------------------

def test_bad_rank_options_exit_2_naming_the_option_or_the_case(tmp_path, capsys, monkeypatch):
    spec = tmp_path / "s.json"
    spec.write_text(json.dumps([_spec("d2", "ep_dispatch"), _spec("d3", "ep_dispatch", ranks=3, experts=6),
                                _spec("g", "bf16_gemm_nt", m=8, n=16, k=64)]))
    out = tmp_path / "b"
    base = ["golden", "--spec", str(spec), "--out", str(out)]
    assert main(base + ["--executor", "processes", "--ranks-per-case", "0"]) == 2
    assert "--ranks-per-case: expected a positive integer; got '0'" in capsys.readouterr().err
    assert main(base + ["--ranks-per-case", "2"]) == 2
    assert "--ranks-per-case 2: only with --executor processes" in capsys.readouterr().err
    assert main(base + ["--executor", "processes", "--ranks-per-case", "2"]) == 2
    err = capsys.readouterr().err
    if importlib.util.find_spec("torch") is not None:
        assert "case 'd3' has ranks = 3" in err and "--ranks-per-case 2 starts 2 processes" in err
    else:  # without torch the executor itself is refused first
        assert "--executor processes needs torch" in err and "Traceback" not in err
    real_find_spec = golden.generation.importlib.util.find_spec
    monkeypatch.setattr(golden.generation.importlib.util, "find_spec",
                        lambda name, *a: None if name == "torch" else real_find_spec(name, *a))
    assert main(base + ["--executor", "processes"]) == 2
    err = capsys.readouterr().err
    assert "--executor processes needs torch" in err and "Traceback" not in err
    assert not out.exists()  # refused before anything is written


def test_the_plan_says_which_cases_take_rank_processes_and_counts_their_memory(tmp_path):
    pytest.importorskip("torch")
    specs = [_spec("d2", "ep_dispatch", hidden=1024, tokens=64), _spec("g", "bf16_gemm_nt", m=8, n=16, k=64)]
    plan = golden.plan_generation(specs, tmp_path / "b", executor="processes")
    assert [c.ranks for c in plan.cases] == [2, 0] and [plan.in_rank_processes(c) for c in plan.cases] == [True, False]
    assert "1 case with one process per rank (2 processes over a gloo group)" in plan.summary()
    peak = plan.cases[0].estimate.peak_bytes
    with pytest.raises(golden.ResourceError, match=r"case 'd2'.*\(2 rank processes, each building the whole case\)"):
        golden.plan_generation(specs, tmp_path / "b", executor="processes", max_memory=peak + 1)
    golden.plan_generation(specs, tmp_path / "b", executor="local", max_memory=peak + 1)  # one process: it fits


# ----------------------------------------------------------------------------------------------
# real processes: gloo groups, torchrun (slow)
# ----------------------------------------------------------------------------------------------

def _tensor_hashes(bundle: Path) -> dict[str, tuple[str, list[int], str]]:
    """Every tensor's sha256 of a bundle, read from its files (not from its manifest)."""
    out = {}
    for f in sorted((bundle / "cases").glob("*.safetensors")):
        for name, a in st.load_file(f).items():
            data = a.data if isinstance(a, st.PackedFP4) else a
            out[f"{f.stem}/{name}"] = (str(data.dtype), list(data.shape), st.tensor_sha256(a))
    return out


def _cases(bundle: Path) -> dict[str, Any]:
    return {c["id"]: c for c in json.loads((bundle / "manifest.json").read_text())["cases"]}


@pytest.mark.torch
@pytest.mark.slow
def test_processes_executor_writes_the_bytes_of_one_process(tmp_path, capsys):
    """EP cases (2 ranks, 2 processes each), a Mega MoE case of one rank (its kernels take a
    one-process group) and a GEMM (run as usual) under --executor processes: every tensor's sha256
    and every manifest entry equal the one-process bundle's."""
    pytest.importorskip("torch")
    specs = [_spec("d", "ep_dispatch", fp8=True, expand=True, alignment=4, zero_padding=True),
             _spec("c", "ep_combine", "ascend950", hidden=64, bias=2),
             _spec("m1", "bf16_mega_moe", ranks=1, experts=2, hidden=128, intermediate=128, tokens=8),
             _spec("g", "bf16_gemm_nt", m=8, n=16, k=64)]
    (tmp_path / "s.json").write_text(json.dumps(specs))
    assert main(["golden", "--spec", str(tmp_path / "s.json"), "--out", str(tmp_path / "one")]) == 0
    assert main(["golden", "--spec", str(tmp_path / "s.json"), "--out", str(tmp_path / "procs"), "--executor",
                 "processes"]) == 0
    out = capsys.readouterr()
    assert "3 cases with one process per rank (1, 2 processes over a gloo group)" in out.out
    assert "note:" not in out.err  # no case fell back to this process
    one, procs = _tensor_hashes(tmp_path / "one"), _tensor_hashes(tmp_path / "procs")
    assert len(one) > 20 and one == procs
    assert _cases(tmp_path / "one") == _cases(tmp_path / "procs")  # file hashes and golden stats too


@pytest.mark.torch
@pytest.mark.slow
def test_a_multi_rank_mega_moe_case_in_rank_processes(tmp_path, capsys):
    """Mega MoE with 2 ranks under --executor processes: the kernels take the two-process group and
    the ranks' goldens merge into the one-process bytes (no fallback to the parent)."""
    pytest.importorskip("torch")
    spec = [_spec("m2", "fp8_fp4_mega_moe", ranks=2, experts=4, tokens=8)]
    (tmp_path / "s.json").write_text(json.dumps(spec))
    assert main(["golden", "--spec", str(tmp_path / "s.json"), "--out", str(tmp_path / "one")]) == 0
    assert main(["golden", "--spec", str(tmp_path / "s.json"), "--out", str(tmp_path / "procs"), "--executor",
                 "processes", "--ranks-per-case", "2"]) == 0
    err = capsys.readouterr().err
    assert _tensor_hashes(tmp_path / "one") == _tensor_hashes(tmp_path / "procs")
    assert "note:" not in err, err  # computed by the rank processes, not in the parent


def _torchrun(n: int, args: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n), *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.torch
@pytest.mark.slow
def test_replay_under_torchrun_merges_into_the_one_process_file(world_bundle, tmp_path):
    """torchrun --nproc-per-node 2 deepgemm-ref replay --module deepgemm_ref: each process replays
    its rank of the 2-rank EP cases over gloo, rank 0 the one-rank case (on a group of its own)
    and the GEMM, and writes one outputs file that check passes and that equals the one-process
    replay's byte for byte.  A world of 3 processes is refused on every rank, naming the case."""
    pytest.importorskip("torch")
    one = tmp_path / "one.safetensors"
    golden.replay(world_bundle, one)
    out = tmp_path / "two.safetensors"
    r = _torchrun(2, ["-m", "deepgemm_ref.cli", "replay", str(world_bundle), "--module", "deepgemm_ref", "--out",
                      str(out)], tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"rank 1 of 2: replayed its rank of the EP cases; rank 0 wrote {out}" in r.stdout
    assert out.read_bytes() == one.read_bytes()
    assert main(["check", str(world_bundle), "--outputs", str(out), "--quiet"]) == 0
    r = _torchrun(3, ["-m", "deepgemm_ref.cli", "replay", str(world_bundle), "--out", str(tmp_path / "three")],
                  tmp_path)
    assert r.returncode != 0 and not (tmp_path / "three").exists()
    assert r.stderr.count("case 'd' has 2 ranks; this torchrun world has 3 processes") == 3  # every rank, exit 2
    assert "exitcode  : 2" in r.stderr and "Traceback (most recent call last):\n  File \"" not in r.stdout


@pytest.mark.torch
@pytest.mark.slow
def test_replay_of_a_multi_rank_mega_moe_case_under_torchrun(tmp_path):
    """deepgemm_ref's Mega MoE kernels take the torchrun world's group: the merged outputs equal the
    one-process replay's."""
    pytest.importorskip("torch")
    bundle = tmp_path / "b"
    golden.generate([_spec("m2", "bf16_mega_moe", ranks=2, experts=4, hidden=128, intermediate=128, tokens=8)],
                    bundle)
    one = tmp_path / "one.safetensors"
    golden.replay(bundle, one)
    out = tmp_path / "two.safetensors"
    r = _torchrun(2, ["-m", "deepgemm_ref.cli", "replay", str(bundle), "--out", str(out)], tmp_path)
    errors, _ = read_replay_record(out)
    assert not errors, errors
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert out.read_bytes() == one.read_bytes()


PLUGIN_TESTS = '''
import ml_dtypes
import numpy as np
from hypothesis import given, settings, strategies as st

T, H, K, E = 8, 64, 2, 4


def _inputs(rank, seed):
    g = np.random.default_rng([seed, rank])
    x = g.standard_normal((T, H), dtype=np.float32).astype(ml_dtypes.bfloat16)
    idx = np.argsort(g.random((T, E)), axis=1)[:, :K].astype(np.int64)
    return x, idx


@settings(max_examples=3, deadline=None)
@given(seed=st.integers(0, 2**16))
def test_dispatch_receives_what_was_sent(deep_ep, dg_ep_ranks, seed):
    def body(group):
        r, n = group.rank(), group.size()
        x, idx = _inputs(r, seed)
        buf = deep_ep.ElasticBuffer(group, num_max_tokens_per_rank=T, hidden=H, num_topk=K)
        recv_x, _, _, handle, _ = buf.dispatch(x, topk_idx=idx, num_experts=E)
        src = np.asarray(handle.recv_src_metadata)[:, 0]
        for j, s in enumerate(src.tolist()):
            xs, _ = _inputs(s // T, seed)
            assert np.asarray(recv_x)[j].view(np.uint16).tolist() == xs[s % T].view(np.uint16).tolist()
        return (r, n, seed)

    out = dg_ep_ranks(body, 2)
    assert [o for o in out if o is not None] and all(o is None or o[1:] == (2, seed) for o in out)


def test_groups_are_this_process_ranks(dg_group):
    rank = dg_group(2)
    assert rank.num_ranks == 2 and len(rank.local_ranks) in (1, 2)
    for r in rank.local_ranks:
        assert rank(r).size() == 2 and rank(r).rank() == r


def test_one_rank_is_skipped_in_a_world_of_two(dg_ep_ranks):
    assert dg_ep_ranks(lambda g: g.size(), 1) == [1]
'''


@pytest.mark.torch
@pytest.mark.slow
def test_plugin_ranks_as_processes_under_torchrun(tmp_path):
    """One test file, run with its ranks as threads (pytest) and as processes (torchrun
    --nproc-per-node 2 -m pytest --dg-ranks processes): the same tests pass in both; a test of one
    rank is skipped in the world of two, naming both counts."""
    pytest.importorskip("torch")
    (tmp_path / "test_ranks.py").write_text(PLUGIN_TESTS)
    args = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", "test_ranks.py"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "3 passed" in r.stdout, r.stdout[-3000:]
    r = _torchrun(2, [*args, "--dg-ranks", "processes"], tmp_path)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-3000:]
    assert r.stdout.count("2 passed, 1 skipped") == 2, r.stdout[-4000:]
    assert r.stdout.count("1 expert-parallel ranks: this torch.distributed world has 2 processes") == 2


def _rank_workers(pid: int) -> list[int]:
    """The rank processes the golden process ``pid`` started (its children running the worker)."""
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids = [int(x) for x in (task / "children").read_text().split()]
        except OSError:
            continue
        for k in kids:
            try:
                if b"_rank_worker" in Path(f"/proc/{k}/cmdline").read_bytes():
                    out.append(k)
            except OSError:
                pass
    return out


def _wait(pred: Any, timeout: float = 120) -> None:
    import time

    t0 = time.monotonic()
    while not pred():
        assert time.monotonic() - t0 < timeout, "timed out"
        time.sleep(0.05)


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_an_interrupted_or_broken_rank_run_keeps_its_finished_cases(tmp_path):
    """SIGINT while a case's rank processes run: they are stopped, the finished cases are kept,
    exit 130, and --resume gives the bytes of an uninterrupted run.  A rank process killed by
    SIGKILL fails its case naming that rank (the others, waiting in a collective, are stopped)."""
    import signal
    import time

    pytest.importorskip("torch")
    specs = [_spec("d1", "ep_dispatch"), _spec("d2", "ep_dispatch", fp8=True), _spec("c1", "ep_combine")]
    spec = tmp_path / "s.json"
    spec.write_text(json.dumps(specs))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cli = [sys.executable, "-m", "deepgemm_ref.cli", "golden", "--spec", str(spec), "--executor", "processes"]
    out = tmp_path / "b"
    p = subprocess.Popen([*cli, "--out", str(out)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait(lambda: len(list((out / "cases").glob("*.safetensors"))) >= 1 and len(_rank_workers(p.pid)) == 2)
    workers = _rank_workers(p.pid)
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130 and time.monotonic() - t0 < 5, err
    assert "cases finished and kept" in err and "Traceback" not in err
    assert not any(Path(f"/proc/{w}").exists() and Path(f"/proc/{w}/stat").read_text().split()[2] != "Z"
                   for w in workers)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["incomplete"] and len(manifest["cases"]) >= 1
    assert subprocess.run([*cli, "--out", str(out), "--resume"], env=env, capture_output=True).returncode == 0
    assert main(["golden", "--spec", str(spec), "--out", str(tmp_path / "one")]) == 0
    assert _tensor_hashes(out) == _tensor_hashes(tmp_path / "one") and _cases(out) == _cases(tmp_path / "one")

    broken = tmp_path / "broken"
    p = subprocess.Popen([*cli, "--out", str(broken), "--case", "d1"], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    _wait(lambda: len(_rank_workers(p.pid)) == 2)
    victim = max(_rank_workers(p.pid), key=lambda w: b"--rank\x001" in Path(f"/proc/{w}/cmdline").read_bytes())
    os.kill(victim, signal.SIGKILL)
    _, err = p.communicate(timeout=60)
    if p.returncode == 0:  # the rank had already finished its part
        pytest.skip("the rank process finished before it was killed")
    assert p.returncode == 2 and "case 'd1': rank process 1 of 2: killed by SIGKILL" in err, err
