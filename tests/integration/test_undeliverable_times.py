"""The times a rescue of an undeliverable message writes: on its quarantined copy, and on a message put back.

The management API gives the raw 64-bit ``timestamp`` the publisher sent (seconds, ms, µs or ns: README "Wire
format"); every reader reads it by the one rule of units (:func:`amqpjobs.epochs.epoch_seconds`), and a
``timestamp`` past ``2**32 - 1`` is read as milliseconds. The rescue (:mod:`amqpjobs.runtime.undeliverable`)
copies the message to quarantine, then takes the head of its queue through the management API; when that head
is another message (someone removed ours meanwhile, by hand), it publishes that one back at once, as it was.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from amqpjobs.jobs.timestamps import iso_utc, parse_time
from amqpjobs.runtime.undeliverable import rescue_heads
from amqpjobs.wire.connection import connect
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import depth
from tests.integration.test_undeliverable_rescue import (
    KINDS,
    _peek_all,
    _publish_over_http,
    _recording_app,
    http_publish_stores_it,  # noqa: F401 (a fixture, used by name)
)
from tests.integration.worker_env import running_worker

pytestmark = pytest.mark.broker


async def _rescued_copy(broker: BrokerSettings, tmp_path: Path, props: dict[str, Any]) -> dict[str, Any]:
    """The quarantined copy (as the management API reads it) of a message of ``props`` published over HTTP, once a
    worker moved it (20 s at most)."""
    app, _ = await _recording_app(broker, tmp_path)
    await asyncio.to_thread(_publish_over_http, broker, {**KINDS["correlation-id"], **props})
    async with running_worker(app, broker):
        for _ in range(200):
            if await depth(broker, "work.quarantine") == 1:
                break
            await asyncio.sleep(0.1)
    await app.close()
    (copy,) = await asyncio.to_thread(_peek_all, broker, "work.quarantine")
    return copy


@pytest.mark.usefixtures("http_publish_stores_it")
async def test_a_timestamp_in_milliseconds_is_read_once_by_the_rescue(broker: BrokerSettings, tmp_path: Path):
    """The management API gives the raw ``timestamp`` (``Date.now()``: ms): the copy carries that time, in seconds.

    Before, the raw number was taken for seconds: the worker failed, "ValueError: year 57884 is out of range"."""
    copy = await _rescued_copy(broker, tmp_path, {"timestamp": 1_764_493_200_123})
    assert copy["properties"]["timestamp"] == 1_764_493_200  # whole seconds: what an AMQP timestamp holds


@pytest.mark.version_independent
@pytest.mark.usefixtures("http_publish_stores_it")  # run on 4.x by hand: skipped there, as its neighbours
@pytest.mark.parametrize(
    ("raw", "first"),
    [
        (1_764_493_200, "2025-11-30T09:00:00.000Z"),  # seconds
        (1_764_493_200_123, "2025-11-30T09:00:00.123Z"),  # Date.now(): ms
        (2**63 - 1, "2262-04-11T23:47:16.854Z"),  # time.time_ns() of 2262: past 2106 in seconds
    ],
)
async def test_the_rescued_copy_keeps_the_first_enqueue_time_as_every_copy_does(
    broker: BrokerSettings, tmp_path: Path, raw: int, first: str
):
    """The copy carries ``amqpjobs-enqueued-at`` (README "Wire format": every copy carries it), and a ``timestamp``
    only when it reads back as the same time: seconds past ``2**32 - 1`` are read as milliseconds by the one rule.

    Before, the copy had no ``amqpjobs-enqueued-at``, and for ``2**63 - 1`` (ns) it carried ``timestamp`` 9223372036,
    which every reader (``quarantine show --json``, a replayed job's ``ctx.enqueued_at``) took for 1970-04-17."""
    copy = await _rescued_copy(broker, tmp_path, {"timestamp": raw})
    props = copy["properties"]
    assert props["headers"].get("amqpjobs-enqueued-at") == first, props
    stamp = props.get("timestamp")
    read = parse_time(stamp) if stamp is not None else None
    assert read is None or iso_utc(read.timestamp())[:19] == first[:19], (stamp, read, first)


def _take_head(broker: BrokerSettings) -> dict[str, Any]:
    """Remove the head of ``work`` through the management API, as someone by hand; it, as the API read it."""
    with ManagementClient(broker) as mgmt:
        got = mgmt.request("POST", f"/queues/{quote(broker.vhost, safe='')}/work/get",
                           json={"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"})  # fmt: skip
    assert isinstance(got, list), got
    (head,) = got
    return dict(head)


@pytest.mark.usefixtures("http_publish_stores_it")
@pytest.mark.parametrize(
    "raw",
    [
        0,  # a publisher's unset timestamp (read as none)
        1_764_493_200,  # seconds
        5_000_000_000,  # read as ms (1970-02-27T20:53:20Z)
        1_764_493_200_123,  # Date.now(): ms
        7_258_118_400_000,  # ms of 2200
        2**63 - 1,  # time.time_ns() of 2262
        2**64 - 1,  # the largest AMQP timestamp
    ],
)
async def test_a_message_taken_by_mistake_goes_back_with_its_time(broker: BrokerSettings, tmp_path: Path, raw: int):
    """The same 8 bytes, whatever the unit, and no header added: every reader reads it as before.

    Before, the time went back as seconds by the rule: 1,764,493,200,123 (ms) came back 1,764,493,200, and
    7,258,118,400,000 (ms of 2200) came back with no ``timestamp`` and an ``amqpjobs-enqueued-at`` header."""
    await (await _recording_app(broker, tmp_path))[0].close()  # applies the work queue
    await asyncio.to_thread(_publish_over_http, broker, KINDS["correlation-id"])
    other = {"message_id": "other", "timestamp": raw, "headers": {"keep": "k"}}
    await asyncio.to_thread(_publish_over_http, broker, other)
    connection = await connect(broker, name="rescue-test")

    def step(name: str) -> None:
        if name == "copied":  # someone removes ours by hand: the head is now "other"
            assert _take_head(broker)["properties"]["message_id"] == "long-one"

    try:
        moved = await rescue_heads(broker, connection, {"work": "work.quarantine"}, on_step=step)
    finally:
        await connection.close()
    assert moved == 1
    (back,) = await asyncio.to_thread(_peek_all, broker, "work")
    props = back["properties"]
    assert props["message_id"] == "other"
    assert props.get("timestamp") == raw, props
    assert props["headers"] == {"keep": "k"}


#: Every basic property the management API's HTTP publish takes, none of them our default (README "Wire format").
_EVERY_PROPERTY: dict[str, Any] = {
    "content_type": "text/x-other", "content_encoding": "gzip", "delivery_mode": 1, "priority": 3,
    "correlation_id": "corr-1", "reply_to": "replies", "expiration": "600000", "message_id": "other",
    "timestamp": 1_764_493_200, "type": "sleep", "app_id": "another-stack", "cluster_id": "cluster-a",
    "headers": {"keep": "k", "n": 7, "yes": True, "nested": {"a": "b"}},
}  # fmt: skip


@pytest.mark.usefixtures("http_publish_stores_it")
@pytest.mark.parametrize("user", [False, True])
async def test_a_message_taken_by_mistake_goes_back_with_every_property(
    broker: BrokerSettings, tmp_path: Path, user: bool
) -> None:
    """Put back as it was: each property and header as published, ``delivery_mode`` 1 (transient) included.

    Before, it went back without its ``expiration`` and ``cluster_id`` (and ``user_id``), persistent, and with
    ``app_id`` as published but ``content_type`` ``application/json`` when it had none."""
    await (await _recording_app(broker, tmp_path))[0].close()  # applies the work queue
    # ahead of it in a queue with priorities too
    await asyncio.to_thread(_publish_over_http, broker, {**KINDS["correlation-id"], "priority": 9})
    sent = {**_EVERY_PROPERTY, **({"user_id": broker.username} if user else {})}
    await asyncio.to_thread(_publish_over_http, broker, sent)
    connection = await connect(broker, name="rescue-test")

    def step(name: str) -> None:
        if name == "copied":  # someone removes ours by hand: the head is now "other"
            assert _take_head(broker)["properties"]["message_id"] == "long-one"

    try:
        assert await rescue_heads(broker, connection, {"work": "work.quarantine"}, on_step=step) == 1
    finally:
        await connection.close()
    (back,) = await asyncio.to_thread(_peek_all, broker, "work")
    assert back["properties"] == sent
    assert back["payload"] == '{"n": 0}'


@pytest.mark.usefixtures("http_publish_stores_it")
async def test_a_message_taken_by_mistake_with_few_properties_goes_back_with_no_more(
    broker: BrokerSettings, tmp_path: Path
) -> None:
    """None added: no ``content_type``, ``app_id``, ``delivery_mode`` or headers it did not have."""
    await (await _recording_app(broker, tmp_path))[0].close()
    await asyncio.to_thread(_publish_over_http, broker, KINDS["correlation-id"])
    doc = {"properties": {"message_id": "bare"}, "routing_key": "work", "payload": "x", "payload_encoding": "string"}
    with ManagementClient(broker) as mgmt:
        mgmt.request("POST", f"/exchanges/{quote(broker.vhost, safe='')}/jobs/publish", json=doc)
    connection = await connect(broker, name="rescue-test")

    def step(name: str) -> None:
        if name == "copied":  # someone removes ours by hand: the head is now "bare"
            _take_head(broker)

    try:
        await rescue_heads(broker, connection, {"work": "work.quarantine"}, on_step=step)
    finally:
        await connection.close()
    (back,) = await asyncio.to_thread(_peek_all, broker, "work")
    assert back["properties"] == {"message_id": "bare"}
