"""Tenant fairness figures: flood vs small tenants, p99 wait vs backlog depth, Jain's index, throughput cost.

Usage: python bench/fairness.py [--routing crc32|modulus-hash] [--tenants crc32|broker]
       (the broker of $AMQPJOBS_URL / $AMQPJOBS_MANAGEMENT_URL when set, else the project's node,
       started with scripts/broker.sh up)

Prints, with 4 slots and 20 ms handlers:
1. tenant A enqueues 5,000 jobs, then B and C 50 each: how far A got when B and C finished;
2. B's p99 wait (enqueue to start) behind an A backlog of 1,000 and of 10,000, and their ratio;
3. Jain's fairness index among busy tenants over 1 s windows;
4. jobs/s of the same workload through an unsharded and an 8-shard job queue, and their ratio.

``--routing modulus-hash`` (RabbitMQ 4.3+, issue 19): publishers send each sharded job to an
``x-modulus-hash`` exchange bound to the 8 shard queues, routing key = the tenant, and the
broker picks the shard (hash of the routing key mod the number of bound queues) instead of
our ``crc32(tenant) % 8``; workers are unchanged. Also prints each tenant's shard both ways;
``--tenants broker`` picks A, B and C on the broker's distinct shards instead of crc32's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
import uuid
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

from amqpjobs import App, JobContext, Worker, WorkerOptions
from amqpjobs.jobs.fairness import jain_index
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.topology.loader import load_topology
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import URL_ENV, BrokerSettings, broker_settings

ROOT = Path(__file__).resolve().parent.parent
SHARDS = 8
SLOTS = 4
HANDLER = 0.02
TOPOLOGY = f"""
[[exchange]]
name = "jobs"

[[job_queue]]
name = "shared"
exchange = "jobs"
shards = {SHARDS}
retry_tiers = ["1s"]

[[job_queue]]
name = "plain"
exchange = "jobs"
retry_tiers = ["1s"]
"""


#: ``--routing modulus-hash``: the shard the broker put each of tenants t0..t99 on (probed).
SHARD_OF: dict[str, int] = {}


def tenants(n: int) -> list[str]:
    """``n`` tenants on ``n`` distinct shards (crc32's, or the broker's in ``--routing modulus-hash`` runs)."""
    chosen: dict[int, str] = {}
    for i in range(100 if SHARD_OF else 10_000):
        name = f"t{i}"
        chosen.setdefault(SHARD_OF[name] if SHARD_OF else zlib.crc32(name.encode()) % SHARDS, name)
        if len(chosen) == n:
            break
    return list(chosen.values())


#: The x-modulus-hash exchange bound to the shard queues in ``--routing modulus-hash`` runs.
MODULUS = "shared.modulus"
ROUTING = "crc32"


def modulus_routed(app: App) -> None:
    """Send the app's sharded jobs through :data:`MODULUS` with the tenant as routing key (bench only)."""
    publisher = app._publisher
    assert publisher is not None
    publish = publisher.publish

    async def via_modulus(exchange: str, routing_key: str, message: Any) -> None:
        if routing_key.startswith("shared.shard-"):
            exchange, routing_key = MODULUS, str(message.headers["amqpjobs-tenant"])
        await publish(exchange, routing_key, message)

    publisher.publish = via_modulus  # type: ignore[method-assign]


async def declare_modulus(settings: BrokerSettings) -> dict[str, int]:
    """Declare :data:`MODULUS`, bind the shards, and return the shard the broker picks for tenants t0..t99."""
    import aio_pika

    connection = await aio_pika.connect(settings.url)
    async with connection:
        channel = await connection.channel()
        exchange = await channel.declare_exchange(MODULUS, "x-modulus-hash", durable=True)
        for i in range(SHARDS):
            await (await channel.get_queue(f"shared.shard-{i}", ensure=False)).bind(exchange, routing_key="")
        names = [f"t{i}" for i in range(100)]
        for name in names:
            await exchange.publish(aio_pika.Message(name.encode()), routing_key=name)
        await asyncio.sleep(0.5)
        shard_of: dict[str, int] = {}
        for i in range(SHARDS):
            queue = await channel.get_queue(f"shared.shard-{i}", ensure=False)
            while (m := await queue.get(no_ack=True, fail=False)) is not None:
                shard_of[m.body.decode()] = i
    return shard_of


