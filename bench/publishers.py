"""A publisher process of bench section 3: ``amqpjobs`` (``App.enqueue``) or ``raw`` (aio-pika as shipped).

Usage (cwd bench/; run by bench/run.py, one process per contestant):
    python publishers.py raw|amqpjobs --url URL [--topology FILE]

Each contestant publishes from a process of its own, as each consumer of the other sections
runs in one: amqpjobs reads frames with its own reader once connected
(``amqpjobs/wire/frame_reading.py``, ``method_decoding.py``), which replaces aiormq's for
every connection of the process, so a raw aio-pika publisher beside it would be measured
with amqpjobs' reader, not its own. The ``raw`` process imports no amqpjobs module.

It connects, publishes 50 jobs, prints ``ready``, then answers each line of stdin
``one K`` (K publishes, each awaited before the next) or ``batch K`` (K publishes gathered
500 at a time) with one line of JSON: ``{"rate": msg/s, "cpu_us": client CPU µs per
message}`` of this process. EOF ends it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

import aio_pika
from aio_pika.abc import DeliveryMode
from common import EXCHANGE, JOB, QUEUE, own_cpu

#: Publishes gathered at once by ``batch``.
BATCH = 500


def raw_message(now: float) -> aio_pika.Message:
    """The same wire format as ``App.enqueue``'s, built by hand as a raw aio-pika publisher would."""
    return aio_pika.Message(
        json.dumps({"t": now}).encode(),
        content_type="application/json",
        message_id=str(uuid.uuid4()),
        type=JOB,
        timestamp=datetime.fromtimestamp(now, UTC),
        headers={
            "amqpjobs-attempt": 1,
            "amqpjobs-enqueued-at": datetime.fromtimestamp(now, UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
        },
        delivery_mode=DeliveryMode.PERSISTENT,
    )


#: A contestant: publish one job (awaitable), and close.
Publisher = tuple[Callable[[], Awaitable[object]], Callable[[], Awaitable[None]]]


async def raw_publisher(url: str) -> Publisher:
    connection = await aio_pika.connect_robust(url)
    channel = await connection.channel(publisher_confirms=True)
    exchange = await channel.get_exchange(EXCHANGE, ensure=False)
    return lambda: exchange.publish(raw_message(time.time()), QUEUE), connection.close


async def amqpjobs_publisher(url: str, topology: str) -> Publisher:
    from amqpjobs import App
    from amqpjobs.topology.loader import load_topology

    async def noop(payload: object, ctx: object) -> None:
        return None

    app = App("bench", topology=load_topology(topology).topology, url=url)
    app.job(JOB, queue=QUEUE)(noop)
    await app.connect()
    return lambda: app.enqueue(JOB, {"t": time.time()}), app.close


async def serve(args: argparse.Namespace) -> None:
    if args.contestant == "raw":
        publish, close = await raw_publisher(args.url)
    else:
        publish, close = await amqpjobs_publisher(args.url, args.topology)
    try:
        for _ in range(50):
            await publish()
        print("ready", flush=True)
        loop = asyncio.get_running_loop()
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            mode, k = line.split()
            n = int(k)
            c0, t0 = own_cpu(), time.perf_counter()
            if mode == "one":
                for _ in range(n):
                    await publish()
            else:
                for start in range(0, n, BATCH):
                    await asyncio.gather(*(publish() for _ in range(min(BATCH, n - start))))
            elapsed, cpu = time.perf_counter() - t0, own_cpu() - c0
            print(json.dumps({"rate": n / elapsed, "cpu_us": cpu / n * 1e6}), flush=True)
    finally:
        await close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("contestant", choices=["raw", "amqpjobs"])
    parser.add_argument("--url", required=True)
    parser.add_argument("--topology", help="the bench topology file (amqpjobs)")
    args = parser.parse_args()
    if args.contestant == "amqpjobs" and not args.topology:
        parser.error("amqpjobs needs --topology")
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
