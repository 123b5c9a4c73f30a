"""Failover on the project's 3-node cluster (scripts/cluster.sh): a worker and a publisher given every
node, heartbeat 5 s, lose their node mid-run and carry on from another within 10 s (issue 23).

Each test ends with an exact account: every job completed or quarantined (worker), every
enqueue call confirmed and present or raised (publisher); none lost.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import re
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import aio_pika
import pytest

from amqpjobs import App, JobContext, Reject, Worker, WorkerOptions
from amqpjobs.errors import AmqpJobsError
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.topology.loader import load_topology
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings, broker_settings
from tests.integration.test_chaos import CLUSTER, QUORUM, cluster  # noqa: F401  (the cluster fixture)

# one xdist worker owns the cluster: its session fixture starts scripts/cluster.sh (fixed ports) and tests stop nodes
pytestmark = [
    pytest.mark.broker,
    pytest.mark.chaos,
    pytest.mark.slow,
    pytest.mark.version_independent,
    pytest.mark.xdist_group("cluster"),
]
#: What the issue asks: the client consumes / publishes through another node within this many seconds.
FAILOVER_WITHIN = 10.0


@pytest.fixture
def vhost_on(cluster: list[BrokerSettings]) -> Iterator[BrokerSettings]:  # noqa: F811
    """A fresh vhost on the cluster: settings naming all 3 nodes, heartbeat 5 s (management API per node)."""
    vhost = f"failover-{uuid.uuid4().hex[:8]}"
    with ManagementClient(cluster[0]) as mgmt:
        mgmt.create_vhost(vhost)
    nodes = ",".join(n.with_vhost(vhost).nodes[0] + "?heartbeat=5" for n in cluster)
    settings = broker_settings(nodes)
    try:
        yield settings
    finally:
        for n in (1, 2, 3):  # every node back (a test stops one), then the vhost goes
            subprocess.run(["bash", str(CLUSTER), "start", str(n)], capture_output=True, timeout=120)
        with ManagementClient(settings) as mgmt:
            mgmt.delete_vhost(vhost)


def nodes_of(settings: BrokerSettings, name: str) -> list[int]:
    """The cluster node numbers (1..3) of the vhost's connections named ``name``."""
    with ManagementClient(settings) as mgmt:
        found = mgmt.request("GET", f"/vhosts/{quote(settings.vhost, safe='')}/connections") or []
    mine = [c for c in found if (c.get("client_properties") or {}).get("connection_name") == name]
    return [int(str(c["node"]).split("@")[0].removeprefix("amqpjobs-c")) for c in mine]


async def wait_for_node(settings: BrokerSettings, name: str, other_than: int = 0, within: float = 30) -> int:
    """The node of the one connection named ``name`` once it is on a node other than ``other_than``."""
    deadline = time.monotonic() + within
    while True:
        found = await asyncio.to_thread(nodes_of, settings, name)
        if len(found) == 1 and found[0] != other_than:
            return found[0]
        assert time.monotonic() < deadline, f"connection {name!r} on {found}, still not off node {other_than}"
        await asyncio.sleep(0.1)


async def connected_to(
    caplog: pytest.LogCaptureFixture, name: str, after: float = 0.0, within: float = 30
) -> tuple[int, float]:
    """The node (1..3) that connection ``name`` logged it connected to after ``after``, and when (``time.time()``)."""
    deadline = time.monotonic() + within
    prefix = f"connection {name} connected to "
    while True:
        for r in caplog.records:
            if r.name == "amqpjobs.wire" and r.getMessage().startswith(prefix) and r.created > after:
                port = urlsplit(r.getMessage().removeprefix(prefix)).port
                assert port is not None
                return port - 5700, r.created  # scripts/cluster.sh: node N listens on 5700 + N
        assert time.monotonic() < deadline, f"connection {name} logged no (re)connect"
        await asyncio.sleep(0.02)


def lost_at(caplog: pytest.LogCaptureFixture, name: str, after: float) -> float:
    """When connection ``name`` logged it lost its node after ``after`` (``time.time()``)."""
    prefix = f"connection {name} lost"
    return min(
        r.created
        for r in caplog.records
        if r.name == "amqpjobs.wire" and r.getMessage().startswith(prefix) and r.created > after
    )


def longest_gap(times: list[float], since: float) -> float:
    """The longest wait between ``since`` and the first of ``times``, or between two of them (seconds).

    Measured from the stop: what a caller saw, whether the node took seconds to close its
    connections (a loaded machine: 17 s seen) or held calls unanswered meanwhile.
    """
    points = [since, *sorted(times)]
    return max(b - a for a, b in itertools.pairwise(points)) if times else 0.0


