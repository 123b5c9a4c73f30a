"""Outcome events on the wire: the worker's fire-and-forget publisher, and a subscription.

Events (their body is :mod:`amqpjobs.jobs.events`'s; this layer moves bytes) go to the topic exchange
:data:`~amqpjobs.topology.naming.EVENTS_EXCHANGE` without publisher confirms and without
``mandatory``: nobody subscribed means nobody hears them, by design. The publisher never
makes a job wait and never fails one: :meth:`OutcomeEvents.emit` only queues a publish,
and drops the event (counting it) when events are off (the exchange was missing at start,
or the broker closed the channel), or :data:`MAX_PENDING` events are still waiting to
reach the socket (the broker blocked the connection under a resource alarm, RabbitMQ
"Blocked Connection Notifications", a burst of fast jobs, or the network stalls).

Two exceptions keep what a replay's canary needs (:mod:`amqpjobs.runtime.canary`):

* An event emitted with ``keep=True`` (a replayed delivery: it carries the replay id) is
  never dropped over the cap: it waits in a queue of its own, sent ahead of the others.
  Those are bounded by the replay's ``--rate``, not by the workers' speed.
* Events off are not off for good: the next event at least :attr:`OutcomeEvents.recheck_after`
  seconds (default :data:`RECHECK_AFTER`) after events went off (or were last checked)
  checks the exchange again in the background, and reopens the channel when it exists
  (``amqpjobs topology apply`` re-declared it under the running worker).

The exchange is probed once at start (a passive declare on a throwaway channel). A
publish to a missing exchange (deleted under a running worker) makes the broker close the
channel (``404``), and a frame sent on that channel after aiormq answered the close makes
the broker close the whole connection (``504 CHANNEL_ERROR - expected 'channel.open'``),
and with it the unacked jobs of every consumer on it: measured here, 3 runs in 4 when the
events went out back to back. So one task sends them, one at a time, each after the
previous one's publisher confirm (the confirm paces the sender; no job waits for it): a
close then always arrives before the next publish, and turns events off for good. This
caps events near one per broker round trip (about 2,000 a second on a local broker);
beyond that the queue of :data:`MAX_PENDING` fills and events are dropped. Sending a batch
before waiting is not safe: aiormq's write queue holds 10 frames, so a publish of a batch
can wait for room while the broker's close of an earlier one comes in.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import aiormq
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage

from amqpjobs.errors import NotFoundError
from amqpjobs.topology.naming import EVENTS_EXCHANGE
from amqpjobs.wire.abc import Connection
from amqpjobs.wire.browse import Watch
from amqpjobs.wire.connection import close_channel
from amqpjobs.wire.errors import broker_errors

log = logging.getLogger("amqpjobs.worker")

#: Events that may wait to be published at once; more are dropped (events with ``keep`` aside).
MAX_PENDING = 1000
#: Seconds after events went off (or were last checked) before an event checks the exchange again.
RECHECK_AFTER = 10.0
#: Seconds the sender waits for an event's confirm before it drops the event and sends the next.
CONFIRM_TIMEOUT = 5.0
#: Basic properties of an event: JSON, transient (``delivery_mode`` 1), no confirm.
_PROPERTIES = aiormq.spec.Basic.Properties(content_type="application/json", delivery_mode=1)


async def exchange_exists(connection: Connection, name: str) -> bool:
    """Whether exchange ``name`` exists (a passive declare on a throwaway channel)."""
    channel = await connection.channel(publisher_confirms=False)
    try:
        with broker_errors(name):
            await channel.declare_exchange(name, passive=True)
        return True
    except NotFoundError:
        return False
    finally:
        await close_channel(channel)


class OutcomeEvents:
    """The worker's outcome event publisher (see the module docstring).

    Build it with :meth:`open`. One publish at a time goes out, first from the queue of
    kept events (unbounded), then from the queue of at most :data:`MAX_PENDING` others.
    Attributes ``published`` and ``dropped`` count events; ``recheck_after`` is seconds.

    Args:
        channel: A channel with publisher confirms (they pace the sender), or None: events off.
        on_drop: Called once per dropped event (a metric).
        connection: Where to reopen a channel once the exchange exists again (None: never).
    """

    def __init__(
        self,
        channel: AbstractChannel | None,
        on_drop: Callable[[], None] | None = None,
        connection: Connection | None = None,
    ) -> None:
        self._channel = channel
        self._on_drop = on_drop
        self._connection = connection
        self._waiting: deque[tuple[str, bytes]] = deque()
        self._kept: deque[tuple[str, bytes]] = deque()
        self._checked = time.monotonic()  # when events were last known off, or checked
        self._reopening: asyncio.Task[None] | None = None
        self.recheck_after = RECHECK_AFTER
        self._sender: asyncio.Task[None] | None = None
        self._closing = False  # close() was called: the channel's close is ours
        self.published = 0
        self.dropped = 0
        if channel is not None:
            channel.close_callbacks.add(self._on_close)

    @classmethod
    async def open(cls, connection: Connection, on_drop: Callable[[], None] | None = None) -> OutcomeEvents:
        """A publisher on a channel of ``connection``; events off (all dropped) when the exchange is missing."""
        if not await exchange_exists(connection, EVENTS_EXCHANGE):
            log.warning(
                "outcome events are off: exchange %s does not exist (amqpjobs topology apply declares it); "
                "jobs run as usual", EVENTS_EXCHANGE,
            )  # fmt: skip
            return cls(None, on_drop, connection)
        return cls(await connection.channel(publisher_confirms=True), on_drop, connection)

    def _on_close(self, channel: Any, exc: BaseException | None) -> None:
        """The broker closed the channel (say, the exchange was deleted: 404): events off, no reopening.

        A connection loss is not this: aio-pika reopens the channel with the connection.
        """
        if isinstance(exc, aiormq.exceptions.ChannelClosed) and self._channel is not None and not self._closing:
            log.warning(
                "outcome events are off: the broker closed their channel (%s); the exchange is checked again "
                "at an event after %gs", exc, self.recheck_after,
            )  # fmt: skip
            self._channel = None  # not closed by us: a close frame on it now could cost the connection
            self._checked = time.monotonic()

    def emit(self, routing_key: str, body: bytes, *, keep: bool = False) -> None:
        """Queue the publish of an event; never waits, never raises (a dropped event is counted).

        Args:
            routing_key: ``<job queue>.<outcome>`` (:func:`~amqpjobs.topology.naming.event_routing_key`).
            body: The event's JSON body (:meth:`amqpjobs.jobs.events.OutcomeEvent.encode`).
            keep: Never drop it over :data:`MAX_PENDING`, and send it before the others (an
                event of a replayed delivery, which a canary waits for).
        """
        if self._channel is None or self._channel.is_closed:
            self._maybe_reopen()
            self._drop()
            return
        if keep:
            self._kept.append((routing_key, body))
        elif len(self._waiting) >= MAX_PENDING:
            self._drop()
            return
        else:
            self._waiting.append((routing_key, body))
        if self._sender is None or self._sender.done():
            self._sender = asyncio.get_running_loop().create_task(self._send())

    def _maybe_reopen(self) -> None:
        """Events are off: check the exchange again in the background, at most once per ``recheck_after``."""
        if self._connection is None or self._closing or time.monotonic() - self._checked < self.recheck_after:
            return
        if self._reopening is not None and not self._reopening.done():
            return
        self._checked = time.monotonic()
        self._reopening = asyncio.get_running_loop().create_task(self._reopen(self._connection))

    async def _reopen(self, connection: Connection) -> None:
        try:
            if not await exchange_exists(connection, EVENTS_EXCHANGE):
                return
            channel = await connection.channel(publisher_confirms=True)
        except Exception:  # the connection is down: the next check tries again
            return
        if self._closing:
            await close_channel(channel)
            return
        channel.close_callbacks.add(self._on_close)
        self._channel = channel
        log.warning("outcome events are on again: exchange %s exists", EVENTS_EXCHANGE)

    async def _send(self) -> None:
        while self._kept or self._waiting:
            pending = self._kept or self._waiting
            routing_key, body = pending[0]
            channel = self._channel
            try:
                if channel is None or channel.is_closed:
                    raise ConnectionError("channel closed")
                underlay = await channel.get_underlay_channel()
                async with asyncio.timeout(CONFIRM_TIMEOUT):  # a blocked connection: the queue fills meanwhile
                    await underlay.basic_publish(
                        body, exchange=EVENTS_EXCHANGE, routing_key=routing_key, properties=_PROPERTIES
                    )  # the confirm paces this sender only; no job waits for it
                self.published += 1
            except Exception:  # closed or closing channel, connection lost: events are best effort
                self._drop()
            finally:
                pending.popleft()

    def _drop(self) -> None:
        self.dropped += 1
        if self._on_drop is not None:
            self._on_drop()

    async def close(self) -> None:
        """Give the events waiting a moment (0.5 s), then close the channel (the rest are dropped)."""
        self._closing = True
        if self._sender is not None and not self._sender.done():
            _, late = await asyncio.wait({self._sender}, timeout=0.5)
            for task in late:
                task.cancel()
                for _ in range(len(self._kept) + len(self._waiting)):
                    self._drop()
        if self._reopening is not None and not self._reopening.done():
            self._reopening.cancel()
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
