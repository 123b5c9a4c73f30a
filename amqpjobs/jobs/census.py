"""What the quarantined messages looked at hold, to explain filters that matched none (no I/O).

``--job thumbnail.make`` (the job is ``thumbnail.make_v2``) or ``--error-type VaueError``
match nothing; rather than a silent "0 replayed", every command that takes the quarantine
filters (:class:`~amqpjobs.jobs.quarantine.Selection`) shows what is there, with counts::

    no message matched --error-type 'VaueError' among the 8 looked at in work.quarantine; present:
      error types: ValueError (5), KeyError (3)
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

from amqpjobs.jobs.quarantine import QuarantinedJob, Selection
from amqpjobs.printable import printable

#: Values listed per kind before "... and N more".
SHOWN_VALUES = 10


@dataclass
class Census:
    """Counts of the messages a command looked at, by job, error type and reason.

    Attributes:
        queue: The quarantine queue looked at ("" until known).
        depth: Messages in it when the command started.
        looked_at: Messages looked at.
        matched: Of those, how many passed the filters.
        jobs: Looked-at messages per job name ("" when unknown).
        error_types: Per error type ("" for broker-side dead-letters).
        reasons: Per reason (``exhausted``, ``x-death:expired`` ...).
        first: The earliest last-failure time seen (UTC), None when none is known.
        last: The latest last-failure time seen (UTC).

    """

    queue: str = ""
    depth: int = 0
    looked_at: int = 0
    matched: int = 0
    jobs: Counter[str] = field(default_factory=Counter)
    error_types: Counter[str] = field(default_factory=Counter)
    reasons: Counter[str] = field(default_factory=Counter)
    first: datetime | None = None
    last: datetime | None = None

    def add(self, item: QuarantinedJob, matched: bool) -> None:
        """Count one looked-at message; ``matched``: it passed the filters."""
        self.looked_at += 1
        self.matched += matched
        self.jobs[item.job] += 1
        self.error_types[item.error_type] += 1
        self.reasons[item.reason] += 1
        if item.failed_at is not None:
            self.first = item.failed_at if self.first is None else min(self.first, item.failed_at)
            self.last = item.failed_at if self.last is None else max(self.last, item.failed_at)

    def matches(self, item: QuarantinedJob, selection: Selection) -> bool:
        """Whether ``item`` passes ``selection``, counting it (as :meth:`add`) either way."""
        matched = selection.matches(item)
        self.add(item, matched)
        return matched

    def no_match_lines(self, selection: Selection) -> list[str]:
        """Lines naming what is present, for each given filter, when ``selection`` matched none of the messages.

        Empty when something matched, nothing was looked at, or no filter was given.
        """
        if self.matched or not self.looked_at or selection == Selection():
            return []
        flags = " ".join(f"{flag} {value!r}" for flag, value in filter_flags(selection))
        lines = [f"no message matched {flags} among the {self.looked_at} looked at in {self.queue}; present:"]
        if selection.job is not None:
            lines.append(f"  jobs: {_counts(self.jobs)}")
        if selection.error_type is not None:
            lines.append(f"  error types: {_counts(self.error_types)}")
        if selection.reason is not None:
            lines.append(f"  reasons: {_counts(self.reasons)}")
        if selection.since is not None:
            span = (
                "none known" if self.first is None or self.last is None else f"{_iso(self.first)} to {_iso(self.last)}"
            )
            lines.append(f"  last failures: {span}")
        return [printable(line) for line in lines]


def filter_flags(selection: Selection) -> list[tuple[str, str]]:
    """The command-line flags that give ``selection``: ``[("--job", "mail"), ...]``."""
    since = None if selection.since is None else _iso(selection.since)
    pairs = (
        ("--job", selection.job),
        ("--error-type", selection.error_type),
        ("--reason", selection.reason),
        ("--since", since),
    )
    return [(flag, value) for flag, value in pairs if value is not None]


def _iso(when: datetime) -> str:
    return when.isoformat(timespec="seconds")


def _counts(counter: Counter[str]) -> str:
    """``a (5), b (3)``, most common first; "" shown as ``(none)``."""
    common = counter.most_common()
    text = ", ".join(f"{value or '(none)'} ({count})" for value, count in common[:SHOWN_VALUES])
    if len(common) > SHOWN_VALUES:
        text += f" ... and {len(common) - SHOWN_VALUES} more"
    return text
