"""Heatmaps of a check, per 128x128 output tile (``deepgemm-ref check --plot DIR``, ``--html``).

One figure per checked floating-point output.  For every group (grouped GEMMs), rank (Mega MoE)
or batch index of a 3-D output, one row of two panels with that slice's own counts in its title:

* left: the share of the tile's checked elements that fail (0 to 1, on a square-root scale, and
  every tile with a failure outlined), so a tile with 8,827 failures stands out from one with a
  single element 4 ulps off;
* right: the worst normalised error ``|d - y| / (E + ulp/2)`` of the tile, on a logarithmic
  scale in units of the bound (1: at the bound).

Tiles holding a NaN / infinity class mismatch (an error of no finite size) carry a marker in a
distinct colour, and tiles with no checked element (undefined rows, padding) are grey; a legend
names both.  Integer outputs (Mega MoE's receive counts) get no heatmap: their report lists the
differing entries.  Needs matplotlib (the ``plot`` extra).
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import DGArgumentError
from .check import CaseReport
from .text import failing

__all__ = ["plot_reports", "plot_report", "heatmap_png", "can_plot", "MAX_PANELS"]

#: At most this many groups / ranks are drawn per figure (those with failures first).
MAX_PANELS = 16
_SPECIAL = "#00b4ff"  # NaN / infinity class mismatch marker
_UNCHECKED = "#d0d0d0"


def _matplotlib() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise DGArgumentError("heatmaps need matplotlib: pip install 'deepgemm-ref[plot]'") from e
    return plt


def can_plot(report: CaseReport) -> bool:
    """Whether the report gets a heatmap: a checked 2-D (or 3-D) floating-point output."""
    if not report.tiles or report.error is not None:
        return False
    return not (report.dtype and np.dtype(report.dtype).kind in "iub")


def _figure(report: CaseReport) -> Any:
    plt = _matplotlib()
    from matplotlib.colors import LogNorm, PowerNorm
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch, Rectangle

    t = report.tiles
    lead, tr, tc = t["shape"]
    failed = np.asarray(t["failed"], dtype=float).reshape(lead, tr, tc)
    worst = np.asarray(t["worst"], dtype=float).reshape(lead, tr, tc)
    special = np.asarray(t.get("special", np.zeros_like(failed)), dtype=float).reshape(lead, tr, tc)
    checked = np.asarray(t.get("checked", np.full_like(failed, t["tile"][0] * t["tile"][1])), float)
    checked = checked.reshape(lead, tr, tc)
    order = sorted(range(lead), key=lambda g: (failed[g].sum() == 0, g))[:MAX_PANELS]
    order.sort()
    label = report.lead or "index"
    cell = 0.35
    width = max(3.2, min(7.0, 0.9 + cell * tc))
    height = max(1.6, min(6.0, 0.9 + cell * tr))
    fig, axes = plt.subplots(len(order), 2, figsize=(2 * width + 1.2, height * len(order) + 2.0), squeeze=False,
                             layout="constrained")
    share_cmap = plt.get_cmap("Reds").with_extremes(bad=_UNCHECKED)
    err_cmap = plt.get_cmap("magma").with_extremes(bad=_UNCHECKED)
    vmax = max(float(np.nanmax(worst)) if worst.size else 1.0, 10.0)
    err_norm = LogNorm(vmin=1e-2, vmax=vmax)
    im_share = im_err = None
    for row, g in enumerate(order):
        none = checked[g] == 0
        share = np.where(none, np.nan, failed[g] / np.maximum(checked[g], 1))
        err = np.where(none, np.nan, np.clip(worst[g], 1e-2, vmax))
        ax_s, ax_e = axes[row]
        im_share = ax_s.imshow(np.ma.masked_invalid(share), cmap=share_cmap, norm=PowerNorm(0.5, vmin=0, vmax=1),
                               interpolation="nearest", aspect="auto")
        for y, x in zip(*np.nonzero(failed[g]), strict=True):  # any failure: outlined, however few
            ax_s.add_patch(Rectangle((x - 0.5, y - 0.5), 1, 1, fill=False, edgecolor="black", linewidth=1.0))
        im_err = ax_e.imshow(np.ma.masked_invalid(err), cmap=err_cmap, norm=err_norm, interpolation="nearest",
                             aspect="auto")
        for ax in (ax_s, ax_e):
            ys, xs = np.nonzero(special[g])
            if ys.size:
                ax.scatter(xs, ys, marker="X", s=60, color=_SPECIAL, edgecolors="black", linewidths=0.5, zorder=3)
            if tc <= 32:
                ax.set_xticks(range(tc))
            if tr <= 32:
                ax.set_yticks(range(tr))
            if row == len(order) - 1:
                ax.set_xlabel(f"N tile ({t['tile'][1]} columns)", fontsize=8)
            ax.set_ylabel(f"M tile ({t['tile'][0]} rows)", fontsize=8)
            ax.tick_params(labelsize=7)
        n_fail, n_checked = int(failed[g].sum()), int(checked[g].sum())
        n_special = int(special[g].sum())
        where = f"{label} {g}: " if lead > 1 else ""
        extra = f", {n_special} NaN/inf" if n_special else ""
        ax_s.set_title(f"{where}{n_fail} of {n_checked} failing{extra}", fontsize=9)
        ax_e.set_title(f"{where}worst normalised error {float(worst[g].max()):.3g}"
                       + (" (+ NaN/inf)" if n_special else ""), fontsize=9)
    shown = f" ({len(order)} of {lead} {label}s shown, those with failures first)" if len(order) < lead else ""
    fig.suptitle(f"{report.id}: {report.status.upper()}, {failing(report.failed, report.checked)}{shown}",
                 fontsize=10)
    cb1 = fig.colorbar(im_share, ax=[r[0] for r in axes], shrink=0.9, location="bottom", aspect=30)
    cb1.set_label("share of the tile's elements that fail (square-root scale; outlined: any)", fontsize=8)
    cb2 = fig.colorbar(im_err, ax=[r[1] for r in axes], shrink=0.9, location="bottom", aspect=30)
    cb2.set_label("worst |d - y| / (E + ulp/2) per tile (1 = at the bound)", fontsize=8)
    handles = [Patch(facecolor=_UNCHECKED, edgecolor="black", label="no checked element"),
               Line2D([], [], marker="X", linestyle="", color=_SPECIAL, markeredgecolor="black", markersize=8,
                      label="NaN / infinity class mismatch")]
    fig.legend(handles=handles, loc="outside lower center", ncol=2, fontsize=8, frameon=False)
    return fig


def heatmap_png(report: CaseReport, dpi: int = 90) -> bytes:
    """The report's heatmap as PNG bytes (raises for a report without one, see :func:`can_plot`)."""
    if not can_plot(report):
        raise DGArgumentError(f"plot: {report.id!r} has no floating-point 2-D output to draw "
                              "(integer outputs list their differing entries instead)")
    plt = _matplotlib()
    fig = _figure(report)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    return buf.getvalue()


def plot_report(report: CaseReport, path: str | os.PathLike[str]) -> Path:
    """Write one report's heatmap to ``path`` (PNG, atomically)."""
    from .paths import atomic_write_bytes

    data = heatmap_png(report)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out, data)  # a temporary name within the file-name limit, the umask's mode
    return out


def file_name(report_id: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in report_id)


def plot_reports(reports: list[CaseReport], out_dir: str | os.PathLike[str]) -> list[Path]:
    """One PNG per report with a floating-point 2-D (or grouped) output, named after it."""
    from .paths import check_output_file

    targets = [(r, Path(out_dir) / f"{file_name(r.id)}.png") for r in reports if can_plot(r)]
    if Path(out_dir).is_dir():  # every PNG's path checked before the first is written
        for _, target in targets:
            check_output_file("--plot", target)
    written = []
    for r, target in targets:
        written.append(plot_report(r, target))
    return written
