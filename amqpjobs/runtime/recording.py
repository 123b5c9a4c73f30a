"""An outcome's record in the worker: its count, metrics, log line and ``on_outcome`` callback (README "Workers").

A delivery waiting on another worker's live claim passes through the first retry tier again
and again for the claim's lease: each pass is an outcome (counted, observed, an event), but
its log line is paced per job id (:class:`PacedDeferrals`).

Part of the worker's one-delivery path (:mod:`.deliveries`), called on the loop's next turn
after the delivery is settled; its state is the worker's.
"""

from __future__ import annotations

import functools
import logging
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from amqpjobs.durations import format_duration
from amqpjobs.jobs.outcome import Outcome, Quarantine, RetryLater, reported
from amqpjobs.printable import logfmt_value
from amqpjobs.runtime.logs import MAX_ERROR_FIELD, field_value
from amqpjobs.runtime.metrics import WorkerMetrics

if TYPE_CHECKING:
    from amqpjobs.runtime.app import App
    from amqpjobs.runtime.worker_config import WorkerOptions

log = logging.getLogger("amqpjobs.worker")

#: An outcome's log line (INFO): its job, id, attempt, duration and outcome, then what the outcome adds.
_OUTCOME_LINE: Final = "job=%s id=%s attempt=%d duration=%.3fs outcome=%s%s%s"

#: The log line's end for an outcome not acked, by whether it was rejected into quarantine.
_UNACKED = {
    False: " (not acked: the broker will redeliver or dead-letter it)",
    True: " (rejected: the broker dead-lettered it into quarantine)",
}


#: Seconds between two log lines of one job id waiting on another worker's live claim (README "Idempotency").
CLAIM_BUSY_LINE_EVERY: Final = 10.0


@functools.lru_cache(maxsize=256)
def _name_text(name: str) -> str:
    """A job name as its outcome line writes it (:func:`field_value`): the same few names, worded once."""
    return field_value(name)


@dataclass
class _Waiting:
    logged: float  # monotonic time of its last line
    seen: float  # monotonic time of its last deferral
    alone_logged: float  # monotonic time of its last "running it alone" WARNING
    unlogged: int = 0  # deferrals (and registrations) since the last line


class PacedDeferrals:
    """Which ``ClaimBusy`` deferral lines to log: per job id the first, then at most one per ``every`` seconds.

    Args:
        every: Seconds between two lines of one job id (> 0).
        clock: Monotonic seconds (tests may pass another).
    """

    def __init__(self, every: float = CLAIM_BUSY_LINE_EVERY, clock: Callable[[], float] = time.monotonic) -> None:
        self.every = every
        self._clock = clock
        self._waiting: dict[str, _Waiting] = {}
        self._pruned = clock()

    def note(self, outcome: Outcome, kind: str | None = None) -> str | None:
        """The end of ``outcome``'s log line ("" when no pacing applies), or None to log no line.

        ``kind``: ``outcome.kind`` when the caller has it already (else read here).

        A ``ClaimBusy`` deferral's first line ends ``"; logged at most every 10s per job id while
        it waits"``, a later one ``" (N more not logged since the last line)"``. A waiting
        suspect (an idempotent one under a dead worker's live claim) is registered again at
        each pass: its ``redelivered`` outcomes get no line while it waits, and count among
        those N. Any other outcome of the job id ends its waiting (its next deferral is logged again).
        """
        kind = outcome.kind if kind is None else kind
        if kind != "deferred" and not self._waiting:  # nothing paced: no clock, no pruning (most outcomes)
            return ""
        now = self._clock()
        if now - self._pruned >= self.every:  # ids that stopped coming back (gone to another worker)
            self._pruned = now
            self._waiting = {k: w for k, w in self._waiting.items() if now - w.seen < 6 * self.every}
        if kind == "redelivered" and (waiting := self._waiting.get(outcome.job_id)) is not None:
            waiting.unlogged += 1  # a waiting suspect's registration for the same start: part of its wait
            return None
        if kind != "deferred" or outcome.failure[0] != "ClaimBusy":
            self._waiting.pop(outcome.job_id, None)
            return ""
        waiting = self._waiting.get(outcome.job_id)
        if waiting is None:
            self._waiting[outcome.job_id] = _Waiting(logged=now, seen=now, alone_logged=now)
            return f"; logged at most every {format_duration(self.every)} per job id while it waits"
        waiting.seen = now
        if now - waiting.logged < self.every:
            waiting.unlogged += 1
            return None
        unlogged, waiting.logged, waiting.unlogged = waiting.unlogged, now, 0
        return f" ({unlogged} more not logged since the last line)"

    def alone_line_due(self, job_id: str) -> bool:
        """Whether a suspect's "running it alone" WARNING is logged now.

        Always, but at most one per ``every`` seconds for a job id waiting on a live claim
        (each of its passes runs it alone again).
        """
        waiting = self._waiting.get(job_id)
        if waiting is None:
            return True
        now = self._clock()
        if now - waiting.alone_logged < self.every:
            return False
        waiting.alone_logged = now
        return True


class OutcomeRecords:
    """The outcome-recording part of :class:`~amqpjobs.runtime.worker.Worker` (its state is the worker's)."""

    app: App
    options: WorkerOptions
    stats: Counter[str]
    metrics: WorkerMetrics | None
    _deferral_lines: PacedDeferrals
    _on_outcome: Callable[[Outcome], None] | None

    def _record(self, outcome: Outcome, kind: str | None = None) -> None:
        """Count, observe and log one settled outcome (``--log-outcomes``), then call ``on_outcome``.

        ``kind``: ``outcome.kind`` when the caller has it already (else read here).
        """
        d = outcome.decision
        kind = outcome.kind if kind is None else kind
        self.stats[kind] += 1
        if self.metrics is not None:
            job = outcome.job if outcome.job and self.app.get(outcome.job) else "(unknown)"
            ran = outcome.duration or outcome.latency is not None  # the handler ran (a first attempt: latency)
            self.metrics.observe(
                job, outcome.queue, kind, outcome.duration if ran else None, outcome.latency, outcome.timed_out
            )
        paced = self._deferral_lines.note(outcome, kind) if reported(self.options.log_outcomes, kind) else None
        if paced is not None and log.isEnabledFor(logging.INFO):  # its values worded only for a line written
            extra = ""
            if isinstance(d, RetryLater):
                extra = f" next_attempt={d.next_attempt} delay={d.delay:g}s"
            elif isinstance(d, Quarantine):
                extra = f" reason={logfmt_value(d.reason)}"
            if outcome.error:
                extra += f" error={field_value(outcome.error, MAX_ERROR_FIELD)}"
            if outcome.decided:  # carried out as an earlier run decided it, its handler not run (.kept_decisions)
                extra += " decided=earlier-run"
            extra += paced
            args = (_name_text(outcome.job or "?"), field_value(outcome.job_id), outcome.attempt, outcome.duration,
                    kind, extra, "" if outcome.acked else _UNACKED[outcome.rejected])  # fmt: skip
            # the record log.info makes, without its walk up the stack for the caller (here, as it would find):
            # one line per job, and that walk was a fifth of a line's cost (bench/RESULTS.md)
            log.handle(log.makeRecord(log.name, logging.INFO, __file__, sys._getframe().f_lineno, _OUTCOME_LINE, args,
                                      None, "_record"))  # fmt: skip
        if self._on_outcome is not None:
            self._on_outcome(outcome)
