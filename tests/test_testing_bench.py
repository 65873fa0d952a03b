"""deepgemm_ref.testing.bench: DeepGEMM-Ascend's bench_msprof / KernelProfile / close_persistent_profiler /
suppress_stdout_stderr(suppress), and DeepGEMM's bench helpers, on the CPU."""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import types

import ml_dtypes
import numpy as np
import pytest

import deepgemm_ref as dg
from deepgemm_ref import api, names
from deepgemm_ref import testing as T
from deepgemm_ref.testing.bench import KernelProfile, bench_msprof, close_persistent_profiler, suppress_stdout_stderr

BF16 = ml_dtypes.bfloat16


class _Clock:
    """perf_counter_ns advancing by ``step`` per reading: every timed call lasts ``step`` ns."""

    def __init__(self, step: int) -> None:
        self.t, self.step = 0, step

    def perf_counter_ns(self) -> int:
        self.t += self.step
        return self.t


@pytest.fixture
def clock(monkeypatch):
    c = _Clock(500)
    monkeypatch.setattr(api, "time", types.SimpleNamespace(perf_counter_ns=c.perf_counter_ns))
    return c


def _gemm_inputs():
    x = np.random.default_rng(1).standard_normal((64, 128)).astype(np.float32)
    a = dg.per_token_cast_to_fp8(x, use_ue8m0=True, gran_k=32)
    b = dg.per_token_cast_to_fp8(x[:32], use_ue8m0=True, gran_k=32)
    return a, b, np.zeros((64, 32), BF16)


def test_kernel_profile_has_deepgemm_ascends_fields_and_arithmetic():
    ref = next(e for e in names.reference_entries("deepgemm-ascend") if e.name == "KernelProfile")
    fields = [(f.name, None if f.default is dataclasses.MISSING else repr(f.default))
              for f in dataclasses.fields(KernelProfile)]
    assert fields == [(p["name"], p["default"]) for p in ref.params]
    p = KernelProfile(2000.0)
    assert p.dur_us == 2.0 and p.tflops(4e6) == 2.0 and p.gbps(1e6) == 500.0
    assert repr(KernelProfile(1500.0, aic_mad=0.25, aic_total_cycles=7)) == \
        "KernelProfile(1.5us, mad=25.0%, aic_cycles=7)"


def test_bench_msprof_profiles_each_kernel_by_its_device_name(clock):
    a, b, d = _gemm_inputs()
    calls = []

    def fn():
        calls.append(1)
        dg.fp8_fp4_gemm_nt(a, b, d)
        dg.fp8_fp4_gemm_nt(a, b, d)
        dg._C.bf16_bmm(np.ones((1, 4, 64), BF16), np.ones((1, 8, 64), BF16), np.zeros((1, 4, 8), np.float32))

    with dg.numerics(arch="ascend950"):
        prof = bench_msprof(fn, "gemm_impl (fp8", num_warmups=2, num_tests=5)
        assert len(calls) == 7
        assert isinstance(prof, KernelProfile) and prof.dur_ns == 500.0  # per call, averaged over 10 calls
        assert prof.aic_total_cycles == 0 and prof.aiv_total_cycles == 0
        assert all(math.isnan(getattr(prof, f)) for f in ("aic_mad", "aic_scalar", "aic_mte1", "aic_mte2", "aic_mte3",
                                                          "aic_fixpipe", "aiv_vec", "aiv_scalar", "aiv_mte2",
                                                          "aiv_mte3"))
        everything = bench_msprof(fn, return_all_kernels=True, num_warmups=0, num_tests=1)
        # bf16_bmm calls einsum (a public function) inside: one kernel, named for the outer call
        assert sorted(everything) == ["bf16_gemm_impl (bf16_bmm)", "fp8_gemm_impl (fp8_fp4_gemm_nt)"]
        found = bench_msprof(fn, ["fp8_fp4_gemm_nt", "bf16_gemm_impl", "mqa_logits"], num_warmups=0, num_tests=1)
        assert found[0] is not None and found[1] is not None and found[2] is None
        with pytest.raises(RuntimeError, match="No unique kernel matching 'gemm_impl':\n  - "):
            bench_msprof(fn, "gemm_impl", num_warmups=0, num_tests=1)
        with pytest.raises(RuntimeError, match="No unique kernel matching 'mqa'"):
            bench_msprof(fn, "mqa", num_warmups=0, num_tests=1)
    x = np.ones((4, 64), BF16)
    with dg.numerics(arch="sm100"):  # DeepGEMM's kernels are named by their public names
        assert sorted(bench_msprof(lambda: dg.bf16_gemm_nt(x, x, np.zeros((4, 4), np.float32)),
                                   return_all_kernels=True, num_warmups=0, num_tests=1)) == ["bf16_gemm_nt"]


