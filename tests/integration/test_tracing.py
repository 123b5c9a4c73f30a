"""Tracing on the real broker: one trace from enqueue through retries, quarantine and replay; foreign headers.

Spans go to the SDK's InMemorySpanExporter on the global TracerProvider (README "Tracing").
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit

import aio_pika
import pytest
from opentelemetry import baggage, context, trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, StatusCode, TraceFlags, TraceState

from amqpjobs import App, JobContext, RetryPolicy, Scheduler, TickEvent, UnroutableError
from amqpjobs.jobs import crash
from amqpjobs.jobs.replay_plan import ReplayOptions
from amqpjobs.jobs.tracecontext import consumer_destination
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.runtime.quarantine import browse
from amqpjobs.runtime.replay import replay
from amqpjobs.topology.loader import load_topology
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import depth, drain, raw_channel
from tests.integration.worker_env import make_app, running_worker
from tests.unit.test_tracing import BLOCK_OTEL

pytestmark = pytest.mark.version_independent

_EXPORTER = InMemorySpanExporter()


class Chaos(SpanProcessor):
    """A span processor that raises where a test says: ``fail`` holds ``"start"`` and/or ``"end"``."""

    fail: ClassVar[set[str]] = set()

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        if "start" in self.fail:
            raise RuntimeError("span processor on_start broke")

    def on_end(self, span: ReadableSpan) -> None:
        if "end" in self.fail:
            raise RuntimeError("span processor on_end broke")


_CHAOS = Chaos()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The global TracerProvider's spans, from this test only."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):  # set once per process (the API refuses a second one)
        provider = TracerProvider()
        provider.add_span_processor(_CHAOS)  # first: a failure stops the exporter's on_start/on_end
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()
    Chaos.fail.clear()


def hexid(span: ReadableSpan) -> tuple[str, str]:
    ctx = span.get_span_context()
    assert ctx is not None
    return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")


def parent_id(span: ReadableSpan) -> str | None:
    return None if span.parent is None else format(span.parent.span_id, "016x")


def server_of(broker: BrokerSettings) -> tuple[str, int]:
    """``server.address`` / ``server.port`` of the test broker's node."""
    url = urlsplit(broker.url)
    assert url.hostname is not None
    return url.hostname, url.port or 5672


def rabbitmq(operation: str, destination: str, **more: Any) -> dict[str, Any]:
    return {
        "messaging.system": "rabbitmq",
        "messaging.operation.name": operation,
        "messaging.operation.type": operation,
        "messaging.destination.name": destination,
        **more,
    }


