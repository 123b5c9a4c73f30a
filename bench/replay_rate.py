"""Replay rate accuracy: achieved vs requested rate at 50, 100 and 500 msg/s.

Usage: python bench/replay_rate.py [--messages N]   (needs the project's broker: make broker-up)
Prints one line per rate with the achieved rate and its ratio to the requested one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import aio_pika

from amqpjobs.jobs import envelope, evidence
from amqpjobs.jobs.replay_plan import ReplayOptions
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.runtime.replay import replay
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings, broker_settings

ROOT = Path(__file__).resolve().parent.parent
TOPOLOGY = """
[[exchange]]
name = "jobs"

[[job_queue]]
name = "work"
exchange = "jobs"
retry_tiers = ["1s"]
"""


async def fill(settings: BrokerSettings, n: int) -> None:
    connection = await aio_pika.connect(settings.url)
    async with connection:
        channel = await connection.channel()
        exchange = await channel.get_exchange("work.quarantine")
        failure = evidence.Failure("exhausted", "ValueError", "boom", "", 2, "", "", "h", 1, "", "", "jobs", "work",
                                   "work", "mail", "", "")  # fmt: skip
        headers: dict[str, Any] = {envelope.ATTEMPT: 2, **evidence.evidence_headers(failure)}
        await asyncio.gather(*(
            exchange.publish(aio_pika.Message(json.dumps({"n": i}).encode(), message_id=f"b-{i}", headers=headers),
                             routing_key="work")
            for i in range(n)
        ))  # fmt: skip


async def one(settings: BrokerSettings, rate: float, n: int, tmp: Path) -> tuple[float, float]:
    await fill(settings, n)
    report = await replay(settings, "work.quarantine", ReplayOptions(rate=rate))
    assert report.replayed == n, report
    connection = await aio_pika.connect(settings.url)
    async with connection:
        channel = await connection.channel()
        await (await channel.get_queue("work", ensure=False)).purge()
    achieved = (report.replayed - 1) / report.elapsed if report.elapsed else float("inf")
    return achieved, report.elapsed


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=0, help="messages per rate (default: 10 s worth)")
    args = parser.parse_args()
    up = ["bash", str(ROOT / "scripts/broker.sh"), "up"]
    await asyncio.to_thread(subprocess.run, up, capture_output=True, check=True)
    url = ["bash", str(ROOT / "scripts/broker.sh"), "url"]
    urls = (await asyncio.to_thread(subprocess.run, url, capture_output=True, text=True, check=True)).stdout.split()
    settings = broker_settings(urls[-2], urls[-1]).with_vhost(f"bench-replay-{uuid.uuid4().hex[:6]}")
    tmp = ROOT / ".broker" / "bench"
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "t.toml").write_text(TOPOLOGY)
    with ManagementClient(settings) as mgmt:
        mgmt.create_vhost(settings.vhost)
        version = ".".join(map(str, mgmt.broker_version()))
    try:
        await apply_topology(tmp / "t.toml", settings)
        print(f"replay rate accuracy (RabbitMQ {version}, loopback)")
        print(f"{'requested/s':>12} {'messages':>9} {'elapsed s':>10} {'achieved/s':>11} {'ratio':>6}")
        for rate in (50.0, 100.0, 500.0):
            n = args.messages or int(rate * 10)
            achieved, elapsed = await one(settings, rate, n, tmp)
            print(f"{rate:>12.0f} {n:>9} {elapsed:>10.2f} {achieved:>11.1f} {achieved / rate:>6.3f}")
    finally:
        with ManagementClient(settings) as mgmt:
            mgmt.delete_vhost(settings.vhost)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
