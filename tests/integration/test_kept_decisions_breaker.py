"""A kept decision counts toward its job's circuit breaker once, when the next worker carries it out (real broker).

Attempt 1 fails transiently (a breaker failure, README "Circuit breaker"), but its tier queue was
deleted, so its retry copy is held until the stop's grace ends and kept in a marked copy: the stopped
worker's run never settled, so it counted nothing. The next worker carries the retry out from the
header (``decided=earlier-run``) and counts that run's failure then (before: never counted, so a
breaker of ``failures=1`` never opened and attempt 2 ran).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from amqpjobs import Breaker, JobContext, Worker, WorkerOptions
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.test_kept_decisions import delete
from tests.integration.test_stop_lines import started_worker, until
from tests.integration.worker_env import Recorder, make_app

pytestmark = pytest.mark.broker


@pytest.mark.timeout(90)
async def test_a_kept_retry_carried_out_by_the_next_worker_counts_one_breaker_failure(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    app = await make_app(broker, tmp_path)
    tier = app.topology().layout("work").tier_queues["work"][0]
    runs: list[int] = []

    @app.job("flaky", queue="work", breaker=Breaker(failures=1, window="1m", cool_down="5s"))
    async def flaky(payload: dict[str, Any], ctx: JobContext) -> None:
        runs.append(ctx.attempt)
        if ctx.attempt == 1:
            raise RuntimeError("first attempt fails")

    caplog.set_level("INFO", logger="amqpjobs.worker")
    worker = await started_worker(app, broker, ("work",), concurrency=1, grace=1)
    try:
        delete(broker, "queues", tier)
        await app.enqueue("flaky", {}, job_id="flaky-1")
        await until(lambda: worker._holding.count == 1, 10, "the retry copy's delivery to be held")
        worker.request_stop()
    finally:
        assert await worker.shutdown() == 1
    lines = [r.getMessage() for r in caplog.records if r.name == "amqpjobs.worker"]
    assert not [line for line in lines if line.startswith("breaker job=flaky open")]  # the stopped worker: none
    await apply_topology(tmp_path / "applied.toml", broker)
    caplog.clear()
    recorder = Recorder()
    later = Worker(app, broker, WorkerOptions(queues=("work",), concurrency=1, grace=1), recorder)
    await later.start()
    try:
        await recorder.wait_for(lambda outs: any(o.kind in ("deferred", "succeeded") for o in outs), 30)
    finally:
        await later.shutdown()
        await app.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "amqpjobs.worker"]
    opened = [line for line in lines if line.startswith("breaker job=flaky open")]
    assert runs == [1]  # attempt 2 waits for the breaker: its start not run
    assert [(o.kind, o.attempt, o.decided) for o in recorder.outcomes][:2] == [
        ("retried", 1, True),
        ("deferred", 2, False),
    ]
    [said] = opened  # counted once
    assert said.startswith("breaker job=flaky open: 1 failure(s) within 60s"), said