def twice_account(
    caplog: pytest.LogCaptureFixture,
    job_id: str,
    runs: list[tuple[float, float, bool]],
    stopping: float,
    lost: float,
    moved: float,
) -> str:
    """A job that ran twice: its runs (seconds from the stop) and the worker's log lines about it."""

    def at(t: float) -> str:
        return f"{t - stopping:+.3f}"

    lines = [
        f"  {at(r.created)} {r.levelname} {r.getMessage()[:160]}"
        for r in caplog.records
        if re.search(rf"\b{re.escape(job_id)}\b", r.getMessage())
    ]
    spans = ", ".join(f"{at(a)}..{at(b)}{' redelivered' if again else ''}" for a, b, again in runs)
    return f"{job_id}: runs {spans} (lost {at(lost)}, moved {at(moved)})\n" + "\n".join(lines)


async def start_node(n: int) -> None:
    done = await asyncio.to_thread(subprocess.run, ["bash", str(CLUSTER), "start", str(n)], capture_output=True)
    assert done.returncode == 0


async def stop_node(n: int) -> None:
    done = await asyncio.to_thread(subprocess.run, ["bash", str(CLUSTER), "stop", str(n)], capture_output=True)
    assert done.returncode == 0


async def messages_in(settings: BrokerSettings, queue: str) -> list[str]:
    """The job ids in ``queue``, taken out (acked) through one node that is up."""
    for url in settings.nodes:
        try:
            connection = await aio_pika.connect(url)
        except Exception:  # the stopped node
            continue
        async with connection:
            q = await (await connection.channel()).get_queue(queue, ensure=False)
            ids = []
            while (msg := await q.get(fail=False)) is not None:
                await msg.ack()
                ids.append(str(msg.message_id))
            return ids
    raise AssertionError("no node of the cluster answers")


@pytest.mark.timeout(300)
async def test_a_worker_moves_to_another_node_when_its_node_stops(
    vhost_on: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
):
    path = tmp_path / "q.toml"
    path.write_text(QUORUM)
    # The hardest case: the worker's node X is also the first leader of the quorum job queue and of
    # its quarantine (quorum too): all declared through node 1, the worker on it.
    await apply_topology(path, broker_settings(vhost_on.nodes[0]))
    monkeypatch.setattr(random, "shuffle", lambda nodes: None)  # node 1 first, in this test only
    app = App("fo", topology=load_topology(path).topology, url=vhost_on.url)
    done: Counter[str] = Counter()
    finished: list[float] = []
    runs: dict[str, list[tuple[float, float, bool]]] = {}  # job id -> (start, end, ctx.redelivered) of each run
    # While node X stops, each job takes 0.2 s: the 1,700 left last ~85 s at 4 at a time, so work is
    # still queued when X closes the connection (CI run 27, loaded: X took 29.9 s, and at 0.05 s a job
    # all 2,000 had run through X before it closed). Before the stop and after the move: 0.05 s.
    pace = {"seconds": 0.05}

    @app.job("pay", queue="money")
    async def pay(payload: dict[str, Any], ctx: JobContext) -> None:
        began = time.time()
        await asyncio.sleep(pace["seconds"])
        done[ctx.job_id] += 1
        finished.append(time.time())
        runs.setdefault(ctx.job_id, []).append((began, finished[-1], ctx.redelivered))

    for i in range(2000):
        await app.enqueue("pay", {"i": i}, job_id=f"p-{i}")
    await app.close()
    caplog.set_level(logging.INFO, "amqpjobs.wire")
    caplog.set_level(logging.INFO, "amqpjobs.worker")
    worker = Worker(app, vhost_on, WorkerOptions(queues=("money",), concurrency=4))
    await worker.start()
    try:
        x, _ = await connected_to(caplog, "fo-worker")
        deadline = time.monotonic() + 60
        while len(done) < 300 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        pace["seconds"] = 0.2
        stopping = time.time()
        await stop_node(x)
        y, moved = await connected_to(caplog, "fo-worker", after=stopping, within=90)
        pace["seconds"] = 0.05
        assert len(done) < 2000, f"every job ran through node {x} before it closed the connection"
        deadline = time.monotonic() + 120
        while len(done) < 2000 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
    finally:
        await worker.shutdown()
    assert y != x
    lost = lost_at(caplog, "fo-worker", stopping)
    on_y = [t for t in finished if t > moved]
    assert on_y, f"no job ran after the move to node {y} (the node closed the connection {lost - stopping:.1f}s in)"
    outage = longest_gap([t for t in finished if stopping <= t <= on_y[0]], stopping)
    assert outage <= FAILOVER_WITHIN, (
        f"no job finished for {outage:.1f}s (the node closed the connection {lost - stopping:.1f}s after the "
        f"stop began, the worker connected to node {y} {moved - lost:.1f}s later)"
    )
    await start_node(x)  # back for the count (the quarantine, quorum, answers without it too)
    quarantined = await messages_in(vhost_on, "money.quarantine")
    assert set(done) | set(quarantined) == {f"p-{i}" for i in range(2000)}, "none lost"
    # At-least-once: a job runs again when the broker did not get its ack, the 4 in flight on the lost
    # connection, and (CI, stop 50: p-670) deliveries whose acks were in transit as the node stopped or
    # as the quorum queue's leader moved off it, at most a prefetch window (4) more. Every repeat must
    # have been announced to the handler (ctx.redelivered): a copy of ours never runs a job twice unseen.
    twice = sorted(j for j, n in done.items() if n > 1)
    account = "\n".join(twice_account(caplog, j, runs[j], stopping, lost, moved) for j in twice)
    unannounced = [j for j in twice if not all(again for _, _, again in sorted(runs[j])[1:])]
    assert not unannounced, f"repeats the handler was not told of (ctx.redelivered False): {unannounced}\n{account}"
    assert len(twice) <= 8, f"{len(twice)} jobs ran twice, more than the deliveries in flight:\n{account}"
    assert await messages_in(vhost_on, "money") == []


