"""The pytest plugin: backend and device options and fixtures, dg_arch variants, and --dg-bundle
items (a correct replay passes; a stand-in backend with a wrong kernel fails with the checker's
message, also in JUnit XML)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from deepgemm_ref import golden

try:  # imported once here: pytester's in-process runs drop modules they import, and torch cannot load twice
    import torch  # noqa: F401
except ImportError:  # pragma: no cover - torch is optional
    pass

pytest_plugins = ["pytester"]

STANDIN = '''
"""A stand-in backend: deepgemm_ref with a bf16 GEMM that is one ulp off and an FP8 GEMM that raises."""
import numpy as np
import deepgemm_ref
from deepgemm_ref import *  # noqa: F401,F403
from deepgemm_ref.interop import to_numpy


def __getattr__(name):
    return getattr(deepgemm_ref, name)


def bf16_gemm_nt(a, b, d, *args, **kwargs):
    deepgemm_ref.bf16_gemm_nt(a, b, d, *args, **kwargs)
    out = to_numpy(d)  # a NumPy view of a torch CPU tensor, or the array itself
    out.view(np.uint16)[0, 1] += 1


def fp8_gemm_nt(*args, **kwargs):
    raise RuntimeError("no kernel for this recipe on this device")
'''

SPECS = [{"id": "bf16-ok", "kernel": "bf16_gemm_tn", "profile": "sm100", "m": 8, "n": 16, "k": 64},
         {"id": "bf16-one-ulp", "kernel": "bf16_gemm_nt", "profile": "sm100", "m": 8, "n": 16, "k": 64},
         {"id": "fp8-raises", "kernel": "fp8_gemm_nt", "profile": "sm90", "m": 8, "n": 16, "k": 128, "gran_n": 128}]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    root = tmp_path_factory.mktemp("plugin") / "bundle"
    golden.generate(SPECS, root)
    return root


def test_options_are_registered(pytester):
    result = pytester.runpytest("--help")
    for opt in ("--dg-backend={emulator,real}", "--dg-module", "--dg-ranks={threads,processes}", "--dg-device",
                "--dg-arch", "--dg-bundle=PATH",
                "--dg-lambda", "--dg-u-acc", "--dg-strict"):
        result.stdout.fnmatch_lines([f"*{opt}*"])


def test_fixtures_default_to_the_emulator(pytester):
    pytester.makepyfile('''
        def test_it(deep_gemm, dg_device, dg_backend, dg_arch):
            import deepgemm_ref
            assert deep_gemm is deepgemm_ref and dg_device == "cpu" and dg_backend == "emulator" and dg_arch is None
            assert deep_gemm.get_arch() == "sm100"
    ''')
    result = pytester.runpytest("-v")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["deepgemm_ref: backend emulator (deepgemm_ref), device cpu"])


def test_dg_arch_parametrization_switches_the_emulators_profile(pytester):
    pytester.makepyfile('''
        import pytest

        @pytest.mark.parametrize("dg_arch", ["sm90", "sm100", "ascend950"])
        def test_it(deep_gemm, dg_arch):
            assert deep_gemm.get_arch() == dg_arch

        def test_default(deep_gemm):
            assert deep_gemm.get_arch() == "ascend950"  # --dg-arch
    ''')
    pytester.runpytest("--dg-arch", "ascend950").assert_outcomes(passed=4)


def test_hypothesis_tests_take_the_fixtures(pytester):
    pytester.makepyfile('''
        from hypothesis import given, settings
        from deepgemm_ref.strategies import cases
        from deepgemm_ref.testing import assert_matches_golden

        @settings(max_examples=3, deadline=None, database=None)
        @given(case=cases("bf16_gemm_nt", profile="sm90"))
        def test_it(case, deep_gemm, dg_device):
            assert_matches_golden(case, case.call(deep_gemm, device=None))
    ''')
    pytester.runpytest("-W", "error::hypothesis.errors.HypothesisDeprecationWarning").assert_outcomes(passed=1)


def test_real_backend_skips_with_the_reason_when_missing(pytester, monkeypatch):
    pytester.makepyfile('''
        def test_it(deep_gemm):
            raise AssertionError("not reached")
    ''')
    result = pytester.runpytest("--dg-backend", "real", "--dg-module", "no_such_deep_gemm", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*--dg-backend real: cannot import 'no_such_deep_gemm'*"])
    monkeypatch.setenv("DG_BACKEND", "real")
    monkeypatch.setenv("DG_MODULE", "no_such_deep_gemm")
    pytester.runpytest().assert_outcomes(skipped=1)


def test_real_backend_yields_the_named_module(pytester, monkeypatch):
    pytester.makepyfile(standin_dg=STANDIN)
    pytester.syspathinsert()
    pytester.makepyfile(test_it='''
        import pytest

        def test_it(deep_gemm, dg_device, dg_backend):
            assert deep_gemm.__name__ == "standin_dg" and dg_backend == "real" and dg_device == "cpu"

        @pytest.mark.parametrize("dg_arch", ["sm90"])
        def test_variant(deep_gemm, dg_arch):
            pass  # the device's arch is unknown on cpu: the variant runs
    ''')
    monkeypatch.setenv("DG_DEVICE", "cpu")
    pytester.runpytest("--dg-backend", "real", "--dg-module", "standin_dg").assert_outcomes(passed=2)


def test_dg_group_under_each_backend(pytester):
    pytester.makepyfile(standin_dg=STANDIN)
    pytester.syspathinsert()
    pytester.makepyfile(test_it='''
        def test_it(dg_group, dg_backend):
            rank = dg_group(2)
            assert dg_backend == "emulator" and rank(1) is not rank(0)
    ''')
    pytester.runpytest().assert_outcomes(passed=1)
    result = pytester.runpytest("--dg-backend", "real", "--dg-module", "standin_dg", "-rs")
    result.assert_outcomes(skipped=1)
    try:
        import torch.distributed  # noqa: F401
        reason = "*2 expert-parallel ranks: one process per rank needs an initialised torch.distributed world of 2*"
    except ImportError:  # without torch the real library's process groups cannot exist at all
        reason = "*a Mega MoE test with one process per rank needs torch.distributed*"
    result.stdout.fnmatch_lines([reason])
    # the emulator with one process per rank, outside torchrun: skipped the same way
    result = pytester.runpytest("--dg-ranks", "processes", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines([reason])


def _has_torch() -> bool:
    try:
        import torch.distributed  # noqa: F401
    except ImportError:
        return False
    return True


def test_deep_ep_and_dg_ep_ranks_under_each_backend(pytester, monkeypatch):
    """The emulator's deep_ep is deepgemm_ref.ep and its ranks are threads; the real backend imports
    --dg-ep-module (skipping with the reason where it cannot) and skips multi-rank bodies outside an
    initialised torch.distributed world."""
    pytester.makepyfile(standin_ep="import deepgemm_ref.ep as _ep\nfrom deepgemm_ref.ep import *  # noqa: F401,F403\n"
                                   "def __getattr__(name):\n    return getattr(_ep, name)\n")
    pytester.syspathinsert()
    pytester.makepyfile(test_it='''
        import threading

        def test_module(deep_ep, dg_backend):
            assert deep_ep.__name__ == ("deepgemm_ref.ep" if dg_backend == "emulator" else "standin_ep")

        def test_ranks(dg_ep_ranks):
            out = dg_ep_ranks(lambda g: (g.rank(), g.size(), threading.current_thread().name), 3)
            assert [o[:2] for o in out] == [(0, 3), (1, 3), (2, 3)]
            assert len({o[2] for o in out}) == 3
    ''')
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=2)
    result = pytester.runpytest("--dg-backend", "real", "--dg-ep-module", "standin_ep", "-rs", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, skipped=1)
    result = pytester.runpytest("--dg-backend", "real", "--dg-ep-module", "no_such_deep_ep", "-rs",
                                "-p", "no:cacheprovider")
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(["*cannot import 'no_such_deep_ep'*"])
    monkeypatch.setenv("DG_RANKS", "processes")  # the emulator, one process per rank, not under torchrun: skipped
    result = pytester.runpytest("-rs", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*3 expert-parallel ranks*torchrun --nproc-per-node 3 -m pytest --dg-ranks processes*"
                                 if _has_torch() else "*a DeepEP test with one process per rank needs torch*"])


@pytest.mark.torch
def test_dg_npu_is_the_shim_under_the_emulator_and_skips_without_torch_npu(pytester):
    pytest.importorskip("torch")
    pytester.makepyfile(standin_dg=STANDIN)
    pytester.syspathinsert()
    pytester.makepyfile(test_it='''
        import torch

        def test_it(deep_gemm, dg_npu):
            import deep_gemm as imported  # DeepGEMM-Ascend's tests import it by that name

            x = torch.ones(3, device="npu")
            dg_npu.synchronize()
            assert imported is deep_gemm and x.device.type == "cpu" and deep_gemm.get_arch() == "ascend950"
    ''')
    pytester.runpytest("-p", "no:cacheprovider", "--dg-arch", "sm90").assert_outcomes(passed=1)
    result = pytester.runpytest("--dg-backend", "real", "--dg-module", "standin_dg", "-rs", "-p", "no:cacheprovider")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*a DeepGEMM-Ascend test needs*"])


def test_bundle_cases_are_items_that_pass_on_the_emulator(pytester, bundle):
    xml = pytester.path / "report.xml"
    result = pytester.runpytest("--dg-bundle", str(bundle), f"--junitxml={xml}", "-v")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["*manifest.json::bf16-ok PASSED*", "*manifest.json::fp8-raises PASSED*"])
    cases = ET.parse(xml).getroot().iter("testcase")
    assert sorted(c.get("name") for c in cases) == ["bf16-ok", "bf16-one-ulp", "fp8-raises"]


def test_bundle_items_through_a_wrong_backend_fail_with_the_checkers_message(pytester, bundle):
    pytester.makepyfile(standin_dg=STANDIN)
    pytester.syspathinsert()
    xml = pytester.path / "report.xml"
    result = pytester.runpytest("--dg-bundle", str(bundle), "--dg-backend", "real", "--dg-module", "standin_dg",
                                "--dg-device", "cpu", f"--junitxml={xml}")
    result.assert_outcomes(passed=1, failed=2)
    out = result.stdout.str()
    assert "bf16_gemm_nt under sm100 does not match its golden values" in out
    assert "1 of 128 checked elements fails" in out and "at (0, 1) (128x128 tile (0, 0))" in out and "ULPs 1" in out
    assert "fp8_gemm_nt under sm90" in out and "the call failed: RuntimeError: no kernel for this recipe" in out
    assert "Traceback" not in out and "def runtest" not in out  # the message, not the plugin's code
    failures = {c.get("name"): c.find("failure") for c in ET.parse(xml).getroot().iter("testcase")}
    assert failures["bf16-ok"] is None
    assert "does not match its golden values" in failures["bf16-one-ulp"].text
    assert "no kernel for this recipe" in failures["fp8-raises"].text


def test_bundle_items_with_test_paths_and_checker_options(pytester, bundle):
    pytester.makepyfile(standin_dg=STANDIN)
    pytester.syspathinsert()
    pytester.makepyfile(test_other="def test_other():\n    pass\n")
    args = ["test_other.py", "--dg-bundle", str(bundle), "--dg-backend", "real", "--dg-module", "standin_dg",
            "--dg-device", "cpu", "-k", "one-ulp or other"]
    pytester.runpytest(*args).assert_outcomes(passed=1, failed=1)
    # a huge lambda widens the allowed interval past the one-ulp error: the option reaches the checker
    pytester.runpytest(*args, "--dg-lambda", "1e9").assert_outcomes(passed=2)
    pytester.runpytest(*args, "--dg-u-acc", "2^-2").assert_outcomes(passed=2)
    result = pytester.runpytest(*args, "--dg-u-acc", "lots")  # a usage error before any test (issue 29)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--dg-u-acc: expected a unit roundoff in (0, 1)*got 'lots'*"])


def test_not_a_bundle_is_a_usage_error(pytester, tmp_path):
    result = pytester.runpytest("--dg-bundle", str(tmp_path))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--dg-bundle*not a golden bundle (no manifest.json in*"])


def test_an_altered_bundle_is_a_collection_error(pytester, tmp_path):
    golden.generate(SPECS[:1], tmp_path / "b")
    manifest = tmp_path / "b" / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"bf16-ok"', '"bf16-okk"', 1))
    result = pytester.runpytest("--dg-bundle", str(tmp_path / "b"))
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["*--dg-bundle*manifest*"])


def test_drop_in_tests_take_the_module_from_the_fixture_only():
    """Item 5: the drop-in files import nothing of deepgemm_ref and never call numerics(arch=...) (DeepGEMM
    lacks it), so the same file runs against the real library."""
    import ast
    from pathlib import Path

    files = sorted((Path(__file__).parent).glob("test_dropin_*.py"))
    assert len(files) == 7
    for path in files + [Path(__file__).parent / "ascend_flows.py"]:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith("deepgemm_ref") for a in node.names), path
            if isinstance(node, ast.ImportFrom):
                assert not (node.module or "").startswith("deepgemm_ref"), path
                # a relative import only of the torch-only helpers DeepGEMM-Ascend's flows share
                assert node.level == 0 or node.module == "ascend_flows", (path, node.module)
            if isinstance(node, ast.Attribute):
                assert node.attr not in ("numerics", "set_arch", "EmulatedGroup"), (path, node.lineno)
        tests = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]
        assert tests or path.name == "ascend_flows.py"
        module = "deep_ep" if path.name == "test_dropin_ep.py" else "deep_gemm"
        assert all(module in [a.arg for a in t.args.args] for t in tests), path


@pytest.mark.torch
def test_drop_in_tests_run_against_a_real_backend(pytester):
    """The drop-in dense file, unchanged, against a stand-in 'real' library (deepgemm_ref under another name):
    the arch variants the device cannot tell all run; against a missing library everything skips."""
    pytest.importorskip("torch", reason="the drop-in file uses torch tensors")
    from pathlib import Path

    pytester.makepyfile(standin_dg="from deepgemm_ref import *  # noqa: F401,F403\nimport deepgemm_ref\n"
                                   "def __getattr__(name):\n    return getattr(deepgemm_ref, name)\n")
    pytester.syspathinsert()
    src = (Path(__file__).parent / "test_dropin_dense.py").read_text()
    pytester.makepyfile(test_dropin_dense=src)
    result = pytester.runpytest("--dg-backend", "real", "--dg-module", "no_such_module", "-p", "no:cacheprovider")
    result.assert_outcomes(skipped=9)
    # a CPU "device" has no arch to tell: every variant runs on what the library is (here sm100), so the
    # DeepGEMM-Ascend variant is left out
    result = pytester.runpytest("--dg-backend", "real", "--dg-module", "standin_dg", "--dg-device", "cpu",
                                "-k", "not ascend", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=8, deselected=1)
