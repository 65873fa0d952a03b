"""``torch.npu`` on the CPU: run DeepGEMM-Ascend's own tests and helpers unchanged against this package.

DeepGEMM-Ascend's tests import ``torch_npu`` and ``deep_gemm``, create tensors with
``device='npu'``, call ``torch.npu.synchronize()`` / ``empty_cache()`` / ``current_device()`` and
compile with ``device='meta'`` tensors under ``deep_gemm.testing.par_compile``.  Inside
:func:`npu_on_cpu` (or between :func:`install` and :func:`uninstall`) that code runs on the CPU:

* ``torch.npu`` is :class:`NpuNamespace` (device and stream bookkeeping, events timed by the wall
  clock, device properties of the active profile; memory queries report 0), and ``import
  torch_npu`` gives a module whose ``npu`` is the same namespace;
* ``device='npu'`` / ``'npu:N'`` (keyword or positional, e.g. ``x.to('npu')``) becomes ``'cpu'``
  for every torch function called in the installing thread (a ``TorchFunctionMode``); other
  threads get it inside ``with torch.npu.device(i):``, which DeepGEMM-Ascend's ``par_compile``
  enters in every worker (as does this package's), or with :func:`in_this_thread`;
* ``Tensor.npu()`` returns the tensor and ``Tensor.is_npu`` is True for CPU tensors;
* with ``alias_deep_gemm`` (default) ``import deep_gemm`` and ``deep_gemm.*`` sub-modules are
  this package's modules (one object per module, not copies), and the profile is ``arch``
  (default ``ascend950``).

Everything is put back on exit: the previous ``torch.npu`` attribute (absent on a CPU build),
``sys.modules`` entries, ``Tensor`` attributes, the profile.  ``torch.device('npu')`` objects
cannot be made without renaming torch's private backend, which cannot be undone, so they are
not supported; device strings are.

From the command line, ``python -m deepgemm_ref.testing.npu_shim SCRIPT [ARGS...]`` runs a script
(for instance one of DeepGEMM-Ascend's test files, from its ``tests`` directory) under the shim.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import runpy
import sys
import threading
import time
import types
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..profiles import get_arch, get_profile, set_arch

__all__ = ["NpuNamespace", "NpuDeviceProperties", "NpuStream", "NpuEvent", "npu_on_cpu", "install", "uninstall",
           "installed", "in_this_thread", "main"]


def _torch() -> Any:
    import torch  # the shim is only used by callers of torch

    return torch


def _is_npu(x: Any) -> bool:
    return isinstance(x, str) and (x == "npu" or x.startswith("npu:"))


# Note: device strings only; torch.device("npu") needs torch's private backend renamed, which
# cannot be undone, so the shim does not do it.
def _device_mode() -> Any:
    """A TorchFunctionMode that turns ``'npu'`` device strings into ``'cpu'``."""
    from torch.overrides import TorchFunctionMode

    class _NpuToCpu(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Sequence[Any] = (),
                               kwargs: dict[str, Any] | None = None) -> Any:
            kwargs = dict(kwargs or {})
            if _is_npu(kwargs.get("device")):
                kwargs["device"] = "cpu"
            return func(*("cpu" if _is_npu(a) else a for a in args), **kwargs)

    return _NpuToCpu()


@dataclass(frozen=True)
class NpuDeviceProperties:
    """What ``torch.npu.get_device_properties`` reports: the active profile's device.

    ``multi_processor_count`` is its AI-core count (32 on Ascend 950); ``total_memory`` and
    ``L2_cache_size`` are 0: there is no device memory and no cache to flush on the CPU.
    """

    name: str
    multi_processor_count: int
    total_memory: int = 0
    L2_cache_size: int = 0  # noqa: N815 - torch_npu's field name


class NpuStream:
    """A stand-in NPU stream: work on the CPU is synchronous, so every wait returns at once."""

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        self.device = device
        self.priority = priority

    def synchronize(self) -> None:
        return None

    def wait_stream(self, stream: Any) -> None:
        return None

    def wait_event(self, event: Any) -> None:
        return None

    def query(self) -> bool:
        return True

    def record_event(self, event: NpuEvent | None = None) -> NpuEvent:
        event = event or NpuEvent()
        event.record(self)
        return event


class NpuEvent:
    """A stand-in NPU event; ``elapsed_time`` is wall-clock milliseconds between two records."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, **kwargs: Any) -> None:
        self.enable_timing = enable_timing
        self._t: float | None = None

    def record(self, stream: Any = None) -> None:
        self._t = time.perf_counter()

    def synchronize(self) -> None:
        return None

    def wait(self, stream: Any = None) -> None:
        return None

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: NpuEvent) -> float:
        if self._t is None or end._t is None:
            raise RuntimeError("elapsed_time: both events must be recorded first")
        return (end._t - self._t) * 1000.0


