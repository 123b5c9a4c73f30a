"""Releases a worker still owes its ledger: paid as soon as it answers, paced, told once (README "Idempotency").

A real :class:`SqliteLedger` whose ``release`` fails while ``down`` (a ledger away), so the
rows are real; the PostgreSQL outage itself is in tests/integration/test_owed_releases.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import pytest

from amqpjobs.errors import LedgerUnavailableError
from amqpjobs.runtime.ledger import Claim, SqliteLedger, claim_waiting
from amqpjobs.runtime.ledger_owed import OwedReleases


class Away(SqliteLedger):
    """A SQLite ledger whose releases fail while ``down``, counting them."""

    down = False
    releases = 0

    async def release(self, key: str, owner: str) -> None:
        self.releases += 1
        if self.down:
            raise LedgerUnavailableError("the test ledger is unreachable (down)")
        await super().release(key, owner)


def told(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [f"{r.levelname} {r.getMessage()}" for r in caplog.records if r.name == "amqpjobs.worker"]


@pytest.fixture
async def ledger(tmp_path: Path) -> Away:
    return Away(tmp_path / "ledger.db")


async def test_a_failed_release_is_paid_by_the_next_claim_of_its_key(
    ledger: Away, caplog: pytest.LogCaptureFixture
) -> None:
    """The retry of a failed run comes to the same worker: its own stale claim is released first, so it runs
    (before: BUSY until the lease ran out). While the ledger is away the claim fails like any claim does."""
    caplog.set_level(logging.INFO, logger="amqpjobs")
    owed = OwedReleases(ledger, every=60)  # no background try within this test: the claim pays
    assert await owed.claim("k", "run-1", 300) is Claim.CLAIMED
    ledger.down = True
    await owed.release("k", "run-1", time.monotonic() + 300)
    assert owed.keys() == ["k"]
    with pytest.raises(LedgerUnavailableError):
        await owed.claim("k", "run-2", 300)
    ledger.down = False
    assert await ledger.claim("k", "run-2", 300) is Claim.BUSY  # what the worker met before: its own claim
    assert await claim_waiting(owed, "k", "run-2", 300, patience=1) is Claim.CLAIMED
    assert owed.keys() == []
    lines = told(caplog)
    assert len(lines) == 2, lines
    assert lines[0] == (
        "WARNING releasing the claim on job id k failed (LedgerUnavailableError: the test ledger is unreachable "
        "(down)); released as soon as the ledger answers"
    )
    assert lines[1].startswith("INFO released the claim on job id k after "), lines
    await owed.close()
    await ledger.close()


async def test_owed_releases_are_paid_in_the_background_paced_and_told_once(
    ledger: Away, caplog: pytest.LogCaptureFixture
) -> None:
    """Without a retry to pay them, owed releases are tried every ``every`` s (the first failure stops a
    round: the ledger is away), paid within one pace of its return; one line each when owed and paid."""
    caplog.set_level(logging.INFO, logger="amqpjobs")
    owed = OwedReleases(ledger, every=0.2)
    for key in ("a", "b", "c"):
        assert await ledger.claim(key, f"run-{key}", 300) is Claim.CLAIMED
    ledger.down = True
    for key in ("a", "b", "c"):
        await owed.release(key, f"run-{key}", time.monotonic() + 300)
    ledger.releases = 0
    await asyncio.sleep(1.1)
    tries_away = ledger.releases
    ledger.down = False
    back = time.monotonic()
    while owed.keys() and time.monotonic() - back < 2:
        await asyncio.sleep(0.02)
    took = time.monotonic() - back
    assert owed.keys() == []
    assert took <= 0.3, took
    assert 4 <= tries_away <= 6, tries_away  # one per round (every 0.2 s), not one per key
    for key in ("a", "b", "c"):  # free: anyone claims it now
        assert await ledger.claim(key, "someone-else", 300) is Claim.CLAIMED
    lines = told(caplog)
    assert [line.split(" on job id ")[0] for line in lines] == ["WARNING releasing the claim"] * 3 + [
        "INFO released the claim"
    ] * 3, lines
    await owed.close()
    await ledger.close()


async def test_a_debt_whose_lease_ran_out_is_dropped(ledger: Away, caplog: pytest.LogCaptureFixture) -> None:
    """Past its lease the claim is anyone's to take over: nothing is owed any more (a failing ledger is
    never tried for it again), and one line says so."""
    caplog.set_level(logging.INFO, logger="amqpjobs")
    owed = OwedReleases(ledger, every=0.1)
    assert await ledger.claim("k", "run-1", 0.3) is Claim.CLAIMED
    ledger.down = True
    await owed.release("k", "run-1", time.monotonic() + 0.3)
    await asyncio.sleep(0.6)
    assert owed.keys() == []
    tries = ledger.releases
    await asyncio.sleep(0.3)
    assert ledger.releases == tries
    lines = told(caplog)
    assert len(lines) == 2, lines
    assert lines[1] == "INFO the claim on job id k expired with its lease before the ledger answered", lines
    await owed.close()
    await ledger.close()


async def test_closing_tries_once_more_and_tells_what_is_left(ledger: Away, caplog: pytest.LogCaptureFixture) -> None:
    """A stopping worker tries its debts once more; what can't be paid waits for its lease (one line)."""
    caplog.set_level(logging.INFO, logger="amqpjobs")
    owed = OwedReleases(ledger, every=60)
    for key in ("a", "b"):
        assert await ledger.claim(key, f"run-{key}", 300) is Claim.CLAIMED
    ledger.down = True
    for key in ("a", "b"):
        await owed.release(key, f"run-{key}", time.monotonic() + 300)
    await owed.close()
    assert told(caplog)[-1] == (
        "WARNING 2 claim(s) could not be released (the ledger is away): job id(s) a, b; each waits for its "
        "lease to run out"
    )
    owed2 = OwedReleases(ledger, every=60)
    await owed2.release("a", "run-a", time.monotonic() + 300)
    ledger.down = False
    await owed2.close()
    assert owed2.keys() == []
    assert await ledger.claim("a", "x", 300) is Claim.CLAIMED
    await ledger.close()
