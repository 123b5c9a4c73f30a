"""The worker: consume job queues, run handlers, ack after commit, retry or quarantine.

Rules (README "Workers"):

* a work queue's N slots are one consumer with ``prefetch_count=N`` on a channel of its
  own (per consumer, not global), so the process holds at most one unacked delivery per
  slot (fair dispatch: RabbitMQ "Consumer Prefetch"; :mod:`amqpjobs.wire.consume`); a
  sharded job queue's N slots are shared by all its shards, N unacked deliveries at most
  (:mod:`amqpjobs.runtime.dispatch`);
* a delivery is acked only after its handler returned;
* a failed attempt is republished to the next delay tier with attempt + 1 (confirmed),
  then the original is acked; ``x-death`` & co are stripped from the copy;
* a permanent failure goes to quarantine with evidence headers (confirmed), then acked;
* if that republish fails, the delivery is held unacked until its target is back
  (:mod:`amqpjobs.runtime.holding`: never a reject into a dead-letter exchange that can't
  route); if the channel died, nothing is acked and the broker redelivers;
* a delivery from a channel that has since closed is never acked on a new channel.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
import time
from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import Any

from amqpjobs.jobs.events import event_messages
from amqpjobs.jobs.isolation import IsolationGate
from amqpjobs.jobs.outcome import Outcome as Outcome  # re-exported: Worker(on_outcome=) gets these
from amqpjobs.runtime.app import App
from amqpjobs.runtime.breakers import Breakers
from amqpjobs.runtime.broker_rules import check_layouts, consumer_timeouts
from amqpjobs.runtime.deadlines import Deadlines
from amqpjobs.runtime.dispatch import ShardDispatcher
from amqpjobs.runtime.draining import Draining
from amqpjobs.runtime.handler_threads import HandlerThreads
from amqpjobs.runtime.hard_closes import HardCloses
from amqpjobs.runtime.heap import settle_heap
from amqpjobs.runtime.holding import Holding
from amqpjobs.runtime.ledger_key import seal_key_of
from amqpjobs.runtime.ledger_origin import marker_queue, start_ledger
from amqpjobs.runtime.metrics import WorkerMetrics
from amqpjobs.runtime.missing_objects import require_objects_at_start
from amqpjobs.runtime.overruns import Overruns
from amqpjobs.runtime.pausing import OperatorPauses
from amqpjobs.runtime.payloads import open_store
from amqpjobs.runtime.policy_checks import layout_queues, warn_overrides
from amqpjobs.runtime.pruning import keep_pruned
from amqpjobs.runtime.rate_limits import RateLimits, rate_limited, start_rate_limits
from amqpjobs.runtime.recording import PacedDeferrals
from amqpjobs.runtime.results_writer import ResultsWriter, start_results
from amqpjobs.runtime.sources import Source
from amqpjobs.runtime.stall import StallWatch
from amqpjobs.runtime.starting import start_again, start_unless_stopped
from amqpjobs.runtime.stopping import WorkerStop
from amqpjobs.runtime.undeliverable import Rescue, quarantines_of, start_past_undeliverable, watch_undeliverable
from amqpjobs.runtime.unread import warn_dropped_shards
from amqpjobs.runtime.worker_config import WorkerOptions as WorkerOptions
from amqpjobs.runtime.worker_config import check_worker, consumed_job_queues, lease_warnings
from amqpjobs.topology.models import JobQueueLayout
from amqpjobs.wire.abc import Connection, Publisher
from amqpjobs.wire.arguments import desired_state
from amqpjobs.wire.connection import broker_info, connect, heartbeat_timeout
from amqpjobs.wire.consume import DeliveryHandler, WorkQueueConsumer
from amqpjobs.wire.delivery import Delivery
from amqpjobs.wire.events import OutcomeEvents
from amqpjobs.wire.fetch import QueueFetcher
from amqpjobs.wire.giving_way import PUBLISHING_MEANWHILE, give_way
from amqpjobs.wire.publish import ConfirmedPublisher
from amqpjobs.wire.settings import BrokerSettings

log = logging.getLogger("amqpjobs.worker")
#: Seconds a delivery taken while the start goes on waits for its end (its consuming line) before it runs anyway.
START_HOLD = 1.0


def _say_if_failed(task: asyncio.Task[None]) -> None:
    """Log what a best-effort background check raised (else: "Task exception was never retrieved")."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("a background check of the worker failed: %s", exc, exc_info=exc)


