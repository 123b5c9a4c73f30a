"""Outcome events as an async stream, for a page that refreshes when jobs end (``amqpjobs console``).

Subscribes to the outcome events exchange (:func:`amqpjobs.wire.events.subscribe_outcomes`,
an exclusive auto-delete queue of its own) for as long as the iteration runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from amqpjobs.jobs.events import OutcomeEvent, decode_event
from amqpjobs.runtime.quarantine import session
from amqpjobs.wire.events import subscribe_outcomes
from amqpjobs.wire.settings import BrokerSettings

#: Events kept for a slow reader; past it the oldest are dropped (a page only needs to know "something ended").
BACKLOG = 1000


async def outcome_feed(settings: BrokerSettings) -> AsyncIterator[OutcomeEvent]:
    """Each outcome event published in the vhost from now on, until the caller stops iterating.

    Raises:
        NotFoundError: the events exchange does not exist (apply the topology).
        BrokerUnavailableError: the broker can't be reached.

    """
    events: asyncio.Queue[OutcomeEvent] = asyncio.Queue(BACKLOG)

    def on_body(body: bytes) -> None:
        event = decode_event(body)
        if event is None:
            return
        if events.full():
            events.get_nowait()
        events.put_nowait(event)

    async with session(settings) as connection:
        watch = await subscribe_outcomes(connection, on_body)
        try:
            while True:
                yield await events.get()
        finally:
            if not watch.is_closed:
                await watch.close()
