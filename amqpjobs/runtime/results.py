"""The results store: each job's states (:mod:`amqpjobs.jobs.results`) in SQL, written off the ack path.

The store never decides a job's fate (README "Job status and results"):

* a worker hands each record to a :class:`~amqpjobs.runtime.results_writer.ResultsWriter`,
  which writes them off the ack path and drops (and counts) what can't be written, never
  retried: jobs still run and ack;
* reads (:meth:`ResultsStore.history`) raise :class:`~amqpjobs.errors.ResultsUnavailableError`
  when the store can't be read.

Two backends, shaped like the idempotency ledger's: :class:`SqliteResults` (one host)
here, :class:`~amqpjobs.runtime.results_postgres.PostgresResults` (many hosts). Either may
share the ledger's database (its own table, ``amqpjobs_results``).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import sqlite3
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

from amqpjobs.durations import duration_argument
from amqpjobs.errors import AmqpJobsError, JobFailedError, ResultsUnavailableError
from amqpjobs.jobs.results import DEFAULT_RETENTION, TERMINAL, JobStatus, StateRecord, status_of
from amqpjobs.printable import printable
from amqpjobs.runtime.refused_stores import refused_when_used
from amqpjobs.runtime.sqlite_errors import missing_file, missing_table, open_failure, store_failure
from amqpjobs.runtime.sqlite_open import StoreFile, rollback
from amqpjobs.runtime.sqlite_paths import check_kind, file_path

log = logging.getLogger("amqpjobs.results")

#: Seconds a write of records (a worker's batch, a mover's records) may take before it counts as failed.
WRITE_TIMEOUT = 10.0
#: Seconds a SQLite statement waits for the file's write lock (held by another write transaction).
BUSY_TIMEOUT = 5.0
#: Columns of ``amqpjobs_results``, in :class:`StateRecord` field order.
COLUMNS = ("job_id", "job", "state", "attempt", "at", "detail", "error", "queue", "lease_until", "value", "value_note")


class ResultsStore(Protocol):
    """What workers, ``App.job_status`` and ``amqpjobs job show`` need from a results store.

    Attributes:
        retention: Seconds records are kept before :meth:`prune` may remove them.
    """

    retention: float

    async def write(self, records: Sequence[StateRecord]) -> Sequence[StateRecord] | None:
        """Append ``records`` in one transaction; returns those the database refused (None or empty: none).

        A record the database can't hold (a value it refuses, not a failure of the database)
        never costs the others: :func:`insert_apart`. Raises whatever else the database raises.
        """

    async def history(self, job_id: str) -> list[StateRecord]:
        """Every record kept for ``job_id`` (any order). Raises ResultsUnavailableError."""

    async def prune(self, older_than: float) -> int:
        """Remove records older than ``older_than`` seconds; returns how many."""

    async def close(self) -> None:
        """Release connections."""

    def copy(self) -> ResultsStore:
        """A store on the same database with connections of its own (for another event loop)."""


#: DOUBLE PRECISION, not REAL: PostgreSQL's REAL is 4 bytes (epoch seconds to ~2 minutes).
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS amqpjobs_results (job_id TEXT NOT NULL, job TEXT NOT NULL, state TEXT NOT NULL, "
    "attempt INTEGER NOT NULL, at DOUBLE PRECISION NOT NULL, detail TEXT NOT NULL, error TEXT NOT NULL, "
    "queue TEXT NOT NULL, "
    "lease_until DOUBLE PRECISION NOT NULL, value TEXT, value_note TEXT NOT NULL)",
    "CREATE INDEX IF NOT EXISTS amqpjobs_results_job_id ON amqpjobs_results (job_id)",
    "CREATE INDEX IF NOT EXISTS amqpjobs_results_at ON amqpjobs_results (at)",
)


def row_of(r: StateRecord) -> tuple[object, ...]:
    """A record as a row of :data:`COLUMNS`."""
    return (r.job_id, r.job, r.state, r.attempt, r.at, r.detail, r.error, r.where, r.lease_until, r.value,
            r.value_note)  # fmt: skip


def record_of(row: Sequence[object]) -> StateRecord:
    """A row of :data:`COLUMNS` as a record."""
    job_id, job, state, attempt, at, detail, error, queue, lease_until, value, note = row
    return StateRecord(str(job_id), str(job), str(state), int(str(attempt)), float(str(at)), str(detail),
                       str(error), str(queue), float(str(lease_until)), None if value is None else str(value),
                       str(note))  # fmt: skip


async def insert_apart(
    insert: Callable[[Sequence[StateRecord]], Awaitable[None]],
    records: Sequence[StateRecord],
    refusals: tuple[type[Exception], ...],
) -> list[StateRecord]:
    """Insert ``records`` with ``insert`` (one transaction); the ones the database refuses are left out.

    When the batch is refused with one of ``refusals`` (the database won't hold a value: a
    NUL in PostgreSQL text, a lone surrogate that UTF-8 can't encode), each record is
    inserted alone, a refused one again :meth:`~amqpjobs.jobs.results.StateRecord.escaped`
    (its state kept, its text spelt out). Any other error (the database is down) is raised.

    Returns:
        The records still refused (not written); empty when all were written.
    """
    try:
        await insert(records)
        return []
    except refusals:
        pass
    refused: list[StateRecord] = []
    for record in records:
        # a batch of one was tried as it is already
        for candidate in (record, record.escaped()) if len(records) > 1 else (record.escaped(),):
            try:
                await insert([candidate])
                break
            except refusals:
                continue
        else:
            refused.append(record)
    return refused


def refused_text(records: Sequence[StateRecord]) -> str:
    r"""``refused by the database: job 'flaky' id 'a\x00b', ...`` (three named at most, text escaped)."""
    named = ", ".join(f"job {printable(repr(r.job))} id {printable(repr(r.job_id))}" for r in records[:3])
    return f"refused by the database: {named}" + (f" and {len(records) - 3} more" if len(records) > 3 else "")


@refused_when_used  # another App's bad argument refuses no app named by --app
class SqliteResults:
    """A results store in a SQLite file (one host, any number of processes).

    Each call opens its own connection (a background batch or a read, not per job), so a
    file made unusable fails the next call instead of a cached connection hiding it.

    Args:
        path: Database file (created when missing, by this first open only: deleted, moved away or
            replaced later, it is a :class:`~amqpjobs.errors.ResultsUnavailableError` naming it); may be
            the ledger's.
        retention: How long records are kept: seconds or a duration string (default 1 day).

    Raises:
        ConfigurationError: the file can't be used (a missing directory, no permission, not a
            SQLite file): the message names the fix.
        ResultsUnavailableError: the database is locked past the 5 s busy timeout, or the disk
            failed (:mod:`amqpjobs.runtime.sqlite_open`).
    """

    def __init__(self, path: str | Path, retention: float | str = DEFAULT_RETENTION) -> None:
        self.path = file_path("SqliteResults", path)
        self.retention = duration_argument("SqliteResults(retention=...)", retention)
        self._file = StoreFile("results store", self.path)
        with self._file.opening():  # in --app's import, judged only when this store's app is the one named
            check_kind("SqliteResults", path, self.path)  # a folder, a FIFO ...: said here, judged as any failed open
            if self._file.reading:  # a reading command (job show): read-only, never created nor changed
                self._file.open_reading(BUSY_TIMEOUT)
                return
            try:
                with contextlib.closing(self._file.create(timeout=BUSY_TIMEOUT)) as db:  # the one open creating it
                    db.execute("PRAGMA journal_mode=WAL")
                    for statement in _SCHEMA:
                        db.execute(statement)
            except sqlite3.Error as exc:
                raise open_failure("results store", self.path, exc) from exc

    @property
    def open_failure(self) -> AmqpJobsError | None:
        """Why this store's first open failed, kept in ``--app``'s import for its app's judge (else None)."""
        return self._file.kept

    @property
    def absent(self) -> bool:
        """Whether this store, built in a reading command, found no file at :attr:`path` (it created none).

        See :func:`~amqpjobs.runtime.sqlite_open.reading_only`.
        """
        return self._file.absent

    @contextlib.contextmanager
    def _session(self, doing: str, waits: str) -> Iterator[sqlite3.Connection]:
        """A connection to the file first opened, closed after the block.

        The database failing, in it or at the open, is :class:`ResultsUnavailableError` naming
        ``doing`` (``"write records to"``), the path and the fix.

        ``waits``: what a lock held past the busy timeout means for the caller (:meth:`StoreFile.locked`).
        A value the database refuses (``sqlite3.DataError``, ``ValueError``) is raised as it is.
        """
        with contextlib.closing(self._file.connect(timeout=BUSY_TIMEOUT, waits=waits, doing=doing)) as db:
            try:
                yield db
            except sqlite3.Error as exc:
                if not store_failure(exc):
                    raise
                raise self._file.failure(exc, doing, BUSY_TIMEOUT, waits) from exc

    def _insert(self, records: Sequence[StateRecord]) -> None:
        marks = ", ".join("?" for _ in COLUMNS)
        with self._session("write records to", "records are dropped") as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                db.executemany(f"INSERT INTO amqpjobs_results ({', '.join(COLUMNS)}) VALUES ({marks})",
                               [row_of(r) for r in records])  # fmt: skip
                db.execute("COMMIT")
            finally:
                rollback(db)  # after a failed statement

    def _history(self, job_id: str) -> list[StateRecord]:
        if self._file.absent:  # a reading command found no file: a wrong path as often as an unused one
            raise missing_file("results store", self.path, "reads it")
        try:
            with self._session("read", "status reads fail meanwhile: try again") as db:
                try:
                    rows = db.execute(
                        f"SELECT {', '.join(COLUMNS)} FROM amqpjobs_results WHERE job_id = ? ORDER BY at", (job_id,)
                    ).fetchall()
                except sqlite3.OperationalError as exc:  # read-only, so never made here: not a workers' store
                    if "no such table" not in str(exc):
                        raise
                    raise missing_table("results store", self.path, "amqpjobs_results", "reads it") from exc
        except sqlite3.Error as exc:  # not the database failing (those are said by _session)
            raise ResultsUnavailableError(f"can't read the SQLite results store at {self.path}: {exc}") from exc
        return [record_of(row) for row in rows]

    def _prune(self, older_than: float) -> int:
        with self._session("prune", "nothing was pruned: the sweep runs again later") as db:
            return db.execute("DELETE FROM amqpjobs_results WHERE at < ?", (time.time() - older_than,)).rowcount

    async def write(self, records: Sequence[StateRecord]) -> list[StateRecord]:
        """See :meth:`ResultsStore.write` (refused: a text UTF-8 can't encode)."""

        async def insert(batch: Sequence[StateRecord]) -> None:
            await asyncio.to_thread(self._insert, batch)

        return await insert_apart(insert, records, (ValueError, sqlite3.DataError))

    async def history(self, job_id: str) -> list[StateRecord]:
        """See :meth:`ResultsStore.history`."""
        return await asyncio.to_thread(self._history, job_id)

    async def prune(self, older_than: float) -> int:
        """See :meth:`ResultsStore.prune`."""
        return await asyncio.to_thread(self._prune, older_than)

    async def close(self) -> None:
        """Nothing to release: every call closes its connection."""

    def copy(self) -> SqliteResults:
        """See :meth:`ResultsStore.copy` (the same file: ResultsUnavailableError when it is gone or replaced)."""
        with self._session("open", ""):  # the file first opened, or ResultsUnavailableError
            pass
        return copy.copy(self)  # every call opens its own connection: nothing else to make


