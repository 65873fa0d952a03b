"""Drop-in scripts for the dense GEMMs, written the way DeepGEMM's and DeepGEMM-Ascend's tests are.

Torch tensors, inputs made with ``deep_gemm.utils``, a kernel call writing into an output tensor,
``calc_diff`` against a reference.  The module is the ``deep_gemm`` fixture of deepgemm_ref's
pytest plugin: this file runs against the emulator, or unchanged against the real library with
``--dg-backend real`` (each test variant for another arch than the device's is skipped).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the drop-in scripts use torch tensors, like DeepGEMM's tests")
pytestmark = pytest.mark.torch



def _randn(*shape, dtype=torch.bfloat16):
    return torch.randn(shape, dtype=torch.float32).to(dtype)


def _fp8_case(deep_gemm, m, n, k, use_ue8m0, block_b, accumulate, out_dtype):
    per_token_cast_to_fp8, per_block_cast_to_fp8 = deep_gemm.utils.per_token_cast_to_fp8, deep_gemm.utils.per_block_cast_to_fp8
    a = _randn(m, k)
    b = _randn(n, k)
    d = _randn(m, n, dtype=out_dtype) * 32 if accumulate else torch.empty((m, n), dtype=out_dtype)
    c = d if accumulate else None
    ref_d = (a.float() @ b.float().t() + (c.float() if accumulate else 0)).to(out_dtype)
    a_fp8 = per_token_cast_to_fp8(a, use_ue8m0=use_ue8m0)
    b_fp8 = per_block_cast_to_fp8(b, use_ue8m0=use_ue8m0) if block_b else per_token_cast_to_fp8(b, use_ue8m0=use_ue8m0)
    return a_fp8, b_fp8, c, d, ref_d


@pytest.mark.parametrize("dg_arch", ["sm90", "sm100"])
@pytest.mark.parametrize("m,n,k", [(1, 256, 512), (128, 192, 384), (64, 576, 256)])
def test_fp8_gemm_like_deepgemm(deep_gemm, dg_arch, m, n, k):
    calc_diff, count_bytes, get_arch_major = (deep_gemm.testing.calc_diff, deep_gemm.testing.count_bytes,
                                              deep_gemm.testing.get_arch_major)
    torch.manual_seed(0)
    use_ue8m0 = get_arch_major() == 10
    for accumulate, out_dtype in ((False, torch.bfloat16), (True, torch.float)):
        if get_arch_major() == 9 and accumulate:
            a, b, c, d, ref_d = _fp8_case(deep_gemm, m, n, k, use_ue8m0, False, accumulate, out_dtype)
            deep_gemm.fp8_gemm_nt(a, b, d, c=c, recipe=(1, 1, 128), disable_ue8m0_cast=not use_ue8m0)
        else:
            a, b, c, d, ref_d = _fp8_case(deep_gemm, m, n, k, use_ue8m0, not accumulate, accumulate, out_dtype)
            deep_gemm.fp8_gemm_nt(a, b, d, c=c, disable_ue8m0_cast=not use_ue8m0)
        diff = calc_diff(d, ref_d)
        assert diff < 0.001, f"{dg_arch=}, {m=}, {n=}, {k=}, {accumulate=}, {diff:.5f}"
        assert count_bytes(a, b, d) > 0


@pytest.mark.parametrize("dg_arch", ["sm100"])
def test_fp8_fp4_gemm_layout_aliases_like_deepgemm(deep_gemm, dg_arch):
    u, calc_diff = deep_gemm.utils, deep_gemm.testing.calc_diff
    torch.manual_seed(1)
    m, n, k = 128, 256, 512
    a = _randn(m, k)
    b = _randn(n, k)
    ref_d = (a.float() @ b.float().t()).to(torch.bfloat16)
    a_fp8 = u.per_token_cast_to_fp8(a, use_ue8m0=True, gran_k=128)
    b_fp4 = u.per_token_cast_to_fp4(b, use_ue8m0=True, gran_k=32)
    d = torch.empty((m, n), dtype=torch.bfloat16)
    deep_gemm.fp8_fp4_gemm_nt(a_fp8, b_fp4, d, recipe_a=(1, 128), recipe_b=(1, 32))
    assert calc_diff(d, ref_d) < 0.01
    # B MN-major: the transposed packed storage, passed in the NN layout as (K, N // 2)
    b_t = (u.transpose_packed_fp4(b_fp4[0]), b_fp4[1].T)
    d2 = torch.empty((m, n), dtype=torch.bfloat16)
    deep_gemm.fp8_fp4_gemm_nn(a_fp8, b_t, d2, recipe_a=(1, 128), recipe_b=(1, 32))
    assert torch.equal(d, d2)


@pytest.mark.parametrize("dg_arch", ["sm100"])
def test_bf16_and_cublaslt_like_deepgemm(deep_gemm, dg_arch):
    calc_diff = deep_gemm.testing.calc_diff
    torch.manual_seed(2)
    m, n, k = 96, 128, 256
    a, b = _randn(m, k), _randn(n, k)
    d = torch.empty((m, n), dtype=torch.bfloat16)
    deep_gemm.bf16_gemm_nt(a, b, d)
    ref_d = (a.float() @ b.float().t()).to(torch.bfloat16)
    assert calc_diff(d, ref_d) < 1e-5
    c = _randn(m, n, dtype=torch.float) * 32
    d32 = c.clone()
    deep_gemm.cublaslt_gemm_nt(a, b, d32, c=d32)
    assert calc_diff(d32, a.float() @ b.float().t() + c) < 6e-7
    d_tt = torch.empty((m, n), dtype=torch.bfloat16)
    deep_gemm.bf16_gemm_tt(a.T.contiguous(), b, d_tt)  # TT: A given as (K, M), B as (N, K)
    assert torch.equal(d, d_tt)


@pytest.mark.parametrize("dg_arch", ["ascend950"])
def test_ascend_style_alpha_epilogue_per32(deep_gemm, dg_arch):
    """DeepGEMM-Ascend style: per-32 UE8M0 scales (recipe default (1, 1, 32)), alpha, epilogues,
    int16 packed scales from transform_sf_into_required_layout, c accumulated in place."""
    # (DeepGEMM-Ascend has no deep_gemm.utils: its casts are top-level names)
    per_token_cast_to_fp8, calc_diff = deep_gemm.per_token_cast_to_fp8, deep_gemm.testing.calc_diff
    torch.manual_seed(3)
    m, n, k = 64, 128, 320
    a, b = _randn(m, k), _randn(n, k)
    a_fp8 = per_token_cast_to_fp8(a, use_ue8m0=True, gran_k=32)
    b_fp8 = per_token_cast_to_fp8(b, use_ue8m0=True, gran_k=32)
    sfa = deep_gemm.transform_sf_into_required_layout(a_fp8[1], m, k, (1, 1, 32), is_sfa=True)
    sfb = deep_gemm.transform_sf_into_required_layout(b_fp8[1], n, k, (1, 1, 32), is_sfa=False)
    assert sfa.dtype == torch.int16
    d = torch.zeros((m, n), dtype=torch.float)
    deep_gemm.fp8_gemm_nt((a_fp8[0], sfa), (b_fp8[0], sfb), d, alpha=0.5)
    assert calc_diff(d, 0.5 * (a.float() @ b.float().t())) < 0.001
    c = _randn(m, n, dtype=torch.bfloat16)
    d2 = c.clone()
    deep_gemm.fp8_gemm_nt(a_fp8, b_fp8, d2, c=d2, epilogue=deep_gemm.epilogue.Alpha(2.0))
    assert calc_diff(d2, (2.0 * (a.float() @ b.float().t()) + c.float()).to(torch.bfloat16)) < 0.001
    d3 = torch.empty((m, n), dtype=torch.bfloat16)
    deep_gemm.bf16_gemm_nt(a, b, d3, epilogue=deep_gemm.epilogue.Identity())
    assert calc_diff(d3, (a.float() @ b.float().t()).to(torch.bfloat16)) < 1e-5
    assert deep_gemm.get_num_sms() == 32 and deep_gemm.get_npu_arch() == 3510
