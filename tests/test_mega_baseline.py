"""DeepGEMM's Mega MoE baseline composed stage by stage, and the combine order DeepGEMM specifies.

DeepGEMM's ``tests/test_mega_moe.py`` asserts bitwise equality between the fused kernel and an
unfused pipeline: DeepEP's expand-mode dispatch, ``m_grouped_fp8_fp4_gemm_nt_contiguous`` (psum
layout), TileLang's ``swiglu_apply_weight_to_fp8``, the L2 grouped GEMM, and DeepEP's combine with
``allow_multiple_reduction=False`` (a float32 running sum from +0 of the bf16 slot outputs in
top-k order, rounded once to bf16).  Here that pipeline is composed per emulated rank, with the
combine written in this file, and compared with ``fp8_fp4_mega_moe`` / ``bf16_mega_moe`` under
``sm100``, on random inputs and on inputs whose slot outputs span more than 24 binades (where
the float32 order decides bf16 roundings).  The combine rule itself is checked against a scalar
float32 loop over exact rationals on hand-made terms near bf16 midpoints.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import pytest

import deepgemm_ref as dg
from deepgemm_ref import ep as deep_ep
from deepgemm_ref import formats as fm
from deepgemm_ref import mega, runtime, trace
from deepgemm_ref.golden.check import CheckOptions, element_bounds
from deepgemm_ref.mega import stages

from . import reference as ref
from .test_mega_moe import BF16, Problem, _bf16_rne, _bits, _requant_ref, _swiglu_ref, run_cuda

# ---------------------------------------------------------------------------------------------
# the baseline, one function per step
# ---------------------------------------------------------------------------------------------


@dataclass
class Received:
    """One destination rank's expand-mode dispatch: rows x (bf16, or e4m3 with MN-major TMA-aligned
    packed UE8M0 scales x_sf), the per-row top-k weight, the psum END offsets of the local experts
    (int32 (E_l,)), and src (rows, 3) = (source rank, token, slot) of every row, -1 elsewhere."""

    x: np.ndarray
    x_sf: np.ndarray | None
    weights: np.ndarray
    psum: np.ndarray
    src: np.ndarray


def _mn_major(sf: np.ndarray, rows: int) -> np.ndarray:
    """int32 (m, c) scales -> (rows, c) with strides (1, align(rows, 4)) elements; rows past m zero."""
    m, c = sf.shape
    phys = np.zeros((c, -(-rows // 4) * 4), np.int32)
    phys[:, :m] = sf.T
    return phys.T[:rows]


def dispatch(p: Problem, bf16: bool, alignment: int) -> list[Received]:
    """DeepEP ``ElasticBuffer.dispatch(..., do_expand=True, do_cpu_sync=False, do_handle_copy=False,
    use_tma_aligned_col_major_sf=True)`` on every rank, as DeepGEMM's test calls it.

    Stand-in: the package's ``mega_moe_dispatch`` stage, its rows padded (zeros, src -1) to
    DeepEP's no-sync worst case ``align(R T K' + (A - 1) E_l, A)`` rows (K' = min(K, E_l)), so
    that ``avail_tokens = psum[-1]`` is below the row count as on the device.  Replace this
    function by ``deepgemm_ref.ep``'s ``ElasticBuffer`` (src from the handle's metadata).
    """
    xs = list(p.x) if bf16 else [(p.xq[r], p.x_sf_packed[r]) for r in range(p.R)]
    e_l = p.E // p.R
    worst = -(-(p.R * max(p.N) * min(p.K, e_l) + (alignment - 1) * e_l) // alignment) * alignment
    out = []
    for d in stages.mega_moe_dispatch(xs, p.idx, p.w, p.E, expert_alignment=alignment):
        m = d.recv_x.shape[0]
        assert m <= worst
        x = np.zeros((worst, p.H), d.recv_x.dtype)
        x[:m] = d.recv_x
        w = np.zeros(worst, np.float32)
        w[:m] = d.recv_topk_weights
        src = np.full((worst, 3), -1, np.int64)
        src[:m] = d.src
        sf = None if d.recv_x_sf is None else _mn_major(d.recv_x_sf, worst)
        out.append(Received(x, sf, w, d.psum_num_recv_tokens_per_expert, src))
    return out


def experts(p: Problem, r: int, d: Received, bf16: bool, clamp: float | None, semantics: str) -> np.ndarray:
    """One rank's L1 grouped GEMM, TileLang's SwiGLU op and L2 grouped GEMM (psum layout): bf16 (rows, H)."""
    e_l = p.E // p.R
    ids = slice(r * e_l, (r + 1) * e_l)
    rows = d.x.shape[0]
    l1 = np.zeros((rows, 2 * p.I), BF16)
    l2 = np.zeros((rows, p.H), BF16)
    swiglu = dict(x=l1, topk_weights=d.weights, avail_tokens=d.psum[-1], num_per_channels=32,
                  use_col_major_scales=True, clamp_value=clamp, fast_math=True, semantics=semantics)
    if bf16:
        dg.m_grouped_bf16_gemm_nt_contiguous(d.x, p.w1_bf16[ids], l1, d.psum, compiled_dims="", use_psum_layout=True)
        acts = stages.swiglu_apply_weight_to_fp8(round_scale=False, ue8m0_scale=False, output_bf16=True,
                                                 **swiglu)[-1]
        dg.m_grouped_bf16_gemm_nt_contiguous(acts, p.w2_bf16[ids], l2, d.psum, compiled_dims="", use_psum_layout=True)
        return l2
    w1 = (p.w1q[ids], dg.transform_sf_into_required_layout(p.w1sf[ids], 2 * p.I, p.H, (1, 32), e_l))
    w2 = (p.w2q[ids], dg.transform_sf_into_required_layout(p.w2sf[ids], p.H, p.I, (1, 32), e_l))
    dg.m_grouped_fp8_fp4_gemm_nt_contiguous((d.x, d.x_sf), w1, l1, d.psum, use_psum_layout=True, recipe=(1, 1, 32))
    acts = stages.swiglu_apply_weight_to_fp8(round_scale=True, ue8m0_scale=True, output_bf16=False, **swiglu)
    dg.m_grouped_fp8_fp4_gemm_nt_contiguous(acts, w2, l2, d.psum, use_psum_layout=True, recipe=(1, 1, 32))
    return l2


def slot_terms(p: Problem, recv: list[Received], l2: list[np.ndarray]) -> list[np.ndarray]:
    """Per source rank the (N, K, H) float64 slot outputs sent back by the owners (masked slots 0)."""
    terms = [np.zeros((p.N[s], p.K, p.H)) for s in range(p.R)]
    for d, o in zip(recv, l2, strict=True):
        for i in np.flatnonzero(d.src[:, 0] >= 0):
            s, t, k = (int(v) for v in d.src[i])
            terms[s][t, k] = o[i].astype(np.float64)
    return terms


def combine(terms: list[np.ndarray]) -> list[np.ndarray]:
    """DeepEP's combine with allow_multiple_reduction=False: F = +0; F = f32(F + o_k) for k = 0, 1, ...;
    y = bf16(F) (masked slots add +0, which changes nothing)."""
    ys = []
    for t in terms:
        f = np.zeros((t.shape[0], t.shape[2]), np.float32)
        for k in range(t.shape[1]):
            f = np.add(f, t[:, k].astype(np.float32), dtype=np.float32)
        ys.append(_bf16_rne(f.astype(np.float64)).astype(BF16))
    return ys


def baseline(p: Problem, bf16: bool, clamp: float | None, semantics: str = "fused"):
    """The whole baseline of DeepGEMM's test: (y per rank, the dispatch, the L2 rows per rank)."""
    alignment = dg.get_theoretical_mk_alignment_for_contiguous_layout()
    state = runtime.runtime_state()
    dg.set_mk_alignment_for_contiguous_layout(alignment)
    try:
        recv = dispatch(p, bf16, alignment)
        l2 = [experts(p, r, d, bf16, clamp, semantics) for r, d in enumerate(recv)]
    finally:
        runtime.restore_runtime(state)
    return combine(slot_terms(p, recv, l2)), recv, l2


