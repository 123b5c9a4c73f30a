"""Encoding a new message's basic properties in one pass, exactly as pamqp would.

pamqp encodes ``Basic.Properties`` property by property, each through ``getattr``, a
type-name lookup and an encoder chosen by that name, and the header table value by value
the same way; for the properties of one enqueued job that is about 9 µs, a few per cent of
an enqueue's CPU (bench/ section 3). :func:`exact_properties` writes the same bytes
directly for what ``enqueue`` sends (short strings, a table of text, integer and boolean
headers, the persistent ``delivery_mode``, a priority, a timestamp) and hands them to aiormq
as :class:`~amqpjobs.wire.copies.ExactProperties`. The rules it follows are pamqp's
(``pamqp.base.BasicProperties.marshal``, ``pamqp.encode``):

* a property that is None or ``""`` is left out (its flag not set); a table is always sent
  (an empty one as four zero bytes);
* the table sorted by name; an integer in the narrowest of pamqp's field types
  (``pamqp.encode.table_integer``, itself called), a ``bool`` as ``t``, a ``str`` as ``S``;
* the timestamp as ``int(datetime.fromtimestamp(t, UTC).timestamp())``, big-endian 64 bits.

Anything else (a header value of another type, a key that is not a ``str`` or is over 128
bytes, a string over its length or not UTF-8, a priority outside 0-255, a timestamp that
``datetime`` rounds up to the next second or can't hold, no ``message_id``) is left to
pamqp: :func:`exact_properties` returns None and the publish encodes
:func:`~amqpjobs.wire.limits.amqp_properties` as it always did, refusing what it refuses. So
the bytes on the wire never depend on which path encoded them (``tests/unit/test_property_encoding.py``).
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Mapping
from typing import Any, Final

from pamqp.encode import table_integer

from amqpjobs.message import OutgoingMessage
from amqpjobs.wire.as_was import AsItWas
from amqpjobs.wire.copies import ExactProperties, ReceivedCopy
from amqpjobs.wire.header_decoding import PROPERTY_LAYOUT

_FLAGS = struct.Struct(">H")
_UINT32 = struct.Struct(">I")
_UINT64 = struct.Struct(">Q")
_CONTENT_TYPE, _CONTENT_ENCODING, _HEADERS, _DELIVERY_MODE, _PRIORITY, _CORRELATION_ID, _REPLY_TO = (
    flag for _, flag, _ in PROPERTY_LAYOUT[:7]
)
_MESSAGE_ID, _TIMESTAMP, _TYPE = (flag for _, flag, _ in PROPERTY_LAYOUT[8:11])
_APP_ID = PROPERTY_LAYOUT[12][1]
#: ``delivery_mode`` 2 (persistent), as every new message carries it.
_PERSISTENT: Final = b"\x02"
_EMPTY_TABLE: Final = b"\x00\x00\x00\x00"
#: Latest timestamp (s) encoded here: the last second of the year 9999 (``datetime``'s range).
_LATEST: Final = 253_402_300_799


class _Unusual(Exception):
    """A value :func:`exact_properties` leaves to pamqp."""


def _short(value: object) -> bytes:
    if type(value) is not str:
        raise _Unusual
    try:
        raw = value.encode("utf-8")
    except UnicodeEncodeError:
        raise _Unusual from None
    if len(raw) > 255:
        raise _Unusual
    return bytes((len(raw),)) + raw


#: :func:`_short` of what repeats from job to job (content type, job name, app id), looked up.
_short_repeated = functools.lru_cache(maxsize=1024, typed=True)(_short)


@functools.lru_cache(maxsize=1024, typed=True)  # header names repeat: ours on every job
def _name(key: str) -> bytes:
    if type(key) is not str:
        raise _Unusual
    name = key.encode("utf-8")  # a key that is not UTF-8 raises: left to pamqp
    if len(name) > 128:  # pamqp cuts it (with a warning)
        raise _Unusual
    return bytes((len(name),)) + name


def _table(headers: Mapping[str, Any]) -> bytes:
    entries: list[bytes] = []
    for key in sorted(headers):  # pamqp sorts the items: with str keys, by name
        value = headers[key]
        kind = type(value)
        if kind is str:
            raw = value.encode("utf-8")
            entries += (_name(key), b"S", _UINT32.pack(len(raw)), raw)
        elif kind is int:
            entries += (_name(key), table_integer(value))  # TypeError beyond 64 bits
        elif kind is bool:
            entries += (_name(key), b"t\x01" if value else b"t\x00")
        else:
            raise _Unusual
    body = b"".join(entries)
    return _UINT32.pack(len(body)) + body


def _present(value: object) -> bool:
    """Whether pamqp sends a property holding ``value``: not None, not ``""`` (any other value, even falsy)."""
    return value is not None and value != ""


def _timestamp(value: float) -> bytes:
    if type(value) is not float and type(value) is not int:
        raise _Unusual
    whole = int(value)  # NaN, infinity: ValueError, OverflowError
    if not value >= 0 or whole > _LATEST or value - whole >= 0.999:  # datetime may round it up a second: pamqp's
        raise _Unusual
    return _UINT64.pack(whole)


def exact_properties(message: OutgoingMessage) -> ExactProperties | None:
    """The basic properties of new message ``message``, encoded as pamqp would; None: leave them to pamqp.

    The same bytes as ``amqp_properties(message).marshal()``
    (:func:`~amqpjobs.wire.limits.amqp_properties`) whenever it returns them; None for a copy
    of a received message, a message put back as it was and anything the module docstring lists.
    """
    if isinstance(message, ReceivedCopy | AsItWas) or not message.message_id:
        return None
    try:
        flags, parts = _HEADERS | _DELIVERY_MODE | _MESSAGE_ID, []
        if _present(text := message.content_type):
            flags |= _CONTENT_TYPE
            parts.append(_short_repeated(text))
        if _present(text := message.content_encoding):
            flags |= _CONTENT_ENCODING
            parts.append(_short_repeated(text))
        headers = message.headers
        if not isinstance(headers, Mapping):  # None or "": pamqp sends no table at all
            raise _Unusual
        parts += (_table(headers) if headers else _EMPTY_TABLE, _PERSISTENT)
        if (priority := message.priority) is not None:
            if type(priority) is not int or not 0 <= priority <= 255:
                raise _Unusual
            flags |= _PRIORITY
            parts.append(bytes((priority,)))
        if _present(text := message.correlation_id):
            flags |= _CORRELATION_ID
            parts.append(_short(text))
        if _present(text := message.reply_to):
            flags |= _REPLY_TO
            parts.append(_short(text))
        parts.append(_short(message.message_id))
        if message.timestamp is not None:
            flags |= _TIMESTAMP
            parts.append(_timestamp(message.timestamp))
        if _present(text := message.type):
            flags |= _TYPE
            parts.append(_short_repeated(text))
        if _present(text := message.app_id):
            flags |= _APP_ID
            parts.append(_short_repeated(text))
    except (_Unusual, TypeError, ValueError, OverflowError, struct.error):  # pamqp's integer rule: TypeError
        return None
    return ExactProperties(_FLAGS.pack(flags) + b"".join(parts), message.message_id)


def timestamp_field(when: float) -> bytes | None:
    """The ``timestamp`` property's 8 bytes for ``when`` (epoch seconds) as :func:`exact_properties` writes them.

    None where it leaves the timestamp to pamqp (a fraction pamqp's ``datetime`` may round up
    to the next second, NaN, before 1970 or after 9999).
    """
    try:
        return _timestamp(when)
    except (_Unusual, ValueError, OverflowError):
        return None


class PropertyStencil:
    """:func:`exact_properties` of messages alike but for ``message_id``, ``timestamp`` and one header's text.

    A publisher sending many messages of one kind (the sync publisher's fast path: one job's
    fresh messages without options) encodes the properties once and then only puts the three
    values in their places: the same bytes as :func:`exact_properties`, a fraction of its work.
    Build with :meth:`of`; :meth:`fill` gives the bytes or None (then encode the message itself).
    """

    def __init__(self, parts: tuple[bytes, bytes, bytes, bytes], width: int) -> None:
        self._parts = parts
        self._width = width  # UTF-8 bytes of the header's text: its table's size is fixed

    @classmethod
    def of(cls, sample: OutgoingMessage, header: str, other: OutgoingMessage) -> PropertyStencil | None:
        """The stencil of ``sample``'s kind, or None when it can't be sure of the bytes.

        Args:
            sample: One message of the kind; its ``message_id``, ``timestamp`` and text header
                ``header`` must each be found exactly once in its encoding.
            header: The name of the header whose text varies (always as many UTF-8 bytes).
            other: ``sample`` with other values of those three (a ``message_id`` of another
                length): the stencil is kept only if it fills in ``other``'s exactly.
        """
        encoded = exact_properties(sample)
        text = sample.headers.get(header)
        if encoded is None or sample.timestamp is None or type(text) is not str:
            return None
        try:
            raw = text.encode("utf-8")
            fields = (b"S" + _UINT32.pack(len(raw)) + raw, _short(sample.message_id), _timestamp(sample.timestamp))
        except (_Unusual, UnicodeEncodeError, ValueError, OverflowError):
            return None
        data = encoded.encoded
        if any(data.count(field) != 1 for field in fields):
            return None
        at = [data.index(field) for field in fields]
        if not at[0] < at[1] < at[2]:  # pamqp's order: headers, message_id, timestamp
            return None
        ends = [where + len(field) for where, field in zip(at, fields, strict=True)]
        stencil = cls((data[: at[0] + 5], data[ends[0] : at[1]], data[ends[1] : at[2]], data[ends[2] :]), len(raw))
        check, again = exact_properties(other), other.headers.get(header)
        if check is None or other.timestamp is None or type(again) is not str or other.message_id is None:
            return None
        if stencil.fill(other.message_id, other.timestamp, again) != check.encoded:
            return None
        return stencil

    def fill(self, message_id: str, timestamp: float, text: str) -> bytes | None:
        """The encoded properties with these values; None: a value :func:`exact_properties` would not take as is.

        ``text`` must be as many UTF-8 bytes as the sample's (else None).
        """
        try:
            short, raw = _short(message_id), text.encode("utf-8")
        except (_Unusual, UnicodeEncodeError):
            return None
        if len(raw) != self._width or (stamp := timestamp_field(timestamp)) is None:
            return None
        head, between, after, tail = self._parts
        return b"".join((head, raw, between, short, after, stamp, tail))
