"""Reading quarantined messages, filtering and grouping them (no I/O).

A quarantined message is either one the worker put there (it carries our evidence
headers, :mod:`amqpjobs.jobs.evidence`) or a broker-side dead-letter (rejected by some
other consumer, expired, over ``max_length``, over a quorum delivery limit) that carries
only the broker's ``x-death`` header (RabbitMQ "Dead Letter Exchanges" → "Dead-Lettered
Messages"). :func:`describe` reads both into one :class:`QuarantinedJob`. The copies a replay
or park makes of one: :mod:`amqpjobs.jobs.quarantine_moves`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Final

from amqpjobs.jobs import envelope, evidence
from amqpjobs.jobs.fingerprint import count_in, group_id, stack_fingerprint
from amqpjobs.jobs.header_values import header_text as header_text  # re-exported
from amqpjobs.jobs.header_values import no_text, read_count
from amqpjobs.jobs.message_key import message_key, payload_key
from amqpjobs.jobs.outcome import REASONS

# the copies of a move, and the mover's lock: their home was here (re-exported)
from amqpjobs.jobs.quarantine_moves import PARKED_AT as PARKED_AT
from amqpjobs.jobs.quarantine_moves import PREVIOUS_ERROR_MESSAGE as PREVIOUS_ERROR_MESSAGE
from amqpjobs.jobs.quarantine_moves import PREVIOUS_ERROR_TYPE as PREVIOUS_ERROR_TYPE
from amqpjobs.jobs.quarantine_moves import PREVIOUS_FAILURE_AT as PREVIOUS_FAILURE_AT
from amqpjobs.jobs.quarantine_moves import PREVIOUS_REASON as PREVIOUS_REASON
from amqpjobs.jobs.quarantine_moves import REPLAY_COUNT as REPLAY_COUNT
from amqpjobs.jobs.quarantine_moves import REPLAY_ID as REPLAY_ID
from amqpjobs.jobs.quarantine_moves import mover_lock_queue as mover_lock_queue
from amqpjobs.jobs.quarantine_moves import park_headers as park_headers
from amqpjobs.jobs.quarantine_moves import replay_headers as replay_headers
from amqpjobs.jobs.timestamps import parse_time
from amqpjobs.printable import printable

#: ``x-death`` reasons (RabbitMQ "Dead Letter Exchanges" → "Dead-Lettered Messages").
BROKER_REASONS: Final = ("rejected", "expired", "maxlen", "delivery_limit")
#: The reason shown for a message with neither evidence of ours nor ``x-death``: no worker
#: quarantined it and the broker did not dead-letter it, so something published it straight in.
NO_EVIDENCE: Final = "no-evidence"
#: The reason shown for a dead-lettered message whose ``x-death`` names no reason.
UNKNOWN_DEATH: Final = "x-death:unknown"
#: Shown before a reason of evidence not ours (another stack's, a forged one): ``--reason other:poison`` selects it.
OTHER_REASON: Final = "other:"
#: The ``x-first-death-*`` / ``x-last-death-*`` fields read (besides ``x-death``'s entries).
_DEATH_FIELDS: Final = ("reason", "queue")


def is_shown_reason(reason: str) -> bool:
    """True when a quarantine listing can show ``reason``, so a filter may select it.

    Ours (:data:`~amqpjobs.jobs.outcome.REASONS`), the broker's as ``x-death:<reason>``
    (or bare: ``expired``) or :data:`UNKNOWN_DEATH`, :data:`NO_EVIDENCE`, another stack's :data:`OTHER_REASON`.
    """
    ours = reason in (*REASONS, NO_EVIDENCE, UNKNOWN_DEATH) or reason.removeprefix("x-death:") in BROKER_REASONS
    return ours or reason.startswith(OTHER_REASON)


def _evidence_reason(value: Any) -> str:
    """The reason evidence header ``value`` shows: ours as it is, any other as ``other:<its text>`` (selectable)."""
    text = header_text(value)
    return text if is_shown_reason(text) and not text.startswith(OTHER_REASON) else f"{OTHER_REASON}{text}"


def _text_first(*values: Any) -> str:
    """The first of ``values`` that is text (or a number or a time), else the AMQP type of the first present."""
    texts = [(header_text(v), no_text(v)) for v in values]
    return next((t for t, kind_only in texts if t and not kind_only), "") or next((t for t, _ in texts if t), "")


def _int(value: Any) -> int:
    """A count header read by the one rule (:func:`~amqpjobs.jobs.header_values.read_count`); 0 when it is none."""
    return read_count(value) or 0


@dataclass(frozen=True)
class QuarantinedJob:
    """What a quarantined message says about itself.

    Attributes:
        job: Job name ("" when unknown).
        job_id: Job id (``message_id``) or "".
        reason: Our reason, or for broker-side dead-letters ``x-death:<reason>``
            (``x-death:rejected``, ``x-death:expired``, ``x-death:maxlen``,
            ``x-death:delivery_limit``), or :data:`NO_EVIDENCE` for a message with
            neither (published straight into the queue).
        error_type: Error type from our evidence, "" for broker-side dead-letters.
        error_message: Error message from our evidence.
        attempts: Handler runs, from our evidence (0 when unknown).
        failed_at: Last failure time (UTC), from our evidence or ``x-death``'s time.
        first_failed_at: First failure time (UTC), when known.
        original_queue: The work queue to send it back to ("" when unknown).
        replay_count: How often it was replayed before.
        broker_side: True when the broker dead-lettered it (no evidence of ours).
        fingerprint: Its stack fingerprint (:func:`~amqpjobs.jobs.fingerprint.stack_fingerprint`).
        key: Its address: the job id, else a hash of its headers and body
            (:func:`~amqpjobs.jobs.message_key.message_key`; the job id when described without the body).
        payload_key: Without a job id, described with the body: its idempotency key, which a replayed copy carries.
    """

    job: str
    job_id: str
    reason: str
    error_type: str
    error_message: str
    attempts: int
    failed_at: datetime | None
    first_failed_at: datetime | None
    original_queue: str
    replay_count: int
    broker_side: bool
    fingerprint: str = ""
    key: str = ""
    payload_key: str = ""

    @property
    def group(self) -> str:
        """The id of its failure group (:func:`~amqpjobs.jobs.fingerprint.group_id`)."""
        return group_id(self.job, self.reason, self.error_type, self.fingerprint)

    def too_large(self, reason: str) -> str:
        """The line naming this message when its copy (replay, park) can't be sent; it stays where it is.

        ``job 'mail' id 'q-1': its copy would be too large: <reason>`` (:meth:`stays`).
        ``reason``: :attr:`MessageTooLargeError.reason`.
        """
        return self.stays(f"its copy would be too large: {reason}")

    def stays(self, why: str) -> str:
        """The line naming this message when a replay or park leaves it where it is: ``job 'mail' id 'q-1': <why>``.

        The key stands for a missing id; publisher text is escaped.
        """
        name = f"job {printable(repr(self.job or '?'))} id {printable(repr(self.job_id or self.key or '?'))}"
        return f"{name}: {why}"

    def summary_lines(self) -> list[str]:
        """The lines ``quarantine show`` prints about the job (publisher text escaped, so none forges a line)."""
        lines = [
            f"--- job {printable(self.job) or '?'} id {printable(self.job_id) or '?'}",
            f"    reason:     {printable(self.reason)}   attempts: {self.attempts}   replays: {self.replay_count}",
        ]
        if self.error_type:
            lines.append(f"    error:      {printable(self.error_type)}: {printable(self.error_message[:500])}")
        lines.append(f"    failed:     {format_when(self.first_failed_at)} -> {format_when(self.failed_at)}")
        lines.append(f"    from queue: {printable(self.original_queue) or '?'}")
        return lines


def _deaths(headers: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The ``x-death`` entries, most recent first (RabbitMQ "Dead Letter Exchanges", 3.x and 4.x alike)."""
    deaths = headers.get("x-death")
    return [d for d in deaths if isinstance(d, Mapping)] if isinstance(deaths, list | tuple) else []