class Worker(WorkerStop):
    """Consumes an app's job queues until stopped.

    Args:
        app: The application whose jobs run here.
        settings: Broker settings.
        options: Worker options.
        on_outcome: Optional callback called with each :class:`Outcome` (tests, metrics).
        metrics: Prometheus metrics to record into (see :mod:`amqpjobs.runtime.metrics`).

    Attributes:
        ready: Set once :meth:`start` is over: consuming every assigned queue (``/readyz``).
        took_deliveries: True once a consumer handed the worker a delivery, which can be before
            ``ready`` (the start's steps after its first consumer); a stop then drains and logs
            its draining and stopped lines as for a ready worker.

    """

    def __init__(
        self,
        app: App,
        settings: BrokerSettings,
        options: WorkerOptions | None = None,
        on_outcome: Callable[[Outcome], None] | None = None,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        self.app = app
        self.settings = settings
        self.options = options or WorkerOptions()
        self.stats: Counter[str] = Counter()
        self._header_types_said: set[tuple[str, str]] = set()  # (header, type) of unread headers warned of
        self._deferral_lines = PacedDeferrals()  # ClaimBusy deferrals: a line per job id at most every 10 s
        self._on_outcome = on_outcome
        self._stop = asyncio.Event()
        self._hard = HardCloses(self._stop.set, settings=settings)  # refused at each reconnect: the worker stops
        self._took_last = asyncio.Event()  # stopping: every consumer cancelled (then hand-backs go out)
        self._connection: Connection | None = None  # consumes and acks
        self._publishing: Connection | None = None  # copies: an alarm blocks it, never the acks
        self._rescue: Rescue | None = None  # the move of an undeliverable message to quarantine (start)
        self._publisher: Publisher | None = None  # tier and suspects copies: default exchange
        self._quarantiner: Publisher | None = None  # to quarantine exchanges, which may be missing
        self._events: OutcomeEvents | None = None  # outcome events, no job waits for them (amqpjobs.wire.events)
        self._consumers: list[Source] = []  # a consumer per unsharded work queue, a dispatcher per sharded job queue
        self._inflight: set[asyncio.Task[Any]] = set()
        self._draining = Draining()  # handlers started, deliveries handed back while stopping: the stop's counts
        self._late_claims: set[asyncio.Task[None]] = set()  # idempotency claims given up at the stop (runs.py)
        self._threads = HandlerThreads()  # plain-function handlers' pool; past the grace, see before_close
        self._layouts: dict[str, JobQueueLayout] = {}
        self._host, self._pid = socket.gethostname(), os.getpid()
        self.ready = asyncio.Event()
        self._start_called = False  # start() is begun once (a second call waits for it)
        self._start_over = asyncio.Event()  # start() ended (ready or failed): deliveries taken meanwhile run
        self.took_deliveries = False  # a consumer handed it a delivery (maybe before ready: a start has steps after)
        self._own_process = False  # run(own_process=True): the process is this worker's (settle_heap)
        self.metrics = metrics
        self.heartbeat_at = time.monotonic()
        self._background: list[asyncio.Task[None]] = []  # heartbeat, ledger/results pruning, payload sweep
        self._results: ResultsWriter | None = None
        self._gate = IsolationGate()
        self._held = 0  # deliveries in the handler and not yet settled (running, handing back)
        self._held_changed = asyncio.Event()
        self._suspects_signal = asyncio.Event()  # a suspect was registered here: look at once
        self._suspect_tasks: list[asyncio.Task[None]] = []
        self._suspects_running = 0  # suspects' jobs running alone now (not in _inflight)
        self._overruns = Overruns(
            self.options.grace
        )  # plain-function runs past their timeout (amqpjobs.runtime.overruns)
        self._lanes_missing: set[str] = set()  # suspects queues found missing
        self._stalls = StallWatch()
        self._deadlines = Deadlines(on_expired=self._timed_out)  # async handlers' timeouts
        self._heartbeat_timeout = 0.0
        self._timeouts: dict[str, float] = {}
        self._consumer_timeouts: dict[str, float | None] = {}  # job queue -> x-consumer-timeout (s), set at connect
        self._version: tuple[int, ...] = (0,)  # the broker's, read at connect
        self._breakers: Breakers | None = None  # jobs with a circuit breaker (README "Flow control")
        self._holding = Holding(self._probe, self._pause_queue, self._resume_queue, self._held_changed.set,
                               bind=self._bind)  # fmt: skip
        self._rates: RateLimits | None = None  # rate-limited jobs' waiting rooms and tokens (README "Flow control")
        self._pauses = OperatorPauses(settings, self._pause_job_queue, self._resume_unheld, metrics)  # amqpjobs pause

    # ------------------------------------------------------------------ lifecycle
    def job_queues(self) -> tuple[str, ...]:
        """The job queues this worker consumes."""
        return consumed_job_queues(self.app, self.options)

    def _check(self) -> None:
        self._layouts, self._timeouts = check_worker(self.app, self.options)
        for line in lease_warnings(self.app, self._timeouts, self.options.grace):
            log.warning(line)

    async def start(self) -> None:
        """Connect and start consuming. Returns once every slot consumes.

        Raises:
            ConfigurationError: concurrency below 1, a job queue is missing from the topology,
                ``options.queues`` names one the app serves no job from, or a job's policy can't
                work with its queue (:func:`check_worker`).
            TopologyValidationError: the app's topology files are invalid.
            BrokerUnavailableError: the broker can't be reached.
            BrokerError: a work queue does not exist on the broker (apply the topology), or
                (RabbitMQ 4.3+) fewer than a majority of the cluster's nodes run.
            PayloadStoreError: the app's payload store can't be opened.

        A delivery the first consumers take while the start goes on waits for its end to run, up to
        :data:`START_HOLD` s: its job's line comes after ``worker consuming ...`` (or after the start's
        failure), unless a start step after the first consumer takes longer than that. A second call waits for
        the first and returns once it is ready, opening nothing more (as ``asyncio.Server.start_serving``); one
        after a start that failed or a stop raises ``ConfigurationError``: a Worker starts once.
        """
        if self._start_called:  # before: each call opened its connections and consumers, and watched the app's again
            return await start_again(self._start_over, self.ready, self._stop)
        self._start_called = True
        try:
            await self._connect_and_consume()
        finally:
            self._start_over.set()

    async def _connect_and_consume(self) -> None:
        self._check()
        self._background.append(asyncio.create_task(self._beat()))  # from here: a first connect retried is no stall
        self.app.set_default_url(self.settings.url)
        slots = sum(len(lay.work_queues) for lay in self._layouts.values()) * self.options.concurrency
        slots += len(rate_limited(self.app, self._layouts.values())) * self.options.concurrency  # waiting rooms
        self._threads.open(slots, "amqpjobs-sync")
        await require_objects_at_start(self.settings, self._layouts.values())
        if (store := self.app.payload_store) is not None:  # else every large job would fail into quarantine
            await open_store(
                store, "the worker did not start (each large job would be quarantined payload-store-error)", marks=True
            )
        self._connection = await connect(self.settings, name=f"{self.app.name}-worker")
        self._version = version = broker_info(self._connection).version  # see amqpjobs.runtime.broker_rules
        check_layouts(self._layouts.values(), version)
        longest = {q: max((t for j, t in self._timeouts.items() if self.app.resolve(j).queue == q), default=0.0)
                   for q in self._layouts}  # fmt: skip
        self._consumer_timeouts = consumer_timeouts(
            self._layouts.values(), longest, version, self.options.consumer_timeout
        )
        on_confirm = self.metrics.confirm.observe if self.metrics is not None else None
        # RabbitMQ "Memory and Disk Alarms": use separate connections to publish and to consume
        self._publishing = publishing = await connect(self.settings, name=f"{self.app.name}-worker-publisher")
        # a copy the broker holds during a resource alarm is stored once it clears: never sent twice
        self._publisher = ConfirmedPublisher(publishing, on_confirm=on_confirm, wait_while_blocked=True)
        self._quarantiner = ConfirmedPublisher(publishing, on_confirm=on_confirm, serial=True, wait_while_blocked=True)
        dropped = self.metrics.events_dropped_one if self.metrics else None
        # a connection of their own: a close crossing an event can cost only it (amqpjobs.wire.events)
        self._events = await OutcomeEvents.connect(
            self.settings, f"{self.app.name}-worker-events", event_messages, dropped
        )
        self._breakers = await Breakers.open(self.app, self._layouts, publishing, self.settings, self.metrics,
                                             self._timeouts)  # fmt: skip
        self._heartbeat_timeout = heartbeat_timeout(self._connection)
        self._stalls.start()
        marker: list[str] = []  # the app's ledger marker, checked for policies with its job queues' queues
        if self.app.ledger is not None and any(j.idempotent for j in self.app):
            marker.append(marker_queue(self.app.name))
            aside = functools.partial(connect, self.settings, wait=0, name=f"{self.app.name}-ledger-marker")
            self._seal_key = await start_ledger(self.app.ledger, self.app.name, self._connection, self.settings.vhost,
                                                self.options.new_ledger, aside)  # fmt: skip
            self._background.append(asyncio.create_task(keep_pruned(self.app.ledger)))
        self._start_results()
        if store is not None:  # any worker sweeps: deletion needs no one process
            sweep = keep_pruned(store, store.sweep_every, "stored payload(s)")
            self._background.append(asyncio.create_task(sweep))
        await self._pauses.start(self._connection, self._layouts.values())  # each source then starts paused or not
        self._rates = await start_rate_limits(
            self.app, self._layouts.values(), (self._connection, publishing), self._publisher, self.settings,
            self._stop, self.metrics, self._held_by, self._inflight, self.options.concurrency, self._started,
            self._pauses.holds_back, self.options.consumer_timeout,
        )  # fmt: skip
        self._background += self._rates.tasks if self._rates else []
        if self._own_process:
            settle_heap()  # before the first delivery: the start's full collection stalls no job
        # a message no 0-9-1 client can receive at a work queue's head (541 at each delivery): to quarantine
        self._rescue, watch = watch_undeliverable(self.settings, self._connection, publishing, self._layouts.values(),
                                                  self.app.app_version, lambda: self._consumers)  # fmt: skip
        self._background.append(watch)
        for layout in self._layouts.values():
            if layout.shard_routing_keys:  # its N slots shared fairly among the shards, N deliveries at most
                await self._start_dispatcher(layout)
            else:
                await self._start_consumer(layout, layout.work_queues[0])
            fetcher = await QueueFetcher.opened(self._connection, layout.suspects_queue)  # counted: see .hard_closes
            self._suspect_tasks.append(asyncio.create_task(self._watch_suspects(layout, fetcher)))
        self._hard.watch((self._connection, publishing))  # room for a reconnect's channels; a refusal met twice stops
        self.app.watch_connections(lambda app_connection: self._hard.watch((app_connection,), check_room=False))
        self._hard.watch_best_effort(self._events.connection, "outcome events")  # said, no job needs them
        give_way(publishing, [self._connection], PUBLISHING_MEANWHILE, slot_only=True)  # closes if that makes room
        give_way(self._events.connection, [self._connection, publishing], "its outcome events are dropped (counted)")
        log.info("worker %s", self._consuming())  # as /readyz says it
        desired = desired_state(self.app.topology().declarations())  # best effort, not awaited: ready not held back
        held = layout_queues(self._layouts.values()) + marker
        for found in (warn_dropped_shards(self.settings, self._layouts.values(), log),
                      warn_overrides(self.settings, held, desired, log, self._version)):  # fmt: skip
            self._background.append(check := asyncio.create_task(found))
            check.add_done_callback(_say_if_failed)
        self.ready.set()

    async def start_on(self, publisher: Publisher, version: tuple[int, ...] | None = None) -> None:
        """Get ready for :meth:`handle` on another wire (:mod:`amqpjobs.testing`): no connection, no consumers.

        Checks the jobs as :meth:`start` does (``ConfigurationError``), and the job queues against
        ``version`` when given (the RabbitMQ version the wire stands for:
        :func:`~amqpjobs.runtime.broker_rules.check_layouts`); every copy (tiers, quarantine) goes
        through ``publisher``.
        """
        self._check()
        if version is not None:
            check_layouts(self._layouts.values(), version)
        self._threads.open(self.options.concurrency, "amqpjobs")
        self._publisher = self._quarantiner = publisher
        opener = getattr(self.app.ledger, "open", None)
        if opener is not None and any(j.idempotent for j in self.app):
            await opener()
            self._seal_key = await seal_key_of(self.app.ledger)
        self._start_results()
        self._start_over.set()
        self.ready.set()

    def _start_results(self) -> None:
        """The results store's writer and pruner (App(results=...)), when the app has one."""
        failed = self.metrics.results_write_failed if self.metrics is not None else None
        self._results = start_results(self.app, failed, self._background)

    def _held_by(self, layout: JobQueueLayout, hand_back: bool = False, rated: bool = False) -> DeliveryHandler:
        """A job queue's delivery handler (held until settled, in flight meanwhile); ``hand_back``: never run.

        ``rated``: a rate-limited job's delivery that took its token (never moved to its waiting room again).
        """
        inflight = self._inflight

        async def held(delivery: Delivery) -> None:
            task = asyncio.current_task()
            assert task is not None
            self.took_deliveries = True
            inflight.add(task)
            self._held += 1
            try:
                if not self._start_over.is_set():  # the job's line after the start's consuming line (START_HOLD)
                    await asyncio.wait({asyncio.ensure_future(self._start_over.wait())}, timeout=START_HOLD)
                await self._handle(layout, delivery, hand_back=hand_back, rated=rated, task=task)
            finally:
                inflight.discard(task)
                self._held -= 1
                self._held_changed.set()

        return held

    async def _start_consumer(self, layout: JobQueueLayout, work_queue: str) -> None:
        assert self._connection is not None
        consumer = WorkQueueConsumer(
            self._connection, work_queue, self.options.concurrency, self._held_by(layout),
            self.settings.safe_url, self._consumer_timeouts.get(layout.name),
        )  # fmt: skip
        assert self._rescue is not None
        rescue = partial(self._rescue, quarantines_of([layout]))
        await start_past_undeliverable(partial(self._started, consumer), consumer.start, rescue, self._connection)

    async def _start_dispatcher(self, layout: JobQueueLayout) -> None:
        """A sharded job queue: N slots for all its shards, taken by turns and leases (:mod:`.dispatch`)."""
        assert self._connection is not None
        first = not any(isinstance(c, ShardDispatcher) for c in self._consumers)
        dispatcher = ShardDispatcher(
            self._connection, layout.name, layout.work_queues, self.options.concurrency, self._held_by(layout),
            self._inflight, may_take=lambda: not self._stop.is_set() and not self._gate.suspect_pending,
            quorum=layout.queue_type == "quorum", consumer_timeout=self._consumer_timeouts.get(layout.name),
            safe_url=self.settings.safe_url,
            lookahead=1 if first else 0,  # one look-ahead delivery per worker (README "Tenant fairness")
            hand_back=self._held_by(layout, hand_back=True),
        )  # fmt: skip
        await self._started(dispatcher)

    async def _beat(self) -> None:
        while True:
            self.heartbeat_at = time.monotonic()
            await asyncio.sleep(1.0)

    def request_stop(self) -> None:
        """Ask the worker to stop taking deliveries and drain (safe from signal handlers)."""
        self._stop.set()

    async def run(self, *, own_process: bool = False) -> int:
        """Start, consume until :meth:`request_stop`, then drain and close (:meth:`shutdown`).

        Args:
            own_process: The process's whole life (``consume`` and each ``--processes`` child): :meth:`shutdown`.

        Returns:
            0 when every in-flight handler finished and was acked within the grace period,
            1 when some had to be abandoned (their deliveries return to the queue).

        A stop requested while still starting (connecting, declaring, checking) gives the
        start up: ``worker stopped while starting: no delivery was taken; exit 0``.

        Raises:
            The errors of :meth:`start` (what was opened is closed first); BrokerError after the drain: .hard_closes.
        """
        self._own_process = own_process
        try:
            started = await start_unless_stopped(self.start(), self._stop)
        except Exception:
            await self.shutdown(own_process=own_process, start_failed=True)
            raise
        if not started:
            code = await self.shutdown(own_process=own_process)
            if not self.took_deliveries:  # else the stop's own lines said it
                log.info("worker stopped while starting: no delivery was taken; exit %d", code)
            return code
        await self._stop.wait()
        return self._hard.after_stop(await self.shutdown(own_process=own_process))  # raises why a hard close stopped it
