"""The worker's consumers against the real broker: prefetch per slot, and a consumer the broker cancels."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from amqpjobs.jobs.registry import JobContext
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import depth, raw_channel
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
