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
from amqpjobs.jobs.replay_plan import ReplayOptions, ReplayReport
from amqpjobs.runtime.replay import replay
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import depth
from tests.integration.test_quarantine import fill_quarantine
from tests.integration.test_reconnect import cut_off
from tests.integration.worker_env import make_app

pytestmark = pytest.mark.broker


async def test_a_replay_cut_off_from_the_broker_says_how_many_it_moved(broker: BrokerSettings, tmp_path: Path):
    await make_app(broker, tmp_path)
    await fill_quarantine(broker, 100)
    report = ReplayReport(queue="work.quarantine")
    # 5/s: 20 s in all, so that the management API lists the connection (its stats lag by some 5 s) long before
    run = asyncio.create_task(replay(broker, "work.quarantine", ReplayOptions(rate=5), report=report))
    while await depth(broker, "work") < 2:  # moving
        await asyncio.sleep(0.05)
    async with cut_off(broker, "amqpjobs-quarantine"):  # its reconnects refused meanwhile, as by a node restarting
        with pytest.raises(BrokerError) as caught:
            await asyncio.wait_for(run, 30)
    said = str(caught.value)
    assert said.startswith(f"replay from 'work.quarantine' interrupted after {report.replayed} moved ("), said
    assert "(the one in flight may be in both places: a duplicate, never a loss)" in said
    assert 1 <= report.replayed < 100
    in_work, left = await depth(broker, "work"), await depth(broker, "work.quarantine")
    assert in_work == report.replayed
    assert in_work + left in (100, 101)  # nothing lost; the one in flight may be in both
