"""One rule for reading times off the wire, used by every reader (worker, status, evidence).

An AMQP ``timestamp`` is meant to be seconds since the epoch, but publishers in other
languages often send milliseconds (JavaScript's ``Date.now()``). The rule is pamqp's
(``pamqp.decode.timestamp``; :mod:`amqpjobs.epochs`, re-exported here, which the wire's decoding of
a frame's timestamps uses too): a value above ``2**32 - 1`` (past the year 2106 in seconds)
is milliseconds; and one that as milliseconds would be past the year 9999 is microseconds,
then nanoseconds (:func:`epoch_seconds`). The same rule reads the management API's ``head_message_timestamp``
(the raw integer the publisher sent) and integer time headers.

A time written as text (our ``amqpjobs-*-at`` headers) is ISO-8601; one without a zone is
UTC. Every reader returns an aware datetime in UTC. Every writer writes it with
:func:`iso_utc` (``2026-11-29T09:00:00.123Z``).
"""

from __future__ import annotations

import functools
import math
import re
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, Final

from amqpjobs.epochs import MICROSECONDS_FROM as MICROSECONDS_FROM  # re-exported: the one rule's figures
from amqpjobs.epochs import MILLISECONDS_ABOVE as MILLISECONDS_ABOVE
from amqpjobs.epochs import NANOSECONDS_FROM as NANOSECONDS_FROM
from amqpjobs.epochs import NEGATIVE_FROM, epoch_datetime
from amqpjobs.epochs import epoch_seconds as epoch_seconds
from amqpjobs.jobs.header_values import amqp_type, read_number
from amqpjobs.text import as_text

#: The last text :func:`parse_time` read, and its time (a ``datetime`` can't change: shared safely).
_last_text: tuple[str, datetime | None] = ("", None)


def parse_time(value: Any) -> datetime | None:
    """Read a time from a header or property value as an aware UTC datetime.

    Accepts a ``datetime`` (naive taken as UTC), a non-negative number in any encoding
    (:func:`~amqpjobs.jobs.header_values.read_number`: an integer, float or decimal, or digits
    with at most one ``.`` as ``str`` or ``bytes``; seconds, or milliseconds above
    :data:`MILLISECONDS_ABOVE`: ``Date.now() / 1000`` and ``String(Date.now())`` alike), or
    ISO-8601 text as ``str`` or ``bytes`` (``Z`` or an offset; none means UTC). Anything else
    (a negative number, a table, a boolean), or a time out of range, is None. Text of digits
    alone is a number, never an ISO-8601 basic date: ``"20261206"`` is 20,261,206 s (1970).
    """
    global _last_text
    if type(value) is str:  # the commonest (our own headers' ISO text): no other type tests first
        last = _last_text  # one (text, time) pair, swapped whole: a worker reads a delivery's header twice
        if last[0] == value:
            return last[1]
        parsed = _from_text(value)
        _last_text = (value, parsed)
        return parsed
    if isinstance(value, datetime):
        return _in_utc(value)
    number = read_number(value)  # before 1970 (negative), NaN, infinity: None, no enqueue time of a job
    if number is not None:
        return _from_number(number)
    if isinstance(value, bytes | bytearray):
        value = as_text(value)
    return _from_text(value) if isinstance(value, str) else None


def time_problem(name: str, value: Any) -> str | None:
    """Why time header ``name``'s ``value`` (present: None is void) is no time :func:`parse_time` reads, or None.

    ``header amqpjobs-enqueued-at is a boolean, not a time ...: the timestamp property is read
    instead; ...`` (text is shown, shortened); the worker says it once per header and type.
    """
    if value is None or parse_time(value) is not None:
        return None
    if isinstance(value, str | bytes | bytearray | int | float | Decimal) and not isinstance(value, bool):
        text = as_text(value) if isinstance(value, bytes | bytearray) else value
        shown = repr(text) if len(repr(text)) <= 60 else f"{repr(text)[:40]}..."
        what = f"{shown} ({amqp_type(value)})"
    else:
        what = amqp_type(value)
    return (
        f"header {name} is {what}, not a time (ISO-8601 text, or seconds or milliseconds since the epoch, >= 0): "
        "the timestamp property is read instead; send it as ISO-8601 UTC text (2026-11-29T09:00:00.000Z)"
    )


def decoded_time(seconds: Any) -> datetime | None:
    """A ``timestamp`` already decoded to seconds since the epoch (``Delivery.timestamp``) as an aware UTC datetime.

    The unit rule (:func:`epoch_seconds`) is applied once, where the frame is decoded; read
    again, seconds past 2106 (above :data:`MILLISECONDS_ABOVE`: ``2**63 - 1`` ns is 2262) were
    taken for milliseconds (1970). None for None, 0 (never set), a negative, NaN, a time
    ``datetime`` can't hold, and anything that is no ``int`` or ``float`` seconds.
    """
    if (type(seconds) is not float and type(seconds) is not int) or not seconds > 0:
        return None
    try:
        return datetime.fromtimestamp(seconds, UTC)
    except (ValueError, OverflowError, OSError):
        return None


def _from_number(number: float) -> datetime | None:
    """A number of seconds, ms, µs or ns since the epoch (:func:`epoch_seconds`) as an aware UTC datetime, or None."""
    return epoch_datetime(number)


