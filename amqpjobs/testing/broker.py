"""``TestBroker``: run an app's jobs, retries, quarantine, replay and cron ticks in memory, on a virtual clock.

The decisions are the production code's: each delivery goes through the worker's
per-delivery path (:meth:`amqpjobs.runtime.worker.Worker.handle`: decode, validate, run
the handler within its real timeout, retry through the tiers or quarantine with
evidence, ack), replay through :func:`amqpjobs.runtime.replay.replay_move`, cron
ticks through :class:`amqpjobs.runtime.scheduler.Scheduler` (election, tick plan, tick
transaction). Only the broker is replaced (:mod:`.memory`, :mod:`.election`). What that
changes is listed in the README, "Testing your jobs".
"""

from __future__ import annotations

import asyncio
import itertools
import shutil
import tempfile
import weakref
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import Any

from amqpjobs.durations import parse_duration
from amqpjobs.errors import ConfigurationError
from amqpjobs.jobs.evidence import WORKER_HEADROOM
from amqpjobs.jobs.outcome import Ack, Outcome
from amqpjobs.message import CONTENT_TYPE, OutgoingMessage
from amqpjobs.runtime.app import App
from amqpjobs.runtime.ledger import Ledger, SqliteLedger
from amqpjobs.runtime.scheduler import Scheduler, SchedulerOptions, TickEvent
from amqpjobs.runtime.store_args import store_argument
from amqpjobs.runtime.worker import Worker, WorkerOptions
from amqpjobs.testing.clock import VirtualClock
from amqpjobs.testing.election import MemoryConnection, MemoryTicks
from amqpjobs.testing.memory import MemoryBroker, MemoryDelivery, MemoryPublisher
from amqpjobs.testing.quarantine_view import QuarantineView
from amqpjobs.testing.records import Processed
from amqpjobs.topology.versions import checked_version
from amqpjobs.wire.limits import DEFAULT_FRAME_MAX, checked_frame_max
from amqpjobs.wire.settings import BrokerSettings

#: Settings the worker and scheduler are built with; nothing connects to them.
_NOWHERE = BrokerSettings("amqp://in-memory/", "http://in-memory", "guest", "", "/")
#: The TestBroker open on each app (one at a time: the app has one publisher to route).
_OPEN: weakref.WeakKeyDictionary[App, TestBroker] = weakref.WeakKeyDictionary()


