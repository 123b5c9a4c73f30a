"""The CLI's log line format: the time text is cached per second and must still be right."""

from __future__ import annotations

import json
import logging
import re
import sys
import time

import pytest

from amqpjobs.printable import logfmt_value
from amqpjobs.runtime.logs import JsonFormatter, TextFormatter


def record(created: float, message: str = "job=noop outcome=succeeded") -> logging.LogRecord:
    rec = logging.LogRecord("amqpjobs.worker", logging.INFO, __file__, 1, message, None, None)
    rec.created = created
    rec.msecs = (created - int(created)) * 1000
    return rec


def expected_time(created: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(int(created))) + f",{int((created % 1) * 1000):03d}"


def test_text_lines_carry_the_right_time_across_seconds() -> None:
    fmt = TextFormatter()
    for created in (1764406800.123, 1764406800.999, 1764406801.004, 1764406800.5, 1764493200.0):
        line = fmt.format(record(created))
        assert line == f"{expected_time(created)} INFO amqpjobs.worker: job=noop outcome=succeeded"


def test_the_text_time_matches_the_stdlib_default() -> None:
    created = 1764406800.25
    ours = TextFormatter().format(record(created))
    stdlib = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s").format(record(created))
    assert ours == stdlib


def test_json_lines_are_one_object_each() -> None:
    doc = json.loads(JsonFormatter().format(record(1764406800.5)))
    assert doc["level"] == "INFO"
    assert doc["logger"] == "amqpjobs.worker"
    assert doc["message"] == "job=noop outcome=succeeded"
    assert doc["time"].startswith("2025-11-29T09:00:00.500")


def test_text_lines_escape_every_field_and_indent_tracebacks() -> None:
    forged = "id-1\n2026-11-30 09:00:00,000 INFO amqpjobs.worker: job=x outcome=succeeded\x1b[2J\x9b31m\u2028\r\t"
    rec = logging.LogRecord("amqpjobs.worker", logging.ERROR, __file__, 1, "job=%s failed", (forged,), None)
    try:
        raise ValueError("first line\nsecond line\x1b]0;title\x07")
    except ValueError:
        rec.exc_info = sys.exc_info()
    text = TextFormatter().format(rec)
    first, *rest = text.split("\n")
    assert first.endswith(
        "ERROR amqpjobs.worker: job=id-1\\n2026-11-30 09:00:00,000 INFO amqpjobs.worker: job=x "
        "outcome=succeeded\\x1b[2J\\x9b31m\\u2028\\r\\t failed"
    )
    assert rest[0] == "    Traceback (most recent call last):"
    assert rest[-2:] == ["    ValueError: first line", "    second line\\x1b]0;title\\x07"]
    assert all(line.startswith("    ") for line in rest)


def test_json_lines_escape_what_a_terminal_acts_on_and_keep_the_value() -> None:
    message = "id\n\x1b[2J\x9b31m\u2028\u202e\x7f ключ"
    line = JsonFormatter().format(record(1764406800.5, message))
    assert [c for c in ("\n", "\x1b", "\x9b", "\u2028", "\u202e", "\x7f") if c in line] == []
    assert "ключ" in line
    assert json.loads(line)["message"] == message


