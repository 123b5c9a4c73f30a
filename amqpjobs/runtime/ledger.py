"""The idempotency ledger: claim a job's key before its effect, mark it done after.

Delivery is at-least-once, so the achievable goal is an exactly-once *effect*: gate the
effect on a durable key (the job id) in a store with a unique index. Per key, a ledger
row moves through::

    (none) --claim--> running(owner, lease expiry) --done--> done
                          |  failure: release (row removed, a retry may claim again)
                          |  a release or done-mark that fails is owed and paid once the ledger
                          |    answers (:mod:`.ledger_owed`; an owed done-mark answers DONE here)
                          |  owner died: lease expires, the next claim takes it over

* :meth:`Ledger.claim` answers ``CLAIMED`` (run it), ``DONE`` (already done: ack without
  running, outcome "duplicate") or ``BUSY`` (another live claim holds it: retry later);
* :meth:`Ledger.done` marks it done after the handler returned, before the ack. A crash
  between the effect and this mark is the one window left; :meth:`Ledger.transaction`
  closes it when the effect lives in the ledger's database: the effect and the done-mark
  commit in one transaction (inbox pattern), and a second run's transaction is rolled back.

Two backends: :class:`SqliteLedger` (one host, any number of processes) here, and
:class:`~amqpjobs.runtime.ledger_postgres.PostgresLedger` (many hosts).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, Final, ParamSpec, Protocol, TypeVar

from amqpjobs.durations import duration_argument
from amqpjobs.errors import AmqpJobsError, ConfigurationError, DuplicateJobError, LedgerUnavailableError
from amqpjobs.runtime import ledger_origin as origin
from amqpjobs.runtime.ledger_guard import TransactionGuard, ended_inside
from amqpjobs.runtime.ledger_key import sqlite_seal_key
from amqpjobs.runtime.refused_stores import refused_when_used
from amqpjobs.runtime.sqlite_errors import open_failure, store_failure
from amqpjobs.runtime.sqlite_open import StoreFile, rollback
from amqpjobs.runtime.sqlite_paths import check_kind, file_path

_said = logging.getLogger("amqpjobs.worker")
_stores = logging.getLogger("amqpjobs.stores")
#: What each statement does, as its errors say ("can't claim a job in the SQLite ledger at ...").
_DOING: Final = {"_claim": "claim a job in", "_done": "mark a job done in", "_release": "release a claim in",
                 "_prune": "prune"}  # fmt: skip
_P = ParamSpec("_P")
_T = TypeVar("_T")
#: Default time a done-marker is kept (README "Idempotency" → "Retention").
DEFAULT_RETENTION = 14 * 86400.0
#: Seconds a delivery waits in its slot for an unreachable ledger before it waits in a retry tier instead.
LEDGER_PATIENCE = 10.0
#: Seconds a SQLite ledger's statement waits for the file's write lock (another write transaction) before it
#: fails as a ledger outage: a claim waits no longer in its slot than for any unreachable ledger.
BUSY_TIMEOUT = LEDGER_PATIENCE
#: Seconds between two looks at an unreachable ledger (a look costs nothing: its connection paces the tries).
_LOOK_EVERY = 0.25


class Claim(enum.Enum):
    """The answer to :meth:`Ledger.claim`."""

    CLAIMED = "claimed"
    DONE = "done"
    BUSY = "busy"


class Ledger(Protocol):
    """What the worker needs from an idempotency store. Keys are job ids (<= 255 chars).

    Attributes:
        retention: Seconds a done-marker is kept before :meth:`prune` may remove it.
    """

    retention: float

    async def claim(self, key: str, owner: str, lease: float) -> Claim:
        """Claim ``key`` for ``owner`` for ``lease`` seconds (see the module docstring)."""

    async def done(self, key: str, owner: str) -> bool:
        """Mark ``key`` done. Returns False when it was already done (by another run)."""

    async def release(self, key: str, owner: str) -> None:
        """Drop ``owner``'s running claim on ``key`` (after a failure), so a retry can claim it."""

    async def prune(self, older_than: float) -> int:
        """Remove done-markers finished more than ``older_than`` seconds ago; returns how many."""

    def transaction(self, key: str, owner: str) -> AbstractContextManager[Any]:
        """A database transaction whose commit also marks ``key`` done (the inbox pattern).

        Raises:
            DuplicateJobError: on exit, when ``key`` was already done: the transaction
                (the effect) is rolled back.
        """

    async def close(self) -> None:
        """Release connections."""


