"""DeepGEMM's quantisation utilities: byte-identical to the spec's float32 sequence.

The expected bytes come from ``tests/reference.py`` (exact rationals rounded by the scalar
specification), from hand-worked cases in the spec, and from properties.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import deepgemm_ref as dg
from deepgemm_ref import formats as fm
from deepgemm_ref.errors import DGArgumentError

from . import reference as ref

BF16 = ml_dtypes.bfloat16


def _rand(shape, seed, scale=1.0, dtype=BF16):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * scale).astype(np.float32).astype(dtype)


def _bytes(a) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint8)


# ---------------------------------------------------------------------------------------------
# against the exact-rational reference
# ---------------------------------------------------------------------------------------------

CASES = [((3, 300), 128), ((2, 96), 32), ((4, 256), 128), ((1, 64), 32)]


@pytest.mark.parametrize("division", ["cuda", "cpu"])
@pytest.mark.parametrize("use_ue8m0", [False, True])
@pytest.mark.parametrize("shape,gran_k", CASES)
@pytest.mark.parametrize("scale", [1.0, 1e-3, 300.0])
def test_per_token_cast_to_fp8_matches_reference(division, use_ue8m0, shape, gran_k, scale):
    x = _rand(shape, seed=hash((shape, gran_k)) % 1000, scale=scale)
    with dg.numerics(scale_division=division):
        q, sf = dg.per_token_cast_to_fp8(x, use_ue8m0=use_ue8m0, gran_k=gran_k)
    codes, sfs = ref.ref_per_token_cast_to_fp8(x, use_ue8m0, gran_k, division)
    assert q.dtype == ml_dtypes.float8_e4m3fn and q.shape == shape and q.flags.c_contiguous
    assert sf.dtype == np.float32 and sf.shape == (shape[0], -(-shape[1] // gran_k))
    assert np.array_equal(_bytes(q), codes)
    assert np.array_equal(sf.view(np.uint32), sfs.view(np.uint32))


@pytest.mark.parametrize("division", ["cuda", "cpu"])
@pytest.mark.parametrize("use_ue8m0", [False, True])
@pytest.mark.parametrize("shape,gran_k", CASES)
@pytest.mark.parametrize("dtype", [BF16, np.float32, np.float64])
def test_per_token_cast_to_fp4_matches_reference(division, use_ue8m0, shape, gran_k, dtype):
    x = _rand(shape, seed=7, scale=3.0, dtype=np.float64)
    if dtype is not np.float64:
        x = x.astype(np.float32).astype(dtype)
    with dg.numerics(scale_division=division):
        packed, sf = dg.per_token_cast_to_fp4(x, use_ue8m0=use_ue8m0, gran_k=gran_k)
    codes, sfs = ref.ref_per_token_cast_to_fp4(x, use_ue8m0, gran_k, division)
    assert packed.dtype == np.int8 and packed.shape == (shape[0], shape[1] // 2)
    assert np.array_equal(_bytes(packed), fm.pack_fp4(codes).view(np.uint8))
    assert np.array_equal(sf.view(np.uint32), sfs.view(np.uint32))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_per_token_cast_to_fp8_input_dtypes(dtype):
    x = _rand((2, 200), seed=3, scale=10.0, dtype=np.float64).astype(dtype)
    for division in ("cuda", "cpu"):
        with dg.numerics(scale_division=division):
            q, sf = dg.per_token_cast_to_fp8(x, use_ue8m0=False, gran_k=128)
        codes, sfs = ref.ref_per_token_cast_to_fp8(x if dtype is not np.float16 else x.astype(np.float32),
                                                    False, 128, division)
        assert np.array_equal(_bytes(q), codes)
        assert np.array_equal(sf, sfs)


def test_ties_crafted_for_fp4_and_fp8():
    """Rows whose scaled values land exactly on E2M1 and E4M3 midpoints."""
    # amax 6 -> FP4 scale exactly 1 (UE8M0) so the values are the thresholds themselves
    row = np.array([6.0, 0.75, 1.75, 3.5, -0.75, -1.75, -3.5, 0.25, -0.25, 5.0, 2.5, 1.25] + [0.0] * 20, np.float32)
    packed, sf = dg.per_token_cast_to_fp4(row[None, :], use_ue8m0=True, gran_k=32)
    assert sf[0, 0] == 1.0
    vals = fm.decode(fm.unpack_fp4(packed)[0, :12], fm.E2M1)
    assert vals.tolist() == [6, 0.5, 1.5, 3, -0.5, -1.5, -3, 0, 0, 4, 2, 1]
    assert not np.any(fm.unpack_fp4(packed) == 8)
    # E4M3: amax 448 with UE8M0 -> scale 1; 1.0625 and 1.1875 are ties
    row8 = np.array([448.0, 1.0625, 1.1875, -1.0625, 464.0 / 2, 2.0**-10] + [0.0] * 122, np.float32)
    q, sf8 = dg.per_token_cast_to_fp8(row8[None, :], use_ue8m0=True)
    assert sf8[0, 0] == 1.0
    # 232 is the tie between 224 (0x76, even mantissa) and 240 (0x77)
    assert q.view(np.uint8)[0, :6].tolist() == [0x7E, 0x38, 0x3A, 0xB8, 0x76, 0x00]


def test_trap_reciprocal_multiply_not_divide():
    """Spec trap 1: x = 5.9227166175842285, sf = 1.7548789978027344: x / sf is the tie 3.375
    (code 0x46), x * f32(1 / sf) = 3.3749998 rounds to 0x45.  Build a group whose scale is
    exactly that sf under each division option."""
    x = np.float32(5.9227166175842285)
    sf_target = np.float32(1.7548789978027344)
    assert np.float32(x / sf_target) == np.float32(3.375)
    assert np.float32(x * (np.float32(1) / sf_target)) != np.float32(3.375)
    for division in ("cuda", "cpu"):
        # search the float32 amax values near 448 * sf for one that gives sf exactly
        center = np.float32(sf_target * np.float32(448))
        cands = (center.view(np.uint32) + np.arange(-64, 65, dtype=np.int64)).astype(np.uint32).view(np.float32)
        amax = next(a for a in cands if np.float32(ref.scale_from_amax(float(a), 448, division)) == sf_target)
        row = np.zeros((1, 128), np.float32)
        row[0, 0], row[0, 1] = amax, x
        with dg.numerics(scale_division=division):
            q, sf = dg.per_token_cast_to_fp8(row, use_ue8m0=False)
        assert sf[0, 0] == sf_target
        assert q.view(np.uint8)[0, 1] == 0x45


def test_division_options_differ_only_without_ue8m0():
    x = _rand((64, 1024), seed=11, scale=2.0)
    with dg.numerics(scale_division="cuda"):
        _, sf_cuda = dg.per_token_cast_to_fp8(x, use_ue8m0=False)
        _, sfu_cuda = dg.per_token_cast_to_fp8(x, use_ue8m0=True)
    with dg.numerics(scale_division="cpu"):
        _, sf_cpu = dg.per_token_cast_to_fp8(x, use_ue8m0=False)
        _, sfu_cpu = dg.per_token_cast_to_fp8(x, use_ue8m0=True)
    assert np.array_equal(sfu_cuda, sfu_cpu)
    diff = sf_cuda != sf_cpu
    assert diff.any()  # about half the scales differ by one ulp
    ulps = np.abs(sf_cuda.view(np.int32).astype(np.int64) - sf_cpu.view(np.int32))
    assert ulps.max() == 1


def test_amax_floor_and_zero_block():
    x = np.zeros((1, 256), np.float32)
    q, sf = dg.per_token_cast_to_fp8(x, use_ue8m0=True)
    assert sf.tolist() == [[2.0**-22, 2.0**-22]]  # ceil(1e-4 / 448) = 2^-22
    assert not _bytes(q).any()
    _, sf4 = dg.per_token_cast_to_fp4(x, use_ue8m0=True)
    assert sf4.tolist() == [[2.0**-15, 2.0**-15]]
    _, sfr = dg.per_token_cast_to_fp8(x, use_ue8m0=False)
    assert sfr[0, 0] == np.float32(np.float32(1e-4) * np.float32(1 / 448))


def test_e4m3_overflow_option():
    """With CUDA-style scales a product can exceed 448 by an ulp; both options then give 448,
    and an infinite input gives 448 (saturate) or NaN (old torch)."""
    x = np.zeros((1, 128), np.float32)
    x[0, 0], x[0, 1] = np.inf, 1.0
    q, _ = dg.per_token_cast_to_fp8(x, use_ue8m0=False)
    assert q.view(np.uint8)[0, 1] == 0  # scale is inf, 1 * (1/inf) = 0
    with dg.numerics(e4m3_overflow="nan"):
        q2, _ = dg.per_token_cast_to_fp8(np.array([[np.inf] + [1.0] * 127], np.float32), use_ue8m0=True)
    with dg.numerics(e4m3_overflow="saturate"):
        q3, _ = dg.per_token_cast_to_fp8(np.array([[np.inf] + [1.0] * 127], np.float32), use_ue8m0=True)
    assert q2.view(np.uint8)[0, 0] == 0x7F and q3.view(np.uint8)[0, 0] == 0x7E


# ---------------------------------------------------------------------------------------------
# the other casts, by their relation to per_token and by reference
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("use_ue8m0", [False, True])
@pytest.mark.parametrize("gran_k", [32, 128])
def test_per_channel_is_per_token_of_transpose(use_ue8m0, gran_k):
    x = _rand((2 * gran_k, 40), seed=4, scale=5.0)
    q, sf = dg.per_channel_cast_to_fp8(x, use_ue8m0=use_ue8m0, gran_k=gran_k)
    qt, sft = dg.per_token_cast_to_fp8(np.ascontiguousarray(x.T), use_ue8m0=use_ue8m0, gran_k=gran_k)
    assert sf.shape == (2, 40)
    assert np.array_equal(_bytes(q), _bytes(np.ascontiguousarray(qt.T)))
    assert np.array_equal(sf, sft.T)


@pytest.mark.parametrize("use_ue8m0", [False, True])
def test_per_block_matches_reference(use_ue8m0):
    g = 32
    x = _rand((50, 70), seed=5, scale=2.0)
    q, sf = dg.per_block_cast_to_fp8(x, use_ue8m0=use_ue8m0, gran_k=g)
    assert q.shape == (50, 70) and sf.shape == (2, 3)
    for bi in range(2):
        for bj in range(3):
            rows = range(bi * g, min(50, (bi + 1) * g))
            cols = range(bj * g, min(70, (bj + 1) * g))
            vals = [float(x[i, j]) for i in rows for j in cols]
            s, scaled = ref.quantise_group(vals + [0.0], 448, use_ue8m0, "cuda")
            assert sf[bi, bj] == np.float32(s)
            got = [int(q.view(np.uint8)[i, j]) for i in rows for j in cols]
            assert got == [ref.e4m3_code(v) for v in scaled[: len(vals)]]


def test_per_custom_dims():
    kv = _rand((5, 64), seed=6, scale=3.0, dtype=np.float32)
    q, sf = dg.per_custom_dims_cast_to_fp8(kv, (0,), False)
    qt, sft = dg.per_token_cast_to_fp8(kv, use_ue8m0=False, gran_k=64)
    assert sf.shape == (5,) and np.array_equal(sf, sft[:, 0])
    assert np.array_equal(_bytes(q), _bytes(qt))
    # one token: squeeze gives a 0-d scale
    _, sf1 = dg.per_custom_dims_cast_to_fp8(kv[:1], (0,), True)
    assert sf1.shape == ()
    # dims covering every axis leave no axis to reduce, and torch's amax(dim=()) then reduces
    # over all of them (NumPy's max(axis=()) would reduce none): one scale, like dims=()
    _, sf_all = dg.per_custom_dims_cast_to_fp8(kv, (0, 1), False)
    _, sf_none = dg.per_custom_dims_cast_to_fp8(kv, (), False)
    assert sf_none.shape == () and sf_none == np.float32(np.abs(kv).max() * np.float32(1 / 448))
    assert sf_all.shape == () and sf_all == sf_none


# ---------------------------------------------------------------------------------------------
# UE8M0 helpers
# ---------------------------------------------------------------------------------------------

def test_ceil_to_ue8m0_cases():
    x = np.array([1.0, 1.0000001, 0.75, 0.0, 1e-45, 3e38, np.inf, -3.0, 2.0**-126], np.float32)
    got = dg.ceil_to_ue8m0(x)
    assert got.dtype == np.float32
    assert got.tolist() == [1.0, 2.0, 1.0, 2.0**-126, 2.0**-126, 2.0**127, 2.0**127, 4.0, 2.0**-126]
    # spec trap 4: not np.ceil(np.log2(x))
    v = np.float32(256 * (1 + 2**-23))
    assert dg.ceil_to_ue8m0(np.array([v]))[0] == 512.0


def test_pack_unpack_ue8m0():
    sf = np.array([[2.0**-127 * 2, 1.0, 2.0, 0.5, 2.0**10, 2.0**-20, 1.0, 1.0]], np.float32)
    packed = dg.pack_ue8m0_to_int(sf)
    assert packed.dtype == np.int32 and packed.shape == (1, 2)
    assert [int(v) & 0xFFFFFFFF for v in packed[0]] == [0x7E807F01, 0x7F7F6B89]
    back = dg.unpack_ue8m0_from_int(packed)
    assert np.array_equal(back, sf)
    # byte 0 -> 0.0 and byte 255 -> inf (DeepGEMM's float reading)
    z = dg.unpack_ue8m0_from_int(np.array([0x00FF0000 | 0x7F], np.int32))
    assert z.tolist() == [2.0**0, 0.0, math.inf, 0.0]


def test_pack_ue8m0_rejects_non_powers_of_two():
    for bad in ([1.5, 1, 1, 1], [-1.0, 1, 1, 1], [1.0, 1.0, 1.0]):
        with pytest.raises(AssertionError):
            dg.pack_ue8m0_to_int(np.array([bad], np.float32))
    with pytest.raises(DGArgumentError):
        dg.pack_ue8m0_to_int(np.array([[1, 1, 1, 1]], np.float64))


def test_fp4_packed_scales_padded_with_one():
    x = _rand((3, 64), seed=9)
    packed, sf = dg.per_token_cast_to_fp4(x, use_ue8m0=True, gran_k=32, use_packed_ue8m0=True)
    _, sf_f = dg.per_token_cast_to_fp4(x, use_ue8m0=True, gran_k=32)
    assert sf.shape == (3, 1)
    b = fm.unpack_ue8m0_int32(sf)
    assert np.array_equal(b[:, 2:], np.full((3, 2), 127, np.uint8))
    assert np.array_equal(b[:, :2], (sf_f.view(np.uint32) >> 23).astype(np.uint8))


def test_fp8_packed_scales_require_multiple_of_four():
    with pytest.raises(AssertionError):
        dg.per_token_cast_to_fp8(_rand((2, 256), 1), use_ue8m0=True, gran_k=128, use_packed_ue8m0=True)
    q, sf = dg.per_token_cast_to_fp8(_rand((2, 512), 1), use_ue8m0=True, gran_k=128, use_packed_ue8m0=True)
    assert sf.dtype == np.int32 and sf.shape == (2, 1)


# ---------------------------------------------------------------------------------------------
# FP4 transpose and cast back
# ---------------------------------------------------------------------------------------------

def test_transpose_packed_fp4_by_hand():
    codes = np.arange(16, dtype=np.uint8).reshape(4, 4)  # element (i, j) has code 4i + j
    packed = fm.pack_fp4(codes)
    t = dg.transpose_packed_fp4(packed)
    assert t.shape == (4, 2) and t.dtype == np.int8
    # byte [j, i] = codes (2i, j) low, (2i + 1, j) high
    for j in range(4):
        for i in range(2):
            assert int(t.view(np.uint8)[j, i]) == codes[2 * i, j] | (codes[2 * i + 1, j] << 4)
    assert np.array_equal(dg.transpose_packed_fp4(t), packed)


def test_cast_back_from_fp4():
    x = _rand((4, 96), seed=10, scale=4.0)
    packed, sf = dg.per_token_cast_to_fp4(x, use_ue8m0=True, gran_k=32)
    back = dg.cast_back_from_fp4(packed, sf, gran_k=32)
    codes = fm.unpack_fp4(packed)
    mag = fm.decode(codes & 7, fm.E2M1)
    val = np.where((codes & 8) != 0, -mag, mag) * np.repeat(sf.astype(np.float64), 32, axis=1)
    assert back.dtype == np.float32 and np.array_equal(back, val.astype(np.float32))
    p2, s2 = dg.per_token_cast_to_fp4(x, use_ue8m0=True, gran_k=32, use_packed_ue8m0=True)
    assert np.array_equal(dg.cast_back_from_fp4(p2, s2, gran_k=32, use_packed_ue8m0=True), back)
    # code 8 decodes to +0
    z = dg.cast_back_from_fp4(np.array([[0x08]], np.int8).view(np.int8), np.ones((1, 1), np.float32), gran_k=32)
    assert z.tolist() == [[0.0, 0.0]] and not np.signbit(z).any()


# ---------------------------------------------------------------------------------------------
# properties
# ---------------------------------------------------------------------------------------------

rows = st.integers(1, 4)
cols = st.sampled_from([32, 64, 96, 128, 200])


@given(rows, cols, st.integers(0, 2**32 - 1), st.sampled_from([32, 128]), st.booleans())
def test_sign_symmetry(m, n, seed, gran_k, use_ue8m0):
    x = _rand((m, n), seed)
    q, sf = dg.per_token_cast_to_fp8(x, use_ue8m0=use_ue8m0, gran_k=gran_k)
    qn, sfn = dg.per_token_cast_to_fp8(-x, use_ue8m0=use_ue8m0, gran_k=gran_k)
    assert np.array_equal(sf, sfn)
    assert np.array_equal(_bytes(qn), _bytes(q) ^ 0x80)
    if n % 2 == 0:
        p, _ = dg.per_token_cast_to_fp4(x, use_ue8m0=use_ue8m0, gran_k=gran_k)
        pn, _ = dg.per_token_cast_to_fp4(-x, use_ue8m0=use_ue8m0, gran_k=gran_k)
        c, cn = fm.unpack_fp4(p), fm.unpack_fp4(pn)
        assert np.array_equal(cn, np.where((c & 7) == 0, 0, c ^ 8))


@given(rows, cols, st.integers(0, 2**32 - 1), st.integers(-20, 20))
def test_power_of_two_scale_invariance(m, n, seed, e):
    """With UE8M0 scales, x * 2^e gives the same codes and scales * 2^e (no floor, no overflow)."""
    x = _rand((m, n), seed, scale=1.0, dtype=np.float32) + np.float32(0.5)
    assume(np.abs(x).max(axis=1).min() * 2.0**e > 1e-3)  # the 1e-4 amax floor is not reached
    q, sf = dg.per_token_cast_to_fp8(x, use_ue8m0=True)
    q2, sf2 = dg.per_token_cast_to_fp8(x * np.float32(2.0**e), use_ue8m0=True)
    assert np.array_equal(_bytes(q), _bytes(q2))
    assert np.array_equal(sf * np.float32(2.0**e), sf2)


@given(rows, cols, st.integers(0, 2**32 - 1))
def test_idempotent_on_dequantised_values(m, n, seed):
    """Quantising the dequantised values again gives the same dequantised values; the same bytes
    too, unless a group's largest code is 224 (then ceil(amax / 448) halves the scale)."""
    x = _rand((m, n), seed, scale=3.0, dtype=np.float32)

    def deq(q, sf):
        return (fm.decode(_bytes(q), fm.E4M3) * np.repeat(sf.astype(np.float64), 128, axis=1)[:, :n]).astype(np.float32)

    q, sf = dg.per_token_cast_to_fp8(x, use_ue8m0=True)
    d1 = deq(q, sf)
    q2, sf2 = dg.per_token_cast_to_fp8(d1, use_ue8m0=True)
    assert np.array_equal(deq(q2, sf2), d1)
    v = np.abs(fm.decode(_bytes(q), fm.E4M3))
    for g in range(sf.shape[1]):
        cols = slice(128 * g, min(n, 128 * (g + 1)))
        same = v[:, cols].max(axis=1) > 224
        assert np.array_equal(_bytes(q)[same, cols], _bytes(q2)[same, cols])
        assert np.array_equal(sf[same, g], sf2[same, g])


