"""The range hook of MQA logits (docs/numerics.md, "The accumulator's range", "MQA logits").

A logit is ``s_j sum_h w_h relu(x_h)``: per head a float32 dot product ``x_h`` of ``head_dim``
products, then a weighted float32 (or bf16) head sum, then DeepGEMM's per-token KV scale
``s_j``.  The recorded error scale ``S = |s_j| sum_h |w_h| S_h`` is the weighted one, so a head
score that overflows (``x_h`` past ``acc_max`` while ``w_h`` is tiny), or an unscaled head sum
that overflows (``s_j`` tiny), is not visible in ``S`` and ``acc``.  For the mismatched elements
only, :func:`mqa_range` decodes the case's queries, keys, scales and weights (through the block
table for the paged kernel) from the kernel's own validated request and derives the classes a
correct device of range ``acc_max`` can produce:

* per head, from the products' positive and negative sums ``P_h``, ``N_h`` (``S_h = P_h + N_h``):
  the score can round to +inf where ``P_h + gamma_n S_h >= T_head`` and to -inf where
  ``N_h + gamma_n S_h >= acc_max``; ``T_head`` is ``acc_max / 2`` on sm100 with float32 weights
  (the kernel's ReLU is ``x + |x|``, which overflows at half the range), bf16's largest value
  where the data flow rounds the score to bf16 (ascend950, sm100 with bf16 weights), else
  ``acc_max``; a block-scaled dot product (FP4, DeepGEMM-Ascend FP8) whose block scale product
  reaches ``acc_max`` can give any class (``partial * inf``);
* a +inf score contributes ``inf * w_h``: +inf for ``w_h > 0``, -inf for ``w_h < 0``, NaN for
  ``w_h = 0``; a -inf score is clamped to 0 by ReLU except on sm100 with float32 weights, where
  ``x + |x|`` gives NaN; a NaN score (``inf - inf`` inside the dot product) gives NaN except on
  sm90 (``fmaxf(NaN, 0) = 0``);
* the head sum of the finite contributions (each score at most ``min(P_h + gamma_n S_h, T_head)``)
  reaches +overflow where its positive part plus ``gamma_n`` times its magnitude reaches
  ``T_sum`` (``T_head``'s rule), times ``max(1, s_j)`` since a device may scale before its last
  adds (sm90) or round the scaled value to bf16 (sm100 with bf16 weights); likewise -overflow;
* the KV scale keeps the classes (``s_j > 0``; ``inf * 0`` is NaN).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import ml_dtypes
import numpy as np

from ..attention.logits import LogitsRequest, requests_only
from ..attention.reduction import data_flow_roundings
from ..errors import DGArgumentError
from ..exact import gamma
from ..settings import numerics
from .call import fresh_outputs, quiet_float_errors, run_case_call
from .cases import ArgRef
from .emulator import emulator

__all__ = ["mqa_range", "mqa_request", "BF16_MAX"]

#: bfloat16's largest finite value (a finite value beyond it rounds to inf a little later: this
#: threshold errs toward allowing).
BF16_MAX = float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)


def mqa_request(entry: Mapping[str, Any], inputs: Mapping[str, Any]) -> LogitsRequest | None:
    """The validated request of an MQA case's call (nothing computed), or None where the call
    refuses its inputs."""
    try:
        with numerics(arch=entry["profile"]), quiet_float_errors(), requests_only() as got:
            tensors = dict(inputs)
            outs = fresh_outputs(entry["outputs"], tensors)
            run_case_call(emulator(), entry, [ArgRef.from_json(a) for a in entry["args"]],
                          {k: ArgRef.from_json(v) for k, v in entry.get("kwargs", {}).items()}, tensors, outs)
    except (DGArgumentError, KeyError, ValueError, TypeError):
        return None
    return got[-1] if got else None


def _head_reach(req: LogitsRequest, i: int, v: int, g: float, acc_max: float,
                t_head: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float | None,
                                        np.ndarray, np.ndarray]:
    """Per head of query row ``i`` against key ``v``: (+inf reachable, -inf reachable, any class
    reachable through a block scale product, the largest finite ReLU'd score), the KV scale, and
    per head the float64 dot product (IEEE: NaN / infinite inputs keep their class) and its error
    scale ``S_h``."""
    heads = req.heads
    qop = req.queries.operand(i, i + 1)
    keys = req.keys.get(v, v + 1)
    with np.errstate(over="ignore", invalid="ignore"):
        q = qop.rows(0, heads)  # (H, D) scaled, float64
        k = keys.operand.rows(0, 1)[0]
        t = q * k[None, :]
        x = np.sum(t, axis=1)
        t = np.where(np.isnan(t), 0.0, t)  # NaN inputs: their own class, not an overflow
        P = np.sum(np.where(t > 0, t, 0.0), axis=1)
        N = -np.sum(np.where(t < 0, t, 0.0), axis=1)
        slack = g * (P + N)
        up = P + slack >= t_head
        dn = N + slack >= acc_max
        big = np.zeros(heads, bool)
        if qop.scales is not None and keys.operand.scales is not None:
            d = q.shape[1]
            sq = qop.block_scales(0, heads, 32)
            sk = keys.operand.block_scales(0, 1, 32)
            nb = min(sq.shape[1], sk.shape[1], -(-d // 32))
            big = np.max(sq[:, :nb] * sk[:, :nb], axis=1) >= acc_max
        top = np.minimum(P + slack, t_head)
    kvs = None if keys.token_scale is None else float(keys.token_scale[0])
    return up, dn, big, top, kvs, x, P + N


def mqa_range(entry: Mapping[str, Any], golden: Mapping[str, np.ndarray], inputs: Mapping[str, Any],
              name: str) -> Any:
    """The range hook (:data:`.check.RangeHook`) of an MQA logits case (module docstring)."""
    if name != "logits" or "args" not in entry:
        return None
    cache: dict[str, LogitsRequest | None] = {}

    def hook(flat: np.ndarray, u_acc: float, n: int, acc_max: float) -> Any:
        if "req" not in cache:
            cache["req"] = mqa_request(entry, inputs)
        req = cache["req"]
        if req is None:
            return None
        rows, width = req.d.shape
        flow = data_flow_roundings(req.reduction, req.weights.dtype)
        relu_x_abs = req.reduction == "sm100" and flow.head_score is None  # ReLU as x + |x|
        if flow.head_score is not None:
            t_head = min(acc_max, BF16_MAX)
        elif relu_x_abs:
            t_head = acc_max / 2
        else:
            t_head = acc_max
        g = gamma(max(n, 1), u_acc, unbounded=True)
        plus = np.zeros(flat.shape, bool)
        minus = np.zeros(flat.shape, bool)
        nan = np.zeros(flat.shape, bool)
        alt_y = np.full(flat.shape, np.nan)
        alt_e = np.full(flat.shape, np.nan)
        g_alt = gamma(max(n, 1) + 2, u_acc, unbounded=True)
        w_all = np.asarray(req.weights, np.float64)
        for p, f in enumerate(flat.tolist()):
            i, c = divmod(int(f), width)
            if i >= rows:
                continue
            v = c + int(req.shift[i])
            if not int(req.ks[i]) <= v < int(req.ke[i]):
                continue  # outside the row's keys: the clean pass, no accumulator
            up, dn, big, top, kvs, x, s_h = _head_reach(req, i, v, g, acc_max, t_head)
            w = w_all[i]
            if req.reduction == "sm90" and np.isnan(x).any():
                y_alt, e_alt = _fmaxf_logit(x, s_h, w, kvs, g_alt)
                if np.isinf(y_alt):  # an infinite input among the other heads: its class
                    plus[p] |= y_alt > 0
                    minus[p] |= y_alt < 0
                else:
                    alt_y[p], alt_e[p] = y_alt, e_alt
            finite_w = np.isfinite(w)
            w0 = np.where(finite_w, w, 0.0)
            hp = (up | big) & finite_w
            c_plus = bool(np.any(hp & (w > 0)))
            c_minus = bool(np.any(hp & (w < 0)))
            c_nan = bool(np.any(hp & (w == 0)) or np.any(big))
            both = up & dn
            if relu_x_abs:
                c_nan |= bool(np.any(dn & finite_w))  # -inf + inf
            if req.reduction != "sm90":
                c_nan |= bool(np.any(both & finite_w))  # a NaN score passes ReLU
            with np.errstate(over="ignore", invalid="ignore"):
                pos = float(np.sum(np.where(w0 > 0, w0 * top, 0.0)))
                neg = float(np.sum(np.where(w0 < 0, -w0 * top, 0.0)))
                mag = (pos + neg) * g
                scale = 1.0 if kvs is None or not np.isfinite(kvs) else max(1.0, kvs)
                c_plus |= (pos + mag) * scale >= t_head
                c_minus |= (neg + mag) * scale >= t_head
            if kvs is not None and kvs == 0:
                c_nan |= c_plus or c_minus
            plus[p], minus[p], nan[p] = plus[p] | c_plus, minus[p] | c_minus, c_nan
        return plus, minus, nan, alt_y, alt_e

    return hook


def _fmaxf_logit(x: np.ndarray, s_h: np.ndarray, w: np.ndarray, kvs: float | None, g: float) -> tuple[float, float]:
    """sm90's logit where a head score is NaN (a NaN input, ``inf - inf``): ``fmaxf(NaN, 0) = 0``
    drops the head, so a correct device gives ``y' = s_j sum_h w_h max(x_h, 0)`` over the other
    heads (the golden, NaN-propagating, is NaN there).  Its float32 error is at most
    ``gamma_{n+2}(u_acc) S'`` with ``S' = |s_j| sum_h |w_h| S_h`` over those heads (each dot product
    errs by ``gamma_D S_h``, the weighted head sum and the scaling add ``gamma_{H+1}`` of
    ``|s_j| sum |w_h| max(x_h, 0) <= S'``); the float64 evaluation here errs by far less than the
    ``2^-20`` margin.  Returns ``(y', E')``: ``y'`` is +-inf where an infinite input among the
    other heads gives that class (IEEE), NaN where none is defined (``inf - inf``, NaN weights)."""
    keep = ~np.isnan(x)
    r = np.where(keep, np.maximum(np.where(keep, x, 0.0), 0.0), 0.0)
    scale = 1.0 if kvs is None else kvs
    with np.errstate(over="ignore", invalid="ignore"):
        y = float(np.sum(w * r)) * scale
        # a -inf score is 0 after ReLU, exactly: no error; +inf makes y' infinite
        s = float(np.sum(np.abs(w) * np.where(np.isfinite(x), s_h, 0.0))) * abs(scale)
        e = g * s * (1 + 2.0**-20) + 2.0**-1070
    if np.isinf(y):
        return y, float("nan")
    if not (np.isfinite(y) and np.isfinite(e)):
        return float("nan"), float("nan")
    return y, e
