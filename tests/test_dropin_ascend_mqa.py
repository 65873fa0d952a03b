"""DeepGEMM-Ascend's MQA-logits test flow, as a client runs it, on the CPU (``testing.npu_shim``).

In this repository's own words, following DeepGEMM-Ascend's ``tests/test_attention.py`` (port 2.5):
bf16 randn queries, keys and weights; q and kv quantised per 32 head-dim elements to FP8 or FP4 with
UE8M0 scales, packed into int16 pairs by ``transform_sf_into_required_layout``; every call first
compiled from ``device='meta'`` tensors inside ``par_compile``, then run on ``'npu'`` tensors (the
CPU) and compared with ``calc_diff`` below 5e-4 against the float32 logits of the dequantised
(quantised) operands on every position the kernel defines; profiled with ``bench_msprof``.  Plain
(compressed rows, causal ranges) and paged (default and NZ cache layouts, requests of several rows).
"""

from __future__ import annotations

from functools import partial

import pytest

from . import ascend_flows
from .ascend_flows import calc_diff, meta
from .ascend_flows import deep_gemm as _dg

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch
npu = ascend_flows.npu  # the autouse fixture: torch.npu on the CPU for every test here

THRESHOLD = 5e-4  # DeepGEMM-Ascend's MQA tolerance against the quantised reference






