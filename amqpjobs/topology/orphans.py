"""Queues a topology no longer declares (a dropped shard, tier or job queue), what to do with them, where their jobs go.

Lowering ``shards`` (or a tier), raising it from 1, or renaming or removing a job queue leaves
the old queues on the broker: nothing deletes a queue that may hold jobs. A dropped tier
empties itself (its TTL and dead-letter target stay: RabbitMQ "Dead Lettering",
"Time-To-Live"); a dropped shard, and its tiers, which dead-letter into it, is read by nobody,
with crc32 and modulus-hash routing alike; so is every queue of a job queue the topology no
longer names. One home for: which live queues are such orphans (``topology plan``, ``apply``,
``status``, a worker's start), the fix each line names, and the route of a job of a dropped
shard (replay).

Which queues are ours: a name parsed by the naming scheme as a shard or tier of a job queue
of the topology; for any other name (the unsharded work queue of a job queue now sharded, a
job queue no longer named), the arguments amqpjobs declares must say so (:func:`declared_by_us`),
so a queue another application declared in the same vhost is never reported.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from amqpjobs.printable import shell_quote
from amqpjobs.topology.models import JobQueueLayout
from amqpjobs.topology.naming import parse_queue_name, quarantine_exchange_name

#: The queues of a job queue that hold its jobs (its pause flag, breaker and token queues hold none).
JOB_HOLDING_KINDS = ("work", "shard", "tier", "quarantine", "suspects", "parked", "waiting")


def declared_by_us(name: str, arguments: Mapping[str, Any]) -> bool:
    """Whether live queue ``name``'s ``arguments`` are those amqpjobs declares for a queue of that name.

    A work queue, shard or suspects queue of job queue ``N`` dead-letters to exchange
    ``N.quarantine``; a delay tier dead-letters to the default exchange with its work queue
    as routing key and has a TTL (:meth:`~amqpjobs.topology.models.Topology.declarations`).
    A quarantine or parked queue has no argument of its own: it counts by its job queue.
    """
    parsed = parse_queue_name(name)
    if parsed.kind in ("work", "shard", "suspects"):
        return arguments.get("x-dead-letter-exchange") == quarantine_exchange_name(parsed.job_queue)
    if parsed.kind == "tier":
        return (arguments.get("x-dead-letter-exchange") == ""
                and arguments.get("x-dead-letter-routing-key") == parsed.work_queue
                and "x-message-ttl" in arguments)  # fmt: skip
    return False


def removed_job_queues(known: Collection[str], arguments: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Job queues amqpjobs declared on the broker (:func:`declared_by_us`) that are not in ``known``, sorted.

    Args:
        known: Every job queue name of the topology (not a narrowed part of it).
        arguments: Each live queue's name -> its ``arguments`` (management API).
    """
    found = {parse_queue_name(name).job_queue for name, args in arguments.items() if declared_by_us(name, args)}
    return sorted(found - set(known))


def orphan_queues(
    layouts: Iterable[JobQueueLayout],
    live_queues: Iterable[str],
    arguments: Mapping[str, Mapping[str, Any]] | None = None,
    known: Collection[str] = (),
) -> list[str]:
    """The live queues of ours that ``layouts`` do not declare, sorted by name.

    Named like a shard or delay tier of a job queue of ``layouts`` (parsed exactly by the
    naming scheme, :func:`~amqpjobs.topology.naming.parse_queue_name`, not by prefix). With
    ``arguments`` (live queue name -> its arguments) also: a work queue of such a job queue
    that is not declared (``shards`` raised from 1) and any queue holding jobs of a job queue
    neither in ``layouts`` nor in ``known`` (renamed or removed), each when its arguments or its
    job queue's say amqpjobs declared it (:func:`declared_by_us`). Leave ``arguments`` out when
    ``layouts`` are only a part of the topology (a worker's job queues).
    """
    layouts = tuple(layouts)
    declared = {q for lay in layouts for w in lay.work_queues for q in (w, *lay.tier_queues[w])}
    ours = {lay.name for lay in layouts}
    gone = set(removed_job_queues(ours | set(known), arguments)) if arguments is not None else set()
    orphans = []
    for name in live_queues:
        parsed = parse_queue_name(name)
        if name in declared:
            continue
        if parsed.job_queue in ours:  # a shard or tier dropped, or the work queue before shards were raised
            marked = parsed.kind == "work" and declared_by_us(name, (arguments or {}).get(name, {}))
            if parsed.kind in ("shard", "tier") or marked:
                orphans.append(name)
        elif parsed.job_queue in gone and parsed.kind in JOB_HOLDING_KINDS:
            orphans.append(name)
    return sorted(orphans)


