"""Run the diagnosis over a bundle and a device's outputs: the cases, the verdicts."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..bundle import Bundle, load_bundle
from ..check import CaseReport, CheckOptions, check_outputs, load_outputs, strict_json_value
from ..progress import as_progress
from ..replay import read_replay_record
from .catalogue import Entry, applicable
from .engine import CONFIRM, CONFIRM_ABOVE, THRESHOLD, CaseContext, Evaluated, Score, describe_error, rank_key

__all__ = ["Explanation", "CaseDiagnosis", "diagnose", "diagnose_outputs", "diagnose_case"]

#: Explanations listed per case (the best variant of each entry, ranked).
LISTED = 5
#: A candidate reproducing less than this share of the failing elements is not listed.
LIST_ABOVE = 0.05


@dataclass
class Explanation:
    """One catalogue entry's best variant on a case, with its shares (see :mod:`.engine`)."""

    name: str
    description: str
    stage: str
    params: dict[str, Any]
    share: float
    exact_share: float
    kept: float
    quality: float
    explains: bool
    sampled: bool
    failing: int
    sources: list[str] = field(default_factory=list)
    #: "failing" or "differing": the elements the shares are taken over (see .engine)
    evidence: str = "failing"
    differing: int = 0

    @staticmethod
    def of(e: Evaluated) -> Explanation:
        s: Score = e.score
        entry: Entry = e.entry
        return Explanation(entry.name, entry.description, entry.stage, dict(e.variant.params), s.share,
                           s.exact_share, s.kept_share, s.quality, s.explains, s.sampled, s.failing,
                           list(entry.sources), s.evidence, s.differing)


