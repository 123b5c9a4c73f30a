"""A job published transient (delivery mode 1, by another stack) is kept by the quarantine and the parked queue.

Each copy amqpjobs publishes is persistent, whatever the original was: a transient message in a
durable classic queue is gone after a broker restart (measured: 3.10, ``stop_app``/``start_app``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aio_pika
import pytest

from amqpjobs import JobContext, Reject
from amqpjobs.runtime.quarantine import browse
from amqpjobs.wire.settings import BrokerSettings
from tests.conftest import BrokerRoot
from tests.integration.helpers import cli, depth, raw_channel
from tests.integration.worker_env import make_app, running_worker

pytestmark = pytest.mark.broker


async def publish_transient(broker: BrokerSettings, job_id: str) -> None:
    async with raw_channel(broker) as ch:
        ex = await ch.get_exchange("jobs")
        message = aio_pika.Message(
            b'{"n": 1}', message_id=job_id, type="mail", content_type="application/json",
            delivery_mode=aio_pika.DeliveryMode.NOT_PERSISTENT,
        )  # fmt: skip
        await ex.publish(message, routing_key="work")


@pytest.mark.serial  # restarts the project's local node (stop_app/start_app)
@pytest.mark.timeout(180)
async def test_a_transient_job_survives_a_broker_restart_in_quarantine_and_parked(
    broker: BrokerSettings, broker_root: BrokerRoot, tmp_path: Path
):
    if broker_root.source != "local":
        pytest.skip("restarts the broker: the project's local node only")
    app = await make_app(broker, tmp_path)

    @app.job("mail", queue="work")
    async def mail(payload: dict[str, Any], ctx: JobContext) -> None:
        raise Reject("broken for good")

    for job_id in ("t-1", "t-2"):
        await publish_transient(broker, job_id)
    async with running_worker(app, broker) as (_, rec):
        await rec.wait_for(lambda o: len(o) >= 2, timeout=30)
    await publish_transient(broker, "rej-1")  # rejected by another consumer: the broker's own dead-letter
    async with raw_channel(broker) as ch:
        taken = await (await ch.get_queue("work", ensure=False)).get(timeout=5)
        assert taken is not None
        await taken.reject(requeue=False)
    await asyncio.sleep(0.1)
    _, held = await browse(broker, "work.quarantine")
    # the broker's copy keeps the transient mode (a broker fact: nothing of ours touches it); ours are persistent
    assert [(m.delivery.message_id, m.delivery.properties()["delivery_mode"]) for m in held] == [
        ("t-1", 2),
        ("t-2", 2),
        ("rej-1", 1),
    ]
    parked = await asyncio.to_thread(cli, broker, "quarantine", "park", "work", "--yes")
    assert "parked 3 message(s) from work.quarantine in work.parked" in parked.stdout, parked.output
    await publish_transient(broker, "t-3")
    async with running_worker(app, broker) as (_, rec):
        await rec.wait_for(lambda o: len(o) >= 1, timeout=30)
    for queue, ids in (("work.quarantine", ["t-3"]), ("work.parked", ["t-1", "t-2", "rej-1"])):
        _, held = await browse(broker, queue)
        assert [(m.delivery.message_id, m.delivery.properties()["delivery_mode"]) for m in held] == [
            (job_id, 2) for job_id in ids
        ], queue
    await asyncio.to_thread(broker_root.ctl, "stop_app")
    await asyncio.to_thread(broker_root.ctl, "start_app")

    async def counts() -> tuple[int, int]:
        return await depth(broker, "work.quarantine"), await depth(broker, "work.parked")

    got: list[tuple[int, int]] = []

    async def poll() -> None:
        for _ in range(300):
            try:
                got.append(await counts())
                return
            except Exception:
                await asyncio.sleep(0.2)

    await poll()
    assert got == [(1, 3)], "the quarantine and the parked queue kept every job through the restart"
