"""/healthz and /readyz while a worker's first connect is retried (README "Metrics and health", "Workers").

Before, the event loop's heartbeat began only once the worker had connected: during the
first connect's retries (up to ``--connect-timeout``, 30 s by default: a broker still
starting) ``/readyz`` said ``event loop blocked for 3s`` ... ``19s`` and ``/healthz`` answered
503 from 10 s on, though the loop ran (seen on 3.10 with the node started 20 s after the
worker): a liveness probe would have killed a healthy worker waiting for its broker.
"""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

import httpx

from amqpjobs import App, Worker, WorkerOptions
from amqpjobs.runtime.metrics import MetricsServer, WorkerMetrics
from amqpjobs.wire.settings import broker_settings

TOPOLOGY = """
[[exchange]]
name = "jobs"

[[job_queue]]
name = "work"
exchange = "jobs"
"""


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_health_is_200_and_ready_says_starting_while_the_first_connect_is_retried(tmp_path: Path):
    (tmp_path / "t.toml").write_text(TOPOLOGY)
    app = App("waiting", topology=str(tmp_path / "t.toml"))
    app.job("note", queue="work")(lambda p, c: None)
    port = closed_port()
    settings = broker_settings(f"amqp://guest:guest@127.0.0.1:{port}/", f"http://127.0.0.1:{port}/")
    settings = settings.with_connect_timeout(20)
    metrics = WorkerMetrics()
    worker = Worker(app, settings, WorkerOptions(queues=("work",)), metrics=metrics)
    server = MetricsServer(metrics, worker.readiness, lambda: worker.heartbeat_at)
    server.start()
    running = asyncio.create_task(worker.run())
    seen: list[tuple[float, int, str, int]] = []
    began = time.monotonic()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}", timeout=5) as http:
            while time.monotonic() - began < 11.5:
                await asyncio.sleep(1.5)
                ready = await http.get("/readyz")
                health = await http.get("/healthz")
                seen.append((round(time.monotonic() - began, 1), ready.status_code, ready.text, health.status_code))
    finally:
        worker.request_stop()
        await asyncio.wait_for(running, 10)
        server.stop()
        await app.close()
    assert {(r, text.strip(), h) for _, r, text, h in seen} == {(503, "starting", 200)}, seen
