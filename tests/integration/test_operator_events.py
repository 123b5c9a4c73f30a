"""Issue 21, first half: outcome events and the canary replay, on the real broker."""

from __future__ import annotations

import asyncio
import os
import pty
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from amqpjobs import JobContext, Reject, RetryPolicy
from amqpjobs.jobs.events import OutcomeEvent, decode_events
from amqpjobs.runtime.quarantine import browse
from amqpjobs.topology.naming import EVENTS_EXCHANGE
from amqpjobs.wire.connection import connect
from amqpjobs.wire.events import subscribe_outcomes
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import cli, depth, until, wait_until
from tests.integration.test_quarantine import fill_quarantine
from tests.integration.test_topology_holes import delete
from tests.integration.worker_env import make_app, running_worker

pytestmark = pytest.mark.broker


def decoded(body: bytes) -> list[OutcomeEvent]:
    """The events of one message body (at least one: a worker never sends an empty message)."""
    events = decode_events(body)
    assert events, body
    return events


@pytest.mark.version_independent
async def test_each_outcome_is_one_event_routed_by_job_queue_and_outcome(
    broker: BrokerSettings, tmp_path: Path, mgmt: ManagementClient
):
    app = await make_app(broker, tmp_path)
    ex = next(e for e in mgmt.exchanges(broker.vhost) if e["name"] == EVENTS_EXCHANGE)
    assert (ex["type"], ex["durable"]) == ("topic", True)

    @app.job("mail", queue="work", retry=RetryPolicy(max_attempts=2))
    async def mail(payload: dict[str, Any], ctx: JobContext) -> None:
        if payload["n"] == 1:
            raise ValueError("bad address")
        if payload["n"] == 2:
            raise Reject("spam")

    every: list[OutcomeEvent] = []
    quarantined: list[OutcomeEvent] = []
    connection = await connect(broker, name="listener")
    try:
        await subscribe_outcomes(connection, lambda body: every.extend(decoded(body)), ["work.*"])
        await subscribe_outcomes(connection, lambda body: quarantined.extend(decoded(body)), ["*.quarantined"])
        async with running_worker(app, broker) as _:
            for n in range(3):
                await app.enqueue("mail", {"n": n}, job_id=f"e-{n}")
            await until(lambda: len(every) >= 4 and len(quarantined) >= 2)
    finally:
        await connection.close()
        await app.close()
    got = sorted((e.id, e.attempt, e.outcome, e.reason, e.error, e.job, e.queue) for e in every)
    assert got == [
        ("e-0", 1, "succeeded", "", "", "mail", "work"),
        ("e-1", 1, "retried", "", "ValueError: bad address", "mail", "work"),
        ("e-1", 2, "quarantined", "exhausted", "ValueError: bad address", "mail", "work"),
        ("e-2", 1, "quarantined", "rejected", "amqpjobs.jobs.outcome.Reject: spam", "mail", "work"),
    ]
    assert sorted(e.id for e in quarantined) == ["e-1", "e-2"]
    assert all(e.at.endswith("Z") and e.replay_id == "" for e in every)


@pytest.mark.version_independent
async def test_without_the_events_exchange_jobs_run_and_events_are_counted_dropped(
    broker: BrokerSettings, tmp_path: Path, mgmt: ManagementClient
):
    app = await make_app(broker, tmp_path)
    delete(broker, "exchanges", EVENTS_EXCHANGE)

    @app.job("mail", queue="work")
    async def mail(payload: dict[str, Any], ctx: JobContext) -> None:
        return None

    async with running_worker(app, broker) as (worker, rec):
        for n in range(3):
            await app.enqueue("mail", {"n": n})
        await rec.wait_for(lambda o: len(o) >= 3)
        await asyncio.sleep(0.05)
        assert worker._events is not None
        assert (worker._events.published, worker._events.dropped) == (0, 3)
        assert worker.stats["succeeded"] == 3
    await app.close()
    assert await depth(broker, "work") == 0


@pytest.mark.version_independent
async def test_the_events_exchange_deleted_under_a_running_worker_turns_events_off_not_jobs(
    broker: BrokerSettings, tmp_path: Path
):
    app = await make_app(broker, tmp_path)

    @app.job("mail", queue="work")
    async def mail(payload: dict[str, Any], ctx: JobContext) -> None:
        return None

    async with running_worker(app, broker, concurrency=4) as (worker, rec):
        reconnects: list[object] = []
        assert worker._connection is not None
        worker._connection.reconnect_callbacks.add(lambda *_: reconnects.append(1))
        await app.enqueue("mail", {"n": 0})
        await rec.wait_for(lambda o: len(o) >= 1)
        delete(broker, "exchanges", EVENTS_EXCHANGE)
        for n in range(1, 41):
            await app.enqueue("mail", {"n": n})
        await rec.wait_for(lambda o: len(o) >= 41)
        events = worker._events
        assert events is not None
        # the last events leave in the background sender (sent or dropped in the loop's time, not a fixed 0.2 s)
        await wait_until(lambda: events.published + events.dropped >= 41, 10, "every event sent or dropped")
        assert worker.stats["succeeded"] == 41
        assert events.published + events.dropped == 41
        assert events.dropped >= 39  # the first publish after the delete closes the channel; events stay off
        assert reconnects == []  # the connection (and every unacked job on it) was never lost
    await app.close()
    assert await depth(broker, "work.quarantine") == 0


