"""Header and property values as text: the one bytes-to-text rule (no I/O, no imports of ours)."""

from __future__ import annotations

from typing import Any


def as_text(value: Any) -> str:
    """``value`` as text: bytes decoded as UTF-8 (bad bytes replaced), anything else through ``str``."""
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    return str(value)