class Claims(Protocol):
    """What :func:`claim_waiting` claims from: a :class:`Ledger`, or a worker's :class:`OwedWrites`.

    :class:`~amqpjobs.runtime.ledger_owed.OwedWrites` pays an owed release on the key first, and
    answers ``DONE`` for a key whose done-mark it owes.
    """

    async def claim(self, key: str, owner: str, lease: float) -> Claim:
        """See :meth:`Ledger.claim`."""


async def claim_waiting(
    ledger: Claims,
    key: str,
    owner: str,
    lease: float,
    patience: float = LEDGER_PATIENCE,
    stop: asyncio.Event | None = None,
) -> Claim:
    """``ledger.claim``, waiting for a ledger that can't be reached for up to ``patience`` seconds.

    The job runs as soon as the ledger answers again (README "Idempotency": a ledger outage).

    Raises:
        LedgerUnavailableError: still unreachable after ``patience`` s, or when ``stop`` is set.
        Exception: any other failure of the claim, at once.
    """
    deadline = time.monotonic() + patience
    while True:
        try:
            return await ledger.claim(key, owner, lease)
        except LedgerUnavailableError:
            if time.monotonic() + _LOOK_EVERY > deadline or (stop is not None and stop.is_set()):
                raise
        await asyncio.sleep(_LOOK_EVERY)


_SCHEMA = """
CREATE TABLE IF NOT EXISTS amqpjobs_ledger (
    key TEXT PRIMARY KEY,
    state TEXT NOT NULL CHECK (state IN ('running', 'done')),
    owner TEXT NOT NULL,
    expires_at REAL NOT NULL,
    updated_at REAL NOT NULL
)
"""


