"""A leader's wall clock that steps, against the real broker (README "Schedules" → "Clocks").

The scheduler runs in-process on the real wire and a real connection, with a clock that is
the machine's plus an offset the test moves (:meth:`Scheduler.start_on`). Jobs are read
back from the work queue (no worker).
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from amqpjobs import App, JobContext, Scheduler, SchedulerOptions, TickEvent
from amqpjobs.topology.loader import load_topology
from amqpjobs.wire import ticks
from amqpjobs.wire.connection import connect
from amqpjobs.wire.publish import ConfirmedPublisher
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import wait_until
from tests.integration.test_scheduler import covered, drain
from tests.integration.worker_env import FAST_TOPOLOGY, make_app

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]

SECOND = timedelta(seconds=1)


class SteppedClock:
    """The machine's clock plus ``offset`` (a wall clock that NTP or an operator stepped)."""

    def __init__(self) -> None:
        self.offset = timedelta(0)

    def __call__(self) -> datetime:
        return datetime.now(UTC) + self.offset


def sec_app(tmp_path: Path) -> App:
    path = tmp_path / "app.toml"
    path.write_text(FAST_TOPOLOGY)
    app = App("clocks", topology=load_topology(path).topology)

    @app.cron("* * * * * *", name="sec")
    @app.job("tick", queue="work")
    async def tick(payload: dict[str, Any], ctx: JobContext) -> None: ...

    return app


async def started(app: App, broker: BrokerSettings, clock: SteppedClock, events: list[TickEvent],
                  options: SchedulerOptions | None = None) -> Scheduler:  # fmt: skip
    scheduler = Scheduler(app, broker, options, on_event=events.append)
    connection = await connect(broker, name="clock-test-scheduler")
    await scheduler.start_on(ticks, connection, ConfirmedPublisher(connection), clock)
    return scheduler


async def test_a_clock_stepped_forward_then_back_does_not_stop_the_schedule(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.INFO, logger="amqpjobs.scheduler")
    await make_app(broker, tmp_path)
    app = sec_app(tmp_path)
    clock, events = SteppedClock(), list[TickEvent]()
    scheduler = await started(app, broker, clock, events)
    try:
        await wait_until(lambda: any(e.kind == "fired" for e in events), 20, "a first tick")
        clock.offset = timedelta(hours=1)  # stepped forward: the hour's ticks are missed (one catch-up job)
        await wait_until(lambda: any(e.kind == "catch-up" for e in events), 10, "the catch-up after the step")
        await asyncio.sleep(1.5)
        clock.offset = timedelta(0)  # stepped back: the clock is right again
        back = datetime.now(UTC)
        await wait_until(lambda: any(e.kind == "fired" and e.tick < back + 10 * SECOND for e in events
                                     if e.tick > back), 10, "a tick fired on the clock stepped back")  # fmt: skip
        await asyncio.sleep(2)
    finally:
        await scheduler.shutdown()
    after = [e.tick for e in events if e.kind == "fired" and back < e.tick < back + timedelta(minutes=30)]
    # every second again, without a gap, from the moment the clock was stepped back
    assert after == [after[0] + i * SECOND for i in range(len(after))], after
    assert (after[0] - back).total_seconds() < 2, (back, after)
    assert "ahead of this replica's clock" in caplog.text
    fired = await drain(broker)
    assert fired


async def test_a_new_leader_whose_clock_is_far_behind_the_cursor_starts_from_its_own_now(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """A leader whose clock ran an hour ahead (and died) must not stop the schedule for an hour."""
    caplog.set_level(logging.INFO, logger="amqpjobs.scheduler")
    await make_app(broker, tmp_path)
    app = sec_app(tmp_path)
    ahead, events = SteppedClock(), list[TickEvent]()
    ahead.offset = timedelta(hours=1)
    first = await started(app, broker, ahead, events)
    try:
        await wait_until(lambda: any(e.kind == "fired" for e in events), 20, "the first leader's tick")
    finally:
        await first.shutdown()
    await drain(broker)
    later: list[TickEvent] = []
    second = await started(app, broker, SteppedClock(), later)
    try:
        await wait_until(lambda: any(e.kind == "fired" for e in later), 10, "the new leader's first tick")
    finally:
        await second.shutdown()
    assert "ahead of this replica's clock" in caplog.text


@pytest.mark.parametrize("skew", [2, 30, -30])
async def test_two_leaders_with_skewed_clocks_fire_each_tick_once(broker: BrokerSettings, tmp_path: Path, skew: int):
    """Failover from a leader whose clock runs ``skew`` s ahead (within the tolerance) or behind (the new leader
    catches the gap up in one job, by the ``missed`` policy): none twice, none lost."""
    await make_app(broker, tmp_path)
    app = sec_app(tmp_path)
    ahead, events = SteppedClock(), list[TickEvent]()
    ahead.offset = timedelta(seconds=skew)
    first = await started(app, broker, ahead, events)
    try:
        await wait_until(lambda: sum(e.kind == "fired" for e in events) >= 3, 20, "the first leader's ticks")
    finally:
        await first.shutdown()
    later: list[TickEvent] = []
    second = await started(app, broker, SteppedClock(), later)
    try:
        await wait_until(lambda: sum(e.kind == "fired" for e in later) >= 2, abs(skew) + 15, "the new leader's ticks")
    finally:
        await second.shutdown()
    fired = await drain(broker)
    assert len({f.job_id for f in fired}) == len(fired), "a tick was enqueued twice"
    ticks_covered = covered(fired)
    assert len(set(ticks_covered)) == len(ticks_covered), "a tick was covered twice"
    first_tick = ticks_covered[0]
    assert ticks_covered == [first_tick + i * SECOND for i in range(len(ticks_covered))], "a tick was lost"
