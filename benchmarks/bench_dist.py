"""Ranks as processes: Mega MoE over a gloo group against the single-process emulation of the
same call, and DeepEP's dispatch + combine at the seeds' configuration as 8 processes.

    python benchmarks/bench_dist.py                      # Mega MoE over 2 and 4 processes, EP over 8
    python benchmarks/bench_dist.py --ranks 2 --rounds 5 --skip-ep

Mega MoE (``fp8_fp4_mega_moe``, DeepGEMM's FP8 x FP4 path under ``sm100``; the sizes are
DeepGEMM's ``tests/test_mega_moe.py`` arguments scaled to this machine: ``--num-max-tokens-per-rank
--hidden --intermediate-hidden --num-experts --num-topk``, printed with the result): the baseline
is the single-process emulation (``EmulatedGroup(R)``, every rank's call in this process, the
last one computing the layer); the candidate is the same layer with R worker processes, one rank
each, over a gloo group (each worker's call from a barrier to the barrier after it; the slowest
rank counts).  The same inputs (seeded) give the same bytes in both forms, checked before timing.
Every process (this one and the workers) runs its BLAS and the package's pool on one thread.
Rounds are interleaved (baseline, candidate, candidate, baseline, ...) after one warm-up each;
the ratio is the median of the per-round ratios.  Goal: at most 1.5x.

DeepEP (``ElasticBuffer`` dispatch, non-expanded, then combine) with 8 processes x 2048 bf16
tokens, hidden 7168, top-6 of 256 experts: the time of one dispatch + combine (slowest rank),
printed beside the in-process form's time (ranks as threads, ``run_emulated``); information, no goal.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from typing import Any

os.environ["DEEPGEMM_REF_NUM_THREADS"] = "1"
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
from _common import ROOT  # noqa: E402,F401  (benchmarks run as scripts; puts the repository on sys.path)

MEGA = dict(tokens=96, hidden=1024, intermediate=512, experts_per_rank=4, topk=6)


def _problem(R: int, cfg: dict[str, int]) -> Any:
    from tests.test_mega_moe import Problem

    return Problem(R, cfg["experts_per_rank"] * R, cfg["tokens"], cfg["topk"], cfg["hidden"], cfg["intermediate"],
                   seed=7)


def _fill(buf: Any, p: Any, r: int) -> None:
    n = p.N[r]
    buf.x[:n], buf.x_sf[:n] = p.xq[r], p.x_sf_packed[r]
    buf.topk_idx[:n] = p.idx[r]
    buf.topk_weights[:n] = p.w[r]


def _mega_worker(rank: int, R: int, store: str, cfg: dict[str, int], conn: Connection) -> None:
    import torch.distributed as dist

    from deepgemm_ref import _parallel, mega
    from tests.test_mega_moe import BF16

    _parallel.limit_blas_threads(1)
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=R)
    p = _problem(R, cfg)
    t = -(-cfg["tokens"] // 384) * 384
    buf = mega.get_symm_buffer_for_mega_moe(dist.group.WORLD, p.E, t, p.K, p.H, p.I)
    _fill(buf, p, rank)
    l1, l2 = p.cuda_weights(rank)
    y = np.zeros((p.N[rank], p.H), BF16)

    def call() -> bytes:
        mega.fp8_fp4_mega_moe(y, l1, l2, buf)
        return y.tobytes()

    _serve(conn, call)


def _ep_worker(rank: int, R: int, store: str, cfg: dict[str, int], conn: Connection) -> None:
    import torch.distributed as dist

    from deepgemm_ref import _parallel
    from deepgemm_ref import ep as deep_ep

    _parallel.limit_blas_threads(1)
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=R)
    x, idx, w = _ep_inputs(rank, cfg)
    buf = deep_ep.ElasticBuffer(dist.group.WORLD, num_max_tokens_per_rank=cfg["tokens"], hidden=cfg["hidden"],
                                num_topk=cfg["topk"])

    def call() -> bytes:
        recv_x, _, recv_w, handle, _ = buf.dispatch(x, topk_idx=idx, topk_weights=w, num_experts=cfg["experts"])
        buf.combine(recv_x, handle, topk_weights=recv_w)
        return b""

    _serve(conn, call)


def _serve(conn: Connection, call: Any) -> None:
    """A worker's rounds: on "run" / "bytes" time ``call`` from a barrier to the barrier after it
    and send (seconds, its bytes for "bytes"); on "stop" leave the group."""
    import torch.distributed as dist

    while True:
        cmd = conn.recv()
        if cmd == "stop":
            break
        dist.barrier()
        t0 = time.perf_counter()
        out = call()
        dist.barrier()
        conn.send((time.perf_counter() - t0, out if cmd == "bytes" else b""))
    dist.destroy_process_group()


def _ep_inputs(rank: int, cfg: dict[str, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    import ml_dtypes

    g = np.random.default_rng(100 + rank)
    x = g.standard_normal((cfg["tokens"], cfg["hidden"]), dtype=np.float32).astype(ml_dtypes.bfloat16)
    idx = np.argsort(g.random((cfg["tokens"], cfg["experts"])), axis=1)[:, :cfg["topk"]].astype(np.int64)
    w = g.random((cfg["tokens"], cfg["topk"]), dtype=np.float32)
    return x, idx, w


class Workers:
    """R spawned processes, one rank each of a gloo group, driven round by round through pipes."""

    def __init__(self, target: Any, R: int, cfg: dict[str, int]) -> None:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self._dir = tempfile.TemporaryDirectory()
        store = os.path.join(self._dir.name, "store")
        self.conns, self.procs = [], []
        for r in range(R):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=target, args=(r, R, store, cfg, child), daemon=True)
            proc.start()
            self.conns.append(parent)
            self.procs.append(proc)

    def round(self, cmd: str = "run") -> tuple[float, list[bytes]]:
        for c in self.conns:
            c.send(cmd)
        got = [c.recv() for c in self.conns]
        return max(t for t, _ in got), [b for _, b in got]

    def close(self) -> None:
        for c in self.conns:
            c.send("stop")
        for p in self.procs:
            p.join(60)
        self._dir.cleanup()


def mega_single(R: int, cfg: dict[str, int]) -> tuple[Any, Any]:
    """(timed call, bytes of every rank's y) of the single-process emulation."""
    from deepgemm_ref import mega
    from tests.test_mega_moe import BF16

    p = _problem(R, cfg)
    group = mega.EmulatedGroup(R)
    t = -(-cfg["tokens"] // 384) * 384
    bufs = [mega.get_symm_buffer_for_mega_moe(group.rank(r), p.E, t, p.K, p.H, p.I) for r in range(R)]
    for r in range(R):
        _fill(bufs[r], p, r)
    weights = [p.cuda_weights(r) for r in range(R)]
    ys = [np.zeros((p.N[r], p.H), BF16) for r in range(R)]

    def call() -> float:
        t0 = time.perf_counter()
        for r in range(R):
            mega.fp8_fp4_mega_moe(ys[r], weights[r][0], weights[r][1], bufs[r])
        return time.perf_counter() - t0

    return call, lambda: [y.tobytes() for y in ys]


def bench_mega(R: int, rounds: int) -> bool:
    cfg = dict(MEGA)
    call, ys = mega_single(R, cfg)
    workers = Workers(_mega_worker, R, cfg)
    try:
        call()
        _, got = workers.round("bytes")
        same = got == ys()
        ratios, base, cand = [], [], []
        for i in range(rounds):
            if i % 2 == 0:
                b = call()
                c, _ = workers.round()
            else:
                c, _ = workers.round()
                b = call()
            base.append(b)
            cand.append(c)
            ratios.append(c / b)
    finally:
        workers.close()
    ratio = statistics.median(ratios)
    ok = same and ratio <= 1.5
    print(f"  {ratio:5.2f}x  <= 1.5 {'pass' if ok else 'FAIL'}   fp8_fp4_mega_moe, {R} processes over gloo vs one "
          f"process ({R} ranks emulated): --num-processes {R} --num-max-tokens-per-rank {cfg['tokens']} --hidden "
          f"{cfg['hidden']} --intermediate-hidden {cfg['intermediate']} --num-experts {cfg['experts_per_rank'] * R} "
          f"--num-topk {cfg['topk']}   baseline {statistics.median(base) * 1e3:.0f} ms, candidate "
          f"{statistics.median(cand) * 1e3:.0f} ms, bytes {'equal' if same else 'DIFFER'}", flush=True)
    return ok


def bench_ep(R: int, rounds: int) -> None:
    from deepgemm_ref import ep as deep_ep

    cfg = dict(tokens=2048, hidden=7168, topk=6, experts=256)
    inputs = [_ep_inputs(r, cfg) for r in range(R)]

    def threads() -> float:
        def fn(group: Any) -> float:
            r = group.rank()
            x, idx, w = inputs[r]
            buf = deep_ep.ElasticBuffer(group, num_max_tokens_per_rank=cfg["tokens"], hidden=cfg["hidden"],
                                        num_topk=cfg["topk"])
            group.barrier()
            t0 = time.perf_counter()
            recv_x, _, recv_w, handle, _ = buf.dispatch(x, topk_idx=idx, topk_weights=w, num_experts=cfg["experts"])
            buf.combine(recv_x, handle, topk_weights=recv_w)
            group.barrier()
            return time.perf_counter() - t0

        return max(deep_ep.run_emulated(fn, R))

    workers = Workers(_ep_worker, R, cfg)
    try:
        workers.round()
        threads()
        proc, thr = [], []
        for _ in range(rounds):
            proc.append(workers.round()[0])
            thr.append(threads())
    finally:
        workers.close()
    print(f"  info           DeepEP dispatch + combine, {R} processes x {cfg['tokens']} tokens, "
          f"hidden {cfg['hidden']}, top-{cfg['topk']} of {cfg['experts']}: "
          f"{statistics.median(proc) * 1e3:.0f} ms over gloo; "
          f"{statistics.median(thr) * 1e3:.0f} ms as threads of one process", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="*", default=[2, 4])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ep-ranks", type=int, default=8)
    ap.add_argument("--skip-ep", action="store_true")
    args = ap.parse_args()
    from deepgemm_ref import _parallel

    _parallel.limit_blas_threads(1)
    print(f"numpy {np.__version__}, {os.cpu_count()} CPUs, BLAS and pools on one thread per process", flush=True)
    ok = all([bench_mega(R, args.rounds) for R in args.ranks])
    if not args.skip_ep:
        bench_ep(args.ep_ranks, max(1, args.rounds // 2))
    print("all goals met" if ok else "some goals missed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
