"""What a stopping worker drains: the handlers that run, not deliveries that only wait (README "Workers").

At SIGTERM a worker holds deliveries of three kinds: those whose handler runs (it waits
for them, up to its grace), those that will go back unstarted (a rate-limited one waiting
for its token, one taken after the signal, a look-ahead), and suspects running alone
(counted by the suspects watcher). Once the stop is set no handler starts but a suspect's
(:class:`~amqpjobs.runtime.deliveries.DeliveryPath` looks at it last, with no pause before
the start), so the handlers running then are the jobs to drain, exactly.
"""

from __future__ import annotations

import asyncio
from typing import Any

from amqpjobs.jobs.outcome import handed_back_note


class Draining:
    """A worker's deliveries whose handler started (not yet settled), and those handed back unstarted at its stop."""

    def __init__(self) -> None:
        self.ran: set[asyncio.Task[Any]] = set()  # delivery tasks whose handler started, until they end (settled)
        self.unstarted: set[asyncio.Task[Any]] = set()  # tasks that handed their delivery back while stopping
        self._started: set[asyncio.Task[Any]] = set()  # the ``ran`` ones when the drain began

    def started(self) -> None:
        """A handler starts in this delivery's task (claim, context, handler): a job to drain until it is settled."""
        task = asyncio.current_task()
        if task is not None and task not in self.ran:
            self.ran.add(task)
            task.add_done_callback(self.ran.discard)

    def handed_back(self, stopping: bool, kind: str) -> None:
        """An outcome of ``kind`` was recorded for this task: one handed back while ``stopping`` counts as unstarted."""
        if stopping and kind == "handed_back" and (task := asyncio.current_task()) is not None:
            self.unstarted.add(task)

    def begin(self, suspects_running: int) -> int:
        """The drain begins (the stop is set, consumers cancelled): the jobs to drain, suspects' included."""
        self._started = set(self.ran)
        return len(self._started) + suspects_running

    def stopped_line(self, still: set[asyncio.Task[Any]], suspects: tuple[int, int], waited: int, code: int) -> str:
        """The stopped worker's last line.

        ``still``: tasks still running after the grace (cancelled); ``suspects``: (suspects'
        jobs running at :meth:`begin`, of which abandoned); ``waited``: deliveries that were
        waiting for a rate limit's token (handed back unstarted); ``code``: the exit code.
        """
        finished = len(self._started - still) + suspects[0] - suspects[1]
        abandoned = len(still & self._started) + suspects[1]
        note = handed_back_note(len(self.unstarted), waited)
        return (f"worker stopped: {finished} in-flight job(s) finished, {abandoned} abandoned (redelivered)"
                f"{note}; exit {code}")  # fmt: skip
