"""The pytest plugin of deepgemm_ref (entry point ``pytest11``: ``deepgemm_ref.pytest_plugin``):
one test file for the emulator and for the real library, and golden bundles as test items.

Options (each also an environment variable):

``--dg-backend emulator|real`` (``DG_BACKEND``; default ``emulator``)
    What the ``deep_gemm`` fixture yields: this package, or the real library
    (``import deep_gemm``; tests using it are skipped, with the import error as the reason, where
    it cannot be imported).
``--dg-module NAME`` (``DG_MODULE``; default ``deep_gemm``)
    The real library's module (a stand-in module for testing the tests).
``--dg-ep-module NAME`` (``DG_EP_MODULE``; default ``deep_ep``)
    The real DeepEP / DeepEP-Ascend module the ``deep_ep`` fixture yields under ``--dg-backend real``.
``--dg-ranks threads|processes`` (``DG_RANKS``; default ``threads``)
    How the ``dg_ep_ranks`` and ``dg_group`` fixtures run the expert-parallel ranks of the
    emulator: ``threads``, every rank in this process (threads for DeepEP, Mega MoE's
    ``EmulatedGroup``); ``processes``, one process per rank, the way the real library runs them:
    launch pytest under torchrun (``torchrun --nproc-per-node N -m pytest --dg-ranks processes
    tests/...``) and each process plays its own rank of a ``torch.distributed`` world of N
    processes, which the plugin initialises from torchrun's variables when the first test asks
    for ranks (gloo; nccl / hccl for the real library on cuda / npu) and destroys at the end.  A
    test that asks for another number of ranks than N is skipped, naming both.  Every process
    runs every test, so each test must make the same collectives on every rank; hypothesis draws
    the same examples on every rank (the plugin fixes hypothesis's seed unless
    ``--hypothesis-seed`` gives one, which also leaves its example database unused), and its
    ``deadline`` should be ``None`` for such tests (a rank waits for its peers).  Under
    ``--dg-backend real`` the ranks are always processes; ``processes`` also makes the plugin
    initialise the world from torchrun's variables.
``--dg-device DEVICE`` (``DG_DEVICE``)
    The ``dg_device`` fixture: ``cpu`` for the emulator; for the real library ``cuda`` where
    torch sees a CUDA device, else ``npu`` where torch_npu does, else ``cpu``.
``--dg-arch PROFILE`` (``DG_ARCH``)
    The emulator's profile for tests that do not choose one (default: the package's, ``sm100``).
``--dg-bundle PATH`` (repeatable)
    Every case of the golden bundle at PATH becomes a test item ``PATH/manifest.json::<case id>``:
    replayed through the backend (the same path as ``deepgemm-ref replay``) and checked (as
    ``deepgemm-ref check``); a failure shows the checker's message.  Without test paths on the
    command line only the bundles' items are collected.  Works with ``--junitxml``.
    ``--dg-lambda``, ``--dg-u-acc`` (``2^-13`` or a number), ``--dg-accumulation`` (the model),
    ``--dg-no-bias-test``, ``--dg-bias-threshold`` and ``--dg-strict`` set the checker.

Fixtures (session-scoped, so hypothesis ``@given`` tests take them): ``deep_gemm`` (the module
under test), ``dg_backend`` (``"emulator"`` or ``"real"``), ``dg_device``, ``dg_arch`` (``None``;
parametrize it, ``@pytest.mark.parametrize("dg_arch", ["sm90", "sm100"])``, to run a test under
each profile: the emulator switches to it around the test's call, the real library skips the
variants its device is not), ``dg_group`` (``dg_group(num_ranks)`` -> ``rank``, with ``rank(r)`` the
process group of expert-parallel rank ``r`` of a Mega MoE test and ``rank.local_ranks`` the ranks
this process plays: under ``--dg-ranks threads`` the emulator's ``EmulatedGroup``, every rank
local; with one process per rank (``--dg-ranks processes``, or the real library) this process's
rank of an initialised ``torch.distributed`` world of ``num_ranks`` processes, ``rank(r)`` its
world group for its own ``r`` only, and the test skips otherwise; so a test written as ``for r in
rank.local_ranks: ...`` runs in both forms); ``deep_ep`` (DeepEP's module: :mod:`deepgemm_ref.ep`,
or the real ``deep_ep``) and ``dg_ep_ranks`` (``dg_ep_ranks(fn, num_ranks)`` runs ``fn(group)`` for
every expert-parallel rank and returns the results in rank order: under ``--dg-ranks threads`` the
emulator's ranks are threads of this process (:func:`deepgemm_ref.ep.run_emulated`); with one
process per rank this process's rank of an initialised ``torch.distributed`` world of
``num_ranks`` processes runs, the list holds its result at its index (``None`` elsewhere), and the
test skips otherwise); and, per test,
``dg_npu`` (``torch.npu`` for DeepGEMM-Ascend's flows: under the emulator the CPU namespace of
:mod:`deepgemm_ref.testing.npu_shim`, installed for the test, so ``device='npu'`` tensors land on
the CPU, ``import deep_gemm`` is the emulator and the profile is ``ascend950``; under the real
library ``torch.npu`` of torch_npu, skipped where torch_npu is absent).  Under the real backend a
test using ``deep_gemm`` also has ``dg_device`` as torch's default device during its call, so
tensors it creates land on the device.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

__all__ = ["BundleFile", "BundleItem", "CaseMismatch", "RankGroups", "backend_module", "ep_module", "default_device"]

_BACKENDS = ("emulator", "real")
_RANKS = ("threads", "processes")
_BUNDLES = pytest.StashKey[dict[str, Path]]()
_WORLD = pytest.StashKey[dict[str, Any]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("deepgemm_ref", "deepgemm_ref: the DeepGEMM module under test and golden bundles")
    group.addoption("--dg-backend", choices=_BACKENDS, default=None,
                    help="the deep_gemm fixture's module: emulator (deepgemm_ref, default) or real (import deep_gemm); "
                         "env DG_BACKEND")
    group.addoption("--dg-module", default=None,
                    help="the real library's module name (default deep_gemm); env DG_MODULE")
    group.addoption("--dg-ep-module", default=None,
                    help="the real DeepEP module for the deep_ep fixture (default deep_ep); env DG_EP_MODULE")
    group.addoption("--dg-ranks", choices=_RANKS, default=None,
                    help="expert-parallel ranks of the emulator's dg_ep_ranks / dg_group: threads (in this process, "
                         "default) or processes (one per rank: run pytest under torchrun --nproc-per-node N); "
                         "env DG_RANKS")
    group.addoption("--dg-device", default=None,
                    help="the dg_device fixture: cpu, cuda, npu (default: cpu for the emulator, the available device "
                         "for the real library); env DG_DEVICE")
    group.addoption("--dg-arch", default=None,
                    help="the emulator's profile for tests that do not choose one (sm90, sm100, ascend950); "
                         "env DG_ARCH")
    group.addoption("--dg-bundle", action="append", default=[], metavar="PATH",
                    help="a golden bundle whose cases become test items (repeatable)")
    group.addoption("--dg-lambda", type=float, default=None, help="the checker's lambda for --dg-bundle items")
    group.addoption("--dg-u-acc", default=None, help="the checker's u_acc for --dg-bundle items (2^-13 or a number)")
    group.addoption("--dg-accumulation", default=None, metavar="MODEL",
                    help="--dg-bundle items: the device's accumulator model (fp32, 'limited(13, 128)')")
    group.addoption("--dg-no-bias-test", action="store_true", default=False,
                    help="--dg-bundle items: skip the systematic-error (bias) test")
    group.addoption("--dg-bias-threshold", type=float, default=None, metavar="LOG10P",
                    help="--dg-bundle items: log10 p below which the bias test fails (default -12)")
    group.addoption("--dg-strict", action="store_true", default=False,
                    help="--dg-bundle items: elements between the probabilistic and the hard bound fail")


def _option(config: pytest.Config, name: str, env: str) -> Any:
    value = config.getoption(name, default=None)
    return value if value not in (None, "") else (os.environ.get(env) or None)


def _backend(config: pytest.Config) -> str:
    value = _option(config, "--dg-backend", "DG_BACKEND") or "emulator"
    if value not in _BACKENDS:
        raise pytest.UsageError(f"--dg-backend / DG_BACKEND: expected emulator or real; got {value!r}")
    return str(value)


def _ranks_form(config: pytest.Config) -> str:
    """``threads`` or ``processes`` (``--dg-ranks`` / ``DG_RANKS``); the real backend's ranks are
    always processes."""
    value = _option(config, "--dg-ranks", "DG_RANKS") or "threads"
    if value not in _RANKS:
        raise pytest.UsageError(f"--dg-ranks / DG_RANKS: expected threads or processes; got {value!r}")
    return "processes" if _backend(config) == "real" else str(value)


def _world(config: pytest.Config, num_ranks: int, what: str) -> tuple[int, Any]:
    """(this process's rank, the world's group) of the torch.distributed world of ``num_ranks``
    processes this test runs in, initialised from torchrun's variables under ``--dg-ranks
    processes`` where it is not yet; ``pytest.skip`` (naming both counts) otherwise."""
    try:
        import torch.distributed as dist
    except ImportError:
        pytest.skip(f"{what} with one process per rank needs torch.distributed")
    if not dist.is_available():
        pytest.skip(f"{what} with one process per rank needs torch.distributed (this torch has none)")
    explicit = _option(config, "--dg-ranks", "DG_RANKS") == "processes"
    if not dist.is_initialized() and explicit:
        _init_world(config, dist)
    how = (f"torchrun --nproc-per-node {num_ranks} -m pytest --dg-ranks processes")
    if not dist.is_initialized():
        pytest.skip(f"{num_ranks} expert-parallel ranks: one process per rank needs an initialised torch.distributed "
                    f"world of {num_ranks} processes ({how})")
    world = dist.get_world_size()
    if world != num_ranks:
        pytest.skip(f"{num_ranks} expert-parallel ranks: this torch.distributed world has {world} processes "
                    f"(one per rank: {how})")
    return dist.get_rank(), dist.group.WORLD


def _init_world(config: pytest.Config, dist: Any) -> None:
    """Initialise the world torchrun's variables describe (once per session; destroyed at its end)."""
    keys = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    if not all(os.environ.get(k) for k in keys):
        return  # not under torchrun: the caller skips
    backend = "gloo"
    if _backend(config) == "real":
        device = default_device(config)
        backend = {"cuda": "nccl", "npu": "hccl"}.get(device.split(":")[0], "gloo")
        if backend == "nccl":
            import torch

            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", os.environ["RANK"])))
    dist.init_process_group(backend, init_method="env://", world_size=int(os.environ["WORLD_SIZE"]),
                            rank=int(os.environ["RANK"]))
    config.stash[_WORLD] = {"made": True}


