"""Jobs of shards dropped by lowering ``shards``: replay re-routes them, status and the worker say so.

A dropped shard (``<name>.shard-<i>`` with ``i >= shards``) stays on the broker and no worker
reads it; plan calls it ORPHAN. Replay sends a job of one by the current shard rule (crc32
over the current shard count, or the ``<name>.shards`` modulus-hash exchange on 4.3).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
import zlib
from pathlib import Path
from typing import Any

import aio_pika
import pytest

from amqpjobs import App, Worker, WorkerOptions
from amqpjobs.jobs import envelope, evidence
from amqpjobs.jobs.replay_plan import ReplayOptions
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.runtime.replay import replay
from amqpjobs.topology.loader import load_topology
from amqpjobs.wire.settings import BrokerSettings
from tests.conftest import BrokerRoot
from tests.integration.helpers import cli_subprocess, depth, raw_channel, until

pytestmark = pytest.mark.broker

TOPOLOGY = """
[[exchange]]
name = "jobs"

[[job_queue]]
name = "exports"
exchange = "jobs"
shards = 4
retry_tiers = ["1s"]
"""
MODULUS = TOPOLOGY.replace("shards = 4\n", 'shards = 4\nshard_routing = "modulus-hash"\n')


async def quarantine_from_every_shard(broker: BrokerSettings) -> None:
    """6 quarantined jobs f-0..f-5 as a worker leaves them, from shards 0..3 (tenant t-<i>)."""
    async with raw_channel(broker) as ch:
        for i in range(6):
            headers: dict[str, Any] = {
                evidence.REASON: "failed", evidence.ERROR_TYPE: "ValueError", evidence.JOB: "export",
                evidence.JOB_ID: f"f-{i}", evidence.ORIGINAL_QUEUE: f"exports.shard-{i % 4}", envelope.TENANT: f"t-{i}",
            }  # fmt: skip
            message = aio_pika.Message(b"{}", headers=headers, message_id=f"f-{i}", type="export")
            await ch.default_exchange.publish(message, routing_key="exports.quarantine")


async def lowered(broker: BrokerSettings, tmp_path: Path, text: str) -> Path:
    path = tmp_path / "t.toml"
    path.write_text(text)
    await apply_topology(path, broker)
    await quarantine_from_every_shard(broker)
    path.write_text(text.replace("shards = 4", "shards = 2"))
    await apply_topology(path, broker)
    return path


@pytest.mark.parametrize("routing", ["crc32", "modulus-hash"])
async def test_replay_sends_jobs_of_a_dropped_shard_by_the_current_shard_rule(
    broker: BrokerSettings, broker_root: BrokerRoot, tmp_path: Path, routing: str
):
    if routing == "modulus-hash" and broker_root.version < (4, 3):
        pytest.skip("x-modulus-hash is in core from RabbitMQ 4.3")
    path = await lowered(broker, tmp_path, MODULUS if routing == "modulus-hash" else TOPOLOGY)
    layouts = {lay.name: lay for lay in load_topology(path).topology.layouts()}
    dry = await replay(broker, "exports", ReplayOptions(dry_run=True, layouts=layouts))
    expected = {f"f-{i}": f"exports.shard-{zlib.crc32(f't-{i}'.encode()) % 2}" for i in range(6)}
    for i in (0, 1, 4, 5):
        expected[f"f-{i}"] = f"exports.shard-{i % 4}"  # its shard is still there: it goes back to it
    if routing == "modulus-hash":
        expected.update({f"f-{i}": "exports.shards" for i in (2, 3)})  # the broker picks among the 2 bound
    assert dict(dry.moves) == expected
    report = await replay(broker, "exports", ReplayOptions(rate=1000, layouts=layouts))
    assert report.replayed == 6
    live = [await depth(broker, f"exports.shard-{shard}") for shard in range(4)]
    assert live[2:] == [0, 0], live  # nothing left where no worker reads
    assert sum(live) == 6, live
    if routing == "crc32":
        assert live == [sum(1 for q in expected.values() if q == f"exports.shard-{s}") for s in range(4)]


async def test_replay_cli_reroutes_with_app_and_warns_without_it(
    broker: BrokerSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    await lowered(broker, tmp_path, TOPOLOGY)
    module = f"rrapp_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(
        f"from amqpjobs import App\napp = App('rr', topology={str(tmp_path / 't.toml')!r})\n"
        "@app.job('export', queue='exports')\nasync def export(payload, ctx):\n    return None\n"
    )  # the app serves the job: one that lacks it leaves it in quarantine (test_operator_tools_edges)
    monkeypatch.chdir(tmp_path)
    blind = await asyncio.to_thread(cli_subprocess, broker, "replay", "exports.quarantine", "--dry-run")
    assert blind.returncode == 0, blind.stderr
    assert "would replay f-2 -> exports.shard-2" in blind.stdout
    for shard in (2, 3):
        assert (
            f"warning: exports.shard-{shard}: no worker takes from it (no consumer, no basic.get in the last "
            "seconds)" in blind.stderr
        ), blind.stderr
    assert "give --app MODULE:APP" in blind.stderr
    known = await asyncio.to_thread(
        cli_subprocess, broker, "replay", "exports.quarantine", "--dry-run", "--app", f"{module}:app"
    )
    assert known.returncode == 0, known.stderr
    crc = zlib.crc32(b"t-2") % 2
    assert f"would replay f-2 -> exports.shard-{crc} (re-routed: exports.shard-2 is not in the topology)" in (
        known.stdout
    ), known.stdout
    assert "warning" not in known.stderr, known.stderr
    done = await asyncio.to_thread(cli_subprocess, broker, "replay", "exports.quarantine", "--app", f"{module}:app")
    assert done.returncode == 0, done.stderr
    assert [await depth(broker, f"exports.shard-{s}") for s in (2, 3)] == [0, 0]


async def test_status_of_a_topology_lists_dropped_shards_holding_jobs(broker: BrokerSettings, tmp_path: Path):
    path = await lowered(broker, tmp_path, TOPOLOGY)
    async with raw_channel(broker) as ch:
        for _ in range(3):
            await ch.default_exchange.publish(aio_pika.Message(b"{}"), routing_key="exports.shard-3")
    result = await asyncio.to_thread(cli_subprocess, broker, "status", str(path))
    assert result.returncode == 1, result.stdout + result.stderr
    assert (
        "UNHEALTHY exports: queue exports.shard-3 holds 3 message(s) but is not in the topology (shards = 2): no "
        "worker reads it; drain it (move its messages to a live shard, e.g. a shovel, or consume and re-enqueue) "
        "or raise shards back to 4 so workers read it again, then delete it"
    ) in result.stdout, result.stdout
    assert "exports.shard-2 " not in result.stdout  # empty: nothing waits there


async def test_worker_start_warns_about_dropped_shards_holding_jobs(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    path = await lowered(broker, tmp_path, TOPOLOGY)
    async with raw_channel(broker) as ch:
        await ch.default_exchange.publish(aio_pika.Message(b"{}"), routing_key="exports.shard-3")
    app = App("dw", topology=load_topology(path).topology, url=broker.url)
    app.job("export", queue="exports")(lambda p, c: None)
    worker = Worker(app, broker, WorkerOptions(queues=("exports",), concurrency=2))
    with caplog.at_level(logging.WARNING):
        await worker.start()  # ready at once; the check runs in the background
        await until(lambda: "dropped shard(s) of exports" in caplog.text)
        await worker.shutdown()
    await app.close()
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "dropped shard(s) of exports hold jobs no worker reads: exports.shard-3 (1 message(s))" in text, text
    assert "raise shards back to 4" in text, text


async def test_the_work_queue_left_by_sharding_a_job_queue_is_an_orphan_while_it_holds_jobs(
    broker: BrokerSettings, tmp_path: Path
):
    """Raising ``shards`` from 1 leaves the job queue's own work queue, read by nobody. Before (a fresh user,
    3.10.8): plan said nothing of it ("0 conflict(s)", exit 0), status nothing: the job waited for ever."""
    path = tmp_path / "t.toml"
    path.write_text(TOPOLOGY.replace("shards = 4\n", ""))
    await apply_topology(path, broker)
    async with raw_channel(broker) as ch:
        await ch.default_exchange.publish(aio_pika.Message(b"{}"), routing_key="exports")
    path.write_text(TOPOLOGY)
    plan = await asyncio.to_thread(cli_subprocess, broker, "topology", "plan", str(path))
    assert plan.returncode == 1, plan.stdout + plan.stderr
    (line,) = [x for x in plan.stdout.splitlines() if x.startswith("ORPHAN") and " exports " in f"{x} "]
    assert "exports (1 message(s))" in line, line
    assert "set shards back to 1 so workers read it again" in line, line
    await apply_topology(path, broker)
    assert await depth(broker, "exports") == 1  # never deleted
    status = await asyncio.to_thread(cli_subprocess, broker, "status", str(path))
    assert status.returncode == 1, status.stdout + status.stderr
    assert "UNHEALTHY exports: queue exports holds 1 message(s) but is not in the topology (shards = 4)" in (
        status.stdout
    ), status.stdout