def _last(headers: Mapping[str, Any], latest: Mapping[str, Any], field: str) -> str:
    """``field`` (``reason``, ``queue``) of the most recent dead-lettering ("" when unknown).

    ``x-death[0]``, else ``x-last-death-<field>`` (3.13+), else ``x-first-death-<field>``
    (then the only dead-lettering known).
    """
    for value in (latest.get(field), headers.get(f"x-last-death-{field}"), headers.get(f"x-first-death-{field}")):
        if (text := header_text(value)) and not (field == "queue" and no_text(value)):  # a queue is named by text
            return text
    return ""


def describe(
    headers: Mapping[str, Any], message_id: str | None, message_type: str | None, body: bytes | None = None
) -> QuarantinedJob:
    """Read a quarantined message's headers and properties (and ``body``, for its :attr:`~QuarantinedJob.key`)."""
    item = _describe(headers, message_id, message_type)
    unnamed = payload_key(headers, body) if body is not None and not item.job_id else ""  # a replayed copy carries it
    return replace(item, key=message_key(item.job_id, headers, body) if body is not None else item.job_id,
                   payload_key=unnamed)  # fmt: skip


def _describe(headers: Mapping[str, Any], message_id: str | None, message_type: str | None) -> QuarantinedJob:
    job = _text_first(headers.get(evidence.JOB), message_type, headers.get(envelope.JOB))
    replay_count = _int(headers.get(REPLAY_COUNT))
    if evidence.REASON in headers:
        reason = _evidence_reason(headers.get(evidence.REASON))
        error_type = header_text(headers.get(evidence.ERROR_TYPE))
        return QuarantinedJob(
            job=job,
            job_id=_text_first(headers.get(evidence.JOB_ID), message_id),
            reason=reason,
            error_type=error_type,
            error_message=header_text(headers.get(evidence.ERROR_MESSAGE)),
            attempts=_int(headers.get(evidence.ATTEMPTS)),
            failed_at=parse_time(headers.get(evidence.LAST_FAILURE_AT)),
            first_failed_at=parse_time(headers.get(evidence.FIRST_FAILURE_AT)),
            original_queue="" if no_text(q := headers.get(evidence.ORIGINAL_QUEUE)) else header_text(q),  # text only
            replay_count=replay_count,
            broker_side=False,
            fingerprint=stack_fingerprint(error_type, header_text(headers.get(evidence.TRACEBACK)), reason),
        )
    # the reason and queue are the LAST dead-lettering's: a job that expired from a retry tier
    # and was then rejected from its work queue says "rejected", and goes back to the work queue
    deaths = _deaths(headers)
    latest, earliest = (deaths[0], deaths[-1]) if deaths else ({}, {})
    reason, queue = _last(headers, latest, "reason"), _last(headers, latest, "queue")
    dead_lettered = bool(deaths) or any(f"x-{w}-death-{f}" in headers for w in ("first", "last") for f in _DEATH_FIELDS)
    label = (f"x-death:{reason}" if reason else UNKNOWN_DEATH) if dead_lettered else NO_EVIDENCE
    return QuarantinedJob(
        job=job,
        job_id=header_text(message_id),
        reason=label,
        error_type="",
        error_message="",
        attempts=envelope.parse_attempt(headers.get(envelope.ATTEMPT)) - 1,
        failed_at=parse_time(latest.get("time")),
        first_failed_at=parse_time(earliest.get("time")),
        original_queue=queue,
        replay_count=replay_count,
        broker_side=dead_lettered,
        fingerprint=stack_fingerprint("", "", label),
    )


