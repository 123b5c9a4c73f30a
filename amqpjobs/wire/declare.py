"""Declare a topology's broker objects over AMQP, in dependency order."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Final

import aiormq
from aio_pika.abc import AbstractRobustConnection

from amqpjobs.errors import (
    BrokerError,
    BrokerUnavailableError,
    NotFoundError,
    PreconditionFailedError,
    ResourceLockedError,
    TopologyConflictError,
    UnaddressableNameError,
)
from amqpjobs.topology.declarations import BindingDecl, Declarations, ExchangeDecl, QueueDecl
from amqpjobs.wire.arguments import queue_arguments
from amqpjobs.wire.channel_room import channel_room
from amqpjobs.wire.connection import close_channel, connect
from amqpjobs.wire.errors import LIBRARY_ERRORS, broker_errors, channel_limit_hint, error_kind
from amqpjobs.wire.settings import BrokerSettings


def _channels(connection: object) -> int:
    """:data:`DECLARE_CHANNELS`, or fewer within a broker's low ``channel_max`` (those open counted): at least 1."""
    room = channel_room(connection)
    if room is None or room.channel_max <= 0:
        return DECLARE_CHANNELS
    return max(1, min(DECLARE_CHANNELS, room.channel_max - room.open))


#: Channels a deploy declares on at once. Each declaration is one round trip; spreading them
#: over a few channels lets the broker work on several at a time (200 job queues with 3 tiers
#: each: 1,600 declarations in about 0.5 s instead of 3.5 s; bench/RESULTS.md, item 7).
DECLARE_CHANNELS = 8

#: Seconds a round of declarations may take before we give up (default 30 s). From RabbitMQ
#: 4.2 Khepri is the default metadata store, from 4.3 the only one: a declaration needs a
#: Raft majority of the cluster's nodes, and on a node in a minority it blocks and may never
#: answer (release notes 4.2.0 and 4.3.0). Declarations happen at start-up and reconnect
#: only, never per publish, so a bound here never slows the work down.
DECLARE_TIMEOUT = 30.0


def declaration_timeout_message(what: str, safe_url: str, timeout: float, node_said: str = "") -> str:
    """The error text for declarations that got no answer within ``timeout`` seconds, or that the node gave up."""
    happened = f"failed: the node gave up ({node_said})" if node_said else f"got no answer within {timeout:g}s"
    return (
        f"{what} on {safe_url} {happened}. On RabbitMQ 4.2+ (Khepri metadata store) a "
        "declaration waits for a majority of the cluster's nodes: this node is probably in a minority (a "
        "partition, or most nodes down). Check `rabbitmq-diagnostics cluster_status`, bring the other nodes back "
        "or connect to a node of the majority, then try again"
    )


@contextlib.asynccontextmanager
async def declaring(what: str, safe_url: str, within: float | None = None) -> AsyncIterator[None]:
    """Bound the declarations made inside the block to ``within`` seconds in all (None: :data:`DECLARE_TIMEOUT`).

    Raises:
        BrokerError: the block did not finish in time (see :data:`DECLARE_TIMEOUT`), or the
            node itself said its metadata store timed out; the message names the likely
            cause, a Khepri minority.

    """
    limit = DECLARE_TIMEOUT if within is None else within
    try:
        async with asyncio.timeout(limit):
            yield
    except TimeoutError as exc:
        raise BrokerError(declaration_timeout_message(what, safe_url, limit)) from exc
    except LIBRARY_ERRORS as exc:
        # the node may give up first (measured on 4.3.6 after about 30 s): "INTERNAL_ERROR - Could not declare
        # queue ... because the metadata store operation timed out", closing the connection
        if "metadata store" not in str(exc):
            raise
        raise BrokerError(declaration_timeout_message(what, safe_url, limit, str(exc))) from exc


