"""The bytes of a publish and of its confirm, written and read by hand (:mod:`amqpjobs.wire.blocking`).

AMQP 0-9-1 section 4.2.3 ("Frame Format"): a frame is its type (1 method, 2 content header,
3 body), its channel, its size (32 bits), the payload and the frame-end octet ``0xCE``; a
content header is class 60 (basic), weight 0, the body size (64 bits) and the property list;
a body longer than ``frame_max - 8`` bytes is split over several body frames. The method
frame of a publish is pamqp's encoding, kept per exchange and routing key.
"""

from __future__ import annotations

import functools
import struct
from typing import Final

from pamqp import commands as spec
from pamqp import frame as frames

_FRAME_END: Final = b"\xce"
#: A frame's type, channel and payload size.
FRAME_HEADER: Final = struct.Struct(">BHI")
_CONTENT: Final = struct.Struct(">HHQ")  # class id (60, basic), weight, body size
#: The start of a ``basic.ack`` method frame on channel 1 (type 1, channel 1, size 13, class 60, method 80);
#: its delivery tag (64 bits) and ``multiple`` bit follow, then the frame end: 21 bytes.
_ACK_FRAME: Final = bytes.fromhex("0100010000000d003c0050")
_TAG: Final = struct.Struct(">Q")


def publish_payload(
    channel: int, exchange: str, routing_key: str, body: bytes, properties: bytes, frame_max: int
) -> bytes:
    """A ``mandatory`` publish's method, content header and body frames on ``channel``, as one payload.

    Args:
        channel: The channel number.
        exchange: The exchange ("" the default one).
        routing_key: The routing key.
        body: The body (bytes).
        properties: The encoded property list (``Basic.Properties.marshal()``).
        frame_max: The connection's negotiated ``frame_max`` in bytes.
    """
    header = _CONTENT.pack(60, 0, len(body)) + properties
    parts = [_publish_frame(channel, exchange, routing_key), FRAME_HEADER.pack(2, channel, len(header)), header,
             _FRAME_END]  # fmt: skip
    chunk = frame_max - 8
    for at in range(0, len(body), chunk):
        piece = body[at : at + chunk]
        parts += (FRAME_HEADER.pack(3, channel, len(piece)), piece, _FRAME_END)
    return b"".join(parts)


def ack_at_head(buffer: bytearray) -> int | None:
    """The delivery tag of a ``basic.ack`` on channel 1 at the head of ``buffer`` (taken off it), or None.

    The common answer to a publish, read without pamqp; anything else is left for pamqp.
    """
    if len(buffer) >= 21 and buffer[:11] == _ACK_FRAME and buffer[20] == 0xCE:
        tag: int = _TAG.unpack_from(buffer, 11)[0]
        del buffer[:21]
        return tag
    return None


@functools.lru_cache(maxsize=1024)
def _publish_frame(channel: int, exchange: str, routing_key: str) -> bytes:
    """The ``basic.publish`` method frame (``mandatory``): the same for every job of a queue."""
    return frames.marshal(spec.Basic.Publish(exchange=exchange, routing_key=routing_key, mandatory=True), channel)


def timeval(seconds: float) -> bytes:
    """``struct timeval`` of ``seconds`` for ``SO_RCVTIMEO``/``SO_SNDTIMEO``."""
    whole = int(seconds)
    return struct.pack("ll", whole, int((seconds - whole) * 1_000_000))
