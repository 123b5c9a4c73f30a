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
import contextlib
import logging
import os
import socket
import sys
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_fixed

from amqpjobs._version import __version__
from amqpjobs.errors import AmqpJobsError, BrokerError, ConfigurationError, DuplicateJobError
from amqpjobs.jobs import crash, envelope
from amqpjobs.jobs.evidence import Failure, delivery_counters, evidence_headers
from amqpjobs.jobs.isolation import IsolationGate
from amqpjobs.jobs.outcome import (
    Ack,
    Decision,
    Duplicate,
    HandBack,
    Quarantine,
    Register,
    Reject,
    Retry,
    RetryLater,
)
from amqpjobs.jobs.quarantine import header_text
from amqpjobs.jobs.registry import JobContext, JobDef
from amqpjobs.jobs.retry import FailureKind, decide
from amqpjobs.runtime.app import App
from amqpjobs.runtime.broker_rules import check_layouts, consumer_timeouts
from amqpjobs.runtime.dispatch import ShardDispatcher
from amqpjobs.runtime.holding import BrokerObject, Holding, broker_probe, needs_of
from amqpjobs.runtime.ledger import Claim, Ledger
from amqpjobs.runtime.metrics import MetricsServer, WorkerMetrics
from amqpjobs.runtime.signals import stop_on_signals
from amqpjobs.runtime.sources import Source
from amqpjobs.runtime.stall import StallWatch
from amqpjobs.topology.models import JobQueueLayout
from amqpjobs.topology.versions import nack_is_free
from amqpjobs.wire.abc import Connection
from amqpjobs.wire.connection import broker_info, connect, heartbeat_timeout
from amqpjobs.wire.consume import DeliveryHandler, WorkQueueConsumer
from amqpjobs.wire.declare import missing_objects
from amqpjobs.wire.delivery import Delivery, DeliveryChannelClosed
from amqpjobs.wire.fetch import QueueFetcher
from amqpjobs.wire.publish import ConfirmedPublisher
from amqpjobs.wire.settings import BrokerSettings

log = logging.getLogger("amqpjobs.worker")

#: Seconds the event loop may go without a heartbeat before /readyz says not ready.
STUCK_AFTER = 3.0
#: Seconds between looks at a job queue's suspects queue.
SUSPECTS_POLL = 1.0
#: Seconds between looks at a suspects queue found missing.
HOLD_PROBE = 5.0
#: Seconds a worker spends at most running suspects before it consumes again (one at least).
SUSPECTS_TURN = 10.0

#: RabbitMQ's default delivery acknowledgement timeout (``consumer_timeout``), 30 minutes.
DEFAULT_CONSUMER_TIMEOUT = 1800.0


def default_timeout(consumer_timeout: float) -> float:
    """The timeout of a job that sets none: just below the broker's ``consumer_timeout`` (seconds).

    5% (at least 1 s, at most half) below it, so an async handler fails as ``timeout``
    before the broker closes the channel and redelivers (RabbitMQ "Delivery Acknowledgement
    Timeout"): 1710 s for the default 30 min, 4 s for 5 s.
    """
    return consumer_timeout - min(max(1.0, consumer_timeout * 0.05), consumer_timeout / 2)


@dataclass(frozen=True)
class WorkerOptions:
    """How a worker runs.

    Attributes:
        queues: Job queue names to consume; None = every job queue the app's jobs use.
        concurrency: Slots per job queue: an unsharded work queue gets one consumer with
            ``prefetch_count`` = this (one unacked delivery per slot); a sharded job queue's
            shards share this many slots, round-robin, holding no more unacked deliveries
            than that together (:mod:`amqpjobs.runtime.dispatch`).
        grace: Seconds in-flight handlers get to finish after SIGTERM/SIGINT.
        consumer_timeout: The broker's delivery acknowledgement timeout in seconds (RabbitMQ
            ``consumer_timeout``, default 30 min); a job timeout above it is warned about.

    """

    queues: tuple[str, ...] | None = None
    concurrency: int = 1
    grace: float = 30.0
    consumer_timeout: float = DEFAULT_CONSUMER_TIMEOUT


@dataclass(slots=True)
class Outcome:
    """What happened to one delivery (for logs, stats and tests).

    Attributes:
        decision: Ack, RetryLater or Quarantine.
        job: Job name ("" when unknown).
        job_id: Job id.
        attempt: Attempt number of the delivery.
        duration: Seconds the handler ran (0 when it did not run).
        acked: Whether the delivery was acked (False: left for redelivery or rejected).
        queue: The job queue the delivery came from.
        latency: Seconds from enqueue to this start, for a first attempt that ran; else None.
        timed_out: Whether the handler run hit its timeout.
        error: ``"<type>: <message>"`` (first 300 characters) of the failure, or "".
        uncertain: The handler succeeded but its ack may not have reached the broker (the
            event loop stalled past the heartbeat timeout during the run, or the channel
            closed before the ack went out): the broker may run it again.

    """

    decision: Decision
    job: str
    job_id: str
    attempt: int
    duration: float
    acked: bool
    queue: str = ""
    latency: float | None = None
    timed_out: bool = False
    error: str = ""
    uncertain: bool = False

    @property
    def kind(self) -> str:
        """What happened, as one word.

        ``succeeded``, ``retried``, ``deferred`` (waited for a claim), ``duplicate``,
        ``quarantined``, ``ack_uncertain`` (succeeded, ack maybe lost), ``redelivered``
        (came back without an outcome: registered for its next start), ``handed_back`` (not
        started while a suspect ran alone), or ``abandoned`` when not acked.
        """
        if self.uncertain:
            return "ack_uncertain"
        if not self.acked:
            return "abandoned"
        d = self.decision
        if isinstance(d, Register):
            return "redelivered"
        if isinstance(d, HandBack):
            return "handed_back"
        if isinstance(d, Duplicate):
            return "duplicate"
        if isinstance(d, RetryLater) and d.wait:
            return "deferred"
        return "succeeded" if isinstance(d, Ack) else "retried" if isinstance(d, RetryLater) else "quarantined"


