"""A worker's start-up check that its tier, quarantine and suspects objects exist, and why one is missing.

Missing may mean never declared (apply the topology) or, for a classic queue, that the one node
it lives on is down (RabbitMQ "Classic Queues" -> "Availability"): the advice tells them apart
through the management API.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from amqpjobs.errors import BrokerError, BrokerUnavailableError, ManagementApiError
from amqpjobs.runtime.deploy import require_majority_at_start
from amqpjobs.topology.models import JobQueueLayout
from amqpjobs.wire.declare import missing_objects
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings

log = logging.getLogger("amqpjobs.topology")


async def require_objects_at_start(settings: BrokerSettings, layouts: Iterable[JobQueueLayout]) -> None:
    """A worker's start-up check: a Raft majority (4.3+), then every tier, quarantine and suspects object.

    Raises:
        BrokerError: (RabbitMQ 4.3+) fewer than a majority of the cluster's nodes run, or
            objects are missing (the message names them and how to declare them).
    """
    layouts = list(layouts)
    needed = [n for lay in layouts for w in lay.work_queues for n in lay.tier_queues[w]]
    needed += [q for lay in layouts for q in (lay.quarantine_queue, lay.suspects_queue)]
    await require_majority_at_start(settings)
    found = await missing_objects(settings, needed, [lay.quarantine_exchange for lay in layouts])
    queues, exchanges = (sorted(m) for m in found)
    if queues or exchanges:
        advice = await asyncio.to_thread(missing_objects_advice, settings, queues, exchanges)
        raise BrokerError(f"{advice}; without them retries, quarantine and crash containment can't work")


def missing_objects_advice(settings: BrokerSettings, queues: list[str], exchanges: list[str]) -> str:
    """Why passive declares of ``queues`` and ``exchanges`` failed, and the fix: not there, or on a node that is down.

    A classic queue lives on one node; while that node is down a passive declare of it fails
    with ``404 NOT_FOUND`` although it exists (RabbitMQ "Classic Queues" -> "Availability";
    the management API then shows it with state ``down``). Asks the management API (wire
    layer) for each queue's node and state, and which nodes run (``GET /api/nodes`` needs the
    ``monitoring`` tag: without it a queue's own state still tells). When the API can't tell,
    the advice names both possibilities.

    Returns:
        One sentence per cause, joined by ``"; "``, e.g. ``"queue(s) work.quarantine exist but
        their node rabbit@n2 is down (...): bring rabbit@n2 back (...)"`` or ``"queue(s) a and
        exchange(s) b do not exist on <url>: apply the topology first (amqpjobs topology apply)"``.

    """
    down: dict[str, list[str]] = {}
    checked = True
    if queues:
        try:
            with ManagementClient(settings, timeout=5.0) as mgmt:
                found = {n: mgmt.queue(settings.vhost, n) for n in queues}
                try:
                    running: dict[str, bool] | None = mgmt.running_nodes()
                except ManagementApiError:
                    running = None
        except (BrokerUnavailableError, ManagementApiError) as exc:
            log.debug("queue hosts not checked (management API: %s)", exc)
            found, running, checked = {}, None, False
        for name, info in found.items():
            node = str(info.get("node", "?")) if info else ""
            if info and (info.get("state") == "down" or (running is not None and running.get(node) is False)):
                down.setdefault(node, []).append(name)
    parts = [
        f"queue(s) {', '.join(q)} exist but their node {node} is down (management API: state down): bring "
        f"{node} back (a classic queue lives on that node only; topology apply can't help, the queues exist)"
        for node, q in sorted(down.items())
    ]
    absent = [q for q in queues if not any(q in on_node for on_node in down.values())]
    what = " and ".join(f"{k}(s) {', '.join(m)}" for k, m in (("queue", absent), ("exchange", exchanges)) if m)
    if what:
        maybe_down = "" if checked or not absent else ", or bring back the cluster node they live on if it is down"
        parts.append(
            f"{what} do not exist on {settings.safe_url}: apply the topology first (amqpjobs topology apply)"
            + maybe_down
        )
    return "; ".join(parts)
