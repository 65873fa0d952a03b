"""A small, strict reader and writer for the safetensors file format (no ``safetensors`` dependency).

Golden bundles are stored as ``.safetensors`` files that ``safetensors.torch.load_file`` reads into
native torch dtypes.  The ``safetensors`` package itself cannot save or load ml_dtypes arrays, so this
module implements the format from its description:

* 8 bytes: ``N``, the header length, little-endian unsigned 64-bit;
* ``N`` bytes: a UTF-8 JSON object mapping each tensor name to
  ``{"data_offsets": [begin, end], "dtype": str, "shape": [int, ...]}`` (offsets relative to the
  start of the byte buffer), plus an optional ``"__metadata__"`` object of str -> str;
* the byte buffer: every tensor's C-order (row-major), little-endian bytes, back to back in the
  order of their offsets, with no holes and no overlaps, ending exactly at the end of the file.

The writer is deterministic: tensors are written sorted by name, the JSON is written with sorted
keys and no whitespace (``separators=(",", ":")``, UTF-8, not ASCII-escaped), and the header is
padded with trailing spaces so that ``8 + N`` is a multiple of 8.  The same tensors and metadata
therefore always give the same file bytes, whatever the mapping's insertion order.

Supported dtypes (:data:`NUMPY_TO_SAFETENSORS` / :data:`SAFETENSORS_TO_NUMPY`): float64 ``F64``,
float32 ``F32``, float16 ``F16``, ml_dtypes.bfloat16 ``BF16``, ml_dtypes.float8_e4m3fn ``F8_E4M3``,
ml_dtypes.float8_e5m2 ``F8_E5M2``, ml_dtypes.float8_e8m0fnu ``F8_E8M0``, int8 ``I8``, uint8 ``U8``,
int16 ``I16``, uint16 ``U16``, int32 ``I32``, uint32 ``U32``, int64 ``I64``, uint64 ``U64`` and bool
``BOOL``; plus packed FP4 (:class:`PackedFP4`, ``F4``), stored the way safetensors 0.6+ stores
``torch.float4_e2m1fn_x2``: the header gives the LOGICAL shape ``(..., n)`` and the buffer holds
``n / 2`` bytes per row (``safetensors.torch.load_file`` returns a ``torch.float4_e2m1fn_x2`` tensor of
storage shape ``(..., n/2)``).

The reader is strict: it checks the header length, that the header is a UTF-8 JSON object without
duplicate keys, that every entry has exactly the keys ``dtype``/``shape``/``data_offsets`` with the
right types, that the dtype is known, that the byte count matches dtype and shape, that the offsets
tile the buffer exactly (from 0, sorted, contiguous, no overlap, up to the end of the file), that
``BOOL`` bytes are 0 or 1, and that the metadata is str -> str.  Every problem raises
:class:`SafetensorsError` with a message that names the file and what is wrong.  Loaded arrays are
independent, writable, C-contiguous copies (nothing refers to the file afterwards).  Nothing here
uses pickle.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import struct
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, BinaryIO, ClassVar, NamedTuple, Union

import ml_dtypes
import numpy as np
import numpy.typing as npt

from ..errors import DGArgumentError
from ..formats import pack_fp4, unpack_fp4
from .reading import open_regular, strict_json

__all__ = [
    "F4",
    "MAX_HEADER_BYTES",
    "METADATA_KEY",
    "NUMPY_TO_SAFETENSORS",
    "SAFETENSORS_DTYPES",
    "SAFETENSORS_TO_NUMPY",
    "PackedFP4",
    "SafetensorsError",
    "StreamWriter",
    "TensorDigests",
    "digest_fileobj",
    "file_size_range",
    "file_sha256",
    "fileobj_sha256",
    "load_bytes",
    "load_file",
    "load_fileobj",
    "read_header",
    "read_metadata",
    "save_bytes",
    "save_file",
    "tensor_sha256",
]

PathLike = Union[str, "os.PathLike[str]"]

#: The safetensors dtype string of packed FP4 (E2M1, two codes per byte).
F4 = "F4"
#: The reserved header key of the str -> str metadata.
METADATA_KEY = "__metadata__"
#: The largest header the reader accepts (100 MiB).
MAX_HEADER_BYTES = 100 * 1024 * 1024

_DTYPE_TABLE: tuple[tuple[str, np.dtype[Any]], ...] = (
    ("F64", np.dtype(np.float64)),
    ("F32", np.dtype(np.float32)),
    ("F16", np.dtype(np.float16)),
    ("BF16", np.dtype(ml_dtypes.bfloat16)),
    ("F8_E4M3", np.dtype(ml_dtypes.float8_e4m3fn)),
    ("F8_E5M2", np.dtype(ml_dtypes.float8_e5m2)),
    ("F8_E8M0", np.dtype(ml_dtypes.float8_e8m0fnu)),
    ("I8", np.dtype(np.int8)),
    ("U8", np.dtype(np.uint8)),
    ("I16", np.dtype(np.int16)),
    ("U16", np.dtype(np.uint16)),
    ("I32", np.dtype(np.int32)),
    ("U32", np.dtype(np.uint32)),
    ("I64", np.dtype(np.int64)),
    ("U64", np.dtype(np.uint64)),
    ("BOOL", np.dtype(np.bool_)),
)

#: safetensors dtype string -> numpy / ml_dtypes dtype (packed FP4, ``F4``, is not here: see :class:`PackedFP4`).
SAFETENSORS_TO_NUMPY: Mapping[str, np.dtype[Any]] = MappingProxyType(dict(_DTYPE_TABLE))
#: numpy / ml_dtypes dtype -> safetensors dtype string (the inverse of :data:`SAFETENSORS_TO_NUMPY`).
NUMPY_TO_SAFETENSORS: Mapping[np.dtype[Any], str] = MappingProxyType({dt: name for name, dt in _DTYPE_TABLE})
#: Every dtype string this module reads and writes: the table's plus ``F4``.
SAFETENSORS_DTYPES: frozenset[str] = frozenset(SAFETENSORS_TO_NUMPY) | {F4}

_ENTRY_KEYS = frozenset({"dtype", "shape", "data_offsets"})
_CHUNK = 1 << 20


class SafetensorsError(DGArgumentError):
    """A safetensors file (or the data to be saved in one) is invalid, or the target file exists.

    A :class:`~deepgemm_ref.errors.DGArgumentError`, hence both a ``ValueError`` and a ``RuntimeError``.
    """


# ----------------------------------------------------------------------------------------------
# Packed FP4
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class PackedFP4:
    """Packed E2M1 (FP4) codes, two per byte along the last axis, even element in the LOW nibble.

    ``data`` is an int8 array of storage shape ``(..., n/2)`` (a uint8 array is accepted and viewed as
    int8); :attr:`shape` is the logical shape ``(..., n)``.  Written with safetensors dtype ``"F4"`` and
    the logical shape in the header, which is how safetensors stores ``torch.float4_e2m1fn_x2``.
    Two instances are equal when their logical shapes and bytes are equal.
    """

    data: np.ndarray

    __hash__: ClassVar[None]  # type: ignore[assignment]

    def __post_init__(self) -> None:
        d = self.data
        if not isinstance(d, np.ndarray) or d.dtype not in (np.dtype(np.int8), np.dtype(np.uint8)):
            got = f"dtype {d.dtype}" if isinstance(d, np.ndarray) else type(d).__name__
            raise SafetensorsError(f"PackedFP4: data: expected an int8 (or uint8) numpy array; got {got}")
        if d.ndim < 1:
            raise SafetensorsError("PackedFP4: data: expected at least one dimension (the packed last axis); got 0-d")
        if d.dtype != np.int8:
            object.__setattr__(self, "data", d.view(np.int8))

    @property
    def shape(self) -> tuple[int, ...]:
        """The logical shape ``(..., n)``: the storage shape with the last dimension doubled."""
        s = self.data.shape
        return (*s[:-1], 2 * s[-1])

    @property
    def nbytes(self) -> int:
        """Bytes of packed storage: ``prod(shape) / 2``."""
        return int(self.data.size)

    @classmethod
    def from_codes(cls, codes: npt.ArrayLike) -> PackedFP4:
        """Pack E2M1 codes ``(..., n)`` (integers 0..15, or an ml_dtypes.float4_e2m1fn array) into ``(..., n/2)``."""
        c = np.asarray(codes)
        if c.dtype == np.dtype(ml_dtypes.float4_e2m1fn):
            c = c.view(np.uint8) & 0xF
        if c.dtype.kind not in "iu":
            raise SafetensorsError(f"PackedFP4.from_codes: codes: expected integer codes 0..15; got dtype {c.dtype}")
        if c.ndim < 1 or c.shape[-1] % 2:
            raise SafetensorsError(f"PackedFP4.from_codes: codes: expected an even last dimension; got shape {c.shape}")
        if c.size and (int(c.min()) < 0 or int(c.max()) > 15):
            raise SafetensorsError("PackedFP4.from_codes: codes: expected values in 0..15")
        return cls(pack_fp4(c))

    def codes(self) -> np.ndarray:
        """The unpacked E2M1 codes: uint8 array of the logical shape ``(..., n)``, values 0..15."""
        return unpack_fp4(self.data)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PackedFP4):
            return NotImplemented
        return self.shape == other.shape and bool(np.array_equal(self.data, other.data))


# ----------------------------------------------------------------------------------------------
# Writing
# ----------------------------------------------------------------------------------------------

class _Prepared(NamedTuple):
    name: str
    dtype: str
    shape: tuple[int, ...]
    raw: np.ndarray  # 1-D uint8, C-order little-endian bytes


def _where(path: PathLike | None) -> str:
    return "safetensors bytes" if path is None else f"safetensors file {os.fspath(path)!r}"


def _utf8_ok(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _raw_bytes(value: np.ndarray | PackedFP4, what: str) -> tuple[str, tuple[int, ...], np.ndarray]:
    """``(dtype string, logical shape, 1-D uint8 C-order little-endian bytes)`` of one tensor."""
    if isinstance(value, PackedFP4):
        raw = np.ascontiguousarray(value.data).reshape(-1).view(np.uint8)
        return F4, value.shape, raw
    if not isinstance(value, np.ndarray):
        raise SafetensorsError(f"{what}: expected a numpy array or PackedFP4; got {type(value).__name__}")
    arr = value
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    name = next((n for n, dt in _DTYPE_TABLE if arr.dtype == dt), None)
    if name is None:
        hint = "; wrap packed E2M1 codes in PackedFP4" if arr.dtype == np.dtype(ml_dtypes.float4_e2m1fn) else ""
        raise SafetensorsError(
            f"{what}: unsupported dtype {arr.dtype}; supported: {', '.join(str(dt) for _, dt in _DTYPE_TABLE)}{hint}"
        )
    flat = np.ascontiguousarray(arr).reshape(-1)
    if sys.byteorder == "big" and flat.dtype.itemsize > 1:  # pragma: no cover - little-endian hosts only in CI
        flat = flat.byteswap()
    raw = flat.view(np.uint8)
    if name == "BOOL" and raw.size and int(raw.max()) > 1:
        raise SafetensorsError(f"{what}: bool array holds bytes other than 0 and 1")
    return name, tuple(int(s) for s in arr.shape), raw


def _prepare(tensors: Mapping[str, np.ndarray | PackedFP4], where: str) -> list[_Prepared]:
    if not isinstance(tensors, Mapping):
        raise SafetensorsError(f"{where}: tensors: expected a mapping of name -> array; got {type(tensors).__name__}")
    out: list[_Prepared] = []
    for name, value in tensors.items():
        if not isinstance(name, str) or not name:
            raise SafetensorsError(f"{where}: tensor names must be non-empty strings; got {name!r}")
        if name == METADATA_KEY:
            raise SafetensorsError(f"{where}: {METADATA_KEY!r} is reserved and cannot name a tensor")
        if not _utf8_ok(name):
            raise SafetensorsError(f"{where}: tensor name {name!r} is not encodable as UTF-8")
        dtype, shape, raw = _raw_bytes(value, f"{where}: tensor {name!r}")
        out.append(_Prepared(name, dtype, shape, raw))
    out.sort(key=lambda p: p.name)
    return out


def _check_metadata_arg(metadata: Mapping[str, str] | None, where: str) -> dict[str, str] | None:
    if metadata is None:
        return None
    if not isinstance(metadata, Mapping):
        raise SafetensorsError(f"{where}: metadata: expected a mapping of str -> str; got {type(metadata).__name__}")
    for k, v in metadata.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise SafetensorsError(
                f"{where}: metadata: expected str -> str; got {type(k).__name__} {k!r} -> {type(v).__name__}"
            )
        if not (_utf8_ok(k) and _utf8_ok(v)):
            raise SafetensorsError(f"{where}: metadata: entry {k!r} is not encodable as UTF-8")
    return dict(metadata)


def _encode_header(prepared: list[_Prepared], metadata: dict[str, str] | None) -> bytes:
    """The 8-byte length prefix plus the space-padded JSON header."""
    return _header_of([(p.name, p.dtype, p.shape, int(p.raw.size)) for p in prepared], metadata)


def _header_of(layout: list[tuple[str, str, tuple[int, ...], int]], metadata: dict[str, str] | None) -> bytes:
    """The header of tensors ``(name, dtype string, shape, byte count)`` in file order."""
    header: dict[str, Any] = {}
    if metadata is not None:
        header[METADATA_KEY] = metadata
    offset = 0
    for name, dtype, shape, size in layout:
        end = offset + size
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, end]}
        offset = end
    text = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    body = text.encode("utf-8")
    body += b" " * (-(8 + len(body)) % 8)
    return struct.pack("<Q", len(body)) + body


def _write_tensor_data(f: BinaryIO, prepared: list[_Prepared]) -> None:
    for p in prepared:
        if p.raw.size:
            f.write(p.raw.data)


def save_bytes(tensors: Mapping[str, np.ndarray | PackedFP4], metadata: Mapping[str, str] | None = None) -> bytes:
    """The bytes of the safetensors file :func:`save_file` would write for ``tensors`` and ``metadata``."""
    where = _where(None)
    prepared = _prepare(tensors, where)
    meta = _check_metadata_arg(metadata, where)
    return _encode_header(prepared, meta) + b"".join(p.raw.tobytes() for p in prepared)


def _create_temp(directory: str, base: str) -> tuple[str, int]:
    from .paths import create_temp

    return create_temp(os.path.join(directory, base))


def _fsync_directory(directory: str) -> None:
    """Make a rename durable where the platform allows opening a directory (not on Windows)."""
    from .paths import fsync_directory

    fsync_directory(directory)


def save_file(
    tensors: Mapping[str, np.ndarray | PackedFP4],
    path: PathLike,
    metadata: Mapping[str, str] | None = None,
    *,
    overwrite: bool = False,
) -> None:
    """Write ``tensors`` (name -> array or :class:`PackedFP4`) and optional str -> str ``metadata`` to ``path``.

    Arrays of any shape (0-d and zero-size included) and any strides are written as their C-order
    contents, little-endian, with the dtype string of :data:`NUMPY_TO_SAFETENSORS`; :class:`PackedFP4`
    is written as ``F4`` with its logical shape.  Everything is validated before anything is written.
    An existing ``path`` raises :class:`SafetensorsError` unless ``overwrite=True``.  The write is
    atomic: the bytes go to a temporary file in the same directory, which is flushed, fsynced and
    then renamed onto ``path`` with :func:`os.replace` (the directory is fsynced where possible); on
    any exception the temporary file is removed and ``path`` is left as it was.
    """
    target = os.fspath(path)
    where = _where(target)
    prepared = _prepare(tensors, where)
    meta = _check_metadata_arg(metadata, where)
    header = _encode_header(prepared, meta)
    if not overwrite and os.path.lexists(target):
        raise SafetensorsError(f"{where}: file exists; pass overwrite=True (CLI: --force) to replace it")
    from .paths import refuse_special

    refuse_special(target)  # a device, FIFO, directory or symlink is never replaced
    directory = os.path.dirname(os.path.abspath(target))
    tmp, fd = _create_temp(directory, os.path.basename(target))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(header)
            _write_tensor_data(f, prepared)
            f.flush()
            os.fsync(f.fileno())
        if not overwrite and os.path.lexists(target):
            raise SafetensorsError(f"{where}: file exists; pass overwrite=True (CLI: --force) to replace it")
        os.replace(tmp, target)
    except OSError as e:  # a full disk names the file, not the temporary one (or none)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise OSError(e.errno, e.strerror or str(e), target) from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_directory(directory)


class TensorDigests:
    """The :func:`tensor_sha256` digests of tensors given piece by piece (what
    :class:`StreamWriter` writes, or what ``verify --regenerate`` compares without writing).

    ``layout``: every tensor's ``name -> (dtype, shape)`` (a numpy / ml_dtypes dtype; no packed
    FP4).  :meth:`write` gives each tensor's leading-axis slices (rows) in order, from row 0, as
    arrays of the tensor's dtype and trailing shape, or the whole tensor at once.
    """

    def __init__(self, layout: Mapping[str, tuple[Any, tuple[int, ...]]], where: str = "tensors") -> None:
        self._where = where
        self._entries: list[tuple[str, str, tuple[int, ...], int]] = []
        self._dtype: dict[str, np.dtype[Any]] = {}
        self._shape: dict[str, tuple[int, ...]] = {}
        self._sha: dict[str, Any] = {}
        for name in sorted(layout):
            dt, shape = layout[name]
            dtype = np.dtype(dt)
            if not isinstance(name, str) or not name or name == METADATA_KEY or not _utf8_ok(name):
                raise SafetensorsError(f"{where}: tensor name {name!r} is not allowed")
            code = NUMPY_TO_SAFETENSORS.get(dtype)
            if code is None:
                raise SafetensorsError(f"{where}: tensor {name!r}: unsupported dtype {dtype}")
            shape = tuple(int(s) for s in shape)
            self._entries.append((name, code, shape, int(math.prod(shape)) * dtype.itemsize))
            self._dtype[name], self._shape[name] = dtype, shape
            self._sha[name] = _tensor_digest(code, shape)
        self._next = {name: 0 for name in self._shape}

    @property
    def layout(self) -> dict[str, tuple[np.dtype[Any], tuple[int, ...]]]:
        """Every tensor's ``name -> (dtype, shape)``, in file order."""
        return {name: (self._dtype[name], self._shape[name]) for name, *_ in self._entries}

    def write(self, name: str, rows: np.ndarray, start: int = 0) -> None:
        """Give ``rows`` as the tensor's leading-axis slice ``[start:start + len(rows)]``
        (``start`` must be the first row not yet given)."""
        raw, _ = self._take(name, rows, start)
        if raw.size:
            self._sha[name].update(raw.data)

    def _take(self, name: str, rows: np.ndarray, start: int) -> tuple[np.ndarray, int]:
        """Check ``rows`` and mark them given: their little-endian bytes and byte offset in the tensor."""
        if name not in self._shape:
            raise SafetensorsError(f"{self._where}: no tensor {name!r} in the layout")
        shape, dtype = self._shape[name], self._dtype[name]
        arr = np.asarray(rows)
        whole = len(shape) == 0 or arr.shape == shape
        if arr.dtype != dtype or (not whole and (arr.ndim != len(shape) or arr.shape[1:] != shape[1:])):
            raise SafetensorsError(f"{self._where}: tensor {name!r}: expected rows of {dtype} {shape[1:]}; "
                                   f"got {arr.dtype} {arr.shape}")
        count = 1 if len(shape) == 0 else arr.shape[0]
        if start != self._next[name] or start + count > (shape[0] if shape else 1):
            raise SafetensorsError(f"{self._where}: tensor {name!r}: rows {start}..{start + count} written out of "
                                   f"order (next row {self._next[name]} of {shape[0] if shape else 1})")
        raw = np.ascontiguousarray(arr).reshape(-1)
        if sys.byteorder == "big" and raw.dtype.itemsize > 1:  # pragma: no cover - little-endian hosts only
            raw = raw.byteswap()
        raw = raw.view(np.uint8)
        if dtype == np.bool_ and raw.size and int(raw.max()) > 1:
            raise SafetensorsError(f"{self._where}: tensor {name!r}: bool array holds bytes other than 0 and 1")
        self._next[name] = start + count
        row_bytes = int(math.prod(shape[1:])) * dtype.itemsize if shape else dtype.itemsize
        return raw, start * row_bytes

    def tensor_sha256(self, name: str) -> str:
        """The :func:`tensor_sha256` digest of a tensor whose rows are all given."""
        self._check_done(name)
        return str(self._sha[name].hexdigest())

    def _check_done(self, name: str) -> None:
        shape = self._shape[name]
        if self._next[name] != (shape[0] if shape else 1):
            raise SafetensorsError(f"{self._where}: tensor {name!r}: {self._next[name]} of "
                                   f"{shape[0] if shape else 1} rows written")