class RankGroups:
    """What ``dg_group(num_ranks)`` gives: ``rank(r)`` is expert-parallel rank ``r``'s process group;
    ``local_ranks`` the ranks this process plays (every rank in one process, its own with one
    process per rank); ``num_ranks`` the group's size."""

    def __init__(self, num_ranks: int, local_ranks: list[int], group_of: Callable[[int], Any]) -> None:
        self.num_ranks = num_ranks
        self.local_ranks = local_ranks
        self._group_of = group_of

    def __call__(self, r: int) -> Any:
        if r not in self.local_ranks:
            from .errors import arg_error

            raise arg_error("dg_group(...)", "r", f"a rank this process plays ({self.local_ranks}; with one process "
                            "per rank iterate over dg_group(n).local_ranks)", repr(r))
        return self._group_of(r)

    def __repr__(self) -> str:
        return f"RankGroups(num_ranks={self.num_ranks}, local_ranks={self.local_ranks})"


def backend_module(config: pytest.Config) -> Any:
    """The module under test (this package, or the real library; ``pytest.skip`` where it cannot
    be imported)."""
    if _backend(config) == "emulator":
        import deepgemm_ref

        return deepgemm_ref
    return _import_real(_option(config, "--dg-module", "DG_MODULE") or "deep_gemm", "the library")