@dataclass(slots=True)
class _Verdict:
    """The worker's verdict on one delivery, before it is carried out."""

    decision: Decision
    error: tuple[str, str, str]  # error type, message, traceback ("" when none)
    job: JobDef | None
    attempt: int
    job_id: str
    ran: bool  # whether the handler ran on this delivery
    duration: float = 0.0  # seconds the handler ran
    latency: float | None = None  # enqueue -> start, first attempts only
    timed_out: bool = False
    started: float = 0.0  # monotonic time the handler started (when it ran)


_NO_ERROR = ("", "", "")


def _now_iso() -> str:
    return envelope.iso_utc(time.time())


def _qualname(exc: BaseException) -> str:
    cls = type(exc)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


class Worker:
    """Consumes an app's job queues until stopped.

    Args:
        app: The application whose jobs run here.
        settings: Broker settings.
        options: Worker options.
        on_outcome: Optional callback called with each :class:`Outcome` (tests, metrics).
        metrics: Prometheus metrics to record into (see :mod:`amqpjobs.runtime.metrics`).

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
        self._on_outcome = on_outcome
        self._stop = asyncio.Event()
        self._connection: Connection | None = None
        self._publisher: ConfirmedPublisher | None = None  # tier and suspects copies: default exchange
        self._quarantiner: ConfirmedPublisher | None = None  # to quarantine exchanges, which may be missing
        self._consumers: list[Source] = []  # a consumer per unsharded work queue, a dispatcher per sharded job queue
        self._inflight: set[asyncio.Task[Any]] = set()
        self._executor: ThreadPoolExecutor | None = None
        self._layouts: dict[str, JobQueueLayout] = {}
        self._host = socket.gethostname()
        self._pid = os.getpid()
        self.ready = asyncio.Event()
        self.metrics = metrics
        self.heartbeat_at = time.monotonic()
        self._heartbeat_task: asyncio.Task[None] | None = None
        self._prune_task: asyncio.Task[None] | None = None
        self._gate = IsolationGate()
        self._held = 0  # deliveries in the handler and not yet settled (running, handing back)
        self._held_changed = asyncio.Event()
        self._suspects_signal = asyncio.Event()  # a suspect was registered here: look at once
        self._suspect_tasks: list[asyncio.Task[None]] = []
        self._lanes_missing: set[str] = set()  # suspects queues found missing
        self._stalls = StallWatch()
        self._heartbeat_timeout = 0.0
        self._timeouts: dict[str, float] = {}
        self._consumer_timeouts: dict[str, float | None] = {}  # job queue -> x-consumer-timeout (s), set at connect
        self._version: tuple[int, ...] = (0,)  # the broker's, read at connect
        self._holding = Holding(self._probe, self._pause_queue, self._resume_queue, self._held_changed.set)

    # ------------------------------------------------------------------ lifecycle
    def job_queues(self) -> tuple[str, ...]:
        """The job queues this worker consumes."""
        return self.options.queues if self.options.queues else tuple(self.app.queues())

    def _check(self) -> None:
        topology = self.app.topology()
        names = {q.name for q in topology.job_queues}
        for name in self.job_queues():
            if name not in names:
                raise ConfigurationError(f"job queue {name!r} is not in the topology; known: {sorted(names)}")
            self._layouts[name] = topology.layout(name)
        for job in self.app:
            if job.queue not in names:
                raise ConfigurationError(
                    f"job {job.name!r} names job queue {job.queue!r}, which the topology does not declare"
                )
            layout = topology.layout(job.queue)
            attempts = job.retry.attempts_for(layout.tiers)
            if attempts > 1 and not layout.tiers:
                raise ConfigurationError(
                    f"job {job.name!r} allows {attempts} attempts but job queue {job.queue!r} has no "
                    "retry_tiers; add tiers to the topology or set RetryPolicy(max_attempts=1)"
                )
            if job.idempotent:
                self._check_idempotent(job, layout)
            self._timeouts[job.name] = (
                job.timeout if job.timeout is not None else default_timeout(self.options.consumer_timeout)
            )

    def lease_of(self, job: JobDef) -> float:
        """Seconds a claim on ``job`` holds: its ``lease``, else twice its timeout here (at least 60 s)."""
        return job.lease if job.lease is not None else max(60.0, 2 * self._timeouts[job.name])

    def _check_idempotent(self, job: JobDef, layout: JobQueueLayout) -> None:
        ledger = self.app.ledger
        if ledger is None:
            raise ConfigurationError(f"job {job.name!r} is idempotent but the app has no ledger: App(..., ledger=...)")
        if not layout.tiers:
            raise ConfigurationError(
                f"job {job.name!r} is idempotent but job queue {layout.name!r} has no retry_tiers: a delivery whose "
                "job is running elsewhere waits in the first tier"
            )
        attempts = job.retry.attempts_for(layout.tiers)
        window = sum(layout.tiers[min(i, len(layout.tiers) - 1)] for i in range(attempts - 1))
        needed = window + self.app.quarantine_retention
        if ledger.retention < needed:
            raise ConfigurationError(
                f"job {job.name!r}: the ledger keeps done-markers {ledger.retention:g}s, shorter than the retry "
                f"window ({window:g}s) plus the quarantine retention ({self.app.quarantine_retention:g}s) = "
                f"{needed:g}s: a job replayed or retried after its marker was pruned would run its effect again. "
                "Raise the ledger's retention or lower App(quarantine_retention=...)"
            )

    async def _prune_ledger(self) -> None:
        ledger = self.app.ledger
        assert ledger is not None
        while True:
            try:
                removed = await ledger.prune(ledger.retention)
                if removed:
                    log.info("pruned %d done-marker(s) older than %gs from the ledger", removed, ledger.retention)
            except Exception as exc:
                log.warning("pruning the idempotency ledger failed: %s", exc)
            await asyncio.sleep(600)

    async def start(self) -> None:
        """Connect and start consuming. Returns once every slot consumes.

        Raises:
            ConfigurationError: a job queue is missing from the topology, or a job's
                policy can't work with its queue.
            BrokerUnavailableError: the broker can't be reached.
            BrokerError: a work queue does not exist on the broker (apply the topology).

        """
        if self.options.concurrency < 1:
            raise ConfigurationError(f"concurrency must be >= 1 (got {self.options.concurrency})")
        self._check()
        self.app.default_url(self.settings.url)
        slots = sum(len(lay.work_queues) for lay in self._layouts.values()) * self.options.concurrency
        self._executor = ThreadPoolExecutor(max_workers=max(1, slots), thread_name_prefix="amqpjobs-sync")
        needed = [n for lay in self._layouts.values() for w in lay.work_queues for n in lay.tier_queues[w]]
        needed += [q for lay in self._layouts.values() for q in (lay.quarantine_queue, lay.suspects_queue)]
        exchanges = [lay.quarantine_exchange for lay in self._layouts.values()]
        queues, exchanges = (sorted(m) for m in await missing_objects(self.settings, needed, exchanges))
        if queues or exchanges:
            what = " and ".join(f"{k}(s) {', '.join(m)}" for k, m in (("queue", queues), ("exchange", exchanges)) if m)
            raise BrokerError(
                f"{what} do not exist on {self.settings.safe_url}: apply the topology first (amqpjobs topology "
                "apply); without them retries, quarantine and crash containment can't work"
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
        self._publisher = ConfirmedPublisher(self._connection, on_confirm=on_confirm)
        self._quarantiner = ConfirmedPublisher(self._connection, on_confirm=on_confirm, serial=True)
        self._heartbeat_task = asyncio.create_task(self._beat())
        self._heartbeat_timeout = heartbeat_timeout(self._connection)
        self._stalls.start()
        if self.app.ledger is not None and any(j.idempotent for j in self.app):
            opener = getattr(self.app.ledger, "open", None)
            if opener is not None:
                await opener()
            self._prune_task = asyncio.create_task(self._prune_ledger())
        for layout in self._layouts.values():
            if layout.shard_routing_keys:  # its N slots shared fairly among the shards, N deliveries at most
                await self._start_dispatcher(layout)
            else:
                await self._start_consumer(layout, layout.work_queues[0])
            fetcher = QueueFetcher(self._connection, layout.suspects_queue)
            self._suspect_tasks.append(asyncio.create_task(self._watch_suspects(layout, fetcher)))
        log.info(
            "worker consuming %s with %d slot(s) per queue",
            ", ".join(self._layouts), self.options.concurrency,
        )  # fmt: skip
        self.ready.set()

    def _held_by(self, layout: JobQueueLayout) -> DeliveryHandler:
        """The handler of a job queue's deliveries: each counts as held until settled, its task as in flight."""
        inflight = self._inflight

        async def held(delivery: Delivery) -> None:
            task = asyncio.current_task()
            assert task is not None
            inflight.add(task)
            self._held += 1
            try:
                await self._handle(layout, delivery)
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
        self._consumers.append(consumer)
        await consumer.start()

    async def _start_dispatcher(self, layout: JobQueueLayout) -> None:
        """A sharded job queue: N slots for all its shards, taken by turns and leases (:mod:`.dispatch`)."""
        assert self._connection is not None
        first = not any(isinstance(c, ShardDispatcher) for c in self._consumers)
        dispatcher = ShardDispatcher(
            self._connection, layout.name, layout.work_queues, self.options.concurrency, self._held_by(layout),
            self._inflight, may_take=lambda: not self._stop.is_set() and not self._gate.suspect_pending,
            lease=layout.queue_type == "classic", safe_url=self.settings.safe_url,
            lookahead=1 if first else 0,  # one look-ahead delivery per worker (README "Tenant fairness")
        )  # fmt: skip
        self._consumers.append(dispatcher)
        await dispatcher.start()

    async def _beat(self) -> None:
        while True:
            self.heartbeat_at = time.monotonic()
            await asyncio.sleep(1.0)

    def readiness(self) -> tuple[bool, str]:
        """(ready, reason): connected to the broker and consuming every assigned queue.

        Safe to call from another thread (it only reads state).
        """
        if self._stop.is_set():
            return False, "stopping"
        stuck = time.monotonic() - self.heartbeat_at
        if stuck > STUCK_AFTER:  # the loop is blocked: whatever the connection state says, nothing moves
            return False, f"event loop blocked for {stuck:.0f}s"
        connection = self._connection
        if not self.ready.is_set() or connection is None:
            return False, "starting"
        if connection.is_closed or not connection.connected.is_set():
            return False, "not connected to the broker (reconnecting)"
        if self._holding.summary:
            return False, self._holding.summary
        if self._lanes_missing:
            return False, f"suspects queue(s) {', '.join(sorted(self._lanes_missing))} missing (apply the topology)"
        idle = sum(1 for c in self._consumers if not c.consuming and not c.paused)
        if idle:
            return False, f"{idle} of {len(self._consumers)} consumer(s) not consuming (channel closed or cancelled)"
        queues = sorted(c.queue for c in self._consumers)
        slots = len(self._consumers) * self.options.concurrency
        return True, f"consuming {', '.join(queues)} with {slots} slot(s)"

    def request_stop(self) -> None:
        """Ask the worker to stop taking deliveries and drain (safe from signal handlers)."""
        self._stop.set()

    async def run(self) -> int:
        """Start, consume until :meth:`request_stop`, then drain and close.

        Returns:
            0 when every in-flight handler finished and was acked within the grace period,
            1 when some had to be abandoned (their deliveries return to the queue).

        A stop requested while still connecting abandons the start (exit code 0).

        Raises:
            The errors of :meth:`start`; what was opened is closed first.
        """
        starting = asyncio.create_task(self.start())
        stopping = asyncio.create_task(self._stop.wait())
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
            await self.shutdown()
            return 0
        if starting.exception() is not None:
            stopping.cancel()
            await self.shutdown()
            raise starting.exception()  # type: ignore[misc]
        await stopping
        return await self.shutdown()

    async def shutdown(self) -> int:
        """Stop consuming, wait up to ``grace`` seconds for in-flight handlers, close.

        Returns:
            0 when all in-flight work finished, else 1.

        """
        self._stop.set()
        self._stalls.stop()
        self._suspects_signal.set()
        for task in (self._heartbeat_task, self._prune_task):
            if task is not None:
                task.cancel()
        for consumer in self._consumers:
            await consumer.cancel()
        await asyncio.sleep(0)
        code = 0
        pending = set(self._inflight) | {t for t in self._suspect_tasks if not t.done()}  # a suspect may be running
        if self._inflight:
            log.info("draining %d in-flight job(s), grace %.0fs", len(self._inflight), self.options.grace)
        if pending:
            _, still = await asyncio.wait(pending, timeout=self.options.grace)
            if still:
                log.warning("%d job(s) still running after the grace period; they will be redelivered", len(still))
                code = 1
                for task in still:
                    task.cancel()
                await asyncio.wait(still)  # each held delivery's hold ends before the channels close
        await self._holding.close()
        for consumer in self._consumers:
            await consumer.flush_acks()
        for publisher in (self._publisher, self._quarantiner):
            if publisher is not None:
                await publisher.close()
        if self._connection is not None:
            await self._connection.close()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        return code

    async def _probe(self, objects: Collection[BrokerObject]) -> set[BrokerObject]:
        assert self._connection is not None
        return await broker_probe(self._connection)(objects)

    def _sources_of(self, work_queue: str) -> list[Source]:
        """What takes from ``work_queue``: its consumer, or its sharded job queue's dispatcher (all shards)."""
        names = {work_queue} | {
            layout.name
            for layout in self._layouts.values()
            if layout.shard_routing_keys and work_queue in layout.work_queues
        }
        return [c for c in self._consumers if c.queue in names]

    def _holds_any(self, source: Source) -> bool:
        """Whether a delivery of one of the work queues ``source`` takes from is held."""
        layout = self._layouts.get(source.queue)
        queues = layout.work_queues if layout is not None and layout.shard_routing_keys else (source.queue,)
        return any(self._holding.holds(q) for q in queues)

    async def _pause_queue(self, work_queue: str) -> None:
        await asyncio.gather(*(c.pause() for c in self._sources_of(work_queue)))

    async def _resume_queue(self, work_queue: str) -> None:
        if self._stop.is_set() or self._gate.suspect_pending:  # a suspects turn resumes it when it ends
            return
        await asyncio.gather(*(c.resume() for c in self._sources_of(work_queue) if c.paused))

    # ------------------------------------------------------------------ one delivery
    async def _handle(self, layout: JobQueueLayout, delivery: Delivery, alone: bool = False) -> None:
        gauge = self.metrics.in_flight_of(layout.name) if self.metrics is not None else None
        if gauge is not None:
            gauge.inc()
        try:
            await self._handle_delivery(layout, delivery, alone)
        finally:
            if gauge is not None:
                gauge.dec()

    async def _handle_delivery(self, layout: JobQueueLayout, delivery: Delivery, alone: bool) -> None:
        try:
            v = await self._process(layout, delivery, alone)
        except Exception as exc:  # a bug of ours must never wedge a slot with an unacked delivery
            log.exception("processing a delivery from %s failed inside the worker", delivery.queue)
            tb = "".join(traceback.format_exception(exc))
            job_id = delivery.message_id or f"generated-{uuid.uuid4()}"
            v = _Verdict(Quarantine("worker-error"), (_qualname(exc), str(exc), tb), None, 1, job_id, False)
        try:
            acked = await self._carry_out(layout, delivery, v)
        except Exception as exc:
            log.exception("carrying out %s failed inside the worker", v.decision)
            acked = await self._fallback(layout, delivery, v, exc)
        uncertain = False
        if v.ran and isinstance(v.decision, Ack | Duplicate):
            # a run the broker may not have seen finish: its ack was never sent, or sent into a
            # connection the broker had already given up on (no heartbeat during a stall)
            stalled = self._stalls.longest_since(v.started)
            uncertain = not acked or (0 < self._heartbeat_timeout <= stalled)
        job_name = v.job.name if v.job else envelope.job_name_of(delivery.type, delivery.headers)
        outcome = Outcome(
            v.decision, job_name, v.job_id, v.attempt, v.duration, acked,
            layout.name, v.latency, v.timed_out, f"{v.error[0]}: {v.error[1]}"[:300] if v.error[0] else "",
            uncertain,
        )  # fmt: skip
        # logs and metrics on the loop's next turn: the ack queued above reaches the socket first
        # (with one slot, the broker sends the next delivery only once it has the ack)
        asyncio.get_running_loop().call_soon(self._record, outcome)

    def _record(self, outcome: Outcome) -> None:
        d = outcome.decision
        kind = outcome.kind
        self.stats[kind] += 1
        if self.metrics is not None:
            job = outcome.job if outcome.job and self.app.get(outcome.job) else "(unknown)"
            ran = outcome.duration or outcome.latency is not None  # the handler ran (a first attempt: latency)
            self.metrics.observe(
                job, outcome.queue, kind, outcome.duration if ran else None, outcome.latency, outcome.timed_out
            )
        extra = ""
        if isinstance(d, RetryLater):
            extra = f" next_attempt={d.next_attempt} delay={d.delay:g}s"
        elif isinstance(d, Quarantine):
            extra = f" reason={d.reason}"
        if outcome.error:
            extra += f" error={outcome.error}"
        log.info(
            "job=%s id=%s attempt=%d duration=%.3fs outcome=%s%s%s",
            outcome.job or "?", outcome.job_id, outcome.attempt, outcome.duration, kind, extra,
            "" if outcome.acked else " (not acked: the broker will redeliver or dead-letter it)",
        )  # fmt: skip
        if self._on_outcome is not None:
            self._on_outcome(outcome)

    async def _process(self, layout: JobQueueLayout, delivery: Delivery, alone: bool = False) -> _Verdict:
        """Decide about one delivery (runs the handler when the delivery is a job it can run).

        ``alone``: the delivery is a suspect taken while nothing else runs or is held here.
        """
        if self._stop.is_set() and not alone:  # arrived, or got its slot, after SIGTERM: not started,
            # handed back as a copy (a requeue would mark it redelivered: a start, for the crash count)
            job_id = delivery.message_id or f"generated-{uuid.uuid4()}"
            return _Verdict(HandBack(), _NO_ERROR, None, 1, job_id, False)
        attempt = envelope.parse_attempt(delivery.headers.get(envelope.ATTEMPT))
        job_id = delivery.message_id or f"generated-{uuid.uuid4()}"
        if not delivery.message_id:
            log.warning("delivery without message_id on %s: assigned job id %s", delivery.queue, job_id)
        job_name = envelope.job_name_of(delivery.type, delivery.headers)
        job = self.app.get(job_name) if job_name else None
        if job is None or job.queue != layout.name:
            why = (
                "no job name (type property or amqpjobs-job header)"
                if not job_name
                else f"job {job_name[:200]!r} is not served from job queue {layout.name!r} by app {self.app.name!r}"
            )
            return _Verdict(Quarantine("unknown-job"), ("UnknownJob", why, ""), None, attempt, job_id, False)
        try:
            raw = envelope.decode_body(delivery.body, delivery.content_type, delivery.content_encoding)
        except envelope.DecodeError as exc:
            return _Verdict(Quarantine(exc.reason), ("DecodeError", exc.detail, ""), job, attempt, job_id, False)
        try:
            payload = job.validate(raw)
        except ValidationError as exc:
            return _Verdict(
                Quarantine("invalid-payload"), ("pydantic.ValidationError", str(exc), ""), job, attempt, job_id, False
            )
        max_attempts = job.retry.attempts_for(layout.tiers)
        if attempt > max_attempts:
            why = f"attempt header says {attempt}, above max_attempts {max_attempts}"
            return _Verdict(Quarantine("exhausted"), ("AttemptsExhausted", why, ""), job, attempt, job_id, False)
        screening = crash.screen(delivery.redelivered, delivery.headers, layout.max_redeliveries,
                                 nack_is_free(self._version, layout.queue_type))  # fmt: skip
        if screening.action == "crashed":
            return _Verdict(Quarantine("crashed"), self._crash_error(layout, delivery, screening.start), job,
                            attempt, job_id, True)  # fmt: skip
        if screening.action == "register":
            return _Verdict(Register(screening.start), _NO_ERROR, job, attempt, job_id, False)
        run = (layout, delivery, job, payload, attempt, max_attempts, job_id)
        if alone:
            log.warning(
                "job=%s id=%s: start %d of at most %d (earlier starts ended without an outcome); running it "
                "alone on %s pid %d", job.name, job_id, screening.start, layout.max_redeliveries + 1, self._host,
                self._pid,
            )  # fmt: skip
            return await self._start(*run)
        if screening.action == "alone":  # a suspect outside the suspects queue: it waits there for its run
            return _Verdict(Register(screening.start), _NO_ERROR, job, attempt, job_id, False)
        if self._stop.is_set() or not self._gate.try_enter():
            # stopping (a take answered after SIGTERM), or a suspect waits or runs alone here: don't start or hold it
            return _Verdict(HandBack(), _NO_ERROR, job, attempt, job_id, False)
        try:
            return await self._start(*run)
        finally:
            self._gate.leave()

    def _crash_error(self, layout: JobQueueLayout, delivery: Delivery, starts: int) -> tuple[str, str, str]:
        h = delivery.headers
        last = (
            f"; the last start was registered by {header_text(h.get(crash.LAST_START_HOST))} pid "
            f"{header_text(h.get(crash.LAST_START_PID))} at {header_text(h.get(crash.LAST_START_AT))}"
            if crash.LAST_START_HOST in h
            else ""
        )
        why = (
            f"started {starts} time(s) without an outcome (job queue {layout.name!r} allows max_redeliveries "
            f"{layout.max_redeliveries}): each time the worker died or was killed, its event loop was blocked "
            f"past the heartbeat timeout, or its channel or connection closed before the ack{last}"
        )
        return ("WorkerLostError", why, "")

    async def _watch_suspects(self, layout: JobQueueLayout, fetcher: QueueFetcher) -> None:
        """Look for suspects every second (at once after registering one) and run them alone."""
        wait = SUSPECTS_POLL
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._suspects_signal.wait(), wait)
            self._suspects_signal.clear()
            if self._stop.is_set() or self._gate.suspect_pending:
                continue
            try:
                depth = await fetcher.depth()
                if depth is None:  # missing: said once, not ready until it is back, looked at less often
                    if fetcher.queue not in self._lanes_missing:
                        self._lanes_missing.add(fetcher.queue)
                        log.error(
                            "suspects queue %s is missing: jobs that come back without an outcome can't be "
                            "registered; apply the topology (amqpjobs topology apply)", fetcher.queue,
                        )  # fmt: skip
                    wait = HOLD_PROBE
                    continue
                if fetcher.queue in self._lanes_missing:
                    self._lanes_missing.discard(fetcher.queue)
                    log.info("suspects queue %s is back", fetcher.queue)
                wait = SUSPECTS_POLL
                if depth:
                    await self._run_suspects(layout, fetcher)
            except Exception as exc:  # the connection dropped: the next look tries again
                log.warning("running the suspects of %s failed (%s); trying again", layout.name, exc)
        await fetcher.close()

    async def _run_suspects(self, layout: JobQueueLayout, fetcher: QueueFetcher) -> None:
        """Stop consuming, settle everything held, then take suspects one at a time and run each alone."""
        if not self._gate.try_alone():
            return
        try:
            # no new deliveries; what arrives meanwhile (prefetched, or a take answered now) is handed back unstarted
            await asyncio.gather(*(c.pause() for c in self._consumers))
            await self._gate.idle()
            while self._held > self._holding.count:
                self._held_changed.clear()
                await self._held_changed.wait()
            if self._holding.count:
                return
            # the acks of everything settled so far reach the broker before a suspect can crash
            await asyncio.gather(*(c.settle() for c in self._consumers))
            deadline = time.monotonic() + SUSPECTS_TURN
            while not self._stop.is_set() and time.monotonic() < deadline:
                delivery = await fetcher.get()  # its get-ok also settles the previous suspect's ack
                if delivery is None:
                    break
                origin = header_text(delivery.headers.get(crash.WORK_QUEUE))
                delivery.queue = origin if origin in layout.work_queues else layout.work_queues[0]
                await self._handle(layout, delivery, alone=True)
        finally:
            self._gate.release_alone()
            if not self._stop.is_set():
                await asyncio.gather(*(c.resume() for c in self._consumers if not self._holds_any(c)))

    async def _start(
        self,
        layout: JobQueueLayout,
        delivery: Delivery,
        job: JobDef,
        payload: Any,
        attempt: int,
        max_attempts: int,
        job_id: str,
    ) -> _Verdict:
        """Claim (idempotent jobs), build the context and run the handler."""
        ledger = self.app.ledger if job.idempotent else None
        owner = f"{self._host}:{self._pid}:{uuid.uuid4().hex[:12]}" if ledger is not None else ""
        transaction = None
        if ledger is not None:
            try:
                claim = await ledger.claim(job_id, owner, self.lease_of(job))
            except Exception as exc:  # the ledger is down: try again later, without using an attempt
                log.error("job %s id %s: idempotency ledger failed (%s); retrying later", job.name, job_id, exc)
                later = RetryLater(next_attempt=attempt, tier=0, delay=layout.tiers[0], wait=True)
                return _Verdict(later, (_qualname(exc), str(exc), ""), job, attempt, job_id, False)
            if claim is Claim.DONE:
                return _Verdict(Duplicate(), ("", "", ""), job, attempt, job_id, False)
            if claim is Claim.BUSY:  # another live claim runs it now: look again after a tier, not a busy loop
                later = RetryLater(next_attempt=attempt, tier=0, delay=layout.tiers[0], wait=True)
                why = "another worker holds a live claim on this job id"
                return _Verdict(later, ("ClaimBusy", why, ""), job, attempt, job_id, False)

            used = False

            def transaction() -> AbstractContextManager[Any]:
                nonlocal used
                assert ledger is not None
                if used:
                    raise ConfigurationError(
                        f"job {job.name!r}: ctx.transaction() can be used once per run (its commit marks the job "
                        "done); put the whole effect in one transaction"
                    )
                used = True
                return ledger.transaction(job_id, owner)

        ctx = JobContext(
            job=job.name,
            job_id=job_id,
            attempt=attempt,
            max_attempts=max_attempts,
            tenant=envelope.tenant_in(delivery.headers),
            queue=delivery.queue,
            redelivered=delivery.redelivered or crash.STARTS in delivery.headers,
            enqueued_at=envelope.enqueued_at_of(delivery.headers, delivery.timestamp),
            headers=delivery.headers,
            ledger_transaction=transaction,
        )
        latency = None
        if attempt == 1 and ctx.enqueued_at is not None:
            latency = time.time() - ctx.enqueued_at.timestamp()
        started = time.monotonic()
        try:
            await self._run_handler(job, payload, ctx)
        except DuplicateJobError:  # its transaction found the job done by another run: effect rolled back
            took = time.monotonic() - started
            return _Verdict(Duplicate(), _NO_ERROR, job, attempt, job_id, True, took, latency, False, started)
        except Exception as exc:
            took = time.monotonic() - started
            if ledger is not None:
                await self._release(ledger, job_id, owner)
            kind = self._classify(job, exc)
            decision = decide(kind, attempt, max_attempts, layout.tiers)
            tb = "".join(traceback.format_exception(exc))
            error = (_qualname(exc), str(exc), tb)
            return _Verdict(decision, error, job, attempt, job_id, True, took, latency, kind == "timeout", started)
        took = time.monotonic() - started
        if ledger is not None:
            await ledger.done(job_id, owner)  # False when its transaction() already marked it: fine
        return _Verdict(Ack(), _NO_ERROR, job, attempt, job_id, True, took, latency, False, started)

    @staticmethod
    async def _release(ledger: Ledger, key: str, owner: str) -> None:
        try:
            await ledger.release(key, owner)
        except Exception as exc:  # the lease expires by itself
            log.warning("releasing the claim on %s failed (%s); it expires with its lease", key, exc)

    @staticmethod
    def _classify(job: JobDef, exc: BaseException) -> FailureKind:
        if isinstance(exc, Reject):
            return "reject"
        if isinstance(exc, Retry):
            return "retry"
        if isinstance(exc, TimeoutError):
            return "timeout"
        if isinstance(exc, ConfigurationError):  # a misuse of ours (e.g. ctx.transaction()): no retry can fix it
            return "permanent"
        if job.retry.permanent and isinstance(exc, job.retry.permanent):
            return "permanent"
        return "error"

    async def _run_handler(self, job: JobDef, payload: Any, ctx: JobContext) -> None:
        """Run the handler once, or with ``immediate_retries`` via tenacity, within its timeout."""
        timeout = self._timeouts.get(job.name, job.timeout)
        if job.retry.immediate_retries == 0:
            await self._run_once(job, payload, ctx, timeout)
            return

        def transient(exc: BaseException) -> bool:
            return self._classify(job, exc) in ("error", "timeout")

        async for attempt in AsyncRetrying(
            retry=retry_if_exception(transient),
            stop=stop_after_attempt(job.retry.immediate_retries + 1),
            wait=wait_fixed(job.retry.immediate_wait),
            reraise=True,
        ):
            with attempt:
                await self._run_once(job, payload, ctx, timeout)

    async def _run_once(self, job: JobDef, payload: Any, ctx: JobContext, limit: float | None) -> None:
        if not job.is_async:
            await self._run_in_thread(job, payload, ctx, limit)
            return
        # an async handler runs on the loop: its frame is registered, so a stall it causes is blamed on it
        stall_key = self._stalls.enter(sys._getframe(), job.name, ctx.job_id)
        try:
            async with asyncio.timeout(limit) as scope:
                await job.handler(payload, ctx)
        except TimeoutError:
            if not scope.expired():
                raise
            default = "" if job.timeout is not None else " (the default: just below the consumer timeout)"
            raise TimeoutError(f"job {job.name} ran longer than its timeout of {limit:g}s{default}") from None
        finally:
            self._stalls.leave(stall_key)

    async def _run_in_thread(self, job: JobDef, payload: Any, ctx: JobContext, limit: float | None) -> None:
        # A thread can't be interrupted: retrying while it still runs could commit the side
        # effect twice. So the worker waits for it, warns about the overrun, and judges the
        # run by its result.
        future = asyncio.get_running_loop().run_in_executor(self._executor, job.handler, payload, ctx)
        if limit is not None:
            done, _ = await asyncio.wait({future}, timeout=limit)
            if not done:
                log.warning(
                    "job %s id %s: plain-function handler passed its timeout of %gs; threads can't be "
                    "cancelled, so the worker waits for it and judges it by its result",
                    job.name, ctx.job_id, limit,
                )  # fmt: skip
        await future

    async def _carry_out(self, layout: JobQueueLayout, delivery: Delivery, v: _Verdict) -> bool:
        """Publish what the decision needs, then ack. Returns whether the delivery was acked."""
        if delivery.channel_closed and not isinstance(v.decision, Ack | Duplicate):
            # the broker has already put it back (redelivered): a copy now would only be a duplicate
            log.warning("job %s: its channel closed before %s could be carried out; the broker redelivers it",
                        v.job_id, v.decision)  # fmt: skip
            return False
        if isinstance(v.decision, HandBack) and nack_is_free(self._version, layout.queue_type):
            with contextlib.suppress(DeliveryChannelClosed):  # 4.3 quorum: uncharged (amqpjobs.jobs.crash)
                await delivery.requeue()
            return False
        try:
            await self._republish(layout, delivery, v)
        except AmqpJobsError as exc:
            return await self._fallback(layout, delivery, v, exc)
        return await self._ack(delivery, v.job_id)

    async def _republish(self, layout: JobQueueLayout, delivery: Delivery, v: _Verdict) -> None:
        """Publish the copy the decision needs, if any (confirmed).

        Raises:
            AmqpJobsError: the publish failed (see :meth:`ConfirmedPublisher.publish`).
        """
        assert self._publisher is not None
        assert self._quarantiner is not None
        decision, info, job, job_id = v.decision, v.error, v.job, v.job_id
        # handler runs so far, counted in our own header on our copies (absent = 0), never derived
        # from the attempt header a publisher may set to anything
        runs = envelope.parse_runs(delivery.headers.get(envelope.RUNS)) + (1 if v.ran else 0)
        if isinstance(decision, RetryLater):
            headers = envelope.strip_broker_headers(delivery.headers)
            if not decision.wait:  # an outcome was reached: the start count begins again
                for name in crash.START_HEADERS:
                    headers.pop(name, None)
            headers[envelope.ATTEMPT] = decision.next_attempt
            headers[envelope.RUNS] = runs
            if not decision.wait:
                headers.setdefault(envelope.FIRST_FAILURE_AT, _now_iso())
            # the copy comes back from the tier via the default exchange: keep where it first came from
            headers.setdefault(envelope.ORIGINAL_EXCHANGE, delivery.exchange)
            headers.setdefault(envelope.ORIGINAL_ROUTING_KEY, delivery.routing_key)
            tier_queue = layout.tier_queues[delivery.queue][decision.tier]
            await self._publisher.publish("", tier_queue, delivery.copy(headers, job_id))
        elif isinstance(decision, Register | HandBack):
            # unstarted, as a copy (not a requeue: no redelivered flag): a registered start waits in
            # the suspects queue, a delivery handed back returns to its work queue
            headers = envelope.strip_broker_headers(delivery.headers)
            target = delivery.queue
            if isinstance(decision, Register):
                target = layout.suspects_queue
                headers[crash.STARTS] = decision.start
                headers[crash.LAST_START_HOST] = self._host
                headers[crash.LAST_START_PID] = self._pid
                headers[crash.LAST_START_AT] = _now_iso()
                headers[crash.WORK_QUEUE] = delivery.queue
                headers.setdefault(envelope.FIRST_FAILURE_AT, _now_iso())
            headers.setdefault(envelope.ORIGINAL_EXCHANGE, delivery.exchange)
            headers.setdefault(envelope.ORIGINAL_ROUTING_KEY, delivery.routing_key)
            await self._publisher.publish("", target, delivery.copy(headers, job_id))
            if isinstance(decision, Register):
                self._suspects_signal.set()
        elif isinstance(decision, Quarantine):
            now = _now_iso()
            if decision.reason == "crashed":  # every start of this attempt ended without an outcome
                runs = envelope.parse_runs(delivery.headers.get(envelope.RUNS)) + crash.starts_of(delivery.headers)
            error_type, error_message, tb = info
            failure = Failure(
                reason=decision.reason,
                error_type=error_type,
                error_message=error_message,
                traceback=tb,
                attempts=runs,
                first_failure_at=str(delivery.headers.get(envelope.FIRST_FAILURE_AT) or now),
                last_failure_at=now,
                host=self._host,
                pid=self._pid,
                version=__version__,
                app_version=self.app.app_version,
                exchange=str(delivery.headers.get(envelope.ORIGINAL_EXCHANGE, delivery.exchange)),
                queue=delivery.queue,
                routing_key=str(delivery.headers.get(envelope.ORIGINAL_ROUTING_KEY, delivery.routing_key)),
                job=job.name if job else envelope.job_name_of(delivery.type, delivery.headers),
                job_id=job_id,
                tenant=envelope.tenant_in(delivery.headers) or "",
                **delivery_counters(delivery.headers),
            )
            headers = envelope.strip_broker_headers(delivery.headers)
            headers[envelope.RUNS] = runs
            headers.update(evidence_headers(failure))
            await self._quarantiner.publish(layout.quarantine_exchange, delivery.queue, delivery.copy(headers, job_id))

    @staticmethod
    async def _ack(delivery: Delivery, job_id: str) -> bool:
        try:
            await delivery.ack()
        except DeliveryChannelClosed:
            log.warning(
                "job %s: its channel closed before the ack; the broker redelivers it (the copy already "
                "published makes this a duplicate the handler must tolerate)", job_id,
            )  # fmt: skip
            return False
        return True

    async def _fallback(self, layout: JobQueueLayout, delivery: Delivery, v: _Verdict, exc: Exception) -> bool:
        """Our republish failed: hold the delivery until its copy can go (:mod:`amqpjobs.runtime.holding`).

        A copy that can never go (too large, a bug of ours) is left to the broker once the
        quarantine exists: the delivery is rejected and dead-lettered into it (requeued when
        it never ran this time).
        """
        decision = v.decision
        settled = await self._holding.settle(
            delivery.queue, needs_of(layout, delivery.queue, decision),
            lambda: self._republish(layout, delivery, v), exc, lambda: delivery.settleable,
        )  # fmt: skip
        if settled == "published":
            return await self._ack(delivery, v.job_id)
        if settled == "gone":
            return False
        if isinstance(decision, Register | HandBack):  # it never ran this time: back to its queue as it is
            log.warning("putting job %s back on %s failed (%s); requeued instead", delivery.message_id,
                        delivery.queue, exc)  # fmt: skip
            with contextlib.suppress(DeliveryChannelClosed):
                await delivery.requeue()
            return False
        try:
            await delivery.reject()
        except DeliveryChannelClosed:
            log.warning("republish failed (%s) and the channel is gone: the broker redelivers", exc)
            return False
        log.error(
            "republish for %s failed (%s); rejected the delivery so the broker dead-letters it into "
            "quarantine with x-death reason 'rejected'", decision, exc,
        )  # fmt: skip
        return False


