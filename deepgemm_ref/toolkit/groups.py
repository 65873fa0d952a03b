"""Grouped layouts: m_indices, psum END offsets (along M or K), masked row counts, k-grouped sizes.

Each parser validates one layout argument as the kernels read it and returns the groups it
defines; the kernels then build one task per group.  ``alignment`` is the contiguous-layout
alignment in force (``get_mk_alignment_for_contiguous_layout()``; 256 under DeepGEMM-Ascend).

* **m_indices** (DeepGEMM, ``use_psum_layout=False``): int32 (M,), row r belongs to group
  ``m_indices[r]``, -1 marks a padding row; every block of ``alignment`` rows holds rows of one
  group followed by -1 rows (the kernels read a block's group from its first row).
* **psum** (:func:`psum_ranges`): int32 (G,) cumulative END offsets; group g owns
  ``[start_g, end_g)`` with ``start_0 = 0``, ``start_g = align(end_{g-1}, alignment)``
  (:func:`psum_starts`); ``[end_g, align(end_g, alignment))`` is the group's gap.  The same rule
  places m-grouped rows, k-grouped K ranges, the SF packers' valid rows and Mega MoE's dispatch.
* **masked** (DeepGEMM): int32 (G,), ``0 <= masked_m[g] <= MAX_M`` valid rows per group.
* **k-grouped sizes**: DeepGEMM's per-group K sizes (``ks_cpu`` == ``grouped_layout``, each a
  multiple of the alignment, groups back to back) or psum END offsets along K.

The padding policy of the m-grouped layouts is part of what they return (:class:`RowGroups`):
which rows the contract defines and which receive +0.0 (see :mod:`deepgemm_ref.grouped`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import arg_error
from ..exact import align, ceil_div

__all__ = [
    "RowGroups",
    "KGroups",
    "psum_starts",
    "psum_ranges",
    "psum_row_mask",
    "ascend_gap_mask",
    "m_indices_layout",
    "psum_layout",
    "masked_rows",
    "k_groups_cuda",
    "k_groups_ascend",
    "psum_gap_scale_rows",
    "psum_gap_scale_blocks",
]


@dataclass
class RowGroups:
    """A validated m-grouped layout: the defined row runs, the rows zero-filled, the gap rows.

    runs:    (group, r0, r1): rows [r0, r1) of d computed with B[group].
    defined: bool (M,), True on the rows the contract defines.
    zero:    bool (M,), the rows that receive +0.0 (the padding policy).
    ends:    the psum END offsets (int64), None for m_indices.
    """

    runs: list[tuple[int, int, int]]
    defined: np.ndarray
    zero: np.ndarray
    ends: np.ndarray | None = None


@dataclass
class KGroups:
    """Validated K groups: per group (first K row, end K row); real sizes k1 - k0; the K extent."""

    ranges: list[tuple[int, int]]
    sum_k: int


# ----------------------------------------------------------------------------------------------
# psum END offsets
# ----------------------------------------------------------------------------------------------

def psum_starts(ends: Sequence[int], alignment: int) -> list[int]:
    """Group starts of psum END offsets: ``start_0 = 0``, ``start_g = align(end_{g-1}, alignment)``."""
    return [0] + [align(int(e), alignment) for e in list(ends)[:-1]] if len(ends) else []


def psum_ranges(func: str, arg: str, ends: np.ndarray, alignment: int, extent: int, *, extent_name: str,
                allow_empty: bool = False, what: str = "increasing end offsets") -> list[tuple[int, int]]:
    """``[start_g, end_g)`` of every group of psum END offsets, validated.

    ends: int64 (G,).  Every end must be non-negative, at least its group's aligned start (or,
    with ``allow_empty`` (DeepGEMM-Ascend), equal to the previous end: an empty group after a
    non-aligned end, returned as ``(end, end)``), and at most ``extent`` (``extent_name`` says
    what it is in the error).
    """
    # Note: neither target checks the end offsets (a group ending before its aligned start
    # underflows the kernels' block count); such layouts and ends past the extent raise here.
    values = ends.tolist()
    if any(e < 0 for e in values):
        raise arg_error(func, arg, "non-negative end offsets", repr(values))
    out: list[tuple[int, int]] = []
    prev = 0
    for g, end in enumerate(values):
        start = align(prev, alignment) if g else 0
        if end < start:
            if not (allow_empty and end == prev):
                raise arg_error(func, arg, f"{what} with end[g] >= align(end[g-1], {alignment})"
                                + (" or end[g] == end[g-1] (an empty group)" if allow_empty else
                                   " (group g starts there)"),
                                f"{values} (group {g}: end {end} < start {start})")
            start = end  # an empty group
        if end > extent:
            raise arg_error(func, arg, f"end offsets <= {extent_name}", f"{values} (group {g} ends at {end})")
        out.append((start, end))
        prev = end
    return out


def psum_row_mask(ends: np.ndarray, mn: int, alignment: int) -> np.ndarray:
    """bool (mn,): row r is in some group's ``[start_g, end_g)`` (the CUDA SF packer's valid rows;
    the offsets are not validated here)."""
    valid = np.zeros(mn, bool)
    for start, end in zip(psum_starts(ends.tolist(), alignment), ends.tolist(), strict=True):
        if start < end:
            valid[start:min(end, mn)] = True
    return valid


def ascend_gap_mask(ends: np.ndarray, extent: int, granularity: int, alignment: int) -> np.ndarray:
    """Source entries (rows or columns) between each group's end and the next aligned start.

    In source units s (one per ``granularity`` rows/K elements), group g's tail
    t = ceil(end_g / granularity) is followed by the gap [t, align(t, alignment // granularity)).
    Returns a bool mask over [0, extent), True where the entry is kept.
    """
    keep = np.ones(extent, bool)
    step = alignment // granularity
    for end in ends.tolist():
        t = ceil_div(end, granularity)
        keep[t:min(align(t, step), extent)] = False
    return keep


# ----------------------------------------------------------------------------------------------
# m-grouped layouts
# ----------------------------------------------------------------------------------------------

def m_indices_layout(func: str, gl: np.ndarray, m: int, groups: int, alignment: int) -> RowGroups:
    """DeepGEMM's m_indices layout: ``gl`` int64 (M,) group ids, -1 padding."""
    # Note: DeepGEMM does not check the layout's content (a misplaced group id or -1 row gives
    # wrong rows silently); ids outside [-1, G) and blocks mixing groups raise here.
    if ((gl < -1) | (gl >= groups)).any():
        bad = int(np.flatnonzero((gl < -1) | (gl >= groups))[0])
        raise arg_error(func, "grouped_layout", f"group ids in [-1, {groups}) (-1 marks padding rows)",
                        f"{int(gl[bad])} at row {bad}")
    nblk = ceil_div(m, alignment)
    padded = np.full(nblk * alignment, -1, np.int64)
    padded[:m] = gl
    blocks = padded.reshape(nblk, alignment)
    valid = blocks >= 0
    # The kernels take a block's group from its first row (BLOCK_M == alignment): all its rows
    # must belong to that group, padding (-1) rows only after them.
    mixed = valid & (blocks != blocks[:, :1])
    tail = valid[:, 1:] & ~valid[:, :-1]
    if mixed.any() or tail.any():
        blk = int(np.flatnonzero(mixed.any(axis=1) | tail.any(axis=1))[0])
        r0 = blk * alignment
        # the offending row itself: the first in the block of another group, or after a -1 row
        j_mixed = np.flatnonzero(mixed[blk])
        j_tail = np.flatnonzero(tail[blk]) + 1
        row = r0 + int(min(j_mixed[0] if j_mixed.size else alignment, j_tail[0] if j_tail.size else alignment))
        why = ("after a -1 padding row of the block" if j_tail.size and (not j_mixed.size or j_tail[0] <= j_mixed[0])
               else f"in the block of group {int(blocks[blk, 0])}")
        raise arg_error(
            func, "grouped_layout",
            f"groups aligned to the contiguous-layout alignment ({alignment}): every block of {alignment} rows "
            "holds rows of one group followed by -1 padding rows",
            f"grouped_layout[{row}] = {int(gl[row])} {why} (rows [{r0}, {min(m, r0 + alignment)}))",
        )
    defined = np.asarray(gl >= 0)
    runs: list[tuple[int, int, int]] = []
    if m:
        cut = np.flatnonzero(np.diff(gl)) + 1
        starts = np.concatenate(([0], cut))
        stops = np.concatenate((cut, [m]))
        runs = [(int(gl[s]), int(s), int(e)) for s, e in zip(starts, stops, strict=True) if gl[s] >= 0]
    # Note: the kernels store A_row @ B_e^T (sm100, sm90 BF16) or, per 64-row chunk, zeros or
    # A_row @ B_e^T (sm90 FP8) into -1 rows; here they get +0.0 (equal when A's padding rows are
    # zero, as in DeepGEMM's tests).
    return RowGroups(runs, defined, ~defined)


def psum_layout(func: str, ends: np.ndarray, m: int, alignment: int, *, ascend: bool, zero_gaps: bool) -> RowGroups:
    """m-grouped psum END offsets, with the gap policy.

    ``zero_gaps``: the gap rows of non-empty groups (clipped to M) receive +0.0.  DeepGEMM-Ascend
    also accepts an empty group after a non-aligned end, and computes whole blocks (the last
    group's padded end must fit in M).
    """
    defined = np.zeros(m, bool)
    zero = np.zeros(m, bool)
    runs: list[tuple[int, int, int]] = []
    for g, (start, end) in enumerate(psum_ranges(func, "grouped_layout", ends, alignment, m,
                                                 extent_name=f"M = {m} (the rows of a and d)", allow_empty=ascend)):
        if end <= start:
            continue
        runs.append((g, start, end))
        defined[start:end] = True
        if ascend and align(end, alignment) > m:
            # Note: DeepGEMM-Ascend does not check this; its kernel would read A and write d
            # past their last row (the whole 256-row block is computed).
            raise arg_error(func, "d", f"rows up to the last group's padded end align({end}, {alignment}) = "
                            f"{align(end, alignment)} (DeepGEMM-Ascend computes whole blocks)", f"M = {m}")
        if zero_gaps:
            # Note: the kernels store A_gap @ B_g^T into the gap (sm90 FP8: zeros for 64-row
            # chunks past end_g); here the gap gets +0.0 (equal for zero A gap rows).
            zero[end:min(align(end, alignment), m)] = True
    return RowGroups(runs, defined, zero, ends)


def masked_rows(func: str, mm: np.ndarray, max_m: int) -> np.ndarray:
    """Validated ``masked_m`` (int64 (G,)): 0 <= masked_m[g] <= MAX_M."""
    # Note: DeepGEMM does not check masked_m's values (the kernel would read past the group's
    # rows); values outside [0, MAX_M] raise here.
    if ((mm < 0) | (mm > max_m)).any():
        g = int(np.flatnonzero((mm < 0) | (mm > max_m))[0])
        raise arg_error(func, "masked_m", f"0 <= masked_m[g] <= {max_m} (the rows of a and d per group)",
                        f"masked_m[{g}] = {int(mm[g])}")
    return mm


# ----------------------------------------------------------------------------------------------
# k-grouped layouts
# ----------------------------------------------------------------------------------------------

def k_groups_cuda(func: str, gl: np.ndarray, ks: list[int] | None, sum_k_rows: int, k_alignment: int,
                  psum: bool) -> KGroups:
    """DeepGEMM's check_k_grouped_args plus the layout's own consistency.

    gl: int64 (G,) K sizes or psum K END offsets; ks: ``ks_cpu`` (None or [] only with psum,
    then SUM_K is ``sum_k_rows``, the operands' K extent).
    """
    groups = gl.size
    if ks:
        if len(ks) != groups:
            raise arg_error(func, "ks_cpu", f"{groups} entries (one per group of grouped_layout)", repr(ks))
        if any(k < 0 or k % k_alignment for k in ks):
            raise arg_error(func, "ks_cpu", f"non-negative multiples of the K alignment {k_alignment}", repr(ks))
        sum_k = sum(ks)
    elif psum:
        sum_k = sum_k_rows
    else:
        raise arg_error(func, "ks_cpu", "the per-group K sizes (None or [] needs use_psum_layout=True)", repr(ks))
    if psum:
        ranges = psum_ranges(func, "grouped_layout", gl, k_alignment, sum_k, extent_name=f"SUM_K = {sum_k}",
                             what="psum K end offsets")
        if ks:
            want = [align(e - s, k_alignment) for s, e in ranges]
            if want != list(ks):
                # Note: DeepGEMM does not compare them; ks_cpu must hold the aligned group sizes
                # (what its tests pass), otherwise the host and the device disagree on SUM_K.
                raise arg_error(func, "ks_cpu", f"the aligned group sizes of grouped_layout {want}", repr(ks))
        return KGroups(ranges, sum_k)
    assert ks
    if gl.tolist() != list(ks):
        # Note: the device reads the sizes from grouped_layout and the host from ks_cpu;
        # DeepGEMM does not compare them, here they must be equal.
        raise arg_error(func, "grouped_layout", f"the K sizes of ks_cpu {list(ks)}", repr(gl.tolist()))
    bounds = np.concatenate([[0], np.cumsum(ks)]).tolist()
    return KGroups([(int(bounds[g]), int(bounds[g + 1])) for g in range(groups)], sum_k)


def k_groups_ascend(func: str, gl: np.ndarray, ks: list[int] | None, sum_k: int, alignment: int) -> KGroups:
    """DeepGEMM-Ascend: psum K END offsets, groups start on ``alignment``-aligned K rows;
    an empty group may follow a non-aligned end."""
    ranges = psum_ranges(func, "grouped_layout", gl, alignment, sum_k,
                         extent_name=f"K = {sum_k} (the rows of a and b)", allow_empty=True, what="psum K end offsets")
    if ks:
        if len(ks) != gl.size:
            raise arg_error(func, "ks_cpu", f"None or {gl.size} entries (one per group)", repr(ks))
        for g, (s, e) in enumerate(ranges):
            if ks[g] not in (e - s, align(e - s, alignment)):
                # Note: DeepGEMM-Ascend only averages ks_cpu for its tile heuristic; here each
                # entry must be the group's K size (exact or 256-aligned) so that a mismatch is caught.
                raise arg_error(func, "ks_cpu", f"each group's K size (exact or aligned to {alignment}) from "
                                "grouped_layout", f"{ks} (group {g} has K = {e - s})")
    return KGroups(ranges, sum_k)


# ----------------------------------------------------------------------------------------------
# scale rows and blocks the SF transforms skip in psum gaps
# ----------------------------------------------------------------------------------------------

def psum_gap_scale_rows(sf: np.ndarray | None, layout: RowGroups, m: int, gran_m: int, alignment: int,
                        gaps: str) -> np.ndarray | None:
    """float32 SFA with the rows the target's SF transform skips (psum gaps) set to 0.0.

    ``gaps``: "blocks" (DeepGEMM-Ascend: the gap after each end, :func:`ascend_gap_mask`) or
    "rows" (DeepGEMM: every row outside the groups).

    Those rows may be uninitialised (DeepGEMM's masked-to-psum test): the transforms write
    byte 0 for them without checking, and the kernels never compute them.
    """
    if (sf is None or sf.dtype != np.float32 or sf.ndim != 2 or layout.ends is None
            or sf.shape[0] != ceil_div(m, gran_m)):
        return sf
    rows = sf.shape[0]
    if gaps == "blocks":
        keep = ascend_gap_mask(layout.ends, rows, gran_m, alignment)
    else:
        valid = np.zeros(rows * gran_m, bool)
        valid[:m] = layout.defined
        keep = np.asarray(valid.reshape(rows, gran_m).any(axis=1))
    if keep.all():
        return sf
    return np.where(keep[:, None], sf, np.float32(0.0))


def psum_gap_scale_blocks(sf: np.ndarray | None, ends: np.ndarray, k: int, alignment: int) -> np.ndarray | None:
    """float32 k-grouped SFs (mn rows, per-32 K blocks) with the K-gap blocks the transform zeroes set to 0.0."""
    if sf is None or sf.dtype != np.float32 or sf.ndim != 2 or sf.shape[1] != ceil_div(k, 32):
        return sf
    keep = ascend_gap_mask(ends, sf.shape[1], 32, alignment)
    if keep.all():
        return sf
    return np.where(keep[None, :], sf, np.float32(0.0))
