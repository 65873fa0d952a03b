"""DeepGEMM's and DeepGEMM-Ascend's runtime settings, recorded with each target's validation.

None of these change a numeric result (DeepGEMM uses them for scheduling and JIT choices);
they are recorded so that code written for either library runs unchanged, and so that the
values that do shape outputs (``get_num_sms`` sizes the paged-MQA schedule, the contiguous-layout
alignment defines grouped layouts) behave as on the device.  The settings are process-global
and are saved and restored by ``deepgemm_ref.numerics(...)``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any

from . import dryrun
from ._state import Setting
from .api import profiled
from .errors import DGArgumentError
from .profiles import Profile

# --- generated from deepgemm_ref._exports.TABLE: do not edit by hand ---
__all__ = [
    "set_num_sms",
    "get_num_sms",
    "set_tc_util",
    "get_tc_util",
    "set_pdl",
    "get_pdl",
    "set_ignore_compile_dims",
    "set_block_size_multiple_of",
    "set_mk_alignment_for_contiguous_layout",
    "get_mk_alignment_for_contiguous_layout",
    "get_m_alignment_for_contiguous_layout",
    "get_k_alignment_for_contiguous_layout",
    "get_theoretical_mk_alignment_for_contiguous_layout",
    "set_npu_arch",
    "get_npu_arch",
    "use_deterministic_algorithms",
    "get_deterministic_algorithms",
    "get_library_root_path",
    "ASCEND_HOME",
    "ASCEND_NPU_ARCH",
    "set_dry_run",
    "get_dry_run",
    "num_sms",
    "current_mk_alignment",
    "reset_runtime",
    "runtime_state",
    "restore_runtime",
]
# --- end of generated block ---

#: CANN's Bisheng target for Ascend 950PR/950DT is ``dav-3510``; ``get_npu_arch()`` reports it.
ASCEND_NPU_ARCH = 3510


@dataclass(frozen=True)
class RuntimeState:
    num_sms: int = 0  # 0: the device's count
    tc_util: int = 0  # 0: default (get returns 100)
    pdl: bool = False
    ignore_compile_dims: bool = False
    block_size_multiple_of: tuple[int, int] = (1, 1)
    mk_alignment: int = 128  # DeepGEMM's stored value (DeepGEMM-Ascend: fixed 256)
    npu_arch: int = 0  # 0: query the device
    deterministic: bool = False


_runtime: Setting[RuntimeState] = Setting("runtime", RuntimeState())


def runtime_state() -> RuntimeState:
    """The recorded runtime settings."""
    return _runtime.get()


def _set(**changes: Any) -> None:
    _runtime.update(lambda state: replace(state, **changes))


def reset_runtime() -> None:
    """All runtime settings back to their defaults."""
    _runtime.reset()


def restore_runtime(state: RuntimeState) -> None:
    """Put back settings saved with :func:`runtime_state`."""
    _runtime.set(state)


def _int_arg(func: str, arg: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        try:
            import numpy as np

            if isinstance(v, np.integer):
                return int(v)
        except ImportError:  # pragma: no cover
            pass
        raise DGArgumentError(f"{func}: {arg}: expected an int; got {type(v).__name__} {v!r}")
    return v


# --- SM count ------------------------------------------------------------------------------------

def _set_num_sms_cuda(profile: Profile, new_num_sms: int, /) -> None:
    """Record the SM count used for scheduling (0 means the device's count: 132 on sm90, 148 on sm100)."""
    n = _int_arg("set_num_sms", "new_num_sms", new_num_sms)
    dev = profile.device_num_sms
    if not 0 <= n <= dev:
        raise DGArgumentError(f"set_num_sms: new_num_sms: expected 0 <= n <= {dev} (the device's SM count); got {n}")
    _set(num_sms=n)


def _set_num_sms_ascend(profile: Profile, n: int, /) -> None:
    """Record the AI-core count used for scheduling (1..32 on Ascend 950; 0 is rejected)."""
    n = _int_arg("set_num_sms", "n", n)
    dev = profile.device_num_sms
    # DeepGEMM-Ascend rejects 0, which DeepGEMM accepts as "reset to the device count".
    if not 0 < n <= dev:
        raise DGArgumentError(f"set_num_sms: n: expected 0 < n <= {dev} (the device's AI-core count); got {n}")
    _set(num_sms=n)


def num_sms(profile: Profile) -> int:
    """The SM (AI-core) count in force for ``profile``: the recorded one, or the device's count
    when none was set (what the kernels' schedules use)."""
    return _runtime.get().num_sms or profile.device_num_sms


def _get_num_sms(profile: Profile, /) -> int:
    """The recorded SM (AI-core) count, or the device's count when none was set."""
    return num_sms(profile)


set_num_sms = profiled("set_num_sms", deepgemm=_set_num_sms_cuda, deepgemm_ascend=_set_num_sms_ascend)
get_num_sms = profiled("get_num_sms", deepgemm=_get_num_sms, deepgemm_ascend=_get_num_sms)

# --- DeepGEMM-only scheduling hints ---------------------------------------------------------------

_CUDA_ONLY = {"deepgemm-ascend": "a CUDA scheduling hint that DeepGEMM-Ascend does not export"}


def _set_tc_util(new_tc_util: int, /) -> None:
    """Record the tensor-core utilisation hint (0..100; 0 means the default)."""
    v = _int_arg("set_tc_util", "new_tc_util", new_tc_util)
    if not 0 <= v <= 100:
        raise DGArgumentError(f"set_tc_util: new_tc_util: expected 0..100; got {v}")
    _set(tc_util=v)


def _get_tc_util() -> int:
    """The tensor-core utilisation hint (100 when unset)."""
    return _runtime.get().tc_util or 100


def _set_pdl(new_enable_pdl: bool, /) -> None:
    """Record the programmatic-dependent-launch flag (no numeric effect)."""
    _set(pdl=bool(new_enable_pdl))


def _get_pdl() -> bool:
    """The programmatic-dependent-launch flag (default False)."""
    return _runtime.get().pdl


def _set_ignore_compile_dims(new_value: bool, /) -> None:
    """Record whether GEMMs ignore ``compiled_dims`` (no numeric effect; no getter, as in DeepGEMM)."""
    _set(ignore_compile_dims=bool(new_value))


def _set_block_size_multiple_of(new_value: int | tuple[int, int], /) -> None:
    """Record the block-size multiple (an int for both M and N, or ``(m_mult, n_mult)``)."""
    if isinstance(new_value, tuple):
        if len(new_value) != 2:
            raise DGArgumentError(
                f"set_block_size_multiple_of: new_value: expected an int or a 2-tuple; got {new_value!r}"
            )
        pair = (_int_arg("set_block_size_multiple_of", "new_value[0]", new_value[0]),
                _int_arg("set_block_size_multiple_of", "new_value[1]", new_value[1]))
    else:
        v = _int_arg("set_block_size_multiple_of", "new_value", new_value)
        pair = (v, v)
    if min(pair) <= 0:
        raise DGArgumentError(f"set_block_size_multiple_of: new_value: expected positive values; got {new_value!r}")
    _set(block_size_multiple_of=pair)


set_tc_util = profiled("set_tc_util", _CUDA_ONLY, deepgemm=_set_tc_util)
get_tc_util = profiled("get_tc_util", _CUDA_ONLY, deepgemm=_get_tc_util)
set_pdl = profiled("set_pdl", _CUDA_ONLY, deepgemm=_set_pdl)
get_pdl = profiled("get_pdl", _CUDA_ONLY, deepgemm=_get_pdl)
set_ignore_compile_dims = profiled("set_ignore_compile_dims", _CUDA_ONLY, deepgemm=_set_ignore_compile_dims)
set_block_size_multiple_of = profiled("set_block_size_multiple_of", _CUDA_ONLY, deepgemm=_set_block_size_multiple_of)

# --- contiguous-layout alignment ------------------------------------------------------------------

ASCEND_MK_ALIGNMENT = 256


def _set_mk_alignment_cuda(new_value: int, /) -> None:
    """Record the M/K segment alignment of grouped contiguous layouts (DeepGEMM stores any value)."""
    v = _int_arg("set_mk_alignment_for_contiguous_layout", "new_value", new_value)
    _set(mk_alignment=v)


def _set_mk_alignment_ascend(value: int, /) -> None:
    """DeepGEMM-Ascend's alignment is fixed at 256; any other value is rejected."""
    v = _int_arg("set_mk_alignment_for_contiguous_layout", "value", value)
    if v != ASCEND_MK_ALIGNMENT:
        raise DGArgumentError(
            f"set_mk_alignment_for_contiguous_layout: value: expected {ASCEND_MK_ALIGNMENT} "
            f"(fixed under DeepGEMM-Ascend); got {v}"
        )


def _get_mk_alignment_cuda() -> int:
    """The M/K segment alignment of grouped contiguous layouts (default 128)."""
    return _runtime.get().mk_alignment


def _get_mk_alignment_ascend() -> int:
    """The M/K segment alignment of grouped contiguous layouts: 256 under DeepGEMM-Ascend."""
    return ASCEND_MK_ALIGNMENT


def _theoretical_cuda(profile: Profile, /, expected_m: int | None = None) -> int:
    """The alignment DeepGEMM's kernels would pick: 128 on sm90; on sm100 224, shrunk by 32 while
    it stays above 32 and at least ``expected_m`` (the profile's ``theoretical_mk_alignment``)."""
    v, step = profile.rules.theoretical_mk_alignment
    if expected_m is not None and step:
        while v > 32 and v - step >= expected_m:
            v -= step
    return v


def _theoretical_ascend() -> int:
    """256: DeepGEMM-Ascend's grouped kernels use BLOCK_M = 256 (no ``expected_m`` parameter)."""
    return ASCEND_MK_ALIGNMENT


set_mk_alignment_for_contiguous_layout = profiled(
    "set_mk_alignment_for_contiguous_layout", deepgemm=_set_mk_alignment_cuda, deepgemm_ascend=_set_mk_alignment_ascend
)
get_mk_alignment_for_contiguous_layout = profiled(
    "get_mk_alignment_for_contiguous_layout", deepgemm=_get_mk_alignment_cuda, deepgemm_ascend=_get_mk_alignment_ascend
)
_ALIAS_MISSING = {"deepgemm-ascend": "a Python alias of DeepGEMM's utils that DeepGEMM-Ascend does not export"}
get_m_alignment_for_contiguous_layout = profiled(
    "get_m_alignment_for_contiguous_layout", _ALIAS_MISSING, deepgemm=_get_mk_alignment_cuda
)
get_k_alignment_for_contiguous_layout = profiled(
    "get_k_alignment_for_contiguous_layout", _ALIAS_MISSING, deepgemm=_get_mk_alignment_cuda
)
get_theoretical_mk_alignment_for_contiguous_layout = profiled(
    "get_theoretical_mk_alignment_for_contiguous_layout",
    deepgemm=_theoretical_cuda,
    deepgemm_ascend=_theoretical_ascend,
)


def current_mk_alignment(profile: Profile) -> int:
    """The contiguous-layout alignment in force for ``profile`` (fixed by the target, or the
    recorded ``set_mk_alignment_for_contiguous_layout`` value), for the kernels and layout helpers."""
    fixed = profile.rules.fixed_mk_alignment
    return _runtime.get().mk_alignment if fixed is None else fixed


# --- DeepGEMM-Ascend additions --------------------------------------------------------------------

_ASCEND_ONLY = {"deepgemm": "a DeepGEMM-Ascend addition that DeepGEMM 2.6.1 does not export"}


def _set_npu_arch(arch: int, /) -> None:
    """Record the NPU arch used for JIT compilation (stored without validation; 0 = query the device)."""
    _set(npu_arch=_int_arg("set_npu_arch", "arch", arch))


def _get_npu_arch() -> int:
    """The recorded NPU arch, else the emulated device's (3510, CANN's ``dav-3510`` for Ascend 950)."""
    return _runtime.get().npu_arch or ASCEND_NPU_ARCH


def _use_deterministic_algorithms(enabled: bool) -> None:
    """Record the deterministic-algorithms flag (the emulator is always deterministic)."""
    _set(deterministic=bool(enabled))


def _get_deterministic_algorithms() -> bool:
    """The deterministic-algorithms flag (default False)."""
    return _runtime.get().deterministic


#: DeepGEMM-Ascend's module constant: the CANN toolkit directory it found at import (from
#: ASCEND_HOME_PATH or ASCEND_TOOLKIT_HOME); "" when neither is set (the emulator needs none).
ASCEND_HOME: str = os.environ.get("ASCEND_HOME_PATH") or os.environ.get("ASCEND_TOOLKIT_HOME") or ""


def _get_library_root_path() -> str:
    """The package directory (DeepGEMM-Ascend returns its install root for the JIT)."""
    return os.path.dirname(os.path.abspath(__file__))


set_npu_arch = profiled("set_npu_arch", _ASCEND_ONLY, deepgemm_ascend=_set_npu_arch)
get_npu_arch = profiled("get_npu_arch", _ASCEND_ONLY, deepgemm_ascend=_get_npu_arch)
use_deterministic_algorithms = profiled(
    "use_deterministic_algorithms", _ASCEND_ONLY, deepgemm_ascend=_use_deterministic_algorithms
)
get_deterministic_algorithms = profiled(
    "get_deterministic_algorithms", _ASCEND_ONLY, deepgemm_ascend=_get_deterministic_algorithms
)
get_library_root_path = profiled("get_library_root_path", _ASCEND_ONLY, deepgemm_ascend=_get_library_root_path)


# --- DeepGEMM-Ascend's dry run (its ``_C.set_dry_run`` / ``_C.get_dry_run``) ----------------------

def _set_dry_run(value: bool, /) -> None:
    """DeepGEMM-Ascend's dry run: while set, every kernel entry point validates its arguments
    (raising the same errors) and returns without computing or writing anything; ``meta`` tensors
    are accepted as arguments (see :mod:`deepgemm_ref.dryrun`)."""
    dryrun.set_enabled(bool(value))


def _get_dry_run() -> bool:
    """The dry-run flag."""
    return dryrun.enabled()


set_dry_run = profiled("set_dry_run", _ASCEND_ONLY, deepgemm_ascend=_set_dry_run)
get_dry_run = profiled("get_dry_run", _ASCEND_ONLY, deepgemm_ascend=_get_dry_run)
