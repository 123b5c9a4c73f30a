"""Tracing without a broker: destination names, the trace headers on every copy, garbage headers, the extra absent."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from contextlib import AbstractContextManager
from types import SimpleNamespace
from typing import Any

import pytest

from amqpjobs.jobs import copy_headers, envelope, evidence
from amqpjobs.jobs import quarantine as q
from amqpjobs.jobs.failure import quarantine_headers, retry_headers, unstarted_headers
from amqpjobs.jobs.outcome import Ack, Decision, Outcome, Quarantine, Register, RetryLater
from amqpjobs.jobs.tracecontext import HEADER_LIMITS, consumer_destination, producer_destination, trace_carrier
from amqpjobs.runtime.tracing import ProcessSpan, Tracing, TracingFailures

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
    retry = retry_headers(
        received, RetryLater(next_attempt=3, tier=1, delay=0.4), 2, "jobs", "work", "now", timestamp=None
    )
    suspect = unstarted_headers(received, Register(2), "work", "jobs", "work", "host", 1, "now", timestamp=None)
    handed_back = unstarted_headers(received, None, "work", "jobs", "work", "host", 1, "now", timestamp=None)
    quarantined = quarantine_headers(
        received, "exhausted", ("ValueError", "boom", ""), 2, queue="work", exchange="jobs", routing_key="work",
        job="flaky", job_id="j1", host="host", pid=1, version="0", app_version="1", now="2026-11-30T00:00:00.000Z",
        timestamp=None,
    )  # fmt: skip
    item = q.describe(quarantined, "j1", "flaky")
    replayed = q.replay_headers(quarantined, item, "replay-1", timestamp=None)
    # copy_headers.copy_headers is where every copy starts (a new copy path, e.g. park, too)
    for headers in (copy_headers.copy_headers(received, None), retry, suspect, handed_back, quarantined, replayed):
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

    context = Tracing()._extract(trace_carrier(headers)[0])
    assert not trace.get_current_span(context).get_span_context().is_valid


def test_a_traceparent_sent_as_bytes_is_read() -> None:
    from opentelemetry import trace

    context = Tracing()._extract(trace_carrier({"traceparent": TRACE["traceparent"].encode()})[0])
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
        Tracing().finished(ProcessSpan(span), outcome)
    attributes = dict(span.attributes or {})  # type: ignore[attr-defined]
    assert attributes.pop("error.type", None) == error
    reason = {"amqpjobs.reason": decision.reason} if isinstance(decision, Quarantine) else {}
    assert attributes == {"amqpjobs.job": "flaky", "amqpjobs.attempt": 2, "amqpjobs.outcome": kind, **reason}
    status = span.status  # type: ignore[attr-defined]
    expected = (StatusCode.ERROR, f"{failure[0]}: {failure[1]}") if error else (StatusCode.UNSET, None)
    assert (status.status_code, status.description) == expected


# ---------------------------------------------------------------------------- tracing never costs a job
class Exported:
    """A Tracing whose spans go to a provider of the test's own (not the global one)."""

    def __init__(self, sampler: Any = None) -> None:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        self.exporter = InMemorySpanExporter()
        provider = TracerProvider(sampler=sampler) if sampler is not None else TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracing = Tracing()
        self.tracing._tracer = provider.get_tracer("test")


def _outcome(decision: Decision | None = None) -> Outcome:
    return Outcome(decision=decision or Ack(), job="echo", job_id="j1", attempt=1, duration=0.0, acked=True)


def _process(tracing: Tracing, headers: dict[str, Any]) -> AbstractContextManager[ProcessSpan]:
    return tracing.processing("jobs", "work", "work", headers, "j1", 1)


