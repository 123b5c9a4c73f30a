"""A schedule's durable state: its tick record, the JSON body of its tick-store message (README "Scheduler").

The scheduler keeps one per schedule in ``amqpjobs.scheduler.<app>.ticks.<schedule>``
(``x-max-length: 1``, ``drop-head``); the cursor says every tick at or before it was dealt with.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

from amqpjobs.jobs.cron import format_tick, parse_tick, utc_of


@dataclass(frozen=True)
class TickRecord:
    """The durable state of one schedule (the body of its tick-store message, JSON).

    Attributes:
        schedule: Schedule name.
        cursor: Every tick at or before this instant has been dealt with (fired or skipped).
        last_fired: The last tick that enqueued a job, or None.
        last_job_id: That job's id, or None.
        written_at: When the record was written (UTC).
        written_by: ``host:pid`` of the scheduler replica that wrote it.

    """

    schedule: str
    cursor: datetime
    last_fired: datetime | None
    last_job_id: str | None
    written_at: datetime
    written_by: str

    def to_bytes(self) -> bytes:
        """Encode as UTF-8 JSON."""
        doc = {
            "version": 1,
            "schedule": self.schedule,
            "cursor": format_tick(self.cursor),
            "last_fired": None if self.last_fired is None else format_tick(self.last_fired),
            "last_job_id": self.last_job_id,
            "written_at": utc_of(self.written_at).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "written_by": self.written_by,
        }
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, body: bytes) -> TickRecord:
        """Decode a record written by :meth:`to_bytes`.

        Raises:
            ValueError: not a tick record.

        """
        try:
            doc = json.loads(body)
            last = doc.get("last_fired")
            return cls(
                schedule=str(doc["schedule"]),
                cursor=parse_tick(str(doc["cursor"])),
                last_fired=None if last is None else parse_tick(str(last)),
                last_job_id=None if doc.get("last_job_id") is None else str(doc["last_job_id"]),
                written_at=parse_tick(str(doc["written_at"])),
                written_by=str(doc.get("written_by", "")),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"not a tick record: {exc}") from None


def latest_record(records: list[TickRecord]) -> TickRecord | None:
    """The record with the latest cursor (a store may briefly hold two), or None."""
    return max(records, key=lambda r: (r.cursor, r.written_at), default=None)
