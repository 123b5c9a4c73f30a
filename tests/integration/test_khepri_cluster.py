"""A 3-node RabbitMQ 4.3 cluster (Khepri metadata store, scripts/cluster43.sh): minority and node loss.

On 4.3 every declaration is a Raft command: with two of three nodes stopped, `topology
apply` and a worker's start-up exit 3 at once, naming the missing Raft majority (not after
the 30 s declaration bound); with the majority back both succeed. A quorum job queue loses
nothing when its leader's node stops (as on the 3.10 cluster of test_chaos.py).

Runs in the 4.3 suite only (``make test-43``: the suite's broker is 4.3, so the chroot of
scripts/broker43.sh exists); the cluster's nodes are stopped and started, so the tests take
a lock: they never overlap, even with several test processes.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from amqpjobs import App, JobContext, Reject, Worker, WorkerOptions
from amqpjobs.topology.loader import load_topology
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings, broker_settings
from tests.conftest import BrokerRoot
from tests.integration.helpers import ROOT, cli_subprocess
from tests.integration.test_chaos import quorum_leader_stopped
from tests.integration.test_failover import messages_in
from tests.integration.test_worker_process import done_ids

# one xdist process owns the cluster: its session fixture runs `cluster43.sh up`, which would start
# the nodes another process's test had stopped (a minority test then saw its apply succeed)
pytestmark = [pytest.mark.broker, pytest.mark.chaos, pytest.mark.slow, pytest.mark.xdist_group("cluster43")]
CLUSTER43 = ROOT / "scripts" / "cluster43.sh"
NODES = [f"amqpjobs43-c{n}@localhost" for n in (1, 2, 3)]

#: A quorum job queue "work" (the job queue of tests/integration/procapp.py).
WORK = """
[[exchange]]
name = "jobs"

[[job_queue]]
name = "work"
exchange = "jobs"
type = "quorum"
retry_tiers = ["500ms"]
"""
#: The same, plus a job queue not yet on the broker: an apply that has something to declare.
MORE = (
    WORK
    + """
[[job_queue]]
name = "more"
exchange = "jobs"
type = "quorum"
"""
)


def cluster43_unavailable(broker_version: tuple[int, ...]) -> str | None:
    """Why scripts/cluster43.sh can't run here (or this suite is not the 4.3 one), else None."""
    if broker_version < (4, 3):
        return "the 4.3 cluster runs in the 4.3 suite only (make test-43)"
    if sys.platform != "linux" or os.geteuid() != 0:
        return "scripts/cluster43.sh runs 3 nodes in a chroot: Linux and root only"
    chroot = Path(os.environ.get("AMQPJOBS_CLUSTER43_CHROOT", ROOT / ".broker43" / "root"))
    if not (chroot / "usr" / "sbin" / "rabbitmq-server").exists():
        return f"{chroot} has no rabbitmq-server: build it with scripts/broker43.sh build (make test does)"
    return None


@pytest.fixture(scope="session")
def cluster43(broker_root: BrokerRoot) -> list[BrokerSettings]:
    """The 3 nodes of scripts/cluster43.sh (started, joined), one settings object per node."""
    reason = cluster43_unavailable(broker_root.version)
    if reason is not None:
        if broker_root.version >= (4, 3) and os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    up = subprocess.run(["bash", str(CLUSTER43), "up"], capture_output=True, text=True, timeout=600)
    if up.returncode != 0:
        pytest.fail(f"scripts/cluster43.sh up failed:\n{up.stderr[-3000:]}")
    nodes = []
    for n in (1, 2, 3):
        out = subprocess.run(["bash", str(CLUSTER43), "url", str(n)], capture_output=True, text=True, check=True)
        amqp, mgmt = out.stdout.split()
        nodes.append(broker_settings(amqp, mgmt))
    return nodes