@given(rows, cols, st.integers(0, 2**32 - 1), st.booleans(), st.sampled_from(["cuda", "cpu"]))
def test_dequantised_error_at_most_half_a_step(m, n, seed, use_ue8m0, division):
    x = _rand((m, n), seed, scale=2.0, dtype=np.float32)
    with dg.numerics(scale_division=division):
        q, sf = dg.per_token_cast_to_fp8(x, use_ue8m0=use_ue8m0)
    inv = (np.float32(1) / sf).astype(np.float32)
    y = (x.reshape(m, -1) * np.repeat(inv, 128, axis=1)[:, :n]).astype(np.float64)  # the scaled values
    v = fm.decode(_bytes(q), fm.E4M3)
    # step of E4M3 at |v|: 2^(floor(log2|v|) - 3), at least the subnormal step 2^-9
    step = np.where(v == 0, 2.0**-9, np.exp2(np.maximum(np.floor(np.log2(np.maximum(np.abs(v), 2.0**-9))), -6) - 3))
    assert np.all(np.abs(y - v) <= step / 2)


# ---------------------------------------------------------------------------------------------
# bad input: the argument error, nothing modified
# ---------------------------------------------------------------------------------------------

BAD_CALLS = [
    ("per_token_cast_to_fp8", lambda x: dg.per_token_cast_to_fp8(x[0], use_ue8m0=True)),  # 1-D
    ("per_token_cast_to_fp8", lambda x: dg.per_token_cast_to_fp8(x, use_ue8m0=True, gran_k=0)),
    ("per_token_cast_to_fp8", lambda x: dg.per_token_cast_to_fp8(x.astype(np.int32), use_ue8m0=True)),
    ("per_channel_cast_to_fp8", lambda x: dg.per_channel_cast_to_fp8(x, use_ue8m0=True)),  # rows % 128
    ("per_token_cast_to_fp4", lambda x: dg.per_token_cast_to_fp4(x[:, :5], use_ue8m0=True)),  # odd n
    ("per_token_cast_to_fp4", lambda x: dg.per_token_cast_to_fp4(x, use_ue8m0=False, use_packed_ue8m0=True)),
    ("transpose_packed_fp4", lambda x: dg.transpose_packed_fp4(x)),  # not int8
    ("transpose_packed_fp4", lambda x: dg.transpose_packed_fp4(np.zeros((3, 2), np.int8))),  # odd rows
    ("cast_back_from_fp4", lambda x: dg.cast_back_from_fp4(np.zeros((3, 2), np.int8), np.ones((2, 1), np.float32))),
]