def _bf16_of_exact_sum(terms: np.ndarray) -> np.ndarray:
    """bf16 of the exact sum over axis 1 (the old golden), with rationals: float64 (n, H)."""
    n, _, h = terms.shape
    out = np.empty((n, h))
    for i in range(n):
        for c in range(h):
            out[i, c] = ref.rn(sum((Fraction(float(v)) for v in terms[i, :, c]), Fraction(0)), fm.BF16)
    return out


def _wide_range(p: Problem, shifts: dict[int, int]) -> Problem:
    """Scale expert e's L2 weights by 2^shifts[e] (exact in bf16 and in the FP4 scales), so its
    slot outputs move by the same power of two (upwards: the FP4 quantiser floors amax at 1e-4)."""
    for e, s in shifts.items():
        p.w2_bf16[e] = (p.w2_bf16[e].astype(np.float32) * np.float32(2.0**s)).astype(BF16)
    p.w2q, p.w2sf = p._fp4(p.w2_bf16)
    return p


def _span_binades(terms: list[np.ndarray]) -> float:
    """The widest log2(max |o| / min |o|) over the non-zero slot outputs of one token and channel."""
    widest = 0.0
    for t in terms:
        a = np.abs(t)
        hi = a.max(axis=1)
        lo = np.where(a > 0, a, np.inf).min(axis=1)
        ok = np.isfinite(lo) & (hi > 0)
        if ok.any():
            widest = max(widest, float(np.log2(hi[ok] / lo[ok]).max()))
    return widest


