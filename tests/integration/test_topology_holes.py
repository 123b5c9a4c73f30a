"""Holes in the topology while a worker runs: a missing quarantine or retry tier never costs a job.

Each test deletes one object the worker publishes copies to (through the management API,
as an operator would), lets jobs fail into the hole, checks that the worker says so
(readiness, ``amqpjobs status``), re-applies the topology and accounts for every job.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from amqpjobs import BrokerError, JobContext, Reject, Worker, WorkerOptions
from amqpjobs.jobs import evidence
from amqpjobs.runtime import holding
from amqpjobs.runtime.app import App
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.runtime.metrics import MetricsServer, WorkerMetrics
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import cli, depth, drain, raw_channel
from tests.integration.worker_env import Recorder, make_app

pytestmark = pytest.mark.broker

EVERY_QUEUE = ("work", "work.retry.200ms", "work.retry.400ms", "work.retry.600ms", "work.quarantine", "work.suspects")


@pytest.fixture(autouse=True)
def fast_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """Look for the missing object every 0.5 s instead of 5 s (the worker reads it when built)."""
    monkeypatch.setattr(holding, "PROBE_INTERVAL", 0.5)


def delete(broker: BrokerSettings, kind: str, name: str) -> None:
    """Delete a queue, an exchange, or (``bindings``) exchange ``name``'s binding to queue ``name`` (management API)."""
    vhost, quoted = quote(broker.vhost, safe=""), quote(name, safe="")
    path = f"/bindings/{vhost}/e/{quoted}/q/{quoted}/~" if kind == "bindings" else f"/{kind}/{vhost}/{quoted}"
    with ManagementClient(broker) as mgmt:
        mgmt.request("DELETE", path)


async def reapply(broker: BrokerSettings, tmp_path: Path) -> None:
    result = await apply_topology(tmp_path / "applied.toml", broker)
    assert result.plan.creates, "re-applying created nothing: the hole was not there"


async def wait_until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(0.05)


async def close_connections(broker: BrokerSettings) -> None:
    """Close every connection to the test vhost through the management API (its list lags a few seconds)."""
    with ManagementClient(broker) as mgmt:
        for _ in range(50):
            names = [c["name"] for c in mgmt.request("GET", "/connections") if c["vhost"] == broker.vhost]
            if names:
                for name in names:
                    mgmt.request("DELETE", f"/connections/{quote(name, safe='')}")
                return
            await asyncio.sleep(0.2)
    raise AssertionError("the management API never listed a connection to the test vhost")


async def status(broker: BrokerSettings, topology: Path) -> tuple[int, list[str]]:
    result = await asyncio.to_thread(cli, broker, "status", str(topology), "--json")
    (jq,) = json.loads(result.stdout)["job_queues"]
    return result.exit_code, jq["problems"]


def ids(prefix: str, n: int) -> list[str]:
    return [f"{prefix}-{i}" for i in range(n)]


def failing_app_job(app: App, behaviour: str, runs: dict[str, list[int]]) -> None:
    """``bad-*`` jobs raise Reject (``reject``) or fail their first attempt (``flaky``); ``ok-*`` succeed."""

    @app.job("hole", queue="work")
    async def hole(payload: dict[str, Any], ctx: JobContext) -> None:
        runs.setdefault(ctx.job_id, []).append(ctx.attempt)
        if ctx.job_id.startswith("bad"):
            if behaviour == "reject":
                raise Reject("customer unknown")
            if ctx.attempt == 1:
                raise ConnectionError("smtp blip")


