"""Stand-in device modules: deepgemm_ref with one kernel replaced by a buggy port of it.

``standin(name, fp8_gemm_nt=buggy)`` registers a module object that answers every attribute
from deepgemm_ref except the replaced ones, as a device library would (``--module NAME``);
:func:`replay_through` replays a bundle through it with the golden replay path (NumPy arrays;
the layout transforms applied with the module's own functions, as on a device) under each
case's profile.  The diagnosis tests build their stand-ins with it; the stand-ins at the end of
this module (``DROPS_K_BLOCK``, ...) are the broken kernels the property tests of
test_strategies.py must fail on, shrink, and say what is wrong.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import deepgemm_ref as dg
from deepgemm_ref import golden


def standin(name: str, **replaced: Callable[..., Any]) -> types.ModuleType:
    """A module named ``name`` in sys.modules: deepgemm_ref's names, ``replaced`` overriding."""
    mod = types.ModuleType(name)

    def fallback(attr: str) -> Any:
        return getattr(dg, attr)

    mod.__getattr__ = fallback  # type: ignore[method-assign]
    for k, f in replaced.items():
        setattr(mod, k, f)
    sys.modules[name] = mod
    return mod


def replay_through(bundle: Path, module: types.ModuleType, out: Path) -> Path:
    """Replay every case of ``bundle`` through ``module`` (under its case's profile)."""
    b = golden.load_bundle(bundle)
    profiles = {e["profile"] for e in b.cases.values()}
    assert len(profiles) == 1, "one profile per stand-in bundle"
    with dg.numerics(arch=profiles.pop()):
        res = golden.replay(bundle, out, module=module.__name__, use_torch=False, force=True)
    assert not res.errors, res.errors
    return out


def user_sf(sf: Any, mn: int, k: int, gran_mn: int, gran_k: int, groups: int | None = None) -> np.ndarray:
    """Any SF form a kernel receives, back to float32 user form (the device's view of it)."""
    return np.asarray(dg.layout.to_user_form(sf, mn, k, gran_mn, gran_k, groups))


# ----------------------------------------------------------------------------------------------
# broken kernels for the property tests (test_strategies.py)
# ----------------------------------------------------------------------------------------------

def _fp8_drops_second_k_block(a: Any, b: Any, d: Any, *args: Any, **kwargs: Any) -> None:
    """Ignores A's elements past K = 128 (a kernel that forgets the last K block)."""
    x, sx = a
    if x.shape[1] > 128:
        x = np.array(x)
        x[:, 128:] = 0
    dg.fp8_gemm_nt((x, sx), b, d, *args, **kwargs)


def _fp8_wrong_scale(a: Any, b: Any, d: Any, *args: Any, **kwargs: Any) -> None:
    """Reads A's scale factors rows in reverse (the scale of the wrong token)."""
    x, sx = a
    dg.fp8_gemm_nt((x, np.ascontiguousarray(np.asarray(sx)[::-1])), b, d, *args, **kwargs)


def _bf16_truncates_output(a: Any, b: Any, d: Any, *args: Any, **kwargs: Any) -> None:
    """Computes in float32 and truncates to bf16 instead of rounding to nearest."""
    if np.asarray(d).dtype != np.dtype("float32") and "c" not in kwargs:
        tmp = np.zeros(np.shape(d), np.float32)
        dg.bf16_gemm_nt(a, b, tmp, *args, **kwargs)
        d[...] = (tmp.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32).astype(np.asarray(d).dtype)
    else:
        dg.bf16_gemm_nt(a, b, d, *args, **kwargs)


