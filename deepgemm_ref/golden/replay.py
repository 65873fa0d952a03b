"""Replay a bundle through a real library (or through deepgemm_ref itself) and save its outputs.

On a host with DeepGEMM-Ascend (torch + torch_npu)::

    deepgemm-ref replay BUNDLE --module deep_gemm --device npu --out OUTPUTS.safetensors

loads every case, converts its inputs to torch tensors on the device, applies the manifest's
layout transforms with the module's own functions, calls the named function with the stored
arguments, and saves the outputs as ``<case id>/<output name>`` in a safetensors file.  It needs
only torch and this package.  With ``--module deepgemm_ref`` it runs here, on NumPy arrays (or on
torch CPU tensors with ``--torch``).

A case that fails (the library raises, a case file does not verify) does not stop the replay:
its error is recorded and the other cases go on.  The outputs file holds the outputs of the
cases that succeeded, and its metadata ``deepgemm_ref.errors`` (JSON: case id -> error) and
``deepgemm_ref.cases`` (JSON: the replayed case ids), which ``check`` reports as failures.

``device``: with a torch module, the torch device every input and output is moved to (checked
before the first case: an unknown or unavailable device is refused).  The deepgemm_ref module
computes on the host, so there only ``None`` or ``"cpu"`` is accepted (another device is
refused, never ignored).

One process per rank.  Launched under torchrun (``torchrun --nproc-per-node N -m
deepgemm_ref.cli replay BUNDLE --module M --out OUT``: every process gets the same arguments),
each process joins the world (``init_process_group`` from torchrun's variables: gloo, or nccl /
hccl with ``--device cuda`` / ``npu``), and the cases split three ways:

* a case of an EP family (``ep_dispatch``, ``ep_combine``, Mega MoE) with N ranks: every process
  replays its own rank through M (DeepEP's buffers on the world's group, Mega MoE's
  ``get_symm_buffer_for_mega_moe(group, ...)`` and kernels), which writes that rank's row of
  every output (the outputs are stacked over the ranks).  The ranks then tell each other how it
  went; a case that failed on any rank is recorded as failed (with each rank's message);
  otherwise every rank sends its rows to rank 0 (as bytes, over gloo) and rank 0 stacks them:
  ``output[r]`` is rank r's row, so the merged outputs are those of a replay in one process;
* a case with one rank: rank 0, on a one-process group of its own;
* every other case: rank 0 alone, after the EP cases (the other processes are done by then).

Rank 0 then writes the one outputs file (atomically), which ``check`` reads as any other.  A
case of an EP family whose ranks are not N is refused before any case runs, on every rank (so
no rank waits for another); so is any problem one rank finds with the arguments.  A case that
fails on one rank before a collective the others wait in is noticed by this package's
transports (the collectives' labels differ) and recorded; a real library's own collectives wait
for the group's timeout instead.
"""

from __future__ import annotations

import importlib
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import DGArgumentError
from ..interop import from_numpy, to_numpy
from ..settings import numerics
from . import safetensors as st
from .bundle import Bundle, BundleError, CaseData, load_bundle
from .call import entry_family, fresh_outputs, quiet_float_errors, run_case_call
from .cases import validate_spec
from .progress import as_progress
from .ranks import agree, entry_ranks, gather_to_root, pack, rank_scope, runs_ranks_in_process, torchrun_env, unpack
from .reading import strict_json
from .resources import ResourceError, default_memory_limit, format_size

__all__ = ["replay", "ReplayOutputs", "ERRORS_KEY", "CASES_KEY", "read_replay_record", "call_case", "module_profile"]

#: Metadata key of the outputs file: JSON object case id -> error message.
ERRORS_KEY = "deepgemm_ref.errors"
#: Metadata key of the outputs file: JSON list of the replayed case ids.
CASES_KEY = "deepgemm_ref.cases"


class ReplayOutputs(dict[str, np.ndarray]):
    """The outputs of a replay (``<case id>/<output>`` -> array), with ``errors`` (case id -> error).

    Under torchrun (a world of more than one process): ``rank`` and ``world`` say which process
    this is; rank 0 holds every output and ``written`` is True there only (the other ranks hold
    none; their ``errors`` are those of the cases every rank replayed)."""

    errors: dict[str, str]
    written: bool = True
    rank: int = 0
    world: int = 1
    #: case id -> a note for the cases that ran although the module reports another profile than
    #: the one they were generated for (their outputs may differ from the goldens for that reason)
    notes: dict[str, str] = {}  # (never mutated: each replay assigns its own dict)


