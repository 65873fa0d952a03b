"""The README's "Using the goldens with msprobe and CANN tools" commands run as written.

Without torch the commands that need no torch run (the npy / bin exports and their read-back);
with torch and mindstudio-probe installed every command runs, the real ``msprobe compare``
included, and its table has one row per output with Cosine 1 (the replayed outputs are the
emulator's, which equal the goldens)."""

from __future__ import annotations

import csv
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from deepgemm_ref.cli import main

README = Path(__file__).resolve().parent.parent / "README.md"
SECTION = "## Using the goldens with msprobe and CANN tools"


def _commands() -> list[str]:
    text = README.read_text(encoding="utf-8")
    body = text[text.index(SECTION):]
    body = body[:body.index("\n## ", len(SECTION))]
    block = body[body.index("```bash\n") + len("```bash\n"):]
    block = block[:block.index("```")]
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


def _run(cmd: str, cwd: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    """Run one README command in ``cwd``: ``deepgemm-ref`` in this process (its ``main``, as the
    console script calls it), ``msprobe`` as the script beside this interpreter."""
    argv = shlex.split(cmd)
    if argv[0] == "deepgemm-ref":
        monkeypatch.chdir(cwd)
        return main(argv[1:]), ""
    assert argv[0] == "msprobe", cmd
    proc = subprocess.run([str(Path(sys.executable).parent / "msprobe"), *argv[1:]], cwd=cwd,
                          capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stdout[-1500:] + proc.stderr[-1500:]


def _needs_torch(cmd: str) -> bool:
    return "msprobe" in cmd or "device_dump" in cmd


def test_the_section_has_the_commands_the_issue_asks_for():
    cmds = _commands()
    assert any(c.startswith("deepgemm-ref export") and "--format msprobe" in c for c in cmds)
    assert any(c.startswith("msprobe compare") for c in cmds)
    assert any(c.startswith("deepgemm-ref check") and "device_dump" in c for c in cmds)
    assert any("--format bin" in c for c in cmds) and any("--format npy" in c for c in cmds)


def test_readme_commands_without_torch_run(tmp_path, monkeypatch):
    for cmd in _commands():
        if _needs_torch(cmd):
            continue
        rc, out = _run(cmd, tmp_path, monkeypatch)
        assert rc == 0, (cmd, out)
    assert (tmp_path / "golden_bin" / "sm100-fp8-nt-bf16" / "d.bin").is_file()
    assert (tmp_path / "device_npy" / "sm100-paged-mqa-fp8" / "logits.npy").is_file()


@pytest.mark.torch
@pytest.mark.msprobe
def test_readme_commands_with_msprobe_run(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    pytest.importorskip("msprobe")
    if not (Path(sys.executable).parent / "msprobe").exists():
        pytest.skip("no msprobe script beside this interpreter")
    for cmd in _commands():
        rc, out = _run(cmd, tmp_path, monkeypatch)
        assert rc == 0, (cmd, out)
    (table,) = (tmp_path / "compare_result").glob("compare_result_rank0_*.csv")
    rows = list(csv.DictReader(table.open(encoding="utf-8")))
    assert len(rows) == 2 and all(float(r["Cosine"]) == 1.0 and float(r["MaxAbsErr"]) == 0.0 for r in rows)
