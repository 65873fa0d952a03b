"""Goldens (and device outputs) in the formats of Ascend's own tools, and device dumps read back.

``deepgemm-ref export BUNDLE --format msprobe|npy|bin --out DIR [--outputs OUTPUTS] [--case ID ...]``
(:func:`export`) writes one of three layouts; ``check`` and ``diagnose`` read the same layouts back
as ``--outputs`` (:func:`load_dump`, called by :func:`.check.load_outputs` for a directory).

**Names.**  A case id or an output name may hold any character; a path and an msprobe API name
may not.  :func:`encode_name` keeps ``A-Z a-z 0-9 _ . -`` and writes every other character as
``:`` followed by the two lowercase hex digits of each of its UTF-8 bytes (``/`` -> ``:2f``,
space -> ``:20``, ``:`` itself -> ``:3a``, ``é`` -> ``:c3:a9``); :func:`decode_name` reverses it.
The result uses only characters msprobe accepts in a path (``[A-Za-z0-9_.:/-]``) and never a
``/``, so each case is one directory.  Two ids that differ only in letter case already map to
one bundle file name and are refused by the bundle, so they never meet here.

**msprobe** (``--format msprobe``; needs torch): what msprobe's own PyTorch dump holds, so that
``msprobe compare --target_path DEVICE_DIR --golden_path GOLDEN_DIR --output_path R`` compares
the two::

    DIR/rank0/dump.json                                 {"task": "tensor", "level": "L1",
                                                         "framework": "pytorch", "dump_data_dir": ...,
                                                         "data": {API: {"input_args": [],
                                                                        "input_kwargs": {},
                                                                        "output": {OUT: {...}}}}}
    DIR/rank0/dump_tensor_data/API.output.OUT.pt        the tensor (torch.save)

(``dump_data_dir`` is written relative to ``DIR``, ``rank0/dump_tensor_data``, so the dump can be
moved; msprobe finds the tensors beside ``dump.json`` either way) with
``API = DeepGEMM.<kernel>.<encoded case id>.forward`` (msprobe skips names that end in
neither ``forward`` nor ``backward``) and ``OUT`` the encoded output name; each output's entry
is ``{"type": "torch.Tensor", "dtype": "torch.<dtype>", "shape": [...], "Max", "Min", "Mean",
"Norm", "requires_grad": false, "data_name": "API.output.OUT.pt"}``, the statistics computed in
float64 over the values as written (``Norm`` the L2 norm).  bf16 and FP8 outputs are written
as torch.bfloat16 / torch.float8_e4m3fn (torch has both); bundle outputs are never packed FP4
(a manifest's output dtypes have none), and a tensor torch has no dtype for is refused by name.
Without ``--outputs`` the goldens are written, with it the device outputs, under the same names.
Elements the kernel's contract leaves undefined (the bundle's ``defined`` mask: the main
output's ``golden.defined``, another output's ``golden.extra.<name>.defined`` where the bundle
has one) are written as the golden's value in both dumps, and as 0 where that value is not
finite, so msprobe compares only what the kernel defines.  msprobe compares element by element
in the stored order: a DeepEP dispatch output whose row order the device may choose (the
checker puts it into the canonical order first) is written as stored, and ``check`` stays the
authority on it.

**npy / bin** (CANN's golden files): every tensor of each case as ``DIR/<case>/<tensor>.npy``
(or ``.bin``: headerless, little-endian, C order, NumPy's ``tofile``), with the kernel's
outputs as ``<output>``, the inputs as ``input.<name>`` and the checker's tensors (``acc``,
``S``, ``defined``, ...) as ``golden.<name>``; NumPy's own dtypes are written as themselves,
bf16 / FP8 (E4M3, E5M2, UE8M0) as the unsigned integers of the same width holding their bit
patterns (uint16 / uint8), packed FP4 (``F4``) as its packed bytes (uint8, two codes a byte,
even element in the low nibble; bundles keep FP4 operands as the int8 bytes the kernel API
takes, written as int8).  Each tensor has a sidecar ``DIR/<case>/<tensor>.json``:
``{"name", "role": "output" | "input" | "golden", "dtype": <real dtype>, "shape": [...],
"file_dtype": <dtype of the file's elements>, "byte_order": "little", "order": "C", "nbytes"}``,
and each case a ``DIR/<case>/_case.json`` with the kernel call (the manifest's entry without
its hashes).  With ``--outputs`` only the outputs are written.  Bytes are written exactly as the
bundle or outputs file holds them (no ``defined`` substitution), so a round trip is byte for
byte.

Every layout has ``DIR/deepgemm-ref-export.json`` (format, bundle, cases).  The export is built
in a temporary sibling directory and renamed into place when complete; an existing ``DIR`` is
replaced only with ``force`` and only when it holds an earlier export (that marker file); the
output directory may not be, hold or lie inside the bundle or the outputs read.

**Reading back** (:func:`load_dump`): a directory holding ``rank0/dump.json`` (or
``dump.json`` itself) is read as an msprobe dump: APIs named ``DeepGEMM.<kernel>.<case>.forward``
(other APIs are skipped, a ``DeepGEMM.`` name of another shape is refused), each output's
``.pt`` file read with ``torch.load(weights_only=True)`` from ``dump_tensor_data`` (a plain file
name; no path, no symlink).  Any other directory is read as the npy / bin layout: every
``<case>/<name>.npy`` or ``<case>/<name>.bin`` whose sidecar's role is ``output`` (a ``.npy``
without a sidecar counts as an output of its own dtype; a ``.bin`` needs its sidecar), ``.npy``
files read with ``allow_pickle=False``.  Every file is opened without following symlinks,
checked to be a regular file, and its size checked against the dtype and shape it claims
before it is read; a file that does not fit is refused naming it.  The result maps
``<case id>/<output>`` to arrays, as a safetensors outputs file does.
"""

