"""Declare a topology's broker objects over AMQP, in dependency order."""

from __future__ import annotations

import aio_pika
from aio_pika.abc import AbstractChannel

from amqpjobs.topology.models import Declarations
from amqpjobs.wire.arguments import queue_arguments


async def declare(channel: AbstractChannel, declarations: Declarations) -> None:
    """Declare exchanges, then queues, then bindings, all durable.

    Call only after a plan found no conflict: an inequivalent re-declare fails with
    ``406 PRECONDITION_FAILED`` and closes the channel (RabbitMQ "Queues" → "Declaration
    and Property Equivalence").

    Raises:
        aio_pika.exceptions.AMQPError: the broker refused a declaration.
    """
    exchanges = {}
    for ex in declarations.exchanges:
        exchanges[ex.name] = await channel.declare_exchange(
            ex.name, aio_pika.ExchangeType(ex.type), durable=ex.durable, auto_delete=ex.auto_delete,
            internal=ex.internal,
        )
    queues = {}
    for q in declarations.queues:
        queues[q.name] = await channel.declare_queue(q.name, durable=True, arguments=queue_arguments(q))
    for b in declarations.bindings:
        if b.destination_type == "queue":
            await queues[b.destination].bind(b.source, routing_key=b.routing_key)
        else:
            await exchanges[b.destination].bind(b.source, routing_key=b.routing_key)
