"""The connection under :class:`~amqpjobs.wire.blocking.BlockingPublisher`: one socket, one confirm channel, its frames.

Opening it (nodes in this process's order, TLS, the handshake), replacing one that is stale, closed
or broken before the next publish, reading what the broker sends (heartbeats, ``connection.blocked``
and ``unblocked``, closes, confirms and returns: noted for the publisher), all from one thread and
blocking. What a publish's answer means is :mod:`amqpjobs.wire.blocking`'s.
"""

from __future__ import annotations

import socket
import ssl
import time
from typing import Any, Final
from urllib.parse import parse_qsl, urlsplit

from aiormq.channel import exception_by_code as channel_error
from aiormq.connection import exception_by_code as connection_error
from pamqp import commands as spec
from pamqp import frame as frames
from pamqp import heartbeat

from amqpjobs.text import as_text
from amqpjobs.wire.blocking_handshake import DEFAULT_FRAME_MAX, handshake
from amqpjobs.wire.cluster import node, process_order
from amqpjobs.wire.frame_socket import Closed, FrameSocket
from amqpjobs.wire.settings import BrokerSettings
from amqpjobs.wire.tls import TLS_OPTIONS
from amqpjobs.wire.urls import parse_node

#: The URL options a blocking publisher honours; any other (``auth``, ...) leaves publishing to the async path.
OPTIONS: Final = frozenset({"heartbeat", "timeout", "name", *TLS_OPTIONS})
#: The one channel's number.
CHANNEL: Final = 1


class ConnectFailed(Exception):
    """No connection could be opened (socket, TLS, a refused handshake, a URL it can't use); ``__cause__`` says why."""


