r"""Text from the wire made safe for a terminal and a line-oriented log.

A job id, job name, tenant, header or exception message comes from publishers we don't
control. Written as it is into the plain-text worker log, a newline in it forges a second
log line (a fake ``outcome=succeeded``), and an escape sequence (``ESC [``, the C1 ``CSI``)
repaints the operator's terminal. :func:`printable` escapes every character that could do
either, Python-style, and leaves everything else (any script, emoji) as it is:

* C0 controls and DEL (``\n``, ``\r``, ``\t`` by name, the rest as ``\xNN``);
* C1 controls ``\x80``-``\x9f`` (``\x9b`` is a one-byte CSI, ``\x85`` a line break);
* Unicode line and paragraph separators (U+2028, U+2029) and the invisible direction
  marks and overrides (U+200E/F, U+202A-E, U+2066-9) that make text read other than it is,
  and the byte-order mark U+FEFF.

In a ``key=value`` line (logfmt), :func:`logfmt_value` also quotes a value holding
whitespace, ``=``, ``"`` or ``\``, so a job id ``x outcome=succeeded`` stays one value
instead of adding an ``outcome`` key.

JSON text (``--json``, JSON log lines) escapes C0 controls by itself (``json.dumps``);
:func:`json_safe` escapes the rest of the list above as ``\uXXXX`` (still the same JSON).

Text UTF-8 can't encode (a lone surrogate, which a JSON body's ``"\ud800"`` escape decodes
to) is written with ``?`` (:func:`amqpjobs.text.encodable`) by :func:`printable` and
:func:`json_text`, so writing it to a terminal or a UTF-8 file never raises.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import unicodedata
from collections.abc import Iterable, Mapping
from typing import Any, Final

from amqpjobs.text import encodable

_UNSAFE: Final = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ufeff]")
_JSON_UNSAFE: Final = re.compile("[\x7f-\x9f\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ufeff]")
#: What makes a logfmt value need quotes: whitespace, ``=``, ``"``, a backslash or an :data:`_UNSAFE` character.
_NOT_BARE: Final = re.compile('[\\s="\\\\' + _UNSAFE.pattern[1:])
_NAMED: Final = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    return _NAMED.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def printable(text: str) -> str:
    r"""``text`` with control characters, line breaks and terminal escapes written as escapes.

    >>> printable("id-1\n2026-11-30 INFO forged\x1b[31m")
    'id-1\\n2026-11-30 INFO forged\\x1b[31m'
    """
    text = encodable(text)
    return _UNSAFE.sub(_escape, text) if _UNSAFE.search(text) else text


def unsafe_at(text: str) -> tuple[int, str] | None:
    r"""Where ``text``'s first character :func:`printable` escapes is, and its escape (``(2, "\\x00")``), or None."""
    match = _UNSAFE.search(text)
    return None if match is None else (match.start(), _escape(match))


#: Unicode categories of characters that show nothing: controls, format characters (U+200B, U+2060, U+00AD,
#: U+061C, tags), private use, unassigned, line and paragraph separators. Two names differing by one look the same.
_INVISIBLE: Final = frozenset({"Cc", "Cf", "Co", "Cn", "Zl", "Zp"})
#: Characters of other categories that show nothing or a blank: Unicode's Default_Ignorable_Code_Point ones
#: (DerivedCoreProperties.txt: the combining grapheme joiner U+034F, Hangul fillers U+115F, U+1160, U+3164,
#: U+FFA0, Khmer vowels U+17B4-U+17B5, variation selectors), the Braille blank U+2800, and every space but
#: U+0020 (U+00A0, U+2000-U+200A, U+3000 ...): each makes a look-alike of a name without it.
_BLANK_LOOKING: Final = re.compile(
    "[\u034f\u115f\u1160\u17b4\u17b5\u180b-\u180f\u2800\u3164\ufe00-\ufe0f\uffa0"
    "\U000e0100-\U000e01ef\u00a0\u1680\u2000-\u200a\u202f\u205f\u3000]"
)


def invisible_at(text: str) -> tuple[int, str] | None:
    r"""Where ``text``'s first control or invisible character is, and its escape (``(2, "\u200b")``), or None.

    Wider than :func:`unsafe_at` (what :func:`printable` escapes): for a name people read and
    compare (an App's, a job's, a connection's), where a zero-width space, a Hangul filler or a
    no-break space makes a look-alike (:data:`_BLANK_LOOKING`). Config-time only (a scan per rule).
    """
    blank = _BLANK_LOOKING.search(text)
    found = [
        unsafe_at(text),
        None if blank is None else (blank.start(), ascii(blank.group())[1:-1]),
        next(((i, ascii(c)[1:-1]) for i, c in enumerate(text) if unicodedata.category(c) in _INVISIBLE), None),
    ]
    return min((f for f in found if f is not None), default=None)  # the earliest


def printable_lines(text: str) -> str:
    r"""``text`` made :func:`printable` line by line: its line feeds stay, every other control is escaped.

    For a block shown as lines (a payload, a traceback on a web page).

    >>> printable_lines("a\n\x1b[31mb\r")
    'a\n\\x1b[31mb\\r'
    """
    text = encodable(text)
    return "\n".join(printable(line) for line in text.split("\n")) if _UNSAFE.search(text) else text


