"""The transport of a ``torch.distributed`` process group (one rank per process; gloo on a CPU).

Every collective runs in two steps over the group:

1. a header, all-gathered (int64, the same length on every rank): a magic number, a digest of
   the collective's label (:func:`~deepgemm_ref.comm.transport.collective_label`: the
   collective, the dtype and the row shape), the label's text, and this rank's row counts (per
   destination for ``all_to_all``).  Ranks whose headers disagree all raise the same
   :class:`~deepgemm_ref.comm.CollectiveMismatch` before any data moves;
2. the data as bytes: ``torch.distributed.all_to_all_single`` with per-rank split sizes over
   ``uint8`` views (``all_gather`` sends this rank's bytes to every rank), skipped when no rank
   has a byte to send.  gloo (torch 2.13) refuses float8, int16 and the unsigned types wider
   than a byte ("Invalid scalar type"); as bytes every dtype travels, bitwise.

Every transport records its process (host name and pid) in the default store of
``torch.distributed`` when it is made; when a collective fails, the error names the ranks whose
process on this host has exited and the ranks that never made a transport. Nothing is pickled.
Waits are bounded by the process group's timeout (the ``timeout`` given to
``torch.distributed.init_process_group`` or ``new_group``; torch's default for gloo is 30
minutes): a rank whose peer never calls the collective raises after it, and a rank whose peer
process exited raises as soon as the connection drops. Either way the ``RuntimeError`` names the
collective and this rank, with torch's error as its cause.
"""

from __future__ import annotations

import hashlib
import os
import socket
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from ._rows import CollectiveMismatch, as_rows, collective_label, mismatch_message, send_arrays

__all__ = ["TorchTransport"]

#: First word of every header ("DGRC" and a format version).
_MAGIC = 0x44475243_00000001
#: Header words before the label text and the row counts: magic, digest, label length.
_FIXED = 3
#: Bytes of label text carried (longer labels are compared by their digest and shown cut).
_LABEL_BYTES = 192


def _digest(label: str) -> int:
    return int.from_bytes(hashlib.blake2b(label.encode(), digest_size=8).digest(), "little", signed=True)


