"""The mutations of the catalogue: what each known port bug does to a case.

Each function takes a :class:`.engine.CaseContext` and yields :class:`.engine.Variant` s, one per
concrete form of the bug (which operand, which direction, which tile size, ...); a bug that
cannot show on the case (no FP4 operand, K a multiple of the block, every SF already aligned)
yields nothing.  Three kinds:

* input and layout mutations change the tensors (or keyword values) the kernel is called with;
  the case is regenerated through the golden call path (the emulator's exact model);
* call mutations change how the kernel walks the data (rows given to the wrong group, a K range
  off by one); they are expressed as a changed but valid call of the same kernel, or of the same
  kernel on regrouped rows, and regenerated the same way;
* output-stage mutations (``c``, ``alpha``, the output rounding, a transposed store, unwritten
  tiles) are applied to the stored accumulator and golden: no GEMM is recomputed.

SF tensors are mutated in their canonical form ``(..., MN, SF_K)`` (user-form float32 scales;
DeepGEMM-Ascend's int16 pairs and packed int32 words where a case stores them), and where a bug
acts on the device layout (a transposed or misaligned MN-major buffer) the layout is modelled
on words of the profile's packing: 4 UE8M0 bytes per int32 (sm100), one float32 (sm90), an int16
pair (ascend950), with the TMA alignment of 16 bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ... import formats as fm
from ...config import Limited
from ...quant import align
from .engine import (
    Candidate,
    CaseContext,
    Sample,
    Variant,
    epilogue_values,
    finite_or_golden,
    round_nearest,
    round_toward_zero,
    sign_bias,
    unchanged,
)

# ----------------------------------------------------------------------------------------------
# building blocks
# ----------------------------------------------------------------------------------------------


def regen(ctx: CaseContext, params: dict[str, Any], overrides: dict[str, Any] | None = None,
          kwargs: dict[str, Any] | None = None, accumulation: Any = "exact", cost: str = "regen",
          full_only: bool = False) -> Variant | None:
    """A variant regenerated from mutated tensors / keyword values (None when it changes
    nothing).  ``full_only``: the mutation changes shapes a sample cannot slice."""
    overrides = overrides or {}
    if not kwargs and accumulation == "exact" and unchanged(ctx, overrides):
        return None

    def compute(sample: Sample | None) -> dict[str, Candidate]:
        return ctx.regenerate(None if full_only else sample, overrides, kwargs, accumulation)

    return Variant(params, _full_then_slice(ctx, compute) if full_only else compute, cost)


def _slice_candidate(c: Candidate, sample: Sample) -> Candidate:
    g = {k: sample.take(v) for k, v in c.golden.items()}
    inputs = dict(c.inputs)
    if "c" in inputs and np.ndim(inputs["c"]) == 2:
        inputs["c"] = sample.take(inputs["c"])
    return Candidate(g, c.check, inputs)


def _full_then_slice(ctx: CaseContext, compute: Callable[[Sample | None], dict[str, Candidate]]
                     ) -> Callable[[Sample | None], dict[str, Candidate]]:
    cache: dict[str, dict[str, Candidate]] = {}

    def run(sample: Sample | None) -> dict[str, Candidate]:
        if "full" not in cache:
            cache["full"] = compute(None)
        full = cache["full"]
        return full if sample is None else {k: _slice_candidate(v, sample) for k, v in full.items()}

    return run


def output_stage(ctx: CaseContext, params: dict[str, Any], make: Callable[[], dict[str, Candidate]]) -> Variant:
    """A variant computed once from the stored goldens of the whole case (then sliced)."""
    return Variant(params, _full_then_slice(ctx, lambda _s: make()), "output")


def main_candidate(ctx: CaseContext, **golden: np.ndarray) -> Candidate:
    """The main output's golden with some tensors replaced."""
    g = dict(ctx.output_goldens[ctx.main])
    g.update(golden)
    return Candidate(g, ctx.check, ctx.inputs)


def _c_input(ctx: CaseContext) -> np.ndarray | None:
    name = ctx.epilogue.get("c")
    return None if not name else np.asarray(ctx.inputs[name])


# ----------------------------------------------------------------------------------------------
# scale-factor tensors
# ----------------------------------------------------------------------------------------------

