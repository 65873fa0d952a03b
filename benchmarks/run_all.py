"""Every row of issue 19's speed table, each as a ratio to its baseline measured in the same run.

    python benchmarks/run_all.py                       # all rows at 1 and 2 threads
    python benchmarks/run_all.py --threads 1           # one thread count
    python benchmarks/run_all.py --headline            # + the ascend-headline golden (minutes)
    python benchmarks/run_all.py --only gemm,quant     # rows whose key contains a word
    python benchmarks/run_all.py --only none --scale   # the memory and estimate rows (issue 30)

Each row prints ``ratio  goal  pass/fail`` and the times behind it.  A row's candidate and its
baseline run in the same process, interleaved (baseline, candidate, baseline, ...), after one
warm-up of each; the ratio is the median of the per-round ratios over ``--rounds`` rounds (at
least 5).  Before each thread count the BLAS (OpenBLAS, through its own API), the package's pool
(``DEEPGEMM_REF_NUM_THREADS``) and torch (``torch.set_num_threads``) are pinned to that count, on
both sides.  ``OPENBLAS_CORETYPE`` is left as the environment sets it; the kernel OpenBLAS uses
is printed.  The ``golden --jobs`` row and the headline's peak memory run in subprocesses.

Sizes: as issue 19 states them where it does (GEMMs 1024 x 2048 x 4096; MQA seq 128, kv 4096, 64
heads, dim 128; quantisers on a bf16 (4096, 7168); the headline BF16 4096 x 7168 x 16384);
m-grouped: 4 groups of about 256 rows, N = K = 4096; Mega MoE: 8 ranks, 16 experts, top-6, 128
tokens per rank, hidden 2048, intermediate 1024 (about 384 routed rows per expert, DeepSeek-like
per-expert shapes scaled down so that five interleaved rounds take seconds).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np
from _common import ROOT  # noqa: I001  (benchmarks run as scripts)

import deepgemm_ref as dg
from deepgemm_ref import _parallel, trace

BF16 = ml_dtypes.bfloat16
GEMM = (1024, 2048, 4096)


@dataclass
class Row:
    key: str
    title: str
    goal: float
    higher_is_better: bool = False  # goal is a lower bound (speed-ups)


def openblas_kernel() -> str:
    """OpenBLAS's core name and configuration, from the library loaded in this process."""
    lib = _parallel._openblas()
    if lib is None:
        return "OpenBLAS not found"
    with open("/proc/self/maps") as f:
        paths = sorted({ln.split()[-1] for ln in f if "openblas" in ln.lower() and ln.split()[-1].startswith("/")})
    for path in paths:
        try:
            so = ctypes.CDLL(path)
        except OSError:
            continue
        for core_sym, cfg_sym in (("openblas_get_corename", "openblas_get_config"),
                                  ("scipy_openblas_get_corename64_", "scipy_openblas_get_config64_"),
                                  ("scipy_openblas_get_corename", "scipy_openblas_get_config")):
            if hasattr(so, core_sym):
                getattr(so, core_sym).restype = ctypes.c_char_p
                getattr(so, cfg_sym).restype = ctypes.c_char_p
                return f"{getattr(so, core_sym)().decode()} ({getattr(so, cfg_sym)().decode().strip()})"
    return "unknown"


def pin_threads(n: int) -> None:
    _parallel.limit_blas_threads(n)
    os.environ["DEEPGEMM_REF_NUM_THREADS"] = str(n)
    try:
        import torch

        torch.set_num_threads(n)
    except ImportError:
        pass


#: The clock of :func:`interleaved`: wall time, or with ``--clock cpu`` this process's CPU time (on a
#: loaded machine a one-thread ratio in CPU time is what the idle machine's wall time would show).
CLOCK: Callable[[], float] = time.perf_counter


