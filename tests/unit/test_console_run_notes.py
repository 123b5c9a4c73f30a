"""What a finished console action says about checked jobs it did not find, and a replay's rate line (pure)."""

from __future__ import annotations

from amqpjobs.console.actions import not_found_note
from amqpjobs.jobs.quarantine import Selection
from amqpjobs.jobs.replay_plan import ReplayReport


def test_a_replay_of_one_message_states_no_rate() -> None:
    report = ReplayReport(queue="work.quarantine", replayed=1, left=3, elapsed=0.0)
    assert report.summary(canary=False) == "replayed 1, skipped 0, left 3 in work.quarantine (0.0s)"


def test_a_replay_of_several_messages_states_its_rate() -> None:
    report = ReplayReport(queue="work.quarantine", replayed=21, left=0, elapsed=2.0)
    assert report.summary(canary=False) == "replayed 21, skipped 0, left 0 in work.quarantine (2.0s, 10.0/s)"


def test_checked_jobs_gone_from_the_queue_are_named() -> None:
    chosen = Selection(job_ids=frozenset({"f-331", "f-332", "f-400"}))
    assert not_found_note(chosen, moved=1, queue="work.quarantine") == [
        "2 of the 3 checked job(s) were no longer in work.quarantine (replayed, parked or purged since the page "
        "was shown?): nothing was done to them"
    ]


def test_no_note_when_every_checked_job_was_found_or_nothing_was_checked() -> None:
    assert not_found_note(Selection(job_ids=frozenset({"a", "b"})), moved=2, queue="q") == []
    assert not_found_note(Selection(job_ids=frozenset({"a"})), moved=3, queue="q") == []  # one id, several copies
    assert not_found_note(Selection(), moved=0, queue="q") == []
