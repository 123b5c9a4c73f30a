"""Issue 22: outcome events at full speed, on a connection of their own (amqpjobs.wire.events)."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from amqpjobs import App, JobContext
from amqpjobs.topology.naming import EVENTS_EXCHANGE
from amqpjobs.wire.connection import connect
from amqpjobs.wire.events import MAX_PENDING, subscribe_outcomes
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import depth, until
from tests.integration.test_operator_events import decoded
from tests.integration.test_reconnect import connections
from tests.integration.test_topology_holes import delete
from tests.integration.worker_env import make_app, running_worker

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]


async def fill(app: App, first: int, n: int) -> None:
    """Enqueue jobs ``b-<first>`` .. ``b-<first + n - 1>`` of job ``noop``, 200 at a time."""
    for start in range(first, first + n, 200):
        ids = range(start, min(start + 200, first + n))
        await asyncio.gather(*(app.enqueue("noop", {"n": i}, job_id=f"b-{i}") for i in ids))


def noop_app(app: App) -> App:
    @app.job("noop", queue="work")
    async def noop(payload: dict[str, Any], ctx: JobContext) -> None:
        return None

    return app


async def test_a_burst_of_3000_jobs_at_16_slots_yields_one_event_per_job_in_few_messages(
    broker: BrokerSettings, tmp_path: Path
):
    """Every job's event arrives once; the events of a write share one message per routing key (version 2)."""
    app = noop_app(await make_app(broker, tmp_path))
    n = 3000
    assert n > 2 * MAX_PENDING  # more than the queue of events may hold: the sender must keep up
    await fill(app, 0, n)
    assert await depth(broker, "work") == n
    listener = await connect(broker, name="listener")
    heard: list[bytes] = []
    watch = await subscribe_outcomes(listener, heard.append, ["work.*"])
    try:
        async with running_worker(app, broker, concurrency=16) as (worker, rec):
            await rec.wait_for(lambda o: len(o) >= n, timeout=60)
            events = worker._events
            assert events is not None
            await until(lambda: events.published + events.dropped >= n)
            with contextlib.suppress(AssertionError):
                await until(lambda: sum(len(decoded(body)) for body in heard) >= n)
            await asyncio.sleep(0.2)  # any event beyond one per job would arrive now
            assert (events.published, events.dropped) == (n, 0)
    finally:
        await watch.close()
        await listener.close()
        await app.close()
    messages = [decoded(body) for body in heard]
    got = [e for events_of_one in messages for e in events_of_one]
    assert Counter(e.id for e in got) == Counter(f"b-{i}" for i in range(n))
    assert {(e.outcome, e.attempt, e.queue) for e in got} == {("succeeded", 1, "work")}
    # one message per routing key and write: a busy worker's events share messages (version 1: one each, 3,000)
    assert len(messages) <= n // 3, f"{len(messages)} messages for {n} events"


async def test_deleting_the_events_exchange_under_a_busy_worker_costs_no_job_and_no_job_connection(
    broker: BrokerSettings, tmp_path: Path
):
    app = noop_app(await make_app(broker, tmp_path))
    async with running_worker(app, broker, concurrency=16) as (worker, rec):
        lost: list[str] = []
        assert worker._events is not None
        own = {"consuming": worker._connection, "publishing": worker._publishing, "events": worker._events._connection}
        for what, conn in own.items():
            assert conn is not None
            conn.reconnect_callbacks.add(lambda *_, what=what: lost.append(what))
        names = ("test-worker", "test-worker-publisher")
        await until(lambda: all(connections(broker, name) for name in names), timeout=15)  # the API lists them late
        before = {name: [c["name"] for c in connections(broker, name)] for name in names}
        filling = asyncio.create_task(fill(app, 0, 2000))  # the worker runs them as they come
        await rec.wait_for(lambda o: len(o) >= 300)
        # while events go out back to back (in a thread: the worker's loop keeps running)
        await asyncio.to_thread(delete, broker, "exchanges", EVENTS_EXCHANGE)
        await filling
        await rec.wait_for(lambda o: len(o) >= 2000, timeout=60)
        events = worker._events
        assert events is not None
        await until(lambda: events.published + events.dropped == 2000)
        assert events.dropped > 0  # events went off
        await make_app(broker, tmp_path)  # topology apply declares the exchange again
        listener = await connect(broker, name="listener")
        heard: list[bytes] = []
        watch = await subscribe_outcomes(listener, heard.append, ["work.*"])
        events.recheck_after = 0.2
        for i in range(2000, 2030):
            await fill(app, i, 1)
            await asyncio.sleep(0.05)
        await rec.wait_for(lambda o: len(o) >= 2030)
        # events came back on: wait for the last job's (it goes out a linger and a round trip after its outcome)
        await until(lambda: any(e.id == "b-2029" for body in heard for e in decoded(body)))
        await watch.close()
        await listener.close()
        after = {name: [c["name"] for c in connections(broker, name)] for name in names}
        outcomes = list(rec.outcomes)
    await app.close()
    assert lost == []  # neither job connection was closed; nor the events' (the sender never crosses the close)
    assert after == before
    assert Counter(o.job_id for o in outcomes) == Counter(f"b-{i}" for i in range(2030))  # each job once
    assert all(o.acked and o.attempt == 1 for o in outcomes)  # no redelivery
    ids = [e.id for body in heard for e in decoded(body)]  # a message can hold more than one event
    assert ids == [f"b-{i}" for i in range(2030 - len(ids), 2030)]  # from when they came back on, in order, once
    assert await depth(broker, "work") == 0
