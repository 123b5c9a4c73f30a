"""What a work-queue consumer says about consuming again (:class:`~amqpjobs.wire.consume.WorkQueueConsumer`).

One line per recovery: after a reconnect, the channel's reopen consumes again, and a retry begun while the
connection was down (an operator resume, a pause-flag read) may consume on that very channel a moment later;
both would say "consuming again". :class:`AgainLine` says it once per channel consumed on (and once after a
``basic.cancel``, which resumes on the same channel). A consume that fails while the connection is down is
not said at all: the connection's own lines say the node is down (:mod:`amqpjobs.wire.cluster`), and the
reopen consumes once it is back.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger("amqpjobs.wire")

#: Seconds between two warnings that a consumed work queue is still missing.
MISSING_EVERY = 30.0
#: What to do about a missing work queue, and what is lost meanwhile (the broker's doing).
MISSING_FIX = (
    "declare it again (amqpjobs topology apply); until then the broker drops every retry its delay tiers "
    "dead-letter back into it, and publishers get it returned (unroutable)"
)


class AgainLine:
    """``consuming <queue> again`` once per channel consumed on (module docstring)."""

    def __init__(self, queue: str) -> None:
        self.queue = queue
        self._said_on: object | None = None  # the channel the last line (or the first consume) was about

    def consumed(self, channel: object, how: str = "") -> None:
        """Consuming on ``channel`` again: say so (``how``: e.g. ``" after a reconnect"``) unless said for it."""
        if channel is not None and channel is not self._said_on:
            self._said_on = channel
            log.info("consuming %s again%s", self.queue, how)

    def started(self, channel: object) -> None:
        """The first consume (the worker says it): nothing to say for ``channel``."""
        self._said_on = channel

    def lost(self) -> None:
        """Cancelled by the broker: the next consume, on the same channel too, is said."""
        self._said_on = None


class MissingLine:
    """The warning that a consumed work queue is missing (404): at once, then every :data:`MISSING_EVERY` s."""

    def __init__(self, queue: str, safe_url: str) -> None:
        self.queue = queue
        self.safe_url = safe_url
        #: Since when (monotonic) consuming again finds the queue missing (404), None while it is there.
        self.since: float | None = None
        self._said = 0.0

    def missing(self) -> None:
        """Consuming again found the queue missing: say so unless said less than :data:`MISSING_EVERY` s ago."""
        now = time.monotonic()
        if self.since is not None and now - self._said < MISSING_EVERY:
            return
        self.since = self.since or now
        self._said = now
        gone = now - self.since
        since = f" (missing for {gone:.0f}s)" if gone >= 1 else ""
        log.warning("work queue %r does not exist on %s%s: %s; consuming again once it is back",
                    self.queue, self.safe_url, since, MISSING_FIX)  # fmt: skip
