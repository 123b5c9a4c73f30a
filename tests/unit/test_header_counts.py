"""One rule for every count and name header a publisher we don't control sets (:mod:`amqpjobs.jobs.header_values`).

The same number reads the same in every AMQP encoding a client can give it (integer types,
``f``/``d`` floats, ``D`` decimals, strings, byte arrays); a whole number above ``2**63 - 1``
reads as that largest count in every encoding; the rest is no count. A header of the wrong
AMQP type is named by its AMQP type, never by a Python repr.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest

from amqpjobs.jobs import envelope, evidence, quarantine
from amqpjobs.jobs.header_values import COUNT_MAX, broker_cant_dead_letter, count_problem, read_count, type_problem

BIG = 2**63 - 1
#: Three in every encoding a client can send.
THREE = [3, 3.0, Decimal("3"), Decimal("3.000"), "3", " 3 ", "003", b"3", bytearray(b"3")]
#: Whole numbers above 2**63 - 1, in every encoding.
ABOVE = [2**63, 2**64, 1e19, 1e300, Decimal("1E+300"), "1" + "0" * 24, "9" * 5000, b"9" * 25, bytearray(b"9" * 20)]
#: No count at all: the header's documented default applies.
NONE = [-5, -1.0, 2.5, Decimal("2.5"), float("nan"), float("inf"), Decimal("NaN"), Decimal("-Infinity"), "abc",
        "-3", "+3", "3.0", "²", "", True, False, {}, {"a": 1}, [], [3], datetime(2026, 1, 1, tzinfo=UTC)]  # fmt: skip


@pytest.mark.parametrize("raw", THREE)
def test_three_reads_as_three_in_every_encoding(raw: Any) -> None:
    assert envelope.parse_attempt(raw) == 3
    assert envelope.parse_runs({envelope.ATTEMPT: 9, envelope.RUNS: raw}) == 3
    assert evidence.delivery_counters({envelope.DELIVERY_COUNT: raw, envelope.ACQUIRED_COUNT: raw}) == {
        "delivery_count": 3, "acquired_count": 3}  # fmt: skip
    item = quarantine.describe({evidence.REASON: "exhausted", evidence.ATTEMPTS: raw, quarantine.REPLAY_COUNT: raw},
                               "id", "mail")  # fmt: skip
    assert (item.attempts, item.replay_count) == (3, 3)
    assert quarantine.describe({envelope.ATTEMPT: raw}, "id", "mail").attempts == 2  # no evidence: attempt less one


@pytest.mark.parametrize("raw", ABOVE, ids=lambda v: f"{type(v).__name__}-{str(v)[:12]}")
def test_a_number_above_the_range_reads_as_the_largest_count_in_every_encoding(raw: Any) -> None:
    assert envelope.parse_attempt(raw) == BIG  # above every max_attempts: exhausted, as 2**40 is
    assert evidence.delivery_counters({envelope.DELIVERY_COUNT: raw})["delivery_count"] == BIG
    item = quarantine.describe({evidence.REASON: "exhausted", evidence.ATTEMPTS: raw, quarantine.REPLAY_COUNT: raw},
                               "id", "mail")  # fmt: skip
    assert (item.attempts, item.replay_count) == (BIG, BIG)
    # the replayed copy's count stays an AMQP integer (pamqp refuses one above 2**63 - 1)
    replayed = quarantine.replay_headers({}, item, "r1", timestamp=None)
    assert replayed[quarantine.REPLAY_COUNT] == BIG


@pytest.mark.parametrize("raw", NONE, ids=repr)
def test_what_is_no_count_takes_the_documented_default(raw: Any) -> None:
    assert envelope.parse_attempt(raw) == 1
    assert envelope.parse_runs({envelope.ATTEMPT: 5, envelope.RUNS: raw}) == 0
    assert evidence.delivery_counters({envelope.DELIVERY_COUNT: raw})["delivery_count"] == 0
    item = quarantine.describe({evidence.REASON: "exhausted", evidence.ATTEMPTS: raw, quarantine.REPLAY_COUNT: raw},
                               "id", "mail")  # fmt: skip
    assert (item.attempts, item.replay_count) == (0, 0)
    assert quarantine.describe({envelope.ATTEMPT: raw}, "id", "mail").attempts == 0  # never -1


def test_the_problem_names_the_header_its_amqp_type_and_the_range() -> None:
    assert COUNT_MAX == BIG
    assert read_count(None) is None
    assert count_problem("h", None) is None
    assert count_problem("amqpjobs-attempt", 3.0) is None
    assert count_problem("amqpjobs-attempt", [1]) == "header amqpjobs-attempt is an array, expected a whole number"
    assert count_problem("amqpjobs-attempt", {"a": 1}) == "header amqpjobs-attempt is a table, expected a whole number"
    assert count_problem("amqpjobs-attempt", True) == "header amqpjobs-attempt is a boolean, expected a whole number"
    negative = count_problem("x-delivery-count", -1)
    assert negative == "header x-delivery-count is -1 (an integer), not a whole number >= 0"
    assert count_problem("amqpjobs-attempt", 1e300) == (
        "header amqpjobs-attempt is 1e+300 (a float), above 9223372036854775807, the largest count read: read as that"
    )
    long = count_problem("amqpjobs-attempt", "9" * 5000)
    assert long is not None
    assert "(5002 characters)" in long
    assert len(long) < 200
    assert count_problem("amqpjobs-attempt", bytearray(b"12x")) == (
        "header amqpjobs-attempt is '12x' (a byte array), not a whole number >= 0"
    )


KINDS = [(["mail"], "an array"), ({"n": "mail"}, "a table"), (7, "an integer"), (True, "a boolean"), (2.5, "a float"),
         (Decimal("1.5"), "a decimal"), (datetime(2026, 1, 1, tzinfo=UTC), "a timestamp")]  # fmt: skip


@pytest.mark.parametrize(("value", "kind"), KINDS)
def test_a_job_name_header_of_another_type_names_no_job_and_is_named_by_its_type(value: Any, kind: str) -> None:
    assert envelope.job_name_of(None, {envelope.JOB: value}) == ""  # never "['mail']"
    assert type_problem(envelope.JOB, value) == f"header amqpjobs-job is {kind}, expected a string"
    assert type_problem(envelope.JOB, bytearray(b"mail")) is None
    assert type_problem(envelope.JOB, None) == "header amqpjobs-job is void, expected a string"  # AMQP void (V)
    assert envelope.job_header_problem(None, {}) is None  # missing: no job name, nothing of a type to name
    assert envelope.job_header_problem("mail", {envelope.JOB: value}) is None  # not read: the type property wins


@pytest.mark.parametrize(
    ("deaths", "why"),
    [
        ([{"count": "five", "reason": "rejected", "queue": "work"}], "has a count of a string"),
        ([{"count": True, "reason": "rejected", "queue": "work"}], "has a count of a boolean"),
        ([{"count": Decimal("2"), "reason": "rejected", "queue": "work"}], "has a count of a decimal"),
        ([{"count": bytearray(b"1"), "reason": bytearray(b"rejected"), "queue": "work"}], "a count of a byte array"),
        (["garbage"], "header x-death holds a string, not a table"),
        ([{"count": 1}, 7], "header x-death holds an integer, not a table"),
        # what RabbitMQ 3.10.8 counts (measured): numbers, timestamps, void; and entries of another queue or reason
        ([{"count": -1, "reason": "rejected", "queue": "work"}], None),
        ([{"count": 1e300, "reason": "rejected", "queue": "work"}], None),
        ([{"count": datetime(2026, 1, 1, tzinfo=UTC), "reason": "rejected", "queue": "work"}], None),
        ([{"count": None, "reason": "rejected", "queue": "work"}], None),
        ([{"count": "five", "reason": "expired", "queue": "work"}], None),
        ([{"count": "five", "reason": "rejected", "queue": "other"}], None),
        ([{"reason": "rejected", "queue": "work"}], None),
        ("garbage", None),
        ([], None),
    ],
)
def test_an_x_death_the_broker_cant_count_is_seen_before_a_reject(deaths: Any, why: str | None) -> None:
    found = broker_cant_dead_letter({"x-death": deaths}, "work", "rejected")
    assert found == why if why is None else why in str(found)


def test_the_evidence_reads_our_provenance_headers_as_text_never_as_a_python_repr() -> None:
    from amqpjobs.jobs.failure import quarantine_headers

    received = {
        envelope.ORIGINAL_EXCHANGE: bytearray(b"jobs"),  # a client that sends text as a byte array
        envelope.ORIGINAL_ROUTING_KEY: ["work"],  # forged: an array
        envelope.FIRST_FAILURE_AT: {"at": 1},  # forged: a table
        envelope.ATTEMPT: 1e300,
    }
    h = quarantine_headers(received, "crashed", ("E", "m", ""), 0, queue="work", exchange="ex", routing_key="rk",
                           job="mail", job_id="j", host="h", pid=1, version="v", app_version="a",
                           now="2026-12-06T00:00:00.000Z", timestamp=None)  # fmt: skip
    assert h[evidence.ORIGINAL_EXCHANGE] == "jobs"
    assert h[evidence.ORIGINAL_ROUTING_KEY] == "rk"
    assert h[evidence.FIRST_FAILURE_AT] == "2026-12-06T00:00:00.000Z"
    assert h[envelope.RUNS] <= COUNT_MAX  # an AMQP integer still (runs + starts of a forged count)


@pytest.mark.parametrize(
    ("queue_type", "redelivered", "version", "want"),
    [
        ("classic", False, (4, 3, 6), (0, 0)),  # a classic queue counts nothing: a publisher's values
        ("classic", True, (4, 3, 6), (0, 0)),
        ("quorum", False, (4, 3, 6), (0, 0)),  # no queue counts a first delivery
        ("quorum", True, (4, 3, 6), (3, 5)),
        ("quorum", True, (4, 0, 5), (3, 0)),  # x-acquired-count is the broker's from 4.3 only
        ("quorum", True, (3, 10, 8), (3, 0)),
    ],
)
def test_broker_counters_are_read_only_where_the_broker_wrote_them(
    queue_type: str, redelivered: bool, version: tuple[int, ...], want: tuple[int, int]
) -> None:
    headers = {envelope.DELIVERY_COUNT: 3, envelope.ACQUIRED_COUNT: 5}
    got = evidence.broker_counters(headers, queue_type, redelivered, version)
    assert (got["delivery_count"], got["acquired_count"]) == want


def test_on_43_a_delivery_count_above_the_acquired_count_is_a_publishers_and_reads_as_the_bound() -> None:
    headers = {envelope.DELIVERY_COUNT: 999, envelope.ACQUIRED_COUNT: 2}  # 4.3 wrote no x-delivery-count for nacks
    got = evidence.broker_counters(headers, "quorum", True, (4, 3, 6))
    assert (got["delivery_count"], got["acquired_count"]) == (2, 2)