def quantise(x, fp4: bool):
    """x (rows, D) bf16 -> ((data, int16 SF pairs (rows, D / 64)), dequantised float32 (rows, D))."""
    dg = _dg()
    rows, d = x.shape
    if fp4:
        data, sf = dg.per_token_cast_to_fp4(x, use_ue8m0=True, gran_k=32)
        deq = dg.cast_back_from_fp4(data, sf, gran_k=32)
    else:
        data, sf = dg.per_token_cast_to_fp8(x, use_ue8m0=True, gran_k=32)
        deq = (data.float().reshape(rows, d // 32, 32) * sf.reshape(rows, d // 32, 1)).reshape(rows, d)
    pairs = dg.transform_sf_into_required_layout(sf, rows, d, (1, 1, 32), is_sfa=True)
    return (data, pairs), deq


def reference(q_deq, kv_deq, w):
    """logits[i, j] = sum_h w[i, h] * relu(q[i, h] . kv[j]) in float32: (T, H, D) x (S, D) -> (T, S)."""
    scores = torch.einsum("thd,sd->ths", q_deq, kv_deq).clamp_min(0)
    return torch.einsum("ths,th->ts", scores, w.float())


def _plain_case(seq, seq_kv, heads, d, fp4, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn((seq, heads, d), generator=g).to(torch.bfloat16)
    kv = torch.randn((seq_kv, d), generator=g).to(torch.bfloat16)
    w = torch.randn((seq, heads), generator=g).to(torch.bfloat16)
    (qd, qs), q_deq = quantise(q.reshape(-1, d), fp4)
    kv_in, kv_deq = quantise(kv, fp4)
    q_in = (qd.reshape(seq, heads, -1), qs)
    ks = torch.zeros(seq, dtype=torch.int32)
    ke = torch.arange(seq, dtype=torch.int32) + (seq_kv - seq + 1)  # causal
    ks[seq // 2:] = torch.arange(seq - seq // 2, dtype=torch.int32)  # and some shifted starts
    ref = reference(q_deq.reshape(seq, heads, d), kv_deq, w)
    return (q_in, kv_in, w.to("npu"), ks.to("npu"), ke.to("npu"), int((ke - ks).max())), ref, ks, ke


@pytest.mark.parametrize("fp4", [False, True])
def test_plain_mqa_flow(fp4, npu):
    from deep_gemm.testing.bench import bench_msprof
    from deep_gemm.testing.par_compile import par_compile

    dg = _dg()
    cases = [_plain_case(seq, seq_kv, heads, d, fp4, seed)
             for seed, (seq, seq_kv, heads, d) in enumerate([(9, 70, 8, 128), (5, 300, 12, 64), (16, 40, 64, 128)])]
    par_compile([partial(dg.fp8_fp4_mqa_logits, *meta(args[:3]), *meta(args[3:5]), args[5])
                 for args, *_ in cases])
    for args, ref, ks, ke in cases:
        out = dg.fp8_fp4_mqa_logits(*args)
        npu.synchronize()
        width = args[5]
        assert out.dtype == torch.bfloat16 and tuple(out.shape) == (ks.numel(), width)
        assert out.stride(0) == -(-width // 256) * 256
        got, want = [], []
        for i in range(ks.numel()):
            n = int(ke[i] - ks[i])
            got.append(out[i, :n].float())
            want.append(ref[i, int(ks[i]):int(ke[i])])
    assert calc_diff(torch.cat(got), torch.cat(want)) < THRESHOLD
    args = cases[0][0]
    prof = bench_msprof(lambda: dg.fp8_fp4_mqa_logits(*args), kernel_names="mqa_logits", num_warmups=1, num_tests=2)
    assert prof.dur_us > 0


def _paged_cache(kv_in, page: int, nz: bool):
    """DeepGEMM-Ascend's paged cache: per page P tokens' value bytes, then their int16 pairs
    (token-major; with the NZ layout values in 32-byte column fragments, pairs per 16 tokens)."""
    data, pairs = kv_in
    tokens, vbytes = data.shape
    pages = tokens // page
    vals = data.contiguous().view(torch.uint8).reshape(pages, page, vbytes)
    sc = pairs.contiguous().view(torch.uint8).reshape(pages, page, -1)
    if nz:
        vals = vals.reshape(pages, page, vbytes // 32, 32).permute(0, 2, 1, 3)
        p = sc.shape[2] // 2
        sc = sc.reshape(pages, page // 16, 16, p, 2).permute(0, 1, 3, 2, 4)
    flat = torch.cat([vals.reshape(pages, -1), sc.reshape(pages, -1)], dim=1)
    return flat.reshape(pages, page, 1, -1)


@pytest.mark.parametrize("fp4,page,nz", [(False, 64, False), (True, 128, True), (False, 128, True)])
def test_paged_mqa_flow(fp4, page, nz, npu):
    from deep_gemm.testing.par_compile import par_compile

    dg = _dg()
    g = torch.Generator().manual_seed(7)
    heads, d = 16, 128
    per_request = [1, 3, 2]  # rows per request (indices repeat the request id)
    last_len = [70, 2 * page + 5, 0]  # context length of each request's last row
    rows = sum(per_request)
    idx = torch.repeat_interleave(torch.arange(len(per_request), dtype=torch.int32), torch.tensor(per_request))
    ctx_rows = torch.cat([torch.arange(L - n + 1, L + 1).clamp_min(0) for L, n in zip(last_len, per_request,
                                                                                   strict=True)]).to(torch.int32)
    pages_per = [-(-L // page) for L in last_len]
    total_pages = sum(pages_per) + 1
    kv = torch.randn((total_pages * page, d), generator=g).to(torch.bfloat16)
    kv_in, kv_deq = quantise(kv, fp4)
    order = torch.randperm(total_pages, generator=g)
    cache_logical = _paged_cache(kv_in, page, nz)
    cache = torch.empty_like(cache_logical)
    cache[order] = cache_logical  # logical page p lives in physical slot order[p]
    table = torch.zeros((rows, max(pages_per) + 1), dtype=torch.int32)
    start, r = 0, 0
    for n, p in zip(per_request, pages_per, strict=True):
        table[r:r + n, :p] = order[start:start + p].to(torch.int32)
        start, r = start + p, r + n
    q = torch.randn((rows, 1, heads, d), generator=g).to(torch.bfloat16)
    w = torch.randn((rows, heads), generator=g).to(torch.bfloat16)
    (qd, qs), q_deq = quantise(q.reshape(-1, d), fp4)
    q_in = (qd.reshape(rows, 1, heads, -1), qs)
    ctx = ctx_rows.reshape(rows, 1).to("npu")
    max_len = table.shape[1] * page
    schedule = dg.get_paged_mqa_logits_metadata(ctx, heads, idx)
    args = (q_in, cache, w, ctx, table, schedule, max_len, idx)
    par_compile([lambda: dg.fp8_fp4_paged_mqa_logits(*meta(args[:6]), max_len, meta(idx), use_ascend_kv_layout=nz)])
    out = dg.fp8_fp4_paged_mqa_logits(*args, use_ascend_kv_layout=nz)
    npu.synchronize()
    got, want = [], []
    first_row, r = [], 0
    for n in per_request:
        first_row += [r] * n
        r += n
    for i in range(rows):
        L = int(ctx_rows[i])
        if L == 0:
            continue
        logical = torch.tensor([int((order == int(table[first_row[i], p // page])).nonzero()) * page + p % page
                                for p in range(L)])
        ref = reference(q_deq.reshape(rows, heads, d)[i:i + 1], kv_deq[logical], w[i:i + 1])[0]
        got.append(out[i, :L].float())
        want.append(ref)
    assert calc_diff(torch.cat(got), torch.cat(want)) < THRESHOLD
