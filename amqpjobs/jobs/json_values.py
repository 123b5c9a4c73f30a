"""A payload's JSON: encoding it, and which value or key JSON can't carry as given, named by its path."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterator, Mapping
from typing import Any, Final

import orjson

from amqpjobs.jobs.json_fast import MAX_JSON_DEPTH
from amqpjobs.text import a_type

_SCALARS = (str, int, bool, type(None))
#: Exact types: what json.dumps writes as no container, and as one.
_LEAVES = frozenset({str, int, float, bool, type(None)})
_CONTAINERS = frozenset({dict, list, tuple})
_SEQUENCES = frozenset({list, tuple})
#: The words for a payload nested deeper than a worker decodes (also a pydantic model's, :mod:`.registry`).
TOO_DEEP = (
    f"the payload is nested deeper than {MAX_JSON_DEPTH} levels (dicts and lists inside each other), more than a "
    "worker reads (it would quarantine the job as undecodable); fix: flatten it, or send the deep part as a JSON "
    "string"
)
_FIX = "fix: give a str, int, float, bool, None, list or dict"
_VALUE = "the payload holds a value JSON can't carry: "
_KEY = "the payload holds a key JSON can't carry: "
_NOT_STR = "the payload has a key that is not a str: "
#: What strict JSON writes for a key that is not a str (``json.dumps`` turns it into a string).
_KEY_TEXT: dict[object, str] = {None: "null", True: "true", False: "false"}
_SHOWN = 100  # characters of a value's repr in a message
#: ``json.dumps(payload, separators=(",", ":"), ensure_ascii=False, allow_nan=False)``, made once (not per call).
_ENCODER: Final = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def encode_payload(payload: Mapping[str, Any]) -> bytes:
    """``payload`` as compact, strict UTF-8 JSON that decodes to the same keys and values.

    The rule is the stdlib's ``json`` (``json.dumps(..., allow_nan=False)``'s text). A flat
    payload (:func:`_flat`: str keys, scalar values), the common one, orjson writes, in the
    same bytes (``tests/unit/test_payload_bytes.py``) and ~20 times faster. Else the stdlib
    writes it and orjson then checks it in ~0.3 µs: it refuses every dict key that is not a
    str and every lone surrogate, where ``json.dumps`` writes ``{1: 2}`` as ``{"1": 2}`` (the
    job would not get the key it was given) and leaves a surrogate to fail in UTF-8. Only when
    either refuses is the payload walked (:func:`json_problem`'s rule) to name the value or
    key by its path; what orjson alone refuses but JSON carries (an int past 64 bits, nesting
    past 254 levels) is kept.

    Raises:
        ValueError: a dict key that is not a str, NaN or Infinity, a lone surrogate, a dict or
            list inside itself, nesting deeper than :data:`MAX_JSON_DEPTH` (what a worker decodes),
            or a value JSON can't hold (a set, a Decimal, ...); the message
            names where (``payload['a'][1] has the key 7 (an int) ...``) and the fix.

    """
    if _ORJSON_AS_STDLIB and type(payload) is dict and _flat(payload):
        try:
            return orjson.dumps(payload)
        except orjson.JSONEncodeError:  # a lone surrogate, an int past 64 bits: the stdlib's path
            pass
    try:
        text = _ENCODER.encode(payload)
    except RecursionError:
        raise ValueError(TOO_DEEP) from None
    except ValueError as exc:
        if str(exc) == "Circular reference detected":  # json.dumps's other ValueError (check_circular)
            raise ValueError(
                "payload holds a circular reference (a dict or list inside itself), which JSON can't carry"
            ) from None
        raise ValueError(
            _named(payload, f"payload holds NaN or Infinity, which strict JSON can't carry ({exc})")
        ) from None
    except TypeError as exc:
        raise ValueError(_named(payload, f"payload holds a value JSON can't carry: {exc}")) from None
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH and _too_deep(payload):  # no cycle: json.dumps checked
        raise ValueError(TOO_DEEP)
    try:
        orjson.dumps(payload, default=_anything)
    except orjson.JSONEncodeError:
        if (problem := _first_problem(payload, "payload")) is not None:  # no cycle: json.dumps checked
            raise ValueError(problem) from None
    return text.encode("utf-8")


def _flat(payload: dict[Any, Any]) -> bool:
    """Whether orjson writes ``payload`` as the stdlib's ``json`` does: str keys, scalar values of exact types.

    A str, int, bool or None, or a float 0 or from 1e-4 on (orjson writes a smaller one in
    other digits, ``1e-5`` for ``1e-05``; NaN and Infinity it writes as ``null``). Not a
    subclass (an ``IntEnum``), nor what orjson writes and the stdlib refuses (a UUID, an Enum).
    An int past 64 bits or a lone surrogate orjson refuses (:func:`encode_payload` then asks the stdlib).
    """
    for key, value in payload.items():
        kind = type(value)
        if type(key) is not str:
            return False
        if kind not in _FLAT and (kind is not float or not (value == 0.0 or 1e-4 <= abs(value) <= _LARGEST)):
            return False
    return True


_FLAT: Final = frozenset({str, int, bool, type(None)})
#: Whether this orjson writes floats in the stdlib's digits (before 3.11.7 it wrote ``1e16`` for ``1e+16``):
#: else no payload is written by it.
PROBE: Final = ([1e16, 1.5e300, 1e-4, 0.1, -0.0], b"[1e+16,1.5e+300,0.0001,0.1,-0.0]")
_ORJSON_AS_STDLIB: Final = orjson.dumps(PROBE[0]) == PROBE[1]
_LARGEST: Final = sys.float_info.max


def _too_deep(payload: Mapping[str, Any]) -> bool:
    """Whether ``payload`` nests dicts and lists deeper than :data:`MAX_JSON_DEPTH` (itself level 1).

    Level by level, exact builtin types first (the Mapping ABC's check is ~10x slower, and most
    items are scalars): ~0.15 us a container, ~45 ns a scalar.
    """
    level: list[Any] = [payload]
    depth = 1
    while level:
        if depth > MAX_JSON_DEPTH:
            return True
        below: list[Any] = []
        add = below.append
        for value in level:
            kind = type(value)
            items = value if kind in _SEQUENCES else value.values() if kind is dict or _mapping(value) else value
            for item in items:
                exact = type(item)
                if exact in _CONTAINERS or (exact not in _LEAVES and isinstance(item, Mapping | list | tuple)):
                    add(item)
        level, depth = below, depth + 1
    return False


def _mapping(value: object) -> bool:
    return isinstance(value, Mapping)


def _anything(value: object) -> None:
    """Orjson's ``default``: a type it does not know is json.dumps's business (already written)."""
    return None


def _named(payload: Mapping[str, Any], fallback: str) -> str:
    """The first problem of ``payload`` by its path, or ``fallback`` when the walk can't say."""
    try:
        return _first_problem(payload, "payload") or fallback
    except RecursionError:  # a cycle json.dumps did not reach before its TypeError
        return fallback


def json_problem(payload: Mapping[str, Any]) -> str | None:
    """Say which value or key of ``payload`` strict JSON can't carry as given, or None when it all can.

    Refused: what :func:`encode_payload` (strict ``json.dumps``, then
    UTF-8) refuses (NaN, a Decimal, a lone surrogate, an int too long for Python to write),
    and any dict key that is not a str: ``json.dumps`` silently turns ``1``, ``None`` or
    ``1.5`` into the string ``"1"``, ``"null"`` or ``"1.5"``, so the job would not get the
    key it was given.

    Args:
        payload: A payload object (dict of JSON-ready values).

    Returns:
        The first problem, by its path, with the fix, e.g. ``"the payload holds a value JSON
        can't carry: payload['x'] = Decimal('1.5') (a Decimal; fix: ...)"``, or None.

    """
    try:
        found = _first_problem(payload, "payload")
    except RecursionError:  # deeper than Python's stack: encoding words it (too deep, or inside itself)
        found = None
    if found is not None:
        return found
    try:
        encode_payload(payload)
    except ValueError as exc:
        return TOO_DEEP if str(exc) == TOO_DEEP else f"{_VALUE}payload = {_shown(payload)} ({_FIX})"
    return None


def _first_problem(value: Any, path: str) -> str | None:
    if isinstance(value, float):
        if math.isfinite(value):
            return None
        return f"{_VALUE}{path} = {value!r} (NaN and Infinity are not JSON; fix: give a finite number)"
    if isinstance(value, str):
        surrogate = _lone_surrogate(value)
        return None if surrogate is None else f"{_VALUE}{path} = {_shown(value)} ({surrogate})"
    if isinstance(value, int) and not isinstance(value, bool):
        digits = _too_long(value)
        return None if digits is None else f"{_VALUE}{path} = {digits}"
    if isinstance(value, _SCALARS):
        return None
    if isinstance(value, Mapping):
        for key, item in value.items():
            found = _key_problem(key, path) or _first_problem(item, f"{path}[{_shown(key)}]")
            if found is not None:
                return found
        return None
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            found = _first_problem(item, f"{path}[{i}]")
            if found is not None:
                return found
        return None
    return f"{_VALUE}{path} = {_shown(value)} ({a_type(value)}; {_FIX})"


def key_not_str(value: Any, path: str) -> tuple[str, object] | None:
    """The first dict key in ``value`` (JSON-ready) that is not a str, with the path of its dict, or None.

    ``json.dumps`` writes ``{1: "a"}`` as ``{"1": "a"}``: what reads it back gets another key.
    Looked for at any depth ``json.dumps`` took (a stack of its own, no recursion: a key 100
    levels down changes as well), depth first in the order ``json.dumps`` writes.
    """
    stack: list[tuple[Iterator[tuple[Any, Any]], str, bool]] = []

    def look_into(item: Any, at: str) -> None:
        if isinstance(item, Mapping):
            stack.append((iter(item.items()), at, True))
        elif isinstance(item, (list, tuple)):
            stack.append((iter(enumerate(item)), at, False))

    look_into(value, path)
    while stack:
        entries, at, mapping = stack[-1]
        entry = next(entries, None)
        if entry is None:
            stack.pop()
            continue
        key, item = entry
        if mapping and not isinstance(key, str):
            return at, key
        look_into(item, f"{at}[{_shown(key)}]" if mapping else f"{at}[{key}]")
    return None


def _key_problem(key: object, path: str) -> str | None:
    if isinstance(key, str):
        surrogate = _lone_surrogate(key)
        return None if surrogate is None else f"{_KEY}{path} has the key {_shown(key)} ({surrogate})"
    what = "None" if key is None else f"{_shown(key)} ({a_type(key)})"
    gets = ""  # a key json.dumps refuses outright (a tuple, an int too long) gets no "would get"
    if key is None or isinstance(key, bool):
        gets = f", so the job would get {_KEY_TEXT[key]!r}"
    elif isinstance(key, int) and _too_long(key) is None:
        gets = f", so the job would get {str(key)!r}"
    elif isinstance(key, float):
        gets = (
            f", so the job would get {repr(key)!r}"
            if math.isfinite(key)
            else " (and strict JSON has no NaN or Infinity)"
        )
    return f"{_NOT_STR}{path} has the key {what}; JSON object keys are strings{gets}; fix: write the key as a str"


def _lone_surrogate(text: str) -> str | None:
    """Why UTF-8 can't encode ``text`` (a lone surrogate, where), or None when it can."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (
            f"a lone surrogate {text[exc.start]!r} at index {exc.start}, which UTF-8 can't encode; fix: remove it, "
            "or decode the bytes the text came from with errors='replace'"
        )
    return None


def _too_long(number: int) -> str | None:
    """Why Python can't write ``number`` as text (it has more digits than its limit), or None when it can."""
    limit = sys.get_int_max_str_digits()
    try:
        str(number)
    except ValueError:
        digits = _digits(number)
        return (
            f"an int of {digits} digits (longer than the {limit} digits Python writes as text; fix: give it as a str)"
        )
    return None


def _digits(number: int) -> int:
    """The number of decimal digits of ``number`` (without writing it as text)."""
    number = abs(number)
    digits = max(1, int(number.bit_length() * math.log10(2)))
    while 10**digits <= number:
        digits += 1
    while digits > 1 and 10 ** (digits - 1) > number:
        digits -= 1
    return digits


def _shown(value: object) -> str:
    """``repr(value)``, at most :data:`_SHOWN` characters (an int too long to write shown by its length)."""
    try:
        text = repr(value)
    except ValueError:
        return "an int too long to write" if isinstance(value, int) else a_type(value)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."
