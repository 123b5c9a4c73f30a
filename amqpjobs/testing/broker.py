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
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any

from amqpjobs.durations import parse_duration
from amqpjobs.jobs import quarantine as q
from amqpjobs.jobs.outcome import Ack, Outcome
from amqpjobs.jobs.quarantine import ReplayOptions
from amqpjobs.runtime.app import App
from amqpjobs.runtime.replay import replay_move
from amqpjobs.runtime.scheduler import Scheduler, SchedulerOptions, TickEvent
from amqpjobs.runtime.worker import Worker, WorkerOptions
from amqpjobs.testing.clock import VirtualClock
from amqpjobs.testing.election import MemoryConnection, MemoryTicks
from amqpjobs.testing.memory import MemoryBroker, MemoryDelivery, MemoryPublisher
from amqpjobs.topology.naming import QUARANTINE_SUFFIX
from amqpjobs.wire.settings import BrokerSettings

#: Settings the worker and scheduler are built with; nothing connects to them.
_NOWHERE = BrokerSettings("amqp://in-memory/", "http://in-memory", "guest", "", "/")


def _payload(body: bytes) -> Any:
    try:
        return json.loads(body.decode("utf-8-sig"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None


@dataclass(frozen=True)
class Processed:
    """One delivery the worker decided about.

    Attributes:
        outcome: The worker's :class:`~amqpjobs.jobs.outcome.Outcome` (decision, attempt, failure ...).
        queue: The work queue it came from.
        headers: Its headers as delivered (attempt, tenant, cron headers ...).
        body: Its raw body.

    """

    outcome: Outcome
    queue: str
    headers: dict[str, Any]
    body: bytes

    @property
    def job(self) -> str:
        """The job's name (empty when the delivery named none)."""
        return self.outcome.job

    @property
    def job_id(self) -> str:
        """The job id."""
        return self.outcome.job_id

    @property
    def attempt(self) -> int:
        """The attempt it was (1 first)."""
        return self.outcome.attempt

    @property
    def kind(self) -> str:
        """``succeeded``, ``retried``, ``quarantined``, ``duplicate`` ... (:attr:`Outcome.kind`)."""
        return self.outcome.kind

    @property
    def payload(self) -> Any:
        """The body as JSON (None when it is not JSON)."""
        return _payload(self.body)


@dataclass(frozen=True)
class QuarantinedMessage:
    """A message resting in a quarantine queue (left there by :meth:`TestBroker.quarantine`).

    Attributes:
        headers: All its headers, evidence included (``amqpjobs-reason``, ``amqpjobs-error-type`` ...).
        body: Raw body. message_id / type: its properties.

    """

    headers: dict[str, Any]
    body: bytes
    message_id: str | None
    type: str | None
    info: q.QuarantinedJob = field(repr=False)

    @property
    def reason(self) -> str:
        """The quarantine reason (``exhausted``, ``rejected``, ``invalid-payload`` ...)."""
        return self.info.reason

    @property
    def payload(self) -> Any:
        """The body as JSON (None when it is not JSON)."""
        return _payload(self.body)


class TestBroker:
    """Run ``app``'s jobs against an in-memory broker: ``async with TestBroker(app) as broker: ...``.

    While open, ``app.enqueue`` (from tests and from handlers) publishes into it. Nothing
    runs until :meth:`drain` or :meth:`advance`; handlers then run one delivery at a time,
    in the order a single worker slot would take them.

    Args:
        app: The application (its topology, read from its files or object, is declared in memory).
        start: The virtual clock's first reading (aware; default the real time now).
        queues: Job queues the worker consumes (default every job queue of the app's jobs).
        scheduler: Start a scheduler replica when the app has ``@app.cron`` schedules.
        max_deliveries: :meth:`drain` or :meth:`advance` raise ``RuntimeError`` after this
            many deliveries (a job that enqueues itself forever).

    Raises:
        ConfigurationError: on enter, what a worker's start would refuse (a job queue
            missing from the topology, an idempotent job without a ledger ...).

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
    ) -> None:
        self.app = app
        self.clock = VirtualClock(start)
        self.memory = MemoryBroker(self.clock)
        self.publisher = MemoryPublisher(self.memory)
        self.tick_wire = MemoryTicks(self.memory)
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

    async def __aenter__(self) -> TestBroker:
        self.memory.apply(self.app.topology().declarations())
        self._previous = self.app.use_publisher(self.publisher)
        try:
            await self.worker.start_on(self.publisher)
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
        for replica in self.schedulers:
            await replica.shutdown(grace=1.0)
        self.app.use_publisher(self._previous)
        await self.worker.shutdown()

    # ------------------------------------------------------------------ running
    async def drain(self) -> list[Processed]:
        """Run every job until nothing is left, moving the clock to each retry as its tier comes due.

        Cron ticks that fall due while the clock moves fire too; the clock never moves
        just for a tick (use :meth:`advance`).

        Returns:
            What was processed in this call, in order.

        Raises:
            RuntimeError: more than ``max_deliveries`` deliveries in all.

        """
        first = len(self.processed)
        await self._look()
        while True:
            await self._run_ready()
            due = self.memory.next_expiry()
            if due is None:
                break
            await self._step_to(min(due, self._next_tick() or due))
        return self.processed[first:]

    async def advance(self, by: float | str | timedelta) -> list[Processed]:
        """Move the clock ``by`` (seconds, ``"1h"``, a timedelta), running what falls due on the way.

        Cron ticks fire at their times, retries come back at theirs, and every job ready
        meanwhile runs, as a running scheduler and worker would do.

        Returns:
            What was processed in this call, in order.

        """
        seconds = by.total_seconds() if isinstance(by, timedelta) else parse_duration(by)
        if seconds < 0:
            raise ValueError(f"the virtual clock only moves forward (got {by!r})")
        first = len(self.processed)
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
        return self.processed[first:]

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
                    delivery = MemoryDelivery.take(self.memory, work_queue)
                    if delivery is not None:
                        took = True
                        await self._process(layout.name, delivery)
            if not took:
                return

    async def _process(self, job_queue: str, delivery: MemoryDelivery) -> None:
        self._delivered += 1
        if self._delivered > self._max:
            raise RuntimeError(
                f"more than {self._max} deliveries: a job that enqueues or retries itself forever? "
                "(TestBroker(max_deliveries=...))"
            )
        seen = len(self.outcomes)
        await self.worker.handle(job_queue, delivery)
        await asyncio.sleep(0)  # the worker records the outcome on the loop's next turn
        for outcome in self.outcomes[seen:]:
            self.processed.append(Processed(outcome, delivery.queue, delivery.headers, delivery.body))

    # ------------------------------------------------------------------ looking
    def completed(self, job: str | None = None) -> list[Processed]:
        """The jobs that succeeded (their last delivery was acked done), optionally of job ``job`` only."""
        return [p for p in self.processed if isinstance(p.outcome.decision, Ack) and job in (None, p.job)]

    def _quarantine_queue(self, name: str) -> str:
        return name if name.endswith(QUARANTINE_SUFFIX) else self.app.topology().layout(name).quarantine_queue

    def quarantine(self, job_queue: str) -> list[QuarantinedMessage]:
        """The messages in ``job_queue``'s quarantine (a job queue or quarantine queue name), oldest first."""
        out = []
        for stored in self.memory.queue(self._quarantine_queue(job_queue)).messages:
            m = stored.message
            headers = dict(m.headers)
            info = q.describe(headers, m.message_id, m.type)
            out.append(QuarantinedMessage(headers, m.body, m.message_id, m.type, info))
        return out

    def messages(self, queue: str) -> list[dict[str, Any]]:
        """Headers of the messages waiting in any queue (a work or tier queue ...), oldest first."""
        return [dict(s.message.headers) for s in self.memory.queue(queue).messages]

    async def replay(self, job_queue: str, options: ReplayOptions | None = None) -> int:
        """Move quarantined messages back to their work queues as ``amqpjobs quarantine replay`` does.

        No rate limit applies; the messages left out stay in order. Run them with :meth:`drain`.

        Returns:
            How many were moved.

        """
        options = options or ReplayOptions()
        source = self._quarantine_queue(job_queue)
        run = f"test-replay-{next(self._names)}"
        moved, kept = 0, []
        for _ in range(len(self.memory.queue(source).messages)):
            delivery = MemoryDelivery.take(self.memory, source)
            assert delivery is not None
            full = options.limit is not None and moved >= options.limit
            planned = None if full else replay_move(delivery, options, run)
            if planned is None or options.dry_run:
                kept.append(delivery.stored)
                moved += planned is not None
                continue
            await self.publisher.publish("", planned.target, planned.copy)
            await delivery.ack()
            moved += 1
        self.memory.queue(source).messages[:0] = kept
        return moved

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
        """Stop a replica: a clean shutdown, or (``crash``) its connection dies first, as under ``kill -9``."""
        if crash:
            await replica._connection.close()
        await replica.shutdown(grace=1.0)
        self.schedulers.remove(replica)
        await self._look()
