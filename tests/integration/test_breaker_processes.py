"""A circuit breaker under ``amqpjobs consume --processes 2``: one state for all processes, one gauge."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import consume_subprocess
from tests.integration.test_worker_process import exit_code, publisher, wait_until
from tests.integration.test_worker_processes import get, metrics_port
from tests.integration.worker_env import APPLIED_TOPOLOGY

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]


@contextmanager
def breaker_workers(broker: BrokerSettings, tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """``amqpjobs consume tests.integration.breakerapp:app --processes 2 --metrics-port 0``, logs to worker.log."""
    topo = tmp_path / "proc.toml"
    topo.write_text(APPLIED_TOPOLOGY)
    env = dict(
        os.environ, AMQPJOBS_URL=broker.url, AMQPJOBS_MANAGEMENT_URL=broker.management_url,
        BREAKERAPP_TOPOLOGY=str(topo), BREAKERAPP_RECORD=str(tmp_path / "record.txt"),
        BREAKERAPP_FAILING=str(tmp_path / "failing"),
    )  # fmt: skip
    args = ["--processes", "2", "--concurrency", "2", "--metrics-port", "0"]
    with consume_subprocess("tests.integration.breakerapp:app", env, args, tmp_path / "worker.log") as proc:
        yield proc


def gauge(port: int) -> float | None:
    _, text = get(port, "/metrics")
    values = [s.value for f in text_string_to_metric_families(text) for s in f.samples
              if s.name == "amqpjobs_breaker_state" and s.labels.get("job") == "flaky"]  # fmt: skip
    return values[0] if len(values) == 1 else None


def record(tmp_path: Path) -> list[list[str]]:
    path = tmp_path / "record.txt"
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def opened(tmp_path: Path) -> int:
    """How many times worker.log says the breaker of job ``flaky`` opened on 3 failures."""
    log = (tmp_path / "worker.log").read_text()
    return len(re.findall(r"breaker job=flaky open: 3 failure\(s\) within 10s", log))


async def test_two_processes_share_the_breaker_and_one_gauge(broker: BrokerSettings, tmp_path: Path) -> None:
    app = await publisher(broker, tmp_path)
    app.job("flaky", queue="work")(lambda p, c: None)  # the same name as breakerapp's: only to publish
    try:
        (tmp_path / "failing").touch()
        with breaker_workers(broker, tmp_path) as proc:
            port = await metrics_port(tmp_path)
            await wait_until(lambda: get(port, "/readyz")[0] == 200, 30, "both children ready")
            assert gauge(port) == 0  # closed
            for i in range(3):
                await app.enqueue("flaky", {}, job_id=f"f{i}")
            await wait_until(lambda: gauge(port) == 1, 20, "the gauge says open")
            # each child logs the opening when it hears the third failure: the second a moment after the gauge
            await wait_until(lambda: opened(tmp_path) == 2, 10, "both children log the breaker open")
            assert opened(tmp_path) == 2
            for i in range(4):
                await app.enqueue("flaky", {}, job_id=f"g{i}")
            (tmp_path / "failing").unlink()
            await wait_until(lambda: gauge(port) == 0, 20, "the gauge says closed")
            await wait_until(lambda: len([r for r in record(tmp_path) if r[0] == "start"]) == 3 + 7, 20, "all ran")
            proc.send_signal(signal.SIGTERM)
            assert await exit_code(proc) == 0
    finally:
        await app.close()  # also when an assertion fails: no management socket left to the next test
    rows = record(tmp_path)
    fails = [r for r in rows if r[0] == "fail"]
    assert len(fails) == 3
    starts = [r for r in rows if r[0] == "start"]
    after = sorted(starts[3:], key=lambda r: float(r[4]))
    assert sorted(r[1] for r in after) == ["f0", "f1", "f2", "g0", "g1", "g2", "g3"]  # each once, none lost
    assert {r[1]: r[2] for r in after} == {"f0": "2", "f1": "2", "f2": "2", "g0": "1", "g1": "1", "g2": "1",
                                           "g3": "1"}  # fmt: skip
    assert len({r[3] for r in starts}) == 2  # both processes ran the job
    assert "probe: id=" in (tmp_path / "worker.log").read_text()
