"""Operator pause flags on the broker, and the signal that tells workers at once (``amqpjobs pause/resume``).

The flag: while an operator pauses job queue ``N``, a durable classic queue ``N.paused``
exists (:func:`~amqpjobs.topology.naming.paused_flag_name`); ``resume`` deletes it. Its
reason and since ride in its arguments (``amqpjobs-paused-*`` keys, stored and otherwise
ignored by the broker, as :mod:`amqpjobs.wire.lock` carries a lock holder), read back
through the management API (``GET /api/queues/<vhost>/<name>``), which shows them at once.
Nothing is ever published to it. Being durable, it outlives broker restarts: a worker that
starts, or reconnects, while it exists starts nothing of ``N``.

The signal: ``pause``/``resume`` then publish one message (confirmed) to the direct
exchange ``amqpjobs.control`` with routing key ``N``; every worker consuming ``N`` has an
exclusive queue of its own bound there (:class:`PauseSignals`) and learns it within
milliseconds. Workers read the flags themselves (:func:`read_flags`) after they start
listening, after each reconnect, and every :data:`RECHECK` seconds, for a signal missed
(the exchange deleted, say).

Why not poll the flag: a passive declare of a missing queue fails ``404 NOT_FOUND``, which
closes the channel and writes an ``[error]`` line in the broker's log for every look
(measured on 3.10: 1.3 ms a passive declare of a queue that exists, 4.8 ms a look at a
missing one with its channel reopened, and 200 looks left 200 error lines). Polling
fast enough for a 1 s bound (several looks a second, per worker and job queue) would fill
the broker's log while nothing is paused; a signal costs nothing then.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import aiormq
from aio_pika.abc import AbstractChannel, AbstractRobustConnection

from amqpjobs.errors import AmqpJobsError, BrokerError
from amqpjobs.printable import printable
from amqpjobs.topology.naming import CONTROL_EXCHANGE, paused_flag_name
from amqpjobs.wire.connection import close_channel, connect
from amqpjobs.wire.declare import declaring, find_missing
from amqpjobs.wire.errors import LIBRARY_ERRORS, broker_errors
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings

log = logging.getLogger("amqpjobs.wire")

_REASON: Final = "amqpjobs-paused-reason"
_SINCE: Final = "amqpjobs-paused-since"
#: Seconds between a worker's own reads of its pause flags (a missed signal is caught by then).
RECHECK: Final = 30.0
_LISTEN_ERRORS: tuple[type[BaseException], ...] = (*LIBRARY_ERRORS, AmqpJobsError)
#: The longest reason kept (characters); longer ones are cut.
MAX_REASON: Final = 500


@dataclass(frozen=True)
class PauseFlag:
    """An operator's pause of one job queue.

    Attributes:
        job_queue: The job queue paused (all its shards).
        reason: Why, as the operator said (``--reason``; "" when none; printable, at most
            :data:`MAX_REASON` characters).
        since: When it was paused (aware, UTC); a second ``pause`` sets it anew.
    """

    job_queue: str
    reason: str
    since: datetime

    def arguments(self) -> dict[str, Any]:
        """The flag queue's arguments that carry this pause."""
        return {"x-queue-type": "classic", _REASON: self.reason, _SINCE: self.since.isoformat()}

    @classmethod
    def from_arguments(cls, job_queue: str, arguments: Mapping[str, Any]) -> PauseFlag:
        """Read a pause back from its flag queue's arguments (missing ones: no reason, since unknown = epoch)."""
        try:
            since = datetime.fromisoformat(str(arguments[_SINCE])).astimezone(UTC)
        except (KeyError, ValueError):
            since = datetime.fromtimestamp(0, UTC)
        return cls(job_queue, printable(str(arguments.get(_REASON, "")))[:MAX_REASON], since)

    def to_json(self) -> dict[str, str]:
        """``{"reason": ..., "since": ISO 8601 UTC}``."""
        return {"reason": self.reason, "since": self.since.strftime("%Y-%m-%dT%H:%M:%SZ")}