@pytest.mark.parametrize(("kind", "name", "behaviour"), [
    ("queues", "work.quarantine", "reject"),
    ("exchanges", "work.quarantine", "reject"),
    ("bindings", "work.quarantine", "reject"),
    ("queues", "work.retry.200ms", "flaky"),
])  # fmt: skip
@pytest.mark.timeout(60)
async def test_a_hole_holds_failed_jobs_until_the_topology_is_back(
    broker: BrokerSettings, tmp_path: Path, kind: str, name: str, behaviour: str
) -> None:
    app = await make_app(broker, tmp_path)
    runs: dict[str, list[int]] = {}
    failing_app_job(app, behaviour, runs)
    metrics = WorkerMetrics()
    recorder = Recorder()
    worker = Worker(app, broker, WorkerOptions(queues=("work",), concurrency=4, grace=5), recorder, metrics)
    server = MetricsServer(metrics, worker.readiness, lambda: worker.heartbeat_at)
    server.start()
    await worker.start()
    bad, ok = ids("bad", 6), ids("ok", 6)
    try:
        assert worker.readiness()[0]
        delete(broker, kind, name)
        for job_id in [j for pair in zip(bad, ok, strict=True) for j in pair]:
            await app.enqueue("hole", {}, job_id=job_id)

        # the hole is found: not ready, naming it and the fix; status agrees
        await wait_until(lambda: not worker.readiness()[0], 10, "readiness to report the hole")
        r = await asyncio.to_thread(httpx.get, f"http://127.0.0.1:{server.port}/readyz", timeout=5)
        assert r.status_code == 503
        assert name in r.text, r.text
        assert "amqpjobs topology apply" in r.text
        code, problems = await status(broker, tmp_path / "applied.toml")
        assert code == 1
        what = "queue" if kind == "queues" else "exchange"
        assert any(p.startswith(f"{what} {name} ") for p in problems), problems
        await asyncio.sleep(1.0)  # held, not dropped nor dead-lettered meanwhile
        assert not any(o.kind == "quarantined" for o in recorder.outcomes)

        await reapply(broker, tmp_path)
        if behaviour == "reject":
            done = lambda o: sum(x.kind in ("succeeded", "quarantined") for x in o) == 12  # noqa: E731
        else:
            done = lambda o: sum(x.kind == "succeeded" for x in o) == 12  # noqa: E731
        await recorder.wait_for(done, timeout=20)
        await wait_until(lambda: worker.readiness()[0], 5, "readiness after the re-apply")
    finally:
        await worker.shutdown()
        server.stop()
        await app.close()

    kinds = [o.kind for o in recorder.outcomes]
    assert "abandoned" not in kinds, kinds
    assert "redelivered" not in kinds, kinds
    msgs = await drain(broker, "work.quarantine")
    if behaviour == "reject":
        assert sorted(m.message_id or "" for m in msgs) == bad
        for m in msgs:
            h: dict[str, Any] = dict(m.headers)
            assert (h[evidence.REASON], h[evidence.ATTEMPTS]) == ("rejected", 1)
            assert "x-death" not in h  # our copy with evidence, not a broker dead-letter
        assert runs == {j: [1] for j in bad + ok}
    else:
        assert msgs == []
        assert runs == {**{j: [1, 2] for j in bad}, **{j: [1] for j in ok}}
    for queue in EVERY_QUEUE:
        assert await depth(broker, queue) == 0, queue


async def test_a_worker_refuses_to_start_without_its_quarantine_exchange(broker: BrokerSettings, tmp_path: Path):
    app = await make_app(broker, tmp_path)
    app.job("x", queue="work")(lambda p, c: None)
    delete(broker, "exchanges", "work.quarantine")
    worker = Worker(app, broker, WorkerOptions(queues=("work",)))
    try:
        with pytest.raises(BrokerError, match=r"exchange\(s\) work\.quarantine do not exist"):
            await worker.start()
    finally:
        await worker.shutdown()


async def test_sigterm_while_holding_returns_the_delivery_to_its_queue(broker: BrokerSettings, tmp_path: Path):
    app = await make_app(broker, tmp_path)
    runs: dict[str, list[int]] = {}
    failing_app_job(app, "reject", runs)
    worker = Worker(app, broker, WorkerOptions(queues=("work",), grace=1))
    await worker.start()
    try:
        delete(broker, "queues", "work.quarantine")
        await app.enqueue("hole", {}, job_id="bad-0")
        await wait_until(lambda: not worker.readiness()[0], 10, "readiness to report the hole")
    finally:
        started = time.monotonic()
        code = await worker.shutdown()
    assert code == 1  # abandoned after the grace period
    assert 1.0 <= time.monotonic() - started < 4
    assert await depth(broker, "work") == 1  # back in its queue, not dropped

    await reapply(broker, tmp_path)
    recorder = Recorder()
    again = Worker(app, broker, WorkerOptions(queues=("work",)), recorder)
    await again.start()
    try:
        await recorder.wait_for(lambda o: any(x.kind == "quarantined" for x in o), timeout=15)
    finally:
        await again.shutdown()
        await app.close()
    (msg,) = await drain(broker, "work.quarantine")
    assert msg.message_id == "bad-0"
    for queue in EVERY_QUEUE:
        assert await depth(broker, queue) == 0, queue


