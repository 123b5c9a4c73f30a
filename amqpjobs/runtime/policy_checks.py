"""Policies on our queues that can lose jobs, read from the broker: for plan, status and a worker's start.

The rule of what a policy does to a queue lives in :mod:`amqpjobs.topology.policy_effects`;
this module reads the vhost through the management API and applies it: a live queue by its
``effective_policy_definition``, a queue ``topology plan`` would create by the vhost's
policies and operator policies (the ones that would match it once declared).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Mapping, Sequence
from logging import Logger
from typing import Any

from amqpjobs.errors import AmqpJobsError, ManagementApiError
from amqpjobs.topology.models import JobQueueLayout
from amqpjobs.topology.plan import ObjectState
from amqpjobs.topology.policy_effects import PolicyEffect, effect, from_management, matching, source_type
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings


def live_effects(live: Mapping[str, Mapping[str, Any]], names: Iterable[str]) -> dict[str, PolicyEffect]:
    """What the policies in effect on each of ``names`` found in ``live`` (queues by name, as the API lists them) do."""
    types = {n: str(q.get("type") or "classic") for n, q in live.items()}
    found = {n: effect(from_management(live[n], source_type(n, types))) for n in names if n in live}
    return {n: e for n, e in found.items() if e is not None}


def planned_effects(mgmt: ManagementClient, vhost: str, desired: Sequence[ObjectState]) -> list[PolicyEffect]:
    """What the policies do to each queue of ``desired`` (in its order): live ones as they are, new ones once declared.

    A user who may not read the vhost's policies (no ``policymaker`` tag) still gets the live
    queues' effects; the queues to create are then not judged.
    """
    queues = [d for d in desired if d.kind == "queue"]
    live = {str(q["name"]): q for q in mgmt.queues(vhost)}
    new = [d for d in queues if d.name not in live]
    policies: tuple[list[dict[str, Any]], list[dict[str, Any]]] = ([], [])
    if new:
        with contextlib.suppress(ManagementApiError):  # no policymaker tag: the new queues go unjudged
            policies = (mgmt.policies(vhost), mgmt.policies(vhost, operator=True))
    types = {d.name: d.type for d in queues}
    out = []
    for d in queues:
        source = source_type(d.name, types)
        q = (
            from_management(live[d.name], source)
            if d.name in live
            else matching(d.name, d.type, d.arguments, *policies, source)
        )
        if (e := effect(q)) is not None:
            out.append(e)
    return out


def layout_queues(layouts: Iterable[JobQueueLayout]) -> list[str]:
    """Every queue of ``layouts`` that holds jobs: work queues, tiers, quarantine, suspects, parked."""
    out: list[str] = []
    for lay in layouts:
        out += [*lay.work_queues, *(t for w in lay.work_queues for t in lay.tier_queues[w])]
        out += [lay.quarantine_queue, lay.suspects_queue, lay.parked_queue]
    return out


async def warn_policy_effects(settings: BrokerSettings, layouts: Iterable[JobQueueLayout], log: Logger) -> None:
    """Warn (``log``) once per queue of ``layouts`` whose policies can lose jobs (a worker's start).

    Best effort: without the management API nothing is said (``amqpjobs status`` and
    ``topology plan`` still tell).
    """
    names = layout_queues(layouts)

    def read() -> dict[str, PolicyEffect]:
        with ManagementClient(settings, timeout=5.0) as mgmt:
            return live_effects({str(q["name"]): q for q in mgmt.queues(settings.vhost)}, names)

    try:
        found = await asyncio.to_thread(read)  # httpx blocks: not on the worker's loop
    except AmqpJobsError as exc:
        log.debug("policies not checked (%s)", exc)
        return
    for e in found.values():
        if e.loses:
            log.warning("%s (amqpjobs status lists it until fixed)", e)
