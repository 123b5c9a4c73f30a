"""Every reasonable encoding of a time in seconds or milliseconds reads as that time (one rule, header_values).

Before: ``amqpjobs-enqueued-at`` sent as an AMQP decimal (``D``) or as digits in a string or
byte array (a publisher writing ``str(Date.now())``) was unreadable, and the worker fell back
to the ``timestamp`` property: ``ctx.enqueued_at`` and the first-attempt latency were the
copy's ready time, not the job's first enqueue.
"""

from __future__ import annotations

from decimal import Decimal

import pytest

from amqpjobs.jobs import copy_headers, envelope
from amqpjobs.jobs.header_values import read_number
from amqpjobs.jobs.timestamps import head_age, parse_time, time_problem

pytestmark = pytest.mark.version_independent

SECONDS = "2025-11-30T09:00:00+00:00"
MILLIS = "2025-11-30T09:00:00.123000+00:00"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (Decimal("1764493200"), SECONDS), (Decimal("1764493200.5"), "2025-11-30T09:00:00.500000+00:00"),
        (Decimal("1764493200123"), MILLIS), (Decimal("1.7644932E+9"), SECONDS),  # a decimal with an exponent
        ("1764493200", SECONDS), (" 1764493200\n", SECONDS), ("1764493200123", MILLIS),
        (b"1764493200123", MILLIS), (bytearray(b"1764493200"), SECONDS), ("01764493200", SECONDS),
        ("1764493200.5", "2025-11-30T09:00:00.500000+00:00"),  # str(time.time())
        ("1764493200123.0", MILLIS),
        # not a time: None, the timestamp property is read instead
        (Decimal("-1"), None), (Decimal("NaN"), None), (Decimal("Infinity"), None), (Decimal("1E+100000"), None),
        ("-1764493200", None), ("+1764493200", None), ("1.7e9", None), ("1764493200.", None), (".5", None),
        ("9" * 5000, None), ("\u0661\u0667", None), ("", None), (b"", None), (True, None),
    ],
)  # fmt: skip
def test_a_time_in_any_number_encoding_is_read(value: object, expected: str | None) -> None:
    parsed = parse_time(value)
    assert (None if parsed is None else parsed.isoformat()) == expected


@pytest.mark.parametrize(
    ("value", "number"),
    [
        (7, 7), (7.5, 7.5), (Decimal("7.5"), 7.5), ("7", 7), (b" 7.25 ", 7.25), (0, 0),
        (-1, None), (True, None), (float("nan"), None), (float("inf"), None), ("7 7", None), ({"a": 1}, None),
        ([7], None), (None, None),
    ],
)  # fmt: skip
def test_read_number_is_a_non_negative_finite_number_in_any_encoding(value: object, number: float | None) -> None:
    assert read_number(value) == number


def test_the_enqueued_at_header_is_read_before_the_timestamp_property_in_every_encoding() -> None:
    for value in (Decimal("1764493200123"), "1764493200123", b"1764493200.123", 1764493200.123):
        when = envelope.enqueued_at_of({envelope.ENQUEUED_AT: value}, 2_000_000_000)
        assert when is not None
        assert when.isoformat() == MILLIS, value
        # a copy keeps the header as received (readable: not rewritten from the copy's timestamp)
        assert copy_headers.copy_headers({envelope.ENQUEUED_AT: value}, 2_000_000_000)[envelope.ENQUEUED_AT] == value


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2025-11-30T09:00:00z", SECONDS), ("2025-11-30t09:00:00.123z", MILLIS), (b"2025-11-30T09:00:00z", SECONDS),
        ("2025-11-30T09:00:00.123456789Z", "2025-11-30T09:00:00.123456+00:00"),  # Go's RFC3339Nano: cut to µs
    ],
)  # fmt: skip
def test_rfc_3339_text_in_lower_case_is_read(value: object, expected: str) -> None:
    # before: None for a lower-case "z" (RFC 3339 5.6 allows "t" and "z"), the timestamp property read instead
    parsed = parse_time(value)
    assert (None if parsed is None else parsed.isoformat()) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1764493200123456, "2025-11-30T09:00:00.123456+00:00"),  # microseconds (Go's UnixMicro, time.time_ns() // 1000)
        (1764493200123000000, MILLIS),  # nanoseconds (time.time_ns(), Go's UnixNano)
        ("1764493200123456", "2025-11-30T09:00:00.123456+00:00"),
        (253402300799000, "9999-12-31T23:59:59+00:00"),  # the last second datetime has, in milliseconds: still ms
        (253402300800000, "1978-01-11T21:31:40.800000+00:00"),  # then microseconds
        (10**30, None),  # past every reading
    ],
)  # fmt: skip
def test_micro_and_nanoseconds_since_the_epoch_are_read_past_the_last_millisecond(
    value: object, expected: str | None
) -> None:
    # before: None (as milliseconds, past the year 9999), the timestamp property read instead
    parsed = parse_time(value)
    assert (None if parsed is None else parsed.isoformat()) == expected