def ep_module(config: pytest.Config) -> Any:
    """DeepEP's module under test: :mod:`deepgemm_ref.ep`, or the real ``deep_ep`` (``--dg-ep-module``;
    ``pytest.skip`` where it cannot be imported)."""
    if _backend(config) == "emulator":
        return importlib.import_module("deepgemm_ref.ep")
    return _import_real(_option(config, "--dg-ep-module", "DG_EP_MODULE") or "deep_ep", "DeepEP")


def _import_real(name: str, what: str) -> Any:
    """``import name`` for ``--dg-backend real``; ``pytest.skip`` naming why where it cannot be imported."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        pytest.skip(f"--dg-backend real: cannot import {name!r} ({e}); install {what} on its device host, or "
                    "run with --dg-backend emulator")
    except Exception as e:  # a library that fails while importing (no device, a driver error)
        pytest.skip(f"--dg-backend real: importing {name!r} failed ({type(e).__name__}: {e})")


def default_device(config: pytest.Config) -> str:
    """``--dg-device`` / ``DG_DEVICE``, else ``cpu`` for the emulator and the available torch
    device for the real library."""
    given = _option(config, "--dg-device", "DG_DEVICE")
    if given:
        return str(given)
    if _backend(config) == "emulator":
        return "cpu"
    try:
        import torch
    except ImportError:
        return "cpu"
    if torch.cuda.is_available():
        return "cuda"
    npu = getattr(torch, "npu", None)
    if npu is not None and getattr(npu, "is_available", lambda: False)():
        return "npu"
    return "cpu"


def _device_arch(device: str) -> str | None:
    """The profile name of the real library's device, where it can be told."""
    if device.startswith("npu"):
        return "ascend950"
    if device.startswith("cuda"):
        try:
            import torch

            major = torch.cuda.get_device_capability()[0]
        except Exception:  # no CUDA runtime
            return None
        return {9: "sm90", 10: "sm100"}.get(int(major))
    return None


