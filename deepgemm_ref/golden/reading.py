"""Reading a file someone named: a regular file or a refusal, never a hang or an unbounded read.

Every file the golden tools read (a specification, a threshold table, a manifest, a case file,
an outputs file, a dump's files) goes through :func:`open_regular`:

* it is checked with ``stat`` before it is opened, and opened with ``O_NONBLOCK`` (so a FIFO put
  in its place cannot block the ``open``, and a FIFO that appears between the check and the
  ``open`` is still refused), ``O_NOFOLLOW`` where symlinks are refused, then checked again with
  ``fstat`` on the open descriptor: anything but a regular file (FIFO, socket, character or block
  device such as ``/dev/zero``, directory) is refused naming the file and what it is;
* its size is checked against a limit before a byte is read, and :func:`read_regular` reads at
  most ``limit + 1`` bytes, so a file that grows while it is read is refused too.

What is read can hold any string JSON can: :func:`printable` makes one writable to any report
(a lone surrogate such as ``"\\ud800"`` is valid JSON but cannot be encoded as UTF-8).
:func:`strict_json` parses JSON refusing duplicate keys (and NaN / infinity unless asked);
:func:`read_table_file` reads a specification or threshold table, JSON or TOML.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from typing import Any, BinaryIO

from ..errors import DGArgumentError

__all__ = ["describe_mode", "open_regular", "printable", "read_bounded", "read_regular", "read_table_file",
           "strict_json"]


def describe_mode(mode: int) -> str:
    """What a file of ``st_mode`` ``mode`` is, in words (``"a FIFO"``, ``"a directory"``, ...)."""
    for test, text in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISLNK, "a symlink")):
        if test(mode):
            return text
    return "not a regular file"


def _size_text(n: int) -> str:
    from .resources import format_size

    return format_size(n)


def open_regular(path: str | os.PathLike[str], what: str, *, limit: int | None = None,
                 error: type[DGArgumentError] = DGArgumentError, follow: bool = True) -> BinaryIO:
    """Open ``path`` for reading in binary mode, refusing (``error``, naming the file and ``what``
    it was to be) anything but a regular file, and a file over ``limit`` bytes (None: no limit).

    follow: whether a symlink at ``path`` itself is followed (False: refused, ``O_NOFOLLOW``).
    The returned file is in blocking mode again and positioned at its start."""
    p = os.fspath(path)
    try:
        st = os.stat(p) if follow else os.lstat(p)
    except OSError as e:
        if e.errno == errno.ENOENT:
            raise error(f"{p}: cannot read the {what}: missing") from None
        if e.errno == errno.ELOOP:
            raise error(f"{p}: a symlink loop ({what})") from None
        raise error(f"{p}: cannot read the {what}: {e.strerror or e}") from None
    if stat.S_ISLNK(st.st_mode) and not follow:
        raise error(f"{p}: is a symlink (refused: {what})")
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{p}: not a regular file but {describe_mode(st.st_mode)} ({what})")
    flags = (os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
             | getattr(os, "O_BINARY", 0) | (0 if follow else getattr(os, "O_NOFOLLOW", 0)))
    try:
        fd = os.open(p, flags)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise error(f"{p}: is a symlink (refused: {what})") from None
        raise error(f"{p}: cannot read the {what}: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{p}: not a regular file but {describe_mode(st.st_mode)} ({what})")
        if limit is not None and st.st_size > limit:  # refused by size, before a byte is read
            raise error(f"{p}: {_size_text(st.st_size)}; a {what} is at most {_size_text(limit)}")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bounded(f: BinaryIO, limit: int) -> bytes:
    """The rest of the open regular file ``f``, at most ``limit + 1`` bytes (more than ``limit``:
    it grew while being read).  Memory is taken as the file's size says, never ``limit`` up front."""
    chunks: list[bytes] = []
    total = 0
    want = max(0, os.fstat(f.fileno()).st_size - f.tell()) + 1
    while total <= limit:
        chunk = f.read(min(want, limit + 1 - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
        want = 1 << 16
    return b"".join(chunks)


def read_regular(path: str | os.PathLike[str], what: str, *, limit: int,
                 error: type[DGArgumentError] = DGArgumentError, follow: bool = True) -> bytes:
    """The bytes of the regular file ``path`` (see :func:`open_regular`), at most ``limit`` of
    them: a file over ``limit`` bytes, or one that grew past it while being read, is refused."""
    with open_regular(path, what, limit=limit, error=error, follow=follow) as f:
        try:
            data = read_bounded(f, limit)
        except OSError as e:
            raise error(f"{os.fspath(path)}: cannot read the {what}: {e.strerror or e}") from None
    if len(data) > limit:
        raise error(f"{os.fspath(path)}: grew past {_size_text(limit)} while being read; a {what} is at most "
                    f"{_size_text(limit)}")
    return data


def printable(text: str) -> str:
    """``text`` with every character UTF-8 cannot encode (a lone surrogate, U+D800..U+DFFF) written
    as its backslash escape (``"\\ud800"``): safe to write to any UTF-8 report or stream."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def _unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k!r}")
        out[k] = v
    return out


def strict_json(text: str | bytes, *, allow_nan: bool = False) -> Any:
    """``json.loads`` that refuses duplicate keys and (unless ``allow_nan``) the NaN / Infinity
    constants (ValueError), and turns a nesting too deep for the parser into a ValueError too."""
    try:
        if allow_nan:
            return json.loads(text, object_pairs_hook=_unique_object)
        return json.loads(text, object_pairs_hook=_unique_object, parse_constant=_reject_constant)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def read_table_file(path: str | os.PathLike[str], what: str, option: str, *, limit: int) -> Any:
    """The data of a JSON file, or a TOML one (``.toml``), that a command's ``option`` names: a
    regular file of at most ``limit`` bytes (:func:`read_regular`), UTF-8, parsed strictly
    (:func:`strict_json`).  Every problem is a :class:`DGArgumentError` starting with ``option``
    and naming the file (``"check: --thresholds t.toml: not valid TOML: ..."``)."""
    p = os.fspath(path)
    try:
        raw = read_regular(p, what, limit=limit)
    except DGArgumentError as e:
        raise DGArgumentError(f"{option} {e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DGArgumentError(f"{option} {p}: not UTF-8 text ({e})") from None
    if p.endswith(".toml"):
        try:
            import tomllib
        except ImportError:  # Python 3.10
            raise DGArgumentError(f"{option} {p}: TOML needs Python >= 3.11 (use JSON)") from None
        try:
            return tomllib.loads(text)
        except (ValueError, RecursionError) as e:
            raise DGArgumentError(f"{option} {p}: not valid TOML: {e}") from None
    try:
        return strict_json(text)
    except ValueError as e:
        raise DGArgumentError(f"{option} {p}: not valid JSON: {e}") from None
