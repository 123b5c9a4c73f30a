"""``amqpjobs pause`` / ``resume`` against the real broker (README "Flow control" → "Pause and resume")."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from amqpjobs.jobs.registry import JobContext
from amqpjobs.runtime.app import App
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.runtime.metrics import WorkerMetrics
from amqpjobs.runtime.pausing import pause, resume
from amqpjobs.runtime.worker import Worker, WorkerOptions
from amqpjobs.topology.loader import load_topology
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import cli
from tests.integration.test_consumer import SHARDED
from tests.integration.worker_env import Recorder, make_app

pytestmark = pytest.mark.broker


def _app_with_slow_job(app: App, starts: dict[int, list[float]], seconds: float, queue: str = "work") -> None:
    """Job ``slow`` records its start times (monotonic) by its payload's ``i``; its job id is ``job-<i>``."""

    @app.job("slow", queue=queue)
    async def slow(payload: dict[str, int], ctx: JobContext) -> None:
        starts.setdefault(payload["i"], []).append(time.monotonic())
        await asyncio.sleep(seconds)


async def _worker(
    app: App, broker: BrokerSettings, concurrency: int = 2, queues: tuple[str, ...] = ("work",),
    metrics: WorkerMetrics | None = None,
) -> tuple[Worker, Recorder]:  # fmt: skip
    recorder = Recorder()
    worker = Worker(app, broker, WorkerOptions(queues=queues, concurrency=concurrency, grace=10), recorder, metrics)
    await worker.start()
    return worker, recorder


def _succeeded(*recorders: Recorder) -> list[Any]:
    return [o for r in recorders for o in r.outcomes if o.kind == "succeeded"]


@pytest.mark.serial
async def test_pause_stops_starts_within_1s_on_two_workers_a_new_one_starts_nothing_resume_runs_all(
    broker: BrokerSettings, tmp_path: Path
):
    app = await make_app(broker, tmp_path)
    starts: dict[int, list[float]] = {}
    _app_with_slow_job(app, starts, 0.3)
    metrics = WorkerMetrics()
    one, rec1 = await _worker(app, broker, metrics=metrics)
    two, rec2 = await _worker(app, broker)
    new: Worker | None = None
    try:
        for i in range(60):
            await app.enqueue("slow", {"i": i}, job_id=f"job-{i}")
        while len(starts) < 6:  # both workers busy, jobs running when the pause comes
            await asyncio.sleep(0.01)
        running_at_pause = {i for i, s in starts.items() if s[-1] > time.monotonic() - 0.3}
        await pause(broker, "work", "deploy of the mailer")
        returned = time.monotonic()
        await asyncio.sleep(2.0)
        late = sorted(s - returned for ss in starts.values() for s in ss if s > returned + 1.0)
        assert late == [], f"starts more than 1.0 s after pause returned: {late}"
        # the jobs running when the pause came finished and were acked (not abandoned)
        done = {o.job_id: o for o in _succeeded(rec1, rec2)}
        assert running_at_pause
        assert all(done[f"job-{i}"].acked for i in running_at_pause)
        assert metrics.sample("amqpjobs_paused", {"queue": "work", "reason": "deploy of the mailer"}) == 1
        assert metrics.sample("amqpjobs_paused_since_seconds", {"queue": "work"}) > time.time() - 60
        before_new = sum(len(s) for s in starts.values())
        new, rec3 = await _worker(app, broker)  # started while paused: starts nothing in 5 s
        await asyncio.sleep(5.0)
        assert sum(len(s) for s in starts.values()) == before_new
        assert not _succeeded(rec3)
        ran_before = len(done)
        assert ran_before < 60
        assert await resume(broker, "work") is True
        deadline = time.monotonic() + 30
        while len(_succeeded(rec1, rec2, rec3)) < 60:  # three recorders: poll (each waits on its own event)
            assert time.monotonic() < deadline, len(_succeeded(rec1, rec2, rec3))
            await asyncio.sleep(0.05)
        assert metrics.sample("amqpjobs_paused", {"queue": "work", "reason": ""}) == 0
    finally:
        for w in (one, two, new):
            if w is not None:
                await w.shutdown()
        await app.close()
    assert sorted(o.job_id for o in _succeeded(rec1, rec2, rec3)) == sorted(f"job-{i}" for i in range(60))
    assert sorted(starts) == list(range(60))  # every job ran, each once
    assert all(len(s) == 1 for s in starts.values())
    kinds = {o.kind for r in (rec1, rec2, rec3) for o in r.outcomes}
    assert kinds <= {"succeeded", "handed_back"}  # nothing counted toward the crash bound, nothing quarantined


async def _cut_worker_connection(broker: BrokerSettings, connection_name: str) -> None:
    """Close the worker's consuming connection from the broker side (management API DELETE /api/connections)."""

    def cut() -> None:
        with ManagementClient(broker) as mgmt:
            deadline = time.monotonic() + 15
            while True:  # the management API lists a new connection within its stats interval
                listed = mgmt.request("GET", f"/vhosts/{quote(broker.vhost, safe='')}/connections") or []
                names = [c["name"] for c in listed
                         if (c.get("client_properties") or {}).get("connection_name") == connection_name]  # fmt: skip
                if names:
                    break
                assert time.monotonic() < deadline, f"connection {connection_name} never listed"
                time.sleep(0.2)
            for name in names:
                mgmt.request("DELETE", f"/connections/{quote(name, safe='')}")

    await asyncio.to_thread(cut)


