"""Worker start-up checks that need no broker."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from amqpjobs import App, Breaker, ConfigurationError, RetryPolicy, Worker, WorkerOptions, broker_settings
from amqpjobs.runtime.broker_rules import consumer_timeouts
from amqpjobs.topology.loader import load_topology
from amqpjobs.topology.versions import CONSUMER_TIMEOUT_MARGIN, consumer_timeout
from tests.topologies import work_topology

TOPOLOGY = work_topology(flat=("flat",))


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


def test_a_consumer_timeout_under_a_second_is_said_as_given(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    # helper-226: --consumer-timeout 1ms was said as "consumer_timeout (0s, ...)"
    topology = load_topology(write_topology(tmp_path)).topology
    with caplog.at_level(logging.INFO, logger="amqpjobs.worker"):
        consumer_timeouts([topology.layout("work")], {"work": 0.5}, (3, 10, 8), 0.001)
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "its longest job timeout 0.5s is not below the broker's consumer_timeout (0.001s, node-wide" in warning


def write_topology(tmp_path: Path) -> Path:
    path = tmp_path / "t.toml"
    path.write_text(TOPOLOGY)
    return path


def test_retries_without_tiers_are_refused(tmp_path: Path):
    app = make(tmp_path)
    app.job("x", queue="flat", retry=RetryPolicy(max_attempts=3))(lambda p, c: None)
    with pytest.raises(ConfigurationError, match="has no retry_tiers"):
        worker(app)._check()


def test_a_breaker_without_tiers_is_refused(tmp_path: Path):
    app = make(tmp_path)
    app.job("x", queue="flat", retry=RetryPolicy(max_attempts=1), breaker=Breaker(5))(lambda p, c: None)
    with pytest.raises(ConfigurationError, match="has a breaker but job queue 'flat' has no retry_tiers"):
        worker(app)._check()


def test_unknown_job_queue_is_refused(tmp_path: Path):
    app = make(tmp_path)
    app.job("x", queue="nope")(lambda p, c: None)
    with pytest.raises(ConfigurationError, match=r"'nope', which the topology .* does not declare"):
        worker(app, queues=("work",))._check()
    with pytest.raises(ConfigurationError, match="job queue 'nope' is not in the topology"):
        worker(app)._check()
    with pytest.raises(ConfigurationError, match="not in the topology"):
        worker(make(tmp_path), queues=("other",))._check()


def test_consumer_timeout_counts_the_wait_for_a_slot_on_sharded_queues():
    """The broker's clock runs from the delivery: a sharded queue's delivery may wait shards - 1 runs."""
    assert consumer_timeout(100.0) == 100.0 + CONSUMER_TIMEOUT_MARGIN


def test_default_lease_is_twice_the_timeout_at_least_the_longest_run_and_60s(tmp_path: Path):
    """A run may go on its timeout, the grace past it (a thread), then the stop's grace: the claim outlives that."""
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
        "quick": 75.0,  # 10 s + 30 s past it + 30 s of the stop's grace + 5 s
        "slow": 240.0,
        "untimed": 3420.0,  # twice the 1710 s it may run: a claim never expires under a run that is still allowed
        "own": 420.0,
    }
    short = worker(app, consumer_timeout=5.0)
    short._check()
    assert short.lease_of(app.resolve("untimed")) == 69.0  # 4 s timeout: 4 + 2 x 30 + 5
    brief = worker(app, consumer_timeout=5.0, grace=5.0)
    brief._check()
    assert brief.lease_of(app.resolve("untimed")) == 60.0  # 4 + 2 x 5 + 5 = 19: at least 60 s


async def test_concurrency_below_1_is_refused(tmp_path: Path):
    app = make(tmp_path)
    app.job("x", queue="work")(lambda p, c: None)
    with pytest.raises(ConfigurationError, match=r"concurrency must be >= 1 \(got 0\)"):
        await worker(app, concurrency=0).start()


