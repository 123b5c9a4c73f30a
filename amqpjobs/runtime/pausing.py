"""Operator pauses in a worker: which job queues it must not start now (README "Flow control" → "Pause and resume").

``amqpjobs pause N`` leaves a durable flag on the broker and signals every worker
(:mod:`amqpjobs.wire.flags`). A worker's :class:`OperatorPauses`:

* keeps the paused job queues in a set: the delivery path asks :meth:`OperatorPauses.holds_back`
  (a set lookup, no broker round trip) before it starts a job, and a delivery of a paused
  queue is handed back unstarted (``HandBack``: a copy to its work queue, then an ack; no
  redelivered flag, so it never counts toward the crash bound, on every RabbitMQ version).
  The check comes after crash screening: a delivery the broker redelivered is registered
  in the suspects queue as ever (its earlier start did count), and no suspects turn runs
  while its queue is paused. A rate-limited job's delivery is asked at its token instead: its
  :class:`~amqpjobs.runtime.rate_rooms.TokenGate` gives none while paused (what waits there
  goes back without one), so a token taken is a start;
* stops the sources of a paused job queue and the waiting rooms of its rate-limited jobs (no
  new deliveries; jobs running finish and are acked as usual; a source of a queue paused
  when the worker starts is created stopped, so it takes nothing) and starts them again on
  resume, unless something else keeps them stopped: a hold (:mod:`.holding`), a suspects
  turn, or the worker stopping. Conversely the worker
  never resumes a source of an operator-paused queue when a hold or a suspects turn ends;
* takes a signal as news, the flag as the truth: a pause signal holds back at once, a
  resume signal waits for a read that finds the flag gone (a round trip), and every signal
  is followed by such a read. Two operators' ``pause`` and ``resume`` at the same moment
  interleave (A deletes the flag, B declares it and signals, A's resume signal comes last):
  the last signal can contradict the flag, and the read after it sets the worker right
  within milliseconds (a flag found gone after a pause signal: within
  :data:`CONFIRM_GONE`), not at the next recheck 30 s later;
* listens before it reads: signals first, then the flags; again after every reconnect or
  loss of its listener, and every :data:`~amqpjobs.wire.flags.RECHECK` seconds. Whenever the
  listener is down (a lost connection or channel, its queue deleted) nothing is known: every
  source is stopped and every delivery held back until the flags are read again, so
  consumers restored by the reconnect start nothing of a queue paused meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable

from amqpjobs.errors import ConfigurationError, SignalNotSentError
from amqpjobs.printable import printable
from amqpjobs.runtime.metrics import WorkerMetrics
from amqpjobs.topology.models import JobQueueLayout
from amqpjobs.topology.naming import parse_queue_name
from amqpjobs.wire.abc import Connection
from amqpjobs.wire.errors import in_our_words
from amqpjobs.wire.failover_lines import DownSpell
from amqpjobs.wire.flags import (
    MAX_REASON,
    RECHECK,
    PauseFlag,
    SignalNotSent,
    clear_flags,
    look_for_flags,
    set_flags,
)
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.pause_listener import PauseSignals
from amqpjobs.wire.settings import BrokerSettings

log = logging.getLogger("amqpjobs.worker")

#: Seconds before a read that finds a flag gone is read again and believed (``pause`` replaces a flag by a
#: delete and a declare; the resume's own signal needs no such wait).
CONFIRM_GONE = 1.0

#: Stops or starts taking deliveries of one job queue (all its shards).
Switch = Callable[[str], Awaitable[None]]


class OperatorPauses:
    """The operator pauses a worker obeys.

    Args:
        settings: Broker settings (the management API reads reasons).
        pause: Stops the sources of a job queue.
        resume: Starts them again when nothing else keeps them stopped (the worker decides).
        metrics: Where ``amqpjobs_paused`` and ``amqpjobs_paused_since_seconds`` go.
    """

    def __init__(self, settings: BrokerSettings, pause: Switch, resume: Switch,
                 metrics: WorkerMetrics | None = None) -> None:  # fmt: skip
        self._settings = settings
        self._pause = pause
        self._resume = resume
        self._metrics = metrics
        self.flags: dict[str, PauseFlag] = {}  # job queue -> its pause
        self._work: dict[str, str] = {}  # work queue (and job queue) -> job queue
        self._unknown = False  # the signal channel is down: not known whether a pause came
        self._signals: PauseSignals | None = None
        self._connection: Connection | None = None
        self._heard = 0  # signals heard: a read started before the last one is stale
        self._said: dict[str, bool] = {}  # job queue -> its last signal said paused, until a read after it
        self._confirm_wanted = False  # a signal came: read the flags after it
        self._confirming: asyncio.Task[None] | None = None
        self._news = asyncio.Event()  # set by every signal: a read waiting to confirm a flag gone stops waiting
        self._tasks: set[asyncio.Task[None]] = set()
        self._switching = asyncio.Lock()  # one switch at a time, in order
        self._down = DownSpell()  # failed reads said by the down-node rule (not every RECHECK s)

    def holds_back(self, job_queue: str) -> bool:
        """Whether a delivery of ``job_queue`` must be handed back, not started (a set lookup)."""
        return self._unknown or job_queue in self.flags

    def pauses(self, queue: str) -> bool:
        """Whether an operator paused the job queue of work queue (or job queue) ``queue``, or it is not known."""
        return self._unknown or self._work.get(queue, queue) in self.flags

    def flagged(self, queue: str) -> bool:
        """Whether the job queue of work queue (or job queue) ``queue`` is known to be paused (its flag was read)."""
        return self._work.get(queue, queue) in self.flags

    async def start(self, connection: Connection, layouts: Iterable[JobQueueLayout]) -> None:
        """Listen for signals, then read the flags (before the worker creates its sources: a paused one starts stopped).

        Raises:
            BrokerError: the broker refused the signal queue, or the flags could not be read.
        """
        layouts = list(layouts)
        self._work = {w: lay.name for lay in layouts for w in (lay.name, *lay.work_queues)}
        self._connection = connection
        self._signals = PauseSignals(connection, [lay.name for lay in layouts], self._heard_signal,
                                     self._lost, self._back)  # fmt: skip
        await self._signals.start()
        await self._read()
        self._spawn(self._recheck_every())

    def _spawn(self, coro: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _heard_signal(self, job_queue: str, flag: PauseFlag | None) -> None:
        if job_queue not in set(self._work.values()):
            return
        self._heard += 1
        self._news.set()
        self._said[job_queue] = flag is not None
        if flag is not None:  # hold back at once; a resume waits for the read below to find the flag gone
            self._set(job_queue, flag)
        self._confirm_wanted = True
        if self._confirming is None or self._confirming.done():
            self._confirming = asyncio.ensure_future(self._confirm())
            self._tasks.add(self._confirming)
            self._confirming.add_done_callback(self._tasks.discard)

    async def _confirm(self) -> None:
        """Read the flags after the signals heard, until a read comes after the last one."""
        while self._confirm_wanted:
            self._confirm_wanted = False
            try:
                await self._read()
            except Exception as exc:  # the flags can't be read: go by the signals meanwhile
                log.warning("reading the pause flags after a signal failed (%s); going by the signal, and "
                            "reading again in %gs", in_our_words(exc), RECHECK)  # fmt: skip
                for queue, paused in sorted(self._said.items()):
                    if not paused:
                        self._set(queue, None)
                self._said.clear()

    def _lost(self) -> None:
        if not self._unknown:
            log.warning("the channel for pause signals closed: no job starts here until the pause flags are read again")
        self._unknown = True
        for queue in sorted(set(self._work.values())):  # the sources too: no hand-back loop after a reconnect
            self._spawn(self._switch(queue, True))

    def _back(self) -> None:
        self._spawn(self._read_logged())

    async def _read_logged(self) -> None:
        try:
            await self._read()
        except Exception as exc:  # the next recheck tries again; meanwhile deliveries are handed back
            if (tail := self._down.failed(time.monotonic())) is not None:  # a node down: at once, once a minute
                log.warning("reading the pause flags failed (%s); trying again every %gs%s", in_our_words(exc),
                            RECHECK, tail)  # fmt: skip

    async def _read(self) -> None:
        assert self._connection is not None
        heard = self._heard
        resumed = {q for q, paused in self._said.items() if not paused}  # a flag found gone after these: a resume
        queues = sorted(set(self._work.values()))
        found = await look_for_flags(self._settings, self._connection, queues)
        if set(self.flags) - set(found) - resumed and self._heard == heard:  # a resume, or a second pause replacing
            self._news.clear()  # the flag this very moment; a signal meanwhile makes this read stale: the next decides
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._news.wait(), CONFIRM_GONE)
            if self._heard == heard:
                found = await look_for_flags(self._settings, self._connection, queues)
        if self._heard != heard:  # a signal came meanwhile: it is newer than this read, which another follows
            found = {q: f for q, f in self.flags.items()}
        else:
            self._said.clear()
        for queue in sorted(set(self._work.values())):
            self._set(queue, found.get(queue))
        back = self._down.worked(time.monotonic()) or ""  # after failed reads: one line, how long and how many
        if self._unknown or back:
            log.info("pause flags read again%s; paused here: %s", back, ", ".join(sorted(self.flags)) or "none")
        if self._unknown:
            self._unknown = False
            for queue in sorted(set(self._work.values()) - set(self.flags)):  # stopped by _lost
                self._spawn(self._switch(queue, False))

    async def _recheck_every(self) -> None:
        while True:
            await asyncio.sleep(RECHECK)
            await self._read_logged()

    def _set(self, job_queue: str, flag: PauseFlag | None) -> None:
        was = self.flags.get(job_queue)
        if was is not None and flag is not None and flag.since.timestamp() == 0:  # read without the management API:
            flag = was  # the reason and since are not known, the pause is; keep what was known
        if flag is not None:
            self.flags[job_queue] = flag
        else:
            self.flags.pop(job_queue, None)
        if self._metrics is not None:
            self._metrics.paused_as(job_queue, *((None,) if flag is None else (flag.reason, flag.since.timestamp())))
        if was is not None and flag is not None and was != flag:  # paused again: a new reason or since
            log.warning("job queue %s paused again by an operator (reason: %s; since %s)", job_queue,
                        flag.reason or "none given", flag.to_json()["since"])  # fmt: skip
        if (was is None) == (flag is None):
            return
        if flag is not None:
            log.warning("job queue %s paused by an operator (reason: %s; since %s): no new job starts here",
                        job_queue, flag.reason or "none given", flag.to_json()["since"])  # fmt: skip
        else:
            log.info("job queue %s resumed by an operator", job_queue)
        self._spawn(self._switch(job_queue, flag is not None))

    async def _switch(self, job_queue: str, pause: bool) -> None:
        async with self._switching:
            if pause != (job_queue in self.flags or self._unknown):  # changed again meanwhile: that change switches
                return
            with contextlib.suppress(Exception):  # a source whose channel is gone stays as it is
                await (self._pause if pause else self._resume)(job_queue)

    async def close(self) -> None:
        """Stop listening and reading."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._signals is not None:
            await self._signals.close()