class StreamWriter(TensorDigests):
    """A safetensors file written piece by piece, for tensors too large to hold at once.

    ``layout`` and :meth:`write` as :class:`TensorDigests`.  The header is written first and the
    file sized; each row written goes to its place.  :meth:`commit` checks that every row was
    written, fsyncs and renames the temporary file onto ``path`` (the directory fsynced too);
    :meth:`abort`, or leaving the ``with`` block by an exception, removes it.  The finished
    file's bytes are exactly those :func:`save_file` writes for the whole tensors, and
    :meth:`tensor_sha256` gives each tensor's digest, computed from the rows as they are written.

    path: the target (refused when it exists unless ``overwrite``; a device, FIFO, directory or
    symlink is never replaced).
    """

    def __init__(self, path: PathLike, layout: Mapping[str, tuple[Any, tuple[int, ...]]],
                 metadata: Mapping[str, str] | None = None, *, overwrite: bool = False) -> None:
        self.target = os.fspath(path)
        self._tmp, self._fd = "", -1
        where = _where(self.target)
        meta = _check_metadata_arg(metadata, where)
        super().__init__(layout, where)
        header = _header_of(self._entries, meta)
        self._offset: dict[str, int] = {}
        offset = len(header)
        for name, _code, _shape, size in self._entries:
            self._offset[name] = offset
            offset += size
        if not overwrite and os.path.lexists(self.target):
            raise SafetensorsError(f"{where}: file exists; pass overwrite=True (CLI: --force) to replace it")
        from .paths import refuse_special

        refuse_special(self.target)
        self._overwrite = overwrite
        self._dir = os.path.dirname(os.path.abspath(self.target))
        self._tmp, self._fd = _create_temp(self._dir, os.path.basename(self.target))
        try:
            self._pwrite(header, 0)
            os.ftruncate(self._fd, offset)
        except BaseException:
            self.abort()
            raise

    def _pwrite(self, data: Any, offset: int) -> None:
        view = memoryview(data).cast("B")
        try:
            while view.nbytes:
                done = os.pwrite(self._fd, view, offset)
                view, offset = view[done:], offset + done
        except OSError as e:  # a full disk names the file, not the temporary one
            raise OSError(e.errno, e.strerror or str(e), self.target) from None

    def write(self, name: str, rows: np.ndarray, start: int = 0) -> None:
        """Write ``rows`` as the tensor's leading-axis slice ``[start:start + len(rows)]``
        (``start`` must be the first row not yet written)."""
        raw, offset = self._take(name, rows, start)
        if raw.size:
            self._pwrite(raw.data, self._offset[name] + offset)
            self._sha[name].update(raw.data)

    def commit(self) -> None:
        """Check that every row was written, make the file durable and rename it onto the target."""
        for name in self._shape:
            self._check_done(name)
        try:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = -1
            if not self._overwrite and os.path.lexists(self.target):
                raise SafetensorsError(f"{self._where}: file exists; pass overwrite=True (CLI: --force) to replace it")
            os.replace(self._tmp, self.target)
        except OSError as e:
            self.abort()
            raise OSError(e.errno, e.strerror or str(e), self.target) from None
        except BaseException:
            self.abort()
            raise
        self._tmp = ""
        _fsync_directory(self._dir)

    def abort(self) -> None:
        """Remove the temporary file (nothing at the target changes)."""
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1
        if self._tmp:
            with contextlib.suppress(OSError):
                os.unlink(self._tmp)
            self._tmp = ""

    def __enter__(self) -> StreamWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is not None or self._tmp:
            self.abort()


