"""A reading command's results store (``job show``) while another process holds the SQLite file locked.

Before: the read-only open waited out its 5 s busy timeout, then fell back to ``immutable=1``
(meant for a read-only mount), which reads the main file without its write-ahead log: a job
whose records were still in the log read ``unknown`` (exit 0), a guess. Now a lock held past
the busy timeout is :class:`ResultsUnavailableError` ("try again"; ``job show`` exit 3).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest

from amqpjobs import SqliteResults, StateRecord
from amqpjobs.errors import ResultsUnavailableError
from amqpjobs.runtime.results import read_status
from amqpjobs.runtime.sqlite_open import reading_only

pytestmark = pytest.mark.version_independent

#: Another process: keeps the file open (its WAL stays), writes a record, then locks the file for good.
HOLDER = """
import asyncio, sqlite3, sys, time
from amqpjobs import SqliteResults, StateRecord
path = sys.argv[1]
holder = sqlite3.connect(path, isolation_level=None)
holder.execute("SELECT count(*) FROM amqpjobs_results").fetchone()
asyncio.run(SqliteResults(path).write([StateRecord("fresh-1", "mail", "succeeded", 1, time.time(), value='"ok"')]))
holder.execute("PRAGMA locking_mode=EXCLUSIVE")
holder.execute("BEGIN IMMEDIATE")
holder.execute("DELETE FROM amqpjobs_results WHERE 0")
holder.execute("COMMIT")
print("locked", flush=True)
time.sleep(60)
"""


def test_a_store_locked_by_another_writer_is_unavailable_never_read_without_its_log(tmp_path: Path) -> None:
    path = tmp_path / "results.db"
    asyncio.run(SqliteResults(path).write([StateRecord("old-1", "mail", "queued", 0, time.time())]))
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "locked"
        assert Path(f"{path}-wal").stat().st_size > 0  # the record is in the log, not yet in the main file
        started = time.monotonic()
        with pytest.raises(ResultsUnavailableError, match=r"database is locked \(SQLITE_BUSY\).*try again"):
            state_read(path, "fresh-1")
        assert time.monotonic() - started < 12  # the busy timeout (5 s), once
    finally:
        holder.kill()
        holder.communicate()
    assert state_read(path, "fresh-1") == "succeeded"  # the lock gone: read in full


def state_read(path: Path, job_id: str) -> str:
    """``job_id``'s state as ``job show`` reads it: the store built in a reading command, then read."""
    with reading_only():
        store = SqliteResults(path)
    return asyncio.run(read_status(store, job_id)).state
