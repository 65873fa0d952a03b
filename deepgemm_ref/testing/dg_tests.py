"""Run DeepGEMM's (and DeepEP's) own multi-process test files unchanged on the CPU.

``python -m deepgemm_ref.testing.dg_tests [--arch ARCH] [--deep-ep-root DIR] [--bench-tests N]
PATH [ARGS...]`` runs the test file ``PATH`` with its own arguments ``ARGS`` (for instance DeepGEMM's
``tests/test_mega_moe.py --num-processes 1 --num-max-tokens-per-rank 16 --hidden 512 ...``) as
``python PATH ARGS`` would, with CUDA mapped to the CPU in this process and in every process it
spawns.  ``MASTER_PORT`` is set to a free TCP port unless the environment has one.  The runner's
options come before ``PATH``: ``--arch`` (``sm90`` / ``sm100``; default: the active profile),
``--deep-ep-root`` (below) and ``--bench-tests N`` (at most N timed calls in the timing helpers:
the timing loops get shorter, what the test checks does not change).

The mapping (:func:`install`, :func:`uninstall`, or the context :func:`cuda_on_cpu`), in the
spirit of :mod:`deepgemm_ref.testing.npu_shim`:

* modules: ``deep_gemm`` and ``deep_gemm.*`` are this package's modules (``deep_gemm.utils.dist``
  is :mod:`deepgemm_ref.utils.dist`: ``init_dist`` on gloo), ``deep_ep`` and ``deep_ep.*`` are
  :mod:`deepgemm_ref.ep` (the same module objects, not copies);
* TileLang: ``tilelang.profiler.bench.do_bench`` is :func:`do_bench` (CPU wall clock, median /
  mean / min / max in milliseconds as TileLang's), and loading DeepGEMM's
  ``third-party/tilelang_ops/__init__.py`` by path (``importlib.util.spec_from_file_location``,
  as ``test_mega_moe.py`` does) gives a module whose ``swiglu_apply_weight_to_fp8`` is
  :func:`deepgemm_ref.mega.stages.swiglu_apply_weight_to_fp8`; DeepGEMM's files are not read;
* devices: ``device='cuda'`` / ``'cuda:N'`` / ``torch.device('cuda')`` (keyword or positional:
  ``x.to('cuda')``) becomes ``'cpu'`` for every torch function called in the installing thread
  (a ``TorchFunctionMode``), ``Tensor.cuda()`` returns the tensor, and
  ``torch.set_default_device('cuda')`` sets the CPU;
* ``torch.cuda``: the calls DeepGEMM's and DeepEP's tests make are stand-ins on the real module
  (``set_device``, ``current_device``, ``synchronize``, ``empty_cache``, ``_sleep``,
  memory statistics (0), ``Event`` timed by the wall clock, ``Stream`` /
  ``current_stream``, ``get_device_properties`` / ``get_device_name`` /
  ``get_device_capability`` of the active profile); ``torch.cuda.is_available()`` stays False, so
  torch itself takes no CUDA path;
* ``torch.distributed``: ``backend='nccl'`` becomes ``'gloo'`` in ``init_process_group`` and
  ``new_group`` (a ``device_id`` is dropped), and ``all_to_all_single`` moves the dtypes gloo
  refuses (float8, int16, uint16 / 32 / 64) as byte views, bitwise; ``all_gather_into_tensor``
  too, and it takes any output of ``world * numel`` elements, as NCCL does;
* ``torch.multiprocessing.spawn`` works as is: every child that ``multiprocessing`` starts by
  ``spawn`` installs the same mapping before it re-imports the test file (the child's command
  line is prefixed with the installation; its settings travel in the environment variable
  ``DEEPGEMM_REF_DG_TESTS``).

What runs, and what does not:

* DeepGEMM's ``tests/test_mega_moe.py``: everything, with any ``--num-processes`` the Mega MoE
  kernels accept a group of; its bitwise correctness check (fused kernel against DeepEP dispatch
  + grouped GEMMs + TileLang SwiGLU + combine) runs and must pass, and the performance lines report
  CPU times.  ``--ncu-profile-only`` and ``--local-rank-idx`` work too (the latter runs one rank
  in this process).
* DeepEP's test files run from a DeepEP checkout (``PATH`` inside one, or ``--deep-ep-root``):
  its own ``deep_ep.utils.refs`` and ``deep_ep.utils.gate`` are loaded unchanged from the checkout
  (this package does not provide them) and ``deep_ep.utils.testing`` is a CPU stand-in
  (:func:`ep_bench_kineto`, ``bench``).  ``tests/elastic/test_ep.py`` (all 144 modes with its
  checks against DeepEP's reference, or ``--test-first-only`` with the performance part),
  ``tests/elastic/test_barrier.py``, ``tests/legacy/test_intranode.py`` and
  ``tests/legacy/test_low_latency.py`` run (the last multiplies 8192 x 8192 float32 matrices per
  timed call of its receive-hook benchmark: minutes on a CPU).  They cannot run:
  ``tests/elastic/test_agrs.py``, ``test_engram.py`` and ``test_pp.py`` (the experimental AGRS,
  Engram and PP methods, not implemented) and ``tests/legacy/test_internode.py`` (RDMA between
  nodes: ``Buffer``'s internode paths, not implemented).
* Not mapped: CUDA graphs, ``torch.profiler`` CUDA activity (``deep_gemm.testing.bench_kineto``
  is this package's CPU timer), Triton, NVSHMEM; threads other than the installing one keep CUDA
  device strings (torch's function modes are per thread).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import runpy
import socket
import sys
import time
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import arg_error
from ..profiles import get_arch, get_profile, set_arch
from .bench import bench_kineto as _dg_bench_kineto
from .npu_shim import NpuEvent, NpuStream, _AliasLoader  # the same package's loader of module aliases

__all__ = ["install", "uninstall", "installed", "cuda_on_cpu", "do_bench", "ep_bench_kineto", "CudaEvent",
           "CudaStream", "main", "ENV"]

#: The environment variable that carries the mapping's settings into spawned children (JSON).
ENV = "DEEPGEMM_REF_DG_TESTS"

_ALIASES = (("deep_ep", "deepgemm_ref.ep"), ("deep_gemm", "deepgemm_ref"))
#: DeepEP's own pure-Python test utilities, loaded unchanged from a DeepEP checkout when one is given.
_DEEP_EP_FILES = {"deep_ep.utils.refs": "deep_ep/utils/refs.py", "deep_ep.utils.gate": "deep_ep/utils/gate.py"}
#: dtypes gloo refuses in collectives (torch 2.13: "Invalid scalar type"), moved as bytes.
_GLOO_REFUSED = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu", "int16",
                 "uint16", "uint32", "uint64")


def _torch() -> Any:
    import torch  # the runner is only used by callers of torch

    return torch


# ----------------------------------------------------------------------------------------------
# TileLang and DeepEP stand-ins
# ----------------------------------------------------------------------------------------------

_RETURN_MODES = ("min", "max", "mean", "median")
#: The most timed calls a timing helper makes (``install(bench_tests=...)``); None: the caller's counts.
_bench_cap: int | None = None


def _capped(n: int) -> int:
    return n if _bench_cap is None else min(n, _bench_cap)


def dg_bench_kineto(fn: Callable[[], Any], kernel_names: str | tuple[str, ...], num_tests: int = 30,
                    suppress_kineto_output: bool = False, trace_path: str | None = None, flush_l2: bool = True,
                    with_multiple_kernels: bool = False, barrier: Any = None) -> float | tuple[float, ...]:
    """``deep_gemm.testing.bench_kineto`` under the runner: :func:`deepgemm_ref.testing.bench_kineto`
    with ``num_tests`` capped by ``install(bench_tests=...)``."""
    return _dg_bench_kineto(fn, kernel_names, num_tests=_capped(num_tests),
                            suppress_kineto_output=suppress_kineto_output,
                            trace_path=trace_path, flush_l2=flush_l2, with_multiple_kernels=with_multiple_kernels,
                            barrier=barrier)


# Note: fixed call counts (1 + _n_warmup or 1 + _n_repeat or 10), never derived from a time
# estimate: ranks whose fn is a collective must call it equally often.
def do_bench(fn: Callable[[], Any], warmup: float = 25, rep: float = 100, _n_warmup: int = 0, _n_repeat: int = 0,
             grad_to_none: Any = None, quantiles: Sequence[float] | None = None, fast_flush: bool = True,
             backend: str = "event", return_mode: str = "mean") -> float | list[float]:
    """TileLang's ``tilelang.profiler.bench.do_bench`` on the CPU: milliseconds per call of ``fn``.

    ``fn`` runs once, then ``_n_warmup`` times (1 when 0) untimed, then ``_n_repeat`` times (10
    when 0), each timed by the wall clock (both counts capped by ``install(bench_tests=...)``).
    Returns the ``return_mode`` (``min``, ``max``, ``mean``, ``median``) of those times in ms,
    or with ``quantiles`` their quantiles (a list; a float for one quantile).  ``grad_to_none``
    is cleared before each timed call; ``warmup`` / ``rep`` (TileLang's time targets),
    ``fast_flush`` (the L2 flush) and ``backend`` change nothing on the CPU.
    """
    if return_mode not in _RETURN_MODES:
        raise arg_error("do_bench", "return_mode", f"one of {_RETURN_MODES}", repr(return_mode))
    n_warmup, n_repeat = _capped(_n_warmup if _n_warmup > 0 else 1), _capped(_n_repeat if _n_repeat > 0 else 10)
    fn()
    for _ in range(n_warmup):
        fn()
    times = []
    for _ in range(n_repeat):
        if grad_to_none is not None:
            for x in grad_to_none:
                x.grad = None
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    a = np.asarray(times, dtype=np.float64)
    if quantiles is not None:
        q = [float(v) for v in np.quantile(a, list(quantiles))]
        return q[0] if len(q) == 1 else q
    return float(getattr(np, return_mode)(a))


def ep_bench_kineto(fn: Callable[[], Any], kernel_names: str | tuple[str, ...], num_tests: int = 30,
                    suppress_kineto_output: bool = False, trace_path: str | None = None, flush_l2: bool = True,
                    barrier_comm_profiling: bool = False, num_kernels_per_period: int = 1,
                    barrier: Callable[[], Any] | None = None) -> Any:
    """DeepEP's ``deep_ep.utils.testing.bench_kineto`` on the CPU: seconds per call of ``fn``.

    Every name of ``kernel_names`` gets the whole call's median wall-clock time
    (:func:`deepgemm_ref.testing.bench_kineto`; ``num_tests`` capped by ``install(bench_tests=...)``):
    a float for a str, a list for a tuple (as DeepEP's), and with ``num_kernels_per_period`` n > 1
    each name's entry is a list of n such times.  With ``barrier_comm_profiling`` (unless
    ``EP_DISABLE_BARRIER_PROFILING`` is set) ``barrier()`` runs before every call, untimed (a
    barrier of the default group when ``barrier`` is None); with ``EP_USE_NVIDIA_TOOLS`` set every
    time is 1, as DeepEP's.
    """
    if not isinstance(kernel_names, (str, tuple)):
        raise arg_error("bench_kineto", "kernel_names", "a str or a tuple of str", repr(kernel_names))
    names = (kernel_names,) if isinstance(kernel_names, str) else kernel_names
    if int(os.environ.get("EP_USE_NVIDIA_TOOLS", 0)):
        return [1] * len(names) if isinstance(kernel_names, tuple) else 1
    sync = None
    if barrier_comm_profiling and int(os.environ.get("EP_DISABLE_BARRIER_PROFILING", 0)) == 0:
        if barrier is None:
            import torch.distributed as dist

            barrier = dist.barrier
        sync = barrier
    n = _capped(num_tests)
    fn()
    times = []
    for _ in range(max(n, 1)):
        if sync is not None:
            sync()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    t = float(np.median(times))
    per_name: Any = [t] * num_kernels_per_period if num_kernels_per_period > 1 else t
    return [per_name for _ in names] if isinstance(kernel_names, tuple) else per_name


def _ep_testing_module() -> types.ModuleType:
    from .bench import _SuppressStdoutStderr, bench, empty_suppress

    m = types.ModuleType("deep_ep.utils.testing", "DeepEP's test timing helpers on the CPU (dg_tests)")
    m.bench_kineto = ep_bench_kineto  # type: ignore[attr-defined]
    m.empty_suppress = empty_suppress  # type: ignore[attr-defined]
    m.suppress_stdout_stderr = _SuppressStdoutStderr  # type: ignore[attr-defined]
    m.flush_l2_cache = lambda enabled=True: None  # type: ignore[attr-defined]

    def ep_bench(fn: Callable[[], Any], num_warmups: int = 50, num_tests: int = 50, post_fn: Any = None,
                 flush_l2: bool = True) -> tuple[float, float, float]:
        """DeepEP's ``bench``: (mean, min, max) seconds of ``num_tests`` calls (the first dropped;
        both counts capped by ``install(bench_tests=...)``)."""
        for _ in range(_capped(num_warmups)):
            fn()
        times = []
        for _ in range(_capped(num_tests)):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
            if post_fn is not None:
                post_fn()
        a = np.asarray(times[1:] or times)
        return float(a.mean()), float(a.min()), float(a.max())

    m.bench = ep_bench  # type: ignore[attr-defined]
    del bench
    return m


def _tilelang_modules() -> dict[str, types.ModuleType]:
    from ..mega.stages import swiglu_apply_weight_to_fp8

    tl = types.ModuleType("tilelang", "TileLang stand-in on the CPU (deepgemm_ref.testing.dg_tests)")
    profiler = types.ModuleType("tilelang.profiler")
    bench = types.ModuleType("tilelang.profiler.bench")
    tl.__path__ = []
    profiler.__path__ = []
    bench.do_bench = do_bench  # type: ignore[attr-defined]
    profiler.bench = bench  # type: ignore[attr-defined]
    tl.profiler = profiler  # type: ignore[attr-defined]
    ops = types.ModuleType("tilelang_ops", "DeepGEMM's third-party tilelang_ops on the CPU (deepgemm_ref.mega.stages)")
    ops.__path__ = []
    ops.swiglu_apply_weight_to_fp8 = swiglu_apply_weight_to_fp8  # type: ignore[attr-defined]
    return {"tilelang": tl, "tilelang.profiler": profiler, "tilelang.profiler.bench": bench, "tilelang_ops": ops}


def _is_tilelang_ops(location: Any) -> bool:
    try:
        parts = Path(os.path.normpath(os.fspath(location))).parts
    except TypeError:
        return False
    return parts[-3:] == ("third-party", "tilelang_ops", "__init__.py")


# ----------------------------------------------------------------------------------------------
# torch.cuda stand-ins
# ----------------------------------------------------------------------------------------------

class CudaEvent(NpuEvent):
    """A ``torch.cuda.Event`` on the CPU (:class:`~deepgemm_ref.testing.npu_shim.NpuEvent`):
    ``elapsed_time`` is wall-clock ms between two records."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        super().__init__(enable_timing, blocking)


