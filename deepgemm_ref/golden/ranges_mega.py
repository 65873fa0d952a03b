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

The hook also carries :meth:`MegaRange.allowance`, the *stage-propagated* allowance of a finite
element outside ``E_hard`` (docs/numerics.md, "Mega MoE numerics"): a correct device's L1 value
lies in ``[bf16(acc - gamma_H S), bf16(acc + gamma_H S)]`` (the L1 stage's ``acc`` and ``S``);
that interval is pushed through the clamp, SwiGLU (silu's monotone pieces, a relative
:data:`SWIGLU_REL` for the device's approximate exp), the group amax (the possible UE8M0 scale
bytes), the E4M3 (or bf16) rounding of both ends, giving each activation's largest possible
deviation ``dev_i`` from the golden activation.  With ``D = sum_i dev_i |w2_i|`` per output
column, the slot's allowance is ``max(0, F D - B l2.S)``: ``F = (1 + 2^-8)(1 + gamma_I)(1 + 2^-16)``
carries the deviation through the L2 GEMM's float32 sum, its bf16 rounding and the combine, and
``B l2.S`` with ``B = 2 gamma_n(u_acc) - (1 + 2^-8) gamma_I`` is what ``E_hard``'s ``2 l2.S`` term
has left for activation flips after the L2's own float32 error.  The element's allowance is the
sum over its slots (and the shared experts'); where no interval crosses a rounding boundary every
``dev_i`` is 0 and so is the allowance, and one E4M3 flip of an activation that does not dominate
its slot stays inside ``E_hard`` as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import formats as fm
from ..exact import gamma
from ..mega import _swiglu as sw
from .ranges_mqa import BF16_MAX

__all__ = ["mega_range", "MegaRange", "stage_allowance", "activation_deviation", "SWIGLU_REL"]

#: Relative error allowed for a correct device's float32 SwiGLU value (its exp is approximate:
#: CUDA's ``__expf`` errs by at most 2 + floor(1.16 |x|) ulps, about 2^-17 relative at |x| = 88
#: where expf overflows; the reciprocal and the two products add a few ulps): 2^-14, four times that.
SWIGLU_REL = 2.0**-14
#: ... and an absolute one (exp(-g) overflowing to inf gives 0 where the value is below 2^-100).
SWIGLU_ABS = 2.0**-100
#: silu(g) = g / (1 + exp(-g)) has its minimum -0.27846... at g = -1.27846... (1 + e^-g (1 + g) = 0);
#: decreasing before, increasing after.
_SILU_ARGMIN = -1.278464542761074
_SILU_MIN = -0.2784645427610738 * (1 + 2.0**-20)  # rounded away from zero

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


def _rn(x: np.ndarray, fmt: fm.Format, saturate: bool = False) -> np.ndarray:
    """Round-to-nearest-even of float64 ``x`` to ``fmt`` (saturating for E4M3), as float64."""
    with np.errstate(over="ignore", invalid="ignore"):
        return fm.decode(fm.encode(x, fmt, fm.SATURATING_RNE if saturate else fm.IEEE_RNE), fmt)


def _silu(g: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        return g / (1.0 + np.exp(-g))


def _mul(alo: np.ndarray, ahi: np.ndarray, blo: np.ndarray, bhi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Interval product (NaN where an end is not finite: 0 * inf)."""
    with np.errstate(over="ignore", invalid="ignore"):
        p = np.stack([alo * blo, alo * bhi, ahi * blo, ahi * bhi])
    return p.min(axis=0), p.max(axis=0)


def _ue8m0_range(amax_lo: np.ndarray, amax_hi: np.ndarray, rule: sw.ScaleRule) -> tuple[np.ndarray, np.ndarray]:
    """The UE8M0 bytes of the re-quantisation rule at the two ends of each group's amax interval
    (the rule is monotone in amax): computed by the rule itself on one-element groups."""
    def byte(a: np.ndarray) -> np.ndarray:
        probe = np.zeros((a.size, 32), np.float32)
        probe[:, 0] = a.ravel()
        return sw.requantize(probe, rule)[1].reshape(a.shape).astype(np.int64)

    with np.errstate(over="ignore"):
        lo32 = amax_lo.astype(np.float32)
        lo32 = np.where(lo32.astype(np.float64) > amax_lo, np.nextafter(lo32, np.float32(0)), lo32)
        hi32 = amax_hi.astype(np.float32)
        hi32 = np.where(hi32.astype(np.float64) < amax_hi, np.nextafter(hi32, np.float32(np.inf)), hi32)
    return byte(lo32), byte(hi32)


def activation_deviation(acc: np.ndarray, S: np.ndarray, g_l1: float, weights: np.ndarray | None,
                         acts: np.ndarray, acts_sf: np.ndarray | None, clamp: float | None,
                         rule: sw.ScaleRule) -> np.ndarray:
    """The largest possible ``|a'_i - a_i|`` per activation (float64 (M, I); inf where unbounded)
    of a correct device whose L1 accumulates with ``|error| <= g_l1 * S``.

    acc, S: the L1 stage's exact accumulator and error scale (M, 2I) [gate | up]; weights: the
    route weight of every row (M,) or None (a shared expert); acts: the golden L2 activations
    (M, I) E4M3 with per-32 UE8M0 bytes ``acts_sf`` (M, I / 32), or bf16 with None; clamp:
    ``activation_clamp``; rule: the re-quantisation's scale rule (:func:`.._swiglu.requantize`).
    """
    M, two_i = acc.shape
    I = two_i // 2
    with np.errstate(over="ignore", invalid="ignore"):
        e = g_l1 * S * (1 + 2.0**-40)
        h_lo = _rn(np.nextafter(acc - e, -np.inf), fm.BF16)
        h_hi = _rn(np.nextafter(acc + e, np.inf), fm.BF16)
    g_lo, g_hi, u_lo, u_hi = h_lo[:, :I], h_hi[:, :I], h_lo[:, I:], h_hi[:, I:]
    if clamp is not None:  # the fused kernels' clamp on bf16 values: monotone
        cb = float(_rn(np.array([float(np.float32(clamp))]), fm.BF16)[0])
        g_lo, g_hi = np.minimum(g_lo, cb), np.minimum(g_hi, cb)
        u_lo, u_hi = np.clip(u_lo, -cb, cb), np.clip(u_hi, -cb, cb)
    s_a, s_b = _silu(g_lo), _silu(g_hi)
    s_lo = np.where((g_lo <= _SILU_ARGMIN) & (_SILU_ARGMIN <= g_hi), _SILU_MIN, np.minimum(s_a, s_b))
    s_hi = np.maximum(s_a, s_b)
    v_lo, v_hi = _mul(s_lo, s_hi, u_lo, u_hi)
    if weights is not None:
        w = np.asarray(weights, np.float64).reshape(-1, 1)
        v_lo, v_hi = _mul(v_lo, v_hi, w, w)
    with np.errstate(over="ignore", invalid="ignore"):
        v_lo = v_lo - SWIGLU_REL * np.abs(v_lo) - SWIGLU_ABS
        v_hi = v_hi + SWIGLU_REL * np.abs(v_hi) + SWIGLU_ABS
        bounded = np.isfinite(v_lo) & np.isfinite(v_hi) & (np.maximum(-v_lo, v_hi) < F32_LIMIT)
    v_lo, v_hi = np.where(bounded, v_lo, 0.0), np.where(bounded, v_hi, 0.0)
    if acts_sf is None:  # BF16 activations
        a = np.asarray(acts).astype(np.float64)
        dev = np.maximum(np.abs(_rn(v_lo, fm.BF16) - a), np.abs(_rn(v_hi, fm.BF16) - a))
        return np.where(bounded & np.isfinite(a), dev, np.inf)
    G = I // 32
    by = np.asarray(acts_sf).astype(np.int64)
    a = np.asarray(acts).astype(np.float64) * np.repeat(np.ldexp(1.0, by - 127), 32, axis=1)
    mag_lo = np.where((v_lo <= 0) & (v_hi >= 0), 0.0, np.minimum(np.abs(v_lo), np.abs(v_hi)))
    mag_hi = np.maximum(np.abs(v_lo), np.abs(v_hi))
    b_lo, b_hi = _ue8m0_range(mag_lo.reshape(M, G, 32).max(axis=2), mag_hi.reshape(M, G, 32).max(axis=2), rule)
    b_lo, b_hi = np.repeat(b_lo, 32, axis=1), np.repeat(b_hi, 32, axis=1)
    dev = np.zeros((M, I))
    for d in range(9):  # every possible scale byte (a wider range takes the bound below)
        b = b_lo + d
        at = b <= b_hi
        if not np.any(at):
            break
        with np.errstate(over="ignore", invalid="ignore"):
            sc = np.ldexp(1.0, b - 127)
            for v in (v_lo, v_hi):
                q = _rn(np.ldexp(v, 127 - b), fm.E4M3, saturate=True) * sc
                dev = np.where(at, np.maximum(dev, np.abs(q - a)), dev)
    # more than 9 possible scales: |e4m3_sat(x)| <= |x| (1 + 2^-4) + 2^-10 (half the least subnormal)
    wide = b_hi - b_lo > 8
    dev = np.where(wide, np.abs(a) + mag_hi * (1 + 2.0**-4) + np.ldexp(1.0, b_hi - 127 - 10), dev)
    return np.where(bounded & np.isfinite(a) & (b_hi < 255), dev, np.inf)


#: Beyond this a SwiGLU value may be infinite on a correct device (float32's range, 2^-4 margin).
F32_LIMIT = float(np.finfo(np.float32).max) / (1 + 2.0**-4)


def _weights_abs(w: np.ndarray, sf: np.ndarray | None) -> np.ndarray:
    """|W| (E?, N, K) float64 of packed FP4 (int8), e4m3 or bf16 weights with per-32 scales given
    as float32 powers of two, int16 UE8M0 pairs or bytes (None: unscaled bf16)."""
    w = np.asarray(w)
    vals = fm.decode(fm.unpack_fp4(w), fm.E2M1) if w.dtype == np.int8 else w.astype(np.float64)
    if sf is None:
        return np.abs(vals)
    sf = np.asarray(sf)
    if sf.dtype == np.int16:
        scales = fm.ue8m0_decode(fm.unpack_ue8m0_int16(sf))
    elif sf.dtype == np.uint8:
        scales = fm.ue8m0_decode(sf)
    else:
        scales = sf.astype(np.float64)
    return np.abs(vals) * np.repeat(scales, 32, axis=-1)[..., : vals.shape[-1]]


def _slot(dev_w: np.ndarray, l2s: np.ndarray, k2: int, u_st: float, budget: float) -> np.ndarray:
    """A slot's allowance ``max(0, F D - B l2.S)`` (module docstring) from ``D`` = ``dev_w``."""
    g2 = gamma(max(k2, 1), u_st, unbounded=True)
    F = (1 + 2.0**-8) * (1 + g2) * (1 + 2.0**-16)
    B = max(0.0, budget - (1 + 2.0**-8) * g2)
    with np.errstate(invalid="ignore", over="ignore"):
        a = np.maximum(F * dev_w - B * l2s, 0.0)
    return np.where(np.isnan(a), np.inf, a)


def stage_allowance(entry: Mapping[str, Any], golden: Mapping[str, np.ndarray], inputs: Mapping[str, Any],
                    shape: tuple[int, int, int], u_st: float, budget: float) -> np.ndarray:
    """The stage-propagated allowance (R, N, H) float64 of every element of ``y`` (module
    docstring); ``u_st`` the stages' accumulator unit roundoff, ``budget`` = ``2 gamma_n(u_acc)``,
    the part of ``E_hard`` per unit of ``l2.S``."""
    R, N, H = shape
    out = np.zeros(shape)
    d = entry.get("driver") or {}
    clamp = d.get("activation_clamp")
    rule: sw.ScaleRule = "ascend" if entry.get("profile") == "ascend950" else "cuda"
    for r in range(R):
        src = golden.get(f"extra.rank{r}.dispatch.src")
        key = f"extra.rank{r}."
        if src is not None and src.shape[0] and key + "l1.acc" in golden and f"l2.{r}" in inputs:
            l1a = np.asarray(golden[key + "l1.acc"], np.float64)
            dev = activation_deviation(l1a, np.asarray(golden[key + "l1.S"], np.float64),
                                       gamma(H, u_st, unbounded=True),
                                       golden[key + "dispatch.topk_weights"], golden[key + "l2.acts"],
                                       golden.get(key + "l2.acts_sf"), clamp, rule)
            w2 = _weights_abs(inputs[f"l2.{r}"], inputs.get(f"l2_sf.{r}"))
            ends = np.asarray(golden[key + "dispatch.psum"], np.int64)
            l2s = np.asarray(golden[key + "l2.S"], np.float64)
            slot = np.zeros((src.shape[0], H))
            start = 0
            for i, end in enumerate(ends.tolist()):
                if end > start:
                    with np.errstate(invalid="ignore", over="ignore"):
                        part = dev[start:end] @ w2[i].T
                    slot[start:end] = _slot(np.where(np.isnan(part), np.inf, part), l2s[start:end], dev.shape[1],
                                            u_st, budget)
                start = end
            np.add.at(out, (src[:, 0], src[:, 1]), slot)
        acts = golden.get(key + "shared.l2.acts")
        if acts is not None and "shared_l1" in inputs and f"x.{r}" in inputs:
            # the shared experts' L1 accumulator is not stored: float64 from the inputs, its own
            # error (at most gamma_H(2^-53) of S) added to the device's
            x = _weights_abs_signed(inputs[f"x.{r}"], inputs[f"x_sf.{r}"])
            w1 = _weights_abs_signed(inputs["shared_l1"], inputs["shared_l1_sf"])
            k1 = x.shape[1]
            s1 = (np.abs(x) @ np.abs(w1).T) * (1 + 2.0**-40)
            dev = activation_deviation(x @ w1.T, s1, gamma(k1, u_st, unbounded=True) + gamma(k1, 2.0**-53), None,
                                       acts, golden.get(key + "shared.l2.acts_sf"), clamp, rule)
            w2s = _weights_abs(inputs["shared_l2"], inputs["shared_l2_sf"])
            a = np.abs(_weights_abs_signed(acts, golden[key + "shared.l2.acts_sf"]))
            with np.errstate(invalid="ignore", over="ignore"):
                part = dev @ w2s.T
                l2s = (a @ w2s.T) * (1 - 2.0**-40)  # a lower bound of the budget's own S (golden.moe)
            out[r, : part.shape[0]] += _slot(np.where(np.isnan(part), np.inf, part), l2s, dev.shape[1], u_st,
                                             budget)
    return out


def _weights_abs_signed(w: np.ndarray, sf: np.ndarray) -> np.ndarray:
    """Signed values of e4m3 tensors with per-32 UE8M0 scales (int16 pairs, int32 words or bytes)."""
    sf = np.asarray(sf)
    by = (fm.unpack_ue8m0_int16(sf) if sf.dtype == np.int16 else
          fm.unpack_ue8m0_int32(sf) if sf.dtype == np.int32 else sf)
    vals = np.asarray(w).astype(np.float64)
    return vals * np.repeat(fm.ue8m0_decode(by), 32, axis=-1)[..., : vals.shape[-1]]


class MegaRange:
    """The range hook of one Mega MoE case's ``y`` (:data:`.check.RangeHook`) and its
    stage-propagated :meth:`allowance` (module docstring); both computed once per model."""

    def __init__(self, entry: Mapping[str, Any], golden: Mapping[str, np.ndarray], inputs: Mapping[str, Any],
                 shape: tuple[int, int, int]) -> None:
        self.entry, self.golden, self.inputs, self.shape = entry, golden, inputs, shape
        self._reach: dict[tuple[float, float], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._allow: dict[tuple[float, float], np.ndarray] = {}

    @staticmethod
    def _u_st(u_acc: float) -> float:
        return 2.0**-24 if u_acc >= 2.0**-8 else max(u_acc, 2.0**-24)

    def _split(self, flat: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        _, N, H = self.shape
        r, rest = np.divmod(flat, N * H)
        t, c = np.divmod(rest, H)
        return r, t, c

    def __call__(self, flat: np.ndarray, u_acc: float, n: int, acc_max: float) -> Any:
        u_st = self._u_st(u_acc)
        if (u_st, acc_max) not in self._reach:
            self._reach[u_st, acc_max] = _reach(self.golden, self.inputs, self.shape, u_st, acc_max)
        every, plus, minus = self._reach[u_st, acc_max]
        r, t, c = self._split(flat)
        e = every[r, t]
        return e | plus[r, t, c], e | minus[r, t, c], e

    def allowance(self, flat: np.ndarray, u_acc: float, n: int) -> np.ndarray:
        """The stage-propagated allowance (float64, accumulator units) at the flat indices of ``y``,
        beyond ``E_hard = gamma_n(u_acc) S_hard`` (module docstring)."""
        key = (self._u_st(u_acc), 2 * gamma(max(n, 1), u_acc, unbounded=True))
        if key not in self._allow:
            self._allow[key] = stage_allowance(self.entry, self.golden, self.inputs, self.shape, *key)
        r, t, c = self._split(flat)
        return self._allow[key][r, t, c]


def mega_range(entry: Mapping[str, Any], golden: Mapping[str, np.ndarray], inputs: Mapping[str, Any],
               name: str) -> Any:
    """The range hook (:data:`.check.RangeHook`) of a Mega MoE case's ``y`` (module docstring)."""
    if name != "y" or "y" not in golden or np.asarray(golden["y"]).ndim != 3:
        return None
    R, N, H = (int(s) for s in np.asarray(golden["y"]).shape)
    return MegaRange(entry, golden, inputs, (R, N, H))
