"""A worker's suspects turn: a job whose starts ended without an outcome runs alone (README "Crash containment").

Every second (at once after registering one) the worker looks at its job queue's suspects
queue; when one waits, it stops consuming, settles everything it holds, and takes the
suspects one at a time, each running with nothing else in the process
(:mod:`amqpjobs.jobs.crash`, :mod:`amqpjobs.jobs.isolation`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING

from amqpjobs.jobs import crash
from amqpjobs.jobs.quarantine import header_text
from amqpjobs.runtime.overruns import Overruns
from amqpjobs.runtime.paced_warnings import PacedWarnings
from amqpjobs.runtime.pausing import OperatorPauses
from amqpjobs.runtime.source_control import SourceControl
from amqpjobs.runtime.sources import Source
from amqpjobs.topology.models import JobQueueLayout
from amqpjobs.wire.errors import in_our_words
from amqpjobs.wire.fetch import QueueFetcher

if TYPE_CHECKING:
    from amqpjobs.runtime.rate_limits import RateLimits

log = logging.getLogger("amqpjobs.worker")

#: Seconds between looks at a job queue's suspects queue.
SUSPECTS_POLL = 1.0
#: Seconds between looks at a suspects queue found missing.
HOLD_PROBE = 5.0
#: Seconds a worker spends at most running suspects before it consumes again (one at least).
SUSPECTS_TURN = 10.0
#: Seconds between two lines saying the suspects look keeps failing (its connection down: a look a second).
SAY_EVERY = 60.0


class SuspectTurns(SourceControl):
    """The suspects turns of :class:`~amqpjobs.runtime.worker.Worker` (its state is the worker's)."""

    _consumers: list[Source]
    _lanes_missing: set[str]
    _held: int
    _suspects_running: int
    _held_changed: asyncio.Event
    _layouts: dict[str, JobQueueLayout]
    _pauses: OperatorPauses
    _rates: RateLimits | None
    _overruns: Overruns

    async def _watch_suspects(self, layout: JobQueueLayout, fetcher: QueueFetcher) -> None:
        """Look for suspects every second (at once after registering one) and run them alone."""
        wait, key = SUSPECTS_POLL, f"running the suspects of {layout.name}"
        paced = PacedWarnings(log, SAY_EVERY)  # a node down fails each look: at once, once a minute, then recovered
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._suspects_signal.wait(), wait)
            self._suspects_signal.clear()
            if self._stop.is_set() or self._gate.suspect_pending or self._pauses.pauses(layout.name):
                continue
            try:
                depth = await fetcher.depth()
                paced.succeeded(key)
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
                if depth and not self._overruns.holds_suspects(layout.name):  # (not beside a thread past its timeout)
                    # a rate-limited suspect that missed its token: look again before a later one
                    wait = await self._run_suspects(layout, fetcher) or SUSPECTS_POLL
            except Exception as exc:  # the connection dropped: the next look tries again
                paced.failed(key, f"failed ({in_our_words(exc)})", "; the next look, a second later, tries again")
        await fetcher.close()

    async def _run_suspects(self, layout: JobQueueLayout, fetcher: QueueFetcher) -> float | None:
        """Stop consuming, settle everything held, then take suspects one at a time and run each alone.

        A rate-limited job's suspect takes a token first (:meth:`.RateLimits.suspect_token`);
        without one the turn ends, and the seconds returned say when to look again.
        """
        if not self._gate.try_alone():
            return None
        try:
            # no new deliveries; what arrives meanwhile (prefetched, or a take answered now) is handed back unstarted
            await asyncio.gather(*(c.pause() for c in self._consumers))
            if self._rates is not None:  # deliveries waiting for a token go back unstarted (counted as held then)
                await self._rates.set_aside(True)
            if not await self._overruns.idle_unless_overrun(self._gate.idle()):
                return None  # a run here passed its timeout in a thread: not now (amqpjobs.runtime.overruns)
            while self._held > self._holding.count:
                self._held_changed.clear()
                await self._held_changed.wait()
            if self._holding.count:
                return None
            # the acks of everything settled so far reach the broker before a suspect can crash
            await asyncio.gather(*(c.settle() for c in self._consumers))
            deadline = time.monotonic() + SUSPECTS_TURN
            while not self._stop.is_set() and not self._pauses.pauses(layout.name) and time.monotonic() < deadline:
                delivery = await fetcher.get()  # its get-ok also settles the previous suspect's ack
                if delivery is None:
                    break
                origin = header_text(delivery.headers.get(crash.WORK_QUEUE))
                delivery.queue = origin if origin in layout.work_queues else layout.work_queues[0]
                if self._rates is not None and (later := await self._rates.suspect_token(layout, delivery)):
                    return later
                self._suspects_running += 1
                try:
                    await self._handle(layout, delivery, alone=True)
                finally:
                    self._suspects_running -= 1
        finally:
            if self._rates is not None:
                await self._rates.set_aside(False)
            self._gate.release_alone()
            if not self._stop.is_set():
                await asyncio.gather(*(c.resume() for c in self._consumers
                                       if not self._holds_any(c) and not self._operator_paused(c)))  # fmt: skip
        return None
