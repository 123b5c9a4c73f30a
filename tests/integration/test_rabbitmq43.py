"""What RabbitMQ 4.3 changes (release notes 4.1.0-4.3.0), each asserted on the broker the suite runs on.

CI runs these on 3.10, 4.0 and 4.3 (``make test``); a test asserts the 4.3 behaviour on
4.3+ and the older one, or our refusal with its fix, before.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aio_pika
import pytest

from amqpjobs import App, ConfigurationError, RetryPolicy, Worker, WorkerOptions
from amqpjobs.jobs import evidence
from amqpjobs.jobs.outcome import Quarantine
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.topology.loader import load_topology
from amqpjobs.topology.versions import CONSUMER_TIMEOUT_MARGIN
from amqpjobs.wire.delivery import get_unacked
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings
from tests.conftest import BrokerRoot
from tests.integration.helpers import cli_subprocess, raw_channel
from tests.integration.worker_env import Recorder

pytestmark = pytest.mark.broker

QUORUM = """
[[exchange]]
name = "jobs"

[[job_queue]]
name = "money"
exchange = "jobs"
type = "quorum"
retry_tiers = ["1s"]
"""


def four_three(root: BrokerRoot) -> bool:
    return root.version >= (4, 3)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "t.toml"
    path.write_text(text)
    return path


async def test_quorum_priorities_0_to_31_on_43_refused_with_the_fix_before(
    broker: BrokerSettings, broker_root: BrokerRoot, tmp_path: Path
):
    """A priority-9 job behind 1,000 priority-0 jobs on a quorum job queue with max_priority 10."""
    path = write(tmp_path, QUORUM + "max_priority = 10\n")
    if not four_three(broker_root):
        result = cli_subprocess(broker, "topology", "apply", str(path))
        assert result.returncode == 2, result.stderr
        assert "quorum-queue priorities 0-31 need RabbitMQ 4.3+" in result.stderr
        assert "upgrade the broker to RabbitMQ 4.3+" in result.stderr
        with ManagementClient(broker) as mgmt:
            assert [q["name"] for q in mgmt.queues(broker.vhost)] == []  # nothing declared
        return
    await apply_topology(path, broker)
    with ManagementClient(broker) as mgmt:
        (work,) = [q for q in mgmt.queues(broker.vhost) if q["name"] == "money"]
    assert work["type"] == "quorum"
    assert "x-max-priority" not in work["arguments"]  # ignored by 4.3 quorum queues: not sent
    app = App("p", topology=load_topology(path).topology, url=broker.url)
    started: list[str] = []
    app.job("pay", queue="money")(lambda p, c: started.append(c.job_id))
    for i in range(1000):
        await app.enqueue("pay", {}, job_id=f"low-{i}")
    await app.enqueue("pay", {}, job_id="urgent", priority=9)
    recorder = Recorder()
    worker = Worker(app, broker, WorkerOptions(queues=("money",), concurrency=1), recorder)
    await worker.start()
    try:
        await recorder.wait_for(lambda o: len(o) >= 10)
    finally:
        await worker.shutdown()
        await app.close()
    assert "urgent" in started[:10], started[:12]


async def test_jobs_carry_an_explicit_priority_0(broker: BrokerSettings, tmp_path: Path):
    """A 4.3 quorum queue counts a message without priority as 4; ours always say 0 (README)."""
    path = write(tmp_path, QUORUM)
    await apply_topology(path, broker)
    app = App("p", topology=load_topology(path).topology, url=broker.url)
    app.job("pay", queue="money")(lambda p, c: None)
    await app.enqueue("pay", {}, job_id="plain")
    await app.close()
    with ManagementClient(broker) as mgmt:  # aio-pika would show a missing priority as 0: read the raw properties
        (msg,) = mgmt.request(
            "POST", f"/queues/{broker.vhost}/money/get",
            json={"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"},
        )  # fmt: skip
    assert msg["properties"]["priority"] == 0


async def test_quorum_consumers_send_x_consumer_timeout_on_43(
    broker: BrokerSettings, broker_root: BrokerRoot, tmp_path: Path
):
    path = write(tmp_path, QUORUM)
    await apply_topology(path, broker)
    app = App("p", topology=load_topology(path).topology, url=broker.url)
    app.job("pay", queue="money", timeout="90s")(lambda p, c: None)
    app.job("refund", queue="money", timeout="30s")(lambda p, c: None)
    worker = Worker(app, broker, WorkerOptions(queues=("money",), concurrency=2))
    await worker.start()
    consumers: list[dict[str, Any]] = []
    try:
        deadline = time.monotonic() + 15
        with ManagementClient(broker) as mgmt:
            while not consumers and time.monotonic() < deadline:
                consumers = [
                    c for c in mgmt.request("GET", f"/consumers/{broker.vhost}") if c["queue"]["name"] == "money"
                ]
                await asyncio.sleep(0.2)
    finally:
        await worker.shutdown()
    (consumer,) = consumers
    if four_three(broker_root):
        assert consumer["arguments"] == {"x-consumer-timeout": round((90 + CONSUMER_TIMEOUT_MARGIN) * 1000)}
    else:
        assert consumer["arguments"] == {}  # before 4.3 the node's consumer_timeout rules


async def test_nack_hands_back_uncharged_on_43_reject_is_charged(
    broker: BrokerSettings, broker_root: BrokerRoot, tmp_path: Path
):
    """4.3: nack raises only x-acquired-count; reject raises x-delivery-count (the limit's counter)."""
    await apply_topology(write(tmp_path, QUORUM), broker)
    async with raw_channel(broker) as ch:
        await (await ch.get_exchange("jobs")).publish(aio_pika.Message(b"{}", type="pay"), routing_key="money")
        seen: list[tuple[Any, Any]] = []
        for settle in ("requeue", "requeue", "reject"):
            async for d in get_unacked(ch, "money", 1):
                seen.append((d.headers.get("x-delivery-count"), d.headers.get("x-acquired-count")))
                if settle == "requeue":
                    await d.requeue()  # our hand-back of a delivery that never started: basic.nack
                else:
                    await (await ch.get_underlay_channel()).basic_reject(d.delivery_tag, requeue=True)
        async for d in get_unacked(ch, "money", 1):
            seen.append((d.headers.get("x-delivery-count"), d.headers.get("x-acquired-count")))
            await d.ack()
    counts = [(dc or 0, ac or 0) for dc, ac in seen]  # absent on a first delivery (3.10 says 0)
    if four_three(broker_root):
        assert counts == [(0, 0), (0, 1), (0, 2), (1, 3)]
    else:  # before 4.3 every return is charged, and there is no x-acquired-count
        assert counts == [(0, 0), (1, 0), (2, 0), (3, 0)]


async def test_a_redelivery_is_a_start_on_every_version_even_with_only_x_acquired_count(
    broker: BrokerSettings, broker_root: BrokerRoot, tmp_path: Path
):
    """Two nacks by another client, then a worker: registered as a suspect and run alone on every version.

    On 4.3 the redelivery carries only x-acquired-count, as after a consumer timeout that
    returned a run still going: the worker can't tell them apart, so it counts a start. The
    suspect is a copy, whose counters start again: evidence (0, 0).
    """
    path = write(tmp_path, QUORUM)
    await apply_topology(path, broker)
    app = App("p", topology=load_topology(path).topology, url=broker.url)

    def pay(payload: dict[str, Any], ctx: Any) -> None:
        raise ValueError("no such account")

    app.job("pay", queue="money", retry=RetryPolicy(max_attempts=1))(pay)
    await app.enqueue("pay", {}, job_id="j-1")
    async with raw_channel(broker) as ch:
        for _ in range(2):  # two hand-backs before a worker takes it
            async for d in get_unacked(ch, "money", 1):
                await d.requeue()
    recorder = Recorder()
    worker = Worker(app, broker, WorkerOptions(queues=("money",)), recorder)
    await worker.start()
    try:
        await recorder.wait_for(lambda o: any(isinstance(x.decision, Quarantine) for x in o))
    finally:
        await worker.shutdown()
        await app.close()
    kinds = [type(o.decision).__name__ for o in recorder.outcomes]
    async with raw_channel(broker) as ch:
        q = await ch.get_queue("money.quarantine", ensure=False)
        dead = await q.get(timeout=5)
        await dead.ack()
    headers = dead.headers
    # none of the job queue's counters on the copy; the quarantine is quorum too and counts its own
    # deliveries: 3.10 says x-delivery-count 0 on this first one, 4.x says nothing (CI 48)
    assert headers.get("x-delivery-count", 0) == 0
    assert headers.get("x-acquired-count", 0) == 0
    assert headers[evidence.REASON] == "exhausted"  # max_attempts=1
    assert kinds == ["Register", "Quarantine"]
    assert (headers[evidence.DELIVERY_COUNT], headers[evidence.ACQUIRED_COUNT]) == (0, 0)


async def test_worker_refuses_quorum_max_priority_before_43(
    broker: BrokerSettings, broker_root: BrokerRoot, tmp_path: Path
):
    """Loaded without a broker, the topology is accepted with a note; the worker judges it at connect."""
    await apply_topology(write(tmp_path, QUORUM), broker)  # the same declarations: no x-max-priority is sent
    loaded = load_topology(write(tmp_path, QUORUM + "max_priority = 10\n"))
    assert any("quorum-queue priorities need RabbitMQ 4.3+" in w for w in loaded.warnings)
    app = App("p", topology=loaded.topology, url=broker.url)
    app.job("pay", queue="money")(lambda p, c: None)
    worker = Worker(app, broker, WorkerOptions(queues=("money",)))
    if four_three(broker_root):
        await worker.start()
        await worker.shutdown()
        return
    with pytest.raises(
        ConfigurationError,
        match=r"job queue\(s\) money: max_priority: quorum-queue priorities 0-31 "
        r"need RabbitMQ 4\.3\+ \(connected: .*fix: upgrade the broker to RabbitMQ 4\.3\+",
    ):
        await worker.start()
    await worker.shutdown()


@pytest.mark.timeout(60)
async def test_a_consumer_timeout_on_43_counts_a_start_and_its_rerun_never_overlaps(
    broker: BrokerSettings,
    broker_root: BrokerRoot,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
):
    """A plain-function job overruns its timeout past x-consumer-timeout (4.3 quorum queue).

    The broker cancels the consumer and returns the delivery with only x-acquired-count
    raised, exactly as for a nack: the worker must take it for a start without an outcome
    (registered, then run alone once the first run ended), and consume again under a new
    consumer tag (reusing the cancelled one makes 4.3 close the whole connection, 530).
    """
    if not four_three(broker_root):
        pytest.skip("x-consumer-timeout per consumer on quorum queues is RabbitMQ 4.3+")
    import amqpjobs.topology.versions as versions

    monkeypatch.setattr(versions, "CONSUMER_TIMEOUT_MARGIN", 1.0)  # x-consumer-timeout = 1 s + 1 s
    path = write(tmp_path, QUORUM)
    await apply_topology(path, broker)
    app = App("p", topology=load_topology(path).topology, url=broker.url)
    runs: list[tuple[float, float]] = []

    def slow(payload: dict[str, Any], ctx: Any) -> None:
        started = time.monotonic()
        time.sleep(3.5)  # a thread can't be cancelled: it overruns its 1 s timeout and the consumer timeout
        runs.append((started, time.monotonic()))

    app.job("slow", queue="money", timeout="1s")(slow)
    await app.enqueue("slow", {}, job_id="s-1")
    recorder = Recorder()
    worker = Worker(app, broker, WorkerOptions(queues=("money",), concurrency=2), recorder)
    await worker.start()
    try:
        await recorder.wait_for(lambda o: sum(x.kind == "succeeded" for x in o) == 2, timeout=30)
        await asyncio.sleep(2.5)  # a third run would have started by now
    finally:
        await worker.shutdown()
        await app.close()
    kinds = [o.kind for o in recorder.outcomes]
    assert len(runs) == 2, (runs, kinds)
    (_, e1), (s2, _) = sorted(runs)
    assert s2 >= e1, f"the rerun started {e1 - s2:.1f}s before the first run ended"
    assert kinds.count("redelivered") == 1, kinds  # the returned delivery, registered as start 2
    assert "NOT_ALLOWED" not in caplog.text  # never the cancelled consumer tag again
    with ManagementClient(broker) as mgmt:
        depths = {q["name"]: q.get("messages", 0) for q in mgmt.queues(broker.vhost)}
    assert depths.get("money.quarantine", 0) == 0, depths
