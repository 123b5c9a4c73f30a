"""The worker's circuit breakers: one state machine per job with a breaker, kept in step across the app.

README "Flow control" -> "Circuit breaker". The rules are :mod:`amqpjobs.jobs.breaker`'s,
the broker objects :mod:`amqpjobs.wire.breakers`'. How the workers of an app agree:

* a counted failure is not counted where it happens: the worker sends a notice, and every
  worker (the sender too) counts the notices it hears, stamped by their senders, so all
  count the same window and open at the same stamp (``opened_at``: the failure that made
  it ``failures``); each writes the open record (the sender of that failure replaces an
  older one), which a worker started later and ``amqpjobs status`` read. Until its own
  notices are back (milliseconds), a start that they would stop waits for them (at most
  :data:`ECHO_WAIT`): one worker never runs a start past the count;
* once the cool-down is over, the next delivery of the job on any worker tries the probe
  lock; the one connection the broker gives it to runs that delivery as the probe (others
  wait, and try the lock again at most once a second, for a prober that died); the winner
  first reads the record: gone means a probe just closed it, a later ``until`` that one
  failed;
* the prober's result: success deletes the record, tells everyone ``closed`` and frees the
  lock; a transient failure writes a new record, tells everyone ``open`` and frees the
  lock; anything else (it did not run, or failed permanently) frees the lock only;
* a probe that runs past its job's timeout has failed then (a plain function's thread
  can't be interrupted: the worker goes on waiting for it, but its late result closes and
  opens nothing); a prober whose connection dropped lost its lock with it (the broker
  deletes it, and another worker may take it): its probe's result closes and opens nothing;
* an opening another worker wrote (the record, an ``open`` notice) whose clock runs ahead
  is cut to one cool-down from now here (:meth:`BreakerMachine.trusted`; logged);
* a delivery told to wait goes to the longest tier that fits in the cool-down left
  (:meth:`BreakerMachine.waiting_tier`), without using an attempt.

Jobs without a breaker cost one attribute test per delivery; with a breaker, a delivery
costs no broker round trip unless it tries the probe lock.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections import deque
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from amqpjobs.errors import AmqpJobsError
from amqpjobs.jobs.breaker import (
    STATE_VALUES,
    BreakerMachine,
    Notice,
    Transition,
    Verdict,
    counts_as_failure,
)
from amqpjobs.jobs.envelope import iso_utc
from amqpjobs.jobs.outcome import Ack, Duplicate, Outcome, RetryLater
from amqpjobs.jobs.registry import JobDef
from amqpjobs.jobs.retry import wait_later
from amqpjobs.printable import logfmt_value
from amqpjobs.runtime.logs import field_value
from amqpjobs.runtime.metrics import WorkerMetrics
from amqpjobs.topology.models import JobQueueLayout
from amqpjobs.topology.naming import breaker_queue_name
from amqpjobs.wire.abc import Connection
from amqpjobs.wire.breakers import BreakerWire, OpenRecord, ProbeHolder, ProbeLock, read_records
from amqpjobs.wire.settings import BrokerSettings

log = logging.getLogger("amqpjobs.worker")

#: Seconds a worker waits before trying a probe lock again that another worker held.
LOCK_RETRY = 1.0
#: Seconds a start waits at most for this worker's own failure notices that would open its breaker.
ECHO_WAIT = 1.0


@dataclass
class _Probe:
    """The probe running here: its job id, its lock, the timer that gives it up at its job's timeout."""

    job_id: str
    lock: ProbeLock
    timer: asyncio.TimerHandle | None


def _when(seconds: float) -> str:
    """``seconds`` as ISO 8601 UTC, or as a number when no date can show it (a log line must not fail)."""
    try:
        return iso_utc(seconds)
    except (OverflowError, ValueError, OSError):
        return f"{seconds!r} (no date)"


