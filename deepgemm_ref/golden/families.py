"""Golden case builders for the grouped GEMMs, einsums, the HC prenorm GEMM and MQA logits.

Each builder generates inputs the way DeepGEMM's test generators do (``tests/generators.py``,
``tests/test_attention.py``: seeded normal bf16 data, its quantisers, zeroed padding rows) and
records the exact call.  Parameters (all optional, small defaults):

grouped  ``groups``, ``m`` (expected rows per group), ``n``, ``k``, ``dtype`` ("fp8" / "bf16"),
         ``layout`` ("psum", "m_indices", "masked", "k_grouped").
einsum   ``expr``, ``b`` (batch), ``h``, ``r``, ``d_dim``; ``tf32_hc_prenorm_gemm``: ``m``, ``n``, ``k``.
mqa      ``seq``, ``seq_kv``, ``heads``, ``head_dim``, ``fp4``, ``paged`` (with ``batch``,
         ``block_kv``), ``clean``.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from .. import quant
from ..quant import align, ceil_div
from .cases import ArgRef, BuiltCase, CaseSpec, randn_bf16, register_family

__all__ = ["build_grouped", "build_einsum", "build_mqa"]

BF16 = np.dtype(ml_dtypes.bfloat16)
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)


def _v(x: Any) -> ArgRef:
    return ArgRef("value", (), x)


def _t(name: str) -> ArgRef:
    return ArgRef("tensor", (name,))


def _pair(a: str, b: str) -> ArgRef:
    return ArgRef("pair", (a, b))


def _out(name: str) -> ArgRef:
    return ArgRef("output", (name,))


def _check(out: str, n: int, c: str | None = None, u_acc: float | None = None) -> dict[str, Any]:
    d: dict[str, Any] = {"n": n, "epilogue": {"out": out, "alpha": None, "c": c, "c_mode": "kernel"},
                         "c_epi": int(c is not None)}
    if u_acc is not None:
        d["u_acc"] = u_acc
    return d


# ----------------------------------------------------------------------------------------------
# grouped GEMMs
# ----------------------------------------------------------------------------------------------

def build_grouped(spec: CaseSpec, rng: np.random.Generator) -> BuiltCase:
    kernel = spec.kernel
    ascend = spec.profile == "ascend950"
    groups = int(spec.get("groups", 3))
    exp_m = int(spec.get("m", 40))
    n, k = int(spec.get("n", 64)), int(spec.get("k", 256))
    fp8 = "fp8" in kernel
    ue8m0 = spec.profile != "sm90"
    gran = 32 if ascend else 128
    setup = [] if ascend else [{"function": "set_mk_alignment_for_contiguous_layout", "args": [{"value": 128}]}]
    alignment = 256 if ascend else 128
    if "k_grouped" in kernel:
        return _build_k_grouped(spec, rng, groups, n, k, fp8, ascend, setup)
    if kernel.endswith("_masked"):
        max_m = align(int(exp_m * 1.3) + 1, 64)
        masked = np.array([int(exp_m * rng.uniform(0.7, 1.3)) for _ in range(groups)], np.int32)
        a = randn_bf16(rng, (groups, max_m, k))
        b = randn_bf16(rng, (groups, n, k))
        inputs: dict[str, np.ndarray] = {"masked_m": masked}
        if fp8:
            qa = [quant.per_token_cast_to_fp8(a[g], use_ue8m0=ue8m0, gran_k=gran) for g in range(groups)]
            qb = [quant.per_block_cast_to_fp8(b[g], use_ue8m0=ue8m0, gran_k=gran) for g in range(groups)]
            sfa = np.stack([q[1] for q in qa])
            for g in range(groups):
                sfa[g, masked[g]:] = 0  # DeepGEMM's test zeroes SFA rows past masked_m
            inputs.update(a=np.stack([q[0] for q in qa]), a_sf=sfa, b=np.stack([q[0] for q in qb]),
                          b_sf=np.stack([q[1] for q in qb]))
            args = [_pair("a", "a_sf"), _pair("b", "b_sf")]
        else:
            inputs.update(a=a, b=b)
            args = [_t("a"), _t("b")]
        args += [_out("d"), _t("masked_m"), _v(int(exp_m * 1.2))]
        outputs = {"d": {"init": "zeros", "shape": [groups, max_m, n], "dtype": "bfloat16"}}
        return BuiltCase(spec, inputs, kernel, args, {}, outputs, {}, _check("bf16", k), setup)
    # m-grouped contiguous: psum ends or m_indices
    psum = bool(spec.get("psum", True)) or ascend
    actual = [int(exp_m * rng.uniform(0.7, 1.3)) for _ in range(groups)]
    aligned = [align(x, alignment) for x in actual]
    m = sum(aligned)
    a = randn_bf16(rng, (m, k))
    b = randn_bf16(rng, (groups, n, k))
    layout = np.zeros(groups if psum else m, np.int32)
    start = 0
    for g, (act, al) in enumerate(zip(actual, aligned, strict=True)):
        if psum:
            layout[g] = start + act
        else:
            layout[start:start + act] = g
            layout[start + act:start + al] = -1
        a[start + act:start + al] = 0  # zero padding, as DeepGEMM's generator does
        start += al
    inputs = {"grouped_layout": layout}
    if fp8:
        qa, sfa = quant.per_token_cast_to_fp8(a, use_ue8m0=ue8m0, gran_k=gran)
        if ascend:
            qbs = [quant.per_token_cast_to_fp8(b[g], use_ue8m0=True, gran_k=32) for g in range(groups)]
        else:
            qbs = [quant.per_block_cast_to_fp8(b[g], use_ue8m0=ue8m0, gran_k=gran) for g in range(groups)]
        inputs.update(a=qa, a_sf=sfa, b=np.stack([q[0] for q in qbs]), b_sf=np.stack([q[1] for q in qbs]))
        args = [_pair("a", "a_sf"), _pair("b", "b_sf")]
    else:
        inputs.update(a=a, b=b)
        args = [_t("a"), _t("b")]
    args += [_out("d"), _t("grouped_layout")]
    kwargs = {"use_psum_layout": _v(psum)}
    outputs = {"d": {"init": "zeros", "shape": [m, n], "dtype": "bfloat16"}}
    return BuiltCase(spec, inputs, kernel, args, kwargs, outputs, {}, _check("bf16", k), setup)


def _build_k_grouped(spec: CaseSpec, rng: np.random.Generator, groups: int, n: int, k_avg: int, fp8: bool,
                     ascend: bool, setup: list[dict[str, Any]]) -> BuiltCase:
    m = int(spec.get("m", 48))
    alignment = 256 if ascend else 128
    real = [max(1, int(k_avg * rng.uniform(0.7, 1.3))) for _ in range(groups)]
    if ascend:
        # psum ends along K; group g uses rows [align(end_{g-1}, 256), end_g)
        ends, starts, pos = [], [], 0
        for kg in real:
            starts.append(pos)
            ends.append(pos + kg)
            pos = align(pos + kg, alignment)
        total = ends[-1]
    else:
        ks = [align(x, alignment) for x in real]
        starts = list(np.cumsum([0] + ks[:-1]))
        ends = [s + kg for s, kg in zip(starts, ks, strict=True)]
        total = sum(ks)
    a = np.zeros((total, m), BF16)
    b = np.zeros((total, n), BF16)
    for s0, e0 in zip(starts, ends, strict=True):
        a[s0:e0] = randn_bf16(rng, (e0 - s0, m))
        b[s0:e0] = randn_bf16(rng, (e0 - s0, n))
    c = randn_bf16(rng, (groups, m, n), 32.0).astype(np.float32)
    inputs: dict[str, np.ndarray] = {"c": c}
    if ascend:
        inputs["grouped_layout"] = np.array(ends, np.int32)
        ks_cpu: Any = None
    else:
        inputs["grouped_layout"] = np.array([e - s for s, e in zip(starts, ends, strict=True)], np.int32)
        ks_cpu = [int(e - s) for s, e in zip(starts, ends, strict=True)]
    kwargs: dict[str, ArgRef] = {"c": _out("d")}
    if fp8:
        gran = 32 if ascend else 128
        if ascend:
            qa, sfa = quant.per_channel_cast_to_fp8(_pad_rows(a, gran), use_ue8m0=True, gran_k=gran)
            qb, sfb = quant.per_channel_cast_to_fp8(_pad_rows(b, gran), use_ue8m0=True, gran_k=gran)
            qa, qb = qa[:total], qb[:total]
        else:
            qa, sfa = _per_group_channel_cast(a, starts, ends, gran)
            qb, sfb = _per_group_channel_cast(b, starts, ends, gran)
        inputs.update(a=qa, a_sf=sfa, b=qb, b_sf=sfb)
        args = [_pair("a", "a_sf"), _pair("b", "b_sf")]
        kwargs["recipe"] = _v([1, 1, gran])
    else:
        inputs.update(a=a, b=b)
        args = [_t("a"), _t("b")]
    args += [_out("d"), _v(ks_cpu), _t("grouped_layout")]
    if ascend:
        kwargs["use_psum_layout"] = _v(True)
    outputs = {"d": {"init": "c", "shape": [groups, m, n], "dtype": "float32"}}
    return BuiltCase(spec, inputs, spec.kernel, args, kwargs, outputs, {}, _check("f32", k_avg * 2, c="c"), setup)


def _pad_rows(x: np.ndarray, gran: int) -> np.ndarray:
    out = np.zeros((align(x.shape[0], gran), x.shape[1]), x.dtype)
    out[: x.shape[0]] = x
    return out


def _per_group_channel_cast(
    x: np.ndarray, starts: list[int], ends: list[int], gran: int
) -> tuple[np.ndarray, np.ndarray]:
    """DeepGEMM's k_grouped_per_channel_cast_to_fp8: each group cast alone, SF rows compact."""
    q = np.zeros(x.shape, E4M3)
    sfs = []
    for s0, e0 in zip(starts, ends, strict=True):
        kg = e0 - s0
        if kg == 0:
            continue
        grp = np.zeros((align(kg, gran), x.shape[1]), x.dtype)
        grp[:kg] = x[s0:e0]
        gq, gs = quant.per_channel_cast_to_fp8(grp, use_ue8m0=True, gran_k=gran)
        q[s0:e0] = gq[:kg]
        sfs.append(gs)
    return q, np.concatenate(sfs) if sfs else np.zeros((0, x.shape[1]), np.float32)