class CudaStream(NpuStream):
    """A ``torch.cuda.Stream`` on the CPU (:class:`~deepgemm_ref.testing.npu_shim.NpuStream`): work is
    synchronous, so every wait returns at once."""

    def record_event(self, event: NpuEvent | None = None) -> NpuEvent:
        event = event or CudaEvent()
        event.record(self)
        return event

    def __enter__(self) -> CudaStream:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


@dataclass(frozen=True)
class _DeviceProperties:
    name: str
    major: int
    minor: int
    multi_processor_count: int
    total_memory: int = 0
    L2_cache_size: int = 0  # noqa: N815 - torch's field name


def _cuda_patches() -> dict[str, Any]:
    default_stream = CudaStream()
    state = types.SimpleNamespace(device=0, stream=default_stream)

    def set_device(device: Any) -> None:
        state.device = device if isinstance(device, int) else int(str(device).partition(":")[2] or 0)

    def current_stream(device: Any = None) -> CudaStream:
        s: CudaStream = state.stream
        return s

    @contextlib.contextmanager
    def stream(s: CudaStream | None) -> Iterator[None]:
        previous = state.stream
        if s is not None:
            state.stream = s
        try:
            yield
        finally:
            state.stream = previous

    def set_stream(s: CudaStream) -> None:
        state.stream = s

    def properties(device: Any = None) -> _DeviceProperties:
        p = get_profile()
        return _DeviceProperties(f"{p.description} (emulated on the CPU by deepgemm_ref)", p.arch_major, 0,
                                 p.device_num_sms)

    def zero(*args: Any, **kwargs: Any) -> int:
        return 0

    def nothing(*args: Any, **kwargs: Any) -> None:
        return None

    return {
        "set_device": set_device,
        "current_device": lambda: state.device,
        "synchronize": nothing,
        "empty_cache": nothing,
        "_sleep": nothing,
        "memory_allocated": zero,
        "max_memory_allocated": zero,
        "memory_reserved": zero,
        "max_memory_reserved": zero,
        "reset_peak_memory_stats": nothing,
        "Event": CudaEvent,
        "Stream": CudaStream,
        "current_stream": current_stream,
        "default_stream": lambda device=None: default_stream,
        "stream": stream,
        "set_stream": set_stream,
        "get_device_properties": properties,
        "get_device_name": lambda device=None: properties(device).name,
        "get_device_capability": lambda device=None: (properties(device).major, properties(device).minor),
    }


