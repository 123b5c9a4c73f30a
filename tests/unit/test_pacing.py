"""Pace: moves at a rate, no burst after a stall (pure; the broker-side proof is in test_quarantine)."""

from __future__ import annotations

import pytest

from amqpjobs.jobs.pacing import CATCH_UP, Pace

pytestmark = pytest.mark.version_independent


def starts(pace: Pace, now: float, n: int) -> list[float]:
    """Start times of ``n`` moves, each started as soon as its wait allows."""
    out = []
    for _ in range(n):
        now += pace.wait(now)
        out.append(now)
    return out


def test_moves_start_one_interval_apart_from_the_first() -> None:
    assert starts(Pace(4.0), 100.0, 5) == [100.0, 100.25, 100.5, 100.75, 101.0]


def test_no_rate_never_waits() -> None:
    assert starts(Pace(None), 7.0, 3) == [7.0, 7.0, 7.0]


def test_a_stall_is_not_made_up_beyond_the_catch_up() -> None:
    pace = Pace(100.0)
    assert starts(pace, 0.0, 10)[-1] == pytest.approx(0.09)
    # stalled until 5.0 s: 490 moves owed; only CATCH_UP s of them (10) start at once
    after = starts(pace, 5.0, 30)
    at_once = [t for t in after if t == 5.0]
    assert len(at_once) == round(100 * CATCH_UP) + 1
    assert after[-1] == pytest.approx(5.0 + (30 - len(at_once)) / 100)


def test_small_lateness_is_made_up_so_the_average_keeps_the_rate() -> None:
    pace = Pace(10.0)
    now = 0.0
    for _ in range(100):
        now += pace.wait(now) + 0.002  # each sleep overshoots by 2 ms
    assert now == pytest.approx(9.9 + 0.002, abs=1e-6)  # the 100th started at 9.9 s, not 9.9 + 0.2
