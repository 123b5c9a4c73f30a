"""Behaviour that differs between RabbitMQ 3.10 and 4.x: each test asserts the right thing on the broker it runs on.

CI runs the broker-facing suite on each (``make test``: 3.10, then 4.0 with AMQPJOBS_TEST_BROKER=4, then 4.3
with AMQPJOBS_TEST_BROKER=43); what 4.3 changes is in test_rabbitmq43.py.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from amqpjobs import App, ConfigurationError, MessageTooLargeError
from amqpjobs.errors import TopologyValidationError
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.topology.loader import load_topology
from amqpjobs.wire.connection import MAX_MESSAGE_SIZE_3X, MAX_MESSAGE_SIZE_4X
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.publish import ConfirmedPublisher
from amqpjobs.wire.settings import BrokerSettings
from tests.conftest import BrokerRoot
from tests.integration.helpers import cli, depth, depth_at_least, raw_channel, wait_until_async
from tests.integration.worker_env import make_app, running_worker

pytestmark = pytest.mark.broker

QUORUM = """
[[exchange]]
name = "jobs"

[[job_queue]]
name = "money"
exchange = "jobs"
type = "quorum"
delivery_limit = 25
retry_tiers = ["1s"]
"""


async def test_payload_over_the_brokers_max_message_size_is_refused_before_publishing(
    broker: BrokerSettings, broker_root: BrokerRoot, tmp_path: Path
):
    app = await make_app(broker, tmp_path)
    app.job("blob", queue="work")(lambda p, c: None)
    await app.connect(broker)
    four = broker_root.version >= (4, 0)
    assert isinstance(app._publisher, ConfirmedPublisher)
    assert app._publisher.max_message_size == (MAX_MESSAGE_SIZE_4X if four else MAX_MESSAGE_SIZE_3X)
    big = {"data": "x" * (17 * 1024 * 1024)}  # over 4.x's 16 MiB, under 3.x's 128 MiB
    if four:
        with pytest.raises(MessageTooLargeError, match="max_message_size of 16777216 bytes"):
            await app.enqueue("blob", big)
        assert await depth(broker, "work") == 0
    else:
        await app.enqueue("blob", big)
        assert await depth(broker, "work") == 1
    await app.enqueue("blob", {"data": "small"})  # the connection is healthy either way
    await app.close()
    small_limit = App("t", topology=app.topology(), url=broker.url, max_message_size=1024)
    small_limit.job("blob", queue="work")(lambda p, c: None)
    with pytest.raises(MessageTooLargeError, match="over the broker's max_message_size of 1024 bytes"):
        await small_limit.enqueue("blob", {"data": "y" * 2000})
    await small_limit.close()


async def test_quorum_job_queue_never_drops_a_job_after_20_redeliveries(broker: BrokerSettings, tmp_path: Path):
    path = tmp_path / "q.toml"
    path.write_text(QUORUM)
    await apply_topology(path, broker)
    deliveries = 0
    async with raw_channel(broker) as ch:
        ex = await ch.get_exchange("jobs")
        import aio_pika

        await ex.publish(aio_pika.Message(b'{"n": 1}', message_id="m-1", type="pay"), routing_key="money")
        work = await ch.get_queue("money", ensure=False)
        for _ in range(40):
            msg = await work.get(timeout=5, fail=False)
            if msg is None:
                break
            deliveries += 1
            await msg.reject(requeue=True)  # charged on every version (4.3 no longer charges a nack)
            if deliveries == 21:
                assert await depth(broker, "money") == 1, "still there after 20 redeliveries (4.x's default limit)"
        # the dead-letter hop is the broker's, in its own time (not a fixed 0.5 s); never: dropped, and the wait fails
        await wait_until_async(lambda: depth_at_least(broker, "money.quarantine", 1), 10, "the dead letter")
        quarantine = await ch.get_queue("money.quarantine", ensure=False)
        dead = await quarantine.get(timeout=5, fail=False)
        assert dead is not None, "dead-lettered into quarantine, not dropped"
        await dead.ack()
    assert deliveries in (25, 26)  # the explicit limit of 25, not the broker's default
    assert dead.message_id == "m-1"
    death = dead.headers["x-death"][0]  # type: ignore[index]
    assert death["reason"] == "delivery_limit"  # type: ignore[index,call-overload]
    assert death["queue"] == "money"  # type: ignore[index,call-overload]


async def test_worker_slots_are_per_consumer_prefetch_on_durable_queues(broker: BrokerSettings, tmp_path: Path):
    """4.3+ refuses global QoS and transient non-exclusive queues; we use neither, on any version.

    3 slots = one consumer with per-consumer prefetch 3 (at most one unacked delivery per slot).
    """
    app = await make_app(broker, tmp_path)
    app.job("noop", queue="work")(lambda p, c: None)
    async with running_worker(app, broker, concurrency=3):
        consumers: list[dict[str, Any]] = []
        deadline = time.monotonic() + 15
        with ManagementClient(broker) as mgmt:
            while time.monotonic() < deadline:
                consumers = [
                    c for c in mgmt.request("GET", f"/consumers/{broker.vhost}") if c["queue"]["name"] == "work"
                ]
                if consumers:
                    break
                await asyncio.sleep(0.2)
            channels = mgmt.request("GET", f"/vhosts/{broker.vhost}/channels")
            queues = mgmt.queues(broker.vhost)
    assert [c["prefetch_count"] for c in consumers] == [3]
    assert all(ch.get("global_prefetch_count", 0) == 0 for ch in channels)
    shared = [q["name"] for q in queues if not q["exclusive"]]  # exclusive: the worker's pause listener
    assert "work" in shared
    assert [q["name"] for q in queues if not q["exclusive"] and not q["durable"]] == []
    assert [q["name"] for q in queues if not q["exclusive"] and q["auto_delete"]] == []


def test_quorum_priorities_are_judged_for_the_connected_version(
    broker: BrokerSettings, broker_root: BrokerRoot, tmp_path: Path
):
    path = tmp_path / "p.toml"
    path.write_text(QUORUM.replace("delivery_limit = 25", "delivery_limit = 25\nmax_priority = 5"))
    result = cli(broker, "topology", "plan", str(path))
    if broker_root.version >= (4, 3):  # strict quorum-queue priorities 0-31 (release notes 4.3.0)
        assert result.exit_code == 0, result.stderr
        return
    assert result.exit_code == 2
    assert "quorum-queue priorities 0-31 need RabbitMQ 4.3+" in result.stderr
    if broker_root.version >= (4, 0):
        assert "4.0-4.2 quorum queues have two levels, 0-4 normal and 5-255 high" in result.stderr
    else:
        assert "upgrade the broker to RabbitMQ 4.3+" in result.stderr
    # the library judges the file for the connected version as the CLI did
    with pytest.raises(TopologyValidationError, match=r"quorum-queue priorities 0-31 need RabbitMQ 4\.3"):
        load_topology(path, broker_root.version)


async def drained_priorities(broker: BrokerSettings, queue_name: str) -> dict[str | None, int | None]:
    """Take every message of ``queue_name`` (acked): {message_id: priority}."""
    async with raw_channel(broker) as ch:
        queue = await ch.get_queue(queue_name, ensure=False)
        got = {}
        while (msg := await queue.get(fail=False)) is not None:
            got[msg.message_id] = msg.priority
            await msg.ack()
    return got


def priority_refused_on(version: tuple[int, ...]) -> bool:
    """Quorum queues have no priorities before RabbitMQ 4.0 (4.0: two levels, 0-4 normal, 5+ high)."""
    return version < (4, 0)


def assert_the_quorum_priority_refusal(exc: ConfigurationError, version: tuple[int, ...]) -> None:
    shown = ".".join(map(str, version))
    assert str(exc) == (
        "job 'pay': priority 7 can't be kept: job queue 'money' is a quorum queue, and quorum queues have no "
        f"priorities before RabbitMQ 4.0 (connected: {shown}); nothing was sent. Fix: leave priority out (every "
        'job then goes with 0), or a classic job queue with max_priority (type = "classic", under a new name: a '
        "queue's type is fixed when it is declared), or upgrade the broker to RabbitMQ 4.0+ (quorum queues: 0-4 "
        "normal, 5+ high; 4.3+: strict 0-31 with max_priority)"
    )


async def test_a_priority_for_a_quorum_job_queue_before_40_is_refused_and_nothing_sent(
    broker: BrokerSettings, broker_root: BrokerRoot, tmp_path: Path
):
    """Before the fix RabbitMQ 3.10 stored the job and dropped its priority without a word."""
    path = tmp_path / "q.toml"
    path.write_text(QUORUM)
    await apply_topology(path, broker)
    app = App("p", topology=load_topology(path).topology, url=broker.url)
    app.job("pay", queue="money")(lambda p, c: None)
    try:
        await app.enqueue("pay", {}, job_id="plain")  # no priority: taken on every version
        if priority_refused_on(broker_root.version):
            with pytest.raises(ConfigurationError) as caught:
                await app.enqueue("pay", {}, job_id="urgent", priority=7)
            assert_the_quorum_priority_refusal(caught.value, broker_root.version)
            with pytest.raises(ConfigurationError, match="priority 0 can't be kept"):
                await app.enqueue("pay", {}, job_id="zero", priority=0)
            await app.enqueue("pay", {}, job_id="after")  # the connection is healthy: the refusal sent nothing
            expected = {"plain": 0, "after": 0}
        else:
            await app.enqueue("pay", {}, job_id="urgent", priority=7)  # 4.0-4.2: high; 4.3: 7 of 0-31
            expected = {"plain": 0, "urgent": 7}
    finally:
        await app.close()
    assert await depth(broker, "money") == len(expected)
    assert await drained_priorities(broker, "money") == expected


async def test_a_priority_over_31_for_a_quorum_job_queue_on_43_is_refused_and_nothing_sent(
    broker: BrokerSettings, broker_root: BrokerRoot, tmp_path: Path
):
    """RabbitMQ 4.3 delivers a quorum-queue priority over 31 as 31 (seen here: 31, 40, 31 and 255 in publish
    order, then 30, then 0), as a classic queue does one over its ``x-max-priority``, which enqueue refuses;
    4.0-4.2 read any priority over 4 as their high level."""
    path = tmp_path / "q.toml"
    path.write_text(QUORUM)
    await apply_topology(path, broker)
    app = App("p", topology=load_topology(path).topology, url=broker.url)
    app.job("pay", queue="money")(lambda p, c: None)
    shown = ".".join(map(str, broker_root.version))
    try:
        if broker_root.version < (4, 0):
            pytest.skip("quorum queues have no priorities before 4.0: any is refused (the test above)")
        if broker_root.version >= (4, 3):
            with pytest.raises(ConfigurationError) as caught:
                await app.enqueue("pay", {}, job_id="over", priority=40)
            assert str(caught.value) == (
                "job 'pay': priority 40 can't be kept: job queue 'money' is a quorum queue, and RabbitMQ 4.3+ "
                f"has quorum-queue priorities 0-31 (connected: {shown}), a higher one is delivered as 31; nothing "
                "was sent. Fix: a priority of 0-31 (a job without one counts as 4), or max_priority on the job "
                "queue to have enqueue check a lower bound"
            )
            expected = {"top": 31}
        else:
            await app.enqueue("pay", {}, job_id="over", priority=40)  # 4.0-4.2: the high level
            expected = {"over": 40, "top": 31}
        await app.enqueue("pay", {}, job_id="top", priority=31)
    finally:
        await app.close()
    assert await depth(broker, "money") == len(expected)
    assert await drained_priorities(broker, "money") == expected


async def test_the_sync_publisher_refuses_it_too_on_both_its_paths(
    broker: BrokerSettings, broker_root: BrokerRoot, tmp_path: Path
):
    """The first call of a sync publisher goes through App.enqueue (it connects the app), the next ones the
    calling thread's fast path: priority 7 (refused before 4.0) and 40 (refused before 4.0 and from 4.3, where
    it would be delivered as 31) through each."""
    path = tmp_path / "q.toml"
    path.write_text(QUORUM)
    await apply_topology(path, broker)
    app = App("p", topology=load_topology(path).topology, url=broker.url)
    app.job("pay", queue="money")(lambda p, c: None)
    version = broker_root.version
    shown = ".".join(map(str, version))

    refusals: list[ConfigurationError] = []

    def publish(priority: int) -> tuple[list[str], int, int]:
        outcomes = []
        with app.sync_publisher() as pub:
            for n in range(2):  # the async path (not connected yet), then the fast path
                try:
                    outcomes.append(pub.enqueue("pay", {}, job_id=f"p{priority}-{n}", priority=priority))
                except ConfigurationError as exc:
                    refusals.append(exc)
                    outcomes.append("refused")
            outcomes.append(pub.enqueue("pay", {}, job_id=f"plain-{priority}"))
            assert pub._fast is not None
            return outcomes, pub._fast.calls, len(pub._fast.connections())

    sent = 0
    for priority, refused in ((7, version < (4, 0)), (40, version < (4, 0) or version >= (4, 3))):
        outcomes, fast_calls, fast_connections = await asyncio.to_thread(publish, priority)
        assert fast_connections == 1  # the fast path took the second and third calls
        if refused:
            assert outcomes == ["refused", "refused", f"plain-{priority}"]
            assert fast_calls == 1  # only "plain" was written on the blocking connection
            sent += 1
            assert len(refusals) == 2
            for exc in refusals:
                if priority == 7:
                    assert_the_quorum_priority_refusal(exc, version)
                elif version < (4, 0):
                    assert "quorum queues have no priorities before RabbitMQ 4.0" in str(exc)
                else:
                    assert f"has quorum-queue priorities 0-31 (connected: {shown}), a higher one is" in str(exc)
            refusals.clear()
        else:
            assert outcomes == [f"p{priority}-0", f"p{priority}-1", f"plain-{priority}"]
            assert (fast_calls, refusals) == (2, [])
            sent += 3
        assert await depth(broker, "money") == sent


async def test_a_priority_for_a_strict_quorum_job_queue_before_43_is_refused_and_nothing_sent(
    broker: BrokerSettings, broker_root: BrokerRoot, tmp_path: Path
):
    """max_priority on a quorum job queue asks for 4.3's strict priorities: 4.0-4.2 have two levels, 3.x none.

    The declarations are the same with or without it (no x-max-priority is sent), so an app whose
    topology says max_priority can publish to a queue applied without it; before 4.3 it is refused.
    """
    path = tmp_path / "q.toml"
    path.write_text(QUORUM)
    await apply_topology(path, broker)
    strict = tmp_path / "strict.toml"
    strict.write_text(QUORUM.replace("delivery_limit = 25", "delivery_limit = 25\nmax_priority = 10"))
    app = App("p", topology=load_topology(strict).topology, url=broker.url)
    app.job("pay", queue="money")(lambda p, c: None)
    try:
        if broker_root.version < (4, 3):
            with pytest.raises(ConfigurationError) as caught:
                await app.enqueue("pay", {}, job_id="urgent", priority=7)
            shown = ".".join(map(str, broker_root.version))
            assert str(caught.value).startswith(
                "job 'pay': priority 7 can't be kept: job queue 'money' (quorum, max_priority 10): quorum-queue "
                f"priorities 0-31 need RabbitMQ 4.3+ (connected: {shown}); nothing was sent (fix: upgrade the broker"
            )
            expected = 0
        else:
            await app.enqueue("pay", {}, job_id="urgent", priority=7)
            expected = 1
        await app.enqueue("pay", {}, job_id="plain")
    finally:
        await app.close()
    assert await depth(broker, "money") == expected + 1
