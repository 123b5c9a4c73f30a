"""Copies of a received message that keep its headers and properties byte for byte.

A copy (to a delay tier, to quarantine, replayed) must carry the publisher's headers and
properties as they came. Re-encoding pamqp's decoded values can't: pamqp encodes a Python
value by its Python type, so a double goes out as a 32-bit float (``1.1`` comes back as
``1.100000023841858``), an integer in the narrowest width (``I`` 128 becomes ``s``), a
timestamp sent in milliseconds, microseconds or nanoseconds comes back in seconds, one past the
year 9999 (decoded as None, :mod:`amqpjobs.wire.lenient_decoding`) as void, a string that is not UTF-8 as a byte
array, a header name that is not UTF-8 with U+FFFD, and the table is sorted by name.

A decoded table also holds one value per name, where the received table may hold more
entries: a name that occurs twice (another publisher's doing), or two names that are not
UTF-8 and read alike.

So the bytes of every content header received are kept (one reference, no decoding:
:func:`keep_received_properties`), and a copy is encoded from them
(:func:`copy_properties`, :func:`copy_table`): the received header table is walked entry by
entry, and every entry of a header the copy left as received goes out with its own name
bytes, type code and value bytes, in the received order, all entries of a name that occurs
twice included; only the headers the copy sets or changes (ours, ``amqpjobs-*``) are
encoded anew (once, in the place of the name's first entry; new ones last), and the ones
it left out (the broker's ``x-death`` & co) are gone, every entry of them. "Received"
means as the broker delivered it: RabbitMQ 3.10 passes a published table through as it
came, but re-encodes a dead-lettered one (a retry back from its delay tier) in name order,
entries of one name kept in their order; RabbitMQ 4.0.5 re-encodes every table it delivers
in name order and keeps only the first entry of a name that occurs twice (names whose bytes
differ stay apart). What the broker dropped, a copy can't carry. Every property goes out as
received, except:

* ``headers``: as above;
* ``message_id``: set to the job id when the message came without one (so every copy of
  a job carries the same id);
* ``timestamp``: when the copy becomes ready in its work queue, if the copy says so
  (``ready_at``: a retry or replayed copy); else as received;
* ``expiration``: dropped. A per-message TTL was the publisher's limit on waiting in the
  work queue; kept on a copy, it would expire the copy in a delay tier (back early) or in
  quarantine (lost).
* ``user_id``: dropped. The broker refuses a publish whose ``user_id`` is not the
  publishing connection's user (``PRECONDITION_FAILED``, closing the channel), and a
  worker or a replay may well connect as another user than the original publisher.
* ``delivery_mode``: 2 (persistent), whatever was received. A job another stack published
  transient (1, or none) would stay transient in its retry tier, quarantine, suspects or
  parked queue, and a broker restart empties a durable classic queue of its transient
  messages: the quarantine would lose what it holds (measured on 3.10).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pamqp import commands, encode
from pamqp.header import ContentHeader

from amqpjobs.message import OUR_PREFIX, OutgoingMessage
from amqpjobs.wire import header_decoding
from amqpjobs.wire.header_decoding import FIXED_SIZES, LONG_SIZED, PROPERTY_LAYOUT
from amqpjobs.wire.lenient_decoding import install_lenient_decoding

#: Attribute of a received pamqp ContentHeader holding its frame payload (class id, weight,
#: body size, flags, property list), as received.
_RECEIVED = "_amqpjobs_received"
#: Bytes before the property flags in a content-header payload: class id, weight, body size.
_PREFIX = 12

#: Properties a copy never carries (see the module docstring).
DROPPED = frozenset({"expiration", "user_id"})
#: The ``delivery_mode`` of every copy (see the module docstring): persistent.
PERSISTENT = b"\x02"


def _unmarshal_keeping_bytes(self: ContentHeader, data: bytes) -> None:
    header_decoding.unmarshal(self, data)
    setattr(self, _RECEIVED, data)


def keep_received_properties() -> None:
    """Make every content header pamqp decodes keep its bytes, for exact copies (idempotent).

    Costs one attribute per delivery; nothing is parsed until a copy is made. The header
    itself is decoded by :func:`amqpjobs.wire.header_decoding.unmarshal` (pamqp's values,
    faster), with the lenient rules it follows installed for pamqp too
    (:func:`~amqpjobs.wire.lenient_decoding.install_lenient_decoding`).
    """
    install_lenient_decoding()
    ContentHeader.unmarshal = _unmarshal_keeping_bytes  # type: ignore[method-assign]


def received_bytes(content_header: ContentHeader) -> bytes | None:
    """The payload ``content_header`` was decoded from, or None (not received, or not kept)."""
    raw: bytes | None = getattr(content_header, _RECEIVED, None)
    return raw


def split_properties(payload: bytes) -> dict[str, bytes]:
    """Each present property's encoded bytes, by name (``type`` is pamqp's ``message_type``).

    Args:
        payload: A content-header frame payload, as received.

    Raises:
        ValueError: the payload is truncated.
    """
    if len(payload) < _PREFIX + 2:
        raise ValueError("content header truncated")
    (flags,) = struct.unpack_from(">H", payload, _PREFIX)
    offset, out = _PREFIX + 2, {}
    for name, flag, kind in PROPERTY_LAYOUT:
        if not flags & flag:
            continue
        if kind == "shortstr":
            size = 1 + payload[offset]
        elif kind == "table":
            size = 4 + int.from_bytes(payload[offset : offset + 4], "big")
        else:
            size = 1 if kind == "octet" else 8
        if offset + size > len(payload):
            raise ValueError(f"content header truncated in property {name}")
        out[name] = payload[offset : offset + size]
        offset += size
    return out


def split_table(table: bytes) -> list[tuple[str, bytes]]:
    """Every entry of an encoded field table, in its order: (name as decoded, the entry's bytes).

    An entry's bytes are its name (length and bytes), type code and value, as in the table.
    A name that occurs twice is two entries, and so are two names that are not UTF-8 and
    read alike (U+FFFD for the bad bytes, as :mod:`amqpjobs.wire.lenient_decoding` decodes
    them): a decoded table (a dict) keeps one of them, this keeps both.

    Raises:
        ValueError: an unknown type code, or a table shorter than its length says.
    """
    end = 4 + int.from_bytes(table[:4], "big")
    if end > len(table):
        raise ValueError("field table truncated")
    offset, out = 4, []
    while offset < end:
        at = offset + 1 + table[offset]  # the type code
        code = table[at : at + 1]
        size = FIXED_SIZES.get(code)
        if size is None:
            if code not in LONG_SIZED:
                raise ValueError(f"unknown field type {code!r}")
            size = 4 + int.from_bytes(table[at + 1 : at + 5], "big")
        after = at + 1 + size
        if after > end:
            raise ValueError("field table entry truncated")
        out.append((table[offset + 1 : at].decode("utf-8", "replace"), table[offset:after]))
        offset = after
    return out


def encodable(value: Any) -> Any:
    """``value`` with ``bytes`` turned into ``bytearray`` (an AMQP byte array), at any depth.

    pamqp decodes a header string that is not UTF-8 as ``bytes`` but can't encode ``bytes``
    back; a header set to such a value keeps its exact bytes this way.
    """
    if isinstance(value, bytes):
        return bytearray(value)
    if isinstance(value, Mapping):
        return {k: encodable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [encodable(v) for v in value]
    return value


def _entry(key: str, value: Any) -> bytes:
    """One field table entry (name, type code, value) encoded by pamqp, as ``encode.field_table`` would."""
    if len(key.encode("utf-8")) > 128:  # pamqp truncates it (and warns): its own way
        return encode.field_table({key: encodable(value)})[4:]
    try:
        return encode.short_string(key) + encode.encode_table_value(encodable(value))
    except TypeError as err:
        raise TypeError(f"{key} error: {err}") from err


_MISSING = object()


def copy_table(received: bytes, received_headers: Mapping[str, Any] | None, headers: Mapping[str, Any]) -> bytes:
    """The encoded header table (length first) of a copy of a received message.

    Walks the received table entry by entry, in its order (:func:`split_table`): an entry
    whose name the copy left as received (``headers`` holds the very object decoded for
    it, ``is``) goes out as received, name, type code and value bytes; every entry of a
    name that occurs twice (or of names that decode alike) does. A name the copy changed
    goes out once, encoded anew, at its first entry's place; a name the copy left out is
    gone. Names that are new go last, in ``headers`` order. A header of ours (``amqpjobs-*``)
    goes out once whatever the received table held: the value the worker read (the last
    entry, the decoded one) as received when the copy kept it, at the name's first place;
    ``is`` can't tell a value set anew that is the very object decoded (a small ``int`` or
    ``""`` CPython shares) from one kept, and a stale entry of ours ahead of it would be
    what RabbitMQ 4.x reads (it keeps the first entry of a name twice).

    Args:
        received: The received table, as :func:`split_properties` gives it (length first).
        received_headers: That table as decoded (one value per name), or None.
        headers: The copy's headers.

    Raises:
        ValueError: ``received`` is not a well-formed table.
        TypeError: a header value pamqp can't encode.
    """
    decoded = received_headers or {}
    entries = split_table(received)
    last = {key: raw for key, raw in entries if key.startswith(OUR_PREFIX)}  # of ours: the entry decoded
    parts, kept = [], set()
    for key, raw in entries:
        value = headers.get(key, _MISSING)
        if value is _MISSING:
            continue
        if key in last:
            if key not in kept:
                parts.append(last[key] if value is decoded.get(key, _MISSING) else _entry(key, value))
        elif value is decoded.get(key, _MISSING):
            parts.append(raw)
        elif key not in kept:
            parts.append(_entry(key, value))
        kept.add(key)
    parts.extend(_entry(key, value) for key, value in headers.items() if key not in kept)
    body = b"".join(parts)
    return struct.pack(">I", len(body)) + body


def copy_properties(
    received: bytes,
    received_headers: Mapping[str, Any] | None,
    headers: Mapping[str, Any],
    message_id: str,
    timestamp: int | None = None,
) -> bytes:
    """The encoded property list (flags and values) of a copy of a received message.

    Args:
        received: The content-header payload the message came with (:func:`received_bytes`).
        received_headers: Its headers as pamqp decoded them (never handed out, so unchanged).
        headers: The copy's headers. A value that is the very object decoded (``is``) goes
            out as received, every entry of its name; any other is encoded by pamqp (bytes
            as a byte array), once (:func:`copy_table`).
        message_id: The copy's ``message_id``; encoded anew only if the message had none (or an empty or
            blank one, which names no job: the worker gave the job an id of its own).
        timestamp: The copy's ``timestamp`` (whole seconds since the epoch), or None: as received.

    ``delivery_mode`` is always 2 (persistent), also for a message received transient.

    Raises:
        ValueError: ``received`` is not a well-formed content header.
        TypeError: a header value pamqp can't encode.
    """
    props = split_properties(received)
    props["headers"] = copy_table(props.get("headers", b"\0\0\0\0"), received_headers, headers)
    if not props.get("message_id", b"\x00")[1:].decode("utf-8", "replace").strip():  # none, empty or blank
        props["message_id"] = encode.short_string(message_id)
    if timestamp is not None:
        props["timestamp"] = struct.pack(">Q", timestamp)
    props["delivery_mode"] = PERSISTENT
    flags, parts = 0, []
    for name, flag, _ in PROPERTY_LAYOUT:
        if name in props and name not in DROPPED:
            flags |= flag
            parts.append(props[name])
    return struct.pack(">H", flags) + b"".join(parts)


class ExactProperties(commands.Basic.Properties):
    """Basic properties whose encoding is given: pamqp sends ``encoded`` as the property list.

    ``message_id`` is set too: aiormq reads it to match returned messages to their publish.
    """

    def __init__(self, encoded: bytes, message_id: str) -> None:
        super().__init__(message_id=message_id)
        self.encoded = encoded

    def marshal(self) -> bytes:
        """The property list as given."""
        return self.encoded


@dataclass(frozen=True, kw_only=True)
class ReceivedCopy(OutgoingMessage):
    """A copy of a received message, published with its headers and properties as received.

    Only ``body``, ``headers`` and ``message_id`` of the fields inherited are sent (see
    :func:`copy_properties`), and ``ready_at`` as ``timestamp``; the other property fields
    say what was received.

    Attributes:
        received: The content-header payload the message came with.
        received_headers: Its headers as pamqp decoded them.
        ready_at: The copy's ``timestamp`` (whole seconds), or None: as received.
    """

    received: bytes
    received_headers: Mapping[str, Any] | None
    ready_at: int | None = None

    def amqp_properties(self) -> ExactProperties:
        """The copy's basic properties, encoded."""
        message_id = self.message_id or ""
        encoded = copy_properties(self.received, self.received_headers, self.headers, message_id, self.ready_at)
        return ExactProperties(encoded, message_id)