def interleaved(base: Callable[[], Any], cand: Callable[[], Any], rounds: int) -> tuple[float, float, float]:
    """(median ratio, median baseline s, median candidate s) over interleaved rounds (one warm-up each)."""
    base()
    cand()
    tb: list[float] = []
    tc: list[float] = []
    for r in range(rounds):
        order = (base, cand) if r % 2 == 0 else (cand, base)
        for fn in order:
            t0 = CLOCK()
            fn()
            (tb if fn is base else tc).append(CLOCK() - t0)
    ratios = [c / b for b, c in zip(tb, tc, strict=True)]
    return statistics.median(ratios), statistics.median(tb), statistics.median(tc)


def report(row: Row, threads: int, ratio: float, t_base: float, t_cand: float, extra: str = "") -> bool:
    ok = ratio >= row.goal if row.higher_is_better else ratio <= row.goal
    rel = ">=" if row.higher_is_better else "<="
    print(f"  {ratio:7.2f}x  {rel} {row.goal:<5g} {'pass' if ok else 'FAIL'}   {row.title} [{threads} thread(s)]"
          f"   baseline {t_base * 1e3:.0f} ms, candidate {t_cand * 1e3:.0f} ms{extra}", flush=True)
    return ok


# ----------------------------------------------------------------------------------------------
# rows
# ----------------------------------------------------------------------------------------------

def _bf16_inputs(m: int, n: int, k: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((m, k), dtype=np.float32).astype(BF16),
            rng.standard_normal((n, k), dtype=np.float32).astype(BF16))


def _f64_matmul(m: int, n: int, k: int) -> Callable[[], Any]:
    rng = np.random.default_rng(1)
    a64, b64 = rng.standard_normal((m, k)), rng.standard_normal((n, k))
    return lambda: a64 @ b64.T


class _Block:
    """Temporarily set a profile's fp32-model block (block 128 and block 32 under one profile)."""

    def __init__(self, arch: str, block: int) -> None:
        self.arch, self.block = arch, block

    def __enter__(self) -> None:
        from dataclasses import replace

        from deepgemm_ref import profiles

        self.saved = profiles.PROFILES[self.arch]
        profiles.PROFILES[self.arch] = replace(self.saved, fp32_block=self.block)

    def __exit__(self, *exc: object) -> None:
        from deepgemm_ref import profiles

        profiles.PROFILES[self.arch] = self.saved


def _gemm_setup() -> tuple[tuple[int, int, int], np.ndarray, np.ndarray, np.ndarray, Callable[[], Any]]:
    """The table's GEMM size: (m, n, k), BF16 inputs, a bf16 output and the float64 matmul."""
    m, n, k = GEMM
    a, b = _bf16_inputs(m, n, k)
    return (m, n, k), a, b, np.empty((m, n), BF16), _f64_matmul(m, n, k)


def rows_gemm(threads: int, rounds: int) -> list[bool]:
    (m, n, k), a, b, d, base = _gemm_setup()
    results = []
    with dg.numerics(arch="sm100"):
        r = interleaved(base, lambda: dg.bf16_gemm_nt(a, b, d), rounds)
    results.append(report(Row("gemm-bf16", f"exact GEMM, bf16 out, BF16 inputs, {m}x{n}x{k}, vs one float64 matmul",
                              1.1), threads, *r))
    fa, fb = dg.per_token_cast_to_fp8(a, True, 128), dg.per_token_cast_to_fp8(b, True, 128)
    with dg.numerics(arch="sm100"):
        r = interleaved(base, lambda: dg.fp8_gemm_nt(fa, fb, d, recipe=(1, 1, 128)), rounds)
    results.append(report(Row("gemm-fp8", "same, FP8 with UE8M0 scales (1x128)", 1.1), threads, *r))
    return results


def rows_fp32(threads: int, rounds: int) -> list[bool]:
    (m, n, k), a, b, d, base = _gemm_setup()
    results = []
    for block, goal in ((128, 1.15), (32, 1.5)):
        fa, fb = dg.per_token_cast_to_fp8(a, True, block), dg.per_token_cast_to_fp8(b, True, block)

        def call(fa: Any = fa, fb: Any = fb, block: int = block) -> None:
            with dg.numerics(arch="sm100", accumulation="fp32"), _Block("sm100", block):
                dg.fp8_gemm_nt(fa, fb, d, recipe=(1, 1, block))

        r = interleaved(base, call, rounds)
        results.append(report(Row(f"fp32-{block}", f"fp32 accumulation model, block {block} (FP8 1x{block} UE8M0, "
                                  f"{m}x{n}x{k}), vs one float64 matmul", goal), threads, *r))
    return results


