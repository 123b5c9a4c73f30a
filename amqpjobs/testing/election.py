"""The scheduler's wire in memory (:class:`~amqpjobs.wire.abc.TickWire`): election, tick stores, tick transaction.

The election follows RabbitMQ's single active consumer ("Consumers" → "Single Active
Consumer"): of the replicas consuming the election queue, the first to join is the
active one and alone gets the token, with prefetch 1; when its connection closes (a
shutdown, or :meth:`MemoryConnection.close` standing for ``kill -9``), the token it held
goes back to the head of the queue and the next replica becomes active and gets it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from amqpjobs.errors import BrokerError
from amqpjobs.message import OutgoingMessage
from amqpjobs.testing.memory import MemoryBroker
from amqpjobs.testing.memory_queue import Stored


@dataclass(eq=False)
class ElectionChannel:
    """A replica's consumer on the election queue (closing it hands a held token on)."""

    wire: MemoryTicks
    queue: str
    on_token: Callable[[Any], Awaitable[None]]
    closed: bool = False
    held: Token | None = None

    async def close(self) -> None:
        """Leave the election; a held token returns to the queue for the next replica."""
        self.wire.leave(self)


@dataclass(eq=False)
class Token:
    """The leader token, delivered unacked on an election channel."""

    channel: ElectionChannel
    stored: Stored
    body: bytes = b""

    @property
    def headers(self) -> Mapping[str, Any]:
        """The token's headers, as published (the schedules of the replica that offered it)."""
        return self.stored.message.headers


@dataclass(eq=False)
class MemoryConnection:
    """A scheduler replica's connection: closing it closes its election channel (as a dead TCP connection would)."""

    name: str
    channels: list[ElectionChannel] = field(default_factory=list)
    is_closed: bool = False

    async def close(self) -> None:
        """Close it and every channel on it."""
        self.is_closed = True
        for channel in self.channels:
            await channel.close()


class MemoryTicks:
    """:class:`~amqpjobs.wire.abc.TickWire` on a :class:`~amqpjobs.testing.memory.MemoryBroker`."""

    def __init__(self, broker: MemoryBroker) -> None:
        self._broker = broker
        self._consumers: dict[str, list[ElectionChannel]] = {}
        self._tasks: set[asyncio.Future[None]] = set()
        #: Exclusive queues (the overlap guard's running markers) and the connection holding each.
        self.exclusive: dict[str, Any] = {}

    def holds(self, token: Any) -> bool:
        """True while ``token`` is held on an open election channel."""
        return isinstance(token, Token) and not token.channel.closed

    async def close_quietly(self, closable: Any) -> None:
        """Close a channel or a publisher (None: nothing)."""
        if closable is not None:
            await closable.close()

    async def exists(self, connection: Any, kind: Literal["exchange", "queue"], name: str) -> bool:
        """Whether the exchange or queue exists."""
        return name in (self._broker.exchanges if kind == "exchange" else self._broker.queues)

    async def declare_durable(self, connection: Any, name: str, arguments: Mapping[str, Any]) -> bool:
        """Declare a queue; False when it exists with other arguments."""
        return self._broker.declare(name, arguments)

    async def probe(self, connection: Any, name: str, what: str) -> Literal["exists", "missing", "locked"]:
        """``exists``, ``missing``, or ``locked`` (another connection's exclusive queue, as RESOURCE_LOCKED)."""
        owner = self.exclusive.get(name)
        if owner is not None and owner is not connection:
            return "locked"
        return "exists" if name in self._broker.queues else "missing"

    async def hold_exclusive(self, connection: Any, name: str, arguments: Mapping[str, Any]) -> bool:
        """Declare the exclusive queue ``name`` for ``connection``; False when another connection holds it."""
        owner = self.exclusive.get(name)
        if owner is not None and owner is not connection:
            return False
        if not self._broker.declare(name, arguments):
            raise BrokerError(f"PRECONDITION_FAILED - queue {name!r} exists with other arguments")
        self.exclusive[name] = connection
        return True

    async def delete_queue(self, connection: Any, name: str, within: float) -> None:
        """Delete queue ``name`` (and its exclusive hold)."""
        self.exclusive.pop(name, None)
        self._broker.queues.pop(name, None)

    async def browse_bodies(self, connection: Any, queue: str, limit: int, what: str) -> list[bytes]:
        """The bodies at the head of ``queue``, left in it.

        Raises:
            BrokerError: the queue does not exist.

        """
        found = self._broker.queues.get(queue)
        if found is None:
            raise BrokerError(f"{what}: NOT_FOUND - no queue {queue!r}")
        return [s.message.body for s in found.messages[:limit]]

    async def publish_in_transaction(
        self,
        connection: Any,
        messages: Iterable[tuple[str, str, OutgoingMessage, bool]],
        still_allowed: Callable[[], bool],
        what: str,
        late: str,
        commit_timeout: float = 30,
    ) -> list[str] | None:
        """Publish all of ``messages`` at once while ``still_allowed()``, else none (None).

        Like a committed AMQP transaction, an unroutable ``mandatory`` message is dropped and
        returned (listed in the answer), not an error; the other messages are published.
        """
        items = list(messages)
        if not still_allowed():
            return None
        returned: list[str] = []
        for exchange, routing_key, message, mandatory in items:
            if mandatory and exchange in self._broker.exchanges and not self._broker.route(exchange, routing_key):
                returned.append(f"to exchange {exchange!r} key {routing_key!r}: 312 NO_ROUTE")
                continue
            self._broker.publish(exchange, routing_key, message, mandatory=False)
        return returned

    async def join_election(
        self,
        connection: Any,
        queue: str,
        arguments: Mapping[str, Any],
        on_token: Callable[[Any], Awaitable[None]],
    ) -> ElectionChannel:
        """Consume the election queue (single active consumer, prefetch 1)."""
        if not self._broker.declare(queue, arguments):
            raise BrokerError(f"PRECONDITION_FAILED - queue {queue!r} exists with other arguments")
        channel = ElectionChannel(self, queue, on_token)
        self._consumers.setdefault(queue, []).append(channel)
        if isinstance(connection, MemoryConnection):
            connection.channels.append(channel)
        self._broker.on_message[queue] = lambda: self.dispatch(queue)
        self.dispatch(queue)
        return channel

    def leave(self, channel: ElectionChannel) -> None:
        """A channel closed: its held token goes back to the head of the queue, the next consumer may get it."""
        if channel.closed:
            return
        channel.closed = True
        consumers = self._consumers.get(channel.queue, [])
        if channel in consumers:
            consumers.remove(channel)
        if channel.held is not None:
            channel.held.stored.redelivered = True
            self._broker.queue(channel.queue).put(channel.held.stored, head=True)
            channel.held = None
        self.dispatch(channel.queue)

    def dispatch(self, queue: str) -> None:
        """Hand a waiting token to the active consumer (the first still open) if it holds none."""
        consumers = self._consumers.get(queue)
        if not consumers:
            return
        active = consumers[0]
        if active.held is not None:
            return
        stored = self._broker.queue(queue).take()
        if stored is None:
            return
        token = active.held = Token(active, stored, stored.message.body)
        task = asyncio.ensure_future(active.on_token(token))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def settle(self) -> None:
        """Wait for the token callbacks under way."""
        while self._tasks:
            with contextlib.suppress(Exception):
                await asyncio.gather(*self._tasks)