class NpuNamespace(types.ModuleType):
    """``torch.npu`` on the CPU: one device (index 0 unless set), synchronous streams."""

    Stream = NpuStream
    Event = NpuEvent

    def __init__(self) -> None:
        super().__init__("torch.npu", "torch.npu on the CPU (deepgemm_ref.testing.npu_shim)")
        self._local = threading.local()
        self._default_stream = NpuStream()

    # --- devices -------------------------------------------------------------------------------
    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return True

    def init(self) -> None:
        return None

    def device_count(self) -> int:
        return 1

    def current_device(self) -> int:
        return int(getattr(self._local, "device", 0))

    def set_device(self, device: Any) -> None:
        self._local.device = _index(device)

    @contextlib.contextmanager
    def device(self, device: Any) -> Iterator[None]:
        """Make ``device`` current in this thread for the block (with the device mapping on)."""
        previous = self.current_device()
        self._local.device = _index(device)
        try:
            with in_this_thread():
                yield
        finally:
            self._local.device = previous

    def get_device_name(self, device: Any = None) -> str:
        return self.get_device_properties(device).name

    def get_device_properties(self, device: Any = None) -> NpuDeviceProperties:
        p = get_profile()
        return NpuDeviceProperties(name=f"{p.description} (emulated on the CPU by deepgemm_ref)",
                                   multi_processor_count=p.device_num_sms)

    def synchronize(self, device: Any = None) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    # --- streams ---------------------------------------------------------------------------------
    def current_stream(self, device: Any = None) -> NpuStream:
        return getattr(self._local, "stream", None) or self._default_stream

    def default_stream(self, device: Any = None) -> NpuStream:
        return self._default_stream

    def set_stream(self, stream: NpuStream) -> None:
        self._local.stream = stream

    @contextlib.contextmanager
    def stream(self, stream: NpuStream | None) -> Iterator[None]:
        previous = getattr(self._local, "stream", None)
        if stream is not None:
            self._local.stream = stream
        try:
            with in_this_thread():
                yield
        finally:
            self._local.stream = previous

    # --- seeds and memory --------------------------------------------------------------------------
    def manual_seed(self, seed: int) -> None:
        _torch().manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        _torch().manual_seed(seed)

    def memory_allocated(self, device: Any = None) -> int:
        return 0

    def max_memory_allocated(self, device: Any = None) -> int:
        return 0

    def memory_reserved(self, device: Any = None) -> int:
        return 0

    def reset_peak_memory_stats(self, device: Any = None) -> None:
        return None

    def mem_get_info(self, device: Any = None) -> tuple[int, int]:
        return 0, 0


def _index(device: Any) -> int:
    if device is None:
        return 0
    if isinstance(device, int):
        return device
    text = str(device)
    return int(text.split(":", 1)[1]) if ":" in text else 0


# ----------------------------------------------------------------------------------------------
# deep_gemm -> deepgemm_ref
# ----------------------------------------------------------------------------------------------

class _AliasLoader(importlib.abc.Loader):
    def __init__(self, module: types.ModuleType) -> None:
        self.module = module

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return self.module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


