"""Connecting to the broker (aio-pika), and reading what the broker is.

The first connect is retried with tenacity (a broker still starting refuses
connections); after that, aio-pika's robust connection reconnects by itself
(STYLE: "Reconnect is aio-pika's job").
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass

import aio_pika
import aiormq
from aio_pika.abc import AbstractChannel, AbstractRobustConnection
from tenacity import (
    AsyncRetrying,
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


async def connect(settings: BrokerSettings, *, wait: float = 30.0, name: str = "amqpjobs") -> AbstractRobustConnection:
    """Open a robust connection, retrying the first connect for up to ``wait`` seconds.

    Args:
        settings: Broker settings.
        wait: Seconds to keep retrying a refused first connect (0 = try once).
        name: Connection name shown in the management UI.

    Returns:
        An open aio-pika robust connection (it reconnects by itself afterwards).

    Raises:
        BrokerUnavailableError: still unreachable after ``wait`` seconds, or the
            credentials were refused. The message names the URL without its password.

    """
    install_lenient_decoding()
    keep_received_properties()
    try:
        async for attempt in AsyncRetrying(
            # refused credentials or a missing vhost won't fix themselves: no retry
            retry=retry_if_exception_type(_CONNECT_ERRORS)
            & retry_if_not_exception_type(aiormq.exceptions.ProbableAuthenticationError),
            stop=stop_after_delay(wait),
            wait=wait_exponential(multiplier=0.2, max=2.0),
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
