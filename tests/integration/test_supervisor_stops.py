"""``consume`` (one process or ``--processes N``) stopped while a worker can't act on its signals."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from amqpjobs.wire.settings import BrokerSettings
from tests.integration.test_worker_process import exit_code, publisher, read_record, wait_until, worker_process
from tests.integration.test_worker_processes import log_text, wait_until_depth

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]


def running(pid: int) -> bool:
    """Whether process ``pid`` still exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("processes", ["1", "2"])
async def test_a_second_signal_ends_a_worker_whose_loop_is_blocked(
    broker: BrokerSettings, tmp_path: Path, processes: str
):
    """Ctrl-C twice while an async handler blocks its loop for 120 s: exit 130 at once, the job back in its queue."""
    app = await publisher(broker, tmp_path)
    app.job("wedge", queue="work")(lambda p, c: None)  # same name as procapp's: only to publish
    record = tmp_path / "record.txt"
    with worker_process(broker, tmp_path, "--processes", processes, "--grace", "60s") as proc:
        await app.enqueue("wedge", {"seconds": 120}, job_id="wedged")
        await wait_until(lambda: any(r[0] == "start" for r in read_record(record)), 30, "the job to start")
        proc.send_signal(signal.SIGINT)
        await asyncio.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        started = time.monotonic()
        code = await exit_code(proc, 60)
        took = time.monotonic() - started
    out = log_text(tmp_path)
    assert code == 130, out
    assert took < 10, f"exited {took:.1f}s after the second signal\n{out}"
    await app.close()
    await wait_until_depth(broker, "work", 1)


async def test_a_second_signal_kills_a_child_that_ignores_sigterm(broker: BrokerSettings, tmp_path: Path):
    """Ctrl-C twice while a child's app made it ignore SIGTERM: the supervisor still exits 130, no child left."""
    app = await publisher(broker, tmp_path)
    app.job("deaf", queue="work")(lambda p, c: None)  # same name as procapp's: only to publish
    record = tmp_path / "record.txt"
    with worker_process(broker, tmp_path, "--processes", "2", "--grace", "60s") as proc:
        await app.enqueue("deaf", {"seconds": 120}, job_id="deaf-1")
        await wait_until(lambda: any(r[0] == "start" for r in read_record(record)), 30, "the job to start")
        pid = next(int(r[4]) for r in read_record(record) if r[0] == "start")
        proc.send_signal(signal.SIGINT)
        await asyncio.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        started = time.monotonic()
        code = await exit_code(proc, 60)
        took = time.monotonic() - started
    out = log_text(tmp_path)
    assert code == 130, out
    assert took < 10, f"exited {took:.1f}s after the second signal\n{out}"
    assert not running(pid), f"child pid {pid} still runs\n{out}"
    assert "killing child" in out, out
    await app.close()
    await wait_until_depth(broker, "work", 1)


@pytest.mark.parametrize("processes", ["1", "2"])
async def test_the_grace_ends_a_worker_whose_loop_is_blocked(broker: BrokerSettings, tmp_path: Path, processes: str):
    """One SIGTERM, --grace 2s, an async handler blocking its loop for 60 s: the process ends soon after the grace."""
    app = await publisher(broker, tmp_path)
    app.job("wedge", queue="work")(lambda p, c: None)  # same name as procapp's: only to publish
    record = tmp_path / "record.txt"
    with worker_process(broker, tmp_path, "--processes", processes, "--grace", "2s") as proc:
        await app.enqueue("wedge", {"seconds": 60}, job_id="wedged")
        await wait_until(lambda: any(r[0] == "start" for r in read_record(record)), 30, "the job to start")
        proc.send_signal(signal.SIGTERM)
        started = time.monotonic()
        code = await exit_code(proc, 40)
        took = time.monotonic() - started
    out = log_text(tmp_path)
    assert code == 1, out  # work abandoned
    assert took < 15, f"exited {took:.1f}s after the signal, with --grace 2s\n{out}"
    assert "the event loop has not answered for 5s, 8s after the stop began (grace 2s)" in out, out
    await app.close()
    await wait_until_depth(broker, "work", 1)


async def test_children_still_importing_the_app_end_when_their_supervisor_is_killed(
    broker: BrokerSettings, tmp_path: Path
):
    """The supervisor SIGKILLed while both children import an app that takes 60 s: they end at once (was: 60 s on)."""
    record = tmp_path / "record.txt"
    with worker_process(broker, tmp_path, "--processes", "2", PROCAPP_CHILD_SLOW_IMPORT="60") as proc:
        await wait_until(lambda: sum(1 for r in read_record(record) if r[0] == "importing") == 2, 30, "2 imports")
        pids = [int(r[1]) for r in read_record(record) if r[0] == "importing"]
        proc.kill()
        await exit_code(proc)
        deadline = time.monotonic() + 10
        while any(running(pid) for pid in pids) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        left = [pid for pid in pids if running(pid)]
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    assert left == [], (tmp_path / "worker.log").read_text()


def metrics_dirs(tmp: Path) -> list[Path]:
    """The supervisors' metrics folders in ``tmp`` (their ``TMPDIR``)."""
    return sorted(tmp.glob("amqpjobs-metrics-*"))


def readies(log: str) -> int:
    """How many ``child N ready`` lines."""
    return sum(1 for line in log.splitlines() if line.endswith(" ready") and "supervisor: child " in line)


def child_pids(log: str) -> list[int]:
    """The pids of ``child N started (pid P)`` lines, in order."""
    return [int(line.rsplit("(pid ", 1)[1].rstrip(")")) for line in log.splitlines() if " started (pid " in line]


async def test_a_killed_supervisors_metrics_folder_is_removed_by_the_next_start(broker: BrokerSettings, tmp_path: Path):
    """A supervisor with ``--metrics-port`` SIGKILLed leaves its folder of children's counts in the temp folder (it
    can't remove it); the next supervisor's start removes it once its children have ended, and its own at its stop
    (was: one folder left in /tmp for every killed supervisor, for ever)."""
    app = await publisher(broker, tmp_path)  # the topology applied
    await app.close()
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    with worker_process(broker, tmp_path, "--processes", "2", "--metrics-port", "0", TMPDIR=str(tmp)) as proc:
        await wait_until(lambda: readies(log_text(tmp_path)) == 2, 60, "2 children ready")
        first = metrics_dirs(tmp)
        pids = child_pids(log_text(tmp_path))
        proc.kill()
        await exit_code(proc)
        await wait_until(lambda: not any(running(pid) for pid in pids), 30, "the orphaned children to end")
    assert len(first) == 1, log_text(tmp_path)
    assert len(pids) == 2, log_text(tmp_path)
    assert metrics_dirs(tmp) == first  # left by the kill
    with worker_process(broker, tmp_path, "--processes", "2", "--metrics-port", "0", TMPDIR=str(tmp)) as proc:
        await wait_until(lambda: readies(log_text(tmp_path)) == 4, 60, "2 more children ready")
        during = metrics_dirs(tmp)
        proc.terminate()
        assert await exit_code(proc) == 0, log_text(tmp_path)
    assert len(during) == 1, (first, during)  # the killed one's gone, its own in use
    assert during != first
    assert metrics_dirs(tmp) == []  # and its own removed at its stop
