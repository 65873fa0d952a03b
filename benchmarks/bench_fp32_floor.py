"""The floor under the fp32 accumulation model's rows of the speed table (issue 30), measured.

    python benchmarks/bench_fp32_floor.py                  # blocks 128 and 32, 1 and 2 threads
    python benchmarks/bench_fp32_floor.py --threads 1 --block 128 --rounds 11

The model rounds every K block's exact sum to float32 and adds it to a float32 accumulator in
order, so whatever computes it does, per block, one GEMM of depth ``block`` and one float32 pass
over the output, and before that converts the FP8 operands to float64.  This script times those
parts alone, on the candidate's own tiles (:func:`deepgemm_ref.core._fp32_tile_shape`), each as a
ratio to one float64 matmul of the whole size, interleaved with it in the same process
(``run_all.interleaved``: the median of the per-round ratios):

* ``block GEMMs``: the per-block float64 GEMMs of every tile, operands already converted;
* ``+ float32 promotion``: the same with each block sum rounded to float32 and added (one
  ``np.add(acc, y, out=acc, dtype=float32)`` per block: the cheapest NumPy form measured);
* ``operand conversion``: the FP8 codes and their UE8M0 scales to float64, both operands;
* ``candidate``: ``fp8_gemm_nt`` under ``numerics(accumulation="fp32")``, as the table runs it.

``floor`` = promotion + conversion: what any NumPy implementation of the model pays before
its epilogue.  Threads: the tiles on the package's pool with a one-thread BLAS each (as the
candidate runs them), the BLAS, the pool and torch pinned alike on both sides.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import numpy as np
from _common import ROOT  # noqa: F401,I001  (benchmarks run as scripts; puts the repository first)
from run_all import GEMM, _Block, _gemm_setup, interleaved, pin_threads

import deepgemm_ref as dg
from deepgemm_ref import core
from deepgemm_ref._parallel import parallel_chunks, single_threaded_blas


def _tiles(m: int, n: int, blk: int) -> tuple[int, int, list[tuple[int, int]]]:
    """The candidate's tile shape for block ``blk`` (:func:`deepgemm_ref.core._fp32_tile_shape`) and its tiles."""
    tr, tc = core._fp32_tile_shape(m, blk)
    return tr, tc, [(i0, j0) for i0 in range(0, m, tr) for j0 in range(0, n, tc)]


def _block_loop(a64: np.ndarray, b64: np.ndarray, blk: int, promote: bool) -> Callable[[], None]:
    m, k = a64.shape
    n = b64.shape[0]
    tr, tc, tiles = _tiles(m, n, blk)

    def run(t0: int, t1: int) -> None:
        y_buf, acc_buf = np.empty(tr * tc), np.zeros(tr * tc, np.float32)
        with np.errstate(over="ignore", invalid="ignore"):
            for i0, j0 in tiles[t0:t1]:
                i1, j1 = min(m, i0 + tr), min(n, j0 + tc)
                y = y_buf[:(i1 - i0) * (j1 - j0)].reshape(i1 - i0, j1 - j0)
                acc = acc_buf[:y.size].reshape(y.shape)
                for k0 in range(0, k, blk):
                    np.matmul(a64[i0:i1, k0:k0 + blk], b64[j0:j1, k0:k0 + blk].T, out=y)
                    if promote:
                        np.add(acc, y, out=acc, dtype=np.float32)

    def call() -> None:
        with single_threaded_blas():
            parallel_chunks(len(tiles), 1, run)

    return call


def measure(block: int, threads: int, rounds: int) -> None:
    pin_threads(threads)
    (m, n, k), a, b, d, base = _gemm_setup()
    fa = dg.per_token_cast_to_fp8(a, True, block)
    fb = dg.per_token_cast_to_fp8(b, True, block)
    opa = core.Operand(np.asarray(fa[0]), np.asarray(fa[1], np.float64), block)
    opb = core.Operand(np.asarray(fb[0]), np.asarray(fb[1], np.float64), block)
    a64, b64 = np.empty((m, k)), np.empty((n, k))

    def convert() -> None:
        with single_threaded_blas():
            core._convert(opa, 0, m, a64, want_norms=False)
            core._convert(opb, 0, n, b64, want_norms=False)

    convert()

    def candidate() -> None:
        with dg.numerics(arch="sm100", accumulation="fp32"), _Block("sm100", block):
            dg.fp8_gemm_nt(fa, fb, d, recipe=(1, 1, block))

    parts: dict[str, Callable[[], Any]] = {
        "block GEMMs": _block_loop(a64, b64, block, promote=False),
        "+ float32 promotion": _block_loop(a64, b64, block, promote=True),
        "operand conversion": convert,
        "candidate": candidate,
    }
    med = {key: interleaved(base, fn, rounds)[0] for key, fn in parts.items()}
    print(f"block {block}, {threads} thread(s), {m}x{n}x{k}, tiles {_tiles(m, n, block)[:2]}:")
    for key, v in med.items():
        print(f"  {v:6.3f}x  {key}")
    floor = med["+ float32 promotion"] + med["operand conversion"]
    print(f"  {floor:6.3f}x  floor (promotion + conversion; the candidate adds its epilogue)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--block", default="128,32")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    print(f"one float64 matmul {GEMM[0]}x{GEMM[1]}x{GEMM[2]} as the baseline of every ratio")
    for threads in (int(t) for t in args.threads.split(",")):
        for block in (int(b) for b in args.block.split(",")):
            measure(block, threads, max(1, args.rounds))


if __name__ == "__main__":
    main()
