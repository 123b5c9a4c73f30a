"""OpenTelemetry tracing of jobs: a PRODUCER span per enqueue, a CONSUMER span per delivery processed.

On only with the ``amqpjobs[otel]`` extra installed and ``App(..., tracing=True)`` (README
"Tracing"); nothing here imports ``opentelemetry`` before :class:`Tracing` is built, so an app
without tracing never loads it, and the worker's only cost is one ``app.tracing is None`` check
per delivery. Spans go to the globally configured TracerProvider.

The trace context travels in text headers (:data:`~amqpjobs.jobs.envelope.TRACE_HEADERS`):
W3C ``traceparent`` / ``tracestate`` and ``baggage``, written and read by the global propagator
(``OTEL_PROPAGATORS``; default tracecontext and baggage). This module is the one place that
injects and extracts them. Retry, quarantine, suspects and replay copies keep them as the
enqueue wrote them (:func:`amqpjobs.jobs.copy_headers.copy_headers`), so every attempt of a job,
its quarantine and its replay are children of the one ``send`` span of its enqueue. A delivery
without a valid ``traceparent`` (a cron tick before tracing, a foreign publisher) starts a trace
at its first ``process`` span, whose context the worker writes into its copies
(:attr:`ProcessSpan.carry`), so the later attempts join that trace.

Tracing never costs a job: a failure of the SDK, a span processor, a sampler or a propagator
(start, attributes, end, inject, extract) is caught here and logged once per kind and minute
(:data:`FAILURE_LOG_EVERY`); the job runs and is settled without the span, and an enqueue goes
out without trace headers.

Attributes and names follow the OpenTelemetry semantic conventions for messaging spans and
RabbitMQ in version :data:`SEMCONV_VERSION` (status: Development), ``model/messaging/rabbitmq.yaml``:

* ``send <destination>``, kind PRODUCER: destination ``{exchange}:{routing key}`` (only the
  non-empty one of the two; ``amq.default`` for the default exchange without a routing key);
* ``process <destination>``, kind CONSUMER: destination ``{exchange}:{routing key}:{queue}``,
  empty parts left out and the queue left out when it equals the routing key. Its parent is the
  producer's context from the headers and it also links to it (the conventions require the link
  and allow the parent; a parent keeps the job's whole life in one trace). Headers without a
  valid ``traceparent`` (none, or malformed from a foreign publisher) start a new trace.
* ``error.type``: the exception's fully-qualified type name as a Python traceback prints it
  (``amqpjobs.errors.UnroutableError``, ``myapp.errors.Gone``; builtins bare: ``KeyError``),
  the same name quarantine evidence keeps (:func:`amqpjobs.jobs.failure.qualname`).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from amqpjobs._version import __version__
from amqpjobs.errors import ConfigurationError
from amqpjobs.jobs import envelope
from amqpjobs.jobs.failure import message_of, qualname
from amqpjobs.jobs.outcome import Outcome, Quarantine
from amqpjobs.jobs.quarantine import REPLAY_COUNT
from amqpjobs.jobs.tracecontext import consumer_destination, producer_destination, trace_carrier
from amqpjobs.runtime.propagation_logs import hold_propagation_warnings, warnings_into

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.propagators.textmap import Getter
    from opentelemetry.trace import Span, Tracer

log = logging.getLogger("amqpjobs.tracing")

#: The version of the OpenTelemetry semantic conventions the spans follow.
SEMCONV_VERSION: Final = "1.44.0"

#: Our own span attributes (beside the conventions' ``messaging.*``, ``server.*`` and ``error.type``).
JOB: Final = "amqpjobs.job"
ATTEMPT: Final = "amqpjobs.attempt"
OUTCOME: Final = "amqpjobs.outcome"
REASON: Final = "amqpjobs.reason"
REPLAYS: Final = "amqpjobs.replay_count"

INSTALL_HINT: Final = "pip install 'amqpjobs[otel]'"

#: Seconds between two log lines about tracing failures of one kind (the others are counted).
FAILURE_LOG_EVERY: Final = 60.0


def _header_getter() -> Getter[Mapping[str, str]]:
    """A propagator getter over :func:`trace_carrier`'s dict."""
    from opentelemetry.propagators.textmap import Getter

    class HeaderGetter(Getter[Mapping[str, str]]):
        def get(self, carrier: Mapping[str, str], key: str) -> list[str] | None:
            value = carrier.get(key)
            return None if value is None else [value]

        def keys(self, carrier: Mapping[str, str]) -> list[str]:
            return list(carrier)

    return HeaderGetter()