class _AliasFinder(importlib.abc.MetaPathFinder):
    """``deep_gemm.X`` is ``deepgemm_ref.X`` (the same module object)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != "deep_gemm" and not name.startswith("deep_gemm."):
            return None
        real = importlib.import_module("deepgemm_ref" + name[len("deep_gemm"):])
        return importlib.util.spec_from_loader(name, _AliasLoader(real), is_package=hasattr(real, "__path__"))


# ----------------------------------------------------------------------------------------------
# install / uninstall
# ----------------------------------------------------------------------------------------------

@dataclass
class _Installed:
    npu: NpuNamespace
    mode: Any
    thread: int
    saved_npu: Any
    saved_modules: dict[str, Any]
    saved_tensor: dict[str, Any]
    finder: _AliasFinder | None
    saved_arch: str | None


_state: _Installed | None = None
_MISSING = object()
_local = threading.local()


def installed() -> NpuNamespace | None:
    """The active :class:`NpuNamespace`, or None."""
    return None if _state is None else _state.npu


@contextlib.contextmanager
def in_this_thread() -> Iterator[None]:
    """Map ``device='npu'`` to the CPU in the current thread for the block (nested uses are free)."""
    if _state is None or getattr(_local, "active", False) or threading.get_ident() == _state.thread:
        yield
        return
    _local.active = True
    try:
        with _device_mode():
            yield
    finally:
        _local.active = False


def install(*, arch: str | None = "ascend950", alias_deep_gemm: bool = True) -> NpuNamespace:
    """Install the shim process-wide (until :func:`uninstall`); returns the ``torch.npu`` stand-in."""
    global _state
    if _state is not None:
        raise RuntimeError("deepgemm_ref.testing.npu_shim is already installed")
    torch = _torch()
    npu = NpuNamespace()
    saved_modules = {k: sys.modules.get(k, _MISSING) for k in ("torch.npu", "torch_npu")}
    finder = None
    if alias_deep_gemm:
        saved_modules.update({k: v for k, v in sys.modules.items() if k == "deep_gemm" or k.startswith("deep_gemm.")})
        for k in list(saved_modules):
            if k.startswith("deep_gemm"):
                del sys.modules[k]
        # Modules already imported are entered under their deep_gemm names directly: importing
        # through the finder would make the import system set the parent's attribute to the module
        # (deepgemm_ref.testing.bench must stay DeepGEMM's function bench).
        for name, module in list(sys.modules.items()):
            if name == "deepgemm_ref" or name.startswith("deepgemm_ref."):
                sys.modules["deep_gemm" + name[len("deepgemm_ref"):]] = module
        finder = _AliasFinder()
        sys.meta_path.insert(0, finder)
    torch_npu = types.ModuleType("torch_npu", "torch_npu on the CPU (deepgemm_ref.testing.npu_shim)")
    torch_npu.npu = npu  # type: ignore[attr-defined]
    sys.modules["torch_npu"] = torch_npu
    sys.modules["torch.npu"] = npu
    saved_tensor = {name: torch.Tensor.__dict__.get(name, _MISSING) for name in ("npu", "is_npu")}
    torch.Tensor.npu = lambda self, *args, **kwargs: self
    torch.Tensor.is_npu = property(lambda self: self.device.type == "cpu")
    saved_npu = getattr(torch, "npu", _MISSING)
    torch.npu = npu
    mode = _device_mode()
    mode.__enter__()
    saved_arch = None
    if arch is not None:
        saved_arch = get_arch()
        set_arch(arch)
    _state = _Installed(npu, mode, threading.get_ident(), saved_npu, saved_modules, saved_tensor, finder, saved_arch)
    return npu


def uninstall() -> None:
    """Undo :func:`install` (from the installing thread); does nothing when not installed."""
    global _state
    state = _state
    if state is None:
        return
    _state = None
    torch = _torch()
    state.mode.__exit__(None, None, None)
    if state.saved_npu is _MISSING:
        del torch.npu
    else:
        torch.npu = state.saved_npu
    for name, v in state.saved_tensor.items():
        if v is _MISSING:
            if name in torch.Tensor.__dict__:
                delattr(torch.Tensor, name)
        else:
            setattr(torch.Tensor, name, v)
    if state.finder is not None:
        sys.meta_path.remove(state.finder)
        for k in [k for k in sys.modules if k == "deep_gemm" or k.startswith("deep_gemm.")]:
            del sys.modules[k]
    for k, v in state.saved_modules.items():
        if v is _MISSING:
            sys.modules.pop(k, None)
        else:
            sys.modules[k] = v
    if state.saved_arch is not None:
        set_arch(state.saved_arch)


@contextlib.contextmanager
def npu_on_cpu(*, arch: str | None = "ascend950", alias_deep_gemm: bool = True) -> Iterator[NpuNamespace]:
    """The shim for the block (see the module docstring); everything is restored on exit."""
    npu = install(arch=arch, alias_deep_gemm=alias_deep_gemm)
    try:
        yield npu
    finally:
        uninstall()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m deepgemm_ref.testing.npu_shim SCRIPT [ARGS...]``: run SCRIPT under the shim."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(__doc__.split("\n\n")[0])
        print("usage: python -m deepgemm_ref.testing.npu_shim SCRIPT [ARGS...]")
        return 0 if args else 2
    script = args[0]
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = args
    sys.path.insert(0, str(Path(script).resolve().parent))
    try:
        with npu_on_cpu():
            runpy.run_path(script, run_name="__main__")
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    return 0


if __name__ == "__main__":  # pragma: no cover - command line: run the package's copy of this module
    from deepgemm_ref.testing.npu_shim import main as _main

    sys.exit(_main())
