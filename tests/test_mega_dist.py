"""Mega MoE on a real ``torch.distributed`` group, one rank per process (gloo): every kernel and
recipe gives the bytes of the single-process emulation (``EmulatedGroup``) for the same inputs,
outputs, statistics and trace records alike; ranks that disagree all raise; a rank that dies
makes the others fail instead of hanging.

Each child process builds the same global problem (``tests.test_mega_moe.Problem``, seeded),
puts only its own rank's tokens into its own ``SymmBuffer`` and calls the kernel with its own
experts' weights; the parent computes the same layer with every rank in one process.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from deepgemm_ref import trace

from .ep_model import run_rank_processes
from .test_mega_moe import Problem, run_ascend, run_cuda

torch = pytest.importorskip("torch", reason="torch.distributed is needed for process groups")
pytestmark = pytest.mark.torch

ROOT = Path(__file__).resolve().parent.parent

_CHILD = textwrap.dedent("""
    import json, os, sys
    import numpy as np
    import torch.distributed as dist
    rank, R, store, out, spec = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], json.loads(sys.argv[5])
    import deepgemm_ref as dg
    from deepgemm_ref import mega, trace
    from tests.test_mega_moe import BF16, Problem, _pairs
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=R)
    group = dist.group.WORLD
    p = Problem(R, spec["E"], spec["N"], spec["K"], spec["H"], spec["I"], seed=spec["seed"],
                masked_ratio=spec["masked"], num_tokens=spec["num_tokens"], shared=spec["shared"])
    n = p.N[rank]
    result = {}
    try:
        if spec["die"] == rank:
            os._exit(3)  # this rank dies before the collective
        with dg.numerics(arch=spec["arch"], accumulation=spec["acc"]), \
                trace.capture(want_acc=True, want_S=True) as cap:
            if spec["arch"] == "ascend950":
                buf = mega.SymmBuffer(group, p.E, max(p.N), p.K, p.H, p.I, num_shared_experts=p.S)
                buf.x[:n], buf.x_sf[:n] = p.xq[rank], _pairs(p.x_sf32[rank])
                l1, l2 = p.ascend_weights(rank)
                shared = p.ascend_shared() if p.S else (None, None)
            else:
                t = -(-max(max(p.N), 1) // 384) * 384 + (384 if spec["bad_tokens"] == rank else 0)
                buf = mega.get_symm_buffer_for_mega_moe(group, p.E, t, p.K, p.H, p.I,
                                                        mma_type="bf16xbf16" if spec["bf16"] else "fp8xfp4")
                if spec["bf16"]:
                    buf.x[:n] = p.x[rank]
                    l1, l2 = mega.transform_weights_for_mega_moe(p.w1_bf16[p.experts_of(rank)],
                                                                 p.w2_bf16[p.experts_of(rank)])
                else:
                    buf.x[:n], buf.x_sf[:n] = p.xq[rank], p.x_sf_packed[rank]
                    l1, l2 = p.cuda_weights(rank)
            buf.topk_idx[:n] = p.idx[rank]
            buf.topk_weights[:n] = p.w[rank]
            if spec["die_late"] == rank:
                os._exit(3)  # this rank dies with its buffer made, before the kernel's collective
            y = np.full((n, p.H), np.nan, BF16)
            if spec["arch"] == "ascend950":
                stats = np.zeros(p.E_l, np.int32)
                mega.fp8_fp4_mega_moe(y, l1, l2, buf, shared[0], shared[1], stats, activation_clamp=10.0)
            else:
                stats = np.arange(p.E_l, dtype=np.int32)
                fn = mega.bf16_mega_moe if spec["bf16"] else mega.fp8_fp4_mega_moe
                fn(y, l1, l2, buf, stats, activation_clamp=10.0, fast_math=True)
        rec = cap.last
        arrays = {"y": y.view(np.uint16), "stats": stats, "acc": rec.acc, "S": rec.S}
        arrays.update({"extra." + k: (v.view(np.uint8) if v.dtype.itemsize == 1 else v)
                       for k, v in rec.extra.items()})
        if spec["arch"] == "ascend950":
            arrays["expert_recv_count"] = buf.expert_recv_count.copy()
        np.savez(out + ".npz", **arrays)
        result = {"stats": rec.stats, "tasks": list(rec.tasks)}
    except Exception as e:  # noqa: BLE001 - reported to the parent
        result = {"error": type(e).__name__, "message": str(e)}
    with open(out + ".json", "w") as f:
        json.dump(result, f)
    if "error" not in result or result["error"] == "DGArgumentError":
        dist.barrier()  # leave together: gloo can abort a process whose peer tears the group down mid-talk
        dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # no interpreter teardown with gloo's threads around (the result files are written)
""")


def _spec(**kw: Any) -> dict[str, Any]:
    spec = {"E": 8, "N": 6, "K": 3, "H": 512, "I": 512, "seed": 5, "masked": 0.2, "num_tokens": None,
            "shared": 0, "arch": "sm100", "bf16": False, "die": -1, "die_late": -1, "bad_tokens": -1, "acc": "exact"}
    spec.update(kw)
    return spec


def _run_processes(tmp_path: Path, R: int, spec: dict[str, Any], expect_ok: bool = True) -> list[dict[str, Any]]:
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    argv = lambda r: [sys.executable, str(script), str(r), str(R), str(tmp_path / "store"),  # noqa: E731
                      str(tmp_path / f"out{r}"), json.dumps(spec)]
    if expect_ok:
        run_rank_processes(argv, R, env)
    else:
        import subprocess

        procs = [subprocess.Popen(argv(r), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for r in range(R)]
        for p in procs:
            try:
                p.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                pytest.fail("a rank hung for 120 s instead of failing")
    results = []
    for r in range(R):
        f = tmp_path / f"out{r}.json"
        res = json.loads(f.read_text()) if f.exists() else {"missing": True}
        if (tmp_path / f"out{r}.npz").exists():
            with np.load(tmp_path / f"out{r}.npz", allow_pickle=False) as z:
                res["arrays"] = {k: z[k] for k in z.files}
        results.append(res)
    return results


def _single_process(R: int, spec: dict[str, Any]) -> tuple[list[Any], list[Any], list[Any], list[Any]]:
    import deepgemm_ref as dg

    p = Problem(R, spec["E"], spec["N"], spec["K"], spec["H"], spec["I"], seed=spec["seed"],
                masked_ratio=spec["masked"], num_tokens=spec["num_tokens"], shared=spec["shared"])
    with dg.numerics(arch=spec["arch"], accumulation=spec["acc"]), trace.capture(want_acc=True, want_S=True) as cap:
        if spec["arch"] == "ascend950":
            ys, stats, bufs = run_ascend(p)
            counts = [b.expert_recv_count.copy() for b in bufs]
        else:
            ys, stats, _ = run_cuda(p, bf16=spec["bf16"])
            counts = [None] * R
    return ys, stats, cap.records, counts


def _assert_same(results: list[dict[str, Any]], R: int, spec: dict[str, Any]) -> None:
    ys, stats, records, counts = _single_process(R, spec)
    assert len(records) == R
    for r in range(R):
        res = results[r]
        assert "error" not in res, res
        a = res["arrays"]
        rec = records[r]
        assert a["y"].tobytes() == ys[r].view(np.uint16).tobytes(), f"rank {r}: y differs"
        assert a["stats"].tobytes() == stats[r].tobytes(), f"rank {r}: stats differ"
        assert a["acc"].tobytes() == rec.acc.tobytes() and a["S"].tobytes() == rec.S.tobytes(), f"rank {r}"
        extra = {k[6:]: v for k, v in a.items() if k.startswith("extra.")}
        assert sorted(extra) == sorted(rec.extra), f"rank {r}: stage names"
        for k, v in rec.extra.items():
            want = v.view(np.uint8) if v.dtype.itemsize == 1 else v
            assert extra[k].shape == want.shape and extra[k].tobytes() == want.tobytes(), f"rank {r}: stage {k}"
        assert res["stats"] == rec.stats and list(res["stats"]) == list(rec.stats), f"rank {r}: record stats"
        assert res["tasks"] == list(rec.tasks), f"rank {r}: task labels"
        if counts[r] is not None:
            assert a["expert_recv_count"].tobytes() == counts[r].tobytes()


@pytest.mark.parametrize("kind", ["fp8xfp4", "bf16xbf16", "ascend950", "fp8xfp4 fp32", "ascend950 fp32"])
def test_two_processes_give_the_single_process_bytes(tmp_path, kind):
    """Every kernel, under the default (exact) and the float32 accumulation models."""
    spec = _spec(bf16="bf16xbf16" in kind, arch="ascend950" if "ascend950" in kind else "sm100",
                 shared=1 if "ascend950" in kind else 0, num_tokens=[6, 3],
                 acc="fp32" if "fp32" in kind else "exact")
    _assert_same(_run_processes(tmp_path, 2, spec), 2, spec)


@pytest.mark.slow
@pytest.mark.parametrize(("R", "kind"), [(4, "fp8xfp4"), (4, "ascend950"), (8, "fp8xfp4")])
def test_four_and_eight_processes_give_the_single_process_bytes(tmp_path, R, kind):
    spec = _spec(E=2 * R, bf16=kind == "bf16xbf16", arch="ascend950" if kind == "ascend950" else "sm100",
                 shared=1 if kind == "ascend950" else 0, num_tokens=[(3 * r + 2) % 7 for r in range(R)], K=4)
    _assert_same(_run_processes(tmp_path, R, spec), R, spec)


def test_ranks_that_disagree_all_raise_the_argument_error(tmp_path):
    spec = _spec(bad_tokens=1)
    results = _run_processes(tmp_path, 2, spec)
    for r, res in enumerate(results):
        assert res.get("error") == "DGArgumentError", (r, res)
        assert "num_max_tokens_per_rank" in res["message"] and "differing ranks: [1]" in res["message"], res


@pytest.mark.slow
@pytest.mark.parametrize("when", ["before its buffer", "before the kernel"])
def test_a_rank_that_dies_fails_the_others_naming_it(tmp_path, when):
    t0 = time.monotonic()
    spec = _spec(E=6, die=2) if when == "before its buffer" else _spec(E=6, die_late=2)
    results = _run_processes(tmp_path, 3, spec, expect_ok=False)
    assert time.monotonic() - t0 < 120
    assert results[2].get("missing")
    for r in (0, 1):
        assert results[r].get("error") == "RuntimeError", results[r]
        want = "rank 2 never joined" if when == "before its buffer" else "rank 2 (process "
        assert want in results[r]["message"], results[r]["message"]
