"""Speed of deepgemm_ref.ep's dispatch and combine (in-process form), as ratios to NumPy baselines.

    python benchmarks/bench_ep.py                        # 8 ranks x 2048 tokens, hidden 7168, top-6 of 256
    python benchmarks/bench_ep.py --tokens 512 --rounds 7
    python benchmarks/bench_ep.py --payload all_to_all   # the path other transports take

Configuration (defaults): 8 ranks as threads of this process (``deepgemm_ref.comm.LocalGroup``),
2048 bf16 tokens of hidden 7168 per rank, each selecting 6 of 256 experts (random scores, no
masked slots).

* dispatch (non-expanded, CPU sync) against one NumPy fancy-index gather per rank that produces
  the same received rows (``x_all[rows_r]``, the rows in the canonical order);
* combine (expanded layout, ``allow_multiple_reduction=False``: every slot row travels alone and
  enters the float32 sum in top-k order) against NumPy's float32 sum over the top-k axis of the
  same slot rows per source rank (``a.astype(float32).sum(axis=1).astype(bfloat16)`` of the
  (T, K, H) rows: convert, reduce, round).  Both give the same bytes, checked before timing.
  The non-expanded combine is printed too (information, no goal).

The baseline and the candidate run on the same R rank threads (each rank's share of the work in
its own thread), the BLAS and the package's pool pinned to one thread on both sides.  Each timed
call gets a fresh group and fresh buffers (the construction, one barrier, and the dispatch that
makes a combine's handles are not timed).  Baseline and candidate run interleaved (baseline,
candidate, candidate, baseline, ...) after one warm-up each; the ratio is the median of the
per-round ratios.  Goals: dispatch and combine at most 3x their baselines.

``--payload``: in-process groups move payloads by one shared ``all_gather`` per rank (default,
``shared``); ``all_to_all`` times the path of the other transports (only the rows each rank needs,
copied by the transport) on the same in-process group.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
from _common import ROOT  # noqa: F401,I001  (benchmarks run as scripts; puts the repository on sys.path)

import deepgemm_ref.ep as deep_ep
from deepgemm_ref import _parallel
from deepgemm_ref.comm import LocalGroup

BF16 = np.dtype(ml_dtypes.bfloat16)
Timed = Callable[[], float]


def on_ranks(group: LocalGroup, fn: Callable[[int], Any]) -> list[Any]:
    """``fn(r)`` for every rank of ``group``, one thread each (as run_emulated runs ranks)."""
    out: list[Any] = [None] * group.size()
    errors: list[BaseException] = []

    def body(r: int) -> None:
        try:
            out[r] = fn(r)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
            group.abort(r, e)

    threads = [threading.Thread(target=body, args=(r,)) for r in range(group.size())]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out


def interleaved(base: Timed, cand: Timed, rounds: int) -> tuple[float, float, float]:
    """(median ratio, median baseline s, median candidate s) over interleaved rounds (one warm-up
    each); each function returns the seconds of its timed part."""
    base()
    cand()
    tb: list[float] = []
    tc: list[float] = []
    for r in range(rounds):
        for fn in ((base, cand) if r % 2 == 0 else (cand, base)):
            (tb if fn is base else tc).append(fn())
    return statistics.median(c / b for b, c in zip(tb, tc, strict=True)), statistics.median(tb), statistics.median(tc)


def report(title: str, goal: float | None, ratio: float, tb: float, tc: float) -> bool:
    ok = goal is None or ratio <= goal
    verdict = "info" if goal is None else ("pass" if ok else "FAIL")
    goal_txt = "  -  " if goal is None else f"<= {goal:g}"
    print(f"  {ratio:7.2f}x  {goal_txt} {verdict:4}   {title}   "
          f"baseline {tb * 1e3:.0f} ms, candidate {tc * 1e3:.0f} ms", flush=True)
    return ok


class Bench:
    """Inputs of the case and the timed calls."""

    def __init__(self, R: int, T: int, H: int, K: int, E: int) -> None:
        self.R, self.T, self.H, self.K, self.E = R, T, H, K, E
        rng = np.random.default_rng(0)
        self.xs = [rng.standard_normal((T, H), dtype=np.float32).astype(BF16) for _ in range(R)]
        self.idx = [np.argpartition(-rng.random((T, E), dtype=np.float32), K - 1, axis=1)[:, :K].astype(np.int64)
                    for _ in range(R)]
        self.lays = deep_ep.routing.case_layouts(self.idx, E, T)
        self.x_all = np.concatenate(self.xs)
        self.rows = [lay.src_rank * T + lay.src_token for lay in self.lays]
        # the combine input: every owner's expanded rows, and per source rank the same rows as (T, K, H)
        self.ys = [rng.standard_normal((lay.num_expanded_tokens, H), dtype=np.float32).astype(BF16)
                   for lay in self.lays]
        self.slot_rows = []
        for s in range(R):
            a = np.empty((T, K, H), BF16)
            for q, lay in enumerate(self.lays):
                mine = lay.src_rank == s
                tok, slots = lay.src_token[mine], lay.slot_row[mine]
                n_i, k_i = np.nonzero(slots >= 0)
                a[tok[n_i], k_i] = self.ys[q][slots[n_i, k_i]]
            self.slot_rows.append(a)

    def buffers(self, **kw: Any) -> tuple[LocalGroup, list[Any]]:
        # A fresh group for every timed call: LocalGroup keeps every collective's items, so one
        # long-lived group would hold every payload ever sent (reported to the comm owner).
        g = LocalGroup(self.R, timeout_s=600.0)
        return g, on_ranks(g, lambda r: deep_ep.ElasticBuffer(
            g.rank(r), num_max_tokens_per_rank=self.T, hidden=self.H, num_topk=self.K, **kw))

    # -- dispatch --

    def gather(self) -> float:
        g = LocalGroup(self.R)
        t0 = time.perf_counter()
        self._gathered = on_ranks(g, lambda r: self.x_all[self.rows[r]])
        return time.perf_counter() - t0

    def dispatch(self) -> float:
        g, bufs = self.buffers()
        t0 = time.perf_counter()
        self._dispatched = on_ranks(g, lambda r: bufs[r].dispatch(self.xs[r], self.idx[r], num_experts=self.E)[0])
        return time.perf_counter() - t0

    # -- combine --

    def reduce(self) -> float:
        g = LocalGroup(self.R)
        t0 = time.perf_counter()
        self._reduced = on_ranks(g, lambda r: self.slot_rows[r].astype(np.float32).sum(axis=1).astype(BF16))
        return time.perf_counter() - t0

    def combine(self, expand: bool) -> Timed:
        def run() -> float:
            g, bufs = self.buffers(allow_multiple_reduction=not expand)
            outs = on_ranks(g, lambda r: bufs[r].dispatch(self.xs[r], self.idx[r], num_experts=self.E,
                                                          do_expand=expand))
            inputs = self.ys if expand else [o[0] for o in outs]
            t0 = time.perf_counter()
            self._combined = on_ranks(g, lambda r: bufs[r].combine(inputs[r], outs[r][3])[0])
            return time.perf_counter() - t0

        return run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--topk", type=int, default=6)
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--payload", choices=("shared", "all_to_all"), default="shared")
    args = ap.parse_args()
    from deepgemm_ref.ep import _buffer

    _buffer.SHARED_ALL_GATHER = args.payload == "shared"
    _parallel.limit_blas_threads(1)
    os.environ["DEEPGEMM_REF_NUM_THREADS"] = "1"
    b = Bench(args.ranks, args.tokens, args.hidden, args.topk, args.experts)
    print(f"{b.R} ranks x {b.T} tokens, hidden {b.H}, top-{b.K} of {b.E} experts, bf16; numpy {np.__version__}, "
          f"{os.cpu_count()} CPUs, payload path: {args.payload}", flush=True)
    ok = []

    b.gather()
    b.dispatch()
    assert all(np.array_equal(x.view(np.uint16), y.view(np.uint16))
               for x, y in zip(b._dispatched, b._gathered, strict=True)), "dispatch differs from the gather"
    ok.append(report("dispatch (non-expanded) vs NumPy fancy-index gather of the same rows", 3.0,
                     *interleaved(b.gather, b.dispatch, args.rounds)))
    b._dispatched = b._gathered = None

    combine = b.combine(expand=True)
    b.reduce()
    combine()
    assert all(np.array_equal(x.view(np.uint16), y.view(np.uint16))
               for x, y in zip(b._combined, b._reduced, strict=True)), "combine differs from the float32 sum"
    ok.append(report("combine (expanded, slot rows alone) vs NumPy float32 sum over top-k", 3.0,
                     *interleaved(b.reduce, combine, args.rounds)))
    report("combine (non-expanded, one row per owner) vs the same baseline", None,
           *interleaved(b.reduce, b.combine(expand=False), args.rounds))
    print("all goals met" if all(ok) else "some goals missed", flush=True)


if __name__ == "__main__":
    main()
