"""A worker's results writer: records of its jobs' states written off the ack path (README "Job status and results").

A bounded in-memory queue emptied by one background task in batches, so a record never
delays a handler nor an ack; the ``running`` record is queued before the handler starts,
the outcome's after the delivery was settled. A batch that can't be written (the store is
down, slow past :data:`WRITE_TIMEOUT`, or the queue is full) is dropped and counted
(``amqpjobs_results_write_failures_total``), never retried: jobs still run and ack; a
warning at most every :data:`WARN_EVERY` s counts the records not written since the
previous one, so the lines add up to the metric.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from amqpjobs.errors import ResultsUnavailableError
from amqpjobs.jobs.outcome import Outcome, Quarantine, RetryLater
from amqpjobs.jobs.results import StateRecord, record_for
from amqpjobs.runtime.logs import field_value
from amqpjobs.runtime.pruning import keep_pruned
from amqpjobs.runtime.results import WRITE_TIMEOUT, ResultsStore, refused_text
from amqpjobs.topology.models import JobQueueLayout

log = logging.getLogger("amqpjobs.results")

#: Records waiting to be written at most; more are dropped (and counted as failed writes).
QUEUE_SIZE = 10_000
#: Records written in one transaction at most.
BATCH = 500
#: Seconds between two warnings about records not written (each line counts those since the previous one).
WARN_EVERY = 10.0


class ResultsWriter:
    """A worker's bounded queue of records to write, emptied in batches by one background task.

    Args:
        store: Where records go.
        failed: Called with the number of records that could not be written (the metric).
        size: Records waiting at most (default :data:`QUEUE_SIZE`); more are dropped and counted.
    """

    def __init__(self, store: ResultsStore, failed: Callable[[int], None] | None = None,
                 size: int = QUEUE_SIZE) -> None:  # fmt: skip
        self.store = store
        self.failed = 0  # records not written, in total
        self._on_failed = failed
        self._queue: asyncio.Queue[StateRecord] = asyncio.Queue(size)
        self._task: asyncio.Task[None] | None = None
        self._warned_at = 0.0
        self._unsaid = 0  # records not written since the last line
        self._why = ""  # the last reason

    def start(self) -> None:
        """Start the background task (on the running loop)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    def note_outcome(self, layout: JobQueueLayout, queue: str, v: Outcome) -> None:
        """Queue the record of a delivery from work queue ``queue`` settled as ``v`` (after its ack; never waits).

        Where the job is now: the tier its retry copy went to, the quarantine, or ``queue``.
        """
        d = v.decision
        where = queue
        if isinstance(d, RetryLater):
            where = layout.tier_queues[queue][d.tier]
        elif isinstance(d, Quarantine):
            where = layout.quarantine_queue
        record = record_for(v, v.value, where, time.time())
        if record is None:
            return
        if record.value_note:
            log.warning("job=%s id=%s: return value %s", field_value(v.job), field_value(v.job_id), record.value_note)
        self.note(record)

    def note(self, record: StateRecord) -> None:
        """Queue ``record`` for writing; never blocks nor raises (a full queue drops it, counted)."""
        try:
            self._queue.put_nowait(record)
        except asyncio.QueueFull:
            self._fail(1, "the write queue is full")

    def _fail(self, count: int, why: str) -> None:
        self.failed += count
        if self._on_failed is not None:
            self._on_failed(count)
        self._unsaid, self._why = self._unsaid + count, why
        if time.monotonic() - self._warned_at >= WARN_EVERY:  # one line per WARN_EVERY, not one per job
            self._say()

    def _say(self) -> None:
        """Warn of every record not written since the last line (none are left unsaid: they add up to the metric)."""
        if self._unsaid:
            log.warning("results store: %d record(s) not written (%s); jobs are not affected", self._unsaid, self._why)
            self._warned_at, self._unsaid = time.monotonic(), 0

    async def _next(self) -> StateRecord:
        """The next record to write; meanwhile, the records not written yet unsaid are said once the pace allows."""
        while self._unsaid:
            try:
                async with asyncio.timeout(max(0.0, self._warned_at + WARN_EVERY - time.monotonic())):
                    return await self._queue.get()
            except TimeoutError:
                self._say()
        return await self._queue.get()

    async def _run(self) -> None:
        while True:
            batch = [await self._next()]
            while len(batch) < BATCH and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            try:
                async with asyncio.timeout(WRITE_TIMEOUT):
                    refused = await self.store.write(batch)
                if refused:  # the others were written
                    self._fail(len(refused), refused_text(refused))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # our own error is whole (it names the operation, path and fix); others cut
                text = str(exc) if isinstance(exc, ResultsUnavailableError) else str(exc)[:200]
                self._fail(len(batch), f"{type(exc).__name__}: {text}")
            finally:
                for _ in batch:
                    self._queue.task_done()

    async def settle(self, wait: float = 5.0) -> None:
        """Wait until each record queued so far is written or counted failed (``wait`` s at most); keep running."""
        if self._task is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._queue.join()

    async def close(self, wait: float = 5.0) -> None:
        """Write what is queued (up to ``wait`` seconds; the rest counts as failed), then stop."""
        if self._task is None:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait):
                await self._queue.join()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None
        if self._queue.qsize():
            self._fail(self._queue.qsize(), "the worker stopped first")
        self._say()


def start_results(
    app: Any, failed: Callable[[int], None] | None, background: list[asyncio.Task[Any]]
) -> ResultsWriter | None:
    """A worker's results store, when ``app`` (an :class:`~amqpjobs.App`) has one: its writer, started.

    ``failed`` (records not written, counted: the worker's metric, or None) is also given to the app,
    so that its handlers' enqueues count their ``queued`` records' failures there too. The store's
    pruner task is appended to ``background`` (the worker cancels those at its stop). None: no store.
    """
    store = app.results
    if store is None:
        return None
    writer = ResultsWriter(store, failed)
    if failed is not None:
        app.results_failed = failed
    writer.start()
    background.append(asyncio.create_task(keep_pruned(store, what="result record(s)")))
    return writer
