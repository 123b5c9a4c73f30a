"""The one rule for reading a count or a name from a header a publisher we don't control set.

Every numeric header the worker, ``quarantine`` and the evidence reader read (our
``amqpjobs-attempt``, ``amqpjobs-runs``, ``amqpjobs-starts``, ``amqpjobs-replay-count``,
``amqpjobs-attempts``; the broker's ``x-delivery-count`` and ``x-acquired-count``, which
a publisher can forge on a classic queue) is read by :func:`read_count`, whatever AMQP
field type carries it (README "Wire format" -> "Headers the worker reads"):

* a whole number 0 .. :data:`COUNT_MAX` (``2**63 - 1``, the largest AMQP integer, ``l``)
  is that number, in any encoding: an integer of any AMQP integer type, an integral
  ``f``/``d`` float, an integral ``D`` decimal, or a string or byte array of ASCII digits
  (blanks around them ignored, no sign; leading zeros allowed);
* a whole number above :data:`COUNT_MAX` in any of those encodings (``1e300``, 25 digits)
  is out of range: read as :data:`COUNT_MAX` (so a bigger value never reads as a smaller
  one: an attempt header of ``1e300`` is above every ``max_attempts``, as ``2**40`` is),
  and :func:`count_problem` says so, naming the header;
* anything else (a negative number, a fraction, NaN or infinity, other text, a boolean,
  a timestamp, a table, an array, void) is not a count: None, and each header's reader
  applies its documented default (attempt 1, 0 runs ...).

A time in seconds or milliseconds since the epoch (``amqpjobs-enqueued-at``, the other
``amqpjobs-*-at`` headers, the ``timestamp`` property) is a number read by :func:`read_number`,
in any encoding too: an integer, an ``f``/``d`` float or a ``D`` decimal >= 0 and finite, or a
string or byte array of ASCII digits with at most one ``.`` between digits (blanks around them
ignored, no sign, no exponent): ``Date.now()``, ``Date.now() / 1000``, ``str(time.time())``.
:mod:`amqpjobs.jobs.timestamps` then tells seconds from milliseconds.

A string header (``amqpjobs-job``) is read by :func:`read_text`: a string or byte array
(UTF-8, bad bytes as U+FFFD); any other type is no value, and :func:`type_problem` names
the type (``header amqpjobs-job is an array, expected a string``), never a Python repr.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Final

from amqpjobs.text import a_type, as_text, ascii_digits

#: The largest count read: the largest AMQP signed 64-bit integer (``l``), what every client can send.
COUNT_MAX: Final = 2**63 - 1
_MAX_DIGITS: Final = len(str(COUNT_MAX))  # 19
_BLANKS: Final = " \t\r\n\f\v"


def amqp_type(value: Any) -> str:
    """The AMQP field type of a decoded header value, with its article (``"an array"``; ``f``, ``d``: ``"a float"``)."""
    if value is None:
        return "void"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):  # an AMQP f or d: decoded alike
        return "a float"
    if isinstance(value, Decimal):
        return "a decimal"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bytes | bytearray):
        return "a byte array"
    if isinstance(value, datetime):
        return "a timestamp"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list | tuple):
        return "an array"
    return a_type(value)


def _whole(value: Any) -> int | None:
    """``value`` as a whole number >= 0 (may be above :data:`COUNT_MAX`: capped by the caller), or None."""
    if type(value) is int:  # the commonest (a bool's type is bool)
        return value if value >= 0 else None
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, float | Decimal):
        finite = value.is_finite() if isinstance(value, Decimal) else math.isfinite(value)
        if not finite or value < 0:  # (NaN first: a Decimal NaN can't be compared)
            return None
        if value > COUNT_MAX:  # compared before int(): no int of a 1e300 or a Decimal 1E+100000
            return COUNT_MAX + 1
        return int(value) if value == int(value) else None
    if isinstance(value, bytes | bytearray):
        value = bytes(value).decode("ascii", "replace")
    if isinstance(value, str):
        text = value.strip(_BLANKS)
        if not ascii_digits(text):
            return None
        digits = text.lstrip("0") or "0"
        return int(digits) if len(digits) <= _MAX_DIGITS else COUNT_MAX + 1  # no int() of 5000 digits
    return None


def read_count(value: Any) -> int | None:
    """A count header's value: 0 .. :data:`COUNT_MAX`, or None when it is none (module docstring).

    Args:
        value: The header's value as decoded from the wire (None: missing or AMQP void).

    Returns:
        The count; :data:`COUNT_MAX` for a whole number above it; None for a value that is not a
        whole number >= 0 (the caller's documented default applies). Never raises.

    """
    number = _whole(value)
    return None if number is None else min(number, COUNT_MAX)


#: Number text: ASCII digits, at most one ``.`` between digits (no sign, no exponent, no other digits).
_NUMBER_TEXT: Final = re.compile(r"[0-9]+(?:\.[0-9]+)?")


def read_number(value: Any) -> float | None:
    """A header's value as a non-negative finite number in any AMQP encoding (module docstring), or None.

    Args:
        value: The header's value as decoded from the wire.

    Returns:
        The number (an ``int`` as it is, a float or decimal as a ``float``; a decimal or number text too
        large for a float is ``inf``, which the caller reads as out of range); None for anything else
        (a negative number, NaN, infinity, a boolean, other text, a table, an array, a timestamp,
        void). Never raises.

    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, float):
        return value if math.isfinite(value) and value >= 0 else None
    if isinstance(value, Decimal):
        return float(value) if value.is_finite() and value >= 0 else None
    if isinstance(value, bytes | bytearray):
        value = bytes(value).decode("ascii", "replace")
    if isinstance(value, str) and _NUMBER_TEXT.fullmatch(text := value.strip(_BLANKS)):
        return float(Decimal(text))  # no int() of thousands of digits; too many for a float: inf
    return None


