"""Which value of a payload JSON can't carry: named by its path, for an error at import time."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from amqpjobs.jobs.envelope import encode_payload

_SCALARS = (str, int, bool, type(None))
_FIX = "fix: give a str, int, float, bool, None, list or dict"


def json_problem(payload: Mapping[str, Any]) -> str | None:
    """Say which value of ``payload`` strict JSON can't carry, or None when it all can.

    The rule is :func:`~amqpjobs.jobs.envelope.encode_payload` (strict ``json.dumps``);
    this only names the first value it refuses, by its path.

    Args:
        payload: A payload object (dict of JSON-ready values).

    Returns:
        e.g. ``"payload['x'] = Decimal('1.5') (a Decimal; fix: ...)"``, or None.

    """
    try:
        encode_payload(payload)
    except ValueError:
        return _first_problem(payload, "payload") or f"payload = {payload!r} ({_FIX})"
    return None


def _first_problem(value: Any, path: str) -> str | None:
    if isinstance(value, float):
        if math.isfinite(value):
            return None
        return f"{path} = {value!r} (NaN and Infinity are not JSON; fix: give a finite number)"
    if isinstance(value, _SCALARS):
        return None
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, (*_SCALARS, float)):
                return f"{path} has the key {key!r} (a {type(key).__name__}; fix: give str keys)"
            found = _first_problem(item, f"{path}[{key!r}]")
            if found is not None:
                return found
        return None
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            found = _first_problem(item, f"{path}[{i}]")
            if found is not None:
                return found
        return None
    return f"{path} = {value!r} (a {type(value).__name__}; {_FIX})"
