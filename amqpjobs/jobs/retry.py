"""Retry policy and the retry decision: attempt + failure → retry tier N or quarantine."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from amqpjobs.errors import ConfigurationError
from amqpjobs.jobs.outcome import Decision, Quarantine, RetryLater

FailureKind = Literal["error", "retry", "timeout", "permanent", "reject"]


@dataclass(frozen=True)
class RetryPolicy:
    """How a job retries.

    Attributes:
        max_attempts: Handler runs before a job is quarantined as exhausted; None means
            one more than the job queue's retry tiers (each tier used once). Above that,
            the last tier is reused. Must be 1 when the job queue has no tiers.
        permanent: Exception classes that quarantine at once (reason ``permanent``).
        immediate_retries: Extra in-process runs (tenacity) within one attempt before the
            attempt counts as failed; for blips worth retrying at once. Default 0.
        immediate_wait: Seconds between immediate retries.

    """

    max_attempts: int | None = None
    permanent: tuple[type[BaseException], ...] = ()
    immediate_retries: int = 0
    immediate_wait: float = 0.1

    def __post_init__(self) -> None:
        """Check the values where they are written (not at the first failure, inside a worker).

        Raises:
            ConfigurationError: a count that is not a whole number in range, a ``permanent``
                entry that is not an exception class (a name in quotes, say), a negative wait.
        """
        for name, low in (("max_attempts", 1), ("immediate_retries", 0)):
            value = getattr(self, name)
            if value is None and name == "max_attempts":
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ConfigurationError(f"RetryPolicy: {name} must be a whole number >= {low} (got {value!r})")
        if not isinstance(self.permanent, tuple) or not all(
            isinstance(c, type) and issubclass(c, BaseException) for c in self.permanent
        ):
            raise ConfigurationError(
                f"RetryPolicy: permanent must be a tuple of exception classes, e.g. (ValueError,), not names "
                f"(got {self.permanent!r})"
            )
        wait = self.immediate_wait
        if isinstance(wait, bool) or not isinstance(wait, int | float) or not 0 <= wait < float("inf"):
            raise ConfigurationError(f"RetryPolicy: immediate_wait must be seconds >= 0 (got {wait!r})")

    def attempts_for(self, tiers: tuple[float, ...]) -> int:
        """Effective max attempts for a job queue with ``tiers`` (seconds)."""
        return self.max_attempts if self.max_attempts is not None else len(tiers) + 1


def decide(kind: FailureKind, attempt: int, max_attempts: int, tiers: tuple[float, ...]) -> Decision:
    """Decide what happens after attempt ``attempt`` failed.

    Every failure path counts the same way: raising, :class:`~amqpjobs.jobs.outcome.Retry`
    and timeouts use one attempt each and go to the next tier while attempts remain.

    Args:
        kind: ``error`` (transient exception), ``retry`` (explicit signal), ``timeout``,
            ``permanent`` (a permanent exception class) or ``reject``.
        attempt: The attempt that failed (1-based).
        max_attempts: Effective max attempts of the job.
        tiers: The job queue's tier delays in seconds, increasing.

    Returns:
        :class:`RetryLater` into tier ``min(attempt, len(tiers)) - 1`` while attempts remain,
        else :class:`Quarantine` (``exhausted``/``timeout``/``permanent``/``rejected``).

    """
    if kind == "permanent":
        return Quarantine("permanent")
    if kind == "reject":
        return Quarantine("rejected")
    if attempt >= max_attempts or not tiers:
        return Quarantine("timeout" if kind == "timeout" else "exhausted")
    tier = min(attempt, len(tiers)) - 1
    return RetryLater(next_attempt=attempt + 1, tier=tier, delay=tiers[tier])


def wait_later(attempt: int, tiers: tuple[float, ...], tier: int = 0, start: int = 0) -> RetryLater:
    """Wait in tier ``tier`` without using an attempt (nothing failed: a claim, the ledger, an open breaker).

    The first tier by default; an open breaker picks the longest that fits in its cool-down.
    The copy keeps attempt ``attempt``; the job queue must have tiers. ``start``: a suspect's
    registered start (> 1), kept for when it comes back (:data:`~amqpjobs.jobs.crash.WAITING_START`).
    """
    return RetryLater(next_attempt=attempt, tier=tier, delay=tiers[tier], wait=True, start=start)


def retry_window(tiers: tuple[float, ...], attempts: int) -> float:
    """Seconds a job spends waiting in retry tiers over ``attempts`` attempts (the last tier repeats)."""
    return sum(tiers[min(i, len(tiers) - 1)] for i in range(attempts - 1))
