"""Broker-side locks: an exclusive queue is the lock, and it lives as long as its connection.

RabbitMQ lets only the declaring connection use an exclusive queue: another connection's
declare of it, passive or not, fails with ``RESOURCE_LOCKED`` (405), and the broker
deletes it when its connection closes, also when the process was killed (RabbitMQ
"Queues" → "Exclusive Queues"). So a killed holder frees its lock, with no expiry to wait
for. Exclusive queues are classic and transient, which every RabbitMQ version accepts
(4.3 refuses transient *non*-exclusive queues only).

Who holds a lock rides in its queue's arguments (``amqpjobs-lock-*`` keys, stored and
otherwise ignored by the broker). The refused connection cannot read them over AMQP (its
passive declare is refused too), so it asks the management API
(``GET /api/queues/<vhost>/<name>``), which shows them at once on 3.10 and 4.x.

The lock is declared on the channel underneath aio-pika's robust one: after a reconnect
aio-pika must not declare it again, because by then another process may hold it. A lock whose connection dropped is
lost for good; :meth:`HeldLock.check` says so, and the holder stops.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Final

import aiormq
from aio_pika.abc import AbstractChannel, AbstractRobustConnection

from amqpjobs.errors import AmqpJobsError, BrokerError, BrokerUnavailableError, BusyError, ResourceLockedError
from amqpjobs.printable import printable
from amqpjobs.wire.connection import close_channel
from amqpjobs.wire.declare import declaring
from amqpjobs.wire.errors import CHANNEL_OPEN_ERRORS, LIBRARY_ERRORS, channel_limit_hint, error_kind
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings

log = logging.getLogger("amqpjobs.wire")

_ACTION: Final = "amqpjobs-lock-action"
_HOST: Final = "amqpjobs-lock-host"
_PID: Final = "amqpjobs-lock-pid"
_SINCE: Final = "amqpjobs-lock-since"
_PREFIX: Final = "amqpjobs-lock-"
_OWN: Final = (_ACTION, _HOST, _PID, _SINCE)
#: Attempts at taking a lock whose holder let go while we were reading who it was.
_ATTEMPTS: Final = 3
#: Seconds the management API gets to name a holder (a refusal must come at once).
_LOOKUP_TIMEOUT: Final = 3.0
_BROKER_ERRORS: tuple[type[BaseException], ...] = (*LIBRARY_ERRORS, TimeoutError)


@dataclass(frozen=True)
class LockHolder:
    """Who holds a lock.

    Attributes:
        action: What it is doing, e.g. ``"replay"``.
        host: Host name of its process.
        pid: Process id on that host.
        since: When it took the lock (aware, UTC).
        details: More about what it does, ``(key, text)`` pairs (e.g. ``("rate", "10/s")``), each
            carried as argument ``amqpjobs-lock-<key>``.

    """

    action: str
    host: str
    pid: int
    since: datetime
    details: tuple[tuple[str, str], ...] = ()

    def __str__(self) -> str:
        """``replay (pid 4242 on host-a, since 2026-11-29T08:00:00Z; by amqpjobs console: ...; connection '...')``.

        ``by`` (the program, :func:`amqpjobs.runtime.quarantine.mover_lock`) and ``connection`` (the
        broker's name of the holder's connection, :func:`lock_holder`) are said when known.
        """
        more = "".join(f"; {label}{printable(text)}" for key, label in (("by", "by "), ("connection", "connection "))
                       if (text := self.detail(key)))  # fmt: skip
        return f"{self.action} (pid {self.pid} on {self.host}, since {self.since:%Y-%m-%dT%H:%M:%SZ}{more})"

    def detail(self, key: str) -> str | None:
        """The text of detail ``key``, or None when it has none."""
        return dict(self.details).get(key)

    def arguments(self) -> dict[str, Any]:
        """The lock queue's arguments that carry this holder."""
        own = {_ACTION: self.action, _HOST: self.host, _PID: self.pid, _SINCE: self.since.isoformat()}
        return {**own, **{_PREFIX + k: v for k, v in self.details}}

    @classmethod
    def from_arguments(cls, arguments: Mapping[str, Any]) -> LockHolder | None:
        """Read a holder back from a lock queue's arguments; None when they don't name one."""
        try:
            since = datetime.fromisoformat(str(arguments[_SINCE])).astimezone(UTC)
            details = tuple(sorted((k.removeprefix(_PREFIX), str(v)) for k, v in arguments.items()
                                   if k.startswith(_PREFIX) and k not in _OWN))  # fmt: skip
            return cls(str(arguments[_ACTION]), str(arguments[_HOST]), int(arguments[_PID]), since, details)
        except (KeyError, TypeError, ValueError, OverflowError):  # OverflowError: a since whose UTC is out of range
            return None


class HeldLock:
    """A lock this process holds (see :func:`exclusive_lock`)."""

    def __init__(self, name: str, what: str, underlay: aiormq.abc.AbstractChannel) -> None:
        self.name = name
        self._what = what
        self._underlay = underlay  # closes with the connection that owns the lock

    @property
    def held(self) -> bool:
        """False once the connection that took the lock dropped (a reconnect does not take it back)."""
        return not self._underlay.is_closed

    def check(self) -> None:
        """Raise when the lock was lost; call before each step that needs it.

        Raises:
            BrokerError: the connection that held the lock dropped; another process may hold it now.

        """
        if not self.held:
            raise BrokerError(
                f"lost the lock on {self._what}: its connection to the broker dropped, and another process may "
                "hold the lock now; stopped"
            )


