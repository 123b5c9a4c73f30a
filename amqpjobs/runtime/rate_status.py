"""``amqpjobs status`` for rate-limited jobs: their waiting rooms and token emitters (README "Flow control").

A rate limit is in the app's code, so ``status`` finds rate-limited jobs by their queues'
names on the broker (:func:`~amqpjobs.topology.naming.parse_queue_name`): a job queue's
``<name>.rate-waiting.<job>``, ``.rate-tokens.<job>`` and ``.rate-emitter.<job>`` queues. Who
mints a job's tokens, and at what rate, rides in its emitter lock's queue arguments
(:class:`~amqpjobs.wire.lock.LockHolder`; management API); the rate each worker runs the job
at rides in its waiting-room consumer's arguments (:data:`~amqpjobs.wire.tokens.RATE_ARGUMENT`,
the management API's ``consumer_details``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from amqpjobs.errors import ConfigurationError
from amqpjobs.jobs import envelope
from amqpjobs.jobs.rate import first_tick, parse_rate_limit, tick_time
from amqpjobs.printable import printable
from amqpjobs.topology.naming import parse_queue_name, rate_queue_names
from amqpjobs.wire.lock import LockHolder
from amqpjobs.wire.tokens import RATE_ARGUMENT

#: Token intervals (seconds) from which ``status`` says when the next token comes.
SAY_NEXT_TOKEN_FROM = 60.0


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
        tokens: Its token queue's name.
        rate: The rate its minter mints at (``10/s``; from its lock), or None.
        minter: The minter as ``{"host", "pid", "since"}`` (ISO 8601), or None.
        worker_rates: The rates its workers' waiting-room consumers declare, sorted, distinct.
        missing: Its waiting room and/or token queue when not on the broker.
        next_token_at: When the minter's next token is due (ISO 8601 UTC), for slow rates
            (an interval of :data:`SAY_NEXT_TOKEN_FROM` seconds or more), else None.
    """

    job: str
    waiting: str
    emitter: str | None
    tokens: str = ""
    rate: str | None = None
    minter: dict[str, Any] | None = None
    worker_rates: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    next_token_at: str | None = None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (``status --json``: ``rate_limits``)."""
        return {
            "job": self.job, "waiting_room": self.waiting, "token_queue": self.tokens, "minter": self.minter,
            "rate": self.rate, "worker_rates": list(self.worker_rates), "missing": list(self.missing),
            "next_token_at": self.next_token_at,
        }  # fmt: skip


def _next_token(rate_text: str | None, now: float) -> str | None:
    try:
        rate = parse_rate_limit(rate_text or "")
    except ConfigurationError:
        return None
    if rate.interval < SAY_NEXT_TOKEN_FROM:
        return None
    return envelope.iso_utc(tick_time(rate, first_tick(rate, now)))


def rated_jobs(
    job_queue: str, live: Mapping[str, Mapping[str, Any]], rooms: Mapping[str, Mapping[str, Any]] = {}, now: float = 0
) -> list[RatedJob]:
    """The rate-limited jobs of ``job_queue`` any of whose rate queues is among ``live`` (management API, by name).

    ``rooms``: waiting rooms' single-queue management API answers (their ``consumer_details``);
    ``now``: seconds since the epoch (for the next token's time).
    """
    jobs = set()
    for name in live:
        parsed = parse_queue_name(name)
        if parsed.kind in ("waiting", "tokens", "emitter") and parsed.job_queue == job_queue and parsed.job:
            jobs.add(parsed.job)
    found = []
    for job in sorted(jobs):
        names = rate_queue_names(job_queue, job)
        lock = live.get(names.emitter)
        holder = None if lock is None else LockHolder.from_arguments(lock.get("arguments") or {})
        rate = None if holder is None else holder.detail("rate")
        details = (rooms.get(names.waiting) or {}).get("consumer_details") or []
        worker_rates = {str(r) for c in details if (r := (c.get("arguments") or {}).get(RATE_ARGUMENT))}
        minter = None if holder is None else {"host": holder.host, "pid": holder.pid, "since": holder.since.isoformat()}
        found.append(RatedJob(
            job, names.waiting, None if holder is None else str(holder), names.tokens, rate, minter,
            tuple(sorted(worker_rates)), tuple(n for n in (names.waiting, names.tokens) if n not in live),
            _next_token(rate, now),
        ))  # fmt: skip
    return found


def rate_findings(
    rated: list[RatedJob], figures: Callable[[str], _Figures], paused: bool = False
) -> tuple[list[str], list[str]]:
    """(problems, notes) about ``rated``.

    Problems: a waiting room holding jobs that no worker takes or no token reaches, a rate
    queue missing. Notes: each job's room and minter, workers' rates that differ, a slow
    rate's next token. ``paused``: an operator paused the job queue, so its waiting rooms
    are stopped on purpose (a note, not a problem).
    """
    problems, notes = [], []
    again = "a worker declares it again when it finds it missing (restart one if this stays)"
    for r in rated:
        room = figures(r.waiting)
        job = printable(repr(r.job))
        held = room.ready + room.unacked
        if r.waiting in r.missing:
            problems.append(f"waiting room {r.waiting} of rate-limited job {job} is missing: its deliveries wait "
                            f"for a token in their work queue's slots; {again}")  # fmt: skip
        elif room.exists and room.ready and not room.consumers and not paused:
            problems.append(f"no worker takes from waiting room {r.waiting}: {room.ready} job(s) of {job} wait")
        elif held and r.emitter is None and not paused:
            problems.append(f"no worker mints the tokens of rate-limited job {job}: {held} job(s) wait in {r.waiting}")
        if r.tokens in r.missing:
            problems.append(f"token queue {r.tokens} of rate-limited job {job} is missing: no start gets a token; "
                            f"{again}")  # fmt: skip
        minted = f"tokens minted by {printable(r.emitter)}" if r.emitter else "no worker mints its tokens"
        note = f"job {job} is rate-limited: {held} job(s) in waiting room {r.waiting}; {minted}"
        if paused:
            note += "; paused: no worker takes from it until resume"
        if r.next_token_at:
            note += f"; next token at {r.next_token_at}"
        if len(set(r.worker_rates) | ({r.rate} if r.rate else set())) > 1:
            rates = ", ".join(printable(x) for x in sorted(set(r.worker_rates) | {r.rate or ""} - {""}))
            note += (f"; workers of job {job} have different rate limits ({rates}); the minter's, "
                     f"{printable(r.rate or '?')}, applies")  # fmt: skip
        notes.append(note)
    return problems, notes
