"""Logging set-up for the worker: stdlib logging, plain text or one JSON object per line."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime


class JsonFormatter(logging.Formatter):
    """Formats each record as one JSON object: time, level, logger, message (and exception)."""

    def format(self, record: logging.LogRecord) -> str:
        """Return the record as a JSON line."""
        doc = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False)


def configure_logging(level: int = logging.INFO, json_lines: bool = False) -> None:
    """Send amqpjobs logs to stderr at ``level``, as text or JSON lines."""
    handler = logging.StreamHandler()
    handler.setFormatter(
        JsonFormatter() if json_lines else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    logging.getLogger("amqpjobs").setLevel(level)
