"""Queues a topology no longer declares (a dropped shard or tier), what to do with them, and where their jobs go.

Lowering ``shards`` (or a tier), or raising it from 1 (the job queue's own work queue is no
shard), leaves the dropped queues on the broker: nothing deletes a
queue that may hold jobs. A dropped tier empties itself (its TTL and dead-letter target
stay: RabbitMQ "Dead Lettering", "Time-To-Live"); a dropped shard, and its tiers, which
dead-letter into it, is read by nobody, with crc32 and modulus-hash routing alike. One
home for: which live queues are such orphans (``topology plan``, ``status``, a worker's
start), the fix each line names, and the route of a job of a dropped shard (replay).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from amqpjobs.topology.models import JobQueueLayout
from amqpjobs.topology.naming import parse_queue_name


def orphan_queues(layouts: Iterable[JobQueueLayout], live_queues: Iterable[str]) -> list[str]:
    """The live queues named like a shard, delay tier or work queue of a job queue of ``layouts`` it does not declare.

    Parsed exactly by the naming scheme (:func:`~amqpjobs.topology.naming.parse_queue_name`),
    not by prefix; sorted by name.
    """
    layouts = tuple(layouts)
    declared = {q for lay in layouts for w in lay.work_queues for q in (w, *lay.tier_queues[w])}
    ours = {lay.name for lay in layouts}
    orphans = []
    for name in live_queues:
        parsed = parse_queue_name(name)
        # (a "work" one: the job queue's own work queue, left when its shards were raised from 1)
        if name not in declared and parsed.kind in ("shard", "tier", "work") and parsed.job_queue in ours:
            orphans.append(name)
    return sorted(orphans)


def unread(layouts: Iterable[JobQueueLayout], name: str) -> bool:
    """True when orphan ``name`` is a dropped shard or a tier of one: its jobs wait for ever (no worker reads it)."""
    return parse_queue_name(name).work_queue not in {q for lay in layouts for q in lay.work_queues}


def orphan_fixes(layouts: Iterable[JobQueueLayout], orphans: Iterable[tuple[str, int]]) -> list[str]:
    """What to do with each of ``orphans`` ((name, messages) from :func:`orphan_queues`), in order.

    An empty one: delete it. A dropped tier of a declared work queue: its messages go back
    there when their delay ends. A dropped shard (or its tier): drain it, or raise ``shards``
    back to the count that brings back every dropped shard of its job queue.
    """
    layouts, orphans = tuple(layouts), tuple(orphans)
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
        elif not unread(layouts, name):
            fixes.append(
                f"its messages go back to {parsed.work_queue} when their delay ends (dead-lettering); delete it once "
                "empty"
            )
        else:
            back = (
                "set shards back to 1" if parsed.shard is None else f"raise shards back to {wanted[parsed.job_queue]}"
            )
            fixes.append(
                "drain it (move its messages to a live shard, e.g. a shovel, or consume and re-enqueue) or "
                f"{back} so workers read it again, then delete it"
            )
    return fixes


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
