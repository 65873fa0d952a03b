"""The range hook of Mega MoE (docs/numerics.md, "The accumulator's range", "Mega MoE").

``y[r, t]`` is a float32 combine of the bf16 L2 outputs of token ``t``'s slots (and, under
ascend950, its shared experts'), each the end of a chain: L1 GEMM (float32 accumulator, bf16
output), SwiGLU (float32), E4M3 re-quantisation with a per-32 scale, L2 GEMM (float32, bf16
output).  The recorded ``S`` and ``acc`` are the combine's; a stage that overflows upstream is
not visible there.  From the stage goldens the bundle keeps (``extra.rank<r>.l1.acc`` / ``.S``,
``swiglu.output``, ``l2.acc`` / ``.S``, ``dispatch.src``; the shared experts' from the inputs),
:func:`mega_range` marks, per element of ``y``:

* every class (+inf, -inf, NaN) where any of the token's slots can overflow in its L1 GEMM (a
  positive or negative part of a row's sums plus ``gamma S`` reaching bf16's largest value: the
  float32 accumulator or its bf16 rounding) or in its SwiGLU (``|v|`` within 2^-4 of float32's
  largest value).  What propagates: an infinite gate or up value gives an infinite or NaN ``v``;
  the group's ``amax`` is then inf, its scale inf and ``v * (1 / sf)`` NaN or 0, and E4M3 has no
  infinity (the cast of inf is NaN, or +-448 where a device saturates), so the whole slot's L2
  row can be NaN, or +-inf through ``finite * inf`` scales: every class of every column is
  allowed (conservative);
* +inf (-inf) at a column where the slot's L2 GEMM can round to +inf (-inf): its positive
  (negative) part plus ``(gamma + 2^-2) S`` reaches bf16's largest value (``2^-2 S`` covers a
  correct device's activations that differ from the golden's by an E4M3 step or a scale
  doubling);
* the shared experts (ascend950) likewise, with ``S`` alone bounding both parts.

The stages accumulate in float32: ``gamma`` is ``gamma_K(2^-24)`` over the stage's K, or
``gamma_K(u_acc)`` where the checked ``u_acc`` is below bf16's 2^-8 (a limited model).  The
combine itself is the single-stage rule on the recorded ``S`` (the checker's own).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import formats as fm
from ..exact import gamma
from .ranges_mqa import BF16_MAX

__all__ = ["mega_range"]

def _rows_reach(acc: np.ndarray, S: np.ndarray, g: float, top: float, extra: float = 0.0) -> tuple[np.ndarray,
                                                                                                   np.ndarray]:
    """(+overflow, -overflow) reachable per element of sums with exact value ``acc`` and error
    scale ``S``: ``(S +- acc) / 2 + (g + extra) S >= top``; a non-finite ``S`` or ``acc`` reaches
    both (its class is the golden's own)."""
    with np.errstate(over="ignore", invalid="ignore"):
        fin = np.isfinite(acc) & np.isfinite(S)
        a, s = np.where(fin, acc, 0.0), np.where(fin, S, 0.0)
        slack = (g + extra) * s
        up = ~fin | ((s + a) / 2 + slack >= top)
        dn = ~fin | ((s - a) / 2 + slack >= top)
    return up, dn


def _scaled_abs(x: np.ndarray, sf: np.ndarray) -> np.ndarray:
    """|x| times its per-32 UE8M0 scales (int16 pairs or bytes) as float64."""
    sf = np.asarray(sf)
    by = fm.unpack_ue8m0_int16(sf) if sf.dtype == np.int16 else sf
    if by.dtype != np.uint8:
        by = np.asarray(by).astype(np.uint8)
    scales = fm.ue8m0_decode(by)
    return np.abs(np.asarray(x).astype(np.float64)) * np.repeat(scales, 32, axis=-1)[..., : np.asarray(x).shape[-1]]


def _reach(golden: Mapping[str, np.ndarray], inputs: Mapping[str, Any], shape: tuple[int, int, int], u_st: float,
           acc_max: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(any class, +inf, -inf) reachable per element of ``y`` (shape (R, N, H)), module docstring."""
    top = min(acc_max, BF16_MAX)  # a float32 stage accumulator, then its bf16 output
    R, N, H = shape
    every = np.zeros((R, N), bool)
    plus = np.zeros(shape, bool)
    minus = np.zeros(shape, bool)
    for r in range(R):
        src = golden.get(f"extra.rank{r}.dispatch.src")
        if src is not None and src.shape[0] and f"extra.rank{r}.l1.acc" in golden:
            l1a, l1s = golden[f"extra.rank{r}.l1.acc"], golden[f"extra.rank{r}.l1.S"]
            up, dn = _rows_reach(l1a, l1s, gamma(H, u_st, unbounded=True), top)
            row = np.any(up | dn, axis=1)
            sw = golden.get(f"extra.rank{r}.swiglu.output")
            if sw is not None:
                with np.errstate(invalid="ignore", over="ignore"):
                    v = np.abs(np.asarray(sw, np.float64))
                    row |= np.any(~np.isfinite(v) | (v * (1 + 2.0**-4) >= acc_max), axis=1)
            every[src[row, 0], src[row, 1]] = True
            l2a, l2s = golden.get(f"extra.rank{r}.l2.acc"), golden.get(f"extra.rank{r}.l2.S")
            if l2a is not None and l2s is not None:
                k2 = int(golden[f"extra.rank{r}.l2.acts"].shape[1]) if f"extra.rank{r}.l2.acts" in golden else H
                up, dn = _rows_reach(l2a, l2s, gamma(max(k2, 1), u_st, unbounded=True), top, 2.0**-2)
                np.logical_or.at(plus, (src[:, 0], src[:, 1]), up)
                np.logical_or.at(minus, (src[:, 0], src[:, 1]), dn)
        # DeepGEMM-Ascend's shared experts: this rank's own tokens
        if f"extra.rank{r}.shared.l1.output" in golden and "shared_l1" in inputs and f"x.{r}" in inputs:
            x = _scaled_abs(inputs[f"x.{r}"], inputs[f"x_sf.{r}"])
            w1 = _scaled_abs(inputs["shared_l1"], inputs["shared_l1_sf"])
            s1 = (x @ w1.T) * (1 + 2.0**-40)
            g1 = gamma(max(x.shape[1], 1), u_st, unbounded=True)
            row = np.any(s1 * (1 + g1) >= top, axis=1)
            sw = golden.get(f"extra.rank{r}.shared.swiglu.output")
            if sw is not None:
                with np.errstate(invalid="ignore", over="ignore"):
                    v = np.abs(np.asarray(sw, np.float64))
                    row |= np.any(~np.isfinite(v) | (v * (1 + 2.0**-4) >= acc_max), axis=1)
            every[r, : row.size] |= row
            acts = golden.get(f"extra.rank{r}.shared.l2.acts")
            if acts is not None:
                a = _scaled_abs(acts, golden[f"extra.rank{r}.shared.l2.acts_sf"])
                w2 = _scaled_abs(inputs["shared_l2"], inputs["shared_l2_sf"])
                s2 = (a @ w2.T) * (1 + 2.0**-40)
                g2 = gamma(max(a.shape[1], 1), u_st, unbounded=True)
                both = s2 * (1 + g2 + 2.0**-2) >= top
                plus[r, : both.shape[0]] |= both
                minus[r, : both.shape[0]] |= both
    return every, plus, minus


def mega_range(entry: Mapping[str, Any], golden: Mapping[str, np.ndarray], inputs: Mapping[str, Any],
               name: str) -> Any:
    """The range hook (:data:`.check.RangeHook`) of a Mega MoE case's ``y`` (module docstring)."""
    if name != "y" or "y" not in golden or np.asarray(golden["y"]).ndim != 3:
        return None
    R, N, H = (int(s) for s in np.asarray(golden["y"]).shape)
    cache: dict[tuple[float, float], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def hook(flat: np.ndarray, u_acc: float, n: int, acc_max: float) -> Any:
        u_st = 2.0**-24 if u_acc >= 2.0**-8 else max(u_acc, 2.0**-24)
        if (u_st, acc_max) not in cache:
            cache[u_st, acc_max] = _reach(golden, inputs, (R, N, H), u_st, acc_max)
        every, plus, minus = cache[u_st, acc_max]
        r, rest = np.divmod(flat, N * H)
        t, c = np.divmod(rest, H)
        e = every[r, t]
        return e | plus[r, t, c], e | minus[r, t, c], e

    return hook
