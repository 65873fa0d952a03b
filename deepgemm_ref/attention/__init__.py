"""MQA logits for the lightning indexer: plain and paged, FP8 and FP4, DeepGEMM and DeepGEMM-Ascend.

Every public function is DeepGEMM's (profiles ``sm90``, ``sm100``) or, under the
``ascend950`` profile, DeepGEMM-Ascend's function of the same name, with that
target's parameters, defaults and accepted inputs.  The math, for query row ``i`` and key ``j``::

    logit[i, j] = s_j * sum_h  w[i, h] * relu( sum_d  q[i, h, d] * sq[i, h, d // 32] * k[j, d] * sk[j, d // 32] )

``q`` and ``k`` are the FP8 (E4M3) or FP4 (E2M1) element values, ``sq`` / ``sk`` their per-32 UE8M0
block scales (FP4 on DeepGEMM, both formats on DeepGEMM-Ascend; 1 otherwise), ``s_j`` DeepGEMM's
float32 per-token KV scale (FP8 mode; 1 otherwise) and ``w`` the float32 or bfloat16 weights.

Accumulation models (``deepgemm_ref.numerics(accumulation=...)``)
    ``exact`` (default): the exact real value of the whole logit, rounded once (RNE) to the output
    dtype.  ``fp32`` / ``limited(bits, interval)``: each head's dot product ``x_h`` is the core's
    float32 result in that model, then the head reduction follows the target's arithmetic:

    * sm100, float32 weights: two float2 accumulators A, B start at +0; heads 4u, 4u+1 go to A's
      lanes, 4u+2, 4u+3 to B's, u increasing; each step ``acc = fma(f32(x + |x|), w, acc)`` (one
      rounding); then ``(A.x + B.x) + (A.y + B.y)``, halved, times ``s_j`` in float32, cast.
    * sm100, bfloat16 weights: ``r = bf16(relu(x))``, the same lanes with fused bf16 FMAs, bf16
      lane adds, then ``bf16(reduced * bf16(s_j))``.
    * sm90: lane ``c`` (0..3), parity ``p``: ``acc = f32(relu(x_h) * w_h)`` for h = 2c + p, then
      ``acc = fma(relu(x_h), w_h, acc)`` for h = 8g + 2c + p, g = 1, 2, ... (nvcc contracts
      ``acc += a * b``); ``v_c = f32(f32(acc_even + acc_odd) * s_j)``; ``(v0 + v1) + (v2 + v3)``.
      ``relu`` is ``fmaxf(x, 0)`` (NaN gives 0).
    * ascend950: ``r_h = bf16(relu(x_h))`` (FIXPIPE), then ``acc = bf16(0)`` and for h = 0..H-1
      ``acc = bf16(acc + r_h * w_h)`` with one rounding per step (a fused multiply-accumulate;
      see ``ASCEND_BF16_MULA_FUSED``).

How the exact value is obtained (per task of ``rows x H`` query-heads and ``n`` keys)
    1. ``core.dot_products`` (the exact accumulator) gives every ``x_h`` in float64 with a rigorous bound
       ``err_h`` (0 when the core's exactness certificate holds: ``||q_h|| ||k_j|| <
       2^(53 + e_q + e_k)``, ``2^e`` the quantum of each row; DeepGEMM's FP8 mode, no Q/K scales
       and D <= 128, is always exact: |x| < 2^25 in steps of 2^-18).  No output rounding is
       spent on these intermediate values.
    2. ``T = sum_h w_h relu(acc_h)`` and ``A = sum_h |w_h| relu(acc_h)`` by one batched float64
       matmul; ``|T - exact| <= gamma_{H+2} A (+ sum_h |w_h| err_h)``; ``z = s_j T`` adds ``u |z|``.
    3. Every logit whose error interval ``[z - E, z + E]`` rounds to one output code is decided
       (RNE is monotone; :func:`deepgemm_ref.certified.round_certified`).  The others (exact
       ties, near-ties) are recomputed from the operands with Python ``Fraction`` s and rounded
       by ``formats.encode_scalar``.  The result is the
       correctly rounded exact value for every finite input; non-finite inputs follow IEEE
       arithmetic on the float64 evaluation (NaN propagates through relu).

Outputs
    Fresh allocations with the target's padded row stride; the returned logits are views
    (DeepGEMM 9.1 "Output allocation", 9.4; DeepGEMM-Ascend rows aligned to 256 elements).
    Elements the kernel leaves unspecified are NaN (outside ``[ks, ke)`` without cleaning,
    compressed-row tails, paged positions at or past a row's context length, the padding);
    with ``clean_logits`` the cleaned columns are ``-inf`` exactly where DeepGEMM writes ``-inf``.
    ``deepgemm_ref.trace.capture()`` reports a ``defined`` mask (and the float64 value ``acc`` and
    error scale ``S = |s_j| sum_h |w_h| sum_d |q_hd k_d| * scales`` on request) per call.

Rooms
    Every kernel reads check -> tasks -> execute.  :mod:`.cuda` and :mod:`.ascend`: each target's
    check step (argument contracts and translation into a request, for the profile the
    dispatcher hands the call); :mod:`.contracts`: the checks and device constants both share;
    :mod:`.keys`: plain and paged key sources; :mod:`.schedule`: the paged kernels' schedule
    metadata; :mod:`.reduction`: the device reduction models; :mod:`.logits`: the request, its
    tasks (the logits, then the clean pass as fills) through the executor, the exact logits and
    the outputs.

Memory is bounded: work is split into tasks of about ``2^21`` query-head x key products (about
60 MiB each, two in flight), so the peak is the output plus well under 256 MiB for any length
(plus, with ``clean_logits``, the clean pass's bool mask: one byte per output element).
"""

