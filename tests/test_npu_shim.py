"""deepgemm_ref.testing.npu_shim: torch.npu on the CPU, scoped, so DeepGEMM-Ascend's tests run unchanged."""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap
import threading

import pytest

import deepgemm_ref as dg
from deepgemm_ref.testing import npu_shim

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch


def test_install_maps_npu_to_the_cpu_and_uninstall_restores_everything():
    had_npu = hasattr(torch, "npu")
    assert "torch_npu" not in sys.modules and "deep_gemm" not in sys.modules
    with npu_shim.npu_on_cpu() as npu:
        assert torch.npu is npu and dg.get_arch() == "ascend950"
        import torch_npu

        assert torch_npu.npu is npu
        x = torch.zeros(3, device="npu")
        y = torch.ones(2).to("npu:0")
        z = torch.randn((2, 2), dtype=torch.bfloat16, device="npu").npu()
        assert x.device.type == y.device.type == z.device.type == "cpu" and x.is_npu
        assert torch.empty(1, device="meta").device.type == "meta"
        npu.synchronize()
        npu.empty_cache()
        assert npu.current_device() == 0 and npu.device_count() == 1 and npu.is_available()
        props = npu.get_device_properties(npu.current_device())
        assert props.multi_processor_count == 32 and props.L2_cache_size == 0
        with npu.stream(npu.Stream()):
            assert npu.current_stream() is not npu.default_stream()
        start, end = npu.Event(enable_timing=True), npu.Event(enable_timing=True)
        start.record()
        end.record()
        assert end.elapsed_time(start) <= 0 <= start.elapsed_time(end)
        import deep_gemm
        import deep_gemm.testing.bench as bench_attr
        from deep_gemm.testing.bench import bench_msprof, close_persistent_profiler
        from deep_gemm.testing.par_compile import par_compile

        assert deep_gemm is dg and bench_attr is dg.testing.bench  # the same objects, not copies
        assert bench_msprof is dg.testing.bench_msprof and close_persistent_profiler is dg.testing.close_persistent_profiler
        assert par_compile is dg.testing.par_compile.par_compile
        assert importlib.import_module("deep_gemm._C") is dg._C and sys.modules["deep_gemm._C"] is dg._C
    assert hasattr(torch, "npu") == had_npu and not hasattr(torch.Tensor, "npu") and not hasattr(torch.Tensor, "is_npu")
    assert "torch_npu" not in sys.modules and not any(k.split(".")[0] == "deep_gemm" for k in sys.modules)
    assert dg.get_arch() == "sm100"
    with pytest.raises(RuntimeError, match="Expected one of"):
        torch.zeros(1, device="npu")


def test_other_threads_map_the_device_inside_torch_npu_device():
    results = []
    with npu_shim.npu_on_cpu() as npu:
        def worker():
            try:
                torch.zeros(1, device="npu")
                results.append("mapped without a device scope")
            except RuntimeError:
                results.append("refused")
            with npu.device(3):
                results.append((npu.current_device(), torch.zeros(1, device="npu").device.type))
            results.append(npu.current_device())

        t = threading.Thread(target=worker)
        t.start()
        t.join()
        assert npu.current_device() == 0
    assert results == ["refused", (3, "cpu"), 0]


def test_par_compile_under_the_shim_pins_workers_to_the_callers_device():
    seen = []
    with npu_shim.npu_on_cpu() as npu:
        from deep_gemm.testing.par_compile import par_compile

        with npu.device(2):
            par_compile([lambda: seen.append((npu.current_device(), torch.zeros(1, device="npu").device.type))
                         for _ in range(4)], max_workers=2, progress=False)
    assert seen == [(2, "cpu")] * 4


def test_a_second_install_is_refused():
    with npu_shim.npu_on_cpu():
        with pytest.raises(RuntimeError, match="already installed"):
            npu_shim.install()
    assert npu_shim.installed() is None


def test_command_line_runs_a_script_unchanged(tmp_path):
    script = tmp_path / "client.py"
    script.write_text(textwrap.dedent("""
        import sys
        import torch
        import torch_npu  # noqa: F401
        import deep_gemm
        from deep_gemm.testing.bench import bench_msprof

        a = torch.randn((64, 128), dtype=torch.bfloat16, device="npu")
        b = torch.randn((32, 128), dtype=torch.bfloat16, device="npu")
        d = torch.empty((64, 32), dtype=torch.float32, device="npu")
        deep_gemm.bf16_gemm_nt(a, b, d)
        torch.npu.synchronize()
        ref = a.float() @ b.float().T
        assert torch.allclose(d, ref, rtol=1e-5, atol=1e-4)
        prof = bench_msprof(lambda: deep_gemm.bf16_gemm_nt(a, b, d), kernel_names="gemm_impl", num_tests=2)
        print("ok", sys.argv[1:], hasattr(deep_gemm, "fp8_mqa_logits"), prof.dur_us > 0)
    """))
    out = subprocess.run([sys.executable, "-m", "deepgemm_ref.testing.npu_shim", str(script), "x"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok ['x'] False True"


def test_aliasing_leaves_the_package_attributes_alone():
    """deepgemm_ref.testing.bench is DeepGEMM's function bench; importing its module through the
    deep_gemm alias must not rebind the attribute to the module."""
    bench_fn = dg.testing.bench
    with npu_shim.npu_on_cpu():
        import deep_gemm.testing.bench  # noqa: F401
        from deep_gemm.testing.bench import bench_msprof  # noqa: F401
    assert dg.testing.bench is bench_fn and callable(dg.testing.bench)
