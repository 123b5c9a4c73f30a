"""The broker's delivery counters in quarantine evidence are the broker's, never a publisher's.

``amqpjobs-delivery-count`` / ``amqpjobs-acquired-count`` copy ``x-delivery-count`` /
``x-acquired-count`` (4.3) of the delivery the worker quarantined, when the broker wrote them:
a quorum queue's redelivery. A classic queue counts nothing, and no queue counts a first
delivery, so a publisher's forged values there read 0 (the message keeps them as its own
headers). Unknown jobs (``type`` naming no job) are quarantined before anything else is read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aio_pika
import pytest

from amqpjobs import App, Worker, WorkerOptions
from amqpjobs.jobs import evidence
from amqpjobs.jobs.outcome import Quarantine
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.topology.loader import load_topology
from amqpjobs.wire.delivery import get_unacked
from amqpjobs.wire.settings import BrokerSettings
from tests.conftest import BrokerRoot
from tests.integration.helpers import raw_channel
from tests.integration.worker_env import Recorder

pytestmark = pytest.mark.broker

TOPOLOGY = """
[[exchange]]
name = "jobs"

[[job_queue]]
name = "{name}"
exchange = "jobs"
type = "{kind}"
retry_tiers = ["1s"]
"""

FORGED = {"x-delivery-count": 999, "x-acquired-count": 77}


async def quarantined(broker: BrokerSettings, tmp_path: Path, kind: str, handbacks: int) -> dict[str, Any]:
    """Headers of the quarantine copy of one unknown job with forged counters, handed back ``handbacks`` times."""
    name = f"ev{kind}"
    path = tmp_path / "t.toml"
    path.write_text(TOPOLOGY.format(name=name, kind=kind))
    await apply_topology(path, broker)
    app = App("ev", topology=load_topology(path).topology, url=broker.url)
    async with raw_channel(broker) as ch:
        exchange = await ch.get_exchange("jobs")
        message = aio_pika.Message(b"{}", message_id="forged-1", type="no.such.job", headers=dict(FORGED),
                                   delivery_mode=aio_pika.DeliveryMode.PERSISTENT)  # fmt: skip
        await exchange.publish(message, routing_key=name)
        for _ in range(handbacks):  # another client takes it and hands it back: the broker redelivers it
            async for d in get_unacked(ch, name, 1):
                await d.requeue()
    recorder = Recorder()
    worker = Worker(app, broker, WorkerOptions(queues=(name,)), recorder)
    await worker.start()
    try:
        await recorder.wait_for(lambda o: any(isinstance(x.decision, Quarantine) for x in o))
    finally:
        await worker.shutdown()
        await app.close()
    async with raw_channel(broker) as ch:
        dead = await (await ch.get_queue(f"{name}.quarantine", ensure=False)).get(timeout=5)
        await dead.ack()
    assert dead.headers[evidence.REASON] == "unknown-job"
    return dict(dead.headers)


@pytest.mark.parametrize("kind", ["classic", "quorum"])
async def test_forged_counters_on_a_first_delivery_are_no_evidence(
    broker: BrokerSettings, tmp_path: Path, kind: str
) -> None:
    headers = await quarantined(broker, tmp_path, kind, handbacks=0)
    assert (headers[evidence.DELIVERY_COUNT], headers[evidence.ACQUIRED_COUNT]) == (0, 0)


async def test_forged_counters_on_a_classic_redelivery_are_no_evidence(broker: BrokerSettings, tmp_path: Path) -> None:
    headers = await quarantined(broker, tmp_path, "classic", handbacks=2)
    assert (headers[evidence.DELIVERY_COUNT], headers[evidence.ACQUIRED_COUNT]) == (0, 0)


async def test_a_quorum_redelivery_keeps_the_brokers_counts(
    broker: BrokerSettings, broker_root: BrokerRoot, tmp_path: Path
) -> None:
    """Two hand-backs: 3.10-4.2 count them in x-delivery-count, 4.3 in x-acquired-count (release notes 4.3.0).

    4.3 writes no x-delivery-count for nacks, so the forged 999 is still on the delivery: read as
    at most the acquired count (the bound; the broker's own count is 0).
    """
    headers = await quarantined(broker, tmp_path, "quorum", handbacks=2)
    counts = (headers[evidence.DELIVERY_COUNT], headers[evidence.ACQUIRED_COUNT])
    assert counts == ((2, 2) if broker_root.version >= (4, 3) else (2, 0))
