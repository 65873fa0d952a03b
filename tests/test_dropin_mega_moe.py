"""Drop-in scripts for Mega MoE, written the way DeepGEMM's and DeepGEMM-Ascend's tests are.

Every EP rank runs in this process: the ``dg_group`` fixture of deepgemm_ref's pytest plugin gives
each rank's process group (the emulator's ``EmulatedGroup``), and each rank's script body (buffer,
inputs, weights, the collective kernel call) runs in a loop over the ranks.  The fused layer is
compared with ``calc_diff`` against a plain torch loop over tokens and top-k slots (dequantised x
and weights, SwiGLU with the clamp and the top-k weight, FP8 re-quantisation of the activations
where the kernel has it, L2, combine), and the expert statistics exactly.  The module is the
``deep_gemm`` fixture: against the real library (``--dg-backend real``) the multi-rank loops are
skipped (one process per rank is not driven here).
"""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch", reason="the drop-in scripts use torch tensors, like DeepGEMM's tests")
pytestmark = pytest.mark.torch


def _silu_mul(gate: torch.Tensor, up: torch.Tensor, clamp: float | None) -> torch.Tensor:
    """float32 SwiGLU with DeepGEMM's clamp: gate from above only, up on both sides."""
    if clamp is not None:
        gate, up = gate.clamp(max=clamp), up.clamp(min=-clamp, max=clamp)
    return gate / (1 + torch.exp(-gate)) * up


def _casts(deep_gemm):
    """DeepGEMM's casting helpers: ``deep_gemm.utils`` (DeepGEMM-Ascend exports them at the top level)."""
    return getattr(deep_gemm, "utils", deep_gemm)


def _requant_fp8(deep_gemm, v: torch.Tensor) -> torch.Tensor:
    """Per-32 UE8M0 FP8 re-quantisation of one activation row, dequantised back to float32."""
    q, sf = _casts(deep_gemm).per_token_cast_to_fp8(v.view(1, -1), use_ue8m0=True, gran_k=32)
    return (q.float() * sf.repeat_interleave(32, dim=1)).view(-1)


