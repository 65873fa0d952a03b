"""DeepGEMM's ``init_dist`` / ``uneven_all_gather`` / ``dist_print`` on gloo, and the runner that
runs DeepGEMM's (and DeepEP's) own multi-process test files unchanged on the CPU
(``python -m deepgemm_ref.testing.dg_tests``).

DeepGEMM's ``tests/test_mega_moe.py`` and DeepEP's ``tests/elastic/test_ep.py`` (with the
``deep_ep/utils/refs.py`` and ``gate.py`` it imports) are read UNCHANGED from the mirrors at test
time (``git show``) into temporary directories; nothing of them is in the repository.  Skipped
when a mirror is absent.  Every runner invocation checks what the test file printed: the Mega MoE
runs must print ``Correctness test #1/1 passed`` (so the bitwise check against the DeepEP +
grouped GEMM + TileLang baseline really ran), not DeepGEMM's "Failed to load legacy code" (which
would skip that check), and one performance line per rank.
"""

from __future__ import annotations

import json
import multiprocessing.spawn
import os
import re
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed; torch.distributed is needed")
pytestmark = pytest.mark.torch

import deepgemm_ref as dg  # noqa: E402
from deepgemm_ref.comm import process as comm_process  # noqa: E402
from deepgemm_ref.errors import DGArgumentError  # noqa: E402
from deepgemm_ref.testing import dg_tests  # noqa: E402
from deepgemm_ref.utils import dist as dg_dist  # noqa: E402

DG_MIRROR = Path(os.environ.get("DEEPGEMM_MIRROR", "/work/.mirror/deepseek-ai+DeepGEMM/repo"))
EP_MIRROR = Path(os.environ.get("DEEPEP_MIRROR", "/work/.mirror/deepseek-ai+DeepEP/repo"))
ROOT = Path(__file__).resolve().parent.parent
#: The runner's own limit per invocation (a hung collective fails the test instead of the suite).
TIMEOUT_S = 900


