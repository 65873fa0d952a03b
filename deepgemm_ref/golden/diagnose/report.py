"""The diagnosis as text (one block per failing case) and as strict JSON."""

from __future__ import annotations

import json
from typing import Any

from ..text import count, failing
from .engine import THRESHOLD
from .run import CaseDiagnosis, Explanation

__all__ = ["format_diagnoses", "diagnoses_json", "format_params"]


def format_params(params: dict[str, Any]) -> str:
    """``key value, key value`` (lists shortened)."""
    parts = []
    for k, v in params.items():
        if isinstance(v, list) and len(v) > 4:
            v = f"{v[:4]} ..."
        parts.append(f"{k} {v}")
    return ", ".join(parts)


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _line(i: int, e: Explanation) -> list[str]:
    params = f"  [{format_params(e.params)}]" if e.params else ""
    est = " (estimated on the sample)" if e.sampled else ""
    what = (f"{e.differing} differing elements (failing or not)" if e.evidence == "differing"
            else f"{e.failing} failing elements")
    head = (f"  {i}. {e.name}: reproduces {_pct(e.share)} of the {what} within the bound, "
            f"{_pct(e.exact_share)} exactly; keeps {_pct(e.kept)} of the passing ones{est}{params}")
    out = [head, f"     {e.description}"]
    for src in e.sources:
        out.append(f"     seen in: {src}")
    return out


def format_diagnoses(diagnoses: list[CaseDiagnosis], *, quiet: bool = False) -> str:
    """Human-readable diagnosis: per failing case the verdict and the ranked explanations; one
    line per passing case (none with ``quiet``); a summary line."""
    lines: list[str] = []
    for d in diagnoses:
        if d.status in ("pass", "warn"):
            if not quiet:
                lines.append(f"{d.id}: {d.status.upper()}  nothing to diagnose")
            continue
        if d.status == "error":
            lines.append(f"{d.id}: ERROR  {d.verdict}")
            continue
        sample = f" (screened on {d.sample})" if d.sample else ""
        lines.append(f"{d.id}: FAIL  {failing(d.failing, d.checked)}; {d.verdict}; "
                     f"{d.candidates} candidates in {d.seconds:.1f} s{sample}")
        shown = [e for e in d.explanations if e.explains]
        rest = [e for e in d.explanations if not e.explains]
        for i, e in enumerate(shown, start=1):
            lines += _line(i, e)
        if rest:
            lines.append("  partial (below the threshold):" if shown else "  closest candidates (below the "
                         f"threshold of {_pct(THRESHOLD)}):")
            for i, e in enumerate(rest, start=len(shown) + 1):
                lines += _line(i, e)
    fails = [d for d in diagnoses if d.status == "fail"]
    explained = sum(d.explained for d in fails)
    errors = sum(d.status == "error" for d in diagnoses)
    lines.append(f"summary: {count(len(diagnoses), 'case')}: {len(fails)} failing ({explained} explained, "
                 f"{len(fails) - explained} not explained), {errors} could not be diagnosed; an explanation "
                 f"reproduces at least {_pct(THRESHOLD)} of a case's failing elements within the bound")
    return "\n".join(lines)


def diagnoses_json(diagnoses: list[CaseDiagnosis]) -> str:
    """Strict JSON (NaN / infinities as strings): a list of case diagnoses."""
    return json.dumps([d.to_json() for d in diagnoses], indent=1, allow_nan=False)
