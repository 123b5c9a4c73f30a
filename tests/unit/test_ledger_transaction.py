"""ctx.transaction() on SQLite when the handler tries to end the transaction itself (outsiders' reports).

The effect and the job's done-mark commit together when the ``with`` block ends. A commit of the
handler's own inside it split them: a commit then a raise kept the effect without the mark, so
every retry and replay did it again (3 effects, then 6). Ending the transaction inside is now
refused, as psycopg refuses ``commit()`` there: the run fails with a ConfigurationError (its job
is quarantined ``permanent`` at once), and nothing of it is kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from amqpjobs.errors import ConfigurationError
from amqpjobs.jobs.failure import classify
from amqpjobs.runtime.ledger import Claim, SqliteLedger


def make(tmp_path: Path) -> SqliteLedger:
    ledger = SqliteLedger(tmp_path / "l.db")
    db = ledger._connect()
    db.execute("CREATE TABLE IF NOT EXISTS effects (v TEXT)")
    return ledger


def effects(ledger: SqliteLedger) -> list[str]:
    with sqlite3.connect(ledger.path) as db:
        return [row[0] for row in db.execute("SELECT v FROM effects")]


ENDINGS: dict[str, Callable[[sqlite3.Connection], object]] = {
    "commit()": lambda db: db.commit(),
    "rollback()": lambda db: db.rollback(),
    "COMMIT": lambda db: db.execute("COMMIT"),
    "END": lambda db: db.execute("end transaction"),
    "ROLLBACK": lambda db: db.execute("ROLLBACK"),
    "BEGIN": lambda db: db.execute("BEGIN"),
    "executescript": lambda db: db.executescript("INSERT INTO effects VALUES ('script');"),
}


@pytest.mark.parametrize("ending", list(ENDINGS))
def test_ending_the_transaction_inside_is_refused_and_keeps_nothing(tmp_path: Path, ending: str):
    ledger = make(tmp_path)
    assert asyncio.run(ledger.claim("k", "me", 60.0)) is Claim.CLAIMED

    def handler() -> None:
        with ledger.transaction("k", "me") as db:
            db.execute("INSERT INTO effects VALUES ('x')")
            ENDINGS[ending](db)
            raise ValueError("after the commit")  # never reached: the commit is refused

    with pytest.raises(ConfigurationError) as refused:
        handler()
    assert str(refused.value) == (
        "job id 'k': ctx.transaction() commits the effect with the job's done-mark when its with block ends; "
        "the handler tried to end the transaction itself (COMMIT, ROLLBACK, BEGIN or executescript): remove that"
    )
    assert classify((), refused.value) == "permanent"  # quarantined at once, with that error as evidence
    assert effects(ledger) == []  # nothing kept: a replay after the fix runs it once
    assert asyncio.run(ledger.claim("k", "other", 60.0)) is Claim.BUSY  # not done: the run's claim, released next
    asyncio.run(ledger.release("k", "me"))
    assert asyncio.run(ledger.claim("k", "other", 60.0)) is Claim.CLAIMED


def test_a_refusal_the_handler_catches_still_fails_the_run(tmp_path: Path):
    ledger = make(tmp_path)
    assert asyncio.run(ledger.claim("k", "me", 60.0)) is Claim.CLAIMED

    def handler() -> None:
        with ledger.transaction("k", "me") as db:
            db.execute("INSERT INTO effects VALUES ('x')")
            with contextlib.suppress(sqlite3.DatabaseError):  # swallowed: the transaction still ends refused
                db.commit()

    with pytest.raises(ConfigurationError, match="tried to end the transaction itself"):
        handler()
    assert effects(ledger) == []


def test_savepoints_inside_are_the_handlers_and_commit_with_the_mark(tmp_path: Path):
    ledger = make(tmp_path)
    assert asyncio.run(ledger.claim("k", "me", 60.0)) is Claim.CLAIMED
    with ledger.transaction("k", "me") as db:
        db.execute("SAVEPOINT part")
        db.execute("INSERT INTO effects VALUES ('undone')")
        db.execute("ROLLBACK TO part")
        db.execute("RELEASE part")
        db.execute("INSERT INTO effects VALUES ('kept')")
    assert effects(ledger) == ["kept"]
    assert asyncio.run(ledger.claim("k", "other", 60.0)) is Claim.DONE


def test_the_connection_takes_commits_again_after_the_block(tmp_path: Path):
    ledger = make(tmp_path)
    assert asyncio.run(ledger.claim("k", "me", 60.0)) is Claim.CLAIMED

    def handler() -> None:
        with ledger.transaction("k", "me") as db:
            db.commit()

    with pytest.raises(ConfigurationError):
        handler()
    db = ledger._connect()  # the thread's connection, used again by the next run
    db.execute("BEGIN")
    db.execute("INSERT INTO effects VALUES ('later')")
    db.execute("COMMIT")
    assert effects(ledger) == ["later"]


def test_a_handler_that_closes_the_connection_fails_permanently_and_the_next_run_gets_a_new_one(tmp_path: Path):
    """The thread's connection was kept closed: every later idempotent job of that worker failed (a retest)."""
    ledger = make(tmp_path)
    assert asyncio.run(ledger.claim("k", "me", 60.0)) is Claim.CLAIMED

    def closer() -> None:
        with ledger.transaction("k", "me") as db:
            db.execute("INSERT INTO effects VALUES ('x')")
            db.close()

    with pytest.raises(ConfigurationError, match=r"tried to end the transaction itself \(close\(\)\)"):
        closer()
    assert effects(ledger) == []
    assert asyncio.run(ledger.claim("k2", "me", 60.0)) is Claim.CLAIMED
    with ledger.transaction("k2", "me") as db:  # the same thread: a new connection
        db.execute("INSERT INTO effects VALUES ('next')")
    assert effects(ledger) == ["next"]


