"""A time option of 8 bare digits that read as a calendar date (YYYYMMDD) is refused, naming both readings.

Before: ``--since 20261206`` was 20,261,206 seconds ago (234 days: every failure since April),
and ``schedule list --after 20261206`` a Unix time, 1970-08-23, where the user most likely meant
2026-12-06; a bare Unix time was refused already (e25f9fa). Now both options say what the digits
read as either way and how to write each. No broker: refused before a connect (port 1).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from amqpjobs.cli._filters import selection
from amqpjobs.wire.settings import broker_settings
from tests.integration.helpers import cli_refused

pytestmark = pytest.mark.version_independent

NOWHERE = broker_settings("amqp://guest:guest@127.0.0.1:1/")
SINCE_COMMANDS = [
    ["replay", "work.quarantine", "--dry-run"],
    ["quarantine", "show", "work.quarantine"],
    ["quarantine", "park", "work.quarantine", "--yes"],
    ["quarantine", "unpark", "work.parked", "--yes"],
    ["quarantine", "purge", "work.quarantine", "--yes"],
]


@pytest.mark.parametrize("args", SINCE_COMMANDS, ids=lambda a: "-".join(a[:2]))
@pytest.mark.parametrize("value", ["20261206", " 20260228 "])
def test_a_since_of_8_digits_that_reads_as_a_date_is_refused_naming_both_readings(args: list[str], value: str) -> None:
    said = cli_refused(NOWHERE, *args, "--since", value)
    digits = value.strip()
    date = f"{digits[:4]}-{digits[4:6]}-{digits[6:]}"
    days = int(digits) / 86400
    assert said == (
        f"error: --since {value!r} reads as a date, {date}, and as {int(digits):,} seconds ago ({days:,.0f} days); "
        f"write the date in ISO-8601 ('{date}') or the seconds with their unit ('{digits}s')\n"
    )


def test_schedule_list_after_of_8_digits_that_reads_as_a_date_is_refused_naming_both_readings() -> None:
    assert cli_refused(NOWHERE, "schedule", "list", "tests.unit.test_cron:listed", "--after", "20261206") == (
        "error: --after '20261206' reads as a date, 2026-12-06, and as a Unix time, 1970-08-23T12:06:46Z; "
        "write the date in ISO-8601 ('2026-12-06') or the time in full ('1970-08-23T12:06:46Z')\n"
    )


@pytest.mark.parametrize(
    ("since", "seconds_ago"),
    [
        ("20261206s", 20_261_206),  # the seconds, with their unit
        ("20261306", 20_261_306),  # month 13: no date, so seconds ago as before
        ("2026120", 2_026_120),  # 7 digits: seconds ago as before
    ],
)
def test_digits_that_are_no_date_or_carry_a_unit_are_still_seconds_ago(since: str, seconds_ago: int) -> None:
    chosen = selection(None, None, None, since)
    assert chosen.since is not None
    assert abs((datetime.now(UTC) - chosen.since).total_seconds() - seconds_ago) < 10


def test_the_date_written_in_iso_8601_is_that_midnight_utc() -> None:
    chosen = selection(None, None, None, "2026-01-06")
    assert chosen.since == datetime(2026, 1, 6, tzinfo=UTC)
    assert chosen.since < datetime.now(UTC) - timedelta(days=1)
