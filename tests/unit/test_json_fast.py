"""decode_body's orjson first try (amqpjobs.jobs.json_fast) decides every body exactly as the stdlib path does."""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest

from amqpjobs.jobs import body_decoding
from amqpjobs.jobs.envelope import MAX_JSON_DEPTH, DecodeError, decode_body
from amqpjobs.jobs.json_fast import fast_object


def _outcome(body: bytes) -> tuple[str, str]:
    """What decode_body makes of ``body``: the value's repr (types, -0.0, key order) or the error."""
    try:
        return "value", repr(decode_body(body, "application/json", None))
    except DecodeError as exc:
        return exc.reason, exc.detail


def _stdlib_outcome(body: bytes, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """The same without the orjson try: the stdlib path alone, as before it."""
    with monkeypatch.context() as m:
        m.setattr(body_decoding, "fast_object", lambda body, depth: None)
        return _outcome(body)


_TOO_LARGE = "is too large for a float (it would read as Infinity, not valid JSON)"

# Where orjson and the stdlib differ: each body, what orjson alone does, and what decode_body must give
# (the stdlib's answer). orjson's answer is asserted too, so a new orjson that changes is noticed here.
DIFFERENCES: list[tuple[bytes, Any, tuple[str, str]]] = [
    # beyond 64 bits orjson silently makes a float; the stdlib keeps the int (19+ digits: never tried fast)
    (b'{"a":18446744073709551616}', {"a": 1.8446744073709552e19}, ("value", "{'a': 18446744073709551616}")),
    (b'{"a":-9223372036854775809}', {"a": -9.223372036854776e18}, ("value", "{'a': -9223372036854775809}")),
    (
        b'{"a":123456789012345678901234567890}',
        {"a": 1.2345678901234568e29},
        ("value", "{'a': 123456789012345678901234567890}"),
    ),
    # too large for a float: orjson refuses, the stdlib would read inf: undecodable, as the Infinity literal
    (b'{"a":1e400}', orjson.JSONDecodeError, ("undecodable", f"body is not JSON: number 1e400 {_TOO_LARGE}")),
    (b'{"a":[1,-1e400]}', orjson.JSONDecodeError, ("undecodable", f"body is not JSON: number -1e400 {_TOO_LARGE}")),
    (b'{"a":1e99999}', orjson.JSONDecodeError, ("undecodable", f"body is not JSON: number 1e99999 {_TOO_LARGE}")),
    (b'{"a":1E+309}', orjson.JSONDecodeError, ("undecodable", f"body is not JSON: number 1E+309 {_TOO_LARGE}")),
    # the largest float: a value for both
    (b'{"a":1.7976931348623157e308}', {"a": 1.7976931348623157e308}, ("value", "{'a': 1.7976931348623157e+308}")),
    # a lone surrogate escape: orjson refuses, the stdlib keeps it
    (b'{"a":"\\ud800"}', orjson.JSONDecodeError, ("value", "{'a': '\\ud800'}")),
    # a byte-order mark: orjson refuses, decode_body skips it
    (b'\xef\xbb\xbf{"a":1}', orjson.JSONDecodeError, ("value", "{'a': 1}")),
    # NaN/Infinity: refused by both (the stdlib's message is ours)
    (b'{"a":NaN}', orjson.JSONDecodeError, ("undecodable", "body is not JSON: NaN is not valid JSON")),
    (b'{"a":-Infinity}', orjson.JSONDecodeError, ("undecodable", "body is not JSON: -Infinity is not valid JSON")),
    # not an object: orjson reads it, decode_body says what it is
    (b"[1]", [1], ("invalid-payload", "payload must be a JSON object, got list")),
    (b'"x"', "x", ("invalid-payload", "payload must be a JSON object, got str")),
    # invalid UTF-8, an encoded surrogate, empty: refused by both, the stdlib path words it
    (
        b'{"a":"\xff"}',
        orjson.JSONDecodeError,
        ("undecodable", "body is not UTF-8: 'utf-8' codec can't decode byte 0xff in position 6: invalid start byte"),
    ),
    (
        b'{"a":"\xed\xa0\x80"}',
        orjson.JSONDecodeError,
        (
            "undecodable",
            "body is not UTF-8: 'utf-8' codec can't decode byte 0xed in position 6: invalid continuation byte",
        ),
    ),
    (b" \n", orjson.JSONDecodeError, ("undecodable", "body is empty")),
    # the same in both: duplicate keys keep the last value in the first key's place
    (b'{"b":1,"a":2,"b":3}', {"b": 3, "a": 2}, ("value", "{'b': 3, 'a': 2}")),
    (b'{"a":-0.0,"b":-0,"c":1E2}', {"a": -0.0, "b": 0, "c": 100.0}, ("value", "{'a': -0.0, 'b': 0, 'c': 100.0}")),
]


@pytest.mark.parametrize(("body", "by_orjson", "expected"), DIFFERENCES)
def test_orjson_differences_end_as_the_stdlib_decides(
    body: bytes, by_orjson: Any, expected: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    if isinstance(by_orjson, type):
        with pytest.raises(by_orjson):
            orjson.loads(body)
    else:
        assert repr(orjson.loads(body)) == repr(by_orjson)
    assert _outcome(body) == expected
    assert _stdlib_outcome(body, monkeypatch) == expected


def test_nesting_over_the_limit_is_left_to_the_stdlib_rule() -> None:
    deep = ("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH).encode()
    assert fast_object(b'{"a":' + deep + b"}", MAX_JSON_DEPTH) is None  # 65 brackets: never tried fast
    assert _outcome(b'{"a":' + deep + b"}") == ("undecodable", "body: JSON nested deeper than 64 levels")
    at_limit = b'{"a":' + deep[1:-1] + b"}"  # 64 brackets: tried fast, and accepted as the stdlib does
    assert fast_object(at_limit, MAX_JSON_DEPTH) == {"a": orjson.loads(deep[1:-1])} == decode_body(at_limit, None, None)


def test_a_typical_body_is_decoded_fast() -> None:
    assert fast_object(b'{"t":1764616800.123456,"s":"\xc3\xa9"}', MAX_JSON_DEPTH) == {"t": 1764616800.123456, "s": "é"}


_SEEDS = [
    b'{"t":1764616800.123456}',
    b'{"a":[1,2,{"b":null,"c":true,"d":false}],"e":"x\\u00e9\\n\\ud83d\\ude00","f":-0.5e-3}',
    b'{"a":"\xc3\xa9\xf0\x9f\x98\x80","b":{},"c":[]}',
    b' {"k" : 12 , "k":13}\n',
    b'{"n":123456789012345678,"m":-1E+2,"z":0.0}',
]
_BYTES = b'{}[]",:0123456789.eE+-\\u tnrfalsebx\x00\x7f\xc3\xa9\xed\xa0\x80\xf4\x90\xef\xbb\xbf \t\r\n/'


def test_mutated_bodies_decode_as_the_stdlib_decides(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bodies near valid JSON, bytes inserted, deleted, replaced: value or error the same as the stdlib's."""
    rnd = random.Random(22)
    fast = 0
    for _ in range(20_000):
        body = bytearray(rnd.choice(_SEEDS))
        for _ in range(rnd.randint(1, 4)):
            op, pos = rnd.random(), rnd.randrange(len(body) + 1)
            if op < 0.4:
                body[pos:pos] = bytes([rnd.choice(_BYTES)])
            elif body:
                if op < 0.7:
                    del body[min(pos, len(body) - 1)]
                else:
                    body[min(pos, len(body) - 1)] = rnd.choice(_BYTES)
        data = bytes(body)
        fast += fast_object(data, MAX_JSON_DEPTH) is not None
        assert _outcome(data) == _stdlib_outcome(data, monkeypatch), data
    assert fast > 1_000  # about one in ten stays valid JSON: the comparison did cover orjson's answers


def test_numbers_decode_as_the_stdlib_decides(monkeypatch: pytest.MonkeyPatch) -> None:
    """Floats and integers of every size and exponent: the same value and type (int/float, -0.0)."""
    rnd = random.Random(22)
    for _ in range(20_000):
        k = rnd.random()
        if k < 0.3:
            text = repr(rnd.uniform(-1e6, 1e6))
        elif k < 0.5:
            text = repr(rnd.random() * 10.0 ** rnd.randint(-300, 300))
        elif k < 0.7:
            text = "".join(rnd.choice("0123456789") for _ in range(rnd.randint(1, 25))).lstrip("0") or "0"
        elif k < 0.85:
            digits = "".join(rnd.choice("0123456789") for _ in range(rnd.randint(1, 30)))
            text = f"-{rnd.randint(1, 9)}.{digits}e{rnd.randint(-340, 320)}"
        else:
            text = f"{rnd.randint(0, 99999)}{rnd.choice(['', '.', '.5'])}{rnd.choice(['e', 'E', ''])}" + (
                f"{rnd.choice(['', '+', '-'])}{rnd.randint(0, 400)}"
            )
        data = b'{"x":' + text.encode() + b"}"
        assert _outcome(data) == _stdlib_outcome(data, monkeypatch), data
