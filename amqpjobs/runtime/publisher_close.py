"""Closing an app's publishing connection, bounded while a resource alarm holds its publishes (README "Enqueueing")."""

from __future__ import annotations

from amqpjobs.wire.abc import Connection, Publisher
from amqpjobs.wire.held_publishes import dropped_at_close
from amqpjobs.wire.publish import ConfirmedPublisher
from amqpjobs.wire.reset import reset


async def close_publishing(publisher: Publisher | None, connection: Connection | None, held_wait: float) -> None:
    """Close ``publisher``, then ``connection``; while an alarm blocks it, not for more than ``held_wait`` seconds.

    A blocked connection is read by nothing on the broker, its close no more than its publishes (before: an
    ``app.close()`` during an alarm took 62 s, silent). So the close waits up to ``held_wait`` for the alarm
    to clear, then resets the connection: the publishes held unread are dropped, never stored behind the
    caller's back, and one WARNING names them (:func:`~amqpjobs.wire.held_publishes.dropped_at_close`).
    Raises nothing of the close of a connection the broker held.
    """
    held = None
    if isinstance(publisher, ConfirmedPublisher):
        await publisher.close(held_wait)
        held = publisher.held
    elif publisher is not None:
        await publisher.close()
    if held is not None and connection is not None:
        dropped_at_close("the app", held, await reset(connection))
    elif connection is not None:
        await connection.close()
