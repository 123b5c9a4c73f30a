"""One delivery, start to end: decide, run (:mod:`.runs`), carry the decision out (:mod:`.carrying_out`), record it.

The worker's rules (README "Workers"): a delivery is acked only after its handler
returned; a failed attempt is republished to the next delay tier (confirmed), then the
original is acked; a permanent failure goes to quarantine with evidence headers
(confirmed), then acked; if that republish fails, the delivery is held unacked until its
target is back, or rejected once into quarantine when its copy can never go
(:mod:`amqpjobs.runtime.fallback`); a delivery from a channel that has since closed is
never acked on a new channel. The pure rules are in :mod:`amqpjobs.jobs.failure`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

from pydantic import ValidationError

from amqpjobs.jobs import crash, envelope
from amqpjobs.jobs.breaker import breaker_open
from amqpjobs.jobs.decided import DECIDED
from amqpjobs.jobs.events import event_body
from amqpjobs.jobs.failure import (
    crash_error,
    describe,
)
from amqpjobs.jobs.header_values import amqp_type, count_problem, read_count, tenant_problem
from amqpjobs.jobs.isolation import IsolationGate
from amqpjobs.jobs.message_key import (
    generated_job_id,
    keyed_again,
    payload_key,
    unnamed_idempotency_key,
    with_payload_key,
)
from amqpjobs.jobs.outcome import HandBack, Outcome, Quarantine, Register, RetryLater, reported
from amqpjobs.jobs.quarantine import REPLAY_ID, header_text
from amqpjobs.jobs.registry import JobDef
from amqpjobs.jobs.retry import decide
from amqpjobs.jobs.timestamps import time_problem
from amqpjobs.runtime.breakers import Breakers
from amqpjobs.runtime.carrying_out import ACK_ONLY, CarryingOut
from amqpjobs.runtime.draining import Draining
from amqpjobs.runtime.holding import Holding
from amqpjobs.runtime.logs import field_value
from amqpjobs.runtime.metrics import WorkerMetrics
from amqpjobs.runtime.pausing import OperatorPauses
from amqpjobs.runtime.recording import OutcomeRecords
from amqpjobs.runtime.runs import HandlerRuns, Unread
from amqpjobs.runtime.signals import ends_the_task
from amqpjobs.topology.models import JobQueueLayout
from amqpjobs.topology.naming import event_routing_key
from amqpjobs.wire.abc import Connection, Publisher, Received
from amqpjobs.wire.connection import server_address
from amqpjobs.wire.events import OutcomeEvents

if TYPE_CHECKING:
    from amqpjobs.runtime.app import App
    from amqpjobs.runtime.rate_limits import RateLimits
    from amqpjobs.runtime.worker_config import WorkerOptions

log = logging.getLogger("amqpjobs.worker")


#: How a delivery is handled: (alone, hand_back, rated, its task when known), :meth:`DeliveryPath._process`'s arguments.
_How = tuple[bool, bool, bool, "asyncio.Task[Any] | None"]


class DeliveryPath(HandlerRuns, OutcomeRecords, CarryingOut):
    """The one-delivery path of :class:`~amqpjobs.runtime.worker.Worker` (its state is the worker's)."""

    app: App
    options: WorkerOptions
    stats: Counter[str]
    metrics: WorkerMetrics | None
    _on_outcome: Callable[[Outcome], None] | None
    _stop: asyncio.Event
    _took_last: asyncio.Event  # set once the stopping worker's consumers are cancelled
    _gate: IsolationGate
    _holding: Holding
    _connection: Connection | None
    _publisher: Publisher | None
    _quarantiner: Publisher | None
    _events: OutcomeEvents | None
    _suspects_signal: asyncio.Event
    _heartbeat_timeout: float
    _version: tuple[int, ...]
    _pauses: OperatorPauses
    _breakers: Breakers | None
    _draining: Draining
    _header_types_said: set[tuple[str, str]]  # (header, AMQP type), (what, queue or job) already warned of

    _layouts: dict[str, JobQueueLayout]
    _rates: RateLimits | None

    def _say_unread_headers(self, delivery: Received, job_id: str) -> None:
        """Warn of a tenant, attempt or enqueue-time header the worker can't read (it reads its default instead).

        Once per header and AMQP type, naming the first job id: the job runs all the same (README "Wire format").
        Our own headers (a str tenant, an int attempt >= 0) cost a type test each; the enqueue time is parsed.
        """
        headers = delivery.headers
        problems = []
        if (tenant := headers.get(envelope.TENANT)) is not None and type(tenant) is not str:
            problems.append((envelope.TENANT, tenant, tenant_problem(envelope.TENANT, tenant)))
        if (attempt := headers.get(envelope.ATTEMPT)) is not None and (type(attempt) is not int or attempt < 0):
            unread = read_count(attempt) is None
            problems.append((envelope.ATTEMPT, attempt, f"{count_problem(envelope.ATTEMPT, attempt)}; {_ATTEMPT_FIX}"
                             if unread else None))  # fmt: skip
        if (first := headers.get(envelope.ENQUEUED_AT)) is not None:  # (parsed here and for ctx: ~0.4 µs each)
            problems.append((envelope.ENQUEUED_AT, first, time_problem(envelope.ENQUEUED_AT, first)))
        for name, value, said in problems:
            if said is not None and (key := (name, amqp_type(value))) not in self._header_types_said:
                self._header_types_said.add(key)
                log.warning("%s (said once per header and type; first: job id %s on %s)", said, field_value(job_id),
                            delivery.queue)  # fmt: skip

    def _say_once(self, key: tuple[str, str], message: str, *args: object) -> None:
        """Log warning ``message % args`` the first time ``key`` (what, where) is met: a publisher's habit, not news."""
        if key not in self._header_types_said:
            self._header_types_said.add(key)
            log.warning(message, *args)

    async def handle(self, job_queue: str, delivery: Received) -> None:
        """Decide about one delivery of ``job_queue``, carry it out and settle it (what each consumer calls)."""
        await self._handle(self._layouts[job_queue], delivery)

    async def _handle(
        self,
        layout: JobQueueLayout,
        delivery: Received,
        alone: bool = False,
        hand_back: bool = False,
        rated: bool = False,
        task: asyncio.Task[Any] | None = None,
    ) -> None:
        """Decide, carry out and settle one delivery; ``task``: the delivery's task, when the caller has it."""
        if not delivery.message_id:  # each copy of it carries its key as it came (README "Idempotency")
            delivery.headers = with_payload_key(delivery.headers, delivery.body)
        if self._rates is not None and not (alone or hand_back or rated or DECIDED in delivery.headers):
            went = await self._rates.divert(layout, delivery)
            if went == "moved":
                return  # a rate-limited job's: moved to its waiting room (README "Flow control")
            hand_back = went == "back"  # no token came within the bound: back to its work queue, unstarted
        gauge = self.metrics.in_flight_of(layout.name) if self.metrics is not None else None
        if gauge is not None:
            gauge.inc()
        tracing = self.app.tracing
        how = (alone, hand_back, rated, task)
        try:
            if tracing is None:
                await self._handle_delivery(layout, delivery, how)
            else:  # a CONSUMER span around it, current while the handler runs (README "Tracing"); its
                # failures are tracing's own (caught and logged there): they never reach the delivery
                d, started = delivery, False
                try:
                    with tracing.processing(d.exchange, d.routing_key, d.queue, d.headers, d.message_id,
                                            d.delivery_tag, d.correlation_id,
                                            server_address(self._connection)) as process:  # fmt: skip
                        started = True
                        outcome = await self._handle_delivery(layout, delivery, how, process.carry)
                        tracing.finished(process, outcome)
                except Exception:
                    if started:
                        raise
                    # a bug of ours in tracing must not wedge the slot either: the delivery goes on untraced
                    log.exception("tracing a delivery from %s failed; it is processed without a span", d.queue)
                    await self._handle_delivery(layout, delivery, how)
        finally:
            if self._rates is not None:  # a token taken for no start goes back (README "Rate limits")
                await self._rates.give_back()
            if gauge is not None:
                gauge.dec()

    async def _handle_delivery(
        self, layout: JobQueueLayout, delivery: Received, how: _How, trace: Mapping[str, str] = {}
    ) -> Outcome:
        """Decide, carry out, record: ``how`` as :data:`_How`, ``trace`` the copies' trace headers."""
        try:
            v = await self._process(layout, delivery, *how)
        except BaseException as exc:  # a bug of ours (or app code's SystemExit...) never wedges a slot unacked
            if ends_the_task(exc):
                raise
            log.exception("processing a delivery from %s failed inside the worker", delivery.queue)
            v = self._outcome(layout, delivery, Quarantine("worker-error"), 1, _job_id(delivery),
                              failure=describe(exc))  # fmt: skip
        registering = isinstance(v.decision, Register)  # ordinary starts wait meanwhile (jobs.isolation)
        if registering:
            self._gate.registration_begins()
        try:
            acked = await self._carry_out(layout, delivery, v, trace)
        except Exception as exc:
            log.exception("carrying out %s failed inside the worker", v.decision)
            acked = await self._fallback(layout, delivery, v, exc, trace)
        finally:
            if registering:
                self._gate.registration_ends()
        if envelope.PAYLOAD_REF in delivery.headers:  # a success marks its stored payload, a quarantine keeps it
            from amqpjobs.runtime.payloads import after_outcome as payload_after

            await payload_after(self.app.payload_store, delivery.headers, v.decision, acked)
        uncertain = False
        if v.ran and isinstance(v.decision, ACK_ONLY):
            # a run the broker may not have seen finish: its ack was never sent, or sent into a
            # connection the broker had already given up on (no heartbeat during a stall)
            stalled = self._stalls.longest_since(v.started)
            uncertain = not acked or (0 < self._heartbeat_timeout <= stalled)
        v.acked, v.uncertain = acked, uncertain
        v.error = f"{v.failure[0]}: {v.failure[1]}"[:300] if v.failure[0] else ""
        kind = v.kind  # settled: read once, for the stop's counts, the record and the event
        self._draining.settled(self._stop.is_set(), kind)  # for the stop's counts
        # logs and metrics on the loop's next turn: the ack queued above reaches the socket first
        # (with one slot, the broker sends the next delivery only once it has the ack)
        asyncio.get_running_loop().call_soon(self._record, v, kind)
        if self._results is not None:  # its results-store record, queued (never waits)
            self._results.note_outcome(layout, delivery.queue, v)
        if self._breakers is not None:  # a failure notice, or the end of this worker's probe (README "Flow control")
            self._breakers.after(v)
        if self._events is not None and (  # fire and forget: the job's fate is settled above
            reported(self.options.outcome_events, kind) or REPLAY_ID in delivery.headers
        ):
            replay_id = header_text(delivery.headers.get(REPLAY_ID))
            body = event_body(v, kind, replay_id, time.time())
            # a replayed delivery's event is kept over the cap: a canary waits for it (bounded by --rate)
            self._events.emit(event_routing_key(v.queue, kind), body, keep=bool(replay_id))
        return v

    async def _process(
        self, layout: JobQueueLayout, delivery: Received, alone: bool = False, hand_back: bool = False,
        rated: bool = False, task: asyncio.Task[Any] | None = None,
    ) -> Outcome:  # fmt: skip
        """Decide about one delivery (runs the handler when the delivery is a job it can run).

        ``alone``: the delivery is a suspect taken while nothing else runs or is held here.
        ``hand_back``: not to be started (a look-ahead delivery that got no slot in time).
        ``rated``: took its rate limit's token (none is given while paused): it starts even if a pause came since.
        ``task``: the delivery's (current) task, when the caller has it.
        """
        if DECIDED in delivery.headers:  # an earlier run's decision, kept past its stop: no gate, no run
            return self._decided_outcome(layout, delivery)
        unstarted = hand_back or (self._stop.is_set() and not alone)  # arrived, or got its slot, after SIGTERM
        if unstarted and not delivery.redelivered:  # handed back as a copy (a requeue would mark it redelivered:
            # a start, for the crash count), once this worker can't take it again
            await (self._took_last.wait() if self._stop.is_set() else asyncio.sleep(0))
            return self._outcome(layout, delivery, HandBack(), 1, _job_id(delivery))
        # a redelivery is screened even when it will not start here: a plain copy back would drop the
        # evidence of its earlier start (review 24); it is registered for its next start, or quarantined
        attempt = envelope.parse_attempt(delivery.headers.get(envelope.ATTEMPT))
        job_id = _job_id(delivery)
        if not delivery.message_id:
            self._say_once(("no message_id", delivery.queue), "delivery without message_id (absent, empty or "
                           "blank) on %s: set message_id (the job id) on every publish, or each delivery gets a job "
                           "id of its own (said once per queue; first: job id %s)", delivery.queue,
                           field_value(job_id))  # fmt: skip
        self._say_unread_headers(delivery, job_id)
        job_name = envelope.job_name_of(delivery.type, delivery.headers)
        job = self.app.get(job_name) if job_name else None
        if job is None or job.queue != layout.name:
            why = (
                envelope.job_header_problem(delivery.type, delivery.headers)
                or "no job name (type property or amqpjobs-job header)"
                if not job_name
                else f"job '{job_name[:200]}' is not served from job queue '{layout.name}' by app '{self.app.name}'"
            )
            return self._outcome(layout, delivery, Quarantine("unknown-job"), attempt, job_id,
                                 failure=("UnknownJob", why, ""))  # fmt: skip
        # before the payload is fetched, decoded and validated (app code: a model's validators): a start that
        # kills the worker there is counted like one in the handler, and a redelivery never gets that far again
        if job.idempotent and job.key is None and keyed_again(delivery.message_id, delivery.headers, None):
            job_id = payload_key(delivery.headers, delivery.body)  # keyed by the message as it came: known now, so a
            # copy before the run (a start registered to run alone, a redelivery's) carries it (README "Idempotency")
        waiting = crash.waiting_start(delivery.headers, job_id, self._seal_key) if job.idempotent else None
        screening = crash.screen(delivery.redelivered, delivery.headers, layout.max_redeliveries, registered=alone,
                                 waiting=waiting)  # fmt: skip
        if screening.action == "crashed":
            error = crash_error(layout.name, layout.max_redeliveries, screening.start, delivery.headers)
            return self._outcome(layout, delivery, Quarantine("crashed"), attempt, job_id, job.name,
                                 failure=error, ran=True)  # fmt: skip
        if screening.action == "register":
            return self._outcome(layout, delivery, Register(screening.start), attempt, job_id, job.name)
        # a stored payload (claim-check) is read only when the job is about to run: not for a wait on a pause or
        # an open breaker, where a read would be wasted each pass and a store failing it would use up an attempt
        # (early still for an idempotent job keyed by its payload, also a copy of ours: its claim needs that key)
        keyed = job.idempotent and keyed_again(delivery.message_id, delivery.headers, job.key)
        early = envelope.PAYLOAD_REF not in delivery.headers or keyed
        loaded = await self._payload(layout, delivery, job, attempt, job_id) if early else None
        if isinstance(loaded, Outcome):
            return loaded
        if loaded is not None:
            job_id = loaded[1]
        max_attempts = job.retry.attempts_for(layout.tiers)
        if attempt > max_attempts:
            said = count_problem(envelope.ATTEMPT, delivery.headers.get(envelope.ATTEMPT))  # out of range: why
            said = said or f"attempt header says {attempt}"
            why = f"{said}, above max_attempts {max_attempts}"
            return self._outcome(layout, delivery, Quarantine("exhausted"), attempt, job_id, job.name,
                                 failure=("AttemptsExhausted", why, ""))  # fmt: skip
        if unstarted:  # (a redelivery not run alone is registered or quarantined above: this stays a guard)
            return self._outcome(layout, delivery, HandBack(), attempt, job_id, job.name)
        # a stored payload not read yet is read by the start, once its job's claim is had (a duplicate reads none)
        payload = Unread(functools.partial(self._payload, layout, delivery, job, attempt, job_id))
        run = (layout, delivery, job, payload if loaded is None else loaded[0], attempt, max_attempts, job_id,
               screening.start)  # fmt: skip
        if alone:
            if self._deferral_lines.alone_line_due(job_id):  # paced for one waiting on a live claim
                log.warning(
                    "job=%s id=%s: start %d of at most %d (earlier starts ended without an outcome); running it "
                    "alone on %s pid %d", field_value(job.name), field_value(job_id), screening.start,
                    layout.max_redeliveries + 1, self._host, self._pid,
                )  # fmt: skip
            return await self._start(*run, ordinary=False, task=task)
        if self._pauses.holds_back(layout.name) and not rated:  # operator-paused (a redelivered one: registered above)
            return self._outcome(layout, delivery, HandBack(), attempt, job_id, job.name)
        if job.breaker is not None and self._breakers is not None and (wait := await self._breakers.gate(
                job, job_id, attempt, layout.tiers)) is not None:  # open: it waits ("Flow control")  # fmt: skip
            return self._outcome(layout, delivery, wait, attempt, job_id, job.name, failure=breaker_open(job.name))
        await self._gate.until_registered()  # a job killing the process now would give a registered one two lives
        if self._stop.is_set() or not self._gate.try_enter():
            # stopping (a take answered after SIGTERM), or a suspect waits or runs alone here: don't start or hold it
            return self._outcome(layout, delivery, HandBack(), attempt, job_id, job.name)
        try:  # a job to drain once its handler starts; stopping before (its claim waited), handed back
            return await self._start(*run, task=task)
        finally:
            self._gate.leave()

    async def _payload(
        self, layout: JobQueueLayout, delivery: Received, job: JobDef, attempt: int, job_id: str
    ) -> tuple[Any, str] | Outcome:
        """The delivery's validated payload and its job id (a key of its payload without ``message_id``).

        Reads a stored payload from the app's store (claim-check). Returns the outcome instead when the
        payload can't be had: a store failing the read is retried like a handler error, the rest quarantined.
        """
        body, what = delivery.body, "body"
        if envelope.PAYLOAD_REF in delivery.headers:  # claim-check: the payload is kept in the app's store
            from amqpjobs.jobs.payload_refs import PayloadRefError  # here: no import cost without stored payloads
            from amqpjobs.runtime.payloads import check_out as payload_of
            from amqpjobs.runtime.payloads import stored_label

            try:
                body = await payload_of(self.app.payload_store, delivery.headers, layout.quarantine_queue) or b""
            except PayloadRefError as exc:
                later = decide("error", attempt, job.retry.attempts_for(layout.tiers), layout.tiers)
                retry = exc.reason == "payload-store-error" and isinstance(later, RetryLater)
                return self._outcome(layout, delivery, later if retry else Quarantine(exc.reason), attempt, job_id,
                                     job.name, failure=("PayloadRefError", exc.detail, ""))  # fmt: skip
            what = stored_label(delivery.headers)  # a decode error names the stored payload, not the empty body
        try:
            raw = envelope.decode_body(body, delivery.content_type, delivery.content_encoding, what)
        except envelope.DecodeError as exc:
            return self._outcome(layout, delivery, Quarantine(exc.reason), attempt, job_id, job.name,
                                 failure=("DecodeError", exc.detail, ""))  # fmt: skip
        model, frame, watch = job.payload_model, sys._getframe(), self._stalls  # validators, key function: app code
        stall = None if model is None else watch.enter(frame, job.name, job_id, model, "validation")
        try:
            payload = job.validate(raw)
        except ValidationError as exc:
            return self._outcome(layout, delivery, Quarantine("invalid-payload"), attempt, job_id, job.name,
                                 failure=("pydantic.ValidationError", str(exc), ""))  # fmt: skip
        except BaseException as exc:  # a validator's own raise of another kind (app code): refused all the same
            if ends_the_task(exc):
                raise
            return self._outcome(layout, delivery, Quarantine("invalid-payload"), attempt, job_id, job.name,
                                 failure=describe(exc, "its payload model's validation"))  # fmt: skip
        finally:
            watch.leave(stall)
        if job.idempotent and keyed_again(delivery.message_id, delivery.headers, job.key):  # README "Idempotency"
            stall = None if job.key is None else watch.enter(frame, job.name, job_id, job.key, "key")
            try:  # any raise of its key function keys it by the payload, as an Exception does (message_key)
                job_id = unnamed_idempotency_key(job.key, payload, delivery.headers, delivery.body)
            except BaseException as exc:
                if ends_the_task(exc):
                    raise
                job_id = payload_key(delivery.headers, delivery.body)
            finally:
                watch.leave(stall)
            self._say_once(("keyed", job.name), "idempotent job %s without message_id on %s: keyed by its key "
                           "function or payload, so identical ones are one job; set message_id (the job id) on every "
                           "publish (said once per job; first: job id %s)", field_value(job.name), delivery.queue,
                           field_value(job_id))  # fmt: skip
        return payload, job_id


#: What the worker does with an attempt header it can't read, and what the publisher should send.
_ATTEMPT_FIX: Final = "read as attempt 1; send it as a whole number (1 for a new job), or leave it out"


def _job_id(delivery: Received) -> str:
    return delivery.message_id or generated_job_id()
