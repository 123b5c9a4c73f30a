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
