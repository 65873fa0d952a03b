"""Heatmaps of the checker's per-tile worst normalised error (``deepgemm-ref check --plot DIR``).

One PNG per checked output: the worst ``|d - y| / (E + ulp/2)`` of every 128x128 tile (per group
for grouped outputs), on a logarithmic colour scale labelled in units of the bound, with the
tiles that hold a failing element outlined.  A zeroed tile, a wrong scale block or a transposed
layout shows up as a pattern here long before anyone finds it in a table.  Needs matplotlib (the
``plot`` extra).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..errors import DGArgumentError
from .check import CaseReport

__all__ = ["plot_reports", "plot_report"]


def _matplotlib():  # type: ignore[no-untyped-def]
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.colors import LogNorm
        from matplotlib.patches import Rectangle
    except ImportError as e:
        raise DGArgumentError("check --plot needs matplotlib: pip install 'deepgemm-ref[plot]'") from e
    return plt, LogNorm, Rectangle


def plot_report(report: CaseReport, path: str | os.PathLike[str]) -> Path:
    """Write one report's tile heatmap to ``path`` (PNG)."""
    plt, LogNorm, Rectangle = _matplotlib()
    tiles = report.tiles
    if not tiles:
        raise DGArgumentError(f"plot: case {report.id!r} has no 2-D output to draw")
    worst = np.asarray(tiles["worst"], dtype=float)
    failed = np.asarray(tiles["failed"])
    groups = worst.shape[0]
    fig, axes = plt.subplots(groups, 1, figsize=(7, 1.2 + 3.2 * groups), squeeze=False)
    vmax = max(float(worst.max()), 1.0)
    norm = LogNorm(vmin=1e-3, vmax=max(vmax, 1e-2))
    im = None
    for g in range(groups):
        ax = axes[g][0]
        data = np.maximum(worst[g], 1e-3)  # exact tiles (0) drawn at the bottom of the scale
        im = ax.imshow(data, cmap="magma", norm=norm, interpolation="nearest", aspect="auto")
        for r, c in zip(*np.nonzero(failed[g]), strict=True):
            ax.add_patch(Rectangle((c - 0.5, r - 0.5), 1, 1, fill=False, edgecolor="cyan", linewidth=2))
        rows, cols = data.shape
        if cols <= 32:
            ax.set_xticks(range(cols))
        if rows <= 32:
            ax.set_yticks(range(rows))
        ax.set_xlabel("N tile (128 columns)")
        ax.set_ylabel("M tile (128 rows)")
        title = f"{report.id}: {report.status}, {report.failed} failing elements"
        ax.set_title(title if groups == 1 else f"{title} (group {g})", fontsize=9)
    cbar = fig.colorbar(im, ax=[row[0] for row in axes], shrink=0.9)
    cbar.set_label("worst |d - y| / (E + ulp/2) per tile (1 = at the bound)")
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, out)
    return out


def plot_reports(reports: list[CaseReport], out_dir: str | os.PathLike[str]) -> list[Path]:
    """One PNG per report with a 2-D (or grouped) output, named after the case."""
    written = []
    for r in reports:
        if r.tiles:
            name = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in r.id)
            written.append(plot_report(r, Path(out_dir) / f"{name}.png"))
    return written
