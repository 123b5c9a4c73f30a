"""Trace-context rules without I/O: destination names of spans, and which trace headers a worker reads.

Used by :mod:`amqpjobs.runtime.tracing` (README "Tracing"); nothing here imports OpenTelemetry.
Destination names follow the OpenTelemetry semantic conventions for RabbitMQ
(``model/messaging/rabbitmq.yaml``); header limits follow W3C Trace Context and W3C Baggage.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from amqpjobs.jobs.envelope import BAGGAGE, TRACEPARENT, TRACESTATE
from amqpjobs.text import as_text

#: The longest trace header read from a delivery, per header (longer: ignored, as if absent).
#: ``traceparent`` version 00 is 55 characters (W3C Trace Context, "traceparent Header"; 256
#: leaves room for later versions); ``tracestate``: 32 list-members at most, and vendors
#: propagate at least 512 characters (W3C Trace Context, "tracestate Header" / "Limits");
#: ``baggage``: 8192 bytes (W3C Baggage, "Limits").
HEADER_LIMITS: Final = {TRACEPARENT: 256, TRACESTATE: 512, BAGGAGE: 8192}
#: The most list-members a ``tracestate`` may hold (W3C Trace Context, "tracestate Header").
TRACESTATE_MEMBERS: Final = 32
#: A control character (C0 but the tab, DEL, C1) or a line separator: no W3C trace header holds
#: one (they are printable ASCII, blanks and tabs), and the propagators log what they can't parse
#: as it is, so a foreign ``baggage: "k=v\nWARNING:..."`` would forge a log line.
_CONTROL: Final = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")


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


def trace_carrier(headers: Mapping[str, Any]) -> tuple[dict[str, str], list[str]]:
    """The trace headers of a delivery to extract from, and the names of those ignored (too long, control characters).

    Only text (str, or bytes read as UTF-8) within :data:`HEADER_LIMITS` (a ``tracestate`` of at
    most :data:`TRACESTATE_MEMBERS` members) and without a control character is kept; anything
    else reads as absent. Each header is judged alone.
    """
    carrier: dict[str, str] = {}
    ignored: list[str] = []
    for name, limit in HEADER_LIMITS.items():
        value = headers.get(name)
        if not isinstance(value, str | bytes | bytearray):
            continue
        size = len(value.encode() if isinstance(value, str) else value)
        text = as_text(value) if size <= limit else ""
        if size > limit or (name == TRACESTATE and text.count(",") >= TRACESTATE_MEMBERS) or _CONTROL.search(text):
            ignored.append(name)
            continue
        carrier[name] = text
    return carrier, ignored
