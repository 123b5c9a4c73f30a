"""A job queue deleted and declared again by someone else, with other arguments, while the topology stays.

``topology plan`` shows it as a CONFLICT, but nothing else looked: on 3.10 a ``mail`` work queue
re-created without ``x-dead-letter-exchange`` and with ``x-max-length: 2`` left ``status``
reporting only "no consumer on mail", and a worker consumed from it without a word, while
the broker dropped every job pushed out past the limit (nowhere to dead-letter them).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Any

import aio_pika
import pytest

from amqpjobs import JobContext, Worker, WorkerOptions
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import applied_app, cli, depth, raw_channel

pytestmark = pytest.mark.broker

TOPOLOGY = """
[[exchange]]
name = "jobs"
type = "direct"

[[job_queue]]
name = "work"
exchange = "jobs"
type = "classic"
retry_tiers = ["1s"]
"""


async def redeclare_without_quarantine(broker: BrokerSettings) -> None:
    """Delete ``work`` and declare it again as another program would: no dead-letter exchange, at most 2 messages."""
    async with raw_channel(broker) as ch:
        await ch.queue_delete("work")
        queue = await ch.declare_queue("work", durable=True, arguments={"x-queue-type": "classic", "x-max-length": 2})
        await queue.bind("jobs", routing_key="work")


@pytest.mark.timeout(60)
async def test_a_work_queue_declared_again_with_other_arguments_is_a_problem(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    app = await applied_app(broker, tmp_path, TOPOLOGY, "app")

    @app.job("noop", queue="work")
    async def noop(payload: dict[str, Any], ctx: JobContext) -> None:
        return None

    await redeclare_without_quarantine(broker)
    # what the broker does with it: the oldest job past the limit is gone, not quarantined
    async with raw_channel(broker) as ch:
        for i in range(3):
            await ch.default_exchange.publish(aio_pika.Message(b"{}", message_id=f"j{i}"), routing_key="work")
    assert await depth(broker, "work") == 2
    assert await depth(broker, "work.quarantine") == 0

    result = await asyncio.to_thread(cli, broker, "status", str(tmp_path / "app.toml"), "--json")
    assert result.exit_code == 1
    (jq,) = json.loads(result.stdout)["job_queues"]
    (problem,) = [p for p in jq["problems"] if "differs from the topology" in p]
    assert problem.startswith("queue work differs from the topology: "), problem
    assert "x-dead-letter-exchange: live (none), desired 'work.quarantine'" in problem, problem
    assert "x-max-length: live 2, desired (none)" in problem, problem
    assert "amqpjobs topology plan" in problem, problem

    caplog.set_level(logging.WARNING)
    worker = Worker(app, broker, WorkerOptions(queues=("work",), concurrency=1, grace=2))
    await worker.start()
    try:
        deadline = time.monotonic() + 10  # a best-effort check beside the start
        while not (warned := [r.getMessage() for r in caplog.records if "differs from the topology" in r.getMessage()]):
            assert time.monotonic() < deadline, "the worker never warned of the redeclared queue"
            await asyncio.sleep(0.1)
        assert len(warned) == 1, warned
        assert warned[0].startswith("queue work differs from the topology: "), warned
    finally:
        await worker.shutdown()
        await app.close()
