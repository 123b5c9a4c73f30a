"""A worker's ear for ``amqpjobs pause/resume`` signals: :class:`PauseSignals`.

The flags and the signals themselves (what ``pause`` declares and sends) are :mod:`amqpjobs.wire.flags`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import aiormq
from aio_pika.abc import AbstractChannel, AbstractRobustConnection

from amqpjobs.errors import AmqpJobsError, BrokerError
from amqpjobs.topology.naming import LISTENER_PREFIX, SIGNAL_EXCHANGE, pause_signal_key
from amqpjobs.wire.connection import close_channel
from amqpjobs.wire.errors import LIBRARY_ERRORS, broker_errors
from amqpjobs.wire.flags import LISTEN_PERMISSION, RECHECK, PauseFlag, parse_signal

log = logging.getLogger("amqpjobs.wire")

_LISTEN_ERRORS: tuple[type[BaseException], ...] = (*LIBRARY_ERRORS, AmqpJobsError)


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
            raise BrokerError(f"listening for pause signals failed: {exc}{hint}") from exc
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
            log.warning("%s after its queue was deleted; pause flags are read every %gs meanwhile", exc, RECHECK)
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
            log.warning("%s after a reconnect; pause flags are read every %gs meanwhile", exc, RECHECK)
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
