"""Which public names of DeepGEMM and DeepGEMM-Ascend this package implements.

The reference lists are ``spec/deepgemm-signatures.json`` (DeepGEMM 2.6.1) and
``spec/deepgemm-ascend-signatures.json`` (DeepGEMM-Ascend), shipped as package data.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

__all__ = ["SignatureEntry", "reference_entries", "resolve", "implementation_status"]

# Names deliberately not provided, with the reason (shown by ``deepgemm-ref info``).
NOT_PROVIDED: dict[str, str] = {
    "deep_gemm.legacy": "Triton BF16 kernels for A100, outside DeepGEMM's main API (spec section 13)",
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
    data = json.loads(resources.files("deepgemm_ref").joinpath("spec").joinpath(fname).read_text())
    return tuple(
        SignatureEntry(e["name"], e["module"], tuple(e.get("params", [])), e.get("kind", "function"), e) for e in data
    )


def _our_module(module: str) -> str:
    """Map a DeepGEMM module path to ours: deep_gemm.X -> deepgemm_ref.X."""
    return "deepgemm_ref" + module[len("deep_gemm"):]


def resolve(entry: SignatureEntry) -> Any:
    """Our object for a reference entry, or None when we do not provide it."""
    try:
        mod = importlib.import_module(_our_module(entry.module))
    except ImportError:
        return None
    return getattr(mod, entry.name, None)


def implementation_status(target: str) -> tuple[list[str], list[str]]:
    """(implemented, missing) qualified names for ``target``."""
    done: list[str] = []
    missing: list[str] = []
    for e in reference_entries(target):
        if e.module.startswith("deep_gemm.legacy"):
            continue
        obj = resolve(e)
        (done if obj is not None and not getattr(obj, "__not_implemented__", False) else missing).append(e.qualified)
    return done, missing
