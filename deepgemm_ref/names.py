"""Which public names of DeepGEMM and DeepGEMM-Ascend this package implements.

The reference lists are ``spec/deepgemm-signatures.json`` (DeepGEMM 2.6.1) and
``spec/deepgemm-ascend-signatures.json`` (DeepGEMM-Ascend), shipped as package data.  Names are
resolved in the root module the caller hands in (``deepgemm_ref`` itself, from ``deepgemm-ref
info`` and the tests): this module stands below the package face and imports none of it.
"""

from __future__ import annotations

import importlib
import json
import types
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from .api import ProfiledFunction

__all__ = ["SignatureEntry", "reference_entries", "resolve", "implementation_status", "not_implemented_reason"]

# Names deliberately not provided, with the reason (shown by ``deepgemm-ref info``).
NOT_PROVIDED: dict[str, str] = {
    "deep_gemm.legacy": "Triton BF16 kernels for A100, outside DeepGEMM's main API",
}


@dataclass(frozen=True)
class SignatureEntry:
    name: str
    module: str
    params: tuple[dict[str, Any], ...]
    kind: str
    raw: dict[str, Any]

    @property
    def qualified(self) -> str:
        return f"{self.module}.{self.name}"


@cache
def reference_entries(target: str) -> tuple[SignatureEntry, ...]:
    """The reference signature list of ``target`` ("deepgemm" or "deepgemm-ascend")."""
    fname = {"deepgemm": "deepgemm-signatures.json", "deepgemm-ascend": "deepgemm-ascend-signatures.json"}[target]
    data = json.loads((Path(__file__).parent / "spec" / fname).read_text())
    return tuple(
        SignatureEntry(e["name"], e["module"], tuple(e.get("params", [])), e.get("kind", "function"), e) for e in data
    )


def resolve(entry: SignatureEntry, root: types.ModuleType) -> Any:
    """Our object for a reference entry (deep_gemm.X.Y -> root.X.Y, root being ``deepgemm_ref``), or None.

    Looked up in the modules' own dictionaries first, so the answer does not depend on the
    active profile (whose namespaces hide the other target's names, see ``namespace``).
    """
    obj: Any = root
    for part in entry.module.split(".")[1:] + [entry.name]:
        if isinstance(obj, types.ModuleType) and part in vars(obj):
            obj = vars(obj)[part]
            continue
        try:
            obj = getattr(obj, part)
        except AttributeError:
            try:
                obj = importlib.import_module(f"{obj.__name__}.{part}")
            except (ImportError, AttributeError):
                return None
    return obj


def not_implemented_reason(obj: Any, target: str) -> str | None:
    """Why ``obj`` (as ``target`` would call it) is not implemented, or None when it is."""
    if obj is None:
        return "no such name in deepgemm_ref"
    if isinstance(obj, ProfiledFunction):
        impl = obj.__wrapped_impls__.get(target)
        if impl is None:
            return f"not provided for {target}"
        obj = impl
    reason = getattr(obj, "__not_implemented__", None)
    return str(reason) if reason else None


def implementation_status(target: str, root: types.ModuleType) -> tuple[list[str], dict[str, str]]:
    """(implemented qualified names, {missing qualified name: reason}) for ``target``, resolved in
    ``root`` (``deepgemm_ref``)."""
    done: list[str] = []
    missing: dict[str, str] = {}
    for e in reference_entries(target):
        if e.module.startswith("deep_gemm.legacy"):
            continue
        reason = not_implemented_reason(resolve(e, root), target)
        if reason is None:
            done.append(e.qualified)
        else:
            missing[e.qualified] = reason
    return done, missing
