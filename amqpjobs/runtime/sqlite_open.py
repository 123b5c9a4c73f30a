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

In a reading command (``job show``: :func:`reading_only`), a store only reads: its file is
opened read-only (``mode=ro``, or ``immutable=1`` where SQLite can't make its ``-shm`` file:
a read-only mount), never created nor changed, so an operator's account that may read the
file but not write it, or a read-only mount of it, reads it.

Only that first open may create the file (:class:`StoreFile`): every later connection opens
it ``mode=rw`` (https://www.sqlite.org/uri.html), and only while the path still names the
file first opened (its inode, and a token written in it). A file deleted, moved away or
replaced while the app runs is a store error naming the path and what to do, never a new
empty file: an empty ledger would forget every done-marker, and a redelivered idempotent
job would run its effect again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Final, Literal

from amqpjobs.errors import AmqpJobsError, LedgerUnavailableError, ResultsUnavailableError
from amqpjobs.runtime.sqlite_errors import held_locked, missing_file, open_failure, trouble

log = logging.getLogger("amqpjobs.stores")
#: Whether a store's first open in this process may create its file (not in a --processes child: no_new_files).
_creates = True
#: Whether the stores built now only read (:func:`reading_only`).
_reading = False
#: Whether the stores built now open their files but never create one (:func:`existing_files_only`); keep the
#: failure of their first open for their app's judge (:func:`judged_later`).
_existing = _later = False
#: How a reading store opens its file: read-only, then (a read-only mount: no -shm file can be made) immutable;
#: never immutable for a file another process holds locked (immutable reads the main file alone, not its
#: -wal log: the latest records would be missed, a job read as an older state or ``unknown``).
_READ_MODES: Final = ("mode=ro", "immutable=1")
#: The file's token, written by the first open that finds none: a later connection to another file
#: at the path (one whose inode number a deleted file's freed) finds another token, or none.
_TOKEN_TABLE: Final = "CREATE TABLE IF NOT EXISTS amqpjobs_store_file (token TEXT NOT NULL)"


def rollback(db: sqlite3.Connection) -> None:
    """Roll back ``db``'s open transaction, if one is left.

    SQLite ends some itself on failure (a full disk): a ROLLBACK then would raise "no
    transaction is active" over the error that ended it.
    """
    if db.in_transaction:
        db.execute("ROLLBACK")


_REPLACED: Final = "is another file than the one this process opened (replaced since)"


@contextlib.contextmanager
def reading_only() -> Iterator[None]:
    """The SQLite stores built in the block only read: their files opened read-only, never created nor changed.

    For a reading command's load of the app (``job show``): its module builds the stores.
    """
    global _reading
    before, _reading = _reading, True
    try:
        yield
    finally:
        _reading = before


@contextlib.contextmanager
def existing_files_only() -> Iterator[None]:
    """The SQLite results stores built in the block open their files but never create one: a missing file is refused.

    For a command that records into the app's results store (``replay``/``quarantine park
    --app``): a path its workers do not write would take the records where nobody reads them.
    (A ledger, which such a command does not use, is opened read-only, as by :func:`reading_only`.)
    """
    global _existing
    before, _existing = _existing, True
    try:
        yield
    finally:
        _existing = before


@contextlib.contextmanager
def judged_later() -> Iterator[None]:
    """Stores built in the block keep their first open's error (``open_failure``): load_app judges its app's only."""
    global _later
    before, _later = _later, True
    try:
        yield
    finally:
        _later = before


def judging_later() -> bool:
    """Whether stores built now are in :func:`judged_later`'s block (``--app``'s import of the app's module)."""
    return _later


def no_new_files() -> None:
    """From now on, no SQLite store of this process creates its file: the first open finds it or fails.

    For a ``consume --processes N`` child, whose supervisor loaded the app (so opened each store,
    creating its file) before it started the children: a child restarted after the file was
    deleted or moved away fails its start with the store's error, instead of making an empty one.
    """
    global _creates
    _creates = False


class StoreFile:
    """The file of one SQLite store: created by :meth:`create` (the store's first open) only, then the same or none.

    Args:
        what: ``"ledger"`` or ``"results store"``: which error a lost file is, and its words.
        path: The absolute path (:func:`file_path`).
    """

    def __init__(self, what: Literal["ledger", "results store"], path: Path) -> None:
        self.what = what
        self.path = path
        self._identity: tuple[int, int] | None = None  # (st_dev, st_ino) of the file first opened
        self._token: str | None = None  # its token (_TOKEN_TABLE)
        self._lost = False  # said once per loss (a look that finds it back says so)
        self._said = threading.Lock()
        self.reading = _reading  # a reading command's store: read-only, never created (reading_only)
        self.existing = _existing  # a recording command's store: never created (existing_files_only)
        self.absent = False  # reading: the file was not there (nothing recorded)
        self.later = _later  # judged_later: the first open's failure is kept in ``kept``, not raised
        self.kept: AmqpJobsError | None = None
        self._mode = "mode=rw"  # the URI parameter of every further connection

    @contextlib.contextmanager
    def opening(self) -> Iterator[None]:
        """The store's first open: its failure raised, or kept in :attr:`kept` (:func:`judged_later`)."""
        try:
            yield
        except AmqpJobsError as exc:
            if not self.later:
                raise
            self.kept = exc

    def open_reading(self, timeout: float) -> None:
        """A reading store's first open: the file, read-only (``absent`` when missing: nothing is created).

        Raises:
            ConfigurationError, LedgerUnavailableError, ResultsUnavailableError: as
                :func:`open_failure` says, reading (this user can't read it; no SQLite file).
        """
        if not os.path.exists(self.path):
            self.absent = True
            return
        failed: sqlite3.Error | None = None
        for mode in _READ_MODES:
            try:
                with contextlib.closing(_connect(f"{self.path.as_uri()}?{mode}", timeout, uri=True)) as db:
                    self._token = _token_of(db, missing_ok=True)
            except sqlite3.Error as exc:
                if held_locked(exc):  # another process holds it: immutable would read it without its -wal log
                    raise open_failure(self.what, self.path, exc, reading=True) from exc
                failed = failed or exc  # the read-only open's own words say why
                continue
            self._mode = mode
            st = os.stat(self.path)
            self._identity = (st.st_dev, st.st_ino)
            return
        assert failed is not None
        raise open_failure(self.what, self.path, failed, reading=True) from failed

    def create(self, timeout: float) -> sqlite3.Connection:
        """The first connection: creates the file when missing (unless :func:`no_new_files`), remembers which it is.

        Raises:
            LedgerUnavailableError, ResultsUnavailableError: (by ``what``) after :func:`no_new_files`, the
                file is missing.
            sqlite3.Error: as :func:`sqlite3.connect` (the caller maps it with :func:`open_failure`).
        """
        if self.existing and self.what == "results store" and not os.path.exists(self.path):
            raise missing_file(self.what, self.path, "records into it")
        if _creates:
            db = _connect(str(self.path), timeout, uri=False)
        else:  # a --processes child: the supervisor's load of the app opened (created) it first
            if not os.path.exists(self.path):
                self._fail("is gone (deleted or moved away since the supervisor of this worker process opened it)")
            db = _connect(self.path.as_uri() + "?mode=rw", timeout, uri=True)
        try:
            self._token = _token_of(db, missing_ok=True)  # a read: no write lock unless the file has no token yet
            if self._token is None:
                db.execute("BEGIN IMMEDIATE")
                try:
                    db.execute(_TOKEN_TABLE)
                    db.execute("INSERT INTO amqpjobs_store_file (token) SELECT ? "
                               "WHERE NOT EXISTS (SELECT 1 FROM amqpjobs_store_file)", (uuid.uuid4().hex,))  # fmt: skip
                    db.execute("COMMIT")
                except BaseException:
                    rollback(db)
                    raise
                self._token = _token_of(db)
            st = os.stat(self.path)
        except OSError as exc:
            db.close()
            raise sqlite3.OperationalError(f"the file vanished as it was opened: {exc}") from exc
        except BaseException:
            db.close()
            raise
        self._identity = (st.st_dev, st.st_ino)
        return db

    def connect(self, timeout: float, waits: str = "", doing: str = "open") -> sqlite3.Connection:
        """A further connection (``timeout``: the busy timeout, seconds), to the file :meth:`create` opened only.

        ``doing``: the caller's operation, as the error words it (``"write records to"``: "can't
        write records to the SQLite results store at PATH: ...").

        Raises:
            LedgerUnavailableError, ResultsUnavailableError: (by ``what``) the file is gone or another
                one (:meth:`check`), or SQLite can't open it now; held locked, it says so as
                :meth:`locked` does (``waits``: what it means for the caller).
        """
        self.check()
        try:
            db = _connect(f"{self.path.as_uri()}?{self._mode}", timeout, uri=True)  # never creates it
        except sqlite3.Error as exc:
            raise self.failure(exc, doing, timeout, waits) from exc
        try:
            token = _token_of(db, missing_ok=True)
        except sqlite3.Error as exc:
            db.close()
            raise self.failure(exc, doing, timeout, waits) from exc
        except BaseException:
            db.close()
            raise
        if token != self._token:  # a new file that got the freed inode number of the one deleted
            db.close()
            self._fail(_REPLACED)
        self.check()  # swapped while it was opened: the connection may be to the other file
        return db

    def check(self) -> None:
        """Raise unless the path still names the file first opened (one ``stat``; a cached connection's guard).

        Raises:
            LedgerUnavailableError, ResultsUnavailableError: (by ``what``) the file is gone (deleted or
                moved away), or the path names another file (replaced); the message names the path and the fix.
        """
        if self._identity is None:
            return
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._fail("is gone (deleted or moved away since this process opened it)")
        except OSError as exc:
            raise self._error(f"can't look at the SQLite {self.what} at {self.path}: {exc}") from exc
        else:
            if (st.st_dev, st.st_ino) != self._identity:
                self._fail(_REPLACED)
            if self._lost:
                with self._said:
                    if self._lost:
                        self._lost = False
                        log.info("the SQLite %s at %s is back: in use again", self.what, self.path)

    def locked(
        self, exc: BaseException, seconds: float, waits: str = ""
    ) -> LedgerUnavailableError | ResultsUnavailableError | None:
        """The error for ``exc`` when it is SQLite's "locked" past the busy timeout (``seconds``); else None.

        SQLite has one writer per file: a write transaction that stays open (a ``ctx.transaction()``
        whose handler runs long or hangs) makes every other write wait, then fail ``SQLITE_BUSY``;
        one holding the file for itself (another program's ``locking_mode=EXCLUSIVE``) every read too.
        ``waits``: what it means for the statement that failed (default: the ledger's jobs wait,
        the results store's records are dropped).
        """
        code = getattr(exc, "sqlite_errorcode", None)
        if not isinstance(exc, sqlite3.OperationalError) or not isinstance(code, int) or code & 0xFF not in (5, 6):
            return None
        waits = waits or (
            "idempotent jobs wait meanwhile, using no attempt" if self.what == "ledger" else "records are dropped"
        )
        return self._error(
            f"the SQLite {self.what} at {self.path} is locked: a write transaction has held the whole file for over "
            f"{seconds:g}s (a ctx.transaction() of a job that runs long or hangs, in this worker or another process "
            f"of the host, or another program's); {waits}: keep ctx.transaction() short ({exc})"
        )

    def failure(
        self, exc: BaseException, doing: str, seconds: float, waits: str = ""
    ) -> LedgerUnavailableError | ResultsUnavailableError:
        """The store's error for SQLite's ``exc`` met while ``doing`` (``"write records to"``): path and fix named.

        Held locked past the busy timeout (``seconds``), it is :meth:`locked`'s error.
        """
        return self.locked(exc, seconds, waits) or self._error(
            f"can't {doing} the SQLite {self.what} at {self.path}: {trouble(exc)}"
        )

    def _fail(self, how: str) -> None:
        if self.what == "ledger":
            then = ("idempotent jobs wait in a retry tier, using no attempt, until it is back: move it back, or "
                    "restore it from a backup and restart the workers; amqpjobs never creates it again while it "
                    "runs, as a new empty ledger would run again every job it had marked done")  # fmt: skip
        else:
            then = ("results are not recorded and status reads fail until it is back: move it back, or restore it "
                    "from a backup (or let a new one be made) and restart the workers; amqpjobs never creates it "
                    "again while it runs")  # fmt: skip
        text = f"the SQLite {self.what} at {self.path} {how}: {then}"
        with self._said:
            if not self._lost:
                self._lost = True
                log.error("%s", text)
        raise self._error(text)

    def _error(self, text: str) -> LedgerUnavailableError | ResultsUnavailableError:
        return LedgerUnavailableError(text) if self.what == "ledger" else ResultsUnavailableError(text)


def _token_of(db: sqlite3.Connection, missing_ok: bool = False) -> str | None:
    """The file's token (:data:`_TOKEN_TABLE`); None when it has none (``missing_ok``: nor the table)."""
    try:
        row = db.execute("SELECT token FROM amqpjobs_store_file LIMIT 1").fetchone()
    except sqlite3.OperationalError as exc:
        if missing_ok and "no such table" in str(exc):
            return None
        raise
    return None if row is None else str(row[0])


def _connect(target: str, timeout: float, uri: bool) -> sqlite3.Connection:
    """A connection to ``target`` in autocommit mode, busy timeout ``timeout`` seconds, any thread."""
    db = sqlite3.connect(target, timeout=timeout, isolation_level=None, check_same_thread=False, uri=uri)
    try:
        db.execute(f"PRAGMA busy_timeout={int(timeout * 1000)}")
    except BaseException:
        db.close()
        raise
    return db
