"""Consumer processes for the benchmark's non-peer contestants (bench/run.py starts and ends them).

Usage (``$BENCH_URL`` the vhost's AMQP URL, ``$BENCH_OUT`` the record file, cwd bench/):
    python consumers.py aiopika --prefetch 16   raw aio-pika: one channel, prefetch K, a task per delivery
    python consumers.py aiopika --channels 16   raw aio-pika: 16 channels of prefetch 1 (one channel per slot)
    python consumers.py pika --prefetch 200     sync pika BlockingConnection, prefetch K (the ceiling line)
    python consumers.py amqpjobs --slots 16     amqpjobs Worker, bench_app's job, per-job log lines off
    python consumers.py enqueue --n 20000       App.enqueue 500 at a time, then exit (to profile publishing)

Every handler parses the JSON body, writes one record (bench/common.py) and acks. The raw
consumers stop on SIGTERM's default action (unacked deliveries go back to the queue); the
amqpjobs worker drains first, as ``amqpjobs consume`` does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any

from common import QUEUE, Recorder


async def aiopika(prefetch: int, channels: int) -> int:
    import aio_pika
    from aio_pika.abc import AbstractIncomingMessage

    recorder = Recorder()
    connection = await aio_pika.connect_robust(os.environ["BENCH_URL"])

    async def on_message(message: AbstractIncomingMessage) -> None:
        payload = json.loads(message.body)
        recorder(payload["t"])
        await message.ack()

    for _ in range(channels):
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=prefetch)
        queue = await channel.declare_queue(QUEUE, passive=True)
        await queue.consume(on_message)
    await asyncio.Event().wait()
    return 0


def pika_consumer(prefetch: int) -> int:
    import pika

    recorder = Recorder()
    connection = pika.BlockingConnection(pika.URLParameters(os.environ["BENCH_URL"]))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=prefetch)

    def on_message(ch: Any, method: Any, properties: Any, body: bytes) -> None:
        payload = json.loads(body)
        recorder(payload["t"])
        ch.basic_ack(method.delivery_tag)

    channel.basic_consume(QUEUE, on_message)
    channel.start_consuming()
    return 0


async def amqpjobs_quiet(slots: int) -> int:
    from bench_app import app

    from amqpjobs import WorkerOptions, broker_settings
    from amqpjobs.runtime.processes import run_worker

    settings = broker_settings(os.environ["BENCH_URL"])
    return await run_worker(app, settings, WorkerOptions(concurrency=slots, grace=5.0))


async def enqueue(n: int) -> int:
    """Enqueue ``n`` jobs with ``App.enqueue``, 500 at a time (profiled by bench/run.py)."""
    import time

    from bench_app import app

    from amqpjobs import broker_settings

    await app.connect(broker_settings(os.environ["BENCH_URL"]))
    for start in range(0, n, 500):
        await asyncio.gather(*(app.enqueue("noop", {"t": time.time()}) for _ in range(min(500, n - start))))
    await app.close()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kind", choices=("aiopika", "pika", "amqpjobs", "enqueue"))
    parser.add_argument("--prefetch", type=int, default=1)
    parser.add_argument("--channels", type=int, default=1)
    parser.add_argument("--slots", type=int, default=1)
    parser.add_argument("--n", type=int, default=1000)
    args = parser.parse_args()
    if args.kind == "aiopika":
        return asyncio.run(aiopika(args.prefetch, args.channels))
    if args.kind == "pika":
        return pika_consumer(args.prefetch)
    if args.kind == "enqueue":
        return asyncio.run(enqueue(args.n))
    return asyncio.run(amqpjobs_quiet(args.slots))


if __name__ == "__main__":
    sys.exit(main())