def rows_adversarial(threads: int, rounds: int) -> list[bool]:
    sys.path.insert(0, ROOT)
    from tests.adversarial import tie_cancel_breaker

    m, n, k = GEMM
    av, bv = tie_cancel_breaker(m, n, k, seed=0, fill="cancel")
    a, b = av.astype(np.float32).astype(BF16), bv.astype(np.float32).astype(BF16)
    d = np.empty((m, n), BF16)
    base = _f64_matmul(m, n, k)
    stats: dict[str, int] = {}

    def call() -> None:
        with trace.capture(want_acc=False, want_S=False) as cap:
            dg.bf16_gemm_nt(a, b, d)
        stats.clear()
        stats.update(cap.last.stats)

    r = interleaved(base, call, rounds)
    exact_tier = sum(v for key, v in stats.items() if key not in ("exact", "bounded"))
    return [report(Row("adversarial", f"inputs where every element needs the exact tier (a bf16 tie, a large "
                       f"cancelling pair and a tiny tie-breaker in every dot product; {m}x{n}x{k})", 5.0),
                   threads, *r, extra=f"; {exact_tier} of {m * n} elements decided by the exact tiers {stats}")]


def rows_mqa(threads: int, rounds: int) -> list[bool]:
    from deepgemm_ref import attention as att

    seq, seq_kv, h, dim = 128, 4096, 64, 128
    rng = np.random.default_rng(0)
    q = rng.standard_normal((seq, h, dim), dtype=np.float32)
    kv = rng.standard_normal((seq_kv, dim), dtype=np.float32).astype(BF16)
    q8 = dg.formats.cast(q, dg.formats.E4M3, dg.formats.SATURATING_RNE)
    kv8, sf = dg.per_custom_dims_cast_to_fp8(kv, (0,), False)
    w = rng.standard_normal((seq, h), dtype=np.float32)
    ks = np.zeros(seq, np.int32)
    ke = np.full(seq, seq_kv, np.int32)
    q64 = q8.astype(np.float64).reshape(seq * h, dim)
    k64 = kv8.astype(np.float64)
    with dg.numerics(arch="sm100"):
        r = interleaved(lambda: q64 @ k64.T, lambda: att.fp8_fp4_mqa_logits((q8, None), (kv8, sf), w, ks, ke), rounds)
    ok = [report(Row("mqa", f"MQA logits exact (seq {seq}, kv {seq_kv}, {h} heads, dim {dim}) vs the equivalent "
                     "float64 GEMM work", 1.4), threads, *r)]
    _MQA_RATIOS[threads] = r[0]
    if threads > 1 and 1 in _MQA_RATIOS:  # issue 30: a 2-thread ratio no worse than the 1-thread one
        rel = r[0] / _MQA_RATIOS[1]
        ok.append(rel <= 1.0)
        print(f"  {rel:7.2f}x  <= 1     {'pass' if rel <= 1.0 else 'FAIL'}   its {threads}-thread ratio vs its "
              f"1-thread ratio [{threads} thread(s)]   {r[0]:.2f}x vs {_MQA_RATIOS[1]:.2f}x", flush=True)
    return ok


_MQA_RATIOS: dict[int, float] = {}


