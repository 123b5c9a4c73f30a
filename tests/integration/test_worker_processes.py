"""``amqpjobs consume --processes N``: a supervisor of N worker processes, on the real broker."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import ROOT, depth
from tests.integration.test_worker_process import (
    done_ids,
    exit_code,
    publisher,
    read_record,
    wait_until,
    worker_process,
)
from tests.integration.worker_env import APPLIED_TOPOLOGY

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]


def supervisor(
    broker: BrokerSettings, tmp_path: Path, *args: str, **env: str
) -> AbstractContextManager[subprocess.Popen[str]]:
    """``consume --processes 2 *args`` (killed at the end if still running: its children then drain by themselves)."""
    return worker_process(broker, tmp_path, "--processes", "2", *args, **env)


def log_text(tmp_path: Path) -> str:
    return (tmp_path / "worker.log").read_text()


def child_pids(tmp_path: Path) -> list[tuple[int, int]]:
    """(child, pid) of every child started, in order."""
    return [(int(c), int(p)) for c, p in re.findall(r"child (\d+) started \(pid (\d+)\)", log_text(tmp_path))]


async def metrics_port(tmp_path: Path) -> int:
    found: list[str] = []

    def bound() -> bool:
        found[:] = re.findall(r"metrics and health on http://127\.0\.0\.1:(\d+)/metrics", log_text(tmp_path))
        return bool(found)

    await wait_until(bound, 30, "the supervisor's metrics line")
    return int(found[0])


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def succeeded(port: int, job: str) -> float:
    _, text = get(port, "/metrics")
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "amqpjobs_jobs_total" and s.labels.get("job") == job and s.labels.get("outcome") == "succeeded"
    )


async def test_a_sigkilled_child_is_restarted_and_its_jobs_complete(broker: BrokerSettings, tmp_path: Path):
    app = await publisher(broker, tmp_path)
    record = tmp_path / "record.txt"
    with supervisor(broker, tmp_path, "--concurrency", "4", "--metrics-port", "0") as proc:
        port = await metrics_port(tmp_path)
        await wait_until(lambda: get(port, "/readyz")[0] == 200, 30, "both children ready")
        ids = [f"k-{i}" for i in range(8)]
        for job_id in ids:
            await app.enqueue("sleep", {"seconds": 2}, job_id=job_id)
        await wait_until(lambda: sum(1 for r in read_record(record) if r[0] == "start") == 8, 20, "8 starts")
        first = dict(child_pids(tmp_path))
        assert sorted(first) == [1, 2]
        victims = {r[1] for r in read_record(record) if r[0] == "start" and int(r[4]) == first[1]}
        assert victims  # child 1 holds some of the 8 (prefetch 4 each)
        os.kill(first[1], signal.SIGKILL)
        await wait_until(lambda: get(port, "/healthz")[0] == 503, 5, "/healthz 503 while child 1 is down")
        await wait_until(lambda: done_ids(record) == Counter(dict.fromkeys(ids, 1)), 30, "every job done once")
        restarted = [pid for child, pid in child_pids(tmp_path) if child == 1]
        assert len(restarted) == 2
        assert restarted[0] == first[1]
        again = [r for r in read_record(record) if r[0] == "start" and r[1] in victims and r[3] == "1"]
        assert {r[1] for r in again} == victims  # the killed child's jobs came back redelivered
        await wait_until(lambda: get(port, "/readyz")[0] == 200, 30, "ready again after the restart")
        assert get(port, "/healthz")[0] == 200
        assert "child 1 exited with signal 9; restarting it in 0.25s" in log_text(tmp_path)
        proc.send_signal(signal.SIGTERM)
        assert await exit_code(proc) == 0, log_text(tmp_path)
    await app.close()
    assert await depth(broker, "work") == 0


async def test_sigterm_drains_every_child_and_exits_0(broker: BrokerSettings, tmp_path: Path):
    """The children run on uvloop here (--loop reaches them); the other tests use asyncio's loop."""
    app = await publisher(broker, tmp_path)
    record = tmp_path / "record.txt"
    with supervisor(broker, tmp_path, "--concurrency", "5", "--grace", "30s", "--loop", "uvloop") as proc:
        await wait_until(lambda: len(re.findall(r"child \d ready", log_text(tmp_path))) == 2, 30, "both children ready")
        ids = [f"slow-{i}" for i in range(10)]
        for job_id in ids:
            await app.enqueue("sleep", {"seconds": 2}, job_id=job_id)
        await wait_until(lambda: sum(1 for r in read_record(record) if r[0] == "start") == 10, 20, "10 starts")
        assert done_ids(record) == Counter()
        pids = Counter(int(r[4]) for r in read_record(record) if r[0] == "start")
        assert sorted(pids.values()) == [5, 5]  # 5 slots each, all busy
        assert set(pids) == {pid for _, pid in child_pids(tmp_path)}
        proc.send_signal(signal.SIGTERM)
        code = await exit_code(proc)
    out = log_text(tmp_path)
    assert code == 0, out
    await app.close()
    assert done_ids(record) == Counter(dict.fromkeys(ids, 1))
    assert await depth(broker, "work") == 0
    assert re.search(r"INFO \[child 1\] amqpjobs\.\S+: draining 5 in-flight job\(s\)", out), out
    assert re.search(r"INFO \[child 2\] amqpjobs\.\S+: draining 5 in-flight job\(s\)", out), out
    assert "every child stopped" in out
    assert len(child_pids(tmp_path)) == 2  # nothing was restarted while draining


