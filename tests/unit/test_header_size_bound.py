"""check_header_fits skips the exact encoding only when the headers surely fit (enq15's finding).

The quick estimate must never be below the encoded size: a header list of 15,000 large ints
encodes to 135,000 bytes (type code and 8 bytes each), over the default frame_max of 131,072,
where an estimate of 2 bytes an item let it through unsized; the broker then closes the whole
connection with FRAME_ERROR instead of the caller getting MessageTooLargeError.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest

from amqpjobs.errors import MessageTooLargeError
from amqpjobs.message import OutgoingMessage
from amqpjobs.wire.limits import DEFAULT_FRAME_MAX, amqp_properties, check_header_fits, encoded_size, header_bound

AT = datetime(2026, 12, 2, tzinfo=UTC)

#: Header shapes whose encoding takes more than DEFAULT_FRAME_MAX bytes, each many small items.
OVER: dict[str, dict[str, Any]] = {
    "large ints": {"big": [2**40] * 15_000},
    "floats": {"f": [0.5] * 27_000},  # pamqp: f, 4 bytes
    "datetimes": {"t": [AT] * 15_000},
    "decimals": {"d": [Decimal("1.5")] * 23_000},
    "empty strings": {"s": [""] * 27_000},
    "empty byte strings": {"b": [b""] * 27_000},
    "empty lists": {"l": [[]] * 27_000},
    "a table of one-letter names to ints": {"m": {f"{i:x}"[-1] + str(i): 2**40 for i in range(11_000)}},
    "many headers of ints": {f"h{i}": 2**40 for i in range(9_000)},
}


def message(headers: dict[str, Any]) -> OutgoingMessage:
    return OutgoingMessage(body=b"{}", headers=headers, message_id="m-1", content_type="application/json")


@pytest.mark.parametrize("name", sorted(OVER))
def test_headers_over_frame_max_are_refused_however_small_their_items(name: str) -> None:
    msg = message(OVER[name])
    properties = amqp_properties(msg)
    size = encoded_size(properties)
    assert size > DEFAULT_FRAME_MAX
    with pytest.raises(MessageTooLargeError) as info:
        check_header_fits(properties, msg.headers, DEFAULT_FRAME_MAX)
    assert f"take {size} bytes" in str(info.value)


def value(rng: random.Random, depth: int = 0) -> Any:
    kinds = ["int", "bigint", "float", "str", "utf8", "bytes", "bool", "none", "time", "decimal"]
    if depth < 3:
        kinds += ["list", "dict"]
    kind = rng.choice(kinds)
    if kind == "list":
        return [value(rng, depth + 1) for _ in range(rng.randrange(5))]
    if kind == "dict":
        return {rng.choice(["", "a", "é", "key"]) + str(i): value(rng, depth + 1) for i in range(rng.randrange(5))}
    return {
        "int": rng.randrange(-(2**31), 2**31), "bigint": rng.randrange(-(2**63), 2**63), "float": rng.random(),
        "str": "x" * rng.randrange(40), "utf8": "é€😀"[: rng.randrange(4)], "bytes": b"\0" * rng.randrange(9),
        "bool": rng.random() < 0.5, "none": None, "time": AT, "decimal": Decimal("-12.75"),
    }[kind]  # fmt: skip


def test_the_bound_is_never_below_the_encoded_size() -> None:
    rng = random.Random(22)
    empty = encoded_size(amqp_properties(message({})))
    for _ in range(3_000):
        headers = {
            rng.choice(["a", "é", "amqpjobs-attempt", "x" * 100]) + str(i): value(rng) for i in range(rng.randrange(6))
        }
        size = encoded_size(amqp_properties(message(headers)))
        assert header_bound(headers) >= size - empty, headers
