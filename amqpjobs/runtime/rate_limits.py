"""Rate limits across every worker process of an app, with tokens on the broker (README "Flow control").

For each rate-limited job (``@app.job(..., rate_limit="10/s")``, :mod:`amqpjobs.jobs.rate`):

* **One emitter** across the app mints its tokens (:mod:`.token_emitter`): each worker
  process tries the job's emitter lock (an exclusive queue, :mod:`amqpjobs.wire.lock`) every
  second; the holder publishes one token every ``period / count``
  seconds on absolute times (token ``k`` at ``k * interval`` since the epoch: no drift,
  and a take-over keeps the grid), each good until half an interval after its time (its
  ``expiration``; one already too late is skipped). A killed holder's lock goes with its
  connection (RabbitMQ "Exclusive Queues"), so another process takes over within about a
  second (after the broker notices a dead connection: a lost host is noticed at the
  heartbeat timeout, 60 s by default); no tokens are minted meanwhile, so the gap only slows.
* **A waiting room**: a delivery of the job arriving from its work queue is moved there
  (a confirmed copy, then the ack, as a hand-back: no ``redelivered`` flag, no attempt
  used), so it never holds the work queue's slots, which the queue's other jobs need. Each
  worker process consumes the waiting room with its concurrency (slots of its own), holding at
  most :data:`~.rate_rooms.WAITING_PER_PROCESS` waiting deliveries (:class:`.rate_rooms.RoomSource`),
  and, while a delivery of it waits, the token queue with prefetch 1; a token
  goes to the longest-waiting delivery of the process, which then runs through the usual decision path
  (retries, quarantine, crash containment) as a delivery of the work queue it came from. The token
  is acked when the handler starts (:meth:`RateLimits.spend`), and requeued when the delivery is
  settled without a start (:meth:`RateLimits.give_back`: a hand-back, an open breaker's wait, a
  duplicate): a token counts only for a start.
  A token that comes when nothing waits here goes back to the queue (keeping its expiry).

Why at most ``count + 1`` starts in any window of one period: a start uses a token minted
for a time under one interval before it (the broker drops a token half an interval after
its time, a worker one it held over a quarter interval: :mod:`amqpjobs.jobs.rate`), and token
times are one interval apart.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Literal

from amqpjobs.errors import AmqpJobsError, UnroutableError
from amqpjobs.jobs import envelope
from amqpjobs.jobs.failure import unstarted_headers
from amqpjobs.jobs.message_key import generated_job_id
from amqpjobs.jobs.quarantine import header_text
from amqpjobs.jobs.rate import (
    WAITING_FROM,
    RateLimit,
    first_tick,
    tick_time,
)
from amqpjobs.printable import logfmt_value
from amqpjobs.runtime.logs import field_value
from amqpjobs.runtime.rate_rooms import Room, RoomSource, TokenGate
from amqpjobs.runtime.token_emitter import TokenEmitter
from amqpjobs.topology.declarations import Declarations
from amqpjobs.topology.models import JobQueueLayout
from amqpjobs.topology.naming import rate_queue_names
from amqpjobs.topology.rate_queues import rate_declarations
from amqpjobs.wire.abc import Connection, Publisher, Received
from amqpjobs.wire.acks import DeliveryChannelClosed
from amqpjobs.wire.consume import DeliveryHandler, WorkQueueConsumer
from amqpjobs.wire.declare import find_missing
from amqpjobs.wire.delivery import Delivery
from amqpjobs.wire.settings import BrokerSettings
from amqpjobs.wire.tokens import RATE_ARGUMENT, declare_rate_queues

if TYPE_CHECKING:
    from amqpjobs.runtime.app import App
    from amqpjobs.runtime.metrics import WorkerMetrics

log = logging.getLogger("amqpjobs.worker")

#: The worker's handler for a job queue's deliveries: ``run(layout, hand_back, rated)``.
Runner = Callable[[JobQueueLayout, bool, bool], DeliveryHandler]

#: What :meth:`RateLimits.divert` did: moved it to its waiting room, the usual path goes on, or hand it back.
Diverted = Literal["moved", "on", "back"]

#: Starts a waiting room's source (the worker's ``_started``: paused while an operator pauses its job queue).
Starter = Callable[["RoomSource"], Awaitable[None]]

#: Seconds a rate-limited suspect waits for its token at most in a turn (its worker runs nothing else).
SUSPECT_TOKEN_WAIT = 2.0
#: Seconds before a token's time a suspects turn starts after a missed token (at most half an interval).
SUSPECT_LEAD = 0.5
#: Seconds at most between two looks at a suspects queue whose rate-limited suspect missed its token.
SUSPECT_LOOK_MAX = 60.0


class RateLimits:
    """The rate-limited jobs of the job queues a worker consumes (start with :func:`start_rate_limits`).

    Args:
        rooms: Each rate-limited job's :class:`Room`, by job name.
        connection: The worker's consuming connection (waiting rooms and tokens).
        publishing: Its publishing connection (moves, and the emitter's lock and tokens).
        publisher: Confirmed publisher for the moves into the waiting rooms.
        settings: Broker settings.
        stop: The worker's stop event.
        metrics: Where to count (or None).
    """

    def __init__(
        self,
        rooms: Mapping[str, Room],
        connection: Connection,
        publishing: Connection,
        publisher: Publisher,
        settings: BrokerSettings,
        stop: asyncio.Event,
        metrics: WorkerMetrics | None,
    ) -> None:
        self.rooms = dict(rooms)
        self._by_waiting = {r.names.waiting: r for r in rooms.values()}
        self._connection = connection
        self._publishing = publishing
        self._publisher = publisher
        self._settings = settings
        self._stop = stop
        self._metrics = metrics
        self._host = socket.gethostname()
        self._pid = os.getpid()
        self.consumers: list[RoomSource] = []  # the waiting rooms' (the worker drives them with its own)
        self.tasks: list[asyncio.Task[None]] = []  # the emitter candidates
        self.handed_back: set[Any] = set()  # the tasks of deliveries that waited for a token when the worker stopped
        #: Seconds a delivery waits for a token at most, then goes back to its work queue unstarted (None: no
        #: bound). A waiting delivery is held unacked: past the broker's consumer_timeout the broker would close
        #: the waiting room's channel and redeliver it marked redelivered, a crash start though it never started.
        self.wait_at_most: float | None = None
        self._declaring = asyncio.Lock()
        self._emitter = TokenEmitter(publishing, settings, stop, metrics, self.declare_again)

    async def declare_again(self, room: Room, found: str) -> None:
        """Declare a job's rate queues again: one of them was found missing (deleted by hand), said once here.

        ``found``: how (for the log). Rate queues are the workers', not the topology's:
        ``topology apply`` does not declare them, so the worker that finds one missing does.

        Raises:
            TopologyConflictError, BrokerError: as :func:`~amqpjobs.wire.tokens.declare_rate_queues`.
        """
        async with self._declaring:  # one at a time: the emitter, the feed and the room may all find it
            missing, _ = await find_missing(self._connection, [q.name for q in room.declarations.queues])
            if not missing:
                return
            await declare_rate_queues(self._connection, room.declarations, self._settings.safe_url)
        log.warning("job=%s: rate queue(s) %s missing (%s; deleted by hand?): this worker declared it again",
                    field_value(room.job), ", ".join(sorted(missing)), found)  # fmt: skip

    async def divert(self, layout: JobQueueLayout, delivery: Received) -> Diverted:
        """Move a rate-limited job's delivery from its work queue into its waiting room: ``"moved"`` once moved.

        ``"on"`` for any other delivery (the usual path goes on), and for a redelivery: a copy
        would drop the evidence of its earlier start, so the usual path registers it for its
        next start, which then runs alone (a suspect takes no token; README "When a job crashes").
        When the move fails the delivery waits here for its token, in its work queue's slot (a
        start, still within the rate: ``"on"``), at most :attr:`wait_at_most` as in the waiting
        room: then ``"back"``, handed back to its work queue unstarted (held longer, the broker's
        ``consumer_timeout`` would close the channel and redeliver all it holds). A delivery
        without ``message_id`` is moved too: its copy carries its key as it came
        (:data:`~amqpjobs.jobs.message_key.PAYLOAD_KEY`), so an idempotent job keeps its key (README "Idempotency").
        """
        room = self.room_of(layout, delivery)
        if room is None or self._stop.is_set() or delivery.redelivered:
            return "on"
        job_id = delivery.message_id or generated_job_id()
        headers = unstarted_headers(
            delivery.headers, None, delivery.queue, delivery.exchange, delivery.routing_key, self._host, self._pid,
            envelope.iso_utc(), timestamp=delivery.timestamp,
        )  # fmt: skip
        headers[WAITING_FROM] = delivery.queue
        try:
            try:
                await self._publisher.publish("", room.names.waiting, delivery.copy(headers, job_id))
            except UnroutableError:  # the waiting room is gone (deleted by hand): declared again, one more try
                await self.declare_again(room, "a move into the waiting room was unroutable")
                await self._publisher.publish("", room.names.waiting, delivery.copy(headers, job_id))
        except AmqpJobsError as exc:
            why = f"waiting room missing, declaring it failed: {exc}" if isinstance(exc, UnroutableError) else exc
            log.warning(
                "job=%s id=%s: moving it to waiting room %s failed (%s); it waits for its token in its slot",
                field_value(room.job), field_value(job_id), room.names.waiting, why,
            )  # fmt: skip
            # no token within the bound (or stopping, a pause, a suspect's turn): it goes back unstarted
            return "on" if await room.gate.acquire(within=self.wait_at_most) else "back"
        try:
            await delivery.ack(at_once=True)  # its copy is confirmed (README "When a job crashes")
        except DeliveryChannelClosed:
            log.warning("job %s: its channel closed before the ack; the broker redelivers it (a duplicate of the "
                        "copy in waiting room %s)", field_value(job_id), room.names.waiting)  # fmt: skip
        return "moved"

    def admit(self, delivery: Delivery) -> Room:
        """A waiting room's delivery as one of the work queue it came from (its queue, exchange, routing key)."""
        room = self._by_waiting[delivery.queue]
        works = room.layout.work_queues
        origin = header_text(delivery.headers.get(WAITING_FROM))
        delivery.queue = origin if origin in works else works[0]
        delivery.exchange = header_text(delivery.headers.get(envelope.ORIGINAL_EXCHANGE)) or delivery.exchange
        delivery.routing_key = header_text(delivery.headers.get(envelope.ORIGINAL_ROUTING_KEY)) or delivery.routing_key
        delivery.headers = {k: v for k, v in delivery.headers.items() if k != WAITING_FROM}
        return room

    async def hold_back(self, job_queue: str) -> None:
        """An operator paused ``job_queue``: its deliveries waiting for a token go back without one."""
        await asyncio.gather(*(r.gate.hold_back() for r in self.rooms.values() if r.layout.name == job_queue))

    async def set_aside(self, aside: bool) -> None:
        """A suspect's turn starts (``aside``) or ends: while it runs, no delivery waits for a token.

        At the start, each waiting one goes back to its work queue unstarted (a suspect runs
        alone, README "When a job crashes, hangs or stalls its worker"), and this returns once
        each has gone on to its hand-back (counted among the worker's held deliveries).
        """
        await asyncio.gather(*(r.gate.set_aside(aside) for r in self.rooms.values()))
        if aside:
            await asyncio.gather(*(r.source.none_waiting() for r in self.rooms.values() if r.source is not None))

    def release(self) -> None:
        """The stopping worker took its last delivery: what waits for a token goes back (each gate's ``release``)."""
        for room in self.rooms.values():
            room.gate.release()

    async def spend(self) -> None:
        """The current task's delivery starts its handler: the token it took, if any, is used (README "Rate limits")."""
        task = asyncio.current_task()
        for room in self.rooms.values():
            await room.gate.spend(task)

    async def give_back(self) -> None:
        """The current task's delivery is settled without a start: the token it took, if any, goes back."""
        task = asyncio.current_task()
        for room in self.rooms.values():
            await room.gate.give_back(task)

    def room_of(self, layout: JobQueueLayout, delivery: Received) -> Room | None:
        """The rate-limited job's :class:`Room` a delivery of ``layout`` belongs to, or None."""
        room = self.rooms.get(envelope.job_name_of(delivery.type, delivery.headers))
        return room if room is not None and room.layout.name == layout.name else None

    async def suspect_token(self, layout: JobQueueLayout, delivery: Delivery) -> float | None:
        """A suspect's token (README "Rate limits": a suspect takes one too): None once taken or not needed.

        A suspect of a rate-limited job waits first in line, at most two token intervals
        (:data:`SUSPECT_TOKEN_WAIT` at most: the worker runs nothing else meanwhile). A
        redelivered one is not to run (it is registered): it needs none. Without a token it
        goes back to the end of the suspects queue as an unchanged copy (no start charged),
        and the returned seconds say when to look again: just before a later token's time.

        Raises:
            AmqpJobsError: the copy could not be published (the suspect stays unacked: a
                closed channel puts it back, marked redelivered).
        """
        room = self.room_of(layout, delivery)
        if room is None or delivery.redelivered:
            return None
        rate = room.rate
        if await room.gate.acquire(front=True, within=min(2 * rate.interval, SUSPECT_TOKEN_WAIT)):
            return None
        job_id = delivery.message_id or generated_job_id()
        await self._publisher.publish("", layout.suspects_queue, delivery.copy(delivery.headers, job_id))
        await delivery.ack(at_once=True)
        log.info("job=%s id=%s: no token came for this suspect in its turn; it waits in %s for a later one",
                 field_value(room.job), field_value(job_id), layout.suspects_queue)  # fmt: skip
        now, lead = time.time(), min(SUSPECT_LEAD, rate.interval / 2)
        due = tick_time(rate, first_tick(rate, now + lead)) - lead - now
        return max(1.0, min(due, SUSPECT_LOOK_MAX))

    def _waiting_handler(self, run: Runner, inflight: set[Any]) -> DeliveryHandler:
        """The waiting rooms' delivery handler: wait for a token, then ``run(layout, hand_back, True)`` it.

        ``inflight``: the worker's in-flight tasks (a stopping worker waits for them: a
        delivery still waiting is then handed back to its work queue, unstarted).
        """

        async def waiting(delivery: Delivery) -> None:
            room = self.admit(delivery)
            assert room.source is not None
            consumer = room.source.received()
            task = asyncio.current_task()
            inflight.add(task)
            gauge = None if self._metrics is None else self._metrics.rate_waiting.labels(room.job)
            if gauge is not None:
                gauge.inc()
            try:  # a redelivered one is registered as a suspect, never started here: it needs no token
                # one that waited wait_at_most goes back to its work queue unstarted, then to the waiting room's end
                got = delivery.redelivered or await room.gate.acquire(within=self.wait_at_most)
            finally:
                room.source.waited()
                if gauge is not None:
                    gauge.dec()
            if not got and self._stop.is_set():  # the worker stops (or a pause came): handed back, never started
                self.handed_back.add(task)
            try:
                await run(room.layout, not got, True)(delivery)
            finally:
                inflight.discard(task)
                room.source.settled(consumer)

        return waiting

    async def start(
        self, run: Runner, inflight: set[Any], concurrency: int, safe_url: str, starter: Starter | None = None
    ) -> None:
        """Consume each waiting room (``concurrency`` slots), attach its token feed, start the emitter candidates.

        ``run(layout, hand_back, rated)``: the worker's delivery handler for a job queue
        (``rated``: its token taken, never moved again). ``starter``: starts a waiting room's
        consumer (the worker's: paused while an operator pauses its job queue).
        """
        handler = self._waiting_handler(run, inflight)
        for room in self.rooms.values():
            feed = WorkQueueConsumer(self._connection, room.names.tokens, 1, room.gate.on_token, safe_url)
            feed.on_missing = functools.partial(self.declare_again, room, "consuming the token queue: 404")
            await feed.start()
            room.gate.feed = feed
            await feed.pause()  # consuming only while a delivery waits here
            consumer = WorkQueueConsumer(self._connection, room.names.waiting, concurrency, handler, safe_url)
            consumer.on_missing = functools.partial(self.declare_again, room, "consuming the waiting room: 404")
            consumer.arguments = {**consumer.arguments, RATE_ARGUMENT: str(room.rate)}  # for status
            room.source = RoomSource(  # few waiting deliveries held (README "Rate limits")
                consumer, concurrency, quorum=room.layout.queue_type == "quorum"
            )
            await (room.source.start() if starter is None else starter(room.source))
            self.consumers.append(room.source)
            self.tasks.append(asyncio.create_task(self._emitter.run(room)))


