"""DeepEP's combine reductions as pure functions (no transport): the kernel recipes and an exact variant.

A source token's result is built from bf16 rows in a fixed order (contract 8.2)::

    F = +0.0f;  F += float(bias0);  F += float(bias1);  F += float(term_j) for j = 0, 1, ...
    combined_x = bf16_RN(F)                               (every += a float32 rounding)

The terms depend on the recipe:

* ``"local"`` (reduce within each owner rank: DeepEP's non-hybrid combine, ``refs.combine``'s
  ``(True, False)``): one term per owner rank, in ascending order of the owner's *master slot*
  (its highest k); an owner with two or more slots contributes ``P_r = bf16(+0 + sum over its
  slots, ascending k, of float(y_k))``, an owner with one slot that row;
* ``"slots"`` (no intermediate reduction: ``allow_multiple_reduction=False``, ``(False, False)``):
  every valid slot row, ascending k;
* ``"hybrid"`` (``(True, True)``, golden only, contract 8.3): the ``"local"`` partials, then
  within each scale-out group (``owner // num_scaleup_ranks``) ``bf16(+0 + sum of the group's
  partials in master order)`` placed at the group's highest slot, then the final sum.

The legacy ``Buffer`` (contract 11.4, 11.6): :func:`rank_order_combine` (``F = bias0 + bias1``,
then the holding ranks' rows in ascending rank order; :func:`sum_pieces` with ``start="bias"``),
:func:`rank_order_weights`, and :func:`low_latency_combine_reference` (the float32 FMA chain
``acc = RN32(acc + y_k w_k)`` over the slots in top-k order, :func:`fma_f32`).

Masked slots (``topk_idx < 0``) contribute nothing.  Adding +0 to F changes nothing (F starts at
+0 and a round-to-nearest sum is -0 only when both addends are), so the buffers pad with zero rows.

:func:`combine_exact` is the exact variant: the same data flow and the same bf16 roundings of the
partials (each partial the exact sum of its members rounded once), and the final result the exact
sum of the biases and the terms rounded once to bf16, with the error scale ``S`` (the sum of the
magnitudes of every addend of every sum) for the checker's bound.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

from .. import formats as fm
from ..certified import FormatRounding, Points, round_certified
from ..dtypes import BF16, F32
from ..exact import dd_to_f64_round_odd, fraction_sum, two_sum

__all__ = [
    "Recipe",
    "RECIPES",
    "bf16_round",
    "sum_rows",
    "sum_pieces",
    "local_reduce",
    "slot_groups",
    "combine_reference",
    "combine_exact",
    "ExactCombine",
    "combined_weights",
    "sum_f32_pieces",
    "rank_order_combine",
    "rank_order_weights",
    "fma_f32",
    "low_latency_combine_reference",
]

Recipe = Literal["local", "slots", "hybrid"]
#: The recipes and DeepEP's ``refs.combine(..., reduce_in_local, reduce_in_scaleup)`` flags.
RECIPES: dict[str, tuple[bool, bool]] = {"local": (True, False), "slots": (False, False), "hybrid": (True, True)}


def bf16_round(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16, round to nearest even (NaN stays NaN, overflow gives inf)."""
    return np.asarray(x, F32).astype(BF16)


def _f32(rows: np.ndarray) -> np.ndarray:
    return rows.astype(F32)


# Note: F starts at +0 as in the kernels; refs.py starts at the bias sum (-0 only when every addend is -0).
def sum_rows(rows: np.ndarray, index: np.ndarray, bias0: np.ndarray | None = None,
             bias1: np.ndarray | None = None) -> np.ndarray:
    """``bf16(((+0 + bias0) + bias1) + rows[index[:, 0]] + rows[index[:, 1]] + ...)`` in float32.

    rows:  bf16 (n, H), the terms;  index: int (T, J), the rows of each token's terms in order,
    -1 for none;  bias0, bias1: bf16 (T, H) or None.  Returns bf16 (T, H).
    """
    owner = np.where(index >= 0, 0, -1)
    return sum_pieces([rows], owner, index, bias0, bias1)


