"""Copies keep the received headers (type code and bytes) and properties: the encoder, without a broker."""

from __future__ import annotations

import struct
from typing import Any, cast

import pytest
from aiormq.abc import DeliveredMessage
from pamqp import commands, decode
from pamqp.header import ContentHeader

from amqpjobs.jobs import copy_headers, envelope
from amqpjobs.wire.copies import ReceivedCopy, keep_received_properties, split_table
from amqpjobs.wire.delivery import Delivery, delivery_from_aiormq
from amqpjobs.wire.lenient_decoding import install_lenient_decoding
from amqpjobs.wire.limits import amqp_properties
from tests import amqp_frames as frames
from tests.amqp_frames import DROPPED, SENT, encode_properties, split_properties


def deliver(header: ContentHeader) -> Delivery:
    """A delivery from work queue ``work`` with ``header`` (no channel: nothing is acked here)."""
    frame = commands.Basic.Deliver(consumer_tag="c", delivery_tag=1, exchange="jobs", routing_key="work")
    return delivery_from_aiormq(DeliveredMessage(frame, header, b"{}", cast(Any, None)), "work")


def received(properties: dict[str, bytes]) -> Delivery:
    """A delivery of a content header with ``properties``, decoded as a worker's connection does."""
    install_lenient_decoding()
    keep_received_properties()
    header = ContentHeader()
    header.unmarshal(struct.pack(">HHQ", 60, 0, 2) + encode_properties(properties))
    return deliver(header)


def sent(message: envelope.OutgoingMessage) -> dict[str, bytes]:
    """The properties ``message`` is published with, as raw bytes (the payload prefix added back)."""
    return split_properties(struct.pack(">HHQ", 60, 0, 2) + amqp_properties(message).marshal())


def test_every_field_type_and_property_goes_out_as_received() -> None:
    delivery = received(SENT)
    assert delivery.headers["d-double"] == 1.1  # the decoded view
    assert delivery.headers["T-micros"] == delivery.headers["T-millis"]  # µs: read by the one rule, sent as µs
    headers = copy_headers.strip_broker_headers(delivery.headers)
    headers[envelope.ATTEMPT] = 2
    copy = delivery.copy(headers, "job-1")
    assert isinstance(copy, ReceivedCopy)
    out = sent(copy)
    # every publisher header: same name bytes, type code and value bytes, in the received order
    expected = [(key, value) for key, value in frames.HEADERS] + [(b"amqpjobs-attempt", b"b\x02")]
    assert frames.table_entries(out["headers"]) == expected
    assert {k: v for k, v in out.items() if k != "headers"} == {
        k: v for k, v in SENT.items() if k not in DROPPED | {"headers"}
    }


def test_headers_the_copy_changes_or_drops_are_encoded_anew() -> None:
    props = dict(SENT)
    props["headers"] = frames.table([
        (b"amqpjobs-attempt", b"I" + struct.pack(">i", 1)),
        (b"x-death", b"A" + struct.pack(">I", 0)),
        (b"x-first-death-queue", b"S" + frames.long_bytes(b"work")),
        (b"keep", b"d" + struct.pack(">d", 0.5)),
        (b"note", b"S" + frames.long_bytes(b"old")),
    ])  # fmt: skip
    delivery = received(props)
    headers = copy_headers.strip_broker_headers(delivery.headers)
    headers[envelope.ATTEMPT] = 3
    headers["note"] = "new"
    headers["blob"] = b"\xff"
    assert frames.table_entries(sent(delivery.copy(headers, "job-1"))["headers"]) == [
        (b"amqpjobs-attempt", b"b\x03"),  # changed: pamqp's narrowest integer, in its place
        (b"keep", b"d" + struct.pack(">d", 0.5)),  # kept: still a double
        (b"note", b"S" + frames.long_bytes(b"new")),
        (b"blob", b"x" + frames.long_bytes(b"\xff")),  # new: last; bytes go out as a byte array
    ]


