"""A message the rescue took by mistake goes back to its queue as it was: its ``timestamp`` reads as the same time.

The rescue of an undeliverable message (:mod:`amqpjobs.runtime.undeliverable`) copies it to quarantine,
then takes the head of its queue through the management API; when that head is another message
(someone removed ours meanwhile, by hand), it publishes that one back at once. The management API gives
the raw 64-bit ``timestamp`` the publisher sent (seconds, ms, µs or ns: README "Wire format"); every
reader reads it by the one rule of units (:func:`amqpjobs.epochs.epoch_seconds`).
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any
from urllib.parse import quote

import pytest

from amqpjobs.runtime.undeliverable import rescue_heads
from amqpjobs.wire.connection import connect
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.worker_env import make_app

pytestmark = pytest.mark.broker
LONG = "c" * 300


def _http(broker: BrokerSettings, method: str, path: str, doc: dict[str, Any]) -> Any:
    with ManagementClient(broker) as mgmt:
        return mgmt.request(method, path.replace("VHOST", quote(broker.vhost, safe="")), json=doc)


def _publish(broker: BrokerSettings, props: dict[str, Any]) -> None:
    doc = {"properties": {"delivery_mode": 2, **props}, "routing_key": "work",
           "payload": base64.b64encode(b'{"n": 0}').decode(), "payload_encoding": "base64"}  # fmt: skip
    assert _http(broker, "POST", "/exchanges/VHOST/jobs/publish", doc) == {"routed": True}


def _get(broker: BrokerSettings, ackmode: str, count: int = 10) -> list[dict[str, Any]]:
    got = _http(broker, "POST", "/queues/VHOST/work/get", {"count": count, "ackmode": ackmode, "encoding": "auto"})
    assert isinstance(got, list)
    return got


@pytest.mark.version_independent
@pytest.mark.parametrize(
    ("raw", "stamp", "first"),
    [
        (1_764_493_200, 1_764_493_200, None),  # seconds: the same 8 bytes
        (5_000_000_000, 5_000_000_000, None),  # read as ms (1970-02-27T20:53:20Z): the same 8 bytes
        (1_764_493_200_123, 1_764_493_200, None),  # Date.now(): as seconds it would be past 9999; the same second
        (7_258_118_400_000, None, "2200-01-01T00:00:00.000Z"),  # ms of 2200: its seconds would be read as ms
        (2**63 - 1, None, "2262-04-11T23:47:16.854Z"),  # time.time_ns() of 2262: as above
    ],
)
async def test_a_message_taken_by_mistake_goes_back_with_its_time(
    broker: BrokerSettings, tmp_path: Any, raw: int, stamp: int | None, first: str | None
) -> None:
    """Before, the time went back as seconds by the rule whatever it was: 5,000,000,000 came back 5,000,000, and
    ``2**63 - 1`` (2262) came back 9,223,372,036, which every reader takes for milliseconds: 1970-04-17."""
    if not (await asyncio.to_thread(_http, broker, "GET", "/overview", {}))["rabbitmq_version"].startswith("3."):
        pytest.skip("RabbitMQ 4.x refuses the HTTP publish of a short string over 255 bytes")
    app = await make_app(broker, tmp_path)
    await app.close()
    await asyncio.to_thread(_publish, broker, {"correlation_id": LONG, "message_id": "long-one"})
    await asyncio.to_thread(_publish, broker, {"message_id": "other", "timestamp": raw, "headers": {"keep": "k"}})
    connection = await connect(broker, name="rescue-test")

    def step(name: str) -> None:
        if name == "copied":  # someone removes ours by hand: the head is now "other"
            (gone,) = _get(broker, "ack_requeue_false", 1)
            assert gone["properties"]["message_id"] == "long-one"

    try:
        moved = await rescue_heads(broker, connection, {"work": "work.quarantine"}, on_step=step)
    finally:
        await connection.close()
    assert moved == 1
    (back,) = await asyncio.to_thread(_get, broker, "reject_requeue_true")
    props = back["properties"]
    assert props["message_id"] == "other"
    assert props.get("timestamp") == stamp, props
    expected = {"keep": "k"} if first is None else {"keep": "k", "amqpjobs-enqueued-at": first}
    assert props["headers"] == expected