class BrokenSampler:
    def should_sample(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("sampler broke")

    def get_description(self) -> str:
        return "broken"


def test_a_failing_sampler_leaves_enqueue_and_processing_without_a_span(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "amqpjobs.tracing")
    t = Exported(BrokenSampler())
    for _ in range(3):
        with t.tracing.sending("jobs", "work", "echo", "j1") as headers:
            assert headers == {}  # nothing current, no span: nothing to write
        with _process(t.tracing, dict(TRACE)) as process:
            assert process.span is None
            assert process.carry == {}
            t.tracing.finished(process, _outcome())
    assert t.exporter.get_finished_spans() == ()
    assert t.tracing.failures.counts == {"starting a span": 6}
    lines = [r.getMessage() for r in caplog.records if r.name == "amqpjobs.tracing"]
    assert len(lines) == 1
    assert lines[0].startswith("tracing: starting a span failed (RuntimeError: sampler broke)")


def test_a_failing_propagator_drops_the_headers_but_keeps_the_spans() -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise ValueError("propagator broke")

    t = Exported()
    t.tracing._propagate = SimpleNamespace(inject=broken, extract=broken)  # type: ignore[assignment]
    with t.tracing.sending("jobs", "work", "echo", "j1") as headers:
        assert headers == {}
    with _process(t.tracing, dict(TRACE)) as process:
        assert process.span is not None
        assert process.carry == {}  # no headers to carry: the copies keep the received ones
        t.tracing.finished(process, _outcome())
    assert [s.name for s in t.exporter.get_finished_spans()] == ["send jobs:work", "process jobs:work"]
    # the send's inject, the extract, and the inject of the process span's context for the copies
    # (the extract failed: the delivery reads as one without a traceparent)
    assert t.tracing.failures.counts == {"injecting trace headers": 2, "extracting trace headers": 1}


def test_a_span_that_fails_to_record_or_end_never_raises() -> None:
    from opentelemetry.trace import NonRecordingSpan, SpanContext

    class BrokenSpan(NonRecordingSpan):
        def set_attribute(self, key: str, value: Any) -> None:
            raise RuntimeError("set_attribute broke")

        def set_status(self, *args: Any, **kwargs: Any) -> None:
            raise RuntimeError("set_status broke")

        def end(self, end_time: int | None = None) -> None:
            raise RuntimeError("on_end broke")

    class BrokenTracer:
        def start_span(self, *args: Any, **kwargs: Any) -> BrokenSpan:
            return BrokenSpan(SpanContext(trace_id=1, span_id=2, is_remote=False))

    tracing = Tracing()
    tracing._tracer = BrokenTracer()  # type: ignore[assignment]
    with pytest.raises(KeyError), tracing.sending("jobs", "work", "echo", "j1"):
        raise KeyError("the enqueue's own error still comes out")
    with _process(tracing, {}) as process:
        tracing.finished(process, _outcome(Quarantine("exhausted")))
    assert tracing.failures.counts == {"setting span attributes": 2, "ending a span": 2}


@pytest.mark.parametrize(
    ("error", "name"),
    [(asyncio.CancelledError(), "asyncio.exceptions.CancelledError"), (KeyError("k"), "KeyError"),
     (ConnectionResetError("gone"), "ConnectionResetError")],
)  # fmt: skip
def test_any_exception_ending_a_send_span_makes_it_an_error(error: BaseException, name: str) -> None:
    from opentelemetry.trace import StatusCode

    t = Exported()
    with pytest.raises(type(error)), t.tracing.sending("jobs", "work", "echo", "j1"):
        raise error
    (span,) = t.exporter.get_finished_spans()
    assert (span.attributes or {})["error.type"] == name
    assert span.status.status_code is StatusCode.ERROR


def test_tracing_failures_are_logged_once_per_kind_then_once_per_period(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "amqpjobs.tracing")
    failures = TracingFailures(every=0.05)
    for _ in range(5):
        failures("starting a span", RuntimeError("a"))
    failures("ending a span", RuntimeError("b"))
    import time

    time.sleep(0.06)
    failures("starting a span", RuntimeError("a"))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3
    assert "(4 more since the last report)" in lines[2]
    assert failures.counts == {"starting a span": 6, "ending a span": 1}


# ---------------------------------------------------------------------------- what the worker reads and carries
@pytest.mark.parametrize(
    ("headers", "kept", "ignored"),
    [
        (TRACE, sorted(TRACE), []),
        ({"traceparent": "0" * 257}, [], ["traceparent"]),
        ({"tracestate": "a=" + "b" * 511}, [], ["tracestate"]),  # 513 characters
        ({"tracestate": ",".join(f"k{n}=v" for n in range(32))}, ["tracestate"], []),  # 32 members: fine
        ({"tracestate": ",".join(f"k{n}=v" for n in range(33))}, [], ["tracestate"]),
        ({"baggage": "k=" + "v" * 8190}, ["baggage"], []),  # 8192 bytes: fine
        ({"baggage": "k=" + "é" * 4096}, [], ["baggage"]),  # 8194 bytes in 4098 characters
        ({"baggage": 7, "traceparent": None}, [], []),  # not text: absent
        ({"baggage": "k=v\nWARNING:forged", "tracestate": "a=b"}, ["tracestate"], ["baggage"]),  # a control character
        ({"tracestate": "a=b\r", "traceparent": TRACE["traceparent"]}, ["traceparent"], ["tracestate"]),
        ({"traceparent": bytearray(b"00-\xc2\x85-01")}, [], ["traceparent"]),  # C1 (NEL, in UTF-8)
        ({"baggage": "k=v\u2028x"}, [], ["baggage"]),  # a line separator
        ({"baggage": "k=v\t,k2=v2"}, ["baggage"], []),  # a tab is a blank W3C allows
    ],
)
def test_the_worker_reads_trace_headers_within_the_w3c_limits(
    headers: dict[str, Any], kept: Sequence[str], ignored: Sequence[str]
) -> None:
    carrier, dropped = trace_carrier(headers)
    assert sorted(carrier) == sorted(kept)
    assert dropped == list(ignored)
    assert set(HEADER_LIMITS) == set(TRACE)


def test_the_workers_extraction_keeps_tracestate_and_baggage() -> None:
    from opentelemetry import baggage, trace

    context = Tracing()._extract(trace_carrier(TRACE)[0])
    span = trace.get_current_span(context).get_span_context()
    assert span.trace_state.to_header() == "vendor=opaque"
    assert baggage.get_baggage("region", context) == "eu"


def test_a_delivery_without_a_traceparent_carries_its_process_span_to_its_copies() -> None:
    from opentelemetry import trace

    t = Exported()
    with _process(t.tracing, {"baggage": "team=blue"}) as process:
        assert process.span is not None
        ctx = process.span.get_span_context()
        assert process.carry == {"traceparent": f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}",
                                 "baggage": "team=blue"}  # fmt: skip
        assert trace.get_current_span() is process.span
    with _process(t.tracing, dict(TRACE)) as process:
        assert process.carry == {}  # it has one: the copies keep it