from __future__ import annotations

import io
import json
import math
import os
import shutil
import stat
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import ml_dtypes
import numpy as np

from .._version import __version__
from . import safetensors as st
from .bundle import Bundle, BundleError, load_bundle, open_confined
from .paths import temp_path
from .reading import strict_json
from .resources import default_memory_limit, format_size

__all__ = ["FORMATS", "API_PREFIX", "MARKER", "encode_name", "decode_name", "api_name", "parse_api_name",
           "export", "load_dump", "read_outputs", "is_msprobe_dump", "DumpOutputs"]

#: The export formats.
FORMATS = ("msprobe", "npy", "bin")
#: The first part of every msprobe API name this package writes.
API_PREFIX = "DeepGEMM"
#: The file that marks a directory as an export (and lets ``force`` replace it).
MARKER = "deepgemm-ref-export.json"
#: The per-case file with the kernel call (npy / bin layouts).
CASE_FILE = "_case.json"
#: The largest JSON file (sidecar, dump.json, _case.json) read back.
MAX_JSON_BYTES = 64 << 20
_KEEP = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")
_HEXDIGITS = frozenset("0123456789abcdef")

#: numpy dtype name -> (safetensors name, file dtype of the npy / bin layouts, torch dtype name or None).
_DTYPES: dict[str, tuple[str, np.dtype[Any], str | None]] = {
    "float64": ("F64", np.dtype("<f8"), "float64"),
    "float32": ("F32", np.dtype("<f4"), "float32"),
    "float16": ("F16", np.dtype("<f2"), "float16"),
    "bfloat16": ("BF16", np.dtype("<u2"), "bfloat16"),
    "float8_e4m3fn": ("F8_E4M3", np.dtype("u1"), "float8_e4m3fn"),
    "float8_e5m2": ("F8_E5M2", np.dtype("u1"), "float8_e5m2"),
    "float8_e8m0fnu": ("F8_E8M0", np.dtype("u1"), "float8_e8m0fnu"),
    "int8": ("I8", np.dtype("i1"), "int8"),
    "uint8": ("U8", np.dtype("u1"), "uint8"),
    "int16": ("I16", np.dtype("<i2"), "int16"),
    "uint16": ("U16", np.dtype("<u2"), "uint16"),
    "int32": ("I32", np.dtype("<i4"), "int32"),
    "uint32": ("U32", np.dtype("<u4"), "uint32"),
    "int64": ("I64", np.dtype("<i8"), "int64"),
    "uint64": ("U64", np.dtype("<u8"), "uint64"),
    "bool": ("BOOL", np.dtype("?"), "bool"),
}
#: The sidecar dtype of packed FP4 (its file holds the packed bytes, uint8, storage shape (..., n/2)).
FP4_DTYPE = "float4_e2m1fn_x2"


def _real_dtype(name: str) -> np.dtype[Any]:
    return np.dtype(getattr(ml_dtypes, name)) if name in ("bfloat16", "float8_e4m3fn", "float8_e5m2",
                                                          "float8_e8m0fnu") else np.dtype(name)


# ----------------------------------------------------------------------------------------------
# names
# ----------------------------------------------------------------------------------------------

def encode_name(name: str) -> str:
    """``name`` with every character outside ``A-Z a-z 0-9 _ . -`` written as ``:`` and the two
    lowercase hex digits of each of its UTF-8 bytes (reversible: :func:`decode_name`)."""
    return "".join(ch if ch in _KEEP else "".join(f":{b:02x}" for b in ch.encode("utf-8")) for ch in name)


