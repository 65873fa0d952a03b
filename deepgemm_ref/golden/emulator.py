"""The module golden values are computed with: this package's namespace, looked up by name.

The golden workflow drives whatever module it is handed (``replay --module``, ``Case.call(module)``,
a family's driver); the goldens themselves come from the emulator, this package.  The workflow
stands below the package face (the face imports none of it, and it imports nothing of the face),
so it does not import the face: the face is the parent package of every golden module, imported
by Python before any of them runs, and :func:`emulator` looks it up by name, as replay looks up
the module named by ``--module``.
"""

from __future__ import annotations

import importlib
import types

__all__ = ["PACKAGE", "emulator", "is_emulator"]

#: The import name of this package (the default ``--module`` of replay).
PACKAGE = __name__.split(".")[0]


def emulator() -> types.ModuleType:
    """This package's namespace (``deepgemm_ref``), already imported: the module goldens run on."""
    return importlib.import_module(PACKAGE)


def is_emulator(module: object) -> bool:
    """Whether ``module`` is this package's namespace."""
    return module is emulator()