def sum_pieces(pieces: list[np.ndarray], index_owner: np.ndarray, index_row: np.ndarray,
               bias0: np.ndarray | None = None, bias1: np.ndarray | None = None,
               start: Literal["zero", "bias"] = "zero") -> np.ndarray:
    """:func:`sum_rows` with the terms spread over several arrays (one per owner rank): term j of
    token t is ``pieces[index_owner[t, j]][index_row[t, j]]`` (owner -1: none).  Returns bf16 (T, H).

    start:  ``"zero"`` (the V2 kernels): ``F = ((+0 + bias0) + bias1)``; ``"bias"`` (the legacy
            intranode kernel): ``F = (bias0 or +0) + (bias1 or +0)``, one addition.  The two
            differ only when both biases are -0 (then ``"bias"`` starts at -0).

    A missing term is added as +0, which changes nothing when F cannot be -0 (``start="zero"``:
    a round-to-nearest sum is -0 only when both addends are -0); with ``start="bias"`` F can be
    -0, so missing terms are skipped, not added.
    """
    t_count, j_count = index_row.shape
    hdim = pieces[0].shape[1] if pieces else (bias0.shape[1] if bias0 is not None else 0)
    acc = np.zeros((t_count, hdim), F32)
    if start == "bias":
        if bias0 is not None:
            acc[...] = bias0  # exact widening
        np.add(acc, np.float32(0) if bias1 is None else bias1, out=acc, dtype=F32)
    else:
        for b in (bias0, bias1):
            if b is not None:
                np.add(acc, b, out=acc, dtype=F32)  # float32 addition of the exactly widened bf16 rows
    _accumulate(acc, pieces, index_owner, index_row, skip_missing=start == "bias")
    return bf16_round(acc)


def sum_f32_pieces(pieces: list[np.ndarray], index_owner: np.ndarray, index_row: np.ndarray,
                   width: int) -> np.ndarray:
    """A float32 running sum from +0 of the rows ``pieces[index_owner[t, j]][index_row[t, j]]``
    in ascending j (owner -1: none), each addition rounded to float32.  ``pieces``: float32
    arrays of ``width`` columns.  Returns float32 (T, width) (the legacy combine's weights)."""
    acc = np.zeros((index_row.shape[0], width), F32)
    _accumulate(acc, pieces, index_owner, index_row, skip_missing=False)
    return acc


def _accumulate(acc: np.ndarray, pieces: list[np.ndarray], index_owner: np.ndarray, index_row: np.ndarray,
                skip_missing: bool) -> None:
    """``acc += term_j`` in float32 for j = 0, 1, ... (in place); missing terms add +0, or are
    skipped with ``skip_missing``."""
    t_count, j_count = index_row.shape
    hdim = acc.shape[1]
    term = np.empty((t_count, hdim), pieces[0].dtype if pieces else BF16)
    for j in range(j_count):
        own = index_owner[:, j]
        have = own >= 0
        if not have.any():
            continue
        owners = np.unique(own[have])
        if owners.size == 1 and have.all():
            np.take(pieces[int(owners[0])], index_row[:, j], axis=0, out=term, mode="clip")
        else:
            if not have.all():
                term[~have] = 0
            for q in owners:
                at = np.flatnonzero(own == q)
                term[at] = pieces[int(q)][index_row[at, j]]
        if skip_missing and not have.all():
            np.add(acc, term, out=acc, dtype=F32, where=have[:, None])
        else:
            np.add(acc, term, out=acc, dtype=F32)


def local_reduce(rows: np.ndarray, index: np.ndarray) -> np.ndarray:
    """An owner rank's partial of each token: ``rows[index[n, j]]`` when the token has one slot
    here, else ``bf16(+0 + sum_j float(rows[index[n, j]]))`` in order (``index`` -1: none).

    rows: bf16 (m, H);  index: int (n, J).  Returns bf16 (n, H) (zero rows for tokens without slots).
    """
    n, j_count = index.shape
    out = np.zeros((n, rows.shape[1]), rows.dtype)
    count = (index >= 0).sum(axis=1)
    one = np.flatnonzero(count == 1)
    if one.size:
        first = index[one, np.argmax(index[one] >= 0, axis=1)]
        out[one] = rows[first]
    many = np.flatnonzero(count >= 2)
    if many.size:
        out[many] = sum_rows(rows, index[many])
    return out


