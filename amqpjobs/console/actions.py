"""The console's actions (replay, park, purge) as runs the pages follow, each ending in the audit log.

An action is the library's own function (:func:`amqpjobs.runtime.replay.replay` with its
canary, :func:`amqpjobs.runtime.parking.park`, :func:`amqpjobs.runtime.quarantine.purge`,
:func:`amqpjobs.runtime.parking.purge_matching`), started as a task of the server's event
loop: it takes the queue's mover lock like the CLI's, so a second mover, on the page or in a
shell, is refused with the first one named. Its report object is filled as it goes and read
by the progress page.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from amqpjobs.console.audit import AuditEntry, AuditLog, now_iso
from amqpjobs.errors import AmqpJobsError, ConfigurationError
from amqpjobs.jobs.census import Census
from amqpjobs.jobs.quarantine import ReplayOptions, ReplayReport, Selection
from amqpjobs.printable import printable
from amqpjobs.runtime.parking import TakeReport, park, purge_matching
from amqpjobs.runtime.quarantine import purge
from amqpjobs.runtime.replay import replay
from amqpjobs.runtime.results import ResultsStore
from amqpjobs.wire.settings import BrokerSettings

#: Runs kept for their pages (the oldest finished ones go first).
KEPT_RUNS = 200


@dataclass
class ActionRun:
    """One action and where it stands.

    Attributes:
        id: Its id (in its page's address).
        kind: ``replay``, ``park`` or ``purge``.
        queue: The queue acted on.
        params: What was asked (JSON-ready; shown and audited).
        who / client: Who asked, from which address.
        state: ``running``, ``done``, ``stopped`` (a canary failed) or ``failed``.
        summary: What happened, once it ended.
        details: More lines (a failed canary's jobs and why).
        replay: The replay's report (replay only).
        take: The park or filtered purge's report (park, purge).
        canary: K of a canary replay, None without.

    """

    id: str
    kind: str
    queue: str
    params: dict[str, Any]
    who: str
    client: str
    state: str = "running"
    summary: str = ""
    details: list[str] = field(default_factory=list)
    replay: ReplayReport | None = None
    take: TakeReport | None = None
    canary: int | None = None
    started: float = field(default_factory=time.time)

    def progress(self) -> dict[str, Any]:
        """Where it stands, for the progress page (JSON)."""
        doc: dict[str, Any] = {"id": self.id, "kind": self.kind, "queue": self.queue, "state": self.state,
                               "summary": self.summary, "details": self.details}  # fmt: skip
        if self.replay is not None:
            r = self.replay
            doc.update(moved=r.replayed, skipped=r.skipped, left=r.left, phase=r.phase, canary=self.canary,
                       canary_moved=r.canary_moved, elapsed=round(r.elapsed, 2))  # fmt: skip
        if self.take is not None:
            doc.update(moved=self.take.taken, skipped=self.take.kept, left=self.take.left, target=self.take.target)
        return doc


class Actions:
    """Starts actions and keeps their runs (one console process)."""

    def __init__(self, broker: BrokerSettings, audit: AuditLog, results: ResultsStore | None = None) -> None:
        """``results``: the app's results store (``--app``): each moved job's new state is recorded there."""
        self.broker = broker
        self.audit = audit
        self.results = results
        self.runs: dict[str, ActionRun] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def start_replay(self, queue: str, chosen: Selection, rate: float, canary: int | None, canary_timeout: float,
                     params: dict[str, Any], who: str, client: str) -> ActionRun:  # fmt: skip
        """Start a replay of ``queue``'s messages matching ``chosen`` at ``rate`` per second (a canary of K first)."""
        run = self._new("replay", queue, params, who, client)
        run.replay, run.canary = ReplayReport(queue=queue), canary
        options = ReplayOptions(rate=rate, selection=chosen, canary=canary, canary_timeout=canary_timeout)

        async def go() -> None:
            assert run.replay is not None
            report = await replay(self.broker, queue, options, report=run.replay, census=Census(), results=self.results)
            run.summary = report.summary(canary is not None)
            if report.canary_failures:
                run.state = "stopped"
                run.details = [f"canary failed: {len(report.canary_failures)} of {report.canary_moved} did not "
                               "succeed; the rest stay in quarantine", *report.canary_failures]  # fmt: skip

        return self._launch(run, go, lambda: [job_id for job_id, _ in (run.replay.moves if run.replay else [])])

    def start_park(self, queue: str, chosen: Selection, params: dict[str, Any], who: str, client: str) -> ActionRun:
        """Start parking ``queue``'s messages matching ``chosen`` (to ``<job queue>.parked``)."""
        run = self._new("park", queue, params, who, client)
        run.take = TakeReport(queue)

        async def go() -> None:
            assert run.take is not None
            report = await park(self.broker, queue, chosen, Census(), report=run.take, results=self.results)
            run.summary = (f"parked {report.taken} message(s) from {printable(report.queue)} in "
                           f"{printable(report.target)}; {report.left} left in {printable(report.queue)}")  # fmt: skip

        return self._launch(run, go, list)

    def start_purge(self, queue: str, chosen: Selection, typed: str, params: dict[str, Any], who: str,
                    client: str) -> ActionRun:  # fmt: skip
        """Start deleting ``queue``'s messages (those matching ``chosen``), once ``typed`` is the queue's name.

        Raises:
            ConfigurationError: ``typed`` is not ``queue`` (nothing is started).

        """
        if typed != queue:
            raise ConfigurationError(f"type the queue's name, {queue!r}, to purge it (got {typed!r})")
        run = self._new("purge", queue, params, who, client)
        run.take = TakeReport(queue)

        async def go() -> None:
            assert run.take is not None
            if chosen == Selection():
                name, removed = await purge(self.broker, queue)
                run.take.taken, run.take.left = removed, 0
                run.summary = f"purged {removed} message(s) from {printable(name)}"
                return
            report = await purge_matching(self.broker, queue, chosen, Census())
            run.take.taken, run.take.kept, run.take.left = report.taken, report.kept, report.left
            run.summary = f"purged {report.taken} message(s) from {printable(report.queue)}; {report.left} left"

        return self._launch(run, go, list)

    def _new(self, kind: str, queue: str, params: dict[str, Any], who: str, client: str) -> ActionRun:
        run = ActionRun(uuid.uuid4().hex[:16], kind, queue, params, who, client)
        self.runs[run.id] = run
        for old in [r for r in self.runs.values() if r.state != "running"][: max(0, len(self.runs) - KEPT_RUNS)]:
            del self.runs[old.id]
        return run

    def _launch(self, run: ActionRun, body: Callable[[], Awaitable[None]], moved: Callable[[], list[str]]) -> ActionRun:
        async def task() -> None:
            try:
                await body()
                if run.state == "running":
                    run.state = "done"
            except asyncio.CancelledError:
                run.state, run.summary = "failed", "interrupted: the console stopped (the moves under way were settled)"
                raise
            except AmqpJobsError as exc:
                run.state, run.summary = "failed", printable(str(exc))
            except Exception as exc:  # an action's failure is shown and audited, never lost in a log
                run.state, run.summary = "failed", printable(f"{type(exc).__name__}: {exc}")
            finally:
                result = {"done": "ok", "stopped": "stopped"}.get(run.state, "error")
                entry = AuditEntry(now_iso(), run.who, run.client, run.kind, run.queue, run.params, result,
                                   run.summary, moved())  # fmt: skip
                try:
                    await asyncio.to_thread(self.audit.append, entry)
                except OSError as exc:  # shown on the action's page: the operator learns the log missed it
                    run.details.append(printable(f"not written to the audit log {self.audit.path}: {exc}"))

        handle = asyncio.get_running_loop().create_task(task())
        self._tasks.add(handle)
        handle.add_done_callback(self._tasks.discard)
        return run

    async def close(self) -> None:
        """Cancel the runs under way (each settles its moves and returns held messages) and wait for them."""
        for handle in list(self._tasks):
            handle.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
