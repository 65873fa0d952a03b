"""The documented tolerance of the tensors whose bytes follow the BLAS's summation order.

docs/numerics.md ("the error scale"): ``S`` comes from a float32 GEMM of the magnitudes and ``acc``,
where the rounding certificate decided an element, is the float64 GEMM's sum.  Their last bits
follow the BLAS kernel's order, which for some kernels (OpenBLAS's Haswell one, taken on Zen 5
for one) depends on the GEMM's M or N: a chunking or a column split may change them.  Every such
``S`` is an upper bound within ``G(K)`` of another, and two such ``acc`` are within
``2 gamma_K(2^-53) S`` of each other (each within ``gamma_K(2^-53) S`` of the exact sum).
"""

from __future__ import annotations

import numpy as np


def g_factor(k: int) -> float:
    """G(K) = (1 + gamma_{K+2}(2^-24)) / (1 - gamma_{K+2}(2^-24)) (1 + 2^-40)^2."""
    gamma = (k + 2) * 2.0**-24 / (1 - (k + 2) * 2.0**-24)
    return (1 + gamma) / (1 - gamma) * (1 + 2.0**-40) ** 2


def assert_ordered_close(s_x: np.ndarray, s_y: np.ndarray, k: int,
                         acc_x: np.ndarray | None = None, acc_y: np.ndarray | None = None) -> None:
    """``S`` equal in NaN positions and otherwise within G(K) of each other both ways; ``acc``
    equal (NaN at the same places) or within ``2 gamma_K(2^-53) max(S)``."""
    s_x, s_y = np.asarray(s_x, np.float64), np.asarray(s_y, np.float64)
    assert s_x.shape == s_y.shape and np.array_equal(np.isnan(s_x), np.isnan(s_y))
    ok = ~np.isnan(s_x)
    g = g_factor(k)
    assert np.all(s_y[ok] <= g * s_x[ok]) and np.all(s_x[ok] <= g * s_y[ok])
    if acc_x is None or acc_y is None:
        assert acc_x is None and acc_y is None
        return
    a_x, a_y = np.asarray(acc_x, np.float64), np.asarray(acc_y, np.float64)
    assert a_x.shape == a_y.shape
    same = (a_x == a_y) | (np.isnan(a_x) & np.isnan(a_y))
    gamma64 = k * 2.0**-53 / (1 - k * 2.0**-53)
    assert np.all(np.abs(a_x - a_y)[~same] <= 2 * gamma64 * np.maximum(s_x, s_y)[~same])