def _from_text(value: str) -> datetime | None:
    """Number text or ISO-8601 text as an aware UTC datetime (:func:`parse_time`'s rule), or None."""
    text = value.strip()
    if not text:
        return None
    if text[-1:].isdigit() and text.replace(".", "", 1).isdigit():  # digits (one "."): never ISO; cheap for ISO
        number = read_number(value)  # the one number rule (ASCII digits only)
        return None if number is None else _from_number(number)
    try:
        parsed = _iso(text)
    except ValueError:
        return _leap_second(text)
    return _in_utc(parsed)


#: RFC 3339 text whose seconds are 60 (a leap second): before it, and after it.
_LEAP: Final = re.compile(r"(\d{4}-\d\d-\d\d[Tt ]\d\d:59:)60((?:\.\d+)?(?:[Zz]|[+-]\d\d:\d\d)?)")


def _leap_second(text: str) -> datetime | None:
    """A leap second (``23:59:60Z``, RFC 3339 5.7) as the second after ``:59`` (POSIX time's reading), else None.

    ``datetime`` holds no second 60: ``fromisoformat`` refuses it, and a valid time from a
    publisher that keeps leap seconds was called "not a time" and replaced by the property.
    """
    match = _LEAP.fullmatch(text)
    if match is None:
        return None
    try:
        before = _in_utc(_iso(f"{match[1]}59{match[2]}"))
        return None if before is None else before + timedelta(seconds=1)
    except (ValueError, OverflowError):
        return None


def head_age(head: Any, now: float) -> float | None:
    """Seconds since a queue's head message was sent (the management API's ``head_message_timestamp``), or None.

    ``head``: the raw integer the publisher sent, in any unit (:func:`epoch_seconds`); an age
    is never below 0 (a clock ahead of ours). None for no number, a negative one (also one sent
    unsigned: from :data:`~amqpjobs.epochs.NEGATIVE_FROM`), and 0 (a
    timestamp never set: :func:`~amqpjobs.epochs.epoch_datetime`), which ``status`` and the
    ``max_age`` gate read as 56 years old before.
    """
    if not isinstance(head, int | float) or isinstance(head, bool) or not 0 < head < NEGATIVE_FROM:
        return None
    return max(0.0, now - epoch_seconds(head))


def _iso(text: str) -> datetime:
    """ISO-8601 / RFC 3339 text as a datetime (``Z`` or ``z`` for UTC: RFC 3339 5.6 allows lower case).

    Raises:
        ValueError: ``text`` is no such time.

    """
    return datetime.fromisoformat(text[:-1] + "Z" if text[-1:] == "z" else text)  # "Z": read since Python 3.11


def utc_out_of_range(value: str) -> str | None:
    """``"before"`` or ``"after"`` when ``value`` is ISO-8601 text whose UTC falls outside years 1-9999, else None.

    :func:`parse_time` reads such a time as None, as it reads text that is no time at all; this
    tells them apart, so a refusal can say which (``--since 0001-01-01T00:00+01:00`` is a time,
    an hour before the year 1 in UTC). None too for text that is no ISO-8601 time, or a time in range.
    """
    try:
        parsed = _iso(value.strip())
    except ValueError:
        return None
    if parsed.tzinfo is None or _in_utc(parsed) is not None:
        return None
    return "before" if parsed.year == 1 else "after"


def _in_utc(value: datetime) -> datetime | None:
    """``value`` as an aware datetime in UTC (naive: taken as UTC), None when UTC is out of range.

    An offset can move a time at either end of ``datetime``'s years 1-9999 out of them:
    ``0001-01-01T00:00:00+01:00`` is in year 0 in UTC, and ``astimezone`` raises ``OverflowError``.
    """
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    try:
        return value.astimezone(UTC)
    except OverflowError:
        return None


#: The text after the whole second for each millisecond (``.000Z`` ... ``.999Z``): looked up, not formatted.
_MILLIS: Final = tuple(f".{ms:03d}Z" for ms in range(1000))


@functools.lru_cache(maxsize=8)
def _second_text(whole: int) -> str:
    return datetime.fromtimestamp(whole, UTC).isoformat()[:19]


def iso_utc(timestamp: float | None = None) -> str:
    """Seconds since the epoch (now when None) as ISO-8601 UTC with milliseconds (``2026-11-29T09:00:00.123Z``).

    The text ``datetime.fromtimestamp(timestamp, UTC).isoformat(timespec="milliseconds")``
    makes (``Z`` for ``+00:00``): microseconds rounded half to even, then cut to milliseconds.
    Built from a cached text of the whole second and a table of the millisecond suffixes, about
    0.65 µs instead of 1.6 (0.95 with the suffix formatted): a worker writes one per outcome event,
    a publisher one per job.

    Raises:
        ValueError: ``timestamp`` is NaN.
        OverflowError: it is infinite or out of the platform's range (``OSError`` on some platforms).
    """
    when = time.time() if timestamp is None else timestamp
    if not math.isfinite(when):  # raises, as datetime does
        return datetime.fromtimestamp(when, UTC).isoformat(timespec="milliseconds")
    fraction, whole = math.modf(when)
    micros = round(fraction * 1_000_000)  # datetime's rounding (half to even), then the carry it makes
    if micros >= 1_000_000:
        micros, whole = micros - 1_000_000, whole + 1
    elif micros < 0:
        micros, whole = micros + 1_000_000, whole - 1
    return _second_text(int(whole)) + _MILLIS[micros // 1000]