class TestBroker(QuarantineView):
    """Run ``app``'s jobs against an in-memory broker: ``async with TestBroker(app) as broker: ...``.

    While open, ``app.enqueue`` (from tests and from handlers) publishes into it. Nothing
    runs until :meth:`drain` or :meth:`advance`; handlers then run one delivery at a time,
    in the order a single worker slot would take them.

    Args:
        app: The application (its topology, read from its files or object, is declared in memory).
        start: The virtual clock's first reading (aware; default the real time now).
        queues: Job queues the worker consumes (default every job queue of the app's jobs).
        scheduler: Start a scheduler replica when the app has ``@app.cron`` schedules.
        max_deliveries: One :meth:`drain` or :meth:`advance` call raises ``RuntimeError``
            rather than take more than this many deliveries (a job that enqueues itself
            forever); the next delivery stays in its queue, and each call counts afresh.
        ledger: The idempotency ledger while open (the app's own comes back on close).
            Default: when the app has ``idempotent=True`` jobs, a fresh
            :class:`~amqpjobs.runtime.ledger.SqliteLedger` in a temporary directory, so
            no run sees another's done-markers. Pass ``ledger=app.ledger`` to keep the app's.
        frame_max: The ``frame_max`` in bytes every publish must fit, as a connection's
            (default RabbitMQ's, 131072; 0: no limit). ``enqueue`` leaves the worker's
            headroom of it free (:data:`~amqpjobs.jobs.evidence.WORKER_HEADROOM`: jobs whose
            headers and properties take over 110592 bytes by default raise
            ``MessageTooLargeError``), and refuses a body over ``app.max_message_size`` when
            that is set, as on a broker.
        broker_version: The RabbitMQ version to behave as, e.g. ``(3, 13, 7)``: ``enqueue``
            (the sync publisher's too) and the worker's start refuse what a broker of that
            version would (a priority for a quorum job queue before 4.0, ``max_priority`` on
            one or ``shard_routing = "modulus-hash"`` before 4.3), with the same messages.
            Default None: the newest broker's behaviour (nothing refused for its version).

    Raises:
        ConfigurationError: ``broker_version`` is no version (a tuple of whole numbers >= 0), a
            ``frame_max`` no broker has, ``max_deliveries`` below 1;
            on enter, what a worker's start would refuse (a job queue missing from the
            topology, one ``broker_version`` can't serve ...); another TestBroker open on the same app.

    """

    __test__ = False  # not a pytest test class

    def __init__(
        self,
        app: App,
        *,
        start: datetime | None = None,
        queues: Sequence[str] | None = None,
        scheduler: bool = True,
        max_deliveries: int = 10_000,
        ledger: Ledger | None = None,
        frame_max: int = DEFAULT_FRAME_MAX,
        broker_version: tuple[int, ...] | None = None,
    ) -> None:
        #: The RabbitMQ version the double behaves as (None: the newest).
        self.broker_version = None if broker_version is None else checked_version(broker_version, "TestBroker")
        if self.broker_version is not None and self.broker_version[0] < 3:
            raise ConfigurationError(
                f"TestBroker(broker_version={broker_version!r}): RabbitMQ 3 or later, e.g. (3, 13, 7)"
            )
        if type(max_deliveries) is not int or max_deliveries < 1:
            raise ConfigurationError(f"TestBroker(max_deliveries={max_deliveries!r}): a whole number of at least 1")
        if start is not None and (not isinstance(start, datetime) or start.tzinfo is None):
            raise ConfigurationError(
                f"TestBroker(start={start!r}): an aware datetime, e.g. datetime(2026, 1, 1, tzinfo=UTC), or None (now)"
            )
        store_argument("ledger", ledger, "TestBroker")  # None: a fresh SQLite ledger of the double's own
        self.app = app
        self.clock = VirtualClock(start)
        self.memory = MemoryBroker(self.clock, checked_frame_max(frame_max, "TestBroker"), self.broker_version)
        #: What the worker publishes through (its copies), and a test's raw publishes: no reserve, as the worker's.
        self.publisher = MemoryPublisher(self.memory)
        #: What ``app.enqueue`` publishes through: it leaves the worker's headroom, as the app's own publisher does.
        self.enqueue_publisher = MemoryPublisher(self.memory, header_reserve=WORKER_HEADROOM)
        self.tick_wire = MemoryTicks(self.memory)
        #: The app's connection in the double: the overlap guard's running markers are held on it.
        self.marker_connection = MemoryConnection("app")
        self.outcomes: list[Outcome] = []
        self.processed: list[Processed] = []
        #: What the scheduler's leader did about each tick (:class:`~amqpjobs.runtime.scheduler.TickEvent`).
        self.ticks: list[TickEvent] = []
        self.schedulers: list[Scheduler] = []
        self.worker = Worker(app, _NOWHERE, WorkerOptions(queues=tuple(queues) if queues else None),
                             on_outcome=self.outcomes.append)  # fmt: skip
        self._want_scheduler = scheduler
        self._max = max_deliveries
        self._delivered = 0
        self._names = itertools.count(1)
        self._previous: Any = None
        self._ledger = ledger
        self._apps_ledger: Ledger | None = None
        self._temp: Path | None = None
        self._entered = False

    async def __aenter__(self) -> TestBroker:
        app = self.app
        other = _OPEN.get(app)
        if other is not None:
            raise ConfigurationError(
                f"app {app.name!r} already has an open TestBroker; close it first (one TestBroker per app at a "
                "time: the app routes its enqueues to one)"
            )
        self.memory.apply(app.topology().declarations())
        _OPEN[app] = self
        self._entered = True
        self.enqueue_publisher.max_message_size = app.max_message_size
        self._previous = app.use_publisher(
            self.enqueue_publisher, loop=asyncio.get_running_loop(), broker_version=self.broker_version
        )
        app.use_markers(self.tick_wire, self.marker_connection)
        self._apps_ledger = app.ledger
        if self._ledger is None and any(j.idempotent for j in app):
            self._temp = Path(tempfile.mkdtemp(prefix="amqpjobs-test-ledger-"))
            self._ledger = SqliteLedger(self._temp / "ledger.sqlite3")
        if self._ledger is not None:
            app.ledger = self._ledger
        try:
            await self.worker.start_on(self.publisher, self.broker_version)
            if self._want_scheduler and self.app.schedules():
                await self.add_scheduler()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop the scheduler replicas and the handler threads; ``app.enqueue`` goes to its broker again."""
        if not self._entered:
            return
        for replica in self.schedulers:
            await replica.shutdown(grace=1.0)
        self.app.use_publisher(self._previous)
        self.app.use_markers(None)
        await self.worker.shutdown()
        self.app.ledger = self._apps_ledger
        if self._temp is not None and self._ledger is not None:
            await self._ledger.close()
            shutil.rmtree(self._temp, ignore_errors=True)
            self._temp = self._ledger = None
        _OPEN.pop(self.app, None)
        self._entered = False
        self._closed = True

    # ------------------------------------------------------------------ running
    async def drain(self) -> list[Processed]:
        """Run every job until nothing is left, moving the clock to each retry as its tier comes due.

        Cron ticks that fall due while the clock moves fire too; the clock never moves
        just for a tick (use :meth:`advance`).

        Returns:
            What was processed in this call, in order.

        Raises:
            RuntimeError: it would take more than ``max_deliveries`` deliveries (the next
                stays in its queue).

        """
        self._still_open()
        first = len(self.processed)
        self._delivered = 0
        await self._look()
        while True:
            await self._run_ready()
            due = self.memory.next_expiry()
            if due is None:
                break
            await self._step_to(min(due, self._next_tick() or due))
        await self._settle_results()
        return self.processed[first:]

    async def advance(self, by: float | str | timedelta) -> list[Processed]:
        """Move the clock ``by`` (seconds, ``"1h"``, a timedelta), running what falls due on the way.

        Cron ticks fire at their times, retries come back at theirs, and every job ready
        meanwhile runs, as a running scheduler and worker would do.

        Returns:
            What was processed in this call, in order.

        """
        self._still_open()
        seconds = by.total_seconds() if isinstance(by, timedelta) else parse_duration(by)
        if seconds < 0:
            raise ValueError(f"the virtual clock only moves forward (got {by!r})")
        first = len(self.processed)
        self._delivered = 0
        target = self.clock.seconds + seconds
        await self._look()
        while True:
            await self._run_ready()
            due = [t for t in (self.memory.next_expiry(), self._next_tick()) if t is not None]
            if not due or min(due) > target:
                break
            await self._step_to(min(due))
        await self._step_to(target)
        await self._run_ready()
        await self._settle_results()
        return self.processed[first:]

    async def _settle_results(self) -> None:
        """Let the results store's writers (the worker's, the app's ``queued`` one) write what the runs noted."""
        if self.worker._results is not None:  # the worker's own writer: records of runs and outcomes
            await self.worker._results.settle()
        await self.app.settle_queued()

    async def _step_to(self, when: float) -> None:
        self.clock.move_to(when)
        self.memory.expire()
        await self._look()

    def _next_tick(self) -> float | None:
        """Virtual seconds of the next cron tick after now, when a replica leads."""
        if not any(r.is_leader for r in self.schedulers):
            return None
        now = self.clock.now()
        times = [s.rule.next_after(now).timestamp() for s in self.app.schedules()]
        return min(times) if times else None

    async def _look(self) -> None:
        await self.tick_wire.settle()
        for replica in self.schedulers:
            await replica.look_now()

    async def _run_ready(self) -> None:
        """Take from every consumed work queue in turn until all are empty."""
        layouts = [self.app.topology().layout(name) for name in self.worker.job_queues()]
        while True:
            took = False
            for layout in layouts:
                for work_queue in layout.work_queues:
                    if self.memory.queue(work_queue).messages and self._delivered >= self._max:
                        raise RuntimeError(
                            f"more than {self._max} deliveries: a job that enqueues or retries itself forever? "
                            "(TestBroker(max_deliveries=...); the next delivery was left in its queue)"
                        )
                    delivery = MemoryDelivery.take(self.memory, work_queue)
                    if delivery is not None:
                        took = True
                        await self._process(layout.name, delivery)
            if not took:
                return

    async def _process(self, job_queue: str, delivery: MemoryDelivery) -> None:
        self._delivered += 1
        seen = len(self.outcomes)
        try:
            await self.worker.handle(job_queue, delivery)
        except BaseException:
            # a KeyboardInterrupt that may be a real Ctrl-C, a cancellation of the run: on RabbitMQ the
            # unacked delivery returns when the worker's connection closes; here it goes back at once, redelivered
            if not delivery.settled:
                await delivery.requeue()
            raise
        await asyncio.sleep(0)  # the worker records the outcome on the loop's next turn
        for outcome in self.outcomes[seen:]:
            self.processed.append(Processed(outcome, delivery.queue, delivery.headers, delivery.body))

    async def publish_raw(
        self,
        exchange: str,
        routing_key: str,
        body: bytes | bytearray,
        *,
        headers: Mapping[str, Any] | None = None,
        content_type: str | None = CONTENT_TYPE,
        message_id: str | None = None,
        type: str | None = None,
        priority: int | None = None,
    ) -> None:
        """Publish bytes as another producer might (invalid JSON, non-UTF-8, an unknown ``type`` ...).

        No validation of ours: ``body`` and the properties go as given, for testing how the
        worker treats what :meth:`App.enqueue` would refuse to send; only what any AMQP
        publish can't carry is refused, as on a broker. Run it with :meth:`drain`.

        Args:
            exchange: Exchange name (``""``: the default exchange, ``routing_key`` a queue).
            routing_key: Routing key (a job queue's is its name unless the topology says otherwise).
            body: The raw body.
            headers: Header table (e.g. ``amqpjobs-tenant``).
            content_type: ``content_type`` property (default ``application/json``; None: none).
            message_id: ``message_id`` (the job id).
            type: ``type`` (the job name).
            priority: ``priority`` (None: none, which a 4.3 quorum queue counts as 4).

        Raises:
            UnroutableError: no queue is bound for it (as with a ``mandatory`` publish).
            MessageTooLargeError: its properties are over the double's ``frame_max``.
            ConfigurationError: a header value AMQP can't carry (a set, a date ...).
            TypeError: ``body`` is not bytes.
            ConfigurationError: the TestBroker was closed.

        """
        self._still_open()
        if not isinstance(body, bytes | bytearray):  # a str would reach the handler as no broker delivers it
            raise TypeError(f"publish_raw() body must be bytes (what AMQP carries), not {body.__class__.__name__}")
        message = OutgoingMessage(body=bytes(body), headers=dict(headers or {}), content_type=content_type,
                                  message_id=message_id, type=type, priority=priority)  # fmt: skip
        await self.publisher.publish(exchange, routing_key, message)

    # ------------------------------------------------------------------ looking
    def completed(self, job: str | None = None) -> list[Processed]:
        """The jobs that succeeded (their last delivery was acked done), optionally of job ``job`` only.

        Raises:
            ConfigurationError: the app has no job ``job`` (a typo would otherwise read as "none ran").

        """
        if job is not None:
            self.app.resolve(job)
        return [p for p in self.processed if isinstance(p.outcome.decision, Ack) and job in (None, p.job)]

    # ------------------------------------------------------------------ scheduler replicas
    async def add_scheduler(self, name: str | None = None) -> Scheduler:
        """Start one more scheduler replica (the first to join leads; the next takes over when it stops)."""
        replica = Scheduler(self.app, _NOWHERE, SchedulerOptions(reoffer=3600.0, max_sleep=3600.0),
                            on_event=self.ticks.append)  # fmt: skip
        replica.replica = name or f"test-scheduler-{next(self._names)}"
        replica.reread_after = 0.0
        await replica.start_on(self.tick_wire, MemoryConnection(replica.replica), MemoryPublisher(self.memory),
                               self.clock.now)  # fmt: skip
        self.schedulers.append(replica)
        await self._look()
        return replica

    def leader(self) -> Scheduler | None:
        """The replica that leads now, if any."""
        return next((r for r in self.schedulers if r.is_leader), None)

    async def stop_scheduler(self, replica: Scheduler, *, crash: bool = False) -> None:
        """Stop a replica: a clean shutdown, or (``crash``) its connection dies first, as under ``kill -9``.

        Raises:
            ConfigurationError: ``replica`` is not one of :attr:`schedulers` (stopped already, or not a replica).
        """
        if not any(replica is r for r in self.schedulers):
            raise ConfigurationError(
                f"stop_scheduler({replica!r:.80}): not a running scheduler replica of this TestBroker (stopped "
                f"already, or not one); its replicas: {[r.replica for r in self.schedulers]}"
            )
        if crash:
            await replica._connection.close()
        await replica.shutdown(grace=1.0)
        self.schedulers.remove(replica)
        await self._look()
