"""An outcome's record in the worker: its count, metrics, log line and ``on_outcome`` callback (README "Workers").

Part of the worker's one-delivery path (:mod:`.deliveries`), called on the loop's next turn
after the delivery is settled; its state is the worker's.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

from amqpjobs.jobs.outcome import Outcome, Quarantine, RetryLater, reported
from amqpjobs.printable import logfmt_value
from amqpjobs.runtime.metrics import WorkerMetrics

if TYPE_CHECKING:
    from amqpjobs.runtime.app import App
    from amqpjobs.runtime.worker_config import WorkerOptions

log = logging.getLogger("amqpjobs.worker")

#: The log line's end for an outcome not acked, by whether it was rejected into quarantine.
_UNACKED = {
    False: " (not acked: the broker will redeliver or dead-letter it)",
    True: " (rejected: the broker dead-lettered it into quarantine)",
}


class OutcomeRecords:
    """The outcome-recording part of :class:`~amqpjobs.runtime.worker.Worker` (its state is the worker's)."""

    app: App
    options: WorkerOptions
    stats: Counter[str]
    metrics: WorkerMetrics | None
    _on_outcome: Callable[[Outcome], None] | None

    def _record(self, outcome: Outcome) -> None:
        """Count, observe and log one settled outcome (``--log-outcomes``), then call ``on_outcome``."""
        d = outcome.decision
        kind = outcome.kind
        self.stats[kind] += 1
        if self.metrics is not None:
            job = outcome.job if outcome.job and self.app.get(outcome.job) else "(unknown)"
            ran = outcome.duration or outcome.latency is not None  # the handler ran (a first attempt: latency)
            self.metrics.observe(
                job, outcome.queue, kind, outcome.duration if ran else None, outcome.latency, outcome.timed_out
            )
        if reported(self.options.log_outcomes, kind):
            extra = ""
            if isinstance(d, RetryLater):
                extra = f" next_attempt={d.next_attempt} delay={d.delay:g}s"
            elif isinstance(d, Quarantine):
                extra = f" reason={logfmt_value(d.reason)}"
            if outcome.error:
                extra += f" error={logfmt_value(outcome.error)}"
            log.info(
                "job=%s id=%s attempt=%d duration=%.3fs outcome=%s%s%s",
                logfmt_value(outcome.job or "?"), logfmt_value(outcome.job_id), outcome.attempt, outcome.duration,
                kind, extra, "" if outcome.acked else _UNACKED[outcome.rejected],
            )  # fmt: skip
        if self._on_outcome is not None:
            self._on_outcome(outcome)
