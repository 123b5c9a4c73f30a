"""Blocking connections whose publish a resource alarm holds past its confirm wait, kept open until answered.

Under a memory or disk alarm RabbitMQ stops reading a publishing connection and stores what it held
once the alarm clears, if the connection is open then: one the client closed races its own teardown
against the held frames, and the job can be lost (helper-213: 6 of 10 loaded runs; README
"Backpressure"). So the sync publisher's fast path (:mod:`amqpjobs.runtime.sync_fast`) hands such a
connection (:attr:`~amqpjobs.wire.blocking.BlockingPublisher.held`) to :class:`HeldConnections`, whose
thread reads each one's answer, logs it, and only then closes it, whatever the publisher's ``close()``.
"""

from __future__ import annotations

import threading
from typing import Final

from amqpjobs.wire.blocking import BlockingPublisher
from amqpjobs.wire.held_publishes import log_late_answer

#: Seconds one connection's answer is read for before the next connection's turn.
TURN: Final = 0.5


class HeldConnections:
    """Keeps held connections open on a daemon thread of its own until the broker answers each (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: list[BlockingPublisher] = []
        self._thread: threading.Thread | None = None

    def keep(self, publisher: BlockingPublisher) -> None:
        """Keep ``publisher`` (its :attr:`~amqpjobs.wire.blocking.BlockingPublisher.held` set) until answered."""
        with self._lock:
            self._held.append(publisher)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="amqpjobs-held-publishes", daemon=True)
                self._thread.start()

    def held(self) -> list[BlockingPublisher]:
        """The connections kept now (for tests)."""
        with self._lock:
            return list(self._held)

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._held:
                    self._thread = None
                    return
                waiting = list(self._held)
            for publisher in waiting:
                held = publisher.held
                outcome = publisher.settle(TURN)
                if outcome is None:
                    continue
                with self._lock:
                    self._held.remove(publisher)
                publisher.close()
                if held is not None:
                    log_late_answer(*held, outcome)  # the line the async path logs too
