"""DeepGEMM-Ascend's locality-domain helpers: stubs with the API of newer upstream releases.

On Ascend 950 there is one locality domain; ``localize`` returns its argument unchanged.
These are exact emulations of the port's behaviour, not placeholders.
"""

from __future__ import annotations

from typing import Any

from .api import profiled

__all__ = ["get_num_locality_domains", "is_localization_available", "localize", "is_localized", "destroy_localizer",
           "profiled_get_num_locality_domains", "profiled_is_localization_available", "profiled_localize",
           "profiled_is_localized", "profiled_destroy_localizer"]


def get_num_locality_domains() -> int:
    """1: Ascend 950 exposes a single locality domain."""
    return 1


def is_localization_available() -> bool:
    """False: there is nothing to localise across."""
    return False


def localize(t: Any, dim: int = -2) -> Any:
    """Returns ``t`` itself (the same object)."""
    return t


def is_localized(t: Any) -> bool:
    """False for every tensor."""
    return False


def destroy_localizer() -> None:
    """Does nothing."""
    return None


# The top-level ``deepgemm_ref.<name>`` versions: DeepGEMM-Ascend's additions, which DeepGEMM
# 2.6.1 does not export (they raise saying so under its profiles).
_MISSING = {"deepgemm": "added by DeepGEMM-Ascend (newer upstream API); not in DeepGEMM 2.6.1"}
profiled_get_num_locality_domains = profiled("get_num_locality_domains", _MISSING,
                                             deepgemm_ascend=get_num_locality_domains)
profiled_is_localization_available = profiled("is_localization_available", _MISSING,
                                              deepgemm_ascend=is_localization_available)
profiled_localize = profiled("localize", _MISSING, deepgemm_ascend=localize)
profiled_is_localized = profiled("is_localized", _MISSING, deepgemm_ascend=is_localized)
profiled_destroy_localizer = profiled("destroy_localizer", _MISSING, deepgemm_ascend=destroy_localizer)
