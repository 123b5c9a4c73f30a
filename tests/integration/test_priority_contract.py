"""Contract: a quorum job queue hands out messages in the same order on RabbitMQ and in the double.

The same mixed-priority messages go to a quorum job queue on the broker under test and into a
``TestBroker(broker_version=<that broker's version>)``; the orders they come out in must be the
same. Version-dependent on purpose (it runs on 3.10, 4.0 and 4.3): FIFO before 4.0, two levels
taken about 2:1 on 4.0-4.2, strict 0-31 (none as 4) on 4.3+, and on every version what came
back (a requeue) leaves first.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import aio_pika
import pytest
from pamqp.commands import Basic

from amqpjobs.jobs.registry import JobContext
from amqpjobs.runtime.app import App
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.testing import TestBroker
from amqpjobs.testing.memory import MemoryDelivery
from amqpjobs.topology.loader import load_topology
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import raw_channel
from tests.integration.worker_env import running_worker

pytestmark = pytest.mark.broker

TOPOLOGY = """
[[exchange]]
name = "jobs"

[[job_queue]]
name = "qq"
exchange = "jobs"
type = "quorum"
retry_tiers = ["1s"]

[[job_queue]]
name = "cq"
exchange = "jobs"
retry_tiers = ["1s"]

[[job_queue]]
name = "pq"
exchange = "jobs"
max_priority = 9
retry_tiers = ["1s"]
"""

Messages = list[tuple[str, int | None]]


def run(prefix: str, count: int, priority: int | None) -> Messages:
    """``count`` messages of ``priority``, ids ``<prefix>0``, ``<prefix>1`` ..."""
    return [(f"{prefix}{i}", priority) for i in range(count)]


#: Every level 4.3 tells apart, none beside 4, over 31 (200, 32) beside 31, 5+ beside 0-4 for 4.0.
MIXED: Messages = [("two", 2), ("none", None), ("top", 31), ("five", 5), ("huge", 200), ("four", 4), ("zero", 0),
                   ("nine", 9), ("thirty", 30), ("t32", 32), ("one", 1), ("none2", None), ("four2", 4),
                   ("six", 6), ("three", 3)]  # fmt: skip

#: Job ids and priorities, published in this order before a worker (concurrency 1) takes them.
CASES: dict[str, Messages] = {
    "mixed": MIXED,
    # old normal jobs waiting when high ones come: 4.0 takes two high for each normal one
    "normal-first": run("n", 6, 0) + run("h", 6, 9),
    # high jobs older than the normal ones: every version 4.0+ takes them all first
    "high-first": run("h", 4, 9) + run("n", 4, 0),
}


def broker_version(broker: BrokerSettings) -> tuple[int, ...]:
    with ManagementClient(broker) as mgmt:
        return mgmt.broker_version()


def rank_app(topology: Path, url: str | None, order: list[str]) -> App:
    app = App("ranks", topology=load_topology(topology).topology, url=url)

    @app.job("rank", queue="qq")
    async def rank(payload: dict[str, int], ctx: JobContext) -> None:
        order.append(ctx.job_id)

    return app


async def publish(broker: BrokerSettings, messages: Messages, queue: str = "qq") -> None:
    """Publish through aiormq: aio-pika's Message would send a priority None as 0, and 4.3 counts none as 4."""
    async with raw_channel(broker) as ch:
        underlay = await ch.get_underlay_channel()
        for job_id, priority in messages:
            properties = Basic.Properties(content_type="application/json", message_type="rank", message_id=job_id,
                                          priority=priority, delivery_mode=2)  # fmt: skip
            await underlay.basic_publish(b"{}", exchange="jobs", routing_key=queue, properties=properties)


@pytest.mark.parametrize("case", list(CASES))
async def test_a_worker_takes_a_quorum_job_queue_in_the_same_order_on_the_broker_and_in_the_double(
    broker: BrokerSettings, tmp_path: Path, case: str
) -> None:
    topology = tmp_path / "t.toml"
    topology.write_text(TOPOLOGY)
    await apply_topology(topology, broker)
    messages = CASES[case]
    real: list[str] = []
    app = rank_app(topology, broker.url, real)
    await publish(broker, messages)  # all waiting before the worker's first delivery
    async with running_worker(app, broker, queues=("qq",)) as (_, rec):
        await rec.wait_for(lambda o: len(o) >= len(messages), timeout=30)
    await app.close()
    assert sorted(real) == sorted(job_id for job_id, _ in messages)

    version = broker_version(broker)
    double: list[str] = []
    double_app = rank_app(topology, None, double)
    async with TestBroker(double_app, broker_version=version) as memory:
        for job_id, priority in messages:
            await memory.publish_raw("jobs", "qq", b"{}", type="rank", message_id=job_id, priority=priority)
        await memory.drain()
    assert double == real, f"RabbitMQ {'.'.join(map(str, version))}"


