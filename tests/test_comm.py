"""deepgemm_ref.comm: the in-process group (ranks in threads, and the sequential form Mega MoE's
EmulatedGroup uses), and the torch.distributed transport over gloo process groups.

Expected values are derived in the tests: every rank's input is a function of (case, rank,
ranks) (:func:`_send`, :func:`_gathered`), so what rank r must receive from rank s is that
function evaluated for s.  The torch tests run the same scenario (:func:`_scenario`) in R
spawned processes over gloo and compare its bytes with the in-process run's.
"""

from __future__ import annotations

import datetime
import json
import math
import multiprocessing as mp
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from deepgemm_ref import comm
from deepgemm_ref.comm import CollectiveMismatch, LocalGroup, PeerFailed, run_emulated, transport
from deepgemm_ref.errors import DGArgumentError

# ----------------------------------------------------------------------------------------------
# per-rank inputs: a function of (case, rank, ranks)
# ----------------------------------------------------------------------------------------------

#: (name, dtype, row shape): gloo refuses int16, uint16 and the float8 formats; bool and the
#: ml_dtypes formats must come back bitwise (random bytes: NaN payloads included).
CASES = [
    ("f32", np.dtype(np.float32), (3,)),
    ("bf16", np.dtype(ml_dtypes.bfloat16), (2, 3)),
    ("e4m3", np.dtype(ml_dtypes.float8_e4m3fn), (5,)),
    ("e5m2", np.dtype(ml_dtypes.float8_e5m2), ()),
    ("i16", np.dtype(np.int16), (4,)),
    ("u16", np.dtype(np.uint16), (1,)),
    ("bool", np.dtype(np.bool_), (3,)),
    ("c64", np.dtype(np.complex64), (2,)),
    ("empty-rows", np.dtype(np.int32), (0,)),
]


def _rows(kind: int, rank: int, other: int) -> int:
    """Row count of what ``rank`` sends to ``other`` (kind 0) or gathers (kind 1): zeros included."""
    return (3 * rank + 2 * other + kind) % 4


def _array(case: int, rank: int, other: int, kind: int, ranks: int) -> np.ndarray:
    _, dtype, row = CASES[case]
    n = _rows(kind, rank, other)
    rng = np.random.default_rng([case, rank, other, kind, ranks])
    count = n * math.prod(row)
    if dtype == np.bool_:
        return rng.integers(0, 2, count).astype(np.bool_).reshape((n,) + row)
    raw = rng.integers(0, 256, count * dtype.itemsize, dtype=np.uint8)
    return raw.view(dtype).reshape((n,) + row)


def _send(case: int, rank: int, ranks: int) -> list[np.ndarray]:
    """What ``rank`` sends to each rank in an all_to_all of case ``case``."""
    return [_array(case, rank, d, 0, ranks) for d in range(ranks)]


def _gathered(case: int, rank: int, ranks: int) -> np.ndarray:
    """What ``rank`` contributes to an all_gather of case ``case``."""
    return _array(case, rank, 0, 1, ranks)


