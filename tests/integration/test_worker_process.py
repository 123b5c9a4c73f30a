"""The worker as a process (`amqpjobs consume`): SIGTERM drain, kill -9, broker restart."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from amqpjobs import App, SqliteResults
from amqpjobs.wire.settings import BrokerSettings
from tests.conftest import BrokerRoot
from tests.integration.helpers import ROOT, cli_subprocess, consume_subprocess, depth, wait_until_async, write_file
from tests.integration.worker_env import APPLIED_TOPOLOGY, make_app

pytestmark = pytest.mark.broker


def read_record(path: Path) -> list[list[str]]:
    if not path.exists():
        return []
    return [line.split() for line in path.read_text().splitlines() if line.strip()]


def done_ids(path: Path) -> Counter[str]:
    return Counter(parts[1] for parts in read_record(path) if parts[0] == "done")


@contextmanager
def worker_process(broker: BrokerSettings, tmp_path: Path, *args: str, **extra: str) -> Iterator[subprocess.Popen[str]]:
    """``amqpjobs consume tests.integration.procapp:app *args``, logs to worker.log (``extra``: more env vars)."""
    topo = tmp_path / "proc.toml"
    write_file(topo, APPLIED_TOPOLOGY)  # whole at once: a worker still starting may be reading it
    env = {"AMQPJOBS_URL": broker.url, "AMQPJOBS_MANAGEMENT_URL": broker.management_url,
           "PROCAPP_TOPOLOGY": str(topo), "PROCAPP_RECORD": str(tmp_path / "record.txt"), **extra}  # fmt: skip
    with consume_subprocess("tests.integration.procapp:app", env, args, tmp_path / "worker.log") as proc:
        yield proc


async def exit_code(proc: subprocess.Popen[str], timeout: float = 30) -> int:
    return await asyncio.to_thread(proc.wait, timeout)


async def wait_until(predicate: object, timeout: float = 30.0, what: str = "condition") -> None:
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def publisher(broker: BrokerSettings, tmp_path: Path) -> App:
    app = await make_app(broker, tmp_path)
    app.job("sleep", queue="work")(lambda p, c: None)  # same name as procapp's job: only to publish
    return app


async def test_sigterm_drains_20_in_flight_jobs_and_exits_0(broker: BrokerSettings, tmp_path: Path):
    app = await publisher(broker, tmp_path)
    record = tmp_path / "record.txt"
    with worker_process(broker, tmp_path, "--concurrency", "20", "--grace", "30s") as proc:
        for i in range(20):
            await app.enqueue("sleep", {"seconds": 2}, job_id=f"slow-{i}")
        await wait_until(lambda: sum(1 for r in read_record(record) if r[0] == "start") == 20, 20, "20 starts")
        assert done_ids(record) == Counter()  # all 20 in flight
        proc.send_signal(signal.SIGTERM)
        code = await exit_code(proc)
    out = (tmp_path / "worker.log").read_text()
    assert code == 0, out
    await app.close()
    assert done_ids(record) == Counter({f"slow-{i}": 1 for i in range(20)})
    assert await depth(broker, "work") == 0  # acked: nothing returns to the queue
    assert await depth(broker, "work.quarantine") == 0
    assert "draining 20 in-flight job(s)" in out


async def test_kill_9_mid_handler_job_is_redelivered_and_completes(broker: BrokerSettings, tmp_path: Path):
    app = await publisher(broker, tmp_path)
    record = tmp_path / "record.txt"
    with worker_process(broker, tmp_path) as proc:
        await app.enqueue("sleep", {"seconds": 3}, job_id="victim")
        await wait_until(lambda: any(r[0] == "start" for r in read_record(record)), 20, "the job to start")
        proc.kill()  # SIGKILL mid-handler
        proc.wait(10)
    assert done_ids(record) == Counter()
    with worker_process(broker, tmp_path) as again:
        await wait_until(lambda: done_ids(record) == Counter({"victim": 1}), 30, "redelivered job to complete")
        again.send_signal(signal.SIGTERM)  # drain: the handler recorded "done" just before its ack
        assert await exit_code(again) == 0
    await app.close()
    starts = [r[:4] for r in read_record(record) if r[0] == "start"]
    assert starts == [["start", "victim", "1", "0"], ["start", "victim", "1", "1"]]  # second run: redelivered
    assert await depth(broker, "work") == 0


async def test_kill_9_after_the_handler_yielded_returns_the_unacked_job_and_it_completes(
    broker: BrokerSettings, tmp_path: Path
):
    # the handler yielded to the loop (0.2 s) before the kill: an ack sent before the handler ran
    # (even batched to the loop's next turn) would have reached the broker by then and lost the job
    app = await publisher(broker, tmp_path)
    app.job("hold", queue="work")(lambda p, c: None)
    record = tmp_path / "record.txt"
    with worker_process(broker, tmp_path) as proc:
        await app.enqueue("hold", {}, job_id="held")
        await wait_until(lambda: any(r[0] == "yielded" for r in read_record(record)), 20, "the handler to yield")
        proc.kill()  # SIGKILL mid-handler
        proc.wait(10)
    ready = 0
    for _ in range(100):  # the broker requeues what the dead connection held
        if (ready := await depth(broker, "work")) == 1:
            break
        await asyncio.sleep(0.05)
    assert ready == 1  # unacked: back in its queue
    with worker_process(broker, tmp_path) as again:
        await wait_until(lambda: done_ids(record) == Counter({"held": 1}), 20, "redelivered job to complete")
        again.send_signal(signal.SIGTERM)
        assert await exit_code(again) == 0
    await app.close()
    starts = [r[:4] for r in read_record(record) if r[0] == "start"]
    assert starts == [["start", "held", "1", "0"], ["start", "held", "1", "1"]]  # second run: redelivered
    assert await depth(broker, "work") == 0


async def _has_state(results: SqliteResults, job_id: str, state: str) -> bool:
    try:
        return state in [r.state for r in await results.history(job_id)]
    except sqlite3.OperationalError:  # the worker is creating the store or writing to it
        return False


@pytest.mark.version_independent
async def test_after_a_kill_9_job_show_words_the_run_from_its_record_not_as_held(
    broker: BrokerSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("PROCAPP_RESULTS", str(tmp_path / "results.db"))
    app = await publisher(broker, tmp_path)
    record = tmp_path / "record.txt"
    results = SqliteResults(tmp_path / "results.db")
    with worker_process(broker, tmp_path) as proc:
        await app.enqueue("sleep", {"seconds": 30}, job_id="lost-run")
        await wait_until(lambda: any(r[0] == "start" for r in read_record(record)), 20, "the job to start")
        # the running record is written in the background, in the worker's time (not a fixed 0.5 s)
        await wait_until_async(lambda: _has_state(results, "lost-run", "running"), 20, "the running record")
        proc.kill()  # SIGKILL mid-handler: the broker returns the message to the ready queue
        proc.wait(10)
    await app.close()
    await results.close()
    for _ in range(100):
        if await depth(broker, "work") == 1:
            break
        await asyncio.sleep(0.05)
    assert await depth(broker, "work") == 1
    monkeypatch.setenv("PROCAPP_TOPOLOGY", str(tmp_path / "proc.toml"))  # the CLI's process loads procapp too
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    shown = await asyncio.to_thread(cli_subprocess, broker, "job", "show", "lost-run", "--app",
                                    "tests.integration.procapp:app")  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert "job lost-run: running" in shown.stdout  # its lease (120 s) has not passed
    assert "now: last started by a worker at " in shown.stdout
    assert "from work queue work; may be back in its queue after a worker loss" in shown.stdout
    assert "held by a worker" not in shown.stdout


@pytest.mark.slow
@pytest.mark.serial  # restarts the project's local node
@pytest.mark.timeout(300)
async def test_broker_restart_during_2000_jobs_all_complete(
    broker: BrokerSettings, broker_root: BrokerRoot, tmp_path: Path
):
    if broker_root.source != "local":
        pytest.skip("needs the project's local node to restart it")
    app = await publisher(broker, tmp_path)
    record = tmp_path / "record.txt"
    with worker_process(broker, tmp_path, "--concurrency", "4") as proc:
        for i in range(2000):
            await app.enqueue("sleep", {"seconds": 0.005}, job_id=f"j-{i}")
        await app.close()
        await wait_until(lambda: sum(done_ids(record).values()) >= 300, 60, "300 jobs done")
        await asyncio.to_thread(broker_root.ctl, "stop_app")
        await asyncio.sleep(2)
        await asyncio.to_thread(broker_root.ctl, "start_app")
        await wait_until(lambda: set(done_ids(record)) == {f"j-{i}" for i in range(2000)}, 180, "all 2000 done")
        assert proc.poll() is None, "the worker kept running through the restart"
        proc.send_signal(signal.SIGTERM)
        assert await exit_code(proc) == 0
    done = done_ids(record)
    assert set(done) == {f"j-{i}" for i in range(2000)}
    # at-least-once: a job whose ack was lost with the connection may run twice, never zero times
    assert sum(done.values()) - 2000 <= 4 * 2, done.most_common(10)
    assert await depth(broker, "work") == 0
    assert await depth(broker, "work.quarantine") == 0
