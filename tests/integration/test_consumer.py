"""The worker's consumers against the real broker: prefetch per slot, and a consumer the broker cancels."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aio_pika
import pytest

from amqpjobs.jobs.registry import JobContext
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.wire.connection import connect
from amqpjobs.wire.consume import WorkQueueConsumer
from amqpjobs.wire.delivery import Delivery
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import depth, drain, raw_channel
from tests.integration.worker_env import make_app, running_worker

pytestmark = pytest.mark.broker


async def test_n_slots_hold_exactly_n_unacked_deliveries(broker: BrokerSettings, tmp_path: Path):
    app = await make_app(broker, tmp_path)
    running: set[int] = set()
    most = 0
    release = asyncio.Event()

    @app.job("hold", queue="work")
    async def hold(payload: dict[str, int], ctx: JobContext) -> None:
        nonlocal most
        running.add(payload["i"])
        most = max(most, len(running))
        await release.wait()
        running.discard(payload["i"])

    async with running_worker(app, broker, concurrency=3) as (_, rec):
        for i in range(10):
            await app.enqueue("hold", {"i": i})
        deadline = time.monotonic() + 10
        while len(running) < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # time for a fourth delivery, if the broker were to send one
        assert len(running) == 3
        assert await depth(broker, "work") == 7  # the broker holds back the rest: prefetch 3, not more
        release.set()
        await rec.wait_for(lambda o: len(o) == 10)
    await app.close()
    assert most == 3
    assert [o.kind for o in rec.outcomes] == ["succeeded"] * 10


async def test_a_consumer_the_broker_cancels_consumes_again_once_the_queue_is_back(
    broker: BrokerSettings, tmp_path: Path
):
    app = await make_app(broker, tmp_path)
    done: list[int] = []

    @app.job("note", queue="work")
    async def note(payload: dict[str, int], ctx: JobContext) -> None:
        done.append(payload["i"])

    async with running_worker(app, broker, concurrency=2) as (worker, rec):
        assert worker.readiness()[0]
        async with raw_channel(broker) as ch:
            await ch.queue_delete("work")  # the broker sends basic.cancel to its consumers
        deadline = time.monotonic() + 10
        while worker.readiness()[0] and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        ready, reason = worker.readiness()
        assert not ready
        assert "not consuming" in reason
        await apply_topology(tmp_path / "applied.toml", broker)  # the queue is back (empty)
        deadline = time.monotonic() + 15
        while not worker.readiness()[0] and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert worker.readiness()[0], worker.readiness()[1]
        for i in range(5):
            await app.enqueue("note", {"i": i})
        await rec.wait_for(lambda o: len(o) == 5, timeout=15)
    await app.close()
    assert sorted(done) == [0, 1, 2, 3, 4]


async def test_the_broker_takes_batched_acks_around_rejected_deliveries(broker: BrokerSettings, tmp_path: Path):
    """One multiple ack covering a rejected delivery, and one stopping before it: no channel error, all settled."""
    await make_app(broker, tmp_path)
    async with raw_channel(broker) as ch:
        for i in range(6):
            await ch.default_exchange.publish(aio_pika.Message(str(i).encode(), message_id=f"m-{i}"), "work")
    connection = await connect(broker)
    got: list[Delivery] = []
    arrived = asyncio.Event()

    async def hold(delivery: Delivery) -> None:
        got.append(delivery)
        if len(got) == 6:
            arrived.set()

    consumer = WorkQueueConsumer(connection, "work", 6, hold)
    try:
        await consumer.start()
        await asyncio.wait_for(arrived.wait(), 10)
        d = {x.message_id: x for x in got}
        await d["m-0"].ack()
        await d["m-1"].reject()  # a run of settled tags: 0 acked, 1 rejected, 2 acked -> one ack(2, multiple)
        await d["m-2"].ack()
        await asyncio.sleep(0.2)
        await d["m-3"].ack()
        await d["m-4"].reject()  # the run ends on a reject: the multiple ack must name tag 3, not 4
        await asyncio.sleep(0.2)
        await d["m-5"].ack()
        await consumer.flush_acks()
        await asyncio.sleep(0.5)
        assert consumer.consuming  # no PRECONDITION_FAILED closed the channel
    finally:
        await consumer.close()
        await connection.close()
    assert await depth(broker, "work") == 0  # nothing requeued by the close: every delivery was settled
    dead = await drain(broker, "work.quarantine")
    assert sorted(m.message_id or "" for m in dead) == ["m-1", "m-4"]
