"""A job queue renamed or removed from the topology: its queues stay, and plan, apply and status say so.

amqpjobs never deletes a queue that may hold jobs. A job queue the topology no longer names
(``batch`` renamed ``batch2``) leaves its work queue, tiers, quarantine, suspects and parked
queues behind, read by nobody: ``topology plan`` lists each as ORPHAN with its depth (exit 1
while one holds messages), ``apply`` warns and deletes nothing, ``status`` on the new topology
calls it unhealthy. Only queues amqpjobs declared count (their arguments say so): a plain
queue of another application in the vhost is never reported.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import aio_pika
import pytest

from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import cli_subprocess, depth, raw_channel

pytestmark = pytest.mark.broker

TOPOLOGY = """
[[exchange]]
name = "jobs"

[[job_queue]]
name = "batch"
exchange = "jobs"
type = "TYPE"
retry_tiers = ["10s"]

[[job_queue]]
name = "keep"
exchange = "jobs"
type = "TYPE"
"""


def orphan_lines(text: str) -> dict[str, str]:
    """ORPHAN queue lines of ``text`` by queue name (``warning: `` prefixes dropped)."""
    lines = [line.removeprefix("warning: ") for line in text.splitlines()]
    return {line.split()[2]: line for line in lines if line.startswith("ORPHAN    queue")}


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
async def test_a_renamed_job_queue_is_orphan_in_plan_apply_and_status(
    broker: BrokerSettings, tmp_path: Path, queue_type: str
):
    path = tmp_path / "t.toml"
    path.write_text(TOPOLOGY.replace("TYPE", queue_type))
    await apply_topology(path, broker)
    async with raw_channel(broker) as ch:
        await ch.declare_queue("other", durable=True)  # another application's queue, in the same vhost
        for queue in ("batch", "batch.quarantine", "other", "other"):
            await ch.default_exchange.publish(aio_pika.Message(b"{}"), routing_key=queue)
    path.write_text(TOPOLOGY.replace("TYPE", queue_type).replace('"batch"', '"batch2"'))
    plan = await asyncio.to_thread(cli_subprocess, broker, "topology", "plan", str(path))
    assert plan.returncode == 1, plan.stdout + plan.stderr
    lines = orphan_lines(plan.stdout)
    assert sorted(lines) == ["batch", "batch.parked", "batch.quarantine", "batch.retry.10s", "batch.suspects"], (
        plan.stdout
    )
    assert "ORPHAN    queue    batch (1 message(s))" in lines["batch"]
    assert "it belongs to job queue batch, which the topology no longer names" in lines["batch"], lines["batch"]
    assert "put job queue batch back in the topology so workers read it again" in lines["batch"], lines["batch"]
    assert "ORPHAN    queue    batch.quarantine (1 message(s))" in lines["batch.quarantine"]
    assert "amqpjobs replay batch.quarantine --to" in lines["batch.quarantine"], lines["batch.quarantine"]
    for empty in ("batch.parked", "batch.retry.10s", "batch.suspects"):
        assert f"ORPHAN    queue    {empty} (0 message(s))" in lines[empty]
        assert "it is empty: delete it" in lines[empty], lines[empty]
    assert "other" not in plan.stdout  # not ours: no argument of ours
    applied = await asyncio.to_thread(cli_subprocess, broker, "topology", "apply", str(path))
    assert applied.returncode == 0, applied.stderr
    assert sorted(orphan_lines(applied.stderr)) == sorted(lines), applied.stderr
    assert "other" not in applied.stderr
    assert [await depth(broker, q) for q in ("batch", "batch.quarantine", "other")] == [1, 1, 2]  # nothing deleted
    status = await asyncio.to_thread(cli_subprocess, broker, "status", str(path))
    assert status.returncode == 1, status.stdout
    gone = [line for line in status.stdout.splitlines() if line.startswith("UNHEALTHY batch:")]
    assert len(gone) == 2, status.stdout
    assert "queue batch holds 1 message(s) and no worker reads it: it belongs to job queue batch" in gone[0], gone
    assert "queue batch.quarantine holds 1 message(s)" in gone[1], gone
    assert "note batch: empty and no longer in the topology: batch.parked, batch.retry.10s, batch.suspects" in (
        status.stdout
    )
    assert "other" not in status.stdout
    narrowed = await asyncio.to_thread(cli_subprocess, broker, "status", str(path), "--queues", "keep")
    assert "batch" not in narrowed.stdout, narrowed.stdout  # asked of keep only


async def test_raising_shards_of_an_unsharded_job_queue_leaves_its_work_queue_orphan(
    broker: BrokerSettings, tmp_path: Path
):
    path = tmp_path / "t.toml"
    text = TOPOLOGY.replace("TYPE", "classic")
    path.write_text(text)
    await apply_topology(path, broker)
    async with raw_channel(broker) as ch:
        await ch.default_exchange.publish(aio_pika.Message(b"{}"), routing_key="batch")
    path.write_text(text.replace('retry_tiers = ["10s"]', 'retry_tiers = ["10s"]\nshards = 2'))
    plan = await asyncio.to_thread(cli_subprocess, broker, "topology", "plan", str(path))
    assert plan.returncode == 1, plan.stdout + plan.stderr
    lines = orphan_lines(plan.stdout)
    assert sorted(lines) == ["batch", "batch.retry.10s"], plan.stdout
    assert "ORPHAN    queue    batch (1 message(s))" in lines["batch"]
    assert "or raise shards back to 1 so workers read it again" in lines["batch"], lines["batch"]
