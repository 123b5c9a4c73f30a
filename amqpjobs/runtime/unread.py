"""Queues no worker reads: a job queue's shards its topology no longer has, and queues nobody takes from.

A shard dropped by lowering ``shards`` (``topology plan``'s ORPHAN, :mod:`amqpjobs.topology.orphans`)
keeps its jobs with no worker to read them: ``amqpjobs status`` calls it a problem
(:func:`dropped_problems`), a worker's start warns of it (:func:`warn_dropped_shards`).
``quarantine replay`` asks which of its target shards no worker reads (:func:`unread_queues`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from logging import Logger
from typing import TYPE_CHECKING, Any

from amqpjobs.errors import AmqpJobsError, BrokerUnavailableError, ManagementApiError
from amqpjobs.topology.models import JobQueueLayout
from amqpjobs.topology.naming import parse_queue_name
from amqpjobs.topology.orphans import orphan_fixes, orphan_queues, unread
from amqpjobs.wire.declare import probe_queues
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings

if TYPE_CHECKING:
    from amqpjobs.runtime.status import QueueStatus


#: The management API's basic.get counters (RabbitMQ "Management HTTP API", queue ``message_stats``).
_GET_KEYS = ("get", "get_no_ack", "get_empty")


def rate_of(stats: dict[str, Any], key: str) -> float:
    """``key``'s rate in a management API ``message_stats`` (``<key>_details.rate``), per second; 0.0 when absent."""
    details = stats.get(f"{key}_details") or {}
    return float(details.get("rate", 0.0) or 0.0)


def gets_per_second(queue: dict[str, Any]) -> float:
    """basic.get per second on ``queue`` (management API; a sharded job queue's idle worker polls each shard)."""
    return sum(rate_of(queue.get("message_stats") or {}, k) for k in _GET_KEYS)


def unread_queues(settings: BrokerSettings, names: list[str]) -> list[str]:
    """Those of ``names`` that exist and that no worker takes from: no consumer, no basic.get in the last seconds.

    From the management API (its figures lag by the statistics interval, 5 s by default).
    Best effort: an API that can't be reached finds none.
    """
    try:
        with ManagementClient(settings, timeout=5.0) as mgmt:
            live = {q["name"]: q for q in mgmt.queues(settings.vhost)}
    except (BrokerUnavailableError, ManagementApiError):
        return []
    return [n for n in names if n in live and not live[n].get("consumers") and gets_per_second(live[n]) == 0]


def dropped_problems(layouts: list[JobQueueLayout], job_queue: str, dropped: list[QueueStatus]) -> list[str]:
    """A problem per queue of ``dropped`` of ``job_queue`` that holds jobs no worker reads (a shard it no longer has).

    The orphans of ``topology plan`` (:mod:`amqpjobs.topology.orphans`), with the same fix.
    """
    mine = [q for q in dropped if parse_queue_name(q.name).job_queue == job_queue and q.exists and q.ready]
    waiting = [q for q in mine if unread(layouts, q.name)]
    fixes = orphan_fixes(layouts, [(q.name, q.ready) for q in waiting])
    shards = len(next((lay.work_queues for lay in layouts if lay.name == job_queue), ()))
    return [
        f"queue {q.name} holds {q.ready} message(s)"
        + ("" if q.oldest_age is None else f" (oldest {q.oldest_age:.0f}s)")
        + f" but is not in the topology (shards = {shards}): no worker reads it; {fix}"
        for q, fix in zip(waiting, fixes, strict=True)
    ]


async def warn_dropped_shards(settings: BrokerSettings, layouts: Iterable[JobQueueLayout], log: Logger) -> None:
    """Warn (``log``) per job queue of ``layouts`` whose dropped shards (``shards`` lowered) hold jobs.

    A worker's start: the live queue names from the management API (as ``topology plan``),
    then a passive declare of each orphan only (exact depths). Best effort: without the
    management API nothing is said (``amqpjobs status`` and ``topology plan`` still tell).
    """
    layouts = list(layouts)
    try:
        live = await asyncio.to_thread(_queue_names, settings)  # httpx blocks: not on the worker's loop
        names = [n for n in orphan_queues(layouts, live) if unread(layouts, n)]
        depths = await probe_queues(settings, names) if names else {}
    except AmqpJobsError as exc:  # best effort: no reason to refuse a start
        log.debug("dropped shards not checked (%s)", exc)
        return
    for lay in layouts:
        held = [(n, depths[n].messages) for n in names if n in depths and depths[n].messages]
        held = [(n, m) for n, m in held if parse_queue_name(n).job_queue == lay.name]
        if held:
            log.warning(
                "dropped shard(s) of %s hold jobs no worker reads: %s; %s (topology plan lists them as ORPHAN)",
                lay.name, ", ".join(f"{n} ({m} message(s))" for n, m in held), orphan_fixes(layouts, held)[0],
            )  # fmt: skip


def _queue_names(settings: BrokerSettings) -> list[str]:
    """The vhost's queue names (management API, 5 s per request; its errors raised)."""
    with ManagementClient(settings, timeout=5.0) as mgmt:
        return [str(q["name"]) for q in mgmt.queues(settings.vhost)]
