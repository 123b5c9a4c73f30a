"""The scheduler's leadership edges against the real broker, made deterministic by hooks in the test.

A leader that loses its token while its tick transaction is open commits nothing; a new
leader whose first read of a tick store finds the record held by another channel reads it
again instead of taking the schedule for new.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from amqpjobs import JobContext, Scheduler, TickEvent, tick_id
from amqpjobs.jobs import cron, tick_record
from amqpjobs.jobs.envelope import OutgoingMessage
from amqpjobs.runtime.scheduler import tick_records
from amqpjobs.wire import ticks
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import raw_channel, wait_until
from tests.integration.test_scheduler import covered, drain, seconds_from, stopped_ago
from tests.integration.worker_env import make_app

pytestmark = pytest.mark.broker

SECOND = timedelta(seconds=1)


class LosesTokenMidTick:
    """The broker wire of one replica, but its first tick transaction holding a job starts by closing its token's
    channel: the token is lost while the tick is pending (its jobs and record built, not committed yet)."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.pending: list[str] = []  # the ticks of the transaction it lost the token in

    def __getattr__(self, name: str) -> Any:
        return getattr(ticks, name)

    async def publish_in_transaction(
        self, connection: Any, messages: Iterable[tuple[str, str, OutgoingMessage, bool]], *args: Any, **kw: Any
    ) -> list[str] | None:
        items = list(messages)
        jobs = [m for _, _, m, mandatory in items if mandatory]
        if jobs and not self.pending:
            self.pending = [str(m.headers[cron.TICK_HEADER]) for m in jobs]
            await ticks.close_quietly(self.scheduler._election)  # the broker gives the token to the other replica
        return await ticks.publish_in_transaction(connection, items, *args, **kw)


async def test_a_leader_losing_its_token_mid_tick_commits_nothing_and_the_new_leader_fires_it_once(
    broker: BrokerSettings, tmp_path: Path
):
    app = await make_app(broker, tmp_path)

    @app.cron("* * * * * *", name="every-second", payload={"n": 1})
    @app.job("tick", queue="work")
    async def tick(payload: dict[str, Any], ctx: JobContext) -> None: ...

    events: dict[str, list[TickEvent]] = {"old": [], "new": []}
    old = Scheduler(app, broker, on_event=events["old"].append)
    new = Scheduler(app, broker, on_event=events["new"].append)
    old.replica, new.replica = "old:1", "new:2"
    trap = LosesTokenMidTick(old)
    old._wire = trap
    try:
        await old.start()
        await wait_until(lambda: old.is_leader, 10, "the first replica to lead")
        await new.start()  # joins the election as the next consumer
        await wait_until(lambda: len(events["new"]) >= 2, 10, "two ticks of the new leader")
    finally:
        await new.shutdown()
        await old.shutdown()
    fired = await drain(broker)
    assert len(trap.pending) == 1
    lost = cron.parse_tick(trap.pending[0])
    assert [f for f in fired if f.fired_by == "old:1"] == []  # its first tick was the one it lost the token in
    assert [e.tick for e in events["old"]] == []
    # the new leader resumed from the stored cursor: the pending tick fired once, by it (on time or caught up)
    ticks_fired = covered(fired)
    assert ticks_fired == seconds_from(ticks_fired[0], len(ticks_fired))  # none twice, none skipped
    assert ticks_fired[0] <= lost
    assert ticks_fired.count(lost) == 1
    assert {f.fired_by for f in fired} == {"new:2"}
    stored = (await tick_records(app, broker))["every-second"]
    assert stored is not None
    assert stored.written_by == "new:2"


async def test_a_new_leader_reads_a_tick_store_held_by_a_browser_again_and_keeps_its_cursor(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    app = await make_app(broker, tmp_path)

    @app.cron("* * * * * *", name="every-second", missed="catch-up-once", payload={"n": 1})
    @app.job("tick", queue="work")
    async def tick(payload: dict[str, Any], ctx: JobContext) -> None: ...

    last = await stopped_ago(app, broker, 3)  # a leader fired its last tick 3 s ago and stopped
    queue = cron.tick_queue(app.name, "every-second")
    events: list[TickEvent] = []
    scheduler = Scheduler(app, broker, on_event=events.append)
    reads: list[tick_record.TickRecord | None] = []
    async with raw_channel(broker) as browser:
        held = await (await browser.get_queue(queue, ensure=False)).get(no_ack=False)  # unacked: the store is empty
        assert tick_record.TickRecord.from_bytes(held.body).cursor == last
        read = scheduler._read_record

        async def first_read_while_held(schedule: cron.Schedule) -> tick_record.TickRecord | None:
            record = await read(schedule)
            reads.append(record)
            if len(reads) == 1:
                await held.nack(requeue=True)  # the browser is done: the record is back before the second read
            return record

        scheduler._read_record = first_read_while_held  # type: ignore[method-assign]
        caplog.set_level(logging.INFO, logger="amqpjobs.scheduler")
        await scheduler.start()
        try:
            await wait_until(lambda: len([e for e in events if e.kind == "fired"]) >= 2, 10, "two ticks")
        finally:
            await scheduler.shutdown()
    fired = await drain(broker)
    ticks_fired = covered(fired)
    assert ticks_fired[0] == last + SECOND  # nothing after the stored cursor skipped
    assert ticks_fired == seconds_from(last + SECOND, len(ticks_fired))  # none twice
    assert [f.kind for f in fired][:2] == ["catch-up", "fired"]
    assert fired[0].job_id == tick_id("every-second", fired[0].tick)
    assert datetime.now(UTC) - fired[-1].tick < 5 * SECOND
    assert [r.cursor if r else None for r in reads] == [None, last]  # found empty, read again: the cursor is kept
    assert not any("is new" in r.getMessage() for r in caplog.records)