@pytest.mark.timeout(60)
async def test_a_held_delivery_whose_connection_dies_comes_back(broker: BrokerSettings, tmp_path: Path):
    app = await make_app(broker, tmp_path)
    runs: dict[str, list[int]] = {}
    failing_app_job(app, "reject", runs)
    recorder = Recorder()
    worker = Worker(app, broker, WorkerOptions(queues=("work",), concurrency=2), recorder)
    await worker.start()
    try:
        delete(broker, "queues", "work.quarantine")
        for job_id in ("bad-0", "bad-1"):
            await app.enqueue("hole", {}, job_id=job_id)
        await wait_until(lambda: not worker.readiness()[0], 10, "readiness to report the hole")
        await close_connections(broker)
        # the held deliveries went back to the broker with their channel; once the worker is back they are
        # redelivered, run again, and held again while the quarantine is still missing (how long the reconnect
        # takes is the broker's and the load's: 0.25 s to 4 s seen, so no fixed sleep)
        await recorder.wait_for(lambda o: [x.kind for x in o].count("abandoned") == 2, timeout=20)
        await recorder.wait_for(lambda o: [x.kind for x in o].count("redelivered") >= 1, timeout=20)
        await wait_until(lambda: "work.quarantine missing" in worker.readiness()[1], 20, "the hole reported again")
        assert not worker.readiness()[0]
        await reapply(broker, tmp_path)
        await recorder.wait_for(lambda o: sum(x.kind == "quarantined" for x in o) == 2, timeout=30)
    finally:
        await worker.shutdown()
        await app.close()
    msgs = await drain(broker, "work.quarantine")
    assert sorted(m.message_id or "" for m in msgs) == ["bad-0", "bad-1"]
    for queue in EVERY_QUEUE:
        assert await depth(broker, queue) == 0, queue


async def test_a_redelivery_with_no_suspects_queue_is_held_then_registered(broker: BrokerSettings, tmp_path: Path):
    app = await make_app(broker, tmp_path)
    runs: dict[str, list[int]] = {}
    failing_app_job(app, "flaky", runs)
    await app.enqueue("hole", {}, job_id="ok-0")
    recorder = Recorder()
    worker = Worker(app, broker, WorkerOptions(queues=("work",)), recorder)
    async with raw_channel(broker) as ch:  # takes the job unacked; closing the channel makes it a redelivery
        taken = await (await ch.get_queue("work", ensure=False)).get(fail=True)
        assert taken.message_id == "ok-0"
        await worker.start()
        delete(broker, "queues", "work.suspects")
    try:
        await wait_until(lambda: "work.suspects" in worker.readiness()[1], 10, "readiness to report the hole")
        await reapply(broker, tmp_path)
        await recorder.wait_for(lambda o: any(x.kind == "succeeded" for x in o), timeout=15)
    finally:
        await worker.shutdown()
        await app.close()
    assert [o.kind for o in recorder.outcomes] == ["redelivered", "succeeded"]
    assert runs == {"ok-0": [1]}
    for queue in EVERY_QUEUE:
        assert await depth(broker, queue) == 0, queue


async def test_an_idle_worker_reports_a_missing_suspects_queue_once(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    app = await make_app(broker, tmp_path)
    worker = Worker(app, broker, WorkerOptions(queues=("work",)))
    await worker.start()
    try:
        with caplog.at_level(logging.ERROR, logger="amqpjobs.worker"):
            delete(broker, "queues", "work.suspects")
            await wait_until(lambda: "work.suspects" in worker.readiness()[1], 10, "readiness to report it")
            await asyncio.sleep(2.5)
        missing = [r for r in caplog.records if "suspects queue work.suspects is missing" in r.getMessage()]
        assert len(missing) == 1
        await reapply(broker, tmp_path)
        await wait_until(lambda: worker.readiness()[0], 15, "readiness once it is back")
    finally:
        await worker.shutdown()
        await app.close()


@pytest.mark.timeout(60)
async def test_a_work_queue_deleted_under_the_worker_is_named_with_its_fix(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """The broker cancels the consumer; consuming again fails every second until the queue is back.

    Before: one line "the broker cancelled the consumer on work ...; consuming again", then
    nothing while every attempt failed (404), and /readyz said only "1 of 1 consumer(s) not
    consuming", while the broker dropped each retry its tiers dead-lettered back into the
    missing queue.
    """
    app = await make_app(broker, tmp_path)
    recorder = Recorder()
    app.job("x", queue="work")(lambda p, c: None)
    worker = Worker(app, broker, WorkerOptions(queues=("work",)), recorder)
    await worker.start()
    caplog.set_level(logging.WARNING)
    try:
        delete(broker, "queues", "work")
        await wait_until(lambda: any("does not exist" in r.getMessage() for r in caplog.records), 10, "the warning")
        (said,) = [r.getMessage() for r in caplog.records if "does not exist" in r.getMessage()]
        assert said.startswith("work queue 'work' does not exist"), said
        assert "the broker drops every retry its delay tiers dead-letter back into it" in said, said
        assert "amqpjobs topology apply" in said, said
        ready, reason = worker.readiness()
        assert not ready
        assert "work queue(s) work missing" in reason, reason
        assert "amqpjobs topology apply" in reason, reason

        await reapply(broker, tmp_path)
        await wait_until(lambda: worker.readiness()[0], 10, "the worker to consume again")
        await app.enqueue("x", {}, job_id="after")
        await recorder.wait_for(lambda o: any(x.job_id == "after" for x in o), timeout=10)
    finally:
        await worker.shutdown()
        await app.close()
