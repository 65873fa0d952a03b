"""The golden bundle format: the manifest, its validation, and case files confined to the bundle.

A bundle is a directory::

    BUNDLE/manifest.json              what every case is and how to call it (JSON, versioned)
    BUNDLE/cases/<case id>.safetensors  the case's inputs ("input.<name>") and goldens ("golden.<name>")

Inputs are stored contiguous in the dtypes the kernel API takes (BF16, F8_E4M3, int8 packed FP4,
float32 or packed UE8M0 scales in user form).  Goldens: ``golden.<output>`` in the output dtype,
``golden.acc`` (float64 accumulator), ``golden.acc_lo`` (its low part, float32 outputs),
``golden.S`` (float64 error scale, rounded up) and ``golden.defined`` (bool mask).  The manifest
records the call, the transforms, the checker parameters, the numerics policies, the seed and
generator, each case's resolved keys and real shape, package versions, BLAS thread settings and
the sha256 of every tensor and file, and ``manifest_sha256``, the sha256 of its own canonical
JSON (an edited manifest is refused).  A manifest whose generation did not finish lists the
missing case ids under ``incomplete``.

The manifest hash is a checksum anyone can recompute, so nothing relies on it for safety: on load
every field is checked by type and against the others (:func:`validate_manifest`, errors name the
field), every function a case names must be one its family registered, each case's file is
``cases/<file name of its id>`` (no other path), read without following symlinks, and checked
against its size limit, its sha256 and every tensor's sha256.  Files are written atomically
(temporary file, then rename).  No pickle anywhere.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import platform
import stat
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import ml_dtypes
import numpy as np

from .._version import __version__
from ..config import get_numerics
from ..errors import DGArgumentError
from ..profiles import PROFILES
from . import safetensors as st
from .cases import FAMILIES, ArgRef, BuiltCase, SpecError, case_file_name, family_of
from .reading import open_regular, read_bounded, strict_json
from .resources import ResourceError, default_memory_limit, format_size

__all__ = ["MANIFEST_NAME", "MANIFEST_VERSION", "MANIFEST_HASH_KEY", "FORMAT_NAME", "manifest_digest",
           "BundleError", "Bundle", "CaseData", "load_bundle", "validate_manifest", "case_relpath",
           "check_file_names", "atomic_write_text", "write_manifest", "new_manifest", "case_entry",
           "tensor_entry", "open_confined", "CASES_DIR"]

MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 2  # 2: the manifest carries the sha256 of its own contents
MANIFEST_HASH_KEY = "manifest_sha256"
FORMAT_NAME = "deepgemm-ref-golden"
CASES_DIR = "cases"
#: The largest manifest read (a bundle of 100 000 cases is about 200 MiB).
MAX_MANIFEST_BYTES = 512 << 20
_HEX = frozenset("0123456789abcdef")
_CHECK_CMODES = ("kernel", "fused", "rounded")
#: Output dtypes a manifest may name (numpy names) -> safetensors dtype strings.
OUTPUT_DTYPES = {"bfloat16": "BF16", "float32": "F32", "float64": "F64", "float8_e4m3fn": "F8_E4M3",
                 "int32": "I32", "int16": "I16", "int8": "I8", "int64": "I64", "uint8": "U8", "bool": "BOOL"}


class BundleError(DGArgumentError):
    """A bundle that cannot be read, is incomplete, altered, or of an unknown version."""


def manifest_digest(manifest: dict[str, Any]) -> str:
    """sha256 of the manifest's canonical JSON (sorted keys, no whitespace), without its own hash
    field: any edit of a case's call, bounds or hashes changes it."""
    body = {k: v for k, v in manifest.items() if k != MANIFEST_HASH_KEY}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def case_relpath(case_id: str) -> str:
    """The one path a case's file may have inside its bundle."""
    return f"{CASES_DIR}/{case_file_name(case_id)}.safetensors"


