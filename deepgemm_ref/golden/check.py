"""The checker: does a device's output agree with the golden value, element by element?

For an output element with exact accumulator ``y`` and error scale ``S = sum |a_i b_i| * scales``
(docs/numerics.md), a device that accumulates in a ``u_acc`` precision along a path of ``n``
roundings lands within

    E      = lambda * sqrt(n) * u_acc * S + u_acc * (|c| + |y|) * c_epi     (probabilistic bound)
    E_hard = gamma_n(u_acc) * S          + u_acc * (|c| + |y|) * c_epi     (deterministic bound)

of ``y`` (Higham 3.1; Higham & Mary 2019, which holds for unbiased rounding, not for truncating
accumulators).  The kernel's epilogue ``f`` (rounding to the output dtype, ``c``, ``alpha``) is
monotone, so a correct device output lies in ``[f(y - E), f(y + E)]``: the interval test.
Elements inside the ``E`` interval pass; inside the ``E_hard`` interval but outside ``E`` they
*warn*; outside ``E_hard`` they fail.  The defaults bound a float32 accumulator in any order; a
narrower one (a Hopper-like 13-bit truncating accumulator) needs its own ``u_acc`` (see
docs/numerics.md, "What these defaults do and do not promise").
NaN and +-inf must match the golden value by class and position; elements the kernel's contract
leaves undefined (``golden.defined`` False) are not checked.

Defaults: ``lambda = 8``, ``u_acc = 2^-24`` (float32 accumulation), ``n`` from the manifest
(the reduction length K, the longest rounding path of an unknown accumulation order).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import core
from .. import formats as fm
from ..errors import DGArgumentError
from ..exact import gamma
from ..testing.numeric import ulp_distance
from ..toolkit.operands import OUT_FORMAT
from . import bias as bias_mod
from .bundle import Bundle, BundleError, load_bundle
from .call import entry_family
from .progress import as_progress
from .replay import read_replay_record
from .text import class_mismatches, count, failing

__all__ = ["CheckOptions", "CaseReport", "DEFAULT_OPTIONS", "describe_options", "options_differ", "apply_bias",
           "apply_model_null", "check_case", "format_report", "ULP_BINS", "load_outputs", "check_outputs",
           "check", "strict_json_value", "reports_json", "output_golden", "element_bounds", "CheckView",
           "family_view", "family_range", "overflow_reach", "RangeHook", "F32_MAX"]

ULP_BINS = (0, 1, 2, 4, 8, 16, 64, 256, 1024)  # histogram bin lower edges (last: >= 1024)


@dataclass
class CheckOptions:
    """lam: lambda of the probabilistic bound; u_acc: accumulator unit roundoff (None: the case's,
    default 2^-24; cases whose device accumulates in bf16, e.g. DeepGEMM-Ascend's MQA head chain,
    record 2^-8); n: rounding-path length (None: the manifest's); worst: how many worst elements
    to report; acc_max: the accumulator's largest finite value (None: the case's ``acc_max``,
    default float32's), which decides the NaN / infinity class mismatches its range allows.
    accumulation: the accumulator model the device is checked against (None: float32
    in any order; ``"limited(13, 128)"``, docs/numerics.md): its ``2^-bits`` is the bound's
    ``u_acc`` unless ``u_acc`` is given, and it is the bias test's null; a ``u_acc`` above
    2^-24 without a model means ``limited(ceil(-log2 u_acc), 128)`` for the bias test.
    bias_test: run the systematic-error test (:mod:`.bias`); bias_threshold: log10 p below which
    an output fails it; bias_margin: the margin of its null share."""


    lam: float = 8.0
    u_acc: float | None = None
    n: int | None = None
    worst: int = 10
    acc_max: float | None = None
    accumulation: str | None = None
    bias_test: bool = True
    bias_threshold: float = bias_mod.DEFAULT_THRESHOLD
    bias_margin: float = bias_mod.DEFAULT_MARGIN

    def __post_init__(self) -> None:
        if not (isinstance(self.lam, (int, float)) and math.isfinite(self.lam) and self.lam > 0):
            raise DGArgumentError(f"check: lambda: expected a finite number > 0; got {self.lam!r}")
        if self.u_acc is not None and not (
                isinstance(self.u_acc, (int, float)) and math.isfinite(self.u_acc) and 0 < self.u_acc < 1):
            raise DGArgumentError(f"check: u_acc: expected a unit roundoff in (0, 1); got {self.u_acc!r}")
        if self.n is not None and not (isinstance(self.n, int) and self.n >= 1):
            raise DGArgumentError(f"check: n: expected a rounding-path length >= 1; got {self.n!r}")
        if not (isinstance(self.worst, int) and self.worst >= 0):
            raise DGArgumentError(f"check: worst: expected a count >= 0; got {self.worst!r}")
        if self.acc_max is not None and not (
                isinstance(self.acc_max, (int, float)) and math.isfinite(self.acc_max) and self.acc_max > 0):
            raise DGArgumentError(f"check: acc_max: expected a finite number > 0; got {self.acc_max!r}")
        if not (isinstance(self.bias_threshold, (int, float)) and math.isfinite(self.bias_threshold)
                and self.bias_threshold < 0):
            raise DGArgumentError(f"check: bias_threshold: expected a log10 p-value < 0 (e.g. -12); got "
                                  f"{self.bias_threshold!r}")
        if not (isinstance(self.bias_margin, (int, float)) and 0 <= self.bias_margin < 0.5):
            raise DGArgumentError(f"check: bias_margin: expected a share in [0, 0.5); got {self.bias_margin!r}")
        if self.accumulation is not None:
            from ..config import Limited, parse_accumulation

            try:
                model = parse_accumulation(self.accumulation)
            except DGArgumentError as e:
                raise DGArgumentError(f"check: accumulation: {e}") from None
            if model == "exact":
                raise DGArgumentError("check: accumulation: expected 'fp32' or limited(bits, interval) (the "
                                      "device's accumulator); got 'exact'")
            self.accumulation = str(model)
            if isinstance(model, Limited) and self.u_acc is None:
                self.u_acc = 2.0 ** -model.mantissa_bits

    def model(self) -> str:
        """The accumulator model the bias test's null runs (``fp32`` by default)."""
        if self.accumulation is not None:
            return self.accumulation
        if self.u_acc is not None and self.u_acc > 2.0**-24:
            return f"limited({min(52, max(1, math.ceil(-math.log2(self.u_acc))))}, 128)"
        return "fp32"

    def summary(self) -> dict[str, Any]:
        """The options as every report records them (``--lambda``, ``--u-acc``, the model, the
        bias test and its threshold)."""
        return {"lambda": self.lam, "u_acc": self.u_acc, "n": self.n, "acc_max": self.acc_max,
                "accumulation": self.model(),
                "bias_test": self.bias_test, "bias_threshold": self.bias_threshold, "bias_margin": self.bias_margin}


#: :meth:`CheckOptions.summary` of the default options.
DEFAULT_OPTIONS = {"lambda": 8.0, "u_acc": None, "n": None, "acc_max": None, "accumulation": "fp32", "bias_test": True,
                   "bias_threshold": bias_mod.DEFAULT_THRESHOLD, "bias_margin": bias_mod.DEFAULT_MARGIN}


@dataclass
class CaseReport:
    id: str
    status: str  # "pass", "warn", "fail"
    checked: int = 0
    passed: int = 0
    warned: int = 0
    failed: int = 0
    special_mismatches: int = 0
    range_allowed: int = 0  # NaN / infinity class mismatches a correct accumulator's range allows (not failures)
    stage_warned: int = 0  # warnings only within a multi-stage family's stage-propagated bound (of ``warned``)
    undefined: int = 0
    max_normalised_error: float = 0.0
    calc_diff: float | None = None
    ulp_histogram: dict[str, int] = field(default_factory=dict)
    worst: list[dict[str, Any]] = field(default_factory=list)
    bound: dict[str, Any] = field(default_factory=dict)
    tiles: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # why the case could not be checked (missing, replay failed, no such case)
    dtype: str = ""  # the output's dtype (numpy name)
    lead: str | None = None  # what the leading axis of a 3-D output indexes: "group", "rank", "batch"
    bias: dict[str, Any] | None = None  # the systematic-error test (bias.BiasResult.to_json), interval outputs
    options: dict[str, Any] = field(default_factory=dict)  # CheckOptions.summary() of the check
    # a threshold table's verdict (check --thresholds; compare_table.threshold_verdict), its "text" for reports
    thresholds: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        """The report as strict JSON values (non-finite numbers as strings, see
        :func:`strict_json_value`); ``thresholds`` only when a threshold table was applied."""
        d = dict(self.__dict__)
        if d["thresholds"] is None:
            del d["thresholds"]
        return strict_json_value(d)


def strict_json_value(x: Any) -> Any:
    """``x`` with every NaN / infinity replaced by the string ``"NaN"``, ``"Infinity"`` or
    ``"-Infinity"`` (strict JSON has no such numbers) and NumPy scalars by Python ones."""
    if isinstance(x, (float, np.floating)):
        v = float(x)
        if math.isfinite(v):
            return v
        return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.bool_):
        return bool(x)
    if isinstance(x, Mapping):
        return {str(k): strict_json_value(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [strict_json_value(v) for v in x]
    return x


def reports_json(reports: list[CaseReport]) -> str:
    """The reports as strict JSON text (``json.dumps(..., allow_nan=False)`` holds)."""
    import json

    return json.dumps([r.to_json() for r in reports], indent=1, allow_nan=False)


def _ulp_out(y: np.ndarray, fmt: fm.Format) -> np.ndarray:
    """Spacing of ``fmt`` at |y| (its subnormal spacing near zero)."""
    _, e = np.frexp(np.where(np.isfinite(y), y, 0.0))  # |y| in [2^(e-1), 2^e)
    return np.ldexp(1.0, np.maximum(e - 1, fmt.min_exponent) - fmt.mantissa_bits)


def _histogram(d: np.ndarray) -> dict[str, int]:
    """Counts of ULP distances in the bins of ULP_BINS (0, 1, 2-3, 4-7, ..., >= 1024)."""
    out: dict[str, int] = {}
    for i, lo in enumerate(ULP_BINS):
        if i + 1 == len(ULP_BINS):
            label, sel = f">={lo}", d >= lo
        else:
            hi = ULP_BINS[i + 1]
            label = f"{lo}" if hi == lo + 1 else f"{lo}-{hi - 1}"
            sel = (d >= lo) & (d < hi)
        out[label] = int(np.count_nonzero(sel))
    return out


#: The histogram's bins of the checked elements where the device or the golden value is NaN or
#: infinite (the ULP bins count the elements where both are finite): matched (the same class:
#: NaN for NaN, the same infinity) or mismatched (a NaN on either side, else an infinity).
NON_FINITE_BINS = ("NaN matched", "inf matched", "NaN mismatched", "inf mismatched")


def _non_finite_bins(device: Any, golden: np.ndarray, where: np.ndarray) -> dict[str, int]:
    """Counts of the :data:`NON_FINITE_BINS` among the elements ``where`` (bool, golden's shape)
    selects; every such element is in exactly one bin."""
    if not np.any(where):
        return {}
    d = np.asarray(device).reshape(golden.shape)[where].astype(np.float32)
    g = np.asarray(golden)[where].astype(np.float32)
    d_nan, g_nan = np.isnan(d), np.isnan(g)
    nan_ok = d_nan & g_nan
    inf_ok = np.isinf(d) & np.isinf(g) & (d == g)
    bad = ~(nan_ok | inf_ok)
    nan_bad = bad & (d_nan | g_nan)
    return {"NaN matched": int(np.count_nonzero(nan_ok)), "inf matched": int(np.count_nonzero(inf_ok)),
            "NaN mismatched": int(np.count_nonzero(nan_bad)), "inf mismatched": int(np.count_nonzero(bad & ~nan_bad))}


def _interval_codes(
    ep: core.OutputStage, y: np.ndarray, y_lo: np.ndarray | None, E: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Output values of the epilogue at the two ends of [y - E, y + E] (float64, lo <= hi)."""
    yy = y if y_lo is None else y + y_lo
    with np.errstate(invalid="ignore", over="ignore"):  # ends past the output range round to inf
        lo = np.nextafter(yy - E, -np.inf)
        hi = np.nextafter(yy + E, np.inf)
        lead = lo.shape[0] if lo.ndim else 1
        v_lo = fm.decode(ep.apply(lo, 0, lead), ep.out)
        v_hi = fm.decode(ep.apply(hi, 0, lead), ep.out)
    return np.minimum(v_lo, v_hi), np.maximum(v_lo, v_hi)


def error_bounds(S: np.ndarray, S_hard: np.ndarray | None, y: np.ndarray, c_abs: Any, check: Mapping[str, Any],
                 options: CheckOptions, n: int, u_acc: float) -> tuple[np.ndarray, np.ndarray]:
    """(E, E_hard) of the module docstring for error scales ``S`` (``S_hard``: the deterministic
    bound's, default ``S``), accumulators ``y`` and ``|c|`` (0 without c); both plus the bottom
    of the accumulator's range, ``n * acc_min / 2`` (:func:`underflow_slack`)."""
    with np.errstate(invalid="ignore", over="ignore"):
        epi = u_acc * (c_abs + np.abs(y)) * float(check.get("c_epi", 0))
    epi = np.where(np.isfinite(epi), epi, 0.0) + underflow_slack(check, n)
    E = options.lam * math.sqrt(max(n, 1)) * u_acc * S + epi
    E_hard = gamma(max(n, 1), u_acc, unbounded=True) * (S if S_hard is None else S_hard) + epi
    return E, E_hard


#: The accumulator's smallest positive (subnormal) value by default (float32's, 2^-149).
F32_MIN = 2.0**-149


def underflow_slack(check: Mapping[str, Any], n: int) -> float:
    """``n * acc_min / 2``: what underflow can add to an accumulation of ``n`` roundings (each
    rounding into the accumulator's subnormal range errs by at most half its smallest value
    ``acc_min``, the case's ``acc_min``, default float32's 2^-149; Higham (2.8)), on top of the
    relative error ``gamma_n(u_acc) S``."""
    return max(n, 1) * float(check.get("acc_min", F32_MIN)) / 2


def special_class(v: np.ndarray) -> np.ndarray:
    """0 for finite values, 1 for NaN, +-2 for +-infinity (float64 input)."""
    return np.where(np.isnan(v), 1, np.where(np.isinf(v), np.sign(v) * 2, 0))


#: The accumulator's largest finite value by default (float32's).
F32_MAX = float(np.finfo(np.float32).max)

#: A family's range hook (:attr:`.cases.Family.range`): for flat indices into one output, the
#: accumulator classes a correct device of the checked model (``u_acc``, ``n``, ``acc_max``) can
#: reach there beyond what the output's own ``S`` and ``acc`` show: bool arrays (``+inf``,
#: ``-inf``, ``NaN``), or None where it adds nothing.  A hook may append two float64 arrays
#: ``(y_alt, E_alt)``: a second accumulator value and its deterministic bound that a correct
#: device may follow where the golden is not finite (NaN ``y_alt``: none), e.g. sm90 MQA's
#: ``fmaxf(NaN, 0) = 0``; a finite device value within ``f(y_alt +- E_alt)`` is then allowed.
RangeHook = Callable[[np.ndarray, float, int, float], "tuple[np.ndarray, ...] | None"]


def overflow_reach(y: np.ndarray, S: np.ndarray, n: int, u_acc: float,
                   acc_max: float) -> tuple[np.ndarray, np.ndarray]:
    """(+overflow reachable, -overflow reachable) of single-stage sums with exact value ``y`` and
    ``S >= sum |terms|`` (float64 arrays), accumulated along a path of ``n`` roundings of unit
    roundoff ``u_acc`` in a format whose largest finite value is ``acc_max``.

    The positive terms sum to ``P = (S + y) / 2`` at most, the negative ones to ``N = (S - y) / 2``;
    any partial sum of any grouping is a subset sum (at most ``P``, at least ``-N``) computed with
    an error of at most ``gamma_n(u_acc) S`` (Higham 3.1), so an accumulator of that range can
    round a partial sum to +inf only if ``P + gamma_n S >= acc_max`` (and to -inf likewise with
    ``N``).  Comparing with ``acc_max`` rather than the rounding threshold ``acc_max + ulp / 2``
    errs toward allowing.  Non-finite ``y`` or ``S`` reach nothing here (their classes come from
    non-finite terms; see docs/numerics.md)."""
    g = gamma(max(n, 1), u_acc, unbounded=True)
    with np.errstate(invalid="ignore", over="ignore"):
        fin = np.isfinite(y) & np.isfinite(S)
        yy, ss = np.where(fin, y, 0.0), np.where(fin, S, 0.0)
        slack = g * ss
        up = fin & ((ss + yy) / 2 + slack >= acc_max)
        dn = fin & ((ss - yy) / 2 + slack >= acc_max)
    return up, dn


def _range_allowed(blk: Mapping[str, Any], ep: core.OutputStage, cand: np.ndarray, d_vals: np.ndarray,
                   y: np.ndarray, y_lo: np.ndarray | None, S: np.ndarray, S_hard: np.ndarray | None,
                   E_hard: np.ndarray, n: int, u_acc: float, acc_max: float, hook: RangeHook | None,
                   base: int) -> np.ndarray:
    """The NaN / infinity class mismatches (``cand``) that a correct accumulator of range
    ``acc_max`` can produce (see :func:`overflow_reach` and docs/numerics.md, "The accumulator's
    range"): bool mask of the block."""
    allowed = np.zeros(cand.shape, bool)
    idx = np.nonzero(cand)
    if idx[0].size == 0:
        return allowed
    yv = y[idx]
    Sv = S[idx] if S_hard is None else np.maximum(S[idx], S_hard[idx])
    up, dn = overflow_reach(yv, Sv, n, u_acc, acc_max)
    nan = np.isnan(yv)
    up |= yv == np.inf  # an infinite term: the golden's own class
    dn |= yv == -np.inf
    alt: tuple[np.ndarray, np.ndarray] | None = None
    if hook is not None:
        last = cand.shape[-1]
        more = hook(base + idx[0] * last + idx[1], u_acc, n, acc_max)
        if more is not None:
            up, dn, nan = up | more[0], dn | more[1], nan | more[2]
            if len(more) == 5:
                alt = (np.asarray(more[3], np.float64), np.asarray(more[4], np.float64))
    nan |= up & dn  # inf - inf
    c = blk.get("c")
    sub = core.OutputStage(ep.out, ep.alpha, None if c is None else np.asarray(c)[idx], ep.c_mode)
    y_fin = np.isfinite(yv)
    with np.errstate(invalid="ignore", over="ignore"):
        f_p = fm.decode(sub.apply(np.full(yv.shape, np.inf), 0, yv.size), ep.out)
        f_n = fm.decode(sub.apply(np.full(yv.shape, -np.inf), 0, yv.size), ep.out)
        # a finite accumulator within E_hard of y whose output overflows the output format
        hlo, hhi = _interval_codes(sub, np.where(y_fin, yv, 0.0),
                                   None if y_lo is None else np.where(y_fin, y_lo[idx], 0.0),
                                   np.where(y_fin, E_hard[idx], 0.0))
    dv = d_vals[idx]
    ok = np.isnan(dv) & (nan | (up & np.isnan(f_p)) | (dn & np.isnan(f_n)))
    ok |= (dv == np.inf) & ((up & (f_p == np.inf)) | (dn & (f_n == np.inf)) | (y_fin & (hhi == np.inf)))
    ok |= (dv == -np.inf) & ((up & (f_p == -np.inf)) | (dn & (f_n == -np.inf)) | (y_fin & (hlo == -np.inf)))
    with np.errstate(invalid="ignore"):
        ok |= np.isfinite(dv) & y_fin & (dv >= hlo) & (dv <= hhi)
    if alt is not None:  # the hook's second accumulator value (see RangeHook)
        a_fin = np.isfinite(alt[0]) & np.isfinite(alt[1])
        with np.errstate(invalid="ignore", over="ignore"):
            alo, ahi = _interval_codes(sub, np.where(a_fin, alt[0], 0.0), None, np.where(a_fin, alt[1], 0.0))
            ok |= np.isfinite(dv) & a_fin & (dv >= alo) & (dv <= ahi)
    allowed[idx] = ok
    return allowed


def _stage_allowed(hook: RangeHook | None, ep: core.OutputStage, cand: np.ndarray, d_vals: np.ndarray,
                   y: np.ndarray, y_lo: np.ndarray | None, E_hard: np.ndarray, n: int, u_acc: float,
                   base: int) -> np.ndarray:
    """The finite elements outside ``E_hard`` (``cand``) within ``f(y +- (E_hard + A))``, ``A``
    the hook's stage-propagated allowance (a multi-stage family's ``hook.allowance(flat, u_acc, n)``,
    e.g. Mega MoE's upstream rounding flips, docs/numerics.md): warnings, not passes."""
    allowance = getattr(hook, "allowance", None)
    ok = np.zeros(cand.shape, bool)
    idx = np.nonzero(cand)
    if allowance is None or idx[0].size == 0:
        return ok
    A = np.asarray(allowance(base + idx[0] * cand.shape[-1] + idx[1], u_acc, n), np.float64)
    c = None if ep.c is None else np.asarray(ep.c)[idx]
    lo, hi = _interval_codes(core.OutputStage(ep.out, ep.alpha, c, ep.c_mode), y[idx],
                             None if y_lo is None else y_lo[idx], E_hard[idx] + A)
    dv = d_vals[idx]
    ok[idx] = (A > 0) & (dv >= lo) & (dv <= hi)
    return ok


def _classify(blk: dict[str, Any], fmt: fm.Format | None, interval: bool, ep_desc: Mapping[str, Any],
              check: Mapping[str, Any], options: CheckOptions, n: int, u_acc: float, acc_max: float = F32_MAX,
              hook: RangeHook | None = None,
              base: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                      np.ndarray]:
    """(soft, hard, special_bad, finite, norm, range, staged) for a block of rows (see
    :func:`check_case`); ``special_bad`` holds the failing class mismatches, ``range`` the ones
    the accumulator's range allows, ``staged`` the finite elements inside ``hard`` only through the
    hook's stage-propagated allowance; ``base``: the block's first flat index in the output (for
    ``hook``)."""
    defined = blk["defined"]
    d_vals = blk["device"].astype(np.float64)
    g_vals = blk["gd"].astype(np.float64)
    # specials: NaN / +inf / -inf by class and position
    g_special = ~np.isfinite(g_vals)
    d_special = ~np.isfinite(d_vals)
    special_bad = defined & (g_special | d_special) & (special_class(g_vals) != special_class(d_vals))
    finite = defined & ~g_special & ~d_special
    if not interval:
        # No accumulator to bound: bit-exact comparison of the finite defined values.
        ok = finite & (d_vals == g_vals)
        none = np.zeros(ok.shape, bool)
        return ok, ok, special_bad, finite, np.where(finite & ~ok, np.inf, 0.0), none, none
    assert fmt is not None
    c_arr = blk["c"]
    ep = core.OutputStage(fmt, ep_desc.get("alpha"), c_arr, ep_desc.get("c_mode", "kernel"))
    y = blk["acc"].astype(np.float64)
    y_lo = blk["acc_lo"]
    S = blk["S"].astype(np.float64)
    c_abs = np.abs(c_arr.astype(np.float64)) if c_arr is not None else 0.0
    # A case may record a wider error scale for the deterministic bound (Mega MoE: upstream
    # activation rounding flips, see golden.moe); by default both bounds use S.
    S_hard = blk["S_hard"].astype(np.float64) if blk.get("S_hard") is not None else None
    E, E_hard_all = error_bounds(S, S_hard, y, c_abs, check, options, n, u_acc)
    with np.errstate(invalid="ignore"):
        lo, hi = _interval_codes(ep, y, y_lo, E)
        soft = finite & (d_vals >= lo) & (d_vals <= hi)
        hard = soft.copy()
        outside = np.nonzero(finite & ~soft)
        if outside[0].size:
            sub_ep = core.OutputStage(ep.out, ep.alpha, None if c_arr is None else c_arr[outside], ep.c_mode)
            hlo, hhi = _interval_codes(sub_ep, y[outside], None if y_lo is None else y_lo[outside],
                                       E_hard_all[outside])
            dv = d_vals[outside]
            hard[outside] = (dv >= hlo) & (dv <= hhi)
        staged = _stage_allowed(hook, ep, finite & ~hard, d_vals, y, y_lo, E_hard_all, n, u_acc, base)
        hard |= staged
        # Normalised error: distance to the golden output in units of (E + half an output ulp).
        norm = np.where(finite, np.abs(d_vals - g_vals) / (E * (1 if ep.alpha is None else abs(ep.alpha))
                                                             + _ulp_out(g_vals, fmt) / 2), 0.0)
        norm = np.where(finite & (d_vals == g_vals), 0.0, norm)
    rng = _range_allowed(blk, ep, special_bad, d_vals, y, y_lo, S, S_hard, E_hard_all, n, u_acc, acc_max, hook,
                         base)
    return soft, hard, special_bad & ~rng, finite, norm, rng, staged


@dataclass
class Classification:
    """Element masks of one checked output (shape of the output): ``soft`` inside the
    probabilistic bound, ``hard`` inside the deterministic one, ``special_bad`` a NaN / infinity
    class mismatch, ``finite`` both values finite, ``defined`` checked at all; ``norm`` the
    normalised error; ``bad`` the failing elements."""

    soft: np.ndarray
    hard: np.ndarray
    special_bad: np.ndarray
    finite: np.ndarray
    defined: np.ndarray
    norm: np.ndarray
    #: class mismatches the accumulator's range allows (neither passes nor failures)
    range_ok: np.ndarray | None = None

    @property
    def bad(self) -> np.ndarray:
        return self.defined & ((self.finite & ~self.hard) | self.special_bad)


def check_case(case_id: str, device: np.ndarray, golden: Mapping[str, np.ndarray], check: Mapping[str, Any],
               inputs: Mapping[str, Any], options: CheckOptions, *, range_hook: RangeHook | None = None) -> CaseReport:
    """Check one output tensor of one case against its golden tensors.

    device: the device's output (same shape and dtype as ``golden['d']``-like main output).
    golden: ``d`` (or the main output), ``acc``, ``acc_lo``, ``S``, ``defined`` (float64 / bool).
    check:  the manifest's checker parameters (``n``, ``epilogue``, ``c_epi``, ``acc_max``).
    range_hook: the family's :data:`RangeHook` for this output (multi-stage families).
    """
    return classify_output(case_id, device, golden, check, inputs, options, range_hook=range_hook)[0]


def classify_output(case_id: str, device: np.ndarray, golden: Mapping[str, np.ndarray], check: Mapping[str, Any],
                    inputs: Mapping[str, Any], options: CheckOptions, *, masks_only: bool = False,
                    range_hook: RangeHook | None = None) -> tuple[CaseReport, Classification]:
    """:func:`check_case` and the element masks behind its counts (``masks_only``: the counts
    and masks, without the histogram, ``calc_diff``, worst elements and tiles)."""
    gd = golden["main"]
    fmt = OUT_FORMAT.get(gd.dtype)
    defined = golden.get("defined")
    defined = np.ones(gd.shape, bool) if defined is None else defined.astype(bool)
    rep = CaseReport(case_id, "pass", undefined=int(defined.size - np.count_nonzero(defined)))
    rep.checked = int(np.count_nonzero(defined))
    interval = fmt is not None and "acc" in golden and "S" in golden
    ep_desc = check.get("epilogue") or {}
    c_name = ep_desc.get("c")
    c_arr = inputs.get(c_name) if (c_name and interval) else None
    n = int(options.n if options.n is not None else check.get("n", 1))
    u_acc = float(options.u_acc if options.u_acc is not None else check.get("u_acc", 2.0**-24))
    acc_max = float(options.acc_max if options.acc_max is not None else check.get("acc_max", F32_MAX))
    # Element-wise classification in blocks of rows (bounded temporaries on large outputs).
    last = gd.shape[-1] if gd.ndim else 1

    def rows2(x: Any) -> Any:
        return None if x is None else np.asarray(x).reshape(-1, last)

    fields = {"device": rows2(device), "gd": rows2(gd), "defined": rows2(defined)}
    if interval:
        fields.update(acc=rows2(golden["acc"]), acc_lo=rows2(golden.get("acc_lo")), S=rows2(golden["S"]),
                      S_hard=rows2(golden.get("S_hard")), c=rows2(c_arr))
    total_rows = fields["gd"].shape[0]
    soft = np.zeros((total_rows, last), bool)
    hard = np.zeros((total_rows, last), bool)
    special_bad = np.zeros((total_rows, last), bool)
    finite = np.zeros((total_rows, last), bool)
    norm = np.zeros((total_rows, last))
    rng = np.zeros((total_rows, last), bool)
    staged = np.zeros((total_rows, last), bool)
    step = max(1, (1 << 19) // max(last, 1))
    floating = gd.dtype.kind not in "iub" and not masks_only  # integer outputs are compared bitwise only
    hist: dict[str, int] = {}
    sxy = sxx = 0.0
    directions: dict[str, int] = {}  # the bias test's error directions (finite, differing elements)
    for r0 in range(0, total_rows, step):
        blk = {k: (None if v is None else v[r0:r0 + step]) for k, v in fields.items()}
        out = _classify(blk, fmt, interval, ep_desc, check, options, n, u_acc, acc_max, range_hook, r0 * last)
        for arr, val in zip((soft, hard, special_bad, finite, norm, rng, staged), out, strict=True):
            arr[r0:r0 + step] = val
        both = out[3]
        if floating and np.any(both):
            dv, gv = np.asarray(blk["device"])[both], np.asarray(blk["gd"])[both]
            for label, cnt in _histogram(ulp_distance(dv, gv)).items():
                hist[label] = hist.get(label, 0) + cnt
            d64, g64 = dv.astype(np.float64), gv.astype(np.float64)
            sxy += float(np.dot(d64, g64))
            sxx += float(np.dot(d64, d64) + np.dot(g64, g64))
            if interval and options.bias_test:
                bias_mod.add_counts(directions, bias_mod.direction_counts(d64, g64))
    soft, hard, special_bad, finite, norm, rng = (x.reshape(gd.shape)
                                                  for x in (soft, hard, special_bad, finite, norm, rng))
    rep.special_mismatches = int(np.count_nonzero(special_bad))
    rep.range_allowed = int(np.count_nonzero(rng))
    rep.stage_warned = int(np.count_nonzero(staged))
    if interval:
        rep.bound = {"mode": "interval", "lambda": options.lam, "u_acc": u_acc, "n": n,
                     "c_epi": check.get("c_epi", 0), "S_hard": golden.get("S_hard") is not None,
                     "acc_max": acc_max}
    else:
        rep.bound = {"mode": "bitwise"}
    # Non-finite values of the same class and position as the golden ones (NaN for NaN, -inf
    # for -inf) pass; so every checked element is passed, warned, failed or allowed by the range.
    special_ok = defined & ~finite & ~special_bad & ~rng
    rep.passed = int(np.count_nonzero(soft)) + int(np.count_nonzero(special_ok))
    rep.warned = int(np.count_nonzero(hard & ~soft))
    rep.failed = int(np.count_nonzero(finite & ~hard)) + rep.special_mismatches
    rep.max_normalised_error = float(norm[defined].max()) if np.any(defined) else 0.0
    if rep.failed:
        rep.status = "fail"
    elif rep.warned:
        rep.status = "warn"
    if floating:
        hist.update(_non_finite_bins(device, gd, defined & ~finite))
    if hist:
        rep.ulp_histogram = hist
        # DeepGEMM's calc_diff, 1 - 2 sum(x y) / sum(x^2 + y^2), from the blocks' float64 sums
        rep.calc_diff = 0.0 if sxx == 0 else float(1 - 2 * sxy / sxx)
    rep.options = options.summary()
    if interval and options.bias_test and not masks_only:
        apply_bias(rep, bias_mod.sign_test(directions, threshold=options.bias_threshold, margin=options.bias_margin,
                                           model=options.model()))
    bad = defined & ((finite & ~hard) | special_bad)
    if masks_only:
        return rep, Classification(soft, hard, special_bad, finite, defined, norm, rng)
    rep.worst = _worst_elements(device, gd, defined, soft, bad, special_bad, norm, options.worst,
                                _ElementBounds(fields, fmt, ep_desc, check, options, n, u_acc) if interval else None,
                                rng)
    # per 128x128 tile: worst normalised error and failure counts (for reports and heatmaps)
    if gd.ndim >= 2:
        rep.tiles = _tile_summary(np.where(defined, norm, 0.0), bad, special_bad, defined)
    return rep, Classification(soft, hard, special_bad, finite, defined, norm, rng)


def apply_bias(rep: CaseReport, result: bias_mod.BiasResult) -> None:
    """Record a bias test's ``result`` on ``rep``: a failed test fails the output whatever its
    elements' verdict (kept as ``rep.bias["element_status"]``)."""
    element_status = rep.bias["element_status"] if rep.bias else rep.status
    rep.bias = {**result.to_json(), "element_status": element_status}
    rep.status = "fail" if result.failed else element_status


def apply_model_null(outputs: list[tuple[str, CaseReport, Mapping[str, np.ndarray]]],
                     run_model: Callable[[], Mapping[str, np.ndarray]] | None, options: CheckOptions) -> None:
    """The bias test's second stage (:mod:`.bias`): for each ``(name, report, golden)`` whose
    errors lean past the unbiased null, run the accumulator model once (``run_model``: its
    outputs by name, in the checker's view; None where no call can be rebuilt) and test the
    device's lean against the model's own lean on the same inputs."""
    pending = [(name, rep, g) for name, rep, g in outputs
               if rep.bias is not None and rep.bias["failed"] and rep.bias["null"] == "unbiased"]
    if not pending:
        return
    model = options.model()
    outs: Mapping[str, np.ndarray] | None = None
    why = "no kernel call to rebuild"
    if run_model is not None:
        try:
            outs = run_model()
        except Exception as e:  # a family the model cannot run: say so, keep the unbiased null
            why = f"{type(e).__name__}: {e}"
    for name, rep, g in pending:
        assert rep.bias is not None
        counts = rep.bias["counts"]
        if outs is None or name not in outs:
            note = f"the {model} model could not be run for this case ({why}); the unbiased null stands"
            apply_bias(rep, bias_mod.sign_test(counts, threshold=options.bias_threshold, margin=options.bias_margin,
                                               model=model, note=note))
            continue
        gd = np.asarray(g["main"])
        m = np.asarray(outs[name]).astype(np.float64)
        gv = gd.astype(np.float64)
        defined = g.get("defined")
        sel = np.isfinite(m) & np.isfinite(gv) & (True if defined is None else np.asarray(defined, bool))
        apply_bias(rep, bias_mod.sign_test(counts, threshold=options.bias_threshold, margin=options.bias_margin,
                                           model=model, model_counts=bias_mod.direction_counts(m[sel], gv[sel])))


class _ElementBounds:
    """The soft and hard intervals of single elements (the worst-elements table's thresholds)."""

    def __init__(self, fields: dict[str, Any], fmt: fm.Format | None, ep_desc: Mapping[str, Any],
                 check: Mapping[str, Any], options: CheckOptions, n: int, u_acc: float) -> None:
        self.fields, self.fmt, self.ep_desc, self.check = fields, fmt, ep_desc, check
        self.options, self.n, self.u_acc = options, n, u_acc

    def intervals(self, flat: np.ndarray) -> tuple[np.ndarray, ...]:
        """(soft lo, soft hi, hard lo, hard hi, unit) at the flat element indices: the interval
        ends as output values and the normalised error's unit ``E |alpha| + ulp / 2``."""
        assert self.fmt is not None
        f = self.fields
        last = f["gd"].shape[-1]
        rows, cols = np.divmod(flat, last)

        def at(name: str) -> np.ndarray | None:
            v = f.get(name)
            return None if v is None else np.asarray(v)[rows, cols]

        y = np.asarray(at("acc"), np.float64)
        S = np.asarray(at("S"), np.float64)
        S_hard = at("S_hard")
        c = at("c")
        c_abs = np.abs(c.astype(np.float64)) if c is not None else 0.0
        E, E_hard = error_bounds(S, None if S_hard is None else S_hard.astype(np.float64), y, c_abs, self.check,
                                 self.options, self.n, self.u_acc)
        ep = core.OutputStage(self.fmt, self.ep_desc.get("alpha"), c, self.ep_desc.get("c_mode", "kernel"))
        y_lo = at("acc_lo")
        lo, hi = _interval_codes(ep, y, y_lo, E)
        hlo, hhi = _interval_codes(ep, y, y_lo, E_hard)
        g = np.asarray(at("gd"), np.float64)
        with np.errstate(invalid="ignore"):  # an infinite bound times 0 (NaN) is not a checked unit
            unit = E * (1 if ep.alpha is None else abs(ep.alpha)) + _ulp_out(g, self.fmt) / 2
        return lo, hi, hlo, hhi, unit


def _worst_elements(device: np.ndarray, gd: np.ndarray, defined: np.ndarray, soft: np.ndarray, bad: np.ndarray,
                    special_bad: np.ndarray, norm: np.ndarray, count: int,
                    bounds: _ElementBounds | None, rng: np.ndarray | None = None) -> list[dict[str, Any]]:
    """The ``count`` worst elements, failures first, then warnings, then passes, each by
    normalised error; each with the normalised errors at which it would warn and fail (its own
    thresholds: the distances to the ends of its soft and hard intervals, in the same units).
    Class mismatches the accumulator's range allows (``rng``) rank with the warnings, status
    ``"range"``."""
    if count == 0 or not np.any(defined):
        return []
    rng = np.zeros(defined.shape, bool) if rng is None else rng
    rank = np.where(bad, 2, np.where(soft | ~defined, 0, 1)).ravel()  # 2 fail, 1 warn or range, 0 pass
    key = np.where(defined, np.where(special_bad | rng, np.inf, norm), -1.0).ravel()
    interesting = np.flatnonzero(defined.ravel() & ((rank > 0) | (key > 0)))
    if interesting.size == 0:
        return []
    # failures first: a fail outranks any warning, a warning any pass
    score = rank[interesting] * 4.0 + np.arctan(key[interesting])
    top = min(count, interesting.size)
    cand = interesting[np.argpartition(-score, top - 1)[:top]]
    order = cand[np.lexsort((cand, -key[cand], -rank[cand]))]
    out: list[dict[str, Any]] = []
    d_all, g_all = device.ravel().astype(np.float64), gd.ravel().astype(np.float64)
    ends = bounds.intervals(order) if bounds is not None else None
    for i, flat in enumerate(order):
        idx = np.unravel_index(int(flat), gd.shape)
        d, g = float(d_all[flat]), float(g_all[flat])
        w: dict[str, Any] = {
            "index": [int(j) for j in idx],
            "tile_128x128": [int(idx[-2]) // 128, int(idx[-1]) // 128] if len(idx) >= 2 else [int(idx[0]) // 128],
            "group": int(idx[0]) if len(idx) == 3 else None,
            "device": d,
            "golden": g,
            "normalised_error": float(key[flat]),
            "status": "range" if rng.ravel()[flat] else ("pass", "warn", "fail")[int(rank[flat])],
        }
        if special_bad.ravel()[flat]:
            w["warn_above"] = w["fail_above"] = 0.0
            w["note"] = "NaN / infinity class mismatch"
        elif rng.ravel()[flat]:
            w["note"] = "range: accumulator overflow allowed"
        elif ends is None:  # bitwise: any difference fails
            w["warn_above"] = w["fail_above"] = 0.0
            w["warn_error"] = w["allowed_error"] = 0.0
        else:
            lo, hi, hlo, hhi, unit = (float(e[i]) for e in ends)
            up = d >= g
            allowed_soft = (hi - g) if up else (g - lo)
            allowed_hard = (hhi - g) if up else (g - hlo)
            w["warn_above"] = max(allowed_soft, 0.0) / unit
            w["fail_above"] = max(allowed_hard, 0.0) / unit
            w["warn_error"] = max(allowed_soft, 0.0)
            w["allowed_error"] = max(allowed_hard, 0.0)
        w["error"] = abs(d - g) if math.isfinite(d) and math.isfinite(g) else math.inf
        out.append(w)
    return out


#: Tile edge of the per-tile summaries (DeepGEMM's usual BLOCK_M and BLOCK_N).
TILE = 128


def _tile_summary(norm: np.ndarray, bad: np.ndarray, special_bad: np.ndarray,
                  defined: np.ndarray | None = None) -> dict[str, Any]:
    """Per 128x128 tile of the last two axes (per index of the leading axes): the worst
    normalised error, the failing, special-mismatch and checked element counts."""
    lead = int(np.prod(norm.shape[:-2])) if norm.ndim > 2 else 1
    r, c = norm.shape[-2:]
    tr, tc = -(-r // TILE), -(-c // TILE)
    pad = ((0, 0), (0, tr * TILE - r), (0, tc * TILE - c))

    def tiles(x: np.ndarray, how: str) -> np.ndarray:
        t = np.pad(x.reshape(lead, r, c), pad).reshape(lead, tr, TILE, tc, TILE)
        return t.max(axis=(2, 4)) if how == "max" else t.sum(axis=(2, 4))

    worst = tiles(norm, "max")
    fails = tiles(bad, "sum")
    out = {"shape": [lead, tr, tc], "worst": worst.tolist(), "failed": fails.tolist(),
           "special": tiles(special_bad, "sum").tolist(), "failing_tiles": int(np.count_nonzero(fails)),
           "tile": [TILE, TILE], "rows": r, "cols": c}
    if defined is not None:
        out["checked"] = tiles(defined, "sum").tolist()
    return out


def format_power(x: float) -> str:
    """``2^-24`` for an exact power of two, else a short float."""
    if x > 0:
        m, e = math.frexp(x)
        if m == 0.5:
            return f"2^{e - 1}"
    return f"{x:.3g}"


def describe_bound(bound: Mapping[str, Any]) -> str:
    """A report's bound as numbers with the name of their formula (module docstring)."""
    if bound.get("mode") != "interval":
        return "bitwise: every checked element must equal the golden value (integer or unbounded output)"
    text = (f"E = lambda*sqrt(n)*u_acc*S with lambda {format(bound['lambda'], 'g')}, n {bound['n']}, "
            f"u_acc {format_power(float(bound['u_acc']))}; warn beyond E, fail beyond E_hard = gamma_n(u_acc)*"
            + ("S_hard (the case's wider error scale)" if bound.get("S_hard") else "S"))
    if bound.get("c_epi"):
        text += f"; both plus u_acc*(|c| + |y|)*c_epi with c_epi {bound['c_epi']}"
    if "acc_max" in bound:
        text += (f"; NaN / infinity where an accumulator of largest finite value {float(bound['acc_max']):.6g} can "
                 "overflow: range")
    return text


def _num(x: float) -> str:
    return f"{x:.6g}" if math.isfinite(x) else str(x)


def _above(w: Mapping[str, Any], key: str) -> str:
    return f"{w[key]:.3g}" if key in w else "-"


#: What the worst-elements tables' threshold columns mean (the text and HTML reports).
WORST_THRESHOLDS_TEXT = ("|d - golden| is the element's absolute error; it warns above 'warns above' and fails "
                         "above 'fails above', both absolute errors on the device value's side of the golden one "
                         "(0: only the golden value passes); the normalised error |d - golden| / (E + ulp/2) ranks "
                         "the elements")


def _worst_table(worst: list[dict[str, Any]], integer: bool) -> list[str]:
    rows: list[tuple[str, ...]]
    if integer:
        rows = [("index", "device", "golden")]
        rows += [(str(tuple(w["index"])), _num(w["device"]), _num(w["golden"])) for w in worst]
        head = "  differing entries:"
    else:
        rows = [("status", "index", "tile", "device", "golden", "|d - golden|", "warns above", "fails above",
                 "norm. error")]
        for w in worst:
            rows.append((w["status"], str(tuple(w["index"])), str(tuple(w["tile_128x128"])), _num(w["device"]),
                         _num(w["golden"]), _num(w.get("error", math.inf)), _above(w, "warn_error"),
                         _above(w, "allowed_error"),
                         f"{w['normalised_error']:.3g}" + (f"  {w['note']}" if w.get("note") else "")))
        head = ("  worst elements, failures first: " + WORST_THRESHOLDS_TEXT + ":")
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [head] + ["    " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def _tile_line(r: CaseReport) -> str | None:
    t = r.tiles
    if not t or not t.get("failing_tiles"):
        return None
    failed = np.asarray(t["failed"])
    lead, tr, tc = t["shape"]
    where = []
    for idx in zip(*np.nonzero(failed), strict=True):
        g, i, j = (int(v) for v in idx)
        where.append(f"{r.lead or 'index'} {g} ({i}, {j})" if lead > 1 else f"({i}, {j})")
    shown = ", ".join(where[:8]) + (f", ... ({len(where) - 8} more)" if len(where) > 8 else "")
    return f"  {t['tile'][0]}x{t['tile'][1]} tiles with failures: {t['failing_tiles']} of {lead * tr * tc}: {shown}"


def describe_options(options: Mapping[str, Any]) -> str:
    """The checker options a report was made with, as one clause (``--lambda``, ``--u-acc``, the
    model, the bias test and its threshold)."""
    if not options:
        return "options not recorded"
    u = options.get("u_acc")
    parts = [f"lambda {format(float(options['lambda']), 'g')}",
             "u_acc " + ("the case's" if u is None else format_power(float(u))),
             "n " + ("the case's" if options.get("n") is None else str(options["n"])),
             f"model {options.get('accumulation', 'fp32')}"]
    if options.get("bias_test", True):
        parts.append(f"bias test on (threshold log10 p < {format(float(options['bias_threshold']), 'g')}, "
                     f"margin {format(float(options['bias_margin']), 'g')})")
    else:
        parts.append("bias test off (--no-bias-test)")
    return "checker options: " + ", ".join(parts)


def options_differ(options: Mapping[str, Any]) -> bool:
    """Whether a report's options differ from the defaults (a pass under loosened options is
    then said to be one)."""
    return bool(options) and any(options.get(k) != v for k, v in DEFAULT_OPTIONS.items())


def format_report(reports: list[CaseReport], *, quiet: bool = False) -> str:
    """Human-readable report: a line naming the checker options when they differ from the
    defaults, one line per passing output (none with ``quiet``), the detail of each warning or
    failing one (with its bias test), and a summary line."""
    lines = []
    recorded = next((r.options for r in reports if r.options), {})
    if options_differ(recorded):
        lines.append(f"NOTE: not the default checker: {describe_options(recorded)}")
    for r in reports:
        if r.error is not None:
            lines.append(f"{r.id}: {r.status.upper()}  {r.error}")
            continue
        rng = _range_text(r)
        if r.status == "pass":
            if not quiet:
                lines.append(f"{r.id}: PASS  {r.checked} checked{rng}, max normalised error "
                             f"{r.max_normalised_error:.3g}")
            continue
        integer = np.dtype(r.dtype).kind in "iub" if r.dtype else False
        special = f" ({class_mismatches(r.special_mismatches)})" if r.special_mismatches else ""
        if r.status == "warn":  # not a failure: one line
            within = (f"{r.warned} beyond E (consistent with upstream rounding flips): {r.warned - r.stage_warned} "
                      f"within E_hard, {r.stage_warned} beyond E_hard (warn: within the stage-propagated bound)"
                      if r.stage_warned else
                      f"{r.warned} beyond E but within E_hard (consistent with upstream rounding flips)")
            lines.append(f"{r.id}: WARN  {r.checked} checked, {within}{rng}, max normalised error "
                         f"{r.max_normalised_error:.3g}"
                         + ("" if r.bias is None else f"; {bias_mod.describe_bias(r.bias)}"))
            continue
        biased = r.bias is not None and r.bias.get("failed")
        lines.append(f"{r.id}: FAIL  " + ("the errors lean one way (bias test); " if biased else "")
                     + f"{failing(r.failed, r.checked)}{special}, {r.warned} warn{rng}, "
                     f"{r.undefined} undefined (not checked)")
        lines.append(f"  bound: {describe_bound(r.bound)}; {describe_options(r.options)}")
        if r.bias is not None:
            lines.append("  " + bias_mod.describe_bias(r.bias))
        stats = []
        if not integer:
            stats.append(f"max normalised error {r.max_normalised_error:.3g}")
        if r.calc_diff is not None:
            stats.append(f"calc_diff {r.calc_diff:.3g}")
        if stats:
            lines.append("  " + ", ".join(stats))
        if r.ulp_histogram:
            lines.append("  ulp distance to golden: " + ", ".join(f"{k}: {v}" for k, v in r.ulp_histogram.items() if v))
        tile = _tile_line(r)
        if tile and not integer:
            lines.append(tile)
        if r.worst:
            lines += _worst_table(r.worst, integer)
    total = {s: sum(r.status == s for r in reports) for s in ("pass", "warn", "fail")}
    summary = (f"summary: {count(len(reports), 'output')}: {total['pass']} pass, {total['warn']} warn, "
               f"{total['fail']} fail")
    judged = [r.thresholds for r in reports if r.thresholds is not None]
    if judged:  # check --thresholds: the table's verdict beside the bound's
        shown = [f"  {r.id}: {r.thresholds.get('text', r.thresholds['status'])}" for r in reports
                 if r.thresholds is not None and not (quiet and r.thresholds["status"] == "pass")]
        if shown:
            lines += [f"thresholds ({judged[0].get('table', 'threshold table')}), not the bound's verdict:", *shown]
        t_fail = sum(t["status"] == "fail" for t in judged)
        summary += f"; thresholds: {len(judged) - t_fail} pass, {t_fail} fail"
    ranged = sum(r.range_allowed for r in reports)
    if ranged:
        ranged_outputs = sum(r.range_allowed > 0 for r in reports)
        summary += (f"; {count(ranged, 'element')} of {count(ranged_outputs, 'output')} in the range class "
                    "(accumulator overflow allowed)")
    lines.append(summary)
    return "\n".join(lines)


def _range_text(r: CaseReport) -> str:
    """The range class of a report line: ``, 3 range: accumulator overflow allowed`` (or nothing)."""
    return f", {r.range_allowed} range: accumulator overflow allowed" if r.range_allowed else ""


# ----------------------------------------------------------------------------------------------
# checking a bundle against a device's outputs file
# ----------------------------------------------------------------------------------------------

def load_outputs(path: str | os.PathLike[str], *, max_memory: int | None = None) -> dict[str, np.ndarray]:
    """Device outputs: a safetensors file (names ``<case id>/<output>``), a single ``.npy``, or a
    dump directory (an msprobe dump or the npy / bin layout, :func:`.export.load_dump`)."""
    from .export import read_outputs

    return read_outputs(os.fspath(path), max_memory, single_npy=True)


def _failed(case_id: str, why: str) -> CaseReport:
    return CaseReport(case_id, "fail", error=why)


def check_outputs(bundle: Bundle, outputs: dict[str, np.ndarray], options: CheckOptions | None = None,
                  cases: list[str] | None = None, progress: Any = None,
                  errors: Mapping[str, str] | None = None) -> list[CaseReport]:
    """Check device outputs against a loaded bundle; one report per (case, output).

    A case whose outputs are missing, whose replay failed (``errors``: case id -> message, from
    the outputs file), or that the bundle lacks (incomplete) is reported as failed, and so is
    every output name that matches no case of the bundle.  An output of the wrong shape or dtype
    is an outputs-file error (:class:`BundleError`).
    """
    options = options or CheckOptions()
    errors = dict(errors or {})
    if cases is None:
        ids = list(bundle.cases) + list(bundle.incomplete)
    else:
        ids = list(dict.fromkeys(cases))
        unknown = [c for c in ids if c not in bundle.cases and c not in bundle.incomplete]
        if unknown:
            raise BundleError(f"check: --case: no case {', '.join(map(repr, unknown))} in {bundle.root}")
    single = set(outputs) == {""}
    if single and len(ids) != 1:
        raise BundleError("a .npy outputs file can only be checked against a one-case bundle (use --case)")
    reports: list[CaseReport] = []
    prog = as_progress(progress)
    sizes = {i: float(sum(np.prod(o["shape"]) for o in bundle.cases[i]["outputs"].values())) + 1.0
             if i in bundle.cases else 1.0 for i in ids}
    prog.start(len(ids), sum(sizes.values()))
    done_work = 0.0
    try:
        for n, case_id in enumerate(ids, start=1):
            reports += _check_one_case(bundle, case_id, outputs, single, errors, options)
            done_work += sizes[case_id]
            prog.update(n, done_work, case_id)
    finally:
        prog.finish()
    for r in reports:
        r.options = options.summary()
    if not single:
        known = {f"{cid}/{name}" for cid, e in bundle.cases.items() for name in e["outputs"]}
        for key in sorted(set(outputs) - known):
            reports.append(_failed(key, "an output that matches no case of the bundle (another bundle's outputs?)"))
            reports[-1].options = options.summary()
    return reports


def _check_one_case(bundle: Bundle, case_id: str, outputs: Mapping[str, np.ndarray], single: bool,
                    errors: Mapping[str, str], options: CheckOptions) -> list[CaseReport]:
    if case_id not in bundle.cases:
        return [_failed(case_id, "not generated: the bundle is incomplete (golden --resume finishes it)")]
    if case_id in errors:
        return [_failed(case_id, f"replay failed: {errors[case_id]}")]
    entry = bundle.cases[case_id]
    outs = entry["outputs"]
    main = entry.get("main_output") or next(iter(outs))
    names = [main] + [n for n in outs if n != main]

    def label(name: str) -> str:
        return case_id if len(outs) == 1 else f"{case_id}/{name}"

    keys = {name: ("" if single else f"{case_id}/{name}") for name in names}
    missing = [name for name in names if keys[name] not in outputs]
    if len(missing) == len(names):
        return [_failed(case_id, "missing from the outputs (not replayed?)")]
    case = bundle.case(case_id)
    golden = case.golden()
    inputs = case.inputs()
    for name in names:
        key = keys[name]
        if key in outputs:
            dev, want = outputs[key], golden[name]
            if dev.shape != want.shape or dev.dtype != want.dtype:
                file = getattr(outputs, "files", {}).get(key)  # a dump directory's file (export.DumpOutputs)
                raise BundleError(f"outputs: {key!r}{f' ({file})' if file else ''} has shape {dev.shape} and "
                                  f"dtype {dev.dtype}; "
                                  f"expected shape {want.shape} and dtype {want.dtype}")
    view = family_view(entry, golden, {name: outputs[keys[name]] for name in names if keys[name] in outputs})
    reports = []
    checked: list[tuple[str, CaseReport, Mapping[str, np.ndarray]]] = []
    for name in names:
        key = keys[name]
        if key not in outputs:
            reports.append(_failed(label(name), f"output {name!r} missing from the outputs"))
            continue
        want = golden[name]
        hook = family_range(entry, golden, inputs, name)
        if view is None:
            rep = check_case(label(name), outputs[key], output_golden(golden, name, main), entry.get("check", {}),
                             inputs, options, range_hook=hook)
        else:
            rep = check_case(label(name), view.device[name], view.goldens[name], view.checks[name], inputs, options,
                             range_hook=hook)
        rep.dtype = str(want.dtype)
        rep.lead = lead_label(entry) if want.ndim == 3 else None
        reports.append(rep)
        checked.append((name, rep, output_golden(golden, name, main) if view is None else view.goldens[name]))

    def run_model() -> Mapping[str, np.ndarray]:
        from .emulator import emulator
        from .replay import call_case

        outs = call_case(case, emulator(), ours=True, use_torch=False, accumulation=options.model())
        v = family_view(entry, golden, outs)
        return outs if v is None else v.device

    apply_model_null(checked, run_model, options)
    return reports


def output_golden(golden: Mapping[str, np.ndarray], name: str, main: str) -> dict[str, np.ndarray]:
    """The golden tensors :func:`check_case` takes for output ``name`` of a case: the main
    output with ``acc``, ``acc_lo``, ``S``, ``S_hard`` and ``defined``; a second output with its
    own accumulator and error scale (``extra.<name>.acc`` / ``.S``) when the kernel reports them."""
    if name == main:
        sel = ("acc", "acc_lo", "S", "S_hard", "defined")
        return {"main": golden[name], **{k: v for k, v in golden.items() if k in sel}}
    return {"main": golden[name], **{k: golden[f"extra.{name}.{k}"] for k in ("acc", "S")
                                     if f"extra.{name}.{k}" in golden}}


@dataclass
class CheckView:
    """How the checker sees one case's outputs, for a family with its own view (DeepEP):
    ``device`` the outputs as compared (a device's own row order put into the canonical one,
    payloads as bit patterns), ``goldens`` per output the golden tensors :func:`check_case` takes
    (``main``, ``defined``, and ``acc`` / ``S`` / ``S_hard`` where an output is bounded), ``checks``
    per output the checker parameters."""

    device: dict[str, np.ndarray]
    goldens: dict[str, dict[str, np.ndarray]]
    checks: dict[str, dict[str, Any]]


def family_view(entry: Mapping[str, Any], golden: Mapping[str, np.ndarray],
                device: Mapping[str, Any] | None = None) -> CheckView | None:
    """The case family's view of its outputs (None for a family compared output by output
    against ``output_golden``); ``device`` may lack outputs (missing ones are not in the view)."""
    fam = entry_family(entry)
    if fam.view is None:
        return None
    view = fam.view(entry, golden, device)
    assert isinstance(view, CheckView)
    return view


def family_range(entry: Mapping[str, Any], golden: Mapping[str, np.ndarray], inputs: Mapping[str, Any],
                 name: str) -> RangeHook | None:
    """The case family's range hook for output ``name`` (None: the output's own ``S`` and
    ``acc`` decide its range class, as for single-stage sums)."""
    fam = entry_family(entry)
    if fam.range is None:
        return None
    hook = fam.range(entry, golden, inputs, name)
    return hook if callable(hook) else None


def element_bounds(golden: Mapping[str, np.ndarray], check: Mapping[str, Any], inputs: Mapping[str, np.ndarray],
                   options: CheckOptions, index: tuple[int, ...]) -> dict[str, Any] | None:
    """The interval :func:`check_case` allows one element of an output (``golden`` as
    :func:`output_golden` gives it): ``{"pass": (lo, hi), "warn": (lo, hi), "E": ..., "S": ...}``
    as float64 output values, or None where the output is compared bit for bit."""
    gd = golden["main"]
    fmt = OUT_FORMAT.get(gd.dtype)
    if fmt is None or "acc" not in golden or "S" not in golden:
        return None
    ep_desc = check.get("epilogue") or {}
    c_name = ep_desc.get("c")
    c_val = None if not c_name or c_name not in inputs else np.asarray(inputs[c_name])[index].reshape(1)
    n = int(options.n if options.n is not None else check.get("n", 1))
    u_acc = float(options.u_acc if options.u_acc is not None else check.get("u_acc", 2.0**-24))
    ep = core.OutputStage(fmt, ep_desc.get("alpha"), c_val, ep_desc.get("c_mode", "kernel"))
    y = np.asarray(golden["acc"], np.float64)[index].reshape(1)
    y_lo = None if golden.get("acc_lo") is None else np.asarray(golden["acc_lo"], np.float64)[index].reshape(1)
    S = float(np.asarray(golden["S"], np.float64)[index])
    S_hard = float(np.asarray(golden["S_hard"], np.float64)[index]) if golden.get("S_hard") is not None else S
    c_abs = 0.0 if c_val is None else float(np.abs(c_val.astype(np.float64))[0])
    with np.errstate(invalid="ignore", over="ignore"):
        epi = u_acc * (c_abs + abs(float(y[0]))) * float(check.get("c_epi", 0))
        epi = (epi if math.isfinite(epi) else 0.0) + underflow_slack(check, n)
        E = options.lam * math.sqrt(max(n, 1)) * u_acc * S + epi
        E_hard = gamma(max(n, 1), u_acc, unbounded=True) * S_hard + epi
        lo, hi = _interval_codes(ep, y, y_lo, np.array([E]))
        hlo, hhi = _interval_codes(ep, y, y_lo, np.array([E_hard]))
    return {"pass": (float(lo[0]), float(hi[0])), "warn": (float(hlo[0]), float(hhi[0])), "E": E, "E_hard": E_hard,
            "S": S, "acc": float(y[0]) + (0.0 if y_lo is None else float(y_lo[0]))}


def lead_label(entry: Mapping[str, Any]) -> str:
    """What the leading axis of a case's 3-D outputs indexes."""
    kernel = str(entry.get("kernel", ""))
    if "mega_moe" in kernel or kernel.startswith("ep_"):
        return "rank"
    if "grouped" in kernel:
        return "group"
    if "einsum" in kernel:
        return "batch"
    return "index"


def check(bundle_dir: str | os.PathLike[str], outputs_path: str | os.PathLike[str], *,
          options: CheckOptions | None = None, cases: list[str] | None = None, progress: Any = None,
          max_memory: int | None = None) -> list[CaseReport]:
    """``deepgemm-ref check``: load a bundle and a device's outputs, and check every case."""
    bundle = load_bundle(bundle_dir, max_memory=max_memory)
    outputs = load_outputs(outputs_path, max_memory=max_memory)
    errors, _ = read_replay_record(outputs_path) if not os.fspath(outputs_path).endswith(".npy") else ({}, None)
    return check_outputs(bundle, outputs, options, cases, progress, errors)