def pytest_report_header(config: pytest.Config) -> str:
    backend = _backend(config)
    module = "deepgemm_ref" if backend == "emulator" else (_option(config, "--dg-module", "DG_MODULE") or "deep_gemm")
    device = _option(config, "--dg-device", "DG_DEVICE") or ("cpu" if backend == "emulator" else "auto")
    return f"deepgemm_ref: backend {backend} ({module}), device {device}"


@pytest.fixture(scope="session")
def dg_backend(request: pytest.FixtureRequest) -> str:
    """``"emulator"`` or ``"real"`` (``--dg-backend`` / ``DG_BACKEND``)."""
    return _backend(request.config)


@pytest.fixture(scope="session")
def dg_device(request: pytest.FixtureRequest) -> str:
    """The torch device the module under test computes on (``--dg-device`` / ``DG_DEVICE``)."""
    return default_device(request.config)


@pytest.fixture(scope="session")
def dg_arch() -> str | None:
    """The profile a test runs under; ``None`` unless the test parametrizes ``dg_arch``."""
    return None


@pytest.fixture(scope="session")
def deep_gemm(request: pytest.FixtureRequest) -> Any:
    """The module under test: this package (the emulator) or the real library (the tests that
    use it are skipped where it cannot be imported).  Session-scoped, so hypothesis tests take
    it; the profile (``dg_arch``) is set around each test's call."""
    return backend_module(request.config)


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Any:
    """Around the call of a test that uses ``deep_gemm`` (after every fixture's setup, so a
    conftest's reset of the emulator's settings comes first): the emulator runs under the test's
    ``dg_arch`` (or ``--dg-arch``); the real library skips another arch's variant and has
    ``dg_device`` as torch's default device."""
    args: dict[str, Any] = pyfuncitem.funcargs
    if "deep_gemm" not in args:
        return (yield)
    config = pyfuncitem.config
    arch = args.get("dg_arch")
    if _backend(config) == "emulator":
        # (a dg_npu test runs under the shim's ascend950 unless it parametrizes dg_arch)
        arch = arch or (None if "dg_npu" in args else _option(config, "--dg-arch", "DG_ARCH"))
        ctx: Any = args["deep_gemm"].numerics(arch=arch) if arch else contextlib.nullcontext()
    else:
        device = str(args.get("dg_device") or default_device(config))
        arch = arch or ("ascend950" if "dg_npu" in args else None)
        actual = _device_arch(device) if arch else None
        if actual is not None and actual != arch:
            pytest.skip(f"a test variant for {arch}; the device {device} is {actual}")
        ctx = _default_torch_device(device)
    with ctx:
        return (yield)


