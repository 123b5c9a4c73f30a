"""The narrow interface the runtime talks to the broker through (as aio-pika keeps its own in ``abc.py``).

The runtime holds a :data:`Connection` only as a handle: it opens it with
:func:`amqpjobs.wire.connection.connect`, passes it to wire functions, checks
``is_closed`` and closes it, and never calls the client library on it. Everything it
does on the broker goes through the protocols below, which the wire modules implement:

* :class:`Publisher` - publish with a confirm and ``mandatory`` (:class:`~amqpjobs.wire.publish.ConfirmedPublisher`);
* :class:`TransactionalPublisher` - publish in a transaction (the scheduler's store and
  enqueue; its wire module lands with issue 16b);
* :class:`Acknowledgeable` - one delivery, acked / nacked / rejected on the channel it came on
  (:class:`~amqpjobs.wire.delivery.Delivery`);
* :class:`Received` - one delivery as the worker's per-delivery path reads it (its
  properties, headers, a byte-exact copy for a tier or quarantine, and how it is settled;
  :class:`~amqpjobs.wire.delivery.Delivery`);
* :class:`Browser` - ``basic.get`` without acking (:class:`~amqpjobs.wire.browse.QueueBrowser`);
* :class:`TickWire` - the scheduler's election, tick stores and tick transaction
  (:mod:`amqpjobs.wire.ticks`, a module that implements the protocol);
* probing a queue (exists / missing / locked): :func:`amqpjobs.wire.browse.probe_queue`;
* holding an exclusive lock: :func:`amqpjobs.wire.lock.exclusive_lock`.

Errors come out as :mod:`amqpjobs.errors` classes only (:mod:`amqpjobs.wire.errors`).

:mod:`amqpjobs.testing` implements these protocols in memory, so the same worker and
scheduler code runs in users' tests without a broker.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any, Literal, Protocol, TypeAlias

from aio_pika.abc import AbstractRobustConnection

from amqpjobs.message import OutgoingMessage

#: The runtime's handle on a broker connection (opaque above the wire).
Connection: TypeAlias = AbstractRobustConnection


class Publisher(Protocol):
    """Publishes with a publisher confirm and ``mandatory``; raises our errors on return / nack."""

    async def publish(self, exchange: str, routing_key: str, message: Any) -> None:
        """Publish and wait for the confirm (``UnroutableError``, ``PublishNackedError`` ...)."""

    async def close(self) -> None:
        """Close the publisher's channel."""


class TransactionalPublisher(Protocol):
    """Publishes several messages and commits them at once (``tx.select`` / ``tx.commit``)."""

    async def publish(self, exchange: str, routing_key: str, message: Any) -> None:
        """Add a publish to the open transaction."""

    async def commit(self) -> None:
        """Commit the transaction's publishes."""


class Acknowledgeable(Protocol):
    """One delivery, settled on the channel it came on (never on another)."""

    async def ack(self, at_once: bool = False) -> None:
        """Acknowledge it (the broker forgets it); ``at_once``: not batched (its copy is out)."""

    async def reject(self) -> None:
        """Reject it without requeue (a work queue dead-letters it into quarantine)."""

    async def requeue(self) -> None:
        """Hand it back to its queue (``basic.nack`` with requeue)."""


class Browser(Protocol):
    """``basic.get`` without acking; closing returns every message it holds to the queue."""

    def deliveries(self, queue: str, max_count: int) -> AsyncIterator[Any]:
        """Up to ``max_count`` deliveries of ``queue``, unacked."""
        ...

    async def close(self) -> None:
        """Close: the broker requeues what was held."""


class Received(Acknowledgeable, Protocol):
    """One delivery from a work queue, as the worker's per-delivery path reads and settles it.

    Attributes:
        body: Raw body.
        headers: Header table as received (never None).
        content_type / content_encoding / message_id / type: AMQP properties (or None).
        timestamp: ``timestamp`` property, seconds since the epoch, or None.
        redelivered: The broker's ``redelivered`` flag.
        exchange / routing_key: Where it was published.
        queue: The work queue it came from (a suspect's is set to its origin).
        delivery_tag: The delivery tag on the channel it came on (a double numbers its own).
        correlation_id: ``correlation_id`` property (or None).

    """

    body: bytes
    headers: dict[str, Any]
    content_type: str | None
    content_encoding: str | None
    message_id: str | None
    type: str | None
    timestamp: float | None
    redelivered: bool
    exchange: str
    routing_key: str
    queue: str
    delivery_tag: int
    correlation_id: str | None

    @property
    def channel_closed(self) -> bool:
        """Whether the channel it came on has closed (the broker then redelivers it)."""
        ...

    @property
    def settleable(self) -> bool:
        """Whether it can still be settled (its channel is open)."""
        ...

    def copy(self, headers: Mapping[str, Any], job_id: str, ready_at: int | None = None) -> OutgoingMessage:
        """The same message with other headers (``message_id`` ``job_id`` when it had none).

        ``ready_at`` (whole seconds since the epoch: when the copy becomes ready in the work
        queue) replaces ``timestamp``; None keeps it.
        """
        ...


class TickWire(Protocol):
    """What the scheduler does on the broker (:mod:`amqpjobs.wire.ticks` implements it as a module).

    ``connection`` is the scheduler's :data:`Connection` (opaque; an in-memory double
    passes its own handle). Tokens and channels are opaque too: the scheduler only hands
    them back to :meth:`holds` and :meth:`close_quietly`.
    """

    def holds(self, token: Any) -> bool:
        """True while ``token`` (the leader token delivery) is held on an open channel."""
        ...

    async def close_quietly(self, closable: Any) -> None:
        """Close a channel or publisher; a broker or connection already gone is no error."""

    async def exists(self, connection: Any, kind: Literal["exchange", "queue"], name: str) -> bool:
        """Whether the exchange or queue exists."""
        ...

    async def declare_durable(self, connection: Any, name: str, arguments: Mapping[str, Any]) -> bool:
        """Declare a durable queue; False when it exists with other arguments."""
        ...

    async def probe(self, connection: Any, name: str, what: str) -> Literal["exists", "missing", "locked"]:
        """Passively look at queue ``name`` (``locked``: another connection's exclusive queue)."""
        ...

    async def browse_bodies(self, connection: Any, queue: str, limit: int, what: str) -> list[bytes]:
        """The bodies of up to ``limit`` messages at the head of ``queue``, left in it."""
        ...

    async def hold_exclusive(self, connection: Any, name: str, arguments: Mapping[str, Any]) -> bool:
        """Declare the exclusive queue ``name`` on ``connection``; False when another connection holds it."""
        ...

    async def delete_queue(self, connection: Any, name: str, within: float) -> None:
        """Delete queue ``name`` (empty or not) within ``within`` seconds."""
        ...

    async def publish_in_transaction(
        self,
        connection: Any,
        messages: Iterable[tuple[str, str, OutgoingMessage, bool]],
        still_allowed: Callable[[], bool],
        what: str,
        late: str,
        commit_timeout: float = 30,
    ) -> list[str] | None:
        """Publish ``(exchange, routing key, message, mandatory)`` all at once, or none (None: not allowed).

        Returns the ``mandatory`` messages the broker returned (committed with the rest, but not enqueued).
        """
        ...

    async def join_election(
        self,
        connection: Any,
        queue: str,
        arguments: Mapping[str, Any],
        on_token: Callable[[Any], Awaitable[None]],
    ) -> Any:
        """Consume the election queue (single active consumer, prefetch 1); returns the channel to close."""
        ...
