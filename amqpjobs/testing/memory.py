"""An in-memory broker holding a topology's exchanges, queues and bindings, on a virtual clock.

It implements the parts of RabbitMQ the runtime relies on, in the simplest form that keeps
the runtime's decisions the same (README "Testing your jobs" lists what it does not do):

* exchanges ``direct``, ``topic``, ``fanout`` and the default exchange, bindings to queues
  and to exchanges; a ``mandatory`` publish nobody takes raises
  :class:`~amqpjobs.errors.UnroutableError`, as the real publisher does on ``basic.return``;
* queues are FIFO, highest ``priority`` first when the queue has ``max_priority``; a quorum
  queue orders as the RabbitMQ version it stands for (:mod:`amqpjobs.testing.memory_queue`);
  ``x-max-length`` with ``reject-publish`` (:class:`~amqpjobs.errors.PublishNackedError`) or
  ``drop-head``;
* a queue's message TTL runs on the virtual clock (:meth:`MemoryBroker.expire`): an expired
  message is dead-lettered to the queue's dead-letter exchange and routing key, at once
  and without ``x-death`` (the runtime strips it from its copies anyway);
* a delivery is settled by ack (gone), reject (dead-lettered) or requeue (``redelivered``,
  back where it was on a classic queue, first out on a quorum queue);
* a publish is refused as the broker's publisher refuses it, by the same rule
  (:func:`amqpjobs.wire.limits.check_fits`): properties over the double's ``frame_max``
  (less the publisher's reserve: an enqueue's leaves the worker's headroom), a body over
  its ``max_message_size`` when given (:class:`~amqpjobs.errors.MessageTooLargeError`).

It never imports the client library: it implements :mod:`amqpjobs.wire.abc`, and sizes
messages with :mod:`amqpjobs.wire.limits` (encoding only).
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from amqpjobs.errors import ConfigurationError, PublishNackedError, UnroutableError
from amqpjobs.message import OutgoingMessage
from amqpjobs.printable import listed
from amqpjobs.testing.clock import VirtualClock
from amqpjobs.testing.memory_queue import MemoryQueue, Stored
from amqpjobs.topology.declarations import Declarations
from amqpjobs.topology.versions import quorum_order
from amqpjobs.wire.limits import DEFAULT_FRAME_MAX, as_delivered, check_fits


@dataclass
class MemoryExchange:
    """An exchange and its bindings ``(routing key, destination, destination is an exchange)``."""

    name: str
    type: str
    bindings: list[tuple[str, str, bool]] = field(default_factory=list)


def topic_matches(pattern: str, key: str) -> bool:
    """Whether topic binding key ``pattern`` matches routing key ``key`` (``*`` one word, ``#`` zero or more)."""

    def match(p: list[str], k: list[str]) -> bool:
        if not p:
            return not k
        if p[0] == "#":
            return any(match(p[1:], k[i:]) for i in range(len(k) + 1))
        if not k:
            return False
        return (p[0] == "*" or p[0] == k[0]) and match(p[1:], k[1:])

    return match(pattern.split("."), key.split("."))


class MemoryBroker:
    """Exchanges, queues and bindings in memory, with message TTLs on ``clock``.

    Args:
        clock: The virtual clock TTLs run on.
        frame_max: The ``frame_max`` in bytes its publishers' messages must fit (default
            RabbitMQ's, 131072; 0: no limit).

    """

    def __init__(
        self, clock: VirtualClock, frame_max: int = DEFAULT_FRAME_MAX, version: tuple[int, ...] | None = None
    ) -> None:
        self.clock = clock
        #: The RabbitMQ version it behaves as (None: the newest): a quorum queue's priorities follow it.
        self.version = version
        self.frame_max = frame_max
        self.queues: dict[str, MemoryQueue] = {}
        self.exchanges: dict[str, MemoryExchange] = {}
        #: Called after a message lands in the queue of that name (the election's consumers).
        self.on_message: dict[str, Callable[[], None]] = {}
        #: Delivery tags handed out, from 1 (one counter for the whole double).
        self.delivery_tags = itertools.count(1)
        self.applied = False  # a topology was applied: the TestBroker was opened

    def _opened(self) -> None:
        if not self.applied:
            raise ConfigurationError(
                "this TestBroker is not open yet: use it as `async with TestBroker(app) as broker:` (its topology is "
                "declared on entering)"
            )

    def apply(self, declarations: Declarations) -> None:
        """Declare a topology's objects (what ``amqpjobs topology apply`` declares on a broker)."""
        self.applied = True
        for e in declarations.exchanges:
            self.exchanges.setdefault(e.name, MemoryExchange(e.name, e.type))
        for q in declarations.queues:
            overflow = q.overflow
            self.queues.setdefault(
                q.name,
                MemoryQueue(
                    q.name,
                    max_priority=q.max_priority,
                    message_ttl=q.message_ttl,
                    dead_letter_exchange=q.dead_letter_exchange,
                    dead_letter_routing_key=q.dead_letter_routing_key,
                    max_length=q.max_length,
                    overflow=overflow,
                    quorum=quorum_order(self.version) if q.queue_type == "quorum" else None,
                ),
            )
        for b in declarations.bindings:
            self.exchanges[b.source].bindings.append((b.routing_key, b.destination, b.destination_type == "exchange"))

    def declare(self, name: str, arguments: Mapping[str, Any]) -> bool:
        """Declare a queue with AMQP ``arguments`` (ms); False when it exists with other arguments."""
        existing = self.queues.get(name)
        if existing is not None:
            return existing.arguments == dict(arguments) or not existing.arguments
        ttl = arguments.get("x-message-ttl")
        self.queues[name] = MemoryQueue(
            name,
            max_priority=arguments.get("x-max-priority"),
            message_ttl=None if ttl is None else ttl / 1000,
            dead_letter_exchange=arguments.get("x-dead-letter-exchange"),
            dead_letter_routing_key=arguments.get("x-dead-letter-routing-key"),
            max_length=arguments.get("x-max-length"),
            overflow=arguments.get("x-overflow"),
            arguments=dict(arguments),
        )
        return True

    def queue(self, name: str) -> MemoryQueue:
        """The queue ``name``.

        Raises:
            ConfigurationError: no such queue (the topology does not declare it), or no topology
                was applied yet (the TestBroker is not open).

        """
        self._opened()
        try:
            return self.queues[name]
        except KeyError:
            raise ConfigurationError(f"queue {name!r} does not exist; known: {listed(self.queues)}") from None

    # ------------------------------------------------------------------ routing
    def route(self, exchange: str, routing_key: str, seen: frozenset[str] = frozenset()) -> list[str]:
        """The queues a message published to ``exchange`` with ``routing_key`` reaches (no duplicates)."""
        if exchange == "":
            return [routing_key] if routing_key in self.queues else []
        ex = self.exchanges.get(exchange)
        if ex is None or exchange in seen:
            return []
        found: list[str] = []
        for key, destination, to_exchange in ex.bindings:
            if ex.type == "fanout" or (ex.type == "topic" and topic_matches(key, routing_key)) or key == routing_key:
                targets = self.route(destination, routing_key, seen | {exchange}) if to_exchange else [destination]
                found.extend(t for t in targets if t not in found)
        return found

    def publish(self, exchange: str, routing_key: str, message: OutgoingMessage, mandatory: bool = True) -> None:
        """Route and store a message, its headers as a broker delivers them (wire/limits.as_delivered).

        Raises:
            UnroutableError: the exchange does not exist (as the real publisher says on ``NOT_FOUND``).
            UnroutableError: ``mandatory`` and no queue took it.
            PublishNackedError: a target queue is full with ``reject-publish``.
            ConfigurationError: no topology was applied yet (the TestBroker is not open).

        """
        self._opened()
        if exchange and exchange not in self.exchanges:
            raise UnroutableError(f"exchange {exchange!r} does not exist: apply the topology (amqpjobs topology apply)")
        targets = self.route(exchange, routing_key)
        if not targets:
            if mandatory:
                raise UnroutableError(
                    f"unroutable: no queue is bound to exchange {exchange or '(default)'!r} with routing key "
                    f"{routing_key!r}; apply the topology (amqpjobs topology apply) or fix the job's queue"
                )
            return
        for name in targets:
            q = self.queues[name]
            if q.max_length is not None and len(q.messages) >= q.max_length and q.overflow == "reject-publish":
                raise PublishNackedError(f"queue {name!r} is full (x-max-length {q.max_length}, reject-publish)")
        for name in targets:
            q = self.queues[name]
            frozen = dataclasses.replace(message, headers=as_delivered(message.headers))
            expires = None if q.message_ttl is None else self.clock.seconds + q.message_ttl
            q.put(Stored(frozen, exchange, routing_key, expires))
            while q.max_length is not None and len(q.messages) > q.max_length:
                q.messages.pop(0)  # drop-head (the default overflow)
            hook = self.on_message.get(name)
            if hook is not None:
                hook()

    def dead_letter(self, queue: MemoryQueue, stored: Stored) -> None:
        """Dead-letter ``stored`` from ``queue`` (expired or rejected); dropped without a dead-letter exchange."""
        if queue.dead_letter_exchange is None:
            return
        key = queue.dead_letter_routing_key or stored.routing_key
        self.publish(queue.dead_letter_exchange, key, stored.message, mandatory=False)

    # ------------------------------------------------------------------ the clock
    def next_expiry(self) -> float | None:
        """The virtual time the next message expires, or None."""
        times = [s.expires_at for q in self.queues.values() for s in q.messages if s.expires_at is not None]
        return min(times) if times else None

    def expire(self) -> int:
        """Dead-letter every message whose TTL has run out by now; returns how many."""
        now = self.clock.seconds
        moved = 0
        for q in list(self.queues.values()):
            due = [s for s in q.messages if s.expires_at is not None and s.expires_at <= now]
            for s in sorted(due, key=lambda s: (s.expires_at or 0.0, s.serial)):
                q.messages.remove(s)
                self.dead_letter(q, s)
                moved += 1
        return moved


class MemoryPublisher:
    """:class:`~amqpjobs.wire.abc.Publisher` into a :class:`MemoryBroker` (``mandatory``, confirmed at once).

    Args:
        broker: The double it publishes into (its ``frame_max`` applies).
        header_reserve: Bytes of ``frame_max`` a message's properties must leave free, as
            :class:`~amqpjobs.wire.publish.ConfirmedPublisher`'s ``header_reserve`` (default 0).
        max_message_size: Bodies larger than this many bytes are refused (None: no check).

    """

    def __init__(self, broker: MemoryBroker, header_reserve: int = 0, max_message_size: int | None = None) -> None:
        self._broker = broker
        self.header_reserve = header_reserve
        self.max_message_size = max_message_size
        self.published: list[tuple[str, str, OutgoingMessage]] = []

    async def publish(self, exchange: str, routing_key: str, message: Any) -> None:
        """Route and store ``message`` (an :class:`~amqpjobs.message.OutgoingMessage`); errors as the real one's.

        Raises:
            MessageTooLargeError: its properties take more than the broker's ``frame_max`` less
                ``header_reserve``, or its body more than ``max_message_size`` (nothing stored).
            UnroutableError, PublishNackedError: as :meth:`MemoryBroker.publish`.

        """
        check_fits(message, self._broker.frame_max, self.header_reserve, self.max_message_size)
        self._broker.publish(exchange, routing_key, message)
        self.published.append((exchange, routing_key, message))

    async def close(self) -> None:
        """Nothing to close."""


@dataclass
class MemoryDelivery:
    """:class:`~amqpjobs.wire.abc.Received`: one message taken from a queue of a :class:`MemoryBroker`."""

    broker: MemoryBroker
    source: MemoryQueue
    stored: Stored
    queue: str
    settled: str = ""  # "", "ack", "reject", "requeue"
    body: bytes = b""
    headers: dict[str, Any] = field(default_factory=dict)
    content_type: str | None = None
    content_encoding: str | None = None
    message_id: str | None = None
    type: str | None = None
    timestamp: float | None = None
    priority: int | None = None
    redelivered: bool = False
    exchange: str = ""
    routing_key: str = ""
    delivery_tag: int = 0  # numbered per double, from 1, as a channel numbers its deliveries
    correlation_id: str | None = None

    @classmethod
    def take(cls, broker: MemoryBroker, queue: str) -> MemoryDelivery | None:
        """The next message of ``queue``, unacked, or None when it is empty."""
        source = broker.queue(queue)
        stored = source.take()
        if stored is None:
            return None
        m = stored.message
        return cls(
            broker, source, stored, queue, "", m.body, copy.deepcopy(dict(m.headers)), m.content_type,
            m.content_encoding, m.message_id, m.type, m.timestamp, m.priority, stored.redelivered,
            stored.exchange, stored.routing_key, next(broker.delivery_tags), m.correlation_id,
        )  # fmt: skip

    @property
    def channel_closed(self) -> bool:
        """Never: the double has no channels that fail."""
        return False

    @property
    def settleable(self) -> bool:
        """Whether it is not settled yet."""
        return not self.settled

    def copy(self, headers: Mapping[str, Any], job_id: str, ready_at: int | None = None) -> OutgoingMessage:
        """The same message with other headers, as :meth:`amqpjobs.wire.abc.Received.copy` makes it."""
        m = self.stored.message
        return dataclasses.replace(
            m,
            headers=dict(headers),
            message_id=m.message_id or job_id,
            timestamp=m.timestamp if ready_at is None else ready_at,
        )

    def _settle(self, how: str) -> None:
        if self.settled:
            raise RuntimeError(f"delivery of {self.message_id} settled twice ({self.settled}, then {how})")
        self.settled = how

    async def ack(self, at_once: bool = False) -> None:
        """The broker forgets it (``at_once``: as sent at once, like every ack here)."""
        self._settle("ack")

    async def reject(self) -> None:
        """Dead-letter it (a work queue's: into quarantine, without evidence headers or x-death)."""
        self._settle("reject")
        self.broker.dead_letter(self.source, self.stored)

    async def requeue(self) -> None:
        """Back in its queue, ``redelivered``: where it was (classic), or first out (quorum; ``MemoryQueue.put``)."""
        self._settle("requeue")
        self.stored.redelivered = True
        self.source.put(self.stored, head=True)