def _is_cuda(x: Any) -> bool:
    if isinstance(x, str):
        return x == "cuda" or x.startswith("cuda:")
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.device) and x.type == "cuda"


def _device_mode() -> Any:
    """A TorchFunctionMode that runs CUDA placements on the CPU."""
    torch = _torch()
    from torch.overrides import TorchFunctionMode

    identity = {torch.Tensor.cuda, torch.Tensor.pin_memory}

    class _CudaToCpu(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Sequence[Any] = (),
                               kwargs: dict[str, Any] | None = None) -> Any:
            if func in identity:
                return args[0]
            kwargs = dict(kwargs or {})
            device = kwargs.get("device")
            if _is_cuda(device) or (isinstance(device, int) and not isinstance(device, bool)):
                kwargs["device"] = "cpu"
            if kwargs.get("pin_memory"):
                kwargs["pin_memory"] = False
            return func(*("cpu" if _is_cuda(a) else a for a in args), **kwargs)

    return _CudaToCpu()


# ----------------------------------------------------------------------------------------------
# torch.distributed: gloo for nccl, bytes for the dtypes gloo refuses
# ----------------------------------------------------------------------------------------------

def _gloo_backend(backend: Any) -> Any:
    return "gloo" if isinstance(backend, str) and "nccl" in backend.lower() else backend


