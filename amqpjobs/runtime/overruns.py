"""Plain-function runs past their timeout, and what they mean for a worker's suspects (README "Crash containment").

A thread can't be stopped, and retrying its job while it still runs could commit the
effect twice, so the worker waits for a plain-function handler past its timeout and
judges the run by its result. A suspect, though, runs alone (nothing else held or
running in the process): a thread past its timeout stands in its way.

* While a run of this worker is past its timeout in a thread, its suspects turns are not
  taken (a turn waits for the running jobs: one that never ends would keep every consumer
  paused for good). The suspects wait in their queue for another worker, or for this one
  once the thread ended; said once per such stretch, as a WARNING.
* A run still going the grace (``--grace``) after its timeout (an async one: after
  :data:`CANCEL_BOUND` s more, as it catches its timeout's cancellation) stops the worker,
  as SIGTERM does (the grace for the run, then the process ends with it): a thread holds a
  slot for good otherwise, and a suspect's holds every queue of the worker (nothing may run
  beside it); only the process's end stops it (Celery's hard time limit likewise ends the
  process). The worker exits 1 whatever the run does meanwhile, so its supervisor
  (``--processes``, systemd, Kubernetes) starts another. A worker that is its process's whole
  life (``amqpjobs consume``) then waits (up to its grace) only for the other runs, which can
  still end: that run has had its timeout and a grace after it (:attr:`Overruns.hung_runs`);
  with none other running the process ends at once, not a second grace later. A worker
  awaited in a program waits the grace for it too: it can't end the process, so it waits for
  the thread anyway, and a run ending in that grace is judged by its result instead of run
  again. A run still going when the process ends is ended with it, and its start counts like a
  crash: a job that hangs every worker reaches ``crashed`` after ``max_redeliveries + 1``
  starts. A run that ends during the stop did finish: it is judged by its result like any
  other (its outcome line, its record and its ack agree), and the lines say the exit 1 is the
  worker's own stop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any

from amqpjobs.runtime.logs import field_value

log = logging.getLogger("amqpjobs.worker")

#: Seconds an async handler gets to end once cancelled (at its timeout, or at the stop's grace): one
#: still running then (it caught the cancellation) is treated as a stuck thread (README "Workers").
CANCEL_BOUND = 1.0


class Overruns:
    """The runs of one worker that went on past their timeout (threads, async handlers catching their cancellation).

    Args:
        grace: Seconds an ordinary such run may go on before it stops the worker (the worker's grace).
    """

    def __init__(self, grace: float) -> None:
        #: Seconds an ordinary run may go on past its timeout before it stops the worker (the worker's grace).
        self.grace = grace
        self.count = 0
        #: Why the worker stops (a suspect's thread past its timeout), or "": it then exits 1.
        self.hung = ""
        #: How that run, ended after all during the stop, was judged ("": it did not end).
        self.hung_ended = ""
        #: That run went past its grace while the worker was stopping already (SIGTERM first), not causing the stop.
        self.hung_in_stop = False
        self._began = asyncio.Event()
        self._said = False  # the suspects' wait was said in this stretch
        #: The tasks of runs still going past their timeout and the grace after it (:meth:`hung_past`):
        #: a stop does not wait for them again (:meth:`~amqpjobs.runtime.stopping.WorkerStop.shutdown`).
        self.hung_runs: set[asyncio.Task[Any]] = set()
        self._next_hung: list[asyncio.Future[None]] = []

    def begin(self, job: str, job_id: str, limit: float, alone: bool, thread: bool = True) -> None:
        """A run went on past its timeout ``limit`` (seconds): counted (no suspects turn meanwhile) and logged.

        ``thread``: a plain-function handler's thread passed its timeout; else an async handler
        still runs :data:`CANCEL_BOUND` s after its timeout's cancellation (it catches it).
        ``alone``: it is a suspect's (nothing else runs meanwhile). It may go on for :attr:`grace`
        seconds more: a run that ends in them is judged by its result; else :meth:`hung_past`.
        """
        self.count += 1
        self._began.set()
        what = "plain-function handler passed its timeout of" if thread else (
            f"async handler went on {CANCEL_BOUND:g}s after its timeout's cancellation, of"
        )  # fmt: skip
        why = "threads can't be cancelled" if thread else "it catches the cancellation"
        log.warning(
            "job %s id %s: %s %gs%s; %s, so the worker waits for it and judges it by its result (for %gs more at "
            "most: then it stops)", field_value(job), field_value(job_id), what, limit,
            " while running alone as a suspect" if alone else "", why, self.grace,
        )  # fmt: skip

    def hung_past(self, job: str, job_id: str, limit: float, thread: bool = True, stopping: bool = False) -> bool:
        """A run is still going :attr:`grace` seconds more (see :meth:`begin`): the worker stops (True).

        ``stopping``: the worker was asked to stop before (SIGTERM, ``request_stop``): its lines say so, not
        that this run stops it, and its exit code is the stop's (0 when every run ended within its grace).
        """
        self.hung, self.hung_in_stop = f"job {job} id {job_id}", stopping
        what = "plain-function handler" if thread else "async handler (it catches its cancellation)"
        stops = "; this worker was asked to stop first" if stopping else (
            ", so this worker stops (exit 1, for its supervisor to start another)")  # fmt: skip
        log.error(
            "job %s id %s: %s still runs %gs past its timeout of %gs; it can't be stopped and holds a slot for "
            "good%s: its process's stop waits up to its grace for the other runs only, then ends with this one, "
            "whose start counts like a crash; if it ends before, it is judged by its result",
            field_value(job), field_value(job_id), what, self.grace, limit, stops,
        )  # fmt: skip
        return True

    def mark_hung(self, task: asyncio.Task[Any] | None) -> None:
        """``task``'s run is past its timeout and the grace after it (:meth:`hung_past`); None: no task known."""
        if task is not None:
            self.hung_runs.add(task)
        for waiter in self._next_hung:
            if not waiter.done():
                waiter.set_result(None)
        self._next_hung.clear()

    def next_hung(self) -> asyncio.Future[None]:
        """A future done at the next :meth:`mark_hung` (a stop waiting for runs looks again then)."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._next_hung = [w for w in self._next_hung if not w.done()]  # those cancelled by their waiter go
        self._next_hung.append(waiter)
        return waiter

    def ended_late(self, job: str, job_id: str, limit: float, past: float, thread: bool = True) -> None:
        """The run that stopped the worker (:meth:`hung_past`) ended ``past`` seconds after its timeout ``limit``.

        A thread's run is judged by its result; an async one's is a timeout (its result is not used).
        """
        self.hung_ended = "judged by its result" if thread else "a timeout, its result not used"
        when, then = ("during this worker's stop (asked first)", "") if self.hung_in_stop else (
            "after this worker began to stop for it", "; the worker still exits 1, as it stopped on its own",
        )  # fmt: skip
        log.warning(
            "job %s id %s: its run ended %.1fs past its timeout of %gs, %s: %s (its outcome line follows)%s",
            field_value(job), field_value(job_id), past, limit, when, self.hung_ended, then,
        )  # fmt: skip

    def stop_note(self) -> str:
        """What the stopped line adds to its exit 1 when a run past its timeout stopped the worker, else ""."""
        if not self.hung:
            return ""
        then = f"; that run then ended, {self.hung_ended}" if self.hung_ended else ""
        if self.hung_in_stop:
            return f" (asked to stop first; {self.hung} went on past its timeout and the grace after it{then})"
        return f" (it stopped on its own for {self.hung}, past its timeout{then})"

    def end(self) -> None:
        """That run ended (its thread returned or raised, its async handler ended)."""
        self.count -= 1
        if not self.count:
            self._began.clear()
            self._said = False

    def holds_suspects(self, job_queue: str) -> bool:
        """Whether a suspects turn of ``job_queue`` must not be taken now (a thread past its timeout runs here)."""
        if not self.count:
            return False
        if not self._said:
            self._said = True
            log.warning(
                "suspects of %s wait: a run of this worker is past its timeout and still runs (a thread, or an "
                "async handler catching its cancellation); they run alone here once it ended, or on another worker",
                field_value(job_queue),
            )  # fmt: skip
        return True

    async def idle_unless_overrun(self, idle: Awaitable[None]) -> bool:
        """Await ``idle`` (the running jobs' end); False as soon as a run passes its timeout in a thread first."""
        if self.count:
            return False
        idling = asyncio.ensure_future(idle)
        overran = asyncio.ensure_future(self._began.wait())
        try:
            await asyncio.wait({idling, overran}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            overran.cancel()
            if not idling.done():
                idling.cancel()
        return idling.done() and not idling.cancelled()
