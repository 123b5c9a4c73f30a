"""Leases on sharded quorum job queues: ended without returning a delivery to the queue (issue 30).

A quorum queue returns to the queue, marked ``redelivered``, the deliveries in flight to a
consumer it cancels (checked on 3.10.8 and 4.3.6: about 2 of a prefetch of 4 per cancel of a
busy consumer), and a worker takes a redelivered job for a crashed start. The dispatcher's
lease on a quorum shard therefore holds its acks until the broker has no credit left for it
before it cancels (``Lane.end_lease``). Busy shards change here all the time, so leases are
resized and ended dozens of times; not one job may come back redelivered.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from amqpjobs import App, JobContext, Worker, WorkerOptions
from amqpjobs.topology.loader import load_topology
from amqpjobs.wire.lane import Lane
from amqpjobs.wire.settings import BrokerSettings
from tests.amqp_frames import FrameTap
from tests.integration.test_shard_dispatch import tenant_per_shard, topology
from tests.integration.worker_env import Recorder

pytestmark = pytest.mark.broker

BASIC_CANCEL = (60, 30)
BASIC_CONSUME = (60, 20)


@pytest.mark.timeout(90)
async def test_leases_ended_again_and_again_return_nothing_redelivered(broker: BrokerSettings, tmp_path: Path):
    """6 rounds on 4 slots: 100 jobs of 10 ms on one quorum shard (one lease of 4), then 20 on each other shard.

    The others' backlog shrinks the first lease's share to 1 while its shard still has a
    backlog: it is ended busy, the case that returned ~2 deliveries per cancel. Between the
    rounds every shard runs dry and its lease ends too (nothing is published meanwhile).
    """
    path = await topology(broker, tmp_path, "quorum")
    app = App("qq", topology=load_topology(path).topology, url=broker.url)
    ran: Counter[int] = Counter()
    redelivered: list[int] = []

    @app.job("sleep", queue="sharded")
    async def sleep(payload: dict[str, Any], ctx: JobContext) -> None:
        ran[payload["i"]] += 1
        if ctx.redelivered:
            redelivered.append(payload["i"])
        await asyncio.sleep(0.01)

    tenants = tenant_per_shard()
    recorder = Recorder()
    n = 0

    async def burst(tenant: str, jobs: int) -> None:
        nonlocal n
        for _ in range(jobs):
            await app.enqueue("sleep", {"i": n}, tenant=tenant)
            n += 1

    async with FrameTap(broker) as tap:
        worker = Worker(app, tap.settings, WorkerOptions(queues=("sharded",), concurrency=4, grace=10), recorder)
        await worker.start()
        try:
            for round_ in range(6):
                first = tenants[round_ % 4]
                await burst(first, 100)
                await asyncio.sleep(0.05)  # its lease of 4 runs
                for tenant in tenants:
                    if tenant != first:
                        await burst(tenant, 20)
                await recorder.wait_for(lambda o: len(o) >= n, timeout=30)
                await asyncio.sleep(0.8)  # every lease runs dry (0.5 s) and ends
        finally:
            await worker.shutdown()
            await app.close()
    kinds = Counter(o.kind for o in recorder.outcomes)
    print(f"{n} jobs; leases started {tap.methods[BASIC_CONSUME]}, cancelled {tap.methods[BASIC_CANCEL]}; "
          f"most deliveries unsettled at once {tap.peak_outstanding}; outcomes {dict(kinds)}")  # fmt: skip
    assert tap.methods[BASIC_CANCEL] >= 12  # leases were ended (resized, ran dry), busy ones among them
    assert redelivered == []
    assert kinds == {"succeeded": n}
    assert sorted(ran) == list(range(n))
    assert set(ran.values()) == {1}
    assert tap.peak_outstanding <= 5  # 4 slots + the look-ahead: a draining lease holds no more than its credit


@pytest.mark.timeout(60)
async def test_quorum_shards_with_longer_jobs_are_taken_by_turns_only(
    broker: BrokerSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Jobs of 150 ms (over QUORUM_LEASE_BELOW): no lease, so no cancel that could return a job redelivered."""
    path = await topology(broker, tmp_path, "quorum")
    app = App("qq-long", topology=load_topology(path).topology, url=broker.url)
    leases: list[str] = []
    real_lease = Lane.lease

    async def counted(lane: Lane, queue: str, *args: Any, **options: Any) -> str:
        leases.append(queue)
        return await real_lease(lane, queue, *args, **options)

    monkeypatch.setattr(Lane, "lease", counted)

    @app.job("sleep", queue="sharded")
    async def sleep(payload: dict[str, Any], ctx: JobContext) -> None:
        await asyncio.sleep(0.15)

    for i, tenant in enumerate(tenant_per_shard() * 6):  # a backlog on every shard: 6 jobs each
        await app.enqueue("sleep", {"i": i}, tenant=tenant)
    recorder = Recorder()
    worker = Worker(app, broker, WorkerOptions(queues=("sharded",), concurrency=4, grace=10), recorder)
    await worker.start()
    try:
        await recorder.wait_for(lambda o: len(o) >= 24, timeout=30)
    finally:
        await worker.shutdown()
        await app.close()
    assert Counter(o.kind for o in recorder.outcomes) == {"succeeded": 24}
    assert leases == []