def _signal(job_queue: str, flag: PauseFlag | None) -> bytes:
    return json.dumps({"queue": job_queue, "paused": flag is not None, **(flag.to_json() if flag else {})}).encode()


def parse_signal(body: bytes) -> tuple[str, PauseFlag | None] | None:
    """(job queue, its pause or None when resumed) from a signal's body; None when it is not one of ours."""
    try:
        doc = json.loads(body)
        queue = str(doc["queue"])
        if not doc["paused"]:
            return queue, None
        return queue, PauseFlag.from_arguments(queue, {_REASON: doc.get("reason", ""), _SINCE: doc.get("since")})
    except (ValueError, KeyError, TypeError):
        return None


async def _send(channel: AbstractChannel, job_queue: str, flag: PauseFlag | None) -> None:
    underlay = await channel.get_underlay_channel()
    properties = aiormq.spec.Basic.Properties(content_type="application/json", delivery_mode=1)
    with broker_errors(CONTROL_EXCHANGE):
        await underlay.basic_publish(_signal(job_queue, flag), exchange=CONTROL_EXCHANGE, routing_key=job_queue,
                                     properties=properties)  # fmt: skip


async def set_flags(settings: BrokerSettings, job_queues: Iterable[str], reason: str) -> list[PauseFlag]:
    """Pause ``job_queues``: (re)declare each flag with ``reason`` and now, then signal the workers.

    A queue paused already gets the new reason and since: its flag is deleted and declared
    again, then signalled (a declare of an existing queue keeps its arguments: RabbitMQ
    compares only its own ``x-`` arguments, and ignores ours). Workers read flags after a
    signal or a reconnect, and a read that finds no flag where one was is read again a
    second later before it counts (:mod:`amqpjobs.runtime.pausing`), so the moment without a
    flag is not taken for a resume.

    Raises:
        BrokerUnavailableError: cannot connect.
        BrokerError: the broker refused a declare or a publish, or did not answer in time.
    """
    since = datetime.now(UTC).replace(microsecond=0)
    flags = [PauseFlag(q, printable(reason)[:MAX_REASON], since) for q in job_queues]
    connection = await connect(settings, name="amqpjobs-pause")
    try:
        async with declaring("pausing", settings.safe_url):
            missing, _ = await find_missing(connection, [paused_flag_name(f.job_queue) for f in flags])
            channel = await connection.channel(publisher_confirms=True)
            try:
                with broker_errors(CONTROL_EXCHANGE):
                    await channel.declare_exchange(CONTROL_EXCHANGE, "direct", durable=True)
                for flag in flags:
                    name = paused_flag_name(flag.job_queue)
                    with broker_errors(name):
                        if name not in missing:  # paused already: replace it (new reason and since)
                            await channel.queue_delete(name)
                        await channel.declare_queue(name, durable=True, arguments=flag.arguments(), robust=False)
                    await _send(channel, flag.job_queue, flag)
            finally:
                await close_channel(channel)
    finally:
        await connection.close()
    return flags


async def clear_flags(settings: BrokerSettings, job_queues: Iterable[str]) -> list[str]:
    """Resume ``job_queues``: delete each flag, then signal the workers. Returns those that were paused.

    Raises:
        BrokerUnavailableError: cannot connect.
        BrokerError: the broker refused a delete or a publish, or did not answer in time.
    """
    job_queues = list(job_queues)
    connection = await connect(settings, name="amqpjobs-resume")
    try:
        async with declaring("resuming", settings.safe_url):
            missing, _ = await find_missing(connection, [paused_flag_name(q) for q in job_queues])
            paused = [q for q in job_queues if paused_flag_name(q) not in missing]
            channel = await connection.channel(publisher_confirms=True)
            try:
                with broker_errors(CONTROL_EXCHANGE):
                    await channel.declare_exchange(CONTROL_EXCHANGE, "direct", durable=True)
                for queue in paused:
                    with broker_errors(paused_flag_name(queue)):
                        await channel.queue_delete(paused_flag_name(queue))
                    await _send(channel, queue, None)
            finally:
                await close_channel(channel)
    finally:
        await connection.close()
    return paused


