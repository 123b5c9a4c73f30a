"""The circuit breaker's pure rules: settings, what counts, and the state machine (an injected clock)."""

from __future__ import annotations

from typing import Any

import pytest

from amqpjobs import App, Breaker, ConfigurationError
from amqpjobs.jobs.breaker import BreakerMachine, Notice, counts_as_failure
from amqpjobs.jobs.outcome import Ack, Duplicate, HandBack, Outcome, Quarantine, Register, RetryLater
from amqpjobs.wire.breakers import OpenRecord


def test_settings_take_seconds_and_duration_strings() -> None:
    assert Breaker(failures=5, window="10s", cool_down=5) == Breaker(5, 10.0, "5s")
    assert (Breaker().failures, Breaker().window, Breaker().cool_down) == (20, 60.0, 30.0)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"failures": 0}, "Breaker(failures=0): failures must be a whole number from 1 to 1,000,000"),
        ({"failures": 2.5}, "Breaker(failures=2.5)"),
        ({"failures": True}, "Breaker(failures=True)"),
        ({"window": "ten seconds"}, "Breaker(window='ten seconds'): 'ten seconds' is not a duration"),
        ({"cool_down": 0}, "Breaker(cool_down=0): cool_down must be at least 1s"),
        ({"cool_down": -1}, "Breaker(cool_down=-1): cool_down must be at least 1s"),
        ({"window": -0.5}, "Breaker(window=-0.5): window must be at least 1s"),
        # helper-230: "-1s" was told "0 or a positive duration" (0 is refused); nan, inf named the value, not the rule
        (
            {"window": float("nan")},
            "Breaker(window=nan): window must be a duration from 1s to a day, e.g. window='30s'",
        ),
        ({"window": float("inf")}, "Breaker(window=inf): window must be a duration from 1s to a day"),
        ({"cool_down": "-1s"}, "Breaker(cool_down='-1s'): cool_down must be at least 1s"),
        ({"cool_down": " -5m"}, "cool_down must be at least 1s"),
    ],
)
def test_bad_settings_name_the_field_and_the_fix(kwargs: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        Breaker(**kwargs)
    assert words in str(info.value)


def test_a_job_with_a_breaker_needs_nameable_state_queues() -> None:
    app = App("a")
    with pytest.raises(ConfigurationError, match="breaker must be a Breaker"):
        app.job("j", queue="work", breaker={"failures": 3})  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"its breaker's state queue can't be named.*characters"):
        app.job("send mail!", queue="work", breaker=Breaker())
    app.job("j", queue="work", breaker=Breaker(3))(lambda p, c: None)
    assert app.resolve("j").breaker == Breaker(3)


def outcome(decision: Any, ran: bool = True) -> Outcome:
    return Outcome(decision, "j", "id", 1, 0.0, True, ran=ran)


@pytest.mark.parametrize(
    ("case", "counts"),
    [
        (outcome(RetryLater(2, 0, 1.0)), True),  # a handler error or Retry, attempts left
        (outcome(Quarantine("exhausted")), True),  # the last attempt failed
        (outcome(Quarantine("timeout")), True),
        (outcome(RetryLater(1, 0, 1.0, wait=True)), False),  # a wait: claim, ledger, open breaker
        (outcome(Quarantine("permanent")), False),
        (outcome(Quarantine("rejected")), False),
        (outcome(Quarantine("invalid-payload"), ran=False), False),
        (outcome(Quarantine("unknown-job"), ran=False), False),
        (outcome(Quarantine("crashed")), False),
        (outcome(RetryLater(2, 0, 1.0), ran=False), False),  # the payload store failed: the handler never ran
        (outcome(Duplicate()), False),
        (outcome(HandBack(), ran=False), False),
        (outcome(Register(2), ran=False), False),
        (outcome(Ack()), False),
    ],
)
def test_what_counts_as_a_failure(case: Outcome, counts: bool) -> None:
    assert counts_as_failure(case) is counts


NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z


def kept(decision: Any, ran_at: str) -> Outcome:
    """A decision an earlier run kept past its worker's stop, carried out here (its run failed at ``ran_at``)."""
    return Outcome(decision, "j", "id", 1, 0.0, True, decided=True, reached_at=ran_at)


