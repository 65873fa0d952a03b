"""Golden bundles on disk: generation, loading with verification, and ``verify --regenerate``.

A bundle is a directory::

    BUNDLE/manifest.json              what every case is and how to call it (JSON, versioned)
    BUNDLE/cases/<case id>.safetensors  the case's inputs ("input.<name>") and goldens ("golden.<name>")

Inputs are stored contiguous in the dtypes the kernel API takes (BF16, F8_E4M3, int8 packed FP4,
float32 or packed UE8M0 scales in user form).  Goldens: ``golden.<output>`` in the output dtype,
``golden.acc`` (float64 accumulator), ``golden.acc_lo`` (its low part, float32 outputs),
``golden.S`` (float64 error scale, rounded up) and ``golden.defined`` (bool mask).  The manifest
records the call, the transforms, the checker parameters, the numerics policies, the seed and
generator, package versions, BLAS thread settings and the sha256 of every tensor and file, and
``manifest_sha256``, the sha256 of its own canonical JSON (an edited manifest is refused).
Every file is written atomically (temporary file, then rename); nothing is overwritten without
``force``; loading verifies every hash.  No pickle anywhere.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from .. import __version__, trace
from .._parallel import limit_blas_threads, single_threaded_blas
from ..config import get_numerics
from ..errors import DGArgumentError
from ..settings import numerics
from . import safetensors as st
from .cases import ArgRef, BuiltCase, CaseSpec, build_case

__all__ = ["MANIFEST_NAME", "MANIFEST_VERSION", "MANIFEST_HASH_KEY", "manifest_digest", "BundleError", "Bundle",
           "CaseData", "generate", "load_bundle", "verify", "compute_golden", "call_kernel"]

MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 2  # 2: the manifest carries the sha256 of its own contents
MANIFEST_HASH_KEY = "manifest_sha256"


def manifest_digest(manifest: dict[str, Any]) -> str:
    """sha256 of the manifest's canonical JSON (sorted keys, no whitespace), without its own hash
    field: any edit of a case's call, bounds or hashes changes it."""
    body = {k: v for k, v in manifest.items() if k != MANIFEST_HASH_KEY}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()
FORMAT_NAME = "deepgemm-ref-golden"


class BundleError(DGArgumentError):
    """A bundle that cannot be read, is incomplete, altered, or of an unknown version."""


# ----------------------------------------------------------------------------------------------
# calling a kernel from a call description
# ----------------------------------------------------------------------------------------------

def _materialise(ref: ArgRef, tensors: Mapping[str, Any], outputs: Mapping[str, Any]) -> Any:
    if ref.kind == "value":
        v = ref.value
        return tuple(v) if isinstance(v, list) else v
    first = str(ref.names[0])
    if ref.kind == "output":
        return outputs[first]
    if ref.kind == "tensor":
        return tensors[first]
    second = ref.names[1]
    return (tensors[first], None if second is None else tensors[second])  # pair


def call_kernel(module: Any, function: str, args: list[ArgRef], kwargs: Mapping[str, ArgRef],
                tensors: Mapping[str, Any], outputs: Mapping[str, Any]) -> Any:
    """``module.function(*args, **kwargs)`` with references resolved to tensors and outputs."""
    fn = getattr(module, function, None)
    if fn is None:
        raise BundleError(f"module {getattr(module, '__name__', module)!r} has no function {function!r}")
    return fn(*[_materialise(a, tensors, outputs) for a in args],
              **{k: _materialise(v, tensors, outputs) for k, v in kwargs.items()})


def run_case_call(module: Any, entry: Mapping[str, Any], args: list[ArgRef], kwargs: Mapping[str, ArgRef],
                  tensors: dict[str, Any], outputs: dict[str, Any]) -> None:
    """Setup calls, derived inputs, the kernel call; a returned output lands in ``outputs``."""
    for call in entry.get("setup", []):
        _call_desc(module, call, tensors, outputs)
    for call in entry.get("derived", []):
        tensors[call["name"]] = _call_desc(module, call, tensors, outputs)
    if entry.get("driver"):
        from .moe import DRIVERS

        name = entry["driver"].get("name")
        if name not in DRIVERS:
            raise BundleError(f"manifest: unknown driver {name!r}")
        DRIVERS[name](module, dict(entry), tensors, outputs)
        return
    result = call_kernel(module, entry["function"], args, kwargs, tensors, outputs)
    ret = entry.get("returns")
    if ret:
        outputs[ret] = result