def rate_limited(app: App, layouts: Iterable[JobQueueLayout]) -> dict[str, tuple[RateLimit, JobQueueLayout]]:
    """The app's rate-limited jobs served from ``layouts`` (job name -> (rate, layout))."""
    by_name = {lay.name: lay for lay in layouts}
    return {j.name: (j.rate_limit, by_name[j.queue]) for j in app if j.rate_limit is not None and j.queue in by_name}


async def start_rate_limits(
    app: App,
    layouts: Iterable[JobQueueLayout],
    connections: tuple[Connection, Connection],
    publisher: Publisher,
    settings: BrokerSettings,
    stop: asyncio.Event,
    metrics: WorkerMetrics | None,
    run: Runner,
    inflight: set[Any],
    concurrency: int,
    starter: Starter | None = None,
    holds_back: Callable[[str], bool] = lambda job_queue: False,
    consumer_timeout: float | None = None,
) -> RateLimits | None:
    """Declare the rate-limited jobs' queues, consume their waiting rooms, run their emitter candidates.

    None when no job of ``layouts`` has a rate limit. ``connections``: the worker's
    (consuming, publishing) connections; ``run``, ``inflight``, ``starter``: see :meth:`RateLimits.start`;
    ``holds_back(job_queue)``: whether an operator's pause holds a job queue back (its gates give no token).
    ``consumer_timeout``: the broker's delivery acknowledgement timeout (seconds; the worker's
    ``--consumer-timeout``): a delivery waits for a token half as long at most (:attr:`RateLimits.wait_at_most`).

    Raises:
        TopologyConflictError: a rate queue exists with other arguments.
        BrokerError: the broker refused or did not answer in time.
    """
    jobs = rate_limited(app, layouts)
    if not jobs:
        return None
    specs = {q.name: q for q in app.topology().job_queues}
    queues = tuple(q for job, (_, lay) in jobs.items() for q in rate_declarations(specs[lay.name], job).queues)
    await declare_rate_queues(connections[0], Declarations(exchanges=(), queues=queues, bindings=()),
                              settings.safe_url)  # fmt: skip
    rooms = {
        job: Room(job, rate, rate_queue_names(lay.name, job), lay, TokenGate(job, rate, stop, held_back), decls)
        for job, (rate, lay) in jobs.items()
        for decls in [rate_declarations(specs[lay.name], job)]
        for held_back in [functools.partial(holds_back, lay.name)]
    }  # fmt: skip
    limits = RateLimits(rooms, *connections, publisher, settings, stop, metrics)
    limits.wait_at_most = None if consumer_timeout is None else consumer_timeout / 2
    await limits.start(run, inflight, concurrency, settings.safe_url, starter)
    log.info("rate-limited: %s", ", ".join(f"job={logfmt_value(j)} {r.rate}" for j, r in rooms.items()))
    return limits
