"""The AMQP 0-9-1 connection handshake of a blocking connection (:mod:`amqpjobs.wire.blocking`).

Protocol header, ``connection.start`` / ``start-ok`` (PLAIN), ``tune`` / ``tune-ok``,
``open`` / ``open-ok``, in the calling thread (AMQP 0-9-1 spec, section 2.2.4 "Connection
Class"; RabbitMQ "Connections", "Negotiating Parameters"). The client properties announce
what the blocking publisher handles (RabbitMQ "Client Capabilities"): publisher confirms,
``basic.nack``, ``connection.blocked``, ``authentication_failure_close`` (a refused login
is a ``connection.close`` with its reason, not a bare socket close) and consumer cancel
notifications.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from pamqp import commands as spec
from pamqp import frame as frames

from amqpjobs._version import __version__
from amqpjobs.text import as_text
from amqpjobs.wire.frame_socket import FrameSocket
from amqpjobs.wire.management import parse_version

#: The capabilities announced in ``connection.start-ok``'s client properties.
CAPABILITIES: Final[dict[str, Any]] = {
    "publisher_confirms": True, "basic.nack": True, "connection.blocked": True,
    "authentication_failure_close": True, "consumer_cancel_notify": True,
}  # fmt: skip
#: ``frame_max`` when the broker's ``connection.tune`` gives 0 (no limit of its own).
DEFAULT_FRAME_MAX: Final = 131072


@dataclass(frozen=True)
class Tuned:
    """What the handshake settled.

    Attributes:
        version: The broker's version (``server_properties["version"]``), e.g. ``(3, 10, 8)``; ``(0,)`` unknown.
        frame_max: Bytes per frame, the broker's ``connection.tune`` (:data:`DEFAULT_FRAME_MAX` when 0).
        heartbeat: Seconds; the URL's ``heartbeat`` option when given (as aio-pika), else the broker's; 0: none.
    """

    version: tuple[int, ...]
    frame_max: int
    heartbeat: float


def handshake(
    io: FrameSocket, *, user: str, password: str, vhost: str, name: str, heartbeat: int | None,
    expect: Callable[[type, float], Any], timeout: float,
) -> Tuned:  # fmt: skip
    """Open the AMQP connection on ``io``, a connected socket (TLS wrapped already, when used).

    Args:
        io: The socket, nothing written yet.
        user: The PLAIN user name.
        password: The PLAIN password (never logged).
        vhost: The virtual host to open.
        name: The connection's name in the management UI (``connection_name``).
        heartbeat: Seconds asked by the URL's ``heartbeat`` option; None: the broker's.
        expect: Reads until a frame of the given method class comes, within the given seconds,
            handling the others (the caller's ``_expect``: a ``connection.close`` raises
            :class:`~amqpjobs.wire.frame_socket.Closed` with the broker's words).
        timeout: Seconds each step may wait for the broker's answer.

    Returns:
        The settled :class:`Tuned` values.

    Raises:
        OSError: the socket failed (``TimeoutError`` past ``timeout``).
        Closed: the broker closed the connection (refused credentials, vhost, ...).
    """
    io.send(b"AMQP\x00\x00\x09\x01")
    start = expect(spec.Connection.Start, timeout)
    version = parse_version(as_text(start.server_properties.get("version", "0")))
    _send(io, spec.Connection.StartOk(
        client_properties={"product": "amqpjobs", "version": __version__, "platform": "Python",
                           "connection_name": name, "capabilities": CAPABILITIES},
        mechanism="PLAIN", response=f"\0{user}\0{password}", locale="en_US",
    ))  # fmt: skip
    tune = expect(spec.Connection.Tune, timeout)
    frame_max = tune.frame_max or DEFAULT_FRAME_MAX
    beat = heartbeat if heartbeat is not None else (tune.heartbeat or 0)
    _send(io, spec.Connection.TuneOk(channel_max=tune.channel_max, frame_max=frame_max, heartbeat=beat))
    _send(io, spec.Connection.Open(virtual_host=vhost))
    expect(spec.Connection.OpenOk, timeout)
    return Tuned(version, frame_max, float(beat))


def _send(io: FrameSocket, method: frames.FrameTypes) -> None:
    io.send_methods(0, method)
