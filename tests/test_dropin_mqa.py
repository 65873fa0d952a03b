"""Drop-in scripts for the MQA logits (lightning indexer), written the way DeepGEMM's and DeepGEMM-Ascend's tests are.

Plain and paged logits, FP8 and FP4.  Torch tensors, inputs made with ``deep_gemm.utils``, the
returned logits checked with ``calc_diff`` against a float32 reference from the unquantised bf16
inputs and against a "simulated" reference from the dequantised inputs, the -inf masks exactly,
repeated calls bitwise.  The module is the ``deep_gemm`` fixture of deepgemm_ref's pytest plugin:
this file runs against the emulator, or unchanged against the real library with
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


def _simulated_tol(has_bf16: bool) -> float:
    return 3e-5 if has_bf16 else 5e-6


def _ref_mqa_logits(q, kv, weights, ks, ke):
    """float32 sum_h w[i, h] relu(q[i, h] . kv[j]) for ks[i] <= j < ke[i], -inf elsewhere (SEQ, SEQ_KV)."""
    score = torch.einsum("mhd,nd->hmn", q.float(), kv.float())
    logits = torch.einsum("hmn,hm->mn", score.relu(), weights.float().t())
    cols = torch.arange(kv.shape[0])[None, :]
    mask = (cols >= ks[:, None]) & (cols < ke[:, None])
    return logits.masked_fill(~mask, float("-inf"))


def _ks_ke(seq: int, seq_kv: int, cp: bool):
    """Causal ranges, or one context-parallel rank's two chunks (generate_ks_ke_tests)."""
    ks = torch.zeros(seq, dtype=torch.int)
    if not cp:
        return ks, torch.arange(seq, dtype=torch.int) + (seq_kv - seq)
    chunk, cp_size = seq // 2, seq_kv // seq
    cp_id = cp_size // 3
    ke = torch.zeros(seq, dtype=torch.int)
    for i in range(chunk):
        ke[i] = cp_id * chunk + i
        ke[i + chunk] = (cp_size * 2 - 1 - cp_id) * chunk + i
    return ks, ke


# ---------------------------------------------------------------------------------------------
# DeepGEMM style: plain MQA logits
# ---------------------------------------------------------------------------------------------

_PLAIN_CASES = [
    # arch, fp4, heads, head_dim, logits_dtype, weights_dtype
    ("sm100", False, 16, 64, torch.float, torch.float),
    ("sm100", False, 8, 128, torch.bfloat16, torch.bfloat16),
    ("sm100", False, 32, 32, torch.bfloat16, torch.float),
    ("sm100", True, 16, 64, torch.float, torch.float),
    ("sm100", True, 8, 128, torch.bfloat16, torch.bfloat16),
    ("sm90", False, 32, 64, torch.float, torch.float),
    ("sm90", False, 64, 128, torch.bfloat16, torch.float),
]


