"""A worker's ear for ``amqpjobs pause/resume`` signals: :class:`PauseSignals`.

The flags and the signals themselves (what ``pause`` declares and sends) are :mod:`amqpjobs.wire.flags`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import aiormq
from aio_pika.abc import AbstractChannel, AbstractRobustConnection

from amqpjobs.errors import AmqpJobsError, BrokerError
from amqpjobs.printable import printable
from amqpjobs.topology.naming import LISTENER_PREFIX, SIGNAL_EXCHANGE, pause_signal_key
from amqpjobs.wire.connection import close_channel
from amqpjobs.wire.errors import LIBRARY_ERRORS, broker_errors, channel_limit_hint
from amqpjobs.wire.flags import LISTEN_PERMISSION, RECHECK, PauseFlag, parse_signal

log = logging.getLogger("amqpjobs.wire")

_LISTEN_ERRORS: tuple[type[BaseException], ...] = (*LIBRARY_ERRORS, AmqpJobsError)
#: How RabbitMQ closes the connections of a vhost deleted (``is deleted``) or stopped (``is down``) under them.
_VHOST_GONE = re.compile(r"CONNECTION_FORCED - vhost '(.*)' is (deleted|down)")


def not_listening(exc: BrokerError, after: str) -> str:
    """The warning of a listener that could not listen again ``after`` (say, a reconnect): what happened, what to do.

    Its vhost deleted (or stopped) under the worker is said as such: nothing was deleted by hand,
    and no flag can be read until the vhost is back (the connection then comes back on its own).
    """
    gone = _VHOST_GONE.search(str(exc))
    if gone is None:
        return f"{exc} {after}; no job starts here until the pause flags are read again (tried every {RECHECK:g}s)"
    vhost, reason = printable(repr(gone.group(1))), printable(gone.group(0))
    if gone.group(2) == "deleted":
        return (
            f"the vhost {vhost} of this worker was deleted ({reason}): its queues went with it, the queue for pause "
            "signals too, and no job starts here; the worker reconnects on its own and listens again once the vhost "
            "is back: create it again and apply the topology (amqpjobs topology apply), or stop this worker"
        )
    # "is down": a vhost being deleted says so too (measured on 3.10: either, by which connection is closed first)
    return (
        f"the vhost {vhost} of this worker was deleted or stopped ({reason}): no job starts here; the worker "
        "reconnects on its own and listens again once the vhost is back: a deleted one, create it again and apply "
        "the topology (amqpjobs topology apply); a stopped one, restart it (rabbitmqctl restart_vhost); or stop "
        "this worker"
    )


class PauseSignals:
    """A worker's ear for ``amqpjobs pause/resume``: an exclusive queue bound to ``amq.direct``.

    Declared on the channel underneath aio-pika's robust one (as :mod:`amqpjobs.wire.lock`),
    so aio-pika restores nothing by itself; when the channel reopens (after a reconnect, or
    after the broker closed the channel alone), or the broker cancels the consumer (its
    queue deleted by hand), the queue is declared, bound and consumed anew, and ``on_back``
    is called (read the flags again: signals sent meanwhile went nowhere).

    Args:
        connection: The worker's robust connection.
        job_queues: The job queues to hear about (binding keys).
        on_signal: Called with (job queue, its pause or None when resumed), in arrival order.
        on_lost: Called when the channel closes or the consumer is cancelled (signals may be missed until
            ``on_back``).
        on_back: Called once listening again after a reopen.
    """

    def __init__(
        self,
        connection: AbstractRobustConnection,
        job_queues: Iterable[str],
        on_signal: Callable[[str, PauseFlag | None], None],
        on_lost: Callable[[], None],
        on_back: Callable[[], None],
    ) -> None:
        self.connection = connection
        self.job_queues = tuple(job_queues)
        self.name = f"{LISTENER_PREFIX}{uuid.uuid4().hex}"
        self._on_signal = on_signal
        self._on_lost = on_lost
        self._on_back = on_back
        self._channel: AbstractChannel | None = None
        self._closing = False
        self._watched: object = None  # the channel whose close and consumer cancel are watched
        self._relisten: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Declare the queue and its bindings, and consume.

        Raises:
            BrokerError: the broker refused one of them (the message names the permission needed).
        """
        self._channel = await self.connection.channel(publisher_confirms=False)
        self._channel.reopen_callbacks.add(self._reopened)
        await self._listen()

    async def _listen(self) -> None:
        assert self._channel is not None
        underlay = await self._channel.get_underlay_channel()
        try:
            with broker_errors(self.name):
                await underlay.queue_declare(self.name, exclusive=True, auto_delete=True,
                                             arguments={"x-queue-type": "classic"})  # fmt: skip
                for queue in self.job_queues:
                    await underlay.queue_bind(self.name, SIGNAL_EXCHANGE, routing_key=pause_signal_key(queue))
                await underlay.basic_consume(self.name, self._message, no_ack=True)
        except _LISTEN_ERRORS as exc:
            hint = f"; give the worker's user {LISTEN_PERMISSION}" if "ACCESS_REFUSED" in str(exc) else ""
            raise BrokerError(f"listening for pause signals failed: {exc}{hint}{channel_limit_hint(exc)}") from exc
        if self._watched is not underlay:
            self._watched = underlay
            underlay.closing.add_done_callback(self._closed)
            underlay.on_consumer_cancel_callbacks.add(self._cancelled)

    def _cancelled(self, _: Any) -> None:
        """The broker cancelled the consumer (its queue deleted): listen anew, then read the flags."""
        if self._closing:
            return
        self._on_lost()
        # not in this callback: the channel's reader awaits it, and would never read the answers
        self._relisten = asyncio.get_running_loop().create_task(self._listen_again())

    async def _listen_again(self) -> None:
        try:
            await self._listen()
        except BrokerError as exc:
            log.warning("%s", not_listening(exc, f"after its queue {self.name} was deleted"))
            return
        log.warning("the queue for pause signals %s was deleted; declared it again", self.name)
        self._on_back()

    async def _message(self, message: aiormq.abc.DeliveredMessage) -> None:
        parsed = parse_signal(message.body)
        if parsed is not None:
            self._on_signal(*parsed)

    def _closed(self, _: asyncio.Future[Any]) -> None:
        if not self._closing:
            self._on_lost()

    async def _reopened(self, *_: Any) -> None:
        if self._closing:
            return
        try:
            await self._listen()
        except BrokerError as exc:
            log.warning("%s", not_listening(exc, "after a reconnect"))
            return
        self._on_back()

    async def close(self) -> None:
        """Stop listening (the queue goes with the channel)."""
        self._closing = True
        if self._relisten is not None:
            self._relisten.cancel()
        if self._channel is not None:
            with contextlib.suppress(Exception):
                await close_channel(self._channel)
