"""golden.diagnose (issue 18, item 1): every catalogue entry, injected through a stand-in device
module (deepgemm_ref with one kernel replaced by a port with that bug, implemented here
independently of the catalogue's mutations, usually on the device layouts the replay hands the
kernel), is ranked first; correct devices (the fp32 accumulation model) report nothing; a bug
outside the catalogue is "not explained"; the CLI's input errors exit 2."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided

import deepgemm_ref as dg
from deepgemm_ref import golden
from deepgemm_ref.cli import main
from deepgemm_ref.config import Limited
from deepgemm_ref.golden import safetensors as st
from deepgemm_ref.golden.diagnose import CATALOGUE, THRESHOLD, diagnose, entry

from .standin import _fp8_drops_second_k_block, ep_port, replay_through, standin, user_sf

# ---------------------------------------------------------------------------------------------
# the buggy ports (each implements its bug in its own way, not with the catalogue's mutation)
# ---------------------------------------------------------------------------------------------


def _swap_nibbles_via_codes(packed: np.ndarray) -> np.ndarray:
    codes = dg.formats.unpack_fp4(packed)
    swapped = codes.copy()
    swapped[..., 0::2], swapped[..., 1::2] = codes[..., 1::2], codes[..., 0::2]
    return dg.formats.pack_fp4(swapped)


def fp4_swapped_b(a, b, d, *args, **kw):
    return dg.fp8_fp4_gemm_nt(a, (_swap_nibbles_via_codes(b[0]), b[1]), d, *args, **kw)


def fp4_swapped_a_tt(a, b, d, *args, **kw):
    return dg.fp8_fp4_gemm_tt((_swap_nibbles_via_codes(a[0]), a[1]), b, d, *args, **kw)


def fp4_swapped_mqa_kv(q, kv, w, *args, **kw):
    return dg.fp8_fp4_mqa_logits(q, (_swap_nibbles_via_codes(kv[0]), kv[1]), w, *args, **kw)


def sf_a_transposed(a, b, d, *args, **kw):
    """The user-form SFA transposed in memory before the pack (its MN-major buffer read K-major)."""
    m, k = a[0].shape
    u = user_sf(a[1], m, k, 1, 128)
    return dg.fp8_gemm_nt((a[0], np.ascontiguousarray(u.T).reshape(u.shape)), b, d, *args, **kw)


def sf_b_k_major_as_mn_major(a, b, d, *args, **kw):
    n, k = b[0].shape
    u = user_sf(b[1], n, k, 1, 32)
    wrong = np.ascontiguousarray(u).reshape(u.shape[1], u.shape[0]).T
    return dg.fp8_gemm_nt(a, (b[0], np.ascontiguousarray(wrong)), d, *args, **kw)


def sfa_read_unaligned(a, b, d, *args, **kw):
    """sm90's MN-major TMA-aligned float32 SFA read with the unaligned stride (raw memory)."""
    data, sf = a
    m = data.shape[0]
    stride = sf.strides[1] // 4
    storage = as_strided(sf, shape=(sf.shape[1] * stride,), strides=(4,))
    wrong = np.ascontiguousarray(as_strided(storage, shape=(m, sf.shape[1]), strides=(4, 4 * m)))
    return dg.fp8_gemm_nt((data, wrong), b, d, *args, **kw)


def ue8m0_bias_126_on_a(a, b, d, *args, **kw):
    """Every UE8M0 byte of the packed int32 SFA read one higher (in its MN-major TMA layout)."""
    words = np.ascontiguousarray(a[1])
    by = words.view(np.uint8)
    by[by != 0] += 1
    sf = np.empty_like(a[1])
    sf[...] = words
    return dg.fp8_gemm_nt((a[0], sf), b, d, *args, **kw)


def ue8m0_exponent_low(a, b, d, *args, **kw):
    """SFB's exponent field (the UE8M0 byte of each float32 user-form scale) read one low."""
    bits = np.ascontiguousarray(b[1], np.float32).view(np.uint32)
    low = np.where(bits > (1 << 23), bits - np.uint32(1 << 23), bits).astype(np.uint32).view(np.float32)
    return dg.m_grouped_fp8_gemm_nt_contiguous(a, (b[0], low), d, *args, **kw)


