"""Why a SQLite ledger or results store could not be opened: a setting to fix, or the database busy now.

``SqliteLedger`` and ``SqliteResults`` open their file when they are built (in the app's
module, at import). SQLite's result code tells the two kinds of failure apart
(https://www.sqlite.org/rescode.html):

* the file can't be used at all (``SQLITE_CANTOPEN``: a missing directory, no permission;
  ``SQLITE_NOTADB``: another kind of file; ``SQLITE_READONLY``, ``SQLITE_PERM``, ...): a
  setting to fix, :class:`~amqpjobs.errors.ConfigurationError` (exit 2), with the fix;
* the database is there but can't be had now (``SQLITE_BUSY``, ``SQLITE_LOCKED``: another
  process holds it past the busy timeout; ``SQLITE_IOERR``, ``SQLITE_FULL``): the store is
  unavailable, :class:`~amqpjobs.errors.LedgerUnavailableError` /
  :class:`~amqpjobs.errors.ResultsUnavailableError` (exit 3, as when it fails later).
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Final, Literal

from amqpjobs.errors import ConfigurationError, LedgerUnavailableError, ResultsUnavailableError

#: Primary result codes that mean "not now" (https://www.sqlite.org/rescode.html).
_NOT_NOW: Final = {5: "another process holds it locked: try again", 6: "another process holds it locked: try again",
                   10: "the disk failed a read or write", 13: "the disk is full"}  # fmt: skip
#: What to do about a code that means "not this file" (the rest get the first one's words).
_FIX: Final = {
    14: "check that its directory exists and that this user can create and write files in it",
    26: "point it at a SQLite file of its own",
    8: "this user must be able to write the file and its directory (SQLite writes -wal and -shm files beside it)",
    3: "this user must be able to write the file and its directory",
}


def open_failure(
    what: Literal["ledger", "results store"], path: str | Path, exc: sqlite3.Error
) -> ConfigurationError | LedgerUnavailableError | ResultsUnavailableError:
    """The error to raise for ``exc``, met while opening the SQLite ``what`` at ``path``.

    Returns:
        :class:`ConfigurationError` naming the file and the fix, or, for a database busy or
        failing now, :class:`LedgerUnavailableError` (``what="ledger"``) /
        :class:`ResultsUnavailableError`. An error without a SQLite code is read as a setting.
    """
    code = getattr(exc, "sqlite_errorcode", None)
    name = getattr(exc, "sqlite_errorname", None)
    said = f"{exc} ({name})" if name else str(exc)
    primary = code & 0xFF if isinstance(code, int) else None
    if primary in _NOT_NOW:
        text = f"can't open the SQLite {what} at {path} now: {said}; {_NOT_NOW[primary]}"
        return LedgerUnavailableError(text) if what == "ledger" else ResultsUnavailableError(text)
    fix = _FIX.get(primary if primary is not None else 14, _FIX[14])
    return ConfigurationError(f"can't open the SQLite {what} at {path}: {said}; {fix}")


def file_path(owner: str, path: str | Path) -> Path:
    """The absolute path of a SQLite store's file (the worker's threads and processes each open it).

    Raises:
        ConfigurationError: ``path`` is ``:memory:`` or empty (SQLite's in-memory and temporary
            databases): each connection would have its own, so no table is found; or it is no
            path (not a ``str`` or ``os.PathLike``, or it holds a NUL character).
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
