"""amqpjobs.testing, issue 17's fresh-user review: what a user's tests hit in the double.

Sync handlers that enqueue, the ledger swap, ``max_deliveries``, one open double per app,
raw messages, the overlap guard's refusal, topology errors naming their path. No broker.
"""

from __future__ import annotations

import asyncio
import signal
import time
import zlib
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import BaseModel

from amqpjobs import App, JobContext, RetryPolicy
from amqpjobs.errors import ConfigurationError
from amqpjobs.jobs import cron
from amqpjobs.runtime.ledger import SqliteLedger
from amqpjobs.testing import TestBroker
from amqpjobs.testing.election import MemoryConnection
from amqpjobs.topology.loader import load_topology

TOPOLOGY = """
[[exchange]]
name = "jobs"
type = "direct"

[[job_queue]]
name = "work"
exchange = "jobs"
retry_tiers = ["1s", "5s"]

[[job_queue]]
name = "tenants"
exchange = "jobs"
shards = 4
retry_tiers = ["1s"]
"""

START = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
DEAD_BROKER = "amqp://guest:guest@127.0.0.1:1/"  # nothing listens on port 1


class Order(BaseModel):
    order_id: int


def make_app(tmp_path: Path, **kw: object) -> App:
    path = tmp_path / "t.toml"
    path.write_text(TOPOLOGY)
    return App("t", topology=load_topology(path).topology, app_version="9.9", **kw)  # type: ignore[arg-type]


async def test_a_sync_handler_enqueues_into_the_double_never_a_real_broker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AMQPJOBS_URL", DEAD_BROKER)
    app = make_app(tmp_path)
    children: list[int] = []

    @app.job("parent", queue="work", payload=Order)
    def parent(o: Order, ctx: JobContext) -> None:
        with app.sync_publisher() as pub:
            pub.enqueue("child", {"order_id": o.order_id + 1}, job_id=f"child-of-{ctx.job_id}")

    @app.job("child", queue="work", payload=Order)
    async def child(o: Order, ctx: JobContext) -> None:
        children.append(o.order_id)

    async with TestBroker(app, start=START) as broker:
        await app.enqueue("parent", {"order_id": 1}, job_id="p1")
        done = await broker.drain()
    assert [(p.job, p.job_id, p.kind) for p in done] == [
        ("parent", "p1", "succeeded"),
        ("child", "child-of-p1", "succeeded"),
    ]
    assert children == [2]
    assert broker.quarantine("work") == []


