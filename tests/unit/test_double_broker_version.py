"""``TestBroker(app, broker_version=...)``: the double refuses what that RabbitMQ version would.

Without a version the double takes everything the newest broker takes (a priority for a
quorum job queue included); given one, ``enqueue`` and the worker's start apply the same
version rules as on a broker of that version (``jobs/enqueue_args.check_broker_priority``,
``runtime/broker_rules.check_layouts``), with the same messages.
"""

from __future__ import annotations

import asyncio
import json
import threading
from datetime import datetime
from pathlib import Path

import pytest

from amqpjobs import App, JobContext
from amqpjobs.errors import ConfigurationError
from amqpjobs.testing import TestBroker
from amqpjobs.topology.loader import load_topology

pytestmark = pytest.mark.asyncio

TOPOLOGY = """
[[exchange]]
name = "jobs"

[[job_queue]]
name = "money"
exchange = "jobs"
type = "quorum"
retry_tiers = ["1s"]
"""

STRICT = (
    TOPOLOGY
    + """
[[job_queue]]
name = "ranked"
exchange = "jobs"
type = "quorum"
max_priority = 9
retry_tiers = ["1s"]
"""
)


def make_app(tmp_path: Path, topology: str = TOPOLOGY) -> App:
    path = tmp_path / "t.toml"
    path.write_text(topology)
    app = App("v", topology=load_topology(path).topology)

    @app.job("pay", queue="money")
    async def pay(payload: dict[str, int], ctx: JobContext) -> None:
        return None

    return app


async def test_without_a_version_the_double_takes_a_quorum_priority_as_the_newest_broker(tmp_path: Path) -> None:
    app = make_app(tmp_path)
    async with TestBroker(app) as broker:
        await app.enqueue("pay", {"n": 1}, priority=7)
        assert [p.kind for p in await broker.drain()] == ["succeeded"]


@pytest.mark.parametrize("version", [(3, 10, 0), (3, 13, 7)])
async def test_on_3x_a_quorum_priority_is_refused_as_enqueue_on_that_broker_refuses_it(
    tmp_path: Path, version: tuple[int, ...]
) -> None:
    app = make_app(tmp_path)
    async with TestBroker(app, broker_version=version) as broker:
        with pytest.raises(ConfigurationError, match=r"job 'pay': priority 7 can't be kept: job queue 'money'") as err:
            await app.enqueue("pay", {"n": 1}, priority=7)
        assert ".".join(map(str, version)) in str(err.value)
        await app.enqueue("pay", {"n": 2})  # no priority: taken
        assert [p.payload for p in await broker.drain()] == [{"n": 2}]  # nothing of the refused one was sent


async def test_on_4_0_a_quorum_priority_is_taken(tmp_path: Path) -> None:
    app = make_app(tmp_path)
    async with TestBroker(app, broker_version=(4, 0, 5)) as broker:
        await app.enqueue("pay", {"n": 1}, priority=7)
        assert [p.kind for p in await broker.drain()] == ["succeeded"]


async def test_a_sync_publisher_under_the_double_refuses_the_same(tmp_path: Path) -> None:
    app = make_app(tmp_path)
    errors: list[BaseException] = []

    async with TestBroker(app, broker_version=(3, 10, 0)):

        def call() -> None:
            with app.sync_publisher() as sync:
                try:
                    sync.enqueue("pay", {"n": 1}, priority=7)
                except BaseException as exc:  # kept for the assertion
                    errors.append(exc)

        thread = threading.Thread(target=call)
        thread.start()
        while thread.is_alive():  # the sync publisher's calls run on this loop: keep it turning
            await asyncio.sleep(0.01)
    assert [type(e) for e in errors] == [ConfigurationError]
    assert "priority 7 can't be kept" in str(errors[0])


async def test_a_worker_start_refuses_strict_quorum_priorities_before_4_3(tmp_path: Path) -> None:
    app = make_app(tmp_path, STRICT)

    @app.job("rank", queue="ranked")
    async def rank(payload: dict[str, int], ctx: JobContext) -> None:
        return None

    with pytest.raises(
        ConfigurationError, match=r"job queue\(s\) ranked: max_priority: .*need RabbitMQ 4.3\+ \(connected: 4.0.5\)"
    ):
        async with TestBroker(app, broker_version=(4, 0, 5)):
            pass
    async with TestBroker(app, broker_version=(4, 3, 0)) as broker:  # the app is free again, and 4.3 takes it
        await app.enqueue("rank", {"n": 1}, priority=9)
        assert [p.kind for p in await broker.drain()] == ["succeeded"]


