"""A plain-function run that stopped its worker (past its timeout and the grace after it) is not waited for again.

Its thread can't be stopped and has had its grace: the stop it causes waits (up to ``--grace``)
only for the other runs, which can still end, then ends the process at once; the hung run's
delivery goes back with the process's end (never lost, run once here). Before, the stop waited
a whole second grace for it: timeout 1 s + grace + grace (about 61 s with the default 30 s).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from datetime import datetime
from pathlib import Path

import pytest

from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import depth
from tests.integration.test_grace_threads import ended, log_of, worker
from tests.integration.test_worker_process import exit_code, publisher, read_record, wait_until

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]

HANG = {"seconds": 0, "end": "timeout", "overrun": 3600}  # procapp's leak_sync: timeout 1 s, sleeps an hour


def line_time(text: str, words: str) -> float:
    """The epoch seconds of the first JSON log line of ``text`` whose message holds ``words``."""
    for line in text.splitlines():
        if line.startswith("{") and words in (doc := json.loads(line))["message"]:
            return datetime.fromisoformat(doc["time"]).timestamp()
    raise AssertionError(f"no line with {words!r} in:\n{text}")


async def stop_for_a_hung_thread(broker: BrokerSettings, tmp_path: Path, other: float) -> tuple[int, float, str]:
    """Run ``hang`` (and an ``effect`` of ``other`` s when > 0) on a worker of grace 3 s; no signal sent.

    Returns its exit code, the seconds from the hung run's start until its process was gone, and its log.
    """
    app = await publisher(broker, tmp_path)
    for name in ("leak_sync", "effect"):
        app.job(name, queue="work")(lambda p, c: None)  # procapp's names: only to publish
    record = tmp_path / "record.txt"
    with worker(broker, tmp_path, "w", "--concurrency", "2", "--grace", "3s", "--log-json") as w:
        await wait_until(lambda: "worker consuming" in log_of(tmp_path, "w"), 30, "consuming")
        await app.enqueue("leak_sync", HANG, job_id="hang")
        if other:
            await app.enqueue("effect", {"seconds": other}, job_id="other")
        await wait_until(lambda: any(r[:2] == ["start", "hang"] for r in read_record(record)), 30, "hang to start")
        began = time.monotonic()
        await wait_until(lambda: ended(w.pid), 30, "the worker's process to end")
        gone = time.monotonic() - began
        code = await exit_code(w)
    await app.close()
    return code, gone, log_of(tmp_path, "w")


async def back_in_work_once(broker: BrokerSettings, tmp_path: Path) -> None:
    """The hung job started once, and is back in ``work`` (the process's end requeued it), none quarantined."""
    for _ in range(100):
        if await depth(broker, "work") == 1:
            break
        await asyncio.sleep(0.1)
    assert await depth(broker, "work") == 1
    assert await depth(broker, "work.quarantine") == 0
    assert [r[:2] for r in read_record(tmp_path / "record.txt") if r[0] == "start" and r[1] == "hang"] == [
        ["start", "hang"]
    ]


@pytest.mark.serial  # wall-clock bounds
@pytest.mark.timeout(90)
async def test_a_hung_thread_alone_ends_its_process_at_once_not_a_grace_later(broker: BrokerSettings, tmp_path: Path):
    code, gone, out = await stop_for_a_hung_thread(broker, tmp_path, 0)
    assert code == 1, out
    hung = line_time(out, "still runs 3s past its timeout of 1s")
    stopped = line_time(out, "worker stopped:")
    assert stopped - hung < 1.0, f"the stop took {stopped - hung:.2f}s after the hung line (grace 3s)\n{out}"
    assert gone < 1 + 3 + 1.5, f"process gone {gone:.2f}s after the run began (timeout 1s + grace 3s)\n{out}"
    assert "not waited for again" in out, out
    await back_in_work_once(broker, tmp_path)


@pytest.mark.serial
@pytest.mark.timeout(90)
async def test_the_stop_a_hung_thread_causes_waits_for_the_other_runs_only(broker: BrokerSettings, tmp_path: Path):
    code, gone, out = await stop_for_a_hung_thread(broker, tmp_path, 5)  # hung at 4 s; the other ends at 5 s
    assert code == 1, out
    record = read_record(tmp_path / "record.txt")
    assert [r[:2] for r in record if r[1] == "other"] == [["start", "other"], ["effect", "other"]], record
    assert re.search(r"job=effect id=other attempt=1 duration=\S+ outcome=succeeded", out), out  # acked, once
    stopped = line_time(out, "worker stopped:")
    hung = line_time(out, "still runs 3s past its timeout of 1s")
    assert 0.5 < stopped - hung < 2.0, f"stop took {stopped - hung:.2f}s after the hung line (other: 1s)\n{out}"
    assert gone < 5 + 1.5, f"process gone {gone:.2f}s after the run began (other ran 5s)\n{out}"
    await back_in_work_once(broker, tmp_path)
