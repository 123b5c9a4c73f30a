"""What a stopping worker drains: the handlers that run, not deliveries that only wait (README "Workers").

At SIGTERM a worker holds deliveries of four kinds: those whose handler runs (it waits
for them, up to its grace), those that will go back unstarted (a rate-limited one waiting
for its token, one taken after the signal, a look-ahead, one whose idempotency claim was
still waiting), those held because their copy can't be published yet (:mod:`.holding`:
the grace, then back to their queue with the connection), and suspects running alone
(counted by the suspects watcher). A held delivery whose handler ran (it finished; its
outcome, say a quarantine, waits for the missing object) is no running job either: it is
counted and worded apart, with the outcome it waits to carry out; so is one carrying out a
decision an earlier run kept (:mod:`.kept_decisions`). Past the grace such a delivery keeps its
decision in a copy on its own queue (or, when that fails, is redelivered and runs again): the
lines say which. Once the stop is set no handler starts but a suspect's
(:meth:`~amqpjobs.runtime.runs.HandlerRuns._start` looks at it last, with no pause before
the start), so the handlers running then are the jobs to drain, exactly. At the grace's end
the jobs still running are cancelled; each is then counted by what became of it: back to its
queue (cancelled, or still running when its process ends), or settled by its own end (an
async handler that caught the cancellation and raised or returned: its outcome, say
``retried``, was carried out). The stop's lines (draining, the grace warnings, stopped) are
worded here, from the same sets.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from amqpjobs.jobs.outcome import handed_back_note


class Draining:
    """A worker's deliveries whose handler started (not yet settled), held ones, and those handed back at its stop."""

    def __init__(self) -> None:
        self.ran: set[asyncio.Task[Any]] = set()  # delivery tasks whose handler started, until they end (settled)
        self.unstarted: set[asyncio.Task[Any]] = set()  # tasks that handed their delivery back while stopping
        #: tasks whose delivery is held (its copy can't be published yet) -> (outcome, what it waits for)
        self.holds: dict[asyncio.Task[Any], tuple[str, str]] = {}
        self._started: set[asyncio.Task[Any]] = set()  # the ``ran`` ones when the drain began
        self._returned = 0  # deliveries never started, still unsettled after the grace: back to their queue
        self._ran_held: set[asyncio.Task[Any]] = set()  # held deliveries that ran, still held after the grace
        self._held_outcomes: dict[asyncio.Task[Any], tuple[str, str]] = {}  # theirs: (outcome, what it waits for)
        self._kept: dict[asyncio.Task[Any], bool] = {}  # of those, whether each kept its decision (kept_decisions)
        self._carried_out: set[asyncio.Task[Any]] = set()  # of those, each whose own copy was confirmed at the end
        self._decided: set[asyncio.Task[Any]] = set()  # tasks carrying out a decision an earlier run kept
        self._held_lines: list[str] = []  # the grace's lines about held deliveries never started
        self._cancelled: set[asyncio.Task[Any]] = set()  # jobs running at the grace's end (cancelled then)
        self._kinds: dict[asyncio.Task[Any], str] = {}  # outcome kinds of the tasks settled while stopping

    def started(self, task: asyncio.Task[Any] | None = None) -> None:
        """A handler starts in this delivery's task (context, handler): a job to drain until it is settled.

        ``task``: the current task, when the caller has it already (else looked up here).
        """
        if task is None:
            task = asyncio.current_task()
        if task is not None and task not in self.ran:
            self.ran.add(task)
            task.add_done_callback(self.ran.discard)

    def settled(self, stopping: bool, kind: str) -> None:
        """The current task's delivery was settled with an outcome of ``kind`` (:attr:`.Outcome.kind`).

        While ``stopping``: one ``handed_back`` counts as unstarted; the kind of each is kept
        (a job cancelled at the grace's end may still end with an outcome of its own).
        """
        if stopping and (task := asyncio.current_task()) is not None:
            self._kinds[task] = kind
            if kind == "handed_back":
                self.unstarted.add(task)

    def carried(self) -> None:
        """The current task carries out a decision an earlier run kept: held, it is one that ran."""
        if (task := asyncio.current_task()) is not None and task not in self._decided:
            self._decided.add(task)
            task.add_done_callback(self._decided.discard)

    def kept(self, task: asyncio.Task[Any], kept: bool) -> None:
        """At the grace's end, ``task``'s held delivery kept its decision in a copy (or, False, could not)."""
        self._kept[task] = kept

    def carried_out(self, task: asyncio.Task[Any]) -> None:
        """At the grace's end, ``task``'s held delivery's own copy, in flight then, was confirmed (and acked)."""
        self._carried_out.add(task)

    @contextmanager
    def holding(self, outcome: str, target: str) -> Iterator[None]:
        """Mark the current task as holding its delivery while its copy can't be published (:mod:`.fallback`).

        ``outcome``: what the copy carries out (``quarantine``, ``retry``, ...); ``target``:
        the queue or exchange it goes to (:func:`amqpjobs.runtime.holding.pending_of`).
        """
        task = asyncio.current_task()
        if task is None:
            yield
            return
        self.holds[task] = (outcome, target)
        try:
            yield
        finally:
            self.holds.pop(task, None)

    def _held_ran(self, tasks: Iterable[asyncio.Task[Any]]) -> str:
        """``1 held delivery (ran; its outcome 'quarantine' waits for work.quarantine)``, or the plural."""
        return self._held_ran_of({t: self.holds[t] for t in tasks if t in self.holds})

    @staticmethod
    def _held_ran_of(outcomes: dict[asyncio.Task[Any], tuple[str, str]]) -> str:
        """:meth:`_held_ran` of ``outcomes`` (task -> (outcome, what it waits for))."""
        pending = Counter(outcomes.values())
        count = sum(pending.values())
        if count == 1:
            [(outcome, target)] = pending
            return f"1 held delivery (ran; its outcome '{outcome}' waits for {target})"
        waits = ", ".join(f"{n} '{outcome}' for {target}" for (outcome, target), n in sorted(pending.items()))
        return f"{count} held deliveries (ran; their outcomes wait: {waits})"

    def begin(self, suspects_running: int, grace: float) -> str:
        """The drain begins (the stop is set, consumers cancelled): its line.

        Counts the jobs to drain (``suspects_running``: suspects' jobs running alone, included)
        and the deliveries held but never started, which get the ``grace`` (seconds) too.
        """
        self._started = set(self.ran)
        held_ran = (self._started | self._decided) & self.holds.keys()  # handler finished, outcome waiting
        running = len(self._started - held_ran) + suspects_running
        line = f"draining {running} in-flight job(s), grace {grace:.0f}s" if running else "draining: no job in flight"
        if held_ran:
            line += f"; {self._held_ran(held_ran)} {'waits' if len(held_ran) == 1 else 'wait'}"
            line += f" up to the grace of {grace:.0f}s"
        held = len(self.holds.keys() - self._started - held_ran)
        if held:
            what = "1 held delivery (never started: its copy can't be published yet) waits" if held == 1 else (
                f"{held} held deliveries (never started: their copies can't be published yet) wait")  # fmt: skip
            line += f"; {what} up to the grace of {grace:.0f}s"
        return line

    def grace_over(self, still: set[asyncio.Task[Any]], jobs: set[asyncio.Task[Any]]) -> None:
        """The grace is over: sort the ``still`` tasks (running jobs, held deliveries) before their cancel.

        ``still``: tasks not done (to be cancelled now; the cancel ends their holds);
        ``jobs``: the delivery tasks at :meth:`begin`. A held delivery is no running job
        (whether its handler ran or never started): one that ran keeps its decision in a copy
        on its queue (:meth:`kept` says whether it could), one never started returns to its queue.
        """
        held_ran = still & (self.ran | self._decided) & self.holds.keys()  # handler finished (maybe in the grace)
        self._ran_held = set(held_ran)
        self._held_outcomes = {t: self.holds[t] for t in held_ran}  # (their holds end with the cancel)
        self._cancelled = (still & self._started) - held_ran
        self._held_lines = []
        self._returned = len((still & jobs) - self._started - held_ran)
        if self._returned == 1:
            self._held_lines.append("1 held delivery (never started) still held after the grace period; it returns "
                                    "to its queue (redelivered)")  # fmt: skip
        elif self._returned:
            self._held_lines.append(f"{self._returned} held deliveries (never started) still held after the grace "
                                    "period; they return to their queues (redelivered)")  # fmt: skip

    def not_acked(self, still: set[asyncio.Task[Any]]) -> int:
        """Jobs of the drain that finished (not in ``still``) but were not acked: their channel closed first.

        Their outcome is ``ack_uncertain`` (a node stopping, the connection lost): the broker
        redelivers them, as it does an abandoned job's, so the stop is no clean one (exit 1).
        """
        return sum(1 for t in self._started - still if self._kinds.get(t) == "ack_uncertain")

    def _ended_anyway(self) -> Counter[str]:
        """Outcome kinds of the jobs cancelled at the grace's end that settled their delivery themselves."""
        return Counter(k for t in self._cancelled if (k := self._kinds.get(t, "abandoned")) != "abandoned")

    def grace_lines(self, suspects: int, still_going: Iterable[asyncio.Task[Any]] = ()) -> list[str]:
        """The warnings once the grace is over (after :meth:`grace_over`) and its jobs were cancelled.

        ``suspects``: suspects' jobs abandoned; ``still_going``: tasks still running after
        their cancellation whose process does not end now (their worker waits for them; none
        when the process ends: they go back with its connection).
        """
        lines = []
        going_on = len(self._cancelled.intersection(still_going))
        running = len(self._cancelled) + suspects
        ended = self._ended_anyway()
        back = running - sum(ended.values()) - going_on
        if running and not ended and not going_on:
            lines.append(f"{running} job(s) still running after the grace period; they will be redelivered")
        elif running:
            parts = [f"{back} will be redelivered"] if back else []
            if ended:
                parts.append(f"{sum(ended.values())} ended anyway ({_kinds(ended)})")
            if going_on:
                parts.append(f"{going_on} {'goes' if going_on == 1 else 'go'} on regardless")
            lines.append(f"{running} job(s) still running after the grace period; cancelled: {', '.join(parts)}")
        return lines + self._held_ran_lines() + self._held_lines

    def _held_ran_lines(self) -> list[str]:
        """The grace's lines about held deliveries that ran: their decisions kept, or lost (redelivered)."""
        lines = []
        held = self._ran_held - self._carried_out
        kept = {t for t in held if self._kept.get(t)}
        if carried := self._ran_held & self._carried_out:
            one = len(carried) == 1
            lines.append(
                f"{self._held_ran_of({t: self._held_outcomes[t] for t in carried})} still held after the grace period; "
                + ("its copy, in flight, was confirmed then: its outcome carried out (the original acked)" if one else
                   "their copies, in flight, were confirmed then: their outcomes carried out (the originals acked)")
            )  # fmt: skip
        for tasks, what in ((kept, "{its} with {outcome} kept (not run again)"),
                            (held - kept, "{its} (redelivered: {outcome} could not be kept, so {runs} "
                                          "again)")):  # fmt: skip
            if tasks:
                one = len(tasks) == 1
                said = self._held_ran_of({t: self._held_outcomes[t] for t in tasks})
                its = "it returns to its queue" if one else "they return to their queues"
                outcome = "its outcome" if one else "their outcomes"
                runs = "it runs" if one else "they run"
                lines.append(
                    f"{said} still held after the grace period; " + what.format(its=its, outcome=outcome, runs=runs)
                )
        return lines

    @staticmethod
    def going_on_line(count: int, bound: float, own_process: bool) -> str:
        """The warning about ``count`` async handlers still running ``bound`` seconds after their cancellation.

        ``own_process``: the process ends at once; else the worker waits for them, its connection open.
        """
        why = f"{count} async handler(s) still running {bound:g}s after their cancellation: "
        if own_process:
            return why + "the process ends at once, before its connection closes, so that none finishes beside " \
                         "its redelivery"  # fmt: skip
        return why + "the worker keeps its connection (their deliveries unacked) until they end, so that none " \
                     "finishes beside its redelivery"  # fmt: skip

    def stopped_line(self, still: set[asyncio.Task[Any]], suspects: tuple[int, int], waited: int, code: int) -> str:
        """The stopped worker's last line.

        ``still``: tasks still running after the grace (cancelled; each counted by what became
        of it, :meth:`grace_over`); ``suspects``: (suspects' jobs running at :meth:`begin`,
        of which abandoned); ``waited``: deliveries that were waiting for a rate limit's token
        (handed back unstarted); ``code``: the exit code.
        """
        finished = len(self._started - still) + suspects[0] - suspects[1]
        ended = self._ended_anyway()  # a job still running here (its process ends now) is abandoned
        abandoned = len(self._cancelled) - sum(ended.values()) + suspects[1]
        note = ""
        if ended:
            n = sum(ended.values())
            note += f", {n} ended after {'its' if n == 1 else 'their'} cancellation ({_kinds(ended)})"
        note += handed_back_note(len(self.unstarted), waited)
        ran_held = self._ran_held - self._carried_out
        if carried := len(self._ran_held) - len(ran_held):
            held_ones = "1 held delivery" if carried == 1 else f"{carried} held deliveries"
            its = "its copy" if carried == 1 else "their copies"
            note += f", {held_ones} (ran) carried out as the grace ended ({its} confirmed)"
        kept = sum(1 for t in ran_held if self._kept.get(t))
        for n, what in ((kept, "with {outcome} kept (not run again)"),
                        (len(ran_held) - kept, "(redelivered: {outcome} not kept, run again)")):  # fmt: skip
            if n:
                held = "1 held delivery" if n == 1 else f"{n} held deliveries"
                outcome = "its outcome" if n == 1 else "their outcomes"
                note += f", {held} (ran) returned to {'its queue' if n == 1 else 'their queues'} " + what.format(
                    outcome=outcome)  # fmt: skip
        if self._returned:
            held = "1 held delivery" if self._returned == 1 else f"{self._returned} held deliveries"
            note += f", {held} returned to {'its queue' if self._returned == 1 else 'their queues'} unstarted " \
                    "(redelivered)"  # fmt: skip
        if unacked := self.not_acked(still):
            its, it = ("its", "it") if unacked == 1 else ("their", "them")
            finished_note = f", {unacked} of them not acked ({its} channel closed: the broker redelivers {it})"
        else:
            finished_note = ""
        return (f"worker stopped: {finished} in-flight job(s) finished{finished_note}, {abandoned} abandoned "
                f"(redelivered){note}; exit {code}")  # fmt: skip


def _kinds(kinds: Counter[str]) -> str:
    """``1 retried, 2 succeeded``: outcome kinds with their counts, by name."""
    return ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items()))