@pytest.mark.parametrize(
    ("case", "counts"),
    [
        (kept(RetryLater(2, 0, 1.0), "2027-01-15T07:59:30.000Z"), True),  # its run failed 30 s ago: within 60 s
        (kept(Quarantine("exhausted"), "2027-01-15T07:59:30.000Z"), True),
        (kept(Quarantine("timeout"), "2027-01-15T07:59:30.000Z"), True),
        (kept(RetryLater(2, 0, 1.0), "2027-01-15T07:58:59.000Z"), False),  # 61 s ago: out of the window by now
        (kept(RetryLater(2, 0, 1.0), ""), False),  # no time: can't be placed in the window
        (kept(RetryLater(2, 0, 1.0), "yesterday"), False),
        (kept(RetryLater(2, 0, 1.0), "2027-01-15T08:02:00.000Z"), False),  # dated more than a window ahead
        (kept(Quarantine("rejected"), "2027-01-15T07:59:30.000Z"), False),  # never a transient failure
        (kept(Quarantine("permanent"), "2027-01-15T07:59:30.000Z"), False),
    ],
)
def test_a_kept_decision_counts_as_its_runs_failure_within_the_window(case: Outcome, counts: bool) -> None:
    """Its run's worker stopped before settling it (counted nothing): the next worker counts it, once."""
    assert counts_as_failure(case, NOW, 60.0) is counts


# (event, time, expected result, expected state after); events: fail, verdict, close, reopen
TABLE = [
    ("fail", 0.0, None, "closed"),
    ("fail", 4.0, None, "closed"),
    ("verdict", 5.0, "start", "closed"),
    ("fail", 10.5, None, "closed"),  # the one at 0.0 left the 10 s window: 2 in it
    ("fail", 11.0, "open", "open"),  # 3 within (1.0, 11.0]: opens at 11.0 until 16.0
    ("fail", 11.5, None, "open"),  # not counted while open
    ("verdict", 15.999, "wait", "open"),
    ("verdict", 16.0, "probe", "half-open"),  # the cool-down is over
    ("verdict", 16.1, "probe", "half-open"),  # which worker probes: the caller's lock decides
    ("reopen", 16.2, "open", "open"),  # the probe failed: until 21.2
    ("verdict", 21.1, "wait", "open"),
    ("verdict", 21.2, "probe", "half-open"),
    ("close", 21.3, "closed", "closed"),
    ("fail", 21.4, None, "closed"),  # counting starts afresh
    ("fail", 21.5, None, "closed"),
    ("verdict", 21.6, "start", "closed"),
]


def test_state_machine_table() -> None:
    machine = BreakerMachine(Breaker(failures=3, window=10, cool_down=5))
    for event, at, result, state in TABLE:
        got: str | None
        if event == "fail":
            change = machine.failure(at)
            got = None if change is None else change.state
        elif event == "verdict":
            got, _ = machine.verdict(at)
        elif event == "close":
            change = machine.closed(at)
            got = None if change is None else change.state
        else:
            change = machine.reopened(at)
            got = None if change is None else change.state
        assert (got, machine.state) == (result, state), (event, at)
    assert machine.closed(30.0) is None  # already closed


def test_opening_stamps_and_notices_from_other_workers() -> None:
    machine = BreakerMachine(Breaker(failures=2, window=10, cool_down=5))
    machine.failure(3.0)
    change = machine.failure(1.0)  # notices may arrive out of order: the latest stamp opens it
    assert change is not None
    assert (change.at, change.until, change.failures) == (3.0, 8.0, 2)
    assert machine.opened(2.0, 7.0) is None  # told of an opening that ends sooner: nothing changes
    longer = machine.opened(4.0, 9.0)
    assert longer is not None
    assert (machine.opened_at, machine.until) == (4.0, 9.0)
    assert machine.verdict(8.9) == ("wait", None)


def test_notice_and_record_round_trip() -> None:
    notice = Notice("open", "j", 12.5, 17.5, "host:1:ab")
    assert Notice.decode(notice.encode()) == notice
    assert Notice.decode(b"not json") is None
    assert Notice.decode(b'{"kind": "other", "job": "j", "at": 1}') is None
    record = OpenRecord(1764565500.123, 1764565505.123, 5)
    assert OpenRecord.from_arguments(record.arguments()) == record
    assert OpenRecord.from_arguments({"x-queue-type": "classic"}) is None


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"cool_down": 1e300}, "Breaker(cool_down=1e+300): cool_down must be at most a day (86400s)"),
        ({"cool_down": "2d"}, "Breaker(cool_down='2d'): cool_down must be at most a day"),
        ({"window": 86_401}, "Breaker(window=86401): window must be at most a day"),
        ({"failures": 1_000_001}, "failures must be a whole number from 1 to 1,000,000"),
    ],
)
def test_settings_are_bounded(kwargs: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        Breaker(**kwargs)
    assert words in str(info.value)
    assert Breaker(failures=1_000_000, window="1d", cool_down=86_400) == Breaker(1_000_000, 86_400.0, "24h")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"window": 1e-9}, "Breaker(window=1e-09): window must be at least 1s"),
        ({"window": 0}, "Breaker(window=0): window must be at least 1s"),
        ({"window": "0s"}, "Breaker(window='0s'): window must be at least 1s"),
        ({"cool_down": 1e-9}, "Breaker(cool_down=1e-09): cool_down must be at least 1s"),
        ({"cool_down": "999ms"}, "Breaker(cool_down='999ms'): cool_down must be at least 1s"),
    ],
)
def test_windows_and_cool_downs_below_a_second_are_refused(kwargs: dict[str, Any], message: str) -> None:
    name = next(iter(kwargs))
    with pytest.raises(ConfigurationError) as info:
        Breaker(**kwargs)
    assert str(info.value) == (
        f"{message} (failure notices travel through the broker and a worker tries the probe lock once a "
        f"second), e.g. {name}='30s'"
    )
    assert Breaker(window=1, cool_down="1s") == Breaker(20, 1.0, 1.0)


