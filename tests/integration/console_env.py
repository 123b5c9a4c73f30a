"""Real failures for the console's tests: a worker quarantines jobs that fail in two code paths."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from starlette.testclient import TestClient

from amqpjobs import JobContext, RetryPolicy
from amqpjobs.console.app import create_app
from amqpjobs.console.config import ConsoleConfig
from amqpjobs.runtime.app import App
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import depth
from tests.integration.worker_env import make_app, running_worker

#: The test client's base URL and the console's CSRF token (fixed for the tests).
BASE = "http://127.0.0.1:8480"
CSRF = "test-csrf-token-0123456789"
#: What the second group's payload and error message carry: it must stay text on every page.
SCRIPT = "<script>alert('xss')</script><img src=x onerror=alert(2)>"


@dataclass
class Handler:
    """The ``mail`` job: while ``broken``, even jobs fail in ``send`` (ValueError), odd in ``render`` (KeyError)."""

    broken: bool = True
    succeeded: list[str] = field(default_factory=list)


def send(n: int) -> None:
    raise ValueError(f"bad address for mail {n}")


def render(n: int) -> None:
    raise KeyError(f"template {SCRIPT} missing for {n}")


async def failing_app(broker: BrokerSettings, tmp_path: Path, handler: Handler) -> App:
    """The fast topology's app with the ``mail`` job of :class:`Handler` (one attempt: quarantined at once)."""
    app = await make_app(broker, tmp_path)

    @app.job("mail", queue="work", retry=RetryPolicy(max_attempts=1))
    async def mail(payload: dict[str, Any], ctx: JobContext) -> None:
        if handler.broken:
            (send if payload["n"] % 2 == 0 else render)(payload["n"])
        handler.succeeded.append(ctx.job_id)

    return app


async def quarantine_jobs(broker: BrokerSettings, app: App, n: int) -> None:
    """Enqueue ``n`` mail jobs (ids ``m-0`` ...) and let a worker quarantine them all."""
    async with running_worker(app, broker) as (_, rec):
        for i in range(n):
            await app.enqueue("mail", {"n": i, "note": SCRIPT if i % 2 else "ok"}, job_id=f"m-{i}")
        await rec.wait_for(lambda o: len(o) >= n)
    assert await depth(broker, "work.quarantine") == n


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def client(broker: BrokerSettings, tmp_path: Path, **kw: Any) -> TestClient:
    """A test client of a console on ``broker`` (audit log ``tmp_path/audit.jsonl``; ``kw``: :class:`ConsoleConfig`)."""
    config = ConsoleConfig(broker, audit_path=tmp_path / "audit.jsonl", **kw)
    return TestClient(create_app(config, csrf_token=CSRF), base_url=BASE, follow_redirects=False)


def quarantine_six(broker: BrokerSettings, tmp_path: Path) -> Handler:
    """6 real failures in work.quarantine: m-0, m-2, m-4 (ValueError in send), m-1, m-3, m-5 (KeyError in render)."""
    handler = Handler()

    async def fill() -> None:
        app = await failing_app(broker, tmp_path, handler)
        await quarantine_jobs(broker, app, 6)
        await app.close()

    asyncio.run(fill())
    return handler


def wait_done(c: TestClient, location: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
    """Poll an action's progress (``location``: its page) until it has settled (ended, written down); its last."""
    for _ in range(400):
        progress: dict[str, Any] = c.get(location + ".json", headers=headers).json()
        if progress["settled"]:
            return progress
        asyncio.run(asyncio.sleep(0.05))
    raise AssertionError(f"still running: {progress}")


@contextmanager
def serve_console(broker: BrokerSettings, tmp_path: Path) -> Iterator[str]:
    """``amqpjobs console`` as an operator starts it, on 127.0.0.1 and a free port: its base URL (log: console.log)."""
    port = free_port()
    env = dict(os.environ, AMQPJOBS_URL=broker.url, AMQPJOBS_MANAGEMENT_URL=broker.management_url,
               AMQPJOBS_CONSOLE_AUDIT_LOG=str(tmp_path / "audit.jsonl"))  # fmt: skip
    exe = str(Path(sys.executable).with_name("amqpjobs"))
    log = (tmp_path / "console.log").open("w")
    proc = subprocess.Popen([exe, "console", "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(base + "/audit", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert proc.poll() is None, (tmp_path / "console.log").read_text()
        assert time.monotonic() < deadline, "the console did not answer in 30 s"
        time.sleep(0.1)
    try:
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        log.close()
