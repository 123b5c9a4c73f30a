"""Broker resource alarms as a publisher sees them: ``connection.blocked`` / ``connection.unblocked``.

While a node is low on memory or disk, RabbitMQ stops reading from every connection that
publishes, cluster-wide, and tells each (clients that announce the ``connection.blocked``
capability, as aiormq does) with ``connection.blocked`` carrying a reason such as
``"low on memory"``; ``connection.unblocked`` follows once every alarm cleared (RabbitMQ
"Memory and Disk Alarms", "Blocked Connection Notifications"). A connection that only
consumes and acks is not blocked, which is why workers publish on a connection of their own.

The broker blocks a connection only when it publishes during the alarm: the first publish
is then held unread (it is stored once the alarm clears) and only the later ones can be
refused before they are written. :func:`blocked_by` reads the notification;
:func:`alarm_now` asks the node (management API) before that first publish, and
:func:`refuse_while_blocked` is the one check of an operator command that publishes (``replay``,
``quarantine park``; ``pause``/``resume`` send no signal then): refused at once, saying why,
instead of held without a word until the alarm clears. aiormq keeps the blocked state but
drops the reason, so :func:`install_blocked_tracking` records it.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

import aiormq

from amqpjobs.errors import AmqpJobsError, BrokerBlockedError
from amqpjobs.text import as_text
from amqpjobs.wire.abc import Connection
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.reset import abort
from amqpjobs.wire.settings import BrokerSettings

#: The reason of the last ``connection.blocked`` of each aiormq connection.
_REASONS: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
_HANDLER = "_Connection__handle_connection_blocked"  # aiormq's (name-mangled) handler of the frame
_EVENT = "_Connection__connection_unblocked"  # aiormq's event: set while not blocked


def install_blocked_tracking() -> None:
    """Record the reason of each ``connection.blocked`` aiormq receives (once per process)."""
    cls: Any = aiormq.Connection
    if getattr(cls, "_amqpjobs_blocked_reasons", False):
        return
    original: Callable[[Any, Any], Awaitable[None]] = getattr(cls, _HANDLER)

    async def on_blocked(self: Any, frame: Any) -> None:
        reason = frame.reason
        _REASONS[self] = as_text(reason or "")
        await original(self, frame)

    setattr(cls, _HANDLER, on_blocked)
    cls._amqpjobs_blocked_reasons = True


def alarm_of(reason: str) -> str:
    """The alarm a ``connection.blocked`` reason names: ``"low on memory & disk"`` -> ``"memory & disk"``."""
    text = reason.strip()
    return text[len("low on ") :] if text.startswith("low on ") else (text or "a resource alarm")


def _unblocked_event(connection: Connection) -> asyncio.Event | None:
    transport = getattr(connection, "transport", None)
    event = getattr(getattr(transport, "connection", None), _EVENT, None)
    return event if isinstance(event, asyncio.Event) else None


def blocked_by(connection: Connection) -> str | None:
    """The alarm ``connection`` is blocked by now (``"memory"``, ``"disk"`` ...), or None when it is not blocked."""
    event = _unblocked_event(connection)
    if event is None or event.is_set():
        return None
    transport = getattr(connection, "transport", None)
    return alarm_of(_REASONS.get(getattr(transport, "connection", None), ""))


async def alarm_now(settings: BrokerSettings) -> str | None:
    """The resource alarm that blocks publishers now (``memory``, ``disk``, ``disk & memory``), from the management API.

    None when there is none, or the API can't say (a publish then goes as ever). Asked in a thread
    (the HTTP client blocks), at most 5 s.
    """

    def ask() -> list[str]:
        with ManagementClient(settings, timeout=5.0) as mgmt:
            return mgmt.alarms()

    try:
        return " & ".join(await asyncio.to_thread(ask)) or None
    except AmqpJobsError:
        return None


async def refuse_while_blocked(settings: BrokerSettings, what: str) -> None:
    """Refuse an operator command that publishes (``what``: ``replay of 'Q'``) while a resource alarm is raised.

    The broker would hold its first publish unread until the alarm clears, and the command with it
    (a replay waited without a word until killed). Call it before anything is moved.

    Raises:
        BrokerBlockedError: an alarm is raised; the message names it and says nothing was moved (exit 3).

    """
    alarm = await alarm_now(settings)
    if alarm is not None:
        raise BrokerBlockedError(
            f"{what}: the broker is blocking publishers: resource alarm ({alarm}); each copy would be held unread "
            "until it clears, so nothing was moved: run it again once the alarm clears",
            alarm=alarm,
        )


#: Seconds between two looks at the connection of a publish awaiting its confirm (``wait_while_blocked``):
#: while it is blocked, the confirm wait starts again.
BLOCKED_RECHECK = 0.5


class WhileBlocked:
    """Pushes a confirm wait's end to ``timeout`` seconds from now whenever its connection is seen blocked.

    A resource alarm's broker holds a blocked connection's publishes unread and stores them once the
    alarm clears (then confirms them): the wait for their confirms goes on meanwhile. Looks every
    :data:`BLOCKED_RECHECK` seconds until :meth:`cancel`.
    """

    def __init__(self, connection: Connection, window: asyncio.Timeout, timeout: float) -> None:
        self._connection = connection
        self._window = window
        self._timeout = timeout
        self._loop = asyncio.get_running_loop()
        self._handle = self._loop.call_later(BLOCKED_RECHECK, self._look)

    def _look(self) -> None:
        if blocked_by(self._connection) is not None:
            self._window.reschedule(self._loop.time() + self._timeout)
        self._handle = self._loop.call_later(BLOCKED_RECHECK, self._look)

    def cancel(self) -> None:
        """Stop looking (the confirm came, or the wait ended otherwise)."""
        self._handle.cancel()


class GiveUpWhileBlocked:
    """Ends a confirm wait once its connection has been seen blocked for ``bound`` seconds in a row.

    Then :attr:`alarm` names the alarm (``"memory"`` ...) and the wait's window ends now. A publish whose
    confirm is awaited when the connection is blocked was held unread by the broker (what it had read
    before the block is confirmed meanwhile); the caller decides what becomes of it (a reset drops it:
    :func:`~amqpjobs.wire.reset.reset`). Looks every :data:`BLOCKED_RECHECK` seconds until :meth:`cancel`.
    """

    def __init__(
        self,
        connection: Connection,
        window: asyncio.Timeout,
        bound: float,
        on_give_up: Callable[[], object] | None = None,
    ) -> None:
        self.alarm: str | None = None
        self._on_give_up = on_give_up
        self._connection = connection
        self._window = window
        self._bound = bound
        self._since: float | None = None
        self._loop = asyncio.get_running_loop()
        self._handle = self._loop.call_soon(self._look)

    def _look(self) -> None:
        alarm, now = blocked_by(self._connection), self._loop.time()
        if alarm is None:
            self._since = None
        elif self._since is None:
            self._since = now
        elif now - self._since >= self._bound:
            self.alarm = alarm
            if self._on_give_up is not None:  # in this step, while the connection is seen blocked
                self._on_give_up()
            self._window.reschedule(now)
            return
        self._handle = self._loop.call_later(BLOCKED_RECHECK, self._look)

    def cancel(self) -> None:
        """Stop looking (the confirm came, or the wait ended otherwise)."""
        self._handle.cancel()


def confirm_watch(
    connection: Connection, window: asyncio.Timeout, timeout: float, wait_while_blocked: bool, give_up: float | None
) -> WhileBlocked | GiveUpWhileBlocked | None:
    """What watches a confirm wait's ``window`` for a blocked connection, as its publisher chose.

    ``wait_while_blocked``: :class:`WhileBlocked` (the wait goes on while blocked, ``timeout`` seconds
    at a time); else ``give_up`` seconds: :class:`GiveUpWhileBlocked`, which resets the connection as it
    gives up (:func:`~amqpjobs.wire.reset.abort`), so that the publish held unread is dropped even if
    the alarm clears a moment later; else None (``timeout`` alone).
    """
    if wait_while_blocked:
        return WhileBlocked(connection, window, timeout)
    if give_up is None:
        return None
    return GiveUpWhileBlocked(connection, window, give_up, lambda: abort(connection))
