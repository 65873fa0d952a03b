"""Speed of the golden workflow, as ratios to a float64 matmul measured in the same run.

    python benchmarks/bench_golden.py              # the ascend-headline case (BF16 4096 x 7168 x 16384)
    python benchmarks/bench_golden.py --scale 4    # every dimension divided by 4 (quick)

Goals (issue 8): generating ``ascend-headline`` (S included) at most 2.5x a float64 matmul of that
shape; checking it at most 0.5x its generation time.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np
from _common import row  # noqa: I001  (benchmarks run as scripts)

from deepgemm_ref import golden


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=int, default=1, help="divide M, N and K by this")
    args = ap.parse_args()
    spec = dict(golden.preset("ascend-headline")[0])
    for key in ("m", "n", "k"):
        spec[key] = spec[key] // args.scale
    m, n, k = spec["m"], spec["n"], spec["k"]
    rng = np.random.default_rng(0)
    a64, b64 = rng.standard_normal((m, k)), rng.standard_normal((n, k))
    t0 = time.perf_counter()
    _ = a64 @ b64.T
    t_mm = time.perf_counter() - t0
    del a64, b64, _
    print(f"case {spec['id']}: BF16 M={m} N={n} K={k} under ascend950")
    print(row("float64 matmul (baseline)", t_mm, baseline=1.0))
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        golden.generate([spec], f"{tmp}/b")
        t_gen = time.perf_counter() - t0
        print(row("generate (inputs, exact golden, S, files, hashes)", t_gen, **{"vs f64 matmul": t_gen / t_mm}))
        b = golden.load_bundle(f"{tmp}/b")
        case = b.case(spec["id"])
        outputs = {f"{spec['id']}/d": np.array(case.golden()["d"], copy=True)}
        t0 = time.perf_counter()
        reports = golden.check_outputs(b, outputs)
        t_chk = time.perf_counter() - t0
        print(row("check (load + verify hashes + interval test)", t_chk, **{"vs generation": t_chk / t_gen}))
        print(f"check status: {reports[0].status}, checked {reports[0].checked}")


if __name__ == "__main__":
    main()
