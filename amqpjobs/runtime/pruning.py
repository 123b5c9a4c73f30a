"""A worker's pruning of old records, each store on its own timer: ledger done-markers, results, stored payloads."""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol


class Prunable(Protocol):
    """A store whose old records a worker prunes: the ledger, the results store."""

    retention: float

    async def prune(self, older_than: float) -> int:
        """Remove records older than ``older_than`` seconds; returns how many."""


async def keep_pruned(store: Prunable, every: float = 600.0, what: str = "done-marker(s)") -> None:
    """Prune ``store``'s records older than its retention every ``every`` seconds, forever (a worker's task).

    ``what`` names the records in the log line (``"result record(s)"``).
    """
    log = logging.getLogger("amqpjobs.worker")
    while True:
        try:
            removed = await store.prune(store.retention)
            if removed:
                log.info("pruned %d %s older than %gs", removed, what, store.retention)
        except Exception as exc:
            log.warning("pruning %s failed: %s", what, exc)
        await asyncio.sleep(every)
