"""What one publish may carry: encodable properties, a body within max_message_size, properties within frame_max.

The one home of these rules. The broker's publisher (:class:`~amqpjobs.wire.publish.ConfirmedPublisher`)
applies them with the connection's negotiated ``frame_max``; the in-memory double
(:mod:`amqpjobs.testing`) with its own (:data:`DEFAULT_FRAME_MAX` unless told), so a job
too large for a frame fails in a user's test exactly as in production. Encoding only: this
module never talks to a broker.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final

import aiormq
from pamqp import decode, encode

from amqpjobs.errors import ConfigurationError, MessageTooLargeError
from amqpjobs.message import MAX_NESTING, OutgoingMessage, broker_refuses_float
from amqpjobs.printable import printable
from amqpjobs.wire.as_was import AsItWas
from amqpjobs.wire.copies import ExactProperties, ReceivedCopy, encodable
from amqpjobs.wire.header_decoding import table_entries

#: RabbitMQ's default ``frame_max`` in bytes (``rabbit.frame_max``), which the client takes as offered.
DEFAULT_FRAME_MAX: Final = 131_072

#: Bytes of a content-header frame besides the properties: frame header and end (8), class,
#: weight and body size (12).
_HEADER_FRAME_OVERHEAD: Final = 20


#: AMQP 0-9-1's smallest ``frame_max`` (``frame-min-size``); the field is a 32-bit unsigned long.
FRAME_MIN_SIZE: Final = 4096


def checked_frame_max(frame_max: object, where: str) -> int:
    """``frame_max`` when a broker could have it: 0 (no limit) or 4096 to 2**32 - 1 bytes.

    Raises:
        ConfigurationError: it is not (naming ``where`` and the range).

    """
    if type(frame_max) is int and (frame_max == 0 or FRAME_MIN_SIZE <= frame_max < 2**32):
        return frame_max
    raise ConfigurationError(
        f"{where}(frame_max={frame_max!r}): a frame_max is 0 (no limit) or {FRAME_MIN_SIZE}-{2**32 - 1} bytes "
        f"(AMQP 0-9-1; RabbitMQ's default is {DEFAULT_FRAME_MAX})"
    )


def amqp_properties(message: OutgoingMessage) -> aiormq.spec.Basic.Properties:
    """The AMQP basic properties of ``message``.

    Every new message is persistent (``delivery_mode`` 2); a copy of a received message
    (:class:`~amqpjobs.wire.copies.ReceivedCopy`) keeps its other properties and its headers as
    received (also persistent when the original was transient); a message put back as it was
    (:class:`~amqpjobs.wire.as_was.AsItWas`) keeps every property it had, ``delivery_mode`` included.
    """
    if isinstance(message, ReceivedCopy | AsItWas):
        return message.amqp_properties()
    return aiormq.spec.Basic.Properties(
        content_type=message.content_type,
        content_encoding=message.content_encoding,
        headers=encodable(message.headers),  # a new dict, also for a read-only mapping
        delivery_mode=2,
        priority=message.priority,
        correlation_id=message.correlation_id,
        reply_to=message.reply_to,
        message_id=message.message_id,
        timestamp=None if message.timestamp is None else datetime.fromtimestamp(message.timestamp, UTC),
        message_type=message.type,
        app_id=message.app_id,
    )


#: What pamqp raises for properties it can't put in a frame: a header value of a type AMQP has
#: no field type for (a set, a date), an integer beyond 64 bits, a lone surrogate in a string ...
ENCODING_ERRORS: Final = (TypeError, ValueError, AttributeError, OverflowError, struct.error)


def encoded_size(properties: aiormq.spec.Basic.Properties) -> int:
    """Bytes the content-header frame carrying ``properties`` takes (pamqp's encoding, exactly).

    Raises:
        ConfigurationError: pamqp can't encode them (the message says why: which header, which
            value); nothing was sent.
    """
    try:
        return len(properties.marshal()) + _HEADER_FRAME_OVERHEAD
    except ENCODING_ERRORS as exc:
        what, why = "the message's headers", str(exc)
        for name, value in (properties.headers or {}).items():  # name the header (pamqp says "<name> error: ...")
            try:
                encode.field_table({name: value})
            except ENCODING_ERRORS as one:
                what, why = f"header {printable(str(name))!r}", str(one).removeprefix(f"{name} error: ")
                break
        raise ConfigurationError(
            f"{what} can't be put in an AMQP frame ({why}); nothing was sent. Give header values "
            "AMQP carries: str, int (64-bit), float, Decimal, bool, bytes, datetime, None, or lists and dicts "
            "(str keys) of these"
        ) from exc


#: Bytes the properties besides the headers can take at most: 10 short strings (content type
#: and encoding, correlation id, reply-to, expiration, message id, type, user id, app id,
#: cluster id: 256 bytes each at most), delivery mode, priority, timestamp and the flags.
_OTHER_PROPERTIES_MAX: Final = 2_600


def _value_bound(value: object) -> int:
    """At least the bytes pamqp encodes ``value`` in as a field value, type code included."""
    if isinstance(value, str):
        return 5 + (len(value) if value.isascii() else 4 * len(value))  # S, long length, UTF-8 (4 bytes a character)
    if isinstance(value, bytes | bytearray):
        return 5 + len(value)  # x, long length
    if isinstance(value, Mapping):
        return 5 + sum(1 + 4 * len(k) + _value_bound(v) for k, v in value.items())  # F, long length, entries
    if isinstance(value, list | tuple):
        return 5 + sum(_value_bound(v) for v in value)  # A, long length, values
    return 9  # the widest fixed-size value: l (int), d (float), T (timestamp); D (Decimal) takes 6


def header_bound(headers: Mapping[str, Any]) -> int:
    """At least the bytes ``headers`` take as an encoded field table (its length included), never fewer.

    A quick upper bound (type codes, lengths, 4 bytes a character of non-ASCII text, 9 for any
    fixed-size value), so :func:`check_header_fits` can skip the exact encoding only when the
    headers surely fit: an estimate below the encoded size let 15,000 large ints in a list
    (135,000 bytes) through unsized, and the broker closed the connection (FRAME_ERROR).
    """
    return 4 + sum(1 + 4 * len(k) + _value_bound(v) for k, v in headers.items())


def check_header_fits(
    properties: aiormq.spec.Basic.Properties, headers: Mapping[str, Any], frame_max: int, reserve: int = 0
) -> None:
    """Refuse properties that can't fit the connection's ``frame_max`` (less ``reserve`` bytes of it).

    A message's properties (its headers included) travel in one content-header frame: the
    body is split over frames, the header never is. A larger one makes the broker close the
    whole connection with ``FRAME_ERROR`` (RabbitMQ "AMQP 0-9-1 Reference" → frame_max), so
    a worker that republished a message with huge headers would lose every consumer of its
    connection. The exact size is computed only when an upper bound (:func:`header_bound`) is over the limit;
    a copy of a received message (:class:`~amqpjobs.wire.copies.ExactProperties`) is always
    sized exactly (its encoding is at hand), as its decoded ``headers`` can hold fewer entries
    than it carries (a name another publisher sent twice).

    Args:
        properties: The message's properties, headers included.
        headers: The same headers (for the quick estimate).
        frame_max: The connection's negotiated ``frame_max`` in bytes (0: no limit).
        reserve: Bytes of ``frame_max`` to leave free (what a worker adds to its copies of
            an enqueued job); at most half of ``frame_max`` is reserved.

    Raises:
        MessageTooLargeError: the properties take more than ``frame_max - reserve`` bytes.
        ConfigurationError: pamqp can't encode them (:func:`encoded_size`), when they were sized.
    """
    if not frame_max:
        return
    if isinstance(properties, ExactProperties):
        check_encoded_header(len(properties.encoded), frame_max, reserve)
        return
    bound = header_bound(headers) + _OTHER_PROPERTIES_MAX + _HEADER_FRAME_OVERHEAD
    if bound > frame_max - min(reserve, frame_max // 2):
        check_encoded_header(encoded_size(properties) - _HEADER_FRAME_OVERHEAD, frame_max, reserve)


def check_encoded_header(encoded: int, frame_max: int, reserve: int = 0) -> None:
    """Refuse a property list of ``encoded`` bytes that can't fit ``frame_max`` (:func:`check_header_fits`'s rule).

    Raises:
        MessageTooLargeError: its content-header frame takes more than ``frame_max - reserve`` bytes.
    """
    if not frame_max:
        return
    reserve = min(reserve, frame_max // 2)
    limit = frame_max - reserve
    size = encoded + _HEADER_FRAME_OVERHEAD
    if size > limit:
        room = f" less the {reserve} bytes of it for the worker's own headers on its copies" if reserve else ""
        raise MessageTooLargeError(
            f"the message's headers and properties take {size} bytes, over the connection's frame_max of "
            f"{frame_max} bytes{room} (they travel in one frame); nothing was sent. Put large data in the body",
            f"headers and properties of {size} bytes, over the connection's frame_max of {frame_max} bytes{room} "
            "(one frame carries them)",
            excess=size - limit,
        )


def check_body(message: OutgoingMessage, max_message_size: int | None) -> None:
    """Refuse a body over ``max_message_size`` bytes (None: no check): the broker would close the channel.

    Raises:
        MessageTooLargeError: ``message.body`` is longer than ``max_message_size`` bytes.
    """
    check_body_size(len(message.body), max_message_size)


def check_body_size(size: int, max_message_size: int | None) -> None:
    """:func:`check_body` of a body of ``size`` bytes.

    Raises:
        MessageTooLargeError: ``size`` is over ``max_message_size``.
    """
    if max_message_size is not None and size > max_message_size:
        raise MessageTooLargeError(
            f"message of {size} bytes is over the broker's max_message_size of "
            f"{max_message_size} bytes; nothing was sent. Store large data elsewhere and put a "
            "reference in the payload (claim-check)",
            f"a body of {size} bytes, over the broker's max_message_size of {max_message_size} bytes",
        )


def check_fits(message: OutgoingMessage, frame_max: int, reserve: int = 0, max_message_size: int | None = None) -> None:
    """Refuse ``message`` as a publish would, before anything is sent: its body, then its properties.

    The properties are encoded whatever their size (the broker's publisher encodes them as it
    sends, and names an encoding failure with :func:`encoded_size` too), so an in-memory
    publish refuses exactly what a publish to RabbitMQ refuses.

    Args:
        message: The message (a new one, or a copy of a received one).
        frame_max: The connection's ``frame_max`` in bytes (0: no limit).
        reserve: Bytes of ``frame_max`` the properties must leave free (see :func:`check_header_fits`).
        max_message_size: The broker's ``max_message_size`` in bytes (None: no check).

    Raises:
        MessageTooLargeError: the body is over ``max_message_size``, or the properties over
            ``frame_max - reserve`` (its ``reason`` says which, with the sizes).
        ConfigurationError: pamqp can't encode the properties (:func:`encoded_size`).
    """
    check_body(message, max_message_size)
    check_values(message)
    properties = amqp_properties(message)
    encoded_size(properties)
    check_header_fits(properties, message.headers, frame_max, reserve)


def check_values(message: OutgoingMessage) -> None:
    """Refuse what pamqp would encode and RabbitMQ refuse, or what pamqp would blame on the headers.

    A NaN or infinite float in a header, at any depth (:func:`~amqpjobs.message.broker_refuses_float`),
    and a ``priority`` outside 0-255 (AMQP 0-9-1's priority property is one octet; pamqp's own error,
    "ubyte format requires ...", names no property).

    Raises:
        ConfigurationError: naming the header or the priority; nothing was sent.
    """
    if message.priority is not None and (type(message.priority) is not int or not 0 <= message.priority <= 255):
        raise ConfigurationError(
            f"priority {message.priority!r} is not 0-255 (AMQP's priority property is one octet); nothing was sent. "
            "Give 0-255, or None (a queue's x-max-priority caps it)"
        )
    for name, value in message.headers.items():
        if (found := _refused_float(value)) is not None:
            raise ConfigurationError(
                f"header {printable(str(name))!r} holds {found!r}, a float RabbitMQ closes the publisher's connection "
                "(INTERNAL_ERROR) on; nothing was sent. Send it as a str or None"
            )


def _refused_float(value: object, depth: int = 0) -> float | None:
    """The first float RabbitMQ refuses within header value ``value`` (tables and arrays too), or None."""
    if broker_refuses_float(value):
        return value  # type: ignore[return-value]
    if depth < MAX_NESTING and isinstance(value, Mapping | list | tuple):
        for item in value.values() if isinstance(value, Mapping) else value:
            if (found := _refused_float(item, depth + 1)) is not None:
                return found
    return None


def as_delivered(headers: Mapping[str, Any]) -> dict[str, Any]:
    """``headers`` as a consumer gets them from a broker: a field table encoded by pamqp and decoded back.

    A tuple comes back a list and ``bytes`` a ``bytearray``, at any depth, as from RabbitMQ
    (:mod:`amqpjobs.testing` delivers its messages' headers this way).

    Raises:
        TypeError, ValueError: a value AMQP can't carry (a publish checks for these first:
            :func:`check_fits`).
    """
    table = encode.field_table(encodable(dict(headers)))
    entries = table_entries(table)
    return dict(entries) if entries is not None else decode.field_table(table)[1]
