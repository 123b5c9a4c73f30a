"""Reading the tick stores: a schedule's latest :class:`~amqpjobs.jobs.tick_record.TickRecord` (any replica or tool)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from amqpjobs.jobs import cron, tick_record
from amqpjobs.wire import ticks
from amqpjobs.wire.abc import TickWire
from amqpjobs.wire.connection import connect
from amqpjobs.wire.settings import BrokerSettings

if TYPE_CHECKING:
    from amqpjobs.runtime.scheduled_app import ScheduledApp

log = logging.getLogger("amqpjobs.scheduler")


async def read_tick_record(connection: Any, queue: str, wire: TickWire = ticks) -> tick_record.TickRecord | None:
    """Browse a tick store: the latest record in ``queue``, or None. The messages stay.

    Any replica (or a tool) may read it; reading holds the message unacked for a moment
    and then returns it by closing the channel.

    Raises:
        BrokerError: the queue does not exist or the broker failed.

    """
    records: list[tick_record.TickRecord] = []
    for body in await wire.browse_bodies(connection, queue, 16, f"reading tick store {queue!r} failed"):
        try:
            records.append(tick_record.TickRecord.from_bytes(body))
        except ValueError as exc:
            log.warning("tick store %s holds a message that is not a tick record: %s", queue, exc)
    return tick_record.latest_record(records)


async def tick_records(app: ScheduledApp, settings: BrokerSettings) -> dict[str, tick_record.TickRecord | None]:
    """The stored state of each of ``app``'s schedules (None: never run), by schedule name.

    Raises:
        BrokerUnavailableError: the broker can't be reached.
        BrokerError: a tick store is missing (the scheduler never ran) or the broker failed.

    """
    connection = await connect(settings, name=f"{app.name}-tick-reader")
    try:
        return {s.name: await read_tick_record(connection, cron.tick_queue(app.name, s.name)) for s in app.schedules()}
    finally:
        await connection.close()
