"""DeepGEMM-Ascend's GEMM test flow, as a client runs it, on the CPU (``testing.npu_shim``).

The flow of DeepGEMM-Ascend's ``tests/common.py`` and ``tests/test_m_grouped_padding.py``, in this
repository's own words: ``import deep_gemm`` (this package), operand generators that quantise bf16
randn to FP8 / FP4 with per-32 UE8M0 scales and keep the dequantised reference, every kernel
first compiled from ``device='meta'`` tensors inside ``par_compile``, then run on ``'npu'``
tensors (the CPU here) and compared with ``calc_diff`` below 1e-5 against ``a_ref @ b_ref^T`` of
the quantised operands, profiled with ``bench_msprof(..., kernel_names='gemm_impl')``.  The full
sweep is ``slow``; the default run takes one case of each kind.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import partial

import pytest

from . import ascend_flows
from .ascend_flows import calc_diff, meta
from .ascend_flows import deep_gemm as _dg

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch
npu = ascend_flows.npu  # the autouse fixture: torch.npu on the CPU for every test here

THRESHOLD = 1e-5  # DeepGEMM-Ascend's GEMM tolerance (calc_diff against the quantised reference)





# ---------------------------------------------------------------------------------------------
# operand generators: quantised operand, its exact dequantised value, and a meta twin
# ---------------------------------------------------------------------------------------------


def operand(mn: int, k: int, kind: str, major: str, seed: int, groups: int | None = None):
    """(operand for the kernel, float32 reference (G?, mn, k)) of a bf16 randn matrix.

    kind: 'bf16', 'fp8' (E4M3) or 'fp4' (int8 packed E2M1, tagged float4_e2m1fn_x2 by DeepGEMM-Ascend);
    FP8 / FP4 carry float32 power-of-two scales per 32 K elements.  major 'MN' stores the matrix
    transposed (stride(-2) == 1); FP4 stays K-major.
    """
    dg = _dg()
    g = torch.Generator().manual_seed(seed)
    shape = (groups, mn, k) if groups else (mn, k)
    x = torch.randn(shape, generator=g, dtype=torch.float32).to(torch.bfloat16)
    if kind == "bf16":
        data, ref = x, x.float()
        sf = None
    else:
        flat = x.reshape(-1, k)
        if kind == "fp8":
            q, s = dg.per_token_cast_to_fp8(flat, use_ue8m0=True, gran_k=32)
            ref = (q.float().reshape(-1, k // 32, 32) * s.reshape(-1, k // 32, 1)).reshape(shape)
        else:
            q, s = dg.per_token_cast_to_fp4(flat, use_ue8m0=True, gran_k=32)
            ref = dg.cast_back_from_fp4(q, s, gran_k=32).reshape(shape)
        data = q.reshape(*shape[:-1], q.shape[-1])
        sf = s.reshape(*shape[:-1], s.shape[-1])
    if major == "MN" and kind != "fp4":
        data = data.transpose(-1, -2).contiguous().transpose(-1, -2)
        if sf is not None:
            sf = sf.transpose(-1, -2).contiguous().transpose(-1, -2)
    return (data if sf is None else (data, sf)), ref


def _t(x, d0, d1):
    if isinstance(x, tuple):
        return tuple(v.transpose(d0, d1) for v in x)
    return x.transpose(d0, d1)


# ---------------------------------------------------------------------------------------------
# the test descriptions
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Gemm:
    kind: str  # "normal", "m_grouped", "k_grouped"
    a: str
    b: str
    m: int
    n: int
    k: int
    cd: torch.dtype
    layout: str = "nt"
    accumulate: bool = False
    alpha: float | None = None
    groups: int = 3

    @property
    def has_sf(self) -> bool:
        return self.a != "bf16"


def generate(t: Gemm, device: str = "npu"):
    """(a, b, c, d_ref, grouped_layout, spans): the operands and the reference on ``device``."""
    g = torch.Generator().manual_seed(hash(t) % 2**31)
    if t.kind == "normal":
        a, a_ref = operand(t.m, t.k, t.a, "K" if t.layout[0] == "n" else "MN", 1)
        b, b_ref = operand(t.n, t.k, t.b, "K" if t.layout[1] == "t" else "MN", 2)
        c = torch.randn((t.m, t.n), generator=g).to(t.cd) if t.accumulate else None
        ref = a_ref @ b_ref.T
        layout, spans = None, [slice(0, t.m)]
    elif t.kind == "m_grouped":
        sizes = [t.m // 2, 0, t.m - t.m // 2][:t.groups]
        ends, start, spans = [], 0, []
        for s in sizes:
            spans.append(slice(start, start + s))
            ends.append(start + s)
            start = -(-(start + s) // 256) * 256
        total = -(-ends[-1] // 256) * 256
        a, a_ref = operand(total, t.k, t.a, "K", 3)
        b, b_ref = operand(t.n, t.k, t.b, "K", 4, groups=t.groups)
        ref = torch.zeros((total, t.n))
        for gi, span in enumerate(spans):
            ref[span] = a_ref[span] @ b_ref[gi].T
        layout, c = torch.tensor(ends, dtype=torch.int32), None
    else:  # k-grouped, tn: a (K_total, M), b (K_total, N), d (G, M, N) with c
        sizes = [t.k, 0, t.k // 2][:t.groups]
        ends, start, ranges = [], 0, []
        for s in sizes:
            ranges.append((start, start + s))
            ends.append(start + s)
            start = -(-(start + s) // 256) * 256
        total = -(-ends[-1] // 256) * 256
        a, a_ref = operand(t.m, total, t.a, "MN", 5)  # stored (K_total, M) row-major
        b, b_ref = operand(t.n, total, t.b, "MN", 6)
        a, b = _t(a, 0, 1), _t(b, 0, 1)  # the operands are given K first
        c = torch.randn((t.groups, t.m, t.n), generator=g).to(t.cd)
        ref = torch.stack([a_ref[:, lo:hi] @ b_ref[:, lo:hi].T for lo, hi in ranges])
        layout, spans = torch.tensor(ends, dtype=torch.int32), [slice(0, t.groups)]
    if t.alpha is not None:
        ref = ref * t.alpha
    if c is not None:
        ref = ref + c.float()
    out = (a, b, c, ref.to(t.cd), layout, spans)
    if device == "meta":
        return tuple(meta(v) if not isinstance(v, list) else v for v in out)
    return tuple(v.to(device) if isinstance(v, torch.Tensor) else v for v in out)


def run(t: Gemm, a, b, c, d, layout):
    """One call as DeepGEMM-Ascend's tests make it (c accumulates into d: d.copy_(c) first)."""
    dg = _dg()
    name = "fp8_fp4" if t.has_sf else "bf16"
    kw = {}
    if t.accumulate or t.kind == "k_grouped":
        d.copy_(c)
        kw["c"] = d
    if t.kind == "normal":
        a = a if t.layout[0] == "n" else _t(a, 0, 1)
        b = b if t.layout[1] == "t" else _t(b, 0, 1)
        getattr(dg, f"{name}_gemm_{t.layout}")(a, b, d, alpha=t.alpha, **kw)
    elif t.kind == "m_grouped":
        getattr(dg, f"m_grouped_{name}_gemm_nt_contiguous")(a, b, d, layout)
    else:
        getattr(dg, f"k_grouped_{'fp8' if t.has_sf else 'bf16'}_gemm_tn_contiguous")(a, b, d, None, layout, **kw)


