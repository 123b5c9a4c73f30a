"""The headers a copy of a received job starts from: what the broker owns is left out.

Every copy we republish (retry tier, quarantine, suspects, hand-back, replay, park) is a new
message: the broker's dead-lettering headers and delivery counters are stripped, a tenant
header naming no tenant is dropped and the first enqueue time is kept (README "Wire format").
Pure: no client library, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from amqpjobs.jobs.decided import DECIDED
from amqpjobs.jobs.envelope import ACQUIRED_COUNT, DELIVERY_COUNT, ENQUEUED_AT, TENANT, iso_utc, tenant_of
from amqpjobs.jobs.timestamps import decoded_time, parse_time

#: Headers the broker owns; stripped from every copy we republish (a copied ``x-death``
#: is ignored by 3.13+ and can make older brokers drop the copy as a dead-letter cycle; a
#: copy is a new message, whose counters start again).
BROKER_HEADER_PREFIXES: Final = ("x-death", "x-first-death-", "x-last-death-", DELIVERY_COUNT, ACQUIRED_COUNT)


def strip_broker_headers(headers: Mapping[str, Any]) -> dict[str, Any]:
    """Copy ``headers`` without the broker's dead-lettering headers (``x-death`` & co)."""
    return {k: v for k, v in headers.items() if not k.startswith(BROKER_HEADER_PREFIXES)}


def copy_headers(headers: Mapping[str, Any], timestamp: float | None) -> dict[str, Any]:
    """The headers a copy of a received job (tier, quarantine, replay) starts from.

    :func:`strip_broker_headers`, and an ``amqpjobs-tenant`` that names no tenant
    (:func:`~amqpjobs.jobs.envelope.tenant_of`) left out: absent stays absent, and a foreign
    ``""`` becomes absent. A kept decision's ``amqpjobs-decided`` is left out too
    (:mod:`amqpjobs.jobs.decided`): a replayed, parked or unparked copy runs normally.
    Every other header is kept as received (same object: same type,
    same bytes), the trace context (:data:`~amqpjobs.jobs.envelope.TRACE_HEADERS`) among
    them: every copy stays in the trace of its enqueue.

    The first enqueue time is kept in ``amqpjobs-enqueued-at``: a copy's ``timestamp`` is
    when it becomes ready in its work queue (:func:`~amqpjobs.jobs.envelope.ready_at`), so
    when the header is missing or unreadable (a foreign publisher's job:
    :func:`~amqpjobs.jobs.envelope.enqueued_at_of` read the ``timestamp``), it is written
    from ``timestamp``, the received ``timestamp`` property already decoded to seconds
    (``Delivery.timestamp``: :func:`~amqpjobs.jobs.timestamps.decoded_time`, not the unit rule again).
    """
    out = strip_broker_headers(headers)
    out.pop(DECIDED, None)
    if TENANT in out and tenant_of(out[TENANT]) is None:
        del out[TENANT]
    if parse_time(out.get(ENQUEUED_AT)) is None and (first := decoded_time(timestamp)) is not None:
        out[ENQUEUED_AT] = iso_utc(first.timestamp())
    return out
