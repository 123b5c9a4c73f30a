"""The quarantine filter options (``--job/--error-type/--reason/--since``) and the CLI's ISO-time options."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from typing import Any, Final, TypeVar

import click

from amqpjobs.cli._common import Decimal
from amqpjobs.durations import DurationTooLongError, parse_duration
from amqpjobs.errors import ConfigurationError
from amqpjobs.jobs.header_values import read_number
from amqpjobs.jobs.outcome import REASONS
from amqpjobs.jobs.quarantine import BROKER_REASONS, NO_EVIDENCE, OTHER_REASON, Selection, is_shown_reason
from amqpjobs.jobs.replay_plan import check_rate
from amqpjobs.jobs.timestamps import parse_time, utc_out_of_range

F = TypeVar("F", bound=Callable[..., Any])


def selection(job: str | None, error_type: str | None, reason: str | None, since: str | None) -> Selection:
    """The quarantine filter the ``--job/--error-type/--reason/--since`` options give.

    Raises:
        ConfigurationError: an empty option, a reason that is none, a ``--since`` that is no
            duration nor ISO-8601 time, a bare number of 31 years or more (:func:`bare_number_problem`)
            or of 8 digits that read as a date (:func:`bare_date_problem`), or a time later than now (it
            would select nothing): exit 2, before the broker is asked anything.

    """
    when = None
    if since is not None and not since.strip():
        raise ConfigurationError("--since is empty: give a duration ('2h') or an ISO-8601 time, or leave it out")
    for flag, value in (("--job", job), ("--error-type", error_type), ("--reason", reason)):
        if value is not None and not value.strip():
            raise ConfigurationError(f"{flag} is empty: give a value or leave it out")
    if reason is not None and not is_shown_reason(reason):
        raise ConfigurationError(
            f"--reason {reason!r} is not a reason; use one of {', '.join(REASONS)}, x-death:<reason> "
            f"({', '.join(BROKER_REASONS)}) or x-death:unknown for broker-side dead-letters, {NO_EVIDENCE} "
            f"(published straight into the quarantine queue), or {OTHER_REASON}<reason> for evidence of another stack "
            "(as quarantine list shows it)"
        )
    if since:
        if problem := bare_number_problem(since) or bare_date_problem("--since", since):
            raise ConfigurationError(problem)
        try:
            when = datetime.now(UTC) - timedelta(seconds=parse_duration(since))
        except DurationTooLongError as exc:
            raise ConfigurationError(f"--since {since!r}: {exc}") from None
        except ValueError as exc:
            if parse_time(since) is None and _DURATION_LIKE.match(since):  # a duration refused: say why, as others do
                raise ConfigurationError(f"--since {exc}; or give an ISO-8601 time ('2026-11-29T08:00Z')") from None
            expected = "give a duration ('2h', '30m') or an ISO-8601 time ('2026-11-29T08:00Z')"
            when = time_option("--since", since, expected)
        now = datetime.now(UTC)
        if when > now:  # no failure is recorded later than now: it would read the whole queue to select nothing
            raise ConfigurationError(
                f"--since {since!r} is {iso_seconds(when)} in UTC, later than now ({iso_seconds(now)}): no "
                "failure is that recent, so it would select nothing; give a time at or before now, or a "
                "duration ago ('2h')"
            )
    return Selection(job=job, error_type=error_type, reason=reason, since=when)


#: ``--since`` text that is meant as a duration (a sign or digits, then a unit or none), not an ISO-8601 time:
#: refused, it is said why by the duration rule (``'6M' is ambiguous ...``, ``'0s' must be a positive ...``).
_DURATION_LIKE: Final = re.compile(r"\s*[+-]?[0-9.]+\s*(?:[A-Za-z]+\s*|[0-9.]+[A-Za-z]*\s*)*$")

#: A ``--since`` number without a unit this large (seconds: over 31 years) is as likely a Unix time (``date +%s``).
BARE_NUMBER_AMBIGUOUS: Final = 1_000_000_000


def bare_number_problem(since: str) -> str | None:
    """Why ``--since`` text that is a number without a unit can't be taken as seconds ago, or None.

    Durations take a bare number as seconds (``--since 3600`` is an hour ago), but one of
    :data:`BARE_NUMBER_AMBIGUOUS` or more reaches back over 31 years, where the number is far
    more likely a Unix time in seconds or milliseconds: read as seconds ago, ``1764493200``
    would select every failure since 1971 (a replay of the whole quarantine).
    """
    number = read_number(since)
    if number is None or number < BARE_NUMBER_AMBIGUOUS:
        return None
    unix = parse_time(since)  # seconds, or milliseconds above 2**32 - 1: the one time rule
    return (
        f"--since {since!r} is a number without a unit: as seconds ago it reaches back {number / 31_557_600:,.0f} "
        f"years{'; as a Unix time it is ' + iso_seconds(unix) if unix is not None else ''}; write a duration with "
        "its unit ('2h', '30d') or the time in ISO-8601 ('2026-11-29T08:00Z')"
    )


def date_digits(value: str) -> date | None:
    """The calendar date that bare 8-digit text reads as, YYYYMMDD (``" 20261206 "``: 2026-12-06), or None."""
    digits = value.strip()
    if len(digits) != 8 or not (digits.isascii() and digits.isdigit()):
        return None
    try:
        return datetime.strptime(digits, "%Y%m%d").date()
    except ValueError:  # no such day (month 13, 30 February): the number alone
        return None


def bare_date_problem(option: str, value: str) -> str | None:
    """Why time option text of 8 bare digits that read as a date YYYYMMDD can't be taken as a number, or None.

    ``--since 20261206`` would be 20,261,206 seconds ago (234 days), ``--after 20261206`` the Unix
    time 1970-08-23T12:06:46Z, where the user most likely meant 2026-12-06. Both readings are
    named, and how to write each: the date in ISO-8601, or the number with its unit (``--since``)
    or as the time in full (``--after``).
    """
    day = date_digits(value)
    if day is None:
        return None
    digits = value.strip()
    if option == "--since":
        reading = f"{int(digits):,} seconds ago ({int(digits) / 86400:,.0f} days)"
        write = f"the seconds with their unit ('{digits}s')"
    else:
        unix = parse_time(digits)
        reading = f"a Unix time, {iso_seconds(unix)}" if unix is not None else "a number"
        write = f"the time in full ('{iso_seconds(unix)}')" if unix is not None else "another time in ISO-8601"
    return (
        f"{option} {value!r} reads as a date, {day.isoformat()}, and as {reading}; write the date in ISO-8601 "
        f"('{day.isoformat()}') or {write}"
    )


def iso_seconds(when: datetime) -> str:
    """An aware datetime as ISO-8601 UTC to the second (``2999-01-01T00:00:00Z``)."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def time_option(option: str, value: str, expected: str) -> datetime:
    """An option's ISO-8601 time (``--since``, ``--after``) as an aware UTC datetime.

    Raises:
        ConfigurationError: ``value`` is no such time (the message is ``option``, ``value`` and
            ``expected``), one whose UTC falls outside years 1-9999, or 8 bare digits that read as
            a date as well as a Unix time (:func:`bare_date_problem`), said so (exit 2).

    """
    if problem := bare_date_problem(option, value):
        raise ConfigurationError(problem)
    when = parse_time(value)
    if when is not None:
        return when
    side = utc_out_of_range(value)
    if side is not None:
        earlier, later = ("earlier", "later") if side == "before" else ("later", "earlier")
        year = 1 if side == "before" else 9999
        raise ConfigurationError(
            f"{option} {value!r} is an ISO-8601 time, but in UTC it falls {side} the year {year}, {earlier} than any "
            f"time this reads; give {'an' if later == 'earlier' else 'a'} {later} one"
        )
    raise ConfigurationError(f"{option} {value!r}: {expected}")


def filter_options(func: F) -> F:
    """Add the quarantine filter options to a command."""
    func = click.option("--since", help="Only failures at or after this: a duration ago ('2h') or an ISO time.")(func)
    func = click.option("--reason", help="Only this reason (exhausted, permanent, ..., or x-death:expired).")(func)
    func = click.option("--error-type", help="Only this error type (e.g. ValueError).")(func)
    func = click.option("--job", help="Only this job name.")(func)
    return func


#: ``--rate`` of the commands that take messages one by one out of a quarantine or parked queue (park, unpark,
#: a filtered purge): one option, one text. Replay's has a default of its own (50 a second).
rate_option = click.option("--rate", type=Decimal(), help="At most this many messages per second (default: no limit).")


def move_rate(rate: float | None) -> float | None:
    """``--rate`` of park, unpark and purge (per second; None: no limit), checked as replay's.

    Raises:
        ConfigurationError: NaN, infinite, or outside :func:`~amqpjobs.jobs.replay_plan.check_rate`'s bounds.

    """
    return None if rate is None else check_rate(rate)
