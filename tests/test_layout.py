"""SF layouts: every byte, stride and alias of the layout helpers and transforms of both targets.

Expected bytes are written out by hand from the layout definitions (spec 3.3, port 1.3):
UE8M0 byte = float32 exponent field, 0x7F = 1.0.  Strides are in elements.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import deepgemm_ref as dg
from deepgemm_ref import layout as L
from deepgemm_ref.errors import DGArgumentError
from deepgemm_ref.toolkit import scales


def _es(a) -> tuple[int, ...]:
    """Element strides of a NumPy array or torch tensor."""
    if hasattr(a, "stride") and callable(a.stride):
        return tuple(a.stride())
    return tuple(s // a.itemsize for s in a.strides)


def _w32(*b: int) -> int:
    """An int32 word from little-endian bytes b0, b1, ... (missing bytes 0)."""
    v = sum(x << (8 * j) for j, x in enumerate(b))
    return int(np.array(v, np.uint32).view(np.int32))


def _w16(lo: int, hi: int = 0) -> int:
    return int(np.array(lo | (hi << 8), np.uint16).view(np.int16))


def _pow2(e: np.ndarray) -> np.ndarray:
    """float32 with exponent bytes e (e = 0 gives 0.0)."""
    return (np.asarray(e, np.uint32) << 23).view(np.float32)


def _storage(view: np.ndarray) -> np.ndarray:
    """The padded allocation a layout view lives in."""
    base = view
    while base.base is not None:
        base = base.base
    return base[0] if base.ndim == view.ndim + 1 else base  # 2-D results live in a (1, ...) allocation


SF_2x5 = np.array([[1.0, 2.0, 0.5, 4.0, 8.0], [0.25, 1.0, 1.0, 2.0, 0.0]], np.float32)
# exponent bytes:    7F   80   7E   81   82          7D   7F   7F   80   00


# ---------------------------------------------------------------------------------------------
# get_tma_aligned_size
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("x,elem,want", [(0, 4, 0), (1, 4, 4), (4, 4, 4), (5, 4, 8), (7, 2, 8), (9, 1, 16),
                                         (3, 8, 4), (3, 16, 3), (4097, 4, 4100)])
def test_get_tma_aligned_size(x, elem, want):
    assert dg.get_tma_aligned_size(x, elem) == want


def test_get_tma_aligned_size_rejects():
    for elem in (3, 0, 32):
        with pytest.raises(DGArgumentError, match="get_tma_aligned_size: element_size"):
            dg.get_tma_aligned_size(8, elem)
    with pytest.raises(DGArgumentError, match="get_tma_aligned_size: x"):
        dg.get_tma_aligned_size(-1, 4)
    with pytest.raises(TypeError):  # positional-only, as in DeepGEMM's binding
        dg.get_tma_aligned_size(x=8, element_size=4)


# ---------------------------------------------------------------------------------------------
# get_mn_major_tma_aligned_tensor (layout 1)
# ---------------------------------------------------------------------------------------------

def test_mn_major_tma_aligned_tensor_bytes_2d():
    sf = np.array([[1.5, 2.5], [3.5, 4.5], [5.5, 6.5]], np.float32)  # mn 3, sf_k 2
    out = dg.get_mn_major_tma_aligned_tensor(sf)
    assert out.shape == (3, 2) and out.dtype == np.float32 and _es(out) == (1, 4)
    # storage (sf_k, align(mn, 4)): column k of sf, then one zero padding row
    assert _storage(out).tolist() == [[1.5, 3.5, 5.5, 0.0], [2.5, 4.5, 6.5, 0.0]]
    assert not np.shares_memory(out, sf)


def test_mn_major_tma_aligned_tensor_3d_and_strided_inputs():
    rng = np.random.default_rng(0)
    sf = rng.standard_normal((2, 5, 3)).astype(np.float32)
    for x in (sf, np.ascontiguousarray(sf.transpose(0, 2, 1)).transpose(0, 2, 1), sf[:, :, ::-1][:, :, ::-1],
              np.asfortranarray(sf)):
        out = dg.get_mn_major_tma_aligned_tensor(x)
        assert out.shape == (2, 5, 3) and _es(out) == (8 * 3, 1, 8)
        assert np.array_equal(out.view(np.uint32), sf.view(np.uint32))
        storage = _storage(out)
        assert storage.shape == (2, 3, 8) and not storage[:, :, 5:].any()


def test_mn_major_tma_aligned_tensor_aliases_when_already_aligned():
    storage = np.arange(2 * 3 * 8, dtype=np.float32).reshape(2, 3, 8)
    sf3 = storage.transpose(0, 2, 1)[:, :5, :]  # (2, 5, 3) strides (24, 1, 8)
    assert dg.get_mn_major_tma_aligned_tensor(sf3) is sf3
    sf2 = storage[0].T[:5]  # (5, 3) strides (1, 8)
    out2 = dg.get_mn_major_tma_aligned_tensor(sf2)
    assert out2 is not sf2 and np.shares_memory(out2, sf2) and _es(out2) == (1, 8)
    out2[0, 0] = -1.0  # a view: writes reach the input (trap 21)
    assert sf2[0, 0] == -1.0
    # 2-D: only the last two strides matter; 3-D with a padded batch stride is copied
    padded = np.zeros((2, 4, 8), np.float32).transpose(0, 2, 1)[:, :5, :3]
    assert dg.get_mn_major_tma_aligned_tensor(padded) is not padded


def test_mn_major_tma_aligned_tensor_rejects():
    for bad in (np.zeros((4, 4), np.float64), np.zeros((4, 4), np.int32), np.zeros(4, np.float32),
                np.zeros((1, 2, 3, 4), np.float32)):
        with pytest.raises(DGArgumentError, match="get_mn_major_tma_aligned_tensor: sf"):
            dg.get_mn_major_tma_aligned_tensor(bad)


# ---------------------------------------------------------------------------------------------
# get_mn_major_tma_aligned_packed_ue8m0_tensor (layout 2)
# ---------------------------------------------------------------------------------------------

def test_packed_ue8m0_bytes_2d():
    out = dg.get_mn_major_tma_aligned_packed_ue8m0_tensor(SF_2x5)
    assert out.dtype == np.int32 and out.shape == (2, 2) and _es(out) == (1, 4)
    assert _storage(out).tolist() == [
        [_w32(0x7F, 0x80, 0x7E, 0x81), _w32(0x7D, 0x7F, 0x7F, 0x80), 0, 0],
        [_w32(0x82), _w32(0x00), 0, 0],
    ]


def test_packed_ue8m0_bytes_3d_and_mn_major_input():
    sf = np.stack([SF_2x5, SF_2x5[::-1]])  # (2, 2, 5)
    out = dg.get_mn_major_tma_aligned_packed_ue8m0_tensor(sf)
    assert out.shape == (2, 2, 2) and _es(out) == (2 * 4, 1, 4)
    a, b = _w32(0x7F, 0x80, 0x7E, 0x81), _w32(0x7D, 0x7F, 0x7F, 0x80)
    assert _storage(out).tolist() == [[[a, b, 0, 0], [_w32(0x82), 0, 0, 0]], [[b, a, 0, 0], [0, _w32(0x82), 0, 0]]]
    # 2-D MN-major input with strides (1, mn), mn % 4 == 0: the pack kernel path, same bytes
    sf4 = _pow2(np.arange(120, 140, dtype=np.uint32).reshape(4, 5))
    mn_major = np.ascontiguousarray(sf4.T).T
    assert _es(mn_major) == (1, 4)
    assert np.array_equal(dg.get_mn_major_tma_aligned_packed_ue8m0_tensor(mn_major),
                          dg.get_mn_major_tma_aligned_packed_ue8m0_tensor(sf4))


@pytest.mark.parametrize("value", [3.0, -2.0, -0.0, np.nan, 1e-40, 0.75])
def test_packed_ue8m0_kernel_path_rejects_non_powers_of_two(value):
    sf = np.ones((4, 8), np.float32)
    sf[2, 5] = value
    before = sf.copy()
    with pytest.raises(DGArgumentError, match=r"get_mn_major_tma_aligned_packed_ue8m0_tensor: sf: .*powers of two.*at index \(2, 5\)$"):
        dg.get_mn_major_tma_aligned_packed_ue8m0_tensor(sf)
    assert np.array_equal(sf.view(np.uint32), before.view(np.uint32))


def test_packed_ue8m0_zero_and_inf_are_bytes_0_and_255():
    sf = np.array([[0.0, np.inf, 1.0, 2.0**-126]], np.float32)
    out = dg.get_mn_major_tma_aligned_packed_ue8m0_tensor(sf)
    assert out.tolist() == [[_w32(0x00, 0xFF, 0x7F, 0x01)]]


def test_packed_ue8m0_torch_fallback_floors_silently():
    # DeepGEMM's PyTorch fallback (batched, (mn * sf_k) % 4 != 0) keeps only the exponent field.
    sf = np.ones((2, 3, 1), np.float32)
    sf[0, 1, 0] = 3.0  # -> 2.0 (0x80)
    sf[1, 2, 0] = -0.5  # -> 0.5 (0x7E), sign dropped
    out = dg.get_mn_major_tma_aligned_packed_ue8m0_tensor(sf)
    assert out[..., 0].tolist() == [[0x7F, 0x80, 0x7F], [0x7F, 0x7F, 0x7E]]
    # non-contiguous with mn % 4 != 0: fallback too
    base = np.ones((5, 6), np.float32)
    base[0, 0] = 3.0
    sf2 = base[:, ::2]  # (5, 3), strides (6, 2)
    assert dg.get_mn_major_tma_aligned_packed_ue8m0_tensor(sf2)[0, 0] == _w32(0x80, 0x7F, 0x7F)


def test_packed_ue8m0_rejects_other_non_contiguous_layouts():
    sf = np.ones((8, 6), np.float32)[:, ::2]  # mn % 4 == 0, strides (6, 2)
    with pytest.raises(DGArgumentError, match=r"strides \(1, 8\)"):
        dg.get_mn_major_tma_aligned_packed_ue8m0_tensor(sf)


def test_packed_ue8m0_psum_gap_rows_are_zero():
    dg.set_mk_alignment_for_contiguous_layout(4)
    sf = np.ones((8, 1), np.float32)
    sf[[3, 6, 7], 0] = [3.0, np.nan, -1.0]  # gap rows may hold anything: never read
    psum = np.array([3, 6], np.int32)  # group 0: rows [0, 3); group 1: rows [4, 6)
    out = dg.get_mn_major_tma_aligned_packed_ue8m0_tensor(sf, psum_layout=psum)
    assert out[:, 0].tolist() == [0x7F, 0x7F, 0x7F, 0, 0x7F, 0x7F, 0, 0]
    # an empty group after an unaligned one owns no rows; a valid row's bad value still traps
    assert dg.get_mn_major_tma_aligned_packed_ue8m0_tensor(sf, np.array([3, 3, 6], np.int32))[:, 0].tolist() == \
        [0x7F, 0x7F, 0x7F, 0, 0x7F, 0x7F, 0, 0]
    with pytest.raises(DGArgumentError, match=r"at index \(6, 0\)$"):
        dg.get_mn_major_tma_aligned_packed_ue8m0_tensor(sf, np.array([3, 7], np.int32))


@pytest.mark.parametrize("sf,psum,match", [
    (np.ones((2, 4, 1), np.float32), np.array([4], np.int32), "single contiguous batch"),
    (np.ones((4, 2), np.float32).T, np.array([2], np.int32), "single contiguous batch"),
    (np.ones((4, 1), np.float32), np.array([4], np.int64), "int32"),
    (np.ones((4, 1), np.float32), np.array([], np.int32), "at least one group"),
    (np.ones((4, 1), np.float32), np.array([4, 0, 8], np.int32)[::2], "contiguous"),
    (np.ones((4, 1), np.float32), np.array([-1], np.int32), "non-negative"),
])
def test_packed_ue8m0_psum_rejects(sf, psum, match):
    with pytest.raises(DGArgumentError, match=match):
        dg.get_mn_major_tma_aligned_packed_ue8m0_tensor(sf, psum)


# ---------------------------------------------------------------------------------------------
# get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor
# ---------------------------------------------------------------------------------------------

def _k_rows(n_rows: int, mn: int = 4) -> np.ndarray:
    """SF row i, column c = 2^(i - c): exponent byte 127 + i - c."""
    i, c = np.meshgrid(np.arange(n_rows), np.arange(mn), indexing="ij")
    return _pow2(127 + i - c)


def test_k_grouped_packer_compact_groups_and_empty_group():
    ks = [64, 0, 160]  # gran_k 32: 2, 0, 5 SF rows; 1, 0, 2 packed rows
    sf = _k_rows(7)
    out = dg.get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(sf, np.array(ks, np.int32), ks, 32, 32)
    assert out.dtype == np.int32 and out.shape == (3, 4) and _es(out) == (4, 1)
    e = lambda i, c: 127 + i - c  # noqa: E731
    want = [[_w32(e(0, c), e(1, c)) for c in range(4)],
            [_w32(e(2, c), e(3, c), e(4, c), e(5, c)) for c in range(4)],
            [_w32(e(6, c)) for c in range(4)]]
    assert out.tolist() == want
    assert out[0, 0] == _w32(0x7F, 0x80) and out[2, 3] == _w32(0x82)


def test_k_grouped_packer_gran_k_128_and_all_empty():
    ks = [256, 384]  # 2 and 3 SF rows: one packed row each
    out = dg.get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(_k_rows(5), np.array(ks, np.int32), ks, 128, 128)
    assert out[:, 0].tolist() == [_w32(0x7F, 0x80), _w32(0x81, 0x82, 0x83)]
    empty = dg.get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(
        np.zeros((0, 8), np.float32), np.array([0, 0], np.int32), [0, 0], 32, 32)
    assert empty.shape == (0, 8) and empty.dtype == np.int32


def test_k_grouped_packer_psum_mode():
    real = [40, 0, 100]  # k_alignment 64: ends 40, 64, 164; 2, 0, 4 SF rows
    psum = np.array([40, 64, 164], np.int32)
    sf = _k_rows(6)
    want = [[_w32(127 - c, 128 - c) for c in range(4)], [_w32(129 - c, 130 - c, 131 - c, 132 - c) for c in range(4)]]
    f = dg.get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor
    assert f(sf, psum, real, 32, 64, use_psum_layout=True).tolist() == want
    assert f(sf, psum, [64, 0, 128], 32, 64, True).tolist() == want  # aligned host sizes
    for ks in (None, []):  # upper bound (6 + 3 * 3) // 4 = 3 rows, the extra one zero
        out = f(sf, psum, ks, 32, 64, True)
        assert out.shape == (3, 4) and out[:2].tolist() == want and not out[2].any()


def test_k_grouped_packer_validates_packed_values_only():
    sf = _k_rows(6)
    sf[5, 1] = 3.0
    psum = np.array([40, 64, 164], np.int32)
    with pytest.raises(DGArgumentError, match=r"powers of two.*\(3, 1\)"):
        dg.get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(sf, psum, None, 32, 64, True)
    # with only one packed row allocated the bad row is never read
    out = dg.get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(sf, psum, [40, 0, 0], 32, 64, True)
    assert out.shape == (1, 4)


@pytest.mark.parametrize("kwargs,match", [
    (dict(gran_k=64), "gran_k: expected 32 or 128"),
    (dict(k_alignment=48), "k_alignment"),
    (dict(sf=np.ones((4, 6), np.float32)), "divisible by 4"),
    (dict(sf=np.ones((8, 4), np.float32)[::2]), "contiguous"),
    (dict(sf=np.ones((4, 4), np.float64)), "float32"),
    (dict(grouped_layout=np.array([64, 64], np.int64)), "int32"),
    (dict(grouped_layout=np.full(129, 0, np.int32), ks_cpu=[0] * 129), "at most 128"),
    (dict(ks_cpu=[64]), "2 entries"),
    (dict(ks_cpu=[64, 96]), r"sum\(ceil\(k / 32\)\) == 4"),
    (dict(ks_cpu=None), "use_psum_layout=True"),
    (dict(ks_cpu=[]), "use_psum_layout=True"),
    (dict(grouped_layout=np.array([64, 128], np.int32)), "fit in sf"),
    (dict(grouped_layout=np.array([64, -1], np.int32)), "non-negative"),
    (dict(grouped_layout=np.array([64, 32], np.int32), use_psum_layout=True, ks_cpu=None), "end_g >= align"),
])
def test_k_grouped_packer_rejects(kwargs, match):
    args = dict(sf=np.ones((4, 4), np.float32), grouped_layout=np.array([64, 64], np.int32), ks_cpu=[64, 64],
                gran_k=32, k_alignment=32, use_psum_layout=False)
    args.update(kwargs)
    with pytest.raises(DGArgumentError, match=match):
        dg.get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(**args)


# ---------------------------------------------------------------------------------------------
# transform_sf_into_required_layout: DeepGEMM (spec 4.5)
# ---------------------------------------------------------------------------------------------

def test_transform_sm90_rules():
    with dg.numerics(arch="sm90"):
        sfa = np.arange(1, 13, dtype=np.float32).reshape(3, 4)  # m 3, k 512, gran_k 128
        out = dg.transform_sf_into_required_layout(sfa, 3, 512, (1, 128, 128), is_sfa=True)
        assert out.dtype == np.float32 and _es(out) == (1, 4) and np.array_equal(out, sfa)
        assert _storage(out)[:, 3].tolist() == [0.0] * 4
        sfb = np.full((2, 4), 3.0, np.float32)  # n 256: per-block SFB returned as is (trap 21)
        assert dg.transform_sf_into_required_layout(sfb, 256, 512, (1, 128, 128), is_sfa=False) is sfb
        sfb_t = np.ascontiguousarray(sfb.T).T
        assert dg.transform_sf_into_required_layout(sfb_t, 256, 512, (128, 128)) is sfb_t
        sfb3 = np.ones((2, 2, 4), np.float32)
        assert dg.transform_sf_into_required_layout(sfb3, 256, 512, (1, 128, 128), 2, False) is sfb3
        with pytest.raises(DGArgumentError, match="row-major or transposed-contiguous"):
            dg.transform_sf_into_required_layout(np.ones((2, 8), np.float32)[:, ::2], 256, 512, (128, 128))
        # 1D1D SFB (1, 1, 128) also goes to layout 1
        out_b = dg.transform_sf_into_required_layout(sfa, 3, 512, (1, 1, 128), is_sfa=False)
        assert _es(out_b) == (1, 4)
        # sm90 rejects gran_k 32 and int32 SFs
        with pytest.raises(DGArgumentError, match="known SF transformation"):
            dg.transform_sf_into_required_layout(np.ones((3, 4), np.float32), 3, 128, (1, 1, 32), is_sfa=True)
        with pytest.raises(DGArgumentError, match="known SF transformation"):
            dg.transform_sf_into_required_layout(np.ones((3, 1), np.int32), 3, 512, (1, 1, 128), is_sfa=True)


def test_transform_sm100_packs_and_broadcasts():
    # (1, 128, 128) SFB with n = 130: rows 0..127 take SF row 0, rows 128, 129 SF row 1
    sfb = np.array([[1.0, 2.0], [4.0, 0.5]], np.float32)
    out = dg.transform_sf_into_required_layout(sfb, 130, 256, (1, 128, 128), is_sfa=False)
    assert out.dtype == np.int32 and out.shape == (130, 1) and _es(out) == (1, 132)
    assert out[:128, 0].tolist() == [_w32(0x7F, 0x80)] * 128
    assert out[128:, 0].tolist() == [_w32(0x81, 0x7E)] * 2
    assert not _storage(out)[0, 130:].any()
    # per-32 scales: 5 K-groups -> 2 words
    out32 = dg.transform_sf_into_required_layout(SF_2x5, 2, 160, (1, 1, 32), is_sfa=True)
    assert out32.tolist() == [[_w32(0x7F, 0x80, 0x7E, 0x81), _w32(0x82)], [_w32(0x7D, 0x7F, 0x7F, 0x80), 0]]
    # recipe_a-style 2-tuple; grouped 3-D
    sf3 = np.stack([SF_2x5, SF_2x5])
    out3 = dg.transform_sf_into_required_layout(sf3, 2, 160, (1, 32), num_groups=2)
    assert out3.shape == (2, 2, 2) and _es(out3) == (2 * 4, 1, 4) and np.array_equal(out3[1], out32)


def test_transform_sm100_disable_ue8m0_cast_gives_fp32_paths():
    sf = np.ones((3, 2), np.float32) * 3.0  # not a power of two: fine for the FP32 paths
    out = dg.transform_sf_into_required_layout(sf, 3, 256, (1, 1, 128), is_sfa=True, disable_ue8m0_cast=True)
    assert out.dtype == np.float32 and _es(out) == (1, 4)
    sfb = np.ones((1, 2), np.float32)
    assert dg.transform_sf_into_required_layout(sfb, 128, 256, (1, 128, 128), is_sfa=False,
                                                disable_ue8m0_cast=True) is sfb
    with pytest.raises(DGArgumentError, match="disable_ue8m0_cast"):
        dg.transform_sf_into_required_layout(np.ones((3, 8), np.float32), 3, 256, (1, 1, 32), is_sfa=True,
                                             disable_ue8m0_cast=True)


def test_transform_sm100_packed_int32_input():
    storage = np.zeros((2, 8), np.int32)
    packed = storage.T[:5]  # (5, 2) strides (1, 8): layout 2 for mn 5
    assert dg.transform_sf_into_required_layout(packed, 5, 1024, (1, 1, 128), is_sfa=False) is packed
    packed3 = np.zeros((3, 2, 8), np.int32).transpose(0, 2, 1)[:, :5]
    assert dg.transform_sf_into_required_layout(packed3, 5, 1024, (1, 1, 128), 3, False) is packed3
    # K-major packed SFs (per_token_cast_to_fp8(use_packed_ue8m0=True)) fail the TMA check
    _, kmajor = dg.per_token_cast_to_fp8(np.ones((8, 1024), np.float32), use_ue8m0=True, use_packed_ue8m0=True)
    with pytest.raises(DGArgumentError, match=r"strides \(1, 8\)"):
        dg.transform_sf_into_required_layout(kmajor, 8, 1024, (1, 1, 128), is_sfa=True)
    # int32 with gran_mn 128 is unknown
    with pytest.raises(DGArgumentError, match="known SF transformation"):
        dg.transform_sf_into_required_layout(np.zeros((1, 2), np.int32), 128, 1024, (1, 128, 128), is_sfa=False)


def test_transform_sm100_psum():
    dg.set_mk_alignment_for_contiguous_layout(4)
    sf = np.ones((8, 1), np.float32)
    sf[3, 0] = 5.0
    out = dg.transform_sf_into_required_layout(sf, 8, 128, (1, 1, 128), is_sfa=True, psum_layout=np.array([3, 6], np.int32))
    assert out[:, 0].tolist() == [0x7F, 0x7F, 0x7F, 0, 0x7F, 0x7F, 0, 0]


@pytest.mark.parametrize("call,match", [
    (lambda sf: dg.transform_sf_into_required_layout(sf, 3, 256, (1, 1, 128)), "is_sfa"),
    (lambda sf: dg.transform_sf_into_required_layout(sf, 3, 256, (1, 128), is_sfa=True), "is_sfa"),
    (lambda sf: dg.transform_sf_into_required_layout(sf, 3, 256, (1, 1, 1, 128), is_sfa=True), "recipe"),
    (lambda sf: dg.transform_sf_into_required_layout(sf, 3, 256, (1, 0, 128), is_sfa=True), r"recipe\[1\]"),
    (lambda sf: dg.transform_sf_into_required_layout(sf, 4, 256, (1, 1, 128), is_sfa=True), r"shape \(4, 2\)"),
    (lambda sf: dg.transform_sf_into_required_layout(sf, 3, 384, (1, 1, 128), is_sfa=True), r"shape \(3, 3\)"),
    (lambda sf: dg.transform_sf_into_required_layout(sf, 3, 256, (1, 1, 128), 1, True), "3-D"),
    (lambda sf: dg.transform_sf_into_required_layout(sf.astype(np.float64), 3, 256, (1, 128), None), "float32 or int32"),
    (lambda sf: dg.transform_sf_into_required_layout(sf, 3, 128, (1, 1, 64), is_sfa=True), "known SF transformation"),
])
def test_transform_cuda_rejects_and_leaves_input_untouched(call, match):
    sf = np.full((3, 2), 2.0, np.float32)
    before = sf.copy()
    with pytest.raises(DGArgumentError, match="transform_sf_into_required_layout: .*" + match):
        call(sf)
    assert np.array_equal(sf.view(np.uint32), before.view(np.uint32))


# ---------------------------------------------------------------------------------------------
# transform_sf_into_required_layout: DeepGEMM-Ascend (port 1.3)
# ---------------------------------------------------------------------------------------------

SF_3x5 = np.array([[1.0, 2.0, 0.5, 4.0, 8.0], [0.25, 1.0, 1.0, 2.0, 0.0], [2.0] * 5], np.float32)
# exponent bytes: 7F 80 7E 81 82 / 7D 7F 7F 80 00 / 80 80 80 80 80
ASCEND_3x5_PHYSICAL = [  # (ceil(k / 64), mn): pair p of row r in column r
    [_w16(0x7F, 0x80), _w16(0x7D, 0x7F), _w16(0x80, 0x80)],
    [_w16(0x7E, 0x81), _w16(0x7F, 0x80), _w16(0x80, 0x80)],
    [_w16(0x82), _w16(0x00), _w16(0x80)],  # odd K-group count: high byte 0
]


def test_ascend_transform_bytes():
    with dg.numerics(arch="ascend950"):
        out = dg.transform_sf_into_required_layout(SF_3x5, 3, 160, (1, 1, 32), is_sfa=True)
        assert out.dtype == np.int16 and out.shape == (3, 3) and _es(out) == (1, 3)
        assert _storage(out).tolist() == ASCEND_3x5_PHYSICAL and _storage(out).shape == (3, 3)
        # K-major copy / MN-major copy / strided rows: same bytes
        for x in (np.ascontiguousarray(SF_3x5.T).T, np.pad(SF_3x5, ((0, 0), (0, 3)))[:, :5]):
            assert np.array_equal(dg.transform_sf_into_required_layout(x, 3, 160, (1, 1, 32), is_sfa=True), out)
        # the int16 input form goes through unchanged in value
        k_major = np.ascontiguousarray(out)
        out2 = dg.transform_sf_into_required_layout(k_major, 3, 160, (1, 1, 32), is_sfa=True)
        assert out2 is not k_major and _es(out2) == (1, 3) and np.array_equal(out2, out)
        # already MN-major int16 with gran_mn 1: the input itself
        assert dg.transform_sf_into_required_layout(out, 3, 160, (1, 1, 32), is_sfa=True) is out
        grouped = np.stack([out, out]).copy()  # 3-D needs stride(0) == mn * cols as well
        g_mn = np.ascontiguousarray(grouped.transpose(0, 2, 1)).transpose(0, 2, 1)
        assert dg.transform_sf_into_required_layout(g_mn, 3, 160, (1, 1, 32), 2, True) is g_mn


def test_ascend_transform_broadcast_and_grouped():
    with dg.numerics(arch="ascend950"):
        # gran_n 2, n 5: rows 0,1 <- 0; 2,3 <- 1; 4 <- 2
        out = dg.transform_sf_into_required_layout(SF_3x5, 5, 160, (1, 2, 32), is_sfa=False)
        assert out.shape == (5, 3) and _es(out) == (1, 5)
        phys = np.array(ASCEND_3x5_PHYSICAL)
        assert _storage(out).tolist() == phys[:, [0, 0, 1, 1, 2]].tolist()
        sf3 = np.stack([SF_3x5, SF_3x5[::-1]])
        out3 = dg.transform_sf_into_required_layout(sf3, 3, 160, (1, 1, 32), num_groups=2, is_sfa=True)
        assert out3.shape == (2, 3, 3) and _es(out3) == (9, 1, 3)
        assert _storage(out3).tolist() == [ASCEND_3x5_PHYSICAL, phys[:, ::-1].tolist()]


def test_ascend_transform_zero_scale_and_inf():
    with dg.numerics(arch="ascend950"):
        sf = np.array([[0.0, np.inf]], np.float32)
        assert dg.transform_sf_into_required_layout(sf, 1, 64, (1, 1, 32), is_sfa=True).tolist() == [[_w16(0, 0xFF)]]


@pytest.mark.parametrize("call,match", [
    (lambda sf: dg.transform_sf_into_required_layout(sf, 3, 160, (1, 1, 32)), "is_sfa: expected True or False"),
    (lambda sf: dg.transform_sf_into_required_layout(sf, 3, 160, (1, 32), is_sfa=None), "is_sfa"),
    (lambda sf: dg.transform_sf_into_required_layout(sf, 3, 160, (1, 32), is_sfa=True), "3-tuple"),
    (lambda sf: dg.transform_sf_into_required_layout(sf, 3, 640, (1, 1, 128), is_sfa=True), "gran_k == 32"),
    (lambda sf: dg.transform_sf_into_required_layout(sf, 3, 160, (1, 1, 32), is_sfa=True, disable_ue8m0_cast=True),
     "disable_ue8m0_cast"),
    (lambda sf: dg.transform_sf_into_required_layout(sf, 9, 160, (3, 1, 32), is_sfa=True), "power of two"),
    (lambda sf: dg.transform_sf_into_required_layout(sf, 600, 160, (256, 1, 32), is_sfa=True), "power of two"),
    (lambda sf: dg.transform_sf_into_required_layout(sf, 3, 192, (1, 1, 32), is_sfa=True), r"shape \(3, 6\)"),
    (lambda sf: dg.transform_sf_into_required_layout(sf.astype(np.int32), 3, 160, (1, 1, 32), is_sfa=True),
     "float32 or int16"),
    (lambda sf: dg.transform_sf_into_required_layout(np.tile(sf, (1, 2))[:, ::2], 3, 160, (1, 1, 32), is_sfa=True),
     "stride"),
    (lambda sf: dg.transform_sf_into_required_layout(np.stack([sf, sf]), 3, 160, (1, 1, 32), 2, True,
                                                     psum_layout=np.array([3], np.int32)), "single batch"),
    (lambda sf: dg.transform_sf_into_required_layout(sf, 3, 160, (1, 1, 32), is_sfa=True,
                                                     psum_layout=np.array([[3]], np.int32)), "1-D"),
    (lambda sf: dg.transform_sf_into_required_layout(sf, 3, 160, (1, 1, 32), is_sfa=True,
                                                     psum_layout=np.array([3, 1], np.int32)), "non-decreasing"),
])
def test_ascend_transform_rejects_and_leaves_input_untouched(call, match):
    sf = SF_3x5.copy()
    with dg.numerics(arch="ascend950"):
        with pytest.raises(DGArgumentError, match=match):
            call(sf)
    assert np.array_equal(sf.view(np.uint32), SF_3x5.view(np.uint32))


@pytest.mark.parametrize("value", [0.75, 3.0, -1.0, -0.0, np.nan, 2.0**-130])
def test_ascend_transform_rejects_non_powers_of_two(value):
    sf = SF_3x5.copy()
    sf[1, 3] = value
    before = sf.copy()
    with dg.numerics(arch="ascend950"):
        with pytest.raises(DGArgumentError, match=r"powers of two.*at index \(1, 3\)$"):
            dg.transform_sf_into_required_layout(sf, 3, 160, (1, 1, 32), is_sfa=True)
    assert np.array_equal(sf.view(np.uint32), before.view(np.uint32))


def test_ascend_psum_gap_rows_get_byte_0():
    with dg.numerics(arch="ascend950"):
        sf = np.ones((600, 2), np.float32)
        gap = np.r_[100:256, 300:512]
        sf[gap] = np.nan  # never checked: zeroed before the device validates
        out = dg.transform_sf_into_required_layout(sf, 600, 64, (1, 1, 32), is_sfa=True,
                                                   psum_layout=np.array([100, 300], np.int32))
        want = np.full(600, _w16(0x7F, 0x7F))
        want[gap] = 0
        assert out[:, 0].tolist() == want.tolist()  # rows 512..599 (past the last aligned end) kept
        # gran_mn 4: gaps are whole source rows: end 101 -> source rows [26, 64) -> rows [104, 256)
        src = np.ones((75, 2), np.float32)
        src[26:64] = 3.0
        out4 = dg.transform_sf_into_required_layout(src, 300, 64, (4, 1, 32), is_sfa=True,
                                                    psum_layout=np.array([101], np.int32))
        want4 = np.full(300, _w16(0x7F, 0x7F))
        want4[104:256] = 0
        assert out4[:, 0].tolist() == want4.tolist()


def test_ascend_psum_int16_inputs():
    with dg.numerics(arch="ascend950"):
        pairs = np.full((600, 1), _w16(0x80, 0x81), np.int16)
        psum = np.array([100], np.int32)
        want = np.full(600, _w16(0x80, 0x81))
        want[100:256] = 0
        # K-major int16: gap rows zeroed
        assert dg.transform_sf_into_required_layout(pairs, 600, 64, (1, 1, 32), is_sfa=True,
                                                    psum_layout=psum)[:, 0].tolist() == want.tolist()
        # already MN-major: returned itself, gap rows untouched
        mn_major = np.empty((1, 600), np.int16)  # a fresh (1, 600) has strides (600, 1)
        mn_major[:] = pairs.T
        mn_major = mn_major.T
        assert dg.transform_sf_into_required_layout(mn_major, 600, 64, (1, 1, 32), is_sfa=True,
                                                    psum_layout=psum) is mn_major
        # MN-major but broadcast (gran_mn 2): the kernel's int16 copy ignores the gap flags
        half = np.empty((1, 300), np.int16)
        half[:] = pairs[:300].T
        half = half.T
        out = dg.transform_sf_into_required_layout(half, 600, 64, (2, 1, 32), is_sfa=True, psum_layout=psum)
        assert out[:, 0].tolist() == [_w16(0x80, 0x81)] * 600


def test_ascend_k_grouped_transform():
    with dg.numerics(arch="ascend950"):
        sf = np.ones((2, 20), np.float32)  # mn 2, k 640
        sf[:, 4:8] = 5.0  # gap after end 100 -> columns [4, 8)
        sf[:, 12:16] = -1.0  # gap after end 356 -> columns [12, 16)
        psum = np.array([100, 356], np.int32)
        out = dg.transform_k_grouped_sf_into_required_layout(sf, 2, 640, (1, 1, 32), True, psum)
        assert out.shape == (2, 10) and _es(out) == (1, 2)
        one = _w16(0x7F, 0x7F)
        assert out[0].tolist() == [one, one, 0, 0, one, one, 0, 0, one, one]
        # end 96: float columns [3, 8) -> the high byte of pair 1 is zeroed; int16 pairs [2, 4) only
        out96 = dg.transform_k_grouped_sf_into_required_layout(np.ones((2, 20), np.float32), 2, 640, (1, 1, 32),
                                                               False, np.array([96], np.int32))
        assert out96[0, :5].tolist() == [one, _w16(0x7F), 0, 0, one]
        pairs_mn = np.ascontiguousarray(np.full((10, 2), one, np.int16)).T  # MN-major int16, k 640
        # already required layout: the input itself
        assert dg.transform_k_grouped_sf_into_required_layout(pairs_mn, 2, 640, (1, 1, 32), True, psum) is pairs_mn
        strided = np.full((10, 3), one, np.int16)[:, :2].T  # MN-major, strides (1, 3): kernel path
        out_mn = dg.transform_k_grouped_sf_into_required_layout(strided, 2, 640, (1, 1, 32), True,
                                                                np.array([96], np.int32))
        assert out_mn[0, :5].tolist() == [one, one, 0, 0, one]
        # K-major int16: the kernel's copy ignores the gap flags
        pairs_k = np.full((2, 10), one, np.int16)
        assert dg.transform_k_grouped_sf_into_required_layout(pairs_k, 2, 640, (1, 1, 32), True,
                                                              psum).tolist() == pairs_k.tolist()
        with pytest.raises(DGArgumentError, match="psum_layout"):
            dg.transform_k_grouped_sf_into_required_layout(sf, 2, 640, (1, 1, 32), True, None)
        with pytest.raises(DGArgumentError, match="is_sfa"):
            dg.transform_k_grouped_sf_into_required_layout(sf, 2, 640, (1, 1, 32), None, psum)


# ---------------------------------------------------------------------------------------------
# profile matrix and signatures
# ---------------------------------------------------------------------------------------------

CUDA_ONLY = ["get_tma_aligned_size", "get_mn_major_tma_aligned_tensor",
             "get_mn_major_tma_aligned_packed_ue8m0_tensor", "get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor"]


def test_profile_matrix_of_names():
    with dg.numerics(arch="ascend950"):
        for name in CUDA_ONLY:
            assert not hasattr(dg, name)  # the namespace hides it; the object says why
            with pytest.raises(DGArgumentError, match=f"{name}: not provided by DeepGEMM-Ascend"):
                getattr(L, name)(np.ones((4, 4), np.float32), 4)
    for arch in ("sm90", "sm100"):
        with dg.numerics(arch=arch):
            assert not hasattr(dg, "transform_k_grouped_sf_into_required_layout")
            with pytest.raises(DGArgumentError, match="transform_k_grouped_sf_into_required_layout: not provided"):
                L.transform_k_grouped_sf_into_required_layout(SF_3x5, 3, 160, (1, 1, 32), True,
                                                              np.array([160], np.int32))


# ---------------------------------------------------------------------------------------------
# sf_values and to_user_form
# ---------------------------------------------------------------------------------------------

def test_sf_values_agree_across_forms():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((6, 512)) * np.exp2(rng.integers(-20, 20, (6, 1)))).astype(np.float32)
    for gran_k in (32, 128):
        _, sf = dg.per_token_cast_to_fp8(x, use_ue8m0=True, gran_k=gran_k)
        _, packed_k = dg.per_token_cast_to_fp8(x, use_ue8m0=True, gran_k=gran_k, use_packed_ue8m0=True)
        want = sf.astype(np.float64)
        forms = [sf, np.ascontiguousarray(sf.T).T, packed_k, dg.get_mn_major_tma_aligned_packed_ue8m0_tensor(sf),
                 dg.formats.ue8m0_encode(sf, "ceil"), dg.formats.ue8m0_encode(sf, "ceil").view(ml_dtypes.float8_e8m0fnu)]
        if gran_k == 32:
            with dg.numerics(arch="ascend950"):
                forms.append(dg.transform_sf_into_required_layout(sf, 6, 512, (1, 1, 32), is_sfa=True))
        for f in forms:
            got = L.sf_values(f, 6, 512, 1, gran_k, func="t", arg="sf")
            assert got.dtype == np.float64 and got.shape == want.shape
            assert np.array_equal(got, want), f.dtype


def test_sf_values_hardware_reading_and_broadcast():
    packed = np.array([[_w32(0x00, 0xFF, 0x7F, 0x80)]], np.int32)
    v = L.sf_values(packed, 1, 512, 1, 128, func="t", arg="sf")
    assert v[0, 0] == 2.0**-127 and np.isnan(v[0, 1]) and v[0, 2:].tolist() == [1.0, 2.0]
    blocks = np.array([[1.0, 4.0], [0.5, 8.0]], np.float32)  # gran_mn 2, mn 3
    v3 = L.sf_values(np.stack([blocks] * 2), 3, 256, 2, 128, num_groups=2, func="t", arg="sf")
    assert v3.shape == (2, 3, 2) and v3[1].tolist() == [[1.0, 4.0], [1.0, 4.0], [0.5, 8.0]]


@pytest.mark.parametrize("sf,args,match", [
    (np.ones((3, 2), np.float32), (4, 256, 1, 128), r"f: a: expected float32 SFs of shape \(\.\.\., 4, 2\)"),
    (np.ones((3, 2), np.int32), (3, 256, 1, 128), r"f: a: expected int32 SFs of shape \(\.\.\., 3 or 3, 1\)"),
    (np.ones((3, 2), np.int16), (3, 256, 1, 128), "f: gran_k: expected 32"),
    (np.ones((3, 2), np.float64), (3, 256, 1, 128), "f: a: expected float32, int32"),
    (np.ones((3, 2), np.float32), (3, 256, 1, 128, 2), r"f: a: expected a 3-D array"),
])
def test_sf_values_rejects(sf, args, match):
    with pytest.raises(DGArgumentError, match=match):
        L.sf_values(sf, *args, func="f", arg="a")


SETTINGS = settings(max_examples=40)


@SETTINGS
@given(mn=st.integers(1, 19), sf_k=st.integers(1, 11), gran_mn=st.sampled_from([1, 2, 128]),
       groups=st.sampled_from([None, 1, 3]), gran_k=st.sampled_from([32, 128]), seed=st.integers(0, 2**16))
def test_round_trip_sm100(mn, sf_k, gran_mn, groups, gran_k, seed):
    rng = np.random.default_rng(seed)
    rows = -(-mn // gran_mn)
    shape = ((groups,) if groups else ()) + (rows, sf_k)
    user = _pow2(rng.integers(0, 256, shape))  # includes 0.0 and +inf
    k = sf_k * gran_k - int(rng.integers(0, gran_k))
    out = dg.transform_sf_into_required_layout(user, mn, k, (gran_mn, 1, gran_k), groups, True)
    assert out.dtype == np.int32 and _es(out)[-2:] == (1, -(-mn // 4) * 4)
    back = L.to_user_form(out, mn, k, gran_mn, gran_k, groups)
    assert back.shape == user.shape and np.array_equal(back.view(np.uint32), user.view(np.uint32))
    vals = L.sf_values(out, mn, k, gran_mn, gran_k, groups, func="t", arg="sf")
    ref = dg.formats.ue8m0_decode(user.view(np.uint32) >> 23)
    assert np.array_equal(vals, ref[..., np.arange(mn) // gran_mn, :], equal_nan=True)
    # the float32 user form reads the same, except where the hardware reads byte 0 as 2^-127
    user_vals = L.sf_values(user, mn, k, gran_mn, gran_k, groups, func="t", arg="sf")
    user_vals[user_vals == 0] = 2.0**-127
    user_vals[np.isinf(user_vals)] = np.nan
    assert np.array_equal(user_vals, vals, equal_nan=True)


@SETTINGS
@given(mn=st.integers(1, 19), sf_k=st.integers(1, 11), gran_mn=st.sampled_from([1, 4, 128]),
       groups=st.sampled_from([None, 2]), seed=st.integers(0, 2**16))
def test_round_trip_ascend950(mn, sf_k, gran_mn, groups, seed):
    rng = np.random.default_rng(seed)
    rows = -(-mn // gran_mn)
    shape = ((groups,) if groups else ()) + (rows, sf_k)
    user = _pow2(rng.integers(0, 256, shape))
    k = 32 * sf_k - int(rng.integers(0, 32))
    with dg.numerics(arch="ascend950"):
        out = dg.transform_sf_into_required_layout(user, mn, k, (gran_mn, 1, 32), groups, True)
    pairs = -(-sf_k // 2)
    assert out.dtype == np.int16 and _es(out) == ((pairs * mn,) if groups else ()) + (1, mn)
    back = L.to_user_form(out, mn, k, gran_mn, 32, groups)
    assert np.array_equal(back.view(np.uint32), user.view(np.uint32))
    # the int16 result is itself a valid input: already required (gran_mn 1) or re-broadcast
    with dg.numerics(arch="ascend950"):
        again = dg.transform_sf_into_required_layout(out, mn, k, (1, 1, 32), groups, True)
    assert again is out


def test_to_user_form_does_not_alias_and_compresses_rows():
    sf = np.array([[1.0, 2.0]], np.float32)
    back = L.to_user_form(sf, 1, 256, 1, 128)
    assert back is not sf and not np.shares_memory(back, sf) and back.tolist() == [[1.0, 2.0]]
    per_row = dg.transform_sf_into_required_layout(np.array([[1.0], [4.0]], np.float32), 200, 128, (128, 128, 128),
                                                   is_sfa=True)
    assert L.to_user_form(per_row, 200, 128, 128, 128).tolist() == [[1.0], [4.0]]
    assert L.to_user_form(np.array([[_w32(0x00, 0xFF)]], np.int32), 1, 256, 1, 128).tolist() == [[0.0, np.inf]]


# ---------------------------------------------------------------------------------------------
# torch tensors: same bytes, strides and aliasing as NumPy
# ---------------------------------------------------------------------------------------------

@pytest.mark.torch
def test_torch_cuda_layouts_same_bytes_and_strides():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    user = _pow2(rng.integers(100, 150, (2, 5, 7)))
    cases = [
        ("sm90", lambda x: dg.get_mn_major_tma_aligned_tensor(x)),
        ("sm100", lambda x: dg.get_mn_major_tma_aligned_packed_ue8m0_tensor(x)),
        ("sm100", lambda x: dg.transform_sf_into_required_layout(x, 5, 7 * 32, (1, 1, 32), 2, True)),
        ("sm100", lambda x: dg.transform_sf_into_required_layout(x[0], 5, 7 * 128, (1, 128), None)),
        ("sm90", lambda x: dg.transform_sf_into_required_layout(x, 5, 7 * 128, (1, 1, 128), 2, True)),
    ]
    for arch, f in cases:
        with dg.numerics(arch=arch):
            n = f(user)
            t = f(torch.from_numpy(user.copy()))
        assert isinstance(t, torch.Tensor) and tuple(t.shape) == n.shape and _es(t) == _es(n)
        assert np.array_equal(t.numpy().view(n.dtype), n, equal_nan=n.dtype.kind == "f")
        assert t.untyped_storage().nbytes() == _storage(n).nbytes  # the padded allocation travels along


@pytest.mark.torch
def test_torch_aliasing_and_k_grouped():
    torch = pytest.importorskip("torch")
    storage = torch.zeros(2, 3, 8)
    sf3 = storage.transpose(1, 2)[:, :5, :]
    with dg.numerics(arch="sm90"):
        assert dg.get_mn_major_tma_aligned_tensor(sf3) is sf3
        sf2 = storage[0].T[:5]
        v = dg.get_mn_major_tma_aligned_tensor(sf2)
        assert v is not sf2 and v.data_ptr() == sf2.data_ptr() and tuple(v.stride()) == (1, 8)
        sfb = torch.ones(2, 4)
        assert dg.transform_sf_into_required_layout(sfb, 256, 512, (1, 128, 128), is_sfa=False) is sfb
    packed = torch.zeros(2, 8, dtype=torch.int32).T[:5]
    assert dg.transform_sf_into_required_layout(packed, 5, 1024, (1, 1, 128), is_sfa=False) is packed
    ks = [64, 0, 160]
    sf = _k_rows(7)
    n = dg.get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(sf, np.array(ks, np.int32), ks, 32, 32)
    t = dg.get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(torch.from_numpy(sf), torch.tensor(ks, dtype=torch.int32),
                                                                  ks, 32, 32)
    assert isinstance(t, torch.Tensor) and np.array_equal(t.numpy(), n) and tuple(t.stride()) == _es(n)


@pytest.mark.torch
def test_torch_ascend_and_helpers():
    torch = pytest.importorskip("torch")
    with dg.numerics(arch="ascend950"):
        n = dg.transform_sf_into_required_layout(SF_3x5, 3, 160, (1, 1, 32), is_sfa=True)
        t = dg.transform_sf_into_required_layout(torch.from_numpy(SF_3x5.copy()), 3, 160, (1, 1, 32), is_sfa=True)
        assert t.dtype == torch.int16 and tuple(t.stride()) == (1, 3) and np.array_equal(t.numpy(), n)
        assert dg.transform_sf_into_required_layout(t, 3, 160, (1, 1, 32), is_sfa=True) is t
        tk = dg.transform_k_grouped_sf_into_required_layout(torch.ones(2, 20), 2, 640, (1, 1, 32), True,
                                                            torch.tensor([100], dtype=torch.int32))
        assert isinstance(tk, torch.Tensor) and tuple(tk.stride()) == (1, 2)
        bad = torch.from_numpy(SF_3x5.copy())
        bad[0, 0] = 0.75
        before = bad.clone()
        with pytest.raises(DGArgumentError, match="powers of two"):
            dg.transform_sf_into_required_layout(bad, 3, 160, (1, 1, 32), is_sfa=True)
        assert torch.equal(bad, before)
    v = L.sf_values(t, 3, 160, 1, 32, func="t", arg="sf")  # a kernel-side reading: always NumPy
    assert isinstance(v, np.ndarray) and v.dtype == np.float64
    assert np.array_equal(v, SF_3x5.astype(np.float64) + (SF_3x5 == 0) * 2.0**-127)
    u = L.to_user_form(t, 3, 160, 1, 32)
    assert isinstance(u, torch.Tensor) and np.array_equal(u.numpy().view(np.uint32), SF_3x5.view(np.uint32))


# ---------------------------------------------------------------------------------------------
# the fast byte packer against the specification in formats, and edge shapes
# ---------------------------------------------------------------------------------------------

@SETTINGS
@given(rows=st.integers(0, 5), n=st.integers(0, 13), per=st.sampled_from([2, 4]), seed=st.integers(0, 2**16))
def test_pack_le_matches_formats_spec(rows, n, per, seed):
    b = np.random.default_rng(seed).integers(0, 256, (rows, n)).astype(np.uint8)
    padded = np.zeros((rows, -(-n // per) * per), np.uint8)
    padded[:, :n] = b
    spec = dg.formats.pack_ue8m0_int32(padded) if per == 4 else dg.formats.pack_ue8m0_int16(padded)
    strided = np.zeros((rows, 2 * n), np.uint8)
    strided[:, ::2] = b
    for x in (b, strided[:, ::2]):  # contiguous and strided inputs
        got = scales.pack_le(x, per)
        assert got.dtype == spec.dtype and got.shape == spec.shape and np.array_equal(got, spec)


def test_empty_shapes():
    out = dg.get_mn_major_tma_aligned_packed_ue8m0_tensor(np.zeros((0, 5), np.float32))
    assert out.shape == (0, 2) and out.dtype == np.int32
    with dg.numerics(arch="ascend950"):
        out = dg.transform_sf_into_required_layout(np.zeros((4, 0), np.float32), 4, 0, (1, 1, 32), is_sfa=True)
        assert out.shape == (4, 0) and out.dtype == np.int16
    assert L.sf_values(np.zeros((0, 2), np.int32), 0, 1024, 1, 128, func="t", arg="sf").shape == (0, 8)


def test_k_grouped_packer_accepts_tuple_and_array_ks():
    ks = (64, 0, 160)
    sf, gl = _k_rows(7), np.array(ks, np.int32)
    want = dg.get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(sf, gl, list(ks), 32, 32)
    for k_list in (ks, np.array(ks)):
        assert np.array_equal(dg.get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(sf, gl, k_list, 32, 32), want)


def test_sf_values_and_to_user_form_on_broadcast_integer_forms():
    pairs = np.array([[_w16(0x7F, 0x80)], [_w16(0x81, 0x00)]], np.int16)  # gran_mn 2, mn 3, k 64
    v = L.sf_values(pairs, 3, 64, 2, 32, func="t", arg="sf")
    assert v.tolist() == [[1.0, 2.0], [1.0, 2.0], [4.0, 2.0**-127]]
    assert L.to_user_form(pairs, 3, 64, 2, 32).tolist() == [[1.0, 2.0], [4.0, 0.0]]
    e8m0 = np.array([[0x7F, 0x80, 0x81]], np.uint8).view(ml_dtypes.float8_e8m0fnu)
    assert L.to_user_form(e8m0, 1, 96, 1, 32).tolist() == [[1.0, 2.0, 4.0]]
    with pytest.raises(DGArgumentError, match="f: a: expected int16 SFs"):
        L.sf_values(pairs, 5, 64, 2, 32, func="f", arg="a")
