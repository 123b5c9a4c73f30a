"""A sharded job queue's lease that the broker cancels: its shard's work queue deleted while it is leased.

The lease's slots must come back to the worker (``LeaseKeeping._lost``): else the other
shards run with fewer slots than ``--concurrency``, for good.
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from amqpjobs.jobs.registry import JobContext
from amqpjobs.runtime.app import App
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.runtime.dispatch import ShardDispatcher
from amqpjobs.runtime.worker import Worker, WorkerOptions
from amqpjobs.topology.loader import load_topology
from amqpjobs.wire.lane import Lane
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import raw_channel
from tests.integration.test_consumer import SHARDED
from tests.integration.worker_env import Recorder

pytestmark = pytest.mark.broker


def tenant_of(shard: int) -> str:
    """A tenant whose jobs go to ``shard`` of the two (crc32 of the tenant, modulo 2)."""
    return next(t for t in (f"t{i}" for i in range(100)) if zlib.crc32(t.encode()) % 2 == shard)


async def consumers_on(broker: BrokerSettings, queue: str) -> int:
    async with raw_channel(broker) as channel:
        declared = await channel.declare_queue(queue, passive=True)
        return declared.declaration_result.consumer_count or 0


async def until(predicate: object, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not predicate() and time.monotonic() < deadline:  # type: ignore[operator]
        await asyncio.sleep(0.02)


async def sharded_app(broker: BrokerSettings, tmp_path: Path) -> App:
    """An App on job queue ``split`` (2 shards), its topology applied on ``broker``."""
    path = tmp_path / "s.toml"
    path.write_text(SHARDED)
    await apply_topology(path, broker)
    return App("split", topology=load_topology(path).topology, url=broker.url)


async def test_a_lease_the_broker_cancels_gives_its_slots_back(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    app = await sharded_app(broker, tmp_path)
    release = asyncio.Event()
    running: list[int] = []
    most_late = 0
    late_done: list[int] = []

    @app.job("slow", queue="split")
    async def slow(payload: dict[str, int], ctx: JobContext) -> None:
        nonlocal most_late
        running.append(payload["i"])
        try:
            if payload["late"]:
                most_late = max(most_late, len([i for i in running if i >= 100]))
                await asyncio.sleep(0.3)
                late_done.append(payload["i"])
            else:
                await release.wait()
        finally:
            running.remove(payload["i"])

    gone, kept = tenant_of(1), tenant_of(0)
    for i in range(20):
        await app.enqueue("slow", {"i": i, "late": 0}, tenant=gone)
    worker = Worker(app, broker, WorkerOptions(queues=("split",), concurrency=4, grace=10))
    task = asyncio.create_task(worker.run())
    with caplog.at_level(logging.WARNING, logger="amqpjobs.worker"):
        await asyncio.wait_for(worker.ready.wait(), 10)
        await until(lambda: len(running) == 4, 10)
        assert len(running) == 4  # the four slots hold jobs of shard 1
        assert await consumers_on(broker, "split.shard-1") == 1  # a lease among them
        async with raw_channel(broker) as channel:
            await channel.queue_delete("split.shard-1")  # the broker cancels the lease
        await until(lambda: "the broker cancelled the lease" in caplog.text, 10)
        release.set()  # the four finish; their queue is gone
        await until(lambda: not running, 10)
        for i in range(100, 112):
            await app.enqueue("slow", {"i": i, "late": 1}, tenant=kept)
        await until(lambda: len(late_done) == 12, 20)
        worker.request_stop()
        code = await asyncio.wait_for(task, 20)
    await app.close()
    assert code == 0
    assert "the broker cancelled the lease on split.shard-1 (queue deleted or moved" in caplog.text
    # the deleted shard's takes fail every second: one line, with the fix, then at most one a minute
    takes = [r.getMessage() for r in caplog.records if r.getMessage().startswith("taking from split.shard-1")]
    assert len(takes) == 1, takes
    assert "apply the topology (amqpjobs topology apply); trying again every 1s; repeated at most every 1m" in takes[0]
    assert sorted(late_done) == list(range(100, 112))
    assert most_late == 4  # the cancelled lease's slots came back: shard 0 runs four at once


async def test_a_backlog_runs_on_the_one_free_slot_while_the_others_hold_long_jobs(
    broker: BrokerSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Three of four slots run long jobs of shard 0; shard 1's backlog must run on the fourth.

    Shard 1's lease share is 3 tokens and only 1 was free: the dispatcher kept that token
    for the lease (no take by turns) until the long jobs ended, and the free slot idled
    with 20 jobs waiting (none of them ran in 10 s).
    """
    app = await sharded_app(broker, tmp_path)
    release = asyncio.Event()
    starts: Counter[int] = Counter()

    @app.job("slow", queue="split")
    async def slow(payload: dict[str, int], ctx: JobContext) -> None:
        starts[payload["i"]] += 1
        if payload["i"] < 100:
            await release.wait()
        else:
            await asyncio.sleep(0.05)

    for i in range(3):
        await app.enqueue("slow", {"i": i}, tenant=tenant_of(0))
    leases: Counter[str] = Counter()
    real_lease = Lane.lease

    async def counted(lane: Lane, queue: str, *args: Any, **options: Any) -> str:
        leases[queue] += 1
        return await real_lease(lane, queue, *args, **options)

    monkeypatch.setattr(Lane, "lease", counted)
    worker = Worker(app, broker, WorkerOptions(queues=("split",), concurrency=4, grace=10))
    task = asyncio.create_task(worker.run())
    try:
        await asyncio.wait_for(worker.ready.wait(), 10)
        await until(lambda: len(starts) == 3, 10)
        began = time.monotonic()
        for i in range(100, 120):
            await app.enqueue("slow", {"i": i}, tenant=tenant_of(1))
        await until(lambda: len(starts) == 23, 10)
        took = time.monotonic() - began
        assert len(starts) == 23, sorted(starts)  # 20 jobs of 0.05 s on one slot: about 1 s
        assert took < 8, took  # was: none ran in 10 s; 8, not 5: a slot's round trips under CI load
        await asyncio.sleep(1.0)  # the long jobs still run: shard 1's lease of one must not be cancelled and
        # armed again and again for the share it can't have yet (a lease grows only into tokens free now)
        assert leases["split.shard-1"] <= 3, leases
    finally:
        release.set()
        worker.request_stop()
        code = await asyncio.wait_for(task, 20)
        await app.close()
    assert code == 0
    assert set(starts.values()) == {1}


