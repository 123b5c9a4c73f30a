"""The pure rules of poison containment: screening a delivery, the isolation gate, the default timeout."""

from __future__ import annotations

import asyncio

import pytest

from amqpjobs.jobs.crash import STARTS, Screening, screen, seal_waiting_start, waiting_start
from amqpjobs.jobs.isolation import IsolationGate
from amqpjobs.jobs.outcome import Ack, Duplicate, HandBack, Quarantine, Register, RetryLater
from amqpjobs.runtime.worker import Outcome
from amqpjobs.runtime.worker_config import default_timeout


@pytest.mark.parametrize(
    ("redelivered", "headers", "expected"),
    [
        (False, {}, Screening("run", 1)),  # a fresh job
        (False, {STARTS: 1}, Screening("run", 1)),
        (False, {STARTS: 3}, Screening("alone", 3)),  # a registered start after the first
        (True, {}, Screening("register", 2)),  # the first start ended without an outcome
        (True, {STARTS: 5}, Screening("register", 6)),
        (True, {STARTS: 6}, Screening("crashed", 6)),  # start max_redeliveries + 1 ended too
        (True, {STARTS: 40}, Screening("crashed", 6)),  # no worker writes over the bound: read as the bound
        (False, {STARTS: 999}, Screening("alone", 6)),  # a forged suspect runs as the last start, said so
        (False, {STARTS: 7}, Screening("alone", 6)),
        (True, {STARTS: "garbage"}, Screening("register", 2)),  # a foreign value counts as start 1
        (True, {STARTS: -3}, Screening("register", 2)),
        (False, {STARTS: b"4"}, Screening("alone", 4)),
    ],
)
def test_screen(redelivered: bool, headers: dict[str, object], expected: Screening) -> None:
    """A delivery from the suspects queue, where the start count is the workers' own."""
    assert screen(redelivered, headers, max_redeliveries=5, registered=True) == expected


@pytest.mark.parametrize(
    ("redelivered", "headers", "expected"),
    [
        (False, {}, Screening("run", 1)),
        (False, {STARTS: 3}, Screening("run", 1)),  # not a registered start: an ordinary first one
        (True, {}, Screening("register", 2)),
        (True, {STARTS: 2**40}, Screening("register", 2)),  # a publisher's count charges no crash
        (True, {STARTS: 6}, Screening("register", 2)),
    ],
)
def test_screen_ignores_a_start_count_outside_the_suspects_queue(
    redelivered: bool, headers: dict[str, object], expected: Screening
) -> None:
    assert screen(redelivered, headers, max_redeliveries=5, registered=False) == expected


def test_screen_bound_of_one_quarantines_at_the_second_crash() -> None:
    assert screen(True, {}, 1, registered=False) == Screening("register", 2)
    assert screen(True, {STARTS: 2}, 1, registered=True) == Screening("crashed", 2)


def test_screen_takes_every_redelivery_for_a_start_whatever_its_counters() -> None:
    """4.3 quorum queues: a nack, a consumer timeout and a partition all raise only x-acquired-count
    (release notes 4.3.0), and a consumer timeout returns runs still going: no counter tells them apart."""
    assert screen(True, {"x-acquired-count": 2}, 5, registered=False) == Screening("register", 2)
    assert screen(True, {"x-delivery-count": 1, "x-acquired-count": 3}, 5, registered=False) == Screening("register", 2)


async def test_isolation_gate_waits_for_ordinary_runs_and_refuses_others_meanwhile() -> None:
    gate = IsolationGate()
    assert gate.try_enter()
    assert gate.try_enter()
    assert gate.try_alone()
    assert not gate.try_alone()  # one suspect at a time
    assert not gate.try_enter()  # no ordinary start while a suspect waits
    idle = asyncio.create_task(gate.idle())
    await asyncio.sleep(0)
    assert not idle.done()
    gate.leave()
    await asyncio.sleep(0)
    assert not idle.done()
    assert gate.running == 1
    gate.leave()
    await asyncio.wait_for(idle, 1)
    gate.release_alone()
    assert gate.try_enter()
    assert not gate.suspect_pending


def test_default_timeout_is_just_below_the_consumer_timeout() -> None:
    assert default_timeout(1800) == 1710
    assert default_timeout(5) == 4
    assert default_timeout(1) == 0.5


def test_outcome_kinds() -> None:
    def kind(decision: object, acked: bool = True, uncertain: bool = False) -> str:
        return Outcome(decision, "j", "id", 1, 0.0, acked, uncertain=uncertain).kind  # type: ignore[arg-type]

    assert kind(Ack()) == "succeeded"
    assert kind(Ack(), uncertain=True) == "ack_uncertain"
    assert kind(Ack(), acked=False, uncertain=True) == "ack_uncertain"
    assert kind(Register(2)) == "redelivered"
    assert kind(HandBack()) == "handed_back"
    assert kind(Register(2), acked=False) == "abandoned"
    assert kind(RetryLater(2, 0, 1.0)) == "retried"
    assert kind(RetryLater(1, 0, 1.0, wait=True)) == "deferred"
    assert kind(Duplicate()) == "duplicate"
    assert kind(Quarantine("exhausted")) == "quarantined"
    assert kind(Quarantine("exhausted"), acked=False) == "abandoned"
    rejected = Outcome(Quarantine("x-death:rejected"), "j", "id", 1, 0.0, False, rejected=True)
    assert rejected.kind == "quarantined"


