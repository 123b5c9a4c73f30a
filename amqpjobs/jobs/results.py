"""Job states and results: what the results store records per job, as pure rules (no I/O).

A job's state, as the worker records it (README "Job status and results")::

    queued --> running --> succeeded
                  |------> skipped (the overlap guard left it unrun)
                  |------> retrying (next tier) --> running ...
                  '------> quarantined (reason) --> parked (operator) --> replayed --> running ...
                                               '--> replayed --> running ...

* ``queued`` is recorded by the enqueuing app (one with a results store) once the broker
  confirmed the publish, off the publish path: the message waits in its work queue;
* ``running`` carries a lease (twice the job's timeout): once it has passed, the state
  reads ``unknown`` (its writer vanished), never a stale ``running``;
* no record at all (enqueued by an app without a results store; never written: the store
  was down; pruned; never enqueued) reads
  ``unknown`` too;
* ``succeeded``, ``skipped``, ``quarantined`` and ``parked`` are terminal for :meth:`App.result`
  (a replay moves a job on again).

A return value is stored when it is JSON-serialisable and at most :data:`MAX_VALUE` bytes
encoded; otherwise it is not stored and the record says why (:func:`encode_value`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any, Final

from amqpjobs.jobs.failure import message_of
from amqpjobs.jobs.json_values import key_not_str
from amqpjobs.jobs.outcome import Ack, Duplicate, Outcome, Quarantine, RetryLater, Skip

#: Every state a job can read as.
STATES: Final = (
    "queued", "running", "succeeded", "skipped", "duplicate", "retrying", "quarantined", "parked", "replayed",
    "purged", "unknown",
)  # fmt: skip
#: States :meth:`App.result` stops waiting at.
TERMINAL: Final = frozenset({"succeeded", "skipped", "duplicate", "quarantined", "parked", "purged"})
#: What a ``duplicate`` record says (an idempotent job whose key was already done when this delivery came):
#: not run, or run and its ``ctx.transaction()`` effect rolled back (it found the key done at its end).
DUPLICATE_DETAIL: Final = "already done: acked without running"
DUPLICATE_ROLLED_BACK: Final = "already done: this run's effect was rolled back"
#: Records that don't replace a ``succeeded`` state: the same id enqueued again, and acked as a duplicate.
_AFTER_DONE: Final = frozenset({"queued", "duplicate"})
#: Records of a copy resting in a quarantine or parked queue (a park, an unpark, a worker's quarantine), or
#: deleted from one (a purge).
_HELD: Final = frozenset({"parked", "quarantined", "purged"})
#: Records of a run started or asked for: after a success, the job's next state is that run's.
_RUNS: Final = frozenset({"running", "replayed"})
#: Largest stored return value: 64 KiB of UTF-8 JSON.
MAX_VALUE: Final = 64 * 1024
#: Default retention of records: 1 day (seconds).
DEFAULT_RETENTION: Final = 86400.0


@dataclass(frozen=True)
class StateRecord:
    """One state a worker (or park/replay) records for a job: a history entry, and the job's current row.

    Attributes:
        job_id: The job id (``message_id``).
        job: Job name ("" when unknown).
        state: One of :data:`STATES` except ``unknown``.
        attempt: Attempt number of the run (0 for ``queued``; park/replay: the attempt that failed).
        at: When it happened, seconds since the epoch.
        detail: The quarantine reason, the next tier (``"tier 1 (5s), attempt 3"``), or "".
        error: ``"<type>: <message>"`` of the failure, or "".
        where: The queue the message is in after this state (work, tier, quarantine or parked queue; ``purged``:
            the queue it was deleted from).
        lease_until: For ``running``: seconds since the epoch after which it reads ``unknown``; else 0.
        value: The return value as JSON text (``succeeded`` only), or None.
        value_note: Why no value was stored ("" when stored or none returned).
    """

    job_id: str
    job: str
    state: str
    attempt: int
    at: float
    detail: str = ""
    error: str = ""
    where: str = ""
    lease_until: float = 0.0
    value: str | None = None
    value_note: str = ""

    def escaped(self) -> StateRecord:
        r"""The record with its text spelt out where a database can't hold it; the job id (its key) as is.

        NUL as ``\x00`` (PostgreSQL text can't hold it), a lone surrogate as ``\ud800``
        (UTF-8 can't encode it; in ``value``, JSON text, that is the same character again). For
        a record a store refused as it was: its state is kept, its text readable.
        """
        return replace(
            self, job=_spelt(self.job), detail=_spelt(self.detail), error=_spelt(self.error), where=_spelt(self.where),
            value=None if self.value is None else _spelt(self.value), value_note=_spelt(self.value_note),
        )  # fmt: skip


def _spelt(text: str) -> str:
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


@dataclass(frozen=True)
class JobStatus:
    """What :meth:`App.job_status` answers.

    Attributes:
        job_id: The job id asked for.
        state: One of :data:`STATES`; ``unknown`` when there is no record or a ``running``
            lease has passed.
        current: The latest record (None when there is none).
        history: Every record kept, oldest first.
        note: Why the state is ``unknown``, or where an older copy of a succeeded job was parked or
            unparked to ("" otherwise).
    """

    job_id: str
    state: str
    current: StateRecord | None = None
    history: tuple[StateRecord, ...] = field(default=())
    note: str = ""

    @property
    def terminal(self) -> bool:
        """Whether the job reached a state :meth:`App.result` stops at."""
        return self.state in TERMINAL

    def value(self) -> Any:
        """The stored return value (decoded JSON), or None when none was stored."""
        if self.current is None or self.current.value is None:
            return None
        return json.loads(self.current.value)

    def report(self) -> list[str]:
        """Lines for ``amqpjobs job show``: state, attempts, then the history."""
        cur = self.current
        lines = [f"job {self.job_id}: {self.state}" + (f" ({self.note})" if self.note else "")]
        if cur is not None:
            lines.append(f"job name: {cur.job or '?'}; attempt {cur.attempt}")
            if cur.detail:
                lines.append(f"detail: {cur.detail}")
            if cur.error:
                lines.append(f"error: {cur.error}")
            if cur.value_note:
                lines.append(f"result: {cur.value_note}")
            elif cur.value is not None:
                lines.append(f"result: {cur.value[:200]}")
            elif self.state == "succeeded":
                lines.append("result: null (the handler returned None)")
        if self.history:
            lines.append("history:")
            for r in self.history:
                extra = "; ".join(x for x in (r.detail, r.error) if x)
                lines.append(f"  {_iso(r.at)}  {r.state:<11} attempt {r.attempt}" + (f"  {extra}" if extra else ""))
        return lines


def _iso(at: float) -> str:
    from amqpjobs.jobs.envelope import iso_utc

    return iso_utc(at)


def status_of(job_id: str, history: list[StateRecord], now: float) -> JobStatus:
    """The status of ``job_id`` from its records (any order), read at ``now`` (seconds since the epoch).

    The current state is the latest record's; a ``running`` one whose lease passed, and no
    record at all, read ``unknown``. Once the job succeeded, a ``queued`` record after it does
    not count, and a ``duplicate`` one settles it back to ``succeeded`` (with its value),
    whatever came between (a replay of an older quarantined copy: ``replayed``): the same
    id enqueued or replayed again is acked as a duplicate (an idempotent job). A ``parked``
    or ``quarantined`` record after the success with no run started or replayed since (a
    ``quarantine park`` or ``unpark`` of a copy quarantined before it: the same id enqueued
    again after a failed run) leaves it ``succeeded`` too, with a note saying where that copy
    went. A run after the success (a replay of that copy) decides the state again.
    """
    ordered = tuple(sorted(history, key=lambda r: r.at))
    if not ordered:
        why = ("no record: enqueued without a results store, store down, pruned, never enqueued, or enqueued by "
               "another process a moment ago (its record is written after the broker's confirm)")  # fmt: skip
        return JobStatus(job_id, "unknown", note=why)
    cur = ordered[-1]
    done = [r for r in ordered if r.state == "succeeded"]
    note = ""
    if cur.state == "duplicate" and done:  # acked as already done, after whatever came since the success
        cur = done[-1]  # (a replayed or re-enqueued copy): the success stands, with its value
    elif cur.state in _AFTER_DONE and done:  # enqueued again once done: a duplicate of the success to come
        cur = max((r for r in ordered if r.state not in _AFTER_DONE), key=lambda r: r.at)
    elif cur.state in _HELD and done and not _run_since(ordered, done[-1]):
        note = _stale_copy_note(ordered, cur)
        cur = done[-1]  # a copy that failed before the success was parked or unparked: the job's success stands
    if cur.state == "running" and cur.lease_until < now:
        return JobStatus(job_id, "unknown", cur, ordered, note="running, but its worker's lease passed")
    return JobStatus(job_id, cur.state, cur, ordered, note=note)


def _run_since(ordered: tuple[StateRecord, ...], success: StateRecord) -> bool:
    """Whether a run started (``running``) or was asked for (``replayed``) after ``success``.

    Without one, a ``parked`` or ``quarantined`` record after the success is a holding move
    (``quarantine park``, ``unpark``) of a copy that failed before it, never the outcome of a run.
    """
    return any(r.at > success.at and r.state in _RUNS for r in ordered)


def _stale_copy_note(ordered: tuple[StateRecord, ...], held: StateRecord) -> str:
    """What :func:`status_of` notes of the stale copy ``held`` (a ``parked`` or ``quarantined`` record)."""
    if held.state == "parked":
        return f"an older copy, quarantined before the success, was parked in {held.where}"
    if held.state == "purged":
        return f"an older copy, quarantined before the success, was purged from {held.where}"
    before = [r for r in ordered if r.at < held.at]
    if before and before[-1].state == "parked":  # quarantine unpark --app records it quarantined again
        return f"an older copy, quarantined before the success, was unparked to {held.where}"
    return f"a copy that has not run since the success was quarantined in {held.where}"


def encode_value(value: Any) -> tuple[str | None, str]:
    """(JSON text, "") for a storable return value; (None, why) otherwise; (None, "") for None."""
    if value is None:
        return None, ""
    try:  # the app's value: whatever encoding it raises leaves it unstored, never the record unwritten
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        size = len(text.encode())  # a lone surrogate in a string or a key: UnicodeEncodeError
    except Exception as exc:  # TypeError, ValueError, RecursionError, a mapping subclass's own error ...
        return None, f"not stored: not JSON-serialisable ({type(exc).__name__}: {message_of(exc)[:100]})"
    if size > MAX_VALUE:
        return None, f"not stored: {size} bytes of JSON, over the {MAX_VALUE}-byte limit"
    if text[0] in "{[" and (found := key_not_str(value, "value")) is not None:  # JSON would change the key
        where, key = found
        where = where if len(where) <= 120 else f"{where[:60]}…{where[-50:]}"  # a key 100 levels down: its path cut
        read_back = next(iter(json.loads(json.dumps({key: None}))))  # json.dumps took it: a number, bool or None
        return None, (
            f"not stored: {where} has the key {key!r} ({type(key).__name__}); JSON object keys are strings, so it "
            f"would read back as {read_back!r}; return the key as a str"
        )
    return text, ""


def record_for(outcome: Outcome, value: Any, where: str, now: float) -> StateRecord | None:
    """The record of a settled delivery's ``outcome``, or None when it changes no state.

    Recorded: success (``succeeded``, ack uncertain included: the handler returned), ``skipped``
    (with ``<reason>: <subject>``: the overlap guard left it unrun),
    ``retrying`` (with the next tier and attempt), ``quarantined`` (with the reason) and
    ``duplicate`` (the job was already done: :data:`DUPLICATE_DETAIL`, or :data:`DUPLICATE_ROLLED_BACK`),
    each only once the delivery was acked. Not recorded: hand-backs and redeliveries (not
    started), and what was not acked (the broker redelivers it: the ``running`` lease covers
    the gap). ``where``: the queue the copy went to (tier or quarantine queue), or the work queue.
    """
    d = outcome.decision
    if not outcome.acked and not outcome.uncertain:
        return None
    base = StateRecord(outcome.job_id, outcome.job, "", outcome.attempt, now, where=where)
    if isinstance(d, Ack) and outcome.ran:
        text, note = encode_value(value)
        return replace(base, state="succeeded", value=text, value_note=note)
    if isinstance(d, RetryLater):
        return replace(base, state="retrying", detail=d.next_step, error=outcome.error)
    if isinstance(d, Skip):
        return replace(base, state="skipped", detail=f"{d.reason}: {d.subject}")
    if isinstance(d, Quarantine):
        return replace(base, state="quarantined", detail=d.reason, error=outcome.error)
    if isinstance(d, Duplicate):
        return replace(base, state="duplicate", detail=DUPLICATE_ROLLED_BACK if outcome.ran else DUPLICATE_DETAIL)
    return None
