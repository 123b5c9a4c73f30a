"""A decision in a log line reads as people write it, never as a dataclass repr (no broker)."""

from __future__ import annotations

import pytest

from amqpjobs.jobs.outcome import Ack, Decision, Duplicate, HandBack, Outcome, Quarantine, Register, RetryLater
from amqpjobs.jobs.results import record_for

pytestmark = pytest.mark.version_independent


@pytest.mark.parametrize(
    ("decision", "words"),
    [
        (Ack(), "ack"),
        (RetryLater(next_attempt=2, tier=0, delay=1.0), "retry to tier 1 (1s), attempt 2"),
        (RetryLater(next_attempt=3, tier=1, delay=0.25, wait=True),
         "retry to tier 2 (0.25s), waiting for another worker's claim"),
        (Quarantine(reason="exhausted"), "quarantine (reason exhausted)"),
        (Duplicate(), "ack as a duplicate (already done)"),
        (Register(start=3), "registration for start 3"),
        (HandBack(), "hand-back unstarted"),
    ],
)  # fmt: skip
def test_a_decision_reads_as_words(decision: Decision, words: str) -> None:
    assert str(decision) == words  # "republish for quarantine (reason exhausted) failed", not Quarantine(reason=...)


def test_the_retrying_record_names_the_tier_in_the_same_words() -> None:
    decision = RetryLater(next_attempt=2, tier=0, delay=1.0)
    outcome = Outcome(decision=decision, job="mail", job_id="j1", attempt=1, duration=0.1, acked=True, ran=True)
    record = record_for(outcome, None, "work.retry.1s", 5.0)
    assert record is not None
    assert str(decision) == f"retry to {record.detail}"
