"""The chaos suite: failures injected during real work, each ending with an exact account
(enqueued = completed + quarantined, duplicates counted explicitly; 0 lost)."""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from amqpjobs import App, JobContext, Worker, WorkerOptions
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.topology.loader import load_topology
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings, broker_settings
from tests.conftest import BrokerRoot
from tests.integration.helpers import ROOT, depth, write_file
from tests.integration.test_reconnect import force_close
from tests.integration.test_worker_process import done_ids, read_record, worker_process
from tests.integration.worker_env import APPLIED_TOPOLOGY, make_app

pytestmark = [pytest.mark.broker, pytest.mark.chaos, pytest.mark.slow]
CLUSTER = ROOT / "scripts" / "cluster.sh"


async def publisher(broker: BrokerSettings, tmp_path: Path) -> App:
    app = await make_app(broker, tmp_path)
    app.job("sleep", queue="work")(lambda p, c: None)
    return app


def spawn(broker: BrokerSettings, tmp_path: Path, *args: str) -> subprocess.Popen[bytes]:
    """A worker process of tests/integration/procapp.py (same settings as worker_process)."""
    topo = tmp_path / "proc.toml"
    write_file(topo, APPLIED_TOPOLOGY)  # whole at once: a worker still starting may be reading it
    env = dict(os.environ, AMQPJOBS_URL=broker.url, AMQPJOBS_MANAGEMENT_URL=broker.management_url,
               PROCAPP_TOPOLOGY=str(topo), PROCAPP_RECORD=str(tmp_path / "record.txt"))  # fmt: skip
    with (tmp_path / "workers.log").open("a") as log:
        return subprocess.Popen([str(Path(sys.executable).with_name("amqpjobs")), "consume",
                                 "tests.integration.procapp:app", *args],
                                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)  # fmt: skip


def open_runs(record: Path, pid: int) -> set[str]:
    """Jobs whose handler the worker process ``pid`` started and did not finish (so far, or ever once it is dead)."""
    starts: Counter[str] = Counter()
    dones: Counter[str] = Counter()
    for r in read_record(record):
        if r[0] == "start" and r[4:] == [str(pid)]:
            starts[r[1]] += 1
        elif r[0] == "done" and r[2:] == [str(pid)]:
            dones[r[1]] += 1
    return {job for job, n in starts.items() if n > dones[job]}


@pytest.mark.timeout(300)
async def test_twenty_kill_9_of_workers_during_1000_jobs(broker: BrokerSettings, tmp_path: Path):
    """Each kill waits until its victim runs a handler: the jobs cut off come back redelivered and complete.

    The queue never runs dry before the last kill: on a loaded machine a restarted worker takes
    seconds to start while the other one works through the queue, so whenever fewer than 200
    jobs are ready, before a kill and every 0.5 s while waiting for the victim to run a handler,
    another 200 go in (``total`` counts them; 1,000 at least).
    """
    app = await publisher(broker, tmp_path)
    record = tmp_path / "record.txt"
    rng = random.Random(11)
    total = 0

    async def enqueue(n: int) -> None:
        nonlocal total
        for i in range(total, total + n):
            await app.enqueue("sleep", {"seconds": 0.02}, job_id=f"k-{i}")
        total += n

    await enqueue(1000)
    workers = [spawn(broker, tmp_path, "--concurrency", "2") for _ in range(2)]
    interrupted: dict[int, set[str]] = {}  # killed pid -> the jobs it was running when killed
    try:
        for kill in range(20):
            await asyncio.sleep(rng.uniform(0.2, 0.6))
            if await depth(broker, "work") < 200:
                await enqueue(200)
            victim = kill % 2  # the older of the two: it had two intervals to start
            pid = workers[victim].pid
            deadline = time.monotonic() + 30
            refilled = time.monotonic()
            while not open_runs(record, pid):  # mid-run, not still starting
                assert time.monotonic() < deadline, f"kill {kill}: worker {pid} never ran a handler"
                if time.monotonic() - refilled > 0.5:  # the other worker drains 200 in ~2 s while this one starts
                    refilled = time.monotonic()
                    if await depth(broker, "work") < 200:
                        await enqueue(200)
                await asyncio.sleep(0.005)
            workers[victim].kill()  # SIGKILL
            workers[victim].wait(10)
            interrupted[pid] = open_runs(record, pid)
            workers[victim] = spawn(broker, tmp_path, "--concurrency", "2")
        deadline = time.monotonic() + 120
        while len(done_ids(record)) < total and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
    finally:
        await app.close()
        for w in workers:
            w.send_signal(signal.SIGTERM)
        for w in workers:
            w.wait(30)
    done = done_ids(record)
    duplicates = sum(done.values()) - len(done)
    enqueued = {f"k-{i}" for i in range(total)}
    assert set(done) == enqueued, f"{len(enqueued - set(done))} of {total} lost"
    assert await depth(broker, "work") == 0
    assert await depth(broker, "work.quarantine") == 0
    # kills cut handlers off mid-run (each waited for a running handler; one may still end in the
    # millisecond before the kill lands), and each job cut off ran again, flagged redelivered
    assert len(interrupted) == 20
    assert sum(1 for jobs in interrupted.values() if jobs) >= 16, interrupted
    redelivered = {r[1] for r in read_record(record) if r[0] == "start" and r[3] == "1"}
    cut_off = set().union(*interrupted.values())
    assert cut_off <= redelivered, cut_off - redelivered
    # at-least-once: a job whose worker died after its effect but before the ack ran again;
    # each kill interrupts at most its 2 in-flight deliveries (the idempotency ledger removes even those)
    assert duplicates <= 2 * 20, duplicates
    assert sum(1 for r in read_record(record) if r[0] == "start") >= total + len(cut_off)


