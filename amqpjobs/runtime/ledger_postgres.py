"""The idempotency ledger in PostgreSQL (many hosts), with a primary key as the unique index.

Same state machine as :class:`~amqpjobs.runtime.ledger.SqliteLedger` (see
:mod:`amqpjobs.runtime.ledger`); claims use ``INSERT ... ON CONFLICT`` and a row lock
(``SELECT ... FOR UPDATE``), so two hosts never both get ``CLAIMED`` for a live key.
Keys go in through :func:`~amqpjobs.runtime.pg_text.to_db` (a job id may hold a NUL).
The async connection is a :class:`~amqpjobs.runtime.pg_connection.PgConnection`: reopened
after a loss, connect attempts paced while the database is down (then
:class:`~amqpjobs.errors.LedgerUnavailableError`), one log line when it goes, one when it is back.
Needs the ``postgres`` extra (psycopg 3).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from amqpjobs.durations import duration_argument
from amqpjobs.errors import DuplicateJobError, LedgerUnavailableError
from amqpjobs.runtime import ledger_origin as origin
from amqpjobs.runtime.ledger import DEFAULT_RETENTION, Claim
from amqpjobs.runtime.ledger_guard import ended_inside
from amqpjobs.runtime.ledger_key import KEY_TABLE, new_key
from amqpjobs.runtime.pg_connection import CONNECT_TIMEOUT, PgConnection, ThreadConnections, psycopg_module
from amqpjobs.runtime.pg_text import to_db
from amqpjobs.runtime.refused_stores import refused_when_used

_TABLE = """
CREATE TABLE IF NOT EXISTS amqpjobs_ledger (
    key TEXT PRIMARY KEY,
    state TEXT NOT NULL CHECK (state IN ('running', 'done')),
    owner TEXT NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL
)
"""
#: The table, and a note that this open created it (``amqpjobs_ledger_origin``: the worker's start checks it
#: with the broker, :mod:`amqpjobs.runtime.ledger_origin`); then the note's table for a ledger older than it.
_SCHEMA = (
    "DO $$ BEGIN IF to_regclass('amqpjobs_ledger') IS NULL THEN " + _TABLE + "; " + origin.ORIGIN_TABLE + "; "
    "INSERT INTO amqpjobs_ledger_origin (created_at, created_by) VALUES "
    "(extract(epoch FROM clock_timestamp()), 'PostgreSQL user ' || current_user); END IF; END $$",
    origin.ORIGIN_TABLE,
    KEY_TABLE,
)


#: The current transaction's id (assigned if need be): the same at the block's end unless the handler ended it.
_XACT = "SELECT txid_current()"
#: Words of psycopg's ProgrammingError for ``commit()`` / ``rollback()`` inside ``Connection.transaction()``.
_FORBIDDEN = "forbidden within a Transaction context"
#: What to check before replaying a job whose handler committed part of its effect itself.
_CHECK = "; what it did before its own COMMIT is committed, without the done-mark: check it before replaying the job"


@refused_when_used  # another App's bad argument refuses no app named by --app
class PostgresLedger:
    """A ledger in PostgreSQL.

    Args:
        dsn: libpq connection string or URL (``postgresql://user:pass@host:5432/db``).
        retention: How long done-markers are kept: seconds or a duration string (default 14 days).

    Call :meth:`open` (async) before use; the worker does.

    Raises:
        ConfigurationError: ``dsn`` is not a PostgreSQL connection string (at once), or
            psycopg is missing.
        LedgerUnavailableError: (from the async methods) the database can't be reached now.
    """

    def __init__(self, dsn: str, retention: float | str = DEFAULT_RETENTION) -> None:
        self.retention = duration_argument("PostgresLedger(retention=...)", retention)
        self._db = PgConnection(dsn, "PostgresLedger", "the PostgreSQL ledger", _SCHEMA, LedgerUnavailableError)
        self.dsn = dsn
        self.where = _where(dsn)
        self._threads = ThreadConnections(dsn, "PostgresLedger", self._db.what)  # one sync connection per thread

    async def open(self) -> None:
        """Connect (when not connected) and create the table when missing.

        Raises:
            LedgerUnavailableError: the database can't be reached.
        """
        await self._db.open()

    async def seal_key(self) -> bytes:
        """See :class:`~amqpjobs.runtime.ledger_key.KeyedLedger`."""
        async with self._db.use() as conn, conn.transaction():
            await conn.execute("INSERT INTO amqpjobs_ledger_key (id, key) VALUES (1, %s) ON CONFLICT (id) DO NOTHING",
                               (new_key(),))  # fmt: skip
            row = await (await conn.execute("SELECT key FROM amqpjobs_ledger_key WHERE id = 1")).fetchone()
        return bytes.fromhex(str(row[0]))

    async def unconfirmed(self) -> str | None:
        """See :class:`~amqpjobs.runtime.ledger_origin.NewLedger`."""
        async with self._db.use() as conn:
            row = await (await conn.execute(origin.UNCONFIRMED)).fetchone()
        return None if row is None else origin.origin_words(float(row[0]), str(row[1]))

    async def confirm(self) -> None:
        """See :class:`~amqpjobs.runtime.ledger_origin.NewLedger`."""
        async with self._db.use() as conn, conn.transaction():
            await conn.execute("UPDATE amqpjobs_ledger_origin SET confirmed_at = %s WHERE confirmed_at IS NULL",
                               (time.time(),))  # fmt: skip

    async def claim(self, key: str, owner: str, lease: float) -> Claim:
        """See :meth:`amqpjobs.runtime.ledger.Ledger.claim` (``LedgerUnavailableError``: the database is away)."""
        key = to_db(key)  # a NUL in a job id: PostgreSQL text can't hold it as it is
        now = time.time()
        async with self._db.use() as conn, conn.transaction():
            cur = await conn.execute(
                "INSERT INTO amqpjobs_ledger (key, state, owner, expires_at, updated_at) "
                "VALUES (%s, 'running', %s, %s, %s) ON CONFLICT (key) DO NOTHING RETURNING key",
                (key, owner, now + lease, now),
            )
            if await cur.fetchone() is not None:
                return Claim.CLAIMED
            cur = await conn.execute(
                "SELECT state, owner, expires_at FROM amqpjobs_ledger WHERE key = %s FOR UPDATE", (key,)
            )
            state, holder, expires_at = await cur.fetchone()
            if state == "done":
                return Claim.DONE
            if holder != owner and expires_at > now:
                return Claim.BUSY
            await conn.execute(
                "UPDATE amqpjobs_ledger SET owner = %s, expires_at = %s, updated_at = %s WHERE key = %s",
                (owner, now + lease, now, key),
            )
            return Claim.CLAIMED

    @staticmethod
    def _mark_done_sql() -> tuple[str, str]:
        return (
            "UPDATE amqpjobs_ledger SET state = 'done', owner = %s, expires_at = %s, updated_at = %s "
            "WHERE key = %s AND state = 'running'",
            "INSERT INTO amqpjobs_ledger (key, state, owner, expires_at, updated_at) "
            "VALUES (%s, 'done', %s, %s, %s) ON CONFLICT (key) DO NOTHING",
        )

    async def done(self, key: str, owner: str) -> bool:
        """See :meth:`amqpjobs.runtime.ledger.Ledger.done`."""
        key = to_db(key)
        update, insert = self._mark_done_sql()
        now = time.time()
        async with self._db.use() as conn, conn.transaction():
            cur = await conn.execute(update, (owner, now, now, key))
            if cur.rowcount:
                return True
            cur = await conn.execute(insert, (key, owner, now, now))
            return bool(cur.rowcount)

    async def release(self, key: str, owner: str) -> None:
        """See :meth:`amqpjobs.runtime.ledger.Ledger.release`."""
        key = to_db(key)
        async with self._db.use() as conn:
            await conn.execute(
                "DELETE FROM amqpjobs_ledger WHERE key = %s AND owner = %s AND state = 'running'", (key, owner)
            )

    async def prune(self, older_than: float) -> int:
        """See :meth:`amqpjobs.runtime.ledger.Ledger.prune`."""
        return await self._db.prune(
            "amqpjobs_ledger", "state = 'done' AND updated_at < %s", (time.time() - older_than,)
        )

    @contextmanager
    def transaction(self, key: str, owner: str) -> Iterator[Any]:
        """A transaction (a psycopg connection, for plain-function handlers) that also marks ``key`` done.

        The handler thread's connection is reopened when it died since its last use (the
        database restarted): its ``BEGIN`` failed, so nothing of the handler's ran on it.
        The ``BEGIN``, and the done-mark with the commit (or the rollback), get the connect's
        patience each (:data:`~amqpjobs.runtime.pg_connection.CONNECT_TIMEOUT` s), then the
        connection is closed; the handler's own statements are not bounded.

        Raises:
            DuplicateJobError: ``key`` was already done; the effect was rolled back.
            ConfigurationError: the handler ended the transaction itself: psycopg refuses its
                ``commit()``/``rollback()`` there; a ``COMMIT`` of its own SQL is seen at the end
                (the transaction id changed): the current transaction is rolled back, the job not
                marked done, and the error says what may be committed
                (:func:`~amqpjobs.runtime.ledger_guard.ended_inside`).
                A ``close()`` of the connection too (the server rolls the transaction back, as
                SQLite's ledger says of its own).
            psycopg.OperationalError: the database can't be reached, or gave no answer in time
                (the handler fails: a retry).
        """
        shown, key = key, to_db(key)
        update, insert = self._mark_done_sql()
        with ExitStack() as bound, ExitStack() as stack:  # bound ends after the commit or rollback
            conn = self._threads.begin(stack)
            with self._threads.bounded(conn):
                began = conn.execute(_XACT).fetchone()[0]
            try:
                yield conn
            except Exception as exc:
                if _FORBIDDEN in str(exc):  # psycopg refused the handler's commit() / rollback() inside
                    raise ended_inside(shown, "commit() or rollback()") from exc
                if _closed_by_handler(conn):
                    raise ended_inside(shown, "close()") from exc
                ended = self._ended(conn, began)  # a COMMIT of its own, then a raise: no retry may repeat it
                if ended is not None:
                    raise ended_inside(shown, *ended) from exc
                raise
            finally:
                bound.enter_context(self._threads.bounded(conn))
            if _closed_by_handler(conn):
                raise ended_inside(shown, "close()")
            if conn.execute(_XACT).fetchone()[0] != began:  # a COMMIT / ROLLBACK of its own SQL: another transaction
                raise ended_inside(shown, *(self._ended(conn, began) or ("COMMIT or ROLLBACK", _CHECK)))
            now = time.time()
            cur = conn.execute(update, (owner, now, now, key))
            if not cur.rowcount:
                cur = conn.execute(insert, (key, owner, now, now))
                if not cur.rowcount:
                    raise DuplicateJobError(f"job {shown!r} was already done: its effect was rolled back")

    def _ended(self, conn: Any, began: int) -> tuple[str, str] | None:
        """How the handler ended ``ctx.transaction()``'s transaction ``began`` (a txid) with its own SQL, if it did.

        ``txid_status`` (PostgreSQL 10+): ``("COMMIT", check)`` when it committed (what came
        before is kept, without the done-mark), ``("ROLLBACK", "")`` when it was rolled back,
        None while it is still the connection's open transaction, or when that can't be read.
        Asked on ``conn``, or on a connection of its own when ``conn``'s transaction is aborted.
        """
        psycopg = psycopg_module("PostgresLedger")
        query = "SELECT txid_status(%s)"
        try:
            if conn.info.transaction_status != psycopg.pq.TransactionStatus.INERROR:
                with self._threads.bounded(conn):
                    row = conn.execute(query, (began,)).fetchone()
            else:
                with psycopg.connect(self.dsn, connect_timeout=CONNECT_TIMEOUT, autocommit=True) as other:
                    row = other.execute(query, (began,)).fetchone()
        except psycopg.Error:
            return None
        status = row[0] if row else None
        if status == "committed":
            return "COMMIT", _CHECK
        return ("ROLLBACK", "") if status == "aborted" else None

    async def close(self) -> None:
        """Close the connections."""
        await self._db.close()
        self._threads.close()


def _where(dsn: str) -> str:
    """``PostgreSQL ledger (database shop on db1:5432)``, for messages: never the password."""
    try:
        from psycopg.conninfo import conninfo_to_dict

        info = conninfo_to_dict(dsn)
    except Exception:  # psycopg missing, or a string it can't parse (its message may quote the password)
        return "PostgreSQL ledger"
    database, host = info.get("dbname") or info.get("user") or "?", info.get("host") or "the local socket"
    return f"PostgreSQL ledger (database {database} on {host}:{info.get('port') or 5432})"


def _closed_by_handler(conn: Any) -> bool:
    """Whether ``conn`` was closed by a ``close()`` (psycopg: closed, not broken by a lost connection)."""
    return bool(conn.closed) and not bool(conn.broken)