@contextlib.contextmanager
def _default_torch_device(device: str) -> Iterator[None]:
    if device == "cpu":
        yield
        return
    try:
        import torch
    except ImportError:
        yield
        return
    if not hasattr(torch, "set_default_device"):
        yield
        return
    previous = torch.get_default_device() if hasattr(torch, "get_default_device") else torch.device("cpu")
    torch.set_default_device(device)
    try:
        yield
    finally:
        torch.set_default_device(previous)


@pytest.fixture(scope="session")
def dg_group(request: pytest.FixtureRequest, deep_gemm: Any) -> Callable[[int], RankGroups]:
    """``dg_group(num_ranks)`` -> ``rank`` (:class:`RankGroups`): ``rank(r)`` the process group of
    expert-parallel rank ``r``, ``rank.local_ranks`` the ranks this process plays."""
    config = request.config

    def make(num_ranks: int) -> RankGroups:
        if _ranks_form(config) == "threads":
            return RankGroups(num_ranks, list(range(num_ranks)), deep_gemm.mega.EmulatedGroup(num_ranks).rank)
        me, group = _world(config, num_ranks, "a Mega MoE test")
        return RankGroups(num_ranks, [me], lambda r: group)

    return make


@pytest.fixture(scope="session")
def deep_ep(request: pytest.FixtureRequest) -> Any:
    """DeepEP's module under test: :mod:`deepgemm_ref.ep` (the emulator) or the real ``deep_ep``."""
    return ep_module(request.config)


@pytest.fixture(scope="session")
def dg_ep_ranks(request: pytest.FixtureRequest, deep_ep: Any) -> Callable[[Callable[[Any], Any], int], list[Any]]:
    """``dg_ep_ranks(fn, num_ranks)``: ``fn(group)`` for every expert-parallel rank, results in rank
    order.  ``--dg-ranks threads`` (the emulator's default): the ranks are threads of this process
    (``run_emulated``: collectives rendezvous, a failing rank fails the others).  One process per
    rank (``--dg-ranks processes``, or the real library): this process's rank of an initialised
    ``torch.distributed`` world of ``num_ranks`` processes (the result list holds only this rank's
    result, at its index); skipped otherwise."""
    config = request.config

    def run(fn: Callable[[Any], Any], num_ranks: int) -> list[Any]:
        if _ranks_form(config) == "threads":
            return list(deep_ep.run_emulated(fn, num_ranks))
        me, group = _world(config, num_ranks, "a DeepEP test")
        out: list[Any] = [None] * num_ranks
        out[me] = fn(group)
        return out

    return run


@pytest.fixture
def dg_npu(deep_gemm: Any, dg_backend: str) -> Iterator[Any]:
    """``torch.npu`` for a test written as DeepGEMM-Ascend's: the emulator's CPU shim
    (:func:`deepgemm_ref.testing.npu_shim.npu_on_cpu`, for the test) or torch_npu's namespace."""
    if dg_backend == "emulator":
        from .testing.npu_shim import npu_on_cpu

        with npu_on_cpu() as shim:
            yield shim
        return
    try:
        import torch
        import torch_npu  # noqa: F401  (registers torch.npu)
    except ImportError as e:
        pytest.skip(f"--dg-backend real: a DeepGEMM-Ascend test needs torch_npu ({e})")
    npu = getattr(torch, "npu", None)
    if npu is None or not npu.is_available():
        pytest.skip("--dg-backend real: a DeepGEMM-Ascend test needs an NPU (torch.npu.is_available() is False)")
    yield npu


# ----------------------------------------------------------------------------------------------
# --dg-bundle: every case of a bundle is a test item
# ----------------------------------------------------------------------------------------------

