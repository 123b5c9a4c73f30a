"""The results store in PostgreSQL (many hosts); same table and rules as :mod:`amqpjobs.runtime.results`.

One async connection, reopened on the next call after it broke (the database restarted,
the network dropped), with a :data:`CONNECT_TIMEOUT`; a write that fails raises and the
worker's :class:`~amqpjobs.runtime.results.ResultsWriter` counts it. Needs the
``postgres`` extra (psycopg 3).

PostgreSQL text can't hold NUL (0x00), which a job id, an error message or a reason may
carry: such a text is stored escaped (:mod:`amqpjobs.runtime.pg_text`), losslessly, so the
job reads back as it was and a NUL id is found like any other.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from typing import Any

from amqpjobs.durations import duration_argument
from amqpjobs.errors import ResultsUnavailableError
from amqpjobs.jobs.results import DEFAULT_RETENTION, StateRecord
from amqpjobs.runtime.ledger_postgres import _psycopg
from amqpjobs.runtime.pg_text import from_db, to_db
from amqpjobs.runtime.results import _SCHEMA, COLUMNS, insert_apart, record_of, row_of

#: Seconds to connect at most (libpq ``connect_timeout``).
CONNECT_TIMEOUT = 5


def _stored(row: Sequence[object]) -> tuple[object, ...]:
    return tuple(to_db(v) if isinstance(v, str) else v for v in row)


def _read(row: Sequence[object]) -> tuple[object, ...]:
    return tuple(from_db(v) if isinstance(v, str) else v for v in row)


def _one_line(exc: BaseException) -> str:
    """``"<type>: <message>"`` on one line (libpq's messages span lines), at most 200 characters of message."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"


class PostgresResults:
    """A results store in PostgreSQL.

    Args:
        dsn: libpq connection string or URL (``postgresql://user:pass@host:5432/db``); may be the ledger's.
        retention: How long records are kept: seconds or a duration string (default 1 day).

    The table is created on first use (:meth:`open`, which the worker calls at start).

    Raises:
        ConfigurationError: psycopg is missing (``pip install 'amqpjobs[postgres]'``).
    """

    def __init__(self, dsn: str, retention: float | str = DEFAULT_RETENTION) -> None:
        _psycopg()
        self.dsn = dsn
        self.retention = duration_argument("PostgresResults(retention=...)", retention)
        self._conn: Any = None
        self._lock = asyncio.Lock()

    async def open(self) -> None:
        """Connect (when not connected) and create the table when missing.

        Raises:
            ResultsUnavailableError: the database can't be reached.
        """
        psycopg = _psycopg()
        if self._conn is not None and not self._conn.closed:
            return
        try:
            self._conn = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True,
                                                               connect_timeout=CONNECT_TIMEOUT)  # fmt: skip
            for statement in _SCHEMA:
                await self._conn.execute(statement)
        except psycopg.Error as exc:
            await self._drop()
            raise ResultsUnavailableError(f"can't reach the PostgreSQL results store: {_one_line(exc)}") from exc

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):  # already broken: nothing to release
                await conn.close()

    async def _run(self, sql: str, params: Any, many: bool = False) -> Any:
        psycopg = _psycopg()
        async with self._lock:
            await self.open()
            try:
                if many:  # all or none: a refused row leaves no other behind (insert_apart then goes one by one)
                    async with self._conn.transaction(), self._conn.cursor() as cur:
                        await cur.executemany(sql, params)
                        return None
                return await self._conn.execute(sql, params)
            except psycopg.OperationalError:
                await self._drop()  # reconnect on the next call
                raise

    async def write(self, records: Sequence[StateRecord]) -> list[StateRecord]:
        """See :meth:`amqpjobs.runtime.results.ResultsStore.write` (refused: a text UTF-8 can't encode)."""
        psycopg = _psycopg()
        marks = ", ".join("%s" for _ in COLUMNS)
        sql = f"INSERT INTO amqpjobs_results ({', '.join(COLUMNS)}) VALUES ({marks})"

        async def insert(batch: Sequence[StateRecord]) -> None:
            await self._run(sql, [_stored(row_of(r)) for r in batch], many=True)

        return await insert_apart(insert, records, (ValueError, psycopg.DataError))

    async def history(self, job_id: str) -> list[StateRecord]:
        """See :meth:`amqpjobs.runtime.results.ResultsStore.history`."""
        psycopg = _psycopg()
        try:
            cur = await self._run(
                f"SELECT {', '.join(COLUMNS)} FROM amqpjobs_results WHERE job_id = %s ORDER BY at", (to_db(job_id),)
            )
            rows = await cur.fetchall()
        except psycopg.Error as exc:
            raise ResultsUnavailableError(f"can't read the PostgreSQL results store: {_one_line(exc)}") from exc
        return [record_of(_read(row)) for row in rows]

    async def prune(self, older_than: float) -> int:
        """See :meth:`amqpjobs.runtime.results.ResultsStore.prune`."""
        cur = await self._run("DELETE FROM amqpjobs_results WHERE at < %s", (time.time() - older_than,))
        return int(cur.rowcount)

    def copy(self) -> PostgresResults:
        """See :meth:`amqpjobs.runtime.results.ResultsStore.copy`."""
        return PostgresResults(self.dsn, self.retention)

    async def close(self) -> None:
        """Close the connection."""
        await self._drop()
