"""Connecting to the broker (aio-pika), and reading what the broker is.

The first connect is retried with tenacity (a broker still starting refuses
connections); after that, aio-pika's robust connection reconnects by itself
(STYLE: "Reconnect is aio-pika's job"), to the next node of a cluster when its node
is gone (``wire/cluster.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import aiormq
from aio_pika.abc import AbstractChannel, AbstractRobustConnection
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    retry_if_not_exception_type,
)
from yarl import URL

from amqpjobs.errors import AmqpJobsError, BrokerUnavailableError
from amqpjobs.text import as_text
from amqpjobs.wire.alarms import install_blocked_tracking
from amqpjobs.wire.cluster import ClusterConnection, Node, explain_refusals, node, process_order
from amqpjobs.wire.copies import keep_received_properties
from amqpjobs.wire.errors import LIBRARY_ERRORS, open_refused, refused_connect_reason
from amqpjobs.wire.frame_reading import install_fast_frame_reading
from amqpjobs.wire.lenient_decoding import install_lenient_decoding
from amqpjobs.wire.management import parse_version
from amqpjobs.wire.method_decoding import install_method_decoding
from amqpjobs.wire.open_refusal import refused_words
from amqpjobs.wire.probe import mismatch
from amqpjobs.wire.publish_outcome import not_connected
from amqpjobs.wire.rotation import (
    NodeRefused,
    Rotation,
    attempt_line,
    attempt_timeout,
    every_node_refused,
    pause_policy,
    stop_policy,
)
from amqpjobs.wire.settings import CONNECT_TIMEOUT_ENV, BrokerSettings
from amqpjobs.wire.tls import certificate_problem, exception_chain, refused_certificate
from amqpjobs.wire.urls import CREDENTIALS_FIX, redact_text

log = logging.getLogger("amqpjobs.wire")

#: Errors that mean "the broker is not (yet) there" on connect.
T = TypeVar("T")
#: Seconds a publish waiting for a reconnect sleeps at most before it looks again (:func:`when_connected`).
RECONNECT_CHECK = 0.25
_CONNECT_ERRORS = (OSError, aiormq.exceptions.AMQPConnectionError, ConnectionError)
_REFUSED: tuple[type[BaseException], ...] = (*LIBRARY_ERRORS, ValueError)
#: Said after a connect that got no answer: a live node busy with other work answers its handshake late.
BUSY_HINT = (
    "a node that is up but busy may answer later: give a longer connect timeout "
    f"(--connect-timeout 30s, or {CONNECT_TIMEOUT_ENV}=30s)"
)
#: The client libraries' own loggers, which write several ERROR lines (some with tracebacks)
#: for each refused connect; during our first-connect retries we write one line per node instead (then paced).
CLIENT_LOGGERS = ("aiormq.connection", "aio_pika.connection", "aio_pika.robust_connection")
#: The loggers that report calls a cancellation cut short ("Closing channel ... because RPC call ... cancelled").
CHANNEL_LOGGERS = ("aiormq.channel", "aio_pika.channel", "aio_pika.robust_channel")


@dataclass(frozen=True)
class BrokerInfo:
    """What the connected broker says about itself (from ``connection.start``'s server properties).

    Attributes:
        product: e.g. ``"RabbitMQ"``.
        version: e.g. ``(3, 10, 8)``.
        version_text: The version as the broker wrote it.

    """

    product: str
    version: tuple[int, ...]
    version_text: str


#: RabbitMQ's default ``max_message_size``: 128 MiB before 4.0, 16 MiB from 4.0 on
#: (RabbitMQ 4.0 release notes; "Configuration" → ``max_message_size``).
MAX_MESSAGE_SIZE_3X = 128 * 1024 * 1024
MAX_MESSAGE_SIZE_4X = 16 * 1024 * 1024


def default_max_message_size(version: tuple[int, ...]) -> int:
    """The broker's default ``max_message_size`` in bytes for RabbitMQ ``version``.

    A node may be configured otherwise and clients can't read its configuration, so
    :class:`~amqpjobs.runtime.app.App` takes ``max_message_size`` to override this.
    """
    return MAX_MESSAGE_SIZE_4X if version >= (4, 0) else MAX_MESSAGE_SIZE_3X


async def close_channel(channel: AbstractChannel | aiormq.abc.AbstractChannel) -> None:
    """Close ``channel`` (aio-pika's, or aiormq's underneath) for good, also after the broker closed it.

    A robust channel closed by the broker (say, a passive declare's ``404``) reopens by
    itself unless ``close()`` is called; calling it always stops that, and a failure to
    close an already closed channel is ignored (the one way to close a channel we are done with).
    """
    with contextlib.suppress(Exception):
        await channel.close()


def broker_info(connection: AbstractRobustConnection) -> BrokerInfo:
    """Read product and version from ``connection``'s server properties.

    Raises:
        BrokerUnavailableError: the connection is not open.

    """
    transport = connection.transport
    if transport is None:
        raise BrokerUnavailableError("not connected")
    props = transport.connection.server_properties
    version_text = as_text(props.get("version", "0"))
    return BrokerInfo(as_text(props.get("product", "")), parse_version(version_text), version_text)


def server_address(connection: object) -> tuple[str, int] | None:
    """Host and port of the broker node ``connection`` connects to (from its URL), or None for another kind.

    What the OpenTelemetry conventions call ``server.address`` / ``server.port``; a URL without
    a port means 5672 (``amqps``: 5671), as aio-pika connects.
    """
    url = getattr(connection, "url", None)
    host = getattr(url, "host", None)
    if not isinstance(host, str) or not host:
        return None
    port = getattr(url, "port", None)
    return host, port if isinstance(port, int) else (5671 if getattr(url, "scheme", "") == "amqps" else 5672)


def heartbeat_timeout(connection: AbstractRobustConnection) -> float:
    """The connection's heartbeat timeout in seconds (0 = heartbeats off; the URL's ``?heartbeat=``).

    The broker takes a connection for dead after this long without a frame from the
    client (RabbitMQ "Detecting Dead TCP Connections with Heartbeats"): an event loop
    blocked that long loses its connection, and with it every unacked delivery.
    """
    transport = connection.transport
    if transport is None:
        return 0.0
    return float(getattr(transport.connection, "heartbeat_timeout", 0) or 0)


class _BelowCritical(logging.Filter):
    """Drops every record below CRITICAL."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.CRITICAL


@contextlib.contextmanager
def quiet_client_loggers(names: tuple[str, ...] = CLIENT_LOGGERS) -> Iterator[None]:
    """Drop the records below CRITICAL of loggers ``names`` for the block (unless amqpjobs logs at DEBUG, ``-v``).

    A logger's filter sees only the records logged on it (not its children's), hence the
    full names.

    Each block adds a filter of its own and removes only that one, so overlapping blocks
    (two connects at once) never leave the loggers silenced. Loggers are process-wide: another
    connection of the process reconnecting during the block is quiet too.
    """
    if log.isEnabledFor(logging.DEBUG):
        yield
        return
    loggers = [logging.getLogger(n) for n in names]
    quiet = _BelowCritical()
    for lg in loggers:
        lg.addFilter(quiet)
    try:
        yield
    finally:
        for lg in loggers:
            lg.removeFilter(quiet)


def _nobody_there(exc: BaseException) -> bool:
    """True for a refused TCP connect or an unknown host (no port to ask what it speaks)."""
    refused = isinstance(exc, OSError) and exc.errno in (errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH)
    return refused or isinstance(exc, ConnectionRefusedError | socket.gaierror)


async def _try_node(nodes: list[Node], at: int, name: str, limit: float) -> AbstractRobustConnection:
    """A connection to ``nodes[at]`` (its reconnects go on to the next nodes), or the error of this one try.

    ``limit``: seconds this attempt, and each later reconnect attempt, may take.

    Raises:
        TimeoutError: the node did not answer within ``limit`` seconds (its message says so).
        NodeRefused: its certificate was refused, or its port speaks the other protocol
            (``amqp://`` to a TLS port, ``amqps://`` to a plain one: :mod:`amqpjobs.wire.probe`).

    """
    connection = ClusterConnection(nodes, start=at, client_properties={"connection_name": name})
    try:
        await connection.connect(timeout=limit)
    except BaseException as exc:
        with contextlib.suppress(Exception):
            await connection.close()
        if isinstance(exc, TimeoutError):  # accepted, never answered: a probe would get no answer either
            raise TimeoutError(f"no answer within {limit:.2g}s") from exc  # 2.99 s left of 3: "3s"
        if not isinstance(exc, _CONNECT_ERRORS):
            raise
        one = nodes[at]
        refused = refused_certificate(exc)
        if refused is not None:
            raise NodeRefused(f"TLS: {one.safe_url} refused: {certificate_problem(refused)}") from exc
        if not any(_nobody_there(e) for e in exception_chain(exc)):  # something answered: which protocol?
            host, _, port = one.address.rpartition(":")
            why = await mismatch("amqps" if one.context else "amqp", host.strip("[]"), int(port))
            if why is not None:
                raise NodeRefused(f"broker at {one.safe_url}: {why}") from exc
        raise
    return connection


async def connect(
    settings: BrokerSettings, *, wait: float | None = None, name: str = "amqpjobs"
) -> AbstractRobustConnection:
    """Open a robust connection to the first node that answers, retrying for up to ``wait`` seconds.

    The nodes of ``settings`` (one, or a cluster's) are tried in an order shuffled once per
    process (:func:`~amqpjobs.wire.cluster.process_order`), so that clients spread over the
    nodes; once connected, a lost connection is re-opened to the next node
    (:class:`~amqpjobs.wire.cluster.ClusterConnection`).
    ``amqps://`` nodes are verified (:mod:`amqpjobs.wire.tls`) and never tried as plain AMQP.

    Each attempt tries one node; the next node is tried at once, and after a round of all of
    them the next round waits (0.2 s doubling up to 2 s). ``wait`` bounds the whole (every
    node is tried at least once); an attempt takes at most :func:`~amqpjobs.wire.rotation.attempt_timeout` (a node
    that accepts but never answers is unreachable). Each node's first failed attempt writes one WARNING line, then
    one a minute at most (logger ``amqpjobs.wire``) naming the node, password redacted; the client libraries' own
    lines are silenced meanwhile (:func:`quiet_client_loggers`).

    Args:
        settings: Broker settings.
        wait: Seconds to keep retrying a refused first connect, over all the nodes (0 = each
            node once); default ``settings.connect_timeout`` (the CLI's ``--connect-timeout``).
        name: Connection name shown in the management UI.

    Returns:
        An open aio-pika robust connection (it reconnects by itself afterwards).

    Raises:
        BrokerUnavailableError: no node reachable after ``wait`` seconds; the credentials
            were refused; or every node was refused for good: its TLS certificate (unknown CA,
            host name mismatch) or its port speaking the other protocol (``amqp://`` to a TLS
            port, ``amqps://`` to a plain one). A refused node is not tried again, the others
            are; the message names each refusal. Messages name URLs without passwords.
            Any other error of a connect (a ``TypeError`` from ``ssl``) too, naming the node.
        ConfigurationError: a TLS option of the URL can't be used (unreadable CA file...).

    """
    install_lenient_decoding()
    keep_received_properties()
    install_method_decoding()
    install_fast_frame_reading()
    install_blocked_tracking()
    wait = settings.connect_timeout if wait is None else wait
    log.debug("connecting to %s as %r (retrying a refused connect for %gs)", settings.safe_url, name, wait)
    given = [node(url, i) for i, url in enumerate(settings.nodes, start=1)]
    nodes = [given[i] for i in process_order(tuple(one.address for one in given))]
    rotation = Rotation(nodes)
    started = time.monotonic()
    try:
        with quiet_client_loggers():
            async for attempt in AsyncRetrying(
                # refused credentials or a missing vhost won't fix themselves: no retry; a node refused
                # for good (certificate, scheme/port mismatch) leaves the rotation, the others are tried
                retry=retry_if_exception_type((*_CONNECT_ERRORS, NodeRefused))
                & retry_if_not_exception_type(aiormq.exceptions.ProbableAuthenticationError),
                stop=stop_policy(rotation, started + wait),
                wait=pause_policy(rotation, started + wait),
                before_sleep=attempt_line(rotation, wait, started),
                reraise=True,
            ):
                with attempt:
                    rotation.tried = nodes[rotation.at]
                    left = started + wait - time.monotonic()
                    try:
                        made = await _try_node(nodes, rotation.at, name, attempt_timeout(left))
                        explain_refusals(made, functools.partial(refused_words, settings=settings))
                        return made
                    except NodeRefused as exc:
                        rotation.refuse(str(exc))
                        if not rotation.left:
                            raise BrokerUnavailableError(every_node_refused(rotation.refusals)) from exc.__cause__
                        raise
                    except BaseException:
                        rotation.failed()
                        raise
    except NodeRefused as exc:  # the last node left refused after the deadline  # pragma: no cover
        raise BrokerUnavailableError(every_node_refused(rotation.refusals)) from exc.__cause__
    except aiormq.exceptions.ProbableAuthenticationError as exc:
        raise BrokerUnavailableError(
            f"broker at {settings.safe_url} refused the credentials (user {settings.username!r}): {CREDENTIALS_FIX}"
        ) from exc
    except _CONNECT_ERRORS as exc:
        last = "" if len(nodes) == 1 else f" (each node tried; the last, {rotation.tried.safe_url})"
        refused = "".join(f"; {why}" for why in rotation.refusals)
        why = f"{type(exc).__name__}: {exc}" + (f" ({BUSY_HINT})" if isinstance(exc, TimeoutError) else "")
        raise BrokerUnavailableError(
            f"broker at {settings.safe_url} unreachable after {wait:g}s{last}: {why}{refused}"
        ) from exc
    except _REFUSED as exc:  # e.g. the vhost does not exist
        raise BrokerUnavailableError(
            f"broker at {settings.safe_url} refused the connection: {await refused_words(exc, settings)}"
        ) from exc
    except AmqpJobsError:
        raise
    except (
        Exception
    ) as exc:  # neither a connection error nor a refusal (TypeError from ssl ...): said, never a traceback
        raise BrokerUnavailableError(
            f"broker at {settings.safe_url}: the connect to {rotation.tried.safe_url} failed: "
            f"{type(exc).__name__}: {redact_text(str(exc))}"
        ) from exc
    raise BrokerUnavailableError(f"broker at {settings.safe_url} unreachable")  # pragma: no cover


async def reconnected(connection: AbstractRobustConnection, at_most: float) -> None:
    """Wait until aio-pika has ``connection`` up again, ``at_most`` seconds (then return all the same).

    A loss aio-pika has not handled yet (its ``connected`` event still set) is waited out 50 ms
    at a time. Raises nothing: the caller tries its channel again and decides.
    """
    if connection.connected.is_set():
        await asyncio.sleep(min(max(at_most, 0), 0.05))
        return
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(max(at_most, 0)):
            await connection.connected.wait()


def refusal(connection: AbstractRobustConnection) -> str | None:
    """Why the broker refuses ``connection``'s reconnects for good, in words, or None (not refused so far).

    Its last reconnect attempt failed on the credentials, or on ``connection.open`` (the vhost
    gone, no permissions on it, or its connection limit reached: 530 NOT_ALLOWED, RabbitMQ
    "Access Control"); none fixes itself soon, so a publish waiting for the reconnect says so
    instead of waiting on (the first connect does not retry these either). Once aio-pika's next
    attempt succeeds (every ``reconnect_interval``, 5 s by default) it is None again.
    """
    exc = getattr(connection, "last_failure", None)
    if exc is None:
        return None
    url = URL(str(getattr(connection, "url", "amqp:///")))  # aio-pika's (the node being tried)
    user = url.user or "guest"
    if isinstance(exc, aiormq.exceptions.ProbableAuthenticationError):
        return f"the broker refused the credentials (user {user!r}): {CREDENTIALS_FIX}"
    if open_refused(exc):
        return refused_connect_reason(exc, url.path[1:] or "/", user)
    return None


async def when_connected(
    connection: AbstractRobustConnection, open_: Callable[[], Awaitable[T]], wait: float | None, exchange: str,
    routing_key: str,
) -> T:  # fmt: skip
    """``open_()`` (a channel of ``connection``), tried again while aio-pika reconnects it, up to ``wait`` seconds.

    aio-pika raises ``RuntimeError`` for a channel of a closed connection. ``wait`` None: no wait
    (a worker's copies: a copy sent after a reconnect, its delivery's channel gone, would be a
    duplicate). A reconnect the broker refuses (:func:`refusal`) ends the wait at once; between
    tries, :func:`reconnected` waits :data:`RECONNECT_CHECK` at most (an ``open_`` that raises
    another error, e.g. the publisher closed meanwhile, ends it).

    Raises:
        BrokerUnavailableError: not connected, naming the publish (``exchange`` / ``routing_key``),
            why (refused) or how long it waited (:func:`~amqpjobs.wire.publish_outcome.not_connected`).
    """
    give_up = time.monotonic() + (wait or 0.0)
    while True:
        try:
            return await open_()
        except RuntimeError as exc:
            if wait is None:
                raise BrokerUnavailableError(not_connected(exchange, routing_key)) from exc
            if (why := refusal(connection)) is not None or time.monotonic() >= give_up:
                raise BrokerUnavailableError(not_connected(exchange, routing_key, why, wait)) from exc
            await reconnected(connection, min(give_up - time.monotonic(), RECONNECT_CHECK))
