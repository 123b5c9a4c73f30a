"""An outcome event's publish as AMQP frames, from bytes kept per channel and routing key (no pamqp per event).

The publish of one event (:mod:`amqpjobs.wire.events`) is, as AMQP 0-9-1 frames it: a
``basic.publish`` method frame, the same for every event of a routing key on a channel; a
content header frame, the same for every event on a channel but for the body size (8 bytes
at offset 11: after the frame type, channel, payload size, class id and weight); and the
body, in frames of at most ``limit`` bytes of payload each (none for an empty body). pamqp
marshals the first two once (per channel, and routing key); per event only the body size
and each body frame's head (type 3, channel, payload size) are packed here: byte for byte
what ``pamqp.frame.marshal`` writes for the three (tests/unit/test_event_frames.py), a
fraction of its cost (a body frame marshalled by pamqp per event was most of the sender's time).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Final

from pamqp import commands
from pamqp.base import Frame
from pamqp.frame import marshal
from pamqp.header import ContentHeader

#: Offset of the body size in a content header frame (type 1, channel 2, payload size 4, class id 2, weight 2).
_SIZE_AT: Final = 11
#: A body size (an AMQP long long).
_SIZE: Final = struct.Struct(">Q")
#: A body frame's head: frame type, channel, payload size.
_BODY_HEAD: Final = struct.Struct(">BHI")
#: AMQP's body frame type, and every frame's last byte.
_FRAME_BODY: Final = 3
_FRAME_END: Final = b"\xce"
#: Routing keys whose frames are kept (per channel); cleared past this many.
_CACHE_SIZE: Final = 512


class EventFrames:
    """Publishes to ``exchange`` on channel ``number``, their bodies' properties ``properties``, as frames.

    Args:
        number: The channel number.
        exchange: The exchange every publish goes to.
        properties: The basic properties of every publish (marshalled once, here).

    """

    def __init__(self, number: int, exchange: str, properties: commands.Basic.Properties) -> None:
        self.number = number
        self._exchange = exchange
        header = marshal(ContentHeader(0, 0, properties), number)
        self._header_head = header[:_SIZE_AT]  # up to the body size
        self._header_tail = header[_SIZE_AT + _SIZE.size :]  # the properties and the frame end
        # what follows the body size when the body is one frame: the header's tail, then the body frame's
        # head up to its payload size; then that size, the body and the frame end
        middle = self._header_tail + _BODY_HEAD.pack(_FRAME_BODY, number, 0)[:3]
        self._one_frame = struct.Struct(f">Q{len(middle)}sI")
        self._middle = middle
        self._starts: dict[str, bytes] = {}  # routing key -> its method frame and the header up to the body size

    def _start(self, routing_key: str) -> bytes:
        if len(self._starts) >= _CACHE_SIZE:
            self._starts.clear()
        method: Frame = commands.Basic.Publish(exchange=self._exchange, routing_key=routing_key)
        start = self._starts[routing_key] = marshal(method, self.number) + self._header_head
        return start

    def payload(self, publishes: Sequence[tuple[str, bytes]], limit: int) -> bytes:
        """The frames of ``publishes`` (routing key, body) in order, as one payload to write.

        Args:
            publishes: (routing key, body) of each publish.
            limit: The most payload bytes in a body frame (the connection's ``frame_max`` less 8).
        """
        starts, one_frame, middle, number = self._starts, self._one_frame.pack, self._middle, self.number
        parts: list[bytes] = []
        for routing_key, body in publishes:
            start = starts.get(routing_key) or self._start(routing_key)
            size = len(body)
            if 0 < size <= limit:
                parts += (start, one_frame(size, middle, size), body, _FRAME_END)
                continue
            parts += (start, _SIZE.pack(size), self._header_tail)
            for at in range(0, size, limit):
                chunk = body[at : at + limit]
                parts += (_BODY_HEAD.pack(_FRAME_BODY, number, len(chunk)), chunk, _FRAME_END)
        return b"".join(parts)
