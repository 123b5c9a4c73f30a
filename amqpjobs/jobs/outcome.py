"""What a handler can signal, and what the worker decides to do with a delivery.

Handlers signal with exceptions (FastStream's ``RejectMessage``, dramatiq's ``Retry``):
raise :class:`Retry` to retry through the delay tiers, :class:`Reject` to quarantine at
once. The worker's decision is a value (:data:`Decision`) that tests can assert.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from amqpjobs.jobs.payload_refs import REASONS as PAYLOAD_REASONS


class Retry(Exception):
    """Raise from a handler to retry the job through the next delay tier.

    Counts as a failed attempt, exactly like raising any transient error.
    """


class Reject(Exception):
    """Raise from a handler to quarantine the job now (reason ``rejected``), without retries."""


class Skipped(Exception):
    """Raised by a handler's wrapper that left the handler unrun by design: the delivery is acked as :class:`Skip`.

    The overlap guard (:mod:`amqpjobs.runtime.overlap`) raises it when the previous run of
    the job's schedule still runs. Not a failure: no attempt is used, nothing is retried.

    Only the guard's own word counts (:func:`amqpjobs.jobs.failure.framework_word`): ``unrun``
    True, raised before the job's handler ran. One a handler raises (a guarded function it
    awaited, a task of its ``asyncio.TaskGroup``) is its job's failure like any other raise.

    Args:
        reason: One word (``overlap``).
        subject: What it names (``schedule nightly``).
        unrun: The guard raised it for its job's run, before running anything (default False).
    """

    def __init__(self, reason: str, subject: str, *, unrun: bool = False) -> None:
        super().__init__(f"{reason}: {subject}")
        self.reason = reason
        self.subject = subject
        self.unrun = unrun


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
    *PAYLOAD_REASONS,  # a stored payload that can't be had (payload-missing, ...; README "Large payloads")
    "worker-error",  # the worker itself failed on the delivery (a bug of ours; evidence has the traceback)
    "crashed",  # started max_redeliveries + 1 times without an outcome (worker died, loop stalled, channel lost)
    "undeliverable",  # the broker could not deliver it over AMQP 0-9-1 (a short string over 255 bytes): moved by hand
    "invalid-decision",  # an amqpjobs-decided header the worker can't carry out (a forgery: jobs.decided); not run
)


# Each decision has a __str__: log lines name it as people read it ("republish for quarantine
# (reason exhausted) failed"), never as its dataclass repr.


@dataclass(frozen=True)
class Ack:
    """The job is done: ack the delivery."""

    def __str__(self) -> str:
        return "ack"


@dataclass(frozen=True)
class RetryLater:
    """Publish a copy to delay tier ``tier`` (index) with attempt ``next_attempt``, then ack.

    Attributes:
        next_attempt: Attempt number the copy carries.
        tier: Index into the job queue's retry tiers.
        delay: The tier's delay in seconds.
        wait: True when nothing failed: the job waits for another worker's claim on its key
            (or for the ledger to answer); it uses no attempt.
        start: For a waiting suspect, the registered start it waits with (its copy carries
            :data:`~amqpjobs.jobs.crash.WAITING_START`); 0 otherwise.

    """

    next_attempt: int
    tier: int
    delay: float
    wait: bool = False  # not a failure: waiting for another worker's claim (or the ledger) to clear
    start: int = 0  # a waiting registered start (> 1): registered again for it when back (crash.WAITING_START)

    @property
    def next_step(self) -> str:
        """``tier 1 (5s), attempt 3`` (tiers counted from 1), or ``..., waiting for another worker's claim``."""
        why = "waiting for another worker's claim" if self.wait else f"attempt {self.next_attempt}"
        return f"tier {self.tier + 1} ({self.delay:g}s), {why}"

    def __str__(self) -> str:
        return f"retry to {self.next_step}"


@dataclass(frozen=True)
class Quarantine:
    """Publish a copy with evidence to quarantine, then ack.

    Attributes:
        reason: One of :data:`REASONS`.

    """

    reason: str

    def __str__(self) -> str:
        return f"quarantine (reason {self.reason})"


@dataclass(frozen=True)
class Duplicate:
    """An idempotent job whose key is already done: ack without running (or its effect was rolled back)."""

    def __str__(self) -> str:
        return "ack as a duplicate (already done)"


@dataclass(frozen=True)
class Skip:
    """Left unrun by design (:class:`Skipped`): ack without running, neither a success nor a failure.

    Attributes:
        reason: ``overlap``: the previous run of the job's schedule still runs (README "Overlap guard").
        subject: What it names (``schedule nightly``).
    """

    reason: str
    subject: str

    def __str__(self) -> str:
        if self.reason == "overlap":
            return f"ack as skipped (the previous run of {self.subject} is still running)"
        return f"ack as skipped ({self.reason}: {self.subject})"


@dataclass(frozen=True)
class Register:
    """The delivery came back without an outcome: republish a copy registered for start ``start``, then ack.

    Attributes:
        start: The start number the copy carries (``amqpjobs-starts``, :mod:`amqpjobs.jobs.crash`).
    """

    start: int

    def __str__(self) -> str:
        return f"registration for start {self.start}"


