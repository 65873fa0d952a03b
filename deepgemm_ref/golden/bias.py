"""The checker's systematic-error (bias) test: do an output's errors lean one way?

An element-wise bound cannot see a device whose errors are each allowed but all point the same
way (a bf16 output rounded toward zero: half of the elements one ulp off, every one toward
zero).  Per interval-checked output, over the elements where device ``d`` and golden ``g`` are
both finite and differ, this module counts the errors' directions:

* ``toward_zero``: ``|d| < |g|``; ``away_from_zero``: ``|d| > |g|`` (a sign flip ``d = -g`` is
  neither);
* ``up``: ``d > g``; ``down``: ``d < g``.

A sign test on each of the four directions: under the null hypothesis an error points in a
given direction with probability at most ``q0``, so with ``k`` of ``N`` errors pointing that
way the p-value is the binomial tail ``P(Bin(N, q0) >= k)``, computed in log space (log-gamma
for the first term, then the terms' ratio; never underflowing) and reported as ``log10 p``.
The four p-values are combined by Bonferroni (the smallest times 4, capped at 1).  The output
fails the test when ``log10 p`` is below the threshold (default :data:`DEFAULT_THRESHOLD`).

The null is the accumulator model being checked (float32 in any order by default; the
``--accumulation`` / ``--u-acc`` model otherwise): a correct device leans at most as far as the
model's own run on the same inputs leans, plus a margin ``m`` (default :data:`DEFAULT_MARGIN`).
With the model's own count ``k_m`` of ``N_m`` in a direction, its lean is bounded above by
``q_m = (k_m + 32) / (N_m + 64) + 3 / (2 sqrt(N_m + 64))`` (the share with 64 pseudo-observations
at 1/2, so that a run with few errors, which shows little lean, cannot make the null vacuous,
plus three standard errors; at least 1/2), and the device's null share is
``q0 = 1 - (1 - q_m)(1 - 2m)``:
the minority direction may shrink to ``1 - 2m`` of the model's minority share and no further.
An unbiased model gives ``q0 = 1/2 + m``; this *unbiased null* is tested first, and the model
is run only when it rejects (its null is never tighter, so a pass there is final).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["DEFAULT_THRESHOLD", "DEFAULT_MARGIN", "DIRECTIONS", "direction_counts", "add_counts",
           "log10_binomial_tail", "null_shares", "sign_test", "BiasResult", "describe_bias", "model_name"]

#: log10 p below which an output fails the bias test (``--bias-threshold``; calibrated in
#: benchmarks/bias_calibration.py, docs/numerics.md "The systematic-error test").
DEFAULT_THRESHOLD = -12.0
#: The margin ``m`` of the null share (module docstring).
DEFAULT_MARGIN = 0.15
#: The four one-sided directions and the direction each is tested against.
DIRECTIONS = {"toward_zero": "away_from_zero", "away_from_zero": "toward_zero", "up": "down", "down": "up"}
_LN10 = math.log(10.0)
_Z = 3.0  # standard errors above the model's observed share
_PRIOR = 64  # pseudo-observations at 1/2 in the model's share (a run with few errors shows little lean)


def direction_counts(d: np.ndarray, g: np.ndarray) -> dict[str, int]:
    """Counts of the error directions of ``d`` against ``g`` (float64 arrays of the elements to
    count: both finite); equal elements are not counted."""
    diff = d != g
    ad, ag = np.abs(d), np.abs(g)
    return {"differing": int(np.count_nonzero(diff)),
            "toward_zero": int(np.count_nonzero(diff & (ad < ag))),
            "away_from_zero": int(np.count_nonzero(diff & (ad > ag))),
            "up": int(np.count_nonzero(d > g)),
            "down": int(np.count_nonzero(d < g))}


def add_counts(total: dict[str, int], more: Mapping[str, int]) -> dict[str, int]:
    """``total`` plus ``more`` (in place; returned)."""
    for k, v in more.items():
        total[k] = total.get(k, 0) + int(v)
    return total


def log10_binomial_tail(k: int, n: int, q: float) -> float:
    """``log10 P(X >= k)`` for ``X ~ Binomial(n, q)``; 0.0 (p = 1, conservatively) when ``k`` is
    not above the mean ``n q``.  Exact up to float rounding: the first term from log-gamma, the
    rest by the terms' ratio in log space; a geometric bound (an upper bound, so the p-value
    is never understated) after 10^6 terms."""
    if n <= 0 or k <= 0 or q >= 1.0 or k <= n * q:
        return 0.0
    if k > n:
        return -math.inf
    if q <= 0.0:
        return -math.inf
    lq, lr = math.log(q), math.log1p(-q)
    log_term = (math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * lq + (n - k) * lr)
    # sum_{j >= k} t_j = t_k * (1 + r_k + r_k r_{k+1} + ...), r_j = (n - j) / (j + 1) * q / (1 - q)
    rel, acc, j = 0.0, 1.0, k
    odds = q / (1.0 - q)
    steps = 0
    while j < n:
        r = (n - j) / (j + 1) * odds
        rel += math.log(r) if r > 0 else -math.inf
        if rel < -40.0:  # the remaining terms add less than e^-40 of the first (they shrink)
            break
        acc += math.exp(rel)
        j += 1
        steps += 1
        if steps >= 1_000_000:  # the rest is below a geometric series of the last ratio
            acc += math.exp(rel) * r / (1.0 - r) if r < 1 else math.inf
            break
    return min(0.0, (log_term + math.log(acc)) / _LN10)


def null_shares(model: Mapping[str, int] | None, margin: float) -> dict[str, float]:
    """The null share ``q0`` of each direction (module docstring): the unbiased null without a
    model run (``model`` None), else from the model's own direction counts."""
    out = {}
    for direction, other in DIRECTIONS.items():
        q_m = 0.5
        if model is not None:
            n_m = int(model.get(direction, 0)) + int(model.get(other, 0)) + _PRIOR
            centre = (int(model.get(direction, 0)) + _PRIOR / 2) / n_m
            q_m = min(1.0, max(0.5, centre + _Z / (2 * math.sqrt(n_m))))
        out[direction] = 1.0 - (1.0 - q_m) * (1.0 - 2.0 * margin)
    return out


