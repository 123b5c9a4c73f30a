"""A worker (or scheduler replica) the broker refuses the same way at each reconnect: it stops and says why.

RabbitMQ closes a connection with a hard error (501-540) for what the client sent: a channel
past ``channel_max`` or a user's ``max-channels`` (530 NOT_ALLOWED), a frame too large. aio-pika
reconnects every 5 s and restores the same channels, so a worker that started would lose its
connection at every reconnect, for ever, saying ``consuming`` once (README "Workers"). Two
guards, both in :class:`HardCloses`:

* at the start's end, each connection of the worker must have room for the channel a reconnect
  opens besides those it restores (a consumer looks for its queue on a throwaway channel before
  it consumes again: :mod:`amqpjobs.wire.consume`): else the start fails (``BrokerError``, exit 3);
* a hard close met again within :data:`WINDOW` s of the last stops the worker as SIGTERM does
  (unacked deliveries return to their queues, redelivered) and :meth:`HardCloses.after_stop`
  raises why, with the fix (exit 3). Again means the same connection (its reconnect met it: one
  event per reconnect round, however many of the worker's connections a refusal closes at once)
  closed for the same cause (:func:`cause_of`: the reply code and words, numbers aside), at least
  :data:`ROUND` s after the last (aio-pika's immediate reconnect after a close at run time is the
  same round); two unrelated closes within the window stop nothing.

A reconnect the broker refuses at ``connection.open`` (530: a ``max-connections`` limit reached,
the vhost gone or down, the permissions taken) stops nothing: a connection limit passes when other
connections go, a vhost restarts, so the connection tries again every 5 s and says once a minute
which refusal holds and its fix (:func:`~amqpjobs.wire.cluster.explain_refusals`). A connection no
job needs (the outcome events': :meth:`HardCloses.watch_best_effort`) stops nothing either: its hard
close or refused reconnect is said at most every :data:`SAY_EVERY` s, with the cause and the fix,
and that its events are dropped meanwhile.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import time
from collections.abc import Callable, Iterable

from amqpjobs.errors import BrokerError
from amqpjobs.printable import printable
from amqpjobs.wire.channel_room import channel_room, limit_fix
from amqpjobs.wire.cluster import on_hard_error, on_refused_reconnect
from amqpjobs.wire.errors import open_refused, refused_connect_reason
from amqpjobs.wire.open_refusal import refused_words
from amqpjobs.wire.settings import BrokerSettings
from amqpjobs.wire.urls import redact_text

log = logging.getLogger("amqpjobs.worker")

#: Seconds within which a second hard close of the worker's connections stops it (aio-pika reconnects after 5 s).
WINDOW = 60.0
#: Seconds within which closes of one connection for one cause are one round: aio-pika reconnects at once when its
#: last attempt is over 5 s old (a close at run time), and that attempt's refusal comes a few ms after the first.
ROUND = 1.0
#: Channels a reconnect may open besides the ones it restores (a consumer's throwaway channel).
RECONNECT_SPARE = 1
#: Seconds between two warnings that a best-effort connection (outcome events) is closed or refused at each reconnect.
SAY_EVERY = 60.0
#: What a refused reconnect is said as, before its cause (the management API's answer: which limit, and its fix).
_REFUSED = "530 NOT_ALLOWED at connection.open"


class HardCloses:
    """The guards of one worker (see the module's docstring).

    Args:
        stop: Called when a hard close comes back (the worker's stop event's ``set``, a replica's
            ``request_stop``).
        who: What stops, in its lines (``worker``, ``scheduler replica``).
        settings: The broker's, to ask its management API why it refuses a reconnect (None: the general words).

    Attributes:
        fatal: Why the worker was stopped (None: it was not).

    """

    def __init__(self, stop: Callable[[], None], who: str = "worker", settings: BrokerSettings | None = None) -> None:
        self._stop, self._who, self._settings = stop, who, settings
        self._last: dict[tuple[int, str], float] = {}  # (connection, cause) -> when it last closed so
        self._said: dict[int, float] = {}  # best-effort connection -> when its trouble was last said
        self._asking: set[asyncio.Task[None]] = set()
        self.fatal: BrokerError | None = None

    def watch(self, connections: Iterable[object], check_room: bool = True) -> None:
        """Check each connection's room for a reconnect (``check_room``: a worker's), then watch it for hard closes.

        Raises:
            BrokerError: a connection holds as many channels as its ``channel_max`` allows, or
                within :data:`RECONNECT_SPARE` of it: it names the connection, both counts and the fix.
        """
        connections = list(connections)
        for connection in connections if check_room else ():
            room = channel_room(connection)
            if room is not None and room.short_by(RECONNECT_SPARE):
                self.fatal = BrokerError(
                    f"the broker's channel_max is {room.channel_max} (negotiated at connect) and connection "
                    f"{printable(room.name)} of this worker holds {room.open} channel(s): a reconnect opens "
                    f"{RECONNECT_SPARE} more before it consumes again, which the broker would refuse (530 NOT_ALLOWED) "
                    "at every reconnect, so the worker does not start (what it took returns to its queue or is "
                    f"finished first). Fix: {limit_fix('channel_max')}"
                )
                self.fatal.final = True  # every start meets it until an operator acts: --processes stops at once
                raise self.fatal
        for connection in connections:
            on_hard_error(connection, functools.partial(self._closed, connection=id(connection)))

    def watch_best_effort(self, connection: object, what: str) -> None:
        """Watch ``connection`` of ``what`` (``outcome events``), which no job needs: it never stops the worker.

        A hard close or a refused reconnect of it is said (WARNING) with its cause and fix, at most
        every :data:`SAY_EVERY` s while it lasts; aio-pika goes on reconnecting every 5 s.
        """
        said = functools.partial(self._best_effort, connection=id(connection), what=what, name=_name(connection))
        on_hard_error(connection, said)
        on_refused_reconnect(connection, said)

    def _best_effort(self, exc: BaseException, connection: int = 0, what: str = "", name: str = "?") -> None:
        now = time.monotonic()
        if now - self._said.get(connection, -SAY_EVERY - 1.0) < SAY_EVERY:
            return
        self._said[connection] = now
        goes_on = (f"the {self._who} goes on: jobs run as usual, their events are dropped (counted); it reconnects "
                   f"every 5s, said again in {SAY_EVERY:g}s while it lasts")  # fmt: skip
        if open_refused(exc):
            self._ask(exc, lambda why: log.warning(
                "%s are off: the broker refuses the reconnect of their connection %s (%s: %s); %s",
                what, name, _REFUSED, why, goes_on,
            ))  # fmt: skip
            return
        why = printable(redact_text(str(exc) or type(exc).__name__))
        log.warning("%s are off: the broker closed their connection %s for what it sent (%s; fix: %s); %s",
                    what, name, why, limit_fix(why), goes_on)  # fmt: skip

    def _general(self, exc: BaseException) -> str:
        settings = self._settings
        return refused_connect_reason(exc, settings.vhost, settings.username) if settings else str(exc)

    def _ask(self, exc: BaseException, say: Callable[[str], None]) -> None:
        """Ask the management API why the broker refused a connection with ``exc`` (5 s at most), then ``say`` it."""

        async def ask() -> None:
            why = await refused_words(exc, self._settings) if self._settings else self._general(exc)
            say(why)

        task = asyncio.get_running_loop().create_task(ask())
        self._asking.add(task)
        task.add_done_callback(self._asking.discard)

    def cancel(self) -> None:
        """Give up the questions to the management API still under way (the worker stops)."""
        for task in self._asking:
            task.cancel()

    def _closed(self, exc: BaseException, connection: int = 0) -> None:
        """``connection`` (an id) closed by the broker with ``exc``: stop when it met that within :data:`WINDOW` s."""
        now, why = time.monotonic(), printable(redact_text(str(exc) or type(exc).__name__))
        key = (connection, cause_of(exc))
        last = self._last.get(key, -WINDOW - 1.0)
        if now - last < ROUND:  # the reconnect aio-pika made at once: the same round, its next comes 5 s later
            log.warning("the broker refused this %s's reconnect the same way (%s): trying again in 5s", self._who, why)
            return
        self._last[key] = now
        if now - last > WINDOW:
            log.warning("the broker closed a connection of this %s for what it sent (%s): reconnecting; if that "
                        "connection meets it again within %gs it stops", self._who, why, WINDOW)  # fmt: skip
            return
        if self.fatal is None:
            self.fatal = BrokerError(
                f"the broker closed a connection of this {self._who} for what it sent ({why}), again {now - last:.0f}s "
                f"later: every reconnect meets the same refusal, so the {self._who} stopped (what it held unacked "
                f"returns to its queue, redelivered). Fix: {limit_fix(why)}; then start it again"
            )
            self.fatal.final = True  # a restart meets it at its next reconnect: --processes stops every child
            log.error("%s", self.fatal)
        self._stop()

    def after_stop(self, code: int) -> int:
        """``code``, unless a hard close stopped the worker.

        Raises:
            BrokerError: :attr:`fatal`, when set.
        """
        if self.fatal is not None:
            raise self.fatal
        return code


def cause_of(exc: BaseException) -> str:
    """What a hard close names, comparable between two closes: its class (reply code) and words, numbers as ``#``.

    ``NOT_ALLOWED ... user limit of (4)`` and ``... of (5)`` (a limit raised, still too low) are one cause;
    a 530 at a channel past ``channel_max`` and a 504 CHANNEL_ERROR are two.
    """
    return f"{type(exc).__name__}: {re.sub(r'[0-9]+', '#', str(exc))}"


def _name(connection: object) -> str:
    """The connection's name, as the management UI shows it (``app-worker``)."""
    return str(getattr(connection, "name", "?"))
