"""Which queue a holding command (quarantine show/purge/replay/park/unpark) is given, said before any look-up."""

from __future__ import annotations

import pytest

from amqpjobs.errors import ConfigurationError
from amqpjobs.jobs.holding_moves import other_queue_problem, unpark_source


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("amqpjobs.ledger.shop", "'amqpjobs.ledger.shop' is the ledger marker of app shop, not a quarantine or "
                                 "parked queue: give a job queue's name"),
        ("amqpjobs.scheduler.shop.leader", "is a scheduler queue of app shop, not a quarantine or parked queue: give "
                                           "a job queue's name"),
        ("work.retry.5s", "is retry tier 5s of work queue work (job queue work), not a quarantine or parked queue: "
                          "give its job queue, work"),
        ("work.suspects", "is the suspects queue of job queue work, not a quarantine or parked queue: give its job "
                          "queue, work"),
    ],
)  # fmt: skip
def test_another_queue_of_ours_is_named_for_what_it_is_and_unpark_says_so_too(name: str, words: str) -> None:
    problem = other_queue_problem(name)
    assert problem is not None
    assert words in problem
    with pytest.raises(ConfigurationError) as caught:  # helper-228: unpark said "no parked queue '<name>.parked'"
        unpark_source(name)
    assert str(caught.value) == problem


@pytest.mark.parametrize(("name", "source"), [("work", "work.parked"), ("work.parked", "work.parked")])
def test_a_job_queue_or_its_parked_queue_is_taken(name: str, source: str) -> None:
    assert other_queue_problem(name) is None
    assert unpark_source(name) == source
