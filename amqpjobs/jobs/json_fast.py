r"""A job body's JSON: the strict rule (the stdlib), and a fast first try (orjson) leaving every hard case to it.

:func:`strict_loads` is the rule: the stdlib ``json`` module, refusing ``NaN``, ``Infinity``
and a number too large for a float (``1e400``, which the stdlib would read as ``inf``).
:func:`amqpjobs.jobs.envelope.decode_body` decodes with it; that decision (value or error)
is the rule. orjson is several times faster (``decode_body`` of
the benchmark's body: 3.7 µs before, 1.3 µs with this try first). Where the two differ
(each difference pinned by a table test in ``tests/unit/test_json_fast.py``):

* an integer beyond 64 bits: orjson silently makes it a ``float`` (the stdlib keeps the
  ``int``). A body holding a run of 19 or more digits is never tried here;
* what orjson refuses that the stdlib takes: a lone surrogate escape (``"\ud800"``), a
  number too large for a float (``1e400``: refused by :func:`strict_loads` too), a leading byte-order
  mark. A refusal means "ask the stdlib", never an error;
* nesting: the stdlib path applies ``max_depth`` to any body with more brackets than that;
  such a body is never tried here;
* a top level that is not an object: left to the stdlib path (its error names the type).

So :func:`fast_object` returns a value only where the stdlib would return the same dict
(duplicate keys too: the last value, in the first key's place, in both).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Final

import orjson

#: Deepest JSON nesting accepted in a payload (the payload object is level 1): a worker decodes
#: no deeper (quarantined ``undecodable``), and enqueue refuses more.
MAX_JSON_DEPTH: Final = 64
#: 19 digits in a row: an integer that may not fit in 64 bits (orjson would make it a float).
_LONG_DIGITS: Final = re.compile(rb"[0-9]{19}")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"number {text[:40]} is too large for a float (it would read as Infinity, not valid JSON)")
    return value


#: One decoder for every body (``json.loads`` with options builds a new one per call).
_DECODER: Final = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float)


def strict_loads(text: str) -> Any:
    """``text`` decoded as strict JSON: no ``NaN``/``Infinity``, no number that overflows to infinity.

    Raises:
        ValueError: not JSON, or one of those (the message names it: ``NaN is not valid JSON``,
            ``number 1e400 is too large for a float ...``).
        RecursionError: nested too deep for the stdlib's decoder.
    """
    return _DECODER.decode(text)


def fast_object(body: bytes, max_depth: int) -> dict[str, Any] | None:
    """``body`` decoded as a JSON object by orjson, or None when the stdlib path must decide.

    Args:
        body: The message body (not checked for content type or encoding here).
        max_depth: The deepest nesting the caller accepts; a body with more ``[`` and ``{``
            than that (in strings too) is left to the caller.

    Returns:
        The object, exactly as ``json.loads`` (strict, no NaN/Infinity) would give it; None
        for anything orjson refuses or might read differently, and for a top level that is not an object.
    """
    if len(body) > max_depth and body.count(b"[") + body.count(b"{") > max_depth:
        return None
    if _LONG_DIGITS.search(body) is not None:
        return None
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return value if type(value) is dict else None
