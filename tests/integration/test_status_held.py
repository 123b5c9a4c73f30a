"""`amqpjobs status` while a consumer holds quarantined messages unacked (a browse, a script, a stuck console).

The broker's passive declare counts ready messages only; those a consumer holds unacked are
still in the quarantine (they come back when it closes). `status` judged the ready count alone,
so a quarantine whose every message was held said ``healthy``, exit 0.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import aio_pika
import pytest
from aio_pika.abc import AbstractIncomingMessage

from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import cli, raw_channel

pytestmark = pytest.mark.broker

TOPOLOGY = """
[[exchange]]
name = "jobs"
type = "direct"

[[job_queue]]
name = "work"
exchange = "jobs"
type = "classic"
retry_tiers = ["1s"]
"""


async def _ack(message: AbstractIncomingMessage) -> None:
    await message.ack()


async def _hold(message: AbstractIncomingMessage) -> None:
    return None  # never acked: held until the channel closes


async def _shown(broker: BrokerSettings, queue: str, field: str, count: int) -> None:
    """The management API refreshes every few seconds: wait until its ``field`` of ``queue`` is ``count``."""
    deadline = time.monotonic() + 20
    with ManagementClient(broker) as mgmt:
        while (mgmt.queue(broker.vhost, queue) or {}).get(field) != count:
            assert time.monotonic() < deadline, f"the management API did not show {field} {count} in {queue}"
            await asyncio.sleep(0.25)


@pytest.mark.timeout(90)
async def test_a_quarantine_whose_messages_a_consumer_holds_unacked_is_still_unhealthy(
    broker: BrokerSettings, tmp_path: Path
) -> None:
    (tmp_path / "t.toml").write_text(TOPOLOGY)
    assert (await asyncio.to_thread(cli, broker, "topology", "apply", str(tmp_path))).exit_code == 0
    async with raw_channel(broker) as ch, raw_channel(broker) as holder:
        await (await ch.get_queue("work", ensure=False)).consume(_ack)  # healthy but for the quarantine
        for i in range(3):
            await ch.default_exchange.publish(aio_pika.Message(b"{}", message_id=f"q-{i}"), "work.quarantine")
        await holder.set_qos(prefetch_count=10)
        await (await holder.get_queue("work.quarantine", ensure=False)).consume(_hold)
        await _shown(broker, "work.quarantine", "messages_unacknowledged", 3)
        text = await asyncio.to_thread(cli, broker, "status", str(tmp_path))
        js = await asyncio.to_thread(cli, broker, "status", str(tmp_path), "--json")
    assert (text.exit_code, js.exit_code) == (1, 1), text.stdout
    problems = [p for j in json.loads(js.stdout)["job_queues"] for p in j["problems"]]
    assert problems == [
        "3 message(s) in quarantine work.quarantine (3 of them held unacked by a consumer now: they come back "
        "when it acks or closes) (next: amqpjobs quarantine list work.quarantine)"
    ], problems
    assert f"UNHEALTHY work: {problems[0]}" in text.stdout.splitlines()


@pytest.mark.timeout(90)
async def test_a_quarantine_just_emptied_is_healthy_though_the_apis_figures_lag(
    broker: BrokerSettings, tmp_path: Path
) -> None:
    """Its messages moved out (a replay, a park: here gets and acks), `status` at once says healthy.

    The management API's figures lag by a statistics interval (about 5 s). Before: status took the
    larger of the exact ready count and the API's total, so a quarantine just emptied by a park read
    as still holding them: UNHEALTHY (local CI 50, the console's live health after a park).
    """
    (tmp_path / "t.toml").write_text(TOPOLOGY)
    assert (await asyncio.to_thread(cli, broker, "topology", "apply", str(tmp_path))).exit_code == 0
    async with raw_channel(broker) as ch:
        await (await ch.get_queue("work", ensure=False)).consume(_ack)  # healthy but for the quarantine
        for i in range(3):
            await ch.default_exchange.publish(aio_pika.Message(b"{}", message_id=f"q-{i}"), "work.quarantine")
        await _shown(broker, "work.quarantine", "messages_ready", 3)
        quarantine = await ch.get_queue("work.quarantine", ensure=False)
        for _ in range(3):  # moved out: taken and acked
            message = await quarantine.get(fail=False)
            assert message is not None
            await message.ack()
        js = await asyncio.to_thread(cli, broker, "status", str(tmp_path), "--json")
        with ManagementClient(broker) as mgmt:
            lagging = (mgmt.queue(broker.vhost, "work.quarantine") or {}).get("messages_ready")
    problems = [p for j in json.loads(js.stdout)["job_queues"] for p in j["problems"]]
    assert (js.exit_code, problems) == (0, []), f"{problems} (the API's snapshot said {lagging} ready)"
