"""Broker resource alarms in ``amqpjobs status``: a node low on disk or memory blocks every publisher.

While any node of the cluster has a memory or disk alarm, RabbitMQ stops reading from every
connection that publishes ("Memory and Disk Alarms"): ``enqueue`` waits ``blocked_timeout``
and raises ``BrokerBlockedError``, and the workers' retry and quarantine copies wait until
it clears. Queue figures show none of it, so ``status`` asks ``/api/health/checks/alarms``
once and calls each alarm a problem of the whole broker.
"""

from __future__ import annotations

import asyncio

from amqpjobs.errors import ManagementApiError
from amqpjobs.printable import printable
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings


async def broker_alarms(settings: BrokerSettings) -> tuple[list[dict[str, str]] | None, str]:
    """The alarms in effect anywhere in the cluster (``[{"node": ..., "resource": ...}]``), or None and why not.

    None: the management API refused the health check (a RabbitMQ before 3.8.10 has none; a
    user with the ``management`` tag may ask it). Asked in a thread (the HTTP client blocks), 5 s at most.

    Raises:
        BrokerUnavailableError: the management API can't be reached (as the rest of ``status``).
    """

    def ask() -> list[dict[str, str]]:
        with ManagementClient(settings, timeout=5.0) as mgmt:
            return mgmt.alarm_details()

    try:
        return await asyncio.to_thread(ask), ""
    except ManagementApiError as exc:
        return None, str(exc)


def alarm_problem(alarms: list[dict[str, str]]) -> str:
    """The one ``status`` problem line for ``alarms`` (not empty): which resource, on which node, and what to do."""
    where = "; ".join(f"{printable(a['resource'])} on {printable(a['node'])}" for a in alarms)
    return (
        f"the broker is blocking publishers: resource alarm ({where}): no job can be enqueued (enqueue waits "
        "its blocked_timeout, then raises BrokerBlockedError) and workers' retry and quarantine copies wait "
        "until it clears (free disk space or memory on that node; rabbitmq-diagnostics alarms lists them)"
    )


def alarms_unknown_note(why: str) -> str:
    """The ``status`` note when the management API would not say whether an alarm is in effect (``why``: its error)."""
    return (
        f"resource alarms unknown: GET /api/health/checks/alarms was refused ({printable(why)}); "
        "status can't tell whether the broker blocks publishers (RabbitMQ 3.8.10 or later answers it)"
    )