def _to_device(x: Any, use_torch: bool, device: str | None) -> Any:
    if not use_torch or x is None:
        return x
    if isinstance(x, st.PackedFP4):
        x = x.data
    t = from_numpy(np.ascontiguousarray(x), "torch")
    return t.to(device) if device and device != "cpu" else t


def _apply_transforms(module: Any, case: CaseData, tensors: dict[str, Any]) -> dict[str, Any]:
    out = dict(tensors)
    family = entry_family(case.entry)
    for name, t in case.entry.get("transforms", {}).items():
        if not family.allows(t["function"]):
            raise BundleError(f"manifest: case {case.id!r}: transform {t['function']!r} is not a function of its "
                              "family")
        fn = getattr(module, t["function"], None)
        if fn is None:
            continue  # a module without the transform consumes the user form itself
        x = out[name]
        back = bool(t.get("transpose_back"))
        if back:
            x = x.T
        kwargs = dict(t["kwargs"])
        for key in ("recipe",):
            if isinstance(kwargs.get(key), list):
                kwargs[key] = tuple(kwargs[key])
        if kwargs.get("is_sfa") is None:
            kwargs.pop("is_sfa", None)
        y = fn(x, **kwargs)
        out[name] = y.T if back else y
    return out


def _check_device(ours: bool, use_torch: bool, device: str | None) -> None:
    """Refuse a device the replay could not honour (before any case runs)."""
    if device is None or device == "cpu":
        return
    if ours:
        raise BundleError(f"replay: --device {device}: the deepgemm_ref module computes on the host (NumPy arrays, "
                          "or torch CPU tensors with --torch); use --device cpu, or replay on the device host with "
                          "--module deep_gemm")
    if not use_torch:
        raise BundleError(f"replay: --device {device}: NumPy arrays (--no-torch) stay on the host; pass torch tensors")
    import torch

    try:
        dev = torch.device(device)
        torch.empty(1, device=dev)
    except (RuntimeError, ValueError, TypeError, AssertionError) as e:
        raise BundleError(f"replay: --device {device}: not available here ({type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''})") from None


def read_replay_record(path: str | os.PathLike[str]) -> tuple[dict[str, str], list[str] | None]:
    """(case id -> error, replayed case ids or None) from an outputs file's metadata."""
    try:
        meta = st.read_metadata(path)
    except (OSError, st.SafetensorsError):
        return {}, None
    errors: dict[str, str] = {}
    cases: list[str] | None = None
    try:
        raw = strict_json(meta[ERRORS_KEY]) if ERRORS_KEY in meta else {}
        if isinstance(raw, dict):
            errors = {str(k): str(v) for k, v in raw.items()}
        raw_cases = strict_json(meta[CASES_KEY]) if CASES_KEY in meta else None
        if isinstance(raw_cases, list):
            cases = [str(c) for c in raw_cases]
    except ValueError as e:
        raise BundleError(f"{os.fspath(path)}: metadata {ERRORS_KEY!r} / {CASES_KEY!r} is not valid JSON: "
                          f"{e}") from None
    return errors, cases


