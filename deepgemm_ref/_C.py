"""``deepgemm_ref._C``: the public helpers that DeepGEMM and DeepGEMM-Ascend keep in their
compiled extension, with each target's signature (see ``api.profiled``).

JIT and device controls (``init``, ``set_dry_run``, ``get_dry_run``, ``npu_sleep``, ``get_jit``)
are recorded or do nothing: there is no compiler and no device.
"""

from __future__ import annotations

from typing import Any

from .api import profiled

__all__ = ["init", "set_dry_run", "get_dry_run", "npu_sleep", "get_jit", "_mega_moe_block_n"]

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
