"""parse_time keeps the last text it read: the same text reads the same time, another text its own."""

from __future__ import annotations

from datetime import UTC, datetime

from amqpjobs.jobs.timestamps import parse_time


def test_the_same_text_twice_and_texts_in_turn_read_their_own_times() -> None:
    a, b = "2026-11-29T09:00:00.123Z", "2026-11-29T10:00:00+01:00"
    assert parse_time(a) == datetime(2026, 11, 29, 9, 0, 0, 123000, tzinfo=UTC)
    assert parse_time(a) == datetime(2026, 11, 29, 9, 0, 0, 123000, tzinfo=UTC)
    assert parse_time(b) == datetime(2026, 11, 29, 9, 0, 0, tzinfo=UTC)
    assert parse_time("not a time") is None
    assert parse_time("not a time") is None
    assert parse_time(a) == datetime(2026, 11, 29, 9, 0, 0, 123000, tzinfo=UTC)
    assert parse_time(b"2026-11-29T09:00:00Z") == datetime(2026, 11, 29, 9, 0, tzinfo=UTC)
    assert parse_time("1764406800") == datetime(2025, 11, 29, 9, 0, tzinfo=UTC)
