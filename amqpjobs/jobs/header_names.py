"""Which header names ``enqueue`` takes from its caller: the one rule, for the broker and the in-memory double alike.

A header table's keys are AMQP field names: pamqp cuts one over 128 UTF-8 bytes to 128 (with
a log warning) at any depth, so a longer name would arrive as another name, and two long
names with one 128-byte prefix as one. ``x-`` names are the broker's, ``amqpjobs-`` ours.
Within a value, table keys must be str and floats finite and exact in 32 bits (:func:`header_problem`).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any, Final

from amqpjobs.message import MAX_NESTING, OUR_PREFIX, broker_refuses_float
from amqpjobs.text import a_type, as_text, lone_surrogate

#: Longest field-table key (a header name) in UTF-8 bytes that arrives whole: AMQP 0-9-1's
#: field-name limit, which pamqp applies by cutting a longer name to 128 bytes.
FIELD_NAME_MAX_BYTES: Final = 128


def field_name_problem(label: str, name: str) -> str | None:
    """Why ``name`` can't be the field-table key ``label`` (over 128 UTF-8 bytes), or None."""
    size = len(name.encode("utf-8", "surrogatepass"))
    if size <= FIELD_NAME_MAX_BYTES:
        return None
    return (
        f"{label} must be at most {FIELD_NAME_MAX_BYTES} UTF-8 bytes (got {size} bytes, {len(name)} characters): "
        f"AMQP field names are cut to {FIELD_NAME_MAX_BYTES} bytes on the way"
    )


def _as_float32(value: float) -> float | None:
    """``value`` as a 32-bit float reads it back (pamqp writes a header's float as ``f``); None: too large for one."""
    try:
        return float(struct.unpack("!f", struct.pack("!f", value))[0])
    except OverflowError:
        return None


def _decimal_problem(value: Decimal) -> str | None:
    """Why an AMQP decimal (``D``: scale octet, signed 32-bit value) can't hold ``value`` (pamqp's rule), or None."""
    exponent = value.as_tuple().exponent
    if not isinstance(exponent, int):  # NaN, sNaN, Infinity
        return "not a number"
    if exponent > 0 and value.adjusted() >= 10:  # more digits than 32 bits hold: no int() of 1E+100000
        return "its value is over 32 bits"
    scale = max(0, -exponent)
    if scale > 255:
        return f"{scale} decimal places, over 255"
    mantissa = int(value.scaleb(scale))
    return None if -(2**31) <= mantissa < 2**31 else f"its value {mantissa} is over 32 bits"


#: The header values pamqp encodes (``encode.encode_table_value``), besides datetime.
_CARRIED: Final = (str, int, float, Decimal, bytes, bytearray, type(None), Mapping, list, tuple)


