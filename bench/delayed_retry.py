"""RabbitMQ 4.3 quorum-queue delayed retry against our TTL retry tiers, in one run (issue 19).

Usage: python bench/delayed_retry.py [--n 1000] [--delay-ms 1000] [--reps 3]
       (the 4.3 node of $AMQPJOBS_URL / $AMQPJOBS_MANAGEMENT_URL, default 127.0.0.1:5712 / 15712)

Both modes use the same quorum work queue shape and a raw aio-pika consumer (prefetch 50)
that fails each job's first delivery and acks its second, so only the retry mechanism differs:

- tiers: the consumer publishes a copy (publisher confirm) to a quorum tier queue with
  ``x-message-ttl`` = delay that dead-letters back to the work queue, then acks (what the
  worker does, without our headers' bookkeeping);
- broker: the work queue has ``x-delayed-retry-type: failed`` and ``x-delayed-retry-min`` =
  ``-max`` = delay (constant delay for the first retry); the consumer rejects with
  ``requeue=true`` and the queue holds the message for the delay.

Prints per mode: timing error (return time minus failure time minus the delay) p50/p99/max
in ms from N/2 jobs published at --rate jobs/s (the consumer never has a backlog, so the
error is the mechanism's), and throughput (jobs/s: N jobs published at once, each failing
once, from the first publish to the last ack, minus the delay), then the ratio broker/tiers.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import uuid
from typing import Any

import aio_pika
from aio_pika.abc import AbstractIncomingMessage

from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import broker_settings


async def one_run(
    url: str, mode: str, n: int, delay_ms: int, rate: float | None
) -> tuple[list[float], float, dict[str, Any]]:
    """(timing errors in ms, jobs/s, headers of one second delivery) for one mode.

    ``rate``: jobs published per second (paced, so the consumer never queues the returns and
    the error is the mechanism's); None publishes all at once (throughput).
    """
    conn = await aio_pika.connect(url)
    ch = await conn.channel()
    await ch.set_qos(prefetch_count=50)
    name = f"dr-{mode}-{uuid.uuid4().hex[:6]}"
    args: dict[str, Any] = {"x-queue-type": "quorum"}
    if mode == "broker":
        args |= {"x-delayed-retry-type": "failed", "x-delayed-retry-min": delay_ms, "x-delayed-retry-max": delay_ms}
    work = await ch.declare_queue(name, durable=True, arguments=args)
    tier_args: dict[str, Any] = {"x-queue-type": "quorum", "x-message-ttl": delay_ms, "x-dead-letter-exchange": "",
                 "x-dead-letter-routing-key": name}  # fmt: skip
    tier = await ch.declare_queue(f"{name}.retry", durable=True, arguments=tier_args)
    failed_at: dict[str, float] = {}
    errors: list[float] = []
    sample: dict[str, Any] = {}
    done = asyncio.Event()

    async def handle(m: AbstractIncomingMessage) -> None:
        key = str(m.message_id)
        now = time.monotonic()
        if key not in failed_at:
            failed_at[key] = now
            if mode == "broker":
                await m.reject(requeue=True)
            else:
                copy = aio_pika.Message(m.body, message_id=key, headers={"amqpjobs-attempt": 2})
                await ch.default_exchange.publish(copy, routing_key=tier.name)
                await m.ack()
            return
        errors.append((now - failed_at[key]) * 1000 - delay_ms)
        sample.update(m.headers)
        await m.ack()
        if len(errors) == n:
            done.set()

    await work.consume(handle)
    t0 = time.monotonic()
    if rate is None:
        await asyncio.gather(*(ch.default_exchange.publish(aio_pika.Message(b"{}", message_id=str(i)), routing_key=name)
                               for i in range(n)))  # fmt: skip
    else:
        for i in range(n):
            await asyncio.sleep(max(0.0, t0 + i / rate - time.monotonic()))
            await ch.default_exchange.publish(aio_pika.Message(b"{}", message_id=str(i)), routing_key=name)
    await asyncio.wait_for(done.wait(), 120 + n * delay_ms / 1000)
    jobs_per_s = n / (time.monotonic() - t0 - delay_ms / 1000)
    await ch.queue_delete(work.name)  # quorum queues take no if-unused delete
    await ch.queue_delete(tier.name)
    await conn.close()
    return errors, jobs_per_s, sample


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p))]


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--delay-ms", type=int, default=1000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--rate", type=float, default=100.0, help="jobs/s published in the timing runs")
    args = parser.parse_args()
    root = broker_settings(os.environ.get("AMQPJOBS_URL", "amqp://guest:guest@127.0.0.1:5712/"),
                           os.environ.get("AMQPJOBS_MANAGEMENT_URL", "http://127.0.0.1:15712/"))  # fmt: skip
    vhost = f"bench-dr-{uuid.uuid4().hex[:6]}"
    with ManagementClient(root) as mgmt:
        mgmt.create_vhost(vhost)
    url = root.with_vhost(vhost).url
    results: dict[str, tuple[list[float], list[float]]] = {"tiers": ([], []), "broker": ([], [])}
    try:
        for _ in range(args.reps):
            for mode in ("tiers", "broker"):  # interleaved: both see the same machine load
                errors, _, sample = await one_run(url, mode, args.n // 2, args.delay_ms, args.rate)
                _, rate, _ = await one_run(url, mode, args.n, args.delay_ms, None)
                results[mode][0].extend(errors)
                results[mode][1].append(rate)
                print(f"{mode:6}: p50 {pct(errors, 0.5):6.1f} ms  p99 {pct(errors, 0.99):6.1f} ms  "
                      f"max {max(errors):6.1f} ms  {rate:7.0f} jobs/s  2nd delivery: {sorted(sample)}")  # fmt: skip
    finally:
        with ManagementClient(root) as mgmt:
            mgmt.delete_vhost(vhost)
    print(f"\n{args.reps} reps, each failing once, delay {args.delay_ms} ms: timing from {args.n // 2} jobs "
          f"at {args.rate:g}/s, throughput from {args.n} jobs at once")  # fmt: skip
    for mode, (errors, rates) in results.items():
        print(f"{mode:6}: timing error p50 {pct(errors, 0.5):.1f} ms, p99 {pct(errors, 0.99):.1f} ms, "
              f"max {max(errors):.1f} ms; median {statistics.median(rates):.0f} jobs/s")  # fmt: skip
    ratio = statistics.median(results["broker"][1]) / statistics.median(results["tiers"][1])
    print(f"throughput broker/tiers: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
