"""Connecting to the broker (aio-pika), and reading what the broker is.

The first connect is retried with tenacity (a broker still starting refuses
connections); after that, aio-pika's robust connection reconnects by itself
(STYLE: "Reconnect is aio-pika's job").
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import aio_pika
import aiormq
from aio_pika.abc import AbstractChannel, AbstractRobustConnection
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    retry_if_not_exception_type,
    stop_after_delay,
    wait_exponential,
)

from amqpjobs.errors import BrokerUnavailableError
from amqpjobs.wire.codec import install_lenient_decoding
from amqpjobs.wire.copies import keep_received_properties
from amqpjobs.wire.errors import LIBRARY_ERRORS
from amqpjobs.wire.management import parse_version
from amqpjobs.wire.settings import BrokerSettings

log = logging.getLogger("amqpjobs.wire")

#: Errors that mean "the broker is not (yet) there" on connect.
_CONNECT_ERRORS = (OSError, aiormq.exceptions.AMQPConnectionError, ConnectionError)
_REFUSED: tuple[type[BaseException], ...] = (*LIBRARY_ERRORS, ValueError)
#: The client libraries' own loggers, which write several ERROR lines (some with tracebacks)
#: for each refused connect; during our first-connect retries we write one line per attempt instead.
CLIENT_LOGGERS = ("aiormq.connection", "aio_pika.connection", "aio_pika.robust_connection")


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


async def close_channel(channel: AbstractChannel) -> None:
    """Close ``channel`` for good, also after the broker closed it.

    A robust channel closed by the broker (say, a passive declare's ``404``) reopens by
    itself unless ``close()`` is called; calling it always stops that, and a failure to
    close an already closed channel is ignored.
    """
    with contextlib.suppress(Exception):
        await channel.close()


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def broker_info(connection: AbstractRobustConnection) -> BrokerInfo:
    """Read product and version from ``connection``'s server properties.

    Raises:
        BrokerUnavailableError: the connection is not open.

    """
    transport = connection.transport
    if transport is None:
        raise BrokerUnavailableError("not connected")
    props = transport.connection.server_properties
    version_text = _text(props.get("version", "0"))
    return BrokerInfo(_text(props.get("product", "")), parse_version(version_text), version_text)


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
def quiet_client_loggers() -> Iterator[None]:
    """Drop :data:`CLIENT_LOGGERS`' records below CRITICAL for the block (unless amqpjobs logs at DEBUG, ``-v``).

    Each block adds a filter of its own and removes only that one, so overlapping blocks
    (two connects at once) never leave the loggers silenced. Loggers are process-wide: another
    connection of the process reconnecting during the block is quiet too.
    """
    if log.isEnabledFor(logging.DEBUG):
        yield
        return
    loggers = [logging.getLogger(n) for n in CLIENT_LOGGERS]
    quiet = _BelowCritical()
    for lg in loggers:
        lg.addFilter(quiet)
    try:
        yield
    finally:
        for lg in loggers:
            lg.removeFilter(quiet)


def _until(deadline: float) -> Callable[[RetryCallState], float]:
    """Tenacity's ``wait``: 0.2 s doubling up to 2 s, but never past ``deadline`` (the last attempt is at it)."""
    backoff = wait_exponential(multiplier=0.2, max=2.0)

    def pause(state: RetryCallState) -> float:
        return max(0.0, min(backoff(state), deadline - time.monotonic()))

    return pause


def _attempt_line(settings: BrokerSettings, wait: float, started: float) -> Callable[[RetryCallState], None]:
    """Tenacity's ``before_sleep``: one WARNING line of ours per failed attempt."""

    def line(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        pause = state.next_action.sleep if state.next_action is not None else 0.0
        log.warning(
            "broker at %s not reachable (attempt %d, %.1fs of the %gs connect timeout): %s: %s; retrying in %.1fs",
            settings.safe_url, state.attempt_number, time.monotonic() - started, wait,
            type(exc).__name__, exc, pause,
        )  # fmt: skip

    return line


async def connect(
    settings: BrokerSettings, *, wait: float | None = None, name: str = "amqpjobs"
) -> AbstractRobustConnection:
    """Open a robust connection, retrying the first connect for up to ``wait`` seconds.

    Each failed attempt writes one WARNING line (logger ``amqpjobs.wire``); the client
    libraries' own lines are silenced meanwhile (:func:`quiet_client_loggers`).

    Args:
        settings: Broker settings.
        wait: Seconds to keep retrying a refused first connect (0 = try once); default
            ``settings.connect_timeout`` (the CLI's ``--connect-timeout``).
        name: Connection name shown in the management UI.

    Returns:
        An open aio-pika robust connection (it reconnects by itself afterwards).

    Raises:
        BrokerUnavailableError: still unreachable after ``wait`` seconds, or the
            credentials were refused. The message names the URL without its password.

    """
    install_lenient_decoding()
    keep_received_properties()
    wait = settings.connect_timeout if wait is None else wait
    log.debug("connecting to %s as %r (retrying a refused connect for %gs)", settings.safe_url, name, wait)
    try:
        with quiet_client_loggers():
            async for attempt in AsyncRetrying(
                # refused credentials or a missing vhost won't fix themselves: no retry
                retry=retry_if_exception_type(_CONNECT_ERRORS)
                & retry_if_not_exception_type(aiormq.exceptions.ProbableAuthenticationError),
                stop=stop_after_delay(wait),
                wait=_until(time.monotonic() + wait),
                before_sleep=_attempt_line(settings, wait, time.monotonic()),
                reraise=True,
            ):
                with attempt:
                    return await aio_pika.connect_robust(settings.url, client_properties={"connection_name": name})
    except aiormq.exceptions.ProbableAuthenticationError as exc:
        raise BrokerUnavailableError(
            f"broker at {settings.safe_url} refused the credentials (user {settings.username!r})"
        ) from exc
    except _CONNECT_ERRORS as exc:
        raise BrokerUnavailableError(
            f"broker at {settings.safe_url} unreachable after {wait:g}s: {type(exc).__name__}: {exc}"
        ) from exc
    except _REFUSED as exc:  # e.g. the vhost does not exist
        raise BrokerUnavailableError(
            f"broker at {settings.safe_url} refused the connection: {type(exc).__name__}: {exc} "
            f"(does vhost {settings.vhost!r} exist, with permissions for {settings.username!r}?)"
        ) from exc
    raise BrokerUnavailableError(f"broker at {settings.safe_url} unreachable")  # pragma: no cover