class Breakers:
    """The breakers of the jobs a worker runs (build it with :meth:`open`; None when no job has one).

    Attributes:
        history: The last transitions here, oldest first, as ``(job, Transition)`` (tests, debugging).
    """

    def __init__(
        self,
        jobs: Mapping[str, JobDef],
        settings: BrokerSettings,
        metrics: WorkerMetrics | None = None,
        clock: Callable[[], float] = time.time,
        timeouts: Mapping[str, float] | None = None,
    ) -> None:
        self._jobs = dict(jobs)
        self._timeouts = dict(timeouts or {})  # job -> seconds a run may take here (a probe: given up then)
        self._machines = {name: BreakerMachine(job.breaker) for name, job in jobs.items() if job.breaker is not None}
        self._adopted: dict[str, OpenRecord] = {}  # the last record adopted per job, as written
        self._settings = settings
        self._metrics = metrics
        self._clock = clock
        self._wire: BreakerWire | None = None
        self._probing: dict[str, _Probe] = {}  # job -> the probe running here
        self._taking: set[str] = set()  # jobs whose lock is being taken here now
        self._lock_again: dict[str, float] = {}  # job -> when this worker may try its lock again
        self._tasks: set[asyncio.Task[None]] = set()
        self._unheard: dict[str, deque[tuple[float, float]]] = {n: deque() for n in self._machines}  # (stamp, sent)
        self.origin = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.history: deque[tuple[str, Transition]] = deque(maxlen=100)
        for name in self._machines:
            self._gauge(name, "closed")

    @classmethod
    async def open(
        cls,
        jobs: Iterable[JobDef],
        layouts: Mapping[str, JobQueueLayout],
        connection: Connection,
        settings: BrokerSettings,
        metrics: WorkerMetrics | None = None,
        timeouts: Mapping[str, float] | None = None,
    ) -> Breakers | None:
        """The breakers of ``jobs`` served from ``layouts``, listening; None when none has one.

        Reads the open records (management API): a breaker open now starts open here. When
        they can't be read, it says so and starts closed. ``timeouts``: seconds a run of
        each job may take here; a probe running longer is given up as failed.

        Raises:
            BrokerError: the notices' queue or a binding was refused.
        """
        mine = {j.name: j for j in jobs if j.breaker is not None and j.queue in layouts}
        if not mine:
            return None
        board = cls(mine, settings, metrics, timeouts=timeouts)
        board._wire = await BreakerWire.open(connection, sorted({j.queue for j in mine.values()}), board.hear)
        names = {breaker_queue_name(j.queue, j.name): j.name for j in mine.values()}
        try:
            records = await asyncio.to_thread(read_records, settings, names)
        except AmqpJobsError as exc:
            log.warning("breaker records not read (%s): breakers start closed here", exc)
            return board
        for name, record in records.items():
            board.adopt(names[name], record, f" (read from {name} at start)")
        return board

    def adopt(self, job: str, record: OpenRecord, source: str) -> None:
        """Open ``job``'s breaker as ``record`` (written by some worker, maybe on another host) says."""
        machine = self._machines[job]
        self._adopted[job] = record  # as written: read again unchanged, it is no new opening (see _take_probe)
        opened_at, until = self._trusted(
            job, record.opened_at, record.until, source.strip(" ()").removeprefix("read from ") or "a record"
        )
        self._apply(job, machine.opened(opened_at, until, record.failures), source)

    def _trusted(self, job: str, opened_at: float, until: float, source: str) -> tuple[float, float]:
        """:meth:`BreakerMachine.trusted` at now, with a log line when the opening had to be corrected."""
        cut = self._machines[job].trusted(opened_at, until, self._clock())
        if cut != (opened_at, until):
            log.warning("breaker job=%s: the opening from %s says until %s (opened %s); cut to %s: a clock ahead of "
                        "this one's, or a bad value (keep the hosts' clocks in step: NTP)", field_value(job), source,
                        _when(until), _when(opened_at), iso_utc(cut[1]))  # fmt: skip
        return cut

    def state(self, job: str) -> str:
        """The state of ``job``'s breaker here: ``closed``, ``open`` or ``half-open``."""
        return self._machines[job].state

    def machine(self, job: str) -> BreakerMachine:
        """``job``'s state machine here (read only)."""
        return self._machines[job]

    # ------------------------------------------------------------------ before a start
    async def gate(self, job: JobDef, job_id: str, attempt: int, tiers: tuple[float, ...]) -> RetryLater | None:
        """None to start a delivery of ``job`` (``job_id``, ``attempt``) here, else the wait it gets.

        A start may make it the probe: then :meth:`after` must see its outcome. A wait is
        in the longest of ``tiers`` (seconds) that fits in the cool-down left, without
        using an attempt (:meth:`BreakerMachine.waiting_tier`).
        """
        await self._echoes(job.name)
        if await self._verdict(job, job_id) == "start":
            return None
        return wait_later(attempt, tiers, self._machines[job.name].waiting_tier(self._clock(), tiers))

    async def _echoes(self, name: str) -> None:
        """Wait for this worker's own failure notices still on their way when counting them would open it."""
        unheard, deadline = self._unheard[name], time.monotonic() + ECHO_WAIT
        while unheard:
            while unheard and unheard[0][1] < time.monotonic() - ECHO_WAIT:  # lost (no listener): waited for once
                unheard.popleft()
            if time.monotonic() >= deadline or not self._machines[name].would_open(at for at, _ in unheard):
                return
            await asyncio.sleep(0.002)

    async def _verdict(self, job: JobDef, job_id: str) -> Verdict:
        name = job.name
        machine = self._machines[name]
        if name in self._probing or name in self._taking:
            return "wait" if machine.state != "closed" else "start"
        now = self._clock()
        verdict, change = machine.verdict(now)
        self._apply(name, change)
        if verdict != "probe":
            return verdict
        if now < self._lock_again.get(name, 0.0) or self._wire is None:
            return "wait"
        self._taking.add(name)
        try:
            return await self._take_probe(job, job_id, machine)
        finally:
            self._taking.discard(name)

    async def _take_probe(self, job: JobDef, job_id: str, machine: BreakerMachine) -> Verdict:
        assert self._wire is not None
        lock = await self._wire.try_probe(job.queue, job.name, ProbeHolder(job_id, self.origin, self._clock()))
        if lock is None:
            self._lock_again[job.name] = self._clock() + LOCK_RETRY
            return "wait"
        if machine.state == "half-open":  # a notice may have come meanwhile; else ask the record
            record_name = breaker_queue_name(job.queue, job.name)
            try:
                records: dict[str, OpenRecord] | None = await asyncio.to_thread(
                    read_records, self._settings, [record_name]
                )
            except AmqpJobsError as exc:
                log.debug("breaker record %s not read (%s): probing", record_name, exc)
                records = None
            if records is not None and record_name not in records:  # a probe elsewhere closed it just now
                self._apply(job.name, machine.closed(self._clock()))
            elif (
                records is not None
                and records[record_name].until > self._clock()
                and records[record_name] != self._adopted.get(job.name)  # the one waited out (a clock ahead: cut)
                # dated ahead of this clock: no telling when it was written, and this worker has waited out a
                # cool-down of its own (the same opening, from a clock ahead, would add a second one): probe
                and records[record_name].opened_at <= self._clock()
            ):  # a probe failed just now
                self.adopt(job.name, records[record_name], f" (read from {record_name})")
        if machine.state != "half-open":
            await lock.release()
            return "start" if machine.state == "closed" else "wait"
        timeout = self._timeouts.get(job.name, job.timeout)
        timer = None if timeout is None else asyncio.get_running_loop().call_later(timeout, self._overdue, job, job_id)
        self._probing[job.name] = _Probe(job_id, lock, timer)
        log.info("breaker job=%s probe: id=%s runs here (%s)", field_value(job.name), field_value(job_id),
                 self.origin)  # fmt: skip
        return "start"

    # ------------------------------------------------------------------ after an outcome
    def after(self, outcome: Outcome) -> None:
        """Count ``outcome`` (a delivery of a job served here, settled): a failure notice, or the probe's end."""
        machine = self._machines.get(outcome.job)
        if machine is None or self._wire is None:
            return
        job = self._jobs[outcome.job]
        probe = self._probing.get(job.name)
        if probe is not None and probe.job_id == outcome.job_id:
            del self._probing[job.name]
            if probe.timer is not None:
                probe.timer.cancel()
            self._spawn(self._probe_ended(job, machine, outcome, probe.lock))
        elif counts_as_failure(outcome, self._clock(), machine.breaker.window):  # a kept decision's: a recent run's
            at = self._clock()
            self._unheard[job.name].append((at, time.monotonic()))
            self._wire.send(job.queue, Notice("failure", job.name, at, origin=self.origin).encode())

    def _overdue(self, job: JobDef, job_id: str) -> None:
        """The probe ``job_id`` ran past its job's timeout: it failed now (a thread may go on: it can't be stopped)."""
        probe = self._probing.get(job.name)
        if probe is None or probe.job_id != job_id:
            return
        del self._probing[job.name]
        log.warning("breaker job=%s: the probe id=%s runs past its timeout of %gs: it failed; a plain function's "
                    "thread can't be interrupted, and its result, when it returns, closes and opens nothing",
                    field_value(job.name), field_value(job_id),
                    self._timeouts.get(job.name, job.timeout or 0))  # fmt: skip
        self._spawn(self._probe_ended(job, self._machines[job.name], None, probe.lock))

    async def _probe_ended(
        self, job: JobDef, machine: BreakerMachine, outcome: Outcome | None, lock: ProbeLock
    ) -> None:
        """The probe ended with ``outcome`` (None: it ran past its timeout, a failure); free its lock."""
        assert self._wire is not None
        now = self._clock()
        try:
            if not lock.held:  # its connection dropped: the broker deleted the lock, another worker may probe now
                log.warning("breaker job=%s: this worker lost its probe lock during the probe (its connection "
                            "dropped; another worker may have probed meanwhile): the probe's result, %s, closes and "
                            "opens nothing; the next delivery probes", field_value(job.name),
                            outcome.kind if outcome is not None else "overdue")  # fmt: skip
            elif outcome is not None and outcome.ran and isinstance(outcome.decision, Ack | Duplicate):
                self._apply(job.name, machine.closed(now))
                await self._wire.record_closed(job.queue, job.name)  # before the lock goes: a later winner sees it
                self._wire.send(job.queue, Notice("closed", job.name, now, origin=self.origin).encode())
            elif outcome is None or counts_as_failure(outcome):
                change = machine.reopened(now)
                self._apply(job.name, change)
                record = OpenRecord(machine.opened_at, machine.until, 0)  # 0: re-opened by a failed probe
                await self._wire.record_open(job.queue, job.name, record, replace=True)
                self._wire.send(job.queue, Notice("open", job.name, now, machine.until, self.origin).encode())
            else:
                log.info("breaker job=%s: the probe ended %s, which says nothing; the next delivery probes",
                         field_value(job.name), outcome.kind)  # fmt: skip
        finally:
            await lock.release()

    # ------------------------------------------------------------------ notices
    def hear(self, body: bytes) -> None:
        """A notice from a worker of the app (this one too)."""
        notice = Notice.decode(body)
        machine = self._machines.get(notice.job) if notice is not None else None
        if notice is None or machine is None:
            return
        if notice.kind == "failure":  # stamped by its sender; a stamp ahead of this clock counts as now
            if notice.origin == self.origin and (mine := [u for u in self._unheard[notice.job] if u[0] == notice.at]):
                self._unheard[notice.job].remove(mine[0])
            change = machine.failure(min(notice.at, self._clock()))
            self._apply(notice.job, change)
            if change is not None and self._wire is not None:
                job = self._jobs[notice.job]
                record = OpenRecord(change.at, change.until, change.failures)
                self._spawn(self._wire.record_open(job.queue, job.name, record, replace=notice.origin == self.origin))
        elif notice.kind == "open":
            opened_at, until = self._trusted(notice.job, notice.at, notice.until, notice.origin or "a notice")
            self._apply(notice.job, machine.opened(opened_at, until))
        else:
            self._lock_again.pop(notice.job, None)
            self._apply(notice.job, machine.closed(notice.at))

    # ------------------------------------------------------------------ bookkeeping
    def _apply(self, job: str, change: Transition | None, source: str = "") -> None:
        """Log a transition (``source``: where it was learnt), set the gauge, keep it in :attr:`history`."""
        if change is None:
            return
        self.history.append((job, change))
        self._gauge(job, change.state)
        name = logfmt_value(job)
        cool_down = self._machines[job].breaker.cool_down
        if change.state == "open":
            why = f"{change.failures} failure(s) within {self._machines[job].breaker.window:g}s" if change.failures \
                else "the probe failed"  # fmt: skip
            if change.until <= self._clock():  # read from a record whose cool-down is over
                log.warning("breaker job=%s half-open: opened after %s at %s; the cool-down is over; the next delivery "
                            "of the job runs as the probe%s", name, why.replace("the probe failed", "a failed probe"),
                            _when(change.at), source)  # fmt: skip
            else:
                log.warning("breaker job=%s open: %s; no starts until %s (cool-down %gs)%s", name, why,
                            _when(change.until), cool_down, source)  # fmt: skip
        elif change.state == "half-open":
            log.info("breaker job=%s half-open: cool-down over; one delivery runs as the probe", name)
        else:
            log.info("breaker job=%s closed: the probe succeeded", name)

    def _gauge(self, job: str, state: str) -> None:
        if self._metrics is not None:
            self._metrics.breaker_state.labels(job).set(STATE_VALUES[state])  # type: ignore[index]

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Finish pending record writes (up to 5 s), free held probe locks, stop listening."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=5.0)
        for probe in self._probing.values():
            if probe.timer is not None:
                probe.timer.cancel()
            await probe.lock.release()
        self._probing.clear()
        if self._wire is not None:
            await self._wire.close()
