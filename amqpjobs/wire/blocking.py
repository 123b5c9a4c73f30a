"""A blocking publisher: one AMQP 0-9-1 connection and one confirm channel, used from one thread.

``App.sync_publisher().enqueue`` is called from code that is not async (a web view, a
script), one job at a time, each waiting for the broker's confirm. Handing each call to an
event loop thread and publishing through aio-pika costs a thread hand-off and four or five
loop turns per call (bench/RESULTS.md, issue 22: 0.86x Dramatiq's ``send``, whose pika
``BlockingConnection`` does the same over a plain socket). :class:`BlockingPublisher` writes
the publish's frames (pamqp's encoding; the properties by
:func:`~amqpjobs.wire.property_encoding.exact_properties` when it can) with one ``sendall``
and reads until the confirm, in the calling thread.

What it honours, as the async publisher (:mod:`amqpjobs.wire.publish`) does:

* publisher confirms and ``mandatory``: a ``basic.return`` of the publish (no queue bound)
  is :class:`~amqpjobs.errors.UnroutableError`, a ``basic.nack`` is
  :class:`~amqpjobs.errors.PublishNackedError`, a 404 channel close naming the exchange is
  :class:`~amqpjobs.errors.UnroutableError`: the broker said it was not stored;
* a body over ``max_message_size`` and properties over ``frame_max`` are refused before
  anything is sent; a 406 over the broker's own limit is :class:`~amqpjobs.errors.MessageTooLargeError`;
* anything else after the frames went out (no confirm within ``confirm_timeout``, the
  connection lost) is :class:`~amqpjobs.errors.PublishError` worded by
  :func:`~amqpjobs.wire.publish_outcome.uncertain`: it may or may not be stored;
* ``connection.blocked`` (RabbitMQ "Blocked Connection Notifications"): read before each
  publish; :meth:`BlockingPublisher.blocked` says by what, :meth:`BlockingPublisher.wait_unblocked` waits.

Between calls nothing reads the socket, so nothing answers the broker's heartbeats: a
connection idle for half its heartbeat timeout or more (when the broker may be about to
give up on it, RabbitMQ "Detecting Dead TCP Connections with Heartbeats") is replaced before
the next publish, and one the broker closed or reset meanwhile is seen before it too. A
publish is therefore never written to a connection that may already be dead.
"""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Callable
from typing import Any, Final, NoReturn
from urllib.parse import parse_qsl, urlsplit

from aiormq.channel import exception_by_code as channel_error
from aiormq.connection import exception_by_code as connection_error
from pamqp import commands as spec
from pamqp import frame as frames
from pamqp import heartbeat

from amqpjobs.errors import BrokerUnavailableError, PublishError, PublishNackedError, UnroutableError
from amqpjobs.message import OutgoingMessage
from amqpjobs.text import as_text
from amqpjobs.wire import limits
from amqpjobs.wire.blocking_handshake import DEFAULT_FRAME_MAX, handshake
from amqpjobs.wire.cluster import node, process_order
from amqpjobs.wire.connection import default_max_message_size
from amqpjobs.wire.frame_socket import Closed, FrameSocket
from amqpjobs.wire.limits import ENCODING_ERRORS, amqp_properties, check_body, check_header_fits, encoded_size
from amqpjobs.wire.property_encoding import exact_properties
from amqpjobs.wire.publish_frames import ack_at_head, publish_payload
from amqpjobs.wire.publish_outcome import closed_under, max_size_in, nacked, over_max_size, uncertain, unroutable
from amqpjobs.wire.settings import BrokerSettings
from amqpjobs.wire.tls import TLS_OPTIONS
from amqpjobs.wire.urls import parse_node

#: The URL options a blocking publisher honours; any other (``auth``, ...) leaves publishing to the async path.
OPTIONS: Final = frozenset({"heartbeat", "timeout", "name", *TLS_OPTIONS})
_CHANNEL: Final = 1


class ConnectFailed(Exception):
    """No connection could be opened (socket, TLS, a refused handshake, a URL it can't use); ``__cause__`` says why."""


