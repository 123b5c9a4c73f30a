"""``amqpjobs pause`` / ``resume`` against the real broker (README "Flow control" → "Pause and resume")."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

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
from tests.integration.worker_env import Recorder, make_app

pytestmark = pytest.mark.broker


def _app_with_slow_job(app: App, starts: dict[int, list[float]], seconds: float, queue: str = "work") -> None:
    """Job ``slow`` records its start times (monotonic) by its payload's ``i``; its job id is ``job-<i>``."""

    @app.job("slow", queue=queue)
    async def slow(payload: dict[str, int], ctx: JobContext) -> None:
        starts.setdefault(payload["i"], []).append(time.monotonic())
        await asyncio.sleep(seconds)


async def _worker(app: App, broker: BrokerSettings, concurrency: int = 2,
                  queues: tuple[str, ...] = ("work",), metrics: WorkerMetrics | None = None) -> tuple[Worker, Recorder]:  # fmt: skip
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
        await rec1.wait_for(lambda _: len(_succeeded(rec1, rec2, rec3)) >= 60, timeout=30)
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