def replay(
    bundle_dir: str | os.PathLike[str],
    out_path: str | os.PathLike[str],
    *,
    module: str = "deepgemm_ref",
    use_torch: bool | None = None,
    device: str | None = None,
    transforms: bool = True,
    force: bool = False,
    cases: list[str] | None = None,
    accumulation: str | None = None,
    progress: Any = None,
    max_memory: int | None = None,
) -> ReplayOutputs:
    """Run every case of a bundle through ``module`` and save the outputs; returns them (with
    ``.errors``, case id -> error, for the cases that failed).

    use_torch: pass torch tensors (default: True unless ``module`` is deepgemm_ref).
    device: torch device for the inputs and outputs (e.g. "npu", "cuda"; see the module docstring).
    transforms: apply the manifest's layout transforms before the call.
    accumulation: with ``module="deepgemm_ref"``, the accumulation model to emulate the device
    with (e.g. ``"limited(13, 128)"``; default: the active numerics option).
    progress: a :class:`.progress.Progress`-like object or a callable ``f(done, total, case_id)``.

    Under torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set, WORLD_SIZE > 1), or with
    torch.distributed already initialised with more than one process, every process calls this
    with the same arguments (see the module docstring, "One process per rank"); rank 0 returns
    every output, the other ranks none (``written`` False).  Outside such a world, a case of
    more than one rank through a module that runs one rank per process (a real ``deep_ep`` /
    ``deep_gemm``) is refused before any case runs (:class:`.bundle.BundleError`).
    """
    limit = default_memory_limit() if max_memory is None else max_memory
    world = _join_world(device)
    if world is None:
        return _replay_here(bundle_dir, out_path, module, use_torch, device, transforms, force, cases, accumulation,
                            progress, limit)
    try:
        return _replay_in_world(world, bundle_dir, out_path, module, use_torch, device, transforms, force, cases,
                                accumulation, progress, limit)
    finally:
        world.close()


@dataclass
class _Prepared:
    bundle: Bundle
    ids: list[str]
    module: Any
    ours: bool
    use_torch: bool
    profile: str | None = None  # the profile the module reports running (None: ours, or it does not say)


def _prepare(bundle_dir: str | os.PathLike[str], out_path: str | os.PathLike[str], module: str,
             use_torch: bool | None, device: str | None, force: bool, cases: list[str] | None,
             accumulation: str | None, limit: int, writes: bool = True) -> _Prepared:
    """Every check before the first case (``writes``: this process writes ``out_path``)."""
    if writes:  # a regular file or nothing, not in the bundle replayed or any other (golden/paths.py)
        from .paths import check_output_file

        check_output_file("replay: out_path", out_path, [("bundle_dir", bundle_dir)])
    b = load_bundle(bundle_dir, max_memory=limit)
    if writes and os.path.lexists(out_path) and not force:
        raise BundleError(f"{os.fspath(out_path)}: file exists; pass force=True (--force) to replace it")
    ids = list(b.cases) if not cases else list(dict.fromkeys(cases))
    for case_id in ids:
        if case_id not in b.cases:
            why = "it was not generated (the bundle is incomplete)" if case_id in b.incomplete else "no such case"
            raise BundleError(f"replay: --case {case_id!r}: {why}")
    if not isinstance(module, str) or not module:
        raise BundleError(f"replay: module: expected a module name; got {module!r}")
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise BundleError(f"replay: cannot import module {module!r}: {e}") from None
    except Exception as e:  # a module that fails while importing
        raise BundleError(f"replay: importing module {module!r} failed: {type(e).__name__}: {e}") from None
    except SystemExit as e:  # the module's own code ended the import with sys.exit(): a failure, never an exit
        raise BundleError(f"replay: importing module {module!r} failed: its code called sys.exit({e.code!r})") from None
    ours = module == "deepgemm_ref" or module.startswith("deepgemm_ref.")
    if use_torch is None:
        use_torch = not ours
    if use_torch:
        try:
            import torch  # noqa: F401
        except ImportError:
            raise BundleError("replay: torch is needed to pass torch tensors (use --no-torch)") from None
    _check_device(ours, use_torch, device)
    if accumulation is not None:
        if not ours:
            raise BundleError("replay: --accumulation emulates a device accumulator with --module deepgemm_ref only")
        with numerics(accumulation=accumulation):  # validated once, before any case
            pass
    return _Prepared(b, ids, mod, ours, bool(use_torch), None if ours else module_profile(mod, device))


