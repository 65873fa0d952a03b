"""DeepGEMM-Ascend's ``deep_gemm.testing.par_compile``: warm-up calls under dry run, in a thread pool.

DeepGEMM-Ascend's tests first call every kernel they will test with ``device='meta'`` tensors
inside :func:`par_compile`, so that the JIT compiles each kernel once, in parallel, without
touching device memory; then they run the real calls.  Here there is nothing to compile, but the
flow is the same: under :func:`dry_run` every kernel validates its arguments (argument errors are
raised) and computes and writes nothing (:mod:`deepgemm_ref.dryrun`).

``torch`` below is looked up when a function runs (``None`` means ``sys.modules["torch"]``, if
torch is imported); where it has ``torch.npu`` (the device's, or
:mod:`deepgemm_ref.testing.npu_shim`'s), every worker runs on the caller's current device, as the
newest DeepGEMM-Ascend does.  Without ``torch.npu`` the device steps are skipped, and so is each
step a ``torch.npu`` does not provide (another library's stand-in without ``current_stream``).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any

from ..runtime import set_dry_run

__all__ = ["dry_run", "par_compile"]

#: The torch module whose ``npu`` namespace pins workers to the caller's device (None: the
#: imported torch, if any); a test may replace it with a double.
torch: Any = None


def _npu() -> Any:
    t = torch if torch is not None else sys.modules.get("torch")
    return getattr(t, "npu", None)


def _device_steps(npu: Any) -> tuple[Any, Any, Any]:
    """``npu``'s ``current_device``, ``device`` and ``current_stream``, each None where ``npu`` (a
    ``torch.npu``: the device's, the shim's or another library's stand-in) does not provide it
    callable: a step it lacks is skipped, so par_compile works whatever ``torch.npu`` is."""
    if npu is None:
        return None, None, None
    steps = [getattr(npu, name, None) for name in ("current_device", "device", "current_stream")]
    return tuple(f if callable(f) else None for f in steps)  # type: ignore[return-value]


@contextlib.contextmanager
def dry_run() -> Iterator[None]:
    """``_C.set_dry_run(True)`` for the block, ``set_dry_run(False)`` after it (also when it raises).

    Inside, every kernel validates its arguments and returns without computing or writing;
    ``meta`` tensors are accepted.  Needs the ``ascend950`` profile (DeepGEMM's 2.6.1 ``_C`` has no
    dry run: the argument error says so).
    """
    # The profiled function itself: under DeepGEMM's profiles its argument error says why.
    set_dry_run(True)
    try:
        yield
    finally:
        set_dry_run(False)


# Note: tqdm is not a dependency: without it progress=True shows nothing.
def _progress_bar(total: int, enabled: bool) -> Any:
    """A tqdm bar when asked for and tqdm is installed (it is not a dependency), else None."""
    if not enabled or importlib.util.find_spec("tqdm") is None:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="Compiling")


def par_compile(callables: Iterable[Callable[[], Any]], *, max_workers: int | None = None,
                progress: bool = True) -> None:
    """Run every callable once under :func:`dry_run`, on a pool of ``max_workers`` threads.

    ``max_workers`` defaults to ``$DG_TEST_MAX_WORKERS`` or the CPU count.  Each worker runs on the
    device that is current in the caller (``torch.npu.device(...)``) and initialises its stream
    first.  The first exception of a callable is raised (after the dry run is switched off); the
    results are discarded and None is returned, as in DeepGEMM-Ascend.  ``progress`` shows a tqdm
    bar when tqdm is installed.
    """
    fns = list(callables)
    current_device, device_scope, current_stream = _device_steps(_npu())
    device = current_device() if current_device is not None else None

    def run(fn: Callable[[], Any]) -> Any:
        scope = device_scope(device) if device_scope is not None and device is not None else contextlib.nullcontext()
        with scope:
            if current_stream is not None:
                current_stream()
            return fn()

    if current_stream is not None:
        current_stream()
    if max_workers is None:
        max_workers = int(os.environ.get("DG_TEST_MAX_WORKERS", os.cpu_count() or 1))
    bar = _progress_bar(len(fns), progress)
    try:
        with dry_run(), ThreadPoolExecutor(max_workers=max(1, max_workers),
                                           thread_name_prefix="deepgemm-compile") as pool:
            for fut in as_completed([pool.submit(run, fn) for fn in fns]):
                fut.result()
                if bar is not None:
                    bar.update(1)
    finally:
        if bar is not None:
            bar.close()
