"""The in-memory double (amqpjobs.testing) runs the worker's per-delivery path and the scheduler's election.

No broker: these run the production decision code against the in-memory wire. The same
scenarios against a real broker are in tests/integration/test_testing_contract.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import decimal
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from amqpjobs import App, JobContext, RetryPolicy
from amqpjobs.errors import UnroutableError
from amqpjobs.jobs.envelope import job_message
from amqpjobs.jobs.outcome import Reject, Retry, RetryLater
from amqpjobs.message import OutgoingMessage
from amqpjobs.runtime.ledger import SqliteLedger
from amqpjobs.testing import TestBroker
from amqpjobs.topology.loader import load_topology

TOPOLOGY = """
[[exchange]]
name = "jobs"
type = "direct"

[[job_queue]]
name = "work"
exchange = "jobs"
retry_tiers = ["1s", "5s", "30s"]

[[job_queue]]
name = "money"
exchange = "jobs"
type = "quorum"
retry_tiers = ["2s"]

[[job_queue]]
name = "tenants"
exchange = "jobs"
shards = 3
retry_tiers = ["1s"]
"""

START = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


class Order(BaseModel):
    order_id: int


def make_app(tmp_path: Path, **kw: object) -> App:
    path = tmp_path / "t.toml"
    path.write_text(TOPOLOGY)
    return App("t", topology=load_topology(path).topology, app_version="9.9", **kw)  # type: ignore[arg-type]


async def test_success_runs_the_handler_once_and_acks(tmp_path: Path) -> None:
    app = make_app(tmp_path)
    seen: list[tuple[int, int, str]] = []

    @app.job("orders.confirm", queue="work", payload=Order)
    async def confirm(order: Order, ctx: JobContext) -> None:
        seen.append((order.order_id, ctx.attempt, ctx.queue))

    async with TestBroker(app, start=START) as broker:
        job_id = await app.enqueue("orders.confirm", {"order_id": 7})
        assert seen == []  # nothing runs before drain
        done = await broker.drain()
    assert seen == [(7, 1, "work")]
    assert [(p.job, p.job_id, p.kind, p.attempt) for p in done] == [("orders.confirm", job_id, "succeeded", 1)]
    assert broker.completed("orders.confirm")[0].payload == {"order_id": 7}
    assert broker.clock.now() == START  # nothing waited
    assert broker.memory.queue("work").messages == []


async def test_retries_go_through_the_tiers_on_the_virtual_clock(tmp_path: Path) -> None:
    app = make_app(tmp_path)
    runs: list[tuple[int, float]] = []

    @app.job("flaky", queue="work", payload=Order)
    async def flaky(order: Order, ctx: JobContext) -> None:
        runs.append((ctx.attempt, broker.clock.seconds))
        if ctx.attempt < 3:
            raise ConnectionError(f"try {ctx.attempt}")

    async with TestBroker(app, start=START) as broker:
        await app.enqueue("flaky", {"order_id": 1})
        started = time.monotonic()
        done = await broker.drain()
        took = time.monotonic() - started
    assert [p.kind for p in done] == ["retried", "retried", "succeeded"]
    t0 = START.timestamp()
    assert runs == [(1, t0), (2, t0 + 1.0), (3, t0 + 6.0)]  # tier 1s, then tier 5s
    decisions = [p.outcome.decision for p in done[:2]]
    assert decisions == [RetryLater(next_attempt=2, tier=0, delay=1.0), RetryLater(next_attempt=3, tier=1, delay=5.0)]
    assert [p.headers.get("amqpjobs-attempt") for p in done] == [1, 2, 3]
    assert done[2].headers["amqpjobs-runs"] == 2
    assert took < 1.0  # no sleeping: 6 virtual seconds


async def test_exhausted_goes_to_quarantine_with_the_workers_evidence(tmp_path: Path) -> None:
    app = make_app(tmp_path)

    @app.job("doomed", queue="work", payload=Order)
    async def doomed(order: Order, ctx: JobContext) -> None:
        raise ValueError(f"bad order {order.order_id}")

    async with TestBroker(app, start=START) as broker:
        job_id = await app.enqueue("doomed", {"order_id": 3})
        done = await broker.drain()
        [q] = broker.quarantine("work")
    assert [p.kind for p in done] == ["retried", "retried", "retried", "quarantined"]
    assert broker.clock.seconds - START.timestamp() == 36.0  # 1s + 5s + 30s
    assert q.reason == "exhausted"
    assert q.payload == {"order_id": 3}
    h = q.headers
    assert (h["amqpjobs-error-type"], h["amqpjobs-error-message"]) == ("ValueError", "bad order 3")
    assert (h["amqpjobs-attempts"], h["amqpjobs-attempt"], h["amqpjobs-runs"]) == (4, 4, 4)
    assert (h["amqpjobs-original-queue"], h["amqpjobs-job-id"], h["amqpjobs-app-version"]) == ("work", job_id, "9.9")
    assert h["amqpjobs-original-exchange"] == "jobs"
    assert "ValueError: bad order 3" in h["amqpjobs-traceback"]
    assert "x-death" not in h


async def test_invalid_payload_unknown_job_and_reject_are_quarantined_at_once(tmp_path: Path) -> None:
    app = make_app(tmp_path)

    @app.job("pay", queue="work", payload=Order)
    async def pay(order: Order, ctx: JobContext) -> None:
        raise Reject("card declined")

    async with TestBroker(app, start=START) as broker:
        raw = job_message("pay", {"order_id": "seven"}, job_id="bad-1", now=time.time())
        await broker.publisher.publish("jobs", "work", raw)
        await broker.publisher.publish("jobs", "work", job_message("nope", {}, job_id="u-1", now=time.time()))
        await app.enqueue("pay", {"order_id": 1}, job_id="r-1")
        await broker.drain()
        found = {m.message_id: m for m in broker.quarantine("work.quarantine")}
    reasons = {k: v.reason for k, v in found.items()}
    assert reasons == {"bad-1": "invalid-payload", "u-1": "unknown-job", "r-1": "rejected"}
    assert found["bad-1"].headers["amqpjobs-error-type"] == "pydantic.ValidationError"
    assert found["u-1"].headers["amqpjobs-error-type"] == "UnknownJob"
    assert found["r-1"].headers["amqpjobs-error-message"] == "card declined"
    assert [found[k].headers["amqpjobs-runs"] for k in ("bad-1", "u-1", "r-1")] == [0, 0, 1]
    assert broker.clock.now() == START


async def test_replay_sends_a_quarantined_job_back_and_it_runs(tmp_path: Path) -> None:
    app = make_app(tmp_path)
    fixed = False

    @app.job("pay", queue="money", payload=Order)
    async def pay(order: Order, ctx: JobContext) -> None:
        if not fixed:
            raise Reject("gateway misconfigured")

    async with TestBroker(app, start=START) as broker:
        await app.enqueue("pay", {"order_id": 5}, job_id="p-5")
        await broker.drain()
        assert [m.reason for m in broker.quarantine("money")] == ["rejected"]
        fixed = True
        assert await broker.replay("money") == 1
        assert broker.quarantine("money") == []
        done = await broker.drain()
    assert [(p.job_id, p.kind, p.attempt) for p in done] == [("p-5", "succeeded", 1)]
    h = done[0].headers
    assert (h["amqpjobs-replay-count"], h["amqpjobs-previous-reason"]) == (1, "rejected")
    assert h["amqpjobs-previous-error-message"] == "gateway misconfigured"
    assert "amqpjobs-reason" not in h


async def test_replay_leaves_a_message_whose_target_queue_does_not_exist_and_moves_the_rest(tmp_path: Path) -> None:
    """As a real replay (tests/integration/test_replay_targets.py): the double lost the held messages instead."""
    app = make_app(tmp_path)

    @app.job("pay", queue="money", payload=Order)
    async def pay(order: Order, ctx: JobContext) -> None:
        raise Reject("gateway misconfigured")

    async with TestBroker(app, start=START) as broker:
        for i in range(3):
            await app.enqueue("pay", {"order_id": i}, job_id=f"p-{i}")
        await broker.drain()
        stored = broker.memory.queue("money.quarantine").messages[1]
        stored.message = dataclasses.replace(
            stored.message, headers={**stored.message.headers, "amqpjobs-original-queue": "gone"}
        )  # another stack's evidence: no such queue
        assert await broker.replay("money") == 2
        assert [m.message_id for m in broker.quarantine("money")] == ["p-1"]
        assert broker.quarantine("money")[0].headers["amqpjobs-original-queue"] == "gone"


async def test_enqueue_from_a_handler_goes_to_the_double_and_runs(tmp_path: Path) -> None:
    app = make_app(tmp_path)
    order: list[str] = []

    @app.job("first", queue="work", payload=Order)
    async def first(o: Order, ctx: JobContext) -> None:
        order.append("first")
        await app.enqueue("second", {"order_id": o.order_id + 1})

    @app.job("second", queue="money", payload=Order)
    async def second(o: Order, ctx: JobContext) -> None:
        order.append(f"second {o.order_id}")

    async with TestBroker(app) as broker:
        await app.enqueue("first", {"order_id": 1})
        await broker.drain()
    assert order == ["first", "second 2"]
    assert app.use_publisher(None) is None  # the app's own publisher is back (none was open)


async def test_sync_handlers_run_in_a_thread_and_timeouts_are_real(tmp_path: Path) -> None:
    app = make_app(tmp_path)
    threads: list[str] = []

    @app.job("sync", queue="work", payload=Order)
    def sync(o: Order, ctx: JobContext) -> None:
        threads.append(threading.current_thread().name)

    @app.job("slow", queue="money", payload=Order, timeout=0.2, retry=RetryPolicy(max_attempts=1))
    async def slow(o: Order, ctx: JobContext) -> None:
        await asyncio.sleep(5)

    async with TestBroker(app, start=START) as broker:
        await app.enqueue("sync", {"order_id": 1})
        await app.enqueue("slow", {"order_id": 2})
        started = time.monotonic()
        done = await broker.drain()
        took = time.monotonic() - started
        [q] = broker.quarantine("money")
    assert threads
    assert threads[0] != threading.current_thread().name
    assert {p.job: p.kind for p in done} == {"sync": "succeeded", "slow": "quarantined"}
    assert [p.outcome.timed_out for p in done if p.job == "slow"] == [True]
    assert q.reason == "timeout"
    assert 0.2 <= took < 2.0  # the handler's real 0.2 s timeout


async def test_idempotent_job_runs_once_with_a_real_sqlite_ledger(tmp_path: Path) -> None:
    app = make_app(tmp_path, ledger=SqliteLedger(tmp_path / "ledger.sqlite3"))
    runs: list[str] = []

    @app.job("invoice", queue="work", payload=Order, idempotent=True)
    async def invoice(o: Order, ctx: JobContext) -> None:
        runs.append(ctx.job_id)

    async with TestBroker(app) as broker:
        await app.enqueue("invoice", {"order_id": 1}, job_id="inv-1")
        await app.enqueue("invoice", {"order_id": 1}, job_id="inv-1")
        done = await broker.drain()
    assert runs == ["inv-1"]
    assert [p.kind for p in done] == ["succeeded", "duplicate"]
    await app.close()


async def test_sharded_queue_spreads_tenants_and_runs_them_all(tmp_path: Path) -> None:
    app = make_app(tmp_path)
    ran: list[str] = []

    @app.job("t", queue="tenants", payload=Order)
    async def per_tenant(o: Order, ctx: JobContext) -> None:
        assert ctx.tenant is not None
        ran.append(ctx.tenant)

    tenants = [f"tenant-{i}" for i in range(12)]
    async with TestBroker(app) as broker:
        for tenant in tenants:
            await app.enqueue("t", {"order_id": 1}, tenant=tenant)
        layout = app.layout_of("t")
        depths = [len(broker.memory.queue(w).messages) for w in layout.work_queues]
        done = await broker.drain()
    assert sum(depths) == 12
    assert sum(1 for d in depths if d) >= 2
    assert sorted(ran) == sorted(tenants)
    assert {p.queue for p in done} == {w for w, d in zip(layout.work_queues, depths, strict=True) if d}


async def test_unroutable_enqueue_raises_as_on_the_broker(tmp_path: Path) -> None:
    app = make_app(tmp_path)
    async with TestBroker(app) as broker:
        with pytest.raises(UnroutableError):
            await broker.publisher.publish("jobs", "no-such-key", OutgoingMessage(body=b"{}"))


# ---------------------------------------------------------------------------- the scheduler
def cron_app(tmp_path: Path, fired: list[tuple[str, str]]) -> App:
    app = make_app(tmp_path)

    @app.cron("*/15 * * * *", name="quarter", payload={"order_id": 1})
    @app.job("report", queue="work", payload=Order)
    async def report(o: Order, ctx: JobContext) -> None:
        fired.append((ctx.job_id, str(ctx.headers["amqpjobs-cron-kind"])))

    return app


async def test_cron_ticks_fire_on_the_virtual_clock(tmp_path: Path) -> None:
    fired: list[tuple[str, str]] = []
    app = cron_app(tmp_path, fired)
    async with TestBroker(app, start=START) as broker:
        assert broker.leader() is not None
        await broker.advance("1h")
        assert broker.clock.now() == datetime(2026, 3, 1, 13, 0, tzinfo=UTC)
    assert fired == [(f"cron:quarter:2026-03-01T{t}:00Z", "fired") for t in ("12:15", "12:30", "12:45", "13:00")]
    assert [e.kind for e in broker.ticks] == ["fired"] * 4


async def test_one_leader_fires_and_the_next_takes_over_without_a_tick_twice(tmp_path: Path) -> None:
    fired: list[tuple[str, str]] = []
    app = cron_app(tmp_path, fired)
    async with TestBroker(app, start=START) as broker:
        first = broker.leader()
        second = await broker.add_scheduler("second")
        third = await broker.add_scheduler("third")
        assert first is not None
        assert [r.is_leader for r in (first, second, third)] == [True, False, False]
        await broker.advance("30m")
        await broker.stop_scheduler(first, crash=True)  # its connection dies: the token goes to the next
        assert broker.leader() is second
        assert not third.is_leader
        await broker.advance("30m")
        await broker.stop_scheduler(second)  # a clean stop hands over too
        assert broker.leader() is third
        await broker.advance("15m")
    ids = [job_id for job_id, _ in fired]
    assert ids == [f"cron:quarter:2026-03-01T{t}:00Z" for t in ("12:15", "12:30", "12:45", "13:00", "13:15")]
    assert [e.schedule for e in broker.ticks] == ["quarter"] * 5  # the stores carried the cursor over


async def test_one_schedule_failing_to_enqueue_never_stops_the_others(tmp_path: Path) -> None:
    # review H2, second line of defence: a schedule whose job can't be built (here its payload
    # turned into a Decimal after import) kept the leader from firing any other schedule
    fired: list[tuple[str, str]] = []
    app = cron_app(tmp_path, fired)

    @app.cron("*/30 * * * *", name="broken")
    @app.job("other", queue="work")
    async def other(payload: dict[str, Any], ctx: JobContext) -> None: ...

    broken = {s.name: s for s in app.schedules()}["broken"]
    broken.payload["x"] = decimal.Decimal("1.5")  # type: ignore[index]
    async with TestBroker(app, start=START) as broker:
        await broker.advance("1h")
    assert [job_id for job_id, _ in fired] == [
        f"cron:quarter:2026-03-01T{t}:00Z" for t in ("12:15", "12:30", "12:45", "13:00")
    ]
    assert [(e.schedule, e.kind) for e in broker.ticks] == [("quarter", "fired")] * 4


async def test_permanent_errors_retry_and_priorities_follow_the_job_policy(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text(
        TOPOLOGY.replace('name = "work"\nexchange = "jobs"', 'name = "work"\nexchange = "jobs"\nmax_priority = 5')
    )
    app = App("p", topology=load_topology(path).topology)
    order: list[int] = []

    class Gone(Exception):
        pass

    @app.job("perm", queue="work", payload=Order, retry=RetryPolicy(permanent=(Gone,)))
    async def perm(o: Order, ctx: JobContext) -> None:
        order.append(o.order_id)
        if o.order_id == 0:
            raise Gone("customer deleted")
        if o.order_id == 1 and ctx.attempt == 1:
            raise Retry("later please")

    async with TestBroker(app, start=START) as broker:
        await app.enqueue("perm", {"order_id": 0}, priority=0)
        await app.enqueue("perm", {"order_id": 1}, priority=1)
        await app.enqueue("perm", {"order_id": 5}, priority=5)
        done = await broker.drain()
        [q] = broker.quarantine("work")
    assert order == [5, 1, 0, 1]  # highest priority first; the retry comes back after its 1 s tier
    assert [(p.payload["order_id"], p.kind) for p in done] == [(5, "succeeded"), (1, "retried"), (0, "quarantined"),
                                                               (1, "succeeded")]  # fmt: skip
    assert q.reason == "permanent"
    assert q.headers["amqpjobs-error-type"].endswith("<locals>.Gone")


async def test_a_job_that_enqueues_itself_forever_is_stopped(tmp_path: Path) -> None:
    app = make_app(tmp_path)

    @app.job("loop", queue="work", payload=Order)
    async def loop(o: Order, ctx: JobContext) -> None:
        await app.enqueue("loop", {"order_id": o.order_id + 1})

    async with TestBroker(app, max_deliveries=50) as broker:
        await app.enqueue("loop", {"order_id": 0})
        with pytest.raises(RuntimeError, match="more than 50 deliveries"):
            await broker.drain()
        assert len(broker.completed("loop")) == 50


def test_the_virtual_clock_refuses_naive_starts_and_going_back() -> None:
    from amqpjobs.testing import VirtualClock

    with pytest.raises(ValueError, match="naive"):
        VirtualClock(datetime(2026, 1, 1))
    clock = VirtualClock(START)
    assert clock.advance("1h30m") == datetime(2026, 3, 1, 13, 30, tzinfo=UTC)
    with pytest.raises(ValueError, match="only moves forward"):
        clock.advance(timedelta(seconds=-1))
    with pytest.raises(ValueError, match="positive"):
        clock.advance(-1)


async def test_an_app_with_tracing_gets_a_process_span_per_handler_run_in_the_double(tmp_path: Path) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = make_app(tmp_path, tracing=True)
    assert app.tracing is not None
    app.tracing._tracer = provider.get_tracer("test")  # the test's provider, not the global one

    @app.job("flaky", queue="work", payload=Order)
    async def flaky(order: Order, ctx: JobContext) -> None:
        if ctx.attempt == 1:
            raise ConnectionError("once")

    async with TestBroker(app, start=START) as broker:
        await app.enqueue("flaky", {"order_id": 1}, job_id="o-1")
        done = await broker.drain()
    assert [p.kind for p in done] == ["retried", "succeeded"]
    spans = sorted(exporter.get_finished_spans(), key=lambda s: s.start_time or 0)
    assert [s.name for s in spans] == ["send jobs:work", "process jobs:work", "process work"]
    send = spans[0].get_span_context()
    assert send is not None
    for span, outcome, tag in ((spans[1], "retried", 1), (spans[2], "succeeded", 2)):
        attrs = dict(span.attributes or {})
        assert (attrs["amqpjobs.outcome"], attrs["messaging.rabbitmq.message.delivery_tag"]) == (outcome, tag)
        assert span.parent is not None
        assert (span.parent.trace_id, span.parent.span_id) == (send.trace_id, send.span_id)
        assert "server.address" not in attrs  # no connection, no node


async def test_a_delivery_whose_span_cannot_even_be_entered_still_runs_and_is_acked(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app(tmp_path, tracing=True)
    assert app.tracing is not None
    ran: list[str] = []

    def broken(*args: object, **kwargs: object) -> object:  # a bug of ours in tracing itself
        raise RuntimeError("tracing broke")

    app.tracing.processing = broken  # type: ignore[method-assign,assignment]

    @app.job("echo", queue="work", payload=Order)
    async def echo(order: Order, ctx: JobContext) -> None:
        ran.append(ctx.job_id)

    async with TestBroker(app, start=START) as broker:
        await app.enqueue("echo", {"order_id": 1}, job_id="o-1")
        done = await broker.drain()
        assert broker.memory.queue("work").messages == []
    assert ran == ["o-1"]
    assert [(p.kind, p.outcome.acked) for p in done] == [("succeeded", True)]
    assert "it is processed without a span" in caplog.text


async def test_a_tick_whose_job_no_queue_takes_waits_as_on_the_broker(tmp_path: Path) -> None:
    # review H3, the double's side: a returned tick job is not enqueued and the cursor stays
    fired: list[tuple[str, str]] = []
    app = cron_app(tmp_path, fired)
    async with TestBroker(app, start=START) as broker:
        await broker.advance("30m")
        jobs = broker.memory.exchanges["jobs"]
        kept = list(jobs.bindings)
        jobs.bindings[:] = [b for b in kept if b[1] != "work"]  # the work queue's binding is gone
        await broker.advance("30m")
        assert [e.kind for e in broker.ticks] == ["fired"] * 2
        jobs.bindings[:] = kept
        await broker.advance("15m")
    assert fired == [
        ("cron:quarter:2026-03-01T12:15:00Z", "fired"),
        ("cron:quarter:2026-03-01T12:30:00Z", "fired"),
        ("cron:quarter:2026-03-01T12:45:00Z", "catch-up"),  # at 13:00, the first look with the binding back
        ("cron:quarter:2026-03-01T13:00:00Z", "fired"),
        ("cron:quarter:2026-03-01T13:15:00Z", "fired"),
    ]
    catch_up = broker.ticks[2]
    at_1245 = datetime(2026, 3, 1, 12, 45, tzinfo=UTC)
    assert (catch_up.kind, catch_up.missed_from, catch_up.missed_until) == ("catch-up", at_1245, at_1245)
