"""A decision kept past a worker's stop: the ``amqpjobs-decided`` header and what it may say (no I/O).

A delivery whose handler ran and decided (a quarantine, a retry) but whose copy could not be
published (its queue or exchange deleted) is held (:mod:`amqpjobs.runtime.holding`). When the
worker's stop leaves it held past the grace, its decided copy goes into the delivery's own
work queue marked with this header, and the original is acked: the next worker carries the
decision out without running the handler again (README "Workers").

The header names a decision, never a place: ``quarantine`` (the copy carries its evidence)
or ``retry:<tier>`` (tiers counted from 1, one of the work queue's own). A worker reads it
against its queue's topology; anything else (a publisher's forgery, a tier the queue does
not have) is a problem, quarantined with evidence, its handler never run. Every copy made
from a received job drops the header (:func:`~amqpjobs.jobs.copy_headers.copy_headers`):
a replayed, parked or unparked job runs normally.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from amqpjobs.jobs import envelope
from amqpjobs.jobs.evidence import ERROR_MESSAGE, ERROR_TYPE, REASON
from amqpjobs.jobs.header_values import header_text, read_text
from amqpjobs.jobs.outcome import Decision, Quarantine, RetryLater

#: The header a kept decision travels in.
DECIDED: Final = "amqpjobs-decided"
#: The quarantine reason of a message whose ``amqpjobs-decided`` can't be carried out.
INVALID_DECISION: Final = "invalid-decision"
#: The error type its evidence names.
INVALID_DECISION_ERROR: Final = "InvalidDecision"

_RETRY: Final = "retry:"


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
    if text == "quarantine":
        reason = read_text(headers.get(REASON))
        if not reason:
            return f"says quarantine, but the message has no {REASON} evidence"
        return Quarantine(reason)
    number = text.removeprefix(_RETRY) if text is not None and text.startswith(_RETRY) else ""
    if number.isascii() and number.isdigit() and len(number) <= 6:
        tier = int(number)
        if not 1 <= tier <= len(tiers):
            has = f"{len(tiers)} (1 to {len(tiers)})" if tiers else "none"
            return f"names retry tier {tier}, but {work_queue} has {has}"
        attempt = envelope.parse_attempt(headers.get(envelope.ATTEMPT))
        return RetryLater(next_attempt=attempt, tier=tier - 1, delay=tiers[tier - 1])
    return "is no decision this worker carries out (quarantine or retry:<tier>)"


def decided_problem(headers: Mapping[str, Any], problem: str) -> tuple[str, str, str]:
    """The evidence (error type, message, traceback) of a header :func:`read_decided` refused with ``problem``."""
    shown = header_text(headers.get(DECIDED))[:200]
    return INVALID_DECISION_ERROR, f"header {DECIDED} {shown!r} {problem}", ""


def decided_failure(headers: Mapping[str, Any]) -> tuple[str, str, str]:
    """The failure a kept quarantine's evidence names (error type, message; no traceback), for its outcome's log."""
    return header_text(headers.get(ERROR_TYPE)), header_text(headers.get(ERROR_MESSAGE))[:1024], ""