def _bytes(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Same dtype, shape and bytes."""
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(_bytes(a), _bytes(b))


def _mismatch_call(t: Any, rank: int) -> None:
    """Rank 0 calls a barrier, rank 1 an all_gather of float32 rows, the others one of int32 rows."""
    if rank == 0:
        t.barrier()
    elif rank == 1:
        t.all_gather(np.zeros((2, 3), np.float32))
    else:
        t.all_gather(np.zeros((1, 3), np.int32))


def _scenario(t: Any, rank: int, ranks: int) -> dict[str, Any]:
    """Every collective a transport has, on every case; what each returned (arrays, messages)."""
    out: dict[str, Any] = {}
    for c, (name, _, _) in enumerate(CASES):
        for s, a in enumerate(t.all_to_all(_send(c, rank, ranks))):
            out[f"a2a/{name}/{s}"] = a
        for s, a in enumerate(t.all_gather(_gathered(c, rank, ranks))):
            out[f"ag/{name}/{s}"] = a
    t.barrier()
    # a non-contiguous input and a tuple of sends
    base = np.arange(4 * ranks * 6, dtype=np.int64).reshape(4 * ranks, 6) + 1000 * rank
    for s, a in enumerate(t.all_to_all(tuple(base[4 * d:4 * d + 4, ::2] for d in range(ranks)))):
        out[f"a2a/strided/{s}"] = a
    # ranks that disagree all raise the same error, and the group stays usable
    try:
        _mismatch_call(t, rank)
    except CollectiveMismatch as e:
        out["mismatch"] = str(e)
    try:
        t.all_gather(np.zeros((1, 2), np.float32 if rank else np.float64))
    except CollectiveMismatch as e:
        out["mismatch-dtype"] = str(e)
    # a bad argument on every rank raises before any collective (the next one still pairs up)
    try:
        t.all_to_all([np.array([object()])] * ranks)
    except DGArgumentError as e:
        out["bad-argument"] = str(e)
    out["after"] = np.concatenate(t.all_gather(np.array([7 * rank + 1], np.int64)))
    return out


def _check_scenario(results: list[dict[str, Any]], ranks: int) -> None:
    """Each rank's results against the inputs (derived independently of any transport)."""
    for r, out in enumerate(results):
        for c, (name, _, _) in enumerate(CASES):
            for s in range(ranks):
                assert _same(out[f"a2a/{name}/{s}"], _send(c, s, ranks)[r]), (name, r, s)
                assert _same(out[f"ag/{name}/{s}"], _gathered(c, s, ranks)), (name, r, s)
        for s in range(ranks):
            want = (np.arange(4 * ranks * 6, dtype=np.int64).reshape(4 * ranks, 6) + 1000 * s)[4 * r:4 * r + 4, ::2]
            assert _same(out[f"a2a/strided/{s}"], want)
        assert "send[0]" in out["bad-argument"] and "object" in out["bad-argument"]
        assert out["after"].tolist() == [7 * s + 1 for s in range(ranks)]
        if ranks == 1:  # one rank cannot disagree with itself
            assert "mismatch" not in out and "mismatch-dtype" not in out
            continue
        assert "rank 0: barrier" in out["mismatch"]
        assert "rank 1: all_gather of float32 rows of shape (3,)" in out["mismatch"]
        if ranks > 2:
            others = f"rank{'s' if ranks > 3 else ''} {', '.join(map(str, range(2, ranks)))}"
            assert f"{others}: all_gather of int32 rows of shape (3,)" in out["mismatch"]
        assert "float64" in out["mismatch-dtype"] and "float32" in out["mismatch-dtype"]
    for key in ("mismatch", "mismatch-dtype"):  # the same message on every rank
        assert len({out.get(key) for out in results}) == 1


# ----------------------------------------------------------------------------------------------
# LocalGroup's blocking collectives (ranks in threads)
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_local_transport_content_and_order(ranks):
    results = run_emulated(lambda g: _scenario(transport(g), g.rank(), g.size()), ranks, timeout_s=30)
    _check_scenario(results, ranks)


def test_local_transport_hands_out_copies_not_views():
    ranks = 3
    inputs = [[np.full((2, 2), 10 * r + d, np.float32) for d in range(ranks)] for r in range(ranks)]
    gathered = [np.full((r + 1, 2), r, np.int32) for r in range(ranks)]

    def fn(g):
        t = g.transport()
        a2a = t.all_to_all(inputs[g.rank()])
        ag = t.all_gather(gathered[g.rank()])
        t.barrier()
        for a in a2a + ag:  # scribbling on what came back changes nothing any other rank holds
            a[...] = -1
        t.barrier()
        return a2a, ag

    results = run_emulated(fn, ranks)
    received = [a for a2a, ag in results for a in a2a + ag]
    assert all(a.flags.c_contiguous and a.flags.writeable and np.all(a == -1) for a in received)
    held = [a for row in inputs for a in row] + gathered
    for i, a in enumerate(received):
        assert not any(np.shares_memory(a, b) for b in held + received[:i] + received[i + 1:])
    assert all(np.all(inputs[r][d] == 10 * r + d) for r in range(ranks) for d in range(ranks))
    assert all(np.all(gathered[r] == r) for r in range(ranks))


def test_local_all_gather_shared_is_one_read_only_copy_per_sender():
    ranks = 3
    gathered = [np.full((r + 1, 2), r, np.int32) for r in range(ranks)]

    def fn(g):
        got = g.transport().all_gather_shared(gathered[g.rank()])
        for a in got:  # what is shared cannot be scribbled on
            with pytest.raises(ValueError, match="read-only"):
                a[...] = -1
        return got

    results = run_emulated(fn, ranks)
    for r in range(ranks):
        for s in range(ranks):
            a = results[r][s]
            assert a.tobytes() == gathered[s].tobytes() and a.shape == gathered[s].shape
            assert a is results[0][s]  # one copy per sender, shared by every receiver
            assert not np.shares_memory(a, gathered[s])  # and not the caller's memory


def test_local_group_reused_for_many_collectives():
    ranks, rounds = 4, 150

    def fn(g):
        t, r = g.transport(), g.rank()
        for i in range(rounds):
            got = t.all_gather(np.array([i, r], np.int64))
            assert [a.tolist() for a in got] == [[i, s] for s in range(ranks)]
            recv = t.all_to_all([np.array([i * 100 + r * 10 + d], np.int32) for d in range(ranks)])
            assert [int(a[0]) for a in recv] == [i * 100 + s * 10 + r for s in range(ranks)]
            if i % 10 == 0:
                g.barrier()
        return g.group

    groups = run_emulated(fn, ranks)
    assert groups[0]._outcomes == {}  # every completed round was read by every rank, then dropped


def test_barrier_waits_for_every_rank():
    ranks, arrived = 4, []

    def fn(g):
        time.sleep(0.02 * (ranks - g.rank()))
        arrived.append(g.rank())
        g.barrier()
        return sorted(arrived)

    assert run_emulated(fn, ranks) == [list(range(ranks))] * ranks
    assert LocalGroup(1).rank(0).barrier() is None  # one rank: nothing to wait for


def test_timeout_names_the_missing_ranks():
    def fn(g):
        if g.rank() == 2:
            time.sleep(0.5)  # arrives after the others gave up
        g.barrier()

    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"waited 0\.1 s .*for ranks \[2\]") as e:
        run_emulated(fn, 3, timeout_s=0.1)
    assert not isinstance(e.value, PeerFailed) and time.monotonic() - t0 < 10

    group = LocalGroup(3, timeout_s=0.1)  # the blocking call itself, from one thread
    with pytest.raises(RuntimeError, match=r"rank 0 waited 0\.1 s .*for ranks \[1, 2\]"):
        group.exchange(0, "x", "probe")
    with pytest.raises(PeerFailed, match="rank 0 failed"):  # the group is unusable afterwards
        group.exchange(1, "y", "probe")


