"""Export a topology as RabbitMQ definitions JSON.

The format is the one ``rabbitmqctl export_definitions`` writes and
``rabbitmqctl import_definitions`` / ``POST /api/definitions`` read (RabbitMQ
"Definitions" guide): top-level ``exchanges``, ``queues`` and ``bindings`` lists whose
entries name their vhost.
"""

from __future__ import annotations

from typing import Any

from amqpjobs.topology.declarations import Declarations
from amqpjobs.wire.arguments import queue_arguments


def export_definitions(declarations: Declarations, vhost: str = "/") -> dict[str, Any]:
    """Build a definitions document for ``declarations`` in ``vhost``.

    Args:
        declarations: The broker objects to export.
        vhost: Virtual host every object is placed in.

    Returns:
        A JSON-serialisable dict with ``exchanges``, ``queues`` and ``bindings`` (and
        empty ``users``/``vhosts``/``permissions``/``policies``/``parameters`` so it
        never touches anything else on import).

    """
    return {
        "users": [],
        "vhosts": [],
        "permissions": [],
        "parameters": [],
        "policies": [],
        "queues": [
            {
                "name": q.name,
                "vhost": vhost,
                "durable": True,
                "auto_delete": False,
                "arguments": queue_arguments(q),
            }
            for q in declarations.queues
        ],
        "exchanges": [
            {
                "name": e.name,
                "vhost": vhost,
                "type": e.type,
                "durable": e.durable,
                "auto_delete": e.auto_delete,
                "internal": e.internal,
                "arguments": {},
            }
            for e in declarations.exchanges
        ],
        "bindings": [
            {
                "source": b.source,
                "vhost": vhost,
                "destination": b.destination,
                "destination_type": b.destination_type,
                "routing_key": b.routing_key,
                "arguments": {},
            }
            for b in declarations.bindings
        ],
    }
