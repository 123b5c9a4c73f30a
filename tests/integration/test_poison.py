"""Poison containment: a job that kills, blocks or outlives its worker is quarantined ``crashed``.

Each test runs real worker processes (`amqpjobs consume`) under a small supervisor that
restarts a worker that died, as systemd or Kubernetes would, against the real broker.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Protocol
from urllib.parse import quote, urlsplit, urlunsplit

import aio_pika
import pytest

from amqpjobs import JobContext, Worker, WorkerOptions
from amqpjobs.jobs import crash, evidence
from amqpjobs.runtime.app import App
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.topology.loader import load_topology
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import ROOT, depth, drain, raw_channel
from tests.integration.tcp_proxy import TcpProxy

pytestmark = pytest.mark.broker

MAX_REDELIVERIES = 5  # the default

TOPOLOGY = """
[[exchange]]
name = "jobs"

[[job_queue]]
name = "work"
exchange = "jobs"
type = "{qtype}"
retry_tiers = {tiers}
{extra}
"""


class Supervisor:
    """Keeps ``n`` worker processes running, restarting one that exits (counting the restarts)."""

    def __init__(self, broker: BrokerSettings, tmp_path: Path, n: int, *args: str, url: str | None = None) -> None:
        self.env = dict(
            os.environ,
            AMQPJOBS_URL=url or broker.url,
            AMQPJOBS_MANAGEMENT_URL=broker.management_url,
            POISON_TOPOLOGY=str(tmp_path / "topology.toml"),
            POISON_RECORD=str(tmp_path / "record.txt"),
            POISON_LEDGER=str(tmp_path / "ledger.db"),
        )
        self.args = args
        self.broker, self.tmp_path = broker, tmp_path
        self.log = tmp_path / "workers.log"
        self.procs: list[subprocess.Popen[str]] = []
        self.n = n
        self.exits = 0

    def _spawn(self) -> subprocess.Popen[str]:
        exe = Path(sys.executable).with_name("amqpjobs")
        with self.log.open("a") as out:
            return subprocess.Popen(
                [str(exe), "consume", "tests.integration.poisonapp:app", *self.args],
                cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT, text=True,
            )  # fmt: skip

    async def run_until_done(self, done: int, quarantined: int, timeout: float) -> None:
        """:meth:`run_until` ``done`` distinct jobs recorded done and ``work.quarantine`` holds ``quarantined``."""

        async def finished() -> bool:
            ran = {r[1] for r in records(self.tmp_path) if r[0] == "done"}
            return len(ran) == done and await depth(self.broker, "work.quarantine") == quarantined

        await self.run_until(finished, timeout)

    async def run_until(self, done: object, timeout: float) -> None:
        assert callable(done)
        self.procs = [self._spawn() for _ in range(self.n)]
        deadline = time.monotonic() + timeout
        try:
            while not await done():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"not done after {timeout}s; log:\n{self.log.read_text()[-4000:]}")
                for i, proc in enumerate(self.procs):
                    if proc.poll() is not None:
                        self.exits += 1
                        self.procs[i] = self._spawn()
                await asyncio.sleep(0.1)
        finally:
            for proc in self.procs:
                if proc.poll() is None:
                    proc.terminate()
            for proc in self.procs:
                try:
                    await asyncio.to_thread(proc.wait, 20)
                except subprocess.TimeoutExpired:
                    proc.kill()


def records(tmp_path: Path) -> list[list[str]]:
    path = tmp_path / "record.txt"
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


async def setup(broker: BrokerSettings, tmp_path: Path, qtype: str, extra: str = "", tiers: str = '["1s"]') -> App:
    topo = tmp_path / "topology.toml"
    topo.write_text(TOPOLOGY.format(qtype=qtype, extra=extra, tiers=tiers))
    await apply_topology(topo, broker)
    app = App("poison-test", topology=load_topology(topo).topology, url=broker.url)
    app.job("poison", queue="work")(lambda p, c: None)  # same name as poisonapp's job: only to publish
    return app


async def crash_run(broker: BrokerSettings, tmp_path: Path, qtype: str, concurrency: int, workers: int) -> None:
    """One job exits its worker; 50 others behind it. Checks the bound, the evidence and no collateral."""
    app = await setup(broker, tmp_path, qtype)
    try:
        await app.enqueue("poison", {"kind": "exit"}, job_id="crasher")
        for i in range(50):
            await app.enqueue("poison", {"seconds": 0.02}, job_id=f"ok-{i}")
    finally:
        await app.close()

    supervisor = Supervisor(broker, tmp_path, workers, "--concurrency", str(concurrency), "--grace", "5s")
    await supervisor.run_until_done(50, 1, timeout=90)

    starts = Counter(r[1] for r in records(tmp_path) if r[0] == "start")
    done = Counter(r[1] for r in records(tmp_path) if r[0] == "done")
    crashes = starts["crasher"]
    assert 1 <= crashes <= MAX_REDELIVERIES + 1, starts
    assert supervisor.exits >= crashes - 1  # every start of the crasher but maybe the last took a worker down
    assert done["crasher"] == 0
    assert sorted(done) == sorted(f"ok-{i}" for i in range(50))
    extra_runs = sum(n - 1 for job, n in starts.items() if job != "crasher")
    assert extra_runs <= (concurrency - 1) * crashes, (extra_runs, starts)
    quarantined = await drain(broker, "work.quarantine")
    assert [m.message_id for m in quarantined] == ["crasher"]
    headers = quarantined[0].headers
    assert headers[evidence.REASON] == "crashed"
    assert headers[crash.STARTS] == crashes == MAX_REDELIVERIES + 1
    assert headers[evidence.ERROR_TYPE] == "WorkerLostError"
    assert str(headers[crash.LAST_START_PID]).isdigit()
    for queue in ("work", "work.retry.1s", "work.suspects"):
        assert await depth(broker, queue) == 0, queue


@pytest.mark.version_independent
@pytest.mark.parametrize("workers", [1, 3])
@pytest.mark.parametrize("concurrency", [1, 4])
@pytest.mark.parametrize("qtype", ["classic", "quorum"])
async def test_a_job_that_kills_its_worker_is_quarantined_crashed(
    broker: BrokerSettings, tmp_path: Path, qtype: str, concurrency: int, workers: int
) -> None:
    await crash_run(broker, tmp_path, qtype, concurrency, workers)


@pytest.mark.parametrize("qtype", ["classic", "quorum"])
async def test_crash_bound_on_this_broker_version(broker: BrokerSettings, tmp_path: Path, qtype: str) -> None:
    """The quorum/classic difference on every broker version (quorum queues count deliveries themselves)."""
    await crash_run(broker, tmp_path, qtype, concurrency=2, workers=1)


@pytest.mark.version_independent
async def test_a_handler_that_blocks_the_loop_is_never_a_success(broker: BrokerSettings, tmp_path: Path) -> None:
    """An async handler blocking past the heartbeat timeout: ack_uncertain each run, then quarantined crashed."""
    app = await setup(broker, tmp_path, "classic", "max_redeliveries = 2")
    try:
        await app.enqueue("poison", {"kind": "block", "seconds": 6}, job_id="blocker")
    finally:
        await app.close()

    async def quarantined() -> bool:
        return await depth(broker, "work.quarantine") == 1

    supervisor = Supervisor(broker, tmp_path, 1, url=f"{broker.url}?heartbeat=2")
    await supervisor.run_until(quarantined, timeout=100)

    starts = [r for r in records(tmp_path) if r[0] == "start"]
    log = supervisor.log.read_text()
    assert supervisor.exits == 0  # the worker never died: it lost its connection and reconnected
    assert len(starts) == 3, starts  # max_redeliveries + 1
    assert "outcome=succeeded" not in log
    assert log.count("outcome=ack_uncertain") == 3, log[-3000:]
    assert log.count("job=poison id=blocker blocked the event loop for") == 3, log[-3000:]
    message = (await drain(broker, "work.quarantine"))[0]
    assert message.headers[evidence.REASON] == "crashed"
    assert message.headers[crash.STARTS] == 3


@pytest.mark.version_independent
async def test_default_timeout_is_just_below_the_consumer_timeout(broker: BrokerSettings, tmp_path: Path) -> None:
    """A job without timeout= fails as `timeout` before the broker's consumer_timeout would close the channel."""
    app = await setup(broker, tmp_path, "classic")
    try:
        await app.enqueue("poison", {"seconds": 30}, job_id="slow")
    finally:
        await app.close()
    (tmp_path / "notimeout.py").write_text(
        "import asyncio\nfrom amqpjobs import App\nimport os\n"
        "app = App('nt', topology=os.environ['POISON_TOPOLOGY'])\n"
        "@app.job('poison', queue='work')\n"
        "async def poison(payload, ctx):\n    await asyncio.sleep(float(payload['seconds']))\n"
    )
    env = dict(
        os.environ,
        AMQPJOBS_URL=broker.url,
        AMQPJOBS_MANAGEMENT_URL=broker.management_url,
        POISON_TOPOLOGY=str(tmp_path / "topology.toml"),
        PYTHONPATH=str(tmp_path),
    )
    exe = Path(sys.executable).with_name("amqpjobs")
    proc = subprocess.Popen(  # noqa: ASYNC220 - starts at once; the test then polls the broker
        [str(exe), "consume", "notimeout:app", "--consumer-timeout", "5s"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while await depth(broker, "work.retry.1s") == 0:  # the first attempt timed out: retried
            assert time.monotonic() < deadline, "no timeout within 30 s"
            await asyncio.sleep(0.1)
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=20)
    line = next(x for x in out.splitlines() if "outcome=retried" in x)
    duration = float(line.split("duration=")[1].split("s")[0])
    assert 3.8 <= duration <= 4.5, line  # 5 s - 1 s
    assert "ran longer than its timeout of 4s (the default: just below the consumer timeout)" in line


@pytest.mark.version_independent
async def test_stall_warnings_name_each_blocking_job_with_its_own_share(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Two async handlers that block the loop, maybe back to back: one WARNING each, with its own seconds."""
    topo = tmp_path / "topology.toml"
    topo.write_text(TOPOLOGY.format(qtype="classic", extra="", tiers='["1s"]'))
    await apply_topology(topo, broker)
    app = App("stall-test", topology=load_topology(topo).topology, url=broker.url)
    done: list[str] = []

    @app.job("block", queue="work")
    async def block(payload: dict[str, float], ctx: JobContext) -> None:
        time.sleep(payload["seconds"])  # noqa: ASYNC251 - blocking an async handler is the fault under test
        done.append(ctx.job_id)

    await app.enqueue("block", {"seconds": 1.5}, job_id="short")
    await app.enqueue("block", {"seconds": 2.5}, job_id="long")
    worker = Worker(app, broker, WorkerOptions(queues=("work",), concurrency=2, grace=5))
    with caplog.at_level(logging.WARNING, logger="amqpjobs.worker"):
        await worker.start()
        try:
            deadline = time.monotonic() + 20
            while len(done) < 2:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.1)
            await asyncio.sleep(0.5)  # the stall is reported on the loop's next tick
        finally:
            await worker.shutdown()
            await app.close()
    warned = {
        r.getMessage().split(" ")[1]: float(r.getMessage().split(" for ")[1].split("s")[0])
        for r in caplog.records
        if "blocked the event loop" in r.getMessage()
    }
    assert set(warned) == {"id=short", "id=long"}, warned
    assert 1.2 <= warned["id=short"] <= 2.0, warned
    assert 2.2 <= warned["id=long"] <= 3.0, warned


@pytest.mark.version_independent
async def test_a_run_cut_off_by_a_lost_connection_is_reported_and_never_overlaps_its_rerun(
    broker: BrokerSettings, tmp_path: Path, mgmt: ManagementClient
) -> None:
    """A plain-function handler's thread outlives its channel: the rerun waits for it, and both runs are counted."""
    topo = tmp_path / "topology.toml"
    topo.write_text(TOPOLOGY.format(qtype="classic", extra="", tiers='["1s"]'))
    await apply_topology(topo, broker)
    app = App("cutoff-test", topology=load_topology(topo).topology, url=broker.url)
    runs: list[tuple[float, float]] = []

    @app.job("slow", queue="work")
    def slow(payload: dict[str, float], ctx: JobContext) -> None:
        began = time.monotonic()
        time.sleep(payload["seconds"])
        runs.append((began, time.monotonic()))

    await app.enqueue("slow", {"seconds": 8}, job_id="slow-1")
    worker = Worker(app, broker, WorkerOptions(queues=("work",), concurrency=2, grace=10))
    await worker.start()
    try:
        names: list[str] = []
        deadline = time.monotonic() + 10
        while not names:  # the management API lists a new connection within its stats interval
            assert time.monotonic() < deadline, "the worker's connection was never listed"
            await asyncio.sleep(0.2)
            listed = mgmt.request("GET", f"/vhosts/{quote(broker.vhost, safe='')}/connections")
            names = [c["name"] for c in listed if "cutoff-test-worker" in str(c.get("client_properties"))]
        for name in names:
            mgmt.request("DELETE", f"/connections/{quote(name, safe='')}")
        deadline = time.monotonic() + 30
        while len(runs) < 2:
            assert time.monotonic() < deadline, (runs, dict(worker.stats))
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.3)
    finally:
        await worker.shutdown()
        await app.close()
    (_, end1), (start2, _) = runs
    assert start2 >= end1, runs  # the rerun (alone) started only after the cut-off thread ended
    assert worker.stats["ack_uncertain"] == 1, dict(worker.stats)  # the first run: its ack could not go out
    assert worker.stats["redelivered"] == 1, dict(worker.stats)
    assert worker.stats["succeeded"] == 1, dict(worker.stats)
    for queue in ("work", "work.suspects", "work.quarantine"):
        assert await depth(broker, queue) == 0, queue


@pytest.mark.version_independent
@pytest.mark.timeout(60)
async def test_a_suspects_turn_ends_after_its_limit_and_the_work_queue_runs_between(
    broker: BrokerSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """README: "after at most 10 s of suspects it consumes again" (here 1 s): with four suspects of
    0.6 s waiting, a job of the work queue runs after two of them, not after all four."""
    import aio_pika

    from amqpjobs.runtime import suspects
    from tests.integration.helpers import raw_channel
    from tests.integration.worker_env import make_app

    monkeypatch.setattr(suspects, "SUSPECTS_TURN", 1.0)
    app = await make_app(broker, tmp_path)
    order: list[str] = []

    @app.job("slow", queue="work")
    async def slow(payload: dict[str, str], ctx: JobContext) -> None:
        order.append(ctx.job_id)
        await asyncio.sleep(0.6)

    async with raw_channel(broker) as ch:
        for i in range(4):  # registered suspects, as a worker leaves them: start 2, from work queue "work"
            await ch.default_exchange.publish(
                aio_pika.Message(
                    b"{}", type="slow", message_id=f"s{i}", headers={crash.STARTS: 2, crash.WORK_QUEUE: "work"}
                ),
                routing_key="work.suspects",
            )
    worker = Worker(app, broker, WorkerOptions(queues=("work",), concurrency=1))
    await worker.start()
    try:
        deadline = time.monotonic() + 10
        while not order and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        await app.enqueue("slow", {}, job_id="plain")  # waits in the paused work queue
        deadline = time.monotonic() + 20
        while len(order) < 5 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    finally:
        await worker.shutdown()
        await app.close()
    assert order[:2] == ["s0", "s1"], order
    assert order[2] == "plain", order  # the turn ended at its limit: the work queue ran before s2
    assert sorted(order[3:]) == ["s2", "s3"], order


QUIT_MESSAGE = "{what} raised by the handler, not a signal to the worker: a failure of this job (the worker went on)"


@pytest.mark.version_independent
@pytest.mark.parametrize(("job", "kind", "what"), [
    ("poison", "sysexit", "SystemExit(3)"),
    ("poison", "interrupt", "KeyboardInterrupt()"),
    ("poison_thread", "sysexit", "SystemExit(3)"),
    ("poison_thread", "interrupt", "KeyboardInterrupt()"),
], ids=["async-sysexit", "async-interrupt", "thread-sysexit", "thread-interrupt"])  # fmt: skip
async def test_a_handler_raising_systemexit_or_keyboardinterrupt_fails_its_job_not_the_worker(
    broker: BrokerSettings, tmp_path: Path, job: str, kind: str, what: str
) -> None:
    """Retry tiers then ``exhausted``, like any handler error; the worker never exits, its other jobs run once."""
    app = await setup(broker, tmp_path, "classic")
    app.job("poison_thread", queue="work")(lambda p, c: None)
    try:
        await app.enqueue(job, {"kind": kind}, job_id="quitter")
        for i in range(3):
            await app.enqueue("poison", {"seconds": 0.05}, job_id=f"ok-{i}")
    finally:
        await app.close()

    supervisor = Supervisor(broker, tmp_path, 1, "--concurrency", "2")
    await supervisor.run_until_done(3, 1, timeout=60)

    log = supervisor.log.read_text()
    assert supervisor.exits == 0, log[-3000:]
    starts = Counter(r[1] for r in records(tmp_path) if r[0] == "start")
    assert starts == {"quitter": 2, "ok-0": 1, "ok-1": 1, "ok-2": 1}  # two attempts (one tier), nothing redelivered
    assert len({r[2] for r in records(tmp_path)}) == 1  # one worker process ran them all
    message = (await drain(broker, "work.quarantine"))[0]
    h = message.headers
    error_type = what.split("(")[0]
    assert (h[evidence.REASON], h[evidence.ERROR_TYPE], h[evidence.ATTEMPTS]) == ("exhausted", error_type, 2)
    assert h[evidence.ERROR_MESSAGE] == QUIT_MESSAGE.format(what=what)
    assert str(h[evidence.TRACEBACK]).rstrip().splitlines()[-1].startswith(error_type)
    assert log.count(f"job={job} id=quitter attempt=1 ") == 1, log[-3000:]
    assert f'outcome=quarantined reason=exhausted error="{error_type}: ' in log
    for queue in ("work", "work.retry.1s", "work.suspects"):
        assert await depth(broker, queue) == 0, queue


@pytest.mark.version_independent
async def test_a_real_sigint_still_stops_the_worker_gracefully(broker: BrokerSettings, tmp_path: Path) -> None:
    """SIGINT to the worker process (not a raise in a handler): the running job finishes, exit 0."""
    app = await setup(broker, tmp_path, "classic")
    try:
        await app.enqueue("poison", {"seconds": 1.5}, job_id="long")
    finally:
        await app.close()
    supervisor = Supervisor(broker, tmp_path, 1)
    proc = supervisor._spawn()
    try:
        deadline = time.monotonic() + 30
        while not any(r[0] == "start" for r in records(tmp_path)):
            assert proc.poll() is None, supervisor.log.read_text()[-3000:]
            assert time.monotonic() < deadline, supervisor.log.read_text()[-3000:]
            await asyncio.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        code = await asyncio.to_thread(proc.wait, 30)
    finally:
        if proc.poll() is None:
            proc.kill()
    log = supervisor.log.read_text()
    assert code == 0, log[-3000:]
    assert [r[0] for r in records(tmp_path)] == ["start", "done"]
    assert "job=poison id=long attempt=1 " in log
    assert "outcome=succeeded" in log
    assert "worker stopped: 1 in-flight job(s) finished, 0 abandoned" in log, log[-3000:]
    assert await depth(broker, "work") == 0


@pytest.mark.version_independent
@pytest.mark.parametrize("processes", [1, 2])
async def test_a_suspect_that_failed_runs_each_attempt_once_when_the_next_suspect_crashes(
    broker: BrokerSettings, tmp_path: Path, processes: int
) -> None:
    """A suspect retried, then a suspect that exits the worker: the first one's ack is at the broker before.

    The failing job's retry copy (headers near the limit, a 100 kB error 300 frames deep: its
    publish takes a while) is published before its ack; had that ack waited behind the next
    suspect's crash, the broker would redeliver a suspect whose retry copy already exists,
    and the job would live twice (seen with the ack of a suspect delayed 50 ms on purpose:
    attempts 1/2/3 ran 6/5/5 times). ``--processes 2`` is the review's setting (H2).
    """
    app = await setup(broker, tmp_path, "classic", "max_redeliveries = 2", '["1s", "2s"]')  # attempts 1 to 3
    try:
        await app.enqueue("poison", {"kind": "fail", "size": 100_000, "depth": 300}, job_id="fails",
                          headers={"pad": "p" * 110_000})  # 110 kB: enqueue's limit is 110592 bytes  # fmt: skip
        await app.enqueue("poison", {"kind": "exit"}, job_id="crasher")
        await app.enqueue("poison", {"seconds": 0}, job_id="ok")
    finally:
        await app.close()

    async def finished() -> bool:
        done = {r[1] for r in records(tmp_path) if r[0] == "done"}
        if "ok" not in done or await depth(broker, "work.quarantine") < 2:
            return False
        return all([await depth(broker, q) == 0 for q in ("work", "work.retry.1s", "work.retry.2s", "work.suspects")])

    args = ("--processes", str(processes)) if processes > 1 else ()
    supervisor = Supervisor(broker, tmp_path, 1, "--concurrency", "2", "--grace", "5s", *args)
    await supervisor.run_until(finished, timeout=90)
    await asyncio.sleep(3)  # a duplicate still in a tier would surface by now

    starts = Counter((r[1], r[4]) for r in records(tmp_path) if r[0] == "start")
    # attempt 1 ran beside the crasher, then once more alone; each later attempt exactly once
    assert {k: n for k, n in starts.items() if k[0] == "fails"} == {("fails", "1"): 2, ("fails", "2"): 1,
                                                                      ("fails", "3"): 1}, starts  # fmt: skip
    assert starts[("crasher", "1")] == 3  # max_redeliveries + 1 starts, then quarantined crashed
    assert supervisor.exits >= (2 if processes == 1 else 0)  # --processes: its parent restarts the children
    quarantined = await drain(broker, "work.quarantine")
    assert sorted((m.message_id, m.headers[evidence.REASON]) for m in quarantined) == [
        ("crasher", "crashed"), ("fails", "exhausted")]  # fmt: skip
    assert {m.message_id: m.headers.get(crash.STARTS) for m in quarantined}["crasher"] == 3
    for queue in ("work", "work.retry.1s", "work.retry.2s", "work.suspects", "work.quarantine"):
        assert await depth(broker, queue) == 0, queue


@pytest.mark.version_independent
@pytest.mark.parametrize("decision", ["retry", "quarantine", "register", "idempotent"])
async def test_a_job_whose_copy_is_out_when_its_worker_dies_before_the_ack_lives_at_most_twice(
    broker: BrokerSettings, tmp_path: Path, decision: str
) -> None:
    """A job's copy is published beside a job that hangs, and the worker dies before the original's ack is in.

    The worker reaches the broker through a proxy that, once the job runs, holds back what
    its consuming connection sends (acks), but not its publishing connection: the copy (a
    retry tier's, the quarantine's, or a registered start's in the suspects queue) goes
    out and is confirmed; when it is in its queue the worker is killed (a job beside it that
    exits the process at that instant does the same), so the broker redelivers an original
    whose copy already exists: the job has two lives. The README bound ("When a job crashes"):
    nothing is lost, each attempt runs at most twice, the job is quarantined at most twice
    (same job id); an idempotent job (``idempotent``: it succeeds on its 2nd attempt, in
    ``ctx.transaction()``) has its effect exactly once, the other life a ``duplicate``.
    """
    app = await setup(broker, tmp_path, "classic", "max_redeliveries = 2", '["1s", "2s"]')  # attempts 1 to 3
    app.job("once", queue="work")(lambda p, c: None)  # poisonapp's idempotent job: only to publish
    with sqlite3.connect(tmp_path / "ledger.db") as db:  # its effect's table, in the ledger's database
        db.execute("CREATE TABLE effects (job_id TEXT, pid INTEGER)")
    copy_queue = {"quarantine": "work.quarantine", "register": "work.suspects"}.get(decision, "work.retry.1s")
    job = "once" if decision == "idempotent" else "poison"
    fails = {"kind": "reject" if decision == "quarantine" else "fail", "seconds": 0.3}
    holder = None  # register: the connection holding "fails" unacked until the worker runs "hangs"
    try:
        if decision == "register":  # "fails" taken and held unacked: it comes back redelivered, after "hangs" started
            await app.enqueue(job, fails, job_id="fails")
            holder = await aio_pika.connect(broker.url)
            work = await (await holder.channel()).get_queue("work", ensure=False)
            assert await work.get(no_ack=False, fail=False) is not None
        await app.enqueue("poison", {"kind": "hang"}, job_id="hangs")
        if decision != "register":
            await app.enqueue(job, fails, job_id="fails")
    finally:
        await app.close()

    node = urlsplit(broker.url)
    proxy = TcpProxy((node.hostname or "127.0.0.1", node.port or 5672))
    via = urlunsplit(node._replace(netloc=f"{node.username}:{node.password}@127.0.0.1:{await proxy.start()}"))
    supervisor = Supervisor(broker, tmp_path, 1, "--concurrency", "2", "--grace", "5s", url=via)

    async def kill_once_the_copy_is_out() -> None:
        nonlocal holder
        started = {"hangs"} if decision == "register" else {"hangs", "fails"}
        while not started <= {r[1] for r in records(tmp_path) if r[0] == "start"}:
            await asyncio.sleep(0.01)
        proxy.hold_sends(b"-worker-publisher")  # from now on no ack of the worker reaches the broker
        if holder is not None:  # "fails" goes back, redelivered: the worker registers it
            await holder.close()
            holder = None
        async with raw_channel(broker) as ch:
            while not (await ch.declare_queue(copy_queue, passive=True)).declaration_result.message_count:
                await asyncio.sleep(0.01)
        os.kill(supervisor.procs[0].pid, signal.SIGKILL)
        proxy.cut()  # the broker sees the connections go, and redelivers what they held

    killer = asyncio.create_task(kill_once_the_copy_is_out())
    quiet_since: float | None = None  # the end state seen since (a life held by the worker is in no queue)

    async def finished() -> bool:
        nonlocal quiet_since
        ended = (
            killer.done()
            and await depth(broker, "work.quarantine") >= (1 if decision == "idempotent" else 2)
            and (decision != "idempotent" or ["done", "fails"] in [r[:2] for r in records(tmp_path)])
            and all([await depth(broker, q) == 0 for q in ("work", "work.retry.1s", "work.retry.2s", "work.suspects")])
        )  # fmt: skip
        quiet_since = (quiet_since or time.monotonic()) if ended else None
        return quiet_since is not None and time.monotonic() - quiet_since >= 2

    try:
        await supervisor.run_until(finished, timeout=90)
        await killer
    finally:
        killer.cancel()
        await proxy.stop()
        if holder is not None:
            await holder.close()
    await asyncio.sleep(4)  # a life still in a tier (1 s, then 2 s) would surface by now

    starts = Counter((r[1], r[4]) for r in records(tmp_path) if r[0] == "start")
    runs = {attempt: n for (job, attempt), n in starts.items() if job == "fails"}
    assert starts[("hangs", "1")] == 3, starts  # max_redeliveries + 1 starts, then quarantined crashed
    quarantined = Counter((m.message_id, m.headers[evidence.REASON]) for m in await drain(broker, "work.quarantine"))
    reason = {"quarantine": "rejected", "idempotent": None}.get(decision, "exhausted")
    assert quarantined[("hangs", "crashed")] == 1, quarantined
    assert quarantined[("fails", reason)] in ((0,) if reason is None else (1, 2)), (quarantined, runs)
    assert sum(quarantined.values()) == 1 + quarantined[("fails", reason)], quarantined  # nothing else in it
    attempts = {"quarantine": ["1"], "idempotent": ["1", "2"]}.get(decision, ["1", "2", "3"])
    assert sorted(runs) == attempts, runs
    assert max(runs.values()) <= 2, runs  # each attempt at most twice
    if decision == "idempotent":  # the effect once: the other life found the key done (a duplicate) or waited
        done = [r[1] for r in records(tmp_path) if r[0] == "done"]
        assert (runs["2"], done.count("fails")) == (1, 1), (runs, done)
        duplicates = re.findall(r"id=fails attempt=(\d) .*outcome=duplicate", supervisor.log.read_text())
        assert len(duplicates) == 1, duplicates  # the second life: acked without running, the key being done
        with sqlite3.connect(tmp_path / "ledger.db") as db:
            assert db.execute("SELECT job_id FROM effects").fetchall() == [("fails",)]
    for queue in ("work", "work.retry.1s", "work.retry.2s", "work.suspects", "work.quarantine"):
        assert await depth(broker, queue) == 0, queue


async def put_suspect(broker: BrokerSettings, job: str, job_id: str) -> None:
    """A registered suspect, as a worker leaves one: start 2, from work queue ``work``."""
    async with raw_channel(broker) as ch:
        message = aio_pika.Message(b"{}", type=job, message_id=job_id, content_type="application/json",
                                   headers={crash.STARTS: 2, crash.WORK_QUEUE: "work"})  # fmt: skip
        await ch.default_exchange.publish(message, routing_key="work.suspects")


class _Releasable(Protocol):
    def set(self) -> None: ...


@asynccontextmanager
async def worker_running(app: App, worker: Worker, release: _Releasable) -> AsyncIterator[asyncio.Task[int]]:
    """``worker.run()`` as a task (its exit code); after, ``release`` set (a stuck run ends) and the app closed."""
    running = asyncio.create_task(worker.run())
    try:
        yield running
    finally:
        release.set()
        await app.close()


async def exit_code(running: asyncio.Task[int], release: _Releasable) -> int:
    """Set ``release`` (the stuck run ends), then the worker's exit code (within 20 s)."""
    release.set()
    return await asyncio.wait_for(running, 20)


async def said(caplog: pytest.LogCaptureFixture, text: str, timeout: float = 20) -> None:
    """Return once ``text`` is in the captured log, or after ``timeout`` s (the assertions after say why)."""
    deadline = time.monotonic() + timeout
    while text not in caplog.text and time.monotonic() < deadline:
        await asyncio.sleep(0.05)


@pytest.mark.version_independent
async def test_a_plain_function_suspect_past_its_timeout_stops_its_worker_instead_of_every_queue_for_ever(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Nothing may run beside a suspect and its thread can't be stopped: the worker stops (exit 1), so the
    process (restarted by its supervisor) ends the thread, and the start counts like a crash (an outsider's
    hung job held a worker's every queue for good)."""
    import threading

    from tests.integration.worker_env import make_app

    caplog.set_level(logging.INFO, logger="amqpjobs")
    app = await make_app(broker, tmp_path)
    release = threading.Event()
    ran: list[str] = []

    @app.job("hung", queue="work", timeout="1s")
    def hung(payload: dict[str, str], ctx: JobContext) -> None:
        release.wait(60)

    @app.job("plain", queue="work")
    async def plain(payload: dict[str, str], ctx: JobContext) -> None:
        ran.append(ctx.job_id)

    await put_suspect(broker, "hung", "the-hung-one")
    worker = Worker(app, broker, WorkerOptions(queues=("work",), concurrency=2, grace=1))
    async with worker_running(app, worker, release) as running:
        while "running it alone" not in caplog.text and not running.done():
            await asyncio.sleep(0.05)
        await app.enqueue("plain", {}, job_id="beside")  # waits: nothing runs beside the suspect
        # `amqpjobs consume` ends its process here (with the thread); a worker awaited in a program keeps its
        # connection, the suspect unacked, until the thread ends
        await said(caplog, "thread(s) still running can't be stopped")
        code = await exit_code(running, release)
    assert code == 1
    assert ran == []
    lines = [r for r in caplog.records if "job hung id the-hung-one" in r.getMessage()]
    assert [r.levelname for r in lines[:2]] == ["WARNING", "ERROR"]  # past its timeout, then the grace later
    assert "passed its timeout of 1s while running alone as a suspect" in lines[0].getMessage()
    assert "still runs 1s past its timeout of 1s" in lines[1].getMessage()
    assert "this worker stops (exit 1, for its supervisor to start another)" in lines[1].getMessage()
    # its delivery went back to the broker: the next worker registers start 3 (or quarantines it, crashed)
    assert await depth(broker, "work.suspects") == 1
    assert await depth(broker, "work") == 1


@pytest.mark.version_independent
async def test_a_worker_whose_plain_function_run_is_past_its_timeout_leaves_suspects_to_others_and_goes_on(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A suspects turn waits for the running jobs to end: one hung in a thread kept the consumers paused for good.
    The turn is not taken while a run is past its timeout here: the other slot goes on, the suspect waits."""
    import threading

    from tests.integration.worker_env import make_app

    caplog.set_level(logging.INFO, logger="amqpjobs")
    app = await make_app(broker, tmp_path)
    release = threading.Event()
    ran: list[str] = []

    @app.job("hung", queue="work", timeout="1s")
    def hung(payload: dict[str, str], ctx: JobContext) -> None:
        ran.append(ctx.job_id)
        release.wait(60)

    @app.job("plain", queue="work")
    async def plain(payload: dict[str, str], ctx: JobContext) -> None:
        ran.append(ctx.job_id)

    worker = Worker(app, broker, WorkerOptions(queues=("work",), concurrency=2, grace=30))
    await worker.start()
    try:
        await app.enqueue("hung", {}, job_id="slow-thread")
        while "passed its timeout of 1s" not in caplog.text:
            await asyncio.sleep(0.05)
        await put_suspect(broker, "plain", "a-suspect")
        await asyncio.sleep(1.5)  # a look at the suspects queue comes every second
        for i in range(5):
            await app.enqueue("plain", {}, job_id=f"p{i}")
        deadline = time.monotonic() + 10
        while len(ran) < 6 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert sorted(ran) == ["p0", "p1", "p2", "p3", "p4", "slow-thread"]
        assert await depth(broker, "work.suspects") == 1  # left for a worker that can run it alone
        waiting = [r for r in caplog.records if "suspects of work wait" in r.getMessage()]
        assert [r.levelname for r in waiting] == ["WARNING"]  # said once, not at every look
        release.set()  # the thread ends: the suspect runs alone here
        deadline = time.monotonic() + 10
        while "a-suspect" not in ran and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert ran[-1] == "a-suspect"
    finally:
        release.set()
        await worker.shutdown()
        await app.close()


@pytest.mark.version_independent
async def test_a_plain_function_run_still_going_the_grace_past_its_timeout_stops_its_worker(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Its thread would hold a slot for good: the worker stops (exit 1) so that its process ends the thread."""
    import threading

    from tests.integration.worker_env import make_app

    caplog.set_level(logging.INFO, logger="amqpjobs")
    app = await make_app(broker, tmp_path)
    release = threading.Event()

    @app.job("hung", queue="work", timeout="1s")
    def hung(payload: dict[str, str], ctx: JobContext) -> None:
        release.wait(60)

    worker = Worker(app, broker, WorkerOptions(queues=("work",), concurrency=2, grace=1))
    async with worker_running(app, worker, release) as running:
        await app.enqueue("hung", {}, job_id="stuck")
        await said(caplog, "thread(s) still running can't be stopped")
        code = await exit_code(running, release)
    assert code == 1
    lines = [r.getMessage() for r in caplog.records if "id stuck" in r.getMessage()]
    assert lines[0].endswith("judges it by its result (for 1s more at most: then it stops)")
    assert "still runs 1s past its timeout of 1s" in lines[1]
    assert "this worker stops (exit 1, for its supervisor to start another)" in lines[1]
    assert await depth(broker, "work") == 1  # back for the next worker: registered, run alone


@pytest.mark.version_independent
@pytest.mark.parametrize("qtype", ["classic", "quorum"])
async def test_a_plain_function_job_that_hangs_every_worker_is_quarantined_crashed_and_the_rest_run(
    broker: BrokerSettings, tmp_path: Path, qtype: str
) -> None:
    """`amqpjobs consume` processes under a supervisor: each worker the hung job reaches stops, its process ending
    the thread; the job is charged a start each time and quarantined `crashed`; the other jobs all run."""
    app = await setup(broker, tmp_path, qtype)
    app.job("hang_thread", queue="work")(lambda p, c: None)  # only to publish
    try:
        await app.enqueue("hang_thread", {}, job_id="hanger")
        for i in range(20):
            await app.enqueue("poison", {"seconds": 0.02}, job_id=f"ok-{i}")
    finally:
        await app.close()

    supervisor = Supervisor(broker, tmp_path, 1, "--concurrency", "2", "--grace", "1s")
    await supervisor.run_until_done(20, 1, timeout=120)
    starts = Counter(r[1] for r in records(tmp_path) if r[0] == "start")
    assert starts["hanger"] == MAX_REDELIVERIES + 1, starts
    assert supervisor.exits >= MAX_REDELIVERIES  # each start but the last stopped its worker
    quarantined = await drain(broker, "work.quarantine")
    assert [m.message_id for m in quarantined] == ["hanger"]
    assert quarantined[0].headers[evidence.REASON] == "crashed"
    assert quarantined[0].headers[crash.STARTS] == MAX_REDELIVERIES + 1
    log = supervisor.log.read_text()
    assert log.count("while running alone as a suspect") == MAX_REDELIVERIES  # starts 2..6 ran alone, and hung
    assert "still runs 1s past its timeout of 1s" in log  # the first, among the others


def stubborn_job(app: App, release: asyncio.Event) -> None:
    """Job ``stubborn`` (timeout 1 s): an async handler that swallows every cancellation until ``release``."""

    @app.job("stubborn", queue="work", timeout="1s")
    async def stubborn(payload: dict[str, str], ctx: JobContext) -> None:
        while not release.is_set():
            try:
                await asyncio.sleep(0.1)
            except asyncio.CancelledError:
                continue  # swallowed, every time


@pytest.mark.version_independent
async def test_an_async_suspect_that_goes_on_after_its_cancellation_stops_its_worker(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An async handler that catches every cancellation can't be stopped either: as a suspect it held the turn (and
    every queue of the worker) for good. 1 s after its timeout's cancellation, the worker stops as for a thread."""
    from tests.integration.worker_env import make_app

    caplog.set_level(logging.INFO, logger="amqpjobs")
    app = await make_app(broker, tmp_path)
    release = asyncio.Event()

    stubborn_job(app, release)

    await put_suspect(broker, "stubborn", "the-stubborn-one")
    worker = Worker(app, broker, WorkerOptions(queues=("work",), concurrency=2, grace=1))
    async with worker_running(app, worker, release) as running:
        await said(caplog, "went on 1s after its timeout")
        assert "went on 1s after its timeout" in caplog.text
        await asyncio.sleep(3.5)  # the grace, the stop's grace and cancel bound: then a worker in a program waits
        code = await exit_code(running, release)
    assert code == 1
    lines = [r for r in caplog.records if "job stubborn id the-stubborn-one" in r.getMessage()]
    assert [r.levelname for r in lines[:2]] == ["WARNING", "ERROR"]
    assert (
        lines[0]
        .getMessage()
        .startswith(
            "job stubborn id the-stubborn-one: async handler went on 1s after its timeout's cancellation, of 1s while "
            "running alone as a suspect"
        )
    )
    assert "async handler (it catches its cancellation) still runs 1s past its timeout" in lines[1].getMessage()


@pytest.mark.version_independent
async def test_an_async_run_that_goes_on_after_its_cancellation_holds_no_suspect_and_stops_its_worker_after_the_grace(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Like a hung thread: a suspects turn would wait for it for good, and its slot is lost. Counted 1 s after its
    timeout's cancellation (no suspects turn meanwhile), then the grace, then the worker stops (exit 1)."""
    from tests.integration.worker_env import make_app

    caplog.set_level(logging.INFO, logger="amqpjobs")
    app = await make_app(broker, tmp_path)
    release = asyncio.Event()

    stubborn_job(app, release)

    worker = Worker(app, broker, WorkerOptions(queues=("work",), concurrency=2, grace=2))
    async with worker_running(app, worker, release) as running:
        await app.enqueue("stubborn", {}, job_id="s-1")
        deadline = time.monotonic() + 20  # for both lines
        await said(caplog, "went on 1s after its timeout's cancellation", deadline - time.monotonic())
        await put_suspect(broker, "stubborn", "a-suspect")  # not taken beside it
        await said(caplog, "still runs 2s past its timeout", deadline - time.monotonic())
        await asyncio.sleep(3.5)  # the stop's grace and cancel bound: then a worker awaited in a program waits
        code = await exit_code(running, release)
    assert code == 1
    lines = [r for r in caplog.records if "id s-1" in r.getMessage()]
    assert [r.levelname for r in lines[:2]] == ["WARNING", "ERROR"]
    assert lines[0].getMessage() == (
        "job stubborn id s-1: async handler went on 1s after its timeout's cancellation, of 1s; it catches the "
        "cancellation, so the worker waits for it and judges it by its result (for 2s more at most: then it stops)"
    )
    assert "this worker stops (exit 1, for its supervisor to start another)" in lines[1].getMessage()
    assert "a-suspect" not in caplog.text  # never run beside it
    assert await depth(broker, "work.suspects") == 1


@pytest.mark.version_independent
async def test_a_suspect_a_little_slower_than_its_timeout_succeeds_and_the_worker_goes_on(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """It ends within the grace: judged by its result, no stop and no restart (a retest: the worker stopped, exit 1,
    for a suspect that then succeeded)."""
    from tests.integration.worker_env import Recorder, make_app

    caplog.set_level(logging.INFO, logger="amqpjobs")
    app = await make_app(broker, tmp_path)

    @app.job("slowish", queue="work", timeout="1s")
    def slowish(payload: dict[str, str], ctx: JobContext) -> None:
        time.sleep(1.6)

    await put_suspect(broker, "slowish", "a-bit-slow")
    recorder = Recorder()
    worker = Worker(app, broker, WorkerOptions(queues=("work",), concurrency=2, grace=3), recorder)
    await worker.start()
    try:
        await recorder.wait_for(lambda o: any(x.job_id == "a-bit-slow" for x in o), timeout=20)
        await app.enqueue("slowish", {}, job_id="after")  # the worker consumes again
        await recorder.wait_for(lambda o: any(x.job_id == "after" for x in o), timeout=20)
        assert not worker._stop.is_set()
    finally:
        await worker.shutdown()
        await app.close()
    assert [(o.job_id, o.kind) for o in recorder.outcomes] == [("a-bit-slow", "succeeded"), ("after", "succeeded")]
    assert "this worker stops" not in caplog.text


@pytest.mark.version_independent
@pytest.mark.parametrize("qtype", ["classic", "quorum"])
async def test_a_payload_whose_validation_kills_the_worker_is_quarantined_crashed(
    broker: BrokerSettings, tmp_path: Path, qtype: str
) -> None:
    """The payload model's validation is app code that runs before the handler: it is contained like the handler.

    Before (helper-176): a redelivery was screened for crashes only after its payload was
    decoded and validated, so a validator that killed the worker (or blocked its loop past the
    heartbeat) killed every worker that took it, for ever: never registered, never quarantined.
    """
    app = await setup(broker, tmp_path, qtype)
    app.job("checked", queue="work")(lambda p, c: None)  # same name as poisonapp's job: only to publish
    try:
        await app.enqueue("checked", {"kill": True}, job_id="killer")
        for i in range(5):
            await app.enqueue("poison", {"seconds": 0.02}, job_id=f"ok-{i}")
    finally:
        await app.close()

    supervisor = Supervisor(broker, tmp_path, 1, "--concurrency", "1", "--grace", "5s")
    await supervisor.run_until_done(5, 1, timeout=60)
    validations = sum(1 for r in records(tmp_path) if r[0] == "validate")
    assert validations == MAX_REDELIVERIES + 1
    (msg,) = await drain(broker, "work.quarantine")
    assert (msg.message_id, msg.headers[evidence.REASON], msg.headers[crash.STARTS]) == (
        "killer",
        "crashed",
        MAX_REDELIVERIES + 1,
    )
    for queue in ("work", "work.suspects"):
        assert await depth(broker, queue) == 0, queue
