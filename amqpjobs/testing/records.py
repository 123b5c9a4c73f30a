"""What :class:`~amqpjobs.testing.TestBroker` reports: :class:`Processed` deliveries, :class:`QuarantinedMessage`."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from amqpjobs.jobs import quarantine as q
from amqpjobs.jobs.outcome import Outcome


def _payload(body: bytes) -> Any:
    try:
        return json.loads(body.decode("utf-8-sig"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None


@dataclass(frozen=True)
class Processed:
    """One delivery the worker decided about.

    Attributes:
        outcome: The worker's :class:`~amqpjobs.jobs.outcome.Outcome` (decision, attempt, failure ...).
        queue: The work queue it came from.
        headers: Its headers as delivered (attempt, tenant, cron headers ...).
        body: Its raw body.

    """

    outcome: Outcome
    queue: str
    headers: dict[str, Any]
    body: bytes

    @property
    def job(self) -> str:
        """The job's name (empty when the delivery named none)."""
        return self.outcome.job

    @property
    def job_id(self) -> str:
        """The job id."""
        return self.outcome.job_id

    @property
    def attempt(self) -> int:
        """The attempt it was (1 first)."""
        return self.outcome.attempt

    @property
    def kind(self) -> str:
        """``succeeded``, ``retried``, ``quarantined``, ``duplicate``, ``skipped`` ... (:attr:`Outcome.kind`)."""
        return self.outcome.kind

    @property
    def payload(self) -> Any:
        """The body as JSON (None when it is not JSON)."""
        return _payload(self.body)


@dataclass(frozen=True)
class QuarantinedMessage:
    """A message resting in a quarantine queue (left there by :meth:`TestBroker.quarantine`).

    Attributes:
        headers: All its headers, evidence included (``amqpjobs-reason``, ``amqpjobs-error-type`` ...).
        body: Raw body. message_id / type: its properties.
        info: The evidence parsed (also :attr:`evidence`).

    """

    headers: dict[str, Any]
    body: bytes
    message_id: str | None
    type: str | None
    info: q.QuarantinedJob = field(repr=False)

    @property
    def reason(self) -> str:
        """The quarantine reason (``exhausted``, ``rejected``, ``invalid-payload`` ...)."""
        return self.info.reason

    @property
    def evidence(self) -> q.QuarantinedJob:
        """The ``amqpjobs-*`` evidence headers, parsed.

        Fields: job, job_id, reason, error_type, error_message, attempts, failed_at /
        first_failed_at (real time, UTC), original_queue, replay_count, broker_side.
        """
        return self.info

    @property
    def payload(self) -> Any:
        """The body as JSON (None when it is not JSON)."""
        return _payload(self.body)
