"""Speed and memory of the MQA-logits kernels, as ratios to a baseline measured in the same run.

    python benchmarks/bench_mqa.py [--seq 256 --seq-kv 8192 --heads 64 --head-dim 128 --batch 32 --ctx 2048]

Baseline: the float64 matmul of (seq * heads, head_dim) by (head_dim, seq_len_kv) (for the paged
kernel: one such matmul per request over its context), i.e. the per-head scores alone, computed
once by BLAS.  The kernels produce golden logits (exact model by default; ``--model fp32`` for
the device model) in bounded memory: the peak (tracemalloc) must stay within the output plus
256 MiB.  Goal (issue 6): at most 2x the baseline.

Default sizes are DeepGEMM's test sizes (seq_len 2048/8192, seq_len_kv 8192/65536, batch 256,
average context 8192) scaled down for a 2-core machine.
"""

from __future__ import annotations

import argparse
import threading
import time
import tracemalloc

import ml_dtypes
import numpy as np
from _common import row  # noqa: I001  (benchmarks run as scripts)

import deepgemm_ref as dg
from deepgemm_ref import attention as att
from deepgemm_ref import core
from deepgemm_ref._parallel import num_threads

MIB = 2**20


class CoreTimer:
    """Seconds spent inside ``core.exact_accumulator`` (summed over the worker threads)."""

    def __init__(self) -> None:
        self.total = 0.0
        self._orig = core.exact_accumulator
        self._lock = threading.Lock()

    def __enter__(self) -> CoreTimer:
        def timed(*a, **k):
            t0 = time.perf_counter()
            try:
                return self._orig(*a, **k)
            finally:
                with self._lock:
                    self.total += time.perf_counter() - t0

        core.exact_accumulator = timed
        return self

    def __exit__(self, *exc: object) -> None:
        core.exact_accumulator = self._orig


def measure(fn, baseline, repeat: int) -> tuple[float, float, float, int, object]:
    """Alternate baseline and kernel calls ``repeat`` times (the machine may be shared); returns
    (best baseline s, best kernel s, core share of that kernel call, peak traced bytes, result)."""
    baseline()
    t_base, t_fn, share = float("inf"), float("inf"), 0.0
    for _ in range(repeat):
        t0 = time.perf_counter()
        baseline()
        t_base = min(t_base, time.perf_counter() - t0)
        with CoreTimer() as ct:
            t0 = time.perf_counter()
            fn()
            dt = time.perf_counter() - t0
        if dt < t_fn:
            t_fn, share = dt, ct.total
    tracemalloc.start()
    tracemalloc.reset_peak()
    try:
        out = fn()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return t_base, t_fn, share, peak, out


def report(name: str, t_base: float, t: float, core_s: float, peak: int, out_bytes: int) -> None:
    print(row("  baseline: float64 matmul of the per-head scores", t_base, baseline=1.0))
    print(row(f"  {name}", t, **{"vs matmul": t / t_base}))
    print(f"    inside core.exact_accumulator: {core_s * 1e3:.1f} ms summed over {num_threads()} worker thread(s) "
          f"= {core_s / t_base:.2f}x the baseline")
    print(f"    peak {peak / MIB:8.1f} MiB = output {out_bytes / MIB:.1f} MiB + {(peak - out_bytes) / MIB:.1f} MiB "
          f"(bound: output + 256 MiB: {'ok' if peak <= out_bytes + 256 * MIB else 'EXCEEDED'})")


