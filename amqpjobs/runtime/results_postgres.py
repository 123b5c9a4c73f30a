"""The results store in PostgreSQL (many hosts); same table and rules as :mod:`amqpjobs.runtime.results`.

One async connection, a :class:`~amqpjobs.runtime.pg_connection.PgConnection`: reopened
on the next call after it broke (the database restarted, the network dropped), connect
attempts paced while the database is down; a write that fails raises and the worker's
:class:`~amqpjobs.runtime.results_writer.ResultsWriter` counts it. Needs the ``postgres`` extra (psycopg 3).

PostgreSQL text can't hold NUL (0x00), which a job id, an error message or a reason may
carry: such a text is stored escaped (:mod:`amqpjobs.runtime.pg_text`), losslessly, so the
job reads back as it was and a NUL id is found like any other.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from amqpjobs.durations import duration_argument
from amqpjobs.errors import ResultsUnavailableError
from amqpjobs.jobs.results import DEFAULT_RETENTION, StateRecord
from amqpjobs.runtime.pg_connection import PgConnection, psycopg_module
from amqpjobs.runtime.pg_text import from_db, to_db
from amqpjobs.runtime.refused_stores import refused_when_used
from amqpjobs.runtime.results import _SCHEMA, COLUMNS, insert_apart, record_of, row_of
from amqpjobs.text import one_line


def _psycopg() -> Any:
    return psycopg_module("PostgresResults")


def _stored(row: Sequence[object]) -> tuple[object, ...]:
    return tuple(to_db(v) if isinstance(v, str) else v for v in row)


def _read(row: Sequence[object]) -> tuple[object, ...]:
    return tuple(from_db(v) if isinstance(v, str) else v for v in row)


@refused_when_used  # another App's bad argument refuses no app named by --app
class PostgresResults:
    """A results store in PostgreSQL.

    Args:
        dsn: libpq connection string or URL (``postgresql://user:pass@host:5432/db``); may be the ledger's.
        retention: How long records are kept: seconds or a duration string (default 1 day).

    The table is created on first use (:meth:`open`, which the worker calls at start).

    Raises:
        ConfigurationError: psycopg is missing (``pip install 'amqpjobs[postgres]'``), or
            ``dsn`` is not a PostgreSQL connection string.
    """

    def __init__(self, dsn: str, retention: float | str = DEFAULT_RETENTION) -> None:
        _psycopg()
        self.retention = duration_argument("PostgresResults(retention=...)", retention)
        self._db = PgConnection(dsn, "PostgresResults", "the PostgreSQL results store", _SCHEMA,
                                ResultsUnavailableError)  # fmt: skip
        self.dsn = dsn

    async def open(self) -> None:
        """Connect (when not connected) and create the table when missing.

        Raises:
            ResultsUnavailableError: the database can't be reached.
        """
        await self._db.open()

    async def _run(self, sql: str, params: Any, many: bool = False) -> Any:
        async with self._db.use() as conn:
            if many:  # all or none: a refused row leaves no other behind (insert_apart then goes one by one)
                async with conn.transaction(), conn.cursor() as cur:
                    await cur.executemany(sql, params)
                    return None
            return await conn.execute(sql, params)

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
            raise ResultsUnavailableError(f"can't read the PostgreSQL results store: {one_line(exc)}") from exc
        return [record_of(_read(row)) for row in rows]

    async def prune(self, older_than: float) -> int:
        """See :meth:`amqpjobs.runtime.results.ResultsStore.prune`."""
        return await self._db.prune("amqpjobs_results", "at < %s", (time.time() - older_than,))

    def copy(self) -> PostgresResults:
        """See :meth:`amqpjobs.runtime.results.ResultsStore.copy`."""
        return PostgresResults(self.dsn, self.retention)

    async def close(self) -> None:
        """Close the connection."""
        await self._db.close()