class BlockingPublisher:
    """A connection of its own with one confirm-mode channel; every method blocks; one thread at a time.

    Args:
        settings: The broker (a cluster's nodes are tried in this process's order,
            :func:`~amqpjobs.wire.cluster.process_order`); ``amqps://`` verified as :func:`~amqpjobs.wire.cluster.node`.
        name: The connection's name in the management UI.
        confirm_timeout: Seconds to wait for each publish's confirm (default 30, as the async publisher).
        max_message_size: Bodies over this many bytes are refused before sending; None: the
            broker's default for its version (:func:`~amqpjobs.wire.connection.default_max_message_size`).
        header_reserve: Bytes of ``frame_max`` a message's properties must leave free
            (:func:`~amqpjobs.wire.limits.check_header_fits`).
        missing_exchange: The words for a missing exchange, given its name and the broker's
            version (:func:`~amqpjobs.wire.exchange_checks.missing_exchange`).

    When it cannot connect, :meth:`blocked` raises :class:`ConnectFailed`; the caller
    (:mod:`amqpjobs.runtime.sync_fast`) then publishes on the async path, which retries and
    words those failures.
    """

    def __init__(
        self, settings: BrokerSettings, name: str, *, confirm_timeout: float = 30.0,
        max_message_size: int | None = None, header_reserve: int = 0,
        missing_exchange: Callable[[str, tuple[int, ...]], str] | None = None,
    ) -> None:  # fmt: skip
        self.settings = settings
        self.name = name
        self.confirm_timeout = confirm_timeout
        self._max_message_size = max_message_size
        self._header_reserve = header_reserve
        self._missing_exchange = missing_exchange
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
        self._send(_CHANNEL, spec.Channel.Open())
        self._expect(spec.Channel.OpenOk, timeout)
        self._send(_CHANNEL, spec.Confirm.Select())
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
            self._send(_CHANNEL, spec.Channel.CloseOk())
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

    # publishing ------------------------------------------------------------------------------------------

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

    def publish(self, exchange: str, routing_key: str, message: OutgoingMessage) -> None:
        """Publish ``message`` with ``mandatory`` and wait for the broker's confirm (call :meth:`blocked` first).

        Raises:
            MessageTooLargeError: over ``max_message_size`` or ``frame_max`` (nothing sent), or
                the broker closed the channel over its own ``max_message_size`` (not stored).
            UnroutableError: returned (no queue bound), or the exchange does not exist (not stored).
            PublishNackedError: nacked (not stored).
            ConfigurationError: properties pamqp can't encode (nothing sent).
            PublishError: sent and not confirmed (no answer within ``confirm_timeout``, the
                connection lost or closed): it may or may not be stored.
            BrokerUnavailableError: no connection could be opened (nothing sent).
        """
        self._connected(exchange, routing_key)
        check_body(message, self._max_message_size or default_max_message_size(self.version))
        exact = exact_properties(message)
        properties = amqp_properties(message) if exact is None else exact
        check_header_fits(properties, message.headers, self._frame_max, self._header_reserve)
        try:
            encoded = properties.marshal()
        except ENCODING_ERRORS:
            encoded_size(properties)  # names what pamqp refused
            raise
        self._confirmed_publish(exchange, routing_key, message.body, encoded, message.message_id, message.type)

    def publish_encoded(
        self, exchange: str, routing_key: str, body: bytes, properties: bytes, message_id: str, job: str
    ) -> None:
        """:meth:`publish` of a message whose property list is encoded already (a :class:`PropertyStencil`'s).

        ``properties`` must be the bytes :func:`~amqpjobs.wire.property_encoding.exact_properties`
        writes for the message; ``message_id`` and ``job`` (its ``type``) only word the errors.

        Raises:
            (As :meth:`publish`, but for ``ConfigurationError``: nothing is left to encode.)
        """
        self._connected(exchange, routing_key)
        limits.check_body_size(len(body), self._max_message_size or default_max_message_size(self.version))
        limits.check_encoded_header(len(properties), self._frame_max, self._header_reserve)
        self._confirmed_publish(exchange, routing_key, body, properties, message_id, job)

    def _connected(self, exchange: str, routing_key: str) -> None:
        if self._io is None:
            try:
                self._ready()
            except (OSError, Closed, ValueError) as exc:
                raise BrokerUnavailableError(f"publish to {exchange!r} / {routing_key!r} not sent: {exc}") from exc

    def _confirmed_publish(
        self, exchange: str, routing_key: str, body: bytes, properties: bytes, message_id: str | None, job: str | None
    ) -> None:  # fmt: skip
        """Write the publish and wait for its confirm; its ``message_id`` and ``type`` (``job``) word the errors."""
        payload = self._payload(exchange, routing_key, body, properties)
        self._returned = False
        self._tag += 1
        tag = self._tag
        try:
            assert self._io is not None
            self._io.send(payload)
            self._last_write = time.monotonic()
            self._confirm(tag, time.monotonic() + self.confirm_timeout)
        except Closed as exc:
            if not exc.channel:
                self._drop()
            self._refused(exc, exchange, routing_key, OutgoingMessage(body, message_id=message_id, type=job))
        except BaseException as exc:  # an interrupt (a signal handler's exception) too: its answer may still come
            self._drop()  # a new publish must not read that answer as its own
            if not isinstance(exc, OSError | ValueError):
                raise
            to = f"{exchange!r} / {routing_key!r}"
            what = (f"no publisher confirm within {self.confirm_timeout:g}s for {to}" if isinstance(exc, TimeoutError)
                    else f"the connection was lost under the publish to {to} ({exc})")  # fmt: skip
            raise PublishError(uncertain(what, OutgoingMessage(body, message_id=message_id, type=job))) from exc
        if tag in self._nacked:
            self._nacked.discard(tag)
            raise PublishNackedError(nacked(exchange, routing_key))
        if self._returned:
            raise UnroutableError(unroutable(exchange, routing_key))

    def _payload(self, exchange: str, routing_key: str, body: bytes, properties: bytes) -> bytes:
        """The publish's frames as one payload (:func:`~amqpjobs.wire.publish_frames.publish_payload`)."""
        return publish_payload(_CHANNEL, exchange, routing_key, body, properties, self._frame_max)

    def _confirm(self, tag: int, deadline: float) -> None:
        while self._confirmed < tag:
            assert self._io is not None
            if (acked := ack_at_head(self._io.buffer)) is not None:
                self._confirmed = max(self._confirmed, acked)
                continue
            while (got := self._frame()) is not None and self._confirmed < tag:
                self._handle(*got)
            if self._confirmed < tag:
                self._read(deadline)

    def _refused(self, exc: Closed, exchange: str, routing_key: str, message: OutgoingMessage) -> NoReturn:
        """The channel or connection closed under the publish: what that says about it (:func:`closed_under`)."""
        text = str(exc)
        if exc.channel and over_max_size(exc.code, text) and (limit := max_size_in(text)) is not None:
            self._max_message_size = min(limit, self._max_message_size or limit)  # later bodies over it: not sent
        missing = self._missing_exchange
        raise closed_under(
            text, exc.code if exc.channel else None, exchange, routing_key, message,
            lambda: missing(exchange, self.version) if missing is not None else f"exchange {exchange!r} does not exist",
        ) from exc  # fmt: skip