class _BadStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text")


@pytest.mark.parametrize(("error", "description"), [
    (_BadStr(), f"{__name__}._BadStr: (the message could not be rendered: str() raised RuntimeError: no text)"),
    (ValueError("/data/\udcff.csv"), "ValueError: /data/?.csv"),
], ids=["raising-str", "surrogate"])  # fmt: skip
def test_a_send_span_ended_by_odd_text_keeps_the_error_and_says_it_encodably(
    error: BaseException, description: str
) -> None:
    """The enqueue's own exception comes out (not the one its str() raised); the status text is encodable."""
    t = Exported()
    with pytest.raises(type(error)), t.tracing.sending("jobs", "work", "echo", "j1"):
        raise error
    (span,) = t.exporter.get_finished_spans()
    assert span.status.description == description


def test_malformed_trace_headers_on_every_delivery_log_once_a_period_not_once_each(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """OpenTelemetry warns about each malformed ``baggage``/``tracestate`` it reads: a foreign publisher's on
    every delivery would flood the log. The worker's reads say so through its failure log (one line a period,
    counted); OpenTelemetry's own warnings outside the worker's reads are left as they are (helper-175)."""
    tracing = Tracing()
    bad = {"traceparent": TRACE["traceparent"], "tracestate": "a=1,!!!=2", "baggage": "no equals sign here"}
    with caplog.at_level(logging.WARNING):
        for _ in range(50):
            tracing._extract(trace_carrier(bad)[0])
    lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.name for r in lines] == ["amqpjobs.tracing"], [r.getMessage() for r in lines]
    assert "reading a delivery's trace headers failed" in lines[0].getMessage()
    assert "no equals sign here" in lines[0].getMessage() or "!!!" in lines[0].getMessage()
    assert tracing.failures.counts["reading a delivery's trace headers"] >= 50
    caplog.clear()
    from opentelemetry.baggage.propagation import W3CBaggagePropagator

    with caplog.at_level(logging.WARNING):  # the same read by other code of the process: OpenTelemetry's line stays
        W3CBaggagePropagator().extract({"baggage": "no equals sign here"})
    assert [r.name for r in caplog.records] == ["opentelemetry.baggage.propagation"]