@dataclass(frozen=True)
class Selection:
    """Which quarantined messages an operation applies to (all when every field is None).

    Attributes:
        job: Exact job name.
        error_type: Exact error type, or its last dotted part (``ValueError`` matches
            ``builtins.ValueError`` and ``ValueError``).
        reason: Exact reason (``exhausted``, ``x-death:expired`` …; ``expired`` also
            matches ``x-death:expired``).
        since: Only messages whose last failure is at or after this time (UTC).
        group: Only this failure group (:attr:`QuarantinedJob.group`, the console's groups).
        job_ids: Only these job ids, or keys (:attr:`QuarantinedJob.key`, of messages without one).
        search: Only messages whose job id, job, error type or error message contains
            this text (case-insensitive).
    """

    job: str | None = None
    error_type: str | None = None
    reason: str | None = None
    since: datetime | None = None
    group: str | None = None
    job_ids: frozenset[str] | None = None
    search: str | None = None

    def matches(self, item: QuarantinedJob) -> bool:
        """True when ``item`` passes every given filter."""
        if self.job is not None and item.job != self.job:
            return False
        if self.error_type is not None and self.error_type not in (item.error_type, item.error_type.rsplit(".")[-1]):
            return False
        if self.reason is not None and self.reason not in (item.reason, item.reason.removeprefix("x-death:")):
            return False
        if self.since is not None and (item.failed_at is None or item.failed_at < self.since):
            return False
        if self.group is not None and item.group != self.group:
            return False
        if self.job_ids is not None and item.job_id not in self.job_ids and item.key not in self.job_ids:
            return False
        if self.search:
            needle = self.search.casefold()
            fields = (item.job_id, item.job, item.error_type, item.error_message)
            return any(needle in text.casefold() for text in fields)
        return True


