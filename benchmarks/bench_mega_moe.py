"""Speed and memory of the fused mega-MoE emulation, as ratios to baselines measured in the same run.

    python benchmarks/bench_mega_moe.py                      # DeepSeek-like layer scaled to this machine
    python benchmarks/bench_mega_moe.py --experts 32         # twice the experts, half the rows each
    python benchmarks/bench_mega_moe.py --tokens 128 --fp32  # fewer tokens; also the fp32 model

Configuration (defaults): hidden 7168, intermediate 2048, 8 EP ranks, top-6, 256 tokens per rank,
FP8 activations x FP4 weights with per-32 UE8M0 scales, activation clamp 10.  The expert count is
scaled down with the token count (16 experts, 2 per rank) so that every expert's GEMMs keep
DeepSeek-prefill shapes: about 768 routed rows per expert (DeepGEMM's test: 8192 tokens x 8 ranks
x top-6 / 384 experts = 1024) against (4096 x 7168) and (7168 x 2048) weights.  The emulator's cost
beyond the float64 matmuls is mostly per weight element (decoding FP4 codes and scales into
float64), so fewer rows per expert (``--experts 32``) raise the ratio.

Baseline: ``numpy.matmul`` of float64 operands with exactly the shapes of every L1 and L2 GEMM of
the layer (one per (rank, local expert), with that expert's routed rows): the same total work as
the emulator's GEMMs.  Peak memory is tracemalloc's (NumPy buffers) during the 8 kernel calls
(the collective), relative to the peak of the float64 baseline (one expert's float64 weights and
its activations).  Goal (issue 7): exact model at most 1.5x the float64 matmuls.
"""

from __future__ import annotations

import argparse
import time

import ml_dtypes
import numpy as np
from _common import peak_bytes  # noqa: I001  (benchmarks run as scripts)

import deepgemm_ref as dg
from deepgemm_ref import mega

BF16 = ml_dtypes.bfloat16


def _weights(rng: np.random.Generator, e_l: int, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Random packed FP4 codes and power-of-two scales (around 2^-6) in DeepGEMM's layout 2."""
    w = rng.integers(-128, 128, (e_l, n, k // 2), dtype=np.int16).astype(np.int8)
    sf = np.exp2(rng.integers(-8, -4, (e_l, n, k // 32))).astype(np.float32)
    return w, dg.transform_sf_into_required_layout(sf, n, k, (1, 32), e_l)


def build(ranks: int, experts: int, tokens: int, topk: int, hidden: int, inter: int, seed: int = 0):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    e_l = experts // ranks
    group = mega.EmulatedGroup(ranks)
    bufs = [mega.get_symm_buffer_for_mega_moe(group.rank(r), experts, tokens, topk, hidden, inter)
            for r in range(ranks)]
    idx_all = []
    for b in bufs:
        x = rng.standard_normal((tokens, hidden), dtype=np.float32).astype(BF16)
        b.x[:tokens], b.x_sf[:tokens] = dg.per_token_cast_to_fp8(x, True, 32, True)
        scores = rng.standard_normal((tokens, experts), dtype=np.float32)
        idx = np.argpartition(-scores, topk - 1, axis=1)[:, :topk]
        b.topk_idx[:tokens] = idx
        b.topk_weights[:tokens] = np.take_along_axis(scores, idx, 1)
        idx_all.append(idx)
    weights = [mega.transform_weights_for_mega_moe(_weights(rng, e_l, 2 * inter, hidden),
                                                   _weights(rng, e_l, hidden, inter)) for _ in range(ranks)]
    ys = [np.empty((tokens, hidden), BF16) for _ in range(ranks)]
    stats = [np.zeros(e_l, np.int32) for _ in range(ranks)]
    rows = np.bincount(np.concatenate(idx_all).ravel(), minlength=experts)

    def layer() -> None:
        for r in range(ranks):
            mega.fp8_fp4_mega_moe(ys[r], *weights[r], bufs[r], stats[r], activation_clamp=10.0)

    return layer, rows


def baseline(rows: np.ndarray, hidden: int, inter: int):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(1)
    w1 = rng.standard_normal((2 * inter, hidden))
    w2 = rng.standard_normal((hidden, inter))
    a1 = rng.standard_normal((int(rows.max()), hidden))
    a2 = rng.standard_normal((int(rows.max()), inter))

    def run() -> None:
        for n in rows:
            a1[:n] @ w1.T
            a2[:n] @ w2.T

    return run


def timed(fn, repeat: int) -> float:  # type: ignore[no-untyped-def]
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--topk", type=int, default=6)
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--intermediate", type=int, default=2048)
    ap.add_argument("--repeat", type=int, default=1, help="timed runs (best of); one warm-up of each runs first")
    ap.add_argument("--fp32", action="store_true", help="also time the fp32 accumulation model")
    args = ap.parse_args()
    layer, rows = build(args.ranks, args.experts, args.tokens, args.topk, args.hidden, args.intermediate)
    base = baseline(rows, args.hidden, args.intermediate)
    macs = int(rows.sum()) * 3 * args.hidden * args.intermediate
    print(f"mega MoE: {args.ranks} ranks, {args.experts} experts, top-{args.topk}, {args.tokens} tokens/rank, "
          f"hidden {args.hidden}, intermediate {args.intermediate}: {int(rows.sum())} routed rows "
          f"({rows.min()}..{rows.max()} per expert), {2 * macs / 1e12:.2f} TFLOP")
    base()  # warm-up
    layer()
    t_base = timed(base, args.repeat)
    t_exact = timed(layer, args.repeat)
    print(f"{'float64 matmuls of the same GEMMs':<44} {t_base:8.2f} s   {2 * macs / t_base / 1e9:6.1f} GFLOP/s")
    print(f"{'fp8_fp4_mega_moe, exact (golden)':<44} {t_exact:8.2f} s   ratio {t_exact / t_base:5.2f}x")
    if args.fp32:
        with dg.numerics(accumulation="fp32"):
            t32 = timed(layer, args.repeat)
        print(f"{'fp8_fp4_mega_moe, fp32 model':<44} {t32:8.2f} s   ratio {t32 / t_base:5.2f}x")
    p_base = peak_bytes(lambda: baseline(rows, args.hidden, args.intermediate)())  # with its float64 operands
    p_exact = peak_bytes(layer)
    print(f"{'peak memory, float64 baseline':<44} {p_base / 2**20:8.0f} MiB")
    print(f"{'peak memory, exact':<44} {p_exact / 2**20:8.0f} MiB   ratio {p_exact / p_base:5.2f}x")


if __name__ == "__main__":
    main()
