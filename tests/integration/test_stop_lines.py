"""A stopping worker's lines agree about every delivery it held at SIGTERM (real broker).

A delivery held but not started at the stop (the look-ahead waiting for a running slot, a
delivery waiting for its idempotency claim, one whose copy can't be published yet) is no
running job: the draining line does not count it, the grace warning does not call it
running, and the last line says what became of it.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aio_pika
import pytest

from amqpjobs import App, JobContext, Reject, Worker, WorkerOptions
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.runtime.dispatch import ShardDispatcher
from amqpjobs.runtime.ledger import SqliteLedger
from amqpjobs.topology.loader import load_topology
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import depth, drain, raw_channel
from tests.integration.worker_env import Recorder, make_app

pytestmark = pytest.mark.broker

SHARDED = """
[[exchange]]
name = "jobs"

[[job_queue]]
name = "sharded"
exchange = "jobs"
shards = 2
retry_tiers = ["1s"]
"""


def stop_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The worker's lines from the stop on: draining, the grace warning (if any), stopped."""
    lines = [r.getMessage() for r in caplog.records if r.name == "amqpjobs.worker"]
    return [line for line in lines if line.startswith(("draining", "worker stopped")) or "grace period" in line]


async def until(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


async def started_worker(
    app: App, broker: BrokerSettings, queues: tuple[str, ...], *, concurrency: int, grace: int
) -> Worker:
    """A worker of ``queues`` (``grace`` seconds), its outcomes recorded, started."""
    worker = Worker(app, broker, WorkerOptions(queues=queues, concurrency=concurrency, grace=grace), Recorder())
    await worker.start()
    return worker


def delete_quarantine_exchange(broker: BrokerSettings) -> None:
    """Delete exchange ``work.quarantine`` under a running worker (it does not start without it): the worker then
    holds a delivery whose quarantine copy can't go (README "Workers")."""
    with ManagementClient(broker) as mgmt:
        mgmt.request("DELETE", f"/exchanges/{quote(broker.vhost, safe='')}/{quote('work.quarantine', safe='')}")


@pytest.mark.timeout(60)
async def test_a_look_ahead_delivery_at_sigterm_is_handed_back_unstarted_and_runs_once_later(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """One slot on a sharded queue: a long job runs and the look-ahead waits for the slot at SIGTERM."""
    path = tmp_path / "sharded.toml"
    path.write_text(SHARDED)
    await apply_topology(path, broker)
    runs: list[tuple[str, bool]] = []
    began = asyncio.Event()
    app = App("look", topology=load_topology(path).topology, url=broker.url)

    @app.job("sleep", queue="sharded")
    async def sleep(payload: dict[str, Any], ctx: JobContext) -> None:
        if payload["s"] > 0.5:
            began.set()
        await asyncio.sleep(payload["s"])
        runs.append((ctx.job_id, ctx.redelivered))

    tenant = "t0"  # every job on one shard, in order
    caplog.set_level("INFO", logger="amqpjobs.worker")
    worker = await started_worker(app, broker, ("sharded",), concurrency=1, grace=10)
    try:
        for i in range(20):  # short jobs: the dispatcher takes a look-ahead delivery
            await app.enqueue("sleep", {"s": 0.001}, job_id=f"short-{i}", tenant=tenant)
        await until(lambda: len(runs) == 20, 20, "the short jobs")
        await app.enqueue("sleep", {"s": 1.5}, job_id="long", tenant=tenant)
        await app.enqueue("sleep", {"s": 0.001}, job_id="ahead", tenant=tenant)
        await asyncio.wait_for(began.wait(), 10)
        [dispatcher] = [c for c in worker._consumers if isinstance(c, ShardDispatcher)]
        await until(lambda: dispatcher.waiting == 1, 5, "the look-ahead delivery to wait for the slot")
        caplog.clear()
        worker.request_stop()
    finally:
        code = await worker.shutdown()
    assert code == 0
    assert stop_lines(caplog) == [
        "draining 1 in-flight job(s), grace 10s",
        "worker stopped: 1 in-flight job(s) finished, 0 abandoned (redelivered), 1 handed back unstarted; exit 0",
    ]
    assert [r for r in runs if r[0] in ("long", "ahead")] == [("long", False)]
    later = Worker(app, broker, WorkerOptions(queues=("sharded",), concurrency=1, grace=10), Recorder())
    await later.start()
    try:
        await until(lambda: any(job == "ahead" for job, _ in runs), 10, "the handed-back job to run")
        await asyncio.sleep(0.5)  # a second run would come by now
    finally:
        await later.shutdown()
        await app.close()
    assert [r for r in runs if r[0] == "ahead"] == [("ahead", False)]  # once, and never taken for a crash start


@pytest.mark.timeout(60)
async def test_a_delivery_waiting_for_its_idempotency_claim_at_sigterm_is_handed_back_unstarted(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """Two slots: job 'hold' writes in its ledger transaction (SQLite's write lock), so the claim of
    'waiter' waits; SIGTERM comes meanwhile. The waiter never started: handed back, not drained."""
    base = await make_app(broker, tmp_path)
    ledger_path = tmp_path / "ledger.db"
    with sqlite3.connect(ledger_path) as db:
        db.execute("CREATE TABLE effects (job_id TEXT NOT NULL)")
    runs: list[tuple[str, bool]] = []
    inside, lock = threading.Event(), threading.Lock()

    def build() -> App:
        app = App("claims", topology=base.topology(), url=broker.url, ledger=SqliteLedger(ledger_path))

        @app.job("hold", queue="work", idempotent=True)
        def hold(payload: dict[str, Any], ctx: JobContext) -> None:
            with ctx.transaction() as tx:
                tx.execute("INSERT INTO effects (job_id) VALUES (?)", (ctx.job_id,))
                inside.set()
                time.sleep(1.5)  # the ledger's write lock is held: another claim waits for it
            with lock:
                runs.append((ctx.job_id, ctx.redelivered))

        @app.job("waiter", queue="work", idempotent=True)
        def waiter(payload: dict[str, Any], ctx: JobContext) -> None:
            with ctx.transaction() as tx:
                tx.execute("INSERT INTO effects (job_id) VALUES (?)", (ctx.job_id,))
            with lock:
                runs.append((ctx.job_id, ctx.redelivered))

        return app

    app = build()
    caplog.set_level("INFO", logger="amqpjobs.worker")
    worker = await started_worker(app, broker, ("work",), concurrency=2, grace=10)
    try:
        await app.enqueue("hold", {}, job_id="hold-1")
        await asyncio.wait_for(asyncio.to_thread(inside.wait, 10), 11)
        await app.enqueue("waiter", {}, job_id="waiter-1")
        await until(lambda: len(worker._inflight) == 2, 5, "the waiter's delivery")
        await asyncio.sleep(0.3)  # its claim waits for the ledger's write lock
        caplog.clear()
        worker.request_stop()
    finally:
        code = await worker.shutdown()
        await app.close()
    assert code == 0
    assert stop_lines(caplog) == [
        "draining 1 in-flight job(s), grace 10s",
        "worker stopped: 1 in-flight job(s) finished, 0 abandoned (redelivered), 1 handed back unstarted; exit 0",
    ]
    assert runs == [("hold-1", False)]
    again = build()
    later = Worker(again, broker, WorkerOptions(queues=("work",), concurrency=2, grace=10), Recorder())
    await later.start()
    try:
        await until(lambda: any(job == "waiter-1" for job, _ in runs), 10, "the handed-back job to run")
        await asyncio.sleep(0.5)
    finally:
        await later.shutdown()
        await again.close()
    assert runs == [("hold-1", False), ("waiter-1", False)]  # each once; the waiter no crash start
    with sqlite3.connect(ledger_path) as db:
        assert sorted(r[0] for r in db.execute("SELECT job_id FROM effects")) == ["hold-1", "waiter-1"]


@pytest.mark.timeout(60)
async def test_a_held_delivery_never_started_is_not_called_a_running_job_at_the_stop(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """A delivery of a job the app does not serve goes to quarantine; its exchange was deleted, so the
    worker holds it (README "Workers"). At SIGTERM it gets the grace, then returns to its queue."""
    app = await make_app(broker, tmp_path)
    caplog.set_level("INFO", logger="amqpjobs.worker")
    worker = await started_worker(app, broker, ("work",), concurrency=1, grace=1)
    try:
        delete_quarantine_exchange(broker)
        async with raw_channel(broker) as ch:
            await ch.default_exchange.publish(aio_pika.Message(b"{}", message_id="stray-1", type="nobody"), "work")
        await until(lambda: worker._holding.count == 1, 10, "the stray delivery to be held")
        caplog.clear()
        worker.request_stop()
    finally:
        code = await worker.shutdown()
        await app.close()
    assert code == 1
    assert stop_lines(caplog) == [
        "draining: no job in flight; 1 held delivery (never started: its copy can't be published yet) waits up "
        "to the grace of 1s",
        "1 held delivery (never started) still held after the grace period; it returns to its queue (redelivered)",
        "worker stopped: 0 in-flight job(s) finished, 0 abandoned (redelivered), 1 held delivery returned to its "
        "queue unstarted (redelivered); exit 1",
    ]
    back = await drain(broker, "work")
    assert [(m.message_id, m.redelivered) for m in back] == [("stray-1", True)]
    assert await depth(broker, "work") == 0


@pytest.mark.timeout(60)
async def test_a_held_delivery_whose_handler_ran_is_named_apart_from_running_jobs_at_the_stop(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """Review held11: job 'rej' writes its effect and raises Reject; work.quarantine was deleted, so its
    quarantine copy can't go and the worker holds the delivery. Its handler finished and it has an
    outcome: at SIGTERM it is no running job (nor one never started); 'slow' runs and finishes."""
    app = await make_app(broker, tmp_path)
    effects: list[str] = []
    began = asyncio.Event()

    @app.job("rej", queue="work")
    async def rej(payload: dict[str, Any], ctx: JobContext) -> None:
        effects.append(ctx.job_id)
        raise Reject("no")

    @app.job("slow", queue="work")
    async def slow(payload: dict[str, Any], ctx: JobContext) -> None:
        began.set()
        await asyncio.sleep(2.0)
        effects.append(ctx.job_id)

    caplog.set_level("INFO", logger="amqpjobs.worker")
    worker = await started_worker(app, broker, ("work",), concurrency=2, grace=3)
    try:
        delete_quarantine_exchange(broker)
        await app.enqueue("slow", {}, job_id="slow-1")  # first: the work queue is not consumed while one is held
        await asyncio.wait_for(began.wait(), 10)
        await app.enqueue("rej", {}, job_id="rej-1")
        await until(lambda: worker._holding.count == 1, 10, "the rejected job's delivery to be held")
        caplog.clear()
        worker.request_stop()
    finally:
        code = await worker.shutdown()
        await app.close()
    assert code == 1
    assert stop_lines(caplog) == [
        "draining 1 in-flight job(s), grace 3s; 1 held delivery (ran; its outcome 'quarantine' waits for "
        "work.quarantine) waits up to the grace of 3s",
        "1 held delivery (ran; its outcome 'quarantine' waits for work.quarantine) still held after the grace "
        "period; it returns to its queue with its outcome kept (not run again)",
        "worker stopped: 1 in-flight job(s) finished, 0 abandoned (redelivered), 1 held delivery (ran) returned to "
        "its queue with its outcome kept (not run again); exit 1",
    ]
    assert effects == ["rej-1", "slow-1"]  # rej's handler ran once, before the stop
    lines = [r.getMessage() for r in caplog.records if r.name == "amqpjobs.worker"]
    assert "no delivery of work is held any more" not in lines  # it is not released: it goes back to its queue
    back = await drain(broker, "work")  # a copy marked with its decision (the original acked), no redelivery
    assert [(m.message_id, m.redelivered, str(m.headers.get("amqpjobs-decided"))) for m in back] == [
        ("rej-1", False, "quarantine")
    ]


@pytest.mark.timeout(90)
async def test_a_held_delivery_whose_handler_ran_is_not_run_again_after_the_restart(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """Review held11: 'rej' writes its effect and raises Reject; its quarantine copy is held (work.quarantine
    deleted) until the stop's grace is over. After ``topology apply`` and a restart the decided quarantine
    is carried out without running the handler again (effects 1; was 2: a plain redelivery, run as start 2)."""
    app = await make_app(broker, tmp_path)
    effects: list[tuple[str, bool]] = []

    @app.job("rej", queue="work")
    async def rej(payload: dict[str, Any], ctx: JobContext) -> None:
        effects.append((ctx.job_id, ctx.redelivered))
        raise Reject("no")

    caplog.set_level("INFO", logger="amqpjobs.worker")
    worker = await started_worker(app, broker, ("work",), concurrency=1, grace=1)
    try:
        delete_quarantine_exchange(broker)
        await app.enqueue("rej", {}, job_id="rej-1")
        await until(lambda: worker._holding.count == 1, 10, "the rejected job's delivery to be held")
        worker.request_stop()
    finally:
        assert await worker.shutdown() == 1
    await apply_topology(tmp_path / "applied.toml", broker)
    caplog.clear()
    recorder = Recorder()
    later = Worker(app, broker, WorkerOptions(queues=("work",), concurrency=1, grace=1), recorder)
    await later.start()
    try:
        await recorder.wait_for(lambda outs: any(o.kind == "quarantined" for o in outs), 30)
        await asyncio.sleep(0.5)
    finally:
        await later.shutdown()
        await app.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "amqpjobs.worker"]
    assert [m.headers.get("amqpjobs-reason") for m in await drain(broker, "work.quarantine")] == ["rejected"]
    assert effects == [("rej-1", False)]  # ran once: its decided quarantine carried out, not run again
    assert not [line for line in lines if "ended without an outcome" in line]


TWO_QUEUES = """
[[exchange]]
name = "jobs"

[[job_queue]]
name = "first"
exchange = "jobs"

[[job_queue]]
name = "second"
exchange = "jobs"
"""


@pytest.mark.version_independent
async def test_a_stop_while_the_start_goes_on_still_drains_and_says_so_for_jobs_already_running(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
):
    """SIGTERM after the first queue's consumer took a job, before the start is over (here: the second
    queue's consumer held back): the job finishes and is acked, and the draining and stopped lines
    count it (was: both left out, as for a worker that never consumed; CI saw it when a start step
    awaited the management API)."""
    path = tmp_path / "two.toml"
    path.write_text(TWO_QUEUES)
    await apply_topology(path, broker)
    app = App("midstart", topology=load_topology(path).topology, url=broker.url)
    runs: list[str] = []
    began = asyncio.Event()

    @app.job("long", queue="first")
    async def long(payload: dict[str, Any], ctx: JobContext) -> None:
        began.set()
        await asyncio.sleep(1.0)
        runs.append(ctx.job_id)

    @app.job("other", queue="second")  # a worker consumes only job queues its app serves jobs from
    async def other(payload: dict[str, Any], ctx: JobContext) -> None:
        return None

    real = Worker._start_consumer
    never = asyncio.Event()

    async def held_back(worker: Worker, layout: Any, work_queue: str) -> None:
        if work_queue == "second":
            await never.wait()  # the start is still going on at the stop
        await real(worker, layout, work_queue)

    monkeypatch.setattr(Worker, "_start_consumer", held_back)
    await app.enqueue("long", {}, job_id="j1")
    caplog.set_level("INFO", logger="amqpjobs.worker")
    worker = Worker(app, broker, WorkerOptions(queues=("first", "second"), concurrency=2, grace=10), Recorder())
    running = asyncio.create_task(worker.run())
    try:
        await asyncio.wait_for(began.wait(), 15)
        assert not worker.ready.is_set()
        worker.request_stop()
        code = await asyncio.wait_for(running, 20)
    finally:
        await app.close()
    assert code == 0
    assert runs == ["j1"]
    assert stop_lines(caplog) == [
        "draining 1 in-flight job(s), grace 10s",
        "worker stopped: 1 in-flight job(s) finished, 0 abandoned (redelivered); exit 0",
    ]
    assert await depth(broker, "first") == 0  # acked: not back in its queue
