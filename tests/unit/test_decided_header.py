"""The amqpjobs-decided header: what it may say, read against a queue's own tiers (jobs.decided, pure)."""

from __future__ import annotations

import pytest

from amqpjobs.jobs.copy_headers import copy_headers
from amqpjobs.jobs.decided import DECIDED, decided_problem, decided_value, read_decided
from amqpjobs.jobs.outcome import Ack, Quarantine, RetryLater
from amqpjobs.jobs.quarantine import describe
from amqpjobs.jobs.quarantine_moves import park_headers, replay_headers

TIERS = (0.2, 0.4, 0.6)


def test_each_kept_decision_reads_back_as_it_was_written():
    quarantine = {DECIDED: decided_value(Quarantine("rejected")), "amqpjobs-reason": b"rejected"}
    assert read_decided(quarantine, "work", TIERS) == Quarantine("rejected")
    retry: dict[str, object] = {DECIDED: decided_value(RetryLater(next_attempt=3, tier=2, delay=0.6))}
    retry["amqpjobs-attempt"] = 3
    assert retry[DECIDED] == "retry:3"  # tiers counted from 1, as people read them
    assert read_decided(retry, "work", TIERS) == RetryLater(next_attempt=3, tier=2, delay=0.6)
    assert read_decided({DECIDED: b"retry:1"}, "work", TIERS) == RetryLater(next_attempt=1, tier=0, delay=0.2)


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
    ],
)
def test_a_header_we_did_not_write_is_a_problem_never_a_place(value: object, problem: str):
    assert read_decided({DECIDED: value}, "work", TIERS) == problem


def test_a_queue_without_tiers_has_no_retry_to_name():
    assert read_decided({DECIDED: "retry:1"}, "plain", ()) == "names retry tier 1, but plain has none"


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
