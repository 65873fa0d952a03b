"""Einsum-style batched GEMMs (``einsum``, ``fp8_einsum``) and the hyper-connection prenorm GEMM.

Every function is DeepGEMM's (or, under ``ascend950``, DeepGEMM-Ascend's) public function of the
same name and signature; outputs are written in place, ``None`` is returned.  The expressions are
batched GEMMs ``D[batch] = epilogue(A[batch] @ B[batch]^T)``: each batch is one
:func:`core.scaled_matmul` call.  The accumulator follows the active
accumulation model (``exact`` by default: one rounding of the exact sum, where the device may
add partial sums in float32 atomics).

Accepted expressions
--------------------
================  =========================  ===================  ======================
expression        DeepGEMM einsum (bf16)     DeepGEMM fp8_einsum  DeepGEMM-Ascend (both)
================  =========================  ===================  ======================
'bmk,bnk->mn'     yes (c as in bf16 GEMMs)   no                   no
'bhr,hdr->bhd'    yes (no c)                 sm90 and sm100       yes (+ FP8 output)
'bhd,hdr->bhr'    yes (no c)                 sm100                yes
'bhd,bhr->hdr'    no                         sm100                yes
================  =========================  ===================  ======================

``tf32_hc_prenorm_gemm``: ``d = a_f32 @ conv(b)^T`` and ``sqr_sum = sum_k a_f32^2``, each the
exact sum over its K split rounded once to float32.  ``conv`` is the tensor core's reading of the
float32 ``b``:

* DeepGEMM (sm90, sm100): TF32, the 13 low mantissa bits dropped (truncation toward zero: the
  tensor core ignores them when it reads float32 operands from memory), :func:`tf32_truncate`;
* DeepGEMM-Ascend: HF32 with round-to-nearest-even (DeepGEMM-Ascend's sources say "rounded to
  HF32 nearest-even" and do not give the width).  We take HF32 as float32 with
  :data:`HF32_MANTISSA_BITS` = 11 stored mantissa bits, CANN's documented HF32 precision
  ("HF32 shares the same value range with float32, but its mantissa precision (11 bits) is
  close to FP16 (10 bits)": CANN ENABLE_HF32_EXECUTION), :func:`hf32_round`.

Every function reads check -> tasks -> execute: a ``_check_*`` step validates the call for the
profile the dispatcher hands it and returns a request (:class:`BatchedRequest`,
:class:`PrenormRequest`), :func:`_batched_tasks` / :func:`_contraction_tasks` /
:func:`_prenorm_tasks` state the math as executor tasks, and
:func:`~deepgemm_ref.executor.execute` runs them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import core
from . import formats as fm
from .api import profiled
from .epilogue import FP8Quantization
from .errors import arg_error
from .executor import Collected, Fill, Request, Task, execute
from .interop import to_numpy
from .profiles import Profile
from .toolkit.args import BF16, E4M3, F32, I16, as_array, as_pair, elem_stride
from .toolkit.operands import OUT_DTYPES, OUT_FORMAT, alpha_of, ascend_recipes, cuda_recipes, resolve_scales
from .toolkit.outputs import check_written, resolve_c
from .toolkit.sizes import check_matmul

__all__ = ["einsum", "fp8_einsum", "tf32_hc_prenorm_gemm", "tf32_truncate", "hf32_round",
           "TF32_DROPPED_BITS", "HF32_MANTISSA_BITS"]


#: float32 mantissa bits the CUDA tensor core ignores when it reads float32 as TF32 (23 - 10).
TF32_DROPPED_BITS = 13
#: Stored mantissa bits of Ascend's HF32 (CANN: "mantissa precision (11 bits)").
# Note: the port says "rounded to HF32 nearest-even" without the width; 11 stored bits is
# CANN's documented HF32 precision, not verified on the device.
HF32_MANTISSA_BITS = 11


# ----------------------------------------------------------------------------------------------
# TF32 / HF32 readings of float32
# ----------------------------------------------------------------------------------------------

def _f32_bits(x: Any, func: str) -> np.ndarray:
    a = np.asarray(x)
    if a.dtype != F32:
        raise arg_error(func, "x", "a float32 array", a)
    return np.ascontiguousarray(a).view(np.uint32)


def _keep_nan(bits: np.ndarray, out: np.ndarray) -> np.ndarray:
    """NaN inputs stay NaN (canonical quiet NaN with the input's sign) instead of turning into inf."""
    nan = ((bits & np.uint32(0x7F800000)) == np.uint32(0x7F800000)) & ((bits & np.uint32(0x007FFFFF)) != 0)
    if nan.any():
        out = np.where(nan, (bits & np.uint32(0x80000000)) | np.uint32(0x7FC00000), out)
    return out


def tf32_truncate(x: Any) -> np.ndarray:
    """float32 -> float32 holding its TF32 reading: the 13 low mantissa bits cleared.

    x: float32 array, any shape.  Truncation toward zero of the significand (the tensor core
    ignores those bits when it reads float32 operands from memory).  Subnormals
    are truncated at the same bit position; +-inf unchanged; NaN stays NaN.
    """
    bits = _f32_bits(x, "tf32_truncate")
    mask = np.uint32((0xFFFFFFFF << TF32_DROPPED_BITS) & 0xFFFFFFFF)
    out = _keep_nan(bits, bits & mask)
    return out.view(np.float32).reshape(np.shape(x))


def hf32_round(x: Any) -> np.ndarray:
    """float32 -> float32 holding its HF32 value: round to nearest, ties to even, at 11 mantissa bits.

    x: float32 array, any shape.  The float32 significand is rounded to ``HF32_MANTISSA_BITS``
    stored bits (the 12 low bits become zero), a carry propagating into the exponent; values
    beyond the largest HF32 number round to +-inf (IEEE overflow), subnormals are rounded at the
    same bit position, NaN stays NaN.
    """
    bits = _f32_bits(x, "hf32_round")
    drop = 23 - HF32_MANTISSA_BITS
    half = np.uint32((1 << (drop - 1)) - 1)
    lsb = (bits >> np.uint32(drop)) & np.uint32(1)
    rounded = (bits + half + lsb) & np.uint32((0xFFFFFFFF << drop) & 0xFFFFFFFF)
    out = _keep_nan(bits, rounded)
    return out.view(np.float32).reshape(np.shape(x))


# ----------------------------------------------------------------------------------------------
# batched helpers
# ----------------------------------------------------------------------------------------------

_EXPRS_CUDA = ("bmk,bnk->mn", "bhr,hdr->bhd", "bhd,hdr->bhr")
_EXPRS_BATCHED = ("bhr,hdr->bhd", "bhd,hdr->bhr", "bhd,bhr->hdr")


def _inner_stride_ok(x: np.ndarray) -> bool:
    """stride(-1) == 1 or stride(-2) == 1 (a K-major or MN-major batched operand)."""
    if x.size == 0:
        return True
    return elem_stride(x, -1) == 1 or elem_stride(x, -2) == 1 or x.shape[-1] == 1 or x.shape[-2] == 1


def _row_major_last(x: np.ndarray) -> bool:
    return x.size == 0 or x.shape[-1] == 1 or elem_stride(x, -1) == 1


def _permutation(func: str, expr: str, accepted: tuple[str, ...]) -> tuple[tuple[int, ...], tuple[int, ...],
                                                                           tuple[int, ...] | None]:
    """(perm of a, perm of b, perm of d or None when d is not permuted) turning expr into a bmm
    (batch, M, N, K); the batch index of d is then d.transpose(perm_d)[batch]."""
    if expr not in accepted:
        raise arg_error(func, "expr", "one of " + ", ".join(repr(e) for e in accepted),
                        f"{expr!r} (Unsupported einsum expression)")
    return {
        "bhr,hdr->bhd": ((1, 0, 2), (0, 1, 2), (1, 0, 2)),
        "bhd,hdr->bhr": ((1, 0, 2), (0, 2, 1), (1, 0, 2)),
        "bhd,bhr->hdr": ((1, 2, 0), (1, 2, 0), None),
    }[expr]


def _batch_index(perm_d: tuple[int, ...] | None, g: int) -> tuple[Any, ...]:
    """Where batch g of the bmm lives in the caller's d."""
    if perm_d is None:
        return (g,)
    return (slice(None), g)  # both permuted expressions move d's head axis (1) to the front


def _permuted(x: np.ndarray, func: str, arg: str, perm: tuple[int, ...]) -> np.ndarray:
    if x.ndim != 3:
        raise arg_error(func, arg, "a 3-D array", x)
    return x.transpose(perm)


def _bmm_shapes(func: str, a3: np.ndarray, b3: np.ndarray, d3: np.ndarray) -> tuple[int, int, int, int]:
    batch, m, k = a3.shape
    if b3.shape[0] != batch or b3.shape[2] != k or d3.shape != (batch, m, b3.shape[1]):
        raise arg_error(func, "b", "operand shapes of one batched GEMM (batch, M, K) x (batch, N, K) -> "
                        f"(batch, M, N); a gives (batch, M, K) = {a3.shape}", f"b -> {b3.shape}, d -> {d3.shape}")
    return batch, m, b3.shape[1], k


# ----------------------------------------------------------------------------------------------
# the request and its tasks
# ----------------------------------------------------------------------------------------------

@dataclass(kw_only=True)
class BatchedRequest(Request):
    """A validated batched GEMM: ``d[idx(g)] = out(alpha * A_s[g] @ B_s[g]^T ; c[idx(g)])``.

    a, b:    (batch, M, K) and (batch, N, K) views of the operands (the expression's permutation).
    scales:  float64 (batch, MN, ceil(K / gran_k)) scales of A and B (None: unscaled bf16).
    perm_d:  how d's axes map to (batch, M, N) (None: d is not permuted).
    contraction: 'bmk,bnk->mn': one GEMM over the whole (s, k) contraction into a 2-D d.
    out, alpha, c: the output format, DeepGEMM-Ascend's alpha and the snapshot of c (d-shaped).
    sfd:     DeepGEMM-Ascend's FP8 output scales (int16), or None.
    """

    a: np.ndarray
    b: np.ndarray
    scales: tuple[np.ndarray | None, np.ndarray | None] = (None, None)
    gran_k: tuple[int, int] = (0, 0)
    perm_d: tuple[int, ...] | None
    contraction: bool = False
    out: fm.Format
    alpha: float | None = None
    c: np.ndarray | None = None
    sfd: np.ndarray | None = None


def _batched_tasks(req: BatchedRequest) -> list[Task | Fill]:
    """For every batch g: d[idx(g)] = out(alpha * sum_k A[g, m, k] sa[g, m, k // gka]
    B[g, n, k] sb[g, n, k // gkb] ; c[idx(g)]); FP8 output: the bf16 result quantised per 32
    columns (:func:`_fp8_quantize_rows`).  An empty batch, M or N computes nothing; an empty K
    writes c or +0.0 (and zero FP8 scales)."""
    batch, m, k = req.a.shape
    n = req.b.shape[1]
    if batch == 0 or m == 0 or n == 0:
        return []
    if k == 0:
        fills: list[Task | Fill] = []
        if req.sfd is not None:
            fills.append(Fill((...,), 0, into=req.sfd, label="empty K: sfd = 0"))
        if req.c is not None:
            fills.append(Fill((slice(None),), req.c, label="empty K: d = c"))
        return fills  # without c, the request's zero rows clear d
    sa, sb = req.scales
    tasks: list[Task | Fill] = []
    for g in range(batch):
        idx = _batch_index(req.perm_d, g)
        a = core.Operand(req.a[g], None if sa is None else sa[g], req.gran_k[0])
        b = core.Operand(req.b[g], None if sb is None else sb[g], req.gran_k[1])
        if req.sfd is None:
            tasks.append(Task(a, b, core.OutputStage(req.out, req.alpha, None if req.c is None else req.c[idx]), idx))
        else:
            tasks.append(Task(a, b, core.OutputStage(fm.BF16), idx, _fp8_sink(req.d, req.sfd, idx, g, n),
                              label="matmul, FP8 quantisation"))
    return tasks


def _contraction_tasks(req: BatchedRequest) -> list[Task | Fill]:
    """'bmk,bnk->mn': d = out(sum_s A[s] @ B[s]^T ; c), one GEMM over the (s, k) contraction
    (float32 d accumulates into itself, c = d)."""
    s, m, k = req.a.shape
    n = req.b.shape[1]
    if m == 0 or n == 0 or s * k == 0:
        return []  # an empty contraction: the request's zero rows (bf16 d) or d = c itself (float32)
    a2 = np.ascontiguousarray(req.a.transpose(1, 0, 2)).reshape(m, s * k)
    b2 = np.ascontiguousarray(req.b.transpose(1, 0, 2)).reshape(n, s * k)
    # A bf16 d is written through DeepGEMM's zeroed float32 workspace (csrc/apis/einsum.hpp:
    # ``bmk_bnk_mn(a, b, workspace, workspace); d.copy_(workspace)``): d = bf16(f32(+0 + acc)).
    via = fm.F32 if req.out is fm.BF16 else None
    return [Task(core.Operand(a2), core.Operand(b2), core.OutputStage(req.out, None, req.c, via=via), (slice(None),))]


def _launch(req: BatchedRequest) -> None:
    execute(req, _contraction_tasks(req) if req.contraction else _batched_tasks(req))


def _empty_k_rows(d: np.ndarray, k: int, c: np.ndarray | None) -> np.ndarray | None:
    """The rows an empty K clears: all of d without c (early_return: d := 0), none otherwise."""
    return np.ones(d.shape[0], bool) if k == 0 and c is None else None


# ----------------------------------------------------------------------------------------------
# einsum (bf16)
# ----------------------------------------------------------------------------------------------

def _check_bmk_bnk_mn(profile: Profile, func: str, A: np.ndarray, B: np.ndarray, D: np.ndarray,
                      c: Any) -> BatchedRequest:
    """'bmk,bnk->mn': D (+)= sum_s A[s] @ B[s]^T over the whole (s, k) contraction."""
    if D.dtype == F32:
        same = c is not None and resolve_c(c, D, func)[1]
        if not same:
            raise arg_error(func, "c", "d itself for a float32 d (the kernel accumulates into d)",
                            "None" if c is None else "a separate array")
    elif c is not None:
        raise arg_error(func, "c", "None for a bfloat16 d", "an array")
    for name, x in (("a", A), ("b", B)):
        if x.ndim != 3 or not x.flags.c_contiguous:
            raise arg_error(func, name, "a contiguous 3-D array", x)
    if D.ndim != 2 or (D.dtype == F32 and not D.flags.c_contiguous):
        raise arg_error(func, "d", "a 2-D array (contiguous when float32)", D)
    s, m, k = A.shape
    if B.shape[0] != s or B.shape[2] != k or D.shape != (m, B.shape[1]):
        raise arg_error(func, "b", f"b (S, N, K) with S = {s}, K = {k} and d (M, N) with M = {m}",
                        f"b {B.shape}, d {D.shape}")
    n = B.shape[1]
    check_written(D, func, "d", inputs=(("a", A), ("b", B)))
    check_matmul(func, "a", m, n, s * k)
    f32 = D.dtype == F32
    zero = np.ones(m, bool) if m and n and s * k == 0 and not f32 else None
    return BatchedRequest(func=func, profile=profile, d=D, zero=zero, a=A, b=B, perm_d=None, contraction=True,
                          out=fm.F32 if f32 else fm.BF16, c=np.array(D, copy=True) if f32 and m and n else None)


def _einsum_cuda(profile: Profile, /, expr: str, a: Any, b: Any, d: Any, c: Any = None,
                 use_cublaslt: bool = False) -> None:
    """DeepGEMM's bf16 einsum.

    'bmk,bnk->mn': a (S, M, K), b (S, N, K) bfloat16 contiguous; d (M, N): float32 with c = d
    (d += sum_s a[s] @ b[s]^T, one float32 rounding) or bfloat16 with c None (the sum rounded to
    float32 in DeepGEMM's workspace, then to bf16: d = bf16(f32(sum))); use_cublaslt must be False.
    'bhr,hdr->bhd': a (B, H, R), b (H, D, R), d (B, H, D) bfloat16, stride(-1) == 1 for all;
    d[b, h] = bf16(a[b, h] @ b[h]^T).  'bhd,hdr->bhr': a (B, H, D), b (H, D, R), d (B, H, R);
    d[b, h] = bf16(a[b, h] @ b[h]).  c must be None for these two; use_cublaslt selects
    cuBLASLt on the device (same single rounding here).
    """
    _launch(_check_einsum_cuda(profile, "einsum", expr, a, b, d, c, use_cublaslt))


def _check_einsum_cuda(profile: Profile, func: str, expr: str, a: Any, b: Any, d: Any, c: Any,
                       use_cublaslt: Any) -> BatchedRequest:
    A, B, D = as_array(a, func, "a"), as_array(b, func, "b"), as_array(d, func, "d")
    if A.dtype != BF16:
        raise arg_error(func, "a", "dtype bfloat16", A)
    if B.dtype != BF16:
        raise arg_error(func, "b", "dtype bfloat16", B)
    if D.dtype not in OUT_DTYPES:
        raise arg_error(func, "d", "dtype bfloat16 or float32", D)
    c_arr = as_array(c, func, "c", allow_none=True)
    if c_arr is not None and c_arr.dtype != D.dtype:
        raise arg_error(func, "c", f"dtype {D.dtype} (d's dtype)", c_arr)
    if not isinstance(use_cublaslt, (bool, np.bool_)):
        raise arg_error(func, "use_cublaslt", "a bool", repr(use_cublaslt))
    if expr == "bmk,bnk->mn":
        if use_cublaslt:
            raise arg_error(func, "use_cublaslt", "False for 'bmk,bnk->mn'", "True")
        return _check_bmk_bnk_mn(profile, func, A, B, D, c_arr)
    perm_a, perm_b, perm_d = _permutation(func, expr, _EXPRS_CUDA)
    if c_arr is not None:
        raise arg_error(func, "c", f"None for {expr!r}", c_arr)
    if D.dtype != BF16:
        raise arg_error(func, "d", f"dtype bfloat16 for {expr!r}", D)
    for name, x in (("a", A), ("b", B), ("d", D)):
        if x.ndim != 3 or not _row_major_last(x):
            raise arg_error(func, name, "a 3-D array with stride(2) == 1", x)
    assert perm_d is not None
    a3, b3, d3 = A.transpose(perm_a), B.transpose(perm_b), D.transpose(perm_d)
    batch, m, n, k = _bmm_shapes(func, a3, b3, d3)
    check_written(D, func, "d", inputs=(("a", A), ("b", B)))
    check_matmul(func, "a", m, n, k)
    zero = _empty_k_rows(D, k, None) if batch and m and n else None
    return BatchedRequest(func=func, profile=profile, d=D, zero=zero, a=a3, b=b3, perm_d=perm_d, out=fm.BF16)


def _ascend_epilogue(func: str, epilogue: Any, d_dtype: np.dtype, fp8_pair: bool, c: Any,
                     fp8_ok: bool) -> tuple[float | None, Any]:
    """DeepGEMM-Ascend's resolve_epilogue_class: (alpha, sfd) with sfd set for FP8 output.

    At most one of an epilogue object and an FP8 (d, sfd) pair; FP8Quantization needs an E4M3 d
    and no c, and only the batched FP8 path takes it.
    """
    if fp8_pair and epilogue is not None:
        raise arg_error(func, "epilogue", "None with an FP8 (d, sfd) output pair (at most one of them)",
                        repr(epilogue))
    if isinstance(epilogue, FP8Quantization):
        if not fp8_ok:
            raise arg_error(func, "epilogue", "Identity() or Alpha(alpha) (FP8Quantization needs the batched FP8 "
                            "path: fp8_einsum 'bhr,hdr->bhd')", repr(epilogue))
        if d_dtype != E4M3:
            raise arg_error(func, "d", "a float8_e4m3fn d with FP8Quantization", f"dtype {d_dtype}")
        if c is not None:
            raise arg_error(func, "c", "None with an FP8 output", "an array")
        return None, epilogue.sfd
    if d_dtype == E4M3 and not fp8_pair:
        raise arg_error(func, "d", "dtype bfloat16 or float32 (float8_e4m3fn only with FP8Quantization or a "
                        "(d, sfd) pair)", f"dtype {d_dtype}")
    return alpha_of(func, None, epilogue), None


def _check_einsum_ascend(profile: Profile, func: str, expr: str, a: Any, b: Any, d: Any, c: Any,
                         use_cublaslt: Any, epilogue: Any) -> BatchedRequest:
    if not isinstance(use_cublaslt, (bool, np.bool_)):
        raise arg_error(func, "use_cublaslt", "a bool", repr(use_cublaslt))
    if use_cublaslt:
        raise arg_error(func, "use_cublaslt", "False (DeepGEMM-Ascend: the cuBLASLt path is not implemented)", "True")
    perm_a, perm_b, perm_d = _permutation(func, expr, _EXPRS_BATCHED)
    A, B, D = as_array(a, func, "a"), as_array(b, func, "b"), as_array(d, func, "d")
    a3, b3 = _permuted(A, func, "a", perm_a), _permuted(B, func, "b", perm_b)
    d3 = _permuted(D, func, "d", perm_d or (0, 1, 2))
    for name, x in (("a", a3), ("b", b3)):
        if x.dtype != BF16:
            raise arg_error(func, name, "dtype bfloat16", x)
        if not _inner_stride_ok(x):
            raise arg_error(func, name, "stride(-1) == 1 or stride(-2) == 1 after the permutation", x)
    if D.dtype not in OUT_DTYPES:
        raise arg_error(func, "d", "dtype bfloat16 or float32", D)
    if not _row_major_last(D):
        raise arg_error(func, "d", "stride(-1) == 1", D)
    alpha, _ = _ascend_epilogue(func, epilogue, D.dtype, False, c, fp8_ok=False)
    batch, m, n, k = _bmm_shapes(func, a3, b3, d3)
    check_written(D, func, "d", inputs=(("a", A), ("b", B)))
    check_matmul(func, "a", m, n, k)
    # Note: the newer DeepGEMM-Ascend (787919d) asserts that c is d; the snapshot copies a
    # separate c into d first.  Both are accepted here and in fp8_einsum (same result).
    c_val = resolve_c(c, D, func)[0] if c is not None else None
    work = batch and m and n
    return BatchedRequest(func=func, profile=profile, d=D, zero=_empty_k_rows(D, k, c_val) if work else None,
                          a=a3, b=b3, perm_d=perm_d, out=OUT_FORMAT[D.dtype], alpha=alpha, c=c_val)


def _einsum_ascend(profile: Profile, /, expr: str, a: Any, b: Any, d: Any, c: Any = None, use_cublaslt: bool = False,
                   epilogue: Any = None) -> None:
    """DeepGEMM-Ascend's bf16 einsum: batched bf16 GEMMs with optional c and alpha.

    'bhr,hdr->bhd': a (B, H, R), b (H, D, R) -> d (B, H, D); 'bhd,hdr->bhr': a (B, H, D),
    b (H, D, R) -> d (B, H, R); 'bhd,bhr->hdr': a (B, H, D), b (B, H, R) -> d (H, D, R) (the sum
    over B).  a, b bfloat16 (one of the two last strides 1); d bfloat16 or float32 with
    stride(-1) == 1; c None, an array of d's shape and dtype, or d itself: d = c + [alpha *] acc
    (bf16 d: bf16(c + bf16(acc))).  epilogue: Identity() or Alpha(alpha).  use_cublaslt=True
    raises (not implemented by the port).
    """
    _launch(_check_einsum_ascend(profile, "einsum", expr, a, b, d, c, use_cublaslt, epilogue))


einsum = profiled("einsum", deepgemm=_einsum_cuda, deepgemm_ascend=_einsum_ascend)


# ----------------------------------------------------------------------------------------------
# fp8_einsum
# ----------------------------------------------------------------------------------------------

def _fp8_bmm_operands(func: str, a: Any, b: Any, perm_a: tuple[int, ...], perm_b: tuple[int, ...]
                      ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray, np.ndarray | None]:
    X, sfx = as_pair(a, func, "a", sf_optional=True)
    Y, sfy = as_pair(b, func, "b", sf_optional=True)
    a3, b3 = _permuted(X, func, "a[0]", perm_a), _permuted(Y, func, "b[0]", perm_b)
    sfa3 = None if sfx is None else _permuted(sfx, func, "a[1]", perm_a)
    sfb3 = None if sfy is None else _permuted(sfy, func, "b[1]", perm_b)
    for name, x in (("a", a3), ("b", b3)):
        if x.dtype != E4M3:
            raise arg_error(func, f"{name}[0]", "dtype float8_e4m3fn", x)
        if not _inner_stride_ok(x):
            raise arg_error(func, f"{name}[0]", "stride(-1) == 1 or stride(-2) == 1 after the permutation", x)
    return a3, sfa3, b3, sfb3


def _check_fp8_einsum_cuda(profile: Profile, func: str, expr: str, a: Any, b: Any, d: Any, c: Any,
                           recipe: Any) -> BatchedRequest:
    accepted = profile.rules.fp8_einsum_exprs
    perm_a, perm_b, perm_d = _permutation(func, expr, accepted)
    a3, sfa3, b3, sfb3 = _fp8_bmm_operands(func, a, b, perm_a, perm_b)
    D = as_array(d, func, "d")
    d3 = _permuted(D, func, "d", perm_d or (0, 1, 2))
    if not _row_major_last(D):
        raise arg_error(func, "d", "stride(-1) == 1", D)
    batch, m, n, k = _bmm_shapes(func, a3, b3, d3)
    if D.dtype not in OUT_DTYPES:
        raise arg_error(func, "d", "dtype bfloat16 or float32", D)
    check_written(D, func, "d", inputs=(("a[0]", a3), ("a[1]", sfa3), ("b[0]", b3), ("b[1]", sfb3)))
    check_matmul(func, "a", m, n, k)
    req = BatchedRequest(func=func, profile=profile, d=D, a=a3, b=b3, perm_d=perm_d, out=OUT_FORMAT[D.dtype])
    if batch == 0 or m == 0 or n == 0:
        return req
    req.c = resolve_c(c, D, func)[0] if c is not None else None
    if k == 0:
        req.zero = _empty_k_rows(D, k, req.c)
        return req
    ga, gka, gb, gkb = cuda_recipes(func, sfa3, sfb3, recipe, None, None, profile)
    scales_a = resolve_scales(func, "a[1]", sfa3, m, k, ga, gka, batch, profile, is_b=False)
    scales_b = resolve_scales(func, "b[1]", sfb3, n, k, gb, gkb, batch, profile, is_b=True)
    if profile.rules.fp8_1d2d:
        if D.dtype != BF16:
            raise arg_error(func, "d", f"dtype bfloat16 on {profile.name} (the 1D2D batched kernel)", D)
        for name, x in (("a", a3), ("b", b3)):
            if x.size and elem_stride(x, -1) != 1 and profile.rules.fp8_k_major_only:
                raise arg_error(func, f"{name}[0]", f"K-major operands on {profile.name}", x)
        if gb == 1:
            # Note: sm90's batched kernel is 1D2D only and would misread per-row SFB (gran_n 1).
            raise arg_error(func, "recipe", f"a per-block SFB (gran_n 128) for {profile.name}'s 1D2D batched kernel",
                            repr(recipe))
        # Note: sm90 accepts c but its 1D2D batched kernel has no accumulating epilogue: d ends
        # up bf16(A @ B^T) and c is discarded; reproduced here rather than rejected.
        req.c = None
    req.scales, req.gran_k = (scales_a, scales_b), (gka, gkb)
    return req


def _fp8_einsum_cuda(profile: Profile, /, expr: str, a: Any, b: Any, d: Any, c: Any = None,
                     recipe: tuple[int, int, int] = (1, 128, 128)) -> None:
    """DeepGEMM's FP8 einsum: a batched FP8 GEMM D[batch] = C[batch] + A[batch] @ B[batch]^T.

    'bhr,hdr->bhd' (sm90, sm100): a = (x (B, H, R) float8_e4m3fn, sfa (B, H, ceil(R / 128))),
    b = (y (H, D, R), sfb (H, ceil(D / 128), ceil(R / 128))), d (B, H, D).
    'bhd,hdr->bhr' (sm100): a = (x (B, H, D), sfa (B, H, ceil(D / 128))), b = (y (H, D, R),
    sfb (H, ceil(D / 128), ceil(R / 128))), d (B, H, R).
    'bhd,bhr->hdr' (sm100): a = (x (B, H, D), sfa (ceil(B / gran_k), H, D)), b = (y (B, H, R),
    sfb (ceil(B / gran_k), H, R)), d (H, D, R) (the sum over B; usually float32 with c = d).
    Scales follow recipe (gran_m, gran_n, gran_k) as in fp8_fp4_gemm_nt, permuted with the data.
    d bfloat16 or float32 (sm90: bfloat16, K-major operands, gran_k 128); c as in the dense GEMM.
    """
    _launch(_check_fp8_einsum_cuda(profile, "fp8_einsum", expr, a, b, d, c, recipe))


def _check_fp8_output(func: str, d3: np.ndarray, sfd: Any, n: int, m: int, batch: int) -> np.ndarray:
    """FP8Quantization's host checks on the permuted d and on sfd."""
    if not _row_major_last(d3) or (d3.size and batch > 1 and elem_stride(d3, 0) != n):
        raise arg_error(func, "d", f"an E4M3 d with stride(-1) == 1 and, after the permutation, stride(0) == N = {n}",
                        d3)
    if n % 64:
        raise arg_error(func, "d", "N divisible by 64 for FP8 output (scales pair 64 columns)", f"N = {n}")
    s = as_array(sfd, func, "sfd")
    want = (m, batch * n // 64)
    if s.dtype != I16 or s.ndim != 2 or tuple(s.shape) != want:
        raise arg_error(func, "sfd", f"an int16 array of shape (M, batch * N / 64) = {want}", s)
    if s.size and not ((elem_stride(s, 0) == 1 or m == 1) and (want[1] == 1 or elem_stride(s, 1) == m)):
        raise arg_error(func, "sfd", f"an MN-major array with strides (1, {m})", s)
    return s


def _fp8_quantize_rows(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """DeepGEMM-Ascend's FP8Quantization of one (M, N) bf16 tile: (E4M3 codes, UE8M0 bytes).

    v: bfloat16 (M, N), N % 32 == 0 (the accumulator already rounded to bf16).  Per row and per
    32 consecutive columns: amax = max |v|; scale byte e = max(E(amax) + [significand > 1.75],
    113) - 8, i.e. sf = 2^ceil(log2(amax / 448)) floored at 2^-22; q = e4m3_RN_saturating(v / sf)
    (exact division by a power of two).  Returns uint8 codes (M, N) and bytes (M, N / 32).
    """
    m, n = v.shape
    x = v.astype(np.float32).reshape(m, n // 32, 32)
    amax = np.abs(x).max(axis=2) if n else np.zeros((m, 0), np.float32)
    bits = amax.view(np.uint32)
    exp = ((bits >> np.uint32(23)) & np.uint32(0xFF)).astype(np.int64)
    up = (bits & np.uint32(0x7FFFFF)) > np.uint32(0x600000)  # significand > 1.75
    e = np.maximum(exp + up, 113) - 8
    scaled = np.ldexp(x.astype(np.float64), (127 - e)[:, :, None])
    q = fm.encode(scaled, fm.E4M3, fm.SATURATING_RNE).reshape(m, n)
    return q, e.astype(np.uint8)


def _check_fp8_einsum_ascend(profile: Profile, func: str, expr: str, a: Any, b: Any, d: Any, c: Any, recipe: Any,
                             epilogue: Any) -> BatchedRequest:
    perm_a, perm_b, perm_d = _permutation(func, expr, _EXPRS_BATCHED)
    fp8_pair = isinstance(d, (tuple, list))
    if fp8_pair:
        if expr != "bhr,hdr->bhd":
            raise arg_error(func, "d", f"an output tensor for {expr!r} (an FP8 (d, sfd) pair only for 'bhr,hdr->bhd')",
                            "a pair")
        D, sfd_arg = as_pair(d, func, "d")
    else:
        D, sfd_arg = as_array(d, func, "d"), None
    a3, sfa3, b3, sfb3 = _fp8_bmm_operands(func, a, b, perm_a, perm_b)
    d3 = _permuted(D, func, "d", perm_d or (0, 1, 2))
    if not _row_major_last(D):
        raise arg_error(func, "d", "stride(-1) == 1", D)
    batch, m, n, k = _bmm_shapes(func, a3, b3, d3)
    if fp8_pair and D.dtype != E4M3:
        raise arg_error(func, "d", "a float8_e4m3fn d in the (d, sfd) pair", D)
    if D.dtype not in OUT_DTYPES + (E4M3,):
        raise arg_error(func, "d", "dtype bfloat16 or float32 (or float8_e4m3fn for FP8 output)", D)
    if isinstance(epilogue, FP8Quantization) and expr != "bhr,hdr->bhd":
        raise arg_error(func, "epilogue", "no FP8Quantization for " + repr(expr) + " (FP8 output only for "
                        "'bhr,hdr->bhd')", repr(epilogue))
    alpha, sfd_epi = _ascend_epilogue(func, epilogue, D.dtype, fp8_pair, c, fp8_ok=True)
    if fp8_pair and c is not None:
        raise arg_error(func, "c", "None with an FP8 output", "an array")
    fp8_out = fp8_pair or sfd_epi is not None
    sfd = None
    if fp8_out:
        sfd = _check_fp8_output(func, d3, sfd_arg if fp8_pair else sfd_epi, n, m, batch)
    inputs = (("a[0]", a3), ("a[1]", sfa3), ("b[0]", b3), ("b[1]", sfb3))
    check_written(D, func, "d", inputs=inputs + (("sfd", sfd),))
    if sfd is not None:
        check_written(sfd, func, "sfd", inputs=inputs + (("d", D),))
    check_matmul(func, "a", m, n, k)
    req = BatchedRequest(func=func, profile=profile, d=D, a=a3, b=b3, perm_d=perm_d,
                         out=fm.BF16 if fp8_out else OUT_FORMAT[D.dtype], alpha=alpha, sfd=sfd)
    if batch == 0:
        return req
    req.c = resolve_c(c, D, func)[0] if c is not None else None
    if m == 0 or n == 0:
        return req
    if k == 0:
        req.zero = _empty_k_rows(D, k, req.c)
        return req
    ga, gka, gb, gkb = ascend_recipes(func, None, None, recipe, None, None, profile)
    req.scales = (resolve_scales(func, "a[1]", sfa3, m, k, ga, gka, batch, profile, is_b=False),
                  resolve_scales(func, "b[1]", sfb3, n, k, gb, gkb, batch, profile, is_b=True))
    req.gran_k = (gka, gkb)
    return req


def _fp8_einsum_ascend(profile: Profile, /, expr: str, a: Any, b: Any, d: Any, c: Any = None,
                       recipe: tuple[int, int, int] = (1, 1, 32), epilogue: Any = None) -> None:
    """DeepGEMM-Ascend's FP8 einsum: MX-scaled batched FP8 GEMMs.

    Expressions and shapes as DeepGEMM's sm100 fp8_einsum; scales per 32 along K (recipe
    default (1, 1, 32)): float32 powers of two or int16 UE8M0 pairs, permuted with the data.
    d bfloat16 or float32 (d = c + [alpha *] acc, bf16 d with c: bf16(c + bf16(acc))), or, for
    'bhr,hdr->bhd' only, FP8 output: d = (D (B, H, D) float8_e4m3fn, SFD int16 (B, H * D / 64))
    or D with epilogue=FP8Quantization(SFD): acc -> bf16 -> per-32-column UE8M0 scale (floor
    2^-22) -> E4M3 RN saturating; SFD[b, h * D / 64 + p] packs the scale bytes of columns
    64p..64p+31 (low byte) and 64p+32..64p+63 (high byte) of head h.  epilogue: Identity(),
    Alpha(alpha) or FP8Quantization(sfd).
    """
    _launch(_check_fp8_einsum_ascend(profile, "fp8_einsum", expr, a, b, d, c, recipe, epilogue))


def _fp8_sink(D: np.ndarray, sfd: np.ndarray, idx: tuple[Any, ...], g: int, n: int
              ) -> Callable[[core.MatmulResult, Collected], None]:
    """FP8Quantization's writer of batch g: E4M3 codes into D[idx], the packed scales into sfd."""
    def write(res: core.MatmulResult, col: Collected) -> None:
        q, e = _fp8_quantize_rows(res.out)
        D[idx] = q.view(E4M3)
        pairs = fm.pack_ue8m0_int16(e)  # (M, N / 64): low byte = first 32 columns
        sfd[:, g * (n // 64):(g + 1) * (n // 64)] = pairs
    return write


fp8_einsum = profiled("fp8_einsum", deepgemm=_fp8_einsum_cuda, deepgemm_ascend=_fp8_einsum_ascend)


# ----------------------------------------------------------------------------------------------
# tf32_hc_prenorm_gemm
# ----------------------------------------------------------------------------------------------

def _split_ranges(k: int, block: int, splits: int) -> list[tuple[int, int]]:
    """DeepGEMM's K split: nb = K / block blocks, split s gets q + (s < r) blocks
    starting at s * q + min(s, r), q = nb // S, r = nb % S."""
    nb = k // block
    q, r = divmod(nb, splits)
    out = []
    for s in range(splits):
        b0 = s * q + min(s, r)
        b1 = b0 + q + (1 if s < r else 0)
        out.append((b0 * block, b1 * block))
    return out


@dataclass(kw_only=True)
class PrenormRequest(Request):
    """A validated prenorm GEMM: ``a`` (M, K) bf16, ``b`` (N, K) float32 read as TF32 / HF32, the
    K ``ranges`` of the splits, and ``sqr_sum`` (the second output, written as (splits, M, 1))."""

    a: np.ndarray
    b: np.ndarray
    ranges: list[tuple[int, int]]
    split_output: bool
    ascend: bool
    sqr_sum: np.ndarray


def _check_prenorm(profile: Profile, func: str, a: Any, b: Any, d: Any, sqr_sum: Any, num_splits: Any, *,
                   ascend: bool) -> PrenormRequest:
    A, B = as_array(a, func, "a"), as_array(b, func, "b")
    D, S = as_array(d, func, "d"), as_array(sqr_sum, func, "sqr_sum")
    for name, x in (("a", A), ("b", B)):
        if x.ndim != 2:
            raise arg_error(func, name, "a 2-D array", x)
        if x.size and x.shape[-1] > 1 and elem_stride(x, -1) != 1:
            raise arg_error(func, name, "a K-major array (stride(-1) == 1)", x)
    if not _row_major_last(D):
        raise arg_error(func, "d", "an N-major d (stride(-1) == 1)", D)
    if not S.flags.c_contiguous:
        raise arg_error(func, "sqr_sum", "a contiguous array", S)
    m, k = A.shape
    n, k2 = B.shape
    if num_splits is not None:
        if isinstance(num_splits, (bool, np.bool_)) or not isinstance(num_splits, (int, np.integer)):
            raise arg_error(func, "num_splits", "None or an int", repr(num_splits))
        splits = int(num_splits)
        if splits < 1 or (ascend and splits != 1):
            raise arg_error(func, "num_splits", "None or 1 (DeepGEMM-Ascend reduces its K splits in the kernel)"
                            if ascend else "None or an int >= 1", repr(num_splits))
        want_d: tuple[int, ...] = (splits, m, n)
        want_s: tuple[int, ...] = (splits, m)
    else:
        splits = 1
        want_d, want_s = (m, n), (m,)
    if D.shape != want_d or S.shape != want_s or k2 != k:
        raise arg_error(func, "d", f"b (N, {k}), d {want_d} and sqr_sum {want_s} (num_splits={num_splits})",
                        f"b {B.shape}, d {D.shape}, sqr_sum {S.shape}")
    if n <= 0 or k <= 0:
        raise arg_error(func, "b", "N > 0 and K > 0", B)
    for name, x, dt in (("a", A, BF16), ("b", B, F32), ("d", D, F32), ("sqr_sum", S, F32)):
        if x.dtype != dt:
            raise arg_error(func, name, f"dtype {dt}", x)
    check_written(D, func, "d", inputs=(("a", A), ("b", B), ("sqr_sum", S)))
    check_written(S, func, "sqr_sum", inputs=(("a", A), ("b", B), ("d", D)))
    check_matmul(func, "a", m, n, k)
    # Both targets return before their kernel's shape limits are checked when M == 0.
    if m and ascend:
        if n > 64 or n % 8 or k % 256:
            raise arg_error(func, "b", "N <= 64, N % 8 == 0 and K % 256 == 0 (DeepGEMM-Ascend)", f"N = {n}, K = {k}")
    elif m:
        n_max = profile.rules.hc_prenorm_n_max
        if n > n_max or n % 8 or k % 64:
            raise arg_error(func, "b", f"N <= {n_max}, N % 8 == 0 and K % 64 == 0 on {profile.name}",
                            f"N = {n}, K = {k}")
    # Note: a split with no K block (num_splits > K / 64) stores the empty sum 0 here; the device
    # kernel stores an accumulator it never cleared.
    return PrenormRequest(func=func, profile=profile, d=D, a=A, b=B, ranges=_split_ranges(k, 64, splits),
                          split_output=num_splits is not None, ascend=ascend, sqr_sum=S.reshape(splits, m, 1))


def _prenorm_tasks(req: PrenormRequest) -> tuple[list[Task], list[Task]]:
    """(sqr_sum tasks, d tasks) of every K split s = [k0, k1):
    sqr_sum[s] = f32(sum_{k0 <= k < k1} a[:, k]^2) (a GEMM of a^2, exact in float64, against a row
    of ones) and d[s] = f32(sum_{k0 <= k < k1} a[:, k] conv(b)[:, k]^T), conv = hf32 / tf32."""
    if req.a.shape[0] == 0:
        return [], []
    k = req.a.shape[1]
    b_conv = hf32_round(req.b) if req.ascend else tf32_truncate(req.b)
    a_sq = np.square(req.a.astype(np.float64))  # exact: 16-bit significands within float64's range
    ones = np.ones((1, k), np.float32)
    sq = [Task(core.Operand(a_sq[:, k0:k1]), core.Operand(ones[:, : k1 - k0]), core.OutputStage(fm.F32), (s,),
               label="sqr_sum split")
          for s, (k0, k1) in enumerate(req.ranges)]
    gemm = [Task(core.Operand(req.a[:, k0:k1]), core.Operand(b_conv[:, k0:k1]), core.OutputStage(fm.F32),
                 (s,) if req.split_output else (slice(None),), label="matmul split")
            for s, (k0, k1) in enumerate(req.ranges)]
    return sq, gemm


def _hc_prenorm(profile: Profile, a: Any, b: Any, d: Any, sqr_sum: Any, num_splits: Any, *, ascend: bool) -> None:
    req = _check_prenorm(profile, "tf32_hc_prenorm_gemm", a, b, d, sqr_sum, num_splits, ascend=ascend)
    sq_tasks, tasks = _prenorm_tasks(req)
    # The second output first: its accumulator and error scale go into the call's one record.
    sq = execute(Request(func=req.func, profile=req.profile, d=req.sqr_sum), sq_tasks, record_trace=False)
    extra = {f"sqr_sum.{key}": (arr[0, :, 0] if not req.split_output else arr[:, :, 0])
             for key, arr in (("acc", sq.acc), ("S", sq.S)) if arr is not None}
    execute(req, tasks, extra=extra)


def _hc_prenorm_cuda(profile: Profile, /, a: Any, b: Any, d: Any, sqr_sum: Any, num_splits: int | None = None) -> None:
    """DeepGEMM's hyper-connection prenorm GEMM, split K.

    a (M, K) bfloat16 K-major; b (N, K) float32 K-major; d float32 N-major, (M, N) or (S, M, N)
    with num_splits = S; sqr_sum float32 contiguous, (M,) or (S, M).  sm90: N <= 32; sm100:
    N <= 128; N % 8 == 0 and K % 64 == 0.  With nb = K / 64 blocks, split s covers blocks
    [s q + min(s, r), ...) of count q + (s < r), q = nb // S, r = nb % S, and
    d[s] = f32(sum_{k in split} a[:, k] tf32(b)[:, k]^T), sqr_sum[s] = f32(sum_{k in split} a^2)
    (the caller sums over s).  tf32 = :func:`tf32_truncate`.
    """
    _hc_prenorm(profile, a, b, d, sqr_sum, num_splits, ascend=False)


def _hc_prenorm_ascend(profile: Profile, /, a: Any, b: Any, d: Any, sqr_sum: Any,
                       num_splits: int | None = None) -> None:
    """DeepGEMM-Ascend's prenorm GEMM: HF32 instead of TF32, no split output.

    a (M, K) bfloat16; b (N, K) float32; d (M, N) float32 (or (1, M, N) with num_splits=1);
    sqr_sum (M,) (or (1, M)).  N <= 64, N % 8 == 0, K % 256 == 0.
    d = f32(a @ hf32(b)^T), sqr_sum = f32(sum_k a^2), hf32 = :func:`hf32_round`.
    """
    _hc_prenorm(profile, a, b, d, sqr_sum, num_splits, ascend=True)


tf32_hc_prenorm_gemm = profiled("tf32_hc_prenorm_gemm", deepgemm=_hc_prenorm_cuda, deepgemm_ascend=_hc_prenorm_ascend)


# ----------------------------------------------------------------------------------------------
# DeepGEMM-Ascend's batched GEMMs (its ``_C.fp8_bmm`` / ``_C.bf16_bmm``, gathered by deepgemm_ref._C)
# ----------------------------------------------------------------------------------------------

def _fp8_bmm(profile: Profile, /, a: Any, b: Any, d: Any, c: Any = None, recipe: Any = (1, 1, 32),
             compiled_dims: str = "nk", epilogue: Any = None) -> None:
    """DeepGEMM-Ascend's batched FP8 GEMM behind ``fp8_einsum``: d[i] = c[i] + A[i] @ B[i]^T.

    a = (A (batch, M, K) e4m3 or packed FP4, sfa (batch, M, K/32 or K/64 int16)), b likewise with
    N; d (batch, M, N) bf16 / float32, or e4m3 with an ``FP8Quantization`` epilogue.  Computed as
    ``fp8_einsum('bhr,hdr->bhd', ...)`` on transposed views (batch as the ``h`` axis).
    """
    def t(x: Any) -> Any:
        x = to_numpy(x, "fp8_bmm", "operand")
        return None if x is None else x.swapaxes(0, 1)

    a_t = (t(a[0]), t(a[1])) if isinstance(a, (tuple, list)) else a
    d_t = (t(d[0]), d[1]) if isinstance(d, (tuple, list)) else t(d)
    c_t = None if c is None else t(c)
    _fp8_einsum_ascend(profile, "bhr,hdr->bhd", a_t, b, d_t, c=c_t, recipe=recipe, epilogue=epilogue)


def _bf16_bmm(profile: Profile, /, a: Any, b: Any, d: Any, c: Any = None, compiled_dims: str = "nk",
              epilogue: Any = None) -> None:
    """DeepGEMM-Ascend's batched BF16 GEMM behind ``einsum``: d[i] = c[i] + A[i] @ B[i]^T.

    a (batch, M, K), b (batch, N, K) bf16; d (batch, M, N) bf16 or float32.  Computed as
    ``einsum('bhr,hdr->bhd', ...)`` on transposed views (batch as the ``h`` axis).
    """
    def t(x: Any) -> Any:
        return None if x is None else to_numpy(x, "bf16_bmm", "operand").swapaxes(0, 1)

    _einsum_ascend(profile, "bhr,hdr->bhd", t(a), b, t(d), c=t(c), epilogue=epilogue)


_BMM_ONLY = {"deepgemm": "a DeepGEMM-Ascend _C addition that DeepGEMM 2.6.1 does not export"}
fp8_bmm = profiled("fp8_bmm", _BMM_ONLY, deepgemm_ascend=_fp8_bmm)
bf16_bmm = profiled("bf16_bmm", _BMM_ONLY, deepgemm_ascend=_bf16_bmm)
