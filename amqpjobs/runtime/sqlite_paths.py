"""The path of a SQLite store's file: what the argument must be, and what it may name."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Final

from amqpjobs.errors import ConfigurationError


def file_path(owner: str, path: str | Path) -> Path:
    """The absolute path of a SQLite store's file (the worker's threads and processes each open it).

    Raises:
        ConfigurationError: ``path`` is ``:memory:`` or empty (SQLite's in-memory and temporary
            databases): each connection would have its own, so no table is found; or it is no
            path (not a ``str`` or ``os.PathLike``, or it holds a NUL character). What it names is
            judged at the store's first open (:func:`check_kind`).
    """
    try:
        text = os.fspath(path) if isinstance(path, str | os.PathLike) else None
    except TypeError:  # an os.PathLike whose __fspath__ gives neither str nor bytes
        text = None
    if not isinstance(text, str):
        raise ConfigurationError(
            f"{owner}(path): a file path is a str or pathlib.Path, got {type(path).__name__}"
            + (" giving bytes" if isinstance(text, bytes) else "")
        )
    if "\x00" in text:
        raise ConfigurationError(f"{owner}({text!r}): a file path can't hold a NUL character")
    try:
        os.fsencode(text)
    except UnicodeEncodeError as exc:  # a lone surrogate the file system can't take
        raise ConfigurationError(f"{owner}({text!r}): the file system can't encode this path ({exc.reason})") from None
    if str(path) in (":memory:", ""):
        raise ConfigurationError(
            f"{owner}({str(path)!r}): an in-memory or temporary SQLite database is one connection's own, and the "
            "worker's threads and processes each open their own; give the path of a file"
        )
    return Path(path).absolute()


def check_kind(owner: str, given: str | os.PathLike[str], absolute: Path) -> None:
    """Raise unless ``absolute`` (the store's :func:`file_path` of ``given``) is a regular file, or is not there.

    Called in the store's first open (:meth:`~amqpjobs.runtime.sqlite_open.StoreFile.opening`): the file
    system's state, judged for the named app only, as the open's other failures are.

    Raises:
        ConfigurationError: it names a folder, a FIFO, a device or a socket.
    """
    try:
        mode: int | None = os.stat(absolute).st_mode
    except OSError:  # missing (the first open creates it) or out of reach: the open says why
        mode = None
    if mode is not None and not stat.S_ISREG(mode):  # SQLite would fail on it with words about disks or rollbacks
        kind = _KINDS.get(stat.S_IFMT(mode), "no regular file")
        raise ConfigurationError(
            f"{owner}({os.fspath(given)!r}): {absolute} is {kind}, not a regular file; give the path of a SQLite "
            "database file (created when missing)"
        )


#: What a path that is no regular file is, by its file type.
_KINDS: Final = {stat.S_IFDIR: "a folder", stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a device", stat.S_IFBLK: "a device",
                 stat.S_IFSOCK: "a socket"}  # fmt: skip
