"""iso_utc: seconds since the epoch as the ISO-8601 UTC text of every ``amqpjobs-*-at`` header and event (no broker)."""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime

import pytest

from amqpjobs.jobs import envelope
from amqpjobs.jobs.timestamps import iso_utc


def _reference(when: float) -> str:
    """The text datetime makes of it (microseconds rounded half to even, then cut to milliseconds)."""
    return datetime.fromtimestamp(when, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def test_iso_utc_is_what_datetime_makes_of_the_timestamp_at_every_rounding_edge() -> None:
    base = 1_796_000_000
    edges = [0, 0.0, 0.0005, 0.0004999, 0.9995, 0.9999994, 0.9999995, 0.9999996, 0.9999999, 0.5, 0.123, 0.1235]
    table = (
        [base + e for e in edges] + [e for e in edges] + [-0.5, -0.0000004, -1.9999996, 86_399.9999999, 253402300799]
    )
    table += [951_782_400 - 0.0000005, 1_709_251_199.9999995, base, float(base), 1_796_000_000.5]  # leap days, ints
    rng = random.Random(22)
    table += [rng.uniform(0, 4_102_444_800) for _ in range(20_000)]
    table += [base + rng.randrange(1_000_000) / 1_000_000 for _ in range(5_000)]  # whole microseconds
    assert [iso_utc(t) for t in table] == [_reference(t) for t in table]
    assert iso_utc(1_796_000_000.5) == "2026-11-30T00:53:20.500Z"
    assert envelope.iso_utc is iso_utc  # one rule, still importable from the envelope


def test_iso_utc_of_no_timestamp_is_now_and_of_no_number_raises_as_datetime_does() -> None:
    before = _reference(math.floor(datetime.now(UTC).timestamp()))[:19]
    now = iso_utc()
    assert now[:19] >= before
    assert (now[-1], len(now)) == ("Z", 24)
    for bad, error in ((math.nan, ValueError), (math.inf, OverflowError), (-math.inf, OverflowError)):
        with pytest.raises(error):
            iso_utc(bad)
