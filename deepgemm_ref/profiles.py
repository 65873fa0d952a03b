"""Arch profiles: which target the emulator behaves like (``sm90``, ``sm100``, ``ascend950``).

A profile is data: the target library, the arch major, the device's SM (AI-core) count, the
default contiguous-layout alignment.  The API default is ``sm100`` (DeepGEMM on Blackwell).
Switch with :func:`set_arch` or scope with ``deepgemm_ref.numerics(arch=...)``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Literal

from . import config
from .errors import DGArgumentError

__all__ = ["Profile", "PROFILES", "get_arch", "set_arch", "get_profile", "get_arch_major", "DEFAULT_ARCH"]

Target = Literal["deepgemm", "deepgemm-ascend"]


@dataclass(frozen=True)
class Profile:
    """One target: its library, arch major, device core count and layout defaults."""

    name: str
    target: Target
    arch_major: int
    device_num_sms: int  # SMs (CUDA) or AI cores (Ascend) of the reference device
    default_mk_alignment: int
    description: str
    fp32_block: int  # K block of the "fp32" accumulation model's partial sums (the MMA block)
    mma_block_scaling: bool = False  # UE8M0 block scales applied inside the MMA (MX), not by a float32 multiply

    @property
    def is_ascend(self) -> bool:
        return self.target == "deepgemm-ascend"


PROFILES: dict[str, Profile] = {
    # sm90 promotes the tensor-core partial sums every 128 K (spec 6.2); sm100 and Ascend 950
    # scale per 32-element block in the MMA.
    "sm90": Profile("sm90", "deepgemm", 9, 132, 128, "DeepGEMM 2.6.1 on Hopper (H800/H100 SXM, 132 SMs)", 128),
    "sm100": Profile("sm100", "deepgemm", 10, 148, 128, "DeepGEMM 2.6.1 on Blackwell (B200, 148 SMs)", 32, True),
    "ascend950": Profile(
        "ascend950", "deepgemm-ascend", 0, 32, 256,
        "DeepGEMM-Ascend on Ascend 950 (CANN 9.20, 32 AI cores): MX per-32 UE8M0 scales, psum-only grouping",
        32, True,
    ),
}
DEFAULT_ARCH = "sm100"

_lock = threading.RLock()
_arch = DEFAULT_ARCH
_listeners: list = []  # callables run after every profile switch (e.g. to reset alignment state)


def get_arch() -> str:
    """Name of the active profile."""
    return _arch


def get_profile() -> Profile:
    """The active profile record."""
    return PROFILES[_arch]


def set_arch(arch: str) -> None:
    """Switch the active profile (``"sm90"``, ``"sm100"`` or ``"ascend950"``) process-wide."""
    global _arch
    if arch not in PROFILES:
        raise DGArgumentError(f"set_arch: arch: expected one of {sorted(PROFILES)}; got {arch!r}")
    with _lock:
        changed = arch != _arch
        _arch = arch
        if changed:
            for f in _listeners:
                f()


def get_arch_major() -> int:
    """The arch major of the active profile: 9 (sm90) or 10 (sm100)."""
    p = get_profile()
    if p.is_ascend:
        raise DGArgumentError(
            "get_arch_major: not provided by DeepGEMM-Ascend (the ascend950 profile); "
            "use deepgemm_ref.get_arch() or get_npu_arch()"
        )
    return p.arch_major


def _snapshot() -> str:
    return _arch


def _restore(token: str) -> None:
    global _arch
    with _lock:
        _arch = token


config.register_state(_snapshot, _restore)
