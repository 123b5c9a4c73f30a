"""Two operators pausing and resuming one job queue at once (README "Flow control" → "Pause and resume"), real broker.

``pause`` and ``resume`` each change the flag, then send a signal. Run at the same moment,
their steps interleave: operator A's ``resume`` deletes the flag, B's ``pause`` declares it
anew and signals, and only then A's resume signal arrives. The broker holds the pause (the
flag), the last signal says "resumed". Seen with the two commands started within 80 ms of
each other: 1 round in 40 left the one worker believing the opposite of the flag for 15 s
(up to its 30 s re-read). The tests send the late signal by hand: that interleaving, every time.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aio_pika
import pytest

from amqpjobs.runtime.pausing import pause, resume
from amqpjobs.topology.naming import SIGNAL_EXCHANGE, pause_signal_key
from amqpjobs.wire.flags import PauseFlag, _signal, read_flags
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import cli, raw_channel, wait_until
from tests.integration.test_pause import _app_with_slow_job, _succeeded, _worker
from tests.integration.worker_env import make_app

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]


async def _late_signal(broker: BrokerSettings, flag: PauseFlag | None) -> None:
    """The signal of the other operator's command, arriving after this one's flag change and signal."""
    async with raw_channel(broker) as channel:
        exchange = await channel.get_exchange(SIGNAL_EXCHANGE, ensure=False)
        await exchange.publish(aio_pika.Message(_signal("work", flag)), routing_key=pause_signal_key("work"))


async def test_a_late_resume_signal_does_not_undo_a_pause_the_flag_still_holds(broker: BrokerSettings, tmp_path: Path):
    app = await make_app(broker, tmp_path)
    starts: dict[int, list[float]] = {}
    _app_with_slow_job(app, starts, 0.05)
    worker, rec = await _worker(app, broker)
    try:
        await pause(broker, "work", "operator B")
        await wait_until(lambda: "work" in worker._pauses.flags, 5, "the pause heard")
        await _late_signal(broker, None)  # operator A's resume, whose flag delete came before B's declare
        await asyncio.sleep(2.5)  # the worker had 2.5 s to find the flag still there
        assert "work" in worker._pauses.flags, "the worker obeys a stale resume signal while the flag says paused"
        for i in range(5):
            await app.enqueue("slow", {"i": i}, job_id=f"job-{i}")
        await asyncio.sleep(2.0)
        assert starts == {}, f"jobs started while the job queue is paused on the broker: {sorted(starts)}"
        assert await resume(broker, "work") is True
        await rec.wait_for(lambda _: len(_succeeded(rec)) >= 5, timeout=15)
    finally:
        await worker.shutdown()
        await app.close()
    assert sorted(starts) == list(range(5))
    assert all(len(s) == 1 for s in starts.values())


async def test_a_late_pause_signal_does_not_hold_a_resumed_queue_paused(broker: BrokerSettings, tmp_path: Path):
    app = await make_app(broker, tmp_path)
    starts: dict[int, list[float]] = {}
    _app_with_slow_job(app, starts, 0.05)
    worker, rec = await _worker(app, broker)
    try:
        flag = await pause(broker, "work", "operator B")
        assert await resume(broker, "work") is True  # operator A's resume: flag gone, signal sent
        await _late_signal(broker, flag)  # ... and B's pause signal, arriving after it
        sent = time.monotonic()
        for i in range(5):
            await app.enqueue("slow", {"i": i}, job_id=f"job-{i}")
        await rec.wait_for(lambda _: len(_succeeded(rec)) >= 5, timeout=25)
        took = time.monotonic() - sent
        assert took < 5.0, f"the queue stayed paused {took:.1f} s after a stale pause signal (no flag on the broker)"
    finally:
        await worker.shutdown()
        await app.close()
    assert sorted(starts) == list(range(5))
    assert all(len(s) == 1 for s in starts.values())


async def test_two_pauses_at_once_each_say_the_reason_the_broker_kept(broker: BrokerSettings, tmp_path: Path):
    """Both declare the flag; the second declare keeps the first one's arguments (RabbitMQ compares only its own
    ``x-`` arguments). Before: each command said its own reason, one of them not the one kept (20 rounds in 20).

    Each says what the broker kept at its own read-back; when one command's find-delete-declare falls after the
    other's read-back (seen on 4.0.5 in 1 round of 5, CI-like load), the first was told its own reason truly
    and the second replaced it. So: every round, the reason kept is one a command was told; and in most
    rounds both were told it (never before the fix).
    """
    app = await make_app(broker, tmp_path)
    try:
        both_told, rounds = 0, 10
        for _ in range(rounds):
            told = await asyncio.gather(pause(broker, "work", "operator A"), pause(broker, "work", "operator B"))
            kept = (await asyncio.to_thread(read_flags, broker, ["work"]))["work"]
            assert kept.reason in [f.reason for f in told]
            both_told += [f.reason for f in told] == [kept.reason, kept.reason]
            assert await resume(broker, "work") is True
        assert both_told >= rounds // 2, f"both told the reason kept in {both_told} of {rounds} rounds"
        shown = await asyncio.to_thread(cli, broker, "pause", "work", "--reason", "operator C")
        assert "(reason: operator C)" in shown.output
        assert "another pause" not in shown.output
    finally:
        await app.close()


async def test_a_resume_right_after_a_pause_counts_at_once(broker: BrokerSettings, tmp_path: Path):
    """The read after the pause signal finds the flag gone and waits its 1 s before believing it; the resume
    signal that comes meanwhile must not wait for that second."""
    app = await make_app(broker, tmp_path)
    starts: dict[int, list[float]] = {}
    _app_with_slow_job(app, starts, 0.01)
    worker, _ = await _worker(app, broker)
    try:
        lags = []
        flag = await pause(broker, "work", "quick")
        assert await resume(broker, "work") is True
        await wait_until(lambda: not worker._pauses.holds_back("work"), 5, "the first resume")
        for _ in range(3):  # a pause and a resume whose flag changes were done before the worker read after the first
            await _late_signal(broker, flag)
            await _late_signal(broker, None)
            returned = time.monotonic()
            await wait_until(lambda: not worker._pauses.holds_back("work"), 5, "the resume")
            lags.append(time.monotonic() - returned)
            await asyncio.sleep(1.5)  # nothing left over from this round
        assert max(lags) < 0.5, f"resumed {[round(x, 2) for x in lags]} s after resume returned"
    finally:
        await worker.shutdown()
        await app.close()
