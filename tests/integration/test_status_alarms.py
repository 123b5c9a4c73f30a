"""`amqpjobs status` under a broker resource alarm: every publisher blocked is unhealthy, said once, with the node.

A disk or memory alarm stops the broker reading from every connection that publishes: no
job can be enqueued, and a worker's retry and quarantine copies wait. `status` read only the
queues, so it said ``healthy`` (exit 0) through it. The node's disk limit is raised past any
disk here (serial: it blocks every publisher) and put back after.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from aio_pika.abc import AbstractIncomingMessage

from amqpjobs.wire.alarms import alarm_now
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings
from tests.conftest import BrokerRoot
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


def _alarms(broker: BrokerSettings) -> list[str]:
    with ManagementClient(broker) as mgmt:
        return mgmt.alarms()


async def _ack(message: AbstractIncomingMessage) -> None:
    await message.ack()


@contextmanager
def disk_alarm(broker_root: BrokerRoot) -> Iterator[None]:
    """The node's disk alarm raised (a free-disk limit of 1 PB), its own limit back whatever happened."""
    was = broker_root.ctl("eval", "rabbit_disk_monitor:get_disk_free_limit().").stdout.strip()
    broker_root.ctl("set_disk_free_limit", "1000000000000000")
    try:
        deadline = time.monotonic() + 30
        while not _alarms(broker_root.settings):  # the disk monitor looks every few seconds
            assert time.monotonic() < deadline, "the disk alarm was not raised"
            time.sleep(0.2)
        yield
    finally:
        broker_root.ctl("set_disk_free_limit", was if was.isdigit() else "50000000")
        deadline = time.monotonic() + 30
        while _alarms(broker_root.settings) and time.monotonic() < deadline:
            time.sleep(0.2)


@pytest.mark.serial  # raises the node's disk alarm: every publisher on it is blocked meanwhile
@pytest.mark.timeout(120)
async def test_status_is_unhealthy_while_a_resource_alarm_blocks_publishers(
    broker_root: BrokerRoot, broker: BrokerSettings, tmp_path: Path
) -> None:
    (tmp_path / "t.toml").write_text(TOPOLOGY)
    assert (await asyncio.to_thread(cli, broker, "topology", "apply", str(tmp_path))).exit_code == 0
    async with raw_channel(broker) as ch:  # a consumer on the work queue: healthy but for the alarm
        await (await ch.get_queue("work", ensure=False)).consume(_ack)
        before = await asyncio.to_thread(cli, broker, "status", str(tmp_path), "--json")
        assert before.exit_code == 0, before.stdout
        assert json.loads(before.stdout)["alarms"] == []
        with disk_alarm(broker_root):
            text = await asyncio.to_thread(cli, broker, "status", str(tmp_path))
            js = await asyncio.to_thread(cli, broker, "status", str(tmp_path), "--json")
            named = await alarm_now(broker)  # BrokerBlockedError.alarm's word (README "Backpressure")
        after = await asyncio.to_thread(cli, broker, "status", str(tmp_path), "--json")
    assert (text.exit_code, js.exit_code) == (1, 1), text.stdout
    doc = json.loads(js.stdout)
    assert doc["healthy"] is False
    assert [a["resource"] for a in doc["alarms"]] in (["disk space"], ["disk"]), doc["alarms"]  # 3.x, 4.x
    assert all(a["node"] for a in doc["alarms"]), doc["alarms"]
    assert named == "disk"  # 3.10 says "disk space": one word for every version
    problems = [p for j in doc["job_queues"] for p in j["problems"]]
    assert len(problems) == 1, problems  # the only problem, said once (not once per job queue)
    assert "resource alarm" in problems[0], problems
    lines = [line for line in text.stdout.splitlines() if line.startswith("UNHEALTHY")]
    assert len(lines) == 1, text.stdout
    assert "blocking publishers" in lines[0], lines[0]
    assert doc["alarms"][0]["node"] in lines[0], lines[0]
    assert "no job can be enqueued" in lines[0], lines[0]
    assert after.exit_code == 0, after.stdout
    assert json.loads(after.stdout)["alarms"] == []