def deepep_baseline(p: Problem, bf16: bool, clamp: float | None, semantics: str = "fused") -> list[np.ndarray]:
    """The baseline exactly as DeepGEMM's test builds it, with ``deepgemm_ref.ep`` for DeepEP: on every
    rank (one thread each, ``run_emulated``) an ``ElasticBuffer`` expand-mode dispatch (FP8 with
    TMA-aligned column-major scales, no CPU sync, no handle copy), the L1 grouped GEMM, the SwiGLU
    op, the L2 grouped GEMM, and the buffer's ``combine`` of the L2 rows with
    ``allow_multiple_reduction=False``.  Returns y per rank."""
    alignment = dg.get_theoretical_mk_alignment_for_contiguous_layout()
    t_max = max(p.N)
    state = runtime.runtime_state()
    dg.set_mk_alignment_for_contiguous_layout(alignment)

    def rank(group) -> np.ndarray:
        r = group.rank()
        buf = deep_ep.ElasticBuffer(group, num_max_tokens_per_rank=t_max, hidden=p.H, num_topk=p.K,
                                    use_fp8_dispatch=not bf16, allow_multiple_reduction=False)
        x = p.x[r] if bf16 else (p.xq[r], p.x_sf_packed[r])
        recv_x, _, recv_w, handle, _ = buf.dispatch(
            x, topk_idx=p.idx[r], topk_weights=p.w[r], num_experts=p.E, expert_alignment=alignment,
            do_expand=True, do_cpu_sync=False, do_handle_copy=False, use_tma_aligned_col_major_sf=True)
        xs, sf = (recv_x, None) if bf16 else recv_x
        psum = handle.psum_num_recv_tokens_per_expert
        d = Received(xs, sf, recv_w, psum, np.zeros((0, 3), np.int64))
        l2 = experts(p, r, d, bf16, clamp, semantics)
        y, _, _ = buf.combine(l2, handle)
        return y

    try:
        return deep_ep.run_emulated(rank, p.R)
    finally:
        runtime.restore_runtime(state)