def _value_problem(value: Any, path: str = "value", depth: int = 0) -> str | None:
    """Why header value ``value`` (at ``path`` within the header) can't be sent as given (the first), or None.

    A table key that is not a str (pamqp fails on it, naming no header), a key over 128 UTF-8
    bytes (cut on the way), a float that is NaN or infinite (pamqp encodes it, and RabbitMQ
    (3.10 to 4.3) closes the publisher's whole connection with ``INTERNAL_ERROR``, failing the
    publishes beside it), or a float a 32-bit AMQP float can't hold exactly (pamqp's
    ``encode_table_value`` writes every Python float as ``f``: 0.1 would arrive as
    0.10000000149011612, 1e308 fails to pack), a str that is not UTF-8 text (a lone
    surrogate), or tables and arrays nested more than :data:`~amqpjobs.message.MAX_NESTING`
    deep (a worker reads what is deeper as None), a ``Decimal`` an AMQP decimal can't hold (NaN,
    infinite, a value over 32 bits or over 255 decimal places: pamqp refuses it at encoding with
    words naming no fix).
    """
    if isinstance(value, str):
        where = lone_surrogate(value)
        return None if where is None else f"{path} is not UTF-8 text ({where}); nothing was sent"
    if isinstance(value, Mapping | list | tuple) and depth >= MAX_NESTING:
        return (
            f"header value is nested more than {MAX_NESTING} deep (tables and arrays); nothing was sent. A worker "
            "reads what is deeper as None: flatten it, or put it in the payload"
        )
    if broker_refuses_float(value):
        return (
            f"{path} is {value!r}, a float RabbitMQ can't take (it closes the connection with INTERNAL_ERROR on "
            f"NaN and infinities); nothing was sent. Send it as a str (e.g. {str(value)!r}) or None"
        )
    if isinstance(value, float) and _as_float32(value) != value:
        return (
            f"{path} is {value!r}, which pamqp sends as a 32-bit AMQP float: it would arrive as "
            f"{_as_float32(value)!r}; nothing was sent. Send it as a str (e.g. {repr(value)!r}) or a decimal.Decimal"
        )
    if isinstance(value, Decimal) and (why := _decimal_problem(value)):
        return (
            f"{path} is {value!r}, which an AMQP decimal can't hold ({why}; it holds a signed 32-bit value and 0-255 "
            f"decimal places); nothing was sent. Send it as a str (e.g. {str(value)!r})"
        )
    if isinstance(value, datetime):
        if value.microsecond:  # pamqp writes whole seconds (AMQP 0-9-1 timestamp): the rest would vanish
            return (
                f"{path} is {value}, and an AMQP timestamp is whole seconds: its {value.microsecond} µs would be "
                "lost; nothing was sent. Send it without them (.replace(microsecond=0)) or as an ISO str"
            )
        if value.timestamp() < 0:
            return (
                f"{path} is {value}, before 1970: an AMQP timestamp is unsigned seconds since then; nothing was "
                "sent. Send it as an ISO str"
            )
        return None
    if not isinstance(value, _CARRIED):
        return (
            f"{path} is {a_type(value)}, which AMQP can't carry; nothing was sent. Give str, int (64-bit), "
            "float, Decimal, bool, bytes, datetime, None, or lists and dicts (str keys) of these"
        )
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                shown = as_text(key)
                return (
                    f"{path} has table key {key!r} ({type(key).__name__}): table keys must be str; nothing was "
                    f"sent. Use str keys (e.g. {shown[:40]!r})"
                )
            if problem := field_name_problem(f"table key {key[:40]!r}", key):
                return problem
            if problem := _value_problem(item, f"{path}[{key[:40]!r}]", depth + 1):
                return problem
    elif isinstance(value, list | tuple):
        return next((p for i, v in enumerate(value) if (p := _value_problem(v, f"{path}[{i}]", depth + 1))), None)
    return None


def header_problem(name: Any, value: Any) -> str | None:
    """Why a caller's header ``name`` (with ``value``) can't be sent as given, or None.

    Args:
        name: The header name (a str, not starting ``x-`` or ``amqpjobs-``, at most 128 UTF-8 bytes).
        value: Its value: a table's keys within it are field names too (str, at most 128 bytes each);
            no float within it may be NaN or infinite (RabbitMQ closes the connection on one).

    Returns:
        e.g. ``"header 'x-mine': names starting 'x-' or 'amqpjobs-' are reserved"`` or ``"header 'h':
        value[0] is nan, ..."`` (the path within the value, and the fix), or None. (A
        value AMQP can't carry at all, a set, is refused where it is encoded:
        :func:`amqpjobs.wire.limits.encoded_size`.)

    """
    if not isinstance(name, str):
        return f"header {name!r}: header names must be str (got {type(name).__name__})"
    if name.lower().startswith(("x-", OUR_PREFIX)):
        return f"header {name!r}: names starting 'x-' or 'amqpjobs-' are reserved"
    if problem := field_name_problem("header name", name) or _value_problem(value):
        return f"header {name[:40]!r}: {problem}"
    return None
