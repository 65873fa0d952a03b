"""Drop-in scripts for DeepEP, written the way DeepEP's and DeepEP-Ascend's tests are.

Every rank's body takes a process group, builds its own inputs from its rank's seed (so any rank
can rebuild every other rank's inputs, as the tests' references do), creates the buffer, dispatches,
combines and checks against a plain torch reference written here: received rows sorted by the
handle's source index, the top-k ids local to the rank, the per-expert prefix sums, expand-mode
slots and their zero padding, and the combine's float32 order (bias first, then one row per owner
rank in master-slot order, one bf16 rounding).  The module is the plugin's ``deep_ep`` fixture and
the ranks come from ``dg_ep_ranks``: threads of this process under the emulator, one process per
rank against the real library (``--dg-backend real`` under an initialised torch.distributed world;
otherwise skipped).  Nothing of deepgemm_ref is imported here.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the drop-in scripts use torch tensors, like DeepEP's tests")
pytestmark = pytest.mark.torch

T_MAX, HIDDEN, TOPK, EXPERTS = 24, 256, 4, 8


def _inputs(rank: int, masked: float = 0.2) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s tokens (bf16), top-k ids (int64, some -1), weights and one bias."""
    gen = torch.Generator().manual_seed(1000 + rank)
    num_tokens = max(1, T_MAX - rank)  # as DeepEP's test: fewer tokens on higher ranks
    x = torch.randn((num_tokens, HIDDEN), generator=gen).to(torch.bfloat16)
    scores = torch.rand((num_tokens, EXPERTS), generator=gen)
    weights, idx = torch.topk(scores, TOPK, dim=-1, largest=True, sorted=False)
    drop = torch.rand((num_tokens, TOPK), generator=gen) < masked
    idx = idx.masked_fill(drop, -1)
    weights = weights.masked_fill(idx < 0, 0)
    bias = torch.randn((num_tokens, HIDDEN), generator=gen).to(torch.bfloat16)
    return x, idx, weights.float(), bias


def _received(rank: int, num_ranks: int) -> list[tuple[int, int]]:
    """(source rank, token) of every token with an expert on ``rank``, in source order."""
    e_l = EXPERTS // num_ranks
    out = []
    for s in range(num_ranks):
        _, idx, _, _ = _inputs(s)
        for t in range(idx.shape[0]):
            if ((idx[t] >= rank * e_l) & (idx[t] < (rank + 1) * e_l)).any():
                out.append((s, t))
    return out


def _buffer(deep_ep, group, fp8: bool, multiple_reduction: bool = True):
    return deep_ep.ElasticBuffer(group, num_max_tokens_per_rank=T_MAX, hidden=HIDDEN, num_topk=TOPK,
                                 use_fp8_dispatch=fp8, allow_multiple_reduction=multiple_reduction)


