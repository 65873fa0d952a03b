"""The diagnosis engine: a failing case, its candidate explanations, their scores and ranking.

For one failing case, a :class:`CaseContext` holds the bundle's inputs and goldens, the device's
outputs and the checker's classification of them (which elements fail).  Every applicable
catalogue entry proposes :class:`Variant` s: a mutated call (inputs, keyword arguments, the
accumulation model), regenerated through the golden workflow's own call path
(:func:`..call.golden_of_call`, the emulator's exact model under trace capture), or an
output-stage change computed from the stored accumulator and golden (no GEMM).  Each variant
is a candidate golden; it is compared with the device output element by element:

* ``exact``: the device value equals the candidate's (NaN and infinities by class);
* ``bound``: exact, or inside the checker's deterministic bound around the candidate's
  accumulator (``E_hard``, the same test :func:`..check.check_case` applies to the golden).

Scores (:class:`Score`): ``share`` = failing elements reproduced within the bound / failing
elements; ``exact_share`` the same for exact reproduction; ``kept`` = elements that pass the
check and stay within the candidate's bound / elements that pass (a candidate that explains
the failures by breaking what was right is not an explanation).  A variant whose ``evidence`` is
"differing" (the truncated output) takes its shares over every element where the device differs
from the golden, failing or not: at large K a truncated output fails only a handful of elements
(the bound allows one ulp) while every differing element is one ulp toward zero, so the evidence
is all of them, and a case failed by a bias test alone (no failing element) can be explained.
A candidate *explains* the case when ``share * kept >= THRESHOLD`` (0.9).  Candidates are ranked by (explains,
``kept * (share + exact_share) / 2``, the entry's specificity, catalogue order): exact
reproduction outranks reproduction within the bound, and of two candidates that reproduce the
device equally the more specific one (a fixed mutation before one fitted to the device data)
ranks first.

Speed: large dense GEMM cases are screened on a sample of rows and 128-column blocks (the
failing ones, plus a few passing ones), regenerated from sliced inputs; the best candidates are
then recomputed on the whole case (except the narrow-accumulator fit, whose model is slow; its
shares stay sample estimates and say so).  Output-stage candidates reuse the stored accumulator.
"""

from __future__ import annotations

import fnmatch
import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from ... import core
from ... import formats as fm
from ...errors import DGArgumentError
from .. import safetensors as st
from ..bundle import Bundle, CaseData
from ..call import entry_family, golden_of_call
from ..cases import ArgRef, Family
from ..check import (
    CaseReport,
    CheckOptions,
    Classification,
    classify_output,
    family_range,
    family_view,
    output_golden,
)

__all__ = ["THRESHOLD", "Candidate", "Variant", "Score", "Sample", "CaseContext", "Evaluated", "rank_key",
           "SignBias", "sign_bias"]

#: A candidate explains a case when it reproduces this share of the failing elements within the
#: checker's bound (times the share of passing elements it keeps within its own bound).
THRESHOLD = 0.9
#: Outputs with more elements than this are screened on a sample (dense GEMMs).
SAMPLE_ABOVE = 1 << 18
#: Sample size: failing rows, passing rows, failing 128-column blocks, passing column blocks.
SAMPLE_ROWS, SAMPLE_PASS_ROWS, SAMPLE_COL_BLOCKS, SAMPLE_PASS_COL_BLOCKS = 24, 8, 2, 1
#: Candidates recomputed on the whole case after screening on a sample: at most this many, of
#: those explaining at least CONFIRM_ABOVE of the sample.
CONFIRM, CONFIRM_ABOVE = 3, 0.5

_OUT_DTYPE = {"bf16": np.dtype(ml_dtypes.bfloat16), "f32": np.dtype(np.float32)}
_OUT_FMT = {"bf16": fm.BF16, "f32": fm.F32}


