"""Generating golden bundles: the plan, the workers, interruption, resume, and ``verify``.

:func:`generate` first makes a :class:`Plan` (:func:`plan_generation`) without writing or
allocating anything: every specification is validated, file names are checked for collisions,
each case's memory, file size and work are estimated from its keys and a case over the memory
limit is refused, the free disk space is checked, and for ``resume`` the finished cases of the
existing bundle are verified.  Then the cases run (in this process, in ``jobs`` worker processes,
or on a Dask cluster) and each finished case's file is written atomically.

Interruption (SIGINT, SIGTERM): every worker is stopped (terminated, then killed, within about
1.5 s), the manifest lists the finished cases and marks the rest ``incomplete``, temporary files
are removed, and :class:`GenerationInterrupted` says so (the CLI exits 130 or 143).  A second
signal during that cleanup is ignored, so it cannot deadlock.  ``resume=True`` then computes only
the missing cases (finished files are not touched) and the bundle is byte-identical to an
uninterrupted run.  A manifest is also written every few seconds while cases finish, so even a
killed run keeps most of its work.

``force=True`` over an existing bundle builds the new bundle in a sibling temporary directory and
swaps it in only when it is complete; until then the old bundle stays valid (an interrupted or
failed ``force`` run leaves it as it was and removes the temporary directory).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._memory import limit_work, work_progress
from .._parallel import limit_blas_threads
from .._state import isolated
from ..core import release_scratch
from ..errors import DGArgumentError
from ..toolkit.sizes import limit_allocations
from . import safetensors as st
from .bundle import (
    CASES_DIR,
    FORMAT_NAME,
    MANIFEST_NAME,
    BundleError,
    case_entry,
    check_file_names,
    load_bundle,
    new_manifest,
    write_manifest,
)
from .call import compute_golden
from .cases import BuiltCase, CaseSpec, SpecError, build_case, estimate_case, family_for, validate_spec
from .lifecycle import LOCK_NAME, BundleLock, die_with_parent, sibling_name, stale_siblings
from .progress import as_progress
from .ranks import spec_ranks
from .resources import Estimate, ResourceError, default_memory_limit, format_seconds, format_size, work_room
from .rowblocks import digests_in_row_blocks, write_case_in_row_blocks
from .text import count, plural

__all__ = ["generate", "plan_generation", "Plan", "PlannedCase", "GenerationInterrupted", "CaseFailures", "verify",
           "EXECUTORS", "write_case", "pool_workers", "by_cost", "JOBS_FALLBACK_ENV"]

#: The executors: this process or a pool of ``jobs`` worker processes; a Dask cluster; or, for the
#: ranked families (DeepEP's dispatch and combine, Mega MoE), one process per rank over a gloo
#: group (the other cases run as with "local").
EXECUTORS = ("local", "dask", "processes")

_BLAS_KEYS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "DEEPGEMM_REF_NUM_THREADS")
_CHECKPOINT_SECONDS = 2.0
_STOP_GRACE = 1.0  # seconds a terminated worker gets before it is killed
#: A pool of worker processes pays only when each worker gets at least this many seconds of
#: estimated work: below it (a run of tiny cases, such as the ``smoke`` preset's second of work)
#: starting the workers, the pipe traffic and each case file's fsync, which a tiny case waits on
#: longer than it computes, make ``--jobs`` slower than one process.
_POOL_MIN_SECONDS = 1.0
#: The environment variable that, set to ``0``, starts the ``--jobs`` workers asked for whatever
#: the machine's load and the cases' size (:func:`pool_workers`).
JOBS_FALLBACK_ENV = "DEEPGEMM_REF_JOBS_FALLBACK"


def _cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the platform has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _load() -> float | None:
    """The one-minute load average, or None where the platform has none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def pool_workers(jobs: int, cases: int, seconds: float, *, cpus: int | None = None,
                 load: float | None = None) -> tuple[int, str]:
    """How many worker processes a local run of ``cases`` cases (``seconds`` of estimated work in
    all) starts for ``--jobs jobs``, and why fewer than asked (``""`` when as asked).

    * never more than one per case;
    * never more than ``cpus`` (default: this process's CPUs): more would only take turns, each
      with its BLAS pinned to ``cpus // workers`` threads (no oversubscription);
    * tiny cases: at most one worker per :data:`_POOL_MIN_SECONDS` of estimated work, so a run
      of under two such seconds runs in this process;
    * a loaded machine (``load``, default: the one-minute load average): the first worker does
      what this process would do alone, each further one needs a CPU the load leaves idle, so at
      most ``1 + ceil(cpus - load)``; with ``load >= cpus`` the cases run in this process.

    ``DEEPGEMM_REF_JOBS_FALLBACK=0`` in the environment: ``min(jobs, cases)`` whatever the rest.
    The bytes of a bundle never depend on the number of workers.
    """
    asked = max(1, min(jobs, cases))
    if asked == 1 or os.environ.get(JOBS_FALLBACK_ENV, "").strip().lower() in ("0", "off", "no", "false"):
        return asked, ""
    n_cpus = _cpus() if cpus is None else max(1, cpus)
    avg = _load() if load is None else load
    n, why = asked, []
    if n > n_cpus:
        n = n_cpus
        why.append(f"this process may run on {n_cpus} CPU{'' if n_cpus == 1 else 's'}")
    if n > 1 and seconds < _POOL_MIN_SECONDS * n:
        n = max(1, int(seconds // _POOL_MIN_SECONDS))
        why.append(f"the cases are small (about {seconds:.2g} s of estimated work in all; a worker pays from about "
                   f"{_POOL_MIN_SECONDS:g} s of work each)")
    if avg is not None and n > 1:
        room = 1 if avg >= n_cpus else 1 + math.ceil(n_cpus - avg)
        if room < n:
            n = room
            why.append(f"the machine is loaded (load average {avg:.2f} on {n_cpus} CPU{'' if n_cpus == 1 else 's'})")
    if n == asked:
        return n, ""
    what = "running the cases in this process" if n == 1 else f"{n} worker processes"
    return n, (f"--jobs {jobs}: {what}: {'; '.join(why)} ({JOBS_FALLBACK_ENV}=0 starts {asked} workers "
               "anyway)")


def by_cost(specs: Iterable[CaseSpec], costs: Mapping[str, float]) -> list[CaseSpec]:
    """The cases the largest estimated work first (ties in their given order), so that no worker is
    left alone with a large case at the end of a run."""
    return sorted(specs, key=lambda spec: -costs.get(spec.id, 0.0))


class GenerationInterrupted(KeyboardInterrupt):
    """Generation stopped by SIGINT / SIGTERM; ``signum`` is the signal, ``message`` one line."""

    def __init__(self, signum: int, message: str = "") -> None:
        super().__init__(message or f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum
        self.message = message or f"interrupted by {signal.Signals(signum).name}"

    def __str__(self) -> str:
        return self.message


class CaseFailures(BundleError):
    """Some cases could not be generated (the others are kept); ``internal`` is True when one of
    them failed with an unexpected exception (a bug)."""

    def __init__(self, message: str, internal: bool = False) -> None:
        super().__init__(message)
        self.internal = internal


@dataclass
class PlannedCase:
    spec: CaseSpec
    file: str
    estimate: Estimate | None
    kept: bool = False  # already in the bundle, verified (resume)
    ranks: int = 0  # a ranked family's ranks R (one process each under the processes executor), else 0
    over: int = 0  # a dry run's case over the memory limit: the limit it is over (a run refuses it), else 0


@dataclass
class Plan:
    """What :func:`generate` will do; nothing has been written when it exists."""

    root: Path
    cases: list[PlannedCase]
    mode: str  # "new" (write in place), "resume" (in place, keep finished cases), "replace" (aside, then swap)
    jobs: int
    executor: str
    memory_limit: int
    case_limit: int
    kept: dict[str, dict[str, Any]] = field(default_factory=dict)
    stale: list[str] = field(default_factory=list)  # files of the old bundle no case will have
    ranks_per_case: int | None = None  # the processes executor's --ranks-per-case (None: each case's own)
    refusal: str = ""  # a dry run's plan that a run would refuse: why (the target directory, the disk)

    @property
    def todo(self) -> list[PlannedCase]:
        return [c for c in self.cases if not c.kept]

    def in_rank_processes(self, c: PlannedCase) -> bool:
        """Whether case ``c`` runs with one process per rank (the processes executor, a ranked family)."""
        return self.executor == "processes" and c.ranks > 0

    def totals(self) -> tuple[int, int, float]:
        """(file bytes of the bundle, largest case peak memory, estimated seconds of the todo cases)."""
        files = sum(c.estimate.file_bytes for c in self.cases if c.estimate)
        peak = max((c.estimate.peak_bytes for c in self.todo if c.estimate), default=0)
        secs = sum(c.estimate.seconds for c in self.todo if c.estimate)
        local = self.executor in ("local", "processes")
        return files, peak, secs / max(1, min(self.jobs, len(self.todo)) if local else 1)

    def summary(self) -> str:
        files, peak, secs = self.totals()
        kept = len(self.cases) - len(self.todo)
        what = {"new": "", "resume": f" ({kept} finished {plural(kept, 'case')} kept)",
                "replace": " (built aside, then swapped in)"}[self.mode]
        jobs = f" with {self.jobs} jobs" if self.jobs > 1 and self.executor in ("local", "processes") else ""
        ranked = [c for c in self.todo if self.in_rank_processes(c)]
        counts = ", ".join(str(n) for n in sorted({c.ranks for c in ranked}))
        procs = (f"; {count(len(ranked), 'case')} with one process per rank ({counts} processes over a gloo group)"
                 if ranked else "")
        over = [c for c in self.cases if c.over]
        refused = (f"; {count(len(over), 'case')} over the memory limit (marked OVER; a run "
                   "refuses them: raise --max-memory, use fewer --jobs, or leave them out with --case)"
                   if over else "")
        return (f"plan: {len(self.todo)} of {count(len(self.cases), 'case')} to generate into {self.root}{what}; "
                f"estimated size {format_size(files)}, estimated time {format_seconds(secs)}{jobs}, peak memory about "
                f"{format_size(peak)} per case (limit {format_size(self.case_limit)}){procs}{refused}"
                + (f"\nnote: a run would be refused: {self.refusal}" if self.refusal else ""))

    def table(self) -> str:
        lines = [f"{'case':<48} {'shape':<40} {'file':>10} {'memory':>10} {'time':>8}"]
        for c in self.cases:
            shape = " ".join(f"{k}={v}" for k, v in c.spec.shape().items())
            e = c.estimate
            lines.append(f"{c.spec.id:<48} {shape:<40} {format_size(e.file_bytes) if e else '?':>10} "
                         f"{format_size(e.peak_bytes) if e else '?':>10} "
                         f"{('kept' if c.kept else format_seconds(e.seconds)) if e else '?':>8}"
                         + (f"  OVER the limit of {format_size(c.over)}" if c.over else ""))
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        files, peak, secs = self.totals()
        return {"root": str(self.root), "mode": self.mode, "cases": [
            {"id": c.spec.id, "kernel": c.spec.kernel, "profile": c.spec.profile, "shape": c.spec.shape(),
             "file": c.file, "kept": c.kept, "file_bytes": c.estimate.file_bytes if c.estimate else None,
             "peak_bytes": c.estimate.peak_bytes if c.estimate else None,
             "seconds": c.estimate.seconds if c.estimate else None, "over_limit": bool(c.over)}
            for c in self.cases],
            "file_bytes": files, "peak_bytes": peak, "seconds": secs, "memory_limit": self.memory_limit,
            "case_limit": self.case_limit, "refusal": self.refusal or None}


# ----------------------------------------------------------------------------------------------
# the plan
# ----------------------------------------------------------------------------------------------

def validate_specs(specs: Iterable[CaseSpec | Mapping[str, Any]], source: str = "") -> list[CaseSpec]:
    """Validate every specification; all problems (up to 20) are reported at once."""
    out: list[CaseSpec] = []
    problems: list[str] = []
    for i, s in enumerate(specs):
        try:
            out.append(s if isinstance(s, CaseSpec) and s.values is not None else
                       validate_spec(s.to_dict() if isinstance(s, CaseSpec) else s, source, i))
        except SpecError as e:
            problems.append(str(e))
    if problems:
        more = f"\n... and {len(problems) - 20} more" if len(problems) > 20 else ""
        raise SpecError("\n".join(problems[:20]) + more)
    ids = [s.id for s in out]
    if len(set(ids)) != len(ids):
        raise SpecError(f"{source + ': ' if source else ''}duplicate case ids: "
                        f"{sorted({i for i in ids if ids.count(i) > 1})}")
    return out


def _state(root: Path) -> tuple[bool, bool]:
    """(holds a manifest, holds case files) for a target directory."""
    try:
        st_root = os.stat(root)
    except FileNotFoundError:
        return False, False
    except OSError as e:
        raise BundleError(f"{root}: cannot read: {e.strerror}") from None
    if not stat.S_ISDIR(st_root.st_mode):
        raise BundleError(f"{root}: exists and is not a directory")
    manifest = os.path.lexists(root / MANIFEST_NAME)
    cases = root / CASES_DIR
    files = cases.is_dir() and not cases.is_symlink() and any(p.suffix == ".safetensors" for p in cases.iterdir())
    return manifest, files


def _free_bytes(root: Path) -> int | None:
    p = root
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


def plan_generation(
    specs: Iterable[CaseSpec | Mapping[str, Any]], out_dir: str | os.PathLike[str], *, force: bool = False,
    resume: bool = False, jobs: int = 1, executor: str = "local", max_memory: int | None = None, source: str = "",
    ranks_per_case: int | None = None, dry_run: bool = False,
) -> Plan:
    """Check everything :func:`generate` needs and return its plan (nothing is written).

    dry_run: a plan to show, never refused for resources: the cases over the memory limit are
    marked (:attr:`PlannedCase.over`) and a lack of disk space is not an error.

    Raises :class:`.cases.SpecError` (a specification), :class:`BundleError` (file names, the
    target directory, an unreadable bundle to resume, the processes executor without torch or
    with a case whose ranks are not ``ranks_per_case``) or :class:`.resources.ResourceError` (a
    case over the memory limit, not enough disk).
    """
    if not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1:
        raise BundleError(f"golden: jobs: expected a positive number of workers; got {jobs!r}")
    if executor not in EXECUTORS:
        raise BundleError(f"golden: executor: expected one of {', '.join(map(repr, EXECUTORS))}; got {executor!r}")
    if ranks_per_case is not None:
        if executor != "processes":
            raise BundleError(f"golden: --ranks-per-case {ranks_per_case!r}: only with --executor processes (one "
                              "process per rank)")
        if not isinstance(ranks_per_case, int) or isinstance(ranks_per_case, bool) or ranks_per_case < 1:
            raise BundleError(f"golden: --ranks-per-case: expected a positive number of processes; got "
                              f"{ranks_per_case!r}")
    if executor == "processes" and importlib.util.find_spec("torch") is None:
        raise BundleError("golden: --executor processes needs torch (one process per rank over a torch.distributed "
                          "gloo group): pip install torch, or use --executor local")
    if force and resume:
        raise BundleError("golden: give at most one of force (--force) and resume (--resume)")
    if not isinstance(out_dir, (str, os.PathLike)) or not os.fspath(out_dir):
        raise BundleError(f"golden: --out: expected a bundle directory path; got {out_dir!r}")
    cases = validate_specs(specs, source)
    files = check_file_names([c.id for c in cases])
    limit = default_memory_limit() if max_memory is None else int(max_memory)
    case_limit = limit // jobs if executor in ("local", "processes") else limit
    # estimates under the limit each case runs with (its streaming work is sized from it)
    planned = [PlannedCase(c, files[c.id], estimate_case(c, limit if executor == "processes" and spec_ranks(c)
                                                         else case_limit), ranks=spec_ranks(c)) for c in cases]
    prefix = f"{source}: " if source else ""
    if executor == "processes" and ranks_per_case is not None:
        wrong = [p for p in planned if p.ranks and p.ranks != ranks_per_case]
        if wrong:
            p = wrong[0]
            more = f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else ""
            raise BundleError(f"{prefix}case {p.spec.id!r} has ranks = {p.ranks}{more}; --ranks-per-case "
                              f"{ranks_per_case} starts {ranks_per_case} processes per case: give --ranks-per-case "
                              f"{p.ranks}, leave it out (each case's own ranks), or select cases with --case")

    def need(p: PlannedCase) -> int:
        """A case's memory: its estimate, once per rank process under the processes executor (every
        process builds the whole case)."""
        assert p.estimate is not None
        return p.estimate.peak_bytes * (p.ranks if executor == "processes" and p.ranks else 1)

    def allowed(p: PlannedCase) -> int:
        """Cases in rank processes run one at a time, alone: their processes share the whole limit."""
        return limit if executor == "processes" and p.ranks else case_limit

    over = [p for p in planned if p.estimate is not None and need(p) > allowed(p)]
    if dry_run:
        for p in over:
            p.over = allowed(p)
    elif over:
        lines = [f"{prefix}case {p.spec.id!r} ({' '.join(f'{k}={v}' for k, v in p.spec.shape().items())}): needs about "
                 f"{format_size(need(p))} of memory"
                 + (f" ({p.ranks} rank processes, each building the whole case)"
                    if executor == "processes" and p.ranks else "")
                 for p in over[:10] if p.estimate]
        first = allowed(over[0])
        share = (f" ({format_size(limit)} / {jobs} jobs)" if executor in ("local", "processes") and jobs > 1
                 and first == case_limit else "")
        raise ResourceError("\n".join(lines) + f"\nthe limit per case is {format_size(first)}{share}; raise it "
                            "with --max-memory, or make the cases smaller")
    root = Path(out_dir)
    has_manifest, has_files = _state(root)
    mode = "new"
    refusal = ""
    kept: dict[str, dict[str, Any]] = {}
    stale: list[str] = []
    if resume and has_manifest:
        mode = "resume"
        try:
            old = load_bundle(root, max_memory=limit)
        except BundleError as e:
            raise BundleError(f"golden --resume: the existing bundle cannot be read ({e}); use --force to "
                              "regenerate it") from None
        wanted = {c.id: c for c in cases}
        for case_id, entry in old.cases.items():
            spec = wanted.get(case_id)
            if spec is None or entry["spec"] != spec.to_dict():
                continue
            try:
                old.case(case_id)
            except BundleError:
                continue  # altered or missing: regenerated
            kept[case_id] = entry
        names = {p.file for p in planned}
        stale = sorted(e["file"] for i, e in old.cases.items() if e["file"] not in names)
    elif resume:
        mode = "resume"
    elif has_manifest and not force:
        refusal = (f"{root}: already holds a bundle; pass --force to replace it, or --resume to finish an incomplete "
                   "one")
    elif has_manifest:
        mode = "replace"
        root = Path(os.path.realpath(root))  # a symlinked bundle: the directory it names is replaced
    elif has_files and not force:
        refusal = (f"{root}: holds case files but no manifest (an interrupted run?); pass --resume to finish it or "
                   "--force to start over")
    if refusal and not dry_run:
        raise BundleError(refusal)
    for p in planned:
        p.kept = p.spec.id in kept
    plan = Plan(root, planned, mode, jobs, executor, limit, case_limit, kept, stale, ranks_per_case, refusal)
    disk = sum(p.estimate.file_bytes for p in plan.todo if p.estimate)
    free = _free_bytes(root)
    if free is not None and disk > free:
        lack = f"{root}: the bundle needs about {format_size(disk)} of disk; {format_size(free)} free"
        if not dry_run:
            raise ResourceError(lack)
        plan.refusal = f"{plan.refusal}; {lack}" if plan.refusal else lack
    return plan


# ----------------------------------------------------------------------------------------------
# one case
# ----------------------------------------------------------------------------------------------

class _Stopped(Exception):
    """The run this (Dask) task belongs to has stopped: nothing is written."""


@contextlib.contextmanager
def _computing(spec: CaseSpec, limit: int) -> Iterator[tuple[BuiltCase, int, Mapping[str, int] | None]]:
    """Build a case and hold what computing its golden runs under: its own settings (isolated(): its
    profile, numerics options and runtime settings, so runs in several threads are independent),
    the run's memory limit for the kernels' allocation guard, the work budget its own tensors
    leave for the core's streaming work, and the core's scratch memory released at the end (a
    case's peak is its own, as estimated).  Yields the built case, its rows per block and the
    inputs' row axes (None: computed whole; see :mod:`.rowblocks`)."""
    with isolated():
        built = build_case(spec, max_memory=limit)
        est = estimate_case(spec, limit)
        fam = family_for(spec)
        block = est.row_block if est is not None else 0
        axes = fam.row_split(built) if block and fam.row_split is not None else None
        work = limit_work(work_room(limit, est.own_bytes)) if est is not None and est.own_bytes \
            else contextlib.nullcontext()
        try:
            with limit_allocations(limit), work:
                yield built, block, axes
        finally:
            release_scratch()


def generate_case(spec: CaseSpec, workdir: Path, overwrite: bool, max_memory: int | None = None,
                  token: str | None = None, guard: Callable[[], Any] | None = None) -> dict[str, Any]:
    """Build one case, compute its golden, write its file; returns its manifest entry.

    guard: a context manager factory around writing the file and making its entry (generation in
    this process defers a signal there, so that a written file is always recorded)."""
    limit = default_memory_limit() if max_memory is None else max_memory
    with _computing(spec, limit) as (built, block, axes):
        if axes is not None:  # too large to hold whole: a block of output rows at a time

            def commit(finish: Callable[[], dict[str, Any]]) -> dict[str, Any]:
                if token is not None and not (workdir / CASES_DIR / token).exists():
                    raise _Stopped(spec.id)
                with (guard or contextlib.nullcontext)():
                    return finish()

            return write_case_in_row_blocks(built, axes, block, workdir, overwrite,
                                            {"case": spec.id, "format": FORMAT_NAME}, commit, stats_clean=_json_clean)
        golden, stats = compute_golden(built)
    if token is not None and not (workdir / CASES_DIR / token).exists():
        raise _Stopped(spec.id)
    return write_case(built, golden, stats, workdir, overwrite, guard)


def write_case(built: BuiltCase, golden: Mapping[str, Any], stats: Mapping[str, Any], workdir: Path,
               overwrite: bool, guard: Callable[[], Any] | None = None) -> dict[str, Any]:
    """Write a built case's file (its inputs and goldens, atomically) and return its manifest entry
    (``guard``: see :func:`generate_case`)."""
    spec = built.spec
    tensors: dict[str, Any] = {f"input.{k}": v for k, v in built.inputs.items()}
    tensors.update({f"golden.{k}": v for k, v in golden.items()})
    from .bundle import case_relpath

    path = workdir / case_relpath(spec.id)
    with (guard or contextlib.nullcontext)():
        try:
            st.save_file(tensors, path, metadata={"case": spec.id, "format": FORMAT_NAME}, overwrite=overwrite)
        except st.SafetensorsError as e:
            raise BundleError(str(e)) from None
        return case_entry(built, tensors, st.file_sha256(path), _json_clean(stats))


def _json_clean(x: Any) -> Any:
    """Non-finite floats as strings (manifests are strict JSON)."""
    if isinstance(x, float) and not math.isfinite(x):
        return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")
    if isinstance(x, dict):
        return {k: _json_clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_clean(v) for v in x]
    if hasattr(x, "item") and callable(x.item):  # numpy scalars
        return _json_clean(x.item())
    return x


def _failure(e: BaseException) -> dict[str, str]:
    if isinstance(e, (ResourceError, MemoryError)):
        kind = "resource"
    elif isinstance(e, OSError):
        kind = "resource"
    elif isinstance(e, DGArgumentError):
        kind = "input"
    else:
        kind = "internal"
    text = str(e) or type(e).__name__
    return {"kind": kind, "message": f"{type(e).__name__}: {text}" if kind != "input" else text}


def _dask_task(spec_json: str, root: str, overwrite: bool, limit: int, token: str,
               host_threads: dict[str, int] | None = None) -> dict[str, Any]:
    """The Dask task of one case (importable by the workers): the case's specification travels as
    JSON text and its inputs are built here.  ``host_threads``: the Dask worker threads of each
    host (the scheduler's view when the run started); this worker process's BLAS and the
    package's pool get ``cpus // threads of its host`` threads, so that the tasks running at once
    on a host do not oversubscribe it (the environment of the worker process keeps that count)."""
    threads = _dask_threads(host_threads or {})
    os.environ["DEEPGEMM_REF_NUM_THREADS"] = str(threads)
    limit_blas_threads(threads)
    return generate_case(validate_spec(json.loads(spec_json)), Path(root), overwrite, limit, token)


def _address_host(address: str) -> str:
    """``tcp://10.0.0.5:8786`` -> ``10.0.0.5`` (an IPv6 host keeps its brackets)."""
    return address.split("://", 1)[-1].rsplit(":", 1)[0]


def _dask_threads(host_threads: Mapping[str, int]) -> int:
    """The BLAS threads of one task on the Dask worker running it: this host's CPUs shared by the
    worker threads of every worker on the host (1 outside a worker or when they are unknown)."""
    try:
        from distributed import get_worker

        worker = get_worker()
        state = getattr(worker, "state", None)
        own = int(getattr(state, "nthreads", 0) or getattr(worker, "nthreads", 0) or 1)
        total = int(host_threads.get(_address_host(str(worker.address)), 0)) or own
    except Exception:  # noqa: BLE001 - not in a worker, an older distributed: one thread, never more
        return 1
    return max(1, _cpus() // max(1, total))


# ----------------------------------------------------------------------------------------------
# signals
# ----------------------------------------------------------------------------------------------

class _Signals:
    """SIGINT and SIGTERM during generation: the first is recorded (and, when ``raise_now``,
    raised as :class:`GenerationInterrupted` outside critical sections); later ones only count."""

    def __init__(self, raise_now: bool) -> None:
        self.raise_now = raise_now
        self.signum: int | None = None
        self.count = 0
        self.critical = 0
        self.saved: dict[int, Any] = {}

    def __enter__(self) -> _Signals:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                try:
                    self.saved[sig] = signal.signal(sig, self._handle)
                except (ValueError, OSError):  # pragma: no cover - exotic embedding
                    pass
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self.saved.items():
            signal.signal(sig, old)

    def _handle(self, signum: int, frame: Any) -> None:
        self.count += 1
        if self.signum is None:
            self.signum = signum
        if self.raise_now and self.count == 1 and not self.critical:
            raise GenerationInterrupted(signum)

    def note_keyboard_interrupt(self) -> None:
        if self.signum is None:
            self.signum = signal.SIGINT
            self.count = max(self.count, 1)

    def check(self) -> None:
        if self.signum is not None:
            raise GenerationInterrupted(self.signum)


class _Critical:
    def __init__(self, sig: _Signals) -> None:
        self.sig = sig

    def __enter__(self) -> None:
        self.sig.critical += 1

    def __exit__(self, *exc: Any) -> None:
        self.sig.critical -= 1


# ----------------------------------------------------------------------------------------------
# executors: each yields (case id, entry or None, failure or None)
# ----------------------------------------------------------------------------------------------

Result = tuple[str, "dict[str, Any] | None", "dict[str, str] | None"]


def _run_inline(todo: list[CaseSpec], workdir: Path, overwrite: bool, limit: int,
                sig: _Signals, progress: Any = None, costs: Mapping[str, float] | None = None
                ) -> Generator[Result, None, None]:
    """The cases one after the other in this process; ``progress`` (with ``case_started`` and
    ``within``, :class:`.progress.Progress`) also hears the share of each case's own work done."""
    inside = progress if hasattr(progress, "case_started") and hasattr(progress, "within") else None
    for spec in todo:
        sig.check()
        try:
            if inside is not None:
                inside.case_started(spec.id, (costs or {}).get(spec.id, 0.0))
            with work_progress(inside.within) if inside is not None else contextlib.nullcontext():
                entry = generate_case(spec, workdir, overwrite, limit, guard=lambda: _Critical(sig))
        except (GenerationInterrupted, KeyboardInterrupt):
            raise
        except Exception as e:  # a case failing must not lose the others
            yield spec.id, None, _failure(e)
            continue
        yield spec.id, entry, None


def _pool_worker(conn: Any, threads: int, parent: int = 0) -> None:
    """A worker process: signals are the parent's business (it terminates us); one case at a time,
    JSON over the pipe (no pickle).  It dies with ``parent`` (the process that started it): a
    worker orphaned by a killed run writes nothing more into the bundle."""
    if parent:
        die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    limit_blas_threads(threads)
    lock = threading.Lock()  # one message at a time on the pipe: progress (any thread) and replies
    while True:
        try:
            msg = json.loads(conn.recv_bytes().decode("utf-8"))
        except (EOFError, OSError):
            return
        if msg is None:
            return
        case_id = msg["spec"]["id"]
        share = _ShareSender(conn, lock, case_id)
        try:
            # SIGTERM is held from writing the file until its entry is sent: a stopping parent
            # (which waits a moment before it kills) records every case whose file exists.
            with work_progress(share):
                entry = generate_case(validate_spec(msg["spec"]), Path(msg["root"]), msg["overwrite"], msg["limit"],
                                      guard=_HoldSigterm)
            reply: dict[str, Any] = {"id": case_id, "entry": entry}
        except BaseException as e:  # noqa: B036 - report everything, MemoryError included
            reply = {"id": case_id, "error": _failure(e)}
        try:
            with lock:
                share.closed = True
                conn.send_bytes(json.dumps(reply, allow_nan=False).encode("utf-8"))
        except (OSError, ValueError):
            return
        finally:
            _HoldSigterm.release()


class _ShareSender:
    """A worker's report of the share of its case's work done (the core calls it from its pool
    threads, chunk by chunk): sent to the parent as ``{"id", "share"}``, at most every
    :data:`_SHARE_SECONDS`, so that the parent's progress line follows the cases in flight."""

    def __init__(self, conn: Any, lock: threading.Lock, case_id: str) -> None:
        self.conn, self.lock, self.case_id = conn, lock, case_id
        self.last = 0.0
        self.closed = False

    def __call__(self, share: float) -> None:
        now = time.monotonic()
        if now - self.last < _SHARE_SECONDS:
            return
        with self.lock:
            if self.closed:
                return
            self.last = now
            try:
                self.conn.send_bytes(json.dumps({"id": self.case_id, "share": float(share)}).encode("utf-8"))
            except (OSError, ValueError):
                self.closed = True


#: The least time between two progress messages of one worker.
_SHARE_SECONDS = 0.5


class _HoldSigterm:
    """Defer SIGTERM in a worker (entered around writing a case); :meth:`release` restores the
    default action once the case's entry is sent, and a SIGTERM that came meanwhile then ends the
    worker.  (A Python handler, not a blocked mask: the signal may be delivered to any thread.)"""

    pending = False

    def __enter__(self) -> None:
        _HoldSigterm.pending = False
        signal.signal(signal.SIGTERM, _HoldSigterm._note)

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is not None:
            _HoldSigterm.release()

    @staticmethod
    def _note(signum: int, frame: Any) -> None:
        _HoldSigterm.pending = True

    @staticmethod
    def release() -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if _HoldSigterm.pending:
            os.kill(os.getpid(), signal.SIGTERM)


class _Worker:
    def __init__(self, ctx: Any, threads: int) -> None:
        self.conn, child = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=_pool_worker, args=(child, threads, os.getpid()), daemon=True)
        self.proc.start()
        child.close()
        self.case: str | None = None


def _stop_workers(workers: list[_Worker], sig: _Signals) -> list[Result]:
    """Terminate every worker; kill those still alive after the grace period (or at once on a
    second signal).  Returns the results that had been sent before they stopped."""
    for w in workers:
        if w.proc.is_alive():
            w.proc.terminate()
    deadline = time.monotonic() + _STOP_GRACE
    for w in workers:
        left = 0.0 if sig.count > 1 else max(0.0, deadline - time.monotonic())
        w.proc.join(left)
        if w.proc.is_alive():
            w.proc.kill()
    results: list[Result] = []
    for w in workers:
        w.proc.join(0.5)
        try:
            while w.case is not None and not w.conn.closed and w.conn.poll():
                reply = json.loads(w.conn.recv_bytes().decode("utf-8"))
                if "share" in reply:
                    continue
                if reply.get("entry") is not None:
                    results.append((w.case, reply["entry"], None))
                w.case = None
        except (EOFError, OSError, ValueError):
            pass
        if not w.conn.closed:
            w.conn.close()
    return results


def _run_pool(todo: list[CaseSpec], workdir: Path, overwrite: bool, limit: int, jobs: int,
              sig: _Signals, progress: Any = None, costs: Mapping[str, float] | None = None
              ) -> Generator[Result, None, None]:
    """The cases in ``jobs`` worker processes, fed in the given order; ``progress`` (with
    ``case_started`` and ``within``) also hears the share of each case in flight done."""
    import multiprocessing as mp
    from multiprocessing.connection import wait

    threads = max(1, _cpus() // jobs)  # the BLAS and the package's pool of each worker: no oversubscription
    saved = {k: os.environ.get(k) for k in _BLAS_KEYS}
    os.environ.update({k: str(threads) for k in _BLAS_KEYS})  # inherited by the workers
    # Fork where the platform has it: workers start at once with the package imported, and
    # scripts without a ``__main__`` guard work (spawn re-imports them); each worker then
    # limits its BLAS threads (_parallel resets its own pool after a fork).  Spawn elsewhere.
    # Results are exact, so neither the start method nor the thread counts change a byte.
    ctx = mp.get_context("fork" if sys.platform == "linux" and "fork" in mp.get_all_start_methods() else "spawn")
    inside = progress if hasattr(progress, "case_started") and hasattr(progress, "within") else None
    pending = list(todo)
    workers: list[_Worker] = []
    try:
        with _Critical(sig):
            workers = [_Worker(ctx, threads) for _ in range(min(jobs, len(todo)))]
        while pending or any(w.case for w in workers):
            if sig.signum is not None:
                with _Critical(sig):
                    finished = _stop_workers(workers, sig)
                yield from finished  # cases whose files were written before the workers stopped
                return
            for w in workers:
                if w.case is None and pending:
                    spec = pending.pop(0)
                    msg = {"spec": spec.to_dict(), "root": str(workdir), "overwrite": overwrite, "limit": limit}
                    try:
                        w.conn.send_bytes(json.dumps(msg).encode("utf-8"))
                        w.case = spec.id
                        if inside is not None:
                            inside.case_started(spec.id, (costs or {}).get(spec.id, 0.0))
                    except OSError:
                        pending.insert(0, spec)
            busy = [w for w in workers if w.case]
            ready = wait([w.conn for w in busy] + [w.proc.sentinel for w in busy], timeout=0.2)
            for w in busy:
                case_id = w.case
                assert case_id is not None
                reply = None
                first = w.conn in ready
                while reply is None and (first or w.conn.poll()):
                    first = False
                    try:
                        reply = json.loads(w.conn.recv_bytes().decode("utf-8"))
                    except (EOFError, OSError, ValueError):
                        break
                    if isinstance(reply, dict) and "share" in reply:  # progress inside the case
                        if inside is not None and reply.get("id") == case_id:
                            inside.within(float(reply["share"]), case_id)
                        reply = None
                if reply is not None:
                    w.case = None
                    yield case_id, reply.get("entry"), reply.get("error")
                    continue
                if w.proc.sentinel in ready or not w.proc.is_alive():
                    code = w.proc.exitcode
                    how = (f"killed by {signal.Signals(-code).name}" if code is not None and code < 0 else
                           f"exit code {code}")
                    hint = " (perhaps by the out-of-memory killer)" if code == -signal.SIGKILL else ""
                    w.conn.close()
                    idx = workers.index(w)
                    with _Critical(sig):
                        workers[idx] = _Worker(ctx, threads)
                    yield case_id, None, {"kind": "resource", "message": f"worker process {how}{hint}"}
    finally:
        with _Critical(sig):
            _stop_workers(workers, sig)
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


#: How long a rank process waits in one of its group's collectives (a peer that died is noticed
#: at once; a peer that hangs, after this).
_RANK_TIMEOUT_S = 1800.0
#: Where the package lives (the rank processes import it from there, whatever this process's path).
_PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])


def _stop_procs(procs: list[subprocess.Popen[bytes]], sig: _Signals | None) -> None:
    """Terminate the rank processes; kill those alive after the grace period (at once on a second signal)."""
    for p in procs:
        if p.poll() is None:
            try:
                p.terminate()
            except OSError:
                pass
    deadline = time.monotonic() + _STOP_GRACE
    for p in procs:
        left = 0.0 if (sig is not None and sig.count > 1) else max(0.0, deadline - time.monotonic())
        try:
            p.wait(left)
        except subprocess.TimeoutExpired:
            try:
                p.kill()
            except OSError:
                pass
            p.wait()


def _read_result(path: Path) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as f:
            out = json.load(f)
    except (OSError, ValueError):
        return None
    return out if isinstance(out, dict) else None


def _log_tail(path: Path, limit: int = 1500) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - limit))
            text = f.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""
    return text.splitlines()[-1] if text else ""