def test_a_bad_duration_says_its_advice_once() -> None:
    with pytest.raises(ConfigurationError) as info:
        Breaker(cool_down=True)
    assert (
        str(info.value) == "Breaker(cool_down=True): True is not a duration; give seconds or a string like '30s', '5m'"
    )


def waits_until_probe(machine: BreakerMachine, deferred_at: float, tiers: tuple[float, ...]) -> tuple[int, float]:
    """A delivery deferred at ``deferred_at`` and again each time it comes back while open: (waits, back at)."""
    now, waits = deferred_at, 0
    while now < machine.until:
        now += tiers[machine.waiting_tier(now, tiers)]
        waits += 1
    return waits, now


@pytest.mark.parametrize("tiers", [(1.0, 5.0), (0.25, 0.5, 1.0, 2.0, 4.0), (1.0, 5.0, 30.0, 120.0), (2.0,)])
def test_an_open_breaker_parks_deliveries_in_the_longest_tier_that_fits(tiers: tuple[float, ...]) -> None:
    machine = BreakerMachine(Breaker(failures=1, window=10, cool_down=10))
    machine.opened(100.0, 110.0)
    assert machine.waiting_tier(100.0, (1.0, 5.0)) == 1
    assert machine.waiting_tier(105.0, (1.0, 5.0)) == 1  # exactly 5 s left: the 5 s tier, back at the end
    assert machine.waiting_tier(105.001, (1.0, 5.0)) == 0
    assert machine.waiting_tier(109.5, (1.0, 5.0)) == 0  # less than the first tier left: the first tier
    worst = 0
    for i in range(1000):  # deferred anywhere in the cool-down
        waits, back = waits_until_probe(machine, 100.0 + i / 100, tiers)
        assert 110.0 <= back <= 110.0 + tiers[0]  # none later than the end plus the first tier
        worst = max(worst, waits)
    per_first_tier = round(10 / tiers[0])  # what it cost before: one wait per first-tier delay
    assert worst <= {(1.0, 5.0): 6, (0.25, 0.5, 1.0, 2.0, 4.0): 6, (1.0, 5.0, 30.0, 120.0): 6, (2.0,): 5}[tiers]
    assert worst < per_first_tier or len(tiers) == 1
    machine.verdict(110.0)  # half-open: the probe runs elsewhere, the rest wait one first tier at a time
    assert machine.waiting_tier(110.0, tiers) == 0


def test_an_opening_written_by_a_clock_ahead_is_cut_to_one_cool_down() -> None:
    machine = BreakerMachine(Breaker(failures=1, window=10, cool_down=30))
    assert machine.trusted(900.0, 930.0, now=1000.0) == (900.0, 930.0)  # believable: as written
    assert machine.trusted(1100.0, 1130.0, now=1000.0) == (1000.0, 1030.0)  # 100 s ahead
    assert machine.trusted(990.0, 1e300, now=1000.0) == (990.0, 1030.0)
    assert machine.trusted(float("nan"), float("inf"), now=1000.0) == (1000.0, 1030.0)
    assert Notice.decode(b'{"kind": "open", "job": "j", "at": 1, "until": Infinity}') is None


def test_would_open_counts_failures_not_heard_back_in_the_same_window() -> None:
    machine = BreakerMachine(Breaker(failures=3, window=10, cool_down=5))
    assert machine.failure(100.0) is None
    assert not machine.would_open([])
    assert not machine.would_open([101.0])  # 2 of 3
    assert machine.would_open([101.0, 102.0])  # the third would open it
    assert not machine.would_open([111.0, 112.0])  # 100.0 is out of the window by then
    assert machine.failure(101.0) is None
    assert machine.failure(102.0) is not None  # what would_open foretold
    assert not machine.would_open([103.0, 104.0, 105.0])  # not closed: nothing to open
