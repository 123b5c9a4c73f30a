"""The ledger's key that seals a waiting suspect's start (:func:`amqpjobs.jobs.crash.seal_waiting_start`).

A header can't prove who set it. The workers of one app share their ledger, and a publisher
has no access to it, so the ledger keeps a random key (table ``amqpjobs_ledger_key``, made by
the first worker that asks) with which a worker seals the ``amqpjobs-waiting-start`` it puts
on a suspect's copy that waits in a retry tier; back in the work queue, a value without the
seal is another publisher's and is ignored (README "Poison jobs").
"""

from __future__ import annotations

import secrets
import sqlite3
from collections.abc import Callable
from typing import Final, Protocol, runtime_checkable

#: The key's table (SQLite and PostgreSQL alike): one row.
KEY_TABLE: Final = (
    "CREATE TABLE IF NOT EXISTS amqpjobs_ledger_key (id INTEGER PRIMARY KEY CHECK (id = 1), key TEXT NOT NULL)"
)


@runtime_checkable
class KeyedLedger(Protocol):
    """A ledger that keeps the seal key (both of amqpjobs' backends)."""

    async def seal_key(self) -> bytes:
        """The key, made by the first call on this ledger (random, 32 bytes)."""


def new_key() -> str:
    """A new key, as stored (64 hex digits)."""
    return secrets.token_hex(32)


def sqlite_seal_key(connect: Callable[[], sqlite3.Connection]) -> bytes:
    """:meth:`KeyedLedger.seal_key` of a SQLite ledger (a read once the key is made: no write lock waited for)."""
    db = connect()
    found = db.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'amqpjobs_ledger_key'")
    row = db.execute("SELECT key FROM amqpjobs_ledger_key WHERE id = 1").fetchone() if found.fetchone() else None
    if row is None:
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute(KEY_TABLE)
            db.execute("INSERT OR IGNORE INTO amqpjobs_ledger_key (id, key) VALUES (1, ?)", (new_key(),))
            row = db.execute("SELECT key FROM amqpjobs_ledger_key WHERE id = 1").fetchone()
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
    return bytes.fromhex(str(row[0]))


async def seal_key_of(ledger: object) -> bytes | None:
    """``ledger``'s seal key; None for a ledger that keeps none (a waiting start is then honoured as it is)."""
    return await ledger.seal_key() if isinstance(ledger, KeyedLedger) else None
