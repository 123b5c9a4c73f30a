"""Tenant fairness (sharded job queues), priorities and workload classes against the real broker."""

from __future__ import annotations

import asyncio
import time
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from amqpjobs import App, JobContext, Worker, WorkerOptions
from amqpjobs.jobs.fairness import jain_index
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.topology.loader import load_topology
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import depth, raw_channel

pytestmark = pytest.mark.broker
SHARDS = 8
TOPOLOGY = f"""
[[exchange]]
name = "jobs"

[[job_queue]]
name = "shared"
exchange = "jobs"
shards = {SHARDS}
retry_tiers = ["300ms"]

[[job_queue]]
name = "prio"
exchange = "jobs"
max_priority = 9

[[job_queue]]
name = "urgent"
exchange = "jobs"

[[job_queue]]
name = "batch"
exchange = "jobs"
"""


async def setup(broker: BrokerSettings, tmp_path: Path) -> App:
    path = tmp_path / "t.toml"
    path.write_text(TOPOLOGY)
    await apply_topology(path, broker)
    return App("fair", topology=load_topology(path).topology, url=broker.url)


def tenants_on_distinct_shards(n: int) -> list[str]:
    chosen: dict[int, str] = {}
    for i in range(1000):
        name = f"tenant-{i}"
        chosen.setdefault(zlib.crc32(name.encode()) % SHARDS, name)
        if len(chosen) == n:
            break
    return list(chosen.values())


async def enqueue_many(app: App, job: str, n: int, **kw: Any) -> None:
    for start in range(0, n, 250):
        await asyncio.gather(*(app.enqueue(job, {"i": i}, **kw) for i in range(start, min(n, start + 250))))


@pytest.mark.serial  # shares of throughput: CPU contention from parallel tests skews them
@pytest.mark.timeout(180)
async def test_a_flooding_tenant_never_starves_the_others(broker: BrokerSettings, tmp_path: Path):
    app = await setup(broker, tmp_path)
    a, b, c = tenants_on_distinct_shards(3)
    done: list[tuple[str, float]] = []

    @app.job("work", queue="shared")
    async def work(payload: dict[str, Any], ctx: JobContext) -> None:
        await asyncio.sleep(0.02)
        assert ctx.tenant is not None
        done.append((ctx.tenant, time.monotonic()))

    await enqueue_many(app, "work", 5000, tenant=a)
    await enqueue_many(app, "work", 50, tenant=b)
    await enqueue_many(app, "work", 50, tenant=c)
    worker = Worker(app, broker, WorkerOptions(queues=("shared",), concurrency=4))
    await worker.start()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            counts = Counter(t for t, _ in done)
            if counts[b] == 50 and counts[c] == 50:
                break
            await asyncio.sleep(0.05)
        a_done_then = Counter(t for t, _ in done)[a]
    finally:
        await worker.shutdown()
        await app.close()
    counts = Counter(t for t, _ in done)
    assert (counts[b], counts[c]) == (50, 50)
    assert a_done_then < 500, a_done_then  # plain FIFO: B and C would wait for all 5,000 of A
    # Jain's index over 1 s windows while all three tenants were busy
    t0 = done[0][1]
    b_c_end = max(ts for t, ts in done if t in (b, c))
    windows: dict[int, Counter[str]] = {}
    for tenant, ts in done:
        if ts <= b_c_end:
            windows.setdefault(int(ts - t0), Counter())[tenant] += 1  # 1 s windows
    indexes = [jain_index([w[a], w[b], w[c]]) for w in windows.values() if sum(w.values()) >= 12]
    assert indexes
    assert min(indexes) >= 0.9, indexes
    async with raw_channel(broker) as ch:
        for i in range(SHARDS):
            await (await ch.get_queue(f"shared.shard-{i}", ensure=False)).purge()


async def test_a_retried_job_returns_to_its_own_shard(broker: BrokerSettings, tmp_path: Path):
    app = await setup(broker, tmp_path)
    (tenant,) = tenants_on_distinct_shards(1)
    seen: list[tuple[int, str]] = []

    @app.job("flaky", queue="shared")
    async def flaky(payload: dict[str, Any], ctx: JobContext) -> None:
        seen.append((ctx.attempt, ctx.queue))
        if ctx.attempt == 1:
            raise ConnectionError("blip")

    worker = Worker(app, broker, WorkerOptions(queues=("shared",), concurrency=2))
    await worker.start()
    try:
        await app.enqueue("flaky", {}, tenant=tenant)
        deadline = time.monotonic() + 10
        while len(seen) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    finally:
        await worker.shutdown()
        await app.close()
    shard = f"shared.shard-{zlib.crc32(tenant.encode()) % SHARDS}"
    assert seen == [(1, shard), (2, shard)]


