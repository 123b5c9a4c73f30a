"""Rate-limit tokens on the wire: declare a job's rate queues, mint tokens (README "Flow control" -> "Rate limits").

A token is an empty, transient message in the job's token queue (``x-max-length`` 1,
``drop-head``: RabbitMQ "Queue Length Limit") with a per-message ``expiration``
(RabbitMQ "Time-To-Live and Expiration" -> "Per-Message TTL in Publishers"): the broker
drops it once it has waited that long, and a token requeued by a worker that no longer
wanted it keeps its original expiry ("Per-Message TTL ... Caveats": requeued messages keep
their expiry). Tokens are published ``mandatory``, so a token queue deleted by hand is
noticed (the broker returns the token: :attr:`TokenMinter.returned`) and declared again by
the emitter, on a channel in confirm mode: aiormq matches a ``basic.return`` to its publish
(and calls the channel's return callbacks) only there; on a channel without confirms it
logs each returned token as an error ("Unhandled message ... returning") and calls nothing.
A token lost still costs one start, never an extra one.
Workers take tokens with a :class:`~amqpjobs.wire.consume.WorkQueueConsumer` of prefetch 1
(one token at a time per process, acked when a handler starts with it, requeued when its
delivery does not start after all: :mod:`amqpjobs.runtime.rate_rooms`).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Final

import aiormq
from aio_pika.abc import AbstractRobustConnection
from pamqp.commands import Basic

from amqpjobs.errors import BrokerError
from amqpjobs.topology.declarations import Declarations
from amqpjobs.wire.arguments import to_milliseconds
from amqpjobs.wire.declare import declare
from amqpjobs.wire.errors import CHANNEL_OPEN_ERRORS, LIBRARY_ERRORS, channel_limit_hint

log = logging.getLogger("amqpjobs.wire")

#: Header of a token: its index on the rate's grid (:func:`amqpjobs.jobs.rate.tick_time`).
TOKEN_HEADER: Final = "amqpjobs-token"
#: Consumer argument of a worker's waiting-room consumer: the job's rate limit in that worker
#: (``10/s``), read back by ``status`` (management API ``consumer_details``); the broker ignores
#: consumer arguments it does not know.
RATE_ARGUMENT: Final = "amqpjobs-rate"


async def declare_rate_queues(connection: AbstractRobustConnection, declarations: Declarations, safe_url: str) -> None:
    """Declare rate-limited jobs' waiting rooms and token queues (idempotent: :func:`.declare.declare`).

    Raises:
        TopologyConflictError: a queue of that name exists with other arguments.
        BrokerError: the broker refused or did not answer in time.
    """
    await declare(connection, declarations, safe_url=safe_url)


class TokenMinter:
    """Publishes tokens into one token queue, on a channel of its own (open it with :meth:`open`).

    Args:
        channel: An aiormq channel of the connection that holds the emitter's lock.
        queue: The token queue.
    """

    def __init__(self, channel: aiormq.abc.AbstractChannel, queue: str) -> None:
        self._channel = channel
        self.queue = queue
        #: Set when the broker returned a token (``mandatory``: no queue to route it to, i.e. the token
        #: queue was deleted); whoever re-declares it clears this.
        self.returned = False
        channel.on_return_callbacks.add(self._on_return)

    def _on_return(self, message: object) -> None:
        self.returned = True

    @classmethod
    async def open(cls, connection: AbstractRobustConnection, queue: str) -> TokenMinter:
        """A minter on a new channel of ``connection``'s current underlying connection (never moved on reconnect).

        Raises:
            BrokerError: not connected, or the channel could not be opened.
        """
        transport = connection.transport
        if transport is None:
            raise BrokerError("not connected to the broker")
        try:
            # confirms: so a returned token reaches _on_return (see the module docstring), not aiormq's error log
            channel = await transport.connection.channel(publisher_confirms=True, on_return_raises=False)
        except CHANNEL_OPEN_ERRORS as exc:  # the connection closed meanwhile (aiormq: RuntimeError)
            raise BrokerError(
                f"could not open a channel to mint tokens into {queue!r}: {exc}{channel_limit_hint(exc)}"
            ) from exc
        return cls(channel, queue)

    @property
    def open_(self) -> bool:
        """Whether its channel is still open (it closes with the connection: a reconnect does not reopen it)."""
        return not self._channel.is_closed

    async def mint(self, index: int, expires_in: float) -> None:
        """Publish token ``index``, dropped by the broker after ``expires_in`` seconds (>= 1 ms once rounded).

        Waits for the broker's confirm (a returned token sets :attr:`returned`).

        Raises:
            BrokerError: the channel is closed (the connection dropped), or the broker nacked it.
        """
        properties = Basic.Properties(
            expiration=str(max(1, to_milliseconds(expires_in))), delivery_mode=1, headers={TOKEN_HEADER: index}
        )
        try:
            await self._channel.basic_publish(b"", routing_key=self.queue, properties=properties, mandatory=True)
        except LIBRARY_ERRORS as exc:
            raise BrokerError(f"minting a token into {self.queue!r} failed: {exc}{channel_limit_hint(exc)}") from exc

    async def close(self) -> None:
        """Close its channel (ignoring a channel already gone)."""
        with contextlib.suppress(Exception):
            await self._channel.close()