async def routed(app: App) -> None:
    """Connect ``app`` and, in ``--routing modulus-hash`` runs, send its sharded jobs through :data:`MODULUS`."""
    if app._publisher is None:
        await app.connect()
        if ROUTING == "modulus-hash":
            modulus_routed(app)


async def enqueue(app: App, job: str, n: int, tenant: str | None) -> None:
    await routed(app)
    for start in range(0, n, 500):
        await asyncio.gather(
            *(app.enqueue(job, {"at": time.time()}, tenant=tenant) for _ in range(start, min(n, start + 500)))
        )


class Run:
    def __init__(self, settings: BrokerSettings, topology_path: Path) -> None:
        self.settings = settings
        self.app = App("bench", topology=load_topology(topology_path).topology, url=settings.url)
        self.done: list[tuple[str, float, float]] = []  # tenant, wait, finished at
        for name, queue in (("shared-job", "shared"), ("plain-job", "plain")):
            self.app.job(name, queue=queue)(self.handler)

    async def handler(self, payload: dict[str, Any], ctx: JobContext) -> None:
        wait = time.time() - payload["at"]
        await asyncio.sleep(HANDLER)
        self.done.append((ctx.tenant or "-", wait, time.monotonic()))

    async def until(self, predicate: Any, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while not predicate() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)


async def purge(settings: BrokerSettings) -> None:
    import aio_pika

    connection = await aio_pika.connect(settings.url)
    async with connection:
        channel = await connection.channel()
        for name in ["plain", *(f"shared.shard-{i}" for i in range(SHARDS))]:
            await (await channel.get_queue(name, ensure=False)).purge()


async def flood(settings: BrokerSettings, path: Path, backlog: int) -> tuple[int, float, list[float]]:
    run = Run(settings, path)
    a, b, c = tenants(3)
    await enqueue(run.app, "shared-job", backlog, a)
    worker = Worker(run.app, settings, WorkerOptions(queues=("shared",), concurrency=SLOTS))
    await worker.start()
    await enqueue(run.app, "shared-job", 50, b)
    await enqueue(run.app, "shared-job", 50, c)
    await run.until(lambda: sum(1 for t, _, _ in run.done if t in (b, c)) >= 100)
    a_then = sum(1 for t, _, _ in run.done if t == a)
    await worker.shutdown()
    await run.app.close()
    await purge(settings)
    waits = sorted(w for t, w, _ in run.done if t == b)
    p99 = waits[min(len(waits) - 1, int(0.99 * len(waits)))]
    t0 = run.done[0][2]
    end = max(ts for t, _, ts in run.done if t in (b, c))
    windows: dict[int, Counter[str]] = {}
    for tenant, _, ts in run.done:
        if ts <= end:
            windows.setdefault(int(ts - t0), Counter())[tenant] += 1
    indexes = [jain_index([w[a], w[b], w[c]]) for w in windows.values() if sum(w.values()) >= 10]
    return a_then, p99, indexes


async def throughput(settings: BrokerSettings, path: Path, queue: str, n: int = 2000) -> float:
    run = Run(settings, path)
    names = tenants(SHARDS)
    await routed(run.app)
    for i in range(0, n, 500):
        batch = range(i, i + 500)
        await asyncio.gather(
            *(run.app.enqueue(f"{queue}-job", {"at": time.time()}, tenant=names[j % len(names)]) for j in batch)
        )
    worker = Worker(run.app, settings, WorkerOptions(queues=(queue,), concurrency=SLOTS))
    started = time.monotonic()
    await worker.start()
    await run.until(lambda: len(run.done) >= n)
    rate = n / (time.monotonic() - started)
    await worker.shutdown()
    await run.app.close()
    return rate


