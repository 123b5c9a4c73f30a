"""The wire format of a job message, as plain data (no client library).

A job message is (README "Wire format"):

* body: the payload as UTF-8 JSON (an object), ``content_type = application/json``,
  no ``content_encoding``;
* ``message_id`` = job id, ``type`` = job name, ``timestamp`` = enqueue time (seconds),
  ``delivery_mode = 2`` (persistent), ``priority`` always set (0 unless given: a RabbitMQ 4.3
  quorum queue counts a message without one as 4, release notes 4.3.0);
* our headers, all named ``amqpjobs-*`` (never ``x-*``: since RabbitMQ 3.13 those belong
  to the broker), listed in :data:`HEADERS`.

Decoding is strict and never raises anything but :class:`DecodeError`, whose ``reason``
says where a message that cannot be decoded goes (quarantine reason): the body's, in
:mod:`amqpjobs.jobs.body_decoding`.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any, Final

from amqpjobs.jobs.body_decoding import DecodeError as DecodeError  # re-exported: its home was here
from amqpjobs.jobs.body_decoding import decode_body as decode_body  # re-exported
from amqpjobs.jobs.header_names import header_problem
from amqpjobs.jobs.header_values import read_count, read_text, type_problem
from amqpjobs.jobs.json_fast import MAX_JSON_DEPTH as MAX_JSON_DEPTH  # re-exported
from amqpjobs.jobs.json_values import encode_payload as encode_payload  # re-exported
from amqpjobs.jobs.timestamps import decoded_time, parse_time
from amqpjobs.jobs.timestamps import iso_utc as iso_utc  # re-exported
from amqpjobs.message import CONTENT_TYPE as CONTENT_TYPE  # re-exported
from amqpjobs.message import OutgoingMessage as OutgoingMessage  # re-exported
from amqpjobs.text import as_text, lone_surrogate

ATTEMPT: Final = "amqpjobs-attempt"
JOB: Final = "amqpjobs-job"
TENANT: Final = "amqpjobs-tenant"
ENQUEUED_AT: Final = "amqpjobs-enqueued-at"
FIRST_FAILURE_AT: Final = "amqpjobs-first-failure-at"
ORIGINAL_EXCHANGE: Final = "amqpjobs-original-exchange"
ORIGINAL_ROUTING_KEY: Final = "amqpjobs-original-routing-key"
RUNS: Final = "amqpjobs-runs"
PAYLOAD_REF: Final = "amqpjobs-payload-ref"

#: Our own headers and what they hold. Evidence headers are in :mod:`amqpjobs.jobs.evidence`.
HEADERS: Final = {
    ATTEMPT: "int: the attempt this delivery is (1 for a fresh job); missing = 1",
    JOB: "str: job name when the 'type' property can't be set (the property wins)",
    TENANT: "str: tenant key, optional",
    ENQUEUED_AT: "str: first enqueue time, ISO-8601 UTC; kept across retries",
    FIRST_FAILURE_AT: "str: time of the first failure, ISO-8601 UTC; set on retried copies",
    ORIGINAL_EXCHANGE: "str: exchange the job was first published to; set on retried copies",
    ORIGINAL_ROUTING_KEY: "str: routing key it was first published with; set on retried copies",
    RUNS: "int: handler runs of the job so far; set by the worker on its copies; missing = 0",
    PAYLOAD_REF: "str: '<store>:<key>', the payload kept in a payload store (body empty); README 'Large payloads'",
}

#: Trace context headers (W3C Trace Context and Baggage), text: written by ``enqueue`` with
#: tracing on (:mod:`amqpjobs.runtime.tracing`), read by a worker with tracing on, and kept as
#: received on every copy (tier, quarantine, suspects, replay), like any header not ours.
TRACEPARENT: Final = "traceparent"
TRACESTATE: Final = "tracestate"
BAGGAGE: Final = "baggage"
TRACE_HEADERS: Final = {
    TRACEPARENT: "str: W3C Trace Context 'traceparent' of the enqueue's send span (00-<trace id>-<span id>-<flags>)",
    TRACESTATE: "str: W3C Trace Context 'tracestate', vendor entries; optional",
    BAGGAGE: "str: W3C Baggage, key=value pairs; optional",
}

#: Quorum-queue delivery counters the broker sets on a redelivery: ``x-delivery-count``
#: (reject, client crash; the delivery limit counts it) and, from RabbitMQ 4.3,
#: ``x-acquired-count`` (also nack, consumer timeout, partitions; release notes 4.3.0).
DELIVERY_COUNT: Final = "x-delivery-count"
ACQUIRED_COUNT: Final = "x-acquired-count"


def header_int(value: Any) -> int | None:
    """Read a count header by the one rule (:func:`amqpjobs.jobs.header_values.read_count`).

    A whole number 0 .. ``2**63 - 1`` in any AMQP encoding (integer types, integral floats and
    decimals, strings or byte arrays of ASCII digits with blanks around them); a whole number
    above that range reads as ``2**63 - 1``; anything else (booleans, fractions, signs,
    NaN, other text, other types) is None.
    """
    return read_count(value)


def parse_attempt(value: Any) -> int:
    """Read our attempt header. Missing, not a count (:func:`header_int`) or 0 count as attempt 1.

    A publisher we don't control may send garbage here; the documented choice is to treat
    the delivery as a first attempt (it still runs at most ``max_attempts`` times from
    here on), never to crash. A whole number above ``2**63 - 1`` (``1e300``, 25 digits)
    reads as ``2**63 - 1``: above every ``max_attempts``, in every encoding alike.
    """
    number = read_count(value)
    return number if number is not None and number >= 1 else 1


def parse_runs(headers: Mapping[str, Any]) -> int:
    """Read :data:`RUNS`, the handler runs so far: missing, non-integer or negative values are 0.

    Only the worker writes it, on the copies it makes (retry tiers, quarantine, suspects).
    The evidence's ``amqpjobs-attempts`` is this count plus this delivery's run: never
    arithmetic on the attempt header, which a publisher may set to anything (attempt 999
    quarantined without running has 0 runs, not 998). A count the worker can't have
    written is not believed: each run it counts moved the job to its next attempt, so the
    count is at most the attempt (:data:`ATTEMPT`) less one (a foreign ``amqpjobs-runs: 99``
    on attempt 1 reads 0).
    """
    number = read_count(headers.get(RUNS))
    return 0 if number is None else min(number, parse_attempt(headers.get(ATTEMPT)) - 1)


#: Longest AMQP ``shortstr`` in bytes (AMQP 0-9-1 §4.2.5.3): ``message_id``, ``type``, a
#: routing key. pamqp raises a bare ``TypeError`` on a longer one (a header name: :mod:`.header_names`).
SHORTSTR_MAX_BYTES: Final = 255


def shortstr_problem(label: str, value: str, min_bytes: int = 1) -> str | None:
    """Why ``value`` can't be the AMQP shortstr ``label`` (under ``min_bytes``, or over 255 UTF-8 bytes), or None.

    The limit counts UTF-8 bytes, not characters: ``"é" * 128`` is 128 characters and 256 bytes.
    """
    size = len(value.encode("utf-8", "surrogatepass"))
    if min_bytes <= size <= SHORTSTR_MAX_BYTES:
        return None
    return (
        f"{label} must be {min_bytes}-{SHORTSTR_MAX_BYTES} UTF-8 bytes (got {size} bytes, {len(value)} "
        "characters): an AMQP short string"
    )


#: The fix :func:`job_id_problem` names for an id over 255 UTF-8 bytes.
SHORTER_ID: Final = "a shorter id (for a long key, a hash of it: hashlib.sha256(key.encode()).hexdigest())"

#: What to do about an empty or blank id, at enqueue (:func:`job_id_problem`'s default).
BLANK_AT_ENQUEUE: Final = "give an id (or leave it out when enqueueing: a random UUID)"

#: What to do about an empty or blank id given to look a job up (``job show``, ``job_status``, the console).
BLANK_AT_LOOKUP: Final = "give the id of the job to look up (the one enqueue returned)"


def job_id_problem(job_id: object, too_long: str = SHORTER_ID, blank: str = BLANK_AT_ENQUEUE) -> str | None:
    """Why ``job_id`` can't be a job id, or None: the one job-id rule (``enqueue``, ``job show``, ``job_status``).

    A job id is the AMQP ``message_id`` (a shortstr): a str (``job_id must be a str (got
    int)``), not empty nor blank, UTF-8 text (no lone surrogate, which no message can carry; a
    NUL it can), at most 255 UTF-8 bytes (:func:`shortstr_problem`; the words then end with
    ``fix: `` and ``too_long``). An empty or blank one's words end with ``blank``: how to mend
    it where the id was given (:data:`BLANK_AT_ENQUEUE`, :data:`BLANK_AT_LOOKUP`).
    """
    if not isinstance(job_id, str):
        return f"job_id must be a str (got {type(job_id).__name__})"
    if not job_id.strip():
        return f"job_id is empty or blank; {blank}"
    if where := lone_surrogate(job_id):
        return f"job_id {job_id[:40]!r} is not UTF-8 text ({where})"
    if problem := shortstr_problem("job_id", job_id):
        shown = f"{job_id[:40]!r}..." if len(job_id) > 40 else repr(job_id)
        return f"{problem} ({shown}); fix: {too_long}"
    return None


def tenant_of(value: Any) -> str | None:
    """The tenant an ``amqpjobs-tenant`` header value (as decoded from the wire) names, or None.

    The one "no tenant" rule (handler's ``ctx.tenant``, evidence, every copy, replay): a
    string or byte array (UTF-8, bad bytes as U+FFFD) names a tenant unless it is empty or
    blank (``enqueue`` refuses those; a publisher we don't control may send ``""`` for "no
    tenant"); an integer names the tenant of its decimal digits, and so does a decimal of scale 0
    (an AMQP ``D`` holding a whole number: ``Decimal("42")`` is ``"42"``); absent and any other
    AMQP type (table, array, boolean, float, a decimal with a fraction's scale, timestamp, void)
    name none (:func:`~amqpjobs.jobs.header_values.tenant_problem` says which, for the worker's warning).
    """
    if type(value) is str:  # the commonest: no other type tests first
        return value if value.strip() else None
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, Decimal) and value.is_finite() and value.as_tuple().exponent == 0:
        return str(int(value))
    if not isinstance(value, str | bytes | bytearray):
        return None
    text = as_text(value)
    return text if text.strip() else None


def job_name_of(message_type: str | None, headers: Mapping[str, Any]) -> str:
    """Job name of a received message: the ``type`` property, else our ``amqpjobs-job`` header, else ``""``.

    The header is read only as a string or byte array (:func:`~amqpjobs.jobs.header_values.read_text`):
    a table, array, number ... names no job (:func:`job_header_problem` says which type it was).
    """
    return message_type or read_text(headers.get(JOB)) or ""


def job_header_problem(message_type: str | None, headers: Mapping[str, Any]) -> str | None:
    """``header amqpjobs-job is an array, expected a string`` when the header was read (no ``type``) and is not text."""
    return None if message_type or JOB not in headers else type_problem(JOB, headers[JOB])


def tenant_in(headers: Mapping[str, Any]) -> str | None:
    """Tenant key from our header, or None (absent, empty/blank or not text: no tenant, see :func:`tenant_of`)."""
    return tenant_of(headers.get(TENANT))


def enqueued_at_of(headers: Mapping[str, Any], timestamp: float | None) -> datetime | None:
    """First enqueue time, aware UTC: our header, else the ``timestamp`` property.

    The header by :func:`amqpjobs.jobs.timestamps.parse_time` (ISO-8601 text without a zone is
    UTC, an offset is converted to UTC, a number above ``2**32 - 1`` is milliseconds, ...);
    ``timestamp`` is the property already decoded to seconds (``Delivery.timestamp``): taken
    as seconds (:func:`~amqpjobs.jobs.timestamps.decoded_time`), never read by the unit rule again.
    """
    return parse_time(headers.get(ENQUEUED_AT)) or decoded_time(timestamp)


def ready_at(now: float, delay: float = 0.0) -> int:
    """The ``timestamp`` of a copy that becomes ready in its work queue ``delay`` s after ``now`` (s since the epoch).

    A copy's ``timestamp`` says when it becomes ready in the work queue (a retry copy: its
    publish + its tier's delay; a replayed or handed-back copy: its publish), so a queue's
    oldest-message age (``max_age``, ``status``: ``now - head_message_timestamp``) counts
    only time spent ready. Whole seconds: an AMQP ``timestamp`` has no fraction.
    """
    return int(now + delay)


def with_trace(headers: Mapping[str, Any], trace: Mapping[str, str]) -> dict[str, Any]:
    """``headers`` with their trace context (:data:`TRACE_HEADERS`) replaced by ``trace``, whole.

    A ``tracestate`` or ``baggage`` in ``headers`` that ``trace`` has none of is dropped, not
    kept beside a ``traceparent`` it does not belong to. Other headers stay as they are.
    """
    out = {k: v for k, v in headers.items() if k not in TRACE_HEADERS}
    out.update(trace)
    return out


def job_message(
    job: str,
    payload: Mapping[str, Any],
    *,
    job_id: str,
    now: float,
    priority: int | None = None,
    tenant: str | None = None,
    headers: Mapping[str, Any] | None = None,
) -> OutgoingMessage:
    """Build a fresh job message (attempt 1) in the documented wire format.

    Args:
        job: Job name (``type``).
        payload: JSON-ready payload object.
        job_id: Job id (``message_id``).
        now: Enqueue time, seconds since the epoch (``timestamp`` and ``amqpjobs-enqueued-at``).
        priority: AMQP priority 0-255; None sends 0, so that a job without one sorts the same on
            a classic priority queue and on a 4.3 quorum queue (which counts "none" as 4).
        tenant: Tenant key or None.
        headers: Extra headers of the caller; names may not start with ``x-`` (the broker's)
            or ``amqpjobs-`` (ours).

    Raises:
        ValueError: a reserved header name or one not a str, a priority outside 0-255, an empty job
            id, a job id over 255 UTF-8 bytes (:func:`shortstr_problem`), a header name or a
            table key within a header over 128 (:func:`field_name_problem`) or not a str, a header
            float NaN, infinite or not exact in 32 bits (:func:`header_problem`), or a payload JSON
            can't hold (NaN, sets, ...).

    """
    extra = dict(headers or {})
    for name, value in extra.items():
        if problem := header_problem(name, value):
            raise ValueError(problem)
    if priority is not None and (isinstance(priority, bool) or not 0 <= priority <= 255):
        raise ValueError(f"priority must be an integer 0-255 (got {priority!r})")
    if problem := job_id_problem(job_id):
        raise ValueError(problem)
    ours: dict[str, Any] = {ATTEMPT: 1, ENQUEUED_AT: iso_utc(now)}
    if tenant is not None:
        ours[TENANT] = tenant
    return OutgoingMessage(
        body=encode_payload(payload),
        headers={**extra, **ours},
        message_id=job_id,
        type=job,
        timestamp=now,
        priority=0 if priority is None else priority,
    )
