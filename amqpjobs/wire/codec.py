"""Frame decoding that survives what publishers we don't control send.

pamqp decodes an AMQP ``timestamp`` (property or header value) into a ``datetime``. A
publisher that sends microseconds (or any value past year 9999) makes that conversion
raise, aiormq then fails the whole content-header frame and closes the connection, and
the worker reconnects only to receive the same message again: one bad message stops a
queue. :func:`install_lenient_timestamps` makes such a timestamp decode as ``None``
(the 8 bytes are still consumed), so the message reaches the worker and is handled.

The same goes for a short string (``type``, ``message_id``, ``content_type``, the routing
key, ...) that is not UTF-8: pamqp raises ``UnicodeDecodeError`` and the frame is lost with
the connection. :func:`install_lenient_timestamps` also makes those decode with U+FFFD for
the bytes that are not UTF-8, so the message is quarantined (say, as an unknown job) with
evidence instead. Header *names* that are not UTF-8 still fail in pamqp; no publisher
library we know of can send one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pamqp import decode

_original: Callable[[bytes], tuple[int, Any]] | None = None


def _lenient_timestamp(value: bytes) -> tuple[int, Any]:
    assert _original is not None
    try:
        return _original(value)
    except (ValueError, OverflowError, OSError):
        if len(value) < 8:
            raise
        return 8, None


_original_short_str: Callable[[bytes], tuple[int, str]] = decode.short_str


def _lenient_short_str(value: bytes) -> tuple[int, str]:
    try:
        return _original_short_str(value)
    except UnicodeDecodeError:
        length = value[0]
        return length + 1, value[1 : length + 1].decode("utf-8", "replace")


def install_lenient_timestamps() -> None:
    """Make pamqp forgiving where one bad message would fail a whole frame (idempotent).

    An out-of-range timestamp decodes as ``None``; a short string that is not UTF-8 decodes
    with replacement characters.
    """
    global _original
    if _original is not None:
        return
    _original = decode.timestamp
    decode.METHODS["timestamp"] = _lenient_timestamp
    decode.TABLE_MAPPING[b"T"] = _lenient_timestamp
    decode.METHODS["shortstr"] = _lenient_short_str
    decode.short_str = _lenient_short_str
