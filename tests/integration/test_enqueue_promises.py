"""What the README promises about enqueue and the topology keys around it, on the real broker.

README "Enqueueing": PublishNackedError, PublishError (missing exchange, no confirm),
MessageTooLargeError for oversized headers; "Topology files": max_length/overflow,
routing_keys, [[binding]], non-direct exchange types; "Tenant fairness": the shard of a job
without a tenant is crc32(job id) % shards.
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import aio_pika
import pytest

from amqpjobs import App, FilePayloadStore
from amqpjobs.errors import (
    ConfigurationError,
    MessageTooLargeError,
    PublishError,
    PublishNackedError,
    QueueFullError,
    UnroutableError,
)
from amqpjobs.jobs.envelope import job_message
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.topology.loader import load_topology
from amqpjobs.wire.connection import connect
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.publish import ConfirmedPublisher
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import binding_triples, depth, drain, raw_channel

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]

TOPOLOGY = """
[[exchange]]
name = "jobs"

[[exchange]]
name = "events"
type = "topic"

[[exchange]]
name = "audit"
type = "fanout"

[[job_queue]]
name = "capped"
exchange = "jobs"
max_length = 1

[[job_queue]]
name = "rolling"
exchange = "jobs"
max_length = 2
overflow = "drop-head"
retry_tiers = ["1s"]

[[job_queue]]
name = "orders"
exchange = "events"
routing_keys = ["orders.created", "orders.#"]

[[job_queue]]
name = "trail"
exchange = "audit"

[[binding]]
source = "events"
destination = "audit"
destination_type = "exchange"
routing_key = "orders.shipped.#"

[[job_queue]]
name = "spread"
exchange = "jobs"
shards = 4
"""


async def make(broker: BrokerSettings, tmp_path: Path, extra: str = "") -> App:
    path = tmp_path / "t.toml"
    path.write_text(TOPOLOGY)
    await apply_topology(path, broker)
    full = tmp_path / "app.toml"
    full.write_text(TOPOLOGY + extra)
    app = App("promises", topology=load_topology(full).topology, url=broker.url)
    for name, queue in (("cap", "capped"), ("roll", "rolling"), ("order", "orders"), ("audit", "trail")):
        app.job(name, queue=queue)(lambda p, c: None)
    app.job("spread", queue="spread")(lambda p, c: None)
    return app


async def test_a_full_queue_with_reject_publish_nacks_the_enqueue(broker: BrokerSettings, tmp_path: Path):
    app = await make(broker, tmp_path)
    try:
        with ManagementClient(broker) as mgmt:
            args = (mgmt.queue(broker.vhost, "capped") or {})["arguments"]
        assert (args["x-max-length"], args["x-overflow"]) == (1, "reject-publish")
        await app.enqueue("cap", {}, job_id="first")
        with pytest.raises(QueueFullError, match="work queue 'capped' is full: the broker nacked job 'second'") as nack:
            await app.enqueue("cap", {}, job_id="second")
        assert isinstance(nack.value, PublishNackedError)
        assert (nack.value.queue, nack.value.limit) == ("capped", "max_length 1")
        await app.enqueue("roll", {}, job_id="still-publishing")  # the publisher's channel survived the nack
    finally:
        await app.close()
    assert [m.message_id for m in await drain(broker, "capped")] == ["first"]


async def test_a_job_id_is_limited_in_utf8_bytes_not_characters(broker: BrokerSettings, tmp_path: Path):
    """255 bytes go out whole; 256 bytes in 128 characters are a ConfigurationError, not pamqp's TypeError."""
    app = await make(broker, tmp_path)
    longest = "\u00e9" * 127 + "i"  # 255 UTF-8 bytes
    try:
        await app.enqueue("roll", {}, job_id=longest)
        with pytest.raises(ConfigurationError, match=r"job_id must be 1-255 UTF-8 bytes \(got 256 bytes, 128 char"):
            await app.enqueue("roll", {}, job_id="\u00e9" * 128)
        # a header name is a field name: pamqp cuts one over 128 bytes to 128, so it is refused, not renamed
        with pytest.raises(ConfigurationError, match=r"header name must be at most 128 UTF-8 bytes \(got 129 bytes"):
            await app.enqueue("roll", {}, headers={"\u00e9" * 64 + "i": 1})
        await app.enqueue("roll", {}, job_id="after", headers={"\u00e9" * 64: 1})  # nothing broke the publisher
    finally:
        await app.close()
    got = await drain(broker, "rolling")
    assert [m.message_id for m in got] == [longest, "after"]
    assert got[1].headers["\u00e9" * 64] == 1  # 128 bytes arrive whole


