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

The legacy ``Buffer`` (contract 11) adds :func:`dispatch_layout` (``get_dispatch_layout``), the
intranode kernels' channel bookkeeping (:func:`channel_prefix_matrix`, :func:`send_head`,
:func:`rank_prefix_matrix`) and the low-latency packed layout (:func:`low_latency_messages`,
:func:`packed_layout`, :func:`case_packed_layouts`): one message per valid (token, expert) slot,
inside each local expert the source ranks' blocks in ascending order, each block's tokens ascending.
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
    "NUM_MAX_NVL_PEERS",
    "DispatchLayout",
    "dispatch_layout",
    "channel_ranges",
    "channel_prefix_matrix",
    "send_head",
    "rank_prefix_matrix",
    "PackedLayout",
    "low_latency_messages",
    "packed_layout",
    "case_packed_layouts",
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


# ----------------------------------------------------------------------------------------------
# the legacy Buffer's layouts (contract 11): intranode dispatch and the low-latency packed layout
# ----------------------------------------------------------------------------------------------

#: NVLink peers of one host in the legacy kernels (ranks per RDMA rank).
NUM_MAX_NVL_PEERS = 8


@dataclass(frozen=True)
class DispatchLayout:
    """``Buffer.get_dispatch_layout`` of one rank's ``topk_idx`` (T, K) (contract 11.2).

    num_tokens_per_rank:      int32 (R,), tokens with at least one expert on each rank.
    num_tokens_per_rdma_rank: int32 (R / 8,), tokens with at least one expert on each group of 8
                              ranks (an RDMA rank), or None for R <= 8 (one host).
    num_tokens_per_expert:    int32 (E,), selections of each expert (slots, not tokens).
    is_token_in_rank:         bool (T, R).
    """

    num_tokens_per_rank: np.ndarray
    num_tokens_per_rdma_rank: np.ndarray | None
    num_tokens_per_expert: np.ndarray
    is_token_in_rank: np.ndarray


