"""Issue 21, first half: parking quarantined jobs, and what status says of them, on the real broker."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aio_pika
import pytest

from amqpjobs import JobContext, Reject
from amqpjobs.jobs import quarantine as q
from amqpjobs.runtime.quarantine import browse, mover_lock
from amqpjobs.wire.connection import connect
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import cli, depth, raw_channel
from tests.integration.test_quarantine import evidence_for, fill_quarantine
from tests.integration.test_topology_holes import delete
from tests.integration.worker_env import APPLIED_TOPOLOGY, make_app, running_worker

pytestmark = pytest.mark.broker


async def reject_one(broker: BrokerSettings, job_id: str) -> None:
    """A broker-side dead-letter: a job rejected by some other consumer (only x-death says why)."""
    async with raw_channel(broker) as ch:
        ex = await ch.get_exchange("jobs")
        await ex.publish(aio_pika.Message(b'{"n": 99}', message_id=job_id, type="mail"), routing_key="work")
        msg = await (await ch.get_queue("work", ensure=False)).get(timeout=5)
        assert msg is not None
        await msg.reject(requeue=False)
    await asyncio.sleep(0.1)


@pytest.mark.version_independent
async def test_park_moves_matching_jobs_with_their_evidence_and_status_stays_healthy(
    broker: BrokerSettings, tmp_path: Path, mgmt: ManagementClient
):
    app = await make_app(broker, tmp_path)
    (tmp_path / "topology").mkdir()
    (tmp_path / "topology" / "t.toml").write_text(APPLIED_TOPOLOGY)
    parked_queue = mgmt.queue(broker.vhost, "work.parked")
    assert parked_queue is not None
    assert (parked_queue["durable"], parked_queue["arguments"]) == (True, {"x-queue-type": "classic"})
    await fill_quarantine(broker, 3, job="mail", error_type="ValueError")
    await fill_quarantine(broker, 2, job="report", error_type="KeyError", reason="permanent")
    await reject_one(broker, "rej-1")
    done: list[str] = []

    @app.job("mail", queue="work")
    async def mail(payload: dict[str, Any], ctx: JobContext) -> None:
        done.append(ctx.job_id)

    parked = await asyncio.to_thread(cli, broker, "quarantine", "park", "work", "--job", "report", "--yes")
    assert parked.exit_code == 0, parked.output
    assert "parked 2 message(s) from work.quarantine in work.parked; 4 left in work.quarantine" in parked.stdout
    assert "next: amqpjobs quarantine list work.quarantine" in parked.stdout
    _, items = await browse(broker, "work.parked")
    assert [(m.item.job, m.item.reason, m.item.error_type, m.item.original_queue) for m in items] == [
        ("report", "permanent", "KeyError", "work")
    ] * 2
    for i, m in enumerate(items):  # every evidence header as the worker wrote it
        wanted = evidence_for(i, job="report", error_type="KeyError", reason="permanent")
        assert {k: m.delivery.headers[k] for k in wanted} == wanted
        assert str(m.delivery.headers[q.PARKED_AT]).endswith("Z")
    rejected = await asyncio.to_thread(
        cli, broker, "quarantine", "park", "work.quarantine", "--reason", "rejected", "--yes"
    )
    assert rejected.exit_code == 0, rejected.output
    _, items = await browse(broker, "work.parked")
    (rej,) = [m for m in items if m.delivery.message_id == "rej-1"]
    assert (rej.item.reason, rej.item.original_queue) == ("x-death:rejected", "work")
    assert "x-death" not in rej.delivery.headers

    async with running_worker(app, broker) as _:
        unhealthy = await asyncio.to_thread(cli, broker, "status", str(tmp_path / "topology"))
        assert unhealthy.exit_code == 1
        assert "3 message(s) in quarantine work.quarantine (next: amqpjobs quarantine list" in unhealthy.stdout
        rest = await asyncio.to_thread(cli, broker, "quarantine", "park", "work", "--yes")
        assert "parked 3 message(s) from work.quarantine in work.parked; 0 left" in rest.stdout
        assert "next: amqpjobs status" in rest.stdout
        healthy = await asyncio.to_thread(cli, broker, "status", str(tmp_path / "topology"))
        assert healthy.exit_code == 0, healthy.output
        assert "note work: 6 job(s) parked in work.parked, not unhealthy" in healthy.stdout
        assert healthy.stdout.rstrip().endswith("healthy")
        listed = await asyncio.to_thread(cli, broker, "quarantine", "list", "work.parked")
        assert "work.parked: 6 message(s)" in listed.stdout
        shown = await asyncio.to_thread(cli, broker, "quarantine", "show", "work.parked", "--job", "report")
        assert (shown.stdout.count("--- job report"), shown.stdout.count("error:      KeyError: boom")) == (2, 2)
        purged = await asyncio.to_thread(cli, broker, "quarantine", "purge", "work.parked", "--job", "report", "--yes")
        assert "purged 2 message(s) from work.parked; 4 left" in purged.stdout
        replayed = await asyncio.to_thread(cli, broker, "replay", "work.parked", "--reason", "rejected")
        assert "replayed 1, skipped 3, left 3 in work.parked" in replayed.stdout
        for _ in range(100):
            if done:
                break
            await asyncio.sleep(0.02)
    assert done == ["rej-1"]
    assert await depth(broker, "work.quarantine") == 0
    # the next step of a replay that emptied a parked queue names that queue, not the quarantine
    rest = await asyncio.to_thread(cli, broker, "quarantine", "purge", "work.parked", "--reason", "rejected", "--yes")
    assert rest.exit_code == 0, rest.output
    emptied = await asyncio.to_thread(cli, broker, "replay", "work.parked")
    assert emptied.exit_code == 0, emptied.output
    assert emptied.stdout.rstrip().splitlines()[-1] == (
        "next: amqpjobs status (parked queue work.parked is empty; a replayed job that fails again goes to quarantine)"
    )


@pytest.mark.version_independent
async def test_a_parked_queue_not_applied_yet_is_a_note_and_park_refuses_to_move(
    broker: BrokerSettings, tmp_path: Path
):
    app = await make_app(broker, tmp_path)
    delete(broker, "queues", "work.parked")
    await fill_quarantine(broker, 2)

    @app.job("mail", queue="work")
    async def mail(payload: dict[str, Any], ctx: JobContext) -> None:
        return None

    async with running_worker(app, broker) as _:
        status = await asyncio.to_thread(cli, broker, "status", "--queues", "work")
    assert "note work: no parked queue work.parked yet (amqpjobs topology apply declares it)" in status.stdout
    assert "work.parked does not exist" not in status.stdout
    assert status.exit_code == 1  # for the 2 in quarantine only
    assert "UNHEALTHY work: 2 message(s) in quarantine" in status.stdout
    parked = await asyncio.to_thread(cli, broker, "quarantine", "park", "work", "--yes")
    assert parked.exit_code == 2
    assert "parked queue 'work.parked' does not exist: apply the topology" in parked.stderr
    assert await depth(broker, "work.quarantine") == 2


@pytest.mark.version_independent
async def test_park_and_a_filtered_purge_wait_for_no_mover(broker: BrokerSettings, tmp_path: Path):
    await make_app(broker, tmp_path)
    await fill_quarantine(broker, 2)
    connection = await connect(broker, name="a-replay")
    try:
        async with mover_lock(connection, broker, "work.quarantine", "replay"):
            parked = await asyncio.to_thread(cli, broker, "quarantine", "park", "work", "--yes")
            purged = await asyncio.to_thread(cli, broker, "quarantine", "purge", "work", "--job", "mail", "--yes")
    finally:
        await connection.close()
    assert (parked.exit_code, purged.exit_code) == (4, 4)
    assert "replay" in parked.stderr
    assert await depth(broker, "work.quarantine") == 2
    assert await depth(broker, "work.parked") == 0


@pytest.mark.version_independent
async def test_the_3am_drill_each_step_names_the_next(broker: BrokerSettings, tmp_path: Path):
    """README "The 3 am drill": alert -> status -> list/show -> canary replay of one kind -> park the rest."""
    app = await make_app(broker, tmp_path)
    topology = tmp_path / "applied.toml"
    await fill_quarantine(broker, 3, job="mail", error_type="ValueError")  # fixed since
    await fill_quarantine(broker, 2, job="report", error_type="KeyError", reason="permanent")  # still broken

    @app.job("mail", queue="work")
    async def mail(payload: dict[str, Any], ctx: JobContext) -> None:
        return None

    @app.job("report", queue="work")
    async def report(payload: dict[str, Any], ctx: JobContext) -> None:
        raise Reject("the report template is gone")

    def run(*args: str) -> tuple[int, str]:
        result = cli(broker, *args)
        return result.exit_code, result.stdout + result.stderr

    async with running_worker(app, broker) as _:
        code, out = await asyncio.to_thread(run, "status", str(topology))
        assert code == 1
        assert "(next: amqpjobs quarantine list work.quarantine)" in out
        code, out = await asyncio.to_thread(run, "quarantine", "list", "work.quarantine")
        assert "next: amqpjobs quarantine show work.quarantine --job mail --error-type ValueError" in out
        code, out = await asyncio.to_thread(
            run, "quarantine", "show", "work.quarantine", "--job", "mail", "--error-type", "ValueError"
        )
        fixed = "amqpjobs replay work.quarantine --job mail --error-type ValueError --canary 1"
        assert f"next: fixed? {fixed}; a lost cause? amqpjobs quarantine park work.quarantine --job mail" in out
        code, out = await asyncio.to_thread(run, *fixed.split()[1:])
        assert code == 0, out
        assert "canary passed: 1 of 1 succeeded; replaying the rest" in out
        assert "replayed 3, skipped 2, left 2 in work.quarantine" in out
        code, out = await asyncio.to_thread(run, "quarantine", "list", "work.quarantine")
        assert "next: amqpjobs quarantine show work.quarantine --job report --error-type KeyError" in out
        code, out = await asyncio.to_thread(run, "replay", "work.quarantine", "--job", "report", "--canary", "1")
        assert code == 1
        assert "canary failed: 1 of 1 did not succeed" in out
        assert "quarantined: amqpjobs.jobs.outcome.Reject: the report template is gone" in out
        park = "amqpjobs quarantine park work.quarantine --job report"
        assert park in out
        code, out = await asyncio.to_thread(run, *park.split()[1:], "--yes")
        assert "parked 2 message(s) from work.quarantine in work.parked; 0 left" in out
        assert "next: amqpjobs status" in out
        code, out = await asyncio.to_thread(run, "status", str(topology))
        assert code == 0, out
        assert "note work: 2 job(s) parked in work.parked" in out
        assert out.rstrip().endswith("healthy")


@pytest.mark.version_independent
@pytest.mark.timeout(120)
async def test_a_parked_queue_deleted_mid_park_loses_no_message_and_the_error_names_it_and_the_fix(
    broker: BrokerSettings, tmp_path: Path
) -> None:
    """An operator deletes work.parked while a park runs: the message in hand stays in quarantine (its copy came
    back unroutable, its original unacked), every other untaken message too; the error names the queue and the
    fix. What was parked before the deletion went with the queue (the operator's deletion)."""
    from amqpjobs.errors import ConfigurationError
    from amqpjobs.runtime.parking import TakeReport, park

    await make_app(broker, tmp_path)
    total = 3000
    await fill_quarantine(broker, total)
    report = TakeReport("work.quarantine")
    parking = asyncio.create_task(park(broker, "work", report=report))
    while report.taken < 50 and not parking.done():
        await asyncio.sleep(0.001)
    await asyncio.to_thread(delete, broker, "queues", "work.parked")
    with pytest.raises(ConfigurationError) as caught:
        await parking
    said = str(caught.value)
    assert said.startswith(f"parked queue 'work.parked' went missing; {report.taken} parked before it"), said
    assert "amqpjobs topology apply" in said, said
    assert 0 < report.taken < total
    left = 0
    for _ in range(100):  # the held messages come back as the park's channel closes
        left = await depth(broker, "work.quarantine")
        if left >= total - report.taken:
            break
        await asyncio.sleep(0.05)
    assert left == total - report.taken  # the one in hand included: none lost, none twice