def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "dg_bundle_case: a case of a golden bundle (--dg-bundle)")
    _check_options(config)  # a bad value is a usage error (exit 4), before any test runs
    if _option(config, "--dg-ranks", "DG_RANKS") == "processes":
        _same_examples_on_every_rank()
    manifests: dict[str, Path] = {}
    for given in config.getoption("--dg-bundle", default=None) or []:
        root = Path(given).expanduser().resolve()
        manifest = root / "manifest.json"
        if not manifest.is_file():
            raise pytest.UsageError(f"--dg-bundle {given}: not a golden bundle (no manifest.json in {root})")
        manifests[str(manifest)] = manifest
    config.stash[_BUNDLES] = manifests
    if not manifests:
        return
    explicit = getattr(config, "args_source", None) == pytest.Config.ArgsSource.ARGS
    if explicit:
        config.args.extend(str(m) for m in manifests.values())
    else:  # only the bundles' items
        config.args[:] = [str(m) for m in manifests.values()]


_CHECKER = pytest.StashKey[dict[str, Any]]()


def _check_options(config: pytest.Config) -> None:
    """Every ``--dg-*`` option and ``DG_*`` variable checked once, up front: a value out of its
    range or set is a :class:`pytest.UsageError` naming the option (pytest exits 4), never a
    failed or erroring test."""
    import re

    _backend(config)
    _ranks_form(config)
    for opt, env in (("--dg-module", "DG_MODULE"), ("--dg-ep-module", "DG_EP_MODULE")):
        name = _option(config, opt, env)
        if name is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", name):
            raise pytest.UsageError(f"{opt} / {env}: expected a Python module name; got {name!r}")
    device = _option(config, "--dg-device", "DG_DEVICE")
    if device is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(:[0-9]+)?", device):
        raise pytest.UsageError(f"--dg-device / DG_DEVICE: expected a torch device such as cpu, cuda:0 or npu; "
                                f"got {device!r}")
    arch = _option(config, "--dg-arch", "DG_ARCH")
    if arch is not None:
        from .profiles import PROFILES

        if arch not in PROFILES:
            raise pytest.UsageError(f"--dg-arch / DG_ARCH: expected one of {', '.join(PROFILES)}; got {arch!r}")
    config.stash[_CHECKER] = _checker_options_of(config)


def _checker_options_of(config: pytest.Config) -> dict[str, Any]:
    """The checker options of ``--dg-bundle`` items, each range-checked (:class:`pytest.UsageError`
    naming the option)."""
    import math

    opts: dict[str, Any] = {"strict": bool(config.getoption("--dg-strict", default=False))}
    lam = config.getoption("--dg-lambda", default=None)
    if lam is not None:
        if not (math.isfinite(lam) and lam > 0):
            raise pytest.UsageError(f"--dg-lambda: expected a finite number > 0; got {lam!r}")
        opts["lam"] = lam
    u = config.getoption("--dg-u-acc", default=None)
    if u is not None:
        text = str(u).strip().replace("**", "^")
        try:
            value = 2.0 ** int(text[2:]) if text.startswith("2^") else float(text)
        except (ValueError, OverflowError):
            value = math.nan
        if not (math.isfinite(value) and 0 < value < 1):
            raise pytest.UsageError(f"--dg-u-acc: expected a unit roundoff in (0, 1), a number or 2^e (e < 0); "
                                    f"got {u!r}")
        opts["u_acc"] = value
    acc = config.getoption("--dg-accumulation", default=None)
    if acc is not None:
        from .config import parse_accumulation
        from .errors import DGArgumentError

        try:
            parse_accumulation(acc)
        except DGArgumentError as e:
            raise pytest.UsageError(f"--dg-accumulation: {e}") from None
        opts["accumulation"] = acc
    if config.getoption("--dg-no-bias-test", default=False):
        opts["bias_test"] = False
    threshold = config.getoption("--dg-bias-threshold", default=None)
    if threshold is not None:
        if not (math.isfinite(threshold) and threshold < 0):
            raise pytest.UsageError(f"--dg-bias-threshold: expected a finite log10 p-value < 0; got {threshold!r}")
        opts["bias_threshold"] = threshold
    return opts


