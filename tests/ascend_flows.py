"""What the drop-in tests of DeepGEMM-Ascend's flows share (tests/test_dropin_ascend_*.py).

``npu``: the shim for one test (``torch.npu`` on the CPU, ``deep_gemm`` this package, ascend950);
``deep_gemm()``: the aliased package, as DeepGEMM-Ascend's tests import it; ``calc_diff``: the
similarity metric of their tolerances; ``meta``: a ``device='meta'`` twin of a tensor (or a
tuple of them) with the same shape, strides and dtype, as their compile step uses.
"""

from __future__ import annotations

from typing import Any

import pytest

from deepgemm_ref.testing import npu_shim


@pytest.fixture(autouse=True)
def npu() -> Any:
    with npu_shim.npu_on_cpu() as shim:
        yield shim


def deep_gemm() -> Any:
    import deep_gemm as dg  # the shim's alias of deepgemm_ref

    return dg


def calc_diff(x: Any, y: Any) -> float:
    x, y = x.double(), y.double()
    denominator = (x * x + y * y).sum()
    return 0.0 if denominator == 0 else float(1 - 2 * (x * y).sum() / denominator)


def meta(x: Any) -> Any:
    import torch

    if isinstance(x, tuple):
        return tuple(meta(v) for v in x)
    if x is None:
        return None
    return torch.empty_strided(tuple(x.shape), tuple(x.stride()), dtype=x.dtype, device="meta")
