"""Many enqueues at once on one App: those that find the connection's write queue full wait their turn.

aiormq's connection has a write queue of 10 frames; ``asyncio.gather`` of 2,000 enqueues
(the README's batched enqueue) fills it at once. A publish that finds it full must not be
queued behind a close it could cross (``wire/publish.py`` ``heard_close``), so it waits for
room itself. Waiting is in turn: the publish first in line is woken when the writer has taken
the queue's frames, the others sleep behind it. Before, every waiting publish polled every
millisecond: about 15 loop timers per publish for 2,000 gathered (150,000 for 10,000), the
CPU the batched enqueue of ``bench/`` lost against raw aio-pika (0.73x there).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from amqpjobs.wire.publish import ConfirmedPublisher
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import applied_app, drain

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]

TOPOLOGY = """
[[exchange]]
name = "jobs"

[[job_queue]]
name = "work"
exchange = "jobs"
"""
N = 2_000


async def test_gathered_enqueues_wait_for_room_in_turn_not_by_polling(broker: BrokerSettings, tmp_path: Path) -> None:
    app = await applied_app(broker, tmp_path, TOPOLOGY, "room")
    app.job("one", queue="work")(lambda p, c: None)
    await app.enqueue("one", {"i": -1}, job_id="warm-up")  # connection, channel and exchange check done
    loop = asyncio.get_running_loop()
    timers = 0
    call_at = loop.call_at

    def counting_call_at(when: float, callback: Any, *args: Any, context: Any = None) -> asyncio.TimerHandle:
        nonlocal timers
        timers += 1
        return call_at(when, callback, *args, context=context)

    loop.call_at = counting_call_at  # type: ignore[method-assign,assignment]
    try:
        await asyncio.gather(*(app.enqueue("one", {"i": i}, job_id=f"j{i}") for i in range(N)))
    finally:
        del loop.call_at  # the instance attribute: the class's method again
        await app.close()
    stored = [str(m.message_id) for m in await drain(broker, "work")]
    assert len(stored) == N + 1
    assert sorted(stored) == sorted(["warm-up", *(f"j{i}" for i in range(N))])
    # aiormq arms one timer per publish (its confirm timeout); waiting for room adds at most a few per batch
    assert timers < 1.5 * N, f"{timers} loop timers for {N} publishes: waiting publishes poll"


async def test_connect_leaves_nothing_for_the_first_enqueue_to_wait_for(
    broker: BrokerSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``App.connect()`` opens the channel, checks the exchanges, reads the alarms: the first enqueues wait for none.

    Before, the first enqueue after ``connect()`` waited for both (about 30 ms here), and every
    enqueue made meanwhile waited behind it: the worst latencies of bench/ section 5.
    """
    from amqpjobs.runtime import backpressure
    from amqpjobs.wire import exchange_checks

    two = TOPOLOGY + '\n[[exchange]]\nname = "jobs2"\n\n[[job_queue]]\nname = "other"\nexchange = "jobs2"\n'
    checked: list[str] = []
    reads: list[str] = []
    exchange_exists = exchange_checks.exchange_exists  # type: ignore[attr-defined]
    read = backpressure.EnqueueGate._read

    async def counting_exists(connection: Any, name: str) -> bool:
        checked.append(name)
        return await exchange_exists(connection, name)

    async def counting_read(self: Any, question: Any, otherwise: Any) -> Any:
        reads.append(question.__name__)
        return await read(self, question, otherwise)

    monkeypatch.setattr(exchange_checks, "exchange_exists", counting_exists)
    monkeypatch.setattr(backpressure.EnqueueGate, "_read", counting_read)
    app = await applied_app(broker, tmp_path, two, "ready")
    app.job("one", queue="work")(lambda p, c: None)
    app.job("two", queue="other")(lambda p, c: None)
    app.job("three", queue="work")(lambda p, c: None)
    app.job("ghost", queue="undeclared")(lambda p, c: None)  # its enqueues fail; the others' exchanges are checked
    try:
        await app.connect()
        assert sorted(checked) == ["jobs", "jobs2"]
        assert reads == ["_management_alarms"]
        publisher = app._publisher
        assert isinstance(publisher, ConfirmedPublisher)
        assert publisher._channel is not None  # the publishing channel is open
        assert not publisher._channel.is_closed
        await asyncio.gather(app.enqueue("one", {}, job_id="a"), app.enqueue("two", {}, job_id="b"))
        assert sorted(checked) == ["jobs", "jobs2"]  # nothing more checked
        assert reads == ["_management_alarms"]  # nor read
    finally:
        await app.close()
    assert [str(m.message_id) for m in await drain(broker, "work")] == ["a"]
    assert [str(m.message_id) for m in await drain(broker, "other")] == ["b"]


async def test_closing_while_the_alarms_are_read_ahead_leaves_no_socket_open(broker: BrokerSettings, tmp_path: Path):
    """An enqueue that started a read ahead of the alarms, then ``App.close()`` at once: no socket is left open.

    ``App.close()`` waits for the read under way (its thread uses a management API client)
    before closing the clients. (Written after an unclosed socket to the management port was
    seen once in a run of the integration tests; this case did not reproduce it without the wait.)
    """
    import gc
    import warnings

    app = await applied_app(broker, tmp_path, TOPOLOGY, "close")
    app.job("one", queue="work")(lambda p, c: None)
    await app.connect()  # alarms read
    await asyncio.sleep(0.6)  # older than half a second: the next enqueue reads them again in the background
    await app.enqueue("one", {}, job_id="a")
    await app.close()
    await asyncio.sleep(2.5)  # the read's thread has ended (its client's timeout is 2 s)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gc.collect()
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []
    assert [str(m.message_id) for m in await drain(broker, "work")] == ["a"]


async def test_the_alarm_read_ahead_begins_once_the_enqueue_that_found_it_due_is_confirmed(
    broker: BrokerSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The read ahead's thread must not compete with the publish that found the alarms half a second old.

    The read (a management API request in a thread: about 0.7 ms of client CPU on the CI
    machine) took the GIL while that enqueue wrote and waited for its confirm, so one enqueue
    every half second of a steady stream was late (bench/ section 5, p99). Now the read
    begins after that enqueue's publish is answered; the next enqueue reads again only when
    the read is due once more.
    """
    app = await applied_app(broker, tmp_path, TOPOLOGY, "ahead")
    app.job("one", queue="work")(lambda p, c: None)
    await app.connect()  # alarms read
    assert app._gate is not None
    assert app._publisher is not None
    events: list[str] = []
    read_alarms, publish = app._gate._management_alarms, app._publisher.publish

    def reading() -> list[str]:
        events.append("read")
        return read_alarms()

    async def publishing(*args: Any, **kwargs: Any) -> None:
        events.append("publish")
        await publish(*args, **kwargs)
        events.append("confirmed")

    monkeypatch.setattr(app._gate, "_management_alarms", reading)
    monkeypatch.setattr(app._publisher, "publish", publishing)
    try:
        await app.enqueue("one", {}, job_id="a")  # alarms fresh: no read
        await asyncio.sleep(0.6)  # older than half a second: the next enqueue reads them again in the background
        await app.enqueue("one", {}, job_id="b")
        for _ in range(100):  # the read's thread has run
            if len(events) == 5:
                break
            await asyncio.sleep(0.02)
        await app.enqueue("one", {}, job_id="c")  # read just now: no read
        await asyncio.sleep(0.1)
        assert events == ["publish", "confirmed", "publish", "confirmed", "read", "publish", "confirmed"]
    finally:
        await app.close()
    assert [str(m.message_id) for m in await drain(broker, "work")] == ["a", "b", "c"]
