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
* :class:`Browser` - ``basic.get`` without acking (:class:`~amqpjobs.wire.browse.QueueBrowser`);
* probing a queue (exists / missing / locked): :func:`amqpjobs.wire.browse.probe_queue`;
* holding an exclusive lock: :func:`amqpjobs.wire.lock.exclusive_lock`.

Errors come out as :mod:`amqpjobs.errors` classes only (:mod:`amqpjobs.wire.errors`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol, TypeAlias

from aio_pika.abc import AbstractRobustConnection

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

    async def ack(self) -> None:
        """Acknowledge it (the broker forgets it)."""

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
