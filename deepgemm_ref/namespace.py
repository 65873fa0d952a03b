"""Namespaces that follow the active arch profile: ``hasattr``, ``dir`` and imports see what the
emulated library exports.

DeepGEMM 2.6.1 and DeepGEMM-Ascend export different names (masked grouped GEMMs, the legacy MQA
wrappers and ``set_pdl`` exist only in DeepGEMM; the ACLNN GEMMs, ``set_npu_arch`` and
``_C.set_dry_run`` only in DeepGEMM-Ascend).  Their objects all live in this package, since a
profile switch must bring them back, so a plain module attribute would always be there and a
script probing ``hasattr(deep_gemm, "fp8_mqa_logits")`` would take the wrong branch.

:func:`install` turns a module into a :class:`ProfiledModule`, whose attribute lookup hides

* every :class:`~deepgemm_ref.api.ProfiledFunction` the active profile's target does not provide,
* the names listed for it as belonging to one target only (``deepgemm_ref._exports``'s ``only=``
  rows, e.g. ``ASCEND_HOME``, ``utils``; or the module's own list, as ``_C.Runtime``).

Hidden names raise ``AttributeError`` (``from deepgemm_ref import x``: ``ImportError``), are left
out of ``dir()`` and of ``__all__`` (so ``import *`` works), and come back when the profile is
switched back.  The objects themselves stay where they are defined (``deepgemm_ref.attention.
fp8_mqa_logits`` and references taken earlier still raise the argument error naming the
target), and ``vars(module)`` shows the unfiltered namespace.  This package's own names (the
numerics controls, ``set_arch``, ``formats``, the errors, ...) are visible under every profile.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Mapping
from typing import Any

from .api import TARGET_LABEL, ProfiledFunction
from .profiles import get_profile

__all__ = ["ProfiledModule", "install", "visible", "target_only"]

# module name -> {name: the one target that exports it}
_ONLY: dict[str, dict[str, str]] = {}


def target_only(module: str) -> Mapping[str, str]:
    """The names of ``module`` that belong to one target only (beyond its profiled functions)."""
    return _ONLY.get(module, {})


def visible(module: str, name: str, value: Any) -> bool:
    """Whether ``module``'s attribute ``name`` (bound to ``value``) exists under the active profile."""
    target = get_profile().target
    if isinstance(value, ProfiledFunction):
        return value.provided_by(get_profile())
    only = _ONLY.get(module, {}).get(name)
    return only is None or only == target


# Note: hidden names stay in the module dictionary (vars(), references taken earlier): the objects
# must come back when the profile switches back.
class ProfiledModule(types.ModuleType):
    """A module whose public attributes follow the active profile (see the module docstring)."""

    def __getattribute__(self, name: str) -> Any:
        value = super().__getattribute__(name)
        if name == "__all__":
            mod = super().__getattribute__("__name__")
            d = super().__getattribute__("__dict__")
            return [n for n in value if n not in d or visible(mod, n, d[n])]
        if name.startswith("__"):
            return value
        mod = super().__getattribute__("__name__")
        if visible(mod, name, value):
            return value
        p = get_profile()
        raise AttributeError(
            f"module {mod!r} has no attribute {name!r} under the {p.name} profile: {TARGET_LABEL[p.target]} does "
            "not export it (switch profiles with deepgemm_ref.set_arch(...) or deepgemm_ref.numerics(arch=...))",
            name=name, obj=self)

    def __dir__(self) -> list[str]:
        mod = super().__getattribute__("__name__")
        d = super().__getattribute__("__dict__")
        return sorted(n for n in d if n.startswith("__") or visible(mod, n, d[n]))


def install(module: str, only: Mapping[str, str] | None = None) -> None:
    """Make ``sys.modules[module]`` a :class:`ProfiledModule`; ``only`` maps names to the one
    target (``"deepgemm"`` or ``"deepgemm-ascend"``) that exports them."""
    for name, target in (only or {}).items():
        if target not in TARGET_LABEL:
            raise ValueError(f"namespace.install: {module}.{name}: unknown target {target!r}")
    _ONLY[module] = dict(only or {})
    sys.modules[module].__class__ = ProfiledModule
