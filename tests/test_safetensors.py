"""deepgemm_ref.golden.safetensors: our own strict safetensors writer and reader.

Round trips of every dtype (0-d, zero-size, non-contiguous), a hand-built expected file, determinism,
packed FP4, the strict reader's rejections, atomic writes, digests, and (when torch and safetensors
are installed) interchange with ``safetensors.torch`` in both directions.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from deepgemm_ref.errors import DGArgumentError
from deepgemm_ref.golden import safetensors as sft
from deepgemm_ref.golden.safetensors import (
    NUMPY_TO_SAFETENSORS,
    SAFETENSORS_TO_NUMPY,
    PackedFP4,
    SafetensorsError,
    file_sha256,
    load_bytes,
    load_file,
    read_header,
    read_metadata,
    save_bytes,
    save_file,
    tensor_sha256,
)

EXPECTED_TABLE = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "F8_E8M0": np.dtype(ml_dtypes.float8_e8m0fnu),
    "I8": np.dtype(np.int8),
    "U8": np.dtype(np.uint8),
    "I16": np.dtype(np.int16),
    "U16": np.dtype(np.uint16),
    "I32": np.dtype(np.int32),
    "U32": np.dtype(np.uint32),
    "I64": np.dtype(np.int64),
    "U64": np.dtype(np.uint64),
    "BOOL": np.dtype(np.bool_),
}
NAMES = sorted(EXPECTED_TABLE)


def _random(dtype: np.dtype, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Random raw bytes of the given dtype (any bit pattern, NaNs included; bool 0/1)."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape, dtype=np.int64))
    if dtype == np.bool_:
        return rng.integers(0, 2, n).astype(np.bool_).reshape(shape)
    raw = rng.integers(0, 256, n * dtype.itemsize, dtype=np.uint8)
    return raw.view(dtype).reshape(shape)


def _bytes(x: np.ndarray | PackedFP4) -> bytes:
    if isinstance(x, PackedFP4):
        x = x.data
    return np.ascontiguousarray(x).reshape(-1).view(np.uint8).tobytes()


def _assert_same(got: np.ndarray | PackedFP4, want: np.ndarray | PackedFP4) -> None:
    assert type(got) is type(want)
    if isinstance(want, PackedFP4):
        assert isinstance(got, PackedFP4)
        assert got.shape == want.shape and got.data.shape == want.data.shape and got.data.dtype == np.int8
    else:
        assert isinstance(got, np.ndarray)
        assert got.dtype == want.dtype and got.shape == want.shape
    assert _bytes(got) == _bytes(want)


def _raw_file(header: dict, data: bytes = b"", *, pad: bool = True) -> bytes:
    body = json.dumps(header).encode()
    if pad:
        body += b" " * (-(8 + len(body)) % 8)
    return struct.pack("<Q", len(body)) + body + data


def _header_of(blob: bytes) -> dict:
    (n,) = struct.unpack("<Q", blob[:8])
    return json.loads(blob[8:8 + n])


# ----------------------------------------------------------------------------------------------
# Table and round trips
# ----------------------------------------------------------------------------------------------

def test_dtype_table():
    assert dict(SAFETENSORS_TO_NUMPY) == EXPECTED_TABLE
    assert {dt: name for name, dt in EXPECTED_TABLE.items()} == dict(NUMPY_TO_SAFETENSORS)
    assert sft.SAFETENSORS_DTYPES == set(EXPECTED_TABLE) | {"F4"}
    assert issubclass(SafetensorsError, DGArgumentError)
    assert issubclass(SafetensorsError, ValueError) and issubclass(SafetensorsError, RuntimeError)


def _cases(dtype: np.dtype, seed: int) -> dict[str, np.ndarray]:
    base = _random(dtype, (4, 6), seed)
    return {
        "scalar": _random(dtype, (), seed + 1),
        "empty": _random(dtype, (3, 0, 2), seed + 2),
        "empty1": _random(dtype, (0,), seed + 3),
        "matrix": base,
        "strided": base[::2, ::-3],
        "transposed": base.T,
        "fortran": np.asfortranarray(_random(dtype, (3, 5), seed + 4)),
    }


@pytest.mark.parametrize("name", NAMES)
def test_round_trip_every_dtype(tmp_path, name):
    dtype = EXPECTED_TABLE[name]
    tensors = _cases(dtype, NAMES.index(name) * 10)
    assert not tensors["strided"].flags.c_contiguous and not tensors["transposed"].flags.c_contiguous
    path = tmp_path / "t.safetensors"
    meta = {"dtype": name, "note": "ünïcode ✓", "": ""}
    save_file(tensors, path, metadata=meta)
    header = read_header(path)
    assert header["__metadata__"] == meta
    assert read_metadata(path) == meta
    for key, arr in tensors.items():
        assert header[key]["dtype"] == name and header[key]["shape"] == list(arr.shape)
    loaded = load_file(path)
    assert list(loaded) == sorted(tensors)
    for key, arr in tensors.items():
        got = loaded[key]
        _assert_same(got, arr)
        assert isinstance(got, np.ndarray)
        assert got.flags.writeable and got.flags.c_contiguous and got.flags.owndata
    assert path.read_bytes() == save_bytes(tensors, meta)
    assert file_sha256(path) == hashlib.sha256(path.read_bytes()).hexdigest()


def test_loaded_arrays_are_independent_copies(tmp_path):
    path = tmp_path / "t.safetensors"
    save_file({"a": np.arange(6, dtype=np.int32)}, path)
    first = load_file(path)["a"]
    assert isinstance(first, np.ndarray)
    first[:] = -1
    second = load_file(path)["a"]
    assert np.array_equal(second, np.arange(6, dtype=np.int32))


def test_non_native_byte_order_is_written_little_endian(tmp_path):
    big = np.arange(5, dtype=">i4")
    out = load_bytes(save_bytes({"x": big}))["x"]
    assert isinstance(out, np.ndarray)
    assert out.dtype == np.int32 and np.array_equal(out, np.arange(5))
    assert save_bytes({"x": big}) == save_bytes({"x": np.arange(5, dtype="<i4")})


@settings(max_examples=60)
@given(data=st.data())
def test_round_trip_hypothesis(data):
    names = data.draw(st.lists(st.text(min_size=1, max_size=5).filter(lambda s: s != "__metadata__"),
                               min_size=0, max_size=4, unique=True))
    tensors: dict[str, np.ndarray | PackedFP4] = {}
    for n in names:
        shape = data.draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4))
        kind = data.draw(st.sampled_from([*NAMES, "F4"]))
        if kind == "F4":
            shape = (*shape, 2 * data.draw(st.integers(0, 3)))
            codes = data.draw(hnp.arrays(np.uint8, shape, elements=st.integers(0, 15)))
            tensors[n] = PackedFP4.from_codes(codes)
        elif kind == "BOOL":
            tensors[n] = data.draw(hnp.arrays(np.bool_, shape))
        else:
            dt = EXPECTED_TABLE[kind]
            size = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
            raw = data.draw(st.binary(min_size=size, max_size=size))
            tensors[n] = np.frombuffer(raw, np.uint8).copy().view(dt).reshape(shape)
    meta = data.draw(st.none() | st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=3))
    blob = save_bytes(tensors, meta)
    (n_header,) = struct.unpack("<Q", blob[:8])
    assert (8 + n_header) % 8 == 0
    loaded = load_bytes(blob)
    assert list(loaded) == sorted(tensors)
    for n, t in tensors.items():
        _assert_same(loaded[n], t)
        assert tensor_sha256(loaded[n]) == tensor_sha256(t)
    # reversed insertion order: same bytes
    assert save_bytes(dict(reversed(list(tensors.items()))), meta) == blob


# ----------------------------------------------------------------------------------------------
# Exact bytes and determinism
# ----------------------------------------------------------------------------------------------

def test_hand_derived_file(tmp_path):
    path = tmp_path / "tiny.safetensors"
    save_file({"b": np.array([1, 2], np.uint16), "a": np.array([[-1]], np.int8)}, path, metadata={"k": "v"})
    header = (b'{"__metadata__":{"k":"v"},'
              b'"a":{"data_offsets":[0,1],"dtype":"I8","shape":[1,1]},'
              b'"b":{"data_offsets":[1,5],"dtype":"U16","shape":[2]}}')
    assert len(header) == 133
    padded = header + b"   "  # 8 + 136 = 144 = 18 * 8
    expected = (b"\x88\x00\x00\x00\x00\x00\x00\x00"  # 136, little-endian u64
                + padded
                + b"\xff"                       # a: int8 -1
                + b"\x01\x00\x02\x00")          # b: uint16 1, 2 little-endian
    assert path.read_bytes() == expected


def test_empty_file_without_metadata():
    blob = save_bytes({})
    assert blob == b"\x08\x00\x00\x00\x00\x00\x00\x00{}      "
    assert load_bytes(blob) == {}


def test_determinism_regardless_of_insertion_order(tmp_path):
    items = [("zeta", _random(np.dtype(np.float32), (3, 2), 1)),
             ("alpha", _random(np.dtype(ml_dtypes.bfloat16), (5,), 2)),
             ("Mid", PackedFP4.from_codes(np.arange(8).reshape(2, 4))),
             ("beta", np.array(True))]
    meta_a = {"y": "1", "x": "2"}
    meta_b = {"x": "2", "y": "1"}
    p1, p2 = tmp_path / "1.safetensors", tmp_path / "2.safetensors"
    save_file(dict(items), p1, meta_a)
    save_file(dict(reversed(items)), p2, meta_b)
    assert p1.read_bytes() == p2.read_bytes()
    assert file_sha256(p1) == file_sha256(p2)
    header = read_header(p1)
    order = sorted((v["data_offsets"][0], k) for k, v in header.items() if k != "__metadata__")
    assert [k for _, k in order] == sorted(k for k, _ in items)


# ----------------------------------------------------------------------------------------------
# Packed FP4
# ----------------------------------------------------------------------------------------------

def test_packed_fp4_layout_and_header(tmp_path):
    values = np.array([1.5, -2, 0.5, 6], dtype=ml_dtypes.float4_e2m1fn)
    p = PackedFP4.from_codes(values)
    assert p.data.dtype == np.int8 and p.data.shape == (2,) and p.shape == (4,)
    assert p.data.view(np.uint8).tolist() == [0xC3, 0x71]
    assert np.array_equal(p.codes(), values.view(np.uint8))
    path = tmp_path / "f4.safetensors"
    save_file({"w": p}, path)
    assert read_header(path)["w"] == {"dtype": "F4", "shape": [4], "data_offsets": [0, 2]}
    assert path.read_bytes()[-2:] == b"\xc3\x71"
    loaded = load_file(path)["w"]
    assert isinstance(loaded, PackedFP4) and loaded == p
    two_d = PackedFP4.from_codes(np.arange(16).reshape(2, 8))
    blob = save_bytes({"m": two_d})
    assert _header_of(blob)["m"]["shape"] == [2, 8]
    got = load_bytes(blob)["m"]
    assert isinstance(got, PackedFP4) and got.data.shape == (2, 4) and got == two_d
    assert np.array_equal(got.codes(), np.arange(16).reshape(2, 8))


def test_packed_fp4_validation():
    assert PackedFP4(np.array([1, 2], np.uint8)).data.dtype == np.int8
    with pytest.raises(SafetensorsError):
        PackedFP4(np.array([1, 2], np.int16))
    with pytest.raises(SafetensorsError):
        PackedFP4(np.array(1, np.int8))
    with pytest.raises(SafetensorsError):
        PackedFP4.from_codes(np.arange(3))
    with pytest.raises(SafetensorsError):
        PackedFP4.from_codes(np.array([0, 16]))
    with pytest.raises(TypeError):
        hash(PackedFP4(np.zeros(1, np.int8)))


# ----------------------------------------------------------------------------------------------
# Strict reader
# ----------------------------------------------------------------------------------------------

def _entry(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


CORRUPT_HEADERS = {
    "unknown dtype": ({"a": _entry("C64", [1], 0, 8)}, bytes(8)),
    "fnuz dtype": ({"a": _entry("F8_E4M3FNUZ", [1], 0, 1)}, bytes(1)),
    "hole": ({"a": _entry("U8", [2], 0, 2), "b": _entry("U8", [2], 3, 5)}, bytes(5)),
    "overlap": ({"a": _entry("I32", [1], 0, 4), "b": _entry("I32", [1], 2, 6)}, bytes(6)),
    "zero-size inside another": ({"a": _entry("I32", [2], 0, 8), "b": _entry("I32", [0], 4, 4)}, bytes(8)),
    "not from 0": ({"a": _entry("U8", [2], 1, 3)}, bytes(3)),
    "size mismatch": ({"d": _entry("BF16", [2, 3], 0, 10)}, bytes(10)),
    "trailing bytes": ({"a": _entry("U8", [2], 0, 2)}, bytes(3)),
    "past end": ({"a": _entry("U8", [4], 0, 4)}, bytes(2)),
    "end before begin": ({"a": _entry("U8", [0], 2, 0)}, b""),
    "negative dim": ({"a": _entry("U8", [-1], 0, 0)}, b""),
    "float dim": ({"a": _entry("U8", [1.0], 0, 1)}, bytes(1)),
    "bool dim": ({"a": _entry("U8", [True], 0, 1)}, bytes(1)),
    "shape not list": ({"a": _entry("U8", 1, 0, 1)}, bytes(1)),
    "offsets wrong length": ({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0]}}, bytes(1)),
    "dtype not str": ({"a": _entry(5, [1], 0, 1)}, bytes(1)),
    "missing key": ({"a": {"dtype": "U8", "shape": [1]}}, bytes(1)),
    "extra key": ({"a": {**_entry("U8", [1], 0, 1), "extra": 1}}, bytes(1)),
    "entry not object": ({"a": [1, 2]}, b""),
    "empty name": ({"": _entry("U8", [1], 0, 1)}, bytes(1)),
    "F4 odd last dim": ({"a": _entry("F4", [3], 0, 1)}, bytes(1)),
    "F4 0-d": ({"a": _entry("F4", [], 0, 0)}, b""),
    "metadata not str": ({"__metadata__": {"k": 1}}, b""),
    "metadata not object": ({"__metadata__": ["k"]}, b""),
}


@pytest.mark.parametrize("case", sorted(CORRUPT_HEADERS))
def test_strict_reader_rejects_bad_headers(tmp_path, case):
    header, data = CORRUPT_HEADERS[case]
    path = tmp_path / "bad.safetensors"
    path.write_bytes(_raw_file(header, data))
    for reader in (load_file, read_header, read_metadata):
        with pytest.raises(SafetensorsError) as info:
            reader(path)
        assert str(path) in str(info.value)
        assert isinstance(info.value, ValueError) and isinstance(info.value, RuntimeError)
    with pytest.raises(SafetensorsError):
        load_bytes(_raw_file(header, data))


def test_size_mismatch_message(tmp_path):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(_raw_file(*CORRUPT_HEADERS["size mismatch"]))
    with pytest.raises(SafetensorsError, match=r"tensor 'd': data_offsets \[0, 10\] hold 10 bytes; "
                                               r"expected 12 for BF16 shape \[2, 3\]"):
        load_file(path)


def _valid() -> bytes:
    return save_bytes({"a": np.arange(4, dtype=np.int32), "b": np.ones(3, np.float16)}, {"k": "v"})


RAW_CORRUPTIONS = {
    "empty file": b"",
    "short prefix": b"\x01\x02\x03",
    "truncated buffer": _valid()[:-1],
    "truncated header": _valid()[:20],
    "extra byte": _valid() + b"\x00",
    "header length too big": struct.pack("<Q", len(_valid()) - 7) + _valid()[8:],
    "header length huge": struct.pack("<Q", 2**64 - 1) + _valid()[8:],
    "invalid JSON": struct.pack("<Q", 8) + b"{not js}",
    "zero header": struct.pack("<Q", 0),
    "invalid UTF-8": struct.pack("<Q", 8) + b'{"\xff":1}',
    "not an object": struct.pack("<Q", 8) + b"[]      ",
    "NaN constant": struct.pack("<Q", 16) + b'{"a":NaN}       ',
    "BOM": struct.pack("<Q", 8) + "\ufeff{}".encode() + b"   ",
    "bool byte 2": _raw_file({"a": _entry("BOOL", [2], 0, 2)}, b"\x01\x02"),
}


def test_duplicate_keys_rejected():
    body = b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}'
    with pytest.raises(SafetensorsError, match="duplicate key"):
        load_bytes(struct.pack("<Q", len(body)) + body + b"\x00")


@pytest.mark.parametrize("case", sorted(RAW_CORRUPTIONS))
def test_strict_reader_rejects_corrupt_files(tmp_path, case):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(RAW_CORRUPTIONS[case])
    with pytest.raises(SafetensorsError) as info:
        load_file(path)
    assert str(path) in str(info.value)
    with pytest.raises(SafetensorsError):
        load_bytes(RAW_CORRUPTIONS[case])


def test_valid_file_is_accepted_unpadded_and_out_of_order():
    header = {"b": _entry("U8", [2], 0, 2), "a": _entry("I16", [1], 2, 4), "e": _entry("F32", [0, 3], 4, 4)}
    loaded = load_bytes(_raw_file(header, b"\x01\x02\x03\x04", pad=False))
    assert list(loaded) == ["a", "b", "e"]
    assert _bytes(loaded["b"]) == b"\x01\x02" and _bytes(loaded["a"]) == b"\x03\x04"
    assert loaded["e"].shape == (0, 3)


def test_header_limit(tmp_path):
    path = tmp_path / "huge.safetensors"
    n = sft.MAX_HEADER_BYTES + 8
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", n))
        f.truncate(8 + n)  # sparse: cheap
    with pytest.raises(SafetensorsError, match="limit"):
        read_header(path)


# ----------------------------------------------------------------------------------------------
# Writer validation, overwrite and atomicity
# ----------------------------------------------------------------------------------------------

BAD_SAVES = {
    "empty name": ({"": np.zeros(1)}, None),
    "reserved name": ({"__metadata__": np.zeros(1)}, None),
    "non-str name": ({1: np.zeros(1)}, None),
    "complex": ({"a": np.zeros(2, np.complex64)}, None),
    "object": ({"a": np.array([None])}, None),
    "unpacked fp4": ({"a": np.zeros(2, ml_dtypes.float4_e2m1fn)}, None),
    "int4": ({"a": np.zeros(2, ml_dtypes.int4)}, None),
    "list": ({"a": [1, 2]}, None),
    "bool byte 2": ({"a": np.array([0, 2], np.uint8).view(np.bool_)}, None),
    "metadata value": ({"a": np.zeros(1)}, {"k": 1}),
    "metadata key": ({"a": np.zeros(1)}, {1: "v"}),
    "metadata not mapping": ({"a": np.zeros(1)}, [("k", "v")]),
    "not a mapping": ([("a", np.zeros(1))], None),
}


@pytest.mark.parametrize("case", sorted(BAD_SAVES))
def test_save_validates_before_writing(tmp_path, case):
    tensors, meta = BAD_SAVES[case]
    path = tmp_path / "out.safetensors"
    with pytest.raises(SafetensorsError):
        save_file(tensors, path, meta)
    assert os.listdir(tmp_path) == []
    with pytest.raises(SafetensorsError):
        save_bytes(tensors, meta)


def test_overwrite(tmp_path):
    path = tmp_path / "o.safetensors"
    save_file({"a": np.zeros(2, np.int8)}, path)
    old = path.read_bytes()
    with pytest.raises(SafetensorsError, match="exists"):
        save_file({"a": np.ones(2, np.int8)}, path)
    assert path.read_bytes() == old
    save_file({"a": np.ones(2, np.int8)}, path, overwrite=True)
    loaded = load_file(path)["a"]
    assert isinstance(loaded, np.ndarray) and loaded.tolist() == [1, 1]
    assert sorted(os.listdir(tmp_path)) == ["o.safetensors"]


@pytest.mark.parametrize("existing", [False, True])
def test_failed_replace_leaves_nothing(tmp_path, monkeypatch, existing):
    path = tmp_path / "f.safetensors"
    if existing:
        path.write_bytes(b"old")

    def boom(*args, **kwargs):
        raise OSError("replace failed")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="replace failed"):
        save_file({"a": np.zeros(3)}, path, overwrite=True)
    assert os.listdir(tmp_path) == (["f.safetensors"] if existing else [])
    if existing:
        assert path.read_bytes() == b"old"


def test_failure_while_writing_data_leaves_nothing(tmp_path, monkeypatch):
    path = tmp_path / "f.safetensors"

    def partial(f, prepared):
        f.write(b"partial")
        raise SafetensorsError("tensor 'x': unsupported dtype detected late")

    monkeypatch.setattr(sft, "_write_tensor_data", partial)
    with pytest.raises(SafetensorsError, match="late"):
        save_file({"a": np.zeros(3)}, path)
    assert os.listdir(tmp_path) == []


def test_pathlike_and_str_paths(tmp_path):
    save_file({"a": np.arange(3, dtype=np.uint8)}, str(tmp_path / "s.safetensors"))
    loaded = load_file(str(tmp_path / "s.safetensors"))["a"]
    assert isinstance(loaded, np.ndarray) and loaded.tolist() == [0, 1, 2]


# ----------------------------------------------------------------------------------------------
# Digests
# ----------------------------------------------------------------------------------------------

def test_tensor_sha256_canonical_encoding():
    x = np.array([1, 2], np.uint8)
    assert tensor_sha256(x) == hashlib.sha256(b'{"dtype":"U8","shape":[2]}\n\x01\x02').hexdigest()
    assert tensor_sha256(x) != tensor_sha256(x.view(np.int8))
    assert tensor_sha256(x) != tensor_sha256(x.reshape(1, 2))
    y = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert tensor_sha256(y.T) == tensor_sha256(np.ascontiguousarray(y.T))
    assert tensor_sha256(np.array(2.0, ml_dtypes.bfloat16)) == hashlib.sha256(
        b'{"dtype":"BF16","shape":[]}\n\x00\x40').hexdigest()
    p = PackedFP4.from_codes(np.array([3, 12, 1, 7]))
    assert tensor_sha256(p) == hashlib.sha256(b'{"dtype":"F4","shape":[4]}\n\xc3\x71').hexdigest()
    with pytest.raises(SafetensorsError):
        tensor_sha256(np.zeros(1, np.complex128))


# ----------------------------------------------------------------------------------------------
# Interchange with safetensors.torch
# ----------------------------------------------------------------------------------------------

def _torch_modules():
    torch = pytest.importorskip("torch")
    pytest.importorskip("safetensors")
    st_torch = pytest.importorskip("safetensors.torch")
    import safetensors

    major, minor = (int(v) for v in safetensors.__version__.split(".")[:2])
    if (major, minor) < (0, 6):
        pytest.skip("safetensors < 0.6 does not know F4 / F8_E8M0")
    if not (hasattr(torch, "float8_e8m0fnu") and hasattr(torch, "float4_e2m1fn_x2")):
        pytest.skip("torch lacks float8_e8m0fnu / float4_e2m1fn_x2")
    return torch, st_torch


def _torch_dtypes(torch) -> dict:
    return {
        "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
        "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2, "F8_E8M0": torch.float8_e8m0fnu,
        "I8": torch.int8, "U8": torch.uint8, "I16": torch.int16, "U16": torch.uint16, "I32": torch.int32,
        "U32": torch.uint32, "I64": torch.int64, "U64": torch.uint64, "BOOL": torch.bool,
        "F4": torch.float4_e2m1fn_x2,
    }


def _torch_bytes(torch, t) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


@pytest.mark.torch
def test_safetensors_torch_reads_our_files(tmp_path):
    torch, st_torch = _torch_modules()
    tdt = _torch_dtypes(torch)
    tensors: dict[str, np.ndarray | PackedFP4] = {}
    for i, name in enumerate(NAMES):
        dt = EXPECTED_TABLE[name]
        tensors[f"{name}.2d"] = _random(dt, (3, 4), i)[:, ::-1]
        tensors[f"{name}.0d"] = _random(dt, (), 100 + i)
        tensors[f"{name}.empty"] = _random(dt, (2, 0), 200 + i)
    tensors["F4.2d"] = PackedFP4.from_codes(np.random.default_rng(5).integers(0, 16, (3, 8)))
    tensors["F4.3d"] = PackedFP4.from_codes(np.random.default_rng(6).integers(0, 16, (2, 2, 4)))
    tensors["F4.empty"] = PackedFP4(np.zeros((2, 0), np.int8))
    path = tmp_path / "ours.safetensors"
    save_file(tensors, path, metadata={"origin": "deepgemm_ref"})
    loaded = st_torch.load_file(str(path))
    assert sorted(loaded) == sorted(tensors)
    for key, want in tensors.items():
        t = loaded[key]
        assert t.dtype == tdt[key.split(".")[0]], key
        storage_shape = want.data.shape if isinstance(want, PackedFP4) else want.shape
        assert tuple(t.shape) == storage_shape, key
        assert _torch_bytes(torch, t) == _bytes(want), key


@pytest.mark.torch
def test_we_read_safetensors_torch_files(tmp_path):
    torch, st_torch = _torch_modules()
    rng = np.random.default_rng(7)
    tensors = {}
    expected = {}
    for name, tdtype in _torch_dtypes(torch).items():
        for suffix, shape in (("2d", (3, 4)), ("0d", ()), ("empty", (0, 2))):
            if name == "F4" and suffix == "0d":
                continue
            itemsize = torch.empty((), dtype=tdtype).element_size()
            n = int(np.prod(shape, dtype=np.int64))
            raw = rng.integers(0, 2 if name == "BOOL" else 256, n * itemsize, dtype=np.uint8)
            if n:
                t = torch.from_numpy(raw).view(tdtype).reshape(shape)
            else:  # torch cannot view an empty byte tensor as a wider dtype
                t = torch.empty(shape, dtype=torch.uint8).view(tdtype) if name == "F4" else torch.empty(shape, dtype=tdtype)
            tensors[f"{name}.{suffix}"] = t
            expected[f"{name}.{suffix}"] = (name, shape, raw.tobytes())
    path = tmp_path / "theirs.safetensors"
    st_torch.save_file(tensors, str(path), metadata={"k": "v"})
    assert read_metadata(path) == {"k": "v"}
    loaded = load_file(path)
    assert sorted(loaded) == sorted(tensors)
    for key, (name, shape, raw) in expected.items():
        got = loaded[key]
        if name == "F4":
            assert isinstance(got, PackedFP4)
            assert got.data.shape == shape and got.shape == (*shape[:-1], 2 * shape[-1])
        else:
            assert isinstance(got, np.ndarray)
            assert got.dtype == EXPECTED_TABLE[name] and got.shape == shape
        assert _bytes(got) == raw, key
