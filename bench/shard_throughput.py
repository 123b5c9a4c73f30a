"""Throughput of one worker on a sharded job queue: jobs/s with trivial handlers.

Usage: python bench/shard_throughput.py [--n 20000] [--slots 16] [--shards 8] [--reps 3] [--busy all|one]
                                       [--handler-ms 0] [--queue-type classic|quorum]
       (the broker of $AMQPJOBS_URL / $AMQPJOBS_MANAGEMENT_URL; default the project's local node's URLs)

Each repetition fills the shards with ``--n`` jobs first (``--busy all``: tenants spread
evenly over every shard; ``one``: every job on one shard), then starts one in-process
:class:`~amqpjobs.Worker` with ``--slots`` slots and times the drain from the first handler
start to the last handler end. Prints jobs/s and the worker process's CPU time per job
(less sensitive than jobs/s to other load on the machine) per repetition and their medians.
Handlers only count (the worker's own cost per job is what is measured), or with
``--handler-ms`` sleep first (how well the slots are kept busy). Each run has a vhost of
its own.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import uuid
import zlib
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import amqpjobs
from amqpjobs import App, JobContext, Worker, WorkerOptions
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.topology.loader import load_topology
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import URL_ENV, BrokerSettings, broker_settings

#: Where the amqpjobs measured comes from (bench/shard_pairs.py checks it is the build it meant).
SOURCE = os.path.realpath(amqpjobs.__file__)

TOPOLOGY = """
[[exchange]]
name = "jobs"

[[job_queue]]
name = "sharded"
exchange = "jobs"
type = "{queue_type}"
shards = {shards}
retry_tiers = ["1s"]
"""


def tenants(shards: int) -> list[str]:
    chosen: dict[int, str] = {}
    i = 0
    while len(chosen) < shards:
        chosen.setdefault(zlib.crc32(f"t{i}".encode()) % shards, f"t{i}")
        i += 1
    return [chosen[s] for s in range(shards)]


async def one_run(root: BrokerSettings, args: argparse.Namespace, tmp: Path) -> tuple[float, float]:
    """jobs/s and the worker process's CPU seconds per job, first handler start to last."""
    settings = root.with_vhost(f"bench-shards-{uuid.uuid4().hex[:8]}")
    with ManagementClient(settings) as mgmt:
        mgmt.create_vhost(settings.vhost)
    try:
        path = tmp / "sharded.toml"
        path.write_text(TOPOLOGY.format(shards=args.shards, queue_type=args.queue_type))
        await apply_topology(path, settings)
        app = App("bench", topology=load_topology(path).topology, url=settings.url)
        marks: list[float] = []
        cpu: list[float] = []
        done = asyncio.Event()

        @app.job("tick", queue="sharded")
        async def tick(payload: dict[str, Any], ctx: JobContext) -> None:
            if args.handler_ms:
                await asyncio.sleep(args.handler_ms / 1000)
            marks.append(time.perf_counter())
            if len(marks) in (1, args.n):
                cpu.append(time.process_time())
            if len(marks) == args.n:
                done.set()

        names = tenants(args.shards) if args.busy == "all" else tenants(args.shards)[:1]
        for start in range(0, args.n, 500):
            batch = range(start, min(args.n, start + 500))
            await asyncio.gather(*(app.enqueue("tick", {}, tenant=names[i % len(names)]) for i in batch))
        worker = Worker(app, settings, WorkerOptions(queues=("sharded",), concurrency=args.slots))
        await worker.start()
        try:
            await asyncio.wait_for(done.wait(), 600)
        finally:
            await worker.shutdown()
            await app.close()
        return (args.n - 1) / (marks[-1] - marks[0]), (cpu[-1] - cpu[0]) / (args.n - 1)
    finally:
        with ManagementClient(settings) as mgmt:
            mgmt.delete_vhost(settings.vhost)


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--busy", choices=("all", "one"), default="all")
    parser.add_argument("--handler-ms", type=float, default=0.0, help="each handler sleeps this long (default 0)")
    parser.add_argument("--queue-type", choices=("classic", "quorum"), default="classic")
    args = parser.parse_args()
    local = ("amqp://guest:guest@127.0.0.1:5682/", "http://127.0.0.1:15682/")  # scripts/broker.sh's defaults
    root = broker_settings() if os.environ.get(URL_ENV) else broker_settings(*local)
    with ManagementClient(root) as mgmt:
        version = ".".join(map(str, mgmt.broker_version()))
    print(f"amqpjobs from {SOURCE}", flush=True)
    rates, cpus = [], []
    with TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            rate, cpu = await one_run(root, args, Path(tmp))
            rates.append(rate)
            cpus.append(cpu * 1e6)
            print(f"rep {rep + 1}: {rate:.0f} jobs/s, {cpu * 1e6:.0f} µs CPU per job", flush=True)
    handler = f"{args.handler_ms:g} ms handlers" if args.handler_ms else "no-op handlers"
    print(f"RabbitMQ {version}, {args.queue_type}, {args.slots} slots, {args.shards} shards ({args.busy} busy), "
          f"{handler}, {args.n} jobs: "
          f"median {statistics.median(rates):.0f} jobs/s (min {min(rates):.0f}, max {max(rates):.0f}), "
          f"{statistics.median(cpus):.0f} µs client CPU per job")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