async def declare(
    connection: AbstractRobustConnection,
    declarations: Declarations,
    within: float | None = None,
    safe_url: str = "the broker",
) -> None:
    """Declare exchanges, then queues, then bindings, all durable, over a few channels at once.

    Each stage finishes before the next starts (a binding needs its queue and exchange; a
    queue's dead-letter exchange is only a name). Within a stage the objects are spread
    over :data:`DECLARE_CHANNELS` channels. Call only after a plan found no conflict: an
    inequivalent re-declare fails with ``406 PRECONDITION_FAILED`` and closes its channel
    (RabbitMQ "Queues" → "Declaration and Property Equivalence").

    Args:
        connection: The connection to declare on.
        declarations: What to declare.
        within: Seconds all of it may take (None: :data:`DECLARE_TIMEOUT`).
        safe_url: The broker URL without password, for the timeout's message.

    Raises:
        TopologyConflictError: the broker refused a declaration as inequivalent: someone
            created a conflicting object after the plan (``declared_nothing`` is False:
            what was declared before it remains).
        BrokerError: the broker refused a declaration for another reason, or gave no
            answer within ``within`` seconds (what was declared before remains).

    """
    transport = connection.transport
    if transport is None:
        raise BrokerError("not connected to the broker")
    # plain aiormq channels: a channel the broker closes (say, ACCESS_REFUSED) must stay closed,
    # not be reopened by the robust connection while the other channels still declare
    underlays = [await transport.connection.channel(publisher_confirms=False) for _ in range(_channels(connection))]
    done = False
    try:
        stages: list[list[Callable[[aiormq.abc.AbstractChannel], Awaitable[object]]]] = [
            [_exchange(ex) for ex in declarations.exchanges],
            [_queue(q) for q in declarations.queues],
            [_binding(b) for b in declarations.bindings],
        ]
        async with declaring("declaring the topology", safe_url, within):
            for stage in stages:
                await _spread(underlays, stage)
        done = True
    except LIBRARY_ERRORS as exc:
        if error_kind(exc) is PreconditionFailedError:
            raise TopologyConflictError(
                f"the broker refused a declaration made after planning: {exc}; objects declared before it "
                "remain. Run `amqpjobs topology plan` to see the conflict",
                declared_nothing=False,
            ) from exc
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


async def unbind(
    connection: AbstractRobustConnection,
    bindings: Iterable[BindingDecl],
    within: float | None = None,
    safe_url: str = "the broker",
) -> None:
    """Remove ``bindings`` (``queue.unbind`` / ``exchange.unbind``), one after another on one channel.

    Unbinding a binding that no longer exists succeeds (RabbitMQ AMQP 0-9-1 reference,
    ``queue.unbind``), so a second run is harmless.

    Raises:
        BrokerError: the broker refused an unbind, or gave no answer within ``within``
            seconds (None: :data:`DECLARE_TIMEOUT`); the bindings removed before it stay removed.

    """
    transport = connection.transport
    if transport is None:
        raise BrokerError("not connected to the broker")
    channel = await transport.connection.channel(publisher_confirms=False)
    try:
        async with declaring("removing bindings", safe_url, within):
            for b in bindings:
                if b.destination_type == "queue":
                    await channel.queue_unbind(b.destination, b.source, routing_key=b.routing_key)
                else:
                    await channel.exchange_unbind(b.destination, b.source, routing_key=b.routing_key)
    except LIBRARY_ERRORS as exc:
        raise BrokerError(
            f"the broker refused to remove a binding: {exc}; bindings removed before it stay removed"
        ) from exc
    await close_channel(channel)