def decode_name(text: str) -> str:
    """The name :func:`encode_name` encoded as ``text`` (a ``ValueError`` for text it cannot have written)."""
    out = bytearray()
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == ":":
            hx = text[i + 1:i + 3]
            if len(hx) != 2 or not set(hx) <= _HEXDIGITS:
                raise ValueError(f"{text!r}: ':' must be followed by two lowercase hex digits")
            out.append(int(hx, 16))
            i += 3
        elif ch in _KEEP:
            out += ch.encode("ascii")
            i += 1
        else:
            raise ValueError(f"{text!r}: the character {ch!r} is never written unescaped")
    name = out.decode("utf-8")  # UnicodeDecodeError is a ValueError
    if encode_name(name) != text:
        raise ValueError(f"{text!r}: not the encoding of a name (an escaped character that needs no escape)")
    return name


def api_name(kernel: str, case_id: str) -> str:
    """The msprobe API name of a case: ``DeepGEMM.<kernel>.<encoded case id>.forward``."""
    return f"{API_PREFIX}.{encode_name(kernel).replace('.', ':2e')}.{encode_name(case_id)}.forward"


def parse_api_name(api: str) -> tuple[str, str] | None:
    """(kernel, case id) of an API name :func:`api_name` wrote; None for another tool's API name
    (not starting with ``DeepGEMM.``); a ``ValueError`` for a ``DeepGEMM.`` name of another shape."""
    if not api.startswith(API_PREFIX + "."):
        return None
    body = api[len(API_PREFIX) + 1:]
    if not body.endswith(".forward") or "." not in body[:-len(".forward")]:
        raise ValueError(f"API {api!r}: expected {API_PREFIX}.<kernel>.<case id>.forward")
    kernel, case = body[:-len(".forward")].split(".", 1)
    return decode_name(kernel.replace(":2e", ".")), decode_name(case)  # api_name writes a kernel's '.' as :2e


# ----------------------------------------------------------------------------------------------
# writing
# ----------------------------------------------------------------------------------------------

def _same_path(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def _inside(child: str, parent: str) -> bool:
    c, p = os.path.realpath(child), os.path.realpath(parent)
    return c == p or c.startswith(p.rstrip(os.sep) + os.sep)


def _check_out_dir(out: str, inputs: list[str], force: bool) -> None:
    """Refuse an output directory that is a file, overlaps an input, or holds something other
    than an earlier export (or an earlier export without ``force``)."""
    for src in inputs:
        if _inside(out, src) or _inside(src, out):
            raise BundleError(f"export: --out {out}: overlaps the input {src} (an export never writes into or "
                              "over what it reads)")
    if os.path.lexists(out):
        if os.path.islink(out) or not os.path.isdir(out):
            raise BundleError(f"export: --out {out}: exists and is not a directory")
        if os.listdir(out):
            if not os.path.isfile(os.path.join(out, MARKER)):
                raise BundleError(f"export: --out {out}: a non-empty directory that holds no earlier export "
                                  f"({MARKER}); refused even with --force (choose a new directory)")
            if not force:
                raise BundleError(f"export: --out {out}: holds an earlier export; pass --force to replace it")
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent):
        raise BundleError(f"export: --out {out}: the directory {parent} does not exist")


def _write_bytes(path: Path, data: bytes) -> None:
    """Write a new file (the export's temporary tree is private, so ``x`` mode suffices)."""
    try:
        with open(path, "xb") as f:
            f.write(data)
    except OSError as e:  # a full disk names the file
        raise OSError(e.errno, e.strerror or str(e), os.fspath(path)) from None


def _json_bytes(obj: Any, *, allow_nan: bool = False) -> bytes:
    return (json.dumps(obj, indent=1, sort_keys=True, allow_nan=allow_nan) + "\n").encode("utf-8")


def _tensor_parts(x: np.ndarray | st.PackedFP4) -> tuple[str, list[int], np.ndarray]:
    """(real dtype name, logical shape, the file's array: C order, little-endian, file dtype)."""
    if isinstance(x, st.PackedFP4):
        return FP4_DTYPE, list(x.shape), np.ascontiguousarray(x.data.view(np.uint8))
    name = x.dtype.name
    if name not in _DTYPES:
        raise BundleError(f"export: a tensor of dtype {x.dtype} has no file dtype")
    arr = np.ascontiguousarray(x)
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    return name, list(x.shape), arr.view(_DTYPES[name][1])


def _npy_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


def _masked(value: np.ndarray, golden: np.ndarray, defined: np.ndarray | None) -> np.ndarray:
    """``value`` with the undefined elements replaced by the golden's (0 where not finite)."""
    if defined is None or bool(defined.all()):
        return value
    g = golden.copy()
    if g.dtype.kind not in "iub":  # floats, bf16 and FP8 (ml_dtypes): non-finite goldens become 0
        g[~np.isfinite(g.astype(np.float64))] = 0
    out = value.copy()
    out[~defined] = g[~defined]
    return out


def _defined_mask(golden: Mapping[str, Any], name: str, main: str, shape: tuple[int, ...]) -> np.ndarray | None:
    key = "defined" if name == main else f"extra.{name}.defined"
    m = golden.get(key)
    if isinstance(m, np.ndarray) and m.dtype == np.bool_ and m.shape == shape:
        return m
    return None


