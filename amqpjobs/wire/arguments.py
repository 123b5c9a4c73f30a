"""Build AMQP arguments from declarations: the one place seconds become milliseconds.

Pure functions (no client library import), so plans and exports can use them without a
connection.
"""

from __future__ import annotations

from typing import Any

from amqpjobs.topology.declarations import Declarations, ExchangeDecl, QueueDecl
from amqpjobs.topology.plan import ObjectState, binding_name


def to_milliseconds(seconds: float) -> int:
    """Convert seconds to whole milliseconds, as AMQP arguments and ``expiration`` want them.

    This is the only seconds → milliseconds conversion in amqpjobs.

    Args:
        seconds: A duration in seconds (>= 0).

    Returns:
        The duration in milliseconds, rounded to the nearest millisecond.

    Raises:
        ValueError: ``seconds`` is negative.

    """
    if seconds < 0:
        raise ValueError(f"a duration can't be negative (got {seconds!r} s)")
    return round(seconds * 1000)


def queue_arguments(queue: QueueDecl) -> dict[str, Any]:
    """AMQP ``queue.declare`` arguments for ``queue`` (RabbitMQ "Queues" → "Optional Arguments").

    ``x-queue-type`` is always set, also for classic queues, so that a vhost whose default
    queue type is quorum (RabbitMQ 3.11+/4.x) still gets the type the topology asks for.
    ``x-max-priority`` goes to classic queues only: quorum queues ignore it from 4.3 (strict
    priorities 0-31 always on, release notes 4.3.0) and refuse it before.
    """
    args: dict[str, Any] = {"x-queue-type": queue.queue_type}
    if queue.max_priority is not None and queue.queue_type == "classic":
        args["x-max-priority"] = queue.max_priority
    if queue.message_ttl is not None:
        args["x-message-ttl"] = to_milliseconds(queue.message_ttl)
    if queue.dead_letter_exchange is not None:
        args["x-dead-letter-exchange"] = queue.dead_letter_exchange
    if queue.dead_letter_routing_key is not None:
        args["x-dead-letter-routing-key"] = queue.dead_letter_routing_key
    if queue.dead_letter_strategy is not None:
        args["x-dead-letter-strategy"] = queue.dead_letter_strategy
    if queue.delivery_limit is not None:
        args["x-delivery-limit"] = queue.delivery_limit
    if queue.max_length is not None:
        args["x-max-length"] = queue.max_length
    if queue.overflow is not None:
        args["x-overflow"] = queue.overflow
    return args


def consume_arguments(consumer_timeout: float | None) -> dict[str, Any]:
    """AMQP ``basic.consume`` arguments: ``x-consumer-timeout`` (milliseconds) when given.

    RabbitMQ 4.3.0 release notes: on quorum queues the consume argument sets the delivery
    acknowledgement timeout per consumer, ahead of the queue argument, a policy and
    ``consumer_timeout`` in rabbitmq.conf.

    Args:
        consumer_timeout: Seconds, or None to send no argument.

    """
    return {} if consumer_timeout is None else {"x-consumer-timeout": to_milliseconds(consumer_timeout)}


def exchange_state(exchange: ExchangeDecl) -> ObjectState:
    """The desired state of ``exchange``."""
    return ObjectState("exchange", exchange.name, exchange.type, exchange.durable, exchange.auto_delete)


def queue_state(queue: QueueDecl) -> ObjectState:
    """The desired state of ``queue``; with a legacy note, its classic :meth:`~QueueDecl.legacy_shape` is accepted."""
    shape = queue.legacy_shape()
    legacy = None if shape is None else (queue_state(shape), queue.legacy_note)
    return ObjectState("queue", queue.name, queue.queue_type, True, False, queue_arguments(queue), legacy=legacy)


def desired_state(declarations: Declarations) -> list[ObjectState]:
    """Every declared object as an :class:`ObjectState`, in dependency order."""
    return [
        *(exchange_state(e) for e in declarations.exchanges),
        *(queue_state(q) for q in declarations.queues),
        *(ObjectState("binding", binding_name(b.source, b.destination, b.routing_key)) for b in declarations.bindings),
    ]