def _dist_patches(dist: Any) -> dict[str, Any]:
    torch = _torch()
    init, new_group, a2a = dist.init_process_group, dist.new_group, dist.all_to_all_single
    gather_into = dist.all_gather_into_tensor
    refused = {getattr(torch, n) for n in _GLOO_REFUSED if hasattr(torch, n)}

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        args = tuple(_gloo_backend(a) if i == 0 else a for i, a in enumerate(args))
        if "backend" in kwargs:
            kwargs["backend"] = _gloo_backend(kwargs["backend"])
        kwargs.pop("device_id", None)
        return init(*args, **kwargs)

    def new_group_(*args: Any, **kwargs: Any) -> Any:
        if "backend" in kwargs:
            kwargs["backend"] = _gloo_backend(kwargs["backend"])
        kwargs.pop("device_id", None)
        return new_group(*args, **kwargs)

    def as_bytes(t: Any) -> Any:
        """A uint8 view of a contiguous tensor with its rows kept: (n, ...) -> (n, row bytes)."""
        return t.reshape(t.shape[0], -1).view(torch.uint8) if t.dim() else t.reshape(1).view(torch.uint8)

    def all_to_all_single(output: Any, input: Any, output_split_sizes: Any = None,  # noqa: A002 - torch's name
                          input_split_sizes: Any = None, group: Any = None, async_op: bool = False) -> Any:
        if output.dtype in refused and input.dtype == output.dtype and output.is_contiguous() \
                and input.is_contiguous() and output.dim() >= 1 and input.dim() >= 1:
            return a2a(as_bytes(output), as_bytes(input), output_split_sizes, input_split_sizes, group=group,
                       async_op=async_op)
        return a2a(output, input, output_split_sizes, input_split_sizes, group=group, async_op=async_op)

    def all_gather_into_tensor(output_tensor: Any, input_tensor: Any, group: Any = None, async_op: bool = False) -> Any:
        out, inp = output_tensor, input_tensor
        # NCCL takes any output of world * numel elements (e.g. (world, n, k) for an (n, k) input);
        # gloo wants (world * n, k): a view of the same memory
        if out.is_contiguous() and inp.is_contiguous() and inp.dim() >= 1 and out.shape[1:] != inp.shape[1:] \
                and out.numel() == inp.numel() * dist.get_world_size(group):
            out = out.view((-1, *inp.shape[1:]))
        if out.dtype in refused and inp.dtype == out.dtype and out.is_contiguous() and inp.is_contiguous() \
                and inp.dim() >= 1:
            out, inp = as_bytes(out), as_bytes(inp)
        return gather_into(out, inp, group=group, async_op=async_op)

    return {"init_process_group": init_process_group, "new_group": new_group_, "all_to_all_single": all_to_all_single,
            "all_gather_into_tensor": all_gather_into_tensor}


