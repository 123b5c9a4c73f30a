"""Text as PostgreSQL can hold it: its ``text`` can't hold NUL (0x00), which AMQP text can carry.

A job id (an AMQP ``message_id``), an idempotency key, an error message may hold a NUL;
PostgreSQL refuses such a value (``DataError``). The results store and the idempotency
ledger store it through :func:`to_db` (and read it back through :func:`from_db`):
losslessly, one stored form per text, so a lookup by a NUL id finds it like any other.
"""

from __future__ import annotations

import re
from typing import Final

#: Starts a text stored escaped: U+FFFF, a noncharacter. A text that starts with it is escaped
#: too, so every text has one stored form.
_ESCAPED: Final = "\uffff"
_ESCAPES: Final = re.compile(r"\\(.)", re.DOTALL)


def to_db(text: str) -> str:
    r"""``text`` as PostgreSQL can hold it: as it is, unless it has a NUL (or starts with the mark).

    Then it is the mark, and ``text`` with ``\`` doubled and NUL as ``\0`` (one text each way:
    :func:`from_db` gives it back, and no other text is stored the same).
    """
    if "\x00" not in text and not text.startswith(_ESCAPED):
        return text
    return _ESCAPED + text.replace("\\", "\\\\").replace("\x00", "\\0")


def from_db(text: str) -> str:
    """The text :func:`to_db` stored as ``text``."""
    if not text.startswith(_ESCAPED):
        return text
    return _ESCAPES.sub(lambda m: "\x00" if m[1] == "0" else m[1], text[len(_ESCAPED) :])