def broker_job_queues(settings: BrokerSettings, names: list[str] | None = None) -> list[str]:
    """The job queues of the vhost: those with a suspects queue (the topology declares one per job queue).

    ``names``: the vhost's queue names if already read (else the management API is asked).

    Raises:
        BrokerUnavailableError, ManagementApiError: the management API can't be asked.
    """
    if names is None:
        with ManagementClient(settings) as mgmt:
            names = [str(q["name"]) for q in mgmt.queues(settings.vhost)]
    return sorted({p.job_queue for p in map(parse_queue_name, names) if p.kind == "suspects"})


def _known(settings: BrokerSettings, job_queue: str) -> None:
    with ManagementClient(settings) as mgmt:
        names = [str(q["name"]) for q in mgmt.queues(settings.vhost)]
    known = broker_job_queues(settings, names)
    if job_queue not in known:
        hint = ""
        if (parsed := parse_queue_name(job_queue)).kind != "work" and parsed.job_queue in known:
            shown = printable(repr(job_queue))
            hint = (
                f" ({shown} is a {parsed.kind} queue of job queue {parsed.job_queue!r}: give that name)"
                if job_queue in names
                else f" (job queue {parsed.job_queue!r} has no queue {shown}: give {parsed.job_queue!r})"
            )
        raise ConfigurationError(
            f"no job queue {printable(repr(job_queue))} on vhost {settings.vhost!r}{hint}; its job queues: "
            f"{', '.join(known) or 'none (apply the topology: amqpjobs topology apply)'}"
        )


