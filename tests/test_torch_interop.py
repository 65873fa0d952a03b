"""Torch CPU tensors: same bytes as NumPy, results of the caller's kind, and agreement with the
algorithm run by torch itself (the reason the division option exists)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import deepgemm_ref as dg

torch = pytest.importorskip("torch", reason="torch is not installed; interop tests need it")
pytestmark = pytest.mark.torch

from . import torch_reference as tref  # noqa: E402


def _np(t):
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    if t.dtype == torch.float8_e4m3fn:
        return t.view(torch.uint8).numpy()
    return t.numpy()


SHAPES = [(64, 7168), (33, 1000), (128, 4096), (7, 96)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("scale", [1.0, 1e-3, 300.0])
@pytest.mark.parametrize("use_ue8m0", [False, True])
@pytest.mark.parametrize("division", ["cpu", "cuda"])
def test_fp8_matches_torch_algorithm(shape, scale, use_ue8m0, division):
    g = torch.Generator().manual_seed(hash((shape, scale)) % 2**31)
    x = (torch.randn(shape, generator=g) * scale).to(torch.bfloat16)
    for gran_k in (32, 128):
        qt, st = tref.per_token_cast_to_fp8(x, use_ue8m0, gran_k, division)
        with dg.numerics(scale_division=division):
            qn, sn = dg.per_token_cast_to_fp8(_np(x), use_ue8m0=use_ue8m0, gran_k=gran_k)
        assert np.array_equal(qn.view(np.uint8), qt.view(torch.uint8).numpy())
        assert np.array_equal(sn.view(np.uint32), st.numpy().view(np.uint32))


@pytest.mark.parametrize("shape", [s for s in SHAPES if s[1] % 2 == 0])
@pytest.mark.parametrize("scale", [1.0, 1e-3, 300.0])
@pytest.mark.parametrize("use_ue8m0", [False, True])
@pytest.mark.parametrize("division", ["cpu", "cuda"])
def test_fp4_matches_torch_algorithm(shape, scale, use_ue8m0, division):
    g = torch.Generator().manual_seed(hash((shape, scale, 4)) % 2**31)
    x = (torch.randn(shape, generator=g) * scale).to(torch.bfloat16)
    for gran_k in (32, 128):
        pt, st = tref.per_token_cast_to_fp4(x, use_ue8m0, gran_k, division)
        with dg.numerics(scale_division=division):
            pn, sn = dg.per_token_cast_to_fp4(_np(x), use_ue8m0=use_ue8m0, gran_k=gran_k)
        assert np.array_equal(pn, pt.numpy())
        assert np.array_equal(sn.view(np.uint32), st.numpy().view(np.uint32))


def test_float32_and_float64_inputs_match_torch():
    g = torch.Generator().manual_seed(5)
    for dtype in (torch.float32, torch.float64):
        x = torch.randn((16, 300), generator=g, dtype=dtype) * 7
        qt, st = tref.per_token_cast_to_fp8(x, False, 128, "cpu")
        with dg.numerics(scale_division="cpu"):
            qn, sn = dg.per_token_cast_to_fp8(x.numpy(), use_ue8m0=False)
        assert np.array_equal(qn.view(np.uint8), qt.view(torch.uint8).numpy())
        assert np.array_equal(sn, st.numpy())
        pt, s4 = tref.per_token_cast_to_fp4(x, True, 32, "cpu")
        pn, s4n = dg.per_token_cast_to_fp4(x.numpy(), use_ue8m0=True, gran_k=32)
        assert np.array_equal(pn, pt.numpy()) and np.array_equal(s4n, s4.numpy())


def test_utilities_accept_and_return_tensors():
    x = torch.randn((8, 256)).to(torch.bfloat16)
    q, sf = dg.per_token_cast_to_fp8(x, use_ue8m0=True, gran_k=32, use_packed_ue8m0=True)
    assert isinstance(q, torch.Tensor) and q.dtype == torch.float8_e4m3fn and q.shape == (8, 256)
    assert isinstance(sf, torch.Tensor) and sf.dtype == torch.int32 and sf.shape == (8, 2)
    qn, sfn = dg.per_token_cast_to_fp8(_np(x), use_ue8m0=True, gran_k=32, use_packed_ue8m0=True)
    assert np.array_equal(q.view(torch.uint8).numpy(), qn.view(np.uint8))
    assert np.array_equal(sf.numpy(), sfn)
    p, s4 = dg.per_token_cast_to_fp4(x, use_ue8m0=True, gran_k=32)
    assert p.dtype == torch.int8 and s4.dtype == torch.float32
    back = dg.cast_back_from_fp4(p, s4, gran_k=32)
    assert isinstance(back, torch.Tensor) and back.dtype == torch.float32
    t = dg.transpose_packed_fp4(p)
    assert isinstance(t, torch.Tensor) and t.shape == (256, 4)
    c = dg.ceil_to_ue8m0(torch.tensor([0.3, 3.0]))
    assert isinstance(c, torch.Tensor) and c.tolist() == [0.5, 4.0]
    packed = dg.pack_ue8m0_to_int(torch.tensor([[1.0, 2.0, 4.0, 0.5]]))
    assert packed.dtype == torch.int32
    assert dg.unpack_ue8m0_from_int(packed).tolist() == [[1.0, 2.0, 4.0, 0.5]]
    qc, sc = dg.per_channel_cast_to_fp8(torch.randn(256, 4), use_ue8m0=False)
    assert isinstance(qc, torch.Tensor) and sc.shape == (2, 4)
    qb, sb = dg.per_block_cast_to_fp8(torch.randn(130, 4), use_ue8m0=False)
    assert qb.shape == (130, 4) and sb.shape == (2, 1)
    qd, sd = dg.per_custom_dims_cast_to_fp8(torch.randn(5, 64), (0,), False)
    assert qd.dtype == torch.float8_e4m3fn and sd.shape == (5,)


def test_testing_helpers_on_tensors():
    x = torch.randn(4, 5)
    d = dg.testing.calc_diff(x, x)
    assert isinstance(d, torch.Tensor) and d.dtype == torch.float64 and float(d) < 1e-15
    assert dg.testing.count_bytes(x, (x.to(torch.bfloat16), None)) == 4 * 5 * 4 + 4 * 5 * 2
    dg.testing.assert_bitwise_equal(x, x.clone())
    with pytest.raises(AssertionError, match="coord=\\(1, 2\\)"):
        y = x.clone()
        y[1, 2] += 1
        dg.testing.assert_bitwise_equal(x, y)


def test_importing_deepgemm_ref_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, deepgemm_ref, deepgemm_ref.testing, deepgemm_ref.cli; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"


def test_zero_dim_results_are_zero_dim_tensors():
    r = dg.ceil_to_ue8m0(torch.tensor(3.0))
    assert isinstance(r, torch.Tensor) and r.shape == () and r.item() == 4.0
    q, sf = dg.per_custom_dims_cast_to_fp8(torch.tensor(3.0), (), False)
    assert isinstance(q, torch.Tensor) and q.shape == () and q.dtype == torch.float8_e4m3fn
    assert isinstance(sf, torch.Tensor) and sf.shape == ()


def test_one_packed_row_has_deepgemm_strides():
    """A (1, mn) packed SF built as a transposed view gets the strides torch would give (mn, 1):
    DeepGEMM's check_k_grouped_packed_ue8m0_tensor asserts stride(0) == mn."""
    out = dg.get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(
        torch.ones(4, 8), torch.tensor([128], dtype=torch.int32), [128], 32, 128)
    assert out.shape == (1, 8) and out.stride() == (8, 1)
