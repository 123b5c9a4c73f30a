"""A topology file's bytes to TOML data, or the one problem that stops it being read (no I/O).

tomllib's own words for a byte order mark ("Invalid statement" at line 1, column 1) and for bytes
that are not UTF-8 (a byte offset) name no fix, and values nested some 500 deep end it in a
RecursionError: each gets a problem of its own here.
"""

from __future__ import annotations

import codecs
import tomllib
from typing import Any, Final

from amqpjobs.errors import Problem

#: How deep a topology file's arrays and inline tables may nest (the deepest it needs is 3: a table of
#: entries holding a list). Deeper is refused before validation, which (as tomllib) recurses per level.
MAX_NESTING: Final = 32


def _deeper_than(raw: Any, limit: int) -> bool:
    """Whether the lists and tables of ``raw`` nest more than ``limit`` levels (walked without recursion)."""
    stack: list[tuple[Any, int]] = [(raw, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict | list):
            if depth > limit:
                return True
            stack.extend((v, depth + 1) for v in (value.values() if isinstance(value, dict) else value))
    return False


def read_toml(file: str, data: bytes) -> dict[str, Any] | Problem:
    """The TOML data of ``data`` (the bytes of ``file``), or the problem that keeps it from being read.

    Returns:
        The parsed tables; or a :class:`~amqpjobs.errors.Problem` (key path ``-``, the whole file):
        a BOM, bytes that are not UTF-8 (line and column), a TOML syntax error, or arrays and
        inline tables nested deeper than :data:`MAX_NESTING`.
    """
    if encoding := _encoding_problem(file, data):
        return encoding
    try:
        raw = tomllib.loads(data.decode("utf-8"))
    except tomllib.TOMLDecodeError as exc:
        return Problem(file, "-", f"not valid TOML: {exc}", "fix the file's syntax")
    except RecursionError:  # tomllib recurses once per level: ~500 levels end it
        raw = None
    if raw is None or _deeper_than(raw, MAX_NESTING):
        return Problem(
            file,
            "-",
            f"its arrays or inline tables nest deeper than {MAX_NESTING} levels",
            "a topology file nests a few levels at most: remove the extra [ ] or { }",
        )
    return raw


def _encoding_problem(file: str, data: bytes) -> Problem | None:
    """What keeps ``data`` from being TOML text (a byte order mark, bytes that are not UTF-8), or None.

    tomllib's own words for these are a byte offset, or "Invalid statement" at line 1, column 1.
    """
    if data.startswith(codecs.BOM_UTF8):
        return Problem(file, "-", "the file starts with a UTF-8 byte order mark (BOM), which TOML does not allow",
                       "save it as UTF-8 without a BOM")  # fmt: skip
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line_start = data.rfind(b"\n", 0, exc.start) + 1
        line = data.count(b"\n", 0, exc.start) + 1
        column = len(data[line_start : exc.start].decode("utf-8", "replace")) + 1
        return Problem(file, "-", f"not UTF-8: byte 0x{data[exc.start]:02x} at line {line}, column {column} can't be "
                       "decoded", "save the file as UTF-8")  # fmt: skip
    return None
