"""`amqpjobs status` over many queues: its passive declares share channels (a missing queue costs one more).

Measured on 3.10 with 100 job queues (500 queues): `status` took 5.3 s on an idle machine
and 14-21 s beside other work, with three round trips per queue (a channel opened, the
declare, the channel closed). The broker's own count of channels created says how many it
opened (``/api/overview`` ``churn_rates``, node-wide: serial).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aio_pika
import pytest

from amqpjobs.wire.declare import probe_queues
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import cli, raw_channel

pytestmark = pytest.mark.broker


def _channels_created(broker: BrokerSettings) -> int:
    with ManagementClient(broker) as mgmt:
        return int(mgmt.request("GET", "/overview")["churn_rates"]["channel_created"])


async def _settled(broker: BrokerSettings) -> int:
    """The count once the stats database caught up (it refreshes every 5 s): two equal reads 6 s apart."""
    last = await asyncio.to_thread(_channels_created, broker)
    while True:
        await asyncio.sleep(6)
        now = await asyncio.to_thread(_channels_created, broker)
        if now == last:
            return now
        last = now


@pytest.mark.serial  # counts the node's channels
@pytest.mark.timeout(120)
async def test_probing_300_queues_opens_a_channel_per_missing_queue_not_per_queue(broker: BrokerSettings) -> None:
    names = [f"scale-{i:03d}" for i in range(300)]
    async with raw_channel(broker) as ch:
        for i, name in enumerate(names):
            q = await ch.declare_queue(name, durable=True)
            if i % 100 == 0:
                await ch.default_exchange.publish(aio_pika.Message(b"x"), routing_key=q.name)
    before = await _settled(broker)
    started = time.monotonic()
    found = await probe_queues(broker, [*names[:150], "scale-missing-1", *names[150:], "scale-missing-2"])
    took = time.monotonic() - started
    after = await _settled(broker)
    assert sorted(found) == names  # the missing ones left out, every other found
    assert [n for n, p in found.items() if p.messages] == ["scale-000", "scale-100", "scale-200"]
    assert all(p.consumers == 0 for p in found.values())
    # one to start, one more after each missing queue's 404 closed its channel
    assert after - before <= 3, f"{after - before} channels opened for 302 probes in {took:.2f}s"


@pytest.mark.timeout(180)
async def test_status_of_100_job_queues_500_queues_is_exact(broker: BrokerSettings, tmp_path: Path) -> None:
    """Every row and problem of 500 queues. Its time is not asserted (speed lives in bench/, not in timed
    tests); measured on 3.10 (the second run, in-process): 4.13 s before (a channel per probe, and every
    live name parsed again for each job queue: 150,000 readings of 500 names), 0.32 s now; the CLI
    5.3 s -> 1.1 s. The channel count above is the deterministic half of that fix."""
    body = ['[[exchange]]\nname = "bigx"\ntype = "direct"\n']
    body += [f'[[job_queue]]\nname = "big{i:03d}"\nexchange = "bigx"\ntype = "classic"\nretry_tiers = ["1s"]\n'
             for i in range(100)]  # fmt: skip
    (tmp_path / "t.toml").write_text("\n".join(body))
    assert (await asyncio.to_thread(cli, broker, "topology", "apply", str(tmp_path))).exit_code == 0
    async with raw_channel(broker) as ch:
        await ch.default_exchange.publish(aio_pika.Message(b"{}"), routing_key="big042.quarantine")
    text = await asyncio.to_thread(cli, broker, "status", str(tmp_path))
    assert text.exit_code == 1
    lines = text.stdout.splitlines()
    rows = [line for line in lines if line.startswith("big")]
    assert len(rows) == 500, len(rows)  # work, tier, quarantine, suspects, parked of each
    assert sum(line.startswith("UNHEALTHY") and "no consumer" in line for line in lines) == 100
    assert [line for line in lines if "in quarantine" in line] == [
        "UNHEALTHY big042: 1 message(s) in quarantine big042.quarantine "
        "(next: amqpjobs quarantine list big042.quarantine)"
    ]
