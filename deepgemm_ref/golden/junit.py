"""JUnit XML of a check (``deepgemm-ref check --junit FILE``): one test case per checked output.

The structure is pytest's ``--junitxml`` one, which CI dashboards read: ``<testsuites>`` holding
one ``<testsuite name=... tests= failures= errors= skipped= time= timestamp= hostname=>``, and
per output a ``<testcase classname="<bundle>.<kernel>" name="<case id>[/<output>]" time=>``
that passes (empty; a warning or elements in the range class add ``<system-out>`` with the
report's line), fails (``<failure message=...>`` with the report's detail; a bias failure names
the bias) or is an error (``<error message=...>``: the output could not be checked: missing, its
replay failed, the bundle lacks the case).  The suite's ``<properties>`` record the checker
options (``deepgemm_ref.check.lambda``, ``.u_acc``, ``.n``, ``.acc_max``, ``.accumulation``,
``.bias_test``, ``.bias_threshold``, ``.bias_margin``; ``case`` where the case's own value is used).
"""

from __future__ import annotations

import datetime
import os
import platform
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .bias import describe_bias
from .bundle import atomic_write_text
from .check import CaseReport, format_report
from .text import failing

__all__ = ["junit_xml", "write_junit"]


def _clean(text: str) -> str:
    """XML 1.0 allows no control characters but tab, newline and carriage return, and no lone
    surrogates (U+D800..U+DFFF) or U+FFFE / U+FFFF: each is written as its backslash escape."""
    return "".join(ch if ch in "\t\n\r" or (0x20 <= ord(ch) < 0xD800 or 0xE000 <= ord(ch) < 0xFFFE
                                              or ord(ch) > 0xFFFF) else
                   (f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}") for ch in text)


def _case_of(report_id: str, cases: Mapping[str, Any]) -> str:
    return report_id if report_id in cases else report_id.rsplit("/", 1)[0]


def junit_xml(reports: list[CaseReport], *, suite: str = "deepgemm-ref check", bundle_name: str = "bundle",
              cases: Mapping[str, Any] | None = None, seconds: float = 0.0,
              diagnoses: list[Any] | None = None) -> str:
    """The reports as JUnit XML text (see the module docstring).  ``cases``: the bundle's
    manifest entries (for each output's kernel); ``diagnoses``: a failure message then names
    the explaining bug."""
    cases = cases or {}
    verdicts = {d.id: d for d in diagnoses or []}
    failures = sum(r.status == "fail" and r.error is None for r in reports)
    errors = sum(r.error is not None for r in reports)
    root = ET.Element("testsuites", {"name": suite})
    ts = ET.SubElement(root, "testsuite", {
        "name": suite, "errors": str(errors), "failures": str(failures), "skipped": "0", "tests": str(len(reports)),
        "time": f"{seconds:.3f}", "timestamp": datetime.datetime.now().isoformat(timespec="seconds"),
        "hostname": platform.node() or "localhost"})
    recorded = next((r.options for r in reports if r.options), {})
    if recorded:  # the checker options, so a pass under loosened ones is never read as a default pass
        props = ET.SubElement(ts, "properties")
        for key, value in recorded.items():
            text = "case" if value is None else (str(value).lower() if isinstance(value, bool) else str(value))
            ET.SubElement(props, "property", {"name": f"deepgemm_ref.check.{key}", "value": _clean(text)})
    for r in reports:
        case_id = _case_of(r.id, cases)
        kernel = str(cases.get(case_id, {}).get("kernel", "unknown"))
        classname = ".".join(part for part in (bundle_name, kernel) if part)
        tc = ET.SubElement(ts, "testcase", {"classname": _clean(classname), "name": _clean(r.id),
                                            "time": f"{seconds / max(len(reports), 1):.3f}"})
        detail = format_report([r]).rsplit("\n", 1)[0]  # without the summary line
        if r.error is not None:
            el = ET.SubElement(tc, "error", {"message": _clean(r.error)})
            el.text = _clean(detail)
        elif r.status == "fail":
            msg = failing(r.failed, r.checked)
            if r.bias is not None and r.bias.get("failed"):
                msg = f"the errors lean one way ({describe_bias(r.bias)}); " + msg
            d = verdicts.get(case_id)
            if d is not None:
                msg += f"; {d.verdict}"
            el = ET.SubElement(tc, "failure", {"message": _clean(msg)})
            el.text = _clean(detail)
        elif r.status == "warn" or r.range_allowed:
            ET.SubElement(tc, "system-out").text = _clean(detail)
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def write_junit(path: str | os.PathLike[str], reports: list[CaseReport], **kwargs: Any) -> Path:
    """Write :func:`junit_xml` to ``path`` atomically."""
    out = Path(path)
    if out.parent and not out.parent.is_dir():
        out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, junit_xml(reports, **kwargs))
    return out