def rows_grouped(threads: int, rounds: int) -> list[bool]:
    from deepgemm_ref import grouped as G

    groups, expected, n, k = 4, 256, 4096, 4096
    rng = np.random.default_rng(2)
    sizes = [int(expected * rng.uniform(0.7, 1.3)) for _ in range(groups)]
    ends, ranges, start = [], [], 0
    for s in sizes:
        ends.append(start + s)
        ranges.append((start, start + s))
        start += -(-s // 128) * 128
    m = start
    a = rng.standard_normal((m, k), dtype=np.float32).astype(BF16)
    b = rng.standard_normal((groups, n, k), dtype=np.float32).astype(BF16)
    a64 = [a[s:e].astype(np.float64) for s, e in ranges]
    b64 = [b[g].astype(np.float64) for g in range(groups)]
    d = np.empty((m, n), BF16)
    psum = np.array(ends, np.int32)
    with dg.numerics(arch="sm100"):
        r = interleaved(lambda: [x @ y.T for x, y in zip(a64, b64, strict=True)],
                        lambda: G.m_grouped_bf16_gemm_nt_contiguous(a, b, d, psum, use_psum_layout=True), rounds)
    return [report(Row("grouped", f"m-grouped psum, bf16 out ({groups} groups of {sizes} rows, N={n}, K={k}), vs the "
                       "float64 GEMMs of the same groups", 1.2), threads, *r)]


def rows_mega(threads: int, rounds: int) -> list[bool]:
    import bench_mega_moe as bm

    ranks, experts, tokens, topk, hidden, inter = 8, 16, 128, 6, 2048, 1024
    layer, rows = bm.build(ranks, experts, tokens, topk, hidden, inter)
    base = bm.baseline(rows, hidden, inter)
    r = interleaved(base, layer, rounds)
    return [report(Row("mega", f"Mega MoE exact ({ranks} ranks, {experts} experts, top-{topk}, {tokens} tokens/rank, "
                       f"hidden {hidden}, intermediate {inter}) vs the float64 GEMMs it contains", 1.3), threads, *r)]


def rows_quant(threads: int, rounds: int) -> list[bool]:
    rng = np.random.default_rng(0)
    m, n = 4096, 7168
    x = rng.standard_normal((m, n), dtype=np.float32).astype(BF16)
    conv = lambda: x.astype(np.float32)  # noqa: E731
    results = []
    r = interleaved(conv, lambda: dg.per_block_cast_to_fp8(x, True), rounds)
    results.append(report(Row("quant-block", f"per_block_cast_to_fp8 (bf16 ({m}, {n}), UE8M0) vs a bf16 -> float32 "
                              "conversion", 6.0), threads, *r))
    try:
        import torch

        sys.path.insert(0, ROOT)
        from tests import torch_reference as tref

        xt = torch.from_numpy(x.view(np.int16)).view(torch.bfloat16)
        with dg.numerics(scale_division="cuda"):
            r = interleaved(lambda: tref.per_block_cast_to_fp8(xt, True, 128, "cuda"),
                            lambda: dg.per_block_cast_to_fp8(x, True), rounds)
        results.append(report(Row("quant-block-torch", f"per_block_cast_to_fp8 vs DeepGEMM's algorithm in torch on the "
                                  f"CPU (torch {torch.__version__})", 0.5), threads, *r))
    except ImportError:
        print("  (torch not installed: no torch baseline)")
    for name, fn in (("per_token_cast_to_fp8 (gran 128, UE8M0)", lambda: dg.per_token_cast_to_fp8(x, True, 128)),
                     ("per_token_cast_to_fp4 (gran 32, UE8M0)", lambda: dg.per_token_cast_to_fp4(x, True, 32))):
        r = interleaved(conv, fn, rounds)
        results.append(report(Row("quant-token", f"{name} vs the conversion", 4.0), threads, *r))
    return results


def _golden_cli(out: str, jobs: int, threads: int, preset: str = "deepgemm-tests-small",
                fallback: bool = True) -> tuple[float, str]:
    """(seconds, the run's notes) of one ``golden`` CLI run in a subprocess."""
    env = dict(os.environ, DEEPGEMM_REF_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads),
               OMP_NUM_THREADS=str(threads))
    env.pop("DEEPGEMM_REF_JOBS_FALLBACK", None)
    if not fallback:
        env["DEEPGEMM_REF_JOBS_FALLBACK"] = "0"
    cmd = [sys.executable, "-m", "deepgemm_ref.cli", "golden", "--preset", preset, "--out", out, "--force",
           "--jobs", str(jobs)]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True, cwd=ROOT)
    t = time.perf_counter() - t0
    return t, " ".join(ln.split("note: ", 1)[1] for ln in r.stderr.splitlines() if "golden: note: --jobs" in ln)