@refused_when_used  # another App's bad argument refuses no app named by --app
class SqliteLedger:
    """A ledger in a SQLite file: safe across processes on one host (WAL, ``BEGIN IMMEDIATE``).

    Args:
        path: Database file (created when missing, by this first open only: deleted, moved away or
            replaced later, it is a :class:`~amqpjobs.errors.LedgerUnavailableError` naming it, never
            a new empty ledger). Put your effect's tables in the same file to use :meth:`transaction`.
        retention: How long done-markers are kept: seconds or a duration string (default 14 days).

    Raises:
        ConfigurationError: the file can't be used (a missing directory, no permission, not a
            SQLite file): the message names the fix.
        LedgerUnavailableError: the database is locked past the 10 s busy timeout, or the disk
            failed (:mod:`amqpjobs.runtime.sqlite_open`). Later, a statement that waits that long for
            the file's write lock (another write transaction: a long ``ctx.transaction()``) fails so.
    """

    def __init__(self, path: str | Path, retention: float | str = DEFAULT_RETENTION) -> None:
        self.path = file_path("SqliteLedger", path)
        self.retention = duration_argument("SqliteLedger(retention=...)", retention)
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._all_lock = threading.Lock()
        self._file = StoreFile("ledger", self.path)
        self.where = f"SQLite ledger at {self.path}"
        self._locked_since: float | None = None  # monotonic: since when its file is found locked (said once)
        with self._file.opening():  # in --app's import, judged only when this ledger's app is the one named
            check_kind("SqliteLedger", path, self.path)  # a folder, a FIFO ...: said here, judged as any failed open
            if self._file.reading or self._file.existing:  # job show, replay/park --app: the ledger is not written
                self._file.open_reading(BUSY_TIMEOUT)
                return
            try:
                db = self._keep(self._file.create(timeout=BUSY_TIMEOUT))  # the only open that may create the file
                db.execute("PRAGMA journal_mode=WAL")
                origin.sqlite_schema(db, _SCHEMA)  # noting a new ledger: the worker's start checks it
            except sqlite3.Error as exc:
                raise open_failure("ledger", self.path, exc) from exc

    @property
    def open_failure(self) -> AmqpJobsError | None:
        """Why this ledger's first open failed, kept in ``--app``'s import for its app's judge (else None)."""
        return self._file.kept

    def _connect(self, doing: str = "open") -> sqlite3.Connection:
        """The thread's connection to the file first opened (LedgerUnavailableError: gone, replaced, can't open)."""
        self._file.check()
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is not None and not _open(db):  # a handler closed it (its run failed): this thread opens another
            with self._all_lock:
                self._all = [c for c in self._all if c is not db]
            db = None
        if db is None:
            db = self._keep(self._file.connect(timeout=BUSY_TIMEOUT, doing=doing))
        return db

    def _keep(self, db: sqlite3.Connection) -> sqlite3.Connection:
        """Make ``db`` this thread's connection (closed by :meth:`close`)."""
        self._local.db = db
        with self._all_lock:
            self._all.append(db)
        return db

    def _claim(self, key: str, owner: str, lease: float) -> Claim:
        db = self._connect(_DOING["_claim"])
        now = time.time()
        db.execute("BEGIN IMMEDIATE")
        try:
            row = db.execute("SELECT state, owner, expires_at FROM amqpjobs_ledger WHERE key = ?", (key,)).fetchone()
            if row is None:
                db.execute(
                    "INSERT INTO amqpjobs_ledger (key, state, owner, expires_at, updated_at) "
                    "VALUES (?, 'running', ?, ?, ?)",
                    (key, owner, now + lease, now),
                )
                result = Claim.CLAIMED
            elif row[0] == "done":
                result = Claim.DONE
            elif row[1] != owner and row[2] > now:
                result = Claim.BUSY
            else:  # our own claim again, or an expired one: take it over
                db.execute(
                    "UPDATE amqpjobs_ledger SET owner = ?, expires_at = ?, updated_at = ? WHERE key = ?",
                    (owner, now + lease, now, key),
                )
                result = Claim.CLAIMED
            db.execute("COMMIT")
            return result
        except BaseException:
            rollback(db)
            raise

    @staticmethod
    def _mark_done(db: sqlite3.Connection, key: str, owner: str) -> bool:
        now = time.time()
        cur = db.execute(
            "UPDATE amqpjobs_ledger SET state = 'done', owner = ?, expires_at = ?, updated_at = ? "
            "WHERE key = ? AND state = 'running'",
            (owner, now, now, key),
        )
        if cur.rowcount:
            return True
        cur = db.execute(
            "INSERT OR IGNORE INTO amqpjobs_ledger (key, state, owner, expires_at, updated_at) "
            "VALUES (?, 'done', ?, ?, ?)",
            (key, owner, now, now),
        )
        return bool(cur.rowcount)

    def _done(self, key: str, owner: str) -> bool:
        db = self._connect(_DOING["_done"])
        db.execute("BEGIN IMMEDIATE")
        try:
            ok = self._mark_done(db, key, owner)
            db.execute("COMMIT")
            return ok
        except BaseException:
            rollback(db)
            raise

    def _release(self, key: str, owner: str) -> None:
        self._connect(_DOING["_release"]).execute(
            "DELETE FROM amqpjobs_ledger WHERE key = ? AND owner = ? AND state = 'running'", (key, owner)
        )

    def _prune(self, older_than: float) -> int:
        cur = self._connect(_DOING["_prune"]).execute(
            "DELETE FROM amqpjobs_ledger WHERE state = 'done' AND updated_at < ?", (time.time() - older_than,)
        )
        return cur.rowcount

    async def _call(self, fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """``fn`` in a thread; the database failing is LedgerUnavailableError (:data:`_DOING`; a lock said once)."""
        try:
            result = await asyncio.to_thread(fn, *args, **kwargs)
        except sqlite3.Error as exc:
            if not store_failure(exc):
                raise
            if (error := self._file.locked(exc, BUSY_TIMEOUT)) is None:
                raise self._file.failure(exc, _DOING.get(fn.__name__, "use"), BUSY_TIMEOUT) from exc
            if self._locked_since is None:
                self._locked_since = time.monotonic() - BUSY_TIMEOUT  # it waited that long
                _stores.warning("%s", error)
            raise error from exc
        if self._locked_since is not None:
            _stores.info("the SQLite ledger at %s answers again after %.1fs", self.path,
                         time.monotonic() - self._locked_since)  # fmt: skip
            self._locked_since = None
        return result

    async def unconfirmed(self) -> str | None:
        """See :class:`~amqpjobs.runtime.ledger_origin.NewLedger`."""
        return await self._call(origin.sqlite_unconfirmed, self._connect)

    async def confirm(self) -> None:
        """See :class:`~amqpjobs.runtime.ledger_origin.NewLedger`."""
        await self._call(origin.sqlite_confirm, self._connect)

    async def seal_key(self) -> bytes:
        """See :class:`~amqpjobs.runtime.ledger_key.KeyedLedger`."""
        return await self._call(sqlite_seal_key, self._connect)

    async def claim(self, key: str, owner: str, lease: float) -> Claim:
        """See :meth:`Ledger.claim`."""
        return await self._call(self._claim, key, owner, lease)

    async def done(self, key: str, owner: str) -> bool:
        """See :meth:`Ledger.done`."""
        return await self._call(self._done, key, owner)

    async def release(self, key: str, owner: str) -> None:
        """See :meth:`Ledger.release`."""
        await self._call(self._release, key, owner)

    async def prune(self, older_than: float) -> int:
        """See :meth:`Ledger.prune`."""
        return await self._call(self._prune, older_than)

    @contextmanager
    def transaction(self, key: str, owner: str) -> Iterator[sqlite3.Connection]:
        """A write transaction on the ledger's file that also marks ``key`` done (inbox pattern).

        Use it from a plain-function handler (``with ctx.transaction() as db: db.execute(...)``).

        Raises:
            DuplicateJobError: ``key`` was already done; the effect was rolled back.
        """
        db = self._connect("begin a transaction in")
        try:
            db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise (self._file.locked(exc, BUSY_TIMEOUT) or exc) from exc
        ended = TransactionGuard()
        db.set_authorizer(ended)  # the handler's COMMIT / ROLLBACK / BEGIN are refused while it runs
        try:
            try:
                yield db
            finally:
                if _open(db):
                    db.set_authorizer(None)
                else:  # the handler closed the connection (SQLite rolled back): nothing of the run is kept
                    ended.closed = True
            if ended.tried:  # it caught the refusal: its transaction still ends refused
                raise ended.error(key)
            if not self._mark_done(db, key, owner):
                raise DuplicateJobError(f"job {key!r} was already done: its effect was rolled back")
            db.execute("COMMIT")
        except BaseException as exc:
            if ended.closed:
                raise ended_inside(key, "close()") from exc
            db.set_authorizer(None)
            if db.in_transaction:
                db.execute("ROLLBACK")
            if ended.tried and not isinstance(exc, ConfigurationError):
                raise ended.error(key) from exc
            raise

    async def close(self) -> None:
        """Close every connection this ledger opened (call when no handler runs)."""
        with self._all_lock:
            conns, self._all = self._all, []
        for db in conns:
            db.close()
        self._local = threading.local()


def _open(db: sqlite3.Connection) -> bool:
    """Whether ``db`` is still open (``sqlite3.Connection`` has no flag for it)."""
    try:
        db.in_transaction  # noqa: B018 - raises ProgrammingError on a closed connection
    except sqlite3.ProgrammingError:
        return False
    return True
