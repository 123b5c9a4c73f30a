"""What a move out of quarantine writes: the headers of a replayed or parked copy, and the mover's lock (no I/O).

A replay (:mod:`amqpjobs.runtime.replay`) sends a copy back to its queue with a fresh attempt
budget and the failure it replays as ``amqpjobs-previous-*`` (:func:`replay_headers`); a park
(:mod:`amqpjobs.runtime.parking`) keeps the evidence and adds when (:func:`park_headers`). One
mover of a quarantine queue at a time holds :func:`mover_lock_queue`. The quarantined message
itself is read by :func:`amqpjobs.jobs.quarantine.describe`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from amqpjobs.jobs import crash, envelope, evidence
from amqpjobs.jobs.copy_headers import copy_headers
from amqpjobs.jobs.header_values import COUNT_MAX, header_text
from amqpjobs.jobs.message_key import PAYLOAD_KEY

if TYPE_CHECKING:
    from amqpjobs.jobs.quarantine import QuarantinedJob

REPLAY_COUNT: Final = "amqpjobs-replay-count"
REPLAY_ID: Final = "amqpjobs-replay-id"
PREVIOUS_REASON: Final = "amqpjobs-previous-reason"
PREVIOUS_ERROR_TYPE: Final = "amqpjobs-previous-error-type"
PREVIOUS_ERROR_MESSAGE: Final = "amqpjobs-previous-error-message"
PREVIOUS_FAILURE_AT: Final = "amqpjobs-previous-failure-at"
#: When an operator parked the job (``amqpjobs quarantine park``), ISO-8601 UTC.
PARKED_AT: Final = "amqpjobs-parked-at"

#: Headers dropped from a replayed copy: the evidence of the failure (kept as ``previous-*``)
#: and the per-attempt bookkeeping, so the job starts a fresh attempt budget.
_RESET: Final = frozenset(
    {*evidence.EVIDENCE_HEADERS, *crash.START_HEADERS, envelope.ATTEMPT, envelope.RUNS, envelope.FIRST_FAILURE_AT}
    - {evidence.JOB, evidence.TENANT, evidence.ORIGINAL_EXCHANGE, evidence.ORIGINAL_ROUTING_KEY}
)


def mover_lock_queue(quarantine_queue: str) -> str:
    """Name of the lock queue that one mover of ``quarantine_queue`` at a time holds.

    ``amqpjobs.mover.<quarantine queue>.lock``: it does not end in ``.quarantine``, so
    ``quarantine list --all`` never takes it for a quarantine queue. Past AMQP's 255 bytes
    the quarantine queue's name is replaced by a digest of it.
    """
    name = f"amqpjobs.mover.{quarantine_queue}.lock"
    if len(name.encode("utf-8")) <= 255:
        return name
    return f"amqpjobs.mover.sha256-{hashlib.sha256(quarantine_queue.encode('utf-8')).hexdigest()}.lock"


def replay_headers(
    headers: Mapping[str, Any], item: QuarantinedJob, replay_id: str, *, timestamp: Any
) -> dict[str, Any]:
    """Headers of the replayed copy: a fresh attempt budget plus provenance.

    Evidence and attempt bookkeeping are dropped (the copy starts at attempt 1); the
    broker's ``x-death`` & co are stripped; ``amqpjobs-replay-count`` is incremented and
    the failure being replayed is kept as ``amqpjobs-previous-*``, so a job that fails again
    arrives in quarantine carrying both failures. ``timestamp``: the received ``timestamp``
    property (:func:`~amqpjobs.jobs.copy_headers.copy_headers` keeps the first enqueue time).
    """
    out = {k: v for k, v in copy_headers(headers, timestamp).items() if k not in _RESET}
    out[envelope.ATTEMPT] = 1
    out[REPLAY_COUNT] = min(item.replay_count + 1, COUNT_MAX)  # stays an AMQP integer
    out[REPLAY_ID] = replay_id
    out[PREVIOUS_REASON] = item.reason
    out[PREVIOUS_ERROR_TYPE] = item.error_type
    out[PREVIOUS_ERROR_MESSAGE] = item.error_message[:1024]
    out[PREVIOUS_FAILURE_AT] = "" if item.failed_at is None else header_text(item.failed_at)
    if item.payload_key:  # no id (a broker's dead-letter): its generated id is ours, keyed as it came ("Idempotency")
        out[PAYLOAD_KEY] = item.payload_key
    return out


def park_headers(headers: Mapping[str, Any], item: QuarantinedJob, parked_at: str, *, timestamp: Any) -> dict[str, Any]:
    """Headers of a parked copy: the quarantined message's, evidence and all, plus ``amqpjobs-parked-at``.

    Every header is kept as received (:func:`~amqpjobs.jobs.copy_headers.copy_headers`: the copy
    goes out byte for byte) but the broker's ``x-death`` & co, which the broker does not
    keep up on a client's copy (3.13+). A broker-side dead-letter, whose only evidence they
    are, gets what :func:`describe` read from them as our evidence headers (reason
    ``x-death:<reason>``, original queue, failure times), so the parked copy still says why.
    ``timestamp``: the received ``timestamp`` property (:func:`~amqpjobs.jobs.copy_headers.copy_headers`).
    """
    out = copy_headers(headers, timestamp)
    if item.broker_side:
        out[evidence.REASON] = item.reason
        out[evidence.ORIGINAL_QUEUE] = item.original_queue
        out[evidence.ATTEMPTS] = item.attempts
        out[evidence.LAST_FAILURE_AT] = "" if item.failed_at is None else header_text(item.failed_at)
        out[evidence.FIRST_FAILURE_AT] = "" if item.first_failed_at is None else header_text(item.first_failed_at)
    out[PARKED_AT] = parked_at
    return out
