"""A ledger notes that its open created it (amqpjobs.runtime.ledger_origin); the worker checks it at start."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from amqpjobs.runtime.ledger import SqliteLedger
from amqpjobs.runtime.ledger_origin import NewLedger, creator, marker_queue


async def test_a_ledger_file_created_by_its_open_is_unconfirmed_until_confirmed(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    ledger = SqliteLedger(path)
    assert isinstance(ledger, NewLedger)
    assert ledger.where == f"SQLite ledger at {path}"
    said = await ledger.unconfirmed()
    assert said is not None
    assert said.startswith("created 20")
    assert said.endswith(f" by {creator()}")
    again = SqliteLedger(path)  # another process of the same start: the same unconfirmed file
    assert await again.unconfirmed() == said
    await ledger.confirm()
    assert await again.unconfirmed() is None
    assert await SqliteLedger(path).unconfirmed() is None
    for each in (ledger, again):
        await each.close()


async def test_a_ledger_older_than_the_origin_table_counts_as_established(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE amqpjobs_ledger (key TEXT PRIMARY KEY, state TEXT NOT NULL, owner TEXT NOT NULL, "
                   "expires_at REAL NOT NULL, updated_at REAL NOT NULL)")  # fmt: skip
    db.close()
    ledger = SqliteLedger(path)
    assert await ledger.unconfirmed() is None
    await ledger.close()


def test_the_marker_is_named_after_the_app() -> None:
    assert marker_queue("billing") == "amqpjobs.ledger.billing"