async def bind_queue(connection: AbstractRobustConnection, queue: str, exchange: str, within: float = 5.0) -> None:
    """Bind ``queue`` to ``exchange`` (routing key ``""``): a no-op when that binding exists (``queue.bind``).

    Args:
        connection: The connection to bind on (a throwaway channel of it).
        queue: The queue (must exist).
        exchange: The exchange (must exist).
        within: Seconds the broker may take to answer.

    Raises:
        BrokerError: not connected, the broker refused (a queue or exchange missing, no
            ``write`` permission on the queue or ``read`` on the exchange), or no answer in time.
    """
    transport = connection.transport
    if transport is None:
        raise BrokerError("not connected to the broker")
    try:
        channel = await transport.connection.channel(publisher_confirms=False)
        async with declaring(f"binding {queue} to {exchange}", "the broker", within):
            await channel.queue_bind(queue, exchange, routing_key="")
    except LIBRARY_ERRORS as exc:
        raise BrokerError(f"the broker refused to bind {queue} to {exchange}: {exc}{channel_limit_hint(exc)}") from exc
    await close_channel(channel)


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
        unaddressable: Why the AMQP client can't address the queue ("" when it can; the
            figures are 0 then): see :class:`~amqpjobs.errors.UnaddressableNameError`.
    """

    messages: int
    consumers: int
    unaddressable: str = ""


async def probe_queues(settings: BrokerSettings, names: list[str]) -> dict[str, QueueProbe]:
    """Exact depth and consumer count of queues, by passive declares on one throwaway channel at a time.

    A passive declare of a missing queue fails with ``404 NOT_FOUND`` and closes its
    channel (RabbitMQ "Queues" → "Passive Declaration"): the next probe opens a new one, so
    N queues cost N round trips and a channel per missing queue (before: a channel opened
    and closed per probe, three round trips each; 500 queues took seconds).
    Missing queues are left out of the result; a queue the client can't address (a name
    pamqp refuses) is in it with its reason in ``unaddressable``.

    Raises:
        BrokerUnavailableError: cannot connect.
        BrokerError: a queue is exclusive to another connection.
    """
    found: dict[str, QueueProbe] = {}
    connection = await connect(settings, name="amqpjobs-probe")
    try:
        channel = None
        try:
            for name in dict.fromkeys(names):
                if channel is None or channel.is_closed:
                    channel = await connection.channel(publisher_confirms=False)
                try:
                    with broker_errors(name):
                        result = (await channel.declare_queue(name, passive=True)).declaration_result
                    found[name] = QueueProbe(result.message_count or 0, result.consumer_count or 0)
                except NotFoundError:  # the broker closed this channel: the next probe takes a new one
                    await close_channel(channel)
                    channel = None
                except UnaddressableNameError as exc:  # refused by the client, before a frame: the channel stands
                    found[name] = QueueProbe(0, 0, str(exc))
                except ResourceLockedError as exc:
                    raise BrokerError(
                        f"queue {name!r} on {settings.safe_url} is exclusive to another connection (RESOURCE_LOCKED): "
                        "only that connection can use it; close it, or delete the queue, and try again"
                    ) from exc.__cause__
        finally:
            if channel is not None:
                await close_channel(channel)
    finally:
        await connection.close()
    return found


#: RabbitMQ's direct reply-to pseudo-queue (RabbitMQ "Direct Reply-to"): a passive declare of it succeeds,
#: yet it holds no message; a publish to it reaches only a consumer of the publishing channel.
REPLY_TO: Final = "amq.rabbitmq.reply-to"


def is_reply_to(queue: str) -> bool:
    """Whether ``queue`` is :data:`REPLY_TO` or one of its per-consumer names (``amq.rabbitmq.reply-to.<...>``)."""
    return queue == REPLY_TO or queue.startswith(REPLY_TO + ".")


async def find_missing(
    connection: AbstractRobustConnection,
    queues: Iterable[str] = (),
    exchanges: Iterable[str] = (),
    locked: set[str] | None = None,
) -> tuple[set[str], set[str]]:
    """Which of ``queues`` and ``exchanges`` do not exist: (missing queues, missing exchanges).

    ``locked``: when given, the queues exclusive to another connection are added to it.

    Passive declares on a throwaway channel of ``connection``; the broker closes it at each
    missing object (``404 NOT_FOUND``: RabbitMQ "Queues" → "Passive Declaration"), and the
    next look takes a new one. A queue exclusive to another connection exists; the direct
    reply-to pseudo-queue (:data:`REPLY_TO`) is missing: no message can wait in it.

    Raises:
        BrokerUnavailableError: not connected.
        BrokerError: the broker refused a look for another reason, or the connection failed.
    """
    transport = connection.transport
    if transport is None:
        raise BrokerUnavailableError("not connected to the broker (it reconnects by itself)")
    amqp = transport.connection
    queues = list(dict.fromkeys(queues))
    missing: dict[str, set[str]] = {"queue": {n for n in queues if is_reply_to(n)}, "exchange": set()}
    looks = [("queue", n) for n in queues if n not in missing["queue"]]
    looks += [("exchange", n) for n in dict.fromkeys(exchanges)]
    channel: aiormq.abc.AbstractChannel | None = None
    try:
        for kind, name in looks:
            if channel is None or channel.is_closed:
                channel = await amqp.channel(publisher_confirms=False)
            try:
                with broker_errors(name):
                    if kind == "queue":
                        await channel.queue_declare(name, passive=True)
                    else:
                        await channel.exchange_declare(name, passive=True)
            except NotFoundError:
                missing[kind].add(name)
                channel = None  # closed by the broker, maybe not yet seen closed here: never send on it again
            except ResourceLockedError:
                channel = None
                if locked is not None:
                    locked.add(name)
    except LIBRARY_ERRORS as exc:
        raise BrokerError(f"looking for queues and exchanges failed: {exc}{channel_limit_hint(exc)}") from exc
    except BrokerError as exc:
        if exc.__cause__ is None or error_kind(exc.__cause__) is None:
            raise
        raise BrokerError(f"looking for queues and exchanges failed: {exc}") from exc.__cause__  # its fix kept
    finally:
        if channel is not None and not channel.is_closed:
            await close_channel(channel)
    return missing["queue"], missing["exchange"]


async def missing_objects(
    settings: BrokerSettings, queues: Iterable[str] = (), exchanges: Iterable[str] = (), wait: float | None = None
) -> tuple[set[str], set[str]]:
    """:func:`find_missing` over a short connection of its own, bounded by :data:`DECLARE_TIMEOUT`.

    Args:
        settings: Broker settings.
        queues: Queue names to look for.
        exchanges: Exchange names to look for.
        wait: Seconds to keep retrying a refused connect; default ``settings.connect_timeout``
            (a worker's first connect: 30 s, README "Workers", for a broker still starting).

    Raises:
        BrokerUnavailableError: cannot connect within ``wait``.
        BrokerError: as :func:`find_missing`, or no answer in time.
    """
    connection = await connect(settings, wait=wait, name="amqpjobs-probe")
    try:
        async with declaring("looking for queues and exchanges", settings.safe_url):
            return await find_missing(connection, queues, exchanges)
    finally:
        await connection.close()