@pytest.mark.parametrize("name,call", BAD_CALLS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(BAD_CALLS)])
def test_bad_input_raises_and_leaves_input_unchanged(name, call):
    x = _rand((4, 64), seed=1, dtype=np.float32)
    before = x.copy()
    with pytest.raises(DGArgumentError) as info:
        call(x)
    assert isinstance(info.value, (ValueError, RuntimeError, AssertionError))
    assert name in str(info.value)
    assert np.array_equal(x.view(np.uint32), before.view(np.uint32))


def test_names_reachable_from_utils():
    for name in ("per_token_cast_to_fp8", "per_token_cast_to_fp4", "ceil_to_ue8m0", "transpose_packed_fp4",
                 "cast_back_from_fp4", "ceil_div", "align"):
        assert getattr(dg.utils, name) is getattr(dg, name)
        assert getattr(dg.utils.math, name) is getattr(dg, name)
    assert dg.ceil_div(7, 2) == 4 and dg.align(7, 4) == 8 and dg.align(8, 4) == 8


# ---------------------------------------------------------------------------------------------
# review findings: degenerate inputs get the utility error, naming the argument
# ---------------------------------------------------------------------------------------------

def test_degenerate_inputs_raise_the_utility_error():
    """A zero-size reduction (torch's amax refuses it), a 0-d or non-unit-stride packed SF (torch's
    uint8 view refuses them) and an odd padded FP4 width (DeepGEMM's pair view fails) raise
    DGUtilityError (ValueError, RuntimeError and AssertionError) naming the argument."""
    from deepgemm_ref.errors import DGUtilityError

    cases = [
        (lambda: dg.per_custom_dims_cast_to_fp8(np.zeros((0, 4), np.float32), (1,), True), "x"),
        (lambda: dg.unpack_ue8m0_from_int(np.array(1, np.int32)), "packed_sf"),
        (lambda: dg.unpack_ue8m0_from_int(np.zeros((4, 2), np.int32).T), "packed_sf"),
        (lambda: dg.per_token_cast_to_fp4(np.ones((2, 8), np.float32), True, gran_k=3), "gran_k"),
    ]
    for call, arg in cases:
        with pytest.raises(DGUtilityError, match=f": {arg}: expected") as info:
            call()
        assert isinstance(info.value, (ValueError)) and isinstance(info.value, RuntimeError)
        assert isinstance(info.value, AssertionError)
    # the non-degenerate neighbours still work
    assert dg.per_custom_dims_cast_to_fp8(np.zeros((0, 4), np.float32), (0,), True)[0].shape == (0, 4)
    assert dg.unpack_ue8m0_from_int(np.zeros((4, 1), np.int32).T).shape == (1, 16)
    assert dg.per_token_cast_to_fp4(np.ones((2, 8), np.float32), True, gran_k=2)[0].shape == (2, 4)


