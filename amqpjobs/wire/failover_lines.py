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