def _git_show(mirror: Path, path: str) -> str:
    if not mirror.exists():
        pytest.skip(f"mirror not found at {mirror}")
    r = subprocess.run(["git", "-C", str(mirror), "show", f"HEAD:{path}"], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"{path} not readable from {mirror}: {r.stderr.strip()}")
    return r.stdout


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_runner(*args: str, runner_options: tuple[str, ...] = ("--bench-tests", "1")) -> tuple[int, str, float]:
    """``python -m deepgemm_ref.testing.dg_tests [runner_options] ARGS``: (exit status, stdout and
    stderr, wall seconds).  MASTER_PORT is left to the runner (a free port)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_PORT", dg_tests.ENV)}
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "deepgemm_ref.testing.dg_tests", *runner_options, *args], env=env,
                       cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S)
    wall = time.perf_counter() - t0
    print(f"runner wall time {wall:.1f} s: {' '.join(args[1:])}")
    return r.returncode, r.stdout + r.stderr, wall


# ----------------------------------------------------------------------------------------------
# init_dist / uneven_all_gather / dist_print: arguments, in this process
# ----------------------------------------------------------------------------------------------

def test_arguments_are_checked_before_any_collective(monkeypatch):
    import torch.distributed as dist

    had_group = dist.is_initialized()
    x = torch.zeros(3, 2)
    for kwargs, arg in (({"tensor": [1, 2]}, "tensor"), ({"tensor": torch.tensor(1.0)}, "tensor"),
                        ({"tensor": x, "dim": 2}, "dim"), ({"tensor": x, "dim": -3}, "dim"),
                        ({"tensor": x, "dim": True}, "dim")):
        with pytest.raises(DGArgumentError, match=rf"^uneven_all_gather: {arg}: expected"):
            dg.uneven_all_gather(**kwargs)
    if not had_group:
        with pytest.raises(DGArgumentError, match="^uneven_all_gather: group: expected a process group"):
            dg.uneven_all_gather(x)
    for local, n, arg in ((2, 2, "local_rank"), (-1, 2, "local_rank"), (0, 0, "num_local_ranks"),
                          (True, 2, "local_rank"), (0, 2.0, "num_local_ranks")):
        with pytest.raises(DGArgumentError, match=rf"^init_dist: {arg}: expected"):
            dg.init_dist(local, n)
    for env, value in (("MASTER_PORT", "http"), ("MASTER_PORT", "70000"), ("WORLD_SIZE", "0"), ("RANK", "1")):
        monkeypatch.setenv(env, value)
        with pytest.raises(DGArgumentError, match=rf"^init_dist: environment variable {env}: expected"):
            dg.init_dist(0, 1)
        monkeypatch.delenv(env)
    with pytest.raises(DGArgumentError, match="^init_dist: seed: expected an int"):
        dg.testing.envs.init_dist(0, 1, seed=1.5)
    assert dist.is_initialized() == had_group  # nothing was initialised by the failed calls


def test_dist_print_without_a_group_only_prints(capsys):
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a default process group exists in this process")
    dg.utils.dist.dist_print("hello", once_in_node=True)
    dg.testing.envs.dist_print()
    assert capsys.readouterr().out == "hello\n\n"


def test_init_dist_in_one_process_gives_a_one_rank_gloo_group(monkeypatch):
    """World size 1 in this process: the return values, the backend, the default device, and a
    gather that gives the tensor back bitwise; the DeepGEMM-Ascend variant seeds with seed + rank."""
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a default process group exists in this process")
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    dtype = torch.get_default_dtype()
    try:
        rank, world, group = dg.init_dist(0, 1)
        assert (rank, world) == (0, 1) and isinstance(group, dist.ProcessGroup) and group.size() == 1
        assert dist.get_backend() == "gloo" and torch.empty(1).device.type == "cpu"
        x = torch.arange(24, dtype=torch.int16).reshape(2, 3, 4)
        for dim in (0, 1, -1):
            y = dg.uneven_all_gather(x, dim=dim, group=group)
            assert y.dtype == x.dtype and torch.equal(y, x) and y.data_ptr() != x.data_ptr()
        empty = torch.zeros((0, 5), dtype=torch.float8_e4m3fn)
        assert dg.uneven_all_gather(empty).shape == (0, 5)
        dist.destroy_process_group()
        monkeypatch.setenv("MASTER_PORT", str(_free_port()))
        rank, world, group = dg.testing.envs.init_dist(0, 1, seed=11)
        assert (rank, world) == (0, 1) and group is dist.group.WORLD
        assert torch.get_default_dtype() == torch.bfloat16 and torch.initial_seed() == 11
    finally:
        torch.set_default_dtype(dtype)
        if dist.is_initialized():
            dist.destroy_process_group()
        comm_process._local_rank = None


# ----------------------------------------------------------------------------------------------
# the mapping, in this process
# ----------------------------------------------------------------------------------------------

def test_install_maps_cuda_to_the_cpu_and_uninstall_restores_everything():
    import importlib.util

    import torch.distributed as dist

    before = {"get_command_line": multiprocessing.spawn.get_command_line,
              "spec": importlib.util.spec_from_file_location, "sync": torch.cuda.synchronize,
              "event": torch.cuda.Event, "init": dist.init_process_group, "a2a": dist.all_to_all_single,
              "bench_kineto": dg.testing.bench_kineto, "set_default_device": torch.set_default_device}
    assert not any(k.split(".")[0] in ("deep_gemm", "deep_ep", "tilelang", "tilelang_ops") for k in sys.modules)
    with dg_tests.cuda_on_cpu(bench_tests=2):
        x = torch.zeros(3, device="cuda")
        y = torch.ones(2).to("cuda:0").cuda()
        z = torch.empty(2, device=torch.device("cuda", 1))
        assert x.device.type == y.device.type == z.device.type == "cpu"
        assert torch.empty(1, device="meta").device.type == "meta"
        torch.cuda.set_device(3)
        torch.cuda.synchronize()
        torch.cuda._sleep(10)
        assert torch.cuda.current_device() == 3 and torch.cuda.max_memory_allocated() == 0
        assert torch.cuda.get_device_capability() == (10, 0) and not torch.cuda.is_available()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        end.record()
        assert end.elapsed_time(start) <= 0 <= start.elapsed_time(end)
        import deep_ep
        import deep_gemm
        import deep_gemm.utils.dist
        from deep_gemm.testing import bench_kineto
        from tilelang.profiler.bench import do_bench

        assert deep_gemm is dg and deep_ep is importlib.import_module("deepgemm_ref.ep")
        assert deep_gemm.utils.dist is dg_dist and deep_gemm.testing.bench is dg.testing.bench  # DeepGEMM's function
        import deep_ep.utils.testing

        calls = []
        assert bench_kineto(lambda: calls.append(1), "k", num_tests=30) >= 0 and len(calls) == 1 + 2  # capped
        calls.clear()
        assert do_bench(lambda: calls.append(1), _n_warmup=5, _n_repeat=9, return_mode="median") >= 0
        assert len(calls) == 1 + 2 + 2
        calls.clear()
        got = deep_ep.utils.testing.bench_kineto(lambda: calls.append(1), ("a", "b"), num_kernels_per_period=2)
        assert isinstance(got, list) and len(got) == 2 and len(got[0]) == 2 and len(calls) == 1 + 2
        path = os.path.join("/nowhere", "tests", "..", "third-party", "tilelang_ops", "__init__.py")
        spec = importlib.util.spec_from_file_location("tilelang_ops", path)
        ops = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(ops)
        assert ops.swiglu_apply_weight_to_fp8 is dg.mega.stages.swiglu_apply_weight_to_fp8
        assert importlib.util.spec_from_file_location("other", "/nowhere/x.py").loader.__class__.__name__ \
            == "SourceFileLoader"
        cmd = multiprocessing.spawn.get_command_line(pipe_handle=5)
        assert cmd[cmd.index("-c") + 1].startswith("import deepgemm_ref.testing.dg_tests as _dg; _dg.install_from_env();")
        assert json.loads(os.environ[dg_tests.ENV])["bench_tests"] == 2 and dg_tests.installed()["bench_tests"] == 2
        with pytest.raises(RuntimeError, match="already installed"):
            dg_tests.install()
        if not dist.is_initialized():  # nccl -> gloo; float8 through all_to_all_single (a one-rank group)
            dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
            try:
                assert dist.get_backend() == "gloo" and dist.get_backend(dist.new_group([0], backend="nccl")) == "gloo"
                send = torch.arange(12, dtype=torch.uint8).reshape(3, 4).view(torch.float8_e4m3fn)
                recv = torch.empty_like(send)
                dist.all_to_all_single(recv, send, [3], [3])
                assert torch.equal(recv.view(torch.uint8), send.view(torch.uint8))
            finally:
                dist.destroy_process_group()
    after = {"get_command_line": multiprocessing.spawn.get_command_line,
             "spec": importlib.util.spec_from_file_location, "sync": torch.cuda.synchronize,
             "event": torch.cuda.Event, "init": dist.init_process_group, "a2a": dist.all_to_all_single,
             "bench_kineto": dg.testing.bench_kineto, "set_default_device": torch.set_default_device}
    assert after == before and dg_tests.installed() is None and dg_tests.ENV not in os.environ
    assert not any(k.split(".")[0] in ("deep_gemm", "deep_ep", "tilelang", "tilelang_ops") for k in sys.modules)
    assert not hasattr(importlib.import_module("deepgemm_ref.ep.utils"), "testing")
    if not torch.cuda.is_available():
        with pytest.raises((RuntimeError, AssertionError)):
            torch.zeros(1, device="cuda")
    with pytest.raises(DGArgumentError, match="^install: bench_tests: expected"):
        dg_tests.install(bench_tests=0)
    with pytest.raises(DGArgumentError, match="^install: arch: expected"):
        dg_tests.install(arch="ascend950")
    assert dg_tests.installed() is None


def test_a_failed_install_puts_everything_back(monkeypatch):
    import importlib.util

    spec = importlib.util.spec_from_file_location
    finders = list(sys.meta_path)

    def broken() -> dict:
        raise RuntimeError("broken on purpose")

    monkeypatch.setattr(dg_tests, "_cuda_patches", broken)
    with pytest.raises(RuntimeError, match="broken on purpose"):
        dg_tests.install()
    assert dg_tests.installed() is None and sys.meta_path == finders and importlib.util.spec_from_file_location is spec
    assert dg.testing.bench_kineto is dg.testing.bench.bench_kineto and dg_tests.ENV not in os.environ
    assert not any(k.split(".")[0] in ("deep_gemm", "deep_ep", "tilelang", "tilelang_ops") for k in sys.modules)


def test_do_bench_modes_and_quantiles():
    t = iter(range(100))
    assert dg_tests.do_bench(lambda: next(t), _n_warmup=1, _n_repeat=3, quantiles=[0.5]) >= 0
    q = dg_tests.do_bench(lambda: None, _n_repeat=4, quantiles=[0.2, 0.8])
    assert isinstance(q, list) and len(q) == 2 and q[0] <= q[1]
    with pytest.raises(DGArgumentError, match="^do_bench: return_mode: expected"):
        dg_tests.do_bench(lambda: None, return_mode="p50")


def test_command_line_usage_errors():
    assert dg_tests.main([]) == 2
    assert dg_tests.main(["--bench-tests", "0", "x.py"]) == 2
    assert dg_tests.main(["/no/such/test_file.py"]) == 2
    assert dg_tests.main(["--arch"]) == 2


# ----------------------------------------------------------------------------------------------
# init_dist / uneven_all_gather / dist_print over two real gloo processes
# ----------------------------------------------------------------------------------------------

_RANK_SCRIPT = '''
import os
import sys

import torch
import torch.distributed as dist

from deepgemm_ref.errors import DGArgumentError
from deepgemm_ref.testing import envs
from deepgemm_ref.utils.dist import dist_print, init_dist, uneven_all_gather


def piece(rank, kind):
    """Rank `rank`'s tensor of `kind`: a function of (rank, kind) only, so every rank can rebuild all."""
    g = torch.Generator().manual_seed(1000 * rank + len(kind))
    n = 2 + 3 * rank                                      # uneven along the gathered dim: 2, 5
    if kind == "int64_dim0":
        return torch.randint(-2**40, 2**40, (n, 3), generator=g, dtype=torch.int64)
    if kind == "bf16_dim1":
        return torch.randn((4, n), generator=g).to(torch.bfloat16)
    if kind == "fp8_dim-1":                               # every byte pattern, NaNs included
        return torch.randint(0, 256, (2, 3, n), generator=g, dtype=torch.uint8).view(torch.float8_e4m3fn)
    if kind == "int16_dim0":
        return torch.randint(-2**15, 2**15, (n,), generator=g, dtype=torch.int16)
    if kind == "bool_dim0":
        return torch.rand((n, 2), generator=g) > 0.5
    if kind == "empty_rank0_dim0":                        # rank 0 sends no row
        return torch.randn((0 if rank == 0 else n, 7), generator=g).to(torch.float8_e5m2)
    raise AssertionError(kind)


