"""Where a replay sends a message whose evidence names a queue jobs do not run from (real broker).

A retry tier, or the quarantine, suspects or parked queue of a job queue: back to that job queue's
work queue. Any other queue of ours (a pause flag, a scheduler's or a breaker's queue): it stays,
named, with the fix (``--to``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from amqpjobs.jobs.replay_plan import ReplayOptions
from amqpjobs.runtime.quarantine import browse
from amqpjobs.runtime.replay import replay
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import cli, depth, raw_channel
from tests.integration.test_replay_targets import died_in, naming, quarantine_one
from tests.integration.worker_env import make_app

pytestmark = pytest.mark.broker


async def test_evidence_naming_a_tier_quarantine_suspects_or_parked_queue_goes_back_to_the_work_queue(
    broker: BrokerSettings, tmp_path: Path
):
    """What the broker would do with it (a tier dead-letters into its work queue), and what the job is for:
    never back into the quarantine (where a replay put it at the end of the queue, replayed in name only),
    nor into a tier or the parked queue."""
    await make_app(broker, tmp_path)
    await quarantine_one(broker, "from-quarantine", naming("work.quarantine", "from-quarantine"))
    await quarantine_one(broker, "from-suspects", naming("work.suspects", "from-suspects"))
    await quarantine_one(broker, "from-parked", naming("work.parked", "from-parked"))
    await quarantine_one(broker, "from-tier", died_in("work.retry.400ms", "maxlen"))
    await quarantine_one(broker, "ok", naming("work", "ok"))
    dry = await asyncio.to_thread(cli, broker, "replay", "work", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert (
        "would replay from-quarantine -> work (its evidence names work.quarantine, the quarantine queue of job "
        "queue work, which runs no jobs: back to its work queue)"
    ) in dry.stdout
    assert (
        "would replay from-tier -> work (its evidence names work.retry.400ms, retry tier 400ms of work queue work "
        "(job queue work), which runs no jobs: back to its work queue)"
    ) in dry.stdout
    report = await replay(broker, "work.quarantine", ReplayOptions(rate=1000))
    assert sorted(report.moves) == [
        ("from-parked", "work"), ("from-quarantine", "work"), ("from-suspects", "work"), ("from-tier", "work"),
        ("ok", "work"),
    ]  # fmt: skip
    assert (report.replayed, report.skipped, report.left) == (5, 0, 0)
    assert await depth(broker, "work") == 5
    for queue in ("work.quarantine", "work.parked", "work.retry.400ms"):
        assert await depth(broker, queue) == 0, queue


@pytest.mark.parametrize(
    ("named", "words"),
    [
        ("work.paused", "the pause flag of job queue work"),
        ("amqpjobs.scheduler.shop.leader", "a scheduler queue of app shop"),
        ("work.breaker.mail", "job mail's breaker queue in job queue work"),
    ],
)
async def test_evidence_naming_another_queue_of_ours_that_runs_no_jobs_stays_named(
    broker: BrokerSettings, tmp_path: Path, named: str, words: str
):
    await make_app(broker, tmp_path)
    async with raw_channel(broker) as ch:  # it exists: the old replay sent the job there
        await ch.declare_queue(named, durable=True)
    await quarantine_one(broker, "odd-1", naming(named, "odd-1"))
    await quarantine_one(broker, "ok", naming("work", "ok"))
    run = await asyncio.to_thread(cli, broker, "replay", "work", "--rate", "1000")
    assert run.exit_code == 1, run.output
    assert "replayed 1, skipped 1, left 1 in work.quarantine (" in run.stdout
    assert (
        f"not replayed job 'mail' id 'odd-1': its evidence names {named}, {words}, which runs no jobs: replay it "
        "with --to QUEUE; it stays in work.quarantine"
    ) in run.stderr
    assert "; 1 skipped: the queue their evidence names runs no jobs, still in work.quarantine: replay them with " \
        "amqpjobs replay --to QUEUE" in run.stdout  # fmt: skip
    assert await depth(broker, named) == 0
    _, left = await browse(broker, "work.quarantine")
    assert [m.delivery.message_id for m in left] == ["odd-1"]
