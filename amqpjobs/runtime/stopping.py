"""A worker's stop: no new deliveries, the grace for running handlers, then everything closed in order.

Part of :class:`~amqpjobs.runtime.worker.Worker` (its state is the worker's). The stop's
lines are worded in :mod:`amqpjobs.runtime.draining`; what happens past the grace to a
plain-function handler's thread, which can't be stopped, in
:mod:`amqpjobs.runtime.handler_threads`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from amqpjobs.runtime.suspects import SuspectTurns
from amqpjobs.wire.abc import Connection

log = logging.getLogger("amqpjobs.worker")


class WorkerStop(SuspectTurns):
    """:meth:`shutdown` of :class:`~amqpjobs.runtime.worker.Worker` (see the module's docstring)."""

    ready: asyncio.Event
    _background: list[asyncio.Task[None]]
    _inflight: set[asyncio.Task[Any]]
    _suspect_tasks: list[asyncio.Task[None]]
    _publishing: Connection | None

    async def shutdown(self, *, own_process: bool = False) -> int:
        """Stop consuming, wait up to ``grace`` seconds for in-flight handlers, close.

        Past the grace an async handler is cancelled. A plain function's thread can't be, and
        its delivery must not go back to the broker while it may still run (its redelivery
        would run beside it): with ``own_process`` the process then ends at once (exit 1,
        after the stop lines; this never returns), before the consumer connection closes;
        without it (a worker awaited in your program) the connection stays open, those
        deliveries unacked, until the threads end (:mod:`amqpjobs.runtime.handler_threads`).

        Returns:
            0 when all in-flight work finished, else 1.

        """
        self._stop.set()
        self._stalls.stop()
        self._suspects_signal.set()
        for task in self._background:
            task.cancel()
        try:  # then what is handed back (arrived meanwhile, or waiting for a token) is not taken again here
            await asyncio.gather(*(consumer.cancel() for consumer in self._consumers))
        finally:
            self._took_last.set()
            if self._rates is not None:
                self._rates.release()
        await asyncio.sleep(0)
        code = 0
        jobs, suspects = set(self._inflight), self._suspects_running
        watchers = {t for t in self._suspect_tasks if not t.done()}  # one may be running a suspect's job
        draining = self._draining.begin(suspects, self.options.grace)  # handlers started, held deliveries apart
        if self.ready.is_set():  # it consumed (a failed start says why instead)
            log.info(draining)
        still: set[asyncio.Task[Any]] = set()
        abandoned = 0
        ends = time.monotonic() + self.options.grace
        if jobs or watchers:
            _, still = await asyncio.wait(jobs | watchers, timeout=self.options.grace)
            abandoned = min(suspects, len(still & watchers))  # suspects' jobs; the started ones: the last line
            if still:
                for line in self._draining.grace_lines(still, jobs, abandoned):
                    log.warning(line)
                code = 1
                if own_process and self._threads.running:  # end now: in each ms left, a thread may finish its effect
                    for consumer in self._consumers:
                        await consumer.flush_acks()  # the jobs that did finish stay done
                    waited = len(self._rates.handed_back) if self._rates else 0
                    last = self._draining.stopped_line(still, (suspects, abandoned), waited, code)
                    await self._threads.before_close(True, last if self.ready.is_set() else None)
                for task in still:
                    task.cancel()
                await asyncio.wait(still)  # each held delivery's hold ends before the channels close
        await self._settle_late_claims(ends)  # released as they come, before the ledger closes
        await self._settle_owed()  # ledger writes owed here (releases, done-marks): one more try
        await self._holding.close()
        await self._pauses.close()
        if self._breakers is not None:
            await self._breakers.close()
        if self._results is not None:
            await self._results.close()
            await self.app.flush_queued()  # the ``queued`` records of enqueues from its handlers
        for consumer in self._consumers:
            await consumer.flush_acks()
        waited = len(self._rates.handed_back) if self._rates else 0
        last = self._draining.stopped_line(still, (suspects, abandoned), waited, code)
        stopped = last if self.ready.is_set() else None  # it consumed: say that it is gone (a failed start says why)
        for publisher in (self._publisher, self._quarantiner, self._events):  # their confirms in
            if publisher is not None:
                await publisher.close()
        await self._threads.before_close(own_process, stopped)  # may end the process: no delivery back beside a thread
        for connection in (self._connection, self._publishing):  # the broker requeues what is left unacked
            if connection is not None:
                await connection.close()
        self._threads.close()
        if stopped is not None:
            log.info(stopped)
        return code
