"""docs/compatibility.md lists every intentional difference, and each is marked `# Note:` in code."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "deepgemm_ref"


def _table_rows() -> list[list[str]]:
    """Rows of the main table (the signature-differences table after it has its own test)."""
    rows = []
    for line in (ROOT / "docs" / "compatibility.md").read_text().splitlines():
        if line.startswith("## Signature differences"):
            break
        if line.startswith("|") and not line.startswith("| ---") and not line.startswith("| Name"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def _notes() -> Counter:
    counts: Counter = Counter()
    for f in PKG.rglob("*.py"):
        for line in f.read_text().splitlines():
            if re.match(r"\s*# Note:", line):
                counts[str(f.relative_to(PKG))] += 1
    return counts


def test_every_note_is_in_the_table():
    rows = _table_rows()
    assert rows and all(len(r) == 4 and all(r) for r in rows), "every row needs name, where, difference, reason"
    where = Counter(r[1].strip("`") for r in rows)
    notes = _notes()
    missing = sorted(m for m in notes if m not in where)
    assert not missing, f"modules with # Note: comments but no row in docs/compatibility.md: {missing}"


def test_every_row_points_at_a_note():
    notes = _notes()
    for name, where, _diff, _reason in _table_rows():
        module = where.strip("`")
        assert (PKG / module).exists(), f"row {name!r}: no module {module}"
        assert notes[module] >= 1, f"row {name!r}: {module} has no # Note: comment"
