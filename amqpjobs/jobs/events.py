"""Outcome events: small JSON messages of delivery outcomes, for whoever listens (no I/O).

A worker publishes the events of its outcomes to the topic exchange
:data:`~amqpjobs.topology.naming.EVENTS_EXCHANGE` (``amqpjobs.events``) with routing key
``<job queue>.<outcome>`` (:func:`~amqpjobs.topology.naming.event_routing_key`), and no
job waits for them (:mod:`amqpjobs.wire.events`): events are a signal, not a record. An
event can be lost (the exchange is missing, the channel is closed or blocked, nobody is
subscribed); a job's fate never depends on one (README "Wire format" → "Outcome events").

A message (``content_type`` ``application/json``) is a JSON array of one or more events,
all of its routing key (one job queue, one outcome), in the order the worker recorded them
but for events of replayed deliveries, which go ahead of the others (:mod:`amqpjobs.wire.events`).
:func:`event_messages` makes them from the events a worker sends in one write, one message per
routing key, so a busy worker costs the broker one publish per key and write, not one per job::

    [{"v": 2, "job": "mail", "id": "7c1f...", "attempt": 1, "outcome": "retried",
      "reason": "", "error": "ValueError: bad address", "queue": "mail",
      "replay_id": "", "at": "2026-11-30T03:00:00.123Z"}]

``outcome`` is :attr:`amqpjobs.jobs.outcome.Outcome.kind`; ``reason`` is the quarantine
reason (:data:`~amqpjobs.jobs.outcome.REASONS`) for ``quarantined``, else ``""``; ``error``
is ``"<type>: <message>"`` of the failure (at most :data:`MAX_ERROR` characters) or ``""``;
``replay_id`` names the replay run that moved the job back (``amqpjobs-replay-id``) or is
``""``. Unknown keys are to be ignored by readers (later versions may add some).
Version 1 (workers before 2026-12-03) sent one event per message, the object alone:
:func:`decode_events` reads both, so listeners keep working through a rolling upgrade.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson

from amqpjobs.jobs.envelope import iso_utc
from amqpjobs.jobs.outcome import Outcome, Quarantine
from amqpjobs.jobs.quarantine import REPLAY_ID, header_text
from amqpjobs.text import encodable

#: Version of the event body (``v``): 2 since events travel as arrays (1: one object per message).
VERSION: Final = 2
#: Characters of ``error`` kept in an event.
MAX_ERROR: Final = 200
#: Every outcome an event can carry (:attr:`amqpjobs.jobs.outcome.Outcome.kind`).
OUTCOMES: Final = (
    "succeeded", "retried", "quarantined", "deferred", "duplicate", "ack_uncertain", "redelivered", "handed_back",
    "abandoned", "skipped",
)  # fmt: skip
#: Outcomes that end a delivery well: the job is done (or, ``skipped``, left unrun by design).
SUCCESS: Final = frozenset({"succeeded", "duplicate", "ack_uncertain", "skipped"})
#: Outcomes that are a failure of the run: it will be retried or it is quarantined.
FAILURE: Final = frozenset({"retried", "quarantined"})


@dataclass(frozen=True)
class OutcomeEvent:
    """One outcome event (see the module docstring for the wire form).

    Attributes:
        job: Job name ("" when unknown).
        id: Job id.
        attempt: Attempt number of the delivery (1 for the first run, and for a replayed copy).
        outcome: :attr:`amqpjobs.jobs.outcome.Outcome.kind` (``succeeded``, ``retried``, ``quarantined`` ...).
        reason: The quarantine reason for ``quarantined``, else "".
        error: ``"<type>: <message>"`` of the failure (truncated), or "".
        queue: The job queue the delivery came from.
        replay_id: The replay run that moved it back, or "".
        at: When the outcome was recorded, ISO-8601 UTC.

    """

    job: str
    id: str
    attempt: int
    outcome: str
    reason: str
    error: str
    queue: str
    replay_id: str = ""
    at: str = ""

    @property
    def final(self) -> bool:
        """Whether the run ended in success or failure (not a deferral, hand-back or redelivery)."""
        return self.outcome in SUCCESS or self.outcome in FAILURE

    @property
    def failed(self) -> bool:
        """Whether the run failed (retried or quarantined)."""
        return self.outcome in FAILURE

    def why(self) -> str:
        """Why it failed, in one phrase: the error, else the reason, else the outcome."""
        return self.error or self.reason or self.outcome

    def encode(self) -> bytes:
        """The JSON body (UTF-8); text UTF-8 can't encode (a lone surrogate) as :func:`amqpjobs.text.encodable`."""
        return _body(self.job, self.id, self.attempt, self.outcome, self.reason, self.error, self.queue,
                     self.replay_id, self.at)  # fmt: skip


def _body(job: str, id: str, attempt: int, outcome: str, reason: str, error: str, queue: str, replay_id: str,
          at: str) -> bytes:  # fmt: skip
    """The one writer of the body (positional: the worker calls it per outcome).

    Compact, non-ASCII as is, keys in declaration order. orjson writes it (under 1 µs, the stdlib
    4 µs), byte for byte what ``json.dumps(doc, ensure_ascii=False, separators=(",", ":"))``
    writes (tests/unit/test_events.py); what orjson refuses (a lone surrogate, an integer
    beyond 64 bits) the stdlib writes, each text through :func:`amqpjobs.text.encodable`.
    """
    doc = {"v": VERSION, "job": job, "id": id, "attempt": attempt, "outcome": outcome, "reason": reason,
           "error": error[:MAX_ERROR], "queue": queue, "replay_id": replay_id, "at": at}  # fmt: skip
    try:
        return orjson.dumps(doc)
    except orjson.JSONEncodeError:
        pass
    doc = {key: encodable(value) if isinstance(value, str) else value for key, value in doc.items()}
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()


