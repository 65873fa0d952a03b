"""One self-contained HTML report of a check (``deepgemm-ref check --html FILE [--diagnose]``).

A single file to attach to a bug report: no external resource (styles and a few lines of script
inline, heatmaps as ``data:image/png;base64`` URIs), readable without the script.  It holds the
bundle and outputs file it came from, the checker options (``#options``), a summary table
with one row per output (status, counts,
maximum normalised error, ``calc_diff`` and, with ``--diagnose``, the explaining bug), and for
every failing or warning output its bound, its bias test, its heatmap (:mod:`.plot`; without matplotlib a table
of per-tile failure shares), its worst elements (failures first, each against its own warn /
fail thresholds) and, with ``--diagnose``, the ranked explanations.  Integer outputs list their
differing entries instead of a heatmap.  The script filters the table (failures only; also opened as
``report.html#failures-only``) and marks the page once every image has decoded
(``body[data-images-loaded]``).
"""

from __future__ import annotations

import base64
import datetime
import html
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .._version import __version__
from .bias import describe_bias
from .bundle import atomic_write_text
from .check import WORST_THRESHOLDS_TEXT, CaseReport, describe_bound, describe_options, options_differ
from .reading import printable
from .text import class_mismatches, count, failing

__all__ = ["html_report", "write_html"]

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; } h3 { font-size: 1em; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.5em; text-align: left; }
th { background: #f0f0f0; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.status-pass { color: #176117; } .status-warn { color: #8a5a00; } .status-fail, .status-error { color: #b00020; }
tr.fail td:first-child, tr.error td:first-child { border-left: 4px solid #b00020; }
tr.warn td:first-child { border-left: 4px solid #d08a00; }
.meta { color: #555; font-size: 0.9em; }
.summary { font-size: 1.05em; font-weight: 600; }
img.heatmap { max-width: 100%; border: 1px solid #ddd; }
table.tiles td { width: 1.2em; height: 1.2em; padding: 0; }
.explains { font-weight: 600; }
code { background: #f5f5f5; padding: 0 0.2em; }
"""

_SCRIPT = """
(function () {
  var rows = Array.prototype.slice.call(document.querySelectorAll('#outputs tbody tr'));
  var box = document.getElementById('failures-only');
  if (window.location.hash === '#failures-only') { box.checked = true; }
  function apply() {
    var shown = 0;
    rows.forEach(function (r) {
      r.hidden = box.checked && (r.dataset.status === 'pass' || r.dataset.status === 'warn');
      if (!r.hidden) { shown += 1; }
    });
    document.body.dataset.visibleRows = String(shown);
  }
  box.addEventListener('change', apply);
  apply();
  var imgs = Array.prototype.slice.call(document.images);
  function mark() {
    document.body.dataset.imagesLoaded = String(imgs.filter(function (i) {
      return i.complete && i.naturalWidth > 0; }).length);
  }
  imgs.forEach(function (i) { i.addEventListener('load', mark); });
  window.addEventListener('load', mark);
  mark();
  document.body.dataset.ready = '1';
})();
"""


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _anchor(report_id: str) -> str:
    return "detail-" + "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in report_id)


def _num(x: Any, fmt: str = ".3g") -> str:
    if x is None:
        return ""
    return format(float(x), fmt)


def _tile_table(r: CaseReport) -> str:
    """A per-tile failure-share table (the heatmap without matplotlib)."""
    t = r.tiles
    lead, tr, tc = t["shape"]
    failed = np.asarray(t["failed"], float).reshape(lead, tr, tc)
    checked = np.asarray(t.get("checked", np.full_like(failed, 128 * 128)), float).reshape(lead, tr, tc)
    special = np.asarray(t.get("special", np.zeros_like(failed)), float).reshape(lead, tr, tc)
    parts = []
    for g in range(min(lead, 16)):
        head = f"<h3>{_e(r.lead or 'index')} {g}</h3>" if lead > 1 else ""
        cells = []
        for i in range(min(tr, 64)):
            row = []
            for j in range(min(tc, 64)):
                if checked[g, i, j] == 0:
                    row.append('<td style="background:#d0d0d0" title="no checked element"></td>')
                    continue
                share = failed[g, i, j] / checked[g, i, j]
                # darker with the share (square-root scale); a tile with any failure is at least
                # FAILING_TILE_LEVEL dark and outlined, so one failing element among 16,384 shows
                level = int(255 - 200 * share ** 0.5)
                style = f"background:rgb(255,{level},{level})"
                if failed[g, i, j] > 0:
                    level = min(level, FAILING_TILE_LEVEL)
                    style = f"background:rgb(255,{level},{level});{FAILING_TILE_OUTLINE}"
                mark = "&#x2716;" if special[g, i, j] else ""
                row.append(f'<td style="{style}" title="tile ({i}, {j}): '
                           f'{int(failed[g, i, j])} of {int(checked[g, i, j])} failing">{mark}</td>')
            cells.append("<tr>" + "".join(row) + "</tr>")
        parts.append(head + '<table class="tiles">' + "".join(cells) + "</table>")
    return ('<p>Failure share per 128x128 tile (matplotlib is not installed; darker = more failing elements, '
            'every tile with a failure outlined in dark red, &#x2716; = a NaN / infinity class mismatch).</p>'
            + "".join(parts))


#: The tile table's palest red for a tile with any failure (its green and blue level, of 255) and
#: its outline: a tile with a single failing element stands out from the passing (white) ones.
FAILING_TILE_LEVEL = 170
FAILING_TILE_OUTLINE = "outline:2px solid #8b0000;outline-offset:-2px"


def _heatmap(r: CaseReport) -> str:
    from .plot import can_plot, heatmap_png

    if not can_plot(r):
        return ""
    try:
        png = heatmap_png(r)
    except Exception:  # no matplotlib (DGArgumentError) or a drawing problem: the table instead
        return _tile_table(r)
    data = base64.b64encode(png).decode("ascii")
    return f'<img class="heatmap" alt="heatmap of {_e(r.id)}" src="data:image/png;base64,{data}">'


def _worst(r: CaseReport) -> str:
    if not r.worst:
        return ""
    integer = bool(r.dtype) and np.dtype(r.dtype).kind in "iub"
    if integer:
        head = "<tr><th>index</th><th>device</th><th>golden</th></tr>"
        rows = "".join(f"<tr><td>{_e(tuple(w['index']))}</td><td class=num>{_e(w['device'])}</td>"
                       f"<td class=num>{_e(w['golden'])}</td></tr>" for w in r.worst)
        return f"<h3>Differing entries</h3><table class=worst>{head}{rows}</table>"
    head = ("<tr><th>status</th><th>index</th><th>tile</th><th>device</th><th>golden</th><th>|d - golden|</th>"
            "<th>warns above</th><th>fails above</th><th>normalised error</th><th>note</th></tr>")
    rows = "".join(
        f"<tr class={_e(w['status'])}><td class=status-{_e(w['status'])}>{_e(w['status'])}</td>"
        f"<td>{_e(tuple(w['index']))}</td><td>{_e(tuple(w['tile_128x128']))}</td>"
        f"<td class=num>{_e(_num(w['device'], '.6g'))}</td><td class=num>{_e(_num(w['golden'], '.6g'))}</td>"
        f"<td class=num>{_e(_num(w.get('error'), '.3g'))}</td><td class=num>{_e(_threshold(w, 'warn_error'))}</td>"
        f"<td class=num>{_e(_threshold(w, 'allowed_error'))}</td><td class=num>{_e(_num(w['normalised_error']))}</td>"
        f"<td>{_e(w.get('note', ''))}</td></tr>"
        for w in r.worst)
    return (f"<h3>Worst elements (failures first)</h3><p>{_e(WORST_THRESHOLDS_TEXT)}.</p>"
            f"<table class=worst>{head}{rows}</table>")


def _threshold(w: Mapping[str, Any], key: str) -> str:
    """An absolute error threshold of a worst element, or "-" where none applies (a class mismatch,
    an overflow the range allows)."""
    return _num(w[key], ".3g") if key in w else "-"


def _diagnosis(d: Any) -> str:
    if d is None:
        return ""
    parts = [f"<h3>Diagnosis</h3><p class=verdict>{_e(d.verdict)}"]
    if d.sample:
        parts.append(f" (screened on {_e(d.sample)})")
    parts.append("</p>")
    if d.explanations:
        parts.append("<table class=explanations><tr><th>rank</th><th>known bug</th><th>reproduces (within the bound)"
                     "</th><th>exactly</th><th>passing kept</th><th>parameters</th><th>what it is</th></tr>")
        for i, e in enumerate(d.explanations, start=1):
            params = ", ".join(f"{k} {v}" for k, v in e.params.items())
            src = "".join(f' <a href="{_e(s)}">{_e(s.rsplit("/", 3)[-3] + "#" + s.rsplit("/", 1)[-1])}</a>'
                          for s in e.sources)
            cls = " class=explains" if e.explains else ""
            parts.append(f"<tr{cls}><td class=num>{i}</td><td><code>{_e(e.name)}</code></td>"
                         f"<td class=num>{100 * e.share:.1f}%</td><td class=num>{100 * e.exact_share:.1f}%</td>"
                         f"<td class=num>{100 * e.kept:.1f}%</td><td>{_e(params)}</td><td>{_e(e.description)}{src}"
                         "</td></tr>")
        parts.append("</table>")
    return "".join(parts)


def _compare_section(rows: list[dict[str, Any]]) -> str:
    """The compare table (``check --compare-table``'s columns) as one HTML table."""
    cols = list(rows[0])
    head = "".join(f"<th>{_e(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td class=num>{_e(repr(v))}</td>" if isinstance(v, float) else
                                    f"<td>{_e(v)}</td>" for v in (row.get(c, "") for c in cols)) + "</tr>"
                   for row in rows)
    return ('<h2 id="compare-table">Compare table</h2><p>msprobe\'s compare columns (computed as msprobe computes '
            "them; Accuracy Reached or Not by its check_accuracy rule) beside this checker's verdict "
            "(docs/compare-table.md).</p>"
            f'<div style="overflow-x:auto"><table class=compare><thead><tr>{head}</tr></thead><tbody>{body}'
            "</tbody></table></div>")


def _case_of(report_id: str, known: Any) -> str:
    return report_id if report_id in known else report_id.rsplit("/", 1)[0]


def html_report(reports: list[CaseReport], *, bundle: str = "", outputs: str = "",
                diagnoses: list[Any] | None = None, cases: Mapping[str, Any] | None = None,
                compare_table: list[dict[str, Any]] | None = None) -> str:
    """The HTML text (see the module docstring); ``compare_table``: the rows of
    :func:`.compare_table.compare_rows` (msprobe's columns beside ours), shown as ``#compare-table``."""
    cases = cases or {}
    verdicts = {d.id: d for d in diagnoses or []}
    known = set(cases) | set(verdicts)
    counts = {s: sum(r.status == s for r in reports) for s in ("pass", "warn", "fail")}
    recorded = next((r.options for r in reports if r.options), {})
    options_line = describe_options(recorded) + (" (NOT the defaults)" if options_differ(recorded)
                                                 else " (the defaults)")
    out = ['<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">',
           f"<title>deepgemm-ref check: {_e(bundle or 'bundle')}</title><style>{_STYLE}</style></head>",
           f'<body data-outputs="{len(reports)}" data-failing="{counts["fail"]}">',
           "<h1>deepgemm-ref check</h1>",
           f'<p class=meta>bundle <code>{_e(bundle)}</code>, device outputs <code>{_e(outputs)}</code>; '
           f"deepgemm_ref {_e(__version__)}, {_e(datetime.datetime.now().isoformat(timespec='seconds'))}</p>",
           f'<p class="meta options" id=options>{_e(options_line)}</p>',
           f'<p class=summary id=summary>{count(len(reports), "output")}: {counts["pass"]} pass, '
           f'{counts["warn"]} warn, {counts["fail"]} fail</p>',
           '<p><label><input type="checkbox" id="failures-only"> failures only</label></p>',
           '<table id="outputs"><thead><tr><th>output</th><th>status</th><th>checked</th><th>failing</th>'
           "<th>warn</th><th>range: accumulator overflow allowed</th>"
           "<th>max normalised error</th><th>calc_diff</th><th>diagnosis</th></tr></thead><tbody>"]
    details = []
    for r in reports:
        status = "error" if r.error is not None else r.status
        d = verdicts.get(_case_of(r.id, known))
        verdict = d.verdict if d is not None and r.status == "fail" else ""
        name = (f'<a href="#{_anchor(r.id)}">{_e(r.id)}</a>' if status != "pass" else _e(r.id))
        out.append(f'<tr class="{status}" data-status="{status}"><td>{name}</td>'
                   f"<td class=status-{status}>{status.upper()}</td><td class=num>{r.checked}</td>"
                   f"<td class=num>{r.failed}</td><td class=num>{r.warned}</td>"
                   f"<td class=num>{r.range_allowed}</td>"
                   f"<td class=num>{'' if r.error else _num(r.max_normalised_error)}</td>"
                   f"<td class=num>{_num(r.calc_diff)}</td><td>{_e(verdict)}</td></tr>")
        if status == "pass":
            continue
        sec = [f'<section class="detail {status}" id="{_anchor(r.id)}"><h2 class=status-{status}>{_e(r.id)}: '
               f"{status.upper()}</h2>"]
        if r.error is not None:
            sec.append(f"<p>{_e(r.error)}</p>")
        else:
            special = f" ({class_mismatches(r.special_mismatches)})" if r.special_mismatches else ""
            sec.append(f"<p>{failing(r.failed, r.checked)}{_e(special)}, {r.warned} warn, "
                       f"{r.undefined} undefined (not checked).</p><p class=bound>Bound: {_e(describe_bound(r.bound))}"
                       "</p>")
            if r.bias is not None:
                sec.append(f"<p class=bias>{_e(describe_bias(r.bias))}</p>")
            if r.ulp_histogram:
                sec.append("<p>ulp distance to golden: " + _e(", ".join(f"{k}: {v}" for k, v in
                                                                          r.ulp_histogram.items() if v)) + "</p>")
            sec.append(_heatmap(r))
            sec.append(_worst(r))
        if d is not None and r.status == "fail":
            sec.append(_diagnosis(d))
        sec.append("</section>")
        details.append("".join(sec))
    out.append("</tbody></table>")
    if compare_table:
        out.append(_compare_section(compare_table))
    out += details
    out.append(f"<script>{_SCRIPT}</script></body></html>\n")
    return "\n".join(out)


def write_html(path: str | os.PathLike[str], reports: list[CaseReport], **kwargs: Any) -> Path:
    """Write :func:`html_report` to ``path`` atomically."""
    out = Path(path)
    if not out.parent.is_dir():
        out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, printable(html_report(reports, **kwargs)))  # a lone surrogate as "\\ud800"
    return out
