"""Generate docs/case-specs.md, the case-specification reference, from the families' schemas.

    python docs/gen_case_specs.py            # rewrite docs/case-specs.md
    python docs/gen_case_specs.py --check    # exit 1 if docs/case-specs.md is out of date (run by the tests)
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from _gen import run  # noqa: E402  (docs/ is the script's directory)

from deepgemm_ref.golden.cases import FAMILIES  # noqa: E402
from deepgemm_ref.golden.schema import render_markdown  # noqa: E402

PATH = ROOT / "docs" / "case-specs.md"


def generate() -> str:
    return render_markdown([f.schema for f in FAMILIES.values() if f.schema is not None])


def main() -> int:
    return run(PATH, generate, "docs/gen_case_specs.py")


if __name__ == "__main__":
    sys.exit(main())