@pytest.mark.parametrize("version", [(), ("3", 10), (3, -1), 3.10, (True, 0)])
async def test_a_version_that_is_no_version_is_refused(tmp_path: Path, version: object) -> None:
    with pytest.raises(ConfigurationError, match="broker_version"):
        TestBroker(make_app(tmp_path), broker_version=version)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"frame_max": -1}, r"TestBroker\(frame_max=-1\): a frame_max is 0 \(no limit\) or 4096-4294967295 bytes"),
        ({"frame_max": 100}, r"TestBroker\(frame_max=100\)"),
        ({"frame_max": True}, r"TestBroker\(frame_max=True\)"),
        ({"frame_max": 2**32}, r"TestBroker\(frame_max=4294967296\)"),
        ({"max_deliveries": 0}, r"TestBroker\(max_deliveries=0\): a whole number of at least 1"),
        ({"max_deliveries": -5}, r"TestBroker\(max_deliveries=-5\)"),
        ({"max_deliveries": 1.5}, r"TestBroker\(max_deliveries=1.5\)"),
        # helper-231: these raised AttributeError, or were taken (start=0 read as "now", version 2)
        ({"start": "2026-01-01"}, r"TestBroker\(start='2026-01-01'\): an aware datetime, e.g. datetime\(2026, 1, 1, "),
        ({"start": 0}, r"TestBroker\(start=0\): an aware datetime"),
        ({"start": datetime(2026, 1, 1)}, r"TestBroker\(start=datetime.datetime\(2026, 1, 1, 0, 0\)\): an aware"),
        (
            {"ledger": "x"},
            r"TestBroker\(ledger=...\) must be an idempotency ledger \(got a str\): give SqliteLedger",
        ),
        ({"broker_version": (2,)}, r"TestBroker\(broker_version=\(2,\)\): RabbitMQ 3 or later"),
    ],
)
async def test_a_frame_max_or_max_deliveries_no_broker_could_have_is_refused(
    tmp_path: Path, kwargs: dict[str, object], words: str
) -> None:
    with pytest.raises(ConfigurationError, match=words):
        TestBroker(make_app(tmp_path), **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("frame_max", [0, 4096, 131072, 2**32 - 1])
async def test_the_frame_max_a_broker_can_have_is_taken(tmp_path: Path, frame_max: int) -> None:
    TestBroker(make_app(tmp_path), frame_max=frame_max)


ORDERED = (
    TOPOLOGY
    + """
[[job_queue]]
name = "strict"
exchange = "jobs"
type = "quorum"
max_priority = 9
retry_tiers = ["1s"]
"""
)


async def order_of(tmp_path: Path, queue: str, version: tuple[int, ...] | None) -> list[str]:
    app = make_app(tmp_path, ORDERED)
    order: list[str] = []

    @app.job("rank", queue=queue)
    async def rank(payload: dict[str, str], ctx: JobContext) -> None:
        order.append(payload["name"])

    async with TestBroker(app, broker_version=version) as broker:
        for name, priority in [("two", 2), ("none", None), ("top", 31), ("five", 5), ("huge", 200), ("four", 4)]:
            if queue == "strict" and priority is not None and priority > 9:
                priority = 9  # enqueue checks max_priority
            if name == "huge" and version is not None and version >= (4, 3):
                continue  # enqueue on 4.3 refuses a priority over 31
            await app.enqueue("rank", {"name": name}, priority=priority)
        await broker.drain()
    return order


@pytest.mark.parametrize("version", [None, (4, 3, 0)])
async def test_a_quorum_job_queue_delivers_by_strict_priority_0_31_as_rabbitmq_4_3(
    tmp_path: Path, version: tuple[int, ...] | None
) -> None:
    # 4.3: strict 0-31, over 31 as 31 (release notes 4.3.0); enqueue sends a job without one as 0
    expected = (
        ["top", "huge", "five", "four", "two", "none"] if version is None else ["top", "five", "four", "two", "none"]
    )
    assert await order_of(tmp_path, "money", version) == expected
    # x-max-priority is ignored by 4.3 quorum queues: the same rule (enqueue caps at max_priority 9)
    assert await order_of(tmp_path, "strict", version) == expected


async def test_on_4_0_a_quorum_job_queue_has_two_levels(tmp_path: Path) -> None:
    # 0-4 normal, 5+ high, FIFO within each; each third take is the older of the two (measured on 4.0.5:
    # tests/integration/test_priority_contract.py), so "two" (the oldest) goes third, not after every high one
    assert await order_of(tmp_path, "money", (4, 0, 5)) == ["top", "five", "two", "huge", "none", "four"]


async def test_on_4_3_a_foreign_message_without_a_priority_counts_as_4(tmp_path: Path) -> None:
    app = make_app(tmp_path)
    async with TestBroker(app) as broker:
        for name, priority in [("three", 3), ("unset", None), ("five", 5)]:
            body = json.dumps({"n": 1}).encode()
            await broker.publish_raw("jobs", "money", body, type="pay", message_id=name, priority=priority)
        assert [p.job_id for p in await broker.drain()] == ["five", "unset", "three"]
