"""A SQLite ledger or results store whose file is deleted, moved away or replaced while the app runs.

Only the first open (the store's constructor) may create the file. Before, the next
connection (a new thread's, another call's) created it again, empty: the ledger forgot
every done-marker, so a redelivered idempotent job ran its effect again. Now a file that
is gone, or is another file than the one opened first, is a store error naming the path
and what to do, and nothing is created.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sqlite3
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from amqpjobs.errors import LedgerUnavailableError, ResultsUnavailableError
from amqpjobs.jobs.results import StateRecord
from amqpjobs.runtime import sqlite_open
from amqpjobs.runtime.ledger import Claim, SqliteLedger
from amqpjobs.runtime.results import SqliteResults


def remove(path: Path) -> None:
    """Delete a SQLite file and its -wal and -shm files, as ``rm ledger.db*`` does."""
    for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        p.unlink(missing_ok=True)


def in_new_thread(coro_fn: Callable[..., Coroutine[Any, Any, Any]], *args: object) -> Any:
    """Run ``coro_fn(*args)`` on a fresh event loop in a fresh thread (a thread with no cached connection)."""
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(coro_fn(*args))).result()


async def test_a_deleted_ledger_file_is_an_error_and_not_created_again(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    ledger = SqliteLedger(path)
    assert await ledger.claim("pay-1", "w1", 30) is Claim.CLAIMED
    assert await ledger.done("pay-1", "w1")
    remove(path)
    for attempt in (lambda: ledger.claim("pay-1", "w2", 30), lambda: ledger.done("pay-2", "w2")):
        with pytest.raises(LedgerUnavailableError) as caught:
            await attempt()
        text = str(caught.value)
        assert str(path) in text
        assert "gone" in text
        assert "restore" in text
    with pytest.raises(LedgerUnavailableError):  # a thread that never opened it: no new file either
        in_new_thread(ledger.claim, "pay-1", "w3", 30)
    with pytest.raises(LedgerUnavailableError), ledger.transaction("pay-3", "w3"):
        pass
    assert not path.exists()
    await ledger.close()


async def test_a_ledger_file_moved_away_is_an_error_and_moved_back_is_found_again(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    ledger = SqliteLedger(path)
    assert await ledger.claim("pay-1", "w1", 30) is Claim.CLAIMED
    assert await ledger.done("pay-1", "w1")
    await ledger.close()  # the WAL is checkpointed: the file alone holds the mark
    aside = tmp_path / "aside.db"
    os.rename(path, aside)
    with pytest.raises(LedgerUnavailableError, match="gone"):
        await ledger.claim("pay-1", "w2", 30)
    with pytest.raises(LedgerUnavailableError, match="gone"):
        in_new_thread(ledger.claim, "pay-1", "w2", 30)
    assert not path.exists()
    os.rename(aside, path)  # the same file back: its done-markers answer again
    assert await ledger.claim("pay-1", "w2", 30) is Claim.DONE
    await ledger.close()


async def test_a_ledger_file_replaced_by_another_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    ledger = SqliteLedger(path)
    assert await ledger.claim("pay-1", "w1", 30) is Claim.CLAIMED
    assert await ledger.done("pay-1", "w1")
    other = tmp_path / "other.db"
    SqliteLedger(other)  # an empty ledger, then put in its place
    remove(path)
    shutil.copyfile(other, path)
    with pytest.raises(LedgerUnavailableError, match="another file"):
        await ledger.claim("pay-1", "w2", 30)
    with pytest.raises(LedgerUnavailableError, match="another file"):
        in_new_thread(ledger.claim, "pay-1", "w2", 30)
    await ledger.close()


async def test_the_first_open_still_creates_the_file(tmp_path: Path) -> None:
    path = tmp_path / "new" / "ledger.db"
    path.parent.mkdir()
    ledger = SqliteLedger(path)
    assert path.exists()
    assert in_new_thread(ledger.claim, "a", "w", 30) is Claim.CLAIMED
    assert await ledger.claim("a", "w", 30) is Claim.CLAIMED  # our own claim again
    await ledger.close()
    results = SqliteResults(tmp_path / "results.db")
    assert (tmp_path / "results.db").exists()
    await results.close()


def record(job_id: str) -> StateRecord:
    return StateRecord(job_id, "mail", "succeeded", 1, 1.0e9)


@pytest.mark.parametrize("how", ["deleted", "moved", "replaced"])
async def test_a_results_file_lost_is_an_error_and_not_created_again(tmp_path: Path, how: str) -> None:
    path = tmp_path / "results.db"
    results = SqliteResults(path)
    assert not await results.write([record("m-1")])
    assert [r.job_id for r in await results.history("m-1")] == ["m-1"]
    if how == "moved":
        os.rename(path, tmp_path / "aside.db")
    else:
        remove(path)
    if how == "replaced":
        with sqlite3.connect(path) as db:
            db.execute("CREATE TABLE t (x)")
    word = "another file" if how == "replaced" else "gone"
    with pytest.raises(ResultsUnavailableError, match=word) as caught:
        await results.write([record("m-2")])
    assert str(path) in str(caught.value)
    with pytest.raises(ResultsUnavailableError, match=word):
        await results.history("m-1")
    with pytest.raises(ResultsUnavailableError, match=word):
        await results.prune(0)
    with pytest.raises(ResultsUnavailableError, match=word):
        results.copy()  # another event loop's store on the same file: never a new file either
    assert path.exists() == (how == "replaced")


async def test_after_no_new_files_a_first_open_finds_the_file_or_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A --processes child: the supervisor opened the stores first, so a missing file is gone, not new."""
    made = tmp_path / "ledger.db"
    SqliteLedger(made)  # the supervisor's open
    monkeypatch.setattr(sqlite_open, "_creates", True)  # restored after the test
    sqlite_open.no_new_files()
    ledger = SqliteLedger(made)  # the child's: the file as it is
    assert await ledger.claim("a", "w", 30) is Claim.CLAIMED
    await ledger.close()
    missing = tmp_path / "gone.db"
    with pytest.raises(LedgerUnavailableError, match=r"is gone .* since the supervisor of this worker process"):
        SqliteLedger(missing)
    with pytest.raises(ResultsUnavailableError, match="is gone"):
        SqliteResults(tmp_path / "results.db")
    assert not missing.exists()
    assert not (tmp_path / "results.db").exists()