def test_zero_dim_inputs_keep_zero_dims():
    q, sf = dg.per_custom_dims_cast_to_fp8(np.array(3.0, np.float32), (), False)
    assert q.shape == () and sf.shape == () and isinstance(sf, np.ndarray)
    assert float(q) == 448.0 and sf == np.float32(3.0) * np.float32(1 / 448)  # default "cuda" division
    r = dg.ceil_to_ue8m0(np.array(3.0, np.float32))
    assert r.shape == () and r == 4.0


@pytest.mark.parametrize("dtype", [np.float32, np.float64, BF16])
@pytest.mark.parametrize("use_ue8m0", [False, True])
def test_per_block_wide_range_every_input_dtype(dtype, use_ue8m0):
    """Blocks whose values span many binades (E4M3 subnormals and zeros after scaling), a block
    of zeros (the amax floor), partial blocks in both dimensions: bytes of the reference."""
    g = 16
    rng = np.random.default_rng(12)
    x = (rng.standard_normal((37, 45)) * np.exp2(rng.integers(-30, 30, (37, 45)))).astype(np.float32).astype(dtype)
    x[:16, 16:32] = 0
    q, sf = dg.per_block_cast_to_fp8(x, use_ue8m0=use_ue8m0, gran_k=g)
    assert q.shape == (37, 45) and sf.shape == (3, 3)
    wide64 = np.dtype(dtype) == np.float64
    for bi in range(3):
        for bj in range(3):
            rows = range(bi * g, min(37, (bi + 1) * g))
            cols = range(bj * g, min(45, (bj + 1) * g))
            vals = [float(x[i, j]) for i in rows for j in cols]
            s, scaled = ref.quantise_group(vals + [0.0], 448, use_ue8m0, "cuda", wide64)
            assert sf[bi, bj] == np.float32(s)
            got = [int(q.view(np.uint8)[i, j]) for i in rows for j in cols]
            assert got == [ref.e4m3_code(v) for v in scaled[: len(vals)]]


