"""The one rule for a breaker record's state in ``status`` (--json and the text alike)."""

from __future__ import annotations

import pytest

from amqpjobs.runtime.breaker_status import breaker_note, breaker_state
from amqpjobs.wire.breakers import OpenRecord

NOW = 1_000_000.0


@pytest.mark.parametrize(
    ("opened_at", "until", "probing", "state"),
    [
        (NOW - 5, NOW + 25, False, "open"),
        (NOW - 30, NOW - 1, False, "half-open"),  # the cool-down is over: the next delivery probes
        (NOW - 30, NOW + 1, True, "half-open"),  # a probe runs (a clock a second ahead wrote until)
        (NOW + 86400, NOW + 86430, False, "dated-ahead"),  # no worker waits until then
        (NOW + 86400, NOW + 86430, True, "half-open"),  # a worker probes it after its own cool-down
    ],
)
def test_a_records_state(opened_at: float, until: float, probing: bool, state: str) -> None:
    assert breaker_state(OpenRecord(opened_at, until, 5), probing, NOW) == state


def test_the_text_follows_the_state_alone() -> None:
    entry = {"job": "flaky", "failures": 5, "opened_at": "2030-01-01T00:00:00.000Z",
             "until": "2030-01-01T00:00:02.000Z", "cool_down": 2.0, "dated_ahead": True}  # fmt: skip
    probe = {"job_id": "p-1", "since": "2026-01-01T00:00:00.000Z", "by": "h:1:w"}
    assert breaker_note({**entry, "state": "dated-ahead"}).startswith(
        "circuit breaker of job 'flaky' is dated ahead (after 5 failure(s)); its record is dated ahead"
    )
    assert breaker_note({**entry, "state": "half-open", "probe": probe}) == (
        "circuit breaker of job 'flaky' is half-open (opened after 5 failure(s) at 2030-01-01T00:00:00.000Z): "
        "a probe runs (id 'p-1', since 2026-01-01T00:00:00.000Z, on h:1:w)"
    )