# ----------------------------------------------------------------------------------------------
# module aliases
# ----------------------------------------------------------------------------------------------

class _AliasFinder(importlib.abc.MetaPathFinder):
    """``deep_gemm.X`` is ``deepgemm_ref.X`` and ``deep_ep.X`` is ``deepgemm_ref.ep.X`` (the same
    module objects); ``deep_ep.utils.refs`` / ``gate`` come from a DeepEP checkout when given, and
    ``deep_ep.utils.testing`` is the CPU stand-in."""

    def __init__(self, files: dict[str, Path], extra: dict[str, types.ModuleType]) -> None:
        self.files = files
        self.extra = extra

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name in self.extra:
            return importlib.util.spec_from_loader(name, _AliasLoader(self.extra[name]))
        if name in self.files:
            return _original_spec_from_file_location(name, str(self.files[name]))
        for alias, real in _ALIASES:
            if name == alias or name.startswith(alias + "."):
                real_name = real + name[len(alias):]
                try:
                    module = importlib.import_module(real_name)
                except ModuleNotFoundError as e:
                    if e.name == real_name:
                        return None
                    raise
                return importlib.util.spec_from_loader(name, _AliasLoader(module),
                                                       is_package=hasattr(module, "__path__"))
        return None


_original_spec_from_file_location = importlib.util.spec_from_file_location