async def pause(settings: BrokerSettings, job_queue: str, reason: str = "") -> PauseFlag:
    """Pause ``job_queue`` (all its shards) for every worker: ``amqpjobs pause``.

    Returns:
        The pause as stored (a queue paused already gets the new reason and since).

    Raises:
        ConfigurationError: no such job queue on the broker (the message lists them), or
            ``reason`` over :data:`~amqpjobs.wire.flags.MAX_REASON` (500) characters (nothing asked).
        SignalNotSentError: the flag is set, but the broker refused the signal (workers
            notice within :data:`~amqpjobs.wire.flags.RECHECK` seconds); the message says why.
        BrokerUnavailableError, ManagementApiError, BrokerError: the broker can't be asked or refused (nothing changed).
    """
    if len(reason) > MAX_REASON:
        raise ConfigurationError(
            f"the pause reason is {len(reason)} characters; at most {MAX_REASON} are kept: shorten it "
            "(nothing was paused)"
        )
    await asyncio.to_thread(_known, settings, job_queue)
    flags, unsent = await set_flags(settings, [job_queue], reason)
    _say_unsent(unsent, ("paused", "flag set"))
    return flags[0]


def _say_unsent(unsent: SignalNotSent | None, done: tuple[str, str]) -> None:
    if unsent is not None:
        raise SignalNotSentError(
            f"{done[0]} job queue {printable(unsent.job_queue)}: {done[1]}, but the signal could not be sent "
            f"({unsent.why}): workers notice within {RECHECK:g} s", unsent.job_queue, done[0] == "paused",
        )  # fmt: skip


async def resume(settings: BrokerSettings, job_queue: str) -> bool:
    """Resume ``job_queue`` for every worker (``amqpjobs resume``); False when it was not paused (nothing done).

    Raises:
        ConfigurationError: no such job queue on the broker (the message lists them).
        SignalNotSentError: the flag is deleted, but the broker refused the signal (workers
            notice within :data:`~amqpjobs.wire.flags.RECHECK` seconds); the message says why.
        BrokerUnavailableError, ManagementApiError, BrokerError: the broker can't be asked or refused (nothing changed).
    """
    await asyncio.to_thread(_known, settings, job_queue)
    paused, unsent = await clear_flags(settings, [job_queue])
    _say_unsent(unsent, ("resumed", "flag deleted"))
    return bool(paused)
