"""Drop-in scripts for the grouped GEMMs, written the way DeepGEMM's and DeepGEMM-Ascend's tests are.

m-grouped contiguous (m_indices with -1 padding rows, and psum end offsets), m-grouped masked and
k-grouped GEMMs, BF16, FP8 and FP8 x FP4.  Torch tensors,
inputs made with ``deep_gemm.utils``, the kernel writing into ``d``, ``calc_diff`` against a float32
reference from the unquantised operands.  The module is the ``deep_gemm`` fixture of deepgemm_ref's
pytest plugin: this file runs against the emulator, or unchanged against the real library with
``--dg-backend real`` (each test variant for another arch than the device's is skipped).
"""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch", reason="the drop-in scripts use torch tensors, like DeepGEMM's tests")
pytestmark = pytest.mark.torch


def ceil_div(x: int, y: int) -> int:
    return (x + y - 1) // y


def align(x: int, y: int) -> int:
    return ceil_div(x, y) * y


def _randn(*shape, dtype=torch.bfloat16):
    return torch.randn(shape, dtype=torch.float32).to(dtype)


def _max_diff(fp4_b: bool) -> float:
    return 0.01 if fp4_b else 0.001  # QuantConfig.max_diff(): one FP4 operand, else FP8 x FP8


# ---------------------------------------------------------------------------------------------
# input builders (scaled-down versions of the generators' recipes)
# ---------------------------------------------------------------------------------------------