PAIRS = [("bf16", "bf16"), ("fp8", "fp8"), ("fp4", "fp4"), ("fp8", "fp4")]
SHAPES = [(128, 96, 256), (257, 64, 160)]  # aligned, and unaligned M / N / K


def _all_tests() -> list[Gemm]:
    out = []
    for (a, b), (m, n, k), cd in itertools.product(PAIRS, SHAPES, (torch.bfloat16, torch.float32)):
        layouts = ("nt",) if "fp4" in (a, b) else ("nt", "nn", "tn", "tt")
        for layout, acc, alpha in itertools.product(layouts, (False, True), (None, 0.625)):
            out.append(Gemm("normal", a, b, m, n, k, cd, layout, acc, alpha))
        out.append(Gemm("m_grouped", a, b, m, n, k, cd))
        if (a, b) in (("bf16", "bf16"), ("fp8", "fp8")):
            out.append(Gemm("k_grouped", a, b, m, n, k, torch.float32))
    return out


ALL = _all_tests()
QUICK = [Gemm("normal", "fp8", "fp8", 257, 64, 160, torch.bfloat16, "tn", True, 0.625),
         Gemm("normal", "fp4", "fp4", 128, 96, 256, torch.float32),
         Gemm("normal", "fp8", "fp4", 257, 64, 160, torch.float32, "nt", True),
         Gemm("normal", "bf16", "bf16", 128, 96, 256, torch.bfloat16, "nn"),
         Gemm("m_grouped", "fp8", "fp4", 257, 64, 160, torch.bfloat16),
         Gemm("k_grouped", "fp8", "fp8", 128, 96, 256, torch.float32)]