@dataclass
class SF:
    """A scale tensor of the case: its name, operand, axes of MN and SF_K in the stored array."""

    name: str
    operand: str
    mn_axis: int
    k_axis: int

    def canonical(self, x: np.ndarray) -> np.ndarray:
        """(..., MN, SF_K) view."""
        return np.moveaxis(np.asarray(x), (self.mn_axis, self.k_axis), (-2, -1))

    def stored(self, canon: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(np.moveaxis(canon, (-2, -1), (self.mn_axis, self.k_axis)))


def scale_tensors(ctx: CaseContext) -> list[SF]:
    """The float32 user-form scale tensors of a GEMM-like case, with their canonical axes."""
    fam, k = ctx.family.name, ctx.kernel
    tf = ctx.entry.get("transforms") or {}
    out: list[SF] = []

    def add(name: str, operand: str, mn: int, kax: int) -> None:
        x = ctx.inputs.get(name)
        if isinstance(x, np.ndarray) and x.dtype == np.float32 and x.ndim >= 2:
            out.append(SF(name, operand, mn, kax))

    if fam == "gemm":
        for side in ("a", "b"):
            name = f"{side}_sf"
            back = bool(tf.get(name, {}).get("transpose_back"))
            add(name, side, 1 if back else 0, 0 if back else 1)
    elif fam == "grouped":
        if k.startswith("k_grouped"):
            add("a_sf", "a", 1, 0)
            add("b_sf", "b", 1, 0)
        else:
            add("a_sf", "a", -2, -1)
            add("b_sf", "b", -2, -1)
    elif fam == "einsum" and k == "fp8_einsum":
        add("x_sf", "a", 0, 2)
        add("y_sf", "b", 1, 2)
    return out


def ue8m0_scales(ctx: CaseContext) -> bool:
    """Whether the case's GEMM scales are powers of two (UE8M0)."""
    if ctx.family.name == "gemm":
        return bool(ctx.params.get("ue8m0"))
    return ctx.profile != "sm90"


#: Scale words of each profile's device layout: (k-blocks per word, the MN stride's alignment in
#: words as the layout stores it, the 16-byte TMA alignment in words).  DeepGEMM pads MN-major
#: buffers to the TMA alignment (4 float32 / int32 words); DeepGEMM-Ascend's int16 pairs are
#: stored unpadded (layout.py).
_WORDS = {"sm100": (4, 4, 4), "sm90": (1, 4, 4), "ascend950": (2, 1, 8)}


def _words(canon: np.ndarray, unit: int) -> tuple[np.ndarray, int]:
    """(..., MN, W, unit) words of a canonical SF (SF_K padded with 0.0, the byte-0 scale)."""
    kb = canon.shape[-1]
    w = -(-kb // unit)
    pad = np.zeros(canon.shape[:-1] + (w * unit - kb,), canon.dtype)
    full = np.concatenate([canon, pad], axis=-1)
    return full.reshape(canon.shape[:-1] + (w, unit)), kb


def _unwords(words: np.ndarray, kb: int) -> np.ndarray:
    return words.reshape(words.shape[:-2] + (-1,))[..., :kb]


#: A word layout: ("mn", stride) puts word (i, w) at w * stride + i (MN-major); ("k", W) at i * W + w.
Layout = tuple[str, int]


def _position(layout: Layout, i: np.ndarray, j: np.ndarray) -> np.ndarray:
    kind, stride = layout
    return j * stride + i if kind == "mn" else i * stride + j


def _read_words(words: np.ndarray, write: Layout, read: Layout, size: int) -> np.ndarray:
    """Words (lead..., MN, W, u) laid out in a flat buffer of ``size`` words by ``write`` and
    read back by ``read`` (positions outside the buffer read as 0.0)."""
    lead = words.shape[:-3]
    mn, w, u = words.shape[-3:]
    flat_lead = int(np.prod(lead)) if lead else 1
    src = words.reshape(flat_lead, mn, w, u)
    buf = np.zeros((flat_lead, size, u), words.dtype)
    i, j = np.meshgrid(np.arange(mn), np.arange(w), indexing="ij")
    buf[:, _position(write, i, j).ravel()] = src.reshape(flat_lead, mn * w, u)
    ri = _position(read, i, j).ravel()
    ok = (ri >= 0) & (ri < size)
    got = np.zeros((flat_lead, mn * w, u), words.dtype)
    got[:, ok] = buf[:, ri[ok]]
    return got.reshape(lead + (mn, w, u))


def sf_transposed(ctx: CaseContext) -> Iterator[Variant]:
    """An MN-major SF buffer read as K-major, or a K-major one read as MN-major, per operand,
    in words of one k-block and of the device's packing."""
    unit_dev, align_dev, _ = _WORDS.get(ctx.profile, (1, 1, 1))
    for sf in scale_tensors(ctx):
        canon = sf.canonical(ctx.inputs[sf.name])
        for unit in sorted({1, unit_dev}):
            words, kb = _words(canon, unit)
            mn, w = words.shape[-3], words.shape[-2]
            stride = align(mn, align_dev) if unit == unit_dev else mn
            forms: dict[str, tuple[Layout, Layout, int]] = {
                "mn_major_read_as_k_major": (("mn", stride), ("k", w), w * stride),
                "k_major_read_as_mn_major": (("k", w), ("mn", mn), mn * w),
            }
            for form, (write, read, size) in forms.items():
                new = _unwords(_read_words(words, write, read, size), kb)
                v = regen(ctx, {"operand": sf.operand, "read": form, "word": f"{unit} k-block(s)"},
                          {sf.name: sf.stored(new)})
                if v is not None:
                    yield v


def sf_not_tma_aligned(ctx: CaseContext) -> Iterator[Variant]:
    """An MN-major SF buffer written with the TMA-aligned MN stride and read with the plain one,
    or the reverse (only an MN not a multiple of the alignment shows it)."""
    unit, _, al = _WORDS.get(ctx.profile, (1, 4, 4))
    for sf in scale_tensors(ctx):
        canon = sf.canonical(ctx.inputs[sf.name])
        words, kb = _words(canon, unit)
        mn, w = words.shape[-3], words.shape[-2]
        padded = align(mn, al)
        if padded == mn:
            continue
        for form, (ws, rs) in {"written_aligned_read_unaligned": (padded, mn),
                               "written_unaligned_read_aligned": (mn, padded)}.items():
            new = _unwords(_read_words(words, ("mn", ws), ("mn", rs), w * max(ws, rs)), kb)
            v = regen(ctx, {"operand": sf.operand, "stride": form, "alignment": f"{al} words"},
                      {sf.name: sf.stored(new)})
            if v is not None:
                yield v


def _pow2_scaled(ctx: CaseContext, params: dict[str, Any], factor: float) -> Variant:
    """Every product scaled by ``factor`` (a power of two): the stored accumulator and error
    scale times ``factor``, through the case's epilogue (no GEMM)."""

    def make() -> dict[str, Candidate]:
        g = ctx.output_goldens[ctx.main]
        acc = g["acc"] * factor
        values = finite_or_golden(epilogue_values(ctx.epilogue, acc, _c_input(ctx)), g["main"])
        extra: dict[str, np.ndarray] = {"main": values, "acc": acc, "S": g["S"] * factor}
        if "acc_lo" in g:
            extra["acc_lo"] = g["acc_lo"] * factor
        if "S_hard" in g:
            extra["S_hard"] = g["S_hard"] * factor
        return {ctx.main: main_candidate(ctx, **extra)}

    return output_stage(ctx, params, make)


def _byte_shift(x: np.ndarray, step: int) -> np.ndarray:
    """UE8M0 bytes of packed int16 / int32 words moved by ``step`` (clipped to 1..254)."""
    u = np.ascontiguousarray(x).view(np.uint8).astype(np.int16)
    nz = u != 0
    u = np.where(nz, np.clip(u + step, 1, 254), u).astype(np.uint8)
    return u.view(x.dtype).reshape(x.shape)


def ue8m0_off_by_one(ctx: CaseContext) -> Iterator[Variant]:
    """UE8M0 bytes decoded one exponent off (bias 126 or 128) on one operand or both."""
    if ctx.family.name in ("gemm", "grouped", "einsum", "mqa"):
        if ctx.family.name == "mqa" and not (ctx.ascend or ctx.params.get("fp4")):
            return  # CUDA FP8 MQA scales are float32, not UE8M0
        if ctx.family.name != "mqa" and (not ue8m0_scales(ctx) or not scale_tensors(ctx)):
            return
        if not ctx.interval:
            return
        for factor, which in ((2.0, "one operand read 2x"), (0.5, "one operand read x1/2"),
                              (4.0, "both operands read 2x"), (0.25, "both operands read x1/2")):
            yield _pow2_scaled(ctx, {"decoded": which, "operand": "a or b" if abs(np.log2(factor)) == 1
                                     else "a and b"}, factor)
        return
    if ctx.family.name == "mega_moe":
        for name, x in sorted(ctx.inputs.items()):
            if "_sf" not in name or x.dtype not in (np.int16, np.int32, np.float32):
                continue
            for step in (1, -1):
                if x.dtype == np.float32:
                    new = (x * np.float32(2.0 ** step)).astype(np.float32)
                else:
                    new = _byte_shift(x, step)
                v = regen(ctx, {"tensor": name, "exponent": f"{step:+d}"}, {name: new})
                if v is not None:
                    yield v


def gran_k_confused(ctx: CaseContext) -> Iterator[Variant]:
    """Per-32 scales read as per-128 (every K element takes the scale at index k // 128, or the
    first 32-block's of its 128-block), or per-128 scales read as per-32 (index k // 32: past
    the end zero, or clamped)."""
    kb_axis_gran = {"a": _gran(ctx, "a"), "b": _gran(ctx, "b")}
    for sf in scale_tensors(ctx):
        gran = kb_axis_gran.get(sf.operand)
        canon = sf.canonical(ctx.inputs[sf.name])
        kb = canon.shape[-1]
        if gran == 32:
            q = np.arange(kb)
            for form, idx in (("index_k_div_128", q // 4), ("first_32_block_of_128", 4 * (q // 4))):
                v = regen(ctx, {"operand": sf.operand, "read": f"per-32 as per-128 ({form})"},
                          {sf.name: sf.stored(canon[..., np.minimum(idx, kb - 1)])})
                if v is not None:
                    yield v
        elif gran == 128 and ctx.family.name in ("gemm", "grouped") and not ctx.kernel.startswith("k_grouped"):
            kb32 = -(-_k_of(ctx) // 32) if _k_of(ctx) else 4 * kb
            q = np.arange(kb32)
            for form in ("zero_past_end", "clamped"):
                new = canon[..., np.minimum(q, kb - 1)].copy()
                if form == "zero_past_end":
                    new[..., q >= kb] = 0.0
                recipe = _recipes_with(ctx, sf.operand, 32)
                if recipe is None:
                    continue
                v = regen(ctx, {"operand": sf.operand, "read": f"per-128 as per-32 ({form})"},
                          {sf.name: sf.stored(new)}, kwargs=recipe)
                if v is not None:
                    yield v


def _gran(ctx: CaseContext, side: str) -> int | None:
    p = ctx.params
    if ctx.family.name == "gemm":
        return p.get(f"gran_k_{side}")
    if ctx.family.name in ("grouped", "einsum"):
        return 32 if ctx.ascend else 128
    return None


def _k_of(ctx: CaseContext) -> int:
    p = ctx.params
    return int(p.get("k") or p.get("r") or 0)


def _recipes_with(ctx: CaseContext, side: str, gran: int) -> dict[str, Any] | None:
    """Keyword values giving operand ``side`` the K granularity ``gran`` (recipe_a / recipe_b)."""
    p = ctx.params
    if ctx.family.name == "gemm":
        gran_n = p.get("gran_n", 1)
        ra, rb = [1, p.get("gran_k_a")], [gran_n, p.get("gran_k_b")]
    elif ctx.family.name == "grouped":
        ra, rb = [1, 128], [1 if ctx.ascend else 128, 128]
    else:
        return None
    (ra if side == "a" else rb)[1] = gran
    return {"recipe_a": tuple(ra), "recipe_b": tuple(rb), "recipe": None}


def scale_block_reused(ctx: CaseContext) -> Iterator[Variant]:
    """One scale block used where another belongs: the first K block's scale for every K block,
    each even block's scale for the next one too, the first row's (block's) scale for a whole
    128-row tile, or the first group's scales for every group."""
    for sf in scale_tensors(ctx):
        canon = sf.canonical(ctx.inputs[sf.name])
        kb, mn = canon.shape[-1], canon.shape[-2]
        forms: dict[str, np.ndarray] = {}
        if kb > 1:
            forms["first_k_block_for_all"] = np.broadcast_to(canon[..., :1], canon.shape)
            forms["even_k_block_for_pairs"] = canon[..., 2 * (np.arange(kb) // 2)]
        rows_per_block = 128 if _per_row(ctx, sf) else 1
        if mn > 1 and rows_per_block > 1:
            forms["first_row_for_128_row_tile"] = canon[..., rows_per_block * (np.arange(mn) // rows_per_block), :]
        if canon.ndim == 3 and canon.shape[0] > 1 and sf.operand == "b":
            forms["first_group_for_all"] = np.broadcast_to(canon[:1], canon.shape)
        for form, new in forms.items():
            v = regen(ctx, {"operand": sf.operand, "reused": form}, {sf.name: sf.stored(np.array(new))})
            if v is not None:
                yield v


def _per_row(ctx: CaseContext, sf: SF) -> bool:
    return not (sf.operand == "b" and ctx.params.get("gran_n") == 128)


def _float32_bytes_as_ue8m0(canon: np.ndarray) -> np.ndarray:
    """float32 scales whose bytes a kernel reads as packed UE8M0: k-block j takes byte j % 4 of
    the float32 of block j // 4.  Returned in user form: the float32 whose exponent field is the
    byte (byte 0 is 0.0, which kernels read as 2^-127; byte 255 is +inf, read as NaN)."""
    kb = canon.shape[-1]
    by = np.ascontiguousarray(canon.astype(np.float32)).view(np.uint8).reshape(canon.shape[:-1] + (4 * kb,))
    b = by[..., :kb].astype(np.uint32)
    return (b << np.uint32(23)).view(np.float32)


def sf_float32_read_as_ue8m0(ctx: CaseContext) -> Iterator[Variant]:
    """Float32 scales kept in the float layout and read by a UE8M0 kernel as packed exponent
    bytes (DeepGEMM #417), on one operand or both."""
    if ctx.profile != "sm100":
        return
    sfs = scale_tensors(ctx)
    yield from _each_operand_and_both(ctx, sfs, {
        sf.name: sf.stored(_float32_bytes_as_ue8m0(sf.canonical(ctx.inputs[sf.name]))) for sf in sfs})


def _each_operand_and_both(ctx: CaseContext, sfs: list[SF], changes: dict[str, np.ndarray]) -> Iterator[Variant]:
    """The scale mutation on each operand alone, then on both."""
    for sf in sfs:
        v = regen(ctx, {"operand": sf.operand}, {sf.name: changes[sf.name]})
        if v is not None:
            yield v
    if len(changes) > 1:
        v = regen(ctx, {"operand": "a and b"}, changes)
        if v is not None:
            yield v


def sf_mantissa_dropped(ctx: CaseContext) -> Iterator[Variant]:
    """Non-power-of-two float32 scales reduced to their exponent (the mantissa truncated, as a
    UE8M0 cast that keeps the exponent byte does), on one operand or both."""
    sfs = scale_tensors(ctx)
    changes = {}
    for sf in sfs:
        x = np.ascontiguousarray(ctx.inputs[sf.name], np.float32)
        changes[sf.name] = (x.view(np.uint32) & np.uint32(0x7F800000)).view(np.float32).reshape(x.shape)
    yield from _each_operand_and_both(ctx, sfs, changes)


# ----------------------------------------------------------------------------------------------
# element data
# ----------------------------------------------------------------------------------------------

def _swap_nibbles(x: np.ndarray) -> np.ndarray:
    u = np.ascontiguousarray(x).view(np.uint8)
    return (((u & 0x0F) << 4) | (u >> 4)).astype(np.uint8).view(x.dtype).reshape(x.shape)


def fp4_tensors(ctx: CaseContext) -> dict[str, str]:
    """Packed FP4 tensors of the case (name -> operand label)."""
    fam, p = ctx.family.name, ctx.params
    if fam == "gemm":
        return {side: side for side in ("a", "b") if p.get(side) == "fp4"}
    if fam == "mqa" and p.get("fp4"):
        # q and the keys are both packed along the head dimension with per-32 scales: swapping
        # the pairs of one is swapping those of the other (sum_d q_d k_s(d) = sum_d q_s(d) k_d)
        kv = "kv_cache" if "kv_cache" in ctx.inputs else "kv"
        return {kv: "q or kv (the same logits)"}
    if fam == "mega_moe" and ctx.kernel == "fp8_fp4_mega_moe":
        return {name: name.split(".")[0] for name in ctx.inputs if name.split(".")[0] in ("l1", "l2")}
    return {}


def fp4_nibbles_swapped(ctx: CaseContext) -> Iterator[Variant]:
    """The two E2M1 codes of each packed FP4 byte swapped (high nibble read as the even
    element), in one operand at a time."""
    tensors = fp4_tensors(ctx)
    by_operand: dict[str, dict[str, np.ndarray]] = {}
    for name, operand in tensors.items():
        x = ctx.inputs[name]
        if name == "kv_cache":
            # value bytes only: each block holds its block_kv tokens' D / 2 value bytes first, then
            # their scales (the (blocks, block_kv, 1, D / 2 + 4) shape is a view of that memory)
            values = int(ctx.params["block_kv"]) * int(ctx.params["head_dim"]) // 2
            new = np.array(x, copy=True)
            flat = new.reshape(new.shape[0], -1)
            flat[:, :values] = _swap_nibbles(np.ascontiguousarray(flat[:, :values]))
        else:
            new = _swap_nibbles(x)
        by_operand.setdefault(operand, {})[name] = new
    for operand, changes in by_operand.items():
        v = regen(ctx, {"operand": operand}, changes)
        if v is not None:
            yield v


def k_tail_not_zeroed(ctx: CaseContext) -> Iterator[Variant]:
    """K not a multiple of the block: the kernel reads the last block whole, and the tail past K
    holds the next row's leading elements (a flat-memory overrun) or the previous K block's
    elements (a stale buffer) instead of zeros, in both K-major operands."""
    fam, k = ctx.family.name, ctx.kernel
    if fam == "gemm" and k[-2:] == "nt" and "skip_head_mid" not in k:
        names = ("a", "b")
    elif fam == "grouped" and k.startswith("m_grouped"):
        names = ("a", "b")
    else:
        return
    K = _k_of(ctx)
    p = ctx.params
    quant = "a_sf" in ctx.inputs
    blocks = {int(min(_gran(ctx, "a") or 128, _gran(ctx, "b") or 128))} if quant else {64, 128}
    for blk in sorted(blocks):
        kp = align(K, blk)
        if kp == K or (quant and kp > -(-K // blk) * blk):
            continue
        for source in ("next_row", "previous_block"):
            changes = {}
            for name in names:
                fp4 = p.get(name) == "fp4"
                x = np.asarray(ctx.inputs[name])
                changes[name] = _k_tail(x, K // 2 if fp4 else K, (kp - K) // 2 if fp4 else kp - K,
                                        blk // 2 if fp4 else blk, source)
            if source == "previous_block" and K < blk:
                continue
            v = regen(ctx, {"block": blk, "tail": source}, changes, full_only=True)
            if v is not None:
                yield v


def _k_tail(x: np.ndarray, k: int, extra: int, blk: int, source: str) -> np.ndarray:
    """(..., k) rows extended to k + extra with the tail's garbage."""
    rows = x.reshape(-1, k)
    if source == "next_row":
        nxt = np.zeros_like(rows[:, :extra])
        nxt[:-1] = rows[1:, :extra]
        tail = nxt
    else:
        start = (k // blk) * blk - blk + (k % blk)
        tail = rows[:, start:start + extra]
    out = np.concatenate([rows, tail], axis=1)
    return np.ascontiguousarray(out.reshape(x.shape[:-1] + (k + extra,)))


# ----------------------------------------------------------------------------------------------
# grouped layouts
# ----------------------------------------------------------------------------------------------

def _alignment(ctx: CaseContext) -> int:
    if ctx.ascend:
        return 256
    for call in ctx.entry.get("setup") or []:
        if call.get("function") == "set_mk_alignment_for_contiguous_layout":
            return int(call["args"][0]["value"])
    return 128


def row_groups(ctx: CaseContext) -> np.ndarray:
    """The group of every row of an m-grouped contiguous case (-1: padding)."""
    layout = np.asarray(ctx.inputs["grouped_layout"]).astype(np.int64)
    m = np.asarray(ctx.inputs["a"]).shape[0]
    if not bool(ctx.value("use_psum_layout")):
        return layout.copy()
    out = np.full(m, -1, np.int64)
    start = 0
    for g, end in enumerate(layout):
        out[start:end] = g
        start = align(int(end), _alignment(ctx))
    return out


def regrouped(ctx: CaseContext, params: dict[str, Any], groups: np.ndarray) -> Variant | None:
    """The same m-grouped kernel with row r computed against group ``groups[r]`` (-1: not
    written): rows regrouped into a fresh contiguous layout, the outputs scattered back."""
    if np.array_equal(groups, row_groups(ctx)):
        return None

    def make() -> dict[str, Candidate]:
        return {ctx.main: _regroup(ctx, groups)}

    v = output_stage(ctx, params, make)
    v.cost = "regen"
    return v


def _regroup(ctx: CaseContext, groups: np.ndarray) -> Candidate:
    inputs = ctx.inputs
    a = np.asarray(inputs["a"])
    num_groups = np.asarray(inputs["b"]).shape[0]
    al = _alignment(ctx)
    psum = bool(ctx.value("use_psum_layout"))
    order, starts, ends = [], [], []
    pos = 0
    for g in range(num_groups):
        rows = np.flatnonzero(groups == g)
        starts.append(pos)
        order.append(rows)
        ends.append(pos + rows.size)
        pos = align(pos + rows.size, al)
    total = max(pos, al)
    a2 = np.zeros((total,) + a.shape[1:], a.dtype)
    new: dict[str, Any] = {}
    sf = inputs.get("a_sf")
    sf2 = None if sf is None else np.zeros((total,) + sf.shape[1:], sf.dtype)
    for rows, s in zip(order, starts, strict=True):
        a2[s:s + rows.size] = a[rows]
        if sf is not None and sf2 is not None:
            sf2[s:s + rows.size] = sf[rows]
    new["a"] = a2
    if sf2 is not None:
        new["a_sf"] = sf2
    if psum:
        new["grouped_layout"] = np.asarray(ends, np.int32)
    else:
        idx = np.full(total, -1, np.int32)
        for g, (rows, s) in enumerate(zip(order, starts, strict=True)):
            idx[s:s + rows.size] = g
        new["grouped_layout"] = idx
    n = ctx.golden[ctx.main].shape[1]
    outs = {ctx.main: {**ctx.outputs_desc[ctx.main], "shape": [total, n]}}
    cand = ctx.regenerate(None, inputs={**inputs, **new}, outputs_desc=outs)[ctx.main]
    g0 = ctx.output_goldens[ctx.main]
    m = a.shape[0]
    values = np.zeros_like(g0["main"])
    acc = np.zeros((m, n))
    S = np.zeros((m, n))
    defined = np.zeros((m, n), bool)
    for rows, s in zip(order, starts, strict=True):
        sel = slice(s, s + rows.size)
        values[rows] = cand.golden["main"][sel]
        acc[rows] = cand.golden["acc"][sel]
        S[rows] = cand.golden["S"][sel]
        defined[rows] = True
    return Candidate({"main": values, "acc": acc, "S": S, "defined": defined}, ctx.check, ctx.inputs)


def _m_contiguous(ctx: CaseContext) -> bool:
    return ctx.kernel.startswith("m_grouped") and ctx.kernel.endswith("contiguous")


def psum_offsets_shifted(ctx: CaseContext) -> Iterator[Variant]:
    """psum end offsets read as start offsets (group g computed on rows [psum[g], psum[g+1]),
    the first rows unwritten), or shifted by one group (group g ends at psum[g - 1])."""
    if not _m_contiguous(ctx) or not bool(ctx.value("use_psum_layout")):
        return
    ends = np.asarray(ctx.inputs["grouped_layout"]).astype(np.int64)
    m = np.asarray(ctx.inputs["a"]).shape[0]
    al = _alignment(ctx)
    g_count = ends.size
    as_starts = np.full(m, -1, np.int64)
    for g in range(g_count):
        hi = int(ends[g + 1]) if g + 1 < g_count else m
        as_starts[int(ends[g]):max(int(ends[g]), hi)] = g
    shifted = np.full(m, -1, np.int64)
    prev = 0
    for g in range(1, g_count):
        end = int(ends[g - 1])
        shifted[prev:end] = g
        prev = align(end, al)
    for form, groups in (("ends_read_as_starts", as_starts), ("ends_shifted_by_one_group", shifted)):
        v = regrouped(ctx, {"read": form}, groups)
        if v is not None:
            yield v


def group_boundary_off_by_one(ctx: CaseContext) -> Iterator[Variant]:
    """Group boundaries one row (one K element) off: the last or first row of each group not
    written or given to the neighbouring group; masked: masked_m - 1 rows; K-grouped: the last
    or first K element of each group dropped."""
    if _m_contiguous(ctx):
        true = row_groups(ctx)
        m = true.size
        starts = [int(r) for r in range(m) if true[r] >= 0 and (r == 0 or true[r - 1] != true[r])]
        last = [int(r) for r in range(m) if true[r] >= 0 and (r + 1 == m or true[r + 1] != true[r])]
        g_max = int(true.max()) if true.size else -1
        forms: dict[str, np.ndarray] = {}
        h = true.copy()
        h[last] = -1
        forms["last_row_unwritten"] = h
        h = true.copy()
        h[starts] = -1
        forms["first_row_unwritten"] = h
        h = true.copy()
        h[last] = np.where(true[last] < g_max, true[last] + 1, -1)
        forms["last_row_to_next_group"] = h
        h = true.copy()
        h[starts] = np.where(true[starts] > 0, true[starts] - 1, -1)
        forms["first_row_to_previous_group"] = h
        for form, groups in forms.items():
            v = regrouped(ctx, {"boundary": form}, groups)
            if v is not None:
                yield v
    elif "masked" in ctx.kernel:
        mm = np.asarray(ctx.inputs["masked_m"])
        v = regen(ctx, {"boundary": "masked_m - 1 rows"}, {"masked_m": np.maximum(mm - 1, 0).astype(mm.dtype)})
        if v is not None:
            yield v
    elif ctx.kernel.startswith("k_grouped"):
        for form in ("last_k_dropped", "first_k_dropped"):
            changes = _k_grouped_drop(ctx, form)
            v = regen(ctx, {"boundary": form}, changes)
            if v is not None:
                yield v


def _k_grouped_ranges(ctx: CaseContext) -> list[tuple[int, int]]:
    """Each group's K rows holding data: [start, last non-zero row + 1) (padding rows are zero)."""
    layout = np.asarray(ctx.inputs["grouped_layout"]).astype(np.int64)
    spans: list[tuple[int, int]] = []
    pos = 0
    for x in layout:
        if bool(ctx.value("use_psum_layout")):  # DeepGEMM-Ascend: psum ends along K
            spans.append((pos, int(x)))
            pos = align(int(x), 256)
        else:  # sizes of groups placed one after the other
            spans.append((pos, pos + int(x)))
            pos += int(x)
    a = np.ascontiguousarray(ctx.inputs["a"])
    data: np.ndarray = np.asarray(a.view(np.uint8).reshape(a.shape[0], -1).any(axis=1))
    out = []
    for s, e in spans:
        rows = np.flatnonzero(data[s:e])
        out.append((s, s + int(rows[-1]) + 1 if rows.size else s))
    return out


def _k_grouped_drop(ctx: CaseContext, form: str) -> dict[str, np.ndarray]:
    changes = {}
    for name in ("a", "b"):
        x = np.array(ctx.inputs[name], copy=True)
        for s, e in _k_grouped_ranges(ctx):
            if e > s:
                x[e - 1 if form == "last_k_dropped" else s] = 0
        changes[name] = x
    return changes


def neg1_rows_as_group0(ctx: CaseContext) -> Iterator[Variant]:
    """An m_indices -1 (padding) read as group 0: each 128-row tile takes the group of its last
    row, so a group's partly padded last tile is computed with group 0's B; Mega MoE: a -1
    top-k slot routed to expert 0."""
    if _m_contiguous(ctx) and not bool(ctx.value("use_psum_layout")):
        true = row_groups(ctx)
        m = true.size
        h = true.copy()
        for t0 in range(0, m, 128):
            tile = true[t0:t0 + 128]
            g = int(tile[-1])
            h[t0:t0 + 128] = np.where(tile >= 0, 0 if g < 0 else g, -1)
        v = regrouped(ctx, {"tile_group_from": "last row (-1 read as 0)"}, h)
        if v is not None:
            yield v
    elif ctx.family.name == "mega_moe":
        changes = {}
        for name, x in ctx.inputs.items():
            if name.startswith("topk_idx."):
                changes[name] = np.where(x < 0, 0, x).astype(x.dtype)
        v = regen(ctx, {"slot": "-1 routed to expert 0"}, changes)
        if v is not None:
            yield v


def masked_m_ignored(ctx: CaseContext) -> Iterator[Variant]:
    """Masked grouped GEMM with masked_m not read: every group computed to expected_m rows, or
    no group computed at all."""
    if "masked" not in ctx.kernel:
        return
    mm = np.asarray(ctx.inputs["masked_m"])
    max_m = np.asarray(ctx.inputs["a"]).shape[1]
    expected = next((a.value for a in ctx.args if a.kind == "value" and isinstance(a.value, int)), None)
    forms = {"zero_rows": np.zeros_like(mm)}
    if expected is not None:
        forms["expected_m_rows"] = np.full_like(mm, min(int(expected), max_m))
    for form, new in forms.items():
        v = regen(ctx, {"rows": form}, {"masked_m": new})
        if v is not None:
            yield v


# ----------------------------------------------------------------------------------------------
# output stage (the stored accumulator)
# ----------------------------------------------------------------------------------------------

def _with_epilogue(ctx: CaseContext, params: dict[str, Any], ep: dict[str, Any],
                   c: np.ndarray | None, rounding: Callable[[np.ndarray, fm.Format], np.ndarray] | None = None,
                   twice: bool = False) -> Variant:
    """The stored accumulator through a changed epilogue."""

    def make() -> dict[str, Candidate]:
        g = ctx.output_goldens[ctx.main]
        vals = epilogue_values(ep, g["acc"], c, rounding)
        if twice:
            vals = epilogue_values(ep, vals.astype(np.float64), c, rounding)
        values = finite_or_golden(vals, g["main"])
        check = {**ctx.check, "epilogue": ep}
        inputs = dict(ctx.inputs)
        if ep.get("c") and c is not None:
            inputs[ep["c"]] = c
        return {ctx.main: Candidate({**g, "main": values}, check, inputs)}

    return output_stage(ctx, params, make)


def c_missing(ctx: CaseContext) -> Iterator[Variant]:
    """The C input (or D's initial value) not added."""
    if ctx.interval and ctx.epilogue.get("c"):
        yield _with_epilogue(ctx, {}, {**ctx.epilogue, "c": None}, None)


def c_added_twice(ctx: CaseContext) -> Iterator[Variant]:
    """C added twice: the epilogue applied again to its own result, or 2 C added once."""
    if ctx.interval and ctx.epilogue.get("c"):
        c = _c_input(ctx)
        assert c is not None
        yield _with_epilogue(ctx, {"form": "epilogue applied twice"}, ctx.epilogue, c, twice=True)
        yield _with_epilogue(ctx, {"form": "2 c added once"}, ctx.epilogue, (2 * c.astype(np.float64)).astype(c.dtype)
                             if c.dtype == np.float32 else 2 * c.astype(np.float64))


def alpha_missing(ctx: CaseContext) -> Iterator[Variant]:
    """The alpha multiplier (DeepGEMM-Ascend's epilogue) not applied."""
    if ctx.interval and ctx.epilogue.get("alpha") is not None:
        yield _with_epilogue(ctx, {}, {**ctx.epilogue, "alpha": None}, _c_input(ctx))


def output_truncated(ctx: CaseContext) -> Iterator[Variant]:
    """The output rounded toward zero instead of to nearest even (every output rounding, or only
    the last one when the epilogue rounds twice)."""
    if not ctx.interval:
        return
    c = _c_input(ctx)
    bias = _bias_params(ctx)
    v = _with_epilogue(ctx, {"roundings": "all", **bias}, ctx.epilogue, c, rounding=round_toward_zero)
    v.evidence = "differing"
    yield v
    mode = ctx.epilogue.get("c_mode", "kernel")
    if c is not None and (mode == "rounded" or (mode == "kernel" and ctx.epilogue.get("out") == "bf16")):
        v = _truncated_last(ctx, c)
        v.params.update(bias)
        v.evidence = "differing"
        yield v


def _bias_params(ctx: CaseContext) -> dict[str, Any]:
    """The sign bias of the main output's differing elements, as variant parameters."""
    b = sign_bias(ctx.device[ctx.main], ctx.output_goldens[ctx.main]["main"], ctx.classes[ctx.main].defined)
    return {"toward_zero": f"{b.toward_zero} of {b.differing} differing elements",
            "log10_p": round(b.log10_p, 1)}


def _truncated_last(ctx: CaseContext, c: np.ndarray) -> Variant:
    """RNE of the product, then a truncating rounding of c + product."""

    def make() -> dict[str, Candidate]:
        g = ctx.output_goldens[ctx.main]
        ep = ctx.epilogue
        fmt = fm.BF16 if ep["out"] == "bf16" else fm.F32
        z = g["acc"].astype(np.float64)
        if ep.get("alpha") is not None:
            z = round_nearest(np.float64(ep["alpha"]) * z, fm.F32)
        z = round_nearest(z, fmt) + c.astype(np.float64)
        vals = round_toward_zero(z, fmt).astype(g["main"].dtype)
        return {ctx.main: Candidate({**g, "main": finite_or_golden(vals, g["main"])}, ctx.check, ctx.inputs)}

    return output_stage(ctx, {"roundings": "last"}, make)


def _transposes(shape: tuple[int, ...]) -> dict[str, Callable[[np.ndarray], np.ndarray]]:
    r, c = shape[-2:]
    lead = shape[:-2]
    forms: dict[str, Callable[[np.ndarray], np.ndarray]] = {
        # element (i, j) stored at j * M + i of the (M, N) buffer (a column-major store)
        "stored_column_major": lambda x: np.ascontiguousarray(np.swapaxes(x, -1, -2)).reshape(x.shape),
        # element (i, j) taken from i + j * ... : the buffer read back column-major
        "read_column_major": lambda x: np.swapaxes(x.reshape(lead + (c, r)), -1, -2),
    }
    return forms


def output_transposed(ctx: CaseContext) -> Iterator[Variant]:
    """D written transposed: element (i, j) of the result stored at (j, i) of the buffer's
    memory (column-major), or read back that way; the whole output, or only the accumulator
    with C added in place."""
    g = ctx.output_goldens[ctx.main]
    if g["main"].ndim < 2 or min(g["main"].shape[-2:]) < 2:
        return
    c = _c_input(ctx)
    seen: set[bytes] = set()
    for form, perm in _transposes(g["main"].shape).items():
        key = perm(np.arange(g["main"].size).reshape(g["main"].shape)).tobytes()
        if key in seen:
            continue
        seen.add(key)

        def make(perm: Callable[[np.ndarray], np.ndarray] = perm) -> dict[str, Candidate]:
            return {ctx.main: main_candidate(ctx, **{k: perm(v) for k, v in g.items()})}

        yield output_stage(ctx, {"layout": form, "with": "the whole output"}, make)
        if c is not None and ctx.interval:
            def make_acc(perm: Callable[[np.ndarray], np.ndarray] = perm) -> dict[str, Candidate]:
                acc = perm(g["acc"])
                vals = finite_or_golden(epilogue_values(ctx.epilogue, acc, c), perm(g["main"]))
                return {ctx.main: main_candidate(ctx, main=vals, acc=acc, S=perm(g["S"]),
                                                 defined=perm(g.get("defined", np.ones(acc.shape, bool))))}

            yield output_stage(ctx, {"layout": form, "with": "the accumulator (C added in place)"}, make_acc)


#: Tile shapes tried for unwritten output tiles (BLOCK_M x BLOCK_N of DeepGEMM's and
#: DeepGEMM-Ascend's kernels).
TILE_SHAPES = ((128, 128), (64, 128), (128, 64), (128, 256), (256, 128), (64, 64), (32, 32), (16, 16))


def _init_values(ctx: CaseContext, name: str) -> np.ndarray:
    o = ctx.outputs_desc[name]
    g = ctx.golden[name]
    if o["init"] == "nan":
        return np.full(g.shape, np.nan, g.dtype)
    if o["init"] in ("zeros", "returned"):
        return np.zeros(g.shape, g.dtype)
    return np.asarray(ctx.inputs[o["init"]]).astype(g.dtype)


def tile_not_written(ctx: CaseContext) -> Iterator[Variant]:
    """Whole output tiles left at their initial value (zeros, NaN or C): the tiles where the
    device holds exactly the initial value and the golden does not (fitted per tile shape)."""
    name = ctx.main
    g = ctx.golden[name]
    if g.ndim < 2:
        return
    init = _init_values(ctx, name)
    dev = ctx.device[name]
    defined = ctx.classes[name].defined
    d64, i64, g64 = dev.astype(np.float64), init.astype(np.float64), g.astype(np.float64)
    with np.errstate(invalid="ignore"):
        at_init = (d64 == i64) | (np.isnan(d64) & np.isnan(i64)) | ~defined
        differs = defined & ~((g64 == i64) | (np.isnan(g64) & np.isnan(i64)))
    r, c = g.shape[-2:]
    lead = g.shape[:-2]
    for bm, bn in TILE_SHAPES:
        if bm > r and bn > c:
            continue
        tr, tc = -(-r // bm), -(-c // bn)
        pad = [(0, 0)] * len(lead) + [(0, tr * bm - r), (0, tc * bn - c)]
        ai = np.pad(at_init, pad, constant_values=True).reshape(lead + (tr, bm, tc, bn))
        df = np.pad(differs, pad, constant_values=False).reshape(lead + (tr, bm, tc, bn))
        unwritten = ai.all(axis=(-3, -1)) & df.any(axis=(-3, -1))
        count = int(np.count_nonzero(unwritten))
        if count == 0:
            continue
        mask = np.repeat(np.repeat(unwritten, bm, axis=-2), bn, axis=-1)[..., :r, :c]
        tiles = [list(map(int, t)) for t in zip(*np.nonzero(unwritten), strict=True)][:16]

        def make(mask: np.ndarray = mask) -> dict[str, Candidate]:
            values = np.where(mask, init, g)
            return {name: main_candidate(ctx, main=values)}

        yield output_stage(ctx, {"tile": f"{bm}x{bn}", "tiles": count, "first": tiles}, make)


# ----------------------------------------------------------------------------------------------
# accumulation
# ----------------------------------------------------------------------------------------------

#: Mantissa widths and promotion intervals the accumulator fit tries.
BITS = tuple(range(8, 24))
INTERVALS = (32, 64, 128, 256, 512, 1024, 2048, 4096)
#: Rows of a dense GEMM the accumulator fit is scored on.
FIT_ROWS = 32


def narrow_accumulator(ctx: CaseContext) -> Iterator[Variant]:
    """A narrower accumulator than float32: ``limited(bits, interval)`` fitted to the device
    (coarse mantissa widths at a 128 promotion interval, then the neighbours of the best, the
    interval, and the width again), reported as the fitted model.  The fit is scored on at most
    :data:`FIT_ROWS` rows of a dense GEMM (the model is slow); the fitted model is then scored
    like every other candidate."""
    if ctx.family.name not in ("gemm", "grouped", "einsum") or ctx.kernel == "tf32_hc_prenorm_gemm":
        return
    if not ctx.interval:
        return
    k = _k_of(ctx) or 32
    fp32_scales = "a_sf" in ctx.inputs and not ue8m0_scales(ctx)
    intervals = [i for i in INTERVALS if i <= max(align(k, 32), 32)]
    if fp32_scales:  # FP32 scales need blocks that are multiples of the interval
        intervals = [i for i in intervals if 128 % i == 0]
    sample = ctx.sample or ctx.fit_sample(FIT_ROWS)
    tried: dict[tuple[int, int], float] = {}

    def variant(bits: int, interval: int) -> Variant:
        model = Limited(bits, interval)

        def compute(s: Sample | None) -> dict[str, Candidate]:
            return ctx.regenerate(s, accumulation=model)

        return Variant({"model": str(model), "bits": bits, "interval": interval}, compute, "slow")

    def quality(bits: int, interval: int) -> float:
        if (bits, interval) not in tried:
            sc = ctx.score("narrow_accumulator", variant(bits, interval), sample)
            tried[bits, interval] = -1.0 if sc.error else sc.quality
        return tried[bits, interval]

    def best_bits(interval: int, around: list[int]) -> int:
        return max(around, key=lambda b: (quality(b, interval), -b))

    start = 128 if 128 in intervals else intervals[-1]
    b = best_bits(start, [x for x in BITS if x in (8, 10, 12, 14, 16, 19, 22)])
    if quality(b, start) <= 0.05:
        yield variant(b, start)  # no accumulator width reproduces the failures: scored, not fitted
        return
    b = best_bits(start, [x for x in range(b - 2, b + 3) if x in BITS])
    interval = max(intervals, key=lambda i: (quality(b, i), -abs(i - start)))
    b = best_bits(interval, [x for x in range(b - 1, b + 2) if x in BITS])
    yield variant(b, interval)


# ----------------------------------------------------------------------------------------------
# MQA logits
# ----------------------------------------------------------------------------------------------

def mqa_weights_missing(ctx: CaseContext) -> Iterator[Variant]:
    """The per-head weights not applied (every weight 1)."""
    w = np.asarray(ctx.inputs["w"])
    v = regen(ctx, {}, {"w": np.ones_like(w)})
    if v is not None:
        yield v


def _negated_q(ctx: CaseContext) -> np.ndarray:
    q = np.asarray(ctx.inputs["q"])
    u = np.ascontiguousarray(q).view(np.uint8)
    flip = np.uint8(0x88) if ctx.params.get("fp4") else np.uint8(0x80)  # sign bits of E2M1 pairs / E4M3
    return (u ^ flip).view(q.dtype).reshape(q.shape)


def mqa_relu_missing(ctx: CaseContext) -> Iterator[Variant]:
    """No ReLU on the per-head scores: sum_h w_h (q_h . k), computed as the logits of q minus
    the logits of -q (relu(x) - relu(-x) = x), from the stored accumulator and one regeneration."""
    if not ctx.interval:
        return

    def make() -> dict[str, Candidate]:
        g = ctx.output_goldens[ctx.main]
        neg = ctx.regenerate(None, {"q": _negated_q(ctx)})[ctx.main].golden
        with np.errstate(invalid="ignore"):
            acc = g["acc"] - neg["acc"]
        vals = epilogue_values({**ctx.epilogue, "c": None}, acc, None)
        return {ctx.main: main_candidate(ctx, main=finite_or_golden(vals, g["main"]), acc=acc, S=g["S"] + neg["S"])}

    v = output_stage(ctx, {}, make)
    v.cost = "regen"
    yield v


def mqa_kv_range_off_by_one(ctx: CaseContext) -> Iterator[Variant]:
    """Each query's KV range one token off: the end (or start) one past or one short; paged:
    every context length one off."""
    if "paged" in ctx.kernel:
        lens = np.asarray(ctx.inputs["context_lens"])
        for step in (1, -1):
            new = np.maximum(lens + step, 0).astype(lens.dtype)
            v = regen(ctx, {"context_lens": f"{step:+d}"}, {"context_lens": new})
            if v is not None:
                yield v
        return
    ks, ke = np.asarray(ctx.inputs["ks"]), np.asarray(ctx.inputs["ke"])
    seq_kv = np.asarray(ctx.inputs["kv"]).shape[0]
    for name, arr in (("ke", ke), ("ks", ks)):
        for step in (1, -1):
            new = np.clip(arr + step, 0, seq_kv).astype(arr.dtype)
            v = regen(ctx, {name: f"{step:+d}"}, {name: new})
            if v is not None:
                yield v


def paged_block_table_misread(ctx: CaseContext) -> Iterator[Variant]:
    """The block table misread: read transposed (column-major), shifted by one logical block,
    one request's row for every request, or the next request's row."""
    if "paged" not in ctx.kernel:
        return
    t = np.asarray(ctx.inputs["block_table"])
    b, w = t.shape
    shifted = np.zeros_like(t)
    shifted[:, :-1] = t[:, 1:]
    forms = {
        "column_major": t.T.reshape(-1)[: b * w].reshape(b, w) if b * w else t,
        "shifted_by_one_block": shifted,
        "first_row_for_every_request": np.broadcast_to(t[:1], t.shape).copy(),
        "next_request_row": np.roll(t, -1, axis=0),
    }
    for form, new in forms.items():
        v = regen(ctx, {"read": form}, {"block_table": np.ascontiguousarray(new.astype(t.dtype))})
        if v is not None:
            yield v



# ----------------------------------------------------------------------------------------------
# K blocks (issue 27): a block of the K loop dropped or summed twice
# ----------------------------------------------------------------------------------------------

#: A case with more K blocks than this tries the first, middle and last blocks only (each
#: candidate is one regeneration).
MAX_K_BLOCKS = 64


@dataclass
class KOperand:
    """The operand a K-block mutation edits: its name, the K axis of the stored array, how many
    K elements a stored element holds along that axis (2 for packed FP4 stored K-major), and its
    scale tensor (None: no scales)."""

    name: str
    k_axis: int
    pack: int
    sf: SF | None
    gran_k: int | None


def _k_operand(ctx: CaseContext) -> KOperand | None:
    """Operand A of a dense or m-grouped GEMM along K (None for other kernels)."""
    fam, kern = ctx.family.name, ctx.kernel
    sfs = {sf.operand: sf for sf in scale_tensors(ctx)}
    if fam == "gemm" and "skip_head_mid" not in kern:
        k_major = kern[-2] == "n"  # A stored (M, K) when the layout's first letter is n
        fp4 = ctx.params.get("a") == "fp4"
        return KOperand("a", 1 if k_major else 0, 2 if fp4 and k_major else 1, sfs.get("a"), _gran(ctx, "a"))
    if fam == "grouped" and "m_grouped" in kern:
        return KOperand("a", -1, 1, sfs.get("a"), _gran(ctx, "a"))
    return None


def _k_blocks(ctx: CaseContext) -> list[int]:
    """The K-loop block sizes tried: the scale block of a quantised GEMM (128; DeepGEMM-Ascend
    also 256), 64 and 128 for BF16."""
    if "a_sf" in ctx.inputs:
        return [128, 256] if ctx.ascend else [128]
    return [64, 128]


def _k_block_ranges(k: int, blk: int) -> list[tuple[int, int]]:
    return [(s, min(s + blk, k)) for s in range(0, k, blk)]


def _k_slice(op: KOperand, x: np.ndarray, lo: int, hi: int) -> tuple[slice | int, ...]:
    axis = op.k_axis % x.ndim
    idx: list[slice | int] = [slice(None)] * x.ndim
    idx[axis] = slice(lo // op.pack, -(-hi // op.pack))
    return tuple(idx)


def _k_block_changed(ctx: CaseContext, op: KOperand, lo: int, hi: int, how: str) -> dict[str, np.ndarray] | None:
    """Operand A with K range [lo, hi) zeroed (``drop``) or its contribution doubled (``double``:
    the block's scales times two, exact; without scales the BF16 elements times two, exact)."""
    x = np.asarray(ctx.inputs[op.name])
    if how == "drop":
        new = np.array(x, copy=True)
        new[_k_slice(op, x, lo, hi)] = 0
        return {op.name: new}
    if op.sf is not None and op.gran_k:
        if lo % op.gran_k or (hi % op.gran_k and hi != _k_of(ctx)):
            return None  # the block does not cover whole scale blocks
        canon = np.array(op.sf.canonical(ctx.inputs[op.sf.name]), copy=True)
        canon[..., lo // op.gran_k: -(-hi // op.gran_k)] *= np.float32(2)
        return {op.sf.name: op.sf.stored(canon)}
    if x.dtype.itemsize != 2:
        return None
    new = np.array(x, copy=True)
    sl = _k_slice(op, x, lo, hi)
    new[sl] = (new[sl].astype(np.float32) * 2).astype(x.dtype)
    return {op.name: new}


def _k_block_variants(ctx: CaseContext, how: str, which: str) -> Iterator[Variant]:
    op = _k_operand(ctx)
    k = _k_of(ctx)
    if op is None or not k:
        return
    for blk in _k_blocks(ctx):
        ranges = _k_block_ranges(k, blk)
        if len(ranges) < 2 and how == "drop":
            continue  # dropping the only block is a zero output, not a K-loop bug
        picked = list(enumerate(ranges))
        if which == "last":
            picked = picked[-1:]
        elif how == "drop":
            picked = picked[:-1]  # the last block is its own entry
        if len(picked) > MAX_K_BLOCKS:
            picked = [picked[0], picked[len(picked) // 2], picked[-1]]
        for j, (lo, hi) in picked:
            changes = _k_block_changed(ctx, op, lo, hi, how)
            if changes is None:
                continue
            v = regen(ctx, {"block": blk, "index": j, "k_range": [lo, hi], "of": len(ranges)}, changes)
            if v is not None:
                yield v


def k_last_block_dropped(ctx: CaseContext) -> Iterator[Variant]:
    """The last K block of the K loop not accumulated (a loop bound one block short, or a
    partial last block skipped)."""
    yield from _k_block_variants(ctx, "drop", "last")


def k_block_dropped(ctx: CaseContext) -> Iterator[Variant]:
    """One K block other than the last not accumulated (a pipeline stage skipped)."""
    yield from _k_block_variants(ctx, "drop", "any")


def k_block_doubled(ctx: CaseContext) -> Iterator[Variant]:
    """One K block accumulated twice (a pipeline stage consumed twice)."""
    yield from _k_block_variants(ctx, "double", "any")


# ----------------------------------------------------------------------------------------------
# a truncating float32 accumulator (issue 27)
# ----------------------------------------------------------------------------------------------

#: K blocks of the truncating accumulator: the profile model's MMA block and the scale block.
TRUNC_BLOCKS = (32, 128)
#: At most this many K blocks (one regeneration each) per block size.
MAX_TRUNC_BLOCKS = 256


def _keep_k_range(ctx: CaseContext, op: KOperand, lo: int, hi: int) -> dict[str, np.ndarray]:
    """Operand A with every K element outside [lo, hi) zeroed."""
    x = np.asarray(ctx.inputs[op.name])
    new = np.zeros_like(x)
    sl = _k_slice(op, x, lo, hi)
    new[sl] = x[sl]
    return {op.name: new}


def accumulator_truncated(ctx: CaseContext) -> Iterator[Variant]:
    """A float32 accumulator that rounds toward zero where the profile's model rounds to nearest:
    per K block, the exact scaled block sum truncated to float32 and added to the float32
    accumulator with a truncating addition, in K order; then the kernel's epilogue.  Unlike
    ``narrow_accumulator`` (a fixed-point sum of fewer bits, promoted with a rounding addition), it
    keeps float32's 24 bits and its error grows with the number of K blocks, always toward zero:
    scored on every differing element (the bound of a float32 sum allows each error)."""
    op = _k_operand(ctx)
    k = _k_of(ctx)
    if op is None or not k or not ctx.interval:
        return
    for blk in TRUNC_BLOCKS:
        ranges = _k_block_ranges(k, blk)
        if len(ranges) > MAX_TRUNC_BLOCKS or (blk != TRUNC_BLOCKS[0] and len(ranges) < 2):
            continue

        def compute(sample: Sample | None, ranges: list[tuple[int, int]] = ranges) -> dict[str, Candidate]:
            base = ctx.golden_candidates(sample)[ctx.main]
            g = base.golden
            acc = np.zeros(g["main"].shape, np.float64)
            with np.errstate(over="ignore", invalid="ignore"):
                for lo, hi in ranges:
                    part = ctx.regenerate(sample, _keep_k_range(ctx, op, lo, hi))[ctx.main].golden["acc"]
                    acc = round_toward_zero(acc + round_toward_zero(part, fm.F32), fm.F32)
            c = _c_input(ctx)
            if c is not None and sample is not None:
                c = sample.take(c)
            values = finite_or_golden(epilogue_values(ctx.epilogue, acc, c), g["main"])
            return {ctx.main: Candidate({**g, "main": values, "acc": acc}, base.check, base.inputs)}

        yield Variant({"block": blk, "additions": "float32, toward zero", "blocks": len(ranges)}, compute, "slow",
                      evidence="differing")


# ----------------------------------------------------------------------------------------------
# UE8M0 and FP32 scales confused (issue 27; DeepGEMM #112, vLLM #38083)
# ----------------------------------------------------------------------------------------------

def sf_rounded_up_to_pow2(ctx: CaseContext) -> Iterator[Variant]:
    """FP32 scales rounded up to powers of two (what a UE8M0 cast does: 2^ceil(log2 s)) on a
    kernel that expects FP32 scales, on one operand or both.  ``sf_mantissa_dropped`` rounds
    them down instead (the exponent byte kept, the mantissa cut)."""
    if ue8m0_scales(ctx):
        return
    sfs = scale_tensors(ctx)
    changes = {}
    for sf in sfs:
        x = np.asarray(ctx.inputs[sf.name], np.float32)
        m, e = np.frexp(x.astype(np.float64))
        up = np.where(m == 0.5, x, np.ldexp(1.0, e)).astype(np.float32)  # exact powers stay
        changes[sf.name] = np.where(np.isfinite(x) & (x > 0), up, x).astype(np.float32)
    yield from _each_operand_and_both(ctx, sfs, changes)


#: Largest finite magnitude of an operand's element format (the quantiser's amax target).
_FMT_MAX = {"fp8": 448.0, "fp4": 6.0}


def _data_canonical(ctx: CaseContext, side: str) -> np.ndarray | None:
    """Operand ``side``'s FP8 elements as float64 values in canonical (..., MN, K) form (None for
    packed FP4 or a layout this does not model)."""
    fam, kern = ctx.family.name, ctx.kernel
    x = ctx.inputs.get(side)
    if not isinstance(x, np.ndarray) or x.dtype.itemsize != 1 or x.dtype == np.uint8 or x.dtype == np.int8:
        return None
    v = x.astype(np.float32).astype(np.float64)
    if fam == "gemm":
        k_major = (kern[-2] == "n") if side == "a" else (kern[-1] == "t")
        return v if k_major else v.T
    if fam == "grouped" and "m_grouped" in kern:
        return v
    return None


def sf_pow2_kept_float32(ctx: CaseContext) -> Iterator[Variant]:
    """The reverse: a kernel that expects power-of-two (UE8M0) scales given the quantiser's
    un-rounded float32 ones.  The data were quantised with s = 2^ceil(log2(amax / max_fmt)); the
    un-rounded scale is amax / max_fmt, recovered from the data as s * max|q| / max_fmt per
    scale block (a factor in (1/2, 1]), on one operand or both."""
    if not ue8m0_scales(ctx):
        return
    sfs = scale_tensors(ctx)
    changes = {}
    for sf in sfs:
        data = _data_canonical(ctx, sf.operand)
        gran = _gran(ctx, sf.operand)
        canon = sf.canonical(ctx.inputs[sf.name]).astype(np.float64)
        if data is None or not gran:
            continue
        k = data.shape[-1]
        kb = canon.shape[-1]
        pad = kb * gran - k
        if pad < 0 or data.shape[:-1] != canon.shape[:-1]:
            continue
        d = np.concatenate([np.abs(data), np.zeros(data.shape[:-1] + (pad,))], axis=-1)
        amax = d.reshape(data.shape[:-1] + (kb, gran)).max(axis=-1)
        new = np.where(amax > 0, canon * amax / _FMT_MAX["fp8"], canon).astype(np.float32)
        changes[sf.name] = sf.stored(new)
    yield from _each_operand_and_both(ctx, [sf for sf in sfs if sf.name in changes], changes)


# ----------------------------------------------------------------------------------------------
# MQA: the head dimension's stride or swizzle (issue 27; DeepGEMM #433) and the page size
# (ROCm/aiter #5591)
# ----------------------------------------------------------------------------------------------

def _swizzle(o: np.ndarray, row_bytes: int) -> np.ndarray:
    """The TMA swizzle of ``row_bytes``-byte atoms (32, 64 or 128): bits 7.. of a byte offset
    XORed into its 16-byte chunk index (1, 2 or 3 bits)."""
    bits = {32: 1, 64: 2, 128: 3}[row_bytes]
    mask = (1 << bits) - 1
    return o ^ (((o >> 7) & mask) << 4)


def _misread_rows(flat: np.ndarray, row: int, form: str) -> np.ndarray:
    """Bytes of ``row``-byte rows (a flat uint8 region) as a kernel built for 128-byte rows
    reads them: ``swizzle`` un-swizzles the head_dim-byte swizzle with the 128-byte pattern;
    ``stride`` steps 128 bytes per row (bytes past the region read as 0)."""
    n = flat.size
    o = np.arange(n, dtype=np.int64)
    if form == "swizzle":
        src = _swizzle(_swizzle(o, 128), row)
    else:
        src = (o // row) * 128 + o % row
    out = np.zeros_like(flat)
    ok = src < n
    out[ok] = flat[src[ok]]
    return out


def _kv_value_regions(ctx: CaseContext, x: np.ndarray, fn: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """The MQA key values passed through ``fn`` (flat bytes): the dense kv whole, the paged cache
    block by block (each block's values come first, then its scales)."""
    u = np.ascontiguousarray(x).view(np.uint8)
    if "paged" not in ctx.kernel:
        return fn(u.reshape(-1)).view(x.dtype).reshape(x.shape)
    bk = int(ctx.params["block_kv"])
    vb = x.shape[-1] - 4
    blocks = np.array(u.reshape(x.shape[0], -1), copy=True)
    for i in range(blocks.shape[0]):
        blocks[i, : bk * vb] = fn(blocks[i, : bk * vb])
    return blocks.reshape(x.shape)


def mqa_head_dim_misread(ctx: CaseContext) -> Iterator[Variant]:
    """FP8 MQA at head_dim 32 / 64 read as if rows were 128 bytes (the only head_dim where the
    kernel's hard-coded value matches): shared memory swizzled in head_dim-byte atoms and
    un-swizzled with the 128-byte pattern, or a 128-byte row (head) stride; in the keys, the
    queries, or both."""
    if ctx.ascend or ctx.params.get("fp4"):
        return
    dim = int(ctx.params.get("head_dim") or 0)
    if dim not in (32, 64):
        return
    kv_name = "kv_cache" if "kv_cache" in ctx.inputs else "kv"
    for form in ("swizzle", "stride"):
        def fn(flat: np.ndarray, form: str = form) -> np.ndarray:
            return _misread_rows(flat, dim, form)

        q = np.asarray(ctx.inputs["q"])
        new_q = fn(np.ascontiguousarray(q).view(np.uint8).reshape(-1)).view(q.dtype).reshape(q.shape)
        new_kv = _kv_value_regions(ctx, np.asarray(ctx.inputs[kv_name]), fn)
        for which, changes in (("kv", {kv_name: new_kv}), ("q", {"q": new_q}),
                               ("q and kv", {"q": new_q, kv_name: new_kv})):
            v = regen(ctx, {"read": f"{form} for 128-byte rows", "head_dim": dim, "operand": which}, changes)
            if v is not None:
                yield v


def _paged_gather(ctx: CaseContext, page: int) -> dict[str, np.ndarray]:
    """A KV cache and block table equal, for the exact kernel, to a kernel that assumes pages of
    ``page`` tokens (0: per-token paging, the table indexed by token position and each page's
    token 0 read) on the real cache of block_kv-token blocks: token t of request b read at the
    flat memory address that assumption gives (past the cache or the table: zeros)."""
    cache = np.asarray(ctx.inputs["kv_cache"])
    table = np.asarray(ctx.inputs["block_table"]).astype(np.int64)
    lens = np.asarray(ctx.inputs["context_lens"]).reshape(table.shape[0], -1).max(axis=1)
    bk = int(ctx.params["block_kv"])
    row = cache.shape[-1]
    vb = row - 4
    mem = np.ascontiguousarray(cache).view(np.uint8).reshape(-1)
    flat_table = table.reshape(-1)
    b, w = table.shape
    out = np.zeros((b * w, bk, 1, row), np.uint8)
    flat_out = out.reshape(b * w, -1)
    for r in range(b):
        for t in range(int(min(lens[r], w * bk))):
            if page == 0:
                col, off, p = r * w + t, 0, bk
            else:
                col, off, p = r * w + t // page, t % page, page
            phys = int(flat_table[col]) if col < flat_table.size else 0
            base = phys * p * row
            va, sa = base + off * vb, base + p * vb + off * 4
            dst = r * w + t // bk, t % bk
            if va + vb <= mem.size:
                flat_out[dst[0], dst[1] * vb: dst[1] * vb + vb] = mem[va: va + vb]
            if sa + 4 <= mem.size:
                flat_out[dst[0], bk * vb + dst[1] * 4: bk * vb + dst[1] * 4 + 4] = mem[sa: sa + 4]
    new_table = np.arange(b * w, dtype=np.asarray(ctx.inputs["block_table"]).dtype).reshape(b, w)
    return {"kv_cache": out.view(cache.dtype), "block_table": new_table}


def paged_page_size_mismatch(ctx: CaseContext) -> Iterator[Variant]:
    """Paged MQA run with a page size other than the one the block table and the cache were
    built for: per-token paging (the table indexed by token position, token 0 of each block read:
    ROCm/aiter #5591), or another block_kv (32, 64, 128)."""
    if "paged" not in ctx.kernel:
        return
    bk = int(ctx.params["block_kv"])
    for page in (0, 32, 64, 128):
        if page == bk:
            continue
        v = regen(ctx, {"page_size": "1 (per-token paging)" if page == 0 else page, "block_kv": bk},
                  _paged_gather(ctx, page))
        if v is not None:
            yield v