# ----------------------------------------------------------------------------------------------
# Reading
# ----------------------------------------------------------------------------------------------

class _Entry(NamedTuple):
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _expected_nbytes(dtype: str, shape: tuple[int, ...], name: str, where: str) -> int:
    count = math.prod(shape)
    if dtype == F4:
        if not shape or shape[-1] % 2:
            raise SafetensorsError(
                f"{where}: tensor {name!r}: F4 needs an even last dimension (two codes per byte); "
                f"got shape {list(shape)}"
            )
        return count // 2
    return count * SAFETENSORS_TO_NUMPY[dtype].itemsize


#: The most dimensions of a tensor read (NumPy 1.x's limit; NumPy 2's is 64).
MAX_DIMS = 32
#: The largest extent, counting each zero dimension as 1, in bytes, of a tensor read: NumPy
#: refuses ``arr.size * itemsize`` over ``2**63 - 1`` counted that way, even for an empty array.
MAX_EXTENT_BYTES = 1 << 62


def _check_dims(shape: list[int], dtype: str, name: str, where: str) -> None:
    """Refuse a shape no array can have (too many dimensions, or an extent over
    :data:`MAX_EXTENT_BYTES`, zero-size tensors included) before anything is allocated."""
    if len(shape) > MAX_DIMS:
        raise SafetensorsError(f"{where}: tensor {name!r}: {len(shape)} dimensions; at most {MAX_DIMS}")
    itemsize = 1 if dtype == F4 else SAFETENSORS_TO_NUMPY[dtype].itemsize
    extent = itemsize
    for d in shape:
        extent *= max(d, 1)
        if extent > MAX_EXTENT_BYTES:
            raise SafetensorsError(f"{where}: tensor {name!r}: shape {list(shape)} is too large for an array "
                                   f"(its dimensions, zeros counted as 1, span over 2^62 bytes)")


