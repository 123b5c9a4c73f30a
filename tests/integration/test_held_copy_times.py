"""The failure times on a copy that waited: the run's, however late the copy goes (review of helper-219).

A copy the worker can't publish yet (its quarantine exchange or retry tier queue deleted) is held, and goes
when the object is back, or, still held at the stop's grace end, is kept in a marked copy
(:mod:`amqpjobs.runtime.kept_decisions`). Its evidence says when the run failed (``amqpjobs-last-failure-at``,
and ``amqpjobs-first-failure-at`` of a first failure): before, the time the copy was finally built, seconds or
minutes later (80 s in a user's run under a connection limit).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from amqpjobs import App, JobContext, Reject
from amqpjobs.jobs.timestamps import parse_time
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import drain
from tests.integration.test_kept_decisions import delete
from tests.integration.test_stop_lines import started_worker, until
from tests.integration.worker_env import make_app

pytestmark = pytest.mark.broker

#: The copy waits this long before it goes (seconds): well past any delay of building it.
HELD = 3.0


def failing(app: App) -> list[float]:
    """Jobs 'rej' (raises Reject) and 'flaky' (fails attempt 1) on 'work'; the times their failures were raised."""
    raised: list[float] = []

    @app.job("rej", queue="work")
    async def rej(payload: dict[str, Any], ctx: JobContext) -> None:
        raised.append(time.time())
        raise Reject("no")

    @app.job("flaky", queue="work")
    async def flaky(payload: dict[str, Any], ctx: JobContext) -> None:
        if ctx.attempt == 1:
            raised.append(time.time())
            raise RuntimeError("first attempt fails")

    return raised


def at(headers: dict[str, Any], name: str) -> float:
    """Header ``name``'s time, epoch seconds."""
    when = parse_time(headers.get(name))
    assert when is not None, headers
    return when.timestamp()


@pytest.mark.parametrize(
    ("job", "deleted", "names"),
    [
        ("rej", ("exchanges", "work.quarantine"), ("amqpjobs-first-failure-at", "amqpjobs-last-failure-at")),
        ("flaky", ("queues", "work.retry.200ms"), ("amqpjobs-first-failure-at",)),
    ],
)
async def test_a_kept_copy_says_when_the_run_failed_not_when_the_stop_kept_it(
    broker: BrokerSettings, tmp_path: Path, job: str, deleted: tuple[str, str], names: tuple[str, ...]
):
    app = await make_app(broker, tmp_path)
    raised = failing(app)
    worker = await started_worker(app, broker, ("work",), concurrency=1, grace=1)
    try:
        delete(broker, *deleted)
        await app.enqueue(job, {}, job_id=f"{job}-1")
        await until(lambda: worker._holding.count == 1, 10, "the decided copy's delivery to be held")
        await asyncio.sleep(HELD)
        worker.request_stop()
    finally:
        assert await worker.shutdown() == 1
    await app.close()
    (kept,) = await drain(broker, "work")
    assert kept.headers.get("amqpjobs-decided") is not None
    late = [at(kept.headers, name) - raised[0] for name in names]
    assert all(-0.01 < took < 0.5 for took in late), (late, kept.headers)  # ms in the header; before: 4.0 s late


async def test_a_held_quarantine_copy_says_when_the_run_failed_not_when_its_exchange_came_back(
    broker: BrokerSettings, tmp_path: Path
):
    app = await make_app(broker, tmp_path)
    raised = failing(app)
    worker = await started_worker(app, broker, ("work",), concurrency=1, grace=1)
    try:
        delete(broker, "exchanges", "work.quarantine")
        await app.enqueue("rej", {}, job_id="rej-1")
        await until(lambda: worker._holding.count == 1, 10, "the quarantine copy's delivery to be held")
        await asyncio.sleep(HELD)
        await apply_topology(tmp_path / "applied.toml", broker)
        await until(lambda: worker._holding.count == 0, 15, "the held copy to go (looked for every 5 s)")
    finally:
        await worker.shutdown()
    await app.close()
    (copy,) = await drain(broker, "work.quarantine")
    took = at(copy.headers, "amqpjobs-last-failure-at") - raised[0]
    assert -0.01 < took < 0.5, (took, copy.headers)  # before: 5.0 s late
    assert at(copy.headers, "amqpjobs-first-failure-at") == at(copy.headers, "amqpjobs-last-failure-at")
