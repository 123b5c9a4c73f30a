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
"""

from __future__ import annotations

import functools
import logging
import re
import time
from collections.abc import Callable, Iterable

from amqpjobs.errors import BrokerError
from amqpjobs.printable import printable
from amqpjobs.wire.channel_room import channel_room, limit_fix
from amqpjobs.wire.cluster import on_hard_error
from amqpjobs.wire.urls import redact_text

log = logging.getLogger("amqpjobs.worker")

#: Seconds within which a second hard close of the worker's connections stops it (aio-pika reconnects after 5 s).
WINDOW = 60.0
#: Seconds within which closes of one connection for one cause are one round: aio-pika reconnects at once when its
#: last attempt is over 5 s old (a close at run time), and that attempt's refusal comes a few ms after the first.
ROUND = 1.0
#: Channels a reconnect may open besides the ones it restores (a consumer's throwaway channel).
RECONNECT_SPARE = 1


class HardCloses:
    """The guards of one worker (see the module's docstring).

    Args:
        stop: Called when a hard close comes back (the worker's stop event's ``set``, a replica's
            ``request_stop``).
        who: What stops, in its lines (``worker``, ``scheduler replica``).

    Attributes:
        fatal: Why the worker was stopped (None: it was not).

    """

    def __init__(self, stop: Callable[[], None], who: str = "worker") -> None:
        self._stop, self._who = stop, who
        self._last: dict[tuple[int, str], float] = {}  # (connection, cause) -> when it last closed so
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
