"""A message put back as it was: every basic property and header the management API read, as they were.

A put-back (the undeliverable rescue's message taken by mistake, :mod:`amqpjobs.runtime.undeliverable`)
is not a copy (:mod:`amqpjobs.wire.copies` documents what a copy changes): it goes back to the queue
it came from with each of the 14 basic properties it had and no other, ``delivery_mode`` (a transient
message stays transient), ``expiration``, ``cluster_id`` and the raw 64-bit ``timestamp`` (whatever
unit its publisher wrote) included, and with its headers in the field types the management API's
JSON keeps (a number with a fraction as a 64-bit double, never narrowed to a 32-bit float).

One exception, the broker's: RabbitMQ refuses a publish whose ``user_id`` is not the publishing
connection's user (``406 PRECONDITION_FAILED``, the channel closed: the message, taken already, would
be lost). So a ``user_id`` that is not ``user`` is left out, and :func:`as_it_was` says so.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from pamqp import encode

from amqpjobs.message import OutgoingMessage
from amqpjobs.wire.copies import ExactProperties
from amqpjobs.wire.header_decoding import PROPERTY_LAYOUT

_OCTET = struct.Struct(">B")
_UINT64 = struct.Struct(">Q")
#: The kinds of values a property of each AMQP kind takes from the management API's JSON.
_FITS: Final = {"shortstr": str, "octet": int, "timestamp": int, "table": dict}
_LIMITS: Final = {"octet": 2**8, "timestamp": 2**64}


def _fits(kind: str, value: Any) -> bool:
    """Whether the management API's JSON ``value`` is of the kind an AMQP property of ``kind`` holds."""
    return isinstance(value, _FITS[kind]) and not isinstance(value, bool)


def _value(value: Any) -> bytes:
    """One field value as JSON read it: a float as a double (``d``), tables and arrays walked."""
    if isinstance(value, float):
        return b"d" + encode.double(value)
    if isinstance(value, Mapping):
        return b"F" + _table(value)
    if isinstance(value, list):
        body = b"".join(_value(v) for v in value)
        return b"A" + struct.pack(">I", len(body)) + body
    return encode.encode_table_value(value)  # str, int (narrowest), bool, None


def _table(headers: Mapping[str, Any]) -> bytes:
    body = b"".join(encode.short_string(str(name)) + _value(value) for name, value in headers.items())
    return struct.pack(">I", len(body)) + body


@dataclass(frozen=True, kw_only=True)
class AsItWas(OutgoingMessage):
    """A message to publish back with the basic properties it had (module docstring).

    Only ``body`` of the fields inherited is sent, and ``message_id`` matches a returned message;
    the properties go out as :attr:`encoded`.

    Attributes:
        encoded: The property list (flags and values), as :func:`as_it_was` wrote it.
    """

    encoded: bytes

    def amqp_properties(self) -> ExactProperties:
        """The message's basic properties, encoded."""
        return ExactProperties(self.encoded, self.message_id or "")


def as_it_was(properties: Mapping[str, Any], body: bytes, user: str) -> tuple[AsItWas, list[str]]:
    """The message of ``properties`` (the management API's names and JSON values) and ``body``, as it was.

    Args:
        properties: Its basic properties as the management API's "Get messages" read them.
        body: Its body, whole.
        user: The user of the connection that publishes it back (a ``user_id`` of another is left out).

    Returns:
        The message, and what of it could not go back (one phrase each, e.g. ``user_id 'alice'
        (not this connection's user 'guest': RabbitMQ refuses it)``); empty when nothing was left out.

    Raises:
        TypeError, ValueError: a header value AMQP has no field type for (pamqp's words).
    """
    flags, parts, left = 0, [], []
    for name, flag, kind in PROPERTY_LAYOUT:
        value: Any = properties.get(name)
        if value is None:
            continue
        if not _fits(kind, value):
            left.append(f"{name} {value!r} (no AMQP {kind})")
            continue
        if kind in _LIMITS and not 0 <= value < _LIMITS[kind]:
            left.append(f"{name} {value!r} (outside an AMQP {kind})")
            continue
        if name == "user_id" and value != user:
            left.append(f"user_id {value!r} (not this connection's user {user!r}: RabbitMQ refuses it)")
            continue
        if kind == "shortstr":
            raw = value.encode("utf-8", "surrogatepass")
            if len(raw) > 255:  # the caller's to mend (:mod:`amqpjobs.jobs.undeliverable`)
                left.append(f"{name} ({len(raw)} bytes, over 255)")
                continue
            parts.append(bytes((len(raw),)) + raw)
        elif kind == "table":
            kept = {str(k): v for k, v in value.items() if len(str(k).encode("utf-8", "surrogatepass")) <= 255}
            left += [f"header {str(k)[:40]!r}... (a name over 255 bytes)" for k in value if str(k) not in kept]
            parts.append(_table(kept))
        else:
            parts.append((_OCTET if kind == "octet" else _UINT64).pack(value))
        flags |= flag
    message_id = properties.get("message_id")
    message = AsItWas(body=body, headers=dict(properties.get("headers") or {}), content_type=None, app_id=None,
                      message_id=message_id if isinstance(message_id, str) else None,
                      encoded=struct.pack(">H", flags) + b"".join(parts))  # fmt: skip
    return message, left
