"""A worker warns while an async handler blocks its event loop, not only once the loop is back.

Before, the stall watch charged the stall to the handler from its thread, but the WARNING
was written by the loop itself, after the block ended: a handler that blocked for ten
minutes (``time.sleep(600)``, a sync client waiting on a dead peer) left no word in the log
for ten minutes, while heartbeats had stopped and the broker had closed the connection.
Only a stop's watch (:mod:`amqpjobs.runtime.signals`) spoke during the block.

Now the watching thread writes one WARNING per run once the loop has not answered for
:data:`~amqpjobs.runtime.stall.BLOCKED_WARN_AFTER` seconds, naming the job, its id and the
handler, and saying that heartbeats stopped with it; the loop's own line after the block stays.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time

import pytest

from amqpjobs.runtime import stall
from amqpjobs.runtime.stall import StallWatch


async def blocking_handler(seconds: float) -> None:
    time.sleep(seconds)  # noqa: ASYNC251 - the fault under test


async def test_the_warning_comes_while_the_loop_is_blocked_once_per_run(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(stall, "BLOCKED_WARN_AFTER", 0.5)
    watch = StallWatch()
    watch.start()
    caplog.set_level(logging.WARNING, "amqpjobs.worker")
    key = watch.enter(sys._getframe(), "resize", "job-7", "tests.unit.test_blocked_loop_warning.blocking_handler")
    blocked_at = time.time()
    await blocking_handler(2.0)
    back_at = time.time()
    watch.leave(key)
    await asyncio.sleep(0.3)  # the loop's own line after the block
    watch.stop()
    live = [r for r in caplog.records if "still does" in r.getMessage()]
    assert len(live) == 1, caplog.text  # once per run, not once per look
    record = live[0]
    assert blocked_at + 0.4 < record.created < back_at  # written during the block
    assert record.getMessage() == (
        "job=resize id=job-7 handler=tests.unit.test_blocked_loop_warning.blocking_handler has blocked the "
        "event loop for 0.5s and still does: heartbeats have stopped with it, so the broker closes the "
        "connection after its heartbeat timeout and redelivers every unacked job, and /readyz answers 503. "
        "Make the handler a plain `def` (it then runs in a thread) or move the blocking call into "
        "`await asyncio.to_thread(...)`"
    )
    after = [r for r in caplog.records if "blocked the event loop for" in r.getMessage() and r is not record]
    assert len(after) == 1, caplog.text  # the line after the block, with the whole time, as before
    assert "job=resize id=job-7 blocked the event loop for 2." in after[0].getMessage()


async def test_a_short_stall_gives_no_live_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(stall, "BLOCKED_WARN_AFTER", 5.0)
    watch = StallWatch()
    watch.start()
    caplog.set_level(logging.WARNING, "amqpjobs.worker")
    key = watch.enter(sys._getframe(), "resize", "job-8", "h")
    await blocking_handler(1.5)
    watch.leave(key)
    await asyncio.sleep(0.3)
    watch.stop()
    assert not [r for r in caplog.records if "still does" in r.getMessage()]


def test_the_bound_is_a_few_seconds_well_inside_a_heartbeat_timeout() -> None:
    assert stall.BLOCKED_WARN_AFTER == 5.0
