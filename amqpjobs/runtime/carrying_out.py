"""Carrying a delivery's decision out: the copy it needs (confirmed), then the ack (README "Workers").

A failed attempt's copy goes to its next delay tier, a registered start's to the suspects queue,
a delivery handed back to its own work queue, a permanent failure's to quarantine with evidence
headers (trimmed when another publisher's headers leave less room); the original is acked only
after its copy was confirmed. When the copy can't go, :mod:`.fallback` holds the delivery or
rejects it once into quarantine. A decision carried out by the ack alone makes no copy. A held
delivery whose handler ran keeps its decision past the stop's grace (:mod:`.kept_decisions`).

Part of the worker's one-delivery path (:mod:`.deliveries`); its state is the worker's.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from amqpjobs._version import __version__
from amqpjobs.errors import AmqpJobsError, MessageTooLargeError
from amqpjobs.jobs import envelope
from amqpjobs.jobs.copy_headers import strip_broker_headers
from amqpjobs.jobs.decided import DECIDED, decided_value
from amqpjobs.jobs.envelope import iso_utc
from amqpjobs.jobs.evidence import broker_counters, trimmed_budget
from amqpjobs.jobs.failure import quarantine_headers, retry_headers, unstarted_headers
from amqpjobs.jobs.outcome import Ack, Duplicate, HandBack, Outcome, Quarantine, Register, RetryLater, Skip
from amqpjobs.message import OutgoingMessage
from amqpjobs.runtime.draining import Draining
from amqpjobs.runtime.fallback import ack, fall_back
from amqpjobs.runtime.holding import Holding, pending_of
from amqpjobs.runtime.kept_decisions import KeptDecisions, keeps
from amqpjobs.runtime.logs import field_value
from amqpjobs.topology.models import JobQueueLayout
from amqpjobs.wire.abc import Connection, Publisher, Received
from amqpjobs.wire.alarms import blocked_by

if TYPE_CHECKING:
    from amqpjobs.runtime.app import App

log = logging.getLogger("amqpjobs.worker")

#: Decisions carried out by the ack alone, no copy (a tuple: ``Ack | Duplicate`` would be built again per delivery).
ACK_ONLY: Final = (Ack, Duplicate, Skip)
#: Seconds between two looks at a delivery whose copy is not confirmed yet (its channel may close meanwhile).
HELD_COPY_LOOK: Final = 1.0


class CarryingOut(KeptDecisions):
    """Carrying out decisions, for :class:`~amqpjobs.runtime.deliveries.DeliveryPath` (its state is the worker's)."""

    app: App
    _stop: asyncio.Event
    _took_last: asyncio.Event  # set once the stopping worker's consumers are cancelled
    _holding: Holding
    _publisher: Publisher | None
    _quarantiner: Publisher | None
    _suspects_signal: asyncio.Event
    _publishing: Connection | None  # the copies' connection (an alarm blocks it, never the acks)
    _draining: Draining
    _host: str
    _pid: int
    _version: tuple[int, ...]  # the broker's, read at connect
    #: The ledger's key that seals a waiting suspect's start (:mod:`amqpjobs.runtime.ledger_key`), once started.
    _seal_key: bytes | None = None

    async def _carry_out(
        self, layout: JobQueueLayout, delivery: Received, v: Outcome, trace: Mapping[str, str] = {}
    ) -> bool:
        """Publish what the decision needs, then ack. Returns whether the delivery was acked."""
        copied = not isinstance(v.decision, ACK_ONLY)  # a decision carried out by a copy, then the ack
        if copied and delivery.channel_closed:
            # the broker has already put it back (redelivered): a copy now would only be a duplicate
            log.warning("job %s: its channel closed before %s could be carried out; the broker redelivers it",
                        field_value(v.job_id), v.decision)  # fmt: skip
            return False
        if copied:
            v.reached_at = v.reached_at or iso_utc()  # the failure's time on every copy, however late it goes
            try:
                await self._republish(layout, delivery, v, trace)
            except AmqpJobsError as exc:
                return await self._fallback(layout, delivery, v, exc, trace)
        return await ack(delivery, v.job_id, copied=copied)

    async def _republish(
        self,
        layout: JobQueueLayout,
        delivery: Received,
        v: Outcome,
        trace: Mapping[str, str] = {},
        unsettled: list[asyncio.Future[None]] | None = None,
    ) -> None:
        """Publish the copy the decision needs, if any (confirmed; :meth:`_copy`), and watch its delivery meanwhile.

        A copy a resource alarm holds unread is waited for as long as the alarm lasts (never sent twice).
        Should the delivery's channel close meanwhile (the broker's ``consumer_timeout``), the broker has
        the original back and redelivers it, and stores the held copy once the alarm clears: the job then
        has two lives (measured on 3.10, a job failing once, a 75 s alarm, a 5 s timeout: runs 1, 1, 2, 2).
        The worker says so when it sees it (:meth:`_held_past_its_channel`); README "When a job crashes, hangs
        or stalls its worker".

        ``unsettled``: cancelled while the copy waits for its confirm, the publish is left to go on and
        appended there, for the caller to settle (a held delivery's at the grace's end: :mod:`.kept_decisions`);
        None: it is cancelled with this.

        Raises:
            AmqpJobsError: the publish failed (see :meth:`amqpjobs.wire.abc.Publisher.publish`).
        """
        copying = asyncio.ensure_future(self._copy(layout, delivery, v, trace))
        said = False
        try:
            while not (await asyncio.wait([copying], timeout=HELD_COPY_LOOK))[0]:
                if not said and delivery.channel_closed:
                    said = self._held_past_its_channel(v)
        except asyncio.CancelledError:
            if unsettled is not None and not copying.done():  # it may still be stored: the caller settles it
                unsettled.append(copying)
            else:
                copying.cancel()
                await asyncio.gather(copying, return_exceptions=True)
            raise
        copying.result()

    def _held_past_its_channel(self, v: Outcome) -> bool:
        """Say that a copy held by a resource alarm outlived its delivery's channel (two lives); whether it was said."""
        publishing = self._publishing
        alarm = None if publishing is None else blocked_by(publishing)
        if alarm is None:
            return False
        log.warning(
            "job %s: its channel closed (the broker's consumer_timeout?) while a resource alarm (%s) holds its %s "
            "copy unread: the broker redelivers the job now and stores the copy once the alarm clears, so the job "
            "runs again from this attempt and from the copy (two lives: an alarm longer than consumer_timeout; "
            "README \"When a job crashes\")", field_value(v.job_id), alarm, type(v.decision).__name__,
        )  # fmt: skip
        return True

    async def _copy(
        self, layout: JobQueueLayout, delivery: Received, v: Outcome, trace: Mapping[str, str] = {}
    ) -> None:
        """Publish the copy the decision needs, if any (confirmed).

        ``trace``: trace headers the copy gets instead of the received ones (a delivery that
        came without a valid ``traceparent``: its first ``process`` span's, so later attempts
        join that trace; :class:`amqpjobs.runtime.tracing.ProcessSpan`).

        Raises:
            AmqpJobsError: the publish failed (see :meth:`amqpjobs.wire.abc.Publisher.publish`).
        """
        assert self._publisher is not None
        assert self._quarantiner is not None
        if v.decided:  # an earlier run's decision: its copy goes as it came (.kept_decisions)
            return await self._carry_decided(layout, delivery, v)
        decision, job_id = v.decision, v.job_id
        received = envelope.with_trace(delivery.headers, trace) if trace else delivery.headers
        # handler runs so far, counted in our own header on our copies (absent = 0), never derived
        # from the attempt header a publisher may set to anything
        runs = envelope.parse_runs(received) + (1 if v.ran else 0)
        if isinstance(decision, RetryLater):
            headers = retry_headers(received, decision, runs, delivery.exchange, delivery.routing_key,
                                    v.reached_at or iso_utc(), timestamp=delivery.timestamp, job_id=job_id,
                                    key=self._seal_key)  # fmt: skip
            tier_queue = layout.tier_queues[delivery.queue][decision.tier]
            # ready in the work queue once the tier's delay is over: max_age counts from then
            back_at = envelope.ready_at(time.time(), decision.delay)
            await self._publisher.publish("", tier_queue, delivery.copy(headers, job_id, back_at))
        elif isinstance(decision, Register | HandBack):
            if isinstance(decision, HandBack) and self._stop.is_set():  # once no consumer here can take it back
                await self._took_last.wait()
            # unstarted, as a copy (not a requeue: no redelivered flag): a registered start waits in
            # the suspects queue, a delivery handed back returns to its work queue
            register = decision if isinstance(decision, Register) else None
            headers = unstarted_headers(received, register, delivery.queue, delivery.exchange, delivery.routing_key,
                                        self._host, self._pid, v.reached_at or iso_utc(),
                                        timestamp=delivery.timestamp)  # fmt: skip
            target = layout.suspects_queue if register is not None else delivery.queue
            # handed back: ready in the work queue now (a suspect keeps its timestamp: not ready there)
            ready_at = None if register is not None else envelope.ready_at(time.time())
            await self._publisher.publish("", target, delivery.copy(headers, job_id, ready_at))
            if register is not None:
                self._suspects_signal.set()
        elif isinstance(decision, Quarantine):
            quarantine = self._evidence(layout, delivery, v, decision, received, runs)
            exchange, headers = layout.quarantine_exchange, quarantine()
            try:
                await self._quarantiner.publish(exchange, delivery.queue, delivery.copy(headers, job_id))
            except MessageTooLargeError as exc:  # another publisher's headers leave less room than the evidence takes
                if exc.excess is None or (budget := trimmed_budget(headers, exc.excess)) is None:
                    raise  # no room worth it: rejected as it is (:mod:`.fallback`)
                trimmed = delivery.copy(quarantine(budget=budget), job_id)
                await self._quarantiner.publish(exchange, delivery.queue, trimmed)

    def _evidence(
        self,
        layout: JobQueueLayout,
        delivery: Received,
        v: Outcome,
        decision: Quarantine,
        received: Mapping[str, Any],
        runs: int,
    ) -> functools.partial[dict[str, Any]]:
        """The quarantine copy's headers, evidence and all (call it, with ``budget=`` to trim the evidence)."""
        return functools.partial(
            quarantine_headers, received, decision.reason, v.failure, runs, queue=delivery.queue,
            exchange=delivery.exchange, routing_key=delivery.routing_key, job=v.job, job_id=v.job_id,
            host=self._host, pid=self._pid, version=__version__, app_version=self.app.app_version,
            now=v.reached_at or iso_utc(), timestamp=delivery.timestamp,
            counters=broker_counters(received, layout.queue_type, delivery.redelivered, self._version),
        )  # fmt: skip

    def _marked_copy(
        self, layout: JobQueueLayout, delivery: Received, v: Outcome, trace: Mapping[str, str]
    ) -> OutgoingMessage:
        """The copy ``v``'s decision needs, marked with it, ready now in the delivery's own work queue.

        For :mod:`.kept_decisions`.

        Raises:
            ValueError: the decision is no quarantine or retry (:func:`~amqpjobs.jobs.decided.decided_value`).
        """
        received = envelope.with_trace(delivery.headers, trace) if trace else delivery.headers
        runs = envelope.parse_runs(received) + (1 if v.ran else 0)
        decision, value = v.decision, decided_value(v.decision)
        headers: dict[str, Any] = {}
        if v.decided:
            headers = strip_broker_headers(received)
        elif isinstance(decision, RetryLater):
            headers = retry_headers(received, decision, runs, delivery.exchange, delivery.routing_key,
                                    v.reached_at or iso_utc(), timestamp=delivery.timestamp, job_id=v.job_id,
                                    key=self._seal_key)  # fmt: skip
        elif isinstance(decision, Quarantine):
            headers = self._evidence(layout, delivery, v, decision, received, runs)()
        headers[DECIDED] = value
        return delivery.copy(headers, v.job_id, envelope.ready_at(time.time()))

    async def _fallback(
        self, layout: JobQueueLayout, delivery: Received, v: Outcome, exc: Exception, trace: Mapping[str, str] = {}
    ) -> bool:
        """Our republish failed: hold the delivery until its copy can go, or reject it once (:mod:`.fallback`).

        Still held when the stop's grace ends (this task cancelled), a run's decision is kept (:mod:`.kept_decisions`).
        """
        unsettled: list[asyncio.Future[None]] = []  # its copy's publish, cancelled while awaiting its confirm
        republish = functools.partial(self._republish, layout, delivery, v, trace, unsettled)
        pending = pending_of(layout, delivery.queue, v.decision)
        with self._draining.holding(*pending):  # a stopping worker's lines tell it from a running job
            try:
                return await fall_back(self._holding, layout, delivery, v, exc, republish,
                                       functools.partial(self._as_it_came, layout, delivery, v.job_id))  # fmt: skip
            except asyncio.CancelledError:
                in_flight = unsettled[-1] if unsettled else None
                if self._stop.is_set() and keeps(v) and delivery.settleable:
                    try:
                        copy, why = self._marked_copy(layout, delivery, v, trace), ""
                    except Exception as error:  # (a bug of ours, headers that can't be written): redelivered
                        copy, why = None, f"{type(error).__name__}: {error}"[:300]
                    await self._keep(delivery, v, copy, why, in_flight)
                elif in_flight is not None:
                    in_flight.cancel()
                raise

    async def _as_it_came(self, layout: JobQueueLayout, delivery: Received, job_id: str) -> None:
        """Publish ``delivery`` into its quarantine as it came, the broker's ``x-`` headers removed (confirmed).

        Never larger than the message received (it fit a frame): for one the broker can't dead-letter
        (:mod:`.fallback`). Raises AmqpJobsError when the publish fails.
        """
        assert self._quarantiner is not None
        copy = delivery.copy(strip_broker_headers(delivery.headers), job_id)
        await self._quarantiner.publish(layout.quarantine_exchange, delivery.queue, copy)