async def run_worker(
    app: App,
    settings: BrokerSettings,
    options: WorkerOptions,
    metrics_port: int | None = None,
    metrics_host: str = "127.0.0.1",
) -> int:
    """Run a worker until SIGTERM/SIGINT, then drain; a second signal exits at once.

    Args:
        app: The application.
        settings: Broker settings.
        options: Worker options.
        metrics_port: Serve ``/metrics``, ``/healthz``, ``/readyz`` on this port (None: don't).
        metrics_host: Interface for that endpoint (default loopback).

    Returns:
        The process exit code: 0 after a clean drain, 1 when in-flight work was abandoned.

    Raises:
        ConfigurationError: the metrics port can't be bound.
    """
    metrics = WorkerMetrics() if metrics_port is not None else None
    worker = Worker(app, settings, options, metrics=metrics)
    server = None
    if metrics is not None and metrics_port is not None:
        server = MetricsServer(metrics, worker.readiness, lambda: worker.heartbeat_at, metrics_host, metrics_port)
        try:
            server.start()
        except OSError as exc:
            raise ConfigurationError(f"can't serve metrics on {metrics_host}:{metrics_port}: {exc}") from None
        log.info("metrics and health on http://%s:%d/metrics, /healthz, /readyz", metrics_host, server.port)
    try:
        with stop_on_signals(worker.request_stop, "no new deliveries; draining"):
            return await worker.run()
    finally:
        if server is not None:
            server.stop()
        if app.ledger is not None:
            await app.ledger.close()
