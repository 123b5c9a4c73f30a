"""A SQLite ledger file deleted or moved away under a running worker: the done-markers are not forgotten.

Before, the next connection to the ledger (a thread that had none yet) created the file
again, empty, and a redelivery of a job already done ran its effect a second time. Now the
claim fails as a ledger outage: the delivery waits in a retry tier (outcome ``deferred``,
no attempt used, the error naming the file), and runs nothing until the file is back.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from amqpjobs import App, JobContext
from amqpjobs.runtime.ledger import SqliteLedger
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.worker_env import Recorder, make_app, running_worker

pytestmark = [pytest.mark.broker, pytest.mark.timeout(90)]


async def ledger_app(broker: BrokerSettings, tmp_path: Path, runs: list[str]) -> tuple[App, Path]:
    base = await make_app(broker, tmp_path)
    path = tmp_path / "ledger.db"
    app = App("idem", topology=base.topology(), url=broker.url, ledger=SqliteLedger(path))

    @app.job("charge", queue="work", idempotent=True, lease=60)
    def charge(payload: dict[str, Any], ctx: JobContext) -> None:
        runs.append(ctx.job_id)

    return app, path


def deferred(rec: Recorder) -> list[str]:
    return [o.error for o in rec.outcomes if o.kind == "deferred"]


def remove(path: Path) -> None:
    """``rm ledger.db*``: the file and its -wal and -shm files."""
    for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        p.unlink(missing_ok=True)


@pytest.mark.parametrize("then", ["nothing", "a worker process starts"])
async def test_a_deleted_ledger_file_does_not_run_a_done_job_again(
    broker: BrokerSettings, tmp_path: Path, then: str
) -> None:
    """Three deliveries of a done job at once after ``rm ledger.db*``: claims on threads with and without a
    connection of their own. Before: a thread without one created the file again, empty (``no such table``,
    or, once another worker process had started on the host and made its tables, a claim: the job ran again);
    a thread with one went on with the deleted file."""
    runs: list[str] = []
    app, path = await ledger_app(broker, tmp_path, runs)
    async with running_worker(app, broker, concurrency=4) as (_, rec):
        await app.enqueue("charge", {"n": 1}, job_id="pay-1")
        await rec.wait_for(lambda o: [x.kind for x in o] == ["succeeded"])
        remove(path)
        writer = None
        if then == "a worker process starts":  # its first open makes a new ledger there (as any first open may)
            SqliteLedger(path)
            writer = sqlite3.connect(path, isolation_level=None)  # and it writes a while: claims wait on threads
            writer.execute("BEGIN IMMEDIATE")
        for _ in range(3):  # the same job again (redeliveries, replays)
            await app.enqueue("charge", {"n": 1}, job_id="pay-1")
        if writer is not None:
            await asyncio.sleep(1.5)
            writer.execute("COMMIT")
            writer.close()
        await rec.wait_for(lambda o: len(o) >= 4, timeout=40)
    await app.close()
    assert runs == ["pay-1"]  # before, with a worker process started since: ["pay-1", "pay-1"]
    assert [o.kind for o in rec.outcomes[1:4]] == ["deferred"] * 3  # before: duplicate, deferred (no such table)
    assert {o.attempt for o in rec.outcomes} == {1}  # no attempt used
    how = "is gone" if then == "nothing" else "is another file"
    for error in deferred(rec):
        assert error.startswith(f"amqpjobs.errors.LedgerUnavailableError: the SQLite ledger at {path} {how}"), error
    assert path.exists() == (then != "nothing")  # never created again by the running worker


async def test_a_ledger_file_moved_away_and_back_answers_done(broker: BrokerSettings, tmp_path: Path) -> None:
    runs: list[str] = []
    app, path = await ledger_app(broker, tmp_path, runs)
    aside = tmp_path / "moved.db"
    async with running_worker(app, broker, concurrency=4) as (_, rec):
        await app.enqueue("charge", {"n": 1}, job_id="pay-2")
        await rec.wait_for(lambda o: [x.kind for x in o] == ["succeeded"])
        os.rename(path, aside)
        await app.enqueue("charge", {"n": 1}, job_id="pay-2")
        await rec.wait_for(lambda o: bool(deferred(rec)), timeout=40)
        assert not path.exists()
        os.rename(aside, path)  # the operator moves it back: the waiting job finds its done-mark
        started = time.monotonic()
        await rec.wait_for(lambda o: o[-1].kind == "duplicate", timeout=30)
    await app.close()
    assert runs == ["pay-2"]
    assert time.monotonic() - started < 30
    assert "is gone" in deferred(rec)[0]
