"""Calibration of the checker's systematic-error (bias) test: false alarms and detections.

Correct stand-in devices, written here as independent NumPy code (the inputs decoded to their
float64 values times their scales, every product rounded once to float32, float32 sums in one
of several orders, then the kernel's epilogue: one round-to-nearest-even to bf16):

* ``sequential`` (K order), ``reversed``, ``pairwise`` (a balanced tree over K);
* ``blocked-B`` for promotion intervals B = 32, 64, 128, 256, 512 (a float32 partial over each
  block of B products in K order, added into a float32 accumulator);
* ``limited(13, 128)`` checked under its own model (the emulator's model is the device here,
  and the checker's model null is run on the same inputs);

on FP8 GEMMs (``fp8_gemm_nt``, sm100, K = 4096, float32 output by default, so that every
accumulation error shows: with a bf16 output almost no element of a correct device differs)
with ``normal``, ``adversarial`` and ``special`` values.  Each GEMM's output is cut into tiles
(default 32 x 64); a tile of a GEMM's output is itself the output of the GEMM of those rows and columns,
tested as one output: the direction counts of its differing elements, the unbiased null first
and, where that rejects, the emulator's model run on the same inputs as the null (exactly what
``deepgemm-ref check`` does per output).  An *alarm* is a correct device's output that fails.

Detections (must fail): the bf16 output truncated toward zero (1024 x 2048 x 4096, the issue's
device), a float32 accumulator that truncates each addition (sequential), and a scale applied
with a bias (scales times 1 + 2^-10).

    nice python benchmarks/bias_calibration.py            # the full run (about 30 min, 2 cores)
    python benchmarks/bias_calibration.py --quick         # a smoke run (a minute)
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import ml_dtypes
import numpy as np

from deepgemm_ref import formats as fm
from deepgemm_ref.golden import bias as bm
from deepgemm_ref.golden.case import Case

K = 4096
ORDERS = ("sequential", "reversed", "pairwise", "blocked-32", "blocked-64", "blocked-128", "blocked-256",
          "blocked-512")


def scaled_operands(case: Case) -> tuple[np.ndarray, np.ndarray]:
    """The operands' float64 values times their float32 per-128-block scales (user form)."""
    inp = case.inputs
    a = fm.decode(np.asarray(inp["a"]).view(np.uint8), fm.E4M3)
    b = fm.decode(np.asarray(inp["b"]).view(np.uint8), fm.E4M3)
    sa = np.repeat(np.asarray(inp["a_sf"], np.float64), 128, axis=1)[:, : a.shape[1]]
    sb = np.repeat(np.asarray(inp["b_sf"], np.float64), 128, axis=1)[:, : b.shape[1]]
    return a * sa, b * sb


def fp32_sum(a: np.ndarray, b: np.ndarray, order: str) -> np.ndarray:
    """float32 accumulation of fl32(a_k b_k) over k in ``order`` (float32 result, (M, N))."""
    m, k = a.shape
    n = b.shape[0]
    with np.errstate(all="ignore"):
        if order == "pairwise":
            out = np.empty((m, n), np.float32)
            for r0 in range(0, m, 8):
                p = (a[r0:r0 + 8, None, :] * b[None, :, :]).astype(np.float32)
                while p.shape[-1] > 1:
                    if p.shape[-1] % 2:
                        p = np.concatenate([p, np.zeros(p.shape[:-1] + (1,), np.float32)], axis=-1)
                    p = p[..., 0::2] + p[..., 1::2]
                out[r0:r0 + 8] = p[..., 0]
            return out
        ks = range(k - 1, -1, -1) if order == "reversed" else range(k)
        block = int(order.split("-")[1]) if order.startswith("blocked") else 0
        acc = np.zeros((m, n), np.float32)
        part = np.zeros((m, n), np.float32)
        for i, kk in enumerate(ks):
            p = np.multiply.outer(a[:, kk], b[:, kk]).astype(np.float32)
            if block:
                part += p
                if (i + 1) % block == 0 or i + 1 == k:
                    acc += part
                    part[...] = 0
            else:
                acc += p
        return acc


def fp32_truncating_sum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """A float32 accumulator that truncates each addition toward zero (sequential)."""
    m, n = a.shape[0], b.shape[0]
    acc = np.zeros((m, n), np.float32)
    with np.errstate(all="ignore"):
        for kk in range(a.shape[1]):
            s = acc.astype(np.float64) + np.multiply.outer(a[:, kk], b[:, kk]).astype(np.float32)
            t = s.astype(np.float32)
            over = np.abs(t.astype(np.float64)) > np.abs(s)
            acc = np.where(over, np.nextafter(t, np.float32(0)), t)
    return acc


