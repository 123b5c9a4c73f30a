"""Header values of every AMQP field type, byte by byte, for the hostile-header tests.

aio-pika (pamqp) sends a Python float as ``f``, can't send a ``d`` double, an unsigned
``i``/``B``/``u`` of a small value or a timestamp of our choosing, so each value is
encoded here with pamqp's per-type encoders and published as a raw content header
(:class:`tests.amqp_frames.RawProperties`).

The data file (``tests/data/bad-messages.jsonl``) writes a typed header value as the
string ``<amqp:CODE:VALUE>``: ``CODE`` one AMQP field type (``t b B s u I i l f d D S x A T
F V``), ``VALUE`` its literal (``d:1e300``, ``D:2`` a decimal of scale 0, ``x:HEX``, ``T:``
seconds, ``A:N`` an array of N empty tables, ``F:N`` tables nested N deep, ``V:``).
"""

from __future__ import annotations

import struct
from decimal import Decimal
from typing import Any

from pamqp import encode

from tests.amqp_frames import RawProperties, encode_properties, long_bytes, short_bytes, table

#: The AMQP field types of a header value (RabbitMQ's table types).
CODES = "tbBsuIilfdDSxATFV"
#: How amqpjobs names a decoded value of each type (:func:`amqpjobs.jobs.header_values.amqp_type`).
KIND = {"t": "a boolean", **dict.fromkeys("bBsuIil", "an integer"), "f": "a float", "d": "a float",
        "D": "a decimal", "S": "a string", "x": "a byte array", "A": "an array", "T": "a timestamp",
        "F": "a table", "V": "void"}  # fmt: skip


def nested(depth: int) -> bytes:
    """A field value: a table nested ``depth`` deep (``F`` in ``F`` ... the innermost empty)."""
    inner = b"F" + table([])
    for _ in range(depth - 1):
        inner = b"F" + table([(b"n", inner)])
    return inner


def typed(code: str, literal: str) -> bytes:
    """The field value (type code + bytes) of ``literal`` as AMQP type ``code``."""
    packers = {"b": ">b", "B": ">B", "s": ">h", "u": ">H", "I": ">i", "i": ">I", "l": ">q", "f": ">f", "d": ">d"}
    if code in "bBsuIil":
        return code.encode() + struct.pack(packers[code], int(literal))
    if code in "fd":
        return code.encode() + struct.pack(packers[code], float(literal))
    if code == "t":
        return b"t" + encode.boolean(literal.lower() in ("1", "true"))
    if code == "D":
        return b"D" + encode.decimal(Decimal(literal))
    if code == "S":
        return b"S" + encode.long_string(literal)
    if code == "x":
        return b"x" + long_bytes(bytes.fromhex(literal))
    if code == "T":
        return b"T" + struct.pack(">Q", int(literal))
    if code == "A":
        return b"A" + long_bytes((b"F" + table([])) * int(literal or 0))
    if code == "F":
        return nested(int(literal or 1))
    if code == "V":
        return b"V"
    raise ValueError(f"unknown AMQP field type {code!r}")


def value_bytes(value: Any) -> bytes:
    """A header value from the data file: a ``<amqp:CODE:VALUE>`` marker, or a JSON value as pamqp encodes it."""
    if isinstance(value, str) and value.startswith("<amqp:") and value.endswith(">"):
        code, _, literal = value[len("<amqp:") : -1].partition(":")
        return typed(code, literal)
    if isinstance(value, str) and value.startswith("<bytes:") and value.endswith(">"):
        return b"x" + long_bytes(bytes.fromhex(value[len("<bytes:") : -1]))
    if isinstance(value, dict):
        return b"F" + table([(k.encode(), value_bytes(v)) for k, v in value.items()])
    if isinstance(value, list):
        return b"A" + long_bytes(b"".join(value_bytes(v) for v in value))
    return encode.encode_table_value(value)


def raw_properties(props: dict[str, Any], headers: list[tuple[bytes, bytes]] | None) -> RawProperties:
    """A content header of exactly these properties (``timestamp``: raw seconds; ``priority``: 0-255)."""
    values: dict[str, bytes] = {"delivery_mode": b"\x02"}
    for name in ("content_type", "content_encoding", "message_id", "type", "expiration", "correlation_id"):
        if props.get(name) is not None:
            values[name] = short_bytes(str(props[name]).encode())
    if props.get("priority") is not None:
        values["priority"] = bytes([int(props["priority"])])
    if props.get("timestamp") is not None:
        values["timestamp"] = struct.pack(">Q", int(props["timestamp"]))
    if headers is not None:
        values["headers"] = table(headers)
    return RawProperties(encode_properties(values), message_id=str(props.get("message_id", "")))