@pytest.mark.parametrize(
    ("value", "what"),
    [
        ("2025-11-30T09:00:00Z", None), (1764493200, None), (Decimal("1764493200"), None), (None, None),
        (True, "a boolean"), ({"t": 1}, "a table"), ([1], "an array"), ("yesterday", "'yesterday' (a string)"),
        (b"soon", "'soon' (a byte array)"), (-1, "-1 (an integer)"), (float("nan"), "nan (a float)"),
        ("x" * 100, f"{repr('x' * 100)[:40]}... (a string)"),
    ],
)  # fmt: skip
def test_a_time_header_that_is_no_time_is_named_with_what_it_was(value: object, what: str | None) -> None:
    said = time_problem("amqpjobs-enqueued-at", value)
    if what is None:
        assert said is None
    else:
        assert said == (
            f"header amqpjobs-enqueued-at is {what}, not a time (ISO-8601 text, or seconds or milliseconds since the "
            "epoch, >= 0): the timestamp property is read instead; send it as ISO-8601 UTC text "
            "(2026-11-29T09:00:00.000Z)"
        )


@pytest.mark.parametrize(
    ("value", "expected"),
    [  # RFC 3339 5.6/5.7 allows a leap second (60): read as the second after 59, as POSIX time counts it
        ("2016-12-31T23:59:60Z", "2017-01-01T00:00:00+00:00"),
        ("2016-12-31T23:59:60.500Z", "2017-01-01T00:00:00.500000+00:00"),
        ("2017-01-01T08:59:60+09:00", "2017-01-01T00:00:00+00:00"),  # the same leap second in Tokyo
        ("2016-12-31T23:59:61Z", None), ("2016-12-31T23:60:00Z", None), ("2016-12-31T23:59:6Z", None),
        ("9999-12-31T23:59:60Z", None),  # past datetime's last year once read
    ],
)  # fmt: skip
def test_a_leap_second_is_read_as_the_next_second(value: str, expected: str | None) -> None:
    parsed = parse_time(value)
    assert (None if parsed is None else parsed.isoformat()) == expected
    if expected is not None:
        assert time_problem(envelope.ENQUEUED_AT, value) is None  # no warning: a time


@pytest.mark.parametrize("value", [0, 0.0, "0", Decimal(0), b"0", "0.0"])
def test_a_timestamp_of_0_is_no_time_not_1970(value: object) -> None:
    """0 is what a publisher leaves in a timestamp it never set; read as 1970 it aged a job 56 years."""
    assert parse_time(value) is None
    assert envelope.enqueued_at_of({}, 0) is None  # the property, decoded: 0 seconds (never set)
    assert envelope.enqueued_at_of({envelope.ENQUEUED_AT: value}, 1764493200) == parse_time(1764493200)


@pytest.mark.parametrize(
    ("head", "age"),
    [(1764492600, 600.0), (1764492600000, 600.0), (1764492600000000, 600.0), (1764492600 * 10**9, 600.0),
     (1764493300, 0.0), (0, None), (-5, None), (True, None), ("1764492600", None), (None, None)],
)  # fmt: skip
def test_a_head_messages_age_by_the_one_rule(head: object, age: float | None) -> None:
    """status and the max_age gate: a head timestamp of 0 (never set) has no age, not 56 years."""
    assert head_age(head, now=1764493200.0) == age


@pytest.mark.parametrize(
    ("value", "expected"),
    [(2**63 - 1, "2262-04-11T23:47:16.854776+00:00"), (2**63, None), (2**64 - 1, None), (2**64 - 1_000_000_000, None)],
)  # fmt: skip
def test_a_negative_time_t_sent_unsigned_is_no_time(value: int, expected: str | None) -> None:
    """AMQP's timestamp is a POSIX time_t, signed: a negative one (-1 s: 2**64 - 1) is before 1970, not 2554."""
    parsed = parse_time(value)
    assert (None if parsed is None else parsed.isoformat()) == expected
    if expected is None:
        assert head_age(value, now=1764493200.0) is None  # before: 0.0 (a head "from the future")
