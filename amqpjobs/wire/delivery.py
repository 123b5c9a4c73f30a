"""One delivery, in our own types, with ack/reject bound to the channel it came on.

A delivery tag belongs to its channel: after that channel closes, the broker requeues
the message itself and acking the old tag on a new channel would be a channel error
(RabbitMQ "Consumer Acknowledgements" → "Delivery Tags"). :meth:`Delivery.ack` therefore
raises :class:`DeliveryChannelClosed` instead of ever acking on another channel.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiormq
from aio_pika.abc import AbstractIncomingMessage
from aiormq.abc import AbstractChannel as UnderlayChannel
from aiormq.abc import DeliveredMessage

from amqpjobs.jobs import envelope


class DeliveryChannelClosed(Exception):
    """The channel a delivery came on has closed; the broker will redeliver the message."""


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


@dataclass(slots=True)
class Delivery:
    """A delivery from a work queue.

    Attributes:
        body: Raw body.
        headers: Header table as received (never None).
        content_type / content_encoding / message_id / type: AMQP properties (or None).
        timestamp: ``timestamp`` property, seconds since the epoch, or None.
        priority / correlation_id / reply_to / app_id: AMQP properties (or None).
        redelivered: The broker's ``redelivered`` flag.
        exchange / routing_key: Where it was published.
        queue: The work queue it was consumed from.
        delivery_tag: The delivery tag on the channel it came on.

    """

    body: bytes
    headers: dict[str, Any]
    content_type: str | None
    content_encoding: str | None
    message_id: str | None
    type: str | None
    timestamp: float | None
    priority: int | None
    correlation_id: str | None
    reply_to: str | None
    app_id: str | None
    redelivered: bool
    exchange: str
    routing_key: str
    queue: str
    delivery_tag: int
    _channel: UnderlayChannel

    @property
    def job_name(self) -> str:
        """Job name: the ``type`` property, else our ``amqpjobs-job`` header, else ``""``."""
        return self.type or _text(self.headers.get(envelope.JOB)) or ""

    @property
    def tenant(self) -> str | None:
        """Tenant key from our header, or None."""
        return _text(self.headers.get(envelope.TENANT))

    @property
    def enqueued_at(self) -> datetime | None:
        """First enqueue time: our header, else the ``timestamp`` property."""
        raw = _text(self.headers.get(envelope.ENQUEUED_AT))
        if raw:
            try:
                return datetime.fromisoformat(raw.replace("Z", "+00:00"))
            except ValueError:
                pass
        return None if self.timestamp is None else datetime.fromtimestamp(self.timestamp, UTC)

    def copy(self, headers: Mapping[str, Any], job_id: str) -> envelope.OutgoingMessage:
        """The same message (body and properties) with other headers, for a tier or quarantine."""
        return envelope.OutgoingMessage(
            body=self.body,
            headers=headers,
            content_type=self.content_type,
            content_encoding=self.content_encoding,
            message_id=self.message_id or job_id,
            type=self.type,
            timestamp=self.timestamp,
            priority=self.priority,
            correlation_id=self.correlation_id,
            reply_to=self.reply_to,
            app_id=self.app_id,
        )

    async def ack(self) -> None:
        """Ack on the delivery's own channel.

        Raises:
            DeliveryChannelClosed: that channel is closed; the broker redelivers.

        """
        try:
            # no wait for the socket drain: an ack has no reply either way, and a lost one means a
            # redelivery (at least once); a closed channel still raises here, before anything is sent
            await self._channel.basic_ack(self.delivery_tag, wait=False)
        except (
            aiormq.exceptions.ChannelInvalidStateError,
            aiormq.exceptions.AMQPError,
            ConnectionError,
        ) as exc:
            raise DeliveryChannelClosed(str(exc)) from exc

    async def reject(self) -> None:
        """Reject without requeue: the work queue dead-letters it into quarantine.

        Raises:
            DeliveryChannelClosed: the channel is closed; the broker redelivers.

        """
        try:
            await self._channel.basic_reject(self.delivery_tag, requeue=False)
        except (
            aiormq.exceptions.ChannelInvalidStateError,
            aiormq.exceptions.AMQPError,
            ConnectionError,
        ) as exc:
            raise DeliveryChannelClosed(str(exc)) from exc


def delivery_from_aiormq(message: DeliveredMessage, queue: str) -> Delivery:
    """Wrap an aiormq delivery (``basic.deliver`` or ``basic.get-ok``) from ``queue``.

    The hot path of the worker (:mod:`amqpjobs.wire.consume`): properties are read straight
    from pamqp's decoded content header.
    """
    p = message.header.properties
    frame: Any = message.delivery
    ts = p.timestamp
    return Delivery(
        message.body,
        dict(p.headers) if p.headers else {},
        p.content_type,
        p.content_encoding,
        p.message_id,
        p.message_type,
        None if ts is None else ts.timestamp(),
        p.priority,
        p.correlation_id,
        p.reply_to,
        p.app_id,
        bool(frame.redelivered),
        frame.exchange or "",
        frame.routing_key or "",
        queue,
        frame.delivery_tag,
        message.channel,
    )


def delivery_of(message: AbstractIncomingMessage, queue: str) -> Delivery:
    """Wrap an aio-pika message read from ``queue`` (``basic.get``: quarantine browsing and replay)."""
    ts = message.timestamp
    tag = message.delivery_tag
    assert tag is not None, "a message from basic.get or basic.deliver has a delivery tag"
    return Delivery(
        body=message.body,
        headers=dict(message.headers or {}),
        content_type=message.content_type,
        content_encoding=message.content_encoding,
        message_id=message.message_id,
        type=message.type,
        timestamp=None if ts is None else ts.timestamp(),
        priority=message.priority,
        correlation_id=message.correlation_id,
        reply_to=message.reply_to,
        app_id=message.app_id,
        redelivered=bool(message.redelivered),
        exchange=message.exchange or "",
        routing_key=message.routing_key or "",
        queue=queue,
        delivery_tag=tag,
        _channel=message.channel,
    )