# ----------------------------------------------------------------------------------------------
# install / uninstall
# ----------------------------------------------------------------------------------------------

@dataclass
class _Installed:
    settings: dict[str, Any]
    mode: Any
    finder: _AliasFinder
    saved_modules: dict[str, Any]
    saved_attrs: list[tuple[Any, str, Any]] = field(default_factory=list)
    saved_arch: str | None = None
    saved_env: str | None = None


_state: _Installed | None = None
_MISSING = object()


def installed() -> dict[str, Any] | None:
    """The active mapping's settings (``arch``, ``deep_ep_root``, ``bench_tests``), or None."""
    return None if _state is None else dict(_state.settings)


def _deep_ep_root(root: str | os.PathLike[str] | None, script: str | os.PathLike[str] | None) -> Path | None:
    """The DeepEP checkout: ``root``, else the closest ancestor of ``script`` holding deep_ep/utils/refs.py."""
    if root is not None:
        p = Path(root).resolve()
        if not (p / _DEEP_EP_FILES["deep_ep.utils.refs"]).is_file():
            raise arg_error("install", "deep_ep_root", "a DeepEP checkout (holding deep_ep/utils/refs.py)", str(p))
        return p
    if script is not None:
        for parent in Path(script).resolve().parents:
            if (parent / _DEEP_EP_FILES["deep_ep.utils.refs"]).is_file():
                return parent
    return None


