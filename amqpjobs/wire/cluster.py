"""A robust connection that knows every node of a cluster and moves on to the next when its node goes.

aio-pika's :class:`~aio_pika.RobustConnection` reconnects (and restores channels, queues,
consumers and our re-declare hooks) to the one URL it was made with. This subclass keeps
all of that and only changes *where* it reconnects: when the connection to a node is lost,
or an attempt to reach a node fails, the next attempt goes to the next node of the list
(RabbitMQ "Clustering" → "Clients connecting to a cluster": a client should know several
nodes and try another when one is unreachable).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiormq.exceptions
from aio_pika import RobustConnection
from aio_pika.exceptions import CONNECTION_EXCEPTIONS
from yarl import URL

from amqpjobs.printable import printable
from amqpjobs.wire.errors import internal_error_hint, open_refused
from amqpjobs.wire.failover_lines import DOWN_EVERY, DownSpell, quiet_failover_lines
from amqpjobs.wire.reset import RecordingTransports
from amqpjobs.wire.tls import split_tls_options, ssl_context
from amqpjobs.wire.urls import node_address, redact, redact_text

log = logging.getLogger("amqpjobs.wire")


@dataclass(frozen=True)
class Node:
    """One node to connect to.

    Attributes:
        url: Its AMQP URL without RabbitMQ's TLS query options (aio-pika's form).
        context: The TLS context for ``amqps://`` (None for plain ``amqp://``).
        safe_url: The URL as given, password redacted (for messages).
        address: ``host:port`` (IPv6 in brackets; the scheme's default port when none is given).

    """

    url: str
    context: ssl.SSLContext | None
    safe_url: str
    address: str = ""


#: One shuffled order per process and list of node addresses (see :func:`process_order`).
_ORDERS: dict[tuple[str, ...], list[int]] = {}
#: The node each list of node addresses is connected to last, in this process (see :func:`connected_node`).
_CONNECTED: dict[frozenset[str], str] = {}
#: Connections of this process lost (closed by the broker, cut), and the last one's cause: :func:`losses`.
_LOSSES: list[Any] = [0, ""]


def losses() -> tuple[int, str]:
    """How many connections of this process were lost so far, and why the last one was (`` (...)`` or ``""``).

    A lost connection is one closed by the broker (``rabbitmqctl close_connection``, a node
    stopping) or cut, not by our ``close()``, once open: a handshake the broker refuses (refused
    credentials, a missing vhost: ``connection.open`` answered 530) is none, nor a close for a
    hard error (``channel_max`` reached: 530; 501-541), which the same start meets again.
    A start compares the count before and after
    (:func:`~amqpjobs.runtime.processes.run_worker`).
    """
    return _LOSSES[0], _LOSSES[1]


def process_order(addresses: tuple[str, ...]) -> list[int]:
    """The indexes of ``addresses`` in this process's one shuffled order (the same at every call).

    Clients spread over the nodes by shuffling (RabbitMQ "Clustering" → "Clients connecting to
    a cluster"); one order per process makes every connection of it, and its management API
    client, go to the same node first.
    """
    order = _ORDERS.get(addresses)
    if order is None:
        order = list(range(len(addresses)))
        random.shuffle(order)
        _ORDERS[addresses] = order
    return order


def connected_node(addresses: tuple[str, ...]) -> str | None:
    """The address (of ``addresses``) this process's last connection to that cluster is on, or None."""
    return _CONNECTED.get(frozenset(addresses))


def node(url: str, position: int = 1) -> Node:
    """The :class:`Node` of one AMQP URL; ``amqps://`` gets a verifying TLS context.

    Raises:
        ConfigurationError: a TLS option can't be used (see :func:`amqpjobs.wire.tls.ssl_context`).

    """
    plain, options = split_tls_options(url)
    tls = url.lower().startswith("amqps://")
    context = ssl_context(options, f"broker URL {position} ({redact(url)})") if tls else None
    return Node(plain, context, redact(url), node_address(url))


class ClusterConnection(RobustConnection):
    """aio-pika's robust connection over several nodes (one of them in use at a time).

    Args:
        nodes: The nodes, in the order to try them (the caller shuffles).
        start: Index of the node to connect to first.
        **kwargs: Passed to :class:`aio_pika.RobustConnection` (``client_properties``...).

    """

    def __init__(self, nodes: list[Node], start: int = 0, **kwargs: Any) -> None:
        self._nodes = nodes
        self._at = start % len(nodes)
        self._was_connected = False  # a failed first connect is reported by connect()'s own line
        self._open = False  # connection.open answered: only such a connection's close is a loss (losses())
        #: Why the last reconnect attempt failed (None once connected): see :func:`~amqpjobs.wire.connection.refusal`.
        self.last_failure: BaseException | None = None
        #: Called when the broker closes the connection with 541 INTERNAL_ERROR (see :func:`on_internal_error`).
        self.internal_error_callbacks: list[Callable[[], None]] = []
        #: Called with the error when the broker closes it for what it sent (501-540): :func:`on_hard_error`.
        self.hard_error_callbacks: list[Callable[[BaseException], None]] = []
        #: What a 541 means here when the owner mends the message itself (see :func:`mends_undeliverable`).
        self.internal_error_words: str | None = None
        #: Called with the error when the broker refuses a reconnect (connection.open): :func:`on_refused_reconnect`.
        self.refused_callbacks: list[Callable[[BaseException], None]] = []
        #: Which limit or permission refused a reconnect's ``connection.open``, with its fix (:func:`explain_refusals`).
        self.explain_refusal: Callable[[BaseException], Awaitable[str]] | None = None
        self._explaining: asyncio.Task[None] | None = None
        #: Awaited before each reconnect attempt: the connections jobs need first (:mod:`amqpjobs.wire.giving_way`).
        self.turn: Callable[[], Awaitable[None]] | None = None
        self._giving_way = False  # closed by give_way(): no loss, nothing said, the same node next
        self._down = DownSpell()  # its reconnects' failures, said by the down-node rule (from its loss to its back)
        self._waited = False  # its last reconnect waited its turn (a second or more)
        first = nodes[self._at]
        quiet_failover_lines()
        super().__init__(URL(first.url), ssl_context=first.context, **kwargs)
        # each (re)connect's socket is kept, for a reset of a blocked connection (amqpjobs.wire.reset)
        self.kwargs["transport_factory"] = RecordingTransports()

    @property
    def name(self) -> str:
        """The connection's name (``client_properties.connection_name``), as the management UI shows it."""
        return str((self.kwargs.get("client_properties") or {}).get("connection_name", "?"))

    @property
    def node(self) -> Node:
        """The node in use (or being tried)."""
        return self._nodes[self._at]

    def _move_on(self, why: str, cause: str = "", say: bool = True) -> None:
        left = self._nodes[self._at]
        self._at = (self._at + 1) % len(self._nodes)
        self.url = URL(self.node.url)
        self.kwargs["context"] = self.node.context
        if self._was_connected and say:
            log.warning(
                "connection %s %s %s%s: next attempt goes to %s",
                self.name, why, left.safe_url, cause, self.node.safe_url,
            )  # fmt: skip

    async def _on_connected(self) -> None:
        self.last_failure = None
        self._open = True
        _CONNECTED[frozenset(n.address for n in self._nodes)] = self.node.address
        back = self._down.worked(time.monotonic(), "having waited for those it gives way to" if self._waited else "")
        if self._was_connected:  # a reconnect: say where before the consumers are restored
            log.info("connection %s connected to %s%s", self.name, self.node.safe_url, back or "")
        self._waited = False
        await super()._on_connected()
        if not self._was_connected:
            log.info("connection %s connected to %s", self.name, self.node.safe_url)
        self._was_connected = True

    async def _on_connection_close(self, closing: asyncio.Future[Any]) -> None:
        lost = not (self._close_called or self.is_closed or self._giving_way)
        was_open, self._open, self._giving_way = self._open, False, False
        await super()._on_connection_close(closing)
        if lost:
            exc = closing.exception() if closing.done() and not closing.cancelled() else None
            cause = _cause(exc, self.internal_error_words)
            if was_open and not _hard_error(exc):  # a refused handshake, or a hard error: it fails alike again
                _LOSSES[:] = [_LOSSES[0] + 1, cause]
            if not was_open:  # an attempt that failed (refused, unreachable): its failure says it and moves on, once
                return
            self._down.began(time.monotonic())  # the first failed reconnect is said at once
            self._move_on("lost", cause)
            if isinstance(exc, aiormq.exceptions.ConnectionInternalError):
                for callback in self.internal_error_callbacks:  # amqpjobs.runtime.undeliverable
                    callback()
            elif was_open and exc is not None and _hard_error(exc):
                for hard in self.hard_error_callbacks:  # amqpjobs.runtime.hard_closes
                    hard(exc)

    async def give_way(self) -> bool:
        """Close the open connection to free its slot; aio-pika reconnects after :attr:`turn` (False: not open).

        Not a loss (:func:`losses`), said by the caller; the next attempt goes to the same node.
        """
        transport = self.transport
        if not self._open or transport is None or transport.connection.is_closed or self._close_called:
            return False
        self._giving_way = True
        self._down.began(time.monotonic())
        with contextlib.suppress(Exception):
            await transport.connection.close(ConnectionError(f"connection {self.name} gives way"))
        return True

    # aio-pika's RobustConnection makes each (re)connect attempt in this (name-mangled) method.
    async def _RobustConnection__connect_transport(self) -> None:
        if self._was_connected and self.turn is not None:
            began = time.monotonic()
            await self.turn()
            self._waited = time.monotonic() - began >= 1.0
        try:
            await super()._RobustConnection__connect_transport()  # type: ignore[misc]
        except Exception as exc:
            self.last_failure = exc
            refused, now = self._was_connected and open_refused(exc), time.monotonic()
            # one rule for a node down and a refusal: the first failure at once, then a line a minute at most
            again = self._down.failed(now)  # aio-pika tries again every 5 s
            say = self._was_connected and again is not None  # a first connect's attempts: connect()'s own line
            explained = refused and say and self.explain_refusal is not None  # its own line names the limit
            self._move_on("could not reach", _cause(exc) + (again or ""), say and not explained)
            if explained:
                self._explain(exc, self._down.lasting(now))
            for callback in self.refused_callbacks if refused else ():  # amqpjobs.runtime.hard_closes
                callback(exc)
            if self._was_connected and not refused and _hard_error(exc):  # a restored channel refused in the attempt
                for hard in self.hard_error_callbacks:  # (530 at a max-channels limit): as a close once open
                    hard(exc)
            first = self._RobustConnection__fail_fast_future  # type: ignore[attr-defined]
            if not isinstance(exc, CONNECTION_EXCEPTIONS) and not first.done():
                # aio-pika hands only its connection errors to a waiting connect(); anything else
                # (UnicodeError from getaddrinfo, TypeError from ssl) it would retry without end
                first.set_exception(exc)
            raise

    def _explain(self, exc: BaseException, how_long: str = "") -> None:
        """Say what refuses a reconnect's connection.open, and the fix (paced by the caller: once a minute)."""
        explain = self.explain_refusal
        if explain is None or (self._explaining is not None and not self._explaining.done()):
            return

        async def said() -> None:
            try:
                why = await explain(exc)
            except Exception:  # the management API did not answer: the broker's own words
                why = _cause(exc).strip().removeprefix("(").removesuffix(")")
            log.warning("connection %s: the broker refuses its reconnect: %s; trying again every 5s (said at most "
                        "every %gs%s)", self.name, redact_text(why), DOWN_EVERY, how_long)  # fmt: skip

        self._explaining = asyncio.get_running_loop().create_task(said())


def explain_refusals(connection: object, explain: Callable[[BaseException], Awaitable[str]]) -> None:
    """Have ``connection`` say, when the broker refuses a reconnect's ``connection.open`` (530), why and the fix.

    ``explain`` words the refusal (:func:`~amqpjobs.wire.open_refusal.refused_words`: the management API is asked
    which of the vhost, the permissions or a ``max-connections`` limit holds). A connection not made by
    :func:`~amqpjobs.wire.connection.connect` is left alone.
    """
    if isinstance(connection, ClusterConnection):
        connection.explain_refusal = explain


def _hard_error(exc: BaseException | None) -> bool:
    """Whether the broker closed the connection for what this client sent (reply codes 501-541), not 320 or a cut.

    aiormq raises a subclass of ``ConnectionClosed`` per hard error (530 NOT_ALLOWED at a
    channel past ``channel_max``, 504 CHANNEL_ERROR, 541 INTERNAL_ERROR ...), and the class
    itself for 320 CONNECTION_FORCED (``rabbitmqctl close_connection``, a node stopping).
    """
    closed = aiormq.exceptions.ConnectionClosed
    return isinstance(exc, closed) and type(exc) is not closed


def _cause(exc: BaseException | None, internal_error_words: str | None = None) -> str:
    """`` (why)`` for a log line: aiormq's words, credentials hidden; a refused ``connection.open`` worded.

    A 541 INTERNAL_ERROR gets ``internal_error_words`` when given (its owner mends the message), else
    :data:`~amqpjobs.wire.errors.UNDELIVERABLE_HINT` (the fix by hand).
    """
    if exc is None:
        return ""
    text = str(exc)
    if internal_error_words is not None and internal_error_hint(exc):
        return f" ({redact_text(text) or type(exc).__name__}{internal_error_words})"
    if open_refused(exc):  # aiormq: "Expected ..., got <Connection.Close object at 0x...>"
        text = (
            "the broker refused connection.open (530 NOT_ALLOWED: the vhost is gone, the user has no access to it, "
            "or a max-connections limit is reached, the vhost's or the user's)"
        )
    return f" ({redact_text(text) or type(exc).__name__}{internal_error_hint(exc)})"


def on_internal_error(connection: object, callback: Callable[[], None]) -> None:
    """Call ``callback`` each time the broker closes ``connection`` with 541 INTERNAL_ERROR.

    RabbitMQ does so when it fails to send a delivery, e.g. a message with a short string over
    255 bytes (:mod:`amqpjobs.runtime.undeliverable`). A connection not made by
    :func:`~amqpjobs.wire.connection.connect` is left alone.
    """
    if isinstance(connection, ClusterConnection):
        connection.internal_error_callbacks.append(callback)


def on_hard_error(connection: object, callback: Callable[[BaseException], None]) -> None:
    """Call ``callback`` with the error each time the broker closes open ``connection`` for what it sent.

    A reconnect attempt the broker closes so while aio-pika restores its channels (a channel over a user's
    ``max-channels``: the attempt fails, said ``could not reach``) counts too: it is the same refusal, met
    during the attempt instead of just after it.

    Reply codes 501-540 (530 NOT_ALLOWED at a channel past ``channel_max`` or a user's
    ``max-channels``, 501 FRAME_ERROR ...): aio-pika reconnects and most often meets the same
    refusal. 541 INTERNAL_ERROR has :func:`on_internal_error`. A connection not made by
    :func:`~amqpjobs.wire.connection.connect` is left alone.
    """
    if isinstance(connection, ClusterConnection):
        connection.hard_error_callbacks.append(callback)


def on_refused_reconnect(connection: object, callback: Callable[[BaseException], None]) -> None:
    """Call ``callback`` with the error each time the broker refuses a reconnect of ``connection`` (connection.open).

    530 NOT_ALLOWED there: the vhost is gone, the user lost its permissions, or a ``max-connections``
    limit (the vhost's or the user's) is reached (:mod:`amqpjobs.wire.open_refusal` asks which). aio-pika
    tries again every 5 s; the connection's own line says it once a minute (:data:`DOWN_EVERY`).
    A connection not made by :func:`~amqpjobs.wire.connection.connect` is left alone.
    """
    if isinstance(connection, ClusterConnection):
        connection.refused_callbacks.append(callback)


def mends_undeliverable(connection: object, queue: str) -> None:
    """Word a 541 INTERNAL_ERROR of ``connection`` as a message of ``queue`` its owner mends now, not by hand.

    A quarantine tool's browse (:class:`~amqpjobs.runtime.undeliverable_mend.PastUndeliverable`)
    replaces such a message by a readable copy and goes on, so the connection's lost line must not
    tell the operator to remove it in the management UI (taken so, the job would be lost). When the
    mend fails, the tool's error still carries the fix by hand. A connection not made by
    :func:`~amqpjobs.wire.connection.connect` is left alone.
    """
    if isinstance(connection, ClusterConnection):
        connection.internal_error_words = (
            ": RabbitMQ failed while sending this connection something and closed it with 541 INTERNAL_ERROR: a "
            f"message no AMQP 0-9-1 client can receive is in {printable(queue)} (the broker's log says "
            "content_properties_shortstr_overflow); it is being replaced by a readable copy at that queue's tail "
            "and the tool goes on past it: nothing to do by hand (should that fail, the tool's error says what to do)"
        )
