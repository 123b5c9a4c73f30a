"""A replay whose target queue is missing (real broker): one message never blocks the others, nothing is lost.

A message whose target queue does not exist stays in quarantine as it was, named in the report
with the fix, and the rest are replayed (exit 1: partial).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aio_pika
import pytest

from amqpjobs.jobs import quarantine as q
from amqpjobs.jobs.replay_plan import ReplayOptions, ReplayReport
from amqpjobs.runtime.quarantine import browse
from amqpjobs.runtime.replay import replay
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings
from tests.conftest import BrokerRoot
from tests.integration.helpers import cli, depth, raw_channel
from tests.integration.test_quarantine import evidence_for
from tests.integration.worker_env import make_app

pytestmark = pytest.mark.broker


async def quarantine_one(broker: BrokerSettings, job_id: str, headers: dict[str, Any]) -> None:
    """Publish one message straight into work.quarantine (through its fanout exchange)."""
    async with raw_channel(broker) as ch:
        ex = await ch.get_exchange("work.quarantine")
        await ex.publish(aio_pika.Message(json.dumps({"id": job_id}).encode(), message_id=job_id, type="mail",
                                          headers=headers),
                         routing_key="work")  # fmt: skip


def naming(queue: str, job_id: str) -> dict[str, Any]:
    """Our evidence of job ``job_id``, failed on ``queue``."""
    return {**evidence_for(0), "amqpjobs-original-queue": queue, "amqpjobs-job-id": job_id}


def died_in(queue: str, reason: str = "rejected") -> dict[str, Any]:
    """A broker-side dead-letter from ``queue`` (``x-death`` only)."""
    return {"x-death": [{"queue": queue, "reason": reason, "count": 1, "exchange": "", "routing-keys": [queue]}]}


async def fill_with_a_missing_target(broker: BrokerSettings) -> None:
    """q-0, q-1 for work; g-1 for 'ghost' (in the app's topology, never applied); q-2, q-3 for work after it."""
    for i in range(2):
        await quarantine_one(broker, f"q-{i}", naming("work", f"q-{i}"))
    await quarantine_one(broker, "g-1", naming("ghost", "g-1"))
    for i in range(2, 4):
        await quarantine_one(broker, f"q-{i}", naming("work", f"q-{i}"))


GHOST_LINE = (
    "job 'mail' id 'g-1': its target queue 'ghost' does not exist (apply the topology: amqpjobs topology apply, "
    "or replay it with --to QUEUE)"
)
GHOST_SUMMARY = (
    "; 1 skipped: target queue 'ghost' does not exist, still in work.quarantine: apply the topology (amqpjobs "
    "topology apply) or replay them with amqpjobs replay --to QUEUE"
)


async def test_a_message_whose_target_queue_does_not_exist_stays_and_the_others_are_replayed(
    broker: BrokerSettings, tmp_path: Path
):
    await make_app(broker, tmp_path)
    await fill_with_a_missing_target(broker)
    _, before = await browse(broker, "work.quarantine")
    report = await replay(broker, "work.quarantine", ReplayOptions(rate=1000))
    assert (report.replayed, report.skipped, report.left) == (4, 1, 1)
    assert sorted(job_id for job_id, _ in report.moves) == ["q-0", "q-1", "q-2", "q-3"]
    assert report.not_moved == [GHOST_LINE]
    assert report.missing == {"ghost": 1}
    assert report.summary(canary=False).endswith(GHOST_SUMMARY)
    assert await depth(broker, "work") == 4
    _, left = await browse(broker, "work.quarantine")  # untouched: the same message, headers and body
    ghost = next(m for m in before if m.delivery.message_id == "g-1")
    assert [m.delivery.message_id for m in left] == ["g-1"]
    assert (left[0].delivery.headers, left[0].delivery.body) == (ghost.delivery.headers, ghost.delivery.body)


async def test_cli_replay_names_the_message_whose_target_is_missing_and_exits_1_dry_run_alike(
    broker: BrokerSettings, tmp_path: Path
):
    await make_app(broker, tmp_path)
    await fill_with_a_missing_target(broker)
    dry = await asyncio.to_thread(cli, broker, "replay", "work", "--dry-run")
    assert dry.exit_code == 1, dry.output
    assert "dry run: 4 would be replayed, 1 skipped, nothing moved; 5 in work.quarantine" + GHOST_SUMMARY in dry.stdout
    assert f"would not replay {GHOST_LINE}; it would stay in work.quarantine\n" in dry.stderr
    run = await asyncio.to_thread(cli, broker, "replay", "work", "--rate", "1000")
    assert run.exit_code == 1, run.output
    assert "replayed 4, skipped 1, left 1 in work.quarantine (" in run.stdout
    assert GHOST_SUMMARY in run.stdout
    assert f"not replayed {GHOST_LINE}; it stays in work.quarantine\n" in run.stderr
    assert await depth(broker, "work") == 4
    moved = await asyncio.to_thread(cli, broker, "replay", "work", "--to", "work")  # the fix the line names
    assert moved.exit_code == 0, moved.output
    assert "replayed 1, skipped 0, left 0 in work.quarantine" in moved.stdout


async def test_a_target_queue_deleted_mid_run_leaves_its_messages_and_the_run_goes_on(
    broker: BrokerSettings, tmp_path: Path
):
    """Found at the first move (it existed then), deleted before the second: a publish returned unroutable."""
    await make_app(broker, tmp_path)
    async with raw_channel(broker) as ch:
        await ch.declare_queue("other", durable=True)
    for i, queue in enumerate(("other", "work", "other", "work", "other")):
        await quarantine_one(broker, f"m-{i}", naming(queue, f"m-{i}"))
    deleted: list[asyncio.Task[Any]] = []
    async with raw_channel(broker) as ch:  # open before: the delete is one round trip (a connect took 0.4 s+ in CI)

        def progress(report: ReplayReport) -> None:
            if report.replayed == 1 and not deleted:
                deleted.append(asyncio.ensure_future(ch.queue_delete("other")))

        # 0.5 s between moves: the delete has 1 s before m-2's publish (was 0.4 s at rate 5: a race under load)
        report = await replay(broker, "work.quarantine", ReplayOptions(rate=2), progress)
        await asyncio.gather(*deleted)
    assert sorted(job_id for job_id, _ in report.moves) == ["m-0", "m-1", "m-3"]
    assert (report.replayed, report.skipped, report.left, report.missing) == (3, 2, 2, {"other": 2})
    assert [line.split(":")[0] for line in report.not_moved] == ["job 'mail' id 'm-2'", "job 'mail' id 'm-4'"]
    _, left = await browse(broker, "work.quarantine")
    assert [m.delivery.message_id for m in left] == ["m-2", "m-4"]
    assert [q.describe(m.delivery.headers, m.delivery.message_id, m.delivery.type).original_queue for m in left] == [
        "other",
        "other",
    ]


async def test_a_target_name_the_client_cannot_look_up_is_left_to_its_publish(broker: BrokerSettings, tmp_path: Path):
    """pamqp refuses to declare a queue named outside ``[a-zA-Z0-9-_.:@#,/+ ]`` (RabbitMQ takes any UTF-8), so
    the look-up raised and stopped the run; a publish can still be routed to it. Missing: it stays, named."""
    await make_app(broker, tmp_path)
    await quarantine_one(broker, "q-0", naming("work", "q-0"))
    await quarantine_one(broker, "u-1", naming("wörk", "u-1"))
    await quarantine_one(broker, "q-1", naming("work", "q-1"))
    report = await replay(broker, "work.quarantine", ReplayOptions(rate=1000))
    assert sorted(job_id for job_id, _ in report.moves) == ["q-0", "q-1"]
    assert (report.replayed, report.skipped, report.left, report.missing) == (2, 1, 1, {"wörk": 1})
    _, left = await browse(broker, "work.quarantine")
    assert [m.delivery.message_id for m in left] == ["u-1"]


async def test_a_canary_whose_target_vanished_under_its_move_is_not_waited_for(broker: BrokerSettings, tmp_path: Path):
    """Found at its look-up, deleted while the canary waited its turn (--rate 1): its publish came back unroutable.

    It stays, named; it is no canary that went (before: waited for, then said to be "not in other nor back in
    work.quarantine, so most likely done")."""
    await make_app(broker, tmp_path)
    async with raw_channel(broker) as ch:
        await ch.declare_queue("other", durable=True)
    await quarantine_one(broker, "m-0", naming("work", "m-0"))
    await quarantine_one(broker, "m-1", naming("other", "m-1"))
    deleted: list[asyncio.Task[Any]] = []
    async with raw_channel(broker) as ch:  # open before: the delete is one round trip, well within m-1's 1 s

        def progress(report: ReplayReport) -> None:
            if report.replayed == 1 and not deleted:
                deleted.append(asyncio.ensure_future(ch.queue_delete("other")))

        options = ReplayOptions(rate=1, canary=2, canary_timeout=1.0)
        report = await replay(broker, "work.quarantine", options, progress)
        await asyncio.gather(*deleted)
    assert (report.replayed, report.missing, report.canary_moved) == (1, {"other": 1}, 1)
    assert [line.split(":")[0] for line in report.canary_failures] == ["m-0 (mail)"]  # no worker runs: it waits
    assert "no worker took it (still in work, which has no consumer)" in report.canary_failures[0]
    _, left = await browse(broker, "work.quarantine")
    assert [m.delivery.message_id for m in left] == ["m-1"]


async def test_a_dry_run_looks_up_a_name_the_client_cannot_declare_as_the_run_finds_it(
    broker: BrokerSettings, tmp_path: Path
):
    """Before, such a target counted as there in a dry run (its publish decides in a real one): a dry run promised
    ``would replay lq -> wo\\x1brk`` that the run then refused (helper-226). Now the management API is asked."""
    await make_app(broker, tmp_path)
    with ManagementClient(broker) as mgmt:  # a queue the broker takes and pamqp won't declare: it exists
        mgmt.request("PUT", f"/queues/{quote(broker.vhost, safe='')}/{quote('wörk', safe='')}", {"durable": True})
    await quarantine_one(broker, "q-0", naming("work", "q-0"))
    await quarantine_one(broker, "e-1", naming("wo\x1brk", "e-1"))  # missing
    await quarantine_one(broker, "u-1", naming("wörk", "u-1"))  # there
    dry = await asyncio.to_thread(cli, broker, "replay", "work", "--dry-run")
    assert dry.exit_code == 1, dry.output
    assert "dry run: 2 would be replayed, 1 skipped, nothing moved; 3 in work.quarantine" in dry.stdout
    assert "would replay q-0 -> work\n" in dry.stdout
    assert "would replay u-1 -> wörk\n" in dry.stdout
    assert "would not replay job 'mail' id 'e-1': its target queue 'wo\\x1brk' does not exist" in dry.stderr
    run = await asyncio.to_thread(cli, broker, "replay", "work", "--rate", "1000")
    assert run.exit_code == 1, run.output
    assert "replayed 2, skipped 1, left 1 in work.quarantine (" in run.stdout
    assert "not replayed job 'mail' id 'e-1': its target queue 'wo\\x1brk' does not exist" in run.stderr
    assert await depth(broker, "work") == 1
    for _ in range(60):  # the management API's figures lag (stats every 5 s)
        with ManagementClient(broker) as mgmt:
            if (mgmt.queue(broker.vhost, "wörk") or {}).get("messages") == 1:
                break
        await asyncio.sleep(0.25)
    else:
        raise AssertionError("u-1 never reached wörk")


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "run"])
async def test_the_direct_reply_to_pseudo_queue_is_refused_as_a_target_with_nothing_moved(
    broker: BrokerSettings, tmp_path: Path, dry_run: bool
):
    """A passive declare of ``amq.rabbitmq.reply-to`` succeeds (RabbitMQ "Direct Reply-to"), so ``--to`` took it;
    the dry run promised every move and the run found it missing, saying "apply the topology" (helper-226)."""
    await make_app(broker, tmp_path)
    await quarantine_one(broker, "q-0", naming("work", "q-0"))
    args = ("--dry-run",) if dry_run else ("--rate", "1000")
    refused = await asyncio.to_thread(cli, broker, "replay", "work", "--to", "amq.rabbitmq.reply-to", *args)
    assert refused.exit_code == 2, refused.output
    assert (
        "--to 'amq.rabbitmq.reply-to' is RabbitMQ's direct reply-to pseudo-queue: no message can wait in it; nothing "
        "was moved (give a job queue's work queue)"
    ) in refused.stderr
    assert await depth(broker, "work.quarantine") == 1


