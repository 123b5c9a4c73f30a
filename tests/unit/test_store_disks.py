"""A SQLite store on a disk that is full or read-only: the words name the operation that failed, the path, the fix.

Each case runs on a small file system of its own (a tmpfs, mounted by root; skipped otherwise),
as root's permissions never bite: a full one (every byte taken by a filler file) and one
remounted read-only after the store was written.

Before, a worker's batch of records meeting a full disk was logged as ``results store: 200
record(s) not written (ResultsUnavailableError: can't read the SQLite results store at ...:
disk I/O error)``: a write said as a read, and no word of what to do.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from amqpjobs.errors import LedgerUnavailableError, ResultsUnavailableError
from amqpjobs.jobs.results import StateRecord
from amqpjobs.runtime.ledger import SqliteLedger
from amqpjobs.runtime.results import SqliteResults
from amqpjobs.runtime.results_writer import ResultsWriter


def _mount(where: Path, *options: str) -> None:
    subprocess.run(["mount", *options, str(where)], check=True, capture_output=True, timeout=10)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs of its own (root only: skipped where mount is refused)."""
    where = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    where.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small file system needs root")
    try:
        _mount(where, "-t", "tmpfs", "-o", "size=1m", "tmpfs")
    except (subprocess.CalledProcessError, OSError) as exc:
        pytest.skip(f"can't mount a tmpfs here: {exc}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False, capture_output=True, timeout=10)


def fill(disk: Path) -> None:
    """Take every free byte of ``disk``."""
    with open(disk / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"x" * 4096)
        except OSError:
            pass


def records(n: int) -> list[StateRecord]:
    return [StateRecord(f"id{i}", "send", "succeeded", 1, time.time(), "", "", "q", 0.0, None, "") for i in range(n)]


async def test_a_full_disk_fails_a_results_write_in_words_of_a_write(small_disk: Path) -> None:
    store = SqliteResults(small_disk / "results.db")
    fill(small_disk)
    with pytest.raises(ResultsUnavailableError) as caught:
        await store.write(records(200))
    text = str(caught.value)
    assert text.startswith(f"can't write records to the SQLite results store at {small_disk / 'results.db'}: ")
    assert "can't read" not in text
    assert "free space" in text  # what to do


async def test_the_writer_warning_on_a_full_disk_says_write_path_and_fix(
    small_disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = SqliteResults(small_disk / "results.db")
    fill(small_disk)
    writer = ResultsWriter(store)
    writer.start()
    for r in records(20):
        writer.note(r)
    with caplog.at_level(logging.WARNING, "amqpjobs.results"):
        await writer.close()
    said = [r.getMessage() for r in caplog.records if "not written" in r.getMessage()]
    assert said, caplog.text
    assert f"can't write records to the SQLite results store at {small_disk / 'results.db'}" in said[-1]
    assert "free space" in said[-1]
    assert writer.failed == 20


async def test_a_full_disk_fails_a_ledger_claim_in_words_of_a_write(small_disk: Path) -> None:
    ledger = SqliteLedger(small_disk / "ledger.db")
    fill(small_disk)

    def claim_in_another_thread() -> None:  # a new thread opens a new connection, as a worker's threads do
        asyncio.run(ledger.claim("k", "w", 30))

    with pytest.raises(LedgerUnavailableError) as caught:
        await asyncio.to_thread(claim_in_another_thread)
    text = str(caught.value)
    assert text.startswith(f"can't claim a job in the SQLite ledger at {small_disk / 'ledger.db'}: "), text
    assert "free space" in text
    await ledger.close()