def test_a_message_without_message_id_gets_the_job_id() -> None:
    props = {k: v for k, v in SENT.items() if k != "message_id"}
    delivery = received(props)
    out = sent(delivery.copy(dict(delivery.headers), "generated-1"))
    assert out["message_id"] == frames.short_bytes(b"generated-1")
    assert decode.short_str(out["message_id"])[1] == "generated-1"


def test_without_the_received_bytes_a_copy_is_built_from_the_decoded_values() -> None:
    delivery = deliver(ContentHeader(properties=commands.Basic.Properties(message_id="m", headers={"d": 0.5})))
    copy = delivery.copy(dict(delivery.headers), "job-1")
    assert not isinstance(copy, ReceivedCopy)
    assert amqp_properties(copy).delivery_mode == 2


@pytest.mark.parametrize(
    "table",
    [struct.pack(">I", 3) + b"\x01kZ", struct.pack(">I", 9) + b"\x01kS\x00\x00\x00\x09ab", struct.pack(">I", 99)],
)
def test_a_malformed_table_is_refused(table: bytes) -> None:
    with pytest.raises(ValueError, match=r"unknown field type|truncated"):
        split_table(table)


def test_a_copy_takes_the_time_it_becomes_ready_as_its_timestamp() -> None:
    """``ready_at``: the copy's ``timestamp`` (retry, replay, hand-back); without it, as received (quarantine, park)."""
    delivery = received(SENT)
    headers = copy_headers.copy_headers(delivery.headers, delivery.timestamp)
    out = sent(delivery.copy(headers, "job-1", ready_at=2_000_000_000))
    assert out["timestamp"] == struct.pack(">Q", 2_000_000_000)
    assert {k: v for k, v in out.items() if k not in {"headers", "timestamp"}} == {
        k: v for k, v in SENT.items() if k not in DROPPED | {"headers", "timestamp"}
    }
    first = b"S" + frames.long_bytes(envelope.iso_utc(frames.MILLIS / 1000).encode())  # from the ms timestamp
    assert dict(frames.table_entries(out["headers"]))[envelope.ENQUEUED_AT.encode()] == first
    assert sent(delivery.copy(headers, "job-1"))["timestamp"] == SENT["timestamp"]
    without = {k: v for k, v in SENT.items() if k != "timestamp"}
    assert sent(received(without).copy({}, "job-1", ready_at=7))["timestamp"] == struct.pack(">Q", 7)
    plain = deliver(ContentHeader(properties=commands.Basic.Properties(message_id="m", headers={})))
    assert plain.copy({}, "m", ready_at=2_000_000_001).timestamp == 2_000_000_001  # from decoded values: the same


def test_the_ready_time_of_a_copy_is_in_whole_seconds() -> None:
    assert envelope.ready_at(1_000.9) == 1_000
    assert envelope.ready_at(1_000.9, delay=35.0) == 1_035


@pytest.mark.parametrize("mode", [b"\x01", None], ids=["transient", "unset"])
def test_every_copy_is_persistent_whatever_the_publisher_sent(mode: bytes | None) -> None:
    """A job published transient (delivery mode 1, or none) by another stack is persistent from its first copy on:
    a quarantine, parked or retry-tier copy left transient is lost from its durable queue at a broker restart."""
    props = {k: v for k, v in SENT.items() if k != "delivery_mode"}
    if mode is not None:
        props["delivery_mode"] = mode
    delivery = received(props)
    assert delivery.properties()["delivery_mode"] == (None if mode is None else mode[0])
    out = sent(delivery.copy(dict(delivery.headers), "job-1"))
    assert out["delivery_mode"] == b"\x02"
    assert {k: v for k, v in out.items() if k not in ("headers", "delivery_mode")} == {
        k: v for k, v in props.items() if k not in DROPPED | {"headers", "delivery_mode"}
    }
