"""Time headers whose UTC time no ``datetime`` holds, from a publisher we don't control, on the operator's side.

ISO-8601 text with an offset, ``0001-01-01T00:00:00+01:00`` or ``9999-12-31T23:59:59-01:00``, parses,
but converting it to UTC leaves years 1-9999 (``OverflowError: date value out of range``). Such a
message in quarantine (evidence times of another stack's worker, or an ``amqpjobs-enqueued-at`` of
its publisher) must be listed, shown, opened on the console and replayed like any other, its
unreadable times shown as unknown: one such message stopped ``quarantine list``, ``show`` and
``replay`` of the whole queue with a traceback, and the console's quarantine page with a 500.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aio_pika
import pytest

from amqpjobs.jobs import envelope, evidence
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.console_env import client
from tests.integration.helpers import cli, depth, raw_channel
from tests.integration.test_quarantine import evidence_for
from tests.integration.worker_env import make_app

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]

EARLY = "0001-01-01T00:00:00+01:00"  # 31 December of year 0 in UTC
LATE = "9999-12-31T23:59:59-01:00"  # 1 January of year 10000 in UTC


async def quarantine_with_times_out_of_range(broker: BrokerSettings, tmp_path: Path) -> None:
    """q-0 and q-1 in work.quarantine, their failure and enqueue times out of range."""
    await make_app(broker, tmp_path)
    async with raw_channel(broker) as ch:
        exchange = await ch.get_exchange("work.quarantine")
        for i in range(2):
            headers = {
                **evidence_for(i),
                evidence.FIRST_FAILURE_AT: EARLY,
                evidence.LAST_FAILURE_AT: LATE,
                envelope.ENQUEUED_AT: EARLY,
            }
            body = json.dumps({"n": i}).encode()
            message = aio_pika.Message(body, content_type="application/json", message_id=f"q-{i}", type="mail",
                                       headers=headers)  # fmt: skip
            await exchange.publish(message, routing_key="work")


def test_quarantined_jobs_with_times_out_of_range_are_listed_shown_and_replayed(
    broker: BrokerSettings, tmp_path: Path
) -> None:
    asyncio.run(quarantine_with_times_out_of_range(broker, tmp_path))

    listed = cli(broker, "quarantine", "list", "work")
    assert listed.exit_code == 0, listed.output
    assert "work.quarantine: 2 message(s)" in listed.output
    shown = cli(broker, "quarantine", "show", "work")
    assert shown.exit_code == 0, shown.output
    assert "--- job mail id q-0" in shown.output
    assert "failed:     - -> -" in shown.output  # unknown, as for a message without evidence times
    as_json = cli(broker, "quarantine", "show", "work", "--json")
    assert as_json.exit_code == 0, as_json.output
    docs = [json.loads(line) for line in as_json.output.splitlines() if line.startswith("{")]
    assert [d["headers"][evidence.LAST_FAILURE_AT] for d in docs] == [LATE, LATE]  # the evidence as it is

    with client(broker, tmp_path) as c:
        page = c.get("/quarantine", params={"queue": "work.quarantine"})
        message = c.get("/message", params={"queue": "work.quarantine", "id": "q-1"})
    assert page.status_code == 200, page.text
    assert '<span id="depth">2</span>' in page.text
    assert message.status_code == 200, message.text
    assert LATE in message.text

    replayed = cli(broker, "replay", "work", "--rate", "1000")
    assert replayed.exit_code == 0, replayed.output
    assert "replayed 2" in replayed.output
    assert asyncio.run(depth(broker, "work")) == 2
    assert asyncio.run(depth(broker, "work.quarantine")) == 0


def test_since_out_of_range_is_refused_naming_it(broker: BrokerSettings, tmp_path: Path) -> None:
    asyncio.run(quarantine_with_times_out_of_range(broker, tmp_path))
    shown = cli(broker, "quarantine", "show", "work", "--since", EARLY)
    assert shown.exit_code == 2, shown.output
    assert f"--since '{EARLY}'" in shown.output
    assert asyncio.run(depth(broker, "work.quarantine")) == 2
