"""Quarantine operations and replay against the real broker."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aio_pika
import pytest

from amqpjobs import JobContext, RetryPolicy
from amqpjobs.jobs import envelope, evidence
from amqpjobs.jobs import quarantine as q
from amqpjobs.jobs.pacing import CATCH_UP
from amqpjobs.jobs.replay_plan import ReplayOptions, replay_window
from amqpjobs.jobs.timestamps import parse_time
from amqpjobs.runtime.quarantine import browse
from amqpjobs.runtime.replay import replay
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import (
    ROOT,
    cli,
    cli_subprocess,
    depth,
    depth_at_least,
    raw_channel,
    stalled_stretch,
    wait_until_async,
)
from tests.integration.worker_env import make_app, running_worker

pytestmark = pytest.mark.broker


def evidence_for(i: int, job: str = "mail", reason: str = "exhausted", error_type: str = "ValueError",
                 failed_at: str = "2026-11-29T08:00:00.000Z") -> dict[str, Any]:  # fmt: skip
    failure = evidence.Failure(
        reason=reason, error_type=error_type, error_message=f"boom {i}", traceback="Traceback ...", attempts=4,
        first_failure_at=failed_at, last_failure_at=failed_at, host="h", pid=1, version="0.1.0",
        app_version="", exchange="jobs", queue="work", routing_key="work", job=job, job_id=f"q-{i}", tenant="",
    )  # fmt: skip
    return {envelope.ATTEMPT: 4, **evidence.evidence_headers(failure)}


async def fill_quarantine(broker: BrokerSettings, n: int, **kw: Any) -> None:
    """Put n quarantined jobs (as the worker would) into work.quarantine."""
    async with raw_channel(broker) as ch:
        await ch.set_qos(0)
        ex = await ch.get_exchange("work.quarantine")
        for i in range(n):
            await ex.publish(
                aio_pika.Message(
                    json.dumps({"n": i}).encode(),
                    content_type="application/json",
                    message_id=f"q-{i}",
                    type=kw.get("job", "mail"),
                    headers=evidence_for(i, **kw),
                ),
                routing_key="work",
            )


def cli_env(broker: BrokerSettings) -> dict[str, str]:
    return dict(os.environ, AMQPJOBS_URL=broker.url, AMQPJOBS_MANAGEMENT_URL=broker.management_url)


@pytest.mark.slow
@pytest.mark.serial  # wall-clock bound (19-21 s): CPU contention from parallel tests would break it
@pytest.mark.no_cover  # coverage's tracing slows each move ~30%: 21.12 s in local CI 70's 3.10 serial lane
@pytest.mark.timeout(180)
async def test_replay_2000_at_rate_100_takes_20s_and_all_complete(broker: BrokerSettings, tmp_path: Path):
    app = await make_app(broker, tmp_path)
    await fill_quarantine(broker, 2000)
    report = await replay(broker, "work.quarantine", ReplayOptions(rate=100))
    assert report.replayed == 2000
    assert report.left == 0
    assert 19.0 <= report.elapsed <= 21.0, report.elapsed
    done: list[int] = []

    @app.job("mail", queue="work")
    async def mail(payload: dict[str, Any], ctx: JobContext) -> None:
        assert ctx.attempt == 1  # a fresh attempt budget
        done.append(payload["n"])

    async with running_worker(app, broker, concurrency=4) as (_, rec):
        await rec.wait_for(lambda o: len(o) >= 2000, timeout=60)
    assert sorted(done) == list(range(2000))
    assert await depth(broker, "work.quarantine") == 0


async def test_replay_killed_halfway_loses_nothing(broker: BrokerSettings, tmp_path: Path):
    await make_app(broker, tmp_path)
    await fill_quarantine(broker, 2000)
    exe = Path(sys.executable).with_name("amqpjobs")
    proc = await asyncio.to_thread(
        subprocess.Popen,
        [str(exe), "replay", "work.quarantine", "--rate", "200"],  # 10 s: the kill at 600 lands halfway
        env=cli_env(broker), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while await depth(broker, "work") < 600 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)

    async def all_back() -> bool:
        return await depth(broker, "work.quarantine") + await depth(broker, "work") >= 2000

    # the broker requeues what the dead connection held once it has seen it close (its time, not a fixed 0.5 s);
    # never back in full: lost messages, and the wait fails
    await wait_until_async(all_back, 30, "all 2000 back in work or work.quarantine")
    in_quarantine = await depth(broker, "work.quarantine")
    in_work = await depth(broker, "work")
    assert 600 <= in_work < 2000
    # nothing lost; at most the moves in flight (copy confirmed, original not yet acked) duplicated
    assert 2000 <= in_quarantine + in_work <= 2000 + replay_window(200)
    # ... and the ids add up exactly
    _, rest = await browse(broker, "work.quarantine")
    ids = {m.delivery.message_id for m in rest}
    async with raw_channel(broker) as ch:
        work = await ch.get_queue("work", ensure=False)
        while (m := await work.get(fail=False)) is not None:
            ids.add(m.message_id)
            await m.ack()
    assert ids == {f"q-{i}" for i in range(2000)}


async def test_filters_select_exactly_the_matching_messages(broker: BrokerSettings, tmp_path: Path):
    await make_app(broker, tmp_path)
    await fill_quarantine(broker, 5, job="mail", error_type="ValueError")
    await fill_quarantine(broker, 4, job="mail", error_type="builtins.KeyError", reason="permanent")
    await fill_quarantine(broker, 3, job="report", error_type="ValueError", failed_at="2026-11-29T10:00:00.000Z")
    r = await replay(broker, "work", ReplayOptions(rate=1000, selection=q.Selection(job="mail", error_type="KeyError")))
    assert (r.replayed, r.skipped, r.left) == (4, 8, 8)
    assert await depth(broker, "work") == 4
    r = await replay(broker, "work", ReplayOptions(rate=1000, selection=q.Selection(reason="exhausted", job="report")))
    assert (r.replayed, r.left) == (3, 5)
    since = parse_time("2026-11-29T09:00:00Z")
    r = await replay(broker, "work", ReplayOptions(rate=1000, selection=q.Selection(since=since)))
    assert r.replayed == 0
    r = await replay(broker, "work", ReplayOptions(rate=1000, limit=2))
    assert (r.replayed, r.left) == (2, 3)
    _, rest = await browse(broker, "work")
    assert [m.delivery.message_id for m in rest] == ["q-2", "q-3", "q-4"]  # order kept
    assert all(m.delivery.redelivered for m in rest)


async def test_dry_run_changes_nothing(broker: BrokerSettings, tmp_path: Path):
    await make_app(broker, tmp_path)
    await fill_quarantine(broker, 7)
    result = await asyncio.to_thread(cli, broker, "replay", "work.quarantine", "--dry-run", "--job", "mail")
    assert result.exit_code == 0, result.output
    assert "dry run: 7 would be replayed, 0 skipped, nothing moved; 7 in work.quarantine" in result.stdout
    assert result.stdout.count("would replay q-") == 7
    assert await depth(broker, "work.quarantine") == 7
    assert await depth(broker, "work") == 0


async def test_replayed_job_failing_again_carries_both_failures_and_stop_after_failures(
    broker: BrokerSettings, tmp_path: Path
):
    app = await make_app(broker, tmp_path)
    runs: list[int] = []

    @app.job("mail", queue="work", retry=RetryPolicy(max_attempts=1))
    async def mail(payload: dict[str, Any], ctx: JobContext) -> None:
        runs.append(payload["n"])
        raise KeyError("still broken")

    await fill_quarantine(broker, 40)
    async with running_worker(app, broker) as (_, rec):
        report = await replay(broker, "work.quarantine", ReplayOptions(rate=20, stop_after_failures=5))
        # the replayed jobs still in work run in the worker's time: each one's outcome, then a window for more
        await rec.wait_for(lambda o: len(o) >= report.replayed, timeout=30)
        await asyncio.sleep(0.5)  # a run beyond the replayed ones would come by now
    assert report.stopped_early
    assert report.returned >= 5
    assert 5 <= report.replayed < 40
    assert len(runs) == report.replayed
    _, items = await browse(broker, "work.quarantine")
    assert len(items) == 40
    again = [m for m in items if m.item.replay_count == 1]
    assert len(again) == report.replayed
    h = again[0].delivery.headers
    assert h[evidence.REASON] == "exhausted"
    assert h[evidence.ERROR_TYPE] == "KeyError"
    assert h[q.PREVIOUS_REASON] == "exhausted"
    assert h[q.PREVIOUS_ERROR_TYPE] == "ValueError"
    assert str(h[q.PREVIOUS_ERROR_MESSAGE]).startswith("boom ")
    assert h[q.PREVIOUS_FAILURE_AT] == "2026-11-29T08:00:00.000Z"
    assert h[evidence.ATTEMPTS] == 1  # a fresh attempt budget: one run of max 1


async def test_broker_side_dead_letters_are_listed_and_replayable(broker: BrokerSettings, tmp_path: Path):
    await make_app(broker, tmp_path)
    async with raw_channel(broker) as ch:
        ex = await ch.get_exchange("jobs")
        # expired: a per-message TTL on the work queue, nobody consuming
        await ex.publish(aio_pika.Message(b'{"n": 1}', message_id="exp-1", type="mail", expiration=0.05),
                         routing_key="work")  # fmt: skip
        await ex.publish(aio_pika.Message(b'{"n": 2}', message_id="rej-1", type="mail"), routing_key="work")
        await asyncio.sleep(0.3)
        work = await ch.get_queue("work", ensure=False)
        msg = await work.get(timeout=5)  # rejected by a raw consumer
        assert msg is not None
        assert msg.message_id == "rej-1"
        await msg.reject(requeue=False)
    # the dead-letter hop is the broker's, in its own time (not a fixed 0.2 s)
    await wait_until_async(lambda: depth_at_least(broker, "work.quarantine", 2), 10, "both dead letters")
    result = await asyncio.to_thread(cli, broker, "quarantine", "list", "work")
    assert result.exit_code == 0, result.output
    assert "work.quarantine: 2 message(s)" in result.stdout
    assert "x-death:expired" in result.stdout
    assert "x-death:rejected" in result.stdout
    _, items = await browse(broker, "work.quarantine")
    assert {(m.delivery.message_id, m.item.reason, m.item.original_queue, m.item.broker_side) for m in items} == {
        ("exp-1", "x-death:expired", "work", True),
        ("rej-1", "x-death:rejected", "work", True),
    }
    r = await replay(broker, "work.quarantine", ReplayOptions(rate=100, selection=q.Selection(reason="expired")))
    assert (r.replayed, r.left) == (1, 1)
    async with raw_channel(broker) as ch:
        work = await ch.get_queue("work", ensure=False)
        back = await work.get(timeout=5)
        assert back is not None
        assert back.message_id == "exp-1"
        assert "x-death" not in (back.headers or {})
        assert back.headers[q.PREVIOUS_REASON] == "x-death:expired"
        await back.ack()


async def test_a_dead_letter_is_shown_with_its_last_death_not_its_first(broker: BrokerSettings, tmp_path: Path):
    """Expired from a retry tier back into ``work``, then rejected there: the last death is what counts."""
    await make_app(broker, tmp_path)
    async with raw_channel(broker) as ch:
        # into the 200 ms tier as a retry would put it; it expires back into work
        await ch.default_exchange.publish(aio_pika.Message(b'{"n": 1}', message_id="twice-1", type="mail"),
                                          routing_key="work.retry.200ms")  # fmt: skip
        work = await ch.get_queue("work", ensure=False)
        msg = None
        for _ in range(50):
            if (msg := await work.get(fail=False)) is not None:
                break
            await asyncio.sleep(0.1)
        assert msg is not None
        assert msg.headers["x-first-death-queue"] == "work.retry.200ms"
        await msg.reject(requeue=False)  # rejected by another consumer of work: into work.quarantine
    await wait_until_async(lambda: depth_at_least(broker, "work.quarantine", 1), 10, "the dead letter")
    _, items = await browse(broker, "work.quarantine")
    assert [(m.item.reason, m.item.original_queue) for m in items] == [("x-death:rejected", "work")]
    deaths = items[0].delivery.headers["x-death"]
    assert [(d["queue"], d["reason"]) for d in deaths] == [("work", "rejected"), ("work.retry.200ms", "expired")]
    listed = await asyncio.to_thread(cli, broker, "quarantine", "list", "work")
    assert listed.exit_code == 0, listed.output
    assert "x-death:rejected" in listed.stdout
    assert "x-death:expired" not in listed.stdout
    shown = await asyncio.to_thread(cli, broker, "quarantine", "show", "work", "--json")
    doc = json.loads(shown.stdout.splitlines()[0])
    assert (doc["reason"], doc["original_queue"]) == ("x-death:rejected", "work")
    none = await replay(broker, "work.quarantine", ReplayOptions(rate=100, selection=q.Selection(reason="expired")))
    assert (none.replayed, none.left) == (0, 1)
    r = await replay(broker, "work.quarantine", ReplayOptions(rate=100, selection=q.Selection(reason="rejected")))
    assert (r.replayed, r.left) == (1, 0)
    assert await depth(broker, "work") == 1  # back to work, not to the retry tier it once expired from


async def test_list_show_export_purge(broker: BrokerSettings, tmp_path: Path):
    await make_app(broker, tmp_path)
    await fill_quarantine(broker, 3, job="mail", error_type="ValueError")
    await fill_quarantine(broker, 2, job="report", error_type="KeyError", reason="permanent")
    listed = await asyncio.to_thread(cli, broker, "quarantine", "list", "--all", "--json")
    assert listed.exit_code == 0, listed.output
    doc = json.loads(listed.stdout)
    assert doc[0]["queue"] == "work.quarantine"
    assert doc[0]["messages"] == 5
    assert [(g["job"], g["reason"], g["error_type"], g["count"]) for g in doc[0]["groups"]] == [
        ("mail", "exhausted", "ValueError", 3),
        ("report", "permanent", "KeyError", 2),
    ]
    shown = await asyncio.to_thread(cli, broker, "quarantine", "show", "work.quarantine", "--job", "report")
    assert shown.exit_code == 0
    assert shown.stdout.count("--- job report") == 2
    assert "error:      KeyError: boom" in shown.stdout
    assert "2 of 5 message(s) in work.quarantine shown (2 of the 5 looked at match the filters)" in shown.stdout
    out = tmp_path / "q.jsonl"
    exported = await asyncio.to_thread(cli, broker, "quarantine", "export", "work", str(out))
    assert exported.exit_code == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [x["payload"] for x in lines] == [{"n": 0}, {"n": 1}, {"n": 2}, {"n": 0}, {"n": 1}]
    assert lines[3]["headers"][evidence.REASON] == "permanent"
    assert await depth(broker, "work.quarantine") == 5
    purged = await asyncio.to_thread(cli, broker, "quarantine", "purge", "work", "--yes")
    assert "purged 5 message(s) from work.quarantine" in purged.stdout
    assert await depth(broker, "work.quarantine") == 0
    missing = await asyncio.to_thread(cli, broker, "quarantine", "show", "nope")
    assert missing.exit_code == 2
    assert "no quarantine queue" in missing.stderr


async def test_export_names_its_file_with_control_characters_escaped(broker: BrokerSettings, tmp_path: Path):
    """A file name holding an escape sequence or a line feed must not repaint the terminal nor forge a line."""
    await make_app(broker, tmp_path)
    await fill_quarantine(broker, 1)
    out = tmp_path / "q\x1b[2J\n.jsonl"
    exported = await asyncio.to_thread(cli, broker, "quarantine", "export", "work", str(out))
    assert exported.exit_code == 0, exported.output
    assert [json.loads(line)["message_id"] for line in out.read_text().splitlines()] == ["q-0"]
    assert exported.stdout == f"exported 1 message(s) to {tmp_path}/q\\x1b[2J\\n.jsonl; the queue still holds them\n"


@pytest.mark.parametrize("command", [("quarantine", "list"), ("quarantine", "purge", "--yes"), ("replay",)])
async def test_a_quarantine_queue_exclusive_to_another_connection_is_named(
    broker: BrokerSettings, command: tuple[str, ...]
):
    async with raw_channel(broker) as ch:
        await ch.declare_queue("other.quarantine", exclusive=True)
        result = await asyncio.to_thread(cli_subprocess, broker, *command, "other")
    assert result.returncode == 3, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert "'other.quarantine' is exclusive to another connection (RESOURCE_LOCKED)" in result.stderr


async def test_replay_refuses_a_quarantine_queue_as_its_target(broker: BrokerSettings, tmp_path: Path):
    await make_app(broker, tmp_path)
    await fill_quarantine(broker, 3)
    result = await asyncio.to_thread(
        cli_subprocess, broker, "replay", "work.quarantine", "--to", "work.quarantine", "--rate", "100"
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "--to 'work.quarantine' is a quarantine queue" in result.stderr
    assert await depth(broker, "work.quarantine") == 3
    assert await depth(broker, "work") == 0


async def test_a_replay_never_moves_its_own_returning_failures(broker: BrokerSettings, tmp_path: Path):
    """A message taken by a browser mid-run makes room for one more get: it must not be a job this run replayed."""
    app = await make_app(broker, tmp_path)
    runs: list[int] = []

    @app.job("mail", queue="work", retry=RetryPolicy(max_attempts=1))
    async def mail(payload: dict[str, Any], ctx: JobContext) -> None:
        runs.append(payload["n"])
        raise KeyError("still broken")

    await fill_quarantine(broker, 10)
    async with running_worker(app, broker) as (_, rec), raw_channel(broker) as browser:
        running = asyncio.create_task(replay(broker, "work.quarantine", ReplayOptions(rate=20)))
        await rec.wait_for(lambda o: len(o) >= 2, timeout=10)
        held = await (await browser.get_queue("work.quarantine", ensure=False)).get(no_ack=False)
        assert held is not None
        assert q.REPLAY_COUNT not in (held.headers or {})  # an original nobody replayed yet
        report = await running
        await browser.close()  # the held message returns
        await rec.wait_for(lambda o: len(o) >= 9, timeout=10)
        await asyncio.sleep(0.3)
    assert (report.replayed, report.skipped) == (9, 1)
    assert sorted(runs) == sorted(set(runs))  # no job ran twice
    assert len(runs) == 9
    _, items = await browse(broker, "work.quarantine")
    assert sorted(m.item.replay_count for m in items) == [0] + [1] * 9


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("command", "target", "rate"),
    [
        (["replay", "work.quarantine"], "work", 200),
        (["quarantine", "park", "work.quarantine", "--yes"], "work.parked", 50),  # one move at a time: ~150/s here
    ],
    ids=["replay", "park"],
)
async def test_a_paced_move_stopped_for_3s_does_not_catch_up_in_a_burst(
    broker: BrokerSettings, tmp_path: Path, command: list[str], target: str, rate: int
):
    """``--rate`` bounds every stretch of the run: time lost to a stall (here SIGSTOP) is not made up."""
    await make_app(broker, tmp_path)
    await fill_quarantine(broker, 3000)
    exe = Path(sys.executable).with_name("amqpjobs")
    proc = await asyncio.to_thread(
        subprocess.Popen, [str(exe), *command, "--rate", str(rate)],
        env=cli_env(broker), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        before, after, elapsed = await stalled_stretch(broker, proc, target, rate // 2)
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.kill()
        await asyncio.to_thread(proc.wait, 10)
    # at most `rate` a second over the stretch after the stall, plus CATCH_UP s of moves at once, the one
    # at the stretch's start, and what was in flight at the stop (replay_window; park: one at a time);
    # made up, the 3 s owed would go at once (as fast as the confirms come: 560 at 200/s, 201 at 50/s)
    bound = rate * (elapsed + CATCH_UP) + 1 + replay_window(rate)
    assert 0 < after - before <= bound, (before, after, elapsed)