def _run_ranked(todo: list[CaseSpec], workdir: Path, overwrite: bool, limit: int, sig: _Signals,
                note: Callable[[str], None], held: tuple[int, ...] = ()) -> Generator[Result, None, None]:
    """Each case with one process per rank (``python -m deepgemm_ref.golden._rank_worker``): a gloo
    group over a file store in a temporary directory; every process builds the case and computes
    its rank's goldens, rank 0 merges them, writes the case file and reports its manifest entry
    (a JSON file).  A case whose kernels refuse the process group (the argument error on
    ``group``, on every rank: Mega MoE until its kernels take a multi-process group) is computed
    in this process instead, with a note.  Cases run one after the other.  ``limit``: the run's
    whole memory limit (each of a case's R processes gets ``limit / R``)."""
    for spec in todo:
        if sig.signum is not None:
            return
        ranks = spec_ranks(spec)
        tmp = Path(tempfile.mkdtemp(prefix="deepgemm-ref-ranks-"))
        procs: list[subprocess.Popen[bytes]] = []
        result = tmp / "result.json"
        try:
            threads = max(1, _cpus() // ranks)
            job = {"spec": spec.to_dict(), "root": str(workdir.resolve()), "overwrite": overwrite,
                   "limit": limit // ranks,
                   "store": str(tmp / "store"), "result": str(result), "threads": threads,
                   "timeout_s": _RANK_TIMEOUT_S, "parent": os.getpid()}
            (tmp / "job.json").write_text(json.dumps(job), encoding="utf-8")
            env = dict(os.environ)
            env.update({k: str(threads) for k in _BLAS_KEYS})
            env["PYTHONPATH"] = os.pathsep.join([_PACKAGE_PARENT] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH")
                                                                      else []))
            with _Critical(sig):
                for r in range(ranks):
                    with open(tmp / f"rank{r}.log", "wb") as log:
                        procs.append(subprocess.Popen(
                            [sys.executable, "-m", "deepgemm_ref.golden._rank_worker", "--job", str(tmp / "job.json"),
                             "--rank", str(r), "--world", str(ranks)],
                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                            pass_fds=held,  # the bundle's lock: held while any rank lives
                            start_new_session=True))  # signals are this process's business: it stops them
            # A signal meanwhile is only recorded: the processes are stopped below, and a case rank 0
            # finished (its file written, its entry reported) is still recorded before the run stops.
            with _Critical(sig):
                died: list[tuple[int, int]] = []  # (rank, exit code) of the ranks that ended badly on their own
                while True:
                    codes = [p.poll() for p in procs]  # every one polled (a dead rank is noticed at once)
                    died = [(r, c) for r, c in enumerate(codes) if c is not None and c != 0]
                    if died or all(c is not None for c in codes) or sig.signum is not None:
                        break  # a rank that died leaves the others waiting in a collective: stop them
                    time.sleep(0.05)
                _stop_procs(procs, sig)
                outcome = _read_result(result)
            if outcome is not None and isinstance(outcome.get("entry"), dict):
                yield spec.id, outcome["entry"], None
            elif sig.signum is not None:
                return
            elif outcome is not None and isinstance(outcome.get("fallback"), str):
                why = outcome["fallback"].split("; got ")[0]
                note(f"case {spec.id!r}: computed in this process, not with {ranks} rank processes: its kernels do "
                     f"not take a multi-process group yet ({why})")
                yield from _run_inline([spec], workdir, overwrite, limit, sig)
            elif outcome is not None and isinstance(outcome.get("error"), dict):
                yield spec.id, None, {"kind": str(outcome["error"].get("kind", "internal")),
                                      "message": str(outcome["error"].get("message", ""))}
            else:
                r, code = (died or [(r, p.returncode) for r, p in enumerate(procs) if p.returncode != 0]
                           or [(0, 0)])[0]
                how = (f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}")
                hint = " (perhaps by the out-of-memory killer)" if code == -signal.SIGKILL else ""
                tail = _log_tail(tmp / f"rank{r}.log")
                yield spec.id, None, {"kind": "resource" if code < 0 else "internal",
                                      "message": f"rank process {r} of {ranks}: {how}{hint}"
                                                 + (f": {tail}" if tail else "")}
        finally:
            with _Critical(sig):
                _stop_procs(procs, sig)
                shutil.rmtree(tmp, ignore_errors=True)


