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


# ----------------------------------------------------------------------------------------------
# Grouped GEMMs (issue 5): DeepGEMM's grouped test shapes (spec 14), scaled to two cores
# ----------------------------------------------------------------------------------------------

def _group_sizes(groups: int, expected: int, seed: int) -> list[int]:
    """DeepGEMM's generators: actual size = int(expected * U(0.7, 1.3)) per group."""
    rng = np.random.default_rng(seed)
    return [int(expected * rng.uniform(0.7, 1.3)) for _ in range(groups)]


def _psum_ends(sizes: list[int], alignment: int) -> tuple[np.ndarray, list[tuple[int, int]], int]:
    ends, ranges, start = [], [], 0
    for s in sizes:
        ends.append(start + s)
        ranges.append((start, start + s))
        start += -(-s // alignment) * alignment
    return np.array(ends, np.int32), ranges, start


def _grouped_row(name: str, t: float, t64: float, t_dense: float) -> None:
    print(row(name, t, **{"vs f64 matmuls": t / t64, "vs dense loop": t / t_dense}))


def _paired_times(fns: list, repeat: int) -> list[float]:
    """Best seconds of each function, the functions timed in turn within every round, so that a
    change of machine load hits the baseline and the kernels alike (one warm-up round)."""
    import time

    best = [float("inf")] * len(fns)
    for rnd in range(repeat + 1):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            if rnd:
                best[i] = min(best[i], time.perf_counter() - t0)
    return best


def _bench_m_grouped(groups: int, expected: int, n: int, k: int, repeat: int, rng: np.random.Generator) -> None:
    from deepgemm_ref import grouped as G

    sizes = _group_sizes(groups, expected, groups * n + k)
    ends, ranges, m = _psum_ends(sizes, 128)
    a = rng.standard_normal((m, k), dtype=np.float32).astype(BF16)
    b = rng.standard_normal((groups, n, k), dtype=np.float32).astype(BF16)
    a64 = [a[s:e].astype(np.float64) for s, e in ranges]
    b64 = [b[g].astype(np.float64) for g in range(groups)]
    d = np.empty((m, n), BF16)
    outs = [np.empty((e - s, n), BF16) for s, e in ranges]
    fa = dg.per_token_cast_to_fp8(a, True, 128)
    fb = (np.empty((groups, n, k), ml_dtypes.float8_e4m3fn), np.empty((groups, n // 128, k // 128), np.float32))
    for g in range(groups):
        fb[0][g], fb[1][g] = dg.per_block_cast_to_fp8(b[g], True)
    t64, t16, t16_dense, t8, t8_dense = _paired_times([
        lambda: [x @ y.T for x, y in zip(a64, b64, strict=True)],
        lambda: G.m_grouped_bf16_gemm_nt_contiguous(a, b, d, ends, use_psum_layout=True),
        lambda: [dg.bf16_gemm_nt(a[s:e], b[g], outs[g]) for g, (s, e) in enumerate(ranges)],
        lambda: G.m_grouped_fp8_gemm_nt_contiguous(fa, fb, d, ends, use_psum_layout=True),
        lambda: [dg.fp8_gemm_nt((fa[0][s:e], fa[1][s:e]), (fb[0][g], fb[1][g]), outs[g])
                 for g, (s, e) in enumerate(ranges)],
    ], repeat)
    print(f"\nm-grouped psum: groups={groups} M={m} (rows {sizes}) N={n} K={k}   float64 matmuls {t64 * 1e3:.0f} ms")
    _grouped_row("  bf16 -> bf16, exact", t16, t64, t16_dense)
    _grouped_row("  fp8 1x128 x 128x128 ue8m0 -> bf16, exact", t8, t64, t8_dense)


def _bench_masked(groups: int, expected: int, max_m: int, n: int, k: int, repeat: int,
                  rng: np.random.Generator) -> None:
    from deepgemm_ref import grouped as G

    masked = np.array(_group_sizes(groups, expected, expected), np.int32)
    a = rng.standard_normal((groups, max_m, k), dtype=np.float32).astype(BF16)
    b = rng.standard_normal((groups, n, k), dtype=np.float32).astype(BF16)
    a64 = [a[g, :r].astype(np.float64) for g, r in enumerate(masked)]
    b64 = [b[g].astype(np.float64) for g in range(groups)]
    d = np.empty((groups, max_m, n), BF16)
    t64, t, t_dense = _paired_times([
        lambda: [x @ y.T for x, y in zip(a64, b64, strict=True)],
        lambda: G.m_grouped_bf16_gemm_nt_masked(a, b, d, masked, expected),
        lambda: [dg.bf16_gemm_nt(a[g, :r], b[g], d[g, :r]) for g, r in enumerate(masked)],
    ], repeat)
    print(f"\nmasked: groups={groups} MAX_M={max_m} masked_m={masked.tolist()} N={n} K={k}   "
          f"float64 matmuls {t64 * 1e3:.0f} ms")
    _grouped_row("  bf16 -> bf16, exact", t, t64, t_dense)


def _bench_k_grouped(groups: int, m: int, n: int, expected_k: int, repeat: int, rng: np.random.Generator) -> None:
    from deepgemm_ref import grouped as G

    ks = [-(-kk // 128) * 128 for kk in _group_sizes(groups, expected_k, m + n)]
    starts = [int(v) for v in np.cumsum([0] + ks[:-1])]
    x = rng.standard_normal((sum(ks), m), dtype=np.float32).astype(BF16)
    y = rng.standard_normal((sum(ks), n), dtype=np.float32).astype(BF16)
    x64 = [x[s:s + kk].T.astype(np.float64) for s, kk in zip(starts, ks, strict=True)]
    y64 = [y[s:s + kk].T.astype(np.float64) for s, kk in zip(starts, ks, strict=True)]
    c = np.zeros((groups, m, n), np.float32)
    d = c.copy()
    layout = np.array(ks, np.int32)
    t64, t, t_dense = _paired_times([
        lambda: [p @ q.T for p, q in zip(x64, y64, strict=True)],
        lambda: G.k_grouped_bf16_gemm_tn_contiguous(x, y, d, ks, layout, c=c),
        lambda: [dg.bf16_gemm_tn(x[s:s + kk], y[s:s + kk], d[g], c=c[g])
                 for g, (s, kk) in enumerate(zip(starts, ks, strict=True))],
    ], repeat)
    print(f"\nk-grouped: groups={groups} M={m} N={n} K={ks}   float64 matmuls {t64 * 1e3:.0f} ms")
    _grouped_row("  bf16 -> f32 + c, exact", t, t64, t_dense)


def bench_grouped(repeat: int) -> None:
    """m-grouped contiguous (psum), masked and k-grouped GEMMs (exact model) against the float64
    matmuls of the same per-group shapes and against the loop of dense calls doing the same work,
    all measured in this run.  Shapes: DeepGEMM's grouped test shapes (spec 14) with the rows
    scaled down to about 1024 in all (N and K as in DeepGEMM's tests, like the dense shapes
    above); k-grouped with M and N / 8.  Goal (issue 5): <= 1.3x the float64 matmuls for bf16
    outputs."""
    rng = np.random.default_rng(2)
    for groups, expected, nks in ((4, 256, ((6144, 7168), (7168, 3072), (4096, 4096), (4096, 2048))),
                                  (8, 128, ((7168, 3072), (4096, 2048)))):
        for n, k in nks:
            _bench_m_grouped(groups, expected, n, k, repeat, rng)
    for groups, expected, max_m in ((32, 32, 64), (6, 170, 256)):
        _bench_masked(groups, expected, max_m, 4096, 4096, repeat, rng)
    for groups, m, n, expected_k in ((4, 512, 896, 8192), (16, 896, 256, 2048)):
        _bench_k_grouped(groups, m, n, expected_k, repeat, rng)

def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--headline", action="store_true", help="also run BF16 M=4096 N=7168 K=16384 (minutes)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--models", default="exact,fp32")
    ap.add_argument("--no-grouped", action="store_true", help="skip the grouped GEMM shapes")
    ap.add_argument("--only-grouped", action="store_true", help="run only the grouped GEMM shapes")
    args = ap.parse_args()
    models = tuple(args.models.split(","))
    print(f"numpy {np.__version__}, ml_dtypes {ml_dtypes.__version__}")
    if args.only_grouped:
        bench_grouped(args.repeat)
        return
    # DeepGEMM's FP8 test shapes (spec 14) with M scaled down for two cores
    bench_shape("deepgemm (N, K) = (2112, 7168)", 1024, 2112, 7168, args.repeat, models)
    bench_shape("deepgemm (N, K) = (7168, 2048)", 1024, 7168, 2048, args.repeat, models)
    if args.headline:
        bench_shape("headline (DeepGEMM-Ascend BF16)", 4096, 7168, 16384, 1, ("exact",))
    if not args.no_grouped and "exact" in models:
        bench_grouped(args.repeat)


if __name__ == "__main__":
    main()
