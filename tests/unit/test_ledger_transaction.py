"""ctx.transaction() on SQLite when the handler ends the transaction itself (an outsider's report)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from amqpjobs.runtime.ledger import Claim, SqliteLedger


def make(tmp_path: Path) -> SqliteLedger:
    ledger = SqliteLedger(tmp_path / "l.db")
    db = ledger._connect()
    db.execute("CREATE TABLE IF NOT EXISTS effects (v TEXT)")
    return ledger


def test_a_commit_then_a_raise_keeps_the_handlers_error(tmp_path: Path):
    ledger = make(tmp_path)
    assert asyncio.run(ledger.claim("k", "me", 60.0)) is Claim.CLAIMED

    def handler() -> None:
        with ledger.transaction("k", "me") as db:
            db.execute("INSERT INTO effects VALUES ('x')")
            db.commit()
            raise ValueError("after commit")  # was hidden by "cannot rollback - no transaction is active"

    with pytest.raises(ValueError, match="after commit"):
        handler()


def test_a_commit_inside_still_marks_the_key_done(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    ledger = make(tmp_path)
    assert asyncio.run(ledger.claim("k", "me", 60.0)) is Claim.CLAIMED
    with ledger.transaction("k", "me") as db:
        db.execute("INSERT INTO effects VALUES ('x')")
        db.commit()
    assert "never commit inside it" in caplog.text
    assert asyncio.run(ledger.claim("k", "other", 60.0)) is Claim.DONE  # a retry or replay is a duplicate