class TracingFailures:
    """Logs tracing failures: the first of a kind at once, then at most one line per kind a minute.

    A broken span processor fails on every message; one line a minute (with how many were
    not logged) says so without flooding the log.
    """

    def __init__(self, every: float = FAILURE_LOG_EVERY) -> None:
        self.every = every
        self.counts: Counter[str] = Counter()  # failures of each kind since start
        self._next: dict[str, float] = {}
        self._unlogged: Counter[str] = Counter()

    def __call__(self, kind: str, exc: BaseException | None = None, detail: str = "") -> None:
        """Count a failure of ``kind`` (``start``, ``end``, ``inject``, ...); log it unless one was logged lately."""
        self.counts[kind] += 1
        now = time.monotonic()
        if now < self._next.get(kind, 0.0):
            self._unlogged[kind] += 1
            return
        self._next[kind] = now + self.every
        unlogged = self._unlogged.pop(kind, 0)
        more = f" ({unlogged} more since the last report)" if unlogged else ""
        why = f"{qualname(exc)}: {message_of(exc)[:300]}" if exc is not None else detail
        log.warning(
            "tracing: %s failed (%s)%s; jobs run without this span or header; next report of this kind in %gs at "
            "the soonest", kind, why, more, self.every, exc_info=exc,
        )  # fmt: skip


@dataclass
class ProcessSpan:
    """The ``process`` span of one delivery, as :meth:`Tracing.processing` yields it.

    Attributes:
        span: The span, or None when it could not be started (a tracing failure, logged).
        carry: Trace headers to write into the delivery's copies (retry, quarantine, suspects,
            hand-back) instead of the received ones: this span's context when the delivery had
            no valid ``traceparent``, so later attempts join this trace; empty otherwise.

    """

    span: Span | None
    carry: dict[str, str] = field(default_factory=dict)