def bench_plain(args: argparse.Namespace) -> None:
    rng = np.random.default_rng(0)
    seq, seq_kv, h, d = args.seq, args.seq_kv, args.heads, args.head_dim
    q = rng.standard_normal((seq, h, d), dtype=np.float32).astype(ml_dtypes.bfloat16)
    kv = rng.standard_normal((seq_kv, d), dtype=np.float32).astype(ml_dtypes.bfloat16)
    q8 = dg.formats.cast(q.astype(np.float32), dg.formats.E4M3, dg.formats.SATURATING_RNE)
    kv8, sf = dg.per_custom_dims_cast_to_fp8(kv, (0,), False)
    w = rng.standard_normal((seq, h), dtype=np.float32)
    ks = np.zeros(seq, np.int32)
    ke = np.full(seq, seq_kv, np.int32)  # every key (the causal test layout computes about the same)
    q64 = q8.astype(np.float64).reshape(seq * h, d)
    k64 = kv8.astype(np.float64)
    print(f"plain: seq {seq}, seq_kv {seq_kv}, heads {h}, head_dim {d}, FP8, float32 logits, clean_logits "
          f"(float64 per-head scores alone: {seq * h * seq_kv * 8 / MIB:.0f} MiB)")
    fn = lambda: att.fp8_fp4_mqa_logits((q8, None), (kv8, sf), w, ks, ke)  # noqa: E731
    t_mm, t, core_s, peak, out = measure(fn, lambda: q64 @ k64.T, args.repeat)
    report(f"fp8_fp4_mqa_logits [{args.model}]", t_mm, t, core_s, peak, out.base.nbytes)  # type: ignore[attr-defined]


def bench_paged(args: argparse.Namespace) -> None:
    rng = np.random.default_rng(1)
    batch, h, d, block_kv = args.batch, args.heads, args.head_dim, 64
    ctx_last = rng.integers(int(0.7 * args.ctx), int(1.3 * args.ctx), batch)
    pages = -(-ctx_last // block_kv)
    total = int(pages.sum())
    table = np.zeros((batch, int(pages.max())), np.int32)
    perm = rng.permutation(total).astype(np.int32)
    o = 0
    for b in range(batch):
        table[b, :pages[b]] = perm[o:o + pages[b]]
        o += pages[b]
    kv = rng.standard_normal((total * block_kv, d), dtype=np.float32).astype(ml_dtypes.bfloat16)
    kv8, sf = dg.per_custom_dims_cast_to_fp8(kv, (0,), False)
    blocks = np.concatenate([kv8.view(np.uint8).reshape(total, block_kv * d), sf.view(np.uint8).reshape(total, -1)],
                            axis=1)
    cache = blocks.reshape(total, block_kv, 1, d + 4)
    q = rng.standard_normal((batch, 1, h, d), dtype=np.float32)
    q8 = dg.formats.cast(q, dg.formats.E4M3, dg.formats.SATURATING_RNE)
    w = rng.standard_normal((batch, h), dtype=np.float32)
    ctx = ctx_last.reshape(batch, 1).astype(np.int32)
    max_len = int(pages.max()) * block_kv
    meta = att.get_paged_mqa_logits_metadata(ctx, block_kv, dg.get_num_sms())
    q64 = q8.astype(np.float64).reshape(batch, h, d)
    k64 = kv8.astype(np.float64)
    tok = [(table[b, :pages[b]][:, None] * block_kv + np.arange(block_kv)).reshape(-1)[:ctx_last[b]]
           for b in range(batch)]
    kb = [k64[t] for t in tok]

    def baseline() -> None:
        for b in range(batch):
            q64[b] @ kb[b].T

    print(f"paged: batch {batch}, next_n 1, avg context {args.ctx}, block_kv {block_kv}, heads {h}, head_dim {d}, FP8 "
          "(baseline: one (H, D) x (D, ctx) matmul per request)")
    fn = lambda: att.fp8_fp4_paged_mqa_logits((q8, None), cache, w, ctx, table, meta, max_len)  # noqa: E731
    t_mm, t, core_s, peak, out = measure(fn, baseline, args.repeat)
    report(f"fp8_fp4_paged_mqa_logits [{args.model}]", t_mm, t, core_s, peak, out.base.nbytes)  # type: ignore[attr-defined]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--seq-kv", type=int, default=8192)
    ap.add_argument("--heads", type=int, default=64)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--model", default="exact", help="exact (golden values) or fp32 (device model)")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print(f"numpy {np.__version__}, ml_dtypes {ml_dtypes.__version__}; task size {att.TASK_ELEMENTS} products")
    t0 = time.perf_counter()
    with dg.numerics(accumulation=args.model):
        bench_plain(args)
        bench_paged(args)
    print(f"total {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