def test_failing_rank_fails_the_others_and_is_re_raised():
    seen: dict[int, BaseException] = {}

    def fn(g):
        if g.rank() == 1:
            time.sleep(0.1)
            raise ZeroDivisionError("rank 1 broke")
        try:
            g.transport().all_gather(np.zeros(1))
        except PeerFailed as e:
            seen[g.rank()] = e
            raise

    t0 = time.monotonic()
    with pytest.raises(ZeroDivisionError, match="rank 1 broke"):
        run_emulated(fn, 3, timeout_s=60)
    assert time.monotonic() - t0 < 10  # not the 60 s timeout
    assert sorted(seen) == [0, 2]
    assert all("rank 1 failed: ZeroDivisionError: rank 1 broke" in str(e) for e in seen.values())


def test_rank_that_returns_early_fails_the_others_at_once():
    def fn(g):
        if g.rank() == 0:
            return "done"
        g.barrier()

    t0 = time.monotonic()
    with pytest.raises(PeerFailed, match="rank 0 left the group"):
        run_emulated(fn, 2, timeout_s=60)
    assert time.monotonic() - t0 < 10


def test_ranks_calling_different_collectives():
    def fn(g):
        t = g.transport()
        try:
            _mismatch_call(t, g.rank())
        except CollectiveMismatch as e:
            message = str(e)
        else:
            raise AssertionError("no mismatch raised")
        t.barrier()  # the group stays usable
        return message

    messages = run_emulated(fn, 4)
    assert len(set(messages)) == 1
    assert messages[0].endswith("rank 0: barrier; rank 1: all_gather of float32 rows of shape (3,); "
                                "ranks 2, 3: all_gather of int32 rows of shape (3,)")
    # a mismatch that nobody catches: every rank raises it, run_emulated re-raises rank 0's
    with pytest.raises(CollectiveMismatch):
        run_emulated(lambda g: _mismatch_call(g.transport(), g.rank()), 3)


