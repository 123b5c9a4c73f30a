"""A robust channel aio-pika left closed on a live connection, opened again (a work-queue consumer's retry).

aio-pika reopens a robust channel after a reconnect; a connection lost again while it did so (a
message the broker cannot deliver closes it at each consume: 541 INTERNAL_ERROR) can leave it
closed for good, and nothing would consume on it again.
"""

from __future__ import annotations

import logging

from aio_pika.abc import AbstractChannel

from amqpjobs.wire.errors import CHANNEL_OPEN_ERRORS

log = logging.getLogger("amqpjobs.wire")


async def reopen_if_left_closed(channel: AbstractChannel | None, seen: list[int], what: str) -> None:
    """Open ``channel`` again when it stays closed (call while its connection is up, not under a consume lock).

    The same closed channel seen on two calls in a row (``seen``: its id, kept by the caller across
    calls a second apart: time for aio-pika's own restore) is reopened here, and said (``what``:
    e.g. ``"the channel consuming work"``); the channel's reopen callbacks then consume.

    Raises:
        What reopening raises (the connection is gone again): the caller tries again.
    """
    if channel is None or not channel.is_closed:
        seen.clear()
        return
    try:
        underlay = id(await channel.get_underlay_channel())
    except CHANNEL_OPEN_ERRORS:  # never opened since: aio-pika's restore is under way
        underlay = 0
    if seen != [underlay]:
        seen[:] = [underlay]
        return
    seen.clear()
    log.warning("%s was left closed after a reconnect: opening it again", what)
    await channel.reopen()
