"""A worker's stop: no new deliveries, the grace for running handlers, then everything closed in order.

Part of :class:`~amqpjobs.runtime.worker.Worker` (its state is the worker's). The stop's
lines are worded in :mod:`amqpjobs.runtime.draining`; what happens past the grace to a
plain-function handler's thread, which can't be stopped, in
:mod:`amqpjobs.runtime.handler_threads`. An async handler still running at the grace's end
is cancelled; one that has not ended :data:`CANCEL_BOUND` seconds later (it caught the
cancellation and goes on) is treated as such a thread: its delivery must not go back while
it may still run.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from typing import Any, NoReturn

from amqpjobs.exit_codes import exit_code
from amqpjobs.runtime.handler_threads import end_process
from amqpjobs.runtime.hard_closes import HardCloses
from amqpjobs.runtime.overruns import CANCEL_BOUND
from amqpjobs.runtime.suspects import SuspectTurns
from amqpjobs.wire.abc import Connection
from amqpjobs.wire.alarms import blocked_by
from amqpjobs.wire.reset import reset

log = logging.getLogger("amqpjobs.worker")


class WorkerStop(SuspectTurns):
    """:meth:`shutdown` of :class:`~amqpjobs.runtime.worker.Worker` (see the module's docstring)."""

    ready: asyncio.Event
    took_deliveries: bool
    _background: list[asyncio.Task[None]]
    _inflight: set[asyncio.Task[Any]]
    _suspect_tasks: list[asyncio.Task[None]]
    _publishing: Connection | None
    _hard: HardCloses
    stats: Counter[str]
    #: What a start that failed had consumed (``outcomes 2 ack_uncertain; at its stop 2 in-flight job(s)
    #: finished, 2 of them not acked ...``), None
    #: when it took no delivery: its caller says it with why the start failed (:mod:`amqpjobs.runtime.processes`).
    start_cut: str | None = None
    #: The exit code that start's stop had (1: some not acked or abandoned), which a stop before the next start keeps.
    start_cut_code: int = 0

    async def shutdown(self, *, own_process: bool = False, start_failed: bool = False) -> int:
        """Stop consuming, wait up to ``grace`` seconds for in-flight handlers, close.

        Past the grace an async handler is cancelled, and gets :data:`CANCEL_BOUND` seconds to
        end. A plain function's thread can't be stopped, nor can an async handler that goes on
        after its cancellation, and its delivery must not go back to the broker while it may
        still run (its redelivery would run beside it): with ``own_process`` the process then
        ends at once (exit 1, after the stop lines; this never returns), before the consumer
        connection closes; without it (a worker awaited in your program) the connection stays
        open, those deliveries unacked, until they end (:mod:`amqpjobs.runtime.handler_threads`;
        an async run that ends carries out its own outcome).

        Returns:
            0 when all in-flight work finished and was acked, else 1 (also when a job finished
            after its channel closed, so it was not acked and is redelivered, and when a suspect's
            thread past its timeout stopped the worker: :mod:`amqpjobs.runtime.overruns`).

        ``start_failed``: the stop of a start that failed: with ``own_process`` its stopped line is not
        logged (the caller says why the start failed, and may begin it again, :mod:`.processes`); what
        it consumed is :attr:`start_cut`.

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
        code = 1 if self._overruns.hung else 0  # a suspect hung it: exit 1 whatever its thread does (.overruns)
        if self._hard.fatal is not None:  # the broker refuses it at each reconnect (.hard_closes): exit 3
            code = exit_code(self._hard.fatal)
        jobs, suspects = set(self._inflight), self._suspects_running
        watchers = {t for t in self._suspect_tasks if not t.done()}  # one may be running a suspect's job
        draining = self._draining.begin(suspects, self.options.grace)  # handlers started, held deliveries apart
        if self._consumed:
            log.info(draining)
        still: set[asyncio.Task[Any]] = set()
        abandoned = 0
        ends = time.monotonic() + self.options.grace
        if jobs or watchers:
            still = await self._wait_for_runs(jobs | watchers, ends, own_process)
            abandoned = min(suspects, len(still & watchers))  # suspects' jobs; the started ones: the last line
            if still:
                code = 1
                self._draining.grace_over(still, jobs)
                if own_process and self._threads.running:  # end now: in each ms left, a thread may finish its effect
                    for line in self._draining.grace_lines(abandoned):
                        log.warning(line)
                    await self._end_process(self._stopped_line(still, suspects, abandoned, code))
                for task in still:
                    task.cancel()
                _, going_on = await asyncio.wait(still, timeout=CANCEL_BOUND)  # each held delivery's hold ends too
                for line in self._draining.grace_lines(abandoned, () if own_process else going_on):
                    log.warning(line)
                if going_on:
                    log.warning(self._draining.going_on_line(len(going_on), CANCEL_BOUND, own_process))
                    if own_process:
                        await self._end_process(self._stopped_line(still, suspects, abandoned, code))
                    began = time.monotonic()
                    await asyncio.wait(going_on)  # before the channels close: its delivery stays unacked
                    log.info("the cancelled handler(s) ended after %.1fs; closing the connection",
                             time.monotonic() - began)  # fmt: skip
        await self._drop_held_copies()
        if self._draining.not_acked(still):  # finished, but their channel closed first: redelivered, no clean stop
            code = 1
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
        stopped = self._stopped_line(still, suspects, abandoned, code)
        for publisher in (self._publisher, self._quarantiner, self._events):  # their confirms in
            if publisher is not None:
                await publisher.close()
        await self._threads.before_close(own_process, stopped)  # may end the process: no delivery back beside a thread
        for connection in (self._connection, self._publishing):  # the broker requeues what is left unacked
            if connection is not None:
                await connection.close()
        self._threads.close()
        self._hard.cancel()  # a question to the management API about a refused reconnect, still under way
        if stopped is not None and start_failed and own_process:  # the process may start again: no "stopped"
            outcomes = ", ".join(f"{n} {kind}" for kind, n in sorted(self.stats.items())) or "none yet"
            drained = stopped.removeprefix("worker stopped: ").rsplit("; exit ", 1)[0]
            self.start_cut, self.start_cut_code = f"outcomes {outcomes}; at its stop {drained}", code
        elif stopped is not None:
            log.info(stopped)
        return code

    async def _drop_held_copies(self) -> None:
        """Reset the copies' connection when a resource alarm blocks it, so the copies it holds unread are dropped.

        Each is the copy of a delivery not acked (acked only once its copy is confirmed), which goes back to
        its queue: stored once the alarm clears, the copy would carry the decision out beside that redelivery
        (a job both quarantined and run again). A TCP reset makes the broker drop them (:mod:`amqpjobs.wire.reset`);
        a close would wait for the alarm and then store them.
        """
        if self._publishing is None or (alarm := blocked_by(self._publishing)) is None:
            return
        if await reset(self._publishing):  # not when already reset (a marked copy's: .kept_decisions)
            log.warning(
                "a resource alarm (%s) blocked the connection of the worker's copies at the stop: reset, so that the "
                "broker drops the copies it held unread (their deliveries are redelivered) instead of storing them "
                "once the alarm clears beside those redeliveries", alarm,
            )  # fmt: skip

    async def _wait_for_runs(
        self, tasks: set[asyncio.Task[Any]], ends: float, own_process: bool
    ) -> set[asyncio.Task[Any]]:
        """Wait for ``tasks`` until ``ends`` (monotonic seconds: the grace's end); those still running.

        With ``own_process``, a run past its timeout and the grace after it
        (:attr:`.overruns.Overruns.hung_runs`: a thread, or an async handler catching its
        cancellation) is not waited for again: it has had its grace, and only the process's end
        stops it. The wait is for the others, which can still end; with none left (or as soon
        as the last becomes such a run) it ends. Without (a worker awaited in a program, which
        waits for its threads anyway) it waits for every run: one ending is judged by its result.
        """
        hung = self._overruns.hung_runs if own_process else set()
        pending = {t for t in tasks if not t.done()}
        while pending - hung and (left := ends - time.monotonic()) > 0:
            turned = self._overruns.next_hung()  # a run becoming hung meanwhile: look again
            try:
                await asyncio.wait((pending - hung) | {turned}, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            finally:
                turned.cancel()
            pending = {t for t in pending if not t.done()}
        if pending and not pending - hung and ends - time.monotonic() > 0.1:
            log.warning(
                "%d run(s) past their timeout and the grace after it can't be stopped: not waited for again "
                "(they had their grace; only the process's end stops them), %.1fs of the grace left unused",
                len(pending), ends - time.monotonic(),
            )  # fmt: skip
        return pending

    @property
    def _consumed(self) -> bool:
        """Whether the stop gets the draining and stopped lines: ready, or a delivery taken before that.

        A start that failed or was abandoned before any delivery says why instead, or nothing.
        """
        return self.ready.is_set() or self.took_deliveries

    def _stopped_line(self, still: set[asyncio.Task[Any]], suspects: int, abandoned: int, code: int) -> str | None:
        """The stopped worker's last line, None when it never consumed (a failed start says why instead)."""
        waited = len(self._rates.handed_back) if self._rates else 0
        last = self._draining.stopped_line(still, (suspects, abandoned), waited, code)
        if code:
            last += self._overruns.stop_note()
        return last if self._consumed else None

    async def _end_process(self, stopped: str | None) -> NoReturn:
        """Past the grace, runs that can't be stopped: the acks of finished jobs out, then ``stopped``, then exit 1.

        A plain-function thread's warning is logged by :meth:`HandlerThreads.before_close`
        (it ends the process); else (an async handler going on after its cancellation) it
        ends here. Never returns.
        """
        for consumer in self._consumers:
            await consumer.flush_acks()  # the jobs that did finish stay done
        await self._threads.before_close(True, stopped)
        if stopped is not None:
            log.info(stopped)
        end_process(1)