@pytest.mark.torch
@pytest.mark.parametrize("dtype", ["bfloat16", "float32", "float64"])
@pytest.mark.parametrize("use_ue8m0", [False, True])
@pytest.mark.parametrize("division", ["cpu", "cuda"])
def test_per_block_matches_the_torch_algorithm(dtype, use_ue8m0, division):
    torch = pytest.importorskip("torch")
    from . import torch_reference as tref

    g = torch.Generator().manual_seed(13)
    for shape, gran_k in (((300, 700), 128), ((64, 96), 32)):
        x = (torch.randn(shape, generator=g, dtype=torch.float64) * torch.exp2(torch.randint(-20, 20, shape,
                                                                                            generator=g))).to(
            getattr(torch, dtype))
        qt, st = tref.per_block_cast_to_fp8(x, use_ue8m0, gran_k, division)
        xn = x.view(torch.int16).numpy().view(BF16) if dtype == "bfloat16" else x.numpy()
        with dg.numerics(scale_division=division):
            qn, sn = dg.per_block_cast_to_fp8(xn, use_ue8m0=use_ue8m0, gran_k=gran_k)
        assert np.array_equal(_bytes(qn), qt.view(torch.uint8).numpy())
        assert np.array_equal(sn.view(np.uint32), st.float().numpy().view(np.uint32))


