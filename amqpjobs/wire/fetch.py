"""Taking messages one at a time (``basic.get``) from a queue nobody consumes: a job queue's suspects.

A suspect (:mod:`amqpjobs.jobs.crash`) must run with nothing else held by its worker, so
the worker fetches it only once it has stopped consuming and everything it held is
settled. ``basic.get`` takes exactly one message, unacked, on a channel of its own; its
``get-ok`` also proves the broker has handled every ack sent before on that channel.
"""

from __future__ import annotations

import logging
from typing import Any, cast

import aiormq
from aio_pika.abc import AbstractChannel, AbstractRobustConnection
from pamqp.commands import Basic

from amqpjobs.errors import NotFoundError
from amqpjobs.wire.connection import close_channel
from amqpjobs.wire.delivery import Delivery, delivery_from_aiormq
from amqpjobs.wire.errors import connection_lost, error_kind

log = logging.getLogger("amqpjobs.wire")


class QueueFetcher:
    """``basic.get`` from one queue, on a robust channel of its own.

    Args:
        connection: The worker's robust connection.
        queue: The queue to take from (it must exist: the topology is applied at deploy time).

    """

    def __init__(self, connection: AbstractRobustConnection, queue: str) -> None:
        self.connection = connection
        self.queue = queue
        self._channel: AbstractChannel | None = None

    @classmethod
    async def opened(cls, connection: AbstractRobustConnection, queue: str) -> QueueFetcher:
        """A fetcher whose channel is open already: a worker's start counts it (:mod:`amqpjobs.runtime.hard_closes`).

        The connection lost meanwhile (a 541 at a message no 0-9-1 client can receive, which the
        worker's rescue mends; a 320; a cut) leaves it to open at its first use, after the
        reconnect: the start goes on, as it did when the fetcher always opened then.

        Which errors pass is :func:`amqpjobs.wire.errors.connection_lost`.

        Raises:
            aiormq.exceptions.ConnectionClosed: a hard error (501-540, e.g. 530 past ``channel_max``).
        """
        fetcher = cls(connection, queue)
        try:
            await fetcher._underlay()
        except Exception as exc:
            if not connection_lost(exc):
                raise
            log.debug("the channel for %s opens after the reconnect (%s)", queue, type(exc).__name__)
        return fetcher

    async def _underlay(self) -> aiormq.Channel:
        if self._channel is None or self._channel.is_closed:
            self._channel = await self.connection.channel(publisher_confirms=False)
        return cast(aiormq.Channel, await self._channel.get_underlay_channel())

    async def depth(self) -> int | None:
        """Messages ready in the queue (a passive declare), or None when the queue is missing.

        The queue missing closes this channel (404); the next call opens another.

        Raises:
            Exception: the depth could not be read for another reason (the connection is
                down or reconnecting): not a sign that the queue is missing.
        """
        try:
            underlay = await self._underlay()
            ok = await underlay.queue_declare(self.queue, passive=True)
        except Exception as exc:
            await self.close()
            if error_kind(exc) is NotFoundError:
                log.debug("can't read the depth of %s: %s", self.queue, exc)
                return None
            raise
        return int(ok.message_count or 0)

    async def get(self) -> Delivery | None:
        """Take one message, unacked (ack or reject it through the :class:`Delivery`); None when empty.

        Raises:
            aiormq.exceptions.AMQPError: the channel or connection failed (nothing was taken).

        """
        underlay = await self._underlay()
        message: Any = await underlay.basic_get(self.queue, no_ack=False)
        if not isinstance(message.delivery, Basic.GetOk):
            return None
        return delivery_from_aiormq(message, self.queue)

    async def close(self) -> None:
        """Close the channel (a message taken and not settled returns to the queue)."""
        channel, self._channel = self._channel, None
        if channel is not None:
            await close_channel(channel)