@dataclass
class CaseDiagnosis:
    """The diagnosis of one case: ``status`` "fail" (with ``explanations`` ranked, best first;
    ``explained`` when the first passes the threshold), "pass" / "warn" (nothing to diagnose) or
    "error" (the case could not be checked, ``error`` says why).  ``skipped``: the applicable
    entries that yielded no scored candidate, with the reason (e.g. the kernel refused the
    mutated call)."""

    id: str
    status: str
    checked: int = 0
    failing: int = 0
    explanations: list[Explanation] = field(default_factory=list)
    sample: str | None = None
    error: str | None = None
    candidates: int = 0
    seconds: float = 0.0
    outputs: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # entry -> why it made no candidate here

    @property
    def explained(self) -> bool:
        return bool(self.explanations) and self.explanations[0].explains

    @property
    def best(self) -> Explanation | None:
        return self.explanations[0] if self.explained else None

    @property
    def verdict(self) -> str:
        if self.status == "error":
            return f"cannot diagnose: {self.error}"
        if self.status == "warn":
            return "nothing to diagnose (the case warns: outside the probabilistic bound, inside the deterministic one)"
        if self.status != "fail":
            return "nothing to diagnose (the case passes)"
        if self.explained:
            return f"explained by {self.explanations[0].name}"
        return "no known bug explains it"

    def to_json(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["explanations"] = [dict(e.__dict__) for e in self.explanations]
        d["explained"] = self.explained
        d["best"] = self.best.name if self.best else None
        d["verdict"] = self.verdict
        d["threshold"] = THRESHOLD
        return strict_json_value(d)


def diagnose_case(bundle: Bundle, case_id: str, outputs: Mapping[str, Any], options: CheckOptions,
                  reports: list[CaseReport]) -> CaseDiagnosis:
    """Diagnose one case whose check ``reports`` are given."""
    t0 = time.perf_counter()
    errs = [r for r in reports if r.error is not None]
    checked = sum(r.checked for r in reports)
    failing = sum(r.failed for r in reports)
    names = [r.id for r in reports]
    if errs:
        return CaseDiagnosis(case_id, "error", checked, failing, error=errs[0].error, outputs=names)
    if not any(r.status == "fail" for r in reports):
        status = "warn" if any(r.status == "warn" for r in reports) else "pass"
        return CaseDiagnosis(case_id, status, checked, 0, outputs=names)
    entry = bundle.cases[case_id]
    device = {name: outputs[f"{case_id}/{name}"] for name in entry["outputs"]}
    ctx = CaseContext(bundle, case_id, device, options)
    screen = ctx.sample
    evaluated: list[Evaluated] = []
    skipped: dict[str, str] = {}
    for order, e in enumerate(applicable(ctx.kernel)):
        try:
            for variant in e.mutation(ctx):
                evaluated.append(Evaluated(e, variant, ctx.score(e.name, variant, screen), order))
        except Exception as ex:  # one entry that cannot model this case does not stop the others
            skipped[e.name] = describe_error(ex)
    # confirm the best screened candidates on the whole case (a slow model stays a sample estimate)
    if screen is not None:
        ranked = sorted(evaluated, key=rank_key, reverse=True)
        for ev in [x for x in ranked if x.score.error is None and x.score.explained >= CONFIRM_ABOVE][:CONFIRM]:
            if ev.variant.cost != "slow":
                ev.score = ctx.score(ev.entry.name, ev.variant, None)
    best: dict[str, Evaluated] = {}
    for ev in evaluated:
        cur = best.get(ev.entry.name)
        if ev.score.error is None and (cur is None or rank_key(ev) > rank_key(cur)):
            best[ev.entry.name] = ev
    ranked = sorted(best.values(), key=rank_key, reverse=True)
    listed = [Explanation.of(ev) for ev in ranked if ev.score.share >= LIST_ABOVE][:LISTED]
    for ev in evaluated:
        if ev.score.error is not None and ev.entry.name not in best:
            skipped.setdefault(ev.entry.name, ev.score.error)
    return CaseDiagnosis(case_id, "fail", checked, ctx.failing, listed,
                         screen.describe() if screen is not None else None, candidates=len(evaluated),
                         seconds=time.perf_counter() - t0, outputs=names, skipped=skipped)


def diagnose_outputs(bundle: Bundle, outputs: Mapping[str, Any], *, options: CheckOptions | None = None,
                     cases: list[str] | None = None, errors: Mapping[str, str] | None = None,
                     progress: Any = None, reports: list[CaseReport] | None = None) -> list[CaseDiagnosis]:
    """Diagnose the device outputs of a loaded bundle: one :class:`CaseDiagnosis` per case (the
    check of :func:`..check.check_outputs` first; ``reports``: its result when already made)."""
    options = options or CheckOptions()
    outputs = _named(bundle, outputs, cases)
    if reports is None:
        reports = check_outputs(bundle, dict(outputs), options, cases, None, errors)
    by_case: dict[str, list[CaseReport]] = {}
    known = set(bundle.cases) | set(bundle.incomplete)
    for r in reports:
        case_id = r.id if r.id in known else r.id.rsplit("/", 1)[0]
        by_case.setdefault(case_id, []).append(r)
    ids = [c for c in by_case]
    prog = as_progress(progress)
    prog.start(len(ids), float(len(ids)))
    out = []
    for n, case_id in enumerate(ids, start=1):
        if case_id not in bundle.cases:
            rep = by_case[case_id][0]
            out.append(CaseDiagnosis(case_id, "error", error=rep.error or "not a case of the bundle"))
        else:
            out.append(diagnose_case(bundle, case_id, outputs, options, by_case[case_id]))
        prog.update(n, float(n), case_id)
    prog.finish()
    return out


def _named(bundle: Bundle, outputs: Mapping[str, Any], cases: list[str] | None) -> Mapping[str, Any]:
    """A single .npy output (key "") named after the one case it belongs to."""
    if set(outputs) != {""}:
        return outputs
    ids = list(dict.fromkeys(cases)) if cases else list(bundle.cases)
    if len(ids) != 1 or ids[0] not in bundle.cases:
        from ..bundle import BundleError

        raise BundleError("a .npy outputs file can only be checked against a one-case bundle (use --case)")
    entry = bundle.cases[ids[0]]
    return {f"{ids[0]}/{entry.get('main_output') or next(iter(entry['outputs']))}": outputs[""]}


def diagnose(bundle_dir: str | os.PathLike[str], outputs_path: str | os.PathLike[str], *,
             options: CheckOptions | None = None, cases: list[str] | None = None, progress: Any = None,
             max_memory: int | None = None) -> list[CaseDiagnosis]:
    """``deepgemm-ref diagnose``: check a device's outputs against a bundle and, for every
    failing case, rank the catalogue's known port bugs by how much of the failure each one
    reproduces (see :mod:`deepgemm_ref.golden.diagnose`)."""
    bundle = load_bundle(bundle_dir, max_memory=max_memory)
    outputs = load_outputs(outputs_path, max_memory=max_memory)
    errors, _ = read_replay_record(outputs_path) if not os.fspath(outputs_path).endswith(".npy") else ({}, None)
    return diagnose_outputs(bundle, outputs, options=options, cases=cases, errors=errors, progress=progress)
