"""Outcome events on the wire: the worker's fire-and-forget publisher, and a subscription.

Events (their body is :mod:`amqpjobs.jobs.events`'s; this layer moves bytes) go to the topic exchange
:data:`~amqpjobs.topology.naming.EVENTS_EXCHANGE` without publisher confirms and without
``mandatory``: nobody subscribed means nobody hears them, by design. The publisher never
makes a job wait and never fails one: :meth:`OutcomeEvents.emit` only queues a publish,
and drops the event (counting it) when the exchange was missing at start, the channel is
closed, or :data:`MAX_PENDING` publishes are still waiting to reach the socket (the
broker blocked the connection under a resource alarm, RabbitMQ "Blocked Connection
Notifications", or the network stalls).

The exchange is probed once at start (a passive declare on a throwaway channel): a
publish to a missing exchange makes the broker close the channel (``404``), and a frame
sent after that close can cost the whole connection (:class:`~amqpjobs.wire.publish.ConfirmedPublisher`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

import aiormq
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage

from amqpjobs.errors import NotFoundError
from amqpjobs.topology.naming import EVENTS_EXCHANGE
from amqpjobs.wire.abc import Connection
from amqpjobs.wire.browse import Watch
from amqpjobs.wire.connection import close_channel
from amqpjobs.wire.errors import broker_errors

log = logging.getLogger("amqpjobs.worker")

#: Event publishes that may wait for the socket at once; more are dropped.
MAX_PENDING = 32
#: Basic properties of an event: JSON, transient (``delivery_mode`` 1), no confirm.
_PROPERTIES = aiormq.spec.Basic.Properties(content_type="application/json", delivery_mode=1)


async def exchange_exists(connection: Connection, name: str) -> bool:
    """Whether exchange ``name`` exists (a passive declare on a throwaway channel)."""
    channel = await connection.channel(publisher_confirms=False)
    try:
        with broker_errors():
            await channel.declare_exchange(name, passive=True)
        return True
    except NotFoundError:
        return False
    finally:
        await close_channel(channel)


class OutcomeEvents:
    """The worker's outcome event publisher (see the module docstring).

    Build it with :meth:`open`. Attributes ``published`` and ``dropped`` count events.

    Args:
        channel: A channel without confirms, or None when events are off (exchange missing).
        on_drop: Called once per dropped event (a metric).
    """

    def __init__(self, channel: AbstractChannel | None, on_drop: Callable[[], None] | None = None) -> None:
        self._channel = channel
        self._on_drop = on_drop
        self._pending: set[asyncio.Task[None]] = set()
        self.published = 0
        self.dropped = 0

    @classmethod
    async def open(cls, connection: Connection, on_drop: Callable[[], None] | None = None) -> OutcomeEvents:
        """A publisher on a channel of ``connection``; events off (all dropped) when the exchange is missing."""
        if not await exchange_exists(connection, EVENTS_EXCHANGE):
            log.warning(
                "outcome events are off: exchange %s does not exist (amqpjobs topology apply declares it); "
                "jobs run as usual", EVENTS_EXCHANGE,
            )  # fmt: skip
            return cls(None, on_drop)
        return cls(await connection.channel(publisher_confirms=False), on_drop)

    def emit(self, routing_key: str, body: bytes) -> None:
        """Queue the publish of an event; never waits, never raises (a dropped event is counted).

        Args:
            routing_key: ``<job queue>.<outcome>`` (:func:`~amqpjobs.topology.naming.event_routing_key`).
            body: The event's JSON body (:meth:`amqpjobs.jobs.events.OutcomeEvent.encode`).
        """
        channel = self._channel
        if channel is None or channel.is_closed or len(self._pending) >= MAX_PENDING:
            self._drop()
            return
        task = asyncio.get_running_loop().create_task(self._publish(channel, routing_key, body))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _publish(self, channel: AbstractChannel, routing_key: str, body: bytes) -> None:
        try:
            underlay = await channel.get_underlay_channel()
            await underlay.basic_publish(
                body, exchange=EVENTS_EXCHANGE, routing_key=routing_key, properties=_PROPERTIES
            )
            self.published += 1
        except Exception:  # closed or closing channel, connection lost: events are best effort
            self._drop()

    def _drop(self) -> None:
        self.dropped += 1
        if self._on_drop is not None:
            self._on_drop()

    async def close(self) -> None:
        """Give publishes under way a moment (0.5 s), then close the channel (the rest are dropped)."""
        if self._pending:
            _, late = await asyncio.wait(set(self._pending), timeout=0.5)
            for task in late:
                task.cancel()
        if self._channel is not None:
            await close_channel(self._channel)


async def subscribe_outcomes(
    connection: Connection, on_body: Callable[[bytes], None], binding_keys: Sequence[str] = ("#",)
) -> Watch:
    """Hear outcome events: an exclusive, auto-delete queue of our own bound with ``binding_keys``.

    Subscribe *before* causing the outcomes you wait for: events published before the
    binding exists are not kept for anyone.

    Args:
        connection: An open connection (the queue lives as long as the returned watch's channel).
        on_body: Called with each event's body, in arrival order (read it with
            :func:`amqpjobs.jobs.events.decode_event`).
        binding_keys: Topic binding keys, e.g. ``["mail.*"]`` for every outcome of job queue
            ``mail``, ``["*.quarantined"]``; default every event.

    Returns:
        A :class:`~amqpjobs.wire.browse.Watch`; close it to stop (the queue goes with it).

    Raises:
        NotFoundError: the events exchange does not exist (apply the topology).
        BrokerError: the broker refused the queue or a binding.

    """
    channel = await connection.channel(publisher_confirms=False)
    try:
        with broker_errors():
            queue = await channel.declare_queue("", exclusive=True, durable=False, auto_delete=True)
            for key in binding_keys:
                await queue.bind(EVENTS_EXCHANGE, key)
    except BaseException:
        await close_channel(channel)
        raise

    async def on_message(message: AbstractIncomingMessage) -> None:
        on_body(message.body)

    with broker_errors():
        await queue.consume(on_message, no_ack=True)
    return Watch(channel)
