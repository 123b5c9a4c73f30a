"""``amqpjobs status`` for circuit breakers: each open record's state and note (README "Circuit breaker").

A job's breaker is open while its record queue ``<job queue>.breaker.<job>`` exists (its
dates in the queue's arguments, :class:`~amqpjobs.wire.breakers.OpenRecord`); a probe runs
while its lock queue ``<job queue>.breaker-probe.<job>`` exists (:class:`~amqpjobs.wire.breakers.ProbeHolder`).
One rule (:func:`breaker_state`) gives the state that ``--json`` shows and the text says.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from amqpjobs.jobs.envelope import iso_utc
from amqpjobs.topology.naming import parse_queue_name
from amqpjobs.wire.breakers import OpenRecord, probes_in, records_in


def breaker_states(job_queue: str, live: Iterable[dict[str, Any]], now: float) -> list[dict[str, Any]]:
    """The open records of ``job_queue``'s jobs among ``live`` queues (management API), as JSON-ready dicts.

    Each: ``job``, ``state`` (:func:`breaker_state`: ``open``; ``half-open`` once the cool-down
    is over, the next delivery of the job runs as the probe, or while it runs; ``dated-ahead``),
    ``opened_at`` and ``until`` (ISO 8601 UTC),
    ``failures`` (that opened it; 0 when a failed probe re-opened it), ``cool_down`` (seconds:
    ``until - opened_at``, the writer's cool-down), ``dated_ahead`` (``opened_at`` is after
    ``now``: a worker whose clock runs ahead wrote it; workers don't wait for its ``until``,
    each cuts it to one cool-down from when it reads it: :meth:`BreakerMachine.trusted`);
    while a probe runs (its lock queue exists), ``probe``: ``job_id``, ``by``
    (``host:pid:worker``) and ``since``. A job whose breaker is closed has no record.
    ``now``: wall-clock seconds of this host.
    """
    mine = [q for q in live if (p := parse_queue_name(str(q.get("name", "")))).kind in ("breaker", "breaker-probe")
            and p.job_queue == job_queue]  # fmt: skip
    probes = {parse_queue_name(name).job: holder for name, holder in probes_in(mine).items()}
    out: list[dict[str, Any]] = []
    for queue_name, record in sorted(records_in(mine).items()):
        job = parse_queue_name(queue_name).job
        probe = probes.get(job)
        out.append({
            "job": job, "state": breaker_state(record, probe is not None, now),
            "opened_at": iso_utc(record.opened_at), "until": iso_utc(record.until), "failures": record.failures,
            "cool_down": round(record.until - record.opened_at, 3), "dated_ahead": record.opened_at > now,
        })  # fmt: skip
        if probe is not None:
            out[-1]["probe"] = {"job_id": probe.job_id, "by": probe.by, "since": iso_utc(probe.since)}
    return out


def breaker_state(record: OpenRecord, probing: bool, now: float) -> str:
    """The one rule for a record's state, shown alike by ``--json`` and the text (:func:`breaker_note`).

    ``half-open`` while a probe runs or once ``until`` is past; ``dated-ahead`` when it was
    opened after ``now`` (wall-clock seconds): no worker takes its dates at their word (each
    waits one cool-down from when it reads it, then probes: README "Circuit breaker");
    else ``open``.
    """
    if probing or record.until <= now:
        return "half-open"
    return "dated-ahead" if record.opened_at > now else "open"


def breaker_note(breaker: dict[str, Any]) -> str:
    """A line for ``status`` about one breaker's record (:func:`breaker_states`), from its ``state`` alone."""
    why = f"{breaker['failures']} failure(s)" if breaker["failures"] else "a failed probe"
    if breaker["state"] == "dated-ahead":
        return (f"circuit breaker of job {breaker['job']!r} is dated ahead (after {why}); its record is dated ahead "
                f"of this host's clock (opened {breaker['opened_at']}, until {breaker['until']}): a worker waits one "
                f"cool-down ({breaker['cool_down']:g}s) from when it reads it, then one delivery runs as the "
                "probe")  # fmt: skip
    if breaker["state"] == "open":
        return (f"circuit breaker of job {breaker['job']!r} is open (after {why}, since {breaker['opened_at']}): "
                f"no starts until {breaker['until']}")  # fmt: skip
    opened = f"circuit breaker of job {breaker['job']!r} is half-open (opened after {why} at {breaker['opened_at']})"
    if (probe := breaker.get("probe")) is not None:
        return f"{opened}: a probe runs (id {probe['job_id']!r}, since {probe['since']}, on {probe['by']})"
    return f"{opened}: the next delivery of the job runs as the probe"
