"""Worker start-up checks that need no broker."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from amqpjobs import App, ConfigurationError, RetryPolicy, Worker, WorkerOptions, broker_settings
from amqpjobs.topology.loader import load_topology

TOPOLOGY = """
[[exchange]]
name = "jobs"

[[job_queue]]
name = "work"
exchange = "jobs"
retry_tiers = ["1s"]

[[job_queue]]
name = "flat"
exchange = "jobs"
"""


def make(tmp_path: Path) -> App:
    path = tmp_path / "t.toml"
    path.write_text(TOPOLOGY)
    return App("t", topology=load_topology(path).topology)


def worker(app: App, **kw: object) -> Worker:
    return Worker(app, broker_settings("amqp://guest:guest@127.0.0.1:1/"), WorkerOptions(**kw))  # type: ignore[arg-type]


def test_warns_when_job_timeout_exceeds_consumer_timeout(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    app = make(tmp_path)
    app.job("long", queue="work", timeout="45m")(lambda p, c: None)
    app.job("short", queue="work", timeout="10m")(lambda p, c: None)
    with caplog.at_level(logging.WARNING, logger="amqpjobs.worker"):
        worker(app, consumer_timeout=1800.0)._check()
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1
    assert "job long: timeout 2700s" in warnings[0]
    assert "consumer_timeout 1800s" in warnings[0]


def test_retries_without_tiers_are_refused(tmp_path: Path):
    app = make(tmp_path)
    app.job("x", queue="flat", retry=RetryPolicy(max_attempts=3))(lambda p, c: None)
    with pytest.raises(ConfigurationError, match="has no retry_tiers"):
        worker(app)._check()


def test_unknown_job_queue_is_refused(tmp_path: Path):
    app = make(tmp_path)
    app.job("x", queue="nope")(lambda p, c: None)
    with pytest.raises(ConfigurationError, match="'nope', which the topology does not declare"):
        worker(app, queues=("work",))._check()
    with pytest.raises(ConfigurationError, match="job queue 'nope' is not in the topology"):
        worker(app)._check()
    with pytest.raises(ConfigurationError, match="not in the topology"):
        worker(make(tmp_path), queues=("other",))._check()


def test_default_lease_is_twice_the_timeout_at_least_60s(tmp_path: Path):
    from amqpjobs import SqliteLedger

    app = make(tmp_path)
    app.ledger = SqliteLedger(tmp_path / "l.db", retention="30d")
    app.job("quick", queue="work", timeout="10s", idempotent=True)(lambda p, c: None)
    app.job("slow", queue="work", timeout="2m", idempotent=True)(lambda p, c: None)
    app.job("untimed", queue="work", idempotent=True)(lambda p, c: None)  # runs up to the worker's default timeout
    app.job("own", queue="work", idempotent=True, lease="7m")(lambda p, c: None)
    w = worker(app, consumer_timeout=1800.0)
    w._check()
    assert w._timeouts["untimed"] == 1710.0
    assert {name: w.lease_of(app.resolve(name)) for name in ("quick", "slow", "untimed", "own")} == {
        "quick": 60.0,
        "slow": 240.0,
        "untimed": 3420.0,  # twice the 1710 s it may run: a claim never expires under a run that is still allowed
        "own": 420.0,
    }
    short = worker(app, consumer_timeout=5.0)
    short._check()
    assert short.lease_of(app.resolve("untimed")) == 60.0  # 4 s timeout: at least 60 s


async def test_concurrency_below_1_is_refused(tmp_path: Path):
    app = make(tmp_path)
    app.job("x", queue="work")(lambda p, c: None)
    with pytest.raises(ConfigurationError, match=r"concurrency must be >= 1 \(got 0\)"):
        await worker(app, concurrency=0).start()


def test_readiness_says_stopping_and_a_blocked_loop(tmp_path: Path):
    import time

    w = worker(make(tmp_path))
    assert w.readiness() == (False, "starting")
    w.heartbeat_at = time.monotonic() - 7.4
    assert w.readiness() == (False, "event loop blocked for 7s")
    w.request_stop()
    assert w.readiness() == (False, "stopping")


async def test_a_metrics_port_in_use_is_a_configuration_error(tmp_path: Path):
    import socket

    from amqpjobs.runtime.worker import run_worker

    app = make(tmp_path)
    app.job("x", queue="work")(lambda p, c: None)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ConfigurationError, match=f"can't serve metrics on 127.0.0.1:{port}"):
            await run_worker(app, broker_settings("amqp://guest:guest@127.0.0.1:1/"), WorkerOptions(), port)
