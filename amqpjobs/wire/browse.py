"""Looking at a queue without consuming it: probe (exists / missing / locked), browse, purge, watch.

For the quarantine commands (:mod:`amqpjobs.runtime.quarantine`), which see only these
functions and :mod:`amqpjobs.errors` classes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from functools import partial
from typing import Any

from aio_pika.abc import AbstractChannel, AbstractIncomingMessage

from amqpjobs.errors import NotFoundError
from amqpjobs.wire.abc import Connection
from amqpjobs.wire.connection import close_channel
from amqpjobs.wire.declare import QueueProbe
from amqpjobs.wire.delivery import Delivery, get_unacked
from amqpjobs.wire.errors import broker_errors


async def exchange_exists(connection: Connection, name: str) -> bool:
    """Whether exchange ``name`` exists (a passive declare on a throwaway channel)."""
    channel = await connection.channel(publisher_confirms=False)
    try:
        with broker_errors(name):
            await channel.declare_exchange(name, passive=True)
        return True
    except NotFoundError:
        return False
    finally:
        await close_channel(channel)


async def probe_queue(connection: Connection, name: str) -> int:
    """The message count of queue ``name`` (a passive declare on a throwaway channel).

    Raises:
        NotFoundError: it does not exist.
        ResourceLockedError: it is exclusive to another connection.

    """
    channel = await connection.channel(publisher_confirms=False)
    try:
        with broker_errors(name):
            declared = await channel.declare_queue(name, passive=True)
        return declared.declaration_result.message_count or 0
    finally:
        await close_channel(channel)


async def queue_state(connection: Connection, name: str) -> QueueProbe | None:
    """Messages ready and consumers of queue ``name`` now (a passive declare on a throwaway channel); None: missing.

    Raises:
        ResourceLockedError: it is exclusive to another connection.

    """
    channel = await connection.channel(publisher_confirms=False)
    try:
        with broker_errors(name):
            result = (await channel.declare_queue(name, passive=True)).declaration_result
        return QueueProbe(result.message_count or 0, result.consumer_count or 0)
    except NotFoundError:
        return None
    finally:
        await close_channel(channel)


#: Seconds :meth:`QueueBrowser.close` waits at most for the messages it held to be ready again.
RETURN_WAIT = 2.0


class QueueBrowser:
    """A channel for ``basic.get`` without acking: closing it returns every message it holds."""

    def __init__(self, channel: AbstractChannel, connection: Connection | None = None) -> None:
        self._channel = channel
        self._connection = connection
        self._held: dict[str, int] = {}

    @classmethod
    async def open(cls, connection: Connection) -> QueueBrowser:
        """A browser on a new channel of ``connection``."""
        return cls(await connection.channel(publisher_confirms=False), connection)

    async def deliveries(self, queue: str, max_count: int) -> AsyncIterator[Delivery]:
        """Up to ``max_count`` deliveries of ``queue``, unacked (see :func:`~amqpjobs.wire.delivery.get_unacked`)."""
        async for delivery in get_unacked(self._channel, queue, max_count, partial(self._settled, queue)):
            self._held[queue] = self._held.get(queue, 0) + 1
            yield delivery

    def _settled(self, queue: str) -> None:
        """One delivery of ``queue`` was acked, rejected or requeued: no longer held."""
        self._held[queue] -= 1

    async def close(self) -> None:
        """Close the channel, and wait until every message it still holds (not acked) is ready again.

        The broker requeues them when the channel closes, but not before the close is answered:
        a quorum queue returns them with a Raft command (1-4 ms measured on 3.10.8, 4.0.5 and
        4.3.6); a classic queue when its process sees the channel process end, since a
        ``basic.get`` makes no consumer for the close to notify first (local CI on 4.0.5 counted
        ``left 0`` for a skipped message still in the queue). So a count or a browse right after
        this one would otherwise see fewer. The wait ends when each queue's ready count (a
        passive declare) is back to what it was before the close plus what was still held, or
        after :data:`RETURN_WAIT` seconds (another reader took some meanwhile).
        """
        if self._channel.is_closed:  # cut off: the broker took every message back with the channel
            await close_channel(self._channel)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + RETURN_WAIT
        expected: dict[str, int] = {}
        try:
            async with asyncio.timeout_at(deadline):  # a connection lost meanwhile (reconnecting) is not waited for
                for queue, held in self._held.items():
                    if held > 0:
                        with broker_errors(queue):
                            result = (await self._channel.declare_queue(queue, passive=True)).declaration_result
                        expected[queue] = (result.message_count or 0) + held
                await self._channel.close()
                if self._connection is None:
                    return
                for queue, want in expected.items():
                    while True:  # polled: the broker says nothing when they are back
                        if await probe_queue(self._connection, queue) >= want:
                            break
                        await asyncio.sleep(0.005)
        except (NotFoundError, TimeoutError):  # deleted meanwhile, or slow: nothing more to wait for
            await close_channel(self._channel)

    async def close_quietly(self) -> None:
        """Close the channel for good, ignoring a channel the broker already closed."""
        await close_channel(self._channel)


async def purge_queue(connection: Connection, name: str) -> int:
    """Remove every message of queue ``name``; the number removed."""
    channel = await connection.channel(publisher_confirms=False)
    try:
        queue = await channel.get_queue(name, ensure=False)
        result = await queue.purge()
        return int(result.message_count or 0)
    finally:
        await channel.close()


class Watch:
    """Messages arriving on an exchange, each acked after its headers are handed on."""

    def __init__(self, channel: AbstractChannel) -> None:
        self._channel = channel

    @property
    def is_closed(self) -> bool:
        """Whether its channel has closed."""
        return bool(self._channel.is_closed)

    async def close(self) -> None:
        """Stop watching (the exclusive queue goes with the channel's consumer)."""
        await self._channel.close()


async def watch_exchange(
    connection: Connection, exchange: str, on_headers: Callable[[Mapping[str, Any], str], None]
) -> Watch:
    """Bind a new exclusive queue to ``exchange`` and call ``on_headers`` with each message's headers and message id.

    Raises:
        NotFoundError: ``exchange`` does not exist.

    """
    channel = await connection.channel(publisher_confirms=False)
    watcher = await channel.declare_queue("", exclusive=True, durable=False, auto_delete=True)
    with broker_errors():
        await watcher.bind(exchange)

    async def on_message(message: AbstractIncomingMessage) -> None:
        on_headers(message.headers or {}, message.message_id or "")
        await message.ack()

    await watcher.consume(on_message)
    return Watch(channel)