def test_an_idempotent_job_with_a_lease_and_no_timeout_times_out_at_half_its_lease(tmp_path: Path):
    """Its default timeout (1710 s) outlived a 3 s lease: a second worker took the claim over while the first
    still ran, and both succeeded (an outsider's report). An explicit timeout is checked when the job is made."""
    from amqpjobs import SqliteLedger

    app = make(tmp_path)
    app.ledger = SqliteLedger(tmp_path / "l.db", retention="30d")
    app.job("tiny", queue="work", idempotent=True, lease="3s")(lambda p, c: None)
    app.job("own", queue="work", idempotent=True, lease="7m")(lambda p, c: None)
    app.job("plain", queue="work", lease="3s")(lambda p, c: None)  # not idempotent: no claim to outlive
    w = worker(app, consumer_timeout=1800.0)
    w._check()
    assert (w._timeouts["tiny"], w._timeouts["own"], w._timeouts["plain"]) == (1.5, 210.0, 1710.0)
    assert w.lease_of(app.resolve("tiny")) == 3.0
    with pytest.raises(ConfigurationError, match="lease 3s must be longer than the timeout 10s"):
        app.job("explicit", queue="work", idempotent=True, lease="3s", timeout="10s")(lambda p, c: None)


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

    from amqpjobs.runtime.processes import run_worker

    app = make(tmp_path)
    app.job("x", queue="work")(lambda p, c: None)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ConfigurationError, match=f"can't serve metrics on 127.0.0.1:{port}"):
            await run_worker(app, broker_settings("amqp://guest:guest@127.0.0.1:1/"), WorkerOptions(), port)


def test_an_idempotent_plain_function_job_whose_lease_a_run_past_its_timeout_outlives_is_warned(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """A thread past its timeout goes on for the grace, then the stop's grace: its claim can expire under it and a
    second worker take it over while it still runs (an outsider saw both run at once for 5 s)."""
    from amqpjobs import SqliteLedger

    caplog.set_level(logging.WARNING, logger="amqpjobs")
    app = make(tmp_path)
    app.ledger = SqliteLedger(tmp_path / "l.db", retention="30d")
    app.job("short", queue="work", idempotent=True, lease="20s")(lambda p, c: None)  # timeout 10 s
    app.job("roomy", queue="work", idempotent=True, lease="2m", timeout="10s")(lambda p, c: None)

    @app.job("async", queue="work", idempotent=True, lease="20s")  # cancelled at its timeout: no thread goes on
    async def not_a_thread(p: object, c: object) -> None:
        pass

    w = worker(app, consumer_timeout=1800.0, grace=30.0)
    w._check()
    warned = [r.getMessage() for r in caplog.records if "can expire under" in r.getMessage()]
    assert warned == [
        "job 'short': its claim (lease 20s) can expire under a run past its timeout (10s): a plain function's thread "
        "goes on for the grace (30s), then for the stop's grace (30s), so another worker could run it beside; give "
        "it lease= at least 75s, or a shorter timeout or --grace"
    ]


@pytest.mark.version_independent
async def test_an_embedded_worker_refuses_a_job_queue_its_app_serves_no_job_from_as_consume_does(tmp_path: Path):
    """One rule with ``consume --queues`` (helper-203). Before, ``Worker(app, ..., WorkerOptions(queues=("work",
    "flat")))`` started and quarantined each job of ``flat`` as unknown-job, beside the app that serves them."""
    app = make(tmp_path)
    app.job("mail", queue="work", retry=RetryPolicy(max_attempts=1))(lambda payload, ctx: None)
    embedded = worker(app, queues=("work", "flat"))
    with pytest.raises(ConfigurationError) as refused:
        await embedded.start()  # refused before it connects (the broker of worker() is not there)
    assert str(refused.value) == (
        "app 't' serves no job from job queue 'flat' (its jobs use: work): a worker consuming it would quarantine "
        "each of its jobs as unknown-job; leave it out of --queues, or run the app whose jobs use it"
    )
    worker(app, queues=("work",))._check()  # the job queue it serves: fine
    worker(make(tmp_path), queues=("flat",))._check()  # an app without jobs (a test's): not this rule's to refuse
