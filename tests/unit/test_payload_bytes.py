"""encode_payload writes the bytes the stdlib's json writes, whichever library did the work.

A flat payload (a dict of str keys and scalar values, the common one) is written by orjson;
these tests hold it to the rule: the stdlib's ``json.dumps(payload, separators=(",", ":"),
ensure_ascii=False, allow_nan=False)`` text in UTF-8, and the same refusals.
"""

from __future__ import annotations

import enum
import json
import math
import random
import struct
import uuid
from typing import Any

import orjson
import pytest

from amqpjobs.jobs import json_values
from amqpjobs.jobs.json_values import encode_payload


def stdlib(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")


EDGES = [0.0, -0.0, 1e-4, -1e-4, 9.999999999999999e-05, 1e16, 1e15, 2.0**53, 5e-324, 1.7976931348623157e308]


def _float(rng: random.Random) -> float:
    while True:
        pick = rng.randrange(4)
        if pick == 0:
            value: float = struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]
        elif pick == 1:
            value = rng.random() * 10 ** rng.randint(-30, 30)
        elif pick == 2:
            value = round(rng.uniform(-1e6, 1e6), rng.randint(0, 7))
        else:
            value = rng.choice(EDGES)
        if math.isfinite(value):
            return value


def _text(rng: random.Random) -> str:
    alphabet = 'aZ09 _-"\\/\n\r\t\b\f\x00\x01\x1f\x7f\u2028\u2029é€😀\ufeff'
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))


def _scalar(rng: random.Random) -> Any:
    pick = rng.randrange(6)
    if pick == 0:
        return _float(rng)
    if pick == 1:
        return rng.choice([0, 1, -1, 2**63 - 1, -(2**63), 2**64 - 1, rng.randint(-(2**70), 2**70)])
    if pick == 2:
        return rng.choice([True, False, None])
    return _text(rng)


@pytest.mark.parametrize("seed", range(8))
def test_flat_payloads_are_the_stdlibs_bytes(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(2000):
        payload = {_text(rng): _scalar(rng) for _ in range(rng.randint(0, 6))}
        assert encode_payload(payload) == stdlib(payload), payload


class Colour(enum.Enum):
    RED = 1


class Level(enum.IntEnum):
    HIGH = 3


class Name(str):
    pass


@pytest.mark.parametrize(
    "payload",
    [
        {"when": uuid.UUID(int=7)},  # orjson writes these; the stdlib's json refuses them
        {"colour": Colour.RED},
        {"small": 1e-5, "also": 5e-324},  # written differently by orjson ("1e-5"), the same value
        {"nan": math.nan},
        {"inf": -math.inf},
        {7: "key"},
        {"big": 2**64},
        {"lone": "\ud800"},
    ],
)
def test_what_orjson_would_write_otherwise_is_left_to_the_stdlib(payload: dict[Any, Any]) -> None:
    try:
        expected: bytes | str = stdlib(payload)
    except (TypeError, ValueError, UnicodeEncodeError) as exc:
        expected = type(exc).__name__
    try:
        got: bytes | str = encode_payload(payload)
    except ValueError:
        got = "refused"
    if isinstance(expected, bytes) and "\ud800" not in str(payload) and 7 not in payload:
        assert got == expected
    else:
        assert got == "refused"


def test_subclasses_keep_the_stdlibs_text() -> None:
    payload = {"level": Level.HIGH, "name": Name("x"), "n": True}
    assert encode_payload(payload) == stdlib(payload) == b'{"level":3,"name":"x","n":true}'


def test_an_orjson_writing_other_digits_writes_no_payload(monkeypatch: pytest.MonkeyPatch) -> None:
    """orjson before 3.11.7 wrote 1e16 for the stdlib's 1e+16 (review 29): then the stdlib writes every payload."""
    assert json_values._ORJSON_AS_STDLIB  # the orjson installed (pyproject: >= 3.11.7) writes the stdlib's digits
    real = orjson.dumps

    def older(value: Any, default: Any = None, option: Any = None) -> bytes:
        if default is None:  # as a writer (the check after the stdlib passes a default)
            return real(value).replace(b"e+", b"e")
        return real(value, default=default)

    monkeypatch.setattr(orjson, "dumps", older)
    assert older([1e16, 1.5e300]) == b"[1e16,1.5e300]"
    monkeypatch.setattr(json_values, "_ORJSON_AS_STDLIB", older(json_values.PROBE[0]) == json_values.PROBE[1])
    assert not json_values._ORJSON_AS_STDLIB
    payload = {"f": 1e16, "g": 1.5e300, "s": "x"}
    assert encode_payload(payload) == stdlib(payload) == b'{"f":1e+16,"g":1.5e+300,"s":"x"}'
