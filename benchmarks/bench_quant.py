"""Speed of DeepGEMM's quantisation utilities, as ratios to baselines measured in the same run.

    python benchmarks/bench_quant.py [--m 4096 --n 7168]

Baselines: ``x.astype(numpy.float32)`` of the same bf16 input, and the same algorithm written
in torch on the CPU (``tests/torch_reference.py``) when torch is installed.
Goals (issue 2): at most 6x the conversion, and no slower than torch.
The SF layout transforms are timed against ``numpy.transpose(sf).copy()`` of the same scales.
"""

from __future__ import annotations

import argparse

import ml_dtypes
import numpy as np
from _common import best_time, row  # noqa: I001  (benchmarks run as scripts)

import deepgemm_ref as dg


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, default=4096)
    ap.add_argument("--n", type=int, default=7168)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.m, args.n), dtype=np.float32).astype(ml_dtypes.bfloat16)
    t_conv = best_time(lambda: x.astype(np.float32), args.repeat)
    print(f"input bf16 ({args.m}, {args.n}); numpy {np.__version__}, ml_dtypes {ml_dtypes.__version__}")
    print(row("baseline x.astype(float32)", t_conv, conversion=1.0))
    try:
        import torch

        from tests import torch_reference as tref

        xt = torch.from_numpy(x.view(np.int16)).view(torch.bfloat16)
        torch_fns = {
            "fp8": lambda: tref.per_token_cast_to_fp8(xt, True, 128, "cuda"),
            "fp4": lambda: tref.per_token_cast_to_fp4(xt, True, 32, "cuda"),
        }
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    except ImportError:
        torch_fns = {}
        print("torch not installed: no torch baseline")
    cases = {
        "fp8": ("per_token_cast_to_fp8(use_ue8m0=True, gran_k=128)", lambda: dg.per_token_cast_to_fp8(x, True, 128)),
        "fp4": ("per_token_cast_to_fp4(use_ue8m0=True, gran_k=32)", lambda: dg.per_token_cast_to_fp4(x, True, 32)),
    }
    for key, (name, fn) in cases.items():
        t = best_time(fn, args.repeat)
        ratios = {"vs conversion": t / t_conv}
        if key in torch_fns:
            t_torch = best_time(torch_fns[key], args.repeat)
            ratios["vs torch"] = t / t_torch
            print(row(f"  torch same algorithm ({key})", t_torch))
        print(row(name, t, **ratios))
    bench_layouts(x, args.repeat)


def bench_layouts(x: np.ndarray, repeat: int) -> None:
    """SF layout transforms on the scales of ``x``, each against ``numpy.transpose(sf).copy()``
    of the same scale tensor (the bare MN-major copy every transform has to make)."""
    m, n = x.shape
    _, sf128 = dg.per_token_cast_to_fp8(x, use_ue8m0=False, gran_k=128)
    _, sf128_ue8m0 = dg.per_token_cast_to_fp8(x, use_ue8m0=True, gran_k=128)
    _, sf32_ue8m0 = dg.per_token_cast_to_fp8(x, use_ue8m0=True, gran_k=32)
    cases = [
        ("sm90", "get_mn_major_tma_aligned_tensor f32/128", sf128,
         lambda: dg.get_mn_major_tma_aligned_tensor(sf128)),
        ("sm100", "transform_sf (ue8m0 per-128)", sf128_ue8m0,
         lambda: dg.transform_sf_into_required_layout(sf128_ue8m0, m, n, (1, 1, 128), is_sfa=True)),
        ("sm100", "transform_sf (ue8m0 per-32)", sf32_ue8m0,
         lambda: dg.transform_sf_into_required_layout(sf32_ue8m0, m, n, (1, 1, 32), is_sfa=True)),
        ("ascend950", "transform_sf (int16 per-32)", sf32_ue8m0,
         lambda: dg.transform_sf_into_required_layout(sf32_ue8m0, m, n, (1, 1, 32), is_sfa=True)),
    ]
    repeat = max(repeat, 20)  # sub-millisecond calls: more repeats for a stable best time
    print(f"SF layouts of a ({m}, {n}) operand (transform_sf = transform_sf_into_required_layout)")
    for arch, name, sf, fn in cases:
        t_copy = best_time(lambda sf=sf: np.transpose(sf).copy(), repeat)
        with dg.numerics(arch=arch):
            t = best_time(fn, repeat)
        print(row(f"  numpy.transpose(sf).copy() {sf.shape}", t_copy))
        print(row(f"{arch} {name}", t, **{"vs transpose copy": t / t_copy}))


if __name__ == "__main__":
    main()
