"""A connection string libpq refuses before any I/O (a bad option value) is said as such, not as an outage.

helper-229: ``sslmode=bogus`` read "the PostgreSQL ledger is unreachable (...)", as if the database
were down. libpq checks option values when a connection starts, before it sends anything
(psycopg: ``connection is bad: invalid sslmode value``), so no broker or database is involved.
"""

from __future__ import annotations

import logging

import pytest

from amqpjobs.errors import LedgerUnavailableError
from amqpjobs.runtime.pg_connection import PgConnection

pytestmark = pytest.mark.version_independent


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ("sslmode=bogus", 'invalid sslmode value: "bogus"'),
        ("target_session_attrs=zzz", 'invalid target_session_attrs value: "zzz"'),
        ("keepalives=yes", 'invalid integer value "yes" for connection option "keepalives"'),
    ],
)
async def test_a_setting_libpq_refuses_is_named_as_the_connection_strings_not_an_outage(
    setting: str, named: str, caplog: pytest.LogCaptureFixture
) -> None:
    pg = PgConnection(
        f"postgresql://u:secret@127.0.0.1:9/db?{setting}", "PostgresLedger", "the PostgreSQL ledger", (),
        LedgerUnavailableError,
    )  # fmt: skip
    with caplog.at_level(logging.WARNING), pytest.raises(LedgerUnavailableError) as err:
        async with pg.use():
            pass
    said = str(err.value)
    assert said.startswith("the PostgreSQL ledger can't connect: its connection string has a setting libpq refuses"), (
        said
    )
    assert named in said
    assert "unreachable" not in said
    assert "fix that setting in the DSN" in said
    assert "secret" not in said
    [line] = [r.getMessage() for r in caplog.records]
    assert "unreachable" not in line
    assert named in line
    with pytest.raises(LedgerUnavailableError) as again:  # within the pause: the same words
        async with pg.use():
            pass
    assert "has a setting libpq refuses" in str(again.value), str(again.value)