def test_argument_errors():
    def bad(call, *words):
        with pytest.raises(DGArgumentError) as e:
            call()
        for w in words:
            assert w in str(e.value), (w, str(e.value))

    for size in (0, -1, True, 2.0, "2", None):
        bad(lambda s=size: LocalGroup(s), "LocalGroup", "size", "positive int")
    for t in (0, -1.0, math.nan, math.inf, True, "1", None):
        bad(lambda t=t: LocalGroup(2, timeout_s=t), "LocalGroup", "timeout_s")
    group = LocalGroup(3)
    for r in (5, 3, -1, True, 1.0, "0"):
        bad(lambda r=r: group.rank(r), "LocalGroup.rank", "rank", "[0, 3)")
    bad(lambda: setattr(group, "timeout_s", -2), "timeout_s")
    bad(lambda: group.exchange(3, None), "LocalGroup.exchange", "rank")
    bad(lambda: run_emulated(3, 2), "run_emulated", "fn")
    bad(lambda: run_emulated(print, 0), "run_emulated", "nprocs")
    bad(lambda: run_emulated(print, 2, args=5), "run_emulated", "args")
    bad(lambda: run_emulated(print, 2, timeout_s=0), "run_emulated", "timeout_s")
    bad(lambda: transport(object(), "f", "grp"), "f: grp:", "process group")
    t = group.rank(1).transport()  # transport arguments raise before the collective: no wait
    t0 = time.monotonic()
    bad(lambda: t.all_to_all([np.zeros(2)] * 2), "LocalTransport.all_to_all", "send", "list of 3 arrays")
    bad(lambda: t.all_to_all(np.zeros((3, 2))), "send")
    bad(lambda: t.all_to_all([np.zeros((1, 2)), np.zeros((1, 3)), np.zeros((1, 2))]), "send[1]", "row shape")
    bad(lambda: t.all_to_all([np.zeros(1), np.zeros(1, np.float32), np.zeros(1)]), "send[1]", "dtype")
    bad(lambda: t.all_gather(np.float32(1.0)), "all_gather", "x", "ndim >= 1")
    bad(lambda: t.all_gather(np.zeros(2, [("a", "i4")])), "x", "structured")
    assert time.monotonic() - t0 < 5 and group.pending_ranks() == []


def test_sequential_join():
    group = LocalGroup(3)
    assert group.join(2, "c") is None and group.join(0, "a") is None
    assert group.pending_ranks() == [0, 2]
    assert group.join(0, "A") is None  # a rank that joins again replaces its item
    assert group.join(1, "b") == {0: "A", 1: "b", 2: "c"}
    assert group.pending_ranks() == []
    group.join(1, "x")
    group.reset()
    assert group.pending_ranks() == []
    with pytest.raises(DGArgumentError, match="LocalGroup.join: rank"):
        group.join(3, "x")


# ----------------------------------------------------------------------------------------------
# Mega MoE's EmulatedGroup is a LocalGroup
# ----------------------------------------------------------------------------------------------