@dataclass
class BiasResult:
    """One output's bias test: its direction ``counts``, the ``direction`` it leans furthest,
    ``log10_p`` (Bonferroni over the four directions), the ``null`` ("unbiased" or "model"),
    the null share of the leaning direction, the model's counts where it ran, and ``failed``."""

    counts: dict[str, int]
    direction: str
    log10_p: float
    null: str
    null_share: float
    threshold: float
    margin: float
    model: str
    model_counts: dict[str, int] | None = None
    note: str | None = None

    @property
    def failed(self) -> bool:
        return self.log10_p < self.threshold

    def to_json(self) -> dict[str, Any]:
        return {"counts": dict(self.counts), "direction": self.direction, "log10_p": self.log10_p,
                "null": self.null, "null_share": self.null_share, "threshold": self.threshold,
                "margin": self.margin, "model": self.model, "model_counts": self.model_counts,
                "failed": self.failed, "note": self.note}


def sign_test(counts: Mapping[str, int], *, threshold: float, margin: float, model: str,
              model_counts: Mapping[str, int] | None = None, note: str | None = None) -> BiasResult:
    """The test of the module docstring on an output's direction ``counts`` against the
    unbiased null (``model_counts`` None) or the model's own lean."""
    shares = null_shares(model_counts, margin)
    scored = []
    for direction, other in DIRECTIONS.items():
        k = int(counts.get(direction, 0))
        n = k + int(counts.get(other, 0))
        scored.append((log10_binomial_tail(k, n, shares[direction]), -(k / n if n else 0.0), direction))
    best, _, best_dir = min(scored)
    combined = min(0.0, best + math.log10(len(DIRECTIONS)))
    return BiasResult(dict(counts), best_dir, combined, "unbiased" if model_counts is None else "model",
                      shares[best_dir], threshold, margin, model,
                      None if model_counts is None else dict(model_counts), note)


def model_name(accumulation: Any) -> str:
    """The accumulator model's name as reports print it (``fp32`` by default)."""
    return "fp32" if accumulation is None else str(accumulation)


def _group(n: int) -> str:
    return f"{n:,}"


def describe_bias(b: Mapping[str, Any]) -> str:
    """One line: ``bias: 1,048,311 of 1,048,576 differing elements are toward zero; log10 p =
    -315,000 (...)``."""
    counts = b["counts"]
    direction = str(b["direction"])
    other = DIRECTIONS[direction]
    k = int(counts.get(direction, 0))
    n = k + int(counts.get(other, 0))
    words = direction.replace("_", " ")
    lp = float(b["log10_p"])
    lp_text = f"{lp:,.0f}" if abs(lp) >= 100 else f"{lp:.3g}"
    null = ("the unbiased null" if b["null"] == "unbiased"
            else f"the {b['model']} model's own lean on these inputs")
    model_part = ""
    mc = b.get("model_counts")
    if mc:
        mk = int(mc.get(direction, 0))
        mn = mk + int(mc.get(other, 0))
        model_part = f"; the model's run: {_group(mk)} of {_group(mn)}"
    verdict = "FAILS" if b["failed"] else "passes"
    text = (f"bias: {_group(k)} of {_group(n)} differing elements are {words}; log10 p = {lp_text} against "
            f"{null} (share <= {float(b['null_share']):.3g}, margin {float(b['margin']):g}){model_part}; "
            f"{verdict} the threshold log10 p < {float(b['threshold']):g}")
    if b.get("note"):
        text += f" ({b['note']})"
    return text