async def test_drop_head_over_max_length_dead_letters_the_oldest_into_quarantine(
    broker: BrokerSettings, tmp_path: Path
):
    app = await make(broker, tmp_path)
    try:
        for i in range(3):
            await app.enqueue("roll", {}, job_id=f"r{i}")
    finally:
        await app.close()
    with ManagementClient(broker) as mgmt:
        args = (mgmt.queue(broker.vhost, "rolling") or {})["arguments"]
    assert (args["x-max-length"], args["x-overflow"]) == (2, "drop-head")
    assert [m.message_id for m in await drain(broker, "rolling")] == ["r1", "r2"]
    dropped = await drain(broker, "rolling.quarantine")
    assert [m.message_id for m in dropped] == ["r0"]
    death = (dropped[0].headers or {})["x-death"][0]  # type: ignore[index]
    assert (death["reason"], death["queue"]) == ("maxlen", "rolling")  # type: ignore[index,call-overload]


async def test_routing_keys_topic_exchange_and_user_bindings(broker: BrokerSettings, tmp_path: Path, mgmt: Any):
    app = await make(broker, tmp_path)
    exchanges = {e["name"]: e["type"] for e in mgmt.exchanges(broker.vhost)}
    assert (exchanges["events"], exchanges["audit"], exchanges["jobs"]) == ("topic", "fanout", "direct")
    triples = set(binding_triples(mgmt, broker.vhost))
    assert {
        ("events", "orders", "orders.created"),
        ("events", "orders", "orders.#"),
        ("events", "audit", "orders.shipped.#"),  # the [[binding]] (exchange to exchange)
        ("audit", "trail", "trail"),
    } <= triples
    try:
        await app.enqueue("order", {}, job_id="o1")  # routing key orders.created: the first of routing_keys
        await app.enqueue("audit", {}, job_id="a1")  # a fanout exchange takes any key
    finally:
        await app.close()
    async with raw_channel(broker) as ch:
        events = await ch.get_exchange("events")
        await events.publish(aio_pika.Message(b"{}", message_id="o2"), routing_key="orders.shipped.eu")
        await events.publish(aio_pika.Message(b"{}", message_id="nobody"), routing_key="invoices.created")
    assert [m.message_id for m in await drain(broker, "orders")] == ["o1", "o2"]
    # orders.created (the publish key of job queue orders) must not match it: every order job would reach trail too
    assert [m.routing_key for m in await drain(broker, "trail")] == ["trail", "orders.shipped.eu"]


async def test_a_missing_exchange_is_unroutable_and_the_next_enqueue_works(broker: BrokerSettings, tmp_path: Path):
    extra = '\n[[exchange]]\nname = "later"\n\n[[job_queue]]\nname = "unapplied"\nexchange = "later"\n'
    app = await make(broker, tmp_path, extra)
    app.job("early", queue="unapplied")(lambda p, c: None)
    try:
        with pytest.raises(PublishError, match="exchange 'later' does not exist: apply the topology") as caught:
            await app.enqueue("early", {})
        assert type(caught.value) is UnroutableError  # a definite refusal, as a return is
        await app.enqueue("cap", {}, job_id="after")  # a new channel replaces the one the broker closed
    finally:
        await app.close()
    assert await depth(broker, "capped") == 1


async def test_no_confirm_in_time_is_a_publish_error(broker: BrokerSettings, tmp_path: Path):
    await make(broker, tmp_path)
    connection = await connect(broker)
    publisher = ConfirmedPublisher(connection, timeout=1e-6)  # no broker confirms within a microsecond
    message = job_message("cap", {}, job_id="late", now=0)
    try:
        with pytest.raises(PublishError, match="no publisher confirm within 1e-06s for 'jobs' / 'capped'") as caught:
            await publisher.publish("jobs", "capped", message)
        assert type(caught.value) is PublishError
    finally:
        await publisher.close()
        await connection.close()


async def test_headers_over_frame_max_are_refused_before_sending(broker: BrokerSettings, tmp_path: Path):
    app = await make(broker, tmp_path)
    try:
        with pytest.raises(MessageTooLargeError, match="over the connection's frame_max of 131072 bytes"):
            await app.enqueue("cap", {}, headers={"note": "x" * 140_000})
        await app.enqueue("cap", {}, job_id="fits", headers={"note": "x" * 60_000})
    finally:
        await app.close()
    assert [m.message_id for m in await drain(broker, "capped")] == ["fits"]


