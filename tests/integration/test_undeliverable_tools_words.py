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


@pytest.mark.timeout(120)
async def test_finding_it_reads_only_up_to_where_the_browse_stopped(
    broker: BrokerSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Before, each mend read the whole queue twice through the management API (every header of every message)."""
    from amqpjobs.runtime import undeliverable_mend
    from tests.integration.test_undeliverable_tools import _ids, _publish

    await _fill(broker, tmp_path, "work.quarantine")  # g-0, bad, g-1, g-2
    for n in range(3, 200):
        await asyncio.to_thread(_publish, broker, "work.quarantine", f"g-{n}")
    reads: list[int] = []  # how many messages each management API read returned
    from amqpjobs.wire.head_reads import peek_properties as real

    async def counting(settings: BrokerSettings, queue: str, count: int) -> list[dict[str, object]]:
        got = await real(settings, queue, count)
        reads.append(len(got))
        return got

    monkeypatch.setattr(undeliverable_mend, "peek_properties", counting)
    browse = undeliverable_mend.PastUndeliverable(broker, "work.quarantine", 201)
    try:
        seen = [d.message_id or "" async for d in browse.deliveries()]
    finally:
        await browse.close()
    assert sorted(seen) == sorted(["bad"] + [f"g-{n}" for n in range(200)])  # every message, once
    assert reads == [2, 2], reads  # the browse held g-0 when the 541 came: the first 2 tell where it is
    ids = await asyncio.to_thread(_ids, broker, "work.quarantine")
    assert ids[:2] == ["g-0", "g-1"]  # order kept (classic): the copy went to the tail
    assert await depth(broker, "work.quarantine") == 201
