"""Speed and memory of the dense GEMMs, as ratios to baselines measured in the same run.

    python benchmarks/bench_gemm.py                 # DeepGEMM test shapes scaled to this machine
    python benchmarks/bench_gemm.py --headline      # + the BF16 headline M=4096 N=7168 K=16384

Baselines: ``numpy.matmul`` of same-shape float64 operands (float32 for the ``fp32`` model).
Peak memory (tracemalloc, NumPy buffers) is reported relative to the float64 copies of A, B and D.
Goals (issue 4): exact with bf16 output <= 1.3x the float64 matmul; exact with float32 outputs
or FP32 scales <= 6x; fp32 model <= 2x a float32 matmul at block 128 and 5x at block 32; S one
extra GEMM; peak memory <= 1.5x the float64 copies of A, B and D.
"""

from __future__ import annotations

import argparse

import ml_dtypes
import numpy as np

from _common import best_time, peak_bytes, row  # noqa: I001  (benchmarks run as scripts)

import deepgemm_ref as dg
from deepgemm_ref import trace

BF16 = ml_dtypes.bfloat16


def _inputs(m: int, n: int, k: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((m, k), dtype=np.float32).astype(BF16),
            rng.standard_normal((n, k), dtype=np.float32).astype(BF16))


def _baselines(m: int, n: int, k: int, repeat: int) -> tuple[float, float]:
    rng = np.random.default_rng(1)
    a64, b64 = rng.standard_normal((m, k)), rng.standard_normal((n, k))
    t64 = best_time(lambda: a64 @ b64.T, repeat)
    a32, b32 = a64.astype(np.float32), b64.astype(np.float32)
    t32 = best_time(lambda: a32 @ b32.T, repeat)
    return t64, t32


def _with_S(fn):  # type: ignore[no-untyped-def]
    def run() -> None:
        with trace.capture(want_acc=False, want_S=True):
            fn()
    return run


def bench_shape(label: str, m: int, n: int, k: int, repeat: int, models: tuple[str, ...]) -> None:
    t64, t32 = _baselines(m, n, k, repeat)
    f64_bytes = 8 * (m * k + n * k + m * n)
    print(f"\n{label}: M={m} N={n} K={k}   float64 matmul {t64 * 1e3:.0f} ms, float32 matmul {t32 * 1e3:.0f} ms")
    a, b = _inputs(m, n, k)
    d16 = np.empty((m, n), BF16)
    d32 = np.empty((m, n), np.float32)
    fa128, fb128 = dg.per_token_cast_to_fp8(a, True, 128), dg.per_token_cast_to_fp8(b, True, 128)
    fa32, fb32 = dg.per_token_cast_to_fp8(a, True, 32), dg.per_token_cast_to_fp8(b, True, 32)
    with dg.numerics(arch="sm90"):
        sa90, sb90 = dg.per_token_cast_to_fp8(a, False, 128), dg.per_block_cast_to_fp8(b, False)
        sbt90 = dg.per_token_cast_to_fp8(b, False, 128)
    c32 = np.zeros((m, n), np.float32)
    # (name, call, profile, accumulation model, fp32 block override)
    cases = [
        ("bf16 x bf16 -> bf16, exact", lambda: dg.bf16_gemm_nt(a, b, d16), "sm100", "exact", None),
        ("bf16 x bf16 -> bf16, exact + S", _with_S(lambda: dg.bf16_gemm_nt(a, b, d16)), "sm100", "exact", None),
        ("bf16 x bf16 -> f32, exact", lambda: dg.bf16_gemm_nt(a, b, d32), "sm100", "exact", None),
        ("fp8 1x128 ue8m0 -> bf16, exact",
         lambda: dg.fp8_gemm_nt(fa128, fb128, d16, recipe=(1, 1, 128)), "sm100", "exact", None),
        ("fp8 1x128 ue8m0 -> bf16, exact + S",
         _with_S(lambda: dg.fp8_gemm_nt(fa128, fb128, d16, recipe=(1, 1, 128))), "sm100", "exact", None),
        ("fp8 1x128 ue8m0 -> f32, exact",
         lambda: dg.fp8_gemm_nt(fa128, fb128, d32, recipe=(1, 1, 128)), "sm100", "exact", None),
        ("fp8 sm90 FP32 scales 1D2D -> bf16, exact", lambda: dg.fp8_gemm_nt(sa90, sb90, d16), "sm90", "exact", None),
        ("fp8 sm90 FP32 scales 1D1D -> f32 + c, exact",
         lambda: dg.fp8_gemm_nt(sa90, sbt90, d32, c=c32, recipe=(1, 1, 128)), "sm90", "exact", None),
        ("fp8 1x128 ue8m0 -> bf16, fp32 model, block 128",
         lambda: dg.fp8_gemm_nt(fa128, fb128, d16, recipe=(1, 1, 128)), "sm100", "fp32", 128),
        ("fp8 1x32 ue8m0 -> bf16, fp32 model, block 32",
         lambda: dg.fp8_gemm_nt(fa32, fb32, d16, recipe=(1, 1, 32)), "sm100", "fp32", 32),
    ]
    for name, fn, arch, model, block in cases:
        if model not in models:
            continue

        def call(fn=fn, arch=arch, model=model, block=block) -> None:  # type: ignore[no-untyped-def]
            with dg.numerics(arch=arch, accumulation=model), _block(arch, block):
                fn()

        t = best_time(call, repeat)
        base = t32 if model == "fp32" else t64
        peak = peak_bytes(call)
        print(row(name, t, **{("vs f32 matmul" if model == "fp32" else "vs f64 matmul"): t / base,
                              "peak/f64 copies": peak / f64_bytes}))


class _block:
    """Temporarily set a profile's fp32-model block (to time block 128 and block 32 alike)."""

    def __init__(self, arch: str, block: int | None) -> None:
        self.arch, self.block = arch, block

    def __enter__(self) -> None:
        from dataclasses import replace

        from deepgemm_ref import profiles

        self.saved = profiles.PROFILES[self.arch]
        if self.block is not None:
            profiles.PROFILES[self.arch] = replace(self.saved, fp32_block=self.block)

    def __exit__(self, *exc: object) -> None:
        from deepgemm_ref import profiles

        profiles.PROFILES[self.arch] = self.saved


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--headline", action="store_true", help="also run BF16 M=4096 N=7168 K=16384 (minutes)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--models", default="exact,fp32")
    args = ap.parse_args()
    models = tuple(args.models.split(","))
    print(f"numpy {np.__version__}, ml_dtypes {ml_dtypes.__version__}")
    # DeepGEMM's FP8 test shapes (spec 14) with M scaled down for two cores
    bench_shape("deepgemm (N, K) = (2112, 7168)", 1024, 2112, 7168, args.repeat, models)
    bench_shape("deepgemm (N, K) = (7168, 2048)", 1024, 7168, 2048, args.repeat, models)
    if args.headline:
        bench_shape("headline (DeepGEMM-Ascend BF16)", 4096, 7168, 16384, 1, ("exact",))


if __name__ == "__main__":
    main()
