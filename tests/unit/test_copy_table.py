"""A copy's header table keeps every received entry, a name that occurs twice included: the pure part.

Another publisher's table may hold a name twice, or two names that are not UTF-8 and decode
alike (U+FFFD); the decoded headers (a dict) hold one value for them, the copy every entry.
"""

from __future__ import annotations

import struct
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from pamqp import encode

from amqpjobs.errors import MessageTooLargeError
from amqpjobs.jobs import copy_headers, envelope
from amqpjobs.wire import copies
from amqpjobs.wire.copies import copy_table, split_table
from amqpjobs.wire.delivery import Delivery
from amqpjobs.wire.limits import DEFAULT_FRAME_MAX, amqp_properties, check_header_fits, encoded_size
from tests import amqp_frames as frames
from tests.unit.test_copies import received, sent

A_FIRST = (b"a", b"S" + frames.long_bytes(b"first"))
B = (b"b", b"d" + struct.pack(">d", 0.5))
A_SECOND = (b"a", b"I" + struct.pack(">i", 2))
BAD_FF = (b"k\xff", b"S" + frames.long_bytes(b"ff"))
BAD_FE = (b"k\xfe", b"l" + struct.pack(">q", 7))
RECEIVED = [A_FIRST, B, A_SECOND, BAD_FF, BAD_FE]


def delivery_of(entries: list[tuple[bytes, bytes]]) -> Delivery:
    return received({"headers": frames.table(entries), "message_id": frames.short_bytes(b"m-1")})


def copied(delivery: Delivery, headers: dict[str, Any]) -> list[tuple[bytes, bytes]]:
    return frames.table_entries(sent(delivery.copy(headers, "job-1"))["headers"])


def test_split_table_gives_every_entry_in_order() -> None:
    entries = split_table(frames.table(RECEIVED))
    assert entries == [(k.decode("utf-8", "replace"), frames.short_bytes(k) + v) for k, v in RECEIVED]
    assert [name for name, _ in entries] == ["a", "b", "a", "k\ufffd", "k\ufffd"]
    assert split_table(struct.pack(">I", 0)) == []


def test_every_entry_of_a_name_that_occurs_twice_goes_out_as_received() -> None:
    delivery = delivery_of(RECEIVED)
    assert delivery.headers == {"a": 2, "b": 0.5, "k\ufffd": 7}  # the decoded view: one value per name
    headers = copy_headers.strip_broker_headers(delivery.headers)
    headers[envelope.ATTEMPT] = 2
    assert copied(delivery, headers) == [*RECEIVED, (b"amqpjobs-attempt", b"b\x02")]


def test_a_name_the_copy_changes_goes_out_once_in_its_first_place_and_one_it_drops_not_at_all() -> None:
    attempt = [(b"amqpjobs-attempt", b"b\x05"), (b"amqpjobs-attempt", b"b\x01")]  # another publisher's, twice
    death = (b"x-death", b"A" + struct.pack(">I", 0))
    delivery = delivery_of([B, attempt[0], death, A_FIRST, attempt[1], death])
    headers = copy_headers.strip_broker_headers(delivery.headers)
    headers[envelope.ATTEMPT] = 3
    headers["new"] = "n"
    assert copied(delivery, headers) == [
        B,
        (b"amqpjobs-attempt", b"b\x03"),
        A_FIRST,
        (b"new", b"S" + frames.long_bytes(b"n")),
    ]


@pytest.mark.parametrize("value", [1, ""])
def test_a_header_of_ours_set_to_the_value_decoded_goes_out_once(value: Any) -> None:
    """review18: a replay sets attempt 1 against a received [5, 1]; CPython shares small ints and "".

    The copy carried both entries (5 first), and RabbitMQ 4.0.5, which keeps the first entry
    of a name twice, would have read attempt 5. A header of ours goes out once: the value
    the worker read (the last entry, the decoded one), in the name's first place.
    """
    encoded = b"b\x01" if value == 1 else b"S" + frames.long_bytes(b"")
    stale = b"b\x05" if value == 1 else b"S" + frames.long_bytes(b"9.9-forged")
    name = b"amqpjobs-attempt" if value == 1 else b"amqpjobs-app-version"
    delivery = delivery_of([(name, stale), B, (name, encoded)])
    headers = copy_headers.strip_broker_headers(delivery.headers)
    headers[name.decode()] = value
    assert headers[name.decode()] is delivery.headers[name.decode()]  # the case: the very object decoded
    assert copied(delivery, headers) == [(name, encoded), B]


def test_without_a_name_twice_the_order_is_the_decoded_headers_order() -> None:
    """What a copy was before: received names in their order, changed ones in place, new ones last."""
    entries = [(b"one", b"b\x01"), (b"two", b"b\x02"), (b"three", b"b\x03")]
    delivery = delivery_of(entries)
    headers = dict(delivery.headers)
    headers["two"] = "changed"
    headers["four"] = 4
    del headers["one"]
    assert [k.decode() for k, _ in copied(delivery, headers)] == list(headers)


def test_a_table_from_decoded_values_only_is_encoded_anew() -> None:
    table = frames.table([A_FIRST, A_SECOND])
    assert copy_table(table, None, {"a": 2}) == frames.table([(b"a", b"b\x02")])
    assert copy_table(struct.pack(">I", 0), None, {}) == struct.pack(">I", 0)


@pytest.mark.parametrize(
    "value",
    [True, 0, -5, 300, 70_000, 2**40, 1.5, Decimal("3.14"), "text ключ", b"\xff\xfe", bytearray(b"\x00"), None,
     datetime(2026, 12, 2, tzinfo=UTC), {"in": [1, "x", {"deep": 2.5}]}, [b"\xff", 3]],
)  # fmt: skip
def test_an_entry_is_encoded_as_pamqp_encodes_a_table(value: Any) -> None:
    """The copy encodes one entry without building and sorting a table per entry: the same bytes."""
    for key in ("k", "ключ", "x" * 200):  # a name over 128 bytes: pamqp's own way (truncated)
        assert copies._entry(key, value) == encode.field_table({key: copies.encodable(value)})[4:]


def test_a_value_pamqp_cannot_encode_is_refused_naming_its_header() -> None:
    with pytest.raises(TypeError, match=r"^odd error: Unknown type"):
        copies._entry("odd", object())


def test_a_copy_whose_entries_outgrow_the_frame_is_refused_though_its_decoded_headers_fit() -> None:
    """The frame check's quick estimate reads the decoded headers: one entry of a name sent three times.

    The received message fits a frame (3 x 40,000 bytes); its quarantine copy, with 16,000 bytes of
    evidence, does not. Unrefused, its content-header frame makes the broker close the connection.
    """
    value = b"S" + frames.long_bytes(b"v" * 40_000)
    delivery = delivery_of([(b"big", value)] * 3)
    headers = dict(delivery.headers)
    headers["amqpjobs-error-traceback"] = "t" * 16_000
    copy = delivery.copy(headers, "job-1")
    properties = amqp_properties(copy)
    assert encoded_size(properties) > DEFAULT_FRAME_MAX
    with pytest.raises(MessageTooLargeError, match=r"over the connection's frame_max of 131072 bytes"):
        check_header_fits(properties, copy.headers, DEFAULT_FRAME_MAX)
