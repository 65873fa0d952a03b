"""Expert-parallel cases with one process per rank (DeepEP's dispatch and combine, Mega MoE).

A case of a *ranked* family (:attr:`.cases.Family.ranked`: ``ep_dispatch``, ``ep_combine``,
``mega_moe``) holds R ranks.  In one process its ranks are threads (DeepEP) or an
``EmulatedGroup`` (Mega MoE); here each rank is a process of a ``torch.distributed`` group
(gloo on a CPU), in two places:

* generation, ``deepgemm-ref golden --executor processes`` (:func:`.generation.generate` with
  ``executor="processes"``): R processes per case (``deepgemm_ref.golden._rank_worker``), a gloo
  group over a file store.  Every process builds the whole case (the same seed gives the same
  inputs in every process: a rank's inputs come from the one generator stream of the case) and
  computes its own rank's part of the goldens (:func:`rank_golden`); rank 0 gathers the parts
  and merges them (:func:`merge_golden`) into exactly the tensors one process computes, then
  writes the case file;
* replay under ``torchrun`` (:func:`.replay.replay` in a world of more than one process): each
  process replays its rank of every case of R = world-size ranks through the module, and rank 0
  gathers and merges the outputs into the one outputs file (see :mod:`.replay`).

The merge.  Every output of a ranked case is stacked over the ranks (leading axis R) and rank r
computes row r only, so the merged tensor is ``stack([row of rank 0, ..., row of rank R-1])``.
DeepEP's goldens (the pure math layer) are all stacked the same way, their statistics computed
from the merged tensors (:data:`.cases.MergeRanks`).  Mega MoE's goldens come from the trace
record of the kernel call: each process sends its rank's record (the accumulator ``acc``, the
error scale ``S``, the stage goldens and the statistics), and rank 0 makes the stacked goldens
with the family's ``finish`` from the R records, as one process does with its R records.

Arrays travel as bytes (:func:`pack`, :func:`unpack`: a JSON header naming each array's dtype
and shape, then the raw bytes) through the package's transport of the group
(:class:`deepgemm_ref.comm.TorchTransport`): nothing is pickled.

A family's driver learns the rank it plays from :func:`current_scope` (set by :func:`rank_scope`):
it then runs that rank alone, with the scope's group, and writes that rank's row of each output.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np

from .. import trace
from .._parallel import single_threaded_blas
from ..comm import CollectiveMismatch, Transport
from ..settings import numerics
from .bundle import BundleError
from .call import _entry_of, entry_family, fresh_outputs, quiet_float_errors, run_case_call
from .cases import BuiltCase, CaseSpec, family_for
from .emulator import emulator

__all__ = ["RankScope", "current_scope", "rank_scope", "spec_ranks", "entry_ranks", "pack", "unpack",
           "gather_to_root", "agree", "rank_golden", "merge_golden", "torchrun_env", "group_refused",
           "runs_ranks_in_process"]


@dataclass(frozen=True)
class RankScope:
    """The rank this process plays in a ranked case: ``group`` (a process group the module's
    buffers and kernels take), ``rank`` and ``size`` (the case's ranks)."""

    group: Any
    rank: int
    size: int


_SCOPE: ContextVar[RankScope | None] = ContextVar("deepgemm_ref_golden_rank_scope", default=None)


def current_scope() -> RankScope | None:
    """The rank this process plays (None: every rank of a case runs here)."""
    return _SCOPE.get()


@contextlib.contextmanager
def rank_scope(group: Any, rank: int, size: int) -> Iterator[RankScope]:
    """Within the block, ranked families' drivers run rank ``rank`` of ``size`` alone, on ``group``."""
    scope = RankScope(group, int(rank), int(size))
    token = _SCOPE.set(scope)
    try:
        yield scope
    finally:
        _SCOPE.reset(token)


def spec_ranks(spec: CaseSpec) -> int:
    """A case specification's ranks R (its resolved ``ranks`` key); 0 for a family without ranks."""
    fam = family_for(spec)
    return int(spec.resolved["ranks"]) if fam.ranked else 0


def entry_ranks(entry: Mapping[str, Any]) -> int:
    """A manifest entry's ranks R (its driver record's ``ranks``); 0 for a family without ranks."""
    fam = entry_family(entry)
    if not fam.ranked:
        return 0
    driver = entry.get("driver") or {}
    return int(driver.get("ranks", 0))


def runs_ranks_in_process(module: Any, entry: Mapping[str, Any]) -> bool:
    """Whether ``module`` runs every rank of the entry's case in this process: DeepEP's
    ``run_emulated`` (this package's :mod:`deepgemm_ref.ep`), Mega MoE's ``mega.EmulatedGroup``
    (this package).  A module without the family's names at all counts as True: its driver
    reports what is missing."""
    name = entry_family(entry).name
    if name == "mega_moe":
        if getattr(module, "get_symm_buffer_for_mega_moe", None) is None and getattr(module, "SymmBuffer",
                                                                                    None) is None:
            return True
        return getattr(getattr(module, "mega", None), "EmulatedGroup", None) is not None
    for ep in (module, getattr(module, "ep", None)):
        if ep is not None and (getattr(ep, "ElasticBuffer", None) is not None or getattr(ep, "EPBuffer", None)
                               is not None):
            return getattr(ep, "run_emulated", None) is not None
    return True


def group_refused(e: BaseException) -> bool:
    """Whether ``e`` is the package's argument error on a ``group`` argument (a module whose
    kernels do not take a process group of this many ranks yet)."""
    from ..errors import DGArgumentError

    return isinstance(e, DGArgumentError) and ": group: expected" in str(e)


# ----------------------------------------------------------------------------------------------
# arrays as bytes
# ----------------------------------------------------------------------------------------------

_U8 = np.dtype(np.uint8)


def _dtype_name(dt: np.dtype) -> str:
    if dt.byteorder == ">":
        raise BundleError(f"rank exchange: big-endian arrays are not exchanged (dtype {dt.str})")
    return dt.name


def _dtype_of(name: str) -> np.dtype:
    extra = getattr(ml_dtypes, name, None)
    if extra is not None:
        return np.dtype(extra)
    try:
        return np.dtype(name)
    except TypeError:
        raise BundleError(f"rank exchange: unknown dtype {name!r}") from None


def pack(arrays: Mapping[str, np.ndarray], info: Mapping[str, Any] | None = None) -> np.ndarray:
    """``arrays`` (name -> array) and a JSON-able ``info`` as one uint8 array: an 8-byte header
    length, the JSON header (names, dtypes, shapes, info), then every array's C-order bytes."""
    metas: list[list[Any]] = []
    chunks: list[np.ndarray] = []
    for name, value in arrays.items():
        a = np.ascontiguousarray(value)
        metas.append([name, _dtype_name(a.dtype), [int(n) for n in a.shape]])
        chunks.append(a.reshape(-1).view(_U8) if a.size else np.zeros(0, _U8))
    head = json.dumps({"arrays": metas, "info": dict(info or {})}, allow_nan=False, sort_keys=True).encode()
    prefix = np.frombuffer(len(head).to_bytes(8, "little"), _U8)
    return np.concatenate([prefix, np.frombuffer(head, _U8), *chunks])


def unpack(buf: np.ndarray) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The arrays (fresh, C-contiguous) and info of :func:`pack`'s bytes."""
    raw = np.ascontiguousarray(buf, _U8).reshape(-1)
    if raw.size < 8:
        raise BundleError("rank exchange: a message shorter than its header")
    n = int.from_bytes(raw[:8].tobytes(), "little")
    if n > raw.size - 8:
        raise BundleError("rank exchange: a header longer than the message")
    head = json.loads(raw[8:8 + n].tobytes().decode())
    at = 8 + n
    out: dict[str, np.ndarray] = {}
    for name, dtype_name, shape in head["arrays"]:
        dt = _dtype_of(dtype_name)
        size = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        if at + size > raw.size:
            raise BundleError(f"rank exchange: array {name!r} runs past the message")
        out[name] = raw[at:at + size].copy().view(dt).reshape(shape)
        at += size
    if at != raw.size:
        raise BundleError("rank exchange: bytes left over after the last array")
    return out, head["info"]


# ----------------------------------------------------------------------------------------------
# collectives on the group's transport
# ----------------------------------------------------------------------------------------------

def gather_to_root(tr: Transport, payload: np.ndarray) -> list[np.ndarray] | None:
    """Every rank's ``payload`` (uint8) on rank 0, in rank order (None on the other ranks): an
    all_to_all in which every rank sends to rank 0 only."""
    mine = np.ascontiguousarray(payload, _U8).reshape(-1)
    got = tr.all_to_all([mine if d == 0 else mine[:0] for d in range(tr.size)])
    return got if tr.rank == 0 else None


def agree(tr: Transport, status: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every rank's ``status`` (a JSON-able table), on every rank, in rank order.

    Called by every rank after each case.  A rank that failed before one of the case's own
    collectives arrives here while the others wait in that collective: the transports compare
    the collectives' labels before any data moves, so both sides raise
    :class:`~deepgemm_ref.comm.CollectiveMismatch`; the others record their case as failed and
    come here too, and this rank's second attempt meets them (one retry)."""
    mine = np.frombuffer(json.dumps(dict(status), sort_keys=True).encode(), _U8)
    try:
        got = tr.all_gather(mine)
    except CollectiveMismatch:
        got = tr.all_gather(mine)
    return [json.loads(g.tobytes().decode()) for g in got]


# ----------------------------------------------------------------------------------------------
# a rank's goldens and their merge
# ----------------------------------------------------------------------------------------------

@dataclass
class _Record:
    """What :func:`merge_golden` passes to a family's finish hook for one rank (the fields of a
    trace record that the hooks read)."""

    acc: np.ndarray | None
    S: np.ndarray | None
    extra: dict[str, np.ndarray] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)


def rank_golden(built: BuiltCase, rank: int, group: Any) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Rank ``rank``'s part of a ranked case's goldens, computed in this process (one of the case's
    R processes, ``group`` their process group): (named arrays, JSON-able info) for
    :func:`merge_golden`.  DeepEP's families compute their rank's rows of the pure model
    (``compute_rank``); Mega MoE runs the emulator's driver for this rank alone on ``group``
    (:func:`rank_scope`) under trace capture and sends its rows of the outputs and its trace record."""
    fam = family_for(built.spec)
    size = int(built.spec.resolved["ranks"])
    entry = _entry_of(built)
    if fam.compute is not None:
        assert fam.compute_rank is not None
        with single_threaded_blas(), numerics(arch=entry["profile"]), quiet_float_errors():
            return fam.compute_rank(entry, dict(built.inputs), built.outputs, rank)
    with single_threaded_blas(), numerics(arch=entry["profile"], accumulation="exact"), quiet_float_errors():
        outs = fresh_outputs(built.outputs, built.inputs)
        tensors = dict(built.inputs)
        with rank_scope(group, rank, size), trace.capture(want_acc=True, want_S=True) as cap:
            run_case_call(emulator(), entry, built.args, built.kwargs, tensors, outs)
    records = list(cap.records)
    if len(records) == 1:
        rec = records[0]
    elif len(records) == size:
        rec = records[rank]
    else:
        raise BundleError(f"case {built.spec.id!r}: rank {rank}: the kernel left {len(records)} trace records; "
                          f"expected this rank's (1) or every rank's ({size})")
    parts: dict[str, np.ndarray] = {f"out.{name}": np.ascontiguousarray(outs[name][rank]) for name in built.outputs}
    for key in ("acc", "S"):
        v = getattr(rec, key, None)
        if v is not None:
            parts[f"rec.{key}"] = np.ascontiguousarray(np.asarray(v, np.float64))
    for k, v in rec.extra.items():
        parts[f"rec.extra.{k}"] = np.ascontiguousarray(v)
    return parts, {"stats": dict(rec.stats)}


def merge_golden(built: BuiltCase, parts: list[dict[str, np.ndarray]], infos: list[dict[str, Any]]
                 ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The case's golden tensors and statistics from every rank's :func:`rank_golden` (rank order):
    exactly what one process computes (:func:`.call.compute_golden`)."""
    fam = family_for(built.spec)
    entry = _entry_of(built)
    if fam.compute is not None:
        assert fam.merge_ranks is not None
        with single_threaded_blas(), numerics(arch=entry["profile"]), quiet_float_errors():
            return fam.merge_ranks(entry, parts, infos, dict(built.inputs), built.outputs)
    assert fam.finish is not None
    golden = {name: np.ascontiguousarray(np.stack([p[f"out.{name}"] for p in parts])) for name in built.outputs}
    records = []
    for p, info in zip(parts, infos, strict=True):
        extra = {k[len("rec.extra."):]: v for k, v in p.items() if k.startswith("rec.extra.")}
        records.append(_Record(p.get("rec.acc"), p.get("rec.S"), extra, dict(info.get("stats") or {})))
    with single_threaded_blas(), numerics(arch=entry["profile"], accumulation="exact"), quiet_float_errors():
        stats = fam.finish(golden, list(records), dict(built.inputs))
    return golden, stats


# ----------------------------------------------------------------------------------------------
# torchrun
# ----------------------------------------------------------------------------------------------

def torchrun_env() -> dict[str, int] | None:
    """``{"rank", "world_size", "local_rank"}`` from the variables torchrun sets (RANK,
    WORLD_SIZE, MASTER_ADDR, MASTER_PORT; LOCAL_RANK defaults to RANK), or None outside torchrun.
    A variable that is not a number raises :class:`.bundle.BundleError` naming it."""
    keys = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    if not all(os.environ.get(k) for k in keys):
        return None
    out: dict[str, int] = {}
    for key, name in (("RANK", "rank"), ("WORLD_SIZE", "world_size"), ("LOCAL_RANK", "local_rank")):
        text = os.environ.get(key, os.environ["RANK"])
        try:
            out[name] = int(text)
        except ValueError:
            raise BundleError(f"environment variable {key}={text!r}: expected an integer (set by torchrun)") from None
    if out["world_size"] < 1 or not 0 <= out["rank"] < out["world_size"]:
        raise BundleError(f"environment variables RANK={out['rank']}, WORLD_SIZE={out['world_size']}: expected "
                          "0 <= RANK < WORLD_SIZE (set by torchrun)")
    return out