def _run_processes(plain: list[CaseSpec], ranked: list[CaseSpec], workdir: Path, overwrite: bool, limit: int,
                   whole: int, jobs: int, costs: Mapping[str, float], sig: _Signals,
                   note: Callable[[str], None], held: tuple[int, ...] = ()) -> Generator[Result, None, None]:
    """The processes executor: the cases of no ranked family as the local executor runs them
    (here, or in a pool of ``jobs`` workers), then the ranked ones with one process per rank."""
    if plain:
        if jobs == 1 or len(plain) <= 1:
            yield from _run_inline(plain, workdir, overwrite, limit, sig)
        else:
            yield from _run_pool(by_cost(plain, costs), workdir, overwrite, limit, jobs, sig)
    if sig.signum is None:
        yield from _run_ranked(ranked, workdir, overwrite, whole, sig, note, held)


def _run_dask(todo: list[CaseSpec], workdir: Path, overwrite: bool, limit: int, scheduler: str | None,
              sig: _Signals) -> Generator[Result, None, None]:
    try:
        from distributed import Client
    except ImportError:
        raise BundleError("golden: executor 'dask' needs dask.distributed: pip install 'deepgemm-ref[dask]'") from None
    if not scheduler:
        raise BundleError("golden: executor 'dask' needs --scheduler ADDRESS")
    try:
        client = Client(scheduler, timeout="10s")
    except (OSError, TimeoutError) as e:
        raise BundleError(f"golden: cannot reach the Dask scheduler at {scheduler}: {e}") from None
    # A token file: tasks still running after this run stops see it gone and write nothing.
    token = f".run-{uuid.uuid4().hex}.tmp"
    (workdir / CASES_DIR / token).touch()
    futures: dict[Any, str] = {}
    try:
        host_threads: dict[str, int] = {}
        try:
            for address, info in client.scheduler_info().get("workers", {}).items():
                host = _address_host(str(address))
                host_threads[host] = host_threads.get(host, 0) + int(info.get("nthreads", 1) or 1)
        except Exception:  # noqa: BLE001 - no worker information: each task pins itself to its worker's threads
            host_threads = {}
        # One task per case, ``todo`` in cost order (the largest first): the scheduler runs the
        # higher priorities first, so that no worker is left alone with a large case at the end.
        futures = {client.submit(_dask_task, json.dumps(s.to_dict()), str(workdir.resolve()), overwrite, limit,
                                 token, host_threads, key=f"case-{s.id}-{uuid.uuid4().hex[:8]}", pure=False,
                                 retries=0, priority=len(todo) - i): s.id
                   for i, s in enumerate(todo)}
        pending = set(futures)
        stop_at: float | None = None
        while pending:
            if sig.signum is not None:
                # a short grace: tasks that were writing their case report it and are recorded
                stop_at = stop_at or time.monotonic() + _STOP_GRACE / 2
                if time.monotonic() >= stop_at or sig.count > 1:
                    return
            done = [f for f in pending if f.done()]
            if not done:
                time.sleep(0.1)
                continue
            for fut in done:
                pending.discard(fut)
                try:
                    yield futures[fut], fut.result(), None
                except Exception as e:
                    yield futures[fut], None, _failure(e)
    finally:
        with _Critical(sig):
            try:
                (workdir / CASES_DIR / token).unlink()
            except OSError:
                pass
            left = [f for f in futures if not f.done()]
            if left:
                try:
                    client.cancel(left, force=True)
                except Exception:  # noqa: BLE001 - best effort while stopping
                    pass
            try:
                client.close(timeout=2)
            except Exception:  # noqa: BLE001
                pass


