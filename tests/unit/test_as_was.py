"""A message put back as it was (:mod:`amqpjobs.wire.as_was`): every property it had, no other, exact bytes."""

from __future__ import annotations

from pamqp import commands

from amqpjobs.wire.as_was import AsItWas, as_it_was
from amqpjobs.wire.limits import amqp_properties
from amqpjobs.wire.property_encoding import exact_properties


def _decoded(message: AsItWas) -> commands.Basic.Properties:
    got = commands.Basic.Properties()
    encoded = amqp_properties(message).marshal()
    got.unmarshal(int.from_bytes(encoded[:2]), encoded[2:])
    return got


def test_every_property_goes_back_and_no_other() -> None:
    props = {"content_type": "text/plain", "delivery_mode": 1, "priority": 0, "expiration": "60000",
             "message_id": "m", "timestamp": 1_764_493_200, "cluster_id": "c", "user_id": "guest",
             "headers": {"f": 1.1, "i": 128, "nested": {"l": [1.5, "s"]}}}  # fmt: skip
    message, left = as_it_was(props, b"x", "guest")
    assert left == []
    assert exact_properties(message) is None  # never the new-message encoding (persistent, application/json)
    got = _decoded(message)
    assert (got.content_type, got.delivery_mode, got.priority, got.expiration, got.message_id) == (
        "text/plain", 1, 0, "60000", "m",
    )  # fmt: skip
    assert (got.cluster_id, got.user_id, got.app_id, got.content_encoding, got.correlation_id) == (
        "c", "guest", None, None, None,
    )  # fmt: skip
    assert got.headers == {"f": 1.1, "i": 128, "nested": {"l": [1.5, "s"]}}  # doubles: 1.1 stays 1.1


def test_no_headers_no_table_and_no_delivery_mode() -> None:
    got = _decoded(as_it_was({"message_id": "bare"}, b"", "guest")[0])
    assert (got.headers, got.delivery_mode, got.content_type) == (None, None, None)


def test_what_the_broker_would_refuse_is_left_out_and_said() -> None:
    props = {"user_id": "alice", "priority": 256, "delivery_mode": "2", "message_id": "m"}
    message, left = as_it_was(props, b"", "bob")
    got = _decoded(message)
    assert (got.user_id, got.priority, got.delivery_mode, got.message_id) == (None, None, None, "m")
    assert left == [
        "delivery_mode '2' (no AMQP octet)",
        "priority 256 (outside an AMQP octet)",
        "user_id 'alice' (not this connection's user 'bob': RabbitMQ refuses it)",
    ]
