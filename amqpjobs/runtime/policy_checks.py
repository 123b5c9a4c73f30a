"""What on the broker overrides the topology: policies on our queues, and queues declared again with other arguments.

The rule of what a policy does to a queue lives in :mod:`amqpjobs.topology.policy_effects`;
this module reads the vhost through the management API and applies it: a live queue by its
``effective_policy_definition``, a queue ``topology plan`` would create by the vhost's
policies and operator policies (the ones that would match it once declared). A queue whose
arguments differ from the topology's (deleted and declared again by another program) is a
plan's CONFLICT (:func:`~amqpjobs.topology.plan.make_plan`): ``status`` and a worker's start
say so too (:func:`argument_drift`), since ``plan`` is only run at deploy time.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from logging import Logger
from typing import Any

from amqpjobs.errors import AmqpJobsError, ManagementApiError
from amqpjobs.topology.models import JobQueueLayout
from amqpjobs.topology.naming import parse_queue_name
from amqpjobs.topology.plan import ObjectState, drift_effects, make_plan
from amqpjobs.topology.policy_effects import (
    STATE,
    PolicyEffect,
    effect,
    exchange_effect,
    from_management,
    matching,
    source_type,
)
from amqpjobs.wire.live_objects import queue_state
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings


def live_effects(
    live: Mapping[str, Mapping[str, Any]], names: Iterable[str], broker: tuple[int, ...] | None = None
) -> dict[str, PolicyEffect]:
    """What the policies in effect on each of ``names`` found in ``live`` (queues by name, as the API lists them) do.

    ``broker``: the broker's version (a ``consumer-timeout`` policy applies before 4.3 only).
    """
    types = {n: str(q.get("type") or "classic") for n, q in live.items()}
    found = {n: effect(from_management(live[n], source_type(n, types), broker)) for n in names if n in live}
    return {n: e for n, e in found.items() if e is not None}


def planned_effects(
    mgmt: ManagementClient, vhost: str, desired: Sequence[ObjectState], broker: tuple[int, ...] | None = None
) -> list[PolicyEffect]:
    """What the policies do to each queue, then exchange, of ``desired``: live queues, and new ones once declared.

    ``broker``: the broker's version, for the rules that depend on it.

    A user who may not read the vhost's policies (no ``policymaker`` tag) still gets the live
    queues' effects; the queues to create, and the exchanges, are then not judged.
    """
    queues = [d for d in desired if d.kind == "queue"]
    ours = [d.name for d in desired if d.kind == "exchange"]
    live = {str(q["name"]): q for q in mgmt.queues(vhost)}
    exchanges = {str(e["name"]): e for e in mgmt.exchanges(vhost)}
    policies: tuple[list[dict[str, Any]], list[dict[str, Any]]] = ([], [])
    if any(d.name not in live for d in queues) or any(exchanges.get(n, {}).get("policy") for n in ours):
        with contextlib.suppress(ManagementApiError):  # no policymaker tag: those go unjudged
            policies = (mgmt.policies(vhost), policies[1])
        with contextlib.suppress(ManagementApiError):  # operator policies may need more than that
            policies = (policies[0], mgmt.policies(vhost, operator=True))
    types = {d.name: d.type for d in queues}
    out = []
    for d in queues:
        source = source_type(d.name, types)
        q = (
            from_management(live[d.name], source, broker)
            if d.name in live
            else matching(d.name, d.type, d.arguments, *policies, source, broker)
        )
        if (e := effect(q)) is not None:
            out.append(e)
    return out + exchange_effects(exchanges, policies[0], ours)


def argument_drift(
    desired: Sequence[ObjectState], live: Mapping[str, Mapping[str, Any]], names: Iterable[str]
) -> list[str]:
    """One problem per queue of ``names`` whose live type, flags or arguments differ from ``desired``'s.

    ``live``: queues by name as the management API lists them. A queue missing on either side
    is left out (a missing one is its own problem).
    """
    wanted = {d.name: d for d in desired if d.kind == "queue"}
    pairs = [(wanted[n], queue_state(dict(live[n]))) for n in names if n in wanted and n in live]
    plan = make_plan([want for want, _ in pairs], [have for _, have in pairs])
    return [
        f"queue {item.desired.name} differs from the topology: {'; '.join(map(str, item.differences))} (declared "
        f"again by another program?); {drift_effects(item.differences)}: amqpjobs topology plan shows the remedy"
        for item in plan.conflicts
    ]


def exchange_effects(
    exchanges: Mapping[str, Mapping[str, Any]], policies: Iterable[Mapping[str, Any]], names: Iterable[str]
) -> list[PolicyEffect]:
    """What the user policy on each exchange of ``names`` found in ``exchanges`` (as the API lists them) changes.

    The API names an exchange's policy only; its definition comes from ``policies`` (the
    vhost's, :meth:`~amqpjobs.wire.management.ManagementClient.policies`).
    """
    by_name = {str(p.get("name")): p.get("definition") or {} for p in policies}
    found = [
        exchange_effect(n, exchanges[n].get("arguments") or {}, exchanges[n].get("policy"),
                        by_name.get(str(exchanges[n].get("policy")), {}))
        for n in names if n in exchanges
    ]  # fmt: skip
    return [e for e in found if e is not None]


def unbound(layout: JobQueueLayout, routes: Iterable[tuple[str, str, str]]) -> list[str]:
    """A problem per work queue of ``layout`` that its exchange does not route its jobs to.

    ``routes``: the vhost's bindings as (source, destination, routing key). Publishers use the
    job queue's first routing key (a shard's own key); under modulus-hash any binding from
    ``<name>.shards`` to the shard. Without it an enqueue is returned unroutable, or, with an
    alternate exchange, confirmed and lost to the workers.
    """
    routes = set(routes)
    sources = {(s, d) for s, d, _ in routes}
    out = []
    for i, work in enumerate(layout.work_queues):
        if layout.shards_exchange is not None and (layout.shards_exchange, work) not in sources:
            out.append(f"exchange {layout.shards_exchange} is not bound to {work} (apply the topology): no job "
                       "reaches it")  # fmt: skip
        key = layout.shard_routing_keys[i] if layout.shard_routing_keys else layout.routing_key
        if (layout.exchange, work, key) not in routes:
            out.append(f"exchange {layout.exchange} is not bound to {work} with routing key {key!r} (apply the "
                       "topology): enqueues are returned unroutable, or go to an alternate exchange")  # fmt: skip
    return out


@dataclass(frozen=True)
class View:
    """What ``status`` read of a vhost: queues and exchanges by name, bindings, policies (management API)."""

    queues: Mapping[str, Mapping[str, Any]]
    exchanges: Mapping[str, Mapping[str, Any]]
    bindings: set[tuple[str, str, str]]
    policies: list[dict[str, Any]]
    broker: tuple[int, ...] | None = None  # the broker's version


def overrides(
    view: View, job_queue: str, held: list[str], layout: JobQueueLayout | None, desired: Sequence[ObjectState]
) -> tuple[list[str], list[str]]:
    """(problems, notes) of ``job_queue`` for ``status``: what on the broker overrides its topology.

    ``held``: its queues that exist (work, tiers, quarantine, suspects, parked, waiting rooms);
    its state queues (a pause flag, a breaker's record) are added. ``layout`` and ``desired``
    (the topology's, when ``status`` was given one): a queue declared again with other
    arguments, a work queue its exchange does not route to, an alternate exchange on it.
    """
    held = held + [n for n in view.queues if (q := parse_queue_name(n)).job_queue == job_queue and q.kind in STATE]
    problems = argument_drift(desired, view.queues, held)  # declared again by someone else
    notes: list[str] = []
    if layout is not None:
        problems += unbound(layout, view.bindings)
        notes += [
            str(e)
            for e in exchange_effects(view.exchanges, view.policies, [layout.exchange, layout.quarantine_exchange])
        ]
    for found in live_effects(view.queues, held, view.broker).values():  # a policy overriding the topology
        (problems if found.loses else notes).append(str(found))
    return problems, notes


def vhost_overrides(queues: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """A problem per scheduler tick store and app ledger marker of the vhost (``queues``) a policy can delete."""
    state = [n for n in queues if parse_queue_name(n).kind in ("ticks", "ledger")]
    return [str(e) for e in live_effects(queues, state).values() if e.loses]


def layout_queues(layouts: Iterable[JobQueueLayout]) -> list[str]:
    """Every queue of ``layouts`` that holds jobs: work queues, tiers, quarantine, suspects, parked."""
    out: list[str] = []
    for lay in layouts:
        out += [*lay.work_queues, *(t for w in lay.work_queues for t in lay.tier_queues[w])]
        out += [lay.quarantine_queue, lay.suspects_queue, lay.parked_queue]
    return out


async def warn_overrides(
    settings: BrokerSettings,
    names: list[str],
    desired: Sequence[ObjectState],
    log: Logger,
    broker: tuple[int, ...] | None = None,
) -> None:
    """Warn (``log``) once per queue of ``names`` whose policies can lose jobs or whose arguments differ.

    A worker's start (its job queues' queues, :func:`layout_queues`; ``desired``: the app's
    topology's objects) and a scheduler's (its tick stores; nothing desired); ``broker``: the
    broker's version read at connect. Best effort:
    without the management API nothing is said (``amqpjobs status`` and ``topology plan``
    still tell).
    """

    def read() -> tuple[dict[str, PolicyEffect], list[str]]:
        with ManagementClient(settings, timeout=5.0) as mgmt:
            live = {str(q["name"]): q for q in mgmt.queues(settings.vhost)}
        return live_effects(live, names, broker), argument_drift(desired, live, names)

    try:
        found, drift = await asyncio.to_thread(read)  # httpx blocks: not on the loop
    except AmqpJobsError as exc:
        log.debug("policies and queue arguments not checked (%s)", exc)
        return
    for line in [*drift, *(str(e) for e in found.values() if e.loses)]:
        log.warning("%s (amqpjobs status lists it until fixed)", line)