class Tracing:
    """Makes the spans of an app with ``tracing=True`` (see the module docstring).

    Raises:
        ConfigurationError: ``opentelemetry-api`` is not installed (``pip install 'amqpjobs[otel]'``).

    """

    def __init__(self) -> None:
        try:
            from opentelemetry import context, propagate, trace
        except ImportError as exc:
            raise ConfigurationError(
                f"App(tracing=True) needs OpenTelemetry, which is not installed ({exc}); {INSTALL_HINT}, "
                "or leave tracing off"
            ) from None
        self._context = context
        self._propagate = propagate
        self._trace = trace
        self._getter = _header_getter()
        self.failures = TracingFailures()
        hold_propagation_warnings()
        # before a global provider is set, the API hands out a proxy that uses the provider once it is set
        self._tracer: Tracer = trace.get_tracer(
            "amqpjobs", __version__, schema_url=f"https://opentelemetry.io/schemas/{SEMCONV_VERSION}"
        )

    def _start(
        self, name: str, kind: Any, attributes: dict[str, str | int], parent: Context | None = None, links: Any = None
    ) -> Span | None:
        try:
            return self._tracer.start_span(name, context=parent, kind=kind, attributes=attributes, links=links)
        except Exception as exc:
            self.failures("starting a span", exc)
            return None

    def _end(self, span: Span | None) -> None:
        if span is None:
            return
        try:
            span.end()
        except Exception as exc:
            self.failures("ending a span", exc)

    def _attach(self, ctx: Context) -> object | None:
        try:
            return self._context.attach(ctx)
        except Exception as exc:
            self.failures("attaching a context", exc)
            return None

    def _detach(self, token: object | None) -> None:
        if token is None:
            return
        try:
            self._context.detach(token)  # type: ignore[arg-type]
        except Exception as exc:
            self.failures("detaching a context", exc)

    def _inject(self, ctx: Context) -> dict[str, str]:
        """The trace headers of ``ctx`` (none when the propagator fails)."""
        headers: dict[str, str] = {}
        try:
            self._propagate.inject(headers, context=ctx)  # the default setter: carrier[key] = value
        except Exception as exc:
            self.failures("injecting trace headers", exc)
            return {}
        return {k: v for k, v in headers.items() if isinstance(k, str) and isinstance(v, str)}

    def _mark_error(self, span: Span | None, error_type: str, description: str) -> None:
        if span is None:
            return
        try:
            span.set_attribute("error.type", error_type)
            span.set_status(self._trace.StatusCode.ERROR, description)
        except Exception as exc:
            self.failures("setting span attributes", exc)

    @contextmanager
    def sending(
        self, exchange: str, routing_key: str, job: str, job_id: str, server: tuple[str, int] | None = None,
        root: bool = False,
    ) -> Iterator[dict[str, str]]:  # fmt: skip
        """A PRODUCER span ``send <exchange>:<routing key>`` around an enqueue; yields the headers to add.

        The yielded dict holds ``traceparent`` (and ``tracestate``, ``baggage`` when there are
        any) of the span itself; empty when tracing failed (logged). Any exception ending the
        block (``asyncio.CancelledError`` too) sets ``error.type`` and an ``ERROR`` status, and is
        re-raised. ``server``: host and port of the broker node the connection uses. ``root``:
        the span starts a trace and is not made current (the scheduler's spans for one
        transaction are siblings, not each other's children).
        """
        destination = producer_destination(exchange, routing_key)
        attributes: dict[str, str | int] = {
            "messaging.system": "rabbitmq",
            "messaging.operation.name": "send",
            "messaging.operation.type": "send",
            "messaging.destination.name": destination,
            "messaging.message.id": job_id,
            JOB: job,
            ATTEMPT: 1,
        }
        if routing_key:
            attributes["messaging.rabbitmq.destination.routing_key"] = routing_key
        if server is not None:
            attributes["server.address"], attributes["server.port"] = server
        parent = self._context.Context() if root else None
        span = self._start(f"send {destination}", self._trace.SpanKind.PRODUCER, attributes, parent)
        current = None if span is None else self._trace.set_span_in_context(span, parent)
        token = None if current is None or root else self._attach(current)
        try:  # without a span (it failed to start), what is current: the caller's context
            yield self._inject(current or (parent if parent is not None else self._context.get_current()))
        except BaseException as exc:
            self._mark_error(span, qualname(exc), f"{qualname(exc)}: {message_of(exc)}"[:300])
            raise
        finally:
            self._detach(token)
            self._end(span)

    def at_server(self, server: tuple[str, int] | None) -> None:
        """Set ``server.address`` / ``server.port`` on the current span (an enqueue's, once connected)."""
        if server is None:
            return
        try:
            span = self._trace.get_current_span()
            span.set_attribute("server.address", server[0])
            span.set_attribute("server.port", server[1])
        except Exception as exc:
            self.failures("setting span attributes", exc)

    def _extract(self, carrier: Mapping[str, str]) -> Context:
        """The context in ``carrier`` (an empty one when it holds none, or garbage: never raises).

        What OpenTelemetry warns about the headers meanwhile goes to :attr:`failures` (one line a period).
        """
        with warnings_into(self.failures):
            try:
                return self._propagate.extract(carrier, context=self._context.Context(), getter=self._getter)
            except Exception as exc:  # a propagator must not fail a job over a foreign header
                self.failures("extracting trace headers", exc)
                return self._context.Context()

    @contextmanager
    def processing(
        self, exchange: str, routing_key: str, queue: str, headers: Mapping[str, Any], message_id: str | None,
        delivery_tag: int, correlation_id: str | None = None, server: tuple[str, int] | None = None,
    ) -> Iterator[ProcessSpan]:  # fmt: skip
        """A CONSUMER span ``process <exchange>:<routing key>:<queue>`` around one delivery, current inside.

        Its parent and its one link are the producer's context from ``headers``; without a valid
        one it starts a new trace (and :attr:`ProcessSpan.carry` holds its context for the
        copies). Trace headers over :data:`~amqpjobs.jobs.tracecontext.HEADER_LIMITS`, or with
        a control character, are ignored. Inside, the context from ``headers`` (its baggage too) replaces whatever was
        current. Call :meth:`finished` with the delivery's outcome before the block ends. Never
        raises for tracing's own failures (logged; the block then runs with ``span`` None).
        """
        carrier, ignored = trace_carrier(headers)
        if ignored:
            why = "over the W3C size limits or holding a control character"
            self.failures("reading trace headers", detail=f"ignored {', '.join(ignored)}: {why}")
        parent = self._extract(carrier)
        producer = self._trace.get_current_span(parent).get_span_context()
        links = [self._trace.Link(producer)] if producer.is_valid else None
        destination = consumer_destination(exchange, routing_key, queue)
        attributes: dict[str, str | int] = {
            "messaging.system": "rabbitmq",
            "messaging.operation.name": "process",
            "messaging.operation.type": "process",
            "messaging.destination.name": destination,
            "messaging.rabbitmq.message.delivery_tag": delivery_tag,
        }
        if routing_key:
            attributes["messaging.rabbitmq.destination.routing_key"] = routing_key
        if message_id:
            attributes["messaging.message.id"] = message_id
        if correlation_id:
            attributes["messaging.message.conversation_id"] = correlation_id
        if server is not None:
            attributes["server.address"], attributes["server.port"] = server
        replays = envelope.header_int(headers.get(REPLAY_COUNT))
        if replays:
            attributes[REPLAYS] = replays
        span = self._start(f"process {destination}", self._trace.SpanKind.CONSUMER, attributes, parent, links)
        # current inside: the span, and the producer's baggage for the handler
        current = parent if span is None else self._trace.set_span_in_context(span, parent)
        carry = self._inject(current) if span is not None and not producer.is_valid else {}
        token = self._attach(current)
        try:
            yield ProcessSpan(span, carry)
        finally:
            self._detach(token)
            self._end(span)

    def finished(self, process: ProcessSpan, outcome: Outcome) -> None:
        """Record ``outcome`` on a ``process`` span: job, attempt, outcome, ``error.type`` with an error status.

        A failure is an error unless the job was ``deferred``: it waits, using no attempt, for
        another worker's claim on its key or for the ledger (the reason stays in the outcome).
        A quarantined job's reason goes in ``amqpjobs.reason``. Never raises (failures logged).
        """
        span = process.span
        if span is None:
            return
        kind = outcome.kind
        try:
            span.set_attribute(JOB, outcome.job)
            span.set_attribute(ATTEMPT, outcome.attempt)
            span.set_attribute(OUTCOME, kind)
            if isinstance(outcome.decision, Quarantine):
                span.set_attribute(REASON, outcome.decision.reason)
        except Exception as exc:
            self.failures("setting span attributes", exc)
        if outcome.failure[0] and kind != "deferred":
            self._mark_error(span, outcome.failure[0], outcome.error or outcome.failure[0])


def tracing_for(enabled: bool) -> Tracing | None:
    """A :class:`Tracing` when ``enabled``, else None (nothing imported).

    Raises:
        ConfigurationError: ``enabled`` is not a bool (``"false"`` would be true), or it is True and
            OpenTelemetry is not installed.

    """
    if not isinstance(enabled, bool):
        raise ConfigurationError(
            f"App(tracing=...) must be True or False (got {type(enabled).__name__} {enabled!r}): for an "
            "environment variable, compare it, e.g. tracing=os.environ.get('AMQPJOBS_TRACING') == '1'"
        )
    return Tracing() if enabled else None
