"""Text rules: bytes to text, text UTF-8 can encode, and text shortened for a log line (no I/O, no imports of ours)."""

from __future__ import annotations

import unicodedata
from typing import Any


def as_text(value: Any) -> str:
    """``value`` as text: bytes decoded as UTF-8 (bad bytes replaced), anything else through ``str``."""
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


def ascii_digits(text: str) -> bool:
    """Whether ``text`` is one or more of the digits 0-9 and nothing else.

    The one rule for a number written in text (a port, a duration, a weight, a count):
    ``str.isdigit()``, a regex's digit class and ``int()``/``float()`` also take other scripts' digits
    (Arabic-Indic ``'١'``, full-width ``'５'``), which RabbitMQ, libpq and every other reader
    refuse, so a value passing our check would fail later, half done.
    """
    return text.isascii() and text.isdigit()


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


def lone_surrogate(text: str) -> str | None:
    """Where ``text`` stops being UTF-8 text, as ``"a lone surrogate at 3"`` (an index), or None.

    The one rule for text we send as given (a job id, a tenant, a header string): AMQP
    carries UTF-8, and a lone surrogate has no UTF-8 form (encoding it raises
    ``UnicodeEncodeError``).
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"a lone surrogate at {exc.start}"
    return None


#: Closing bracket of each opening one, for :func:`shorten`.
_CLOSERS = {"(": ")", "[": "]", "{": "}"}


def shorten(text: str, limit: int = 200) -> str:
    """``text`` cut to about ``limit`` characters at a word, with an ellipsis, its open brackets closed.

    The one rule for shortening an error's text in a log line: a cut inside a word or a
    parenthesis left open reads as another text ("... before or while proc); released ...").
    Text of at most ``limit`` characters is returned as it is. Otherwise it is cut before
    the last word that does not fit whole (mid-word only when a word alone is longer), ``…``
    added, then a closing bracket for each ``(``, ``[`` or ``{`` left open, innermost first
    (so the result may be a few characters over ``limit``).

    Args:
        text: The text (one line, see :func:`one_line`).
        limit: Characters to keep, the ellipsis included (at least 2).
    """
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    if text[limit - 1].isspace() or " " in cut:  # at a word: the last one that fits whole
        cut = cut if text[limit - 1].isspace() else cut[: cut.rindex(" ")]
        short = f"{cut.rstrip()} …"
    else:  # one word longer than the limit
        short = f"{cut}…"
    opened: list[str] = []
    for char in short:
        if char in _CLOSERS:
            opened.append(_CLOSERS[char])
        elif opened and char == opened[-1]:
            opened.pop()
    return short + "".join(reversed(opened))


def one_line(exc: BaseException, limit: int = 200) -> str:
    """``"<type>: <message>"`` on one line (whitespace runs made one space), the message cut by :func:`shorten`."""
    return f"{type(exc).__name__}: {shorten(' '.join(str(exc).split()), limit)}"


def url_text_problem(url: str, blanks: bool = True, what: str = "a URL has none (%-encode it)") -> str | None:
    r"""What makes ``url`` no URL by its characters alone, or None; the one rule for every URL and DSN we take.

    RFC 3986 has no blank nor control character in a URL (they are %-encoded), and Python's
    ``urlsplit`` drops tabs and line feeds without a word, so ``http://host/\tx`` would reach
    another path than written. An invisible format character (a zero-width space, a direction
    mark) is never meant. The character is named by its code point, never shown: it may sit in
    a password. ``blanks=False``: blanks are taken (libpq's ``keyword=value`` pairs); ``what``:
    the tail of the words.
    """
    for ch in url:
        if ch.isspace() and blanks:
            kind = "a blank"
        elif unicodedata.category(ch) == "Cc":
            kind = "a control character"
        elif unicodedata.category(ch) == "Cf":
            kind = "an invisible format character"
        else:
            continue
        return f"it holds {kind} (U+{ord(ch):04X}): {what}"
    return None


def a_type(value: object) -> str:
    """``value``'s type with its article, as a message says it: ``a dict``, ``an int``, ``an object``."""
    name = type(value).__name__
    vowel = name[:1].lower() in "aeiou" and not name.lower().startswith(("uu", "uni", "use"))  # a UUID, a unicode
    return f"{'an' if vowel else 'a'} {name}"
