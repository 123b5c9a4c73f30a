"""A replay or park cut off because its quarantine queue vanished: every confirmed copy is counted, named, recorded."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from amqpjobs import SqliteResults
from amqpjobs.errors import BrokerError
from amqpjobs.jobs.replay_plan import ReplayOptions, ReplayReport
from amqpjobs.runtime.parking import TakeReport, park
from amqpjobs.runtime.replay import replay
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import cli, drain, raw_channel
from tests.integration.test_quarantine import fill_quarantine
from tests.integration.worker_env import make_app

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]


async def delete_queue_after(broker: BrokerSettings, queue: str, seconds: float) -> None:
    """Delete ``queue`` ``seconds`` from now, as a user of the management UI would mid-run."""
    await asyncio.sleep(seconds)
    async with raw_channel(broker) as channel:
        await channel.queue_delete(queue)


async def delete_queue_once(broker: BrokerSettings, queue: str, watched: str, count: int) -> None:
    """Delete ``queue`` once ``watched`` holds ``count`` messages (a mover is under way)."""
    async with raw_channel(broker) as channel:
        while ((await channel.declare_queue(watched, passive=True)).declaration_result.message_count or 0) < count:
            await asyncio.sleep(0.01)
        await channel.queue_delete(queue)


async def ids_in(broker: BrokerSettings, queue: str) -> list[str]:
    return sorted(m.message_id or "" for m in await drain(broker, queue))


@pytest.mark.timeout(60)
async def test_a_replay_cut_off_by_a_deleted_quarantine_queue_counts_names_and_records_every_copy(
    broker: BrokerSettings, tmp_path: Path
):
    await make_app(broker, tmp_path)
    await fill_quarantine(broker, 10)
    results = SqliteResults(tmp_path / "results.db")
    report = ReplayReport(queue="work.quarantine")
    deleting = asyncio.create_task(delete_queue_after(broker, "work.quarantine", 2.5))
    with pytest.raises(BrokerError) as cut:
        await replay(broker, "work.quarantine", ReplayOptions(rate=2), report=report, results=results)
    await deleting
    arrived = await ids_in(broker, "work")
    assert len(arrived) >= 5  # at 2 per second for 2.5 s: q-0 .. q-4 or q-5
    assert sorted(job_id for job_id, _ in report.moves) == arrived
    assert report.replayed == len(arrived)
    message = str(cut.value)
    assert message.startswith(
        f"replay from 'work.quarantine' interrupted after {len(arrived)} moved "
        "(the one in flight may be in both places: a duplicate, never a loss): NOT_FOUND"
    )
    for job_id in arrived:
        assert [r.state for r in await results.history(job_id)] == ["replayed"], job_id
    await results.close()


@pytest.mark.timeout(60)
async def test_a_park_cut_off_by_a_deleted_quarantine_queue_counts_names_and_records_every_copy(
    broker: BrokerSettings, tmp_path: Path
):
    await make_app(broker, tmp_path)
    await fill_quarantine(broker, 1000)
    results = SqliteResults(tmp_path / "results.db")
    report = TakeReport("work.quarantine")
    deleting = asyncio.create_task(delete_queue_once(broker, "work.quarantine", "work.parked", 20))
    with pytest.raises(BrokerError) as cut:
        await park(broker, "work.quarantine", report=report, results=results)
    await deleting
    parked = await ids_in(broker, "work.parked")
    assert 20 <= len(parked) < 1000
    assert sorted(report.job_ids) == parked
    assert report.taken == len(parked)
    assert f"interrupted after {len(parked)} parked (the one in flight may be in both places" in str(cut.value)
    for job_id in parked:
        assert [r.state for r in await results.history(job_id)] == ["parked"], job_id
    await results.close()


@pytest.mark.timeout(60)
async def test_the_cli_says_how_many_a_cut_off_replay_moved(broker: BrokerSettings, tmp_path: Path):
    await make_app(broker, tmp_path)
    await fill_quarantine(broker, 10)
    deleting = asyncio.create_task(delete_queue_after(broker, "work.quarantine", 2.5))
    out = await asyncio.to_thread(cli, broker, "replay", "work.quarantine", "--rate", "2")
    await deleting
    arrived = await ids_in(broker, "work")
    assert out.exit_code == 3, out.output
    assert (
        f"broker error: replay from 'work.quarantine' interrupted after {len(arrived)} moved (the one in flight may "
        "be in both places: a duplicate, never a loss): NOT_FOUND"
    ) in out.stderr, out.stderr
