"""The app's side of the results store (README "Job status and results").

Reading job states back (:meth:`App.job_status`, :meth:`App.result`), and the ``queued``
record of each enqueue: handed to a :class:`~amqpjobs.runtime.results_writer.ResultsWriter` of the
app's own once the broker confirmed the publish, so the store is never on the publish
path (its latency or its failures); a record not written is counted like a worker's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from amqpjobs.durations import duration_argument
from amqpjobs.errors import ConfigurationError
from amqpjobs.jobs.envelope import BLANK_AT_LOOKUP, job_id_problem
from amqpjobs.jobs.results import JobStatus, StateRecord
from amqpjobs.runtime.results import ResultsStore, read_status, wait_result
from amqpjobs.runtime.results_writer import ResultsWriter


class JobResults:
    """The results-store half of :class:`~amqpjobs.runtime.app.App` (its ``results`` and ``name``)."""

    name: str
    results: ResultsStore | None
    #: Called with the number of ``queued`` records not written (a worker sets its metric here).
    results_failed: Callable[[int], None] | None = None
    _queued_writer: tuple[asyncio.AbstractEventLoop, ResultsWriter] | None = None

    def note_queued(self, job: str, job_id: str, queue: str, at: float) -> None:
        """Queue the ``queued`` record of a confirmed enqueue (``at``: when it was enqueued); never waits nor raises.

        Called by :meth:`App.enqueue`, the sync publisher and the scheduler once the broker
        confirmed (or committed) the job; ``queue``: its job queue's name. No-op without a
        results store. The writer lives on the running loop (a new one when the app is used
        from another loop); :meth:`flush_queued` writes what is left.
        """
        if self.results is None:
            return
        loop = asyncio.get_running_loop()
        if self._queued_writer is None or self._queued_writer[0] is not loop or loop.is_closed():
            writer = ResultsWriter(self.results, lambda n: self.results_failed(n) if self.results_failed else None)
            writer.start()
            self._queued_writer = (loop, writer)
        self._queued_writer[1].note(StateRecord(job_id, job, "queued", 0, at, where=queue))

    async def flush_queued(self) -> None:
        """Write the ``queued`` records still waiting (5 s at most; the rest count as failed), then stop the writer.

        :meth:`App.close` and a worker's shutdown (for enqueues from its handlers) call it; a
        writer of another event loop is left alone (it went with its loop).
        """
        held, self._queued_writer = self._queued_writer, None
        if held is not None and held[0] is asyncio.get_running_loop():
            await held[1].close()

    async def settle_queued(self) -> None:
        """Wait until the ``queued`` records noted so far on this loop are written (5 s at most); the writer goes on."""
        held = self._queued_writer
        if held is not None and held[0] is asyncio.get_running_loop():
            await held[1].settle()

    def _results_store(self, job_id: str) -> ResultsStore:
        """The store to look ``job_id`` up in; an id no job can have is refused first (the ``enqueue`` rule)."""
        if problem := job_id_problem(job_id, blank=BLANK_AT_LOOKUP):
            raise ConfigurationError(problem)
        if self.results is None:
            raise ConfigurationError(
                f"app {self.name!r} has no results store: App(..., results=SqliteResults(path) or PostgresResults(url))"
            )
        return self.results

    async def job_status(self, job_id: str) -> JobStatus:
        """The state of job ``job_id`` as the results store has it (README "Job status and results").

        The ``queued`` records of this app's own enqueues (written in the background once the
        broker confirmed) are written first, so a status read right after ``enqueue`` on this
        app reads ``queued`` (up to 5 s of waiting for a slow store); another process's
        enqueue may not be written yet.

        Returns:
            A :class:`~amqpjobs.jobs.results.JobStatus`: ``state`` is ``unknown`` when there is
            no record (never written, pruned, or written while the store was down) or when a
            ``running`` record's lease passed (its worker vanished).

        Raises:
            ConfigurationError: the app has no results store, or ``job_id`` is no job id (empty,
                blank, over 255 UTF-8 bytes: :func:`~amqpjobs.jobs.envelope.job_id_problem`), or a
                reading command's SQLite store file does not exist (a wrong path).
            ResultsUnavailableError: the store can't be read now.
        """
        store = self._results_store(job_id)
        await self.settle_queued()  # this app's own ``queued`` records still waiting are written first
        return await read_status(store, job_id)

    async def result(self, job_id: str, timeout: float | str = 60.0, poll: float | str = 0.2) -> Any:  # noqa: ASYNC109
        # the issue names it ``timeout=``: a polling deadline, not a cancellation scope
        """Wait for job ``job_id`` to reach a terminal state, polling the results store; its return value.

        Args:
            job_id: The job id (what :meth:`enqueue` returned).
            timeout: Seconds (or a duration string) to wait at most.
            poll: Seconds between reads of the store.

        Returns:
            The handler's return value (decoded JSON; None when it returned None). None for a
            job that reads ``duplicate``: acked without running, already done by a run whose
            value was not recorded (one that raised after its ``ctx.transaction()`` committed).

        Raises:
            JobFailedError: the job was quarantined, parked or skipped (``state``, ``reason``, ``error``).
            ResultsUnavailableError: it succeeded but its value was not stored (not JSON, too large).
            TimeoutError: no terminal state in time; the message names the last state seen.
            ConfigurationError: the app has no results store, or ``job_id`` is no job id.
        """
        seconds = duration_argument("App.result(timeout=...)", timeout)
        every = duration_argument("App.result(poll=...)", poll)
        store = self._results_store(job_id)
        await self.settle_queued()
        return await wait_result(store, job_id, seconds, every)