def _stats(values: np.ndarray) -> dict[str, float]:
    v = values.astype(np.float64).ravel()
    if v.size == 0:
        return {"Max": 0.0, "Min": 0.0, "Mean": 0.0, "Norm": 0.0}
    with np.errstate(invalid="ignore", over="ignore"):
        return {"Max": float(v.max()), "Min": float(v.min()), "Mean": float(v.mean()),
                "Norm": float(np.sqrt(np.sum(v * v)))}


def _case_call(entry: Mapping[str, Any]) -> dict[str, Any]:
    """The manifest entry of a case without its hashes and statistics (the kernel call)."""
    drop = {"tensors", "file", "file_sha256", "golden_stats"}
    return {k: v for k, v in entry.items() if k not in drop}


def _import_torch(what: str) -> Any:
    try:
        import torch
    except ImportError:
        raise BundleError(f"{what}: the msprobe format needs torch (pip install torch); use --format npy or "
                          "bin without it") from None
    return torch


def export(bundle_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str], fmt: str,
           outputs: str | os.PathLike[str] | None = None, cases: list[str] | None = None, *,
           force: bool = False, max_memory: int | None = None) -> dict[str, Any]:
    """``deepgemm-ref export``: write the goldens of a bundle (or, with ``outputs``, a device's
    outputs checked against it by name, shape and dtype) in format ``fmt`` (``msprobe``, ``npy``
    or ``bin``; the layouts are in the module docstring) under ``out_dir``.

    cases: only these case ids (default every generated case).  Returns ``{"format", "out",
    "cases": [ids], "files": n}``.  Raises :class:`BundleError` (one line naming the file, case
    and key) for a bad bundle, outputs file, case id or output directory, before anything is
    written."""
    if fmt not in FORMATS:
        raise BundleError(f"export: format: expected one of {', '.join(FORMATS)}; got {fmt!r}")
    out = os.fspath(out_dir)
    torch = _import_torch("export --format msprobe") if fmt == "msprobe" else None
    bundle = load_bundle(bundle_dir, max_memory=max_memory)
    srcs = [os.fspath(bundle_dir)] + ([os.fspath(outputs)] if outputs is not None else [])
    _check_out_dir(out, srcs, force)
    ids = list(bundle.cases) if cases is None else list(dict.fromkeys(cases))
    unknown = [c for c in ids if c not in bundle.cases]
    if unknown:
        raise BundleError(f"export: --case: no generated case {', '.join(map(repr, unknown))} in {bundle.root}")
    device: Mapping[str, np.ndarray] | None = None
    if outputs is not None:
        device = read_outputs(os.fspath(outputs), max_memory)
        for cid in ids:
            for name, meta in bundle.cases[cid]["outputs"].items():
                key = f"{cid}/{name}"
                if key not in device:
                    continue
                got = device[key]
                if list(got.shape) != list(meta["shape"]) or got.dtype.name != meta["dtype"]:
                    raise BundleError(f"export: --outputs {os.fspath(outputs)}: {key!r} has shape {list(got.shape)} "
                                      f"and dtype {got.dtype}; the bundle's output has shape {meta['shape']} "
                                      f"and dtype {meta['dtype']}")
    parent = os.path.dirname(os.path.abspath(out))
    work = Path(temp_path(os.path.abspath(out), tag="export-"))  # within the file-name limit
    try:
        os.mkdir(work, 0o700)
    except OSError as e:
        raise BundleError(f"export: --out {out}: cannot create a directory in {parent}: {e.strerror}") from None
    try:
        n_files = _write_tree(work, bundle, ids, fmt, device, torch)
        _write_bytes(work / MARKER, _json_bytes({
            "format": fmt, "bundle": os.path.abspath(os.fspath(bundle_dir)),
            "outputs": None if outputs is None else os.path.abspath(os.fspath(outputs)),
            "what": "goldens" if outputs is None else "device outputs", "deepgemm_ref": __version__,
            "cases": {cid: encode_name(cid) for cid in ids}, "name_encoding": "encode_name: ':' + hex per "
            "UTF-8 byte of every character outside A-Z a-z 0-9 _ . -"}))
        _swap_in(work, Path(out))
    except OSError as e:  # a full disk names the file as it would have been under --out
        shutil.rmtree(work, ignore_errors=True)
        name = os.fspath(e.filename) if e.filename is not None else ""
        if name.startswith(os.fspath(work) + os.sep):
            raise OSError(e.errno, e.strerror or str(e), os.path.join(out, os.path.relpath(name, work))) from None
        raise
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return {"format": fmt, "out": out, "cases": ids, "files": n_files + 1}