def unread(layouts: Iterable[JobQueueLayout], name: str) -> bool:
    """True when orphan ``name`` is a dropped shard or a tier of one: its jobs wait for ever (no worker reads it)."""
    return parse_queue_name(name).work_queue not in {q for lay in layouts for q in lay.work_queues}


def orphan_fixes(layouts: Iterable[JobQueueLayout], orphans: Iterable[tuple[str, int]]) -> list[str]:
    """What to do with each of ``orphans`` ((name, messages) from :func:`orphan_queues`), in order.

    An empty one: delete it. A dropped tier of a declared work queue: its messages go back
    there when their delay ends. A dropped shard (or its tier): drain it, or raise ``shards``
    back to the count that brings back every dropped shard of its job queue. A queue of a job
    queue ``layouts`` do not name (renamed or removed): put it back in the topology, or move its
    jobs (a quarantine or parked queue: ``amqpjobs replay ... --to``).
    """
    layouts, orphans = tuple(layouts), tuple(orphans)
    ours = {lay.name for lay in layouts}
    wanted: dict[str, int] = {}  # job queue -> shards that would bring back all its dropped shards
    for name, _ in orphans:
        parsed = parse_queue_name(name)
        if parsed.shard is not None and unread(layouts, name):
            wanted[parsed.job_queue] = max(wanted.get(parsed.job_queue, 0), parsed.shard + 1)
    fixes = []
    for name, messages in orphans:
        parsed = parse_queue_name(name)
        if not messages:
            fixes.append(
                "it is empty: delete it (its bindings go with it: a publisher or worker still on the old topology "
                "then has its publish returned as unroutable, never lost)"
            )
        elif parsed.job_queue not in ours:
            fixes.append(_removed_fix(name))
        elif not unread(layouts, name):
            fixes.append(
                f"its messages go back to {parsed.work_queue} when their delay ends (dead-lettering); delete it once "
                "empty"
            )
        else:
            fixes.append(
                "drain it (move its messages to a live shard, e.g. a shovel, or consume and re-enqueue) or raise "
                f"shards back to {wanted.get(parsed.job_queue, 1)} so workers read it again, then delete it"
            )
    return fixes


def _removed_fix(name: str) -> str:
    """The fix of orphan ``name`` holding messages, a queue of a job queue the topology no longer names."""
    parsed = parse_queue_name(name)
    whose = f"it belongs to job queue {parsed.job_queue}, which the topology no longer names"
    back = f"put job queue {parsed.job_queue} back in the topology"
    if parsed.kind in ("quarantine", "parked"):
        return (f"{whose}: replay its jobs into a job queue the topology names (amqpjobs replay {shell_quote(name)} "
                f"--to QUEUE) or {back}, then delete it")  # fmt: skip
    then = f"its messages go back to {parsed.work_queue} when their delay ends; " if parsed.kind == "tier" else ""
    return (f"{then}{whose}: {back} so workers read it again, or move its jobs to a job queue the topology names "
            "(e.g. a shovel, or consume and re-enqueue), then delete it")  # fmt: skip


@dataclass(frozen=True)
class Route:
    """Where a publish goes: ``exchange`` (``""``: the default exchange) and ``routing_key``; ``target`` to show."""

    exchange: str
    routing_key: str
    target: str


def replay_route(queue: str, key: str, layouts: Mapping[str, JobQueueLayout] | None) -> tuple[Route, str]:
    """The route of a job going back to work queue ``queue``, keyed ``key`` (its tenant, else its job id).

    ``queue`` itself (the default exchange), unless ``layouts`` (job queue -> current layout)
    says it is a shard its job queue no longer has: then the current shard rule,
    :meth:`~amqpjobs.topology.models.JobQueueLayout.publish_target` (crc32 over the current
    shard count, or the ``<name>.shards`` modulus-hash exchange, where the broker picks).

    Returns:
        The route, and why it is not ``queue`` (``""`` when it is).
    """
    parsed = parse_queue_name(queue)
    layout = (layouts or {}).get(parsed.job_queue)
    if parsed.kind != "shard" or layout is None or queue in layout.work_queues:
        return Route("", queue, queue), ""
    exchange, routing_key = layout.publish_target(key)
    shown = exchange if exchange == layout.shards_exchange else layout.work_queue_for(routing_key)
    return Route(exchange, routing_key, shown), f"re-routed: {queue} is not in the topology"
