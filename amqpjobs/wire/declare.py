"""Declare a topology's broker objects over AMQP, in dependency order."""

from __future__ import annotations

from dataclasses import dataclass

import aio_pika
import aiormq
from aio_pika.abc import AbstractChannel

from amqpjobs.errors import BrokerError, TopologyConflictError
from amqpjobs.topology.models import Declarations
from amqpjobs.wire.arguments import queue_arguments
from amqpjobs.wire.connection import close_channel, connect
from amqpjobs.wire.settings import BrokerSettings


async def declare(channel: AbstractChannel, declarations: Declarations) -> None:
    """Declare exchanges, then queues, then bindings, all durable.

    Call only after a plan found no conflict: an inequivalent re-declare fails with
    ``406 PRECONDITION_FAILED`` and closes the channel (RabbitMQ "Queues" → "Declaration
    and Property Equivalence").

    Raises:
        TopologyConflictError: the broker refused a declaration as inequivalent: someone
            created a conflicting object after the plan (``declared_nothing`` is False:
            what was declared before it remains).
        BrokerError: the broker refused a declaration for another reason.

    """
    try:
        await _declare(channel, declarations)
    except aiormq.exceptions.ChannelPreconditionFailed as exc:
        raise TopologyConflictError(
            f"the broker refused a declaration made after planning: {exc}; objects declared before it remain. "
            "Run `amqpjobs topology plan` to see the conflict",
            declared_nothing=False,
        ) from exc
    except aiormq.exceptions.AMQPError as exc:
        raise BrokerError(f"the broker refused a declaration: {exc}") from exc


async def _declare(channel: AbstractChannel, declarations: Declarations) -> None:
    exchanges = {}
    for ex in declarations.exchanges:
        exchanges[ex.name] = await channel.declare_exchange(
            ex.name,
            aio_pika.ExchangeType(ex.type),
            durable=ex.durable,
            auto_delete=ex.auto_delete,
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


@dataclass(frozen=True)
class QueueProbe:
    """What a passive declare tells about a queue, exactly and now.

    Attributes:
        messages: Messages ready for delivery.
        consumers: Consumers.
    """

    messages: int
    consumers: int


async def probe_queues(settings: BrokerSettings, names: list[str]) -> dict[str, QueueProbe]:
    """Exact depth and consumer count of queues, by passive declare, each on its own throwaway channel.

    A passive declare of a missing queue fails with ``404 NOT_FOUND`` and closes its
    channel (RabbitMQ "Queues" → "Passive Declaration"), hence one channel per probe.
    Missing queues are left out of the result.

    Raises:
        BrokerUnavailableError: cannot connect.
    """
    found: dict[str, QueueProbe] = {}
    connection = await connect(settings, wait=5.0, name="amqpjobs-probe")
    try:
        for name in dict.fromkeys(names):
            channel = await connection.channel(publisher_confirms=False)
            try:
                result = (await channel.declare_queue(name, passive=True)).declaration_result
                found[name] = QueueProbe(result.message_count or 0, result.consumer_count or 0)
            except aiormq.exceptions.ChannelNotFoundEntity:
                continue
            finally:
                await close_channel(channel)
    finally:
        await connection.close()
    return found