def logfmt_value(value: object) -> str:
    r"""``value`` as one value of a logfmt ``key=value`` line, made :func:`printable`.

    Quoted, with ``\`` and ``"`` escaped by a backslash, when it is empty or holds whitespace
    (any, Unicode included), ``=``, ``"``, ``\`` or a character :func:`printable` escapes;
    otherwise as it is.

    >>> logfmt_value("order-42"), logfmt_value('x outcome="ok"')
    ('order-42', '"x outcome=\\"ok\\""')
    """
    text = encodable(str(value))
    if text and not _NOT_BARE.search(text):
        return text
    return '"' + printable(text.replace("\\", "\\\\").replace('"', '\\"')) + '"'


def printable_block(text: str, indent: str = "    ") -> str:
    r"""A multi-line text (a traceback) as lines that each start with ``indent``, each made printable.

    Lines are split wherever Python sees a line break (``\n``, ``\r``, U+2028, ...), so no
    line of it can pass for a line of its own in a log.
    """
    return "\n".join(indent + printable(line) for line in text.splitlines())


def json_safe(text: str) -> str:
    r"""JSON text with what a terminal could act on written as ``\uXXXX`` escapes.

    ``text`` is the output of ``json.dumps(..., ensure_ascii=False)``, which escapes C0
    controls but leaves DEL, C1 controls, line separators and direction marks raw inside
    strings. Only those are replaced, so the result parses to the same value.
    """
    return _JSON_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def json_text(value: Any, indent: int | None = None) -> str:
    r"""``value`` as JSON text for output (``--json``, an export file): strict JSON, UTF-8 can encode it.

    A lone surrogate is written as ``?`` (:func:`~amqpjobs.text.encodable`), what a terminal
    could act on as ``\uXXXX`` (:func:`json_safe`), and a float NaN or infinite (a header's:
    AMQP can carry one) as the string ``"NaN"``, ``"Infinity"`` or ``"-Infinity"``, so the
    text parses back with any strict JSON parser.
    """
    try:
        text = json.dumps(value, ensure_ascii=False, indent=indent, allow_nan=False)
    except ValueError:  # a non-finite float somewhere
        text = json.dumps(_finite(value), ensure_ascii=False, indent=indent, allow_nan=False)
    return json_safe(encodable(text))


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _bash_escape(match: re.Match[str]) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    # its UTF-8 bytes, not \uHHHH: bash converts \u only under a UTF-8 locale (LANG=C keeps it)
    return "".join(f"\\x{b:02x}" for b in char.encode("utf-8", "surrogatepass"))


def shell_quote(text: str) -> str:
    r"""``text`` as one shell word that pastes back to exactly ``text``, on one printable line.

    Printable text is quoted by :func:`shlex.quote` (POSIX single quotes). Text holding a
    character :func:`printable` escapes uses bash's ANSI-C quoting ``$'...'`` (bash manual
    "ANSI-C Quoting"): ``\n``, else the character's UTF-8 bytes as ``\xHH`` (bash turns
    ``\uHHHH`` into a character only under a UTF-8 locale; bytes paste the same under any),
    with ``\\`` and ``\'`` for the two quoted ones. A
    single-quoted ``'a\nb'`` would hand the shell a backslash and an ``n``.

    >>> shell_quote("it's"), shell_quote("a\nb")
    ('\'it\'"\'"\'s\'', "$'a\\nb'")
    """
    if not _UNSAFE.search(text):
        return shlex.quote(text)
    return "$'" + _UNSAFE.sub(_bash_escape, text.replace("\\", "\\\\").replace("'", "\\'")) + "'"


def listed(names: Iterable[object], empty: str = "none") -> str:
    """Names as people write a list in a message: sorted, comma-separated, each made :func:`printable`.

    The one form of every "known: ..." list (never a Python list's repr).

    >>> listed(["urgent", "batch"]), listed([])
    ('batch, urgent', 'none')
    """
    shown = sorted(printable(str(name)) for name in names)
    return ", ".join(shown) if shown else empty


def as_toml(value: Any, limit: int = 100) -> str:
    """``value`` as a TOML file spells it (``true``, ``"5"``, ``5.0``), at most ``limit`` characters.

    >>> as_toml(True), as_toml("reject-publish"), as_toml(1)
    ('true', '"reject-publish"', '1')
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    text = json.dumps(value, ensure_ascii=False) if isinstance(value, str) else str(value)
    return text if len(text) <= limit else text[:limit] + "..."


def toml_pairs(items: Mapping[str, Any]) -> str:
    """``items`` as TOML ``key = value`` pairs, comma-separated, in their order (never a Python dict's repr).

    >>> toml_pairs({"x-max-length": 1, "x-overflow": "drop-head"})
    'x-max-length = 1, x-overflow = "drop-head"'
    """
    return ", ".join(f"{key} = {as_toml(value)}" for key, value in items.items())
