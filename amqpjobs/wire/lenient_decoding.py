"""Frame decoding that survives what publishers we don't control send.

pamqp decodes an AMQP ``timestamp`` (property or header value) into a ``datetime``. A
publisher that sends microseconds (or any value past year 9999) makes that conversion
raise, aiormq then fails the whole content-header frame and closes the connection, and
the worker reconnects only to receive the same message again: one bad message stops a
queue. :func:`install_lenient_decoding` makes a timestamp decode by the one rule of units
(:mod:`amqpjobs.epochs`: seconds, milliseconds, microseconds or nanoseconds, as
:mod:`amqpjobs.wire.header_decoding` does), and one past the year 9999 even so as ``None``
(the 8 bytes are still consumed), so the message reaches the worker and is handled.

The same goes for a short string (``type``, ``message_id``, ``content_type``, the routing
key, ...) that is not UTF-8: pamqp raises ``UnicodeDecodeError`` and the frame is lost with
the connection. :func:`install_lenient_decoding` also makes those decode with U+FFFD for
the bytes that are not UTF-8, so the message is quarantined (say, as an unknown job) with
evidence instead; header names (table keys) likewise.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from pamqp import decode

from amqpjobs.epochs import epoch_datetime

_UINT64 = struct.Struct(">Q")

_original: Callable[[bytes], tuple[int, Any]] | None = None


def _lenient_timestamp(value: bytes) -> tuple[int, Any]:
    """The 8 bytes of an AMQP timestamp by the one rule of units (:func:`~amqpjobs.epochs.epoch_datetime`).

    Raises:
        ValueError: fewer than 8 bytes (pamqp's own error for a truncated value).
    """
    assert _original is not None
    if len(value) < 8:
        return _original(value)  # raises, as it always did
    return 8, epoch_datetime(_UINT64.unpack_from(value)[0])


_original_short_str: Callable[[bytes], tuple[int, str]] = decode.short_str


def _lenient_short_str(value: bytes) -> tuple[int, str]:
    try:
        return _original_short_str(value)
    except UnicodeDecodeError:
        length = value[0]
        return length + 1, value[1 : length + 1].decode("utf-8", "replace")


_original_field_table: Callable[[bytes], tuple[int, Any]] = decode.field_table


def _lenient_field_table(value: bytes) -> tuple[int, Any]:
    """Pamqp's table decoding, except that a key that is not UTF-8 gets U+FFFD for its bad bytes.

    An AMQP field table: a 4-byte length, then entries of (1-byte key length, key, typed
    value). Tried the fast way first; only a table that fails on a key is walked here.
    """
    try:
        return _original_field_table(value)
    except UnicodeDecodeError:
        pass
    length = int.from_bytes(value[0:4], "big")
    end = 4 + length
    if end > len(value):
        raise ValueError("Field table length exceeds available data")
    offset, table = 4, {}
    while offset < end:
        key_length = value[offset]
        key = value[offset + 1 : offset + 1 + key_length].decode("utf-8", "replace")
        offset += 1 + key_length
        consumed, item = decode.embedded_value(value[offset:])
        offset += consumed
        table[key] = item
    return end, table


def install_lenient_decoding() -> None:
    """Make pamqp forgiving where one bad message would fail a whole frame (idempotent).

    An out-of-range timestamp decodes as ``None``; a short string or a header name that is
    not UTF-8 decodes with replacement characters.
    """
    global _original
    if _original is not None:
        return
    _original = decode.timestamp
    decode.METHODS["timestamp"] = _lenient_timestamp
    decode.TABLE_MAPPING[b"T"] = _lenient_timestamp
    decode.METHODS["shortstr"] = _lenient_short_str
    decode.short_str = _lenient_short_str
    decode.METHODS["table"] = _lenient_field_table
    decode.TABLE_MAPPING[b"F"] = _lenient_field_table
    decode.field_table = _lenient_field_table