async def test_one_trace_from_enqueue_through_two_failures_quarantine_and_replay_to_done(
    broker: BrokerSettings, tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    app = await make_app(broker, tmp_path, tracing=True)
    seen: list[tuple[int, str, object]] = []

    @app.job("flaky", queue="work", retry=RetryPolicy(max_attempts=2))
    async def flaky(payload: dict[str, Any], ctx: JobContext) -> None:
        current = trace.get_current_span().get_span_context()
        seen.append((ctx.attempt, format(current.trace_id, "032x"), baggage.get_baggage("region")))
        if len(seen) <= 2:
            raise ValueError(f"boom {len(seen)}")

    async with running_worker(app, broker) as (_, recorder):
        token = context.attach(baggage.set_baggage("region", "eu"))
        try:
            await app.enqueue("flaky", {"n": 1}, job_id="trace-1")
        finally:
            context.detach(token)
        await recorder.wait_for(lambda o: [x.kind for x in o] == ["retried", "quarantined"])
        _, items = await browse(broker, "work.quarantine")
        report = await replay(broker, "work.quarantine", ReplayOptions(rate=100))  # what `amqpjobs replay` runs
        assert report.replayed == 1
        await recorder.wait_for(lambda o: [x.kind for x in o] == ["retried", "quarantined", "succeeded"])
    await app.close()

    finished = sorted(spans.get_finished_spans(), key=lambda s: s.start_time or 0)
    assert [(s.name, s.kind) for s in finished] == [
        ("send jobs:work", SpanKind.PRODUCER),
        ("process jobs:work", SpanKind.CONSUMER),  # enqueued: routing key = work queue's name
        ("process work", SpanKind.CONSUMER),  # back from the delay tier (default exchange, key = queue)
        ("process work", SpanKind.CONSUMER),  # replayed (default exchange, key = queue)
    ]
    send, first, second, replayed = finished
    trace_id, send_id = hexid(send)
    host, port = server_of(broker)
    assert dict(send.attributes or {}) == rabbitmq(
        "send", "jobs:work", **{"messaging.rabbitmq.destination.routing_key": "work", "messaging.message.id": "trace-1",
                                "amqpjobs.job": "flaky", "amqpjobs.attempt": 1, "server.address": host,
                                "server.port": port},
    )  # fmt: skip
    assert send.parent is None
    assert send.status.status_code is StatusCode.UNSET

    # the headers on the wire: the send span's context, kept on the quarantine copy
    assert len(items) == 1
    headers = items[0].delivery.headers
    flags = send.get_span_context().trace_flags  # type: ignore[union-attr]
    assert flags & 1  # sampled
    assert headers["traceparent"] == f"00-{trace_id}-{send_id}-{flags:02x}"
    assert headers["baggage"] == "region=eu"

    for span, attempt, outcome, key in ((first, 1, "retried", "work"), (second, 2, "quarantined", "work"),
                                        (replayed, 1, "succeeded", "work")):  # fmt: skip
        assert hexid(span)[0] == trace_id, span.name
        assert parent_id(span) == send_id  # parent: the send
        assert [format(link.context.span_id, "016x") for link in span.links] == [send_id]  # and a link to it
        attrs = dict(span.attributes or {})
        assert attrs["amqpjobs.outcome"] == outcome
        assert attrs["amqpjobs.attempt"] == attempt
        assert attrs["amqpjobs.job"] == "flaky"
        assert attrs["messaging.message.id"] == "trace-1"
        assert attrs["messaging.rabbitmq.destination.routing_key"] == key
        assert (attrs["server.address"], attrs["server.port"]) == (host, port)
    # one consumer channel, opened for this worker: its deliveries are tagged 1, 2, 3
    tags = [(s.attributes or {})["messaging.rabbitmq.message.delivery_tag"] for s in (first, second, replayed)]
    assert tags == [1, 2, 3]
    assert dict(first.attributes or {}) == rabbitmq(
        "process", "jobs:work", **{"messaging.rabbitmq.destination.routing_key": "work", "messaging.message.id":
                                   "trace-1", "amqpjobs.job": "flaky", "amqpjobs.attempt": 1,
                                   "amqpjobs.outcome": "retried", "error.type": "ValueError",
                                   "messaging.rabbitmq.message.delivery_tag": 1, "server.address": host,
                                   "server.port": port},
    )  # fmt: skip
    assert (second.attributes or {})["amqpjobs.reason"] == "exhausted"
    assert "amqpjobs.reason" not in (first.attributes or {})
    assert (first.status.status_code, first.status.description) == (StatusCode.ERROR, "ValueError: boom 1")
    assert (second.attributes or {})["error.type"] == "ValueError"
    assert (second.status.status_code, second.status.description) == (StatusCode.ERROR, "ValueError: boom 2")
    assert "error.type" not in (replayed.attributes or {})
    assert replayed.status.status_code is StatusCode.UNSET
    assert (replayed.attributes or {})["amqpjobs.replay_count"] == 1
    assert "amqpjobs.replay_count" not in (first.attributes or {})
    # the handler ran inside its process span, with the enqueue's baggage
    assert seen == [(1, trace_id, "eu"), (2, trace_id, "eu"), (1, trace_id, "eu")]


async def test_a_failed_enqueue_ends_its_send_span_with_the_error(
    broker: BrokerSettings, tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    app = await make_app(broker, tmp_path, tracing=True)
    app.job("lost", queue="ghost")(lambda payload, ctx: None)
    with pytest.raises(UnroutableError):
        await app.enqueue("lost", {}, job_id="ghost-1")
    await app.close()
    (span,) = spans.get_finished_spans()
    assert span.name == "send jobs:ghost"
    assert (span.attributes or {})["error.type"] == "amqpjobs.errors.UnroutableError"  # fully qualified
    assert span.status.status_code is StatusCode.ERROR


async def test_foreign_trace_headers_never_fail_the_job(
    broker: BrokerSettings, tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    app = await make_app(broker, tmp_path, tracing=True)
    ran: list[str] = []

    @app.job("echo", queue="work")
    async def echo(payload: dict[str, Any], ctx: JobContext) -> None:
        ran.append(ctx.job_id)

    in_thread: list[str] = []

    @app.job("threaded", queue="work")
    def threaded(payload: dict[str, Any], ctx: JobContext) -> None:  # a plain function: runs in a thread
        in_thread.append(format(trace.get_current_span().get_span_context().trace_id, "032x"))

    foreign: dict[str, dict[str, Any]] = {
        "malformed": {"traceparent": "00-not-a-trace-id-01", "tracestate": "=,=", "baggage": "%%%;;"},
        "table": {"traceparent": {"a": 1}, "baggage": 7},
        "bytes": {"traceparent": bytearray(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")},  # a Buffer
    }
    async with running_worker(app, broker) as (_, recorder), raw_channel(broker) as channel:
        exchange = await channel.get_exchange("jobs")
        for job_id, headers in foreign.items():
            message = aio_pika.Message(b"{}", headers=headers, message_id=job_id, type="echo",
                                       content_type="application/json")  # fmt: skip
            await exchange.publish(message, routing_key="work")
        await app.enqueue("threaded", {}, job_id="threaded")
        await recorder.wait_for(lambda o: len(o) == 4)
    await app.close()
    assert sorted(ran) == ["bytes", "malformed", "table"]
    assert [o.kind for o in recorder.outcomes] == ["succeeded"] * 4
    sent = next(s for s in spans.get_finished_spans() if s.kind is SpanKind.PRODUCER)
    assert in_thread == [hexid(sent)[0]]  # the thread ran in the process span's context
    by_id = {(s.attributes or {})["messaging.message.id"]: s for s in spans.get_finished_spans()}
    for job_id in ("malformed", "table"):  # a new trace: no parent, no link
        span = by_id[job_id]
        assert span.name == "process jobs:work"
        assert parent_id(span) is None, job_id
        assert list(span.links) == [], job_id
        assert (span.attributes or {})["amqpjobs.outcome"] == "succeeded"
    assert hexid(by_id["malformed"])[0] != hexid(by_id["table"])[0]
    span = by_id["bytes"]
    assert hexid(span)[0] == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert parent_id(span) == "00f067aa0ba902b7"


async def test_without_the_extra_a_job_runs_and_no_opentelemetry_module_is_loaded(
    broker: BrokerSettings, tmp_path: Path
) -> None:
    await make_app(broker, tmp_path)  # applies the topology, writes app.toml
    script = BLOCK_OTEL + textwrap.dedent(
        """
        import asyncio
        from amqpjobs import App, ConfigurationError, Worker, WorkerOptions, broker_settings

        url, topology = sys.argv[1:3]
        try:  # the extra is absent: asking for tracing is an error ...
            App("traced", topology=topology, url=url, tracing=True)
        except ConfigurationError as exc:
            print("refused:", "pip install 'amqpjobs[otel]'" in str(exc))
        app = App("plain", topology=topology, url=url)  # ... and without it a real job runs

        @app.job("ping", queue="work")
        async def ping(payload, ctx):
            pass

        async def main():
            kinds, done = [], asyncio.Event()
            def record(outcome):
                kinds.append(outcome.kind)
                done.set()
            worker = Worker(app, broker_settings(url), WorkerOptions(queues=("work",), grace=5), record)
            await worker.start()
            await app.enqueue("ping", {}, headers={"traceparent": "00-foreign-01"})
            await asyncio.wait_for(done.wait(), 30)
            await worker.shutdown()
            await app.close()
            print(kinds)

        asyncio.run(main())
        print(sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry"))
        """
    )
    result = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-c", script, broker.url, str(tmp_path / "app.toml")],
        capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines() == ["refused: True", "['succeeded']", "[]"]


# ---------------------------------------------------------------------------- tracing failures
@pytest.mark.parametrize("where", ["start", "end"])
async def test_a_failing_span_processor_never_wedges_a_job_nor_fails_an_enqueue(
    broker: BrokerSettings, tmp_path: Path, spans: InMemorySpanExporter, caplog: pytest.LogCaptureFixture,
    where: str,
) -> None:  # fmt: skip
    app = await make_app(broker, tmp_path, tracing=True)
    ran: list[str] = []

    @app.job("echo", queue="work")
    async def echo(payload: dict[str, Any], ctx: JobContext) -> None:
        ran.append(ctx.job_id)

    Chaos.fail.add(where)
    caplog.set_level(logging.WARNING, "amqpjobs.tracing")
    async with running_worker(app, broker) as (_, recorder):
        for n in range(3):
            await app.enqueue("echo", {}, job_id=f"j{n}")  # the send span fails: the enqueue goes out all the same
        await recorder.wait_for(lambda o: len(o) == 3, timeout=15)
        assert await depth(broker, "work") == 0
    await app.close()
    assert sorted(ran) == ["j0", "j1", "j2"]
    assert [(o.kind, o.acked) for o in recorder.outcomes] == [("succeeded", True)] * 3
    logged = [r for r in caplog.records if r.name == "amqpjobs.tracing"]
    # 3 sends and 3 processes failed the same way: one line (then one a minute at most)
    assert len(logged) == 1, [r.getMessage() for r in logged]
    assert f"span processor on_{where} broke" in logged[0].getMessage()
    assert app.tracing is not None
    assert sum(app.tracing.failures.counts.values()) == 6


# ---------------------------------------------------------------------------- jobs without a traceparent
async def test_a_job_without_a_traceparent_keeps_the_trace_of_its_first_attempt(
    broker: BrokerSettings, tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    app = await make_app(broker, tmp_path, tracing=True)

    @app.job("flaky", queue="work", retry=RetryPolicy(max_attempts=3))
    async def flaky(payload: dict[str, Any], ctx: JobContext) -> None:
        if ctx.attempt < 3:
            raise KeyError(ctx.attempt)

    async with running_worker(app, broker) as (_, recorder), raw_channel(broker) as channel:
        exchange = await channel.get_exchange("jobs")
        message = aio_pika.Message(b"{}", message_id="plain-1", type="flaky", content_type="application/json",
                                   correlation_id="conversation-7", headers={"baggage": "team=blue"})  # fmt: skip
        await exchange.publish(message, routing_key="work")  # a foreign publisher: no traceparent
        await recorder.wait_for(lambda o: [x.kind for x in o] == ["retried", "retried", "succeeded"])
    await app.close()
    first, second, third = sorted(spans.get_finished_spans(), key=lambda s: s.start_time or 0)
    assert parent_id(first) is None
    assert list(first.links) == []
    for later in (second, third):  # both join the first attempt's trace, as its children
        assert hexid(later)[0] == hexid(first)[0]
        assert parent_id(later) == hexid(first)[1]
        assert [format(link.context.span_id, "016x") for link in later.links] == [hexid(first)[1]]
    host, port = server_of(broker)
    for span in (first, second, third):
        attrs = dict(span.attributes or {})
        assert attrs["messaging.message.conversation_id"] == "conversation-7"
        assert (attrs["server.address"], attrs["server.port"]) == (host, port)
    assert (first.attributes or {})["error.type"] == "KeyError"


async def test_the_scheduler_makes_a_send_span_per_tick_and_the_worker_continues_it(
    broker: BrokerSettings, tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    app = await make_app(broker, tmp_path, tracing=True)
    ran: list[str] = []

    @app.cron("* * * * * *", name="every-second")
    @app.job("tick", queue="work")
    async def tick(payload: dict[str, Any], ctx: JobContext) -> None:
        ran.append(format(trace.get_current_span().get_span_context().trace_id, "032x"))

    events: list[TickEvent] = []
    async with running_worker(app, broker) as (_, recorder):
        scheduler = Scheduler(app, broker, on_event=events.append)
        await scheduler.start()
        try:
            await recorder.wait_for(lambda o: len(o) >= 1, timeout=20)
        finally:
            await scheduler.shutdown()
        await recorder.wait_for(lambda o: len(o) == len([e for e in events if e.job_id]), timeout=10)
    await app.close()
    fired = {e.job_id: e for e in events if e.job_id}
    sends = [s for s in spans.get_finished_spans() if s.kind is SpanKind.PRODUCER]
    processes = {(s.attributes or {})["messaging.message.id"]: s for s in spans.get_finished_spans()
                 if s.kind is SpanKind.CONSUMER}  # fmt: skip
    assert sorted(str((s.attributes or {})["messaging.message.id"]) for s in sends) == sorted(fired)
    host, port = server_of(broker)
    for send in sends:
        job_id = (send.attributes or {})["messaging.message.id"]
        assert send.name == "send jobs:work"
        assert dict(send.attributes or {}) == rabbitmq(
            "send", "jobs:work", **{"messaging.rabbitmq.destination.routing_key": "work", "messaging.message.id":
                                    job_id, "amqpjobs.job": "tick", "amqpjobs.attempt": 1, "server.address": host,
                                    "server.port": port},
        )  # fmt: skip
        process = processes[job_id]
        assert parent_id(process) == hexid(send)[1]
        assert hexid(process)[0] == hexid(send)[0]
    assert sorted(ran) == sorted(hexid(s)[0] for s in sends)


# ---------------------------------------------------------------------------- headers the caller passes
async def test_a_callers_trace_headers_are_replaced_by_the_current_context(
    broker: BrokerSettings, tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    app = await make_app(broker, tmp_path, tracing=True)
    app.job("echo", queue="work")(lambda payload, ctx: None)
    stale = {"traceparent": f"00-{'1' * 32}-{'2' * 16}-01", "tracestate": "stale=1", "baggage": "old=secret",
             "custom": "kept"}  # fmt: skip
    await app.enqueue("echo", {}, job_id="no-baggage", headers=stale)
    token = context.attach(baggage.set_baggage("region", "eu"))
    try:
        await app.enqueue("echo", {}, job_id="with-baggage", headers=stale)
    finally:
        context.detach(token)
    await app.close()
    sent = {(s.attributes or {})["messaging.message.id"]: s for s in spans.get_finished_spans()}
    got = {m.message_id: m.headers for m in await drain(broker, "work")}
    for job_id, expected_baggage in (("no-baggage", None), ("with-baggage", "region=eu")):
        headers = got[job_id]
        trace_id, span_id = hexid(sent[job_id])
        flags = sent[job_id].get_span_context().trace_flags  # type: ignore[union-attr]
        assert headers["traceparent"] == f"00-{trace_id}-{span_id}-{flags:02x}"
        assert "tracestate" not in headers
        assert headers.get("baggage") == expected_baggage
        assert headers["custom"] == "kept"


# ---------------------------------------------------------------------------- tracestate, handlers, sync, shards
async def test_tracestate_reaches_the_worker_and_a_job_enqueued_by_a_handler_is_a_child(
    broker: BrokerSettings, tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    app = await make_app(broker, tmp_path, tracing=True)
    seen: dict[str, tuple[str, str | None]] = {}

    @app.job("parent", queue="work")
    async def parent(payload: dict[str, Any], ctx: JobContext) -> None:
        current = trace.get_current_span().get_span_context()
        seen[ctx.job_id] = (format(current.trace_id, "032x"), current.trace_state.get("vendor"))
        await app.enqueue("child", {}, job_id="child-1")

    @app.job("child", queue="work")
    async def child(payload: dict[str, Any], ctx: JobContext) -> None:
        current = trace.get_current_span().get_span_context()
        seen[ctx.job_id] = (format(current.trace_id, "032x"), current.trace_state.get("vendor"))

    remote = SpanContext(
        trace_id=0x5B8EFFF798038103D269B633813FC60C, span_id=0xEEE19B7EC3C1B174, is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED), trace_state=TraceState([("vendor", "v1")]),
    )  # fmt: skip
    async with running_worker(app, broker) as (_, recorder):
        token = context.attach(trace.set_span_in_context(NonRecordingSpan(remote)))
        try:
            await app.enqueue("parent", {}, job_id="parent-1")
        finally:
            context.detach(token)
        await recorder.wait_for(lambda o: len(o) == 2)
    await app.close()
    by = {((s.attributes or {})["messaging.message.id"], s.kind): s for s in spans.get_finished_spans()}
    send, process = by["parent-1", SpanKind.PRODUCER], by["parent-1", SpanKind.CONSUMER]
    child_send, child_process = by["child-1", SpanKind.PRODUCER], by["child-1", SpanKind.CONSUMER]
    trace_id = "5b8efff798038103d269b633813fc60c"
    assert parent_id(send) == "eee19b7ec3c1b174"
    assert parent_id(process) == hexid(send)[1]
    assert parent_id(child_send) == hexid(process)[1]  # enqueued from the handler: a child of its process span
    assert parent_id(child_process) == hexid(child_send)[1]
    for span in (send, process, child_send, child_process):
        assert hexid(span)[0] == trace_id
        assert span.get_span_context().trace_state.get("vendor") == "v1"  # type: ignore[union-attr]
    assert seen == {"parent-1": (trace_id, "v1"), "child-1": (trace_id, "v1")}


async def test_the_sync_publisher_makes_a_send_span_in_the_callers_context(
    broker: BrokerSettings, tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    app = await make_app(broker, tmp_path, tracing=True)
    app.job("echo", queue="work")(lambda payload, ctx: None)

    def view() -> str:  # a web request's span, in a thread of its own
        with trace.get_tracer("web").start_as_current_span("GET /orders") as request:
            with app.sync_publisher(broker.url) as publisher:
                publisher.enqueue("echo", {}, job_id="sync-1")
            return format(request.get_span_context().span_id, "016x")

    async with running_worker(app, broker) as (_, recorder):
        request_id = await asyncio.to_thread(view)
        await recorder.wait_for(lambda o: len(o) == 1)
    await app.close()
    by = {s.kind: s for s in spans.get_finished_spans() if s.name != "GET /orders"}
    assert by[SpanKind.PRODUCER].name == "send jobs:work"
    assert parent_id(by[SpanKind.PRODUCER]) == request_id
    assert parent_id(by[SpanKind.CONSUMER]) == hexid(by[SpanKind.PRODUCER])[1]


SHARDED = """
[[exchange]]
name = "jobs"

[[job_queue]]
name = "tenants"
exchange = "jobs"
shards = 2
retry_tiers = ["200ms"]
"""


async def test_a_sharded_job_is_traced_from_its_shard(
    broker: BrokerSettings, tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    path = tmp_path / "sharded.toml"
    path.write_text(SHARDED)
    await apply_topology(path, broker)
    app = App("sharded", topology=load_topology(path).topology, url=broker.url, tracing=True)
    app.job("echo", queue="tenants")(lambda payload, ctx: None)
    layout = app.layout_of("echo")
    first = layout.routing_key_for("acme")
    tenants = ("acme", next(t for t in (f"tenant-{n}" for n in range(100)) if layout.routing_key_for(t) != first))
    async with running_worker(app, broker, queues=("tenants",)) as (_, recorder):
        for tenant in tenants:
            await app.enqueue("echo", {}, job_id=f"for-{tenant}", tenant=tenant)
        await recorder.wait_for(lambda o: len(o) == 2)
    await app.close()
    by = {((s.attributes or {})["messaging.message.id"], s.kind): s for s in spans.get_finished_spans()}
    shards = set()
    for tenant in tenants:
        key = layout.routing_key_for(tenant)
        queue = layout.work_queues[layout.shard_routing_keys.index(key)]
        shards.add(queue)
        send, process = by[f"for-{tenant}", SpanKind.PRODUCER], by[f"for-{tenant}", SpanKind.CONSUMER]
        assert send.name == f"send jobs:{key}"
        assert process.name == f"process {consumer_destination('jobs', key, queue)}"
        assert (process.attributes or {})["messaging.rabbitmq.destination.routing_key"] == key
        assert parent_id(process) == hexid(send)[1]
    assert len(shards) == 2  # the two tenants are on different shards


async def test_huge_foreign_trace_headers_are_ignored(
    broker: BrokerSettings, tmp_path: Path, spans: InMemorySpanExporter, caplog: pytest.LogCaptureFixture
) -> None:
    app = await make_app(broker, tmp_path, tracing=True)
    seen: list[object] = []

    @app.job("echo", queue="work")
    async def echo(payload: dict[str, Any], ctx: JobContext) -> None:
        seen.append(baggage.get_baggage("k"))

    huge: dict[str, Any] = {
        "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "tracestate": ",".join(f"v{n}=x" for n in range(40)),  # 40 members: over 32
        "baggage": "k=" + "v" * 84_000,  # over 8192 bytes
    }
    caplog.set_level(logging.INFO)
    async with running_worker(app, broker) as (_, recorder), raw_channel(broker) as channel:
        exchange = await channel.get_exchange("jobs")
        for n in range(3):
            await exchange.publish(aio_pika.Message(b"{}", headers=huge, message_id=f"huge-{n}", type="echo",
                                                    content_type="application/json"), routing_key="work")  # fmt: skip
        await recorder.wait_for(lambda o: len(o) == 3)
    await app.close()
    assert [o.kind for o in recorder.outcomes] == ["succeeded"] * 3
    assert seen == [None] * 3
    for span in spans.get_finished_spans():
        assert parent_id(span) == "00f067aa0ba902b7"  # the traceparent is fine and still read
        assert len(span.get_span_context().trace_state) == 0  # type: ignore[union-attr]
    assert max(len(r.getMessage()) for r in caplog.records) < 2000
    tracing_lines = [r.getMessage() for r in caplog.records if r.name == "amqpjobs.tracing"]
    assert len(tracing_lines) == 1
    assert "ignored tracestate, baggage" in tracing_lines[0]


async def test_a_span_processor_failing_on_end_does_not_break_a_suspects_turn(
    broker: BrokerSettings, tmp_path: Path, spans: InMemorySpanExporter, caplog: pytest.LogCaptureFixture
) -> None:
    app = await make_app(broker, tmp_path, tracing=True)
    ran: list[str] = []

    @app.job("echo", queue="work")
    async def echo(payload: dict[str, Any], ctx: JobContext) -> None:
        ran.append(ctx.job_id)

    Chaos.fail.add("end")
    caplog.set_level(logging.WARNING)
    async with running_worker(app, broker) as (_, recorder), raw_channel(broker) as channel:
        for n in range(3):  # registered second starts, waiting in the suspects queue to run alone
            headers: dict[str, Any] = {crash.STARTS: 2, crash.WORK_QUEUE: "work"}
            message = aio_pika.Message(b"{}", headers=headers, message_id=f"suspect-{n}", type="echo",
                                       content_type="application/json")  # fmt: skip
            await channel.default_exchange.publish(message, routing_key=app.layout_of("echo").suspects_queue)
        await recorder.wait_for(lambda o: len(o) == 3, timeout=20)
    await app.close()
    assert ran == ["suspect-0", "suspect-1", "suspect-2"]
    assert [(o.kind, o.acked) for o in recorder.outcomes] == [("succeeded", True)] * 3
    assert not [r.getMessage() for r in caplog.records if "running the suspects of" in r.getMessage()]
    assert app.tracing is not None
    assert app.tracing.failures.counts == {"ending a span": 3}


async def test_trace_headers_with_control_characters_are_read_as_absent_and_never_reach_the_logs(
    broker: BrokerSettings, tmp_path: Path, spans: InMemorySpanExporter, caplog: pytest.LogCaptureFixture
) -> None:
    app = await make_app(broker, tmp_path, tracing=True)
    seen: dict[str, dict[str, object]] = {}

    @app.job("echo", queue="work")
    async def echo(payload: dict[str, Any], ctx: JobContext) -> None:
        seen[ctx.job_id] = dict(baggage.get_all())

    forged = "\nWARNING:amqpjobs.worker:forged line"
    foreign: dict[str, dict[str, Any]] = {
        "baggage-lf": {"baggage": f"user=alice,k=v{forged}"},
        "baggage-nul": {"baggage": "k=v\x00"},
        "tracestate-cr": {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                          "tracestate": f"v=1\r{forged}"},
        "traceparent-lf": {"traceparent": f"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01{forged}"},
    }  # fmt: skip
    caplog.set_level(logging.WARNING)
    async with running_worker(app, broker) as (_, recorder), raw_channel(broker) as channel:
        exchange = await channel.get_exchange("jobs")
        for job_id, headers in foreign.items():
            message = aio_pika.Message(b"{}", headers=headers, message_id=job_id, type="echo",
                                       content_type="application/json")  # fmt: skip
            await exchange.publish(message, routing_key="work")
        await recorder.wait_for(lambda o: len(o) == 4)
    await app.close()
    assert [o.kind for o in recorder.outcomes] == ["succeeded"] * 4
    assert seen == {job_id: {} for job_id in foreign}  # read as absent: no baggage from them
    ended = {str((s.attributes or {})["messaging.message.id"]): s for s in spans.get_finished_spans()}
    assert sorted(ended) == sorted(foreign)
    # each header is judged alone, as for the size limits: a good traceparent beside a bad tracestate is kept
    assert {job_id: parent_id(s) for job_id, s in ended.items()} == {
        "baggage-lf": None, "baggage-nul": None, "tracestate-cr": "00f067aa0ba902b7", "traceparent-lf": None
    }  # fmt: skip
    assert ended["tracestate-cr"].get_span_context().trace_state.to_header() == ""  # type: ignore[union-attr]
    lines = [r.getMessage() for r in caplog.records]
    assert not [line for line in lines if "forged" in line or "\x00" in line], lines
    said = [line for line in lines if "reading trace headers" in line]
    assert said, lines
    assert "control character" in said[0]