@pytest.mark.serial  # stop_app/start_app on the project's local node
@pytest.mark.timeout(400)
async def test_broker_restarted_three_times_during_2000_jobs(
    broker: BrokerSettings, broker_root: BrokerRoot, tmp_path: Path
):
    """On the project's local node the node restarts; on any other broker (``AMQP_URL``, a
    container) the worker's connection is force-closed through the management API instead."""
    app = await publisher(broker, tmp_path)
    record = tmp_path / "record.txt"
    for i in range(2000):
        await app.enqueue("sleep", {"seconds": 0.005}, job_id=f"r-{i}")
    await app.close()
    with worker_process(broker, tmp_path, "--concurrency", "4") as proc:
        for threshold in (300, 800, 1300):
            deadline = time.monotonic() + 90
            while len(done_ids(record)) < threshold and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            if broker_root.source == "local":
                await asyncio.to_thread(broker_root.ctl, "stop_app")
                await asyncio.sleep(1)
                await asyncio.to_thread(broker_root.ctl, "start_app")
            else:
                assert await force_close(broker, "procapp-worker") == 1
        deadline = time.monotonic() + 180
        while len(done_ids(record)) < 2000 and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert proc.poll() is None, "the worker was never restarted"
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 30) == 0
    done = done_ids(record)
    assert set(done) == {f"r-{i}" for i in range(2000)}, "0 lost"
    assert sum(done.values()) - 2000 <= 3 * 4, "at most the in-flight deliveries of each restart ran twice"
    assert await depth(broker, "work") == 0
    assert await depth(broker, "work.quarantine") == 0


QUORUM = """
[[exchange]]
name = "jobs"

[[job_queue]]
name = "money"
exchange = "jobs"
type = "quorum"
delivery_limit = 10
retry_tiers = ["500ms"]
"""


#: Where scripts/broker.sh (each node of scripts/cluster.sh) runs Debian's RabbitMQ from.
RABBITMQ_BIN = Path("/usr/lib/rabbitmq/bin")


def cluster_unavailable(
    rabbitmq_bin: Path = RABBITMQ_BIN, is_root: bool | None = None, which: Any = shutil.which
) -> str | None:
    """Why scripts/cluster.sh can't start 3 local nodes here, or None when it can.

    Each node is a local node of Debian's ``rabbitmq-server`` (never Docker, whatever the
    test broker is); scripts/broker.sh installs the package with apt-get when run as root.
    """
    if sys.platform != "linux":
        return "scripts/cluster.sh runs 3 local nodes of Debian's rabbitmq-server: Linux only"
    root = os.geteuid() == 0 if is_root is None else is_root
    if not (rabbitmq_bin / "rabbitmq-server").exists() and not (root and which("apt-get")):
        return (
            f"scripts/cluster.sh needs Debian's rabbitmq-server ({rabbitmq_bin}/rabbitmq-server is missing) and "
            "can install it only as root with apt-get: sudo apt-get install -y rabbitmq-server"
        )
    missing = [tool for tool in ("curl", "flock") if which(tool) is None and not (tool == "curl" and root)]
    if missing:
        return f"scripts/cluster.sh needs {' and '.join(missing)} (not found on PATH)"
    return None