@pytest.mark.timeout(300)
async def test_a_publisher_moves_to_another_node_when_its_node_stops(
    vhost_on: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    path = tmp_path / "q.toml"
    path.write_text(QUORUM)
    await apply_topology(path, vhost_on)
    app = App("fop", topology=load_topology(path).topology, url=vhost_on.url)
    app.job("pay", queue="money")(lambda p, c: None)
    confirmed: dict[str, float] = {}
    raised: dict[str, str] = {}
    caplog.set_level(logging.INFO, "amqpjobs.wire")
    stopping = 0.0
    stop: asyncio.Task[None] | None = None
    sent = 0  # enqueue calls made: 300 before the stop, then until 100 more after it returned
    after_stop = 0
    try:
        while after_stop < 100:
            assert sent < 50_000, "the node's stop never returned"
            if sent == 300:
                x, _ = await connected_to(caplog, "fop-publisher")
                stopping = time.time()
                stop = asyncio.create_task(stop_node(x))  # enqueues go on while the node stops
            elif stop is not None and stop.done():
                after_stop += 1
            job_id = f"e-{sent}"
            sent += 1
            try:
                await app.enqueue("pay", {"i": sent}, job_id=job_id)
                confirmed[job_id] = time.time()
            except AmqpJobsError as exc:
                raised[job_id] = f"{type(exc).__name__}: {exc}"
                await asyncio.sleep(0.05)
        assert stop is not None
        await stop
        y, moved = await connected_to(caplog, "fop-publisher", after=stopping)
    finally:
        await app.close()
    assert y != x
    await start_node(x)
    lost = lost_at(caplog, "fop-publisher", stopping)
    again = min(t for t in confirmed.values() if t > lost)  # the first enqueue confirmed through another node
    outage = longest_gap([t for t in confirmed.values() if stopping <= t <= again], stopping)
    present = Counter(await messages_in(vhost_on, "money"))
    assert len(confirmed) + len(raised) == sent
    assert set(confirmed) <= set(present), f"{len(set(confirmed) - set(present))} confirmed but lost"
    assert set(present) <= set(confirmed) | set(raised)
    assert max(present.values()) == 1, "no enqueue call published twice"
    assert outage <= FAILOVER_WITHIN, (
        f"no enqueue confirmed for {outage:.1f}s (the node closed the connection {lost - stopping:.1f}s after the "
        f"stop began, the publisher connected to node {y} {moved - lost:.1f}s later, confirmed again "
        f"{again - lost:.1f}s later; {len(raised)} raised: {sorted(raised.items())[:3]})"
    )
    assert len(raised) < 300, f"node {y}: calls kept failing after the stop: {sorted(raised.items())[:3]}"
    assert all(f"e-{i}" in confirmed for i in range(sent - 100, sent)), "enqueues confirmed again on another node"


@pytest.mark.timeout(300)
async def test_a_quorum_job_queue_quarantines_while_the_node_that_declared_it_is_down(
    vhost_on: BrokerSettings, tmp_path: Path
):
    """Its quarantine is quorum too: with a majority up, a job is moved there while node 1 (where
    apply declared everything) is down. (A classic one lived on node 1 only: the broker returned the
    move, 312 NO_ROUTE, and the worker held the job and stopped consuming until node 1 came back.)"""
    path = tmp_path / "q.toml"
    path.write_text(QUORUM)
    await apply_topology(path, broker_settings(vhost_on.nodes[0]))
    app = App("foq", topology=load_topology(path).topology, url=vhost_on.url)
    runs: Counter[str] = Counter()

    @app.job("pay", queue="money")
    async def pay(payload: dict[str, Any], ctx: JobContext) -> None:
        runs[ctx.job_id] += 1
        raise Reject("card declined")

    await stop_node(1)
    for i in range(20):
        await app.enqueue("pay", {"i": i}, job_id=f"r-{i}")
    await app.close()
    worker = Worker(app, vhost_on, WorkerOptions(queues=("money",), concurrency=4))
    await worker.start()
    try:
        deadline = time.monotonic() + 60
        while len(runs) < 20 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        quarantined = await messages_in(vhost_on, "money.quarantine")  # node 1 still down
    finally:
        await worker.shutdown()
    assert runs == Counter({f"r-{i}": 1 for i in range(20)})
    assert sorted(quarantined) == sorted(f"r-{i}" for i in range(20))
    assert await messages_in(vhost_on, "money") == []
