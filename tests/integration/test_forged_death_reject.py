"""A delivery rejected into quarantine whose ``x-death`` a publisher forged so that RabbitMQ can't count it.

Measured on 3.10.8: when the broker dead-letters a message whose ``x-death`` holds an entry
for the same queue and reason with a ``count`` it can't add 1 to (a string, a decimal, a
boolean) or an element that is not a table, the queue process crashes
(``badarith`` in ``rabbit_dead_letter:increment_xdeath_event_count``). Through the worker's
reject fallback (a copy too large to publish) a persistent job came back at every restart
and was rejected again until ``queue 'work' ... has crashed and failed to restart``; a
transient one vanished. The worker now sees such an ``x-death`` before it rejects and
publishes the message into the quarantine as it came, the broker's headers removed (so it
fits the frame it came in), then acks: nothing crashes, nothing is lost.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aio_pika
import pytest

from amqpjobs import JobContext
from amqpjobs.jobs.outcome import Ack
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import depth, drain, raw_channel
from tests.integration.worker_env import make_app, running_worker

pytestmark = [pytest.mark.broker, pytest.mark.chaos]

PAD = "z" * 130_850  # fits a frame as published; with the worker's retry headers it does not
FORGED: dict[str, Any] = {
    "count-a-string": [{"count": "five", "reason": "rejected", "queue": "work"}],
    "count-a-boolean": [{"count": True, "reason": "rejected", "queue": "work"}],
    "an-entry-not-a-table": ["garbage"],
}


@pytest.mark.parametrize("forged", list(FORGED))
@pytest.mark.parametrize("delivery_mode", [1, 2])
async def test_a_forged_x_death_the_broker_cant_count_is_quarantined_not_crashed(
    broker: BrokerSettings, tmp_path: Path, forged: str, delivery_mode: int
) -> None:
    app = await make_app(broker, tmp_path)
    runs: list[str] = []

    @app.job("fails", queue="work")
    async def fails(payload: dict[str, int], ctx: JobContext) -> None:
        runs.append(ctx.job_id)
        if ctx.job_id != "canary":
            raise ValueError("always")

    async with running_worker(app, broker) as (_, rec), raw_channel(broker) as channel:
        headers = {"big": PAD, "x-death": FORGED[forged]}
        message = aio_pika.Message(b'{"i": 1}', delivery_mode=delivery_mode, message_id="huge", type="fails",
                                   content_type="application/json", headers=headers)  # fmt: skip
        await channel.default_exchange.publish(message, routing_key="work")
        await rec.wait_for(lambda o: any(x.job_id == "huge" for x in o), timeout=20)
        await asyncio.sleep(1.0)  # a crashed queue shows by now (redelivered, rejected again)
        await app.enqueue("fails", {"i": 2}, job_id="canary")
        await rec.wait_for(lambda o: any(x.job_id == "canary" and isinstance(x.decision, Ack) for x in o), 10)
    await app.close()
    assert [o.job_id for o in rec.outcomes if o.job_id == "huge"] == ["huge"]  # one delivery, never redelivered
    assert runs == ["huge", "canary"]
    assert await depth(broker, "work") == 0
    (kept,) = await drain(broker, "work.quarantine")
    assert (kept.message_id, kept.body, kept.headers["big"]) == ("huge", b'{"i": 1}', PAD)
    assert "x-death" not in kept.headers
    assert kept.delivery_mode == 2
