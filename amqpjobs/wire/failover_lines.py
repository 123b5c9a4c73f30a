"""The client libraries' own lines about a lost connection and its recovery, kept for ``-v``.

aiormq and aio-pika log an ERROR, a WARNING with a traceback, an ERROR per robust channel and
a line per reconnect attempt for each loss; a :class:`~amqpjobs.wire.cluster.ClusterConnection`
says one line of its own per loss and per reconnect instead (README "Workers").
"""

from __future__ import annotations

import logging

log = logging.getLogger("amqpjobs.wire")


#: The client libraries' lines about a lost connection and its recovery (logger, text in the message):
#: an ERROR, a WARNING with a traceback, an ERROR per robust channel, INFO/WARNING per reconnect attempt.
_FAILOVER_LINES = (
    ("aiormq.connection", "Unexpected connection close from remote"),
    ("aiormq.connection", "Cancelling cause reader exited abnormally"),
    ("aiormq.connection", "error when creating transport"),  # a reconnect attempt's failure: "could not reach" says it
    ("aio_pika.tools", "RobustChannel._on_close"),
    ("aio_pika.robust_connection", "closed. Reconnecting after"),
    ("aio_pika.robust_connection", "Connection attempt to"),
    ("aio_pika.robust_connection", "Reconnect attempt failed"),
)


class _FailoverLines(logging.Filter):
    """Drops :data:`_FAILOVER_LINES` unless amqpjobs logs at DEBUG (``-v``).

    A :class:`~amqpjobs.wire.cluster.ClusterConnection` logs one line of its own per loss and per connect instead.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if log.isEnabledFor(logging.DEBUG):
            return True
        text = record.getMessage()
        return not any(record.name == name and words in text for name, words in _FAILOVER_LINES)


_FAILOVER_FILTER = _FailoverLines()


def quiet_failover_lines() -> None:
    """Install :class:`_FailoverLines` on the client libraries' loggers (once per process)."""
    for name in dict.fromkeys(name for name, _ in _FAILOVER_LINES):
        logger = logging.getLogger(name)
        if _FAILOVER_FILTER not in logger.filters:
            logger.addFilter(_FAILOVER_FILTER)


#: Seconds between two lines about one thing that keeps failing while a node is down (:class:`DownSpell`).
DOWN_EVERY = 60.0


class DownSpell:
    """The one rule of the down-node lines, for what fails while a node is down (a reconnect, a connect, a read).

    The first failure is said at once, then at most one line each :data:`DOWN_EVERY` seconds saying for how long
    and how many tries failed, then one line when it works again (``back after 75s, 15 failed attempt(s)``).
    Its users: a :class:`~amqpjobs.wire.cluster.ClusterConnection`'s reconnects, a first connect's attempts per
    node (:func:`~amqpjobs.wire.rotation.attempt_line`), the pause flags' reads (README "Workers").

    Args:
        every: Seconds between two lines while it lasts (> 0).
    """

    def __init__(self, every: float = DOWN_EVERY) -> None:
        self.every = every
        self._since: float | None = None  # monotonic time the spell began (None: not failing)
        self._said = 0.0
        self._tries = 0

    def began(self, now: float) -> None:
        """A spell begins at ``now`` before any try failed (a connection lost): its first failure is said at once."""
        self._since, self._said, self._tries = now, now - self.every, 0

    def lasting(self, now: float) -> str:
        """``"; down 60s, 3 failed attempt(s)"`` once more than one try failed, else ``""``."""
        if self._since is None or self._tries <= 1:
            return ""
        return f"; down {now - self._since:.0f}s, {self._tries} failed attempt(s)"

    def failed(self, now: float) -> str | None:
        """A failure at ``now`` (monotonic s): the tail of the line to say, or None when it is not said now.

        ``" (said again in 60s while it lasts)"`` at once; ``" (said again in 60s while it lasts; down 60s,
        3 failed attempt(s))"`` a minute later, and so on.
        """
        if self._since is None:
            self.began(now)
        self._tries += 1
        if now - self._said < self.every:
            return None
        self._said = now
        return f" (said again in {self.every:g}s while it lasts{self.lasting(now)})"

    def worked(self, now: float, instead: str = "") -> str | None:
        """It worked at ``now``: ``" (back after 75s, 15 failed attempt(s))"`` when it had failed, else None.

        ``instead``: what the spell held when no try failed (``having waited for those it gives way to``),
        said in place of the count; without it such a spell ends unsaid.
        """
        since, tries = self._since, self._tries
        self._since, self._tries = None, 0
        if since is None or not (tries or instead):
            return None
        return f" (back after {now - since:.0f}s, {f'{tries} failed attempt(s)' if tries else instead})"
