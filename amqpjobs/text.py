"""Header and property values as text: the one bytes-to-text rule (no I/O, no imports of ours)."""

from __future__ import annotations

from typing import Any


def as_text(value: Any) -> str:
    """``value`` as text: bytes decoded as UTF-8 (bad bytes replaced), anything else through ``str``."""
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


def encodable(text: str) -> str:
    """``text`` as UTF-8 can encode it: each lone surrogate becomes ``?``, everything else stays.

    A lone surrogate is what ``os.fsdecode`` or ``errors="surrogateescape"`` makes of bytes
    that are not UTF-8, so a handler's exception message can hold one; encoding it raises
    ``UnicodeEncodeError``. This is the one rule for text a handler provides (error type,
    message, traceback) before it goes into evidence headers, outcome events, log lines,
    results records and span attributes, so each shows the same text.
    """
    if text.isascii():
        return text
    return text.encode("utf-8", "replace").decode("utf-8")