@pytest.fixture(scope="session")
def cluster() -> list[BrokerSettings]:
    """A 3-node RabbitMQ cluster (scripts/cluster.sh), one settings object per node.

    Skipped, with the reason, where the cluster can't be started (see :func:`cluster_unavailable`).
    """
    reason = cluster_unavailable()
    if reason is not None:
        pytest.skip(reason)
    up = subprocess.run(["bash", str(CLUSTER), "up"], capture_output=True, text=True, timeout=600)
    if up.returncode != 0:
        pytest.fail(f"scripts/cluster.sh up failed:\n{up.stderr[-3000:]}")
    nodes = []
    for n in (1, 2, 3):
        out = subprocess.run(["bash", str(CLUSTER), "url", str(n)], capture_output=True, text=True, check=True)
        amqp, mgmt = out.stdout.split()
        nodes.append(broker_settings(amqp, mgmt))
    return nodes


@pytest.mark.version_independent  # scripts/cluster.sh is always a 3.10 cluster, whatever broker the suite has
@pytest.mark.xdist_group("cluster")  # the worker that owns the cluster (see test_failover.py)
@pytest.mark.timeout(400)
async def test_quorum_job_queue_survives_a_node_stopped_mid_run(cluster: list[BrokerSettings], tmp_path: Path):
    await quorum_leader_stopped(cluster, CLUSTER, "amqpjobs-c2", tmp_path)


async def quorum_leader_stopped(cluster: list[BrokerSettings], script: Path, node2: str, tmp_path: Path) -> None:
    """2,000 jobs on a quorum job queue led by node 2 (``node2``: its name's prefix), consumed through
    node 1 while ``script stop 2`` stops the leader's node: all done, at most the in-flight ones twice."""
    vhost = f"chaos-{uuid.uuid4().hex[:8]}"
    with ManagementClient(cluster[0]) as mgmt:
        mgmt.create_vhost(vhost)
    n1, n2 = cluster[0].with_vhost(vhost), cluster[1].with_vhost(vhost)
    path = tmp_path / "q.toml"
    path.write_text(QUORUM)
    await apply_topology(path, n2)  # declared through node 2: the queue's leader starts there
    with ManagementClient(n1) as mgmt:
        queue = mgmt.queue(vhost, "money") or {}
    app = App("chaos", topology=load_topology(path).topology, url=n1.url)
    done: Counter[str] = Counter()

    @app.job("pay", queue="money")
    async def pay(payload: dict[str, Any], ctx: JobContext) -> None:
        await asyncio.sleep(0.002)
        done[ctx.job_id] += 1

    worker = Worker(app, n1, WorkerOptions(queues=("money",), concurrency=4))
    await worker.start()
    stopped = False
    try:
        for i in range(2000):
            await app.enqueue("pay", {"i": i}, job_id=f"p-{i}")
        deadline = time.monotonic() + 60
        while len(done) < 300 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        stop = await asyncio.to_thread(subprocess.run, ["bash", str(script), "stop", "2"], capture_output=True)
        assert stop.returncode == 0
        stopped = True
        deadline = time.monotonic() + 180
        while len(done) < 2000 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
    finally:
        await worker.shutdown()
        await app.close()
        if stopped:
            await asyncio.to_thread(subprocess.run, ["bash", str(script), "start", "2"], capture_output=True)
    assert queue.get("type") == "quorum"
    assert str(queue.get("leader", queue.get("node"))).startswith(node2)
    assert set(done) == {f"p-{i}" for i in range(2000)}, f"{2000 - len(done)} lost"
    assert sum(done.values()) - 2000 <= 4  # at most the in-flight deliveries when the leader moved
    assert await depth(n1, "money") == 0
    assert await depth(n1, "money.quarantine") == 0
    with ManagementClient(n1) as mgmt:
        mgmt.delete_vhost(vhost)