def test_bench_msprof_arguments(monkeypatch):
    with pytest.raises(dg.DGArgumentError, match="kernel_names"):
        bench_msprof(lambda: None)
    with pytest.raises(ValueError, match="backend"):
        bench_msprof(lambda: None, "x", backend="cupti")
    with pytest.raises(ValueError, match="num_tests"):
        bench_msprof(lambda: None, "x", num_tests=0)
    with pytest.raises(ValueError, match="num_warmups"):
        bench_msprof(lambda: None, "x", num_warmups=-1)
    hits = []
    for backend in ("slow", "fast", "persistent"):
        assert bench_msprof(lambda: None, return_all_kernels=True, num_warmups=0, num_tests=3, barrier_comm_profiling=True,
                            barrier=lambda: hits.append(1), backend=backend) == {}
    assert len(hits) == 9
    monkeypatch.setenv("EP_DISABLE_BARRIER_PROFILING", "1")
    bench_msprof(lambda: None, return_all_kernels=True, num_tests=3, barrier_comm_profiling=True,
                 barrier=lambda: hits.append(1))
    assert len(hits) == 9
    assert close_persistent_profiler() is None and close_persistent_profiler() is None


def test_suppress_stdout_stderr_both_forms(capfd):
    with suppress_stdout_stderr(True):
        os.write(1, b"fd1 ")
        os.write(2, b"fd2 ")
        print("py", flush=True)
        sys.stderr.write("py2")
    with suppress_stdout_stderr(False):
        os.write(1, b"shown")
    with T.suppress_stdout_stderr():  # DeepGEMM's argument-less class
        os.write(1, b"hidden")
    out, err = capfd.readouterr()
    assert out == "shown" and err == ""


def test_module_and_flat_names():
    import importlib

    bench_module = importlib.import_module("deepgemm_ref.testing.bench")
    assert isinstance(bench_module, types.ModuleType) and bench_module.bench_msprof is bench_msprof
    assert T.bench is bench_module.bench  # DeepGEMM's star import shadows the module by the function
    assert T.bench.bench_msprof is bench_msprof and T.bench.suppress_stdout_stderr is suppress_stdout_stderr
    assert T.bench_msprof is bench_msprof and T.KernelProfile is KernelProfile
    assert T.close_persistent_profiler is close_persistent_profiler
    assert T.bench(lambda: None, num_warmups=0, num_tests=2) >= 0


@pytest.mark.parametrize("backend", ["slow", "fast", "persistent"])
def test_a_failing_profile_propagates_and_leaves_the_environment_alone(backend, monkeypatch):
    """DeepGEMM-Ascend's profiler points ASCEND_WORK_PATH at a temporary directory and puts the
    caller's value back when the profiled function fails; here nothing is redirected at all."""
    for value in ("/caller/work", None):
        if value is None:
            monkeypatch.delenv("ASCEND_WORK_PATH", raising=False)
        else:
            monkeypatch.setenv("ASCEND_WORK_PATH", value)

        def fail():
            raise RuntimeError("profile failure")

        with pytest.raises(RuntimeError, match="profile failure"):
            bench_msprof(fail, "kernel", num_warmups=0, num_tests=1, flush_l2=False, backend=backend,
                         suppress_verbose_output=False)
        assert os.environ.get("ASCEND_WORK_PATH") == value