# ----------------------------------------------------------------------------------------------
# generate
# ----------------------------------------------------------------------------------------------

def _sweep_temporaries(workdir: Path) -> None:
    """Remove the temporary files a run (or an interrupted earlier one) left in the bundle."""
    for d in (workdir, workdir / CASES_DIR):
        try:
            names = os.listdir(d)
        except OSError:
            continue
        for name in names:
            if name.startswith(".") and name.endswith(".tmp"):
                try:
                    os.unlink(d / name)
                except OSError:
                    pass


def _prepare(plan: Plan, locks: list[BundleLock]) -> Path:
    """The directory cases are written to (the bundle itself, or the sibling build directory),
    locked (appended to ``locks``) unless ``locks`` already holds its lock."""
    root = plan.root
    try:
        if plan.mode == "replace":
            work = sibling_name(root, "new")
            work.mkdir()
            try:
                locks.append(BundleLock(work, root).acquire())
            except BundleError:
                shutil.rmtree(work, ignore_errors=True)
                raise
            (work / CASES_DIR).mkdir()
            return work
        root.mkdir(parents=True, exist_ok=True)
        if not locks:
            locks.append(BundleLock(root).acquire())
            # a run that started meanwhile on the same new directory may have finished a bundle there
            if plan.mode == "new" and os.path.lexists(root / MANIFEST_NAME):
                raise BundleError(f"{root}: already holds a bundle (another run wrote it meanwhile); pass --force "
                                  "to replace it, or --resume to finish an incomplete one")
        (root / CASES_DIR).mkdir(exist_ok=True)
    except OSError as e:
        raise BundleError(f"{root}: cannot create the bundle directory: {e.strerror or e}") from None
    if not os.access(root, os.W_OK) or not os.access(root / CASES_DIR, os.W_OK):
        raise BundleError(f"{root}: not writable")
    if (root / CASES_DIR).is_symlink():
        raise BundleError(f"{root / CASES_DIR}: is a symlink (refused)")
    return root