def read_flags(settings: BrokerSettings, job_queues: Iterable[str], timeout: float = 5.0) -> dict[str, PauseFlag]:
    """The pauses of ``job_queues`` (absent: not paused), from the management API (blocking: run it in a thread).

    Raises:
        BrokerUnavailableError, ManagementApiError: the management API can't be asked.
    """
    found: dict[str, PauseFlag] = {}
    with ManagementClient(settings, timeout=timeout) as mgmt:
        for queue in job_queues:
            info = mgmt.queue(settings.vhost, paused_flag_name(queue))
            if info is not None:
                found[queue] = PauseFlag.from_arguments(queue, info.get("arguments") or {})
    return found


def flags_in(live: Mapping[str, Mapping[str, Any]], job_queues: Iterable[str]) -> dict[str, PauseFlag]:
    """The pauses of ``job_queues`` among ``live`` queues (name -> the management API's description)."""
    return {
        q: PauseFlag.from_arguments(q, live[paused_flag_name(q)].get("arguments") or {})
        for q in job_queues
        if paused_flag_name(q) in live
    }


async def look_for_flags(
    settings: BrokerSettings, connection: AbstractRobustConnection, job_queues: Iterable[str]
) -> dict[str, PauseFlag]:
    """:func:`read_flags`, or passive declares on ``connection`` when the management API can't say (no reason then).

    Raises:
        BrokerError: neither could tell (not connected).
    """
    job_queues = list(job_queues)
    try:
        return await asyncio.to_thread(read_flags, settings, job_queues)
    except AmqpJobsError as exc:
        log.debug("pause flags not read through the management API (%s); looking over AMQP", exc)
    missing, _ = await find_missing(connection, [paused_flag_name(q) for q in job_queues])
    unknown = datetime.fromtimestamp(0, UTC)
    return {q: PauseFlag(q, "", unknown) for q in job_queues if paused_flag_name(q) not in missing}


class PauseSignals:
    """A worker's ear for ``amqpjobs pause/resume``: an exclusive queue bound to ``amqpjobs.control``.

    Declared on the channel underneath aio-pika's robust one (as :mod:`amqpjobs.wire.lock`),
    so aio-pika restores nothing by itself; when the channel reopens after a reconnect, the
    queue is declared, bound and consumed anew, and ``on_back`` is called (read the flags
    again: signals sent meanwhile went nowhere).

    Args:
        connection: The worker's robust connection.
        job_queues: The job queues to hear about (binding keys).
        on_signal: Called with (job queue, its pause or None when resumed), in arrival order.
        on_lost: Called when the channel closes (signals may be missed until ``on_back``).
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
        self.name = f"{CONTROL_EXCHANGE}.listener.{uuid.uuid4().hex}"
        self._on_signal = on_signal
        self._on_lost = on_lost
        self._on_back = on_back
        self._channel: AbstractChannel | None = None
        self._closing = False

    async def start(self) -> None:
        """Declare the exchange (idempotent), the queue and its bindings, and consume.

        Raises:
            BrokerError: the broker refused one of them.
        """
        self._channel = await self.connection.channel(publisher_confirms=False)
        self._channel.reopen_callbacks.add(self._reopened)
        await self._listen()

    async def _listen(self) -> None:
        assert self._channel is not None
        underlay = await self._channel.get_underlay_channel()
        try:
            with broker_errors(CONTROL_EXCHANGE):
                await underlay.exchange_declare(CONTROL_EXCHANGE, exchange_type="direct", durable=True)
                await underlay.queue_declare(self.name, exclusive=True, auto_delete=True,
                                             arguments={"x-queue-type": "classic"})  # fmt: skip
                for queue in self.job_queues:
                    await underlay.queue_bind(self.name, CONTROL_EXCHANGE, routing_key=queue)
                await underlay.basic_consume(self.name, self._message, no_ack=True)
        except _LISTEN_ERRORS as exc:
            raise BrokerError(f"listening for pause signals failed: {exc}") from exc
        underlay.closing.add_done_callback(self._closed)

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
        if self._channel is not None:
            with contextlib.suppress(Exception):
                await close_channel(self._channel)