def per32_read_as_per128(a, b, d, *args, **kw):
    m, k = a[0].shape
    u = user_sf(a[1], m, k, 1, 32)
    wrong = np.repeat(u[:, : u.shape[1] // 4], 4, axis=1)
    return dg.fp8_gemm_nt((a[0], wrong.astype(np.float32)), b, d, *args, **kw)


def per128_read_as_per32(a, b, d, *args, recipe=None, **kw):
    """SFB per 128 read with index k // 32 (past its end: zero bytes, i.e. 2^-127)."""
    n, k = b[0].shape
    u = user_sf(b[1], n, k, 1, 128)
    kb32 = k // 32
    wrong = np.zeros((n, kb32), np.float32)
    wrong[:, : u.shape[1]] = u
    return dg.fp8_gemm_nt(a, (b[0], wrong), d, *args, recipe_a=(1, 128), recipe_b=(1, 32), **kw)


def sfb_first_block(a, b, d, *args, **kw):
    n, k = b[0].shape
    u = user_sf(b[1], n, k, 1, 128)
    return dg.fp8_gemm_nt(a, (b[0], np.repeat(u[:, :1], u.shape[1], axis=1)), d, *args, **kw)


def k_tail_next_row(a, b, d, *args, **kw):
    k = a.shape[1]
    pad = -k % 64

    def extend(x):
        nxt = np.zeros((x.shape[0], pad), x.dtype)
        nxt[:-1] = x[1:, :pad]
        return np.concatenate([x, nxt], axis=1)

    return dg.bf16_gemm_nt(extend(a), extend(b), d, *args, **kw)


def _dense_rows(a, b, d, rows, g):
    """Rows ``rows`` of an m-grouped FP8 case computed against group ``g`` with the dense GEMM."""
    (ad, asf), (bd, bsf) = a, b
    out = np.zeros((len(rows), d.shape[1]), d.dtype)
    dg.fp8_gemm_nt((ad[rows], asf[rows]), (bd[g], bsf[g]), out, recipe=(1, 128, 128))
    d[rows] = out


def psum_ends_as_starts(a, b, d, layout, *args, use_psum_layout=False, **kw):
    m = d.shape[0]
    for g in range(layout.size):
        lo, hi = int(layout[g]), int(layout[g + 1]) if g + 1 < layout.size else m
        if hi > lo:
            _dense_rows(a, b, d, np.arange(lo, hi), g)


def psum_last_row_short(a, b, d, layout, *args, **kw):
    return dg.m_grouped_fp8_gemm_nt_contiguous(a, b, d, (layout - 1).astype(layout.dtype), *args, **kw)


def masked_one_short(a, b, d, masked_m, expected_m, *args, **kw):
    return dg.m_grouped_fp8_gemm_nt_masked(a, b, d, np.maximum(masked_m - 1, 0), expected_m, *args, **kw)


def k_grouped_ends_short(a, b, d, ks_cpu, layout, *args, **kw):
    return dg.k_grouped_bf16_gemm_tn_contiguous(a, b, d, ks_cpu, (layout - 1).astype(layout.dtype), *args, **kw)


def neg1_tiles_as_group0(a, b, d, m_indices, *args, **kw):
    new = m_indices.copy()
    for t in range(0, m_indices.size, 128):
        tile = m_indices[t:t + 128]
        g = max(int(tile[-1]), 0)
        new[t:t + 128] = np.where(tile >= 0, g, -1)
    return dg.m_grouped_bf16_gemm_nt_contiguous(a, b, d, new, *args, **kw)


def masked_uses_expected_m(a, b, d, masked_m, expected_m, *args, **kw):
    return dg.m_grouped_fp8_gemm_nt_masked(a, b, d, np.full_like(masked_m, expected_m), expected_m, *args, **kw)


def no_c(a, b, d, c=None, **kw):
    return dg.bf16_gemm_nt(a, b, d, **kw)


def c_twice(a, b, d, c=None, **kw):
    dg.bf16_gemm_nt(a, b, d, c=c, **kw)
    d[...] = (d.astype(np.float32) + c.astype(np.float32)).astype(d.dtype)


def c_is_d_ignored(a, b, d, c=None, **kw):
    d[...] = 0
    return dg.fp8_fp4_gemm_nn(a, b, d, **kw)


def no_alpha(a, b, d, *args, alpha=None, **kw):
    return dg.fp8_gemm_nt(a, b, d, *args, **kw)


def truncating_store(a, b, d, *args, **kw):
    d32 = np.zeros(d.shape, np.float32)
    dg.fp8_gemm_nt(a, b, d32, *args, **kw)
    d[...] = (d32.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32).astype(d.dtype)


def transposed_store(a, b, d, *args, **kw):
    tmp = np.zeros_like(d)
    dg.fp8_gemm_nt(a, b, tmp, *args, **kw)
    d[...] = np.ascontiguousarray(tmp.T).reshape(d.shape)


def skipped_tile(a, b, d, *args, **kw):
    dg.fp8_gemm_nt(a, b, d, *args, **kw)
    d[64:128, 128:256] = 0


def hopper_accumulator(a, b, d, *args, **kw):
    with dg.numerics(accumulation=Limited(13, 128)):
        dg.fp8_gemm_nt(a, b, d, *args, **kw)


def mqa_unweighted(q, kv, w, *args, **kw):
    return dg.fp8_fp4_mqa_logits(q, kv, np.ones_like(w), *args, **kw)


def mqa_linear_scores(q, kv, w, ks, ke, clean_logits=True, **kw):
    """Logits without the ReLU, in float64 straight from the dequantised operands."""
    qd = (q[0] if isinstance(q, tuple) else q).astype(np.float32).astype(np.float64)
    k = kv[0].astype(np.float32).astype(np.float64) * np.asarray(kv[1], np.float64).reshape(-1, 1)
    logits = np.einsum("sht,sh->st", np.einsum("shd,td->sht", qd, k), w.astype(np.float64)).astype(np.float32)
    t = np.arange(k.shape[0])
    return np.where((t[None] >= ks[:, None]) & (t[None] < ke[:, None]), logits, -np.inf).astype(np.float32)


_E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])


