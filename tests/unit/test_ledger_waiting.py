"""claim_waiting: an idempotent job waits out a ledger outage in its slot, for a while (README "Idempotency")."""

from __future__ import annotations

import asyncio
from contextlib import AbstractContextManager
from typing import Any

import pytest

from amqpjobs.errors import LedgerUnavailableError
from amqpjobs.runtime.ledger import Claim, claim_waiting


class DownFor:
    """A ledger whose claims fail ``failures`` times (``error``: what they raise), then answer CLAIMED."""

    retention = 60.0

    def __init__(self, failures: int, error: Exception | None = None) -> None:
        self.failures = failures
        self.error = error or LedgerUnavailableError("the PostgreSQL ledger is unreachable (test)")
        self.calls = 0

    async def claim(self, key: str, owner: str, lease: float) -> Claim:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return Claim.CLAIMED

    async def done(self, key: str, owner: str) -> bool:
        return True

    async def release(self, key: str, owner: str) -> None:
        return None

    async def prune(self, older_than: float) -> int:
        return 0

    def transaction(self, key: str, owner: str) -> AbstractContextManager[Any]:
        raise NotImplementedError

    async def close(self) -> None:
        return None


async def test_a_claim_waits_for_the_ledger_and_runs_once_it_answers() -> None:
    ledger = DownFor(3)
    assert await claim_waiting(ledger, "k", "me", 30, patience=5) is Claim.CLAIMED
    assert ledger.calls == 4  # a look every 0.25 s: no busy loop


async def test_a_claim_gives_up_after_its_patience() -> None:
    ledger = DownFor(1000)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(LedgerUnavailableError, match="unreachable"):
        await claim_waiting(ledger, "k", "me", 30, patience=0.6)
    assert ledger.calls == 3  # at 0, 0.25 and 0.5 s; one at 0.75 s would be past the patience
    assert 0.45 < loop.time() - started < 0.6


async def test_a_stopping_worker_waits_no_longer() -> None:
    stop = asyncio.Event()
    stop.set()
    ledger = DownFor(1000)
    with pytest.raises(LedgerUnavailableError):
        await claim_waiting(ledger, "k", "me", 30, patience=5, stop=stop)
    assert ledger.calls == 1


async def test_any_other_failure_of_the_ledger_is_raised_at_once() -> None:
    ledger = DownFor(1000, RuntimeError("a bug"))
    with pytest.raises(RuntimeError, match="a bug"):
        await claim_waiting(ledger, "k", "me", 30, patience=5)
    assert ledger.calls == 1
