"""The amqpjobs-decided header: what it may say, read against a queue's own tiers (jobs.decided, pure)."""

from __future__ import annotations

import pytest

from amqpjobs.jobs.copy_headers import copy_headers
from amqpjobs.jobs.decided import DECIDED, decided_problem, decided_value, read_decided
from amqpjobs.jobs.outcome import Ack, Quarantine, RetryLater
from amqpjobs.jobs.quarantine import describe
from amqpjobs.jobs.quarantine_moves import park_headers, replay_headers

TIERS = (0.2, 0.4, 0.6)


#: The evidence a worker writes on a quarantine copy it keeps (jobs.failure.quarantine_headers), in part.
OURS = {"amqpjobs-reason": b"rejected", "amqpjobs-original-queue": "work"}


def test_each_kept_decision_reads_back_as_it_was_written():
    quarantine = {DECIDED: decided_value(Quarantine("rejected")), **OURS}
    assert read_decided(quarantine, "work", TIERS) == Quarantine("rejected")
    retry: dict[str, object] = {DECIDED: decided_value(RetryLater(next_attempt=3, tier=2, delay=0.6))}
    retry["amqpjobs-attempt"] = 3
    assert retry[DECIDED] == "retry:3"  # tiers counted from 1, as people read them
    assert read_decided(retry, "work", TIERS) == RetryLater(next_attempt=3, tier=2, delay=0.6)
    assert read_decided({DECIDED: b"retry:1", "amqpjobs-attempt": 2}, "work", TIERS) == RetryLater(
        next_attempt=2, tier=0, delay=0.2
    )


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("retry:4", "names retry tier 4, but work has 3 (1 to 3)"),
        ("retry:0", "names retry tier 0, but work has 3 (1 to 3)"),
        ("retry:-1", "is no decision this worker carries out (quarantine or retry:<tier>)"),
        ("retry:1e9", "is no decision this worker carries out (quarantine or retry:<tier>)"),
        ("retry:\u0661", "is no decision this worker carries out (quarantine or retry:<tier>)"),  # an Arabic-Indic 1
        ("retry:" + "9" * 5000, "is no decision this worker carries out (quarantine or retry:<tier>)"),
        ("work.retry.200ms", "is no decision this worker carries out (quarantine or retry:<tier>)"),
        ("QUARANTINE", "is no decision this worker carries out (quarantine or retry:<tier>)"),
        (1, "is no decision this worker carries out (quarantine or retry:<tier>)"),
        (None, "is no decision this worker carries out (quarantine or retry:<tier>)"),
        ("quarantine", "says quarantine, but the message has no amqpjobs-reason evidence"),
        ("retry:01", "is no decision this worker carries out (quarantine or retry:<tier>)"),  # not as we write it
        ("retry:+1", "is no decision this worker carries out (quarantine or retry:<tier>)"),
    ],
)
def test_a_header_we_did_not_write_is_a_problem_never_a_place(value: object, problem: str):
    assert read_decided({DECIDED: value, "amqpjobs-attempt": 2}, "work", TIERS) == problem


_NO_REASON = "is no reason a worker quarantines a run's job for"
_ELSEWHERE = "is not work, the queue it came from"


@pytest.mark.parametrize(
    ("evidence", "problem"),
    [
        ({"amqpjobs-reason": "bogus-reason"}, f"says quarantine, but its amqpjobs-reason 'bogus-reason' {_NO_REASON}"),
        (
            {"amqpjobs-reason": "invalid-decision"},
            f"says quarantine, but its amqpjobs-reason 'invalid-decision' {_NO_REASON}",
        ),
        (
            {"amqpjobs-reason": "undeliverable"},
            f"says quarantine, but its amqpjobs-reason 'undeliverable' {_NO_REASON}",
        ),
        (
            {"amqpjobs-original-queue": "other"},
            f"says quarantine, but its amqpjobs-original-queue 'other' {_ELSEWHERE}",
        ),
        ({"amqpjobs-original-queue": None}, f"says quarantine, but its amqpjobs-original-queue '' {_ELSEWHERE}"),
    ],
)
def test_a_kept_quarantine_needs_the_evidence_a_worker_writes(evidence: dict[str, object], problem: str):
    """Review (helper-219): a forged 'quarantine' with an invented reason, or an original queue elsewhere (where a
    replay would send it), was carried out as it came."""
    headers = {DECIDED: "quarantine", **OURS, **evidence}
    assert read_decided({k: v for k, v in headers.items() if v is not None}, "work", TIERS) == problem


@pytest.mark.parametrize("attempt", [None, 1, 0, -3, "one"])
def test_a_kept_retry_names_the_attempt_after_the_one_that_ran(attempt: object):
    """A retry copy carries the next attempt (2 or more); forged without one it ran again as attempt 1 (helper-219)."""
    headers: dict[str, object] = {DECIDED: "retry:1"}
    if attempt is not None:
        headers["amqpjobs-attempt"] = attempt
    assert read_decided(headers, "work", TIERS) == (
        f"says retry, but its amqpjobs-attempt {attempt!r} is not the attempt after a run (2 or more)"
    )


def test_a_queue_without_tiers_has_no_retry_to_name():
    assert read_decided({DECIDED: "retry:1", "amqpjobs-attempt": 2}, "plain", ()) == (
        "names retry tier 1, but plain has none"
    )


def test_the_evidence_names_the_header_and_its_value():
    assert decided_problem({DECIDED: b"launch"}, "is no decision") == (
        "InvalidDecision", "header amqpjobs-decided 'launch' is no decision", "")  # fmt: skip


def test_only_a_quarantine_or_a_retry_is_kept():
    with pytest.raises(ValueError, match="only a quarantine or a retry is kept past a stop, not ack"):
        decided_value(Ack())


def test_every_copy_made_from_a_received_job_drops_the_header():
    """Replay, park, unpark, retry and quarantine copies start from copy_headers: a replayed job runs normally."""
    received = {DECIDED: "quarantine", "amqpjobs-reason": "rejected", "amqpjobs-job": "rej"}
    assert DECIDED not in copy_headers(received, None)
    item = describe(received, "rej-1", "rej")
    assert DECIDED not in replay_headers(received, item, "r1", timestamp=None)
    assert DECIDED not in park_headers(received, item, "2026-01-01T00:00:00Z", timestamp=None)
