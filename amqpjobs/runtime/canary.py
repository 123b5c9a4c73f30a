"""The canary of a replay: move K jobs first, and go on only if all K succeed.

``replay --canary K`` (:func:`amqpjobs.runtime.replay.replay`) subscribes to the outcome
events (:mod:`amqpjobs.wire.events`) *before* it moves anything, so no outcome can be
missed; it then moves K jobs and waits until each has a final outcome event carrying this
run's replay id: ``succeeded`` (or ``duplicate``, ``ack_uncertain``: the job is done), or a
failure (``retried``, ``quarantined``). A failure is seen at the first failed run, not
after the retry tiers bring the job back to quarantine. Outcomes that are not final
(``deferred``, ``handed_back``, ``redelivered``) are waited past, up to the timeout.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Collection
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from amqpjobs.durations import format_duration
from amqpjobs.errors import ConfigurationError, NotFoundError
from amqpjobs.jobs.events import OutcomeEvent, decode_event
from amqpjobs.jobs.quarantine import ReplayReport
from amqpjobs.printable import printable
from amqpjobs.topology.naming import EVENTS_EXCHANGE
from amqpjobs.wire.abc import Connection
from amqpjobs.wire.events import subscribe_outcomes


@dataclass
class Canary:
    """The first ``size`` jobs of a replay and their outcomes.

    Attributes:
        replay_id: The replay run's id (events of other runs are ignored).
        size: How many jobs are canaries (K >= 1).
        timeout: Seconds to wait for the canaries' outcomes, from the last one's move.
        expected: Job id -> job name of each canary moved so far.
        outcomes: Job id -> its final outcome event.
        judged: Whether :meth:`verdict` ran.

    """

    replay_id: str
    size: int
    timeout: float
    expected: dict[str, str] = field(default_factory=dict)
    outcomes: dict[str, OutcomeEvent] = field(default_factory=dict)
    judged: bool = False
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    def on_body(self, body: bytes) -> None:
        """Note an event when it is a final outcome of one of this run's canaries."""
        event = decode_event(body)
        if event is not None and event.replay_id == self.replay_id and event.final and event.id not in self.outcomes:
            self.outcomes[event.id] = event
            self._changed.set()

    def due(self, launched: int) -> bool:
        """Whether the canaries must be judged before the next move (``launched`` moves so far)."""
        return not self.judged and launched >= self.size

    def expect(self, job_id: str, job: str) -> None:
        """Note a canary being moved."""
        self.expected[job_id] = job

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
        report.stopped_early = bool(report.canary_failures)
        if not report.stopped_early:
            report.phase = "rest"
        return not report.stopped_early

    async def verdict(self) -> list[str]:
        """Wait for every canary's outcome (up to :attr:`timeout`); one line per canary that did not succeed.

        Each line: ``<job id> (<job>): <outcome>: <error or reason>``, or ``no outcome within <timeout>``.
        """
        self.judged = True
        deadline = time.monotonic() + self.timeout
        while not all(job_id in self.outcomes for job_id in self.expected):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except TimeoutError:
                break
        lines = []
        for job_id, job in self.expected.items():
            event = self.outcomes.get(job_id)
            head = f"{printable(job_id)} ({printable(job) or '?'})"
            if event is None:
                lines.append(f"{head}: no outcome within {format_duration(self.timeout)} (is a worker running?)")
            elif event.failed:
                lines.append(f"{head}: {event.outcome}: {printable(event.why())}")
        return lines


@asynccontextmanager
async def watch_canary(connection: Connection, replay_id: str, size: int, wait: float) -> AsyncIterator[Canary]:
    """A :class:`Canary` hearing outcome events for the ``async with`` block (subscribed on entry).

    Args:
        connection: The replay's connection.
        replay_id: The replay run's id.
        size: K, the number of canaries (>= 1).
        wait: Seconds to wait for their outcomes (> 0).

    Raises:
        ConfigurationError: a bad size or timeout, or the events exchange is missing.

    """
    if size < 1:
        raise ConfigurationError(f"--canary must be at least 1 (got {size})")
    if not wait > 0:
        raise ConfigurationError(f"--canary-timeout must be above 0 seconds (got {wait:g})")
    canary = Canary(replay_id, size, wait)
    try:
        watch = await subscribe_outcomes(connection, canary.on_body)  # every job queue: --to may be any
    except NotFoundError:
        raise ConfigurationError(
            f"--canary needs the outcome events exchange {EVENTS_EXCHANGE!r}, which does not exist: apply the "
            "topology (amqpjobs topology apply) and restart the workers, so that they publish outcome events"
        ) from None
    try:
        yield canary
    finally:
        if not watch.is_closed:
            await watch.close()
