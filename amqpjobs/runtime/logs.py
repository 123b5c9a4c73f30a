"""Logging set-up for the worker: stdlib logging, plain text or one JSON object per line."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Final

from amqpjobs.printable import json_safe, logfmt_value, printable, printable_block
from amqpjobs.redaction import redact_text
from amqpjobs.text import encodable

#: Characters a log line keeps (the record's line, each line of a traceback; a JSON line's
#: message, escaped): a longer one is cut and ends :func:`cut`'s marker. 1,000 characters are
#: at most 4,000 bytes in UTF-8, so one line always fits in one write that a pipe takes whole
#: (:data:`ATOMIC_WRITE`); a job name or id from a publisher can be of any length.
MAX_LINE = 1000


def cut(line: str, most: int = MAX_LINE) -> str:
    """``line``, or its first characters and ``…[N more characters]``: at most ``most`` characters in all.

    A backslash at the end of what is kept goes too (it would escape the marker's ``…``), and counts as cut.
    """
    if len(line) <= most:
        return line
    kept = line[: most - 30].rstrip("\\")  # room for the marker (N has at most 19 digits)
    return f"{kept}…[{len(line) - len(kept)} more characters]"


#: Characters (escaped, quoted) of a job name or id a log line keeps, and of an outcome's error:
#: another publisher's name or id can be of any length, and what the line says after it (an
#: outcome line's attempt, outcome and reason; a warning's what-happens-now) must still fit in
#: :data:`MAX_LINE`.
MAX_FIELD: Final = 200
MAX_ERROR_FIELD: Final = 300


def field_value(value: str, most: int = MAX_FIELD) -> str:
    """``value`` as a logfmt value (:func:`~amqpjobs.printable.logfmt_value`) of at most ``most`` characters.

    How every log line names a job or a job id (a test checks each logging call in ``amqpjobs/``).
    """
    return fit(value, most, logfmt_value)[1]


def fit(value: str, most: int, render: Callable[[str], str]) -> tuple[str, str]:
    """``value`` cut (:func:`cut`) so that ``render`` of it, its escaped form, has at most ``most`` characters.

    Returns:
        (the value, cut or not; its rendering). Escapes make the rendering longer than the
        value, so the value is cut in proportion until it fits; 40 characters always stay,
        so a ``most`` too small for 40 escaped ones is exceeded rather than looped on.
    """
    text = render(value)
    kept = value
    while len(text) > most and len(kept) > 40:
        keep = max(40, min(len(kept) - 1, len(kept) * most // len(text)))
        kept = cut(value, keep)
        text = render(kept)
    return kept, text


class JsonFormatter(logging.Formatter):
    """Formats each record as one JSON object: time, level, logger, message (and exception).

    Args:
        child: The worker process's number under ``consume --processes N`` (a ``"child"``
            field on every line); None in a single process.
    """

    def __init__(self, child: int | None = None) -> None:
        super().__init__()
        self._child = child

    def format(self, record: logging.LogRecord) -> str:
        """Return the record as a JSON line."""
        message = encodable(redact_text(record.getMessage()))
        doc: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": _json_message(message),
        }
        if self._child is not None:
            doc["child"] = self._child
        if record.exc_info:
            return _with_exception(doc, message, encodable(redact_text(self.formatException(record.exc_info))))
        return _json_line(doc)


#: UTF-8 bytes a JSON line's ``exception`` keeps at least (the message is cut further to leave them).
EXCEPTION_ROOM = 1024


def _json_line(doc: dict[str, Any]) -> str:
    return json_safe(json.dumps(doc, ensure_ascii=False))


def _size(line: str) -> int:
    return len(line.encode("utf-8", "backslashreplace")) + 1  # and its line break


def _with_exception(doc: dict[str, Any], message: str, exception: str) -> str:
    """The JSON line of ``doc`` with ``exception``, in at most :data:`ATOMIC_WRITE` bytes (its line break too).

    ``consume --processes N`` children share stderr, where a longer write can interleave with
    another child's. A traceback too long for what the line has left loses its middle (the
    outer frames): its first line (at most 200 characters), then ``…[N characters of the
    traceback cut]``, then as many of its last whole lines as fit (the innermost frames and
    what was raised), or else the start of its last line (the exception's type). The message
    (``message``, as logged) gives way first when its characters are long, to leave
    :data:`EXCEPTION_ROOM`.
    """
    doc["exception"] = exception
    line = _json_line(doc)
    if _size(line) <= ATOMIC_WRITE:
        return line
    doc["exception"] = ""
    while _size(_json_line(doc)) > ATOMIC_WRITE - EXCEPTION_ROOM and len(doc["message"]) > 40:
        doc["message"] = cut(message, max(40, len(doc["message"]) * 4 // 5))  # long characters: it gives way
    first, _, rest = exception.partition("\n")
    head, lines = cut(first, 200), rest.split("\n")

    def fits(kept: str) -> str | None:
        doc["exception"] = f"{head}\n  …[{len(rest) - len(kept)} characters of the traceback cut]\n{kept}"
        line = _json_line(doc)
        return line if _size(line) <= ATOMIC_WRITE else None

    low, high = 0, len(lines)  # the fewest last lines that fit: bisected (each check is a JSON dump)
    while low < high:
        middle = (low + high) // 2
        if fits("\n".join(lines[middle:])) is not None:
            high = middle
        else:
            low = middle + 1
    if low < len(lines) and (whole_lines := fits("\n".join(lines[low:]))) is not None:
        return whole_lines
    for most in (1000, 400, 100, 40):  # not even the last line: its start, which names what was raised
        if (start := fits(cut(lines[-1], most))) is not None:
            return start
    return fits("") or _json_line(doc)


def _json_message(message: str) -> str:
    """``message`` cut so that its JSON string (escapes included) holds at most :data:`MAX_LINE` characters."""
    if len(message) * 6 <= MAX_LINE:  # an escape (\u0001) is at most 6 characters: fits whatever it holds
        return message
    return fit(message, MAX_LINE, _json_string)[0]


def _json_string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """``<local time>,<ms> LEVEL logger: message``, with the time text made once per second.

    A worker writes one line per job outcome; ``time.strftime`` for every line was a
    visible share of a busy worker's CPU (bench/RESULTS.md, "Where the time goes").

    One record is one line: control characters, line breaks and terminal escapes in any
    field (a job id, job name or exception message from a publisher) are escaped
    (:func:`amqpjobs.printable.printable`), so nothing can forge a line. A traceback
    follows on lines of its own, each indented by four spaces. Text UTF-8 can't encode (a
    lone surrogate) is written as :func:`amqpjobs.text.encodable` makes it (``?``), in both formats.

    Args:
        child: The worker process's number under ``consume --processes N``: each line says
            ``[child N]`` after the level; None in a single process.
    """

    def __init__(self, child: int | None = None) -> None:
        who = "" if child is None else f"[child {child}] "
        super().__init__(f"%(asctime)s %(levelname)s {who}%(name)s: %(message)s")
        self._who = who
        self._second = -1
        self._text = ""

    def format(self, record: logging.LogRecord) -> str:
        """The line, then its traceback and stack if any, escaped; as ``logging.Formatter.format`` with less work.

        A worker writes one line per job outcome: the generic steps (the format's ``%``
        over the record's fields) were a share of its cost.
        """
        record.message = record.getMessage()
        record.asctime = self.formatTime(record)
        line = cut(printable(redact_text(f"{record.asctime} {record.levelname} {self._who}{record.name}: "
                                         f"{record.message}")))  # fmt: skip
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line = f"{line}\n{redact_text(record.exc_text)}"
        if record.stack_info:
            line = f"{line}\n{redact_text(self.formatStack(record.stack_info))}"
        return line

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        """Local time as ``YYYY-MM-DD HH:MM:SS,mmm`` (the stdlib default format)."""
        second = int(record.created)
        if second != self._second:
            self._text = time.strftime("%Y-%m-%d %H:%M:%S", self.converter(second))
            self._second = second
        return f"{self._text},{int(record.msecs):03d}"

    def formatException(self, ei: Any) -> str:
        """The traceback, each of its lines indented, escaped and :func:`cut`."""
        return _cut_lines(printable_block(encodable(super().formatException(ei))))

    def formatStack(self, stack_info: str) -> str:
        """The stack, each of its lines indented, escaped and :func:`cut`."""
        return _cut_lines(printable_block(encodable(stack_info)))


def _cut_lines(block: str) -> str:
    return "\n".join(cut(line) for line in block.split("\n"))


class TurnHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A ``StreamHandler`` that writes the INFO and DEBUG lines of one event-loop turn together.

    A busy worker logs a line per job outcome, and a ``write`` system call per line was a
    third of a line's cost (bench/RESULTS.md, "Where the time goes"). Here a line below WARNING logged on
    the thread of a running event loop waits for the end of that loop's turn (a
    ``call_soon`` callback), and the turn's lines go out in writes of whole lines of at
    most :data:`ATOMIC_WRITE` bytes: each write stays in one piece on a pipe that other
    processes share (POSIX ``PIPE_BUF``; ``consume --processes N`` children share stderr).

    Nothing waits longer than that, and the order of lines is kept: a WARNING or higher
    line, a line from any other thread or loop, and :meth:`flush` (``logging.shutdown`` at
    exit, the CLI at the end of each command) first write whatever is waiting.

    Args:
        stream: Where lines go (default ``sys.stderr`` when the handler is made).
    """

    def __init__(self, stream: Any = None) -> None:
        super().__init__(stream)
        self._waiting: list[str] = []
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop whose turn end will write them
        self._last: logging.LogRecord | None = None  # the last line kept (named if writing them fails)

    def emit(self, record: logging.LogRecord) -> None:
        """Write the record's line now, or keep it for the end of this loop turn (see the class)."""
        try:
            line = self.format(record) + self.terminator
            loop = asyncio._get_running_loop() if record.levelno < logging.WARNING else None
            if loop is not None and (self._loop is None or self._loop is loop):
                self._waiting.append(line)
                self._last = record
                if self._loop is None:
                    self._loop = loop
                    loop.call_soon(self._turn_end)
                return
            self._waiting.append(line)
            self._write_waiting()
        except RecursionError:  # as logging.StreamHandler.emit
            raise
        except Exception:
            self.handleError(record)

    def flush(self) -> None:
        """Write the lines waiting for the end of the turn, then flush the stream."""
        self.acquire()
        try:
            if self._waiting:
                self._write_waiting()
            if self.stream and hasattr(self.stream, "flush"):
                self.stream.flush()
        finally:
            self.release()

    def _turn_end(self) -> None:
        try:
            self.flush()
        except RecursionError:
            raise
        except Exception:  # a closed or broken stream: reported as a failed emit is
            self.handleError(self._last or logging.makeLogRecord({"msg": "(lines kept for the end of a loop turn)"}))

    def _write_waiting(self) -> None:
        """Write the waiting records: whole lines, at most :data:`ATOMIC_WRITE` bytes a write.

        A record over that (a long traceback) is split between writes at its line breaks; a
        line over it (possible only with many characters the stream's encoding makes long) is
        a write of its own.
        """
        records, self._waiting, self._loop = self._waiting, [], None
        stream = self.stream
        encoding = getattr(stream, "encoding", None) or "utf-8"
        errors = getattr(stream, "errors", None) or "strict"
        chunk: list[str] = []
        size = 0
        for record in records:
            whole = _bytes(record, encoding, errors)
            for line in [record] if whole <= ATOMIC_WRITE else record.splitlines(keepends=True):
                n = whole if whole <= ATOMIC_WRITE else _bytes(line, encoding, errors)
                if chunk and size + n > ATOMIC_WRITE:
                    stream.write("".join(chunk))
                    stream.flush()  # one write each, also on a stream that is not line-buffered
                    chunk, size = [], 0
                chunk.append(line)
                size += n
        if chunk:
            stream.write("".join(chunk))
            stream.flush()


def _bytes(text: str, encoding: str, errors: str) -> int:
    r"""Bytes ``text`` takes on a stream with ``encoding`` and ``errors`` (``\u65e5`` is 6 with backslashreplace)."""
    if text.isascii():
        return len(text)
    try:
        return len(text.encode(encoding, errors))
    except (UnicodeError, LookupError):  # strict: the stream would fail too; an estimate will do
        return len(text.encode("utf-8", "replace"))


#: Bytes one write may carry and still reach a shared pipe in one piece (POSIX ``PIPE_BUF``, 4096 on Linux).
ATOMIC_WRITE = 4096


def flush_logs() -> None:
    """Write every line the root logger's handlers hold (a :class:`TurnHandler`'s waiting lines)."""
    for handler in logging.getLogger().handlers:
        handler.flush()


def configure_logging(level: int = logging.INFO, json_lines: bool = False, child: int | None = None) -> None:
    """Send amqpjobs logs to stderr at ``level``, as text or JSON lines (``child``: the lines name that child).

    For the CLI's own process only (it owns the process's logging): it also turns off what
    no line it writes uses, namely the caller's file and line, thread and process names
    (the "Optimization" section of Python's logging HOWTO). Warnings (``warnings.warn``) are
    logged too (``logging.captureWarnings``: logger ``py.warnings``), so an app's are written as
    every line is.
    """
    handler = TurnHandler()
    handler.setFormatter(JsonFormatter(child) if json_lines else TextFormatter(child))
    logging._srcfile = None  # documented in the HOWTO's "Optimization"
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    logging.getLogger("amqpjobs").setLevel(level)
    logging.captureWarnings(False)  # (again, whatever an earlier call left: its hook may have been replaced since)
    logging.captureWarnings(True)  # a handler's warnings.warn: a line of ours (escaped, passwords redacted), not raw
