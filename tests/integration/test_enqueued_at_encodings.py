"""A foreign publisher's ``amqpjobs-enqueued-at`` in any number encoding reaches the handler as that time.

Before: a decimal (``D``) or digits in a string (``String(Date.now())``) were unreadable, and the
handler's ``ctx.enqueued_at`` was the ``timestamp`` property instead (here 2033-05-18), not the
job's first enqueue time. The header goes through the broker, so its AMQP type is what pamqp
wrote and decoded, not what a unit test imagines.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import header_runs, note

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]  # header decoding is the client's

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
    stamp = datetime.fromtimestamp(2_000_000_000)
    messages = [note(job_id, timestamp=stamp, headers={"amqpjobs-enqueued-at": value})
                for job_id, (value, _) in SENT.items()]  # fmt: skip
    seen = await header_runs(broker, tmp_path, messages, lambda ctx: ctx.enqueued_at)
    shown = {k: None if v is None else v.isoformat() for k, v in seen.items()}
    assert shown == {job_id: expected for job_id, (_, expected) in SENT.items()}
