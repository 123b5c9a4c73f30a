"""The console's actions (replay, park, unpark, purge) as runs the pages follow, each ending in the audit log.

An action is the library's own function (:func:`amqpjobs.runtime.replay.replay` with its
canary, :func:`amqpjobs.runtime.parking.park` and ``unpark``, :func:`amqpjobs.runtime.parking.purge_matching`),
started as a task of the server's event loop: it takes the queue's mover lock like the CLI's,
so a second mover, on the page or in a shell, is refused with the first one named. Its report
object is filled as it goes and read by the progress page. Stop cancels it as Ctrl-C cancels
the CLI's: the moves under way are cut short (a copy already sent stays where it went while its
original returns: a job in flight may now be in both places, a duplicate, never a loss), and
the held messages return.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from amqpjobs.console.audit import AuditEntry, AuditLog, now_iso
from amqpjobs.errors import AmqpJobsError
from amqpjobs.jobs.census import Census
from amqpjobs.jobs.holding_moves import DONE, MoveOptions
from amqpjobs.jobs.quarantine import Selection
from amqpjobs.jobs.replay_plan import ReplayOptions, ReplayReport, replay_window
from amqpjobs.printable import printable
from amqpjobs.runtime.mover_names import acting_as
from amqpjobs.runtime.parking import TakeReport, park, purge_matching, unpark
from amqpjobs.runtime.quarantine import queue_depth
from amqpjobs.runtime.replay import replay
from amqpjobs.runtime.results import ResultsStore
from amqpjobs.topology.models import JobQueueLayout
from amqpjobs.wire.settings import BrokerSettings
from amqpjobs.wire.urls import redact_text

#: Runs kept for their pages (the oldest finished ones go first).
KEPT_RUNS = 200
#: Action forms whose nonce is remembered (a re-sent one is refused); the oldest go first.
FORMS_KEPT = 10000
#: Seconds to read what a failed or stopped action left in its queue (the broker may be the failure).
LEFT_TIMEOUT = 5.0


@dataclass
class ActionRun:
    """One action and where it stands.

    Attributes:
        id: Its id (in its page's address).
        kind: ``replay``, ``park``, ``unpark`` or ``purge``.
        queue: The queue acted on.
        params: What was asked (JSON-ready; shown and audited).
        who / client: Who asked, from which address.
        state: ``running``, ``done``, ``stopped`` (someone pressed Stop), ``canary failed`` (the rest
            stay in quarantine) or ``failed``; set as soon as the action ends.
        settled: Its end is written down: what is left read (after a failure or a Stop), the audit
            line written. A page polls until then.
        summary: What happened, once it ended.
        details: More lines (a failed canary's jobs and why).
        replay: The replay's report (replay only).
        take: The park, unpark or filtered purge's report.
        canary: K of a canary replay, None without.
        census: What the action looked at: the queue's depth at its start and the messages looked at.
        stopped_by: Who pressed Stop ("" when nobody did).
        left_now: The queue's depth read after a failure or a stop (None: not read).

    """

    id: str
    kind: str
    queue: str
    params: dict[str, Any]
    who: str
    client: str
    state: str = "running"
    settled: bool = False
    summary: str = ""
    details: list[str] = field(default_factory=list)
    replay: ReplayReport | None = None
    take: TakeReport | None = None
    canary: int | None = None
    census: Census = field(default_factory=Census)
    stopped_by: str = ""
    left_now: int | None = None
    started: float = field(default_factory=time.time)

    def figures(self) -> tuple[int, int, int | None]:
        """(moved, skipped, left in the queue): left is what the queue holds now, None when not known.

        While it runs: the depth at its start less what it moved (the held messages return);
        once done: the depth the action read at its end; after a failure or a Stop: the depth
        read then (:attr:`left_now`), never the 0 of a figure not filled in.
        """
        moved, skipped, left = 0, 0, None
        if self.replay is not None:
            moved, skipped, left = self.replay.replayed, self.replay.skipped, self.replay.left
        if self.take is not None:
            moved, skipped, left = self.take.taken, self.take.kept, self.take.left
        if self.state == "running":
            left = self.census.depth - moved if self.census.queue else None
        elif self.state == "failed" or self.stopped_by:
            left = self.left_now
        return moved, skipped, left

    def asked(self) -> list[tuple[str, str]]:
        """What was asked (:attr:`params`) as the page shows it: (name, text) pairs, an empty canary as ``no canary``.

        The audit keeps :attr:`params` as they are (JSON ``null`` for no canary).
        """
        return [(k, "no canary" if k == "canary" and v is None else str(v)) for k, v in self.params.items()]

    def moved_ids(self) -> list[str]:
        """The job ids moved (replay, park, unpark) or deleted (purge), in order; messages without one are left out."""
        if self.replay is not None:
            return [job_id for job_id, _ in self.replay.moves if job_id]
        return [job_id for job_id in (self.take.job_ids if self.take else []) if job_id]

    def progress(self) -> dict[str, Any]:
        """Where it stands, for the progress page (JSON).

        ``looked`` of ``total`` (the queue's depth at the start) is how far it went through the
        queue; ``bar`` is [value, max] of the page's progress bar, full once it is done.
        """
        moved, skipped, left = self.figures()
        total = self.census.depth if self.census.queue else None
        looked = self.census.looked_at
        most = max(total or 0, looked, 1)
        doc: dict[str, Any] = {"id": self.id, "kind": self.kind, "queue": self.queue, "state": self.state,
                               "settled": self.settled,
                               "summary": self.summary, "details": self.details, "stopped_by": self.stopped_by,
                               "moved": moved, "skipped": skipped, "left": left, "looked": looked, "total": total,
                               "bar": [most if self.state == "done" else min(looked, most), most]}  # fmt: skip
        if self.replay is not None:
            r = self.replay
            doc.update(phase=r.phase, canary=self.canary, canary_moved=r.canary_moved, elapsed=round(r.elapsed, 2))
        if self.take is not None:
            doc.update(target=self.take.target)
        return doc


class Actions:
    """Starts actions, keeps their runs and stops them (one console process)."""

    def __init__(
        self, broker: BrokerSettings, audit: AuditLog, results: ResultsStore | None = None,
        layouts: Mapping[str, JobQueueLayout] | None = None, idempotent: frozenset[str] = frozenset(),
        job_queues: Mapping[str, str] | None = None, app: str = "",
    ) -> None:  # fmt: skip
        """``results``: the app's results store (``--app``): each moved job's new state is recorded there.

        ``layouts``: the app's job queue layouts (``--app``): a replay re-routes jobs of dropped shards.
        ``idempotent``: the app's idempotent job names (:attr:`~amqpjobs.jobs.replay_plan.ReplayOptions.idempotent`).
        ``job_queues``, ``app``: the app's jobs (name -> job queue) and its name (``--app``): a replay leaves
        a job the app does not serve there in quarantine, named (:func:`~amqpjobs.jobs.replay_plan.unserved`).
        """
        self.job_queues, self.app = job_queues, app
        self.layouts = layouts
        self.idempotent = idempotent
        self.broker = broker
        self.audit = audit
        self.results = results
        self.runs: dict[str, ActionRun] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._bodies: dict[str, asyncio.Future[str]] = {}
        #: Each action form's nonce sent -> the action it started (the last :data:`FORMS_KEPT`).
        self.sent_forms: dict[str, str] = {}

    def form_sent(self, nonce: str, run_id: str) -> None:
        """Remember that the form of ``nonce`` started action ``run_id`` (its nonce is refused from now on)."""
        self.sent_forms[nonce] = run_id
        while len(self.sent_forms) > FORMS_KEPT:
            del self.sent_forms[next(iter(self.sent_forms))]

    def start_replay(self, queue: str, chosen: Selection, rate: float, canary: int | None, canary_timeout: float,
                     params: dict[str, Any], who: str, client: str) -> ActionRun:  # fmt: skip
        """Start a replay of ``queue``'s messages matching ``chosen`` at ``rate`` per second (a canary of K first)."""
        run = self._new("replay", queue, params, who, client)
        run.replay, run.canary = ReplayReport(queue=queue), canary
        options = ReplayOptions(rate=rate, selection=chosen, canary=canary, canary_timeout=canary_timeout,
                                layouts=self.layouts, idempotent=self.idempotent, job_queues=self.job_queues,
                                app=self.app)  # fmt: skip

        async def go() -> str:
            assert run.replay is not None
            report = await replay(self.broker, queue, options, report=run.replay, census=run.census,
                                  results=self.results)  # fmt: skip
            run.summary = report.summary(canary is not None)
            run.details = [f"not replayed {line}" for line in report.not_moved]
            run.details += not_found_note(chosen, report.replayed, queue)
            if not report.canary_failures:
                return "done"
            run.details = [f"canary failed: {len(report.canary_failures)} of {report.canary_moved} did not "
                           "succeed; the rest stay in quarantine", *report.canary_failures, *run.details]  # fmt: skip
            return "canary failed"

        return self._launch(run, go)

    def start_move(
        self, kind: str, queue: str, chosen: Selection, params: dict[str, Any], who: str, client: str
    ) -> ActionRun:  # fmt: skip
        """Start parking or unparking (``kind``) ``queue``'s messages matching ``chosen``.

        A park moves them to ``<job queue>.parked``; an unpark back to ``<job queue>.quarantine``, unrun.
        The CLI's movers (:func:`~amqpjobs.runtime.parking.park`, :func:`~amqpjobs.runtime.parking.unpark`):
        their locks, their refusals (a park of a parked queue, an unpark of a quarantine queue:
        the run fails saying so, nothing moved), their records in the app's results store and
        their summary line.
        """
        run = self._new(kind, queue, params, who, client)
        run.take = TakeReport(queue)
        options = MoveOptions(selection=chosen)

        async def go() -> str:
            assert run.take is not None
            if kind == "park":
                report = await park(self.broker, queue, census=run.census, report=run.take, results=self.results,
                                    options=options)  # fmt: skip
            else:
                report = await unpark(self.broker, queue, options, run.census, report=run.take, results=self.results)
            run.summary = report.summary(kind)
            run.details = [f"not {DONE[kind]} {line}" for line in report.not_moved]
            run.details += not_found_note(chosen, report.taken, queue)
            return "done"

        return self._launch(run, go)

    def start_purge(self, queue: str, chosen: Selection, params: dict[str, Any], who: str, client: str) -> ActionRun:
        """Start deleting ``queue``'s messages (those matching ``chosen``); the form asked for its name typed out.

        Message by message (:func:`~amqpjobs.runtime.parking.purge_matching`), also with no
        filter: the audit line names every job deleted, and Stop works as for the other actions.
        """
        run = self._new("purge", queue, params, who, client)
        run.take = TakeReport(queue)

        async def go() -> str:
            assert run.take is not None
            report = await purge_matching(self.broker, queue, chosen, run.census, report=run.take,
                                          results=self.results)  # fmt: skip
            run.summary = f"purged {report.taken} message(s) from {printable(report.queue)}; {report.left} left"
            run.details = not_found_note(chosen, report.taken, queue)
            return "done"

        return self._launch(run, go)

    def stop(self, run: ActionRun, who: str) -> bool:
        """Stop ``run`` as Ctrl-C stops the CLI's mover (its task is cancelled).

        The moves under way are cut short (a job in flight may now be in both places) and the
        held messages return to the queue; it ends ``stopped``, audited as such, its summary
        naming ``who``.

        Returns:
            False when it had already ended (nothing to stop).

        """
        body = self._bodies.get(run.id)
        if body is None or body.done():
            return False
        run.stopped_by = who
        body.cancel()
        return True

    def _new(self, kind: str, queue: str, params: dict[str, Any], who: str, client: str) -> ActionRun:
        run = ActionRun(uuid.uuid4().hex[:16], kind, queue, params, who, client)
        self.runs[run.id] = run
        for old in [r for r in self.runs.values() if r.settled][: max(0, len(self.runs) - KEPT_RUNS)]:
            del self.runs[old.id]
        return run

    def _launch(self, run: ActionRun, body: Callable[[], Awaitable[str]]) -> ActionRun:
        async def task() -> None:
            # a mover it holds tells a refused one (a shell's replay) that this action of the console holds it
            with acting_as(f"amqpjobs console: action {run.id}, started by {run.who} from {run.client}"):
                inner = self._bodies[run.id] = asyncio.ensure_future(body())
            try:
                ended = await inner
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if current is not None and current.cancelling():  # the console is closing
                    run.summary = "interrupted: the console stopped (the moves under way were cut short)"
                    await self._end(run, "failed")
                    raise
                ended = "stopped"
            except AmqpJobsError as exc:
                ended, run.summary = "failed", printable(redact_text(str(exc)))
            except Exception as exc:  # an action's failure is shown and audited, never lost in a log
                ended, run.summary = "failed", printable(redact_text(f"{type(exc).__name__}: {exc}"))
            finally:
                self._bodies.pop(run.id, None)
            await self._end(run, ended)

        handle = asyncio.get_running_loop().create_task(task())
        self._tasks.add(handle)
        handle.add_done_callback(self._tasks.discard)
        return run

    async def _end(self, run: ActionRun, ended: str) -> None:
        """Show the run ended, read what is left after a failure or a Stop, write the audit line: settled."""
        estimate = run.figures()  # still running: the depth at the start less what it moved
        run.state = ended
        if ended == "failed" or run.stopped_by:
            with contextlib.suppress(Exception):  # the broker down: left stays unknown ("?")
                _, run.left_now = await asyncio.wait_for(queue_depth(self.broker, run.queue), LEFT_TIMEOUT)
        if run.stopped_by and ended == "stopped":
            moved, skipped, left = estimate if run.left_now is None else (*estimate[:2], run.left_now)
            run.summary = (f"stopped by {printable(run.stopped_by)}: moved {moved}, skipped {skipped}, left "
                           f"{'?' if left is None else left} in {printable(run.queue)}")  # fmt: skip
            if run.kind == "replay":
                window = replay_window(float(run.params.get("rate") or 1))
                run.details.append(f"up to {window} job(s) in flight at the stop may now be in both "
                                   f"{printable(run.queue)} and in their work queue: duplicates, which an "
                                   "idempotent job tolerates")  # fmt: skip
        result = {"done": "ok", "stopped": "stopped", "canary failed": "canary failed"}.get(ended, "error")
        entry = AuditEntry(now_iso(), run.who, run.client, run.kind, run.queue, run.params, result, run.summary,
                           run.moved_ids())  # fmt: skip
        try:
            await asyncio.to_thread(self.audit.append, entry)
        except (OSError, ValueError) as exc:  # shown on the action's page: the operator learns the log missed it
            run.details.append(printable(f"not written to the audit log {self.audit.path}: {exc}"))
        run.settled = True

    async def close(self) -> None:
        """Cancel the runs under way (each cuts its moves short and returns held messages) and wait for them."""
        for handle in list(self._tasks):
            handle.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def not_found_note(chosen: Selection, moved: int, queue: str) -> list[str]:
    """A details line for the checked jobs (``chosen.job_ids``) an action found fewer copies of than were checked.

    ``moved``: messages the action replayed, parked or purged. Another run or person may have
    moved them since the page was shown; they are named as a count, the action having done
    nothing to them. Empty when no job was checked or each was found.
    """
    if chosen.job_ids is None or moved >= len(chosen.job_ids):
        return []
    gone = len(chosen.job_ids) - moved
    return [
        f"{gone} of the {len(chosen.job_ids)} checked job(s) were no longer in {printable(queue)} (replayed, parked "
        "or purged since the page was shown?): nothing was done to them"
    ]
