"""The scheduler: one leading replica enqueues each cron tick once; the overlap guard's worker side.

Design (README "Schedules"):

* **Leader election through the broker.** Every replica consumes the durable queue
  ``amqpjobs.scheduler.<app>.leader`` (``x-single-active-consumer``, prefetch 1) in which
  a token message waits. Only the single active consumer receives deliveries, and the
  replica holding the token unacked is the leader. When its connection dies (``kill -9``
  included), the broker requeues the token and hands it to the next consumer, which
  leads from then on (RabbitMQ "Consumers" → "Single Active Consumer"). Each replica
  offers a token at start and, while following, every few seconds; the queue's
  ``x-max-length: 1`` with ``reject-publish`` refuses offers while one waits, and spare
  tokens are harmless because only the active consumer is ever served.
* **Durable tick store.** Each schedule has a durable queue
  ``amqpjobs.scheduler.<app>.ticks.<schedule>`` (``x-max-length: 1``, ``drop-head``:
  the newest message replaces the old) holding a JSON :class:`~amqpjobs.jobs.cron.TickRecord`
  with the cursor (every tick up to it was dealt with) and the last fired tick. A new
  leader browses it (``basic.get``, then closing the channel returns the message).
* **A tick fires atomically.** The job and the new tick record are published in one AMQP
  transaction on a fresh channel: either both reach their queues or neither does when the
  scheduler dies (uncommitted publishes are discarded with the channel; RabbitMQ "Broker
  Semantics" → "Semantics of tx"). So a new leader resumes right after the last tick that
  was really enqueued: none twice, none lost. The commit is only sent while the token's
  channel is open, i.e. while this replica still leads on the same connection.
* **Overlap guard.** A run of a schedule with ``overlap="skip"`` holds an exclusive queue
  ``amqpjobs.scheduler.<app>.running.<schedule>`` for as long as its handler runs
  (declared on the app's connection in the worker; the broker deletes it with that
  connection, so a killed worker leaves no stale marker). The leader passively declares
  it before firing: ``RESOURCE_LOCKED`` means "still running", and the tick is skipped.
  A run that finds the marker held when it starts (it waited in the queue while the
  previous one ran) is skipped by the worker side, so runs never overlap.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
import socket
import time
import zlib
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

import aiormq
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage, AbstractRobustConnection

from amqpjobs.errors import BrokerError, ConfigurationError, PublishNackedError
from amqpjobs.jobs import cron
from amqpjobs.jobs.envelope import OutgoingMessage, job_message
from amqpjobs.jobs.registry import JobContext
from amqpjobs.topology.models import JobQueueLayout
from amqpjobs.wire.connection import connect
from amqpjobs.wire.declare import declaring
from amqpjobs.wire.publish import ConfirmedPublisher, amqp_properties
from amqpjobs.wire.settings import BrokerSettings

if TYPE_CHECKING:
    from amqpjobs.runtime.app import App
from amqpjobs.runtime.signals import stop_on_signals

log = logging.getLogger("amqpjobs.scheduler")

#: Arguments of the election queue (classic, durable; see the module docstring).
LEADER_QUEUE_ARGUMENTS: Final[Mapping[str, Any]] = {
    "x-queue-type": "classic",
    "x-single-active-consumer": True,
    "x-max-length": 1,
    "x-overflow": "reject-publish",
}
#: Arguments of a schedule's tick store: a last-value queue.
TICK_QUEUE_ARGUMENTS: Final[Mapping[str, Any]] = {
    "x-queue-type": "classic",
    "x-max-length": 1,
    "x-overflow": "drop-head",
}
#: Arguments of a running marker (an exclusive queue: it lives as long as its connection).
RUNNING_QUEUE_ARGUMENTS: Final[Mapping[str, Any]] = {"x-queue-type": "classic"}
#: Attribute set on handlers wrapped by the overlap guard.
GUARD_ATTRIBUTE: Final = "__amqpjobs_overlap_guard__"

_BROKER_ERRORS = (aiormq.exceptions.AMQPError, aiormq.exceptions.ChannelInvalidStateError, ConnectionError)


@dataclass(frozen=True)
class SchedulerOptions:
    """How a scheduler replica runs.

    Attributes:
        schedules: Names of the schedules to run; None = every schedule of the app.
            Replicas of one app must run the same set (they share one election).
        reoffer: Seconds between a following replica's offers of a leader token (an
            offer is refused while a token waits; it heals a token lost by a purge).
        max_sleep: Longest sleep in seconds between two looks at the clock while leading;
            bounds how late a wall-clock step or a lost leadership is noticed.

    """

    schedules: tuple[str, ...] | None = None
    reoffer: float = 5.0
    max_sleep: float = 1.0


@dataclass(frozen=True)
class TickEvent:
    """What the leader did about one tick (for logs, stats and tests).

    Attributes:
        schedule: Schedule name.
        tick: The tick (UTC).
        kind: ``fired`` (on time), ``catch-up`` (one job for a missed window),
            ``skipped-missed`` (a missed window under the ``skip`` policy) or
            ``skipped-overlap`` (the previous run was still running).
        job_id: The enqueued job's id, or None when nothing was enqueued.
        missed_from / missed_until: The missed window, for ``catch-up`` and ``skipped-missed``.

    """

    schedule: str
    tick: datetime
    kind: cron.TickKind
    job_id: str | None
    missed_from: datetime | None = None
    missed_until: datetime | None = None


class _NotLeader(Exception):
    """The token was lost before a commit: nothing was published."""


def _replica_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@contextlib.asynccontextmanager
async def _throwaway_channel(connection: AbstractRobustConnection) -> AsyncIterator[AbstractChannel]:
    """A channel closed on exit even after a channel error.

    A robust channel closed by the broker (e.g. by a failed passive declare) reopens itself
    unless ``close()`` is called; checking ``is_closed`` first would leak the reopened one.
    """
    try:
        channel = await connection.channel(publisher_confirms=False)
    except (*_BROKER_ERRORS, RuntimeError, TimeoutError) as exc:
        raise BrokerError(f"could not open a channel: {exc}") from exc
    try:
        yield channel
    finally:
        with contextlib.suppress(*_BROKER_ERRORS, RuntimeError):
            await channel.close()


def _holds(token: AbstractIncomingMessage | None) -> bool:
    """True while ``token`` is held on an open channel (this replica leads)."""
    if token is None:
        return False
    try:
        return not token.channel.is_closed
    except aiormq.exceptions.ChannelInvalidStateError:
        return False


class Scheduler:
    """One scheduler replica of an app: follows, or leads and enqueues the app's cron ticks.

    Args:
        app: The application whose schedules run here.
        settings: Broker settings.
        options: Scheduler options.
        on_event: Optional callback called with each :class:`TickEvent` (tests, metrics).

    """

    def __init__(
        self,
        app: App,
        settings: BrokerSettings,
        options: SchedulerOptions | None = None,
        on_event: Callable[[TickEvent], None] | None = None,
    ) -> None:
        self.app = app
        self.settings = settings
        self.options = options or SchedulerOptions()
        self.stats: Counter[str] = Counter()
        self.ready = asyncio.Event()
        self.replica = _replica_name()
        self._on_event = on_event
        self._schedules: list[cron.Schedule] = []
        self._layouts: dict[str, JobQueueLayout] = {}
        self._connection: AbstractRobustConnection | None = None
        self._publisher: ConfirmedPublisher | None = None
        self._election: AbstractChannel | None = None
        self._token: AbstractIncomingMessage | None = None
        self._lead_task: asyncio.Task[None] | None = None
        self._follow_task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._last: dict[str, tuple[datetime | None, str | None]] = {}

    @property
    def is_leader(self) -> bool:
        """True while this replica holds the leader token."""
        return _holds(self._token)

    @property
    def leader_queue(self) -> str:
        """The election queue of this app."""
        return cron.leader_queue(self.app.name)

    # ------------------------------------------------------------------ lifecycle
    def _select(self) -> list[cron.Schedule]:
        schedules = {s.name: s for s in self.app.schedules()}
        if not schedules:
            raise ConfigurationError(f"app {self.app.name!r} has no schedules; declare some with @app.cron")
        names = self.options.schedules or tuple(schedules)
        unknown = sorted(set(names) - set(schedules))
        if unknown:
            raise ConfigurationError(f"unknown schedule(s) {unknown}; the app has {sorted(schedules)}")
        return [schedules[n] for n in sorted(set(names))]

    async def start(self) -> None:
        """Connect, declare the scheduler's queues, and join the election. Returns at once.

        Raises:
            ConfigurationError: no or unknown schedules, or a scheduled job's job queue is
                not in the topology.
            BrokerUnavailableError: the broker can't be reached.
            BrokerError: a scheduled job's exchange or work queue does not exist (apply
                the topology), the scheduler's queues exist with other arguments, or the
                declarations got no answer in time (RabbitMQ 4.3, a node in a minority;
                :data:`~amqpjobs.wire.declare.DECLARE_TIMEOUT`).

        """
        self._schedules = self._select()
        self._layouts = {s.name: self.app.layout_of(s.job) for s in self._schedules}
        self._connection = await connect(self.settings, name=f"{self.app.name}-scheduler")
        try:
            async with declaring("the scheduler's start-up declarations", self.settings.safe_url):
                await self._check_targets()
                await self._declare_queues()
                self._publisher = ConfirmedPublisher(self._connection)
                await self._offer_token()
                self._election = await self._connection.channel(publisher_confirms=False)
                await self._election.set_qos(prefetch_count=1)
                queue = await self._election.declare_queue(
                    self.leader_queue, durable=True, arguments=dict(LEADER_QUEUE_ARGUMENTS)
                )
                await queue.consume(self._on_token)
        except BaseException:
            await self.shutdown()
            raise
        self._follow_task = asyncio.create_task(self._follow(), name="amqpjobs-scheduler-follow")
        log.info(
            "scheduler replica %s joined the election for %d schedule(s) of app %s (queue %s)",
            self.replica, len(self._schedules), self.app.name, self.leader_queue,
        )  # fmt: skip
        self.ready.set()

    async def _check_targets(self) -> None:
        assert self._connection is not None
        for layout in {lay.name: lay for lay in self._layouts.values()}.values():
            if layout.exchange:
                async with _throwaway_channel(self._connection) as channel:
                    try:
                        await channel.declare_exchange(layout.exchange, passive=True)
                    except aiormq.exceptions.ChannelNotFoundEntity as exc:
                        raise BrokerError(
                            f"exchange {layout.exchange!r} does not exist on {self.settings.safe_url}: "
                            "apply the topology first (amqpjobs topology apply)"
                        ) from exc
            for work_queue in layout.work_queues:
                async with _throwaway_channel(self._connection) as channel:
                    try:
                        await channel.declare_queue(work_queue, passive=True)
                    except aiormq.exceptions.ChannelNotFoundEntity as exc:
                        raise BrokerError(
                            f"work queue {work_queue!r} does not exist on {self.settings.safe_url}: "
                            "apply the topology first (amqpjobs topology apply)"
                        ) from exc

    async def _declare_queues(self) -> None:
        assert self._connection is not None
        wanted: list[tuple[str, Mapping[str, Any]]] = [(self.leader_queue, LEADER_QUEUE_ARGUMENTS)]
        wanted += [(cron.tick_queue(self.app.name, s.name), TICK_QUEUE_ARGUMENTS) for s in self._schedules]
        for name, arguments in wanted:
            async with _throwaway_channel(self._connection) as channel:
                try:
                    await channel.declare_queue(name, durable=True, arguments=dict(arguments))
                except aiormq.exceptions.ChannelPreconditionFailed as exc:
                    raise BrokerError(
                        f"queue {name!r} exists with other arguments than the scheduler's {dict(arguments)}: "
                        "delete it (no scheduler may run meanwhile) and start again"
                    ) from exc

    def request_stop(self) -> None:
        """Ask the replica to stop (safe from signal handlers)."""
        self._stop.set()

    async def run(self) -> int:
        """Start, run until :meth:`request_stop`, then hand leadership over and close.

        Returns:
            0.

        """
        await self.start()
        await self._stop.wait()
        await self.shutdown()
        return 0

    async def shutdown(self, grace: float = 10.0) -> None:
        """Stop leading or following, give the token back, close the connection.

        Args:
            grace: Seconds a wake-up in progress (a tick being committed) gets to finish.

        """
        self._stop.set()
        if self._follow_task is not None:
            self._follow_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._follow_task
        if self._lead_task is not None and not self._lead_task.done():
            _, pending = await asyncio.wait({self._lead_task}, timeout=grace)
            for task in pending:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        was_leader = self.is_leader
        if self._election is not None:
            with contextlib.suppress(*_BROKER_ERRORS, RuntimeError):
                await self._election.close()  # the broker requeues the token for the next replica
        if self._publisher is not None:
            with contextlib.suppress(*_BROKER_ERRORS, RuntimeError):
                await self._publisher.close()
        if self._connection is not None:
            await self._connection.close()
        if was_leader:
            log.info("scheduler replica %s stopped and handed leadership over", self.replica)

    # ------------------------------------------------------------------ election
    async def _offer_token(self) -> None:
        assert self._publisher is not None
        token = OutgoingMessage(body=b"leader", content_type="text/plain", type="amqpjobs.scheduler-token")
        try:
            await self._publisher.publish("", self.leader_queue, token)
            log.debug("offered a leader token")
        except PublishNackedError:
            pass  # a token already waits: x-max-length 1, reject-publish

    async def _follow(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.options.reoffer)
            if self._stop.is_set() or self.is_leader:
                continue
            try:
                await self._offer_token()
            except Exception as exc:  # the broker may be away; the next offer comes in a few seconds
                log.debug("token offer failed: %s", exc)

    async def _on_token(self, message: AbstractIncomingMessage) -> None:
        if self._stop.is_set() or self.is_leader:
            return  # held unacked: it returns to the queue with our channel
        self._token = message
        if self._lead_task is not None and not self._lead_task.done():
            self._lead_task.cancel()
        self._lead_task = asyncio.create_task(self._lead(message), name="amqpjobs-scheduler-lead")

    # ------------------------------------------------------------------ leading
    async def _lead(self, token: AbstractIncomingMessage) -> None:
        self.stats["leaderships"] += 1
        log.info("scheduler replica %s leads %d schedule(s) of app %s", self.replica, len(self._schedules),
                 self.app.name)  # fmt: skip
        cursors: dict[str, datetime] | None = None
        try:
            while not self._stop.is_set() and _holds(token):
                delay = self.options.max_sleep
                try:
                    if cursors is None:
                        cursors = await self._load_cursors(token)
                    now = datetime.now(UTC)
                    for schedule in self._schedules:
                        await self._tick(schedule, now, cursors, token)
                    due = min(s.rule.next_after(cursors[s.name]) for s in self._schedules)
                    delay = min(max((due - datetime.now(UTC)).total_seconds(), 0.0), delay)
                except _NotLeader:
                    raise
                except Exception as exc:
                    # A commit whose answer was lost may have happened: read the tick stores
                    # again before trying, so that it is not fired twice.
                    cursors = None
                    log.warning("scheduler replica %s: %s; trying again in %gs", self.replica, exc, delay,
                                exc_info=not isinstance(exc, BrokerError))  # fmt: skip
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), delay)
        except _NotLeader:
            pass
        finally:
            if not self._stop.is_set():
                log.info("scheduler replica %s no longer leads", self.replica)

    async def _load_cursors(self, token: AbstractIncomingMessage) -> dict[str, datetime]:
        cursors: dict[str, datetime] = {}
        for schedule in self._schedules:
            record = await self._read_record(schedule)
            if record is None:
                # A browsing reader may hold the record for a moment: look once more before
                # concluding that the schedule is new.
                await asyncio.sleep(0.5)
                record = await self._read_record(schedule)
            if record is None:
                now = datetime.now(UTC).replace(microsecond=0)
                baseline = cron.TickRecord(schedule.name, now, None, None, now, self.replica)
                await self._commit(token, schedule, [], baseline)
                log.info("schedule %s is new: it fires from %s on", schedule.name, cron.format_tick(now))
                record = baseline
            cursors[schedule.name] = record.cursor
            self._last[schedule.name] = (record.last_fired, record.last_job_id)
        return cursors

    async def _read_record(self, schedule: cron.Schedule) -> cron.TickRecord | None:
        assert self._connection is not None
        return await read_tick_record(self._connection, cron.tick_queue(self.app.name, schedule.name))

    async def _is_running(self, schedule: cron.Schedule) -> bool:
        assert self._connection is not None
        async with _throwaway_channel(self._connection) as channel:
            try:
                await channel.declare_queue(cron.running_queue(self.app.name, schedule.name), passive=True)
            except aiormq.exceptions.ChannelLockedResource:
                return True  # an exclusive marker held by a worker's connection
            except aiormq.exceptions.ChannelNotFoundEntity:
                return False
            except _BROKER_ERRORS as exc:
                raise BrokerError(f"checking whether schedule {schedule.name!r} runs failed: {exc}") from exc
        return True

    def _job(
        self, schedule: cron.Schedule, tick: datetime, kind: cron.TickKind, plan: cron.TickPlan
    ) -> tuple[str, str, OutgoingMessage]:
        layout = self._layouts[schedule.name]
        job_id = cron.tick_id(schedule.name, tick)
        message = job_message(schedule.job, schedule.payload, job_id=job_id, now=time.time())
        headers: dict[str, Any] = {
            **message.headers,
            cron.SCHEDULE_HEADER: schedule.name,
            cron.TICK_HEADER: cron.format_tick(tick),
            cron.KIND_HEADER: kind,
            cron.FIRED_BY_HEADER: self.replica,
        }
        if kind == "catch-up" and plan.missed_from is not None and plan.missed_until is not None:
            headers[cron.MISSED_FROM_HEADER] = cron.format_tick(plan.missed_from)
            headers[cron.MISSED_UNTIL_HEADER] = cron.format_tick(plan.missed_until)
        routing_key = layout.routing_key
        if layout.shard_routing_keys:  # the rule of App.enqueue without a tenant
            routing_key = layout.shard_routing_keys[zlib.crc32(job_id.encode()) % len(layout.shard_routing_keys)]
        return layout.exchange, routing_key, dataclasses.replace(message, headers=headers)

    async def _tick(
        self,
        schedule: cron.Schedule,
        now: datetime,
        cursors: dict[str, datetime],
        token: AbstractIncomingMessage,
    ) -> None:
        plan = cron.plan_ticks(schedule, cursors[schedule.name], now)
        if not plan.due:
            return
        running = schedule.overlap == "skip" and await self._is_running(schedule)
        jobs: list[tuple[str, str, OutgoingMessage]] = []
        events: list[TickEvent] = []
        window = (plan.missed_from, plan.missed_until)
        if plan.missed_until is not None:
            if schedule.missed == "skip":
                events.append(TickEvent(schedule.name, plan.missed_until, "skipped-missed", None, *window))
            elif running:
                events.append(TickEvent(schedule.name, plan.missed_until, "skipped-overlap", None, *window))
            else:
                jobs.append(self._job(schedule, plan.missed_until, "catch-up", plan))
                job_id = cron.tick_id(schedule.name, plan.missed_until)
                events.append(TickEvent(schedule.name, plan.missed_until, "catch-up", job_id, *window))
        if plan.on_time is not None:
            if running:
                events.append(TickEvent(schedule.name, plan.on_time, "skipped-overlap", None))
            else:
                jobs.append(self._job(schedule, plan.on_time, "fired", plan))
                events.append(
                    TickEvent(schedule.name, plan.on_time, "fired", cron.tick_id(schedule.name, plan.on_time))
                )
        last_fired, last_job_id = self._last.get(schedule.name, (None, None))
        for event in events:
            if event.job_id is not None:
                last_fired, last_job_id = event.tick, event.job_id
        record = cron.TickRecord(schedule.name, plan.cursor, last_fired, last_job_id, now, self.replica)
        await self._commit(token, schedule, jobs, record)
        cursors[schedule.name] = plan.cursor
        self._last[schedule.name] = (last_fired, last_job_id)
        for event in events:
            self._record(event)

    async def _commit(
        self,
        token: AbstractIncomingMessage,
        schedule: cron.Schedule,
        jobs: list[tuple[str, str, OutgoingMessage]],
        record: cron.TickRecord,
    ) -> None:
        """Publish ``jobs`` and ``record`` in one transaction, only while ``token`` is held.

        Raises:
            _NotLeader: the token was lost; nothing was published.
            BrokerError: the transaction failed (nothing was published), or its answer was
                lost (the caller reads the tick store again before the next try).

        """
        assert self._connection is not None
        store = OutgoingMessage(
            body=record.to_bytes(),
            content_type="application/json",
            type="amqpjobs.tick-record",
            timestamp=time.time(),
        )
        try:
            async with _throwaway_channel(self._connection) as channel:
                # The raw channel, so that a reconnect can't move our publishes onto a new
                # channel that is not in transaction mode.
                raw = await channel.get_underlay_channel()
                await raw.tx_select()
                for exchange, routing_key, message in jobs:
                    await raw.basic_publish(
                        message.body, exchange=exchange, routing_key=routing_key,
                        properties=amqp_properties(message), mandatory=True,
                    )  # fmt: skip
                await raw.basic_publish(
                    store.body,
                    exchange="",
                    routing_key=cron.tick_queue(self.app.name, schedule.name),
                    properties=amqp_properties(store),
                )
                if not _holds(token):
                    raise _NotLeader  # closing the channel discards the uncommitted publishes
                await raw.tx_commit(timeout=30)
        except _BROKER_ERRORS as exc:
            raise BrokerError(f"schedule {schedule.name!r}: transaction failed, nothing was published: {exc}") from exc
        except TimeoutError as exc:
            raise BrokerError(f"schedule {schedule.name!r}: no tx.commit-ok within 30s") from exc

    def _record(self, event: TickEvent) -> None:
        self.stats[event.kind] += 1
        extra = ""
        if event.missed_from is not None and event.missed_until is not None:
            extra = f" missed={cron.format_tick(event.missed_from)}..{cron.format_tick(event.missed_until)}"
        log.info(
            "schedule=%s tick=%s id=%s outcome=%s%s",
            event.schedule, cron.format_tick(event.tick), event.job_id or "-", event.kind, extra,
        )  # fmt: skip
        if self._on_event is not None:
            self._on_event(event)


async def read_tick_record(connection: AbstractRobustConnection, queue: str) -> cron.TickRecord | None:
    """Browse a tick store: the latest record in ``queue``, or None. The messages stay.

    Any replica (or a tool) may read it; reading holds the message unacked for a moment
    and then returns it by closing the channel.

    Raises:
        BrokerError: the queue does not exist or the broker failed.

    """
    records: list[cron.TickRecord] = []
    async with _throwaway_channel(connection) as channel:
        try:
            store = await channel.get_queue(queue, ensure=False)
            for _ in range(16):
                message = await store.get(no_ack=False, fail=False)
                if message is None:
                    break
                try:
                    records.append(cron.TickRecord.from_bytes(message.body))
                except ValueError as exc:
                    log.warning("tick store %s holds a message that is not a tick record: %s", queue, exc)
        except _BROKER_ERRORS as exc:
            raise BrokerError(f"reading tick store {queue!r} failed: {exc}") from exc
    return cron.latest_record(records)


async def tick_records(app: App, settings: BrokerSettings) -> dict[str, cron.TickRecord | None]:
    """The stored state of each of ``app``'s schedules (None: never run), by schedule name.

    Raises:
        BrokerUnavailableError: the broker can't be reached.
        BrokerError: a tick store is missing (the scheduler never ran) or the broker failed.

    """
    connection = await connect(settings, wait=5.0, name=f"{app.name}-tick-reader")
    try:
        return {s.name: await read_tick_record(connection, cron.tick_queue(app.name, s.name)) for s in app.schedules()}
    finally:
        await connection.close()


# ---------------------------------------------------------------------- overlap guard, worker side
class _Marker:
    """A schedule's running marker held on the app's connection (see the module docstring)."""

    def __init__(self, connection: AbstractRobustConnection, queue: str) -> None:
        self._connection = connection
        self.queue = queue

    async def acquire(self) -> bool:
        """Declare the exclusive marker queue; False when another connection holds it."""
        async with _throwaway_channel(self._connection) as channel:
            try:
                await channel.declare_queue(
                    self.queue, exclusive=True, durable=False, auto_delete=False,
                    arguments=dict(RUNNING_QUEUE_ARGUMENTS),
                )  # fmt: skip
            except aiormq.exceptions.ChannelLockedResource:
                return False
        return True

    async def release(self) -> None:
        """Delete the marker (best effort: it goes with the connection anyway)."""
        try:
            async with _throwaway_channel(self._connection) as channel:
                queue = await channel.get_queue(self.queue, ensure=False)
                await asyncio.wait_for(queue.delete(if_unused=False, if_empty=False), 10)
        except (*_BROKER_ERRORS, TimeoutError) as exc:
            log.warning("running marker %s not deleted (%s); it goes with the connection", self.queue, exc)


def _text(value: Any) -> str | None:
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    return None if value is None else str(value)


def overlap_guarded(app: App, handler: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """Wrap an async job handler so that runs of a schedule with ``overlap="skip"`` never overlap.

    For a delivery enqueued by such a schedule (header ``amqpjobs-cron-schedule``), the
    wrapper holds the schedule's running marker while ``handler`` runs, and returns
    without running it when another run holds the marker (logged; the delivery is acked).
    Other deliveries run ``handler`` unchanged. The marker lives on the app's own
    connection (``App(url=...)`` or ``$AMQPJOBS_URL``, as for enqueueing from a handler).

    Args:
        app: The application (its schedules and its connection).
        handler: ``async def handler(payload, ctx)``.

    Returns:
        The wrapped handler, marked with :data:`GUARD_ATTRIBUTE`.

    """
    held: set[str] = set()  # markers held by this process: one connection owns them all

    @functools.wraps(handler)
    async def guarded(payload: Any, ctx: JobContext) -> Any:
        name = _text(ctx.headers.get(cron.SCHEDULE_HEADER))
        schedule = next((s for s in app.schedules() if s.name == name), None)
        if name is None or schedule is None or schedule.overlap != "skip":
            return await handler(payload, ctx)
        if name in held:
            log.info("job=%s id=%s skipped: the previous run of schedule %s is still running", ctx.job, ctx.job_id,
                     name)  # fmt: skip
            return None
        held.add(name)
        try:
            await app.connect()
            connection = app._connection
            assert connection is not None
            marker = _Marker(connection, cron.running_queue(app.name, name))
            if not await marker.acquire():
                log.info("job=%s id=%s skipped: the previous run of schedule %s is still running", ctx.job,
                         ctx.job_id, name)  # fmt: skip
                return None
            try:
                return await handler(payload, ctx)
            finally:
                await marker.release()
        finally:
            held.discard(name)

    setattr(guarded, GUARD_ATTRIBUTE, True)
    return guarded


async def run_scheduler(app: App, settings: BrokerSettings, options: SchedulerOptions) -> int:
    """Run a scheduler replica until SIGTERM/SIGINT; a second signal exits at once.

    Returns:
        The process exit code, 0.

    """
    scheduler = Scheduler(app, settings, options)
    with stop_on_signals(scheduler.request_stop, "handing leadership over and stopping"):
        return await scheduler.run()