def rows_jobs(threads: int, rounds: int) -> list[bool]:
    """``golden --jobs 2`` as a user gets it (workers, or fewer on a loaded machine: a note) and the
    pool itself (``DEEPGEMM_REF_JOBS_FALLBACK=0``), each over serial, interleaved in rotating order.
    The golden computations run the BLAS on one thread in every process; the package's pool has
    ``threads`` threads in the serial run and one in each worker."""
    runs: dict[str, list[float]] = {"serial": [], "jobs": [], "pool": []}
    notes: list[str] = []
    loads: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        _golden_cli(f"{tmp}/s", 1, threads)  # warm-up (imports, page cache)
        order = ["serial", "jobs", "pool"]
        for r in range(rounds):
            loads.append(os.getloadavg()[0])
            for what in order[r % 3:] + order[:r % 3]:
                t, note = _golden_cli(f"{tmp}/{what}", 1 if what == "serial" else 2, threads,
                                      fallback=what != "pool")
                runs[what].append(t)
                if what == "jobs" and note:
                    notes.append(note)
    ok = []
    for what, title in (("jobs", "golden --jobs 2 over serial (deepgemm-tests-small, as a user gets it)"),
                        ("pool", "  the pool alone (DEEPGEMM_REF_JOBS_FALLBACK=0: two workers whatever the load)")):
        speedup = statistics.median(s / p for s, p in zip(runs["serial"], runs[what], strict=True))
        extra = (f"; load average {min(loads):.2f}..{max(loads):.2f} on {os.cpu_count()} CPUs"
                 + (f"; {len(notes)} of {rounds} runs fell back: {notes[0]}" if what == "jobs" and notes else ""))
        ok.append(report(Row(what, title, 1.5, higher_is_better=True), threads, speedup,
                         statistics.median(runs["serial"]), statistics.median(runs[what]), extra=extra))
    # Never slower than serial: --jobs as a user gets it falls back rather than lose.
    worst = min(s / p for s, p in zip(runs["serial"], runs["jobs"], strict=True))
    print(f"           (--jobs 2 as a user gets it: slowest round {worst:.2f}x serial; the goal: never below 1.0x "
          "in the median)")
    return ok


#: The peak RSS of a child process: ``VmHWM`` of /proc/self/status, which starts afresh at exec.
#: (``ru_maxrss`` keeps the high-water mark of the process image exec replaced, here the parent's
#: when ``subprocess`` spawns by vfork: a parent at 241 MiB made the interpreter's own RSS look
#: 241 MiB and every case's 180 MiB smaller.)
_PEAK_RSS = r"""
def peak_rss():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
"""

_HEADLINE_CHILD = _PEAK_RSS + r"""
import json, resource, sys, time, tempfile
import numpy as np
what, m, n, k = sys.argv[1], *map(int, sys.argv[2:5])
if what == "matmul":
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((m, k)), rng.standard_normal((n, k))
    t0 = time.perf_counter(); a @ b.T; t = time.perf_counter() - t0
else:
    from deepgemm_ref import golden
    spec = dict(golden.preset("ascend-headline")[0], m=m, n=n, k=k)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter(); golden.generate([spec], tmp + "/b"); t = time.perf_counter() - t0
peak = peak_rss()
print(json.dumps({"seconds": t, "peak": peak}))
"""