def install(*, arch: str | None = None, deep_ep_root: str | os.PathLike[str] | None = None,
            bench_tests: int | None = None, script: str | os.PathLike[str] | None = None) -> None:
    """Install the CUDA-to-CPU mapping process-wide (see the module docstring) until :func:`uninstall`.

    arch:          a profile to make active (``sm90``, ``sm100``; None keeps the active one).
    deep_ep_root:  a DeepEP checkout whose ``deep_ep/utils/refs.py`` and ``gate.py`` serve
                   ``deep_ep.utils.refs`` / ``gate``; None: the closest ancestor of ``script``
                   that is one, if any.
    bench_tests:   the most timed calls of the timing helpers (``deep_gemm.testing.bench_kineto``,
                   DeepEP's ``bench_kineto``, TileLang's ``do_bench``; None: the test's counts).
                   Only the timing loops get shorter: what a test checks is unchanged.
    script:        the test file about to run (only to find ``deep_ep_root``).

    The settings are exported in ``DEEPGEMM_REF_DG_TESTS`` for the children ``multiprocessing``
    spawns, which install the same mapping at start-up.
    """
    global _state, _bench_cap
    if _state is not None:
        raise RuntimeError("deepgemm_ref.testing.dg_tests is already installed")
    if arch is not None and arch not in ("sm90", "sm100"):
        raise arg_error("install", "arch", "'sm90' or 'sm100' (DeepGEMM's CUDA targets)", repr(arch))
    if bench_tests is not None and (not isinstance(bench_tests, int) or isinstance(bench_tests, bool)
                                    or bench_tests < 1):
        raise arg_error("install", "bench_tests", "a positive int or None", repr(bench_tests))
    root = _deep_ep_root(deep_ep_root, script)
    torch = _torch()
    import multiprocessing.spawn as mp_spawn

    import torch.distributed as dist

    # Everything the aliases name is imported first and entered under its alias directly: an
    # import through the finder would set the parent's attribute to the module (e.g.
    # deepgemm_ref.testing.bench must stay DeepGEMM's function bench).
    for name in ("deepgemm_ref", "deepgemm_ref.utils.dist", "deepgemm_ref.testing", "deepgemm_ref.ep",
                 "deepgemm_ref.ep.utils.envs", "deepgemm_ref.ep.utils.math", "deepgemm_ref.mega.stages"):
        importlib.import_module(name)
    extra = {**_tilelang_modules(), "deep_ep.utils.testing": _ep_testing_module()}
    files = {n: root / rel for n, rel in _DEEP_EP_FILES.items()} if root is not None else {}
    aliased: dict[str, types.ModuleType] = {}
    for name, module in list(sys.modules.items()):
        for alias, real in _ALIASES:
            if name == real or name.startswith(real + "."):
                aliased.setdefault(alias + name[len(real):], module)
    touched = set(aliased) | set(extra) | set(files)
    touched |= {k for k in sys.modules if any(k == a or k.startswith(a + ".") for a, _ in _ALIASES)}
    saved_modules = {k: sys.modules.get(k, _MISSING) for k in touched}
    for k in touched:
        sys.modules.pop(k, None)
    sys.modules.update(aliased)
    sys.modules.update({k: v for k, v in extra.items() if k != "deep_ep.utils.testing"})
    finder = _AliasFinder(files, extra)
    sys.meta_path.insert(0, finder)

    settings = {"arch": arch, "deep_ep_root": None if root is None else str(root), "bench_tests": bench_tests}
    state = _Installed(settings, None, finder, saved_modules, saved_env=os.environ.get(ENV))
    _state = state
    try:
        _patch(state, torch, dist, mp_spawn, extra)
    except BaseException:
        uninstall()  # what was patched so far is put back
        raise
    os.environ[ENV] = json.dumps(settings)
    if arch is not None:
        state.saved_arch = get_arch()
        set_arch(arch)
    _bench_cap = bench_tests
    mode = _device_mode()
    mode.__enter__()
    state.mode = mode


def _patch(state: _Installed, torch: Any, dist: Any, mp_spawn: Any, extra: dict[str, types.ModuleType]) -> None:
    """Replace the attributes the mapping replaces, recording each old value in ``state``."""

    def patch(obj: Any, name: str, value: Any) -> None:
        state.saved_attrs.append((obj, name, getattr(obj, name, _MISSING)))
        setattr(obj, name, value)

    patch(sys.modules["deepgemm_ref.testing"], "bench_kineto", dg_bench_kineto)
    for name, value in _cuda_patches().items():
        patch(torch.cuda, name, value)
    for name, value in _dist_patches(dist).items():
        patch(dist, name, value)
    set_default_device = torch.set_default_device
    patch(torch, "set_default_device", lambda device: set_default_device("cpu" if _is_cuda(device) else device))

    def spec_from_file_location(name: str, location: Any = None, *args: Any, **kwargs: Any) -> Any:
        if location is not None and _is_tilelang_ops(location):
            return importlib.util.spec_from_loader(name, _AliasLoader(extra["tilelang_ops"]), origin=str(location),
                                                   is_package=True)
        return _original_spec_from_file_location(name, location, *args, **kwargs)

    patch(importlib.util, "spec_from_file_location", spec_from_file_location)
    get_command_line = mp_spawn.get_command_line

    def child_command_line(**kwds: Any) -> list[str]:
        cmd = list(get_command_line(**kwds))
        if "-c" in cmd:
            i = cmd.index("-c") + 1
            cmd[i] = f"import deepgemm_ref.testing.dg_tests as _dg; _dg.install_from_env(); {cmd[i]}"
        return cmd

    patch(mp_spawn, "get_command_line", child_command_line)


