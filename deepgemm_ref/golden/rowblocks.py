"""Goldens too large to hold whole: computed and written a block of output rows at a time.

A case whose family can cut it by output rows (:class:`.cases.Family` ``row_split``; the dense
GEMMs) and whose own tensors would take more than their share of the memory limit (its estimate's
``row_block``, :func:`.resources.row_block`) is generated here: for each block of rows
``[r0, r1)`` the golden of the inputs' slices (``a``'s rows, its scales, ``c``'s rows; ``b``
whole) is computed by the same exact model as the whole case, and every golden tensor's rows are
written at their place in the case file (:class:`.safetensors.StreamWriter`).  Only the inputs
and one block's goldens are in memory at once.

Every golden element depends only on its own row of A (and on B), and the exact model rounds each
element once from its exact value, so the file's bytes are those of the whole case computed at
once: the same file, the same per-tensor digests (tests/test_rowblocks.py compares them for
every dense kernel, adversarial and special values included).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .._memory import work_progress, work_reporter
from . import safetensors as st
from .bundle import BundleError, case_entry, case_relpath, tensor_record
from .call import compute_golden
from .cases import BuiltCase

__all__ = ["block_case", "golden_in_row_blocks", "digests_in_row_blocks", "write_case_in_row_blocks"]


def block_case(built: BuiltCase, axes: Mapping[str, int], r0: int, r1: int) -> BuiltCase:
    """The case of output rows [r0, r1): the ``axes`` inputs sliced along their axis, the other
    inputs whole, every output's leading dimension ``r1 - r0``."""
    inputs = dict(built.inputs)
    for name, axis in axes.items():
        x = inputs[name]
        index: list[slice] = [slice(None)] * x.ndim
        index[axis] = slice(r0, r1)
        inputs[name] = np.ascontiguousarray(x[tuple(index)])
    outputs = {name: {**o, "shape": [r1 - r0, *o["shape"][1:]]} for name, o in built.outputs.items()}
    return dataclasses.replace(built, inputs=inputs, outputs=outputs)


def _merge_stats(total: dict[str, Any], part: Mapping[str, Any], case_id: str) -> None:
    """Counts add up over the blocks; anything else must be the same in every block."""
    for k, v in part.items():
        if k not in total:
            total[k] = v
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and isinstance(total[k], (int, float)):
            total[k] = total[k] + v
        elif total[k] != v:
            raise BundleError(f"case {case_id!r}: golden statistic {k!r} differs between row blocks "
                              f"({total[k]!r}, {v!r}); the case cannot be computed in blocks")


def golden_in_row_blocks(built: BuiltCase, axes: Mapping[str, int], block: int
                         ) -> Iterator[tuple[int, dict[str, np.ndarray], dict[str, Any]]]:
    """The golden of ``built`` in blocks of ``block`` output rows: each block's first row, golden
    tensors and statistics, in order (the share of the work done is reported per block to the
    caller's :func:`deepgemm_ref._memory.work_progress`).  Every golden tensor must follow the
    main output's rows, with the same dtype and trailing shape in every block."""
    rows = int(next(iter(built.outputs.values()))["shape"][0])
    outer = work_reporter()
    starts = list(range(0, rows, block))
    kinds: dict[str, tuple[np.dtype[Any], tuple[int, ...]]] = {}
    for i, r0 in enumerate(starts):
        r1 = min(rows, r0 + block)

        def share(x: float, i: int = i) -> None:
            if outer is not None:
                outer((i + x) / len(starts))

        with work_progress(share):
            golden, stats = compute_golden(block_case(built, axes, r0, r1))
        found = {k: (v.dtype, v.shape[1:]) for k, v in golden.items()}
        bad = [k for k, v in golden.items() if v.ndim == 0 or v.shape[0] != r1 - r0]
        if bad or (kinds and found != kinds):
            raise BundleError(f"case {built.spec.id!r}: golden tensors {bad or sorted(found)} do not follow "
                              "the output's rows; the case cannot be computed in blocks")
        kinds = found
        yield r0, golden, stats
        del golden, stats  # a block's goldens are gone before the next block is computed


