"""A decision kept past a worker's stop: the ``amqpjobs-decided`` header and what it may say (no I/O).

A delivery whose handler ran and decided (a quarantine, a retry) but whose copy could not be
published (its queue or exchange deleted) is held (:mod:`amqpjobs.runtime.holding`). When the
worker's stop leaves it held past the grace, its decided copy goes into the delivery's own
work queue marked with this header, and the original is acked: the next worker carries the
decision out without running the handler again (README "Workers").

The header names a decision, never a place: ``quarantine`` (the copy carries a worker's
evidence: a reason it quarantines a run's job for, and the queue it is in as its original
queue) or ``retry:<tier>`` (tiers counted from 1, one of the work queue's own, with the
attempt after the run's). A worker reads it
against its queue's topology; anything else (a publisher's forgery, a tier the queue does
not have) is a problem, quarantined with evidence, its handler never run. Every copy made
from a received job drops the header (:func:`~amqpjobs.jobs.copy_headers.copy_headers`):
a replayed, parked or unparked job runs normally.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from amqpjobs.jobs import envelope
from amqpjobs.jobs.evidence import ERROR_MESSAGE, ERROR_TYPE, ORIGINAL_QUEUE, REASON
from amqpjobs.jobs.header_values import header_text, read_count, read_text
from amqpjobs.jobs.outcome import REASONS, Decision, Quarantine, RetryLater

#: The header a kept decision travels in.
DECIDED: Final = "amqpjobs-decided"
#: The quarantine reason of a message whose ``amqpjobs-decided`` can't be carried out.
INVALID_DECISION: Final = "invalid-decision"
#: The error type its evidence names.
INVALID_DECISION_ERROR: Final = "InvalidDecision"

_RETRY: Final = "retry:"
#: The reasons a worker quarantines a job for after its run, or in its stead: a kept quarantine names one.
_KEPT_REASONS: Final = frozenset(REASONS) - {INVALID_DECISION, "undeliverable"}


def decided_value(decision: Decision) -> str:
    """The header's value for ``decision``: ``quarantine`` or ``retry:<tier from 1>``.

    Raises:
        ValueError: ``decision`` is neither a quarantine nor a retry (nothing else is kept).
    """
    if isinstance(decision, Quarantine):
        return "quarantine"
    if isinstance(decision, RetryLater):
        return f"{_RETRY}{decision.tier + 1}"
    raise ValueError(f"only a quarantine or a retry is kept past a stop, not {decision}")


def read_decided(headers: Mapping[str, Any], work_queue: str, tiers: Sequence[float]) -> Decision | str:
    """The decision ``headers`` carry for a delivery of ``work_queue`` (retry ``tiers`` in seconds), or why not.

    Returns:
        ``Quarantine(<its amqpjobs-reason>)``, ``RetryLater`` to the named tier (its attempt
        the copy's), or a problem (``"names retry tier 7, but work has 3 (1 to 3)"``) that
        :func:`decided_problem` words.
    """
    text = read_text(headers.get(DECIDED))
    if text == "quarantine":  # the evidence a worker wrote on the copy (jobs.failure.quarantine_headers)
        reason = read_text(headers.get(REASON))
        if not reason:
            return f"says quarantine, but the message has no {REASON} evidence"
        if reason not in _KEPT_REASONS:
            return f"says quarantine, but its {REASON} {reason!r} is no reason a worker quarantines a run's job for"
        if (origin := read_text(headers.get(ORIGINAL_QUEUE)) or "") != work_queue:  # where a replay sends it
            return f"says quarantine, but its {ORIGINAL_QUEUE} {origin!r} is not {work_queue}, the queue it came from"
        return Quarantine(reason)
    number = text.removeprefix(_RETRY) if text is not None and text.startswith(_RETRY) else ""
    if number.isascii() and number.isdigit() and len(number) <= 6 and number == str(int(number)):  # as we write it
        tier = int(number)
        if not 1 <= tier <= len(tiers):
            has = f"{len(tiers)} (1 to {len(tiers)})" if tiers else "none"
            return f"names retry tier {tier}, but {work_queue} has {has}"
        raw = headers.get(envelope.ATTEMPT)
        if (attempt := read_count(raw)) is None or attempt < 2:  # the copy carries the attempt after the run's
            return f"says retry, but its {envelope.ATTEMPT} {raw!r} is not the attempt after a run (2 or more)"
        return RetryLater(next_attempt=attempt, tier=tier - 1, delay=tiers[tier - 1])
    return "is no decision this worker carries out (quarantine or retry:<tier>)"


def decided_problem(headers: Mapping[str, Any], problem: str) -> tuple[str, str, str]:
    """The evidence (error type, message, traceback) of a header :func:`read_decided` refused with ``problem``."""
    shown = header_text(headers.get(DECIDED))[:200]
    return INVALID_DECISION_ERROR, f"header {DECIDED} {shown!r} {problem}", ""


def decided_failure(headers: Mapping[str, Any]) -> tuple[str, str, str]:
    """The failure a kept quarantine's evidence names (error type, message; no traceback), for its outcome's log."""
    return header_text(headers.get(ERROR_TYPE)), header_text(headers.get(ERROR_MESSAGE))[:1024], ""