async def test_canary_of_2_stops_a_replay_of_20_whose_handler_still_fails(broker: BrokerSettings, tmp_path: Path):
    app = await make_app(broker, tmp_path)
    runs: list[str] = []

    @app.job("mail", queue="work")  # 3 tiers of 200-600 ms: a failure comes back to quarantine only after them
    async def mail(payload: dict[str, Any], ctx: JobContext) -> None:
        runs.append(ctx.job_id)
        raise KeyError("still broken")

    await fill_quarantine(broker, 20)
    async with running_worker(app, broker) as _:
        result = await asyncio.to_thread(cli, broker, "replay", "work.quarantine", "--canary", "2")
        _, items = await browse(broker, "work.quarantine")
    assert result.exit_code == 1, result.output
    assert "replayed 2, skipped 0, left 18 in work.quarantine" in result.stdout
    assert "canary failed: 2 of 2" in result.stderr
    assert "q-0 (mail): retried: KeyError: 'still broken'" in result.stderr
    assert "q-1 (mail): retried: KeyError: 'still broken'" in result.stderr
    assert "amqpjobs quarantine park work.quarantine" in result.stderr  # names the next command
    assert sorted(set(runs)) == ["q-0", "q-1"]
    assert sorted(m.item.job_id for m in items if m.item.replay_count == 0) == sorted(f"q-{i}" for i in range(2, 20))


async def test_a_canary_that_succeeds_lets_the_replay_move_all(broker: BrokerSettings, tmp_path: Path):
    app = await make_app(broker, tmp_path)
    done: list[str] = []

    @app.job("mail", queue="work")
    async def mail(payload: dict[str, Any], ctx: JobContext) -> None:
        done.append(ctx.job_id)

    await fill_quarantine(broker, 20)
    async with running_worker(app, broker) as (_, rec):
        result = await asyncio.to_thread(cli, broker, "replay", "work", "--canary", "2", "--rate", "200")
        await rec.wait_for(lambda o: len(o) >= 20, timeout=10)
    assert result.exit_code == 0, result.output
    assert "canary passed: 2 of 2 succeeded" in result.stdout
    assert "replayed 20, skipped 0, left 0 in work.quarantine (" in result.stdout
    assert "s including the canary wait, " in result.stdout  # the rate is not the rest's rate
    assert sorted(done) == sorted(f"q-{i}" for i in range(20))


def on_a_terminal(broker: BrokerSettings, *args: str) -> tuple[int, str]:
    """Run the installed ``amqpjobs`` with stderr on a pseudo-terminal (as an operator sees it): (rc, stderr)."""
    master, slave = pty.openpty()
    env = dict(os.environ, AMQPJOBS_URL=broker.url, AMQPJOBS_MANAGEMENT_URL=broker.management_url)
    exe = str(Path(sys.executable).with_name("amqpjobs"))
    proc = subprocess.Popen([exe, *args], stdout=subprocess.DEVNULL, stderr=slave, env=env)
    os.close(slave)
    seen = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the process closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    return proc.wait(timeout=60), seen.decode()


@pytest.mark.version_independent
async def test_the_live_progress_line_on_a_terminal_shows_the_canary_phase(broker: BrokerSettings, tmp_path: Path):
    app = await make_app(broker, tmp_path)

    @app.job("mail", queue="work")
    async def mail(payload: dict[str, Any], ctx: JobContext) -> None:
        pass

    await fill_quarantine(broker, 20)
    async with running_worker(app, broker) as (_, rec):
        rc, err = await asyncio.to_thread(on_a_terminal, broker, "replay", "work", "--canary", "2", "--rate", "200")
        await rec.wait_for(lambda o: len(o) >= 20, timeout=10)
    assert rc == 0, err
    frames = [frame.strip() for frame in err.replace("\n", "\r").split("\r") if frame.strip()]
    assert frames[:2] == ["canary: replayed 1 of 2", "canary: replayed 2 of 2, waiting for their outcomes"], err
    assert frames[2].startswith("rest: replayed 3 ("), err
    assert [f.split(" (")[0] for f in frames[3:]] == ["rest: replayed 10", "rest: replayed 20"], err


@pytest.mark.version_independent
async def test_a_canary_without_an_outcome_in_time_stops_the_replay(broker: BrokerSettings, tmp_path: Path):
    await make_app(broker, tmp_path)
    await fill_quarantine(broker, 5)
    started = time.monotonic()
    result = await asyncio.to_thread(cli, broker, "replay", "work", "--canary", "1", "--canary-timeout", "1s")
    took = time.monotonic() - started
    assert result.exit_code == 1, result.output
    assert "q-0 (mail): no outcome event within 1s: no worker took it (still in work, which has no consumer)" in (
        result.stderr
    )
    assert "replayed 1, skipped 0, left 4 in work.quarantine" in result.stdout
    assert await depth(broker, "work") == 1  # the canary waits in its work queue
    assert 1.0 <= took < 5.0
