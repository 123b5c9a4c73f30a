"""Leading: the cursors, one tick's plan into jobs and a tick record, the tick transaction.

The leader's part of :class:`~amqpjobs.runtime.scheduler.Scheduler` (design in that
module's docstring). Reading the tick stores is in :mod:`amqpjobs.runtime.tick_store`,
the broker work in :mod:`amqpjobs.wire.ticks`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from typing import Any

from amqpjobs.errors import BrokerError
from amqpjobs.jobs import cron, tick_record
from amqpjobs.jobs.envelope import OutgoingMessage, job_message, with_trace
from amqpjobs.printable import logfmt_value
from amqpjobs.runtime.logs import field_value
from amqpjobs.runtime.paced_warnings import PacedWarnings
from amqpjobs.runtime.scheduled_app import ScheduledApp
from amqpjobs.runtime.tick_events import TickEvent
from amqpjobs.runtime.tick_store import read_tick_record
from amqpjobs.topology.models import JobQueueLayout
from amqpjobs.wire.abc import TickWire
from amqpjobs.wire.connection import server_address

log = logging.getLogger("amqpjobs.scheduler")
_SECOND = timedelta(seconds=1)
#: A job to publish: exchange, routing key, message.
_Job = tuple[str, str, OutgoingMessage]
#: One transaction's worth of a schedule's ticks: what each did, with its job (at most one has one).
_Steps = list[tuple["TickEvent", _Job | None]]


def utc_now() -> datetime:
    """The time now, UTC (the scheduler's clock; the in-memory double gives it a virtual one)."""
    return datetime.now(UTC)


class _NotLeader(Exception):
    """The token was lost before a commit: nothing was published."""


class _Returned(BrokerError):
    """The broker returned a tick's job (no queue bound for it): the :class:`PacedWarnings` key is its destination."""

    def __init__(self, message: str, target: str) -> None:
        super().__init__(message)
        self.target = target


class TickFiring:
    """The leader's work, as a base of :class:`~amqpjobs.runtime.scheduler.Scheduler` (which sets these)."""

    app: ScheduledApp
    replica: str
    stats: Counter[str]
    _wire: TickWire
    _clock: Callable[[], datetime]
    _connection: Any
    #: Seconds before a tick store found empty is read once more (a browsing reader may hold its record).
    reread_after: float = 0.5
    #: Seconds a cursor may be ahead of the clock and be waited for (:func:`cron.rewound_cursor`).
    clock_tolerance: float = 60.0
    _clock_waits: set[str]  # the schedules whose cursor is ahead of the clock, waited for
    _warnings: PacedWarnings
    _schedules: list[cron.Schedule]
    _layouts: dict[str, JobQueueLayout]
    _last: dict[str, tuple[datetime | None, str | None]]
    #: Per schedule: the cursor and the steps whose job the broker returned; tried again first.
    _held: dict[str, tuple[datetime, _Steps]]
    _on_event: Callable[[TickEvent], None] | None
    _lead_task: asyncio.Task[None] | None
    _wakeup: asyncio.Event
    _looked: asyncio.Event
    _looks: int
    _looking: bool

    @property
    def is_leader(self) -> bool:
        """True while this replica holds the leader token."""
        raise NotImplementedError

    @property
    def _who(self) -> str:
        """The start of the replica's warnings (:class:`PacedWarnings` keys)."""
        return f"scheduler replica {self.replica}"

    async def look_now(self) -> None:
        """Make the leader look at the clock now; returns once it has (at once when not leading).

        For a virtual clock (:mod:`amqpjobs.testing`): after moving it, the ticks now due fire.
        """
        if not self.is_leader or self._lead_task is None or self._lead_task.done():
            return
        target = self._looks + (2 if self._looking else 1)  # one under way may have read the clock before
        self._wakeup.set()
        while self._looks < target and self.is_leader and not self._lead_task.done():
            self._looked.clear()
            waiting = asyncio.ensure_future(self._looked.wait())
            await asyncio.wait({waiting, self._lead_task}, return_when=asyncio.FIRST_COMPLETED)
            waiting.cancel()

    async def _load_cursors(self, token: Any) -> dict[str, datetime]:
        cursors: dict[str, datetime] = {}
        for schedule in self._schedules:
            record = await self._read_record(schedule)
            if record is None:
                # A browsing reader may hold the record for a moment: look once more before
                # concluding that the schedule is new.
                await asyncio.sleep(self.reread_after)
                record = await self._read_record(schedule)
            if record is None:
                now = self._clock().replace(microsecond=0)
                baseline = tick_record.TickRecord(schedule.name, now, None, None, now, self.replica)
                await self._commit(token, schedule, [], baseline)
                log.info("schedule %s is new: it fires from %s on", schedule.name, cron.format_tick(now))
                record = baseline
            cursors[schedule.name] = record.cursor
            self._last[schedule.name] = (record.last_fired, record.last_job_id)
        return cursors

    async def _read_record(self, schedule: cron.Schedule) -> tick_record.TickRecord | None:
        assert self._connection is not None
        return await read_tick_record(self._connection, cron.tick_queue(self.app.name, schedule.name), self._wire)

    async def _is_running(self, schedule: cron.Schedule) -> bool:
        assert self._connection is not None
        queue = cron.running_queue(self.app.name, schedule.name)
        # locked: an exclusive marker held by a worker's connection
        found = await self._wire.probe(
            self._connection, queue, f"checking whether schedule {schedule.name!r} runs failed"
        )
        return found != "missing"

    def _job(self, schedule: cron.Schedule, tick: datetime, kind: cron.TickKind, plan: cron.TickPlan) -> _Job:
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
        # the rule of App.enqueue without a tenant
        return *layout.publish_target(job_id), dataclasses.replace(message, headers=headers)

    def _traced(self, spans: ExitStack, job: _Job) -> _Job:
        """``job`` with the trace headers of a ``send`` span entered on ``spans`` (as is without tracing).

        Each tick starts a trace of its own (the span has no parent); the worker's ``process``
        span of the job is its child (README "Tracing").
        """
        tracing = self.app.tracing
        if tracing is None:
            return job
        exchange, routing_key, message = job
        sending = tracing.sending(exchange, routing_key, message.type or "", message.message_id or "",
                                  server_address(self._connection), root=True)  # fmt: skip
        headers = with_trace(message.headers, spans.enter_context(sending))
        return exchange, routing_key, dataclasses.replace(message, headers=headers)

    async def _tick_all(self, now: datetime, cursors: dict[str, datetime], token: Any) -> tuple[datetime | None, bool]:
        """Deal with each schedule's due ticks; one schedule failing never stops the others.

        A schedule whose tick fails (its job can't be built, its transaction failed) is
        logged and tried again at the next look; its cursor stays, so no tick is lost.

        Returns:
            The earliest next tick of the schedules that did not fail (None when all
            failed), and whether a transaction failed: its answer may have been lost, so
            the caller reads the tick stores again before the next look.

        Raises:
            _NotLeader: the token was lost.

        """
        due: list[datetime] = []
        reread = False
        for schedule in self._schedules:
            try:
                await self._tick(schedule, now, cursors, token)
            except _NotLeader:
                raise
            except _Returned as exc:  # keyed by destination: a tick routed elsewhere is no recovery
                reread = True
                self._warnings.failed(exc.target, str(exc), "; its tick waits, the other schedules go on")
                continue
            except Exception as exc:
                reread = reread or isinstance(exc, BrokerError)
                self._warnings.failed(f"{self._who}: schedule {schedule.name}", str(exc), "; its tick waits, the "
                                      "other schedules go on", exc_info=not isinstance(exc, BrokerError))  # fmt: skip
                continue
            self._warnings.succeeded(f"{self._who}: schedule {schedule.name}")
            due.append(schedule.rule.next_after(cursors[schedule.name]))
        return min(due, default=None), reread

    async def _tick(
        self,
        schedule: cron.Schedule,
        now: datetime,
        cursors: dict[str, datetime],
        token: Any,
    ) -> None:
        await self._mind_the_clock(schedule, now, cursors, token)
        held = self._held.get(schedule.name)
        if held is not None and held[0] != cursors[schedule.name]:  # another replica moved the cursor
            del self._held[schedule.name]
            held = None
        why = None if held is None else "target-missing"  # the window waited behind a returned tick
        plan = cron.plan_ticks(schedule, cursors[schedule.name], now)
        if not plan.due:
            return
        running = schedule.overlap == "skip" and await self._is_running(schedule)
        steps: list[tuple[TickEvent, _Job | None]] = []  # the missed window, then the on-time tick
        window = (plan.missed_from, plan.missed_until, why)
        if plan.missed_until is not None:
            if schedule.missed == "skip" or running:
                kind: cron.TickKind = "skipped-missed" if schedule.missed == "skip" else "skipped-overlap"
                steps.append((TickEvent(schedule.name, plan.missed_until, kind, None, *window), None))
            else:
                job_id = cron.tick_id(schedule.name, plan.missed_until)
                steps.append((TickEvent(schedule.name, plan.missed_until, "catch-up", job_id, *window),
                              self._job(schedule, plan.missed_until, "catch-up", plan)))  # fmt: skip
        if plan.on_time is not None:
            fired_id = None if running else cron.tick_id(schedule.name, plan.on_time)
            steps.append((TickEvent(schedule.name, plan.on_time, "skipped-overlap" if running else "fired", fired_id),
                          None if running else self._job(schedule, plan.on_time, "fired", plan)))  # fmt: skip
        # A returned tick holds the schedule: while the next job would go elsewhere (another
        # shard), the returned one is tried again as it was, alone; the ticks after it wait.
        jobs = [job[:2] for _, job in steps if job is not None]
        if held is not None and held[1] and jobs[:1] != [job[:2] for _, job in held[1] if job is not None]:
            await self._commit_steps(schedule, held[1], now, cursors, token)
            self._held[schedule.name] = (cursors[schedule.name], [])  # routed: the next window says why
            return
        self._held.pop(schedule.name, None)  # a return below holds the schedule again
        # One job per transaction: the broker may return one job of a transaction and route
        # another, but a tick record can only say "every tick up to here was dealt with".
        group: list[tuple[TickEvent, _Job | None]] = []
        for step in steps:
            group.append(step)
            if step[1] is not None or step is steps[-1]:
                await self._commit_steps(schedule, group, now, cursors, token)
                group = []

    async def _mind_the_clock(self, schedule: cron.Schedule, now: datetime, cursors: dict[str, datetime],
                              token: Any) -> None:  # fmt: skip
        """Start ``schedule`` again from now when its cursor is far ahead of the clock; say so when waiting for it."""
        cursor = cursors[schedule.name]
        lead = timedelta(seconds=round((cursor - now).total_seconds()))  # whole seconds, as the ticks
        ahead = f"its cursor {cron.format_tick(cursor)} is {lead} ahead of this replica's clock"
        rewound = cron.rewound_cursor(cursor, now, self.clock_tolerance)
        if rewound is not None:
            record = tick_record.TickRecord(schedule.name, rewound, *self._last.get(schedule.name, (None, None)), now,
                                            self.replica)  # fmt: skip
            await self._commit(token, schedule, [], record)
            cursors[schedule.name] = rewound
            self.stats["rewound"] += 1
            log.warning(
                "schedule %s: %s (%s): a clock ran ahead when it was written, or this one was stepped back. "
                "It fires again from %s on, as this clock reaches each tick; the ticks after that which were "
                "enqueued early come again with the same job id (an idempotent job runs once per id)",
                schedule.name, ahead, cron.format_tick(now), cron.format_tick(rewound + _SECOND),
            )  # fmt: skip
        elif cursor > now and schedule.name not in self._clock_waits:
            self._clock_waits.add(schedule.name)
            log.info("schedule %s: %s (at most %gs, SchedulerOptions.clock_tolerance): every tick up to it was "
                     "dealt with; waiting for this clock to reach it", schedule.name, ahead,
                     self.clock_tolerance)  # fmt: skip
        elif cursor <= now:
            self._clock_waits.discard(schedule.name)

    async def _commit_steps(self, schedule: cron.Schedule, steps: _Steps, now: datetime, cursors: dict[str, datetime],
                            token: Any) -> None:  # fmt: skip
        """Commit ``steps`` (at most one job) and the tick record after them; then count them as done.

        Raises:
            _Returned: the job was returned; ``steps`` are held, to be tried again first.
        """
        last_fired, last_job_id = before = self._last.get(schedule.name, (None, None))
        for event, _ in steps:
            if event.job_id is not None:
                last_fired, last_job_id = event.tick, event.job_id
        cursor = steps[-1][0].tick  # a step's tick is the last one it deals with
        record = tick_record.TickRecord(schedule.name, cursor, last_fired, last_job_id, now, self.replica)
        previous = tick_record.TickRecord(schedule.name, cursors[schedule.name], *before, now, self.replica)
        try:
            with ExitStack() as spans:  # with tracing on, a send span per job, ended with the transaction
                jobs = [self._traced(spans, job) for _, job in steps if job]
                await self._commit(token, schedule, jobs, record, previous)
        except _Returned:
            self._held[schedule.name] = (cursors[schedule.name], steps)
            raise
        cursors[schedule.name] = cursor
        self._last[schedule.name] = (last_fired, last_job_id)
        queue = self._layouts[schedule.name].name
        for event, job in steps:
            if job is not None and event.job_id is not None:  # as enqueue's: written once the broker has it,
                # timed when the job was made (before the publish): a worker may start it before this runs
                self.app.note_queued(schedule.job, event.job_id, queue, job[2].timestamp or time.time())
            self._record(event)

    async def _commit(
        self,
        token: Any,
        schedule: cron.Schedule,
        jobs: list[_Job],
        record: tick_record.TickRecord,
        previous: tick_record.TickRecord | None = None,
    ) -> None:
        """Publish ``jobs`` and ``record`` in one transaction, only while ``token`` is held.

        A job the broker returns (``basic.return``: no queue is bound for it) was not
        enqueued, but RabbitMQ returns it only while committing, so ``record`` was stored
        with it: ``previous`` (the record before these ticks) is stored again, and the ticks
        wait for the next look.

        Raises:
            _NotLeader: the token was lost; nothing was published.
            BrokerError: the transaction failed (nothing was published), its answer was lost
                (the caller reads the tick store again before the next try), or a job was
                returned (``previous`` restored; the caller reads it back before the next try).

        """
        messages = [(exchange, routing_key, message, True) for exchange, routing_key, message in jobs]
        returned = await self._transaction(token, schedule, messages, record)
        # one job per transaction (but a cursor's first record): its destination routed or returned
        targets = [f"{self._who}: schedule {schedule.name}: tick jobs to exchange {e!r} key {k!r}" for e, k, _ in jobs]
        if not returned:
            for target in targets:
                self._warnings.succeeded(target)
            return
        if previous is not None:
            await self._transaction(token, schedule, [], previous)
        back = f"its cursor stays at {cron.format_tick(previous.cursor)}" if previous is not None else ""
        raise _Returned(
            f"the broker returned {len(returned)} of {len(jobs)} tick job(s) ({'; '.join(returned)}), "
            f"so none counts as enqueued; {back}",
            "; ".join(targets),
        )

    async def _transaction(
        self,
        token: Any,
        schedule: cron.Schedule,
        messages: list[tuple[str, str, OutgoingMessage, bool]],
        record: tick_record.TickRecord,
    ) -> list[str]:
        """Publish ``messages`` and then ``record`` in one transaction: the messages returned (see :meth:`_commit`)."""
        assert self._connection is not None
        store = OutgoingMessage(
            body=record.to_bytes(),
            content_type="application/json",
            type="amqpjobs.tick-record",
            timestamp=time.time(),
        )
        returned = await self._wire.publish_in_transaction(
            self._connection,
            [*messages, ("", cron.tick_queue(self.app.name, schedule.name), store, False)],
            lambda: self._wire.holds(token),
            what=f"schedule {schedule.name!r}: transaction failed, nothing was published",
            late=f"schedule {schedule.name!r}: no tx.commit-ok within 30s",
        )
        if returned is None:
            raise _NotLeader
        return returned

    def _record(self, event: TickEvent) -> None:
        self.stats[event.kind] += 1
        extra = ""
        if event.missed_from is not None and event.missed_until is not None:
            window = f"{cron.format_tick(event.missed_from)}..{cron.format_tick(event.missed_until)}"
            extra = f" missed={window}" if event.why is None else f" waited={window} why={event.why}"
        log.info(
            "schedule=%s tick=%s id=%s outcome=%s%s",
            logfmt_value(event.schedule), cron.format_tick(event.tick), field_value(event.job_id or "-"), event.kind,
            extra,
        )  # fmt: skip
        if self._on_event is not None:
            self._on_event(event)
