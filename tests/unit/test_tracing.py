"""Tracing without a broker: destination names, the trace headers on every copy, garbage headers, the extra absent."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any

import pytest

from amqpjobs.jobs import envelope, evidence
from amqpjobs.jobs import quarantine as q
from amqpjobs.jobs.failure import quarantine_headers, retry_headers, unstarted_headers
from amqpjobs.jobs.outcome import Ack, Decision, Outcome, Quarantine, Register, RetryLater
from amqpjobs.runtime.tracing import Tracing, consumer_destination, producer_destination

TRACE = {
    "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    "tracestate": "vendor=opaque",
    "baggage": "region=eu",
}

# a finder that makes every opentelemetry module missing, as without the extra
BLOCK_OTEL = textwrap.dedent(
    """
    import sys
    class NoOtel:
        def find_spec(self, name, path=None, target=None):
            if name == "opentelemetry" or name.startswith("opentelemetry."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None
    sys.meta_path.insert(0, NoOtel())
    """
)


@pytest.mark.parametrize(
    ("exchange", "routing_key", "name"),
    [("jobs", "work", "jobs:work"), ("", "work", "work"), ("jobs", "", "jobs"), ("", "", "amq.default")],
)
def test_producer_destination(exchange: str, routing_key: str, name: str) -> None:
    assert producer_destination(exchange, routing_key) == name


@pytest.mark.parametrize(
    ("exchange", "routing_key", "queue", "name"),
    [
        ("jobs", "orders", "work", "jobs:orders:work"),
        ("jobs", "work", "work", "jobs:work"),  # the queue equals the routing key: once
        ("", "work", "work", "work"),  # a copy through the default exchange
        ("jobs", "", "work", "jobs:work"),  # fanout: no routing key
        ("", "work.t1", "work", "work.t1:work"),
    ],
)
def test_consumer_destination(exchange: str, routing_key: str, queue: str, name: str) -> None:
    assert consumer_destination(exchange, routing_key, queue) == name


def test_every_copy_keeps_the_trace_headers_as_received() -> None:
    received: dict[str, Any] = {**TRACE, envelope.ATTEMPT: 2, "x-death": [{"count": 1}]}
    retry = retry_headers(received, RetryLater(next_attempt=3, tier=1, delay=0.4), 2, "jobs", "work", "now")
    suspect = unstarted_headers(received, Register(2), "work", "jobs", "work", "host", 1, "now")
    handed_back = unstarted_headers(received, None, "work", "jobs", "work", "host", 1, "now")
    quarantined = quarantine_headers(
        received, "exhausted", ("ValueError", "boom", ""), 2, queue="work", exchange="jobs", routing_key="work",
        job="flaky", job_id="j1", host="host", pid=1, version="0", app_version="1", now="2026-11-30T00:00:00.000Z",
    )  # fmt: skip
    item = q.describe(quarantined, "j1", "flaky")
    replayed = q.replay_headers(quarantined, item, "replay-1")
    # envelope.copy_headers is where every copy starts (a new copy path, e.g. park, too)
    for headers in (envelope.copy_headers(received), retry, suspect, handed_back, quarantined, replayed):
        assert {k: headers[k] for k in TRACE} == TRACE
        assert all(headers[k] is received[k] for k in TRACE)  # the same objects: sent out byte for byte
    assert quarantined[evidence.REASON] == "exhausted"
    assert replayed[envelope.ATTEMPT] == 1


@pytest.mark.parametrize(
    "headers",
    [
        {"traceparent": "00-xyz-garbage-01"},
        {"traceparent": "00-00000000000000000000000000000000-0000000000000000-01"},  # all-zero ids: invalid
        {"traceparent": b"\xff\xfe\x00", "tracestate": 5, "baggage": "=;=,,%%"},
        {"traceparent": {"nested": "table"}, "baggage": b"\xff"},
        {},
    ],
)
def test_a_malformed_trace_context_reads_as_none(headers: dict[str, Any]) -> None:
    from opentelemetry import trace

    context = Tracing()._extract(headers)
    assert not trace.get_current_span(context).get_span_context().is_valid


def test_a_traceparent_sent_as_bytes_is_read() -> None:
    from opentelemetry import trace

    context = Tracing()._extract({"traceparent": TRACE["traceparent"].encode()})
    span = trace.get_current_span(context).get_span_context()
    assert (format(span.trace_id, "032x"), format(span.span_id, "016x")) == ("0af7651916cd43dd8448eb211c80319c",
                                                                            "b7ad6b7169203331")  # fmt: skip


def test_tracing_without_the_extra_is_a_configuration_error_naming_the_install() -> None:
    script = BLOCK_OTEL + textwrap.dedent(
        """
        from amqpjobs import App, ConfigurationError
        App("t")  # tracing off: fine
        try:
            App("t", tracing=True)
        except ConfigurationError as exc:
            print("ERROR", exc)
        print(sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry"))
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    lines = result.stdout.splitlines()
    assert lines[0].startswith("ERROR App(tracing=True) needs OpenTelemetry, which is not installed")
    assert "pip install 'amqpjobs[otel]'" in lines[0]
    assert lines[1] == "[]"


def test_a_tracer_provider_set_after_the_app_is_built_gets_the_spans() -> None:
    script = textwrap.dedent(
        """
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        from amqpjobs import App

        app = App("t", tracing=True)  # before any provider: the API's proxy tracer
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        with app.tracing.sending("jobs", "work", "ping", "id-1") as headers:
            print(sorted(headers))
        print([(s.name, s.kind.name, s.instrumentation_scope.name) for s in exporter.get_finished_spans()])
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.splitlines() == ["['traceparent']", "[('send jobs:work', 'PRODUCER', 'amqpjobs')]"]


@pytest.mark.parametrize(
    ("decision", "failure", "kind", "error"),
    [
        (Ack(), ("", "", ""), "succeeded", None),
        (RetryLater(next_attempt=2, tier=0, delay=0.2), ("ValueError", "boom", "tb"), "retried", "ValueError"),
        (Quarantine("unknown-job"), ("UnknownJob", "no job name", ""), "quarantined", "UnknownJob"),
        (RetryLater(next_attempt=1, tier=0, delay=0.2, wait=True), ("ClaimBusy", "held", ""), "deferred", None),
    ],
)
def test_a_process_span_records_the_outcome(decision: Decision, failure: tuple[str, str, str], kind: str,
                                            error: str | None) -> None:  # fmt: skip
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import StatusCode

    outcome = Outcome(decision=decision, job="flaky", job_id="j1", attempt=2, duration=0.1, acked=True,
                      failure=failure, error=f"{failure[0]}: {failure[1]}" if failure[0] else "")  # fmt: skip
    with TracerProvider().get_tracer("test").start_as_current_span("process") as span:
        Tracing().finished(span, outcome)
    attributes = dict(span.attributes or {})  # type: ignore[attr-defined]
    assert attributes.pop("error.type", None) == error
    assert attributes == {"amqpjobs.job": "flaky", "amqpjobs.attempt": 2, "amqpjobs.outcome": kind}
    status = span.status  # type: ignore[attr-defined]
    expected = (StatusCode.ERROR, f"{failure[0]}: {failure[1]}") if error else (StatusCode.UNSET, None)
    assert (status.status_code, status.description) == expected
