"""A payload store in PostgreSQL (the ledger's database, say): :class:`PostgresPayloadStore`.

Needs the ``postgres`` extra (psycopg 3), like :class:`~amqpjobs.runtime.ledger_postgres.PostgresLedger`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, Unpack

from amqpjobs.errors import ConfigurationError
from amqpjobs.runtime.payloads import PayloadStore, StoreOptions

_SCHEMA = """
CREATE TABLE IF NOT EXISTS amqpjobs_payloads (
    store TEXT NOT NULL,
    key TEXT NOT NULL,
    body BYTEA NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    done_at DOUBLE PRECISION,
    PRIMARY KEY (store, key)
)
"""
_INDEX = "CREATE INDEX IF NOT EXISTS amqpjobs_payloads_done ON amqpjobs_payloads (done_at) WHERE done_at IS NOT NULL"


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ConfigurationError("PostgresPayloadStore needs psycopg: pip install 'amqpjobs[postgres]'") from exc
    return psycopg


def dsn_problem(dsn: object) -> str | None:
    """What is wrong with ``dsn`` as a PostgreSQL connection string, or None; never shows the password.

    libpq takes a URI whose scheme is ``postgresql://`` or ``postgres://``, or ``keyword=value``
    pairs (PostgreSQL docs "Connection Strings"). An empty string would connect to libpq's
    defaults (``PG*`` variables, the local socket): refused, it is almost always a missing setting.
    """
    if not isinstance(dsn, str):
        return f"is a {type(dsn).__name__}, not a str"
    if not dsn.strip():
        return "is empty"
    if "://" in dsn:
        scheme = dsn.split("://", 1)[0]
        if scheme.lower() in ("postgresql", "postgres"):
            return None
        shown = repr(scheme) if scheme.isascii() and scheme.replace("+", "").isalnum() else "not postgresql"
        return f"has scheme {shown}: not a PostgreSQL URL"
    if "=" not in dsn:
        return "is not a URL (postgresql://...) nor keyword=value pairs (host=... dbname=...)"
    return None


class PostgresPayloadStore(PayloadStore):
    """Payloads as rows of table ``amqpjobs_payloads`` (``store, key, body BYTEA, created_at, done_at``).

    The done mark is the row's ``done_at`` (seconds since the epoch); a sweep is one
    ``DELETE``. See :mod:`amqpjobs.runtime.payloads` for the rules and the other arguments.

    Args:
        dsn: libpq connection string or URL (``postgresql://user:pass@host:5432/db``).

    Raises:
        ConfigurationError: ``dsn`` is not a PostgreSQL connection string (at once); psycopg is
            missing, or the database can't be reached (at first use).

    """

    kind = "postgres"

    def __init__(
        self,
        dsn: str,
        **options: Unpack[StoreOptions],
    ) -> None:
        super().__init__(**options)
        if problem := dsn_problem(dsn):
            raise ConfigurationError(
                f"PostgresPayloadStore(dsn=...) {problem}: give the database's URL, "
                "postgresql://user:password@host:5432/dbname (or libpq keyword=value pairs)"
            )
        self.dsn = dsn
        self._conn: Any = None
        self._lock: asyncio.Lock | None = None  # one connection: one statement (or connect) at a time
        self._lock_loop: asyncio.AbstractEventLoop | None = None

    def _fresh(self) -> None:
        """See :meth:`PayloadStore._fresh`."""
        self._conn, self._lock, self._lock_loop = None, None, None

    def _locked(self) -> asyncio.Lock:
        """The lock of the running event loop (a CLI may use the store from one loop after another)."""
        loop = asyncio.get_running_loop()
        if self._lock is None or self._lock_loop is not loop:
            self._lock, self._lock_loop = asyncio.Lock(), loop
        return self._lock

    async def open(self) -> None:
        """Connect and create the table when missing."""
        async with self._locked():
            await self._connect()

    async def _connect(self) -> None:
        """:meth:`open` under the lock: two callers at once never make two connections."""
        if self._conn is not None and not self._conn.closed:
            return
        psycopg = _psycopg()
        try:
            self._conn = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True)
            for statement in (_SCHEMA, _INDEX):
                with contextlib.suppress(psycopg.errors.UniqueViolation):  # another process created it just now
                    await self._conn.execute(statement)
        except psycopg.Error as exc:
            raise ConfigurationError(f"can't use the PostgreSQL payload store: {type(exc).__name__}: {exc}") from exc

    async def _run(self, sql: str, params: tuple[Any, ...], fetch: bool = False) -> Any:
        """Execute ``sql``; returns the cursor, or (``fetch``) its first row, read under the lock."""
        async with self._locked():
            await self._connect()
            cur = await self._conn.execute(sql, params)
            return await cur.fetchone() if fetch else cur

    async def write(self, key: str, data: bytes) -> None:
        """See :meth:`PayloadStore.write`."""
        await self._run(
            "INSERT INTO amqpjobs_payloads (store, key, body, created_at) VALUES (%s, %s, %s, %s)",
            (self.name, key, data, time.time()),
        )

    async def read(self, key: str) -> bytes | None:
        """See :meth:`PayloadStore.read`."""
        sql = "SELECT body FROM amqpjobs_payloads WHERE store = %s AND key = %s"
        row = await self._run(sql, (self.name, key), fetch=True)
        return None if row is None else bytes(row[0])

    async def mark_done(self, key: str, at: float) -> None:
        """See :meth:`PayloadStore.mark_done`."""
        await self._run("UPDATE amqpjobs_payloads SET done_at = %s WHERE store = %s AND key = %s", (at, self.name, key))

    async def unmark(self, key: str) -> None:
        """See :meth:`PayloadStore.unmark`."""
        await self._run("UPDATE amqpjobs_payloads SET done_at = NULL WHERE store = %s AND key = %s", (self.name, key))

    async def remove(self, key: str) -> None:
        """See :meth:`PayloadStore.remove`."""
        await self._run("DELETE FROM amqpjobs_payloads WHERE store = %s AND key = %s", (self.name, key))

    async def prune(self, older_than: float) -> int:
        """See :meth:`PayloadStore.prune`."""
        cur = await self._run(
            "DELETE FROM amqpjobs_payloads WHERE store = %s AND done_at < %s", (self.name, time.time() - older_than)
        )
        return int(cur.rowcount)

    async def close(self) -> None:
        """Close the connection."""
        if self._conn is not None:
            await self._conn.close()
            self._conn = None
