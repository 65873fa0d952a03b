"""Generate docs/case-specs.md, the case-specification reference, from the families' schemas.

    python docs/gen_case_specs.py            # rewrite docs/case-specs.md
    python docs/gen_case_specs.py --check    # exit 1 if docs/case-specs.md is out of date (run by the tests)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from deepgemm_ref.golden.cases import FAMILIES  # noqa: E402
from deepgemm_ref.golden.schema import render_markdown  # noqa: E402

PATH = ROOT / "docs" / "case-specs.md"


def generate() -> str:
    return render_markdown([f.schema for f in FAMILIES.values() if f.schema is not None])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    text = generate()
    if args.check:
        if not PATH.exists() or PATH.read_text() != text:
            print("docs/case-specs.md is out of date: run python docs/gen_case_specs.py")
            return 1
        return 0
    PATH.write_text(text)
    print(f"wrote {PATH} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