def as_bytes(t):
    return t.contiguous().reshape(-1).view(torch.uint8)


local_rank, num_ranks, port2 = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
rank, world, group = init_dist(local_rank, num_ranks)
assert (rank, world) == (local_rank, num_ranks) and group.size() == num_ranks and group.rank() == rank
assert dist.get_backend(group) == "gloo" and torch.empty(1).device.type == "cpu"

for kind in ("int64_dim0", "bf16_dim1", "fp8_dim-1", "int16_dim0", "bool_dim0", "empty_rank0_dim0"):
    dim = int(kind.rsplit("_dim", 1)[1])
    for g in (group, None):
        got = uneven_all_gather(piece(rank, kind), dim=dim, group=g)
        want = torch.cat([piece(r, kind) for r in range(world)], dim=dim)
        assert got.dtype == want.dtype and got.shape == want.shape, (kind, got.shape, want.shape)
        assert torch.equal(as_bytes(got), as_bytes(want)), kind
try:                                                      # ranks disagree: all raise, nobody hangs
    uneven_all_gather(torch.zeros(2, dtype=torch.bfloat16 if rank == 0 else torch.float16), group=group)
    raise AssertionError("no error for disagreeing dtypes")
except DGArgumentError as e:
    assert str(e).startswith("uneven_all_gather: tensor: expected the same dtype"), e
