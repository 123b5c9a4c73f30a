"""Tracing on the real broker: one trace from enqueue through retries, quarantine and replay; foreign headers.

Spans go to the SDK's InMemorySpanExporter on the global TracerProvider (README "Tracing").
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aio_pika
import pytest
from opentelemetry import baggage, context, trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from amqpjobs import JobContext, RetryPolicy, UnroutableError
from amqpjobs.jobs.quarantine import ReplayOptions
from amqpjobs.runtime.quarantine import browse
from amqpjobs.runtime.replay import replay
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import raw_channel
from tests.integration.worker_env import make_app, running_worker
from tests.unit.test_tracing import BLOCK_OTEL

pytestmark = pytest.mark.version_independent

_EXPORTER = InMemorySpanExporter()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The global TracerProvider's spans, from this test only."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):  # set once per process (the API refuses a second one)
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


def hexid(span: ReadableSpan) -> tuple[str, str]:
    ctx = span.get_span_context()
    assert ctx is not None
    return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")


def parent_id(span: ReadableSpan) -> str | None:
    return None if span.parent is None else format(span.parent.span_id, "016x")


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
    assert dict(send.attributes or {}) == rabbitmq(
        "send", "jobs:work", **{"messaging.rabbitmq.destination.routing_key": "work", "messaging.message.id": "trace-1",
                                "amqpjobs.job": "flaky", "amqpjobs.attempt": 1},
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
        assert isinstance(attrs.pop("messaging.rabbitmq.message.delivery_tag"), int)
    first_attrs = dict(first.attributes or {})
    tag = first_attrs.pop("messaging.rabbitmq.message.delivery_tag")
    assert isinstance(tag, int)
    assert tag >= 1
    assert first_attrs == rabbitmq(
        "process", "jobs:work", **{"messaging.rabbitmq.destination.routing_key": "work", "messaging.message.id":
                                   "trace-1", "amqpjobs.job": "flaky", "amqpjobs.attempt": 1,
                                   "amqpjobs.outcome": "retried", "error.type": "ValueError"},
    )  # fmt: skip
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
    assert (span.attributes or {})["error.type"] == "UnroutableError"
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
        from amqpjobs import App, Worker, WorkerOptions, broker_settings

        url, topology = sys.argv[1:3]
        app = App("plain", topology=topology, url=url)

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
    assert result.stdout.splitlines() == ["['succeeded']", "[]"]
