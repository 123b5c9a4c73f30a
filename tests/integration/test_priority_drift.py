"""A job queue the topology gives ``max_priority`` that the broker holds without ``x-max-priority``.

Someone declared the queue first (or deleted and declared it again) without the argument, so
the broker ignores every job's priority: ``enqueue(priority=...)`` is confirmed, the job is
stored, and it is delivered in publish order. Before: ``status`` and a worker's start said the
queue "differs from the topology" and then spoke only of dead-letters ("what the broker
dead-letters, expires or pushes out of it may not reach its quarantine"), nothing of the
priorities it drops, nor that RabbitMQ can't change ``x-max-priority`` of an existing queue.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from amqpjobs import JobContext, Worker, WorkerOptions
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import applied_app, cli, depth, drain, raw_channel

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]  # classic x-max-priority: alike on every version

TOPOLOGY = """
[[exchange]]
name = "jobs"
type = "direct"

[[job_queue]]
name = "pq"
exchange = "jobs"
max_priority = 5
retry_tiers = ["1s"]
"""


async def redeclare_without_priorities(broker: BrokerSettings) -> None:
    """Declare ``pq`` again as another program would: its arguments, less ``x-max-priority``."""
    with ManagementClient(broker, timeout=5.0) as mgmt:
        (live,) = [q for q in mgmt.queues(broker.vhost) if q["name"] == "pq"]
    arguments = {k: v for k, v in (live.get("arguments") or {}).items() if k != "x-max-priority"}
    async with raw_channel(broker) as ch:
        await ch.queue_delete("pq")
        queue = await ch.declare_queue("pq", durable=True, arguments=arguments)
        await queue.bind("jobs", routing_key="pq")


@pytest.mark.timeout(60)
async def test_a_queue_without_the_topologys_max_priority_is_named_with_what_it_does(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    app = await applied_app(broker, tmp_path, TOPOLOGY, "app")

    @app.job("noop", queue="pq")
    async def noop(payload: dict[str, Any], ctx: JobContext) -> None:
        return None

    await redeclare_without_priorities(broker)
    # what the broker does: both jobs stored, the priority-5 one not first (publish order)
    await app.enqueue("noop", {}, job_id="low", priority=0)
    await app.enqueue("noop", {}, job_id="high", priority=5)
    assert await depth(broker, "pq") == 2
    assert [m.message_id for m in await drain(broker, "pq")] == ["low", "high"]

    result = await asyncio.to_thread(cli, broker, "status", str(tmp_path / "app.toml"), "--json")
    assert result.exit_code == 1
    (jq,) = json.loads(result.stdout)["job_queues"]
    (problem,) = [p for p in jq["problems"] if "differs from the topology" in p]
    assert "x-max-priority: live (none), desired 5" in problem, problem
    assert "the broker ignores the priority of every job in it" in problem, problem
    assert "RabbitMQ can't change x-max-priority of an existing queue" in problem, problem
    assert "dead-letters" not in problem, problem  # nothing of the quarantine differs

    plan = await asyncio.to_thread(cli, broker, "topology", "plan", str(tmp_path / "app.toml"))
    assert plan.exit_code == 1, plan.stdout
    assert "x-max-priority: live (none), desired 5" in plan.stdout, plan.stdout

    caplog.set_level(logging.WARNING)
    worker = Worker(app, broker, WorkerOptions(queues=("pq",), concurrency=1, grace=2))
    await worker.start()
    try:
        for _ in range(3):  # many jobs, one warning: said at the start, not per message
            await app.enqueue("noop", {}, priority=3)
        deadline = time.monotonic() + 10
        while not (warned := [r.getMessage() for r in caplog.records if "x-max-priority" in r.getMessage()]):
            assert time.monotonic() < deadline, "the worker never named the queue's missing x-max-priority"
            await asyncio.sleep(0.1)
        deadline = time.monotonic() + 10
        while await depth(broker, "pq") > 0:
            assert time.monotonic() < deadline, "the jobs were not run"
            await asyncio.sleep(0.1)
        assert len(warned) == 1, warned
        first = "queue pq differs from the topology: x-max-priority: live (none), desired 5"
        assert warned[0].startswith(first), warned
        assert "the broker ignores the priority of every job in it" in warned[0], warned
        assert "dead-letters" not in warned[0], warned
    finally:
        await worker.shutdown()
        await app.close()
