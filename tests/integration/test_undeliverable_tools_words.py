"""What the quarantine tools say, and what they cost, when they go past a message no AMQP 0-9-1 client can receive.

The tools mend such a message themselves (``test_undeliverable_tools``); before, the connection's
541 warning printed just ahead of the mend still told the operator to remove it by hand in the
management UI ("'Automatic ack' removes it"), a step that, taken then, would lose the job.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import depth
from tests.integration.test_undeliverable_tools import _fill, _http_publish_stores_it, _run

pytestmark = pytest.mark.broker
__all__ = ["_http_publish_stores_it"]  # its autouse skip on RabbitMQ 4.x applies here too


@pytest.mark.timeout(120)
@pytest.mark.parametrize("args", [("quarantine", "show", "work.quarantine"), ("replay", "work.quarantine"),
                                  ("quarantine", "park", "work.quarantine", "--yes")])  # fmt: skip
async def test_a_tool_that_mends_it_does_not_tell_the_operator_to_remove_it_by_hand(
    broker: BrokerSettings, tmp_path: Path, args: tuple[str, ...]
):
    await _fill(broker, tmp_path, "work.quarantine")
    code, out = await asyncio.to_thread(_run, broker, *args)
    assert code == 0, out
    assert "correlation_id is 300 bytes" in out, out  # the mend's own line
    assert "Automatic ack" not in out, out
    assert "Remove it in the management UI" not in out, out
    assert "closed it with 541 INTERNAL_ERROR: a message no AMQP 0-9-1 client can receive" in out, out
    assert "replaced by a readable copy" in out, out
    moved = {"show": "work.quarantine", "replay": "work", "park": "work.parked"}
    assert await depth(broker, moved[args[1]] if args[0] == "quarantine" else "work") == 4