def rows_headline(threads: int, rounds: int, scale: int) -> list[bool]:
    from deepgemm_ref import golden

    spec = dict(golden.preset("ascend-headline")[0])
    m, n, k = (spec[key] // scale for key in ("m", "n", "k"))
    env = dict(os.environ, DEEPGEMM_REF_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads),
               OMP_NUM_THREADS=str(threads))

    def child(what: str) -> dict[str, float]:
        r = subprocess.run([sys.executable, "-c", _HEADLINE_CHILD, what, str(m), str(n), str(k)], env=env,
                           check=True, capture_output=True, text=True, cwd=ROOT)
        return json.loads(r.stdout.strip().splitlines()[-1])

    # Time: generation vs the float64 matmul, both in this process, interleaved.
    rng = np.random.default_rng(0)
    ops = [rng.standard_normal((m, k)), rng.standard_normal((n, k))]

    def generate() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            golden.generate([dict(spec, m=m, n=n, k=k)], f"{tmp}/b")

    r = interleaved(lambda: ops[0] @ ops[1].T, generate, rounds)
    ops.clear()
    ok = [report(Row("headline", f"golden of ascend-headline (BF16 {m}x{n}x{k}, S included) vs one float64 matmul",
                     1.9), threads, *r)]
    # Memory: each in a fresh subprocess (peak RSS, VmHWM).
    mm, gen = child("matmul"), child("golden")
    ratio = gen["peak"] / mm["peak"]
    mib = f" (peak RSS, not time: {mm['peak'] / 2**20:.0f} MiB vs {gen['peak'] / 2**20:.0f} MiB)"
    ok.append(report(Row("headline-rss", "  its peak RSS vs the float64 matmul's own peak (subprocesses)", 1.2),
                     threads, ratio, mm["peak"] / 1e3, gen["peak"] / 1e3, extra=mib))
    return ok


_SCALE_CHILD = _PEAK_RSS + r"""
import json, os, resource, sys, tempfile, time
from deepgemm_ref import golden
from deepgemm_ref.golden.cases import estimate_case, validate_spec
spec, limit, out = json.loads(sys.argv[1]), int(sys.argv[2]) or None, sys.argv[3]
import numpy as np; np.ones(1) @ np.ones(1)  # the BLAS loaded before the baseline
est = estimate_case(validate_spec(spec), limit)
base = peak_rss()
with tempfile.TemporaryDirectory(dir=out or None) as tmp:
    t0, c0 = time.perf_counter(), time.process_time()
    golden.generate([spec], tmp + "/b", max_memory=limit)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    size = sum(f.stat().st_size for f in os.scandir(tmp + "/b/cases"))
peak = peak_rss()
print(json.dumps({"base": base, "peak": peak, "wall": wall, "cpu": cpu, "file": size, "est_peak": est.peak_bytes,
                  "est_own": est.own, "est_file": est.file_bytes, "est_seconds": est.seconds, "limit": limit or 0}))
"""

#: The --scale rows' cases: (preset, case id, --max-memory in bytes or 0 for the default).  The
#: second one streams: its float64 work would not fit beside its own tensors in the limit given.
SCALE_CASES = [("deepgemm-tests", "sm100-fp8-m4096-n7168-k2048", 0),
               ("deepgemm-tests", "sm100-bf16-f32-m4096-n256-k7168", 0),
               ("deepgemm-tests", "sm100-fp8-m4096-n4096-k7168", 1 << 30),
               ("deepgemm-tests", "sm90-fp8-m4096-n2112-k7168", 768 << 20)]