class BlockingConnection:
    """A connection of its own with one confirm-mode channel; every method blocks; one thread at a time.

    Args:
        settings: The broker (a cluster's nodes are tried in this process's order,
            :func:`~amqpjobs.wire.cluster.process_order`); ``amqps://`` verified as :func:`~amqpjobs.wire.cluster.node`.
        name: The connection's name in the management UI.
        confirm_timeout: Seconds a write may block (the kernel's send timeout), as a publish's confirm wait.
    """

    def __init__(self, settings: BrokerSettings, name: str, confirm_timeout: float) -> None:
        self.settings = settings
        self.name = name
        self.confirm_timeout = confirm_timeout
        self._io: FrameSocket | None = None
        self._tag = 0  # the channel's last publish sequence number (confirm.select: 1, 2, 3, ...)
        self._confirmed = 0  # every tag up to this one is answered
        self._nacked: set[int] = set()
        self._returned = False  # a basic.return came since the last publish was written
        self._blocked: str | None = None
        self._channel_open = False
        self._frame_max = DEFAULT_FRAME_MAX
        self._heartbeat = 0.0
        self._last_write = 0.0
        self.version: tuple[int, ...] = (0,)
        self.connects = 0  # connections opened, for tests and the bench

    @staticmethod
    def usable(settings: BrokerSettings) -> bool:
        """Whether every node URL uses only :data:`OPTIONS` (else the async path publishes)."""
        return all(set(dict(parse_qsl(urlsplit(url).query))) <= OPTIONS for url in settings.nodes)

    # connection ------------------------------------------------------------------------------------------

    def _connect(self) -> None:
        nodes = list(self.settings.nodes)
        given = [node(url, i) for i, url in enumerate(nodes, start=1)]
        last: BaseException | None = None
        for at in process_order(tuple(one.address for one in given)):
            try:
                self._open(nodes[at], given[at].context, len(nodes), at + 1)
                return
            except (OSError, Closed, ValueError) as exc:
                self._drop()
                last = exc
        assert last is not None
        raise last

    def _open(self, url: str, context: ssl.SSLContext | None, count: int, position: int) -> None:
        parsed = parse_node(url, position, count)
        options = dict(parse_qsl(urlsplit(url).query))
        timeout = float(options.get("timeout") or min(10.0, self.settings.connect_timeout or 10.0))
        sock = socket.create_connection((parsed.host, parsed.port or (5671 if context else 5672)), timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if context is not None:
            sock = context.wrap_socket(sock, server_hostname=parsed.host)
        self._io = FrameSocket(sock, timeout)
        tuned = handshake(
            self._io, user=parsed.user, password=parsed.password, vhost=parsed.vhost, name=self.name,
            heartbeat=int(options["heartbeat"]) if "heartbeat" in options else None,
            expect=self._expect, timeout=timeout,
        )  # fmt: skip
        self.version, self._frame_max, self._heartbeat = tuned.version, tuned.frame_max, tuned.heartbeat
        self._open_channel(timeout)
        self._io.kernel_timeouts(self.confirm_timeout)
        self.connects += 1

    def _open_channel(self, timeout: float) -> None:
        self._send(CHANNEL, spec.Channel.Open())
        self._expect(spec.Channel.OpenOk, timeout)
        self._send(CHANNEL, spec.Confirm.Select())
        self._expect(spec.Confirm.SelectOk, timeout)
        self._tag = self._confirmed = 0
        self._nacked.clear()
        self._channel_open = True

    def _drop(self) -> None:
        """Forget the connection (closed or not to be trusted)."""
        io, self._io = self._io, None
        self._channel_open = False
        self._blocked = None
        if io is not None:
            io.close()

    def close(self) -> None:
        """Close the connection (``connection.close``, its ``close-ok`` awaited up to 1 s); no error."""
        if self._io is None:
            return
        try:
            self._send(0, spec.Connection.Close(reply_code=200, reply_text="Normal shutdown", class_id=0, method_id=0))
            self._expect(spec.Connection.CloseOk, 1.0)
        except (OSError, Closed, ValueError):
            pass
        self._drop()

    def cut(self) -> None:
        """Shut the socket down from another thread: a call waiting for its confirm ends (uncertain)."""
        io = self._io
        if io is not None:
            io.shutdown()

    def _ready(self) -> None:
        """A connection and channel to publish on now: a stale, closed or broken one replaced."""
        if self._io is not None:
            idle = time.monotonic() - self._last_write
            try:
                if self._heartbeat and idle >= self._heartbeat / 2:
                    raise Closed("idle for half the heartbeat timeout")
                self._poll()
                if not self._channel_open:
                    self._open_channel(10.0)
            except (OSError, Closed, ValueError):
                self.close()
        if self._io is None:
            self._connect()
        self._last_write = time.monotonic()

    # frames ----------------------------------------------------------------------------------------------

    def _send(self, channel: int, *methods: frames.FrameTypes) -> None:
        assert self._io is not None
        self._io.send_methods(channel, *methods)

    def _frame(self) -> tuple[int, frames.FrameTypes] | None:
        assert self._io is not None
        return self._io.frame()

    def _read(self, deadline: float | None) -> None:
        assert self._io is not None
        self._io.read(deadline)

    def _handle(self, channel: int, frame: frames.FrameTypes) -> None:
        """Note what an incoming frame says (all but the one a caller waits for)."""
        if isinstance(frame, heartbeat.Heartbeat):
            return
        if isinstance(frame, spec.Connection.Blocked):
            self._blocked = as_text(frame.reason or "") or "blocked"
        elif isinstance(frame, spec.Connection.Unblocked):
            self._blocked = None
        elif isinstance(frame, spec.Connection.Close):
            self._send(0, spec.Connection.CloseOk())
            raise Closed(str(connection_error(frame)), frame.reply_code or 0)  # the async path's words
        elif isinstance(frame, spec.Channel.Close):
            self._send(CHANNEL, spec.Channel.CloseOk())
            self._channel_open = False
            raise Closed(str(channel_error(frame)), frame.reply_code or 0, channel=True)
        elif isinstance(frame, spec.Basic.Ack | spec.Basic.Nack):  # one publish in flight: it answers all up to it
            upto = frame.delivery_tag or self._tag
            if isinstance(frame, spec.Basic.Nack):
                self._nacked.update(range(self._confirmed + 1, upto + 1))
            self._confirmed = max(self._confirmed, upto)
        elif isinstance(frame, spec.Basic.Return):
            self._returned = True
        # content header and body frames of a returned message, channel.flow-ok, ...: nothing to note

    def _poll(self) -> None:
        """Handle every frame the broker sent meanwhile, without waiting."""
        while True:
            while (got := self._frame()) is not None:
                self._handle(*got)
            assert self._io is not None
            before = len(self._io.buffer)
            self._io.read(None)
            if len(self._io.buffer) == before:
                return

    def _expect(self, kind: type, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            while (got := self._frame()) is not None:
                if isinstance(got[1], kind):
                    return got[1]
                self._handle(*got)
            self._read(deadline)

    # alarms ---------------------------------------------------------------------------------------------

    def blocked(self) -> str | None:
        """The reason of the broker's ``connection.blocked`` in force (connecting first if need be), or None.

        Raises:
            ConnectFailed: no connection could be opened.
        """
        try:
            self._ready()
        except (OSError, Closed, ValueError) as exc:
            self._drop()
            raise ConnectFailed(str(exc)) from exc
        return self._blocked

    def wait_unblocked(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for ``connection.unblocked``; whether it came (False: still blocked or lost)."""
        deadline = time.monotonic() + seconds
        try:
            while self._blocked is not None:
                while (got := self._frame()) is not None:
                    self._handle(*got)
                if self._blocked is not None:
                    self._read(deadline)
        except (OSError, Closed, ValueError):
            self._drop()
            return False
        self._last_write = time.monotonic()
        return True