def _cast_b_per_group(dg, b: torch.Tensor, fp4: bool, use_ue8m0: bool, mn_major: bool = False):
    """B (G, N, K) bf16 -> (data, sf) per group: FP8 per 128x128 block, or FP4 per 32 along K."""
    u = dg.utils
    groups, n, k = b.shape
    if fp4:
        data = torch.empty((groups, k, n // 2) if mn_major else (groups, n, k // 2), dtype=torch.int8)
        sf = torch.empty((groups, n, ceil_div(k, 32)), dtype=torch.float)
        for i in range(groups):
            q, s = u.per_token_cast_to_fp4(b[i], use_ue8m0=use_ue8m0, gran_k=32)
            data[i], sf[i] = (u.transpose_packed_fp4(q) if mn_major else q), s
        return (data.mT, sf) if mn_major else (data, sf)
    data = torch.empty((groups, n, k), dtype=torch.float8_e4m3fn)
    sf = torch.empty((groups, ceil_div(n, 128), ceil_div(k, 128)), dtype=torch.float)
    for i in range(groups):
        data[i], sf[i] = u.per_block_cast_to_fp8(b[i], use_ue8m0=use_ue8m0)
    return (data.mT.contiguous().mT, sf) if mn_major else (data, sf)


def _m_grouped_contiguous(dg, rng: random.Random, num_groups: int, expected_m: int, n: int, k: int, psum: bool):
    """A (M, K) with zero padding rows, B (G, N, K), the layout, and the float32 reference."""
    alignment = dg.get_mk_alignment_for_contiguous_layout()
    actual_ms = [int(expected_m * rng.uniform(0.7, 1.3)) for _ in range(num_groups)]
    m = sum(align(x, alignment) for x in actual_ms)
    a = _randn(m, k)
    b = _randn(num_groups, n, k)
    layout = torch.empty(num_groups if psum else m, dtype=torch.int32)
    ref_d = torch.zeros((m, n), dtype=torch.float)
    valid = torch.zeros(m, dtype=torch.bool)
    start = 0
    for i, actual_m in enumerate(actual_ms):
        end, aligned_end = start + actual_m, start + align(actual_m, alignment)
        if psum:
            layout[i] = end
        else:
            layout[start:end] = i
            layout[end:aligned_end] = -1
        a[end:aligned_end] = 0  # zero BF16 padding rows, as DeepGEMM's generator does
        ref_d[start:end] = a[start:end].float() @ b[i].float().t()
        valid[start:end] = True
        start = aligned_end
    return m, a, b, layout, ref_d, valid


def _group_ranges(layout: torch.Tensor, alignment: int, psum: bool = True):
    """(start, end) rows of every group: from psum END offsets, or from m_indices (-1 = padding)."""
    if not psum:
        for g in range(int(layout.max()) + 1):
            rows = (layout == g).nonzero().flatten()
            yield (int(rows[0]), int(rows[-1]) + 1) if rows.numel() else (0, 0)
        return
    prev = 0
    for i, end in enumerate(layout.tolist()):
        start = 0 if i == 0 else align(prev, alignment)
        yield start, end
        prev = end


# ---------------------------------------------------------------------------------------------
# DeepGEMM style: m-grouped contiguous
# ---------------------------------------------------------------------------------------------

_CONTIGUOUS_CASES = [
    ("sm90", False, False, False), ("sm90", False, True, False),
    ("sm100", False, False, False), ("sm100", True, False, False),
    ("sm100", False, True, False), ("sm100", False, True, True), ("sm100", True, True, True),
]


@pytest.mark.parametrize("dg_arch,fp4_b,psum,zero_pad", _CONTIGUOUS_CASES)
def test_m_grouped_contiguous_like_deepgemm(deep_gemm, dg_arch, fp4_b, psum, zero_pad):
    t, u = deep_gemm.testing, deep_gemm.utils
    rng = random.Random(0)
    torch.manual_seed(0)
    num_groups, expected_m, n, k = 4, 48, 256, 512
    use_ue8m0 = t.get_arch_major() == 10
    deep_gemm.set_mk_alignment_for_contiguous_layout(deep_gemm.get_theoretical_mk_alignment_for_contiguous_layout())
    alignment = deep_gemm.get_mk_alignment_for_contiguous_layout()
    m, a, b, layout, ref_d, valid = _m_grouped_contiguous(deep_gemm, rng, num_groups, expected_m, n, k, psum)
    a_fp8 = u.per_token_cast_to_fp8(a, use_ue8m0=use_ue8m0)
    b_q = _cast_b_per_group(deep_gemm, b, fp4_b, use_ue8m0)
    kw = {"recipe_a": (1, 128), "recipe_b": (1, 32)} if fp4_b else {}
    d = torch.full((m, n), float("nan"), dtype=torch.bfloat16)
    deep_gemm.m_grouped_fp8_fp4_gemm_nt_contiguous(a_fp8, b_q, d, layout, disable_ue8m0_cast=not use_ue8m0,
                                                   use_psum_layout=psum, ensure_zero_padding=zero_pad, **kw)
    if psum:
        for j, (start, end) in enumerate(_group_ranges(layout, alignment)):
            diff = t.calc_diff(d[start:end], ref_d[start:end])
            assert diff < _max_diff(fp4_b), f"{dg_arch=}, group {j}, {diff:.5f}"
        if zero_pad:  # check_fp8_fp4_psum_zero_padding: zero A padding gives zero D padding
            for end in layout.tolist():
                assert torch.equal(d[end:align(end, alignment)], torch.zeros_like(d[end:align(end, alignment)]))
    else:
        diff = t.calc_diff(d, ref_d)
        assert diff < _max_diff(fp4_b), f"{dg_arch=}, {m=}, {diff:.5f}"
        assert torch.equal(d[~valid], torch.zeros_like(d[~valid]))  # -1 rows read as zero
    assert t.count_bytes(a_fp8, b_q, d) > 0

    # Exact: each group's rows equal one dense GEMM on the same quantised operands
    for j, (start, end) in enumerate(_group_ranges(layout, alignment, psum)):
        dense = torch.empty((end - start, n), dtype=torch.bfloat16)
        deep_gemm.fp8_fp4_gemm_nt((a_fp8[0][start:end], a_fp8[1][start:end]), (b_q[0][j], b_q[1][j]), dense,
                                  disable_ue8m0_cast=not use_ue8m0, **kw)
        assert torch.equal(d[start:end], dense), f"group {j}"

    # The same layout through the BF16 kernel
    d_bf16 = torch.empty((m, n), dtype=torch.bfloat16)
    deep_gemm.m_grouped_bf16_gemm_nt_contiguous(a, b, d_bf16, layout, use_psum_layout=psum)
    assert t.calc_diff(d_bf16[valid], ref_d[valid]) < 1e-5


@pytest.mark.parametrize("dg_arch", ["sm100"])
@pytest.mark.parametrize("fp4_b", [False, True])
def test_m_grouped_nn_alias_like_deepgemm(deep_gemm, dg_arch, fp4_b):
    """The NN alias: B MN-major, passed as (G, K, N) with its SFs transposed (test_alias=True)."""
    t, u = deep_gemm.testing, deep_gemm.utils
    rng = random.Random(1)
    torch.manual_seed(1)
    num_groups, expected_m, n, k = 3, 40, 256, 256
    deep_gemm.set_mk_alignment_for_contiguous_layout(deep_gemm.get_theoretical_mk_alignment_for_contiguous_layout())
    m, a, b, layout, ref_d, valid = _m_grouped_contiguous(deep_gemm, rng, num_groups, expected_m, n, k, False)
    a_fp8 = u.per_token_cast_to_fp8(a, use_ue8m0=True)
    kw = {"recipe_a": (1, 128), "recipe_b": (1, 32)} if fp4_b else {}
    d_nt = torch.empty((m, n), dtype=torch.bfloat16)
    deep_gemm.m_grouped_fp8_fp4_gemm_nt_contiguous(a_fp8, _cast_b_per_group(deep_gemm, b, fp4_b, True), d_nt, layout, **kw)
    b_mn = _cast_b_per_group(deep_gemm, b, fp4_b, True, mn_major=True)
    b_nn = (b_mn[0].mT, b_mn[1].mT)
    assert b_nn[0].is_contiguous()
    d_nn = torch.empty((m, n), dtype=torch.bfloat16)
    deep_gemm.m_grouped_fp8_fp4_gemm_nn_contiguous(a_fp8, b_nn, d_nn, layout, **kw)
    assert t.calc_diff(d_nn, ref_d) < _max_diff(fp4_b)
    assert torch.equal(d_nn, d_nt)
    d_bf16 = torch.empty((m, n), dtype=torch.bfloat16)
    deep_gemm.m_grouped_bf16_gemm_nn_contiguous(a, b.mT.contiguous(), d_bf16, layout)
    assert t.calc_diff(d_bf16, ref_d) < 1e-5


# ---------------------------------------------------------------------------------------------
# DeepGEMM style: m-grouped masked (and its psum rebuild with uninitialised gaps)
# ---------------------------------------------------------------------------------------------

def _masked_to_psum(x: torch.Tensor, psum_m: torch.Tensor, alignment: int) -> torch.Tensor:
    """Groups of x (G, MAX_M, ...) packed at their psum offsets; the gaps stay uninitialised."""
    groups, max_m = x.shape[:2]
    out = torch.empty((groups * max_m, *x.shape[2:]), dtype=x.dtype)
    last = 0
    for i in range(groups):
        end = int(psum_m[i])
        out[last:end] = x[i, :end - last]
        last = align(end, alignment)
    return out


@pytest.mark.parametrize("dg_arch,fp4_b", [("sm90", False), ("sm100", False), ("sm100", True)])
def test_m_grouped_masked_like_deepgemm(deep_gemm, dg_arch, fp4_b):
    t, u = deep_gemm.testing, deep_gemm.utils
    rng = random.Random(2)
    torch.manual_seed(2)
    num_groups, max_m, expected_m, n, k = 4, 96, 40, 128, 384
    use_ue8m0 = t.get_arch_major() == 10
    expected_m_hint = int(expected_m * 1.2)
    deep_gemm.set_mk_alignment_for_contiguous_layout(
        deep_gemm.get_theoretical_mk_alignment_for_contiguous_layout(expected_m_hint))
    alignment = deep_gemm.get_mk_alignment_for_contiguous_layout()
    a = _randn(num_groups, max_m, k)
    b = _randn(num_groups, n, k)
    ref_d = torch.einsum("gmk,gnk->gmn", a.float(), b.float())
    masked_m = torch.tensor([int(expected_m * rng.uniform(0.7, 1.3)) for _ in range(num_groups)], dtype=torch.int)
    masked_m[1] = 0  # an idle expert
    psum_m = torch.empty(num_groups, dtype=torch.int)
    for j in range(num_groups):
        psum_m[j] = (0 if j == 0 else align(int(psum_m[j - 1]), alignment)) + masked_m[j]
    a_q = (torch.empty((num_groups, max_m, k), dtype=torch.float8_e4m3fn),
           torch.empty((num_groups, max_m, ceil_div(k, 128)), dtype=torch.float))
    for j in range(num_groups):
        a_q[0][j], a_q[1][j] = u.per_token_cast_to_fp8(a[j], use_ue8m0=use_ue8m0)
    b_q = _cast_b_per_group(deep_gemm, b, fp4_b, use_ue8m0)
    kw = {"recipe_a": (1, 128), "recipe_b": (1, 32)} if fp4_b else {}

    # psum rebuild first (its gaps are uninitialised A and SFA rows, which must not be read)
    a_psum = (_masked_to_psum(a_q[0], psum_m, alignment), _masked_to_psum(a_q[1], psum_m, alignment))
    d_psum = torch.empty((num_groups * max_m, n), dtype=torch.bfloat16)
    deep_gemm.m_grouped_fp8_fp4_gemm_nt_contiguous(a_psum, b_q, d_psum, psum_m, disable_ue8m0_cast=not use_ue8m0,
                                                   use_psum_layout=True, expected_m_for_psum_layout=expected_m_hint,
                                                   **kw)
    for j in range(num_groups):  # zero SFA rows beyond masked_m, as the generator does
        a_q[1][j, int(masked_m[j]):] = 0
    d = torch.empty((num_groups, max_m, n), dtype=torch.bfloat16)
    deep_gemm.m_grouped_fp8_fp4_gemm_nt_masked(a_q, b_q, d, masked_m, expected_m_hint,
                                               disable_ue8m0_cast=not use_ue8m0, **kw)
    for j in range(num_groups):
        rows = int(masked_m[j])
        if rows == 0:
            continue
        diff = t.calc_diff(d[j, :rows], ref_d[j, :rows])
        assert diff < _max_diff(fp4_b), f"{dg_arch=}, group {j}, masked_m={rows}, {diff:.5f}"
        start = 0 if j == 0 else align(int(psum_m[j - 1]), alignment)
        assert torch.equal(d_psum[start:int(psum_m[j])], d[j, :rows]), f"psum != masked, group {j}"

    d_bf16 = torch.empty((num_groups, max_m, n), dtype=torch.bfloat16)
    deep_gemm.m_grouped_bf16_gemm_nt_masked(a, b, d_bf16, masked_m, expected_m_hint)
    for j in range(num_groups):
        rows = int(masked_m[j])
        if rows:
            assert t.calc_diff(d_bf16[j, :rows], ref_d[j, :rows]) < 1e-5


# ---------------------------------------------------------------------------------------------
# DeepGEMM style: k-grouped (weight gradients)
# ---------------------------------------------------------------------------------------------

def _k_grouped_cast(dg, x: torch.Tensor, real_ks, ends, gran_k: int):
    """Each group cast per channel on its zero-padded rows: compact SF rows, ceil(k_g / gran_k) each."""
    q = torch.zeros(x.shape, dtype=torch.float8_e4m3fn)
    sfs = []
    for kk, end in zip(real_ks, ends, strict=True):
        if kk == 0:
            continue
        group = torch.zeros((align(kk, gran_k), x.shape[1]), dtype=x.dtype)
        group[:kk] = x[end - kk:end]
        gq, gs = dg.utils.per_channel_cast_to_fp8(group, use_ue8m0=True, gran_k=gran_k)
        q[end - kk:end] = gq[:kk]
        sfs.append(gs)
    return q, (torch.cat(sfs) if sfs else torch.empty((0, x.shape[1]), dtype=torch.float))


def _k_grouped_case(real_ks, k_alignment: int, m: int, n: int, psum: bool):
    """a (SUM_K, M), b (SUM_K, N) bf16 with zero gaps, c, the layout and the float32 reference."""
    if psum:
        ends, prev = [], 0
        for kk in real_ks:
            ends.append(align(prev, k_alignment) + kk)
            prev = ends[-1]
        total_k = align(ends[-1], k_alignment)
    else:
        ends = [sum(real_ks[:i + 1]) for i in range(len(real_ks))]
        total_k = ends[-1]
    a = torch.zeros((total_k, m), dtype=torch.bfloat16)
    b = torch.zeros((total_k, n), dtype=torch.bfloat16)
    c = torch.randn((len(real_ks), m, n), dtype=torch.float) * 32
    ref_d = c.clone()
    for i, (kk, end) in enumerate(zip(real_ks, ends, strict=True)):
        a[end - kk:end], b[end - kk:end] = _randn(kk, m), _randn(kk, n)
        ref_d[i] += a[end - kk:end].float().T @ b[end - kk:end].float()
    layout = torch.tensor(ends if psum else real_ks, dtype=torch.int32)
    return a, b, c, ref_d, layout, ends


@pytest.mark.parametrize("gran_k,k_alignment", [(32, 32), (32, 128), (128, 128), (128, 224)])
@pytest.mark.parametrize("psum", [False, True])
@pytest.mark.parametrize("dg_arch", ["sm100"])
def test_k_grouped_fp8_like_deepgemm(deep_gemm, dg_arch, gran_k, k_alignment, psum):
    t = deep_gemm.testing
    rng = random.Random(3)
    torch.manual_seed(3)
    num_groups, m, n, expected_k = 4, 64, 96, 192
    deep_gemm.set_mk_alignment_for_contiguous_layout(k_alignment)
    real = [max(1, int(expected_k * rng.uniform(0.7, 1.3))) for _ in range(num_groups)]
    for empty_group in (False, True):
        real_ks = list(real)
        if empty_group:
            real_ks[rng.randint(0, num_groups - 1)] = 0
        elif psum:
            real_ks[0] -= rng.randint(1, min(k_alignment - 1, real_ks[0] - 1))  # a non-aligned first group
        if not psum:
            real_ks = [align(kk, k_alignment) for kk in real_ks]
        aligned_ks = [align(kk, k_alignment) for kk in real_ks]
        a, b, c, ref_d, layout, ends = _k_grouped_case(real_ks, k_alignment, m, n, psum)
        a_fp8, b_fp8 = _k_grouped_cast(deep_gemm, a, real_ks, ends, gran_k), _k_grouped_cast(deep_gemm, b, real_ks, ends, gran_k)
        for ks_cpu in ((aligned_ks, None, []) if psum else (aligned_ks,)):
            d = c.clone()
            deep_gemm.k_grouped_fp8_gemm_tn_contiguous(a_fp8, b_fp8, d, ks_cpu, layout, d, recipe=(1, 1, gran_k),
                                                       use_psum_layout=psum)
            diff = t.calc_diff(d, ref_d)
            assert diff < 0.001, f"{real_ks=}, {ks_cpu=}, {psum=}, {diff:.5f}"
            for g, kk in enumerate(real_ks):
                if kk == 0:
                    assert torch.equal(d[g], c[g])  # an empty group keeps c
        d = c.clone()
        deep_gemm.k_grouped_bf16_gemm_tn_contiguous(a, b, d, aligned_ks, layout, d, use_psum_layout=psum)
        assert t.calc_diff(d, ref_d) < 1e-5


@pytest.mark.parametrize("dg_arch", ["sm90"])
def test_k_grouped_fp8_sm90_flat_like_deepgemm(deep_gemm, dg_arch):
    """SM90: both operands K-major, each group's (MN, k_g) block flattened back to back, per-128 SFs."""
    t = deep_gemm.testing
    torch.manual_seed(4)
    m, n, ks = 64, 128, [256, 128, 384]
    a, b, c, ref_d, layout, _ = _k_grouped_case(ks, 128, m, n, False)
    a_fp8 = _k_grouped_cast(deep_gemm, a, ks, layout.cumsum(0).tolist(), 128)
    b_fp8 = _k_grouped_cast(deep_gemm, b, ks, layout.cumsum(0).tolist(), 128)
    flat_a = torch.cat([blk.T.flatten() for blk in a_fp8[0].split(ks)])
    flat_b = torch.cat([blk.T.flatten() for blk in b_fp8[0].split(ks)])
    d = c.clone()
    deep_gemm.k_grouped_fp8_gemm_nt_contiguous((flat_a, a_fp8[1].T), (flat_b, b_fp8[1].T), d, ks, layout, d)
    assert t.calc_diff(d, ref_d) < 0.001


# ---------------------------------------------------------------------------------------------
# DeepGEMM-Ascend style: psum only, 256-aligned group starts, per-32 UE8M0 scales, alpha, epilogues
# ---------------------------------------------------------------------------------------------

def _ascend_psum_case(sizes, n: int, k: int, num_rows_extra: int = 0):
    """psum END offsets for the group sizes (a 0 after a non-aligned end repeats that end)."""
    ends, prev = [], 0
    for i, s in enumerate(sizes):
        start = 0 if i == 0 else align(prev, 256)
        end = prev if s == 0 else start + s
        ends.append(end)
        prev = end
    m = align(ends[-1], 256) + num_rows_extra
    a = _randn(m, k)
    b = _randn(len(sizes), n, k)
    ranges = []
    prev = 0
    for i, end in enumerate(ends):
        start = 0 if i == 0 else align(prev, 256)
        ranges.append((start, max(start, end)))
        prev = end
    valid = torch.zeros(m, dtype=torch.bool)
    for start, end in ranges:
        valid[start:end] = True
    a[~valid] = 0  # zero padding rows: the port computes whole 256-row blocks
    return a, b, torch.tensor(ends, dtype=torch.int32), ranges, valid


@pytest.mark.parametrize("fp4_b", [False, True])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float])
@pytest.mark.parametrize("dg_arch", ["ascend950"])
def test_ascend_m_grouped_psum_alpha_per32(deep_gemm, dg_arch, fp4_b, out_dtype):
    t, u = deep_gemm.testing, deep_gemm  # DeepGEMM-Ascend exports the casts at the top level (no utils)
    torch.manual_seed(5)
    n, k, alpha = 256, 512, 0.75
    assert deep_gemm.get_mk_alignment_for_contiguous_layout() == 256
    a, b, ends, ranges, valid = _ascend_psum_case([100, 0, 300, 17], n, k)
    m = a.shape[0]
    a_q = u.per_token_cast_to_fp8(a, use_ue8m0=True, gran_k=32)
    sfa = deep_gemm.transform_sf_into_required_layout(a_q[1], m, k, (1, 1, 32), is_sfa=True)
    assert sfa.dtype == torch.int16
    if fp4_b:
        b_q = (torch.empty((b.shape[0], n, k // 2), dtype=torch.int8), torch.empty((b.shape[0], n, k // 32)))
        for g in range(b.shape[0]):
            b_q[0][g], b_q[1][g] = u.per_token_cast_to_fp4(b[g], use_ue8m0=True, gran_k=32)
    else:
        b_q = (torch.empty((b.shape[0], n, k), dtype=torch.float8_e4m3fn), torch.empty((b.shape[0], n, k // 32)))
        for g in range(b.shape[0]):
            b_q[0][g], b_q[1][g] = u.per_token_cast_to_fp8(b[g], use_ue8m0=True, gran_k=32)
    sfb = deep_gemm.transform_sf_into_required_layout(b_q[1], n, k, (1, 1, 32), num_groups=b.shape[0], is_sfa=False)
    d = torch.full((m, n), float("nan"), dtype=out_dtype)
    deep_gemm.m_grouped_fp8_fp4_gemm_nt_contiguous((a_q[0], sfa), (b_q[0], sfb), d, ends,
                                                   epilogue=deep_gemm.epilogue.Alpha(alpha))
    for g, (start, end) in enumerate(ranges):
        if end > start:
            ref = alpha * (a[start:end].float() @ b[g].float().t())
            diff = t.calc_diff(d[start:end], ref)
            assert diff < _max_diff(fp4_b), f"group {g}, {diff:.5f}"
            # Exact: the same rows through the dense kernel with the same scales and alpha
            dense = torch.empty((end - start, n), dtype=out_dtype)
            deep_gemm.fp8_fp4_gemm_nt((a_q[0][start:end], a_q[1][start:end]), (b_q[0][g], b_q[1][g]), dense,
                                      alpha=alpha)
            assert torch.equal(d[start:end], dense), f"group {g}"
    # every row of the computed 256-row blocks outside the groups holds A_pad @ B_g = 0
    assert torch.equal(d[~valid], torch.zeros_like(d[~valid]))

    # BF16 with the Identity epilogue, and float32 output with alpha
    d_bf16 = torch.empty((m, n), dtype=out_dtype)
    deep_gemm.m_grouped_bf16_gemm_nt_contiguous(a, b, d_bf16, ends, epilogue=deep_gemm.epilogue.Identity())
    d_alpha = torch.empty((m, n), dtype=out_dtype)
    deep_gemm.m_grouped_bf16_gemm_nt_contiguous(a, b, d_alpha, ends, epilogue=deep_gemm.epilogue.Alpha(-2.0))
    for g, (start, end) in enumerate(ranges):
        if end > start:
            ref = a[start:end].float() @ b[g].float().t()
            assert t.calc_diff(d_bf16[start:end], ref) < 1e-5
            assert t.calc_diff(d_alpha[start:end], -2.0 * ref) < 1e-5
    if out_dtype == torch.float:  # exact power-of-two alpha on float32 output
        assert torch.equal(d_alpha[valid], -2.0 * d_bf16[valid])


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float])
@pytest.mark.parametrize("dg_arch", ["ascend950"])
def test_ascend_k_grouped_psum_alpha(deep_gemm, dg_arch, out_dtype):
    """k-grouped: a (K, M), b (K, N), SFs in the data's orientation indexed by absolute K, c is d."""
    t, u = deep_gemm.testing, deep_gemm  # DeepGEMM-Ascend exports the casts at the top level (no utils)
    torch.manual_seed(6)
    m, n, alpha = 64, 128, 0.5
    real_ks = [200, 0, 256, 90]
    ends, prev = [], 0
    for i, kk in enumerate(real_ks):
        ends.append(prev if kk == 0 else (0 if i == 0 else align(prev, 256)) + kk)
        prev = ends[-1]
    total_k = align(ends[-1], 256)
    a = torch.zeros((total_k, m), dtype=torch.bfloat16)
    b = torch.zeros((total_k, n), dtype=torch.bfloat16)
    c = (torch.randn((len(real_ks), m, n)) * 32).to(out_dtype)
    ranges = []
    for kk, end in zip(real_ks, ends, strict=True):
        a[end - kk:end], b[end - kk:end] = _randn(kk, m), _randn(kk, n)
        ranges.append((end - kk, end))
    layout = torch.tensor(ends, dtype=torch.int32)
    a_q = u.per_token_cast_to_fp8(a.T.contiguous(), use_ue8m0=True, gran_k=32)  # (M, K), per 32 along K
    b_q = u.per_token_cast_to_fp8(b.T.contiguous(), use_ue8m0=True, gran_k=32)
    int16_sfs = (deep_gemm.transform_sf_into_required_layout(a_q[1], m, total_k, (1, 1, 32), is_sfa=True),
                 deep_gemm.transform_sf_into_required_layout(b_q[1], n, total_k, (1, 1, 32), is_sfa=False))
    results = []
    for use_int16 in (False, True):  # float32 powers of two, or int16 UE8M0 pairs
        sa, sb = int16_sfs if use_int16 else (a_q[1], b_q[1])
        d = c.clone()
        deep_gemm.k_grouped_fp8_gemm_tn_contiguous((a_q[0].T.contiguous(), sa.T), (b_q[0].T.contiguous(), sb.T),
                                                   d, None, layout, d, epilogue=deep_gemm.epilogue.Alpha(alpha))
        for g, (k0, k1) in enumerate(ranges):
            if k1 == k0:
                assert torch.equal(d[g], c[g])  # an empty group keeps c bit for bit
                continue
            ref = c[g].float() + alpha * (a[k0:k1].float().T @ b[k0:k1].float())
            diff = t.calc_diff(d[g], ref)
            assert diff < 0.001, f"group {g}, {use_int16=}, {diff:.5f}"
        results.append(d)
    assert torch.equal(results[0], results[1])
    d = c.clone()
    deep_gemm.k_grouped_bf16_gemm_tn_contiguous(a, b, d, real_ks, layout, d, epilogue=deep_gemm.epilogue.Alpha(alpha))
    for g, (k0, k1) in enumerate(ranges):
        if k1 == k0:
            assert torch.equal(d[g], c[g])
        else:
            ref = c[g].float() + alpha * (a[k0:k1].float().T @ b[k0:k1].float())
            assert t.calc_diff(d[g], ref) < 1e-5