async def lock_holder(settings: BrokerSettings, name: str) -> tuple[bool, LockHolder | None]:
    """(whether lock queue ``name`` exists, its holder or None when unknown), from the management API.

    Never raises: a management API that does not answer gives (True, None).
    """
    exists, queue = await _lock_queue(settings, name)
    return exists, None if queue is None else LockHolder.from_arguments(queue.get("arguments") or {})


async def _lock_queue(settings: BrokerSettings, name: str) -> tuple[bool, dict[str, Any] | None]:
    """(whether lock queue ``name`` exists, what the management API says of it or None); never raises."""

    def lookup() -> dict[str, Any] | None:
        with ManagementClient(settings, timeout=_LOOKUP_TIMEOUT) as mgmt:
            return mgmt.queue(settings.vhost, name)

    try:
        queue = await asyncio.to_thread(lookup)
    except AmqpJobsError as exc:
        log.debug("holder of lock %s unknown: %s", name, exc)
        return True, None
    return queue is not None, queue


async def _holder(settings: BrokerSettings, name: str) -> tuple[bool, str | None]:
    """(whether lock queue ``name`` still exists, who holds it as text or None when unknown).

    With the broker's name of the holder's connection (``127.0.0.1:50712 -> 127.0.0.1:5672``, as the
    management UI lists it, where it can be closed) once the management API knows it: its stats
    come every few seconds, so not for a lock just taken.
    """
    exists, queue = await _lock_queue(settings, name)
    holder = None if queue is None else LockHolder.from_arguments(queue.get("arguments") or {})
    if holder is None or queue is None:
        return exists, None
    owner = queue.get("owner_pid_details")
    connection = owner.get("name") if isinstance(owner, dict) else None
    if isinstance(connection, str) and connection:
        holder = replace(holder, details=(*holder.details, ("connection", repr(connection))))
    return exists, str(holder)


async def _open_channel(connection: AbstractRobustConnection, what: str) -> AbstractChannel:
    """A channel of ``connection`` to take a lock on.

    Raises:
        BrokerUnavailableError: the connection is down (it reconnects by itself: try again later).
    """
    try:
        return await connection.channel(publisher_confirms=False)
    except CHANNEL_OPEN_ERRORS as exc:  # aio-pika: RuntimeError "Connection was not opened" while reconnecting
        raise BrokerUnavailableError(f"could not take the lock on {what}: not connected ({exc})") from exc


@asynccontextmanager
async def exclusive_lock(
    connection: AbstractRobustConnection,
    settings: BrokerSettings,
    name: str,
    holder: LockHolder,
    what: str,
    look_up: bool = True,
) -> AsyncIterator[HeldLock]:
    """Hold lock ``name`` (an exclusive queue on ``connection``) for the ``async with`` block.

    Args:
        connection: The connection whose life bounds the lock (closing it frees the lock).
        settings: Broker settings (the management API names a refusing holder).
        name: Name of the lock queue.
        holder: Who we are; a refused process reads it back.
        what: What the lock guards, for messages, e.g. ``quarantine queue 'work.quarantine'``.
        look_up: Ask the management API who holds it when refused (False: a quiet try, as
            every second by a rate limit's would-be token emitters; the error names no holder).

    Raises:
        BusyError: another connection holds the lock (at once, no waiting); the message
            names the holder when the management API could read it.
        BrokerUnavailableError: not connected (the connection reconnects by itself: try again later).
        BrokerError: the broker failed while taking the lock, or did not answer in time
            (:data:`~amqpjobs.wire.declare.DECLARE_TIMEOUT`).

    """
    channel = await _open_channel(connection, what)
    try:
        for attempt in range(_ATTEMPTS):
            # on the underlying channel: tied to this very connection, and never re-declared on reconnect
            try:
                underlay = await channel.get_underlay_channel()
            except CHANNEL_OPEN_ERRORS as exc:
                raise BrokerUnavailableError(f"could not take the lock on {what}: not connected ({exc})") from exc
            try:
                async with declaring(f"taking the lock on {what}", settings.safe_url):
                    await underlay.queue_declare(
                        name, exclusive=True, durable=False, auto_delete=False,
                        arguments={"x-queue-type": "classic", **holder.arguments()},
                    )  # fmt: skip
                break
            except LIBRARY_ERRORS as exc:
                if error_kind(exc) is not ResourceLockedError:
                    raise BrokerError(
                        f"could not take the lock on {what} ({name!r}): {exc}{channel_limit_hint(exc)}"
                    ) from exc
                exists, held_by = await _holder(settings, name) if look_up else (True, None)
                if exists or attempt == _ATTEMPTS - 1:
                    who = held_by or "another connection (the management API could not say which)"
                    raise BusyError(
                        f"{what} is busy: {who} holds its lock; one at a time, so wait for it to finish or stop it, "
                        f"then try again (lock: exclusive queue {name!r})",
                        what,
                        held_by,
                    ) from None
                await close_channel(channel)  # the holder let go meanwhile: try again
                channel = await _open_channel(connection, what)
        lock = HeldLock(name, what, underlay)
        try:
            yield lock
        finally:
            if lock.held:  # once lost, the queue went with the old connection or is someone else's now
                try:
                    await asyncio.wait_for(underlay.queue_delete(name), 10)
                except _BROKER_ERRORS as exc:
                    log.warning("lock %s not deleted (%s); it goes with the connection", name, exc)
    finally:
        await close_channel(channel)
