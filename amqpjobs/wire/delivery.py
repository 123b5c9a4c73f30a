"""One delivery, in our own types, with ack/reject bound to the channel it came on.

A delivery tag belongs to its channel: after that channel closes, the broker requeues
the message itself and acking the old tag on a new channel would be a channel error
(RabbitMQ "Consumer Acknowledgements" → "Delivery Tags"). :meth:`Delivery.ack` therefore
raises :class:`DeliveryChannelClosed` instead of ever acking on another channel.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from dataclasses import dataclass, fields
from functools import partial
from typing import Any

import aiormq
from aio_pika.abc import AbstractChannel
from aiormq.abc import AbstractChannel as UnderlayChannel
from aiormq.abc import DeliveredMessage
from pamqp.header import ContentHeader

from amqpjobs.message import OutgoingMessage
from amqpjobs.wire.acks import AckBatcher, DeliveryChannelClosed
from amqpjobs.wire.copies import ReceivedCopy, received_bytes, split_properties
from amqpjobs.wire.errors import LIBRARY_ERRORS
from amqpjobs.wire.header_decoding import table_entries

log = logging.getLogger("amqpjobs.wire")


def run_handler(tasks: set[asyncio.Task[None]], handling: Coroutine[Any, Any, None]) -> None:
    """Run a delivery's handler in a task of our own, kept in ``tasks`` while it runs.

    Ours, not aiormq's: aiormq cancels the tasks it started when their channel closes,
    which would cut a run off without an outcome. A handler that fails is logged (ERROR,
    with its traceback) as aiormq logs a consumer callback that fails; its delivery stays
    unsettled until its channel closes, and the broker then redelivers it.
    """
    task = asyncio.get_running_loop().create_task(handling)
    tasks.add(task)
    task.add_done_callback(partial(_handled, tasks))


def _handled(tasks: set[asyncio.Task[None]], task: asyncio.Task[None]) -> None:
    tasks.discard(task)
    if not task.cancelled() and (failed := task.exception()) is not None:
        log.error("a delivery's handler failed: %r", failed, exc_info=failed)


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

    A copy (:meth:`copy`) is published with the headers and properties as received, byte
    for byte (:mod:`amqpjobs.wire.copies`), from the content header kept here.
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
    _acks: AckBatcher | None = None
    _received: ContentHeader | None = None
    _on_settled: Callable[[], None] | None = None

    def copy(self, headers: Mapping[str, Any], job_id: str, ready_at: int | None = None) -> OutgoingMessage:
        """The same message with other headers, for a tier, quarantine or a replay.

        Args:
            headers: The copy's headers. Values left as received (the same objects) go out
                as received: same type code, same bytes, every entry of their name in the
                received order (a name twice in the table is one key here), :func:`~amqpjobs.wire.copies.copy_table`.
            job_id: The copy's ``message_id`` when the message came without one.
            ready_at: The copy's ``timestamp`` (whole seconds since the epoch: when it becomes
                ready in the work queue), or None to
                keep the received one (quarantine, park).

        Returns:
            A :class:`~amqpjobs.wire.copies.ReceivedCopy` that keeps every property and
            every header it did not change byte for byte (``expiration`` and ``user_id``
            dropped, see :mod:`amqpjobs.wire.copies`); a plain message from the decoded
            values when the received bytes were not kept.
        """
        plain = OutgoingMessage(
            body=self.body,
            headers=headers,
            content_type=self.content_type,
            content_encoding=self.content_encoding,
            message_id=self.message_id or job_id,
            type=self.type,
            timestamp=self.timestamp if ready_at is None else ready_at,
            priority=self.priority,
            correlation_id=self.correlation_id,
            reply_to=self.reply_to,
            app_id=self.app_id,
        )
        received = self._received
        raw = None if received is None else received_bytes(received)
        if received is None or raw is None:
            return plain
        same = {f.name: getattr(plain, f.name) for f in fields(plain)}
        return ReceivedCopy(**same, received=raw, received_headers=received.properties.headers, ready_at=ready_at)

    def header_entries(self) -> list[tuple[str, Any]]:
        """Every entry of the header table as received, in its order, decoded: ``[(name, value), ...]``.

        Where :attr:`headers` (a dict) holds one value per name (the last entry's), this holds
        every entry: a name another publisher sent twice, two names that are not UTF-8 and
        read alike (U+FFFD). Without the received bytes (or a table only pamqp could
        decode), the items of :attr:`headers`.
        """
        raw = None if self._received is None else received_bytes(self._received)
        if raw is not None:
            try:
                table = split_properties(raw).get("headers")
            except ValueError:
                table = None
            entries = None if table is None else table_entries(table)
            if entries is not None:
                return entries
        return list(self.headers.items())

    def properties(self) -> dict[str, Any]:
        """Every basic property as received, by its AMQP name (AMQP 0-9-1 class ``basic``: 14 properties).

        ``content_type``, ``content_encoding``, ``headers``, ``delivery_mode``, ``priority``,
        ``correlation_id``, ``reply_to``, ``expiration``, ``message_id``, ``timestamp``
        (seconds since the epoch), ``type``, ``user_id``, ``app_id``, ``cluster_id``: None
        when not set. Without the received content header (a delivery built from decoded
        values), those this delivery does not keep are None.
        """
        received = None if self._received is None else self._received.properties
        ts = self.timestamp

        def kept(name: str) -> Any:
            return getattr(received, name, None) if received is not None else None

        return {"content_type": self.content_type, "content_encoding": self.content_encoding, "headers": self.headers,
                "delivery_mode": kept("delivery_mode"), "priority": self.priority,
                "correlation_id": self.correlation_id, "reply_to": self.reply_to, "expiration": kept("expiration"),
                "message_id": self.message_id, "timestamp": ts, "type": self.type, "user_id": kept("user_id"),
                "app_id": self.app_id, "cluster_id": kept("cluster_id")}  # fmt: skip

    @property
    def channel_closed(self) -> bool:
        """Whether the channel this delivery came on has closed (the broker then redelivers it)."""
        return bool(self._channel.is_closed)

    @property
    def settleable(self) -> bool:
        """Whether the channel it came on is still open; once closed, the broker has the message back."""
        return not self._channel.is_closed

    async def ack(self, at_once: bool = False) -> None:
        """Ack on the delivery's own channel.

        Args:
            at_once: A worker's consumer batches its acks per loop turn (:class:`AckBatcher`);
                True sends this one now (its copy is confirmed: README "When a job crashes").

        Raises:
            DeliveryChannelClosed: that channel is closed; the broker redelivers.

        """
        if self._acks is not None:  # a worker's consumer: batched per loop turn, unless at once
            await self._acks.ack(self.delivery_tag, at_once)
            return
        try:
            # no wait for the socket drain: an ack has no reply either way, and a lost one means a
            # redelivery (at least once); a closed channel still raises here, before anything is sent
            await self._channel.basic_ack(self.delivery_tag, wait=False)
        except LIBRARY_ERRORS as exc:
            raise DeliveryChannelClosed(str(exc)) from exc
        if self._on_settled is not None:
            self._on_settled()

    async def reject(self) -> None:
        """Reject without requeue: the work queue dead-letters it into quarantine.

        Raises:
            DeliveryChannelClosed: the channel is closed; the broker redelivers.

        """
        try:
            await self._channel.basic_reject(self.delivery_tag, requeue=False)
        except LIBRARY_ERRORS as exc:
            raise DeliveryChannelClosed(str(exc)) from exc
        if self._acks is not None:
            self._acks.rejected(self.delivery_tag)
        if self._on_settled is not None:
            self._on_settled()

    async def requeue(self) -> None:
        """Hand the delivery back to its queue (``basic.nack`` with requeue; it returns ``redelivered``).

        Raises:
            DeliveryChannelClosed: the channel is closed; the broker requeues it anyway.

        """
        try:
            await self._channel.basic_nack(self.delivery_tag, requeue=True)
        except LIBRARY_ERRORS as exc:
            raise DeliveryChannelClosed(str(exc)) from exc
        if self._acks is not None:
            self._acks.rejected(self.delivery_tag)
        if self._on_settled is not None:
            self._on_settled()


def delivery_from_aiormq(message: DeliveredMessage, queue: str, acks: AckBatcher | None = None) -> Delivery:
    """Wrap an aiormq delivery (``basic.deliver`` or ``basic.get-ok``) from ``queue`` (:func:`delivery_from_frames`)."""
    return delivery_from_frames(message.delivery, message.header, message.body, message.channel, queue, acks)


def delivery_from_frames(
    frame: Any,
    header: ContentHeader,
    body: bytes,
    channel: UnderlayChannel,
    queue: str,
    acks: AckBatcher | None = None,
    owner: str = "",
) -> Delivery:
    """Wrap a delivery read off ``channel`` (a ``basic.deliver`` or ``basic.get-ok`` frame, its header and body).

    The hot path of the worker (:mod:`amqpjobs.wire.consume`, :mod:`amqpjobs.wire.delivery_tap`):
    properties are read straight from pamqp's decoded content header. With ``acks`` (the
    channel's batcher), the delivery is noted there and its :meth:`Delivery.ack` is batched;
    ``owner`` (its consumer tag) lets :meth:`AckBatcher.hold` hold its ack.
    """
    p = header.properties
    if acks is not None:
        acks.delivered(frame.delivery_tag, owner)
    ts, message_id = p.timestamp, p.message_id
    return Delivery(
        body,
        dict(p.headers) if p.headers else {},
        p.content_type,
        p.content_encoding,
        message_id if message_id and not message_id.isspace() else None,  # blank: no job id (job_id_problem's rule)
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
        channel,
        acks,
        header,
    )


async def get_unacked(
    channel: AbstractChannel, queue: str, max_count: int, on_settled: Callable[[], None] | None = None
) -> AsyncIterator[Delivery]:
    """Up to ``max_count`` deliveries of ``queue`` by ``basic.get``, unacked (fewer if it runs empty).

    For quarantine browsing and replay: each is acked (or, when the channel closes, returned
    to the queue) by the caller. Read with aiormq, so their copies keep the received bytes.
    ``on_settled`` is called once a delivery's ack, reject or requeue is sent (the browser's
    count of the messages it holds).
    """
    underlay = await channel.get_underlay_channel()
    for _ in range(max_count):
        message = await underlay.basic_get(queue, no_ack=False)
        if not isinstance(message.delivery, aiormq.spec.Basic.GetOk):
            return
        delivery = delivery_from_aiormq(message, queue)
        delivery._on_settled = on_settled
        yield delivery