def _call_desc(module: Any, call: Mapping[str, Any], tensors: Mapping[str, Any], outputs: Mapping[str, Any]) -> Any:
    return call_kernel(module, call["function"], [ArgRef.from_json(a) for a in call.get("args", [])],
                       {k: ArgRef.from_json(v) for k, v in call.get("kwargs", {}).items()}, tensors, outputs)


def _fresh_outputs(
    outputs: Mapping[str, Mapping[str, Any]], tensors: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    out = {}
    for name, o in outputs.items():
        if o["init"] == "returned":
            continue
        if o["init"] == "zeros":
            out[name] = np.zeros(o["shape"], np.dtype(_DTYPES[o["dtype"]]))
        elif o["init"] == "nan":
            out[name] = np.full(o["shape"], np.nan, np.dtype(_DTYPES[o["dtype"]]))
        else:
            out[name] = np.array(tensors[o["init"]], copy=True)
    return out


_DTYPES: dict[str, Any] = {"bfloat16": ml_dtypes.bfloat16, "float32": np.float32, "float64": np.float64,
                           "float8_e4m3fn": ml_dtypes.float8_e4m3fn, "int32": np.int32, "int16": np.int16,
                           "int8": np.int8, "int64": np.int64, "uint8": np.uint8, "bool": np.bool_}


def compute_golden(built: BuiltCase) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Run the case through the emulator's exact model; returns (golden tensors, stats)."""
    import deepgemm_ref

    # One BLAS thread: stored float64 tensors (acc, S) that no certificate makes exact would
    # otherwise depend on the BLAS thread count (see _parallel.single_threaded_blas).
    with single_threaded_blas(), numerics(arch=built.spec.profile, accumulation="exact"):
        outs = _fresh_outputs(built.outputs, built.inputs)
        tensors = dict(built.inputs)
        with trace.capture(want_acc=True, want_S=True) as cap:
            run_case_call(deepgemm_ref, _entry_of(built), built.args, built.kwargs, tensors, outs)
    golden: dict[str, np.ndarray] = {}
    for name in built.outputs:
        golden[name] = np.ascontiguousarray(outs[name])
    stats: dict[str, Any] = {}
    if cap.records and built.driver is not None:
        stats = _stack_rank_records(cap.records, golden)
        from .moe import hard_error_scale

        golden["S_hard"] = hard_error_scale(golden, built.inputs)
    elif cap.records:
        rec = cap.records[-1]
        main = next(iter(built.outputs))
        shape = golden[main].shape
        if rec.acc is not None:
            golden["acc"] = np.ascontiguousarray(rec.acc, np.float64)
        if rec.acc_lo is not None:
            golden["acc_lo"] = np.ascontiguousarray(rec.acc_lo, np.float64)
        if rec.S is not None:
            golden["S"] = np.ascontiguousarray(rec.S, np.float64)
        golden["defined"] = np.ones(shape, bool) if rec.defined is None else np.ascontiguousarray(rec.defined, bool)
        for k, v in rec.extra.items():
            golden[f"extra.{k}"] = np.ascontiguousarray(v)
        stats = dict(rec.stats)
    return golden, stats


def _stack_rank_records(records: list[Any], golden: dict[str, np.ndarray]) -> dict[str, Any]:
    """One record per rank (Mega MoE): stack ``acc`` / ``S`` along the rank axis of the main
    output, keep each rank's stage goldens as ``extra.rank<r>.<name>``."""
    for key in ("acc", "S"):
        vals = [getattr(rec, key) for rec in records]
        if all(v is not None for v in vals):
            golden[key] = np.ascontiguousarray(np.stack([np.asarray(v, np.float64) for v in vals]))
    golden["defined"] = np.ones(golden["y"].shape, bool)
    for r, rec in enumerate(records):
        for k, v in rec.extra.items():
            golden[f"extra.rank{r}.{k}"] = np.ascontiguousarray(v)
    return {"ranks": [dict(rec.stats) for rec in records]}


# ----------------------------------------------------------------------------------------------
# manifest
# ----------------------------------------------------------------------------------------------

# The BLAS thread settings of this process as it started (dask.distributed rewrites them in the
# client process; --jobs sets them for its workers): every golden is exact, so they cannot change
# a byte of a bundle; they are recorded for the record.
_BLAS_ENV = {k: os.environ[k] for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                        "DEEPGEMM_REF_NUM_THREADS") if k in os.environ}


