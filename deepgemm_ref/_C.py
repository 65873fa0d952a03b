"""``deepgemm_ref._C``: the public helpers that DeepGEMM and DeepGEMM-Ascend keep in their
compiled extension, with each target's signature (see ``api.profiled``).

JIT and device controls (``init``, ``set_dry_run``, ``get_dry_run``, ``npu_sleep``, ``get_jit``)
are recorded or do nothing: there is no compiler and no device.
"""

from __future__ import annotations

from typing import Any

from .api import profiled

__all__ = ["init", "set_dry_run", "get_dry_run", "npu_sleep", "get_jit", "fp8_bmm", "bf16_bmm", "_mega_moe_block_n"]

_ASCEND_ONLY = {"deepgemm": "a DeepGEMM-Ascend _C addition that DeepGEMM 2.6.1 does not export"}
_state = {"dry_run": False}


def _init_cuda(library_root_path: str, cuda_home_path_by_python: str, /) -> None:
    """DeepGEMM's one-time JIT set-up: nothing to set up here."""
    return None


def _init_ascend(version: str, library_root_path: str, /) -> None:
    """DeepGEMM-Ascend's lazy JIT set-up: nothing to set up here."""
    return None


def _set_dry_run(value: bool, /) -> None:
    """Record the dry-run flag (DeepGEMM-Ascend compiles without launching; no effect here)."""
    _state["dry_run"] = bool(value)


def _get_dry_run() -> bool:
    """The recorded dry-run flag."""
    return bool(_state["dry_run"])


def _npu_sleep(sleep_cycles: int, *, marker: int = 0) -> None:
    """A device-side sleep used by DeepGEMM-Ascend's benchmarks: nothing to do on the CPU."""
    return None


def _get_jit() -> Any:
    """DeepGEMM-Ascend's JIT runtime object; the emulator has none (returns None)."""
    return None


init = profiled("init", deepgemm=_init_cuda, deepgemm_ascend=_init_ascend)
set_dry_run = profiled("set_dry_run", _ASCEND_ONLY, deepgemm_ascend=_set_dry_run)
get_dry_run = profiled("get_dry_run", _ASCEND_ONLY, deepgemm_ascend=_get_dry_run)
npu_sleep = profiled("npu_sleep", _ASCEND_ONLY, deepgemm_ascend=_npu_sleep)
get_jit = profiled("get_jit", _ASCEND_ONLY, deepgemm_ascend=_get_jit)
#: BLOCK_N of DeepGEMM-Ascend's Mega MoE (256-row weight blocks).
_mega_moe_block_n = 256


def _fp8_bmm(a: Any, b: Any, d: Any, c: Any = None, recipe: Any = (1, 1, 32), compiled_dims: str = "nk",
             epilogue: Any = None) -> None:
    """DeepGEMM-Ascend's batched FP8 GEMM behind ``fp8_einsum``: d[i] = c[i] + A[i] @ B[i]^T.

    a = (A (batch, M, K) e4m3 or packed FP4, sfa (batch, M, K/32 or K/64 int16)), b likewise with
    N; d (batch, M, N) bf16 / float32, or e4m3 with an ``FP8Quantization`` epilogue.  Computed as
    ``fp8_einsum('bhr,hdr->bhd', ...)`` on transposed views (batch as the ``h`` axis).
    """
    from .einsum import fp8_einsum
    from .interop import to_numpy

    def t(x: Any) -> Any:
        x = to_numpy(x, "fp8_bmm", "operand")
        return None if x is None else x.swapaxes(0, 1)

    a_t = (t(a[0]), t(a[1])) if isinstance(a, (tuple, list)) else a
    d_t = (t(d[0]), d[1]) if isinstance(d, (tuple, list)) else t(d)
    c_t = None if c is None else t(c)
    fp8_einsum("bhr,hdr->bhd", a_t, b, d_t, c=c_t, recipe=recipe, epilogue=epilogue)


def _bf16_bmm(a: Any, b: Any, d: Any, c: Any = None, compiled_dims: str = "nk", epilogue: Any = None) -> None:
    """DeepGEMM-Ascend's batched BF16 GEMM behind ``einsum``: d[i] = c[i] + A[i] @ B[i]^T.

    a (batch, M, K), b (batch, N, K) bf16; d (batch, M, N) bf16 or float32.  Computed as
    ``einsum('bhr,hdr->bhd', ...)`` on transposed views (batch as the ``h`` axis).
    """
    from .einsum import einsum
    from .interop import to_numpy

    def t(x: Any) -> Any:
        return None if x is None else to_numpy(x, "bf16_bmm", "operand").swapaxes(0, 1)

    einsum("bhr,hdr->bhd", t(a), b, t(d), c=t(c), epilogue=epilogue)


fp8_bmm = profiled("fp8_bmm", _ASCEND_ONLY, deepgemm_ascend=_fp8_bmm)
bf16_bmm = profiled("bf16_bmm", _ASCEND_ONLY, deepgemm_ascend=_bf16_bmm)
