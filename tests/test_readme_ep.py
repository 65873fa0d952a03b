"""The README's DeepEP example runs as written, and its result is what the README says it is."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np

README = Path(__file__).resolve().parent.parent / "README.md"


def _example() -> str:
    text = README.read_text()
    section = text[text.index("## DeepEP: expert-parallel dispatch and combine"):]
    start = section.index("```python\n") + len("```python\n")
    return section[start:section.index("```\n", start)]


def test_the_readme_deepep_example_runs_and_combines_each_token_once_per_owner_rank():
    scope: dict = {}
    exec(compile(_example(), "README.md", "exec"), scope)  # noqa: S102 - the README's own example
    ys, x, idx, R, E = scope["ys"], scope["x"], scope["idx"], scope["R"], scope["E"]
    e_l = E // R
    for r in range(R):
        owners = [len({int(e) // e_l for e in row if e >= 0}) for row in idx[r]]
        # every owner sends the same bf16 row back: the float32 sum of n equal rows, rounded once
        want = np.stack([(np.float32(n) * x[r][t].astype(np.float32)) for t, n in enumerate(owners)])
        assert ys[r].dtype == np.dtype(ml_dtypes.bfloat16)
        np.testing.assert_array_equal(ys[r].view(np.uint16), want.astype(ml_dtypes.bfloat16).view(np.uint16))