def module_profile(mod: Any, device: str | None = None) -> str | None:
    """The profile a replayed module reports running, or None where it does not say.

    Asked in this order: the module's ``get_arch()`` (this package's name of the active profile,
    e.g. a wrapper of deepgemm_ref), its ``get_arch_major()`` (9: sm90, 10: sm100, as DeepGEMM's
    ``testing.get_arch_major``), then the device itself: an ``npu`` device is an ascend950, a
    ``cuda`` device's compute capability major 9 / 10 is an sm90 / sm100.  Nothing it raises
    stops the replay (the answer is then None).
    """
    from ..profiles import PROFILES

    majors = {9: "sm90", 10: "sm100"}
    try:
        get_arch = getattr(mod, "get_arch", None)
        if callable(get_arch):
            arch = get_arch()
            if isinstance(arch, str) and arch in PROFILES:
                return arch
        get_major = getattr(mod, "get_arch_major", None)
        if callable(get_major):
            major = get_major()
            if isinstance(major, int) and major in majors:
                return majors[major]
        kind = (device or "").split(":")[0]
        if kind == "npu":
            return "ascend950"
        if kind == "cuda":
            import sys

            torch = sys.modules.get("torch")
            if torch is not None and torch.cuda.is_available():
                major = int(torch.cuda.get_device_capability(device)[0])
                return majors.get(major)
    except Exception:  # noqa: BLE001 - a module that cannot say: no profile note
        return None
    return None


def _profile_note(case_profile: str, running: str | None) -> str:
    """What a failed case's message says about profiles: the case's, and the module's where they
    differ (a case generated for sm90 fails through an sm100 library for that reason alone)."""
    if running is None:
        return f" (this case was generated for {case_profile}; the module does not report its profile)"
    if running != case_profile:
        return (f" (this case is {case_profile}; the module reports {running}: replay it where the module runs "
                f"{case_profile}, or generate the case for {running})")
    return ""


def _exit_text(e: SystemExit) -> str:
    return f"the module's code called sys.exit({e.code!r})"


def _error_text(e: BaseException) -> str:
    return str(e) if isinstance(e, DGArgumentError) else f"{type(e).__name__}: {e}"


def _costs(b: Bundle, ids: list[str]) -> dict[str, float]:
    return {i: float(sum(np.prod(t["shape"]) for t in b.cases[i]["tensors"].values())) + 1.0 for i in ids}


def _save(results: ReplayOutputs, errors: dict[str, str], ids: list[str], bundle_dir: str | os.PathLike[str],
          module: str, out_path: str | os.PathLike[str], force: bool) -> None:
    results.errors = errors
    meta = {"bundle": str(bundle_dir), "module": module, ERRORS_KEY: json.dumps(errors, sort_keys=True),
            CASES_KEY: json.dumps(ids)}
    st.save_file(dict(results), out_path, metadata=meta, overwrite=force)


def _replay_here(bundle_dir: str | os.PathLike[str], out_path: str | os.PathLike[str], module: str,
                 use_torch: bool | None, device: str | None, transforms: bool, force: bool, cases: list[str] | None,
                 accumulation: str | None, progress: Any, limit: int) -> ReplayOutputs:
    """Every case in this process."""
    p = _prepare(bundle_dir, out_path, module, use_torch, device, force, cases, accumulation, limit)
    b, ids = p.bundle, p.ids
    for case_id in ids:  # a case whose ranks are processes needs torchrun: refused before any case runs
        r = entry_ranks(b.cases[case_id])
        if r > 1 and not runs_ranks_in_process(p.module, b.cases[case_id]):
            raise BundleError(f"replay: case {case_id!r} has {r} ranks and module {module!r} runs one rank per "
                              f"process: launch the replay under torchrun (torchrun --nproc-per-node {r} "
                              "-m deepgemm_ref.cli replay ...), replay it with --module deepgemm_ref (its ranks run "
                              "in this process), or select other cases with --case")
    results = ReplayOutputs()
    errors: dict[str, str] = {}
    prog = as_progress(progress)
    costs = _costs(b, ids)
    prog.start(len(ids), sum(costs.values()))
    done_work = 0.0
    try:
        for n, case_id in enumerate(ids, start=1):
            try:
                results.update(_replay_case(b, case_id, p.module, p.ours, p.use_torch, device, transforms,
                                            accumulation, limit, p.profile))
            except KeyboardInterrupt:
                raise
            except SystemExit as e:  # the module's kernel called sys.exit(): this case failed, the replay goes on
                errors[case_id] = _exit_text(e)
            except Exception as e:  # one failing case must not stop the others
                errors[case_id] = _error_text(e)
            done_work += costs[case_id]
            prog.update(n, done_work, case_id)
    finally:
        prog.finish()
    _save(results, errors, ids, bundle_dir, module, out_path, force)
    results.notes = _profile_notes(b, ids, p.profile, errors)
    return results


