"""Every entry of a received header table, decoded, a name that occurs twice included: what ``show`` lists.

The decoded headers (a dict) hold one value per name, the last entry's; ``quarantine show``,
``export`` and the console's message page list every entry of a table that holds more.
"""

from __future__ import annotations

import struct
from decimal import Decimal

from amqpjobs.console.views import message_doc
from amqpjobs.jobs import quarantine as q
from amqpjobs.runtime.quarantine import QuarantinedMessage
from amqpjobs.wire.header_decoding import table_entries
from tests import amqp_frames as frames
from tests.unit.test_copy_table import RECEIVED, delivery_of


def test_table_entries_decodes_every_entry_in_order() -> None:
    assert table_entries(frames.table(RECEIVED)) == [("a", "first"), ("b", 0.5), ("a", 2), ("k\ufffd", "ff"),
                                                     ("k\ufffd", 7)]  # fmt: skip
    nested = frames.table([(b"t", b"F" + frames.table([(b"x", b"D\x02\x00\x00\x01\x3a")])), (b"v", b"V")])
    assert table_entries(nested) == [("t", {"x": Decimal("3.14")}), ("v", None)]
    assert table_entries(struct.pack(">I", 0)) == []


def test_table_entries_refuses_what_it_does_not_read_strictly() -> None:
    for table in (struct.pack(">I", 3) + b"\x01kZ", struct.pack(">I", 9) + b"\x01kS\x00\x00\x00\x09ab",
                  struct.pack(">I", 99), b"\x00"):  # fmt: skip
        assert table_entries(table) is None


def test_a_delivery_gives_every_entry_where_its_headers_hold_one_per_name() -> None:
    delivery = delivery_of(RECEIVED)
    assert delivery.headers == {"a": 2, "b": 0.5, "k\ufffd": 7}
    assert delivery.header_entries() == table_entries(frames.table(RECEIVED))
    assert delivery_of([]).header_entries() == []


def shown(entries: list[tuple[bytes, bytes]]) -> QuarantinedMessage:
    delivery = delivery_of(entries)
    return QuarantinedMessage(delivery, q.describe(delivery.headers, delivery.message_id, delivery.type))


def test_show_lists_every_entry_only_when_a_name_occurs_twice() -> None:
    doc = shown(RECEIVED).to_json()
    assert doc["headers"] == {"a": 2, "b": 0.5, "k\ufffd": 7}
    assert doc["header_entries"] == [["a", "first"], ["b", 0.5], ["a", 2], ["k\ufffd", "ff"], ["k\ufffd", 7]]
    assert "header_entries" not in shown([(b"a", b"b\x01"), (b"b", b"b\x02")]).to_json()


def test_the_console_page_lists_every_entry_by_name() -> None:
    headers = message_doc(shown(RECEIVED))["headers"]
    assert headers == [("a", "first"), ("a", "2"), ("b", "0.5"), ("k\ufffd", "ff"), ("k\ufffd", "7")]