def _same_examples_on_every_rank() -> None:
    """Hypothesis's seed fixed (what ``--hypothesis-seed`` sets, unless it was given): every rank
    process draws the same examples, so their collectives match (a fixed seed also leaves the
    example database unused, which the processes would otherwise read and write at will)."""
    try:
        import hypothesis.core as core
    except ImportError:
        return
    if getattr(core, "global_force_seed", None) is None:
        setattr(core, "global_force_seed", 0)  # noqa: B010 - what --hypothesis-seed sets


def pytest_unconfigure(config: pytest.Config) -> None:
    if config.stash.get(_WORLD, {}).get("made"):
        try:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - best effort at the end of the session
            pass


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    manifests = parent.config.stash.get(_BUNDLES, {})
    if str(file_path.resolve()) in manifests:
        return BundleFile.from_parent(parent, path=file_path)
    return None


class CaseMismatch(AssertionError):
    """A bundle case whose replay does not match its goldens (the message is the checker's)."""


class _CaseFailed(Exception):
    """A bundle case that could not be replayed or loaded (the message says why)."""


class BundleFile(pytest.File):
    """A golden bundle's manifest: one :class:`BundleItem` per case."""

    def collect(self) -> Iterator[BundleItem]:
        from .golden.bundle import BundleError, load_bundle
        from .golden.reading import printable

        try:
            self.bundle = load_bundle(self.path.parent)
        except BundleError as e:
            raise self.CollectError(f"--dg-bundle {self.path.parent}: {e}") from None
        for case_id in list(self.bundle.cases) + list(self.bundle.incomplete):
            # the item's name (its node id, in JUnit XML and pytest's cache): a case id that holds
            # a lone surrogate (valid JSON) with it escaped, "\\ud800"
            yield BundleItem.from_parent(self, name=printable(case_id), case_id=case_id)


class BundleItem(pytest.Item):
    """One case of a bundle: replayed through the backend and checked against its goldens."""

    def __init__(self, *, case_id: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.case_id = case_id
        self.add_marker("dg_bundle_case")

    def runtest(self) -> None:
        from .errors import DGArgumentError
        from .golden.bundle import BundleError
        from .golden.case import Case

        parent = self.parent
        assert isinstance(parent, BundleFile)
        bundle = parent.bundle
        if self.case_id not in bundle.cases:
            raise _CaseFailed(f"case {self.case_id!r} was not generated (the bundle is incomplete; "
                              "deepgemm-ref golden --resume finishes it)")
        module = backend_module(self.config)
        real = _backend(self.config) == "real"
        entry = bundle.cases[self.case_id]
        ranks = (entry.get("driver") or {}).get("ranks", 1)
        if real and ranks != 1:
            pytest.skip(f"a Mega MoE case with {ranks} ranks replays through the emulator only (one process per rank "
                        "is not driven here)")
        try:
            case = Case.from_bundle(bundle.case(self.case_id))
        except BundleError as e:
            raise _CaseFailed(f"cannot load the case: {e}") from None
        device = default_device(self.config) if real or _option(self.config, "--dg-device", "DG_DEVICE") else None
        try:
            outputs = case.call(module, device=device)
        except KeyboardInterrupt:
            raise
        except SystemExit as e:  # the module's kernel ended the process: the case failed, the session goes on
            raise _CaseFailed(f"{case.describe()}: the call failed: the module's code called sys.exit({e.code!r})") \
                from None
        except Exception as e:
            what = str(e) if isinstance(e, DGArgumentError) else f"{type(e).__name__}: {e}"
            raise _CaseFailed(f"{case.describe()}: the call failed: {what}") from e
        result = case.compare(outputs, **self._checker_options())
        if not result.ok:
            raise CaseMismatch(result.message())

    def _checker_options(self) -> dict[str, Any]:
        opts = self.config.stash.get(_CHECKER, None)
        return dict(opts) if opts is not None else _checker_options_of(self.config)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException],
                     style: Any = None) -> str | Any:
        if isinstance(excinfo.value, (CaseMismatch, _CaseFailed)):
            from .golden.reading import printable

            return printable(str(excinfo.value))
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, f"golden case {self.name}"