#: Steps on one queue: publish messages, take N (acked), hold N (unacked), hand back the held one at that index.
Step = tuple[str, Messages | int]
STEPS: dict[str, list[Step]] = {
    # 4.0's count of three runs on over the queue's life: one take before shifts the turn
    "turn": [("publish", [("a", 0)]), ("take", 1),
             ("publish", run("n", 4, 0) + run("h", 4, 9)), ("take", 8)],
    # what came back leaves first, before higher priorities (a classic priority queue would not)
    "requeue": [("publish", [("low", 0)]), ("hold", 1), ("publish", [("high", 9), ("top", 31), ("zero", 0)]),
                ("back", 0), ("take", 4)],
    "two-back": [("publish", [("a", 0), ("b", 1)]), ("hold", 1), ("hold", 1),
                 ("publish", [("high", 9)]), ("back", 0), ("back", 0), ("take", 3)],
    # handed back in the other order than taken (a classic queue puts each back where it was)
    "back-reversed": [("publish", [("a", 0), ("b", 0), ("c", 0)]), ("hold", 1), ("hold", 1),
                      ("back", 1), ("back", 0), ("take", 3)],
}  # fmt: skip


async def on_the_broker(broker: BrokerSettings, steps: list[Step], queue_name: str) -> list[str]:
    taken: list[str] = []
    held: list[aio_pika.abc.AbstractIncomingMessage] = []
    async with raw_channel(broker) as ch:
        queue = await ch.get_queue(queue_name, ensure=False)
        for what, arg in steps:
            if what == "publish":
                assert isinstance(arg, list)
                await publish(broker, arg, queue_name)
            elif what == "back":
                await held.pop(int(arg)).nack(requeue=True)  # type: ignore[arg-type]
                await asyncio.sleep(0.2)  # the nack is not confirmed: let the queue take it back
            else:
                for _ in range(int(arg)):  # type: ignore[arg-type]
                    msg = await queue.get(fail=True, timeout=5)
                    taken.append(msg.message_id or "")
                    if what == "take":
                        await msg.ack()
                    else:
                        held.append(msg)
    return taken


async def on_the_double(memory: TestBroker, steps: list[Step], queue: str) -> list[str]:
    taken: list[str] = []
    held: list[MemoryDelivery] = []
    for what, arg in steps:
        if what == "publish":
            assert isinstance(arg, list)
            for job_id, priority in arg:
                await memory.publish_raw("jobs", queue, b"{}", type="rank", message_id=job_id, priority=priority)
        elif what == "back":
            await held.pop(int(arg)).requeue()  # type: ignore[arg-type]
        else:
            for _ in range(int(arg)):  # type: ignore[arg-type]
                delivery = MemoryDelivery.take(memory.memory, queue)
                assert delivery is not None
                taken.append(delivery.message_id or "")
                if what == "take":
                    await delivery.ack()
                else:
                    held.append(delivery)
    return taken


@pytest.mark.parametrize("queue", ["qq", "cq", "pq"], ids=["quorum", "classic", "classic-priority"])
@pytest.mark.parametrize("case", list(STEPS))
async def test_a_queue_hands_back_and_turns_as_the_broker_does(
    broker: BrokerSettings, tmp_path: Path, case: str, queue: str
) -> None:
    topology = tmp_path / "t.toml"
    topology.write_text(TOPOLOGY)
    await apply_topology(topology, broker)
    real = await on_the_broker(broker, STEPS[case], queue)
    version = broker_version(broker)
    async with TestBroker(rank_app(topology, None, []), broker_version=version) as memory:
        double = await on_the_double(memory, STEPS[case], queue)
    assert double == real, f"RabbitMQ {'.'.join(map(str, version))}"