def test_emulated_group_is_a_local_group():
    from deepgemm_ref.mega import EmulatedGroup, EmulatedRank, get_symm_buffer_for_mega_moe

    group = EmulatedGroup(2)
    view = group.rank(1)
    assert isinstance(group, LocalGroup) and isinstance(view, EmulatedRank) and isinstance(view, comm.LocalRank)
    assert view == group.rank(1) and view != group.rank(0) and view != EmulatedGroup(2).rank(1)
    assert hash(view) == hash(group.rank(1)) and repr(view) == "EmulatedRank(1 of 2)"
    assert repr(group) == "EmulatedGroup(size=2, collective=True)"
    assert view.barrier() is None  # one thread plays every rank: nothing to wait for
    assert isinstance(transport(view), comm.LocalTransport)
    with pytest.raises(DGArgumentError, match="EmulatedGroup: size"):
        EmulatedGroup(0)
    with pytest.raises(DGArgumentError, match=r"EmulatedGroup.rank: rank: expected an int in \[0, 2\)"):
        group.rank(2)

    # its ranks in threads: the blocking collectives and the transport's barrier work on it
    out: list[Any] = [None, None]

    def body(r):
        t = transport(group.rank(r))
        t.barrier()
        out[r] = t.all_to_all([np.array([10 * r + d]) for d in range(2)])

    threads = [threading.Thread(target=body, args=(r,)) for r in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    assert [[int(a[0]) for a in o] for o in out] == [[0, 10], [1, 11]]

    # buffers on its rank views; a one-rank run_emulated view hosts one too; a multi-rank one is
    # refused with the argument error (its ranks run in threads, the kernels' collective does not)
    buffers = [get_symm_buffer_for_mega_moe(group.rank(r), 8, 1, 2, 512, 512) for r in range(2)]
    assert group.buffer(0) is buffers[0] and group.buffer(1) is buffers[1]
    assert group.reset() is None and group.pending_ranks() == [] and group.unbound_ranks() == [0, 1]
    one = run_emulated(lambda g: get_symm_buffer_for_mega_moe(g, 8, 1, 2, 512, 512).num_experts, 1)
    assert one == [8]
    with pytest.raises(DGArgumentError, match="get_symm_buffer_for_mega_moe: group: expected .*EmulatedGroup"):
        run_emulated(lambda g: get_symm_buffer_for_mega_moe(g, 8, 1, 2, 512, 512), 2)


# ----------------------------------------------------------------------------------------------
# TorchTransport over gloo: N processes, the same bytes as the in-process form
# ----------------------------------------------------------------------------------------------

#: The process group's timeout in the gloo runs (init_process_group(timeout=...)).
GLOO_TIMEOUT_S = 20.0
#: The subgroup's timeout in the stalled-rank scenario.
STALL_TIMEOUT_S = 2.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _save(out_dir: Path, rank: int, results: dict[str, Any], log: dict[str, Any]) -> None:
    """Arrays as .npy of their bytes (no pickle), dtype and shape and messages in log.json."""
    d = out_dir / f"rank{rank}"
    d.mkdir(parents=True, exist_ok=True)
    arrays = {}
    for i, (key, v) in enumerate(results.items()):
        if isinstance(v, np.ndarray):
            np.save(d / f"{i}.npy", _bytes(v), allow_pickle=False)
            arrays[key] = [i, v.dtype.name, list(v.shape)]
        else:
            log[key] = v
    log["arrays"] = arrays
    (d / "log.json").write_text(json.dumps(log))


def _load(out_dir: Path, rank: int) -> tuple[dict[str, Any], dict[str, Any]]:
    d = out_dir / f"rank{rank}"
    log = json.loads((d / "log.json").read_text())
    results: dict[str, Any] = {}
    for key, (i, dtype, shape) in log.pop("arrays").items():
        dt = np.dtype(getattr(ml_dtypes, dtype)) if hasattr(ml_dtypes, dtype) else np.dtype(dtype)
        results[key] = np.load(d / f"{i}.npy", allow_pickle=False).view(dt).reshape(shape)
    for key in ("mismatch", "mismatch-dtype", "bad-argument"):
        results[key] = log.pop(key)
    return results, log


def _gloo_worker(rank: int, ranks: int, port: int, out_dir: str) -> None:
    """One process of a gloo run: the scenario, then a stalled rank (2 ranks) or a rank that
    exits (more ranks); writes what it saw into ``out_dir``.  Spawned: module level."""
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=ranks, timeout=datetime.timedelta(seconds=GLOO_TIMEOUT_S))
    group = dist.new_group(list(range(ranks)))
    t = transport(group)
    log: dict[str, Any] = {"transport": type(t).__name__}
    results = _scenario(t, rank, ranks)
    if ranks == 2:  # a stalled peer: the subgroup's timeout ends the wait
        stall = transport(dist.new_group([0, 1], timeout=datetime.timedelta(seconds=STALL_TIMEOUT_S)))
        t.barrier()
        if rank == 1:
            time.sleep(STALL_TIMEOUT_S + 1.0)
        t0 = time.monotonic()
        try:
            stall.all_gather(np.zeros(3, np.float32))
            log["stall"] = "no error"
        except RuntimeError as e:
            log["stall"] = f"{type(e).__name__}: {e}"
        log["stall_s"] = time.monotonic() - t0
    else:  # the last rank's process exits: the others' next collective fails
        t.barrier()
        if rank == ranks - 1:
            _save(Path(out_dir), rank, results, log)
            os._exit(0)
        t0 = time.monotonic()
        try:
            t.all_to_all([np.zeros((1, 2), ml_dtypes.bfloat16)] * ranks)
            log["death"] = "no error"
        except RuntimeError as e:
            log["death"] = f"{type(e).__name__}: {e}"
        log["death_s"] = time.monotonic() - t0
    _save(Path(out_dir), rank, results, log)
    os._exit(0)  # no teardown of a group with a failed peer


