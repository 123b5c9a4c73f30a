"""What a SQLite error means for a store: a setting to fix, or the database busy or failing now; in words.

SQLite's result code tells the two kinds apart (https://www.sqlite.org/rescode.html); see
:mod:`amqpjobs.runtime.sqlite_open` for when each is met. The one home of these words for the
SQLite ledger and results store.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Final, Literal

from amqpjobs.errors import ConfigurationError, LedgerUnavailableError, ResultsUnavailableError

#: Primary result codes that mean "not now" (https://www.sqlite.org/rescode.html).
_NOT_NOW: Final = {
    5: "another process holds it locked: try again",
    6: "another process holds it locked: try again",
    10: "the disk failed a read or write: check that its file system has free space (SQLite writes -wal and -shm "
    "files beside the file) and is not failing",
    13: "the disk is full: free space on the file system that holds it",
}
#: What to do about a code that means "not this file" (the rest get the first one's words).
_FIX: Final = {
    14: "check that its directory exists and that this user can create and write files in it",
    26: "point it at a SQLite file of its own",
    8: "this user must be able to write the file and its directory (SQLite writes -wal and -shm files beside it), "
    "on a file system not mounted read-only",
    3: "this user must be able to write the file and its directory",
}


def open_failure(
    what: Literal["ledger", "results store"], path: str | Path, exc: sqlite3.Error, reading: bool = False
) -> ConfigurationError | LedgerUnavailableError | ResultsUnavailableError:
    """The error to raise for ``exc``, met while opening the SQLite ``what`` at ``path`` (``reading``: read-only).

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
    if reading:
        fix = fix if primary == 26 else "this user must be able to read the file and its folder"
        return ConfigurationError(
            f"can't read the SQLite {what} at {path} (opened read-only, as reading commands do): {said}; {fix}"
        )
    return ConfigurationError(f"can't open the SQLite {what} at {path}: {said}; {fix}")


def missing_file(what: Literal["ledger", "results store"], path: str | Path, doing: str) -> ConfigurationError:
    """A command's SQLite ``what`` at ``path`` that does not exist: a wrong path as often as none yet, never made here.

    Args:
        what: ``"ledger"`` or ``"results store"``.
        path: The file's path.
        doing: What the command does with it (``"reads it"``, ``"records into it"``).
    """
    return ConfigurationError(_missing(what, path, f"this command {doing}, never creates it"))


def unused_missing_file(what: Literal["ledger", "results store"], path: str | Path) -> str:
    """What a command that does not use the app's SQLite ``what`` says (a warning) when its file is missing at ``path``.

    A typo'd path in the app's module: the command created nothing there (it loaded the app
    read-only, :func:`~amqpjobs.runtime.sqlite_open.reading_only`), and says so instead of
    making an empty store nobody reads.
    """
    return _missing(what, path, "this command does not use it, and created nothing")


def missing_table(
    what: Literal["ledger", "results store"], path: str | Path, table: str, doing: str
) -> ConfigurationError:
    """A command's SQLite ``what`` at ``path`` that exists but has no ``table``: an empty file, or not our database.

    A reading command opens the file read-only (:func:`~amqpjobs.runtime.sqlite_open.reading_only`),
    so it never makes the table: SQLite's own "no such table" said nothing of the path's fix.
    """
    return ConfigurationError(
        f"the SQLite {what} at {path} has no {table} table (an empty file, or another program's database; "
        f"this command {doing}, never creates it): {_fix(what)}"
    )


def _missing(what: str, path: str | Path, said: str) -> str:
    return f"the SQLite {what} at {path} does not exist ({said}): {_fix(what)}"


def _fix(what: str) -> str:
    kind = "SqliteLedger" if what == "ledger" else "SqliteResults"
    return (
        f"point the app's {kind} at the file its workers write (a relative path is taken from the current "
        "folder), or run the command on the host or in the container that has the file"
    )


def trouble(exc: BaseException) -> str:
    """SQLite's words for ``exc``, its code's name, what to do (``disk I/O error (SQLITE_IOERR_SHMSIZE); ...``)."""
    code = getattr(exc, "sqlite_errorcode", None)
    name = getattr(exc, "sqlite_errorname", None)
    said = f"{exc} ({name})" if name else str(exc)
    primary = code & 0xFF if isinstance(code, int) else None
    fix = _NOT_NOW.get(primary) if primary is not None else None
    fix = fix or (_FIX.get(primary) if primary is not None else None)
    return f"{said}; {fix}" if fix else said


def held_locked(exc: BaseException) -> bool:
    """Whether ``exc`` is SQLite's ``SQLITE_BUSY`` or ``SQLITE_LOCKED``: another connection holds the file locked."""
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(code, int) and code & 0xFF in (5, 6)


def store_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is the database failing (an I/O error, a full or read-only disk, a lock, a damaged file).

    A value the database refuses (``sqlite3.DataError``, a ``ValueError``) is not: the caller tells those apart.
    """
    return isinstance(exc, sqlite3.OperationalError) or type(exc) is sqlite3.DatabaseError