def _profile_notes(b: Bundle, ids: list[str], running: str | None, errors: dict[str, str]) -> dict[str, str]:
    """For each case that ran without error through a module reporting another profile: a note."""
    out: dict[str, str] = {}
    for case_id in ids:
        profile = b.cases[case_id].get("profile")
        if running is not None and isinstance(profile, str) and profile != running and case_id not in errors:
            out[case_id] = (f"this case is {profile}; the module reports {running}: its outputs may differ from the "
                            f"goldens for that reason alone")
    return out


# ----------------------------------------------------------------------------------------------
# one process per rank: replay under torchrun
# ----------------------------------------------------------------------------------------------

#: Whether this process joined a torch.distributed world for a replay and left it (the CLI then
#: ends the process with ``os._exit`` after flushing: torch's gloo teardown at interpreter exit
#: can abort a process that destroyed its group, "terminate called without an active exception").
left_a_world = False


@dataclass
class _World:
    """This process's place in a torch.distributed world of more than one process."""

    rank: int
    size: int
    group: Any  # the world's group: the ranks' buffers and kernels take it
    tr: Any  # a TorchTransport over a gloo group of the world: the replay's own exchanges
    made: bool  # initialised here (destroyed by close)
    make_one_rank: Callable[[], Any] | None = None  # a group of rank 0 alone (default: torch.distributed's)

    def close(self) -> None:
        if self.made:
            import torch.distributed as dist

            if dist.is_initialized():
                try:  # every rank leaves together: gloo can abort a process whose group is torn down mid-talk
                    dist.barrier()
                except Exception:  # noqa: BLE001 - a peer already gone; destroy anyway
                    pass
                dist.destroy_process_group()
            global left_a_world
            left_a_world = True


def _backend(device: str | None) -> str:
    kind = (device or "cpu").split(":")[0]
    return {"cuda": "nccl", "npu": "hccl"}.get(kind, "gloo")


def _join_world(device: str | None) -> _World | None:
    """The torch.distributed world of more than one process this replay runs in: an initialised
    one, or the one torchrun's variables describe (initialised here: gloo, or nccl / hccl for a
    cuda / npu ``device``); None for a replay in one process."""
    import sys

    env = torchrun_env()
    launched = env is not None and env["world_size"] > 1
    dist: Any = sys.modules.get("torch.distributed")
    if launched and dist is None:
        try:
            import torch.distributed as torch_dist
        except ImportError:
            raise BundleError(f"replay under torchrun (WORLD_SIZE={env['world_size'] if env else '?'}): needs torch "
                              "(torch.distributed): pip install torch") from None
        dist = torch_dist
    if dist is None or not dist.is_available():
        if launched:
            raise BundleError("replay under torchrun: this torch has no torch.distributed")
        return None
    made = False
    if not dist.is_initialized():
        if not launched:
            return None
        assert env is not None
        backend = _backend(device)
        if backend == "nccl":
            import torch

            torch.cuda.set_device(env["local_rank"])
        dist.init_process_group(backend, init_method="env://", world_size=env["world_size"], rank=env["rank"])
        made = True
    elif dist.get_world_size() == 1:
        return None
    from ..comm import TorchTransport

    group = dist.group.WORLD
    gloo = group if dist.get_backend(group) == "gloo" else dist.new_group(backend="gloo")
    return _World(dist.get_rank(), dist.get_world_size(), group, TorchTransport(gloo), made)


def _one_rank_group(w: _World) -> Any:
    """A group of rank 0 alone (every rank of the world makes it), for the one-rank cases."""
    if w.make_one_rank is not None:
        return w.make_one_rank()
    import torch.distributed as dist

    return dist.new_group([0])


def _rank_errors(failed: list[tuple[int, str]], size: int) -> str:
    """One error for a case that failed on some ranks: the message, once when every rank that
    failed says the same, with the ranks that said it."""
    failed = [(r, re.sub(r" at 0x[0-9a-fA-F]+", "", t)) for r, t in failed]  # object addresses differ by process
    texts = dict.fromkeys(t for _, t in failed)
    if len(texts) == 1:
        ranks = [r for r, _ in failed]
        who = "every rank" if len(ranks) == size else f"rank{'s' if len(ranks) > 1 else ''} " + ", ".join(
            map(str, ranks))
        return f"{next(iter(texts))} ({who} of {size})"
    return "; ".join(f"rank {r} of {size}: {t}" for r, t in failed)


