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
  :func:`~amqpjobs.wire.publish_outcome.uncertain`: it may or may not be stored; but a confirm wait that ends
  while the broker blocks the connection (a resource alarm holds the publish unread) keeps the connection
  open (:attr:`BlockingPublisher.held`, never reused) until :meth:`BlockingPublisher.settle` reads the answer:
  closed, its teardown would race the held frames once the alarm clears, and could lose the job;
* ``connection.blocked`` (RabbitMQ "Blocked Connection Notifications"): read before each
  publish; :meth:`BlockingPublisher.blocked` says by what, :meth:`BlockingPublisher.wait_unblocked` waits.

Between calls nothing reads the socket, so nothing answers the broker's heartbeats: a
connection idle for half its heartbeat timeout or more (when the broker may be about to
give up on it, RabbitMQ "Detecting Dead TCP Connections with Heartbeats") is replaced before
the next publish, and one the broker closed or reset meanwhile is seen before it too. A
publish is therefore never written to a connection that may already be dead.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NoReturn

from amqpjobs.errors import BrokerUnavailableError, PublishError, PublishNackedError, UnroutableError
from amqpjobs.message import OutgoingMessage
from amqpjobs.wire import limits
from amqpjobs.wire.alarms import alarm_of
from amqpjobs.wire.blocking_connection import CHANNEL, OPTIONS, BlockingConnection, ConnectFailed
from amqpjobs.wire.connection import default_max_message_size
from amqpjobs.wire.frame_socket import Closed
from amqpjobs.wire.held_publishes import CONFIRMED, NACKED, RETURNED, lost
from amqpjobs.wire.limits import ENCODING_ERRORS, amqp_properties, check_body, check_header_fits, encoded_size
from amqpjobs.wire.property_encoding import exact_properties
from amqpjobs.wire.publish_frames import ack_at_head, publish_payload
from amqpjobs.wire.publish_outcome import (
    KEPT_BY_SYNC,
    closed_under,
    held_past_confirm_wait,
    job_words,
    max_size_in,
    nacked,
    over_max_size,
    uncertain,
    unroutable,
)
from amqpjobs.wire.settings import BrokerSettings

__all__ = ["OPTIONS", "BlockingPublisher", "ConnectFailed"]


class BlockingPublisher(BlockingConnection):
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
        super().__init__(settings, name, confirm_timeout)
        self._max_message_size = max_message_size
        self._header_reserve = header_reserve
        self._missing_exchange = missing_exchange
        #: The publish a resource alarm held past its confirm wait (its job's words, since when): kept open, never
        #: reused, until :meth:`settle` reads its answer (closing it then could lose the job, README "Backpressure").
        self.held: tuple[str, float] | None = None

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
            message = OutgoingMessage(body, message_id=message_id, type=job)
            if isinstance(exc, TimeoutError) and self._blocked is not None:  # held unread: closing could lose it
                self.held = (job_words(message), time.monotonic())
                raise held_past_confirm_wait(
                    exchange, routing_key, message, self.confirm_timeout, alarm_of(self._blocked), KEPT_BY_SYNC
                ) from exc
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

    def settle(self, seconds: float) -> str | None:
        """Read the broker's answer to the publish held past its confirm wait (:attr:`held`) for up to ``seconds``.

        Returns:
            None while unanswered; else what the answer says: ``"confirmed (stored)"``, ``"nacked (not
            stored)"``, ``"returned: unroutable (not stored)"``, or the connection lost (it may or may not be).
        """
        try:
            self._confirm(self._tag, time.monotonic() + seconds)
        except TimeoutError:
            return None
        except (OSError, Closed, ValueError) as exc:
            self._drop()
            return lost(exc)
        self.held = None
        if self._tag in self._nacked:
            return NACKED
        return RETURNED if self._returned else CONFIRMED

    def _payload(self, exchange: str, routing_key: str, body: bytes, properties: bytes) -> bytes:
        """The publish's frames as one payload (:func:`~amqpjobs.wire.publish_frames.publish_payload`)."""
        return publish_payload(CHANNEL, exchange, routing_key, body, properties, self._frame_max)

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