def _load_npy(src: Any, name: Any, what: str) -> np.ndarray:
    """One array from a ``.npy`` path or open file, never unpickling (``allow_pickle=False``);
    a :class:`BundleError` naming ``name`` when it cannot be read or holds no single array."""
    try:
        arr = np.load(src, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise BundleError(f"{name}: cannot read {what}: {e}") from None
    if not isinstance(arr, np.ndarray):
        raise BundleError(f"{name}: not a single array")
    return arr


def read_outputs(path: str, max_memory: int | None, *, single_npy: bool = False) -> dict[str, np.ndarray]:
    """Device outputs as ``check`` and ``export --outputs`` read them: a dump directory
    (:func:`load_dump`), a safetensors outputs file (``<case id>/<output>`` names) or, with
    ``single_npy``, one ``.npy`` array (under the name ``""``, for a one-case bundle); every file
    size checked against ``max_memory`` (default: the memory limit) before it is read."""
    limit = default_memory_limit() if max_memory is None else max_memory
    if os.path.isdir(path):
        return load_dump(path, max_memory=limit)  # a DumpOutputs: it names each output's file
    if path.endswith(".npy") and not single_npy:
        raise BundleError(f"export: --outputs {path}: a single .npy names no case; export needs <case id>/<output> "
                          "names (a safetensors outputs file or a dump directory)")
    from .reading import open_regular

    # a regular file (never a FIFO or a device), its size checked before a byte is read
    with open_regular(path, "outputs file", error=BundleError) as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise BundleError(f"{path}: {format_size(size)}, over the memory limit {format_size(limit)} "
                              "(--max-memory)")
        if path.endswith(".npy"):
            return {"": _load_npy(f, path, "the .npy outputs")}
    try:
        raw = st.load_file(path)
    except (OSError, st.SafetensorsError) as e:
        raise BundleError(f"{path}: cannot read the outputs: {e}") from None
    return {k: (v.data if isinstance(v, st.PackedFP4) else v) for k, v in raw.items()}


def _swap_in(work: Path, out: Path) -> None:
    """Rename the finished tree into place (an earlier export moved aside first, then removed)."""
    if os.path.lexists(out) and os.listdir(out):
        old = Path(temp_path(out, tag="old-"))
        os.rename(out, old)
        try:
            os.rename(work, out)
        except BaseException:
            os.rename(old, out)
            raise
        shutil.rmtree(old, ignore_errors=True)
    else:
        if os.path.lexists(out):
            os.rmdir(out)
        os.rename(work, out)
    os.chmod(out, 0o777 & ~_umask())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _write_tree(root: Path, bundle: Bundle, ids: list[str], fmt: str, device: Mapping[str, np.ndarray] | None,
                torch: Any) -> int:
    n = 0
    if fmt == "msprobe":
        data_dir = root / "rank0" / "dump_tensor_data"
        data_dir.mkdir(parents=True)
        data: dict[str, Any] = {}
        for cid in ids:
            entry = bundle.cases[cid]
            golden = bundle.case(cid).golden()
            main = entry.get("main_output") or next(iter(entry["outputs"]))
            api = api_name(str(entry["kernel"]), cid)
            outs: dict[str, Any] = {}
            for name in entry["outputs"]:
                want = golden[name]
                if device is not None:
                    key = f"{cid}/{name}"
                    if key not in device:
                        continue
                    value = device[key]
                else:
                    value = want
                value = _masked(value, want, _defined_mask(golden, name, main, want.shape))
                data_name = f"{api}.output.{encode_name(name)}.pt"
                outs[encode_name(name)] = _pt_entry(value, data_name, cid, name)
                _write_bytes(data_dir / data_name, _pt_bytes(torch, value, cid, name))
                n += 1
            if outs:
                data[api] = {"input_args": [], "input_kwargs": {}, "output": outs}
        dump = {"task": "tensor", "level": "L1", "framework": "pytorch",
                "dump_data_dir": os.path.join("rank0", "dump_tensor_data"), "data": data}
        _write_bytes(root / "rank0" / "dump.json", _json_bytes(dump, allow_nan=True))
        return n + 1
    suffix = "." + fmt
    for cid in ids:
        entry = bundle.cases[cid]
        case_dir = root / encode_name(cid)
        case_dir.mkdir()
        tensors: list[tuple[str, str, np.ndarray | st.PackedFP4]] = []
        if device is None:
            data_all = bundle.case(cid).tensors
            for key in sorted(data_all):
                kind, _, rest = key.partition(".")
                if kind == "golden" and rest in entry["outputs"]:
                    tensors.append((rest, "output", data_all[key]))
                elif kind in ("input", "golden"):
                    tensors.append((key, kind, data_all[key]))
        else:
            for name in entry["outputs"]:
                if f"{cid}/{name}" in device:
                    tensors.append((name, "output", device[f"{cid}/{name}"]))
        files: dict[str, str] = {}
        seen: set[str] = {CASE_FILE.casefold()}
        for name, role, x in tensors:
            base = encode_name(name)
            for fname in (base + suffix, base + ".json"):
                if fname.casefold() in seen:
                    raise BundleError(f"export: case {cid!r}: tensor {name!r} maps to the file name {fname}, "
                                      "which another file of the case has")
                seen.add(fname.casefold())
            dtype, shape, arr = _tensor_parts(x)
            raw = _npy_bytes(arr) if fmt == "npy" else arr.tobytes(order="C")
            _write_bytes(case_dir / (base + suffix), raw)
            _write_bytes(case_dir / (base + ".json"), _json_bytes({
                "name": name, "role": role, "dtype": dtype, "shape": shape, "file_dtype": arr.dtype.name,
                "file_shape": list(arr.shape), "byte_order": "little", "order": "C", "nbytes": int(arr.nbytes),
                "file": base + suffix}))
            files[name] = base + suffix
            n += 2
        _write_bytes(case_dir / CASE_FILE, _json_bytes({"case": _case_call(entry), "files": files,
                                                        "what": "goldens" if device is None else
                                                        "device outputs"}))
        n += 1
    return n


def _torch_dtype(torch: Any, dtype: np.dtype[Any], cid: str, name: str) -> Any:
    spec = _DTYPES.get(dtype.name)
    tname = None if spec is None else spec[2]
    if tname is None or not hasattr(torch, tname):
        raise BundleError(f"export --format msprobe: case {cid!r}: output {name!r}: torch has no dtype for "
                          f"{dtype}")
    return getattr(torch, tname)


def _pt_bytes(torch: Any, value: np.ndarray, cid: str, name: str) -> bytes:
    tdt = _torch_dtype(torch, value.dtype, cid, name)
    raw = np.ascontiguousarray(value).reshape(-1).view(np.uint8).copy()
    t = torch.from_numpy(raw).view(tdt).reshape(tuple(value.shape)).clone()
    buf = io.BytesIO()
    torch.save(t, buf)
    return buf.getvalue()


def _pt_entry(value: np.ndarray, data_name: str, cid: str, name: str) -> dict[str, Any]:
    spec = _DTYPES.get(value.dtype.name)
    if spec is None or spec[2] is None:
        raise BundleError(f"export --format msprobe: case {cid!r}: output {name!r}: no torch dtype for {value.dtype}")
    return {"type": "torch.Tensor", "dtype": f"torch.{spec[2]}", "shape": list(value.shape), **_stats(value),
            "requires_grad": False, "data_name": data_name}


# ----------------------------------------------------------------------------------------------
# reading back
# ----------------------------------------------------------------------------------------------

class DumpOutputs(dict[str, np.ndarray]):
    """Device outputs read from a dump directory: ``<case id>/<output>`` -> array, with
    :attr:`files` naming the file each came from (for messages)."""

    files: dict[str, str]


def is_msprobe_dump(path: str | os.PathLike[str]) -> bool:
    """Whether a directory is read as an msprobe dump (it holds ``rank0/dump.json`` or ``dump.json``)."""
    p = Path(path)
    return (p / "rank0" / "dump.json").is_file() or (p / "dump.json").is_file()


def _read_small(root: Path, rel: str, what: str, limit: int = MAX_JSON_BYTES) -> bytes:
    with open_confined(root, rel, what) as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise BundleError(f"{root / rel}: {format_size(size)}; a {what} is at most {format_size(limit)}")
        from .reading import read_bounded

        raw = read_bounded(f, limit)
        if len(raw) > limit:
            raise BundleError(f"{root / rel}: grew past {format_size(limit)} while being read ({what})")
        return raw


def _json_file(root: Path, rel: str, what: str) -> Any:
    raw = _read_small(root, rel, what)
    try:
        return strict_json(raw.decode("utf-8"), allow_nan=True)
    except (UnicodeDecodeError, ValueError) as e:
        raise BundleError(f"{root / rel}: not valid JSON ({what}): {e}") from None


def _shape_of(v: Any, where: str) -> tuple[int, ...]:
    if not isinstance(v, list) or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**62
                                          for d in v) or len(v) > 64:
        raise BundleError(f"{where}: 'shape': expected a list of non-negative integers; got {str(v)[:80]}")
    if len(v) > st.MAX_DIMS or math.prod(max(d, 1) for d in v) * 8 > st.MAX_EXTENT_BYTES:
        # checked before anything is allocated: NumPy refuses such a shape even for an empty array
        raise BundleError(f"{where}: 'shape': {str(v)[:80]} is too large for an array (at most {st.MAX_DIMS} "
                          "dimensions spanning at most 2^62 bytes, zeros counted as 1)")
    return tuple(v)


