"""A job hung inside a SQLite ``ctx.transaction()`` holds the ledger file's write lock: what the others get.

Every other idempotent job's claim needs that lock. Before, each claim waited in its slot for
the connection's 30 s busy timeout, then went to a retry tier with ``OperationalError:
database is locked`` and one ERROR line per job, naming no cause. Now a claim waits as for a
ledger outage (README "Idempotency": up to 10 s in its slot), then is ``deferred`` (no attempt
used) with an error naming the file, the lock and its likely holder.
"""

from __future__ import annotations

import asyncio
import logging
import re
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from amqpjobs import App, JobContext
from amqpjobs.runtime.ledger import LEDGER_PATIENCE, SqliteLedger
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.worker_env import make_app, running_worker

pytestmark = [pytest.mark.broker, pytest.mark.timeout(120)]


async def test_a_claim_behind_a_hung_transaction_is_deferred_within_the_patience_naming_the_lock(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    base = await make_app(broker, tmp_path)
    path = tmp_path / "ledger.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE effects (job_id TEXT NOT NULL)")
    app = App("locks", topology=base.topology(), url=broker.url, ledger=SqliteLedger(path))
    inside, release = threading.Event(), threading.Event()
    ran: list[str] = []

    @app.job("hang", queue="work", idempotent=True, timeout=100)
    def hang(payload: dict[str, Any], ctx: JobContext) -> None:
        with ctx.transaction() as db:
            db.execute("INSERT INTO effects (job_id) VALUES (?)", (ctx.job_id,))
            inside.set()
            release.wait(60)  # hung: the write lock is held meanwhile

    @app.job("other", queue="work", idempotent=True)
    def other(payload: dict[str, Any], ctx: JobContext) -> None:
        ran.append(ctx.job_id)

    caplog.set_level(logging.INFO, "amqpjobs")
    try:
        async with running_worker(app, broker, concurrency=4) as (_, rec):
            await app.enqueue("hang", {}, job_id="hung-1")
            assert await asyncio.to_thread(inside.wait, 10)
            sent = time.monotonic()
            await app.enqueue("other", {}, job_id="other-1")
            await rec.wait_for(lambda o: any(x.job_id == "other-1" for x in o), timeout=60)
            took = time.monotonic() - sent
            release.set()
            await rec.wait_for(lambda o: "other-1" in ran and any(x.job_id == "hung-1" for x in o), timeout=60)
    finally:
        release.set()
        await app.close()
    first = next(o for o in rec.outcomes if o.job_id == "other-1")
    assert first.kind == "deferred"
    assert first.attempt == 1
    assert took < LEDGER_PATIENCE + 3, took  # before: 30.0 s (the busy timeout), the slot held all along
    assert first.error.startswith(f"amqpjobs.errors.LedgerUnavailableError: the SQLite ledger at {path} is locked")
    assert "ctx.transaction()" in first.error  # before: "OperationalError: database is locked"
    assert ran == ["other-1"]  # it ran once the lock was free
    said = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "amqpjobs.stores"]
    assert len(said) == 2, said  # once when locked, once when free, not per job and pass (before: an ERROR per pass)
    assert said[0][0] == "WARNING"
    assert "is locked" in said[0][1]
    assert said[1][0] == "INFO"
    assert re.fullmatch(rf"the SQLite ledger at {re.escape(str(path))} answers again after 1\d\.\ds", said[1][1])