register_family("grouped", build_grouped)


# ----------------------------------------------------------------------------------------------
# einsum, fp8_einsum, tf32_hc_prenorm_gemm
# ----------------------------------------------------------------------------------------------

def build_einsum(spec: CaseSpec, rng: np.random.Generator) -> BuiltCase:
    kernel = spec.kernel
    if kernel == "tf32_hc_prenorm_gemm":
        m, n, k = int(spec.get("m", 13)), int(spec.get("n", 24)), int(spec.get("k", 512))
        inputs = {"a": randn_bf16(rng, (m, k)), "b": rng.standard_normal((n, k), dtype=np.float32)}
        outputs = {"d": {"init": "zeros", "shape": [m, n], "dtype": "float32"},
                   "sqr_sum": {"init": "zeros", "shape": [m], "dtype": "float32"}}
        return BuiltCase(spec, inputs, kernel, [_t("a"), _t("b"), _out("d"), _out("sqr_sum")], {}, outputs, {},
                         _check("f32", k))
    expr = spec.get("expr", "bhr,hdr->bhd")
    bsz, h, r, dd = int(spec.get("b", 4)), int(spec.get("h", 2)), int(spec.get("r", 256)), int(spec.get("d_dim", 128))
    if expr != "bhr,hdr->bhd":
        raise ValueError(f"golden einsum builder: only 'bhr,hdr->bhd' is generated; got {expr!r}")
    x = randn_bf16(rng, (bsz, h, r))
    y = randn_bf16(rng, (h, dd, r))
    if kernel == "einsum":
        inputs = {"x": x, "y": y}
        args = [_v(expr), _t("x"), _t("y"), _out("d")]
        kwargs: dict[str, ArgRef] = {}
    else:
        gran = 32 if spec.profile == "ascend950" else 128
        ue8m0 = spec.profile != "sm90"
        qx, sx = quant.per_token_cast_to_fp8(x.reshape(bsz * h, r), use_ue8m0=ue8m0, gran_k=gran)
        qys = [quant.per_block_cast_to_fp8(y[i], use_ue8m0=ue8m0, gran_k=gran) if gran == 128
               else quant.per_token_cast_to_fp8(y[i], use_ue8m0=True, gran_k=32) for i in range(h)]
        inputs = {"x": qx.reshape(bsz, h, r), "x_sf": sx.reshape(bsz, h, -1),
                  "y": np.stack([q[0] for q in qys]), "y_sf": np.stack([q[1] for q in qys])}
        args = [_v(expr), _pair("x", "x_sf"), _pair("y", "y_sf"), _out("d")]
        kwargs = {"recipe": _v([1, 1, 32] if gran == 32 else [1, 128, 128])}
    outputs = {"d": {"init": "zeros", "shape": [bsz, h, dd], "dtype": "bfloat16"}}
    return BuiltCase(spec, inputs, kernel, args, kwargs, outputs, {}, _check("bf16", r))


