"""Device probes: inputs whose outputs reveal how a device accumulates.

The ``ascend-probes`` preset holds three MX FP8 GEMM cases (``fp8_gemm_nt``, per-32 UE8M0 scales,
float32 or bf16 output) whose inputs are crafted, not random:

``accumulator``
    Row ``r`` has two non-zero products: ``2^s`` at K position 0 (a 1.0 in a block scaled by
    ``2^s``) and ``v`` at K position ``j`` (v = 1.0, or 1.5 for the rounding rows), for spreads
    ``s = 1 .. 30`` and positions ``j``: 16 (inside the first 32-product group: the spread then
    comes from the element values, and every product carries a common power-of-two unit) and
    every block start up to 512.  The exact sum is ``2^s + v`` (times the unit).  A device that
    aligns a group's terms to its largest exponent and keeps ``p`` bits drops ``v`` once
    ``s >= p`` while ``j`` is inside the same promotion interval; after a promotion into float32
    ``v`` survives up to ``s = 23``.  So the largest surviving spread at position 16 gives the
    accumulator width, the first block start where it jumps gives the promotion interval (any
    multiple of 32 up to 512), and the 1.5 rows give truncation (``2^s``) versus
    round-to-nearest (``2^s + 2``).
``output_rounding``
    Accumulators exactly at bf16 ties (``1 + 2^-8`` and ``1 + 3 * 2^-8``) and just off them, with a
    bf16 output: RNE gives (1, 1 + 2^-6), truncation (1, 1 + 2^-7), ties away (1 + 2^-7, 1 + 2^-6).
    The small terms sit past K = 512, outside the 1.0's promotion interval, so even a narrow
    accumulator hands them to the output rounding intact.
``ue8m0_zero``
    A product whose A scale is the UE8M0 byte 0x00 and whose B scale is 2^127: the output is 1 if
    the device reads byte 0 as 2^-127 (OCP, NVIDIA), 0 if it reads it as zero (CANN's host type).

``analyse`` reads a device's outputs of these cases and prints the inferred parameters and the
emulator's accumulation model that matches them (``limited(bits, interval)`` or ``fp32``).
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from ..errors import DGArgumentError
from .cases import ArgRef, BuiltCase, CaseSpec, register_family
from .resources import PEAK_FIXED, Estimate, tensor_bytes
from .schema import Key, Params, Schema

__all__ = ["probe_cases", "analyse", "POSITIONS", "SPREADS"]

SPREADS = tuple(range(1, 31))
#: 16 shares the first 32-product group with position 0 (the group's own alignment, whatever the
#: promotion interval); then every block start up to 512, so any interval that is a multiple of
#: 32 up to 512 is found exactly.
POSITIONS = (16,) + tuple(range(32, 513, 32))
_K = 640  # covers the largest position plus one block
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
_B0, _B16 = 8, -9  # exponents of b[0] and b[16] in the accumulator probe (the rest of b is 1)


def _probe_rows() -> list[tuple[int, int, float]]:
    return [(s, j, v) for v in (1.0, 1.5) for j in POSITIONS for s in SPREADS]


def _accumulator_row(s: int, j: int) -> tuple[float, float, int, float]:
    """(a[0], a[j] / v, block-0 scale exponent, unit) of one accumulator probe row: the products
    are unit * 2^s at K position 0 and unit * v at position j.

    Positions past the first block put 2^s in block 0's scale.  Position 16 is inside block 0, so
    the spread comes from the elements: a[0] = 2^x against b[0] = 2^8 and a[16] = v 2^y against
    b[16] = 2^-9 with x - y = s - 17 (x, y in [-8, 8], E4M3 values; 1.5 * 2^-8 is a subnormal).
    """
    if j >= 32:
        return 2.0 ** -_B0, 1.0, s, 1.0
    x, y = (s - 25, -8) if s >= 17 else (s - 9, 8)
    return 2.0 ** x, 2.0 ** y, 0, 2.0 ** (y + _B16)


def _bytes(exps: np.ndarray) -> np.ndarray:
    """float32 powers of two 2^exps (the user-form scales), exps may be -127 (byte 0 -> 0.0)."""
    out = np.ldexp(np.float32(1), exps.astype(np.int32)).astype(np.float32)
    out[exps == -127] = 0.0  # float32 0.0 packs to UE8M0 byte 0
    return out


def build_probe(spec: CaseSpec, rng: np.random.Generator) -> BuiltCase:
    """The crafted inputs of one probe case (``probe``: accumulator, output_rounding, ue8m0_zero)."""
    kind = spec.resolved["probe"]
    nb = _K // 32
    if kind == "accumulator":
        rows = _probe_rows()
        a = np.zeros((len(rows), _K), np.float32)
        sa_exp = np.zeros((len(rows), nb), np.int64)
        for r, (s, j, v) in enumerate(rows):
            a[r, 0], a_j, sa_exp[r, 0], _ = _accumulator_row(s, j)
            a[r, j] = v * a_j
        out = "f32"
    elif kind == "output_rounding":
        # acc = 1 + t * 2^-8 with t in {1, 3} (ties) and 1 + t * 2^-8 +- 2^-20 (off the ties)
        vals = [(1, 0), (3, 0), (1, 1), (1, -1), (3, 1), (3, -1)]
        a = np.zeros((len(vals), _K), np.float32)
        sa_exp = np.zeros((len(vals), nb), np.int64)
        # The small terms sit past K = 512, in another promotion interval than the 1.0 for any
        # interval up to 512, so a narrow accumulator cannot truncate them before the output.
        for r, (t, off) in enumerate(vals):
            a[r, 0] = 1.0
            a[r, 576] = t  # block 18 scaled by 2^-8
            sa_exp[r, 18] = -8
            if off:
                a[r, 608] = off  # block 19 scaled by 2^-20
                sa_exp[r, 19] = -20
        out = "bf16"
    elif kind == "ue8m0_zero":
        a = np.zeros((1, _K), np.float32)
        a[0, 0] = 1.0
        sa_exp = np.zeros((1, nb), np.int64)
        sa_exp[0, 0] = -127
        out = "f32"
    else:
        raise DGArgumentError(f"probe case {spec.id!r}: probe: expected 'accumulator', 'output_rounding' "
                              f"or 'ue8m0_zero'; got {kind!r}")
    b = np.zeros((1, _K), np.float32)
    b[0, :] = 1.0
    if kind == "accumulator":
        b[0, 0], b[0, 16] = 2.0 ** _B0, 2.0 ** _B16
    sb_exp = np.zeros((1, nb), np.int64)
    if kind == "ue8m0_zero":
        sb_exp[0, 0] = 127
    inputs = {"a": a.astype(E4M3), "a_sf": _bytes(sa_exp), "b": b.astype(E4M3), "b_sf": _bytes(sb_exp)}
    m = a.shape[0]
    out_dtype = "bfloat16" if out == "bf16" else "float32"
    return BuiltCase(
        spec, inputs, "fp8_gemm_nt",
        [ArgRef("pair", ("a", "a_sf")), ArgRef("pair", ("b", "b_sf")), ArgRef("output", ("d",))],
        {"recipe": ArgRef("value", (), [1, 1, 32])},
        {"d": {"init": "zeros", "shape": [m, 1], "dtype": out_dtype}},
        {"a_sf": {"function": "transform_sf_into_required_layout",
                  "kwargs": {"mn": m, "k": _K, "recipe": [1, 1, 32], "is_sfa": True}},
         "b_sf": {"function": "transform_sf_into_required_layout",
                  "kwargs": {"mn": 1, "k": _K, "recipe": [1, 1, 32], "is_sfa": False}}},
        {"n": _K, "epilogue": {"out": out, "alpha": None, "c": None, "c_mode": "kernel"}, "c_epi": 0,
         "probe": kind},
    )


PROBE_SCHEMA = Schema(
    "probe",
    "Device probes: crafted MX FP8 inputs of `fp8_gemm_nt` whose outputs reveal the "
    "accumulator width, promotion interval and rounding, the output rounding and the UE8M0 0x00 reading.  "
    "Chosen with `\"family\": \"probe\"`.",
    {"fp8_gemm_nt": ("ascend950", "sm100")},
    (Key("probe", "str", "which probe", "accumulator", choices=("accumulator", "output_rounding", "ue8m0_zero")),),
    why_not={"fp8_gemm_nt": "the probes use per-32 UE8M0 scales"},
)


def estimate_probe(p: Params) -> Estimate:
    rows = {"accumulator": len(_probe_rows()), "ue8m0_zero": 1}.get(p["probe"], 6)  # output_rounding: 6 rows
    file = tensor_bytes((rows * _K, 1), (rows * _K // 32, 4), (_K, 1), (rows, 29))
    # measured (tracemalloc, CPU time): 0.4 of the former peak bound; about 300 BLAS multiply-adds
    # per element (the probes' exact evaluation)
    return Estimate.of(file, PEAK_FIXED + 13 * rows * _K, 300 * rows * _K)


register_family("probe", build_probe, schema=PROBE_SCHEMA, estimate=estimate_probe,
                functions=("transform_sf_into_required_layout",), explicit=True)


def probe_cases(profile: str = "ascend950") -> list[dict[str, Any]]:
    """The ``ascend-probes`` preset (also valid under sm100)."""
    return [{"id": f"probe-{kind}", "kernel": "fp8_gemm_nt", "profile": profile, "family": "probe", "probe": kind}
            for kind in ("accumulator", "output_rounding", "ue8m0_zero")]


def analyse(outputs: dict[str, np.ndarray]) -> dict[str, Any]:
    """Infer the device's accumulator and rounding from its outputs of the probe cases.

    outputs: ``{"probe-accumulator/d": float32 (rows, 1), "probe-output_rounding/d": bf16 (6, 1),
    "probe-ue8m0_zero/d": float32 (1, 1)}`` (any subset).
    """
    result: dict[str, Any] = {}
    acc = outputs.get("probe-accumulator/d")
    if acc is not None:
        y = np.asarray(acc, np.float64).reshape(-1)
        rows = _probe_rows()
        if y.size != len(rows):
            raise DGArgumentError(f"probe analyse: probe-accumulator/d: expected {len(rows)} rows; got {y.size}")
        survive: dict[int, int] = {}
        for r, (s, j, v) in enumerate(rows):
            if v == 1.0 and y[r] == (2.0**s + 1) * _accumulator_row(s, j)[3]:
                survive[j] = max(survive.get(j, 0), s)
        kmax = {j: survive.get(j, 0) for j in POSITIONS}
        within = kmax[POSITIONS[0]]
        bits = within + 1
        interval = next((j for j in POSITIONS if kmax[j] > within), None)
        result["survival_by_position"] = kmax
        result["accumulator_bits"] = bits if bits < 24 else ">= 24 (float32 or wider)"
        result["promotion_interval"] = interval if bits < 24 else None
        # rounding: the 1.5 rows at spread s = bits within the interval
        if bits < 24:
            r = rows.index((bits, POSITIONS[0], 1.5))
            unit = _accumulator_row(bits, POSITIONS[0])[3]
            got = (y[r] - 2.0**bits * unit) / unit
            rounding = {0.0: "truncation (toward zero)", 2.0: "round to nearest"}
            result["group_rounding"] = rounding.get(got, f"other ({got})")
        if bits < 24 and interval is not None:
            result["model"] = f"limited({bits}, {interval})"
        elif bits >= 24:
            result["model"] = "fp32 (or exact): no accumulator narrower than float32 detected"
        else:
            result["model"] = f"limited({bits}, >{POSITIONS[-1]})"
    rnd = outputs.get("probe-output_rounding/d")
    if rnd is not None:
        rv = np.asarray(rnd, np.float64).reshape(-1)
        ties = (float(rv[0]), float(rv[1]))
        names = {(1.0, 1 + 2.0**-6): "round to nearest even", (1.0, 1 + 2.0**-7): "truncation",
                 (1 + 2.0**-7, 1 + 2.0**-6): "round to nearest, ties away"}
        result["output_rounding"] = names.get(ties, f"unrecognised {ties}")
    zero = outputs.get("probe-ue8m0_zero/d")
    if zero is not None:
        z = float(np.asarray(zero, np.float64).reshape(-1)[0])
        result["ue8m0_byte_0"] = {1.0: "2^-127 (OCP / NVIDIA)", 0.0: "zero (CANN host decode)"}.get(z, f"other ({z})")
    return result
