"""A start the broker cuts after its first job queue's consumer took deliveries (README "Workers").

Before, the worker's warning said ``nothing was consumed or ticked; starting again in 1s`` right
after ``worker stopped: 2 in-flight job(s) finished, 2 of them not acked (their channel closed: the
broker redelivers them), 0 abandoned (redelivered); exit 1``, a stop line of a process that went on.
Now the one warning says what the cut start had taken and what becomes of it; the jobs it ran and
could not ack run again (redelivered, at-least-once), the others once; none is lost.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from amqpjobs.runtime.app import App
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import consume_subprocess, depth, write_file
from tests.integration.test_worker_process import exit_code, read_record

pytestmark = pytest.mark.broker

TOPOLOGY = """
[[exchange]]
name = "jobs"

[[job_queue]]
name = "work"
exchange = "jobs"

[[job_queue]]
name = "work2"
exchange = "jobs"
"""


async def test_a_start_cut_after_its_first_consumer_took_jobs_says_what_it_took(broker: BrokerSettings, tmp_path: Path):
    topo, record, log = tmp_path / "cut.toml", tmp_path / "record.txt", tmp_path / "worker.log"
    write_file(topo, TOPOLOGY)
    await apply_topology(topo, broker)
    app = App("cutapp", topology=str(topo), url=broker.url)
    app.job("slow", queue="work")(lambda p, c: None)  # the names of cutapp's jobs: only to publish
    app.job("slow2", queue="work2")(lambda p, c: None)
    for i in range(2):
        await app.enqueue("slow", {"seconds": 1}, job_id=f"w1-{i}")
    await app.enqueue("slow2", {"seconds": 0}, job_id="w2-0")
    env = {"AMQPJOBS_URL": broker.url, "AMQPJOBS_MANAGEMENT_URL": broker.management_url,
           "CUTAPP_TOPOLOGY": str(topo), "CUTAPP_RECORD": str(record),
           "CUTAPP_AFTER": "1.5"}  # fmt: skip  # the jobs taken wait up to START_HOLD (1 s) for the start: running now
    args = ("--concurrency", "2", "--grace", "5s")
    with consume_subprocess("tests.integration.cutapp:app", env, args, log) as proc:
        deadline = time.monotonic() + 40
        while Counter(r[1] for r in read_record(record) if r[0] == "done") != {"w1-0": 2, "w1-1": 2, "w2-0": 1}:
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, (read_record(record), log.read_text())
            await asyncio.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        code = await exit_code(proc)
    out = log.read_text()
    await app.close()
    assert code == 0, out
    assert "cutapp: closed the worker's connections" in out, out
    # before: "... lost while starting (...): nothing was consumed or ticked; starting again in 1s", after a
    # "worker stopped: 2 in-flight job(s) finished, 2 of them not acked ...; exit 1" of a process that went on
    assert "nothing was consumed" not in out, out
    assert out.count("worker stopped:") == 1, out
    lost = [line for line in out.splitlines() if "lost while starting" in line]
    assert len(lost) == 1, out
    assert (
        "its first consumers had taken work: outcomes 2 ack_uncertain; at its stop 2 in-flight job(s) finished, "
        "2 of them not acked (their channel closed: the broker redelivers them), 0 abandoned (redelivered); "
        "starting again in 1s" in lost[0]
    ), out
    starts = [(r[1], r[2]) for r in read_record(record) if r[0] == "start"]
    assert sorted(starts) == [("w1-0", "0"), ("w1-0", "1"), ("w1-1", "0"), ("w1-1", "1"), ("w2-0", "0")], starts
    assert await depth(broker, "work") == 0
    assert await depth(broker, "work2") == 0


async def test_a_stop_between_a_cut_start_and_the_next_says_what_was_taken_and_exits_1(
    broker: BrokerSettings, tmp_path: Path
):
    topo, record, log = tmp_path / "cut.toml", tmp_path / "record.txt", tmp_path / "worker.log"
    write_file(topo, TOPOLOGY)
    await apply_topology(topo, broker)
    app = App("cutapp", topology=str(topo), url=broker.url)
    app.job("slow", queue="work")(lambda p, c: None)
    app.job("slow2", queue="work2")(lambda p, c: None)
    for i in range(2):
        await app.enqueue("slow", {"seconds": 1}, job_id=f"w1-{i}")
    env = {"AMQPJOBS_URL": broker.url, "AMQPJOBS_MANAGEMENT_URL": broker.management_url,
           "CUTAPP_TOPOLOGY": str(topo), "CUTAPP_RECORD": str(record),
           "CUTAPP_AFTER": "1.5"}  # fmt: skip  # the jobs taken wait up to START_HOLD (1 s) for the start: running now
    with consume_subprocess("tests.integration.cutapp:app", env, ("--concurrency", "2", "--grace", "5s"), log) as proc:
        deadline = time.monotonic() + 30
        while "lost while starting" not in log.read_text():
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            await asyncio.sleep(0.05)
        proc.send_signal(signal.SIGTERM)  # within the 1 s before the start begins again
        code = await exit_code(proc)
    out = log.read_text()
    await app.close()
    # before: "worker stopped while starting: no delivery was taken; exit 0" and exit 0, after 2 jobs ran unacked
    assert code == 1, out
    assert "no delivery was taken" not in out, out
    assert (
        "worker stopped while starting: outcomes 2 ack_uncertain; at its stop 2 in-flight job(s) finished, 2 of "
        "them not acked" in out
    ), out
    assert await depth(broker, "work") == 2  # redelivered to the next worker: none lost
