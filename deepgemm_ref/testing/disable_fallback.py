"""DeepGEMM-Ascend's ``deep_gemm.testing.disable_fallback``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

__all__ = ["disable_cpu_fallback"]


@contextlib.contextmanager
def disable_cpu_fallback(allow: Any = None) -> Iterator[None]:
    """On the device this makes torch_npu raise instead of falling back to the CPU; here
    everything runs on the CPU by design, so the context does nothing."""
    yield
