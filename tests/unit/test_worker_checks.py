"""Worker start-up checks that need no broker."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from amqpjobs import App, ConfigurationError, RetryPolicy, Worker, WorkerOptions, broker_settings
from amqpjobs.runtime.broker_rules import consumer_timeouts
from amqpjobs.topology.loader import load_topology
from amqpjobs.topology.versions import CONSUMER_TIMEOUT_MARGIN, consumer_timeout

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


@pytest.mark.parametrize(
    ("version", "work", "flat", "warned"),
    [
        ((3, 10, 8), None, None, ["work"]),  # node-wide consumer_timeout: 45m is not below 30m
        ((4, 0, 5), None, None, ["work"]),
        ((4, 3, 6), 2700.0 + CONSUMER_TIMEOUT_MARGIN, None, []),  # quorum: per consumer; classic: not evaluated
    ],
)
def test_consumer_timeout_rule_follows_queue_type_and_version(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, version, work, flat, warned
):
    path = tmp_path / "t.toml"
    path.write_text(TOPOLOGY.replace('retry_tiers = ["1s"]', 'retry_tiers = ["1s"]\ntype = "quorum"'))
    topology = load_topology(path).topology
    layouts = [topology.layout("work"), topology.layout("flat")]
    with caplog.at_level(logging.INFO, logger="amqpjobs.worker"):
        got = consumer_timeouts(layouts, {"work": 2700.0, "flat": 600.0}, version, 1800.0)
    assert got == {"work": work, "flat": flat}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert [w.split()[2] for w in warnings] == warned
    assert all("consumer_timeout (1800s, node-wide before RabbitMQ 4.3)" in w for w in warnings)
    if version >= (4, 3):
        infos = " ".join(r.getMessage() for r in caplog.records)
        assert "job queue work (quorum, RabbitMQ 4.3.6): x-consumer-timeout 2760s per consumer" in infos
        assert "job queue flat (classic, RabbitMQ 4.3.6): the broker no longer evaluates a consumer timeout" in infos


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


def test_consumer_timeout_counts_the_wait_for_a_slot_on_sharded_queues():
    """The broker's clock runs from the delivery: a sharded queue's delivery may wait shards - 1 runs."""
    assert consumer_timeout(100.0) == 100.0 + CONSUMER_TIMEOUT_MARGIN