def _check_entry(name: str, entry: object, where: str) -> _Entry:
    if not name:
        raise SafetensorsError(f"{where}: header has a tensor with an empty name")
    if not isinstance(entry, dict):
        raise SafetensorsError(
            f"{where}: tensor {name!r}: expected an object with keys data_offsets, dtype, shape; "
            f"got {type(entry).__name__}"
        )
    keys = set(entry)
    if keys != _ENTRY_KEYS:
        missing, extra = sorted(_ENTRY_KEYS - keys), sorted(keys - _ENTRY_KEYS)
        raise SafetensorsError(f"{where}: tensor {name!r}: missing keys {missing}, unexpected keys {extra}")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str):
        raise SafetensorsError(f"{where}: tensor {name!r}: dtype must be a string; got {dtype!r}")
    if dtype not in SAFETENSORS_DTYPES:
        raise SafetensorsError(
            f"{where}: tensor {name!r}: unknown dtype {dtype!r}; known: {', '.join(sorted(SAFETENSORS_DTYPES))}"
        )
    if not isinstance(shape, list) or not all(_is_int(s) and s >= 0 for s in shape):
        raise SafetensorsError(
            f"{where}: tensor {name!r}: shape must be a list of non-negative integers; got {shape!r}"
        )
    _check_dims(shape, dtype, name, where)
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_int(o) and o >= 0 for o in offsets)):
        raise SafetensorsError(
            f"{where}: tensor {name!r}: data_offsets must be two non-negative integers [begin, end]; got {offsets!r}"
        )
    begin, end = offsets
    if end < begin:
        raise SafetensorsError(f"{where}: tensor {name!r}: data_offsets [{begin}, {end}] end before they begin")
    shp = tuple(shape)
    expected = _expected_nbytes(dtype, shp, name, where)
    if end - begin != expected:
        raise SafetensorsError(
            f"{where}: tensor {name!r}: data_offsets [{begin}, {end}] hold {end - begin} bytes; "
            f"expected {expected} for {dtype} shape {list(shp)}"
        )
    return _Entry(name, dtype, shp, begin, end)


