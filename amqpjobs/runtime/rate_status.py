"""``amqpjobs status`` for rate-limited jobs: their waiting rooms and token emitters (README "Flow control").

A rate limit is in the app's code, so ``status`` finds rate-limited jobs by their queues'
names on the broker (:func:`~amqpjobs.topology.naming.parse_queue_name`): a job queue's
``<name>.rate-waiting.<job>`` queues. Who mints a job's tokens, and at what rate, rides in
its emitter lock's queue arguments (:class:`~amqpjobs.wire.lock.LockHolder`; management API).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from amqpjobs.printable import printable
from amqpjobs.topology.naming import parse_queue_name, rate_queue_names
from amqpjobs.wire.lock import LockHolder


class _Figures(Protocol):
    name: str
    exists: bool
    ready: int
    unacked: int
    consumers: int


@dataclass(frozen=True)
class RatedJob:
    """A rate-limited job of a job queue, as found on the broker.

    Attributes:
        job: Its name.
        waiting: Its waiting room's name.
        emitter: Who mints its tokens (``token emitter of job J at 10/s (pid P on H, since ...)``),
            or None when no worker does.
    """

    job: str
    waiting: str
    emitter: str | None


def rated_jobs(job_queue: str, live: Mapping[str, Mapping[str, Any]]) -> list[RatedJob]:
    """The rate-limited jobs of ``job_queue`` whose waiting room is among ``live`` (management API queues by name)."""
    found = []
    for name in sorted(live):
        parsed = parse_queue_name(name)
        if parsed.kind != "waiting" or parsed.job_queue != job_queue or parsed.job is None:
            continue
        lock = live.get(rate_queue_names(job_queue, parsed.job).emitter)
        holder = None if lock is None else LockHolder.from_arguments(lock.get("arguments") or {})
        found.append(RatedJob(parsed.job, name, None if holder is None else str(holder)))
    return found


def rate_findings(rated: list[RatedJob], figures: Callable[[str], _Figures]) -> tuple[list[str], list[str]]:
    """(problems, notes) about ``rated``: a waiting room holding jobs that no worker takes or no token reaches."""
    problems, notes = [], []
    for r in rated:
        room = figures(r.waiting)
        job = printable(repr(r.job))
        held = room.ready + room.unacked
        if room.exists and room.ready and not room.consumers:
            problems.append(f"no worker takes from waiting room {r.waiting}: {room.ready} job(s) of {job} wait")
        elif held and r.emitter is None:
            problems.append(f"no worker mints the tokens of rate-limited job {job}: {held} job(s) wait in {r.waiting}")
        minted = f"tokens minted by {printable(r.emitter)}" if r.emitter else "no worker mints its tokens"
        notes.append(f"job {job} is rate-limited: {held} job(s) in waiting room {r.waiting}; {minted}")
    return problems, notes
