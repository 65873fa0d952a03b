"""Speed of ``diagnose`` on one failing FP8 case, as a ratio to that case's generation time.

    python benchmarks/bench_diagnose.py                 # fp8_gemm_nt 1024 x 2048 x 4096 under sm100
    python benchmarks/bench_diagnose.py --scale 4       # every dimension divided by 4 (quick)
    python benchmarks/bench_diagnose.py --bugs sf_transposed tile_not_written

Goal (issue 18): diagnosing one failing 1024 x 2048 x 4096 FP8 case with the whole catalogue
takes at most 20x the case's generation time (``golden.generate`` of that one case: inputs, the
exact golden with S, the file and its hashes).  Each bug's device output is made once by a
stand-in device module (deepgemm_ref with the buggy kernel); then generation and each bug's
diagnosis are timed in turn, ``--repeat`` rounds, interleaved, and the medians compared (each
bug against the generation of its own case).  Both
run their GEMMs on one BLAS thread (the golden path pins it).  ``narrow_accumulator`` is the
slowest diagnosis (the accumulator fit explores the most candidates); making its device output
runs the emulator's limited model on the whole case (about a minute or two here, not timed).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _common import ROOT, row  # noqa: I001  (benchmarks run as scripts)

import deepgemm_ref as dg
from deepgemm_ref import golden
from deepgemm_ref.config import Limited
from deepgemm_ref.golden.diagnose import diagnose

sys.path.insert(0, ROOT)
from tests.standin import replay_through, standin, user_sf  # noqa: E402


def _sf_transposed(a, b, d, *args, **kw):  # type: ignore[no-untyped-def]
    m, k = a[0].shape
    u = user_sf(a[1], m, k, 1, 128)
    return dg.fp8_gemm_nt((a[0], np.ascontiguousarray(u.T).reshape(u.shape)), b, d, *args, **kw)


def _tile(a, b, d, *args, **kw):  # type: ignore[no-untyped-def]
    dg.fp8_gemm_nt(a, b, d, *args, **kw)
    d[128:256, 512:640] = 0


def _ue8m0(a, b, d, *args, **kw):  # type: ignore[no-untyped-def]
    """Every UE8M0 byte of the packed SFB one low, in its MN-major TMA layout."""
    words = np.ascontiguousarray(b[1])
    by = words.view(np.uint8)
    by[by != 0] -= 1
    sf = np.empty_like(b[1])  # the same strides as the transformed layout
    sf[...] = words
    return dg.fp8_gemm_nt(a, (b[0], sf), d, *args, **kw)


def _narrow(a, b, d, *args, **kw):  # type: ignore[no-untyped-def]
    # 10 bits: at K = 4096 the default bound (float32 accumulation in any order) covers a Hopper-like
    # 13-bit accumulator, so a narrower one is what makes this case fail
    with dg.numerics(accumulation=Limited(10, 128)):
        dg.fp8_gemm_nt(a, b, d, *args, **kw)


#: bug -> (port, output dtype of the case).
PORTS = {"sf_transposed": (_sf_transposed, "bf16"), "tile_not_written": (_tile, "bf16"),
         "ue8m0_off_by_one": (_ue8m0, "bf16"), "narrow_accumulator": (_narrow, "bf16")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=int, default=1, help="divide M, N and K by this")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved rounds (medians are compared)")
    ap.add_argument("--bugs", nargs="*", default=list(PORTS), choices=list(PORTS))
    args = ap.parse_args()
    m, n, k = 1024 // args.scale, 2048 // args.scale, 4096 // args.scale
    outs = sorted({PORTS[bug][1] for bug in args.bugs})
    specs = {out: {"id": f"fp8-{out}", "kernel": "fp8_gemm_nt", "profile": "sm100", "m": m, "n": n, "k": k,
                   "out": out} for out in outs}
    print(f"case: fp8_gemm_nt M={m} N={n} K={k} under sm100 ({', '.join(outs)} output); bugs {', '.join(args.bugs)}")
    with tempfile.TemporaryDirectory() as tmp:
        bundles = {out: Path(tmp) / f"bundle-{out}" for out in outs}
        for out, spec in specs.items():
            golden.generate([spec], bundles[out])
        devices = {}
        for bug in args.bugs:
            port, out = PORTS[bug]
            t0 = time.perf_counter()
            mod = standin(f"bench_{bug}", fp8_gemm_nt=port)
            devices[bug] = replay_through(bundles[out], mod, Path(tmp) / f"{bug}.safetensors")
            print(f"  device output with {bug} made in {time.perf_counter() - t0:.1f} s (not timed)")
        gen: dict[str, list[float]] = {out: [] for out in outs}
        times: dict[str, list[float]] = {bug: [] for bug in args.bugs}
        verdicts: dict[str, str] = {}
        for r in range(args.repeat):
            for out, spec in specs.items():
                t0 = time.perf_counter()
                golden.generate([spec], Path(tmp) / f"g{r}-{out}")
                gen[out].append(time.perf_counter() - t0)
            for bug in args.bugs:
                t0 = time.perf_counter()
                [d] = diagnose(bundles[PORTS[bug][1]], devices[bug])
                times[bug].append(time.perf_counter() - t0)
                best = d.explanations[0] if d.explanations else None
                verdicts[bug] = (f"{d.verdict}; first {best.name} {100 * best.share:.1f}% "
                                 f"({format_params(best.params)})" if best else d.verdict)
        t_gen = {out: statistics.median(v) for out, v in gen.items()}
        for out in outs:
            print(row(f"generate the {out} case (baseline)", t_gen[out], baseline=1.0))
        worst = 0.0
        for bug in args.bugs:
            t = statistics.median(times[bug])
            ratio = t / t_gen[PORTS[bug][1]]
            worst = max(worst, ratio)
            print(row(f"diagnose, device with {bug}", t, **{"vs generation": ratio}))
            print(f"    {verdicts[bug]}")
        print(f"worst ratio {worst:.2f}x (goal: at most 20x)")


def format_params(p: dict[str, object]) -> str:
    return ", ".join(f"{k} {v}" for k, v in p.items())


if __name__ == "__main__":
    main()