async def test_one_metrics_endpoint_counts_2000_jobs_from_2_children_exactly(broker: BrokerSettings, tmp_path: Path):
    app = await publisher(broker, tmp_path)
    app.job("count", queue="work")(lambda p, c: None)
    record = tmp_path / "record.txt"
    with supervisor(broker, tmp_path, "--concurrency", "16", "--metrics-port", "0") as proc:
        port = await metrics_port(tmp_path)
        await wait_until(lambda: get(port, "/readyz")[0] == 200, 30, "both children ready")
        for i in range(2000):
            await app.enqueue("count", {}, job_id=f"c-{i}")
        await wait_until(lambda: sum(1 for r in read_record(record) if r[0] == "count") >= 2000, 60, "2000 jobs")
        await wait_until(lambda: succeeded(port, "count") >= 2000, 10, "2000 counted")
        await asyncio.sleep(0.5)  # nothing more arrives: exactly 2000, not more
        assert succeeded(port, "count") == 2000
        by_pid = Counter(int(r[2]) for r in read_record(record) if r[0] == "count")
        assert sum(by_pid.values()) == 2000
        assert len(by_pid) == 2
        assert min(by_pid.values()) > 0
        ready_text = get(port, "/readyz")[1]
        assert "child 1: consuming work with 16 slot(s)" in ready_text
        assert "child 2: consuming work with 16 slot(s)" in ready_text
        os.kill(dict(child_pids(tmp_path))[2], signal.SIGKILL)  # an exited child's counts stay in the sum
        await wait_until(lambda: len(child_pids(tmp_path)) == 3, 10, "child 2 restarted")
        assert succeeded(port, "count") == 2000
        proc.send_signal(signal.SIGTERM)
        assert await exit_code(proc) == 0, log_text(tmp_path)
    await app.close()


async def test_a_child_failing_at_import_5_times_ends_the_supervisor_with_that_error(
    broker: BrokerSettings, tmp_path: Path
):
    record = tmp_path / "record.txt"
    started = time.monotonic()
    with supervisor(broker, tmp_path, PROCAPP_FAIL_IMPORT="1") as proc:
        code = await exit_code(proc, 60)
    out = log_text(tmp_path)
    assert code == 2, out  # a ConfigurationError: exit 2, as a single worker failing at import
    assert time.monotonic() - started < 60
    assert re.search(
        r"error: worker child [12] exited before it was ready 5 times within 60s; every child was stopped\. "
        r"Its error: importing module 'tests\.integration\.procapp' failed: RuntimeError: procapp configured "
        r"to fail at import \(PROCAPP_FAIL_IMPORT\)",
        out,
    ), out
    # the supervisor imports the app once first, to check it (no AMQPJOBS_CHILD): the module's own error
    # may pass, so it starts the children anyway, and the crash loop decides, as before that check
    records = [r for r in read_record(record) if r[0] == "import"]
    assert records[0] == ["import", "-", str(proc.pid)], records
    assert "the app's module failed while the supervisor imported it to check it (importing module" in out
    imports = Counter(r[1] for r in records[1:])
    assert max(imports.values()) == 5
    assert set(imports) == {"1", "2"}
    assert all(n <= 5 for n in imports.values())
    assert "restarting it in 0.25s" in out
    assert "restarting it in 0.50s" in out
    assert "restarting it in 2.00s" in out


@pytest.mark.parametrize("processes", ["1", "2"])
async def test_two_sigints_exit_130_as_a_single_worker_does(broker: BrokerSettings, tmp_path: Path, processes: str):
    """Ctrl-C twice: exit 130 (README "Exit codes"), and the abandoned job goes back to its queue."""
    app = await publisher(broker, tmp_path)
    record = tmp_path / "record.txt"
    with worker_process(broker, tmp_path, "--processes", processes, "--grace", "60s") as proc:
        await app.enqueue("sleep", {"seconds": 60}, job_id="held")
        await wait_until(lambda: any(r[0] == "start" for r in read_record(record)), 30, "the job to start")
        proc.send_signal(signal.SIGINT)
        await wait_until(lambda: "draining 1 in-flight job(s)" in log_text(tmp_path), 10, "the drain")
        proc.send_signal(signal.SIGINT)
        code = await exit_code(proc)
    out = log_text(tmp_path)
    assert code == 130, out
    assert "second signal 2" in out
    await app.close()
    assert done_ids(record) == Counter()
    await wait_until_depth(broker, "work", 1)


