"""The pure parts of enqueue backpressure (issue 25): alarm names, queue bounds in the topology."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError

from amqpjobs import BrokerBlockedError, PublishError, PublishNackedError, QueueFullError
from amqpjobs.topology.bounds import QueueBounds
from amqpjobs.topology.models import Topology
from amqpjobs.wire.alarms import alarm_of


@pytest.mark.parametrize(
    ("reason", "alarm"),
    [("low on memory", "memory"), ("low on disk", "disk"), ("low on memory & disk", "memory & disk"),
     ("", "a resource alarm"), ("something new", "something new")],
)  # fmt: skip
def test_the_alarm_is_read_from_the_blocked_reason(reason: str, alarm: str):
    assert alarm_of(reason) == alarm


def topology(**job_queue: object) -> Topology:
    return Topology.model_validate(
        {"exchanges": [{"name": "jobs"}], "job_queues": [{"name": "work", "exchange": "jobs", **job_queue}]}
    )


def test_bounds_come_from_the_job_queue_with_durations_in_seconds():
    bounds = topology(max_depth=100, max_age="2m", max_length=500).layout("work").bounds
    assert bounds == QueueBounds(max_depth=100, max_age=120.0, max_length=500)
    assert bounds.checked


def test_max_length_counts_as_a_bound_only_where_the_broker_nacks():
    assert topology(max_length=5, overflow="drop-head").layout("work").bounds.max_length is None
    assert topology(max_length=5, type="quorum").layout("work").bounds.max_length == 5
    assert not topology(max_length=5).layout("work").bounds.checked  # the broker checks it, not enqueue


@pytest.mark.parametrize("bad", [{"max_depth": 0}, {"max_depth": "10"}, {"max_age": 0}, {"max_age": "soon"}])
def test_bad_bounds_are_refused(bad: dict[str, object]):
    with pytest.raises(ValidationError):
        topology(**bad)


def test_a_sharded_job_lands_in_the_shard_its_routing_key_names():
    layout = topology(shards=4, max_depth=10).layout("work")
    for i, key in enumerate(layout.shard_routing_keys):
        assert layout.work_queue_for(key) == layout.work_queues[i]
    assert topology().layout("work").work_queue_for("work") == "work"


def test_the_errors_sit_where_callers_catch_them():
    assert issubclass(QueueFullError, PublishNackedError)
    assert issubclass(BrokerBlockedError, PublishError)
    assert not issubclass(BrokerBlockedError, PublishNackedError)
    full = QueueFullError("full", queue="work", limit="max_depth 3 (3 ready)")
    blocked = BrokerBlockedError("blocked", alarm="disk", waited=1.5)
    assert (full.queue, full.limit, blocked.alarm, blocked.waited) == ("work", "max_depth 3 (3 ready)", "disk", 1.5)


@pytest.mark.parametrize("option", ["blocked_timeout", "queue_full_wait"])
@pytest.mark.parametrize(
    ("value", "says"),
    [(-1, "-1 must be 0"), (float("nan"), "nan must be 0"), (float("inf"), "inf must be 0"),
     ("soon", "'soon' is not a duration"), ("-2s", "'-2s' must be 0 or a positive"),
     (True, "True is not a duration")],
)  # fmt: skip
def test_bad_wait_options_are_refused_naming_the_argument(option: str, value: object, says: str):
    from amqpjobs import App, ConfigurationError

    with pytest.raises(ConfigurationError) as err:
        App("t", **{option: value})  # type: ignore[arg-type]
    assert str(err.value).startswith(f"App({option}=...): ")
    assert says in str(err.value)
    assert "0 (refuse at once)" in str(err.value)  # what is allowed


@pytest.mark.parametrize("zero", [0, 0.0, "0", "0s", "0ms"])
def test_zero_wait_means_refuse_at_once(zero: object):
    from amqpjobs import App

    app = App("t", blocked_timeout=zero, queue_full_wait=zero)  # type: ignore[arg-type]
    assert (app.blocked_timeout, app.queue_full_wait) == (0.0, 0.0)
    assert (App("t").blocked_timeout, App("t").queue_full_wait) == (10.0, 0.0)
    assert App("t", queue_full_wait="1m30s").queue_full_wait == 90.0


async def test_enqueues_that_keep_coming_never_wait_for_the_alarm_read(monkeypatch: pytest.MonkeyPatch):
    """A steady stream of enqueues: the alarms are read ahead in the background; none waits for the management API.

    Each enqueue is what ``send()`` does: ``unblocked``, its publish, then ``read_ahead_if_due``
    (the read begins only once the publish is answered). The clock and the read are the test's: a
    read stays under way until the test lets it answer.
    """
    from types import SimpleNamespace

    from amqpjobs.runtime import backpressure
    from amqpjobs.wire.settings import broker_settings

    now = [100.0]
    monkeypatch.setattr(backpressure, "time", SimpleNamespace(monotonic=lambda: now[0]))
    reads: list[asyncio.Future[list[str]]] = []

    async def read(question: object, otherwise: list[str]) -> list[str]:
        reads.append(asyncio.get_running_loop().create_future())
        return await reads[-1]

    settings = broker_settings("amqp://guest:guest@127.0.0.1:1/")
    gate = backpressure.EnqueueGate(settings, blocked_timeout=0.0, full_wait=0.0)
    monkeypatch.setattr(gate, "_read", read)
    connection = SimpleNamespace()  # never told it is blocked
    first = asyncio.ensure_future(gate.unblocked(connection))  # type: ignore[arg-type]
    await asyncio.sleep(0)
    assert len(reads) == 1
    assert not first.done()  # never read: the first enqueue waits for the answer
    reads[0].set_result([])
    await first
    for _ in range(8):  # an enqueue every 0.3 s; each read answers before the next enqueue
        now[0] += 0.3
        before = len(reads)
        await asyncio.wait_for(gate.unblocked(connection), 1.0)  # type: ignore[arg-type]  # no wait for a read
        await asyncio.sleep(0)
        assert len(reads) == before  # its publish not answered yet: no read begun (its thread would compete)
        gate.read_ahead_if_due()  # what send() does once the publish is answered
        await asyncio.sleep(0)  # a read ahead it started is under way
        if reads and not reads[-1].done():
            reads[-1].set_result([])
            await asyncio.sleep(0)
            await asyncio.sleep(0)
    assert 4 <= len(reads) <= 6, len(reads)  # read again about every 0.6 s (each at half a second old, or more)
    gate.read_ahead_if_due()  # nothing due: no read
    await asyncio.sleep(0)
    assert reads[-1].done()
    now[0] += 0.6  # the last figure is now over half a second old: read ahead, and a memory alarm is the answer
    await gate.unblocked(connection)  # type: ignore[arg-type]
    gate.read_ahead_if_due()
    await asyncio.sleep(0)
    assert not reads[-1].done()
    reads[-1].set_result(["memory"])
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    with pytest.raises(BrokerBlockedError, match=r"resource alarm \(memory\)"):
        await gate.unblocked(connection)  # type: ignore[arg-type]
    await gate.aclose()


async def test_an_enqueue_awaits_the_alarm_check_only_when_it_may_wait(monkeypatch: pytest.MonkeyPatch):
    """``send`` skips ``unblocked`` (two coroutines per enqueue) while the alarms read are fresh and none.

    Not otherwise: a figure half a second old (a read ahead is due), an alarm read, or the
    connection told it is blocked each make the enqueue await :meth:`EnqueueGate.unblocked`.
    """
    from types import SimpleNamespace

    from amqpjobs.jobs import envelope
    from amqpjobs.runtime import backpressure
    from amqpjobs.runtime.sending import send
    from amqpjobs.wire.publish import ConfirmedPublisher
    from amqpjobs.wire.settings import broker_settings

    now = [100.0]
    monkeypatch.setattr(backpressure, "time", SimpleNamespace(monotonic=lambda: now[0]))
    answer: list[str] = []

    async def read(question: object, otherwise: list[str]) -> list[str]:
        return list(answer)

    gate = backpressure.EnqueueGate(broker_settings("amqp://guest:guest@127.0.0.1:1/"), 0.0, 0.0)
    monkeypatch.setattr(gate, "_read", read)
    awaited: list[object] = []
    unblocked = gate.unblocked

    async def counting(connection: object) -> None:
        awaited.append(connection)
        await unblocked(connection)  # type: ignore[arg-type]

    monkeypatch.setattr(gate, "unblocked", counting)

    class Sent(ConfirmedPublisher):  # a broker's publisher as send() tells it apart; nothing goes anywhere
        def __init__(self) -> None:
            self.sent: list[str] = []

        async def publish(self, exchange: str, routing_key: str, message: envelope.OutgoingMessage) -> None:
            self.sent.append(routing_key)

    publisher, connection = Sent(), SimpleNamespace()  # a connection never told it is blocked
    layout = topology().layout("work")
    message = envelope.job_message("j", {}, job_id="id-1", now=0.0)

    async def enqueue() -> None:
        await send(publisher, gate, connection, None, layout, "jobs", "work", message, "id-1")  # type: ignore[arg-type]

    await enqueue()  # never read: awaited (it reads)
    assert len(awaited) == 1
    now[0] += 0.4
    await enqueue()  # read 0.4 s ago, no alarm: not awaited
    assert len(awaited) == 1
    assert gate.clear(connection)  # type: ignore[arg-type]
    now[0] += 0.2  # 0.6 s old: a read ahead is due, so unblocked() runs
    await enqueue()
    assert len(awaited) == 2
    await asyncio.sleep(0)  # the read ahead answers: no alarm
    answer.append("memory")  # the next read's answer
    now[0] += 1.1  # too old to use: read (and refused at once, blocked_timeout 0)
    with pytest.raises(BrokerBlockedError):
        await enqueue()
    assert len(awaited) == 3
    assert not gate.clear(connection)  # type: ignore[arg-type]
    assert publisher.sent == ["work"] * 3
    await gate.aclose()
