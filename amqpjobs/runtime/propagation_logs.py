"""OpenTelemetry's warnings about a delivery's malformed trace headers, held into the worker's tracing failure log.

OpenTelemetry's propagators log a WARNING for each malformed ``baggage`` or ``tracestate`` they
read: a foreign publisher's on every message would be a line per delivery. While a worker's
:class:`~amqpjobs.runtime.tracing.Tracing` reads a delivery's headers (:func:`warnings_into`),
those records go to its failure log instead (one line a period, counted); from any other code
of the process they pass as they are.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Final

from amqpjobs.printable import printable

#: OpenTelemetry's loggers that warn about a malformed ``traceparent``, ``tracestate`` or ``baggage`` read.
PROPAGATION_LOGGERS: Final = (
    "opentelemetry.baggage.propagation", "opentelemetry.trace.span", "opentelemetry.trace.propagation.tracecontext",
)  # fmt: skip

#: The failure log (a ``TracingFailures``) of the ``Tracing`` reading a delivery's trace headers in this task, if any.
_READING: ContextVar[Callable[..., None] | None] = ContextVar("amqpjobs_reading_trace_headers", default=None)


class _WhileReading(logging.Filter):
    """Takes what OpenTelemetry warns while a worker reads a delivery's trace headers into its failure log.

    A foreign publisher's malformed ``baggage`` or ``tracestate`` on every message would otherwise
    be a warning per delivery; the failure log says it once a period, counted. Outside a worker's
    read (another library of the process extracting) the record passes as it is.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        failures = _READING.get()
        if failures is None:
            return True
        try:
            said = record.getMessage()
        except Exception:  # a record whose arguments don't fit its format: its format says enough
            said = str(record.msg)
        failures("reading a delivery's trace headers", detail=f"OpenTelemetry: {printable(said[:300])}")
        return False


def hold_propagation_warnings() -> None:
    """Put :class:`_WhileReading` on OpenTelemetry's propagation loggers, once per process."""
    for name in PROPAGATION_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _WhileReading) for f in logger.filters):
            logger.addFilter(_WhileReading())


@contextmanager
def warnings_into(failures: Callable[..., None]) -> Iterator[None]:
    """Within the block (this task or thread only), OpenTelemetry's propagation warnings go to ``failures``.

    ``failures`` is called as ``failures(kind, detail=text)`` (a :class:`~amqpjobs.runtime.tracing.TracingFailures`).
    """
    reading = _READING.set(failures)
    try:
        yield
    finally:
        _READING.reset(reading)
