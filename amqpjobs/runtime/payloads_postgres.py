"""A payload store in PostgreSQL (the ledger's database, say): :class:`PostgresPayloadStore`.

Needs the ``postgres`` extra (psycopg 3), like :class:`~amqpjobs.runtime.ledger_postgres.PostgresLedger`.
Its connection is a :class:`~amqpjobs.runtime.pg_connection.PgConnection`: reopened after a
loss, connect attempts paced while the database is down.
"""

from __future__ import annotations

import time
from typing import Any, Unpack

from amqpjobs.errors import PayloadStoreError
from amqpjobs.runtime.payloads import PayloadStore, StoreOptions
from amqpjobs.runtime.pg_connection import PgConnection, dsn_problem, psycopg_module
from amqpjobs.runtime.refused_stores import refused_when_used

__all__ = ["PostgresPayloadStore", "dsn_problem"]

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


@refused_when_used  # another App's bad argument refuses no app named by --app
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
        self._db = PgConnection(dsn, "PostgresPayloadStore", "the PostgreSQL payload store", (_SCHEMA, _INDEX),
                                PayloadStoreError)  # fmt: skip
        self.dsn = dsn

    def _fresh(self) -> None:
        """See :meth:`PayloadStore._fresh`."""
        self._db = self._db.twin()

    async def open(self) -> None:
        """Connect (when not connected) and create the table when missing.

        Raises:
            PayloadStoreError: the database can't be reached.
        """
        psycopg_module("PostgresPayloadStore")
        await self._db.open()

    async def _run(self, sql: str, params: tuple[Any, ...], fetch: bool = False) -> Any:
        """Execute ``sql``; returns the cursor, or (``fetch``) its first row, read under the lock."""
        async with self._db.use() as conn:
            cur = await conn.execute(sql, params)
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

    async def mark_done(self, key: str, at: float) -> bool:
        """See :meth:`PayloadStore.mark_done`."""
        cur = await self._run(
            "UPDATE amqpjobs_payloads SET done_at = %s WHERE store = %s AND key = %s", (at, self.name, key)
        )
        return int(cur.rowcount) > 0

    async def unmark(self, key: str) -> None:
        """See :meth:`PayloadStore.unmark`."""
        await self._run("UPDATE amqpjobs_payloads SET done_at = NULL WHERE store = %s AND key = %s", (self.name, key))

    async def remove(self, key: str) -> None:
        """See :meth:`PayloadStore.remove`."""
        await self._run("DELETE FROM amqpjobs_payloads WHERE store = %s AND key = %s", (self.name, key))

    async def prune(self, older_than: float) -> int:
        """See :meth:`PayloadStore.prune`."""
        return await self._db.prune(
            "amqpjobs_payloads", "store = %s AND done_at < %s", (self.name, time.time() - older_than)
        )

    async def close(self) -> None:
        """Close the connection."""
        await self._db.close()
