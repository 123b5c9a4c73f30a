"""What a handler can signal, and what the worker decides to do with a delivery.

Handlers signal with exceptions (FastStream's ``RejectMessage``, dramatiq's ``Retry``):
raise :class:`Retry` to retry through the delay tiers, :class:`Reject` to quarantine at
once. The worker's decision is a value (:data:`Decision`) that tests can assert.
"""

from __future__ import annotations

from dataclasses import dataclass


class Retry(Exception):
    """Raise from a handler to retry the job through the next delay tier.

    Counts as a failed attempt, exactly like raising any transient error.
    """


class Reject(Exception):
    """Raise from a handler to quarantine the job now (reason ``rejected``), without retries."""


#: Quarantine reasons (the ``amqpjobs-reason`` evidence header).
REASONS = (
    "exhausted",  # transient failures used up max_attempts
    "timeout",  # the last attempt timed out and attempts are used up
    "permanent",  # the handler raised one of the job's permanent exception classes
    "rejected",  # the handler raised Reject
    "invalid-payload",  # JSON that fails the job's payload model (or not an object)
    "undecodable",  # not UTF-8 / not JSON / unsupported content_encoding
    "unsupported-content-type",  # content_type other than application/json
    "unknown-job",  # no job of that name in the app
    "worker-error",  # the worker itself failed on the delivery (a bug of ours; evidence has the traceback)
    "crashed",  # started max_redeliveries + 1 times without an outcome (worker died, loop stalled, channel lost)
)


@dataclass(frozen=True)
class Ack:
    """The job is done: ack the delivery."""


@dataclass(frozen=True)
class RetryLater:
    """Publish a copy to delay tier ``tier`` (index) with attempt ``next_attempt``, then ack.

    Attributes:
        next_attempt: Attempt number the copy carries.
        tier: Index into the job queue's retry tiers.
        delay: The tier's delay in seconds.
        wait: True when nothing failed: the job waits for another worker's claim on its key
            (or for the ledger to answer); it uses no attempt.

    """

    next_attempt: int
    tier: int
    delay: float
    wait: bool = False  # not a failure: waiting for another worker's claim (or the ledger) to clear


@dataclass(frozen=True)
class Quarantine:
    """Publish a copy with evidence to quarantine, then ack.

    Attributes:
        reason: One of :data:`REASONS`.

    """

    reason: str


@dataclass(frozen=True)
class Duplicate:
    """An idempotent job whose key is already done: ack without running (or its effect was rolled back)."""


@dataclass(frozen=True)
class Register:
    """The delivery came back without an outcome: republish a copy registered for start ``start``, then ack.

    Attributes:
        start: The start number the copy carries (``amqpjobs-starts``, :mod:`amqpjobs.jobs.crash`).
    """

    start: int


@dataclass(frozen=True)
class HandBack:
    """Not started (a suspect runs alone in this worker): republish the delivery unchanged, then ack.

    Unlike a requeue this leaves no ``redelivered`` flag, so the job is not taken for one
    whose start ended without an outcome.
    """


Decision = Ack | RetryLater | Quarantine | Duplicate | Register | HandBack