# ---------------------------------------------------------------------------------------------
# the baseline equals the fused kernel bitwise
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("semantics", ["fused", "baseline"])
def test_baseline_equals_fp8_fp4_mega_moe(semantics):
    """Random inputs (DeepGEMM's test in small): both semantics of the SwiGLU op, since no valid
    row's 32-channel group has amax below 1e-4 and the clamp 10.0 is a bf16 value."""
    p = Problem(4, 16, 5, 4, 512, 512, seed=101, masked_ratio=0.15)
    want, _, _ = run_cuda(p, clamp=10.0)
    with trace.capture() as cap:
        got, recv, _ = baseline(p, bf16=False, clamp=10.0, semantics=semantics)
    for r in range(p.R):
        assert _bits(got[r]).tobytes() == _bits(want[r]).tobytes(), r
    # the precondition under which TileLang's op and the fused kernel agree, on every valid row
    v = [rec.extra["swiglu.output"] for rec in cap.records if rec.func == "swiglu_apply_weight_to_fp8"]
    for d, vr in zip(recv, v, strict=True):
        valid = d.src[: vr.shape[0], 0] >= 0
        assert np.abs(vr[valid]).reshape(-1, p.I // 32, 32).max(axis=2).min() >= 1e-4


def test_baseline_equals_bf16_mega_moe():
    p = Problem(2, 8, 6, 3, 256, 256, seed=103, masked_ratio=0.1)
    want, _, _ = run_cuda(p, clamp=10.0, bf16=True)
    got, _, _ = baseline(p, bf16=True, clamp=10.0, semantics="baseline")
    for r in range(p.R):
        assert _bits(got[r]).tobytes() == _bits(want[r]).tobytes(), r


@pytest.mark.parametrize("bf16", [False, True], ids=["fp8xfp4", "bf16"])
def test_baseline_equals_fused_on_wide_range_slot_outputs(bf16):
    """Experts 1 and 3 with L2 weights 2^26 times larger: slot outputs of one token span more than
    24 binades, the float32 combine drops the small ones, and the sums of the large ones are
    often bf16 midpoints.  Fused == baseline (its combine written here), and both differ from the
    old golden (bf16 of the exact sum) somewhere, so the order is what is being tested."""
    h = 256 if bf16 else 512
    p = _wide_range(Problem(2, 4, 8, 3, h, h, seed=107), {1: 26, 3: 26})
    want, _, _ = run_cuda(p, clamp=10.0, bf16=bf16)
    got, recv, l2 = baseline(p, bf16=bf16, clamp=10.0, semantics="baseline")
    terms = slot_terms(p, recv, l2)
    assert _span_binades(terms) > 24
    for r in range(p.R):
        assert _bits(got[r]).tobytes() == _bits(want[r]).tobytes(), r
    old = [_bf16_of_exact_sum(t) for t in terms]
    assert any(np.any(o != w.astype(np.float64)) for o, w in zip(old, want, strict=True))
    # the package's combine stage gives the same bytes from the same L2 rows
    handles = stages.mega_moe_dispatch(list(p.x) if bf16 else [(p.xq[r], p.x_sf_packed[r]) for r in range(p.R)],
                                       p.idx, p.w, p.E,
                                       expert_alignment=dg.get_theoretical_mk_alignment_for_contiguous_layout())
    rows = [o[: hd.src.shape[0]] for o, hd in zip(l2, handles, strict=True)]
    staged = stages.mega_moe_combine(rows, handles)
    for r in range(p.R):
        assert _bits(staged[r]).tobytes() == _bits(want[r]).tobytes(), r


# ---------------------------------------------------------------------------------------------
# the combine rule on hand-made wide-range terms
# ---------------------------------------------------------------------------------------------

def _terms_near_midpoints(rng: np.random.Generator, n: int, j: int, h: int) -> np.ndarray:
    """(n, j, h) bf16 values: big bf16 pairs whose sum is a bf16 midpoint (or one float32 ulp of it)
    plus tiny terms 2^-30 to 2^-60 below them, cancellations, masked (+0) slots, and random
    magnitudes from 2^-60 to 2^60; every row spans more than 24 binades."""
    t = np.zeros((n, j, h))
    for c in range(h):
        for i in range(n):
            kind = (i + c) % 4
            a = float(rng.integers(128, 256)) * 2.0 ** int(rng.integers(-20, 20))  # 8 significant bits
            sign = 1.0 if rng.random() < 0.5 else -1.0
            if kind == 0:  # a + half an ulp of a (a bf16 midpoint) + a tiny term of either sign
                ulp = 2.0 ** (np.floor(np.log2(a)) - 7)
                col = [a, ulp / 2, sign * a * 2.0 ** -int(rng.integers(30, 60))]
            elif kind == 1:  # cancellation: the tiny term is all that is left
                col = [a, sign * a * 2.0**-40, -a]
            elif kind == 2:  # three values 2^30 apart
                col = [a, a * 2.0**-30, a * 2.0**-60]
            else:  # random magnitudes over 120 binades
                col = [float(rng.standard_normal()) * 2.0 ** int(rng.integers(-60, 60)) for _ in range(3)]
            col = col + [0.0] * (j - len(col))
            t[i, :, c] = np.array(rng.permutation(col), np.float64)
    return _bf16_rne(t)


def _f32_loop(terms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(F float64, bf16(F) float64) of F = +0; F = RN_f32(F + o_k), each addition an exact rational rounded."""
    n, j, h = terms.shape
    f = np.empty((n, h))
    for i in range(n):
        for c in range(h):
            acc = 0.0
            for k in range(j):
                acc = ref.rn(Fraction(acc) + Fraction(float(terms[i, k, c])))
            f[i, c] = acc
    return f, np.vectorize(lambda v: ref.rn(Fraction(v), fm.BF16))(f)


def _combine_stage(terms: np.ndarray, shared: np.ndarray | None = None) -> tuple[np.ndarray, object]:
    """mega_moe_combine on one rank whose token t routes slot k to expert k (terms[t, k] as the L2 row;
    a +0 term stands for a masked slot), with ``shared`` (n, h) as its shared_output: (y float64
    (n, h), its trace record)."""
    n, j, h = terms.shape
    idx = np.tile(np.arange(j, dtype=np.int64), (n, 1))
    d = stages.mega_moe_dispatch([np.zeros((n, h), BF16)], [idx], [np.ones((n, j), np.float32)], j)[0]
    rows = np.array([terms[t, k] for _, t, k in d.src], np.float64).astype(BF16)
    with trace.capture(want_acc=True, want_S=True) as cap:
        y = stages.mega_moe_combine([rows], [d], None if shared is None else [shared.astype(BF16)])[0]
    return y.astype(np.float64), cap.last


def test_combine_is_the_float32_top_k_order_sum_on_wide_range_terms():
    terms = _terms_near_midpoints(np.random.default_rng(5), 12, 4, 24)
    f, want = _f32_loop(terms)
    old = _bf16_of_exact_sum(terms)
    assert np.count_nonzero(old != want) >= 5  # the inputs separate the two rules
    for acc_model in ("exact", "fp32"):  # the fp32 model runs the same combine under sm100
        with dg.numerics(arch="sm100", accumulation=acc_model):
            y, rec = _combine_stage(terms)
        assert np.array_equal(y, want), acc_model
        assert np.array_equal(rec.acc, f)  # acc = F, the float32 value as float64
        assert np.all(rec.S >= np.abs(terms).sum(axis=1) * (1 + 2.0**-12))
    # ascend950: exact keeps one rounding of the exact sum; fp32 runs the float32 order
    with dg.numerics(arch="ascend950"):
        y, rec = _combine_stage(terms)
        assert np.array_equal(y, old)
    with dg.numerics(arch="ascend950", accumulation="fp32"):
        assert np.array_equal(_combine_stage(terms)[0], want)


def test_combine_adds_a_shared_output_first_under_deepgemm_as_deepep_adds_its_bias():
    """sm100: F = +0 + shared + slots (DeepEP's bias); ascend950 (fp32 model): slots, then the shared slot."""
    terms = _terms_near_midpoints(np.random.default_rng(11), 8, 4, 16)
    shared, slots = terms[:, 0], terms[:, 1:]
    _, first = _f32_loop(terms)
    _, last = _f32_loop(np.concatenate([slots, shared[:, None]], axis=1))
    assert np.any(first != last)  # the position of the shared term matters on these inputs
    with dg.numerics(arch="sm100"):
        assert np.array_equal(_combine_stage(slots, shared)[0], first)
    with dg.numerics(arch="ascend950", accumulation="fp32"):
        assert np.array_equal(_combine_stage(slots, shared)[0], last)


def test_fused_y_is_the_float32_loop_of_its_own_slot_outputs():
    """The fused kernel's y is the scalar float32 loop over its own recorded combine input, on wide-range data."""
    p = _wide_range(Problem(2, 4, 4, 3, 512, 512, seed=109, masked_ratio=0.2), {0: 28, 2: 28})
    with trace.capture(want_acc=True, want_S=True) as cap:
        ys, _, _ = run_cuda(p, clamp=10.0)
    assert _span_binades([rec.extra["combine.input"].astype(np.float64) for rec in cap.records]) > 24
    for r, rec in enumerate(cap.records):
        terms = rec.extra["combine.input"].astype(np.float64)[:, :, :64]
        f, want = _f32_loop(terms)
        assert np.array_equal(ys[r][:, :64].astype(np.float64), want)
        assert np.array_equal(rec.acc[:, :64], f)


def test_fp32_and_exact_models_agree_where_the_gemms_and_swiglu_are_exact():
    """BF16 path with integer-valued activations, gates >= 128 (exp(-g) is 0 in float32) and
    power-of-two weights: every GEMM and the SwiGLU are exact in float32, so both models give the
    same stage outputs; the combine (slot outputs over 40 binades, sums near bf16 midpoints) is
    the only place the old rule (bf16 of the exact sum) would differ, and now both models run
    DeepGEMM's float32 order.  What still separates them elsewhere: the GEMMs' float32 block
    sums and SwiGLU's float32 operations (expf, division, two products)."""
    rng = np.random.default_rng(113)
    p = Problem(2, 4, 8, 3, 128, 128, seed=113)
    for r in range(p.R):
        p.x[r] = rng.integers(1, 3, (p.N[r], p.H)).astype(BF16)
        p.w[r] = rng.choice(np.array([1.0, -1.0, 0.5, -0.5], np.float32), p.w[r].shape)
    w1 = np.zeros((p.E, 2 * p.I, p.H), np.float32)
    w1[:, : p.I] = 1.0  # gate = sum of x in [128, 256]
    w1[:, p.I:] = rng.choice(np.array([-1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]), (p.E, p.I, p.H))
    p.w1_bf16 = w1.astype(BF16)
    w2 = rng.choice(np.array([-1.0, 0.0, 1.0], np.float32), (p.E, p.H, p.I))
    w2 *= np.array([1.0, 2.0**-30, 1.0, 2.0**10], np.float32)[:, None, None]
    p.w2_bf16 = w2.astype(BF16)
    runs = {}
    for acc_model in ("exact", "fp32"):
        with dg.numerics(arch="sm100", accumulation=acc_model), trace.capture() as cap:
            ys, _, _ = run_cuda(p, clamp=None, bf16=True)
        runs[acc_model] = (ys, cap.records)
    (y_e, rec_e), (y_f, rec_f) = runs["exact"], runs["fp32"]
    for r in range(p.R):
        for key in ("l1.output", "swiglu.output", "l2.output", "combine.input"):
            assert rec_e[r].extra[key].tobytes() == rec_f[r].extra[key].tobytes(), (r, key)
        assert _bits(y_e[r]).tobytes() == _bits(y_f[r]).tobytes(), r
    terms = [rec.extra["combine.input"].astype(np.float64) for rec in rec_e]
    assert _span_binades(terms) > 24
    old = [_bf16_of_exact_sum(t) for t in terms]
    assert any(np.any(o != y.astype(np.float64)) for o, y in zip(old, y_e, strict=True))


def test_checker_bounds_around_the_float32_sum_cover_other_orders():
    """A device that adds the same slot outputs in another float32 order (reversed, pairwise), or
    exactly, lands inside the checker's probabilistic interval around acc = F with the case's
    n = J and u_acc = 2^-8 and the recorded S."""
    terms = _terms_near_midpoints(np.random.default_rng(7), 6, 4, 16)
    y, rec = _combine_stage(terms)
    check = {"n": 4, "u_acc": 2.0**-8, "epilogue": {"out": "bf16", "alpha": None, "c": None, "c_mode": "kernel"},
             "c_epi": 0}
    golden = {"main": y.astype(BF16), "acc": rec.acc, "S": rec.S}
    t32 = terms.astype(np.float32)
    reversed_ = np.zeros(y.shape, np.float32)
    for k in reversed(range(4)):
        reversed_ = np.add(reversed_, t32[:, k], dtype=np.float32)
    pairwise = np.add(np.add(t32[:, 0], t32[:, 1], dtype=np.float32), np.add(t32[:, 2], t32[:, 3], dtype=np.float32),
                      dtype=np.float32)
    devices = {"reversed": _bf16_rne(reversed_.astype(np.float64)), "pairwise": _bf16_rne(pairwise.astype(np.float64)),
               "exact": _bf16_of_exact_sum(terms)}
    assert any(np.any(d != y) for d in devices.values())  # some device differs from the golden
    for i in range(y.shape[0]):
        for c in range(y.shape[1]):
            lo, hi = element_bounds(golden, check, {}, CheckOptions(), (i, c))["pass"]
            for name, dev in devices.items():
                assert lo <= dev[i, c] <= hi, (name, i, c)


# ---------------------------------------------------------------------------------------------
# TileLang's op in deepgemm_ref.mega.stages
# ---------------------------------------------------------------------------------------------

def test_stages_module_exposes_the_baseline_ops():
    assert stages.swiglu_apply_weight_to_fp8 is mega.swiglu_apply_weight_to_fp8
    for name in ("mega_moe_dispatch", "mega_moe_grouped_gemm", "mega_moe_combine", "MegaMoEDispatch"):
        assert getattr(stages, name) is getattr(mega, name)
    params = inspect.signature(stages.swiglu_apply_weight_to_fp8).parameters
    # TileLang's parameter order and defaults, then this package's keyword
    assert [(n, p.default) for n, p in params.items()] == [
        ("x", inspect.Parameter.empty), ("topk_weights", inspect.Parameter.empty),
        ("avail_tokens", inspect.Parameter.empty), ("num_per_channels", inspect.Parameter.empty),
        ("use_col_major_scales", inspect.Parameter.empty), ("round_scale", inspect.Parameter.empty),
        ("ue8m0_scale", inspect.Parameter.empty), ("clamp_value", None), ("fmt", "e4m3"), ("num_sms", None),
        ("output_bf16", False), ("fast_math", True), ("semantics", "fused")]
    assert params["semantics"].kind is inspect.Parameter.KEYWORD_ONLY


def test_swiglu_op_after_an_expand_dispatch():
    """One rank's op as DeepGEMM's test calls it: rows below avail_tokens = psum[-1] follow the data
    flow (checked per valid row against the reference written from its sentences), rows from
    avail_tokens on are zero, the scales are TMA-aligned MN-major packed UE8M0, and the alignment
    padding rows inside [0, psum[-1]) differ between the semantics only in their SF byte (the fused
    kernel's 0 against the op's floored 105), which the L2 GEMM never reads."""
    p = Problem(2, 4, 6, 2, 512, 512, seed=127)
    recv = dispatch(p, False, 128)
    d = recv[0]
    rows = d.x.shape[0]
    e_l = p.E // p.R
    l1 = np.zeros((rows, 2 * p.I), BF16)
    w1 = (p.w1q[:e_l], p.w1sf[:e_l])
    l1[...] = mega.mega_moe_grouped_gemm((d.x, d.x_sf), w1, d.psum, 128)
    out = {}
    for semantics in ("fused", "baseline"):
        out[semantics] = stages.swiglu_apply_weight_to_fp8(
            x=l1, topk_weights=d.weights, avail_tokens=d.psum[-1], num_per_channels=32, use_col_major_scales=True,
            round_scale=True, ue8m0_scale=True, output_bf16=False, clamp_value=7.5, fast_math=True,
            semantics=semantics)
    avail = int(d.psum[-1])
    assert avail < rows
    for semantics, target in (("fused", "deepgemm"), ("baseline", "tilelang")):
        y, sf = out[semantics]
        assert y.shape == (rows, p.I) and sf.dtype == np.int32 and sf.shape == (rows, p.I // 128)
        assert sf.strides == (4, 4 * (-(-rows // 4) * 4))  # (1, align(M, 4)) int32 elements
        sf_bytes = np.ascontiguousarray(sf).view(np.uint8).reshape(rows, p.I // 32)
        assert not y.view(np.uint8)[avail:].any() and not sf_bytes[avail:].any()
        for i in np.flatnonzero(d.src[:avail, 0] >= 0)[::7]:
            g = np.minimum(l1[i, : p.I].astype(np.float64), 7.5)  # 7.5 is a bf16 value: both clamps agree
            u = np.clip(l1[i, p.I:].astype(np.float64), -7.5, 7.5)
            v = _swiglu_ref(g, u, float(d.weights[i]))
            q, sc = _requant_ref(v, target)
            assert np.array_equal(y[i].astype(np.float64), q), (semantics, i)
            assert np.array_equal(sf_bytes[i], (np.log2(sc) + 127).astype(np.uint8)), (semantics, i)
    pad = np.flatnonzero(d.src[:avail, 0] < 0)
    assert pad.size
    fused_b = np.ascontiguousarray(out["fused"][1]).view(np.uint8).reshape(rows, -1)
    base_b = np.ascontiguousarray(out["baseline"][1]).view(np.uint8).reshape(rows, -1)
    assert np.all(fused_b[pad] == 0) and np.all(base_b[pad] == 105)
    valid = d.src[:, 0] >= 0
    assert np.array_equal(fused_b[valid], base_b[valid])
    assert out["fused"][0].tobytes() == out["baseline"][0].tobytes()


@pytest.mark.torch
def test_swiglu_op_takes_torch_tensors_and_a_0d_avail_tokens():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(131)
    x = rng.standard_normal((10, 128)).astype(BF16)
    w = rng.standard_normal(10).astype(np.float32)
    want = stages.swiglu_apply_weight_to_fp8(x, w, 7, 32, True, True, True, clamp_value=10.0)
    xt = torch.from_numpy(x.view(np.int16)).view(torch.bfloat16)
    got = stages.swiglu_apply_weight_to_fp8(x=xt, topk_weights=torch.from_numpy(w),
                                            avail_tokens=torch.tensor([3, 7], dtype=torch.int32)[-1],
                                            num_per_channels=32, use_col_major_scales=True, round_scale=True,
                                            ue8m0_scale=True, clamp_value=10.0)
    assert isinstance(got[0], torch.Tensor) and got[0].dtype == torch.float8_e4m3fn
    assert got[0].view(torch.uint8).numpy().tobytes() == want[0].view(np.uint8).tobytes()
    assert np.array_equal(got[1].numpy(), want[1])


@pytest.mark.parametrize("bf16", [False, True])
def test_deepep_dispatch_gemms_swiglu_combine_equal_the_fused_kernel(bf16):
    """DeepGEMM's check, with this package's DeepEP: ElasticBuffer dispatch + grouped GEMM + SwiGLU
    + grouped GEMM + ElasticBuffer combine (allow_multiple_reduction=False) give the fused kernel's
    y bit for bit, on random inputs and on slot outputs spanning more than 24 binades."""
    h = 256 if bf16 else 512
    wide = _wide_range(Problem(2, 4, 8, 3, h, h, seed=107), {1: 26, 3: 26})
    for p in (Problem(4, 16, 5, 4, h, 512, seed=202, masked_ratio=0.15), wide):
        want = run_cuda(p, clamp=10.0, bf16=bf16)[0]
        got = deepep_baseline(p, bf16, clamp=10.0, semantics="baseline")
        for r in range(p.R):
            assert _bits(got[r]).tobytes() == _bits(want[r]).tobytes(), (bf16, r)
    _, recv, l2 = baseline(wide, bf16=bf16, clamp=10.0, semantics="baseline")
    assert _span_binades(slot_terms(wide, recv, l2)) > 24  # the float32 order decides roundings
