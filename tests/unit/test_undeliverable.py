"""The copy of a message no AMQP 0-9-1 client can receive (pure: amqpjobs.jobs.undeliverable)."""

from __future__ import annotations

import json

from amqpjobs.jobs.undeliverable import FINGERPRINT, MOVED_HEADERS, fingerprint, overflows, sanitize


def test_every_short_string_property_and_header_name_over_255_bytes_is_found():
    headers = {"h" * 300: 1, "ok": {"k" * 256: 2}, "fine": "v" * 10_000, "list": [{"n" * 300: 1}]}
    props = {"correlation_id": "c" * 256, "type": "t" * 255, "app_id": "é" * 128, "priority": 3, "headers": headers}
    assert overflows(props) == [
        "correlation_id is 256 bytes",
        "app_id is 256 bytes",
        "header name 'hhhhhhhhhhhhhhhh'… is 300 bytes",
        "header 'ok' holds a table with a name over 255 bytes",
        "header 'list' holds a table with a name over 255 bytes",
    ]
    assert overflows({"correlation_id": "c" * 255, "headers": {"v": "x" * 300}}) == []


def test_the_copy_moves_long_values_into_headers_and_keeps_the_rest():
    props = {"message_id": "m" * 300, "type": "sleep", "correlation_id": "c" * 300, "priority": 2,
             "headers": {"h" * 300: "v", "keep": 1, "x-delivery-count": 3}}  # fmt: skip
    copy = sanitize(props, b"{}")
    assert copy.job == "sleep"
    assert copy.job_id == copy.properties["message_id"] == f"undeliverable-{fingerprint(props, b'{}')[:32]}"
    assert copy.properties == {"message_id": copy.job_id, "type": "sleep", "priority": 2}
    assert copy.headers["amqpjobs-undeliverable-message_id"] == "m" * 300
    assert copy.headers["amqpjobs-undeliverable-correlation_id"] == "c" * 300
    assert json.loads(copy.headers[MOVED_HEADERS]) == {"h" * 300: "v"}
    assert copy.headers["keep"] == 1
    assert "x-delivery-count" not in copy.headers
    assert copy.headers[FINGERPRINT] == fingerprint(props, b"{}")
    assert overflows({**copy.properties, "headers": copy.headers}) == []


def test_the_fingerprint_ignores_the_delivery_counters_and_tells_bodies_apart():
    props = {"message_id": "a", "headers": {"x-delivery-count": 1}}
    again = {"message_id": "a", "headers": {"x-delivery-count": 2, "x-acquired-count": 5}}
    assert fingerprint(props, b"1") == fingerprint(again, b"1")
    assert fingerprint(props, b"1") != fingerprint(props, b"2")
    assert fingerprint(props, b"1") != fingerprint({"message_id": "b"}, b"1")