@dataclass
class Sample:
    """Rows and columns (of the last two axes of a 2-D main output) a case is screened on."""

    rows: np.ndarray
    cols: np.ndarray

    def take(self, x: np.ndarray) -> np.ndarray:
        return x[np.ix_(self.rows, self.cols)]

    def describe(self) -> str:
        return f"{self.rows.size} rows x {self.cols.size} columns"


@dataclass
class Candidate:
    """A candidate golden for one output: the values a device with the bug would write, the
    accumulator, error scale and defined mask behind them (in the checker's form, see
    :func:`..check.output_golden`), and the check description and inputs (``c``) to bound it."""

    golden: dict[str, np.ndarray]
    check: Mapping[str, Any]
    inputs: Mapping[str, Any]

    @property
    def values(self) -> np.ndarray:
        return self.golden["main"]


@dataclass
class Variant:
    """One concrete form of a catalogue entry (``params`` say which).  ``compute(sample)``
    returns the candidates (output name -> :class:`Candidate`) on the sample or, with None, on
    the whole case; an output it leaves out is the golden one.  ``cost``: "output" (from the
    stored golden), "regen" (an exact-model regeneration), "slow" (a slow model: not
    recomputed on the whole case when a sample was used)."""

    params: dict[str, Any]
    compute: Callable[[Sample | None], dict[str, Candidate]]
    cost: str = "regen"
    #: "failing": scored on the failing elements; "differing": on every element where the device
    #: differs from the golden (failing or not): a bug whose errors stay inside the bound one by
    #: one (a truncated output at large K) is seen in all the elements it changes.
    evidence: str = "failing"

    @property
    def key(self) -> str:
        return json.dumps(self.params, sort_keys=True, default=str)


@dataclass
class Score:
    failing: int = 0
    passing: int = 0
    exact: int = 0
    bound: int = 0
    kept: int = 0
    sampled: bool = False
    error: str | None = None
    #: elements where the device differs from the golden (defined, failing or not), and those of
    #: them the candidate reproduces exactly / within its bound
    differing: int = 0
    diff_exact: int = 0
    diff_bound: int = 0
    evidence: str = "failing"

    @property
    def share(self) -> float:
        if self.evidence == "differing":
            return self.diff_bound / self.differing if self.differing else 0.0
        return self.bound / self.failing if self.failing else 0.0

    @property
    def exact_share(self) -> float:
        if self.evidence == "differing":
            return self.diff_exact / self.differing if self.differing else 0.0
        return self.exact / self.failing if self.failing else 0.0

    @property
    def kept_share(self) -> float:
        return self.kept / self.passing if self.passing else 1.0

    @property
    def explained(self) -> float:
        return self.share * self.kept_share

    @property
    def explains(self) -> bool:
        return self.error is None and self.explained >= THRESHOLD

    @property
    def quality(self) -> float:
        """Exact reproduction counts twice: kept * (share + exact_share) / 2."""
        return self.kept_share * (self.share + self.exact_share) / 2


@dataclass
class Evaluated:
    """A scored variant of a catalogue entry."""

    entry: Any  # catalogue.Entry (no import circle)
    variant: Variant
    score: Score
    order: int = 0


def rank_key(e: Evaluated) -> tuple[Any, ...]:
    """Sort key (descending): explains, quality (to 1e-4), specificity, catalogue order."""
    s = e.score
    return (s.explains, round(s.quality, 4) if s.error is None else -1.0, e.entry.specificity, -e.order)


def describe_error(e: BaseException) -> str:
    """One line: the exception's type and first message line."""
    text = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {text}"[:300]