def _special_groups(rows: int, groups: int, gran: int, top: float, grid: np.ndarray, seed: int) -> np.ndarray:
    """(rows, groups * gran) float64: each group one recipe of values that stress a quantiser.

    top:  the format's largest magnitude (448 or 6); grid: its non-negative values.  Recipes: an
    amax of ``top * 2^e`` with the other elements on the format's rounding ties times ``2^e``
    (subnormal ties included, signed zeros, e across float32's range); NaN; +-inf; bfloat16 /
    float32 subnormals only; values just around the saturation boundary.
    """
    rng = np.random.default_rng(seed)
    mids = (grid[1:] + grid[:-1]) / 2
    x = np.zeros((rows, groups * gran))
    for i in range(rows):
        for g in range(groups):
            kind = rng.integers(6)
            e = int(rng.integers(-140, 118))
            v = rng.choice(np.concatenate([mids, grid, [0.0]]), gran) * rng.choice([-1.0, 1.0], gran)
            v[rng.integers(gran)] = top * rng.choice([-1.0, 1.0])
            v = v * 2.0**e
            if kind == 1:
                v[rng.integers(gran)] = np.nan
            elif kind == 2:
                v[rng.integers(gran)] = rng.choice([np.inf, -np.inf])
            elif kind == 3:
                v = rng.integers(-127, 128, gran) * 2.0**-133  # bf16 subnormals (and float32 ones)
            elif kind == 4:
                v = top * 2.0**e * (1 + rng.integers(-8, 9, gran) * 2.0**-6)
            x[i, g * gran:(g + 1) * gran] = v
    return x


