"""Logging set-up for the worker: stdlib logging, plain text or one JSON object per line."""

from __future__ import annotations

import json
import logging
import time
from datetime import UTC, datetime
from typing import Any

from amqpjobs.printable import json_safe, printable, printable_block
from amqpjobs.text import encodable


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
        doc: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": encodable(record.getMessage()),
        }
        if self._child is not None:
            doc["child"] = self._child
        if record.exc_info:
            doc["exception"] = encodable(self.formatException(record.exc_info))
        return json_safe(json.dumps(doc, ensure_ascii=False))


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
        self._second = -1
        self._text = ""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        """Local time as ``YYYY-MM-DD HH:MM:SS,mmm`` (the stdlib default format)."""
        second = int(record.created)
        if second != self._second:
            self._text = time.strftime("%Y-%m-%d %H:%M:%S", self.converter(second))
            self._second = second
        return f"{self._text},{int(record.msecs):03d}"

    def formatMessage(self, record: logging.LogRecord) -> str:
        """The record's line, every field escaped (:func:`~amqpjobs.printable.printable`)."""
        return printable(encodable(super().formatMessage(record)))

    def formatException(self, ei: Any) -> str:
        """The traceback, each of its lines indented and escaped."""
        return printable_block(encodable(super().formatException(ei)))

    def formatStack(self, stack_info: str) -> str:
        """The stack, each of its lines indented and escaped."""
        return printable_block(encodable(stack_info))


def configure_logging(level: int = logging.INFO, json_lines: bool = False, child: int | None = None) -> None:
    """Send amqpjobs logs to stderr at ``level``, as text or JSON lines (``child``: the lines name that child).

    For the CLI's own process only (it owns the process's logging): it also turns off what
    no line it writes uses, namely the caller's file and line, thread and process names
    (the "Optimization" section of Python's logging HOWTO).
    """
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter(child) if json_lines else TextFormatter(child))
    logging._srcfile = None  # documented in the HOWTO's "Optimization"
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    logging.getLogger("amqpjobs").setLevel(level)
