"""The generated API reference is up to date and documents every public name."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from deepgemm_ref import names

ROOT = Path(__file__).resolve().parent.parent


def test_api_reference_is_up_to_date():
    r = subprocess.run([sys.executable, str(ROOT / "docs" / "gen_api.py"), "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_api_reference_documents_every_reference_name_with_a_docstring():
    text = (ROOT / "docs" / "api.md").read_text()
    assert "(no docstring)" not in text
    headings = set(re.findall(r"^### `([\w.]+)", text, flags=re.M))
    for target in ("deepgemm", "deepgemm-ascend"):
        for e in names.reference_entries(target):
            if e.module.startswith("deep_gemm.legacy"):
                continue
            assert e.qualified.replace("deep_gemm", "deepgemm_ref", 1) in headings, e.qualified
    import json

    for e in json.loads((ROOT / "deepgemm_ref" / "ep" / "spec" / "deepep-signatures.json").read_text()):
        assert f"{e['module'].replace('deep_ep', 'deepgemm_ref.ep', 1)}.{e['name']}" in headings, e["name"]
