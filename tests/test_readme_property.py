"""The README's "Property tests for your device" section runs as written: its property test file
passes under pytest with the plugin, its bundle-reading snippet reads a bundle, and the spec it
shows regenerates a case."""

from __future__ import annotations

import json
import re
from pathlib import Path

from deepgemm_ref import golden

try:  # imported once here: pytester's in-process runs drop modules they import, and torch cannot load twice
    import torch  # noqa: F401
except ImportError:  # pragma: no cover - torch is optional
    pass

pytest_plugins = ["pytester"]

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()
SECTION = README.split("## Property tests for your device", 1)[1].split("\n## ", 1)[0]
BLOCKS = re.findall(r"```(\w+)\n(.*?)```", SECTION, flags=re.S)


def _block(lang: str, needle: str) -> str:
    return next(code for kind, code in BLOCKS if kind == lang and needle in code)


def test_the_section_has_a_short_copyable_property_test():
    code = _block("python", "assert_matches_golden(case, outputs)")
    assert 15 <= len(code.strip().splitlines()) <= 25
    assert "from deepgemm_ref.strategies import cases" in code and "case.call(deep_gemm, device=dg_device)" in code


def test_the_property_test_passes(pytester):
    pytester.makepyfile(test_my_device=_block("python", "assert_matches_golden(case, outputs)"))
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)


def test_the_property_test_fails_on_a_broken_device(pytester):
    """The same file against a stand-in whose FP8 GEMM drops its second K block."""
    pytester.makepyfile(broken_dg='''
        import numpy as np
        import deepgemm_ref
        from deepgemm_ref.interop import to_numpy

        def __getattr__(name):
            return getattr(deepgemm_ref, name)

        def fp8_gemm_nt(a, b, d, *args, **kwargs):
            x, sx = a
            x = np.array(to_numpy(x))
            x[:, 128:] = 0
            deepgemm_ref.fp8_gemm_nt((x, sx), b, d, *args, **kwargs)
    ''')
    pytester.syspathinsert()
    pytester.makepyfile(test_my_device=_block("python", "assert_matches_golden(case, outputs)"))
    result = pytester.runpytest("--dg-backend", "real", "--dg-module", "broken_dg", "--dg-device", "cpu",
                                "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    assert "fp8_gemm_nt under sm100 does not match its golden values" in out
    assert ("Failing test case" in out or "Falsifying example" in out) and "'k': 129" in out


def test_the_bundle_reading_snippet_runs(tmp_path, monkeypatch):
    specs = [s for s in golden.preset("smoke") if s["id"] == "sm100-mqa-fp8"]
    golden.generate(specs, tmp_path / "bundle")
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(_block("python", "safetensors.load_file"), scope)  # noqa: S102 - the README's own snippet
    assert "input.q" in scope["tensors"] and set(scope["inputs"]) >= {"q", "kv", "kv_sf", "w"}
    assert "logits" in scope["goldens"]


def test_the_saved_spec_regenerates(tmp_path):
    cmd = _block("bash", "deepgemm-ref golden --spec case.json")
    spec = json.loads(re.search(r"echo '(\[.*\])' > case.json", cmd).group(1))
    golden.generate(spec, tmp_path / "regressions")
    assert list(golden.load_bundle(tmp_path / "regressions").cases) == [spec[0]["id"]]
    assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in SECTION
