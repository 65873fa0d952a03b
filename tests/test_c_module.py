"""deepgemm_ref._C: the helpers DeepGEMM and DeepGEMM-Ascend keep in their extension module."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import deepgemm_ref as dg
from deepgemm_ref import formats as fm

from . import reference as ref

BF16 = ml_dtypes.bfloat16


def _rand(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32).astype(BF16)


def test_bmm_equal_per_batch_dense_gemms():
    with dg.numerics(arch="ascend950"):
        a, b = _rand((3, 12, 96), 1), _rand((3, 10, 96), 2)
        d = np.zeros((3, 12, 10), np.float32)
        dg._C.bf16_bmm(a, b, d)
        for i in range(3):
            di = np.zeros((12, 10), np.float32)
            dg.bf16_gemm_nt(a[i], b[i], di)
            assert np.array_equal(d[i], di)
        qa = [dg.per_token_cast_to_fp8(a[i], use_ue8m0=True, gran_k=32) for i in range(3)]
        qb = [dg.per_token_cast_to_fp8(b[i], use_ue8m0=True, gran_k=32) for i in range(3)]
        pa = (np.stack([q[0] for q in qa]), np.stack([q[1] for q in qa]))
        pb = (np.stack([q[0] for q in qb]), np.stack([q[1] for q in qb]))
        d8 = np.zeros((3, 12, 10), BF16)
        dg._C.fp8_bmm(pa, pb, d8)
        for i in range(3):
            vals_a = ref.dequant(qa[i][0].view(np.uint8), qa[i][1], 32, fm.E4M3)
            vals_b = ref.dequant(qb[i][0].view(np.uint8), qb[i][1], 32, fm.E4M3)
            assert np.array_equal(d8[i].view(np.uint16), ref.ref_gemm(vals_a, vals_b, fm.BF16))


def test_jit_controls_and_profile_gating():
    with dg.numerics(arch="ascend950"):
        dg._C.set_dry_run(True)
        assert dg._C.get_dry_run() is True
        dg._C.set_dry_run(False)
        jit = dg._C.get_jit()
        assert dg._C.npu_sleep(10, marker=1) is None and isinstance(jit, dg._C.Runtime) and dg._C.get_jit() is jit
        with pytest.raises(TypeError, match="No constructor"):
            dg._C.Runtime()
        assert dg._C.init("0.1.0", "/tmp") is None and dg._C._mega_moe_block_n == 256
    assert not hasattr(dg._C, "set_dry_run") and not hasattr(dg._C, "Runtime")  # DeepGEMM's _C has neither
    with pytest.raises(dg.DGArgumentError, match="not provided"):
        vars(dg._C)["set_dry_run"](True)
    assert dg._C.init("/lib", "/cuda") is None


def test_raw_mega_moe_bindings_raise_not_implemented_with_the_reason():
    for arch, n in (("sm100", 15), ("ascend950", 19)):
        with dg.numerics(arch=arch):
            with pytest.raises(NotImplementedError, match="sym_buffer_ptrs"):
                dg._C.fp8_fp4_mega_moe(*([None] * n))
    with pytest.raises(NotImplementedError, match="bf16_mega_moe"):
        dg._C.bf16_mega_moe(*([None] * 14))
    with dg.numerics(arch="ascend950"), pytest.raises(dg.DGArgumentError, match="no BF16 Mega MoE"):
        vars(dg._C)["bf16_mega_moe"](*([None] * 14))


def test_ascend_c_symm_buffer_leases_zero_filled_memory_and_reuses_it():
    with dg.numerics(arch="ascend950"):
        a = dg._C.SymmBuffer(0, 2, "test-group-lease", 4096)
        assert a.buffer.dtype == np.int8 and a.buffer.shape == (4096,) and not a.buffer.any()
        ptrs = a.buffer_ptrs
        assert ptrs[0] == a.buffer.__array_interface__["data"][0] and ptrs[1] == 0
        a.buffer[:10] = 7
        b = dg._C.SymmBuffer(1, 2, "test-group-lease", 1024)
        assert b.buffer_ptrs == [ptrs[0], b.buffer.__array_interface__["data"][0]]
        again = dg._C.SymmBuffer(0, 2, "test-group-lease", 2048)  # the pool reuses the lease, zero-filled
        assert again.buffer_ptrs[0] == ptrs[0] and again.buffer.shape == (2048,) and not again.buffer.any()
        with pytest.raises(dg.DGArgumentError, match="rank_idx"):
            dg._C.SymmBuffer(2, 2, "test-group-lease", 16)
    with pytest.raises(dg.DGArgumentError, match="not provided by DeepGEMM 2.6.1"):
        vars(dg._C)["SymmBuffer"](0, 1, "g", 16)


def test_dry_run_checks_arguments_and_leaves_outputs_untouched():
    """Port 1.2: with _C.set_dry_run(True) entry points return without launching, outputs untouched;
    argument errors are still raised (they come from the same checks)."""
    bf = ml_dtypes.bfloat16
    a, b = np.ones((4, 64), bf), np.ones((8, 64), bf)
    with dg.numerics(arch="ascend950"):
        try:
            dg._C.set_dry_run(True)
            d = np.full((4, 8), 3.0, np.float32)
            dg.bf16_gemm_nt(a, b, d)
            dg.bf16_gemm_nt(a, b, d, c=d)  # c is d: the alias survives the copies
            assert np.all(d == 3.0)
            with pytest.raises(dg.DGArgumentError, match="d"):
                dg.bf16_gemm_nt(a, b, np.zeros((4, 9), np.float32))
        finally:
            dg._C.set_dry_run(False)
        dg.bf16_gemm_nt(a, b, d)
        assert np.all(d == 64.0)


def test_ascend_home_constant():
    """DeepGEMM-Ascend exports ASCEND_HOME (port 1.1): the toolkit path from the environment."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, ASCEND_HOME_PATH="/opt/cann-9.20")
    code = "import deepgemm_ref as dg; dg.set_arch('ascend950'); print(dg.ASCEND_HOME)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "/opt/cann-9.20" and isinstance(vars(dg)["ASCEND_HOME"], str)
