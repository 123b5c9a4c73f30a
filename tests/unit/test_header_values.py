"""Header values enqueue refuses before anything is sent, each named by its path in the header (a retest)."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest

from amqpjobs.jobs.header_names import header_problem

pytestmark = pytest.mark.version_independent


@pytest.mark.parametrize(
    "value",
    [
        "text", 7, 2**63 - 1, 0.5, Decimal("0.1"), True, b"\xff", bytearray(b"x"), None,
        datetime(2026, 12, 5, 3, 0, tzinfo=UTC), {"a": [1, {"b": None}]}, (1, 2),
    ],
)  # fmt: skip
def test_values_amqp_carries_exactly_pass(value: object) -> None:
    assert header_problem("h", value) is None


def test_a_datetime_with_microseconds_would_lose_them_and_is_refused() -> None:
    problem = header_problem("when", datetime(2026, 12, 5, 3, 0, 0, 500000, tzinfo=UTC))
    assert problem == (
        "header 'when': value is 2026-12-05 03:00:00.500000+00:00, and an AMQP timestamp is whole seconds: its "
        "500000 µs would be lost; nothing was sent. Send it without them (.replace(microsecond=0)) or as an ISO str"
    )


def test_a_datetime_before_1970_is_refused_with_why() -> None:
    problem = header_problem("born", {"at": [datetime(1969, 7, 20, tzinfo=UTC)]})
    assert problem == (
        "header 'born': value['at'][0] is 1969-07-20 00:00:00+00:00, before 1970: an AMQP timestamp is unsigned "
        "seconds since then; nothing was sent. Send it as an ISO str"
    )


@pytest.mark.parametrize(
    ("value", "path", "kind"),
    [
        ({1, 2}, "value", "a set"),
        ({"a": [{"b": {2}}]}, "value['a'][0]['b']", "a set"),
        ([object()], "value[0]", "an object"),
    ],
)
def test_a_value_amqp_cannot_carry_is_named_by_its_path(value: object, path: str, kind: str) -> None:
    assert header_problem("h", value) == (
        f"header 'h': {path} is {kind}, which AMQP can't carry; nothing was sent. Give str, int (64-bit), float, "
        "Decimal, bool, bytes, datetime, None, or lists and dicts (str keys) of these"
    )


@pytest.mark.parametrize(
    ("value", "path", "shown", "why"),
    [
        (Decimal("NaN"), "value", "Decimal('NaN')", "not a number"),
        (Decimal("-Infinity"), "value", "Decimal('-Infinity')", "not a number"),
        (Decimal("1764493200.123"), "value", "Decimal('1764493200.123')", "its value 1764493200123 is over 32 bits"),
        (Decimal("1E+20"), "value", "Decimal('1E+20')", "its value is over 32 bits"),
        (Decimal("1E-300"), "value", "Decimal('1E-300')", "300 decimal places, over 255"),
        ({"a": [Decimal("NaN")]}, "value['a'][0]", "Decimal('NaN')", "not a number"),
    ],
)
def test_a_decimal_amqp_cant_hold_is_named_with_why_and_the_fix(value: object, path: str, shown: str, why: str) -> None:
    # before: "header 'k' can't be put in an AMQP frame (a error: Cannot encode NaN as a decimal) ... Give header
    # values AMQP carries: str, int (64-bit), float, Decimal, ...": a Decimal, which it was; raised at encoding
    assert header_problem("k", value) == (
        f"header 'k': {path} is {shown}, which an AMQP decimal can't hold ({why}; it holds a signed 32-bit value "
        "and 0-255 decimal places); nothing was sent. Send it as a str (e.g. "
        f"{shown[9:-2]!r})"
    )


@pytest.mark.parametrize("value", [Decimal("-5"), Decimal("0.1"), Decimal("2147483647"), Decimal("-2147483648"),
                                   Decimal("1E+5"), Decimal("1E-255")])  # fmt: skip
def test_decimals_amqp_holds_pass(value: Decimal) -> None:
    assert header_problem("k", value) is None
