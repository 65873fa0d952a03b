"""One rank process of a case generated with ``--executor processes`` (see :mod:`.ranks`).

Started by :func:`.generation._run_ranked` as ``python -m deepgemm_ref.golden._rank_worker --job
FILE --rank r --world R``.  The job file (JSON) names the case specification, the bundle's
directory, the memory limit, the file store of the gloo group, where rank 0 reports and the
parent's process id.  Every rank joins the group, builds the case, computes its rank's goldens and
tells the others how it went; if all went well rank 0 gathers the parts, merges them, writes the
case file and reports its manifest entry; otherwise rank 0 reports the first rank's error, or that
the kernels refused the process group on every rank (the parent then computes the case itself).
SIGINT is ignored (the parent stops its rank processes with SIGTERM); a rank whose parent is gone
exits.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from .._parallel import limit_blas_threads
from ..comm import TorchTransport
from ..toolkit.sizes import limit_allocations
from .bundle import atomic_write_text
from .cases import build_case, validate_spec
from .generation import _failure, _HoldSigterm, _json_clean, write_case
from .lifecycle import die_with_parent
from .ranks import agree, gather_to_root, group_refused, merge_golden, pack, rank_golden, unpack


def _watch_parent(pid: int) -> None:
    """Exit when the parent that started this rank is gone (its group would never finish)."""

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != pid:
                os._exit(3)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _report(path: str, obj: dict[str, Any]) -> None:
    atomic_write_text(Path(path), json.dumps(_json_clean(obj), allow_nan=False))


def _run(job: dict[str, Any], rank: int, world: int, group: Any) -> int:
    tr = TorchTransport(group)
    limit = int(job["limit"])
    parts: dict[str, Any] = {}
    info: dict[str, Any] = {}
    built = None
    status: dict[str, Any]
    try:
        built = build_case(validate_spec(job["spec"]), max_memory=limit)
        with limit_allocations(limit):
            parts, info = rank_golden(built, rank, group)
        status = {"ok": True}
    except Exception as e:  # every rank learns how every other rank did before any data moves
        status = {"fallback": str(e)} if group_refused(e) else {"error": _failure(e)}
    statuses = agree(tr, status)
    if not all(s.get("ok") for s in statuses):
        if rank == 0:
            if all("fallback" in s for s in statuses):
                _report(job["result"], {"fallback": statuses[0]["fallback"]})
            else:
                r, bad = next((r, s) for r, s in enumerate(statuses) if not s.get("ok"))
                err = bad.get("error") or {"kind": "internal", "message": f"the kernels refused the group: "
                                                                             f"{bad.get('fallback')}"}
                _report(job["result"], {"error": {"kind": err["kind"],
                                                  "message": f"rank {r} of {world}: {err['message']}"}})
        return 0
    got = gather_to_root(tr, pack(parts, _json_clean(info)))
    if got is None:
        return 0
    assert built is not None
    try:
        unpacked = [unpack(g) for g in got]
        golden, stats = merge_golden(built, [u[0] for u in unpacked], [u[1] for u in unpacked])
        # SIGTERM is held from writing the file until the entry is reported (as in the pool's workers)
        entry = write_case(built, golden, _json_clean(stats), Path(job["root"]), bool(job["overwrite"]),
                           guard=_HoldSigterm)
        try:
            _report(job["result"], {"entry": entry})
        finally:
            _HoldSigterm.release()
    except Exception as e:
        _report(job["result"], {"error": _failure(e)})
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    p = argparse.ArgumentParser(prog="python -m deepgemm_ref.golden._rank_worker")
    p.add_argument("--job", required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    args = p.parse_args(argv)
    with open(args.job, encoding="utf-8") as f:
        job = json.load(f)
    die_with_parent(int(job["parent"]))  # killed with the run (Linux); the watch below elsewhere
    _watch_parent(int(job["parent"]))
    limit_blas_threads(int(job["threads"]))
    try:
        import torch.distributed as dist
    except ImportError as e:
        if args.rank == 0:
            _report(job["result"], {"error": {"kind": "input", "message": f"torch.distributed is not importable: "
                                                                          f"{e}"}})
        return 2
    if not dist.is_available():
        if args.rank == 0:
            _report(job["result"], {"error": {"kind": "input", "message": "this torch has no torch.distributed"}})
        return 2
    dist.init_process_group("gloo", init_method=Path(job["store"]).as_uri(), world_size=args.world, rank=args.rank,
                            timeout=timedelta(seconds=float(job["timeout_s"])))
    try:
        return _run(job, args.rank, args.world, dist.group.WORLD)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    # The result is written (atomically) and the group destroyed: end without the interpreter's
    # teardown, where torch's gloo can abort a process ("terminate called without an active
    # exception", SIGABRT) and turn a finished rank into a failed one.
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
