"""The no-match hint of the quarantine filters (no broker)."""

from __future__ import annotations

from datetime import UTC, datetime

from amqpjobs.cli._census import progress_line
from amqpjobs.cli.next_steps import after_show, filter_args
from amqpjobs.jobs.census import Census
from amqpjobs.jobs.quarantine import QuarantinedJob, Selection
from amqpjobs.jobs.replay_plan import ReplayReport
from amqpjobs.jobs.timestamps import parse_time


def item(job: str, error_type: str = "ValueError", reason: str = "exhausted", day: int = 1) -> QuarantinedJob:
    when = datetime(2026, 11, day, 8, tzinfo=UTC)
    return QuarantinedJob(job, "id", reason, error_type, "boom", 3, when, when, "work", 0, False)


def test_the_hint_names_each_filtered_kind_with_counts_and_cuts_long_lists():
    census = Census(queue="work.quarantine")
    for n in range(12):
        census.add(item(f"job{n:02}", day=n + 1), matched=False)
    census.add(item("job00", error_type="", reason="x-death:expired"), matched=False)
    chosen = Selection(job="jbo", reason="permanent", since=datetime(2026, 11, 29, tzinfo=UTC))
    assert census.no_match_lines(chosen) == [
        "no message matched --job 'jbo' --reason 'permanent' --since '2026-11-29T00:00:00+00:00' among the 13 "
        "looked at in work.quarantine; present:",
        "  jobs: job00 (2), job01 (1), job02 (1), job03 (1), job04 (1), job05 (1), job06 (1), job07 (1), job08 (1), "
        "job09 (1) ... and 2 more",
        "  reasons: exhausted (12), x-death:expired (1)",
        "  last failures: 2026-11-01T08:00:00+00:00 to 2026-11-12T08:00:00+00:00",
    ]
    assert Census(queue="q").no_match_lines(chosen) == []  # nothing looked at
    census.add(item("jbo", error_type="\x1b[2J"), matched=True)
    assert census.no_match_lines(chosen) == []  # something matched
    other = Census(queue="q")
    other.add(item("a", error_type="\x1b[2J"), matched=False)
    assert other.no_match_lines(Selection(error_type="x"))[1] == "  error types: \\x1b[2J (1)"  # escaped
    assert other.no_match_lines(Selection()) == []  # no filter given


def test_matches_counts_every_item_looked_at_and_says_which_passed():
    census, chosen = Census(queue="q"), Selection(error_type="KeyError")
    assert census.matches(item("mail", error_type="builtins.KeyError"), chosen) is True
    assert census.matches(item("mail"), chosen) is False
    assert (census.looked_at, census.matched) == (2, 1)
    assert census.error_types == {"builtins.KeyError": 1, "ValueError": 1}


def test_the_next_commands_repeat_the_filters_with_the_hints_flags():
    since = datetime(2026, 11, 30, 6, 0, 1, 500, tzinfo=UTC)
    chosen = Selection(job="thumb nail", error_type="KeyError", since=since)
    assert filter_args(chosen) == [
        "--job", "thumb nail", "--error-type", "KeyError", "--since", "2026-11-30T06:00:01+00:00",
    ]  # fmt: skip
    assert parse_time(filter_args(chosen)[-1]) == since.replace(microsecond=0)  # --since reads it back
    assert after_show("work.quarantine", chosen).startswith(
        "next: fixed? amqpjobs replay work.quarantine --job 'thumb nail' --error-type KeyError --since "
    )
    assert filter_args(Selection()) == []


def test_after_showing_jobs_whose_stored_payload_is_gone_replay_is_not_the_only_advice():
    """helper-229: the worker said "a replay would fail the same way", `quarantine show` suggested a replay."""
    assert after_show("big.quarantine", Selection(reason="payload-missing")) == (
        "next: payloads restored to the store? amqpjobs replay big.quarantine --reason payload-missing --canary 1; "
        "else enqueue these jobs again with their payloads, then amqpjobs quarantine purge big.quarantine --reason "
        "payload-missing"
    )


def test_the_progress_line_names_the_phase_only_of_a_canary_run():
    report = ReplayReport(queue="work.quarantine", replayed=40, elapsed=0.8)
    assert progress_line(report, None) == "replayed 40 (50/s)"
    report.phase = "canary"
    assert progress_line(report, 50) == "canary: replayed 40 of 50"
    report.phase = "rest"
    assert progress_line(report, 2) == "rest: replayed 40 (50/s)"


def test_a_cut_short_replay_says_how_many_moved_and_how_many_may_be_in_both_places():
    report = ReplayReport(queue="work.quarantine", replayed=4)
    assert report.cut_short(2, "NOT_FOUND - no queue") == (
        "replay from 'work.quarantine' interrupted after 4 moved (the one in flight may be in both places: "
        "a duplicate, never a loss): NOT_FOUND - no queue"
    )
    assert "(the 10 at most in flight may be in both places: duplicates, never losses)" in report.cut_short(500, "x")


def test_a_cut_short_dry_run_says_nothing_moved():
    report = ReplayReport(queue="work.quarantine", replayed=25)  # a dry run's replayed: the moves it would do
    assert report.cut_short(50, "INTERNAL_ERROR", dry_run=True) == (
        "replay --dry-run from 'work.quarantine' interrupted after 25 that would move (nothing moved): INTERNAL_ERROR"
    )
