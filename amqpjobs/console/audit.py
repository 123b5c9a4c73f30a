"""The console's audit log: every action, who did it, when, what and the result, as JSON lines.

One line per action once it ends (its result known), appended and flushed to disk
(``os.fsync``) before the page says it is done; a crash loses at most an action under way.
No credential ever goes in: who is the authenticated user name (or the OS user of a
loopback console) and the client address, what is the action's own parameters.
"""

from __future__ import annotations

import json
import os
import threading
from collections import deque
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from amqpjobs.errors import ConfigurationError


@dataclass(frozen=True)
class AuditEntry:
    """One action.

    Attributes:
        at: When it ended, ISO-8601 UTC.
        who: Who asked (user name), and from where (``client``).
        action: ``replay``, ``park`` or ``purge``.
        queue: The quarantine (or parked) queue acted on.
        params: What was asked (filters, rate, canary ...), JSON-ready.
        result: ``ok``, ``stopped`` (someone pressed Stop), ``canary failed`` or ``error``.
        summary: One line saying what happened.
        job_ids: The job ids moved or deleted, when known (replay history of a message).

    """

    at: str
    who: str
    client: str
    action: str
    queue: str
    params: dict[str, Any]
    result: str
    summary: str
    job_ids: list[str] = field(default_factory=list)


class AuditLog:
    """The audit log file (JSON lines; its folder is created)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def check(self) -> None:
        """Make sure the log can be appended to (its folder is created), before any action runs.

        Raises:
            ConfigurationError: it can't; names the file and why.

        """
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8"):
                pass
        except OSError as exc:
            raise ConfigurationError(
                f"audit log {str(self.path)!r} can't be written ({exc.strerror or exc}): give --audit-log PATH"
            ) from None

    def append(self, entry: AuditEntry) -> None:
        """Write ``entry`` as one line and flush it to disk.

        Raises:
            OSError: the file can't be written.
            ValueError: the entry holds NaN or an infinity, which JSON has not (RFC 8259 section 6);
                nothing is written.

        """
        # ASCII: no control character reaches a terminal; no NaN: every line is JSON any reader takes
        line = json.dumps(asdict(entry), ensure_ascii=True, allow_nan=False) + "\n"
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as fh:
                fh.write(line)
                fh.flush()
                os.fsync(fh.fileno())

    def recent(self, limit: int = 200) -> list[AuditEntry]:
        """The last ``limit`` entries, newest first (lines that are not entries are skipped).

        Not an entry: not JSON (bytes that are not UTF-8 read as U+FFFD, so the line is skipped,
        not the page), not an object of the entry's fields, or a field of another type (a torn or
        hand-edited line): the audit page and each message page read every line.
        """
        if not self.path.exists():
            return []
        kept: deque[AuditEntry] = deque(maxlen=limit)
        with self.path.open(encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if (entry := _entry(line)) is not None:
                    kept.append(entry)
        return list(reversed(kept))

    def for_job(self, job_id: str, limit: int = 50) -> list[AuditEntry]:
        """Entries that moved or deleted ``job_id``, newest first."""
        return [e for e in self.recent(10_000) if job_id in e.job_ids][:limit]


def _entry(line: str) -> AuditEntry | None:
    """The entry ``line`` holds, or None when it holds none (see :meth:`AuditLog.recent`)."""
    try:
        doc = json.loads(line)
        entry = AuditEntry(**doc) if isinstance(doc, dict) else None
    except (ValueError, TypeError):
        return None
    if entry is None or not isinstance(entry.params, dict) or not isinstance(entry.job_ids, list):
        return None
    texts = (entry.at, entry.who, entry.client, entry.action, entry.queue, entry.result, entry.summary)
    if not all(isinstance(t, str) for t in (*texts, *entry.job_ids)):
        return None
    return entry


def now_iso() -> str:
    """The time now, ISO-8601 UTC with milliseconds."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
