"""README "Workers" and "Metrics and health" promises that had no test: the worker as a process
(first connect retried, stop while connecting, a second signal, --metrics-port/--metrics-host,
--consumer-timeout, --log-json) and in-process (worker-error, timeouts counted, the (unknown) label).
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aio_pika
import httpx
import pytest

from amqpjobs import JobContext, RetryPolicy, Worker, WorkerOptions
from amqpjobs.jobs.evidence import ERROR_TYPE, REASON
from amqpjobs.runtime.metrics import MetricsServer, WorkerMetrics
from amqpjobs.wire.settings import BrokerSettings
from tests.conftest import BrokerRoot
from tests.integration.helpers import depth, drain, raw_channel
from tests.integration.test_observability import scrape
from tests.integration.test_worker_process import done_ids, publisher, read_record, wait_until, worker_process
from tests.integration.worker_env import Recorder, make_app

#: Each test but the consumer-timeout one (whose rule changed in RabbitMQ 4.3) is marked version-independent.
pytestmark = [pytest.mark.broker]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def via_port(url: str, port: int) -> str:
    """``url`` with its port replaced (host kept): where a proxy, or nothing, listens."""
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit(":", 1)[0] if parts.port else parts.netloc
    return urlunsplit((parts.scheme, f"{netloc}:{port}", parts.path, parts.query, parts.fragment))


class LateProxy:
    """A TCP proxy to the broker on a fixed loopback port that starts listening only when told to."""

    def __init__(self, target: str) -> None:
        parts = urlsplit(target)
        self.target = (parts.hostname or "127.0.0.1", parts.port or 5672)
        self.port = free_port()
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with suppress(OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        for task in (self._pipe(reader, up_writer), self._pipe(up_reader, writer)):
            t = asyncio.create_task(task)
            self._pipes.add(t)
            t.add_done_callback(self._pipes.discard)

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for t in list(self._pipes):
            t.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)


@contextmanager
def consume_process(broker: BrokerSettings, tmp_path: Path, *args: str, url: str | None = None) -> Iterator[Any]:
    """``amqpjobs consume tests.integration.procapp:app ARGS`` (log in tmp_path/worker.log)."""
    with worker_process(broker, tmp_path, *args, AMQPJOBS_URL=url or broker.url) as proc:
        yield proc


async def wait_exit(proc: Any, timeout: float) -> tuple[int, float]:
    started = time.monotonic()
    code = await asyncio.to_thread(proc.wait, timeout)
    return code, time.monotonic() - started


@pytest.mark.version_independent
async def test_first_connect_is_retried_while_the_broker_is_not_there_yet(broker: BrokerSettings, tmp_path: Path):
    app = await publisher(broker, tmp_path)  # applies the topology
    proxy = LateProxy(broker.url)
    record = tmp_path / "record.txt"
    try:
        with consume_process(broker, tmp_path, url=via_port(broker.url, proxy.port)) as proc:
            await asyncio.sleep(6.5)  # refused for longer than a quick probe would wait (README: up to 30 s)
            assert proc.poll() is None, (tmp_path / "worker.log").read_text()
            await proxy.start()
            await app.enqueue("sleep", {"seconds": 0}, job_id="after-start")
            await wait_until(lambda: done_ids(record)["after-start"] == 1, 20, "the job to run")
            proc.send_signal(signal.SIGTERM)
            code, _ = await wait_exit(proc, 30)
    finally:
        await proxy.stop()
        await app.close()
    assert code == 0, (tmp_path / "worker.log").read_text()


@pytest.mark.version_independent
async def test_sigterm_while_still_connecting_exits_0_at_once(broker: BrokerSettings, tmp_path: Path):
    nowhere = via_port(broker.url, free_port())  # nothing listens: the first connect keeps being retried
    with consume_process(broker, tmp_path, url=nowhere) as proc:
        # connecting (its signal handlers are in place): the first retry line, not a fixed 1.5 s that
        # python start-up can outlast on a loaded machine (then SIGTERM found no handler: exit -15)
        await wait_until(lambda: "not reachable (attempt 1" in (tmp_path / "worker.log").read_text(), 30,
                         "the first connect attempt")  # fmt: skip
        await asyncio.sleep(0.5)  # still retrying
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        code, took = await wait_exit(proc, 10)
    out = (tmp_path / "worker.log").read_text()
    assert code == 0, out
    assert took < 3, took
    assert "Traceback" not in out


@pytest.mark.version_independent
async def test_a_second_signal_exits_at_once_and_the_delivery_returns(broker: BrokerSettings, tmp_path: Path):
    app = await publisher(broker, tmp_path)
    record = tmp_path / "record.txt"
    try:
        with consume_process(broker, tmp_path, "--grace", "60s") as proc:
            await app.enqueue("sleep", {"seconds": 30}, job_id="long")
            await wait_until(lambda: [r[:4] for r in read_record(record)] == [["start", "long", "1", "0"]], 20,
                             "the job to start")  # fmt: skip
            proc.send_signal(signal.SIGTERM)  # drains: would wait up to 60 s for the job
            await wait_until(lambda: "draining 1 in-flight job(s)" in (tmp_path / "worker.log").read_text(), 10)
            proc.send_signal(signal.SIGTERM)
            code, took = await wait_exit(proc, 10)
    finally:
        await app.close()
    out = (tmp_path / "worker.log").read_text()
    assert code == 128 + signal.SIGTERM, out
    assert took < 3, took
    assert "second signal 15: exiting now" in out
    assert done_ids(record) == {}
    deadline = time.monotonic() + 10
    while await depth(broker, "work") != 1:  # the broker requeues it once it sees the connection gone
        assert time.monotonic() < deadline, "the delivery did not return to its queue"
        await asyncio.sleep(0.05)
    (back,) = await drain(broker, "work")
    assert (back.message_id, back.redelivered) == ("long", True)


async def test_metrics_host_and_port_consumer_timeout_and_json_logs(
    broker_root: BrokerRoot, broker: BrokerSettings, tmp_path: Path
) -> None:
    """On every version: before 4.3 the node-wide ``consumer_timeout`` (here ``--consumer-timeout 45s``) is
    below the job's 60 s timeout, a WARNING; from 4.3 on the broker evaluates none on classic queues, an INFO
    line (RabbitMQ 4.3 release notes; before, the test asserted the WARNING on every version and failed on 4.3.6)."""
    app = await publisher(broker, tmp_path)
    host = "127.0.0.2"  # loopback too (127/8), but not the default 127.0.0.1
    port = free_port(host)
    record = tmp_path / "record.txt"
    args = ("--metrics-port", str(port), "--metrics-host", host, "--consumer-timeout", "45s", "--log-json")
    try:
        with consume_process(broker, tmp_path, *args) as proc:
            base = f"http://{host}:{port}"

            def ready() -> bool:
                with suppress(httpx.HTTPError):
                    return httpx.get(f"{base}/readyz", timeout=2).status_code == 200
                return False

            await wait_until(ready, 20, "/readyz 200")
            with pytest.raises(httpx.ConnectError):
                await asyncio.to_thread(httpx.get, f"http://127.0.0.1:{port}/readyz", timeout=2)
            await app.enqueue("sleep", {"seconds": 0}, job_id="one")
            async with raw_channel(broker) as ch:  # a job this app does not know
                jobs = await ch.get_exchange("jobs")
                await jobs.publish(aio_pika.Message(b"{}", type="nope", message_id="stranger"), routing_key="work")
            await wait_until(lambda: done_ids(record)["one"] == 1, 20, "the job to run")
            deadline = time.monotonic() + 10
            while True:
                samples = await asyncio.to_thread(scrape_at, base)
                if samples.get(("amqpjobs_jobs_total", "(unknown)", "quarantined")) == 1:
                    break
                assert time.monotonic() < deadline, samples
                await asyncio.sleep(0.1)
            assert samples[("amqpjobs_jobs_total", "sleep", "succeeded")] == 1
            health = await asyncio.to_thread(httpx.get, f"{base}/healthz")
            assert health.status_code == 200
            assert health.text.startswith("alive: event loop heartbeat")
            for path in ("/", "/metricsx", "/ready"):
                assert (await asyncio.to_thread(httpx.get, f"{base}{path}")).status_code == 404
            proc.send_signal(signal.SIGTERM)
            code, _ = await wait_exit(proc, 30)
    finally:
        await app.close()
    assert code == 0
    lines = [json.loads(line) for line in (tmp_path / "worker.log").read_text().splitlines() if line.strip()]
    assert {"time", "level", "logger", "message"} <= set(lines[0])
    warnings = [x["message"] for x in lines if x["level"] == "WARNING"]
    infos = [x["message"] for x in lines if x["level"] == "INFO"]
    shown = ".".join(map(str, broker_root.version))
    said = (
        rf"job queue work \(classic, RabbitMQ {re.escape(shown)}\): its longest job timeout 60s is not below the "
        r"broker's consumer_timeout \(45s"
    )
    if broker_root.version < (4, 3):
        assert any(re.match(said, m) for m in warnings), warnings  # --consumer-timeout 45s, not the default 30 min
    else:
        assert not any(re.match(said, m) for m in warnings), warnings
        assert (
            f"job queue work (classic, RabbitMQ {shown}): the broker no longer evaluates a consumer timeout on "
            "classic queues; a run is bounded by its job timeout only (longest 60s)"
        ) in infos, infos
    assert any(x["message"].startswith("job=sleep id=one attempt=1") and "outcome=succeeded" in x["message"]
               for x in lines)  # fmt: skip


def scrape_at(base: str) -> dict[tuple[str, str, str], float]:
    text = httpx.get(f"{base}/metrics", timeout=5).text
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "amqpjobs_jobs_total":
                out[(s.name, s.labels["job"], s.labels["outcome"])] = s.value
    return out


@pytest.mark.version_independent
async def test_timeouts_are_counted_and_a_worker_failure_is_quarantined_worker_error(
    broker: BrokerSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    app = await make_app(broker, tmp_path)

    @app.job("slow", queue="work", timeout=0.2, retry=RetryPolicy(max_attempts=1))
    async def slow(payload: dict[str, Any], ctx: JobContext) -> None:
        await asyncio.sleep(10)

    @app.job("trip", queue="work")
    async def trip(payload: dict[str, Any], ctx: JobContext) -> None:
        pass

    from amqpjobs.jobs import envelope

    real_parse = envelope.parse_attempt

    def parse_attempt(value: Any) -> int:  # a bug inside the worker, hit by one message only
        if value == 7:
            raise KeyError("the worker's own bug")
        return real_parse(value)

    monkeypatch.setattr(envelope, "parse_attempt", parse_attempt)  # the worker calls envelope.parse_attempt
    metrics = WorkerMetrics()
    recorder = Recorder()
    worker = Worker(app, broker, WorkerOptions(queues=("work",), concurrency=2), recorder, metrics=metrics)
    server = MetricsServer(metrics, worker.readiness, lambda: worker.heartbeat_at)
    server.start()
    await worker.start()
    try:
        await app.enqueue("slow", {}, job_id="too-slow")
        async with raw_channel(broker) as ch:
            jobs = await ch.get_exchange("jobs")
            await jobs.publish(
                aio_pika.Message(b"{}", type="trip", message_id="tripped", headers={"amqpjobs-attempt": 7}),
                routing_key="work",
            )
        await recorder.wait_for(lambda o: len(o) == 2, 15)
        await asyncio.sleep(0.1)
        samples = await asyncio.to_thread(scrape, server.port)
    finally:
        await worker.shutdown()
        server.stop()
        await app.close()
    kinds = {o.job_id: (o.kind, o.decision) for o in recorder.outcomes}
    assert kinds["too-slow"][0] == "quarantined"
    assert kinds["tripped"][0] == "quarantined"
    assert samples[("amqpjobs_timeouts_total", (("job", "slow"), ("queue", "work")))] == 1
    assert samples.get(("amqpjobs_timeouts_total", (("job", "trip"), ("queue", "work"))), 0) == 0
    quarantined = {m.message_id: dict(m.headers or {}) for m in await drain(broker, "work.quarantine")}
    assert quarantined["too-slow"][REASON] == "timeout"
    assert (quarantined["tripped"][REASON], quarantined["tripped"][ERROR_TYPE]) == ("worker-error", "KeyError")
    assert await depth(broker, "work") == 0


@pytest.mark.version_independent
async def test_a_worker_process_freezes_its_start_up_heap_before_the_first_delivery(
    broker: BrokerSettings, tmp_path: Path
):
    """``amqpjobs consume`` collects, then freezes the objects of its start (heap.settle_heap), GC still on.

    A later full collection then walks only what the jobs made (12-28 ms of stopped loop
    before, on the bench machine); the bench measures the effect (section 5), this the wiring.
    """
    app = await publisher(broker, tmp_path)
    app.job("heap", queue="work")(lambda p, c: None)
    record = tmp_path / "record.txt"
    try:
        with consume_process(broker, tmp_path) as proc:
            await app.enqueue("heap", {}, job_id="first")
            await wait_until(lambda: any(r[:2] == ["heap", "first"] for r in read_record(record)), 30, "the job")
            proc.send_signal(signal.SIGTERM)
            code, _ = await wait_exit(proc, 30)
    finally:
        await app.close()
    assert code == 0, (tmp_path / "worker.log").read_text()
    [line] = [r for r in read_record(record) if r[0] == "heap"]
    assert int(line[2]) > 10_000, line  # the imports, the app, the connections: tens of thousands of objects
    assert line[3] == "1"
