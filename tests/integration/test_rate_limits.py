"""Rate limits across worker processes (README "Flow control" -> "Rate limits"), on the real broker."""

from __future__ import annotations

import asyncio
import bisect
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import aiormq
import pytest

from amqpjobs import App
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.topology.loader import load_topology
from amqpjobs.topology.naming import rate_queue_names
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import ROOT, raw_channel

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]

TOPOLOGY = """
[[exchange]]
name = "jobs"

[[job_queue]]
name = "work"
exchange = "jobs"
retry_tiers = ["1s"]
"""
ROOMS = rate_queue_names("work", "limited")


@contextmanager
def rate_workers(broker: BrokerSettings, tmp_path: Path, *args: str, **extra: str) -> Iterator[subprocess.Popen[str]]:
    """``amqpjobs consume tests.integration.rateapp:app *args``, logs to worker.log."""
    env = dict(
        os.environ, AMQPJOBS_URL=broker.url, AMQPJOBS_MANAGEMENT_URL=broker.management_url,
        RATEAPP_TOPOLOGY=str(tmp_path / "topology.toml"), RATEAPP_RECORD=str(tmp_path / "record.txt"), **extra,
    )  # fmt: skip
    exe = Path(sys.executable).with_name("amqpjobs")
    with (tmp_path / "worker.log").open("a") as log:
        proc = subprocess.Popen(
            [str(exe), "consume", "tests.integration.rateapp:app", *args],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


async def publisher(broker: BrokerSettings, tmp_path: Path) -> App:
    """Apply the topology; an app that only publishes ``limited`` and ``other``."""
    path = tmp_path / "topology.toml"
    path.write_text(TOPOLOGY)
    await apply_topology(path, broker)
    app = App("pub", topology=load_topology(path).topology, url=broker.url)
    app.job("limited", queue="work")(lambda p, c: None)
    app.job("other", queue="work")(lambda p, c: None)
    return app


async def consumers(broker: BrokerSettings, queue: str) -> int:
    """Consumers of ``queue`` now (0 while it does not exist)."""
    try:
        async with raw_channel(broker) as ch:
            declared = await ch.declare_queue(queue, passive=True)
            return declared.declaration_result.consumer_count or 0
    except aiormq.exceptions.ChannelNotFoundEntity:
        return 0


async def wait_for(predicate: object, timeout: float, what: str) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while not await predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


def times(record: Path, job: str, event: str) -> list[float]:
    lines = [line.split() for line in record.read_text().splitlines()] if record.exists() else []
    return sorted(float(p[2]) for p in lines if p[:2] == [job, event])


def most_in_one_second(starts: list[float]) -> int:
    """The most starts in any window [t, t + 1 s) (one starting at each start is enough)."""
    return max((bisect.bisect_left(starts, t + 1.0) - i for i, t in enumerate(starts)), default=0)


def test_most_in_one_second_counts_a_sliding_window():
    assert most_in_one_second([0.0, 0.5, 0.99, 1.0, 1.2, 1.98]) == 4  # 0.99, 1.0, 1.2, 1.98
    assert most_in_one_second([]) == 0


async def enqueue_all(app: App, jobs: list[tuple[str, dict[str, float]]]) -> None:
    await asyncio.gather(*(app.enqueue(job, payload) for job, payload in jobs))


@pytest.mark.serial
async def test_300_jobs_at_10_per_second_on_4_processes_take_30s_and_leave_the_queue_to_other_jobs(
    broker: BrokerSettings, tmp_path: Path
):
    app = await publisher(broker, tmp_path)
    record = tmp_path / "record.txt"
    try:
        with rate_workers(broker, tmp_path, "--processes", "4", "--concurrency", "8", "--grace", "10s"):

            async def ready() -> bool:
                return [await consumers(broker, n) for n in ("work", ROOMS.waiting)] == [4, 4]

            await wait_for(ready, 60, "4 worker processes consuming the work queue and the waiting room")
            # the other job alone: 300 runs of 0.4 s on 32 slots
            await enqueue_all(app, [("other", {"seconds": 0.4})] * 300)

            async def others_done() -> bool:
                return len(times(record, "other", "done")) == 300

            await wait_for(others_done, 30, "300 runs of the other job")
            alone = times(record, "other", "done")[-1] - times(record, "other", "start")[0]
            record.unlink()
            # both: 300 rate-limited at 10/s and 300 runs of the other job, interleaved
            began = time.time()
            await enqueue_all(app, [("limited", {}), ("other", {"seconds": 0.4})] * 300)

            async def limited_done() -> bool:
                return len(times(record, "limited", "start")) >= 300 and len(times(record, "other", "done")) == 300

            await wait_for(limited_done, 45, "300 rate-limited runs")
            await asyncio.sleep(0.5)  # none more (each ran once)
            starts = times(record, "limited", "start")
            together = times(record, "other", "done")[-1] - times(record, "other", "start")[0]
            took = starts[-1] - began
            print(f"limited: {len(starts)} starts in {took:.2f}s, at most {most_in_one_second(starts)} a second; "
                  f"other: {alone:.2f}s alone, {together:.2f}s beside it ({together / alone:.2f}x)")  # fmt: skip
            assert len(starts) == 300
            assert 29.0 <= took <= 31.0
            assert most_in_one_second(starts) <= 11
            assert together <= 1.2 * alone
            assert len({line.split()[3] for line in record.read_text().splitlines() if "limited" in line}) == 4
    finally:
        await app.close()
        print((tmp_path / "worker.log").read_text()[-3000:])
