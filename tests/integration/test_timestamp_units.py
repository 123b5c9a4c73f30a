"""An AMQP ``timestamp`` (the property, or a header of type ``T``) in any unit reaches the handler as that time.

Publishers put ``Date.now()`` (ms), Go's ``UnixMicro`` (µs) or ``time.time_ns()`` (ns) in the
``timestamp`` property or a ``T`` header. Before: the decoding of the frame read only seconds and
milliseconds (pamqp's rule), so µs and ns decoded to None, and ``ctx.enqueued_at`` fell back
(to the worker's clock) while ``status`` and the ``max_age`` gate read the same message's age
off the management API by the one rule (:func:`amqpjobs.jobs.timestamps.epoch_seconds`).
Now the frame's decoding uses that rule too. The bytes go through the broker: the 8 bytes the
broker delivers are what the test crafted, not what pamqp would write.
"""

from __future__ import annotations

import asyncio
import struct
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aio_pika
import pytest
from pamqp import encode

from amqpjobs import JobContext
from amqpjobs.errors import QueueFullError
from amqpjobs.runtime.app import App
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.runtime.status import collect
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import applied_app, header_runs, note, raw_channel
from tests.integration.worker_env import running_worker
from tests.topologies import work_topology

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]  # the client's decoding, the one rule

TOPOLOGY = work_topology()


def typed(text: str, queue_type: str) -> str:
    """Topology ``text`` with each job queue of ``queue_type``."""
    return text.replace('exchange = "jobs"\n', f'exchange = "jobs"\ntype = "{queue_type}"\n')


@pytest.fixture(params=["classic", "quorum"])
def queue_type(request: pytest.FixtureRequest) -> str:
    """The job queues' type: the property's 8 bytes go through a quorum queue's log as through a classic queue."""
    return str(request.param)


WHEN = "2025-11-30T09:00:00.123456+00:00"
#: Sent raw 64-bit timestamp -> the ctx.enqueued_at expected.
SENT: dict[str, tuple[int, str | None]] = {
    "zero": (0, None),  # never set: no time (the handler's enqueued_at is None), not 1970
    "s": (1_764_493_200, "2025-11-30T09:00:00+00:00"),
    "ms": (1_764_493_200_123, "2025-11-30T09:00:00.123000+00:00"),
    "us": (1_764_493_200_123_456, WHEN),  # Go's UnixMicro
    "ns": (1_764_493_200_123_456_789, "2025-11-30T09:00:00.123457+00:00"),  # time.time_ns(): to the nearest µs
    # decoded seconds past 2106 (above 2**32 - 1): before, the property was read as seconds twice, so as ms (1970)
    "ms-2200": (7_258_118_400_000, "2200-01-01T00:00:00+00:00"),
    "ns-2262": (2**63 - 1, "2262-04-11T23:47:16.854776+00:00"),
}


class Raw(datetime):
    """A datetime pamqp writes as the raw 64-bit integer ``raw`` (any unit), as a foreign publisher does."""

    raw: int


def _raw(value: int) -> Raw:
    out = Raw(2000, 1, 1, tzinfo=UTC)
    out.raw = value
    return out


@pytest.fixture
def raw_timestamps(monkeypatch: pytest.MonkeyPatch) -> None:
    original = encode.timestamp

    def timestamp(value: Any) -> bytes:
        return struct.pack(">Q", value.raw) if isinstance(value, Raw) else original(value)

    monkeypatch.setattr(encode, "timestamp", timestamp)
    if "timestamp" in getattr(encode, "METHODS", {}):
        monkeypatch.setitem(encode.METHODS, "timestamp", timestamp)


async def _publish(broker: BrokerSettings, messages: list[aio_pika.Message]) -> None:
    async with raw_channel(broker) as ch:
        exchange = await ch.get_exchange("jobs")
        for message in messages:
            await exchange.publish(message, routing_key="work", mandatory=True)


@pytest.mark.timeout(60)
async def test_a_timestamp_in_any_unit_is_the_handlers_enqueue_time(
    broker: BrokerSettings, tmp_path: Path, raw_timestamps: None, queue_type: str
) -> None:
    messages = [note(f"property-{unit}", timestamp=_raw(raw)) for unit, (raw, _) in SENT.items()]
    messages += [  # a T header (the property says 2033: the header wins)
        note(f"header-{unit}", timestamp=datetime.fromtimestamp(2_000_000_000, UTC),
             headers={"amqpjobs-enqueued-at": _raw(raw)})
        for unit, (raw, _) in SENT.items()
    ]  # fmt: skip
    seen = await header_runs(
        broker,
        tmp_path,
        messages,
        lambda ctx: None if ctx.enqueued_at is None else ctx.enqueued_at.isoformat(),
        topology=typed(TOPOLOGY, queue_type),
    )
    expected = {f"{kind}-{unit}": when for kind in ("property", "header") for unit, (_, when) in SENT.items()}
    expected["header-zero"] = "2033-05-18T03:33:20+00:00"  # the property, as for any header that is no time
    assert seen == expected