def dispatch_layout(topk_idx: np.ndarray, num_experts: int, num_ranks: int) -> DispatchLayout:
    """The :class:`DispatchLayout` of ``topk_idx`` (T, K) int (-1: no selection, ids < E)."""
    idx = np.asarray(topk_idx, np.int64)
    t_count = idx.shape[0]
    owner = owners(idx, num_experts // num_ranks)
    in_rank = np.zeros((t_count, num_ranks), bool)
    ti, ki = np.nonzero(owner >= 0)
    in_rank[ti, owner[ti, ki]] = True
    per_rank = in_rank.sum(axis=0).astype(np.int32)
    per_rdma = None
    if num_ranks > NUM_MAX_NVL_PEERS:
        groups = in_rank.reshape(t_count, num_ranks // NUM_MAX_NVL_PEERS, NUM_MAX_NVL_PEERS)
        per_rdma = groups.any(axis=2).sum(axis=0).astype(np.int32)
    per_expert = np.bincount(idx[idx >= 0], minlength=num_experts).astype(np.int32)
    return DispatchLayout(per_rank, per_rdma, per_expert, in_rank)


def channel_ranges(num_tokens: int, num_channels: int) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) int64 (C,) of the token ranges of the legacy kernels' channels: channel c takes
    ``[min(c n, T), min(c n + n, T))`` with ``n = ceil(T / C)``."""
    per = -(-num_tokens // num_channels) if num_channels else 0
    starts = np.minimum(np.arange(num_channels, dtype=np.int64) * per, num_tokens)
    return starts, np.minimum(starts + per, num_tokens)


def channel_prefix_matrix(is_token_in_rank: np.ndarray, num_channels: int) -> np.ndarray:
    """int32 (R, C): for destination d, the tokens sent to d by channels 0..c (inclusive prefix),
    each channel a :func:`channel_ranges` range of this rank's tokens."""
    sent = np.asarray(is_token_in_rank, bool)
    t_count, num_ranks = sent.shape
    starts, ends = channel_ranges(t_count, num_channels)
    csum = np.concatenate([np.zeros((1, num_ranks), np.int64), np.cumsum(sent, axis=0, dtype=np.int64)])
    per_channel = csum[ends] - csum[starts]  # (C, R)
    return np.ascontiguousarray(np.cumsum(per_channel, axis=0).T, dtype=np.int32)


def send_head(is_token_in_rank: np.ndarray, num_channels: int) -> np.ndarray:
    """int32 (T, R): for a token sent to rank d, how many tokens of its channel were sent to d
    before it (the slot the legacy kernel records); -1 for tokens not sent to d."""
    sent = np.asarray(is_token_in_rank, bool)
    t_count = sent.shape[0]
    starts, _ = channel_ranges(t_count, num_channels)
    csum = np.cumsum(sent, axis=0, dtype=np.int64) - sent  # tokens sent before t (exclusive)
    per = -(-t_count // num_channels) if num_channels else 1
    channel = np.arange(t_count, dtype=np.int64) // max(per, 1)
    base = np.concatenate([np.zeros((1, sent.shape[1]), np.int64), np.cumsum(sent, axis=0, dtype=np.int64)])
    before = csum - base[starts[channel]]
    return np.where(sent, before, -1).astype(np.int32)


def rank_prefix_matrix(counts: np.ndarray) -> np.ndarray:
    """int32 (R, R): ``[i, j]`` = tokens sent to rank j by ranks 0..i, from ``counts[s, d]``
    (tokens rank s sends to rank d)."""
    return np.cumsum(np.asarray(counts, np.int64), axis=0).astype(np.int32)


@dataclass(frozen=True)
class PackedLayout:
    """Destination rank ``rank``'s low-latency packed layout (contract 11.5), canonical: inside
    each local expert the blocks of the source ranks in ascending order, each block's tokens
    ascending.

    expert, src_rank, src_token, row:  int64 (n,), one entry per received (token, expert) message:
        the local expert, the source rank and token, and the message's row in the expert's block.
    counts:  int64 (E_l, R), messages of each source for each local expert (0 from a masked rank).
    """

    rank: int
    num_ranks: int
    num_experts: int
    num_max_tokens_per_rank: int
    expert: np.ndarray
    src_rank: np.ndarray
    src_token: np.ndarray
    row: np.ndarray
    counts: np.ndarray

    @property
    def begins(self) -> np.ndarray:
        """int64 (E_l, R): the first row of each source's block."""
        return (np.cumsum(self.counts, axis=1) - self.counts).astype(np.int64)

    @property
    def recv_count(self) -> np.ndarray:
        """int32 (E_l,): ``packed_recv_count``."""
        return self.counts.sum(axis=1).astype(np.int32)

    @property
    def layout_range(self) -> np.ndarray:
        """int64 (E_l, R): ``(begin << 32) | count``."""
        return (self.begins << 32) | self.counts

    def src_info(self) -> np.ndarray:
        """int32 (E_l, R * T_max): the source token of each packed row, -1 past the received rows."""
        e_l = self.counts.shape[0]
        out = np.full((e_l, self.num_ranks * self.num_max_tokens_per_rank), -1, np.int32)
        out[self.expert, self.row] = self.src_token
        return out


def low_latency_messages(topk_idx: np.ndarray, num_experts: int, num_ranks: int,
                         skip: np.ndarray | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
    """What one source rank sends in a low-latency dispatch: for each destination d,
    ``(local expert, token)`` int64 arrays of every valid slot whose expert lives on d, ordered
    by expert then token (one message per slot).  ``skip`` (R,) bool: destinations sent nothing
    (masked ranks)."""
    idx = np.asarray(topk_idx, np.int64)
    e_l = num_experts // num_ranks
    ti, ki = np.nonzero(idx >= 0)
    e = idx[ti, ki]
    order = np.lexsort((ti, e))  # by global expert (so by destination, then local expert), then token
    e, ti = e[order], ti[order]
    dest = e // e_l
    out = []
    for d in range(num_ranks):
        sel = dest == d
        if skip is not None and skip[d]:
            sel[:] = False
        out.append(((e[sel] - d * e_l).astype(np.int64), ti[sel].astype(np.int64)))
    return out


def packed_layout(received: list[tuple[np.ndarray, np.ndarray]], rank: int, num_ranks: int, num_experts: int,
                  num_max_tokens_per_rank: int) -> PackedLayout:
    """Rank ``rank``'s :class:`PackedLayout` from ``received[s] = (local expert, token)``, the
    messages of source s (:func:`low_latency_messages` of s for this rank; empty if masked).
    The entries keep the order of ``received`` (source after source, each in its given order)."""
    e_l = num_experts // num_ranks
    counts = np.zeros((e_l, num_ranks), np.int64)
    for s, (ex, _) in enumerate(received):
        counts[:, s] = np.bincount(ex, minlength=e_l)
    begins = np.cumsum(counts, axis=1) - counts
    experts, srcs, toks, rows = [], [], [], []
    for s, (ex, tok) in enumerate(received):
        ex, tok = np.asarray(ex, np.int64), np.asarray(tok, np.int64)
        order = np.lexsort((tok, ex))  # inside an expert, tokens ascending
        first = np.concatenate([[0], np.cumsum(np.bincount(ex, minlength=e_l))[:-1]]).astype(np.int64)
        row = np.empty(ex.size, np.int64)
        row[order] = begins[ex[order], s] + np.arange(ex.size, dtype=np.int64) - first[ex[order]]
        experts.append(ex)
        srcs.append(np.full(ex.size, s, np.int64))
        toks.append(tok)
        rows.append(row)

    def cat(parts: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)

    return PackedLayout(rank=rank, num_ranks=num_ranks, num_experts=num_experts,
                        num_max_tokens_per_rank=num_max_tokens_per_rank, expert=cat(experts), src_rank=cat(srcs),
                        src_token=cat(toks), row=cat(rows), counts=counts)


def case_packed_layouts(topk_idx: Sequence[np.ndarray], num_experts: int, num_max_tokens_per_rank: int,
                        masked: np.ndarray | None = None) -> list[PackedLayout]:
    """Every rank's :class:`PackedLayout` from every rank's ``topk_idx`` (rank order).
    ``masked`` (R, R) bool: ``masked[d, s]`` - rank d receives nothing from rank s (a masked
    pair; pass it symmetric, as the buffers resolve it)."""
    num_ranks = len(topk_idx)
    sent = [low_latency_messages(t, num_experts, num_ranks) for t in topk_idx]
    out = []
    for d in range(num_ranks):
        received = []
        for s in range(num_ranks):
            ex, tok = sent[s][d]
            if masked is not None and masked[d, s]:
                ex, tok = ex[:0], tok[:0]
            received.append((ex, tok))
        out.append(packed_layout(received, d, num_ranks, num_experts, num_max_tokens_per_rank))
    return out
