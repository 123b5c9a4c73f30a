"""A robust channel the worker's shard dispatcher takes deliveries on (:mod:`amqpjobs.runtime.dispatch`).

Two ways to take, both unacked and both bounded by the caller:

* :meth:`Lane.get`: one ``basic.get``: exactly one message or none, plus how many are
  left behind it (``get-ok``'s ``message_count``);
* :meth:`Lane.lease`: a consumer with ``prefetch`` (per consumer: ``basic.qos`` then
  ``basic.consume``, under a new consumer tag each time: RabbitMQ 3.10 quorum queues close
  the channel when a tag is reused right after a cancel, and aiormq drops deliveries for a
  tag it no longer knows). :meth:`Lane.end_lease` cancels it and returns at ``cancel-ok``.
  On classic queues every delivery the broker sent before it read the cancel arrives
  before the ``cancel-ok``, so a caller that keeps the lease's slots until then never
  holds more than it reserved. On quorum queues a cancel returns deliveries in flight to
  the queue marked ``redelivered`` (a worker takes them for crashed starts): a lease
  there is drained before its cancel (``drain``, see :meth:`Lane.end_lease`).

The dispatcher gets from each shard and leases it on a lane of its own: gets on one
channel wait for each other, and a ``basic.get`` or ``basic.consume`` that meets a deleted
shard (404) closes only that shard's channel, never the one another shard's running jobs
will ack on (they would be redelivered and run twice). Acks of one lane finished in one
turn of the event loop go out as one frame (:class:`AckBatcher`; every delivery of a lane
is noted there, gets and consumers alike). Reconnecting is aio-pika's robust channel;
:attr:`Lane.on_reopen` is told, since the old channel's leases and delivery tags are gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import aiormq
from aio_pika.abc import AbstractChannel, AbstractRobustConnection
from aiormq.abc import AbstractChannel as UnderlayChannel
from aiormq.abc import DeliveredMessage
from pamqp.commands import Basic
from pamqp.header import ContentHeader

from amqpjobs.errors import BrokerError, NotFoundError
from amqpjobs.wire.acks import AckBatcher
from amqpjobs.wire.connection import close_channel
from amqpjobs.wire.delivery import Delivery, delivery_from_aiormq, delivery_from_frames, run_handler
from amqpjobs.wire.delivery_tap import tap, untap
from amqpjobs.wire.errors import CHANNEL_OPEN_ERRORS, broker_errors, channel_limit_hint

log = logging.getLogger("amqpjobs.wire")

#: Called with each delivery of a lease, in a task of its own (the lane's: a closing channel does not
#: cancel it); it must settle it.
LeaseHandler = Callable[[Delivery], Coroutine[Any, Any, None]]
#: Called once when the broker cancels a lease (queue deleted, node down).
LeaseLost = Callable[[], None]

_FAILURES = CHANNEL_OPEN_ERRORS


@dataclass(eq=False, slots=True)
class _Consumer:
    """A lease's consumer: the channel it consumes on, what to call if the broker cancels it."""

    underlay: aiormq.Channel
    lost: Callable[[], None]
    prefetch: int
    last: float = field(default_factory=time.monotonic)  # when its last delivery came (or it started)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)  # set at each delivery (a draining end waits)


@dataclass(slots=True)
class Taken:
    """What one ``basic.get`` took: the delivery and how many messages were left behind it."""

    delivery: Delivery
    remaining: int