class _Budget:
    """The bytes read so far against the memory limit."""

    def __init__(self, limit: int) -> None:
        self.limit, self.used = limit, 0

    def take(self, n: int, where: str) -> None:
        self.used += n
        if self.used > self.limit:
            raise BundleError(f"{where}: the outputs read reach {format_size(self.used)}, over the memory limit "
                              f"{format_size(self.limit)} (--max-memory)")


def load_dump(path: str | os.PathLike[str], *, max_memory: int | None = None) -> DumpOutputs:
    """Device outputs from a dump directory (msprobe, or the npy / bin layout; see the module
    docstring): ``<case id>/<output>`` -> array in the output's real dtype."""
    root = Path(path)
    budget = _Budget(default_memory_limit() if max_memory is None else max_memory)
    if (root / "rank0" / "dump.json").is_file():
        return _load_msprobe(root / "rank0", budget)
    if (root / "dump.json").is_file():
        return _load_msprobe(root, budget)
    result = _load_layout(root, budget)
    if not result:
        raise BundleError(f"{root}: holds no outputs (neither an msprobe dump, rank0/dump.json, nor "
                          "<case id>/<output>.npy or .bin files)")
    return result


def _load_msprobe(rank_dir: Path, budget: _Budget) -> DumpOutputs:
    where = rank_dir / "dump.json"
    dump = _json_file(rank_dir, "dump.json", "msprobe dump.json")
    if not isinstance(dump, dict) or not isinstance(dump.get("data"), dict):
        raise BundleError(f"{where}: expected an object with a 'data' object (an msprobe dump.json)")
    torch = _import_torch(f"{where}")
    result = DumpOutputs()
    result.files = {}
    for api, value in dump["data"].items():
        try:
            parsed = parse_api_name(api)
        except ValueError as e:
            raise BundleError(f"{where}: {e}") from None
        if parsed is None:
            continue
        cid = parsed[1]
        outs = value.get("output") if isinstance(value, dict) else None
        if not isinstance(outs, dict):
            raise BundleError(f"{where}: API {api!r}: 'output': expected an object of named outputs")
        for enc, meta in outs.items():
            at = f"{where}: API {api!r}: output {enc!r}"
            try:
                name = decode_name(enc)
            except ValueError as e:
                raise BundleError(f"{at}: {e}") from None
            if not isinstance(meta, dict):
                raise BundleError(f"{at}: expected an object")
            data_name, tdtype = meta.get("data_name"), meta.get("dtype")
            if not isinstance(data_name, str) or not data_name.endswith(".pt") or "/" in data_name \
                    or "\\" in data_name or data_name.startswith("."):
                raise BundleError(f"{at}: 'data_name': expected a .pt file name in dump_tensor_data; got "
                                  f"{data_name!r}")
            np_name = next((k for k, v in _DTYPES.items() if tdtype == f"torch.{v[2]}"), None)
            if np_name is None:
                raise BundleError(f"{at}: 'dtype': {tdtype!r} is not a dtype of a kernel output")
            shape = _shape_of(meta.get("shape"), at)
            rel = f"dump_tensor_data/{data_name}"
            file = rank_dir / rel
            want_dt = _real_dtype(np_name)
            nbytes = int(np.prod(shape, dtype=np.int64)) * want_dt.itemsize
            with open_confined(rank_dir, rel, f"output {name!r} of case {cid!r}") as f:
                size = os.fstat(f.fileno()).st_size
                if size > nbytes + (1 << 20):
                    raise BundleError(f"{file}: {format_size(size)}, more than a {np_name} tensor of shape "
                                      f"{list(shape)} needs")
                budget.take(size, str(file))
                try:
                    t = torch.load(f, map_location="cpu", weights_only=True)
                except Exception as e:  # noqa: BLE001 - any unreadable file is refused by name
                    raise BundleError(f"{file}: cannot read it with torch.load(weights_only=True): "
                                      f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
            if not isinstance(t, torch.Tensor):
                raise BundleError(f"{file}: holds a {type(t).__name__}, not a tensor")
            if str(t.dtype) != tdtype or tuple(t.shape) != shape:
                raise BundleError(f"{file}: a {t.dtype} tensor of shape {list(t.shape)}; dump.json says {tdtype} "
                                  f"of shape {list(shape)}")
            raw = t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().copy()
            arr = raw.view(want_dt).reshape(shape)
            key = f"{cid}/{name}"
            if key in result:
                raise BundleError(f"{where}: output {key!r} appears twice")
            result[key] = arr
            result.files[key] = str(file)
    return result


def _iter_case_dirs(root: Path) -> Iterator[tuple[str, Path]]:
    try:
        entries = sorted(os.listdir(root))
    except OSError as e:
        raise BundleError(f"{root}: cannot list the dump directory: {e.strerror}") from None
    for d in entries:
        p = root / d
        st_d = os.lstat(p)
        if not stat.S_ISDIR(st_d.st_mode) or d.startswith("."):
            continue
        try:
            cid = decode_name(d)
        except ValueError as e:
            raise BundleError(f"{p}: not a case directory name: {e}") from None
        yield cid, p


def _load_layout(root: Path, budget: _Budget) -> DumpOutputs:
    result = DumpOutputs()
    result.files = {}
    for cid, case_dir in _iter_case_dirs(root):
        names = sorted(os.listdir(case_dir))
        for fname in names:
            stem, ext = os.path.splitext(fname)
            if ext not in (".npy", ".bin"):
                continue
            file = case_dir / fname
            side = f"{stem}.json"
            meta = _json_file(case_dir, side, "sidecar") if side in names else None
            if meta is None and ext == ".bin":
                raise BundleError(f"{file}: a .bin file needs its sidecar {side} (dtype and shape)")
            if meta is not None and not isinstance(meta, dict):
                raise BundleError(f"{case_dir / side}: expected a JSON object with 'dtype' and 'shape'")
            role = "output" if meta is None else meta.get("role", "output")
            if role != "output":
                continue
            try:
                name = decode_name(stem)
            except ValueError as e:
                raise BundleError(f"{file}: not an output file name: {e}") from None
            if meta is not None and "name" in meta and meta["name"] != name:
                raise BundleError(f"{case_dir / side}: 'name' {meta['name']!r} is not the file's name {name!r}")
            arr = _read_tensor(case_dir, fname, meta, budget)
            key = f"{cid}/{name}"
            if key in result:
                raise BundleError(f"{file}: output {key!r} also has another file (.npy and .bin?)")
            result[key] = arr
            result.files[key] = str(file)
    return result


def _read_tensor(case_dir: Path, fname: str, meta: dict[str, Any] | None, budget: _Budget) -> np.ndarray:
    file = case_dir / fname
    side = case_dir / (os.path.splitext(fname)[0] + ".json")
    if meta is not None:
        dtype = meta.get("dtype")
        if dtype not in _DTYPES:
            raise BundleError(f"{side}: 'dtype': expected one of {', '.join(_DTYPES)}; got {dtype!r}")
        shape: tuple[int, ...] | None = _shape_of(meta.get("shape"), str(side))
        file_dt: np.dtype[Any] | None = _DTYPES[dtype][1]
        real: np.dtype[Any] | None = _real_dtype(dtype)
    else:
        shape = file_dt = real = None
    with open_confined(case_dir, fname, "output file") as f:
        size = os.fstat(f.fileno()).st_size
        if fname.endswith(".bin"):
            assert shape is not None and file_dt is not None and real is not None
            want = int(np.prod(shape, dtype=np.int64)) * file_dt.itemsize
            if size != want:
                raise BundleError(f"{file}: {size} bytes; a {meta['dtype'] if meta else ''} tensor of shape "
                                  f"{list(shape)} is {want} bytes")
            budget.take(size, str(file))
            raw = f.read(want)
            arr = np.frombuffer(raw, dtype=np.uint8 if real == np.bool_ else file_dt)
            if real == np.bool_ and arr.size and int(arr.max()) > 1:
                raise BundleError(f"{file}: a bool tensor holds bytes other than 0 and 1")
            return arr.view(file_dt).reshape(shape).view(real).copy()
        arr = _read_npy(f, file, size, budget)
    if meta is None:
        if arr.dtype.name not in _DTYPES or arr.dtype.byteorder == ">":
            raise BundleError(f"{file}: dtype {arr.dtype} is not an output dtype (bf16 / FP8 need a sidecar "
                              "naming the real dtype)")
        return arr
    assert shape is not None and file_dt is not None and real is not None
    if arr.dtype != file_dt:
        raise BundleError(f"{file}: elements of dtype {arr.dtype}; the sidecar's dtype {meta['dtype']} is "
                          f"stored as {file_dt}")
    if arr.shape != shape:
        raise BundleError(f"{file}: shape {list(arr.shape)}; the sidecar says {list(shape)}")
    return arr.view(real)


def _read_npy(f: BinaryIO, file: Path, size: int, budget: _Budget) -> np.ndarray:
    """A .npy file's array, its header checked against the file size before the data is read."""
    fmt = np.lib.format
    try:
        version = fmt.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = fmt.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = fmt.read_array_header_2_0(f)
        else:
            raise ValueError(f"unsupported .npy version {version}")
    except (ValueError, OSError, EOFError) as e:
        raise BundleError(f"{file}: not a .npy file: {e}") from None
    if dtype.hasobject or dtype.kind not in "fiub" or fortran:
        raise BundleError(f"{file}: a .npy of dtype {dtype}{' (Fortran order)' if fortran else ''}; expected "
                          "numbers in C order")
    need = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if size - f.tell() != need:
        raise BundleError(f"{file}: {size - f.tell()} bytes of data; shape {list(shape)} of {dtype} needs {need}")
    budget.take(need, str(file))
    f.seek(0)
    arr = _load_npy(f, file, "the .npy")
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    return np.ascontiguousarray(arr)