@pytest.mark.parametrize("dg_arch,fp4,num_heads,head_dim,logits_dtype,weights_dtype", _PLAIN_CASES)
@pytest.mark.parametrize("compressed,clean,cp", [(False, True, False), (True, False, True)])
def test_mqa_logits_like_deepgemm(deep_gemm, dg_arch, fp4, num_heads, head_dim, logits_dtype, weights_dtype, compressed, clean, cp):
    t, u = deep_gemm.testing, deep_gemm.utils
    torch.manual_seed(0)
    seq, seq_kv = 32, 256
    q = torch.randn(seq, num_heads, head_dim, dtype=torch.bfloat16)
    kv = torch.randn(seq_kv, head_dim, dtype=torch.bfloat16)
    weights = torch.randn(seq, num_heads, dtype=torch.float32).to(weights_dtype)
    ks, ke = _ks_ke(seq, seq_kv, cp)
    ref_logits = _ref_mqa_logits(q, kv, weights, ks, ke)

    if fp4:
        q_fp4 = u.per_token_cast_to_fp4(q.view(-1, head_dim), use_ue8m0=True, gran_k=32, use_packed_ue8m0=True)
        q_in = (q_fp4[0].view(seq, num_heads, head_dim // 2), q_fp4[1].view(seq, num_heads))
        q_sim = u.cast_back_from_fp4(q_fp4[0], q_fp4[1], gran_k=32, use_packed_ue8m0=True)
        q_sim = q_sim.view(seq, num_heads, head_dim).to(torch.bfloat16)
        kv_fp4 = u.per_token_cast_to_fp4(kv, use_ue8m0=True, gran_k=32, use_packed_ue8m0=True)
        kv_in = (kv_fp4[0], kv_fp4[1].view(seq_kv))
        kv_sim = u.cast_back_from_fp4(kv_fp4[0], kv_fp4[1], gran_k=32, use_packed_ue8m0=True).to(torch.bfloat16)
    else:
        q_in = (q.to(torch.float8_e4m3fn), None)
        q_sim = q_in[0].to(torch.bfloat16)
        kv_in = u.per_custom_dims_cast_to_fp8(kv, (0,), False)
        kv_sim = (kv_in[0].float() * kv_in[1].unsqueeze(1)).to(torch.bfloat16)
    sim_logits = _ref_mqa_logits(q_sim, kv_sim, weights, ks, ke)

    kwargs = dict(q=q_in, kv=kv_in, weights=weights, cu_seq_len_k_start=ks, cu_seq_len_k_end=ke,
                  clean_logits=clean, max_seqlen_k=0, logits_dtype=logits_dtype)
    if compressed:
        kwargs["max_seqlen_k"] = int((ke - ks).max())
    logits = deep_gemm.fp8_fp4_mqa_logits(**kwargs)
    assert logits.dtype == logits_dtype

    # Self-consistency on the specified elements
    self_mask = torch.arange(logits.size(1))[None, :] < (ke - ks)[:, None] if compressed else None
    masked = logits.masked_fill(~self_mask, 0) if compressed else logits
    again = deep_gemm.fp8_fp4_mqa_logits(**kwargs)
    t.assert_bitwise_equal(again.masked_fill(~self_mask, 0) if compressed else again, masked, "self-consistency")

    if compressed:  # relative columns back to absolute key positions
        assert logits.size() == (seq, kwargs["max_seqlen_k"])
        full = torch.full((seq, seq_kv), float("-inf"))
        for i in range(seq):
            full[i, ks[i]:ke[i]] = logits[i, :ke[i] - ks[i]].float()
        logits = full
    neginf = ref_logits == float("-inf")
    assert torch.equal(logits == float("-inf"), neginf)
    logits, ref_logits, sim_logits = (x.float().masked_fill(neginf, 0) for x in (logits, ref_logits, sim_logits))
    diff, sim_diff = t.calc_diff(logits, ref_logits), t.calc_diff(logits, sim_logits)
    assert diff < (0.02 if fp4 else 1e-3), f"{diff=}"
    has_bf16 = weights_dtype == torch.bfloat16 or logits_dtype == torch.bfloat16
    assert sim_diff < _simulated_tol(has_bf16), f"{sim_diff=}"
    assert t.count_bytes(q_in, kv_in, weights, ks, ke) > 0


@pytest.mark.parametrize("dg_arch", ["sm100"])
def test_legacy_fp8_mqa_logits_is_the_fp8_fp4_kernel(deep_gemm, dg_arch):
    t, u = deep_gemm.testing, deep_gemm.utils
    torch.manual_seed(1)
    seq, seq_kv, num_heads, head_dim = 16, 128, 16, 64
    q = torch.randn(seq, num_heads, head_dim, dtype=torch.bfloat16).to(torch.float8_e4m3fn)
    kv = u.per_custom_dims_cast_to_fp8(torch.randn(seq_kv, head_dim, dtype=torch.bfloat16), (0,), False)
    weights = torch.randn(seq, num_heads)
    ks, ke = _ks_ke(seq, seq_kv, False)
    legacy = deep_gemm.fp8_mqa_logits(q, kv, weights, ks, ke, clean_logits=True)
    new = deep_gemm.fp8_fp4_mqa_logits((q, None), kv, weights, ks, ke, clean_logits=True)
    assert legacy.dtype == torch.float and torch.equal(legacy, new)
    sim = _ref_mqa_logits(q.float(), kv[0].float() * kv[1].unsqueeze(1), weights, ks, ke)
    neginf = sim == float("-inf")
    assert torch.equal(legacy == float("-inf"), neginf)
    assert t.calc_diff(legacy.masked_fill(neginf, 0), sim.masked_fill(neginf, 0)) < 5e-6
    assert legacy.stride(0) >= seq_kv + 256  # a view of the padded allocation


# ---------------------------------------------------------------------------------------------
# DeepGEMM style: paged MQA logits over the fused KV cache bytes
# ---------------------------------------------------------------------------------------------

def _kv_cache_cast_to_fp8(x: torch.Tensor):
    """(blocks, block_kv, 1, D) bf16 -> uint8 (blocks, block_kv, 1, D + 4): values, then float32 scales."""
    num_blocks, block_kv, _, head_dim = x.shape
    sf = x.abs().float().amax(dim=3, keepdim=True).clamp(1e-4) / 448.0
    scaled = (x * (1.0 / sf)).to(torch.float8_e4m3fn)
    cache = torch.empty((num_blocks, block_kv * (head_dim + 4)), dtype=torch.uint8)
    cache[:, :block_kv * head_dim] = scaled.view(num_blocks, block_kv * head_dim).view(torch.uint8)
    cache[:, block_kv * head_dim:] = sf.view(num_blocks, block_kv).view(torch.uint8)
    return cache.view(num_blocks, block_kv, 1, head_dim + 4), (scaled.float() * sf).to(x.dtype)


def _kv_cache_cast_to_fp4(deep_gemm, x: torch.Tensor):
    """(blocks, block_kv, 1, D) bf16 -> uint8 (blocks, block_kv, 1, D / 2 + 4): packed FP4, then packed UE8M0."""
    num_blocks, block_kv, _, head_dim = x.shape
    u = deep_gemm.utils
    packed, sf = u.per_token_cast_to_fp4(x.view(-1, head_dim), use_ue8m0=True, gran_k=32, use_packed_ue8m0=True)
    back = u.cast_back_from_fp4(packed, sf, gran_k=32, use_packed_ue8m0=True).view(num_blocks, block_kv, 1, head_dim)
    cache = torch.empty((num_blocks, block_kv * (head_dim // 2 + 4)), dtype=torch.uint8)
    cache[:, :block_kv * head_dim // 2] = packed.view(num_blocks, block_kv * head_dim // 2).view(torch.uint8)
    cache[:, block_kv * head_dim // 2:] = sf.view(num_blocks, block_kv).view(torch.uint8)
    return cache.view(num_blocks, block_kv, 1, head_dim // 2 + 4), back.to(x.dtype)


def _ref_paged_logits(q, kv_blocks, weights, context_lens, block_table, max_model_len):
    """float32 reference over bf16 KV blocks (blocks, block_kv, 1, D); -inf at p >= context_lens[row]."""
    rows, num_heads, head_dim = q.shape
    block_kv = kv_blocks.shape[1]
    logits = torch.full((rows, max_model_len), float("-inf"))
    for i in range(rows):
        ctx = int(context_lens[i])
        pages = block_table[i, :ceil_div(ctx, block_kv)].long()
        keys = kv_blocks[pages].reshape(-1, head_dim)[:ctx].float()
        score = (q[i].float() @ keys.t()).relu()  # (H, ctx)
        logits[i, :ctx] = (score * weights[i].float()[:, None]).sum(0)
    return logits


_PAGED_CASES = [
    # arch, varlen, fp4, block_kv, next_n, logits_dtype, weights_dtype
    ("sm100", False, False, 64, 2, torch.float, torch.float),
    ("sm100", False, True, 32, 1, torch.bfloat16, torch.bfloat16),
    ("sm100", True, False, 32, 1, torch.bfloat16, torch.float),
    ("sm100", True, True, 64, 1, torch.float, torch.float),
    ("sm90", False, False, 64, 2, torch.float, torch.float),
]


def _random_block_table(blocks_per_seq):
    """(sequences, max blocks) int32: each sequence's blocks, drawn without repetition from one shuffled pool."""
    table = torch.zeros((len(blocks_per_seq), int(blocks_per_seq.max())), dtype=torch.int)
    pool = torch.randperm(int(blocks_per_seq.sum())).int()
    offset = 0
    for i, n in enumerate(blocks_per_seq.tolist()):
        table[i, :n] = pool[offset:offset + n]
        offset += n
    return table


@pytest.mark.parametrize("dg_arch,varlen,fp4,block_kv,next_n,logits_dtype,weights_dtype", _PAGED_CASES)
def test_paged_mqa_logits_like_deepgemm(deep_gemm, dg_arch, varlen, fp4, block_kv, next_n, logits_dtype, weights_dtype):
    t, u = deep_gemm.testing, deep_gemm.utils
    torch.manual_seed(2)
    raw_batch, avg_kv = 6, 160
    num_heads, head_dim = (32, 128) if dg_arch == "sm90" else (16, 64)
    batch = raw_batch
    if varlen:
        tokens_per_seq = torch.randint(1, 4, (raw_batch,), dtype=torch.int)
        indices = torch.arange(raw_batch, dtype=torch.int).repeat_interleave(tokens_per_seq)
        batch, next_n = int(tokens_per_seq.sum()), 1
    else:
        tokens_per_seq, indices = None, None
    q = torch.randn((batch, next_n, num_heads, head_dim), dtype=torch.bfloat16)
    weights = torch.randn((batch * next_n, num_heads)).to(weights_dtype)
    context_lens = torch.randint(int(0.7 * avg_kv), int(1.3 * avg_kv), (raw_batch,), dtype=torch.int)
    max_ctx = context_lens + (tokens_per_seq - 1) if varlen else context_lens
    blocks_per_seq = (max_ctx + block_kv - 1) // block_kv
    max_model_len = int(blocks_per_seq.max()) * block_kv
    num_total_blocks = int(blocks_per_seq.sum())
    kv = torch.randn((num_total_blocks, block_kv, 1, head_dim), dtype=torch.bfloat16)
    block_table = _random_block_table(blocks_per_seq)
    if varlen:  # every token of a sequence sees one more key than the previous one
        context_lens = context_lens.repeat_interleave(tokens_per_seq)
        context_lens += torch.cat([torch.arange(int(n), dtype=torch.int) for n in tokens_per_seq])
        block_table = block_table.repeat_interleave(tokens_per_seq, dim=0)
        context_lens_2d = context_lens.view(-1, 1)
    else:
        context_lens_2d = ((context_lens.unsqueeze(1) + 1) * torch.rand(batch, next_n)).int()
        context_lens_2d[:, -1] = context_lens
    row_lens = context_lens_2d.view(-1)
    row_table = block_table.repeat_interleave(next_n, dim=0) if not varlen else block_table

    if fp4:
        q_fp4 = u.per_token_cast_to_fp4(q.view(-1, head_dim), use_ue8m0=True, gran_k=32, use_packed_ue8m0=True)
        q_in = (q_fp4[0].view(batch, next_n, num_heads, head_dim // 2), q_fp4[1].view(batch, next_n, num_heads))
        q_sim = u.cast_back_from_fp4(q_fp4[0], q_fp4[1], gran_k=32, use_packed_ue8m0=True).to(torch.bfloat16)
        kv_in, kv_sim = _kv_cache_cast_to_fp4(deep_gemm, kv)
    else:
        q_in = (q.to(torch.float8_e4m3fn), None)
        q_sim = q_in[0].to(torch.bfloat16)
        kv_in, kv_sim = _kv_cache_cast_to_fp8(kv)
    q_rows = q.view(-1, num_heads, head_dim)
    ref_logits = _ref_paged_logits(q_rows, kv, weights, row_lens, row_table, max_model_len)
    sim_logits = _ref_paged_logits(q_sim.view(-1, num_heads, head_dim), kv_sim, weights, row_lens, row_table,
                                   max_model_len)

    schedule_meta = deep_gemm.get_paged_mqa_logits_metadata(context_lens_2d, block_kv, deep_gemm.get_num_sms(),
                                                            indices=indices)
    assert schedule_meta.shape == (deep_gemm.get_num_sms() + 1, 2) and schedule_meta.dtype == torch.int
    kwargs = dict(q=q_in, kv_cache=kv_in, weights=weights, context_lens=context_lens_2d, block_table=block_table,
                  schedule_meta=schedule_meta, max_context_len=max_model_len, clean_logits=False,
                  logits_dtype=logits_dtype, indices=indices)
    logits = deep_gemm.fp8_fp4_paged_mqa_logits(**kwargs)
    assert logits.dtype == logits_dtype and logits.shape == (batch * next_n, max_model_len)

    neginf = ~(torch.arange(max_model_len)[None, :] < row_lens[:, None])
    masked = logits.masked_fill(neginf, 0)
    t.assert_bitwise_equal(deep_gemm.fp8_fp4_paged_mqa_logits(**kwargs).masked_fill(neginf, 0), masked,
                         "paged self-consistency")
    logits = masked.float()
    diff = t.calc_diff(logits, ref_logits.masked_fill(neginf, 0))
    sim_diff = t.calc_diff(logits, sim_logits.masked_fill(neginf, 0))
    assert diff < (0.02 if fp4 else 1e-3), f"{diff=}"
    has_bf16 = weights_dtype == torch.bfloat16 or logits_dtype == torch.bfloat16
    assert sim_diff < _simulated_tol(has_bf16), f"{sim_diff=}"

    if not fp4 and logits_dtype == torch.float:  # the legacy wrapper is the same kernel
        legacy = deep_gemm.fp8_paged_mqa_logits(q_in[0], kv_in, weights, context_lens_2d, block_table,
                                                schedule_meta, max_model_len, indices=indices)
        assert torch.equal(legacy.masked_fill(neginf, 0), masked)
    if t.get_arch_major() == 10:  # the kernel reads pages through the table: a permutation changes nothing
        perm = torch.randperm(kv_in.shape[0])
        kv_perm = torch.empty_like(kv_in)
        kv_perm[perm] = kv_in
        kwargs.update(kv_cache=kv_perm, block_table=perm[block_table.long()].int())
        permuted = deep_gemm.fp8_fp4_paged_mqa_logits(**kwargs).masked_fill(neginf, 0)
        assert torch.equal(permuted, masked)


# ---------------------------------------------------------------------------------------------
# DeepGEMM-Ascend style: mandatory per-32 Q scales (int16 UE8M0 pairs), bf16 weights and logits,
# relative columns, max_seqlen_k required, paged caches with int16 scale pairs (and the NZ layout)
# ---------------------------------------------------------------------------------------------

def _ascend_cast(deep_gemm, x: torch.Tensor, fp4: bool, is_sfa: bool):
    """Rows (n, D) -> (data, int16 pairs (n, D / 64), dequantised bf16) with per-32 UE8M0 scales."""
    n, d = x.shape
    u = deep_gemm  # DeepGEMM-Ascend exports the casts at the top level (no utils)
    if fp4:
        data, sf = u.per_token_cast_to_fp4(x, use_ue8m0=True, gran_k=32)
        back = u.cast_back_from_fp4(data, sf, gran_k=32)
    else:
        data, sf = u.per_token_cast_to_fp8(x, use_ue8m0=True, gran_k=32)
        back = data.float() * sf.repeat_interleave(32, dim=1)
    pairs = deep_gemm.transform_sf_into_required_layout(sf, n, d, (1, 1, 32), is_sfa=is_sfa)
    assert pairs.dtype == torch.int16 and pairs.shape == (n, d // 64)
    return data, pairs, back.to(torch.bfloat16)


@pytest.mark.parametrize("fp4", [False, True])
@pytest.mark.parametrize("num_heads,head_dim", [(12, 64), (8, 128)])
@pytest.mark.parametrize("dg_arch", ["ascend950"])
def test_ascend_mqa_logits_relative_columns(deep_gemm, dg_arch, fp4, num_heads, head_dim):
    t = deep_gemm.testing
    torch.manual_seed(3)
    seq, seq_kv = 24, 200
    q = torch.randn(seq, num_heads, head_dim, dtype=torch.bfloat16)
    kv = torch.randn(seq_kv, head_dim, dtype=torch.bfloat16)
    weights = torch.randn(seq, num_heads, dtype=torch.bfloat16)
    rng = random.Random(3)
    ks = torch.tensor([rng.randint(0, seq_kv // 2) for _ in range(seq)], dtype=torch.int)
    ke = torch.tensor([min(seq_kv, int(s) + rng.randint(0, 120)) for s in ks], dtype=torch.int)
    ke[0] = ks[0]  # an empty range
    max_seqlen_k = int((ke - ks).max())
    q_data, q_pairs, q_sim = _ascend_cast(deep_gemm, q.view(-1, head_dim), fp4, True)
    kv_data, kv_pairs, kv_sim = _ascend_cast(deep_gemm, kv, fp4, False)
    q_in = (q_data.view(seq, num_heads, -1), q_pairs)  # Q scales (T * H, D / 64), MN-major strides
    logits = deep_gemm.fp8_fp4_mqa_logits(q_in, (kv_data, kv_pairs.contiguous()), weights, ks, ke, max_seqlen_k)
    assert logits.dtype == torch.bfloat16 and logits.shape == (seq, max_seqlen_k)
    assert logits.stride(0) == align(max_seqlen_k, 256)

    # Relative columns: column t is key ks + t, defined for t < ke - ks
    defined = torch.arange(max_seqlen_k)[None, :] < (ke - ks)[:, None]
    ref_abs = _ref_mqa_logits(q, kv, weights, ks, ke)
    sim_abs = _ref_mqa_logits(q_sim.view(seq, num_heads, head_dim), kv_sim, weights, ks, ke)
    ref, sim = torch.zeros(seq, max_seqlen_k), torch.zeros(seq, max_seqlen_k)
    for i in range(seq):
        ref[i, :ke[i] - ks[i]] = ref_abs[i, ks[i]:ke[i]]
        sim[i, :ke[i] - ks[i]] = sim_abs[i, ks[i]:ke[i]]
    got = logits.float().masked_fill(~defined, 0)
    assert t.calc_diff(got, ref) < (0.02 if fp4 else 1e-3)
    assert t.calc_diff(got, sim) < 3e-5  # bf16 weights, a bf16 head reduction and bf16 logits
    assert torch.isfinite(got).all()

    # The (T, H, D / 64) form of the same Q scales gives the same bytes
    again = deep_gemm.fp8_fp4_mqa_logits((q_in[0], q_pairs.reshape(seq, num_heads, -1)),
                                         (kv_data, kv_pairs.contiguous()), weights, ks, ke, max_seqlen_k)
    t.assert_bitwise_equal(again.masked_fill(~defined, 0), logits.masked_fill(~defined, 0), "q_sf forms")

    if not fp4:  # unscaled Q: every UE8M0 pair byte 127 (1.0), Q cast straight to e4m3
        ones = torch.full((seq * num_heads, head_dim // 64), 0x7F7F, dtype=torch.int16)
        plain_q = q.to(torch.float8_e4m3fn)
        unscaled = deep_gemm.fp8_fp4_mqa_logits((plain_q, ones), (kv_data, kv_pairs.contiguous()), weights,
                                                ks, ke, max_seqlen_k)
        assert t.calc_diff(unscaled.float().masked_fill(~defined, 0), ref) < 1e-3


def _ascend_cache(data: torch.Tensor, pairs: torch.Tensor, page: int, nz: bool) -> torch.Tensor:
    """Tokens (pages * page, Dbytes) and int16 pairs -> uint8 (pages, page, 1, Dbytes + 2 * (D / 64))."""
    num_pages = data.shape[0] // page
    vals = data.view(torch.uint8).reshape(num_pages, page, -1)
    sfs = pairs.contiguous().view(torch.uint8).reshape(num_pages, page, -1)
    if nz:  # values as 32-byte column fragments of all tokens; pairs per 16 tokens
        vals = vals.reshape(num_pages, page, -1, 32).transpose(1, 2)
        sfs = sfs.reshape(num_pages, page // 16, 16, -1, 2).transpose(2, 3)
    cache = torch.cat([vals.reshape(num_pages, -1), sfs.reshape(num_pages, -1)], dim=1)
    return cache.view(num_pages, page, 1, -1)


@pytest.mark.parametrize("fp4", [False, True])
@pytest.mark.parametrize("page", [64, 128])
@pytest.mark.parametrize("dg_arch", ["ascend950"])
def test_ascend_paged_mqa_logits_kv_layouts(deep_gemm, dg_arch, fp4, page):
    t = deep_gemm.testing
    torch.manual_seed(4)
    raw_batch, num_heads, head_dim = 5, 8, 128
    tokens_per_seq = torch.randint(1, 3, (raw_batch,), dtype=torch.int)
    indices = torch.arange(raw_batch, dtype=torch.int).repeat_interleave(tokens_per_seq)
    rows = int(tokens_per_seq.sum())
    last = torch.randint(page // 2, 3 * page, (raw_batch,), dtype=torch.int)
    context_lens = (last.repeat_interleave(tokens_per_seq)
                    + torch.cat([torch.arange(int(n), dtype=torch.int) for n in tokens_per_seq])).view(-1, 1)
    pages_per_seq = (last + tokens_per_seq - 1 + page - 1) // page
    num_pages = int(pages_per_seq.sum())
    kv = torch.randn((num_pages * page, head_dim), dtype=torch.bfloat16)
    kv_data, kv_pairs, kv_sim = _ascend_cast(deep_gemm, kv, fp4, False)
    block_table = _random_block_table(pages_per_seq)
    block_table = block_table.repeat_interleave(tokens_per_seq, dim=0)
    max_context_len = block_table.shape[1] * page
    q = torch.randn((rows, 1, num_heads, head_dim), dtype=torch.bfloat16)
    q_data, q_pairs, q_sim = _ascend_cast(deep_gemm, q.view(-1, head_dim), fp4, True)
    q_in = (q_data.view(rows, 1, num_heads, -1), q_pairs)
    weights = torch.randn((rows, num_heads), dtype=torch.bfloat16)

    schedule_meta = deep_gemm.get_paged_mqa_logits_metadata(context_lens, num_heads, indices)
    assert schedule_meta.shape == (deep_gemm.get_num_sms() + 1, 2)
    ref = _ref_paged_logits(q.view(rows, num_heads, head_dim), kv.view(num_pages, page, 1, head_dim), weights,
                            context_lens.view(-1), block_table, max_context_len)
    sim = _ref_paged_logits(q_sim.view(rows, num_heads, head_dim), kv_sim.view(num_pages, page, 1, head_dim),
                            weights, context_lens.view(-1), block_table, max_context_len)
    undefined = ~(torch.arange(max_context_len)[None, :] < context_lens)
    outs = []
    for nz in (False, True):
        cache = _ascend_cache(kv_data, kv_pairs, page, nz)
        logits = deep_gemm.fp8_fp4_paged_mqa_logits(q_in, cache, weights, context_lens, block_table, schedule_meta,
                                                    max_context_len, indices, use_ascend_kv_layout=nz)
        assert logits.dtype == torch.bfloat16 and logits.stride(0) == align(max_context_len, 256)
        got = logits.float().masked_fill(undefined, 0)
        assert t.calc_diff(got, ref.masked_fill(undefined, 0)) < (0.02 if fp4 else 1e-3)
        assert t.calc_diff(got, sim.masked_fill(undefined, 0)) < 3e-5
        outs.append(logits.masked_fill(undefined, 0))
    t.assert_bitwise_equal(outs[0], outs[1], "token-major and NZ caches")
