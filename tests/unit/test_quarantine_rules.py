"""Table tests of the pure quarantine rules: describe, selection, replay headers (no broker)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from amqpjobs.jobs import envelope, evidence
from amqpjobs.jobs.quarantine import (
    PREVIOUS_ERROR_MESSAGE,
    PREVIOUS_ERROR_TYPE,
    PREVIOUS_FAILURE_AT,
    PREVIOUS_REASON,
    REPLAY_COUNT,
    REPLAY_ID,
    QuarantinedJob,
    Selection,
    describe,
    replay_headers,
)

T1 = datetime(2026, 11, 29, 8, 0, tzinfo=UTC)
T2 = datetime(2026, 11, 29, 9, 30, tzinfo=UTC)

OURS: dict[str, Any] = {
    evidence.JOB: b"send_mail",
    evidence.JOB_ID: "id-1",
    evidence.REASON: "exhausted",
    evidence.ERROR_TYPE: "smtplib.SMTPException",
    evidence.ERROR_MESSAGE: "refused",
    evidence.ATTEMPTS: 3,
    evidence.LAST_FAILURE_AT: "2026-11-29T09:30:00Z",
    evidence.FIRST_FAILURE_AT: "2026-11-29T08:00:00Z",
    evidence.ORIGINAL_QUEUE: "mail",
}
DEATH = {"reason": "expired", "queue": "mail", "time": T1}

DESCRIBE = [
    pytest.param(
        OURS, "m-1", None,
        QuarantinedJob("send_mail", "id-1", "exhausted", "smtplib.SMTPException", "refused", 3, T2, T1, "mail", 0,
                       False, "smtplib.SMTPException"),
        id="our-evidence",
    ),
    pytest.param(
        {**OURS, evidence.JOB_ID: "", REPLAY_COUNT: 2}, "m-1", None,
        QuarantinedJob("send_mail", "m-1", "exhausted", "smtplib.SMTPException", "refused", 3, T2, T1, "mail", 2,
                       False, "smtplib.SMTPException"),
        id="job-id-from-message-id-and-replays",
    ),
    pytest.param(
        {"x-death": [DEATH], envelope.ATTEMPT: 2}, "m-2", "resize",
        QuarantinedJob("resize", "m-2", "x-death:expired", "", "", 1, T1, T1, "mail", 0, True, "x-death: expired"),
        id="broker-dead-letter",
    ),
    pytest.param(
        {"x-first-death-reason": b"maxlen", "x-first-death-queue": "q", envelope.JOB: "j"}, None, None,
        QuarantinedJob("j", "", "x-death:maxlen", "", "", 0, None, None, "q", 0, True, "x-death: maxlen"),
        id="first-death-headers-only",
    ),
    pytest.param(  # most recent first (RabbitMQ "Dead Letter Exchanges", all versions): rejected from mail last
        {"x-death": [{"reason": "rejected", "queue": "mail", "time": T2}, DEATH],
         "x-first-death-reason": "expired", "x-first-death-queue": "mail.retry.2s"}, "m-3", "resize",
        QuarantinedJob("resize", "m-3", "x-death:rejected", "", "", 0, T2, T1, "mail", 0, True, "x-death: rejected"),
        id="last-death-wins-over-first",
    ),
    pytest.param(  # 3.13+ also say so in x-last-death-*; they agree with x-death[0]
        {"x-death": [{"reason": "maxlen", "queue": "mail", "time": T2}, {**DEATH, "queue": "mail.retry.2s"}],
         "x-first-death-reason": "expired", "x-first-death-queue": "mail.retry.2s",
         "x-last-death-reason": "maxlen", "x-last-death-queue": "mail"}, "m-4", "resize",
        QuarantinedJob("resize", "m-4", "x-death:maxlen", "", "", 0, T2, T1, "mail", 0, True, "x-death: maxlen"),
        id="last-death-headers",
    ),
    pytest.param(
        {"x-last-death-reason": "rejected", "x-last-death-queue": "mail",
         "x-first-death-reason": "expired", "x-first-death-queue": "mail.retry.2s"}, "m-5", "resize",
        QuarantinedJob("resize", "m-5", "x-death:rejected", "", "", 0, None, None, "mail", 0, True,
                       "x-death: rejected"),
        id="last-death-headers-without-x-death",
    ),
    pytest.param(
        {}, None, None,
        QuarantinedJob("", "", "no-evidence", "", "", 0, None, None, "", 0, False, "no-evidence"),
        id="nothing-known",
    ),
    pytest.param(  # another publisher's evidence times whose UTC falls outside years 1-9999: unknown, not a crash
        {**OURS, evidence.LAST_FAILURE_AT: "9999-12-31T23:59:59-01:00",
         evidence.FIRST_FAILURE_AT: "0001-01-01T00:00:00+01:00"}, "m-1", None,
        QuarantinedJob("send_mail", "id-1", "exhausted", "smtplib.SMTPException", "refused", 3, None, None, "mail", 0,
                       False, "smtplib.SMTPException"),
        id="evidence-times-out-of-range",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("headers", "message_id", "message_type", "expected"), DESCRIBE)
def test_describe(headers: dict[str, Any], message_id: str | None, message_type: str | None,
                  expected: QuarantinedJob) -> None:  # fmt: skip
    assert describe(headers, message_id, message_type) == replace(expected, key=expected.job_id)  # no body: the id


ITEM = describe(OURS, None, None)
BROKER_ITEM = describe({"x-death": [DEATH]}, "m", "resize")

SELECT = [
    (Selection(), ITEM, True),
    (Selection(job="send_mail"), ITEM, True),
    (Selection(job="other"), ITEM, False),
    (Selection(error_type="smtplib.SMTPException"), ITEM, True),
    (Selection(error_type="SMTPException"), ITEM, True),
    (Selection(error_type="ValueError"), ITEM, False),
    (Selection(reason="exhausted"), ITEM, True),
    (Selection(reason="permanent"), ITEM, False),
    (Selection(reason="x-death:expired"), BROKER_ITEM, True),
    (Selection(reason="expired"), BROKER_ITEM, True),
    (Selection(since=T2), ITEM, True),
    (Selection(since=datetime(2026, 11, 29, 10, tzinfo=UTC)), ITEM, False),
    (Selection(since=T1), describe({}, None, None), False),
]


@pytest.mark.parametrize(("selection", "item", "matches"), SELECT)
def test_selection(selection: Selection, item: QuarantinedJob, matches: bool) -> None:
    assert selection.matches(item) is matches


def test_replay_headers_start_a_fresh_budget_and_keep_provenance() -> None:
    headers = {
        **OURS,
        envelope.ATTEMPT: 4,
        envelope.RUNS: 3,
        envelope.TENANT: "acme",
        envelope.ORIGINAL_EXCHANGE: "jobs",
        "x-death": [DEATH],
        "x-first-death-reason": "expired",
        "custom": "kept",
    }
    out = replay_headers(headers, ITEM, "r-1", timestamp=None)
    assert out == {
        evidence.JOB: b"send_mail",
        envelope.TENANT: "acme",
        envelope.ORIGINAL_EXCHANGE: "jobs",
        "custom": "kept",
        envelope.ATTEMPT: 1,
        REPLAY_COUNT: 1,
        REPLAY_ID: "r-1",
        PREVIOUS_REASON: "exhausted",
        PREVIOUS_ERROR_TYPE: "smtplib.SMTPException",
        PREVIOUS_ERROR_MESSAGE: "refused",
        PREVIOUS_FAILURE_AT: "2026-11-29T09:30:00.000Z",
    }


@pytest.mark.parametrize(("tenant", "kept"), [("acme", True), ("", False)], ids=["tenant-kept", "empty-tenant-dropped"])
def test_replay_headers_tenant(tenant: str, kept: bool) -> None:
    out = replay_headers({envelope.TENANT: tenant}, ITEM, "r", timestamp=None)
    assert (envelope.TENANT in out) is kept


def test_replay_headers_count_up_and_bound_the_message() -> None:
    item = describe({**OURS, REPLAY_COUNT: 4, evidence.ERROR_MESSAGE: "x" * 5000}, None, None)
    out = replay_headers({}, item, "r", timestamp=None)
    assert out[REPLAY_COUNT] == 5
    assert out[PREVIOUS_ERROR_MESSAGE] == "x" * 1024
    unknown = describe({}, None, None)
    assert replay_headers({}, unknown, "r", timestamp=None)[PREVIOUS_FAILURE_AT] == ""


def test_replay_headers_of_a_job_whose_enqueue_time_is_out_of_range() -> None:
    """An ``amqpjobs-enqueued-at`` whose UTC time datetime can't hold is unreadable: the copy takes the timestamp's."""
    headers = {**OURS, envelope.ENQUEUED_AT: "0001-01-01T00:00:00+01:00"}
    out = replay_headers(headers, describe(headers, None, None), "r", timestamp=1_764_403_200)
    assert out[envelope.ENQUEUED_AT] == "2025-11-29T08:00:00.000Z"


@pytest.mark.parametrize("value", ["poison", b"poison", 42, "", "  ", "Exhausted", "x-death:bogus"])
def test_every_reason_a_listing_shows_is_one_reason_selects_another_stacks_too(value: Any) -> None:
    """Evidence whose reason is none of ours (another stack's, a newer version's, a forged one) reads ``other:<it>``.

    Before: ``quarantine list`` showed ``poison`` (or ``42``), and ``--reason poison`` was refused (exit 2, "is not
    a reason"): no filter could select, replay or park those messages alone (README: every reason a listing shows
    is one ``--reason`` selects).
    """
    from amqpjobs.jobs.quarantine import is_shown_reason

    item = describe({evidence.REASON: value, evidence.JOB: "mail"}, "q-1", None)
    assert item.reason.startswith("other:"), item.reason
    assert is_shown_reason(item.reason), item.reason
    assert Selection(reason=item.reason).matches(item)
    assert not Selection(reason="exhausted").matches(item)
    assert describe({evidence.REASON: "exhausted"}, "q-1", None).reason == "exhausted"  # ours unchanged
    assert describe({evidence.REASON: "x-death:expired"}, "q-1", None).reason == "x-death:expired"  # a park's