@pytest.fixture
def exclusive() -> Iterator[None]:
    """Hold the cluster's lock: tests that stop nodes never overlap (xdist runs several processes)."""
    with open(Path(tempfile.gettempdir()) / "amqpjobs-cluster43.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def nodes_ctl(*args: str) -> None:
    result = subprocess.run(["bash", str(CLUSTER43), *args], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


@pytest.fixture
def vhost_nodes(cluster43: list[BrokerSettings], exclusive: None) -> Iterator[list[BrokerSettings]]:
    """The three nodes at a fresh vhost of their own (deleted after, with all three nodes running)."""
    vhost = f"khepri-{uuid.uuid4().hex[:8]}"
    with ManagementClient(cluster43[0]) as mgmt:
        mgmt.create_vhost(vhost)
    yield [node.with_vhost(vhost) for node in cluster43]
    for n in (1, 2, 3):  # whatever the test did: every node back
        nodes_ctl("start", str(n))
    with ManagementClient(cluster43[0]) as mgmt:
        mgmt.delete_vhost(vhost)


def start_worker(node: BrokerSettings, tmp_path: Path, topology: Path) -> subprocess.Popen[str]:
    """`amqpjobs consume` of tests/integration/procapp.py against ``node``."""
    env = dict(os.environ, AMQPJOBS_URL=node.url, AMQPJOBS_MANAGEMENT_URL=node.management_url,
               PROCAPP_TOPOLOGY=str(topology), PROCAPP_RECORD=str(tmp_path / "record.txt"))  # fmt: skip
    exe = Path(sys.executable).with_name("amqpjobs")
    return subprocess.Popen([str(exe), "consume", "tests.integration.procapp:app"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip


def queue_names(node: BrokerSettings) -> set[str]:
    with ManagementClient(node) as mgmt:
        return {q["name"] for q in mgmt.queues(node.vhost)}


@pytest.mark.timeout(300)
async def test_minority_refuses_apply_and_worker_start_then_majority_back(
    vhost_nodes: list[BrokerSettings], tmp_path: Path
):
    n1 = vhost_nodes[0]
    work, more = tmp_path / "work.toml", tmp_path / "more.toml"
    work.write_text(WORK)
    more.write_text(MORE)
    applied = cli_subprocess(n1, "topology", "apply", str(work))
    assert applied.returncode == 0, applied.stderr
    nodes_ctl("stop", "2")
    nodes_ctl("stop", "3")

    planned = cli_subprocess(n1, "topology", "plan", str(more), timeout=60)
    assert planned.returncode == 0, planned.stderr  # plan reads and declares nothing: it works, and warns
    assert "warning: topology apply on" in planned.stderr, planned.stderr
    assert "no Raft majority: 1 of the cluster's 3 nodes run" in planned.stderr
    assert "apply would fail now" in planned.stderr

    started = time.monotonic()
    refused = cli_subprocess(n1, "topology", "apply", str(more), timeout=60)
    apply_took = time.monotonic() - started
    assert refused.returncode == 3, refused.stderr
    assert apply_took < 35, apply_took
    assert "topology apply on" in refused.stderr
    assert f"no Raft majority: 1 of the cluster's 3 nodes run ({NODES[0]}; down or unreachable: " in refused.stderr
    assert f"{NODES[1]}, {NODES[2]}" in refused.stderr
    assert "needs 2 of 3 for any declaration" in refused.stderr
    assert "Bring the stopped nodes back" in refused.stderr
    assert "more" not in queue_names(n1)  # nothing declared

    started = time.monotonic()
    worker = start_worker(n1, tmp_path, work)
    out, _ = await asyncio.to_thread(worker.communicate, timeout=60)
    worker_took = time.monotonic() - started
    assert worker.returncode == 3, out
    assert worker_took < 35, worker_took
    assert "worker start-up on" in out, out
    assert "no Raft majority: 1 of the cluster's 3 nodes run" in out, out

    nodes_ctl("start", "2")  # 2 of 3: a majority again
    applied = cli_subprocess(n1, "topology", "apply", str(more), timeout=120)
    assert applied.returncode == 0, applied.stderr
    assert "more" in queue_names(n1)
    worker = start_worker(n1, tmp_path, work)
    try:
        app = App("khepri", topology=load_topology(work).topology, url=n1.url)
        app.job("sleep", queue="work")(lambda p, c: None)
        await app.enqueue("sleep", {"seconds": 0}, job_id="after-majority")
        await app.close()
        deadline = time.monotonic() + 60
        while "after-majority" not in done_ids(tmp_path / "record.txt") and worker.poll() is None:
            assert time.monotonic() < deadline, "the worker never ran the job"
            await asyncio.sleep(0.1)
        assert worker.poll() is None, worker.communicate()[0]
    finally:
        worker.send_signal(signal.SIGTERM)
        out, _ = await asyncio.to_thread(worker.communicate, timeout=30)
    assert worker.returncode == 0, out
    assert done_ids(tmp_path / "record.txt") == {"after-majority": 1}


async def test_worker_names_the_down_node_of_a_classic_queue_not_apply(
    vhost_nodes: list[BrokerSettings], tmp_path: Path
):
    n1, n2 = vhost_nodes[0], vhost_nodes[1]
    work = tmp_path / "work.toml"
    work.write_text(WORK.replace('type = "quorum"', 'type = "classic"'))  # a classic job queue's quarantine
    applied = cli_subprocess(n2, "topology", "apply", str(work))  # classic queues live on the declaring node
    assert applied.returncode == 0, applied.stderr
    with ManagementClient(n1) as mgmt:
        info = mgmt.queue(n1.vhost, "work.quarantine")
    assert info is not None
    assert info["type"] == "classic"
    assert info["node"] == NODES[1]
    nodes_ctl("stop", "2")  # 1 and 3 run: a majority, but work.quarantine's node is down
    again = cli_subprocess(n1, "topology", "apply", str(work), timeout=60)
    assert again.returncode == 0, again.stderr
    assert "nothing to create" in again.stdout  # it exists: apply can't help
    worker = start_worker(n1, tmp_path, work)
    out, _ = await asyncio.to_thread(worker.communicate, timeout=60)
    assert worker.returncode == 3, out
    assert f"exist but their node {NODES[1]} is down" in out, out
    assert "work.quarantine" in out
    assert f"bring {NODES[1]} back" in out
    assert "apply the topology first" not in out, out


@pytest.mark.timeout(400)
async def test_quorum_job_queue_survives_its_leaders_node_stopped(
    cluster43: list[BrokerSettings], exclusive: None, tmp_path: Path
):
    await quorum_leader_stopped(cluster43, CLUSTER43, "amqpjobs43-c2", tmp_path)


@pytest.mark.timeout(300)
async def test_a_quorum_job_queues_quarantine_takes_jobs_while_the_declaring_node_is_down(
    vhost_nodes: list[BrokerSettings], tmp_path: Path
):
    """A quorum job queue's quarantine is quorum (topology/holding_queues.py): with node 1 (where apply
    declared everything) stopped, a worker given the other two quarantines every rejected job there.
    (A classic quarantine lives on its declaring node: the test above shows the worker refusing then.)"""
    work = tmp_path / "work.toml"
    work.write_text(WORK)
    applied = cli_subprocess(vhost_nodes[0], "topology", "apply", str(work))
    assert applied.returncode == 0, applied.stderr
    with ManagementClient(vhost_nodes[0]) as mgmt:
        kinds = {
            name: (mgmt.queue(vhost_nodes[0].vhost, name) or {}).get("type")
            for name in ("work.quarantine", "work.parked")
        }
    assert kinds == {"work.quarantine": "quorum", "work.parked": "quorum"}
    nodes_ctl("stop", "1")
    others = broker_settings(",".join(node.nodes[0] for node in vhost_nodes[1:]))
    app = App("khepri", topology=load_topology(work).topology, url=others.url)
    runs: Counter[str] = Counter()

    @app.job("decline", queue="work")
    async def decline(payload: dict[str, Any], ctx: JobContext) -> None:
        runs[ctx.job_id] += 1
        raise Reject("card declined")

    for i in range(20):
        await app.enqueue("decline", {"i": i}, job_id=f"r-{i}")
    worker = Worker(app, others, WorkerOptions(queues=("work",), concurrency=4))
    await worker.start()
    try:
        deadline = time.monotonic() + 60
        while len(runs) < 20 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)  # its last moves confirmed and acked
        quarantined = await messages_in(others, "work.quarantine")  # node 1 still down
        left = await messages_in(others, "work")
    finally:
        await worker.shutdown()
        await app.close()
    assert runs == Counter({f"r-{i}": 1 for i in range(20)})
    assert sorted(quarantined) == sorted(f"r-{i}" for i in range(20))
    assert left == []
