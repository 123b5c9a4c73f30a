"""The idempotency ledger in PostgreSQL (many hosts), with a primary key as the unique index.

Same state machine as :class:`~amqpjobs.runtime.ledger.SqliteLedger` (see
:mod:`amqpjobs.runtime.ledger`); claims use ``INSERT ... ON CONFLICT`` and a row lock
(``SELECT ... FOR UPDATE``), so two hosts never both get ``CLAIMED`` for a live key.
Keys go in through :func:`~amqpjobs.runtime.pg_text.to_db` (a job id may hold a NUL).
Needs the ``postgres`` extra (psycopg 3).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from amqpjobs.durations import duration_argument
from amqpjobs.errors import ConfigurationError, DuplicateJobError
from amqpjobs.runtime.ledger import DEFAULT_RETENTION, Claim
from amqpjobs.runtime.pg_text import to_db

_SCHEMA = """
CREATE TABLE IF NOT EXISTS amqpjobs_ledger (
    key TEXT PRIMARY KEY,
    state TEXT NOT NULL CHECK (state IN ('running', 'done')),
    owner TEXT NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL
)
"""


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ConfigurationError("PostgresLedger needs psycopg: pip install 'amqpjobs[postgres]'") from exc
    return psycopg


class PostgresLedger:
    """A ledger in PostgreSQL.

    Args:
        dsn: libpq connection string or URL (``postgresql://user:pass@host:5432/db``).
        retention: How long done-markers are kept: seconds or a duration string (default 14 days).

    Call :meth:`open` (async) before use; the worker does.

    Raises:
        ConfigurationError: psycopg is missing, or the database can't be reached.
    """

    def __init__(self, dsn: str, retention: float | str = DEFAULT_RETENTION) -> None:
        self.dsn = dsn
        self.retention = duration_argument("PostgresLedger(retention=...)", retention)
        self._conn: Any = None
        self._lock = asyncio.Lock()  # one async connection: one statement/transaction at a time
        self._local = threading.local()  # one sync connection per handler thread
        self._sync: list[Any] = []  # all of them, to close
        self._sync_lock = threading.Lock()

    async def open(self) -> None:
        """Connect and create the table when missing."""
        psycopg = _psycopg()
        if self._conn is not None:
            return
        try:
            self._conn = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True)
            await self._conn.execute(_SCHEMA)
        except psycopg.Error as exc:
            raise ConfigurationError(f"can't use the PostgreSQL ledger: {type(exc).__name__}: {exc}") from exc

    async def claim(self, key: str, owner: str, lease: float) -> Claim:
        """See :meth:`amqpjobs.runtime.ledger.Ledger.claim`."""
        await self.open()
        key = to_db(key)  # a NUL in a job id: PostgreSQL text can't hold it as it is
        now = time.time()
        async with self._lock, self._conn.transaction():
            cur = await self._conn.execute(
                "INSERT INTO amqpjobs_ledger (key, state, owner, expires_at, updated_at) "
                "VALUES (%s, 'running', %s, %s, %s) ON CONFLICT (key) DO NOTHING RETURNING key",
                (key, owner, now + lease, now),
            )
            if await cur.fetchone() is not None:
                return Claim.CLAIMED
            cur = await self._conn.execute(
                "SELECT state, owner, expires_at FROM amqpjobs_ledger WHERE key = %s FOR UPDATE", (key,)
            )
            state, holder, expires_at = await cur.fetchone()
            if state == "done":
                return Claim.DONE
            if holder != owner and expires_at > now:
                return Claim.BUSY
            await self._conn.execute(
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
        await self.open()
        key = to_db(key)
        update, insert = self._mark_done_sql()
        now = time.time()
        async with self._lock, self._conn.transaction():
            cur = await self._conn.execute(update, (owner, now, now, key))
            if cur.rowcount:
                return True
            cur = await self._conn.execute(insert, (key, owner, now, now))
            return bool(cur.rowcount)

    async def release(self, key: str, owner: str) -> None:
        """See :meth:`amqpjobs.runtime.ledger.Ledger.release`."""
        await self.open()
        key = to_db(key)
        async with self._lock:
            await self._conn.execute(
                "DELETE FROM amqpjobs_ledger WHERE key = %s AND owner = %s AND state = 'running'", (key, owner)
            )

    async def prune(self, older_than: float) -> int:
        """See :meth:`amqpjobs.runtime.ledger.Ledger.prune`."""
        await self.open()
        async with self._lock:
            cur = await self._conn.execute(
                "DELETE FROM amqpjobs_ledger WHERE state = 'done' AND updated_at < %s", (time.time() - older_than,)
            )
        return int(cur.rowcount)

    @contextmanager
    def transaction(self, key: str, owner: str) -> Iterator[Any]:
        """A transaction (a psycopg connection, for plain-function handlers) that also marks ``key`` done.

        Raises:
            DuplicateJobError: ``key`` was already done; the effect was rolled back.
        """
        psycopg = _psycopg()
        shown, key = key, to_db(key)
        conn = getattr(self._local, "conn", None)
        if conn is None or conn.closed:
            conn = self._local.conn = psycopg.connect(self.dsn)
            with self._sync_lock:
                self._sync.append(conn)
        update, insert = self._mark_done_sql()
        with conn.transaction():
            yield conn
            now = time.time()
            cur = conn.execute(update, (owner, now, now, key))
            if not cur.rowcount:
                cur = conn.execute(insert, (key, owner, now, now))
                if not cur.rowcount:
                    raise DuplicateJobError(f"job {shown!r} was already done: its effect was rolled back")

    async def close(self) -> None:
        """Close the connections."""
        if self._conn is not None:
            await self._conn.close()
            self._conn = None
        with self._sync_lock:
            conns, self._sync = self._sync, []
        for conn in conns:
            conn.close()
