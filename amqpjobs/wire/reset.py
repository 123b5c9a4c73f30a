"""Ending a connection a resource alarm blocks: a TCP reset, so that the broker drops what it holds unread.

While an alarm lasts, RabbitMQ stops reading a publishing connection: its publishes wait unread in
the broker's socket buffers, and so does a ``connection.close`` (a close waits with them). How the
connection then ends decides what becomes of them, measured on a 3.10 node (3 publishes held, 8 runs
each way): closed with a FIN, the broker reads them once the alarm clears and stores every one; reset
(``SO_LINGER`` 0, so the kernel sends an RST), it drops them all and logs ``{inet_error,closed}``.
The same on 3.10.8, 4.0.5 and 4.3.6 (memory alarm by ``set_vm_memory_high_watermark``, 3 runs each
way per queue type): reset, none of 3 stored, classic or quorum; closed, 3 of 3 stored in a classic
queue, 1 of 3 in a quorum queue (the close is no way to end it).
An operator command that must not leave a job in two places (a replay, a park) resets its publishing
connection rather than wait: its copies held unread are never stored, their originals stay.

The socket is aiormq's, reached through the transport factory :class:`RecordingTransports`
installed in every connection of ours (:class:`~amqpjobs.wire.cluster.ClusterConnection`).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from typing import Any

from aiormq.connection import TCPTransportFactory, TLSTransportFactory, TransportFactory
from yarl import URL

from amqpjobs.wire.abc import Connection

#: Seconds :func:`reset` waits for aio-pika to take the reset connection for closed.
RESET_CLOSE_WAIT = 5.0


class RecordingTransports(TransportFactory):
    """aiormq's own transport factory (TLS for ``amqps://``), remembering the transport it made last."""

    def __init__(self) -> None:
        self.current: asyncio.BaseTransport | None = None

    async def create(self, url: URL, **kwargs: Any) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Open the transport as aiormq would (the one it uses without a factory), and keep it."""
        factory = TLSTransportFactory() if url.scheme == "amqps" else TCPTransportFactory()
        reader, writer = await factory.create(url, **kwargs)
        self.current = writer.transport
        return reader, writer


def _transport(connection: Connection) -> asyncio.BaseTransport | None:
    kwargs = getattr(connection, "kwargs", None)
    factory = kwargs.get("transport_factory") if isinstance(kwargs, dict) else None
    return factory.current if isinstance(factory, RecordingTransports) else None


def ending(connection: Connection) -> bool:
    """Whether ``connection``'s socket is already closing (reset or closed: it reads nothing more of it)."""
    transport = _transport(connection)
    return transport is not None and transport.is_closing()


def abort(connection: Connection) -> bool:
    """Send ``connection``'s TCP reset now, in this step of the loop (nothing else runs before it).

    Whether a reset went: False when the socket can't be reached (a connection not made by
    :func:`~amqpjobs.wire.connection.connect`) or is already closing. Call :func:`reset` after, to
    stop aio-pika reconnecting and take the connection for closed.
    """
    transport = _transport(connection)
    done = False
    if transport is not None and not transport.is_closing():
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                done = True
        ending = getattr(transport, "abort", None)
        if callable(ending):
            ending()
    return done


async def reset(connection: Connection) -> bool:
    """End ``connection`` with a TCP reset (:func:`abort`), without a ``connection.close``, and stop it reconnecting.

    Whatever the broker had not read of it is dropped (see the module's docstring): held publishes are
    never stored. Returns False when the socket can't be reached (a connection not made by
    :func:`~amqpjobs.wire.connection.connect`); it is then only closed, at most :data:`RESET_CLOSE_WAIT` s.
    """
    done = abort(connection)
    with contextlib.suppress(Exception, asyncio.TimeoutError):
        await asyncio.wait_for(connection.close(), RESET_CLOSE_WAIT)
    return done