def _replay_in_world(w: _World, bundle_dir: str | os.PathLike[str], out_path: str | os.PathLike[str], module: str,
                     use_torch: bool | None, device: str | None, transforms: bool, force: bool,
                     cases: list[str] | None, accumulation: str | None, progress: Any, limit: int) -> ReplayOutputs:
    """One process per rank (see :func:`replay`): the checks on every rank (the first rank's
    problem raised on all of them), the cases of ``w.size`` ranks on every rank with rank 0
    merging their rows, then the other cases on rank 0 alone, which writes the outputs file."""
    import contextlib

    problem: str | None = None
    own: BaseException | None = None
    p: _Prepared | None = None
    try:
        p = _prepare(bundle_dir, out_path, module, use_torch, device, force, cases, accumulation, limit,
                     writes=w.rank == 0)
        for case_id in p.ids:
            r = entry_ranks(p.bundle.cases[case_id])
            if r > 1 and r != w.size:
                raise BundleError(f"replay: case {case_id!r} has {r} ranks; this torchrun world has {w.size} "
                                  f"processes: launch it with --nproc-per-node {r}, or select cases with --case")
    except Exception as e:
        problem, own = _error_text(e), e
    statuses = agree(w.tr, {"error": problem})
    failed = [(r, s["error"]) for r, s in enumerate(statuses) if s.get("error")]
    if failed:
        if own is not None and failed[0][0] == w.rank:
            raise own
        raise BundleError(failed[0][1] if own is not None else f"rank {failed[0][0]} of {w.size}: {failed[0][1]}")
    assert p is not None
    b, ids = p.bundle, p.ids
    ranked = {i: entry_ranks(b.cases[i]) for i in ids}
    together = [i for i in ids if ranked[i] > 1]
    alone = [i for i in ids if ranked[i] <= 1]
    one_rank = _one_rank_group(w) if any(ranked[i] == 1 for i in alone) else None  # made by every rank
    per_case: dict[str, dict[str, np.ndarray]] = {}
    errors: dict[str, str] = {}
    prog = as_progress(progress if w.rank == 0 else None)
    costs = _costs(b, ids)
    prog.start(len(ids), sum(costs.values()))
    try:
        done, done_work = 0, 0.0
        for case_id in together:
            got: dict[str, np.ndarray] = {}
            err: str | None = None
            try:
                with rank_scope(w.group, w.rank, w.size):
                    got = _replay_case(b, case_id, p.module, p.ours, p.use_torch, device, transforms, accumulation,
                                       limit, p.profile)
            except KeyboardInterrupt:
                raise
            except SystemExit as e:  # the module's kernel called sys.exit(): this case failed, the replay goes on
                err = _exit_text(e)
            except Exception as e:  # one failing case must not stop the others
                err = _error_text(e)
            statuses = agree(w.tr, {"error": err})
            failed = [(r, s["error"]) for r, s in enumerate(statuses) if s.get("error")]
            if failed:
                errors[case_id] = _rank_errors(failed, w.size)
            else:
                rows = {name: np.ascontiguousarray(v[w.rank]) for name, v in got.items()}
                parts = gather_to_root(w.tr, pack(rows))
                if parts is not None:
                    per = [unpack(part)[0] for part in parts]
                    per_case[case_id] = {name: np.ascontiguousarray(np.stack([q[name] for q in per])) for name in rows}
            done, done_work = done + 1, done_work + costs[case_id]
            prog.update(done, done_work, case_id)
        if w.rank != 0:
            out = ReplayOutputs()
            out.errors, out.written, out.rank, out.world = errors, False, w.rank, w.size
            return out
        for case_id in alone:
            try:
                scope = rank_scope(one_rank, 0, 1) if ranked[case_id] == 1 else contextlib.nullcontext()
                with scope:
                    per_case[case_id] = _replay_case(b, case_id, p.module, p.ours, p.use_torch, device, transforms,
                                                     accumulation, limit, p.profile)
            except KeyboardInterrupt:
                raise
            except SystemExit as e:  # the module's kernel called sys.exit(): this case failed, the replay goes on
                errors[case_id] = _exit_text(e)
            except Exception as e:
                errors[case_id] = _error_text(e)
            done, done_work = done + 1, done_work + costs[case_id]
            prog.update(done, done_work, case_id)
    finally:
        prog.finish()
    results = ReplayOutputs()
    for case_id in ids:
        results.update(per_case.get(case_id, {}))
    results.rank, results.world = w.rank, w.size
    _save(results, errors, ids, bundle_dir, module, out_path, force)
    results.notes = _profile_notes(b, ids, p.profile, errors)
    return results


