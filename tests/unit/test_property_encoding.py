"""A new message's properties encoded in one pass: the same bytes as pamqp's, or left to pamqp."""

from __future__ import annotations

import random
import string
from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from pamqp import encode

from amqpjobs.jobs.envelope import job_message
from amqpjobs.message import OutgoingMessage
from amqpjobs.wire.copies import ExactProperties
from amqpjobs.wire.limits import amqp_properties
from amqpjobs.wire.property_encoding import PropertyStencil, exact_properties

NOW = 1_764_650_000.123456


def pamqp_bytes(message: OutgoingMessage) -> bytes:
    return amqp_properties(message).marshal()


def test_a_job_message_is_encoded_here_as_pamqp_encodes_it() -> None:
    message = job_message("orders.confirm", {"order": 17}, job_id="invoice-2026-11-0042", now=NOW, tenant="acme")
    exact = exact_properties(message)
    assert isinstance(exact, ExactProperties)  # the fast path is taken for what enqueue sends
    assert exact.marshal() == pamqp_bytes(message)
    assert exact.message_id == "invoice-2026-11-0042"  # aiormq reads it to match a basic.return


def _text(rng: random.Random, longest: int) -> str:
    alphabet = string.ascii_letters + string.digits + "-_.:/ éü€😀\x00\n"
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, longest)))


def _value(rng: random.Random) -> Any:
    kind = rng.randrange(4)
    if kind == 0:
        return _text(rng, 300)
    if kind == 1:
        return rng.choice([True, False])
    bound = rng.choice([2**7, 2**8, 2**15, 2**16, 2**31, 2**32, 2**63])
    return rng.randint(-bound, bound - 1)