LOGFMT_PAIR = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|[^\s"]*)(?=\s|$)')


def logfmt_keys(line: str) -> list[str]:
    """The keys of a logfmt line, values skipped whole (quoted ones with their escapes)."""
    return [m.group(1) for m in LOGFMT_PAIR.finditer(line)]


@pytest.mark.parametrize(
    "value",
    ["x outcome=succeeded", "a=b", 'say "hi"', 'end\\" outcome=succeeded', "tab\there", "nbsp\u00a0x=1", "", "\\"],
)
def test_a_hostile_value_is_one_logfmt_value(value: str) -> None:
    line = f"job=mail id={logfmt_value(value)} outcome=failed"
    assert logfmt_keys(line) == ["job", "id", "outcome"], line
    assert line.count("outcome=") == 1 + value.count("outcome=")


def test_plain_values_stay_unquoted_and_quoted_ones_read_back() -> None:
    assert logfmt_value("order-42") == "order-42"
    assert logfmt_value("café/ü") == "café/ü"
    assert logfmt_value("a b") == '"a b"'
    assert logfmt_value('q"\\') == '"q\\"\\\\"'
    assert logfmt_value("") == '""'
    assert logfmt_value("a\nb=c") == '"a\\nb=c"'  # control characters escaped as printable() does


def test_text_log_line_of_a_hostile_job_id_has_one_outcome_key() -> None:
    rec = logging.LogRecord(
        "amqpjobs.worker", logging.INFO, __file__, 1, "job=%s id=%s outcome=%s", (
            logfmt_value("mail"), logfmt_value("x outcome=succeeded"), "quarantined"
        ), None,
    )  # fmt: skip
    line = TextFormatter().format(rec)
    assert logfmt_keys(line.split(": ", 1)[1]) == ["job", "id", "outcome"], line


def test_text_utf8_cant_encode_is_made_encodable_by_the_evidence_rule() -> None:
    """A lone surrogate in a message or a traceback: '?' in both formats, as in evidence and events."""
    rec = logging.LogRecord("amqpjobs.worker", logging.ERROR, __file__, 1, "job=%s failed", ("fs-\udcff",), None)
    try:
        raise ValueError("/data/\udcfe.csv")
    except ValueError:
        rec.exc_info = sys.exc_info()
    text = TextFormatter().format(rec)
    text.encode("utf-8")
    assert "job=fs-? failed" in text
    assert text.endswith("ValueError: /data/?.csv")
    doc = json.loads(JsonFormatter().format(rec).encode("utf-8"))
    assert doc["message"] == "job=fs-? failed"
    assert doc["exception"].endswith("ValueError: /data/?.csv")


def _raised(depth: int, text: str) -> logging.LogRecord:
    """A record carrying the traceback of a ValueError ending a chain of ``depth`` others (no repeat to fold)."""

    def down(n: int) -> None:
        if n == 0:
            raise KeyError("the start of it")
        try:
            down(n - 1)
        except LookupError as exc:
            raise (ValueError(text) if n == depth else LookupError(f"level {n}")) from exc

    try:
        down(depth)
    except ValueError:
        rec = logging.LogRecord("amqpjobs.worker", logging.ERROR, __file__, 1, "job failed", None, sys.exc_info())
    return rec


@pytest.mark.parametrize("message", ["job failed", "日" * 2000, "\x01" * 3000], ids=["short", "cjk", "escapes"])
def test_a_json_line_with_a_long_traceback_fits_one_pipe_write_and_keeps_both_ends(message: str) -> None:
    """``consume --processes N`` children share stderr: a line over PIPE_BUF (4096 bytes) can interleave."""
    rec = _raised(60, "the end of it")
    rec.msg = message
    line = JsonFormatter(child=3).format(rec)
    assert len((line + "\n").encode("utf-8")) <= 4096
    doc = json.loads(line)
    exc = doc["exception"]
    assert exc.startswith("Traceback (most recent call last):\n")
    assert exc.endswith("ValueError: the end of it")  # what was raised stays
    cut_here = re.search(r"\n  …\[(\d+) characters of the traceback cut\]\n", exc)
    assert cut_here is not None, exc[:300]
    whole = JsonFormatter().formatException(rec.exc_info)  # type: ignore[arg-type]
    kept = len(exc) - len(cut_here.group(0)) + 1  # the marker replaces one line break
    assert int(cut_here.group(1)) == len(whole) - kept
    tail = exc[cut_here.end() :]
    assert whole.endswith(tail)
    assert whole[len(whole) - len(tail) - 1] == "\n"  # whole lines kept
    room = 3000 if message == "job failed" else 900  # what the message left, or at least about EXCEPTION_ROOM
    assert len(json.dumps(exc, ensure_ascii=False).encode()) >= room


def test_a_json_line_with_a_short_traceback_is_whole() -> None:
    rec = _raised(3, "boom")
    doc = json.loads(JsonFormatter().format(rec))
    assert doc["exception"] == JsonFormatter().formatException(rec.exc_info)  # type: ignore[arg-type]


def test_a_json_line_keeps_what_was_raised_when_its_last_line_alone_is_too_long() -> None:
    rec = _raised(3, "y" * 6000)
    line = JsonFormatter().format(rec)
    assert len((line + "\n").encode("utf-8")) <= 4096
    exc = json.loads(line)["exception"]
    assert exc.startswith("Traceback (most recent call last):\n  …[")
    last = exc.rsplit("\n", 1)[1]
    assert last.startswith("ValueError: yyy")  # the start of the line: its type
    assert re.search(r"…\[\d+ more characters\]$", last)


def test_a_json_line_of_a_huge_exception_line_without_traceback_fits() -> None:
    try:
        raise ValueError("z" * 10_000)
    except ValueError:
        rec = logging.LogRecord("amqpjobs.worker", logging.ERROR, __file__, 1, "x", None, sys.exc_info())
    rec.exc_info = (ValueError, ValueError("z" * 10_000), None)  # no traceback: the exception line is the first
    line = JsonFormatter().format(rec)
    assert len((line + "\n").encode("utf-8")) <= 4096
    assert json.loads(line)["exception"].startswith("ValueError: zzz")


def test_the_message_given_way_counts_what_it_lost_of_the_message_as_logged() -> None:
    rec = _raised(60, "the end of it")
    rec.msg = "\U0001d11e" * 5000  # 4 bytes each: cut to 1,000 characters it still leaves the traceback too little
    message = json.loads(JsonFormatter().format(rec))["message"]
    assert len(message) < 900
    kept, marker = message.split("…")
    assert marker == f"[{5000 - len(kept)} more characters]"
