"""Evidence published straight into a quarantine queue by another program, with values that are no text.

helper-207: a job header that is an array and an error type that is a table listed as job
``['x']`` and error type ``{'a': 1}`` (``error: {'a': 1}: True``): Python's reprs. Now every
listing says the value's AMQP type, as the worker's header warnings do (``(an array)``,
``(a table)``, ``(a boolean)``); an id or a job name that is no text gives way to the
message's own (``message_id``, ``type``), and a queue that is no text is none (replay names no
queue "(an array)"); ``--json`` keeps the headers as JSON values.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import aio_pika
import pytest

from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import raw_channel
from tests.integration.worker_env import make_app

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]  # our reading of decoded headers
EXE = str(Path(sys.executable).with_name("amqpjobs"))
HEADERS = {
    "amqpjobs-job": ["x"],
    "amqpjobs-reason": "exhausted",
    "amqpjobs-error-type": {"a": 1},
    "amqpjobs-error-message": True,
    "amqpjobs-original-queue": ["q"],
    "amqpjobs-job-id": {"k": "v"},
    "amqpjobs-traceback": ["line"],
}


def run(broker: BrokerSettings, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, AMQPJOBS_URL=broker.url, AMQPJOBS_MANAGEMENT_URL=broker.management_url)
    return subprocess.run([EXE, *args], capture_output=True, text=True, env=env, timeout=60, stdin=subprocess.DEVNULL)


async def test_listings_say_the_amqp_type_of_a_value_that_is_no_text(broker: BrokerSettings, tmp_path: Path) -> None:
    await make_app(broker, tmp_path)
    async with raw_channel(broker) as ch:
        message = aio_pika.Message(b"{}", message_id="m-1", type="mail", headers=HEADERS)  # type: ignore[arg-type]
        await ch.default_exchange.publish(message, routing_key="work.quarantine")

    listed = await asyncio.to_thread(run, broker, "quarantine", "list", "work")
    assert listed.returncode == 0, listed.stderr
    row = listed.stdout.splitlines()[2].split()
    assert row == ["1", "mail", "exhausted", "(a", "table)", "-", "->", "-"], listed.stdout
    assert "next: amqpjobs quarantine show work.quarantine --job mail --error-type '(a table)'" in listed.stdout

    doc = json.loads((await asyncio.to_thread(run, broker, "quarantine", "list", "work", "--json")).stdout)
    [group] = doc[0]["groups"]
    assert (group["job"], group["error_type"]) == ("mail", "(a table)")

    shown = await asyncio.to_thread(run, broker, "quarantine", "show", "work")
    assert shown.returncode == 0, shown.stderr
    lines = [line.strip() for line in shown.stdout.splitlines()]
    assert lines[0] == "--- job mail id m-1", shown.stdout
    assert "error:      (a table): (a boolean)" in lines, shown.stdout
    assert "from queue: ?" in lines, shown.stdout
    assert "traceback:  ...(an array)" in lines, shown.stdout  # a queue is named by text: an array names none
    assert "{'" not in shown.stdout, shown.stdout
    assert "['" not in shown.stdout, shown.stdout

    [one] = [json.loads(line) for line in (await asyncio.to_thread(run, broker, "quarantine", "show", "work", "--json"))
             .stdout.splitlines()]  # fmt: skip
    assert (one["job"], one["error_type"], one["original_queue"]) == ("mail", "(a table)", "")
    assert one["headers"]["amqpjobs-job"] == ["x"]  # the headers themselves stay JSON values
    assert one["headers"]["amqpjobs-error-type"] == {"a": 1}


async def test_replay_never_takes_a_type_word_for_a_queue(broker: BrokerSettings, tmp_path: Path) -> None:
    """Before this fix's second part: "target queue '(a table)' does not exist"; a queue header or an x-death
    queue that is no text is no queue to go back to."""
    await make_app(broker, tmp_path)
    async with raw_channel(broker) as ch:
        death = {"x-death": [{"reason": "rejected", "queue": {"q": 1}, "count": 1}]}
        for n, headers in enumerate(({**HEADERS, "amqpjobs-original-queue": {"q": 1}}, death)):
            message = aio_pika.Message(b"{}", message_id=f"m-{n}", type="mail", headers=headers)  # type: ignore[arg-type]
            await ch.default_exchange.publish(message, routing_key="work.quarantine")
    proc = await asyncio.to_thread(run, broker, "replay", "work.quarantine")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "replayed 0, skipped 2, left 2 in work.quarantine" in proc.stdout, proc.stdout
    assert "2 skipped: no queue to go back to" in proc.stdout, proc.stdout
    assert "(a table)" not in proc.stdout + proc.stderr
