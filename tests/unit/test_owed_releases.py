"""Writes a worker still owes its ledger: paid as soon as it answers, paced, told once (README "Idempotency").

A real :class:`SqliteLedger` whose ``release`` and ``done`` fail while ``down`` (a ledger away),
so the rows are real; the PostgreSQL outage itself is in tests/integration/test_owed_releases.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import pytest

from amqpjobs.errors import LedgerUnavailableError
from amqpjobs.runtime.ledger import Claim, SqliteLedger, claim_waiting
from amqpjobs.runtime.ledger_owed import OwedWrites


class Away(SqliteLedger):
    """A SQLite ledger whose releases and done-marks fail while ``down``, counting them."""

    down = False
    releases = 0
    dones = 0

    async def release(self, key: str, owner: str) -> None:
        self.releases += 1
        if self.down:
            raise LedgerUnavailableError("the test ledger is unreachable (down)")
        await super().release(key, owner)

    async def done(self, key: str, owner: str) -> bool:
        self.dones += 1
        if self.down:
            raise LedgerUnavailableError("the test ledger is unreachable (down)")
        return await super().done(key, owner)


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
    owed = OwedWrites(ledger, every=60)  # no background try within this test: the claim pays
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
    owed = OwedWrites(ledger, every=0.2)
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
    owed = OwedWrites(ledger, every=0.1)
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
    owed = OwedWrites(ledger, every=60)
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
    owed2 = OwedWrites(ledger, every=60)
    await owed2.release("a", "run-a", time.monotonic() + 300)
    ledger.down = False
    await owed2.close()
    assert owed2.keys() == []
    assert await ledger.claim("a", "x", 300) is Claim.CLAIMED
    await ledger.close()


async def test_an_owed_done_mark_answers_done_here_and_is_written_when_the_ledger_answers(
    ledger: Away, caplog: pytest.LogCaptureFixture
) -> None:
    """A run that succeeded but whose done-mark failed: the key answers DONE here at once (no ledger asked, no
    attempt used), BUSY elsewhere (the run's claim, still running); the mark is written within one pace of the
    ledger's return, after which every claim answers DONE. One line when owed, one when paid."""
    caplog.set_level(logging.INFO, logger="amqpjobs")
    owed = OwedWrites(ledger, every=0.1)
    assert await owed.claim("k", "run-1", 300) is Claim.CLAIMED
    ledger.down = True
    await owed.done("k", "run-1")  # never raises
    assert owed.keys() == ["k"]
    assert await claim_waiting(owed, "k", "run-2", 300, patience=0) is Claim.DONE  # while the ledger is away
    await asyncio.sleep(0.5)
    tries = ledger.dones
    assert 2 <= tries <= 8, tries  # the first, then one per pace (0.1 s)
    ledger.down = False
    assert await ledger.claim("k", "elsewhere", 300) in (Claim.BUSY, Claim.DONE)  # a round may pay meanwhile
    deadline = time.monotonic() + 2
    while owed.keys() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert owed.keys() == []
    assert await ledger.claim("k", "elsewhere", 300) is Claim.DONE
    lines = told(caplog)
    assert lines[0] == (
        "WARNING writing the done-mark of job id k failed (LedgerUnavailableError: the test ledger is unreachable "
        "(down)); the run succeeded: written as soon as the ledger answers"
    ), lines
    assert len(lines) == 2, lines
    assert lines[1].startswith("INFO wrote the done-mark of job id k after "), lines
    await owed.close()
    await ledger.close()


async def test_a_done_mark_still_owed_at_stop_is_told_and_its_claim_left_to_its_lease(
    ledger: Away, caplog: pytest.LogCaptureFixture
) -> None:
    """A stopping worker tries once more; a done-mark it still owes is said in one WARNING, apart from releases,
    and its claim stays running (taken over at its lease's end, the crash rule)."""
    caplog.set_level(logging.INFO, logger="amqpjobs")
    owed = OwedWrites(ledger, every=60)
    assert await ledger.claim("d", "run-d", 300) is Claim.CLAIMED
    assert await ledger.claim("r", "run-r", 300) is Claim.CLAIMED
    ledger.down = True
    await owed.done("d", "run-d")
    await owed.release("r", "run-r", time.monotonic() + 300)
    await owed.close(last_try=1)
    assert owed.keys() == []
    lines = told(caplog)[2:]
    assert lines == [
        "WARNING 1 claim(s) could not be released (the ledger is away): job id(s) r; each waits for its lease to "
        "run out",
        "WARNING 1 done-mark(s) could not be written (the ledger is away): job id(s) d; each claim waits for its "
        "lease to run out, then a redelivery or replay runs the job again",
    ], told(caplog)
    ledger.down = False
    assert await ledger.claim("d", "elsewhere", 300) is Claim.BUSY
    await ledger.close()


class Wordy(Away):
    """A ledger whose errors run past 200 characters, with a parenthesis open across the cut."""

    async def release(self, key: str, owner: str) -> None:
        raise LedgerUnavailableError("the ledger lost its connection " + "word " * 30 + "(server closed the "
                                     "connection unexpectedly; this probably means the server terminated "
                                     "abnormally before or while processing the request)")  # fmt: skip


async def test_an_owed_release_warning_cuts_a_long_error_at_a_word_with_brackets_balanced(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: the error was cut at 200 characters mid-word, "...before or while proc); released as soon as"."""
    caplog.set_level(logging.INFO, logger="amqpjobs")
    ledger = Wordy(tmp_path / "ledger.db")
    owed = OwedWrites(ledger, every=60)
    await owed.release("k", "run-1", time.monotonic() + 300)
    [line] = told(caplog)
    assert line == (
        "WARNING releasing the claim on job id k failed (LedgerUnavailableError: the ledger lost its connection "
        + "word " * 30
        + "(server closed the …)); released as soon as the ledger answers"
    )
    await owed.close()
    await ledger.close()
