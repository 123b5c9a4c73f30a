"""A foreign publisher's ``amqpjobs-enqueued-at`` in any number encoding reaches the handler as that time.

Before: a decimal (``D``) or digits in a string (``String(Date.now())``) were unreadable, and the
handler's ``ctx.enqueued_at`` was the ``timestamp`` property instead (here 2033-05-18), not the
job's first enqueue time. The header goes through the broker, so its AMQP type is what pamqp
wrote and decoded, not what a unit test imagines.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import aio_pika
import pytest

from amqpjobs import JobContext
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import applied_app, raw_channel
from tests.integration.worker_env import running_worker

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]  # header decoding is the client's

TOPOLOGY = """
[[exchange]]
name = "jobs"

[[job_queue]]
name = "work"
exchange = "jobs"
retry_tiers = ["1s"]
"""

MILLIS = "2025-11-30T09:00:00.123000+00:00"
#: Sent header value -> the ctx.enqueued_at expected. An AMQP decimal is a 32-bit unsigned value and a scale
#: (pamqp refuses more: "Decimal mantissa range"), so whole seconds are all a decimal time can carry until 2106.
SENT: dict[str, tuple[Any, str]] = {
    "decimal-s": (Decimal("1764493200"), "2025-11-30T09:00:00+00:00"),
    "text-ms": ("1764493200123", MILLIS),
    "text-s": (" 1764493200.123 ", MILLIS),
    "bytes-s": (bytearray(b"1764493200.123"), MILLIS),  # an AMQP byte array (pamqp: bytearray)
    "iso": ("2025-11-30T09:00:00.123Z", MILLIS),
}


@pytest.mark.timeout(60)
async def test_the_handler_gets_the_first_enqueue_time_in_every_number_encoding(
    broker: BrokerSettings, tmp_path: Path
) -> None:
    app = await applied_app(broker, tmp_path, TOPOLOGY, "app")
    seen: dict[str, datetime | None] = {}

    @app.job("note", queue="work")
    async def note(payload: dict[str, Any], ctx: JobContext) -> None:
        seen[ctx.job_id] = ctx.enqueued_at

    async with raw_channel(broker) as ch:
        exchange = await ch.get_exchange("jobs")
        for job_id, (value, _) in SENT.items():
            message = aio_pika.Message(
                b"{}", message_id=job_id, type="note", content_type="application/json",
                timestamp=datetime.fromtimestamp(2_000_000_000), headers={"amqpjobs-enqueued-at": value},
            )  # fmt: skip
            await exchange.publish(message, routing_key="work", mandatory=True)
    try:
        async with running_worker(app, broker):
            for _ in range(200):
                if len(seen) == len(SENT):
                    break
                await asyncio.sleep(0.05)
    finally:
        await app.close()
    shown = {k: None if v is None else v.isoformat() for k, v in seen.items()}
    assert shown == {job_id: expected for job_id, (_, expected) in SENT.items()}