def message_schema() -> dict[str, Any]:
    """JSON Schema of an events message's body (the AsyncAPI document's outcome events message)."""
    return {"type": "array", "minItems": 1, "items": event_schema(),
            "description": "One or more events, all of the message's routing key, in the order recorded "
                           "(events of replayed deliveries first)."}  # fmt: skip


def event_messages(events: Sequence[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    """The messages that carry ``events``: one per routing key, its events' bodies as one JSON array.

    Args:
        events: (routing key, body of one event from :func:`event_body`) in the order recorded.

    Returns:
        (routing key, message body) in the order of each key's first event; within a message the
        events keep their order. No event is left out or repeated.
    """
    bodies: dict[str, list[bytes]] = {}
    for routing_key, body in events:
        same = bodies.get(routing_key)
        if same is None:
            bodies[routing_key] = [body]
        else:
            same.append(body)
    return [(routing_key, b"[" + b",".join(same) + b"]") for routing_key, same in bodies.items()]


def event_schema() -> dict[str, Any]:
    """JSON Schema of one event (an item of a message, :func:`message_schema`)."""
    text = {"type": "string"}
    return {
        "type": "object",
        "required": ["v", "job", "id", "attempt", "outcome", "reason", "error", "queue", "replay_id", "at"],
        "properties": {
            "v": {"const": VERSION, "description": "Version of the event body; readers ignore unknown keys."},
            "job": {**text, "description": "Job name ('' when unknown)."},
            "id": {**text, "description": "Job id (message_id)."},
            "attempt": {"type": "integer", "minimum": 1, "description": "Attempt number of the delivery."},
            "outcome": {**text, "enum": list(OUTCOMES), "description": "What happened to the delivery."},
            "reason": {**text, "description": "Quarantine reason for 'quarantined', else ''."},
            "error": {**text, "maxLength": MAX_ERROR, "description": "'<type>: <message>' of the failure, or ''."},
            "queue": {**text, "description": "The job queue the delivery came from."},
            "replay_id": {**text, "description": "The replay run that moved the job back, or ''."},
            "at": {**text, "format": "date-time", "description": "When the worker recorded it (UTC)."},
        },
    }


def event_for(outcome: Outcome, headers: Mapping[str, Any], now: float) -> OutcomeEvent:
    """The event of ``outcome`` of a delivery with ``headers``, recorded at ``now`` (seconds since the epoch)."""
    d = outcome.decision
    return OutcomeEvent(
        job=outcome.job,
        id=outcome.job_id,
        attempt=outcome.attempt,
        outcome=outcome.kind,
        reason=d.reason if isinstance(d, Quarantine) else "",
        error=outcome.error[:MAX_ERROR],
        queue=outcome.queue,
        replay_id=header_text(headers.get(REPLAY_ID)),
        at=iso_utc(now),
    )


def event_body(outcome: Outcome, kind: str, replay_id: str, now: float) -> bytes:
    """The body of ``outcome``'s event, written without building the event (the worker's path).

    What ``event_for(outcome, headers, now).encode()`` writes for a delivery whose
    ``amqpjobs-replay-id`` header reads ``replay_id``, in about 2 µs instead of 3.7.

    Args:
        outcome: The delivery's outcome.
        kind: ``outcome.kind`` (the caller has it already, for the routing key).
        replay_id: The replay run that moved the job back (:func:`amqpjobs.jobs.quarantine.header_text`
            of the header), or "".
        now: When the outcome was recorded, seconds since the epoch.
    """
    d = outcome.decision
    reason = d.reason if isinstance(d, Quarantine) else ""
    return _body(outcome.job, outcome.job_id, outcome.attempt, kind, reason, outcome.error, outcome.queue, replay_id,
                 iso_utc(now))  # fmt: skip


def _text(doc: dict[str, Any], key: str) -> str:
    """Field ``key`` as text: missing or null as ``""``, another JSON value as ``str()`` of it (``5`` → ``"5"``)."""
    value = doc.get(key)
    return value if isinstance(value, str) else "" if value is None else str(value)


def decode_events(body: bytes | bytearray | memoryview | str) -> list[OutcomeEvent]:
    """The events of a message body, in order: a JSON array of events (version 2), or one event (version 1).

    What is not an event is left out: a body that is not JSON (or nested past Python's
    recursion limit), an item that is not an object or has no text ``outcome`` (a body that
    is none of these gives ``[]``). A text field that is missing or null reads as ``""``,
    another JSON value as ``str()`` of it; an ``attempt`` that is not an integer as ``0``.
    Never raises, whatever ``body`` is.

    Args:
        body: The message body as received (UTF-8 JSON; aio-pika gives ``bytes``).
    """
    try:
        doc = json.loads(body.tobytes() if isinstance(body, memoryview) else body)
    except (ValueError, TypeError, RecursionError):  # UnicodeDecodeError is a ValueError
        return []
    docs = doc if isinstance(doc, list) else [doc]
    return [_event(item) for item in docs if isinstance(item, dict) and isinstance(item.get("outcome"), str)]


def _event(doc: dict[str, Any]) -> OutcomeEvent:
    """An event from its decoded JSON object (which has a text ``outcome``)."""
    attempt = doc.get("attempt")
    return OutcomeEvent(
        job=_text(doc, "job"),
        id=_text(doc, "id"),
        attempt=attempt if isinstance(attempt, int) and not isinstance(attempt, bool) else 0,
        outcome=doc["outcome"],
        reason=_text(doc, "reason"),
        error=_text(doc, "error"),
        queue=_text(doc, "queue"),
        replay_id=_text(doc, "replay_id"),
        at=_text(doc, "at"),
    )
