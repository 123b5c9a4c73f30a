"""Reading AMQP frames off the socket with less work per frame than aiormq's own reader.

Every frame a worker receives (a delivery is three: ``basic.deliver``, its content header and
its body) goes through aiormq's ``FrameReceiver.get_frame``, which copies the frame through
a ``BytesIO`` in three reads (1 byte, 6 bytes, then the payload and the frame end) and looks
at the buffer four times. :func:`install_fast_frame_reading` puts in its place a
reader of the same frames in two reads (the 7-byte frame header, then the payload and the
frame end, AMQP 0-9-1 section 4.2.3 "General Frame Format") that decodes them with the same
``pamqp.frame.unmarshal`` and raises the same exceptions with the same messages, so aiormq's
connection sees no difference.

It replaces aiormq's only when that is exactly the code it was written against (its source
text, :data:`AUDITED`): an aiormq that changed its reader keeps its own, unpatched.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import logging
import struct
from typing import Any

import pamqp.frame
from aiormq.connection import FrameReceiver
from aiormq.exceptions import AMQPConnectionError, InvalidFrameError, ProtocolSyntaxError
from pamqp.exceptions import PAMQPException

log = logging.getLogger("amqpjobs.wire")

#: SHA-256 of the source text of the aiormq ``FrameReceiver.get_frame`` this module replaces
#: (aiormq 7.2.4): another one is left in place.
AUDITED = frozenset({"3adff046743a2328fa6da4ce2aecd959ecc81d2282bc304b3b063d52bcbafb7d"})

#: Frame header: type (octet), channel (short), payload size (long).
_HEADER = struct.Struct(">BHI")
_original = FrameReceiver.get_frame


def source_digest(function: Any) -> str:
    """SHA-256 hex digest of ``function``'s source text ("" when the source can't be read)."""
    try:
        return hashlib.sha256(inspect.getsource(function).encode()).hexdigest()
    except (OSError, TypeError):
        return ""


async def get_frame(self: FrameReceiver) -> Any:
    """The next frame from ``self.reader``, decoded: aiormq's ``get_frame`` in two reads.

    Raises:
        StopAsyncIteration: the stream ended before the frame began.
        AMQPConnectionError: the stream ended or failed inside a frame (aiormq's messages,
            byte counts as its reads would have counted them).
        ProtocolSyntaxError: the first bytes are an AMQP protocol header.
        InvalidFrameError: pamqp can't decode the frame.
    """
    reader = self.reader
    if reader.at_eof():
        del self.reader
        raise StopAsyncIteration
    async with self.lock:
        try:
            try:
                head = await reader.readexactly(7)
            except asyncio.IncompleteReadError as e:  # counted as aiormq's reads would: 1 byte, then 6
                if e.partial:
                    raise asyncio.IncompleteReadError(e.partial[1:], 6) from None
                raise asyncio.IncompleteReadError(e.partial, 1) from None
            if self.reader is None:
                raise AMQPConnectionError()
            if not self.started and head.startswith(b"AMQP"):
                raise ProtocolSyntaxError("Unexpected AMQP protocol header")
            self.started = True
            frame_length = _HEADER.unpack(head)[2]
            data = head + await reader.readexactly(frame_length + 1)
        except asyncio.IncompleteReadError as e:
            raise AMQPConnectionError(
                f"Server connection unexpectedly closed. Read {len(e.partial)} bytes but {e.expected} bytes expected",
            ) from e
        except ConnectionRefusedError as e:
            raise AMQPConnectionError(f"Server connection refused: {e!r}") from e
        except ConnectionResetError as e:
            raise AMQPConnectionError(f"Server connection reset: {e!r}") from e
        except ConnectionError as e:
            raise AMQPConnectionError(f"Server connection error: {e!r}") from e
        except OSError as e:
            raise AMQPConnectionError(f"Server communication error: {e!r}") from e
    try:
        return pamqp.frame.unmarshal(data)
    except PAMQPException as e:
        raise InvalidFrameError(str(e)) from e


def install_fast_frame_reading() -> bool:
    """Read frames with :func:`get_frame` when aiormq's reader is the audited one (idempotent).

    Returns:
        Whether :func:`get_frame` is in place (False: this aiormq's reader differs from
        :data:`AUDITED`, and is kept).
    """
    if FrameReceiver.get_frame is get_frame:
        return True
    digest = source_digest(_original)
    if digest not in AUDITED:
        log.debug("aiormq's FrameReceiver.get_frame is not the audited one (%s): kept", digest[:12] or "no source")
        return False
    FrameReceiver.get_frame = get_frame  # type: ignore[method-assign]
    return True
