"""DeepEP's dispatch layout as pure functions of the routing (no transport, no buffer).

Notation: R ranks, E experts, ``E_l = E / R`` experts per rank, K top-k slots, A the expert
alignment, ``T_max`` the tokens per rank the global index is built with, ``align(a, b) =
ceil(a / b) * b``.  A slot ``(s, t, k)`` (source rank, token, slot) is *valid* when
``topk_idx[s][t, k] >= 0``; its expert ``e`` lives on the owner rank ``e // E_l`` as local expert
``e - owner * E_l``.

For a destination rank r (contract 3, 5.2 - 5.4)::

    g(s, t)        = s * T_max + t                         src_token_global_idx
    received       = the tokens (s, t) with a valid slot on r, once each, ascending in g
                     (the canonical order: source rank, then token)          -> N rows
    master[n]      = the highest k of received token n whose expert is on r
    c_e            = #{(s, t, k) : topk_idx[s][t, k] == r * E_l + e}     (unaligned count)
    S_e            = sum_{j < e} align(c_j, A);   M = sum_e align(c_e, A)
    slot_row[n, k] = S_e + #{received n' < n that selected e}   if slot k of n is local expert e
                     -1                                           otherwise
    psum_rank[s]   = sum_{q <= s} #{tokens received from q}              (inclusive)
    psum_expert    = inclusive prefix sum of align(c_e, A)               (non-expanded layout)
                     S_e + c_e                                            (expanded layout)

Everything is a function of the routing alone, so one destination's layout
(:func:`recv_layout`, from the rows it received) and every rank's layout at once
(:func:`case_layouts`, from every rank's ``topk_idx``: what the golden workflow calls) are the
same arrays.  The buffers' dispatch is: check, exchange the rows of :func:`send_plan` through the
transport, then assemble with :func:`recv_layout`, :func:`expand_rows` and :func:`metadata`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..exact import align

__all__ = [
    "SendPlan",
    "RecvLayout",
    "owners",
    "send_plan",
    "recv_layout",
    "case_layouts",
    "worst_case_rows",
    "gather_rows",
    "expand_rows",
    "metadata",
    "metadata_columns",
]


def owners(topk_idx: np.ndarray, experts_per_rank: int) -> np.ndarray:
    """The owner rank of every slot: ``topk_idx // E_l`` for valid slots, -1 for the others (int64)."""
    idx = np.asarray(topk_idx, np.int64)
    return np.where(idx >= 0, idx // experts_per_rank, -1)


@dataclass(frozen=True)
class SendPlan:
    """What one source rank sends (contract 3: a token goes once to every rank owning one of its experts).

    owner:   int64 (T, K), the owner rank of each slot (-1: no selection).
    tokens:  R int64 arrays, ``tokens[d]`` = the tokens with a valid slot on rank d, ascending.
    master:  int64 (T, R), the highest k whose expert is on rank d (-1: none).
    """

    owner: np.ndarray
    tokens: list[np.ndarray]
    master: np.ndarray

    @property
    def counts(self) -> np.ndarray:
        """int64 (R,): tokens sent to each rank."""
        return np.array([t.size for t in self.tokens], np.int64)


def send_plan(topk_idx: np.ndarray, num_experts: int, num_ranks: int) -> SendPlan:
    """The :class:`SendPlan` of one source rank's ``topk_idx`` (T, K)."""
    idx = np.asarray(topk_idx, np.int64)
    t_count, k_count = idx.shape
    owner = owners(idx, num_experts // num_ranks)
    master = np.full((t_count, num_ranks), -1, np.int64)
    rows = np.arange(t_count)
    for k in range(k_count):  # ascending k: the last write of a (token, rank) is its highest slot
        valid = owner[:, k] >= 0
        master[rows[valid], owner[valid, k]] = k
    tokens = [np.flatnonzero(master[:, d] >= 0) for d in range(num_ranks)]
    return SendPlan(owner=owner, tokens=tokens, master=master)


@dataclass(frozen=True)
class RecvLayout:
    """Destination rank ``rank``'s layout of the received tokens (canonical order, CPU sync).

    src_global:  int64 (N,), ``g`` of each received token, ascending.
    topk_global: int64 (N, K), the received tokens' expert ids as their source sent them.
    local_idx:   int64 (N, K), the local expert of each slot on this rank, -1 elsewhere
                 (``recv_topk_idx``).
    master:      int64 (N,), the highest local slot of each token.
    per_rank:    int64 (R,), tokens received from each source rank.
    counts:      int64 (E_l,), ``c_e``.
    slot_row:    int64 (N, K), the expanded row of each local slot, -1 elsewhere.
    """

    rank: int
    num_ranks: int
    num_experts: int
    num_max_tokens_per_rank: int
    alignment: int
    src_global: np.ndarray
    topk_global: np.ndarray
    local_idx: np.ndarray
    master: np.ndarray
    per_rank: np.ndarray
    counts: np.ndarray
    slot_row: np.ndarray

    @property
    def num_recv_tokens(self) -> int:
        """N."""
        return int(self.src_global.size)

    @property
    def num_topk(self) -> int:
        return int(self.local_idx.shape[1])

    @property
    def aligned_counts(self) -> np.ndarray:
        """int64 (E_l,): ``align(c_e, A)``."""
        a = self.alignment
        return (self.counts + a - 1) // a * a

    @property
    def starts(self) -> np.ndarray:
        """int64 (E_l,): ``S_e``, the first expanded row of each local expert."""
        return np.concatenate([[0], np.cumsum(self.aligned_counts)[:-1]]).astype(np.int64)

    @property
    def num_expanded_tokens(self) -> int:
        """M = sum_e align(c_e, A)."""
        return int(self.aligned_counts.sum())

    @property
    def psum_rank(self) -> np.ndarray:
        """int64 (R,): inclusive prefix sum of the tokens received from each rank."""
        return np.cumsum(self.per_rank).astype(np.int64)

    def psum_expert(self, expand: bool) -> np.ndarray:
        """int64 (E_l,): ``cumsum(align(c_e, A))`` (non-expanded) or ``S_e + c_e`` (expanded)."""
        if expand:
            return (self.starts + self.counts).astype(np.int64)
        return np.cumsum(self.aligned_counts).astype(np.int64)

    @property
    def src_rank(self) -> np.ndarray:
        """int64 (N,): the source rank of each received token."""
        return self.src_global // self.num_max_tokens_per_rank

    @property
    def src_token(self) -> np.ndarray:
        """int64 (N,): the source-local index of each received token."""
        return self.src_global % self.num_max_tokens_per_rank


def recv_layout(topk_global: np.ndarray, src_global: np.ndarray, rank: int, num_ranks: int, num_experts: int,
                num_max_tokens_per_rank: int, alignment: int) -> RecvLayout:
    """The layout of rank ``rank`` from the rows it received, ``topk_global`` (N, K) and their
    ``src_global`` (N,), already in canonical order (ascending ``src_global``)."""
    e_l = num_experts // num_ranks
    topk = np.asarray(topk_global, np.int64)
    src = np.asarray(src_global, np.int64)
    n, k_count = topk.shape
    lo = rank * e_l
    local = (topk >= lo) & (topk < lo + e_l)
    local_idx = np.where(local, topk - lo, -1)
    ks = np.arange(k_count, dtype=np.int64)
    master = np.where(local, ks, -1).max(axis=1, initial=-1)
    per_rank = np.bincount(src // num_max_tokens_per_rank, minlength=num_ranks).astype(np.int64)
    flat_e = local_idx.ravel()
    valid = np.flatnonzero(flat_e >= 0)  # (n, k) row-major: ascending token, then slot
    counts = np.bincount(flat_e[valid], minlength=e_l).astype(np.int64)
    aligned = (counts + alignment - 1) // alignment * alignment
    starts = np.concatenate([[0], np.cumsum(aligned)[:-1]]).astype(np.int64)
    # Within an expert, slots in ascending token order: a stable sort of the valid (token, slot)
    # pairs by expert keeps their token order (a token selects an expert at most once).
    order = valid[np.argsort(flat_e[valid], kind="stable")]
    ex = flat_e[order]
    first = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    slot_flat = np.full(n * k_count, -1, np.int64)
    slot_flat[order] = starts[ex] + (np.arange(order.size, dtype=np.int64) - first[ex])
    return RecvLayout(rank=rank, num_ranks=num_ranks, num_experts=num_experts,
                      num_max_tokens_per_rank=num_max_tokens_per_rank, alignment=alignment,
                      src_global=src, topk_global=topk, local_idx=local_idx, master=master, per_rank=per_rank,
                      counts=counts, slot_row=slot_flat.reshape(n, k_count))


def case_layouts(topk_idx: Sequence[np.ndarray], num_experts: int, num_max_tokens_per_rank: int,
                 alignment: int = 1) -> list[RecvLayout]:
    """Every rank's :class:`RecvLayout` at once from every rank's ``topk_idx`` (rank order): the
    dispatch layout of a whole case, as the buffers compute it rank by rank."""
    num_ranks = len(topk_idx)
    plans = [send_plan(np.asarray(t, np.int64), num_experts, num_ranks) for t in topk_idx]
    out = []
    for d in range(num_ranks):
        rows = [np.asarray(topk_idx[s], np.int64)[plans[s].tokens[d]] for s in range(num_ranks)]
        src = [s * num_max_tokens_per_rank + plans[s].tokens[d] for s in range(num_ranks)]
        k_count = np.shape(topk_idx[0])[1] if num_ranks else 0
        out.append(recv_layout(np.concatenate(rows) if rows else np.zeros((0, k_count), np.int64),
                               np.concatenate(src).astype(np.int64), d, num_ranks, num_experts,
                               num_max_tokens_per_rank, alignment))
    return out


def worst_case_rows(num_ranks: int, num_max_tokens_per_rank: int, num_topk: int, experts_per_rank: int,
                    alignment: int, expand: bool) -> int:
    """Rows allocated without CPU sync (contract 5.5): ``R * T_max``, or expanded
    ``align(R * T_max * min(K, E_l) + (A - 1) * E_l, A)``."""
    if not expand:
        return num_ranks * num_max_tokens_per_rank
    rows = num_ranks * num_max_tokens_per_rank * min(num_topk, experts_per_rank) + (alignment - 1) * experts_per_rank
    return align(rows, alignment)


def gather_rows(per_rank: Sequence[np.ndarray], layout: RecvLayout) -> np.ndarray:
    """The received rows of a layout from every rank's rows (rank order): ``out[n] =
    per_rank[src_rank[n]][src_token[n]]`` (x, its scale factors, weights, ...; the golden's dispatch)."""
    parts = [np.asarray(per_rank[s])[layout.src_token[layout.src_rank == s]] for s in range(layout.num_ranks)]
    return np.concatenate(parts) if parts else np.asarray(per_rank[0])[:0]


def expand_rows(rows: np.ndarray, layout: RecvLayout, num_rows: int, slot_row: np.ndarray | None = None) -> np.ndarray:
    """The expanded copy of per-token ``rows`` (N, ...): ``out[slot_row[n, k]] = rows[n]`` for
    every local slot; the other rows (alignment padding, the tail without CPU sync) are zero bytes.
    ``slot_row`` defaults to the layout's (a cached dispatch passes the handle's)."""
    sr = layout.slot_row if slot_row is None else slot_row
    out = np.zeros((num_rows,) + rows.shape[1:], rows.dtype)
    n_idx, k_idx = np.nonzero(sr >= 0)
    out[sr[n_idx, k_idx]] = rows[n_idx]
    return out


def metadata_columns(num_topk: int, ascend: bool) -> tuple[int, int, slice]:
    """(column of ``src_token_global_idx``, column of the master slot, the slot columns) of
    ``recv_src_metadata`` (N, K + 2): DeepEP puts the source index first, then
    ``src_rank * K + master``, then the expanded slots (contract 5.4); DeepEP-Ascend puts the
    expanded slots first, then the source index, then the master slot itself (contract 13.5)."""
    if ascend:
        return num_topk, num_topk + 1, slice(0, num_topk)
    return 0, 1, slice(2, 2 + num_topk)


def metadata(layout: RecvLayout, expand: bool, ascend: bool, num_rows: int) -> np.ndarray:
    """``recv_src_metadata`` int32 (num_rows, K + 2) of a layout; rows past N are -1, and so are
    the slot columns of a non-expanded layout (never written on the device, contract 5.4)."""
    k_count = layout.num_topk
    n = layout.num_recv_tokens
    src_col, master_col, slots = metadata_columns(k_count, ascend)
    out = np.full((num_rows, k_count + 2), -1, np.int32)
    out[:n, src_col] = layout.src_global
    out[:n, master_col] = layout.master if ascend else layout.src_rank * k_count + layout.master
    if expand:
        out[:n, slots] = layout.slot_row
    return out
