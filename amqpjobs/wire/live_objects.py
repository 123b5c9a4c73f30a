"""The broker's live objects, as the management API lists them, in the form a plan compares (no request made here).

``topology plan`` and ``apply`` diff desired objects against live ones
(:class:`~amqpjobs.topology.plan.ObjectState`, :mod:`amqpjobs.topology.plan`); the lists come
from :meth:`~amqpjobs.wire.management.ManagementClient.live_state`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from amqpjobs.topology.plan import ObjectState, binding_name


def live_objects(
    exchanges: Iterable[dict[str, Any]], queues: Iterable[dict[str, Any]], bindings: Iterable[dict[str, Any]]
) -> list[ObjectState]:
    """Exchanges (except the default and ``amq.*`` ones), queues and bindings (except the default exchange's).

    Args:
        exchanges: A vhost's exchanges, as ``GET /api/exchanges/<vhost>`` answers.
        queues: Its queues (``GET /api/queues/<vhost>``).
        bindings: Its bindings (``GET /api/bindings/<vhost>``).

    """
    state: list[ObjectState] = []
    for ex in exchanges:
        name = ex["name"]
        if not name or name.startswith("amq."):
            continue
        args = ex.get("arguments") or {}
        state.append(ObjectState("exchange", name, ex["type"], bool(ex["durable"]), bool(ex["auto_delete"]), args))
    state += [queue_state(q) for q in queues]
    for b in bindings:
        if not b["source"]:
            continue
        state.append(ObjectState("binding", binding_name(b["source"], b["destination"], b["routing_key"])))
    return state


def queue_state(queue: dict[str, Any]) -> ObjectState:
    """A queue as ``GET /api/queues/<vhost>`` describes it, as an :class:`ObjectState` (what a plan compares)."""
    return ObjectState(
        "queue",
        queue["name"],
        queue.get("type", "classic"),
        bool(queue["durable"]),
        bool(queue["auto_delete"]),
        queue.get("arguments") or {},
        queue.get("messages"),
    )