def _sweep_stale_siblings(root: Path) -> None:
    """Remove the sibling build directories that interrupted ``--force`` runs of this bundle left
    (only those no live run holds; called while this run holds the bundle's lock)."""
    for p in stale_siblings(root):
        shutil.rmtree(p, ignore_errors=True)


def _swap(plan: Plan, work: Path) -> None:
    """Put the complete new bundle in place of the old one; entries of the old directory that are
    not part of a bundle (the user's files) move along."""
    root = plan.root
    old = sibling_name(root, "old")
    os.rename(root, old)
    try:
        os.rename(work, root)
    except OSError:
        os.rename(old, root)
        raise
    for name in os.listdir(old):
        if name not in (MANIFEST_NAME, CASES_DIR, LOCK_NAME) and not _temporary(name):
            os.rename(old / name, root / name)
    # Inside cases/, every entry that is not a case file (.safetensors) or a temporary is the
    # user's (notes, scripts): it moves along too, unless the new bundle has an entry of that name.
    try:
        names = os.listdir(old / CASES_DIR) if not (old / CASES_DIR).is_symlink() else []
    except OSError:
        names = []
    for name in names:
        if name.endswith(".safetensors") or _temporary(name) or os.path.lexists(root / CASES_DIR / name):
            continue
        try:
            os.rename(old / CASES_DIR / name, root / CASES_DIR / name)
        except OSError:
            pass
    shutil.rmtree(old, ignore_errors=True)


