"""OpenTelemetry tracing of jobs: a PRODUCER span per enqueue, a CONSUMER span per delivery processed.

On only with the ``amqpjobs[otel]`` extra installed and ``App(..., tracing=True)`` (README
"Tracing"); nothing here imports ``opentelemetry`` before :class:`Tracing` is built, so an app
without tracing never loads it, and the worker's only cost is one ``app.tracing is None`` check
per delivery. Spans go to the globally configured TracerProvider.

The trace context travels in text headers (:data:`~amqpjobs.jobs.envelope.TRACE_HEADERS`):
W3C ``traceparent`` / ``tracestate`` and ``baggage``, written and read by the global propagator
(``OTEL_PROPAGATORS``; default tracecontext and baggage). This module is the one place that
injects and extracts them. Retry, quarantine, suspects and replay copies keep them as the
enqueue wrote them (:func:`amqpjobs.jobs.envelope.copy_headers`), so every attempt of a job,
its quarantine and its replay are children of the one ``send`` span of its enqueue.

Attributes and names follow the OpenTelemetry semantic conventions for messaging spans and
RabbitMQ in version :data:`SEMCONV_VERSION` (status: Development), ``model/messaging/rabbitmq.yaml``:

* ``send <destination>``, kind PRODUCER: destination ``{exchange}:{routing key}`` (only the
  non-empty one of the two; ``amq.default`` for the default exchange without a routing key);
* ``process <destination>``, kind CONSUMER: destination ``{exchange}:{routing key}:{queue}``,
  empty parts left out and the queue left out when it equals the routing key. Its parent is the
  producer's context from the headers and it also links to it (the conventions require the link
  and allow the parent; a parent keeps the job's whole life in one trace). Headers without a
  valid ``traceparent`` (none, or malformed from a foreign publisher) start a new trace.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Final

from amqpjobs._version import __version__
from amqpjobs.errors import ConfigurationError
from amqpjobs.jobs import envelope
from amqpjobs.jobs.outcome import Outcome
from amqpjobs.jobs.quarantine import REPLAY_COUNT
from amqpjobs.text import as_text

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.propagators.textmap import Getter
    from opentelemetry.trace import Span, Tracer

#: The version of the OpenTelemetry semantic conventions the spans follow.
SEMCONV_VERSION: Final = "1.44.0"

#: Our own span attributes (beside the conventions' ``messaging.*`` and ``error.type``).
JOB: Final = "amqpjobs.job"
ATTEMPT: Final = "amqpjobs.attempt"
OUTCOME: Final = "amqpjobs.outcome"
REPLAYS: Final = "amqpjobs.replay_count"

INSTALL_HINT: Final = "pip install 'amqpjobs[otel]'"


def producer_destination(exchange: str, routing_key: str) -> str:
    """``messaging.destination.name`` of a publish: ``{exchange}:{routing key}`` (RabbitMQ conventions)."""
    if exchange and routing_key:
        return f"{exchange}:{routing_key}"
    return exchange or routing_key or "amq.default"


def consumer_destination(exchange: str, routing_key: str, queue: str) -> str:
    """``messaging.destination.name`` of a delivery: ``{exchange}:{routing key}:{queue}`` (RabbitMQ conventions).

    Empty parts are left out, and the queue when it equals the routing key (a copy sent to its
    work queue through the default exchange is just ``<queue>``).
    """
    parts = [exchange, routing_key] + ([queue] if queue != routing_key else [])
    return ":".join(p for p in parts if p)


def _header_getter() -> Getter[Mapping[str, Any]]:
    """A propagator getter reading a header as text: str, or UTF-8 bytes (an AMQP long string); else absent."""
    from opentelemetry.propagators.textmap import Getter

    class HeaderGetter(Getter[Mapping[str, Any]]):
        def get(self, carrier: Mapping[str, Any], key: str) -> list[str] | None:
            value = carrier.get(key)
            return [as_text(value)] if isinstance(value, str | bytes | bytearray) else None

        def keys(self, carrier: Mapping[str, Any]) -> list[str]:
            return list(carrier)

    return HeaderGetter()


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
        # before a global provider is set, the API hands out a proxy that uses the provider once it is set
        self._tracer: Tracer = trace.get_tracer(
            "amqpjobs", __version__, schema_url=f"https://opentelemetry.io/schemas/{SEMCONV_VERSION}"
        )

    @contextmanager
    def sending(self, exchange: str, routing_key: str, job: str, job_id: str) -> Iterator[dict[str, str]]:
        """A PRODUCER span ``send <exchange>:<routing key>`` around an enqueue; yields the headers to add.

        The yielded dict holds ``traceparent`` (and ``tracestate``, ``baggage`` when there are
        any) for the span itself. An exception ending the block sets ``error.type`` (its class
        name) and the span's status, and is re-raised.
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
        kind = self._trace.SpanKind.PRODUCER
        with self._tracer.start_as_current_span(f"send {destination}", kind=kind, attributes=attributes) as span:
            headers: dict[str, str] = {}
            self._propagate.inject(headers)  # the default setter: carrier[key] = value
            try:
                yield headers
            except BaseException as exc:
                span.set_attribute("error.type", type(exc).__qualname__)
                raise

    def _extract(self, headers: Mapping[str, Any]) -> Context:
        """The context in ``headers`` (an empty one when they hold none, or garbage: never raises)."""
        try:
            return self._propagate.extract(headers, context=self._context.Context(), getter=self._getter)
        except Exception:  # a propagator must not fail a job over a foreign header
            return self._context.Context()

    @contextmanager
    def processing(
        self, exchange: str, routing_key: str, queue: str, headers: Mapping[str, Any], message_id: str | None,
        delivery_tag: int,
    ) -> Iterator[Span]:  # fmt: skip
        """A CONSUMER span ``process <exchange>:<routing key>:<queue>`` around one delivery, current inside.

        Its parent and its one link are the producer's context from ``headers``; without a valid
        one it starts a new trace. Inside, the context from ``headers`` (its baggage too) replaces
        whatever was current. Call :meth:`finished` with the delivery's outcome before the block ends.
        """
        parent = self._extract(headers)
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
        replays = envelope.header_int(headers.get(REPLAY_COUNT))
        if replays:
            attributes[REPLAYS] = replays
        token = self._context.attach(parent)  # the producer's baggage too, for the handler
        try:
            with self._tracer.start_as_current_span(
                f"process {destination}", kind=self._trace.SpanKind.CONSUMER, attributes=attributes, links=links
            ) as span:
                yield span
        finally:
            self._context.detach(token)

    def finished(self, span: Span, outcome: Outcome) -> None:
        """Record ``outcome`` on a ``process`` span: job, attempt, outcome, and ``error.type`` with an error status.

        A failure is an error unless the job was ``deferred``: it waits, using no attempt, for
        another worker's claim on its key or for the ledger (the reason stays in the outcome).
        """
        kind = outcome.kind
        span.set_attribute(JOB, outcome.job)
        span.set_attribute(ATTEMPT, outcome.attempt)
        span.set_attribute(OUTCOME, kind)
        if outcome.failure[0] and kind != "deferred":
            span.set_attribute("error.type", outcome.failure[0])
            span.set_status(self._trace.StatusCode.ERROR, outcome.error or outcome.failure[0])


def tracing_for(enabled: bool) -> Tracing | None:
    """A :class:`Tracing` when ``enabled``, else None (nothing imported).

    Raises:
        ConfigurationError: ``enabled`` and OpenTelemetry is not installed.

    """
    return Tracing() if enabled else None
