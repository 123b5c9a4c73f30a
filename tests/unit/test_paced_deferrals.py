"""A delivery waiting on another worker's live claim: its ``deferred`` log line is paced per job id.

Each pass through the first retry tier is still an outcome (counted, observed, sent as an event);
only the ``job=... outcome=deferred ... ClaimBusy`` INFO line is paced: the first, then at most one
per 10 s per job id, naming how many were not logged (README "Idempotency").
"""

from __future__ import annotations

import logging
from collections import Counter

import pytest

from amqpjobs.jobs.outcome import Ack, Outcome, Register, RetryLater
from amqpjobs.runtime.recording import OutcomeRecords, PacedDeferrals
from amqpjobs.runtime.worker_config import WorkerOptions


class Records(OutcomeRecords):
    """The worker's outcome records alone, with a clock the test moves."""

    def __init__(self) -> None:
        self.now = 0.0
        self.options = WorkerOptions()
        self.stats = Counter()
        self.metrics = None
        self.seen: list[Outcome] = []
        self._on_outcome = self.seen.append
        self._deferral_lines = PacedDeferrals(clock=lambda: self.now)


WHY = "another run holds a live claim on this job id (in this worker or another)"


def busy(job_id: str) -> Outcome:
    return Outcome(RetryLater(next_attempt=1, tier=0, delay=1.0, wait=True), "insert", job_id, 1, 0.0, True,
                   error=f"ClaimBusy: {WHY}", failure=("ClaimBusy", WHY, ""))  # fmt: skip


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "amqpjobs.worker"]


LINE = (
    'job=insert id={id} attempt=1 duration=0.000s outcome=deferred next_attempt=1 delay=1s error="ClaimBusy: '
    'another run holds a live claim on this job id (in this worker or another)"'
)


def test_claim_busy_lines_are_one_when_it_starts_waiting_then_at_most_one_per_10s_per_job_id(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="amqpjobs")
    records = Records()
    for second in range(25):  # a pass a second for 25 s, two job ids waiting side by side
        records.now = float(second)
        records._record(busy("a"))
        records._record(busy("b"))
    first = "; logged at most every 10s per job id while it waits"
    later = " (9 more not logged since the last line)"
    assert lines(caplog) == [
        LINE.format(id="a") + first,
        LINE.format(id="b") + first,
        LINE.format(id="a") + later,
        LINE.format(id="b") + later,
        LINE.format(id="a") + later,
        LINE.format(id="b") + later,
    ]
    assert records.stats["deferred"] == 50  # every deferral still counts
    assert len(records.seen) == 50  # and reaches on_outcome (events, the recorder)


def test_another_outcome_of_the_job_id_ends_its_wait_so_its_next_deferral_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="amqpjobs")
    records = Records()
    records._record(busy("a"))
    records.now = 1.0
    records._record(busy("a"))  # paced
    records._record(Outcome(Ack(), "insert", "a", 1, 0.5, True))  # it ran: its wait is over
    records.now = 2.0
    records._record(busy("a"))  # a new wait (a replay meets a live claim): logged
    assert [line.split(" outcome=")[1].split(" ")[0] for line in lines(caplog)] == ["deferred", "succeeded", "deferred"]
    assert lines(caplog)[2].endswith("; logged at most every 10s per job id while it waits")
    assert records.stats == Counter({"deferred": 3, "succeeded": 1})


def test_other_deferrals_are_not_paced(caplog: pytest.LogCaptureFixture) -> None:
    # a breaker's (README "Circuit breakers": every pass logged) or a ledger away (10 s in the slot first)
    caplog.set_level(logging.INFO, logger="amqpjobs")
    records = Records()
    for second in range(3):
        records.now = float(second)
        records._record(Outcome(RetryLater(next_attempt=1, tier=0, delay=1.0, wait=True), "insert", "a", 1, 0.0, True,
                                error="BreakerOpen: open", failure=("BreakerOpen", "open", "")))  # fmt: skip
    assert len(lines(caplog)) == 3
    assert not any("logged at most" in line for line in lines(caplog))


def registered(job_id: str, start: int) -> Outcome:
    return Outcome(Register(start), "insert", job_id, 1, 0.0, True)


def test_a_waiting_suspects_registrations_and_alone_starts_share_its_pace(caplog: pytest.LogCaptureFixture) -> None:
    """An idempotent suspect under a dead worker's live claim goes round: registered again (``redelivered``),
    run alone (a WARNING), deferred (ClaimBusy), for the whole lease. Each round ended the wait, so nothing was
    paced: 175 lines of each kind in 3 minutes (an outsider's report). One line per 10 s per job id."""
    caplog.set_level(logging.INFO, logger="amqpjobs")
    records = Records()
    paced = records._deferral_lines
    alone_lines = 0
    for second in range(30):  # a round a second for 30 s
        records.now = float(second)
        records._record(registered("a", 3))
        alone_lines += paced.alone_line_due("a")
        records._record(busy("a"))
    kinds = [line.split(" outcome=")[1].split(" ")[0] for line in lines(caplog)]
    assert kinds == ["redelivered", "deferred", "deferred", "deferred"]  # the first of each, then one per 10 s
    assert lines(caplog)[2].endswith(" (19 more not logged since the last line)")  # 10 registrations, 9 deferrals
    assert alone_lines == 3  # its first alone start, then one per 10 s
    assert records.stats == Counter({"redelivered": 30, "deferred": 30})  # every outcome still counts
    records._record(Outcome(Ack(), "insert", "a", 1, 0.5, True))  # it ran: its wait is over
    assert paced.alone_line_due("a")
