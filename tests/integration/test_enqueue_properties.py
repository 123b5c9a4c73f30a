"""``enqueue`` writes a job's properties in one pass (wire/property_encoding.py): pamqp's bytes, on a real broker.

The publisher encodes the properties itself (:class:`~amqpjobs.wire.copies.ExactProperties`)
for what ``enqueue`` sends and queues the publish's frames in one step (wire/publish_now.py),
and hands aiormq pamqp's own ``Basic.Properties`` for anything else (here a float header):
either way the broker stores the same properties.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiormq
import pytest

from amqpjobs.wire import publish as wire_publish
from amqpjobs.wire import publish_now
from amqpjobs.wire.copies import ExactProperties
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import applied_app, drain

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]

TOPOLOGY = """
[[exchange]]
name = "jobs"

[[job_queue]]
name = "work"
exchange = "jobs"
max_priority = 5
"""


async def test_a_job_goes_out_with_its_properties_encoded_in_one_pass(
    broker: BrokerSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = await applied_app(broker, tmp_path, TOPOLOGY, "props")
    app.job("one", queue="work")(lambda p, c: None)
    handed: list[type] = []
    queued: list[tuple[type, bool]] = []
    publish = aiormq.Channel.basic_publish

    async def recording(self: aiormq.Channel, body: bytes, **kwargs: Any) -> Any:
        handed.append(type(kwargs["properties"]))
        return await publish(self, body, **kwargs)

    def queueing(underlay: aiormq.Channel, *args: Any) -> Any:
        confirmation = publish_now.queue_publish(underlay, *args)
        queued.append((type(args[-1]), confirmation is not None))
        return confirmation

    monkeypatch.setattr(aiormq.Channel, "basic_publish", recording)
    monkeypatch.setattr(wire_publish, "queue_publish", queueing)
    try:
        await app.enqueue("one", {"n": 1}, job_id="fast", priority=3, tenant="acme", headers={"k": "v"})
        await app.enqueue("one", {"n": 2}, job_id="pamqp", headers={"ratio": 0.5})  # a float: pamqp encodes it
    finally:
        await app.close()
    assert queued == [(ExactProperties, True), (aiormq.spec.Basic.Properties, False)]
    assert handed == [aiormq.spec.Basic.Properties]  # only the float's publish went through aiormq's
    fast, slow = await drain(broker, "work")
    assert (fast.message_id, fast.type, fast.priority, fast.app_id) == ("fast", "one", 3, "amqpjobs")
    assert (fast.content_type, fast.delivery_mode.value) == ("application/json", 2)
    assert fast.headers["amqpjobs-tenant"] == "acme"
    assert fast.headers["k"] == "v"
    assert fast.headers["amqpjobs-attempt"] == 1
    assert fast.body == b'{"n":1}'
    assert (slow.message_id, slow.priority, slow.headers["ratio"]) == ("pamqp", 0, 0.5)