def _layout(built: BuiltCase, golden: Mapping[str, np.ndarray]) -> dict[str, tuple[Any, tuple[int, ...]]]:
    """The case file's tensors (inputs whole, goldens of every row), from one block's goldens."""
    rows = int(next(iter(built.outputs.values()))["shape"][0])
    layout: dict[str, tuple[Any, tuple[int, ...]]] = {f"input.{k}": (v.dtype, v.shape) for k, v in built.inputs.items()}
    layout.update({f"golden.{k}": (v.dtype, (rows, *v.shape[1:])) for k, v in golden.items()})
    return layout


def _fill_in_row_blocks(built: BuiltCase, axes: Mapping[str, int], block: int,
                        make: Callable[[dict[str, tuple[Any, tuple[int, ...]]]], st.TensorDigests],
                        stats: dict[str, Any] | None = None) -> st.TensorDigests:
    """The case computed in row blocks into what ``make(layout)`` returns (given the inputs
    whole, then every block's golden rows at their place); the blocks' statistics summed into
    ``stats`` when given (:func:`_merge_stats`)."""
    target: st.TensorDigests | None = None
    for r0, golden, part_stats in golden_in_row_blocks(built, axes, block):
        if target is None:
            target = make(_layout(built, golden))
            for k, v in built.inputs.items():
                target.write(f"input.{k}", v)
        for name in golden:
            target.write(f"golden.{name}", golden[name], r0)
        if stats is not None:
            _merge_stats(stats, part_stats, built.spec.id)
        # Drop this block's goldens now: the loop variables would otherwise hold them while the
        # next block is computed (two blocks at once: 12.4 GiB against the estimate's 9.4 for the
        # largest deepgemm-tests case, over the 11.8 GiB default limit).
        del golden, part_stats
    assert target is not None
    return target


def digests_in_row_blocks(built: BuiltCase, axes: Mapping[str, int], block: int) -> dict[str, str]:
    """Every tensor's sha256 (as the manifest records them) of the case computed in row blocks,
    nothing written (``verify --regenerate`` of a case too large to hold whole)."""
    digests = _fill_in_row_blocks(built, axes, block,
                                  lambda layout: st.TensorDigests(layout, f"case {built.spec.id!r}"))
    return {name: digests.tensor_sha256(name) for name in digests.layout}


def write_case_in_row_blocks(built: BuiltCase, axes: Mapping[str, int], block: int, workdir: Path,
                             overwrite: bool, metadata: Mapping[str, str],
                             commit: Callable[[Callable[[], dict[str, Any]]], dict[str, Any]],
                             stats_clean: Callable[[Any], Any] = lambda x: x) -> dict[str, Any]:
    """Compute the golden of ``built`` in blocks of ``block`` output rows, writing each block into
    the case file under ``workdir``; returns the case's manifest entry.

    commit: called with the function that renames the finished file into place and makes the
    entry (generation runs it with signals deferred, like an ordinary case's write).
    stats_clean: what makes the summed golden statistics fit for the manifest.
    """
    path = workdir / case_relpath(built.spec.id)
    stats: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:

        def open_writer(layout: dict[str, tuple[Any, tuple[int, ...]]]) -> st.StreamWriter:
            try:
                return stack.enter_context(st.StreamWriter(path, layout, metadata, overwrite=overwrite))
            except st.SafetensorsError as e:
                raise BundleError(str(e)) from None

        done = _fill_in_row_blocks(built, axes, block, open_writer, stats)
        assert isinstance(done, st.StreamWriter)

        def finish() -> dict[str, Any]:
            entries = {k: tensor_record(st.NUMPY_TO_SAFETENSORS[dt], shape, done.tensor_sha256(k))
                       for k, (dt, shape) in done.layout.items()}
            done.commit()
            return case_entry(built, {}, st.file_sha256(path), stats_clean(stats), entries=entries)

        return commit(finish)