def _entry_of(built: BuiltCase) -> dict[str, Any]:
    return {"function": built.function, "setup": built.setup, "derived": built.derived, "returns": built.returns,
            "driver": built.driver, "profile": built.spec.profile}


def _environment() -> dict[str, Any]:
    blas = dict(_BLAS_ENV)
    return {
        "deepgemm_ref": __version__,
        "numpy": np.__version__,
        "ml_dtypes": ml_dtypes.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "blas_thread_env": blas,
    }


def _numerics_record() -> dict[str, Any]:
    opts = get_numerics()
    return {
        "accumulation": "exact",
        "output_rounding": "round to nearest even, once, from the exact value",
        "scale_division": opts.scale_division,
        "e4m3_overflow": opts.e4m3_overflow,
        "fp4_rounding": "deepgemm (ties toward zero, no -0, NaN -> +0) in the quantisers",
        "ue8m0_scales": "ceil_to_ue8m0 on float32 bits; byte 0 read as 2^-127 by kernels",
    }


def _tensor_entry(x: Any) -> dict[str, Any]:
    name = st.NUMPY_TO_SAFETENSORS.get(np.dtype(x.dtype)) if isinstance(x, np.ndarray) else "F4"
    return {"dtype": name, "shape": list(x.shape), "sha256": st.tensor_sha256(x)}


def _atomic_write_text(path: Path, text: str, force: bool) -> None:
    if path.exists() and not force:
        raise BundleError(f"{path}: exists; pass force=True (--force) to overwrite")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _case_entry(built: BuiltCase, tensors: Mapping[str, Any], rel_file: str, file_sha: str,
                stats: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "id": built.spec.id,
        "spec": built.spec.to_dict(),
        "kernel": built.spec.kernel,
        "profile": built.spec.profile,
        "function": built.function,
        "args": [a.to_json() for a in built.args],
        "kwargs": {k: v.to_json() for k, v in built.kwargs.items()},
        "outputs": built.outputs,
        "main_output": next(iter(built.outputs)),
        "transforms": built.transforms,
        "setup": built.setup,
        "derived": built.derived,
        "returns": built.returns,
        "driver": built.driver,
        "check": built.check,
        "seed": built.spec.seed,
        "generator": "numpy PCG64(SeedSequence(seed, spawn_key=(crc32(case id),)))",
        "file": rel_file,
        "file_sha256": file_sha,
        "tensors": {k: _tensor_entry(v) for k, v in sorted(tensors.items())},
        "golden_stats": dict(stats),
    }