def check_file_names(ids: list[str]) -> dict[str, str]:
    """Case id -> relative file path; two ids with one file name (ignoring case, as macOS and
    Windows file systems do) are refused before anything is written."""
    paths: dict[str, str] = {}
    seen: dict[str, str] = {}
    for case_id in ids:
        rel = case_relpath(case_id)
        key = rel.casefold()
        if key in seen:
            raise BundleError(f"case ids {seen[key]!r} and {case_id!r} map to one file name ({rel}); rename one")
        seen[key] = case_id
        paths[case_id] = rel
    return paths


# ----------------------------------------------------------------------------------------------
# writing
# ----------------------------------------------------------------------------------------------

def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same directory and a rename
    (the umask's mode; a temporary name within the file-name limit; errors name ``path``)."""
    from .paths import atomic_write_text as write

    write(path, text)


# The BLAS thread settings of this process as it started (dask.distributed rewrites them in the
# client process; --jobs sets them for its workers): every golden is exact, so they cannot change
# a byte of a bundle; they are recorded for the record.
_BLAS_ENV = {k: os.environ[k] for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                        "DEEPGEMM_REF_NUM_THREADS") if k in os.environ}


def _environment() -> dict[str, Any]:
    return {
        "deepgemm_ref": __version__,
        "numpy": np.__version__,
        "ml_dtypes": ml_dtypes.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "blas_thread_env": dict(_BLAS_ENV),
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
        "output_init": "zeros (or c for c-is-d cases)",
    }


def tensor_entry(x: Any) -> dict[str, Any]:
    """A tensor's manifest record: safetensors dtype, logical shape and sha256."""
    if isinstance(x, st.PackedFP4):
        return tensor_record(st.F4, x.shape, st.tensor_sha256(x))
    arr = np.asarray(x)
    return tensor_record(st.NUMPY_TO_SAFETENSORS[arr.dtype], arr.shape, st.tensor_sha256(arr))


def tensor_record(dtype: str, shape: Iterable[int], sha256: str) -> dict[str, Any]:
    """The manifest record of a tensor of safetensors ``dtype`` and ``shape`` whose
    :func:`.safetensors.tensor_sha256` is ``sha256`` (:func:`tensor_entry` of a tensor held whole)."""
    return {"dtype": dtype, "shape": [int(n) for n in shape], "sha256": sha256}


