"""The scheduler: one leading replica enqueues each cron tick once.

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
  the newest message replaces the old) holding a JSON :class:`~amqpjobs.jobs.tick_record.TickRecord`
  with the cursor (every tick up to it was dealt with) and the last fired tick. A new
  leader browses it (``basic.get``, then closing the channel returns the message).
* **A tick fires atomically.** The job and the new tick record are published in one AMQP
  transaction on a fresh channel: either both reach their queues or neither does when the
  scheduler dies (uncommitted publishes are discarded with the channel; RabbitMQ "Broker
  Semantics" → "Semantics of tx"). So a new leader resumes right after the last tick that
  was really enqueued: none twice, none lost. The commit is only sent while the token's
  channel is open, i.e. while this replica still leads on the same connection.
* **Overlap guard.** A run of a schedule with ``overlap="skip"`` holds an exclusive queue
  ``amqpjobs.scheduler.<app>.running.<schedule>`` for as long as its handler runs (the
  worker side: :mod:`amqpjobs.runtime.overlap`). The leader passively declares it before
  firing: ``RESOURCE_LOCKED`` means "still running", and the tick is skipped.

The broker work (election channel, tick stores, the tick transaction) is in
:mod:`amqpjobs.wire.ticks`, reached through the :class:`~amqpjobs.wire.abc.TickWire`
protocol (:mod:`amqpjobs.testing` runs this same code on an in-memory implementation and
a virtual clock); the app is known only through :class:`ScheduledApp`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections import Counter
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Final

from amqpjobs.errors import BrokerError, ConfigurationError
from amqpjobs.jobs import cron
from amqpjobs.printable import listed, shell_quote, toml_pairs
from amqpjobs.runtime.election import Election
from amqpjobs.runtime.hard_closes import HardCloses
from amqpjobs.runtime.overlap import GUARD_ATTRIBUTE, RUNNING_QUEUE_ARGUMENTS, overlap_guarded
from amqpjobs.runtime.paced_warnings import PacedWarnings
from amqpjobs.runtime.policy_checks import warn_overrides
from amqpjobs.runtime.scheduled_app import ScheduledApp
from amqpjobs.runtime.scheduler_options import SchedulerOptions as SchedulerOptions
from amqpjobs.runtime.starting import start_unless_stopped
from amqpjobs.runtime.tick_events import TickEvent
from amqpjobs.runtime.tick_store import read_tick_record, tick_records
from amqpjobs.runtime.ticking import (
    TickFiring,
    _NotLeader,
    utc_now,
)
from amqpjobs.topology.models import JobQueueLayout
from amqpjobs.topology.naming import app_names_problem
from amqpjobs.wire import ticks
from amqpjobs.wire.abc import Publisher, TickWire
from amqpjobs.wire.connection import connect
from amqpjobs.wire.declare import declaring
from amqpjobs.wire.publish import ConfirmedPublisher
from amqpjobs.wire.settings import BrokerSettings

__all__ = [
    "GUARD_ATTRIBUTE",  # moved to amqpjobs.runtime.overlap; kept here for old imports
    "LEADER_QUEUE_ARGUMENTS",
    "RUNNING_QUEUE_ARGUMENTS",
    "TICK_QUEUE_ARGUMENTS",
    "ScheduledApp",
    "Scheduler",
    "SchedulerOptions",
    "TickEvent",
    "overlap_guarded",  # moved to amqpjobs.runtime.overlap; kept here for old imports
    "read_tick_record",
    "tick_records",
]

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


def _replica_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class Scheduler(Election, TickFiring):
    """One scheduler replica of an app: follows, or leads and enqueues the app's cron ticks.

    Args:
        app: The application whose schedules run here.
        settings: Broker settings.
        options: Scheduler options.
        on_event: Optional callback called with each :class:`TickEvent` (tests, metrics).

    """

    def __init__(
        self,
        app: ScheduledApp,
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
        self._other_sets: set[str] = set()  # other replicas' schedule sets seen on their tokens (Election)
        self._layouts: dict[str, JobQueueLayout] = {}
        self._wire: TickWire = ticks
        self._clock: Callable[[], datetime] = utc_now
        self._connection: Any = None  # a wire Connection (or the in-memory double's handle)
        self._publisher: Publisher | None = None
        self._election: Any = None  # the election channel (opaque: closed through the wire)
        self._token: Any = None  # the leader token delivery, held unacked while leading
        self._lead_task: asyncio.Task[None] | None = None
        self._follow_task: asyncio.Task[None] | None = None
        self._checks: asyncio.Task[None] | None = None  # best effort, beside the start
        self._stop = asyncio.Event()  # set by request_stop and by shutdown (a failed start's included)
        self._requested = asyncio.Event()  # request_stop only: what run() waits for (a failed start is no stop)
        self._wakeup = asyncio.Event()  # the leader looks at the clock now (stop, or look_now)
        self._looked = asyncio.Event()  # set after each look of the leader
        self._looks = 0  # looks done while leading; _looking: one under way
        self._looking = False
        self._last: dict[str, tuple[datetime | None, str | None]] = {}
        self._held = {}  # returned ticks, tried again first (ticking.py)
        self._clock_waits = set()
        self.clock_tolerance = self.options.clock_tolerance
        self._warnings = PacedWarnings(log, self.options.warn_every)  # for the replica's life, not one leadership
        self._hard = HardCloses(self.request_stop, "scheduler replica", settings)  # refused at each reconnect: exit 3

    @property
    def is_leader(self) -> bool:
        """True while this replica holds the leader token."""
        return self._wire.holds(self._token)

    @property
    def leader_queue(self) -> str:
        """The election queue of this app."""
        return cron.leader_queue(self.app.name)

    # ------------------------------------------------------------------ lifecycle
    def _schedule_names(self) -> list[str]:
        return [s.name for s in self._schedules]

    def _select(self) -> list[cron.Schedule]:
        schedules = {s.name: s for s in self.app.schedules()}
        if not schedules:
            raise ConfigurationError(f"app {self.app.name!r} has no schedules; declare some with @app.cron")
        if self.options.schedules == ():
            raise ConfigurationError(f"no schedule selected: name some of {listed(schedules)}, or None for all")
        names = self.options.schedules or tuple(schedules)
        unknown = sorted(set(names) - set(schedules))
        if unknown:
            raise ConfigurationError(f"unknown schedule(s) {listed(unknown)}; the app has {listed(schedules)}")
        chosen = [schedules[n] for n in sorted(set(names))]
        if left := sorted(set(schedules) - set(names)):
            log.warning(
                "scheduler replica %s runs %d of app %s's %d schedule(s), not %s (--schedules): the replicas of an "
                "app share one election, so while this one leads those never fire; run the same schedules on every "
                "replica", self.replica, len(chosen), self.app.name, len(schedules), ", ".join(left),
            )  # fmt: skip
        queues = [self.leader_queue, *(cron.tick_queue(self.app.name, s.name) for s in chosen)]
        if problem := app_names_problem(self.app.name, queues, "scheduler's queues"):
            raise ConfigurationError(problem)
        return chosen

    async def start(self) -> None:
        """Connect, declare the scheduler's queues, and join the election. Returns at once.

        Raises:
            ConfigurationError: no or unknown schedules, a scheduled job's job queue is
                not in the topology, or the app's name (or a schedule's) can't go into a queue name.
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
                await self._join(ConfirmedPublisher(self._connection))
        except BaseException:
            await self.shutdown()
            raise
        self._begin()
        self._hard.watch((self._connection,), check_room=False)
        ticks = [cron.tick_queue(self.app.name, s.name) for s in self._schedules]  # a policy that can lose records
        self._checks = asyncio.create_task(warn_overrides(self.settings, ticks, (), log))

    async def start_on(
        self, wire: TickWire, connection: Any, publisher: Publisher, clock: Callable[[], datetime]
    ) -> None:
        """Start as :meth:`start` does, on another implementation of the wire (the in-memory double).

        Args:
            wire: The election, tick stores and tick transaction.
            connection: The handle ``wire`` is called with; closed by :meth:`shutdown`.
            publisher: Offers leader tokens.
            clock: The time now (UTC, aware): a virtual clock drives the ticks.

        Raises:
            The errors of :meth:`start`.
        """
        self._wire, self._clock, self._connection = wire, clock, connection
        self._schedules = self._select()
        self._layouts = {s.name: self.app.layout_of(s.job) for s in self._schedules}
        try:
            await self._join(publisher)
        except BaseException:
            await self.shutdown()
            raise
        self._begin()

    async def _join(self, publisher: Publisher) -> None:
        """Check the targets, declare our queues, offer a token and join the election."""
        await self._check_targets()
        await self._declare_queues()
        self._publisher = publisher
        await self._offer_token()
        self._election = await self._wire.join_election(
            self._connection, self.leader_queue, LEADER_QUEUE_ARGUMENTS, self._on_token
        )

    def _begin(self) -> None:
        self._follow_task = asyncio.create_task(self._follow(), name="amqpjobs-scheduler-follow")
        log.info(
            "scheduler replica %s joined the election for %d schedule(s) of app %s (queue %s)",
            self.replica, len(self._schedules), self.app.name, self.leader_queue,
        )  # fmt: skip
        self.ready.set()

    async def _check_targets(self) -> None:
        assert self._connection is not None
        for layout in {lay.name: lay for lay in self._layouts.values()}.values():
            if layout.exchange and not await self._wire.exists(self._connection, "exchange", layout.exchange):
                raise BrokerError(
                    f"exchange {layout.exchange!r} does not exist on {self.settings.safe_url}: "
                    "apply the topology first (amqpjobs topology apply)"
                )
            for work_queue in layout.work_queues:
                if not await self._wire.exists(self._connection, "queue", work_queue):
                    raise BrokerError(
                        f"work queue {work_queue!r} does not exist on {self.settings.safe_url}: "
                        "apply the topology first (amqpjobs topology apply)"
                    )

    async def _declare_queues(self) -> None:
        assert self._connection is not None
        wanted: list[tuple[str, Mapping[str, Any]]] = [(self.leader_queue, LEADER_QUEUE_ARGUMENTS)]
        wanted += [(cron.tick_queue(self.app.name, s.name), TICK_QUEUE_ARGUMENTS) for s in self._schedules]
        for name, arguments in wanted:
            if not await self._wire.declare_durable(self._connection, name, arguments):
                cursor = "" if name == self.leader_queue else " (it holds the cursor: the schedule starts from now)"
                delete = f"rabbitmqctl delete_queue -p {shell_quote(self.settings.vhost)} {shell_quote(name)}"
                raise BrokerError(
                    f"queue {name!r} exists with other arguments than the scheduler declares "
                    f"({toml_pairs(arguments)}): delete it while no scheduler of app {self.app.name!r} runs "
                    f"({delete}, or the management UI), then start again{cursor}"
                )

    def request_stop(self) -> None:
        """Ask the replica to stop (safe from signal handlers)."""
        self._requested.set()
        self._stop.set()
        self._wakeup.set()

    async def run(self) -> int:
        """Start, run until :meth:`request_stop`, then hand leadership over and close.

        Returns:
            0. A stop requested while still starting gives the start up (0 too).

        Raises:
            The errors of :meth:`start`; BrokerError when the broker closed its connection for what
            it sent, or refused its reconnect, twice within 60 s (:mod:`.hard_closes`), once handed over.
        """
        started = await start_unless_stopped(self.start(), self._requested)
        if started:
            await self._requested.wait()
        await self.shutdown()
        self._hard.cancel()  # a question to the management API about a refused reconnect, still under way
        if not started:
            log.info("scheduler replica %s stopped while starting; exit 0", self.replica)
        return self._hard.after_stop(0)

    async def shutdown(self, grace: float = 10.0) -> None:
        """Stop leading or following, give the token back, close the connection.

        Args:
            grace: Seconds a wake-up in progress (a tick being committed) gets to finish.
        """
        self._stop.set()
        self._wakeup.set()
        if self._checks is not None:
            self._checks.cancel()
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
        await self._wire.close_quietly(self._election)  # the broker requeues the token for the next replica
        await self._wire.close_quietly(self._publisher)
        if self._connection is not None:
            await self._connection.close()
        await self.app.flush_queued()  # the ``queued`` records of the tick jobs committed
        if was_leader:
            log.info("scheduler replica %s stopped and handed leadership over", self.replica)

    # ------------------------------------------------------------------ leading
    async def _lead(self, token: Any) -> None:
        self.stats["leaderships"] += 1
        log.info("scheduler replica %s leads %d schedule(s) of app %s", self.replica, len(self._schedules),
                 self.app.name)  # fmt: skip
        cursors: dict[str, datetime] | None = None
        try:
            while not self._stop.is_set() and self._wire.holds(token):
                delay = self.options.max_sleep
                self._wakeup.clear()
                self._looking = True
                try:
                    if cursors is None:
                        cursors = await self._load_cursors(token)
                    due, reread = await self._tick_all(self._clock(), cursors, token)
                    self._warnings.succeeded(self._who)
                    if reread:
                        cursors = None  # a commit whose answer was lost may have happened
                    if due is not None:
                        delay = min(max((due - self._clock()).total_seconds(), 0.0), delay)
                except _NotLeader:
                    raise
                except Exception as exc:
                    cursors = None  # a commit whose answer was lost may have happened: read the stores again
                    self._warnings.failed(self._who, str(exc), f"; trying again in {delay:g}s",
                                          exc_info=not isinstance(exc, BrokerError))  # fmt: skip
                finally:
                    self._looking = False
                    self._looks += 1
                    self._looked.set()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wakeup.wait(), delay)
        except _NotLeader:
            pass
        finally:
            if not self._stop.is_set() and asyncio.current_task() is self._lead_task:  # else _on_token said it
                log.info("scheduler replica %s no longer leads", self.replica)
