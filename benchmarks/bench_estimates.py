"""Estimated vs measured peak memory, file size and time of golden cases (issue 30, item 2).

    python benchmarks/bench_estimates.py --preset smoke
    python benchmarks/bench_estimates.py --preset deepgemm-tests --match 'm128-|m4096-n4096' --markdown
    python benchmarks/bench_estimates.py --preset smoke,deepgemm-tests-small --summary

Every case runs alone in this process, twice: once timed (nothing traced; the time compared is the
process's CPU time, which on a loaded machine stands for the wall time of an idle one with the same
threads pinned; the wall time is printed beside it), once under tracemalloc
for its peak memory (NumPy's data buffers are traced; the peak is that of ``generate_case``:
building the inputs, the golden call, writing the file).  The golden BLAS runs on one thread as
in generation; the package's pool and the BLAS are pinned to ``--threads`` (default 1).  Each
case's ratio is estimate / measured (1.0 is exact; the goal is within 1.5x both ways).  The
machine's load average is printed beside the numbers: time ratios measured on a loaded machine
are high by about the load's factor.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

from _common import ROOT  # noqa: F401,I001  (benchmarks run as scripts; puts the repository first)

from deepgemm_ref import _parallel
from deepgemm_ref.golden import preset
from deepgemm_ref.golden.bundle import CASES_DIR
from deepgemm_ref.golden.cases import estimate_case, validate_spec
from deepgemm_ref.golden.generation import generate_case
from deepgemm_ref.golden.resources import format_seconds, work_per_second
from deepgemm_ref.toolkit.sizes import format_size

GOAL = 1.5


def measure(spec_dict: dict[str, Any], workdir: Path, max_memory: int | None = None, repeat: int = 1) -> dict[str, Any]:
    """One case: its estimate and its measured seconds (the median of ``repeat`` runs, the first
    one's beside it), peak bytes (tracemalloc) and file bytes."""
    spec = validate_spec(spec_dict)
    est = estimate_case(spec)
    (workdir / CASES_DIR).mkdir(parents=True, exist_ok=True)
    walls, cpus = [], []
    for _ in range(max(1, repeat)):
        t0, c0 = time.perf_counter(), time.process_time()
        entry = generate_case(spec, workdir, True, max_memory)
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
        path = workdir / entry["file"] if "file" in entry else next((workdir / CASES_DIR).glob("*"))
        file_bytes = path.stat().st_size
        for f in (workdir / CASES_DIR).iterdir():
            f.unlink()
    wall, seconds = statistics.median(walls), statistics.median(cpus)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        generate_case(spec, workdir, True, max_memory)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    for f in (workdir / CASES_DIR).iterdir():
        f.unlink()
    return {"id": spec.id, "est_peak": est.peak_bytes if est else None, "peak": peak,
            "est_file": est.file_bytes if est else None, "file": file_bytes,
            "est_seconds": est.seconds if est else None, "seconds": seconds, "wall": wall, "first": cpus[0]}


def _ratio(est: float | None, got: float) -> float:
    return float("nan") if est is None or got <= 0 else est / got


def _ok(r: float) -> bool:
    return 1 / GOAL <= r <= GOAL


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="smoke", help="comma-separated presets (default smoke)")
    ap.add_argument("--match", default="", help="only case ids matching this regular expression")
    ap.add_argument("--limit", type=int, default=0, help="at most this many cases per preset (0: all)")
    ap.add_argument("--threads", type=int, default=1, help="BLAS and pool threads (default 1)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="time each case this many times in a row and compare the median (default 1: "
                         "the single run generation makes; its time is also stored as 'first')")
    ap.add_argument("--min-seconds", type=float, default=0.0,
                    help="leave out of the time ratios cases measured under this many seconds")
    ap.add_argument("--markdown", action="store_true", help="print the table as markdown")
    ap.add_argument("--summary", action="store_true", help="only the per-preset summary lines")
    ap.add_argument("--json", default="", help="also write every case's numbers to this JSON file")
    ap.add_argument("--from-json", default="", help="re-tabulate the measurements of an earlier --json run "
                    "against the current estimates (nothing is generated)")
    args = ap.parse_args()
    _parallel.limit_blas_threads(args.threads)
    os.environ["DEEPGEMM_REF_NUM_THREADS"] = str(args.threads)
    print(f"load average {os.getloadavg()[0]:.2f}; {os.cpu_count()} CPUs; threads {args.threads}; calibrated "
          f"{work_per_second():.3g} work units per second", flush=True)
    bad = 0
    dump: list[dict[str, Any]] = []
    for name in [p for p in args.preset.split(",") if p]:
        cases = [c for c in preset(name) if not args.match or re.search(args.match, c["id"])]
        if args.limit:
            cases = cases[:args.limit]
        rows = []
        if args.markdown and not args.summary:
            print(f"\n#### {name}\n\n| case | peak est | peak measured | ratio | file est | file | ratio "
                  "| time est (s) | CPU time (s) | ratio | wall (s) |\n|---|---|---|---|---|---|---|---|---|---|---|")
        earlier = {(r["preset"], r["id"]): r for r in json.loads(Path(args.from_json).read_text())} \
            if args.from_json else None
        if earlier is not None:
            cases = [c for c in cases if (name, c["id"]) in earlier]
        with tempfile.TemporaryDirectory() as tmp:
            for c in cases:
                if earlier is not None:
                    r = dict(earlier[(name, c["id"])])
                    est = estimate_case(validate_spec(c))
                    assert est is not None
                    r.update(est_peak=est.peak_bytes, est_file=est.file_bytes, est_seconds=est.seconds)
                else:
                    r = measure(c, Path(tmp), repeat=args.repeat)
                rows.append(r)
                dump.append(dict(r, preset=name, spec=c))
                if not args.summary and args.markdown:
                    print(f"| {r['id']} | {format_size(r['est_peak'] or 0)} | {format_size(r['peak'])} | "
                          f"{_ratio(r['est_peak'], r['peak']):.2f} | {format_size(r['est_file'] or 0)} | "
                          f"{format_size(r['file'])} | {_ratio(r['est_file'], r['file']):.2f} | "
                          f"{r['est_seconds'] or 0:.3f} | {r['seconds']:.3f} | "
                          f"{_ratio(r['est_seconds'], r['seconds']):.2f} | {r['wall']:.3f} |", flush=True)
                elif not args.summary:
                    print(f"{r['id']}: peak {format_size(r['est_peak'] or 0)} est / {format_size(r['peak'])} "
                          f"= {_ratio(r['est_peak'], r['peak']):.2f}; file {_ratio(r['est_file'], r['file']):.2f}; "
                          f"time {format_seconds(r['est_seconds'] or 0)} est / {r['seconds']:.2f} s = "
                          f"{_ratio(r['est_seconds'], r['seconds']):.2f} (CPU; wall {r['wall']:.2f} s)", flush=True)
        peak_r = [_ratio(r["est_peak"], r["peak"]) for r in rows]
        file_r = [_ratio(r["est_file"], r["file"]) for r in rows]
        timed = [r for r in rows if r["seconds"] >= args.min_seconds]
        time_r = [_ratio(r["est_seconds"], r["seconds"]) for r in timed]
        tot = (_ratio(sum(r["est_seconds"] or 0 for r in rows), sum(r["seconds"] for r in rows)),
               _ratio(max(r["est_peak"] or 0 for r in rows), max(r["peak"] for r in rows)),
               _ratio(sum(r["est_file"] or 0 for r in rows), sum(r["file"] for r in rows)))
        out = [sum(not _ok(x) for x in xs) for xs in (peak_r, file_r, time_r)]
        bad += sum(out) + sum(not _ok(x) for x in tot)
        print(f"{name}: {len(rows)} cases; per case estimate/measured: peak median {statistics.median(peak_r):.2f} "
              f"[{min(peak_r):.2f}, {max(peak_r):.2f}], {out[0]} outside 1/{GOAL}..{GOAL}; file median "
              f"{statistics.median(file_r):.2f} [{min(file_r):.2f}, {max(file_r):.2f}], {out[1]} outside; time "
              f"median {statistics.median(time_r) if time_r else float('nan'):.2f} "
              f"[{min(time_r, default=float('nan')):.2f}, {max(time_r, default=float('nan')):.2f}] over "
              f"{len(time_r)} cases, {out[2]} outside; whole preset: time {tot[0]:.2f} "
              f"({format_seconds(sum(r['est_seconds'] or 0 for r in rows))} est / "
              f"{sum(r['seconds'] for r in rows):.1f} s), largest peak {tot[1]:.2f}, disk {tot[2]:.2f}; "
              f"load average {os.getloadavg()[0]:.2f}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(dump, indent=1, default=str))
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