from __future__ import annotations

import sys
import types
from typing import Any

from ..api import profiled
from . import logits, reduction
from .ascend import _fp8_fp4_mqa_logits_ascend, _fp8_fp4_paged_mqa_logits_ascend
from .cuda import (
    _fp8_fp4_mqa_logits_cuda,
    _fp8_fp4_paged_mqa_logits_cuda,
    _fp8_mqa_logits_cuda,
    _fp8_paged_mqa_logits_cuda,
)
from .schedule import _get_paged_mqa_logits_metadata_ascend, _get_paged_mqa_logits_metadata_cuda

__all__ = [
    "fp8_fp4_mqa_logits",
    "fp8_mqa_logits",
    "get_paged_mqa_logits_metadata",
    "fp8_fp4_paged_mqa_logits",
    "fp8_paged_mqa_logits",
    "ASCEND_BF16_MULA_FUSED",
    "TASK_ELEMENTS",
]

_LEGACY_MISSING = {"deepgemm-ascend": "DeepGEMM-Ascend has no legacy MQA wrappers; use fp8_fp4_mqa_logits / "
                                      "fp8_fp4_paged_mqa_logits with int16 Q scales"}

fp8_fp4_mqa_logits = profiled("fp8_fp4_mqa_logits", deepgemm=_fp8_fp4_mqa_logits_cuda,
                              deepgemm_ascend=_fp8_fp4_mqa_logits_ascend)
fp8_mqa_logits = profiled("fp8_mqa_logits", _LEGACY_MISSING, deepgemm=_fp8_mqa_logits_cuda)
get_paged_mqa_logits_metadata = profiled("get_paged_mqa_logits_metadata",
                                         deepgemm=_get_paged_mqa_logits_metadata_cuda,
                                         deepgemm_ascend=_get_paged_mqa_logits_metadata_ascend)
fp8_fp4_paged_mqa_logits = profiled("fp8_fp4_paged_mqa_logits", deepgemm=_fp8_fp4_paged_mqa_logits_cuda,
                                    deepgemm_ascend=_fp8_fp4_paged_mqa_logits_ascend)
fp8_paged_mqa_logits = profiled("fp8_paged_mqa_logits", _LEGACY_MISSING, deepgemm=_fp8_paged_mqa_logits_cuda)

# The two tunables live in the rooms that read them; the package names read and set them there.
_KNOBS = {"ASCEND_BF16_MULA_FUSED": reduction, "TASK_ELEMENTS": logits}
ASCEND_BF16_MULA_FUSED: bool
TASK_ELEMENTS: int


class _Package(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name in _KNOBS:
            return getattr(_KNOBS[name], name)
        raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _KNOBS:
            setattr(_KNOBS[name], name, value)
        else:
            super().__setattr__(name, value)

    def __delattr__(self, name: str) -> None:
        if name not in _KNOBS:
            super().__delattr__(name)


sys.modules[__name__].__class__ = _Package