async def wait_until_depth(broker: BrokerSettings, queue: str, expected: int, timeout: float = 30) -> None:
    """Wait for the management API to report ``expected`` messages in ``queue`` (its stats lag a few seconds)."""
    deadline = time.monotonic() + timeout
    while (found := await depth(broker, queue)) != expected:
        assert time.monotonic() < deadline, f"{queue} holds {found} message(s), not {expected}"
        await asyncio.sleep(0.25)


async def test_children_sharing_a_slow_pipe_write_every_outcome_line_whole_even_for_a_hostile_name(
    broker: BrokerSettings, tmp_path: Path
):
    """2 children, one stderr pipe read slowly (it fills), 2,000 jobs and 50 named by 6,000 control characters.

    Each outcome line must arrive whole, once, with its outcome: no line over 1,000 characters,
    none split or mixed with another child's (writes of at most PIPE_BUF bytes).
    """
    import aio_pika

    app = await publisher(broker, tmp_path)
    app.job("count", queue="work")(lambda p, c: None)
    connection = await aio_pika.connect(broker.url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.get_exchange("jobs")
        for i in range(2000):
            await app.enqueue("count", {}, job_id=f"c-{i:04d}")
            if i % 40 == 0:  # another publisher's: a job name of any length, in the amqpjobs-job header
                await exchange.publish(aio_pika.Message(b"{}", message_id=f"L-{i:04d}", content_type="application/json",
                                       headers={"amqpjobs-job": "\x01" * 6000}), routing_key="work")  # fmt: skip
    topo = tmp_path / "proc.toml"
    topo.write_text(APPLIED_TOPOLOGY)
    env = {**os.environ, "AMQPJOBS_URL": broker.url, "AMQPJOBS_MANAGEMENT_URL": broker.management_url,
           "PROCAPP_TOPOLOGY": str(topo), "PROCAPP_RECORD": str(tmp_path / "record.txt")}  # fmt: skip
    exe = Path(sys.executable).with_name("amqpjobs")
    got = bytearray()
    proc = subprocess.Popen([str(exe), "consume", "tests.integration.procapp:app", "--processes", "2",  # noqa: ASYNC220
                             "--concurrency", "16"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)  # fmt: skip
    assert proc.stdout is not None
    out = proc.stdout

    def slow_reader() -> None:  # 1,000 bytes per 0.5 ms at most: the pipe fills, the children's writes wait
        while chunk := os.read(out.fileno(), 1000):
            got.extend(chunk)
            time.sleep(0.0005)

    reader = threading.Thread(target=slow_reader)
    reader.start()
    try:
        outcome = re.compile(rb" id=(c-\d{4}|L-\d{4}) attempt=1 duration=\S+ outcome=(succeeded|quarantined)\b")
        await wait_until(lambda: len(outcome.findall(bytes(got))) >= 2050, 120, "2,050 outcome lines")
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        reader.join(30)
        out.close()
    lines = bytes(got).decode().splitlines()
    stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} "
    line = re.compile(stamp + r"(INFO|WARNING|ERROR) (\[child [12]\] )?amqpjobs[\w.]*: [^\n]*")
    broken = [x[:120] for x in lines if not x.startswith("    ") and not line.fullmatch(x)]
    assert broken == []
    assert [x for x in lines if len(x) > 1000] == []
    assert [x[:120] for x in lines if len(re.findall(stamp, x)) > 1] == []  # none mixed
    seen = Counter((m[0], m[1]) for m in outcome.findall(bytes(got)))
    assert sum(seen.values()) == 2050
    assert {k for k, n in seen.items() if n != 1} == set()
    assert sorted(k[0] for k in seen if k[1] == b"succeeded") == [f"c-{i:04d}".encode() for i in range(2000)]
    assert sorted(k[0] for k in seen if k[1] == b"quarantined") == [f"L-{i:04d}".encode() for i in range(0, 2000, 40)]
    await app.close()


async def test_a_restarted_child_never_creates_a_store_file_deleted_meanwhile(broker: BrokerSettings, tmp_path: Path):
    """The supervisor's load of the app opened (created) the SQLite results store first; a child restarted after
    the file was deleted opens it as it is: an error naming the file, never a new empty one (before: created)."""
    app = await publisher(broker, tmp_path)  # the topology applied
    await app.close()
    results = tmp_path / "results.db"
    with supervisor(broker, tmp_path, "--metrics-port", "0", PROCAPP_RESULTS=str(results)):
        port = await metrics_port(tmp_path)
        await wait_until(lambda: get(port, "/readyz")[0] == 200, 30, "both children ready")
        assert results.exists()
        for p in (results, Path(f"{results}-wal"), Path(f"{results}-shm")):
            p.unlink(missing_ok=True)
        os.kill(dict(child_pids(tmp_path))[1], signal.SIGKILL)
        await wait_until(lambda: len(child_pids(tmp_path)) >= 3, 10, "child 1 restarted")
        await wait_until(lambda: "is gone" in log_text(tmp_path) or results.exists(), 20, "the restarted child's open")
        await asyncio.sleep(1.0)
        assert not results.exists()  # before: created again, empty, by the restarted child
    assert f"the SQLite results store at {results} is gone" in log_text(tmp_path)