def _temporary(name: str) -> bool:
    """A run's temporary file name (``.<...>.tmp``)."""
    return name.startswith(".") and name.endswith(".tmp")


def generate(
    specs: Iterable[CaseSpec | Mapping[str, Any]],
    out_dir: str | os.PathLike[str],
    *,
    force: bool = False,
    resume: bool = False,
    jobs: int = 1,
    executor: str = "local",
    scheduler: str | None = None,
    progress: Any = None,
    max_memory: int | None = None,
    dry_run: bool = False,
    on_plan: Callable[[Plan], None] | None = None,
    source: str = "",
    ranks_per_case: int | None = None,
    on_note: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Generate a bundle: plan, build every case, compute its golden, write files atomically.

    jobs: worker processes (``executor="local"``), started once for the run and fed the cases
    the largest estimated work first (each builds its case's inputs from the specification, sent
    as JSON), each given ``cpus // jobs`` BLAS and pool threads; fewer workers, or none (the cases
    run in this process), on a loaded machine, for tiny cases or beyond the CPU count, with a note
    (:func:`pool_workers`).
    executor: ``"local"``, ``"dask"`` (cases run on the ``dask.distributed`` scheduler at
    ``scheduler``, which must see ``out_dir``; one task per case, submitted with priorities in
    cost order, each worker's BLAS pinned to its host's share) or ``"processes"``: each case of a ranked family
    (``ep_dispatch``, ``ep_combine``, ``mega_moe``) with one process per rank over a gloo group
    (needs torch; :mod:`.ranks` says how the ranks' goldens merge; cases one at a time), the other
    cases as ``"local"`` runs them.  ranks_per_case: with ``"processes"``, the processes a case
    takes; every ranked case must have that many ranks (default: each case's own).  on_note:
    called with a line for what the user should know (a Mega MoE case computed in this process
    because its kernels do not take a multi-process group; fewer ``jobs`` workers than asked).
    resume: keep the verified cases of an existing (possibly incomplete) bundle, generate the rest.
    force: replace an existing bundle (built aside and swapped in when complete).
    max_memory: the memory limit in bytes (default: :func:`.resources.default_memory_limit`);
    with local jobs each case must fit in ``max_memory / jobs``.
    dry_run: return the plan (:meth:`Plan.to_json`) and write nothing.  on_plan: called with the
    plan before any work.  progress: a :class:`.progress.Progress`-like object or a callable
    ``f(done, total, case_id)``.  source: names the specification file in errors.
    Every case is deterministic, so the bundle's bytes do not depend on jobs or the executor.
    On failures the finished cases are kept (listed in the manifest with the unfinished ones
    under ``"incomplete"``) and :class:`CaseFailures` names each failing case and why.
    On SIGINT / SIGTERM: :class:`GenerationInterrupted` (see the module docstring).
    Returns the manifest.
    """
    locks: list[BundleLock] = []
    try:
        if not dry_run and _holds_bundle(out_dir):
            # One run per bundle: locked before the plan reads (and, for resume, verifies) it.
            where = Path(os.path.realpath(out_dir))
            locks.append(BundleLock(where, Path(out_dir)).acquire())
        plan = plan_generation(specs, out_dir, force=force, resume=resume, jobs=jobs, executor=executor,
                               max_memory=max_memory, source=source, ranks_per_case=ranks_per_case,
                               dry_run=dry_run)
        if on_plan is not None:
            on_plan(plan)
        if dry_run:
            return plan.to_json()
        return _execute(plan, scheduler, as_progress(progress), on_note or (lambda text: None), locks)
    finally:
        for lock in reversed(locks):
            lock.release()


def _holds_bundle(out_dir: str | os.PathLike[str]) -> bool:
    """Whether ``out_dir`` is a directory holding a manifest or a ``cases`` directory."""
    root = Path(out_dir)
    return bool(os.fspath(out_dir)) and root.is_dir() and (
        os.path.lexists(root / MANIFEST_NAME) or os.path.lexists(root / CASES_DIR))


def _execute(plan: Plan, scheduler: str | None, progress: Any, note: Callable[[str], None],
             locks: list[BundleLock]) -> dict[str, Any]:
    ids = [c.spec.id for c in plan.cases]
    todo = plan.todo
    plain_todo = [c for c in todo if not plan.in_rank_processes(c)]
    workers = 1
    if plan.executor in ("local", "processes"):
        workers, why = pool_workers(plan.jobs, len(plain_todo),
                                    sum(c.estimate.seconds for c in plain_todo if c.estimate))
        if why:
            note(why)
    inline = plan.executor in ("local", "processes") and workers == 1
    finished: dict[str, dict[str, Any]] = dict(plan.kept)
    failures: dict[str, dict[str, str]] = {}
    in_place = plan.mode != "replace"
    with _Signals(raise_now=inline) as sig:
        with _Critical(sig):
            work = _prepare(plan, locks)
        held = tuple(lock.fd for lock in locks if lock.fd is not None)  # the rank processes keep them too

        def checkpoint() -> dict[str, Any]:
            manifest = new_manifest([finished[i] for i in ids if i in finished], [i for i in ids if i not in finished])
            write_manifest(work, manifest)
            return manifest

        results: Generator[Result, None, None] | None = None
        try:
            sig.check()
            if in_place:
                with _Critical(sig):
                    _sweep_temporaries(work)
                    checkpoint()
            overwrite = plan.mode != "replace"
            costs = {c.spec.id: (c.estimate.work if c.estimate else 1.0) for c in todo}
            total_work = sum(costs.values())
            progress.start(len(todo), total_work)
            done_work = 0.0
            last = time.monotonic()
            specs = [c.spec for c in todo]
            if plan.executor == "dask":
                results = _run_dask(by_cost(specs, costs), work, overwrite, plan.case_limit, scheduler, sig)
            elif plan.executor == "processes":
                results = _run_processes([c.spec for c in plain_todo],
                                         [c.spec for c in todo if plan.in_rank_processes(c)], work, overwrite,
                                         plan.case_limit, plan.memory_limit, workers, costs, sig, note, held)
            elif inline:
                results = _run_inline(specs, work, overwrite, plan.case_limit, sig, progress, costs)
            else:  # the largest cases first, so that no worker is left with one at the end
                results = _run_pool(by_cost(specs, costs), work, overwrite, plan.case_limit, workers, sig,
                                    progress, costs)
            for n, (case_id, entry, failure) in enumerate(results, start=1):
                if entry is not None:
                    finished[case_id] = entry
                else:
                    failures[case_id] = failure or {"kind": "internal", "message": "no result"}
                done_work += costs.get(case_id, 0.0)
                progress.update(n, done_work, case_id)
                if in_place and time.monotonic() - last >= _CHECKPOINT_SECONDS:
                    with _Critical(sig):
                        checkpoint()
                    last = time.monotonic()
            with _Critical(sig):
                results.close()  # stops the workers (pool, Dask) now
            if any(i not in finished for i in ids):
                sig.check()  # a signal once every case is finished changes nothing: complete the bundle
        except KeyboardInterrupt as e:
            if results is not None:
                with _Critical(sig):
                    results.close()
            if not isinstance(e, GenerationInterrupted):
                sig.note_keyboard_interrupt()
            with _Critical(sig):
                progress.finish()
                assert sig.signum is not None
                raise GenerationInterrupted(sig.signum, _stopped(plan, work, finished, ids, sig.signum,
                                                                 checkpoint if in_place else None)) from None
        except BaseException:
            with _Critical(sig):
                progress.finish()
                if results is not None:
                    results.close()
                if in_place:
                    checkpoint()
                    _sweep_temporaries(work)
                else:
                    shutil.rmtree(work, ignore_errors=True)
            raise
        with _Critical(sig):
            progress.finish()
            missing = [i for i in ids if i not in finished]
            if missing:
                if in_place:
                    checkpoint()
                    _sweep_temporaries(work)
                else:
                    shutil.rmtree(work, ignore_errors=True)
                raise _failures_error(plan, finished, failures, missing)
            manifest = checkpoint()
            _sweep_temporaries(work)
            if plan.mode == "replace":
                try:
                    _swap(plan, work)
                except OSError as e:
                    shutil.rmtree(work, ignore_errors=True)
                    raise BundleError(f"{plan.root}: cannot put the new bundle in place: {e}") from None
            elif plan.mode == "resume":
                for rel in plan.stale:
                    try:
                        os.unlink(plan.root / rel)
                    except OSError:
                        pass
            _sweep_stale_siblings(plan.root)
        return manifest


def _stopped(plan: Plan, work: Path, finished: dict[str, Any], ids: list[str], signum: int,
             checkpoint: Callable[[], Any] | None) -> str:
    name = signal.Signals(signum).name
    kept = sum(i in finished for i in ids)
    if checkpoint is None:
        shutil.rmtree(work, ignore_errors=True)
        return (f"interrupted by {name}: {plan.root} left as it was (--force builds the new bundle aside; "
                f"its {kept - len(plan.kept)} finished {plural(kept - len(plan.kept), 'case')} were discarded)")
    checkpoint()
    _sweep_temporaries(work)
    # What is on disk: the manifest's cases, and the case files present (a worker may have written
    # one in the last moment without its entry reaching the manifest; --resume verifies it).
    on_disk = sum(os.path.isfile(work / c.file) for c in plan.cases)
    files = (f"; {CASES_DIR}/ holds {count(on_disk, 'case file')} of this run, "
             f"{on_disk - kept} not in the manifest (--resume checks and regenerates them)"
             if on_disk > kept else
             f"; {CASES_DIR}/ holds {on_disk} of their files" if on_disk < kept else "")
    return (f"interrupted by {name}: {kept} of {count(len(ids), 'case')} finished and kept "
            f"in {plan.root} (in the manifest, marked incomplete){files}; run the same command with --resume to "
            "finish")


def _failures_error(plan: Plan, finished: dict[str, Any], failures: dict[str, dict[str, str]],
                    missing: list[str]) -> CaseFailures:
    lines = [f"case {cid!r}: {f['message']}" for cid, f in list(failures.items())[:20]]
    kinds = {f["kind"] for f in failures.values()}
    where = (f"{len(finished)} of {count(len(finished) + len(missing), 'case')} finished and kept in {plan.root}"
             if plan.mode != "replace" else f"{plan.root} left as it was (the new bundle was not complete)")
    advice = []
    if "input" in kinds:
        advice.append("fix the specification of the failing cases")
    if "resource" in kinds:
        advice.append("free memory or disk and re-run with --resume" if plan.mode != "replace" else
                      "free memory or disk and re-run")
    if "internal" in kinds:
        advice.append("an unexpected error is a bug in deepgemm_ref: please report it")
    return CaseFailures("\n".join(lines) + f"\n{where}; " + "; ".join(advice), internal="internal" in kinds)


# ----------------------------------------------------------------------------------------------
# verify
# ----------------------------------------------------------------------------------------------

def verify(root: str | os.PathLike[str], *, regenerate: bool = False, progress: Any = None,
           max_memory: int | None = None) -> dict[str, Any]:
    """Check every hash; with ``regenerate`` rebuild each case and compare the bytes.

    Returns {"cases": n, "ok": bool, "problems": [str], "incomplete": [ids], "regenerated": n}.
    An incomplete bundle is not ok.
    """
    b = load_bundle(root, max_memory=max_memory)
    problems: list[str] = []
    prog = as_progress(progress)
    costs: dict[str, float] = {}
    for case_id, entry in b.cases.items():
        costs[case_id] = _entry_cost(entry, regenerate)
    prog.start(len(b.cases), sum(costs.values()))
    done_work = 0.0
    regenerated = 0
    try:
        for n, case_id in enumerate(b.cases, start=1):
            try:
                b.verify_case(case_id)  # the file's and every tensor's digest, read in chunks (any size)
                if regenerate:
                    entry = b.cases[case_id]
                    fresh = _regenerated_digests(CaseSpec.from_dict(entry["spec"]), b.max_memory)
                    for name, meta in entry["tensors"].items():
                        if name not in fresh:
                            problems.append(f"case {case_id!r}: regenerated case lacks {name!r}")
                        elif fresh[name] != meta["sha256"]:
                            problems.append(f"case {case_id!r}: regenerated {name!r} differs from the stored bytes")
                    for name in sorted(set(fresh) - set(entry["tensors"])):
                        problems.append(f"case {case_id!r}: regenerated case has an extra tensor {name!r}")
                    regenerated += 1
            except DGArgumentError as e:
                problems.append(str(e))
            done_work += costs[case_id]
            prog.update(n, done_work, case_id)
    finally:
        prog.finish()
    if b.incomplete:
        n_left = len(b.incomplete)
        problems.append(f"the bundle is incomplete: {count(n_left, 'case')} {plural(n_left, 'was')} not generated "
                        f"({', '.join(b.incomplete[:5])}{', ...' if len(b.incomplete) > 5 else ''}); "
                        "finish it with golden --resume")
    return {"cases": len(b.cases), "ok": not problems, "problems": problems, "incomplete": list(b.incomplete),
            "regenerated": regenerated}


def _regenerated_digests(spec: CaseSpec, limit: int) -> dict[str, str]:
    """Every tensor's sha256 of the case computed again as generation computes it under ``limit``
    (in row blocks where its estimate says so: nothing is held whole that generation did not)."""
    with _computing(spec, limit) as (built, block, axes):
        if axes is not None:
            return digests_in_row_blocks(built, axes, block)
        golden, _ = compute_golden(built)
    fresh = {f"input.{k}": v for k, v in built.inputs.items()}
    fresh.update({f"golden.{k}": v for k, v in golden.items()})
    return {k: st.tensor_sha256(v) for k, v in fresh.items()}


def _entry_cost(entry: Mapping[str, Any], regenerate: bool) -> float:
    """A manifest entry's work: the family estimate of its spec when regenerating, else its bytes."""
    size = float(sum(math.prod(t["shape"]) for t in entry["tensors"].values()))
    if regenerate:
        try:
            est = estimate_case(validate_spec(entry["spec"]))
            if est is not None:
                return est.work
        except DGArgumentError:
            pass
    return size + 1.0