def generate(
    specs: Iterable[CaseSpec | Mapping[str, Any]],
    out_dir: str | os.PathLike[str],
    *,
    force: bool = False,
    resume: bool = False,
    jobs: int = 1,
    executor: str = "local",
    scheduler: str | None = None,
    progress: Callable[[int, int, str], None] | None = None,
) -> dict[str, Any]:
    """Generate a bundle: build every case, compute its golden, write files atomically.

    jobs: worker processes (``executor="local"``), each given ``cpu_count // jobs`` BLAS threads.
    executor: ``"local"`` or ``"dask"`` (cases run on the ``dask.distributed`` scheduler at
    ``scheduler``, which must see ``out_dir``).
    resume: keep the verified cases of an existing (possibly incomplete) bundle, generate the rest.
    Every case is deterministic, so the bundle's bytes do not depend on jobs or the executor.
    On a failure the finished cases are kept (and listed in the manifest with the unfinished ones
    under ``"incomplete"``) and :class:`BundleError` says which cases to re-run (``resume=True``).
    Returns the manifest.
    """
    spec_list = [s if isinstance(s, CaseSpec) else CaseSpec.from_dict(s) for s in specs]
    ids = [s.id for s in spec_list]
    if len(set(ids)) != len(ids):
        raise BundleError(f"duplicate case ids: {sorted({i for i in ids if ids.count(i) > 1})}")
    for s in spec_list:
        _safe_name(s.id)
    if jobs < 1:
        raise BundleError(f"golden: jobs: expected a positive number of workers; got {jobs}")
    root = Path(out_dir)
    try:
        (root / "cases").mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BundleError(f"{root}: cannot create the bundle directory: {e}") from e
    if not os.access(root, os.W_OK):
        raise BundleError(f"{root}: not writable")
    done: dict[str, dict[str, Any]] = {}
    if (root / MANIFEST_NAME).exists():
        if resume:
            done = _verified_cases(root)
        elif not force:
            raise BundleError(f"{root}: already holds a bundle; pass force=True (--force) to overwrite "
                              "or resume=True (--resume) to finish an incomplete one")
    todo = [s for s in spec_list if s.id not in done or done[s.id]["spec"] != s.to_dict()]
    finished: dict[str, dict[str, Any]] = {k: v for k, v in done.items() if k in set(ids)}
    error: BaseException | None = None
    try:
        for i, entry in enumerate(_run_cases(todo, root, force or resume, jobs, executor, scheduler)):
            finished[entry["id"]] = entry
            if progress is not None:
                progress(i + 1, len(todo), entry["id"])
    except (BundleError, OSError, RuntimeError, ImportError) as e:
        error = e
    entries = [finished[i] for i in ids if i in finished]
    manifest = {
        "format": FORMAT_NAME,
        "version": MANIFEST_VERSION,
        "created_by": _environment(),
        "numerics": _numerics_record(),
        "cases": entries,
    }
    missing = [i for i in ids if i not in finished]
    if missing:
        manifest["incomplete"] = missing
    manifest[MANIFEST_HASH_KEY] = manifest_digest(manifest)
    _atomic_write_text(root / MANIFEST_NAME, json.dumps(manifest, indent=1, sort_keys=True) + "\n", force=True)
    if missing:
        raise BundleError(
            f"{root}: {len(entries)} of {len(ids)} cases finished and kept; not finished: {missing}"
            + (f" ({type(error).__name__}: {error})" if error else "")
            + "; re-run with --resume to generate them"
        )
    return manifest


def _verified_cases(root: Path) -> dict[str, dict[str, Any]]:
    """The cases of an existing bundle whose files still verify."""
    try:
        b = Bundle(root)
    except BundleError:
        return {}
    ok = {}
    for case_id, entry in b.cases.items():
        try:
            b.case(case_id)
        except BundleError:
            continue
        ok[case_id] = entry
    return ok


def _generate_case_worker(spec_dict: dict[str, Any], root: str, overwrite: bool) -> dict[str, Any]:
    """Process/Dask worker entry point: one case, written to ``root``; returns its manifest entry."""
    return _generate_case(CaseSpec.from_dict(spec_dict), Path(root), overwrite)