async def test_overlap_skip_runs_its_guard_on_the_doubles_queues(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AMQPJOBS_URL", DEAD_BROKER)
    app = make_app(tmp_path)
    ran: list[str] = []

    @app.cron("*/15 * * * *", name="quarter", overlap="skip")
    @app.job("tick", queue="work")
    async def tick(p: object, ctx: JobContext) -> None:
        ran.append(ctx.job_id)

    marker = cron.running_queue(app.name, "quarter")
    async with TestBroker(app, start=START) as broker:
        done = await broker.advance("30m")  # runs never overlap here (one at a time): each tick runs
        assert [(p.job_id, p.kind) for p in done] == [
            ("cron:quarter:2026-03-01T12:15:00Z", "succeeded"),
            ("cron:quarter:2026-03-01T12:30:00Z", "succeeded"),
        ]
        assert marker not in broker.memory.queues  # each run released its marker
        # a previous run still running elsewhere (another worker's connection holds the marker)
        elsewhere = MemoryConnection("other-worker")
        assert await broker.tick_wire.hold_exclusive(elsewhere, marker, {})
        assert await broker.advance("15m") == []
        assert [(e.tick.strftime("%H:%M"), e.kind) for e in broker.ticks[-1:]] == [("12:45", "skipped-overlap")]
        # a tick that was already queued when the other run started: the worker's guard skips it (acked, not run)
        late = {cron.SCHEDULE_HEADER: "quarter", cron.TICK_HEADER: "2026-03-01T12:45:00Z"}
        await broker.publish_raw("jobs", "work", b"{}", type="tick", message_id="late-1", headers=late)
        skipped = await broker.drain()
        assert [(p.job_id, p.kind, p.outcome.ran, p.outcome.duration) for p in skipped] == [
            ("late-1", "skipped", False, 0.0)  # not a success, and no handler run for the duration histogram
        ]
        assert (
            str(skipped[0].outcome.decision) == "ack as skipped (the previous run of schedule quarter is still running)"
        )
        await broker.tick_wire.delete_queue(elsewhere, marker, 1)
        assert [p.kind for p in await broker.advance("15m")] == ["succeeded"]
    assert ran == [
        "cron:quarter:2026-03-01T12:15:00Z",
        "cron:quarter:2026-03-01T12:30:00Z",
        "cron:quarter:2026-03-01T13:00:00Z",
    ]
    assert app._markers is None  # the app's own broker holds its markers again


async def test_idempotent_jobs_get_a_fresh_ledger_per_broker_and_the_apps_comes_back(tmp_path: Path) -> None:
    own = SqliteLedger(tmp_path / "prod.sqlite3")
    app = make_app(tmp_path, ledger=own)
    runs: list[int] = []

    @app.job("invoice", queue="work", payload=Order, idempotent=True)
    async def invoice(o: Order, ctx: JobContext) -> None:
        runs.append(ctx.attempt)
        if len(runs) == 1:
            raise ConnectionError("the invoice service is down")

    for _ in range(2):  # a second test run sees no duplicate from the first
        async with TestBroker(app, start=START) as broker:
            assert app.ledger is not own
            await app.enqueue("invoice", {"order_id": 1}, job_id="inv-1")
            first = await broker.drain()
            await app.enqueue("invoice", {"order_id": 1}, job_id="inv-1")
            again = await broker.drain()
        assert app.ledger is own
        assert [(p.kind, p.attempt) for p in first] == [("retried", 1), ("succeeded", 2)]
        assert [(p.kind, p.attempt) for p in again] == [("duplicate", 1)]
        runs.clear()
    async with TestBroker(app, ledger=own) as broker:  # the app's own ledger: no done-marker was left there
        await app.enqueue("invoice", {"order_id": 1}, job_id="inv-1")
        assert [p.kind for p in await broker.drain()] == ["retried", "succeeded"]
    await own.close()


async def test_an_explicit_ledger_is_used(tmp_path: Path) -> None:
    app = make_app(tmp_path)
    mine = SqliteLedger(tmp_path / "mine.sqlite3")

    @app.job("invoice", queue="work", payload=Order, idempotent=True)
    async def invoice(o: Order, ctx: JobContext) -> None:
        pass

    async with TestBroker(app, ledger=mine) as broker:
        assert app.ledger is mine
        await app.enqueue("invoice", {"order_id": 1}, job_id="inv-1")
        await broker.drain()
    assert app.ledger is None
    async with TestBroker(app, ledger=mine) as broker:
        await app.enqueue("invoice", {"order_id": 1}, job_id="inv-1")
        assert [p.kind for p in await broker.drain()] == ["duplicate"]
    await mine.close()


async def test_max_deliveries_keeps_the_message_and_counts_per_drain(tmp_path: Path) -> None:
    app = make_app(tmp_path)
    ran: list[int] = []

    @app.job("loop", queue="work", payload=Order)
    async def loop(o: Order, ctx: JobContext) -> None:
        await app.enqueue("loop", {"order_id": o.order_id + 1})

    @app.job("once", queue="work", payload=Order)
    async def once(o: Order, ctx: JobContext) -> None:
        ran.append(o.order_id)

    async with TestBroker(app, max_deliveries=5) as broker:
        await app.enqueue("loop", {"order_id": 0})
        with pytest.raises(RuntimeError, match="more than 5 deliveries"):
            await broker.drain()
        assert len(broker.completed("loop")) == 5
        assert len(broker.messages("work")) == 1  # the 6th was not taken: nothing lost
        broker.memory.queue("work").messages.clear()
        await app.enqueue("once", {"order_id": 9})
        done = await broker.drain()  # a new drain, a new count
    assert [(p.job, p.kind) for p in done] == [("once", "succeeded")]
    assert ran == [9]


async def test_a_second_broker_on_the_same_app_is_refused_and_the_first_keeps_working(tmp_path: Path) -> None:
    app = make_app(tmp_path)

    @app.job("child", queue="work", payload=Order)
    async def child(o: Order, ctx: JobContext) -> None:
        pass

    async with TestBroker(app) as first:
        with pytest.raises(ConfigurationError, match="already has an open TestBroker"):
            async with TestBroker(app):
                pass
        await app.enqueue("child", {"order_id": 1})
        assert len(first.messages("work")) == 1  # still routed to the first
    assert app.use_publisher(None) is None
    second = TestBroker(app)  # the first closed: a new one may open
    await second.__aenter__()
    await second.close()


async def test_publish_raw_sends_bytes_the_worker_quarantines(tmp_path: Path) -> None:
    app = make_app(tmp_path)

    @app.job("o", queue="work", payload=Order)
    async def o(order: Order, ctx: JobContext) -> None:
        pass

    async with TestBroker(app) as broker:
        await broker.publish_raw("jobs", "work", b"{not json", type="o", message_id="bad1")
        await broker.publish_raw("jobs", "work", b"\xff\xfe", type="o", message_id="bad2")
        await broker.publish_raw("jobs", "work", b'{"order_id": 1}', type="nosuch", message_id="bad3")
        await broker.publish_raw("jobs", "work", b"<x/>", type="o", message_id="bad4", content_type="text/xml",
                                 headers={"source": "legacy"})  # fmt: skip
        done = await broker.drain()
        got = {m.message_id: (m.reason, m.evidence.error_type) for m in broker.quarantine("work")}
    assert [p.kind for p in done] == ["quarantined"] * 4
    assert got == {
        "bad1": ("undecodable", "DecodeError"),
        "bad2": ("undecodable", "DecodeError"),
        "bad3": ("unknown-job", "UnknownJob"),
        "bad4": ("unsupported-content-type", "DecodeError"),
    }


async def test_a_missing_job_queue_names_the_topology_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "topology").mkdir()
    (tmp_path / "topology" / "jobs.toml").write_text(TOPOLOGY)
    monkeypatch.chdir(tmp_path)
    app = App("nt")  # the default topology: ./topology

    @app.job("x", queue="nope")
    async def x(p: object, ctx: JobContext) -> None:
        pass

    with pytest.raises(ConfigurationError) as caught:
        async with TestBroker(app):
            pass
    assert str(tmp_path / "topology") in str(caught.value)


