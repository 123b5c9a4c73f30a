"""A delivery that waited to start while its channel closed is not started: the broker has it back.

When a channel closes, the broker requeues every delivery it held unacked (marked
redelivered) and hands it out again, here after the reconnect or to another worker. A
delivery that was still waiting for its start (here: the look-ahead delivery of a sharded
job queue waiting for the one slot) and then ran anyway would run twice, its ack refused.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

import pytest

from amqpjobs.jobs.registry import JobContext
from amqpjobs.runtime import dispatch
from amqpjobs.runtime.app import App
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.runtime.dispatch import ShardDispatcher
from amqpjobs.runtime.worker import Worker, WorkerOptions
from amqpjobs.topology.loader import load_topology
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.test_consumer import SHARDED
from tests.integration.test_reconnect import cut_off, fast_reconnect

pytestmark = pytest.mark.broker


async def test_the_look_ahead_delivery_of_a_closed_channel_is_not_started(
    broker: BrokerSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(dispatch, "LOOKAHEAD_WAIT", 10.0)  # it waits for the slot through the cut
    path = tmp_path / "s.toml"
    path.write_text(SHARDED)
    await apply_topology(path, broker)
    app = App("split", topology=load_topology(path).topology, url=broker.url)
    starts: Counter[int] = Counter()
    release = asyncio.Event()
    long_running = asyncio.Event()

    @app.job("slow", queue="split")
    async def slow(payload: dict[str, int], ctx: JobContext) -> None:
        starts[payload["i"]] += 1
        if payload["i"] == 10 and not release.is_set():
            long_running.set()
            await release.wait()
        else:
            await asyncio.sleep(0.01)  # short jobs: the worker takes one look-ahead delivery

    for i in range(10):
        await app.enqueue("slow", {"i": i}, tenant=f"t{i}")
    worker = Worker(app, fast_reconnect(broker), WorkerOptions(queues=("split",), concurrency=1, grace=10))
    running = asyncio.create_task(worker.run())
    try:
        await asyncio.wait_for(worker.ready.wait(), 10)
        (dispatcher,) = worker._consumers
        assert isinstance(dispatcher, ShardDispatcher)
        while sum(starts.values()) < 10:
            await asyncio.sleep(0.01)
        for i in range(10, 13):
            await app.enqueue("slow", {"i": i}, tenant=f"t{i}")
        await asyncio.wait_for(long_running.wait(), 10)
        deadline = time.monotonic() + 5
        while dispatcher.waiting == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert dispatcher.waiting == 1  # a delivery held, waiting for the one slot
        async with cut_off(broker, "split-worker"):
            deadline = time.monotonic() + 10
            while worker.readiness()[0] and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            release.set()  # the slot frees while the waiting delivery's channel is closed
            await asyncio.sleep(0.5)
        deadline = time.monotonic() + 20
        while set(starts) != set(range(13)) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # a second start of any of them would be here by now
    finally:
        worker.request_stop()
        code = await asyncio.wait_for(running, 20)
        await app.close()
    assert code == 0
    assert set(starts) == set(range(13)), starts
    # the long job was running at the cut: at least once, it may run again (README); no other runs twice
    assert {i: n for i, n in starts.items() if n > 1 and i != 10} == {}, starts