def _run_cases(todo: list[CaseSpec], root: Path, overwrite: bool, jobs: int, executor: str,
               scheduler: str | None) -> Iterable[dict[str, Any]]:
    if executor == "dask":
        yield from _run_dask(todo, root, overwrite, scheduler)
        return
    if executor != "local":
        raise BundleError(f"golden: executor: expected 'local' or 'dask'; got {executor!r}")
    if jobs == 1 or len(todo) <= 1:
        for spec in todo:
            yield _generate_case(spec, root, overwrite)
        return
    import concurrent.futures as cf
    import multiprocessing as mp

    threads = max(1, (os.cpu_count() or 1) // jobs)
    env_keys = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "DEEPGEMM_REF_NUM_THREADS")
    saved = {k: os.environ.get(k) for k in env_keys}
    os.environ.update({k: str(threads) for k in env_keys})  # inherited by the workers
    try:
        # Fork where the platform has it: workers start at once with the package imported, and
        # scripts without a ``__main__`` guard work (spawn re-imports them); each worker then
        # limits its BLAS threads (_parallel resets its own pool after a fork).  Spawn elsewhere.
        # Results are exact, so neither the start method nor the thread counts change a byte.
        fork = sys.platform == "linux" and "fork" in mp.get_all_start_methods()
        with cf.ProcessPoolExecutor(jobs, mp_context=mp.get_context("fork" if fork else "spawn"),
                                    initializer=limit_blas_threads, initargs=(threads,)) as pool:
            futures = {pool.submit(_generate_case_worker, s.to_dict(), str(root), overwrite): s.id for s in todo}
            failures = []
            for fut in cf.as_completed(futures):
                try:
                    yield fut.result()
                except Exception as e:  # a worker died or raised: keep going, report at the end
                    failures.append(f"{futures[fut]}: {type(e).__name__}: {e}")
            if failures:
                raise BundleError("; ".join(failures))
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _run_dask(todo: list[CaseSpec], root: Path, overwrite: bool, scheduler: str | None) -> Iterable[dict[str, Any]]:
    try:
        from distributed import Client, as_completed
    except ImportError as e:
        raise BundleError("golden: executor 'dask' needs dask.distributed: pip install 'deepgemm-ref[dask]'") from e
    if not scheduler:
        raise BundleError("golden: executor 'dask' needs --scheduler ADDRESS")
    try:
        client = Client(scheduler, timeout="10s")
    except (OSError, TimeoutError) as e:
        raise BundleError(f"golden: cannot reach the Dask scheduler at {scheduler}: {e}") from e
    try:
        futures = [client.submit(_generate_case_worker, s.to_dict(), str(root.resolve()), overwrite, key=f"case-{s.id}",
                                 pure=False, retries=0) for s in todo]
        failures = []
        for fut in as_completed(futures):
            try:
                yield fut.result()
            except Exception as e:
                failures.append(f"{fut.key}: {type(e).__name__}: {e}")
        if failures:
            raise BundleError("; ".join(failures))
    finally:
        client.close()


def _generate_case(spec: CaseSpec, root: Path, force: bool) -> dict[str, Any]:
    built = build_case(spec)
    golden, stats = compute_golden(built)
    tensors: dict[str, Any] = {f"input.{k}": v for k, v in built.inputs.items()}
    tensors.update({f"golden.{k}": v for k, v in golden.items()})
    rel = f"cases/{_safe_name(spec.id)}.safetensors"
    path = root / rel
    try:
        st.save_file(tensors, path, metadata={"case": spec.id, "format": FORMAT_NAME}, overwrite=force)
    except st.SafetensorsError as e:
        raise BundleError(str(e)) from e
    return _case_entry(built, tensors, rel, st.file_sha256(path), stats)


def _safe_name(case_id: str) -> str:
    ok = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in case_id)
    if not ok or ok.startswith("."):
        raise BundleError(f"case id {case_id!r} cannot name a file")
    return ok


# ----------------------------------------------------------------------------------------------
# loading
# ----------------------------------------------------------------------------------------------

@dataclass
class CaseData:
    """One case of a loaded bundle: its manifest entry and verified tensors."""

    entry: dict[str, Any]
    tensors: dict[str, Any]

    @property
    def id(self) -> str:
        return str(self.entry["id"])

    def inputs(self) -> dict[str, Any]:
        return {k[len("input."):]: v for k, v in self.tensors.items() if k.startswith("input.")}

    def golden(self) -> dict[str, Any]:
        return {k[len("golden."):]: v for k, v in self.tensors.items() if k.startswith("golden.")}

    @property
    def args(self) -> list[ArgRef]:
        return [ArgRef.from_json(a) for a in self.entry["args"]]

    @property
    def kwargs(self) -> dict[str, ArgRef]:
        return {k: ArgRef.from_json(v) for k, v in self.entry["kwargs"].items()}


