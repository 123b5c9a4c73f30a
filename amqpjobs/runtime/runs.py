"""Running a job's handler: claim (idempotent jobs), context, timeout, immediate retries, threads.

Part of the worker's one-delivery path (:mod:`.deliveries`); its state is the worker's.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_fixed

from amqpjobs.errors import LedgerUnavailableError
from amqpjobs.jobs import envelope
from amqpjobs.jobs.failure import NO_ERROR, classify, describe, framework_word, message_of, qualname, stops_the_run
from amqpjobs.jobs.outcome import Ack, Decision, Duplicate, HandBack, Outcome, Skip, Skipped
from amqpjobs.jobs.registry import JobContext, JobDef
from amqpjobs.jobs.results import StateRecord
from amqpjobs.jobs.retry import decide, wait_later
from amqpjobs.runtime.deadlines import Deadline, Deadlines
from amqpjobs.runtime.draining import Draining
from amqpjobs.runtime.handler_threads import HandlerThreads
from amqpjobs.runtime.ledger import Claim
from amqpjobs.runtime.logs import field_value
from amqpjobs.runtime.overlap import GUARD_ATTRIBUTE
from amqpjobs.runtime.overruns import CANCEL_BOUND, Overruns
from amqpjobs.runtime.results_writer import ResultsWriter
from amqpjobs.runtime.run_claims import RunClaims
from amqpjobs.runtime.run_transaction import RunTransaction
from amqpjobs.runtime.run_values import overran, rest_of_run, settled, settled_value, unsettled
from amqpjobs.runtime.signals import sigint_raises
from amqpjobs.runtime.stall import StallWatch
from amqpjobs.runtime.worker_config import default_lease
from amqpjobs.topology.models import JobQueueLayout
from amqpjobs.wire.abc import Received

if TYPE_CHECKING:
    from amqpjobs.runtime.app import App
    from amqpjobs.runtime.rate_limits import RateLimits

log = logging.getLogger("amqpjobs.worker")


@dataclass(frozen=True)
class Unread:
    """A stored payload (claim-check) not read yet: :meth:`HandlerRuns._start` reads it once the job is to run.

    ``read()`` gives (the validated payload, its job id), or the outcome when it can't be had.
    """

    read: Callable[[], Awaitable[tuple[Any, str] | Outcome]]


class HandlerRuns(RunClaims):
    """Runs handlers for :class:`~amqpjobs.runtime.worker.Worker` and builds each delivery's :class:`Outcome`."""

    app: App
    _host: str
    _pid: int
    _timeouts: dict[str, float]
    _threads: HandlerThreads  # plain-function handlers' pool and the runs going in it
    _stalls: StallWatch
    _deadlines: Deadlines  # handler timeouts, one loop timer per limit
    _results: ResultsWriter | None
    _rates: RateLimits | None
    _stop: asyncio.Event
    _draining: Draining
    _overruns: Overruns
    _suspects_running: int

    def lease_of(self, job: JobDef) -> float:
        """Seconds a claim on ``job`` holds: its ``lease``, else the worker's default (``default_lease``)."""
        return job.lease if job.lease is not None else default_lease(self._timeouts[job.name], self._overruns.grace)

    @staticmethod
    def _outcome(
        layout: JobQueueLayout,
        delivery: Received,
        decision: Decision,
        attempt: int,
        job_id: str,
        job: str | None = None,
        *,
        failure: tuple[str, str, str] = NO_ERROR,
        ran: bool = False,
        duration: float = 0.0,
        latency: float | None = None,
        timed_out: bool = False,
        started: float = 0.0,
    ) -> Outcome:
        """The outcome of a decision not carried out yet (``job``: None when the delivery names none served here)."""
        return Outcome(
            decision=decision,
            job=job if job is not None else envelope.job_name_of(delivery.type, delivery.headers),
            job_id=job_id,
            attempt=attempt,
            duration=duration,
            acked=False,
            queue=layout.name,
            latency=latency,
            timed_out=timed_out,
            failure=failure,
            ran=ran,
            started=started,
        )

    async def _start(
        self,
        layout: JobQueueLayout,
        delivery: Received,
        job: JobDef,
        payload: Any,
        attempt: int,
        max_attempts: int,
        job_id: str,
        start: int,
        ordinary: bool = True,
        task: asyncio.Task[Any] | None = None,
    ) -> Outcome:
        """Claim (idempotent jobs), build the context and run the handler.

        ``payload``: the validated payload, or an :class:`Unread` stored one, read once the claim
        is had (a duplicate, or a job waiting on a claim or the ledger, reads none). ``start``: the
        start this run is (:func:`amqpjobs.jobs.crash.screen`); after the first, ``ctx.redelivered``
        is true. ``ordinary``: not a suspect running alone; once the worker stops, it does not start
        (its claim, waited for or made, is given up): handed back unstarted
        (:mod:`amqpjobs.runtime.draining`). ``task``: the current task, when
        the caller has it (else looked up here).
        """
        ledger = self.app.ledger if job.idempotent else None
        owner = f"{self._host}:{self._pid}:{uuid.uuid4().hex[:12]}" if ledger is not None else ""
        transaction, owed, lease_end = None, None, 0.0
        if ledger is not None:
            owed, lease = self._owed_of(ledger), self.lease_of(job)
            try:  # an owed release of this key (an earlier run's here) is paid first
                claim = await self._claim(owed, job_id, owner, lease, ordinary)
            except Exception as exc:  # the ledger is down: try again later, without using an attempt
                if not isinstance(exc, LedgerUnavailableError):  # an outage is logged by the ledger, once
                    log.error("job %s id %s: idempotency ledger failed (%s); retrying later",
                              field_value(job.name), field_value(job_id), exc)  # fmt: skip
                later = wait_later(attempt, layout.tiers, start=0 if ordinary else start)
                return self._outcome(layout, delivery, later, attempt, job_id, job.name,
                                     failure=(qualname(exc), message_of(exc), ""))  # fmt: skip
            if claim is None:  # the stop came while the claim waited (a locked or slow ledger): never started
                return self._outcome(layout, delivery, HandBack(), attempt, job_id, job.name)
            if claim is Claim.DONE:
                return self._outcome(layout, delivery, Duplicate(), attempt, job_id, job.name)
            if claim is Claim.BUSY:  # another live claim runs it now: look again after a tier, not a busy loop
                later = wait_later(attempt, layout.tiers, start=0 if ordinary else start)
                why = "another run holds a live claim on this job id (in this worker or another)"
                return self._outcome(layout, delivery, later, attempt, job_id, job.name,
                                     failure=("ClaimBusy", why, ""))  # fmt: skip
            lease_end = time.monotonic() + lease  # then the claim is anyone's: no release is owed past it

            transaction = RunTransaction(ledger, job.name, job_id, owner)

        if isinstance(payload, Unread):  # a stored payload, read now that the job runs (README "Large payloads")
            read = await payload.read()
            if isinstance(read, Outcome):
                if owed is not None:
                    await owed.release(job_id, owner, lease_end)
                return read
            payload = read[0]
        task = asyncio.current_task() if task is None else task  # the drain's and the deadline's, looked up once
        if ordinary:  # no pause from here to the handler's start: a job to drain, unless the stop came first
            if self._stop.is_set():
                if owed is not None:  # a release that fails is owed, paid once the ledger answers
                    await owed.release(job_id, owner, lease_end)
                return self._outcome(layout, delivery, HandBack(), attempt, job_id, job.name)
            self._draining.started(task)
        ctx = JobContext(
            job=job.name,
            job_id=job_id,
            attempt=attempt,
            max_attempts=max_attempts,
            tenant=envelope.tenant_in(delivery.headers),
            queue=delivery.queue,
            redelivered=delivery.redelivered or start > 1,
            enqueued_at=envelope.enqueued_at_of(delivery.headers, delivery.timestamp),
            headers=MappingProxyType(delivery.headers),  # read-only: its copies and evidence are made of them
            ledger_transaction=transaction,
        )
        latency = None
        if attempt == 1 and ctx.enqueued_at is not None:
            latency = time.time() - ctx.enqueued_at.timestamp()
        if self._rates is not None:  # the start uses the rate limit's token it took, if any (README "Rate limits")
            await self._rates.spend()
        started = time.monotonic()
        self._note_running(job, job_id, attempt, delivery.queue)
        try:
            value = await self._run_handler(job, payload, ctx, task)
        except BaseException as exc:  # the handler's raise, of any class: its job's failure, unless it stops the run
            if stops_the_run(exc, task.cancelling() if task is not None else 0, job.is_async and sigint_raises()):
                if owed is not None and job.is_async and isinstance(exc, asyncio.CancelledError):
                    await owed.release(job_id, owner, lease_end)  # (a thread still runs, unstoppable: its claim stays)
                raise  # a worker stopping past its grace, or maybe a real Ctrl-C (embedded, on the loop's thread)
            took = time.monotonic() - started
            guarded = bool(getattr(job.handler, GUARD_ATTRIBUTE, False))  # overlap="skip"
            word = framework_word(exc, guarded=guarded, found_done=transaction is not None and transaction.found_done)
            if word == "skipped" and isinstance(exc, Skipped):  # the overlap guard left it unrun: no attempt used
                if owed is not None:
                    await owed.release(job_id, owner, lease_end)
                return self._outcome(layout, delivery, Skip(exc.reason, exc.subject), attempt, job_id, job.name)
            if word == "duplicate":  # another run did it: this effect rolled back
                return self._outcome(layout, delivery, Duplicate(), attempt, job_id, job.name, ran=True,
                                     duration=took, latency=latency, started=started)  # fmt: skip
            if owed is not None:  # a release that fails is owed, paid once the ledger answers
                await owed.release(job_id, owner, lease_end)
            kind = classify(job.retry.permanent, exc)
            decision = decide(kind, attempt, max_attempts, layout.tiers)
            return self._outcome(layout, delivery, decision, attempt, job_id, job.name,
                                 failure=describe(exc), ran=True, duration=took, latency=latency,
                                 timed_out=kind == "timeout", started=started)  # fmt: skip
        took = time.monotonic() - started
        if owed is not None:  # the run succeeded: a done-mark that fails is owed (answers DONE here meanwhile)
            await owed.done(job_id, owner)
        outcome = self._outcome(layout, delivery, Ack(), attempt, job_id, job.name, ran=True, duration=took,
                                latency=latency, started=started)  # fmt: skip
        outcome.value = value
        return outcome

    def _note_running(self, job: JobDef, job_id: str, attempt: int, work_queue: str) -> None:
        """Queue the ``running`` record (lease: twice the job's timeout here, as the ledger's claim)."""
        if self._results is None:
            return
        now = time.time()
        self._results.note(StateRecord(job_id, job.name, "running", attempt, now, where=work_queue,
                                       lease_until=now + self.lease_of(job)))  # fmt: skip

    async def _run_handler(
        self, job: JobDef, payload: Any, ctx: JobContext, task: asyncio.Task[Any] | None = None
    ) -> Any:
        """Run the handler once, or with ``immediate_retries`` via tenacity, within its timeout; its return value.

        ``task``: the current task, when the caller has it (its timeout cancels it).
        """
        timeout = self._timeouts.get(job.name, job.timeout)
        if job.retry.immediate_retries == 0:
            return await self._run_once(job, payload, ctx, timeout, task)

        def transient(exc: BaseException) -> bool:  # never the run's stop (a cancellation at the grace's end)
            if stops_the_run(exc, task.cancelling() if task is not None else 0, job.is_async and sigint_raises()):
                return False
            done = isinstance(ctx.ledger_transaction, RunTransaction) and ctx.ledger_transaction.found_done
            if framework_word(exc, guarded=bool(getattr(job.handler, GUARD_ATTRIBUTE, False)), found_done=done):
                return False  # a duplicate (done by another run) or a skip: nothing to run again
            if classify(job.retry.permanent, exc) not in ("error", "timeout"):
                return False
            # an idempotent job's run whose transaction committed is not run again; one that rolled back gets a new one
            return not isinstance(ctx.ledger_transaction, RunTransaction) or ctx.ledger_transaction.next_run()

        async for attempt in AsyncRetrying(
            retry=retry_if_exception(transient),
            stop=stop_after_attempt(job.retry.immediate_retries + 1),
            wait=wait_fixed(job.retry.immediate_wait),
            reraise=True,
        ):
            with attempt:
                value = await self._run_once(job, payload, ctx, timeout, task)
        return value

    async def _run_once(
        self, job: JobDef, payload: Any, ctx: JobContext, limit: float | None, task: asyncio.Task[Any] | None = None
    ) -> Any:
        if not job.is_async:
            started = time.monotonic()
            value = await self._run_in_thread(job, payload, ctx, limit)
            if not inspect.isawaitable(value):
                return settled_value(value)
            # a plain function returned an awaitable (a lambda or a sync wrapper around an async def): it is
            # the rest of the run, on the loop (never left unawaited, the body not run, "succeeded")
            return await rest_of_run(job, value, limit, started)
        # an async handler runs on the loop: its frame is registered, so a stall it causes is blamed on it
        stall_key = self._stalls.enter(sys._getframe(), job.name, ctx.job_id, job.handler)
        # cancelled past its limit as by asyncio.timeout, on one loop timer per limit (amqpjobs.runtime.deadlines)
        # (``what``: for a run that goes on after its timeout's cancellation, amqpjobs.runtime.overruns)
        deadline = self._deadlines.start(limit, task, (job.name, ctx.job_id, limit)) if limit is not None else None
        try:
            value = await job.handler(payload, ctx)
            if value is not None and unsettled(value):  # most return None: no checks on the hot path
                value = await settled(value)
        except BaseException as exc:
            if deadline is None:
                raise
            timed_out = deadline.end(exc)  # its own cancellation: the timeout's TimeoutError
            cancelling = task.cancelling() if task is not None else 0
            if not deadline.expired or (not timed_out and stops_the_run(exc, cancelling, sigint_raises())):
                raise  # in time, or another cancellation came too (the stop), or maybe a real Ctrl-C
            # past its timeout: a timeout, whatever the handler raised after the cancellation
            timeout = timed_out or isinstance(exc, TimeoutError)
            raise overran(job, limit, "" if timeout else f"then raised {qualname(exc)}") from (None if timeout else exc)
        finally:
            self._stalls.leave(stall_key)
            if deadline is not None and deadline.counted:  # it went on after its cancellation, and ended now
                self._overruns.hung_runs.discard(deadline.task)
                self._overruns.end()
                if self._overruns.hung == f"job {job.name} id {ctx.job_id}":  # in the stop it caused
                    self._overruns.ended_late(
                        job.name, ctx.job_id, limit or 0, asyncio.get_running_loop().time() - deadline.at, thread=False
                    )
        if deadline is not None:
            deadline.end(None)
            if deadline.expired:  # it caught the cancellation and returned: still a run past its timeout
                raise overran(job, limit, "went on; its result is not used")
            if (late := asyncio.get_running_loop().time() - deadline.at) > 0:  # never cancelled: it held the loop
                log.warning("job %s id %s: ran %.1fs, past its timeout of %gs, never cancelled: the event loop was "
                            "blocked (by this handler if it calls blocking code such as time.sleep; fix: await it, or "
                            "make the handler a plain function); judged by its result, as a thread's run is",
                            field_value(job.name), field_value(ctx.job_id), (limit or 0) + late,
                            limit or 0)  # fmt: skip
        return value

    def _timed_out(self, deadline: Deadline) -> None:
        """An async run was cancelled at its timeout (``Deadlines(on_expired=)``): look again in a second."""
        asyncio.get_running_loop().call_later(CANCEL_BOUND, self._went_on, deadline)

    def _went_on(self, deadline: Deadline) -> None:
        """Still running :data:`CANCEL_BOUND` s after its timeout's cancellation: it catches it (.overruns)."""
        if deadline.ended:
            return
        job, job_id, limit = deadline.what
        deadline.counted = True
        self._overruns.begin(job, job_id, limit, alone=self._suspects_running > 0, thread=False)
        asyncio.get_running_loop().call_later(self._overruns.grace, self._hung_past, deadline)

    def _hung_past(self, deadline: Deadline) -> None:
        if not deadline.ended:
            job, job_id, limit = deadline.what
            if self._overruns.hung_past(job, job_id, limit, thread=False, stopping=self._stop.is_set()):
                self._overruns.mark_hung(deadline.task)  # the stop does not wait for it again
                self._stop.set()

    async def _run_in_thread(self, job: JobDef, payload: Any, ctx: JobContext, limit: float | None) -> Any:
        # A thread can't be interrupted: retrying while it still runs could commit the side
        # effect twice. So the worker waits for it, warns about the overrun, and judges the
        # run by its result.
        # in a copy of this context, as asyncio.to_thread does: the handler sees its span and baggage (tracing)
        run = contextvars.copy_context().run
        future = self._threads.run(run, job.handler, payload, ctx)  # counted until it returns, also once cancelled
        began = time.monotonic()
        if limit is None:
            return await future
        done, _ = await asyncio.wait({future}, timeout=limit)
        if done:
            return future.result()
        self._overruns.begin(job.name, ctx.job_id, limit, alone=self._suspects_running > 0)
        hung = False
        try:
            if not (await asyncio.wait({future}, timeout=self._overruns.grace))[0]:
                hung = self._overruns.hung_past(job.name, ctx.job_id, limit, stopping=self._stop.is_set())
                self._overruns.mark_hung(asyncio.current_task())  # the stop does not wait for it again
                self._stop.set()  # only the process's end stops the thread (amqpjobs.runtime.overruns)
            return await future
        finally:
            self._overruns.hung_runs.discard(asyncio.current_task())
            self._overruns.end()
            if hung and future.done() and not future.cancelled():  # ended in the stop's grace: judged, said so
                # (cancelled: the stop's grace ran out first and abandoned it, the thread still running)
                self._overruns.ended_late(job.name, ctx.job_id, limit, time.monotonic() - began - limit)
