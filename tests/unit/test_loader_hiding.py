"""One refused value hides no other problem of its job queue (README "Validation"), whatever the refusal.

Before (helper-226), a range error (``max_priority = 0``) left the key out and with it every rule
of its job queue, so non-increasing tiers were found only on the next run; an exchange name
with a space, refused in the job queue too, left the whole job queue out (its bad name and its
tiers unseen); a list of tiers with refused ones hid the rest's sub-millisecond tier. Only a
wrong type read as a plain whole number (``5.0``) kept the checks.
"""

from __future__ import annotations

from pathlib import Path

from tests.invalid_topologies import HEADER, job
from tests.unit.test_loader import problems_of

TIERS = 'retry_tiers = ["5s", "1s"]'
NOT_INCREASING = (
    "job_queue[0].retry_tiers[1]: retry tiers must strictly increase (5s then 1s) (fix: list tiers from shortest to "
    "longest, each once)"
)


def test_a_value_out_of_range_hides_no_rule_that_does_not_read_it(tmp_path: Path) -> None:
    assert problems_of(tmp_path, HEADER + job(f"max_priority = 0\n{TIERS}")) == [
        "job_queue[0].max_priority: Input should be greater than or equal to 1 (got 0) (fix: raise the value to the "
        "minimum shown)",
        NOT_INCREASING,
    ]


def test_a_rule_that_reads_the_refused_key_is_still_not_guessed(tmp_path: Path) -> None:
    # type left out: whether delivery_limit is allowed depends on it, so that rule says nothing; the tiers' does
    said = problems_of(tmp_path, HEADER + job(f'type = "quorom"\ndelivery_limit = 3\n{TIERS}'))
    assert [line.split(":")[0] for line in said] == ["job_queue[0].type", "job_queue[0].retry_tiers[1]"]


def test_an_exchange_name_refused_in_a_job_queue_leaves_the_job_queues_other_problems_found(tmp_path: Path) -> None:
    text = f'[[exchange]]\nname = "a b"\n\n[[job_queue]]\nname = "q!"\nexchange = "a b"\n{TIERS}\n'
    said = problems_of(tmp_path, text)
    assert [line.split(": ")[0] for line in said] == [
        "exchange[0].name",
        "job_queue[0].exchange",
        "job_queue[0].retry_tiers[1]",
        "job_queue[0].name",
    ]
    assert said[2] == NOT_INCREASING
    assert said[3].startswith("job_queue[0].name: queue name 'q!' has characters the AMQP client refuses")
    assert not [line for line in said if "(refused)" in line]  # the stand-in name is never shown


def test_the_tiers_pydantic_took_in_a_list_it_refused_some_of_are_checked_each(tmp_path: Path) -> None:
    said = problems_of(tmp_path, HEADER + job('retry_tiers = [nan, 0.0001, "1.5ms", true, "5s"]'))
    assert [line.split(": ")[0] for line in said] == [
        "job_queue[0].retry_tiers[0]",
        "job_queue[0].retry_tiers[3]",
        "job_queue[0].retry_tiers[1]",
        "job_queue[0].retry_tiers[2]",
    ]
    assert said[2] == (
        "job_queue[0].retry_tiers[1]: 0.1ms: sub-millisecond tiers are refused (x-message-ttl counts whole "
        "milliseconds, 1 ms to ~49 days) (fix: use a delay between 1ms and 49d)"
    )
    assert (
        said[3] == "job_queue[0].retry_tiers[2]: 1.5ms: x-message-ttl counts whole milliseconds (fix: write 1ms or 2ms)"
    )