def install_from_env() -> None:
    """Install the mapping with the settings of ``DEEPGEMM_REF_DG_TESTS`` (what a spawned child runs first)."""
    settings = json.loads(os.environ.get(ENV) or "{}")
    install(arch=settings.get("arch"), deep_ep_root=settings.get("deep_ep_root"),
            bench_tests=settings.get("bench_tests"))


def uninstall() -> None:
    """Undo :func:`install` (from the installing thread); does nothing when not installed."""
    global _state, _bench_cap
    state = _state
    if state is None:
        return
    _state = None
    _bench_cap = None
    if state.mode is not None:
        state.mode.__exit__(None, None, None)
    for obj, name, value in reversed(state.saved_attrs):
        if value is _MISSING:
            delattr(obj, name)
        else:
            setattr(obj, name, value)
    sys.meta_path.remove(state.finder)
    for k in [k for k in sys.modules if any(k == a or k.startswith(a + ".") for a, _ in _ALIASES)]:
        module = sys.modules.pop(k)
        # an import through the finder of a name this package lacks (deep_ep.utils.testing, refs,
        # gate) set an attribute on the real parent module: take it away again
        parent_name, _, leaf = k.rpartition(".")
        parent = sys.modules.get(next((real + parent_name[len(alias):] for alias, real in _ALIASES
                                       if parent_name == alias or parent_name.startswith(alias + ".")), ""))
        if (k in state.finder.extra or k in state.finder.files) and parent is not None \
                and getattr(parent, leaf, None) is module:
            delattr(parent, leaf)
    for k, v in state.saved_modules.items():
        if v is _MISSING:
            sys.modules.pop(k, None)
        else:
            sys.modules[k] = v
    if state.saved_env is None:
        os.environ.pop(ENV, None)
    else:
        os.environ[ENV] = state.saved_env
    if state.saved_arch is not None:
        set_arch(state.saved_arch)


@contextlib.contextmanager
def cuda_on_cpu(*, arch: str | None = None, deep_ep_root: str | os.PathLike[str] | None = None,
                bench_tests: int | None = None) -> Iterator[None]:
    """The mapping for the block (see :func:`install`); everything is restored on exit."""
    install(arch=arch, deep_ep_root=deep_ep_root, bench_tests=bench_tests)
    try:
        yield
    finally:
        uninstall()


# ----------------------------------------------------------------------------------------------
# command line
# ----------------------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_USAGE = ("usage: python -m deepgemm_ref.testing.dg_tests [--arch {sm90,sm100}] [--deep-ep-root DIR] "
          "[--bench-tests N] PATH [ARGS...]")
_OPTIONS = ("--arch", "--deep-ep-root", "--bench-tests")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m deepgemm_ref.testing.dg_tests [--arch A] [--deep-ep-root DIR] [--bench-tests N] PATH
    [ARGS...]``: run the test file PATH with its arguments ARGS under the mapping (returns the exit
    status; the runner's options come before PATH, everything after it is the test's)."""
    args = list(sys.argv[1:] if argv is None else argv)
    options: dict[str, str] = {}
    while args and args[0] in _OPTIONS:
        if len(args) < 2:
            print(f"dg_tests: {args[0]} needs a value\n{_USAGE}", file=sys.stderr)
            return 2
        options[args[0]] = args[1]
        args = args[2:]
    bench_tests = options.get("--bench-tests")
    if bench_tests is not None and not (bench_tests.isdigit() and int(bench_tests) > 0):
        print(f"dg_tests: --bench-tests: expected a positive integer; got {bench_tests!r}\n{_USAGE}", file=sys.stderr)
        return 2
    if not args or args[0] in ("-h", "--help"):
        print(__doc__.split("\n\n")[0])
        print(_USAGE)
        return 0 if args else 2
    script = args[0]
    if not Path(script).is_file():
        print(f"dg_tests: no test file {script!r}\n{_USAGE}", file=sys.stderr)
        return 2
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = args
    sys.path.insert(0, str(Path(script).resolve().parent))
    install(arch=options.get("--arch"), deep_ep_root=options.get("--deep-ep-root"),
            bench_tests=None if bench_tests is None else int(bench_tests), script=script)
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        uninstall()
        sys.argv, sys.path[:] = saved_argv, saved_path
    return 0


if __name__ == "__main__":  # pragma: no cover - command line: run the package's copy of this module
    from deepgemm_ref.testing.dg_tests import main as _main

    sys.exit(_main())