async def test_ordinary_starts_wait_while_a_registration_is_under_way():
    gate = IsolationGate()
    await asyncio.wait_for(gate.until_registered(), 1)  # none: at once
    gate.registration_begins()
    gate.registration_begins()
    waiting = asyncio.ensure_future(gate.until_registered())
    gate.registration_ends()
    await asyncio.sleep(0.01)
    assert not waiting.done()  # one is still under way
    gate.registration_ends()
    await asyncio.wait_for(waiting, 1)
    assert gate.try_enter()  # and ordinary starts go on


@pytest.mark.parametrize("redelivered", [False, True])
def test_a_waiting_start_back_from_its_tier_is_registered_again_for_that_start(redelivered: bool):
    from amqpjobs.jobs.crash import WAITING_START

    sealed = {WAITING_START: seal_waiting_start(KEY, "j", 4), STARTS: 4}
    waiting = waiting_start(sealed, "j", KEY)  # an idempotent job's, sealed by a worker of its ledger
    assert screen(redelivered, sealed, 5, registered=False, waiting=waiting) == Screening("register", 4)
    assert screen(False, {}, 5, registered=False, waiting=99) == Screening("register", 6)  # at most the last
    assert screen(False, {STARTS: 4}, 5, registered=False, waiting=None) == Screening("run", 1)  # ignored as before


@pytest.mark.parametrize("value", [4, 99, "abc", {"a": 1}])
def test_a_waiting_start_on_a_job_that_never_waits_is_a_publishers_and_ignored(value: object):
    """Only an idempotent job's suspect waits in a tier with its start; on any other job the header can only be
    another publisher's, and charges nothing (an outsider's forged 99 quarantined a job after one crash)."""
    from amqpjobs.jobs.crash import WAITING_START

    assert screen(False, {WAITING_START: value}, 3, registered=False, waiting=None) == Screening("run", 1)
    assert screen(True, {WAITING_START: value}, 3, registered=False, waiting=None) == Screening("register", 2)


KEY = bytes(range(32))


@pytest.mark.parametrize(
    "forged",
    [4, "4", "4:", b"4", "4:" + "0" * 32, "x:" + "0" * 32, "-4:abc", "4:" + "g" * 32, "9" * 7 + ":ab", {"a": 1}],
)
def test_a_waiting_start_without_the_ledgers_seal_is_a_publishers_and_ignored(forged: object):
    """Before: any value was honoured on an idempotent job (registered as a suspect at that start)."""
    from amqpjobs.jobs.crash import WAITING_START

    assert waiting_start({WAITING_START: forged}, "charge:1", KEY) is None
    assert waiting_start({}, "charge:1", KEY) is None


def test_a_sealed_waiting_start_holds_for_its_job_and_start_only():
    from amqpjobs.jobs.crash import WAITING_START

    sealed = seal_waiting_start(KEY, "charge:1", 3)
    assert isinstance(sealed, str)
    assert sealed.startswith("3:")
    assert waiting_start({WAITING_START: sealed}, "charge:1", KEY) == 3
    assert waiting_start({WAITING_START: sealed.encode()}, "charge:1", KEY) == 3  # a bytes header (longstr)
    assert waiting_start({WAITING_START: sealed}, "charge:2", KEY) is None  # copied onto another job
    assert waiting_start({WAITING_START: "5" + sealed[1:]}, "charge:1", KEY) is None  # its start raised
    assert waiting_start({WAITING_START: sealed}, "charge:1", bytes(32)) is None  # another ledger's
    # a ledger that keeps no key: the value as it is (as before)
    assert seal_waiting_start(None, "charge:1", 3) == 3
    assert waiting_start({WAITING_START: 3}, "charge:1", None) == 3


def test_only_a_suspects_wait_carries_the_waiting_start():
    from amqpjobs.jobs.crash import WAITING_START
    from amqpjobs.jobs.failure import retry_headers, unstarted_headers

    def tier_copy(decision: RetryLater, received: dict[str, object]) -> dict[str, object]:
        return retry_headers(received, decision, 0, "jobs", "work", "now", timestamp=None)

    assert tier_copy(RetryLater(1, 0, 1.0, wait=True, start=3), {STARTS: 3})[WAITING_START] == 3
    sealed = retry_headers({STARTS: 3}, RetryLater(1, 0, 1.0, wait=True, start=3), 0, "jobs", "work", "now",
                           timestamp=None, job_id="j", key=KEY)[WAITING_START]  # fmt: skip
    assert sealed == seal_waiting_start(KEY, "j", 3)
    assert WAITING_START not in tier_copy(RetryLater(1, 0, 1.0, wait=True), {WAITING_START: 3})  # an ordinary wait
    assert WAITING_START not in tier_copy(RetryLater(2, 0, 1.0), {WAITING_START: 3, STARTS: 3})  # an outcome
    registered = unstarted_headers({WAITING_START: 3}, Register(3), "work", "jobs", "work", "h", 1, "now",
                                   timestamp=None)  # fmt: skip
    assert (registered[STARTS], WAITING_START in registered) == (3, False)