def bf16(x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16)


def epilogue(x: np.ndarray, out: str) -> np.ndarray:
    """The kernel's epilogue without c: one round-to-nearest-even to the output dtype."""
    return bf16(x) if out == "bf16" else np.asarray(x, np.float32)


def counts_of(dev: np.ndarray, gold: np.ndarray) -> dict[str, int]:
    d, g = dev.astype(np.float64), gold.astype(np.float64)
    sel = np.isfinite(d) & np.isfinite(g)
    return bm.direction_counts(d[sel], g[sel])


def test_tiles(dev: np.ndarray, gold: np.ndarray, model: Any, tile: tuple[int, int], threshold: float,
               margin: float, model_name: str) -> list[dict[str, Any]]:
    """The checker's two-stage test on every tile; ``model()`` gives the model's output."""
    out = []
    model_out = None
    m, n = gold.shape
    for r0 in range(0, m, tile[0]):
        for c0 in range(0, n, tile[1]):
            sl = (slice(r0, r0 + tile[0]), slice(c0, c0 + tile[1]))
            c = counts_of(dev[sl], gold[sl])
            res = bm.sign_test(c, threshold=threshold, margin=margin, model=model_name)
            ran = False
            if res.failed:
                if model_out is None:
                    model_out = model()
                res = bm.sign_test(c, threshold=threshold, margin=margin, model=model_name,
                                   model_counts=counts_of(model_out[sl], gold[sl]))
                ran = True
            k = c[res.direction]
            n_dir = k + c[bm.DIRECTIONS[res.direction]]
            out.append({"differing": c["differing"], "log10_p": res.log10_p, "failed": res.failed,
                        "share": k / n_dir if n_dir >= 1000 else 0.0,
                        "model_ran": ran, "direction": res.direction})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a smoke run")
    p.add_argument("--m", type=int, default=256)
    p.add_argument("--n", type=int, default=1024)
    p.add_argument("--tile", type=int, nargs=2, default=(32, 64))
    p.add_argument("--out", default="f32", help="output dtype (f32: every accumulation error is visible; bf16: "
                   "few elements differ at all)")
    p.add_argument("--target", type=int, default=10_000, help="qualifying outputs to reach (>= --min-differing)")
    p.add_argument("--min-differing", type=int, default=1000)
    p.add_argument("--limited-cases", type=int, default=3, help="limited(13, 128) GEMMs (slow model) per value mode")
    p.add_argument("--threshold", type=float, default=bm.DEFAULT_THRESHOLD)
    p.add_argument("--margin", type=float, default=bm.DEFAULT_MARGIN)
    p.add_argument("--no-detections", action="store_true")
    args = p.parse_args(argv)
    if args.quick:
        args.m, args.n, args.target, args.limited_cases = 128, 256, 60, 1
    t0 = time.time()
    tried = qualifying = alarms = model_runs = 0
    worst = 0.0
    lean = 0.0  # the largest share of one direction among outputs with >= 1000 errors in that pair
    per: dict[str, list[int]] = {}
    seed = 0
    modes = ("normal", "adversarial", "special")

    def tally(res: list[dict[str, Any]], stat: list[int]) -> None:
        """Add one GEMM's tile results to the totals and to its row (outputs, qualifying, alarms,
        model runs)."""
        nonlocal tried, qualifying, alarms, model_runs, worst, lean
        for r in res:
            q = int(r["differing"] >= args.min_differing)
            tried += 1
            qualifying += q
            alarms += r["failed"]
            model_runs += r["model_ran"]
            worst = min(worst, r["log10_p"])
            lean = max(lean, r["share"])
            for i, v in enumerate((1, q, r["failed"], r["model_ran"])):
                stat[i] += v
    while qualifying < args.target:
        mode = modes[seed % 3]
        order = ORDERS[(seed // 3) % len(ORDERS)]
        case = Case.from_spec({"id": f"cal{seed}", "kernel": "fp8_gemm_nt", "profile": "sm100", "m": args.m,
                               "n": args.n, "k": K, "seed": seed, "values": mode, "out": args.out})
        gold = np.asarray(case.golden()["d"])
        a, b = scaled_operands(case)
        dev = epilogue(fp32_sum(a, b, order), args.out)
        res = test_tiles(dev, gold, lambda c=case: c.call(accumulation="fp32")["d"], tuple(args.tile),
                         args.threshold, args.margin, "fp32")
        key = f"{order}/{mode}"
        stat = per.setdefault(key, [0, 0, 0, 0])  # outputs, qualifying, alarms, model runs
        tally(res, stat)
        seed += 1
        if seed % 3 == 0:
            print(f"  [{time.time() - t0:.0f}s] {seed} GEMMs, {tried} outputs ({qualifying} with >= "
                  f"{args.min_differing} differing), alarms {alarms}, most extreme log10 p {worst:.3g}", flush=True)
    for i in range(args.limited_cases * 3):
        mode = modes[i % 3]
        case = Case.from_spec({"id": f"lim{i}", "kernel": "fp8_gemm_nt", "profile": "sm100", "m": 128, "n": 256,
                               "k": K, "seed": 1000 + i, "values": mode, "out": args.out})
        gold = np.asarray(case.golden()["d"])
        dev = np.asarray(case.call(accumulation="limited(13, 128)")["d"])
        res = test_tiles(dev, gold, lambda d=dev: d, tuple(args.tile), args.threshold, args.margin,
                         "limited(13, 128)")
        stat = per.setdefault(f"limited(13, 128)/{mode}", [0, 0, 0, 0])
        tally(res, stat)
    print(f"correct devices: {seed} fp32 GEMMs of {args.m} x {args.n} x {K} (+ {args.limited_cases * 3} "
          f"limited(13, 128) of 128 x 256 x {K}), tiles {args.tile[0]} x {args.tile[1]}")
    for key, (o, q, a_, mr) in sorted(per.items()):
        print(f"  {key:<32} outputs {o:>6}  with >= {args.min_differing} differing {q:>6}  alarms {a_}  "
              f"model runs {mr}")
    print(f"outputs tried: {tried}; with >= {args.min_differing} differing elements: {qualifying}; alarms: {alarms}; "
          f"model runs: {model_runs}; most extreme log10 p: {worst:.4g}; largest one-direction share (outputs with "
          f">= 1000 errors in the pair): {lean:.4f} (threshold {args.threshold:g}, margin "
          f"{args.margin:g}); {time.time() - t0:.0f} s")
    if not args.no_detections:
        detections(args)
    return 1 if alarms else 0


def detections(args: argparse.Namespace) -> None:
    """The broken devices of the issue: each must fail the bias test."""
    big = (256, 512) if args.quick else (1024, 2048)
    case = Case.from_spec({"id": "trunc", "kernel": "fp8_gemm_nt", "profile": "sm100", "m": big[0], "n": big[1],
                           "k": K, "seed": 7})
    g = case.golden()
    from deepgemm_ref.golden.diagnose.mutations import round_toward_zero

    trunc = round_toward_zero(np.asarray(g["acc"], np.float64), fm.BF16).astype(ml_dtypes.bfloat16)
    rep = case.compare({"d": trunc}).reports[0]
    print(f"output truncated, {big[0]} x {big[1]} x {K}: status {rep.status}, failing elements {rep.failed}; "
          + bm.describe_bias(rep.bias or {}))
    biased = bf16(np.asarray(g["acc"], np.float64) * (1 + 2.0**-10))
    rep = case.compare({"d": biased}).reports[0]
    print(f"scales times (1 + 2^-10), {big[0]} x {big[1]} x {K}: status {rep.status}, failing elements {rep.failed}; "
          + bm.describe_bias(rep.bias or {}))
    # float32 output: at a bf16 output a float32 accumulator's truncation is far below one ulp
    # (5 of 65,536 elements differ at 128 x 512 x 4096), so no test can see it there
    small = Case.from_spec({"id": "truncacc", "kernel": "fp8_gemm_nt", "profile": "sm100", "m": 128, "n": 512,
                            "k": K, "seed": 8, "out": "f32"})
    a, b = scaled_operands(small)
    dev = fp32_truncating_sum(a, b)
    rep = small.compare({"d": dev}).reports[0]
    print(f"float32 accumulator truncating each addition, 128 x 512 x {K}, float32 output: status {rep.status}, "
          f"failing elements "
          f"{rep.failed}; " + bm.describe_bias(rep.bias or {}))


if __name__ == "__main__":
    sys.exit(main())