@pytest.mark.parametrize("seed", range(40))
def test_random_messages_are_the_same_bytes_as_pamqps(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(50):
        headers = {_text(rng, 40): _value(rng) for _ in range(rng.randint(0, 8))}
        message = OutgoingMessage(
            body=b"{}",
            headers=headers,
            content_type=rng.choice([None, "", "application/json", _text(rng, 60)]),
            content_encoding=rng.choice([None, "", "utf-8"]),
            message_id=_text(rng, 60) or "x",
            type=rng.choice([None, "", _text(rng, 80)]),
            timestamp=rng.choice([None, 0, NOW, rng.randint(0, 4 * 10**9) + rng.random() * 0.99, float(2**32)]),
            priority=rng.choice([None, 0, 9, 255]),
            correlation_id=rng.choice([None, "", _text(rng, 30)]),
            reply_to=rng.choice([None, "", _text(rng, 30)]),
            app_id=rng.choice([None, "", "amqpjobs", _text(rng, 30)]),
        )
        exact = exact_properties(message)
        assert exact is not None, message
        assert exact.marshal() == pamqp_bytes(message), message


@pytest.mark.parametrize(
    "change",
    [
        {"headers": {"b": b"\xff"}},  # bytes: a byte array (encodable)
        {"headers": {"f": 1.5}},
        {"headers": {"n": None}},
        {"headers": {"t": {"nested": 1}}},
        {"headers": {"a": [1, "x"]}},
        {"headers": {"d": datetime(2026, 1, 1, tzinfo=UTC)}},
        {"headers": {"k" * 129: "a key pamqp cuts to 128 bytes"}},
        {"headers": {"big": 2**63}},  # pamqp refuses it: its refusal, not ours
        {"headers": {"lone": "\ud800"}},
        {"message_id": None},
        {"message_id": ""},
        {"type": "t" * 256},
        {"priority": 256},
        {"priority": True},
        {"timestamp": 1_764_650_000.9999996},  # datetime rounds it up to the next second
        {"timestamp": -1.0},
        {"timestamp": float("nan")},
        {"timestamp": float("inf")},
        {"timestamp": Decimal("1764650000.5")},
        {"headers": None},  # pamqp sends no table (a job always has one)
        {"correlation_id": 0},  # falsy, but not None nor "": pamqp tries (and refuses) it
        {"app_id": b""},
    ],
)
def test_what_is_not_encoded_here_is_left_to_pamqp(change: Mapping[str, Any]) -> None:
    message = replace(job_message("j", {}, job_id="id-1", now=NOW), **change)
    assert exact_properties(message) is None


def test_what_is_left_to_pamqp_near_the_edges_still_matches_where_it_is_taken() -> None:
    """A timestamp a hair under the rounding edge, the 128-byte key, the 255-byte short string: taken, same bytes."""
    changes: list[dict[str, Any]] = [
        {"timestamp": 1_764_650_000.998},
        {"headers": {"k" * 128: 1}},
        {"type": "t" * 255},
        {"headers": {}},
    ]
    for change in changes:
        message = replace(job_message("j", {}, job_id="id-1", now=NOW), **change)
        exact = exact_properties(message)
        assert exact is not None, change
        assert exact.marshal() == pamqp_bytes(message), change


def test_the_deprecated_integer_rule_of_pamqp_is_followed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(encode, "DEPRECATED_RABBITMQ_SUPPORT", True)
    message = replace(job_message("j", {}, job_id="id-1", now=NOW), headers={"u": 40_000, "i": 3_000_000_000})
    exact = exact_properties(message)
    assert exact is not None
    assert exact.marshal() == pamqp_bytes(message)


def _job(job_id: str, now: float, job: str = "orders.confirm") -> OutgoingMessage:
    return job_message(job, {"order": 17}, job_id=job_id, now=now)


ENQUEUED = "amqpjobs-enqueued-at"


def _stencil(job: str = "orders.confirm") -> PropertyStencil:
    stencil = PropertyStencil.of(_job("a" * 36, NOW, job), ENQUEUED, _job("other-id", NOW + 86_400.5, job))
    assert stencil is not None
    return stencil


@pytest.mark.parametrize("seed", range(5))
def test_a_stencil_fills_in_the_bytes_exact_properties_and_pamqp_write(seed: int) -> None:
    rng = random.Random(seed)
    stencil = _stencil()
    for _ in range(300):
        job_id = _text(rng, 80).strip("\x00\n ") or "x"
        now = rng.uniform(0, 4_000_000_000)
        message = _job(job_id, now)
        filled = stencil.fill(job_id, now, message.headers[ENQUEUED])
        if now - int(now) >= 0.999:  # pamqp's datetime may round it up a second: left to pamqp
            assert filled is None
            continue
        assert filled == pamqp_bytes(message)
        exact = exact_properties(message)
        assert exact is not None
        assert filled == exact.encoded


def test_a_stencil_is_per_kind_of_message() -> None:
    one, two = _stencil("orders.confirm"), _stencil("orders.cancel")
    message = _job("id-1", NOW, "orders.cancel")
    assert two.fill("id-1", NOW, message.headers[ENQUEUED]) == pamqp_bytes(message)
    assert one.fill("id-1", NOW, message.headers[ENQUEUED]) != pamqp_bytes(message)


@pytest.mark.parametrize(
    ("job_id", "now", "text"),
    [
        ("x" * 256, NOW, "2025-12-02T04:33:20.123Z"),  # over a shortstr
        ("\ud800", NOW, "2025-12-02T04:33:20.123Z"),  # no UTF-8
        (17, NOW, "2025-12-02T04:33:20.123Z"),  # not a str
        ("id", 1_764_650_000.9995, "2025-12-02T04:33:20.999Z"),  # a fraction pamqp may round up
        ("id", float("nan"), "2025-12-02T04:33:20.123Z"),
        ("id", -1.0, "2025-12-02T04:33:20.123Z"),
        ("id", 253_402_300_800.0, "2025-12-02T04:33:20.123Z"),  # past 9999
        ("id", NOW, "2025-12-02T04:33:20.123"),  # another width: the table's size would change
        ("id", NOW, "2025-12-02T04:33:20.12\ud800"),
    ],
)
def test_a_stencil_leaves_what_exact_properties_would_not_take_as_is(job_id: Any, now: float, text: str) -> None:
    assert _stencil().fill(job_id, now, text) is None


def test_no_stencil_when_the_sample_does_not_tell_where_the_values_go() -> None:
    sample, other = _job("a" * 36, NOW), _job("b", NOW + 1)
    same_text = replace(sample, message_id=sample.headers[ENQUEUED])  # the id is found twice
    assert PropertyStencil.of(same_text, ENQUEUED, other) is None
    assert PropertyStencil.of(sample, "amqpjobs-attempt", other) is None  # not a text header
    assert PropertyStencil.of(sample, "missing", other) is None
    assert PropertyStencil.of(replace(sample, timestamp=None), ENQUEUED, other) is None
    assert PropertyStencil.of(sample, ENQUEUED, replace(other, type="another")) is None  # other is not alike
    assert PropertyStencil.of(sample, ENQUEUED, replace(other, headers={**other.headers, "n": 1})) is None
    assert PropertyStencil.of(sample, ENQUEUED, other) is not None
