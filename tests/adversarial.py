"""Adversarial GEMM inputs: dot products whose float64 evaluation cannot decide the rounding.

Shared by the exact-tier tests and ``benchmarks/run_all.py`` (the "every element needs the
exact tier" row).  Every generator returns float64 arrays of values exactly representable in
the requested element format (bf16 by default), so that ``tests.reference`` can compute the
exact results with Fractions.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

BF16 = ml_dtypes.bfloat16


def _bf16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float32).astype(BF16).astype(np.float64)


def tie_cancel_breaker(m: int, n: int, k: int, seed: int = 0, out_bits: int = 8, big: int = 40,
                       tiny: int = -60, fill: str = "cancel") -> tuple[np.ndarray, np.ndarray]:
    """bf16-valued A (M, K), B (N, K) whose every dot product is a rounding tie of an output
    format with ``out_bits`` significand bits (8: bf16, 24: float32), plus a large cancelling
    pair (2^big-sized products that cancel exactly), plus a tiny tie-breaker (+-2^tiny-sized
    or zero) that decides the rounding.

    Columns: 0 holds 2^e_i x v_j (v_j in [1, 2) with 8 bits); 1 adds 2^(e_i - out_bits) (half an
    ulp of the output at 2^e_i v_j: a tie); 2 and 3 the cancelling pair 2^big r_i x (x_j, -x_j); 4
    the tie-breaker.  The other columns (``fill``): ``"cancel"`` random values that cancel in
    pairs (a[2c] = a[2c + 1], b[2c + 1] = -b[2c]), ``"zero"`` zeros, ``"random"`` random normals
    (then the results are no longer ties, but every element still needs an exact tier: the
    cancelling pair makes the float64 GEMM's error bound huge).
    """
    rng = np.random.default_rng(seed)
    a = np.zeros((m, k))
    b = np.zeros((n, k))
    e = rng.integers(-4, 5, m)
    a[:, 0] = np.exp2(e)
    b[:, 0] = 1.0 + rng.integers(0, 128, n) / 128.0
    a[:, 1] = np.exp2(e - out_bits)
    b[:, 1] = 1.0
    r = _bf16(rng.uniform(1, 2, m))
    a[:, 2] = a[:, 3] = np.exp2(big) * r
    x = _bf16(rng.standard_normal(n))
    b[:, 2], b[:, 3] = x, -x
    a[:, 4] = np.exp2(tiny) * rng.choice([-1.0, 0.0, 1.0], m)
    b[:, 4] = _bf16(rng.uniform(1, 2, n))
    rest = k - 5
    if rest > 0:
        if fill == "cancel":
            half = rest // 2
            va = _bf16(rng.standard_normal((m, half)))
            vb = _bf16(rng.standard_normal((n, half)))
            a[:, 5:5 + 2 * half:2] = va
            a[:, 6:6 + 2 * half:2] = va
            b[:, 5:5 + 2 * half:2] = vb
            b[:, 6:6 + 2 * half:2] = -vb
        elif fill == "random":
            a[:, 5:] = _bf16(rng.standard_normal((m, rest)))
            b[:, 5:] = _bf16(rng.standard_normal((n, rest)))
    return _bf16(a), _bf16(b)
