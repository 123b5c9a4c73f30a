"""The canary of a replay: move K jobs first, and go on only if all K succeed.

``replay --canary K`` (:func:`amqpjobs.runtime.replay.replay`) subscribes to the outcome
events (:mod:`amqpjobs.wire.events`) *before* it moves anything, so no outcome can be
missed; it then moves K jobs and waits until each has a final outcome event carrying this
run's replay id: ``succeeded`` (or ``duplicate``, ``ack_uncertain``: the job is done), or a
failure (``retried``, ``quarantined``). A failure is seen at the first failed run, not
after the retry tiers bring the job back to quarantine. Outcomes that are not final
(``deferred``, ``handed_back``, ``redelivered``) are waited past, up to the timeout.

Events are a signal, not a record (:mod:`amqpjobs.jobs.events`): a canary without an event
in time is looked for before it is judged. Still in its work queue (no worker took it),
back in quarantine (it failed: a copy reached the quarantine exchange), or neither (most
likely done, its event lost or events off). Only a canary known to have failed counts as
failed (:attr:`Canary.failed`); the replay stops in every case, since none of it is known
to have succeeded.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from amqpjobs.durations import format_duration
from amqpjobs.errors import ConfigurationError, NotFoundError
from amqpjobs.jobs.events import OutcomeEvent, decode_events
from amqpjobs.jobs.quarantine import REPLAY_ID, header_text
from amqpjobs.jobs.replay_plan import ReplayReport
from amqpjobs.printable import printable, shell_quote
from amqpjobs.topology.naming import EVENTS_EXCHANGE, parse_queue_name, paused_flag_name, quarantine_exchange_name
from amqpjobs.wire.abc import Connection
from amqpjobs.wire.browse import Watch, queue_state, watch_exchange
from amqpjobs.wire.events import subscribe_outcomes

#: Seconds a canary seen back in quarantine is given for its event (which says why it failed).
EVENT_GRACE = 2.0
#: The worker metric that counts outcome events not published (:mod:`amqpjobs.runtime.metrics`).
DROPPED_METRIC = "amqpjobs_events_dropped_total"


@dataclass
class Canary:
    """The first ``size`` jobs of a replay and their outcomes.

    Attributes:
        replay_id: The replay run's id (events of other runs are ignored).
        size: How many jobs are canaries (K >= 1).
        timeout: Seconds to wait for the canaries' outcomes, from the last one's move.
        expected: Job id -> job name of each canary moved so far.
        targets: Job id -> the work queue it was moved to.
        outcomes: Job id -> its final outcome event.
        returned: Ids of canaries whose copy reached the quarantine exchange (they failed).
        quarantine: The quarantine queue replayed from.
        connection: Where to look for a canary without an event (None: not looked for).
        failed: Canaries known to have failed, set by :meth:`verdict`.
        judged: Whether :meth:`verdict` ran.

    """

    replay_id: str
    size: int
    timeout: float
    expected: dict[str, str] = field(default_factory=dict)
    targets: dict[str, str] = field(default_factory=dict)
    outcomes: dict[str, OutcomeEvent] = field(default_factory=dict)
    returned: set[str] = field(default_factory=set)
    quarantine: str = ""
    connection: Connection | None = None
    failed: int = 0
    judged: bool = False
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    def on_body(self, body: bytes) -> None:
        """Note an event when it is a final outcome of one of this run's canaries."""
        for event in decode_events(body):
            if event.replay_id == self.replay_id and event.final and event.id not in self.outcomes:
                self.outcomes[event.id] = event
                self._changed.set()

    def on_returned(self, headers: Mapping[str, Any], message_id: str) -> None:
        """Note a message reaching the quarantine exchange: a canary of this run that failed."""
        if header_text(headers.get(REPLAY_ID)) == self.replay_id:
            self.returned.add(message_id)
            self._changed.set()

    def due(self, launched: int) -> bool:
        """Whether the canaries must be judged before the next move (``launched`` moves so far)."""
        return not self.judged and launched >= self.size

    def expect(self, job_id: str, job: str, target: str) -> None:
        """Note a canary being moved to work queue ``target``."""
        self.expected[job_id] = job
        self.targets[job_id] = target

    def drop(self, job_id: str) -> None:
        """Forget canary ``job_id``: its copy did not go (its target vanished under the move): no outcome comes."""
        self.expected.pop(job_id, None)
        self.targets.pop(job_id, None)

    async def judge(
        self, moving: Collection[asyncio.Task[None]], failures: list[BaseException], report: ReplayReport
    ) -> bool:
        """Once the canaries' moves (``moving``) are settled, wait for their outcomes; True when all succeeded.

        Sets ``report.canary_failures`` and ``stopped_early``, or ``phase = "rest"``. False
        at once when a move failed (``failures``; the replay raises it).
        """
        await asyncio.gather(*moving, return_exceptions=True)
        if failures:
            return False
        report.canary_failures = await self.verdict()
        report.canary_moved, report.canary_failed = len(self.expected), self.failed
        report.stopped_early = bool(report.canary_failures)
        if not report.stopped_early:
            report.phase = "rest"
        return not report.stopped_early

    async def verdict(self) -> list[str]:
        """Wait for every canary's outcome (up to :attr:`timeout`); one line per canary that did not succeed.

        Each line: ``<job id> (<job>): <outcome>: <error or reason>``, or, for a canary with no
        event in time, where it is (:meth:`_whereabouts`). Sets :attr:`failed`.
        """
        self.judged = True
        deadline = time.monotonic() + self.timeout
        await self._wait(deadline, lambda job_id: job_id in self.outcomes or job_id in self.returned)
        # a failed canary's quarantine copy can arrive before its event (published after the copy's confirm)
        await self._wait(min(deadline, time.monotonic() + EVENT_GRACE), lambda job_id: job_id in self.outcomes)
        lines = []
        for job_id, job in self.expected.items():
            event = self.outcomes.get(job_id)
            head = f"{printable(job_id)} ({printable(job) or '?'})"
            if event is not None and event.failed:
                self.failed += 1
                lines.append(f"{head}: {event.outcome}: {printable(event.why())}")
            elif event is None:
                failed, where = await self._whereabouts(job_id)
                self.failed += failed
                lines.append(f"{head}: no outcome event within {format_duration(self.timeout)}: {where}")
        return lines

    async def _wait(self, deadline: float, known: Callable[[str], bool]) -> None:
        """Wait until every canary is ``known``, or ``deadline`` (``time.monotonic()``)."""
        while not all(known(job_id) for job_id in self.expected):
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except TimeoutError:
                return

    async def _whereabouts(self, job_id: str) -> tuple[bool, str]:
        """(known to have failed, where it is) of a canary without an event."""
        quarantine = printable(self.quarantine)
        if job_id in self.returned:
            return True, f"it came back to {quarantine}, so it failed (its event was lost)"
        target = self.targets.get(job_id, "")
        state = await queue_state(self.connection, target) if self.connection is not None and target else None
        job_queue = parse_queue_name(target).job_queue if target else ""
        if (
            state is not None and state.messages and self.connection is not None and job_queue
            and await queue_state(self.connection, paused_flag_name(job_queue)) is not None  # its pause flag
        ):  # fmt: skip
            return False, (
                f"no worker took it: job queue {printable(job_queue)} is paused (amqpjobs status says since when "
                f"and why); resume it (amqpjobs resume {shell_quote(job_queue)}), then replay again"
            )
        if state is not None and state.messages and not state.consumers:
            return False, f"no worker took it (still in {printable(target)}, which has no consumer)"
        if state is not None and state.messages:
            where = f"{state.messages} message(s) wait in {printable(target)}; "
            return False, where + "it may not have been taken yet (are the workers busy?), or its event was lost"
        return False, (
            f"not in {printable(target)} nor back in {quarantine}, so most likely done; events may have been "
            f"dropped: see {DROPPED_METRIC} on the workers (or events are off there: {EVENTS_EXCHANGE!r} "
            "re-applied under them)"
        )