class TorchTransport:
    """A rank's end of a ``torch.distributed`` process group's collectives (``group``: a
    ``ProcessGroup`` this process belongs to).  Arrays of any plain dtype (numpy's, ml_dtypes'
    bfloat16 and float8 formats, bool) come back bitwise, as fresh C-contiguous arrays."""

    def __init__(self, group: Any) -> None:
        self.group = group
        self._register()

    @property
    def rank(self) -> int:
        return int(self.group.rank())

    @property
    def size(self) -> int:
        return int(self.group.size())

    def barrier(self) -> None:
        """Every rank has arrived (the header exchange of a ``barrier`` label is the barrier)."""
        self._header("barrier", collective_label("barrier"), [0] * self.size)

    def all_to_all(self, send: Sequence[np.ndarray]) -> list[np.ndarray]:
        """``send[d]`` (rows of one dtype and row shape) to rank d; the rows each rank sent here."""
        size, me = self.size, self.rank
        arrays = send_arrays("TorchTransport.all_to_all", send, size)
        like = arrays[0]
        counts = self._header("all_to_all", collective_label("all_to_all", like), [len(a) for a in arrays])
        row_bytes = like.itemsize * int(np.prod(like.shape[1:], dtype=np.int64))
        recv_rows = [int(counts[s][me]) for s in range(size)]
        payload = np.concatenate([_bytes(a) for a in arrays]) if arrays else np.zeros(0, np.uint8)
        received = self._move("all_to_all", payload, [a.nbytes for a in arrays],
                              [n * row_bytes for n in recv_rows], int(counts.sum()) * row_bytes)
        return _split(received, recv_rows, like)

    def all_gather(self, x: np.ndarray) -> list[np.ndarray]:
        """Every rank's ``x`` in rank order (row counts may differ)."""
        size = self.size
        a = as_rows("TorchTransport.all_gather", "x", x)
        counts = self._header("all_gather", collective_label("all_gather", a), [len(a)] + [0] * (size - 1))
        row_bytes = a.itemsize * int(np.prod(a.shape[1:], dtype=np.int64))
        rows = [int(counts[s][0]) for s in range(size)]
        mine = _bytes(a)
        received = self._move("all_gather", np.tile(mine, size), [mine.size] * size,
                              [n * row_bytes for n in rows], int(sum(rows)) * row_bytes)
        return _split(received, rows, a)

    # -- the two steps -----------------------------------------------------------------------------

    def _header(self, op: str, label: str, rows: list[int]) -> np.ndarray:
        """All-gather this rank's header; every rank's row counts, (size, size) int64, once the
        labels agree (else every rank raises the same CollectiveMismatch)."""
        import torch
        import torch.distributed as dist

        size = self.size
        text = label.encode()
        words = np.zeros(_FIXED + _LABEL_BYTES // 8 + size, np.int64)
        words[0], words[1], words[2] = _MAGIC, _digest(label), len(text)
        words[_FIXED:_FIXED + _LABEL_BYTES // 8].view(np.uint8)[:min(len(text), _LABEL_BYTES)] = \
            np.frombuffer(text[:_LABEL_BYTES], np.uint8)
        words[_FIXED + _LABEL_BYTES // 8:] = rows
        out = [torch.empty(words.size, dtype=torch.int64) for _ in range(size)]
        self._call(op, lambda: dist.all_gather(out, torch.from_numpy(words), group=self.group))
        headers = np.stack([t.numpy() for t in out])
        if not np.all(headers[:, 0] == _MAGIC):
            raise CollectiveMismatch(f"ranks {np.flatnonzero(headers[:, 0] != _MAGIC).tolist()} "
                                     "did not send a deepgemm_ref transport header (a torch.distributed collective "
                                     "of their own at the same time?)")
        if not np.all(headers[:, 1] == headers[0, 1]):
            raise CollectiveMismatch(mismatch_message([_label_of(h) for h in headers]))
        counts: np.ndarray = headers[:, _FIXED + _LABEL_BYTES // 8:]
        return counts

    def _move(self, op: str, payload: np.ndarray, send_bytes: list[int], recv_bytes: list[int],
              total: int) -> np.ndarray:
        """all_to_all_single of bytes with split sizes; ``total`` (every rank's bytes, the same on
        every rank) 0 skips it on every rank."""
        import torch
        import torch.distributed as dist

        out = np.empty(sum(recv_bytes), np.uint8)
        if total == 0:
            return out
        t_out, t_in = torch.from_numpy(out), torch.from_numpy(payload)
        self._call(op, lambda: dist.all_to_all_single(t_out, t_in, output_split_sizes=recv_bytes,
                                                      input_split_sizes=send_bytes, group=self.group))
        return out

    def _call(self, op: str, fn: Any) -> None:
        try:
            fn()
        except Exception as e:
            peers = self._failed_peers()
            raise RuntimeError(f"TorchTransport.{op}: rank {self.rank} of {self.size}: the process group failed "
                               f"({type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}); "
                               + (f"{peers}" if peers else "a peer process may have exited, or the wait passed the "
                                  "group's timeout (torch.distributed.init_process_group(timeout=...))")) from e

    # -- naming the ranks that failed ---------------------------------------------------------------

    def _key(self, rank: int) -> str:
        import torch.distributed as dist

        return _PROCESS_KEY + str(dist.get_global_rank(self.group, rank))

    def _register(self) -> None:
        """Record this process (host, pid) under this rank's key in the default store (best effort)."""
        try:
            _default_store().set(self._key(self.rank), f"{socket.gethostname()} {os.getpid()}")
        except Exception:  # noqa: BLE001 - naming failed peers is best effort
            pass

    def _failed_peers(self, wait_s: float = 5.0) -> str:
        """The ranks whose process on this host has exited and those that have not made a
        transport within ``wait_s`` seconds ("" if none is found or the store cannot tell)."""
        try:
            store = _default_store()
            host = socket.gethostname()
            deadline = time.monotonic() + wait_s
            while True:
                exited, absent = [], []
                for r in range(self.size):
                    if r == self.rank:
                        continue
                    key = self._key(r)
                    if not store.check([key]):
                        absent.append(r)
                        continue
                    where, pid = store.get(key).decode().split()
                    if where == host and not _alive(int(pid)):
                        exited.append(f"rank {r} (process {pid}) has exited")
                # a live peer may still be on its way to its first transport, and a peer's sockets
                # close before its process is gone: look again for a while
                if (exited and not absent) or time.monotonic() >= deadline:
                    break
                time.sleep(0.1)
            if absent:
                exited.append(f"rank{'s' if len(absent) > 1 else ''} {', '.join(map(str, absent))} never joined "
                              "(no deepgemm_ref transport was made there)")
            return "; ".join(exited)
        except Exception:  # noqa: BLE001 - the store itself may be gone with its host rank
            return ""

    def __repr__(self) -> str:
        return f"TorchTransport({self.group!r})"


#: The default store's key prefix under which each rank records its process.
_PROCESS_KEY = "deepgemm_ref/process/"


def _default_store() -> Any:
    import torch.distributed as dist

    return dist.distributed_c10d._get_default_store()


def _alive(pid: int) -> bool:
    """Whether process ``pid`` of this host runs (a zombie has exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:  # no procfs: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def _bytes(a: np.ndarray) -> np.ndarray:
    """The bytes of a C-contiguous array, flat."""
    return a.reshape(-1).view(np.uint8) if a.size else np.zeros(0, np.uint8)


def _split(received: np.ndarray, rows: list[int], like: np.ndarray) -> list[np.ndarray]:
    """Cut ``received`` into arrays of ``rows[s]`` rows like ``like`` (dtype, row shape)."""
    out, at = [], 0
    row_shape = like.shape[1:]
    row_bytes = like.itemsize * int(np.prod(row_shape, dtype=np.int64))
    for n in rows:
        seg = received[at:at + n * row_bytes]
        at += n * row_bytes
        out.append(seg.view(like.dtype).reshape((n,) + row_shape) if seg.size else np.zeros((n,) + row_shape,
                                                                                                 like.dtype))
    return out


def _label_of(header: np.ndarray) -> str:
    n = int(header[2])
    text = header[_FIXED:_FIXED + _LABEL_BYTES // 8].view(np.uint8)[:min(n, _LABEL_BYTES)].tobytes().decode(
        errors="replace")
    return text if n <= _LABEL_BYTES else text + "..."
