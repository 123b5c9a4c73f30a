"""A plain-function handler still running after the stop's grace: its delivery never goes back while it may run.

A thread can't be stopped. ``amqpjobs consume`` (and each ``--processes`` child) ends its
process at once, before the consumer connection closes, so the thread dies before the
broker requeues the delivery; a :class:`Worker` awaited in-process keeps its connection
(the delivery unacked) until the thread ends. Either way the redelivery runs only after
the first run ended (README "Workers").
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from amqpjobs import JobContext
from amqpjobs.runtime.handler_threads import EXIT_BOUND
from amqpjobs.runtime.worker import Worker, WorkerOptions
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import consume_subprocess, depth, write_file
from tests.integration.test_worker_process import exit_code, publisher, read_record, wait_until
from tests.integration.test_worker_processes import wait_until_depth
from tests.integration.worker_env import APPLIED_TOPOLOGY, make_app

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]

ENDS_AT_ONCE = (
    "the process ends at once, before its connection closes, so that no abandoned thread finishes beside its redelivery"
)


@contextmanager
def worker(broker: BrokerSettings, tmp_path: Path, name: str, *args: str) -> Iterator[subprocess.Popen[str]]:
    """``amqpjobs consume tests.integration.procapp:app *args``, its output in ``<name>.log``."""
    topo = tmp_path / "proc.toml"
    write_file(topo, APPLIED_TOPOLOGY)
    env = {"AMQPJOBS_URL": broker.url, "AMQPJOBS_MANAGEMENT_URL": broker.management_url,
           "PROCAPP_TOPOLOGY": str(topo), "PROCAPP_RECORD": str(tmp_path / "record.txt")}  # fmt: skip
    with consume_subprocess("tests.integration.procapp:app", env, args, tmp_path / f"{name}.log") as proc:
        yield proc


def log_of(tmp_path: Path, name: str) -> str:
    path = tmp_path / f"{name}.log"
    return path.read_text() if path.exists() else ""


def ended(pid: int) -> bool:
    """The process is gone or a zombie (it exited; its parent has not reaped it yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def assert_runs_never_overlap(record: list[list[str]]) -> None:
    """Each start comes after the previous run's effect, or the previous run has none (its process ended first)."""
    starts = [i for i, r in enumerate(record) if r[0] == "start"]
    for previous, start in itertools.pairwise(starts):
        pid = record[previous][4]
        effects = [i for i, r in enumerate(record) if r[0] == "effect" and r[2] == pid and i > previous]
        assert not effects or effects[0] < start, f"run 2 started beside run 1: {record}"


async def abandon_a_thread(broker: BrokerSettings, tmp_path: Path, *a_args: str) -> tuple[int, float, int]:
    """Worker A runs ``effect`` (8 s) and gets SIGTERM 6 s in (grace 1 s) while worker B waits.

    Returns A's exit code, the seconds from the SIGTERM until the process that ran the job
    was gone, and that process's pid; B has run the redelivery to its end and stopped (exit 0).
    """
    app = await publisher(broker, tmp_path)
    app.job("effect", queue="work")(lambda p, c: None)  # same name as procapp's: only to publish
    record = tmp_path / "record.txt"
    with worker(broker, tmp_path, "a", "--concurrency", "1", "--grace", "1s", *a_args) as a:
        await wait_until(lambda: "worker consuming" in log_of(tmp_path, "a"), 30, "A consuming")
        await app.enqueue("effect", {"seconds": 8}, job_id="once")
        await wait_until(lambda: any(r[0] == "start" for r in read_record(record)), 30, "run 1 to start")
        began = time.monotonic()
        ran_in = int(read_record(record)[0][4])
        with worker(broker, tmp_path, "b", "--concurrency", "1") as b:
            await wait_until(lambda: "worker consuming" in log_of(tmp_path, "b"), 30, "B consuming")
            await asyncio.sleep(max(0.0, began + 6 - time.monotonic()))
            a.send_signal(signal.SIGTERM)
            sent = time.monotonic()
            await wait_until(lambda: ended(ran_in), 30, "A's process to end")
            gone = time.monotonic() - sent
            code = await exit_code(a)
            await wait_until(lambda: sum(1 for r in read_record(record) if r[0] == "start") == 2, 30, "run 2")
            await wait_until(lambda: any(r[0] == "effect" and r[2] == str(b.pid) for r in read_record(record)),
                             30, "B's effect")  # fmt: skip
            b.send_signal(signal.SIGTERM)
            assert await exit_code(b) == 0, log_of(tmp_path, "b")
    await app.close()
    return code, gone, ran_in


@pytest.mark.serial  # a wall-clock bound: A gone within 1 s of its grace
@pytest.mark.timeout(120)
@pytest.mark.parametrize("processes", ["1", "2"])
async def test_a_thread_past_the_grace_ends_with_its_process_before_the_redelivery_runs(
    broker: BrokerSettings, tmp_path: Path, processes: str
) -> None:
    """Before: A logged "1 abandoned (redelivered)" and closed its connection, B started run 2, and A's
    thread wrote its effect 1 s later, beside run 2 (two effects, overlapping runs)."""
    code, gone, ran_in = await abandon_a_thread(broker, tmp_path, "--processes", processes)
    record = read_record(tmp_path / "record.txt")
    out = log_of(tmp_path, "a")
    b = [r[4] for r in record if r[0] == "start"][1]
    assert_runs_never_overlap(record)
    starts = [r[:4] for r in record if r[0] == "start"]
    assert starts == [["start", "once", "1", "0"], ["start", "once", "1", "1"]], record  # 2 runs: the bound
    assert [r for r in record if r[0] == "effect"] == [["effect", "once", b]], record  # A's thread died with A
    assert int(b) != ran_in
    assert code == 1, out
    assert gone < 2.0, f"A's process took {gone:.2f}s after the SIGTERM (grace 1s)"
    assert "1 job(s) still running after the grace period; they will be redelivered" in out, out
    assert f"1 plain-function handler thread(s) still running can't be stopped: {ENDS_AT_ONCE}" in out, out
    assert "worker stopped: 0 in-flight job(s) finished, 1 abandoned (redelivered); exit 1" in out, out
    assert await depth(broker, "work") == 0


@pytest.mark.parametrize("processes", ["1", "2"])
async def test_an_async_handler_past_the_grace_is_cancelled_and_the_worker_exits_1(
    broker: BrokerSettings, tmp_path: Path, processes: str
) -> None:
    app = await publisher(broker, tmp_path)
    record = tmp_path / "record.txt"
    with worker(broker, tmp_path, "a", "--concurrency", "1", "--grace", "1s", "--processes", processes) as a:
        await wait_until(lambda: "worker consuming" in log_of(tmp_path, "a"), 30, "A consuming")
        await app.enqueue("sleep", {"seconds": 8}, job_id="cut")
        await wait_until(lambda: any(r[0] == "start" for r in read_record(record)), 30, "the run to start")
        a.send_signal(signal.SIGTERM)
        code = await exit_code(a)
    await app.close()
    out = log_of(tmp_path, "a")
    assert code == 1, out
    assert "1 job(s) still running after the grace period; they will be redelivered" in out, out
    assert "worker stopped: 0 in-flight job(s) finished, 1 abandoned (redelivered); exit 1" in out, out
    assert "thread(s) still running" not in out, out  # cancelled: nothing runs on
    assert [r[0] for r in read_record(record)] == ["start"]
    await wait_until_depth(broker, "work", 1)


@pytest.mark.timeout(60)
async def test_an_awaited_worker_keeps_a_running_threads_delivery_until_the_thread_ends(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """In-process (no hard exit): past the grace the connection stays open, the delivery unacked, until the
    thread ends; then it closes and the broker requeues. Before: closed at the grace while the thread ran on."""
    app = await make_app(broker, tmp_path)
    started, release = threading.Event(), threading.Event()
    effects: list[str] = []

    @app.job("slow", queue="work")
    def slow(payload: dict[str, Any], ctx: JobContext) -> None:
        started.set()
        release.wait(30)
        effects.append(ctx.job_id)

    caplog.set_level(logging.INFO, logger="amqpjobs")
    embedded = Worker(app, broker, WorkerOptions(queues=("work",), concurrency=1, grace=0.5))
    await embedded.start()
    await app.enqueue("slow", {}, job_id="t1")
    assert await asyncio.to_thread(started.wait, 20)
    stopping = asyncio.create_task(embedded.shutdown())
    try:
        await asyncio.sleep(1.5)  # the grace is over, the thread runs on
        assert not stopping.done(), "the worker closed while the handler's thread still ran"
        assert await depth(broker, "work") == 0  # still unacked on the open connection: not back
        assert effects == []
        release.set()
        assert await asyncio.wait_for(stopping, 10) == 1
    finally:
        release.set()
        await app.close()
    assert effects == ["t1"]  # the run ended before the delivery went back
    for _ in range(100):
        if await depth(broker, "work") == 1:
            break
        await asyncio.sleep(0.05)
    assert await depth(broker, "work") == 1
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("amqpjobs")]
    assert "1 job(s) still running after the grace period; they will be redelivered" in lines
    assert any(re.fullmatch(
        r"1 plain-function handler thread\(s\) still running can't be stopped: the worker keeps its connection "
        r"\(their deliveries unacked\) until they end, so that none finishes beside its redelivery", line)
        for line in lines), lines  # fmt: skip


@pytest.mark.timeout(120)
@pytest.mark.parametrize("processes", ["1", "2"])
@pytest.mark.parametrize("how", ["thread", "executor"])
async def test_a_thread_the_app_left_running_does_not_keep_a_stopped_worker_process_alive(
    broker: BrokerSettings, tmp_path: Path, processes: str, how: str
) -> None:
    """A job that returned, leaving a thread of its own (a non-daemon thread, the loop's default executor).

    Before (helper-176): the worker logged "worker stopped ... exit 0", then its process stayed
    up as long as that thread (here 300 s; Python joins non-daemon threads and the default
    executor at its end), so a SIGTERM never ended it: only a second signal or SIGKILL did.
    """
    app = await publisher(broker, tmp_path)
    app.job("leak", queue="work")(lambda p, c: None)  # same name as procapp's: only to publish
    record = tmp_path / "record.txt"
    with worker(broker, tmp_path, "a", "--concurrency", "1", "--grace", "1s", "--processes", processes) as a:
        await wait_until(lambda: "worker consuming" in log_of(tmp_path, "a"), 30, "A consuming")
        await app.enqueue("leak", {"seconds": 300, "how": how}, job_id="leaky")
        await wait_until(lambda: any(r[0] == "start" for r in read_record(record)), 30, "the run")
        await wait_until(lambda: "outcome=succeeded" in log_of(tmp_path, "a"), 30, "its outcome")
        ran_in = int(read_record(record)[0][4])
        a.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        await wait_until(lambda: ended(ran_in), 30, "the process that ran it to end")
        gone = time.monotonic() - sent
        code = await exit_code(a)
    await app.close()
    out = log_of(tmp_path, "a")
    assert code == 0, out
    assert gone < EXIT_BOUND + 3, f"{gone:.1f}s after the SIGTERM"
    assert "exit 0" in out, out
    # the default executor names its threads asyncio_0, asyncio_1, ... in the order it starts them; a
    # connect's getaddrinfo may have started one before the job's (CI of stop 54: asyncio_1)
    thread = "app-poller" if how == "thread" else r"asyncio_\d+"
    assert re.search(rf"1 thread\(s\) the app left running \(.*{thread}.*\) still run {EXIT_BOUND:g}s after the "
                     r"worker stopped: the process ends without them", out), out  # fmt: skip
    assert await depth(broker, "work") == 0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("end", ["return", "raise", "timeout"])
async def test_a_thread_a_plain_function_left_running_does_not_keep_the_process_whatever_its_end(
    broker: BrokerSettings, tmp_path: Path, end: str
) -> None:
    """A plain-function handler that leaves a non-daemon thread, then returns, raises, or runs on past its timeout
    (the worker then stops itself, exit 1): the process ends within EXIT_BOUND of the worker's stop.

    ``timeout``: its timeout is 1 s and the grace 3 s, so the worker stops itself at 4 s and its stop's
    grace ends at 7 s; the stop waits for the other run (``effect``, 6.2 s: a stop never waits for the
    hung run itself, test_hung_thread_stop), and the hung run ends at 5.5 s meanwhile, 1.5 s from the
    stop's start, 0.7 s before the other. Before (CI of stop 54), a grace of 1 s and a run of 3 s ended
    together at 3 s: a run still going at the grace's end ends the process at once (exit 1, no
    app-thread line), so the line was there only when the run won.
    """
    app = await publisher(broker, tmp_path)
    for name in ("leak_sync", "effect"):
        app.job(name, queue="work")(lambda p, c: None)  # same name as procapp's: only to publish
    record = tmp_path / "record.txt"
    with worker(broker, tmp_path, "a", "--concurrency", "2", "--grace", "3s") as a:
        await wait_until(lambda: "worker consuming" in log_of(tmp_path, "a"), 30, "A consuming")
        await app.enqueue("leak_sync", {"seconds": 300, "end": end, "overrun": 5.5}, job_id="leaky")
        if end == "timeout":
            await app.enqueue("effect", {"seconds": 6.2}, job_id="other")
        await wait_until(lambda: any(r[0] == "start" for r in read_record(record)), 30, "the run")
        if end == "timeout":  # it stops itself
            await wait_until(lambda: "worker stopped" in log_of(tmp_path, "a"), 30, "the worker's stop")
        else:
            outcome = "outcome=succeeded" if end == "return" else "outcome=retried"
            await wait_until(lambda: outcome in log_of(tmp_path, "a"), 30, "its outcome")
            a.send_signal(signal.SIGTERM)
        stopped = time.monotonic()
        code = await exit_code(a, 60)
        gone = time.monotonic() - stopped
    await app.close()
    out = log_of(tmp_path, "a")
    assert gone < EXIT_BOUND + 3, f"{gone:.1f}s after the stop: {out}"
    assert re.search(r"thread\(s\) the app left running \(.*app-poller.*\) still run", out), out
    assert code == (1 if end == "timeout" else 0), out
    if end == "timeout":  # it ended inside the stop's grace: judged by its result, not abandoned
        assert re.search(r"its run ended 4\.\ds past its timeout of 1s, after this worker began to stop for it: "
                         r"judged by its result", out), out  # fmt: skip
        assert "1 abandoned" not in out, out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("processes", ["1", "2"])
async def test_a_worker_whose_start_fails_ends_its_process_though_the_app_left_a_thread(
    broker: BrokerSettings, tmp_path: Path, processes: str
) -> None:
    """The bound holds however the worker's run ends, not only when it returns: here its start fails (a job queue
    not in the topology, exit 2) while a thread the app's import started runs on. Before (helper-178): the error
    line, then the process stayed up as long as that thread (300 s here)."""
    topo = tmp_path / "proc.toml"
    write_file(topo, APPLIED_TOPOLOGY)
    env = {"AMQPJOBS_URL": broker.url, "AMQPJOBS_MANAGEMENT_URL": broker.management_url,
           "PROCAPP_TOPOLOGY": str(topo), "PROCAPP_RECORD": str(tmp_path / "record.txt"),
           "PROCAPP_IMPORT_THREAD": "300"}  # fmt: skip
    log = tmp_path / "a.log"
    args = ("--queues", "nosuch", "--processes", processes)
    with consume_subprocess("tests.integration.procapp:app", env, args, log) as a:
        await wait_until(lambda: "nosuch" in log_of(tmp_path, "a"), 60, "the start's error")
        said = time.monotonic()
        code = await exit_code(a, 60)
        gone = time.monotonic() - said
    out = log_of(tmp_path, "a")
    assert gone < EXIT_BOUND + 3, f"{gone:.1f}s after the error: {out}"
    assert code == 2, out
    assert re.search(r"thread\(s\) the app left running \(.*import-poller.*\) still run", out), out
