"""Outcome events on the wire: the worker's fire-and-forget publisher, and a subscription.

Events (their body is :mod:`amqpjobs.jobs.events`'s; this layer moves bytes) go to the topic exchange
:data:`~amqpjobs.topology.naming.EVENTS_EXCHANGE` without publisher confirms and without
``mandatory``: nobody subscribed means nobody hears them, by design. The publisher never
makes a job wait and never fails one: :meth:`OutcomeEvents.emit` only queues a publish,
and drops the event (counting it) when events are off (the exchange was missing at start,
or the broker closed the channel) and no check of the exchange is under way (below), or
:data:`MAX_PENDING` events are still waiting to
reach the socket (the broker blocked the connection under a resource alarm, RabbitMQ
"Blocked Connection Notifications", a burst of jobs faster than the socket, or the network stalls).

Two exceptions keep what a replay's canary needs (:mod:`amqpjobs.runtime.canary`):

* An event emitted with ``keep=True`` (a replayed delivery: it carries the replay id) is
  never dropped over the cap: it waits in a queue of its own, sent ahead of the others.
  Those are bounded by the replay's ``--rate``, not by the workers' speed.
* Events off are not off for good: the next event at least :attr:`OutcomeEvents.recheck_after`
  seconds (default :data:`RECHECK_AFTER`) after events went off (or were last checked),
  and any kept event, checks the exchange again in the background, and reopens the channel
  when it exists (``amqpjobs topology apply`` re-declared it under the running worker).
  The events emitted while a check is under way (that one too) wait for it, the others up
  to :data:`MAX_PENDING`, and go out on the reopened channel; when the exchange is still
  missing they are dropped and counted. (Before, the event that started the check was
  dropped: a canary replayed right after ``topology apply`` waited in vain for its event.)

The exchange is probed once at start (a passive declare on a throwaway channel). A
publish to a missing exchange (deleted under a running worker) makes the broker close the
channel (``404``); it ignores what comes on that channel until our ``close-ok``, but a
frame sent after the ``close-ok`` makes it close the whole connection (``504
CHANNEL_ERROR - expected 'channel.open'``), and with it every channel on it (measured here
when events shared the worker's publishing connection: 3 runs in 4 when they went out back
to back through aiormq's ``basic_publish``, whose publish can wait for room in the write
queue while the close comes in). Two things keep that from costing a job:

* The worker gives events a connection of their own (:meth:`OutcomeEvents.connect`): the
  worst a crossing close can cost is that connection, never a consumer's unacked jobs nor
  a retry or quarantine copy.
* One task sends them, all the events waiting at each turn (up to :data:`BATCH`) in one write:
  the caller's ``pack`` turns them into messages (the worker's,
  :func:`amqpjobs.jobs.events.event_messages`: one message per routing key, its events as one
  JSON array, so the broker routes one publish per key and write, not one per job), and their
  publish frames go in one item of aiormq's write queue, packed from cached bytes by
  :mod:`amqpjobs.wire.event_frames`: no confirm, no round trip per event; it waits only
  until the write reached the socket, then takes the next batch. aiormq queues its
  ``close-ok`` in the same step in which it learns of the close (and notes the close in the
  channel's ``_close_exception``); the sender checks for the close and queues its batch in
  one step too (no await between), so a batch goes either ahead of the ``close-ok`` (the
  broker ignores it) or not at all. The close then turns events off. (Should a later aiormq
  drop that attribute, the check falls back to ``is_closed``, set a few steps later: a
  crossing becomes possible again, and costs only the events connection, which aio-pika
  reopens.)

A batch counts as published once it is written to the socket; a batch the broker ignored
(sent between the exchange's deletion and our hearing of the close) still counts as
published: events are a signal, not a record.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, cast

import aiormq
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage
from aiormq.abc import ChannelFrame

from amqpjobs.topology.naming import EVENTS_EXCHANGE
from amqpjobs.wire.abc import Connection
from amqpjobs.wire.browse import Watch, exchange_exists
from amqpjobs.wire.connection import close_channel, connect
from amqpjobs.wire.errors import broker_errors
from amqpjobs.wire.event_frames import EventFrames
from amqpjobs.wire.publish_outcome import heard_close
from amqpjobs.wire.settings import BrokerSettings

#: Turns the events of one write, (routing key, body) in order, into the messages to publish, (routing key, body).
Pack = Callable[[Sequence[tuple[str, bytes]]], list[tuple[str, bytes]]]

log = logging.getLogger("amqpjobs.worker")

#: Events that may wait to be published at once; more are dropped (events with ``keep`` aside).
MAX_PENDING = 1000
#: Events written to the socket in one batch at most (one ``write``; a batch of 300-byte events is ~100 KB).
BATCH = 256
#: Seconds the sender waits before each batch short of :data:`BATCH`, for more events to send with it (one write).
LINGER = 0.005
#: Seconds after events went off (or were last checked) before an event checks the exchange again.
RECHECK_AFTER = 10.0
#: Basic properties of an event: JSON, transient (``delivery_mode`` 1).
EVENT_PROPERTIES = aiormq.spec.Basic.Properties(content_type="application/json", delivery_mode=1)


class OutcomeEvents:
    """The worker's outcome event publisher (see the module docstring).

    Build it with :meth:`connect` (a connection of its own, closed with it) or :meth:`open`.
    Each batch takes first from the queue of kept events (unbounded), then from the queue
    of at most :data:`MAX_PENDING` others, :data:`BATCH` events at most.
    Attributes ``published`` and ``dropped`` count events; ``recheck_after`` is seconds.

    Args:
        channel: A channel without publisher confirms, or None: events off.
        pack: The messages of a batch's events (:data:`Pack`; the worker's is
            :func:`amqpjobs.jobs.events.event_messages`); ``published`` and ``dropped`` count events.
        on_drop: Called once per dropped event (a metric).
        connection: Where to reopen a channel once the exchange exists again (None: never).
        owned: Close ``connection`` in :meth:`close`.
    """

    def __init__(
        self,
        channel: AbstractChannel | None,
        pack: Pack,
        on_drop: Callable[[], None] | None = None,
        connection: Connection | None = None,
        owned: bool = False,
    ) -> None:
        self._channel = channel
        self._pack = pack
        self._on_drop = on_drop
        self._connection = connection
        self._owned = owned
        self._waiting: deque[tuple[str, bytes]] = deque()
        self._kept: deque[tuple[str, bytes]] = deque()
        self._checked = time.monotonic()  # when events were last known off, or checked
        self._reopening: asyncio.Task[None] | None = None
        self.recheck_after = RECHECK_AFTER
        self._sender: asyncio.Task[None] | None = None
        self._sending = 0  # events of the batch the sender holds
        self._closing = False  # close() was called: the channel's close is ours
        self._frames: EventFrames | None = None  # of the channel last sent on
        self.published = 0
        self.dropped = 0
        if channel is not None:
            channel.close_callbacks.add(self._on_close)

    @classmethod
    async def connect(
        cls, settings: BrokerSettings, name: str, pack: Pack, on_drop: Callable[[], None] | None = None
    ) -> OutcomeEvents:
        """A publisher on a connection of its own named ``name`` (closed by :meth:`close`); ``pack``: as the class's.

        Raises:
            BrokerUnavailableError: the broker can't be reached (:func:`~amqpjobs.wire.connection.connect`).
        """
        connection = await connect(settings, name=name)
        try:
            return await cls.open(connection, pack, on_drop, owned=True)
        except BaseException:
            await connection.close()
            raise

    @classmethod
    async def open(
        cls, connection: Connection, pack: Pack, on_drop: Callable[[], None] | None = None, owned: bool = False
    ) -> OutcomeEvents:
        """A publisher on a channel of ``connection``; events off (all dropped) when the exchange is missing.

        ``pack``: as the class's; ``owned``: :meth:`close` closes ``connection`` too.
        """
        if not await exchange_exists(connection, EVENTS_EXCHANGE):
            log.warning(
                "outcome events are off: exchange %s does not exist (amqpjobs topology apply declares it); "
                "jobs run as usual", EVENTS_EXCHANGE,
            )  # fmt: skip
            return cls(None, pack, on_drop, connection, owned)
        return cls(await connection.channel(publisher_confirms=False), pack, on_drop, connection, owned)

    @property
    def connection(self) -> Connection | None:
        """The connection the events go out on (None: none given)."""
        return self._connection

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
            body: The event's JSON body (:func:`amqpjobs.jobs.events.event_body`).
            keep: Never drop it over :data:`MAX_PENDING`, and send it before the others (an
                event of a replayed delivery, which a canary waits for).
        """
        if self._channel is None or self._channel.is_closed:
            self._maybe_reopen(now=keep and self._channel is None)
            if not self._rechecking():
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

    def _rechecking(self) -> bool:
        """Whether a check of the exchange is under way (the events queued meanwhile wait for it)."""
        return self._reopening is not None and not self._reopening.done()

    def _maybe_reopen(self, now: bool = False) -> None:
        """Events are off: check the exchange again in the background, at most once per ``recheck_after``.

        ``now``: check whatever the time since the last check (a kept event's: few, at the replay's rate).
        """
        if self._connection is None or self._closing or self._rechecking():
            return
        if not now and time.monotonic() - self._checked < self.recheck_after:
            return
        self._checked = time.monotonic()
        self._reopening = asyncio.get_running_loop().create_task(self._reopen(self._connection))

    async def _reopen(self, connection: Connection) -> None:
        try:
            if not await exchange_exists(connection, EVENTS_EXCHANGE):
                return
            channel = await connection.channel(publisher_confirms=False)
        except Exception:  # the connection is down: the next check tries again
            return
        if self._closing:
            await close_channel(channel)
            return
        channel.close_callbacks.add(self._on_close)
        self._channel = channel
        log.warning("outcome events are on again: exchange %s exists", EVENTS_EXCHANGE)

    def _take(self) -> list[tuple[str, bytes]]:
        """The next batch: kept events first, :data:`BATCH` at most."""
        batch: list[tuple[str, bytes]] = []
        for pending in (self._kept, self._waiting):
            while pending and len(batch) < BATCH:
                batch.append(pending.popleft())
        return batch

    def _payload(self, number: int, limit: int, batch: list[tuple[str, bytes]]) -> bytes:
        """The publish frames of the messages of ``batch`` on channel ``number`` (bodies cut at ``limit`` bytes)."""
        frames = self._frames
        if frames is None or frames.number != number:
            frames = self._frames = EventFrames(number, EVENTS_EXCHANGE, EVENT_PROPERTIES)
        return frames.payload(self._pack(batch), limit)

    async def _send(self) -> None:
        while self._kept or self._waiting:
            if self._reopening is not None and self._rechecking():  # sent on the channel it opens, or dropped
                await asyncio.wait({self._reopening})
            if len(self._kept) + len(self._waiting) < BATCH:
                await asyncio.sleep(LINGER)  # the events of the jobs ending meanwhile join this batch
            batch = self._take()
            self._sending = len(batch)
            channel = self._channel
            try:
                if channel is None or channel.is_closed:
                    raise ConnectionError("channel closed")
                underlay = cast(aiormq.Channel, await channel.get_underlay_channel())
                payload = self._payload(underlay.number, underlay.max_content_size, batch)
                queue = underlay.connection.write_queue  # aiormq's writer: one ``write`` per item
                while True:  # from the check to the put, no await: see the module docstring
                    if heard_close(underlay):
                        raise ConnectionError("channel closed")
                    if not queue.full():
                        written = underlay.create_future()  # failed if the channel or connection goes
                        queue.put_nowait(ChannelFrame(payload=payload, should_close=False, drain_future=written))
                        break
                    await asyncio.sleep(0.001)
                await written  # on the socket: a blocked connection holds this, and the queue fills meanwhile
                self.published += len(batch)
            except Exception:  # closed or closing channel, connection lost: events are best effort
                for _ in batch:
                    self._drop()
            self._sending = 0

    def _drop(self) -> None:
        self.dropped += 1
        if self._on_drop is not None:
            self._on_drop()

    async def close(self) -> None:
        """Give the events waiting a moment (0.5 s), then close the channel (the rest are dropped).

        Closes the connection too when the publisher owns it (:meth:`connect`).
        """
        self._closing = True
        if self._reopening is not None and not self._reopening.done():
            self._reopening.cancel()  # the events waiting for it are dropped (by the sender, or below)
        if self._sender is not None and not self._sender.done():
            _, late = await asyncio.wait({self._sender}, timeout=0.5)
            for task in late:
                task.cancel()
                for _ in range(self._sending):
                    self._drop()
        for _ in range(len(self._kept) + len(self._waiting)):
            self._drop()
        self._kept.clear()
        self._waiting.clear()
        if self._channel is not None:
            await close_channel(self._channel)
        if self._owned and self._connection is not None:
            await self._connection.close()


async def subscribe_outcomes(
    connection: Connection, on_body: Callable[[bytes], None], binding_keys: Sequence[str] = ("#",)
) -> Watch:
    """Hear outcome events: an exclusive, auto-delete queue of our own bound with ``binding_keys``.

    Subscribe *before* causing the outcomes you wait for: events published before the
    binding exists are not kept for anyone.

    Args:
        connection: An open connection (the queue lives as long as the returned watch's channel).
        on_body: Called with each message's body, in arrival order (its events:
            :func:`amqpjobs.jobs.events.decode_events`).
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
