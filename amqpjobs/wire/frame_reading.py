"""Reading AMQP frames off the socket with less work per frame than aiormq's own reader.

Every frame a worker receives (a delivery is three: ``basic.deliver``, its content header and
its body) goes through aiormq's ``FrameReceiver.get_frame``, which copies the frame through
a ``BytesIO`` in three reads of the stream (1 byte, 6 bytes, then the payload and the frame
end) and looks at the buffer four times. :func:`install_fast_frame_reading` puts in its
place a reader of the same frames that takes the stream's bytes in large pieces and cuts
the frames out of them (AMQP 0-9-1 section 4.2.3 "General Frame Format"), decodes them with
the same ``pamqp.frame.unmarshal`` and raises the same exceptions with the same messages, so
aiormq's connection sees no difference.

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


#: Bytes taken from the stream at most per read: every whole frame in them is decoded without another read.
READ_SIZE = 65536


async def _at_least(self: FrameReceiver, reader: asyncio.StreamReader, n: int) -> tuple[bytes, int]:
    """The receiver's unread bytes and where they start, ``n`` of them at least (read from ``reader`` as needed).

    Raises:
        asyncio.IncompleteReadError: the stream ended first; counted as aiormq's three reads
            of a frame would have counted (1 byte, then 6, then the payload and the frame end).
        (Else what ``reader.read`` raises: the stream's exception.)
    """
    buf: bytes = getattr(self, "_amqpjobs_buf", b"")
    at: int = getattr(self, "_amqpjobs_at", 0)
    while len(buf) - at < n:
        more = await reader.read(READ_SIZE)
        if not more:
            got = buf[at:]
            if not got:
                raise asyncio.IncompleteReadError(b"", 1)
            if len(got) < 7:
                raise asyncio.IncompleteReadError(got[1:], 6)
            raise asyncio.IncompleteReadError(got[7:], _HEADER.unpack_from(got)[2] + 1)
        buf, at = buf[at:] + more, 0
        self._amqpjobs_buf, self._amqpjobs_at = buf, 0  # type: ignore[attr-defined]
    return buf, at


async def get_frame(self: FrameReceiver) -> Any:
    """The next frame from ``self.reader``, decoded: aiormq's ``get_frame``, reading the stream in large pieces.

    aiormq reads each frame in three reads of the stream (1 byte, 6 bytes, then the payload
    and the frame end); here the bytes are taken from the stream up to :data:`READ_SIZE` at
    a time and the frames cut out of them (AMQP 0-9-1 section 4.2.3 "General Frame Format"),
    so a delivery's three frames usually cost one read. The same frames, decoded by the same
    ``pamqp.frame.unmarshal``, and the same exceptions with the same messages as aiormq's
    reader: the stream's exception is raised as soon as it is set (as each of aiormq's reads
    raises it, bytes received before it or not), and a stream that ends inside a frame is
    told in aiormq's byte counts. A frame already whole in the bytes taken is cut out without
    taking the receiver's lock (nothing awaited, so no other reader can come between) unless
    another reader holds it.

    Raises:
        StopAsyncIteration: the stream ended before the frame began.
        AMQPConnectionError: the stream ended or failed inside a frame (aiormq's messages,
            byte counts as its reads would have counted them).
        ProtocolSyntaxError: the first bytes are an AMQP protocol header.
        InvalidFrameError: pamqp can't decode the frame.
    """
    reader = self.reader
    buf: bytes = getattr(self, "_amqpjobs_buf", b"")
    at: int = getattr(self, "_amqpjobs_at", 0)
    unread = len(buf) - at
    if not unread and reader.at_eof():
        del self.reader
        raise StopAsyncIteration
    if unread >= 7 and self.started and not self.lock.locked() and reader.exception() is None:
        end = 8 + _HEADER.unpack_from(buf, at)[2]
        if unread >= end:  # a whole frame read already: cut out with no await, so no other reader can come between
            self._amqpjobs_at = at + end  # type: ignore[attr-defined]
            return _decoded(buf[at : at + end])
    async with self.lock:
        try:
            failed = reader.exception()
            if failed is not None:  # aiormq's first read raises it, whatever was received before it
                raise failed
            buf, at = await _at_least(self, reader, 7)
            if self.reader is None:
                raise AMQPConnectionError()
            if not self.started and buf.startswith(b"AMQP", at):
                raise ProtocolSyntaxError("Unexpected AMQP protocol header")
            self.started = True
            end = 8 + _HEADER.unpack_from(buf, at)[2]
            buf, at = await _at_least(self, reader, end)
            data = buf[at : at + end]
            self._amqpjobs_at = at + end  # type: ignore[attr-defined]
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
    return _decoded(data)


def _decoded(data: bytes) -> Any:
    """One whole frame's bytes decoded by pamqp (``InvalidFrameError`` as aiormq raises it)."""
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
