"""Deliberately broken device stand-ins: deepgemm_ref with one kernel replaced by a buggy one.

Each stand-in is a module object with every public name of deepgemm_ref (layout transforms,
runtime settings, ...) and one kernel wrapped so that it is wrong in a known way; the property
tests must fail on it, shrink, and say what is wrong.
"""

from __future__ import annotations

import types
from typing import Any

import numpy as np

import deepgemm_ref


def standin(name: str, **kernels: Any) -> types.ModuleType:
    """A module named ``name`` holding deepgemm_ref's names, ``kernels`` replacing some."""
    mod = types.ModuleType(name)
    for attr in dir(deepgemm_ref):
        if not attr.startswith("__"):
            setattr(mod, attr, getattr(deepgemm_ref, attr))
    for attr, fn in kernels.items():
        setattr(mod, attr, fn)
    return mod


def _fp8_drops_second_k_block(a: Any, b: Any, d: Any, *args: Any, **kwargs: Any) -> None:
    """Ignores A's elements past K = 128 (a kernel that forgets the last K block)."""
    x, sx = a
    if x.shape[1] > 128:
        x = np.array(x)
        x[:, 128:] = 0
    deepgemm_ref.fp8_gemm_nt((x, sx), b, d, *args, **kwargs)


def _fp8_wrong_scale(a: Any, b: Any, d: Any, *args: Any, **kwargs: Any) -> None:
    """Reads A's scale factors rows in reverse (the scale of the wrong token)."""
    x, sx = a
    deepgemm_ref.fp8_gemm_nt((x, np.ascontiguousarray(np.asarray(sx)[::-1])), b, d, *args, **kwargs)


def _bf16_truncates_output(a: Any, b: Any, d: Any, *args: Any, **kwargs: Any) -> None:
    """Computes in float32 and truncates to bf16 instead of rounding to nearest."""
    if np.asarray(d).dtype != np.dtype("float32") and "c" not in kwargs:
        tmp = np.zeros(np.shape(d), np.float32)
        deepgemm_ref.bf16_gemm_nt(a, b, tmp, *args, **kwargs)
        d[...] = (tmp.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32).astype(np.asarray(d).dtype)
    else:
        deepgemm_ref.bf16_gemm_nt(a, b, d, *args, **kwargs)


def _grouped_skips_last_group(a: Any, b: Any, d: Any, grouped_layout: Any, *args: Any, **kwargs: Any) -> None:
    """Leaves the rows of the last group at zero (an off-by-one over the groups)."""
    deepgemm_ref.m_grouped_bf16_gemm_nt_contiguous(a, b, d, grouped_layout, *args, **kwargs)
    layout = np.asarray(grouped_layout)
    groups = np.asarray(b).shape[0]
    if kwargs.get("use_psum_layout"):
        start = 0 if groups == 1 else -(-int(layout[-2]) // deepgemm_ref.get_mk_alignment_for_contiguous_layout()) * \
            deepgemm_ref.get_mk_alignment_for_contiguous_layout()
        d[start:int(layout[-1])] = 0
    else:
        d[layout == groups - 1] = 0


def _nan_becomes_zero(a: Any, b: Any, d: Any, *args: Any, **kwargs: Any) -> None:
    """Flushes NaN outputs to zero (a kernel that loses the NaN class)."""
    deepgemm_ref.bf16_gemm_nt(a, b, d, *args, **kwargs)
    out = np.asarray(d)
    out[np.isnan(out.astype(np.float32))] = 0


def _mqa_ignores_kv_scale(q: Any, kv: Any, *args: Any, **kwargs: Any) -> Any:
    """Reads the FP8 keys without their per-token scale factors (a dropped dequantisation)."""
    data, sf = kv
    return deepgemm_ref.fp8_fp4_mqa_logits(q, (data, np.ones_like(np.asarray(sf))), *args, **kwargs)


def _k_grouped_drops_c(a: Any, b: Any, d: Any, ks: Any, layout: Any, c: Any = None, **kwargs: Any) -> None:
    """Accumulates onto zeros instead of C (a lost epilogue input): D is the product alone."""
    deepgemm_ref.k_grouped_fp8_gemm_tn_contiguous(a, b, d, ks, layout, np.zeros_like(np.asarray(c)), **kwargs)


DROPS_K_BLOCK = standin("drops_k_block", fp8_gemm_nt=_fp8_drops_second_k_block)
WRONG_SCALE = standin("wrong_scale", fp8_gemm_nt=_fp8_wrong_scale)
TRUNCATES = standin("truncates", bf16_gemm_nt=_bf16_truncates_output)
SKIPS_GROUP = standin("skips_group", m_grouped_bf16_gemm_nt_contiguous=_grouped_skips_last_group)
FLUSHES_NAN = standin("flushes_nan", bf16_gemm_nt=_nan_becomes_zero)
MQA_NO_KV_SCALE = standin("mqa_no_kv_scale", fp8_fp4_mqa_logits=_mqa_ignores_kv_scale)
K_GROUPED_DROPS_C = standin("k_grouped_drops_c", k_grouped_fp8_gemm_tn_contiguous=_k_grouped_drops_c)
