"""Decoding a received content header (the basic properties) in one pass, as pamqp would.

pamqp decodes a content header property by property and a field table value by value,
each through a lookup, a function call and a slice of the rest of the payload (quadratic
in the number of headers), and our lenient rules (:mod:`amqpjobs.wire.lenient_decoding`)
wrap some of those calls again. On a worker draining small jobs that was about a tenth of
the client's CPU. :func:`decode` reads the same payload with offsets into one ``bytes``,
fixed-size values with precompiled :class:`struct.Struct` s, and gives exactly the values
pamqp gives with those rules installed (the same Python types too):

* a short string or a header name that is not UTF-8: U+FFFD for its bad bytes;
* a timestamp (property or header) in seconds, milliseconds (above ``2**32 - 1``, pamqp's
  rule), microseconds or nanoseconds by the one rule (:mod:`amqpjobs.epochs`), as a UTC
  ``datetime``; 0 (never set) and one that ``datetime`` can't hold even so: None;
* a long string that is not UTF-8: its ``bytes``; a byte array: a ``bytearray``;
* ``I`` signed and ``i`` unsigned 32-bit, ``L`` signed like ``l`` (pamqp's reading of
  RabbitMQ's errata table), ``f`` a 32-bit float widened.

It only decodes what is well formed, strictly: a value running past its table or array,
a string past the payload, an unknown field type, a second word of property flags... and
it returns None, and :func:`unmarshal` leaves the payload to pamqp (:data:`pamqp_unmarshal`),
which decodes or refuses it as it always did (loosely in places: a short string past the
end is cut short). So what a header decodes to never depends on the fast path covering it.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from pamqp.header import ContentHeader

from amqpjobs.epochs import epoch_datetime
from amqpjobs.message import MAX_NESTING

#: pamqp's own ``ContentHeader.unmarshal``, kept before anything replaces it: the fallback.
pamqp_unmarshal: Callable[[ContentHeader, bytes], None] = ContentHeader.unmarshal

#: A decoded content header: class id, weight, body size, and (pamqp attribute name, value)
#: for each property present, in AMQP order.
Decoded = tuple[int, int, int, list[tuple[str, Any]]]

#: Tables and arrays nested deeper than this inside a header's value decode as None (the bytes are still
#: kept for copies): the broker accepts a table hundreds deep, and pamqp's decoding of one (and
#: any of Python's) would exceed the recursion limit, fail the frame, and with it the
#: connection, on every redelivery (a queue stopped by one message).
MAX_DEPTH = MAX_NESTING

_HEAD = struct.Struct(">HHQH")  # class id, weight, body size, the first word of property flags
_UINT32 = struct.Struct(">I")
_INT8 = struct.Struct(">b")
_INT16 = struct.Struct(">h")
_UINT16 = struct.Struct(">H")
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")
_UINT64 = struct.Struct(">Q")
_FLOAT = struct.Struct(">f")
_DOUBLE = struct.Struct(">d")
_DECIMAL = struct.Struct(">Bi")

#: The basic properties in AMQP order: name, flag bit, field kind. pamqp calls ``type``
#: ``message_type``.
PROPERTY_LAYOUT = (
    ("content_type", 0x8000, "shortstr"), ("content_encoding", 0x4000, "shortstr"), ("headers", 0x2000, "table"),
    ("delivery_mode", 0x1000, "octet"), ("priority", 0x0800, "octet"), ("correlation_id", 0x0400, "shortstr"),
    ("reply_to", 0x0200, "shortstr"), ("expiration", 0x0100, "shortstr"), ("message_id", 0x0080, "shortstr"),
    ("timestamp", 0x0040, "timestamp"), ("type", 0x0020, "shortstr"), ("user_id", 0x0010, "shortstr"),
    ("app_id", 0x0008, "shortstr"), ("cluster_id", 0x0004, "shortstr"),
)  # fmt: skip
#: Field kinds as :func:`decode` tells them apart.
_KINDS = {"shortstr": 0, "table": 1, "octet": 2, "timestamp": 3}
#: Flag bits pamqp reads no property for (1: another word of flags follows): left to pamqp.
_OTHER_FLAGS = 0x0003

#: Field value sizes after the type code: fixed ones, and those with a 4-byte length first.
FIXED_SIZES = {b"t": 1, b"b": 1, b"B": 1, b"s": 2, b"u": 2, b"I": 4, b"i": 4, b"l": 8, b"L": 8, b"f": 4,
               b"d": 8, b"D": 5, b"T": 8, b"V": 0}  # fmt: skip
LONG_SIZED = frozenset({b"S", b"x", b"A", b"F"})

_T, _V, _NUL = ord("t"), ord("V"), 0
_LONG_STRING, _TABLE, _ARRAY, _BYTES, _TIME = ord("S"), ord("F"), ord("A"), ord("x"), ord("T")
_LONG_CODES = frozenset(code[0] for code in LONG_SIZED)  # the same, as ints (a byte of the payload)
#: Fixed-size numbers: type code -> (struct, size).
_FIXED: dict[int, tuple[struct.Struct, int]] = {
    code[0]: (number, FIXED_SIZES[code])
    for code, number in [
        (b"b", _INT8), (b"B", struct.Struct(">B")), (b"s", _INT16), (b"u", _UINT16), (b"I", _INT32),
        (b"i", _UINT32), (b"l", _INT64), (b"L", _INT64), (b"f", _FLOAT), (b"d", _DOUBLE),
    ]
}  # fmt: skip


@functools.cache  # one entry per set of properties seen: at most 2**14
def _present(flags: int) -> tuple[tuple[str, int], ...]:
    """The attribute name (pamqp's) and kind of each property ``flags`` says is present, in AMQP order."""
    present = (name for name, flag, _ in PROPERTY_LAYOUT if flags & flag)
    kinds = {name: _KINDS[kind] for name, _, kind in PROPERTY_LAYOUT}
    return tuple(("message_type" if name == "type" else name, kinds[name]) for name in present)


class _NotHere(Exception):
    """The payload is not one :func:`decode` reads (pamqp decides)."""


#: An AMQP timestamp (the raw 64-bit integer) as an aware UTC datetime by the one rule of units
#: (:func:`amqpjobs.epochs.epoch_datetime`: s, ms, µs or ns), None past the year 9999.
_timestamp = epoch_datetime


def _value(data: bytes, code: int, offset: int, end: int, depth: int) -> tuple[Any, int]:
    """The field value of type ``code`` at ``offset``, and the offset after it (at most ``end``).

    ``depth``: how many tables and arrays inside the headers hold it; a table or array inside
    :data:`MAX_DEPTH` of them is None.
    """
    fixed = _FIXED.get(code)
    if fixed is not None:
        after = offset + fixed[1]
        if after > end:
            raise _NotHere
        return fixed[0].unpack_from(data, offset)[0], after
    if code in _LONG_CODES:  # a 4-byte length, then that many bytes
        if offset + 4 > end:
            raise _NotHere
        after = offset + 4 + _UINT32.unpack_from(data, offset)[0]
        if after > end:
            raise _NotHere
        if code == _LONG_STRING:
            raw = data[offset + 4 : after]
            try:
                return raw.decode("utf-8"), after
            except UnicodeDecodeError:
                return raw, after
        if code == _BYTES:
            return bytearray(data[offset + 4 : after]), after
        if depth >= MAX_DEPTH:
            return None, after
        return (_table if code == _TABLE else _array)(data, offset + 4, after, depth + 1), after
    if code == _T:
        if offset + 1 > end:
            raise _NotHere
        return data[offset] != 0, offset + 1
    if code == _TIME:
        if offset + 8 > end:
            raise _NotHere
        return _timestamp(_UINT64.unpack_from(data, offset)[0]), offset + 8
    if code in (_V, _NUL):
        return None, offset
    if code == ord("D"):
        if offset + 5 > end:
            raise _NotHere
        places, raw_value = _DECIMAL.unpack_from(data, offset)
        return Decimal(raw_value) * (Decimal(10) ** -places), offset + 5
    raise _NotHere  # a type pamqp refuses (pamqp says which)


def _table(data: bytes, offset: int, end: int, depth: int = 0) -> dict[str, Any]:
    """The field table whose entries are ``data[offset:end]``, in ``depth`` tables and arrays (0: the headers)."""
    table: dict[str, Any] = {}
    while offset < end:
        key_end = offset + 1 + data[offset]
        if key_end >= end:  # no room for the type code
            raise _NotHere
        key = data[offset + 1 : key_end].decode("utf-8", "replace")
        code = data[key_end]
        offset = key_end + 1
        if code == _LONG_STRING:  # the common case, inline
            if offset + 4 > end:
                raise _NotHere
            after = offset + 4 + _UINT32.unpack_from(data, offset)[0]
            if after > end:
                raise _NotHere
            raw = data[offset + 4 : after]
            try:
                table[key] = raw.decode("utf-8")
            except UnicodeDecodeError:
                table[key] = raw
            offset = after
        elif (fixed := _FIXED.get(code)) is not None:  # integers, floats: inline too
            after = offset + fixed[1]
            if after > end:
                raise _NotHere
            table[key] = fixed[0].unpack_from(data, offset)[0]
            offset = after
        else:
            table[key], offset = _value(data, code, offset, end, depth)
    return table


def _array(data: bytes, offset: int, end: int, depth: int) -> list[Any]:
    """The field array whose values are ``data[offset:end]``, in ``depth`` tables and arrays (itself included)."""
    array = []
    while offset < end:
        value, offset = _value(data, data[offset], offset + 1, end, depth)
        array.append(value)
    return array


def decode(payload: bytes) -> Decoded | None:
    """A content-header frame payload decoded, as pamqp decodes it with our lenient rules.

    Args:
        payload: The frame payload: class id, weight, body size, property flags, property list.

    Returns:
        ``(class_id, weight, body_size, [(property, value), ...])`` with pamqp's attribute
        names (``message_type`` for ``type``) for the properties present, in AMQP order; or
        None: the payload is not one this reads strictly (truncated, an unknown field type,
        a value past its table's end, more flag words), and pamqp is to decode or refuse it.
        Never raises.
    """
    size = len(payload)
    if size < 14:
        return None
    class_id, weight, body_size, flags = _HEAD.unpack_from(payload)
    if flags & _OTHER_FLAGS:
        return None
    offset, properties = 14, []
    try:
        for name, kind in _present(flags):
            if kind == 0:
                after = offset + 1 + payload[offset]
                if after > size:
                    return None
                value: Any = payload[offset + 1 : after].decode("utf-8", "replace")
            elif kind == 1:
                if offset + 4 > size:
                    return None
                after = offset + 4 + _UINT32.unpack_from(payload, offset)[0]
                if after > size:
                    return None
                value = _table(payload, offset + 4, after)
            elif kind == 2:
                after = offset + 1
                value = payload[offset]
            else:
                after = offset + 8
                if after > size:
                    return None
                value = _timestamp(_UINT64.unpack_from(payload, offset)[0])
            properties.append((name, value))
            offset = after
    except (_NotHere, IndexError, RecursionError):
        return None
    return class_id, weight, body_size, properties


def table_entries(table: bytes) -> list[tuple[str, Any]] | None:
    """Every entry of an encoded field table, in its order, decoded as :func:`decode` decodes headers.

    A name that occurs twice is two entries (a decoded table, a dict, holds the last).

    Args:
        table: The table as a property list holds it: its 4-byte length, then its entries.

    Returns:
        ``[(name, value), ...]``, or None: not a table this reads strictly. Never raises.
    """
    try:
        end = 4 + _UINT32.unpack_from(table)[0]
        if end > len(table):
            return None
        offset, out = 4, []
        while offset < end:
            key_end = offset + 1 + table[offset]
            if key_end >= end:
                return None
            value, after = _value(table, table[key_end], key_end + 1, end, 0)
            out.append((table[offset + 1 : key_end].decode("utf-8", "replace"), value))
            offset = after
        return out
    except (_NotHere, IndexError, RecursionError, struct.error):
        return None


def unmarshal(header: ContentHeader, payload: bytes) -> None:
    """Decode ``payload`` into ``header`` (a fresh one), as pamqp's ``ContentHeader.unmarshal`` does.

    The fast way (:func:`decode`) when it reads the payload; else pamqp's own, which raises
    what it always raised for a payload it can't decode.

    Raises:
        struct.error: the payload is shorter than 12 bytes (pamqp).
        ValueError: truncated or malformed (pamqp).
    """
    decoded = decode(payload)
    if decoded is None:
        pamqp_unmarshal(header, payload)
        return
    header.class_id, header.weight, header.body_size, properties = decoded  # type: ignore[assignment]
    target = header.properties
    for name, value in properties:
        setattr(target, name, value)