def _parse_header(body: bytes, buffer_size: int, where: str) -> tuple[dict[str, Any], list[_Entry]]:
    """Validate the JSON header ``body`` against a byte buffer of ``buffer_size`` bytes."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SafetensorsError(f"{where}: header is not valid UTF-8: {exc}") from None
    try:
        header = strict_json(text)
    except ValueError as exc:
        raise SafetensorsError(f"{where}: header is not valid JSON: {exc}") from None
    if not isinstance(header, dict):
        raise SafetensorsError(f"{where}: header must be a JSON object; got {type(header).__name__}")
    if METADATA_KEY in header:
        meta = header[METADATA_KEY]
        if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
            raise SafetensorsError(f"{where}: {METADATA_KEY} must be an object of str -> str; got {meta!r}")
    entries = [_check_entry(name, entry, where) for name, entry in header.items() if name != METADATA_KEY]
    pos = 0
    prev: _Entry | None = None
    for e in sorted(entries, key=lambda e: (e.begin, e.end, e.name)):
        if e.begin < pos:
            assert prev is not None
            raise SafetensorsError(
                f"{where}: tensor {e.name!r}: data_offsets [{e.begin}, {e.end}] overlap tensor {prev.name!r} "
                f"at [{prev.begin}, {prev.end}]"
            )
        if e.begin > pos:
            raise SafetensorsError(
                f"{where}: bytes [{pos}, {e.begin}) of the buffer belong to no tensor (a hole before tensor {e.name!r})"
            )
        pos = e.end
        prev = e
    if pos != buffer_size:
        if pos > buffer_size:
            raise SafetensorsError(
                f"{where}: tensors end at buffer byte {pos} but the file holds only {buffer_size} buffer bytes"
            )
        raise SafetensorsError(
            f"{where}: the buffer holds {buffer_size} bytes but the tensors end at byte {pos} "
            f"({buffer_size - pos} trailing bytes belong to no tensor)"
        )
    return header, entries


def _header_length(prefix: bytes, file_size: int, where: str) -> int:
    if file_size < 8 or len(prefix) < 8:
        raise SafetensorsError(f"{where}: file holds {file_size} bytes; a safetensors file has at least 8")
    (n,) = struct.unpack("<Q", prefix[:8])
    if n > file_size - 8:
        raise SafetensorsError(f"{where}: header length {n} exceeds the {file_size - 8} bytes after the length prefix")
    if n > MAX_HEADER_BYTES:
        raise SafetensorsError(f"{where}: header length {n} exceeds the limit of {MAX_HEADER_BYTES} bytes")
    return int(n)


def _decode(entries: list[_Entry], buffer: memoryview, where: str) -> dict[str, np.ndarray | PackedFP4]:
    out: dict[str, np.ndarray | PackedFP4] = {}
    for e in sorted(entries, key=lambda e: e.name):
        raw = np.frombuffer(buffer[e.begin : e.end], dtype=np.uint8)
        if e.dtype == "BOOL" and raw.size and int(raw.max()) > 1:
            raise SafetensorsError(f"{where}: tensor {e.name!r}: BOOL data holds bytes other than 0 and 1")
        if e.dtype == F4:
            arr = np.empty((*e.shape[:-1], e.shape[-1] // 2), np.int8)
        else:
            arr = np.empty(e.shape, SAFETENSORS_TO_NUMPY[e.dtype])
        arr.reshape(-1).view(np.uint8)[:] = raw  # a fresh array that owns its data: no reference to the file
        if sys.byteorder == "big" and arr.dtype.itemsize > 1:  # pragma: no cover - little-endian hosts only in CI
            arr.byteswap(inplace=True)
        out[e.name] = PackedFP4(arr) if e.dtype == F4 else arr
    return out


def load_bytes(data: bytes | bytearray | memoryview) -> dict[str, np.ndarray | PackedFP4]:
    """Parse the bytes of a safetensors file: see :func:`load_file`."""
    where = _where(None)
    view = memoryview(data).cast("B")
    n = _header_length(bytes(view[:8]), len(view), where)
    _, entries = _parse_header(bytes(view[8 : 8 + n]), len(view) - 8 - n, where)
    return _decode(entries, view[8 + n :], where)


def _read_exact(f: BinaryIO, size: int, where: str) -> bytes:
    data = f.read(size)
    if len(data) != size:  # pragma: no cover - the file shrank while being read
        raise SafetensorsError(f"{where}: file ended after {len(data)} of {size} expected bytes")
    return data


def _open_and_parse(f: BinaryIO, where: str) -> tuple[dict[str, Any], list[_Entry], int]:
    size = os.fstat(f.fileno()).st_size
    prefix = f.read(8)
    n = _header_length(prefix, size, where)
    header, entries = _parse_header(_read_exact(f, n, where), size - 8 - n, where)
    return header, entries, size - 8 - n


def _open_file(path: PathLike) -> BinaryIO:
    """``path`` opened for reading: a regular file, never blocking on a FIFO or reading a device
    (:class:`SafetensorsError` naming the file otherwise)."""
    return open_regular(path, "safetensors file", error=SafetensorsError)


def read_header(path: PathLike) -> dict[str, Any]:
    """The validated JSON header of ``path``: name -> ``{"dtype", "shape", "data_offsets"}`` plus ``"__metadata__"``.

    Only the header is read, but it is checked against the file size (offsets must tile the buffer).
    """
    where = _where(path)
    with _open_file(path) as f:
        header, _, _ = _open_and_parse(f, where)
    return header


def read_metadata(path: PathLike) -> dict[str, str]:
    """The ``"__metadata__"`` of ``path`` (``{}`` when the file has none); the header is fully validated."""
    meta = read_header(path).get(METADATA_KEY, {})
    return dict(meta)


def load_file(path: PathLike) -> dict[str, np.ndarray | PackedFP4]:
    """Read every tensor of ``path``: name (sorted) -> array of the logical shape, or :class:`PackedFP4` for ``F4``.

    Arrays have the dtype of :data:`SAFETENSORS_TO_NUMPY` and are independent, writable, C-contiguous
    copies.  Raises :class:`SafetensorsError` for any violation of the format (see the module docstring).
    """
    with _open_file(path) as f:
        return load_fileobj(f, _where(path))


def load_fileobj(f: BinaryIO, where: str = "<file>") -> dict[str, np.ndarray | PackedFP4]:
    """:func:`load_file` from an open binary file positioned at its start (``where`` names it in errors)."""
    _, entries, buffer_size = _open_and_parse(f, where)
    buffer = _read_exact(f, buffer_size, where)
    return _decode(entries, memoryview(buffer), where)


def file_size_range(tensors: Mapping[str, tuple[str, tuple[int, ...]]]) -> tuple[int, int]:
    """The smallest and largest size of a safetensors file holding ``tensors`` (name -> (dtype
    string, shape)): their bytes plus a header of 8 bytes up to 8 + :data:`MAX_HEADER_BYTES`."""
    data = sum(_expected_nbytes(dtype, tuple(shape), name, "tensors") for name, (dtype, shape) in tensors.items())
    return data + 8, data + 8 + MAX_HEADER_BYTES


def digest_fileobj(f: BinaryIO, where: str = "<file>", file_hash: Any = None) -> dict[str, str]:
    """Every tensor's :func:`tensor_sha256` digest, read from an open safetensors file positioned
    at its start in chunks of 1 MiB (the header checked as :func:`load_fileobj` checks it, BOOL
    bytes too): a file of any size is verified in bounded memory, in one pass.  ``file_hash``: a
    ``hashlib`` object that is also given every byte of the file, in order."""
    _, entries, _ = _open_and_parse(f, where)
    data_start = f.tell()
    if file_hash is not None:
        f.seek(0)
        file_hash.update(_read_exact(f, data_start, where))
    out: dict[str, str] = {}
    for e in sorted(entries, key=lambda e: e.begin):  # they tile the data: every byte once, in order
        h = _tensor_digest(e.dtype, e.shape)
        f.seek(data_start + e.begin)
        left = e.end - e.begin
        while left:
            chunk = _read_exact(f, min(left, _CHUNK), where)
            if e.dtype == "BOOL" and chunk and int(np.frombuffer(chunk, np.uint8).max()) > 1:
                raise SafetensorsError(f"{where}: tensor {e.name!r}: BOOL data holds bytes other than 0 and 1")
            h.update(chunk)
            if file_hash is not None:
                file_hash.update(chunk)
            left -= len(chunk)
        out[e.name] = h.hexdigest()
    return out


# ----------------------------------------------------------------------------------------------
# Digests
# ----------------------------------------------------------------------------------------------

def tensor_sha256(x: np.ndarray | PackedFP4) -> str:
    """Hex SHA-256 of a canonical encoding of one tensor, for per-tensor digests in manifests.

    The digest is over ``json.dumps({"dtype": D, "shape": S}, sort_keys=True, separators=(",", ":"))``
    encoded as ASCII, one newline byte ``b"\\n"``, then the tensor's C-order little-endian raw bytes, where
    ``D`` is the safetensors dtype string and ``S`` the logical shape as a list of ints (for
    :class:`PackedFP4`: ``"F4"``, the shape ``(..., n)`` and the packed bytes).  It is the same for
    a tensor before saving and after loading, independent of strides and of the file it is in.
    """
    dtype, shape, raw = _raw_bytes(x, "tensor_sha256: x")
    h = _tensor_digest(dtype, shape)
    h.update(raw.data)
    return h.hexdigest()


def _tensor_digest(dtype: str, shape: tuple[int, ...]) -> Any:
    """A SHA-256 object fed the prefix of :func:`tensor_sha256`'s encoding (its raw bytes follow)."""
    prefix = json.dumps({"dtype": dtype, "shape": list(shape)}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(prefix.encode("ascii") + b"\n")


def file_sha256(path: PathLike) -> str:
    """Hex SHA-256 of the bytes of the file ``path``."""
    with _open_file(path) as f:
        return fileobj_sha256(f)


def fileobj_sha256(f: BinaryIO) -> str:
    """Hex SHA-256 of the rest of the open binary file ``f``, read in chunks."""
    h = hashlib.sha256()
    while chunk := f.read(_CHUNK):
        h.update(chunk)
    return h.hexdigest()