async def _reconnected(worker: Worker) -> None:
    deadline = time.monotonic() + 30
    await asyncio.sleep(0.5)
    while not worker.readiness()[0]:
        assert time.monotonic() < deadline, worker.readiness()
        await asyncio.sleep(0.1)


async def test_a_worker_reconnected_while_paused_starts_nothing_until_resume(broker: BrokerSettings, tmp_path: Path):
    """Paused while its connection was down (the signal went nowhere), and cut again while paused:
    after each reconnect it reads the flag and starts nothing; resume runs every job."""
    app = await make_app(broker, tmp_path)
    starts: dict[int, list[float]] = {}
    _app_with_slow_job(app, starts, 0.01)
    worker, rec = await _worker(app, broker)
    try:
        await _cut_worker_connection(broker, f"{app.name}-worker")
        await pause(broker, "work", "while it was away")
        await _reconnected(worker)
        for i in range(10):
            await app.enqueue("slow", {"i": i}, job_id=f"job-{i}")
        await asyncio.sleep(2.0)
        assert starts == {}
        await _cut_worker_connection(broker, f"{app.name}-worker")  # again, now that it knows
        await _reconnected(worker)
        await asyncio.sleep(1.5)
        assert starts == {}
        assert await resume(broker, "work") is True
        await rec.wait_for(lambda _: len(_succeeded(rec)) >= 10, timeout=30)
    finally:
        await worker.shutdown()
        await app.close()
    assert sorted(starts) == list(range(10))
    assert {o.kind for o in rec.outcomes} <= {"succeeded", "handed_back"}


async def test_pause_covers_every_shard_of_a_sharded_job_queue(broker: BrokerSettings, tmp_path: Path):
    path = tmp_path / "s.toml"
    path.write_text(SHARDED)
    await apply_topology(path, broker)
    app = App("split", topology=load_topology(path).topology, url=broker.url)
    starts: dict[int, list[float]] = {}
    _app_with_slow_job(app, starts, 0.01, queue="split")
    await pause(broker, "split", "")
    worker, rec = await _worker(app, broker, concurrency=2, queues=("split",))
    try:
        for i in range(20):  # tenants spread them over both shards
            await app.enqueue("slow", {"i": i}, job_id=f"job-{i}", tenant=f"t{i}")
        await asyncio.sleep(2.0)
        assert starts == {}
        report = json.loads((await asyncio.to_thread(cli, broker, "status", "--queues", "split", "--json")).output)
        (split,) = report["job_queues"]
        assert split["paused"]["reason"] == ""
        assert not [p for p in split["problems"] if "takes from" in p]  # paused: no consumer is no problem
        assert await resume(broker, "split") is True
        await rec.wait_for(lambda _: len(_succeeded(rec)) >= 20, timeout=30)
    finally:
        await worker.shutdown()
        await app.close()
    assert sorted(starts) == list(range(20))


async def test_cli_pause_resume_status_and_errors(broker: BrokerSettings, tmp_path: Path):
    app = await make_app(broker, tmp_path)
    await app.close()

    def run(*args: str) -> Any:
        return cli(broker, *args)

    unknown = await asyncio.to_thread(run, "pause", "nope")
    assert unknown.exit_code == 2
    assert "no job queue 'nope'" in unknown.output
    assert "its job queues: work" in unknown.output
    assert "Traceback" not in unknown.output
    shard = await asyncio.to_thread(run, "resume", "work.quarantine")
    assert shard.exit_code == 2, shard.output
    assert "give that name" in shard.output
    assert "('work.quarantine' is a quarantine queue of job queue 'work': give that name)" in shard.output
    missing = await asyncio.to_thread(run, "resume", "work.shard-0")  # 'work' is not sharded: no such queue
    assert missing.exit_code == 2, missing.output
    assert "is a shard queue" not in missing.output
    assert "(job queue 'work' has no queue 'work.shard-0': give 'work')" in missing.output

    not_paused = await asyncio.to_thread(run, "resume", "work")
    assert not_paused.exit_code == 0, not_paused.output
    assert "was not paused: nothing to do" in not_paused.output

    first = await asyncio.to_thread(run, "pause", "work", "--reason", "first")
    assert first.exit_code == 0, first.output
    assert "paused job queue work since" in first.output
    assert "first" in first.output
    again = await asyncio.to_thread(run, "pause", "work", "--reason", "second\x1b[31m")  # reason updated
    assert again.exit_code == 0, again.output
    doc = json.loads((await asyncio.to_thread(run, "status", "--queues", "work", "--json")).output)
    paused = doc["job_queues"][0]["paused"]
    assert paused["reason"] == "second\\x1b[31m"  # control characters escaped
    assert time.time() - time.mktime(time.strptime(paused["since"], "%Y-%m-%dT%H:%M:%SZ")) < 3600 * 24
    text = (await asyncio.to_thread(run, "status", "--queues", "work")).output
    assert "note work: paused since " in text
    assert "reason: second" in text
    assert "amqpjobs resume work" in text

    plan = await asyncio.to_thread(run, "topology", "plan", str(tmp_path / "applied.toml"))  # flag present
    assert plan.exit_code == 0, plan.output
    assert "ORPHAN" not in plan.output
    assert "paused" not in plan.output
    assert "control" not in plan.output

    resumed = await asyncio.to_thread(run, "resume", "work")
    assert resumed.exit_code == 0
    assert "resumed job queue work" in resumed.output
    doc = json.loads((await asyncio.to_thread(run, "status", "--queues", "work", "--json")).output)
    assert doc["job_queues"][0]["paused"] is None