async def root_settings() -> BrokerSettings:
    """``$AMQPJOBS_URL`` (and ``$AMQPJOBS_MANAGEMENT_URL``) when set, else the project's node (started if down)."""
    if os.environ.get(URL_ENV):
        return broker_settings()
    up = ["bash", str(ROOT / "scripts/broker.sh"), "up"]
    await asyncio.to_thread(subprocess.run, up, capture_output=True, check=True)
    url = ["bash", str(ROOT / "scripts/broker.sh"), "url"]
    urls = (await asyncio.to_thread(subprocess.run, url, capture_output=True, text=True, check=True)).stdout.split()
    return broker_settings(urls[-2], urls[-1])


async def main() -> int:
    global ROUTING
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--routing", choices=("crc32", "modulus-hash"), default="crc32")
    parser.add_argument("--tenants", choices=("crc32", "broker"), default="crc32",
                        help="modulus-hash: A, B, C on crc32's distinct shards (default) or the broker's")  # fmt: skip
    args = parser.parse_args()
    ROUTING, pick = args.routing, args.tenants
    settings = (await root_settings()).with_vhost(f"bench-fair-{uuid.uuid4().hex[:6]}")
    tmp = ROOT / ".broker" / "bench"
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / "fair.toml"
    path.write_text(TOPOLOGY)
    with ManagementClient(settings) as mgmt:
        mgmt.create_vhost(settings.vhost)
        version = ".".join(map(str, mgmt.broker_version()))
    try:
        await apply_topology(path, settings)
        print(f"tenant fairness (RabbitMQ {version}, {SLOTS} slots, {HANDLER * 1000:.0f} ms handlers, {SHARDS} shards, "
              f"routing {ROUTING})")  # fmt: skip
        if ROUTING == "modulus-hash":
            shard_of = await declare_modulus(settings)
            a, b, c = tenants(3)  # still crc32's choice
            ours = [zlib.crc32(t.encode()) % SHARDS for t in (a, b, c)]
            same = sum(1 for t, i in shard_of.items() if zlib.crc32(t.encode()) % SHARDS == i)
            print(f"   tenants A={a} B={b} C={c}: crc32 shards {ours}, x-modulus-hash shards "
                  f"{[shard_of[t] for t in (a, b, c)]}; of t0..t99 the broker put {same} on crc32's shard")  # fmt: skip
            if len(set(shard_of[t] for t in (a, b, c))) < 3 and pick == "broker":
                SHARD_OF.update(shard_of)
                print(f"   tenants chosen on the broker's distinct shards instead: {tenants(3)}")
        _, p99_small, idx_small = await flood(settings, path, 1000)
        _, p99_big, idx_big = await flood(settings, path, 10_000)
        a5000, _, idx5000 = await flood(settings, path, 5000)
        print(f"1. A=5,000 then B, C=50: A had completed {a5000} ({a5000 / 50:.1f}% of its backlog) "
              "when B and C were all done (bound: < 10%)")  # fmt: skip
        ratio = p99_big / p99_small if p99_small else float("inf")
        print(f"2. B's p99 wait: {p99_small * 1000:.0f} ms behind 1,000 of A, {p99_big * 1000:.0f} ms behind "
              f"10,000: ratio {ratio:.2f} (bound: within 20%)")  # fmt: skip
        every = idx_small + idx_big + idx5000
        print(f"3. Jain's index over 1 s windows: min {min(every):.3f}, mean {sum(every) / len(every):.3f} "
              "(bound: >= 0.9)")  # fmt: skip
        plain = await throughput(settings, path, "plain")
        shared = await throughput(settings, path, "shared")
        print(f"4. throughput: unsharded {plain:.0f} jobs/s, {SHARDS} shards {shared:.0f} jobs/s: "
              f"ratio {shared / plain:.2f} (bound: >= 0.85)")  # fmt: skip
    finally:
        with ManagementClient(settings) as mgmt:
            mgmt.delete_vhost(settings.vhost)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