register_family("einsum", build_einsum)


# ----------------------------------------------------------------------------------------------
# MQA logits
# ----------------------------------------------------------------------------------------------

def _ascend_pairs(sf: np.ndarray) -> np.ndarray:
    """float32 per-32 UE8M0 scales (..., D/32) -> int16 packed pairs (..., D/64)."""
    from .. import formats as fm

    by = (np.ascontiguousarray(sf).view(np.uint32) >> 23).astype(np.uint8)
    return fm.pack_ue8m0_int16(by)


def build_mqa(spec: CaseSpec, rng: np.random.Generator) -> BuiltCase:
    kernel = spec.kernel
    ascend = spec.profile == "ascend950"
    heads, dim = int(spec.get("heads", 8 if not ascend else 4)), int(spec.get("head_dim", 64))
    fp4 = bool(spec.get("fp4", False))
    if "paged" in kernel:
        return _build_paged(spec, rng, heads, dim, fp4, ascend)
    seq, seq_kv = int(spec.get("seq", 16)), int(spec.get("seq_kv", 96))
    q = randn_bf16(rng, (seq, heads, dim))
    kv = randn_bf16(rng, (seq_kv, dim))
    w = rng.standard_normal((seq, heads), dtype=np.float32)
    ks = np.zeros(seq, np.int32)
    ke = np.array([i + seq_kv - seq + 1 for i in range(seq)], np.int32)  # causal, as DeepGEMM's test
    inputs: dict[str, np.ndarray] = {"ks": ks, "ke": ke}
    if ascend:
        qq, qs = quant.per_token_cast_to_fp8(q.reshape(seq * heads, dim), use_ue8m0=True, gran_k=32)
        kq, ksf = quant.per_token_cast_to_fp8(kv, use_ue8m0=True, gran_k=32)
        inputs.update(q=qq.reshape(seq, heads, dim), q_sf=_ascend_pairs(qs).reshape(seq, heads, -1),
                      kv=kq, kv_sf=_ascend_pairs(ksf), w=w.astype(BF16))
        max_k = int((ke - ks).max())
        args = [_pair("q", "q_sf"), _pair("kv", "kv_sf"), _t("w"), _t("ks"), _t("ke"), _v(max_k)]
        kwargs: dict[str, ArgRef] = {}
        out_dtype, out_shape = "bfloat16", [seq, max_k]
        check = _check("bf16", dim + heads, u_acc=2.0**-8)  # bf16 head chain on the device
    else:
        if fp4:
            qq, qs = quant.per_token_cast_to_fp4(q.reshape(seq * heads, dim), use_ue8m0=True, gran_k=32,
                                                 use_packed_ue8m0=True)
            kq, ksf = quant.per_token_cast_to_fp4(kv, use_ue8m0=True, gran_k=32, use_packed_ue8m0=True)
            inputs.update(q=qq.reshape(seq, heads, dim // 2), q_sf=qs.reshape(seq, heads), kv=kq,
                          kv_sf=ksf.reshape(seq_kv), w=w)
            q_arg = _pair("q", "q_sf")
        else:
            inputs.update(q=q.astype(np.float32).astype(E4M3), w=w)
            kq, ksf = quant.per_custom_dims_cast_to_fp8(kv, (0,), False)
            inputs.update(kv=kq, kv_sf=ksf)
            q_arg = ArgRef("pair", ("q", None))
        args = [q_arg, _pair("kv", "kv_sf"), _t("w"), _t("ks"), _t("ke")]
        kwargs = {"clean_logits": _v(bool(spec.get("clean", True)))}
        out_dtype, out_shape = "float32", [seq, seq_kv]
        check = _check("f32", dim + heads)
    outputs = {"logits": {"init": "returned", "shape": out_shape, "dtype": out_dtype}}
    return BuiltCase(spec, inputs, kernel, args, kwargs, outputs, {}, check, returns="logits")


def _build_paged(spec: CaseSpec, rng: np.random.Generator, heads: int, dim: int, fp4: bool,
                 ascend: bool) -> BuiltCase:
    batch = int(spec.get("batch", 3))
    block_kv = int(spec.get("block_kv", 64))
    ctx = np.array([int(rng.integers(block_kv // 2, 3 * block_kv)) for _ in range(batch)], np.int32)
    blocks_per = [ceil_div(int(c), block_kv) for c in ctx]
    max_blocks = max(blocks_per)
    num_blocks = sum(blocks_per) + 1
    perm = rng.permutation(num_blocks)
    table = np.zeros((batch, max_blocks), np.int32)
    pos = 0
    for i, nb in enumerate(blocks_per):
        table[i, :nb] = perm[pos:pos + nb]
        pos += nb
    q = randn_bf16(rng, (batch, 1, heads, dim))
    w = rng.standard_normal((batch, heads), dtype=np.float32)
    kv = randn_bf16(rng, (num_blocks * block_kv, dim))
    if ascend:
        vbytes, sbytes = dim, 2 * (dim // 64)
        kq, ksf = quant.per_token_cast_to_fp8(kv, use_ue8m0=True, gran_k=32)
        vals = kq.view(np.uint8).reshape(num_blocks, block_kv * dim)
        scales = _ascend_pairs(ksf).view(np.uint8).reshape(num_blocks, block_kv * sbytes)
        qq, qs = quant.per_token_cast_to_fp8(q.reshape(batch * heads, dim), use_ue8m0=True, gran_k=32)
        q_in, q_sf = qq.reshape(batch, 1, heads, dim), _ascend_pairs(qs).reshape(batch * heads, -1)
        w = w.astype(BF16)
    elif fp4:
        vbytes, sbytes = dim // 2, 4
        kq, ksf = quant.per_token_cast_to_fp4(kv, use_ue8m0=True, gran_k=32, use_packed_ue8m0=True)
        vals = kq.view(np.uint8).reshape(num_blocks, block_kv * vbytes)
        scales = np.ascontiguousarray(ksf).view(np.uint8).reshape(num_blocks, block_kv * 4)
        qq, qs = quant.per_token_cast_to_fp4(q.reshape(batch * heads, dim), use_ue8m0=True, gran_k=32,
                                             use_packed_ue8m0=True)
        q_in, q_sf = qq.reshape(batch, 1, heads, dim // 2), qs.reshape(batch, 1, heads)
    else:
        vbytes, sbytes = dim, 4
        kq, ksf = quant.per_custom_dims_cast_to_fp8(kv, (0,), False)
        vals = kq.view(np.uint8).reshape(num_blocks, block_kv * dim)
        scales = np.ascontiguousarray(ksf.astype(np.float32)).view(np.uint8).reshape(num_blocks, block_kv * 4)
        q_in, q_sf = q.astype(np.float32).astype(E4M3), None
    cache = np.concatenate([vals, scales], axis=1).reshape(num_blocks, block_kv, 1, vbytes + sbytes)
    inputs: dict[str, np.ndarray] = {"q": q_in, "kv_cache": cache, "w": w, "context_lens": ctx.reshape(batch, 1),
                                     "block_table": table}
    if q_sf is not None:
        inputs["q_sf"] = q_sf
    q_arg = ArgRef("pair", ("q", "q_sf" if q_sf is not None else None))
    max_ctx = max_blocks * block_kv
    if ascend:
        inputs["indices"] = np.arange(batch, dtype=np.int32)
        derived = [{"name": "schedule", "function": "get_paged_mqa_logits_metadata",
                    "args": [{"tensor": "context_lens"}, {"value": heads}, {"tensor": "indices"}]}]
        args = [q_arg, _t("kv_cache"), _t("w"), _t("context_lens"), _t("block_table"), _t("schedule"),
                _v(max_ctx), _t("indices")]
        kwargs: dict[str, ArgRef] = {}
        out_dtype = "bfloat16"
        check = _check("bf16", dim + heads, u_acc=2.0**-8)
    else:
        derived = [{"name": "num_sms", "function": "get_num_sms"},
                   {"name": "schedule", "function": "get_paged_mqa_logits_metadata",
                    "args": [{"tensor": "context_lens"}, {"value": block_kv}, {"tensor": "num_sms"}]}]
        args = [q_arg, _t("kv_cache"), _t("w"), _t("context_lens"), _t("block_table"), _t("schedule"), _v(max_ctx)]
        kwargs = {}
        out_dtype = "float32"
        check = _check("f32", dim + heads)
    outputs = {"logits": {"init": "returned", "shape": [batch, max_ctx], "dtype": out_dtype}}
    return BuiltCase(spec, inputs, spec.kernel, args, kwargs, outputs, {}, check, derived=derived, returns="logits")


register_family("mqa", build_mqa)


def _smoke_cases() -> list[dict[str, Any]]:
    return [
        {"id": "sm100-grouped-psum-fp8", "kernel": "m_grouped_fp8_gemm_nt_contiguous", "profile": "sm100"},
        {"id": "sm100-grouped-mindices-bf16", "kernel": "m_grouped_bf16_gemm_nt_contiguous", "profile": "sm100",
         "psum": False},
        {"id": "sm90-grouped-mindices-fp8", "kernel": "m_grouped_fp8_gemm_nt_contiguous", "profile": "sm90",
         "psum": False},
        {"id": "sm100-grouped-masked-fp8", "kernel": "m_grouped_fp8_gemm_nt_masked", "profile": "sm100"},
        {"id": "sm100-kgrouped-fp8", "kernel": "k_grouped_fp8_gemm_tn_contiguous", "profile": "sm100", "k": 200},
        {"id": "ascend950-grouped-psum-fp8", "kernel": "m_grouped_fp8_gemm_nt_contiguous", "profile": "ascend950"},
        {"id": "ascend950-kgrouped-bf16", "kernel": "k_grouped_bf16_gemm_tn_contiguous", "profile": "ascend950",
         "k": 300},
        {"id": "sm100-einsum-bf16", "kernel": "einsum", "profile": "sm100"},
        {"id": "sm100-fp8-einsum", "kernel": "fp8_einsum", "profile": "sm100"},
        {"id": "ascend950-fp8-einsum", "kernel": "fp8_einsum", "profile": "ascend950"},
        {"id": "sm100-hc-prenorm", "kernel": "tf32_hc_prenorm_gemm", "profile": "sm100"},
        {"id": "ascend950-hc-prenorm", "kernel": "tf32_hc_prenorm_gemm", "profile": "ascend950"},
        {"id": "sm100-mqa-fp8", "kernel": "fp8_fp4_mqa_logits", "profile": "sm100"},
        {"id": "sm100-mqa-fp4", "kernel": "fp8_fp4_mqa_logits", "profile": "sm100", "fp4": True},
        {"id": "ascend950-mqa", "kernel": "fp8_fp4_mqa_logits", "profile": "ascend950"},
        {"id": "sm100-paged-mqa-fp8", "kernel": "fp8_fp4_paged_mqa_logits", "profile": "sm100"},
        {"id": "sm90-paged-mqa-fp8", "kernel": "fp8_fp4_paged_mqa_logits", "profile": "sm90", "heads": 32,
         "head_dim": 128},
        {"id": "ascend950-paged-mqa", "kernel": "fp8_fp4_paged_mqa_logits", "profile": "ascend950"},
    ]


def _small_cases() -> list[dict[str, Any]]:
    """Spec 14's grouped and attention lists, scaled down for two cores."""
    cases: list[dict[str, Any]] = []
    for groups, exp_m in ((4, 512), (8, 256)):
        for n, k in ((384, 448), (448, 192), (256, 256)):
            for profile, psum in (("sm100", True), ("sm100", False), ("ascend950", True)):
                cases.append({"id": f"{profile}-grouped-g{groups}-m{exp_m}-n{n}-k{k}-{'psum' if psum else 'mind'}",
                              "kernel": "m_grouped_fp8_gemm_nt_contiguous", "profile": profile, "groups": groups,
                              "m": exp_m, "n": n, "k": k, "psum": psum})
    for groups, exp_m in ((32, 12), (6, 64)):
        cases.append({"id": f"sm100-masked-g{groups}-m{exp_m}", "kernel": "m_grouped_fp8_gemm_nt_masked",
                      "profile": "sm100", "groups": groups, "m": exp_m, "n": 256, "k": 256})
    for groups, m, n, k in ((4, 256, 448, 512), (8, 448, 128, 256)):
        cases.append({"id": f"sm100-kgrouped-g{groups}-m{m}-n{n}-k{k}", "kernel": "k_grouped_fp8_gemm_tn_contiguous",
                      "profile": "sm100", "groups": groups, "m": m, "n": n, "k": k})
    for seq, seq_kv, heads in ((128, 512, 64), (128, 1024, 32)):
        cases.append({"id": f"sm100-mqa-s{seq}-kv{seq_kv}-h{heads}", "kernel": "fp8_fp4_mqa_logits",
                      "profile": "sm100", "seq": seq, "seq_kv": seq_kv, "heads": heads, "head_dim": 128})
    cases.append({"id": "sm100-paged-mqa-b16", "kernel": "fp8_fp4_paged_mqa_logits", "profile": "sm100",
                  "batch": 16, "heads": 64, "head_dim": 128})
    return cases


def _register_presets() -> None:
    from .presets import register_preset_cases

    register_preset_cases("smoke", _smoke_cases)
    register_preset_cases("deepgemm-tests-small", _small_cases)


_register_presets()
