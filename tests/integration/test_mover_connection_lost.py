"""A replay whose connection drops and can't come back at once (a broker restart) says how many it moved.

README "Quarantine and replay": a replay the broker cuts short exits 3 "saying how many moved"
(``replay from 'Q' interrupted after N moved (the one in flight may be in both places ...)``). A
dropped connection takes the mover lock with it, and the run stops before its next move; while
the broker was restarting it said only ``lost the lock on quarantine queue ...; stopped``: how
many had moved, and that one may now be in both places, the operator had to find out.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from amqpjobs.errors import BrokerError
from amqpjobs.jobs.replay_plan import ReplayOptions, ReplayReport, replay_window
from amqpjobs.runtime.parking import TakeReport, park
from amqpjobs.runtime.replay import replay
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import depth
from tests.integration.test_quarantine import fill_quarantine
from tests.integration.test_reconnect import cut_off
from tests.integration.worker_env import make_app

pytestmark = pytest.mark.broker


@pytest.mark.parametrize(
    ("count", "rate"),
    [
        pytest.param(100, 5, id="between-moves"),  # cut off while it waits its turn: the lock is gone
        pytest.param(8000, 1000, id="under-publishes"),  # cut off with publishes awaiting their confirms
    ],
)
async def test_a_replay_cut_off_from_the_broker_says_how_many_it_moved(
    broker: BrokerSettings, tmp_path: Path, count: int, rate: float
):
    await make_app(broker, tmp_path)
    await fill_quarantine(broker, count)
    report = ReplayReport(queue="work.quarantine")
    # 8 s and more in all, so that the management API lists the connection (its stats lag by some 5 s) before its end
    run = asyncio.create_task(replay(broker, "work.quarantine", ReplayOptions(rate=rate), report=report))
    while await depth(broker, "work") < 2:  # moving
        await asyncio.sleep(0.05)
    async with cut_off(broker, "amqpjobs-quarantine"):  # its reconnects refused meanwhile, as by a node restarting
        with pytest.raises(BrokerError) as caught:
            await asyncio.wait_for(run, 30)
    said = str(caught.value)
    assert said.startswith(f"replay from 'work.quarantine' interrupted after {report.replayed} moved ("), said
    assert "in flight may be in both places: " in said
    assert 1 <= report.replayed < count
    in_work, left = await depth(broker, "work"), await depth(broker, "work.quarantine")
    assert report.replayed <= in_work <= report.replayed + replay_window(rate)
    assert report.replayed + left <= in_work + left <= count + replay_window(rate)  # nothing lost


async def test_a_park_cut_off_from_the_broker_says_how_many_it_parked(broker: BrokerSettings, tmp_path: Path):
    await make_app(broker, tmp_path)
    await fill_quarantine(broker, 5000)  # parked one at a time: long enough for the management API to list it
    report = TakeReport("work.quarantine")
    run = asyncio.create_task(park(broker, "work.quarantine", report=report))
    while await depth(broker, "work.parked") < 2:  # moving
        await asyncio.sleep(0.05)
    async with cut_off(broker, "amqpjobs-quarantine"):  # its reconnects refused meanwhile, as by a node restarting
        with pytest.raises(BrokerError) as caught:
            await asyncio.wait_for(run, 60)
    said = str(caught.value)
    assert said.startswith(f"park of 'work.quarantine' interrupted after {report.taken} parked ("), said
    assert 1 <= report.taken < 5000
    parked, left = await depth(broker, "work.parked"), await depth(broker, "work.quarantine")
    assert parked + left in (5000, 5001)  # nothing lost; the one in flight may be in both
