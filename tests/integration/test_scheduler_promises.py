"""README "Schedules" promises that had no test: `schedule run --schedules/--log-json`, a leader
handing over at once on SIGTERM, a new leader whose clock is behind the old one's; and
"Idempotency": done-markers pruned by the workers.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aio_pika
import pytest

from amqpjobs import App, BrokerError, JobContext, Scheduler, SqliteLedger, TickEvent, Worker, WorkerOptions
from amqpjobs.jobs import cron, tick_record
from amqpjobs.runtime.ledger import Claim
from amqpjobs.topology.loader import load_topology
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import ROOT, raw_channel, wait_until, wait_until_async
from tests.integration.test_scheduler import covered, drain, jobs_in, seconds_from
from tests.integration.worker_env import APPLIED_TOPOLOGY, FAST_TOPOLOGY, make_app

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]

SECOND = timedelta(seconds=1)


def spawn(broker: BrokerSettings, tmp_path: Path, index: int, *args: str) -> subprocess.Popen[str]:
    topology = tmp_path / "sched.toml"
    topology.write_text(APPLIED_TOPOLOGY)
    env = dict(os.environ, AMQPJOBS_URL=broker.url, AMQPJOBS_MANAGEMENT_URL=broker.management_url,
               SCHEDAPP_TOPOLOGY=str(topology))  # fmt: skip
    with (tmp_path / f"replica-{index}.log").open("a") as log:
        return subprocess.Popen(
            [str(Path(sys.executable).with_name("amqpjobs")), "schedule", "run", "tests.integration.schedapp:app",
             *args],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip


def json_log(tmp_path: Path, index: int) -> list[dict[str, Any]]:
    path = tmp_path / f"replica-{index}.log"
    text = path.read_text() if path.exists() else ""
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def said(tmp_path: Path, index: int, words: str) -> bool:
    return any(words in line["message"] for line in json_log(tmp_path, index))


async def test_leader_hands_over_at_once_on_sigterm(broker: BrokerSettings, tmp_path: Path):
    await make_app(broker, tmp_path)
    args = ("--schedules", "every-second", "--log-json")
    procs = [spawn(broker, tmp_path, i, *args) for i in range(2)]
    try:
        await wait_until(lambda: all(said(tmp_path, i, "joined the election") for i in range(2)), 30, "replicas")
        await wait_until(lambda: any(said(tmp_path, i, " leads ") for i in range(2)), 30, "a leader")
        (first,) = [i for i in range(2) if said(tmp_path, i, " leads ")]
        leader, other = procs[first], procs[1 - first]
        await wait_until_async(lambda: jobs_in(broker, 2), 20, "2 jobs from the first leader")
        leader.terminate()
        assert await asyncio.to_thread(leader.wait, 30) == 0
        stopped_at = time.time()  # after its exit: its own drain under CI load is not the hand-over's time
        await wait_until(lambda: said(tmp_path, 1 - first, " leads "), 10, "the other replica to lead")
        await wait_until_async(lambda: jobs_in(broker, 4), 10, "jobs from the new leader")
        other.terminate()
        assert await asyncio.to_thread(other.wait, 30) == 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
    fired = await drain(broker)
    assert len({f.job_id for f in fired}) == len(fired), "a tick was enqueued twice"
    ticks = covered(fired)
    assert ticks == seconds_from(ticks[0], len(ticks)), "a tick was lost across the hand-over"
    after = sorted((f for f in fired if f.pid == other.pid), key=lambda f: f.fired_at)
    assert after, fired
    # at once: no wait for a heartbeat timeout; the new leader fires the next second's tick
    assert after[0].fired_at.timestamp() - stopped_at < 2.0, (after[0], stopped_at)
    for index in range(2):
        lines = json_log(tmp_path, index)  # --log-json: every line is a JSON object
        assert all({"time", "level", "logger", "message"} <= set(line) for line in lines)


async def test_schedules_option_runs_only_the_named_schedules(broker: BrokerSettings, tmp_path: Path):
    await make_app(broker, tmp_path)
    proc = spawn(broker, tmp_path, 0, "--schedules", "nope,every-second")
    code = await asyncio.to_thread(proc.wait, 30)
    out = (tmp_path / "replica-0.log").read_text()
    assert code == 2, out
    assert "unknown schedule(s) nope; the app has every-second" in out


def sec_app(broker: BrokerSettings, tmp_path: Path) -> App:
    path = tmp_path / "app.toml"
    path.write_text(FAST_TOPOLOGY)
    app = App("clocks", topology=load_topology(path).topology, url=broker.url)

    @app.cron("* * * * * *", name="sec")
    @app.job("tick", queue="work")
    async def tick(payload: dict[str, Any], ctx: JobContext) -> None: ...

    return app


async def test_a_new_leader_whose_clock_is_behind_waits_for_the_cursor(broker: BrokerSettings, tmp_path: Path):
    await make_app(broker, tmp_path)
    app = sec_app(broker, tmp_path)
    events: list[TickEvent] = []
    first = Scheduler(app, broker, on_event=events.append)
    await first.start()
    try:
        await wait_until(lambda: any(e.kind == "fired" for e in events), 20, "a first tick")
    finally:
        await first.shutdown()
    # the old leader's clock ran 2 s ahead of ours: it dealt with every tick up to now + 2 s
    ahead = datetime.now(UTC).replace(microsecond=0) + 2 * SECOND
    record = tick_record.TickRecord("sec", ahead, ahead, cron.tick_id("sec", ahead), ahead, "ahead:1")
    async with raw_channel(broker) as ch:
        await ch.default_exchange.publish(
            aio_pika.Message(record.to_bytes(), content_type="application/json", delivery_mode=2),
            routing_key=cron.tick_queue("clocks", "sec"),
        )  # the tick store keeps only its newest message (x-max-length 1, drop-head)
    await drain(broker)
    later: list[TickEvent] = []
    second = Scheduler(app, broker, on_event=later.append)
    await second.start()
    try:
        await wait_until(lambda: any(e.kind == "fired" for e in later), 20, "the new leader's first tick")
    finally:
        await second.shutdown()
    fired = await drain(broker)
    ticks = covered(fired)  # a start slower than 2 s (CI load) makes ahead + 1 s a catch-up's: still covered first
    assert ticks, "the new leader fired nothing"
    assert ticks[0] == ahead + SECOND  # not one tick at or before the old leader's cursor again
    assert all(e.tick > ahead for e in later if e.kind in ("fired", "catch-up")), later


async def test_workers_prune_done_markers_older_than_the_retention(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    caplog.set_level("INFO", logger="amqpjobs.worker")
    await make_app(broker, tmp_path)
    db = tmp_path / "ledger.db"
    ledger = SqliteLedger(db, retention="1h")
    path = tmp_path / "app.toml"
    path.write_text(FAST_TOPOLOGY)
    app = App("prune", topology=load_topology(path).topology, url=broker.url, ledger=ledger, quarantine_retention="1m")
    app.job("charge", queue="work", idempotent=True)(lambda p, c: None)
    for key in ("old", "fresh"):
        assert await ledger.claim(key, "me", 60) is Claim.CLAIMED
        assert await ledger.done(key, "me") is True
    with sqlite3.connect(db) as conn:  # "old" was done 2 h ago
        conn.execute("UPDATE amqpjobs_ledger SET updated_at = ? WHERE key = 'old'", (time.time() - 7200,))
    worker = Worker(app, broker, WorkerOptions(queues=("work",)))
    await worker.start()
    try:
        await wait_until(lambda: "pruned 1 done-marker(s) older than 3600s" in caplog.text, 10, "the prune")
        assert await ledger.claim("old", "again", 60) is Claim.CLAIMED  # its marker is gone
        assert await ledger.claim("fresh", "again", 60) is Claim.DONE  # kept
    finally:
        await worker.shutdown()
        await app.close()


async def test_a_scheduler_refuses_to_start_without_its_targets_or_with_foreign_queues(
    broker: BrokerSettings, tmp_path: Path
):
    await make_app(broker, tmp_path)
    app = sec_app(broker, tmp_path)
    async with raw_channel(broker) as ch:
        await ch.queue_delete("work")
    with pytest.raises(BrokerError, match=r"work queue 'work' does not exist on .*: apply the topology first"):
        await Scheduler(app, broker).start()
    # run() (`amqpjobs schedule run`) too: its failed start's own shutdown set the stop event, so run() took it
    # for a stop request: "scheduler replica ... stopped while starting; exit 0" (helper-177)
    with pytest.raises(BrokerError, match=r"work queue 'work' does not exist on .*: apply the topology first"):
        await Scheduler(app, broker).run()
    async with raw_channel(broker) as ch:
        await ch.exchange_delete("jobs")
    with pytest.raises(BrokerError, match=r"exchange 'jobs' does not exist on .*: apply the topology first"):
        await Scheduler(app, broker).start()
    await make_app(broker, tmp_path)  # applied again
    async with raw_channel(broker) as ch:  # someone else's queue under the tick store's name
        await ch.declare_queue(cron.tick_queue("clocks", "sec"), durable=True)
    with pytest.raises(BrokerError, match=r"queue 'amqpjobs.scheduler.clocks.ticks.sec' exists with other arguments"):
        await Scheduler(app, broker).start()
    with pytest.raises(BrokerError, match=r"queue 'amqpjobs.scheduler.clocks.ticks.sec' exists with other arguments"):
        await Scheduler(app, broker).run()


async def test_a_foreign_message_in_the_tick_store_is_skipped(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    await make_app(broker, tmp_path)
    app = sec_app(broker, tmp_path)
    first = Scheduler(app, broker)
    await first.start()
    await first.shutdown()  # declares the tick store
    async with raw_channel(broker) as ch:
        await ch.default_exchange.publish(
            aio_pika.Message(b"not a record"), routing_key=cron.tick_queue("clocks", "sec")
        )
    events: list[TickEvent] = []
    second = Scheduler(app, broker, on_event=events.append)
    await second.start()
    try:
        await wait_until(lambda: any(e.kind == "fired" for e in events), 20, "a tick despite the foreign message")
    finally:
        await second.shutdown()
    assert "tick store amqpjobs.scheduler.clocks.ticks.sec holds a message that is not a tick record" in caplog.text