def _gloo_run(ranks: int, out_dir: Path) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    ctx = mp.get_context("spawn")
    port = _free_port()
    procs = [ctx.Process(target=_gloo_worker, args=(r, ranks, port, str(out_dir)), daemon=True) for r in range(ranks)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(180)
    for p in procs:
        if p.is_alive():
            p.kill()
    codes = [p.exitcode for p in procs]
    assert codes == [0] * ranks, f"gloo workers' exit codes {codes}"
    return [_load(out_dir, r) for r in range(ranks)]


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.parametrize("ranks", [2, 4])
def test_torch_transport_matches_local_transport_over_gloo(ranks, tmp_path):
    pytest.importorskip("torch")
    runs = _gloo_run(ranks, tmp_path)
    results = [r for r, _ in runs]
    logs = [log for _, log in runs]
    assert all(log["transport"] == "TorchTransport" for log in logs)
    _check_scenario(results, ranks)
    local = run_emulated(lambda g: _scenario(transport(g), g.rank(), g.size()), ranks, timeout_s=60)
    for r in range(ranks):  # the same bytes, and the same mismatch messages, in both forms
        assert local[r].keys() == results[r].keys()
        for key, v in local[r].items():
            if isinstance(v, np.ndarray):
                assert _same(results[r][key], v), (r, key)
            elif key != "bad-argument":
                assert results[r][key] == v, (r, key)
        assert results[r]["bad-argument"].startswith("TorchTransport.all_to_all: send[0]:")
    if ranks == 2:  # the stalled rank: rank 0 gives up after the subgroup's timeout, with an error
        assert logs[0]["stall"].startswith("RuntimeError: TorchTransport.all_gather: rank 0 of 2")
        assert "timeout" in logs[0]["stall"]
        assert STALL_TIMEOUT_S - 0.5 < logs[0]["stall_s"] < STALL_TIMEOUT_S + 8
        assert logs[1]["stall"].startswith("RuntimeError")
    else:  # the exited rank: the others fail, well within the process group's timeout
        for r in range(ranks - 1):
            assert logs[r]["death"].startswith("RuntimeError: TorchTransport.all_to_all: rank"), logs[r]["death"]
            assert logs[r]["death_s"] < GLOO_TIMEOUT_S


@pytest.mark.torch
def test_torch_transport_one_rank_in_this_process():
    """A one-rank gloo group (an in-memory store: no port, no process): the scenario's bytes."""
    pytest.importorskip("torch")
    import torch.distributed as dist

    if not dist.is_available() or dist.is_initialized():
        pytest.skip("torch.distributed unavailable, or a default group exists already")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        t = transport(dist.group.WORLD)
        assert isinstance(t, comm.TorchTransport) and isinstance(t, comm.Transport) and (t.rank, t.size) == (0, 1)
        results = _scenario(t, 0, 1)
    finally:
        dist.destroy_process_group()
    _check_scenario([results], 1)
    local = run_emulated(lambda g: _scenario(transport(g), g.rank(), g.size()), 1)[0]
    assert all(_same(results[k], v) for k, v in local.items() if isinstance(v, np.ndarray))