def _shown(value: Any) -> str:
    if isinstance(value, bytes | bytearray):
        value = as_text(value)
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 60 else f"{text[:40]}... ({len(text)} characters)"


def count_problem(name: str, value: Any) -> str | None:
    """What is wrong with count header ``name``'s ``value``, in words naming it, or None (missing, or a count in range).

    ``header amqpjobs-attempt is a table, expected a whole number``; ``header amqpjobs-attempt
    is 1e+300 (a float), above 9223372036854775807, the largest count read: read as that``;
    ``header amqpjobs-attempt is -5 (an integer), not a whole number >= 0``. Values are shown
    shortened (at most about 60 characters); escape them before printing (:func:`~amqpjobs.printable.printable`).
    """
    if value is None:
        return None
    kind = amqp_type(value)
    if not isinstance(value, int | float | Decimal | str | bytes | bytearray) or isinstance(value, bool):
        return f"header {name} is {kind}, expected a whole number"
    number = _whole(value)
    if number is None:
        return f"header {name} is {_shown(value)} ({kind}), not a whole number >= 0"
    if number > COUNT_MAX:
        return f"header {name} is {_shown(value)} ({kind}), above {COUNT_MAX}, the largest count read: read as that"
    return None


def no_text(value: Any) -> bool:
    """Whether header ``value`` is of a type no text is read from: a table, an array, a boolean (void is absent)."""
    return isinstance(value, bool | dict | list | tuple)


def header_text(value: Any) -> str:
    """A header value as text: bytes decoded, a number as written, a time as ISO-8601 UTC, void as "".

    A table, an array or a boolean (:func:`no_text`) is its AMQP type in parentheses
    (``"(an array)"``, as :func:`amqp_type` words it), never Python's repr (``['x']``).
    """
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    if no_text(value):
        return f"({amqp_type(value)})"
    return as_text(value)


def read_text(value: Any) -> str | None:
    """A string header's value: a string, or a byte array as UTF-8 (bad bytes as U+FFFD); None for any other type."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes | bytearray):
        return as_text(value)
    return None


def type_problem(name: str, value: Any, expected: str = "a string") -> str | None:
    """``header <name> is an array, expected a string`` when ``value`` (a header present: None is void) is not text."""
    if read_text(value) is not None:
        return None
    return f"header {name} is {amqp_type(value)}, expected {expected}"


def tenant_problem(name: str, value: Any) -> str | None:
    """Why tenant header ``name``'s ``value`` names no tenant though a publisher set it, in words, or None.

    None for what names a tenant or says "none" on purpose (text or a byte array, blank too; an
    integer; a decimal of scale 0; void): :func:`~amqpjobs.jobs.envelope.tenant_of`'s rule. Else
    ``header amqpjobs-tenant is a float, expected a string (or a whole number): ...`` with what
    happens to the job (it runs, without a tenant) and the fix; the worker says it once per type.
    """
    if value is None or isinstance(value, str | bytes | bytearray) or type(value) is int:
        return None
    if isinstance(value, Decimal) and value.is_finite() and value.as_tuple().exponent == 0:
        return None
    return (
        f"header {name} is {amqp_type(value)}, expected a string (or a whole number): a job carrying it runs with no "
        "tenant (ctx.tenant None, its shard picked by job id on a replay) and its copies leave the header out; send "
        "the tenant as a string"
    )


def broker_cant_dead_letter(headers: Mapping[str, Any], queue: str, reason: str) -> str | None:
    """Why RabbitMQ 3.10 can't dead-letter a message of these headers from ``queue`` for ``reason``, or None.

    Measured on 3.10.8: dead-lettering adds 1 to the ``count`` of the ``x-death`` entry for the
    same queue and reason, and a count it can't add to (a string, a byte array, a boolean, a
    decimal, a table, an array) or an ``x-death`` element that is not a table crashes the queue
    process (``badarith``), at every later delivery too; a count that is an integer, a float, a
    timestamp or void is counted. A publisher can forge ``x-death``; only the broker's own
    dead-lettering (``expiration``, ``maxlen``, a reject) reads it.
    """
    deaths = headers.get("x-death")
    if not isinstance(deaths, list | tuple):
        return None
    for entry in deaths:
        if not isinstance(entry, Mapping):
            return f"header x-death holds {amqp_type(entry)}, not a table"
        if read_text(entry.get("queue")) != queue or read_text(entry.get("reason")) != reason or "count" not in entry:
            continue
        count = entry["count"]
        if (
            count is not None
            and not isinstance(count, datetime)
            and (isinstance(count, bool) or not isinstance(count, int | float))
        ):
            return f"header x-death's entry for queue {queue!r}, reason {reason!r} has a count of {amqp_type(count)}"
    return None