def slot_groups(topk_idx: np.ndarray, num_experts: int, num_ranks: int, recipe: Recipe = "local",
                num_scaleup_ranks: int | None = None) -> list[np.ndarray]:
    """The grouping levels of a recipe: int64 (T, K) group ids per level (-1 for masked slots):
    ``[]`` for ``"slots"``, ``[owner]`` for ``"local"``, ``[owner, owner // U]`` for ``"hybrid"``."""
    if recipe not in RECIPES:
        raise ValueError(f"recipe: expected one of {sorted(RECIPES)}; got {recipe!r}")
    idx = np.asarray(topk_idx, np.int64)
    owner = np.where(idx >= 0, idx // (num_experts // num_ranks), -1)
    if recipe == "slots":
        return []
    if recipe == "local":
        return [owner]
    u = num_ranks if num_scaleup_ranks is None else num_scaleup_ranks
    return [owner, np.where(owner >= 0, owner // u, -1)]


def _segments(gid: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For group ids (T, K) (-1 masked): (order (T, K): the slots stably sorted by group, masked
    last; valid (T, K) in that order; last (T, K): position i closes its group)."""
    big = np.iinfo(np.int64).max
    key = np.where(gid >= 0, gid, big)
    order = np.argsort(key, axis=1, kind="stable")
    skey = np.take_along_axis(key, order, axis=1)
    valid = skey != big
    last = np.ones_like(valid)
    last[:, :-1] = skey[:, :-1] != skey[:, 1:]
    return order, valid, last & valid


def _reduce_level(y: np.ndarray, valid: np.ndarray, gid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One grouping level in float32 (``refs.combine``'s ``grouped_reduce``): each group's
    members summed from +0 in ascending k, the bf16 result placed at the group's highest slot."""
    gid = np.where(valid, gid, -1)
    order, svalid, last = _segments(gid)
    t_count, k_count, hdim = y.shape
    out = np.zeros_like(y)
    new_valid = np.zeros_like(valid)
    acc = np.zeros((t_count, hdim), F32)
    rows = np.arange(t_count)
    for i in range(k_count):
        k = order[:, i]
        v = svalid[:, i]
        acc[v] += _f32(y[rows[v], k[v]])
        close = last[:, i]
        out[rows[close], k[close]] = bf16_round(acc[close])
        new_valid[rows[close], k[close]] = True
        acc[close] = 0
    return out, new_valid


def _check_case(y: np.ndarray, topk_idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    y = np.asarray(y)
    idx = np.asarray(topk_idx, np.int64)
    if y.ndim != 3 or y.dtype != BF16 or idx.shape != y.shape[:2]:
        raise ValueError(f"y: expected bf16 (T, K, H) matching topk_idx (T, K); got {y.dtype} {y.shape}, "
                         f"topk_idx {idx.shape}")
    return y, idx


def _biases(bias: np.ndarray | tuple[np.ndarray, np.ndarray] | None) -> tuple[np.ndarray | None, np.ndarray | None]:
    if bias is None:
        return None, None
    if isinstance(bias, tuple):
        return bias[0], bias[1]
    return bias, None


def combine_reference(y: np.ndarray, topk_idx: np.ndarray, num_experts: int, num_ranks: int,
                      bias: np.ndarray | tuple[np.ndarray, np.ndarray] | None = None, recipe: Recipe = "local",
                      num_scaleup_ranks: int | None = None) -> np.ndarray:
    """The combined rows of one source rank, bitwise what DeepEP computes (contract 8.2, 8.3).

    y:        bf16 (T, K, H), the row each slot's expert produced (masked slots ignored);
    topk_idx: int (T, K), the source's routing (-1: none);
    bias:     None, bf16 (T, H), or a pair of them;
    recipe:   ``"local"``, ``"slots"`` or ``"hybrid"`` (the module docstring);
    num_scaleup_ranks: the scale-up group size of ``"hybrid"`` (ranks per scale-out group).

    Returns bf16 (T, H).  Equal to ``deep_ep.utils.refs.combine(y, topk_idx, num_ranks // U, U,
    num_experts, bias, *RECIPES[recipe])`` with masked slots of ``y`` zero (up to the sign of an
    all -0 sum, contract 16.1).
    """
    y, idx = _check_case(y, topk_idx)
    valid = idx >= 0
    for gid in slot_groups(idx, num_experts, num_ranks, recipe, num_scaleup_ranks):
        y, valid = _reduce_level(y, valid, gid)
    b0, b1 = _biases(bias)
    t_count, k_count = idx.shape
    flat = y.reshape(t_count * k_count, -1)
    index = np.where(valid, np.arange(t_count)[:, None] * k_count + np.arange(k_count), -1)
    return sum_rows(flat, index, b0, b1)


@dataclass(frozen=True)
class ExactCombine:
    """The exact variant's result for one source rank.

    y:   bf16 (T, H), the golden (the exact sum of the biases and the terms, rounded once);
    acc: float64 (T, H), the exact sum's nearest float64;
    S:   float64 (T, H), the sum of the magnitudes of every addend of every sum (biases, slot
         rows, rounded partials): the scale of a float32 accumulation's error.
    """

    y: np.ndarray
    acc: np.ndarray
    S: np.ndarray


def _exact_sums(values: Callable[[int], tuple[np.ndarray, np.ndarray]], count: int,
                shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(bf16 codes of the exact sums, nearest float64 sums, sum of |terms|) of ``count`` terms;
    ``values(j)`` returns the j-th term (float64 (n, H)) and its bool (n,) presence."""
    acc = np.zeros(shape)
    exact = np.ones(shape, bool)
    S = np.zeros(shape)
    terms = []
    with np.errstate(over="ignore", invalid="ignore"):
        for j in range(count):
            v, have = values(j)
            v = np.where(have[:, None], v, 0.0)
            terms.append(v)
            acc, e = two_sum(acc, v)
            exact &= e == 0
            S += np.abs(v)
    acc[acc == 0] = 0.0  # an exact zero sum is +0
    rounding = FormatRounding(fm.BF16)

    def fallback(at: Points) -> np.ndarray:
        codes = np.empty(at[0].size, np.uint16)
        for p, (r, c) in enumerate(zip(at[0].tolist(), at[1].tolist(), strict=True)):
            ex = fraction_sum(t[r, c] for t in terms)
            acc[r, c] = float(ex) + 0.0
            codes[p] = rounding.exact(ex)
        return codes

    bound = np.where(exact, 0.0, np.inf)
    codes, _ = round_certified(acc, bound, rounding, final=~np.isfinite(acc), fallback=fallback)
    return codes.view(BF16), acc, S * (1 + 2.0**-50)


def combine_exact(y: np.ndarray, topk_idx: np.ndarray, num_experts: int, num_ranks: int,
                  bias: np.ndarray | tuple[np.ndarray, np.ndarray] | None = None, recipe: Recipe = "local",
                  num_scaleup_ranks: int | None = None) -> ExactCombine:
    """The exact variant of :func:`combine_reference` (same arguments): every partial of the
    recipe is the exact sum of its members rounded once to bf16 (the data flow's roundings), and
    the result the exact sum of the biases and the terms, rounded once (:class:`ExactCombine`)."""
    y, idx = _check_case(y, topk_idx)
    t_count, k_count, hdim = y.shape
    valid = idx >= 0
    vals = y.astype(np.float64)
    S = np.zeros((t_count, hdim))
    rows = np.arange(t_count)
    for gid in slot_groups(idx, num_experts, num_ranks, recipe, num_scaleup_ranks):
        gid = np.where(valid, gid, -1)
        new = np.zeros_like(vals)
        new_valid = np.zeros_like(valid)
        for g in np.unique(gid[gid >= 0]):
            member = gid == g  # (T, K): group g of each token (tokens without it have none)
            tok = np.flatnonzero(member.any(axis=1))
            ks = [np.flatnonzero(member[t]) for t in tok]
            width = max(len(k) for k in ks)
            table = np.full((tok.size, width), -1)
            for i, k in enumerate(ks):
                table[i, :len(k)] = k
            def member(j: int, tok: np.ndarray = tok, table: np.ndarray = table,
                       vals: np.ndarray = vals) -> tuple[np.ndarray, np.ndarray]:
                return vals[tok, np.maximum(table[:, j], 0)], table[:, j] >= 0

            codes, _, s = _exact_sums(member, width, (tok.size, hdim))
            top = table.max(axis=1)
            new[tok, top] = codes.astype(np.float64)
            new_valid[tok, top] = True
            S[tok] += s
        vals, valid = new, new_valid
    b0, b1 = _biases(bias)
    biases = [b.astype(np.float64) for b in (b0, b1) if b is not None]
    everyone = np.ones(t_count, bool)

    def term(j: int) -> tuple[np.ndarray, np.ndarray]:
        if j < len(biases):
            return biases[j], everyone
        k = j - len(biases)
        return vals[rows, k], valid[:, k]

    codes, acc, s = _exact_sums(term, len(biases) + k_count, (t_count, hdim))
    return ExactCombine(y=codes, acc=acc, S=S + s)


def combined_weights(topk_weights: np.ndarray, topk_idx: np.ndarray) -> np.ndarray:
    """The weights a combine returns after a dispatch round trip: the dispatched weights, 0.0
    on masked slots (contract 6)."""
    return np.where(np.asarray(topk_idx) >= 0, np.asarray(topk_weights, F32), np.float32(0)).astype(F32)


# ----------------------------------------------------------------------------------------------
# the legacy Buffer's combines (contract 11.4, 11.6)
# ----------------------------------------------------------------------------------------------

def rank_order_combine(y: np.ndarray, present: np.ndarray,
                       bias: np.ndarray | tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """The legacy intranode combine of one source rank (contract 11.4), bitwise:
    ``F = float(bias0 or +0) + float(bias1 or +0)``, then ``F += float(y[t, q])`` for every rank
    q holding the token (``present[t, q]``) in ascending q, each addition a float32 rounding;
    ``combined_x[t] = bf16_RN(F)``.

    y: bf16 (T, R, H), the row each rank passed back for the token;  present: bool (T, R).
    Returns bf16 (T, H).
    """
    y = np.asarray(y)
    have = np.asarray(present, bool)
    t_count, num_ranks, hdim = y.shape
    rows = np.arange(t_count, dtype=np.int64)[:, None] * num_ranks + np.arange(num_ranks)
    order = np.argsort(~have, axis=1, kind="stable")  # holding ranks first, ascending
    width = int(have.sum(axis=1).max()) if t_count else 0
    index = np.take_along_axis(np.where(have, rows, -1), order, axis=1)[:, :width]
    b0, b1 = _biases(bias)
    return sum_pieces([y.reshape(t_count * num_ranks, hdim)], np.where(index >= 0, 0, -1), index, b0, b1,
                      start="bias")


def rank_order_weights(w: np.ndarray, present: np.ndarray) -> np.ndarray:
    """The legacy combine's ``combined_topk_weights`` (contract 11.4): ``0 + w[t, q]`` summed in
    float32 over the ranks q holding the token, ascending.  w: float32 (T, R, K).  Returns float32 (T, K)."""
    w = np.asarray(w, F32)
    have = np.asarray(present, bool)
    t_count, num_ranks, k_count = w.shape
    rows = np.arange(t_count, dtype=np.int64)[:, None] * num_ranks + np.arange(num_ranks)
    order = np.argsort(~have, axis=1, kind="stable")
    width = int(have.sum(axis=1).max()) if t_count else 0
    index = np.take_along_axis(np.where(have, rows, -1), order, axis=1)[:, :width]
    return sum_f32_pieces([w.reshape(t_count * num_ranks, k_count)], np.where(index >= 0, 0, -1), index, k_count)


def fma_f32(acc: np.ndarray, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The float32 fused multiply-add ``RN32(acc + x * w)`` with the exact product, elementwise
    (``acc``, ``w`` float32; ``x`` bf16 or float32; broadcasting).

    A bf16 x float32 product has at most 8 + 24 significant bits, so the float64 product is exact
    (no overflow or underflow either: |x w| lies in [2^-282, 2^256]).  The sum is then exact as a
    float64 pair (TwoSum), rounded to float64 with round-to-odd and from there to float32 with
    round-to-nearest-even: round-to-odd at p + 29 bits followed by RN at p bits is the correct
    rounding of the pair (it cannot land on a float32 midpoint unless the pair is one), so there is
    no double rounding.  Non-finite values follow IEEE (inf * 0 and inf - inf give NaN).
    A float32 ``x`` must have at most 29 significant bits for the product to be exact (any float32
    value times a bf16 one, or a bf16 value times a float32 one, qualifies).
    """
    p = np.asarray(x).astype(np.float64) * np.asarray(w, F32).astype(np.float64)
    a = np.asarray(acc, F32).astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        s, e = two_sum(a, p)
        e = np.where(np.isfinite(s), e, 0.0)
        r = dd_to_f64_round_odd(s, e)
        return r.astype(F32)


def low_latency_combine_reference(y: np.ndarray, topk_idx: np.ndarray, topk_weights: np.ndarray,
                                  skip: np.ndarray | None = None) -> np.ndarray:
    """The legacy low-latency combine of one source rank (contract 11.6), bitwise: ``acc = +0``,
    then for k ascending with ``topk_idx[t, k] >= 0`` (and not ``skip[t, k]``: a masked owner)
    ``acc = RN32(acc + float(y[t, k]) * w[t, k])`` (:func:`fma_f32`, nvcc's contraction of
    ``acc += x * w``); ``combined_x = bf16_RN(acc)``.

    y: bf16 (T, K, H), the row each slot's expert returned;  topk_idx: int (T, K);
    topk_weights: float32 (T, K);  skip: bool (T, K) or None.  Returns bf16 (T, H).
    """
    y = np.asarray(y)
    idx = np.asarray(topk_idx, np.int64)
    w = np.asarray(topk_weights, F32)
    use = idx >= 0
    if skip is not None:
        use &= ~np.asarray(skip, bool)
    t_count, k_count, hdim = y.shape
    acc = np.zeros((t_count, hdim), F32)
    for k in range(k_count):
        at = np.flatnonzero(use[:, k])
        if at.size:
            acc[at] = fma_f32(acc[at], y[at, k], w[at, k][:, None])
    return bf16_round(acc)