@pytest.mark.timeout(60)
async def test_status_ages_a_head_in_microseconds_as_the_worker_reads_it(
    broker: BrokerSettings, tmp_path: Path, raw_timestamps: None
) -> None:
    app = await applied_app(broker, tmp_path, TOPOLOGY, "app")
    await app.close()
    ten_minutes_ago = int((datetime.now(UTC).timestamp() - 600) * 1_000_000)
    await _publish(broker, [note("old", timestamp=_raw(ten_minutes_ago))])
    for _ in range(100):  # the management API's head_message_timestamp lags a statistics interval
        [row] = await collect(broker, names=["work"])
        work = row.work[0]
        if work.oldest_age is not None:
            break
        await asyncio.sleep(0.1)
    assert work.oldest_age is not None
    assert 595 < work.oldest_age < 660


@pytest.mark.timeout(60)
async def test_status_max_age_says_it_cant_judge_a_quorum_work_queue_whose_head_has_no_age(
    broker: BrokerSettings, tmp_path: Path, raw_timestamps: None
) -> None:
    """RabbitMQ reports no head timestamp for quorum queues (3.10 here): ``--max-age`` says so, not nothing."""
    app = await applied_app(broker, tmp_path, typed(TOPOLOGY, "quorum"), "app")
    await app.close()
    ten_minutes_ago = int((datetime.now(UTC).timestamp() - 600) * 1_000_000)
    await _publish(broker, [note("old", timestamp=_raw(ten_minutes_ago))])
    with ManagementClient(broker) as mgmt:
        for _ in range(150):  # the API's figures lag a statistics interval: wait until it lists the message
            doc = mgmt.queue(broker.vhost, "work") or {}
            if doc.get("messages_ready") == 1:
                break
            await asyncio.sleep(0.1)
    assert doc.get("messages_ready") == 1, doc
    assert doc.get("head_message_timestamp") is None, doc  # the broker's fact
    [row] = await collect(broker, names=["work"], max_age=60)
    assert (row.work[0].ready, row.work[0].oldest_age) == (1, None)
    assert not [p for p in row.problems if "oldest" in p], row.problems
    # before: no problem and no note: 'amqpjobs status --max-age 60s' read a 10-minute-old quorum head as fine
    assert [n for n in row.notes if "max-age" in n] == [
        "--max-age can't judge work: 1 ready, no known age (quorum queues report no head timestamp; a classic "
        "head may carry none, or the stats lag ~5 s)"
    ], row.notes


AGED = """
[[job_queue]]
name = "aged"
exchange = "jobs"
max_age = "60s"
"""


@pytest.mark.timeout(60)
async def test_the_max_age_gate_ages_a_head_in_nanoseconds_by_the_same_rule(
    broker: BrokerSettings, tmp_path: Path, raw_timestamps: None
) -> None:
    path = tmp_path / "aged.toml"  # classic only: max_age on a quorum job queue is refused at load (test_loader)
    path.write_text(TOPOLOGY + AGED)
    await apply_topology(path, broker)
    app = App("aged", topology=path, url=broker.url, queue_full_wait=0)

    @app.job("late", queue="aged")
    async def late(payload: dict[str, Any], ctx: JobContext) -> None:  # never run: no worker
        raise AssertionError("no worker runs here")

    ten_minutes_ago = int((datetime.now(UTC).timestamp() - 600) * 1_000_000_000)
    async with raw_channel(broker) as ch:
        exchange = await ch.get_exchange("jobs")
        await exchange.publish(note("old", timestamp=_raw(ten_minutes_ago)), routing_key="aged", mandatory=True)
    refused: QueueFullError | None = None
    await app.connect(broker)  # the gate asks this node's management API, not the one derived from the URL
    try:
        for attempt in range(150):  # the API's head_message_timestamp lags a statistics interval (more under load)
            try:
                await app.enqueue("late", {}, job_id=f"late-{attempt}")
            except QueueFullError as exc:
                refused = exc
                break
            await asyncio.sleep(0.2)
    finally:
        await app.close()
    assert refused is not None, "max_age never refused"
    age = float(refused.limit.split("oldest ready message ")[1].split("s old")[0])
    assert 595 < age < 660, refused.limit


@pytest.mark.timeout(60)
async def test_a_retry_copy_keeps_a_first_enqueue_past_2106(
    broker: BrokerSettings, tmp_path: Path, raw_timestamps: None
) -> None:
    """The copy builders read the received ``timestamp`` (decoded seconds) once: the retry's ``enqueued_at`` is 2262.

    Before, the retry copy's ``amqpjobs-enqueued-at`` was written from the seconds read again as
    milliseconds: "1970-04-17T18:02:52.036854+00:00"."""
    app = await applied_app(broker, tmp_path, TOPOLOGY, "app")
    seen: list[tuple[int, str | None]] = []

    @app.job("note", queue="work")
    async def fails_once(payload: dict[str, Any], ctx: JobContext) -> None:
        seen.append((ctx.attempt, None if ctx.enqueued_at is None else ctx.enqueued_at.isoformat()))
        if ctx.attempt == 1:
            raise RuntimeError("once")

    await _publish(broker, [note("late", timestamp=_raw(2**63 - 1))])
    try:
        async with running_worker(app, broker):
            for _ in range(200):
                if len(seen) == 2:
                    break
                await asyncio.sleep(0.05)
    finally:
        await app.close()
    assert seen == [(1, SENT["ns-2262"][1]), (2, "2262-04-11T23:47:16.854000+00:00")]  # the header: ms (iso_utc)