async def test_a_lease_that_meets_a_deleted_shard_leaves_the_other_shards_jobs_alone(
    broker: BrokerSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The shard's queue deleted between the lease's look (``Lane.exists``) and its ``basic.consume``.

    The consume's 404 closes the channel it is sent on. When every lease shared one channel,
    the jobs of the other shard leased there and still running lost their channel: their
    acks were refused and the broker ran them again (review 17: 17 of 1,800 ran twice
    over 500 deletes). Here the race is made certain: the look deletes the queue itself.
    """
    app = await sharded_app(broker, tmp_path)
    release = asyncio.Event()
    starts: Counter[int] = Counter()
    kept_shard, gone_shard = tenant_of(0), tenant_of(1)

    @app.job("slow", queue="split")
    async def slow(payload: dict[str, int], ctx: JobContext) -> None:
        starts[payload["i"]] += 1
        if payload["i"] < 100:
            await release.wait()
        else:
            await asyncio.sleep(0.2)

    for i in range(3):  # three of the four slots: one token stays free for shard 1
        await app.enqueue("slow", {"i": i}, tenant=kept_shard)
    worker = Worker(app, broker, WorkerOptions(queues=("split",), concurrency=4, grace=10))
    real_exists = Lane.exists
    deleted: list[str] = []

    async def exists_then_deleted(lane: Lane, queue: str) -> bool:
        found = await real_exists(lane, queue)
        if queue == "split.shard-1" and found and not deleted:
            async with raw_channel(broker) as channel:
                await channel.queue_delete(queue)
            deleted.append(queue)
        return found

    monkeypatch.setattr(Lane, "exists", exists_then_deleted)
    task = asyncio.create_task(worker.run())
    await asyncio.wait_for(worker.ready.wait(), 10)
    await until(lambda: len(starts) == 3, 10)
    (dispatcher,) = worker._consumers
    assert isinstance(dispatcher, ShardDispatcher)
    # shard 0's running jobs hold deliveries of its lane's channel: by its lease, or by turns when the
    # turns took all three before the lease was armed (CI once, on 4.0); that channel must stay open
    lane = dispatcher._lanes[0]
    reopened: list[str] = []
    told = lane.on_reopen

    def noted() -> None:
        reopened.append("shard 0's channel reopened")
        told()

    lane.on_reopen = noted
    for i in range(100, 120):  # a backlog on shard 1: a take there leases it
        await app.enqueue("slow", {"i": i}, tenant=gone_shard)
    await until(lambda: bool(deleted), 10)
    assert deleted == ["split.shard-1"]
    await asyncio.sleep(0.5)  # the consume on the deleted queue is answered (404) by now
    release.set()
    await until(lambda: set(range(3)) <= set(starts), 20)
    await asyncio.sleep(1.0)  # a second start of any of them would be here by now
    worker.request_stop()
    code = await asyncio.wait_for(task, 20)
    await app.close()
    assert code == 0
    assert deleted == ["split.shard-1"]
    assert {i: n for i, n in starts.items() if i < 100} == {i: 1 for i in range(3)}
    assert reopened == []  # the 404 closed only shard 1's channel


async def test_a_look_ahead_handed_back_is_not_replaced_while_every_slot_runs_a_long_job(
    broker: BrokerSettings, tmp_path: Path
):
    """Review 17b: the look-ahead token, once a lease's, stayed with the lease after its delivery was
    handed back: the broker sent the lease the next job at once, handed back 0.2 s later, and so on
    (19 hand-backs in 4 s; a second worker's free slots never saw that job).
    """
    app = await sharded_app(broker, tmp_path)
    release = asyncio.Event()
    starts: Counter[int] = Counter()

    @app.job("slow", queue="split")
    async def slow(payload: dict[str, int], ctx: JobContext) -> None:
        starts[payload["i"]] += 1
        if payload["i"] % 100 == 50:
            await release.wait()
        else:
            await asyncio.sleep(0.005)  # short jobs: the worker takes its look-ahead delivery

    for shard in (0, 1):  # per shard: 30 short jobs, a long one, 30 short ones
        for i in range(61):
            await app.enqueue("slow", {"i": 100 * shard + i}, tenant=tenant_of(shard))
    recorder = Recorder()
    worker = Worker(app, broker, WorkerOptions(queues=("split",), concurrency=2, grace=10), recorder)
    task = asyncio.create_task(worker.run())
    try:
        await asyncio.wait_for(worker.ready.wait(), 10)
        await until(lambda: 50 in starts and 150 in starts, 20)
        assert 50 in starts  # both slots run a long job
        assert 150 in starts
        began = len([o for o in recorder.outcomes if o.kind == "handed_back"])
        await asyncio.sleep(1.5)
        first = len([o for o in recorder.outcomes if o.kind == "handed_back"]) - began
        await asyncio.sleep(3.0)
        handed = len([o for o in recorder.outcomes if o.kind == "handed_back"]) - began
    finally:
        release.set()
    await until(lambda: len(starts) == 122, 20)
    worker.request_stop()
    code = await asyncio.wait_for(task, 20)
    await app.close()
    assert code == 0
    print(f"handed back: {first} in the first 1.5 s of the long jobs, {handed - first} in the next 3 s")
    assert first <= 2, first  # what waited for a slot goes back (on 7f00eb2..e820e7a: one every 0.2 s)
    assert handed == first, (first, handed)  # then nothing more is taken to be handed back
    assert len(starts) == 122, starts
    assert set(starts.values()) == {1}, starts
