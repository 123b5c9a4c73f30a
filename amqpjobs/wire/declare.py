"""Declare a topology's broker objects over AMQP, in dependency order."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

import aiormq
from aio_pika.abc import AbstractRobustConnection

from amqpjobs.errors import BrokerError, BrokerUnavailableError, TopologyConflictError
from amqpjobs.topology.models import BindingDecl, Declarations, ExchangeDecl, QueueDecl
from amqpjobs.wire.arguments import queue_arguments
from amqpjobs.wire.connection import close_channel, connect
from amqpjobs.wire.settings import BrokerSettings

#: Channels a deploy declares on at once. Each declaration is one round trip; spreading them
#: over a few channels lets the broker work on several at a time (200 job queues with 3 tiers
#: each: 1,600 declarations in about 0.5 s instead of 3.5 s; bench/RESULTS.md, item 7).
DECLARE_CHANNELS = 8


async def declare(connection: AbstractRobustConnection, declarations: Declarations) -> None:
    """Declare exchanges, then queues, then bindings, all durable, over a few channels at once.

    Each stage finishes before the next starts (a binding needs its queue and exchange; a
    queue's dead-letter exchange is only a name). Within a stage the objects are spread
    over :data:`DECLARE_CHANNELS` channels. Call only after a plan found no conflict: an
    inequivalent re-declare fails with ``406 PRECONDITION_FAILED`` and closes its channel
    (RabbitMQ "Queues" → "Declaration and Property Equivalence").

    Raises:
        TopologyConflictError: the broker refused a declaration as inequivalent: someone
            created a conflicting object after the plan (``declared_nothing`` is False:
            what was declared before it remains).
        BrokerError: the broker refused a declaration for another reason.

    """
    transport = connection.transport
    if transport is None:
        raise BrokerError("not connected to the broker")
    # plain aiormq channels: a channel the broker closes (say, ACCESS_REFUSED) must stay closed,
    # not be reopened by the robust connection while the other channels still declare
    underlays = [await transport.connection.channel(publisher_confirms=False) for _ in range(DECLARE_CHANNELS)]
    done = False
    try:
        stages: list[list[Callable[[aiormq.abc.AbstractChannel], Awaitable[object]]]] = [
            [_exchange(ex) for ex in declarations.exchanges],
            [_queue(q) for q in declarations.queues],
            [_binding(b) for b in declarations.bindings],
        ]
        for stage in stages:
            await _spread(underlays, stage)
        done = True
    except aiormq.exceptions.ChannelPreconditionFailed as exc:
        raise TopologyConflictError(
            f"the broker refused a declaration made after planning: {exc}; objects declared before it remain. "
            "Run `amqpjobs topology plan` to see the conflict",
            declared_nothing=False,
        ) from exc
    except aiormq.exceptions.AMQPError as exc:
        raise BrokerError(
            f"the broker refused a declaration: {exc}; objects declared before it remain (declaring is "
            "idempotent: fix the cause and apply again)"
        ) from exc
    finally:
        # after a refusal, the channels are left to the connection's close: closing one the broker
        # has just closed can cross its close and make it close the whole connection
        for ch in underlays if done else ():
            with contextlib.suppress(Exception):
                await ch.close()


async def _spread(
    channels: list[aiormq.abc.AbstractChannel], calls: list[Callable[[aiormq.abc.AbstractChannel], Awaitable[object]]]
) -> None:
    """Run ``calls`` round-robin over ``channels``, each channel's share in order; the first error wins.

    After an error the other channels finish the declaration they are waiting for and stop:
    none is cancelled mid-call (aiormq would close its channel, racing the broker's close).
    """
    errors: list[BaseException] = []

    async def run(k: int) -> None:
        for call in calls[k :: len(channels)]:
            if errors:
                return
            try:
                await call(channels[k])
            except Exception as exc:
                errors.append(exc)
                return

    await asyncio.gather(*(run(k) for k in range(min(len(channels), len(calls)))))
    if errors:
        raise errors[0]


def _exchange(ex: ExchangeDecl) -> Callable[[aiormq.abc.AbstractChannel], Awaitable[object]]:
    return lambda ch: ch.exchange_declare(
        ex.name, exchange_type=ex.type, durable=ex.durable, auto_delete=ex.auto_delete, internal=ex.internal
    )


def _queue(q: QueueDecl) -> Callable[[aiormq.abc.AbstractChannel], Awaitable[object]]:
    return lambda ch: ch.queue_declare(q.name, durable=True, arguments=queue_arguments(q))


def _binding(b: BindingDecl) -> Callable[[aiormq.abc.AbstractChannel], Awaitable[object]]:
    if b.destination_type == "queue":
        return lambda ch: ch.queue_bind(b.destination, b.source, routing_key=b.routing_key)
    return lambda ch: ch.exchange_bind(b.destination, b.source, routing_key=b.routing_key)


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
        BrokerError: a queue is exclusive to another connection.
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
            except aiormq.exceptions.ChannelLockedResource as exc:
                raise BrokerError(
                    f"queue {name!r} on {settings.safe_url} is exclusive to another connection (RESOURCE_LOCKED): "
                    "only that connection can use it; close it, or delete the queue, and try again"
                ) from exc
            finally:
                await close_channel(channel)
    finally:
        await connection.close()
    return found


async def find_missing(
    connection: AbstractRobustConnection, queues: Iterable[str] = (), exchanges: Iterable[str] = ()
) -> tuple[set[str], set[str]]:
    """Which of ``queues`` and ``exchanges`` do not exist: (missing queues, missing exchanges).

    Passive declares on a throwaway channel of ``connection``; the broker closes it at each
    missing object (``404 NOT_FOUND``: RabbitMQ "Queues" → "Passive Declaration"), and the
    next look takes a new one. A queue exclusive to another connection exists.

    Raises:
        BrokerUnavailableError: not connected.
        BrokerError: the broker refused a look for another reason, or the connection failed.
    """
    transport = connection.transport
    if transport is None:
        raise BrokerUnavailableError("not connected to the broker (it reconnects by itself)")
    amqp = transport.connection
    looks = [("queue", n) for n in dict.fromkeys(queues)] + [("exchange", n) for n in dict.fromkeys(exchanges)]
    missing: dict[str, set[str]] = {"queue": set(), "exchange": set()}
    channel: aiormq.abc.AbstractChannel | None = None
    try:
        for kind, name in looks:
            if channel is None or channel.is_closed:
                channel = await amqp.channel(publisher_confirms=False)
            try:
                if kind == "queue":
                    await channel.queue_declare(name, passive=True)
                else:
                    await channel.exchange_declare(name, passive=True)
            except aiormq.exceptions.ChannelNotFoundEntity:
                missing[kind].add(name)
                channel = None  # closed by the broker, maybe not yet seen closed here: never send on it again
            except aiormq.exceptions.ChannelLockedResource:
                channel = None
    except (aiormq.exceptions.AMQPError, aiormq.exceptions.ChannelInvalidStateError, ConnectionError) as exc:
        raise BrokerError(f"looking for queues and exchanges failed: {exc}") from exc
    finally:
        if channel is not None and not channel.is_closed:
            with contextlib.suppress(Exception):
                await channel.close()
    return missing["queue"], missing["exchange"]


async def missing_objects(
    settings: BrokerSettings, queues: Iterable[str] = (), exchanges: Iterable[str] = (), wait: float = 30.0
) -> tuple[set[str], set[str]]:
    """:func:`find_missing` over a short connection of its own.

    Args:
        settings: Broker settings.
        queues: Queue names to look for.
        exchanges: Exchange names to look for.
        wait: Seconds to keep retrying a refused connect (a worker's first connect: 30 s,
            README "Workers", for a broker still starting).

    Raises:
        BrokerUnavailableError: cannot connect within ``wait``.
        BrokerError: as :func:`find_missing`.
    """
    connection = await connect(settings, wait=wait, name="amqpjobs-probe")
    try:
        return await find_missing(connection, queues, exchanges)
    finally:
        await connection.close()