def _nan_class(a: np.ndarray) -> np.ndarray:
    """Bytes of E4M3 codes (uint8) or float32 scales with every NaN made one value: NaN compares
    by class and position (its sign bit follows the CPU's NaN propagation, not DeepGEMM's math)."""
    if a.dtype == np.uint8:
        return np.where((a & 0x7F) == 0x7F, 0x7F, a)
    return np.where(np.isnan(a), np.uint32(0x7FC00000), a.view(np.uint32))


@pytest.mark.torch
@pytest.mark.parametrize("dtype", ["bfloat16", "float32", "float64"])
@pytest.mark.parametrize("use_ue8m0", [False, True])
@pytest.mark.parametrize("division", ["cpu", "cuda"])
def test_quantisers_match_torch_on_special_values(dtype, use_ue8m0, division):
    """NaN, inf, subnormals, rounding ties and saturation: every quantiser's bytes equal the
    torch algorithm's (DeepGEMM's utilities run by torch on the CPU, tests/torch_reference.py)."""
    torch = pytest.importorskip("torch")
    from . import torch_reference as tref

    def torch_x(x64: np.ndarray):
        return torch.from_numpy(x64).to(getattr(torch, dtype))

    def numpy_x(xt):
        return xt.view(torch.int16).numpy().view(BF16) if dtype == "bfloat16" else xt.numpy()

    e4m3 = np.unique(np.abs(np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)))
    e4m3 = e4m3[np.isfinite(e4m3)]
    e2m1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    for gran in (32, 128):
        xt = torch_x(_special_groups(40, 4, gran, 448.0, e4m3, seed=gran))
        qt, st = tref.per_token_cast_to_fp8(xt, use_ue8m0, gran, division)
        bt, bs = tref.per_block_cast_to_fp8(xt, use_ue8m0, gran, division)
        with dg.numerics(scale_division=division):
            qn, sn = dg.per_token_cast_to_fp8(numpy_x(xt), use_ue8m0=use_ue8m0, gran_k=gran)
            bn, bsn = dg.per_block_cast_to_fp8(numpy_x(xt), use_ue8m0=use_ue8m0, gran_k=gran)
        assert np.array_equal(_nan_class(_bytes(qn)), _nan_class(qt.view(torch.uint8).numpy()))
        assert np.array_equal(_nan_class(sn), _nan_class(st.numpy()))
        assert np.array_equal(_nan_class(_bytes(bn)), _nan_class(bt.view(torch.uint8).numpy()))
        assert np.array_equal(_nan_class(bsn), _nan_class(bs.float().numpy()))
        xt = torch_x(_special_groups(40, 4, gran, 6.0, e2m1, seed=gran + 1))
        pt, s4 = tref.per_token_cast_to_fp4(xt, use_ue8m0, gran, division)
        with dg.numerics(scale_division=division):
            pn, s4n = dg.per_token_cast_to_fp4(numpy_x(xt), use_ue8m0=use_ue8m0, gran_k=gran)
        assert np.array_equal(pn, pt.numpy())
        assert np.array_equal(_nan_class(s4n), _nan_class(s4.numpy()))


