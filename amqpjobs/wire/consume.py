"""One consumer on a work queue: its own robust channel, ``prefetch_count`` = slots, deliveries as :class:`Delivery`.

A worker's N slots for a work queue are one consumer with ``basic.qos(prefetch_count=N)``
(per consumer, never global: RabbitMQ "Consumer Prefetch"), so the broker hands this
process at most N unacked deliveries of that queue, one per slot, and a slot freed by an
ack is filled by the next delivery (fair dispatch between workers, as with N consumers of
prefetch 1, at a fraction of the client cost: one channel instead of N).

Deliveries are taken at aiormq's level (``basic.consume`` on the robust channel's
underlying channel) and turned straight into :class:`Delivery`, skipping aio-pika's
per-message object and second task, the largest per-job cost of a Python consumer; where
aiormq is the audited one, straight off its connection reader
(:mod:`amqpjobs.wire.delivery_tap`: no frame queue, no task of aiormq's per delivery).
Reconnecting stays aio-pika's job (STYLE 7): the robust connection reopens the channel,
restores its QoS, and calls our re-declare hook, which looks for the queue on a throwaway
channel and consumes again under the same consumer tag. A ``basic.cancel`` from the broker (the queue
was deleted, a node went away, a 4.3 consumer timeout: RabbitMQ "Consumer Cancel Notification")
makes the consumer try again every second, under a new tag, until the queue is back or the
consumer is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, cast

import aiormq
import pamqp.exceptions
from aio_pika.abc import AbstractChannel, AbstractRobustConnection
from aiormq.abc import AbstractChannel as UnderlayChannel
from aiormq.abc import DeliveredMessage
from pamqp.commands import Basic
from pamqp.header import ContentHeader
from tenacity import AsyncRetrying, retry_if_exception_type, wait_fixed

from amqpjobs.errors import BrokerError, NotFoundError
from amqpjobs.wire.acks import AckBatcher
from amqpjobs.wire.arguments import consume_arguments
from amqpjobs.wire.connection import close_channel
from amqpjobs.wire.consume_lines import MISSING_FIX, AgainLine, MissingLine
from amqpjobs.wire.declare import declaring
from amqpjobs.wire.delivery import Delivery, delivery_from_frames, run_handler
from amqpjobs.wire.delivery_tap import tap
from amqpjobs.wire.errors import ChannelReopening, error_kind, in_our_words
from amqpjobs.wire.left_closed import reopen_if_left_closed
from amqpjobs.wire.single_file import SingleFile

log = logging.getLogger("amqpjobs.wire")

#: What a delivery is handed to: a coroutine run in a task of its own, which a closing channel does not cancel.
DeliveryHandler = Callable[[Delivery], Coroutine[Any, Any, None]]
__all__ = ["MISSING_FIX", "DeliveryHandler", "WorkQueueConsumer"]


def _new_tag() -> str:
    """A consumer tag of ours, never used before (a cancelled tag must not be reused)."""
    return f"amqpjobs.{uuid.uuid4().hex[:16]}"


class WorkQueueConsumer:
    """Consumes one work queue on a channel of its own with ``prefetch_count`` slots.

    Args:
        connection: The worker's robust connection.
        queue: Work queue name (it must exist: the topology is applied at deploy time).
        prefetch: Unacked deliveries the broker may hand this consumer (= slots), >= 1.
        handler: Called with each :class:`Delivery` in a task of its own (ours: a closing
            channel does not cancel it); it must ack or reject the delivery itself.
        safe_url: The broker URL without password, for error messages.
        consumer_timeout: Seconds, sent as the ``x-consumer-timeout`` consume argument
            (quorum queues on RabbitMQ 4.3+); None sends none.

    """

    def __init__(
        self,
        connection: AbstractRobustConnection,
        queue: str,
        prefetch: int,
        handler: DeliveryHandler,
        safe_url: str = "",
        consumer_timeout: float | None = None,
    ) -> None:
        self.connection = connection
        self.arguments = consume_arguments(consumer_timeout)
        self.queue = queue
        self.prefetch = prefetch
        self.handler = handler
        self.safe_url = safe_url
        self.tag = _new_tag()
        self.channel: AbstractChannel | None = None
        self._closing = False
        self._paused = False
        self._switch = asyncio.Lock()  # one pause or resume at a time, in the order asked
        self._qos_on: tuple[int, int] | None = None  # (channel id, prefetch) last set by _consume
        self._retry: asyncio.Task[None] | None = None
        #: Called when consuming again finds the queue missing (404), before one more try: a queue the
        #: workers declare themselves (a rate limit's) is declared again there. None: wait for it.
        self.on_missing: Callable[[], Awaitable[None]] | None = None
        self._consuming_on: aiormq.Channel | None = None
        self._missing = MissingLine(queue, safe_url)  # the warning that it is missing, paced
        self._single = SingleFile()  # one delivery at a time after a 541 (one_at_a_time)
        self._widening: asyncio.Task[None] | None = None
        self._again = AgainLine(queue)  # one "consuming again" line per recovery
        self._acks: AckBatcher | None = None
        self._tasks: set[asyncio.Task[None]] = set()  # handler runs under way (strong references)

    @property
    def paused(self) -> bool:
        """Whether :meth:`pause` stopped deliveries on purpose (until :meth:`resume`)."""
        return self._paused

    @property
    def consuming(self) -> bool:
        """Whether the broker currently delivers to this consumer (an open channel that holds the tag)."""
        ch = self._consuming_on
        return ch is not None and not ch.is_closed and self.tag in ch.consumers

    async def start(self) -> None:
        """Open the channel, set its prefetch and start consuming (not yet when :meth:`pause` came first).

        Raises:
            BrokerError: the work queue does not exist (apply the topology first), or no
                answer in time (:data:`~amqpjobs.wire.declare.DECLARE_TIMEOUT`).

        """
        channel = await self.connection.channel(publisher_confirms=False)
        self.channel = channel
        await channel.set_qos(prefetch_count=self.prefetch)
        try:
            async with declaring(f"looking for work queue {self.queue!r}", self.safe_url):
                # robust=False: the channel must not re-declare it when it reopens; were the queue gone
                # by then, the reopen itself would fail. _consume() probes for it instead.
                await channel.declare_queue(self.queue, passive=True, robust=False)
        except BrokerError:
            await self.close()
            raise
        except Exception as exc:
            await self.close()
            raise BrokerError(
                f"work queue {self.queue!r} does not exist on {self.safe_url}: "
                "apply the topology first (amqpjobs topology apply)"
            ) from exc
        channel.reopen_callbacks.add(self._on_reopen)
        async with declaring(f"consuming {self.queue!r}", self.safe_url):
            await self.connection.connected.wait()  # a drop since the declare: wait here, not under the switch
            await self._consume_unless_paused(self._consume)  # paused before: it consumes at resume()
        with contextlib.suppress(Exception):  # the channel it consumes on (or will, at resume()): no line for it
            self._again.started(await channel.get_underlay_channel())

    async def _consume_unless_paused(self, consume: Callable[[], Awaitable[None]]) -> bool:
        """``consume()`` under the switch unless paused or closing by then; whether it ran.

        Every consume goes through here (start, resume, reopen, retry): a :meth:`pause` or
        :meth:`cancel` asked meanwhile waits for it, then cancels what it began, so once they
        return nothing more is delivered. Not before :meth:`start` opened the channel.

        Raises:
            ConnectionError: the connection is down (the caller retries; the reopen consumes
                once it is back). Not waited for under the switch: a pause or cancel would
                wait for the whole outage (a worker's stop too).
            What ``consume`` raises.
        """
        async with self._switch:
            if self._closing or self._paused or self.channel is None:
                return False
            if not self.connection.connected.is_set():  # else it would hold the switch until reconnected
                raise ConnectionError(f"not connected to the broker (consuming {self.queue!r} waits for it)")
            await consume()
            return True

    async def _consume(self) -> None:
        assert self.channel is not None
        underlay = cast(aiormq.Channel, await self.channel.get_underlay_channel())
        if underlay.is_closed:  # its consumer table still holds the tag: never take that for a live consumer
            raise ChannelReopening(f"the channel consuming {self.queue!r} is closed (it is opened again)")
        if self.tag in underlay.consumers:
            return
        # basic.consume on a missing queue would close this channel (404) and aio-pika would reopen
        # it at once, again and again: look on a throwaway channel first (as aio-pika's own recovery does)
        probe = await underlay.connection.channel(publisher_confirms=False)
        try:
            await probe.queue_declare(self.queue, passive=True)
        finally:
            with contextlib.suppress(Exception):
                await probe.close()
        if self._qos_on != (id(underlay), self.prefetch):  # changed since (a waiting room's: one per consume)
            await underlay.basic_qos(prefetch_count=self.prefetch)
            self._qos_on = (id(underlay), self.prefetch)
        underlay.on_consumer_cancel_callbacks.add(self._on_cancel)
        tapped = tap(underlay)
        if tapped is not None:  # registered before the consume: its first delivery may follow consume-ok at once
            tapped.consume(self.tag, self._on_frames)
        try:
            await underlay.basic_consume(self.queue, self._on_message, consumer_tag=self.tag, arguments=self.arguments)
        except BaseException:
            if tapped is not None:
                tapped.forget(self.tag)
            raise
        if self._consuming_on is not underlay:
            underlay.closing.add_done_callback(self._on_channel_closed)
        self._consuming_on = underlay

    def _on_channel_closed(self, closing: asyncio.Future[Any]) -> None:
        """Say why the channel went (say, the broker's delivery acknowledgement timeout), not only that it came back."""
        if self._closing or closing.cancelled():
            return
        reason = closing.exception()
        if isinstance(reason, pamqp.exceptions.AMQPError | aiormq.exceptions.ChannelClosed):  # the broker closed it
            log.warning(
                "the channel consuming %s was closed (%s): its unacked deliveries return to the queue, marked "
                "redelivered; a delivery held past the broker's consumer_timeout closes it (PRECONDITION_FAILED)",
                self.queue, reason,
            )  # fmt: skip

    async def _on_message(self, message: DeliveredMessage) -> None:
        """A delivery through aiormq's channel reader (an aiormq the tap was not audited against)."""
        self._on_frames(message.delivery, message.header, message.body, message.channel)

    def _on_frames(self, frame: Any, header: ContentHeader, body: bytes, channel: UnderlayChannel) -> None:
        """A delivery: run the handler in a task of its own (straight from :mod:`~amqpjobs.wire.delivery_tap`)."""
        acks = self._acks
        if acks is None or acks.channel is not channel:  # first delivery, or one after a reconnect
            acks = self._acks = AckBatcher(channel, batch=self.prefetch > 1)
        if (wide := self._single.came()) is not None:  # that many came one at a time: its slots again
            self._widening = asyncio.get_running_loop().create_task(self.widen(wide))
        # a task of our own: aiormq cancels the tasks it started when the channel closes, which would
        # cut a run off without an outcome (and leave a plain-function handler's thread running unseen)
        run_handler(self._tasks, self.handler(delivery_from_frames(frame, header, body, channel, self.queue, acks)))

    def one_at_a_time(self) -> bool:
        """After a 541: prefetch 1 from the next consume on (:mod:`amqpjobs.wire.single_file`); whether this began it.

        Until :meth:`widen`, or until as many deliveries as its slots came one at a time.
        """
        began, self.prefetch = self._single.begin(self.prefetch), 1 if self._single.on else self.prefetch
        return began

    async def widen(self, wide: int | None = None) -> None:
        """Its slots (``wide`` when that ended already) again under a new tag: ``basic.qos`` is per consumer."""
        wide = wide or self._single.end()
        if wide is None:
            return
        self.prefetch = wide
        if self._acks is not None:  # batched again on this channel (unbatched while one came at a time)
            self._acks.batch = True
        try:
            async with self._switch:
                if self._closing or self._paused or not self.consuming:  # the next consume takes that prefetch
                    return
                await self._basic_cancel(self._consuming_on, "widening")
                self.tag = _new_tag()
                await self._consume()
        except Exception:  # the channel or connection went meanwhile: consume again as after a reconnect
            self._retry_later()

    async def flush_acks(self) -> None:
        """Send the acks still batched (call before closing the connection)."""
        if self._acks is not None:
            await self._acks.flush()

    async def pause(self) -> None:
        """Stop deliveries until :meth:`resume` (``basic.cancel``); deliveries received can still be acked.

        Deliveries the broker sent before it read the cancel still arrive (before its
        ``cancel-ok``) and go to the handler as usual.
        """
        self._paused = True
        async with self._switch:  # after a consume under way (start, resume, reopen, retry): never cut one short
            await self._basic_cancel(self._consumer_channel(), "pausing")

    async def resume(self) -> None:
        """Consume again after :meth:`pause`, under a new consumer tag (retried every second on failure).

        A new tag, because RabbitMQ 3.10 may still route a late quorum-queue delivery to
        the cancelled one.
        """
        self._paused = False

        async def consume() -> None:
            if self.consuming:  # not paused after all (a resume twice): a second tag would go on after a pause
                return
            self.tag = _new_tag()
            await self._consume_or_declare()
            self._again.consumed(self._consuming_on)  # on another channel than before: after a reconnect

        try:
            await self._consume_unless_paused(consume)
        except Exception as exc:
            # down, or its channel reopened: the connection's lines say it, and the channel's reopen consumes
            if self.connection.connected.is_set() and not isinstance(exc, ChannelReopening):
                log.warning("consuming %s again failed (%s); retrying every second", self.queue, in_our_words(exc))
            self._retry_later()

    async def settle(self) -> None:
        """Make sure the broker has every ack sent so far: flush the batch, then a round trip on the channel.

        The broker handles a channel's frames in order, so once the ``basic.qos-ok`` (the
        same prefetch again; it only affects later consumers) is back, the acks before it
        are settled, even if this process dies the next instant.
        """
        await self.flush_acks()
        underlay = self._consuming_on
        if underlay is None or underlay.is_closed:
            return
        with contextlib.suppress(Exception):  # a closed channel: the broker requeues what it held
            await underlay.basic_qos(prefetch_count=self.prefetch)

    async def _on_reopen(self, *_: Any) -> None:
        """aio-pika reopened the channel after a reconnect: consume again (STYLE 7: its re-declare hook)."""
        try:
            if await self._consume_unless_paused(self._consume_or_declare):
                self._again.consumed(self._consuming_on, " after a reconnect")
        except Exception as exc:
            log.warning("consuming %s again after a reconnect failed (%s); retrying every second", self.queue,
                        in_our_words(exc))  # fmt: skip
            self._retry_later()

    def _on_cancel(self, frame: Basic.Cancel) -> None:
        if frame.consumer_tag != self.tag or self._closing or self._paused:
            return
        log.warning(
            "the broker cancelled the consumer on %s (queue deleted or moved, or on RabbitMQ 4.3+ a delivery held "
            "past its x-consumer-timeout, which returns to the queue); consuming again", self.queue,
        )  # fmt: skip
        # under a new tag: RabbitMQ 4.3 closes the whole connection (530) when a cancelled tag is reused
        self.tag = _new_tag()
        self._again.lost()
        self._retry_later()

    def _retry_later(self) -> None:
        if self._retry is None or self._retry.done():
            self._retry = asyncio.get_running_loop().create_task(self._consume_until_back())

    async def _consume_or_declare(self) -> None:
        """:meth:`_consume`; a missing queue with an :attr:`on_missing` is declared again, then consumed."""
        try:
            await self._consume()
        except Exception as exc:
            if self.on_missing is None or error_kind(exc) is not NotFoundError:
                raise
            await self.on_missing()
            await self._consume()

    async def _consume_until_back(self) -> None:
        left_closed: list[int] = []
        async for attempt in AsyncRetrying(wait=wait_fixed(1.0), retry=retry_if_exception_type(Exception)):
            with attempt:
                try:
                    live = None if self._closing or not self.connection.connected.is_set() else self.channel
                    await reopen_if_left_closed(live, left_closed, f"the channel consuming {self.queue}")
                    if not await self._consume_unless_paused(self._consume_or_declare):
                        return
                except Exception as exc:
                    self._say_missing(exc)
                    raise
        self._missing.since = None
        self._again.consumed(self._consuming_on)

    def _say_missing(self, exc: BaseException) -> None:
        """Warn that the work queue is gone (a 404 consuming again), at once and then every 30 s while it is."""
        if self.on_missing is None and error_kind(exc) is NotFoundError:
            self._missing.missing()

    @property
    def missing_since(self) -> float | None:
        """Since when (monotonic) consuming again finds the queue missing (404), None while it is there."""
        return self._missing.since

    async def cancel(self) -> None:
        """Stop deliveries (``basic.cancel``); deliveries already received can still be acked."""
        self._closing = True
        async with self._switch:  # after a consume under way
            underlay = self._consumer_channel()
        await self._basic_cancel(underlay, "cancelling")

    def _consumer_channel(self) -> aiormq.Channel | None:
        """Drop a pending retry (no consume of it is under way); the open channel our tag consumes on, else None."""
        if self._retry is not None:
            self._retry.cancel()
        underlay = self._consuming_on
        return None if underlay is None or underlay.is_closed or self.tag not in underlay.consumers else underlay

    async def _basic_cancel(self, underlay: aiormq.Channel | None, doing: str) -> None:
        if underlay is None:
            return
        try:
            await underlay.basic_cancel(self.tag)
        except Exception as exc:  # the channel is gone: nothing more arrives on it
            log.debug("%s consumer %s failed: %s", doing, self.tag, exc)

    async def close(self) -> None:
        """Cancel and close the channel (unacked deliveries go back to the queue)."""
        await self.cancel()
        if self.channel is not None:
            await close_channel(self.channel)
