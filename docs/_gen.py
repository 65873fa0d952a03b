"""The command line of the docs generators: rewrite a generated page, or check it is up to date."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path


def run(path: Path, generate: Callable[[], str], script: str) -> int:
    """``script [--check]``: write ``generate()`` to ``path``, or (``--check``) exit 1 if it differs."""
    ap = argparse.ArgumentParser(prog=script)
    ap.add_argument("--check", action="store_true", help=f"exit 1 if {path.name} is out of date")
    args = ap.parse_args()
    text = generate()
    rel = f"docs/{path.name}"
    if args.check:
        if not path.exists() or path.read_text() != text:
            print(f"{rel} is out of date: run python {script}")
            return 1
        return 0
    path.write_text(text)
    print(f"wrote {path} ({len(text.splitlines())} lines)")
    return 0