def _bf16_bit_patterns(seed: int) -> list[np.ndarray]:
    """bf16 inputs for the bit-pattern fast path: every bit pattern at random (NaNs, infinities,
    subnormals, -0), the same without NaN, signed zeros only, subnormals only, values near
    bf16's top, a strided view, and normals with an infinity."""
    rng = np.random.default_rng(seed)
    m, n = 9, 256
    every = rng.integers(0, 1 << 16, (m, n)).astype(np.uint16).view(BF16)
    no_nan = every.copy()
    no_nan[np.isnan(no_nan.astype(np.float32))] = 0
    zeros = np.where(rng.random((m, n)) < 0.5, -0.0, 0.0).astype(np.float32).astype(BF16)
    sub = rng.integers(1, 128, (m, n)).astype(np.uint16) | rng.choice([0, 0x8000], (m, n)).astype(np.uint16)
    big = (rng.integers(0x7E00, 0x7F80, (m, n)).astype(np.uint16) | rng.choice([0, 0x8000], (m, n)).astype(np.uint16))
    normal = rng.standard_normal((m, n), dtype=np.float32).astype(BF16)
    with_inf = normal.copy()
    with_inf[2, 5], with_inf[4, 200] = np.inf, -np.inf
    wide = rng.standard_normal((m, 2 * n), dtype=np.float32).astype(BF16)
    return [every, no_nan, zeros, sub.view(BF16), big.view(BF16), normal, with_inf, wide[:, ::2], wide[:, n // 2:-n // 2]]


@pytest.mark.parametrize("func", ["per_token_cast_to_fp8", "per_token_cast_to_fp4", "per_block_cast_to_fp8"])
def test_bf16_bit_pattern_path_equals_float_path(func):
    """bf16 inputs take the bit-pattern path (amax from the sign-cleared bits, widening by a shift,
    pairs packed through uint16): the same bytes as the float path, which a float32 copy of the
    same values takes (widening bf16 is exact)."""
    for x in _bf16_bit_patterns(3):
        for use_ue8m0 in (False, True):
            for gran_k in (32, 128):
                for division in ("cuda", "cpu"):
                    with dg.numerics(scale_division=division):
                        got = getattr(dg, func)(x, use_ue8m0, gran_k)
                        want = getattr(dg, func)(x.astype(np.float32), use_ue8m0, gran_k)
                    for g, w in zip(got, want, strict=True):
                        assert g.dtype == w.dtype and g.shape == w.shape
                        assert _bytes(g).tobytes() == _bytes(w).tobytes(), (func, use_ue8m0, gran_k, division)
