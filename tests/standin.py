"""Stand-in device modules: deepgemm_ref with one kernel replaced by a buggy port of it.

``standin(name, fp8_gemm_nt=buggy)`` registers a module object that answers every attribute
from deepgemm_ref except the replaced ones, as a device library would (``--module NAME``);
:func:`replay_through` replays a bundle through it with the golden replay path (NumPy arrays;
the layout transforms applied with the module's own functions, as on a device) under each
case's profile.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import deepgemm_ref as dg
from deepgemm_ref import golden


def standin(name: str, **replaced: Callable[..., Any]) -> types.ModuleType:
    """A module named ``name`` in sys.modules: deepgemm_ref's names, ``replaced`` overriding."""
    mod = types.ModuleType(name)

    def fallback(attr: str) -> Any:
        return getattr(dg, attr)

    mod.__getattr__ = fallback  # type: ignore[method-assign]
    for k, f in replaced.items():
        setattr(mod, k, f)
    sys.modules[name] = mod
    return mod


def replay_through(bundle: Path, module: types.ModuleType, out: Path) -> Path:
    """Replay every case of ``bundle`` through ``module`` (under its case's profile)."""
    b = golden.load_bundle(bundle)
    profiles = {e["profile"] for e in b.cases.values()}
    assert len(profiles) == 1, "one profile per stand-in bundle"
    with dg.numerics(arch=profiles.pop()):
        res = golden.replay(bundle, out, module=module.__name__, use_torch=False, force=True)
    assert not res.errors, res.errors
    return out


def user_sf(sf: Any, mn: int, k: int, gran_mn: int, gran_k: int, groups: int | None = None) -> np.ndarray:
    """Any SF form a kernel receives, back to float32 user form (the device's view of it)."""
    return np.asarray(dg.layout.to_user_form(sf, mn, k, gran_mn, gran_k, groups))
