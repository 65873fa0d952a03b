"""DeepGEMM-Ascend's ``deep_gemm.testing.par_compile``: nothing is JIT-compiled here."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

__all__ = ["dry_run", "par_compile"]


@contextlib.contextmanager
def dry_run() -> Iterator[None]:
    """A context in which DeepGEMM-Ascend only compiles kernels; the emulator has none to compile."""
    yield


def par_compile(callables: Iterable[Callable[[], Any]], *, max_workers: int | None = None,
                progress: bool = True) -> list[Any]:
    """Run each callable once, in order, and return their results (there is no JIT cache to warm)."""
    return [fn() for fn in callables]