def _replay_case(b: Any, case_id: str, mod: Any, ours: bool, use_torch: bool, device: str | None,
                 transforms: bool, accumulation: str | None, limit: int,
                 running: str | None = None) -> dict[str, np.ndarray]:
    """One case through ``mod``; a failure of a foreign module's call names the profile the case
    was generated for and the one the module reports (``running``, see :func:`module_profile`)."""
    case = b.case(case_id)
    if ours:
        from .cases import estimate_case

        try:
            est = estimate_case(validate_spec(case.entry["spec"]))
        except DGArgumentError:
            est = None
        if est is not None and est.peak_bytes > limit:
            raise ResourceError(f"case {case_id!r}: needs about {format_size(est.peak_bytes)} of memory; the limit "
                                f"is {format_size(limit)} (--max-memory)")
    try:
        got = call_case(case, mod, ours=ours, use_torch=use_torch, device=device, transforms=transforms,
                        accumulation=accumulation)
    except Exception as e:
        profile = case.entry.get("profile")
        if ours or not isinstance(profile, str):
            raise
        raise BundleError(_error_text(e) + _profile_note(profile, running)) from e
    return {f"{case_id}/{name}": v for name, v in got.items()}


def call_case(case: CaseData, module: Any, *, ours: bool, use_torch: bool, device: str | None = None,
              transforms: bool = True, accumulation: str | None = None) -> dict[str, np.ndarray]:
    """One case's call through ``module``, as a replay makes it: the inputs as NumPy arrays or
    torch tensors on ``device``, the manifest's layout transforms applied with the
    module's own functions, the call (or the family's driver); returns the outputs by name as
    host NumPy arrays.  ``ours``: the module is deepgemm_ref, so the case's profile (and
    ``accumulation``) is scoped around the call."""
    inputs = {k: (v.data if isinstance(v, st.PackedFP4) else v) for k, v in case.inputs().items()}
    outs = fresh_outputs(case.entry["outputs"], inputs)
    dev_inputs = {k: _to_device(v, use_torch, device) for k, v in inputs.items()}
    dev_outs = {k: _to_device(v, use_torch, device) for k, v in outs.items()}
    if transforms:
        with _profile(ours, case.entry["profile"]):
            dev_inputs = _apply_transforms(module, case, dev_inputs)
    with _profile(ours, case.entry["profile"], accumulation):
        run_case_call(module, case.entry, case.args, case.kwargs, dev_inputs, dev_outs)
    got: dict[str, np.ndarray] = {}
    for name in case.entry["outputs"]:
        if name not in dev_outs:
            raise BundleError(f"case {case.id!r}: the call returned no {name!r}")
        v = dev_outs[name]
        if use_torch and hasattr(v, "cpu"):
            v = v.cpu()
        got[name] = np.ascontiguousarray(to_numpy(v, "replay", name))
    return got


class _profile:
    """Under deepgemm_ref, run each case with the profile it was generated for."""

    def __init__(self, ours: bool, profile: str, accumulation: str | None = None) -> None:
        extra = {} if accumulation is None else {"accumulation": accumulation}
        self.ctx = numerics(arch=profile, **extra) if ours else None
        self.quiet = quiet_float_errors() if ours else None  # the emulator's inf / NaN are results

    def __enter__(self) -> None:
        if self.ctx is not None and self.quiet is not None:
            self.ctx.__enter__()
            self.quiet.__enter__()

    def __exit__(self, *exc: Any) -> None:
        if self.ctx is not None and self.quiet is not None:
            self.quiet.__exit__(*exc)
            self.ctx.__exit__(*exc)