@pytest.mark.parametrize("num_ranks", [2, 4])
@pytest.mark.parametrize("fp8", [False, True])
def test_dispatch_then_combine_as_deepeps_test(deep_ep, dg_ep_ranks, num_ranks, fp8):
    """Non-expanded dispatch of bf16 or FP8 tokens, checked row by row; then every rank sends its
    received rows back and the combine adds them with the bias in DeepEP's order."""

    def body(group):
        rank = group.rank()
        x, idx, weights, bias = _inputs(rank)
        buf = _buffer(deep_ep, group, fp8)
        payload = deep_ep.utils.math.per_token_cast_to_fp8(x) if fp8 else x
        recv_x, recv_idx, recv_w, handle, _ = buf.dispatch(payload, topk_idx=idx.to(deep_ep.topk_idx_t),
                                                           topk_weights=weights, num_experts=EXPERTS)
        # sort the received rows by their source index (the device's order is its own)
        src = handle.recv_src_metadata[:, 0].long()
        order = torch.argsort(src)
        want = _received(rank, num_ranks)
        assert src[order].tolist() == [s * T_MAX + t for s, t in want]
        e_l = EXPERTS // num_ranks
        rows = recv_x[0] if fp8 else recv_x
        for j, (s, t) in zip(order.tolist(), want, strict=True):
            xs, idxs, ws, _ = _inputs(s)
            if fp8:
                q, sf = deep_ep.utils.math.per_token_cast_to_fp8(xs[t:t + 1])
                assert torch.equal(recv_x[0][j].view(torch.uint8), q[0].view(torch.uint8))
                assert torch.equal(recv_x[1][j], sf[0])
            else:
                assert torch.equal(rows[j].view(torch.int16), xs[t].view(torch.int16))
            local = (idxs[t] >= rank * e_l) & (idxs[t] < (rank + 1) * e_l)
            assert torch.equal(recv_idx[j], torch.where(local, idxs[t] - rank * e_l, -1))
            assert torch.equal(recv_w[j][local], ws[t][local])
        # each owner returns the token as it received it; combine adds bias + one row per owner
        back = per_token_cast_back(deep_ep, recv_x) if fp8 else recv_x
        combined, combined_w, _ = buf.combine(back, handle, topk_weights=recv_w, bias=bias)
        owners = torch.where(idx >= 0, idx // e_l, -1)
        sent = per_token_cast_back(deep_ep, payload) if fp8 else x
        for t in range(x.shape[0]):
            f = bias[t].float()
            first_slot: dict[int, int] = {}
            for k in range(TOPK):  # owners in the order of their master (highest local) slot
                o = int(owners[t, k])
                if o >= 0:
                    first_slot[o] = k
            row = sent[t] if fp8 else x[t]  # what every owner received and returns
            for _ in sorted(first_slot, key=first_slot.get):
                f = f + row.float()
            assert torch.equal(combined[t].view(torch.int16), f.to(torch.bfloat16).view(torch.int16)), t
        assert torch.equal(combined_w, weights)
        return True

    assert all(r is not False for r in dg_ep_ranks(body, num_ranks))


def per_token_cast_back(deep_ep, pair):
    """DeepEP's ``per_token_cast_back`` of an FP8 (x, sf) pair, as bf16 rows."""
    return deep_ep.utils.math.per_token_cast_back(pair[0], pair[1])


@pytest.mark.parametrize("alignment", [1, 16])
def test_expanded_dispatch_slots_padding_and_single_slot_combine(deep_ep, dg_ep_ranks, alignment):
    """Expand mode as DeepGEMM's Mega MoE baseline uses it: every (token, local slot) gets its own
    row inside its expert's aligned region, padding rows are zero, and a combine without multiple
    reduction adds the slot rows alone in top-k order after the bias."""
    num_ranks = 2

    def body(group):
        rank = group.rank()
        x, idx, weights, bias = _inputs(rank)
        buf = _buffer(deep_ep, group, fp8=False, multiple_reduction=False)
        recv_x, _, recv_w, handle, _ = buf.dispatch(x, topk_idx=idx.to(deep_ep.topk_idx_t), topk_weights=weights,
                                                    num_experts=EXPERTS, expert_alignment=alignment, do_expand=True,
                                                    do_zero_padding=True)
        e_l = EXPERTS // num_ranks
        psum = handle.psum_num_recv_tokens_per_expert.long()
        start = 0
        for e in range(e_l):
            # the slots of expert e: (source, token) ascending, one row each
            want = [(s, t) for s in range(num_ranks) for t in range(_inputs(s)[1].shape[0])
                    if (_inputs(s)[1][t] == rank * e_l + e).any()]
            assert int(psum[e]) - start == len(want)
            for i, (s, t) in enumerate(want):
                xs, idxs, ws, _ = _inputs(s)
                k = int((idxs[t] == rank * e_l + e).nonzero()[0])
                assert torch.equal(recv_x[start + i].view(torch.int16), xs[t].view(torch.int16))
                assert recv_w[start + i].item() == ws[t, k].item()
            pad_end = -(-int(psum[e]) // alignment) * alignment
            assert torch.count_nonzero(recv_x[int(psum[e]):pad_end].view(torch.int16)) == 0
            assert torch.count_nonzero(recv_w[int(psum[e]):pad_end]) == 0
            start = pad_end
        # each slot row scaled by its weight, then combined: bias, then the slots in top-k order
        y = (recv_x.float() * recv_w.unsqueeze(1)).to(torch.bfloat16)
        combined, _, _ = buf.combine(y, handle, bias=bias)
        for t in range(x.shape[0]):
            f = bias[t].float()
            for k in range(TOPK):
                if idx[t, k] >= 0:
                    f = f + (x[t].float() * weights[t, k]).to(torch.bfloat16).float()
            assert torch.equal(combined[t].view(torch.int16), f.to(torch.bfloat16).view(torch.int16)), t
        return True

    assert all(r is not False for r in dg_ep_ranks(body, num_ranks))


def test_cached_dispatch_reuses_the_layout(deep_ep, dg_ep_ranks):
    """A second dispatch with the first one's handle places new rows exactly where the first put its
    tokens and returns the same handle, its metadata unchanged."""

    def body(group):
        rank = group.rank()
        x, idx, weights, _ = _inputs(rank)
        buf = _buffer(deep_ep, group, fp8=False)
        recv_x, _, _, handle, _ = buf.dispatch(x, topk_idx=idx.to(deep_ep.topk_idx_t), topk_weights=weights,
                                               num_experts=EXPERTS)
        meta = handle.recv_src_metadata.clone()
        again, _, _, handle2, _ = buf.dispatch(-x, handle=handle)
        assert handle2 is handle and torch.equal(handle.recv_src_metadata, meta)
        assert torch.equal(again.view(torch.int16), (-recv_x).view(torch.int16))
        return True

    assert all(r is not False for r in dg_ep_ranks(body, 2))  # None: a rank of another process


def test_a_bad_argument_raises_on_every_rank_without_a_hang(deep_ep, dg_ep_ranks):
    """An expert id out of range is refused on every rank before any communication."""

    def body(group):
        x, idx, weights, _ = _inputs(group.rank())
        buf = _buffer(deep_ep, group, fp8=False)
        bad = idx.clone()
        bad[0, 0] = EXPERTS + 3
        with pytest.raises((ValueError, RuntimeError, AssertionError)):
            buf.dispatch(x, topk_idx=bad.to(deep_ep.topk_idx_t), topk_weights=weights, num_experts=EXPERTS)
        return True

    assert all(r is not False for r in dg_ep_ranks(body, 2))  # None: a rank of another process