class Bundle:
    """A bundle directory with its manifest; cases are loaded (and verified) on demand."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        path = self.root / MANIFEST_NAME
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as e:
            raise BundleError(f"{path}: cannot read the manifest: {e}") from e
        try:
            self.manifest = json.loads(text)
        except json.JSONDecodeError as e:
            raise BundleError(f"{path}: not valid JSON: {e}") from e
        if not isinstance(self.manifest, dict) or self.manifest.get("format") != FORMAT_NAME:
            raise BundleError(f"{path}: not a deepgemm-ref golden manifest")
        if self.manifest.get("version") != MANIFEST_VERSION:
            raise BundleError(f"{path}: manifest version {self.manifest.get('version')!r} is not supported "
                              f"(this deepgemm_ref reads version {MANIFEST_VERSION})")
        if self.manifest.get(MANIFEST_HASH_KEY) != manifest_digest(self.manifest):
            raise BundleError(f"{path}: the manifest's sha256 does not match its contents (edited or "
                              "corrupted); regenerate the bundle")
        cases = self.manifest.get("cases", [])
        self.cases = {c["id"]: c for c in cases}
        if len(self.cases) != len(cases):
            raise BundleError(f"{path}: duplicate case ids")

    def case(self, case_id: str) -> CaseData:
        if case_id not in self.cases:
            raise BundleError(f"{self.root}: no case {case_id!r}")
        entry = self.cases[case_id]
        path = self.root / entry["file"]
        if not path.exists():
            raise BundleError(f"{path}: missing (case {case_id!r})")
        if st.file_sha256(path) != entry["file_sha256"]:
            raise BundleError(f"{path}: sha256 differs from the manifest (altered or corrupted)")
        try:
            tensors = st.load_file(path)
        except st.SafetensorsError as e:
            raise BundleError(str(e)) from e
        want = entry["tensors"]
        if set(tensors) != set(want):
            raise BundleError(f"{path}: tensors {sorted(set(tensors) ^ set(want))} missing or unexpected")
        for name, meta in want.items():
            if st.tensor_sha256(tensors[name]) != meta["sha256"]:
                raise BundleError(f"{path}: tensor {name!r} does not match its sha256")
        return CaseData(entry, tensors)

    def __iter__(self) -> Any:
        for case_id in self.cases:
            yield self.case(case_id)


def load_bundle(root: str | os.PathLike[str]) -> Bundle:
    """Open a bundle (the manifest is validated now, each case's tensors when it is loaded)."""
    return Bundle(root)


def verify(root: str | os.PathLike[str], *, regenerate: bool = False) -> dict[str, Any]:
    """Check every hash; with ``regenerate`` rebuild each case and compare the bytes.

    Returns {"cases": n, "ok": bool, "problems": [str]}.
    """
    b = load_bundle(root)
    problems: list[str] = []
    for case_id in b.cases:
        try:
            data = b.case(case_id)
        except BundleError as e:
            problems.append(str(e))
            continue
        if regenerate:
            spec = CaseSpec.from_dict(data.entry["spec"])
            built = build_case(spec)
            golden, _ = compute_golden(built)
            fresh = {f"input.{k}": v for k, v in built.inputs.items()}
            fresh.update({f"golden.{k}": v for k, v in golden.items()})
            for name, meta in data.entry["tensors"].items():
                if name not in fresh:
                    problems.append(f"case {case_id!r}: regenerated case lacks {name!r}")
                elif st.tensor_sha256(fresh[name]) != meta["sha256"]:
                    problems.append(f"case {case_id!r}: regenerated {name!r} differs from the stored bytes")
            for name in set(fresh) - set(data.entry["tensors"]):
                problems.append(f"case {case_id!r}: regenerated case has an extra tensor {name!r}")
    return {"cases": len(b.cases), "ok": not problems, "problems": problems}


_ = sys