async def test_high_priority_job_overtakes_a_backlog(broker: BrokerSettings, tmp_path: Path):
    """README: a priority-9 job behind 1,000 priority-0 jobs starts within the next round of deliveries.

    With 2 slots (prefetch 2), once its publish is confirmed at most the 2 deliveries already
    held (+1 for one delivered as the confirm came back) start before it.
    """
    app = await setup(broker, tmp_path)
    started: list[int] = []

    @app.job("p", queue="prio")
    async def p(payload: dict[str, Any], ctx: JobContext) -> None:
        started.append(payload["prio"])
        await asyncio.sleep(0.002)

    for start in range(0, 1000, 250):
        await asyncio.gather(*(app.enqueue("p", {"prio": 0}, priority=0) for _ in range(start, start + 250)))
    worker = Worker(app, broker, WorkerOptions(queues=("prio",), concurrency=2))
    await worker.start()
    try:
        deadline = time.monotonic() + 10
        while len(started) < 20 and time.monotonic() < deadline:
            await asyncio.sleep(0.001)
        await app.enqueue("p", {"prio": 9}, priority=9)
        confirmed_at = len(started)  # starts before the broker confirmed the priority-9 job
        deadline = time.monotonic() + 30
        while 9 not in started and time.monotonic() < deadline:
            await asyncio.sleep(0.001)
    finally:
        await worker.shutdown()
        await app.close()
    overtaken_by = started.index(9) - confirmed_at  # priority-0 jobs started between its confirm and its start
    assert overtaken_by <= 2 + 1, (confirmed_at, overtaken_by)
    assert started.count(0) < 100, "the backlog was still there: it overtook it"
    async with raw_channel(broker) as ch:
        await (await ch.get_queue("prio", ensure=False)).purge()


@pytest.mark.timeout(120)
async def test_workers_split_by_class_keep_urgent_jobs_fast(broker: BrokerSettings, tmp_path: Path):
    app = await setup(broker, tmp_path)
    duration = 1.5
    waits: list[float] = []

    @app.job("report", queue="batch")
    async def report(payload: dict[str, Any], ctx: JobContext) -> None:
        await asyncio.sleep(duration)

    @app.job("reset", queue="urgent")
    async def reset(payload: dict[str, Any], ctx: JobContext) -> None:
        waits.append(time.time() - payload["at"])

    batch_worker = Worker(app, broker, WorkerOptions(queues=("batch",), concurrency=1))
    urgent_worker = Worker(app, broker, WorkerOptions(queues=("urgent",), concurrency=1))
    await batch_worker.start()
    await urgent_worker.start()
    try:
        for i in range(4):  # a stream of batch jobs, and urgent jobs in between
            await app.enqueue("report", {"i": i})
            await app.enqueue("reset", {"at": time.time()})
            await asyncio.sleep(0.4)
        deadline = time.monotonic() + 10
        while len(waits) < 4 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    finally:
        await urgent_worker.shutdown()
        await batch_worker.shutdown()
        await app.close()
    assert len(waits) == 4
    assert max(waits) < duration, waits
    assert await depth(broker, "urgent") == 0


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_small_tenant_wait_does_not_grow_with_the_flood(broker: BrokerSettings, tmp_path: Path):
    """B's 50 jobs, queued behind 500 or 5,000 of A, start after the same number of A's jobs: about 50.

    The wait a backlog adds is the A jobs that start before B's last one. Round-robin across busy
    shards makes that about one per B job, whatever A's backlog; plain FIFO would make it all of A.
    It is counted in starts, not seconds, so the load of the machine does not move it: the p99 wait
    in seconds (within 20% behind 1,000 vs 10,000, issue 6) is a figure of ``bench/fairness.py``.
    """
    app = await setup(broker, tmp_path)
    a, b = tenants_on_distinct_shards(2)
    starts: list[str] = []

    @app.job("w", queue="shared")
    async def w(payload: dict[str, Any], ctx: JobContext) -> None:
        starts.append(ctx.tenant or "")
        await asyncio.sleep(0.02)

    async def a_jobs_before_bs_last(backlog: int) -> int:
        starts.clear()
        await enqueue_many(app, "w", backlog, tenant=a)
        await enqueue_many(app, "w", 50, tenant=b)  # all queued before the worker starts: no timing in it
        worker = Worker(app, broker, WorkerOptions(queues=("shared",), concurrency=4))
        await worker.start()
        try:
            deadline = time.monotonic() + 60
            while starts.count(b) < 50 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        finally:
            await worker.shutdown()
        async with raw_channel(broker) as ch:
            for i in range(SHARDS):
                await (await ch.get_queue(f"shared.shard-{i}", ensure=False)).purge()
        assert starts.count(b) == 50
        last_b = len(starts) - 1 - starts[::-1].index(b)
        return starts[:last_b].count(a)

    small, big = await a_jobs_before_bs_last(500), await a_jobs_before_bs_last(5000)
    await app.close()
    print(f"A jobs started before B's last: behind 500 of A {small}, behind 5,000 {big}")
    # one A job per B job, give or take the 4 slots and the look-ahead delivery at each end
    assert 45 <= small <= 60, (small, big)
    assert 45 <= big <= 60, (small, big)
    assert abs(big - small) <= 10, (small, big)