@dataclass
class Group:
    """One row of ``quarantine list``: messages sharing job, reason and error type."""

    job: str
    reason: str
    error_type: str
    count: int
    first_failure: datetime | None
    last_failure: datetime | None

    def to_json(self) -> dict[str, Any]:
        """The group as ``quarantine list --json`` prints it."""
        return {
            "job": self.job,
            "reason": self.reason,
            "error_type": self.error_type,
            "count": self.count,
            "first_failure": format_when(self.first_failure),
            "last_failure": format_when(self.last_failure),
        }

    def row(self) -> str:
        """The group as one row under :data:`GROUP_HEADER` (publisher text escaped)."""
        return (
            f"  {self.count:>6}  {printable(self.job) or '?':<24} {printable(self.reason):<24} "
            f"{printable(self.error_type) or '-':<28} "
            f"{format_when(self.first_failure)} -> {format_when(self.last_failure)}"
        )


#: The header line over :meth:`Group.row` rows.
GROUP_HEADER = f"  {'count':>6}  {'job':<24} {'reason':<24} {'error type':<28} first failure -> last failure"


def format_when(value: datetime | None) -> str:
    """A failure time as ``YYYY-MM-DD HH:MM:SSZ`` (UTC), or ``-`` when unknown."""
    return "-" if value is None else value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def summarize(items: Iterable[QuarantinedJob]) -> list[Group]:
    """Group by (job, reason, error type) with counts and first/last failure times, biggest first."""
    groups: dict[tuple[str, str, str], Group] = {}
    for item in items:
        key = (item.job, item.reason, item.error_type)
        group = groups.get(key)
        if group is None:
            group = groups[key] = Group(*key, 0, None, None)
        count_in(group, item)
    return sorted(groups.values(), key=lambda g: (-g.count, g.job, g.reason, g.error_type))


def jsonable(value: Any) -> Any:
    """Turn a header value (bytes, datetimes, nested tables) into something ``json.dumps`` takes."""
    if isinstance(value, bytes | bytearray):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return {"$bytes_hex": bytes(value).hex()}
    if isinstance(value, datetime):
        return header_text(value)
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    return str(value)
