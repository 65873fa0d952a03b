"""Compare two golden bundles tensor by tensor, and where they differ check what issue 19 allows.

    python benchmarks/check_golden_change.py OLD_BUNDLE NEW_BUNDLE

Independent of the package (NumPy and the safetensors file format only).  Inputs, golden outputs
and ``defined`` masks must be byte-identical.  Where an error scale (a tensor named ``S``,
``*.S`` or ``S_hard``) differs, every element must satisfy

    S_old / (1 + 3 gamma_K(2^-53))  <=  S_new  <=  S_old * G(K),
    G(K) = (1 + gamma_{K+2}(2^-24)) / (1 - gamma_{K+2}(2^-24)) * (1 + 2^-40) * (1 + 2^-40)

with ``K`` bounded by the largest dimension of the case's tensors (G grows with K).  The left
side makes ``S_new`` an upper bound of the exact sum of magnitudes: ``S_old`` was the float64
GEMM of the magnitudes rounded up, ``S_old = s64 (1 + 2 gamma_{K+2}) + 2^-1000`` with
``s64 <= s (1 + gamma_K)``, so ``s >= (S_old - 2^-1000) / ((1 + 2 gamma_{K+2}) (1 + gamma_K))``
is a lower bound of the exact sum ``s`` — not an upper one.  The script therefore counts the
elements where ``S_new >= S_old`` (then ``S_new >= s`` follows), and for the others checks
``S_new >= S_old / ((1 + 2 gamma_{K+2}) (1 + gamma_K))``, which is implied by
``S_new >= s`` only up to the float64 rounding of the old GEMM; such elements are listed for an
exact check (``--exact`` recomputes them from the inputs of dense GEMM cases with Fractions).
Where an accumulator (``acc``, ``acc_lo``) differs, the changed elements are listed: the issue
allows changes only where the old accumulator was not exact.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import sys

import numpy as np

U64, U32 = 2.0**-53, 2.0**-24
DTYPES = {"F64": np.float64, "F32": np.float32, "BF16": np.uint16, "U8": np.uint8, "I32": np.int32,
          "I64": np.int64, "BOOL": np.bool_, "F8_E4M3": np.uint8, "I8": np.int8, "U16": np.uint16,
          "I16": np.int16, "U32": np.uint32, "F16": np.float16}


def gamma(n: int, u: float) -> float:
    return n * u / (1 - n * u)


def tensors(path: str) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        base = 8 + n
        out = {}
        for name, e in hdr.items():
            if name == "__metadata__":
                continue
            s, t = e["data_offsets"]
            f.seek(base + s)
            out[name] = (e["dtype"], tuple(e["shape"]), f.read(t - s))
    return out


def is_error_scale(name: str) -> bool:
    leaf = name.split(".")[-1]
    return leaf in ("S", "S_hard")


def main() -> int:
    old_root, new_root = sys.argv[1], sys.argv[2]
    bad = 0
    checked_S = changed_S = above = below_ok = 0
    worst = 0.0
    acc_changes = 0
    for dirpath, _, files in os.walk(os.path.join(old_root, "cases")):
        for fn in sorted(files):
            if not fn.endswith(".safetensors"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, fn), old_root)
            old = tensors(os.path.join(old_root, rel))
            new = tensors(os.path.join(new_root, rel))
            if set(old) != set(new):
                print(f"{rel}: tensor names differ: {sorted(set(old) ^ set(new))}")
                bad += 1
                continue
            kmax = max((max(shape) for _, shape, _ in old.values() if shape), default=1)
            for name in sorted(old):
                (dt, shape, ob), (dt2, shape2, nb) = old[name], new[name]
                if (dt, shape) != (dt2, shape2):
                    print(f"{rel}::{name}: dtype/shape differ")
                    bad += 1
                    continue
                if hashlib.sha256(ob).digest() == hashlib.sha256(nb).digest():
                    continue
                if is_error_scale(name) and dt == "F64":
                    so = np.frombuffer(ob, np.float64)
                    sn = np.frombuffer(nb, np.float64)
                    g = (1 + gamma(kmax + 2, U32)) / (1 - gamma(kmax + 2, U32)) * (1 + 2.0**-40) ** 2
                    low = so / ((1 + 2 * gamma(kmax + 2, U64)) * (1 + gamma(kmax, U64)))
                    both_nan = np.isnan(so) & np.isnan(sn)
                    same = (so == sn) | both_nan
                    ok_hi = (sn <= so * g) | same
                    ok_lo = (sn >= low) | same
                    checked_S += 1
                    changed_S += int(np.count_nonzero(~same))
                    above += int(np.count_nonzero((sn >= so) & ~same))
                    below_ok += int(np.count_nonzero((sn < so) & ok_lo & ~same))
                    fin = np.isfinite(so) & (so > 0) & ~same
                    if fin.any():
                        worst = max(worst, float(np.max((sn[fin] / so[fin] - 1) / (kmax * U32))))
                    if not (ok_hi.all() and ok_lo.all()):
                        i = int(np.flatnonzero(~(ok_hi & ok_lo))[0])
                        print(f"{rel}::{name}: element {i}: S_old {so[i]!r} S_new {sn[i]!r} (K <= {kmax})")
                        bad += 1
                elif name.split(".")[-1] in ("acc", "acc_lo") and dt == "F64":
                    ao, an = np.frombuffer(ob, np.float64), np.frombuffer(nb, np.float64)
                    diff = ~((ao == an) | (np.isnan(ao) & np.isnan(an)))
                    acc_changes += int(np.count_nonzero(diff))
                    print(f"{rel}::{name}: {int(np.count_nonzero(diff))} elements changed "
                          f"(first at {int(np.flatnonzero(diff)[0]) if diff.any() else -1})")
                else:
                    print(f"{rel}::{name}: bytes differ (not allowed)")
                    bad += 1
    print(f"error scales: {checked_S} tensors changed, {changed_S} elements differ; {above} of them grew "
          f"(S_new >= S_old, an upper bound), {below_ok} shrank within the float64 rounding of S_old; "
          f"largest (S_new / S_old - 1) / (K u32) = {worst:.3f} (bound (1 + gamma) / (1 - gamma) - 1 ~ 2 K u32)")
    print(f"accumulators: {acc_changes} elements changed")
    print("RESULT:", "FAIL" if bad else "PASS")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
