"""SQLite's one write lock per file, held by another write transaction: the stores' errors name it.

Before, a ledger claim or done-mark waited the 30 s busy timeout and raised ``sqlite3.OperationalError:
database is locked`` (the worker logged an ERROR per job and pass); a results batch failed the same
way. Now the wait is the ledger's patience (10 s; shortened here) and the error is the store's own,
naming the file, the lock and its likely holder.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Generator
from pathlib import Path

import pytest

from amqpjobs.errors import LedgerUnavailableError, ResultsUnavailableError
from amqpjobs.jobs.results import StateRecord
from amqpjobs.runtime import ledger as ledger_module
from amqpjobs.runtime import results as results_module
from amqpjobs.runtime.ledger import LEDGER_PATIENCE, Claim, SqliteLedger
from amqpjobs.runtime.results import SqliteResults


def test_a_ledger_waits_no_longer_than_its_patience() -> None:
    assert ledger_module.BUSY_TIMEOUT == LEDGER_PATIENCE == 10.0  # before: 30 s, claims held their slots so long


@pytest.fixture
def short(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ledger_module, "BUSY_TIMEOUT", 0.3)
    monkeypatch.setattr(results_module, "BUSY_TIMEOUT", 0.3)


def held(path: Path) -> Generator[sqlite3.Connection, None, None]:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("BEGIN IMMEDIATE")  # a ctx.transaction() that hangs
    try:
        yield db
    finally:
        db.execute("ROLLBACK")
        db.close()


async def test_a_ledger_behind_a_held_write_lock_says_so(tmp_path: Path, short: None) -> None:
    path = tmp_path / "ledger.db"
    ledger = SqliteLedger(path)
    lock = held(path)
    next(lock)
    started = time.monotonic()
    for call in (lambda: ledger.claim("a", "w", 30), lambda: ledger.done("a", "w")):
        with pytest.raises(LedgerUnavailableError) as caught:
            await call()
        text = str(caught.value)
        assert text.startswith(f"the SQLite ledger at {path} is locked: a write transaction has held the whole file")
        assert "ctx.transaction()" in text
        assert "(database is locked)" in text
    assert time.monotonic() - started < 3
    with pytest.raises(LedgerUnavailableError, match="is locked"), ledger.transaction("b", "w"):
        pass
    lock.close()  # the lock is free: the ledger answers
    assert await ledger.claim("a", "w", 30) is Claim.CLAIMED
    await ledger.close()


async def test_a_results_store_behind_a_held_write_lock_says_so(tmp_path: Path, short: None) -> None:
    path = tmp_path / "results.db"
    results = SqliteResults(path)
    lock = held(path)
    next(lock)
    with pytest.raises(ResultsUnavailableError, match=f"^the SQLite results store at {path} is locked"):
        await results.write([StateRecord("m-1", "mail", "succeeded", 1, 1.0e9)])
    lock.close()
    assert not await results.write([StateRecord("m-1", "mail", "succeeded", 1, 1.0e9)])


def test_a_store_opened_while_the_write_lock_is_held_needs_no_write(tmp_path: Path, short: None) -> None:
    """A process starting (or ``job show`` loading the app) while a ctx.transaction() runs: the file's token is
    read, not written, once it has one, so the first open waits for no lock."""
    path = tmp_path / "shared.db"
    SqliteLedger(path)
    SqliteResults(path)
    lock = held(path)
    next(lock)
    started = time.monotonic()
    SqliteLedger(path)
    SqliteResults(path)
    assert time.monotonic() - started < 0.3
    lock.close()


def locked_whole(path: Path) -> Generator[sqlite3.Connection, None, None]:
    """Another program holding the file for itself (``locking_mode=EXCLUSIVE``): reads wait too, even in WAL."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA locking_mode=EXCLUSIVE")
    db.execute("BEGIN EXCLUSIVE")
    db.execute("DELETE FROM amqpjobs_results WHERE job_id = 'none'")
    try:
        yield db
    finally:
        db.execute("ROLLBACK")
        db.close()


async def test_every_results_store_statement_behind_a_held_lock_says_so(tmp_path: Path, short: None) -> None:
    """A read (job status) and the retention sweep, not only a batch's write. Before: the read said "can't read
    the SQLite results store at P: database is locked" (no lock, no holder), the sweep raised SQLite's own
    ``OperationalError: database is locked``."""
    path = tmp_path / "results.db"
    results = SqliteResults(path)
    assert not await results.write([StateRecord("m-1", "mail", "succeeded", 1, 1.0e9)])
    lock = locked_whole(path)
    next(lock)
    said = f"^the SQLite results store at {path} is locked: a write transaction has held the whole file for over 0.3s"
    with pytest.raises(ResultsUnavailableError, match=said) as read:
        await results.history("m-1")
    assert "status reads fail meanwhile" in str(read.value)
    with pytest.raises(ResultsUnavailableError, match=said) as swept:
        await results.prune(60)
    assert "the sweep runs again later" in str(swept.value)
    with pytest.raises(ResultsUnavailableError, match=said) as wrote:
        await results.write([StateRecord("m-2", "mail", "succeeded", 1, 1.0e9)])
    assert "records are dropped" in str(wrote.value)
    lock.close()
    assert [r.state for r in await results.history("m-1")] == ["succeeded"]