LOSES = {
    "exclusive": "is exclusive to another connection: the broker deletes it with that connection, and every job moved "
    "there",
    "auto-delete": "is auto-delete: the broker deletes it with its last consumer, and every job moved there",
    "transient": "is not durable: the jobs moved there would not survive a restart of the broker",
}


@pytest.mark.parametrize("kind", sorted(LOSES))
async def test_a_target_queue_that_would_lose_the_jobs_is_refused_dry_run_and_run_alike(
    broker: BrokerSettings, broker_root: BrokerRoot, tmp_path: Path, kind: str
):
    """Before (helper-227): another connection's exclusive queue (``amq.gen-...``) took a replayed job, which went
    with that connection: gone from quarantine and from everywhere. The same for an auto-delete or transient one."""
    if kind == "transient" and broker_root.version >= (4, 3):
        pytest.skip("RabbitMQ 4.3 denies transient non-exclusive queues (a deprecated feature): none can be a target")
    await make_app(broker, tmp_path)
    async with raw_channel(broker) as owner:
        if kind == "exclusive":  # server-named, as a client's reply queue would be
            target = (await owner.declare_queue("", exclusive=True)).name
        else:
            target = f"tmp-{kind}"
            declared = await owner.declare_queue(target, durable=kind != "transient", auto_delete=kind == "auto-delete")
            if kind == "auto-delete":

                async def leave(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                    return None

                await declared.consume(leave)  # it lives while it has a consumer
        await quarantine_one(broker, "q-0", naming("work", "q-0"))
        await quarantine_one(broker, "x-1", naming(target, "x-1"))  # its evidence names that queue
        line = f"job 'mail' id 'x-1': its target queue {target!r} {LOSES[kind]}"
        dry = await asyncio.to_thread(cli, broker, "replay", "work", "--dry-run")
        assert dry.exit_code == 1, dry.output
        assert f"would not replay {line}; it would stay in work.quarantine\n" in dry.stderr
        assert "dry run: 1 would be replayed, 1 skipped, nothing moved" in dry.stdout
        to = await asyncio.to_thread(cli, broker, "replay", "work", "--to", target, "--rate", "1000")
        assert to.exit_code == 2, to.output
        assert f"--to {target!r} {LOSES[kind]}; nothing was moved (give a job queue's work queue)" in to.stderr
        run = await asyncio.to_thread(cli, broker, "replay", "work", "--rate", "1000")
        assert run.exit_code == 1, run.output
        assert f"not replayed {line}; it stays in work.quarantine\n" in run.stderr
        assert await depth(broker, "work") == 1
    assert await depth(broker, "work.quarantine") == 1  # x-1 still there once its queue is gone


async def test_a_canary_waiting_in_a_paused_job_queue_names_the_pause_not_the_workers(
    broker: BrokerSettings, tmp_path: Path
):
    """helper-230: the canary said "no worker took it ... which has no consumer" and "check the workers"."""
    from amqpjobs.runtime.pausing import pause

    await make_app(broker, tmp_path)
    await pause(broker, "work", reason="maintenance")
    await quarantine_one(broker, "p-0", naming("work", "p-0"))
    report = await replay(broker, "work.quarantine", ReplayOptions(canary=1, canary_timeout=1.0))
    assert report.canary_failures == [
        "p-0 (mail): no outcome event within 1s: no worker took it: job queue work is paused (amqpjobs status says "
        "since when and why); resume it (amqpjobs resume work), then replay again"
    ]


def test_a_replay_into_a_paused_job_queue_says_its_jobs_wait_there(broker: BrokerSettings, tmp_path: Path):
    """helper-230: replay moved jobs into a paused job queue without a word."""
    import asyncio as aio

    from amqpjobs.runtime.pausing import pause

    aio.run(make_app(broker, tmp_path))
    aio.run(pause(broker, "work", reason="maintenance"))
    for n in range(2):
        aio.run(quarantine_one(broker, f"w-{n}", naming("work", f"w-{n}")))
    dry = cli(broker, "replay", "work.quarantine", "--dry-run")
    assert "warning: job queue work is paused (since " in dry.stderr
    assert "reason: maintenance): the 2 job(s) replayed into it would wait there until amqpjobs resume work" in (
        dry.stderr
    )
    done = cli(broker, "replay", "work.quarantine")
    assert done.exit_code == 0, done.output
    assert "reason: maintenance): the 2 job(s) replayed into it wait there until amqpjobs resume work" in done.stderr