async def record_quietly(store: ResultsStore | None, records: Sequence[StateRecord]) -> int:
    """Write ``records`` (park and replay moves) at once, best effort; returns how many were not written.

    A failure is logged, never raised: the moves are done whatever the store says.
    """
    if store is None or not records:
        return 0
    try:
        async with asyncio.timeout(WRITE_TIMEOUT):
            refused = await store.write(records)
    except Exception as exc:
        log.warning("results store: %d park/replay record(s) not written (%s: %s)", len(records),
                    type(exc).__name__, str(exc)[:200])  # fmt: skip
        return len(records)
    if refused:  # the others were written
        log.warning("results store: %d park/replay record(s) not written (%s)", len(refused), refused_text(refused))
    return len(refused or ())


async def read_status(store: ResultsStore, job_id: str) -> JobStatus:
    """The status of ``job_id`` in ``store`` (:meth:`App.job_status`). Raises ResultsUnavailableError."""
    return status_of(job_id, await store.history(job_id), time.time())


async def wait_result(store: ResultsStore, job_id: str, limit: float, every: float) -> Any:
    """Poll ``store`` every ``every`` seconds, up to ``limit``, for a terminal state of ``job_id`` (:meth:`App.result`).

    Raises:
        JobFailedError, ResultsUnavailableError, TimeoutError: see :meth:`App.result`.
    """
    deadline = time.monotonic() + limit
    last = "no read yet"
    while True:
        status: JobStatus | None = None
        try:
            status = await read_status(store, job_id)
            last = status.state + (f" ({status.note})" if status.note else "")
        except ResultsUnavailableError as exc:  # a store outage while waiting: keep trying until the deadline
            last = f"store unreachable: {exc}"
        cur = status.current if status is not None else None
        if status is not None and cur is not None and status.state in TERMINAL:
            if status.state == "succeeded":
                if cur.value_note:
                    raise ResultsUnavailableError(f"job {job_id} succeeded but its value was {cur.value_note}")
                return status.value()
            if status.state == "duplicate":  # done by a run whose value was not recorded (it did not succeed)
                return None
            raise JobFailedError(
                f"job {job_id} is {status.state}" + (f": reason {cur.detail}" if cur.detail else "")
                + (f" ({cur.error})" if cur.error else ""), job_id, status.state, cur.detail, cur.error,
            )  # fmt: skip
        left = deadline - time.monotonic()
        if left <= 0:  # the last read was at the deadline (a retest: it gave up a poll early, saying it waited)
            raise TimeoutError(f"job {job_id}: no terminal state within {limit:g}s; last state: {last}")
        await asyncio.sleep(min(every, left))