@asynccontextmanager
async def watch_canary(
    connection: Connection, replay_id: str, size: int, wait: float, quarantine: str = ""
) -> AsyncIterator[Canary]:
    """A :class:`Canary` hearing outcome events for the ``async with`` block (subscribed on entry).

    Args:
        connection: The replay's connection.
        replay_id: The replay run's id.
        size: K, the number of canaries (>= 1).
        wait: Seconds to wait for their outcomes (> 0).
        quarantine: The quarantine (or parked) queue replayed from: its job queue's
            quarantine exchange is watched for canaries coming back.

    Raises:
        ConfigurationError: a bad size or timeout, or the events exchange is missing.

    """
    if size < 1:
        raise ConfigurationError(f"--canary must be at least 1 (got {size})")
    if not wait > 0:
        raise ConfigurationError(f"--canary-timeout must be above 0 seconds (got {wait:g})")
    canary = Canary(replay_id, size, wait, quarantine=quarantine, connection=connection)
    try:
        watch = await subscribe_outcomes(connection, canary.on_body)  # every job queue: --to may be any
    except NotFoundError:
        raise ConfigurationError(
            f"--canary needs the outcome events exchange {EVENTS_EXCHANGE!r}, which does not exist: apply the "
            "topology (amqpjobs topology apply) and restart the workers, so that they publish outcome events"
        ) from None
    returns: Watch | None = None
    if quarantine:
        exchange = quarantine_exchange_name(parse_queue_name(quarantine).job_queue)
        with contextlib.suppress(NotFoundError):  # no quarantine exchange: a failure is then seen by its event only
            returns = await watch_exchange(connection, exchange, canary.on_returned)
    try:
        yield canary
    finally:
        for each in (watch, returns):
            if each is not None and not each.is_closed:
                await each.close()
