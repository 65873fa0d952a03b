"""DeepGEMM-Ascend's locality-domain helpers: stubs with the API of newer upstream releases.

On Ascend 950 there is one locality domain; ``localize`` returns its argument unchanged.
These are exact emulations of the port's behaviour, not placeholders.
"""

from __future__ import annotations

from typing import Any

__all__ = ["get_num_locality_domains", "is_localization_available", "localize", "is_localized", "destroy_localizer"]


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
