"""The "left N" a replay, park or filtered purge reports counts every message it held and left (real broker).

Each browses the quarantine without acking, then closes its channel: the broker requeues what it
held (a quorum queue after the close is answered, a classic one when its queue process sees the
channel go). Counted at once on another connection, some were still on their way back: local CI
on 4.0 printed ``left 0 in work.quarantine`` for one job skipped and still there.
"""

from __future__ import annotations

import json
from pathlib import Path

import aio_pika
import pytest

from amqpjobs.jobs.quarantine import Selection
from amqpjobs.jobs.replay_plan import ReplayOptions
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.runtime.parking import park, purge_matching
from amqpjobs.runtime.replay import replay
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import depth, raw_channel
from tests.integration.test_replay_targets import naming

pytestmark = pytest.mark.broker

HELD = 200  # returned by the close of the channel that held them

TOPOLOGY = """
[[exchange]]
name = "jobs"

[[job_queue]]
name = "work"
exchange = "jobs"
type = "{kind}"
retry_tiers = []
"""


@pytest.fixture(params=["classic", "quorum"])
async def work(request: pytest.FixtureRequest, broker: BrokerSettings, tmp_path: Path) -> None:
    """Job queue work (and so its quarantine) of each type: a quorum queue returns what a channel held by Raft."""
    path = tmp_path / "topology.toml"
    path.write_text(TOPOLOGY.format(kind=request.param))
    await apply_topology(path, broker)


async def fill(broker: BrokerSettings, held_queue: str) -> None:
    """HELD messages of job 'mail' naming ``held_queue``, then job id ok naming work, in work.quarantine."""
    async with raw_channel(broker) as ch:
        ex = await ch.get_exchange("work.quarantine")
        for i in range(HELD):
            await ex.publish(aio_pika.Message(json.dumps({"id": i}).encode(), message_id=f"h-{i}", type="mail",
                                              headers=naming(held_queue, f"h-{i}")),
                             routing_key="work")  # fmt: skip
        await ex.publish(aio_pika.Message(b"{}", message_id="ok", type="mail", headers=naming("work", "ok")),
                         routing_key="work")  # fmt: skip
    assert await depth(broker, "work.quarantine") == HELD + 1


async def test_a_replay_counts_the_skipped_messages_it_held_as_left(broker: BrokerSettings, work: None) -> None:
    async with raw_channel(broker) as ch:
        await ch.declare_queue("work.paused", durable=True)
    await fill(broker, "work.paused")  # skipped: their evidence names a queue that runs no jobs
    report = await replay(broker, "work.quarantine", ReplayOptions(rate=10_000))
    assert (report.replayed, report.skipped, report.left) == (1, HELD, HELD)
    assert await depth(broker, "work.quarantine") == HELD


async def test_a_park_counts_the_messages_it_kept_as_left(broker: BrokerSettings, work: None) -> None:
    await fill(broker, "work")  # kept: not job id ok
    report = await park(broker, "work.quarantine", Selection(job_ids=frozenset({"ok"})))
    assert (report.taken, report.kept, report.left) == (1, HELD, HELD)
    assert await depth(broker, "work.parked") == 1


async def test_a_filtered_purge_counts_the_messages_it_kept_as_left(broker: BrokerSettings, work: None) -> None:
    await fill(broker, "work")
    report = await purge_matching(broker, "work.quarantine", Selection(job_ids=frozenset({"ok"})))
    assert (report.taken, report.kept, report.left) == (1, HELD, HELD)
