"""Frame decoding that survives what publishers we don't control send.

pamqp decodes an AMQP ``timestamp`` (property or header value) into a ``datetime``. A
publisher that sends microseconds (or any value past year 9999) makes that conversion
raise, aiormq then fails the whole content-header frame and closes the connection, and
the worker reconnects only to receive the same message again: one bad message stops a
queue. :func:`install_lenient_timestamps` makes such a timestamp decode as ``None``
(the 8 bytes are still consumed), so the message reaches the worker and is handled.
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


def install_lenient_timestamps() -> None:
    """Make pamqp decode an out-of-range timestamp as ``None`` instead of failing the frame (idempotent)."""
    global _original
    if _original is not None:
        return
    _original = decode.timestamp
    decode.METHODS["timestamp"] = _lenient_timestamp
    decode.TABLE_MAPPING[b"T"] = _lenient_timestamp