class Lane:
    """A robust channel of its own to take deliveries on.

    Args:
        connection: The worker's robust connection.
        name: What the lane serves, for logs (a work queue, or a job queue's leases).
        batch_acks: Send acks once per loop turn (:class:`AckBatcher`); False acks at once.
        safe_url: The broker URL without password, for error messages.

    """

    def __init__(
        self, connection: AbstractRobustConnection, name: str, batch_acks: bool = True, safe_url: str = ""
    ) -> None:
        self.connection = connection
        self.name = name
        self.batch_acks = batch_acks
        self.safe_url = safe_url
        self.channel: AbstractChannel | None = None
        #: Called (no arguments) after aio-pika reopened the channel: its leases and delivery tags are gone.
        self.on_reopen: Callable[[], None] = lambda: None
        self._acks: AckBatcher | None = None
        self._probe = ""  # a queue whose passive declare is the lane's round trip (settle)
        self._leases: dict[str, _Consumer] = {}  # lease (consumer) tag -> its consumer
        self._tasks: set[asyncio.Task[None]] = set()  # lease handlers under way (strong references)

    async def open(self, queues: Sequence[str]) -> None:
        """Open the channel and check that the queues it will take from exist.

        Raises:
            BrokerError: a queue does not exist (apply the topology first).

        """
        channel = await self.connection.channel(publisher_confirms=False)
        self.channel = channel
        for queue in queues:
            try:
                # robust=False: a reopened channel must not declare it (see WorkQueueConsumer.start)
                await channel.declare_queue(queue, passive=True, robust=False)
            except Exception as exc:
                await self.close()
                raise BrokerError(
                    f"work queue {queue!r} does not exist on {self.safe_url}: "
                    "apply the topology first (amqpjobs topology apply)"
                ) from exc
        self._probe = queues[0]
        channel.reopen_callbacks.add(self._reopened)

    @property
    def is_open(self) -> bool:
        """Whether the channel is open now (False while the connection is being restored)."""
        return self.channel is not None and not self.channel.is_closed

    def _reopened(self, *_: Any) -> None:
        # after a reconnect (the connection's own lines say so), or after the broker closed it (a missing queue's 404)
        log.debug("channel for %s reopened", self.name)
        self._leases.clear()  # they were on the old channel
        self.on_reopen()

    async def _underlay(self) -> aiormq.Channel:
        channel = self.channel
        if channel is None or channel.is_closed:  # don't wait for a reconnect: the caller tries again later
            raise BrokerError(f"the channel for {self.name} is closed (reconnecting)")
        return cast(aiormq.Channel, await channel.get_underlay_channel())

    def _acks_for(self, channel: aiormq.abc.AbstractChannel) -> AckBatcher:
        acks = self._acks
        if acks is None or acks.channel is not channel:  # first delivery, or the first after a reconnect
            acks = self._acks = AckBatcher(channel, batch=self.batch_acks)
        return acks

    async def get(self, queue: str) -> Taken | None:
        """Take one message of ``queue`` with ``basic.get`` (unacked: settle it through the delivery); None when empty.

        Never cancel this call while it waits: aiormq closes the channel on a cancelled
        synchronous call, and the broker requeues what the channel held as redelivered.

        Raises:
            BrokerError: the channel or connection failed, or the queue is gone (nothing was taken).

        """
        underlay = await self._underlay()
        try:
            message: Any = await underlay.basic_get(queue, no_ack=False)
        except _FAILURES as exc:
            raise BrokerError(
                f"basic.get on {queue} failed: {type(exc).__name__}: {exc}{channel_limit_hint(exc)}"
            ) from exc
        frame = message.delivery
        if not isinstance(frame, Basic.GetOk):
            return None
        delivery = delivery_from_aiormq(message, queue, self._acks_for(message.channel))
        return Taken(delivery, int(frame.message_count or 0))

    async def exists(self, queue: str) -> bool:
        """Whether ``queue`` exists (a passive declare on this lane's channel).

        A missing queue closes this channel (404), which is reopened: a lease looks here first,
        so that its ``basic.consume`` rarely meets a deleted shard (when it does, only this
        shard's channel closes: each shard has its own).

        Raises:
            BrokerError: the channel or connection failed otherwise.

        """
        underlay = await self._underlay()
        try:
            with broker_errors():
                await underlay.queue_declare(queue, passive=True)
        except NotFoundError:
            return False
        return True

    async def lease(
        self,
        queue: str,
        prefetch: int,
        handler: LeaseHandler,
        lost: LeaseLost,
        arguments: Mapping[str, Any] | None = None,
        drain: bool = False,
    ) -> str:
        """Consume ``queue`` with ``prefetch`` under a new consumer tag; returns the tag.

        Args:
            queue: The queue.
            prefetch: Unacked deliveries the broker may hand this consumer (>= 1).
            handler: Called with each delivery (see :data:`LeaseHandler`).
            lost: Called once if the broker cancels the consumer.
            arguments: ``basic.consume`` arguments (``x-consumer-timeout``, milliseconds).
            drain: A quorum queue: :meth:`end_lease` first uses up the consumer's credit
                (see there), so its cancel returns nothing to the queue.

        Raises:
            BrokerError: the channel failed (no consumer is left behind).

        """
        tag = f"amqpjobs.{uuid.uuid4().hex[:16]}"
        owner = tag if drain else ""

        def on_frames(frame: Any, header: ContentHeader, body: bytes, channel: UnderlayChannel) -> None:
            delivery = delivery_from_frames(frame, header, body, channel, queue, self._acks_for(channel), owner)
            if drain and (consumer := self._leases.get(tag)) is not None:
                consumer.last = time.monotonic()
                consumer.arrived.set()
            run_handler(self._tasks, handler(delivery))  # not aiormq's task: a closing channel would cancel it

        async def on_message(message: DeliveredMessage) -> None:  # through aiormq (not the audited one)
            on_frames(message.delivery, message.header, message.body, message.channel)

        def on_lost() -> None:
            log.warning("the broker cancelled the lease on %s (queue deleted or moved, or a run past its "
                        "x-consumer-timeout, which returns to the queue)", queue)  # fmt: skip
            lost()

        underlay = await self._underlay()
        try:
            await underlay.basic_qos(prefetch_count=prefetch)  # per consumer: for the consumer started next
            if self._on_cancel not in underlay.on_consumer_cancel_callbacks:  # once per channel, for good
                underlay.on_consumer_cancel_callbacks.add(self._on_cancel)
            self._leases[tag] = _Consumer(underlay, on_lost, prefetch)
            tapped = tap(underlay)
            if tapped is not None:  # registered before the consume: its first delivery may follow consume-ok at once
                tapped.consume(tag, on_frames)
            await underlay.basic_consume(queue, on_message, consumer_tag=tag, arguments=dict(arguments or {}))
        except _FAILURES as exc:
            self._forget(tag)
            raise BrokerError(
                f"consuming {queue} failed: {type(exc).__name__}: {exc}{channel_limit_hint(exc)}"
            ) from exc
        return tag

    def _on_cancel(self, frame: Basic.Cancel) -> None:
        """The broker cancelled a consumer on one of the lane's channels: tell its lease, if it is one.

        One callback per channel, never removed: aiormq calls its cancel callbacks while
        iterating their set, and a callback that changes the set ("Set changed size during
        iteration") ends the channel's frame reader; its close then waits 10 s for a close-ok
        nobody reads, and aiormq's second ``channel.close`` makes the broker close the whole
        connection (504 "expected 'channel.open'").
        """
        entry = self._leases.get(frame.consumer_tag or "")
        if entry is not None:
            self._forget(frame.consumer_tag or "")
            entry.lost()

    def _forget(self, tag: str) -> None:
        entry = self._leases.pop(tag, None)
        if entry is not None:
            untap(entry.underlay, tag)
            entry.arrived.set()  # a drain waiting for it ends

    def _gone(self, tag: str) -> bool:
        entry = self._leases.get(tag)
        return entry is None or entry.underlay.is_closed or tag not in entry.underlay.consumers

    async def end_lease(self, tag: str, quiet: float = 0.0) -> None:
        """Cancel a lease's consumer and return at ``cancel-ok`` (at once when its channel is gone).

        Every delivery the broker sent to it before it read the cancel has reached the
        lease's handler by then (classic queues).

        A quorum queue instead returns to the queue, marked ``redelivered`` (a worker takes
        them for crashed starts), the deliveries in flight to a consumer it cancels. So a
        lease leased with ``drain`` first holds its acks (:meth:`AckBatcher.hold`): the
        broker's credit for it only shrinks, and once it is used up (``prefetch`` deliveries
        unacked) nothing can be in flight and the cancel is sent; or once no delivery came
        for ``quiet`` seconds (its queue ran dry: a message published during the cancel's
        round trip may still go back as redelivered). The held acks go out after ``cancel-ok``.

        Args:
            tag: The lease's consumer tag.
            quiet: Seconds without a delivery after which a draining lease is cancelled.
        """
        entry = self._leases.get(tag)
        if entry is None or self._gone(tag):
            self._forget(tag)
            return  # its channel is gone (nothing more arrives on it), or the broker cancelled it
        acks = self._acks_for(entry.underlay) if quiet > 0 else None
        try:
            if acks is not None:
                acks.hold(tag)
                began = time.monotonic()  # acks sent just before may still bring deliveries: wait from here too
                while not self._gone(tag) and acks.outstanding(tag) < entry.prefetch:
                    left = max(began, entry.last) + quiet - time.monotonic()
                    if left <= 0:
                        break
                    entry.arrived.clear()
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(left):
                            await entry.arrived.wait()
                if self._gone(tag):
                    return
            await entry.underlay.basic_cancel(tag)
        except _FAILURES as exc:  # the channel closed meanwhile
            log.debug("cancelling lease %s for %s failed: %s", tag, self.name, exc)
        finally:
            self._forget(tag)
            if acks is not None:
                await acks.release(tag)

    async def flush_acks(self) -> None:
        """Send the acks still batched (before closing the connection, or before taking again)."""
        if self._acks is not None:
            await self._acks.flush()

    async def settle(self) -> None:
        """Make sure the broker has every ack sent so far: flush, then a round trip on the channel.

        The broker handles a channel's frames in order: once the answer to a passive
        ``queue.declare`` is back, the acks sent before it are settled.
        """
        await self.flush_acks()
        channel = self.channel
        if channel is None or channel.is_closed:
            return
        with contextlib.suppress(Exception):  # a closed channel: the broker requeues what it held
            underlay = cast(aiormq.Channel, await channel.get_underlay_channel())
            await underlay.queue_declare(self._probe, passive=True)

    async def close(self) -> None:
        """Close the channel (anything taken and not settled returns to the queue)."""
        channel, self.channel = self.channel, None
        if channel is not None:
            await close_channel(channel)
