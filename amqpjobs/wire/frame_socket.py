"""A connected socket read as AMQP 0-9-1 frames, from one thread (:mod:`amqpjobs.wire.blocking`).

What comes in is read into a buffer and taken off it a whole frame at a time (AMQP 0-9-1
section 4.2.3, "Frame Format": type, channel, 32-bit size, payload, frame end), decoded by
pamqp. A read either waits up to a deadline or not at all. Once the connection is open, a
plain socket is put in blocking mode with kernel timeouts (``SO_RCVTIMEO``,
``SO_SNDTIMEO``): a read is then one system call (Python's own socket timeouts poll before
each), and one that must not wait asks ``poll`` first (an empty socket: no exception to raise
and catch) and reads with ``MSG_DONTWAIT``. A TLS socket keeps Python's timeouts.
"""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import time
from typing import Final

from pamqp import frame as frames
from pamqp.exceptions import PAMQPException

from amqpjobs.wire.publish_frames import FRAME_HEADER, timeval

#: Seconds a blocking read waits at most before the deadline of what it waits for is looked at again.
RECV_SLICE: Final = 1.0


class Closed(Exception):
    """The broker closed the channel (``code``, ``channel`` True) or the connection, or the connection went."""

    def __init__(self, text: str, code: int = 0, channel: bool = False) -> None:
        super().__init__(text)
        self.code = code
        self.channel = channel


class FrameSocket:
    """One connected socket (plain or TLS) and the bytes read from it, not yet taken as frames.

    Args:
        sock: The connected socket (``ssl.SSLSocket`` for TLS).
        timeout: Seconds its first reads and writes may take (the handshake's timeout).

    Every method raises ``OSError`` (``TimeoutError`` past a deadline) when the socket
    fails, and :class:`Closed` when the broker closed it or sent bytes that are no frame.
    """

    def __init__(self, sock: socket.socket, timeout: float) -> None:
        self.sock = sock
        self.buffer = bytearray()
        self._tls = isinstance(sock, ssl.SSLSocket)
        self._timeout_set: float | None = timeout  # the socket's Python timeout as last set (None: kernel timeouts)
        self._kernel = False
        self._ready = select.poll()  # with kernel timeouts: whether bytes (or the end of the stream) wait
        sock.settimeout(timeout)

    def send(self, payload: bytes) -> None:
        """Write all of ``payload``."""
        self.sock.sendall(payload)

    def send_methods(self, channel: int, *methods: frames.FrameTypes) -> None:
        """Write ``methods`` on ``channel`` (pamqp's encoding) in one write."""
        self.sock.sendall(b"".join(frames.marshal(method, channel) for method in methods))

    def frame(self) -> tuple[int, frames.FrameTypes] | None:
        """The next whole frame of the buffer (channel, frame), taken off it, or None.

        Raises:
            Closed: the bytes are no AMQP frame (pamqp could not decode them): the connection is not to be trusted.
        """
        buffer = self.buffer
        if len(buffer) < 7:
            return None
        end = FRAME_HEADER.unpack_from(buffer)[2] + 8
        if len(buffer) < end:
            return None
        try:
            _, channel, frame = frames.unmarshal(bytes(buffer[:end]))
        except (PAMQPException, ValueError) as exc:
            raise Closed(f"the broker sent bytes that are no AMQP frame ({exc})") from exc
        del buffer[:end]
        return channel, frame

    def read(self, deadline: float | None) -> None:
        """Read what the socket has into :attr:`buffer`, waiting until ``deadline`` (monotonic; None: not at all).

        Raises:
            TimeoutError: ``deadline`` passed with nothing read.
            Closed: the broker closed the connection (end of stream).
        """
        sock = self.sock
        while True:
            if deadline is not None and (left := deadline - time.monotonic()) <= 0:
                raise TimeoutError
            try:
                if self._kernel:
                    if deadline is None and not self._ready.poll(0):  # nothing came (no exception raised for it)
                        return
                    data = sock.recv(65536, socket.MSG_DONTWAIT if deadline is None else 0)
                else:
                    wait = 0.0 if deadline is None else left
                    if wait != self._timeout_set:
                        sock.settimeout(wait)
                        self._timeout_set = wait
                    data = sock.recv(65536)
                break
            except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, TimeoutError):
                if deadline is None:
                    return
        if not data:
            raise Closed("the broker closed the connection")
        self.buffer += data

    def kernel_timeouts(self, send_timeout: float) -> None:
        """Give a plain socket kernel timeouts (reads: :data:`RECV_SLICE`; writes: ``send_timeout``), blocking mode.

        A TLS socket is left with Python's timeouts (its reads may need writes).
        """
        if self._tls:
            return
        self.sock.settimeout(None)
        self._timeout_set = None
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval(RECV_SLICE))
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval(send_timeout))
        self._ready.register(self.sock, select.POLLIN)
        self._kernel = True

    def shutdown(self) -> None:
        """Shut the socket down (from any thread): a read waiting in another thread ends; no error."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        """Close the socket; no error."""
        with contextlib.suppress(OSError):
            self.sock.close()