def rows_scale(threads: int, cases: list[tuple[str, str, int]], out: str) -> list[bool]:
    """Peak RSS (VmHWM less the interpreter's and imports' own, a fresh subprocess per case),
    file size and time of single cases against their estimates (goal: within 1.5x both ways) and
    the peak against the limit the case ran under."""
    from deepgemm_ref import golden
    from deepgemm_ref.toolkit.sizes import default_memory_limit, format_size

    env = dict(os.environ, DEEPGEMM_REF_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads),
               OMP_NUM_THREADS=str(threads))
    ok: list[bool] = []
    for preset, case_id, limit in cases:
        spec = next(c for c in golden.preset(preset) if c["id"] == case_id)
        r = subprocess.run([sys.executable, "-c", _SCALE_CHILD, json.dumps(spec), str(limit), out], env=env,
                           check=True, capture_output=True, text=True, cwd=ROOT)
        m = json.loads(r.stdout.strip().splitlines()[-1])
        used = m["peak"] - m["base"]
        lim = limit or default_memory_limit()
        two = lambda x: max(x, 1 / x)  # noqa: E731  (within 1.5x both ways: the larger of x and 1/x)
        extra = (f" above the interpreter's {format_size(m['base'])}; estimate {format_size(m['est_peak'])}, of "
                 f"it own tensors {format_size(m['est_own'])}; limit {format_size(lim)}; load average "
                 f"{os.getloadavg()[0]:.2f}")

        def row(title: str, ratio: float, goal: float, detail: str, case_id: str = case_id) -> bool:
            good = ratio <= goal
            print(f"  {ratio:7.2f}x  <= {goal:<5g} {'pass' if good else 'FAIL'}   {case_id}: {title} [{threads} "
                  f"thread(s)]   {detail}", flush=True)
            return good

        ok.append(row("peak RSS, estimate vs measured (either way)", two(m["est_peak"] / used), 1.5,
                      f"measured {format_size(used)}" + extra))
        ok.append(row("peak RSS / the case's memory limit", m["peak"] / lim, 1.0,
                      f"{format_size(m['peak'])} of {format_size(lim)}"))
        ok.append(row("file size, estimate vs measured (either way)", two(m["est_file"] / m["file"]), 1.5,
                      f"estimate {format_size(m['est_file'])}, measured {format_size(m['file'])}"))
        ok.append(row("time, estimate vs measured CPU time (either way)", two(m["est_seconds"] / m["cpu"]), 1.5,
                      f"estimate {m['est_seconds']:.1f} s, measured {m['cpu']:.1f} s CPU ({m['wall']:.1f} s wall)"))
    return ok


ROWS: dict[str, Callable[[int, int], list[bool]]] = {
    "gemm": rows_gemm, "fp32": rows_fp32, "adversarial": rows_adversarial, "mqa": rows_mqa, "grouped": rows_grouped,
    "mega": rows_mega, "quant": rows_quant, "jobs": rows_jobs,
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds per row (at least 5)")
    ap.add_argument("--headline", action="store_true", help="add the ascend-headline golden row (minutes)")
    ap.add_argument("--headline-scale", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--only", default="", help="comma-separated row groups: " + ", ".join(ROWS))
    ap.add_argument("--scale", action="store_true",
                    help="add the memory and estimate rows (single golden cases in subprocesses: peak RSS, file "
                         "and time against their estimates; seconds to minutes)")
    ap.add_argument("--scale-case", action="append", default=[], metavar="PRESET:ID[:LIMIT]",
                    help="a case for the --scale rows instead of the default ones (LIMIT as --max-memory, e.g. "
                         "deepgemm-tests:sm100-bf16-f32-m4096-n129280-k7168); repeatable")
    ap.add_argument("--scale-dir", default="", help="where the --scale cases write their files (default: the "
                    "system's temporary directory)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="time the rows by wall clock (default) or by this process's CPU time (a loaded machine)")
    args = ap.parse_args()
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    if args.rounds < 5:
        ap.error("--rounds: at least 5")
    threads = [int(t) for t in args.threads.split(",") if t]
    only = [w for w in args.only.split(",") if w]
    print(f"numpy {np.__version__}, ml_dtypes {ml_dtypes.__version__}; OpenBLAS kernel: {openblas_kernel()}; "
          f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}; {os.cpu_count()} CPUs; "
          f"load average {os.getloadavg()[0]:.2f}; clock: {args.clock}", flush=True)
    results: list[bool] = []
    for t in threads:
        pin_threads(t)
        print(f"\n{t} thread(s): BLAS, the package's pool and torch pinned to {t} on both sides", flush=True)
        for key, fn in ROWS.items():
            if only and not any(w in key for w in only):
                continue
            results += fn(t, args.rounds)
        if args.headline and (not only or "headline" in only):
            results += rows_headline(t, args.rounds, args.headline_scale)
        if args.scale or args.scale_case:
            from deepgemm_ref.golden.resources import parse_size

            cases = [(p[0], p[1], parse_size(p[2]) if len(p) > 2 else 0)
                     for p in (c.split(":") for c in args.scale_case)] or SCALE_CASES
            results += rows_scale(t, cases, args.scale_dir)
    print(f"\n{sum(results)} of {len(results)} rows pass; load average {os.getloadavg()[0]:.2f}")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
