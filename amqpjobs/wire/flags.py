"""Operator pause flags on the broker, and the signal that tells workers at once (``amqpjobs pause/resume``).

The flag: while an operator pauses job queue ``N``, a durable classic queue ``N.paused``
exists (:func:`~amqpjobs.topology.naming.paused_flag_name`); ``resume`` deletes it. Its
reason and since ride in its arguments (``amqpjobs-paused-*`` keys, stored and otherwise
ignored by the broker, as :mod:`amqpjobs.wire.lock` carries a lock holder), read back
through the management API (``GET /api/queues/<vhost>/<name>``), which shows them at once.
Nothing is ever published to it. Being durable, it outlives broker restarts: a worker that
starts, or reconnects, while it exists starts nothing of ``N``.

The signal: ``pause``/``resume`` then publish one message (confirmed) to RabbitMQ's
pre-declared direct exchange ``amq.direct`` with routing key ``amqpjobs.pause.N``
(:func:`~amqpjobs.topology.naming.pause_signal_key`); every worker consuming ``N`` has an
exclusive queue of its own bound there (:class:`PauseSignals`) and learns it within
milliseconds. A pre-declared exchange exists on every vhost and can't be deleted (RabbitMQ
"Exchanges" -> "Pre-declared Exchanges"), so no user can unbind every worker unnoticed by
deleting it (the ``amqpjobs.control`` exchange of earlier versions could be). Workers read
the flags themselves (:func:`read_flags`) after they start listening, after each reconnect
or loss of their listener (its channel closed, its queue deleted), and every
:data:`RECHECK` seconds, for a signal missed. A signal the broker refuses (no write
permission on ``amq.direct``) leaves the flag changed: :class:`SignalNotSent` says so.

Why not poll the flag: a passive declare of a missing queue fails ``404 NOT_FOUND``, which
closes the channel and writes an ``[error]`` line in the broker's log for every look
(measured on 3.10: 1.3 ms a passive declare of a queue that exists, 4.8 ms a look at a
missing one with its channel reopened, and 200 looks left 200 error lines). Polling
fast enough for a 1 s bound (several looks a second, per worker and job queue) would fill
the broker's log while nothing is paused; a signal costs nothing then.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import aiormq
from aio_pika.abc import AbstractChannel, AbstractRobustConnection

from amqpjobs.errors import AmqpJobsError, BrokerError
from amqpjobs.printable import printable
from amqpjobs.topology.naming import LISTENER_PREFIX, SIGNAL_EXCHANGE, pause_signal_key, paused_flag_name
from amqpjobs.wire.alarms import alarm_now
from amqpjobs.wire.connection import close_channel, connect
from amqpjobs.wire.declare import declaring, find_missing
from amqpjobs.wire.errors import broker_errors
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings

log = logging.getLogger("amqpjobs.wire")

_REASON: Final = "amqpjobs-paused-reason"
_SINCE: Final = "amqpjobs-paused-since"
#: Seconds between a worker's own reads of its pause flags (a missed signal is caught by then).
RECHECK: Final = 30.0
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
        except (KeyError, ValueError, OverflowError):  # OverflowError: a since whose UTC is out of range
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


#: What a user needs to send pause signals, for messages (README "Flow control" -> "Broker permissions").
SEND_PERMISSION = f"write permission on exchange {SIGNAL_EXCHANGE}"
#: What a worker's user needs to hear them.
LISTEN_PERMISSION = (f"configure, write and read permission on queues named {LISTENER_PREFIX}* and read permission "
                     f"on exchange {SIGNAL_EXCHANGE}")  # fmt: skip


async def _send(channel: AbstractChannel, job_queue: str, flag: PauseFlag | None) -> str | None:
    """Signal one change; None when sent, else why not (the channel is then closed: send no more on it)."""
    underlay = await channel.get_underlay_channel()
    properties = aiormq.spec.Basic.Properties(content_type="application/json", delivery_mode=1)
    try:
        with broker_errors(SIGNAL_EXCHANGE):
            await underlay.basic_publish(_signal(job_queue, flag), exchange=SIGNAL_EXCHANGE,
                                         routing_key=pause_signal_key(job_queue), properties=properties)  # fmt: skip
    except BrokerError as exc:
        hint = f"; the user needs {SEND_PERMISSION}" if "ACCESS_REFUSED" in str(exc) else ""
        return f"{exc}{hint}"
    return None


@dataclass(frozen=True)
class SignalNotSent:
    """Flags changed, but the signal to the workers was not sent (they notice within :data:`RECHECK` seconds).

    Attributes:
        job_queue: The first job queue whose signal was not sent.
        why: The broker's refusal, with the permission needed when it was one.
    """

    job_queue: str
    why: str


async def set_flags(
    settings: BrokerSettings, job_queues: Iterable[str], reason: str
) -> tuple[list[PauseFlag], SignalNotSent | None]:
    """Pause ``job_queues``: (re)declare each flag with ``reason`` and now, then signal the workers.

    A queue paused already gets the new reason and since: its flag is deleted and declared
    again, then signalled (a declare of an existing queue keeps its arguments: RabbitMQ
    compares only its own ``x-`` arguments, and ignores ours). Workers read flags after a
    signal or a reconnect, and a read that finds no flag where one was is read again a
    second later before it counts (:mod:`amqpjobs.runtime.pausing`), so the moment without a
    flag is not taken for a resume.

    Returns:
        The pauses as the broker keeps them, read back after the declares (another ``pause`` of
        the same job queue at the same moment may have declared it first: its reason stays, and
        that is what is signalled), and None when every signal went out, else which one did not
        and why (the flags are set all the same; workers notice them at their next read).

    Raises:
        BrokerUnavailableError: cannot connect.
        BrokerError: the broker refused a declare or a delete (nothing signalled), or did not answer in time.
    """
    since = datetime.now(UTC).replace(microsecond=0)
    flags = [PauseFlag(q, printable(reason)[:MAX_REASON], since) for q in job_queues]
    connection = await connect(settings, name="amqpjobs-pause")
    try:
        async with declaring("pausing", settings.safe_url):
            missing, _ = await find_missing(connection, [paused_flag_name(f.job_queue) for f in flags])
            channel = await connection.channel(publisher_confirms=True)
            try:
                for flag in flags:
                    name = paused_flag_name(flag.job_queue)
                    with broker_errors(name):
                        if name not in missing:  # paused already: replace it (new reason and since)
                            await channel.queue_delete(name)
                        await channel.declare_queue(name, durable=True, arguments=flag.arguments(), robust=False)
                kept = await asyncio.to_thread(_kept, settings, [f.job_queue for f in flags])
                flags = [kept.get(f.job_queue, f) for f in flags]
                unsent = await _send_all(settings, channel, [(f.job_queue, f) for f in flags])
            finally:
                await close_channel(channel)
    finally:
        await connection.close()
    return flags, unsent


def _kept(settings: BrokerSettings, job_queues: list[str]) -> dict[str, PauseFlag]:
    """The pauses the broker keeps for ``job_queues`` (best effort: {} when the management API can't say)."""
    try:
        return read_flags(settings, job_queues)
    except AmqpJobsError as exc:
        log.debug("pause flags not read back (%s)", exc)
        return {}


async def _send_all(
    settings: BrokerSettings, channel: AbstractChannel, signals: list[tuple[str, PauseFlag | None]]
) -> SignalNotSent | None:
    """Send each signal; the first refused stops the rest (its channel is closed): which and why.

    None is sent during a resource alarm: the broker would hold the publish unread until the
    alarm clears (and hold the command with it, its channel's close too); the flags are
    changed, and workers read them within :data:`RECHECK` seconds.
    """
    if signals and (alarm := await alarm_now(settings)) is not None:
        held = f"the broker is blocking publishers: resource alarm ({alarm}); the signal would be held until it clears"
        return SignalNotSent(signals[0][0], held)
    for job_queue, flag in signals:
        if (why := await _send(channel, job_queue, flag)) is not None:
            return SignalNotSent(job_queue, why)
    return None


async def clear_flags(settings: BrokerSettings, job_queues: Iterable[str]) -> tuple[list[str], SignalNotSent | None]:
    """Resume ``job_queues``: delete each flag, then signal the workers.

    Returns:
        Those that were paused, and None when every signal went out, else which one did
        not and why (the flags are deleted all the same).

    Raises:
        BrokerUnavailableError: cannot connect.
        BrokerError: the broker refused a delete (nothing signalled), or did not answer in time.
    """
    job_queues = list(job_queues)
    connection = await connect(settings, name="amqpjobs-resume")
    try:
        async with declaring("resuming", settings.safe_url):
            missing, _ = await find_missing(connection, [paused_flag_name(q) for q in job_queues])
            paused = [q for q in job_queues if paused_flag_name(q) not in missing]
            channel = await connection.channel(publisher_confirms=True)
            try:
                for queue in paused:
                    with broker_errors(paused_flag_name(queue)):
                        await channel.queue_delete(paused_flag_name(queue))
                unsent = await _send_all(settings, channel, [(q, None) for q in paused])
            finally:
                await close_channel(channel)
    finally:
        await connection.close()
    return paused, unsent


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
