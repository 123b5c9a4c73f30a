"""``amqpjobs status``: the golden signals of each job queue, and whether they are healthy.

Per job queue: work queue(s) ready / unacked / consumers / publish, deliver and ack rates
/ oldest message age, each delay tier's depth, the quarantine depth, and the suspects
queue's depth (jobs whose start ended without an outcome, waiting to run alone). Depths and consumer
counts come from passive declares (exact, now); unacked counts, rates and the head
message's ``timestamp`` from the management API (refreshed every
``collect_statistics_interval``, 5 s by default: RabbitMQ "Management Plugin" →
"Statistics Interval"). The oldest message age is ``now - head_message_timestamp`` (publishers must set
``timestamp``: ``enqueue`` does). Quorum queues (3.x and 4.x, seen up to 4.3.6) report no head timestamp:
their age shows as unknown, and a ``max_age`` check of one holding messages is a note saying it can't judge.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from amqpjobs.durations import parse_duration
from amqpjobs.errors import ManagementApiError
from amqpjobs.jobs.timestamps import head_age
from amqpjobs.printable import listed, printable, shell_quote
from amqpjobs.runtime.breaker_status import breaker_note, breaker_states
from amqpjobs.runtime.held_count import held_now
from amqpjobs.runtime.policy_checks import View, overrides, vhost_overrides
from amqpjobs.runtime.rate_status import rate_findings, rated_jobs
from amqpjobs.runtime.unread import dropped_problems, gets_per_second, rate_of
from amqpjobs.runtime.unread import unread_queues as unread_queues  # re-exported: its home was here
from amqpjobs.runtime.unread import warn_dropped_shards as warn_dropped_shards  # re-exported
from amqpjobs.topology.models import JobQueueLayout
from amqpjobs.topology.naming import (
    EVENTS_EXCHANGE,
    parked_queue_name,
    parse_queue_name,
    quarantine_exchange_name,
    quarantine_queue_name,
    suspects_queue_name,
)
from amqpjobs.topology.orphans import orphan_queues
from amqpjobs.topology.plan import ObjectState
from amqpjobs.wire.declare import probe_queues
from amqpjobs.wire.flags import flags_in
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings


@dataclass
class QueueStatus:
    """One queue's figures.

    Attributes:
        name: Queue name.
        exists: False when the queue is missing on the broker.
        ready: Messages ready for delivery (exact).
        unacked: Messages delivered and not yet acked (management API).
        consumers: Consumers (exact).
        publish_rate / deliver_rate / ack_rate: Messages per second (management API).
        oldest_age: Seconds since the head message was published, or None when empty or unknown.
        unaddressable: Why the AMQP client can't address this queue ("" when it can).
    """

    name: str
    exists: bool = True
    ready: int = 0
    unacked: int = 0
    consumers: int = 0
    publish_rate: float = 0.0
    deliver_rate: float = 0.0
    ack_rate: float = 0.0
    oldest_age: float | None = None
    unaddressable: str = ""

    def row(self) -> str:
        """The queue as one row under :data:`STATUS_HEADER`."""
        if not self.exists:
            return f"{self.name:<34} {'missing':>7}"
        if self.unaddressable:
            return f"{self.name:<34} {'unaddressable (see below)':>7}"
        age = "-" if self.oldest_age is None else f"{self.oldest_age:.0f}s"
        return (
            f"{self.name:<34} {self.ready:>7} {self.unacked:>7} {self.consumers:>4} {self.publish_rate:>7.1f} "
            f"{self.deliver_rate:>7.1f} {self.ack_rate:>7.1f} {age}"
        )


#: The header line over :meth:`QueueStatus.row` rows.
STATUS_HEADER = f"{'queue':<34} {'ready':>7} {'unacked':>7} {'cons':>4} {'pub/s':>7} {'dlv/s':>7} {'ack/s':>7} oldest"


@dataclass
class JobQueueStatus:
    """A job queue's figures and the problems found.

    Attributes:
        name: Job queue name.
        work: Its work queue(s) (several when sharded).
        tiers: Its delay queues.
        quarantine: Its quarantine queue.
        suspects: Its suspects queue (:mod:`amqpjobs.jobs.crash`).
        problems: Why it is unhealthy (empty when healthy).
        parked: Its parked queue (``amqpjobs quarantine park``), None when not looked at.
        notes: What an operator should know that is not unhealthy (parked jobs, a parked
            queue not declared yet, an open circuit breaker, an operator's pause).
        breakers: The jobs whose circuit breaker is open, half-open or dated ahead
            (:func:`~amqpjobs.runtime.breaker_status.breaker_states`).
        paused: ``{"reason": ..., "since": ISO 8601 UTC}`` while an operator pauses it
            (``amqpjobs pause``), else None.
        rate_limits: Its rate-limited jobs (:meth:`.rate_status.RatedJob.to_json`: waiting room,
            token queue, minter, its rate, the workers' rates, missing rate queues, next token).
    """

    name: str
    work: list[QueueStatus]
    tiers: list[QueueStatus]
    quarantine: QueueStatus
    suspects: QueueStatus
    problems: list[str] = field(default_factory=list)
    parked: QueueStatus | None = None
    notes: list[str] = field(default_factory=list)
    breakers: list[dict[str, Any]] = field(default_factory=list)
    waiting: list[QueueStatus] = field(default_factory=list)
    paused: dict[str, str] | None = None
    rate_limits: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)

    def rows(self) -> list[str]:
        """One :meth:`QueueStatus.row` per queue: work queues, tiers, quarantine, suspects, parked, waiting rooms."""
        parked = [self.parked] if self.parked is not None and self.parked.exists else []
        return [q.row() for q in [*self.work, *self.tiers, self.quarantine, self.suspects, *parked, *self.waiting]]


def status_report(report: list[JobQueueStatus]) -> list[str]:
    """The text ``amqpjobs status`` prints for ``report``: the table, problems, notes, ``healthy`` when no problem."""
    lines = [STATUS_HEADER, *(row for j in report for row in j.rows())]
    lines += [f"UNHEALTHY {j.name}: {problem}" for j in report for problem in j.problems]
    lines += [f"note {j.name}: {note}" for j in report for note in j.notes]
    if not any(j.problems for j in report):
        lines.append("healthy")
    return lines


def _no_such_job_queue(name: str, vhost: str, live: Iterable[str]) -> str:
    """The one problem of a job queue named on the command line (``--queues``) none of whose queues exist."""
    here = {q.job_queue for q in map(parse_queue_name, live) if q.kind == "quarantine"}
    return (
        f"no job queue {printable(name)} on vhost {vhost!r}: none of its queues exist (check the name; job queues "
        f"here: {listed(here)}; or apply the topology that declares it)"
    )


def layout_from_names(job_queue: str, live_names: list[str]) -> tuple[list[str], list[str], str]:
    """Derive (work queues, tier queues, quarantine) of ``job_queue`` from live queue names by the naming scheme."""
    parsed = [(n, parse_queue_name(n)) for n in live_names]
    shards = sorted(
        ((q.shard or 0, n) for n, q in parsed if q.kind == "shard" and q.job_queue == job_queue),
    )
    live = set(live_names)
    # a stray shard (``mail.shard-1`` of an unsharded ``mail``) must not hide the work queue itself
    works = [job_queue] if job_queue in live or not shards else []
    works += [n for _, n in shards]
    by_delay = sorted(((n, q) for n, q in parsed if q.kind == "tier"), key=lambda p: parse_duration(p[1].tier or ""))
    tiers = [n for w in works for n, q in by_delay if q.work_queue == w]  # 5s before 30s
    return works, tiers, quarantine_queue_name(job_queue)


def _read_vhost(settings: BrokerSettings) -> tuple[dict[str, Any], dict[str, dict[str, Any]], View]:
    """The vhost's queues by name, its waiting rooms, and the view overrides are judged by (:class:`View`)."""
    with ManagementClient(settings) as mgmt:
        version = mgmt.broker_version()  # a consumer-timeout policy applies before 4.3 only
        live = {q["name"]: q for q in mgmt.queues(settings.vhost)}
        exchanges = {e["name"]: e for e in mgmt.exchanges(settings.vhost)}
        bound = {(b["source"], b["destination"], b["routing_key"]) for b in mgmt.bindings(settings.vhost)}
        policies: list[dict[str, Any]] = []
        if any(e.get("policy") for e in exchanges.values()):  # their definitions (a policymaker tag reads them)
            with contextlib.suppress(ManagementApiError):
                policies = mgmt.policies(settings.vhost)
        # waiting rooms' consumers: the rate each worker runs its job at (README "Flow control")
        rooms = {n: mgmt.queue(settings.vhost, n) or {} for n in live if parse_queue_name(n).kind == "waiting"}
    return live, rooms, View(live, exchanges, bound, policies, version)


async def collect(
    settings: BrokerSettings,
    layouts: list[JobQueueLayout] | None = None,
    names: list[str] | None = None,
    max_age: float | None = None,
    desired: Sequence[ObjectState] = (),
) -> list[JobQueueStatus]:
    """Figures for each job queue (from ``layouts``, or derived from ``names``) and their problems.

    Parked jobs (``<job queue>.parked``) and a parked queue not declared yet are notes, not
    problems. A job queue is unhealthy when its quarantine holds messages, a work queue has no
    consumer, a queue or its quarantine exchange is missing (or that exchange is not bound
    to the quarantine queue: dead-letters and quarantine copies would be dropped), an
    oldest-message age (of a work queue or a waiting room) exceeds ``max_age`` seconds, or
    (``layouts``) a shard its topology no longer has (``shards`` lowered, ``topology plan``'s
    ORPHAN) holds jobs: no worker reads it, one of its queues differs from ``desired`` (the
    topology's objects: declared again with other arguments), or a policy on one of its queues can lose jobs (a
    policy that only changes when a job comes back or is quarantined is a note:
    :mod:`amqpjobs.topology.policy_effects`).
    A rate-limited job's waiting room found on the broker gets a row and a note, and is a
    problem when it holds jobs that no worker consumes or no worker mints tokens for
    (:mod:`amqpjobs.runtime.rate_status`).

    Raises:
        BrokerUnavailableError, ManagementApiError: the broker can't be reached.
    """
    live, rooms, view = await asyncio.to_thread(_read_vhost, settings)  # httpx blocks: not on the loop
    exchanges, bound = view.exchanges, view.bindings
    plan: list[tuple[str, list[str], list[str], str]] = []
    for lay in layouts or []:
        tiers = [t for w in lay.work_queues for t in lay.tier_queues[w]]
        plan.append((lay.name, list(lay.work_queues), tiers, lay.quarantine_queue))
    for name in names or []:
        works, tiers, quarantine = layout_from_names(name, sorted(live))
        plan.append((name, works, tiers, quarantine))
    looks = [n for name, w, t, q in plan for n in (*w, *t, q, suspects_queue_name(name), parked_queue_name(name))]
    now = time.time()
    rated = {name: rated_jobs(name, live, rooms, now) for name, *_ in plan}  # README "Flow control"
    looks += [r.waiting for jobs in rated.values() for r in jobs]
    dropped = orphan_queues(layouts or [], live)  # a topology's form: also shards it no longer has
    exact = await probe_queues(settings, looks + dropped)
    out = []
    topology_names = {lay.name for lay in layouts or []}
    for name, works, tiers, quarantine in plan:

        def figures(queue: str) -> QueueStatus:
            if queue not in exact or (exact[queue].unaddressable and queue not in live):  # the API lists them all
                return QueueStatus(queue, exists=False)
            if exact[queue].unaddressable:
                return QueueStatus(queue, unaddressable=exact[queue].unaddressable)
            ready, consumers = exact[queue].messages, exact[queue].consumers
            stats = live.get(queue, {})
            # the raw integer the publisher sent, in any unit; 0 (never set) has no age: the one rule
            age = head_age(stats.get("head_message_timestamp"), now) if ready else None
            msg_stats = stats.get("message_stats") or {}
            return QueueStatus(
                queue, True, ready, int(stats.get("messages_unacknowledged", 0) or 0), consumers,
                rate_of(msg_stats, "publish"), rate_of(msg_stats, "deliver_get"), rate_of(msg_stats, "ack"), age,
            )  # fmt: skip

        status = JobQueueStatus(
            name, [figures(w) for w in works], [figures(t) for t in tiers], figures(quarantine),
            figures(suspects_queue_name(name)),
        )  # fmt: skip
        own = [*status.work, *status.tiers, status.quarantine, status.suspects]
        for q in own:
            if not q.exists:
                status.problems.append(f"queue {q.name} does not exist (apply the topology)")
            elif q.unaddressable:
                status.problems.append(q.unaddressable)
        exchange = quarantine_exchange_name(name)
        if exchange not in exchanges:
            status.problems.append(f"exchange {exchange} does not exist (apply the topology)")
        elif status.quarantine.exists and not any(b[:2] == (exchange, quarantine) for b in bound):
            status.problems.append(f"exchange {exchange} is not bound to {quarantine} (apply the topology)")
        if name not in topology_names and exchange not in exchanges and not any(q.exists for q in own):
            status.problems = [_no_such_job_queue(name, settings.vhost, live)]  # a name given, maybe misspelt
            out.append(status)
            continue
        qs = status.quarantine  # ready (exact), and those held unacked when the API's snapshot is not behind
        quarantined, unacked = held_now(qs.ready, live.get(qs.name, {}))
        if quarantined:
            status.problems.append(
                f"{quarantined} message(s) in quarantine {qs.name}" + (f" ({unacked} of them held unacked by a "
                "consumer now: they come back when it acks or closes)" if unacked else "")
                + f" (next: amqpjobs quarantine list {shell_quote(qs.name)})"
            )  # fmt: skip
        status.parked = parked = figures(parked_queue_name(name))
        if not parked.exists:
            status.notes.append(f"no parked queue {parked.name} yet (amqpjobs topology apply declares it)")
        elif parked_now := held_now(parked.ready, live.get(parked.name, {}))[0]:
            status.notes.append(
                f"{parked_now} job(s) parked in {parked.name}, not unhealthy "
                f"(amqpjobs quarantine list {shell_quote(parked.name)})"
            )
        if flag := flags_in(live, [name]).get(name):  # no consumer then is what the operator asked for
            status.paused = flag.to_json()
            status.notes.append(f"paused since {status.paused['since']} (reason: {flag.reason or 'none given'}); "
                                f"no worker starts its jobs until: amqpjobs resume {shell_quote(name)}")  # fmt: skip
        sharded = len(status.work) > 1
        status.waiting = [figures(r.waiting) for r in rated[name]]
        status.rate_limits = [r.to_json() for r in rated[name]]
        for w in status.work:
            # a sharded job queue's workers take by basic.get and consume a shard only while it is
            # busy (README "Tenant fairness"): an idle worker still asks each shard ~10 times a second
            gets = gets_per_second(live.get(w.name, {}))
            if w.exists and w.consumers == 0 and not (sharded and gets > 0) and status.paused is None:
                status.problems.append(
                    f"no worker takes from {w.name} (no consumer, no basic.get in the last seconds)"
                    if sharded
                    else f"no consumer on {w.name}"
                )
        for w in [*status.work, *status.waiting]:  # a waiting room's backlog falling behind its rate, too
            if max_age is not None and w.oldest_age is not None and w.oldest_age > max_age:
                status.problems.append(f"oldest message in {w.name} is {w.oldest_age:.0f}s old (> {max_age:g}s)")
            elif max_age is not None and w.oldest_age is None and w.ready:
                status.notes.append(f"--max-age can't judge {w.name}: {w.ready} ready, {_NO_AGE}")
        status.problems += dropped_problems(layouts or [], name, [figures(n) for n in dropped])
        held = [q.name for q in [*own, parked, *status.waiting] if q.exists]
        layout = next((x for x in layouts or [] if x.name == name), None)
        problems, notes = overrides(view, name, held, layout, desired)
        status.problems, status.notes = status.problems + problems, status.notes + notes
        status.breakers = breaker_states(name, live.values(), now)
        status.notes += [breaker_note(b) for b in status.breakers]
        problems, notes = rate_findings(rated[name], figures, paused=status.paused is not None)
        status.problems, status.notes = status.problems + problems, status.notes + notes
        out.append(status)
    if out:  # the vhost's scheduler queues belong to no job queue
        out[0].problems += vhost_overrides(live)
    if out and EVENTS_EXCHANGE not in exchanges:  # once: the exchange is the vhost's, not a job queue's
        out[0].notes.append(
            f"exchange {EVENTS_EXCHANGE!r} does not exist: workers publish no outcome events, and canary replays "
            "need it (replay --canary); amqpjobs topology apply declares it, then restart the workers"
        )
    return out


_NO_AGE = "no known age (quorum queues report no head timestamp; a classic head may carry none, or the stats lag ~5 s)"