def _grouped_skips_last_group(a: Any, b: Any, d: Any, grouped_layout: Any, *args: Any, **kwargs: Any) -> None:
    """Leaves the rows of the last group at zero (an off-by-one over the groups)."""
    dg.m_grouped_bf16_gemm_nt_contiguous(a, b, d, grouped_layout, *args, **kwargs)
    layout = np.asarray(grouped_layout)
    groups = np.asarray(b).shape[0]
    if kwargs.get("use_psum_layout"):
        start = 0 if groups == 1 else -(-int(layout[-2]) // dg.get_mk_alignment_for_contiguous_layout()) * \
            dg.get_mk_alignment_for_contiguous_layout()
        d[start:int(layout[-1])] = 0
    else:
        d[layout == groups - 1] = 0


def _nan_becomes_zero(a: Any, b: Any, d: Any, *args: Any, **kwargs: Any) -> None:
    """Flushes NaN outputs to zero (a kernel that loses the NaN class)."""
    dg.bf16_gemm_nt(a, b, d, *args, **kwargs)
    out = np.asarray(d)
    out[np.isnan(out.astype(np.float32))] = 0


def _mqa_ignores_kv_scale(q: Any, kv: Any, *args: Any, **kwargs: Any) -> Any:
    """Reads the FP8 keys without their per-token scale factors (a dropped dequantisation)."""
    data, sf = kv
    return dg.fp8_fp4_mqa_logits(q, (data, np.ones_like(np.asarray(sf))), *args, **kwargs)


def _k_grouped_drops_c(a: Any, b: Any, d: Any, ks: Any, layout: Any, c: Any = None, **kwargs: Any) -> None:
    """Accumulates onto zeros instead of C (a lost epilogue input): D is the product alone."""
    dg.k_grouped_fp8_gemm_tn_contiguous(a, b, d, ks, layout, np.zeros_like(np.asarray(c)), **kwargs)


DROPS_K_BLOCK = standin("drops_k_block", fp8_gemm_nt=_fp8_drops_second_k_block)
WRONG_SCALE = standin("wrong_scale", fp8_gemm_nt=_fp8_wrong_scale)
TRUNCATES = standin("truncates", bf16_gemm_nt=_bf16_truncates_output)
SKIPS_GROUP = standin("skips_group", m_grouped_bf16_gemm_nt_contiguous=_grouped_skips_last_group)
FLUSHES_NAN = standin("flushes_nan", bf16_gemm_nt=_nan_becomes_zero)
MQA_NO_KV_SCALE = standin("mqa_no_kv_scale", fp8_fp4_mqa_logits=_mqa_ignores_kv_scale)
K_GROUPED_DROPS_C = standin("k_grouped_drops_c", k_grouped_fp8_gemm_tn_contiguous=_k_grouped_drops_c)


# ----------------------------------------------------------------------------------------------
# DeepEP ports: deepgemm_ref.ep with its buffers' dispatch / combine wrapped
# ----------------------------------------------------------------------------------------------

def ep_port(name: str, dispatch: Callable[..., Any] | None = None,
            combine: Callable[..., Any] | None = None) -> types.ModuleType:
    """A DeepEP-like module named ``name``: deepgemm_ref.ep's names, its buffers' ``dispatch`` /
    ``combine`` replaced by ``dispatch(buf, correct, *args, **kw)`` / ``combine(buf, correct, *args,
    **kw)`` (``correct``: the emulator's method, which a port may call as its own transport)."""
    import deepgemm_ref.ep as base

    def port_of(cls: type) -> type:
        def do_dispatch(self: Any, *args: Any, **kw: Any) -> Any:
            correct = super(port, self).dispatch  # type: ignore[misc]
            return dispatch(self, correct, *args, **kw) if dispatch else correct(*args, **kw)

        def do_combine(self: Any, *args: Any, **kw: Any) -> Any:
            correct = super(port, self).combine  # type: ignore[misc]
            return combine(self, correct, *args, **kw) if combine else correct(*args, **kw)

        port = type(cls.__name__, (cls,), {"dispatch": do_dispatch, "combine": do_combine})
        return port

    mod = types.ModuleType(name)
    mod.__getattr__ = lambda attr: getattr(base, attr)  # type: ignore[method-assign]
    mod.ElasticBuffer = port_of(base.ElasticBuffer)  # type: ignore[attr-defined]
    mod.EPBuffer = port_of(base.EPBuffer)  # type: ignore[attr-defined]
    sys.modules[name] = mod
    return mod


def _dispatch_args(args: tuple[Any, ...], kw: dict[str, Any]) -> dict[str, Any]:
    names = ("x", "topk_idx", "topk_weights", "cumulative_local_expert_recv_stats")
    out = dict(zip(names, args, strict=False))
    out.update(kw)
    return out


def _dispatch_drops_a_k_slot(buf: Any, correct: Callable[..., Any], *args: Any, **kw: Any) -> Any:
    """Sends each token to the owner of every slot but the last (a loop bound off by one)."""
    a = _dispatch_args(args, kw)
    idx = np.array(a["topk_idx"], copy=True)
    if idx.shape[1] > 1:
        idx[:, -1] = -1
    a["topk_idx"] = idx
    return correct(**a)


def _combine_adds_bias_twice(buf: Any, correct: Callable[..., Any], x: Any, handle: Any, topk_weights: Any = None,
                             bias: Any = None, **kw: Any) -> Any:
    """Adds the bias tensors twice."""
    if bias is not None and not isinstance(bias, tuple):
        bias = (bias, bias)
    return correct(x, handle, topk_weights, bias, **kw)


EP_DROPS_SLOT = standin("ep_drops_slot", ep=ep_port("ep_port_drops_slot", dispatch=_dispatch_drops_a_k_slot))
EP_BIAS_TWICE = standin("ep_bias_twice", ep=ep_port("ep_port_bias_twice", combine=_combine_adds_bias_twice))