def _fp4_weights(deep_gemm, w: torch.Tensor):
    """(E_l, N, K) bf16 -> packed FP4 (E_l, N, K / 2) and float32 per-32 UE8M0 scales, plus dequantised float32."""
    groups, n, k = w.shape
    data = torch.empty((groups, n, k // 2), dtype=torch.int8)
    sf = torch.empty((groups, n, k // 32), dtype=torch.float)
    deq = torch.empty((groups, n, k), dtype=torch.float)
    for i in range(groups):
        data[i], sf[i] = _casts(deep_gemm).per_token_cast_to_fp4(w[i], use_ue8m0=True, gran_k=32)
        deq[i] = _casts(deep_gemm).cast_back_from_fp4(data[i], sf[i], gran_k=32)
    return data, sf, deq


class _Rank:
    """One rank's inputs (what each process of DeepGEMM's test creates for itself)."""

    def __init__(self, rank: int, num_tokens: int, hidden: int, intermediate: int, num_experts: int,
                 num_experts_per_rank: int, num_topk: int, masked_ratio: float):
        torch.manual_seed(rank)
        self.num_tokens = num_tokens
        self.x = torch.randn((num_tokens, hidden), dtype=torch.bfloat16)
        self.l1 = torch.randn((num_experts_per_rank, 2 * intermediate, hidden), dtype=torch.bfloat16) * 0.1
        self.l2 = torch.randn((num_experts_per_rank, hidden, intermediate), dtype=torch.bfloat16) * 0.1
        scores = torch.randn((num_tokens, num_experts), dtype=torch.float)
        self.topk_weights, self.topk_idx = torch.topk(scores, num_topk, dim=-1, largest=True, sorted=False)
        if masked_ratio > 0:
            mask = torch.rand(self.topk_idx.shape) < masked_ratio
            self.topk_idx.masked_fill_(mask, -1)
            self.topk_weights.masked_fill_(self.topk_idx < 0, 0)
        if num_tokens > 1:  # one token with every slot masked: its output is zero
            self.topk_idx[-1] = -1
            self.topk_weights[-1] = 0
        self.stats = torch.randint(0, 100, (num_experts_per_rank,), dtype=torch.int)


def _expert(deep_gemm, x_row, l1_w, l2_w, weight: float, clamp, fp8_acts: bool) -> torch.Tensor:
    """One (token, expert) contribution: bf16 L1, SwiGLU times the top-k weight, FP8 or bf16 acts, bf16 L2."""
    h = (x_row @ l1_w.t()).to(torch.bfloat16).float()
    inter = h.numel() // 2  # rows [0, I) gate, [I, 2I) up (un-transformed weights)
    v = _silu_mul(h[:inter], h[inter:], clamp) * weight
    v = _requant_fp8(deep_gemm, v) if fp8_acts else v.to(torch.bfloat16).float()
    return (v @ l2_w.t()).to(torch.bfloat16).float()


def _reference(deep_gemm, ranks, num_experts_per_rank: int, x_deq, w1, w2, clamp, fp8_acts: bool, shared=None):
    """Plain torch loop: y[t] = sum over valid slots k of _expert(x[t], e_k, w_k) (+ the shared expert), in float32."""
    ys = []
    for s, r in enumerate(ranks):
        y = torch.zeros((r.num_tokens, w2[0].shape[1]))
        for t in range(r.num_tokens):
            for k in range(r.topk_idx.shape[1]):
                e = int(r.topk_idx[t, k])
                if e < 0:
                    continue
                owner, local = divmod(e, num_experts_per_rank)  # expert e lives on rank e // E_l
                y[t] += _expert(deep_gemm, x_deq[s][t], w1[owner][local], w2[owner][local],
                                float(r.topk_weights[t, k]), clamp, fp8_acts)
            if shared is not None:
                y[t] += _expert(deep_gemm, x_deq[s][t], shared[0], shared[1], 1.0, clamp, fp8_acts)
        ys.append(y)
    return ys


# ---------------------------------------------------------------------------------------------
# DeepGEMM style (sm100): get_symm_buffer_for_mega_moe, transform_weights_for_mega_moe, both MMA types
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("num_ranks,num_experts,num_topk,masked_ratio", [(2, 8, 4, 0.0), (4, 8, 3, 0.2)])
@pytest.mark.parametrize("dg_arch", ["sm100"])
def test_fp8_fp4_mega_moe_like_deepgemm(deep_gemm, dg_arch, dg_group, num_ranks, num_experts, num_topk, masked_ratio):
    t, u = deep_gemm.testing, deep_gemm.utils
    rng = random.Random(0)
    num_max_tokens_per_rank, hidden, intermediate, clamp = 24, 512, 512, 10.0
    num_experts_per_rank = num_experts // num_ranks
    group = dg_group(num_ranks)  # rank r's process group is group(r)
    ranks, buffers, l1s, l2s = [], [], [], []
    x_deq, w1_deq, w2_deq = [], [], []
    for r in range(num_ranks):
        num_tokens = num_max_tokens_per_rank - rng.randint(0, 8)
        inputs = _Rank(r, num_tokens, hidden, intermediate, num_experts, num_experts_per_rank, num_topk,
                       masked_ratio)
        buffer = deep_gemm.get_symm_buffer_for_mega_moe(group(r), num_experts, num_max_tokens_per_rank,
                                                        num_topk, hidden, intermediate)
        assert buffer.num_max_tokens_per_rank % 384 == 0
        x_fp8 = u.per_token_cast_to_fp8(inputs.x, use_ue8m0=True, gran_k=32, use_packed_ue8m0=True)
        x_sf = u.unpack_ue8m0_from_int(x_fp8[1]).repeat_interleave(32, dim=1)
        x_deq.append(x_fp8[0].float() * x_sf)
        l1 = _fp4_weights(deep_gemm, inputs.l1)
        l2 = _fp4_weights(deep_gemm, inputs.l2)
        w1_deq.append(l1[2])
        w2_deq.append(l2[2])
        l1_sf = deep_gemm.transform_sf_into_required_layout(l1[1], 2 * intermediate, hidden, (1, 32),
                                                            num_experts_per_rank)
        l2_sf = deep_gemm.transform_sf_into_required_layout(l2[1], hidden, intermediate, (1, 32),
                                                            num_experts_per_rank)
        t_l1, t_l2 = deep_gemm.transform_weights_for_mega_moe((l1[0], l1_sf), (l2[0], l2_sf))
        buffer.x[:num_tokens].copy_(x_fp8[0])
        buffer.x_sf[:num_tokens].copy_(x_fp8[1])
        buffer.topk_idx[:num_tokens].copy_(inputs.topk_idx)
        buffer.topk_weights[:num_tokens].copy_(inputs.topk_weights)
        ranks.append(inputs)
        buffers.append(buffer)
        l1s.append(t_l1)
        l2s.append(t_l2)

    stats_before = [r.stats.clone() for r in ranks]
    ys = [torch.empty((r.num_tokens, hidden), dtype=torch.bfloat16) for r in ranks]
    for r in range(num_ranks):  # collective: every rank's call, the last one completes the layer
        deep_gemm.fp8_fp4_mega_moe(y=ys[r], l1_weights=l1s[r], l2_weights=l2s[r], sym_buffer=buffers[r],
                                   cumulative_local_expert_recv_stats=ranks[r].stats,
                                   activation_clamp=clamp, fast_math=True)

    ref = _reference(deep_gemm, ranks, num_experts_per_rank, x_deq, w1_deq, w2_deq, clamp, fp8_acts=True)
    for r in range(num_ranks):
        diff = t.calc_diff(ys[r], ref[r])
        assert diff < 1e-5, f"rank {r}: {diff=}"  # the reference mirrors every rounding
        assert torch.equal(ys[r][-1], torch.zeros(hidden, dtype=torch.bfloat16))  # all slots masked
        assert t.count_bytes(ys[r]) == ranks[r].num_tokens * hidden * 2
    # Stats: every (source rank, token, slot) routed to a local expert adds one
    all_idx = torch.cat([r.topk_idx.flatten() for r in ranks])
    counts = torch.bincount(all_idx[all_idx >= 0], minlength=num_experts).int()
    for r in range(num_ranks):
        expect = stats_before[r] + counts[r * num_experts_per_rank:(r + 1) * num_experts_per_rank]
        assert torch.equal(ranks[r].stats, expect)


@pytest.mark.parametrize("dg_arch", ["sm100"])
def test_bf16_mega_moe_like_deepgemm(deep_gemm, dg_arch, dg_group):
    t = deep_gemm.testing
    num_ranks, num_experts, num_topk = 2, 8, 2
    num_max_tokens_per_rank, hidden, intermediate = 16, 256, 256
    num_experts_per_rank = num_experts // num_ranks
    group = dg_group(num_ranks)  # rank r's process group is group(r)
    ranks, buffers, weights = [], [], []
    for r in range(num_ranks):
        inputs = _Rank(r, num_max_tokens_per_rank - 3 * r, hidden, intermediate, num_experts,
                       num_experts_per_rank, num_topk, 0.1)
        buffer = deep_gemm.get_symm_buffer_for_mega_moe(group(r), num_experts, num_max_tokens_per_rank,
                                                        num_topk, hidden, intermediate, mma_type="bf16xbf16")
        assert str(buffer.x.dtype).endswith("bfloat16") and buffer.x_sf is None
        weights.append(deep_gemm.transform_weights_for_mega_moe(inputs.l1, inputs.l2))
        n = inputs.num_tokens
        buffer.x[:n].copy_(inputs.x)
        buffer.topk_idx[:n].copy_(inputs.topk_idx)
        buffer.topk_weights[:n].copy_(inputs.topk_weights)
        ranks.append(inputs)
        buffers.append(buffer)
    ys = [torch.full((r.num_tokens, hidden), float("nan"), dtype=torch.bfloat16) for r in ranks]
    for r in range(num_ranks):
        deep_gemm.bf16_mega_moe(ys[r], weights[r][0], weights[r][1], buffers[r], ranks[r].stats)
    x_f = [r.x.float() for r in ranks]
    ref = _reference(deep_gemm, ranks, num_experts_per_rank, x_f, [r.l1.float() for r in ranks],
                     [r.l2.float() for r in ranks], None, fp8_acts=False)
    for r in range(num_ranks):
        assert t.calc_diff(ys[r], ref[r]) < 1e-5, r
        assert torch.equal(ys[r][-1], torch.zeros(hidden, dtype=torch.bfloat16))


# ---------------------------------------------------------------------------------------------
# DeepGEMM-Ascend style: SymmBuffer with shared experts, int16 UE8M0 pairs, out-of-range ids masked
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("num_shared_experts", [0, 2])
@pytest.mark.parametrize("dg_arch", ["ascend950"])
def test_ascend_fp8_fp4_mega_moe_with_shared_experts(deep_gemm, dg_arch, dg_group, num_shared_experts):
    t, u = deep_gemm.testing, _casts(deep_gemm)
    num_ranks, num_experts, num_topk = 2, 8, 3
    num_max_tokens_per_rank, hidden, intermediate, clamp = 12, 512, 512, 7.0
    num_experts_per_rank = num_experts // num_ranks
    group = dg_group(num_ranks)  # rank r's process group is group(r)
    torch.manual_seed(100)
    shared_inter = num_shared_experts * intermediate
    shared_l1 = torch.randn((2 * shared_inter, hidden), dtype=torch.bfloat16) * 0.1
    shared_l2 = torch.randn((hidden, shared_inter), dtype=torch.bfloat16) * 0.1
    ranks, buffers, weights, x_deq, w1_deq, w2_deq = [], [], [], [], [], []
    for r in range(num_ranks):
        inputs = _Rank(r, num_max_tokens_per_rank - 2 * r, hidden, intermediate, num_experts,
                       num_experts_per_rank, num_topk, 0.1)
        inputs.stats.zero_()
        inputs.topk_idx[0, 0] = num_experts  # outside [0, E): masked on DeepGEMM-Ascend
        buffer = deep_gemm.SymmBuffer(group(r), num_experts, num_max_tokens_per_rank, num_topk, hidden,
                                      intermediate, num_shared_experts=num_shared_experts)
        n = inputs.num_tokens
        x_fp8 = u.per_token_cast_to_fp8(inputs.x, use_ue8m0=True, gran_k=32)
        x_deq.append(x_fp8[0].float() * x_fp8[1].repeat_interleave(32, dim=1))
        x_pairs = deep_gemm.transform_sf_into_required_layout(x_fp8[1], n, hidden, (1, 1, 32), is_sfa=True)
        assert x_pairs.dtype == torch.int16 and x_pairs.shape == buffer.x_sf[:n].shape
        routed = []
        for w, (mn, k) in ((inputs.l1, (2 * intermediate, hidden)), (inputs.l2, (hidden, intermediate))):
            data, sf, deq = _fp4_weights(deep_gemm, w)
            pairs = deep_gemm.transform_sf_into_required_layout(sf, mn, k, (1, 1, 32),
                                                                num_groups=num_experts_per_rank, is_sfa=False)
            routed.append((data, pairs))
            (w1_deq if w is inputs.l1 else w2_deq).append(deq)
        weights.append(deep_gemm.transform_weights_for_mega_moe(routed[0], routed[1]))
        buffer.x[:n].copy_(x_fp8[0])
        buffer.x_sf[:n].copy_(x_pairs)
        buffer.topk_idx[:n].copy_(inputs.topk_idx)
        buffer.topk_weights[:n].copy_(inputs.topk_weights)
        ranks.append(inputs)
        buffers.append(buffer)

    shared_t, shared_deq = (None, None), None
    if num_shared_experts:  # shared experts: e4m3 weights with int16 pairs, no expert axis
        parts = []
        for w in (shared_l1, shared_l2):
            q, sf = u.per_token_cast_to_fp8(w, use_ue8m0=True, gran_k=32)
            pairs = deep_gemm.transform_sf_into_required_layout(sf, w.shape[0], w.shape[1], (1, 1, 32),
                                                                is_sfa=False)
            parts.append(((q, pairs), q.float() * sf.repeat_interleave(32, dim=1)))
        shared_t = deep_gemm.transform_weights_for_mega_moe(parts[0][0], parts[1][0])
        shared_deq = (parts[0][1], parts[1][1])

    ys = [torch.empty((r.num_tokens, hidden), dtype=torch.bfloat16) for r in ranks]
    for r in range(num_ranks):
        deep_gemm.fp8_fp4_mega_moe(ys[r], weights[r][0], weights[r][1], buffers[r], shared_t[0], shared_t[1],
                                   ranks[r].stats, activation_clamp=clamp)

    for r in ranks:  # the reference skips ids outside [0, E) like the kernel
        r.topk_idx = r.topk_idx.masked_fill(r.topk_idx >= num_experts, -1)
    ref = _reference(deep_gemm, ranks, num_experts_per_rank, x_deq, w1_deq, w2_deq, clamp, fp8_acts=True, shared=shared_deq)
    for r in range(num_ranks):
        diff = t.calc_diff(ys[r], ref[r])
        assert diff < 1e-5, f"rank {r}: {diff=}"  # the reference mirrors every rounding
        if not num_shared_experts:
            assert torch.equal(ys[r][-1], torch.zeros(hidden, dtype=torch.bfloat16))
    all_idx = torch.cat([r.topk_idx.flatten() for r in ranks])
    counts = torch.bincount(all_idx[all_idx >= 0], minlength=num_experts).int()
    for r in range(num_ranks):
        local = counts[r * num_experts_per_rank:(r + 1) * num_experts_per_rank]
        assert torch.equal(ranks[r].stats, local)  # shared experts are not counted
        recv = torch.as_tensor(buffers[r].expert_recv_count)
        assert recv.shape == (num_ranks, num_experts_per_rank) and torch.equal(recv.sum(0), local)