def case_entry(built: BuiltCase, tensors: Mapping[str, Any], file_sha: str, stats: Mapping[str, Any], *,
               entries: Mapping[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """A generated case's manifest record (``entries``: tensors' records made already, see
    :func:`tensor_entry`, beside those of ``tensors``)."""
    spec = built.spec
    records = {k: tensor_entry(v) for k, v in tensors.items()}
    records.update(entries or {})
    return {
        "id": spec.id,
        "spec": spec.to_dict(),
        "params": spec.resolved.as_dict(),
        "shape": spec.shape(),
        "kernel": spec.kernel,
        "profile": spec.profile,
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
        "seed": spec.seed,
        "generator": "numpy PCG64(SeedSequence(seed, spawn_key=(crc32(case id),)))",
        "file": case_relpath(spec.id),
        "file_sha256": file_sha,
        "tensors": dict(sorted(records.items())),
        "golden_stats": dict(stats),
    }


def new_manifest(entries: list[dict[str, Any]], missing: list[str]) -> dict[str, Any]:
    """The manifest of ``entries`` (in order); ``missing`` ids are listed as ``incomplete``."""
    manifest: dict[str, Any] = {
        "format": FORMAT_NAME,
        "version": MANIFEST_VERSION,
        "created_by": _environment(),
        "numerics": _numerics_record(),
        "cases": entries,
    }
    if missing:
        manifest["incomplete"] = list(missing)
    manifest[MANIFEST_HASH_KEY] = manifest_digest(manifest)
    return manifest


def write_manifest(root: Path, manifest: dict[str, Any]) -> None:
    atomic_write_text(root / MANIFEST_NAME, json.dumps(manifest, indent=1, sort_keys=True) + "\n")


# ----------------------------------------------------------------------------------------------
# validation
# ----------------------------------------------------------------------------------------------

class _Invalid(Exception):
    """One field of a manifest is wrong (``field``: its dotted path; ``problem``: what)."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(field, problem)
        self.field = field
        self.problem = problem


def _short(v: Any) -> str:
    text = json.dumps(v, default=str) if isinstance(v, (dict, list, str, int, float, bool)) or v is None else repr(v)
    return text if len(text) <= 80 else text[:77] + "..."


def _member(v: Any, collection: Any) -> bool:
    """``v in collection`` for a string ``v`` (a forged value may be unhashable)."""
    return isinstance(v, str) and v in collection


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _need(cond: bool, field: str, expected: str, got: Any) -> None:
    if not cond:
        raise _Invalid(field, f"expected {expected}; got {_short(got)}")


def _table(d: Any, field: str) -> dict[str, Any]:
    _need(isinstance(d, dict), field, "a table", d)
    out: dict[str, Any] = d
    return out


def _str(d: Mapping[str, Any], key: str, field: str) -> str:
    v = d.get(key)
    _need(isinstance(v, str), f"{field}{key}", "a string", v)
    return str(v)


def _hex64(v: Any, field: str) -> None:
    _need(isinstance(v, str) and len(v) == 64 and set(v) <= _HEX, field, "a sha256 (64 lower-case hex digits)", v)


def _shape(v: Any, field: str) -> list[int]:
    _need(isinstance(v, list) and len(v) <= 8 and all(_is_int(s) and 0 <= s < 2**62 for s in v), field,
          "a list of at most 8 non-negative integers", v)
    out: list[int] = v
    return out


def _argref(v: Any, field: str, tensors: set[str], outputs: Mapping[str, Any]) -> ArgRef:
    try:
        ref = ArgRef.from_json(v)
    except DGArgumentError:
        raise _Invalid(field, f"expected an argument reference ({{'tensor': name}}, {{'pair': [name, name or "
                              f"null]}}, {{'output': name}} or {{'value': v}}); got {_short(v)}") from None
    if ref.kind in ("tensor", "pair"):
        for name in ref.names:
            _need(name is None or name in tensors, field, f"a tensor of the case ({', '.join(sorted(tensors))})",
                  name)
    elif ref.kind == "output":
        _need(ref.names[0] in outputs, field, f"an output of the case ({', '.join(outputs)})", ref.names[0])
    else:
        _value(ref.value, field)
    return ref


def _value(v: Any, field: str, depth: int = 0) -> None:
    if v is None or isinstance(v, (bool, str)):
        _need(not isinstance(v, str) or len(v) <= 256, field, "a string of at most 256 characters", v)
        return
    if isinstance(v, int):
        return
    if isinstance(v, float):
        _need(math.isfinite(v), field, "a finite number", v)
        return
    _need(isinstance(v, list) and depth == 0, field, "a number, string, bool, null or a flat list of them", v)
    for i, x in enumerate(v):
        _value(x, f"{field}[{i}]", depth + 1)


def _ints_in(v: Any) -> Iterator[int]:
    if isinstance(v, bool):
        return
    if isinstance(v, int):
        yield v
    elif isinstance(v, list):
        yield len(v)
        for x in v:
            yield from _ints_in(x)
    elif isinstance(v, dict):
        for x in v.values():
            yield from _ints_in(x)


def _call(v: Any, field: str, family: Any, tensors: set[str], outputs: Mapping[str, Any], derived: bool) -> None:
    c = _table(v, field)
    allowed = {"function", "args", "kwargs"} | ({"name"} if derived else set())
    extra = set(c) - allowed
    _need(not extra, field, f"only the keys {sorted(allowed)}", sorted(extra))
    fn = _str(c, "function", f"{field}.")
    _need(family.allows(fn), f"{field}.function", f"a function of the {family.name} family "
                                                  f"({', '.join(sorted(family.functions)) or 'none'})", fn)
    args = c.get("args", [])
    _need(isinstance(args, list), f"{field}.args", "a list", args)
    for i, a in enumerate(args):
        _argref(a, f"{field}.args[{i}]", tensors, outputs)
    kwargs = _table(c.get("kwargs", {}), f"{field}.kwargs")
    for k, a in kwargs.items():
        _argref(a, f"{field}.kwargs.{k}", tensors, outputs)
    if derived:
        name = _str(c, "name", f"{field}.")
        _need(name.isidentifier(), f"{field}.name", "a name", name)


def _validate_case(c: Any, i: int) -> str:
    """Check one case entry; returns its id (raises _Invalid)."""
    f = f"cases[{i}]."
    c = _table(c, f"cases[{i}]")
    case_id = _str(c, "id", f)
    try:
        rel = case_relpath(case_id)
    except SpecError:
        raise _Invalid(f + "id", f"expected an id that names a file; got {_short(case_id)}") from None
    spec = _table(c.get("spec"), f + "spec")
    for key in ("id", "kernel", "profile"):
        _need(spec.get(key) == c.get(key), f"{f}spec.{key}", f"the case's {key} {_short(c.get(key))}", spec.get(key))
    kernel = _str(c, "kernel", f)
    profile = _str(c, "profile", f)
    _need(profile in PROFILES, f + "profile", f"one of {', '.join(PROFILES)}", profile)
    fam_name = spec.get("family")
    if fam_name is None:
        try:
            fam_name = family_of(kernel)
        except SpecError:
            raise _Invalid(f + "kernel", f"a kernel of a registered family; got {_short(kernel)}") from None
    _need(isinstance(fam_name, str) and fam_name in FAMILIES, f + "spec.family", "a registered family", fam_name)
    family = FAMILIES[fam_name]
    _need(not family.kernels or kernel in family.kernels, f + "kernel", f"a kernel of the {fam_name} family", kernel)
    fn = _str(c, "function", f)
    _need(fn in family.kernels or (not family.kernels and family.allows(fn)), f + "function",
          f"a kernel of the {fam_name} family", fn)
    _need(c.get("file") == rel, f + "file", f"{rel!r} (a case's file is named after its id)", c.get("file"))
    _hex64(c.get("file_sha256"), f + "file_sha256")
    _need(_is_int(c.get("seed")) and c["seed"] >= 0, f + "seed", "a non-negative integer", c.get("seed"))
    tensors_meta = _table(c.get("tensors"), f + "tensors")
    _need(0 < len(tensors_meta) <= 100000, f + "tensors", "1 to 100000 tensors", len(tensors_meta))
    dims: list[int] = []
    for name, meta in tensors_meta.items():
        tf = f"{f}tensors.{name}"
        _need(isinstance(name, str) and 0 < len(name) <= 200 and "/" not in name, tf, "a tensor name", name)
        meta = _table(meta, tf)
        _need(set(meta) == {"dtype", "shape", "sha256"}, tf, "the keys dtype, shape, sha256", sorted(meta))
        _need(_member(meta["dtype"], st.SAFETENSORS_DTYPES), tf + ".dtype", "a safetensors dtype", meta["dtype"])
        dims += _shape(meta["shape"], tf + ".shape")
        _hex64(meta["sha256"], tf + ".sha256")
    inputs = {n[len("input."):] for n in tensors_meta if n.startswith("input.")}
    outputs = _table(c.get("outputs"), f + "outputs")
    _need(0 < len(outputs) <= 64, f + "outputs", "1 to 64 outputs", len(outputs))
    for name, o in outputs.items():
        of = f"{f}outputs.{name}"
        _need(isinstance(name, str) and name.isidentifier(), of, "an output name", name)
        o = _table(o, of)
        _need(set(o) == {"init", "shape", "dtype"}, of, "the keys init, shape, dtype", sorted(o))
        _need(_member(o["dtype"], OUTPUT_DTYPES), of + ".dtype", f"one of {', '.join(OUTPUT_DTYPES)}", o["dtype"])
        shape = _shape(o["shape"], of + ".shape")
        _need(f"golden.{name}" in tensors_meta, f"{f}tensors", f"a golden.{name} tensor for output {name!r}",
              sorted(tensors_meta))
        g = tensors_meta[f"golden.{name}"]
        _need(g["shape"] == shape and g["dtype"] == OUTPUT_DTYPES[o["dtype"]], of,
              f"the shape and dtype of golden.{name} ({g['shape']}, {g['dtype']})", o)
        init = o["init"]
        _need(isinstance(init, str) and (init in ("zeros", "nan", "returned") or init in inputs), of + ".init",
              "'zeros', 'nan', 'returned' or an input tensor name", init)
        if init in inputs:
            src = tensors_meta[f"input.{init}"]
            _need(src["shape"] == shape and src["dtype"] == g["dtype"], of + ".init",
                  f"an input of the output's shape and dtype ({shape}, {g['dtype']})", init)
        for key in ("acc", "S"):
            e = tensors_meta.get(f"golden.extra.{name}.{key}")
            _need(e is None or e["shape"] == shape, f"{f}tensors.golden.extra.{name}.{key}", f"shape {shape}",
                  e and e["shape"])
    main = _str(c, "main_output", f)
    _need(main in outputs, f + "main_output", f"an output ({', '.join(outputs)})", main)
    for key in ("acc", "acc_lo", "S", "S_hard", "defined"):
        t = tensors_meta.get(f"golden.{key}")
        _need(t is None or t["shape"] == outputs[main]["shape"], f"{f}tensors.golden.{key}.shape",
              f"the main output's shape {outputs[main]['shape']}", t and t["shape"])
    ret = c.get("returns")
    _need(ret is None or (_member(ret, outputs) and outputs[ret]["init"] == "returned"), f + "returns",
          "null or an output with init 'returned'", ret)
    derived_names: set[str] = set()
    for key, is_derived in (("setup", False), ("derived", True)):
        calls = c.get(key) or []
        _need(isinstance(calls, list) and len(calls) <= 16, f + key, "a list of at most 16 calls", calls)
        for j, call in enumerate(calls):
            _call(call, f"{f}{key}[{j}]", family, inputs | derived_names, outputs, is_derived)
            if is_derived:
                derived_names.add(call["name"])
    names = inputs | derived_names
    args = c.get("args")
    _need(isinstance(args, list) and len(args) <= 64, f + "args", "a list of argument references", args)
    for j, a in enumerate(args):
        _argref(a, f"{f}args[{j}]", names, outputs)
    kwargs = _table(c.get("kwargs"), f + "kwargs")
    for k, a in kwargs.items():
        _need(k.isidentifier(), f"{f}kwargs", "keyword names", k)
        _argref(a, f"{f}kwargs.{k}", names, outputs)
    transforms = _table(c.get("transforms"), f + "transforms")
    for name, t in transforms.items():
        tf = f"{f}transforms.{name}"
        _need(name in inputs, tf, "a transform of an input tensor", name)
        t = _table(t, tf)
        _need(set(t) <= {"function", "kwargs", "profile", "transpose_back"}, tf,
              "the keys function, kwargs, profile, transpose_back", sorted(t))
        fn = _str(t, "function", tf + ".")
        _need(family.allows(fn), tf + ".function", f"a function of the {fam_name} family", fn)
        kw = _table(t.get("kwargs", {}), tf + ".kwargs")
        for k, v in kw.items():
            _need(k.isidentifier(), tf + ".kwargs", "keyword names", k)
            _value(v, f"{tf}.kwargs.{k}")
        _need(isinstance(t.get("transpose_back", False), bool), tf + ".transpose_back", "true or false",
              t.get("transpose_back"))
    driver = c.get("driver")
    _need(driver is None or (isinstance(driver, dict) and driver.get("name") == fam_name and family.driver is not None),
          f + "driver", "null or the family's driver", driver)
    if driver is not None:
        for k, v in driver.items():
            _value(v, f"{f}driver.{k}")
    check = _table(c.get("check"), f + "check")
    _need(_is_int(check.get("n")) and check["n"] >= 1, f + "check.n", "an integer >= 1", check.get("n"))
    _need(_is_int(check.get("c_epi", 0)) and 0 <= check.get("c_epi", 0) <= 4, f + "check.c_epi",
          "an integer in [0, 4]", check.get("c_epi"))
    u = check.get("u_acc")
    _need(u is None or (isinstance(u, (int, float)) and not isinstance(u, bool) and 0 < u < 1), f + "check.u_acc",
          "a unit roundoff in (0, 1)", u)
    ep = _table(check.get("epilogue"), f + "check.epilogue")
    _need(ep.get("out") in ("bf16", "f32"), f + "check.epilogue.out", "'bf16' or 'f32'", ep.get("out"))
    alpha = ep.get("alpha")
    _need(alpha is None or (isinstance(alpha, (int, float)) and not isinstance(alpha, bool)
                            and math.isfinite(alpha)), f + "check.epilogue.alpha", "a finite number or null", alpha)
    cname = ep.get("c")
    _need(cname is None or (_member(cname, inputs)
                            and tensors_meta[f"input.{cname}"]["shape"] == outputs[main]["shape"]),
          f + "check.epilogue.c", "null or an input of the main output's shape", cname)
    _need(ep.get("c_mode", "kernel") in _CHECK_CMODES, f + "check.epilogue.c_mode",
          f"one of {', '.join(_CHECK_CMODES)}", ep.get("c_mode"))
    _table(c.get("golden_stats", {}), f + "golden_stats")
    for key in ("shape", "params"):
        if key in c:
            _table(c[key], f + key)
    # A resource guard independent of the kernels: no integer the call passes (sizes, lengths,
    # list lengths) may exceed twice the case's largest stored dimension (or 1024).  A driver's
    # sizes are checked against the tensors by its family (check_entry).
    bound = 2 * max([512] + dims + [s for o in outputs.values() for s in o["shape"]])
    for key in ("args", "kwargs", "setup", "derived", "transforms"):
        for v in _ints_in(c.get(key)):
            _need(abs(v) <= bound, f + key, f"integers of magnitude <= {bound} (twice the case's largest "
                  "dimension)", v)
    if family.check_entry is not None:
        problem = family.check_entry(c)
        if problem:
            raise _Invalid(f + "driver" if c.get("driver") else f + "args", problem)
    return case_id


def validate_manifest(m: Any, where: str) -> None:
    """Check a parsed manifest field by field (raises :class:`BundleError` naming the field)."""
    try:
        m = _table(m, "manifest")
        _need(m.get("format") == FORMAT_NAME, "format", repr(FORMAT_NAME), m.get("format"))
        if m.get("version") != MANIFEST_VERSION or not _is_int(m.get("version")):
            raise BundleError(f"{where}: manifest version {m.get('version')!r} is not supported "
                              f"(this deepgemm_ref reads version {MANIFEST_VERSION})")
        _hex64(m.get(MANIFEST_HASH_KEY), MANIFEST_HASH_KEY)
        if m[MANIFEST_HASH_KEY] != manifest_digest(m):
            raise BundleError(f"{where}: the manifest's sha256 does not match its contents (edited or "
                              "corrupted); regenerate the bundle")
        allowed = {"format", "version", "created_by", "numerics", "cases", "incomplete", MANIFEST_HASH_KEY}
        extra = set(m) - allowed
        _need(not extra, "manifest", f"only the fields {sorted(allowed)}", sorted(extra))
        _table(m.get("created_by"), "created_by")
        _table(m.get("numerics"), "numerics")
        cases = m.get("cases")
        _need(isinstance(cases, list), "cases", "a list of cases", cases)
        ids: list[str] = []
        for i, c in enumerate(cases):
            try:
                ids.append(_validate_case(c, i))
            except _Invalid as e:
                cid = c.get("id") if isinstance(c, dict) and isinstance(c.get("id"), str) else None
                if cid is None:
                    raise
                raise BundleError(f"{where}: case {cid!r}: field {e.field!r}: {e.problem}") from None
        if len(set(ids)) != len(ids):
            raise BundleError(f"{where}: duplicate case ids {sorted({i for i in ids if ids.count(i) > 1})}")
        check_file_names(ids)
        inc = m.get("incomplete", [])
        _need(isinstance(inc, list) and all(isinstance(x, str) for x in inc) and len(set(inc)) == len(inc)
              and not set(inc) & set(ids), "incomplete", "a list of distinct case ids not among the cases", inc)
    except _Invalid as e:
        raise BundleError(f"{where}: field {e.field!r}: {e.problem}") from None


# ----------------------------------------------------------------------------------------------
# reading, confined to the bundle
# ----------------------------------------------------------------------------------------------

def open_confined(root: Path, rel: str, what: str) -> BinaryIO:
    """Open ``root/rel`` for reading: a regular file, reached without any symlink below ``root``."""
    path = root / rel
    parent = root
    for part in Path(rel).parts[:-1]:
        parent = parent / part
        try:
            st_parent = os.lstat(parent)
        except OSError as e:
            raise BundleError(f"{parent}: cannot read the {what}'s directory: {e.strerror}") from None
        if stat.S_ISLNK(st_parent.st_mode) or not stat.S_ISDIR(st_parent.st_mode):
            raise BundleError(f"{parent}: is a symlink or not a directory (refused: bundle files stay in the bundle)")
    try:
        st_file = os.lstat(path)
    except OSError as e:
        if e.errno == errno.ENOENT:
            raise BundleError(f"{path}: missing ({what})") from None
        raise BundleError(f"{path}: cannot read the {what}: {e.strerror}") from None
    if stat.S_ISLNK(st_file.st_mode):
        raise BundleError(f"{path}: is a symlink (refused: bundle files stay in the bundle)")
    # the rest as for any file read (a FIFO or device in a file's place refused, never blocking)
    return open_regular(path, what, error=BundleError, follow=False)


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
    """A bundle directory with its validated manifest; cases are loaded (and verified) on demand.

    max_memory: the largest case file read (default: the machine's memory limit).
    """

    def __init__(self, root: str | os.PathLike[str], *, max_memory: int | None = None) -> None:
        self.root = Path(root)
        self.max_memory = default_memory_limit() if max_memory is None else max_memory
        path = self.root / MANIFEST_NAME
        if not self.root.is_dir():
            raise BundleError(f"{self.root}: not a bundle directory (missing or not a directory)")
        with open_confined(self.root, MANIFEST_NAME, "manifest") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_MANIFEST_BYTES:
                raise BundleError(f"{path}: {format_size(size)}; a manifest is at most "
                                  f"{format_size(MAX_MANIFEST_BYTES)}")
            raw = read_bounded(f, MAX_MANIFEST_BYTES)  # a file that grows while read is refused too
            if len(raw) > MAX_MANIFEST_BYTES:
                raise BundleError(f"{path}: grew past {format_size(MAX_MANIFEST_BYTES)} while being read")
        try:
            self.manifest = strict_json(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise BundleError(f"{path}: not UTF-8 text: {e}") from None
        except ValueError as e:
            raise BundleError(f"{path}: not valid JSON: {e}") from None
        if not isinstance(self.manifest, dict) or self.manifest.get("format") != FORMAT_NAME:
            raise BundleError(f"{path}: not a deepgemm-ref golden manifest")
        validate_manifest(self.manifest, str(path))
        self.cases: dict[str, dict[str, Any]] = {c["id"]: c for c in self.manifest["cases"]}
        self.incomplete: list[str] = list(self.manifest.get("incomplete", []))

    def case(self, case_id: str) -> CaseData:
        """The case's entry and tensors, verified (its file is read whole: at most ``max_memory``)."""
        entry, where = self._entry(case_id)
        with open_confined(self.root, entry["file"], f"case {case_id!r}") as f:
            size = os.fstat(f.fileno()).st_size
            if size > self.max_memory:
                raise ResourceError(f"{where}: {format_size(size)}, over the memory limit "
                                    f"{format_size(self.max_memory)}"
                                    " (--max-memory)")
            self._check_file(f, entry, where)
            try:
                tensors = st.load_fileobj(f, where)
            except st.SafetensorsError as e:
                raise BundleError(str(e)) from None
        self._check_digests({k: st.tensor_sha256(v) for k, v in tensors.items()}, entry, where)
        return CaseData(entry, tensors)

    def verify_case(self, case_id: str) -> None:
        """Verify the case's file as :meth:`case` does (its sha256, its header, every tensor's
        sha256), reading it in chunks: a file of any size, in bounded memory."""
        entry, where = self._entry(case_id)
        with open_confined(self.root, entry["file"], f"case {case_id!r}") as f:
            # a size its tensors cannot have is refused before a byte is read (a sparse 1 TiB file)
            size = os.fstat(f.fileno()).st_size
            try:
                sizes = {k: (t["dtype"], tuple(t["shape"])) for k, t in entry["tensors"].items()}
                low, high = st.file_size_range(sizes)
            except (st.SafetensorsError, KeyError, TypeError) as e:
                raise BundleError(f"{where}: the manifest's tensors cannot be sized: {e}") from None
            if not low <= size <= high:
                raise BundleError(f"{where}: {format_size(size)}, not the size of the tensors the manifest lists "
                                  f"({format_size(low - 8)} and a header): altered or corrupted")
            whole = hashlib.sha256()
            try:
                digests = st.digest_fileobj(f, where, whole)  # one pass: the file's digest too
            except st.SafetensorsError as e:
                f.seek(0)
                self._check_file(f, entry, where)  # an altered file is named as such first
                raise BundleError(str(e)) from None
            if f.read(1):  # pragma: no cover - the header's offsets end at the end of the file
                raise BundleError(f"{where}: bytes after the last tensor")
            if whole.hexdigest() != entry["file_sha256"]:
                raise BundleError(f"{where}: sha256 differs from the manifest (altered or corrupted)")
        self._check_digests(digests, entry, where)

    def _entry(self, case_id: str) -> tuple[dict[str, Any], str]:
        if case_id not in self.cases:
            raise BundleError(f"{self.root}: no case {case_id!r}")
        entry = self.cases[case_id]
        return entry, f"{self.root / entry['file']} (case {case_id!r})"

    @staticmethod
    def _check_file(f: BinaryIO, entry: Mapping[str, Any], where: str) -> None:
        """The file's sha256 against the manifest's; leaves ``f`` at its start."""
        if st.fileobj_sha256(f) != entry["file_sha256"]:
            raise BundleError(f"{where}: sha256 differs from the manifest (altered or corrupted)")
        f.seek(0)

    @staticmethod
    def _check_digests(digests: Mapping[str, str], entry: Mapping[str, Any], where: str) -> None:
        want = entry["tensors"]
        if set(digests) != set(want):
            raise BundleError(f"{where}: tensors {sorted(set(digests) ^ set(want))} missing or unexpected")
        for name, meta in want.items():
            if digests[name] != meta["sha256"]:
                raise BundleError(f"{where}: tensor {name!r} does not match its sha256")

    def __iter__(self) -> Iterator[CaseData]:
        for case_id in self.cases:
            yield self.case(case_id)


def load_bundle(root: str | os.PathLike[str], *, max_memory: int | None = None) -> Bundle:
    """Open a bundle (the manifest is validated now, each case's tensors when it is loaded)."""
    return Bundle(root, max_memory=max_memory)