def _flow(tests: list[Gemm], npu) -> None:
    from deep_gemm.testing.bench import bench_msprof
    from deep_gemm.testing.par_compile import par_compile

    kernels = []
    for t in tests:  # compile from metadata: no storage, nothing computed
        a, b, c, d_ref, layout, _ = generate(t, device="meta")
        kernels.append(partial(run, t, a, b, c, torch.empty_like(d_ref), layout))
    par_compile(kernels)
    npu.empty_cache()
    for t in tests:
        a, b, c, d_ref, layout, spans = generate(t)
        d = torch.randn_like(d_ref)
        run(t, a, b, c, d, layout)
        npu.synchronize()
        for span in spans:
            diff = calc_diff(d[span], d_ref[span])
            assert diff < THRESHOLD, (t, span, diff)
    t = tests[0]
    a, b, c, d_ref, layout, _ = generate(t)
    d = torch.empty_like(d_ref)
    prof = bench_msprof(lambda: run(t, a, b, c, d, layout), kernel_names="gemm_impl", num_warmups=1, num_tests=2)
    flops = 2.0 * t.m * t.n * t.k
    assert prof.dur_us > 0 and prof.tflops(flops) > 0 and prof.gbps(flops) > 0


def test_gemm_flow_one_case_of_each_kind(npu):
    _flow(QUICK, npu)


@pytest.mark.slow
def test_gemm_flow_full_sweep(npu):
    _flow(ALL, npu)


def test_aclnn_reference_gemms_agree(npu):
    """common.py's ACLNN cross-check: aclnn_fp8_fp4_gemm_nt and aclnn_bf16_gemm_nt against the same reference."""
    dg = _dg()
    for a_kind in ("fp8", "bf16"):
        t = Gemm("normal", a_kind, a_kind, 128, 96, 256, torch.bfloat16)
        a, b, _, d_ref, _, _ = generate(t)
        d = torch.randn_like(d_ref)
        if a_kind == "fp8":
            dg.aclnn_fp8_fp4_gemm_nt(a, b, d, None, recipe_a=(1, 32), recipe_b=(1, 32))
        else:
            dg.aclnn_bf16_gemm_nt(a, b, d, None)
        npu.synchronize()
        assert calc_diff(d, d_ref) < THRESHOLD


@pytest.mark.parametrize("kind", ["bf16", "fp8", "fp4"])
def test_m_grouped_padding_flow(kind, npu):
    """test_m_grouped_padding's flow: a dry run leaves d untouched; the real run matches the reference
    on every group's rows, and with ensure_zero_padding the padding rows are +0 (the A rows there are 0)."""
    from deep_gemm.testing.par_compile import dry_run

    dg = _dg()
    spans = [slice(0, 1), slice(256, 556), slice(768, 768)]
    padding = [slice(1, 256), slice(556, 768)]
    layout = torch.tensor([1, 556, 768], dtype=torch.int32, device="npu")
    a, a_ref = operand(768, 128, kind, "K", 7)
    b, b_ref = operand(64, 128, kind, "K", 8, groups=3)
    a_data = a[0] if isinstance(a, tuple) else a
    for span in padding:  # zero operand rows (packed FP4: zero bytes are +0 codes) and their reference
        a_data[span] = 0
        a_ref[span] = 0
    name = "bf16" if kind == "bf16" else "fp8_fp4"
    fn = getattr(dg, f"m_grouped_{name}_gemm_nt_contiguous")
    for cd in (torch.bfloat16, torch.float32):
        ref = torch.zeros((768, 64), dtype=cd, device="npu")
        for gi, span in enumerate(spans):
            ref[span] = (a_ref[span].float() @ b_ref[gi].float().T).to(cd)
        d = torch.full_like(ref, 7)
        with dry_run():
            fn(a, b, d, layout, ensure_zero_padding=True)
        assert torch.all(d == 7).item(), "dry run changed D"
        fn(a, b, d, layout, ensure_zero_padding=True)
        npu.synchronize()
        for span in spans:
            if span.stop > span.start:
                assert calc_diff(d[span], ref[span]) < THRESHOLD
        for span in padding:
            assert torch.all(d[span] == 0).item(), f"padding rows {span}"