@dataclass(frozen=True)
class HandBack:
    """Not started (a suspect runs alone in this worker): republish the delivery unchanged, then ack.

    Unlike a requeue this leaves no ``redelivered`` flag, so the job is not taken for one
    whose start ended without an outcome.
    """

    def __str__(self) -> str:
        return "hand-back unstarted"


Decision = Ack | RetryLater | Quarantine | Duplicate | Register | HandBack | Skip


@dataclass(slots=True)
class Outcome:
    """What happened to one delivery (for logs, stats, tests and ``Worker(on_outcome=)``).

    The worker builds it while deciding (``acked``, ``uncertain`` and ``error`` are set
    once the decision is carried out).

    Attributes:
        decision: Ack, RetryLater or Quarantine.
        job: Job name ("" when unknown).
        job_id: Job id.
        attempt: Attempt number of the delivery.
        duration: Seconds the handler ran (0 when it did not run).
        acked: Whether the delivery was acked (False: left for redelivery or rejected).
        queue: The job queue the delivery came from.
        latency: Seconds from enqueue to this start, for a first attempt that ran; else None.
        timed_out: Whether the handler run hit its timeout.
        error: ``"<type>: <message>"`` (first 300 characters) of the failure, or "".
        uncertain: The handler succeeded but its ack may not have reached the broker (the
            event loop stalled past the heartbeat timeout during the run, or the channel
            closed before the ack went out): the broker may run it again.
        failure: (error type, message, traceback) of the failure, ``("", "", "")`` when none.
        ran: Whether the handler ran on this delivery.
        started: Monotonic time the handler started (when it ran).
        value: What the handler returned (None when it did not return), for the results store.
        rejected: Rejected into quarantine (its copy could never be published): the broker
            dead-lettered it there, and ``decision`` was replaced by ``Quarantine("x-death:rejected")``.
        decided: The decision is one an earlier run made and kept in the delivery's
            ``amqpjobs-decided`` header (:mod:`amqpjobs.jobs.decided`): carried out, the handler not run.
        reached_at: When the worker began carrying the decision out (ISO-8601 UTC, ms; "" before): the failure
            time a copy's evidence gives, however long the copy then waits (held, kept past a stop).

    """

    decision: Decision
    job: str
    job_id: str
    attempt: int
    duration: float
    acked: bool
    queue: str = ""
    latency: float | None = None
    timed_out: bool = False
    error: str = ""
    uncertain: bool = False
    failure: tuple[str, str, str] = ("", "", "")
    ran: bool = False
    started: float = 0.0
    value: Any = None
    rejected: bool = False
    decided: bool = False
    reached_at: str = ""

    @property
    def kind(self) -> str:
        """What happened, as one word.

        ``succeeded``, ``retried``, ``deferred`` (waited for a claim), ``duplicate``,
        ``skipped`` (left unrun by design: :class:`Skip`), ``quarantined``, ``ack_uncertain``
        (succeeded, ack maybe lost), ``redelivered`` (came back without an outcome: registered
        for its next start), ``handed_back`` (not started while a suspect ran alone), or
        ``abandoned`` when not acked (``quarantined`` when rejected into quarantine: :attr:`rejected`).
        """
        if self.rejected:
            return "quarantined"
        if self.uncertain:
            return "ack_uncertain"
        if not self.acked:
            return "abandoned"
        d = self.decision  # the decision classes are disjoint: the commonest is looked at first
        if isinstance(d, Ack):
            return "succeeded"
        if isinstance(d, RetryLater):
            return "deferred" if d.wait else "retried"
        if isinstance(d, Register):
            return "redelivered"
        if isinstance(d, HandBack):
            return "handed_back"
        if isinstance(d, Skip):
            return "skipped"
        return "duplicate" if isinstance(d, Duplicate) else "quarantined"


#: Levels of ``--log-outcomes`` and ``--outcome-events``: every outcome, all but successes, none.
REPORT_LEVELS = ("all", "failures", "none")
#: Outcomes left out at level ``failures``: successes (the job's effect is done), and runs skipped by design.
SUCCESS_KINDS = frozenset({"succeeded", "duplicate", "skipped"})


def reported(level: str, kind: str) -> bool:
    """Whether an outcome of ``kind`` (:attr:`Outcome.kind`) is logged / sent as an event at ``level``.

    ``all``: every one; ``failures``: all but :data:`SUCCESS_KINDS`; ``none``: none.
    """
    return level == "all" or (level == "failures" and kind not in SUCCESS_KINDS)


def handed_back_note(handed: int, waiting: int) -> str:
    """The stopped worker's words for the deliveries it handed back unstarted while stopping.

    ``handed``: deliveries handed back (a copy to their work queue, never started), of which
    ``waiting`` had waited for a rate limit's token. Empty when none: ``", 2 handed back
    unstarted (1 waiting for a token)"``, or ``", 1 waiting for a token handed back unstarted"``.
    """
    if not handed:
        return ""
    if handed == waiting:
        return f", {handed} waiting for a token handed back unstarted"
    return f", {handed} handed back unstarted" + (f" ({waiting} waiting for a token)" if waiting else "")