try:                                                      # a bad dim on every rank: raised before any collective
    uneven_all_gather(torch.zeros(2), dim=1, group=group)
    raise AssertionError("no error for dim")
except DGArgumentError as e:
    assert str(e).startswith("uneven_all_gather: dim: expected"), e
assert torch.equal(uneven_all_gather(torch.tensor([rank]), group=group), torch.arange(world))  # still in step

dist_print(f"<dg-every-rank {rank}>")
dist_print("<dg-once-in-node>", once_in_node=True)
dist.destroy_process_group()

os.environ["MASTER_PORT"] = port2                         # DeepGEMM-Ascend's variant on the same processes
rank2, world2, group2 = envs.init_dist(local_rank, num_ranks, seed=7)
assert (rank2, world2) == (rank, world) and group2 is dist.group.WORLD
assert torch.get_default_dtype() == torch.bfloat16 and torch.initial_seed() == 7 + rank
envs.dist_print(f"<ascend-every-rank {rank}>")
dist.destroy_process_group()
print(f"<rank-ok {rank}>", flush=True)
'''


def test_dist_helpers_over_two_gloo_processes(tmp_path):
    """Two processes, one rank each: uneven gathers of int64, bf16, float8, int16 and bool along
    dims 0, 1 and -1 equal the concatenation of every rank's tensor (rebuilt from its seed on every
    rank), bitwise; disagreeing ranks all raise; dist_print prints per rank or once; then
    DeepGEMM-Ascend's init_dist (default group, bf16 default dtype, seed + rank)."""
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent(_RANK_SCRIPT))
    port, port2 = _free_port(), _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")} | {"MASTER_PORT": str(port)}
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, str(script), str(r), "2", str(port2)], env=env, cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    try:
        outs = [p.communicate(timeout=300)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    print(f"two gloo processes: {time.perf_counter() - t0:.1f} s")
    out = "".join(outs)
    assert all(p.returncode == 0 for p in procs), out[-6000:]
    assert "<rank-ok 0>" in outs[0] and "<rank-ok 1>" in outs[1], out[-3000:]
    assert outs[0].count("<dg-every-rank 0>") == outs[1].count("<dg-every-rank 1>") == 1
    assert out.count("<dg-once-in-node>") == 1 and "<dg-once-in-node>" in outs[0]
    assert out.count("<ascend-every-rank 0>") == out.count("<ascend-every-rank 1>") == 1


@pytest.mark.slow
def test_a_failing_rank_fails_the_run(tmp_path):
    """A spawned child's failed assert reaches the runner's exit status (a broken test cannot pass)."""
    script = tmp_path / "fails.py"
    script.write_text(textwrap.dedent('''
        import torch

        def rank_main(local_rank):
            assert torch.zeros(1, device="cuda").device.type == "cpu"
            assert local_rank == 0, "rank 1 fails on purpose"

        if __name__ == "__main__":
            torch.multiprocessing.spawn(rank_main, nprocs=2)
    '''))
    rc, out, _ = run_runner(str(script))
    assert rc != 0 and "rank 1 fails on purpose" in out, out[-3000:]


# ----------------------------------------------------------------------------------------------
# DeepGEMM's tests/test_mega_moe.py, unchanged
# ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def mega_moe_test(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """DeepGEMM's tests/test_mega_moe.py in a temporary tests/ directory (no third-party/ beside it:
    the runner serves tilelang_ops)."""
    path = tmp_path_factory.mktemp("deepgemm") / "tests" / "test_mega_moe.py"
    path.parent.mkdir()
    path.write_text(_git_show(DG_MIRROR, "tests/test_mega_moe.py"))
    return path


def _mega_args(mma: str, procs: int) -> list[str]:
    h = "512" if mma == "fp8xfp4" else "256"  # fp8xfp4: SF bytes per token must be multiples of 16
    return ["--num-processes", str(procs), "--num-max-tokens-per-rank", "16", "--hidden", h,
            "--intermediate-hidden", h, "--num-experts", str(4 * procs), "--num-topk", "2", "--mma-type", mma]


def run_mega_moe(test_file: Path, mma: str, procs: int) -> str:
    rc, out, wall = run_runner(str(test_file), *_mega_args(mma, procs))
    assert rc == 0, out[-6000:]
    assert "Failed to load legacy code" not in out, out[-3000:]  # the baseline (and its check) was skipped
    lines = out.splitlines()
    assert f" > MMA: {mma}" in lines and f" > Experts: 2/{4 * procs}" in lines
    assert lines.count(" > Correctness test #1/1 passed") == 1, out[-3000:]  # printed once per node
    # one performance line per rank (searched in the whole output: ranks' lines may interleave)
    perf = re.findall(r"> EP: +(\d+)/(\d+) \|", out)
    assert sorted(int(r) for r, _ in perf) == list(range(procs)), perf
    assert all(int(n) == procs for _, n in perf)
    return out


def test_mega_moe_one_process_bf16(mega_moe_test):
    run_mega_moe(mega_moe_test, "bf16xbf16", 1)


@pytest.mark.slow
def test_mega_moe_one_process_fp8_fp4(mega_moe_test):
    run_mega_moe(mega_moe_test, "fp8xfp4", 1)


@pytest.mark.slow
@pytest.mark.parametrize("procs", [2, 4])
@pytest.mark.parametrize("mma", ["fp8xfp4", "bf16xbf16"])
def test_mega_moe_multi_process(mega_moe_test, mma, procs):
    """Skipped (with the kernels' error as the reason) while Mega MoE refuses multi-rank groups."""
    run_mega_moe(mega_moe_test, mma, procs)


# ----------------------------------------------------------------------------------------------
# DeepEP's tests/elastic/test_ep.py, unchanged, with DeepEP's own reference
# ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def deepep_checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A partial DeepEP checkout: tests/elastic/test_ep.py and deep_ep/utils/{refs,gate}.py."""
    root = tmp_path_factory.mktemp("deepep")
    for rel in ("tests/elastic/test_ep.py", "deep_ep/utils/refs.py", "deep_ep/utils/gate.py"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(_git_show(EP_MIRROR, rel))
    return root


_EP_SHAPE = ["--num-tokens", "8", "--hidden", "256", "--num-topk", "2", "--num-experts", "8"]


def _ep_modes(out: str) -> int:
    return sum(1 for ln in out.splitlines() if ln.startswith(" > Testing with do_handle_copy="))


@pytest.mark.slow
def test_deepep_test_ep_two_processes_every_mode(deepep_checkout):
    """All 144 modes of DeepEP's elastic test, its checks against DeepEP's own refs.py included."""
    rc, out, _ = run_runner(str(deepep_checkout / "tests/elastic/test_ep.py"), "--num-processes", "2", *_EP_SHAPE,
                            "--skip-perf-test")
    assert rc == 0, out[-6000:]
    assert " > Ranks: 1 x 2" in out and _ep_modes(out) == 144, out[-3000:]


@pytest.mark.slow
def test_deepep_test_ep_four_processes_variants(deepep_checkout):
    """Four ranks, the performance part (CPU times) and the first mode; then two ranks (the first
    mode) with masked slots and deterministic dispatch, and without CPU sync and multiple reduction.

    (DeepEP's own test fails ``--deterministic`` with ``--do-cpu-sync 0`` on any device: it compares
    the received rows cut to the received count with a second dispatch's uncut worst-case rows.)"""
    path = str(deepep_checkout / "tests/elastic/test_ep.py")
    rc, out, _ = run_runner(path, "--num-processes", "4", *_EP_SHAPE, "--test-first-only")
    assert rc == 0, out[-6000:]
    assert " > Ranks: 1 x 4" in out and _ep_modes(out) == 1
    assert len(re.findall(r"\* EP: +\d/4 \| dispatch:", out)) == 4, out[-3000:]  # ranks' lines may interleave
    for variant in (("--masked-ratio", "0.3", "--deterministic"), ("--do-cpu-sync", "0", "--allow-multiple-reduction", "0")):
        # the first mode only (every mode runs without variants above; CI time)
        rc, out, _ = run_runner(path, "--num-processes", "2", *_EP_SHAPE, "--skip-perf-test", "--test-first-only",
                                *variant)
        assert rc == 0, out[-6000:]
        assert _ep_modes(out) == 1, out[-3000:]


@pytest.mark.slow
def test_deepep_legacy_intranode_and_barrier(deepep_checkout):
    """DeepEP's legacy intranode test (its checks and its tuning loops) and the elastic barrier test."""
    for rel in ("tests/legacy/test_intranode.py", "tests/legacy/test_low_latency.py", "tests/elastic/test_barrier.py"):
        (deepep_checkout / rel).parent.mkdir(parents=True, exist_ok=True)
        (deepep_checkout / rel).write_text(_git_show(EP_MIRROR, rel))  # intranode imports test_low_latency
    rc, out, _ = run_runner(str(deepep_checkout / "tests/legacy/test_intranode.py"), "--num-processes", "2",
                            "--num-tokens", "16", "--hidden", "2048", "--num-topk", "2", "--num-experts", "8")
    assert rc == 0, out[-6000:]
    # 2 previous-event modes x 2 async modes x 3 inputs x with / without top-k, each checked
    assert len(re.findall(r"^\[testing\] Running with .* \.\.\. passed$", out, re.M)) == 24, out[-3000:]
    assert "[tuning] Best combine" in out, out[-3000:]
    rc, out, _ = run_runner(str(deepep_checkout / "tests/elastic/test_barrier.py"), "--num-processes", "2")
    assert rc == 0, out[-6000:]
    assert len(re.findall(r" > EP: +\d/ +2, barrier time:", out)) == 2, out[-3000:]
