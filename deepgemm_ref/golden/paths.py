"""Every path the CLI writes: checked before any work, written atomically with the umask's mode.

The rules (issue 29, group B), in one place for every command that writes:

* an output *file* (``replay --out``, ``check --junit / --html / --compare-table``, the PNGs of
  ``check --plot``) is a regular file or nothing: never a device node, FIFO, socket, directory or
  symlink (:func:`check_output_file`);
* an output *directory* (``golden --out``, ``export --out``, ``check --plot``) is a directory
  or nothing (``golden --out`` follows a symlink to a directory, as a symlinked bundle always did)
  (:func:`check_output_dir`);
* no output is one of the same run's inputs (the same file, or a path inside an input
  directory), two outputs of one run are never the same file, and no output lies inside a bundle
  (a directory holding ``manifest.json`` and ``cases/``) unless it is the bundle that run writes;
* a refusal is a :class:`~deepgemm_ref.errors.DGArgumentError` naming the option and the path
  (the CLI prints it as one line and exits 2);
* a file is written through a temporary file in the same directory (created with ``O_EXCL`` and
  mode ``0o666``, so the umask decides the final mode, 0644 under umask 022), flushed, fsynced
  and renamed over the target (:func:`atomic_write_bytes`); the temporary name stays within the
  file-name limit (:func:`temp_name`) and starts with ``.`` and ends with ``.tmp`` (the bundle's
  sweep removes such leftovers); a write error is re-raised as an :class:`OSError` whose
  ``filename`` is the target (``error: <path>: No space left on device``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path

from ..errors import DGArgumentError
from .reading import describe_mode

__all__ = ["name_max", "temp_name", "temp_path", "create_temp", "atomic_write_bytes", "atomic_write_text",
           "refuse_special", "check_output_file", "check_output_dir", "check_distinct", "enclosing_bundle",
           "ensure_dir", "fsync_directory"]

PathLike = str | os.PathLike[str]

_MANIFEST = "manifest.json"  # the bundle layout (bundle.py imports this module, so the names are repeated)
_CASES = "cases"


def name_max(directory: PathLike) -> int:
    """The file-name limit (bytes) of the file system holding ``directory`` (255 when unknown)."""
    try:
        n = os.pathconf(os.fspath(directory), "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        return 255
    return n if isinstance(n, int) and n > 0 else 255


def temp_name(name: str, limit: int = 255, tag: str = "") -> str:
    """A fresh temporary name for ``name`` that fits in ``limit`` bytes: ``.<name>.<tag><hex>.tmp``
    with ``name`` cut (on a UTF-8 character boundary) so that the whole stays within the limit."""
    suffix = f".{tag}{uuid.uuid4().hex[:12]}.tmp"
    room = max(limit - 1 - len(suffix.encode()), 1)
    raw = os.fsencode(name)
    if len(raw) > room:
        raw = raw[:room]
        while raw and (raw[-1] & 0xC0) == 0x80:  # drop a cut multi-byte character's tail bytes
            raw = raw[:-1]
        if raw and raw[-1] >= 0xC0:  # and its lead byte
            raw = raw[:-1]
    return "." + os.fsdecode(raw) + suffix


def temp_path(target: PathLike, tag: str = "") -> str:
    """A temporary path beside ``target`` (same directory) within the file-name limit."""
    target = os.fspath(target)
    directory = os.path.dirname(os.path.abspath(target))
    return os.path.join(directory, temp_name(os.path.basename(target), name_max(directory), tag))


def fsync_directory(directory: PathLike) -> None:
    """Make a rename durable where the platform allows opening a directory (not on Windows)."""
    try:
        fd = os.open(os.fspath(directory), os.O_RDONLY)
    except OSError:  # pragma: no cover - platform dependent
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - platform dependent
        pass
    finally:
        os.close(fd)


def _named(e: OSError, target: str) -> OSError:
    """``e`` with the target as its file name (the temporary name means nothing to a user)."""
    return OSError(e.errno, e.strerror or os.strerror(e.errno or errno.EIO), target)


def create_temp(target: PathLike) -> tuple[str, int]:
    """Create a new temporary file beside ``target`` (``O_EXCL``, mode 0o666 less the umask)."""
    target = os.fspath(target)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        tmp = temp_path(target)
        try:
            return tmp, os.open(tmp, flags, 0o666)
        except FileExistsError:  # pragma: no cover - a uuid4 collision
            continue
        except OSError as e:
            raise _named(e, target) from None
    raise OSError(errno.EEXIST, "could not create a temporary file", target)  # pragma: no cover


def atomic_write_bytes(path: PathLike, data: bytes | Iterable[bytes | memoryview]) -> None:
    """Write ``data`` (bytes, or chunks of bytes) to ``path`` atomically: a temporary file in the
    same directory, flushed, fsynced, renamed over ``path``; the directory fsynced.  On any error
    the temporary file is removed, ``path`` is left as it was, and an :class:`OSError` names ``path``."""
    target = os.fspath(path)
    refuse_special(target)
    tmp, fd = create_temp(target)
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in ([data] if isinstance(data, bytes | bytearray | memoryview) else data):
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise _named(e, target) from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_directory(os.path.dirname(os.path.abspath(target)))


def atomic_write_text(path: PathLike, text: str) -> None:
    """:func:`atomic_write_bytes` of ``text`` in UTF-8."""
    atomic_write_bytes(path, text.encode("utf-8"))


# ----------------------------------------------------------------------------------------------
# checks, before any work
# ----------------------------------------------------------------------------------------------

def refuse_special(path: PathLike, flag: str = "") -> None:
    """The safety net of every writer: an existing ``path`` that is not a regular file (a device,
    FIFO, socket, directory or symlink) is never replaced (a :class:`DGArgumentError`)."""
    p = os.fspath(path)
    try:
        st = os.lstat(p)
    except OSError:
        return
    if not stat.S_ISREG(st.st_mode):
        raise DGArgumentError(f"{flag + ' ' if flag else ''}{p}: is {describe_mode(st.st_mode)}, not a regular file "
                              "(refused: never replaced)")


def _is_bundle(d: str) -> bool:
    try:
        return stat.S_ISREG(os.lstat(os.path.join(d, _MANIFEST)).st_mode) and os.path.isdir(os.path.join(d, _CASES))
    except OSError:
        return False


def enclosing_bundle(path: PathLike, *, include_self: bool = False) -> str | None:
    """The bundle directory (one holding ``manifest.json`` and ``cases/``) that ``path`` lies in,
    symlinks resolved; ``path`` itself counts only with ``include_self``.  None if there is none."""
    real = os.path.realpath(os.fspath(path))
    d = real if include_self else os.path.dirname(real)
    while True:
        if _is_bundle(d):
            return d
        parent = os.path.dirname(d)
        if parent == d:
            return None
        d = parent


def _within(real: str, top: str) -> bool:
    return real == top or real.startswith(top.rstrip(os.sep) + os.sep)


def _same_as_input(flag: str, path: str, inputs: Sequence[tuple[str, PathLike]]) -> None:
    real = os.path.realpath(path)
    try:
        st_out: os.stat_result | None = os.stat(path)
    except OSError:
        st_out = None
    for in_flag, src in inputs:
        src = os.fspath(src)
        src_real = os.path.realpath(src)
        same = _within(real, src_real)
        if not same and st_out is not None:
            with contextlib.suppress(OSError):
                same = os.path.samefile(path, src)
        if same:
            what = "the same file" if real == src_real or not _within(real, src_real) else "a path inside it"
            raise DGArgumentError(f"{flag} {path}: overlaps the input {in_flag} {src} ({what}; an output never "
                                  "replaces or enters one of the run's inputs)")


def _parent_ok(flag: str, path: str) -> None:
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise DGArgumentError(f"{flag} {path}: the directory {parent} does not exist")


def check_output_file(flag: str, path: PathLike, inputs: Sequence[tuple[str, PathLike]] = (),
                      own_bundle: PathLike | None = None) -> None:
    """Refuse an output file path (exit 2, naming ``flag`` and ``path``) unless it is a regular
    file or nothing, its directory exists, it is none of ``inputs`` (``(flag, path)`` pairs;
    a path inside an input directory counts) and it lies in no bundle other than ``own_bundle``."""
    p = os.fspath(path)
    if not p:
        raise DGArgumentError(f"{flag}: an empty path")
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise DGArgumentError(f"{flag} {p}: {e.strerror}") from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        extra = ""
        if stat.S_ISLNK(st.st_mode):
            extra = " (refused: write to the file it names instead)"
        raise DGArgumentError(f"{flag} {p}: is {describe_mode(st.st_mode)}, not a regular file{extra}")
    _parent_ok(flag, p)
    _same_as_input(flag, p, inputs)
    _not_in_bundle(flag, p, own_bundle, include_self=False)


def check_output_dir(flag: str, path: PathLike, inputs: Sequence[tuple[str, PathLike]] = (),
                     own_bundle: PathLike | None = None, *, need_parent: bool = True,
                     follow_symlink: bool = False) -> None:
    """Refuse an output directory path (exit 2, naming ``flag`` and ``path``) unless it is a
    directory (a symlink to one only with ``follow_symlink``) or nothing, none of ``inputs`` and in no bundle
    other than ``own_bundle`` (the directory itself may be ``own_bundle``)."""
    p = os.fspath(path)
    if not p:
        raise DGArgumentError(f"{flag}: an empty path")
    if not follow_symlink and os.path.islink(p):
        raise DGArgumentError(f"{flag} {p}: is a symlink (refused: name the directory itself)")
    try:
        st = os.stat(p)  # with follow_symlink, a symlink to a directory is followed
    except FileNotFoundError:
        if os.path.islink(p):
            raise DGArgumentError(f"{flag} {p}: is a dangling symlink") from None
        st = None
    except OSError as e:
        raise DGArgumentError(f"{flag} {p}: {e.strerror}") from None
    if st is not None and not stat.S_ISDIR(st.st_mode):
        kind = "a regular file" if stat.S_ISREG(st.st_mode) else describe_mode(st.st_mode)
        raise DGArgumentError(f"{flag} {p}: is {kind}, not a directory")
    if need_parent:
        _parent_ok(flag, p)
    _same_as_input(flag, p, inputs)
    _not_in_bundle(flag, p, own_bundle, include_self=own_bundle is None)


def _not_in_bundle(flag: str, path: str, own_bundle: PathLike | None, include_self: bool) -> None:
    found = enclosing_bundle(path, include_self=include_self)
    if found is None:
        return
    if own_bundle is not None and os.path.realpath(os.fspath(own_bundle)) == found:
        return
    raise DGArgumentError(f"{flag} {path}: lies inside the bundle {found} (refused: write outside a bundle)")


def check_distinct(outputs: Sequence[tuple[str, PathLike | None]]) -> None:
    """Refuse two output options of one run that name the same file."""
    seen: dict[str, str] = {}
    for flag, path in outputs:
        if not path:
            continue
        real = os.path.realpath(os.fspath(path))
        if real in seen:
            raise DGArgumentError(f"{flag} {os.fspath(path)}: the same file as {seen[real]} (refused)")
        seen[real] = f"{flag} {os.fspath(path)}"


def ensure_dir(flag: str, path: PathLike) -> Path:
    """Create an output directory checked by :func:`check_output_dir` (its parents too)."""
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DGArgumentError(f"{flag} {p}: cannot create the directory: {e.strerror}") from None
    return p