def same_values(d: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Element-wise equality with NaN equal to NaN and infinities by sign (float64 inputs)."""
    with np.errstate(invalid="ignore"):
        return (d == c) | (np.isnan(d) & np.isnan(c))


def _unpack(x: Any) -> Any:
    return x.data if isinstance(x, st.PackedFP4) else x


class CaseContext:
    """A failing case of a bundle with the device's outputs: everything a mutation reads."""

    def __init__(self, bundle: Bundle, case_id: str, device: Mapping[str, np.ndarray],
                 options: CheckOptions, reports: list[CaseReport] | None = None) -> None:
        data: CaseData = bundle.case(case_id)
        self.id = case_id
        self.entry: dict[str, Any] = data.entry
        self.kernel: str = data.entry["kernel"]
        self.profile: str = data.entry["profile"]
        self.params: dict[str, Any] = dict(data.entry.get("params") or {})
        self.family: Family = entry_family(data.entry)
        self.inputs: dict[str, Any] = {k: _unpack(v) for k, v in data.inputs().items()}
        self.golden: dict[str, np.ndarray] = data.golden()
        self.args: list[ArgRef] = data.args
        self.kwargs: dict[str, ArgRef] = data.kwargs
        self.outputs_desc: dict[str, dict[str, Any]] = data.entry["outputs"]
        self.main: str = data.entry.get("main_output") or next(iter(self.outputs_desc))
        self.check: dict[str, Any] = dict(data.entry.get("check") or {})
        self.options = options
        self.device = {name: np.asarray(device[name]) for name in self.outputs_desc}
        self.output_goldens = {name: output_golden(self.golden, name, self.main) for name in self.outputs_desc}
        # A family with its own view (DeepEP) compares the device's outputs in canonical order, its
        # payloads as bit patterns: mutations see the outputs (device and golden) as compared.
        self.view = family_view(self.entry, self.golden, self.device)
        if self.view is not None:
            self.device = dict(self.view.device)
            self.output_goldens = dict(self.view.goldens)
            self.golden = {**self.golden, **{name: g["main"] for name, g in self.view.goldens.items()}}
        self.classes: dict[str, Classification] = {}
        self.reports: dict[str, CaseReport] = {}
        for name in self.outputs_desc:
            # the family's range hook: the same range class and stage-propagated allowance as check
            rep, cls = classify_output(name, self.device[name], self.output_goldens[name], self.check_of(name),
                                       self.inputs, options, masks_only=True,
                                       range_hook=family_range(self.entry, self.golden, self.inputs, name))
            self.classes[name], self.reports[name] = cls, rep
        self.failing = sum(int(np.count_nonzero(c.bad)) for c in self.classes.values())
        self.sample = self._choose_sample()
        self._cache: dict[tuple[str, str, int], Score] = {}
        self._full_golden_cache: dict[str, dict[str, Candidate]] = {}
        self.timings: dict[str, float] = {}

    # -- facts mutations read ------------------------------------------------------------------

    def check_of(self, name: str) -> dict[str, Any]:
        """The check description of an output (a second output has no epilogue ``c``)."""
        if self.view is not None:
            return dict(self.view.checks[name])
        if name == self.main:
            return self.check
        ep = dict(self.check.get("epilogue") or {})
        ep["c"] = None
        return {**self.check, "epilogue": ep, "c_epi": 0}

    def matches(self, patterns: Iterable[str]) -> bool:
        return any(fnmatch.fnmatchcase(self.kernel, p) for p in patterns)

    @property
    def epilogue(self) -> dict[str, Any]:
        return dict(self.check.get("epilogue") or {})

    @property
    def interval(self) -> bool:
        """Whether the main output is checked against a bound (it has an accumulator)."""
        g = self.output_goldens[self.main]
        return "acc" in g and "S" in g and self.epilogue.get("out") in _OUT_FMT

    @property
    def ascend(self) -> bool:
        return self.profile == "ascend950"

    def value(self, name: str) -> Any:
        """A keyword argument's recorded value (None when absent)."""
        ref = self.kwargs.get(name)
        return None if ref is None or ref.kind != "value" else ref.value

    # -- the sample ------------------------------------------------------------------------------

    def _choose_sample(self) -> Sample | None:
        """Rows and 128-column blocks for screening a large dense GEMM (None: screen it all)."""
        g = self.golden[self.main]
        if self.family.name != "gemm" or g.ndim != 2 or g.size <= SAMPLE_ABOVE or "skip_head_mid" in self.kernel:
            return None
        bad = self.classes[self.main].bad
        m, n = g.shape
        rows_bad = np.flatnonzero(bad.any(axis=1))
        rows_ok = np.flatnonzero(~bad.any(axis=1))

        def spread(idx: np.ndarray, count: int) -> np.ndarray:
            if idx.size <= count:
                return idx
            return idx[np.linspace(0, idx.size - 1, count).round().astype(int)]

        rows = np.union1d(spread(rows_bad, SAMPLE_ROWS), spread(rows_ok, SAMPLE_PASS_ROWS))
        rows = np.unique(np.concatenate([rows - rows % 2, rows - rows % 2 + 1]))  # FP4 packs row pairs
        rows = rows[rows < m]
        blocks = -(-n // 128)
        per_block = np.add.reduceat(bad[rows].sum(axis=0), np.arange(0, n, 128)) if n else np.zeros(0)
        order = np.argsort(-per_block, kind="stable")
        chosen = [int(b) for b in order[:SAMPLE_COL_BLOCKS] if per_block[b] > 0]
        chosen += [int(b) for b in np.flatnonzero(per_block == 0)[:SAMPLE_PASS_COL_BLOCKS]]
        if not chosen:
            chosen = [0]
        cols = np.concatenate([np.arange(b * 128, min(n, (b + 1) * 128)) for b in sorted(set(chosen))])
        if rows.size * cols.size * 4 > g.size or blocks <= 1:
            return None
        return Sample(rows.astype(np.int64), cols.astype(np.int64))

    def fit_sample(self, rows: int) -> Sample | None:
        """At most ``rows`` rows of a dense GEMM (the failing ones first), all columns, for a
        slow model's fit; None when the case is that small or not a dense GEMM."""
        g = self.golden[self.main]
        if self.family.name != "gemm" or g.ndim != 2 or g.shape[0] <= rows or "skip_head_mid" in self.kernel:
            return None
        bad = self.classes[self.main].bad.any(axis=1)
        order = np.concatenate([np.flatnonzero(bad), np.flatnonzero(~bad)])
        pick = np.sort(order[: rows // 2])
        pick = np.unique(np.concatenate([pick - pick % 2, pick - pick % 2 + 1]))
        pick = pick[pick < g.shape[0]]
        return Sample(pick.astype(np.int64), np.arange(g.shape[1], dtype=np.int64))

    # -- regeneration ----------------------------------------------------------------------------

    def regenerate(self, sample: Sample | None, overrides: Mapping[str, Any] | None = None,
                   kwargs: Mapping[str, Any] | None = None, accumulation: Any = "exact",
                   inputs: Mapping[str, Any] | None = None,
                   outputs_desc: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Candidate]:
        """Candidates from the emulator run on the case's inputs with ``overrides`` (tensors the
        kernel sees instead, after the derived inputs are made), keyword values replaced by
        ``kwargs`` (plain values) and the given accumulation model; sliced to ``sample``."""
        base = dict(self.inputs if inputs is None else inputs)
        kw = dict(self.kwargs)
        for k, v in (kwargs or {}).items():
            kw[k] = ArgRef("value", (), list(v) if isinstance(v, tuple) else v)
        outs: dict[str, Any] = dict(self.outputs_desc if outputs_desc is None else outputs_desc)
        over = dict(overrides or {})
        if sample is not None:
            base.update(over)
            over = {}
            base, outs = self._slice_gemm(base, outs, sample)
        entry = dict(self.entry)
        golden, _ = golden_of_call(entry, self.args, kw, base, outs, self.family, accumulation=accumulation,
                                   overrides=over or None)
        visible = {**base, **over}
        return {name: Candidate(output_golden(golden, name, self.main), self.check_of(name), visible)
                for name in outs}

    def _slice_gemm(self, tensors: dict[str, Any], outs: Mapping[str, Mapping[str, Any]],
                    sample: Sample) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
        """A dense GEMM case's inputs restricted to the sample's rows of A and columns of D."""
        layout = self.kernel[-2:]
        p = self.params
        rows, cols = sample.rows, sample.cols
        out = dict(tensors)
        for side, idx, major_mn in (("a", rows, layout[0] == "t"), ("b", cols, layout[1] == "n")):
            x = tensors[side]
            fp4 = p.get(side) == "fp4"
            if major_mn:  # stored (K, MN) (FP4: (K, MN / 2) bytes)
                out[side] = np.ascontiguousarray(x[:, np.unique(idx // 2)] if fp4 else x[:, idx])
            else:
                out[side] = np.ascontiguousarray(x[idx])
            sf_name = f"{side}_sf"
            if sf_name in tensors:
                sf = tensors[sf_name]
                t = (self.entry.get("transforms") or {}).get(sf_name, {})
                canon = sf.T if t.get("transpose_back") else sf
                if side == "b" and p.get("gran_n") == 128:
                    canon = canon[np.unique(idx // 128)]
                else:
                    canon = canon[idx]
                out[sf_name] = np.ascontiguousarray(canon.T if t.get("transpose_back") else canon)
        if "c" in tensors:
            out["c"] = np.ascontiguousarray(sample.take(tensors["c"]))
        new_outs = {name: {**o, "shape": [int(rows.size), int(cols.size)]} for name, o in outs.items()}
        return out, new_outs

    def golden_candidates(self, sample: Sample | None) -> dict[str, Candidate]:
        """The stored goldens as candidates (sliced to the sample)."""
        out = {}
        for name in self.outputs_desc:
            g = self.output_goldens[name]
            if sample is not None:
                g = {k: sample.take(v) for k, v in g.items()}
            inputs = self.inputs
            if sample is not None and "c" in self.inputs:
                inputs = {**self.inputs, "c": sample.take(self.inputs["c"])}
            out[name] = Candidate(dict(g), self.check_of(name), inputs)
        return out

    # -- scoring ---------------------------------------------------------------------------------

    def score(self, entry_name: str, variant: Variant, sample: Sample | None) -> Score:
        """The variant's score on the sample (or the whole case); cached."""
        key = (entry_name, variant.key, 0 if sample is None else id(sample))
        if key in self._cache:
            return self._cache[key]
        t0 = time.perf_counter()
        try:
            sc = self._agreement(variant.compute(sample), sample)
            sc.evidence = variant.evidence
        except Exception as e:  # a mutation the kernel refuses (or cannot express) is no candidate
            sc = Score(error=describe_error(e))
        sc.sampled = sample is not None
        self._cache[key] = sc
        self.timings[entry_name] = self.timings.get(entry_name, 0.0) + time.perf_counter() - t0
        return sc

    def _agreement(self, cands: Mapping[str, Candidate], sample: Sample | None) -> Score:
        sc = Score()
        for name in self.outputs_desc:
            cls = self.classes[name]
            dev = self.device[name]
            defined, bad = cls.defined, cls.bad
            if sample is not None:
                dev, defined, bad = sample.take(dev), sample.take(defined), sample.take(bad)
            good = defined & ~bad
            gold = self.output_goldens[name]["main"]
            if sample is not None:
                gold = sample.take(gold)
            differs = (defined & ~same_values(dev.astype(np.float64), gold.astype(np.float64))) | bad
            sc.differing += int(np.count_nonzero(differs))
            cand = cands.get(name)
            if cand is None:  # unchanged output: the golden classification
                sc.failing += int(np.count_nonzero(bad))
                sc.passing += int(np.count_nonzero(good))
                sc.kept += int(np.count_nonzero(good))
                sc.diff_bound += int(np.count_nonzero(differs & good))
                continue
            values = np.asarray(cand.values)
            if values.shape != dev.shape:
                raise DGArgumentError(f"candidate {name!r} has shape {values.shape}; the output has {dev.shape}")
            d64 = dev.astype(np.float64)
            exact = same_values(d64, values.astype(np.float64))
            rep, ccls = classify_output(name, dev, cand.golden, cand.check, cand.inputs, self.options,
                                        masks_only=True)
            within = exact | (ccls.defined & ~ccls.bad)
            sc.failing += int(np.count_nonzero(bad))
            sc.passing += int(np.count_nonzero(good))
            sc.exact += int(np.count_nonzero(bad & exact))
            sc.bound += int(np.count_nonzero(bad & within))
            sc.kept += int(np.count_nonzero(good & within))
            sc.diff_exact += int(np.count_nonzero(differs & exact))
            sc.diff_bound += int(np.count_nonzero(differs & within))
        return sc


# ----------------------------------------------------------------------------------------------
# output-stage helpers (the stored accumulator, no GEMM)
# ----------------------------------------------------------------------------------------------

def epilogue_values(ep_desc: Mapping[str, Any], acc: np.ndarray, c: np.ndarray | None,
                    rounding: Callable[[np.ndarray, fm.Format], np.ndarray] | None = None) -> np.ndarray:
    """The epilogue ``ep_desc`` (output format, alpha, c, c_mode) applied to float64
    accumulators ``acc`` (any shape; ``c`` of the same shape or None), as output values.
    ``rounding``: the output rounding (default round to nearest even, the kernel's)."""
    fmt = _OUT_FMT[ep_desc["out"]]
    shape = acc.shape
    last = shape[-1] if acc.ndim else 1
    x = np.asarray(acc, np.float64).reshape(-1, last)
    cc = None if c is None else np.asarray(c).reshape(-1, last)
    if rounding is None:
        ep = core.OutputStage(fmt, ep_desc.get("alpha"), cc, ep_desc.get("c_mode", "kernel"))
        with np.errstate(over="ignore", invalid="ignore"):
            codes = ep.apply(x, 0, x.shape[0])
        return fm.decode(codes, fmt).astype(_OUT_DTYPE[ep_desc["out"]]).reshape(shape)
    # a custom output rounding: the same steps as core.Epilogue._apply with ``rounding``
    alpha = ep_desc.get("alpha")
    mode = ep_desc.get("c_mode", "kernel")
    with np.errstate(over="ignore", invalid="ignore"):
        z = x
        if alpha is not None:
            z = fm.round_f64(np.float64(alpha) * z, fm.F32).astype(np.float64)  # f32(alpha * acc), RNE
        if cc is not None:
            if mode == "rounded" or (mode == "kernel" and fmt is fm.BF16):
                z = rounding(z, fmt)
            z = z + cc.astype(np.float64)
        v = rounding(z, fmt)
    return v.astype(_OUT_DTYPE[ep_desc["out"]]).reshape(shape)


@dataclass(frozen=True)
class SignBias:
    """How the device's differing elements lean: ``differing`` finite elements that differ from
    the golden, ``toward_zero`` of them smaller in magnitude (same sign), ``log10_p`` the one-sided
    binomial tail log10 P(X >= toward_zero) for X ~ Binomial(differing, 1/2) (0 when none differ)."""

    differing: int
    toward_zero: int
    log10_p: float


def binomial_tail_log10(n: int, t: int) -> float:
    """log10 P(X >= t) for X ~ Binomial(n, 1/2), as a logarithm (it cannot underflow)."""
    if t <= 0 or n <= 0:
        return 0.0
    if t > n:
        return -np.inf
    i = np.arange(t, n + 1, dtype=np.float64)
    from math import lgamma, log

    lc = np.array([lgamma(n + 1) - lgamma(k + 1) - lgamma(n - k + 1) for k in i]) if n < 2048 else (
        lgamma(n + 1) - _lgamma_vec(i + 1) - _lgamma_vec(n - i + 1))
    terms = lc - n * log(2.0)
    top = float(terms.max())
    return float((top + np.log(np.exp(terms - top).sum())) / log(10.0))


def _lgamma_vec(x: np.ndarray) -> np.ndarray:
    """lgamma of positive float64 values (Stirling's series past 8, exact recurrence below)."""
    from math import lgamma

    small = x < 8
    out = np.empty_like(x)
    out[small] = [lgamma(v) for v in x[small]]
    y = x[~small]
    out[~small] = ((y - 0.5) * np.log(y) - y + 0.5 * np.log(2 * np.pi) + 1 / (12 * y) - 1 / (360 * y ** 3)
                   + 1 / (1260 * y ** 5))
    return out


def sign_bias(device: np.ndarray, golden: np.ndarray, defined: np.ndarray) -> SignBias:
    """The sign bias of the elements where ``device`` differs from ``golden`` (both finite,
    ``defined``): how many are smaller in magnitude with the golden's sign (toward zero)."""
    d = np.asarray(device).astype(np.float64)
    g = np.asarray(golden).astype(np.float64)
    with np.errstate(invalid="ignore"):
        differ = np.asarray(defined, bool) & np.isfinite(d) & np.isfinite(g) & (d != g)
        toward = differ & (np.abs(d) < np.abs(g)) & ((np.sign(d) == np.sign(g)) | (d == 0))
    n, t = int(np.count_nonzero(differ)), int(np.count_nonzero(toward))
    return SignBias(n, t, binomial_tail_log10(n, t))


def round_toward_zero(x: np.ndarray, fmt: fm.Format) -> np.ndarray:
    """``x`` (float64) rounded toward zero to bf16 or float32, as float64 values (overflow gives
    the largest finite value; NaN and infinities stay)."""
    # formats.CastPolicy has no toward-zero rounding (kernels never truncate); a
    # diagnosis of a truncating port needs one, so it lives here.
    x = np.asarray(x, np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        f = x.astype(np.float32)
        over = np.abs(f.astype(np.float64)) > np.abs(x)
        f = np.where(over & np.isfinite(x), np.nextafter(f, np.float32(0)), f)
        f = np.where(np.isinf(f) & np.isfinite(x), np.copysign(np.float32(np.finfo(np.float32).max), f), f)
        if fmt is fm.BF16:
            bits = f.view(np.uint32)
            keep = np.isfinite(f)
            bits = np.where(keep, bits & np.uint32(0xFFFF0000), bits)
            f = bits.view(np.float32)
    return f.astype(np.float64)


def round_nearest(x: np.ndarray, fmt: fm.Format) -> np.ndarray:
    """Round to nearest even (the kernels' rounding), as float64 values."""
    return fm.round_f64(np.asarray(x, np.float64), fmt).astype(np.float64)


def unchanged(ctx: CaseContext, overrides: Mapping[str, Any]) -> bool:
    """Whether every override equals the case's own tensor (a mutation that changes nothing)."""
    for k, v in overrides.items():
        mine = ctx.inputs.get(k)
        if mine is None or np.shape(mine) != np.shape(v) or np.asarray(mine).dtype != np.asarray(v).dtype:
            return False
        a, b = np.ascontiguousarray(mine), np.ascontiguousarray(v)
        if a.view(np.uint8).tobytes() != b.view(np.uint8).tobytes():
            return False
    return True


def finite_or_golden(values: np.ndarray, golden: np.ndarray) -> np.ndarray:
    """Candidate values where the golden is finite, the golden's own NaN / infinity elsewhere."""
    g = np.asarray(golden)
    with np.errstate(invalid="ignore"):
        keep = ~np.isfinite(g.astype(np.float64))
    return np.where(keep, g, values).astype(g.dtype)