@pytest.mark.parametrize("store", ["ledger", "results"])
@pytest.mark.parametrize("path", [":memory:", ""])
def test_an_in_memory_sqlite_store_is_refused(path: str, store: str):
    """Each connection (thread, process) would have a database of its own: 'no such table' at every job."""
    from amqpjobs import SqliteResults

    kind = SqliteLedger if store == "ledger" else SqliteResults
    with pytest.raises(ConfigurationError) as refused:
        kind(path)
    assert str(refused.value) == (
        f"{kind.__name__}({path!r}): an in-memory or temporary SQLite database is one connection's own, and the "
        "worker's threads and processes each open their own; give the path of a file"
    )


class _FsPath:
    """An ``os.PathLike`` giving what it was made with."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __fspath__(self) -> Any:
        return self.value


@pytest.mark.parametrize("store", ["ledger", "results"])
@pytest.mark.parametrize(
    ("path", "said"),
    [(5, "(path): a file path is a str or pathlib.Path, got int"),
     (None, "(path): a file path is a str or pathlib.Path, got NoneType"),
     ("a\x00b.db", "('a\\x00b.db'): a file path can't hold a NUL character"),
     (_FsPath(b"x.db"), "(path): a file path is a str or pathlib.Path, got _FsPath giving bytes"),
     (_FsPath(5), "(path): a file path is a str or pathlib.Path, got _FsPath"),
     ("x\ud800.db", "('x\\ud800.db'): the file system can't encode this path (surrogates not allowed)")],
)  # fmt: skip
def test_what_is_no_file_path_is_refused_with_the_store_named(path: Any, said: str, store: str):
    """A retest: a plain TypeError / ValueError from deep inside said nothing of which store was given what."""
    from amqpjobs import SqliteResults

    kind = SqliteLedger if store == "ledger" else SqliteResults
    with pytest.raises(ConfigurationError) as refused:
        kind(path)
    assert str(refused.value) == kind.__name__ + said


def test_a_relative_path_is_made_absolute_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    ledger = SqliteLedger("rel.db")
    assert ledger.path == tmp_path / "rel.db"