async def test_a_sync_handler_overrunning_its_timeout_is_judged_by_its_result(tmp_path: Path) -> None:
    """As the real worker does (README "Jobs"): the thread can't be stopped, so it is waited for."""
    app = make_app(tmp_path)

    @app.job("slowsync", queue="work", payload=Order, timeout=0.2, retry=RetryPolicy(max_attempts=2))
    def slowsync(o: Order, ctx: JobContext) -> None:
        time.sleep(0.6)

    async with TestBroker(app) as broker:
        await app.enqueue("slowsync", {"order_id": 1})
        started = time.monotonic()
        done = await broker.drain()
        took = time.monotonic() - started
    assert [(p.kind, p.attempt) for p in done] == [("succeeded", 1)]
    assert took >= 0.6


async def test_shards_route_by_crc32_of_the_tenant_via_the_layout(tmp_path: Path) -> None:
    app = make_app(tmp_path)

    @app.job("t", queue="tenants", payload=Order)
    async def per_tenant(o: Order, ctx: JobContext) -> None:
        pass

    layout = app.layout_of("t")
    tenants = ["acme", "globex", "initech", "umbrella", "hooli"]
    async with TestBroker(app) as broker:
        for tenant in tenants:
            await app.enqueue("t", {"order_id": 1}, tenant=tenant)
        for tenant in tenants:
            key = layout.routing_key_for(tenant)
            assert key == layout.shard_routing_keys[zlib.crc32(tenant.encode()) % 4]
        where = {w: [h["amqpjobs-tenant"] for h in broker.messages(w)] for w in layout.work_queues}
    for tenant in tenants:
        shard = zlib.crc32(tenant.encode()) % 4
        assert tenant in where[layout.work_queues[shard]]


async def test_sync_publisher_from_the_loop_thread_is_refused(tmp_path: Path) -> None:
    app = make_app(tmp_path)

    @app.job("child", queue="work", payload=Order)
    async def child(o: Order, ctx: JobContext) -> None:
        pass

    async with TestBroker(app):
        with app.sync_publisher() as pub, pytest.raises(RuntimeError, match=r"await app\.enqueue"):
            pub.enqueue("child", {"order_id": 1})
        await asyncio.sleep(0)


@pytest.mark.parametrize(("exc", "shown"), [(SystemExit(3), "SystemExit(3)"), (GeneratorExit(), "GeneratorExit()")])
async def test_a_handler_raising_systemexit_fails_its_job_like_any_other_error(
    tmp_path: Path, exc: BaseException, shown: str
) -> None:
    """As the worker: sys.exit() in a handler is its job's failure (retry tiers, then exhausted), not a stop.

    So is any other ``BaseException`` of the handler's (``GeneratorExit``: helper-176).
    """
    app = make_app(tmp_path)

    @app.job("bye", queue="work", payload=Order, retry=RetryPolicy(max_attempts=2))
    async def bye(o: Order, ctx: JobContext) -> None:
        raise exc

    async with TestBroker(app) as broker:
        await app.enqueue("bye", {"order_id": 1}, job_id="bye-1")
        done = await broker.drain()
        [q] = broker.quarantine("work")
    assert [p.kind for p in done] == ["retried", "quarantined"]
    assert (q.reason, q.headers["amqpjobs-error-type"], q.headers["amqpjobs-attempts"]) == (
        "exhausted",
        type(exc).__name__,
        2,
    )
    assert q.headers["amqpjobs-error-message"].startswith(f"{shown} raised by the handler, not a signal")


# Under Python's own SIGINT handler (or asyncio.Runner's, whose second Ctrl-C raises) a KeyboardInterrupt in
# an async handler may be a real one, and goes on as before. The test sets that handler itself: which one is
# installed when it starts depends on the tests run before it in the same process (CI run 17: not Python's)
@pytest.mark.parametrize("exc", [KeyboardInterrupt()])
async def test_a_handler_raising_a_base_exception_leaves_its_message_in_the_queue(
    tmp_path: Path, exc: BaseException, request: pytest.FixtureRequest
) -> None:
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own: a SIGINT may raise
    request.addfinalizer(lambda: signal.signal(signal.SIGINT, previous))
    app = make_app(tmp_path)

    @app.job("bye", queue="work", payload=Order)
    async def bye(o: Order, ctx: JobContext) -> None:
        raise exc

    async with TestBroker(app) as broker:
        await app.enqueue("bye", {"order_id": 1}, job_id="bye-1")
        with pytest.raises(type(exc)):
            await broker.drain()
        left = broker.memory.queue("work").messages
        assert [(s.message.message_id, s.redelivered) for s in left] == [("bye-1", True)]  # as RabbitMQ redelivers
        assert broker.quarantine("work") == []
