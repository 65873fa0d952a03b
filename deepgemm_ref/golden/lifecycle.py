"""A golden run's lifecycle: one run per bundle (an advisory lock), workers that die with their
parent, and the sibling directory a ``--force`` run builds in.

* :class:`BundleLock`: ``fcntl.flock`` (exclusive, non-blocking) on ``<bundle>/.lock``.  The
  kernel releases it when the last process holding the open file dies, so a SIGKILL never leaves
  anything that blocks a later ``--resume``; worker processes inherit the descriptor and keep the
  lock while they live (a worker orphaned by a killed run keeps its bundle locked, which is the
  point).  The file itself stays (removing a lock file would race with a run opening it).
* :func:`die_with_parent`: called first thing in a worker; on Linux ``prctl(PR_SET_PDEATHSIG,
  SIGKILL)`` makes the kernel kill the worker when its parent dies, and a check of ``getppid``
  closes the window in which the parent died before the call.  Elsewhere only the check runs (the
  workers also stop when their pipe to the parent closes).
* :func:`sibling_name` / :func:`stale_siblings`: the temporary sibling of a bundle
  (``.<name>.new-<hex>``), its name within the file-name limit (a long bundle name is shortened
  and a hash of it added), and the siblings interrupted runs left behind.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import os
import signal
import sys
import uuid
from pathlib import Path
from typing import Any

from .bundle import BundleError

__all__ = ["LOCK_NAME", "BundleLock", "die_with_parent", "sibling_name", "sibling_prefix", "stale_siblings",
           "NAME_MAX"]

#: The lock file inside a bundle (and inside a ``--force`` run's sibling build directory).
LOCK_NAME = ".lock"
#: The longest file name (bytes) the common file systems take.
NAME_MAX = 255
_PR_SET_PDEATHSIG = 1


class BundleLock:
    """An exclusive advisory lock on ``<directory>/.lock`` (the directory must exist).

    :meth:`acquire` raises :class:`.bundle.BundleError` at once when another run holds it.  The
    descriptor is inheritable (``fork`` workers and ``pass_fds`` subprocesses keep the lock)."""

    def __init__(self, directory: Path, bundle: Path | None = None) -> None:
        self.directory = Path(directory)
        self.bundle = Path(bundle) if bundle is not None else self.directory
        self.fd: int | None = None

    def acquire(self) -> BundleLock:
        path = self.directory / LOCK_NAME
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
        except OSError as e:
            raise BundleError(f"{self.bundle}: cannot open its lock file {path.name}: {e.strerror or e}") from None
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX: no lock, as before
            self.fd = fd
            return self
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise BundleError(f"{self.bundle}: another golden run holds this bundle (its lock {path} is taken); "
                              "wait for it to finish or stop it, then run again") from None
        except OSError as e:
            os.close(fd)
            raise BundleError(f"{self.bundle}: cannot lock {path}: {e.strerror or e}") from None
        os.set_inheritable(fd, True)
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing our descriptor releases the lock (once no worker holds it)
            self.fd = None

    def __enter__(self) -> BundleLock:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


def is_locked(directory: Path) -> bool:
    """Whether a live run holds ``directory``'s lock (False when it has no lock file)."""
    try:
        fd = os.open(Path(directory) / LOCK_NAME, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return False
    try:
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except (ImportError, BlockingIOError):
        return True
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def die_with_parent(parent: int) -> None:
    """In a worker process: be killed (SIGKILL) when ``parent`` (the process that started this
    one) dies; exit at once if it already has."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):  # pragma: no cover - no libc prctl: the check below remains
            pass
    if os.getppid() != parent:
        os._exit(3)


def sibling_prefix(root: Path) -> str:
    """The name prefix of ``root``'s temporary siblings: ``.<name>.`` or, for a name too long
    to take a suffix within :data:`NAME_MAX`, a shortened name and a hash of the whole."""
    name = root.name
    if len(os.fsencode(name)) + 30 <= NAME_MAX:
        return f".{name}."
    digest = hashlib.sha256(os.fsencode(name)).hexdigest()[:12]
    cut = name
    while len(os.fsencode(cut)) > NAME_MAX - 50:
        cut = cut[:-1]
    return f".{cut}~{digest}."


def sibling_name(root: Path, kind: str) -> Path:
    """A fresh temporary sibling of ``root`` (``kind``: "new", the build directory, or "old")."""
    return root.parent / f"{sibling_prefix(root)}{kind}-{uuid.uuid4().hex[:12]}"


def stale_siblings(root: Path, keep: Path | None = None) -> list[Path]:
    """The temporary siblings of ``root`` that no live run holds (left by interrupted runs)."""
    prefix = sibling_prefix(root)
    try:
        names = os.listdir(root.parent)
    except OSError:
        return []
    out = []
    for name in sorted(names):
        if not name.startswith(prefix):
            continue
        rest = name[len(prefix):]
        if not (rest.startswith(("new-", "old-")) and len(rest) == 16):
            continue
        p = root.parent / name
        if keep is not None and p == keep:
            continue
        if p.is_symlink() or not p.is_dir() or is_locked(p):
            continue
        out.append(p)
    return out
