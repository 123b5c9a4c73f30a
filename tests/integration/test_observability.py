"""Metrics, health endpoints and `amqpjobs status` against the real broker."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aio_pika
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from amqpjobs import JobContext, Reject, Worker, WorkerOptions
from amqpjobs.runtime.metrics import MetricsServer, WorkerMetrics
from amqpjobs.wire.settings import BrokerSettings
from tests.conftest import BrokerRoot
from tests.integration.helpers import cli, raw_channel
from tests.integration.worker_env import APPLIED_TOPOLOGY, Recorder, make_app

pytestmark = pytest.mark.broker


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


async def test_scraped_counters_equal_a_known_workload(broker: BrokerSettings, tmp_path: Path):
    app = await make_app(broker, tmp_path)

    @app.job("obs", queue="work")
    async def obs(payload: dict[str, Any], ctx: JobContext) -> None:
        if payload["kind"] == "flaky" and ctx.attempt == 1:
            raise ConnectionError("blip")
        if payload["kind"] == "bad":
            raise Reject("no")

    metrics = WorkerMetrics()
    recorder = Recorder()
    worker = Worker(app, broker, WorkerOptions(queues=("work",), concurrency=4), recorder, metrics=metrics)
    server = MetricsServer(metrics, worker.readiness, lambda: worker.heartbeat_at)
    server.start()
    await worker.start()
    try:
        for kind, n in (("ok", 100), ("flaky", 10), ("bad", 5)):
            for _ in range(n):
                await app.enqueue("obs", {"kind": kind})
        await recorder.wait_for(lambda o: len(o) >= 125, timeout=60)
        await asyncio.sleep(0.3)
        samples = await asyncio.to_thread(scrape, server.port)
    finally:
        await worker.shutdown()
        server.stop()
        await app.close()

    def value(name: str, **labels: str) -> float:
        return samples.get((name, tuple(sorted(labels.items()))), 0.0)

    assert value("amqpjobs_jobs_total", job="obs", queue="work", outcome="succeeded") == 110
    assert value("amqpjobs_jobs_total", job="obs", queue="work", outcome="retried") == 10
    assert value("amqpjobs_jobs_total", job="obs", queue="work", outcome="quarantined") == 5
    assert value("amqpjobs_jobs_total", job="obs", queue="work", outcome="abandoned") == 0
    # queue latency: once per job, at its first start (115 jobs)
    assert value("amqpjobs_queue_latency_seconds_count", job="obs", queue="work") == 115
    # handler duration: every run (100 + 10 x 2 + 5)
    assert value("amqpjobs_job_duration_seconds_count", job="obs", queue="work") == 125
    # publisher confirms: 10 retry copies + 5 quarantine copies
    assert value("amqpjobs_publish_confirm_seconds_count") == 15
    assert value("amqpjobs_in_flight", queue="work") == 0
    assert not any(dict(labels).get("job_id") or dict(labels).get("tenant") for _, labels in samples)


async def test_health_endpoints(broker: BrokerSettings, tmp_path: Path):
    app = await make_app(broker, tmp_path)

    @app.job("block", queue="work")
    async def block(payload: dict[str, Any], ctx: JobContext) -> None:
        time.sleep(3)  # blocks the event loop on purpose  # noqa: ASYNC251

    metrics = WorkerMetrics()
    worker = Worker(app, broker, WorkerOptions(queues=("work",)), metrics=metrics)
    server = MetricsServer(metrics, worker.readiness, lambda: worker.heartbeat_at, stale_after=1.5)
    server.start()
    base = f"http://127.0.0.1:{server.port}"
    try:
        r = await asyncio.to_thread(httpx.get, f"{base}/readyz")
        assert (r.status_code, r.text.strip()) == (503, "starting")
        await worker.start()
        r = await asyncio.to_thread(httpx.get, f"{base}/readyz")
        assert r.status_code == 200
        assert r.text.strip() == "consuming work with 1 slot(s)"
        assert (await asyncio.to_thread(httpx.get, f"{base}/healthz")).status_code == 200
        codes: list[int] = []

        def probe() -> None:  # from another thread: the test's own loop is the one being blocked
            deadline = time.monotonic() + 6
            while time.monotonic() < deadline and 503 not in codes:
                codes.append(httpx.get(f"{base}/healthz", timeout=5).status_code)
                time.sleep(0.2)

        prober = threading.Thread(target=probe)
        prober.start()
        await app.enqueue("block", {})
        await asyncio.to_thread(prober.join)
        assert 503 in codes
    finally:
        await worker.shutdown()
        server.stop()
        await app.close()


@pytest.mark.slow
@pytest.mark.serial  # stops the project's local node
@pytest.mark.timeout(180)
async def test_readiness_follows_the_broker_going_down_and_back(
    broker: BrokerSettings, broker_root: BrokerRoot, tmp_path: Path
):
    if broker_root.source != "local":
        pytest.skip("needs the project's local node to stop it")
    app = await make_app(broker, tmp_path)
    app.job("noop", queue="work")(lambda p, c: None)
    metrics = WorkerMetrics()
    worker = Worker(app, broker, WorkerOptions(queues=("work",)), metrics=metrics)
    server = MetricsServer(metrics, worker.readiness, lambda: worker.heartbeat_at)
    server.start()
    base = f"http://127.0.0.1:{server.port}/readyz"

    async def wait_status(code: int, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            r = await asyncio.to_thread(httpx.get, base, timeout=5)
            if r.status_code == code:
                return r.text.strip()
            if time.monotonic() > deadline:
                raise AssertionError(f"/readyz stayed {r.status_code} {r.text!r}")
            await asyncio.sleep(0.2)

    await worker.start()
    try:
        assert await wait_status(200, 5) == "consuming work with 1 slot(s)"
        await asyncio.to_thread(broker_root.ctl, "stop_app")
        try:
            reason = await wait_status(503, 20)
            assert "not connected" in reason or "closed" in reason
        finally:
            await asyncio.to_thread(broker_root.ctl, "start_app")
        assert await wait_status(200, 60) == "consuming work with 1 slot(s)"
    finally:
        await worker.shutdown()
        server.stop()


async def _publish(broker: BrokerSettings, queue: str, n: int, timestamp: datetime | None = None) -> None:
    async with raw_channel(broker) as ch:
        for i in range(n):
            await ch.default_exchange.publish(
                aio_pika.Message(b"{}", message_id=f"{queue}-{i}", timestamp=timestamp or datetime.now(UTC)),
                routing_key=queue,
            )


async def _status(broker: BrokerSettings, *args: str) -> tuple[int, dict[str, Any], str]:
    js = await asyncio.to_thread(cli, broker, "status", "--queues", "work", "--json", *args)
    text = await asyncio.to_thread(cli, broker, "status", "--queues", "work", *args)
    assert js.exit_code == text.exit_code
    return js.exit_code, json.loads(js.stdout), text.stdout


async def wait_for_stats(broker: BrokerSettings, queue: str, present: bool = True) -> None:
    """The management API refreshes its figures every few seconds; wait for the head timestamp."""
    from amqpjobs.wire.management import ManagementClient

    deadline = time.monotonic() + 15
    with ManagementClient(broker) as mgmt:
        while time.monotonic() < deadline:
            q = mgmt.queue(broker.vhost, queue) or {}
            if (q.get("head_message_timestamp") is not None) == present:
                return
            await asyncio.sleep(0.25)
    raise AssertionError("management statistics did not refresh")


async def test_status_depths_and_exit_codes(broker: BrokerSettings, tmp_path: Path):
    (tmp_path / "t.toml").write_text(APPLIED_TOPOLOGY)
    await make_app(broker, tmp_path)
    published_at = time.time() - 10  # backdated: the head message is 10 s old without waiting 10 s
    await _publish(broker, "work", 3, timestamp=datetime.fromtimestamp(published_at, UTC))
    await _publish(broker, "work.retry.400ms", 0)
    await _publish(broker, "work.quarantine", 2)
    await _publish(broker, "work.suspects", 4)

    # quarantine non-empty and no consumer
    code, doc, text = await _status(broker)
    assert code == 1
    (jq,) = doc["job_queues"]
    assert (jq["suspects"]["name"], jq["suspects"]["ready"]) == ("work.suspects", 4)
    assert "work.suspects" in text
    assert [(q["name"], q["ready"], q["consumers"]) for q in jq["work"]] == [("work", 3, 0)]
    assert [(q["name"], q["ready"]) for q in jq["tiers"]] == [
        ("work.retry.200ms", 0), ("work.retry.400ms", 0), ("work.retry.600ms", 0),
    ]  # fmt: skip
    assert (jq["quarantine"]["name"], jq["quarantine"]["ready"]) == ("work.quarantine", 2)
    assert jq["problems"] == [
        "2 message(s) in quarantine work.quarantine (next: amqpjobs quarantine list work.quarantine)",
        "no consumer on work",
    ]
    assert "UNHEALTHY work: no consumer on work" in text
    assert "work.quarantine" in text

    # quarantine emptied, a consumer holding the 3 messages unacked: healthy
    async with raw_channel(broker) as ch:
        await (await ch.get_queue("work.quarantine", ensure=False)).purge()
        await ch.set_qos(prefetch_count=10)
        held: list[aio_pika.abc.AbstractIncomingMessage] = []

        async def hold(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            held.append(message)

        await (await ch.get_queue("work", ensure=False)).consume(hold)
        await asyncio.sleep(0.3)
        code, doc, text = await _status(broker, "--max-age", "60s")
        assert code == 0, doc
        assert doc["healthy"] is True
        assert doc["job_queues"][0]["work"][0]["consumers"] == 1
        assert doc["job_queues"][0]["work"][0]["ready"] == 0
        assert text.strip().endswith("healthy")
        assert len(held) == 3

    # oldest age: a head message published 10 s ago (its AMQP timestamp in whole seconds), read
    # between t0 and t1 (not after the text status too: under load that took over a second)
    await wait_for_stats(broker, "work")
    t0 = time.time()
    js = await asyncio.to_thread(cli, broker, "status", "--queues", "work", "--json", "--max-age", "5s")
    t1 = time.time()
    code, doc = js.exit_code, json.loads(js.stdout)
    age = doc["job_queues"][0]["work"][0]["oldest_age"]
    stamped = int(published_at)
    assert t0 - stamped - 0.05 <= age <= t1 - stamped + 0.05, (age, t0 - stamped, t1 - stamped)
    assert code == 1
    assert any("oldest message in work is" in p and "(> 5s)" in p for p in doc["job_queues"][0]["problems"])


@pytest.mark.serial  # wall-clock bound: CPU contention from parallel tests would break it (age within 1.5 s)
async def test_status_oldest_age_over_the_bound_is_the_only_problem(broker: BrokerSettings, tmp_path: Path):
    await make_app(broker, tmp_path)
    stamped = time.time() - 120
    await _publish(broker, "work", 2, timestamp=datetime.fromtimestamp(stamped, UTC))
    async with raw_channel(broker) as ch:
        await ch.set_qos(prefetch_count=1)
        held: list[aio_pika.abc.AbstractIncomingMessage] = []

        async def hold(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            held.append(message)

        await (await ch.get_queue("work", ensure=False)).consume(hold)
        await asyncio.sleep(0.3)
        await wait_for_stats(broker, "work")
        code, doc, _ = await _status(broker, "--max-age", "60s")
        ok_code, _, _ = await _status(broker, "--max-age", "10m")
    (jq,) = doc["job_queues"]
    assert len(held) == 1
    assert (jq["work"][0]["ready"], jq["work"][0]["consumers"]) == (1, 1)
    truth = time.time() - stamped
    assert abs(jq["work"][0]["oldest_age"] - truth) <= 1.5
    assert code == 1
    assert len(jq["problems"]) == 1
    assert jq["problems"][0].startswith("oldest message in work is 12")
    assert jq["problems"][0].endswith("s old (> 60s)")
    assert ok_code == 0