def _fp4_values(packed, sf_words, dim):
    """Packed E2M1 codes times their per-32 UE8M0 scales (int32 words, 4 bytes each), float64."""
    v = _E2M1[dg.formats.unpack_fp4(packed)]
    by = dg.formats.unpack_ue8m0_int32(np.asarray(sf_words)[..., None])[..., : dim // 32]
    return v * np.repeat(np.exp2(by.astype(np.float64) - 127), 32, axis=-1)


def fp4_mqa_linear_scores(q, kv, w, ks, ke, clean_logits=True, **kw):
    """FP4 logits without the ReLU, decoded from the packed codes and scales by hand."""
    dim = 2 * kv[0].shape[-1]
    qd, kd = _fp4_values(q[0], q[1], dim), _fp4_values(kv[0], kv[1], dim)
    logits = np.einsum("sht,sh->st", np.einsum("shd,td->sht", qd, kd), w.astype(np.float64)).astype(np.float32)
    t = np.arange(kd.shape[0])
    return np.where((t[None] >= ks[:, None]) & (t[None] < ke[:, None]), logits, -np.inf).astype(np.float32)


def mqa_end_one_past(q, kv, w, ks, ke, *args, **kw):
    return dg.fp8_fp4_mqa_logits(q, kv, w, ks, np.minimum(ke + 1, kv[0].shape[0]).astype(ke.dtype), *args, **kw)


def paged_lens_one_short(q, kv_cache, w, lens, *args, **kw):
    return dg.fp8_fp4_paged_mqa_logits(q, kv_cache, w, np.maximum(lens - 1, 0).astype(lens.dtype), *args, **kw)


def block_table_next_block(q, kv_cache, w, lens, table, *args, **kw):
    shifted = np.zeros_like(table)
    shifted[:, :-1] = table[:, 1:]
    return dg.fp8_fp4_paged_mqa_logits(q, kv_cache, w, lens, shifted, *args, **kw)


def fp4_swapped_paged_q(q, kv_cache, *args, **kw):
    return dg.fp8_fp4_paged_mqa_logits((_swap_nibbles_via_codes(q[0]), q[1]), kv_cache, *args, **kw)


def paged_unweighted(q, kv_cache, w, *args, **kw):
    return dg.fp8_fp4_paged_mqa_logits(q, kv_cache, np.ones_like(w), *args, **kw)


def _ascend_dequant(codes, pairs):
    """DeepGEMM-Ascend's MX operand in float64: FP8 codes times the per-32 UE8M0 pair scales."""
    sc = np.exp2(dg.formats.unpack_ue8m0_int16(pairs).astype(np.float64) - 127)
    return codes.astype(np.float32).astype(np.float64) * np.repeat(sc, 32, axis=-1)


def ascend_mqa_linear_scores(q, kv, w, ks, ke, max_k, **kw):
    """DeepGEMM-Ascend logits without the ReLU: each head's score rounded to bf16 (the FIXPIPE),
    the weighted head sum in float64, compressed rows; the kernel's buffer (its row stride) reused."""
    out = dg.fp8_fp4_mqa_logits(q, kv, w, ks, ke, max_k, **kw)
    qd = _ascend_dequant(q[0], np.asarray(q[1]).reshape(*q[0].shape[:2], -1))
    kd = _ascend_dequant(kv[0], kv[1])
    heads = np.einsum("ihd,td->iht", qd, kd).astype(ml_dtypes.bfloat16).astype(np.float64)
    full = np.einsum("iht,ih->it", heads, np.asarray(w).astype(np.float64))
    res = np.full(out.shape, np.nan)
    for i in range(out.shape[0]):
        res[i, : ke[i] - ks[i]] = full[i, ks[i]:ke[i]]
    out[...] = res.astype(out.dtype)
    return out


def ascend_mqa_start_one_past(q, kv, w, ks, ke, *args, **kw):
    return dg.fp8_fp4_mqa_logits(q, kv, w, np.minimum(ks + 1, ke).astype(ks.dtype), ke, *args, **kw)


def ascend_mqa_kv_scale_high(q, kv, w, *args, **kw):
    """Every UE8M0 byte of the int16 KV scale pairs read one higher."""
    pairs = np.ascontiguousarray(kv[1]).copy()
    by = pairs.view(np.uint8)
    by[by != 0] += 1
    return dg.fp8_fp4_mqa_logits(q, (kv[0], pairs), w, *args, **kw)


def mega_minus1_to_expert0(y, l1, l2, buf, stats, **kw):
    idx = buf.topk_idx
    idx[...] = np.where(np.asarray(idx) < 0, 0, np.asarray(idx))
    return dg.fp8_fp4_mega_moe(y, l1, l2, buf, stats, **kw)


def float_sfa_as_ue8m0_bytes(a, b, d, *args, **kw):
    m, k = a[0].shape
    u = user_sf(a[1], m, k, 1, 128)
    kb = u.shape[1]
    by = np.ascontiguousarray(u).view(np.uint8).reshape(m, 4 * kb)[:, :kb].astype(np.float64)
    # user form of a UE8M0 byte: 0 -> 0.0 (read as 2^-127), 255 -> inf (read as NaN)
    vals = np.where(by == 0, 0.0, np.where(by == 255, np.inf, np.exp2(by - 127))).astype(np.float32)
    return dg.fp8_gemm_nt((a[0], vals), b, d, *args, **kw)


def sfa_mantissa_dropped(a, b, d, *args, **kw):
    m, k = a[0].shape
    u = user_sf(a[1], m, k, 1, 128)
    _, e = np.frexp(u)
    return dg.fp8_gemm_nt((a[0], np.ldexp(0.5, e).astype(np.float32)), b, d, *args, **kw)



# issue 27's entries (each port implements its bug itself)

def k_block_b_zeroed(a, b, d, *args, **kw):
    """B's second K block (elements 128..255) zeroed: that block never accumulated."""
    bd = np.array(b[0])
    bd[:, 128:256] = 0
    return dg.fp8_gemm_nt(a, (bd, b[1]), d, *args, **kw)


def bf16_last_partial_block_skipped(a, b, d, *args, **kw):
    k = a.shape[1]
    a2 = np.array(a)
    a2[:, (k - 1) // 64 * 64:] = 0
    return dg.bf16_gemm_nt(a2, b, d, *args, **kw)


def bf16_block_consumed_twice(a, b, d, *args, **kw):
    """K extended with a second copy of K block 1 (elements 64..127) of both operands."""
    a2 = np.concatenate([a, a[:, 64:128]], axis=1)
    b2 = np.concatenate([b, b[:, 64:128]], axis=1)
    return dg.bf16_gemm_nt(a2, b2, d, *args, **kw)


def _rz_f32(x):
    x = np.asarray(x, np.float64)
    _, e = np.frexp(x)
    q = np.ldexp(1.0, e - 24)
    return np.trunc(x / q) * q


def truncating_accumulator(a, b, d, *args, **kw):
    """FP8 GEMM, per 128-element K block: the block sum truncated to float32, added to a float32
    accumulator with truncation (frexp / trunc arithmetic)."""
    (ad, asf), (bd, bsf) = a, b
    m, k = ad.shape
    n = bd.shape[0]
    sa = user_sf(asf, m, k, 1, 128).astype(np.float64)
    sb = user_sf(bsf, n, k, 1, 128).astype(np.float64)
    av, bv = ad.astype(np.float32).astype(np.float64), bd.astype(np.float32).astype(np.float64)
    acc = np.zeros((m, n))
    for j in range(k // 128):
        s = slice(128 * j, 128 * j + 128)
        acc = _rz_f32(acc + _rz_f32((av[:, s] @ bv[:, s].T) * np.outer(sa[:, j], sb[:, j])))
    d[...] = acc.astype(np.asarray(d).dtype)


def sfa_rounded_up(a, b, d, *args, **kw):
    m, k = a[0].shape
    u = user_sf(a[1], m, k, 1, 128).astype(np.float64)
    return dg.fp8_gemm_nt((a[0], np.exp2(np.ceil(np.log2(u))).astype(np.float32)), b, d, *args, **kw)


def sfb_unrounded(a, b, d, *args, **kw):
    """SFB as the quantiser's amax / 448 (the power of two before rounding), per 128-block."""
    n, k = b[0].shape
    u = user_sf(b[1], n, k, 1, 128).astype(np.float64)
    amax = np.abs(b[0].astype(np.float32)).reshape(n, k // 128, 128).max(axis=2)
    return dg.fp8_gemm_nt(a, (b[0], (u * amax / 448.0).astype(np.float32)), d, *args, **kw)


def _unswizzled_with_128(x, dim):
    """FP8 rows of ``dim`` bytes, TMA-swizzled in dim-byte atoms, read back with the 128-byte pattern:
    in each 1024-byte atom, chunk c of 128-byte line r takes the chunk c ^ (r & ~(dim/16 - 1) & 7)."""
    by = np.ascontiguousarray(x).view(np.uint8).reshape(-1, 8, 8, 16)
    r = np.arange(8)[:, None]
    c = np.arange(8)[None, :]
    src = c ^ (r & ~(dim // 16 - 1) & 7)
    out = by[:, np.broadcast_to(r, (8, 8)), src]
    return out.reshape(-1).view(x.dtype).reshape(x.shape)


def mqa_kv_swizzle_128(q, kv, w, *args, **kw):
    return dg.fp8_fp4_mqa_logits(q, (_unswizzled_with_128(kv[0], kv[0].shape[-1]), kv[1]), w, *args, **kw)


def paged_per_token_pages(q, kv_cache, w, lens, table, *args, **kw):
    """Per-token paging on a block cache: logical token t of request r reads token 0 of block
    table.flat[r * width + t] (block 0 past the table's end)."""
    cache = np.asarray(kv_cache)
    blocks, bk, _, row = cache.shape
    vb = row - 4
    raw = np.ascontiguousarray(cache).reshape(blocks, bk * row)
    vals, scs = raw[:, : bk * vb].reshape(blocks, bk, vb), raw[:, bk * vb:].reshape(blocks, bk, 4)
    r_count, width = table.shape
    new_vals = np.zeros((r_count * width, bk, vb), np.uint8)
    new_scs = np.zeros((r_count * width, bk, 4), np.uint8)
    flat = np.asarray(table).reshape(-1)
    for r in range(r_count):
        for t in range(int(np.asarray(lens).reshape(r_count, -1)[r].max())):
            i = r * width + t
            blk = int(flat[i]) if i < flat.size else 0
            new_vals[r * width + t // bk, t % bk] = vals[blk, 0]
            new_scs[r * width + t // bk, t % bk] = scs[blk, 0]
    new = np.concatenate([new_vals.reshape(r_count * width, -1), new_scs.reshape(r_count * width, -1)], axis=1)
    new_table = np.arange(r_count * width, dtype=table.dtype).reshape(r_count, width)
    return dg.fp8_fp4_paged_mqa_logits(q, new.reshape(r_count * width, bk, 1, row).view(cache.dtype), w, lens,
                                       new_table, *args, **kw)



def grouped_k_block_skipped(a, b, d, *args, **kw):
    a2 = np.array(a)
    a2[:, 64:128] = 0
    return dg.m_grouped_bf16_gemm_nt_contiguous(a2, b, d, *args, **kw)


def paged_kv_head_stride_128(q, kv_cache, w, *args, **kw):
    """Each cache block's key rows read 128 bytes apart (a head_dim-128 stride) in the block's memory."""
    cache = np.array(kv_cache)
    blocks, bk, _, row = cache.shape
    vb = row - 4
    raw = cache.reshape(blocks, bk * row).view(np.uint8)
    for i in range(blocks):
        region = raw[i, : bk * vb].copy()
        rows = np.zeros((bk, vb), np.uint8)
        for t in range(bk):
            got = region[t * 128: t * 128 + vb]
            rows[t, : got.size] = got
        raw[i, : bk * vb] = rows.reshape(-1)
    return dg.fp8_fp4_paged_mqa_logits(q, cache, w, *args, **kw)


# DeepEP ports (deepgemm_ref.ep's buffers with a bug; each uses the emulator's own dispatch and
# combine as its transport and computes its bug itself)

def _meta_columns(buf, k):
    """(source column, slot columns) of the handle's metadata: CUDA's order, or DeepEP-Ascend's."""
    return (k, slice(0, k)) if buf._ascend else (0, slice(2, 2 + k))


def _slot_rows_at_source(buf, correct, x, handle):
    """Each source token's slot rows (T, K, H) bf16, fetched with K combines of an expanded layout
    whose x keeps only the rows of slot k (a one-term sum returns its term)."""
    meta = np.asarray(handle.recv_src_metadata)
    k = meta.shape[1] - 2
    n = int(np.asarray(handle.psum_num_recv_tokens_per_scaleup_rank)[-1])
    _, slots = _meta_columns(buf, k)
    xa = np.asarray(x)
    out = []
    for kk in range(k):
        rows = meta[:n, slots][:, kk]
        keep = np.zeros_like(xa)
        keep[rows[rows >= 0]] = xa[rows[rows >= 0]]
        yk, _, _ = correct(keep, handle)
        out.append(np.asarray(yk))
    return np.stack(out, axis=1)


def _biases(bias):
    return [] if bias is None else ([bias] if not isinstance(bias, tuple) else list(bias))


def ep_owners_by_rank(buf, correct, x, handle, topk_weights=None, bias=None, **kw):
    """Adds the owners' partials in rank order (one combine per owner fetches each owner's
    partial at the source: a one-term sum returns its term)."""
    cx, cw, ev = correct(x, handle, topk_weights, bias, **kw)
    xa = np.asarray(x)
    acc = np.zeros(np.shape(cx), np.float32)
    for b in _biases(bias):
        acc += np.asarray(b).astype(np.float32)
    for q in range(buf.num_ranks):
        part, _, _ = correct(xa if buf.rank_idx == q else np.zeros_like(xa), handle)
        acc += np.asarray(part).astype(np.float32)
    return acc.astype(ml_dtypes.bfloat16), cw, ev


def ep_partials_in_float32(buf, correct, x, handle, topk_weights=None, bias=None, **kw):
    """Expanded: each owner's slots summed in float32 and added to the result without rounding."""
    cx, cw, ev = correct(x, handle, topk_weights, bias, **kw)
    rows = _slot_rows_at_source(buf, correct, x, handle).astype(np.float32)
    routing = np.asarray(handle.topk_idx)
    e_l = handle.num_experts // buf.num_ranks
    owner = np.where(routing >= 0, routing // e_l, -1)
    acc = np.zeros(np.shape(cx), np.float32)
    for b in _biases(bias):
        acc += np.asarray(b).astype(np.float32)
    for t in range(routing.shape[0]):
        masters = sorted({int(o): max(kk for kk in range(routing.shape[1]) if owner[t, kk] == o)
                          for o in owner[t] if o >= 0}.items(), key=lambda kv: kv[1])
        for o, _ in masters:
            part = np.float32(0) + np.zeros(rows.shape[-1], np.float32)
            for kk in range(routing.shape[1]):
                if owner[t, kk] == o:
                    part += rows[t, kk]
            acc[t] += part
    return acc.astype(ml_dtypes.bfloat16), cw, ev


def ep_bias_after_rounding(buf, correct, x, handle, topk_weights=None, bias=None, **kw):
    """Adds the bias to the bf16 result, in bf16."""
    cx, cw, ev = correct(x, handle, topk_weights, None, **kw)
    out = np.asarray(cx)
    for b in _biases(bias):
        out = (out.astype(np.float32) + np.asarray(b).astype(np.float32)).astype(ml_dtypes.bfloat16)
    return out, cw, ev


def ep_weights_again(buf, correct, x, handle, topk_weights=None, bias=None, **kw):
    """Expanded: multiplies every slot row by its weight before reducing it (the expert side did already)."""
    xa = np.asarray(x).astype(np.float32) * np.asarray(topk_weights, np.float32)[:, None]
    return correct(xa.astype(ml_dtypes.bfloat16), handle, topk_weights, bias, **kw)


def ep_round_robin_owners(buf, correct, x, topk_idx=None, *args, **kw):
    """Sends expert e to rank e % R as its local expert e // R."""
    idx = np.asarray(topk_idx)
    e_l = kw["num_experts"] // buf.num_ranks
    moved = np.where(idx >= 0, (idx % buf.num_ranks) * e_l + idx // buf.num_ranks, -1).astype(idx.dtype)
    return correct(x, moved, *args, **kw)


def ep_stale_padding(buf, correct, *args, **kw):
    """Leaves each expanded padding row holding the row above it."""
    recv_x, idx, w, handle, ev = correct(*args, **kw)
    psum = np.asarray(handle.psum_num_recv_tokens_per_expert)
    a = handle.expert_alignment
    start = 0
    for end in psum.tolist():
        for row in range(end, -(-end // a) * a):
            if row > start:
                for arr in ([recv_x] if not isinstance(recv_x, tuple) else list(recv_x)) + ([w] if w is not None else []):
                    arr[row] = arr[row - 1]
        start = -(-end // a) * a
    return recv_x, idx, w, handle, ev


def ep_sf_left_zero(buf, correct, *args, **kw):
    """Copies the FP8 rows but not their scale factors (left zero)."""
    recv_x, idx, w, handle, ev = correct(*args, **kw)
    np.asarray(recv_x[1])[...] = 0
    return recv_x, idx, w, handle, ev


def ep_int16_pairs_swapped(buf, correct, *args, **kw):
    """Reads each float32 scale's int16 view high half first."""
    recv_x, idx, w, handle, ev = correct(*args, **kw)
    sf = np.asarray(recv_x[1])
    words = np.ascontiguousarray(sf).view(np.uint32)
    sf[...] = ((words << 16) | (words >> 16)).view(np.int16).reshape(sf.shape)
    return recv_x, idx, w, handle, ev


@dataclass
class Bug:
    entry: str
    spec: dict[str, Any]
    kernel: str
    port: Callable[..., Any]
    params: dict[str, Any] | None = None  # expected parameters of the winning variant (a subset)
    #: the bug stays inside the per-element bound (only its bias shows): diagnosed as the checker's
    #: bias test would hand it over, every report marked failing
    forced: bool = False


def _spec(i: str, kernel: str, profile: str = "sm100", **kw: Any) -> dict[str, Any]:
    return {"id": i, "kernel": kernel, "profile": profile, **kw}


BUGS = [
    Bug("fp4_nibbles_swapped", _spec("fp4b", "fp8_fp4_gemm_nt", m=64, n=96, k=256, b="fp4", gran_k_b=32),
        "fp8_fp4_gemm_nt", fp4_swapped_b, {"operand": "b"}),
    Bug("fp4_nibbles_swapped", _spec("fp4a", "fp8_fp4_gemm_tt", "ascend950", m=32, n=48, k=192, a="fp4", b="fp4",
                                     gran_k_a=32, gran_k_b=32, out="f32"), "fp8_fp4_gemm_tt", fp4_swapped_a_tt,
        {"operand": "a"}),
    Bug("fp4_nibbles_swapped", _spec("fp4mqa", "fp8_fp4_mqa_logits", fp4=True), "fp8_fp4_mqa_logits",
        fp4_swapped_mqa_kv, {"operand": "q or kv (the same logits)"}),
    Bug("sf_transposed", _spec("sft", "fp8_gemm_nt", m=64, n=96, k=384), "fp8_gemm_nt", sf_a_transposed,
        {"operand": "a"}),
    Bug("sf_transposed", _spec("sftb", "fp8_gemm_nt", "ascend950", m=40, n=64, k=256), "fp8_gemm_nt",
        sf_b_k_major_as_mn_major, {"operand": "b", "read": "k_major_read_as_mn_major"}),
    Bug("sf_not_tma_aligned", _spec("tma", "fp8_gemm_nt", "sm90", m=33, n=64, k=384, out="f32", c="is_d"),
        "fp8_gemm_nt", sfa_read_unaligned, {"operand": "a", "stride": "written_aligned_read_unaligned"}),
    Bug("ue8m0_off_by_one", _spec("ue", "fp8_gemm_nt", m=64, n=96, k=384), "fp8_gemm_nt", ue8m0_bias_126_on_a,
        {"decoded": "one operand read 2x"}),
    Bug("ue8m0_off_by_one", _spec("uegrp", "m_grouped_fp8_gemm_nt_contiguous", "ascend950", groups=2, m=60, n=64,
                                  k=128), "m_grouped_fp8_gemm_nt_contiguous", ue8m0_exponent_low,
        {"decoded": "one operand read x1/2"}),
    Bug("gran_k_confused", _spec("g32", "fp8_gemm_nt", "ascend950", m=64, n=64, k=512), "fp8_gemm_nt",
        per32_read_as_per128, {"operand": "a"}),
    Bug("gran_k_confused", _spec("g128", "fp8_gemm_nt", m=64, n=64, k=512), "fp8_gemm_nt", per128_read_as_per32,
        {"operand": "b"}),
    Bug("scale_block_reused", _spec("reuse", "fp8_gemm_nt", m=64, n=96, k=512), "fp8_gemm_nt", sfb_first_block,
        {"operand": "b", "reused": "first_k_block_for_all"}),
    Bug("k_tail_not_zeroed", _spec("tail", "bf16_gemm_nt", m=48, n=40, k=200), "bf16_gemm_nt", k_tail_next_row,
        {"tail": "next_row"}),
    Bug("neg1_rows_as_group0", _spec("neg1", "m_grouped_bf16_gemm_nt_contiguous", groups=3, m=100, n=64, k=128,
                                     psum=False), "m_grouped_bf16_gemm_nt_contiguous", neg1_tiles_as_group0),
    Bug("neg1_rows_as_group0", _spec("neg1moe", "fp8_fp4_mega_moe"), "fp8_fp4_mega_moe", mega_minus1_to_expert0),
    Bug("psum_offsets_shifted", _spec("psum", "m_grouped_fp8_gemm_nt_contiguous", groups=3, m=100, n=64, k=256),
        "m_grouped_fp8_gemm_nt_contiguous", psum_ends_as_starts, {"read": "ends_read_as_starts"}),
    Bug("group_boundary_off_by_one", _spec("bnd", "m_grouped_fp8_gemm_nt_contiguous", groups=3, m=100, n=64,
                                           k=256), "m_grouped_fp8_gemm_nt_contiguous", psum_last_row_short,
        {"boundary": "last_row_unwritten"}),
    Bug("group_boundary_off_by_one", _spec("bndmask", "m_grouped_fp8_gemm_nt_masked", groups=4, m=40, n=64, k=256),
        "m_grouped_fp8_gemm_nt_masked", masked_one_short),
    Bug("group_boundary_off_by_one", _spec("bndk", "k_grouped_bf16_gemm_tn_contiguous", "ascend950", k=300),
        "k_grouped_bf16_gemm_tn_contiguous", k_grouped_ends_short, {"boundary": "last_k_dropped"}),
    Bug("masked_m_ignored", _spec("mask", "m_grouped_fp8_gemm_nt_masked", groups=8, m=40, n=64, k=256, seed=3),
        "m_grouped_fp8_gemm_nt_masked", masked_uses_expected_m, {"rows": "expected_m_rows"}),
    Bug("c_missing", _spec("cmiss", "bf16_gemm_nt", m=48, n=40, k=200, c="separate"), "bf16_gemm_nt", no_c),
    Bug("c_missing", _spec("cmissd", "fp8_fp4_gemm_nn", m=40, n=64, k=320, out="f32", c="is_d"), "fp8_fp4_gemm_nn",
        c_is_d_ignored),
    Bug("c_added_twice", _spec("ctwice", "bf16_gemm_nt", m=48, n=40, k=200, c="separate"), "bf16_gemm_nt", c_twice),
    Bug("alpha_missing", _spec("alpha", "fp8_gemm_nt", "ascend950", m=24, n=32, k=128, c="is_d", alpha=0.75),
        "fp8_gemm_nt", no_alpha),
    Bug("output_truncated", _spec("trunc", "fp8_gemm_nt", m=64, n=96, k=384), "fp8_gemm_nt", truncating_store),
    Bug("output_transposed", _spec("transp", "fp8_gemm_nt", m=64, n=96, k=384), "fp8_gemm_nt", transposed_store),
    Bug("tile_not_written", _spec("tile", "fp8_gemm_nt", m=200, n=300, k=256), "fp8_gemm_nt", skipped_tile,
        {"tile": "64x128"}),
    Bug("narrow_accumulator", _spec("narrow", "fp8_gemm_nt", m=64, n=96, k=1024, out="f32"), "fp8_gemm_nt",
        hopper_accumulator, {"model": "limited(13, 128)"}),
    Bug("mqa_weights_missing", _spec("mqaw", "fp8_fp4_mqa_logits"), "fp8_fp4_mqa_logits", mqa_unweighted),
    Bug("mqa_relu_missing", _spec("mqar", "fp8_fp4_mqa_logits"), "fp8_fp4_mqa_logits", mqa_linear_scores),
    Bug("mqa_kv_range_off_by_one", _spec("mqak", "fp8_fp4_mqa_logits"), "fp8_fp4_mqa_logits", mqa_end_one_past,
        {"ke": "+1"}),
    Bug("mqa_kv_range_off_by_one", _spec("mqap", "fp8_fp4_paged_mqa_logits"), "fp8_fp4_paged_mqa_logits",
        paged_lens_one_short, {"context_lens": "-1"}),
    Bug("paged_block_table_misread", _spec("paged", "fp8_fp4_paged_mqa_logits"), "fp8_fp4_paged_mqa_logits",
        block_table_next_block, {"read": "shifted_by_one_block"}),
    # DeepGEMM-Ascend's MQA (per-head bf16 scores in the golden) and the paged FP4 cache.  The
    # ascend950 MQA check bound (u_acc 2^-8 over n = head_dim + heads, times S = sum_h |w_h| S_h) is
    # loose: a missing ReLU, a doubled KV scale or a shifted block table fails only a few elements of
    # a case, or none (then there is nothing to diagnose); these cases fail.
    Bug("mqa_relu_missing", _spec("mqar4", "fp8_fp4_mqa_logits", fp4=True), "fp8_fp4_mqa_logits",
        fp4_mqa_linear_scores),
    Bug("fp4_nibbles_swapped", _spec("fp4paged", "fp8_fp4_paged_mqa_logits", fp4=True), "fp8_fp4_paged_mqa_logits",
        fp4_swapped_paged_q, {"operand": "q or kv (the same logits)"}),
    Bug("mqa_weights_missing", _spec("ascw", "fp8_fp4_paged_mqa_logits", "ascend950"), "fp8_fp4_paged_mqa_logits",
        paged_unweighted),
    Bug("mqa_relu_missing", _spec("amqar", "fp8_fp4_mqa_logits", "ascend950"), "fp8_fp4_mqa_logits",
        ascend_mqa_linear_scores),
    Bug("mqa_kv_range_off_by_one", _spec("asck", "fp8_fp4_mqa_logits", "ascend950"), "fp8_fp4_mqa_logits",
        ascend_mqa_start_one_past, {"ks": "+1"}),
    Bug("mqa_kv_range_off_by_one", _spec("ascp", "fp8_fp4_paged_mqa_logits", "ascend950"), "fp8_fp4_paged_mqa_logits",
        paged_lens_one_short, {"context_lens": "-1"}),
    Bug("paged_block_table_misread", _spec("apaged", "fp8_fp4_paged_mqa_logits", "ascend950"),
        "fp8_fp4_paged_mqa_logits", block_table_next_block, {"read": "shifted_by_one_block"}),
    Bug("ue8m0_off_by_one", _spec("aue", "fp8_fp4_mqa_logits", "ascend950"), "fp8_fp4_mqa_logits",
        ascend_mqa_kv_scale_high, {"decoded": "one operand read 2x"}),
    Bug("sf_float32_read_as_ue8m0", _spec("f32b", "fp8_gemm_nt", m=64, n=96, k=512), "fp8_gemm_nt",
        float_sfa_as_ue8m0_bytes, {"operand": "a"}),
    Bug("sf_mantissa_dropped", _spec("mant", "fp8_gemm_nt", "sm90", m=48, n=64, k=384, out="f32", c="is_d"),
        "fp8_gemm_nt", sfa_mantissa_dropped, {"operand": "a"}),
    # issue 27
    Bug("k_last_block_dropped", _spec("klast", "fp8_gemm_nt", m=64, n=96, k=256), "fp8_gemm_nt",
        _fp8_drops_second_k_block, {"block": 128, "index": 1}),
    Bug("k_last_block_dropped", _spec("klastbf", "bf16_gemm_nt", m=48, n=40, k=200), "bf16_gemm_nt",
        bf16_last_partial_block_skipped, {"block": 64, "k_range": [192, 200]}),
    Bug("k_block_dropped", _spec("kdrop", "fp8_gemm_nt", m=64, n=96, k=512), "fp8_gemm_nt", k_block_b_zeroed,
        {"block": 128, "index": 1}),
    Bug("k_block_doubled", _spec("kdbl", "bf16_gemm_nt", m=48, n=40, k=256), "bf16_gemm_nt",
        bf16_block_consumed_twice, {"block": 64, "index": 1}),
    Bug("accumulator_truncated", _spec("tacc", "fp8_gemm_nt", m=64, n=96, k=1024, out="f32"), "fp8_gemm_nt",
        truncating_accumulator, {"block": 128}, forced=True),
    Bug("output_truncated", _spec("truncbig", "fp8_gemm_nt", m=32, n=64, k=2048), "fp8_gemm_nt", truncating_store,
        forced=True),
    Bug("sf_rounded_up_to_pow2", _spec("sfup", "fp8_gemm_nt", "sm90", m=48, n=64, k=384, out="f32", c="is_d"),
        "fp8_gemm_nt", sfa_rounded_up, {"operand": "a"}),
    Bug("sf_pow2_kept_float32", _spec("sfkeep", "fp8_gemm_nt", "sm90", m=64, n=96, k=384, ue8m0=True, out="f32",
                                      c="is_d"), "fp8_gemm_nt", sfb_unrounded,
        {"operand": "b"}),
    Bug("mqa_head_dim_misread", _spec("mqa32", "fp8_fp4_mqa_logits", head_dim=32), "fp8_fp4_mqa_logits",
        mqa_kv_swizzle_128, {"read": "swizzle for 128-byte rows", "operand": "kv"}),
    Bug("paged_page_size_mismatch", _spec("page1", "fp8_fp4_paged_mqa_logits"), "fp8_fp4_paged_mqa_logits",
        paged_per_token_pages, {"page_size": "1 (per-token paging)"}),
    Bug("k_block_dropped", _spec("kdropg", "m_grouped_bf16_gemm_nt_contiguous", groups=3, m=100, n=64, k=256),
        "m_grouped_bf16_gemm_nt_contiguous", grouped_k_block_skipped, {"block": 64, "index": 1}),
    Bug("mqa_head_dim_misread", _spec("paged64", "fp8_fp4_paged_mqa_logits", head_dim=64), "fp8_fp4_paged_mqa_logits",
        paged_kv_head_stride_128, {"read": "stride for 128-byte rows", "operand": "kv"}),
    Bug("output_truncated", _spec("truncfew", "fp8_gemm_nt", m=512, n=512, k=4096), "fp8_gemm_nt", truncating_store),
    # DeepEP (the port module replaces deepgemm_ref's ep: kernel "ep").  Another summation order
    # passes the default check (within the bound); it fails a bitwise one, on values where the
    # float32 order matters.
    Bug("ep_combine_order", _spec("eporder", "ep_combine", ranks=4, experts=8, topk=4, bias=2,
                                  combine_check="bitwise", values="adversarial"),
        "ep", ep_port("ep_port_order", combine=ep_owners_by_rank), {"order": "rank"}),
    Bug("ep_partial_not_rounded", _spec("eppart", "ep_combine", ranks=2, experts=4, topk=4, expand=True, bias=0),
        "ep", ep_port("ep_port_partial", combine=ep_partials_in_float32), {"partial": "float32"}),
    Bug("ep_bias_misapplied", _spec("epbias", "ep_combine", bias=2), "ep",
        ep_port("ep_port_bias", combine=ep_bias_after_rounding), {"bias": "added in bf16"}),
    Bug("ep_weights_misapplied", _spec("epw", "ep_combine", expand=True), "ep",
        ep_port("ep_port_weights", combine=ep_weights_again), {"weights": "applied twice"}),
    Bug("ep_expert_wrong_rank", _spec("eprank", "ep_dispatch", ranks=4, experts=16, topk=4), "ep",
        ep_port("ep_port_rank", dispatch=ep_round_robin_owners), {"owner": "round_robin"}),
    Bug("ep_padding_not_zeroed", _spec("eppad", "ep_dispatch", expand=True, alignment=8, zero_padding=True), "ep",
        ep_port("ep_port_pad", dispatch=ep_stale_padding), {"padding": "previous_row"}),
    Bug("ep_sf_not_copied", _spec("epsf", "ep_dispatch", fp8=True), "ep",
        ep_port("ep_port_sf", dispatch=ep_sf_left_zero), {"sf": "not_written"}),
    Bug("ep_sf_int16_misread", _spec("epi16", "ep_dispatch", "ascend950", fp8=True), "ep",
        ep_port("ep_port_i16", dispatch=ep_int16_pairs_swapped), {"int16": "halves_swapped"}),
]


def _inject(tmp_path: Path, bug: Bug, accumulation: str | None = None) -> tuple[Path, Path]:
    bundle = tmp_path / "bundle"
    golden.generate([bug.spec], bundle, force=True)
    port = bug.port
    if accumulation is not None:
        def port(*args: Any, _p: Callable[..., Any] = bug.port, **kw: Any) -> Any:
            with dg.numerics(accumulation=accumulation):
                return _p(*args, **kw)
    mod = standin(f"standin_{bug.spec['id']}_{accumulation or 'exact'}", **{bug.kernel: port})
    out = replay_through(bundle, mod, tmp_path / "device.safetensors")
    return bundle, out


def _ids(b: Bug) -> str:
    return f"{b.entry}-{b.spec['id']}"


def test_every_catalogue_entry_has_an_injection_test():
    assert {b.entry for b in BUGS} == {e.name for e in CATALOGUE}


def test_the_issue_names_are_in_the_catalogue_with_data():
    names = ("fp4_nibbles_swapped sf_transposed sf_not_tma_aligned ue8m0_off_by_one gran_k_confused "
             "scale_block_reused k_tail_not_zeroed neg1_rows_as_group0 psum_offsets_shifted "
             "group_boundary_off_by_one masked_m_ignored c_missing c_added_twice alpha_missing output_truncated "
             "output_transposed tile_not_written narrow_accumulator mqa_weights_missing mqa_relu_missing "
             "mqa_kv_range_off_by_one paged_block_table_misread "
             # the DeepEP issue's port bugs of dispatch and combine
             "ep_combine_order ep_partial_not_rounded ep_bias_misapplied ep_weights_misapplied ep_expert_wrong_rank "
             "ep_padding_not_zeroed ep_sf_not_copied ep_sf_int16_misread "
             # issue 27's entries without a public source
             "k_last_block_dropped k_block_dropped k_block_doubled accumulator_truncated").split()
    for name in names:
        e = entry(name)
        assert e.kernels and e.description and callable(e.mutation) and e.stage in ("inputs", "layout", "call",
                                                                                      "output")
    tracked = [e for e in CATALOGUE if e.name not in names]
    assert tracked and all(e.sources and all(s.startswith("https://github.com/") for s in e.sources)
                           for e in tracked)


def _first_per_entry(bugs: list[Bug]) -> list[Any]:
    """Every bug as a parameter: each catalogue entry's first injection in the default run, its
    other injections in the slow run (default-run time)."""
    seen: set[str] = set()
    out = []
    for b in bugs:
        out.append(b if b.entry not in seen else pytest.param(b, marks=pytest.mark.slow))
        seen.add(b.entry)
    return out


@pytest.mark.parametrize("bug", _first_per_entry(BUGS), ids=_ids)
def test_injected_bug_ranks_first(tmp_path, bug):
    bundle, out = _inject(tmp_path, bug)
    reports = golden.check(bundle, out)
    assert any(r.status == "fail" for r in reports), "the injected bug must make the check fail"
    if bug.forced:  # few or no elements fail: the checker's bias test is the evidence
        assert any((r.bias or {}).get("failed") for r in reports), [(r.id, r.failed, r.bias) for r in reports]
    [d] = diagnose(bundle, out)
    assert d.status == "fail" and d.explained, (d.verdict, [(e.name, e.share) for e in d.explanations])
    best = d.explanations[0]
    assert best.name == bug.entry, [(e.name, e.share, e.exact_share, e.params) for e in d.explanations]
    assert best.share >= THRESHOLD and best.explains
    for k, v in (bug.params or {}).items():
        assert best.params.get(k) == v, best.params


FP32_BUGS = [b for b in BUGS if b.entry in ("c_missing", "ue8m0_off_by_one", "sf_transposed", "psum_offsets_shifted",
                                            "output_transposed", "scale_block_reused")]


@pytest.mark.slow  # default-run time; the same injections run above without float32 accumulation
@pytest.mark.parametrize("bug", FP32_BUGS, ids=_ids)
def test_injected_bug_ranks_first_on_a_float32_accumulating_device(tmp_path, bug):
    """A real device also accumulates in float32 order: the bug is reproduced within the bound, not
    bit for bit, and still ranks first."""
    bundle, out = _inject(tmp_path, bug, accumulation="fp32")
    [d] = diagnose(bundle, out)
    assert d.explained and d.explanations[0].name == bug.entry, [(e.name, e.share) for e in d.explanations]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    root = tmp_path_factory.mktemp("smoke")
    golden.generate(golden.preset("smoke"), root / "bundle")
    return root / "bundle"


def test_float32_accumulation_device_reports_nothing(smoke, tmp_path, capsys):
    out = tmp_path / "fp32.safetensors"
    golden.replay(smoke, out, accumulation="fp32")
    result = diagnose(smoke, out)
    assert len(result) == len(golden.load_bundle(smoke).cases)
    assert all(d.status in ("pass", "warn") and not d.explanations for d in result)
    assert main(["diagnose", str(smoke), "--outputs", str(out)]) == 0
    text = capsys.readouterr().out
    assert "nothing to diagnose" in text and "explained by" not in text and "0 failing" in text


def test_bug_outside_the_catalogue_is_not_explained(smoke, tmp_path):
    out = tmp_path / "o.safetensors"
    golden.replay(smoke, out, cases=["sm100-fp8-nt-bf16"])
    outs = golden.load_outputs(out)
    d = outs["sm100-fp8-nt-bf16/d"].copy()
    rng = np.random.default_rng(0)
    d[rng.integers(0, d.shape[0], 40), rng.integers(0, d.shape[1], 40)] *= 3  # scattered, no pattern
    outs["sm100-fp8-nt-bf16/d"] = d
    st.save_file(outs, tmp_path / "bad.safetensors")
    [res] = diagnose(smoke, tmp_path / "bad.safetensors", cases=["sm100-fp8-nt-bf16"])
    assert res.status == "fail" and not res.explained and res.verdict == "no known bug explains it"
    assert all(not e.explains for e in res.explanations)


def test_diagnose_json_is_strict_and_names_the_best(tmp_path, capsys):
    bundle, out = _inject(tmp_path, next(b for b in BUGS if b.entry == "c_missing"))
    assert main(["diagnose", str(bundle), "--outputs", str(out), "--json"]) == 1

    def refuse(name):
        raise ValueError(name)

    [d] = json.loads(capsys.readouterr().out, parse_constant=refuse)
    assert d["status"] == "fail" and d["best"] == "c_missing" and d["explained"] is True
    assert d["explanations"][0]["share"] >= d["threshold"] == THRESHOLD
    assert d["explanations"][0]["name"] == "c_missing" and d["verdict"] == "explained by c_missing"


def test_diagnose_case_selection_takes_several_ids_per_flag(tmp_path, capsys):
    specs = [_spec("one", "bf16_gemm_nt", m=48, n=40, k=200, c="separate"),
             _spec("two", "bf16_gemm_nt", m=32, n=40, k=64, c="separate"),
             _spec("three", "bf16_gemm_nt", m=16, n=40, k=64, c="separate")]
    bundle = tmp_path / "bundle"
    golden.generate(specs, bundle)
    out = replay_through(bundle, standin("standin_case_selection", bf16_gemm_nt=no_c), tmp_path / "o.safetensors")
    for argv in (["--case", "one", "three"], ["--case", "one", "--case", "three"]):
        assert main(["diagnose", str(bundle), "--outputs", str(out), "--json", *argv]) == 1
        doc = json.loads(capsys.readouterr().out)
        assert [d["id"] for d in doc] == ["one", "three"] and all(d["best"] == "c_missing" for d in doc)


def test_check_diagnose_appends_the_diagnosis(tmp_path, capsys):
    bundle, out = _inject(tmp_path, next(b for b in BUGS if b.entry == "output_transposed"))
    assert main(["check", str(bundle), "--outputs", str(out), "--diagnose", "--quiet"]) == 1
    text = capsys.readouterr().out
    assert "explained by output_transposed" in text and "1. output_transposed" in text
    assert main(["check", str(bundle), "--outputs", str(out), "--diagnose", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["diagnosis"][0]["best"] == "output_transposed" and doc["reports"][0]["status"] == "fail"


def test_large_case_is_screened_on_a_sample_and_confirmed(tmp_path):
    bug = Bug("sf_transposed", _spec("big", "fp8_gemm_nt", m=512, n=1024, k=256), "fp8_gemm_nt", sf_a_transposed)
    bundle, out = _inject(tmp_path, bug)
    [d] = diagnose(bundle, out)
    assert d.sample is not None and d.explanations[0].name == "sf_transposed"
    assert not d.explanations[0].sampled  # recomputed on the whole case
    assert d.explanations[0].share == 1.0 and d.explanations[0].failing == d.failing


@pytest.mark.parametrize("argv,words", [
    (["diagnose", "missing-dir", "--outputs", "x.safetensors"], "not a bundle directory"),
    (["diagnose", "{bundle}", "--outputs", "{tmp}/none.safetensors"], "cannot read the outputs"),
    (["diagnose", "{bundle}", "--outputs", "{out}", "--case", "nope"], "no case 'nope'"),
    (["diagnose", "{bundle}"], "--outputs"),
    (["diagnose", "{bundle}", "--outputs", "{out}", "--lambda", "-1"], "lambda"),
    (["check", "{bundle}", "--outputs", "{out}", "--html", "{tmp}/no/such/dir/r.html"], "does not exist"),
    (["check", "{bundle}", "--outputs", "{out}", "--junit", "{tmp}"], "is a directory"),
])
def test_cli_input_errors_exit_2_without_traceback(tmp_path, capsys, argv, words):
    bundle, out = _inject(tmp_path, next(b for b in BUGS if b.entry == "c_missing"))
    args = [a.format(bundle=bundle, out=out, tmp=tmp_path) for a in argv]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


def test_wrong_shape_outputs_exit_2(tmp_path, capsys):
    bundle, out = _inject(tmp_path, next(b for b in BUGS if b.entry == "c_missing"))
    outs = golden.load_outputs(out)
    outs = {k: np.zeros((3, 3), v.dtype) for k, v in outs.items()}
    st.save_file(outs, tmp_path / "bad.safetensors")
    assert main(["diagnose", str(bundle), "--outputs", str(tmp_path / "bad.safetensors")]) == 2
    assert "expected shape" in capsys.readouterr().err


def test_a_case_whose_replay_failed_cannot_be_diagnosed(tmp_path, capsys):
    bundle = tmp_path / "b"
    golden.generate([_spec("x", "fp8_gemm_nt", m=16, n=32, k=128)], bundle)

    def broken(*args, **kw):
        raise RuntimeError("device fault")

    mod = standin("standin_broken", fp8_gemm_nt=broken)
    with dg.numerics(arch="sm100"):
        golden.replay(bundle, tmp_path / "o.safetensors", module=mod.__name__, use_torch=False)
    [d] = diagnose(bundle, tmp_path / "o.safetensors")
    assert d.status == "error" and "device fault" in d.verdict
    assert main(["diagnose", str(bundle), "--outputs", str(tmp_path / "o.safetensors")]) == 1


def test_catalogue_reference_is_up_to_date():
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    r = subprocess.run([sys.executable, str(root / "docs" / "gen_diagnose.py"), "--check"], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_docs_generator_check_detects_a_stale_page(tmp_path, monkeypatch, capsys):
    """The ``--check`` the test above relies on fails when the page differs from its generator's text."""
    import sys

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "docs"))
    from _gen import run

    page = tmp_path / "diagnose.md"
    monkeypatch.setattr(sys, "argv", ["gen", "--check"])
    assert run(page, lambda: "text\n", "gen") == 1  # missing
    monkeypatch.setattr(sys, "argv", ["gen"])
    assert run(page, lambda: "text\n", "gen") == 0 and page.read_text() == "text\n"
    monkeypatch.setattr(sys, "argv", ["gen", "--check"])
    assert run(page, lambda: "text\n", "gen") == 0
    page.write_text("text, edited by hand\n")
    assert run(page, lambda: "text\n", "gen") == 1
    assert "out of date" in capsys.readouterr().out


def test_a_case_that_only_warns_is_not_diagnosed_and_says_so(tmp_path):
    """Only failing cases are diagnosed.  DeepGEMM-Ascend's MQA bound is loose: the smoke case's
    logits without the ReLU stay inside the deterministic bound (they warn)."""
    bug = Bug("mqa_relu_missing", _spec("ascend950-mqa", "fp8_fp4_mqa_logits", "ascend950"), "fp8_fp4_mqa_logits",
              ascend_mqa_linear_scores)
    bundle, out = _inject(tmp_path, bug)
    [r] = golden.check(bundle, out)
    assert r.status == "warn" and r.failed == 0 and r.warned > 0
    [d] = diagnose(bundle, out)
    assert d.status == "warn" and not d.explanations and "warns" in d.verdict