async def test_headers_of_many_small_items_over_frame_max_are_refused_before_sending(
    broker: BrokerSettings, tmp_path: Path
):
    """15,000 large ints take 135,000 bytes (type code and 8 bytes each), not the 2 each a quick estimate said.

    Before, they went out unsized: the broker closed the connection (FRAME_ERROR) and the
    enqueue raised a connection error, the enqueue after it a PublishError.
    """
    app = await make(broker, tmp_path)
    try:
        refused = "take 135148 bytes, over the connection's frame_max of 131072 bytes less the 20480"
        with pytest.raises(MessageTooLargeError, match=refused):
            await app.enqueue("cap", {}, job_id="big", headers={"ids": [2**40] * 15_000})
        await app.enqueue("cap", {}, job_id="fits", headers={"ids": [2**40] * 5_000})
    finally:
        await app.close()
    assert [m.message_id for m in await drain(broker, "capped")] == ["fits"]


async def test_a_job_without_tenant_goes_to_the_shard_of_its_job_id(broker: BrokerSettings, tmp_path: Path):
    app = await make(broker, tmp_path)
    ids = [f"job-{i}" for i in range(12)]
    try:
        for job_id in ids:
            await app.enqueue("spread", {}, job_id=job_id)
        await app.enqueue("spread", {}, job_id="with-tenant", tenant="acme")
    finally:
        await app.close()
    expected: dict[int, list[str]] = {i: [] for i in range(4)}
    for job_id in ids:
        expected[zlib.crc32(job_id.encode()) % 4].append(job_id)
    expected[zlib.crc32(b"acme") % 4].append("with-tenant")  # a tenant wins over the job id
    got = {i: [m.message_id for m in await drain(broker, f"spread.shard-{i}")] for i in range(4)}
    assert got == expected
    assert len([i for i in got if got[i]]) > 1  # the ids really spread


async def test_unroutable_when_the_queue_is_not_bound(broker: BrokerSettings, tmp_path: Path):
    app = await make(broker, tmp_path)
    async with raw_channel(broker) as ch:
        await ch.queue_delete("capped")
    try:
        with pytest.raises(UnroutableError, match="no queue is bound to exchange 'jobs' with routing key 'capped'"):
            await app.enqueue("cap", {})
    finally:
        await app.close()


async def test_a_refused_publish_deletes_the_payload_it_stored(broker: BrokerSettings, tmp_path: Path):
    """A nack (max_length reject-publish) or a return (unroutable) is a definite "not stored": its payload goes."""
    app = await make(broker, tmp_path)
    store = FilePayloadStore(tmp_path / "payloads", threshold=0)  # every payload goes to the store
    app.payload_store = store

    def stored() -> list[str]:
        return sorted(p.name for p in (tmp_path / "payloads" / "data").iterdir())

    try:
        await app.enqueue("cap", {"n": 1}, job_id="first")
        kept = stored()
        assert len(kept) == 1
        with pytest.raises(QueueFullError, match="NOT stored"):
            await app.enqueue("cap", {"n": 2}, job_id="second")
        assert stored() == kept  # the nacked one's payload was deleted
        async with raw_channel(broker) as ch:
            await ch.queue_delete("rolling")
        with pytest.raises(UnroutableError):
            await app.enqueue("roll", {"n": 3}, job_id="returned")
        assert stored() == kept
    finally:
        await app.close()
    [first] = await drain(broker, "capped")
    assert first.headers["amqpjobs-payload-ref"] == f"file:{kept[0]}"


async def test_a_missing_exchange_deletes_the_payload_stored_for_the_job(broker: BrokerSettings, tmp_path: Path):
    """A 404 (exchange missing) is a definite refusal, like a return: the claim-checked payload goes too."""
    extra = '\n[[exchange]]\nname = "later"\n\n[[job_queue]]\nname = "unapplied"\nexchange = "later"\n'
    app = await make(broker, tmp_path, extra)
    app.payload_store = FilePayloadStore(tmp_path / "payloads", threshold=0)  # every body is stored
    app.job("early", queue="unapplied")(lambda p, c: None)
    try:
        with pytest.raises(UnroutableError, match="exchange 'later' does not exist: apply the topology"):
            await app.enqueue("early", {"n": 1})
        assert sorted((tmp_path / "payloads" / "data").iterdir()) == []  # stored, then deleted
        await app.enqueue("cap", {"n": 2}, job_id="after")
        assert len(list((tmp_path / "payloads" / "data").iterdir())) == 1
    finally:
        await app.close()
